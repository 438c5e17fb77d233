/*
 * test_api.c - libcpc's public API (include/cpc/) used as a model would:
 * compile plans from strings, make the ranks of a local world (one thread
 * each), run forwards on caller tensors and compare every rank's output with
 * a float64 attention computed here on the same random inputs (SPEC
 * tolerances).  Also: strided tensors, bad arguments refused before anything
 * is written (and the rank still works after), and no allocation in any
 * forward after the first (malloc/calloc/realloc/posix_memalign are counted
 * by wrappers in this file).
 */

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpc/cpc.h"
#include "cpc/tool.h"

/* ---- allocation counter ---------------------------------------------------------- */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
static atomic_int counting;
static _Thread_local long n_allocs; /* per thread: a rank counts its own */
#if !defined(__SANITIZE_ADDRESS__)
void *malloc(size_t n)
{
    if (atomic_load(&counting))
        n_allocs++;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    if (atomic_load(&counting))
        n_allocs++;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    if (atomic_load(&counting))
        n_allocs++;
    return __libc_realloc(p, n);
}
int posix_memalign(void **p, size_t al, size_t n)
{
    if (atomic_load(&counting))
        n_allocs++;
    *p = __libc_memalign(al, n);
    return *p ? 0 : 12;
}
void *aligned_alloc(size_t al, size_t n)
{
    if (atomic_load(&counting))
        n_allocs++;
    return __libc_memalign(al, n);
}
#define CAN_COUNT 1
#else
#define CAN_COUNT 0 /* ASan owns malloc */
#endif

/* ---- helpers --------------------------------------------------------------------- */
static uint64_t rng_state = 88172645463325252ull;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static double nrand(void)
{
    double u = urand(), v = urand();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static cpc_artifact *compile_ok(const char *yaml, const char *const *sets, int n_sets)
{
    cpc_compile_options o;
    cpc_compile_options_init(&o, sizeof o);
    o.sets = sets;
    o.n_sets = n_sets;
    cpc_artifact *a = NULL;
    cpc_status *diags = NULL;
    cpc_status *st = cpc_compile_plan_string(yaml, 0, "api.yaml", &o, &a, &diags);
    if (st)
        cpc_status_print(st, stderr, "test_api");
    cr_assert_null(st, "compile failed: %s", cpc_status_message(st));
    cr_assert_not_null(a);
    cpc_status_free(diags);
    return a;
}

static const char *PLAN_FMT =
    "version: 1\n"
    "name: api-test\n"
    "model: {heads: %d, kv_heads: %d, head_dim: %d, dtype: fp32}\n"
    "input:\n"
    "  batch: %d\n"
    "  segments:\n"
    "    - {name: text, tokens: %d}\n"
    "    - {name: image, tokens: %d}\n"
    "  mask: %s\n"
    "cluster: {world_size: %d, device: cpu}\n"
    "parallel: {variant: %s}\n";

typedef struct problem {
    int B, S, H, Hkv, D;
    bool causal;
    float *q, *k, *v;  /* global BSHD */
    double *ref;       /* global [B, S, H, D] */
} problem;

static void make_problem(problem *pb, int B, int S, int H, int Hkv, int D, bool causal)
{
    pb->B = B, pb->S = S, pb->H = H, pb->Hkv = Hkv, pb->D = D, pb->causal = causal;
    size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * Hkv * D;
    pb->q = malloc(nq * 4), pb->k = malloc(nk * 4), pb->v = malloc(nk * 4);
    pb->ref = calloc(nq, sizeof(double));
    for (size_t i = 0; i < nq; i++)
        pb->q[i] = (float)nrand();
    for (size_t i = 0; i < nk; i++)
        pb->k[i] = (float)nrand(), pb->v[i] = (float)nrand();
    double scale = 1.0 / sqrt((double)D);
    double *s = malloc((size_t)S * sizeof *s);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int hk = h / (H / Hkv);
            for (int i = 0; i < S; i++) {
                double m = -INFINITY;
                int nj = causal ? i + 1 : S;
                for (int j = 0; j < nj; j++) {
                    double dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += (double)pb->q[(((size_t)b * S + i) * H + h) * D + d] *
                               pb->k[(((size_t)b * S + j) * Hkv + hk) * D + d];
                    s[j] = dot * scale;
                    m = fmax(m, s[j]);
                }
                double z = 0;
                for (int j = 0; j < nj; j++)
                    z += (s[j] = exp(s[j] - m));
                double *o = &pb->ref[(((size_t)b * S + i) * H + h) * D];
                for (int j = 0; j < nj; j++)
                    for (int d = 0; d < D; d++)
                        o[d] += s[j] / z * pb->v[(((size_t)b * S + j) * Hkv + hk) * D + d];
            }
        }
    free(s);
}

static void free_problem(problem *pb)
{
    free(pb->q), free(pb->k), free(pb->v), free(pb->ref);
}

/* Copies the rank's shard (token runs) of a global [B, S, h, D] array. */
static float *shard_of(const cpc_artifact *a, int rank, const float *g, int B, int S, int h, int D,
                       int64_t *T)
{
    cpc_token_run runs[64];
    int n = 0;
    cr_assert_null(cpc_artifact_shard_runs(a, rank, runs, 64, &n));
    int64_t t = 0;
    for (int i = 0; i < n; i++)
        t += runs[i].len;
    float *s = malloc((size_t)B * t * h * D * 4 + 4);
    int64_t row = (int64_t)h * D;
    for (int b = 0; b < B; b++) {
        int64_t o = 0;
        for (int i = 0; i < n; i++)
            for (int64_t j = 0; j < runs[i].len; j++, o++)
                memcpy(&s[((size_t)b * t + o) * row], &g[((size_t)b * S + runs[i].start + j) * row],
                       (size_t)row * 4);
    }
    *T = t;
    return s;
}

static cpc_tensor tensor4(void *data, int64_t a0, int64_t a1, int64_t a2, int64_t a3)
{
    cpc_tensor t = {.data = data, .dtype = CPC_DTYPE_FP32, .ndim = 4, .shape = {a0, a1, a2, a3}};
    return t;
}

typedef struct rank_job {
    const cpc_artifact *a;
    cpc_local_world *w;
    int rank;
    const problem *pb;
    int iters;
    bool strided;
    double max_rel;
    long allocs_after_first;
    char err[512];
} rank_job;

static void *rank_thread(void *arg)
{
    rank_job *j = arg;
    const problem *pb = j->pb;
    cpc_rank *r = NULL;
    cpc_status *st = cpc_rank_new_local(j->a, j->w, j->rank, NULL, &r);
    if (st) {
        snprintf(j->err, sizeof j->err, "create: %s", cpc_status_message(st));
        cpc_status_free(st);
        return NULL;
    }
    int64_t T = 0;
    float *q = shard_of(j->a, j->rank, pb->q, pb->B, pb->S, pb->H, pb->D, &T);
    float *k = shard_of(j->a, j->rank, pb->k, pb->B, pb->S, pb->Hkv, pb->D, &T);
    float *v = shard_of(j->a, j->rank, pb->v, pb->B, pb->S, pb->Hkv, pb->D, &T);
    size_t no = (size_t)pb->B * T * pb->H * pb->D;
    float *out = malloc(no * 4 + 4);
    /* strided: q inside a fused [B, T, 2, H, D] buffer, out interleaved likewise */
    float *qf = NULL, *of = NULL;
    cpc_tensor tq = tensor4(q, pb->B, T, pb->H, pb->D), tk = tensor4(k, pb->B, T, pb->Hkv, pb->D),
               tv = tensor4(v, pb->B, T, pb->Hkv, pb->D), to = tensor4(out, pb->B, T, pb->H, pb->D);
    if (j->strided) {
        qf = malloc(no * 2 * 4 + 4);
        of = malloc(no * 2 * 4 + 4);
        for (int64_t bt = 0; bt < pb->B * T; bt++)
            memcpy(&qf[(size_t)bt * 2 * pb->H * pb->D + (size_t)pb->H * pb->D],
                   &q[(size_t)bt * pb->H * pb->D], (size_t)pb->H * pb->D * 4);
        int64_t st4[4] = {T * 2 * pb->H * pb->D, 2 * pb->H * pb->D, pb->D, 1};
        tq.data = qf + (size_t)pb->H * pb->D;
        memcpy(tq.strides, st4, sizeof st4);
        to.data = of;
        memcpy(to.strides, st4, sizeof st4);
    }
    long before = 0;
    for (int it = 0; it < j->iters; it++) {
        if (it == 1)
            before = n_allocs;
        st = cpc_rank_forward(r, &tq, &tk, &tv, NULL, &to, NULL);
        if (st) {
            snprintf(j->err, sizeof j->err, "forward: %s", cpc_status_message(st));
            cpc_status_free(st);
            goto done;
        }
    }
    j->allocs_after_first = n_allocs - before;
    if (j->strided)
        for (int64_t bt = 0; bt < pb->B * T; bt++)
            memcpy(&out[(size_t)bt * pb->H * pb->D], &of[(size_t)bt * 2 * pb->H * pb->D],
                   (size_t)pb->H * pb->D * 4);
    /* compare with the reference rows of this shard */
    {
        cpc_token_run runs[64];
        int n = 0;
        cpc_status_free(cpc_artifact_shard_runs(j->a, j->rank, runs, 64, &n));
        double num = 0, den = 0;
        int64_t row = (int64_t)pb->H * pb->D;
        for (int b = 0; b < pb->B; b++) {
            int64_t o = 0;
            for (int i = 0; i < n; i++)
                for (int64_t t = 0; t < runs[i].len; t++, o++)
                    for (int64_t e = 0; e < row; e++) {
                        double g = out[((size_t)b * T + o) * row + e];
                        double rf = pb->ref[((size_t)b * pb->S + runs[i].start + t) * row + e];
                        if (!isfinite(g))
                            num = INFINITY;
                        num += (g - rf) * (g - rf);
                        den += rf * rf;
                    }
        }
        j->max_rel = sqrt(num / den);
    }
done:
    cpc_rank_free(r);
    free(q), free(k), free(v), free(out), free(qf), free(of);
    return NULL;
}

