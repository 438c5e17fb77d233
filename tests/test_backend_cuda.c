/*
 * test_backend_cuda.c - the CUDA backend and its cuDNN attention path.
 *
 * Without a GPU (CI, the dev machines: CUDA toolkit but no driver):
 *  - cpc_cuda_device_count returns CPC_E_UNSUPPORTED naming the CUDA error,
 *    cpc_cuda_backend_create and cpc_cudnn_sdpa_create fail cleanly (NULL
 *    out, a status, no crash; run under CPC_SANITIZE for leaks);
 *  - the attention-mode API (names, parse, refusal on a non-CUDA backend);
 *  - cpc_cudnn_sdpa_split, the pure part of the cuDNN path that decides how a
 *    block maps onto cuDNN calls: fixed cases (zigzag ring steps, GQA head
 *    ranges, refusals) and random runs checked against brute-force
 *    visibility.
 * With a GPU (if this is ever run on one): the CUDA backend's attention,
 * nvrtc and auto (cuDNN) paths, bf16 and fp32, with causal zigzag runs, GQA
 * and key padding, against the CPU backend on the same inputs (itself checked
 * against the float64 reference in test_backend_cpu.c), SPEC tolerances;
 * and the LSE merge.
 *
 * Random inputs are fresh every run (seed from the clock, printed on
 * failure); CPC_TEST_SEED=N replays.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen.h"
#include "backend.h"
#include "reference.h"
#include "rng.h"

#ifndef CPC_HAVE_CUDA

Test(backend_cuda, not_built_without_toolkit)
{
    cr_assert(!cpc_codegen_available(), "no CUDA toolkit, yet codegen claims NVRTC");
}

#else

#include "attention_cudnn.h"
#include "backend_cuda.h"

static uint64_t test_seed(void)
{
    static uint64_t counter;
    const char *env = getenv("CPC_TEST_SEED");
    if (env)
        return strtoull(env, NULL, 10);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40)) +
           ++counter * 0x9e3779b97f4a7c15ull;
}

/* xorshift64* for the random runs. */
static uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static bool have_gpu(void)
{
    int n = 0;
    cpc_status *st = cpc_cuda_device_count(&n);
    cpc_status_free(st);
    return !st && n > 0;
}

/* ---- without a GPU --------------------------------------------------------------------- */

Test(backend_cuda, device_count_without_gpu)
{
    int n = -1;
    cpc_status *st = cpc_cuda_device_count(&n);
    if (!st) {
        cr_assert_gt(n, 0);
        cr_skip_test("a GPU is present (%d visible)", n);
    }
    cr_assert_eq(st->code, CPC_E_UNSUPPORTED, "class %s", cpc_code_name(st->code));
    cr_assert_eq(n, 0);
    cr_assert(strstr(st->message, "CUDA") != NULL, "message: %s", st->message);
    cr_assert_eq(cpc_status_exit_code(st), 3);
    cpc_status_free(st);
}

Test(backend_cuda, create_fails_cleanly_without_gpu)
{
    if (have_gpu())
        cr_skip_test("a GPU is present");
    cpc_kernel_spec spec = {CPC_DTYPE_BF16, 64, false, 1};
    cpc_kernel *k = NULL;
    int nk = 0;
    cpc_status *st = cpc_codegen_sources(&spec, "sm_90", &k, &nk);
    cr_assert_null(st);
    for (int rep = 0; rep < 3; rep++) {
        cpc_backend *be = (cpc_backend *)&be; /* must be reset to NULL */
        st = cpc_cuda_backend_create(0, &spec, k, nk, &be);
        cr_assert_not_null(st);
        cr_assert_null(be);
        cr_assert_eq(st->code, CPC_E_UNSUPPORTED, "class %s: %s", cpc_code_name(st->code),
                     st->message);
        cr_assert(strstr(st->message, "CUDA") != NULL, "message: %s", st->message);
        cpc_status_free(st);
        /* No kernels at all: still the device error first. */
        be = (cpc_backend *)&be;
        st = cpc_cuda_backend_create(3, &spec, NULL, 0, &be);
        cr_assert_not_null(st);
        cr_assert_null(be);
        cr_assert_eq(st->code, CPC_E_UNSUPPORTED);
        cpc_status_free(st);
    }
    cpc_kernels_free(k, nk);
}

