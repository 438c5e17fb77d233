/*
 * backend.h - the compute interface of the executor (a vtable with a context
 * pointer, as IREE's HAL drivers).  One backend instance serves one rank;
 * instances of the CPU backend share nothing, so rank threads never contend.
 *
 * Tensors are BSHD (`[B, S, H, D]`, row-major) with explicit batch strides
 * (elements), so that a block inside an all-gathered buffer can be read in
 * place.  LSE tensors are `[B, H, S]` fp32, natural log.  Q/K/V/O element
 * types are the plan's dtype (bf16/fp16 converted to fp32 for compute);
 * accumulators and LSE are fp32 whatever the dtype (the LSE merge is fp32).
 *
 * Every method returns NULL on success or a status (CPC_E_RUNTIME for device
 * failures, CPC_E_NOMEM).  Optional methods may be NULL; `supports` tells.
 */
#ifndef CPC_BACKEND_H
#define CPC_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attn_problem.h"
#include "layout.h"
#include "plan.h"
#include "status.h"

/* One attention block forward: o = softmax(q k^T * scale + mask) v and lse
 * = log sum exp of the (scaled, masked) scores, for the problem p
 * (attn_problem.h: shapes, heads, positions, causal and key padding).  A row
 * that sees no key gets o = 0 and lse = -inf (never NaN). */
typedef struct cpc_attn_args {
    cpc_attn_problem p;       /* the block (q, k, v read) */
    float *o;                 /* [B, sq, hq, d] fp32, contiguous (written) */
    float *lse;               /* [B, hq, sq] fp32, contiguous, natural log (written) */
} cpc_attn_args;

/* The backward of one attention block (FlashAttention-2, Dao 2023,
 * Algorithm 2): with the row's saved LSE, P = exp(q k^T * scale + mask - lse)
 * is recomputed (no softmax state kept from the forward), and
 *
 *   delta_i = sum_e dout[i, e] * out[i, e]          (once per row, see below)
 *   dV      += P^T dout
 *   dP       = dout V^T
 *   dS       = P * (dP - delta)                      (elementwise, per row)
 *   dQ      += dS K * scale
 *   dK      += dS^T Q * scale
 *
 * The problem p is the forward's (the same fields mean the same thing);
 * dout is [B, sq, hq, d] in p.dtype.  dk/dv of a K/V head are summed over
 * the query heads of its group that this call sees (q_head_off .. q_head_off
 * + hq - 1); K/V heads of the block that none of them uses are left
 * untouched.
 *
 * Splitting the keys.  lse must be the LSE of the row over ALL the keys the
 * row attends to (the whole ring, not this block): then P of this block is
 * the block's slice of the row's full softmax, and the sum of attn_bwd over
 * any partition of the keys into blocks equals the backward over all of them
 * (dq, dk, dv accumulate).  delta likewise belongs to the whole row.
 *
 * delta.  With compute_delta, delta [B, hq, sq] is written from dout and out
 * (sum computed in double, stored fp32) before the block is processed; a
 * schedule sets it on the first block of a row set and clears it on the
 * others, which read delta as written (out is then not read and may be NULL).
 *
 * Rows whose lse is -inf (the row saw no key in the forward) contribute
 * nothing (P = 0; their dq is not changed).  NaN in any input propagates to
 * the gradients it reaches (never silently dropped).
 *
 * Element types: q, k, v, dout in p.dtype (bf16/fp16 widened to fp32); out
 * in `out_dtype` (the plan dtype when the saved output is the O buffer, fp32
 * when it is the fp32 ACC); dq, dk, dv, lse, delta fp32.  Computation in fp32.
 *
 * Outputs are ACCUMULATED (+=): dq [B, sq, hq, d], dk and dv [B, skv, hkv, d],
 * all fp32, rows contiguous, batch strides dq_bstride / dkv_bstride elements
 * (0: the block's own size, i.e. contiguous; a larger stride lets a block
 * write its slice of an all-gathered [B, S, hkv, d] gradient in place);
 * elements between batches are not touched.  The caller zeroes them
 * (init_acc with n_lse = 0) before the first block. */
typedef struct cpc_attn_bwd_args {
    cpc_attn_problem p;       /* the block (q, k, v read) */
    const void *dout;         /* [B, sq, hq, d] in p.dtype, batch stride dout_bstride */
    int64_t dout_bstride;
    const void *out;          /* [B, sq, hq, d] in out_dtype, batch stride out_bstride;
                                 read only with compute_delta */
    cpc_dtype out_dtype;
    int64_t out_bstride;
    const float *lse;         /* [B, hq, sq] fp32, natural log, of the whole row */
    float *delta;             /* [B, hq, sq] fp32: written (compute_delta) or read */
    bool compute_delta;
    float *dq;                /* [B, sq, hq, d] fp32, += ; batch stride dq_bstride */
    float *dk, *dv;           /* [B, skv, hkv, d] fp32, += ; batch stride dkv_bstride */
    int64_t dq_bstride, dkv_bstride; /* elements; 0 = contiguous */
} cpc_attn_bwd_args;

