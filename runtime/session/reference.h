/*
 * reference.h - the numerical reference: single-device attention in float64
 * over the global tensors, and the comparison that `cprun --check` and every
 * numeric test use (SPEC section 5: relative error ||out-ref||_2/||ref||_2,
 * tolerances fp32 1e-5, fp16 2e-3, bf16 1e-2, NaN or Inf always fails).
 *
 * The reference reads q/k/v in their storage dtype and widens every element
 * exactly to double (bf16/fp16/fp32 values are all representable), so a
 * check "computed from the same (rounded) inputs" sees only the error of the
 * implementation under test, never the input rounding.  Scores, softmax and
 * the weighted sum are computed in double with the max subtracted before the
 * exponential:
 *
 *   s_j  = scale * sum_d q[d] k_j[d]           for every visible key j
 *   m    = max_j s_j,   l = sum_j exp(s_j - m)
 *   out  = sum_j exp(s_j - m) v_j / l,   lse = m + log(l)   (natural log)
 *
 * Key j is visible to query row i when (causal ? j <= i : true) and
 * (kv_mask ? kv_mask[b*Skv + j] != 0 : true); positions are the global token
 * indices 0..S-1 / 0..Skv-1 (BSHD rows in segment order).  A row that sees
 * no key gets out = 0 and lse = -inf.  GQA/MQA: query head h uses K/V head
 * h / (H / Hkv).
 *
 * Thread-safety: every function is reentrant (no global state); inputs are
 * only read.
 */
#ifndef CPC_REFERENCE_H
#define CPC_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "status.h"

/* A global attention problem (single device, every tensor whole). */
typedef struct cpc_ref_problem {
    int B;                 /* batch, >= 1 */
    int64_t S;             /* query tokens, >= 1 */
    int64_t Skv;           /* key/value tokens, >= 1 (S for self-attention) */
    int H, Hkv, D;         /* query heads, K/V heads (H % Hkv == 0), head_dim */
    cpc_dtype dtype;       /* element type of q, k and v */
    const void *q;         /* [B, S, H, D], contiguous */
    const void *k, *v;     /* [B, Skv, Hkv, D], contiguous */
    double scale;          /* softmax scale, usually 1/sqrt(D); pass the value
                              the implementation under test uses */
    bool causal;           /* query i sees keys j <= i */
    const uint8_t *kv_mask;/* NULL or [B, Skv]; 1 = the key takes part */
} cpc_ref_problem;

/* One query row: batch b, query head h, token (global position) s. */
typedef struct cpc_ref_row {
    int b;
    int h;
    int64_t s;
} cpc_ref_row;

/* Computes the reference output and LSE.
 *
 * rows == NULL: every row; `out` is [B, S, H, D] and `lse` is [B, H, S]
 *   (the layouts of the runtime's out and lse).
 * rows != NULL: the n_rows given rows, in any order (rows are grouped by
 *   (b, K/V head) internally, so repeated K/V work is shared); `out` is
 *   [n_rows, D] and `lse` is [n_rows], in the order of `rows`.
 * `out` or `lse` may be NULL when not wanted.  Cost: about
 * cpc_reference_flops() double operations, single-threaded; memory: one
 * [Skv, D] fp32 copy of K and V of one head when the dtype is 16-bit, plus Skv
 * doubles.
 *
 * Errors: CPC_E_INPUT for an inconsistent problem (non-positive sizes,
 * H % Hkv != 0, NULL tensors, a row out of range), CPC_E_NOMEM. */
cpc_status *cpc_reference_attention(const cpc_ref_problem *p, const cpc_ref_row *rows,
                                    int64_t n_rows, double *out, double *lse);

/* The reference backward (gradients of the attention above), in float64,
 * over every row: for the loss L = sum(dout * out), with the forward of
 * cpc_reference_attention (same masks, GQA, scale),
 *
 *   P_ij  = exp(s_ij - lse_i)                 (the row's softmax; 0 when masked)
 *   D_i   = sum_e dout_i[e] out_i[e]          (out from the same double forward)
 *   dS_ij = P_ij (dout_i . v_j - D_i)
 *   dq_i  = scale sum_j dS_ij k_j
 *   dk_j  = scale sum_i dS_ij q_i             (summed over the query heads of
 *   dv_j  =       sum_i P_ij dout_i            K/V head j's GQA group)
 *
 * (the chain rule through softmax; e.g. Dao 2023, FlashAttention-2,
 * section 2.3.2).  A row that sees no key contributes nothing; NaN inputs
 * propagate.  dout [B, S, H, D] contiguous in p->dtype (read exactly, like
 * q/k/v).  dq [B, S, H, D] and dk, dv [B, Skv, Hkv, D] are written (not
 * accumulated); any of them may be NULL when not wanted.  Cost about
 * 10 * B * S * Skv * H * D double operations, single-threaded; memory
 * O(Skv * D).  Errors: those of cpc_reference_attention, CPC_E_INPUT for a
 * NULL dout, CPC_E_NOMEM. */
cpc_status *cpc_reference_attention_bwd(const cpc_ref_problem *p, const void *dout, double *dq,
                                        double *dk, double *dv);

