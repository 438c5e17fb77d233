/*
 * api_session.c - include/cpc/session.h over the session layer (run.h,
 * calibrate.h) and the io layer's report (report.h).  The public options use
 * enums; the session's use the option strings of cprun's command line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpc/session.h"

#include "api_options.h"
#include "api_session.h"
#include "calibrate.h"
#include "cost.h"
#include "executor.h"
#include "report.h"
#include "run.h"
#include "status.h"
#include "tune.h"

void cpc_job_options_init(cpc_job_options *o, size_t size)
{
    cpc_run_options d;
    cpc_run_options_default(&d);
    cpc_job_options j = {.size = sizeof j, .backend = CPC_BACKEND_AUTO,
                         .attention = CPC_ATTENTION_AUTO, .transport = CPC_TRANSPORT_AUTO,
                         .seed = d.seed, .check = d.check, .check_rows = d.check_rows,
                         .check_full_flops = d.check_full_flops, .warmup = d.warmup,
                         .iters = d.iters, .timeout_s = d.timeout_s};
    cpc_api_init_options(o, size, &j, sizeof j);
}

static const char *backend_str(cpc_backend_kind k)
{
    return k == CPC_BACKEND_CPU ? "cpu" : k == CPC_BACKEND_CUDA ? "cuda" : "auto";
}

static const char *attention_str(cpc_attention_kind k)
{
    static const char *const n[] = {"auto", "cpu", "cudnn", "nvrtc"};
    return (unsigned)k < 4 ? n[k] : "?";
}

static const char *transport_str(cpc_transport_kind k)
{
    static const char *const n[] = {"auto", "local", "mpi", "nccl"};
    return (unsigned)k < 4 ? n[k] : "?";
}

/* The session's options for the caller's public ones (NULL: defaults; read
 * by the size rule, api_options.h); a bad size and unknown enum values are
 * usage errors. */
cpc_status *cpc_api_job_run_options(const cpc_job_options *caller, cpc_run_options *r, const char *fn)
{
    cpc_run_options_default(r);
    cpc_job_options j;
    cpc_job_options_init(&j, sizeof j);
    cpc_status *st = cpc_api_read_options(&j, sizeof j, CPC_JOB_OPTIONS_SIZE_V1, caller, fn,
                                          "cpc_job_options");
    if (st)
        return st;
    const cpc_job_options *o = &j;
    if ((unsigned)o->backend > CPC_BACKEND_CUDA)
        return cpc_error(CPC_E_USAGE, "unknown backend %d", (int)o->backend);
    if ((unsigned)o->attention > CPC_ATTENTION_NVRTC)
        return cpc_error(CPC_E_USAGE, "unknown attention %d", (int)o->attention);
    if ((unsigned)o->transport > CPC_TRANSPORT_NCCL)
        return cpc_error(CPC_E_USAGE, "unknown transport %d", (int)o->transport);
    r->backend = backend_str(o->backend);
    r->attention = attention_str(o->attention);
    r->transport = transport_str(o->transport);
    r->input_path = o->input_path;
    r->seed = o->seed;
    r->output_path = o->output_path;
    r->output_shards_dir = o->output_shards_dir;
    r->write_lse = o->write_lse;
    r->check = o->check;
    r->check_rows = o->check_rows;
    r->check_full_flops = o->check_full_flops;
    r->warmup = o->warmup;
    r->iters = o->iters;
    r->trace_path = o->trace_path;
    r->timeout_s = o->timeout_s;
    r->log = o->log;
    r->before_abort = o->before_abort;
    r->before_abort_ctx = o->before_abort_ctx;
    return NULL;
}

