/*
 * test_backend_cpu.c - the CPU backend against the float64 reference
 * (runtime/session/reference.h), the LSE merge (ring attention's correctness), the
 * simple backend methods, the fp32 <-> bf16/fp16 conversions, and the
 * reference/compare functions themselves.
 *
 * Inputs are fresh random normals every run: the seed comes from the clock
 * and every failure message prints it; CPC_TEST_SEED=N replays it (every case
 * then uses N).  CPC_TEST_VERBOSE=1 prints the error of every case.
 * Inputs are rounded to the dtype first and the reference reads the same
 * rounded values, so the error measured is the backend's alone: it computes
 * in fp32, hence every dtype must reach rel err <= 1e-5 (stricter than the
 * SPEC tolerances fp32 1e-5 / fp16 2e-3 / bf16 1e-2, which are also checked
 * through cpc_compare's pass flag).
 */
#include <criterion/criterion.h>

#include <Random123/philox.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "dtype.h"
#include "reference.h"

/* ---- seeds and random numbers ---------------------------------------------------- */

/* A fresh seed per call (clock, pid and a counter).  CPC_TEST_SEED=N makes every
 * call return N, which replays the failing case whose message printed N. */
static uint64_t test_seed(void)
{
    static uint64_t counter;
    const char *env = getenv("CPC_TEST_SEED");
    if (env)
        return strtoull(env, NULL, 10);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t base = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 20);
    return base % 1000000007u + 7919u * counter++;
}

static double normal_at(uint64_t seed, uint32_t stream, uint64_t i)
{
    philox4x32_key_t key = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    philox4x32_ctr_t ctr = {{(uint32_t)(i / 2), (uint32_t)(i / 2 >> 32), stream, 0x5eedu}};
    philox4x32_ctr_t r = philox4x32(ctr, key);
    double u1 = ((double)r.v[0] + 1.0) / 4294967296.0; /* (0, 1] */
    double u2 = ((double)r.v[1] + 0.5) / 4294967296.0;
    double rad = sqrt(-2.0 * log(u1));
    return (i & 1) ? rad * sin(2 * M_PI * u2) : rad * cos(2 * M_PI * u2);
}

static uint32_t bits_at(uint64_t seed, uint32_t stream, uint64_t i)
{
    philox4x32_key_t key = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    philox4x32_ctr_t ctr = {{(uint32_t)i, (uint32_t)(i >> 32), stream, 0xb175u}};
    return philox4x32(ctr, key).v[0];
}

static size_t esz(cpc_dtype t) { return t == CPC_DTYPE_FP32 ? 4 : 2; }

/* n random normals * amp, rounded to dtype t */
static void *rand_tensor(cpc_dtype t, size_t n, uint64_t seed, uint32_t stream, double amp)
{
    float *f = malloc(sizeof(float) * (n ? n : 1));
    void *out = malloc(esz(t) * (n ? n : 1));
    cr_assert(f && out);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(amp * normal_at(seed, stream, i));
    cpc_from_f32_n(out, t, f, n);
    free(f);
    return out;
}

static cpc_backend *make_backend(void)
{
    cpc_backend *be = NULL;
    cpc_cpu_backend_single_thread_blas();
    cpc_status *st = cpc_cpu_backend_create(&be);
    cr_assert_null(st, "cpc_cpu_backend_create failed");
    cr_assert_not_null(be);
    return be;
}

/* ---- the attention harness --------------------------------------------------------
 *
 * A global problem q [B,S,H,D], k/v [B,Skv,Hkv,D] (+ optional key padding mask)
 * and one rank's view of it: query rows = the concatenation of q runs, keys =
 * the concatenation of kv runs, query heads [qh0, qh0+nqh).  The local buffers
 * have `extra` poison (NaN) rows per batch and one spare K/V head on each side
 * when the global tensor has it (kv_head_off != the first needed head).  With
 * nblk > 1 the keys are split into nblk consecutive blocks, each attended
 * separately and merged (init_acc + merge), which must give the attention over
 * all the view's keys (ring attention).  The reference is the float64 global
 * attention restricted, by its key mask, to the view's keys. */

typedef struct tcase {
    int B;
    int64_t S, Skv;
    int H, Hkv, D;
    cpc_dtype dt;
    bool causal;
    int pad;          /* 0 none; 1 random ~25% padded; 2 = 1 and batch B-1 fully padded;
                         3 = 1 and the first 5 keys padded (early causal rows see none) */
    cpc_run qr[8];
    int nqr;          /* 0: all [0, S) */
    cpc_run kr[8];
    int nkr;          /* 0: all [0, Skv) */
    int qh0, nqh;     /* nqh 0: all heads */
    int extra;        /* poison rows per batch in the local buffers */
    double amp;       /* q amplitude (0 -> 1) */
    int nblk;         /* > 1: split the keys and merge */
    int row_step;     /* compare every row_step-th query row (0 -> 1) */
    const char *tiles;/* CPC_CPU_ATTN_TILES for this case, NULL = default */
} tcase;

typedef struct case_result {
    double out_rel, lse_rel, out_max;
    bool spec_pass;
    int64_t rows, empty_rows;
} case_result;

static int64_t runs_total(const cpc_run *r, int n)
{
    int64_t t = 0;
    for (int i = 0; i < n; i++)
        t += r[i].len;
    return t;
}

/* Runs of positions pos[0..n), coalescing consecutive positions. */
static int to_runs(const int64_t *pos, int64_t n, cpc_run *out, int max)
{
    int c = 0;
    for (int64_t i = 0; i < n; i++) {
        if (c > 0 && out[c - 1].start + out[c - 1].len == pos[i])
            out[c - 1].len++;
        else {
            cr_assert(c < max, "too many runs");
            out[c].start = pos[i];
            out[c].len = 1;
            c++;
        }
    }
    return c;
}

static uint16_t nan16(void) { return 0x7e00; }

static void fill_poison(void *p, cpc_dtype t, size_t n)
{
    if (t == CPC_DTYPE_FP32) {
        float *f = p;
        for (size_t i = 0; i < n; i++)
            f[i] = NAN;
    } else {
        uint16_t *h = p;
        for (size_t i = 0; i < n; i++)
            h[i] = t == CPC_DTYPE_BF16 ? 0x7fc0 : nan16();
    }
}