Test(backend_cuda, cudnn_create_fails_cleanly_without_gpu)
{
    if (have_gpu())
        cr_skip_test("a GPU is present");
    for (int rep = 0; rep < 3; rep++) {
        cpc_cudnn_sdpa *s = (cpc_cudnn_sdpa *)&s;
        cpc_status *st = cpc_cudnn_sdpa_create(0, &s);
        cr_assert_not_null(st);
        cr_assert_null(s);
        cr_assert_eq(st->code, CPC_E_UNSUPPORTED, "class %s: %s", cpc_code_name(st->code),
                     st->message);
        cr_assert(strstr(st->message, "cuDNN") != NULL, "message: %s", st->message);
        cpc_status_free(st);
    }
    cpc_cudnn_sdpa_destroy(NULL);
#ifdef CPC_HAVE_CUDNN
    cr_assert_geq(cpc_cudnn_version(), 90000u, "cuDNN version %zu", cpc_cudnn_version());
#else
    cr_assert_eq(cpc_cudnn_version(), 0u);
#endif
}

Test(backend_cuda, attention_mode_names_and_refusals)
{
    const char *names[] = {"auto", "cudnn", "nvrtc"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(cpc_cuda_attention_parse(names[i]), i);
        cr_assert_str_eq(cpc_cuda_attention_name((cpc_cuda_attention)i), names[i]);
    }
    cr_assert_eq(cpc_cuda_attention_parse("cpu"), -1);
    cr_assert_eq(cpc_cuda_attention_parse(NULL), -1);
    cpc_backend *cpu = NULL;
    cpc_status *st = cpc_cpu_backend_create(&cpu);
    cr_assert_null(st);
    st = cpc_cuda_backend_set_attention(cpu, CPC_CUDA_ATTN_NVRTC);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_USAGE);
    cpc_status_free(st);
    cpc_cuda_attn_info info;
    memset(&info, 0x55, sizeof info);
    cpc_cuda_backend_attention_info(cpu, &info, true);
    cr_assert_eq(info.cudnn_blocks + info.nvrtc_blocks + info.fallback_blocks, 0);
    cr_assert_eq(info.fallback_reason[0], 0);
    cpc_backend_destroy(cpu);
}

/* ---- cpc_cudnn_sdpa_split ------------------------------------------------------------ */

static cpc_attn_args block(cpc_dtype dt, int d, int hq, int hkv, int group, int qoff, int kvoff)
{
    cpc_attn_args a;
    memset(&a, 0, sizeof a);
    a.p.B = 1;
    a.p.sq = 64;
    a.p.skv = 64;
    a.p.hq = hq;
    a.p.hkv = hkv;
    a.p.d = d;
    a.p.group = group;
    a.p.q_head_off = qoff;
    a.p.kv_head_off = kvoff;
    a.p.dtype = dt;
    a.p.scale = 0.125f;
    static const char data[1]; /* split reads no element, but a problem has its inputs */
    a.p.q = a.p.k = a.p.v = data;
    return a;
}

Test(cudnn_split, plain_block_is_one_part)
{
    cpc_attn_args a = block(CPC_DTYPE_BF16, 128, 8, 8, 1, 0, 0);
    cpc_sdpa_split sp;
    cpc_status *st = cpc_cudnn_sdpa_split(&a.p, &sp);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(sp.n_parts, 1);
    cr_assert_eq(sp.parts[0].kind, CPC_SDPA_PART_FULL);
    cr_assert_eq(sp.parts[0].row0, 0);
    cr_assert_eq(sp.parts[0].rows, 64);
    cr_assert_eq(sp.parts[0].nkv, 64);
    cr_assert_eq(sp.ratio, 1);
    cr_assert_eq(sp.hkv, 8);
    cr_assert_eq(sp.kv_head0, 0);
}

