/*
 * toy_model.c - a two-layer toy transformer whose attention runs through
 * libcpc, under mpirun: each process is one rank and holds its shard of the
 * sequence (text + image tokens); projections are per token, attention is
 * cpc_rank_forward over the caller's MPI communicator.  Rank 0 then runs the
 * same model on one rank (the plan compiled for world_size 1) and compares.
 *
 *   mpirun -np 4 ./toy_model           exit 0 when the outputs match (fp32 1e-5)
 *   mpirun -np 2 ./toy_model --variant ring
 *   mpirun -np 2 ./toy_model --backend cuda
 *
 * --backend cuda: the distributed attention runs on the CUDA backend (the
 * plan compiled with its kernels, NVRTC): q, k, v and out live in device
 * memory the example allocates (cudaMalloc), the rank is created with
 * CPC_BACKEND_CUDA on the example's stream, GPU = local rank mod visible
 * GPUs; the one-rank reference stays on the CPU.  The CUDA runtime is
 * opened at run time (dlopen libcudart.so.13), so the example builds
 * without the CUDA toolkit (tests/cli/cuda_emu.sh runs it on the CPU
 * emulator of CUDA).
 *
 * Uses only <cpc/cpc.h> (build: `pkg-config --cflags --libs cpc`, or CMake
 * find_package(cpc) -> cpc::cpc; see examples/CMakeLists.txt).
 */
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cpc/cpc.h>

enum { B = 1, TEXT = 24, IMAGE = 72, H = 4, D = 16, DM = H * D, LAYERS = 2 };
static const char *PLAN =
    "version: 1\n"
    "name: toy-model\n"
    "model: {heads: 4, head_dim: 16, dtype: fp32, layers: 2}\n"
    "input:\n"
    "  segments:\n"
    "    - {name: text, tokens: 24}\n"
    "    - {name: image, tokens: 72}\n"
    "cluster: {world_size: 1, device: cpu}\n"
    "parallel: {variant: auto}\n";

#define CHECK(call)                                                                    \
    do {                                                                               \
        cpc_status *st_ = (call);                                                      \
        if (st_) {                                                                     \
            cpc_status_print(st_, stderr, "toy_model");                                \
            cpc_status_free(st_);                                                      \
            MPI_Abort(MPI_COMM_WORLD, 3);                                              \
        }                                                                              \
    } while (0)