static case_result run_case(const tcase *tc0, uint64_t seed)
{
    tcase tc = *tc0;
    if (!tc.nqr) {
        tc.qr[0] = (cpc_run){0, tc.S};
        tc.nqr = 1;
    }
    if (!tc.nkr) {
        tc.kr[0] = (cpc_run){0, tc.Skv};
        tc.nkr = 1;
    }
    if (!tc.nqh) {
        tc.qh0 = 0;
        tc.nqh = tc.H;
    }
    if (tc.amp == 0)
        tc.amp = 1.0;
    if (tc.nblk < 1)
        tc.nblk = 1;
    if (tc.row_step < 1)
        tc.row_step = 1;
    if (tc.tiles)
        setenv("CPC_CPU_ATTN_TILES", tc.tiles, 1);
    else
        unsetenv("CPC_CPU_ATTN_TILES");

    const int B = tc.B, H = tc.H, Hkv = tc.Hkv, D = tc.D, group = H / Hkv;
    const int64_t S = tc.S, Skv = tc.Skv;
    const cpc_dtype dt = tc.dt;
    const size_t es = esz(dt);
    const float scale = (float)(1.0 / sqrt((double)D));

    /* global tensors */
    void *q = rand_tensor(dt, (size_t)B * S * H * D, seed, 1, tc.amp);
    void *k = rand_tensor(dt, (size_t)B * Skv * Hkv * D, seed, 2, 1.0);
    void *v = rand_tensor(dt, (size_t)B * Skv * Hkv * D, seed, 3, 1.0);
    uint8_t *pmask = NULL;
    if (tc.pad) {
        pmask = malloc((size_t)B * Skv);
        for (int b = 0; b < B; b++)
            for (int64_t j = 0; j < Skv; j++) {
                uint8_t on = (bits_at(seed, 4, (uint64_t)b * Skv + j) & 3u) != 0;
                if (tc.pad == 2 && b == B - 1)
                    on = 0;
                if (tc.pad == 3 && j < 5)
                    on = 0;
                pmask[(size_t)b * Skv + j] = on;
            }
    }

    /* view */
    const int64_t sq = runs_total(tc.qr, tc.nqr), skv_all = runs_total(tc.kr, tc.nkr);
    int64_t *qpos = malloc(sizeof(int64_t) * (size_t)sq);
    int64_t *kpos = malloc(sizeof(int64_t) * (size_t)skv_all);
    for (int r = 0, c = 0; r < tc.nqr; r++)
        for (int64_t t = 0; t < tc.qr[r].len; t++)
            qpos[c++] = tc.qr[r].start + t;
    for (int r = 0, c = 0; r < tc.nkr; r++)
        for (int64_t t = 0; t < tc.kr[r].len; t++)
            kpos[c++] = tc.kr[r].start + t;
    const int nqh = tc.nqh, qh0 = tc.qh0;
    int kv_need0 = qh0 / group, kv_need1 = (qh0 + nqh - 1) / group + 1;
    int kv_off = kv_need0 > 0 ? kv_need0 - 1 : 0;
    int kv_end = kv_need1 < Hkv ? kv_need1 + 1 : Hkv;
    int hkv = kv_end - kv_off;

    /* local queries */
    const int64_t qbs = (sq + tc.extra) * nqh * D;
    void *ql = malloc(es * (size_t)(B * qbs));
    fill_poison(ql, dt, (size_t)(B * qbs));
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++)
            memcpy((char *)ql + ((size_t)b * qbs + (size_t)i * nqh * D) * es,
                   (char *)q + ((((size_t)b * S + qpos[i]) * H + qh0) * D) * es,
                   es * (size_t)nqh * D);

    const size_t no = (size_t)B * sq * nqh * D, nl = (size_t)B * nqh * sq;
    float *acc = malloc(sizeof(float) * no), *acc_lse = malloc(sizeof(float) * nl);
    float *o = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * nl);
    cpc_backend *be = make_backend();
    cpc_status *st;
    if (tc.nblk > 1) {
        st = be->vt->init_acc(be, acc, no, acc_lse, nl);
        cr_assert_null(st);
    }
    for (int blk = 0; blk < tc.nblk; blk++) {
        int bi = (blk + 1) % tc.nblk; /* a rotated order, as a ring rank sees it */
        int64_t j0 = skv_all * bi / tc.nblk, j1 = skv_all * (bi + 1) / tc.nblk;
        int64_t skv = j1 - j0;
        cpc_run kr[64];
        int nkr = to_runs(kpos + j0, skv, kr, 64);
        const int64_t kvbs = (skv + tc.extra) * hkv * D;
        void *kl = malloc(es * (size_t)(B * kvbs + 1)), *vl = malloc(es * (size_t)(B * kvbs + 1));
        fill_poison(kl, dt, (size_t)(B * kvbs));
        fill_poison(vl, dt, (size_t)(B * kvbs));
        for (int b = 0; b < B; b++)
            for (int64_t j = 0; j < skv; j++) {
                size_t src = (((size_t)b * Skv + kpos[j0 + j]) * Hkv + kv_off) * D * es;
                size_t dst = ((size_t)b * kvbs + (size_t)j * hkv * D) * es;
                memcpy((char *)kl + dst, (char *)k + src, es * (size_t)hkv * D);
                memcpy((char *)vl + dst, (char *)v + src, es * (size_t)hkv * D);
            }
        for (size_t i = 0; i < no; i++)
            o[i] = NAN;
        for (size_t i = 0; i < nl; i++)
            lse[i] = NAN;
        cpc_attn_args a = {
            .B = B, .sq = sq, .skv = skv, .hq = nqh, .hkv = hkv, .d = D, .group = group,
            .q_head_off = qh0, .kv_head_off = kv_off, .dtype = dt,
            .q = ql, .k = kl, .v = vl, .q_bstride = qbs, .kv_bstride = kvbs,
            .o = tc.nblk > 1 ? o : acc, .lse = tc.nblk > 1 ? lse : acc_lse,
            .scale = scale, .causal = tc.causal,
            .q_runs = tc.qr, .n_q_runs = tc.nqr, .kv_runs = kr, .n_kv_runs = nkr,
            .kv_mask = pmask, .mask_len = pmask ? Skv : 0,
        };
        if (tc.nblk == 1) {
            for (size_t i = 0; i < no; i++)
                acc[i] = NAN;
            for (size_t i = 0; i < nl; i++)
                acc_lse[i] = NAN;
        }
        st = be->vt->attn(be, &a);
        if (st)
            cpc_status_print(stderr, "test", st);
        cr_assert_null(st, "attn failed (seed %llu)", (unsigned long long)seed);
        if (tc.nblk > 1) {
            cpc_merge_args m = {.B = B, .s = sq, .h = nqh, .d = D, .acc = acc,
                                .acc_lse = acc_lse, .o = o, .lse = lse};
            st = be->vt->merge(be, &m);
            cr_assert_null(st);
        }
        free(kl);
        free(vl);
    }
    be->vt->destroy(be);

    /* reference restricted to the view's keys */
    uint8_t *rmask = calloc((size_t)B * Skv, 1);
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < skv_all; j++) {
            size_t id = (size_t)b * Skv + kpos[j];
            rmask[id] = pmask ? pmask[id] : 1;
        }
    int64_t nrow_max = (int64_t)B * nqh * ((sq + tc.row_step - 1) / tc.row_step + 1);
    cpc_ref_row *rows = malloc(sizeof(cpc_ref_row) * (size_t)nrow_max);
    int64_t *lidx = malloc(sizeof(int64_t) * (size_t)nrow_max);
    int64_t nr = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nqh; h++)
            for (int64_t i = 0; i < sq; i += tc.row_step) {
                rows[nr] = (cpc_ref_row){b, qh0 + h, qpos[i]};
                lidx[nr] = ((int64_t)b * sq + i) * nqh + h; /* row index into acc/D */
                nr++;
            }
    double *ref = malloc(sizeof(double) * (size_t)nr * D), *rlse = malloc(sizeof(double) * (size_t)nr);
    double *got = malloc(sizeof(double) * (size_t)nr * D), *glse = malloc(sizeof(double) * (size_t)nr);
    cpc_ref_problem p = {.B = B, .S = S, .Skv = Skv, .H = H, .Hkv = Hkv, .D = D, .dtype = dt,
                         .q = q, .k = k, .v = v, .scale = scale, .causal = tc.causal,
                         .kv_mask = rmask};
    st = cpc_reference_attention(&p, rows, nr, ref, rlse);
    cr_assert_null(st, "reference failed");
    case_result res = {0};
    res.rows = nr;
    for (int64_t r = 0; r < nr; r++) {
        int64_t li = lidx[r];
        int b = rows[r].b, h = rows[r].h - qh0;
        int64_t i = (li / nqh) % sq;
        for (int e = 0; e < D; e++)
            got[r * D + e] = acc[li * D + e];
        glse[r] = acc_lse[((size_t)b * nqh + h) * sq + i];
        if (rlse[r] == -INFINITY) {
            res.empty_rows++;
            for (int e = 0; e < D; e++)
                cr_assert(acc[li * D + e] == 0.0f,
                          "row (b=%d h=%d s=%lld) sees no key: o must be 0, got %g (seed %llu)",
                          b, rows[r].h, (long long)rows[r].s, (double)acc[li * D + e],
                          (unsigned long long)seed);
            cr_assert(glse[r] == -INFINITY,
                      "row (b=%d h=%d s=%lld) sees no key: lse must be -inf, got %g (seed %llu)",
                      b, rows[r].h, (long long)rows[r].s, glse[r], (unsigned long long)seed);
        }
    }
    cpc_compare_result co, cl;
    cpc_compare_init(&co);
    cpc_compare_add_f64(&co, got, ref, nr * D);
    cpc_compare_finish(&co, cpc_check_tolerance(dt));
    cpc_compare_init(&cl);
    cpc_compare_add_f64(&cl, glse, rlse, nr);
    cpc_compare_finish(&cl, 1e-5);
    cr_assert(co.n_nan == 0 && co.n_inf == 0 && cl.n_nan == 0 && cl.n_inf == 0,
              "NaN/Inf in output: out nan %lld inf %lld, lse nan %lld inf %lld, first bad out "
              "%lld lse %lld (seed %llu)",
              (long long)co.n_nan, (long long)co.n_inf, (long long)cl.n_nan, (long long)cl.n_inf,
              (long long)co.first_bad, (long long)cl.first_bad, (unsigned long long)seed);
    if (getenv("CPC_TEST_VERBOSE"))
        fprintf(stderr,
                "case B=%d S=%lld Skv=%lld H=%d Hkv=%d D=%d dt=%d causal=%d pad=%d nblk=%d: "
                "rows %lld (empty %lld) out rel %.2e max %.2e lse rel %.2e\n",
                B, (long long)S, (long long)Skv, H, Hkv, D, (int)dt, tc.causal, tc.pad, tc.nblk,
                (long long)nr, (long long)res.empty_rows, co.rel_err, co.max_abs_err,
                cl.rel_err);
    res.out_rel = co.rel_err;
    res.out_max = co.max_abs_err;
    res.lse_rel = cl.rel_err;
    res.spec_pass = co.pass;
    cr_assert(co.pass, "SPEC check failed: rel err %.3e (tol %.0e) (seed %llu)", co.rel_err,
              cpc_check_tolerance(dt), (unsigned long long)seed);
    cr_assert(co.rel_err <= 1e-5,
              "out rel err %.3e > 1e-5 (max abs %.3e) B=%d S=%lld Skv=%lld H=%d Hkv=%d D=%d "
              "dtype %d causal %d pad %d nblk %d (seed %llu)",
              co.rel_err, co.max_abs_err, B, (long long)S, (long long)Skv, H, Hkv, D, (int)dt,
              tc.causal, tc.pad, tc.nblk, (unsigned long long)seed);
    /* LSE values can be near 0 on tiny cases, where a relative norm is
     * meaningless: accept 1e-5 relative or 1e-6 absolute (natural-log units) */
    cr_assert(cl.rel_err <= 1e-5 || cl.max_abs_err <= 1e-6,
              "lse rel err %.3e > 1e-5 and max abs %.3e > 1e-6 (seed %llu)", cl.rel_err,
              cl.max_abs_err, (unsigned long long)seed);

    free(q);
    free(k);
    free(v);
    free(pmask);
    free(rmask);
    free(qpos);
    free(kpos);
    free(ql);
    free(acc);
    free(acc_lse);
    free(o);
    free(lse);
    free(rows);
    free(lidx);
    free(ref);
    free(rlse);
    free(got);
    free(glse);
    return res;
}

