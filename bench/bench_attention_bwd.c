/*
 * bench_attention_bwd.c - the single-thread CPU attention backward
 * (runtime/backend/attention_bwd_cpu.c) against the forward
 * (backend_cpu.c) measured in the same run, on the same inputs.
 *
 * For B = 1, S = 4096 (or argv[1]), D = 128, H = 1 and 2, fp32 and bf16,
 * non-causal and causal, prints the forward and backward times, the ratio
 * backward / forward, and the FLOP-normalised efficiency of the backward
 * relative to the forward's: (2.5 F / t_bwd) / (F / t_fwd) with F the
 * forward's FLOPs (4 B S^2 H D, halved if causal; the backward's five
 * products count 2.5 F, SPEC section 10).  The backward time includes delta
 * (rowsum(dO * O), computed once per row).  Goals (issue 16): backward /
 * forward <= 2.8 and efficiency >= 0.7 on one thread; the last line gives
 * the worst case over the grid.  Each figure is the best of `iters` runs
 * (argv[2], default 3) after one warm-up, timed by the calling thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID), as bench_attention.c.
 *
 * Usage: bench_attention_bwd [S [iters]]   (CPC_CPU_ATTN_BWD_TILES=TQxTK and
 * CPC_CPU_ATTN_TILES=TQxTK to try other tile sizes; OpenBLAS is set to one
 * thread here).
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
    /* xorshift64*: benchmark inputs only */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t x = rng_state * 0x2545f4914f6cdd1dull;
    return (float)((double)(x >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench: out of memory\n");
        exit(2);
    }
    return p;
}

static void *rand_dt(cpc_dtype dt, size_t n)
{
    float *f = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        f[i] = frand();
    void *p = xmalloc((dt == CPC_DTYPE_FP32 ? 4 : 2) * n);
    cpc_from_f32_n(p, dt, f, n);
    free(f);
    return p;
}

static void check(cpc_status *st)
{
    if (st) {
        cpc_status_print(st, stderr, "bench_attention_bwd");
        exit(3);
    }
}

typedef struct pair {
    double fwd_ms, bwd_ms;
} pair;

static pair bench_pair(cpc_backend *be, int64_t S, int H, int Hkv, int D, cpc_dtype dt,
                       bool causal, int iters)
{
    size_t nq = (size_t)S * H * D, nkv = (size_t)S * Hkv * D;
    void *q = rand_dt(dt, nq), *k = rand_dt(dt, nkv), *v = rand_dt(dt, nkv);
    void *dout = rand_dt(dt, nq);
    float *o = xmalloc(sizeof(float) * nq), *lse = xmalloc(sizeof(float) * (size_t)H * S);
    float *delta = xmalloc(sizeof(float) * (size_t)H * S);
    float *dq = xmalloc(sizeof(float) * nq), *dk = xmalloc(sizeof(float) * nkv);
    float *dv = xmalloc(sizeof(float) * nkv);
    cpc_run run = {0, S};
    cpc_attn_args a = {.p.B = 1, .p.sq = S, .p.skv = S, .p.hq = H, .p.hkv = Hkv, .p.d = D,
                       .p.group = H / Hkv, .p.dtype = dt, .p.q = q, .p.k = k, .p.v = v,
                       .p.q_bstride = (int64_t)nq, .p.kv_bstride = (int64_t)nkv, .o = o, .lse = lse,
                       .p.scale = 1.0f / sqrtf((float)D), .p.causal = causal,
                       .p.q_runs = &run, .p.n_q_runs = 1, .p.kv_runs = &run, .p.n_kv_runs = 1};
    cpc_attn_bwd_args g = {.p.B = 1, .p.sq = S, .p.skv = S, .p.hq = H, .p.hkv = Hkv, .p.d = D,
                           .p.group = H / Hkv, .p.dtype = dt, .p.q = q, .p.k = k, .p.v = v,
                           .dout = dout, .p.q_bstride = (int64_t)nq, .p.kv_bstride = (int64_t)nkv,
                           .dout_bstride = (int64_t)nq, .out = o, .out_dtype = CPC_DTYPE_FP32,
                           .out_bstride = (int64_t)nq, .lse = lse, .delta = delta,
                           .compute_delta = true, .dq = dq, .dk = dk, .dv = dv,
                           .p.scale = 1.0f / sqrtf((float)D), .p.causal = causal,
                           .p.q_runs = &run, .p.n_q_runs = 1, .p.kv_runs = &run, .p.n_kv_runs = 1};
    double bf = 1e30, bb = 1e30;
    for (int i = 0; i < iters + 1; i++) { /* interleaved: both see the same machine load */
        double t0 = now();
        check(cpc_backend_attn(be, &a));
        double t1 = now();
        memset(dq, 0, sizeof(float) * nq);
        memset(dk, 0, sizeof(float) * nkv);
        memset(dv, 0, sizeof(float) * nkv);
        double t2 = now();
        check(cpc_backend_attn_bwd(be, &g));
        double t3 = now();
        if (i > 0) {
            bf = t1 - t0 < bf ? t1 - t0 : bf;
            bb = t3 - t2 < bb ? t3 - t2 : bb;
        }
    }
    for (size_t i = 0; i < nq; i++)
        if (!isfinite(dq[i])) {
            fprintf(stderr, "bench: non-finite gradient\n");
            exit(3);
        }
    free(q);
    free(k);
    free(v);
    free(dout);
    free(o);
    free(lse);
    free(delta);
    free(dq);
    free(dk);
    free(dv);
    return (pair){bf * 1e3, bb * 1e3};
}

