/*
 * rank_cuda_emu.c - the public rank API (include/cpc/rank.h) on the CUDA
 * backend: every rank of a .cplan's world is a thread of this process in a
 * local world, created with CPC_BACKEND_CUDA on the caller's stream, and
 * every tensor it is given is the caller's device memory (cudaMalloc).  Run
 * by tests/cli/cuda_emu.sh on the fake CUDA runtime (LD_LIBRARY_PATH: every
 * launch runs the artifact's generated kernels on the CPU emulator, with the
 * emulator modules cpc_emu_prepare built for the .cplan); on a GPU machine
 * the same program runs on the GPU.
 *
 *   rank_cuda_emu PLAN.cplan     exit 0 when every check passes
 *
 * Checks, on fresh random inputs (seed printed): the gathered forward output
 * against the float64 reference (cpc_reference_attention, the SPEC's
 * tolerance of the dtype: fp32 1e-5, bf16 2e-2, fp16 2e-3 relative L2); the
 * LSE (ring / none / ring_anything) against the reference's; for a training
 * artifact the backward (lse NULL: the saved LSE of the last forward) with
 * dq/dk/dv in the plan dtype (converted on the device) and in fp32, against
 * cpc_reference_attention_bwd; a strided device tensor is CPC_E_USAGE
 * before anything runs.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpc/cpc.h"
#include "test_random.h"
#include "dtype.h"
#include "reference.h"

static int fails;
#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "FAIL: rank_cuda_emu: " __VA_ARGS__);                        \
            fputc('\n', stderr);                                                         \
            fails++;                                                                     \
        }                                                                                \
    } while (0)


typedef struct world {
    const cpc_artifact *a;
    cpc_local_world *w;
    cpc_dtype dt;
    size_t es;
    int B, S, H, Hkv, D;
    void *q, *k, *v, *dout;    /* global, plan dtype */
    void *out;                 /* gathered forward output, plan dtype */
    float *lse;                /* gathered [B, H, S], or NULL */
    float *dq, *dk, *dv;       /* gathered fp32 gradients */
    float *dq_p;               /* gathered dq via the plan dtype (converted back to fp32) */
} world;

typedef struct job {
    world *W;
    int rank;
    char err[1024];
} job;

static void *dev_of(const void *host, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess)
        return NULL;
    if (host && cudaMemcpy(d, host, n, cudaMemcpyHostToDevice) != cudaSuccess)
        return NULL;
    return d;
}

/* rows of a global [B, S, h, D] (es bytes) <-> a shard [B, T, h, D] for the rank's runs */
static void shard_copy(const cpc_token_run *runs, int n, int B, int S, int64_t T, size_t row, void *g,
                       void *s, bool to_shard)
{
    for (int b = 0; b < B; b++) {
        int64_t o = 0;
        for (int i = 0; i < n; i++) {
            char *gp = (char *)g + ((size_t)b * S + runs[i].start) * row;
            char *sp = (char *)s + ((size_t)b * T + o) * row;
            if (to_shard)
                memcpy(sp, gp, (size_t)runs[i].len * row);
            else
                memcpy(gp, sp, (size_t)runs[i].len * row);
            o += runs[i].len;
        }
    }
}

