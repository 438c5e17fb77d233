/*
 * gpu_check.c - the device check of the CUDA path, run on a GPU machine by
 * tests/gpu/run.sh (built here, carried there by tests/gpu/pack.sh).
 *
 * Three sections (timed ones first), then one summary table (printed last):
 *
 *  numerics   every variant (none, ring p2p and allgather, ulysses, unified,
 *             ulysses_anything, ring_anything) on 1, 2 and 4 virtual ranks -
 *             every rank a thread with its own CUDA backend on GPU 0, the
 *             local transport copying device to device as cprun does
 *             (runtime/transport/transport_device.h) - over several problems (bf16, fp16, fp32,
 *             causal, GQA, uneven segments, key padding, cross-attention),
 *             with --attention auto (cuDNN where it serves) and nvrtc for the
 *             16-bit dtypes.  The gathered output and LSE are compared with
 *             the float64 CPU reference (runtime/session/reference.h) on the same
 *             rounded inputs: relative error <= 1e-2 bf16, 2e-3 fp16, 1e-5
 *             fp32 (SPEC section 5).  Plans that validation rejects for a
 *             problem (CP010 ...) are listed as skipped with the code.
 *  attention  one block S=16384 (B=1, H=16, D=128, bf16, no mask) through
 *             the backend (auto: cuDNN + conversion to fp32; nvrtc) and
 *             through cuDNN's SDPA called directly (attention_cudnn.h, with
 *             and without the LSE), TFLOP/s = 4*B*S^2*H*D / time; goal:
 *             backend(auto) >= 0.9 x direct and >= 600 TFLOP/s.  A sample of
 *             rows is checked against the reference.
 *  bandwidth  the memory-bound kernels (strided copy bf16/fp32, conversions,
 *             LSE merge, accumulator init) in bytes read + written per
 *             second, against cudaMemcpy device-to-device (2 x bytes per
 *             copy); goal >= 0.7.
 *
 * Exit status: 0 every check passed and every goal was met, 1 a numerical
 * check failed or a goal was missed, 3 no CUDA device (the message says
 * "no CUDA device") or a device/runtime error in some check.
 *
 * Options:
 *   --probe              only tell whether a CUDA device is usable (0 / 3)
 *   --precompile         compile the kernels of every problem for --arch with
 *                        NVRTC into the cache ($CPC_CACHE_DIR); needs no GPU
 *   --arch sm_XY         kernel target (default: the device's, sm_90 for
 *                        --precompile)
 *   --cpu-backend        numerics on the CPU backend instead (self-test of
 *                        this harness on a machine without a GPU)
 *   --no-numerics --no-perf --quick (one problem, fewer meshes)
 *   --budget SECONDS     numerics start no run after this many seconds since
 *                        the start (default 230; run.sh kills at 300)
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen.h"
#include "layout.h"
#include "plan.h"
#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "validate.h"
#include "verify.h"
#include "backend.h"
#include "executor.h"
#include "reference.h"
#include "rng.h"
#include "transport_local.h"
#include "transport_device.h"

#ifdef CPC_HAVE_CUDA
#include <cuda_runtime.h>

#include "attention_cudnn.h"
#include "backend_cuda.h"
#endif

#define SEED 20240601ull
#define MAX_P 4

/* ---- small helpers ----------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double g_t0;
static bool g_cpu;          /* --cpu-backend */
static char g_arch[16] = "";

/* The summary table: one row per check. */
typedef struct row {
    char section[12];
    char what[48];
    char config[40];
    char path[40];          /* attention path / what served */
    char value[64];
    char goal[24];
    char result[8];         /* PASS FAIL SKIP ERROR */
    char note[160];
} row;

static row *g_rows;
static int g_nrows, g_caprows;
static int g_fail, g_error;

static row *add_row(const char *section, const char *result)
{
    if (g_nrows == g_caprows) {
        int nc = g_caprows ? 2 * g_caprows : 64;
        row *nr = realloc(g_rows, (size_t)nc * sizeof *nr);
        if (!nr) {
            fprintf(stderr, "gpu_check: out of memory\n");
            exit(3);
        }
        g_rows = nr;
        g_caprows = nc;
    }
    row *r = &g_rows[g_nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->section, sizeof r->section, "%s", section);
    snprintf(r->result, sizeof r->result, "%s", result);
    if (strcmp(result, "FAIL") == 0)
        g_fail++;
    if (strcmp(result, "ERROR") == 0)
        g_error++;
    return r;
}

#define FMT(field, ...) snprintf(field, sizeof field, __VA_ARGS__)

static void print_row_line(FILE *f, const row *r)
{
    fprintf(f, "%-9s %-30s %-22s %-26s %-40s %-18s %-5s %s\n", r->section, r->what, r->config,
            r->path, r->value, r->goal, r->result, r->note);
}

static void print_table(void)
{
    int pass = 0, skip = 0;
    for (int i = 0; i < g_nrows; i++) {
        pass += strcmp(g_rows[i].result, "PASS") == 0;
        skip += strcmp(g_rows[i].result, "SKIP") == 0;
    }
    printf("\n==== gpu_check summary (%.1f s) ====\n", now_s() - g_t0);
    row h = {"section", "check", "config", "path", "value", "goal", "res", "note"};
    print_row_line(stdout, &h);
    for (int i = 0; i < g_nrows; i++)
        print_row_line(stdout, &g_rows[i]);
    printf("%d passed, %d failed, %d errors, %d skipped\n", pass, g_fail, g_error, skip);
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    if (!s) {
        fprintf(stderr, "gpu_check: out of memory\n");
        exit(3);
    }
    return s;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "gpu_check: out of memory (%zu bytes)\n", n);
        exit(3);
    }
    return p;
}

/* First line of a status message, for the table. */
static void status_note(char *dst, size_t n, const cpc_status *st)
{
    snprintf(dst, n, "%s", st ? st->message : "");
    char *nl = strchr(dst, '\n');
    if (nl)
        *nl = 0;
}

/* ---- problems and meshes ------------------------------------------------------------ */

typedef struct gc_case {
    const char *name;
    const char *dtype;
    int B, H, Hkv, D;
    int64_t seg0, seg1;      /* seg1 = 0: one segment */
    const char *mask;
    int64_t kv;              /* cross-attention K/V tokens, 0 = self-attention */
} gc_case;

