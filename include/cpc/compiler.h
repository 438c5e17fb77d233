/*
 * cpc/compiler.h - the plan compiler as a library, and artifacts
 * (SPEC sections 1-4 and 8).
 *
 * A plan (YAML, SPEC section 1) is compiled exactly as `cpc` compiles it:
 * load (with --set-style overrides) -> validate every variant and price it ->
 * select (Lua choose) -> schedule -> Lua schedule -> prove (CP051) -> price
 * the final program -> optionally generate CUDA kernels with NVRTC.  The
 * result is an artifact in memory (cpc_artifact), the same object a .cplan
 * file holds: cpc_artifact_write / cpc_artifact_read convert between them.
 *
 * Diagnostics: a compile that succeeds may still have warnings and notes;
 * they are returned in *diagnostics (caller frees with cpc_status_free; NULL
 * when there are none), never as the returned status.  A rejected plan
 * returns a CPC_E_PLAN status whose chain holds every rule violation
 * (file:line:col, CP code, hint); *diagnostics then holds the warnings.
 *
 * Thread-safety: compiling is reentrant (different threads may compile at
 * once); an artifact is read-only after it is made and may be shared by any
 * number of threads and ranks, except cpc_artifact_write which must not run
 * concurrently with another call on the same artifact.
 */
#ifndef CPC_PUBLIC_COMPILER_H
#define CPC_PUBLIC_COMPILER_H

#include "cpc/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpc/status.h"
#include "cpc/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque: a compiled, proven plan (a .cplan in memory). */
typedef struct cpc_artifact cpc_artifact;

/* Compile options; fill with cpc_compile_options_init(&o, sizeof o), then
 * change fields.  THE SIZE MEMBER (every input options struct of libcpc
 * begins with one, as ncclConfig_t does): `size` is sizeof the struct as the
 * CALLER was compiled, set by the init function; it lets a later libcpc add
 * fields at the end.  A libcpc reading options checks it: 0 or smaller than
 * the struct's first version is CPC_E_USAGE (options never initialised);
 * smaller than this header's struct (a caller built against an older
 * header) is accepted, the fields past `size` taking their defaults; larger
 * (a newer header than the library) is accepted only when every byte past
 * the library's struct is zero (as Linux's copy_struct_from_user for
 * openat2/clone3), otherwise CPC_E_USAGE.  First version: this struct
 * whole (CPC_COMPILE_OPTIONS_SIZE_V1). */
typedef struct cpc_compile_options {
    size_t size;              /* sizeof(cpc_compile_options) of the caller */
    const char *const *sets;  /* "KEY=VALUE" overrides as `cpc --set` (dotted keys,
                                 [N] indices), applied in order; borrowed */
    int n_sets;
    const char *lua;          /* a Lua script path replacing the plan's
                                 schedule.script, or NULL */
    bool kernels;             /* generate CUDA kernels with NVRTC (default false;
                                 true needs a build with the CUDA toolkit,
                                 otherwise a warning says none were made) */
    const char *arch;         /* NVRTC target, NULL = "sm_90" */
} cpc_compile_options;

/* The smallest size a libcpc accepts: the struct's first version. */
#define CPC_COMPILE_OPTIONS_SIZE_V1 (offsetof(cpc_compile_options, arch) + sizeof(const char *))

/* Fills the first `size` bytes of *o (size = sizeof *o as the caller knows
 * the struct) with the defaults (no overrides, no script, no kernels) and
 * sets o->size = size; a caller with a larger struct than this libcpc's gets
 * the unknown tail zeroed.  o NULL or size < sizeof(size_t): nothing. */
CPC_API void cpc_compile_options_init(cpc_compile_options *o, size_t size);

/* Compiles the plan file `path` (YAML).  On success *out is a new artifact
 * (caller frees with cpc_artifact_free).  opts may be NULL (defaults),
 * diagnostics may be NULL (warnings are then dropped).  Errors (*out NULL):
 * CPC_E_IO (unreadable file), CPC_E_PLAN (rule violations, with positions),
 * CPC_E_UNSUPPORTED / CPC_E_INTERNAL (NVRTC), CPC_E_NOMEM. */
