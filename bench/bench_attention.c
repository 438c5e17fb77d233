/*
 * bench_attention.c - single-thread CPU attention (runtime/backend/backend_cpu.c)
 * against single-thread OpenBLAS SGEMM measured in the same run.
 *
 * Prints SGEMM GFLOP/s for 1024^3 and for the two tile products the
 * attention issues (S = Q K^T: TQ x TK x D, "NT"; O += P V: TQ x D x TK,
 * "NN"), then the attention GFLOP/s for B = 1, S = 4096 (or argv[1]),
 * H = 1 and 2, D = 128, fp32 and bf16, non-causal (FLOPs = 4 B S^2 H D,
 * the convention of SPEC section 5), and the ratio attention / SGEMM 1024^3.
 * Causal and GQA runs are printed for information (causal FLOPs halved).
 * Goal: ratio >= 0.5 (stretch 0.7).  Each figure is the best of `iters`
 * runs (argv[2], default 3) after one warm-up.  Times are the calling
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID; OpenBLAS runs in that thread),
 * so that other processes sharing the cores disturb the ratio less than they
 * would disturb wall-clock figures.
 *
 * Usage: bench_attention [S [iters]]   (CPC_CPU_ATTN_TILES=TQxTK to try
 * other tile sizes; OpenBLAS is set to one thread here).
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "dtype.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
    /* xorshift64*: benchmark inputs only (values do not matter for speed) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t x = rng_state * 0x2545f4914f6cdd1dull;
    return (float)((double)(x >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static float *rand_buf(size_t n)
{
    float *p = malloc(sizeof(float) * n);
    if (!p) {
        fprintf(stderr, "bench: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

/* GFLOP/s of C = A op(B), M x N x K, repeated for at least `secs`. */
static double sgemm_gflops(int M, int N, int K, bool transb, double secs)
{
    float *A = rand_buf((size_t)M * K), *B = rand_buf((size_t)K * N), *C = rand_buf((size_t)M * N);
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        int it = 0;
        double t0 = now(), t;
        do {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, transb ? CblasTrans : CblasNoTrans, M, N, K,
                        1.0f, A, K, B, transb ? K : N, 0.0f, C, N);
            it++;
        } while ((t = now() - t0) < secs / 3);
        double g = 2.0 * M * N * K * it / t / 1e9;
        best = g > best ? g : best;
    }
    free(A);
    free(B);
    free(C);
    return best;
}

typedef struct attn_run {
    double gflops, ms;
} attn_run;

static attn_run bench_attn(cpc_backend *be, int64_t S, int H, int Hkv, int D, cpc_dtype dt,
                           bool causal, int iters)
{
    size_t nq = (size_t)S * H * D, nkv = (size_t)S * Hkv * D;
    float *qf = rand_buf(nq), *kf = rand_buf(nkv), *vf = rand_buf(nkv);
    size_t es = dt == CPC_DTYPE_FP32 ? 4 : 2;
    void *q = malloc(es * nq), *k = malloc(es * nkv), *v = malloc(es * nkv);
    float *o = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * (size_t)H * S);
    if (!q || !k || !v || !o || !lse) {
        fprintf(stderr, "bench: out of memory\n");
        exit(2);
    }
    cpc_from_f32_n(q, dt, qf, nq);
    cpc_from_f32_n(k, dt, kf, nkv);
    cpc_from_f32_n(v, dt, vf, nkv);
    cpc_run run = {0, S};
    cpc_attn_args a = {.p.B = 1, .p.sq = S, .p.skv = S, .p.hq = H, .p.hkv = Hkv, .p.d = D,
                       .p.group = H / Hkv, .p.dtype = dt, .p.q = q, .p.k = k, .p.v = v,
                       .p.q_bstride = (int64_t)nq, .p.kv_bstride = (int64_t)nkv, .o = o, .lse = lse,
                       .p.scale = 1.0f / sqrtf((float)D), .p.causal = causal,
                       .p.q_runs = &run, .p.n_q_runs = 1, .p.kv_runs = &run, .p.n_kv_runs = 1};
    double best = 1e30;
    for (int i = 0; i < iters + 1; i++) {
        double t0 = now();
        cpc_status *st = cpc_backend_attn(be, &a);
        double t = now() - t0;
        if (st) {
            cpc_status_print(st, stderr, "bench_attention");
            exit(3);
        }
        if (i > 0 && t < best)
            best = t;
    }
    for (size_t i = 0; i < nq; i++)
        if (!isfinite(o[i])) {
            fprintf(stderr, "bench: non-finite output\n");
            exit(3);
        }
    double flops = 4.0 * (double)S * (double)S * H * D * (causal ? 0.5 : 1.0);
    free(qf);
    free(kf);
    free(vf);
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    return (attn_run){flops / best / 1e9, best * 1e3};
}

