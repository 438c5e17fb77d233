/* run.c - see run.h */
#include "run.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "artifact.h"
#include "compile.h"
#include "layout.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "verify_bwd.h"
#include "verify.h"
#include "backend.h"
#include "dtype.h"
#include "executor.h"
#include "memlimit.h"
#include "placement.h"
#include "reference.h"
#include "rng.h"
#include "safetensors.h"
#include "trace.h"
#include "rank.h"
#include "transport_local.h"
#include "transport_device.h"
#include "codegen.h"

/* Backends and transports (CUDA, MPI, NCCL: what this build has) come from the
 * registries of the rank runtime (rank.h); this file names none of them. */

/* Tags of the result collection on the world group (after the program). */
enum { TAG_STATS = 30001, TAG_OUT = 30002, TAG_LSE = 30003, TAG_EVENTS = 30004, TAG_GRAD = 30005 };

/* ---- loading -------------------------------------------------------------------- */

void cpc_job_free(cpc_job *job)
{
    if (!job)
        return;
    if (job->artifact) {
        /* plan and program belong to the artifact (op spans borrow its strings). */
        cpc_artifact_free(job->artifact);
        job->plan = NULL;
        job->prog = NULL;
    }
    if (!job->plan_borrowed)
        cpc_plan_free(job->plan);
    cpc_program_free(job->prog);
    cpc_program_free(job->bwd);
    free(job->source);
    free(job);
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* An artifact starts with its version key (artifact.h FORMAT), whatever
 * the file is called. */
static bool looks_like_artifact(const char *path)
{
    /* only a regular file: reading a pipe (cpc --check <(...)) would eat
     * the plan's first bytes */
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return false;
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    char buf[32] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n >= 17 && strncmp(buf, "artifact_version:", 17) == 0;
}

static bool has_error(const cpc_status *st)
{
    return cpc_status_has_error(st);
}

/* The plan the job's programs are laid out on: the plan itself, or with
 * cfg_degree x tp_degree > 1 one (c, t) group's sub-plan (plan.h), in *buf.
 * NULL when the axes do not cut the plan. */
static const cpc_plan *job_program_plan(const cpc_job *job, cpc_plan *buf)
{
    int C = cpc_plan_cfg_degree(job->plan), T = cpc_plan_tp_degree(job->plan);
    if (C * T == 1)
        return job->plan;
    return cpc_plan_sub(job->plan, C, T, buf) ? buf : NULL;
}

cpc_status *cpc_job_from_plan(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                              int ulysses_degree, cpc_job **out)
{
    *out = NULL;
    cpc_job *job = calloc(1, sizeof *job);
    if (!job)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    job->plan = (cpc_plan *)plan;
    job->plan_borrowed = true;
    cpc_plan sub;
    const cpc_plan *pp = job_program_plan(job, &sub); /* cfg_degree x tp_degree: a group's */
    if (!pp) {
        cpc_job_free(job);
        return cpc_error(CPC_E_INTERNAL, "cfg_degree %d x tp_degree %d does not cut the plan",
                         plan->parallel.cfg_degree, plan->parallel.tp_degree);
    }
    cpc_status *st = cpc_schedule_build(pp, variant, ring_degree, ulysses_degree, &job->prog);
    if (!st)
        st = cpc_verify(job->prog);
    if (has_error(st)) {
        cpc_job_free(job);
        return st;
    }
    *out = job;
    return st;
}

cpc_status *cpc_job_load(const char *path, const char *const *sets, int n_sets, cpc_job **out)
{
    *out = NULL;
    cpc_status *diags = NULL;
    cpc_job *job = calloc(1, sizeof *job);
    if (!job)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    job->source = strdup(path);
    if (ends_with(path, ".cplan") || looks_like_artifact(path)) {
        if (n_sets > 0) {
            cpc_job_free(job);
            return cpc_error(CPC_E_USAGE, "--set applies to plan YAML files, not to the artifact %s", path);
        }
        cpc_artifact *a = NULL;
        cpc_status_append(&diags, cpc_artifact_read(path, &a));
        if (has_error(diags) || !a) {
            cpc_job_free(job);
            return diags;
        }
        job->artifact = a;
        job->plan = a->plan;
        job->prog = a->program;
        job->from_artifact = true;
        /* the backward program (training plans) belongs to the job */
        job->bwd = a->backward;
        a->backward = NULL;
        /* The reader checks format and hash; the schedule is proved again. */
        cpc_status_append(&diags, cpc_verify(job->prog));
        if (!has_error(diags) && job->bwd)
            cpc_status_append(&diags, cpc_verify_backward(job->bwd));
        if (has_error(diags)) {
            cpc_job_free(job);
            return diags;
        }
    } else {
        /* The same pipeline as `cpc --check` (compile.h): load, validate and
         * price, Lua choose, schedule, Lua schedule, verify. */
        cpc_compile_opts co = {.sets = sets, .n_sets = n_sets, .until = CPC_UNTIL_VERIFY};
        cpc_compiled cc;
        bool ok = cpc_compile_file(path, &co, &cc);
        diags = cc.diags;
        cc.diags = NULL;
        if (ok && cc.plan && cc.program) {
            job->plan = cc.plan;
            job->prog = cc.program;
            job->priced = cc.priced;
            job->pred = cc.pred;
            job->bwd = cc.backward; /* training: built and proven by the pipeline */
            cc.plan = NULL;
            cc.program = NULL;
            cc.backward = NULL;
        }
        cpc_compiled_free(&cc);
        if (has_error(diags) || !job->prog) {
            if (!has_error(diags))
                cpc_status_append(&diags, cpc_error(CPC_E_INTERNAL, "%s: the compiler produced no program", path));
            cpc_job_free(job);
            return diags;
        }
    }
    if (job->plan->model.linear_attention) {
        /* priced only (cost.h): the backends run softmax attention */
        cpc_status_append(&diags, cpc_error(CPC_E_INPUT,
                                            "%s: model.attention is linear: cpc prices linear attention "
                                            "(cpc --check, --explain) but runs softmax attention only; "
                                            "drop the key to run softmax attention",
                                            path));
        cpc_job_free(job);
        return diags;
    }
    /* cfg_degree x tp_degree > 1: the program is one (c, t) group's R x U
     * program, laid out on the plan's sub-plan (placement.h); every group
     * runs it on its own slice (the compiler built the backward on that
     * sub-plan too). */
    cpc_plan sub_plan;
    const cpc_plan *pp = job_program_plan(job, &sub_plan);
    if (!pp) {
        cpc_status_append(&diags, cpc_error(CPC_E_INTERNAL, "%s: cfg_degree %d x tp_degree %d does not cut the plan",
                                            path, job->plan->parallel.cfg_degree, job->plan->parallel.tp_degree));
        cpc_job_free(job);
        return diags;
    }
    if (job->plan->input.mode == CPC_MODE_TRAINING && !job->bwd) {
        /* SPEC section 10: the compiler builds and proves the backward
         * program (compile.h, on the (c, t) sub-plan) and the artifact
         * stores it; an artifact of a training plan without one was not
         * written by cpc. */
        cpc_status_append(&diags, cpc_error(CPC_E_INPUT,
                                            "%s: a training plan's artifact without a backward program "
                                            "(backward_schedule): recompile the plan with cpc",
                                            path));
        cpc_job_free(job);
        return diags;
    }
    *out = job;
    return diags;
}

/* cprun --dry-run: the buffers of `prog` per rank (the first max_ranks
 * listed) and the peak over ranks, on a line that starts with `what` ("" or
 * "backward ": a training plan's backward program, allocated after the
 * forward's, which stay alive: the saved out and LSE). */
static cpc_status *dry_run_memory(const cpc_program *prog, FILE *out, int max_ranks, const char *what)
{
    const cpc_layout *L = &prog->layout;
    int64_t peak = 0;
    int peak_rank = 0;
    for (int p = 0; p < L->P; p++) {
        cpc_status *st = p < max_ranks ? cpc_exec_print_memory(out, prog, p) : NULL;
        cpc_exec_memory m;
        if (!st)
            st = cpc_exec_memory_plan(prog, p, &m);
        if (st)
            return st;
        if (m.total_bytes > peak) {
            peak = m.total_bytes;
            peak_rank = p;
        }
        cpc_exec_memory_free(&m);
    }
    if (L->P > max_ranks)
        fprintf(out, "(%d more rank%s not listed)\n", L->P - max_ranks, L->P - max_ranks == 1 ? "" : "s");
    fprintf(out, "%speak memory per rank: %lld bytes (rank %d); nothing allocated (dry run)\n", what,
            (long long)peak, peak_rank);
    return NULL;
}

cpc_status *cpc_job_dry_run(const cpc_job *job, FILE *out, int max_ranks)
{
    if (!job || !out)
        return cpc_error(CPC_E_USAGE, "cpc_job_dry_run: job and out must not be NULL");
    const cpc_layout *L = &job->prog->layout;
    int C = cpc_plan_cfg_degree(job->plan), T = cpc_plan_tp_degree(job->plan);
    if (C * T > 1) /* the outer axes (placement.h): every group's ranks are like these */
        fprintf(out, "plan %s: variant %s, mesh %d x %d x %d x %d (cfg x tp x ring x ulysses), %d ranks: "
                     "%d groups of the %d ranks below (world rank ((c*R + r)*U + u)*T + t is rank r*U + u "
                     "of group (c, t))\n",
                job->plan->name ? job->plan->name : "?", cpc_variant_name(L->variant), C, T, L->R, L->U,
                C * T * L->P, C * T, L->P);
    else
        fprintf(out, "plan %s: variant %s, mesh %d x %d (ring x ulysses), %d rank%s\n",
                job->plan->name ? job->plan->name : "?", cpc_variant_name(L->variant), L->R, L->U,
                L->P, L->P == 1 ? "" : "s");
    cpc_status *st = dry_run_memory(job->prog, out, max_ranks, "");
    if (st || !job->bwd)
        return st;
    fprintf(out, "backward program (training):\n");
    return dry_run_memory(job->bwd, out, max_ranks, "backward ");
}

/* ---- running -------------------------------------------------------------------- */

void cpc_run_options_default(cpc_run_options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->attention = "auto";
    o->transport = "auto";
    o->check = true;
    o->warmup = 1;
    o->iters = 5;
}

/* What served a rank's attention blocks (CUDA backend; zeros on the CPU). */
typedef struct attn_count {
    double cudnn_blocks, nvrtc_blocks, fallback_blocks;
    char reason[256];           /* the first fallback reason, "" when none */
} attn_count;

/* What one rank reports to rank 0. */
typedef struct rank_out {
    double *iter_ms, *comm_ms, *compute_ms;   /* [n_iter] */
    int64_t bytes_sent;                       /* of the last iteration */
    int64_t peak;
    cpc_exec_event *ev;
    int *ev_iter;
    int n_ev;
    attn_count attn;
} rank_out;

typedef struct run_ctx {
    const cpc_job *job;
    const cpc_run_options *opt;
    const cpc_layout *L;      /* the program's: one (c, t) group's R x U problem */
    cpc_placement pl;         /* the outer axes (placement.h); C = T = 1: L's world alone */
    cpc_layout G;             /* the whole problem (global B, H, Hkv, P): the global
                                 tensors, the check, the outputs, the report */
    double scale;
    int n_iter;
    bool trace;
    bool progress;            /* a long run: rank 0 reports each iteration on stderr */
    double t_start_us;
    cpc_st_file *in;          /* --input, shared (pread) */
    const cpc_st_tensor *tq, *tk, *tv;
    uint8_t *mask;            /* [B, Skv] or NULL */
    /* rank 0 fills these */
    rank_out *res;            /* [P] */
    void *out;                /* global out [B, S, H, D] */
    float *lse;               /* global [B, H, S] or NULL */
    /* training (job->bwd): filled by every rank thread (disjoint rows) */
    float *dq, *dk, *dv;      /* global fp32 [B, S, H, D], [B, S, Hkv, D] x 2 */
    double *bwd_ms;           /* [P * n_iter] */
    int64_t *bwd_bytes;       /* [P] of the last iteration */
    const cpc_st_tensor *tdo; /* --input's `dout`, or NULL (random from the seed) */
    bool mpi;                 /* this process is one rank (MPI): gradients, backward
                                 times and bytes travel to rank 0 as blobs (TAG_GRAD);
                                 x->dq/dk/dv exist on rank 0 only */
    /* local transport */
    cpc_local_world *world;   /* the ranks' world; with C*T > 1 the job's P x 1
                                 world of the result collection, and: */
    cpc_local_world **sub_worlds; /* [C*T] each group's R x U world (the programs') */
    cpc_transport **job_tr;   /* [P] each rank's endpoint of `world` (C*T > 1) */
    cpc_transport *mpi_job_t; /* MPI with C*T > 1: this process's endpoint of the
                                 job's world (the result collection) */
    cpc_backend **bes;        /* [P] when the world copies device to device
                                 (transport_device.h): rank p's backend */
    cpc_transport **tr;       /* [P] */
    cpc_status **st;          /* [P] */
    cpc_outfile *shard_of;    /* [P] --output-shards written but not yet renamed
                                 (issue 23: the set is committed all or nothing,
                                 shards_finish) */
    /* backend cuda */
    bool cuda;
    int n_gpus;               /* visible GPUs */
    int mpi_device;           /* MPI: this process's GPU; -1: rank mod n_gpus */
    const char *attn_mode;    /* --attention for the CUDA backend: "auto", "cudnn", "nvrtc" */
    cpc_kernel_spec spec;     /* of the plan */
    cpc_kernel *kernels;      /* [n_kernels] */
    int n_kernels;
    bool kernels_owned;       /* compiled here (cpc_kernels_free); else the
                                 array borrows the artifact's strings */
    char tname[16];           /* rank 0's endpoint as wrapped ("local+staged", ...) */
} run_ctx;

/* Long runs tell the user (SPEC section 5): the cost model's time for this
 * run on the backend that runs it (the CUDA backend: the plan's device or
 * profile; the CPU backend: the plan's profile when its device is cpu, else
 * the cpu preset), warmup and iterations, plus the float64 reference of the
 * check (sampled rows x keys x 4 D FLOP at ~1 GFLOP/s).  Over a minute,
 * rank 0 says so before starting and reports every iteration. */
static void long_run_notice(run_ctx *x, int my_rank)
{
    const cpc_job *job = x->job;
    const cpc_plan *plan = job->plan;
    cpc_device_profile dev;
    cpc_status *st = NULL;
    bool plan_dev = x->cuda || (plan->cluster.device && strcmp(plan->cluster.device, "cpu") == 0);
    if (plan_dev)
        st = cpc_plan_device(plan, &dev);
    if (!plan_dev || st) {
        cpc_status_free(st);
        st = NULL;
        if (!cpc_device_preset("cpu", &dev))
            return;
    }
    cpc_prediction pred;
    cpc_plan sub;
    const cpc_plan *pp = job_program_plan(job, &sub);
    if (!pp)
        return;
    if ((st = cpc_price_program(pp, job->prog, &dev, &pred))) {
        cpc_status_free(st);
        return;
    }
    double run_s = pred.ms_per_layer * x->n_iter / 1000.0;
    double ref_s = 0;
    if (x->opt->check) {
        double rows = x->opt->check_rows > 0 ? (double)x->opt->check_rows : 64.0;
        if (rows > (double)x->L->S)
            rows = (double)x->L->S;
        double keys = plan->input.has_kv ? (double)plan->input.kv_tokens : (double)x->L->S;
        ref_s = (double)x->G.B * x->G.H * rows * keys * 4.0 * x->G.D / 1e9;
    }
    x->t_start_us = cpc_exec_now_us();
    if (run_s + ref_s <= 60.0 || my_rank != 0)
        return;
    x->progress = true;
    fprintf(stderr, "cprun: note: this run is predicted to take about %.0f s on the %s backend "
                    "(%d iteration%s of %.2f s on %s%s; check %.0f s): progress follows per iteration\n",
            run_s + ref_s, x->cuda ? "cuda" : "cpu", x->n_iter, x->n_iter == 1 ? "" : "s",
            pred.ms_per_layer / 1000.0, dev.name, plan_dev ? "" : " (the cpu preset)", ref_s);
}

typedef struct thread_arg {
    run_ctx *ctx;
    int rank;
} thread_arg;

static void rank_out_free(rank_out *r)
{
    free(r->iter_ms);
    free(r->comm_ms);
    free(r->compute_ms);
    free(r->ev);
    free(r->ev_iter);
    memset(r, 0, sizeof *r);
}

#define RNG_DOUT 4u /* rng stream of the random `dout` (q, k, v, mask are 0..3) */

/* This rank's dout shard [B, T, H, D] (plan dtype) for the token runs: the
 * batch items and heads of `rp` (placement.h), or the whole global tensor's
 * when rp is NULL. */
static cpc_status *make_dout(run_ctx *x, const cpc_rank_place *rp, const cpc_run *runs, int n_runs,
                             void *dst)
{
    const cpc_layout *G = &x->G;
    int64_t b0 = rp ? rp->b0 : 0, nb = rp ? x->L->B : G->B;
    int64_t h0 = rp ? rp->h0 : 0, nh = rp ? x->L->H : G->H;
    if (x->tdo)
        return cpc_st_read_box(x->in, x->tdo, b0, nb, h0 * G->D, nh * G->D, runs, n_runs, G->dtype, dst);
    cpc_rng_fill_box(dst, G->dtype, x->opt->seed, RNG_DOUT, G->S, G->H, G->D, b0, nb, h0, nh, runs, n_runs);
    return NULL;
}

static cpc_status *send_blob(cpc_transport *t, int tag, const void *p, size_t n);
static cpc_status *recv_blob(cpc_transport *t, int from, int tag, void **p, size_t *n);

static pthread_mutex_t grad_mu = PTHREAD_MUTEX_INITIALIZER;

/* Adds shard rows [nb, T, n] (fp32) into the global [*, S, row] gradient at
 * batch b0 and elements [col0, col0 + n) of the row (K/V heads replicated
 * to several tensor-parallel ranks: each contributes its part of dK, dV). */
static void add_grad_box(run_ctx *x, float *global, const float *part, int64_t nb, int64_t S, int64_t row,
                         int64_t b0, int64_t col0, int64_t n, const cpc_run *runs, int n_runs)
{
    (void)x;
    int64_t T = 0;
    for (int i = 0; i < n_runs; i++)
        T += runs[i].len;
    pthread_mutex_lock(&grad_mu);
    for (int64_t b = 0; b < nb; b++) {
        int64_t t = 0;
        for (int i = 0; i < n_runs; i++) {
            for (int64_t k = 0; k < runs[i].len; k++) {
                float *d = global + ((b0 + b) * S + runs[i].start + k) * row + col0;
                const float *s = part + (b * T + t + k) * n;
                for (int64_t j = 0; j < n; j++)
                    d[j] += s[j];
            }
            t += runs[i].len;
        }
    }
    pthread_mutex_unlock(&grad_mu);
}

/* The K/V tokens of world rank w's dK/dV shards: its shard's, or the whole
 * Skv for cross-attention (whole on every rank of a group after the
 * all_reduce). */
static int64_t grad_kv_tokens(const run_ctx *x, int q)
{
    return x->L->cross ? x->L->Skv : cpc_layout_rank_tokens(x->L, q);
}

/* Bytes of world rank w's gradient blob (TAG_GRAD): its n_iter backward
 * times and bytes sent (doubles), then its dq, dk, dv shards (fp32, dq
 * [B, T, H, D], dk and dv [B, T or Skv, Hkv, D] of its group's program). */
static size_t grad_blob_bytes(const run_ctx *x, int w)
{
    const cpc_layout *L = x->L;
    int q = cpc_placement_rank(&x->pl, w).q;
    size_t T = (size_t)cpc_layout_rank_tokens(L, q), Tkv = (size_t)grad_kv_tokens(x, q);
    return (size_t)(x->n_iter + 1) * sizeof(double) +
           (size_t)L->B * (T * (size_t)L->H + 2 * Tkv * (size_t)L->Hkv) * (size_t)L->D * sizeof(float);
}

/* One rank's gradient shards (dq, dk, dv back to back, fp32, as in
 * grad_blob_bytes) into the global [B, S or Skv, H or Hkv, D] gradients:
 * its batch items and heads (placement.h).  K/V heads replicated over
 * T/Hkv ranks (Hkv < T) have one dK/dV part per rank: they are summed
 * (GQA; mutex: threads of one process).  Cross-attention dK/dV are whole
 * and identical on every rank of a group after the all_reduce: group rank
 * 0's are kept; so are the rows of replicated segments (dq, dk, dv: whole on
 * every rank of a group), the other ranks giving their shard's rows only.
 * Errors: CPC_E_NOMEM. */
static void scatter_grads_rows(run_ctx *x, const cpc_rank_place *rp, const float *g, const cpc_run *runs,
                               int n_runs, int64_t T, int64_t Tkv);

static cpc_status *scatter_grads(run_ctx *x, const cpc_rank_place *rp, const float *g, const cpc_run *runs,
                                 int n_runs)
{
    const cpc_layout *L = x->L;
    int64_t T = cpc_layout_rank_tokens(L, rp->q), Tkv = grad_kv_tokens(x, rp->q);
    if (L->rep && rp->q != 0) {
        /* replicated segments: their rows' gradients are whole (and the
         * same) on every rank of a group: group rank 0's are kept, the
         * others give their shard's rows only */
        int max_runs = cpc_layout_max_shard_runs(L) + 1;
        int64_t Ts = cpc_layout_shard_tokens(L, rp->q);
        size_t row[3] = {(size_t)L->H * (size_t)L->D, (size_t)L->Hkv * (size_t)L->D, (size_t)L->Hkv * (size_t)L->D};
        cpc_run *sr = malloc((size_t)max_runs * sizeof *sr);
        float *c = malloc((size_t)(L->B * Ts) * (row[0] + 2 * row[1]) * sizeof *c + 1);
        cpc_status *st = sr && c ? NULL : cpc_error(CPC_E_NOMEM, "rank %d: out of memory for the gradients", rp->p);
        if (!st) {
            int ns = cpc_layout_shard_runs(L, rp->q, sr, max_runs);
            const float *src = g;
            float *dst = c;
            for (int i = 0; i < 3; i++) {
                for (int64_t b = 0; b < L->B; b++) {
                    int64_t t = 0;
                    for (int j = 0; j < ns; j++) {
                        int64_t ro = cpc_layout_rank_offset(L, rp->q, sr[j].start);
                        memcpy(dst + (size_t)(b * Ts + t) * row[i], src + (size_t)(b * T + ro) * row[i],
                               (size_t)sr[j].len * row[i] * sizeof *c);
                        t += sr[j].len;
                    }
                }
                src += (size_t)(L->B * T) * row[i];
                dst += (size_t)(L->B * Ts) * row[i];
            }
            scatter_grads_rows(x, rp, c, sr, ns, Ts, Ts);
        }
        free(sr);
        free(c);
        return st;
    }
    scatter_grads_rows(x, rp, g, runs, n_runs, T, Tkv);
    return NULL;
}

static void scatter_grads_rows(run_ctx *x, const cpc_rank_place *rp, const float *g, const cpc_run *runs,
                               int n_runs, int64_t T, int64_t Tkv)
{
    const cpc_layout *L = x->L;
    struct { float *dst; int h, gh, h0; } gr[3] = {
        {x->dq, L->H, x->G.H, rp->h0}, {x->dk, L->Hkv, x->G.Hkv, rp->hkv0}, {x->dv, L->Hkv, x->G.Hkv, rp->hkv0}};
    int64_t es = (int64_t)sizeof(float);
    for (int i = 0; i < 3; i++) {
        bool whole = i > 0 && L->cross;
        size_t n = (size_t)(L->B * (whole ? Tkv : T)) * (size_t)gr[i].h * (size_t)L->D;
        if (!(whole && rp->q != 0)) {
            cpc_run kv_run = {0, L->Skv};
            const cpc_run *gruns = whole ? &kv_run : runs;
            int gn = whole ? 1 : n_runs;
            int64_t gS = whole ? L->Skv : L->S;
            if (i > 0 && x->pl.T > x->G.Hkv)
                add_grad_box(x, gr[i].dst, g, L->B, gS, (int64_t)gr[i].gh * L->D, rp->b0,
                             (int64_t)gr[i].h0 * L->D, (int64_t)gr[i].h * L->D, gruns, gn);
            else
                cpc_scatter_box(gr[i].dst, g, L->B, gS, (int64_t)gr[i].gh * L->D * es, rp->b0,
                                (int64_t)gr[i].h0 * L->D * es, (int64_t)gr[i].h * L->D * es, gruns, gn);
        }
        g += n;
    }
}

/* After world rank p's backward (`ex` has run): its dq, dk, dv shards into
 * the global fp32 gradients on world rank 0.  Rank threads (local
 * transport) write theirs directly; under MPI every rank but 0 sends one
 * blob (grad_blob_bytes: its backward times and bytes too) on the world
 * group of the host endpoint `host_t` (the job's world with C*T > 1), and
 * rank 0 receives them in world-rank order, checking each size (a wrong
 * size is CPC_E_RUNTIME naming the rank). */
static cpc_status *backward_gather(run_ctx *x, int p, const cpc_rank_place *rp, cpc_transport *host_t,
                                   cpc_exec *ex, const cpc_run *runs, int n_runs)
{
    const cpc_layout *L = x->L;
    int64_t T = cpc_layout_rank_tokens(L, rp->q), Tkv = grad_kv_tokens(x, rp->q);
    size_t nb = grad_blob_bytes(x, p);
    char *blob = malloc(nb);
    if (!blob)
        return cpc_error(CPC_E_NOMEM, "rank %d: out of memory for the gradients", p);
    double *hd = (double *)blob;
    memcpy(hd, x->bwd_ms + (size_t)p * (size_t)x->n_iter, (size_t)x->n_iter * sizeof(double));
    hd[x->n_iter] = (double)x->bwd_bytes[p];
    float *g = (float *)(hd + x->n_iter + 1);
    cpc_buf_role role[3] = {CPC_ROLE_DQ, CPC_ROLE_DK, CPC_ROLE_DV};
    size_t ne[3] = {(size_t)(L->B * T) * (size_t)L->H * (size_t)L->D,
                    (size_t)(L->B * Tkv) * (size_t)L->Hkv * (size_t)L->D,
                    (size_t)(L->B * Tkv) * (size_t)L->Hkv * (size_t)L->D};
    cpc_status *st = NULL;
    float *gi = g;
    for (int i = 0; i < 3 && !st; i++) {
        st = cpc_exec_read_grad(ex, role[i], gi, ne[i] * sizeof *gi);
        gi += ne[i];
    }
    if (st || !x->mpi || p == 0) {
        if (!st)
            st = scatter_grads(x, rp, g, runs, n_runs);
        free(blob);
        if (st || !x->mpi)
            return st;
        /* MPI world rank 0: every other rank's blob, in world-rank order */
        int max_runs = cpc_layout_max_rank_runs(L) + 1;
        cpc_run *qr = malloc((size_t)max_runs * sizeof *qr);
        if (!qr)
            return cpc_error(CPC_E_NOMEM, "out of memory");
        for (int w = 1; w < x->pl.P && !st; w++) {
            void *buf = NULL;
            size_t n = 0;
            if ((st = recv_blob(host_t, w, TAG_GRAD, &buf, &n)))
                break;
            if (n != grad_blob_bytes(x, w)) {
                st = cpc_error(CPC_E_RUNTIME, "rank %d sent %zu bytes of gradients, %zu expected", w, n,
                               grad_blob_bytes(x, w));
            } else {
                const cpc_rank_place wp = cpc_placement_rank(&x->pl, w);
                const double *wd = buf;
                memcpy(x->bwd_ms + (size_t)w * (size_t)x->n_iter, wd, (size_t)x->n_iter * sizeof(double));
                x->bwd_bytes[w] = (int64_t)wd[x->n_iter];
                int nw = cpc_layout_rank_runs(L, wp.q, qr, max_runs);
                st = scatter_grads(x, &wp, (const float *)(wd + x->n_iter + 1), qr, nw);
            }
            free(buf);
        }
        free(qr);
        return st;
    }
    st = send_blob(host_t, TAG_GRAD, blob, nb);
    free(blob);
    return st;
}

/* SPEC section 10: the backward pass of world rank p after its forward
 * (`fwd` has run: its out shard is `out`, its final LSE is read from it),
 * n_iter times on the endpoint `t`, then its dq, dk, dv shards into the
 * global fp32 gradients on rank 0 (backward_gather, over `host_t`). */
static cpc_status *rank_backward(run_ctx *x, int p, const cpc_rank_place *rp, cpc_rt_rank *rk,
                                 cpc_transport *host_t, void *const *inbuf, const void *out,
                                 const cpc_run *runs, int n_runs)
{
    const cpc_layout *L = x->L;
    cpc_exec *ex = rk->bex, *fwd = rk->ex;
    void *dout = NULL;
    float *lse = NULL;
    cpc_run *lr = NULL;
    cpc_status *st = NULL;
    int64_t T = cpc_layout_rank_tokens(L, rp->q); /* its shard (and replicated segments) */
    size_t es = (size_t)cpc_dtype_size(L->dtype);
    size_t nq = (size_t)(L->B * T) * (size_t)L->H * (size_t)L->D;
    /* cross-attention: K/V, dK and dV are whole ([B, Skv, Hkv, D]) on every rank */
    int64_t Tkv = L->cross ? L->Skv : T;
    size_t nkv = (size_t)(L->B * Tkv) * (size_t)L->Hkv * (size_t)L->D;
    /* The saved LSE in the layout the forward computed it in (ulysses: ring
     * block x this member's heads), as the backward program takes it. */
    size_t nl = cpc_exec_input_bytes(ex, CPC_ROLE_LSE) / sizeof(float);
    int mr = cpc_exec_max_runs(fwd);
    dout = malloc(nq * es + 1);
    lse = malloc(nl * sizeof *lse + 1);
    lr = malloc((size_t)(mr > 0 ? mr : 1) * sizeof *lr);
    if (!dout || !lse || !lr) {
        st = cpc_error(CPC_E_NOMEM, "rank %d: out of memory for the backward pass", p);
        goto done;
    }
    int ho = 0, hn = 0, nr = 0;
    if ((st = make_dout(x, rp, runs, n_runs, dout)) ||
        (st = cpc_exec_lse_into(fwd, lse, nl * sizeof *lse, &ho, &hn, lr, mr, &nr)))
        goto done;
    if ((st = cpc_exec_bind_input(ex, CPC_ROLE_Q, inbuf[0], nq * es)) ||
        (st = cpc_exec_bind_input(ex, CPC_ROLE_K, inbuf[1], nkv * es)) ||
        (st = cpc_exec_bind_input(ex, CPC_ROLE_V, inbuf[2], nkv * es)) ||
        (st = cpc_exec_bind_input(ex, CPC_ROLE_DO, dout, nq * es)) ||
        (st = cpc_exec_bind_input(ex, CPC_ROLE_O, out, nq * es)) ||
        (st = cpc_exec_bind_input(ex, CPC_ROLE_LSE, lse, nl * sizeof *lse)))
        goto done;
    for (int it = 0; it < x->n_iter; it++) {
        cpc_exec_stats s;
        if ((st = cpc_rt_rank_run(rk, ex, true, &s))) {
            cpc_status_prefix(st, "iteration %d", it);
            goto done;
        }
        x->bwd_ms[(size_t)p * (size_t)x->n_iter + (size_t)it] = s.ms;
        x->bwd_bytes[p] = s.bytes_sent;
    }
    st = backward_gather(x, p, rp, host_t, ex, runs, n_runs);
done:
    if (st)
        cpc_status_prefix(st, "backward");
    free(dout);
    free(lse);
    free(lr);
    return st;
}

/* Fills this rank's tensor of `role` ([B, T, h, D] for the token runs):
 * the batch items and (K/V) heads of `rp` (placement.h), or the whole global
 * tensor's when rp is NULL. */
static cpc_status *make_input(run_ctx *x, int role, const cpc_rank_place *rp, const cpc_run *runs,
                              int n_runs, void *dst)
{
    const cpc_layout *G = &x->G;
    bool kv = role != CPC_RNG_Q;
    int64_t S = kv ? G->Skv : G->S;
    int64_t H = kv ? G->Hkv : G->H;
    int64_t b0 = rp ? rp->b0 : 0, nb = rp ? x->L->B : G->B;
    int64_t h0 = rp ? (kv ? rp->hkv0 : rp->h0) : 0;
    int64_t nh = rp ? (kv ? x->L->Hkv : x->L->H) : H;
    if (x->in) {
        const cpc_st_tensor *t = role == CPC_RNG_Q ? x->tq : role == CPC_RNG_K ? x->tk : x->tv;
        return cpc_st_read_box(x->in, t, b0, nb, h0 * G->D, nh * G->D, runs, n_runs, G->dtype, dst);
    }
    cpc_rng_fill_box(dst, G->dtype, x->opt->seed, (uint32_t)role, S, H, G->D, b0, nb, h0, nh, runs, n_runs);
    return NULL;
}

static cpc_status *send_blob(cpc_transport *t, int tag, const void *p, size_t n)
{
    int64_t sz = (int64_t)n;
    cpc_request *a = NULL, *b = NULL;
    cpc_status *st = cpc_transport_isend(t, CPC_GROUP_WORLD, 0, &sz, sizeof sz, tag, &a);
    if (!st)
        st = cpc_transport_isend(t, CPC_GROUP_WORLD, 0, p, n, tag, &b);
    cpc_status *s1 = a ? cpc_transport_wait(t, a) : NULL;
    cpc_status *s2 = b ? cpc_transport_wait(t, b) : NULL;
    if (!st)
        st = s1 ? s1 : s2;
    if (st != s1)
        cpc_status_free(s1);
    if (st != s2)
        cpc_status_free(s2);
    return st;
}

static cpc_status *recv_blob(cpc_transport *t, int from, int tag, void **p, size_t *n)
{
    *p = NULL;
    *n = 0;
    int64_t sz = 0;
    cpc_request *a = NULL;
    cpc_status *st = cpc_transport_irecv(t, CPC_GROUP_WORLD, from, &sz, sizeof sz, tag, &a);
    if (!st)
        st = cpc_transport_wait(t, a);
    if (st)
        return st;
    if (sz < 0)
        return cpc_error(CPC_E_RUNTIME, "rank %d sent a negative result size", from);
    void *buf = malloc(sz ? (size_t)sz : 1);
    if (!buf)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    st = cpc_transport_irecv(t, CPC_GROUP_WORLD, from, buf, (size_t)sz, tag, &a);
    if (!st)
        st = cpc_transport_wait(t, a);
    if (st) {
        free(buf);
        return st;
    }
    *p = buf;
    *n = (size_t)sz;
    return NULL;
}

/* LSE of one rank: [B, hn, T] for heads [ho, ho+hn) and runs -> global [B, H, S]. */
static void scatter_lse(float *global, const float *part, int64_t B, int H, int64_t S, int ho,
                        int hn, const cpc_run *runs, int n_runs)
{
    int64_t T = 0;
    for (int i = 0; i < n_runs; i++)
        T += runs[i].len;
    for (int64_t b = 0; b < B; b++)
        for (int h = 0; h < hn; h++) {
            int64_t t = 0;
            for (int i = 0; i < n_runs; i++) {
                memcpy(global + (b * H + ho + h) * S + runs[i].start,
                       part + (b * hn + h) * T + t, (size_t)runs[i].len * sizeof(float));
                t += runs[i].len;
            }
        }
}

/* ---- output locations, checked before the run ---------------------------------- */

static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The directory part of path ("." when there is none) into buf. */
static void parent_dir(const char *path, char *buf, size_t n)
{
    snprintf(buf, n, "%s", path);
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/')
        buf[--len] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash)
        snprintf(buf, n, ".");
    else if (slash == buf)
        buf[1] = 0;
    else
        *slash = 0;
}

