/*
 * rank_nccl_emu.c - NCCL ranks of the public rank API (include/cpc/rank.h
 * NCCL RANKS) without MPI in libcpc: one process per rank, the unique id
 * made by rank 0 (cpc_nccl_unique_id) and given to the others by the
 * caller, here with MPI_Bcast as a torchrun job would with
 * torch.distributed.broadcast_object_list (MPI is only this test's launcher
 * and carries nothing of cpc's).  Run by tests/cli/nccl_emu.sh under mpirun
 * on the fake CUDA runtime and the fake NCCL (one emulated GPU per rank); on
 * a GPU machine with NVIDIA's NCCL the same program runs on the GPUs.
 *
 *   mpirun -np P rank_nccl_emu PLAN.cplan      (P = the artifact's world size)
 *   rank_nccl_emu PLAN.cplan                    (world size 1, no launcher: MPI is
 *                                               not initialised at all; the GPU pack's
 *                                               case, tests/gpu/run.sh)
 *
 * Checks, on fresh random inputs (seed from rank 0, printed):
 *   1. cpc_rank_new_nccl_id on device = world rank, two forwards: each
 *      rank's output shard against the float64 reference
 *      (cpc_reference_attention; tolerance fp32 1e-5, bf16 2e-2, fp16 2e-3
 *      relative L2), the second forward bitwise equal to the first;
 *      For a training artifact also the backward (lse NULL: the last
 *      forward's; fp32 dq/dk/dv) against cpc_reference_attention_bwd;
 *   2. cpc_rank_new_nccl over a communicator this program made itself
 *      (ncclCommInitRank): the same check, and the caller's communicator
 *      still works after cpc_rank_free (an ncclAllReduce on it);
 *   3. refusals before anything collective: a short id, a CPU backend, a
 *      rank out of range, a NULL id are CPC_E_USAGE; a NULL communicator too.
 * Every rank's verdict is combined (MPI_Allreduce); rank 0 prints
 * "rank_nccl_emu: ok" when all passed.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <mpi.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpc/cpc.h"
#include "test_random.h"
#include "dtype.h"
#include "reference.h"

static int fails, me;
static bool use_mpi;   /* started by an MPI launcher (else one process, MPI untouched) */

static bool launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

static void bcast(void *p, int n)
{
    if (use_mpi)
        MPI_Bcast(p, n, MPI_BYTE, 0, MPI_COMM_WORLD);
}

static void die(int code)
{
    if (use_mpi)
        MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}
#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "FAIL: rank_nccl_emu: rank %d: ", me);                       \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
            fails++;                                                                     \
        }                                                                                \
    } while (0)


typedef struct prob {
    const cpc_artifact *a;
    cpc_dtype dt;
    size_t es;
    int B, S, H, Hkv, D;
    void *q, *k, *v;           /* global, plan dtype */
    double *ref;               /* float64 reference output [B, S, H, D] */
    void *dout;                /* training artifacts: global dout, plan dtype */
    double *gref[3];           /* float64 reference dq, dk, dv (training) */
    double grad_err;           /* worst gradient error of this rank */
    double tol;
} prob;

/* rows of a global [B, S, h, D] (row bytes each) <-> a shard [B, T, h, D] */
static void shard_copy(const cpc_token_run *runs, int n, int B, int S, int64_t T, size_t row,
                       const void *g, void *s)
{
    for (int b = 0; b < B; b++) {
        int64_t o = 0;
        for (int i = 0; i < n; i++) {
            memcpy((char *)s + ((size_t)b * T + o) * row,
                   (const char *)g + ((size_t)b * S + runs[i].start) * row, (size_t)runs[i].len * row);
            o += runs[i].len;
        }
    }
}

static void *dev_of(const void *host, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess)
        return NULL;
    if (host && cudaMemcpy(d, host, n, cudaMemcpyHostToDevice) != cudaSuccess)
        return NULL;
    return d;
}

/* Relative L2 error of this rank's fp32 shard `got` [B, T, h, D] against the
 * rows of the global float64 reference `g` [B, S, h, D]. */
static double shard_err(const prob *P, const cpc_token_run *runs, int nr, int64_t T, int h,
                        const float *got, const double *g)
{
    size_t n = (size_t)P->B * T * h * P->D, row = (size_t)h * P->D;
    double *ref = malloc(n * sizeof *ref);
    shard_copy(runs, nr, P->B, P->S, T, row * sizeof(double), g, ref);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++)
        num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    free(ref);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Two forwards on rank r (world rank p), each checked against the reference
 * rows of p's shard (training artifacts: then the backward, lse NULL, fp32
 * gradients, against the reference backward); returns the relative L2 error
 * of the first forward. */
