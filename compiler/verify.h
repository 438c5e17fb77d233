/*
 * verify.h - the verify stage: proves an op program (program.h) correct for
 * every rank before an artifact is written (SPEC section 2, CP051; section 6:
 * whatever a Lua script returns is verified the same way).
 *
 * WHAT IS PROVED, for every simulated rank (see COVERAGE OF RANKS below):
 *   1. Coverage: every query row of the rank meets every key/value token
 *      exactly once, for every query head (each key run with its head set):
 *      the attention blocks merged into an accumulator cover all S keys (Skv
 *      with cross-attention), none twice.  With a causal mask only the keys
 *      at or before a row's position must be covered; blocks entirely above
 *      the diagonal may be skipped or attended (once).  GQA: the K/V heads an
 *      attn reads must include every K/V head its query heads use.
 *   2. Matching: every send meets a recv on its peer with the same
 *      (group, tag), in FIFO order per (sender, receiver, group, tag) as MPI
 *      and NCCL match them, with equal byte counts and the content the recv
 *      declares (its `block`); the received buffer's role, token layout and
 *      heads accept what arrives.  Collectives: the members of each group
 *      reach the same collective (kind, direction, data role, element size)
 *      in the same order, and each member's input is what the collective
 *      needs (all_to_all seq_to_heads: its own shard with all heads;
 *      heads_to_seq: ring block r with its own head part; all_gather: ring
 *      block r of member r).
 *   3. Data flow: no buffer is read before it is written (INPUT buffers are
 *      written at the start); a recv's buffers are neither read nor written
 *      before the wait that completes it; a send's buffers are not written
 *      before its wait; every request is completed by a wait; a merge reads
 *      an attention output (with its LSE, from the same attn) that no merge
 *      has consumed yet, into an accumulator that was initialised (init_acc,
 *      or an attn/merge earlier); an attention output is not overwritten
 *      before it is used; buffers only ever hold what their role, token
 *      layout and head layout allow; every OUTPUT buffer ends holding the
 *      rank's own shard with all heads, from an accumulation that passed 1.
 *   4. Shape (static, before the simulation, reported without a rank):
 *      operand counts of every kind (program.h "PRECISE SEMANTICS"),
 *      buffer indices in range, a group on every communication op
 *      (all_to_all: ulysses, all_gather: ring), a peer on send/recv and a
 *      block on recv, tags >= 0, swap of two buffers with the same role,
 *      tokens and heads, a count on loops, loops nested at most 8 deep,
 *      INPUT buffers q/k/v shards (block layout only with U == 1, kv layout
 *      for cross-attention k/v), OUTPUT buffers o/lse shards with all heads,
 *      at least one OUTPUT buffer.  At run time: loop counts in
 *      0..CPC_LOOP_MAX, peers inside their group, blocks in 0..R-1,
 *      expressions that evaluate (the limits of cpc_program_walk).
 *   5. Progress: with blocking semantics (a wait blocks until the matching
 *      send/recv of each of its requests is posted on the peer: rendezvous,
 *      the conservative case; a collective blocks until every member arrives)
 *      every rank runs to its end.  Otherwise the cycle of waits (or the rank
 *      waited for that already finished) is reported.
 *
 * METHOD.  An abstract interpretation of the SPMD program on every rank: the
 * ranks run as coroutines with blocking semantics (a rank runs until it
 * blocks, then the next ready one runs).  `when`, `count`, `peer` and
 * `block` expressions are evaluated with cpc_expr_eval on the rank's
 * coordinates (s = the innermost loop's step).  A buffer's abstract content
 * is: written or not, the data it holds (q, k, v, attention output, LSE),
 * its tokens as a range of shard units (flat rank p's shard is unit p, ring
 * block i is units [i*U, i*U+U), ALL is [0, P), cross-attention K/V is a unit
 * of its own), its heads [off, off+n), and for attention results the set of
 * key units merged so far (disjoint intervals).  Messages carry a snapshot
 * of the sender's content.  Coverage is checked when an accumulation leaves
 * the accumulator (copied into an O buffer, sent, all-to-all'ed or
 * all-gathered) and at the end for OUTPUT buffers.  The end-of-program
 * checks (requests completed, OUTPUT buffers) run once no rank can
 * progress, in rank order, after the deadlock check.
 *
 * COVERAGE OF RANKS.  Full proof: every rank is simulated when P <= 65536
 * and (estimated op instances per rank) * P <= full_limit (default 16e6,
 * about 3 s; the estimate unrolls loops at ranks 0 and P-1, ignoring
 * `when`).  Measured (release build, this machine): ring 1024x1, 8.4e6
 * instances, 1.4 s; unified 64x16, 0.5e6 instances, 0.09 s.  Otherwise the
 * reduced proof simulates ring group u = 0 and ulysses group r = 0 (R + U - 1
 * ranks) and extends the result by the mesh's symmetry: communication with a
 * rank outside that set is assumed to match (a recv gets the content it
 * declares), and a collective of a group only partly simulated completes
 * when its simulated members arrive.  This is exact for the programs the
 * scheduler emits (their expressions are the same function of (r, u) on
 * every group) but not for arbitrary scripts that single out ranks outside
 * the set.  When even the reduced set is too large (estimated instances *
 * (R + U - 1) > reduced_limit, default 16e6, or more than 65536 ranks:
 * a pure ring beyond about 1400 ranks),
 * nothing is proved and a WARNING (rule 51) says so.
 *
 * DIAGNOSTICS.  Class CPC_E_PLAN, rule 51 (CP051), severity ERROR, span =
 * the op's span when it has one.  The message names the rank and its
 * coordinates, the op's index path and kind ("ops[3].body[1] merge";
 * indices are 1-based, as Lua scripts index plan.ops and as CP050 names
 * them: ops[1] is the first op), the
 * loop step, and what is wrong; notes name the other op/rank involved (the
 * peer's send, the collective another member reached, the ranks of a wait
 * cycle).  Verification stops at the first failure (later ones are often
 * its consequences), so the chain holds one error.
 *
 * Thread-safety: pure function of an immutable program; no global state.
 * Memory: O(simulated ranks * buffers) plus the pending messages.
 */