static const gc_case CASES[] = {
    {"bf16", "bf16", 1, 8, 8, 128, 1024, 0, "none", 0},
    {"fp32", "fp32", 1, 8, 8, 128, 1024, 0, "none", 0},
    {"fp16", "fp16", 1, 8, 8, 64, 512, 0, "none", 0},
    {"bf16 causal", "bf16", 1, 8, 8, 128, 1024, 0, "causal", 0},
    {"fp32 causal", "fp32", 1, 4, 4, 128, 512, 0, "causal", 0},
    {"bf16 gqa 8/2", "bf16", 2, 8, 2, 64, 256, 768, "none", 0},
    {"bf16 uneven 77+1000", "bf16", 1, 6, 6, 128, 77, 1000, "none", 0},
    {"bf16 key_padding", "bf16", 2, 4, 4, 128, 512, 0, "key_padding", 0},
    {"bf16 cross kv=333", "bf16", 1, 8, 8, 128, 1024, 0, "none", 333},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

typedef struct gc_mesh {
    const char *variant;
    int R, U;
    const char *rotate;
} gc_mesh;

static const gc_mesh MESHES[] = {
    {"none", 1, 1, "p2p"},
    {"ring", 2, 1, "p2p"},
    {"ring", 4, 1, "p2p"},
    {"ring", 4, 1, "allgather"},
    {"ulysses", 1, 2, "p2p"},
    {"ulysses", 1, 4, "p2p"},
    {"unified", 2, 2, "p2p"},
    {"ulysses_anything", 1, 2, "p2p"},
    {"ulysses_anything", 1, 4, "p2p"},
    {"ring_anything", 2, 1, "p2p"},
    {"ring_anything", 4, 1, "p2p"},
};
#define N_MESHES ((int)(sizeof MESHES / sizeof MESHES[0]))

static char *plan_yaml(const gc_case *c, const gc_mesh *m)
{
    char seg1[64] = "", kv[64] = "";
    if (c->seg1)
        FMT(seg1, "    - {name: b, tokens: %lld}\n", (long long)c->seg1);
    if (c->kv)
        FMT(kv, "  kv: {tokens: %lld}\n", (long long)c->kv);
    return xasprintf("version: 1\n"
                     "name: gpu-check\n"
                     "model:\n  heads: %d\n  kv_heads: %d\n  head_dim: %d\n  dtype: %s\n"
                     "input:\n  batch: %d\n  segments:\n    - {name: a, tokens: %lld}\n%s"
                     "  mask: %s\n%s"
                     "cluster:\n  world_size: %d\n  device: h200\n"
                     "parallel:\n  variant: %s\n  ring_degree: %d\n  ulysses_degree: %d\n"
                     "schedule:\n  rotate: %s\n",
                     c->H, c->Hkv, c->D, c->dtype, c->B, (long long)c->seg0, seg1, c->mask, kv,
                     m->R * m->U, m->variant, m->R, m->U, m->rotate);
}

static cpc_status *load_plan(const gc_case *c, const gc_mesh *m, cpc_plan **out)
{
    char *y = plan_yaml(c, m);
    cpc_status *st = cpc_plan_load_string(y, strlen(y), "gpu-check.yaml", NULL, 0, out);
    free(y);
    if (st && !cpc_status_has_error(st)) {
        cpc_status_free(st); /* warnings */
        st = NULL;
    }
    if (st && *out) {
        cpc_plan_free(*out);
        *out = NULL;
    }
    return st;
}

/* ---- global inputs and the float64 reference ------------------------------------------ */

typedef struct gc_data {
    const gc_case *c;
    cpc_dtype dtype;
    int64_t S, Skv;
    void *q, *k, *v;         /* global [B, S, H, D], [B, Skv, Hkv, D] in dtype */
    uint8_t *mask;           /* [B, Skv] or NULL */
    double scale;
    double *ref_out;         /* [B, S, H, D] */
    double *ref_lse;         /* [B, H, S] */
    bool ready;
} gc_data;

typedef struct ref_job {
    const cpc_ref_problem *pb;
    int h0, hstep;
    gc_data *d;
    cpc_status *st;
} ref_job;

static void *ref_thread(void *arg)
{
    ref_job *j = arg;
    const cpc_ref_problem *pb = j->pb;
    int B = pb->B, H = pb->H, D = pb->D;
    int64_t S = pb->S;
    for (int h = j->h0; h < H && !j->st; h += j->hstep) {
        int64_t n = (int64_t)B * S;
        cpc_ref_row *rows = xmalloc((size_t)n * sizeof *rows);
        double *o = xmalloc((size_t)n * (size_t)D * sizeof *o);
        double *l = xmalloc((size_t)n * sizeof *l);
        for (int b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                rows[b * S + s] = (cpc_ref_row){b, h, s};
        j->st = cpc_reference_attention(pb, rows, n, o, l);
        if (!j->st)
            for (int b = 0; b < B; b++)
                for (int64_t s = 0; s < S; s++) {
                    int64_t i = b * S + s;
                    memcpy(j->d->ref_out + ((b * S + s) * H + h) * D, o + i * D,
                           (size_t)D * sizeof(double));
                    j->d->ref_lse[((int64_t)b * H + h) * S + s] = l[i];
                }
        free(rows);
        free(o);
        free(l);
    }
    return NULL;
}

static cpc_status *make_data(const cpc_plan *plan, const gc_case *c, gc_data *d)
{
    memset(d, 0, sizeof *d);
    d->c = c;
    d->dtype = plan->model.dtype;
    d->S = plan->input.total_tokens;
    d->Skv = plan->input.has_kv ? plan->input.kv_tokens : d->S;
    d->scale = plan->model.scale > 0 ? plan->model.scale : 1.0 / sqrt((double)c->D);
    int es = cpc_dtype_size(d->dtype);
    size_t nq = (size_t)c->B * (size_t)d->S * (size_t)c->H * (size_t)c->D;
    size_t nkv = (size_t)c->B * (size_t)d->Skv * (size_t)c->Hkv * (size_t)c->D;
    d->q = xmalloc(nq * (size_t)es);
    d->k = xmalloc(nkv * (size_t)es);
    d->v = xmalloc(nkv * (size_t)es);
    cpc_rng_fill(d->q, d->dtype, SEED, CPC_RNG_Q, 0, (int64_t)nq);
    cpc_rng_fill(d->k, d->dtype, SEED, CPC_RNG_K, 0, (int64_t)nkv);
    cpc_rng_fill(d->v, d->dtype, SEED, CPC_RNG_V, 0, (int64_t)nkv);
    if (plan->input.mask == CPC_MASK_KEY_PADDING) {
        /* About 1 key in 6 masked, and the last 64 keys of batch 1 (text padding). */
        d->mask = xmalloc((size_t)c->B * (size_t)d->Skv);
        for (int64_t i = 0; i < c->B * d->Skv; i++)
            d->mask[i] = cpc_rng_normal(SEED, CPC_RNG_MASK, (uint64_t)i) > -1.0f;
        if (c->B > 1)
            for (int64_t j = d->Skv - 64; j < d->Skv; j++)
                if (j >= 0)
                    d->mask[d->Skv + j] = 0;
    }
    d->ref_out = xmalloc(nq * sizeof(double));
    d->ref_lse = xmalloc((size_t)c->B * (size_t)c->H * (size_t)d->S * sizeof(double));
    cpc_ref_problem pb = {.B = c->B, .S = d->S, .Skv = d->Skv, .H = c->H, .Hkv = c->Hkv,
                          .D = c->D, .dtype = d->dtype, .q = d->q, .k = d->k, .v = d->v,
                          .scale = d->scale, .causal = plan->input.mask == CPC_MASK_CAUSAL,
                          .kv_mask = d->mask};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu;
    if (nt > c->H)
        nt = c->H;
    pthread_t th[16];
    ref_job jobs[16];
    for (int t = 0; t < nt; t++) {
        jobs[t] = (ref_job){&pb, t, nt, d, NULL};
        pthread_create(&th[t], NULL, ref_thread, &jobs[t]);
    }
    cpc_status *st = NULL;
    for (int t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        if (jobs[t].st && !st)
            st = jobs[t].st;
        else
            cpc_status_free(jobs[t].st);
    }
    d->ready = !st;
    return st;
}

static void free_data(gc_data *d)
{
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->mask);
    free(d->ref_out);
    free(d->ref_lse);
    memset(d, 0, sizeof *d);
}

/* ---- kernels and backends (one set of MAX_P backends per kernel spec) -------------------- */

typedef struct pool {
    cpc_kernel_spec spec;
    cpc_kernel *k;
    int nk;
    cpc_backend *be[MAX_P];
} pool;

static pool g_pool[16];
static int g_npool;

static cpc_status *compile_spec(const cpc_kernel_spec *spec, cpc_kernel **k, int *nk)
{
    cpc_status *st = cpc_codegen_sources(spec, g_arch, k, nk);
    for (int i = 0; !st && i < *nk; i++)
        st = cpc_codegen_compile(&(*k)[i]);
    if (st) {
        cpc_kernels_free(*k, *nk);
        *k = NULL;
        *nk = 0;
    }
    return st;
}

static cpc_status *get_backends(const cpc_kernel_spec *spec, int P, cpc_backend **out)
{
    pool *pl = NULL;
    for (int i = 0; i < g_npool; i++)
        if (memcmp(&g_pool[i].spec, spec, sizeof *spec) == 0)
            pl = &g_pool[i];
    if (!pl) {
        if (g_npool == (int)(sizeof g_pool / sizeof g_pool[0]))
            return cpc_error(CPC_E_INTERNAL, "gpu_check: too many kernel specs");
        pl = &g_pool[g_npool];
        memset(pl, 0, sizeof *pl);
        pl->spec = *spec;
        if (!g_cpu) {
            double t = now_s();
            cpc_status *st = compile_spec(spec, &pl->k, &pl->nk);
            if (st)
                return st;
            bool cached = pl->nk > 0 && pl->k[0].from_cache && pl->k[pl->nk - 1].from_cache;
            printf("kernels %s head_dim %d causal %d gqa %d for %s: %s in %.2f s\n",
                   cpc_dtype_name(spec->dtype), spec->head_dim, spec->causal, spec->gqa, g_arch,
                   cached ? "from the cache" : "compiled", now_s() - t);
        }
        g_npool++;
    }
    for (int p = 0; p < P; p++) {
        if (!pl->be[p]) {
            cpc_status *st;
#ifdef CPC_HAVE_CUDA
            if (!g_cpu)
                st = cpc_cuda_backend_create(0, spec, pl->k, pl->nk, &pl->be[p]);
            else
#endif
                st = cpc_cpu_backend_create(&pl->be[p]);
            if (st)
                return st;
        }
        out[p] = pl->be[p];
    }
    return NULL;
}

static void free_pools(void)
{
    for (int i = 0; i < g_npool; i++) {
        for (int p = 0; p < MAX_P; p++)
            if (g_pool[i].be[p])
                cpc_backend_destroy(g_pool[i].be[p]);
        cpc_kernels_free(g_pool[i].k, g_pool[i].nk);
    }
    g_npool = 0;
}

/* ---- one run: P rank threads ------------------------------------------------------------- */

typedef struct rank_job {
    const cpc_program *prog;
    const gc_data *d;
    int p;
    cpc_backend *be;
    cpc_local_world *world;
    /* results */
    void *out;               /* [B, T, H, D] dtype */
    size_t out_bytes;
    float *lse;
    int lse_ho, lse_hn, lse_nr;
    cpc_run *lse_runs;
    cpc_status *st;
} rank_job;

/* Copies the rows of `runs` of a global [B, S, h*D] tensor into dst [B, T, h*D]. */
static void gather_rows(void *dst, const void *src, int B, int64_t S, size_t rowb,
                        const cpc_run *runs, int n)
{
    int64_t T = 0;
    for (int i = 0; i < n; i++)
        T += runs[i].len;
    for (int b = 0; b < B; b++) {
        int64_t t = 0;
        for (int i = 0; i < n; i++) {
            memcpy((char *)dst + ((size_t)(b * T + t)) * rowb,
                   (const char *)src + ((size_t)(b * S + runs[i].start)) * rowb,
                   (size_t)runs[i].len * rowb);
            t += runs[i].len;
        }
    }
}

static void scatter_rows(void *dst, const void *src, int B, int64_t S, size_t rowb,
                         const cpc_run *runs, int n)
{
    int64_t T = 0;
    for (int i = 0; i < n; i++)
        T += runs[i].len;
    for (int b = 0; b < B; b++) {
        int64_t t = 0;
        for (int i = 0; i < n; i++) {
            memcpy((char *)dst + ((size_t)(b * S + runs[i].start)) * rowb,
                   (const char *)src + ((size_t)(b * T + t)) * rowb, (size_t)runs[i].len * rowb);
            t += runs[i].len;
        }
    }
}

static void *rank_thread(void *arg)
{
    rank_job *j = arg;
    const cpc_layout *L = &j->prog->layout;
    const gc_data *d = j->d;
    cpc_transport *inner = NULL, *t = NULL;
    cpc_exec *ex = NULL;
    void *in[3] = {NULL, NULL, NULL};
    cpc_run runs[2 * CPC_MAX_SEGMENTS + 2];
    cpc_status *st = cpc_local_endpoint_create(j->world, j->p, &inner);
    if (!st) {
        st = cpc_transport_device_create(inner, j->be, &t);
        if (!st)
            inner = NULL;
    }
    cpc_exec_config cfg = {.prog = j->prog, .rank = j->p, .backend = j->be, .transport = t,
                           .scale = d->scale, .kv_mask = d->mask};
    if (!st)
        st = cpc_exec_create(&cfg, &ex);
    int n_runs = cpc_layout_shard_runs(L, j->p, runs, (int)(sizeof runs / sizeof runs[0]));
    if (!st && n_runs > (int)(sizeof runs / sizeof runs[0]))
        st = cpc_error(CPC_E_INTERNAL, "rank %d: %d shard runs", j->p, n_runs);
    int es = cpc_dtype_size(L->dtype);
    for (int role = 0; !st && role < 3; role++) {
        cpc_buf_role br = role == 0 ? CPC_ROLE_Q : role == 1 ? CPC_ROLE_K : CPC_ROLE_V;
        size_t n = cpc_exec_input_bytes(ex, br);
        if (!n)
            continue;
        bool kv = role > 0;
        int h = kv ? L->Hkv : L->H;
        size_t rowb = (size_t)h * (size_t)L->D * (size_t)es;
        const void *src = role == 0 ? d->q : role == 1 ? d->k : d->v;
        cpc_run whole = {0, L->Skv};
        const cpc_run *rr = kv && L->cross ? &whole : runs;
        int nr = kv && L->cross ? 1 : n_runs;
        int64_t T = 0;
        for (int i = 0; i < nr; i++)
            T += rr[i].len;
        if ((size_t)(L->B * T) * rowb != n) {
            st = cpc_error(CPC_E_INTERNAL, "rank %d: input %d is %zu bytes, the shard %zu", j->p,
                           role, n, (size_t)(L->B * T) * rowb);
            break;
        }
        in[role] = xmalloc(n);
        gather_rows(in[role], src, L->B, kv ? L->Skv : L->S, rowb, rr, nr);
        st = cpc_exec_bind_input(ex, br, in[role], n);
    }
    if (!st)
        st = cpc_exec_reset(ex);
    if (!st)
        st = cpc_exec_run(ex, NULL);
    if (!st) {
        j->out_bytes = cpc_exec_output_bytes(ex);
        j->out = xmalloc(j->out_bytes);
        st = cpc_exec_read_output(ex, j->out, j->out_bytes);
    }
    if (!st) {
        cpc_status *ls = cpc_exec_read_lse(ex, &j->lse, &j->lse_ho, &j->lse_hn, &j->lse_runs,
                                           &j->lse_nr);
        cpc_status_free(ls); /* no LSE: compared as missing */
    }
    if (!st)
        st = cpc_backend_sync(j->be);
    if (st) {
        cpc_status_prefix(st, "rank %d", j->p);
        cpc_local_world_abort(j->world, j->p, st->message);
    }
    cpc_exec_destroy(ex);
    if (t)
        cpc_transport_destroy(t);
    if (inner)
        cpc_transport_destroy(inner);
    for (int i = 0; i < 3; i++)
        free(in[i]);
    j->st = st;
    return NULL;
}

typedef struct run_result {
    cpc_compare_result out, lse;
    bool have_lse;
    long long cudnn, nvrtc, fallback;
    char fallback_why[256];
} run_result;

static cpc_status *run_mesh(const cpc_program *prog, const gc_data *d, cpc_backend **bes,
                            const char *attention, run_result *res)
{
    const cpc_layout *L = &prog->layout;
    int P = L->P;
    memset(res, 0, sizeof *res);
#ifdef CPC_HAVE_CUDA
    if (!g_cpu)
        for (int p = 0; p < P; p++) {
            cpc_cuda_attn_info info;
            cpc_cuda_backend_attention_info(bes[p], &info, true);
            cpc_status *st =
                cpc_cuda_backend_set_attention(bes[p], (cpc_cuda_attention)cpc_cuda_attention_parse(attention));
            if (st)
                return st;
        }
#else
    (void)attention;
#endif
    cpc_local_world *w = NULL;
    cpc_status *st = cpc_local_world_create(L->R, L->U, &w);
    if (st)
        return st;
    cpc_local_world_set_timeout(w, 60);
    cpc_local_world_set_copy(w, cpc_device_copy, bes);
    rank_job jobs[MAX_P];
    pthread_t th[MAX_P];
    for (int p = 0; p < P; p++) {
        jobs[p] = (rank_job){.prog = prog, .d = d, .p = p, .be = bes[p], .world = w};
        pthread_create(&th[p], NULL, rank_thread, &jobs[p]);
    }
    for (int p = 0; p < P; p++)
        pthread_join(th[p], NULL);
    cpc_local_world_destroy(w);
    /* The first failing rank's error (the others usually report the abort). */
    for (int p = 0; p < P; p++) {
        if (jobs[p].st && !st)
            st = jobs[p].st;
        else
            cpc_status_free(jobs[p].st);
    }
    int es = cpc_dtype_size(L->dtype);
    size_t rowb = (size_t)L->H * (size_t)L->D * (size_t)es;
    size_t n_out = (size_t)L->B * (size_t)L->S * (size_t)L->H * (size_t)L->D;
    size_t n_lse = (size_t)L->B * (size_t)L->H * (size_t)L->S;
    if (!st) {
        void *out = xmalloc(n_out * (size_t)es);
        float *lse = xmalloc(n_lse * sizeof(float));
        /* Bytes that no rank writes stay NaN: a coverage hole fails the check. */
        memset(out, 0xff, n_out * (size_t)es);
        for (size_t i = 0; i < n_lse; i++)
            lse[i] = NAN;
        res->have_lse = true;
        for (int p = 0; p < P; p++) {
            cpc_run runs[2 * CPC_MAX_SEGMENTS + 2];
            int nr = cpc_layout_shard_runs(L, p, runs, (int)(sizeof runs / sizeof runs[0]));
            int64_t T = cpc_layout_shard_tokens(L, p);
            if (jobs[p].out_bytes != (size_t)(L->B * T) * rowb) {
                st = cpc_error(CPC_E_INTERNAL, "rank %d returned %zu output bytes, %zu expected", p,
                               jobs[p].out_bytes, (size_t)(L->B * T) * rowb);
                break;
            }
            scatter_rows(out, jobs[p].out, L->B, L->S, rowb, runs, nr);
            if (!jobs[p].lse) {
                res->have_lse = false;
                continue;
            }
            int64_t Tl = 0;
            for (int i = 0; i < jobs[p].lse_nr; i++)
                Tl += jobs[p].lse_runs[i].len;
            for (int b = 0; b < L->B; b++)
                for (int h = 0; h < jobs[p].lse_hn; h++) {
                    int64_t t = 0;
                    for (int i = 0; i < jobs[p].lse_nr; i++) {
                        const cpc_run *r = &jobs[p].lse_runs[i];
                        memcpy(lse + ((int64_t)b * L->H + jobs[p].lse_ho + h) * L->S + r->start,
                               jobs[p].lse + ((int64_t)b * jobs[p].lse_hn + h) * Tl + t,
                               (size_t)r->len * sizeof(float));
                        t += r->len;
                    }
                }
        }
        if (!st) {
            double tol = cpc_check_tolerance(L->dtype);
            cpc_compare(out, L->dtype, d->ref_out, (int64_t)n_out, tol, &res->out);
            if (res->have_lse)
                cpc_compare(lse, CPC_DTYPE_FP32, d->ref_lse, (int64_t)n_lse, tol, &res->lse);
        }
        free(out);
        free(lse);
    }
    for (int p = 0; p < P; p++) {
        free(jobs[p].out);
        free(jobs[p].lse);
        free(jobs[p].lse_runs);
    }
#ifdef CPC_HAVE_CUDA
    if (!g_cpu)
        for (int p = 0; p < P; p++) {
            cpc_cuda_attn_info info;
            cpc_cuda_backend_attention_info(bes[p], &info, true);
            res->cudnn += info.cudnn_blocks;
            res->nvrtc += info.nvrtc_blocks;
            res->fallback += info.fallback_blocks;
            if (!res->fallback_why[0] && info.fallback_reason[0])
                FMT(res->fallback_why, "%s", info.fallback_reason);
        }
#endif
    return st;
}

/* ---- numerics section ------------------------------------------------------------------ */

static bool over_budget(double budget) { return now_s() - g_t0 > budget; }

static void numerics(bool quick, double budget)
{
    printf("\n== numerics: every variant on 1, 2 and 4 virtual ranks vs the float64 reference ==\n");
    int n_cases = quick ? 1 : N_CASES;
    for (int ci = 0; ci < n_cases; ci++) {
        const gc_case *c = &CASES[ci];
        gc_data d;
        memset(&d, 0, sizeof d);
        for (int mi = 0; mi < N_MESHES; mi++) {
            const gc_mesh *m = &MESHES[mi];
            if (quick && mi % 2 == 1)
                continue;
            char cfg[40];
            FMT(cfg, "%s %dx%d%s", m->variant, m->R, m->U,
                strcmp(m->rotate, "p2p") ? " allgather" : "");
            bool half = strcmp(c->dtype, "fp32") != 0;
            const char *modes[2] = {"auto", "nvrtc"};
            int n_modes = half && !g_cpu ? 2 : 1;
            if (g_cpu)
                modes[0] = "cpu";
            if (over_budget(budget)) {
                row *r = add_row("numerics", "SKIP");
                FMT(r->what, "%s", c->name);
                FMT(r->config, "%s", cfg);
                FMT(r->note, "time budget of %.0f s used up", budget);
                continue;
            }
            cpc_plan *plan = NULL;
            cpc_status *st = load_plan(c, m, &plan);
            if (st) {
                row *r = add_row("numerics", "ERROR");
                FMT(r->what, "%s", c->name);
                FMT(r->config, "%s", cfg);
                status_note(r->note, sizeof r->note, st);
                cpc_status_free(st);
                continue;
            }
            cpc_variant var = (cpc_variant)cpc_variant_parse(m->variant);
            st = cpc_check_candidate(plan, var, m->R, m->U);
            if (st) {
                row *r = add_row("numerics", "SKIP");
                FMT(r->what, "%s", c->name);
                FMT(r->config, "%s", cfg);
                char codes[64] = "";
                for (cpc_status *e = st; e; e = e->next) {
                    char b[8];
                    if (e->rule && strlen(codes) + 8 < sizeof codes) {
                        strcat(codes, codes[0] ? "," : "");
                        strcat(codes, cpc_rule_str(e->rule, b));
                    }
                }
                FMT(r->note, "rejected by validation (%s), as the plan compiler would", codes);
                cpc_status_free(st);
                cpc_plan_free(plan);
                continue;
            }
            if (!d.ready) {
                double t = now_s();
                st = make_data(plan, c, &d);
                if (st) {
                    row *r = add_row("numerics", "ERROR");
                    FMT(r->what, "%s", c->name);
                    FMT(r->config, "reference");
                    status_note(r->note, sizeof r->note, st);
                    cpc_status_free(st);
                    cpc_plan_free(plan);
                    break;
                }
                printf("%s: reference (B=%d S=%lld Skv=%lld H=%d Hkv=%d D=%d %s mask %s) in %.2f s\n",
                       c->name, c->B, (long long)d.S, (long long)d.Skv, c->H, c->Hkv, c->D, c->dtype,
                       c->mask, now_s() - t);
            }
            cpc_program *prog = NULL;
            st = cpc_schedule_build(plan, var, m->R, m->U, &prog);
            if (!st) {
                st = cpc_verify(prog);
                if (st && !cpc_status_has_error(st)) {
                    cpc_status_free(st);
                    st = NULL;
                }
            }
            cpc_backend *bes[MAX_P];
            cpc_kernel_spec spec = cpc_kernel_spec_of(plan);
            if (!st)
                st = get_backends(&spec, m->R * m->U, bes);
            if (st) {
                row *r = add_row("numerics", "ERROR");
                FMT(r->what, "%s", c->name);
                FMT(r->config, "%s", cfg);
                status_note(r->note, sizeof r->note, st);
                cpc_status_free(st);
                cpc_program_free(prog);
                cpc_plan_free(plan);
                continue;
            }
            for (int mo = 0; mo < n_modes; mo++) {
                run_result res;
                double t = now_s();
                st = run_mesh(prog, &d, bes, modes[mo], &res);
                double dt = now_s() - t;
                row *r = add_row("numerics", st ? "ERROR" : (res.out.pass && (!res.have_lse || res.lse.pass)) ? "PASS" : "FAIL");
                FMT(r->what, "%s", c->name);
                FMT(r->config, "%s", cfg);
                if (g_cpu)
                    FMT(r->path, "cpu");
                else if (res.cudnn && !res.nvrtc)
                    FMT(r->path, "%s: cudnn %lld", modes[mo], res.cudnn);
                else if (res.cudnn)
                    FMT(r->path, "%s: cudnn %lld nvrtc %lld", modes[mo], res.cudnn, res.nvrtc);
                else
                    FMT(r->path, "%s: nvrtc %lld", modes[mo], res.nvrtc);
                FMT(r->goal, "rel <= %.0e", cpc_check_tolerance(d.dtype));
                if (st) {
                    status_note(r->note, sizeof r->note, st);
                    cpc_status_free(st);
                } else {
                    if (res.have_lse)
                        FMT(r->value, "out %.2e lse %.2e", res.out.rel_err, res.lse.rel_err);
                    else
                        FMT(r->value, "out %.2e (no lse)", res.out.rel_err);
                    if (res.out.n_nan || res.out.n_inf || res.lse.n_nan || res.lse.n_inf)
                        FMT(r->note, "NaN/Inf: out %lld/%lld lse %lld/%lld (first bad %lld)",
                            (long long)res.out.n_nan, (long long)res.out.n_inf,
                            (long long)res.lse.n_nan, (long long)res.lse.n_inf,
                            (long long)res.out.first_bad);
                    else if (res.fallback && strcmp(modes[mo], "auto") == 0 && half)
                        FMT(r->note, "%lld fell back: %.120s", res.fallback, res.fallback_why);
                    else
                        FMT(r->note, "max abs %.2e, %.2f s", res.out.max_abs_err, dt);
                }
                printf("  %-20s %-24s %-26s %-26s %s %s\n", c->name, cfg, r->path, r->value,
                       r->result, r->note);
                fflush(stdout);
            }
            cpc_program_free(prog);
            cpc_plan_free(plan);
        }
        free_data(&d);
    }
}

#ifdef CPC_HAVE_CUDA
/* ---- performance sections (CUDA only) ---------------------------------------------------- */

#define CUDA_OK(call, what)                                                                    \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            st = cpc_error(CPC_E_RUNTIME, "CUDA: %s: %s", what, cudaGetErrorString(e_));       \
            goto done;                                                                         \
        }                                                                                      \
    } while (0)

