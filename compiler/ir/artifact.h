/*
 * artifact.h - the .cplan artifact (SPEC section 4): what `cpc` writes and
 * `cprun` loads.  One YAML document, written with libyaml's emitter and read
 * with libyaml's parser (document API).
 *
 * FORMAT (artifact_version 2; keys in this order, every key required but
 * backward_schedule):
 *
 *   artifact_version: 2
 *   compiler_version: 0.1.0            CPC_VERSION of the cpc that wrote it
 *   content_hash: sha256:<64 hex>      see HASH below
 *   plan_file: plans/flux.yaml         the plan's path as cpc was given it
 *   plan: |                            the RESOLVED plan, in the plan-file
 *     version: 1                       format (SPEC section 1), every default
 *     name: flux                       written out: parallel.variant and both
 *     model: {...}                     degrees are the selected candidate's,
 *     ...                              segments are {name, tokens}; read back
 *                                      through cpc_plan_load_string
 *   mesh:
 *     variant: unified
 *     ring_degree: 2
 *     ulysses_degree: 2
 *     world_size: 4
 *     rank_rule: p = r * ulysses_degree + u   (ring outer, ulysses inner)
 *   with parallel.cfg_degree C or tp_degree T > 1 (SPEC section 1, "All
 *   four axes"), the resolved plan writes both degrees (after fallback),
 *   the mesh adds `cfg_degree: C` and `tp_degree: T` after ulysses_degree,
 *   world_size is C*T*R*U and the rank rule is
 *     p = ((c * ring_degree + r) * ulysses_degree + u) * tp_degree + t
 *   and the schedule is one (c, t) group's R x U program, laid out on the
 *   plan's sub-plan (plan.h cpc_plan_sub): every group runs it on its own
 *   batch items and heads.  With C = T = 1 neither key is written (the
 *   bytes are those of an artifact without the axes).
 *   schedule:                          exactly the cpc_program (program.h):
 *     overlap: true
 *     rotate: p2p
 *     buffers:                         [{name, role, tokens, heads, io}]
 *     ops:                             one mapping per op: kind, then only
 *       - {kind: init_acc, out: [acc, lse]}     the fields that are set:
 *       - kind: loop                   group (not none), dir (all_to_all),
 *         count: R                     reduce ("sum": a backward all_to_all
 *                                      that sums shared heads, program.h),
 *                                      peer, in, out (buffer names), block,
 *         body: [...]                  count, tag (send/recv/wait, or when
 *                                      non-zero), when, span ("file:line:col"
 *                                      when the op has one), body (loops)
 *   backward_schedule:                 training plans (SPEC section 10): the
 *     overlap: ...                     backward program (schedule_bwd.h), in
 *     buffers: [...]                   the same form as `schedule`, same
 *     ops: [...]                       layout; absent for inference plans
 *                                      (refused there), optional for
 *                                      training (cprun refuses to train from
 *                                      an artifact without it)
 *   kernels:                           [{name, arch, source, ptx, ptxas?}], source
 *                                      and ptx as literal blocks (see kernels);
 *                                      ptxas (optional): [{function, registers,
 *                                      stack_bytes, spill_store_bytes,
 *                                      spill_load_bytes}] for arch
 *   predictions: {ms_per_layer: 1.25, ...}   name -> number (cost model)
 *
 * Expressions are stored as their canonical text (expr.h) and parsed back;
 * the layout of the program is recomputed from the resolved plan and the
 * mesh (cpc_layout_init), so reading gives a program whose
 * cpc_program_print text is identical to the written one's.  Numbers are
 * plain decimal integers or %.17g doubles (.inf/-.inf/.nan), so they read
 * back bit-exactly.
 *
 * VERSIONS.  2 added backward_schedule (training plans); version 1 files
 * (forward only) are refused with the message below: recompile.
 *
 * HASH.  content_hash is SHA-256 (OpenSSL libcrypto EVP) of the whole file's
 * bytes, computed with the 64 hex digits of the content_hash value replaced
 * by 64 '0' characters.  It must be written as cpc writes it: a top-level
 * line `content_hash: sha256:<64 lowercase hex>`.  Any edit of any other
 * byte (or truncation) changes it.
 *
 * READING refuses, with CPC_E_INPUT and a message naming the file (and the
 * line:col of the offending node where there is one; a mesh whose axes,
 * world size or rank rule contradict the plan's is refused like any other
 * contradiction): a file that is not one
 * YAML document or not a mapping ("not a cpc artifact"), an artifact_version
 * other than CPC_ARTIFACT_VERSION (checked first: "artifact version 2, this
 * cprun reads version 1: recompile the plan with this cpc"), a missing or
 * malformed content_hash, a hash that does not match the content ("the file
 * was modified or truncated after cpc wrote it"), then any missing, unknown
 * or ill-typed key, an invalid plan (its diagnostics as notes), a mesh that
 * contradicts the plan, unknown names, unknown buffers, malformed
 * expressions.  CPC_E_IO when the file cannot be read.  A truncated or
 * garbled file is an error, never a crash.  The reader does not verify the
 * schedule (call cpc_verify, verify.h, for that); cpc verifies before it
 * writes.
 *
 * KERNELS.  cpc_artifact_add_kernel stores source and PTX in the form a
 * YAML literal block can hold exactly: CR LF becomes LF, tabs are expanded
 * to spaces (tab stops every 8 columns) and trailing blanks of each line are
 * removed (whitespace only: C and PTX mean the same).  Text that still
 * cannot be a literal block (other control characters) is written
 * double-quoted by libyaml; either way it reads back byte-identical.
 *
 * Ownership: an artifact owns everything it points to (cpc_artifact_free).
 * Op spans of a program read from a file borrow file-name strings owned by
 * the artifact (program.h: spans are borrowed): keep the artifact alive
 * while using them.  Thread-safety: no global state; an artifact is not
 * shared while being modified.
 */
