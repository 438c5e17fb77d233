/*
 * attention_cudnn.h - attention blocks on cuDNN's fused SDPA forward
 * operation, for the CUDA backend (backend_cuda.c, --attention auto|cudnn).
 *
 * The block is described by attn_problem.h's cpc_attn_problem (BSHD tensors, batch
 * strides in elements, LSE [B, H, S] fp32 natural log).  cuDNN is driven
 * through its C BACKEND API (cudnn_graph.h), no frontend:
 *
 *   tensors Q, K, V, O (bf16/fp16), STATS (fp32), SCALE (fp32, by value)
 *     -> CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR (cuDNN >= 9.13.1, the
 *        version cudnn-frontend requires for it, at build and at run time)
 *     -> operation graph -> heuristics (mode A, then FALLBACK) -> the first
 *        engine config that finalizes into an execution plan
 *     -> per call: a variant pack (pointers, workspace) and cudnnBackendExecute.
 *
 * Tensor dims are cuDNN's logical [B, H, S, D] order with the strides of the
 * BSHD memory: Q {q_bstride, D, hq*D, 1}, K/V {kv_bstride, D, hkv*D, 1}, O
 * {sq*hq*D, D, hq*D, 1}; STATS is [B, hq, rows, 1]: for a part of all rows
 * strides {hq*sq, sq, 1, 1}, written straight into the project's [B, H, S]
 * LSE (the pointer's actual alignment 4/8/16 is declared); for a part of a
 * split block (row0 > 0 or rows < sq) packed {hq*rows, rows, 1, 1} into a
 * scratch buffer, then scattered to lse + row0 with cudaMemcpy2DAsync on the
 * same stream (cuDNN's own tests use packed stats only).  cuDNN's STATS of
 * the SDPA forward are the softmax log-sum-exp of the
 * scaled scores in natural log (cuDNN documents them as the natural-log LSE
 * its backward pass consumes); tests/gpu/gpu_check.c checks the values
 * against the float64 reference.
 *
 * One execution plan is built per (dtype, B, heads, rows, keys, head_dim,
 * strides, with/without STATS) and cached in the cpc_cudnn_sdpa object
 * (least recently used evicted beyond 32 plans); a shape cuDNN refuses is
 * cached as refused, so it is not tried again.
 *
 * What cuDNN cannot serve (the caller then runs the generated kernel and
 * reports the fallback): fp32 (cuDNN has no fp32 SDPA), head_dim not a
 * multiple of 8, a key padding mask, GQA head ranges that are not "query
 * head h uses K/V head h / ratio + base", a causal block in which a query row
 * sees a PARTIAL key range (the SDPA operation of the backend API has no
 * causal mask attribute before 9.21, whose SDPA_FWD_SUBGRAPH carries mask
 * operations: only blocks whose query runs each see a whole key prefix or
 * nothing are served, which covers every off-diagonal zigzag ring step),
 * misaligned pointers or batch strides (16 bytes), a part of one query row
 * and one key (a known cuDNN issue), or an engine/plan cuDNN does not build
 * for the shape or refuses at execution (bad parameter / not supported
 * status families).
 *
 * Errors: CPC_E_UNSUPPORTED for everything above (the message says why),
 * CPC_E_RUNTIME for other cuDNN/CUDA failures while executing (named, with
 * cudnnGetErrorString and cudnnGetLastErrorString), CPC_E_NOMEM.
 *
 * Thread-safety: a cpc_cudnn_sdpa object (one cuDNN handle) is used by one
 * thread at a time; separate objects share nothing.  cpc_cudnn_sdpa_split is
 * pure.
 *
 * Built only with the CUDA toolkit; without cuDNN (no CPC_HAVE_CUDNN) or with
 * cuDNN headers older than 9.13.1, every function but the split returns
 * CPC_E_UNSUPPORTED.
 */
#ifndef CPC_ATTENTION_CUDNN_H
#define CPC_ATTENTION_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct cpc_cudnn_sdpa cpc_cudnn_sdpa;

/* The largest number of parts a block is split into (more: unsupported). */
#define CPC_SDPA_MAX_PARTS 16

typedef enum cpc_sdpa_part_kind {
    CPC_SDPA_PART_FULL = 0,  /* every row sees keys [0, nkv) of the block: one cuDNN call */
    CPC_SDPA_PART_EMPTY,     /* no row sees any key: the caller writes o = 0, lse = -inf */
} cpc_sdpa_part_kind;

