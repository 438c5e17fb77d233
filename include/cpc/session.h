/*
 * cpc/session.h - the whole job as cprun runs it (SPEC section 5), as calls:
 * open a plan (YAML, compiled in memory exactly as `cpc --check` does) or a
 * .cplan (proven again), run every rank of it (threads of this process, or
 * this process's rank under mpirun / srun), feed them inputs (random normals
 * from a seed, or a safetensors file), time warmup + timed iterations, gather
 * the output, check it against the float64 reference (every output element
 * scanned for NaN/Inf) and report.  Also the machine calibration behind
 * `cprun --calibrate`.
 *
 * Where cpc/rank.h is one rank on the caller's buffers, this is the harness:
 * cpc owns the ranks, the inputs and the outputs.
 *
 * Thread-safety: a job is read-only once opened; cpc_job_execute may be
 * called from one thread at a time per job.  Under MPI every process of the
 * job calls the same functions in the same order (they are collective).
 */
#ifndef CPC_PUBLIC_SESSION_H
#define CPC_PUBLIC_SESSION_H

#include "cpc/export.h"

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "cpc/rank.h"
#include "cpc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpc_job cpc_job;                /* opaque: a loaded, proven plan */
typedef struct cpc_run_report cpc_run_report;  /* opaque: what a run measured */

typedef enum cpc_attention_kind {
    CPC_ATTENTION_AUTO = 0,   /* CUDA backend: cuDNN where it serves a block, else the
                                 generated kernel; CPU backend: cpu */
    CPC_ATTENTION_CPU,        /* the CPU backend's kernel */
    CPC_ATTENTION_CUDNN,      /* cuDNN SDPA must serve (CUDA backend) */
    CPC_ATTENTION_NVRTC,      /* the generated kernels only (CUDA backend) */
} cpc_attention_kind;

typedef enum cpc_transport_kind {
    CPC_TRANSPORT_AUTO = 0,   /* mpi under an MPI launcher, else local threads */
    CPC_TRANSPORT_LOCAL,      /* every rank a thread of this process */
    CPC_TRANSPORT_MPI,        /* this process is one rank (mpirun / srun) */
    CPC_TRANSPORT_NCCL,       /* CUDA backend, one process per GPU */
} cpc_transport_kind;

/* Run options; fill with cpc_job_options_init(&o, sizeof o) (cprun's defaults), then
 * change fields.  Strings are borrowed for the call. */
typedef struct cpc_job_options {
    size_t size;                   /* sizeof(cpc_job_options) of the caller (compiler.h
                                      THE SIZE MEMBER); first version: the whole struct
                                      (CPC_JOB_OPTIONS_SIZE_V1) */
    cpc_backend_kind backend;      /* default AUTO: CUDA when built with it and a GPU is
                                      usable, else CPU */
    cpc_attention_kind attention;  /* default AUTO */
    cpc_transport_kind transport;  /* default AUTO */
    const char *input_path;        /* safetensors with q, k, v (and mask), global BSHD,
                                      or NULL: random normal inputs from `seed` */
    uint64_t seed;                 /* default 0 */
    const char *output_path;       /* gathered `out` (safetensors), or NULL */
    const char *output_shards_dir; /* each rank writes DIR/rankN.safetensors, or NULL */
    bool write_lse;                /* also `lse` [B, H, S] in output_path */
    bool check;                    /* compare with the float64 reference (default true) */
    int64_t check_rows;            /* rows per (batch, head) when sampling; 0: 64 */
    double check_full_flops;       /* compare every row when the reference costs at most
                                      this many double operations; 0: 4e9; < 0: sample */
    int warmup, iters;             /* defaults 1 and 5 (iters >= 1) */
    const char *trace_path;        /* Chrome trace-event JSON, or NULL */
    double timeout_s;              /* stall limit of every wait, seconds; 0: the default
                                      (3600 s for threads; under MPI max(300 s, 20 x the
                                      predicted time of the run)) */
    FILE *log;                     /* progress lines, or NULL (quiet) */
    /* Called on each MPI rank right before a failure during setup ends the
     * whole job (MPI_Abort, which does not return): the last chance to
     * report.  NULL: nothing. */
    void (*before_abort)(void *ctx, const cpc_status *st, int exit_status);
    void *before_abort_ctx;
} cpc_job_options;

