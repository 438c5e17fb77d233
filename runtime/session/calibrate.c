/* calibrate.c - see calibrate.h */
#include "calibrate.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "dtype.h"
#include "executor.h"
#include "plan_load.h"
#include "schedule.h"
#include "rng.h"
#include "transport_local.h"

#ifdef CPC_HAVE_MPI
#include "transport_mpi.h"
#endif

/* ---- sizes -------------------------------------------------------------------- */

typedef struct cal_sizes {
    int64_t S;          /* attention block: S x S tokens */
    int H, D;           /* heads, head_dim */
    int64_t S_small;    /* the small block of the fit: S_small x S_small tokens */
    int H_small;        /*   and H_small heads */
    int reps;           /* repetitions of every timed measurement */
    int64_t mem_T;      /* memory ops: [1, mem_T, mem_H, D] fp32 */
    int mem_H;
    double mem_min_s;   /* each memory op is repeated for at least this long */
    size_t p2p_big;     /* bytes of the large ping-pong message */
    int p2p_small_reps; /* round trips of the small message */
    size_t coll_bytes;  /* collectives: bytes per member pair */
    int D_narrow;       /* the narrow block: S x S tokens, H heads, this head_dim (the
                           softmax's share grows as head_dim shrinks) */
    int gemm_m, gemm_k, gemm_n; /* the dense GEMM: [m tokens, k] x [k, n], fp32 */
} cal_sizes;

/* The big block lasts ~30 ms on one core (~8 ms --quick): several scheduler
 * time slices, so that the ranks running it at once really share the cores. */
static const cal_sizes full_sizes = {1024, 8, 128, 128, 32, 9, 1024, 8, 0.05, 8u << 20, 200, 1u << 20,
                                     16, 512, 1024, 1024};
static const cal_sizes quick_sizes = {1024, 2, 128, 128, 8, 3, 256, 8, 0.01, 1u << 20, 50, 128u << 10,
                                      16, 256, 512, 512};

/* Tags of the calibration's point-to-point messages. */
enum { TAG_PING = 7101, TAG_PONG = 7102 };

static double now_ms(void) { return cpc_exec_now_us() * 1e-3; }

/* CPU time of the calling thread (ms): what a measurement costs whatever else
 * runs on the machine. */
static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void logf_(FILE *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(FILE *log, const char *fmt, ...)
{
    if (!log)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(log, "cprun --calibrate: ");
    vfprintf(log, fmt, ap);
    fputc('\n', log);
    fflush(log);
    va_end(ap);
}

/* ---- an attention block ---------------------------------------------------------- */

typedef struct attn_block {
    void *q, *k, *v;
    float *o, *lse;
    cpc_run run_q, run_kv;
    cpc_attn_args a;
} attn_block;

static void block_free(attn_block *b)
{
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->o);
    free(b->lse);
    memset(b, 0, sizeof *b);
}

/* B = 1, sq x skv tokens, H heads (no GQA), head_dim D, random normal inputs. */
static cpc_status *block_make(attn_block *b, int64_t sq, int64_t skv, int H, int D, cpc_dtype dt)
{
    memset(b, 0, sizeof *b);
    size_t es = (size_t)cpc_dtype_size(dt);
    size_t nq = (size_t)sq * (size_t)H * (size_t)D, nkv = (size_t)skv * (size_t)H * (size_t)D;
    b->q = malloc(nq * es);
    b->k = malloc(nkv * es);
    b->v = malloc(nkv * es);
    b->o = malloc(nq * sizeof(float));
    b->lse = malloc((size_t)sq * (size_t)H * sizeof(float));
    if (!b->q || !b->k || !b->v || !b->o || !b->lse) {
        block_free(b);
        return cpc_error(CPC_E_NOMEM, "calibrate: out of memory for the attention block");
    }
    cpc_rng_fill(b->q, dt, 1, CPC_RNG_Q, 0, (int64_t)nq);
    cpc_rng_fill(b->k, dt, 1, CPC_RNG_K, 0, (int64_t)nkv);
    cpc_rng_fill(b->v, dt, 1, CPC_RNG_V, 0, (int64_t)nkv);
    b->run_q = (cpc_run){0, sq};
    b->run_kv = (cpc_run){0, skv};
    b->a = (cpc_attn_args){.p.B = 1, .p.sq = sq, .p.skv = skv, .p.hq = H, .p.hkv = H, .p.d = D, .p.group = 1,
                           .p.dtype = dt, .p.q = b->q, .p.k = b->k, .p.v = b->v,
                           .p.q_bstride = (int64_t)nq, .p.kv_bstride = (int64_t)nkv, .o = b->o,
                           .lse = b->lse, .p.scale = 1.0f / sqrtf((float)D),
                           .p.q_runs = &b->run_q, .p.n_q_runs = 1, .p.kv_runs = &b->run_kv,
                           .p.n_kv_runs = 1};
    return NULL;
}

static double block_flops(const attn_block *b)
{
    return 4.0 * (double)b->a.p.sq * (double)b->a.p.skv * b->a.p.hq * b->a.p.d;
}

/* The bytes the cost model charges an attn op at attn_io_gbps: Q, K, V in
 * their dtype, O and LSE in fp32 (cost.c). */
static double block_bytes(const attn_block *b)
{
    double es = cpc_dtype_size(b->a.p.dtype);
    return (double)b->a.p.sq * b->a.p.hq * b->a.p.d * es + 2.0 * (double)b->a.p.skv * b->a.p.hkv * b->a.p.d * es +
           (double)b->a.p.sq * b->a.p.hq * (b->a.p.d + 1) * 4.0;
}