/* A directory that must exist and take new entries. */
static cpc_status *check_dir_writable(const char *what, const char *path, const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return cpc_error(CPC_E_IO, "%s %s: directory '%s' %s", what, path, dir,
                         errno == ENOENT || errno == ENOTDIR ? "does not exist" : strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return cpc_error(CPC_E_IO, "%s %s: '%s' is not a directory", what, path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return cpc_error(CPC_E_IO, "%s %s: cannot create files in '%s': %s", what, path, dir,
                         strerror(errno));
    return NULL;
}

cpc_status *cpc_check_writable_file(const char *what, const char *path)
{
    if (!path || !*path)
        return cpc_error(CPC_E_USAGE, "%s: empty path", what);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return cpc_error(CPC_E_IO, "%s %s: is a directory", what, path);
        if (access(path, W_OK) != 0)
            return cpc_error(CPC_E_IO, "%s %s: cannot write: %s", what, path, strerror(errno));
        return NULL;
    }
    if (errno != ENOENT && errno != ENOTDIR)
        return cpc_error(CPC_E_IO, "%s %s: %s", what, path, strerror(errno));
    char dir[4096];
    parent_dir(path, dir, sizeof dir);
    return check_dir_writable(what, path, dir);
}

cpc_status *cpc_run_check_outputs(const cpc_run_options *opt, const char *plan_path)
{
    const struct {
        const char *what, *path;
    } outs[] = {{"--output", opt->output_path}, {"--trace", opt->trace_path}};
    const struct {
        const char *what, *path;
    } ins[] = {{"the plan file", plan_path}, {"the --input file", opt->input_path}};
    for (size_t i = 0; i < 2; i++) {
        if (!outs[i].path)
            continue;
        for (size_t k = 0; k < 2; k++)
            if (same_file(outs[i].path, ins[k].path))
                return cpc_error(CPC_E_IO, "%s %s: refusing to overwrite %s", outs[i].what,
                                 outs[i].path, ins[k].what);
        cpc_status *st = cpc_check_writable_file(outs[i].what, outs[i].path);
        if (st)
            return st;
    }
    if (opt->output_path && opt->trace_path &&
        (strcmp(opt->output_path, opt->trace_path) == 0 ||
         same_file(opt->output_path, opt->trace_path)))
        return cpc_error(CPC_E_USAGE, "--output and --trace name the same file %s", opt->output_path);
    const char *d = opt->output_shards_dir;
    if (d) {
        if (!*d)
            return cpc_error(CPC_E_USAGE, "--output-shards: empty path");
        struct stat sb;
        if (stat(d, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode))
                return cpc_error(CPC_E_IO, "--output-shards %s: not a directory", d);
            return check_dir_writable("--output-shards", d, d);
        }
        if (errno != ENOENT && errno != ENOTDIR)
            return cpc_error(CPC_E_IO, "--output-shards %s: %s", d, strerror(errno));
        char dir[4096];
        parent_dir(d, dir, sizeof dir);
        return check_dir_writable("--output-shards", d, dir);
    }
    return NULL;
}