Test(cudnn_split, refusals_name_the_reason)
{
    struct {
        cpc_attn_args a;
        const char *word;
    } cases[4];
    cases[0].a = block(CPC_DTYPE_FP32, 128, 8, 8, 1, 0, 0);
    cases[0].word = "fp32";
    cases[1].a = block(CPC_DTYPE_BF16, 100, 8, 8, 1, 0, 0);
    cases[1].word = "head_dim 100";
    cases[2].a = block(CPC_DTYPE_FP16, 64, 8, 8, 1, 0, 0);
    static const uint8_t mask[64] = {1};
    cases[2].a.p.kv_mask = mask;
    cases[2].a.p.mask_len = 64;
    cases[2].word = "key padding";
    /* GQA ratio 4, query heads [2, 6) straddle K/V heads 0 and 1 partially. */
    cases[3].a = block(CPC_DTYPE_BF16, 64, 4, 2, 4, 2, 0);
    cases[3].word = "GQA";
    for (int i = 0; i < 4; i++) {
        cpc_sdpa_split sp;
        cpc_status *st = cpc_cudnn_sdpa_split(&cases[i].a.p, &sp);
        cr_assert_not_null(st, "case %d accepted", i);
        cr_assert_eq(st->code, CPC_E_UNSUPPORTED);
        cr_assert(strstr(st->message, cases[i].word) != NULL, "case %d: %s", i, st->message);
        cpc_status_free(st);
    }
}

Test(cudnn_split, gqa_head_ranges)
{
    cpc_sdpa_split sp;
    /* H=8, Hkv=2 (ratio 4), all heads on one rank. */
    cpc_attn_args a = block(CPC_DTYPE_BF16, 64, 8, 2, 4, 0, 0);
    cr_assert_null(cpc_cudnn_sdpa_split(&a.p, &sp));
    cr_assert_eq(sp.ratio, 4);
    cr_assert_eq(sp.hkv, 2);
    cr_assert_eq(sp.kv_head0, 0);
    /* Ulysses U=2: member 1 holds query heads [4, 8) and K/V head [1, 2). */
    a = block(CPC_DTYPE_BF16, 64, 4, 1, 4, 4, 1);
    cr_assert_null(cpc_cudnn_sdpa_split(&a.p, &sp));
    cr_assert_eq(sp.ratio, 4);
    cr_assert_eq(sp.hkv, 1);
    cr_assert_eq(sp.kv_head0, 0);
    /* U=4 > Hkv=2 (replication): member 1 holds query heads [2, 4), K/V head 0. */
    a = block(CPC_DTYPE_BF16, 64, 2, 1, 4, 2, 0);
    cr_assert_null(cpc_cudnn_sdpa_split(&a.p, &sp));
    cr_assert_eq(sp.ratio, 2);
    cr_assert_eq(sp.hkv, 1);
    cr_assert_eq(sp.kv_head0, 0);
    /* The K/V buffer holds all 4 K/V heads, query heads [4, 8) of ratio 2 use [2, 4). */
    a = block(CPC_DTYPE_BF16, 64, 4, 4, 2, 4, 0);
    cr_assert_null(cpc_cudnn_sdpa_split(&a.p, &sp));
    cr_assert_eq(sp.ratio, 2);
    cr_assert_eq(sp.hkv, 2);
    cr_assert_eq(sp.kv_head0, 2);
    /* ... but a buffer holding K/V heads [3, 4) cannot serve them: not a valid
     * problem at all (cpc_attn_problem_check's refusal, as every backend's) */
    a = block(CPC_DTYPE_BF16, 64, 4, 1, 2, 4, 3);
    cpc_status *st = cpc_cudnn_sdpa_split(&a.p, &sp);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INTERNAL);
    cr_assert(strstr(st->message, "need K/V heads") != NULL, "%s", st->message);
    cpc_status_free(st);
}