static double run_rank(prob *P, cpc_rank *r, int p, cudaStream_t stream)
{
    cpc_token_run runs[64];
    int nr = 0;
    cpc_status *st = cpc_artifact_shard_runs(P->a, p, runs, 64, &nr);
    CHECK(!st, "shard_runs: %s", cpc_status_message(st));
    cpc_status_free(st);
    int64_t T = 0;
    for (int i = 0; i < nr; i++)
        T += runs[i].len;
    size_t rq = (size_t)P->H * P->D * P->es, rk = (size_t)P->Hkv * P->D * P->es;
    size_t nq = (size_t)P->B * T * rq, nk = (size_t)P->B * T * rk;
    char *hq = malloc(nq), *hk = malloc(nk), *hv = malloc(nk), *ho = malloc(nq), *ho2 = malloc(nq);
    shard_copy(runs, nr, P->B, P->S, T, rq, P->q, hq);
    shard_copy(runs, nr, P->B, P->S, T, rk, P->k, hk);
    shard_copy(runs, nr, P->B, P->S, T, rk, P->v, hv);
    void *dq = dev_of(hq, nq), *dk = dev_of(hk, nk), *dv = dev_of(hv, nk), *dout = dev_of(NULL, nq);
    double err = INFINITY;
    CHECK(dq && dk && dv && dout, "cudaMalloc");
    if (dq && dk && dv && dout) {
        cpc_tensor tq = {dq, P->dt, 4, {P->B, T, P->H, P->D}, {0}};
        cpc_tensor tk = {dk, P->dt, 4, {P->B, T, P->Hkv, P->D}, {0}};
        cpc_tensor tv = tk, to = tq;
        tv.data = dv, to.data = dout;
        for (int it = 0; it < 2; it++) {
            st = cpc_rank_forward(r, &tq, &tk, &tv, NULL, &to, NULL);
            CHECK(!st, "forward %d: %s", it, cpc_status_message(st));
            cpc_status_free(st);
            cudaStreamSynchronize(stream);
            cudaMemcpy(it ? ho2 : ho, dout, nq, cudaMemcpyDeviceToHost);
        }
        CHECK(memcmp(ho, ho2, nq) == 0, "the second forward differs from the first");
        /* the reference rows of this shard */
        size_t n = (size_t)P->B * T * P->H * P->D, row = (size_t)P->H * P->D;
        double *ref = malloc(n * sizeof *ref);
        shard_copy(runs, nr, P->B, P->S, T, row * sizeof(double), P->ref, ref);
        float *f = malloc(n * sizeof *f);
        cpc_to_f32_n(f, ho, P->dt, n);
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++)
            num += (f[i] - ref[i]) * (f[i] - ref[i]), den += ref[i] * ref[i];
        err = den > 0 ? sqrt(num / den) : sqrt(num);
        CHECK(err < P->tol, "out: relative L2 error %.3g > %.3g", err, P->tol);
        free(ref);
        free(f);
        if (P->dout) {
            char *hd = malloc(nq);
            shard_copy(runs, nr, P->B, P->S, T, rq, P->dout, hd);
            void *dd = dev_of(hd, nq);
            size_t gq = (size_t)P->B * T * P->H * P->D * 4, gk = (size_t)P->B * T * P->Hkv * P->D * 4;
            void *g[3] = {dev_of(NULL, gq), dev_of(NULL, gk), dev_of(NULL, gk)};
            cpc_tensor td = tq, gt[3];
            td.data = dd;
            for (int i = 0; i < 3; i++)
                gt[i] = (cpc_tensor){g[i], CPC_DTYPE_FP32, 4, {P->B, T, i ? P->Hkv : P->H, P->D}, {0}};
            st = cpc_rank_backward(r, &tq, &tk, &tv, NULL, &to, NULL, &td, &gt[0], &gt[1], &gt[2]);
            CHECK(!st, "backward: %s", cpc_status_message(st));
            cpc_status_free(st);
            cudaStreamSynchronize(stream);
            float *hg = malloc(gq);
            static const char *const nm[3] = {"dq", "dk", "dv"};
            for (int i = 0; i < 3 && g[i]; i++) {
                cudaMemcpy(hg, g[i], i ? gk : gq, cudaMemcpyDeviceToHost);
                double e = shard_err(P, runs, nr, T, i ? P->Hkv : P->H, hg, P->gref[i]);
                CHECK(e < P->tol, "backward %s: relative L2 error %.3g > %.3g", nm[i], e, P->tol);
                if (e > P->grad_err)
                    P->grad_err = e;
            }
            free(hg), free(hd);
            cudaFree(dd);
            for (int i = 0; i < 3; i++)
                if (g[i])
                    cudaFree(g[i]);
        }
    }
    void *ds[] = {dq, dk, dv, dout};
    for (int i = 0; i < 4; i++)
        if (ds[i])
            cudaFree(ds[i]);
    free(hq), free(hk), free(hv), free(ho), free(ho2);
    return err;
}