static cpc_status *mkdir_p(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return cpc_error(CPC_E_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    return NULL;
}

static cpc_status *write_shard(run_ctx *x, int p, const cpc_rank_place *rp, const void *out,
                               const cpc_run *runs, int n_runs, int64_t T)
{
    const cpc_layout *L = x->L;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.safetensors", x->opt->output_shards_dir, p);
    char tok[2048];
    size_t k = 0;
    tok[0] = 0;
    for (int i = 0; i < n_runs && k + 48 < sizeof tok; i++)
        k += (size_t)snprintf(tok + k, sizeof tok - k, "%s%lld:%lld", i ? "," : "",
                              (long long)runs[i].start, (long long)runs[i].len);
    char rank_s[16], ws[16];
    snprintf(rank_s, sizeof rank_s, "%d", p);
    snprintf(ws, sizeof ws, "%d", x->pl.P);
    /* with cfg_degree x tp_degree > 1 the shard is also a slice of the batch
     * and of the heads: "start:len" of each (placement.h) */
    char bs[48], hs[48];
    snprintf(bs, sizeof bs, "%d:%d", rp->b0, L->B);
    snprintf(hs, sizeof hs, "%d:%d", rp->h0, L->H);
    const char *keys[] = {"rank", "world_size", "tokens", "batch", "heads"};
    const char *vals[] = {rank_s, ws, tok, bs, hs};
    cpc_st_out o = {.name = "out", .dtype = cpc_st_from_dtype(L->dtype), .ndim = 4,
                    .shape = {L->B, T, L->H, L->D}, .data = out};
    return cpc_st_write_staged(path, &o, 1, keys, vals, x->pl.C * x->pl.T > 1 ? 5 : 3,
                               &x->shard_of[p]);
}

/* --output-shards, all or nothing (issue 23: a disk that filled left the new
 * run's shards beside the previous run's).  Every rank's shard is written
 * and fsync'ed under its temporary name (write_shard); when every rank of
 * the job succeeded (`ok`: local ranks joined without error, or MPI ranks
 * past a barrier after their writes) they are renamed into place, and shards
 * of a previous run with more ranks (rankK.safetensors, K >= P) are removed
 * (`remove_extra`: rank 0 or the local driver), so the directory holds one
 * set; else every temporary file is removed and the previous set stays. */
static cpc_status *shards_finish(run_ctx *x, bool ok, bool remove_extra)
{
    if (!x->shard_of)
        return NULL;
    cpc_status *st = NULL;
    int P = x->pl.P;
    for (int p = 0; p < P; p++) {
        if (!x->shard_of[p].f)
            continue;
        if (ok && !st)
            st = cpc_outfile_commit(&x->shard_of[p]);
        else
            cpc_outfile_discard(&x->shard_of[p]);
    }
    free(x->shard_of);
    x->shard_of = NULL;
    if (ok && !st && remove_extra) {
        const char *d = x->opt->output_shards_dir;
        DIR *dir = opendir(d);
        struct dirent *de;
        while (dir && (de = readdir(dir))) {
            int k = -1;
            char canon[64];
            if (sscanf(de->d_name, "rank%d.safetensors", &k) == 1 && k >= P &&
                snprintf(canon, sizeof canon, "rank%d.safetensors", k) > 0 &&
                strcmp(canon, de->d_name) == 0) {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", d, de->d_name);
                (void)unlink(path);
            }
        }
        if (dir)
            closedir(dir);
    }
    return st;
}

/* What this rank's backend is made from (rank.h): the CPU backend, or a
 * CUDA backend on its GPU with the kernels and the attention path of
 * --attention. */
static cpc_rt_backend_params backend_params(const run_ctx *x, int p)
{
    cpc_rt_backend_params bp = {.device = x->mpi_device >= 0 ? x->mpi_device : x->n_gpus > 0 ? p % x->n_gpus : 0,
                                .spec = &x->spec, .kernels = x->kernels, .n_kernels = x->n_kernels,
                                .attention = x->attn_mode};
    return bp;
}

/* What served this rank's attention blocks (CUDA backend). */
static void count_attention(const cpc_rt_rank *rk, attn_count *out)
{
    memset(out, 0, sizeof *out);
    if (!rk->backend->attention_report)
        return;
    cpc_rt_attention_report r;
    memset(&r, 0, sizeof r);
    rk->backend->attention_report(rk->be, &r);
    out->cudnn_blocks = r.cudnn_blocks;
    out->nvrtc_blocks = r.nvrtc_blocks;
    out->fallback_blocks = r.fallback_blocks;
    snprintf(out->reason, sizeof out->reason, "%s", r.reason);
}

/* The whole life of one rank of the job: the rank runtime (rank.h) made on
 * endpoint *tp (taken: *tp is NULL once the rank owns it), its inputs,
 * warmup + iterations, the backward, and the result collection.  Returns
 * its status; rank 0 fills x->res, x->out and x->lse.  `tname` receives the
 * wrapped endpoint's name ("local+staged", ...). */
static cpc_status *rank_main(run_ctx *x, int p, cpc_transport **tp, char *tname, size_t tname_n)
{
    cpc_transport *t = *tp, *const raw_t = *tp;
    const cpc_layout *L = x->L;
    /* p is the world rank; q its rank in its (c, t) group's program */
    const cpc_rank_place rp = cpc_placement_rank(&x->pl, p);
    const int q = rp.q;
    const cpc_layout *G = &x->G;
    const cpc_run_options *opt = x->opt;
    /* The results (statistics, output shard, LSE, events) are host memory:
     * they travel over the unstaged endpoint (owned by the staged one), or
     * with C*T > 1 over the job world's endpoint (x->job_tr, x->mpi_job_t). */
    cpc_transport *host_t = x->job_tr ? x->job_tr[p] : x->mpi_job_t ? x->mpi_job_t : t;
    cpc_rt_rank *rk = NULL;
    cpc_exec *ex = NULL;
    void *inbuf[3] = {NULL, NULL, NULL};
    void *shard = NULL;
    float *lse = NULL;
    cpc_run *lse_runs = NULL;
    cpc_run *runs = NULL;
    rank_out mine = {0};
    /* the address space for this rank's BLAS work buffer, before BLAS asks
     * for it: OpenBLAS retries a failed allocation forever (memlimit.h) */
    cpc_status *st = x->cuda ? NULL : cpc_mem_probe(CPC_RANK_VM_BYTES - ((int64_t)8 << 20));
    if (st) {
        cpc_status_prefix(st, "rank %d", p);
        goto done;
    }
    /* the rank: backend, endpoint (virtual ranks in one process: device to
     * device, each group's world copying with its own slice of x->bes,
     * indexed by q; the CUDA backend or --staged: through host memory; NCCL
     * takes device buffers itself), forward and backward executors */
    const cpc_rt_transport_entry *te = cpc_rt_transport_find(t->vt->name);
    cpc_rt_rank_config rc = {
        .prog = x->job->prog, .bwd = x->job->bwd, .rank = q, .scale = x->scale,
        .kv_mask = x->mask ? x->mask + (size_t)rp.b0 * (size_t)L->Skv : NULL, .record_events = x->trace,
        .backend = x->cuda ? CPC_RT_BACKEND_CUDA : CPC_RT_BACKEND_CPU, .backend_params = backend_params(x, p),
        .transport = t,
        .wrap = x->bes ? CPC_RT_WRAP_DEVICE
                : (x->cuda || opt->staged) && !(te && te->device_memory) ? CPC_RT_WRAP_STAGED
                : CPC_RT_WRAP_NONE,
        .publish = x->bes ? &x->bes[rp.group * x->pl.RU + q] : NULL, .abort_prefix = "cprun"};
    *tp = NULL; /* the rank's from here on, also on failure */
    if ((st = cpc_rt_rank_create(&rc, &rk)))
        goto done;
    t = rk->t;
    ex = rk->ex;
    snprintf(tname, tname_n, "%s", t->vt->name ? t->vt->name : "");
    /* the rank's own tokens: its shard, plus every replicated segment whole
     * (layout.h; without one, exactly the shard) */
    int max_runs = cpc_layout_max_rank_runs(L) + 1;
    runs = malloc((size_t)max_runs * sizeof *runs);
    if (!runs) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto done;
    }
    int n_runs = cpc_layout_rank_runs(L, q, runs, max_runs);
    int64_t T = cpc_layout_rank_tokens(L, q);
    for (int role = 0; role < 3; role++) {
        cpc_buf_role br = role == 0 ? CPC_ROLE_Q : role == 1 ? CPC_ROLE_K : CPC_ROLE_V;
        size_t n = cpc_exec_input_bytes(ex, br);
        if (!n)
            continue;
        inbuf[role] = malloc(n);
        if (!inbuf[role]) {
            st = cpc_error(CPC_E_NOMEM, "rank %d: out of memory for the %s input", p,
                           cpc_buf_role_name(br));
            goto done;
        }
        cpc_run whole = {0, L->Skv};
        if (role > 0 && L->cross)
            st = make_input(x, role, &rp, &whole, 1, inbuf[role]);
        else
            st = make_input(x, role, &rp, runs, n_runs, inbuf[role]);
        if (!st)
            st = cpc_exec_bind_input(ex, br, inbuf[role], n);
        if (st) {
            cpc_status_prefix(st, "rank %d", p);
            goto done;
        }
    }
    mine.iter_ms = calloc((size_t)x->n_iter, sizeof(double));
    mine.comm_ms = calloc((size_t)x->n_iter, sizeof(double));
    mine.compute_ms = calloc((size_t)x->n_iter, sizeof(double));
    if (!mine.iter_ms || !mine.comm_ms || !mine.compute_ms) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto done;
    }
    mine.peak = cpc_exec_allocated_bytes(ex);
    for (int it = 0; it < x->n_iter; it++) {
        cpc_exec_stats s;
        if ((st = cpc_rt_rank_run(rk, ex, true, &s))) {
            cpc_status_prefix(st, "iteration %d", it);
            goto done;
        }
        mine.iter_ms[it] = s.ms;
        if (x->progress && p == 0) {
            double el = (cpc_exec_now_us() - x->t_start_us) / 1e6;
            fprintf(stderr, "cprun: iteration %d of %d%s: %.1f s; %.0f s elapsed, about %.0f s to go\n",
                    it + 1, x->n_iter, it < opt->warmup ? " (warmup)" : "", s.ms / 1000.0, el,
                    el / (it + 1) * (x->n_iter - it - 1));
        }
        mine.comm_ms[it] = s.comm_ms;
        mine.compute_ms[it] = s.compute_ms;
        mine.bytes_sent = s.bytes_sent;
        if (x->trace && it >= opt->warmup && s.n_events > 0) {
            cpc_exec_event *ne = realloc(mine.ev, (size_t)(mine.n_ev + s.n_events) * sizeof *ne);
            int *ni = realloc(mine.ev_iter, (size_t)(mine.n_ev + s.n_events) * sizeof *ni);
            if (ne)
                mine.ev = ne;
            if (ni)
                mine.ev_iter = ni;
            if (ne && ni) {
                memcpy(mine.ev + mine.n_ev, s.events, (size_t)s.n_events * sizeof *ne);
                for (int i = 0; i < s.n_events; i++)
                    mine.ev_iter[mine.n_ev + i] = it - opt->warmup;
                mine.n_ev += s.n_events;
            }
        }
    }
    count_attention(rk, &mine.attn);
    size_t ob = cpc_exec_output_bytes(ex);
    shard = malloc(ob ? ob : 1);
    if (!shard) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto done;
    }
    if ((st = cpc_exec_read_output(ex, shard, ob)))
        goto done;
    int lse_ho = 0, lse_hn = 0, lse_nr = 0;
    if (opt->write_lse && (st = cpc_exec_read_lse(ex, &lse, &lse_ho, &lse_hn, &lse_runs, &lse_nr)))
        goto done;
    if (opt->output_shards_dir && (st = write_shard(x, p, &rp, shard, runs, n_runs, T)))
        goto done;
    if (x->job->bwd && (st = rank_backward(x, p, &rp, rk, host_t, inbuf, shard, runs, n_runs)))
        goto done;
    size_t rowb = (size_t)L->H * (size_t)L->D * (size_t)cpc_dtype_size(L->dtype);
    /* the gathered output is the whole problem's [B, S, H, D]: a shard's
     * rows are its group's batch items and heads (placement.h) */
    size_t grow = (size_t)G->H * (size_t)G->D * (size_t)cpc_dtype_size(L->dtype);
    if (p == 0) {
        rank_out *r0 = &x->res[0];
        *r0 = mine;
        memset(&mine, 0, sizeof mine);
        cpc_scatter_box(x->out, shard, L->B, L->S, (int64_t)grow, rp.b0,
                        (int64_t)rp.h0 * (int64_t)(rowb / (size_t)L->H), (int64_t)rowb, runs, n_runs);
        if (x->lse && lse)
            scatter_lse(x->lse + (size_t)rp.b0 * (size_t)G->H * (size_t)L->S, lse, L->B, G->H, L->S,
                        rp.h0 + lse_ho, lse_hn, lse_runs, lse_nr);
        cpc_run *qr = malloc((size_t)max_runs * sizeof *qr);
        void *buf = NULL;
        if (!qr) {
            st = cpc_error(CPC_E_NOMEM, "out of memory");
            goto done;
        }
        for (int w = 1; w < x->pl.P && !st; w++) {
            /* world rank w, rank q of its group (c, t) */
            const cpc_rank_place wp = cpc_placement_rank(&x->pl, w);
            rank_out *rq = &x->res[w];
            size_t n;
            if ((st = recv_blob(host_t, w, TAG_STATS, &buf, &n)))
                break;
            size_t want = (size_t)(3 * x->n_iter + 2) * sizeof(double) + sizeof(attn_count);
            if (n != want) {
                free(buf);
                st = cpc_error(CPC_E_RUNTIME, "rank %d sent %zu bytes of statistics, %zu expected", w, n, want);
                break;
            }
            double *d = buf;
            rq->iter_ms = malloc((size_t)x->n_iter * sizeof(double));
            rq->comm_ms = malloc((size_t)x->n_iter * sizeof(double));
            rq->compute_ms = malloc((size_t)x->n_iter * sizeof(double));
            if (!rq->iter_ms || !rq->comm_ms || !rq->compute_ms) {
                free(buf);
                st = cpc_error(CPC_E_NOMEM, "out of memory");
                break;
            }
            memcpy(rq->iter_ms, d, (size_t)x->n_iter * sizeof(double));
            memcpy(rq->comm_ms, d + x->n_iter, (size_t)x->n_iter * sizeof(double));
            memcpy(rq->compute_ms, d + 2 * x->n_iter, (size_t)x->n_iter * sizeof(double));
            rq->bytes_sent = (int64_t)d[3 * x->n_iter];
            rq->peak = (int64_t)d[3 * x->n_iter + 1];
            memcpy(&rq->attn, d + 3 * x->n_iter + 2, sizeof rq->attn);
            rq->attn.reason[sizeof rq->attn.reason - 1] = 0;
            free(buf);
            buf = NULL;
            if ((st = recv_blob(host_t, w, TAG_OUT, &buf, &n)))
                break;
            int nq = cpc_layout_rank_runs(L, wp.q, qr, max_runs);
            int64_t Tq = cpc_layout_rank_tokens(L, wp.q);
            if (n != (size_t)(L->B * Tq) * rowb) {
                free(buf);
                st = cpc_error(CPC_E_RUNTIME, "rank %d sent %zu bytes of output, %zu expected", w, n,
                               (size_t)(L->B * Tq) * rowb);
                break;
            }
            cpc_scatter_box(x->out, buf, L->B, L->S, (int64_t)grow, wp.b0,
                            (int64_t)wp.h0 * (int64_t)(rowb / (size_t)L->H), (int64_t)rowb, qr, nq);
            free(buf);
            buf = NULL;
            if (opt->write_lse) {
                if ((st = recv_blob(host_t, w, TAG_LSE, &buf, &n)))
                    break;
                int32_t *hd = buf;
                if (n < 3 * sizeof(int32_t)) {
                    free(buf);
                    st = cpc_error(CPC_E_RUNTIME, "rank %d sent a malformed LSE", w);
                    break;
                }
                int ho = hd[0], hn = hd[1], nr = hd[2];
                cpc_run *rr = (cpc_run *)((char *)buf + 4 * sizeof(int32_t));
                float *lv = (float *)(rr + nr);
                int64_t Tl = 0;
                bool sane = nr >= 0 && hn >= 0 && ho >= 0 && ho + hn <= L->H &&
                            n >= 4 * sizeof(int32_t) + (size_t)nr * sizeof(cpc_run);
                for (int i = 0; sane && i < nr; i++) {
                    sane = rr[i].start >= 0 && rr[i].len >= 0 && rr[i].start + rr[i].len <= L->S;
                    Tl += rr[i].len;
                }
                if (!sane || n != 4 * sizeof(int32_t) + (size_t)nr * sizeof(cpc_run) +
                                     (size_t)(L->B * hn * Tl) * sizeof(float)) {
                    free(buf);
                    st = cpc_error(CPC_E_RUNTIME, "rank %d sent a malformed LSE", w);
                    break;
                }
                if (x->lse)
                    scatter_lse(x->lse + (size_t)wp.b0 * (size_t)G->H * (size_t)L->S, lv, L->B, G->H, L->S,
                                wp.h0 + ho, hn, rr, nr);
                free(buf);
                buf = NULL;
            }
            if (x->trace) {
                if ((st = recv_blob(host_t, w, TAG_EVENTS, &buf, &n)))
                    break;
                size_t one = sizeof(cpc_exec_event) + sizeof(int);
                rq->n_ev = (int)(n / one);
                rq->ev = malloc((size_t)rq->n_ev * sizeof *rq->ev + 1);
                rq->ev_iter = malloc((size_t)rq->n_ev * sizeof(int) + 1);
                if (rq->ev && rq->ev_iter) {
                    memcpy(rq->ev, buf, (size_t)rq->n_ev * sizeof *rq->ev);
                    memcpy(rq->ev_iter, (char *)buf + (size_t)rq->n_ev * sizeof *rq->ev,
                           (size_t)rq->n_ev * sizeof(int));
                } else {
                    rq->n_ev = 0;
                }
                free(buf);
                buf = NULL;
            }
        }
        free(qr);
    } else {
        size_t nd = (size_t)(3 * x->n_iter + 2);
        double *d = malloc(nd * sizeof *d + sizeof(attn_count));
        if (!d) {
            st = cpc_error(CPC_E_NOMEM, "out of memory");
            goto done;
        }
        memcpy(d, mine.iter_ms, (size_t)x->n_iter * sizeof(double));
        memcpy(d + x->n_iter, mine.comm_ms, (size_t)x->n_iter * sizeof(double));
        memcpy(d + 2 * x->n_iter, mine.compute_ms, (size_t)x->n_iter * sizeof(double));
        d[3 * x->n_iter] = (double)mine.bytes_sent;
        d[3 * x->n_iter + 1] = (double)mine.peak;
        memcpy(d + nd, &mine.attn, sizeof mine.attn);
        st = send_blob(host_t, TAG_STATS, d, nd * sizeof *d + sizeof(attn_count));
        free(d);
        if (!st)
            st = send_blob(host_t, TAG_OUT, shard, ob);
        if (!st && opt->write_lse) {
            int64_t Tl = 0;
            for (int i = 0; i < lse_nr; i++)
                Tl += lse_runs[i].len;
            int32_t hd[4] = {lse_ho, lse_hn, lse_nr, 0};
            size_t rb = (size_t)lse_nr * sizeof(cpc_run);
            size_t lb = (size_t)(L->B * lse_hn * Tl) * sizeof(float);
            char *b = malloc(sizeof hd + rb + lb + 1);
            if (!b) {
                st = cpc_error(CPC_E_NOMEM, "out of memory");
                goto done;
            }
            memcpy(b, hd, sizeof hd);
            memcpy(b + sizeof hd, lse_runs, rb);
            memcpy(b + sizeof hd + rb, lse, lb);
            st = send_blob(host_t, TAG_LSE, b, sizeof hd + rb + lb);
            free(b);
        }
        if (!st && x->trace) {
            size_t one = sizeof(cpc_exec_event) + sizeof(int);
            char *b = malloc((size_t)mine.n_ev * one + 1);
            if (!b) {
                st = cpc_error(CPC_E_NOMEM, "out of memory");
                goto done;
            }
            memcpy(b, mine.ev, (size_t)mine.n_ev * sizeof(cpc_exec_event));
            memcpy(b + (size_t)mine.n_ev * sizeof(cpc_exec_event), mine.ev_iter,
                   (size_t)mine.n_ev * sizeof(int));
            st = send_blob(host_t, TAG_EVENTS, b, (size_t)mine.n_ev * one);
            free(b);
        }
    }
