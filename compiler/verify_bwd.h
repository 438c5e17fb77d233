/*
 * verify_bwd.h - proves a backward (training) op program (schedule_bwd.h,
 * BACKWARD.md section 2 "verification obligations") by enumeration: every
 * rank's program is unrolled (cpc_program_walk) and all ranks are simulated
 * together on an abstract state in which each DQ/DK/DV accumulator holds
 * the multiset of (query block, key unit, query head) triples added into it
 * (query block: the ring block of the query rows, = shard p when U == 1; key
 * unit: the ring block of the K/V rows, or all of K/V for cross-attention;
 * query head: every head separately when U > 1, all heads as one unit when
 * U == 1; a K/V head's dK/dV collects the query heads of its group).
 * Messages carry that state from sender to receiver in FIFO order per
 * (sender, receiver, tag); collectives (all_to_all over a ulysses group,
 * all_gather and reduce_scatter over a ring group, all_reduce over the
 * world) fire when every member of the group has reached the same op.
 *
 * WHAT IS PROVED, for every rank p = r*U + u:
 *   1. Coverage: the OUTPUT DQ buffer holds shard p's rows (SHARD p, or
 *      BLOCK p when U == 1) with every head, and has every (block r, key
 *      unit, head) triple exactly once and nothing else; the OUTPUT DK and
 *      DV hold this rank's K/V shard with every K/V head and every (query
 *      block, key block r, head) triple exactly once (gradients reach their
 *      owner); cross-attention: DK/DV whole (KV), every (query block, head)
 *      exactly once on every rank.  Exactly one OUTPUT of each of dq, dk, dv
 *      (yunchang #149).
 *   2. Tags and layouts: every attn_bwd reads K and V of the same block as
 *      the DK/DV accumulators it adds to (diffusers #14265: a backward that
 *      reuses step 0's K/V fails here; on gathered K/V the op's `block` is
 *      the slice of both), Q, dout, lse, delta and DQ share one layout and
 *      rows, K/V/DK/DV one layout with heads matching the query side's,
 *      and the member's query heads use only K/V heads it holds; delta is
 *      written (op delta, from dout and out of the same rows and heads)
 *      before it is read; accumulators are initialised before they are added
 *      to; INPUT buffers have layouts the runtime fills (the saved LSE in the
 *      forward's attention layout).
 *   3. All-to-alls: seq_to_heads takes every member's own shard, heads_to_seq
 *      every member's ring block r; a gradient's heads_to_seq where two
 *      members hold the same head without reduce=sum is refused (one part
 *      would be lost); reduce sums, in member order, the parts of each head.
 *   4. Matching: every recv takes the next message of its (peer, tag), with
 *      the buffer roles it declares and the content its `block` says; every
 *      message sent is received; no rank waits forever on a recv or on a
 *      collective some member never reaches (reported, naming the op).
 * NOT proved (left to the forward verifier's rules, which these program
 * shapes obey by construction): the non-blocking hazards between a
 * send/recv and its wait.
 *
 * Refused with CP051 (never silently accepted): ops outside {delta,
 * init_acc, attn_bwd, add, send, recv, wait, swap, loop, all_to_all,
 * all_gather, reduce_scatter, all_reduce, copy}, world sizes over 256, an abstract state
 * over 2^28 cells (ranks x gradient buffers x R x key units x heads).
 * Errors: CPC_E_PLAN rule CPC_RULE_VERIFY (51) naming the rank and the op;
 * CPC_E_NOMEM.  Thread-safe (no shared state).
 */
#ifndef CPC_VERIFY_BWD_H
#define CPC_VERIFY_BWD_H

#include "program.h"
#include "status.h"

cpc_status *cpc_verify_backward(const cpc_program *prog);

#endif