/* Median CPU time (ms) of `reps` calls of each of the n blocks, alternately
 * (so that all see the same conditions), after one untimed warm-up call of
 * each. */
static cpc_status *time_attn_blocks(cpc_backend *be, attn_block *const *blk, int n, int reps, double *ms)
{
    double t[4][64];
    if (reps > 64)
        reps = 64;
    if (n > 4)
        n = 4;
    cpc_status *st = NULL;
    for (int b = 0; b < n && !st; b++)
        st = cpc_backend_attn(be, &blk[b]->a);
    for (int i = 0; i < reps && !st; i++)
        for (int b = 0; b < n && !st; b++) {
            double t0 = cpu_ms();
            st = cpc_backend_attn(be, &blk[b]->a);
            t[b][i] = cpu_ms() - t0;
        }
    if (st)
        return st;
    for (int b = 0; b < n; b++)
        ms[b] = median(t[b], reps);
    return NULL;
}

/* Score elements of a block (B x sq x skv x heads): the softmax's work. */
static double block_scores(const attn_block *b)
{
    return (double)b->a.p.sq * (double)b->a.p.skv * b->a.p.hq;
}

/* Fits t = flops / rate + bytes / io over a big and a small block (times in
 * ms): *gflops and *io_gbps.  When the two times do not determine both
 * (noise: a negative term), the whole time is put on the rate (io = 0). */
static void fit_attn(const attn_block *big, double t_big, const attn_block *small, double t_small,
                     double *gflops, double *io_gbps)
{
    double Fb = block_flops(big), Bb = block_bytes(big);
    double Fs = block_flops(small), Bs = block_bytes(small);
    double tb = t_big * 1e-3, ts = t_small * 1e-3;
    double det = Fb * Bs - Fs * Bb;
    double x = det != 0 ? (tb * Bs - ts * Bb) / det : 0; /* s per FLOP */
    double y = det != 0 ? (Fb * ts - Fs * tb) / det : 0; /* s per byte */
    if (!(x > 0) || !(y > 0)) {
        x = tb / Fb;
        y = 0;
    }
    *gflops = 1.0 / x / 1e9;
    *io_gbps = y > 0 ? 1.0 / y / 1e9 : 0;
}

/* Fits t = flops / rate + bytes / io + scores / softmax over three blocks
 * (big, small, narrow; times in ms) by Cramer's rule: *gflops, *io_gbps,
 * *softmax_gps (G score elements per second).  When noise makes a term
 * non-positive, falls back to fit_attn over the big and small blocks
 * (softmax 0). */
static void fit_attn3(attn_block *const *blk, const double *t_ms, double *gflops, double *io_gbps,
                      double *softmax_gps)
{
    double A[3][3], t[3];
    for (int i = 0; i < 3; i++) {
        A[i][0] = block_flops(blk[i]);
        A[i][1] = block_bytes(blk[i]);
        A[i][2] = block_scores(blk[i]);
        t[i] = t_ms[i] * 1e-3;
    }
#define DET3(m) ((m)[0][0] * ((m)[1][1] * (m)[2][2] - (m)[1][2] * (m)[2][1]) -               \
                 (m)[0][1] * ((m)[1][0] * (m)[2][2] - (m)[1][2] * (m)[2][0]) +               \
                 (m)[0][2] * ((m)[1][0] * (m)[2][1] - (m)[1][1] * (m)[2][0]))
    double det = DET3(A), sol[3];
    for (int c = 0; c < 3; c++) {
        double M[3][3];
        memcpy(M, A, sizeof M);
        for (int i = 0; i < 3; i++)
            M[i][c] = t[i];
        sol[c] = det != 0 ? DET3(M) / det : 0;
    }
#undef DET3
    if (sol[0] > 0 && sol[1] > 0 && sol[2] > 0) {
        *gflops = 1.0 / sol[0] / 1e9;
        *io_gbps = 1.0 / sol[1] / 1e9;
        *softmax_gps = 1.0 / sol[2] / 1e9;
        return;
    }
    fit_attn(blk[0], t_ms[0], blk[1], t_ms[1], gflops, io_gbps);
    *softmax_gps = 0;
}

/* Median CPU time (ms) of an OpenBLAS SGEMM [m, k] x [k, n] (one thread, as
 * in a rank), and its rate in GFLOP/s per CPU second. */
static cpc_status *time_gemm(const cal_sizes *z, double *ms, double *gflops)
{
    size_t m = (size_t)z->gemm_m, k = (size_t)z->gemm_k, n = (size_t)z->gemm_n;
    float *a = malloc(m * k * sizeof(float)), *b = malloc(k * n * sizeof(float));
    float *c = malloc(m * n * sizeof(float));
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return cpc_error(CPC_E_NOMEM, "calibrate: out of memory for the GEMM");
    }
    cpc_rng_fill(a, CPC_DTYPE_FP32, 3, CPC_RNG_Q, 0, (int64_t)(m * k));
    cpc_rng_fill(b, CPC_DTYPE_FP32, 3, CPC_RNG_K, 0, (int64_t)(k * n));
    double t[64];
    int reps = z->reps < 64 ? z->reps : 64;
    for (int i = -1; i < reps; i++) { /* i = -1: warm-up */
        double t0 = cpu_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k, b,
                    (int)n, 0.0f, c, (int)n);
        if (i >= 0)
            t[i] = cpu_ms() - t0;
    }
    *ms = median(t, reps);
    *gflops = *ms > 0 ? 2.0 * (double)m * (double)n * (double)k / (*ms * 1e-3) / 1e9 : 0;
    free(a), free(b), free(c);
    return NULL;
}

