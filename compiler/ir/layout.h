/*
 * layout.h - where every token and head lives on every rank (the data layout
 * of a selected candidate).  Shared by the scheduler, the verifier, the cost
 * model and the runtime, so that all of them agree on sizes.
 *
 * Mesh (SPEC section 1, diffusers): shape (R, U), ring outer, ulysses inner:
 * flat rank p = r * U + u.  Ring group of p: the ranks with the same u, index
 * r.  Ulysses group of p: the ranks with the same r, index u.
 *
 * Sequence split: the input sequence (S tokens, in segment order) is split
 * over the P flat ranks, each segment separately (SPEC section 1
 * "segments"), following torch.tensor_split: of n tokens over w ranks the
 * first n % w ranks get one more.  Rank p holds, for each segment in order,
 * the chunk p of that segment ("its shard").  With a causal mask and
 * zigzag (ring/unified, one segment, S % 2P == 0), rank p holds chunks p and
 * 2P-1-p of 2P equal chunks (CP023).
 *
 * Ring block i (0 <= i < R): what a rank of ulysses group i holds after the
 * ulysses all-to-all: the shards of flat ranks i*U .. i*U+U-1, concatenated
 * in that order.  With U == 1, block i == shard i.
 *
 * Heads: ulysses member u holds query heads [q_off(u), q_off(u)+q_n(u)):
 * tensor_split of H over U.  Its K/V heads are exactly those its query heads
 * use (GQA ratio g = H / Hkv; query head h uses K/V head h / g):
 * [q_off/g, (q_off+q_n-1)/g + 1), replicated on several members when U > Hkv.
 *
 * Token positions are global (0..S-1 in segment order), used for causal masks
 * and key-padding masks.  Cross-attention (input.kv): K/V are a separate
 * sequence of Skv tokens held whole by every rank.
 *
 * REPLICATED SEGMENTS (`split: replicate`, SPEC section 1): such a segment
 * is held whole by every rank and never divided.  The sharded segments
 * (seg_start/seg_len, n_seg) are split as above and make up shards, ring
 * blocks and ALL buffers; the replicated ones (rep_start/rep_len, n_rep,
 * Srep tokens) are the KV token layout of a plan without cross-attention
 * (program.h): q/k/v/out rows of every rank at global positions
 * rep_start..  S stays the whole sequence (global positions, the gathered
 * output); Skv stays S (key-padding masks index global keys).  A rank's
 * own tokens, as users hand them over and get them back ("rank runs"),
 * are its shard plus every replicated segment, in segment order (text
 * whole first, then image shard p, for a text-first plan).  Every segment
 * replicated, or replicated segments with cross-attention, are refused by
 * validation (CP027).
 *
 * All functions are pure and thread-safe.
 *
 * Details (layout.c; added by the implementer, additive):
 *  - zigzag is set only where it is defined: causal, not cross-attention,
 *    variant ring or unified, one segment and S % 2P == 0.  Plans outside
 *    that are rejected by validation (CP022/CP023/CP024); their layout stays
 *    the plain segment-wise split so that sizes remain well defined.
 *  - Runs are returned in memory order with ADJACENT RUNS MERGED (zigzag
 *    rank P-1 holds chunks P-1 and P: one run; a ulysses block of one
 *    segment is one run).  Empty runs are omitted.  The return value is the
 *    full count even when it exceeds `max` (only `max` are written).
 *  - Shard and block sizes never increase with the index (tensor_split), so
 *    the maxima are those of rank 0 / block 0; block sizes and offsets are
 *    closed-form (cost O(n_seg), not O(P)).  cpc_layout_max_kv_heads loops
 *    over the U members (the widest K/V range need not be member 0's).
 *  - cpc_split_len/off accept any n >= 0, w >= 1 (i out of range: len 0;
 *    off(i >= w) = n).
 *  - cpc_layout_init also returns CPC_E_INTERNAL for: variant AUTO, a degree
 *    < 1, R*U > 2^20, no segments, a segment outside 1..2^31-1 tokens,
 *    heads/kv_heads/head_dim < 1 or H % Hkv != 0, batch < 1, cross-attention
 *    with kv_tokens < 1.
 */
#ifndef CPC_LAYOUT_H
#define CPC_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "plan.h"
#include "status.h"

#define CPC_MAX_SEGMENTS 64

/* A run of consecutive global token positions [start, start + len). */
typedef struct cpc_run {
    int64_t start;
    int64_t len;
} cpc_run;