/* Deterministic weights and inputs, the same on every process. */
static float hash_normal(unsigned long i, unsigned long seed)
{
    unsigned long x = (i + 1) * 0x9E3779B97F4A7C15ul ^ (seed * 0xBF58476D1CE4E5B9ul);
    x ^= x >> 31;
    x *= 0x94D049BB133111EBul;
    x ^= x >> 29;
    double u = ((x >> 11) + 0.5) / 9007199254740992.0;
    x = x * 6364136223846793005ul + 1442695040888963407ul;
    double v = ((x >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* y[T, DM] = x[T, DM] W[DM, DM] (W scaled by 1/sqrt(DM)). */
static void matmul(const float *x, const float *W, float *y, long T)
{
    for (long t = 0; t < T; t++)
        for (int j = 0; j < DM; j++) {
            double acc = 0;
            for (int i = 0; i < DM; i++)
                acc += (double)x[t * DM + i] * W[i * DM + j];
            y[t * DM + j] = (float)acc;
        }
}

/* The few CUDA runtime calls --backend cuda needs, opened at run time. */
static struct {
    int (*malloc_)(void **p, size_t n);
    int (*free_)(void *p);
    int (*memcpy_)(void *dst, const void *src, size_t n, int kind); /* 1: H2D, 2: D2H */
    int (*set_device)(int d);
    int (*device_count)(int *n);
    int (*stream_create)(void **s);
    int (*stream_destroy)(void *s);
    void *stream;
} cu;

static void cuda_open(int local_rank)
{
    void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "toy_model: --backend cuda: cannot open the CUDA runtime: %s\n", dlerror());
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    *(void **)&cu.malloc_ = dlsym(h, "cudaMalloc");
    *(void **)&cu.free_ = dlsym(h, "cudaFree");
    *(void **)&cu.memcpy_ = dlsym(h, "cudaMemcpy");
    *(void **)&cu.set_device = dlsym(h, "cudaSetDevice");
    *(void **)&cu.device_count = dlsym(h, "cudaGetDeviceCount");
    *(void **)&cu.stream_create = dlsym(h, "cudaStreamCreate");
    *(void **)&cu.stream_destroy = dlsym(h, "cudaStreamDestroy");
    int n = 0;
    if (!cu.malloc_ || !cu.free_ || !cu.memcpy_ || !cu.set_device || !cu.device_count ||
        !cu.stream_create || !cu.stream_destroy || cu.device_count(&n) != 0 || n < 1 ||
        cu.set_device(local_rank % n) != 0 || cu.stream_create(&cu.stream) != 0) {
        fprintf(stderr, "toy_model: --backend cuda: no usable CUDA device\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

static void *dev_alloc(size_t n)
{
    void *p = NULL;
    if (cu.malloc_(&p, n) != 0) {
        fprintf(stderr, "toy_model: cudaMalloc(%zu) failed\n", n);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    return p;
}

static void dev_copy(void *dst, const void *src, size_t n, int kind)
{
    if (cu.memcpy_(dst, src, n, kind) != 0) {
        fprintf(stderr, "toy_model: cudaMemcpy failed\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

/* Runs the model on this rank's tokens x[T, DM] (in place); `cuda`: the
 * attention's tensors are device memory (the projections stay on the host). */
static void model(cpc_rank *r, float *x, long T, float *const W[LAYERS][4], bool cuda)
{
    size_t nb = sizeof(float) * (size_t)(T ? T : 1) * DM;
    float *q = malloc(nb), *k = malloc(nb), *v = malloc(nb), *o = malloc(nb), *y = malloc(nb);
    void *dq = cuda ? dev_alloc(nb) : q, *dk = cuda ? dev_alloc(nb) : k;
    void *dv = cuda ? dev_alloc(nb) : v, *dout = cuda ? dev_alloc(nb) : o;
    cpc_tensor tq = {dq, CPC_DTYPE_FP32, 4, {B, T, H, D}, {0}}, tk = tq, tv = tq, to = tq;
    tk.data = dk, tv.data = dv, to.data = dout;
    for (int l = 0; l < LAYERS; l++) {
        matmul(x, W[l][0], q, T);
        matmul(x, W[l][1], k, T);
        matmul(x, W[l][2], v, T);
        if (cuda) {
            dev_copy(dq, q, nb, 1), dev_copy(dk, k, nb, 1), dev_copy(dv, v, nb, 1);
        }
        CHECK(cpc_rank_forward(r, &tq, &tk, &tv, NULL, &to, NULL)); /* [B, T, H, D] */
        if (cuda)
            dev_copy(o, dout, nb, 2);
        matmul(o, W[l][3], y, T);
        for (long i = 0; i < T * DM; i++)
            x[i] += y[i]; /* residual */
    }
    if (cuda)
        cu.free_(dq), cu.free_(dk), cu.free_(dv), cu.free_(dout);
    free(q), free(k), free(v), free(o), free(y);
}

/* This rank's rows of the global input (its token runs, in shard order). */
static float *shard_input(const cpc_artifact *a, int rank, long *T)
{
    cpc_token_run runs[16];
    int n = 0;
    CHECK(cpc_artifact_shard_runs(a, rank, runs, 16, &n));
    long t = 0;
    for (int i = 0; i < n; i++)
        t += runs[i].len;
    float *x = malloc(sizeof(float) * (t ? t : 1) * DM);
    long o = 0;
    for (int i = 0; i < n; i++)
        for (long j = 0; j < runs[i].len; j++, o++)
            for (int c = 0; c < DM; c++)
                x[o * DM + c] = hash_normal((unsigned long)(runs[i].start + j) * DM + c, 1);
    *T = t;
    return x;
}

int main(int argc, char **argv)
{
    int provided = 0, rank = 0, size = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *variant = "auto";
    bool cuda = false;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--variant") == 0)
            variant = argv[i + 1];
        if (strcmp(argv[i], "--backend") == 0)
            cuda = strcmp(argv[i + 1], "cuda") == 0;
    }
    if (cuda) {
        /* GPU = local rank (node-local communicator) mod visible GPUs */
        MPI_Comm node;
        int local = 0;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local);
        MPI_Comm_free(&node);
        cuda_open(local);
    }

    /* The plan for this many processes: --set cluster.world_size=N. */
    char set_world[64], set_variant[64];
    snprintf(set_world, sizeof set_world, "cluster.world_size=%d", size);
    snprintf(set_variant, sizeof set_variant, "parallel.variant=%s", variant);
    const char *sets[] = {set_world, set_variant};
    cpc_compile_options opts;
    cpc_compile_options_init(&opts, sizeof opts);
    opts.sets = sets;
    opts.n_sets = 2;
    opts.kernels = cuda; /* the CUDA backend runs the plan's generated kernels */
    cpc_artifact *a = NULL;
    CHECK(cpc_compile_plan_string(PLAN, 0, "toy-model.yaml", &opts, &a, NULL));
    if (rank == 0)
        printf("libcpc %s: %s on %d ranks (ring_degree %d, ulysses_degree %d), %s backend\n", cpc_version(),
               cpc_artifact_variant(a), size, cpc_artifact_ring_degree(a),
               cpc_artifact_ulysses_degree(a), cuda ? "cuda" : "cpu");

    float *W[LAYERS][4];
    for (int l = 0; l < LAYERS; l++)
        for (int m = 0; m < 4; m++) {
            W[l][m] = malloc(sizeof(float) * DM * DM);
            for (int i = 0; i < DM * DM; i++)
                W[l][m][i] = hash_normal((unsigned long)i, 100 + l * 4 + m) / sqrtf((float)DM);
        }

    /* distributed: one rank per process, on the caller's communicator */
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    cpc_rank *r = NULL;
    cpc_rank_options ro;
    cpc_rank_options_init(&ro, sizeof ro);
    if (cuda) {
        ro.backend = CPC_BACKEND_CUDA;
        ro.cuda_stream = cu.stream;
    }
    CHECK(cpc_rank_new_mpi(a, &comm, &ro, &r));
    long T = 0;
    float *x = shard_input(a, rank, &T);
    model(r, x, T, W, cuda);
    cpc_rank_free(r);

    /* gather every rank's rows (with their global positions) to rank 0 */
    cpc_token_run runs[16];
    int n = 0;
    CHECK(cpc_artifact_shard_runs(a, rank, runs, 16, &n));
    int count = (int)(T * DM), *counts = NULL, *displs = NULL;
    float *all = NULL;
    if (rank == 0) {
        counts = malloc(sizeof(int) * size), displs = malloc(sizeof(int) * size);
        all = malloc(sizeof(float) * (TEXT + IMAGE) * DM);
    }
    MPI_Gather(&count, 1, MPI_INT, counts, 1, MPI_INT, 0, comm);
    if (rank == 0)
        for (int p = 0, off = 0; p < size; p++)
            displs[p] = off, off += counts[p];
    MPI_Gatherv(x, count, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, comm);

    int status = 0;
    if (rank == 0) {
        /* reorder to global positions */
        float *dist = malloc(sizeof(float) * (TEXT + IMAGE) * DM);
        for (int p = 0; p < size; p++) {
            cpc_token_run pr[16];
            int pn = 0;
            CHECK(cpc_artifact_shard_runs(a, p, pr, 16, &pn));
            long o = displs[p] / DM;
            for (int i = 0; i < pn; i++)
                for (long j = 0; j < pr[i].len; j++, o++)
                    memcpy(&dist[(pr[i].start + j) * DM], &all[o * DM], sizeof(float) * DM);
        }
        /* the same model on one rank */
        const char *one[] = {"cluster.world_size=1", "parallel.variant=none"};
        cpc_compile_options o1;
        cpc_compile_options_init(&o1, sizeof o1);
        o1.sets = one;
        o1.n_sets = 2;
        cpc_artifact *a1 = NULL;
        CHECK(cpc_compile_plan_string(PLAN, 0, "toy-model.yaml", &o1, &a1, NULL));
        cpc_local_world *w = NULL;
        CHECK(cpc_local_world_new(a1, &w));
        cpc_rank *r1 = NULL;
        CHECK(cpc_rank_new_local(a1, w, 0, NULL, &r1));
        long T1 = 0;
        float *x1 = shard_input(a1, 0, &T1);
        model(r1, x1, T1, W, false);
        double num = 0, den = 0;
        for (long i = 0; i < T1 * DM; i++) {
            double d = (double)dist[i] - x1[i];
            num += d * d, den += (double)x1[i] * x1[i];
        }
        double rel = sqrt(num / den);
        bool ok = isfinite(rel) && rel <= 1e-5;
        printf("%d ranks vs 1 rank: relative error %.3g (fp32 limit 1e-5): %s\n", size, rel,
               ok ? "PASS" : "FAIL");
        status = ok ? 0 : 1;
        cpc_rank_free(r1);
        cpc_local_world_free(w);
        cpc_artifact_free(a1);
        free(x1), free(dist), free(all), free(counts), free(displs);
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, comm);
    MPI_Comm_free(&comm);
    for (int l = 0; l < LAYERS; l++)
        for (int m = 0; m < 4; m++)
            free(W[l][m]);
    free(x);
    cpc_artifact_free(a);
    if (cuda)
        cu.stream_destroy(cu.stream);
    MPI_Finalize();
    return status;
}