/* Runs fn(ctx) `iters` times after `warm` calls and returns seconds per call
 * (synchronised with `sync` before and after). */
typedef cpc_status *(*op_fn)(void *ctx);

static cpc_status *time_op(op_fn fn, void *ctx, cpc_status *(*sync)(void *), int warm,
                           double min_time, double *sec)
{
    cpc_status *st = NULL;
    for (int i = 0; i < warm && !st; i++)
        st = fn(ctx);
    if (!st)
        st = sync(ctx);
    if (st)
        return st;
    int iters = 1;
    double t = now_s();
    if ((st = fn(ctx)) || (st = sync(ctx)))
        return st;
    double one = now_s() - t;
    iters = one > 0 ? (int)(min_time / one) : 20;
    if (iters < 3)
        iters = 3;
    if (iters > 200)
        iters = 200;
    t = now_s();
    for (int i = 0; i < iters && !st; i++)
        st = fn(ctx);
    if (!st)
        st = sync(ctx);
    *sec = (now_s() - t) / iters;
    return st;
}

typedef struct attn_ctx {
    cpc_backend *be;
    cpc_attn_args a;
    cpc_cudnn_sdpa *sdpa;
    void *o16;
    cudaStream_t stream;
    bool stats;
} attn_ctx;

static cpc_status *op_backend_attn(void *p)
{
    attn_ctx *c = p;
    return cpc_backend_attn(c->be, &c->a);
}

