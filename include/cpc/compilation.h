/*
 * cpc/compilation.h - the compiler pipeline's whole result, as `cpc` shows
 * it (SPEC section 3): every diagnostic, every candidate (variant and
 * degrees) with its verdict, rule violations and predictions, the selection,
 * the schedule, the generated kernels; and the artifact made from it.
 *
 * Where cpc/compiler.h answers "the artifact, or why not", a compilation is
 * what --check, --explain, --sweep, --dump-schedule and --emit-kernels look
 * at: it exists also when the plan is rejected.  Also here: atomic file
 * writes (a temporary file in the same directory, fsync'ed, renamed over the
 * target when complete), the way cpc writes every user-visible file.
 *
 * Ownership: a compilation owns everything its accessors return (strings,
 * statuses): borrowed, valid until cpc_compilation_free.  Thread-safety: a
 * compilation is read-only once made; different threads may read it at
 * once.  Compiling is reentrant.
 */
#ifndef CPC_PUBLIC_COMPILATION_H
#define CPC_PUBLIC_COMPILATION_H

#include "cpc/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cpc/compiler.h"
#include "cpc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Diagnostics about a --set override (cpc_compile_options.sets) point at
 * this file name, line = the override's index + 1. */
#define CPC_SET_FILE "<--set>"

/* Opaque: the pipeline's result. */
typedef struct cpc_compilation cpc_compilation;

/* How far the pipeline runs. */
typedef enum cpc_compile_stage {
    CPC_STAGE_VALIDATE = 0, /* load, validate and price every candidate, select
                               (cpc --sweep) */
    CPC_STAGE_VERIFY,       /* + schedule, Lua schedule, prove, price (--check,
                               --explain, --dump-schedule) */
    CPC_STAGE_CODEGEN,      /* + CUDA kernels when opts->kernels (cpc PLAN) */
} cpc_compile_stage;

/* Runs the pipeline on the plan file `path` up to `until` with `opts` (NULL:
 * defaults).  The plan's own errors (unreadable file, rule violations, NVRTC)
 * do not fail the call: they are the compilation's diagnostics, and a stage
 * that reports an error ends the pipeline.  *out: the compilation (free with
 * cpc_compilation_free).  Errors (*out NULL): CPC_E_USAGE (NULL arguments,
 * unknown stage), CPC_E_NOMEM. */
CPC_API cpc_status *cpc_compilation_new(const char *path, const cpc_compile_options *opts,
                                cpc_compile_stage until, cpc_compilation **out);

/* Frees a compilation.  NULL is ignored. */
CPC_API void cpc_compilation_free(cpc_compilation *c);

/* Every diagnostic (errors, warnings, notes; each may have notes of its
 * own: cpc_status_notes) in the order the stages reported them, or NULL. */
CPC_API const cpc_status *cpc_compilation_diagnostics(const cpc_compilation *c);

/* The number of diagnostics of severity `sev` (notes attached to a
 * diagnostic are not counted). */
CPC_API int cpc_compilation_count(const cpc_compilation *c, cpc_severity sev);

/* No error diagnostic: every stage up to `until` ran. */
CPC_API bool cpc_compilation_ok(const cpc_compilation *c);

/* The plan was loaded and validated: the candidates below exist (also when
 * every one is rejected). */
CPC_API bool cpc_compilation_validated(const cpc_compilation *c);

/* One candidate (a variant at degrees R x U), as validation and the cost
 * model left it.  Fields may be added at the end: callers pass
 * sizeof(cpc_candidate_info). */
typedef struct cpc_candidate_info {
    const char *variant;          /* "ring", ... (static string) */
    int ring_degree;              /* R */
    int ulysses_degree;           /* U */
    bool ok;                      /* passes every rule */
    bool selected;                /* the selected candidate */
    bool priced;                  /* the predictions below are set */
    double ms_per_layer;          /* predicted attention time per layer, ms */
    double ms_per_forward;        /* x model.layers, ms */
    double ms_per_step;           /* whole forward step (model.parameters), ms; else 0 */
    double ms_per_image;          /* x input.steps, ms; else 0 */
    int64_t memory_bytes_per_rank;/* peak over ranks, bytes */
    int64_t bytes_sent_per_rank;  /* per layer, max over ranks, bytes */
    const cpc_status *errors;     /* why rejected: the rule violations of the stage it
                                     stopped at (borrowed), NULL when ok */
    /* (fields below were added later: callers compiled before them pass a
     * smaller size and do not get them) */
    bool measured;                /* the plan's profile has a measurement of this
                                     candidate (`cprun --tune`); selection uses it */
    double measured_ms_per_layer; /* measured attention time per layer, ms (else 0) */
    int cfg_degree;               /* C: the batch split over C groups (SPEC section 1,
                                     "All four axes"); 1 without it */
    int tp_degree;                /* T: the heads split over T ranks; 1 without it.
                                     The candidate uses C*T*R*U ranks */
    /* mode: training (SPEC section 10): the candidate's backward program
     * priced (the selected one's is also proven; a candidate without a
     * backward program has backward_priced false and is CP018 if selected) */
    bool backward_priced;
    double ms_backward_per_layer;           /* predicted backward time per layer, ms */
    int64_t backward_bytes_sent_per_rank;   /* per layer, max over ranks, bytes */
    int64_t backward_memory_bytes_per_rank; /* the backward program's peak over ranks */
    /* The whole step broken down (model.parameters; each ms per step, 0 without
     * it; they add up to ms_per_step): the blocks' GEMMs, the attention kernels,
     * memory-bound work (norms, modulation, RoPE, activations, residuals, the
     * attention program's merges and packs), communication not hidden, and host
     * time the device waits for (eager dispatch slower than the device) */
    double gemm_ms_per_step;
    double attn_ms_per_step;
    double memory_ms_per_step;
    double comm_ms_per_step;
    double host_ms_per_step;      /* exposed host time */
    /* The pipeline's once-per-image parts inside ms_per_image (input.steps): the
     * text encoder and the VAE decode, ms (0 when not priced) */
    double text_encoder_ms;
    double vae_decode_ms;
    /* Memory per rank inside memory_bytes_per_rank: the transformer's weights
     * (split by tp_degree only), a block's activations, the VAE decode's peak */
    int64_t weights_bytes_per_rank;
    int64_t activation_bytes_per_rank;
    int64_t vae_bytes_per_rank;
} cpc_candidate_info;