/* Zigzag ring, P = 2, S = 16, chunk 4: rank 0 holds chunks 0 and 3, rank 1 chunks 1, 2. */
Test(cudnn_split, causal_zigzag_steps)
{
    cpc_run r0[2] = {{0, 4}, {12, 4}}, r1[1] = {{4, 8}};
    cpc_attn_args a = block(CPC_DTYPE_BF16, 64, 2, 2, 1, 0, 0);
    a.p.causal = true;
    a.p.sq = 8;
    a.p.skv = 8;
    cpc_sdpa_split sp;
    /* Rank 0 with block 1: chunk 0 sees nothing, chunk 3 sees all 8 keys. */
    a.p.q_runs = r0, a.p.n_q_runs = 2, a.p.kv_runs = r1, a.p.n_kv_runs = 1;
    cpc_status *st = cpc_cudnn_sdpa_split(&a.p, &sp);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(sp.n_parts, 2);
    cr_assert_eq(sp.parts[0].kind, CPC_SDPA_PART_EMPTY);
    cr_assert_eq(sp.parts[0].row0, 0);
    cr_assert_eq(sp.parts[0].rows, 4);
    cr_assert_eq(sp.parts[1].kind, CPC_SDPA_PART_FULL);
    cr_assert_eq(sp.parts[1].row0, 4);
    cr_assert_eq(sp.parts[1].rows, 4);
    cr_assert_eq(sp.parts[1].nkv, 8);
    /* Rank 1 with block 0: chunks 1, 2 see chunk 0 (the first 4 key rows) only. */
    a.p.q_runs = r1, a.p.n_q_runs = 1, a.p.kv_runs = r0, a.p.n_kv_runs = 2;
    st = cpc_cudnn_sdpa_split(&a.p, &sp);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(sp.n_parts, 1);
    cr_assert_eq(sp.parts[0].kind, CPC_SDPA_PART_FULL);
    cr_assert_eq(sp.parts[0].rows, 8);
    cr_assert_eq(sp.parts[0].nkv, 4);
    /* The diagonal steps are refused. */
    a.p.q_runs = r0, a.p.n_q_runs = 2, a.p.kv_runs = r0, a.p.n_kv_runs = 2;
    st = cpc_cudnn_sdpa_split(&a.p, &sp);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_UNSUPPORTED);
    cr_assert(strstr(st->message, "diagonal") != NULL, "%s", st->message);
    cpc_status_free(st);
    /* Runs that do not cover the rows are refused. */
    a.p.q_runs = r1, a.p.n_q_runs = 1, a.p.kv_runs = r1, a.p.n_kv_runs = 1;
    a.p.sq = 9;
    st = cpc_cudnn_sdpa_split(&a.p, &sp);
    cr_assert_not_null(st);
    cpc_status_free(st);
}

/* Random runs: every accepted split must agree with brute-force visibility,
 * and every refusal must have a query run whose visible key count changes. */