static cpc_status *sync_backend(void *p)
{
    attn_ctx *c = p;
    return cpc_backend_sync(c->be);
}

static cpc_status *op_direct(void *p)
{
    attn_ctx *c = p;
    return cpc_cudnn_sdpa_run(c->sdpa, &c->a.p, NULL, c->o16, c->stats ? c->a.lse : NULL, c->stream);
}

static cpc_status *sync_stream(void *p)
{
    attn_ctx *c = p;
    cudaError_t e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? NULL : cpc_error(CPC_E_RUNTIME, "CUDA: %s", cudaGetErrorString(e));
}

/* Fills a device buffer of n dtype elements with normals (a 4M-element block repeated). */
static cpc_status *fill_device(cpc_backend *be, void *dst, cpc_dtype t, size_t n, uint32_t stream)
{
    size_t blk = n < ((size_t)1 << 22) ? n : ((size_t)1 << 22);
    size_t es = (size_t)cpc_dtype_size(t);
    void *h = xmalloc(blk * es);
    cpc_rng_fill(h, t, SEED, stream, 0, (int64_t)blk);
    cpc_status *st = NULL;
    for (size_t off = 0; off < n && !st; off += blk) {
        size_t m = n - off < blk ? n - off : blk;
        st = cpc_backend_upload(be, (char *)dst + off * es, h, m * es);
    }
    free(h);
    return st;
}