int main(int argc, char **argv)
{
    int64_t S = argc > 1 ? atoll(argv[1]) : 4096;
    int iters = argc > 2 ? atoi(argv[2]) : 3;
    if (S < 1 || iters < 1) {
        fprintf(stderr, "usage: bench_attention [S [iters]]\n");
        return 2;
    }
    cpc_cpu_backend_single_thread_blas();
    int tq = 256, tk = 512;
    const char *env = getenv("CPC_CPU_ATTN_TILES");
    if (env && sscanf(env, "%dx%d", &tq, &tk) != 2) {
        tq = 256;
        tk = 512;
    }
    const int D = 128;
    printf("OpenBLAS: %s, 1 thread\n", openblas_get_config());
    double g1024 = sgemm_gflops(1024, 1024, 1024, false, 1.5);
    double gqk = sgemm_gflops(tq, tk, D, true, 1.0);
    double gpv = sgemm_gflops(tq, D, tk, false, 1.0);
    printf("sgemm 1024x1024x1024 NN          : %7.1f GFLOP/s\n", g1024);
    printf("sgemm %4dx%4dx%4d NT (S=QK^T)   : %7.1f GFLOP/s\n", tq, tk, D, gqk);
    printf("sgemm %4dx%4dx%4d NN (O+=PV)    : %7.1f GFLOP/s\n", tq, D, tk, gpv);

    cpc_backend *be = NULL;
    cpc_status *st = cpc_cpu_backend_create(&be);
    if (st) {
        cpc_status_print(st, stderr, "bench_attention");
        return 3;
    }
    printf("attention B=1 S=%lld D=%d non-causal, tiles %dx%d, best of %d:\n", (long long)S, D,
           tq, tk, iters);
    double worst_ratio = 1e30;
    const cpc_dtype dts[2] = {CPC_DTYPE_FP32, CPC_DTYPE_BF16};
    for (int di = 0; di < 2; di++)
        for (int H = 1; H <= 2; H++) {
            attn_run r = bench_attn(be, S, H, H, D, dts[di], false, iters);
            double ratio = r.gflops / g1024;
            worst_ratio = ratio < worst_ratio ? ratio : worst_ratio;
            printf("  %-4s H=%d: %8.1f ms  %7.1f GFLOP/s  ratio to sgemm %.3f\n",
                   dts[di] == CPC_DTYPE_FP32 ? "fp32" : "bf16", H, r.ms, r.gflops, ratio);
        }
    printf("info (not in the ratio):\n");
    attn_run rc = bench_attn(be, S, 2, 2, D, CPC_DTYPE_BF16, true, iters);
    printf("  bf16 H=2 causal     : %8.1f ms  %7.1f GFLOP/s (causal FLOPs halved)\n", rc.ms,
           rc.gflops);
    attn_run rg = bench_attn(be, S, 4, 1, D, CPC_DTYPE_BF16, false, 1);
    printf("  bf16 H=4 Hkv=1 (GQA): %8.1f ms  %7.1f GFLOP/s\n", rg.ms, rg.gflops);
    attn_run r64 = bench_attn(be, S, 2, 2, 64, CPC_DTYPE_BF16, false, 1);
    printf("  bf16 H=2 D=64       : %8.1f ms  %7.1f GFLOP/s\n", r64.ms, r64.gflops);
    attn_run r24f = bench_attn(be, S / 4, 24, 24, D, CPC_DTYPE_FP32, false, 1);
    attn_run r24b = bench_attn(be, S / 4, 24, 24, D, CPC_DTYPE_BF16, false, 1);
    printf("  S=%lld H=24 (FLUX heads, rows strided by H*D): fp32 %7.1f, bf16 %7.1f GFLOP/s\n",
           (long long)(S / 4), r24f.gflops, r24b.gflops);
    attn_run rblk = bench_attn(be, 512, 24, 24, D, CPC_DTYPE_BF16, false, iters);
    printf("  ring-step block 512 x 512 keys, H=24, bf16: %7.1f GFLOP/s\n", rblk.gflops);
    printf("RATIO attention/sgemm (worst of fp32/bf16, H=1..2): %.3f (goal >= 0.5, stretch 0.7)\n",
           worst_ratio);
    cpc_backend_destroy(be);
    return 0;
}