static const cpc_dtype all_dt[3] = {CPC_DTYPE_FP32, CPC_DTYPE_BF16, CPC_DTYPE_FP16};

/* ---- attention vs reference --------------------------------------------------------- */

Test(attn, head_dims_and_dtypes)
{
    const int dims[] = {8, 64, 128, 40, 3};
    for (int di = 0; di < 5; di++)
        for (int t = 0; t < 3; t++) {
            uint64_t seed = test_seed();
            tcase tc = {.B = 1, .S = 300, .Skv = 300, .H = 2, .Hkv = 2, .D = dims[di],
                        .dt = all_dt[t], .extra = 3};
            run_case(&tc, seed);
        }
}

Test(attn, sq_ne_skv_cross_attention)
{
    for (int t = 0; t < 3; t++) {
        uint64_t seed = test_seed();
        tcase tc = {.B = 2, .S = 37, .Skv = 700, .H = 3, .Hkv = 3, .D = 64, .dt = all_dt[t],
                    .extra = 5};
        run_case(&tc, seed);
        tcase tc2 = {.B = 1, .S = 600, .Skv = 29, .H = 2, .Hkv = 1, .D = 40, .dt = all_dt[t]};
        run_case(&tc2, test_seed());
    }
}

Test(attn, tiny)
{
    for (int t = 0; t < 3; t++) {
        tcase one = {.B = 1, .S = 1, .Skv = 1, .H = 1, .Hkv = 1, .D = 8, .dt = all_dt[t]};
        run_case(&one, test_seed());
        tcase one_q = {.B = 1, .S = 1, .Skv = 9, .H = 1, .Hkv = 1, .D = 3, .dt = all_dt[t]};
        run_case(&one_q, test_seed());
        tcase seven = {.B = 2, .S = 7, .Skv = 7, .H = 1, .Hkv = 1, .D = 8, .dt = all_dt[t],
                       .causal = true, .extra = 1};
        run_case(&seven, test_seed());
    }
}

Test(attn, gqa_28_7_and_mqa)
{
    for (int t = 0; t < 3; t++) {
        /* all heads */
        tcase all = {.B = 1, .S = 96, .Skv = 96, .H = 28, .Hkv = 7, .D = 64, .dt = all_dt[t],
                     .row_step = 3};
        run_case(&all, test_seed());
        /* a ulysses rank's heads: query heads [10, 17) use K/V heads 2..4; the block
         * holds K/V heads [1, 6) */
        tcase part = {.B = 2, .S = 80, .Skv = 80, .H = 28, .Hkv = 7, .D = 40, .dt = all_dt[t],
                      .qh0 = 10, .nqh = 7, .extra = 2, .causal = true};
        run_case(&part, test_seed());
        /* MQA */
        tcase mqa = {.B = 1, .S = 130, .Skv = 130, .H = 8, .Hkv = 1, .D = 64, .dt = all_dt[t],
                     .qh0 = 3, .nqh = 4, .causal = true};
        run_case(&mqa, test_seed());
    }
}