static void expect_usage(cpc_status *st, const char *what)
{
    CHECK(st && cpc_status_code(st) == CPC_E_USAGE, "%s: expected CPC_E_USAGE, got %s", what,
          st ? cpc_status_message(st) : "success");
    cpc_status_free(st);
}

int main(int argc, char **argv)
{
    int np = 1;
    use_mpi = launched();
    if (use_mpi) {
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        MPI_Comm_size(MPI_COMM_WORLD, &np);
    }
    if (argc != 2) {
        fprintf(stderr, "usage: mpirun -np P rank_nccl_emu PLAN.cplan\n");
        die(2);
    }
    uint64_t seed = 0;
    if (me == 0) {
        const char *s = getenv("CPC_TEST_SEED");
        seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    }
    bcast(&seed, (int)sizeof seed);
    cpc_artifact *a = NULL;
    cpc_status *st = cpc_artifact_load(argv[1], &a);
    if (st) {
        cpc_status_print(st, stderr, "rank_nccl_emu");
        die(2);
    }
    if (cpc_artifact_world_size(a) != np) {
        fprintf(stderr, "rank_nccl_emu: %s has world %d, run it with mpirun -np %d\n", argv[1],
                cpc_artifact_world_size(a), cpc_artifact_world_size(a));
        die(2);
    }
    prob P = {.a = a, .dt = cpc_artifact_dtype(a)};
    P.es = P.dt == CPC_DTYPE_FP32 ? 4 : 2;
    P.tol = P.dt == CPC_DTYPE_FP32 ? 1e-5 : P.dt == CPC_DTYPE_BF16 ? 2e-2 : 2e-3;
    int64_t B, S, Skv, H, Hkv, D;
    cpc_artifact_shape(a, &B, &S, &Skv, &H, &Hkv, &D);
    P.B = (int)B, P.S = (int)S, P.H = (int)H, P.Hkv = (int)Hkv, P.D = (int)D;
    if (Skv != S || cpc_artifact_key_padding(a)) {
        fprintf(stderr, "rank_nccl_emu: %s: self-attention without key padding only\n", argv[1]);
        die(2);
    }
    size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * Hkv * D;
    float *f = malloc(nq * sizeof *f);
    void **t[3] = {&P.q, &P.k, &P.v};
    size_t n[3] = {nq, nk, nk};
    for (int i = 0; i < 3; i++) {
        for (size_t e = 0; e < n[i]; e++)
            f[e] = (float)test_normal_at(seed, (uint32_t)i, e);
        *t[i] = malloc(n[i] * P.es);
        cpc_from_f32_n(*t[i], P.dt, f, n[i]);
    }
    free(f);
    cpc_ref_problem rp = {.B = P.B, .S = P.S, .Skv = P.S, .H = P.H, .Hkv = P.Hkv, .D = P.D, .dtype = P.dt,
                          .q = P.q, .k = P.k, .v = P.v, .scale = (double)(float)(1.0 / sqrt((double)D)),
                          .causal = cpc_artifact_causal(a)};
    if (cpc_artifact_trains(a)) {
        f = malloc(nq * sizeof *f);
        for (size_t e = 0; e < nq; e++)
            f[e] = (float)test_normal_at(seed, 3, e);
        P.dout = malloc(nq * P.es);
        cpc_from_f32_n(P.dout, P.dt, f, nq);
        free(f);
    }
    P.ref = malloc(nq * sizeof *P.ref);
    double *rl = malloc((size_t)B * H * S * sizeof *rl);
    st = cpc_reference_attention(&rp, NULL, 0, P.ref, rl);
    CHECK(!st, "reference: %s", cpc_status_message(st));
    cpc_status_free(st);
    free(rl);
    if (P.dout) {
        P.gref[0] = malloc(nq * sizeof(double));
        P.gref[1] = malloc(nk * sizeof(double));
        P.gref[2] = malloc(nk * sizeof(double));
        st = cpc_reference_attention_bwd(&rp, P.dout, P.gref[0], P.gref[1], P.gref[2]);
        CHECK(!st, "reference backward: %s", cpc_status_message(st));
        cpc_status_free(st);
    }

    cudaStream_t stream = NULL;
    cudaSetDevice(me);   /* one GPU per rank (CPC_EMU_DEVICES >= P on the emulator) */
    {
        int ndev = 0;
        if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= me) {
            fprintf(stderr, "rank_nccl_emu: rank %d: %d CUDA device(s) visible, one per rank needed\n",
                    me, ndev);
            die(3);
        }
    }
    CHECK(cudaStreamCreate(&stream) == cudaSuccess, "cudaStreamCreate");
    cpc_rank_options o;
    cpc_rank_options_init(&o, sizeof o);
    o.backend = CPC_BACKEND_CUDA;
    o.cuda_stream = stream;

    /* 3. refusals (local checks, before anything collective) */
    unsigned char id[CPC_NCCL_UNIQUE_ID_BYTES];
    cpc_rank *r = NULL;
    expect_usage(cpc_nccl_unique_id(id, 64), "cpc_nccl_unique_id of 64 bytes");
    expect_usage(cpc_rank_new_nccl_id(a, id, 64, me, &o, &r), "an id of 64 bytes");
    expect_usage(cpc_rank_new_nccl_id(a, NULL, sizeof id, me, &o, &r), "a NULL id");
    expect_usage(cpc_rank_new_nccl_id(a, id, sizeof id, np, &o, &r), "rank == world size");
    cpc_rank_options cpu;
    cpc_rank_options_init(&cpu, sizeof cpu);
    cpu.backend = CPC_BACKEND_CPU;
    expect_usage(cpc_rank_new_nccl_id(a, id, sizeof id, me, &cpu, &r), "a CPU backend");
    expect_usage(cpc_rank_new_nccl(a, NULL, NULL, &o, &r), "a NULL communicator");
    CHECK(r == NULL, "*out set after a refusal");

    /* 1. a unique id made by rank 0 and broadcast by the caller */
    if (me == 0) {
        st = cpc_nccl_unique_id(id, sizeof id);
        CHECK(!st, "cpc_nccl_unique_id: %s", cpc_status_message(st));
        cpc_status_free(st);
    }
    bcast(id, (int)sizeof id);
    double e1 = INFINITY, e2 = INFINITY;
    st = cpc_rank_new_nccl_id(a, id, sizeof id, me, &o, &r);
    CHECK(!st, "cpc_rank_new_nccl_id: %s", cpc_status_message(st));
    cpc_status_free(st);
    if (r) {
        CHECK(cpc_rank_index(r) == me, "rank index %d", cpc_rank_index(r));
        e1 = run_rank(&P, r, me, stream);
        cpc_rank_free(r);
        r = NULL;
    }

    /* 2. the caller's own communicator, borrowed */
    ncclUniqueId uid;
    if (me == 0)
        CHECK(ncclGetUniqueId(&uid) == ncclSuccess, "ncclGetUniqueId");
    bcast(&uid, (int)sizeof uid);
    ncclComm_t comm = NULL;
    ncclResult_t nr = ncclCommInitRank(&comm, np, uid, me);
    CHECK(nr == ncclSuccess, "ncclCommInitRank: %s", ncclGetErrorString(nr));
    if (comm) {
        st = cpc_rank_new_nccl(a, comm, stream, &o, &r);
        CHECK(!st, "cpc_rank_new_nccl: %s", cpc_status_message(st));
        cpc_status_free(st);
        if (r) {
            e2 = run_rank(&P, r, me, stream);
            cpc_rank_free(r);
        }
        /* still the caller's, still usable */
        int *dv = NULL, hv = me + 1;
        cudaMalloc((void **)&dv, sizeof *dv);
        cudaMemcpy(dv, &hv, sizeof hv, cudaMemcpyHostToDevice);
        nr = ncclAllReduce(dv, dv, 1, ncclInt32, ncclSum, comm, stream);
        cudaStreamSynchronize(stream);
        cudaMemcpy(&hv, dv, sizeof hv, cudaMemcpyDeviceToHost);
        CHECK(nr == ncclSuccess && hv == np * (np + 1) / 2,
              "the caller's communicator after cpc_rank_free: %s, sum %d", ncclGetErrorString(nr), hv);
        cudaFree(dv);
        ncclCommDestroy(comm);
    }
    cudaStreamDestroy(stream);

    double worst[3] = {e1, e2, P.grad_err}, all[3] = {e1, e2, P.grad_err};
    int bad = fails;
    if (use_mpi) {
        MPI_Reduce(worst, all, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Allreduce(&fails, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    }
    if (me == 0) {
        printf("rank_nccl_emu: %s: %d NCCL ranks (%s, %s): out rel_err %.3g (unique id), %.3g "
               "(caller's communicator), worst over ranks (seed %llu)\n", argv[1], np,
               cpc_artifact_variant(a), cpc_dtype_name(P.dt), all[0], all[1],
               (unsigned long long)seed);
        if (P.dout)
            printf("rank_nccl_emu: backward (both bootstraps): dq/dk/dv worst rel_err %.3g\n", all[2]);
        if (!bad)
            printf("rank_nccl_emu: ok\n");
        else
            fprintf(stderr, "rank_nccl_emu: %d failure(s)\n", bad);
    }
    free(P.q), free(P.k), free(P.v), free(P.ref), free(P.dout);
    for (int i = 0; i < 3; i++)
        free(P.gref[i]);
    cpc_artifact_free(a);
    if (use_mpi)
        MPI_Finalize();
    return bad ? 1 : 0;
}