/* Moves the errors of `all` into the result and the rest into *diagnostics. */
static cpc_status *split(cpc_status *all, cpc_status **diagnostics)
{
    cpc_status *errors = NULL, *rest = NULL, **et = &errors, **rt = &rest;
    while (all && all != &cpc_status_oom) {
        cpc_status *next = all->next;
        all->next = NULL;
        if (all->severity == CPC_SEV_ERROR)
            *et = all, et = &all->next;
        else
            *rt = all, rt = &all->next;
        all = next;
    }
    if (all == &cpc_status_oom)
        *et = all;
    if (diagnostics)
        *diagnostics = rest;
    else
        cpc_status_free(rest);
    return errors;
}

cpc_status *cpc_job_new(const char *path, const char *const *sets, int n_sets, cpc_job **out,
                         cpc_status **diagnostics)
{
    if (diagnostics)
        *diagnostics = NULL;
    if (!out || !path)
        return cpc_error(CPC_E_USAGE, "cpc_job_new: path and out must not be NULL");
    *out = NULL;
    cpc_job *job = NULL;
    cpc_status *errors = split(cpc_job_load(path, sets, n_sets, &job), diagnostics);
    if (errors || !job) {
        cpc_job_free(job);
        return errors ? errors : cpc_error(CPC_E_INTERNAL, "%s: the job was not loaded", path);
    }
    *out = job;
    return NULL;
}

const char *cpc_job_variant(const cpc_job *job) { return job ? cpc_variant_name(job->prog->layout.variant) : NULL; }
int cpc_job_ring_degree(const cpc_job *job) { return job ? job->prog->layout.R : 0; }
int cpc_job_ulysses_degree(const cpc_job *job) { return job ? job->prog->layout.U : 0; }
int cpc_job_world_size(const cpc_job *job)
{
    if (!job)
        return 0;
    /* with cfg_degree x tp_degree > 1, C*T groups run the R x U program */
    return job->prog->layout.P * cpc_plan_cfg_degree(job->plan) * cpc_plan_tp_degree(job->plan);
}

cpc_status *cpc_job_peak_memory(const cpc_job *job, int64_t *bytes)
{
    if (!job || !bytes)
        return cpc_error(CPC_E_USAGE, "cpc_job_peak_memory: job and bytes must not be NULL");
    *bytes = 0;
    for (int p = 0; p < job->prog->layout.P; p++) {
        cpc_exec_memory m;
        cpc_status *st = cpc_exec_memory_plan(job->prog, p, &m);
        if (st)
            return st;
        if (m.total_bytes > *bytes)
            *bytes = m.total_bytes;
        cpc_exec_memory_free(&m);
    }
    return NULL;
}

cpc_status *cpc_job_execute(const cpc_job *job, const cpc_job_options *o, cpc_run_report **report,
                            bool *is_root)
{
    if (!report)
        return cpc_error(CPC_E_USAGE, "cpc_job_execute: report must not be NULL");
    *report = NULL;
    if (!job)
        return cpc_error(CPC_E_USAGE, "cpc_job_execute: job must not be NULL");
    cpc_run_options r;
    cpc_status *st = cpc_api_job_run_options(o, &r, "cpc_job_execute");
    if (st)
        return st;
    cpc_run_report *rep = calloc(1, sizeof *rep);
    if (!rep)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    bool root = true;
    st = cpc_job_run(job, &r, rep, &root);
    if (is_root)
        *is_root = root;
    if (st || !root) {
        cpc_run_report_free(rep);
        return st;
    }
    *report = rep;
    return NULL;
}

bool cpc_run_report_ok(const cpc_run_report *r) { return r && r->ok; }