Test(attn, causal_zigzag_runs)
{
    for (int t = 0; t < 3; t++) {
        /* S = 16 over P = 2 zigzag: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 */
        tcase r0_r1 = {.B = 1, .S = 16, .Skv = 16, .H = 2, .Hkv = 2, .D = 8, .dt = all_dt[t],
                       .causal = true, .qr = {{0, 4}, {12, 4}}, .nqr = 2,
                       .kr = {{4, 4}, {8, 4}}, .nkr = 2};
        run_case(&r0_r1, test_seed());
        tcase r1_r0 = {.B = 1, .S = 16, .Skv = 16, .H = 2, .Hkv = 2, .D = 8, .dt = all_dt[t],
                       .causal = true, .qr = {{4, 4}, {8, 4}}, .nqr = 2,
                       .kr = {{0, 4}, {12, 4}}, .nkr = 2};
        run_case(&r1_r0, test_seed());
        /* larger than the tiles: S = 2048 over P = 4 (chunks of 256), rank 1's queries
         * against a ring block made of the shards of ranks 2 and 0 (positions not
         * increasing), so diagonal tiles take the general mask path */
        tcase big = {.B = 1, .S = 2048, .Skv = 2048, .H = 1, .Hkv = 1, .D = 64,
                     .dt = all_dt[t], .causal = true,
                     .qr = {{256, 256}, {1536, 256}}, .nqr = 2,
                     .kr = {{512, 256}, {1280, 256}, {0, 256}, {1792, 256}}, .nkr = 4,
                     .row_step = 7};
        run_case(&big, test_seed());
        /* unified R=2 x U=2, zigzag over 2P = 8 chunks of 128: ring block 0 holds the
         * shards of ranks 0 and 1 = chunks 0, 7, 1, 6 (positions jump back inside a key
         * tile, and the diagonal j == i lies inside those tiles) */
        tcase blk = {.B = 1, .S = 1024, .Skv = 1024, .H = 2, .Hkv = 1, .D = 64,
                     .dt = all_dt[t], .causal = true,
                     .qr = {{0, 128}, {896, 128}, {128, 128}, {768, 128}}, .nqr = 4,
                     .kr = {{0, 128}, {896, 128}, {128, 128}, {768, 128}}, .nkr = 4,
                     .row_step = 5};
        run_case(&blk, test_seed());
        /* the same with chunks of 64: a query tile then holds positions that jump
         * back too */
        tcase blk64 = {.B = 1, .S = 512, .Skv = 512, .H = 1, .Hkv = 1, .D = 40,
                       .dt = all_dt[t], .causal = true,
                       .qr = {{0, 64}, {448, 64}, {64, 64}, {384, 64}}, .nqr = 4,
                       .kr = {{0, 64}, {448, 64}, {64, 64}, {384, 64}}, .nkr = 4,
                       .row_step = 2};
        run_case(&blk64, test_seed());
    }
}

Test(attn, causal_full_many_tiles)
{
    /* one block holding everything: diagonal tiles with increasing positions, and
     * the skipped tiles above the diagonal; default and odd tile sizes */
    const char *tiles[] = {NULL, "7x13", "64x32", "1x1"};
    for (int ti = 0; ti < 4; ti++) {
        int64_t S = ti == 3 ? 40 : 1100;
        tcase tc = {.B = 2, .S = S, .Skv = S, .H = 2, .Hkv = 1, .D = 64,
                    .dt = all_dt[ti % 3], .causal = true, .extra = 1,
                    .row_step = ti == 3 ? 1 : 5, .tiles = tiles[ti]};
        run_case(&tc, test_seed());
    }
}

Test(attn, key_padding)
{
    for (int t = 0; t < 3; t++) {
        /* random padding; the last batch fully padded: all its rows o = 0, lse = -inf */
        tcase full = {.B = 3, .S = 50, .Skv = 333, .H = 2, .Hkv = 2, .D = 40, .dt = all_dt[t],
                      .pad = 2, .extra = 4};
        case_result r = run_case(&full, test_seed());
        cr_assert_eq(r.empty_rows, 50 * 2, "expected every row of batch 2 to be empty");
        /* causal + the first keys padded: the first rows see no key */
        tcase early = {.B = 2, .S = 600, .Skv = 600, .H = 1, .Hkv = 1, .D = 64, .dt = all_dt[t],
                       .pad = 3, .causal = true, .row_step = 3};
        r = run_case(&early, test_seed());
        cr_assert_geq(r.empty_rows, 2, "the first rows must see no key");
        /* padding with runs (the mask is indexed by global key position) */
        tcase runs = {.B = 2, .S = 64, .Skv = 64, .H = 2, .Hkv = 2, .D = 8, .dt = all_dt[t],
                      .pad = 1, .qr = {{8, 8}, {40, 8}}, .nqr = 2,
                      .kr = {{16, 16}, {0, 8}, {56, 8}}, .nkr = 3};
        run_case(&runs, test_seed());
    }
}

Test(attn, batch_strides)
{
    for (int t = 0; t < 3; t++) {
        tcase tc = {.B = 3, .S = 200, .Skv = 260, .H = 4, .Hkv = 2, .D = 64, .dt = all_dt[t],
                    .qh0 = 1, .nqh = 2, .extra = 17, .qr = {{20, 150}}, .nqr = 1,
                    .kr = {{3, 250}}, .nkr = 1};
        run_case(&tc, test_seed());
    }
}

Test(attn, large_logits)
{
    /* scores with a spread of ~30: the online softmax must stay exact */
    for (int t = 0; t < 3; t++) {
        tcase tc = {.B = 1, .S = 300, .Skv = 1500, .H = 1, .Hkv = 1, .D = 64, .dt = all_dt[t],
                    .amp = 30.0, .row_step = 2};
        run_case(&tc, test_seed());
    }
}

Test(attn, other_isas)
{
    const char *isas[] = {"avx2", "scalar"};
    for (int i = 0; i < 2; i++) {
        setenv("CPC_CPU_ISA", isas[i], 1);
        tcase tc = {.B = 1, .S = 300, .Skv = 523, .H = 2, .Hkv = 1, .D = 40,
                    .dt = all_dt[i + 1], .causal = true, .pad = 3, .tiles = "64x96"};
        run_case(&tc, test_seed());
        tcase big = {.B = 1, .S = 200, .Skv = 900, .H = 1, .Hkv = 1, .D = 64,
                     .dt = CPC_DTYPE_FP32, .amp = 10.0};
        run_case(&big, test_seed());
    }
    unsetenv("CPC_CPU_ISA");
}

/* ---- merge: ring attention's correctness ------------------------------------------- */

Test(merge, split_keys_equals_full_attention)
{
    for (int t = 0; t < 3; t++)
        for (int nblk = 2; nblk <= 4; nblk++) {
            tcase tc = {.B = 2, .S = 150, .Skv = 150, .H = 4, .Hkv = 2, .D = 64,
                        .dt = all_dt[t], .nblk = nblk, .extra = 2};
            run_case(&tc, test_seed());
        }
}

Test(merge, ring_causal_zigzag_blocks)
{
    /* rank 0 of a zigzag ring of P = 4 over S = 512 (chunks of 64): queries chunks 0
     * and 7; keys all of S in blocks (some blocks are invisible to some rows: LSE
     * -inf merged in), plus key padding */
    for (int t = 0; t < 3; t++) {
        tcase tc = {.B = 1, .S = 512, .Skv = 512, .H = 2, .Hkv = 2, .D = 64, .dt = all_dt[t],
                    .causal = true, .qr = {{0, 64}, {448, 64}}, .nqr = 2,
                    .kr = {{64, 64}, {384, 64}, {128, 64}, {320, 64}, {192, 64}, {256, 64},
                           {0, 64}, {448, 64}},
                    .nkr = 8, .nblk = 4, .pad = 3};
        run_case(&tc, test_seed());
    }
}