typedef struct cpc_layout {
    cpc_variant variant;     /* resolved (never AUTO) */
    int R, U, P;             /* P = R * U */
    int B;                   /* batch */
    int H, Hkv, D;           /* heads, kv heads, head_dim */
    int group;               /* GQA ratio H / Hkv */
    cpc_dtype dtype;
    bool causal;             /* mask == causal */
    bool zigzag;             /* causal and variant ring/unified: zigzag shards */
    bool cross;              /* input.kv: K/V whole on every rank */
    int64_t S;               /* total query tokens */
    int64_t Skv;             /* key/value tokens (S unless cross) */
    int n_seg;               /* sharded segments (global starts) */
    int64_t seg_start[CPC_MAX_SEGMENTS];
    int64_t seg_len[CPC_MAX_SEGMENTS];
    bool rep;                /* some segment is replicated (n_rep > 0) */
    int n_rep;               /* replicated segments (global starts) */
    int64_t Srep;            /* their tokens */
    int64_t rep_start[CPC_MAX_SEGMENTS];
    int64_t rep_len[CPC_MAX_SEGMENTS];
} cpc_layout;

/* torch.tensor_split: length and offset of chunk i of n over w (w >= 1,
 * 0 <= i < w). */
int64_t cpc_split_len(int64_t n, int64_t w, int64_t i);
int64_t cpc_split_off(int64_t n, int64_t w, int64_t i);

/* Fills `L` for a plan and a resolved (variant, R, U).  Errors: CPC_E_INTERNAL
 * when the plan has more than CPC_MAX_SEGMENTS segments or R*U overflows. */
cpc_status *cpc_layout_init(cpc_layout *L, const cpc_plan *plan, cpc_variant variant,
                            int R, int U);

/* Maximum number of runs of one shard (2 per segment, for zigzag) and of one
 * ring block (U shards). */
int cpc_layout_max_shard_runs(const cpc_layout *L);
int cpc_layout_max_block_runs(const cpc_layout *L);

/* Runs of flat rank p's shard, in memory order.  Writes at most `max` runs
 * into `out` and returns how many the shard has (empty runs are omitted). */
int cpc_layout_shard_runs(const cpc_layout *L, int p, cpc_run *out, int max);
/* Tokens of flat rank p's shard. */
int64_t cpc_layout_shard_tokens(const cpc_layout *L, int p);
/* Largest shard over all ranks (tokens). */
int64_t cpc_layout_max_shard_tokens(const cpc_layout *L);

/* Runs / tokens of ring block i (0 <= i < R). */
int cpc_layout_block_runs(const cpc_layout *L, int i, cpc_run *out, int max);
int64_t cpc_layout_block_tokens(const cpc_layout *L, int i);
int64_t cpc_layout_max_block_tokens(const cpc_layout *L);
/* Token offset of block i inside the all-gathered buffer (blocks 0..R-1
 * concatenated). */
int64_t cpc_layout_block_offset(const cpc_layout *L, int i);

/* Heads of ulysses member u (0 <= u < U): query heads and K/V heads as
 * [*off, *off + *n). */
void cpc_layout_q_heads(const cpc_layout *L, int u, int *off, int *n);
void cpc_layout_kv_heads(const cpc_layout *L, int u, int *off, int *n);
int cpc_layout_max_q_heads(const cpc_layout *L);
int cpc_layout_max_kv_heads(const cpc_layout *L);

/* Rows of the KV token layout: Skv with cross-attention, else Srep (the
 * replicated segments), and their global runs (cross-attention: {0, Skv};
 * returns the count, writes at most max). */
int64_t cpc_layout_kv_rows(const cpc_layout *L);
int cpc_layout_kv_runs(const cpc_layout *L, cpc_run *out, int max);

/* A rank's own tokens as the user hands them over and gets them back: its
 * shard plus every replicated segment, in global (segment) order; without
 * replicated segments exactly the shard.  rank_offset: the row of global
 * position pos inside rank p's tokens, -1 when p does not hold it. */
int cpc_layout_max_rank_runs(const cpc_layout *L);
int cpc_layout_rank_runs(const cpc_layout *L, int p, cpc_run *out, int max);
int64_t cpc_layout_rank_tokens(const cpc_layout *L, int p);
int64_t cpc_layout_rank_offset(const cpc_layout *L, int p, int64_t pos);

#endif
