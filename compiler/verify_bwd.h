/*
 * verify_bwd.h - proves a backward (training) op program (schedule_bwd.h,
 * BACKWARD.md section 2 "verification obligations") by enumeration: every
 * rank's program is unrolled (cpc_program_walk) and all ranks are simulated
 * together on an abstract state in which each DQ/DK/DV accumulator holds
 * the multiset of (query shard, key block) pairs that were added into it;
 * messages carry that state from sender to receiver in FIFO order per
 * (sender, receiver, tag).
 *
 * WHAT IS PROVED, for every rank p (U == 1, the class schedule_bwd builds):
 *   1. Coverage: the OUTPUT DQ buffer holds shard p's rows against every key
 *      block exactly once, and nothing else; the OUTPUT DK and DV buffers hold
 *      ring block p (content tag) with the contributions of every query shard
 *      exactly once, and no other block's (gradients reach their owner).
 *   2. Tags: every attn_bwd reads K and V of the same block as the DK/DV
 *      accumulators it adds to (diffusers #14265: a backward that reuses
 *      step 0's K/V fails here), and Q, dout, lse, delta, DQ of the same rows;
 *      delta is written (op delta) before it is read; accumulators are
 *      initialised before they are added to.
 *   3. Matching: every recv takes the next message of its (peer, tag), with
 *      the buffer roles it declares and the content its `block` says; every
 *      message sent is received; no rank waits forever on a recv (a cycle of
 *      recvs with no send posted is reported).
 * NOT proved (left to the forward verifier's rules, which this program
 * shape obeys by construction): the non-blocking hazards between a
 * send/recv and its wait.
 *
 * Refused with CP051 (never silently accepted): ops outside {delta,
 * init_acc, attn_bwd, send, recv, wait, swap, loop}, ulysses_degree > 1,
 * world sizes over 256 (the enumeration is O(P^2 R^2)).
 * Errors: CPC_E_PLAN rule CPC_RULE_VERIFY (51) naming the rank and the op;
 * CPC_E_NOMEM.  Thread-safe (no shared state).
 */
#ifndef CPC_VERIFY_BWD_H
#define CPC_VERIFY_BWD_H

#include "program.h"
#include "status.h"

cpc_status *cpc_verify_backward(const cpc_program *prog);

#endif
