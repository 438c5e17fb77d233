/*
 * attn_problem.h - one attention problem: the block of attention that a
 * forward (backend.h, cpc_attn_args) and a backward (cpc_attn_bwd_args) both
 * compute, described once.  Both argument structs embed a cpc_attn_problem
 * as their first member `.p` and add only their direction's own pointers.
 * The problem's single validation (cpc_attn_problem_check), its head mapping,
 * positions, key padding and tiling below are used by the CPU backend's
 * forward and backward, by the CUDA backend's (host side) and by the
 * executor, which builds the problem from a program's buffers.
 *
 * Tensors are BSHD: [B, S, H, D] row-major, with an explicit batch stride
 * (elements) so that a block inside an all-gathered buffer is read in place.
 * Sizes are in elements (d, strides) or tokens (sq, skv, positions).  Every
 * pointer is borrowed: the problem owns nothing and copies nothing.
 */
#ifndef CPC_ATTN_PROBLEM_H
#define CPC_ATTN_PROBLEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "plan.h"
#include "status.h"

/* The geometry, inputs and masking of one attention block.
 *
 * Query head h (0 <= h < hq) is global head q_head_off + h and uses the
 * global K/V head (q_head_off + h) / group, i.e. the block's local K/V head
 * (q_head_off + h) / group - kv_head_off (GQA; group = H / Hkv of the whole
 * layer, 1 without GQA).
 *
 * Positions: query row i has the global position given by the runs (the rows
 * are the concatenation of q_runs; no runs: positions 0..sq-1), key rows
 * likewise from kv_runs.  With `causal`, query at global position i sees
 * the keys at positions j <= i.  With kv_mask (key padding, [B, mask_len]
 * u8 indexed by global key position, 1 = the key takes part) masked keys are
 * excluded.  A row that sees no key contributes nothing (forward: o = 0,
 * lse = -inf). */
typedef struct cpc_attn_problem {
    int B;                    /* batch, >= 0 */
    int64_t sq, skv;          /* query rows and key rows of this block (tokens), >= 0 */
    int hq;                   /* local query heads, >= 0 */
    int hkv;                  /* K/V heads this block holds, >= 1 */
    int d;                    /* head_dim (elements), >= 1 */
    int group;                /* GQA ratio H / Hkv (global), >= 1 */
    int q_head_off;           /* global index of local query head 0, >= 0 */
    int kv_head_off;          /* global index of the block's K/V head 0, >= 0 */
    cpc_dtype dtype;          /* of q, k, v (and the backward's dout) */
    const void *q;            /* [B, sq, hq, d], batch stride q_bstride elements */
    const void *k, *v;        /* [B, skv, hkv, d], batch stride kv_bstride elements */
    int64_t q_bstride;        /* elements; >= sq * hq * d when B > 1 */
    int64_t kv_bstride;       /* elements; >= skv * hkv * d when B > 1 */
    float scale;              /* softmax scale (scores are q.k * scale) */
    bool causal;              /* key j visible to query i iff pos(j) <= pos(i) */
    const cpc_run *q_runs;  int n_q_runs;   /* NULL/0: positions 0..sq-1 */
    const cpc_run *kv_runs; int n_kv_runs;  /* NULL/0: positions 0..skv-1 */
    const uint8_t *kv_mask;   /* NULL or [B, mask_len] u8 (host or device memory:
                                 the check reads only mask_len) */
    int64_t mask_len;         /* tokens per batch row of kv_mask */
} cpc_attn_problem;

/* Whether the problem has rows to compute (B, sq and hq all positive); a
 * problem without any is valid and does nothing. */
static inline bool cpc_attn_problem_has_rows(const cpc_attn_problem *p)
{
    return p->B > 0 && p->sq > 0 && p->hq > 0;
}

/* Validates p.  Every rule is one refusal (CPC_E_INTERNAL: the executor
 * and the tests build problems, a user never does), in this order:
 *   1. p is NULL;
 *   2. a size out of range (B, sq, skv, hq, q_head_off, kv_head_off < 0;
 *      hkv, d, group < 1);
 *   3. dtype not a cpc_dtype;
 *   4. hq * d or hkv * d beyond 2^31 - 1 (the BLAS index range), or
 *      sq * hq * d or skv * hkv * d beyond int64;
 *   5. a query head's K/V head outside [kv_head_off, kv_head_off + hkv);
 *   6. with B > 1, a batch stride smaller than a batch's block;
 *   7. with rows, q missing, or k/v missing while skv > 0;
 *   8. a malformed run list (negative count, NULL list with a count, a
 *      negative run length);
 *   9. with rows, query runs that do not add up to sq;
 *  10. with rows and keys, key runs that do not add up to skv;
 *  11. with rows, keys and kv_mask, mask_len < 0 or a key position outside
 *      [0, mask_len).
 * Messages begin "attention: " and are the same whichever direction or
 * backend checks the problem.  Returns NULL when p is valid.  Reads only p
 * and its run lists (O(n_q_runs + n_kv_runs)); thread-safe. */