#ifndef CPC_VERIFY_H
#define CPC_VERIFY_H

#include <stdint.h>

#include "program.h"
#include "status.h"

/* SPEC section 2: schedule verification failed. */
#define CPC_RULE_VERIFY 51

/* Default of cpc_verify_opts.full_limit (used for a zero field): op
 * instances (every rank, loops unrolled, guards evaluated) an enumeration may
 * visit; about 3 s. */
#define CPC_VERIFY_DEFAULT_FULL_LIMIT ((int64_t)16000000)
/* Largest world an enumeration simulates (larger ones are proved
 * symbolically or refused). */
#define CPC_VERIFY_MAX_RANKS 65536
/* Largest request tag (MPI guarantees MPI_TAG_UB >= 32767; the MPI transport
 * passes tags through). */
#define CPC_VERIFY_TAG_MAX 32767

typedef enum cpc_verify_method {
    CPC_VERIFY_AUTO = 0,          /* symbolic proof, else enumeration, else refusal (CP051) */
    CPC_VERIFY_SYMBOLIC_ONLY,     /* symbolic proof or CP051 (tests, benchmarks) */
    CPC_VERIFY_ENUMERATE,         /* enumeration only (tests: the reference the symbolic proof
                                     is checked against) */
} cpc_verify_method;

typedef struct cpc_verify_opts {
    int64_t full_limit;           /* op instances an enumeration may visit; 0 = default;
                                     < 0: never enumerate */
    cpc_verify_method method;
} cpc_verify_opts;

typedef enum cpc_verify_mode {
    CPC_VERIFY_FULL = 0,    /* every rank simulated (enumeration) */
    CPC_VERIFY_SYMBOLIC,    /* proved for every rank by the symbolic proof */
    CPC_VERIFY_REFUSED,     /* neither applies: a CP051 error says why, naming the op */
} cpc_verify_mode;

typedef struct cpc_verify_stats {
    cpc_verify_mode mode;
    int ranks;              /* ranks the proof covers (all P when it succeeds) */
    int64_t op_instances;   /* ops executed: over all simulated ranks (FULL), or by the
                               generic rank, one symbolic loop step counting once (SYMBOLIC) */
    int64_t messages;       /* send/recv pairs matched (FULL) */
    int64_t collectives;    /* collective instances completed (FULL) */
    int64_t estimate;       /* op instances an enumeration would visit (capped just past the
                               limit); -1 when not computed */
} cpc_verify_stats;

/* Verifies `prog` with the default options.  Returns NULL when the program
 * is proved correct for its whole world, otherwise a CP051 ERROR (caller
 * frees with cpc_status_free): a fault, or a program that can be neither
 * proved symbolically nor enumerated (never a warning).  CPC_E_NOMEM when memory runs out, CPC_E_INTERNAL
 * for a malformed program (buffer index out of range, NULL program).
 * `prog` is only read. */
cpc_status *cpc_verify(const cpc_program *prog);

/* As cpc_verify, with options (NULL = defaults) and statistics (may be
 * NULL; filled also when verification fails). */
cpc_status *cpc_verify_ex(const cpc_program *prog, const cpc_verify_opts *opts,
                          cpc_verify_stats *stats);

#endif