#define TRY(call)                                                                        \
    do {                                                                                 \
        cpc_status *st_ = (call);                                                        \
        if (st_) {                                                                       \
            snprintf(j->err, sizeof j->err, "rank %d: %s: %s", j->rank, #call,           \
                     cpc_status_message(st_));                                           \
            cpc_status_free(st_);                                                        \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

static void *rank_thread(void *arg)
{
    job *j = arg;
    world *W = j->W;
    const cpc_artifact *a = W->a;
    cpc_rank *r = NULL;
    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dl = NULL, *dd = NULL, *dgq = NULL, *dgk = NULL,
         *dgv = NULL, *dgq_p = NULL;
    void *hq = NULL, *hk = NULL, *hv = NULL, *hd = NULL, *ho = NULL;
    float *hl = NULL, *hg = NULL;
    cudaStream_t stream = NULL;
    if (cudaStreamCreate(&stream) != cudaSuccess) {
        snprintf(j->err, sizeof j->err, "rank %d: cudaStreamCreate failed", j->rank);
        return NULL;
    }
    cpc_rank_options o;
    cpc_rank_options_init(&o, sizeof o);
    o.backend = CPC_BACKEND_CUDA;
    o.device = 0;
    o.cuda_stream = stream;
    TRY(cpc_rank_new_local(a, W->w, j->rank, &o, &r));
    cpc_token_run runs[64];
    int nr = 0;
    TRY(cpc_artifact_shard_runs(a, j->rank, runs, 64, &nr));
    int64_t T = 0;
    for (int i = 0; i < nr; i++)
        T += runs[i].len;
    size_t rq = (size_t)W->H * W->D * W->es, rk = (size_t)W->Hkv * W->D * W->es;
    size_t nq = (size_t)W->B * T * rq, nk = (size_t)W->B * T * rk;
    hq = malloc(nq), hk = malloc(nk), hv = malloc(nk), hd = malloc(nq), ho = malloc(nq);
    shard_copy(runs, nr, W->B, W->S, T, rq, W->q, hq, true);
    shard_copy(runs, nr, W->B, W->S, T, rk, W->k, hk, true);
    shard_copy(runs, nr, W->B, W->S, T, rk, W->v, hv, true);
    shard_copy(runs, nr, W->B, W->S, T, rq, W->dout, hd, true);
    dq = dev_of(hq, nq), dk = dev_of(hk, nk), dv = dev_of(hv, nk), dd = dev_of(hd, nq), dout = dev_of(NULL, nq);
    bool want_lse = W->lse != NULL;
    size_t nl = (size_t)W->B * W->H * T * sizeof(float);
    dl = dev_of(NULL, nl);
    if (!dq || !dk || !dv || !dd || !dout || !dl) {
        snprintf(j->err, sizeof j->err, "rank %d: cudaMalloc failed", j->rank);
        goto done;
    }
    cpc_tensor tq = {dq, W->dt, 4, {W->B, T, W->H, W->D}, {0}}, tk = {dk, W->dt, 4, {W->B, T, W->Hkv, W->D}, {0}};
    cpc_tensor tv = tk, to = tq, tl = {dl, CPC_DTYPE_FP32, 3, {W->B, W->H, T}, {0}}, td = tq;
    tv.data = dv, to.data = dout, td.data = dd;
    /* a strided device tensor: refused before anything runs (every rank,
     * so that no peer is left inside a forward) */
    cpc_tensor bad = tq;
    int64_t st4[4] = {T * W->H * W->D * 2, W->H * W->D * 2, W->D, 1};
    memcpy(bad.strides, st4, sizeof st4);
    bad.shape[1] = T;
    cpc_status *e = cpc_rank_forward(r, &bad, &tk, &tv, NULL, &to, NULL);
    if (cpc_status_code(e) != CPC_E_USAGE || !strstr(cpc_status_message(e), "contiguous"))
        snprintf(j->err, sizeof j->err, "rank %d: a strided device tensor gave %s", j->rank,
                 e ? cpc_status_message(e) : "OK");
    cpc_status_free(e);
    if (j->err[0])
        goto done;
    TRY(cpc_rank_forward(r, &tq, &tk, &tv, NULL, &to, want_lse ? &tl : NULL));
    if (cudaMemcpy(ho, dout, nq, cudaMemcpyDeviceToHost) != cudaSuccess) {
        snprintf(j->err, sizeof j->err, "rank %d: cudaMemcpy out", j->rank);
        goto done;
    }
    shard_copy(runs, nr, W->B, W->S, T, rq, W->out, ho, false);
    if (want_lse) {
        hl = malloc(nl);
        cudaMemcpy(hl, dl, nl, cudaMemcpyDeviceToHost);
        for (int b = 0; b < W->B; b++)
            for (int h = 0; h < W->H; h++) {
                int64_t t = 0;
                for (int i = 0; i < nr; i++)
                    for (int64_t x = 0; x < runs[i].len; x++, t++)
                        W->lse[((size_t)b * W->H + h) * W->S + runs[i].start + x] =
                            hl[((size_t)b * W->H + h) * T + t];
            }
    }
    if (cpc_artifact_trains(a)) {
        /* fp32 gradients straight into device memory, then dq in the plan
         * dtype (the device converts); lse NULL: the last forward's */
        size_t gq = (size_t)W->B * T * W->H * W->D * 4, gk = (size_t)W->B * T * W->Hkv * W->D * 4;
        dgq = dev_of(NULL, gq), dgk = dev_of(NULL, gk), dgv = dev_of(NULL, gk), dgq_p = dev_of(NULL, nq);
        cpc_tensor gqt = {dgq, CPC_DTYPE_FP32, 4, {W->B, T, W->H, W->D}, {0}};
        cpc_tensor gkt = {dgk, CPC_DTYPE_FP32, 4, {W->B, T, W->Hkv, W->D}, {0}}, gvt = gkt;
        gvt.data = dgv;
        TRY(cpc_rank_backward(r, &tq, &tk, &tv, NULL, &to, NULL, &td, &gqt, &gkt, &gvt));
        hg = malloc(gq > gk ? gq : gk);
        float *gl[3] = {W->dq, W->dk, W->dv};
        void *gd[3] = {dgq, dgk, dgv};
        size_t gn[3] = {gq, gk, gk}, grow[3] = {(size_t)W->H * W->D * 4, (size_t)W->Hkv * W->D * 4,
                                                (size_t)W->Hkv * W->D * 4};
        for (int i = 0; i < 3; i++) {
            cudaMemcpy(hg, gd[i], gn[i], cudaMemcpyDeviceToHost);
            shard_copy(runs, nr, W->B, W->S, T, grow[i], gl[i], hg, false);
        }
        cpc_tensor gqp = tq;
        gqp.data = dgq_p;
        gqt.data = dgq_p;
        TRY(cpc_rank_backward(r, &tq, &tk, &tv, NULL, &to, NULL, &td, &gqp, &gkt, &gvt));
        cudaMemcpy(ho, dgq_p, nq, cudaMemcpyDeviceToHost);
        float *f = malloc((size_t)W->B * T * W->H * W->D * 4);
        cpc_to_f32_n(f, ho, W->dt, (size_t)W->B * T * W->H * W->D);
        shard_copy(runs, nr, W->B, W->S, T, (size_t)W->H * W->D * 4, W->dq_p, f, false);
        free(f);
    }
done:
    if (j->err[0] && r)
        cpc_rank_abort(r, j->err); /* the peers fail instead of waiting */
    cpc_rank_free(r);
    void *ds[] = {dq, dk, dv, dout, dl, dd, dgq, dgk, dgv, dgq_p};
    for (size_t i = 0; i < sizeof ds / sizeof *ds; i++)
        if (ds[i])
            cudaFree(ds[i]);
    cudaStreamDestroy(stream);
    free(hq), free(hk), free(hv), free(hd), free(ho), free(hl), free(hg);
    return NULL;
}

static double rel_l2_f(const float *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++)
        num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: rank_cuda_emu PLAN.cplan\n");
        return 2;
    }
    const char *seed_env = getenv("CPC_TEST_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
    cpc_artifact *a = NULL;
    cpc_status *st = cpc_artifact_load(argv[1], &a);
    if (st) {
        cpc_status_print(st, stderr, "rank_cuda_emu");
        return 1;
    }
    world W = {.a = a, .dt = cpc_artifact_dtype(a)};
    W.es = W.dt == CPC_DTYPE_FP32 ? 4 : 2;
    int64_t B, S, Skv, H, Hkv, D;
    cpc_artifact_shape(a, &B, &S, &Skv, &H, &Hkv, &D);
    W.B = (int)B, W.S = (int)S, W.H = (int)H, W.Hkv = (int)Hkv, W.D = (int)D;
    if (Skv != S || cpc_artifact_key_padding(a) || cpc_artifact_cfg_degree(a) * cpc_artifact_tp_degree(a) != 1) {
        fprintf(stderr, "rank_cuda_emu: %s: self-attention without key padding or outer axes only\n", argv[1]);
        return 2;
    }
    size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * Hkv * D;
    float *f = malloc(nq * sizeof *f);
    void **t[4] = {&W.q, &W.k, &W.v, &W.dout};
    size_t n[4] = {nq, nk, nk, nq};
    for (int i = 0; i < 4; i++) {
        for (size_t e = 0; e < n[i]; e++)
            f[e] = (float)test_normal_at(seed, (uint32_t)i, e);
        *t[i] = malloc(n[i] * W.es);
        cpc_from_f32_n(*t[i], W.dt, f, n[i]);
    }
    W.out = malloc(nq * W.es);
    const char *var = cpc_artifact_variant(a);
    if (!strcmp(var, "ring") || !strcmp(var, "none") || !strcmp(var, "ring_anything"))
        W.lse = calloc((size_t)B * H * S, sizeof(float));
    bool trains = cpc_artifact_trains(a);
    W.dq = calloc(nq, 4), W.dk = calloc(nk, 4), W.dv = calloc(nk, 4), W.dq_p = calloc(nq, 4);
    int P = cpc_artifact_world_size(a);
    if ((st = cpc_local_world_new(a, &W.w))) {
        cpc_status_print(st, stderr, "rank_cuda_emu");
        return 1;
    }
    job *jobs = calloc((size_t)P, sizeof *jobs);
    pthread_t *th = calloc((size_t)P, sizeof *th);
    for (int p = 0; p < P; p++) {
        jobs[p] = (job){.W = &W, .rank = p};
        pthread_create(&th[p], NULL, rank_thread, &jobs[p]);
    }
    for (int p = 0; p < P; p++)
        pthread_join(th[p], NULL);
    for (int p = 0; p < P; p++)
        CHECK(!jobs[p].err[0], "%s", jobs[p].err);
    if (!fails) {
        cpc_ref_problem rp = {.B = W.B, .S = W.S, .Skv = W.S, .H = W.H, .Hkv = W.Hkv, .D = W.D, .dtype = W.dt,
                              .q = W.q, .k = W.k, .v = W.v, .scale = (double)(float)(1.0 / sqrt((double)D)),
                              .causal = cpc_artifact_causal(a)};
        double *ro = malloc(nq * sizeof *ro), *rl = malloc((size_t)B * H * S * sizeof *rl);
        st = cpc_reference_attention(&rp, NULL, 0, ro, rl);
        CHECK(!st, "reference: %s", cpc_status_message(st));
        double tol = W.dt == CPC_DTYPE_FP32 ? 1e-5 : W.dt == CPC_DTYPE_BF16 ? 2e-2 : 2e-3;
        float *of = malloc(nq * sizeof *of);
        cpc_to_f32_n(of, W.out, W.dt, nq);
        double eo = rel_l2_f(of, ro, nq);
        CHECK(eo < tol, "out: relative L2 error %.3g > %.3g", eo, tol);
        printf("rank_cuda_emu: %s: %d CUDA ranks (%s, %s): out rel_err %.3g", argv[1], P, var,
               cpc_dtype_name(W.dt), eo);
        if (W.lse) {
            double worst = 0;
            for (size_t i = 0; i < (size_t)B * H * S; i++) {
                double d = fabs(W.lse[i] - rl[i]);
                worst = d > worst || d != d ? d : worst;
            }
            CHECK(worst < (W.dt == CPC_DTYPE_FP32 ? 1e-4 : 5e-2), "lse: max error %.3g", worst);
            printf(", lse max_err %.3g", worst);
        }
        if (trains) {
            double *gq = malloc(nq * sizeof *gq), *gk = malloc(nk * sizeof *gk), *gv = malloc(nk * sizeof *gv);
            st = cpc_reference_attention_bwd(&rp, W.dout, gq, gk, gv);
            CHECK(!st, "reference bwd: %s", cpc_status_message(st));
            double gtol = W.dt == CPC_DTYPE_FP32 ? 1e-5 : W.dt == CPC_DTYPE_BF16 ? 2e-2 : 2e-3;
            double e1 = rel_l2_f(W.dq, gq, nq), e2 = rel_l2_f(W.dk, gk, nk), e3 = rel_l2_f(W.dv, gv, nk),
                   e4 = rel_l2_f(W.dq_p, gq, nq);
            CHECK(e1 < gtol && e2 < gtol && e3 < gtol, "backward: dq %.3g dk %.3g dv %.3g > %.3g", e1, e2, e3,
                  gtol);
            CHECK(e4 < gtol, "backward: dq in the plan dtype %.3g > %.3g", e4, gtol);
            printf(", backward dq %.3g dk %.3g dv %.3g (fp32), dq %.3g (%s)", e1, e2, e3, e4,
                   cpc_dtype_name(W.dt));
            free(gq), free(gk), free(gv);
        }
        printf(" (seed %llu)\n", (unsigned long long)seed);
        free(ro), free(rl), free(of);
    }
    cpc_local_world_free(W.w);
    free(jobs), free(th), free(f);
    free(W.q), free(W.k), free(W.v), free(W.dout), free(W.out), free(W.lse);
    free(W.dq), free(W.dk), free(W.dv), free(W.dq_p);
    cpc_artifact_free(a);
    if (fails)
        fprintf(stderr, "rank_cuda_emu: %d failure(s) (seed %llu)\n", fails, (unsigned long long)seed);
    return fails ? 1 : 0;
}
