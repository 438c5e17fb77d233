/*
 * schedule_bwd.h - the backward op program of a training plan (SPEC section
 * 10, docs/BACKWARD.md section 3), built from the same layout as the forward
 * (same shards, ring blocks, zigzag, head parts), so that the saved forward
 * state (`out`, the final LSE) is used where the forward left it.
 *
 * WHAT TRAINS.  Every variant's built-in schedule: none, ring, ring_anything
 * (U == 1), ulysses, ulysses_anything (R == 1), unified (R x U); P2P or
 * all-gather rotation (schedule.rotate); self- and cross-attention; causal
 * zigzag, GQA/MQA, key padding, uneven splits (messages sized by content
 * tag), fp32/bf16/fp16, replicated segments (`split: replicate`).  Refused
 * with CP018: a plan whose forward comes from a Lua schedule script (scripts
 * return no backward program yet).
 *
 * INPUTS (what the runtime binds, executor.h): q, dout, out (the forward's
 * output) as SHARD with every head; k, v as SHARD (U > 1), BLOCK r == shard
 * r (U == 1) or KV (cross-attention); lse = the forward's final LSE in the
 * layout the forward computed it in: SHARD/ALL heads when U == 1, ring block
 * r x this member's heads (BLOCK/PART) when U > 1.
 * OUTPUTS: dq (SHARD, or BLOCK r when U == 1), dk, dv (the K/V shard, or
 * BLOCK r when U == 1; KV, whole and identical on every rank, for
 * cross-attention), all fp32; the caller converts to the plan dtype.
 *
 * THE PROGRAMS (qa/da/k_cur/v_cur/delta: the attention layout; with U == 1
 * the inputs themselves, with U > 1 the results of seq_to_heads all-to-alls
 * of q, dout, k, v and of delta: the forward's q/k/v_seq are not kept but
 * re-exchanged, delta is computed on the shard and moved, D x fewer bytes
 * than `out`):
 *   delta     in=dout,out out=delta(_shard) (rowsum(dout * out), on the shard)
 *   init_acc  dq ; init_acc dk, dv
 *   R == 1:   attn_bwd in=qa,k_cur,v_cur,da,lse,delta out=dq,dk_cur,dv_cur
 *   P2P ring (R > 1), schedule.overlap true (the default): BACKWARD.md 3.1
 *   lagged, the accumulator's transfer overlaps the step's attn_bwd:
 *     loop count=R
 *       send ring (r+1)%R k_cur,v_cur tag=0 when=s<R-1 ; recv k_nxt,v_nxt block=(r-s-1)%R
 *       recv (r-1)%R dk_cur,dv_cur block=(r-s)%R tag=1 when=s>0   (the travelling accumulator)
 *       init_acc dk_blk,dv_blk block=(r-s)%R                      (this step's part)
 *       attn_bwd ... out=dq,dk_blk,dv_blk
 *       wait 1 when=s>0 ; add dk_cur -> dk_blk, dv_cur -> dv_blk when=s>0
 *       swap dk_blk,dk_out ; swap dv_blk,dv_out ; send (r+1)%R dk_out,dv_out tag=1
 *       wait 0 when=s<R-1 ; swap k, v (s<R-1)
 *     end
 *     recv (r-1)%R dk_cur,dv_cur block=r tag=1 ; wait 1   (home: block r, all R contributions)
 *   schedule.overlap false: the non-lagged form (one pair, received into):
 *     loop count=R
 *       send/recv K/V as above ; attn_bwd ... out=dq,dk_cur,dv_cur
 *       send ring (r+1)%R dk_cur,dv_cur tag=1 ; recv dk_nxt,dv_nxt block=(r-s-1)%R tag=1
 *       wait 0 ; wait 1 ; swap k, v (s<R-1), dk, dv
 *     end                                   (dk_cur/dv_cur: block r, all R contributions)
 *   all-gather ring (R > 1, rotate allgather, 3.2):
 *     all_gather k_cur -> k_all, v_cur -> v_all (ring) ; init_acc dk_all, dv_all
 *     loop count=R: attn_bwd ... k_all,v_all ... out=dq,dk_all,dv_all block=(r-s)%R
 *     reduce_scatter dk_all -> dk_cur, dv_all -> dv_cur (ring: block r, summed)
 *   U > 1 (3.4, 3.5): all_to_all heads_to_seq dq -> dq (fp32), dk_cur -> dk,
 *     dv_cur -> dv with reduce=sum when two members hold the same K/V head
 *     (cpc_backward_kv_heads_shared: U > Hkv, or the uneven heads of
 *     ulysses_anything), so that each K/V head's partial gradients are summed
 *     once, in fp32, by the shard owner.
 *   cross-attention (3.7): one local attn_bwd against all of K/V (with
 *     U > 1: on q_seq and the member's K/V head part k_part, then the dK/dV
 *     head part widened to every head by copy); all_reduce (world) dk, dv:
 *     every rank ends with the unsplit K/V's gradient.
 *   replicated segments (3.7b; their rows T, KV layout, whole on every
 *     rank; inputs q/k/v/dout/out_rep and lse_rep, the forward's, KV x this
 *     rank's heads): delta_rep; attn_bwd (sharded q, T keys) on every rank;
 *     attn_bwd (T queries, T keys) `when r==0`; attn_bwd (T queries, the own
 *     block) at the ring's step 0 (`when s==0`, into that step's dK/dV
 *     accumulator; all-gather: block r of k_all; R == 1: the one block);
 *     then dq/dk/dv of T (PART heads widened to every head by copy when
 *     U > 1) all_reduce (world) into the OUTPUTs dq_rep, dk_rep, dv_rep (KV,
 *     every head, the same on every rank).  Every (query, key) pair once.
 * Bytes sent per rank (e = dtype size): P2P ring K/V x 2 x T_blk Hkv D e
 * + dK/dV R x 2 x T_blk Hkv D x 4; all-gather ring K/V x 2 x T_blk Hkv D e
 * + dK/dV x 2 x T_blk Hkv D x 4; ulysses: the all-to-alls of q, dout,
 * k, v (plan dtype), delta (fp32, no D) and of dq, dk, dv (fp32); cross: all_reduce 2 x
 * (P-1)/P x Skv Hkv D x 4 per tensor; replicated segments add an all_reduce
 * of 2 x (P-1)/P x T_rep x (H + 2 Hkv) D x 4.
 *
 * Built with the forward's builder (schedule_build.h): the same candidate
 * check, buffer declarations, K/V rotation (send/recv tag 0, swaps) and
 * collectives.
 *
 * Ownership: *out is a new program (cpc_program_free).  Errors: CPC_E_PLAN
 * rule 18 (CP018) for a plan that does not train (message says what does),
 * CPC_E_INTERNAL / NOMEM as cpc_schedule_build (the same candidate check,
 * messages prefixed "backward schedule").  Pure; thread-safe.
 */
#ifndef CPC_SCHEDULE_BWD_H
#define CPC_SCHEDULE_BWD_H

#include "plan.h"
#include "program.h"
#include "status.h"

#define CPC_RULE_TRAIN 18

/* NULL when (variant, R, U) of `plan` has a backward program; else the CP018
 * refusal naming what trains (the same check cpc_schedule_build_backward
 * makes first): today only a plan with schedule.script (or an unresolved
 * variant) is refused. */
cpc_status *cpc_backward_supported(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                                   int ulysses_degree);

/* True when two ulysses members hold the same K/V head (U > Hkv, or the
 * query heads of one K/V head straddle two members: uneven heads of
 * ulysses_anything): their partial dK/dV must be summed (all_to_all
 * reduce=sum).  Pure. */
bool cpc_backward_kv_heads_shared(const cpc_layout *L);

/* Builds the backward program of candidate (variant, ring_degree,
 * ulysses_degree) for `plan` (the programs and errors above); *out is the
 * caller's (cpc_program_free), NULL on error. */
cpc_status *cpc_schedule_build_backward(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                                        int ulysses_degree, cpc_program **out);

#endif
