/*
 * placement.h - where the ranks of a job sit on the four axes (SPEC section
 * 1, "All four axes"), and the slices of the global tensors each one holds.
 *
 * A job with cfg_degree C and tp_degree T is C*T independent R x U problems
 * (validate.h THE OUTER AXES): one (c, t) GROUP holds batch items
 * [c*B/C, (c+1)*B/C) and query heads [t*H/T, (t+1)*H/T) with the K/V heads
 * those use, and runs the job's R x U program (laid out on the sub-plan,
 * plan.h cpc_plan_sub) on them.  World size P = C*T*R*U; world rank
 *   p = ((c*R + r)*U + u)*T + t        (cfg outermost, tensor parallel innermost)
 * and the rank inside its group's R x U program is q = r*U + u (layout.h).
 * K/V heads: with Hkv % T == 0, heads [t*Hkv/T, (t+1)*Hkv/T); with Hkv < T
 * (T % Hkv == 0, SPEC CP006) the one head (t*H/T) / (H/Hkv): each K/V head
 * is replicated to the T/Hkv ranks whose query heads use it.  With C = T = 1
 * every rank is its own q and holds the whole batch and every head.
 *
 * Slices: the global tensors are BSHD [B, S, H, D] (K/V [B, Skv, Hkv, D]);
 * a rank's shard is [B/C, tokens of its runs, H/T, D].  The helpers below
 * count in ELEMENTS of a row of the global tensor (row = H*D) or in bytes,
 * as said.
 *
 * Thread-safety: pure functions of their arguments.
 */
#ifndef CPC_PLACEMENT_H
#define CPC_PLACEMENT_H

#include <stdint.h>

#include "layout.h"
#include "plan.h"
#include "status.h"

typedef struct cpc_placement {
    int C, T, R, U;     /* cfg_degree, tp_degree, ring_degree, ulysses_degree */
    int P;              /* C*T*R*U: the job's world */
    int RU;             /* R*U: one group's world (the program's layout P) */
    int B, H, Hkv;      /* the whole problem's batch and heads */
} cpc_placement;

/* One world rank's coordinates and slice. */
typedef struct cpc_rank_place {
    int p;              /* world rank */
    int c, t, r, u;     /* coordinates */
    int q;              /* r*U + u: the rank in its group's R x U program */
    int group;          /* c*T + t */
    int b0;             /* first batch item: c * (B/C) */
    int h0;             /* first query head: t * (H/T) */
    int hkv0;           /* first K/V head (see above) */
} cpc_rank_place;

/* Fills `pl` for `plan` (the whole problem, its cfg_degree/tp_degree
 * resolved) whose program is laid out as `L` (one group's sub-plan).
 * Errors: CPC_E_INTERNAL when L is not the layout of the plan's (C, T)
 * sub-plan (batch, heads or world size do not agree). */
cpc_status *cpc_placement_init(cpc_placement *pl, const cpc_plan *plan, const cpc_layout *L);

/* The coordinates of world rank p (0 <= p < pl->P). */
cpc_rank_place cpc_placement_rank(const cpc_placement *pl, int p);

/* The world rank of rank q of group (c, t): inverse of cpc_placement_rank. */
int cpc_placement_world_rank(const cpc_placement *pl, int c, int t, int q);

/* The whole problem's layout: `L` (a group's) with B, H, Hkv, the GQA
 * ratio and P of the job (shard arithmetic of the copy is meaningless; use it for the global
 * tensors' shapes only). */
cpc_layout cpc_placement_global_layout(const cpc_placement *pl, const cpc_layout *L);

/* Copies a shard into a global tensor (bytes): the shard is
 * [nb, T, shard_row] with T = sum of the runs' lengths, the global tensor
 * [*, S, global_row]; shard row i of batch b lands at global batch b0 + b,
 * token runs[..], bytes [col0, col0 + shard_row) of the row. */
void cpc_scatter_box(void *global, const void *shard, int64_t nb, int64_t S, int64_t global_row,
                     int64_t b0, int64_t col0, int64_t shard_row, const cpc_run *runs, int n_runs);

#endif
