/*
 * verify.h - the verify stage: proves an op program (program.h) correct for
 * every rank before an artifact is written (SPEC section 2, CP051; section 6:
 * whatever a Lua script returns is verified the same way).
 *
 * THE OUTER AXES (cfg_degree C, tp_degree T; validate.h THE OUTER AXES).  A
 * (C, T, R, U) plan runs C*T copies of one R x U program, copy (c, t) on
 * batch items [c*B/C, (c+1)*B/C) and heads [t*H/T, (t+1)*H/T) (with their
 * K/V heads).  The copies share no buffer, no input row or head, and no
 * message or collective (each has its own ring, ulysses and world groups),
 * and attention of one (batch item, head) reads only that item's and head's
 * data, so the whole plan is correct iff the R x U program is correct for
 * the sub-plan: the program verified here is that one (layout: batch B/C,
 * heads H/T, P = R*U), and that proof covers every (c, t).
 *
 * WHAT IS PROVED, for every rank of the world (see HOW below):
 *   1. Coverage: every query row of the rank meets every key/value token
 *      exactly once, for every query head (each key run with its head set):
 *      the attention blocks merged into an accumulator cover all S keys (Skv
 *      with cross-attention), none twice.  With a causal mask only the keys
 *      at or before a row's position must be covered; blocks entirely above
 *      the diagonal may be skipped or attended (once).  GQA: the K/V heads an
 *      attn reads must include every K/V head its query heads use.
 *   2. Matching: every send meets a recv on its peer with the same
 *      (group, tag), in FIFO order per (sender, receiver, group, tag) as MPI
 *      and NCCL match them, buffer by buffer with equal element sizes and
 *      the content the recv declares (its `block`); the received buffer's
 *      role, token layout and
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
 * HOW.  Three steps, in order; the first that decides gives the answer.
 * Nothing is ever skipped: a program none of them proves is a CP051 ERROR
 * (never a warning), whoever built it (compiler, Lua script, hand-edited
 * .cplan; cprun verifies what it loads again), whatever the world size.
 *
 *   1. SYMBOLIC PROOF (verify_sym.h): proves the program for every rank at
 *      once, at a cost independent of the world size (about 10 us for every
 *      variant the compiler emits, 4 to 65536 ranks: bench/bench_verify.c).
 *   2. ENUMERATION: the abstract interpretation below on every rank, when
 *      the program is outside the symbolic class (a script singled out some
 *      ranks) and the op instances it would visit fit full_limit (default
 *      16e6, about 3 s).  The estimate counts what EXECUTES: every rank's
 *      loops unrolled with their `when` and `count` evaluated, so a loop
 *      behind a false guard costs one visit whatever its count.
 *   3. REFUSAL: neither applies: CP051 naming the op (path and span, the
 *      script line for an op a script changed) that put the program outside
 *      the symbolic class, and why.
 *   A fault the symbolic proof finds is reported as is when enumeration is
 *   too large; otherwise the enumeration runs and gives its diagnostics
 *   (rank, step, wait cycles), which are the finer ones.
 *   Steps 1 and 2 run ONE STEP (verify_common.h "THE STEP": each forward
 *   op's meaning written once) over two domains: the symbolic rank and one
 *   concrete rank of the enumeration.  The domains differ only in how
 *   values are represented and answered (three-valued for the symbolic
 *   one), how requests find their peers, and how loops are covered.
 *
 * ENUMERATION (METHOD).  An abstract interpretation of the SPMD program on
 * every rank: the ranks run as coroutines with blocking semantics (a rank
 * runs until it blocks, then the next ready one runs).  `when`, `count`,
 * `peer` and `block` expressions are evaluated with cpc_expr_eval on the
 * rank's coordinates (s = the innermost loop's step).  A buffer's abstract
 * content is: written or not, the data it holds (q, k, v, attention output,
 * LSE), its tokens as a range of shard units (flat rank p's shard is unit p,
 * ring block i is units [i*U, i*U+U), ALL is [0, P), cross-attention K/V is
 * a unit of its own), its heads [off, off+n), and for attention results the
 * set of key units merged so far (disjoint intervals).  Messages carry a
 * snapshot of the sender's content.  Coverage is checked when an
 * accumulation leaves the accumulator (copied into an O buffer, sent,
 * all-to-all'ed or all-gathered) and at the end for OUTPUT buffers.  The
 * end-of-program checks (requests completed, OUTPUT buffers) run once no
 * rank can progress, in rank order, after the deadlock check.  Exact for
 * every program; cost grows with P times the steps (ring 1024: 1.6 s).
 *
 * SYMBOLIC PROOF (the argument for soundness; docs/VERIFY.md has it at
 * length).  The class: (a) `when` and loop `count` never read r, u or p, so
 * every rank runs the same op sequence (guards are constants at top level;
 * inside a loop, sets of steps computed from the structure of the
 * expression: comparisons of affine forms of s, &&, ||, !; or evaluated
 * step by step for loops of at most 64 steps); (b) send/recv are in the ring
 * group with peer (r + d) mod R, d a constant: a rotation of the ring; (c)
 * ring block indices are (a*r + b*s + c) mod R with a in {0, 1}; (d) loops
 * are top-level (a nested loop may exist but must not run).  Then:
 *   - One GENERIC rank is interpreted by the same step as the enumeration
 *     (the same checks, written once), its values being functions of the
 *     symbols r, u (and s):
 *     tokens (own shard, ring block (a*r+b*s+c) mod R, all, K/V, another
 *     rank's shard), heads (all, or the member's part: whether the part is
 *     all heads is decided once over the members), the merged key blocks as
 *     pieces {a*r + b*t + c : lo <= t < hi}.  Every check is decided for all
 *     r in [0, R), u in [0, U) and all steps the run stands for (linear
 *     congruences mod R); a check that holds for some values only is
 *     UNDECIDED, never accepted.  A check that fails everywhere is a fault
 *     of every rank (all ranks run the same ops).
 *   - Messages: by (a) and (b), rank r's k-th send on (group, tag, offset d)
 *     goes to rank r+d, whose k-th receive on (group, tag, offset -d) is, by
 *     MPI's and the local transport's non-overtaking order per (peer, tag,
 *     communicator), the one that matches it; both are the generic rank's
 *     own k-th such posts, seen from two ranks, so matching is done on the
 *     generic rank's posts and what arrives is the sender's snapshot with r
 *     replaced by r - d.
 *   - Progress: every rank passes the program's positions (op, step) in the
 *     same order.  By induction on positions, no rank blocks forever if every
 *     wait's requests are matched by posts at EARLIER positions (the generic
 *     rank already made them) and every collective is reached by all members
 *     at the same position (true by (a)).  A wait whose request has no such
 *     post is a deadlock on every rank: all ranks block at that wait, and the
 *     post is after it.  This covers waits across groups and collectives per
 *     group, with rendezvous (the conservative) semantics.
 *   - Loops: the steps [0, count) are cut into phases where the same ops
 *     run.  States are written relative to s (a block r-s stays r-s from
 *     step to step).  A phase is unrolled step by step until the state at
 *     the start of a step repeats with nothing in flight; one more step is
 *     then interpreted with s a symbol over the rest of the phase [k, hi):
 *     if every check holds for all those s and the state comes back to
 *     itself, all steps k..hi-1 start and end in that state (induction on
 *     s).  Coverage over the phase: the new block f(s) is not among
 *     {f(t) : t0 <= t < s} iff b*(s-t) != 0 mod R for 0 < s-t <= hi-1-t0,
 *     i.e. R/gcd(b, R) > hi-1-t0; a block index r - s over s = 0..R-1 thus
 *     covers every block once, and r - s - 1 declared by a recv matches the
 *     block (r-1) - s its sender holds.
 *   Cross-checked against the enumeration by tests/test_verify_sym.c
 *   (random mutations: never accepted when the enumeration finds a fault;
 *   a fault reported is one the enumeration finds).
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
 * Memory: symbolic O(buffers); enumeration O(P * buffers) plus the pending
 * messages.
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
/* THE PROVER'S BOUND.  Neither proof runs unbounded: work is counted in
 * units (one op interpreted, or one expression node evaluated), and a
 * program whose proof would take more is refused with CP051 saying which
 * op and why, before the work is done.
 *   - Symbolic proof: every loop's steps are cut into phases (at most 2 x 32
 *     interval ends per `when` of its body, or every step of a loop of at
 *     most 64 steps); each phase runs the body at most FIX_TRIES + 2 = 10
 *     times and evaluates every `when` twice, so a loop costs
 *     phases x (10 x body ops + 2 x its `when`s' nodes); the sum over loops
 *     is bounded by CPC_VERIFY_WORK_MAX (2^26 units: about 0.4 s, 64 MiB at
 *     most for the cut list).  Beyond it the program is outside the symbolic
 *     class (then enumerated if that fits, else refused).
 *   - Enumeration: the op instances every rank executes, each weighted
 *     1 + (nodes of its `when`, `peer` and `block`) / 8, are counted before
 *     the simulation (the count stops just past the limit) and must fit
 *     full_limit (default 16e6, about 3 s); the simulation itself stops at 4
 *     x that many instances.  Memory O(P x buffers) plus the messages in
 *     flight, P <= CPC_VERIFY_MAX_RANKS.
 *   - The backward prover (verify_bwd.h) has its own bound, in the same
 *     units.
 * cprun and cpc_artifact_load call cpc_verify with the defaults: the same
 * bound as cpc. */
#define CPC_VERIFY_WORK_MAX ((int64_t)1 << 26)

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