Test(merge, inf_rows)
{
    cpc_backend *be = make_backend();
    /* B=1, s=4 rows, h=1, d=3 */
    float acc[12] = {0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6};
    float acc_lse[4] = {-INFINITY, -INFINITY, 0.3f, 1.0f};
    float o[12] = {7, 8, 9, -1, -2, -3, 10, 11, 12, 0.5f, 0.25f, -4};
    float lse[4] = {-INFINITY, 1.5f, -INFINITY, 2.0f};
    cpc_merge_args m = {.B = 1, .s = 4, .h = 1, .d = 3, .acc = acc, .acc_lse = acc_lse,
                        .o = o, .lse = lse};
    cr_assert_null(be->vt->merge(be, &m));
    /* both -inf: stays (0, -inf) */
    cr_assert(acc[0] == 0 && acc[1] == 0 && acc[2] == 0 && acc_lse[0] == -INFINITY);
    /* acc empty: takes the block */
    cr_assert(acc[3] == -1 && acc[4] == -2 && acc[5] == -3 && acc_lse[1] == 1.5f);
    /* block empty: acc unchanged */
    cr_assert(acc[6] == 1 && acc[7] == 2 && acc[8] == 3 && acc_lse[2] == 0.3f);
    /* both finite: log(e^1 + e^2) and the weighted sum */
    double L = log(exp(1.0) + exp(2.0)), wa = exp(1.0 - L), wb = exp(2.0 - L);
    cr_assert_float_eq(acc_lse[3], L, 1e-6);
    cr_assert_float_eq(acc[9], wa * 4 + wb * 0.5, 1e-6);
    cr_assert_float_eq(acc[10], wa * 5 + wb * 0.25, 1e-6);
    cr_assert_float_eq(acc[11], wa * 6 + wb * -4, 1e-6);
    for (int i = 0; i < 12; i++)
        cr_assert(!isnan(acc[i]));
    be->vt->destroy(be);
}

/* ---- the other backend methods ------------------------------------------------------- */

Test(backend, alloc_copy_init)
{
    cpc_backend *be = make_backend();
    cr_assert_str_eq(be->vt->name, "cpu");
    void *p0 = NULL, *p1 = NULL, *p2 = NULL;
    cr_assert_null(be->vt->alloc(be, 0, &p0));
    cr_assert_null(be->vt->alloc(be, 0, &p1));
    cr_assert_null(be->vt->alloc(be, 1000, &p2));
    cr_assert(p0 && p1 && p2 && p0 != p1);
    cr_assert_eq((uintptr_t)p0 % 64, 0);
    cr_assert_eq((uintptr_t)p2 % 64, 0);
    uint64_t seed = test_seed();
    unsigned char host[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (unsigned char)bits_at(seed, 9, (uint64_t)i);
    cr_assert_null(be->vt->upload(be, p2, host, 1000));
    void *p3 = NULL;
    cr_assert_null(be->vt->alloc(be, 1000, &p3));
    cr_assert_null(be->vt->copy(be, p3, p2, 1000));
    cr_assert_null(be->vt->download(be, back, p3, 1000));
    cr_assert_arr_eq(host, back, 1000);
    float acc[37], l[5];
    for (int i = 0; i < 37; i++)
        acc[i] = 1.0f + (float)i;
    for (int i = 0; i < 5; i++)
        l[i] = 3.0f;
    cr_assert_null(be->vt->init_acc(be, acc, 37, l, 5));
    for (int i = 0; i < 37; i++)
        cr_assert(acc[i] == 0.0f);
    for (int i = 0; i < 5; i++)
        cr_assert(l[i] == -INFINITY);
    if (be->vt->sync)
        cr_assert_null(be->vt->sync(be));
    be->vt->free(be, p0);
    be->vt->free(be, p1);
    be->vt->free(be, p2);
    be->vt->free(be, p3);
    be->vt->destroy(be);
}

Test(backend, copy_strided_selects_heads)
{
    cpc_backend *be = make_backend();
    uint64_t seed = test_seed();
    /* src [B=2, S=5, H=6, D=4] fp32; copy tokens 1..3 of heads 2..4 into dst
     * [2, 3, 3, 4] (contiguous), then back into a zeroed copy of src */
    enum { B = 2, S = 5, H = 6, D = 4 };
    float src[B * S * H * D], dst[B * 3 * 3 * D], back[B * S * H * D];
    for (int i = 0; i < B * S * H * D; i++)
        src[i] = (float)normal_at(seed, 5, (uint64_t)i);
    cr_assert_null(be->vt->copy_strided(be, dst, src + (1 * H + 2) * D, 4, B, 3, 3, D,
                                        3 * 3 * D, 3 * D, D, S * H * D, H * D, D));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < 3; t++)
            for (int h = 0; h < 3; h++)
                for (int e = 0; e < D; e++)
                    cr_assert(dst[((b * 3 + t) * 3 + h) * D + e] ==
                              src[((b * S + t + 1) * H + h + 2) * D + e]);
    memset(back, 0, sizeof back);
    cr_assert_null(be->vt->copy_strided(be, back + (1 * H + 2) * D, dst, 4, B, 3, 3, D,
                                        S * H * D, H * D, D, 3 * 3 * D, 3 * D, D));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++)
            for (int h = 0; h < H; h++)
                for (int e = 0; e < D; e++) {
                    int i = ((b * S + t) * H + h) * D + e;
                    bool in = t >= 1 && t < 4 && h >= 2 && h < 5;
                    cr_assert(back[i] == (in ? src[i] : 0.0f));
                }
    /* fully contiguous (folds into one memcpy) with 2-byte elements */
    uint16_t a16[B * S * H * D], b16[B * S * H * D];
    for (int i = 0; i < B * S * H * D; i++)
        a16[i] = (uint16_t)bits_at(seed, 6, (uint64_t)i);
    cr_assert_null(be->vt->copy_strided(be, b16, a16, 2, B, S, H, D, S * H * D, H * D, D,
                                        S * H * D, H * D, D));
    cr_assert_arr_eq(a16, b16, sizeof a16);
    be->vt->destroy(be);
}

Test(backend, convert_all_pairs)
{
    cpc_backend *be = make_backend();
    uint64_t seed = test_seed();
    enum { N = 1003 };
    float f[N], f2[N];
    for (int i = 0; i < N; i++)
        f[i] = (float)(100.0 * normal_at(seed, 7, (uint64_t)i));
    uint16_t h16[N], b16[N], x16[N];
    cr_assert_null(be->vt->convert(be, h16, CPC_DTYPE_FP16, f, CPC_DTYPE_FP32, N));
    cr_assert_null(be->vt->convert(be, b16, CPC_DTYPE_BF16, f, CPC_DTYPE_FP32, N));
    for (int i = 0; i < N; i++) {
        cr_assert_eq(h16[i], cpc_f32_to_fp16(f[i]));
        cr_assert_eq(b16[i], cpc_f32_to_bf16(f[i]));
    }
    /* bf16 -> fp16 rounds the (exact) widened value once */
    cr_assert_null(be->vt->convert(be, x16, CPC_DTYPE_FP16, b16, CPC_DTYPE_BF16, N));
    for (int i = 0; i < N; i++)
        cr_assert_eq(x16[i], cpc_f32_to_fp16(cpc_bf16_to_f32(b16[i])));
    cr_assert_null(be->vt->convert(be, x16, CPC_DTYPE_BF16, h16, CPC_DTYPE_FP16, N));
    for (int i = 0; i < N; i++)
        cr_assert_eq(x16[i], cpc_f32_to_bf16(cpc_fp16_to_f32(h16[i])));
    cr_assert_null(be->vt->convert(be, f2, CPC_DTYPE_FP32, h16, CPC_DTYPE_FP16, N));
    for (int i = 0; i < N; i++)
        cr_assert(f2[i] == cpc_fp16_to_f32(h16[i]));
    cr_assert_null(be->vt->convert(be, f2, CPC_DTYPE_FP32, f, CPC_DTYPE_FP32, N));
    cr_assert_arr_eq(f, f2, sizeof f);
    be->vt->destroy(be);
}

