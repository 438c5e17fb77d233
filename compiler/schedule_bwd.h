/*
 * schedule_bwd.h - the backward op program of a training plan (SPEC section
 * 10, docs/BACKWARD.md section 3), built from the same layout as the forward.
 *
 * WHAT TRAINS.  Variants none (1 rank) and ring (ulysses_degree 1): the ring
 * backward rotates K/V blocks exactly as the forward's P2P ring (block
 * (r - s) mod R at step s) and each block's dK/dV accumulator travels with
 * it, so that after R steps it arrives home with all R contributions
 * (BACKWARD.md 3.1, the non-lagged form).  A ring plan with rotate:
 * allgather trains with this P2P backward (the forward keeps its rotation).
 * Causal zigzag, GQA and key padding need nothing extra (masks by global
 * position).  Every other case is refused with CP060 naming what trains:
 * ulysses and unified (U > 1), cross-attention (input.kv), uneven splits.
 *
 * THE PROGRAM (U == 1; r = ring index; all K/V-sized buffers BLOCK, ALL heads):
 *   inputs  q (Q, SHARD), dout (DO, SHARD), out (O, SHARD: the forward's
 *           output), lse (LSE, SHARD: the forward's final LSE), k_cur, v_cur
 *           (K, V, BLOCK = shard r)
 *   delta   in=dout,out out=delta
 *   init_acc out=dq ; init_acc out=dk_cur,dv_cur
 *   loop count=R
 *     send ring peer=(r+1)%R in=k_cur,v_cur tag=0 when=s<R-1
 *     recv ring peer=(r-1)%R out=k_nxt,v_nxt block=(r-s-1)%R tag=0 when=s<R-1
 *     attn_bwd in=q,k_cur,v_cur,dout,lse,delta out=dq,dk_cur,dv_cur
 *     send ring peer=(r+1)%R in=dk_cur,dv_cur tag=1 when=R>1
 *     recv ring peer=(r-1)%R out=dk_nxt,dv_nxt block=(r-s-1)%R tag=1 when=R>1
 *     wait tag=0 when=s<R-1 ; wait tag=1 when=R>1
 *     swap k_cur,k_nxt ; swap v_cur,v_nxt (when=s<R-1)
 *     swap dk_cur,dk_nxt ; swap dv_cur,dv_nxt (when=R>1)
 *   end
 *   outputs dq (DQ, SHARD), dk_cur, dv_cur (DK, DV, BLOCK: block r at the end),
 *           all fp32; the caller converts to the plan dtype.
 * Bytes sent per rank: K/V x 2 x T_blk Hkv D e, dK/dV R x 2 x T_blk Hkv D x 4.
 *
 * Ownership: *out is a new program (cpc_program_free).  Errors: CPC_E_PLAN
 * rule 60 for a variant or layout that does not train (message says which
 * do), CPC_E_INTERNAL / NOMEM as cpc_schedule_build.
 */
#ifndef CPC_SCHEDULE_BWD_H
#define CPC_SCHEDULE_BWD_H

#include "plan.h"
#include "program.h"
#include "status.h"

#define CPC_RULE_TRAIN 60

/* NULL when (variant, R, U) of `plan` has a backward program; else the CP060
 * refusal (the same check cpc_schedule_build_backward makes first). */
cpc_status *cpc_backward_supported(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                                   int ulysses_degree);

/* True when two ulysses members hold the same K/V head (U > Hkv, or the
 * query heads of one K/V head straddle two members: uneven heads of
 * ulysses_anything): their partial dK/dV must be summed (all_to_all
 * reduce=sum).  Pure. */
bool cpc_backward_kv_heads_shared(const cpc_layout *L);

cpc_status *cpc_schedule_build_backward(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                                        int ulysses_degree, cpc_program **out);

#endif