static void attention_perf(void)
{
    printf("\n== attention: S=16384 D=128 bf16, backend vs cuDNN SDPA called directly ==\n");
    const int B = 1, H = 16, D = 128;
    const int64_t S = 16384;
    cpc_kernel_spec spec = {CPC_DTYPE_BF16, D, false, 1};
    cpc_backend *bes[1] = {NULL};
    cpc_status *st = get_backends(&spec, 1, bes);
    cpc_backend *be = bes[0];
    attn_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    void *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *o16 = NULL;
    size_t n = (size_t)B * S * H * D;
    double flops = 4.0 * B * (double)S * (double)S * H * D;
    double t_auto = 0, t_nvrtc = 0, t_wmma = 0, t_direct = 0, t_direct_nostats = 0;
    char why[256] = "";
    long long cudnn_blocks = 0;
    if (st)
        goto done;
    if ((st = cpc_backend_alloc(be, n * 2, &q)) || (st = cpc_backend_alloc(be, n * 2, &k)) ||
        (st = cpc_backend_alloc(be, n * 2, &v)) || (st = cpc_backend_alloc(be, n * 4, &o)) ||
        (st = cpc_backend_alloc(be, (size_t)B * H * S * 4, &lse)) ||
        (st = cpc_backend_alloc(be, n * 2, &o16)))
        goto done;
    if ((st = fill_device(be, q, CPC_DTYPE_BF16, n, CPC_RNG_Q)) ||
        (st = fill_device(be, k, CPC_DTYPE_BF16, n, CPC_RNG_K)) ||
        (st = fill_device(be, v, CPC_DTYPE_BF16, n, CPC_RNG_V)))
        goto done;
    ctx.be = be;
    ctx.o16 = o16;
    ctx.a = (cpc_attn_args){.p.B = B, .p.sq = S, .p.skv = S, .p.hq = H, .p.hkv = H, .p.d = D, .p.group = 1,
                            .p.dtype = CPC_DTYPE_BF16, .p.q = q, .p.k = k, .p.v = v,
                            .p.q_bstride = S * H * D, .p.kv_bstride = S * H * D, .o = o, .lse = lse,
                            .p.scale = (float)(1.0 / sqrt((double)D))};
    /* backend, auto (cuDNN where it serves) */
    cpc_cuda_attn_info info;
    cpc_cuda_backend_attention_info(be, &info, true);
    if ((st = cpc_cuda_backend_set_attention(be, CPC_CUDA_ATTN_AUTO)) ||
        (st = time_op(op_backend_attn, &ctx, sync_backend, 2, 1.0, &t_auto)))
        goto done;
    cpc_cuda_backend_attention_info(be, &info, true);
    cudnn_blocks = info.cudnn_blocks;
    FMT(why, "%s", info.fallback_reason);
    /* Check a sample of rows of the auto result against the reference. */
    {
        int64_t per = 4;
        cpc_ref_row *rows = xmalloc((size_t)(B * H * per) * sizeof *rows);
        int64_t nr = cpc_reference_sample_rows(B, H, S, per, SEED, rows);
        uint16_t *hq = xmalloc(n * 2), *hk = xmalloc(n * 2), *hv = xmalloc(n * 2);
        float *ho = xmalloc(n * 4), *hl = xmalloc((size_t)B * H * S * 4);
        double *ro = xmalloc((size_t)nr * D * sizeof(double)), *rl = xmalloc((size_t)nr * sizeof(double));
        double *go = xmalloc((size_t)nr * D * sizeof(double)), *gl = xmalloc((size_t)nr * sizeof(double));
        cpc_ref_problem pb = {.B = B, .S = S, .Skv = S, .H = H, .Hkv = H, .D = D,
                              .dtype = CPC_DTYPE_BF16, .q = hq, .k = hk, .v = hv,
                              .scale = ctx.a.p.scale};
        if (!(st = cpc_backend_download(be, hq, q, n * 2)) && !(st = cpc_backend_download(be, hk, k, n * 2)) &&
            !(st = cpc_backend_download(be, hv, v, n * 2)) && !(st = cpc_backend_download(be, ho, o, n * 4)) &&
            !(st = cpc_backend_download(be, hl, lse, (size_t)B * H * S * 4)) &&
            !(st = cpc_reference_attention(&pb, rows, nr, ro, rl)) &&
            !(st = cpc_reference_gather_out(ho, CPC_DTYPE_FP32, B, S, H, D, rows, nr, go)) &&
            !(st = cpc_reference_gather_lse(hl, B, H, S, rows, nr, gl))) {
            cpc_compare_result ro_r, rl_r;
            cpc_compare_init(&ro_r);
            cpc_compare_add_f64(&ro_r, go, ro, nr * D);
            cpc_compare_finish(&ro_r, 1e-2);
            cpc_compare_init(&rl_r);
            cpc_compare_add_f64(&rl_r, gl, rl, nr);
            cpc_compare_finish(&rl_r, 1e-2);
            row *r = add_row("attention", ro_r.pass && rl_r.pass ? "PASS" : "FAIL");
            FMT(r->what, "S=16384 sample check");
            FMT(r->config, "B1 H16 D128 bf16");
            FMT(r->path, "auto: cudnn %lld", cudnn_blocks);
            FMT(r->value, "out %.2e lse %.2e", ro_r.rel_err, rl_r.rel_err);
            FMT(r->goal, "rel <= 1e-02");
            FMT(r->note, "%lld rows", (long long)nr);
        }
        free(rows);
        free(hq);
        free(hk);
        free(hv);
        free(ho);
        free(hl);
        free(ro);
        free(rl);
        free(go);
        free(gl);
        if (st)
            goto done;
    }
    /* backend, generated kernels: mma.sync (the default), then wmma */
    if ((st = cpc_cuda_backend_set_attention(be, CPC_CUDA_ATTN_NVRTC)) ||
        (st = cpc_cuda_backend_set_nvrtc_kernel(be, "mma")) ||
        (st = time_op(op_backend_attn, &ctx, sync_backend, 1, 1.0, &t_nvrtc)))
        goto done;
    if ((st = cpc_cuda_backend_set_nvrtc_kernel(be, "wmma")) ||
        (st = time_op(op_backend_attn, &ctx, sync_backend, 1, 1.0, &t_wmma)))
        goto done;
    cpc_cuda_backend_set_nvrtc_kernel(be, "mma");
    cpc_cuda_backend_set_attention(be, CPC_CUDA_ATTN_AUTO);
    /* cuDNN directly */
    st = cpc_cudnn_sdpa_create(0, &ctx.sdpa);
    if (!st) {
        CUDA_OK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking), "stream");
        ctx.stats = true;
        if ((st = time_op(op_direct, &ctx, sync_stream, 2, 1.0, &t_direct)))
            goto done;
        ctx.stats = false;
        if ((st = time_op(op_direct, &ctx, sync_stream, 2, 1.0, &t_direct_nostats)))
            goto done;
    }