Test(backend, bad_arguments_are_errors)
{
    cpc_backend *be = make_backend();
    float q[64] = {1}, o[64], lse[8];
    /* query heads [0, 4) with group 2 need K/V heads 0..1 but the block holds only 1 */
    cpc_attn_args a = {.B = 1, .sq = 2, .skv = 2, .hq = 4, .hkv = 1, .d = 8, .group = 2,
                       .dtype = CPC_DTYPE_FP32, .q = q, .k = q, .v = q, .o = o, .lse = lse,
                       .scale = 1.0f};
    cpc_status *st = be->vt->attn(be, &a);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INTERNAL);
    cpc_status_free(st);
    /* runs that do not cover the rows */
    cpc_run r = {0, 5};
    cpc_attn_args b = {.B = 1, .sq = 2, .skv = 2, .hq = 1, .hkv = 1, .d = 8, .group = 1,
                       .dtype = CPC_DTYPE_FP32, .q = q, .k = q, .v = q, .o = o, .lse = lse,
                       .scale = 1.0f, .causal = true, .q_runs = &r, .n_q_runs = 1};
    st = be->vt->attn(be, &b);
    cr_assert_not_null(st);
    cpc_status_free(st);
    /* a key position beyond the mask */
    uint8_t mk[2] = {1, 1};
    cpc_run kr = {1, 2};
    cpc_attn_args c = {.B = 1, .sq = 2, .skv = 2, .hq = 1, .hkv = 1, .d = 8, .group = 1,
                       .dtype = CPC_DTYPE_FP32, .q = q, .k = q, .v = q, .o = o, .lse = lse,
                       .scale = 1.0f, .kv_runs = &kr, .n_kv_runs = 1, .kv_mask = mk,
                       .mask_len = 2};
    st = be->vt->attn(be, &c);
    cr_assert_not_null(st);
    cpc_status_free(st);
    /* no keys at all: every row empty */
    cpc_attn_args e = {.B = 1, .sq = 2, .skv = 0, .hq = 1, .hkv = 1, .d = 8, .group = 1,
                       .dtype = CPC_DTYPE_FP32, .q = q, .o = o, .lse = lse, .scale = 1.0f};
    cr_assert_null(be->vt->attn(be, &e));
    for (int i = 0; i < 16; i++)
        cr_assert(o[i] == 0.0f);
    cr_assert(lse[0] == -INFINITY && lse[1] == -INFINITY);
    be->vt->destroy(be);
}

/* ---- dtype conversions ---------------------------------------------------------------- */

static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t ubits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Independent decoders (no shared code with dtype.c). */
static double fp16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double bf16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
    return s ? -v : v;
}