cpc_status *cpc_attn_problem_check(const cpc_attn_problem *p);

/* Fills pos[0..n) with the global positions of n rows from runs (NULL/0:
 * 0..n-1).  The runs must add up to n (checked by cpc_attn_problem_check). */
void cpc_attn_positions(const cpc_run *runs, int n_runs, int64_t n, int64_t *pos);

/* The local query heads [*h0, *h1) that use the block's local K/V head kvl
 * (global K/V head g = kv_head_off + kvl serves global query heads
 * g*group .. g*group + group - 1); false when no query head of p uses it. */
bool cpc_attn_q_heads(const cpc_attn_problem *p, int kvl, int *h0, int *h1);

/* ---- tiling of rows and keys into blocks (host-side kernels) ---- */

/* Per tile of rows (queries or keys): the smallest and largest position,
 * whether the positions increase, and (keys) how many are padded out. */
enum { CPC_TILE_MIN = 0, CPC_TILE_MAX, CPC_TILE_INC, CPC_TILE_MASKED, CPC_TILE_N };

/* The tiling of one problem into tq query rows x tk keys: positions, tile
 * descriptors and key padding, in scratch grown on demand and kept between
 * problems (zero-initialise; free with cpc_attn_tiling_free).  One per
 * thread: not thread-safe. */
typedef struct cpc_attn_tiling {
    int tq, tk;                       /* tile sizes set by prepare */
    int64_t n_qt, n_kt;               /* number of query and key tiles */
    int64_t *qpos; size_t qpos_cap;   /* [sq] global positions of the query rows */
    int64_t *kpos; size_t kpos_cap;   /* [skv] of the key rows */
    int64_t *qt;   size_t qt_cap;     /* [n_qt][CPC_TILE_N] query tiles */
    int64_t *kt;   size_t kt_cap;     /* [n_kt][CPC_TILE_N] key tiles */
    float *bias;   size_t bias_cap;   /* [skv] 0 or -inf: key padding of the current batch */
} cpc_attn_tiling;

/* Prepares t for the (checked) problem p with tiles of tq x tk (>= 1):
 * positions, tile descriptors, no key padded yet.  Errors: CPC_E_NOMEM. */
cpc_status *cpc_attn_tiling_prepare(cpc_attn_tiling *t, const cpc_attn_problem *p, int tq, int tk);

/* The key padding of batch row b (p->kv_mask; nothing without one): t->bias
 * and each key tile's CPC_TILE_MASKED count. */
void cpc_attn_tiling_batch(cpc_attn_tiling *t, const cpc_attn_problem *p, int b);

/* What query tile qi computes against key tile kj. */
typedef struct cpc_attn_tile {
    int64_t i0, j0;   /* first query row and first key of the tiles */
    int r0, br;       /* rows [r0, br) of the tile see some key (r0 > 0 only on the diagonal) */
    int bcx;          /* keys [0, bcx) of the tile can be seen by some row */
    bool diag;        /* straddles the causal diagonal: mask per row */
    bool pad;         /* some key of the tile is padded out: add t->bias */
} cpc_attn_tile;

/* Whether query tile qi and key tile kj interact; when they do, *out says
 * which rows and keys: tiles no row can see (causal) and tiles whose keys are
 * all padded are skipped; a tile straddling the diagonal is trimmed to the
 * keys some row sees (increasing key positions: a prefix) and the rows that
 * see some key (increasing query positions: a suffix). */
bool cpc_attn_tile_pair(const cpc_attn_tiling *t, const cpc_attn_problem *p, int64_t qi, int64_t kj,
                        cpc_attn_tile *out);

/* Masks the scores sr[0..tl->bcx) of query row r (tile-relative, r0 <= r <
 * br) in place: on a diagonal tile keys at positions > the row's get -inf;
 * with padding the tile's bias (0 or -inf) is added. */
void cpc_attn_mask_row(const cpc_attn_tiling *t, const cpc_attn_tile *tl, int r, float *sr);

/* Frees t's scratch (the struct itself is the caller's). */
void cpc_attn_tiling_free(cpc_attn_tiling *t);

#endif
