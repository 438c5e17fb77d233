/*
 * run.h - the "job" layer of cprun (SPEC section 5): load a plan, start the
 * ranks, feed them inputs, time them, gather the output, check it against
 * the float64 reference and build the report.
 *
 * Loading: a .cplan artifact is read with the artifact reader and its
 * schedule verified again (cpc_verify; a training plan's backward_schedule
 * with cpc_verify_backward); anything else is a plan YAML compiled in
 * memory by the compiler's own pipeline, cpc_compile_file (compile.h) up to
 * CPC_UNTIL_VERIFY, exactly what `cpc --check` runs: load -> validate and
 * price (cost.h) -> Lua choose -> schedule -> Lua schedule -> verify (CP051)
 * -> price the final program (-> training: backward schedule (schedule_bwd.h),
 * proof (verify_bwd.h), price; CP018 for a Lua schedule script).
 *
 * The outer axes (SPEC section 1, "All four axes"; placement.h): with
 * cfg_degree C x tp_degree T > 1 the job's world is P = C*T*R*U ranks;
 * world rank p = ((c*R + r)*U + u)*T + t runs the R x U program (laid out
 * on the plan's (c, t) sub-plan, plan.h cpc_plan_sub) as its group rank
 * q = r*U + u, on batch items [c*B/C, (c+1)*B/C), query heads
 * [t*H/T, (t+1)*H/T) and their K/V heads (random inputs: the same global
 * tensors as any other split; --input: that box of the file; the mask:
 * those batch rows).  Each group has its own transport (a local world per
 * group; under MPI a communicator split from MPI_COMM_WORLD by c*T + t);
 * the results travel to world rank 0 over a second endpoint of the job's
 * whole world (P x 1), which gathers the global out and LSE, checks the
 * whole problem against the float64 reference and writes the outputs.
 * Training plans (every variant) run the backward per group; dK/dV of K/V
 * heads replicated over tensor-parallel ranks (Hkv < T) are summed.  The
 * NCCL transport refuses C*T > 1 (CPC_E_UNSUPPORTED).
 *
 * Backend (--backend, SPEC section 5):
 *   cpu   the CPU backend (backend.h); --attention auto or cpu.
 *   cuda  the CUDA backend (backend_cuda.h; builds with CPC_HAVE_CUDA only):
 *         kernels from the artifact when the job came from a .cplan (an
 *         artifact without PTX is CPC_E_INPUT: "compiled with --no-kernels
 *         or without CUDA"), else generated and compiled here with NVRTC
 *         (codegen.h, for the compute capability of the first GPU used; the
 *         kernel cache makes the next run fast); --attention auto, cudnn or
 *         nvrtc maps to cpc_cuda_backend_set_attention.  Every endpoint is
 *         wrapped by the staged transport (transport_staged.h), which moves
 *         device buffers through host memory.
 *   auto  cuda when the build has CUDA and cpc_cuda_device_count finds a
 *         GPU, else cpu (said on the log); --attention cpu selects cpu,
 *         --attention cudnn/nvrtc and --transport nccl need cuda.
 * Placement: local transport: every rank is a thread of this process, rank
 * r on GPU r mod (visible GPUs) - with one GPU all ranks share it (virtual
 * ranks); under an MPI launcher this process is one rank on GPU = its local
 * rank (cpc_mpi_local_rank) mod visible GPUs.
 *
 * Running: each rank has its own backend and transport endpoint (OpenBLAS
 * set to one thread first).  Each rank makes or reads only its shard of
 * q/k/v (random normals keyed by global element index from --seed, rng.h;
 * or pread of --input, safetensors.h), runs warmup + iters iterations (each:
 * upload the inputs, world barrier, run the program, wait for the device),
 * then sends its timings, attention counts, output shard (and LSE, events)
 * to rank 0 over the transport.  Under an MPI launcher (transport mpi) this
 * process is one rank and the same code runs.
 *
 * Training (SPEC section 10; job->bwd set): after its forward every rank
 * runs the backward program (warmup + iters times) on its q/k/v shards, its
 * `out` shard, its final LSE and its `dout` shard (--input's `dout`, else
 * random from the seed, rng stream 4); its fp32 dq, dk, dv shards go to
 * rank 0 (rank threads: written in place; MPI: one blob per rank on the
 * world group, with its backward times and bytes), which checks them
 * against cpc_reference_attention_bwd and writes them with --output as
 * `dq`, `dk`, `dv` (global BSHD, plan dtype, rounded once from fp32), after
 * `out` (and `lse`) in the same file.  The gradients do not depend on the
 * transport: local and MPI outputs are byte-identical.  The cuda backend
 * and the nccl transport refuse training plans (CPC_E_UNSUPPORTED).
 *
 * Check: the float64 reference (reference.h) on the same rounded inputs:
 * every query row when that costs at most `check_full_flops` double
 * operations, else `check_rows` rows per (batch, head) (stratified sample,
 * first and last row included), compared exactly on those rows.
 *
 * Thread-safety: a job is read-only once loaded; cpc_job_run may be called
 * from one thread at a time per job.
 */