/* The executor's own cost per op (what cprun pays per op beyond its work):
 * a one-rank program of the smallest shape (variant none, one token, one
 * head, head_dim D) run `runs` times through the executor with the CPU
 * backend; *us = median CPU time per run / ops executed per run. */
static cpc_status *time_executor(const cal_sizes *z, cpc_backend *be, int runs, double *us, int *ops)
{
    char text[256];
    snprintf(text, sizeof text,
             "version: 1\nmodel: {heads: 1, head_dim: %d, dtype: bf16}\ninput: {tokens: 1}\n"
             "cluster: {world_size: 1, device: cpu}\nparallel: {variant: none}\n",
             z->D);
    cpc_plan *plan = NULL;
    cpc_program *prog = NULL;
    cpc_exec *ex = NULL, *ex_ev = NULL;
    void *in[3] = {NULL, NULL, NULL};
    double t[64];
    if (runs > 64)
        runs = 64;
    cpc_status *st = cpc_plan_load_string(text, strlen(text), "calibrate.yaml", NULL, 0, &plan);
    if (!cpc_status_has_error(st)) {
        cpc_status_free(st);
        st = cpc_schedule_build(plan, CPC_VARIANT_NONE, 1, 1, &prog);
    }
    cpc_exec_config cfg = {.prog = prog, .rank = 0, .backend = be, .transport = NULL, .scale = 0,
                           .kv_mask = NULL, .record_events = false};
    cpc_exec_config cfg_ev = cfg;
    cfg_ev.record_events = true;
    if (!st && !(st = cpc_exec_create(&cfg, &ex)))
        st = cpc_exec_create(&cfg_ev, &ex_ev);
    const cpc_buf_role roles[3] = {CPC_ROLE_Q, CPC_ROLE_K, CPC_ROLE_V};
    for (int r = 0; r < 3 && !st; r++) {
        size_t n = cpc_exec_input_bytes(ex, roles[r]);
        if (!(in[r] = calloc(n > 0 ? n : 1, 1)))
            st = cpc_error(CPC_E_NOMEM, "calibrate: out of memory");
        else if (!(st = cpc_exec_bind_input(ex, roles[r], in[r], n)))
            st = cpc_exec_bind_input(ex_ev, roles[r], in[r], n);
    }
    cpc_exec_stats s;
    if (!st && !(st = cpc_exec_reset(ex_ev)) && !(st = cpc_exec_run(ex_ev, &s)))
        *ops = s.n_events;
    for (int i = -1; i < runs && !st; i++) { /* i = -1: warm-up */
        if ((st = cpc_exec_reset(ex)))
            break;
        double t0 = cpu_ms();
        st = cpc_exec_run(ex, NULL);
        if (i >= 0)
            t[i] = cpu_ms() - t0;
    }
    if (!st)
        *us = *ops > 0 ? median(t, runs) * 1e3 / *ops : 0;
    if (ex)
        cpc_exec_destroy(ex);
    if (ex_ev)
        cpc_exec_destroy(ex_ev);
    for (int r = 0; r < 3; r++)
        free(in[r]);
    cpc_program_free(prog);
    cpc_plan_free(plan);
    if (st)
        cpc_status_prefix(st, "calibrate: the executor's cost per op");
    return st;
}

/* ---- single-rank measurements ------------------------------------------------------ */

/* Median time per call (us) of a tiny op, in batches of `per` calls. */
static cpc_status *time_tiny(cpc_backend *be, attn_block *tiny, cpc_merge_args *m, bool merge,
                             int batches, int per, double *us)
{
    double t[16];
    if (batches > 16)
        batches = 16;
    cpc_status *st = NULL;
    for (int i = 0; i < batches && !st; i++) {
        double t0 = cpu_ms();
        for (int j = 0; j < per && !st; j++)
            st = merge ? cpc_backend_merge(be, m) : cpc_backend_attn(be, &tiny->a);
        t[i] = (cpu_ms() - t0) * 1e3 / per;
    }
    if (!st)
        *us = median(t, batches);
    return st;
}

typedef enum { MEM_MERGE, MEM_CONVERT, MEM_STRIDED } mem_op;