/* Query rows [row0, row0 + rows) of the block (rows of every batch). */
typedef struct cpc_sdpa_part {
    cpc_sdpa_part_kind kind;
    int64_t row0, rows;
    int64_t nkv;             /* FULL: the first nkv key rows of the block take part */
} cpc_sdpa_part;

/* How a block maps onto cuDNN calls. */
typedef struct cpc_sdpa_split {
    int kv_head0;            /* local K/V head of local query head 0 */
    int ratio;               /* query heads per K/V head (GQA), hq % ratio == 0 */
    int hkv;                 /* K/V heads given to cuDNN: hq / ratio */
    int n_parts;             /* parts in row order, covering rows [0, sq) */
    cpc_sdpa_part parts[CPC_SDPA_MAX_PARTS];
} cpc_sdpa_split;

/* Decides whether cuDNN can serve block `a` and how (pure; no cuDNN call).
 * Non-causal blocks without key padding are one FULL part.  Causal blocks:
 * for each query run (a->q_runs, global positions), every row of the run
 * must see the same number L of keys - the keys of a->kv_runs (sorted,
 * disjoint) at positions <= the row's - so the run is FULL with nkv = L, or
 * EMPTY when L = 0; adjacent runs alike are merged.
 * Errors: the status of cpc_attn_problem_check (CPC_E_INTERNAL) for a
 * problem that fails it; CPC_E_UNSUPPORTED naming the reason cuDNN cannot
 * serve a valid one (see the file comment). */
cpc_status *cpc_cudnn_sdpa_split(const cpc_attn_problem *a, cpc_sdpa_split *out);

/* cuDNN's version at run time (cudnnGetVersion, e.g. 91900), 0 without cuDNN. */
size_t cpc_cudnn_version(void);

/* Creates a cuDNN handle on `device` (made current with cudaSetDevice) and
 * an empty plan cache.  *out is owned by the caller (cpc_cudnn_sdpa_destroy).
 * Errors: CPC_E_UNSUPPORTED (no cuDNN in the build, cuDNN older than 9.13.1,
 * no CUDA driver or device: cudnnCreate's or CUDA's message),
 * CPC_E_NOMEM. */
cpc_status *cpc_cudnn_sdpa_create(int device, cpc_cudnn_sdpa **out);

/* Runs the FULL parts of `split` (from cpc_cudnn_sdpa_split(a); NULL: split
 * here, and a block with an EMPTY part is CPC_E_UNSUPPORTED) on `stream` (a
 * cudaStream_t, NULL = the legacy default stream), asynchronously:
 *   o   [B, sq, hq, d] in a->dtype, contiguous (NOT the forward's fp32 o): the
 *       output rows of FULL parts;
 *   lse [B, hq, sq] fp32 (natural log) rows of FULL parts, or NULL: no
 *       statistics (a cheaper plan; the ring merge needs them).
 * Rows of EMPTY parts are not touched.
 * Device buffers must stay valid until the stream reaches this work; the
 * workspace is owned by `s` (grown with cudaMalloc as plans need it).
 * Errors: CPC_E_UNSUPPORTED when a plan cannot be built for a part (cached:
 * the same shape fails at once next time), a pointer or batch stride is not
 * 16-byte aligned, a part is one row by one key, or cuDNN refuses the
 * execution (bad parameter / not supported: nothing was queued for that
 * part; earlier parts may have written o and lse); CPC_E_RUNTIME when cuDNN
 * or CUDA fails otherwise; CPC_E_NOMEM.  Makes s's device current. */
cpc_status *cpc_cudnn_sdpa_run(cpc_cudnn_sdpa *s, const cpc_attn_problem *a,
                               const cpc_sdpa_split *split, void *o, float *lse, void *stream);

/* Number of plans built (successfully) so far by `s`, and cached refusals. */
void cpc_cudnn_sdpa_counts(const cpc_cudnn_sdpa *s, int *plans_built, int *refused);

/* Waits for the device (when plans were run), then destroys the plans, the
 * workspace and the handle.  NULL is ignored. */
void cpc_cudnn_sdpa_destroy(cpc_cudnn_sdpa *s);

#endif