CPC_API cpc_status *cpc_compile_plan_file(const char *path, const cpc_compile_options *opts,
                                  cpc_artifact **out, cpc_status **diagnostics);

/* As cpc_compile_plan_file, for plan text in memory: `yaml` holds `len` bytes
 * (or is NUL-terminated when len is 0); `name` is the file name used in
 * diagnostics (NULL: "<string>") and the directory relative paths
 * (schedule.script, cluster.profile) are resolved against (none for NULL). */
CPC_API cpc_status *cpc_compile_plan_string(const char *yaml, size_t len, const char *name,
                                    const cpc_compile_options *opts, cpc_artifact **out,
                                    cpc_status **diagnostics);

/* Reads a .cplan file and PROVES its program again (an artifact is never run
 * unproven; a training plan's backward program too).  A version 1 artifact
 * (before the backward program was stored) is CPC_E_INPUT: recompile.  Errors: CPC_E_IO, CPC_E_INPUT (malformed or tampered file:
 * hash mismatch), CPC_E_PLAN (CP051: the program is wrong). *out as above. */
CPC_API cpc_status *cpc_artifact_load(const char *path, cpc_artifact **out);

/* Writes the artifact to `path` (.cplan, SPEC section 4).  Errors: CPC_E_IO,
 * CPC_E_USAGE (path or a NULL). */
CPC_API cpc_status *cpc_artifact_write(cpc_artifact *a, const char *path);

/* Frees an artifact.  NULL is ignored.  Every rank made from it must have
 * been destroyed first. */
CPC_API void cpc_artifact_free(cpc_artifact *a);

/* The queries below take an artifact from cpc_compile_plan_* or
 * cpc_artifact_load.  A NULL artifact is never dereferenced: the functions
 * that return a status return CPC_E_USAGE, the others 0 (counts, degrees,
 * world size), false, NULL (the variant), CPC_DTYPE__COUNT (the dtype) or
 * zeros (cpc_artifact_shape's outputs).
 *
 * The selected variant: "none", "ring", "ulysses", "unified",
 * "ulysses_anything", "ring_anything".  Static string. */
CPC_API const char *cpc_artifact_variant(const cpc_artifact *a);

/* Mesh: world size P = cfg_degree * tp_degree * ring_degree * ulysses_degree
 * (cfg_degree and tp_degree are 1 unless the plan sets them).
 *
 * THE OUTER AXES (SPEC section 1, "All four axes").  With cfg_degree C or
 * tp_degree T > 1 the artifact's program is one (c, t) GROUP's R x U
 * program: world rank p = ((c*R + r)*U + u)*T + t holds batch items
 * [c*B/C, (c+1)*B/C), query heads [t*H/T, (t+1)*H/T) and the K/V heads
 * those use (cpc_artifact_rank_slice), and talks only to the R*U ranks of
 * its group.  Every function below that takes a rank takes the WORLD rank
 * (0 <= rank < P); shapes and runs are then those of its slice. */
CPC_API int cpc_artifact_world_size(const cpc_artifact *a);
CPC_API int cpc_artifact_ring_degree(const cpc_artifact *a);
CPC_API int cpc_artifact_ulysses_degree(const cpc_artifact *a);
CPC_API int cpc_artifact_cfg_degree(const cpc_artifact *a);
CPC_API int cpc_artifact_tp_degree(const cpc_artifact *a);

/* Where world rank `rank` sits on the outer axes and which slice of the
 * global tensors it holds (all starts and lengths are global indices). */