/* GB/s of one memory-bound op in the bytes the cost model charges for it. */
static cpc_status *time_mem(cpc_backend *be, mem_op op, const cal_sizes *z, double *gbps)
{
    int64_t T = z->mem_T, h = z->mem_H, D = z->D;
    size_t n = (size_t)(T * h * D), nl = (size_t)(T * h);
    float *acc = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float));
    float *al = malloc(nl * sizeof(float)), *ol = malloc(nl * sizeof(float));
    uint16_t *half = malloc(n * sizeof(uint16_t)), *half2 = malloc(n * sizeof(uint16_t));
    cpc_status *st = NULL;
    if (!acc || !o || !al || !ol || !half || !half2) {
        st = cpc_error(CPC_E_NOMEM, "calibrate: out of memory for the memory-bound ops");
        goto out;
    }
    cpc_rng_fill(acc, CPC_DTYPE_FP32, 2, CPC_RNG_Q, 0, (int64_t)n);
    cpc_rng_fill(o, CPC_DTYPE_FP32, 2, CPC_RNG_K, 0, (int64_t)n);
    cpc_rng_fill(al, CPC_DTYPE_FP32, 2, CPC_RNG_V, 0, (int64_t)nl);
    cpc_rng_fill(ol, CPC_DTYPE_FP32, 2, CPC_RNG_MASK, 0, (int64_t)nl);
    cpc_from_f32_n(half, CPC_DTYPE_BF16, acc, n);
    double bytes;
    cpc_merge_args m = {.B = 1, .s = T, .h = (int)h, .d = (int)D, .acc = acc, .acc_lse = al,
                        .o = o, .lse = ol};
    switch (op) {
    case MEM_MERGE: /* in: o + lse; out (read and written): acc + acc_lse */
        bytes = (double)(n + nl) * 4.0 * 3.0;
        break;
    case MEM_CONVERT: /* fp32 in + bf16 out */
        bytes = (double)n * 6.0;
        break;
    default: /* an all-to-all pack of bf16 [T, h, D] into 4 head groups: the whole buffer */
        bytes = (double)n * 2.0;
        break;
    }
    double t[32];
    int reps = 0;
    double t_start = cpu_ms();
    while (reps < 32 && (reps < 3 || cpu_ms() - t_start < z->mem_min_s * 1e3)) {
        double t0 = cpu_ms();
        if (op == MEM_MERGE) {
            st = cpc_backend_merge(be, &m);
        } else if (op == MEM_CONVERT) {
            st = cpc_backend_convert(be, half2, CPC_DTYPE_BF16, acc, CPC_DTYPE_FP32, n);
        } else {
            int64_t hj = h / 4 > 0 ? h / 4 : 1;
            for (int64_t j = 0; j * hj < h && !st; j++)
                st = cpc_backend_copy_strided(be, half2 + (size_t)(j * T * hj * D), half + j * hj * D,
                                          2, 1, T, 1, hj * D, T * hj * D, hj * D, 0, T * h * D,
                                          h * D, 0);
        }
        if (st)
            goto out;
        t[reps++] = cpu_ms() - t0;
        /* keep the merge inputs finite: acc_lse grows by log 2 at most per call */
        if (op == MEM_MERGE)
            for (size_t i = 0; i < nl; i++)
                al[i] = ol[i];
    }
    double ms = median(t, reps);
    *gbps = ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0;
out:
    free(acc);
    free(o);
    free(al);
    free(ol);
    free(half);
    free(half2);
    return st;
}

static cpc_status *single_rank(const cal_sizes *z, FILE *log, cpc_calibration *c)
{
    cpc_backend *be = NULL;
    attn_block blk[6] = {{0}}, tiny = {0};
    float *m_acc = NULL;
    cpc_status *st = cpc_cpu_backend_create(&be);
    if (st)
        return st;
    /* attention: a big, a small (same bytes, 8x fewer FLOPs) and a narrow
     * block (the big one's scores at head_dim D_narrow) per dtype */
    for (int d = 0; d < 2 && !st; d++) {
        cpc_dtype dt = d == 0 ? CPC_DTYPE_BF16 : CPC_DTYPE_FP32;
        if (!(st = block_make(&blk[3 * d], z->S, z->S, z->H, z->D, dt)) &&
            !(st = block_make(&blk[3 * d + 1], z->S_small, z->S_small, z->H_small, z->D, dt)))
            st = block_make(&blk[3 * d + 2], z->S, z->S, z->H, z->D_narrow, dt);
    }
    if (st || (st = block_make(&tiny, 1, 1, 1, z->D, CPC_DTYPE_BF16)))
        goto out;
    for (int d = 0; d < 2; d++) {
        double ms[3];
        attn_block *three[3] = {&blk[3 * d], &blk[3 * d + 1], &blk[3 * d + 2]};
        if ((st = time_attn_blocks(be, three, 3, z->reps, ms)))
            goto out;
        *(d == 0 ? &c->attn_cpu_ms_bf16 : &c->attn_cpu_ms_fp32) = ms[0];
        *(d == 0 ? &c->attn_small_cpu_ms_bf16 : &c->attn_small_cpu_ms_fp32) = ms[1];
        *(d == 0 ? &c->attn_narrow_cpu_ms_bf16 : &c->attn_narrow_cpu_ms_fp32) = ms[2];
        fit_attn3(three, ms, d == 0 ? &c->attn_gflops_bf16 : &c->attn_gflops_fp32,
                  d == 0 ? &c->attn_io_gbps_bf16 : &c->attn_io_gbps_fp32,
                  d == 0 ? &c->attn_softmax_gps_bf16 : &c->attn_softmax_gps_fp32);
        logf_(log, "attention %s, one rank, CPU time: %lldx%lld x %d heads x D %d %.2f ms, %lldx%lld x %d heads %.2f ms, "
                   "D %d %.2f ms -> %.2f GFLOP/s + IO at %.2f GB/s + softmax at %.3f G scores/s",
              d == 0 ? "bf16" : "fp32", (long long)z->S, (long long)z->S, z->H, z->D, ms[0],
              (long long)z->S_small, (long long)z->S_small, z->H_small, ms[1], z->D_narrow, ms[2],
              d == 0 ? c->attn_gflops_bf16 : c->attn_gflops_fp32,
              d == 0 ? c->attn_io_gbps_bf16 : c->attn_io_gbps_fp32,
              d == 0 ? c->attn_softmax_gps_bf16 : c->attn_softmax_gps_fp32);
    }
    if ((st = time_gemm(z, &c->gemm_cpu_ms, &c->gemm_gflops)))
        goto out;
    logf_(log, "dense GEMM (OpenBLAS SGEMM, one thread), CPU time: [%d x %d] x [%d x %d] %.2f ms -> %.2f GFLOP/s",
          z->gemm_m, z->gemm_k, z->gemm_k, z->gemm_n, c->gemm_cpu_ms, c->gemm_gflops);
    m_acc = malloc(4 * (size_t)z->D * sizeof(float));
    if (!m_acc) {
        st = cpc_error(CPC_E_NOMEM, "calibrate: out of memory");
        goto out;
    }
    for (int i = 0; i < 2 * z->D; i++)
        m_acc[i] = 0.5f;
    m_acc[2 * z->D] = m_acc[2 * z->D + 1] = 0.0f;
    cpc_merge_args m = {.B = 1, .s = 1, .h = 1, .d = z->D, .acc = m_acc, .acc_lse = m_acc + 2 * z->D,
                        .o = m_acc + z->D, .lse = m_acc + 2 * z->D + 1};
    if ((st = time_tiny(be, &tiny, NULL, false, 7, 200, &c->tiny_attn_us)) ||
        (st = time_tiny(be, NULL, &m, true, 7, 200, &c->tiny_merge_us)))
        goto out;
    if ((st = time_executor(z, be, 31, &c->exec_op_us, &c->exec_ops)))
        goto out;
    logf_(log, "fixed cost per op, CPU time: minimal attn %.2f us, minimal merge %.2f us; through the "
               "executor (a one-token program of %d ops): %.2f us per op",
          c->tiny_attn_us, c->tiny_merge_us, c->exec_ops, c->exec_op_us);
    if ((st = time_mem(be, MEM_MERGE, z, &c->merge_gbps)) ||
        (st = time_mem(be, MEM_CONVERT, z, &c->convert_gbps)) ||
        (st = time_mem(be, MEM_STRIDED, z, &c->strided_gbps)))
        goto out;
    logf_(log, "memory-bound ops on %.1f MiB buffers, CPU time: merge %.2f GB/s, convert %.2f GB/s, copy_strided %.2f GB/s",
          (double)(z->mem_T * z->mem_H * z->D * 4) / 1048576.0, c->merge_gbps, c->convert_gbps,
          c->strided_gbps);
out:
    free(m_acc);
    for (int i = 0; i < 6; i++)
        block_free(&blk[i]);
    block_free(&tiny);
    cpc_backend_destroy(be);
    return st;
}