done:;
    double tf_auto = t_auto > 0 ? flops / t_auto / 1e12 : 0;
    double tf_nvrtc = t_nvrtc > 0 ? flops / t_nvrtc / 1e12 : 0;
    double tf_dir = t_direct > 0 ? flops / t_direct / 1e12 : 0;
    double tf_dir0 = t_direct_nostats > 0 ? flops / t_direct_nostats / 1e12 : 0;
    if (st) {
        row *r = add_row("attention", "ERROR");
        FMT(r->what, "S=16384 TFLOP/s");
        status_note(r->note, sizeof r->note, st);
        cpc_status_free(st);
    }
    if (t_auto > 0) {
        bool ok = tf_dir > 0 && tf_auto >= 0.9 * tf_dir && tf_auto >= 600;
        row *r = add_row("attention", ok ? "PASS" : "FAIL");
        FMT(r->what, "S=16384 backend auto");
        FMT(r->config, "B1 H16 D128 bf16");
        FMT(r->path, "cudnn %lld block(s)", cudnn_blocks);
        FMT(r->value, "%.1f TFLOP/s = %.2f x direct", tf_auto, tf_dir > 0 ? tf_auto / tf_dir : 0);
        FMT(r->goal, ">=0.9x, >=600");
        FMT(r->note, "%.3f ms%s%.100s", t_auto * 1e3, why[0] ? "; fallback: " : "", why);
    }
    if (t_nvrtc > 0) {
        bool ok = tf_dir > 0 && tf_nvrtc >= 0.35 * tf_dir;
        row *r = add_row("attention", ok ? "PASS" : "FAIL");
        FMT(r->what, "S=16384 backend nvrtc");
        FMT(r->config, "B1 H16 D128 bf16");
        FMT(r->path, "generated mma.sync kernel");
        FMT(r->value, "%.1f TFLOP/s = %.2f x direct", tf_nvrtc, tf_dir > 0 ? tf_nvrtc / tf_dir : 0);
        FMT(r->goal, ">=0.35x");
        FMT(r->note, "%.3f ms", t_nvrtc * 1e3);
    }
    if (t_wmma > 0) {
        double tf = flops / t_wmma / 1e12;
        row *r = add_row("attention", "PASS");
        FMT(r->what, "S=16384 backend nvrtc wmma");
        FMT(r->config, "B1 H16 D128 bf16");
        FMT(r->path, "generated wmma kernel");
        FMT(r->value, "%.1f TFLOP/s = %.2f x direct", tf, tf_dir > 0 ? tf / tf_dir : 0);
        FMT(r->goal, "(info)");
        FMT(r->note, "%.3f ms", t_wmma * 1e3);
    }
    if (t_direct > 0) {
        row *r = add_row("attention", "PASS");
        FMT(r->what, "S=16384 cuDNN direct");
        FMT(r->config, "B1 H16 D128 bf16");
        FMT(r->path, "cudnn %zu, with LSE", cpc_cudnn_version());
        FMT(r->value, "%.1f TFLOP/s", tf_dir);
        FMT(r->goal, "(baseline)");
        FMT(r->note, "%.3f ms; without LSE %.1f TFLOP/s", t_direct * 1e3, tf_dir0);
    }
    printf("backend auto %.1f, backend nvrtc %.1f, cuDNN direct %.1f (no LSE %.1f) TFLOP/s\n",
           tf_auto, tf_nvrtc, tf_dir, tf_dir0);
    if (ctx.stream)
        cudaStreamDestroy(ctx.stream);
    cpc_cudnn_sdpa_destroy(ctx.sdpa);
    void *bufs[] = {q, k, v, o, lse, o16};
    for (int i = 0; i < 6; i++)
        if (bufs[i])
            cpc_backend_free(be, bufs[i]);
}