#ifndef CPC_ARTIFACT_H
#define CPC_ARTIFACT_H

#include <stddef.h>
#include <stdio.h>

#include "kernel.h"
#include "prediction.h"
#include "plan.h"
#include "program.h"
#include "status.h"

#define CPC_ARTIFACT_VERSION 2
/* Largest artifact file the reader accepts (bytes). */
#define CPC_ARTIFACT_MAX_BYTES ((size_t)256 << 20)

typedef struct cpc_artifact_kernel {
    char *name;    /* e.g. "attn_fwd_d128_bf16_causal" */
    char *arch;    /* NVRTC target, e.g. "sm_90" */
    char *source;  /* CUDA C source (normalised, see KERNELS) */
    char *ptx;     /* PTX text ("" when not compiled) */
    int n_fns;     /* ptxas' report per __global__ function for `arch` (0: none) */
    cpc_kernel_fn_report *fns;  /* owned */
} cpc_artifact_kernel;

typedef struct cpc_artifact_prediction {
    char *name;    /* "ms_per_layer", ... */
    double value;
} cpc_artifact_prediction;

typedef struct cpc_artifact {
    int artifact_version;          /* CPC_ARTIFACT_VERSION */
    char *compiler_version;        /* CPC_VERSION when created, as read otherwise */
    char content_hash[72];         /* "sha256:<hex>" of the last write / read ("" before) */
    char *plan_file;               /* the plan's path as given to cpc (may be "") */
    char *plan_text;               /* the resolved plan, YAML (plan-file format) */
    cpc_plan *plan;                /* plan_text loaded with cpc_plan_load_string */
    cpc_program *program;          /* the schedule; program->layout gives the mesh */
    cpc_program *backward;         /* training plans: the backward program (same
                                      layout), or NULL; the reader does not
                                      verify it (cpc_verify_backward) */
    int n_kernels;
    cpc_artifact_kernel *kernels;
    int n_predictions;
    cpc_artifact_prediction *predictions;
    char *path;                    /* the file it was read from, or NULL */
    int n_span_files;              /* private: file names op spans point to */
    char **span_files;
} cpc_artifact;

/* Writes the resolved plan of `plan` for the selected candidate (variant,
 * ring_degree, ulysses_degree) as plan-file YAML (libyaml emitter): every
 * key of SPEC section 1 with its value or default, segments as {name,
 * tokens}, parallel.variant/ring_degree/ulysses_degree = the candidate,
 * ulysses_anything/ring_anything = whether the candidate is that variant,
 * cluster.memory_gb only when set, profile/script only when set.
 * *text is NUL-terminated, malloc'd (caller frees); *len its length (may
 * be NULL).  Errors: CPC_E_INTERNAL (emitter failure), CPC_E_NOMEM. */
cpc_status *cpc_plan_resolved_yaml(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                                   int ulysses_degree, char **text, size_t *len);