/* ---- measurements by every rank ------------------------------------------------------ */

/* Per rank, per repetition times (ms), in this order (M_ALONE, M_ALONE_CPU:
 * rank 0 only; M_ALONE_CPU is CPU time, the others wall time). */
enum { M_ALONE, M_ALONE_CPU, M_SHARED, M_A2A_SMALL, M_A2A, M_AG, M__COUNT };

typedef struct cal_ctx {
    const cal_sizes *z;
    int P;
    cpc_local_world *world;
    cpc_transport **tr;
    cpc_status **st;
    /* rank 0's results */
    double *all;          /* [P][M__COUNT][reps] */
    double p2p_small_us;  /* one way */
    double p2p_big_us;
} cal_ctx;

/* Ping-pong between world ranks 0 and 1: mean one-way time (us). */
static cpc_status *ping_pong(cpc_transport *t, int me, void *buf, size_t bytes, int n, double *us)
{
    cpc_status *st = NULL;
    cpc_request *rq = NULL;
    double t0 = cpc_exec_now_us();
    for (int i = 0; i < n && !st; i++) {
        if (me == 0) {
            if (!(st = cpc_transport_isend(t, CPC_GROUP_WORLD, 1, buf, bytes, TAG_PING, &rq)))
                st = cpc_transport_wait(t, rq);
            if (!st && !(st = cpc_transport_irecv(t, CPC_GROUP_WORLD, 1, buf, bytes, TAG_PONG, &rq)))
                st = cpc_transport_wait(t, rq);
        } else {
            if (!(st = cpc_transport_irecv(t, CPC_GROUP_WORLD, 0, buf, bytes, TAG_PING, &rq)))
                st = cpc_transport_wait(t, rq);
            if (!st && !(st = cpc_transport_isend(t, CPC_GROUP_WORLD, 0, buf, bytes, TAG_PONG, &rq)))
                st = cpc_transport_wait(t, rq);
        }
    }
    *us = (cpc_exec_now_us() - t0) / (2.0 * n);
    return st;
}