/* The checks of each direction, used by every backend before it reads or
 * writes anything: cpc_attn_problem_check on a->p (its message unchanged),
 * then the direction's own pointers and strides (with rows: o and lse;
 * backward: dout and delta, out and a known out_dtype with compute_delta,
 * dout/out batch strides >= a batch's block when B > 1, dq/dkv strides 0 or
 * >= a batch's block, and with keys lse, dq, dk, dv).  NULL when valid;
 * CPC_E_INTERNAL otherwise ("attention: ..." for the problem, "attention
 * forward: ..." / "attention backward: ..." for the rest).  Thread-safe. */
cpc_status *cpc_attn_args_check(const cpc_attn_args *a);
cpc_status *cpc_attn_bwd_args_check(const cpc_attn_bwd_args *a);

/* acc/acc_lse <- LSE merge of (acc, acc_lse) and (o, lse), in fp32:
 * lse' = log(e^a + e^b), acc' = e^(a-lse') acc + e^(b-lse') o.  Rows with
 * both LSEs -inf stay (0, -inf).  Shapes: acc, o [B, s, h, d]; lse [B, h, s]. */
typedef struct cpc_merge_args {
    int B; int64_t s; int h, d;
    float *acc; float *acc_lse;
    const float *o; const float *lse;
} cpc_merge_args;

typedef struct cpc_backend cpc_backend;

typedef struct cpc_backend_vtable {
    const char *name;                      /* "cpu", "cuda" */
    /* Device memory.  `bytes` may be 0 (returns a valid unique pointer). */
    cpc_status *(*alloc)(cpc_backend *be, size_t bytes, void **out);
    void (*free)(cpc_backend *be, void *ptr);
    /* Host <-> device copies (CPU: memcpy). */
    cpc_status *(*upload)(cpc_backend *be, void *dst, const void *host, size_t bytes);
    cpc_status *(*download)(cpc_backend *be, void *host, const void *src, size_t bytes);
    /* Device-to-device copy of bytes. */
    cpc_status *(*copy)(cpc_backend *be, void *dst, const void *src, size_t bytes);
    cpc_status *(*attn)(cpc_backend *be, const cpc_attn_args *a);
    cpc_status *(*merge)(cpc_backend *be, const cpc_merge_args *m);
    /* acc = 0, lse = -inf over n elements of each. */
    cpc_status *(*init_acc)(cpc_backend *be, float *acc, size_t n_acc, float *lse, size_t n_lse);
    /* Converts n elements between dtypes (fp32 <-> bf16/fp16, or same). */
    cpc_status *(*convert)(cpc_backend *be, void *dst, cpc_dtype dst_t, const void *src,
                           cpc_dtype src_t, size_t n);
    /* Strided 4-D copy of elements of `esize` bytes: for b < nb, t < nt,
     * h < nh: dst[b*dbs + t*dts + h*dhs + 0..inner) = src[...] (strides in
     * elements, `inner` contiguous elements).  Packs/unpacks all-to-all
     * parts and selects heads. */
    cpc_status *(*copy_strided)(cpc_backend *be, void *dst, const void *src, size_t esize,
                                int64_t nb, int64_t nt, int64_t nh, int64_t inner,
                                int64_t dbs, int64_t dts, int64_t dhs,
                                int64_t sbs, int64_t sts, int64_t shs);
    /* Attention backward of one block (cpc_attn_bwd_args).  Optional: NULL
     * when the backend has no backward kernel (training plans then refuse
     * to run on it). */
    cpc_status *(*attn_bwd)(cpc_backend *be, const cpc_attn_bwd_args *a);
    /* Optional (NULL: the reducing all-to-all of a backward program refuses
     * to run on the backend).  fp32 strided accumulate with copy_strided's
     * geometry: dst[...] += src[...] (strides in floats).  Sums the partial
     * dK/dV of K/V heads that several ulysses members hold (program.h
     * all_to_all `reduce`).  dst and src must not overlap. */
    cpc_status *(*add_strided)(cpc_backend *be, float *dst, const float *src, int64_t nb, int64_t nt,
                               int64_t nh, int64_t inner, int64_t dbs, int64_t dts, int64_t dhs,
                               int64_t sbs, int64_t sts, int64_t shs);
    /* Waits for queued work (CPU: no-op).  May be NULL. */
    cpc_status *(*sync)(cpc_backend *be);
    void (*destroy)(cpc_backend *be);
} cpc_backend_vtable;

struct cpc_backend {
    const cpc_backend_vtable *vt;
    void *ctx;
};