done:
    if (st && rk) {
        char *msg = cpc_status_format(st, "cprun");
        /* C*T > 1: the job world first (it names the world rank), then the group's */
        if (host_t && host_t != raw_t)
            cpc_transport_abort(host_t, msg ? msg : st->message);
        cpc_transport_abort(rk->t, msg ? msg : st->message);
        free(msg);
    } else if (st && host_t && host_t != raw_t) {
        /* no rank: its endpoint is aborted (creation failed) or still the
         * caller's (*tp, aborted below); the job world's is this rank's */
        char *msg = cpc_status_format(st, "cprun");
        cpc_transport_abort(host_t, msg ? msg : st->message);
        free(msg);
    }
    if (st && *tp) {
        char *msg = cpc_status_format(st, "cprun");
        cpc_transport_abort(*tp, msg ? msg : st->message);
        free(msg);
    }
    rank_out_free(&mine);
    free(shard);
    free(lse);
    free(lse_runs);
    free(runs);
    for (int i = 0; i < 3; i++)
        free(inbuf[i]);
    cpc_rt_rank_destroy(rk);
    return st;
}

static void *rank_thread(void *arg)
{
    thread_arg *a = arg;
    char tname[16] = "";
    a->ctx->st[a->rank] = rank_main(a->ctx, a->rank, &a->ctx->tr[a->rank], tname, sizeof tname);
    if (a->rank == 0)
        snprintf(a->ctx->tname, sizeof a->ctx->tname, "%s", tname);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    if (n <= 0)
        return 0;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c)
        return v[0];
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