/* Runs every rank of `a` on pb in threads; returns the worst relative error. */
static double run_world(const cpc_artifact *a, const problem *pb, int iters, bool strided,
                        long *allocs)
{
    int P = cpc_artifact_world_size(a);
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_new(a, &w));
    rank_job *jobs = calloc((size_t)P, sizeof *jobs);
    pthread_t *th = calloc((size_t)P, sizeof *th);
    for (int p = 0; p < P; p++) {
        jobs[p] = (rank_job){.a = a, .w = w, .rank = p, .pb = pb, .iters = iters, .strided = strided};
        pthread_create(&th[p], NULL, rank_thread, &jobs[p]);
    }
    double worst = 0;
    long al = 0;
    for (int p = 0; p < P; p++) {
        pthread_join(th[p], NULL);
        cr_assert_eq(jobs[p].err[0], 0, "rank %d: %s", p, jobs[p].err);
        worst = fmax(worst, jobs[p].max_rel);
        al += jobs[p].allocs_after_first;
    }
    if (allocs)
        *allocs = al;
    cpc_local_world_free(w);
    free(jobs);
    free(th);
    return worst;
}

static cpc_artifact *plan_for(int H, int Hkv, int D, int B, int text, int image, const char *mask,
                              int P, const char *variant, const char *const *sets, int n_sets)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml, PLAN_FMT, H, Hkv, D, B, text, image, mask, P, variant);
    return compile_ok(yaml, sets, n_sets);
}

Test(api, version_and_features)
{
    cr_assert_str_eq(cpc_version(), CPC_VERSION);
    /* cpc/version.h: the numbers of the string, and their code */
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", CPC_VERSION_MAJOR, CPC_VERSION_MINOR, CPC_VERSION_PATCH);
    cr_assert_str_eq(cpc_version(), v);
    cr_assert_eq(CPC_VERSION_CODE, CPC_VERSION_MAJOR * 10000 + CPC_VERSION_MINOR * 100 + CPC_VERSION_PATCH);
    cr_assert(CPC_VERSION_AT_LEAST(0, 0, 1) && !CPC_VERSION_AT_LEAST(CPC_VERSION_MAJOR + 1, 0, 0));
    cr_assert(cpc_have_mpi() || !cpc_have_mpi());
}

Test(api, every_variant_matches_float64_on_4_thread_ranks)
{
    static const char *const variants[] = {"ring", "ulysses", "unified", "ulysses_anything",
                                           "ring_anything"};
    for (int causal = 0; causal < 2; causal++)
        for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
            /* ring/unified need S divisible; the anything variants get uneven sizes */
            bool any = strstr(variants[i], "anything") != NULL;
            if (causal && strcmp(variants[i], "ulysses_anything") == 0)
                continue; /* CP022 family: not a causal variant */
            int text = any ? 13 : 16, image = any ? 38 : 48, H = any ? 6 : 8;
            cpc_compile_options o;
            cpc_compile_options_init(&o, sizeof o);
            char yaml[1024];
            snprintf(yaml, sizeof yaml, PLAN_FMT, H, H, 16, 2, text, image,
                     causal ? "causal" : "none", 4, variants[i]);
            cpc_artifact *a = NULL;
            cpc_status *st = cpc_compile_plan_string(yaml, 0, "api.yaml", &o, &a, NULL);
            if (st) { /* a variant the rules refuse for this shape must say why */
                cr_assert_eq(cpc_status_code(st), CPC_E_PLAN, "%s", cpc_status_message(st));
                cr_assert_gt(cpc_status_rule(st), 0);
                cpc_status_free(st);
                continue;
            }
            cr_assert_str_eq(cpc_artifact_variant(a), variants[i]);
            problem pb;
            make_problem(&pb, 2, text + image, H, H, 16, causal);
            double e = run_world(a, &pb, 2, false, NULL);
            cr_expect_lt(e, 1e-5, "%s causal=%d: rel err %g", variants[i], causal, e);
            cr_expect_gt(e, 0.0); /* computed, not copied */
            free_problem(&pb);
            cpc_artifact_free(a);
        }
}

Test(api, gqa_unified_and_strided_tensors_give_the_same_result)
{
    const char *sets[] = {"parallel.ulysses_degree=2"};
    cpc_artifact *a = plan_for(8, 2, 32, 1, 24, 40, "none", 4, "unified", sets, 1);
    cr_assert_eq(cpc_artifact_ulysses_degree(a), 2);
    problem pb;
    make_problem(&pb, 1, 64, 8, 2, 32, false);
    double e1 = run_world(a, &pb, 1, false, NULL);
    double e2 = run_world(a, &pb, 1, true, NULL);
    cr_expect_lt(e1, 1e-5);
    cr_expect_eq(e1, e2, "strided %g vs contiguous %g", e2, e1);
    free_problem(&pb);
    cpc_artifact_free(a);
}

Test(api, no_allocation_after_the_first_forward)
{
    if (!CAN_COUNT)
        cr_skip_test("allocation counting needs the libc allocator (not under ASan)");
    static const char *const variants[] = {"ring", "ulysses", "ring_anything"};
    for (size_t i = 0; i < 3; i++) {
        cpc_artifact *a = plan_for(4, 4, 16, 1, 8, 24, "none", 4, variants[i], NULL, 0);
        problem pb;
        make_problem(&pb, 1, 32, 4, 4, 16, false);
        atomic_store(&counting, 1);
        long allocs = -1;
        double e = run_world(a, &pb, 4, i == 2, &allocs);
        atomic_store(&counting, 0);
        cr_expect_lt(e, 1e-5);
        cr_expect_eq(allocs, 0, "%s: %ld allocations in forwards 2..4 (all ranks)", variants[i],
                     allocs);
        free_problem(&pb);
        cpc_artifact_free(a);
    }
}

/* Replicated segments (`split: replicate`, issue 24): each rank's q/k/v/out are its own
 * tokens (the whole text plus its image shard, cpc_artifact_shard_runs); every variant,
 * even and odd text lengths, strided tensors, no allocation after the first forward, and
 * the LSE refused with the reason. */
Test(api, replicated_text_matches_float64_on_thread_ranks)
{
    static const struct {
        const char *variant;
        int P, text, image;
        const char *degrees;
    } c[] = {{"ring", 2, 8, 24, ""},           {"ring_anything", 3, 7, 25, ""},
             {"ulysses", 2, 7, 24, ""},        {"ulysses_anything", 3, 5, 25, ""},
             {"unified", 6, 13, 24, ", ring_degree: 2, ulysses_degree: 3"}};
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml,
                 "version: 1\nmodel: {heads: 6, head_dim: 16, dtype: fp32}\n"
                 "input:\n  batch: 2\n  segments:\n"
                 "    - {name: text, tokens: %d, split: replicate}\n"
                 "    - {name: image, tokens: %d}\n"
                 "cluster: {world_size: %d, device: cpu}\nparallel: {variant: %s%s}\n",
                 c[i].text, c[i].image, c[i].P, c[i].variant, c[i].degrees);
        cpc_artifact *a = compile_ok(yaml, NULL, 0);
        int nd = 0;
        int64_t shape[4];
        cr_assert_null(cpc_artifact_shard_shape(a, c[i].P - 1, CPC_TENSOR_Q, &nd, shape));
        cr_expect_eq(shape[1], c[i].text + c[i].image / c[i].P, "%s: rank tokens %lld", c[i].variant,
                     (long long)shape[1]);
        problem pb;
        make_problem(&pb, 2, c[i].text + c[i].image, 6, 6, 16, false);
        long allocs = -1;
        if (CAN_COUNT)
            atomic_store(&counting, 1);
        double e = run_world(a, &pb, 2, i % 2 == 1, &allocs);
        atomic_store(&counting, 0);
        cr_expect_lt(e, 1e-5, "%s: rel err %g", c[i].variant, e);
        cr_expect_gt(e, 0.0);
        if (CAN_COUNT)
            cr_expect_eq(allocs, 0, "%s: %ld allocations in the second forward", c[i].variant, allocs);
        free_problem(&pb);
        cpc_artifact_free(a);
    }
}

Test(api, bad_arguments_are_refused_before_anything_is_written)
{
    cpc_artifact *a = plan_for(4, 4, 16, 1, 0 + 8, 8, "none", 1, "none", NULL, 0);
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_new(a, &w));
    cpc_rank *r = NULL;
    cr_assert_null(cpc_rank_new_local(a, w, 0, NULL, &r));
    problem pb;
    make_problem(&pb, 1, 16, 4, 4, 16, false);
    float *out = malloc(16 * 4 * 16 * 4);
    for (int i = 0; i < 16 * 4 * 16; i++)
        out[i] = 7.0f;
    cpc_tensor q = tensor4(pb.q, 1, 16, 4, 16), k = tensor4(pb.k, 1, 16, 4, 16),
               v = tensor4(pb.v, 1, 16, 4, 16), o = tensor4(out, 1, 16, 4, 16);
    cpc_tensor bad = tensor4(pb.q, 1, 15, 4, 16);
    cpc_status *st = cpc_rank_forward(r, &bad, &k, &v, NULL, &o, NULL);
    cr_assert_eq(cpc_status_code(st), CPC_E_USAGE);
    cr_expect(strstr(cpc_status_message(st), "[1, 15, 4, 16]") != NULL, "%s", cpc_status_message(st));
    cpc_status_free(st);
    cpc_tensor bf = q;
    bf.dtype = CPC_DTYPE_BF16;
    st = cpc_rank_forward(r, &bf, &k, &v, NULL, &o, NULL);
    cr_assert_eq(cpc_status_code(st), CPC_E_USAGE);
    cpc_status_free(st);
    cpc_tensor ov = o; /* overlapping output strides */
    int64_t s4[4] = {16 * 4 * 16, 16, 1, 1};
    memcpy(ov.strides, s4, sizeof s4);
    st = cpc_rank_forward(r, &q, &k, &v, NULL, &ov, NULL);
    cr_assert_eq(cpc_status_code(st), CPC_E_USAGE);
    cpc_status_free(st);
    cpc_tensor nul = k;
    nul.data = NULL;
    st = cpc_rank_forward(r, &q, &nul, &v, NULL, &o, NULL);
    cr_assert_eq(cpc_status_code(st), CPC_E_USAGE);
    cpc_status_free(st);
    for (int i = 0; i < 16 * 4 * 16; i++)
        cr_assert_eq(out[i], 7.0f, "output written by a refused call");
    /* the rank still works, and gives the LSE */
    float lse[4 * 16];
    cpc_tensor tl = {.data = lse, .dtype = CPC_DTYPE_FP32, .ndim = 3, .shape = {1, 4, 16}};
    cr_assert_null(cpc_rank_forward(r, &q, &k, &v, NULL, &o, &tl));
    double num = 0, den = 0;
    for (int i = 0; i < 16 * 4 * 16; i++)
        num += (out[i] - pb.ref[i]) * (out[i] - pb.ref[i]), den += pb.ref[i] * pb.ref[i];
    cr_expect_lt(sqrt(num / den), 1e-5);
    for (int i = 0; i < 4 * 16; i++)
        cr_expect(isfinite(lse[i]) && lse[i] > -50 && lse[i] < 50);
    free(out);
    free_problem(&pb);
    cpc_rank_free(r);
    cpc_local_world_free(w);
    cpc_artifact_free(a);
}