static cpc_status *rank_main(cal_ctx *x, int p, cpc_transport *t)
{
    const cal_sizes *z = x->z;
    int P = x->P, reps = z->reps;
    cpc_backend *be = NULL;
    attn_block b = {0};
    char *sbuf = NULL, *rbuf = NULL;
    double *mine = calloc((size_t)(M__COUNT * reps), sizeof *mine);
    size_t *cnt = calloc((size_t)P, sizeof *cnt), *dsp = calloc((size_t)P, sizeof *dsp);
    size_t *cnt2 = calloc((size_t)P, sizeof *cnt2), *dsp2 = calloc((size_t)P, sizeof *dsp2);
    size_t big = z->coll_bytes * (size_t)P;
    if (big < z->p2p_big)
        big = z->p2p_big;
    sbuf = malloc(big);
    rbuf = malloc(big);
    cpc_status *st = NULL;
    if (!mine || !cnt || !dsp || !cnt2 || !dsp2 || !sbuf || !rbuf) {
        st = cpc_error(CPC_E_NOMEM, "calibrate: out of memory");
        goto done;
    }
    memset(sbuf, 1, big);
    memset(rbuf, 0, big);
    if ((st = cpc_cpu_backend_create(&be)) ||
        (st = block_make(&b, z->S, z->S, z->H, z->D, CPC_DTYPE_BF16)))
        goto done;
    /* 1. the bf16 block on rank 0 alone (the others wait in a barrier), then
     * on every rank at once, alternately, so that both see the same load
     * from whatever else runs on the machine */
    if ((st = cpc_backend_attn(be, &b.a)))
        goto done;
    for (int i = 0; i < reps && !st; i++) {
        if (p == 0) {
            double t0 = now_ms(), c0 = cpu_ms();
            st = cpc_backend_attn(be, &b.a);
            mine[M_ALONE_CPU * reps + i] = cpu_ms() - c0;
            mine[M_ALONE * reps + i] = now_ms() - t0;
            if (st)
                break;
        }
        if ((st = cpc_transport_barrier(t, CPC_GROUP_WORLD)))
            break;
        double t0 = now_ms();
        st = cpc_backend_attn(be, &b.a);
        mine[M_SHARED * reps + i] = now_ms() - t0;
        if (!st)
            st = cpc_transport_barrier(t, CPC_GROUP_WORLD);
    }
    block_free(&b);
    if (st)
        goto done;
    /* 2. point to point between ranks 0 and 1 */
    if ((st = cpc_transport_barrier(t, CPC_GROUP_WORLD)))
        goto done;
    if (p < 2) {
        double small_us = 0, big_us = 0, warm;
        if ((st = ping_pong(t, p, sbuf, 8, 5, &warm)) ||
            (st = ping_pong(t, p, sbuf, 8, z->p2p_small_reps, &small_us)) ||
            (st = ping_pong(t, p, sbuf, z->p2p_big, 1, &warm)) ||
            (st = ping_pong(t, p, sbuf, z->p2p_big, reps, &big_us)))
            goto done;
        if (p == 0) {
            x->p2p_small_us = small_us;
            x->p2p_big_us = big_us;
        }
    }
    if ((st = cpc_transport_barrier(t, CPC_GROUP_WORLD)))
        goto done;
    /* 3. all-to-all (8 bytes, then coll_bytes per pair) and all-gather */
    for (int m = M_A2A_SMALL; m <= M_AG && !st; m++) {
        size_t per = m == M_A2A_SMALL ? 8 : z->coll_bytes;
        for (int j = 0; j < P; j++) {
            cnt[j] = per;
            dsp[j] = (size_t)j * per;
        }
        for (int i = -1; i < reps && !st; i++) { /* i = -1: warm-up */
            if ((st = cpc_transport_barrier(t, CPC_GROUP_WORLD)))
                break;
            double t0 = now_ms();
            if (m == M_AG)
                st = cpc_transport_all_gather_v(t, CPC_GROUP_WORLD, sbuf, per, rbuf, cnt, dsp);
            else
                st = cpc_transport_all_to_all_v(t, CPC_GROUP_WORLD, sbuf, cnt, dsp, rbuf, cnt, dsp);
            if (i >= 0)
                mine[m * reps + i] = now_ms() - t0;
        }
    }
    if (st)
        goto done;
    /* 4. everything to rank 0 (an all-gather of the time tables) */
    size_t tb = (size_t)(M__COUNT * reps) * sizeof(double);
    for (int j = 0; j < P; j++) {
        cnt2[j] = tb;
        dsp2[j] = (size_t)j * tb;
    }
    {
        /* only rank 0 keeps the table (x->all); the others receive a copy of their own */
        double *dst = p == 0 ? x->all : malloc(tb * (size_t)P);
        if (!dst) {
            st = cpc_error(CPC_E_NOMEM, "calibrate: out of memory");
            goto done;
        }
        st = cpc_transport_all_gather_v(t, CPC_GROUP_WORLD, mine, tb, dst, cnt2, dsp2);
        if (dst != x->all)
            free(dst);
    }
done:
    if (st && t) {
        cpc_status_prefix(st, "calibrate: rank %d", p);
        cpc_transport_abort(t, st->message);
    }
    block_free(&b);
    if (be)
        cpc_backend_destroy(be);
    free(mine);
    free(cnt);
    free(dsp);
    free(cnt2);
    free(dsp2);
    free(sbuf);
    free(rbuf);
    return st;
}

typedef struct thread_arg {
    cal_ctx *x;
    int p;
} thread_arg;

static void *rank_thread(void *arg)
{
    thread_arg *a = arg;
    a->x->st[a->p] = rank_main(a->x, a->p, a->x->tr[a->p]);
    return NULL;
}

/* Runs rank_main on P local threads; rank 0's gathered table lands in x->all. */
static cpc_status *run_local(cal_ctx *x)
{
    int P = x->P;
    cpc_status *st = cpc_local_world_create(1, P, &x->world);
    if (st)
        return st;
    cpc_local_world_set_timeout(x->world, 600.0);
    x->tr = calloc((size_t)P, sizeof *x->tr);
    x->st = calloc((size_t)P, sizeof *x->st);
    pthread_t *th = calloc((size_t)P, sizeof *th);
    thread_arg *ta = calloc((size_t)P, sizeof *ta);
    bool *started = calloc((size_t)P, sizeof *started);
    if (!x->tr || !x->st || !th || !ta || !started) {
        st = cpc_error(CPC_E_NOMEM, "calibrate: out of memory");
        goto out;
    }
    for (int p = 0; p < P && !st; p++)
        st = cpc_local_endpoint_create(x->world, p, &x->tr[p]);
    for (int p = 0; p < P && !st; p++) {
        ta[p] = (thread_arg){x, p};
        int e = pthread_create(&th[p], NULL, rank_thread, &ta[p]);
        if (e) {
            st = cpc_error(CPC_E_RUNTIME, "calibrate: cannot start the thread of rank %d: %s", p,
                           strerror(e));
            cpc_local_world_abort(x->world, -1, st->message);
        } else {
            started[p] = true;
        }
    }
    for (int p = 0; p < P; p++)
        if (started[p])
            pthread_join(th[p], NULL);
    for (int p = 0; p < P; p++) {
        if (x->st[p] && !st)
            st = x->st[p];
        else
            cpc_status_free(x->st[p]);
    }
out:
    if (x->tr)
        for (int p = 0; p < P; p++)
            if (x->tr[p])
                cpc_transport_destroy(x->tr[p]);
    free(x->tr);
    free(x->st);
    free(th);
    free(ta);
    free(started);
    cpc_local_world_destroy(x->world);
    x->world = NULL;
    return st;
}