/* SPEC section 5: every output element of every rank (rank 0 holds the
 * gathered output) is scanned for NaN and Inf, not only the compared rows. */
static void scan_nonfinite(const run_ctx *x, cpc_run_report *rep)
{
    const cpc_layout *L = &x->G; /* the whole problem */
    size_t n = (size_t)(L->B * L->S) * (size_t)L->H * (size_t)L->D;
    int64_t first = -1;
    rep->n_nan = rep->n_inf = 0;
    for (size_t i = 0; i < n; i++) {
        double g = cpc_dtype_get_f64(x->out, L->dtype, i);
        if (isfinite(g))
            continue;
        if (isnan(g))
            rep->n_nan++;
        else
            rep->n_inf++;
        if (first < 0)
            first = (int64_t)i;
    }
    if (first >= 0) {
        int64_t D = L->D, H = L->H;
        rep->first_bad[3] = first % D;
        rep->first_bad[2] = first / D % H;
        rep->first_bad[1] = first / (D * H) % L->S;
        rep->first_bad[0] = first / (D * H * L->S);
    }
}

/* The float64 reference check on rank 0's gathered output. */
static cpc_status *run_check(run_ctx *x, cpc_run_report *rep)
{
    const cpc_layout *L = &x->G; /* the whole problem */
    const cpc_run_options *opt = x->opt;
    size_t es = (size_t)cpc_dtype_size(L->dtype);
    size_t nq = (size_t)(L->B * L->S) * (size_t)L->H * (size_t)L->D;
    size_t nkv = (size_t)(L->B * L->Skv) * (size_t)L->Hkv * (size_t)L->D;
    void *q = malloc(nq * es), *k = malloc(nkv * es), *v = malloc(nkv * es);
    cpc_status *st = NULL;
    double *ref = NULL, *got = NULL, *bnd = NULL;
    cpc_ref_row *rows = NULL;
    int64_t n_cmp = 0;
    if (!q || !k || !v) {
        st = cpc_error(CPC_E_NOMEM, "check: out of memory for the global inputs");
        goto done;
    }
    cpc_run wq = {0, L->S}, wk = {0, L->Skv};
    if ((st = make_input(x, CPC_RNG_Q, NULL, &wq, 1, q)) || (st = make_input(x, CPC_RNG_K, NULL, &wk, 1, k)) ||
        (st = make_input(x, CPC_RNG_V, NULL, &wk, 1, v)))
        goto done;
    cpc_ref_problem pb = {.B = L->B, .S = L->S, .Skv = L->Skv, .H = L->H, .Hkv = L->Hkv,
                          .D = L->D, .dtype = L->dtype, .q = q, .k = k, .v = v,
                          .scale = (double)(float)x->scale, .causal = L->causal,
                          .kv_mask = x->mask};
    double limit = opt->check_full_flops == 0 ? 4e9 : opt->check_full_flops;
    double full = cpc_reference_flops(&pb, -1);
    cpc_compare_result cr;
    cpc_compare_init(&cr);
    double tol = cpc_check_tolerance(L->dtype);
    if (limit > 0 && full <= limit) {
        ref = malloc(nq * sizeof *ref);
        bnd = malloc(nq * sizeof *bnd);
        if (!ref || !bnd) {
            st = cpc_error(CPC_E_NOMEM, "check: out of memory for the reference");
            goto done;
        }
        if ((st = cpc_reference_attention_bound(&pb, NULL, 0, ref, NULL, bnd)))
            goto done;
        n_cmp = (int64_t)nq;
        cpc_compare_add(&cr, x->out, L->dtype, ref, (int64_t)nq);
        rep->check_rows = L->B * L->S * L->H;
        rep->check_sampled = false;
    } else {
        int64_t per = opt->check_rows > 0 ? opt->check_rows : 64;
        if (per > L->S)
            per = L->S;
        int64_t nr_max = (int64_t)L->B * L->H * per;
        rows = malloc((size_t)nr_max * sizeof *rows);
        ref = malloc((size_t)nr_max * (size_t)L->D * sizeof *ref);
        got = malloc((size_t)nr_max * (size_t)L->D * sizeof *got);
        bnd = malloc((size_t)nr_max * (size_t)L->D * sizeof *bnd);
        if (!rows || !ref || !got || !bnd) {
            st = cpc_error(CPC_E_NOMEM, "check: out of memory for the reference");
            goto done;
        }
        int64_t nr = cpc_reference_sample_rows(L->B, L->H, L->S, per, opt->seed, rows);
        if ((st = cpc_reference_attention_bound(&pb, rows, nr, ref, NULL, bnd)) ||
            (st = cpc_reference_gather_out(x->out, L->dtype, L->B, L->S, L->H, L->D, rows, nr, got)))
            goto done;
        cpc_compare_add_f64(&cr, got, ref, nr * L->D);
        rep->check_rows = nr;
        rep->check_sampled = true;
        n_cmp = nr * L->D;
    }
    /* Conditioning (README "What the check promises"): never more than
     * CPC_CHECK_ROUNDING_FACTOR times the error that rounding the logits in
     * fp32 causes on these very inputs (reference.h). */
    rep->tolerance_base = tol;
    tol = cpc_check_tolerance_conditioned(L->dtype, ref, bnd, n_cmp, &rep->rounding_err);
    cpc_compare_finish(&cr, tol);
    scan_nonfinite(x, rep);
    rep->checked = true;
    rep->max_abs_err = cr.max_abs_err;
    rep->rel_err = cr.rel_err;
    rep->tolerance = tol;
    /* a non-finite output fails, also where the reference is the same infinity */
    rep->pass = cr.pass && rep->n_nan == 0 && rep->n_inf == 0;
done:
    free(bnd);
    free(q);
    free(k);
    free(v);
    free(ref);
    free(got);
    free(rows);
    return st;
}

/* The training part of check_memory: for world ranks first..last, the
 * backward program's buffers, dout, LSE and the gradient blob; on rank 0
 * the global fp32 gradients, their plan-dtype copies for --output and the
 * float64 reference gradients with the global inputs and dout of the check. */
static cpc_status *backward_memory(run_ctx *x, int first, int last, int my_rank, int64_t *bytes)
{
    const cpc_layout *L = x->L, *G = &x->G;
    *bytes = 0;
    if (!x->job->bwd)
        return NULL;
    int64_t es = cpc_dtype_size(L->dtype), b = 0;
    for (int w = first; w <= last; w++) {
        int q = cpc_placement_rank(&x->pl, w).q;
        if (!x->cuda) {
            cpc_exec_memory m;
            cpc_status *st = cpc_exec_memory_plan(x->job->bwd, q, &m);
            if (st)
                return st;
            b += m.total_bytes;
            cpc_exec_memory_free(&m);
        }
        int64_t T = cpc_layout_shard_tokens(L, q);
        b += L->B * T * L->H * (L->D * es + 4) + (int64_t)grad_blob_bytes(x, w);
    }
    if (my_rank == 0) {
        int64_t ng = (int64_t)G->B * (G->S * G->H + 2 * G->Skv * G->Hkv) * G->D;
        b += ng * 4;
        if (x->opt->output_path)
            b += ng * es;
        if (x->opt->check)
            b += ng * 8 + ng * es + (int64_t)G->B * G->S * G->H * G->D * es;
    }
    *bytes = b;
    return NULL;
}

/* Issue 14: the memory this process will take (the ranks it runs: every
 * rank for the local transport, its own under MPI), checked against the
 * process's limits (memlimit.h) before anything is allocated: a run that
 * cannot fit is refused with exit status 3 instead of dying (or, under
 * `ulimit -v`, spinning in OpenBLAS's allocation retries) halfway. */
static cpc_status *check_memory(run_ctx *x, bool mpi, int my_rank)
{
    const cpc_layout *L = x->L;
    const cpc_run_options *opt = x->opt;
    int64_t es = cpc_dtype_size(L->dtype);
    const cpc_layout *G = &x->G; /* the whole problem: rank 0's gathered tensors */
    int first = mpi ? my_rank : 0, last = mpi ? my_rank : x->pl.P - 1;
    int64_t buf = 0, max_shard = 0;
    for (int w = first; w <= last; w++) {
        int p = cpc_placement_rank(&x->pl, w).q; /* its rank in its group's program */
        if (!x->cuda) { /* the CUDA backend's buffers are device memory */
            cpc_exec_memory m;
            cpc_status *st = cpc_exec_memory_plan(x->job->prog, p, &m);
            if (st)
                return st;
            buf += m.total_bytes;
            cpc_exec_memory_free(&m);
        }
        int64_t T = cpc_layout_rank_tokens(L, p), Tkv = L->cross ? L->Skv : T;
        int64_t shard = L->B * T * L->H * L->D * es;
        /* host inputs, output shard, LSE */
        buf += shard + 2 * L->B * Tkv * L->Hkv * L->D * es + shard;
        if (opt->write_lse)
            buf += 2 * L->B * L->H * T * 4;
        if (shard > max_shard)
            max_shard = shard;
    }
    if (my_rank == 0) {
        int64_t nq = (int64_t)G->B * G->S * G->H * G->D, nkv = (int64_t)G->B * G->Skv * G->Hkv * G->D;
        buf += nq * es + max_shard; /* the gathered output, one received shard */
        if (opt->write_lse)
            buf += (int64_t)G->B * G->H * G->S * 4;
        if (opt->check) {
            buf += (nq + 2 * nkv) * es; /* the global inputs */
            double full = 4.0 * (double)nq * (double)L->Skv;
            double limit = opt->check_full_flops == 0 ? 4e9 : opt->check_full_flops;
            int64_t per = opt->check_rows > 0 ? opt->check_rows : 64;
            buf += limit > 0 && full <= limit ? 2 * nq * 8 : 3 * (int64_t)G->B * G->H * per * G->D * 8;
        }
    }
    if (L->cross || x->job->plan->input.mask == CPC_MASK_KEY_PADDING)
        buf += (int64_t)G->B * G->Skv;
    int64_t bb = 0;
    cpc_status *bst = backward_memory(x, first, last, my_rank, &bb);
    if (bst)
        return bst;
    buf += bb;
    int64_t threads = last - first + 1;
    char what[160];
    const char *name = x->job->plan->name ? x->job->plan->name : "the plan";
    if (mpi)
        snprintf(what, sizeof what, "rank %d of %s", my_rank, name);
    else
        snprintf(what, sizeof what, "%d rank%s of %s in this process", (int)threads,
                 threads == 1 ? "" : "s", name);
    return cpc_mem_check(what, buf + threads * CPC_RANK_VM_BYTES, buf + threads * CPC_RANK_RSS_BYTES);
}

/* Opens --input and checks the tensors against the plan. */
static cpc_status *open_input(run_ctx *x)
{
    const cpc_layout *L = &x->G; /* the whole problem */
    cpc_status *st = cpc_st_open(x->opt->input_path, &x->in);
    if (st)
        return st;
    int64_t qs[4] = {L->B, L->S, L->H, L->D}, ks[4] = {L->B, L->Skv, L->Hkv, L->D};
    if ((st = cpc_st_expect(x->in, "q", 4, qs, true, &x->tq)) ||
        (st = cpc_st_expect(x->in, "k", 4, ks, true, &x->tk)) ||
        (st = cpc_st_expect(x->in, "v", 4, ks, true, &x->tv)))
        return st;
    if (x->job->bwd && cpc_st_find(x->in, "dout") &&
        (st = cpc_st_expect(x->in, "dout", 4, qs, true, &x->tdo)))
        return st;
    return NULL;
}

/* The key-padding mask: from --input's `mask` tensor, or made from the seed
 * (each key is padding with probability ~16%: its normal sample > 1). */
static cpc_status *make_mask(run_ctx *x)
{
    const cpc_layout *L = &x->G; /* the whole problem */
    size_t n = (size_t)(L->B * L->Skv);
    x->mask = malloc(n ? n : 1);
    if (!x->mask)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    if (x->in) {
        int64_t ms[2] = {L->B, L->Skv};
        const cpc_st_tensor *t;
        cpc_status *st = cpc_st_expect(x->in, "mask", 2, ms, false, &t);
        if (!st)
            st = cpc_st_read_mask(x->in, t, x->mask);
        return st;
    }
    for (size_t i = 0; i < n; i++)
        x->mask[i] = cpc_rng_normal(x->opt->seed, CPC_RNG_MASK, i) > 1.0f ? 0 : 1;
    return NULL;
}

/* --output: `out` (plan dtype), `lse` with --lse, and for training plans
 * `dq`, `dk`, `dv` (SPEC section 10: global BSHD, dk/dv [B, Skv, Hkv, D],
 * the fp32 gradients rounded to the plan dtype once, here). */