Test(api, compile_diagnostics_are_values_with_positions)
{
    /* FLUX 1008^2-like: 3969 image tokens do not divide by 4 for ulysses */
    const char *yaml = "version: 1\nname: x\nmodel: {heads: 24, head_dim: 128}\n"
                       "input:\n  segments:\n    - {name: text, tokens: 512}\n"
                       "    - {name: image, tokens: 3969}\n"
                       "cluster: {world_size: 4}\nparallel: {variant: ulysses}\n";
    cpc_artifact *a = NULL;
    cpc_status *diags = NULL;
    cpc_status *st = cpc_compile_plan_string(yaml, 0, "flux.yaml", NULL, &a, &diags);
    cr_assert_null(a);
    cr_assert_eq(cpc_status_code(st), CPC_E_PLAN);
    bool cp011 = false;
    for (const cpc_status *d = st; d; d = cpc_status_next(d)) {
        cr_assert_eq(cpc_status_severity(d), CPC_SEV_ERROR);
        if (cpc_status_rule(d) == 11) {
            cp011 = true;
            const char *file = NULL;
            int line = 0, col = 0;
            cpc_status_position(d, &file, &line, &col);
            cr_expect_str_eq(file, "flux.yaml");
            cr_expect_gt(line, 0);
            cr_expect_not_null(cpc_status_hint(d));
        }
    }
    cr_expect(cp011);
    cr_expect_eq(cpc_status_exit_code(st), 1);
    cpc_status_free(st);
    cpc_status_free(diags);
    /* the same plan with a --set override compiles, and is queryable */
    const char *sets[] = {"parallel.variant=ulysses_anything"};
    a = compile_ok(yaml, sets, 1);
    cr_expect_str_eq(cpc_artifact_variant(a), "ulysses_anything");
    cr_expect_eq(cpc_artifact_world_size(a), 4);
    double ms = 0;
    cr_expect(cpc_artifact_get_prediction(a, "ms_per_layer", &ms));
    cr_expect_gt(ms, 0);
    int nd = 0;
    int64_t sh[4];
    cr_assert_null(cpc_artifact_shard_shape(a, 3, CPC_TENSOR_Q, &nd, sh));
    cr_expect_eq(nd, 4);
    cr_expect_eq(sh[1], 128 + 992); /* tensor_split: the last rank gets the short pieces */
    /* round trip through a .cplan: loaded artifacts are proven again */
    char path[] = "/tmp/cpc-test-api-XXXXXX.cplan";
    int fd = mkstemps(path, 6);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_null(cpc_artifact_write(a, path));
    cpc_artifact *b = NULL;
    cr_assert_null(cpc_artifact_load(path, &b));
    cr_expect_str_eq(cpc_artifact_variant(b), "ulysses_anything");
    unlink(path);
    cpc_artifact_free(a);
    cpc_artifact_free(b);
    /* unreadable file: an I/O error, not a crash */
    st = cpc_artifact_load("/nonexistent/x.cplan", &b);
    cr_expect_eq(cpc_status_code(st), CPC_E_IO);
    cpc_status_free(st);
}

/* ---- the outer axes (cpc/rank.h THE OUTER AXES) ---------------------------------- */

/* Rank `rank`'s box of a global [B, S, h, D] array: its batch items, token
 * runs and heads [h0, h0 + nh). */
static float *box_of(const cpc_artifact *a, int rank, const float *g, int S, int h, int D, int64_t b0,
                     int64_t nb, int64_t h0, int64_t nh, int64_t *T)
{
    cpc_token_run runs[64];
    int n = 0;
    cr_assert_null(cpc_artifact_shard_runs(a, rank, runs, 64, &n));
    int64_t t = 0;
    for (int i = 0; i < n; i++)
        t += runs[i].len;
    float *s = malloc((size_t)(nb * t * nh * D) * 4 + 4);
    for (int64_t b = 0; b < nb; b++) {
        int64_t o = 0;
        for (int i = 0; i < n; i++)
            for (int64_t j = 0; j < runs[i].len; j++, o++)
                memcpy(&s[((size_t)(b * t + o) * nh) * D],
                       &g[(((size_t)(b0 + b) * S + runs[i].start + j) * h + h0) * D], (size_t)(nh * D) * 4);
    }
    *T = t;
    return s;
}

typedef struct axes_job {
    const cpc_artifact *a;
    cpc_local_world *w;   /* the world of this rank's group */
    int rank;
    const problem *pb;
    double num, den;      /* squared error and norm of this rank's rows */
    char err[512];
} axes_job;

static void *axes_thread(void *arg)
{
    axes_job *j = arg;
    const problem *pb = j->pb;
    cpc_rank_slice sl;
    cpc_rank *r = NULL;
    cpc_status *st = cpc_artifact_rank_slice(j->a, j->rank, &sl);
    if (!st)
        st = cpc_rank_new_local(j->a, j->w, j->rank, NULL, &r);
    if (st) {
        snprintf(j->err, sizeof j->err, "create: %s", cpc_status_message(st));
        cpc_status_free(st);
        return NULL;
    }
    int64_t T = 0, nb = sl.batch_len, nh = sl.head_len, nk = sl.kv_head_len;
    float *q = box_of(j->a, j->rank, pb->q, pb->S, pb->H, pb->D, sl.batch_start, nb, sl.head_start, nh, &T);
    float *k = box_of(j->a, j->rank, pb->k, pb->S, pb->Hkv, pb->D, sl.batch_start, nb, sl.kv_head_start, nk, &T);
    float *v = box_of(j->a, j->rank, pb->v, pb->S, pb->Hkv, pb->D, sl.batch_start, nb, sl.kv_head_start, nk, &T);
    float *out = malloc((size_t)(nb * T * nh * pb->D) * 4 + 4);
    cpc_tensor tq = tensor4(q, nb, T, nh, pb->D), tk = tensor4(k, nb, T, nk, pb->D),
               tv = tensor4(v, nb, T, nk, pb->D), to = tensor4(out, nb, T, nh, pb->D);
    st = cpc_rank_forward(r, &tq, &tk, &tv, NULL, &to, NULL);
    if (st) {
        snprintf(j->err, sizeof j->err, "forward: %s", cpc_status_message(st));
        cpc_status_free(st);
    } else {
        cpc_token_run runs[64];
        int n = 0;
        cpc_status_free(cpc_artifact_shard_runs(j->a, j->rank, runs, 64, &n));
        for (int64_t b = 0; b < nb; b++) {
            int64_t o = 0;
            for (int i = 0; i < n; i++)
                for (int64_t t = 0; t < runs[i].len; t++, o++)
                    for (int64_t e = 0; e < nh * pb->D; e++) {
                        double got = out[(size_t)((b * T + o) * nh * pb->D + e)];
                        double rf = pb->ref[(((size_t)(sl.batch_start + b) * pb->S + runs[i].start + t) * pb->H +
                                             sl.head_start) * pb->D + e];
                        j->num += isfinite(got) ? (got - rf) * (got - rf) : INFINITY;
                        j->den += rf * rf;
                    }
        }
    }
    cpc_rank_free(r);
    free(q), free(k), free(v), free(out);
    return NULL;
}

