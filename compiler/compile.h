/*
 * compile.h - the compiler pipeline as one library call, shared by `cpc`
 * (tools/cpc.c) and `cprun` (which accepts a plan YAML and compiles it in
 * memory):
 *
 *   load -> validate (+ price every candidate, select; Lua choose)
 *        -> schedule -> Lua schedule (re-verified) -> verify -> price
 *        -> training plans: backward schedule -> verify -> price
 *        -> codegen (optional) -> [emit: cpc_compiled_write]
 *
 * Each stage appends its diagnostics to `diags`; an error stops the
 * pipeline (later fields stay NULL).  Warnings never stop it.  Every
 * diagnostic about the plan has a position: CP051 errors and warnings
 * about ops the compiler built (which have no span of their own) point at
 * the plan key that chose the schedule (parallel.variant, else a diffusers
 * flag or degree, else `parallel`, else cluster.world_size).
 *
 * Ownership: cpc_compiled owns everything it points to; free it with
 * cpc_compiled_free.  Thread-safety: no global state; one compile per thread.
 */
#ifndef CPC_COMPILE_H
#define CPC_COMPILE_H

#include <stdbool.h>

#include "artifact.h"
#include "codegen.h"
#include "cost.h"
#include "plan.h"
#include "program.h"
#include "status.h"
#include "validate.h"

typedef enum cpc_compile_until {
    CPC_UNTIL_VALIDATE = 0,   /* load + validate + select (with predictions) */
    CPC_UNTIL_VERIFY,         /* + schedule, script, verify, price (--check, cprun) */
    CPC_UNTIL_CODEGEN,        /* + kernels (cpc PLAN) */
} cpc_compile_until;

typedef struct cpc_compile_opts {
    const char *const *sets;  /* --set KEY=VALUE overrides */
    int n_sets;
    const char *lua;          /* --lua FILE: replaces the plan's schedule.script */
    const char *arch;         /* NVRTC target, NULL = "sm_90" */
    bool kernels;             /* generate kernels at CPC_UNTIL_CODEGEN (false: --no-kernels) */
    cpc_compile_until until;
    bool profile_pending;     /* a cluster.profile file that does not exist yet is
                                 no error: the preset alone (cprun --tune writes it) */
} cpc_compile_opts;

typedef struct cpc_compiled {
    cpc_plan *plan;               /* after load */
    cpc_selection sel;            /* after validate (sel.selected >= 0 when ok) */
    bool validated;
    cpc_program *program;         /* the selected candidate's (script-edited) program */
    cpc_prediction pred;          /* priced on the final program */
    bool priced;
    cpc_program *backward;        /* mode: training: the backward program
                                     (schedule_bwd.h) of the selected candidate,
                                     proven (cpc_verify_backward); else NULL.  A
                                     candidate without one is CP018 */
    cpc_prediction bwd_pred;      /* the backward program priced (cost.h: attn_bwd
                                     2.5 x the forward's FLOPs, its messages) */
    bool bwd_priced;
    cpc_device_profile device;
    char *script_path;            /* the Lua script applied, or NULL */
    bool script_applied;          /* schedule() changed the program */
    cpc_kernel *kernels;          /* after codegen */
    int n_kernels;
    cpc_status *diags;            /* every diagnostic, in order */
} cpc_compiled;

/* Runs the pipeline on the plan file `path` up to opts->until.  Returns true
 * when no stage reported an error (then everything up to `until` is set).
 * Without the CUDA toolkit, codegen adds a warning and leaves no kernels. */
bool cpc_compile_file(const char *path, const cpc_compile_opts *opts, cpc_compiled *out);

/* As cpc_compile_file, for `len` bytes of plan text; `name` names it in
 * diagnostics and is the base for relative paths (NULL: "<string>"). */
bool cpc_compile_string(const char *text, size_t len, const char *name, const cpc_compile_opts *o,
                        cpc_compiled *out);

/* The compiled plan, program (and backward program), kernels and
 * predictions (the backward's as ms_backward_per_layer,
 * backward_compute_ms_per_layer, backward_comm_ms_per_layer,
 * backward_bytes_sent_per_rank, backward_memory_bytes_per_rank) as a new artifact
 * (caller frees with cpc_artifact_free).  Errors: CPC_E_INTERNAL when
 * nothing was scheduled, CPC_E_NOMEM.  (An artifact of a plan with
 * model.attention: linear is made, for its predictions, but is not written
 * by cpc_compiled_write nor run by cprun or a rank: the runtime runs
 * softmax attention.) */
cpc_status *cpc_compiled_to_artifact(const cpc_compiled *c, cpc_artifact **out);

/* The selected candidate, or NULL. */
const cpc_candidate *cpc_compiled_selected(const cpc_compiled *c);

/* Writes the artifact (SPEC section 4) to `path`.  Errors: CPC_E_INPUT for a
 * plan with model.attention: linear (priced only), and cpc_artifact_write's. */
cpc_status *cpc_compiled_write(const cpc_compiled *c, const char *path);

/* Frees everything `c` owns and zeroes it (not `c` itself, usually on the
 * stack).  NULL is ignored. */
void cpc_compiled_free(cpc_compiled *c);

#endif