/* Creates an artifact for `plan` and its selected program: the resolved
 * plan is written (cpc_plan_resolved_yaml, with prog->layout's variant and
 * degrees) and loaded back (so an artifact can only hold a plan that
 * reloads), the program is deep-copied.  No kernels, no predictions.
 * *out is owned by the caller (cpc_artifact_free).  Errors: CPC_E_INTERNAL
 * when the resolved plan does not reload or does not give the program's
 * layout (a bug), CPC_E_NOMEM. */
cpc_status *cpc_artifact_create(const cpc_plan *plan, const cpc_program *prog, cpc_artifact **out);

/* Attaches a generated kernel (all strings copied; ptx may be NULL for "").
 * name and arch must be non-empty single-line text.  A kernel of the same
 * name is replaced.  Errors: CPC_E_INTERNAL (bad name/arch), CPC_E_NOMEM. */
cpc_status *cpc_artifact_add_kernel(cpc_artifact *a, const char *name, const char *arch,
                                    const char *source, const char *ptx);
/* Records ptxas' report (registers, stack frame, spill bytes per function,
 * from cpc_codegen_report) for kernel `name` (added before); stored in the
 * artifact as the kernel's optional `ptxas` list.  Copies `fns`.
 * Errors: CPC_E_INTERNAL (no such kernel), CPC_E_NOMEM. */
cpc_status *cpc_artifact_set_kernel_report(cpc_artifact *a, const char *name,
                                           const cpc_kernel_fn_report *fns, int n);

/* Stores a deep copy of the backward program `bwd` of a training plan
 * (backward_schedule; replaces any).  Errors: CPC_E_INTERNAL when the plan
 * is not mode: training or bwd's layout is not the forward program's,
 * CPC_E_NOMEM. */
cpc_status *cpc_artifact_set_backward(cpc_artifact *a, const cpc_program *bwd);

/* The kernel called `name`, or NULL. */
const cpc_artifact_kernel *cpc_artifact_find_kernel(const cpc_artifact *a, const char *name);

/* Sets prediction `name` (non-empty, no control characters; replaced when
 * present, else appended: the order is kept).  Errors as above. */
cpc_status *cpc_artifact_set_prediction(cpc_artifact *a, const char *name, double value);
/* Sets every field of a cost-model prediction (cost.h), under its field
 * name: ms_per_layer, ms_per_forward, compute_ms_per_layer,
 * comm_ms_per_layer, memory_bytes_per_rank, buffer_bytes_per_rank,
 * bytes_sent_per_rank, flops_per_layer, fits (1 or 0); ms_per_step and
 * ms_per_image only when positive (priced: model.parameters, input.steps). */
cpc_status *cpc_artifact_set_predictions(cpc_artifact *a, const cpc_prediction *p);
/* Looks a prediction up; false when absent. */
CPC_API bool cpc_artifact_get_prediction(const cpc_artifact *a, const char *name, double *value);

/* Serialises the artifact (format above, hash filled in).  *text is
 * malloc'd and NUL-terminated (caller frees), *len its length.  Also
 * stores the hash in a->content_hash (the only field written).
 * Errors: CPC_E_INTERNAL (missing plan/program, emitter failure),
 * CPC_E_NOMEM. */
cpc_status *cpc_artifact_to_string(cpc_artifact *a, char **text, size_t *len);
/* Writes the artifact to an open stream / to `path` (through a temporary
 * file in the same directory, renamed into place, so a reader never sees
 * half a file).  A `path` that is a character device or FIFO (/dev/null,
 * /dev/stdout on a pipe) is written through directly (the node is never
 * replaced); a symbolic link is kept and the file it points to replaced
 * atomically (fileio.h); a directory or other non-regular file is
 * refused.  Errors: those of cpc_artifact_to_string, CPC_E_IO
 * ("PATH: cannot write the artifact: REASON", also for a short write or a
 * failed fsync/close/rename). */
cpc_status *cpc_artifact_write_file(FILE *f, cpc_artifact *a);
CPC_API cpc_status *cpc_artifact_write(cpc_artifact *a, const char *path);

/* Reads and checks an artifact (see READING).  On success *out is owned
 * by the caller (cpc_artifact_free); on error *out = NULL. */
cpc_status *cpc_artifact_read(const char *path, cpc_artifact **out);
/* The same from `len` bytes of `text`; `name` is used in messages and as
 * a->path (NULL -> "<artifact>"). */
cpc_status *cpc_artifact_read_string(const char *text, size_t len, const char *name,
                                     cpc_artifact **out);

/* Frees an artifact and everything it owns.  NULL is ignored. */
CPC_API void cpc_artifact_free(cpc_artifact *a);

#endif