Test(cudnn_split, causal_random_runs_match_brute_force)
{
    uint64_t seed = test_seed(), s = seed | 1;
    int accepted = 0, refused = 0;
    for (int iter = 0; iter < 4000; iter++) {
        enum { NCH = 12, NPOS = 12 * 6 };
        cpc_run qr[NCH], kr[NCH];
        int nq = 0, nk = 0;
        /* Chunks of C positions, each query-only, key-only, both (a diagonal) or
         * neither; key runs sorted (adjacent key chunks merged), query chunks in a
         * random order. */
        int64_t C = 1 + (int64_t)(rnd(&s) % 6);
        cpc_run pool[NCH];
        int np = 0;
        for (int c = 0; c < NCH; c++) {
            int kind = (int)(rnd(&s) % 10);
            bool isq = kind < 4 || kind == 8, isk = (kind >= 4 && kind < 8) || kind == 8;
            if (isq)
                pool[np++] = (cpc_run){c * C, C};
            if (isk) {
                if (nk > 0 && kr[nk - 1].start + kr[nk - 1].len == c * C)
                    kr[nk - 1].len += C;
                else
                    kr[nk++] = (cpc_run){c * C, C};
            }
        }
        while (np > 0) {
            int i = (int)(rnd(&s) % (uint64_t)np);
            qr[nq++] = pool[i];
            pool[i] = pool[--np];
        }
        if (nq == 0 || nk == 0)
            continue;
        cpc_attn_args a = block(CPC_DTYPE_BF16, 64, 1, 1, 1, 0, 0);
        a.p.causal = true;
        a.p.sq = 0;
        a.p.skv = 0;
        for (int i = 0; i < nq; i++)
            a.p.sq += qr[i].len;
        for (int i = 0; i < nk; i++)
            a.p.skv += kr[i].len;
        a.p.q_runs = qr, a.p.n_q_runs = nq, a.p.kv_runs = kr, a.p.n_kv_runs = nk;
        cpc_sdpa_split sp;
        cpc_status *st = cpc_cudnn_sdpa_split(&a.p, &sp);
        /* Brute force: visible keys of each query row (a prefix of the key rows). */
        int64_t vis[NPOS * 8];
        int64_t row = 0;
        bool changing = false;
        for (int i = 0; i < nq; i++) {
            int64_t first = -1;
            for (int64_t t = 0; t < qr[i].len; t++) {
                int64_t pos = qr[i].start + t, n = 0;
                for (int j = 0; j < nk; j++)
                    for (int64_t u = 0; u < kr[j].len; u++)
                        n += kr[j].start + u <= pos;
                vis[row++] = n;
                if (first < 0)
                    first = n;
                else if (n != first)
                    changing = true;
            }
        }
        if (st) {
            cr_assert_eq(st->code, CPC_E_UNSUPPORTED);
            cr_assert(changing, "seed %llu iter %d: refused a block without a diagonal: %s",
                      (unsigned long long)seed, iter, st->message);
            cpc_status_free(st);
            refused++;
            continue;
        }
        cr_assert(!changing, "seed %llu iter %d: accepted a block with a diagonal",
                  (unsigned long long)seed, iter);
        accepted++;
        int64_t covered = 0;
        for (int i = 0; i < sp.n_parts; i++) {
            const cpc_sdpa_part *p = &sp.parts[i];
            cr_assert_eq(p->row0, covered, "seed %llu iter %d: parts not contiguous",
                         (unsigned long long)seed, iter);
            for (int64_t r = p->row0; r < p->row0 + p->rows; r++) {
                if (p->kind == CPC_SDPA_PART_EMPTY)
                    cr_assert_eq(vis[r], 0, "seed %llu iter %d row %lld", (unsigned long long)seed,
                                 iter, (long long)r);
                else
                    cr_assert(vis[r] == p->nkv && vis[r] > 0, "seed %llu iter %d row %lld: %lld vs %lld",
                              (unsigned long long)seed, iter, (long long)r, (long long)vis[r],
                              (long long)p->nkv);
            }
            covered += p->rows;
        }
        cr_assert_eq(covered, a.p.sq);
    }
    cr_assert_gt(accepted, 50, "seed %llu: only %d accepted", (unsigned long long)seed, accepted);
    cr_assert_gt(refused, 50, "seed %llu: only %d refused", (unsigned long long)seed, refused);
}

/* ---- with a GPU -------------------------------------------------------------------------- */

typedef struct gpu_case {
    cpc_dtype dt;
    int d, hq, hkv, group;
    bool causal, mask;
    cpc_cuda_attention mode;
} gpu_case;

