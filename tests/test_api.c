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
#include <unistd.h>

#include "cpc/cpc.h"

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
    cpc_compile_options_init(&o);
    o.sets = sets;
    o.n_sets = n_sets;
    cpc_artifact *a = NULL;
    cpc_status *diags = NULL;
    cpc_status *st = cpc_compile_plan_string(yaml, 0, "api.yaml", &o, &a, &diags);
    if (st)
        cpc_status_print(stderr, "test_api", st);
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
    cpc_status *st = cpc_rank_create_local(j->a, j->w, j->rank, NULL, &r);
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
    cpc_rank_destroy(r);
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
            cpc_compile_options_init(&o);
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

Test(api, bad_arguments_are_refused_before_anything_is_written)
{
    cpc_artifact *a = plan_for(4, 4, 16, 1, 0 + 8, 8, "none", 1, "none", NULL, 0);
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_new(a, &w));
    cpc_rank *r = NULL;
    cr_assert_null(cpc_rank_create_local(a, w, 0, NULL, &r));
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
    cpc_rank_destroy(r);
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
    cr_assert_null(cpc_artifact_write(path, a));
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
        st = cpc_rank_create_local(j->a, j->w, j->rank, NULL, &r);
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
    cpc_rank_destroy(r);
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