Test(api, cfg_and_tp_axes_ranks_take_their_batch_and_head_slices)
{
    /* C x T x R x U = 2 x 2 x 2 x 1 with kv_heads 2 (split), and 1 x 4 x 1 x 2
     * with kv_heads 2 < T (each K/V head replicated to two TP ranks) */
    struct { const char *par; int C, T, P, B, Hkv; bool causal; } cs[] = {
        {"{variant: ring, ring_degree: 2, cfg_degree: 2, tp_degree: 2}", 2, 2, 8, 2, 2, true},
        {"{variant: ulysses, ulysses_degree: 2, tp_degree: 4}", 1, 4, 8, 1, 2, false},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml,
                 "version: 1\nname: axes\nmodel: {heads: 8, kv_heads: %d, head_dim: 16, dtype: fp32}\n"
                 "input: {batch: %d, tokens: 64, mask: %s}\ncluster: {world_size: %d, device: cpu}\n"
                 "parallel: %s\n", cs[i].Hkv, cs[i].B, cs[i].causal ? "causal" : "none", cs[i].P, cs[i].par);
        cpc_artifact *a = compile_ok(yaml, NULL, 0);
        cr_assert_eq(cpc_artifact_world_size(a), cs[i].P);
        cr_assert_eq(cpc_artifact_cfg_degree(a), cs[i].C);
        cr_assert_eq(cpc_artifact_tp_degree(a), cs[i].T);
        int64_t B, H, Hkv;
        cpc_artifact_shape(a, &B, NULL, NULL, &H, &Hkv, NULL);
        cr_assert(B == cs[i].B && H == 8 && Hkv == cs[i].Hkv, "global shape %lld %lld %lld", (long long)B,
                  (long long)H, (long long)Hkv);
        cpc_rank_slice sl;
        cr_assert_null(cpc_artifact_rank_slice(a, cs[i].P - 1, &sl)); /* the last rank: c = C-1, t = T-1 */
        cr_assert(sl.c == cs[i].C - 1 && sl.t == cs[i].T - 1 && sl.head_start == 8 - 8 / cs[i].T);
        cpc_status *bad = cpc_artifact_rank_slice(a, cs[i].P, &sl);
        cr_assert_not_null(bad);
        cpc_status_free(bad);
        problem pb;
        make_problem(&pb, cs[i].B, 64, 8, cs[i].Hkv, 16, cs[i].causal);
        int G = cs[i].C * cs[i].T, P = cs[i].P;
        cpc_local_world **w = calloc((size_t)G, sizeof *w);
        for (int g = 0; g < G; g++)
            cr_assert_null(cpc_local_world_new(a, &w[g]));
        axes_job *jobs = calloc((size_t)P, sizeof *jobs);
        pthread_t *th = calloc((size_t)P, sizeof *th);
        for (int p = 0; p < P; p++) {
            cr_assert_null(cpc_artifact_rank_slice(a, p, &sl));
            jobs[p] = (axes_job){.a = a, .w = w[sl.group], .rank = p, .pb = &pb};
            pthread_create(&th[p], NULL, axes_thread, &jobs[p]);
        }
        double num = 0, den = 0;
        for (int p = 0; p < P; p++) {
            pthread_join(th[p], NULL);
            cr_assert_eq(jobs[p].err[0], 0, "rank %d: %s", p, jobs[p].err);
            num += jobs[p].num, den += jobs[p].den;
        }
        /* every rank's rows together are the whole output, once */
        double all = 0;
        for (size_t e = 0; e < (size_t)cs[i].B * 64 * 8 * 16; e++)
            all += pb.ref[e] * pb.ref[e];
        cr_expect_lt(fabs(den - all), 1e-9 * all, "rows covered %g of %g", den, all);
        cr_expect_lt(sqrt(num / den), 1e-5, "case %zu: rel err %g", i, sqrt(num / den));
        for (int g = 0; g < G; g++)
            cpc_local_world_free(w[g]);
        free(w), free(jobs), free(th);
        free_problem(&pb);
        cpc_artifact_free(a);
    }
}

/* ---- training: cpc_rank_backward (SPEC section 10) ---------------------------------
 * The float64 reference gradients are cpc_reference_attention_bwd's (the same one
 * cprun --check uses; itself checked against finite differences in
 * tests/test_backend_bwd.c) on the same rounded inputs. */
#include "dtype.h"
#include "reference.h"

static const char *TRAIN_FMT =
    "version: 1\n"
    "name: api-train\n"
    "model: {heads: %d, kv_heads: %d, head_dim: %d, dtype: %s}\n"
    "input: {batch: %d, tokens: %d, mask: %s, mode: training}\n"
    "cluster: {world_size: %d, device: cpu}\n"
    "parallel: {variant: %s}\n";

typedef struct train_problem {
    int B, S, H, Hkv, D;
    cpc_dtype dt;
    size_t es;
    void *q, *k, *v, *dout;   /* global BSHD in the plan dtype */
    uint8_t *mask;            /* [B, S] or NULL */
    double *dq, *dk, *dv;     /* reference gradients */
} train_problem;

static void make_train_problem(train_problem *pb, cpc_dtype dt, int B, int S, int H, int Hkv, int D,
                               const char *mask)
{
    memset(pb, 0, sizeof *pb);
    pb->B = B, pb->S = S, pb->H = H, pb->Hkv = Hkv, pb->D = D, pb->dt = dt;
    pb->es = dt == CPC_DTYPE_FP32 ? 4 : 2;
    size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * Hkv * D;
    float *f = malloc((nq > nk ? nq : nk) * sizeof *f);
    void **t[4] = {&pb->q, &pb->k, &pb->v, &pb->dout};
    size_t n[4] = {nq, nk, nk, nq};
    for (int i = 0; i < 4; i++) {
        for (size_t e = 0; e < n[i]; e++)
            f[e] = (float)nrand();
        *t[i] = malloc(n[i] * pb->es);
        cpc_from_f32_n(*t[i], dt, f, n[i]);
    }
    free(f);
    if (strcmp(mask, "key_padding") == 0) {
        pb->mask = malloc((size_t)B * S);
        for (int i = 0; i < B * S; i++)
            pb->mask[i] = urand() < 0.8;
    }
    pb->dq = malloc(nq * sizeof(double));
    pb->dk = malloc(nk * sizeof(double));
    pb->dv = malloc(nk * sizeof(double));
    cpc_ref_problem rp = {.B = B, .S = S, .Skv = S, .H = H, .Hkv = Hkv, .D = D, .dtype = dt,
                          .q = pb->q, .k = pb->k, .v = pb->v, .scale = (double)(float)(1.0 / sqrt((double)D)),
                          .causal = strcmp(mask, "causal") == 0, .kv_mask = pb->mask};
    cpc_status *st = cpc_reference_attention_bwd(&rp, pb->dout, pb->dq, pb->dk, pb->dv);
    cr_assert_null(st, "reference: %s", st ? st->message : "");
}

static void free_train_problem(train_problem *pb)
{
    free(pb->q), free(pb->k), free(pb->v), free(pb->dout), free(pb->mask);
    free(pb->dq), free(pb->dk), free(pb->dv);
}

/* The rank's shard (token runs) of a global [B, S, h, D] array of es-byte elements. */
static void *shard_bytes(const cpc_artifact *a, int rank, const void *g, int B, int S, int h, int D,
                         size_t es, int64_t *T)
{
    cpc_token_run runs[64];
    int n = 0;
    cr_assert_null(cpc_artifact_shard_runs(a, rank, runs, 64, &n));
    int64_t t = 0;
    for (int i = 0; i < n; i++)
        t += runs[i].len;
    size_t row = (size_t)h * D * es;
    char *s = malloc((size_t)B * t * row + 1);
    for (int b = 0; b < B; b++) {
        int64_t o = 0;
        for (int i = 0; i < n; i++) {
            memcpy(s + ((size_t)b * t + o) * row, (const char *)g + ((size_t)b * S + runs[i].start) * row,
                   (size_t)runs[i].len * row);
            o += runs[i].len;
        }
    }
    *T = t;
    return s;
}

typedef struct train_job {
    const cpc_artifact *a;
    cpc_local_world *w;
    int rank;
    const train_problem *pb;
    bool grads_in_plan_dtype; /* dq/dk/dv in the plan dtype (dq strided), else fp32 */
    int iters;
    double num[3], den[3];    /* squared error and reference norms of dq, dk, dv */
    long allocs_after_first;
    char err[512];
} train_job;

static void *train_thread(void *arg)
{
    train_job *j = arg;
    const train_problem *pb = j->pb;
    cpc_rank *r = NULL;
    cpc_status *st = cpc_rank_new_local(j->a, j->w, j->rank, NULL, &r);
    if (st) {
        snprintf(j->err, sizeof j->err, "create: %s", cpc_status_message(st));
        cpc_status_free(st);
        return NULL;
    }
    int64_t T = 0;
    size_t es = pb->es;
    void *q = shard_bytes(j->a, j->rank, pb->q, pb->B, pb->S, pb->H, pb->D, es, &T);
    void *k = shard_bytes(j->a, j->rank, pb->k, pb->B, pb->S, pb->Hkv, pb->D, es, &T);
    void *v = shard_bytes(j->a, j->rank, pb->v, pb->B, pb->S, pb->Hkv, pb->D, es, &T);
    void *dout = shard_bytes(j->a, j->rank, pb->dout, pb->B, pb->S, pb->H, pb->D, es, &T);
    size_t nq = (size_t)pb->B * T * pb->H * pb->D, nk = (size_t)pb->B * T * pb->Hkv * pb->D;
    void *out = malloc(nq * es);
    float *lse = malloc(2 * (size_t)pb->B * pb->H * T * sizeof *lse);
    size_t ges = j->grads_in_plan_dtype ? es : 4;
    void *dqf = malloc(2 * nq * ges), *dk = malloc(nk * ges), *dv = malloc(nk * ges);
    cpc_dtype gdt = j->grads_in_plan_dtype ? pb->dt : CPC_DTYPE_FP32;
    cpc_tensor tq = {q, pb->dt, 4, {pb->B, T, pb->H, pb->D}, {0}}, tk = {k, pb->dt, 4, {pb->B, T, pb->Hkv, pb->D}, {0}},
               tv = {v, pb->dt, 4, {pb->B, T, pb->Hkv, pb->D}, {0}}, to = {out, pb->dt, 4, {pb->B, T, pb->H, pb->D}, {0}},
               tdo = {dout, pb->dt, 4, {pb->B, T, pb->H, pb->D}, {0}},
               tl = {lse, CPC_DTYPE_FP32, 3, {pb->B, pb->H, T}, {0}},
               tdq = {dqf, gdt, 4, {pb->B, T, pb->H, pb->D}, {0}}, tdk = {dk, gdt, 4, {pb->B, T, pb->Hkv, pb->D}, {0}},
               tdv = {dv, gdt, 4, {pb->B, T, pb->Hkv, pb->D}, {0}};
    if (j->grads_in_plan_dtype) { /* dq interleaved in a [B, T, 2, H, D] buffer (a fused QKV grad) */
        int64_t s4[4] = {T * 2 * pb->H * pb->D, 2 * pb->H * pb->D, pb->D, 1};
        memcpy(tdq.strides, s4, sizeof s4);
        /* and the LSE (fp32 in any plan dtype) every other float: written
         * strided by the forward, gathered into staging by the backward */
        int64_t s3[3] = {2 * pb->H * T, 2 * T, 2};
        memcpy(tl.strides, s3, sizeof s3);
    }
    cpc_tensor tm = {pb->mask, CPC_DTYPE_U8, 2, {pb->B, pb->S}, {0}};
    const cpc_tensor *m = pb->mask ? &tm : NULL;
    /* Ulysses/unified keep the LSE in the head layout: saved (cpc_rank_saved_lse) */
    bool uly = cpc_artifact_ulysses_degree(j->a) > 1;
    int64_t ns = cpc_rank_saved_lse_elements(r);
    float *saved = malloc((size_t)ns * sizeof *saved + 4);
    cpc_tensor tsv = {saved, CPC_DTYPE_FP32, 1, {ns}, {0}};
    long before = 0;
    for (int it = 0; it < j->iters; it++) {
        if (it == 1)
            before = n_allocs;
        if ((st = cpc_rank_forward(r, &tq, &tk, &tv, m, &to, uly ? NULL : &tl)) ||
            (uly && (st = cpc_rank_saved_lse(r, saved, ns))) ||
            (st = cpc_rank_backward(r, &tq, &tk, &tv, m, &to, uly ? &tsv : &tl, &tdo, &tdq, &tdk, &tdv))) {
            snprintf(j->err, sizeof j->err, "iteration %d: %s", it, cpc_status_message(st));
            cpc_status_free(st);
            goto done;
        }
    }
    j->allocs_after_first = n_allocs - before;
    {
        cpc_token_run runs[64];
        int n = 0;
        cpc_status_free(cpc_artifact_shard_runs(j->a, j->rank, runs, 64, &n));
        const void *got[3] = {dqf, dk, dv};
        const double *ref[3] = {pb->dq, pb->dk, pb->dv};
        int h[3] = {pb->H, pb->Hkv, pb->Hkv};
        for (int g = 0; g < 3; g++) {
            int64_t row = (int64_t)h[g] * pb->D;
            int64_t rs = g == 0 && j->grads_in_plan_dtype ? 2 * row : row; /* dq's row stride */
            for (int b = 0; b < pb->B; b++) {
                int64_t o = 0;
                for (int i = 0; i < n; i++)
                    for (int64_t t = 0; t < runs[i].len; t++, o++)
                        for (int64_t e = 0; e < row; e++) {
                            double x = cpc_dtype_get_f64(got[g], gdt, (size_t)(((int64_t)b * T + o) * rs + e));
                            double rf = ref[g][((size_t)b * pb->S + runs[i].start + t) * row + e];
                            j->num[g] += isfinite(x) ? (x - rf) * (x - rf) : INFINITY;
                            j->den[g] += rf * rf;
                        }
            }
        }
    }
done:
    cpc_rank_free(r);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dqf), free(dk), free(dv), free(saved);
    return NULL;
}