static cpc_status *write_output(run_ctx *x)
{
    const cpc_layout *L = &x->G; /* the whole problem */
    cpc_st_out o[5] = {
        {.name = "out", .dtype = cpc_st_from_dtype(L->dtype), .ndim = 4,
         .shape = {L->B, L->S, L->H, L->D}, .data = x->out},
    };
    int n = 1;
    if (x->lse)
        o[n++] = (cpc_st_out){.name = "lse", .dtype = CPC_ST_F32, .ndim = 3,
                              .shape = {L->B, L->H, L->S}, .data = x->lse};
    void *g[3] = {NULL, NULL, NULL};
    cpc_status *st = NULL;
    if (x->job->bwd && x->dq) {
        static const char *const name[3] = {"dq", "dk", "dv"};
        const float *src[3] = {x->dq, x->dk, x->dv};
        int h[3] = {L->H, L->Hkv, L->Hkv};
        int64_t tok[3] = {L->S, L->Skv, L->Skv};
        size_t es = (size_t)cpc_dtype_size(L->dtype);
        for (int i = 0; i < 3 && !st; i++) {
            size_t ne = (size_t)(L->B * tok[i]) * (size_t)h[i] * (size_t)L->D;
            if (!(g[i] = malloc(ne * es + 1))) {
                st = cpc_error(CPC_E_NOMEM, "out of memory for the output gradients");
                break;
            }
            cpc_from_f32_n(g[i], L->dtype, src[i], ne);
            o[n++] = (cpc_st_out){.name = name[i], .dtype = cpc_st_from_dtype(L->dtype), .ndim = 4,
                                  .shape = {L->B, tok[i], h[i], L->D}, .data = g[i]};
        }
    }
    if (!st)
        st = cpc_st_write(x->opt->output_path, o, n, NULL, NULL, 0);
    for (int i = 0; i < 3; i++)
        free(g[i]);
    return st;
}

/* ---- backend selection (SPEC section 5 "Placement") ------------------------------ */

static bool is(const char *a, const char *b) { return strcmp(a, b) == 0; }

/* A .cplan without PTX (cpc --no-kernels, or a cpc built without CUDA):
 * the CUDA backend cannot run it. */
static cpc_status *artifact_kernels(const cpc_job *job)
{
    if (!job->from_artifact)
        return NULL;
    const cpc_artifact *a = job->artifact;
    bool have = a && a->n_kernels > 0;
    for (int i = 0; have && i < a->n_kernels; i++)
        have = a->kernels[i].ptx && a->kernels[i].ptx[0];
    if (have)
        return NULL;
    cpc_status *st = cpc_error(CPC_E_INPUT,
                               "%s: the artifact has no compiled kernels (compiled with --no-kernels or without CUDA), so the CUDA backend cannot run it",
                               job->source ? job->source : "artifact");
    cpc_status_set_hint(st, "recompile the plan with a cpc built with the CUDA toolkit (without --no-kernels), run the plan YAML, or use --backend cpu");
    return st;
}

/* Resolves --backend and --attention (names already known to be valid):
 * x->cuda, x->n_gpus, x->attn_mode (the backend registry of rank.h says
 * whether this build and machine have a CUDA device).  Contradictions are CPC_E_USAGE; a CUDA
 * backend that cannot be had (no CUDA in this build, no driver or GPU) is
 * CPC_E_UNSUPPORTED naming the CUDA error.  `need_cuda_for` names an option
 * that needs the CUDA backend even when --backend is auto (NULL: none). */
static cpc_status *resolve_backend(run_ctx *x, const cpc_run_options *opt, const char *need_cuda_for)
{
    const char *b = opt->backend, *a = opt->attention;
    bool gpu_attention = is(a, "cudnn") || is(a, "nvrtc");
    x->cuda = false;
    x->n_gpus = 0;
    x->mpi_device = -1;
    if (is(b, "cpu")) {
        if (gpu_attention)
            return cpc_error(CPC_E_USAGE,
                             "--attention %s needs the CUDA backend, but --backend cpu was given: the CPU backend computes attention itself (use --attention cpu or auto, or --backend cuda)",
                             a);
        if (need_cuda_for)
            return cpc_error(CPC_E_USAGE, "%s needs the CUDA backend, but --backend cpu was given",
                             need_cuda_for);
        return NULL;
    }
    if (is(b, "cuda") && is(a, "cpu"))
        return cpc_error(CPC_E_USAGE,
                         "--attention cpu goes with --backend cpu: the CUDA backend's attention is auto, cudnn or nvrtc");
    if (is(b, "auto") && is(a, "cpu")) {
        if (need_cuda_for)
            return cpc_error(CPC_E_USAGE, "%s needs the CUDA backend, but --attention cpu selects the CPU backend",
                             need_cuda_for);
        if (opt->log)
            fprintf(opt->log, "cprun: --backend auto: --attention cpu selects the CPU backend\n");
        return NULL;
    }
    /* cuda, or auto: a CUDA device if there is one. */
    const char *why = is(b, "cuda") ? "--backend cuda"
                      : gpu_attention ? (is(a, "cudnn") ? "--attention cudnn" : "--attention nvrtc")
                                      : need_cuda_for;
    cpc_status *kst = artifact_kernels(x->job);
    if (kst) {
        if (why) {
            cpc_status_prefix(kst, "%s", why);
            return kst;
        }
        if (opt->log)
            fprintf(opt->log, "cprun: --backend auto: %s: running on the CPU backend\n", kst->message);
        cpc_status_free(kst);
        return NULL;
    }
    const cpc_rt_backend_entry *cuda = cpc_rt_backend_get(CPC_RT_BACKEND_CUDA);
    if (!cuda) {
        if (why)
            return cpc_error(CPC_E_UNSUPPORTED,
                             "%s: this cprun was built without the CUDA toolkit, so it has no CUDA backend; use --backend cpu",
                             why);
        if (opt->log)
            fprintf(opt->log, "cprun: --backend auto: built without CUDA: running on the CPU backend\n");
        return NULL;
    }
    int n = 0;
    cpc_status *st = cuda->available(&n);
    if (!st) {
        x->cuda = true;
        x->n_gpus = n;
        x->attn_mode = is(a, "cudnn") || is(a, "nvrtc") ? a : "auto";
        if (opt->log)
            fprintf(opt->log, "cprun: backend cuda%s: %d visible GPU%s, attention %s\n",
                    is(b, "auto") ? " (--backend auto found a CUDA device)" : "", n, n == 1 ? "" : "s",
                    x->attn_mode);
        return NULL;
    }
    if (why) {
        cpc_status_prefix(st, "%s", why);
        cpc_status_set_hint(st, "run on a machine with an NVIDIA GPU and driver, or use --backend cpu");
        return st;
    }
    if (opt->log)
        fprintf(opt->log, "cprun: --backend auto: %s: running on the CPU backend\n", st->message);
    cpc_status_free(st);
    return NULL;
}

/* The kernels of the CUDA backend: the artifact's (a .cplan), or generated
 * and compiled with NVRTC here (a plan YAML) for the arch of GPU `device`. */
static cpc_status *prepare_kernels(run_ctx *x, int device)
{
    const cpc_job *job = x->job;
    x->spec = cpc_kernel_spec_of(job->plan);
    if (job->from_artifact) {
        const cpc_artifact *a = job->artifact;
        cpc_status *st = artifact_kernels(job);
        if (st)
            return st;
        x->kernels = calloc((size_t)a->n_kernels, sizeof *x->kernels);
        if (!x->kernels)
            return cpc_error(CPC_E_NOMEM, "out of memory");
        for (int i = 0; i < a->n_kernels; i++) {
            /* Borrowed: the artifact outlives the run. */
            x->kernels[i].name = a->kernels[i].name;
            x->kernels[i].arch = a->kernels[i].arch;
            x->kernels[i].source = a->kernels[i].source;
            x->kernels[i].ptx = a->kernels[i].ptx;
        }
        x->n_kernels = a->n_kernels;
        x->kernels_owned = false;
        if (x->opt->log)
            fprintf(x->opt->log, "cprun: kernels from the artifact: %d modules for %s\n", a->n_kernels,
                    a->kernels[0].arch);
        return NULL;
    }
    char arch[16] = "sm_90";
    const cpc_rt_backend_entry *cuda = cpc_rt_backend_get(CPC_RT_BACKEND_CUDA);
    if (cuda && cuda->device_arch)
        (void)cuda->device_arch(device, arch, sizeof arch); /* else sm_90 */
    double t0 = cpc_exec_now_us();
    cpc_kernel *k = NULL;
    int nk = 0;
    cpc_status *st = cpc_codegen_sources(&x->spec, arch, &k, &nk);
    for (int i = 0; !st && i < nk; i++)
        st = cpc_codegen_compile(&k[i]);
    if (st) {
        cpc_kernels_free(k, nk);
        /* The arch is this GPU's, not an option: a GPU that NVRTC cannot
         * target is a missing feature of this machine (3), not a usage error. */
        if (st->code == CPC_E_USAGE && st != &cpc_status_oom)
            st->code = CPC_E_UNSUPPORTED;
        cpc_status_prefix(st, "compiling the kernels of %s for %s",
                          job->plan->name ? job->plan->name : "the plan", arch);
        return st;
    }
    x->kernels = k;
    x->n_kernels = nk;
    x->kernels_owned = true;
    if (x->opt->log) {
        bool cached = nk > 0;
        for (int i = 0; i < nk; i++)
            cached = cached && k[i].from_cache;
        fprintf(x->opt->log, "cprun: kernels: %d modules for %s (%s, %.2f s)\n", nk, arch,
                cached ? "from the cache" : "compiled with NVRTC",
                (cpc_exec_now_us() - t0) / 1e6);
    }
    return NULL;
}

static void free_kernels(run_ctx *x)
{
    if (x->kernels_owned)
        cpc_kernels_free(x->kernels, x->n_kernels);
    else
        free(x->kernels);
    x->kernels = NULL;
    x->n_kernels = 0;
}

/* The report's "attention": what served the blocks of every rank. */
static void attention_text(char *dst, size_t n, const run_ctx *x, int P)
{
    if (!x->cuda) {
        snprintf(dst, n, "cpu");
        return;
    }
    double cudnn = 0, nvrtc = 0, fb = 0;
    const char *reason = "";
    for (int p = 0; p < P; p++) {
        const attn_count *a = &x->res[p].attn;
        cudnn += a->cudnn_blocks;
        nvrtc += a->nvrtc_blocks;
        fb += a->fallback_blocks;
        if (!reason[0] && a->reason[0])
            reason = a->reason;
    }
    if (cudnn > 0 && nvrtc == 0)
        snprintf(dst, n, "cudnn");
    else if (cudnn > 0)
        snprintf(dst, n, "cudnn+nvrtc fallback (%.0f of %.0f blocks: %s)", nvrtc, cudnn + nvrtc,
                 reason[0] ? reason : "no reason given");
    else if (fb > 0)
        snprintf(dst, n, "nvrtc (cudnn could not serve: %s)", reason[0] ? reason : "no reason given");
    else
        snprintf(dst, n, "nvrtc");
}

/* The cost model's time per iteration (ms) of the job: the YAML plan's
 * pricing, or the artifact's recorded prediction; 0 when unknown. */
static double predicted_ms(const cpc_job *job)
{
    if (job->priced)
        return job->pred.ms_per_layer;
    if (job->from_artifact && job->artifact)
        for (int i = 0; i < job->artifact->n_predictions; i++)
            if (job->artifact->predictions[i].name &&
                strcmp(job->artifact->predictions[i].name, "ms_per_layer") == 0)
                return job->artifact->predictions[i].value;
    return 0;
}

double cpc_run_default_timeout(const cpc_job *job, const cpc_run_options *opt, bool mpi)
{
    if (!mpi)
        return CPC_LOCAL_TIMEOUT_S;
    /* a single wait never lasts the whole run: 20 x the predicted time of all
     * iterations is generous even for a cost model that is far off, and the
     * floor covers setup, input reading and an unpriced plan */
    double run_s = predicted_ms(job) * (double)(opt->warmup + opt->iters) / 1000.0;
    double t = 20.0 * run_s;
    return t > CPC_MPI_TIMEOUT_FLOOR_S ? t : CPC_MPI_TIMEOUT_FLOOR_S;
}

/* Picks the root cause among the ranks' statuses and frees the others. */
static cpc_status *root_cause(run_ctx *x, int P)
{
    int ar = -1;
    if (x->world)
        cpc_local_world_aborted(x->world, &ar, NULL);
    int pick = -1;
    if (ar >= 0 && ar < P && x->st[ar])
        pick = ar;
    for (int p = 0; p < P && pick < 0; p++)
        if (x->st[p])
            pick = p;
    cpc_status *st = pick >= 0 ? x->st[pick] : NULL;
    for (int p = 0; p < P; p++)
        if (p != pick)
            cpc_status_free(x->st[p]);
    return st;
}

/* SPEC section 10: the backward's time, bytes and check of dq, dk, dv (every
 * rank's shard, gathered) against the float64 reference gradients of the
 * same rounded inputs.  Tolerances: fp32 and fp16 as for `out`, bf16 2e-2. */