#define CPC_JOB_OPTIONS_SIZE_V1 (offsetof(cpc_job_options, before_abort_ctx) + sizeof(void *))

/* cprun's defaults (see each field) in the first `size` bytes of *o (size =
 * sizeof *o as the caller knows it; a larger struct than this libcpc's gets
 * its tail zeroed), and o->size = size.  o NULL or size < sizeof(size_t):
 * nothing.
 *
 * NULL handles: no function below dereferences a NULL job, options or
 * report; those that return a status give CPC_E_USAGE, the queries 0,
 * false or NULL, the printers print nothing. */
CPC_API void cpc_job_options_init(cpc_job_options *o, size_t size);

/* Makes a job from `path`: a .cplan (read and proven again; `sets` must be empty) or a
 * plan YAML with n_sets "KEY=VALUE" overrides, compiled up to the proof.
 * *out: the job (free with cpc_job_free); warnings go to *diagnostics
 * (may be NULL; caller frees).  Errors (*out NULL): CPC_E_IO, CPC_E_PLAN
 * (rule violations with positions; CP018 for a training plan that cannot
 * train: a Lua schedule script, compiler/schedule_bwd.h), CPC_E_INPUT
 * (a malformed artifact), CPC_E_USAGE (--set on an artifact), CPC_E_NOMEM. */
CPC_API cpc_status *cpc_job_new(const char *path, const char *const *sets, int n_sets, cpc_job **out,
                         cpc_status **diagnostics);

/* Frees a job.  NULL is ignored. */
CPC_API void cpc_job_free(cpc_job *job);

/* The job's selected variant ("ring", ...) and mesh.  The world size is
 * C*T*R*U: with parallel.cfg_degree C x tp_degree T > 1, C*T groups of
 * R x U ranks (SPEC section 1, "All four axes"). */
CPC_API const char *cpc_job_variant(const cpc_job *job);
CPC_API int cpc_job_ring_degree(const cpc_job *job);
CPC_API int cpc_job_ulysses_degree(const cpc_job *job);
CPC_API int cpc_job_world_size(const cpc_job *job);

/* The largest memory any rank allocates (bytes: the schedule's buffers and
 * the all-to-all staging), computed without allocating.  Errors:
 * CPC_E_INTERNAL, CPC_E_NOMEM. */
CPC_API cpc_status *cpc_job_peak_memory(const cpc_job *job, int64_t *bytes);

/* Prints the selected variant, then every rank's buffers and peak memory
 * (at most `max_ranks` ranks in full, then a summary line): cprun
 * --dry-run.  Allocates no buffer. */
CPC_API cpc_status *cpc_job_dry_run(const cpc_job *job, FILE *out, int max_ranks);

/* Runs the job: every rank, warmup + iters iterations, gather, check,
 * report.  On success *report is the report (free with
 * cpc_run_report_free); it exists also when the check failed
 * (cpc_run_report_ok false).  Under MPI only world rank 0 gets a report
 * (*report NULL elsewhere; *is_root, may be NULL, says which).  Outputs are
 * written atomically (a temporary file renamed when complete).  Errors
 * (*report NULL): CPC_E_USAGE (contradicting options), CPC_E_UNSUPPORTED
 * (a backend or transport this build or machine lacks; memory limits that
 * the run would exceed), CPC_E_INPUT, CPC_E_IO, CPC_E_RUNTIME (a rank
 * failed or stalled: names the rank and the op), CPC_E_NOMEM. */
CPC_API cpc_status *cpc_job_execute(const cpc_job *job, const cpc_job_options *o, cpc_run_report **report,
                            bool *is_root);

/* Whether the run completed and its check passed (or was off). */
CPC_API bool cpc_run_report_ok(const cpc_run_report *r);

/* Why the check failed, one line ("the output has 3 NaN and 0 Inf values
 * (first at out[0, 12, 3, 7]) ...", "relative error 2.1e-03 exceeds the
 * bf16 tolerance 1.00e-02"; when only the backward check failed, the
 * backward's figures: "backward relative error dq ..., dk ..., dv ..." or
 * "the gradients have non-finite values (NaN/Inf: dq n/m, ...)"), or NULL
 * when it passed.  Malloc'd; caller frees with free(). */