/* Every rank of `a` trains on pb in threads; rel[3]: dq, dk, dv relative errors
 * ||got - ref|| / ||ref|| over the whole gathered gradient. */
static void train_world(const cpc_artifact *a, const train_problem *pb, bool plan_dtype_grads, int iters,
                        double rel[3], long *allocs)
{
    int P = cpc_artifact_world_size(a);
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_new(a, &w));
    train_job *jobs = calloc((size_t)P, sizeof *jobs);
    pthread_t *th = calloc((size_t)P, sizeof *th);
    for (int p = 0; p < P; p++) {
        jobs[p] = (train_job){.a = a, .w = w, .rank = p, .pb = pb, .grads_in_plan_dtype = plan_dtype_grads,
                              .iters = iters};
        pthread_create(&th[p], NULL, train_thread, &jobs[p]);
    }
    double num[3] = {0}, den[3] = {0};
    long al = 0;
    for (int p = 0; p < P; p++) {
        pthread_join(th[p], NULL);
        cr_assert_eq(jobs[p].err[0], 0, "rank %d: %s", p, jobs[p].err);
        for (int g = 0; g < 3; g++)
            num[g] += jobs[p].num[g], den[g] += jobs[p].den[g];
        al += jobs[p].allocs_after_first;
    }
    for (int g = 0; g < 3; g++)
        rel[g] = sqrt(num[g] / den[g]);
    if (allocs)
        *allocs = al;
    cpc_local_world_free(w);
    free(jobs);
    free(th);
}

static cpc_artifact *train_plan(int H, int Hkv, int D, const char *dtype, int B, int S, const char *mask,
                                int P, const char *variant)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml, TRAIN_FMT, H, Hkv, D, dtype, B, S, mask, P, variant);
    cpc_artifact *a = compile_ok(yaml, NULL, 0);
    cr_assert(cpc_artifact_trains(a), "a training plan's artifact without a backward program");
    return a;
}

Test(api, backward_matches_float64_on_thread_ranks)
{
    struct { const char *variant; int P; const char *dtype; const char *mask; int H, Hkv; bool plan_dt; } cs[] = {
        {"none", 1, "fp32", "none", 4, 4, false},
        {"none", 1, "fp32", "causal", 4, 2, true},
        {"ring", 2, "fp32", "none", 4, 2, false},
        {"ring", 2, "fp32", "key_padding", 4, 4, true},
        {"ring", 4, "fp32", "causal", 4, 2, false},
        {"ring", 4, "fp32", "causal", 6, 2, true},
        {"ring", 4, "bf16", "causal", 4, 1, false},
        {"ring", 4, "bf16", "none", 4, 2, true},
        {"ulysses", 4, "fp32", "causal", 8, 2, false},   /* K/V heads split */
        {"ulysses", 4, "bf16", "none", 4, 1, true},      /* MQA: the K/V head shared */
        {"unified", 4, "fp32", "causal", 4, 2, false},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        cpc_dtype dt = strcmp(cs[i].dtype, "bf16") == 0 ? CPC_DTYPE_BF16 : CPC_DTYPE_FP32;
        cpc_artifact *a = train_plan(cs[i].H, cs[i].Hkv, 16, cs[i].dtype, 2, 64, cs[i].mask, cs[i].P,
                                     cs[i].variant);
        train_problem pb;
        make_train_problem(&pb, dt, 2, 64, cs[i].H, cs[i].Hkv, 16, cs[i].mask);
        double rel[3];
        train_world(a, &pb, cs[i].plan_dt, 2, rel, NULL);
        /* fp32 accumulators: ~4e-7; rounded to bf16 output ~3e-3; bf16 plans also carry
         * the delta of the bf16 `out` (~1e-3, docs/BACKWARD.md 1.1) */
        double tol = dt == CPC_DTYPE_BF16 ? 2e-2 : 1e-5;
        for (int g = 0; g < 3; g++) {
            cr_expect_lt(rel[g], tol, "%s P=%d %s %s GQA %d/%d %s: d%c rel err %g", cs[i].variant, cs[i].P,
                         cs[i].dtype, cs[i].mask, cs[i].H, cs[i].Hkv, cs[i].plan_dt ? "plan-dtype grads" : "fp32",
                         "qkv"[g], rel[g]);
            cr_expect_gt(rel[g], 0.0); /* computed, not copied */
        }
        fprintf(stderr, "api backward %s P=%d %s %s %d/%d %s: dq %.2e dk %.2e dv %.2e\n", cs[i].variant,
                cs[i].P, cs[i].dtype, cs[i].mask, cs[i].H, cs[i].Hkv, cs[i].plan_dt ? "plan dtype" : "fp32",
                rel[0], rel[1], rel[2]);
        free_train_problem(&pb);
        cpc_artifact_free(a);
    }
}

/* Replicated segments (SPEC section 10): every rank gives the same dout for
 * the replicated text and gets, for its own tokens, its shard's gradients and
 * the whole (world-summed) gradients of the text; every rank's copy is
 * compared with the float64 reference (train_thread: the rank's own runs). */
Test(api, backward_with_a_replicated_text_matches_float64)
{
    struct { const char *variant; int P, text, image, H, Hkv; const char *dtype, *mask, *degrees; bool plan_dt; } cs[] = {
        {"ring", 2, 7, 24, 4, 2, "fp32", "none", "", false},
        {"ring_anything", 3, 5, 25, 4, 4, "fp32", "none", "", true},
        {"ulysses", 2, 7, 24, 4, 2, "fp32", "none", "", false},
        {"ulysses_anything", 3, 6, 25, 6, 6, "fp32", "key_padding", "", true},
        {"unified", 4, 9, 24, 4, 4, "fp32", "none", ", ring_degree: 2, ulysses_degree: 2", false},
        {"unified", 4, 9, 24, 4, 2, "bf16", "none", ", ring_degree: 2, ulysses_degree: 2", true},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml,
                 "version: 1\nmodel: {heads: %d, kv_heads: %d, head_dim: 16, dtype: %s}\n"
                 "input:\n  batch: 2\n  mode: training\n  mask: %s\n  segments:\n"
                 "    - {name: text, tokens: %d, split: replicate}\n"
                 "    - {name: image, tokens: %d}\n"
                 "cluster: {world_size: %d, device: cpu}\nparallel: {variant: %s%s}\n",
                 cs[i].H, cs[i].Hkv, cs[i].dtype, cs[i].mask, cs[i].text, cs[i].image, cs[i].P, cs[i].variant,
                 cs[i].degrees);
        cpc_artifact *a = compile_ok(yaml, NULL, 0);
        cr_assert(cpc_artifact_trains(a));
        cpc_dtype dt = strcmp(cs[i].dtype, "bf16") == 0 ? CPC_DTYPE_BF16 : CPC_DTYPE_FP32;
        train_problem pb;
        make_train_problem(&pb, dt, 2, cs[i].text + cs[i].image, cs[i].H, cs[i].Hkv, 16, cs[i].mask);
        double rel[3];
        long allocs = -1;
        if (CAN_COUNT)
            atomic_store(&counting, 1);
        train_world(a, &pb, cs[i].plan_dt, 2, rel, &allocs);
        atomic_store(&counting, 0);
        double tol = dt == CPC_DTYPE_BF16 ? 2e-2 : 1e-5;
        for (int g = 0; g < 3; g++) {
            cr_expect_lt(rel[g], tol, "%s %s: d%c rel err %g", cs[i].variant, cs[i].dtype, "qkv"[g], rel[g]);
            cr_expect_gt(rel[g], 0.0);
        }
        if (CAN_COUNT)
            cr_expect_eq(allocs, 0, "%s: %ld allocations after the first step", cs[i].variant, allocs);
        fprintf(stderr, "api backward replicated text %s P=%d %s: dq %.2e dk %.2e dv %.2e\n", cs[i].variant,
                cs[i].P, cs[i].dtype, rel[0], rel[1], rel[2]);
        free_train_problem(&pb);
        cpc_artifact_free(a);
    }
}