#ifndef CPC_RUN_H
#define CPC_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cost.h"
#include "plan.h"
#include "program.h"
#include "status.h"
#include "report.h"

/* A loaded, verified plan ready to run. */
typedef struct cpc_job {
    cpc_plan *plan;          /* owned unless plan_borrowed */
    bool plan_borrowed;
    cpc_program *prog;       /* owned */
    char *source;            /* the path it came from (owned), or NULL */
    bool from_artifact;
    struct cpc_artifact *artifact; /* owned when from_artifact: plan and prog
                                      then belong to it */
    bool priced;             /* pred is set (YAML plans: the cost model's
                                prediction of the final program on the plan's
                                device / cluster.profile) */
    cpc_prediction pred;
    cpc_program *bwd;        /* training plans: the backward program
                                (schedule_bwd.h), the compiler's or the
                                artifact's, proven; owned; else NULL */
} cpc_job;

/* Loads `path` (.cplan artifact, or plan YAML compiled in memory) with the
 * n_sets --set overrides (YAML only).  Returns the diagnostics chain
 * (warnings and/or errors; caller frees).  On error *out is NULL.  Errors:
 * those of the compiler stages (CPC_E_PLAN with CP codes, CPC_E_IO, ...),
 * CP018 (class CPC_E_PLAN) for a training plan that has no backward program
 * (a Lua schedule script; schedule_bwd.h says what trains); cprun maps every plan
 * rejection to exit status 2.  An artifact of a training plan without a
 * backward_schedule is CPC_E_INPUT ("recompile the plan with cpc"). */
cpc_status *cpc_job_load(const char *path, const char *const *sets, int n_sets, cpc_job **out);

/* Builds a job from an in-memory plan (borrowed: it must outlive the job)
 * for the candidate (variant, R, U): schedule + verify, no validation (with
 * cfg_degree x tp_degree > 1, of the plan's (c, t) sub-plan).
 * For tests and embedders.  Errors: those of cpc_schedule_build and
 * cpc_verify. */
cpc_status *cpc_job_from_plan(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                              int ulysses_degree, cpc_job **out);

/* Frees a job from cpc_job_load / cpc_job_from_plan and all it owns.  NULL is
 * ignored. */
CPC_API void cpc_job_free(cpc_job *job);

/* cprun --dry-run: prints the selected variant, then every rank's buffers and
 * peak memory (at most `max_ranks` ranks in full, then a summary line);
 * for a training plan the backward program's too.  Allocates no buffer. */
CPC_API cpc_status *cpc_job_dry_run(const cpc_job *job, FILE *out, int max_ranks);