/* One block on the CUDA backend vs the CPU backend (same inputs, host copies). */
static void gpu_block(const gpu_case *gc)
{
    uint64_t seed = test_seed();
    cpc_kernel_spec spec = {gc->dt, gc->d, gc->causal, gc->group};
    cpc_kernel *k = NULL;
    int nk = 0;
    cpc_status *st = cpc_codegen_sources(&spec, "sm_90", &k, &nk);
    for (int i = 0; !st && i < nk; i++)
        st = cpc_codegen_compile(&k[i]);
    cr_assert_null(st, "codegen: %s", st ? st->message : "");
    cpc_backend *gpu = NULL, *cpu = NULL;
    st = cpc_cuda_backend_create(0, &spec, k, nk, &gpu);
    cr_assert_null(st, "cuda backend: %s", st ? st->message : "");
    st = cpc_cuda_backend_set_attention(gpu, gc->mode);
    if (st && gc->mode == CPC_CUDA_ATTN_CUDNN) {
        cpc_status_free(st);
        cpc_backend_destroy(gpu);
        cpc_kernels_free(k, nk);
        cr_skip_test("cuDNN unusable here");
    }
    cr_assert_null(st);
    cr_assert_null(cpc_cpu_backend_create(&cpu));
    /* Zigzag-like block: S = 192 in 4 chunks of 48; queries hold chunks 0 and 3;
     * keys: chunks 1-2 (one run), or chunks 0 and 3 (the diagonal). */
    cpc_run qr[2] = {{0, 48}, {144, 48}}, k12[1] = {{48, 96}};
    const int B = 2;
    const int64_t sq = 96, skv = 96;
    int es = cpc_dtype_size(gc->dt);
    size_t nq = (size_t)B * sq * gc->hq * gc->d, nkv = (size_t)B * skv * gc->hkv * gc->d;
    void *q = malloc(nq * es), *kk = malloc(nkv * es), *v = malloc(nkv * es);
    float *o_ref = malloc(nq * 4), *l_ref = malloc((size_t)B * gc->hq * sq * 4);
    float *o_got = malloc(nq * 4), *l_got = malloc((size_t)B * gc->hq * sq * 4);
    uint8_t *mask = malloc((size_t)B * 192);
    cpc_rng_fill(q, gc->dt, seed, 0, 0, (int64_t)nq);
    cpc_rng_fill(kk, gc->dt, seed, 1, 0, (int64_t)nkv);
    cpc_rng_fill(v, gc->dt, seed, 2, 0, (int64_t)nkv);
    for (int i = 0; i < B * 192; i++)
        mask[i] = cpc_rng_normal(seed, 3, (uint64_t)i) > -0.8f;
    for (int step = 0; step < 2; step++) {
        cpc_attn_args a;
        memset(&a, 0, sizeof a);
        a.p.B = B, a.p.sq = sq, a.p.skv = skv, a.p.hq = gc->hq, a.p.hkv = gc->hkv, a.p.d = gc->d;
        a.p.group = gc->group, a.p.dtype = gc->dt, a.p.q_bstride = sq * gc->hq * gc->d;
        a.p.kv_bstride = skv * gc->hkv * gc->d, a.p.scale = 1.0f / sqrtf((float)gc->d);
        a.p.causal = gc->causal;
        a.p.q_runs = qr, a.p.n_q_runs = 2;
        a.p.kv_runs = step == 0 ? k12 : qr, a.p.n_kv_runs = step == 0 ? 1 : 2;
        a.p.mask_len = 192;
        /* CPU */
        a.p.q = q, a.p.k = kk, a.p.v = v, a.o = o_ref, a.lse = l_ref, a.p.kv_mask = gc->mask ? mask : NULL;
        cr_assert_null(cpc_backend_attn(cpu, &a));
        /* GPU */
        void *dq, *dk, *dv, *dm = NULL;
        float *dob, *dl;
        cr_assert_null(cpc_backend_alloc(gpu, nq * es, &dq));
        cr_assert_null(cpc_backend_alloc(gpu, nkv * es, &dk));
        cr_assert_null(cpc_backend_alloc(gpu, nkv * es, &dv));
        cr_assert_null(cpc_backend_alloc(gpu, nq * 4, (void **)&dob));
        cr_assert_null(cpc_backend_alloc(gpu, (size_t)B * gc->hq * sq * 4, (void **)&dl));
        cr_assert_null(cpc_backend_upload(gpu, dq, q, nq * es));
        cr_assert_null(cpc_backend_upload(gpu, dk, kk, nkv * es));
        cr_assert_null(cpc_backend_upload(gpu, dv, v, nkv * es));
        if (gc->mask) {
            cr_assert_null(cpc_backend_alloc(gpu, (size_t)B * 192, &dm));
            cr_assert_null(cpc_backend_upload(gpu, dm, mask, (size_t)B * 192));
        }
        a.p.q = dq, a.p.k = dk, a.p.v = dv, a.o = dob, a.lse = dl, a.p.kv_mask = dm;
        st = cpc_backend_attn(gpu, &a);
        cr_assert_null(st, "attn: %s", st ? st->message : "");
        cr_assert_null(cpc_backend_download(gpu, o_got, dob, nq * 4));
        cr_assert_null(cpc_backend_download(gpu, l_got, dl, (size_t)B * gc->hq * sq * 4));
        double *ro = malloc(nq * sizeof(double)), *rl = malloc((size_t)B * gc->hq * sq * sizeof(double));
        for (size_t i = 0; i < nq; i++)
            ro[i] = o_ref[i];
        for (int64_t i = 0; i < B * gc->hq * sq; i++)
            rl[i] = l_ref[i];
        double tol = cpc_check_tolerance(gc->dt);
        cpc_compare_result ro_r, rl_r;
        cpc_compare(o_got, CPC_DTYPE_FP32, ro, (int64_t)nq, tol, &ro_r);
        cpc_compare(l_got, CPC_DTYPE_FP32, rl, B * gc->hq * sq, tol, &rl_r);
        cpc_cuda_attn_info info;
        cpc_cuda_backend_attention_info(gpu, &info, true);
        cr_assert(ro_r.pass && rl_r.pass,
                  "seed %llu %s d=%d hq=%d hkv=%d causal=%d mask=%d mode=%s step %d: out %.3e lse "
                  "%.3e (cudnn %lld nvrtc %lld: %s)",
                  (unsigned long long)seed, cpc_dtype_name(gc->dt), gc->d, gc->hq, gc->hkv,
                  gc->causal, gc->mask, cpc_cuda_attention_name(gc->mode), step, ro_r.rel_err,
                  rl_r.rel_err, info.cudnn_blocks, info.nvrtc_blocks, info.fallback_reason);
        /* What served: nvrtc always the kernel; auto serves bf16 off-diagonal unmasked blocks. */
        if (gc->mode == CPC_CUDA_ATTN_NVRTC)
            cr_assert_eq(info.cudnn_blocks, 0);
        free(ro);
        free(rl);
        cpc_backend_free(gpu, dq);
        cpc_backend_free(gpu, dk);
        cpc_backend_free(gpu, dv);
        cpc_backend_free(gpu, dob);
        cpc_backend_free(gpu, dl);
        if (dm)
            cpc_backend_free(gpu, dm);
    }
    free(q);
    free(kk);
    free(v);
    free(o_ref);
    free(l_ref);
    free(o_got);
    free(l_got);
    free(mask);
    cpc_backend_destroy(gpu);
    cpc_backend_destroy(cpu);
    cpc_kernels_free(k, nk);
}