Test(api, no_allocation_after_the_first_backward)
{
    if (!CAN_COUNT)
        cr_skip_test("allocation counting needs the libc allocator (not under ASan)");
    cpc_artifact *a = train_plan(4, 2, 16, "bf16", 1, 64, "causal", 4, "ring");
    train_problem pb;
    make_train_problem(&pb, CPC_DTYPE_BF16, 1, 64, 4, 2, 16, "causal");
    atomic_store(&counting, 1);
    long allocs = -1;
    double rel[3];
    train_world(a, &pb, true, 3, rel, &allocs);
    atomic_store(&counting, 0);
    cr_expect_lt(rel[0], 2e-2);
    cr_expect_eq(allocs, 0, "%ld allocations in forward+backward 2..3 (all ranks)", allocs);
    free_train_problem(&pb);
    cpc_artifact_free(a);
}

Test(api, backward_refusals_leave_outputs_untouched)
{
    /* a forward-only artifact */
    cpc_artifact *inf = plan_for(4, 4, 16, 1, 8, 8, "none", 1, "none", NULL, 0);
    cr_assert(!cpc_artifact_trains(inf));
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_new(inf, &w));
    cpc_rank *r = NULL;
    cr_assert_null(cpc_rank_new_local(inf, w, 0, NULL, &r));
    float buf[4 * 16 * 16];
    cpc_tensor t = tensor4(buf, 1, 16, 4, 16);
    cpc_tensor tl = {.data = buf, .dtype = CPC_DTYPE_FP32, .ndim = 3, .shape = {1, 4, 16}};
    cpc_status *st = cpc_rank_backward(r, &t, &t, &t, NULL, &t, &tl, &t, &t, &t, &t);
    cr_assert_eq(cpc_status_code(st), CPC_E_UNSUPPORTED);
    cr_expect(strstr(cpc_status_message(st), "input.mode: training"), "%s", cpc_status_message(st));
    cpc_status_free(st);
    cpc_rank_free(r);
    cpc_local_world_free(w);
    cpc_artifact_free(inf);

    /* a training artifact, one rank: bad arguments are refused before anything is written */
    cpc_artifact *a = train_plan(4, 2, 16, "fp32", 1, 32, "none", 1, "none");
    train_problem pb;
    make_train_problem(&pb, CPC_DTYPE_FP32, 1, 32, 4, 2, 16, "none");
    cr_assert_null(cpc_local_world_new(a, &w));
    cr_assert_null(cpc_rank_new_local(a, w, 0, NULL, &r));
    size_t nq = 32 * 4 * 16, nk = 32 * 2 * 16;
    float *out = malloc(nq * 4), *lse = malloc(4 * 32 * 4);
    float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    cpc_tensor q = tensor4(pb.q, 1, 32, 4, 16), k = tensor4(pb.k, 1, 32, 2, 16), v = tensor4(pb.v, 1, 32, 2, 16),
               o = tensor4(out, 1, 32, 4, 16), d = tensor4(pb.dout, 1, 32, 4, 16), gq = tensor4(dq, 1, 32, 4, 16),
               gk = tensor4(dk, 1, 32, 2, 16), gv = tensor4(dv, 1, 32, 2, 16);
    cpc_tensor l = {.data = lse, .dtype = CPC_DTYPE_FP32, .ndim = 3, .shape = {1, 4, 32}};
    cr_assert_null(cpc_rank_forward(r, &q, &k, &v, NULL, &o, &l));
    for (size_t i = 0; i < nq; i++)
        dq[i] = 7.0f;
    for (size_t i = 0; i < nk; i++)
        dk[i] = dv[i] = 7.0f;
    cpc_tensor bad_shape = tensor4(dq, 1, 32, 2, 16);           /* dq with Hkv heads */
    cpc_tensor bad_dtype = gk;
    bad_dtype.dtype = CPC_DTYPE_FP16;                           /* neither fp32 nor the plan's */
    cpc_tensor bad_dout = tensor4(pb.dout, 1, 31, 4, 16);
    cpc_tensor bad_lse = l;
    bad_lse.shape[2] = 31;
    cpc_tensor overlap = gv;                                    /* an output whose elements overlap */
    int64_t s4[4] = {32 * 2 * 16, 16, 1, 1};
    memcpy(overlap.strides, s4, sizeof s4);
    cpc_tensor nul = gq;
    nul.data = NULL;
    float saved_small[4];
    cpc_tensor bad_saved = {.data = saved_small, .dtype = CPC_DTYPE_FP32, .ndim = 1, .shape = {4}};
    const cpc_tensor *args[][6] = {
        {&o, &l, &d, &bad_shape, &gk, &gv}, {&o, &l, &d, &gq, &bad_dtype, &gv}, {&o, &l, &bad_dout, &gq, &gk, &gv},
        {&o, &bad_lse, &d, &gq, &gk, &gv},  {&o, &bad_saved, &d, &gq, &gk, &gv}, {&o, &l, &d, &gq, &gk, &overlap},
        {&o, &l, &d, &nul, &gk, &gv},       {&o, &l, NULL, &gq, &gk, &gv},
    };
    for (size_t c = 0; c < sizeof args / sizeof *args; c++) {
        st = cpc_rank_backward(r, &q, &k, &v, NULL, args[c][0], args[c][1], args[c][2], args[c][3], args[c][4],
                               args[c][5]);
        cr_assert_eq(cpc_status_code(st), CPC_E_USAGE, "case %zu: %s", c, cpc_status_message(st));
        cpc_status_free(st);
    }
    /* a mask for a plan without key padding */
    uint8_t mk[32];
    cpc_tensor tm = {mk, CPC_DTYPE_U8, 2, {1, 32}, {0}};
    st = cpc_rank_backward(r, &q, &k, &v, &tm, &o, &l, &d, &gq, &gk, &gv);
    cr_assert_eq(cpc_status_code(st), CPC_E_USAGE);
    cpc_status_free(st);
    for (size_t i = 0; i < nq; i++)
        cr_assert_eq(dq[i], 7.0f, "dq written by a refused call");
    for (size_t i = 0; i < nk; i++)
        cr_assert(dk[i] == 7.0f && dv[i] == 7.0f, "dk/dv written by a refused call");
    /* the rank still works: a correct backward afterwards */
    cr_assert_null(cpc_rank_backward(r, &q, &k, &v, NULL, &o, &l, &d, &gq, &gk, &gv));
    double num = 0, den = 0;
    for (size_t i = 0; i < nq; i++)
        num += (dq[i] - pb.dq[i]) * (dq[i] - pb.dq[i]), den += pb.dq[i] * pb.dq[i];
    for (size_t i = 0; i < nk; i++)
        num += (dk[i] - pb.dk[i]) * (dk[i] - pb.dk[i]) + (dv[i] - pb.dv[i]) * (dv[i] - pb.dv[i]),
            den += pb.dk[i] * pb.dk[i] + pb.dv[i] * pb.dv[i];
    cr_expect_lt(sqrt(num / den), 1e-5);
    /* the same gradients from the saved LSE (1-D) and from lse NULL (the last forward's) */
    int64_t ns = cpc_rank_saved_lse_elements(r);
    cr_assert_eq(ns, 4 * 32);
    float *saved = malloc((size_t)ns * sizeof *saved), *dq2 = malloc(nq * 4);
    cr_assert_null(cpc_rank_saved_lse(r, saved, ns));
    cpc_tensor ts = {.data = saved, .dtype = CPC_DTYPE_FP32, .ndim = 1, .shape = {ns}};
    cpc_tensor gq2 = tensor4(dq2, 1, 32, 4, 16);
    cr_assert_null(cpc_rank_backward(r, &q, &k, &v, NULL, &o, &ts, &d, &gq2, &gk, &gv));
    cr_expect(memcmp(dq, dq2, nq * 4) == 0, "saved LSE: other dq");
    memset(dq2, 0, nq * 4);
    cr_assert_null(cpc_rank_backward(r, &q, &k, &v, NULL, &o, NULL, &d, &gq2, &gk, &gv));
    cr_expect(memcmp(dq, dq2, nq * 4) == 0, "lse NULL: other dq");
    /* and from a strided [B, H, T] LSE (every other float of a buffer twice
     * its size): gathered into the rank's staging first */
    float *wide = calloc(2 * 4 * 32, sizeof *wide);
    for (int i = 0; i < 4 * 32; i++)
        wide[2 * i] = lse[i];
    cpc_tensor lw = {.data = wide, .dtype = CPC_DTYPE_FP32, .ndim = 3, .shape = {1, 4, 32},
                     .strides = {2 * 4 * 32, 2 * 32, 2}};
    memset(dq2, 0, nq * 4);
    cr_assert_null(cpc_rank_backward(r, &q, &k, &v, NULL, &o, &lw, &d, &gq2, &gk, &gv));
    cr_expect(memcmp(dq, dq2, nq * 4) == 0, "strided lse: other dq");
    free(wide);
    free(saved), free(dq2);
    free(out), free(lse), free(dq), free(dk), free(dv);
    free_train_problem(&pb);
    cpc_rank_free(r);
    cpc_local_world_free(w);
    cpc_artifact_free(a);
}

/* ---- robustness: NULL handles, out-of-range enums, overflowing sizes (issue 22) ---- */

static void expect_usage(cpc_status *st, const char *what)
{
    cr_expect_eq(cpc_status_code(st), CPC_E_USAGE, "%s: code %d (%s)", what, (int)cpc_status_code(st),
                 cpc_status_message(st) ? cpc_status_message(st) : "OK");
    cpc_status_free(st);
}