/* The same, and (when `bound` is not NULL, laid out as `out`) a first-order
 * bound of how much the output moves when every logit s_j is perturbed by
 * its own rounding error, in units of the unit roundoff u of the arithmetic
 * that computes the logits:
 *
 *   bound[d] = sqrt(sum_j (p_j * a_j * (v_j[d] - out[d]))^2),
 *   a_j = |scale| * sum_d |q[d] k_j[d]|
 *
 * (d out = sum_j p_j (d s_j) (v_j - out) for |d s_j| ~ u * a_j with
 * independent signs: an estimate, not a worst case).  u * bound
 * is the error that an implementation computing the logits in a precision
 * with unit roundoff u makes anyway: large when logits are large (|s| ~ 1000)
 * and several keys compete.  `out` may be NULL here too.  Cost: about twice
 * that of cpc_reference_attention. */
cpc_status *cpc_reference_attention_bound(const cpc_ref_problem *p, const cpc_ref_row *rows,
                                          int64_t n_rows, double *out, double *lse, double *bound);

/* Approximate floating-point operations of a reference computation of n_rows
 * rows (n_rows < 0: every row): 4 * rows * Skv * D.  Lets a caller decide
 * between all rows and a sample. */
double cpc_reference_flops(const cpc_ref_problem *p, int64_t n_rows);

/* Fills `out` with a deterministic sample of rows: for every (b, h), in
 * order, min(per_bh, S) distinct rows, sorted, one per stratum of
 * S / per_bh consecutive positions (random within its stratum, from Random123
 * Philox keyed by `seed`); the first and the last position (0 and S-1) are
 * always included (the first only, when the sample has one row).  `out` must hold B * H * min(per_bh, S) rows; returns
 * that count (0 when an argument is < 1). */
int64_t cpc_reference_sample_rows(int B, int H, int64_t S, int64_t per_bh, uint64_t seed,
                                  cpc_ref_row *out);

/* Gathers the given rows of a BSHD tensor `t` ([B, S, H, D], dtype dt) into
 * dst [n_rows, D] as doubles (exact widening), and of an LSE tensor `lse`
 * ([B, H, S] fp32) into dst [n_rows].  Errors: CPC_E_INPUT for a row out of
 * range. */
cpc_status *cpc_reference_gather_out(const void *t, cpc_dtype dt, int B, int64_t S, int H,
                                     int D, const cpc_ref_row *rows, int64_t n_rows,
                                     double *dst);
cpc_status *cpc_reference_gather_lse(const float *lse, int B, int H, int64_t S,
                                     const cpc_ref_row *rows, int64_t n_rows, double *dst);

/* Relative-error tolerance of SPEC section 5 for the plan's dtype: fp32 1e-5,
 * fp16 2e-3, bf16 1e-2. */
double cpc_check_tolerance(cpc_dtype t);

/* What the check promises for these very inputs (README "What the check
 * promises"): max(cpc_check_tolerance(t), CPC_CHECK_ROUNDING_FACTOR * e),
 * where e = u * ||bound|| / ||ref|| (u = 2^-24, the fp32 unit roundoff;
 * bound from cpc_reference_attention_bound, over the same n values as ref;
 * non-finite pairs skipped) is the relative error that rounding the logits
 * in fp32 causes on its own.  *rounding_err (may be NULL) receives e.
 * Used by cprun's check and by the backend conformance suite alike. */
#define CPC_CHECK_ROUNDING_FACTOR 8.0
#define CPC_FP32_UNIT_ROUNDOFF 5.9604644775390625e-08 /* 2^-24 */
double cpc_check_tolerance_conditioned(cpc_dtype t, const double *ref, const double *bound, int64_t n,
                                       double *rounding_err);

/* The result of a comparison of `got` against `ref`.  Accumulates over
 * several calls (shards, ranks, row sets): init, add..., finish. */
typedef struct cpc_compare_result {
    int64_t n;             /* elements compared */
    double max_abs_err;    /* max |got - ref| over pairs where both are finite */
    double sum_sq_diff;    /* sum (got - ref)^2 over finite pairs */
    double sum_sq_ref;     /* sum ref^2 over finite ref */
    double rel_err;        /* sqrt(sum_sq_diff / sum_sq_ref) (set by finish; 0 when
                              both sums are 0, +inf when only sum_sq_ref is 0) */
    int64_t n_nan;         /* got (or ref) is NaN */
    int64_t n_inf;         /* got is +-inf and ref is not the same infinity, or ref
                              is infinite and got is finite */
    int64_t first_bad;     /* index (over all added elements) of the first NaN/Inf
                              mismatch, -1 when none */
    bool pass;             /* set by finish: no NaN, no Inf mismatch, rel_err <= tol */
} cpc_compare_result;

/* Resets `r` before a series of cpc_compare_add calls (caller-owned struct). */
void cpc_compare_init(cpc_compare_result *r);

/* Adds n pairs: got[i] (dtype t: fp32 values, or bf16/fp16 bit patterns,
 * widened exactly) against ref[i].  Pairs where got and ref are the same
 * infinity (e.g. lse = -inf of a row that sees no key) count as equal and add
 * nothing to the sums. */
void cpc_compare_add(cpc_compare_result *r, const void *got, cpc_dtype t, const double *ref,
                     int64_t n);

/* Same, for got already in double. */
void cpc_compare_add_f64(cpc_compare_result *r, const double *got, const double *ref,
                         int64_t n);

/* Computes rel_err and pass (rel_err <= tol, and no NaN or Inf mismatch). */
void cpc_compare_finish(cpc_compare_result *r, double tol);

/* init + add + finish in one call. */
void cpc_compare(const void *got, cpc_dtype t, const double *ref, int64_t n, double tol,
                 cpc_compare_result *r);

#endif