/* Calls through the vtable: every caller uses these, never be->vt->...
 * directly, so that the optional methods' checks live in one place (a NULL
 * `sync` is a no-op; a NULL `attn_bwd` is CPC_E_UNSUPPORTED naming the
 * backend).  Arguments, results and errors are the methods' (above). */
static inline const char *cpc_backend_name(const cpc_backend *be) { return be->vt->name; }
static inline cpc_status *cpc_backend_alloc(cpc_backend *be, size_t bytes, void **out)
{ return be->vt->alloc(be, bytes, out); }
static inline void cpc_backend_free(cpc_backend *be, void *ptr) { be->vt->free(be, ptr); }
static inline cpc_status *cpc_backend_upload(cpc_backend *be, void *dst, const void *host, size_t bytes)
{ return be->vt->upload(be, dst, host, bytes); }
static inline cpc_status *cpc_backend_download(cpc_backend *be, void *host, const void *src, size_t bytes)
{ return be->vt->download(be, host, src, bytes); }
static inline cpc_status *cpc_backend_copy(cpc_backend *be, void *dst, const void *src, size_t bytes)
{ return be->vt->copy(be, dst, src, bytes); }
static inline cpc_status *cpc_backend_attn(cpc_backend *be, const cpc_attn_args *a)
{ return be->vt->attn(be, a); }
static inline cpc_status *cpc_backend_merge(cpc_backend *be, const cpc_merge_args *m)
{ return be->vt->merge(be, m); }
static inline cpc_status *cpc_backend_init_acc(cpc_backend *be, float *acc, size_t n_acc, float *lse,
                                               size_t n_lse)
{ return be->vt->init_acc(be, acc, n_acc, lse, n_lse); }
static inline cpc_status *cpc_backend_convert(cpc_backend *be, void *dst, cpc_dtype dst_t,
                                              const void *src, cpc_dtype src_t, size_t n)
{ return be->vt->convert(be, dst, dst_t, src, src_t, n); }
static inline cpc_status *cpc_backend_copy_strided(cpc_backend *be, void *dst, const void *src,
                                                   size_t esize, int64_t nb, int64_t nt, int64_t nh,
                                                   int64_t inner, int64_t dbs, int64_t dts,
                                                   int64_t dhs, int64_t sbs, int64_t sts,
                                                   int64_t shs)
{ return be->vt->copy_strided(be, dst, src, esize, nb, nt, nh, inner, dbs, dts, dhs, sbs, sts, shs); }
static inline bool cpc_backend_has_attn_bwd(const cpc_backend *be) { return be->vt->attn_bwd != NULL; }
static inline cpc_status *cpc_backend_attn_bwd(cpc_backend *be, const cpc_attn_bwd_args *a)
{
    if (!be->vt->attn_bwd)
        return cpc_error(CPC_E_UNSUPPORTED, "the %s backend has no attention backward", be->vt->name);
    return be->vt->attn_bwd(be, a);
}
static inline cpc_status *cpc_backend_add_strided(cpc_backend *be, float *dst, const float *src, int64_t nb,
                                                  int64_t nt, int64_t nh, int64_t inner, int64_t dbs,
                                                  int64_t dts, int64_t dhs, int64_t sbs, int64_t sts,
                                                  int64_t shs)
{
    if (!be->vt->add_strided)
        return cpc_error(CPC_E_UNSUPPORTED, "the %s backend has no fp32 accumulate (needed to sum the "
                                            "dK/dV of K/V heads shared by ulysses members)", be->vt->name);
    return be->vt->add_strided(be, dst, src, nb, nt, nh, inner, dbs, dts, dhs, sbs, sts, shs);
}
static inline cpc_status *cpc_backend_sync(cpc_backend *be)
{ return be->vt->sync ? be->vt->sync(be) : NULL; }
/* NULL is ignored. */
static inline void cpc_backend_destroy(cpc_backend *be)
{
    if (be)
        be->vt->destroy(be);
}

/* The CPU backend (backend_cpu.c): tiled flash attention with online softmax,
 * OpenBLAS SGEMM for the two products of each tile (and the five of each
 * backward tile, attention_bwd_cpu.c), one thread per rank
 * (OpenBLAS threading is set to 1 by the caller, see
 * cpc_cpu_backend_single_thread_blas).  Returns NULL status and *out owned by the caller (destroy). */
cpc_status *cpc_cpu_backend_create(cpc_backend **out);

/* Sets OpenBLAS to one thread (call once, before rank threads start). */
void cpc_cpu_backend_single_thread_blas(void);

/* Scalar conversions used across the project (round to nearest even). */
float cpc_bf16_to_f32(uint16_t h);
uint16_t cpc_f32_to_bf16(float f);
float cpc_fp16_to_f32(uint16_t h);
uint16_t cpc_f32_to_fp16(float f);

#endif