/* ---- the profile ------------------------------------------------------------------------ */

/* Median over repetitions of the slowest rank's time (ms) of measurement m. */
static double slowest(const cal_ctx *x, int m)
{
    int reps = x->z->reps;
    double v[64];
    for (int i = 0; i < reps && i < 64; i++) {
        double w = 0;
        for (int p = 0; p < x->P; p++) {
            double d = x->all[((size_t)p * M__COUNT + (size_t)m) * (size_t)reps + (size_t)i];
            w = d > w ? d : w;
        }
        v[i] = w;
    }
    return median(v, reps < 64 ? reps : 64);
}

/* Builds the profile.  The single-rank figures were measured in CPU time
 * (stable whatever else runs); `wall` = wall / CPU time of one rank alone
 * (>= 1: the share of a core that one rank really gets now) turns them into
 * wall-clock figures, and the slowdown of P ranks at once (wall time, measured
 * alternately with the lone rank) says how ranks share the cores. */
static void build_profile(const cal_ctx *x, cpc_calibration *c)
{
    const cal_sizes *z = x->z;
    int P = x->P;
    cpc_device_profile *d = &c->profile;
    cpc_device_preset("cpu", d);
    snprintf(d->name, sizeof d->name, "cpu-calibrated");

    c->attn_ms_bf16 = slowest(x, M_ALONE); /* rank 0's: the others wrote 0 */
    double alone_cpu = slowest(x, M_ALONE_CPU);
    c->wall_factor = alone_cpu > 0 && c->attn_ms_bf16 > alone_cpu ? c->attn_ms_bf16 / alone_cpu : 1.0;
    c->attn_shared_ms = slowest(x, M_SHARED);
    c->slowdown = c->attn_ms_bf16 > 0 ? c->attn_shared_ms / c->attn_ms_bf16 : 1.0;
    double share = c->slowdown > 1.0 ? c->slowdown : 1.0;
    double w = c->wall_factor;

    /* bf16 / fp16 share the bf16 figures (both are widened to fp32); the IO
     * rate is the bf16 one (the fp32 fit also given in the log) */
    d->attn_tflops = c->attn_gflops_bf16 * 1e-3 / w;
    d->attn_tflops_fp32 = c->attn_gflops_fp32 * 1e-3 / w;
    d->attn_io_gbps = c->attn_io_gbps_bf16 / w;
    d->attn_softmax_gps = c->attn_softmax_gps_bf16 / w;
    /* the dense work of a whole step (model.parameters) at the SGEMM rate;
     * on a CPU the host is the device: no separate host time */
    d->gemm_tflops = c->gemm_gflops * 1e-3 / w;
    d->host_layer_us = 0;
    d->host_op_us = 0;
    d->mem_gbps = 3.0 / (1.0 / c->merge_gbps + 1.0 / c->convert_gbps + 1.0 / c->strided_gbps) / w;
    /* what every op pays: the executor's cost per op (its dispatch and the
     * smallest backend calls), else the smallest calls alone */
    d->op_overhead_us = (c->exec_op_us > 0 ? c->exec_op_us : 0.5 * (c->tiny_attn_us + c->tiny_merge_us)) * w;
    d->ranks_per_core = share;
    d->cores = P / share;

    c->p2p_latency_us = x->p2p_small_us;
    double one_way_big = x->p2p_big_us - x->p2p_small_us;
    c->p2p_gbps = one_way_big > 0 ? (double)z->p2p_big / (one_way_big * 1e-6) / 1e9 : 0;
    c->a2a_latency_us = slowest(x, M_A2A_SMALL) * 1e3;
    double lat_ms = c->a2a_latency_us * 1e-3;
    double a2a_raw = slowest(x, M_A2A), ag_raw = slowest(x, M_AG);
    double moved = (double)z->coll_bytes * (P - 1); /* sent (a2a) = received (all-gather) */
    /* the cost model's conventions: a2a = lat + sent / bw; all-gather =
     * lat * (P-1) + received / bw (NCCL's ring).  The local transport's
     * all-gather is one step, so the second fit can fail (time <= its
     * latency term): the all-gather figure is then left out of intra_gbps. */
    double a2a_ms = a2a_raw - lat_ms, ag_ms = ag_raw - lat_ms * (P - 1);
    c->a2a_gbps = moved / ((a2a_ms > 0.1 * a2a_raw ? a2a_ms : a2a_raw) * 1e-3) / 1e9;
    c->allgather_gbps = ag_ms > 0.1 * ag_raw ? moved / (ag_ms * 1e-3) / 1e9 : 0;

    /* Communication on a CPU is done by the ranks' own threads: the cost model
     * multiplies it by the sharing factor of the plan's ranks (cost.h), so the
     * figures stored are those of ranks that do not share: the P measuring
     * ranks shared by `share`, the two ping-pong ranks by 2 / cores. */
    double share2 = 2.0 / d->cores > 1.0 ? 2.0 / d->cores : 1.0;
    d->intra_p2p_gbps = c->p2p_gbps * share2;
    double bus = c->allgather_gbps > 0 ? 2.0 / (1.0 / c->a2a_gbps + 1.0 / c->allgather_gbps)
                                       : c->a2a_gbps;
    d->intra_gbps = bus * share;
    double lat = c->a2a_latency_us / share;
    if (c->p2p_latency_us / share2 > lat)
        lat = c->p2p_latency_us / share2;
    d->intra_latency_us = lat;
    if (d->intra_p2p_gbps <= 0)
        d->intra_p2p_gbps = d->intra_gbps;

    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0)
        d->memory_gb = (double)pages * (double)psz / 1073741824.0;
}