/* The number of candidates (0 unless validated). */
CPC_API int cpc_compilation_n_candidates(const cpc_compilation *c);

/* Fills *info (`size` = sizeof *info as the caller knows it; fields past it
 * are not written) with candidate `i` (SPEC tie order).  Errors:
 * CPC_E_USAGE (i out of range, size too small). */
CPC_API cpc_status *cpc_compilation_candidate(const cpc_compilation *c, int i, cpc_candidate_info *info,
                                      size_t size);

/* The index of the selected candidate, or -1 (none, or an error diagnostic). */
CPC_API int cpc_compilation_selected(const cpc_compilation *c);

/* The variant the plan asks for after inference ("auto", "ring", ...;
 * static), or NULL when inference failed or the plan was not validated. */
CPC_API const char *cpc_compilation_requested_variant(const cpc_compilation *c);

/* The plan's own variant was rejected and `auto` replaced it (fallback). */
CPC_API bool cpc_compilation_fell_back(const cpc_compilation *c);

/* The device the predictions are for (the profile's name), or "" when the
 * plan's device has no name. */
CPC_API const char *cpc_compilation_device_name(const cpc_compilation *c);

/* The plan's `name`, or NULL (no name, or not loaded). */
CPC_API const char *cpc_compilation_plan_name(const cpc_compilation *c);

/* model.layers (1 when the plan was not loaded), model.parameters (0: not
 * given) and input.steps (0: not given). */
CPC_API int cpc_compilation_layers(const cpc_compilation *c);
CPC_API int64_t cpc_compilation_parameters(const cpc_compilation *c);
CPC_API int cpc_compilation_steps(const cpc_compilation *c);

/* The Lua schedule script the pipeline applied (--lua or the plan's
 * schedule.script, resolved), or NULL. */
CPC_API const char *cpc_compilation_script_path(const cpc_compilation *c);

/* The device profile file (cluster.profile resolved against the plan's
 * directory, as the cost model reads it), or NULL when the plan names none. */
CPC_API const char *cpc_compilation_profile_path(const cpc_compilation *c);

/* Prints the schedule in its stable text form (rank < 0: the SPMD program;
 * else rank `rank`'s program, loops unrolled) to `out`.  With cfg_degree x
 * tp_degree > 1 `rank` is a world rank (0..C*T*R*U-1): the program printed
 * is that of its rank in its (c, t) group, after a comment line naming both.
 * Errors: CPC_E_USAGE (rank out of range: "--rank N: the plan has ranks
 * 0..P-1"; nothing was scheduled), CPC_E_IO. */
CPC_API cpc_status *cpc_compilation_print_schedule(const cpc_compilation *c, FILE *out, int rank);

/* The number of generated kernel modules (0: none, e.g. without the CUDA
 * toolkit or below CPC_STAGE_CODEGEN). */
CPC_API int cpc_compilation_n_kernels(const cpc_compilation *c);

/* Writes the generated CUDA sources into directory `dir` (atomically, one
 * file per module).  Errors: CPC_E_IO. */
CPC_API cpc_status *cpc_compilation_emit_kernels(const cpc_compilation *c, const char *dir);

/* What ptxas reported for the compiled kernels.  Fields may be added at the
 * end: callers pass sizeof(cpc_kernel_summary). */
typedef struct cpc_kernel_summary {
    int modules;                 /* kernel modules */
    const char *arch;            /* "sm_90" (borrowed) */
    int functions;               /* kernel functions over all modules */
    int spilling_functions;      /* functions that spill registers */
    const char *attention;       /* the attention function used by default, or NULL */
    int attention_registers;     /* its registers per thread (0 without one) */
} cpc_kernel_summary;

/* Fills *s; returns false (and leaves *s alone) when no kernel was compiled
 * to PTX. */
CPC_API bool cpc_compilation_kernel_summary(const cpc_compilation *c, cpc_kernel_summary *s, size_t size);

/* The artifact (SPEC section 4) made from an ok compilation, in memory
 * (caller frees with cpc_artifact_free) or written to `path` (atomically).
 * Errors: CPC_E_INTERNAL (nothing was scheduled), CPC_E_IO, CPC_E_NOMEM. */
CPC_API cpc_status *cpc_compilation_artifact(const cpc_compilation *c, cpc_artifact **out);
CPC_API cpc_status *cpc_compilation_write(const cpc_compilation *c, const char *path);

/* DEPRECATED NAMES (rank.h): source compatibility only. */
#ifndef CPC_NO_DEPRECATED
#define cpc_compilation_run cpc_compilation_new
#endif

#ifdef __cplusplus
}
#endif
#endif
