/*
 * schedule.h - the scheduler: one SPMD op program (program.h) per candidate
 * (variant, ring_degree R, ulysses_degree U) of a validated plan.
 *
 * Input: a plan that passed validation for this candidate (the scheduler
 * does not re-check the CP rules; sizes that do not divide are handled by
 * the uneven layout of layout.h, which is what the anything variants need).
 * Output: a program whose op count does not depend on R, U or world_size.
 *
 * The programs (buffer names as printed by cpc_program_print):
 *
 *  none (world size 1): attn q,k,v -> acc,lse; copy acc -> out.
 *
 *  ulysses / ulysses_anything (R = 1):
 *    all_to_all seq_to_heads q -> q_seq, k -> k_seq, v -> v_seq
 *    attn q_seq,k_seq,v_seq -> acc,lse      (one block: straight into acc)
 *    copy acc -> o_seq (plan dtype, PART heads)
 *    all_to_all heads_to_seq o_seq -> out
 *  GQA: K/V heads follow their query heads (layout.h), replicated when
 *  U > Hkv; uneven heads and tokens (anything) come from the layout.
 *
 *  ring / ring_anything (U = 1) and unified (R, U > 1), rotate p2p:
 *    [unified: all_to_all seq_to_heads q -> q_seq, k -> k_cur, v -> v_cur]
 *    init_acc -> acc,lse
 *    loop count=R
 *      send group=ring peer=(r+1)%R in=k_cur,v_cur tag=0 when=s<R-1
 *      recv group=ring peer=(r-1)%R out=k_nxt,v_nxt block=(r-s-1)%R tag=0 when=s<R-1
 *      [overlap=false: wait tag=0 when=s<R-1 here]
 *      attn q,k_cur,v_cur -> o_blk,lse_blk   (k_cur holds block (r-s)%R)
 *      merge o_blk,lse_blk -> acc,lse
 *      [overlap=true: wait tag=0 when=s<R-1 here]
 *      swap k_cur,k_nxt when=s<R-1 ; swap v_cur,v_nxt when=s<R-1
 *    end
 *    ring: copy acc -> out.  unified: copy acc -> o_seq; all_to_all
 *    heads_to_seq o_seq -> out.
 *  With U = 1 the K/V inputs are BLOCK-layout buffers k_cur/v_cur (block r
 *  == shard r), so no copy is needed.  K/V memory: two blocks (cur, nxt).
 *
 *  rotate allgather (diffusers' way): K/V (after the ulysses all-to-all in
 *  unified: k_blk/v_blk) are all-gathered over the ring group into k_all,
 *  v_all (ALL layout), then loop count=R { attn ... block=(r-s)%R; merge }:
 *  the same block order as p2p, so both give the same numbers.
 *
 *  causal: zigzag shards for ring/unified (layout.h); attn masks by global
 *  positions, so the program is the same.
 *
 *  cross-attention (input.kv): K/V are INPUT buffers k, v of layout KV,
 *  whole on every rank; no K/V traffic.  ring (any R): attn q,k,v -> acc,lse;
 *  copy -> out.  ulysses/unified: q all-to-all; copy k -> k_part, v ->
 *  v_part (KV rows, this member's PART heads); attn; copy; inverse
 *  all-to-all.  The ring group is idle.
 *
 *  replicated segments (`split: replicate`, layout.h): inputs q_rep, k_rep,
 *  v_rep (KV layout: the replicated rows, whole, ALL heads; with ulysses
 *  copied to their PART heads).  Before the key blocks, init_acc of
 *  acc_rep/lse_rep, then both query sides meet the replicated keys once,
 *  locally: attn q,k_rep,v_rep -> o_blk; merge -> acc and attn
 *  q_rep,k_rep,v_rep -> o_rep_blk; merge -> acc_rep.  Then at every key
 *  block the sharded queries run as above and the replicated queries meet
 *  the same block (attn q_rep,k_cur,v_cur -> o_rep_blk; merge -> acc_rep),
 *  so every query meets every key exactly once and the replicated K/V are
 *  never sent.  The single-block programs (ulysses) use init_acc + merge
 *  for both sides.  Output: copy acc_rep -> out_rep (KV, ALL heads,
 *  OUTPUT); with ulysses copy acc_rep -> o_rep_part and all_to_all
 *  heads_to_seq o_rep_part -> out_rep (KV rows: every member's heads go to
 *  every member).
 *
 * Built with schedule_build.h, the builder the backward scheduler
 * (schedule_bwd.h) uses too: one candidate check, one way to declare
 * buffers and append ops, and the K/V rotation both directions post.
 *
 * Thread-safety: pure; the plan is only read.
 */
#ifndef CPC_SCHEDULE_H
#define CPC_SCHEDULE_H

#include "plan.h"
#include "program.h"
#include "status.h"

/* Builds the program of candidate (variant, ring_degree, ulysses_degree)
 * for `plan`.  On success *out is owned by the caller (cpc_program_free).
 * Errors (CPC_E_INTERNAL: the caller passed a candidate validation rejects):
 * variant auto or out of range; ring/ring_anything with ulysses_degree != 1;
 * ulysses/ulysses_anything with ring_degree != 1; none with a degree != 1;
 * a degree < 1; ring_degree * ulysses_degree != cluster.world_size; the
 * errors of cpc_layout_init.  Out of memory: &cpc_status_oom. */
cpc_status *cpc_schedule_build(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                               int ulysses_degree, cpc_program **out);

/* Per-rank memory and traffic of a program (cost model, cprun's report):
 * cpc_program_peak_bytes and cpc_program_bytes_sent are declared in
 * program.h. */

#endif