char *cpc_run_report_failure(const cpc_run_report *r)
{
    if (!r || r->ok)
        return NULL;
    char *s = NULL;
    int n;
    int64_t bn = 0;
    for (int i = 0; i < 3; i++)
        bn += r->bwd_n_nan[i] + r->bwd_n_inf[i];
    if ((!r->checked || r->pass) && r->bwd_checked && !r->bwd_pass) {
        /* only the backward failed: quote its figures, not the forward's */
        if (bn)
            n = asprintf(&s,
                         "the gradients have non-finite values (NaN/Inf: dq %lld/%lld, dk %lld/%lld, "
                         "dv %lld/%lld; a NaN or Inf in dout or the inputs reaches them)",
                         (long long)r->bwd_n_nan[0], (long long)r->bwd_n_inf[0],
                         (long long)r->bwd_n_nan[1], (long long)r->bwd_n_inf[1],
                         (long long)r->bwd_n_nan[2], (long long)r->bwd_n_inf[2]);
        else
            n = asprintf(&s,
                         "backward relative error dq %.3e, dk %.3e, dv %.3e exceeds the %s "
                         "tolerance %.2e",
                         r->bwd_rel_err[0], r->bwd_rel_err[1], r->bwd_rel_err[2], r->dtype,
                         r->bwd_tolerance);
    } else if (r->n_nan || r->n_inf)
        n = asprintf(&s,
                     "the output has %lld NaN and %lld Inf values (first at out[%lld, %lld, %lld, "
                     "%lld]; relative error of the finite values %.3e)",
                     (long long)r->n_nan, (long long)r->n_inf, (long long)r->first_bad[0],
                     (long long)r->first_bad[1], (long long)r->first_bad[2],
                     (long long)r->first_bad[3], r->rel_err);
    else
        n = asprintf(&s, "relative error %.3e exceeds the %s tolerance %.2e", r->rel_err, r->dtype,
                     r->tolerance);
    return n < 0 ? NULL : s;
}

void cpc_run_report_free(cpc_run_report *r)
{
    if (!r)
        return;
    cpc_run_report_clear(r);
    free(r);
}

cpc_status *cpc_calibrate_profile(bool quick, int ranks, cpc_transport_kind transport, FILE *log,
                                  const char *out_path, bool *is_root)
{
    if (transport == CPC_TRANSPORT_NCCL || (unsigned)transport > CPC_TRANSPORT_NCCL)
        return cpc_error(CPC_E_USAGE, "calibration measures the CPU backend: transport auto, "
                                      "local or mpi");
    cpc_calibrate_options co = {.quick = quick, .ranks = ranks,
                                .transport = transport_str(transport), .log = log};
    cpc_calibration cal;
    bool root = true;
    cpc_status *st = cpc_calibrate(&co, &cal, &root);
    if (is_root)
        *is_root = root;
    if (!st && root)
        st = cpc_profile_write(out_path ? out_path : "-", &cal.profile);
    return st;
}

cpc_status *cpc_tune_profile(const char *path, const char *const *sets, int n_sets, int warmup,
                             int iters, cpc_transport_kind transport, double timeout_s, FILE *log,
                             const char *out_path, char **written_path, bool *is_root)
{
    if (written_path)
        *written_path = NULL;
    if (is_root)
        *is_root = true;
    if (!path)
        return cpc_error(CPC_E_USAGE, "cpc_tune_profile: path must not be NULL");
    if (transport == CPC_TRANSPORT_NCCL || (unsigned)transport > CPC_TRANSPORT_NCCL)
        return cpc_error(CPC_E_USAGE, "--tune runs over transport auto, local or mpi");
    if (warmup < 0 || iters < 0)
        return cpc_error(CPC_E_USAGE, "--tune: warmup and iters must be >= 0");
    cpc_tune_options to = {.sets = sets, .n_sets = n_sets, .transport = transport_str(transport),
                           .warmup = warmup, .iters = iters, .timeout_s = timeout_s, .log = log,
                           .profile_out = out_path};
    cpc_tune_result r;
    bool root = true;
    cpc_status *st = cpc_tune(path, &to, &r, &root);
    if (is_root)
        *is_root = root;
    if (!st && root) {
        const char *dest = out_path ? out_path : r.profile_path[0] ? r.profile_path : "-";
        st = cpc_profile_write_measured(dest, &r.profile, &r.measured);
        if (!st && written_path && !(*written_path = strdup(dest)))
            st = cpc_error(CPC_E_NOMEM, "out of memory");
    }
    cpc_tune_result_free(&r);
    return st;
}