int main(int argc, char **argv)
{
    int64_t S = argc > 1 ? atoll(argv[1]) : 4096;
    int iters = argc > 2 ? atoi(argv[2]) : 3;
    if (S < 1 || iters < 1) {
        fprintf(stderr, "usage: bench_attention_bwd [S [iters]]\n");
        return 2;
    }
    cpc_cpu_backend_single_thread_blas();
    const int D = 128;
    printf("OpenBLAS: %s, 1 thread\n", openblas_get_config());
    cpc_backend *be = NULL;
    check(cpc_cpu_backend_create(&be));
    printf("attention backward vs forward, B=1 S=%lld D=%d, best of %d (CPU time):\n",
           (long long)S, D, iters);
    double worst_ratio = 0, worst_eff = 1e30;
    const cpc_dtype dts[2] = {CPC_DTYPE_FP32, CPC_DTYPE_BF16};
    for (int ci = 0; ci < 2; ci++)
        for (int di = 0; di < 2; di++)
            for (int H = 1; H <= 2; H++) {
                bool causal = ci == 1;
                pair r = bench_pair(be, S, H, H, D, dts[di], causal, iters);
                double fl = 4.0 * (double)S * (double)S * H * D * (causal ? 0.5 : 1.0);
                double ratio = r.bwd_ms / r.fwd_ms, eff = 2.5 / ratio;
                worst_ratio = ratio > worst_ratio ? ratio : worst_ratio;
                worst_eff = eff < worst_eff ? eff : worst_eff;
                printf("  %-4s H=%d %-10s: fwd %8.1f ms %6.1f GFLOP/s  bwd %8.1f ms %6.1f "
                       "GFLOP/s  bwd/fwd %.2f  efficiency %.2f\n",
                       dts[di] == CPC_DTYPE_FP32 ? "fp32" : "bf16", H,
                       causal ? "causal" : "non-causal", r.fwd_ms, fl / r.fwd_ms / 1e6, r.bwd_ms,
                       2.5 * fl / r.bwd_ms / 1e6, ratio, eff);
            }
    printf("info (not in the worst case):\n");
    pair rg = bench_pair(be, S / 2, 4, 1, D, CPC_DTYPE_BF16, false, 1);
    printf("  bf16 S=%lld H=4 Hkv=1 (GQA): bwd/fwd %.2f\n", (long long)(S / 2),
           rg.bwd_ms / rg.fwd_ms);
    pair r64 = bench_pair(be, S / 2, 2, 2, 64, CPC_DTYPE_BF16, false, 1);
    printf("  bf16 S=%lld H=2 D=64       : bwd/fwd %.2f\n", (long long)(S / 2),
           r64.bwd_ms / r64.fwd_ms);
    pair rb = bench_pair(be, 512, 24, 24, D, CPC_DTYPE_BF16, false, iters);
    printf("  ring-step block 512 x 512 keys, H=24, bf16: bwd/fwd %.2f\n", rb.bwd_ms / rb.fwd_ms);
    printf("WORST bwd/fwd %.2f (goal <= 2.8), efficiency %.2f (goal >= 0.70)\n", worst_ratio,
           worst_eff);
    cpc_backend_destroy(be);
    return 0;
}