typedef struct cpc_run_options {
    const char *backend;         /* "auto" (default), "cpu", "cuda" */
    const char *attention;       /* "auto" (default), "cpu", "cudnn", "nvrtc" */
    const char *transport;       /* "auto" (default), "local", "mpi", "nccl" */
    const char *input_path;      /* --input, or NULL: random inputs from seed */
    uint64_t seed;               /* --seed (default 0) */
    const char *output_path;     /* --output, or NULL */
    const char *output_shards_dir; /* --output-shards, or NULL */
    bool write_lse;              /* --lse: also `lse` in the outputs */
    bool check;                  /* --check (default true) */
    int64_t check_rows;          /* rows per (batch, head) when sampling; 0: 64 */
    double check_full_flops;     /* all rows when the reference costs at most this
                                    many double operations; 0: 4e9; < 0: always sample */
    int warmup, iters;           /* defaults 1 and 5 (iters >= 1) */
    const char *trace_path;      /* --trace, or NULL */
    double timeout_s;            /* every transport: abort a wait (a receive, a
                                    collective, a barrier) that lasts longer;
                                    0: the default (cpc_run_default_timeout),
                                    < 0: never */
    FILE *log;                   /* progress lines, NULL: quiet */
    bool staged;                 /* wrap every rank's endpoint in the staged
                                    transport (transport_staged.h) even on the
                                    CPU backend; the CUDA backend always is.
                                    Tests the CUDA path's plumbing without a
                                    GPU (default false) */
    bool device_transport;       /* ranks that are threads of this process move
                                    buffers device to device
                                    (transport_device.h): what the CUDA backend
                                    does unless `staged` is set; set on the CPU
                                    backend it tests that plumbing (default
                                    false) */
    /* Called on each MPI rank right before a failure during setup (input,
     * shards, buffers) aborts the whole job with cpc_mpi_abort, which does
     * not return: the last chance to report (cprun prints its --format json
     * failure object on launcher rank 0).  exit_status is what the job will
     * exit with.  NULL: nothing.  Not called for thread ranks, whose failures
     * are returned by cpc_job_run. */
    void (*before_abort)(void *ctx, const cpc_status *st, int exit_status);
    void *before_abort_ctx;
} cpc_run_options;

/* Stall limits when --timeout is not given: rank threads (local transport)
 * 3600 s; MPI processes max(CPC_MPI_TIMEOUT_FLOOR_S, 20 x the cost model's
 * predicted time of all warmup + timed iterations). */
#define CPC_LOCAL_TIMEOUT_S 3600.0
#define CPC_MPI_TIMEOUT_FLOOR_S 300.0
double cpc_run_default_timeout(const cpc_job *job, const cpc_run_options *opt, bool mpi);

/* Fills defaults (what cprun uses when an option is not given). */
void cpc_run_options_default(cpc_run_options *o);

/* Checks, before anything runs, that the files the run will write can be
 * written, so a long run does not end in an I/O error: --output and --trace
 * (an existing file must be writable and not a directory; a new one needs a
 * writable directory), --output-shards (an existing directory must be
 * writable; a new one needs a writable parent: one level is created).  Also
 * refuses an output that is one of the inputs (`plan_path`, may be NULL, and
 * opt->input_path; same device and inode) and --output and --trace naming
 * the same file.  Creates and changes nothing.  Errors: CPC_E_IO naming the
 * option and the path, e.g. "--output out/x.safetensors: directory 'out'
 * does not exist".  Thread-safe (stat/access only). */
cpc_status *cpc_run_check_outputs(const cpc_run_options *opt, const char *plan_path);

/* Checks that `path` can be written as the file of option `what`
 * ("--output", "--profile-out", ...) as above.  Errors: CPC_E_IO. */
cpc_status *cpc_check_writable_file(const char *what, const char *path);

/* Runs the job and fills `rep` (zeroed first; free with cpc_run_report_clear
 * also after errors).  Returns NULL when the run completed (rep->ok tells
 * whether the check passed), or an error: CPC_E_USAGE (bad option value,
 * or options that contradict each other: --attention cudnn/nvrtc or
 * --transport nccl with --backend cpu, --attention cpu with --backend
 * cuda), CPC_E_UNSUPPORTED (cuda backend not built, or no usable CUDA
 * driver/device: the message names the CUDA error; cuDNN unusable with
 * --attention cudnn; nccl transport, not yet available; mpi transport not
 * built or not launched), CPC_E_INPUT (an artifact without kernels for the
 * cuda backend, bad inputs), CPC_E_IO (inputs, outputs), CPC_E_INTERNAL
 * (NVRTC rejecting a generated kernel), CPC_E_RUNTIME (a rank failed: the
 * message names the rank and the op), CPC_E_NOMEM.  The output locations
 * are checked first (cpc_run_check_outputs with job->source).
 * rep->backend is "cpu" or "cuda", rep->transport the endpoint's name
 * ("local", "mpi", "local+staged", "mpi+staged") and rep->attention what
 * served the blocks ("cpu", "cudnn", "nvrtc", "cudnn+nvrtc fallback (N of
 * M blocks: reason)", summed over ranks from cpc_cuda_backend_attention_info).
 * Under MPI, only world rank 0 fills the report (rep->ranks == 0 elsewhere)
 * and *is_root tells which (may be NULL). */
cpc_status *cpc_job_run(const cpc_job *job, const cpc_run_options *opt, cpc_run_report *rep,
                        bool *is_root);

#endif