typedef struct cpc_rank_slice {
    int c, t;                         /* cfg and tensor-parallel coordinates */
    int group;                        /* c * tp_degree + t */
    int group_rank;                   /* r * ulysses_degree + u: its rank in the group */
    int64_t batch_start, batch_len;   /* [c*B/C, (c+1)*B/C) */
    int64_t head_start, head_len;     /* query heads [t*H/T, (t+1)*H/T) */
    int64_t kv_head_start, kv_head_len; /* K/V heads: [t*Hkv/T, ...) when T divides
                                         Hkv, else the one head its queries use
                                         (replicated over T/Hkv ranks) */
} cpc_rank_slice;

/* Fills *out for world rank `rank`.  Errors: CPC_E_USAGE (rank out of
 * range, a NULL argument). */
CPC_API cpc_status *cpc_artifact_rank_slice(const cpc_artifact *a, int rank, cpc_rank_slice *out);

/* The plan's element type for q, k, v and out. */
CPC_API cpc_dtype cpc_artifact_dtype(const cpc_artifact *a);

/* Global attention shape (the whole problem, every cfg group's batch items
 * and every head): batch B, query tokens S, key/value tokens Skv
 * (= S for self-attention), query heads H, key/value heads Hkv, head_dim D.
 * Any output may be NULL. */
CPC_API void cpc_artifact_shape(const cpc_artifact *a, int64_t *batch, int64_t *tokens,
                        int64_t *kv_tokens, int64_t *heads, int64_t *kv_heads,
                        int64_t *head_dim);

/* Whether the plan's mask is causal / key padding (a mask tensor is then
 * passed to every forward), and whether K/V come from a separate unsplit
 * sequence (cross-attention: input.kv). */
CPC_API bool cpc_artifact_causal(const cpc_artifact *a);
CPC_API bool cpc_artifact_key_padding(const cpc_artifact *a);
CPC_API bool cpc_artifact_cross_attention(const cpc_artifact *a);

/* Whether the artifact holds a proven backward program (a `mode: training`
 * plan compiled by this libcpc): cpc_rank_backward runs only then. */
CPC_API bool cpc_artifact_trains(const cpc_artifact *a);

/* The prediction `name` (a key of SPEC section 3's "predicted": ms_per_layer,
 * ms_per_forward, memory_bytes_per_rank, bytes_sent_per_rank, ...) in
 * *value.  Returns false when the artifact has no such prediction. */
CPC_API bool cpc_artifact_get_prediction(const cpc_artifact *a, const char *name, double *value);

/* The shape of rank `rank`'s shard of tensor `role` as passed to
 * cpc_rank_forward and cpc_rank_backward (BSHD; LSE [B, H, T]; mask
 * [B, Skv]): *ndim and shape[0..ndim).  q, out, dout and dq: [B, T, H, D]
 * with T the rank's tokens; k, v, dk and dv: the same tokens and Hkv heads,
 * or the whole [B, Skv, Hkv, D] for cross-attention.  With replicated
 * segments (`split: replicate`, SPEC section 1) a rank's tokens are its
 * shard of the sharded segments plus every replicated segment whole, in
 * segment order (cpc_artifact_shard_runs): q, k, v and out carry all of
 * them, and every rank's out holds the whole replicated rows (equal across
 * ranks to rounding: with ring steps each rank merges the key blocks in its
 * own order).
 * Errors: CPC_E_USAGE (rank out of range, role unknown, a NULL argument). */
CPC_API cpc_status *cpc_artifact_shard_shape(const cpc_artifact *a, int rank, cpc_tensor_role role,
                                     int *ndim, int64_t shape[4]);

/* The global token positions rank `rank`'s shard holds, in shard order:
 * writes at most `max` runs to runs[] and the number of runs in *n (which may
 * exceed max: call again with a larger array).  Covers q, out (and k, v for
 * self-attention); with replicated segments also their whole runs, merged in
 * global order (a text-first plan: [0, text) then the image shard).  Errors: CPC_E_USAGE (rank out of range, max < 0, a NULL
 * artifact or n, runs NULL with max > 0). */
CPC_API cpc_status *cpc_artifact_shard_runs(const cpc_artifact *a, int rank, cpc_token_run *runs,
                                    int max, int *n);

#ifdef __cplusplus
}
#endif
#endif