static cpc_status *backward_report(run_ctx *x, cpc_run_report *rep)
{
    const cpc_layout *L = &x->G; /* the whole problem */
    const cpc_run_options *opt = x->opt;
    int P = L->P, W = opt->warmup, I = opt->iters;
    double *it = calloc((size_t)I + 1, sizeof *it);
    if (!it)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    for (int i = 0; i < I; i++)
        for (int p = 0; p < P; p++)
            if (x->bwd_ms[(size_t)p * (size_t)x->n_iter + (size_t)(W + i)] > it[i])
                it[i] = x->bwd_ms[(size_t)p * (size_t)x->n_iter + (size_t)(W + i)];
    rep->backward = true;
    rep->bwd_ms_per_iter = median(it, I);
    free(it);
    rep->bwd_flops = 2.5 * rep->flops;
    rep->bwd_tflops = rep->bwd_ms_per_iter > 0 ? rep->bwd_flops / (rep->bwd_ms_per_iter * 1e-3) / 1e12 : 0;
    for (int p = 0; p < P; p++)
        if (x->bwd_bytes[p] > rep->bwd_bytes_sent_per_rank)
            rep->bwd_bytes_sent_per_rank = x->bwd_bytes[p];
    if (!opt->check)
        return NULL;
    size_t es = (size_t)cpc_dtype_size(L->dtype);
    size_t nq = (size_t)(L->B * L->S) * (size_t)L->H * (size_t)L->D;
    size_t nkv = (size_t)(L->B * L->Skv) * (size_t)L->Hkv * (size_t)L->D;
    void *q = malloc(nq * es), *k = malloc(nkv * es), *v = malloc(nkv * es), *dout = malloc(nq * es);
    double *rq = malloc(nq * sizeof *rq), *rk = malloc(nkv * sizeof *rk), *rv = malloc(nkv * sizeof *rv);
    cpc_status *st = NULL;
    if (!q || !k || !v || !dout || !rq || !rk || !rv) {
        st = cpc_error(CPC_E_NOMEM, "backward check: out of memory");
        goto done;
    }
    cpc_run wq = {0, L->S}, wk = {0, L->Skv};
    if ((st = make_input(x, CPC_RNG_Q, NULL, &wq, 1, q)) || (st = make_input(x, CPC_RNG_K, NULL, &wk, 1, k)) ||
        (st = make_input(x, CPC_RNG_V, NULL, &wk, 1, v)) || (st = make_dout(x, NULL, &wq, 1, dout)))
        goto done;
    cpc_ref_problem pb = {.B = L->B, .S = L->S, .Skv = L->Skv, .H = L->H, .Hkv = L->Hkv,
                          .D = L->D, .dtype = L->dtype, .q = q, .k = k, .v = v,
                          .scale = (double)(float)x->scale, .causal = L->causal,
                          .kv_mask = x->mask};
    if (opt->log)
        fprintf(opt->log, "cprun: checking dq, dk, dv against the float64 reference backward...\n");
    if ((st = cpc_reference_attention_bwd(&pb, dout, rq, rk, rv)))
        goto done;
    double tol = L->dtype == CPC_DTYPE_BF16 ? 2e-2 : cpc_check_tolerance(L->dtype);
    const float *got[3] = {x->dq, x->dk, x->dv};
    const double *ref[3] = {rq, rk, rv};
    size_t n[3] = {nq, nkv, nkv};
    rep->bwd_pass = true;
    for (int i = 0; i < 3 && !st; i++) {
        /* the gradients as returned (--output: the plan dtype, rounded once
         * from the fp32 accumulators), and the accumulators themselves */
        cpc_compare_result cr, ca;
        cpc_compare_init(&ca);
        cpc_compare_add(&ca, got[i], CPC_DTYPE_FP32, ref[i], (int64_t)n[i]);
        cpc_compare_finish(&ca, tol);
        rep->bwd_rel_err_fp32[i] = ca.rel_err;
        if (L->dtype == CPC_DTYPE_FP32) {
            cr = ca;
        } else {
            void *r = malloc(n[i] * es + 1);
            if (!r) {
                st = cpc_error(CPC_E_NOMEM, "backward check: out of memory");
                break;
            }
            cpc_from_f32_n(r, L->dtype, got[i], n[i]);
            cpc_compare_init(&cr);
            cpc_compare_add(&cr, r, L->dtype, ref[i], (int64_t)n[i]);
            cpc_compare_finish(&cr, tol);
            free(r);
        }
        rep->bwd_rel_err[i] = cr.rel_err;
        rep->bwd_max_abs_err[i] = cr.max_abs_err;
        rep->bwd_n_nan[i] = cr.n_nan;
        rep->bwd_n_inf[i] = cr.n_inf;
        rep->bwd_pass = rep->bwd_pass && cr.pass;
    }
    if (st)
        goto done;
    rep->bwd_tolerance = tol;
    rep->bwd_checked = true;
done:
    free(q);
    free(k);
    free(v);
    free(dout);
    free(rq);
    free(rk);
    free(rv);
    return st;
}

/* cpc_job_run, local transport: the ranks' worlds.  C = T = 1: one R x U
 * world (x->world).  C*T > 1 (placement.h): one R x U world per (c, t) group
 * for the programs (x->sub_worlds) and the job's P x 1 world for the result
 * collection (x->world; a failing rank aborts both of its worlds).  With
 * device copies every world copies with x->bes: a group's world with its
 * own R*U slots, indexed by q. */
static cpc_status *open_local_worlds(run_ctx *x, bool device_copies)
{
    const cpc_run_options *opt = x->opt;
    double lim = opt->timeout_s == 0 ? CPC_LOCAL_TIMEOUT_S : opt->timeout_s;
    int P = x->pl.P, n_groups = x->pl.C * x->pl.T;
    cpc_status *st;
    if (device_copies && !(x->bes = calloc((size_t)P, sizeof *x->bes)))
        return cpc_error(CPC_E_NOMEM, "out of memory");
    if (n_groups == 1) {
        if ((st = cpc_local_world_create(x->L->R, x->L->U, &x->world)))
            return st;
        cpc_local_world_set_timeout(x->world, lim);
        if (device_copies)
            cpc_local_world_set_copy(x->world, cpc_device_copy, x->bes);
        return NULL;
    }
    if ((st = cpc_local_world_create(P, 1, &x->world)))
        return st;
    cpc_local_world_set_timeout(x->world, lim);
    x->sub_worlds = calloc((size_t)n_groups, sizeof *x->sub_worlds);
    x->job_tr = calloc((size_t)P, sizeof *x->job_tr);
    if (!x->sub_worlds || !x->job_tr)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    for (int g = 0; g < n_groups; g++) {
        if ((st = cpc_local_world_create(x->L->R, x->L->U, &x->sub_worlds[g])))
            return st;
        cpc_local_world_set_timeout(x->sub_worlds[g], lim);
        if (device_copies)
            cpc_local_world_set_copy(x->sub_worlds[g], cpc_device_copy, x->bes + (size_t)g * (size_t)x->pl.RU);
    }
    return NULL;
}

/* World rank p's endpoints: x->tr[p] (its program's world) and, with
 * C*T > 1, x->job_tr[p] (the job's world). */
static cpc_status *open_local_endpoints(run_ctx *x, int p)
{
    const cpc_rt_transport_entry *te = cpc_rt_transport_get(CPC_RT_TRANSPORT_LOCAL);
    cpc_rt_transport_params tp = {.ring_degree = x->L->R, .ulysses_degree = x->L->U, .world = x->world, .rank = p};
    if (!x->sub_worlds)
        return te->create(&tp, &x->tr[p]);
    cpc_rank_place rp = cpc_placement_rank(&x->pl, p);
    cpc_rt_transport_params gp = tp;
    gp.world = x->sub_worlds[rp.group];
    gp.rank = rp.q;
    cpc_status *st = te->create(&gp, &x->tr[p]);
    if (!st)
        st = te->create(&tp, &x->job_tr[p]);
    return st;
}

/* Frees the job-world endpoints and the group worlds (after x->tr's
 * endpoints; x->world is the caller's). */
static void close_local_worlds(run_ctx *x)
{
    if (x->job_tr)
        for (int p = 0; p < x->pl.P; p++)
            cpc_transport_destroy(x->job_tr[p]);
    free(x->job_tr);
    x->job_tr = NULL;
    if (x->sub_worlds)
        for (int g = 0; g < x->pl.C * x->pl.T; g++)
            cpc_local_world_destroy(x->sub_worlds[g]);
    free(x->sub_worlds);
    x->sub_worlds = NULL;
}

/* cpc_job_run, step 2 (MPI jobs): this process's endpoint, NCCL or MPI, its
 * world rank and its GPU (local rank mod visible GPUs), and the MPI stall
 * limit.  Collective; every rank fails alike.  Errors: those of
 * the transport registry's create (rank.h). */
static cpc_status *open_mpi_endpoint(run_ctx *x, const cpc_run_options *opt, bool use_nccl,
                                     cpc_transport **mpi_t, int *my_rank)
{
    cpc_status *st = NULL;
    const cpc_layout *L = x->L;
    /* the transports of this build (rank.h's registry) */
    const cpc_rt_transport_entry *te = cpc_rt_transport_get(use_nccl ? CPC_RT_TRANSPORT_NCCL : CPC_RT_TRANSPORT_MPI);
    if (!te)
        return cpc_error(CPC_E_UNSUPPORTED, "--transport %s: this build has no %s", use_nccl ? "nccl" : "mpi",
                         use_nccl ? "NCCL (or no MPI)" : "MPI support");
    cpc_rt_transport_params tp = {.ring_degree = L->R, .ulysses_degree = L->U, .device = -1};
    if (use_nccl) {
        /* no GPU: "no CUDA device: ..." on every rank alike */
        if ((st = te->create(&tp, mpi_t)))
            return st;
        *my_rank = cpc_transport_group_rank(*mpi_t, CPC_GROUP_WORLD);
        x->mpi_device = te->device_of(*mpi_t);
        return NULL;
    }
    /* the stall limit of every MPI wait (transport_mpi.h), set before MPI_Init:
     * it also bounds the MPI calls that cannot poll (init, communicator setup,
     * finalize: the transport's watchdog, issue 23) */
    double lim = opt->timeout_s < 0 ? 0
                 : opt->timeout_s > 0 ? opt->timeout_s
                                     : cpc_run_default_timeout(x->job, opt, true);
    te->set_stall_limit(lim);
    if (x->pl.C * x->pl.T > 1) {
        /* The outer axes (placement.h): the job's world (P x 1, the result
         * collection), then this rank's group: MPI_COMM_WORLD split by
         * c*T + t, ordered by q = r*U + u.  Every rank fails alike. */
        char mesh[160];
        snprintf(mesh, sizeof mesh, "cfg_degree %d x tp_degree %d x ring_degree %d x ulysses_degree %d",
                 x->pl.C, x->pl.T, L->R, L->U);
        cpc_rt_transport_params jp = {.job_world = true, .world_size = x->pl.P, .mesh = mesh};
        if ((st = te->create(&jp, &x->mpi_job_t)))
            return st;
        int wr = cpc_transport_group_rank(x->mpi_job_t, CPC_GROUP_WORLD);
        cpc_rank_place rp = cpc_placement_rank(&x->pl, wr);
        tp.split = true;
        tp.group = rp.group;
        tp.rank = rp.q;
    }
    /* Every rank fails alike here (world size check), none is left waiting. */
    if ((st = te->create(&tp, mpi_t)))
        return st;
    if (opt->log)
        fprintf(opt->log, "cprun: MPI stall limit %.0f s per wait%s\n", lim,
                opt->timeout_s > 0 ? " (--timeout)" : opt->timeout_s < 0 ? " (none)" : " (default)");
    *my_rank = cpc_transport_group_rank(x->mpi_job_t ? x->mpi_job_t : *mpi_t, CPC_GROUP_WORLD);
    /* Placement: GPU = local rank (SPEC section 5), mod visible GPUs.
     * Every rank calls local_rank (it may be collective). */
    if (x->cuda) {
        int lr = te->local_rank();
        x->mpi_device = (lr >= 0 ? lr : *my_rank) % x->n_gpus;
    }
    return NULL;
}

/* cpc_job_run, step 1: the options' defaults and checks, and the transport
 * (use_mpi: this process is one rank of an MPI job; use_nccl: over NCCL).
 * Errors: CPC_E_USAGE, CPC_E_UNSUPPORTED, CPC_E_IO (outputs). */
static cpc_status *resolve_options(cpc_run_options *opt, const cpc_job *job, bool *use_mpi,
                                   bool *use_nccl)
{
    if (!opt->backend)
        opt->backend = "auto";
    if (!opt->attention)
        opt->attention = "auto";
    if (!opt->transport)
        opt->transport = "auto";
    if (!is(opt->backend, "auto") && !is(opt->backend, "cpu") && !is(opt->backend, "cuda"))
        return cpc_error(CPC_E_USAGE, "--backend %s: expected auto, cpu or cuda", opt->backend);
    if (!is(opt->attention, "auto") && !is(opt->attention, "cpu") && !is(opt->attention, "cudnn") &&
        !is(opt->attention, "nvrtc"))
        return cpc_error(CPC_E_USAGE, "--attention %s: expected auto, cpu, cudnn or nvrtc", opt->attention);
    /* where the results go, before the run (every rank alike) */
    cpc_status *ost = cpc_run_check_outputs(opt, job->source);
    if (ost)
        return ost;
    *use_mpi = *use_nccl = false;
    if (strcmp(opt->transport, "nccl") == 0) {
        *use_nccl = true;
    } else if (strcmp(opt->transport, "mpi") == 0) {
        *use_mpi = true;
    } else if (strcmp(opt->transport, "auto") == 0) {
        const cpc_rt_transport_entry *te = cpc_rt_transport_get(CPC_RT_TRANSPORT_MPI);
        *use_mpi = te && te->available();
    } else if (strcmp(opt->transport, "local") != 0) {
        return cpc_error(CPC_E_USAGE, "--transport %s: expected auto, local, mpi or nccl", opt->transport);
    }
    if (*use_mpi && !cpc_rt_transport_get(CPC_RT_TRANSPORT_MPI))
        return cpc_error(CPC_E_UNSUPPORTED, "--transport mpi: this build of cprun has no MPI support");
    if (opt->iters < 1)
        return cpc_error(CPC_E_USAGE, "--iters must be at least 1");
    if (opt->warmup < 0)
        return cpc_error(CPC_E_USAGE, "--warmup must not be negative");
    return NULL;
}