CPC_API char *cpc_run_report_failure(const cpc_run_report *r);

/* The human-readable report (SPEC section 5). */
CPC_API void cpc_run_report_print_text(const cpc_run_report *r, FILE *out);

/* The JSON report (SPEC section 5: one object, its exact keys) and a
 * newline.  Errors: CPC_E_NOMEM, CPC_E_IO (the stream failed). */
CPC_API cpc_status *cpc_run_report_print_json(const cpc_run_report *r, FILE *out);

/* Frees a report.  NULL is ignored. */
CPC_API void cpc_run_report_free(cpc_run_report *r);

/* cprun --calibrate: measures this machine with the CPU backend (attention
 * rate, memory, copy and collective bandwidth and latency, how ranks share
 * cores; `quick`: small problems, well under a second) over `transport`
 * (AUTO, LOCAL with `ranks` threads (0: 4; 2..64), or MPI under a launcher),
 * logs each measurement to `log` (may be NULL) and writes the profile YAML
 * (for a plan's cluster.profile) to `out_path` ("-": stdout), atomically.
 * Under MPI only world rank 0 writes (*is_root, may be NULL).  Errors:
 * CPC_E_USAGE, CPC_E_UNSUPPORTED (NCCL, MPI not built or one process),
 * CPC_E_RUNTIME, CPC_E_IO, CPC_E_NOMEM. */
CPC_API cpc_status *cpc_calibrate_profile(bool quick, int ranks, cpc_transport_kind transport, FILE *log,
                                  const char *out_path, bool *is_root);

/* cprun --tune: runs every candidate of the plan YAML at `path` (with
 * n_sets "KEY=VALUE" overrides) that validation accepts - each variant and
 * R x U factorisation, in `cpc --explain` order - on the backend the plan's
 * device implies (cpu for cluster.device cpu, else cuda), `warmup` (0: 1)
 * + `iters` (0: 3) iterations each, random inputs, no reference check; over
 * `transport` (AUTO, LOCAL threads, or MPI under a launcher, where every
 * process runs the same candidates in the same order).  Logs one line per
 * candidate (measured and predicted ms per layer) to `log` (may be NULL).
 * Writes the plan's profile (its cluster.device preset overridden by its
 * cluster.profile, with that file's measurements) plus this run's median ms
 * per layer of each candidate under `measured:`, keyed by the problem (shape,
 * dtype, mask, world size, ...), to `out_path`; NULL: the plan's
 * cluster.profile file, or stdout when it names none; "-": stdout.  The
 * write is atomic.  A cluster.profile file that does not exist yet is the
 * preset alone when the tune writes it (out_path NULL or that file), else
 * CPC_E_IO naming it.  A plan whose cluster.profile names that file then
 * selects `auto` by the measured times and `cpc --explain` shows them
 * (column `measured`, JSON `measured_ms_per_layer`).  *written_path (may be
 * NULL): the path written ("-" for stdout), malloc'd; caller frees.  Under
 * MPI only world rank 0 writes (*is_root, may be NULL).  Errors: CPC_E_PLAN
 * / CPC_E_IO (the plan does not load or validate; no valid candidate),
 * CPC_E_USAGE (an artifact, bad options), the run errors of
 * cpc_job_execute naming the candidate, CPC_E_IO (the profile write),
 * CPC_E_NOMEM. */
CPC_API cpc_status *cpc_tune_profile(const char *path, const char *const *sets, int n_sets, int warmup,
                             int iters, cpc_transport_kind transport, double timeout_s, FILE *log,
                             const char *out_path, char **written_path, bool *is_root);

/* DEPRECATED NAMES (rank.h): source compatibility only. */
#ifndef CPC_NO_DEPRECATED
#define cpc_job_open cpc_job_new
#define cpc_job_close cpc_job_free
#define cpc_run_report_destroy cpc_run_report_free
#define cpc_report_print_text(out, r) cpc_run_report_print_text((r), (out))
#define cpc_report_print_json(out, r) cpc_run_report_print_json((r), (out))
#endif

#ifdef __cplusplus
}
#endif
#endif