Test(api, null_handles_and_bad_enums_are_usage_errors_not_crashes)
{
    /* status.h */
    char *s = cpc_status_format(NULL, NULL);
    cr_assert_not_null(s);
    cr_expect_str_eq(s, "cpc: ok");
    free(s);
    cpc_status_print(NULL, stderr, NULL);
    cr_expect_eq(cpc_status_exit_code(NULL), 0);
    cr_expect_str_eq(cpc_code_name((cpc_code)77), "?");
    /* compiler.h: a NULL artifact */
    cr_expect_null(cpc_artifact_variant(NULL));
    cr_expect_eq(cpc_artifact_world_size(NULL), 0);
    cr_expect_eq(cpc_artifact_ring_degree(NULL), 0);
    cr_expect_eq(cpc_artifact_ulysses_degree(NULL), 0);
    cr_expect_eq(cpc_artifact_cfg_degree(NULL), 0);
    cr_expect_eq(cpc_artifact_tp_degree(NULL), 0);
    cr_expect_eq(cpc_artifact_dtype(NULL), CPC_DTYPE__COUNT);
    cr_expect(!cpc_artifact_causal(NULL) && !cpc_artifact_key_padding(NULL) &&
              !cpc_artifact_cross_attention(NULL) && !cpc_artifact_trains(NULL));
    int64_t sh[6] = {9, 9, 9, 9, 9, 9};
    cpc_artifact_shape(NULL, &sh[0], &sh[1], &sh[2], &sh[3], &sh[4], &sh[5]);
    for (int i = 0; i < 6; i++)
        cr_expect_eq(sh[i], 0);
    double val = 0;
    cr_expect(!cpc_artifact_get_prediction(NULL, "ms_per_layer", &val));
    cpc_rank_slice sl;
    int nd = 0, nr = 0;
    int64_t shape[4];
    cpc_token_run runs[4];
    expect_usage(cpc_artifact_rank_slice(NULL, 0, &sl), "rank_slice");
    expect_usage(cpc_artifact_shard_shape(NULL, 0, CPC_TENSOR_Q, &nd, shape), "shard_shape");
    expect_usage(cpc_artifact_shard_runs(NULL, 0, runs, 4, &nr), "shard_runs");
    expect_usage(cpc_artifact_write(NULL, "/tmp/never.cplan"), "artifact_write");
    expect_usage(cpc_artifact_load(NULL, NULL), "artifact_load");
    cpc_artifact_free(NULL);
    /* rank.h: NULL ranks and worlds */
    cr_expect_eq(cpc_rank_index(NULL), -1);
    cr_expect_eq(cpc_rank_world_size(NULL), 0);
    cr_expect_eq(cpc_rank_allocated_bytes(NULL), 0);
    cr_expect_eq(cpc_rank_saved_lse_elements(NULL), 0);
    expect_usage(cpc_rank_forward(NULL, NULL, NULL, NULL, NULL, NULL, NULL), "forward");
    expect_usage(cpc_rank_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                 "backward");
    expect_usage(cpc_rank_saved_lse(NULL, NULL, 0), "saved_lse");
    expect_usage(cpc_rank_abort(NULL, "x"), "abort");
    cpc_rank_free(NULL);
    cpc_local_world_free(NULL);
    cpc_rank_options_init(NULL, sizeof(cpc_rank_options));
    cpc_local_world *w = NULL;
    cpc_rank *r = NULL;
    expect_usage(cpc_local_world_new(NULL, &w), "world_new");
    expect_usage(cpc_rank_new_local(NULL, NULL, 0, NULL, &r), "create_local");
    cr_expect_null(r);
    expect_usage(cpc_rank_new_mpi(NULL, NULL, NULL, &r), "create_mpi");
    expect_usage(cpc_rank_new_nccl(NULL, NULL, NULL, NULL, &r), "create_nccl");
    unsigned char id[CPC_NCCL_UNIQUE_ID_BYTES] = {0};
    expect_usage(cpc_rank_new_nccl_id(NULL, id, sizeof id, 0, NULL, &r), "create_nccl_id artifact");
    expect_usage(cpc_nccl_unique_id(NULL, sizeof id), "nccl_unique_id NULL");
    /* out-of-range enums and options on a real artifact */
    cpc_artifact *a = plan_for(4, 4, 16, 1, 8, 8, "none", 1, "none", NULL, 0);
    expect_usage(cpc_artifact_shard_shape(a, 0, (cpc_tensor_role)77, &nd, shape), "role 77");
    expect_usage(cpc_artifact_shard_shape(a, 0, (cpc_tensor_role)-1, &nd, shape), "role -1");
    expect_usage(cpc_artifact_shard_shape(a, 0, CPC_TENSOR_Q, NULL, shape), "ndim NULL");
    expect_usage(cpc_artifact_shard_runs(a, 0, runs, -1, &nr), "max -1");
    expect_usage(cpc_artifact_rank_slice(a, 0, NULL), "slice out NULL");
    cr_assert_null(cpc_local_world_new(a, &w));
    cpc_rank_options o;
    cpc_rank_options_init(&o, sizeof o);
    o.backend = (cpc_backend_kind)77;
    cpc_status *st = cpc_rank_new_local(a, w, 0, &o, &r);
    cr_expect_eq(cpc_status_code(st), CPC_E_USAGE);
    cr_expect(st && strstr(cpc_status_message(st), "77"), "%s", cpc_status_message(st));
    cpc_status_free(st);
    cr_expect_null(r);
    /* the CUDA backend on an artifact without kernels (or a libcpc without CUDA) */
    cpc_rank_options_init(&o, sizeof o);
    o.backend = CPC_BACKEND_CUDA;
    st = cpc_rank_new_local(a, w, 0, &o, &r);
    cr_expect_eq(cpc_status_code(st), CPC_E_UNSUPPORTED, "%s", cpc_status_message(st));
    cr_expect(st && (strstr(cpc_status_message(st), "kernels") || strstr(cpc_status_message(st), "CUDA")),
              "%s", cpc_status_message(st));
    cpc_status_free(st);
    cr_expect_null(r);
    cpc_rank_options_init(&o, sizeof o);
    o.device = -7;
    expect_usage(cpc_rank_new_local(a, w, 0, &o, &r), "device -7");
    cpc_rank_options_init(&o, sizeof o);
    o.timeout_s = NAN;
    expect_usage(cpc_rank_new_local(a, w, 0, &o, &r), "timeout NaN");
    expect_usage(cpc_rank_new_local(a, w, 0, NULL, NULL), "out NULL");
    /* session.h: a NULL job and report */
    cr_expect_null(cpc_job_variant(NULL));
    cr_expect_eq(cpc_job_ring_degree(NULL), 0);
    cr_expect_eq(cpc_job_ulysses_degree(NULL), 0);
    cr_expect_eq(cpc_job_world_size(NULL), 0);
    int64_t bytes = 5;
    expect_usage(cpc_job_peak_memory(NULL, &bytes), "peak_memory");
    expect_usage(cpc_job_dry_run(NULL, stderr, 1), "dry_run");
    cpc_run_report *rep = NULL;
    expect_usage(cpc_job_execute(NULL, NULL, &rep, NULL), "execute");
    expect_usage(cpc_job_check_outputs(NULL, NULL), "check_outputs");
    cpc_job_options jo;
    cpc_job_options_init(&jo, sizeof jo);
    jo.backend = (cpc_backend_kind)77;
    expect_usage(cpc_job_check_outputs(&jo, NULL), "job backend 77");
    expect_usage(cpc_calibrate_profile(true, 2, (cpc_transport_kind)77, NULL, NULL, NULL), "calibrate 77");
    cr_expect(!cpc_run_report_ok(NULL));
    cr_expect_null(cpc_run_report_failure(NULL));
    cpc_run_report_print_text(NULL, stderr);
    expect_usage(cpc_run_report_print_json(NULL, stderr), "print_json");
    cpc_run_report_free(NULL);
    cpc_job_free(NULL);
    cpc_local_world_free(w);
    cpc_artifact_free(a);
}

/* compiler.h THE SIZE MEMBER: every input options struct begins with its size,
 * set by its init function; libcpc refuses 0 or a size below the struct's
 * first version, reads a smaller (older) struct with defaults past it, and a
 * larger (newer) one only when its unknown tail is zero. */
Test(api, options_structs_begin_with_their_size)
{
    cpc_artifact *a = plan_for(4, 4, 16, 1, 8, 8, "none", 1, "none", NULL, 0);
    cr_assert_eq(cpc_artifact_world_size(a), 1);
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_new(a, &w));
    cpc_rank *r = NULL;
    cpc_rank_options o;
    /* init writes only `size` bytes (an older caller's struct) and sets size */
    memset(&o, 0xab, sizeof o);
    cpc_rank_options_init(&o, CPC_RANK_OPTIONS_SIZE_V1);
    cr_expect_eq(o.size, CPC_RANK_OPTIONS_SIZE_V1);
    cr_expect_eq(o.device, -1);
    const unsigned char *tail = (const unsigned char *)&o + CPC_RANK_OPTIONS_SIZE_V1;
    for (size_t i = 0; i < sizeof o - CPC_RANK_OPTIONS_SIZE_V1; i++)
        cr_expect_eq(tail[i], 0xab, "init wrote byte %zu past the caller's size", i);
    /* ... and the library reads no more: cuda_stream (past V1) is garbage
     * here, and would be refused on a CPU rank if it were read */
    o.backend = CPC_BACKEND_CPU;
    cr_expect_null(cpc_rank_new_local(a, w, 0, &o, &r), "an older, smaller struct is accepted");
    cr_expect_not_null(r);
    cpc_rank_free(r);
    r = NULL;
    cpc_rank_options_init(&o, sizeof o);
    o.backend = CPC_BACKEND_CPU;
    o.cuda_stream = (void *)0x1;
    expect_usage(cpc_rank_new_local(a, w, 0, &o, &r), "cuda_stream on a CPU rank");
    /* never initialised, too small */
    cpc_rank_options_init(&o, sizeof o);
    for (size_t bad = 0; bad < CPC_RANK_OPTIONS_SIZE_V1; bad += 4) {
        o.size = bad;
        cpc_status *st = cpc_rank_new_local(a, w, 0, &o, &r);
        cr_expect_eq(cpc_status_code(st), CPC_E_USAGE, "size %zu", bad);
        cr_expect(st && strstr(cpc_status_message(st), "cpc_rank_options.size"), "%s",
                  cpc_status_message(st));
        cpc_status_free(st);
        cr_expect_null(r);
    }
    /* a newer caller's larger struct: its unknown tail must be zero */
    struct { cpc_rank_options o; unsigned char more[24]; } big;
    memset(&big, 0, sizeof big);
    cpc_rank_options_init(&big.o, sizeof big);
    cr_expect_eq(big.o.size, sizeof big);
    cr_expect_null(cpc_rank_new_local(a, w, 0, &big.o, &r), "a zero tail is accepted");
    cpc_rank_free(r);
    r = NULL;
    big.more[5] = 1;
    expect_usage(cpc_rank_new_local(a, w, 0, &big.o, &r), "a set tail");
    cpc_local_world_free(w);
    /* the other input structs */
    cpc_compile_options co;
    cpc_compile_options_init(&co, sizeof co);
    cr_expect_eq(co.size, sizeof co);
    co.size = 0;
    cpc_artifact *b = NULL;
    expect_usage(cpc_compile_plan_string("version: 1\n", 0, NULL, &co, &b, NULL), "compile size 0");
    cr_expect_null(b);
    cpc_compilation *c = NULL;
    expect_usage(cpc_compilation_new("/nonexistent.yaml", &co, CPC_STAGE_VALIDATE, &c), "compilation size 0");
    cpc_job_options jo;
    cpc_job_options_init(&jo, sizeof jo);
    cr_expect_eq(jo.size, sizeof jo);
    cr_expect_eq(jo.iters, 5);
    jo.size = sizeof jo - 1;
    expect_usage(cpc_job_check_outputs(&jo, NULL), "job options one byte short");
    cpc_p2p_callbacks cb = {0};
    expect_usage(cpc_rank_new_callbacks(a, 0, &cb, NULL, &r), "callbacks size 0");
    cr_expect_null(r);
    cpc_artifact_free(a);
}