Test(dtype, known_values)
{
    cr_assert_eq(cpc_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(cpc_f32_to_bf16(-2.5f), 0xc020);
    cr_assert_eq(cpc_f32_to_fp16(1.0f), 0x3c00);
    cr_assert_eq(cpc_f32_to_fp16(-2.5f), 0xc100);
    cr_assert_eq(cpc_f32_to_fp16(65504.0f), 0x7bff);
    cr_assert(cpc_fp16_to_f32(0x7bff) == 65504.0f);
    cr_assert_eq(cpc_f32_to_fp16(65519.0f), 0x7bff);  /* below the midpoint */
    cr_assert_eq(cpc_f32_to_fp16(65520.0f), 0x7c00);  /* tie to even -> inf */
    cr_assert_eq(cpc_f32_to_fp16(1e6f), 0x7c00);
    cr_assert_eq(cpc_f32_to_fp16(-INFINITY), 0xfc00);
    cr_assert_eq(cpc_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(cpc_f32_to_bf16(3.4e38f), 0x7f80);   /* rounds over the max */
    /* fp16 subnormals */
    cr_assert_eq(cpc_f32_to_fp16(0x1p-24f), 0x0001);
    cr_assert_eq(cpc_f32_to_fp16(0x1p-25f), 0x0000);  /* tie -> even (0) */
    cr_assert_eq(cpc_f32_to_fp16(0x3p-25f), 0x0002);  /* tie -> even (2) */
    cr_assert_eq(cpc_f32_to_fp16(0x1.000002p-25f), 0x0001);
    cr_assert_eq(cpc_f32_to_fp16(-0x1p-14f), 0x8400);
    cr_assert_eq(cpc_f32_to_fp16(0x1.ff8p-15f), 0x03ff);  /* largest subnormal */
    cr_assert_eq(cpc_f32_to_fp16(0x1.ffcp-15f), 0x0400);  /* tie -> even: min normal */
    cr_assert_eq(cpc_f32_to_fp16(0x1.ff4p-15f), 0x03fe);  /* tie (1022.5) -> even (1022) */
    cr_assert(cpc_fp16_to_f32(0x0001) == 0x1p-24f);
    cr_assert(cpc_fp16_to_f32(0x03ff) == 0x1.ff8p-15f);
    cr_assert_eq(ubits(cpc_fp16_to_f32(0x8000)), 0x80000000u);
    /* bf16 subnormals (fp32 subnormals) */
    cr_assert_eq(cpc_f32_to_bf16(fbits(0x00010000u)), 0x0001);
    cr_assert_eq(cpc_f32_to_bf16(fbits(0x00008000u)), 0x0000);  /* tie -> even */
    cr_assert_eq(cpc_f32_to_bf16(fbits(0x00018000u)), 0x0002);  /* tie -> even */
    cr_assert(cpc_bf16_to_f32(0x0001) == fbits(0x00010000u));
    /* ties to even in the normal range */
    cr_assert_eq(cpc_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    cr_assert_eq(cpc_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
    cr_assert_eq(cpc_f32_to_bf16(1.0f + 0x1.2p-8f), 0x3f81);
    cr_assert_eq(cpc_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    cr_assert_eq(cpc_f32_to_fp16(1.0f + 0x3p-11f), 0x3c02);
    /* NaN stays NaN (quiet), sign kept */
    cr_assert(isnan(cpc_bf16_to_f32(cpc_f32_to_bf16(NAN))));
    cr_assert(isnan(cpc_fp16_to_f32(cpc_f32_to_fp16(NAN))));
    uint16_t snan_b = cpc_f32_to_bf16(fbits(0xff800001u)); /* payload only in low bits */
    cr_assert((snan_b & 0x7fff) > 0x7f80 && (snan_b & 0x8000));
    uint16_t snan_h = cpc_f32_to_fp16(fbits(0x7f800001u));
    cr_assert((snan_h & 0x7fff) > 0x7c00);
    cr_assert(isnan(cpc_fp16_to_f32(0x7c01)) && isnan(cpc_bf16_to_f32(0x7f81)));
}

Test(dtype, exhaustive_16bit_round_trips)
{
    for (uint32_t u = 0; u < 65536; u++) {
        uint16_t h = (uint16_t)u;
        double vh = fp16_value(h), vb = bf16_value(h);
        float fh = cpc_fp16_to_f32(h), fb = cpc_bf16_to_f32(h);
        if (isnan(vh))
            cr_assert(isnan(fh) && isnan(fp16_value(cpc_f32_to_fp16(fh))), "fp16 %04x", u);
        else {
            cr_assert((double)fh == vh && !!signbit(fh) == !!signbit(vh), "fp16 %04x", u);
            cr_assert_eq(cpc_f32_to_fp16(fh), h, "fp16 round trip %04x", u);
        }
        if (isnan(vb))
            cr_assert(isnan(fb) && isnan(bf16_value(cpc_f32_to_bf16(fb))), "bf16 %04x", u);
        else {
            cr_assert((double)fb == vb && !!signbit(fb) == !!signbit(vb), "bf16 %04x", u);
            cr_assert_eq(cpc_f32_to_bf16(fb), h, "bf16 round trip %04x", u);
        }
    }
}

/* r must be the nearest 16-bit value to x, ties to an even mantissa. */
static void check_nearest(float x, uint16_t r, double (*val)(uint16_t), uint16_t inf_bits,
                          double max_finite, double half_ulp_max, uint64_t seed)
{
    double xv = (double)x, rv = val(r);
    if (fabs(xv) >= max_finite + half_ulp_max) {
        cr_assert_eq(r & 0x7fff, inf_bits, "%a must overflow (seed %llu)", xv,
                     (unsigned long long)seed);
        return;
    }
    cr_assert(!isinf(rv), "%a rounded to inf (seed %llu)", xv, (unsigned long long)seed);
    uint16_t mag = r & 0x7fff, sign = r & 0x8000;
    double err = fabs(xv - rv);
    for (int dlt = -1; dlt <= 1; dlt += 2) {
        int nm = (int)mag + dlt;
        if (nm < 0 || nm >= inf_bits)
            continue;
        double nv = val((uint16_t)(sign | nm));
        double ne = fabs(xv - nv);
        cr_assert(err <= ne, "%a -> %04x is not nearest (seed %llu)", xv, r,
                  (unsigned long long)seed);
        if (err == ne)
            cr_assert((mag & 1) == 0, "%a -> %04x: tie not to even (seed %llu)", xv, r,
                      (unsigned long long)seed);
    }
}

Test(dtype, rounding_is_nearest_even_and_bulk_matches_scalar)
{
    uint64_t seed = test_seed();
    enum { N = 200003 };
    float *x = malloc(sizeof(float) * N), *wide = malloc(sizeof(float) * N);
    uint16_t *hb = malloc(2 * N), *hh = malloc(2 * N);
    for (int i = 0; i < N; i++) {
        uint32_t u = bits_at(seed, 8, (uint64_t)i);
        switch (i % 4) {
        case 0: /* any bit pattern: NaN, inf, subnormal fp32 */
            x[i] = fbits(u);
            break;
        case 1: /* fp16 range, including its subnormals: exponents 2^-26 .. 2^17 */
            x[i] = fbits((u & 0x807fffffu) | ((uint32_t)(101 + (u >> 8) % 43) << 23));
            break;
        case 2: /* exact ties for fp16/bf16: few low mantissa bits */
            x[i] = fbits(u & 0xfffff000u);
            break;
        default:
            x[i] = (float)normal_at(seed, 9, (uint64_t)i);
        }
    }
    cpc_f32_to_bf16_n(hb, x, N);
    cpc_f32_to_fp16_n(hh, x, N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(hb[i], cpc_f32_to_bf16(x[i]), "bulk bf16 %08x (seed %llu)", ubits(x[i]),
                     (unsigned long long)seed);
        cr_assert_eq(hh[i], cpc_f32_to_fp16(x[i]), "bulk fp16 %08x (seed %llu)", ubits(x[i]),
                     (unsigned long long)seed);
        if (isnan(x[i])) {
            cr_assert(isnan(bf16_value(hb[i])) && isnan(fp16_value(hh[i])));
            continue;
        }
        check_nearest(x[i], hb[i], bf16_value, 0x7f80, 0x1.fep127, 0x1p119, seed);
        check_nearest(x[i], hh[i], fp16_value, 0x7c00, 65504.0, 16.0, seed);
    }
    /* widening, bulk vs scalar, odd lengths */
    for (int i = 0; i < N; i++)
        hb[i] = (uint16_t)bits_at(seed, 10, (uint64_t)i);
    for (int len = 1; len < 40; len += 3) {
        cpc_bf16_to_f32_n(wide, hb, (size_t)len);
        for (int i = 0; i < len; i++) {
            float s = cpc_bf16_to_f32(hb[i]);
            cr_assert(ubits(wide[i]) == ubits(s));
        }
    }
    cpc_bf16_to_f32_n(wide, hb, N);
    for (int i = 0; i < N; i++)
        cr_assert(ubits(wide[i]) == ubits(cpc_bf16_to_f32(hb[i])), "bf16 widen %04x", hb[i]);
    cpc_fp16_to_f32_n(wide, hb, N);
    for (int i = 0; i < N; i++)
        cr_assert(ubits(wide[i]) == ubits(cpc_fp16_to_f32(hb[i])), "fp16 widen %04x", hb[i]);
    /* scaled widening is one fp32 multiply */
    cpc_to_f32_scaled_n(wide, hb, CPC_DTYPE_FP16, N, 0.37f);
    for (int i = 0; i < N; i++) {
        float s = cpc_fp16_to_f32(hb[i]) * 0.37f;
        cr_assert(ubits(wide[i]) == ubits(s) || (isnan(s) && isnan(wide[i])));
    }
    free(x);
    free(wide);
    free(hb);
    free(hh);
}

/* ---- the reference and the comparison themselves --------------------------------------- */

Test(reference, hand_computed)
{
    /* B=1, S=2, Skv=2, H=1, D=2, causal: row 0 sees key 0 only (out = v0,
     * lse = score); row 1 sees both */
    float q[4] = {1, 2, 0.5f, -1}, k[4] = {0.25f, 1, 2, -3}, v[4] = {3, 4, -5, 6};
    cpc_ref_problem p = {.B = 1, .S = 2, .Skv = 2, .H = 1, .Hkv = 1, .D = 2,
                         .dtype = CPC_DTYPE_FP32, .q = q, .k = k, .v = v, .scale = 0.5,
                         .causal = true};
    double out[4], lse[2];
    cr_assert_null(cpc_reference_attention(&p, NULL, -1, out, lse));
    cr_assert_float_eq(lse[0], 0.5 * (0.25 + 2), 1e-15);
    cr_assert(out[0] == 3 && out[1] == 4);
    double s0 = 0.5 * (0.5 * 0.25 - 1), s1 = 0.5 * (0.5 * 2 + 3);
    double L = log(exp(s0) + exp(s1));
    cr_assert_float_eq(lse[1], L, 1e-14);
    cr_assert_float_eq(out[2], (exp(s0) * 3 + exp(s1) * -5) / exp(L), 1e-14);
    cr_assert_float_eq(out[3], (exp(s0) * 4 + exp(s1) * 6) / exp(L), 1e-14);
    /* masking key 0 makes row 0 empty */
    uint8_t mk[2] = {0, 1};
    p.kv_mask = mk;
    cr_assert_null(cpc_reference_attention(&p, NULL, -1, out, lse));
    cr_assert(lse[0] == -INFINITY && out[0] == 0 && out[1] == 0);
    cr_assert_float_eq(lse[1], s1, 1e-15);
    cr_assert(out[2] == -5 && out[3] == 6);
    /* errors are statuses */
    p.Hkv = 3;
    cpc_status *st = cpc_reference_attention(&p, NULL, -1, out, lse);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cpc_status_free(st);
}

Test(reference, rows_match_all_rows_and_sampling)
{
    uint64_t seed = test_seed();
    const int B = 2, H = 6, Hkv = 3, D = 16;
    const int64_t S = 40;
    void *q = rand_tensor(CPC_DTYPE_BF16, (size_t)B * S * H * D, seed, 1, 1);
    void *k = rand_tensor(CPC_DTYPE_BF16, (size_t)B * S * Hkv * D, seed, 2, 1);
    void *v = rand_tensor(CPC_DTYPE_BF16, (size_t)B * S * Hkv * D, seed, 3, 1);
    cpc_ref_problem p = {.B = B, .S = S, .Skv = S, .H = H, .Hkv = Hkv, .D = D,
                         .dtype = CPC_DTYPE_BF16, .q = q, .k = k, .v = v, .scale = 0.25,
                         .causal = true};
    double *out = malloc(sizeof(double) * B * S * H * D), *lse = malloc(sizeof(double) * B * H * S);
    cr_assert_null(cpc_reference_attention(&p, NULL, -1, out, lse));
    cpc_ref_row rows[2 * 6 * 9];
    int64_t n = cpc_reference_sample_rows(B, H, S, 9, seed, rows);
    cr_assert_eq(n, B * H * 9);
    for (int64_t i = 0; i < n; i++) {
        if (i % 9 == 0)
            cr_assert_eq(rows[i].s, 0);
        else {
            cr_assert_gt(rows[i].s, rows[i - 1].s, "sample rows sorted and distinct");
            if (i % 9 == 8)
                cr_assert_eq(rows[i].s, S - 1);
        }
    }
    /* reversed order, to exercise the grouping */
    cpc_ref_row rev[2 * 6 * 9];
    for (int64_t i = 0; i < n; i++)
        rev[i] = rows[n - 1 - i];
    double ro[2 * 6 * 9 * 16], rl[2 * 6 * 9];
    cr_assert_null(cpc_reference_attention(&p, rev, n, ro, rl));
    double go[2 * 6 * 9 * 16], gl[2 * 6 * 9];
    float *lsef = malloc(sizeof(float) * B * H * S);
    float *outf = malloc(sizeof(float) * B * S * H * D);
    for (int64_t i = 0; i < (int64_t)B * S * H * D; i++)
        outf[i] = (float)out[i];
    cr_assert_null(cpc_reference_gather_out(outf, CPC_DTYPE_FP32, B, S, H, D, rev, n, go));
    for (int64_t i = 0; i < n * D; i++)
        cr_assert(go[i] == (double)(float)ro[i]);
    free(outf);
    for (int64_t i = 0; i < n; i++) {
        const cpc_ref_row *r = &rev[i];
        for (int e = 0; e < D; e++)
            cr_assert(ro[i * D + e] == out[(((size_t)r->b * S + r->s) * H + r->h) * D + e]);
        cr_assert(rl[i] == lse[((size_t)r->b * H + r->h) * S + r->s]);
    }
    for (int64_t i = 0; i < B * H * S; i++)
        lsef[i] = (float)lse[i];
    cr_assert_null(cpc_reference_gather_lse(lsef, B, H, S, rev, n, gl));
    for (int64_t i = 0; i < n; i++)
        cr_assert_float_eq(gl[i], rl[i], 1e-5 * fabs(rl[i]) + 1e-6);
    cpc_ref_row bad = {0, H, 0};
    cpc_status *st = cpc_reference_attention(&p, &bad, 1, ro, rl);
    cr_assert_not_null(st);
    cpc_status_free(st);
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    free(lsef);
}

Test(reference, compare_detects_nan_inf_and_error)
{
    double ref[4] = {1, -2, 3, -INFINITY};
    float good[4] = {1, -2, 3, -INFINITY};
    cpc_compare_result r;
    cpc_compare(good, CPC_DTYPE_FP32, ref, 4, 1e-5, &r);
    cr_assert(r.pass && r.rel_err == 0 && r.n_nan == 0 && r.n_inf == 0 && r.first_bad == -1);
    float off[4] = {1.1f, -2, 3, -INFINITY};
    cpc_compare(off, CPC_DTYPE_FP32, ref, 4, 1e-5, &r);
    cr_assert(!r.pass);
    cr_assert_float_eq(r.rel_err, (double)(1.1f - 1.0f) / sqrt(14.0), 1e-12);
    cr_assert_float_eq(r.max_abs_err, (double)(1.1f - 1.0f), 1e-12);
    cpc_compare(off, CPC_DTYPE_FP32, ref, 4, 0.1, &r);
    cr_assert(r.pass);
    float nanv[4] = {1, NAN, 3, -INFINITY};
    cpc_compare(nanv, CPC_DTYPE_FP32, ref, 4, 1.0, &r);
    cr_assert(!r.pass && r.n_nan == 1 && r.first_bad == 1);
    float infv[4] = {1, -2, INFINITY, -INFINITY};
    cpc_compare(infv, CPC_DTYPE_FP32, ref, 4, 1.0, &r);
    cr_assert(!r.pass && r.n_inf == 1 && r.first_bad == 2);
    float fin[4] = {1, -2, 3, -1e30f}; /* ref -inf, got finite */
    cpc_compare(fin, CPC_DTYPE_FP32, ref, 4, 1.0, &r);
    cr_assert(!r.pass && r.n_inf == 1 && r.first_bad == 3);
    /* bf16 storage compared after exact widening */
    uint16_t hb[3] = {cpc_f32_to_bf16(1.0f), cpc_f32_to_bf16(-2.0f), cpc_f32_to_bf16(3.0f)};
    cpc_compare(hb, CPC_DTYPE_BF16, ref, 3, 1e-12, &r);
    cr_assert(r.pass && r.rel_err == 0);
    cr_assert_float_eq(cpc_check_tolerance(CPC_DTYPE_FP32), 1e-5, 0);
    cr_assert_float_eq(cpc_check_tolerance(CPC_DTYPE_FP16), 2e-3, 0);
    cr_assert_float_eq(cpc_check_tolerance(CPC_DTYPE_BF16), 1e-2, 0);
}

/* A NaN in the input makes its row NaN in the backend and in the reference,
 * so the check (NaN always fails) catches it instead of seeing a zero row. */
Test(attn, nan_in_q_propagates)
{
    cpc_backend *be = NULL;
    cr_assert_null(cpc_cpu_backend_create(&be));
    enum { S = 9, D = 16 };
    float q[S * D], k[S * D], v[S * D], o[S * D], lse[S];
    unsigned x = 12345u;
    for (int i = 0; i < S * D; i++) {
        x = x * 1664525u + 1013904223u;
        q[i] = (float)((x >> 8) & 0xffff) / 65536.0f - 0.5f;
        k[i] = q[i] * 0.7f + 0.1f;
        v[i] = q[i] * -1.3f + 0.2f;
    }
    q[3 * D + 5] = NAN;
    cpc_attn_args a = {.B = 1, .sq = S, .skv = S, .hq = 1, .hkv = 1, .d = D, .group = 1,
                       .dtype = CPC_DTYPE_FP32, .q = q, .k = k, .v = v, .q_bstride = S * D,
                       .kv_bstride = S * D, .o = o, .lse = lse, .scale = 0.25f};
    cr_assert_null(be->vt->attn(be, &a));
    cr_expect(isnan(o[3 * D]) && isnan(lse[3]), "row 3 (NaN in q) must be NaN");
    cr_expect(!isnan(o[2 * D]) && !isnan(lse[2]), "other rows stay finite");
    cpc_ref_problem p = {.B = 1, .S = S, .Skv = S, .H = 1, .Hkv = 1, .D = D,
                         .dtype = CPC_DTYPE_FP32, .q = q, .k = k, .v = v, .scale = 0.25};
    double ref[S * D], rl[S];
    cr_assert_null(cpc_reference_attention(&p, NULL, 0, ref, rl));
    cr_expect(isnan(ref[3 * D]) && isnan(rl[3]), "the reference row is NaN too");
    be->vt->destroy(be);
}