typedef struct bw_ctx {
    cpc_backend *be;
    int kind;
    void *a, *b, *c, *d;
    size_t n;   /* elements of the kind's main tensor */
} bw_ctx;

enum { BW_MEMCPY, BW_PACK_BF16, BW_HEADS_BF16, BW_PACK_F32, BW_TO_F32, BW_FROM_F32, BW_MERGE,
       BW_INIT, BW__COUNT };

static const char *const BW_NAMES[BW__COUNT] = {
    "cudaMemcpy D2D", "copy_strided bf16 (heads)", "copy_strided bf16 (a2a)",
    "copy_strided fp32 (acc)", "convert bf16->fp32", "convert fp32->bf16", "merge (LSE)",
    "init_acc"};

/* Token-major [T, 16, 128]: pack heads 0..7 (2 KiB rows); a2a: head-major
 * [16][T][128] -> token-major (256 B rows). */
#define BW_H 16
#define BW_D 128

static cpc_status *op_bw(void *p)
{
    bw_ctx *c = p;
    cpc_backend *be = c->be;
    int64_t T = (int64_t)(c->n / (BW_H * BW_D));
    switch (c->kind) {
    case BW_MEMCPY: {
        cudaError_t e = cudaMemcpy(c->b, c->a, c->n * 2, cudaMemcpyDeviceToDevice);
        return e == cudaSuccess ? NULL : cpc_error(CPC_E_RUNTIME, "cudaMemcpy: %s", cudaGetErrorString(e));
    }
    case BW_PACK_BF16:
        return cpc_backend_copy_strided(be, c->b, c->a, 2, 1, T, 1, BW_H / 2 * BW_D, 0, BW_H / 2 * BW_D, 0,
                                    0, BW_H * BW_D, 0);
    case BW_HEADS_BF16:
        return cpc_backend_copy_strided(be, c->b, c->a, 2, 1, T, BW_H, BW_D, 0, BW_H * BW_D, BW_D, 0,
                                    BW_D, T * BW_D);
    case BW_PACK_F32:
        return cpc_backend_copy_strided(be, c->b, c->a, 4, 1, T / 2, 1, BW_H / 2 * BW_D, 0,
                                    BW_H / 2 * BW_D, 0, 0, BW_H * BW_D, 0);
    case BW_TO_F32:
        return cpc_backend_convert(be, c->b, CPC_DTYPE_FP32, c->a, CPC_DTYPE_BF16, c->n / 2);
    case BW_FROM_F32:
        return cpc_backend_convert(be, c->a, CPC_DTYPE_BF16, c->b, CPC_DTYPE_FP32, c->n / 2);
    case BW_MERGE: {
        cpc_merge_args m = {.B = 1, .s = T / 2, .h = BW_H, .d = BW_D, .acc = c->a, .acc_lse = c->c,
                            .o = c->b, .lse = c->d};
        return cpc_backend_merge(be, &m);
    }
    case BW_INIT:
        return cpc_backend_init_acc(be, c->a, c->n / 2, c->c, (size_t)(T / 2 * BW_H));
    }
    return NULL;
}

static cpc_status *sync_bw(void *p)
{
    bw_ctx *c = p;
    cpc_status *st = cpc_backend_sync(c->be);
    if (st)
        return st;
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? NULL : cpc_error(CPC_E_RUNTIME, "CUDA: %s", cudaGetErrorString(e));
}

/* Bytes read + written by one call. */
static double bw_bytes(const bw_ctx *c)
{
    double n = (double)c->n, T = n / (BW_H * BW_D);
    switch (c->kind) {
    case BW_MEMCPY: return 2 * n * 2;
    case BW_PACK_BF16: return 2 * (n / 2) * 2;
    case BW_HEADS_BF16: return 2 * n * 2;
    case BW_PACK_F32: return 2 * (n / 4) * 4;
    case BW_TO_F32:
    case BW_FROM_F32: return (n / 2) * (2 + 4);
    case BW_MERGE: return (n / 2) * 4 * 3 + (T / 2 * BW_H) * 4 * 3;
    case BW_INIT: return (n / 2) * 4 + (T / 2 * BW_H) * 4;
    }
    return 0;
}