Test(api, overflowing_strides_and_sizes_are_refused)
{
    cpc_artifact *a = plan_for(4, 4, 16, 1, 8, 8, "none", 1, "none", NULL, 0);
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_new(a, &w));
    cpc_rank *r = NULL;
    cr_assert_null(cpc_rank_new_local(a, w, 0, NULL, &r));
    problem pb;
    make_problem(&pb, 1, 16, 4, 4, 16, false);
    float *out = malloc(16 * 4 * 16 * 4);
    cpc_tensor q = tensor4(pb.q, 1, 16, 4, 16), k = tensor4(pb.k, 1, 16, 4, 16),
               v = tensor4(pb.v, 1, 16, 4, 16), o = tensor4(out, 1, 16, 4, 16);
    const int64_t huge = (int64_t)1 << 62;
    /* an input stride of 2^62 elements: its extent overflows any address
     * (dimension 0 has one element: its stride is never used) */
    const int64_t contig[4] = {16 * 4 * 16, 4 * 16, 16, 1};
    memcpy(q.strides, contig, sizeof contig);
    memcpy(o.strides, contig, sizeof contig);
    for (int d = 1; d < 4; d++) {
        cpc_tensor bad = q;
        bad.strides[d] = huge;
        cpc_status *st = cpc_rank_forward(r, &bad, &k, &v, NULL, &o, NULL);
        cr_expect_eq(cpc_status_code(st), CPC_E_USAGE, "dim %d: %s", d, cpc_status_message(st));
        cr_expect(st && strstr(cpc_status_message(st), "overflow"), "%s", cpc_status_message(st));
        cpc_status_free(st);
        cpc_tensor bado = o;
        bado.strides[d] = huge;
        expect_usage(cpc_rank_forward(r, &q, &k, &v, NULL, &bado, NULL), "out stride 2^62");
    }
    /* strides whose sum overflows although each product fits */
    cpc_tensor sum = q;
    int64_t s4[4] = {huge / 4, huge / 8, huge / 64, 1};
    memcpy(sum.strides, s4, sizeof s4);
    expect_usage(cpc_rank_forward(r, &sum, &k, &v, NULL, &o, NULL), "stride sum");
    /* ndim and dtype out of range */
    cpc_tensor nd = q;
    nd.ndim = 77;
    expect_usage(cpc_rank_forward(r, &nd, &k, &v, NULL, &o, NULL), "ndim 77");
    nd.ndim = -1;
    expect_usage(cpc_rank_forward(r, &nd, &k, &v, NULL, &o, NULL), "ndim -1");
    cpc_tensor dt = q;
    dt.dtype = (cpc_dtype)77;
    expect_usage(cpc_rank_forward(r, &dt, &k, &v, NULL, &o, NULL), "dtype 77");
    /* still usable and right */
    cr_assert_null(cpc_rank_forward(r, &q, &k, &v, NULL, &o, NULL));
    double num = 0, den = 0;
    for (int i = 0; i < 16 * 4 * 16; i++)
        num += (out[i] - pb.ref[i]) * (out[i] - pb.ref[i]), den += pb.ref[i] * pb.ref[i];
    cr_expect_lt(sqrt(num / den), 1e-5);
    free(out);
    free_problem(&pb);
    cpc_rank_free(r);
    cpc_local_world_free(w);
    cpc_artifact_free(a);
}

/* Two artifacts of the same world size (2) but other shapes: a rank of one in
 * the other's world is refused, naming both (it computed garbage with OK). */
Test(api, a_rank_from_another_artifact_is_refused_by_the_world)
{
    cpc_artifact *a = plan_for(4, 4, 16, 1, 8, 8, "none", 2, "ring", NULL, 0);
    cpc_artifact *b = plan_for(2, 2, 16, 1, 8, 24, "none", 2, "ulysses", NULL, 0);
    cr_assert_eq(cpc_artifact_world_size(a), cpc_artifact_world_size(b));
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_new(a, &w));
    cpc_rank *r = NULL;
    cpc_status *st = cpc_rank_new_local(b, w, 1, NULL, &r);
    cr_expect_eq(cpc_status_code(st), CPC_E_USAGE);
    const char *m = cpc_status_message(st);
    cr_expect(m && strstr(m, "ring") && strstr(m, "ulysses"), "%s", m);
    cpc_status_free(st);
    cr_expect_null(r);
    /* the world's own artifact, and an identical copy of it (same plan), are accepted */
    cpc_artifact *a2 = plan_for(4, 4, 16, 1, 8, 8, "none", 2, "ring", NULL, 0);
    cpc_rank *r0 = NULL, *r1 = NULL;
    cr_expect_null(cpc_rank_new_local(a, w, 0, NULL, &r0));
    cr_expect_null(cpc_rank_new_local(a2, w, 1, NULL, &r1));
    cpc_rank_free(r0);
    cpc_rank_free(r1);
    cpc_local_world_free(w);
    cpc_artifact_free(a);
    cpc_artifact_free(a2);
    cpc_artifact_free(b);
}

Test(api, null_compilations_and_files_are_usage_errors)
{
    cpc_artifact *a = NULL;
    expect_usage(cpc_compilation_artifact(NULL, &a), "compilation_artifact");
    expect_usage(cpc_compilation_write(NULL, "/tmp/x.cplan"), "compilation_write");
    cpc_candidate_info info;
    expect_usage(cpc_compilation_candidate(NULL, 0, &info, sizeof info), "candidate");
    cr_expect_eq(cpc_compilation_count(NULL, CPC_SEV_ERROR), 0);
    cr_expect(!cpc_compilation_ok(NULL));
    cpc_compilation_free(NULL);
    expect_usage(cpc_atomic_file_write(NULL, "x", 1), "atomic write");
    expect_usage(cpc_atomic_file_commit(NULL), "atomic commit");
    cpc_atomic_file_discard(NULL);
    expect_usage(cpc_write_file_atomic(NULL, "x", 1), "write_file_atomic");
}

/* The stall limit and cpc_rank_abort on a local world (issue 22): a peer that never
 * calls ends this rank's forward with an error at the limit; aborting the peer ends it
 * at once, naming the reason. */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct lone_fwd {
    cpc_rank *r;
    float *buf;
    int64_t T;
    cpc_status *st;
    double seconds;
} lone_fwd;

static void *lone_forward(void *arg)
{
    lone_fwd *f = arg;
    cpc_tensor t = tensor4(f->buf, 1, f->T, 4, 16);
    double t0 = now_ms();
    f->st = cpc_rank_forward(f->r, &t, &t, &t, NULL, &t, NULL);
    f->seconds = (now_ms() - t0) / 1000.0;
    return NULL;
}

Test(api, the_stall_limit_and_abort_end_a_waiting_rank)
{
    cpc_artifact *a = plan_for(4, 4, 16, 1, 8, 24, "none", 2, "ring", NULL, 0);
    int nd = 0;
    int64_t shape[4];
    cr_assert_null(cpc_artifact_shard_shape(a, 0, CPC_TENSOR_Q, &nd, shape));
    float *buf = calloc((size_t)(shape[1] * 4 * 16), sizeof *buf);
    for (int mode = 0; mode < 2; mode++) {
        cpc_local_world *w = NULL;
        cr_assert_null(cpc_local_world_new(a, &w));
        cpc_rank_options o;
        cpc_rank_options_init(&o, sizeof o);
        o.timeout_s = mode == 0 ? 0.5 : 600;
        cpc_rank *r0 = NULL, *r1 = NULL;
        cr_assert_null(cpc_rank_new_local(a, w, 0, &o, &r0));
        cr_assert_null(cpc_rank_new_local(a, w, 1, &o, &r1));
        lone_fwd f = {.r = r0, .buf = buf, .T = shape[1]};
        pthread_t th;
        pthread_create(&th, NULL, lone_forward, &f);
        if (mode == 1) {
            usleep(200 * 1000);
            cr_assert_null(cpc_rank_abort(r1, "the caller's own error on rank 1"));
        }
        pthread_join(th, NULL);
        cr_expect_eq(cpc_status_code(f.st), CPC_E_RUNTIME, "mode %d: %s", mode, cpc_status_message(f.st));
        if (mode == 1)
            cr_expect(f.st && strstr(cpc_status_message(f.st), "the caller's own error on rank 1"), "%s",
                      cpc_status_message(f.st));
        cr_expect_lt(f.seconds, 20.0, "mode %d: the waiting rank took %.1f s", mode, f.seconds);
        cpc_status_free(f.st);
        cpc_rank_free(r0);
        cpc_rank_free(r1);
        cpc_local_world_free(w);
    }
    free(buf);
    cpc_artifact_free(a);
}