cpc_status *cpc_job_run(const cpc_job *job, const cpc_run_options *opt_in, cpc_run_report *rep,
                        bool *is_root)
{
    memset(rep, 0, sizeof *rep);
    if (is_root)
        *is_root = true;
    cpc_run_options opt = *opt_in;
    bool use_mpi = false, use_nccl = false;
    cpc_status *ost = resolve_options(&opt, job, &use_mpi, &use_nccl);
    if (ost)
        return ost;

    const cpc_layout *L = &job->prog->layout;
    int P = L->P;
    run_ctx x;
    memset(&x, 0, sizeof x);
    x.job = job;
    x.opt = &opt;
    x.L = L;
    x.mpi_device = -1;
    /* The outer axes (placement.h): C*T groups of L->P ranks, world P. */
    cpc_status *pst = cpc_placement_init(&x.pl, job->plan, L);
    if (pst)
        return pst;
    x.G = cpc_placement_global_layout(&x.pl, L);
    P = x.pl.P;
    const bool axes = x.pl.C * x.pl.T > 1;
    /* Backend (auto: cuda when a GPU and driver are present, else cpu). */
    cpc_status *bst = resolve_backend(&x, &opt, use_nccl ? "--transport nccl" : NULL);
    if (bst)
        return bst;
    /* SPEC section 5: --transport auto under mpirun/srun with the cuda
     * backend is nccl (when this build has it). */
    const bool have_nccl = cpc_rt_transport_get(CPC_RT_TRANSPORT_NCCL) != NULL;
    if (use_mpi && x.cuda && strcmp(opt.transport, "auto") == 0 && have_nccl)
        use_nccl = true;
    /* Ranks that are threads of this process: device buffers move device to
     * device (transport_device.h) unless staging through host memory was
     * asked for. */
    bool device_copies = !use_mpi && ((x.cuda && !opt.staged) || opt.device_transport);
    if (use_nccl && axes)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "--transport nccl: cfg_degree %d x tp_degree %d runs over the mpi and local transports "
                         "only for now (the NCCL endpoint has no group split yet)", x.pl.C, x.pl.T);
    if (use_nccl) {
        /* NCCL (runtime/transport/transport_nccl.h): one process per rank, GPU = local
         * rank mod visible GPUs, bootstrapped over MPI; device buffers go
         * straight to NCCL (no staging). */
        if (!have_nccl)
            return cpc_error(CPC_E_UNSUPPORTED, "--transport nccl: this build has no NCCL (or no MPI)");
        use_mpi = true;
    }
    x.scale = job->plan->model.scale > 0 ? job->plan->model.scale : 1.0 / sqrt((double)L->D);
    x.n_iter = opt.warmup + opt.iters;
    x.trace = opt.trace_path != NULL;
    cpc_status *st = NULL;
    cpc_transport *mpi_t = NULL;
    int my_rank = 0;
    if (use_mpi && (st = open_mpi_endpoint(&x, &opt, use_nccl, &mpi_t, &my_rank)))
        goto out;
    /* From here on, a setup failure on one MPI rank ends the whole job
     * (setup_failed): the other ranks would otherwise wait for it. */
    if ((st = check_memory(&x, use_mpi, my_rank)))
        goto setup_failed;
    if (opt.input_path && (st = open_input(&x)))
        goto setup_failed;
    if (job->plan->input.mask == CPC_MASK_KEY_PADDING && (st = make_mask(&x)))
        goto setup_failed;
    if (opt.output_shards_dir && (st = mkdir_p(opt.output_shards_dir)))
        goto setup_failed;
    if (opt.output_shards_dir && !(x.shard_of = calloc((size_t)P, sizeof *x.shard_of))) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto setup_failed;
    }
    if (x.cuda && (st = prepare_kernels(&x, x.mpi_device >= 0 ? x.mpi_device : 0)))
        goto setup_failed;

    /* the CUDA backend trains with the generated backward kernels
     * (kernels/attention_bwd.cu), which an older artifact lacks */
    bool cuda_bwd = false;
    for (int i = 0; x.cuda && i < x.n_kernels; i++)
        cuda_bwd = cuda_bwd || strcmp(x.kernels[i].name, "attention_bwd") == 0;
    if (job->bwd && x.cuda && !cuda_bwd) {
        st = cpc_error(CPC_E_UNSUPPORTED,
                       "training plans on the cuda backend need the backward kernels: the artifact "
                       "predates them; compile it again");
        goto setup_failed;
    }
    x.mpi = use_mpi;
    if (job->bwd) {
        /* the whole problem's gradients (cross-attention: dK/dV [B, Skv, Hkv,
         * D]), on rank 0 (backward_gather) */
        size_t nq = my_rank == 0 ? (size_t)x.G.B * (size_t)x.G.S * (size_t)x.G.H * (size_t)x.G.D : 0;
        size_t nkv = my_rank == 0 ? (size_t)x.G.B * (size_t)x.G.Skv * (size_t)x.G.Hkv * (size_t)x.G.D : 0;
        x.dq = calloc(nq + 1, sizeof *x.dq);
        x.dk = calloc(nkv + 1, sizeof *x.dk);
        x.dv = calloc(nkv + 1, sizeof *x.dv);
        x.bwd_ms = calloc((size_t)P * (size_t)x.n_iter, sizeof *x.bwd_ms);
        x.bwd_bytes = calloc((size_t)P, sizeof *x.bwd_bytes);
        if (!x.dq || !x.dk || !x.dv || !x.bwd_ms || !x.bwd_bytes) {
            st = cpc_error(CPC_E_NOMEM, "out of memory for the gradients");
            goto setup_failed;
        }
    }
    cpc_cpu_backend_single_thread_blas();
    x.res = calloc((size_t)P, sizeof *x.res);
    x.st = calloc((size_t)P, sizeof *x.st);
    if (!x.res || !x.st) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto setup_failed;
    }
    if (my_rank == 0) {
        const cpc_layout *G = &x.G; /* the gathered tensors are the whole problem's */
        size_t ob = (size_t)(G->B * G->S) * (size_t)G->H * (size_t)G->D *
                    (size_t)cpc_dtype_size(G->dtype);
        x.out = malloc(ob ? ob : 1);
        if (opt.write_lse)
            x.lse = malloc((size_t)(G->B * G->S) * (size_t)G->H * sizeof(float) + 1);
        if (!x.out || (opt.write_lse && !x.lse)) {
            st = cpc_error(CPC_E_NOMEM, "out of memory for the gathered output");
            goto setup_failed;
        }
        if (x.lse)
            for (size_t i = 0; i < (size_t)(G->B * G->S) * (size_t)G->H; i++)
                x.lse[i] = -INFINITY;
    }
    if (opt.log)
        fprintf(opt.log, "cprun: %s: %s %d x %d, %d rank%s (%s transport%s), %s backend%s, %d warmup + %d iteration%s\n",
                job->plan->name ? job->plan->name : "plan", cpc_variant_name(L->variant), L->R,
                L->U, P, P == 1 ? "" : "s", use_mpi ? (use_nccl ? "nccl" : "mpi") : "local",
                device_copies ? ", device to device"
                : x.cuda || opt.staged ? ", staged through host memory" : "",
                x.cuda ? "cuda" : "cpu",
                !x.cuda ? ""
                : use_mpi ? " (GPU = local rank mod visible GPUs)"
                : x.n_gpus < P ? " (rank r on GPU r mod visible GPUs: virtual ranks)"
                : " (rank r on GPU r)",
                opt.warmup, opt.iters, opt.iters == 1 ? "" : "s");
    if (opt.log && axes && my_rank == 0)
        fprintf(opt.log, "cprun: cfg_degree %d x tp_degree %d: %d groups of %d ranks, each batch %d of %d and "
                         "heads %d of %d (kv_heads %d of %d); rank p = ((c*R + r)*U + u)*T + t\n",
                x.pl.C, x.pl.T, x.pl.C * x.pl.T, L->P, L->B, x.pl.B, L->H, x.pl.H, L->Hkv, x.pl.Hkv);
    if (opt.log && job->priced && my_rank == 0)
        fprintf(opt.log, "cprun: cost model predicts %.3f ms per layer (compute %.3f ms, exposed communication %.3f ms)\n",
                job->pred.ms_per_layer, job->pred.compute_ms_per_layer, job->pred.comm_ms_per_layer);
    long_run_notice(&x, my_rank);
    if (use_mpi) {
        x.st[my_rank] = rank_main(&x, my_rank, &mpi_t, x.tname, sizeof x.tname);
        st = x.st[my_rank];
        x.st[my_rank] = NULL;
        if (!st && x.shard_of) {
            /* every rank's shard is written before any is renamed */
            cpc_transport *wt = x.mpi_job_t ? x.mpi_job_t : mpi_t;
            st = cpc_transport_barrier(wt, CPC_GROUP_WORLD);
            cpc_status *fs = shards_finish(&x, !st, my_rank == 0);
            if (!st)
                st = fs;
            else
                cpc_status_free(fs);
        }
        if (st)
            goto out;
        if (my_rank != 0) {
            if (is_root)
                *is_root = false;
            goto out;
        }
    } else {
        if ((st = open_local_worlds(&x, device_copies)))
            goto out;
        x.tr = calloc((size_t)P, sizeof *x.tr);
        pthread_t *th = calloc((size_t)P, sizeof *th);
        thread_arg *ta = calloc((size_t)P, sizeof *ta);
        bool *started = calloc((size_t)P, sizeof *started);
        if (!x.tr || !th || !ta || !started) {
            free(th);
            free(ta);
            free(started);
            st = cpc_error(CPC_E_NOMEM, "out of memory");
            goto out;
        }
        for (int p = 0; p < P && !st; p++)
            st = open_local_endpoints(&x, p);
        for (int p = 0; p < P && !st; p++) {
            ta[p] = (thread_arg){&x, p};
            int e = pthread_create(&th[p], NULL, rank_thread, &ta[p]);
            if (e) {
                st = cpc_error(CPC_E_RUNTIME, "cannot start the thread of rank %d: %s", p, strerror(e));
                cpc_local_world_abort(x.world, -1, st->message);
                for (int g = 0; x.sub_worlds && g < x.pl.C * x.pl.T; g++)
                    cpc_local_world_abort(x.sub_worlds[g], -1, st->message);
            } else {
                started[p] = true;
            }
        }
        for (int p = 0; p < P; p++)
            if (started[p])
                pthread_join(th[p], NULL);
        free(th);
        free(ta);
        free(started);
        cpc_status *rc = root_cause(&x, P);
        if (!st)
            st = rc;
        else
            cpc_status_free(rc);
        cpc_status *fs = shards_finish(&x, !st, true);
        if (!st)
            st = fs;
        else
            cpc_status_free(fs);
        if (st)
            goto out;
    }

    /* ---- rank 0: report, check, outputs ---- */
    snprintf(rep->plan_name, sizeof rep->plan_name, "%s", job->plan->name ? job->plan->name : "plan");
    snprintf(rep->variant, sizeof rep->variant, "%s", cpc_variant_name(L->variant));
    rep->ring_degree = L->R;
    rep->ulysses_degree = L->U;
    rep->cfg_degree = x.pl.C;
    rep->tp_degree = x.pl.T;
    rep->ranks = P;
    snprintf(rep->backend, sizeof rep->backend, "%s", x.cuda ? "cuda" : "cpu");
    attention_text(rep->attention, sizeof rep->attention, &x, P);
    {
        /* The endpoint's own name: "local", "mpi", or "local+staged" ... */
        snprintf(rep->transport, sizeof rep->transport, "%s",
                 x.tname[0] ? x.tname : use_mpi ? "mpi" : "local");
    }
    snprintf(rep->dtype, sizeof rep->dtype, "%s", cpc_dtype_name(L->dtype));
    if (opt.input_path)
        snprintf(rep->input, sizeof rep->input, "%s", opt.input_path);
    else
        snprintf(rep->input, sizeof rep->input, "random normal, seed %llu", (unsigned long long)opt.seed);
    rep->B = x.G.B;
    rep->S = L->S;
    rep->Skv = L->Skv;
    rep->H = x.G.H;
    rep->Hkv = x.G.Hkv;
    rep->D = L->D;
    rep->causal = L->causal;
    rep->warmup = opt.warmup;
    rep->iters = opt.iters;
    rep->iter_ms = calloc((size_t)opt.iters, sizeof(double));
    rep->rank_bytes_sent = calloc((size_t)P, sizeof(int64_t));
    rep->rank_peak_bytes = calloc((size_t)P, sizeof(int64_t));
    rep->rank_comm_ms = calloc((size_t)P, sizeof(double));
    rep->rank_compute_ms = calloc((size_t)P, sizeof(double));
    if (!rep->iter_ms || !rep->rank_bytes_sent || !rep->rank_peak_bytes || !rep->rank_comm_ms ||
        !rep->rank_compute_ms) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < opt.iters; i++) {
        double m = 0;
        for (int p = 0; p < P; p++)
            if (x.res[p].iter_ms && x.res[p].iter_ms[opt.warmup + i] > m)
                m = x.res[p].iter_ms[opt.warmup + i];
        rep->iter_ms[i] = m;
    }
    rep->ms_per_iter = median(rep->iter_ms, opt.iters);
    /* The iteration closest to the median, for the per-rank split. */
    int mi = 0;
    for (int i = 1; i < opt.iters; i++)
        if (fabs(rep->iter_ms[i] - rep->ms_per_iter) < fabs(rep->iter_ms[mi] - rep->ms_per_iter))
            mi = i;
    for (int p = 0; p < P; p++) {
        rep->rank_bytes_sent[p] = x.res[p].bytes_sent;
        rep->rank_peak_bytes[p] = x.res[p].peak;
        if (x.res[p].comm_ms) {
            rep->rank_comm_ms[p] = x.res[p].comm_ms[opt.warmup + mi];
            rep->rank_compute_ms[p] = x.res[p].compute_ms[opt.warmup + mi];
        }
        if (x.res[p].bytes_sent > rep->bytes_sent_per_rank)
            rep->bytes_sent_per_rank = x.res[p].bytes_sent;
        if (x.res[p].peak > rep->peak_memory_bytes_per_rank)
            rep->peak_memory_bytes_per_rank = x.res[p].peak;
    }
    rep->flops = 4.0 * (double)x.G.B * (double)L->S * (double)L->Skv * x.G.H * L->D;
    if (L->causal)
        rep->flops *= 0.5;
    rep->tflops = rep->ms_per_iter > 0 ? rep->flops / (rep->ms_per_iter * 1e-3) / 1e12 : 0;
    rep->bandwidth_gbps = rep->ms_per_iter > 0
                              ? (double)rep->bytes_sent_per_rank / (rep->ms_per_iter * 1e-3) / 1e9
                              : 0;
    if (opt.trace_path) {
        cpc_trace_rank *tr = calloc((size_t)P, sizeof *tr);
        if (!tr) {
            st = cpc_error(CPC_E_NOMEM, "out of memory");
            goto out;
        }
        for (int p = 0; p < P; p++)
            tr[p] = (cpc_trace_rank){p, x.res[p].ev, x.res[p].ev_iter, x.res[p].n_ev};
        st = cpc_trace_write(opt.trace_path, rep->plan_name, tr, P);
        free(tr);
        if (st)
            goto out;
    }
    if (opt.output_path && (st = write_output(&x)))
        goto out;
    if (opt.check) {
        if (opt.log)
            fprintf(opt.log, "cprun: checking against the float64 reference...\n");
        if ((st = run_check(&x, rep)))
            goto out;
    }
    if (job->bwd && (st = backward_report(&x, rep)))
        goto out;
    rep->ok = (!rep->checked || rep->pass) && (!rep->bwd_checked || rep->bwd_pass);
    goto out;
setup_failed:
    if (mpi_t) {
        /* "cprun: rank P: aborting: ...", every rank ends with this status
         * (2 for an input error, 3 for a runtime one). */
        const cpc_rt_transport_entry *me =
            cpc_rt_transport_get(use_nccl ? CPC_RT_TRANSPORT_NCCL : CPC_RT_TRANSPORT_MPI);
        char *msg = cpc_status_format(st, "cprun");
        int code = cpc_status_exit_code(st);
        if (opt.before_abort)
            opt.before_abort(opt.before_abort_ctx, st, code ? code : 3);
        if (me && me->abort_job)
            me->abort_job(code ? code : 3, msg ? msg : st->message);
        free(msg);
    }
out:
    cpc_status_free(shards_finish(&x, false, false)); /* a failed run: nothing renamed */
    if (x.res)
        for (int p = 0; p < P; p++)
            rank_out_free(&x.res[p]);
    free(x.res);
    if (x.tr)
        for (int p = 0; p < P; p++)
            if (x.tr[p])
                cpc_transport_destroy(x.tr[p]);
    free(x.tr);
    close_local_worlds(&x);
    free(x.st);
    free(x.bes);
    cpc_local_world_destroy(x.world);
    if (mpi_t)
        cpc_transport_destroy(mpi_t);
    if (x.mpi_job_t) /* after the group's endpoint: it may finalise MPI */
        cpc_transport_destroy(x.mpi_job_t);
    if (use_nccl) {
        /* NCCL's bootstrap left MPI initialised (also on failure) */
        const cpc_rt_transport_entry *ne = cpc_rt_transport_get(CPC_RT_TRANSPORT_NCCL);
        if (ne && ne->finalize)
            ne->finalize();
    }
    cpc_st_close(x.in);
    free_kernels(&x);
    free(x.mask);
    free(x.out);
    free(x.lse);
    free(x.dq);
    free(x.dk);
    free(x.dv);
    free(x.bwd_ms);
    free(x.bwd_bytes);
    return st;
}