Test(backend_cuda_gpu, attention_vs_cpu_backend)
{
    if (!have_gpu())
        cr_skip_test("no GPU: the numerical checks of the CUDA backend need one");
    const gpu_case cases[] = {
        {CPC_DTYPE_BF16, 64, 4, 4, 1, false, false, CPC_CUDA_ATTN_NVRTC},
        {CPC_DTYPE_BF16, 64, 4, 4, 1, false, false, CPC_CUDA_ATTN_AUTO},
        {CPC_DTYPE_BF16, 128, 4, 2, 2, true, false, CPC_CUDA_ATTN_NVRTC},
        {CPC_DTYPE_BF16, 128, 4, 2, 2, true, false, CPC_CUDA_ATTN_AUTO},
        {CPC_DTYPE_FP16, 64, 4, 1, 4, true, false, CPC_CUDA_ATTN_CUDNN},
        {CPC_DTYPE_BF16, 64, 4, 4, 1, false, true, CPC_CUDA_ATTN_AUTO},
        {CPC_DTYPE_FP32, 64, 4, 4, 1, true, false, CPC_CUDA_ATTN_AUTO},
        {CPC_DTYPE_FP32, 40, 2, 2, 1, false, true, CPC_CUDA_ATTN_NVRTC},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        gpu_block(&cases[i]);
}

Test(backend_cuda_gpu, merge_vs_cpu_backend)
{
    if (!have_gpu())
        cr_skip_test("no GPU");
    uint64_t seed = test_seed();
    cpc_kernel_spec spec = {CPC_DTYPE_BF16, 64, false, 1};
    cpc_kernel *k = NULL;
    int nk = 0;
    cpc_status *st = cpc_codegen_sources(&spec, "sm_90", &k, &nk);
    for (int i = 0; !st && i < nk; i++)
        st = cpc_codegen_compile(&k[i]);
    cr_assert_null(st);
    cpc_backend *gpu = NULL, *cpu = NULL;
    cr_assert_null(cpc_cuda_backend_create(0, &spec, k, nk, &gpu));
    cr_assert_null(cpc_cpu_backend_create(&cpu));
    const int B = 2, H = 3, D = 64;
    const int64_t S = 77;
    size_t n = (size_t)B * S * H * D, nl = (size_t)B * H * S;
    float *acc = malloc(n * 4), *o = malloc(n * 4), *al = malloc(nl * 4), *l = malloc(nl * 4);
    float *got = malloc(n * 4), *gotl = malloc(nl * 4);
    cpc_rng_fill(acc, CPC_DTYPE_FP32, seed, 0, 0, (int64_t)n);
    cpc_rng_fill(o, CPC_DTYPE_FP32, seed, 1, 0, (int64_t)n);
    cpc_rng_fill(al, CPC_DTYPE_FP32, seed, 2, 0, (int64_t)nl);
    cpc_rng_fill(l, CPC_DTYPE_FP32, seed, 3, 0, (int64_t)nl);
    al[0] = -INFINITY; /* one row merges from an empty accumulator */
    void *dacc, *do_, *dal, *dl;
    cr_assert_null(cpc_backend_alloc(gpu, n * 4, &dacc));
    cr_assert_null(cpc_backend_alloc(gpu, n * 4, &do_));
    cr_assert_null(cpc_backend_alloc(gpu, nl * 4, &dal));
    cr_assert_null(cpc_backend_alloc(gpu, nl * 4, &dl));
    cr_assert_null(cpc_backend_upload(gpu, dacc, acc, n * 4));
    cr_assert_null(cpc_backend_upload(gpu, do_, o, n * 4));
    cr_assert_null(cpc_backend_upload(gpu, dal, al, nl * 4));
    cr_assert_null(cpc_backend_upload(gpu, dl, l, nl * 4));
    cpc_merge_args m = {B, S, H, D, dacc, dal, do_, dl};
    cr_assert_null(cpc_backend_merge(gpu, &m));
    cr_assert_null(cpc_backend_download(gpu, got, dacc, n * 4));
    cr_assert_null(cpc_backend_download(gpu, gotl, dal, nl * 4));
    cpc_merge_args mc = {B, S, H, D, acc, al, o, l};
    cr_assert_null(cpc_backend_merge(cpu, &mc));
    double *r = malloc(n * sizeof(double)), *rl = malloc(nl * sizeof(double));
    for (size_t i = 0; i < n; i++)
        r[i] = acc[i];
    for (size_t i = 0; i < nl; i++)
        rl[i] = al[i];
    cpc_compare_result a1, a2;
    cpc_compare(got, CPC_DTYPE_FP32, r, (int64_t)n, 1e-5, &a1);
    cpc_compare(gotl, CPC_DTYPE_FP32, rl, (int64_t)nl, 1e-5, &a2);
    cr_assert(a1.pass && a2.pass, "seed %llu: merge acc %.3e lse %.3e", (unsigned long long)seed,
              a1.rel_err, a2.rel_err);
    void *bufs[] = {dacc, do_, dal, dl};
    for (int i = 0; i < 4; i++)
        cpc_backend_free(gpu, bufs[i]);
    free(acc), free(o), free(al), free(l), free(got), free(gotl), free(r), free(rl);
    cpc_backend_destroy(gpu);
    cpc_backend_destroy(cpu);
    cpc_kernels_free(k, nk);
}

#endif /* CPC_HAVE_CUDA */