cpc_status *cpc_calibrate(const cpc_calibrate_options *opt, cpc_calibration *c, bool *is_root)
{
    memset(c, 0, sizeof *c);
    if (is_root)
        *is_root = true;
    const char *tn = opt->transport ? opt->transport : "auto";
    bool use_mpi = false;
    if (strcmp(tn, "mpi") == 0) {
        use_mpi = true;
    } else if (strcmp(tn, "auto") == 0) {
#ifdef CPC_HAVE_MPI
        use_mpi = cpc_mpi_launched();
#endif
    } else if (strcmp(tn, "local") != 0) {
        return cpc_error(CPC_E_USAGE, "--calibrate: transport %s: expected auto, local or mpi", tn);
    }
#ifndef CPC_HAVE_MPI
    if (use_mpi)
        return cpc_error(CPC_E_UNSUPPORTED, "--calibrate --transport mpi: this build of cprun has no MPI support");
#endif
    int P = opt->ranks > 0 ? opt->ranks : 4;
    if (P < 2 || P > 64)
        return cpc_error(CPC_E_USAGE, "--calibrate: ranks %d: expected 2..64", P);
    cal_ctx x;
    memset(&x, 0, sizeof x);
    x.z = opt->quick ? &quick_sizes : &full_sizes;
    double t_start = now_ms();
    cpc_cpu_backend_single_thread_blas();
    cpc_status *st = NULL;
    FILE *log = opt->log;

    if (!use_mpi) {
        snprintf(c->transport, sizeof c->transport, "local");
        x.P = P;
        logf_(log, "%s: local transport, %d rank threads, %ld cores online", opt->quick ? "quick" : "full",
              P, sysconf(_SC_NPROCESSORS_ONLN));
        if ((st = single_rank(x.z, log, c)))
            return st;
        x.all = calloc((size_t)(P * M__COUNT * x.z->reps), sizeof(double));
        if (!x.all)
            return cpc_error(CPC_E_NOMEM, "calibrate: out of memory");
        st = run_local(&x);
    } else {
#ifdef CPC_HAVE_MPI
        snprintf(c->transport, sizeof c->transport, "mpi");
        int rank = 0, size = 0;
        if ((st = cpc_mpi_init(&rank, &size)))
            return st;
        if (size < 2) {
            cpc_mpi_finalize();
            return cpc_error(CPC_E_UNSUPPORTED, "--calibrate under MPI needs at least 2 processes (mpirun -n 4)");
        }
        x.P = P = size;
        cpc_transport *t = NULL;
        if ((st = cpc_transport_mpi_create(1, P, &t))) {
            cpc_mpi_finalize();
            return st;
        }
        if (rank == 0)
            logf_(log, "%s: mpi transport, %d processes", opt->quick ? "quick" : "full", P);
        /* Rank 0 measures alone while the others wait in the barrier. */
        if (rank == 0 && (st = single_rank(x.z, log, c)))
            cpc_transport_abort(t, st->message); /* does not return */
        if (!st)
            st = cpc_transport_barrier(t, CPC_GROUP_WORLD);
        x.all = calloc((size_t)(P * M__COUNT * x.z->reps), sizeof(double));
        if (!x.all && !st)
            st = cpc_error(CPC_E_NOMEM, "calibrate: out of memory");
        if (!st)
            st = rank_main(&x, rank, t);
        cpc_transport_destroy(t);
        cpc_mpi_finalize();
        if (!st && rank != 0) {
            if (is_root)
                *is_root = false;
            free(x.all);
            return NULL;
        }
#endif
    }
    if (st) {
        free(x.all);
        return st;
    }
    c->ranks = x.P;
    build_profile(&x, c);
    free(x.all);
    c->seconds = (now_ms() - t_start) * 1e-3;
    const cpc_device_profile *d = &c->profile;
    logf_(log, "attention bf16, big block, wall time: one rank alone %.2f ms (%.2fx its CPU time); %d ranks at once: slowest rank %.2f ms = %.2fx -> cores %.2f",
          c->attn_ms_bf16, c->wall_factor, x.P, c->attn_shared_ms, c->slowdown, d->cores);
    logf_(log, "point to point (2 ranks): latency %.2f us, %.2f GB/s (%zu bytes)", c->p2p_latency_us,
          c->p2p_gbps, x.z->p2p_big);
    logf_(log, "collectives (%d ranks, %zu bytes per pair): latency %.2f us, all-to-all %.2f GB/s, all-gather %.2f GB/s%s",
          x.P, x.z->coll_bytes, c->a2a_latency_us, c->a2a_gbps, c->allgather_gbps,
          c->allgather_gbps > 0 ? "" : " (no fit: within its latency term; not used)");
    logf_(log, "done in %.1f s", c->seconds);
    return NULL;
}