static void bandwidth(void)
{
    printf("\n== bandwidth: memory-bound kernels vs cudaMemcpy device-to-device ==\n");
    cpc_kernel_spec spec = {CPC_DTYPE_BF16, BW_D, false, 1};
    cpc_backend *bes[1] = {NULL};
    cpc_status *st = get_backends(&spec, 1, bes);
    bw_ctx c;
    memset(&c, 0, sizeof c);
    /* n bf16 elements = 512 MiB; the same bytes hold n/2 fp32. */
    c.n = (size_t)256 << 20;
    c.be = bes[0];
    double gbs[BW__COUNT] = {0};
    if (!st && !(st = cpc_backend_alloc(c.be, c.n * 2, &c.a)) &&
        !(st = cpc_backend_alloc(c.be, c.n * 2, &c.b)) &&
        !(st = cpc_backend_alloc(c.be, c.n / BW_D * 4, &c.c)) &&
        !(st = cpc_backend_alloc(c.be, c.n / BW_D * 4, &c.d))) {
        st = fill_device(c.be, c.a, CPC_DTYPE_BF16, c.n, 11);
        if (!st)
            st = fill_device(c.be, c.b, CPC_DTYPE_BF16, c.n, 12);
        if (!st)
            st = fill_device(c.be, c.c, CPC_DTYPE_FP32, c.n / BW_D, 13);
        if (!st)
            st = fill_device(c.be, c.d, CPC_DTYPE_FP32, c.n / BW_D, 14);
        for (int kd = 0; kd < BW__COUNT && !st; kd++) {
            c.kind = kd;
            double sec = 0;
            if ((st = time_op(op_bw, &c, sync_bw, 2, 0.3, &sec)))
                break;
            gbs[kd] = bw_bytes(&c) / sec / 1e9;
            printf("  %-28s %8.1f GB/s\n", BW_NAMES[kd], gbs[kd]);
        }
    }
    if (st) {
        row *r = add_row("bandwidth", "ERROR");
        FMT(r->what, "memory-bound kernels");
        status_note(r->note, sizeof r->note, st);
        cpc_status_free(st);
    }
    for (int kd = 1; kd < BW__COUNT; kd++) {
        if (gbs[kd] <= 0 || gbs[0] <= 0)
            continue;
        double ratio = gbs[kd] / gbs[0];
        row *r = add_row("bandwidth", ratio >= 0.7 ? "PASS" : "FAIL");
        FMT(r->what, "%s", BW_NAMES[kd]);
        FMT(r->config, "512 MiB");
        FMT(r->path, "nvrtc kernel");
        FMT(r->value, "%.0f GB/s = %.2f x memcpy", gbs[kd], ratio);
        FMT(r->goal, ">= 0.7x");
        FMT(r->note, "memcpy %.0f GB/s (read+write)", gbs[0]);
    }
    void *bufs[] = {c.a, c.b, c.c, c.d};
    for (int i = 0; i < 4; i++)
        if (bufs[i])
            cpc_backend_free(c.be, bufs[i]);
}
#endif /* CPC_HAVE_CUDA */

/* ---- main -------------------------------------------------------------------------------- */

static int precompile(void)
{
    int bad = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        cpc_plan *plan = NULL;
        cpc_status *st = load_plan(&CASES[ci], &MESHES[0], &plan);
        cpc_kernel_spec spec;
        if (!st) {
            spec = cpc_kernel_spec_of(plan);
            cpc_plan_free(plan);
        }
        cpc_kernel *k = NULL;
        int nk = 0;
        double t = now_s();
        if (!st)
            st = compile_spec(&spec, &k, &nk);
        if (st) {
            cpc_status_print(st, stderr, "gpu_check");
            cpc_status_free(st);
            bad++;
            continue;
        }
        printf("%-22s %s head_dim %d causal %d gqa %d: %s for %s (%.2f s)\n", CASES[ci].name,
               cpc_dtype_name(spec.dtype), spec.head_dim, spec.causal, spec.gqa,
               k[0].from_cache ? "cached" : "compiled", g_arch, now_s() - t);
        cpc_kernels_free(k, nk);
    }
    /* The perf sections' spec. */
    cpc_kernel_spec ps = {CPC_DTYPE_BF16, 128, false, 1};
    cpc_kernel *k = NULL;
    int nk = 0;
    cpc_status *st = compile_spec(&ps, &k, &nk);
    if (st) {
        cpc_status_print(st, stderr, "gpu_check");
        cpc_status_free(st);
        bad++;
    }
    cpc_kernels_free(k, nk);
    return bad ? 3 : 0;
}

int main(int argc, char **argv)
{
    g_t0 = now_s();
    setvbuf(stdout, NULL, _IOLBF, 0);
    bool probe = false, pre = false, quick = false, do_num = true, do_perf = true;
    double budget = 230;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--probe") == 0)
            probe = true;
        else if (strcmp(argv[i], "--precompile") == 0)
            pre = true;
        else if (strcmp(argv[i], "--cpu-backend") == 0)
            g_cpu = true;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--no-numerics") == 0)
            do_num = false;
        else if (strcmp(argv[i], "--no-perf") == 0)
            do_perf = false;
        else if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc)
            FMT(g_arch, "%s", argv[++i]);
        else if (strcmp(argv[i], "--budget") == 0 && i + 1 < argc)
            budget = atof(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: gpu_check [--probe] [--precompile] [--arch sm_XY] [--cpu-backend] "
                    "[--quick] [--no-numerics] [--no-perf] [--budget SECONDS]\n");
            return 2;
        }
    }
    if (pre) {
        if (!g_arch[0])
            FMT(g_arch, "sm_90");
        return precompile();
    }
    if (g_cpu) {
        cpc_cpu_backend_single_thread_blas();
        do_perf = false;
        printf("gpu_check: harness self-test on the CPU backend (no GPU used)\n");
    } else {
#ifdef CPC_HAVE_CUDA
        int n = 0;
        cpc_status *st = cpc_cuda_device_count(&n);
        if (st) {
            fprintf(stderr, "gpu_check: no CUDA device: %s\n", st->message);
            cpc_status_free(st);
            return 3;
        }
        struct cudaDeviceProp prop;
        int drv = 0, rt = 0;
        cudaGetDeviceProperties(&prop, 0);
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        if (!g_arch[0])
            FMT(g_arch, "sm_%d%d", prop.major, prop.minor);
        size_t dv = cpc_cudnn_version();
        printf("gpu_check: %d device(s); GPU 0: %s, %d SMs, %.1f GiB, %s; driver %d.%d, runtime "
               "%d.%d, cuDNN %zu.%zu.%zu\n",
               n, prop.name, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30),
               g_arch, drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, dv / 10000,
               dv / 100 % 100, dv % 100);
        if (probe)
            return 0;
#else
        (void)probe;
        fprintf(stderr, "gpu_check: no CUDA device: this build has no CUDA toolkit\n");
        return 3;
#endif
    }
    /* The timed sections first (a minute at most), then the numerics until the
     * budget: the summary table is printed well inside run.sh's 5 minutes. */
#ifdef CPC_HAVE_CUDA
    if (do_perf) {
        attention_perf();
        bandwidth();
    }
#endif
    if (do_num)
        numerics(quick, budget);
    free_pools();
    print_table();
    fflush(stdout);
    return g_error ? 3 : g_fail ? 1 : 0;
}
