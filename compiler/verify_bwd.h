/*
 * verify_bwd.h - proves a backward (training) op program (schedule_bwd.h,
 * BACKWARD.md section 2 "verification obligations").
 *
 * THE FORWARD PROVERS' STEP, A THIRD DOMAIN.  Every op of a rank runs
 * through the shared step (verify_common.h vc_step) on this prover's
 * domain (a vc_domain over its slots): the op table's lifetime and content
 * rules for every operand; init_acc of a forward pair, attn, merge, copy,
 * swap and send/recv's checks before posting as the forward ops' code; the
 * message layer (vc_post, the step's wait, vc_match through vc_arrive:
 * declared block, layout and role, element size, buffer by buffer;
 * vc_finish: every request completed, then the OUTPUT buffers by
 * vc_output); a collective's read rule and its inputs (vc_coll_inputs).
 * Faults read as the forward ones (vc_fault, vc_op_desc): "schedule
 * verification failed (backward program): rank p (r R, u U), ops[3].body[1]
 * send (step 2): ...".  The backward ops' gradient geometry (delta,
 * init_acc of gradients, add, attn_bwd) is this domain's grad_op callback,
 * and an OUTPUT gradient's coverage its `covered`: only this domain has
 * gradient values.  Matching order, the collectives' rendezvous and what
 * their outputs hold (gradient sets) are the domain's, as in the forward
 * domains.
 * advance() (verify_bwd.c) runs one rank's ops
 * through that step until it blocks, on an abstract state: per buffer its content tag, whether it
 * is written, its provenance (program.h cpc_content) and, for DQ/DK/DV, the
 * multiset of (query block, key unit, query head) triples added into it
 * (query block: the ring block of the query rows, = shard p when U == 1;
 * key unit: the ring block of the K/V rows, or all of K/V for
 * cross-attention; query head: every head separately when U > 1, all heads
 * as one unit when U == 1; a K/V head's dK/dV collects the query heads of
 * its group), kept as runs of blocks (a ring's accumulator grows by one
 * block a step: a few runs whatever R).  The operand rules come from the op
 * table (program.h): access (read / write / accumulate / rebind), required
 * content, lifetime (non-blocking until the wait), matching rule.
 * Point-to-point requests are non-blocking, one per send or recv op
 * (verify_common.h vc_rq), matched op to op in FIFO order per (sender,
 * receiver, GROUP, tag); the recv must name as many buffers as the send
 * (else a fault), so the pairs are those of the executor's per-buffer
 * requests, which MPI and the local transport match in the same FIFO
 * order; a send carries a snapshot of each buffer's state, which the
 * recv's buffers take at the `wait` that completes it; a wait blocks until
 * each of its requests is matched (rendezvous: a send completes only once
 * its recv is posted).  Collectives (all_to_all over a ulysses group, all_gather and
 * reduce_scatter over a ring group, all_reduce over the world, barrier over
 * the group it names: no data) fire when every member of the group has
 * reached the same op.  The ranks run
 * round-robin; a round in which none moves is a deadlock.  The same
 * advance() runs in two domains:
 *
 *   SYMMETRIC (any world size; tried first).  The class: no `when` or loop
 *   `count` reads r or p (u may be read) except a `when` that is exactly
 *   `r==0` on a local op (no send, recv, wait, collective, loop or swap: see
 *   RING RANK 0 below); every ring-group (with U == 1 also
 *   world-group) peer and every `block` is `(r + g) % R` or `r + g` (g = 0),
 *   r appearing once through + and - and g not reading r or p; ulysses-group
 *   peers do not read r or p.  Then the program commutes with the rotations
 *   of the ring (rank (r, u) -> (r + e, u)): every rank runs the same ops,
 *   and rank (r, u)'s state is rank (0, u)'s with every ring index + r.  Only
 *   the U ranks (0, u) are simulated.  A ring message rank (0, u) receives
 *   from rank (e, u) is rank (e, u)'s k-th send to it, i.e. the rotation by
 *   e of rank (0, u)'s own k-th send at offset -e: matching pairs the
 *   member's own sends at offset d with its own recvs from offset -d, in
 *   posting order (the same FIFO rule), and the content arrives rotated by
 *   e.  Progress: every rank passes the program's positions in the same
 *   order, so a wait whose partner post comes later on every rank blocks
 *   every rank (a deadlock, reported), and one whose partners are posted
 *   earlier completes (induction on positions, docs/VERIFY.md).  Ulysses
 *   collectives run among the simulated members; ring collectives by the
 *   rotation rule (all_gather: member r's block r; reduce_scatter: element
 *   (q, k) of a member's set goes to the owner of block k, seen from it as
 *   (q - k, 0)); all_reduce sums every rotation.  Evaluation: each peer and
 *   block is also evaluated on rank R-1 (value + R - 1 mod R required; the
 *   chain r + g is monotone in r, so no rank between fails).  Cost: U x
 *   (op instances of one rank, a loop's phases jumped by LOOPS BY
 *   INDUCTION below), independent of R: ring, ring_anything and their
 *   allgather forms at 65536 ranks in 0.003 to 0.02 ms; unified and
 *   ulysses the same with ROTATIONS OF U below (one member simulated) or
 *   CLASSES OF U (one per class: uneven heads, GQA), else linear in U
 *   (bench_verify --backward; docs/VERIFY.md has the table).
 *
 *   LOOPS BY INDUCTION (the symmetric domain, tried first; verify_bwd.c
 *   loop_inductive, iw_loop, ind_marker).  A top-level loop whose body has
 *   no loop, collective, barrier or recomputed attention, whose `when`s read
 *   neither the rank nor u and compare sides linear in s (and/or/not of
 *   such), whose peers do not read s and whose blocks are free of s or
 *   (r + g) % R with g linear in s, whose count does not read u (the twin
 *   below takes part: it is one more simulated rank).  Its steps are cut into phases where
 *   every `when` is constant (a comparison changes only where its sides
 *   meet, at t: cuts at t and t + 1; checked by evaluation at both ends of
 *   each phase; where the cuts fail the loop is unrolled).  The rank's walk
 *   is program.h cpc_program_walk_loops, whose loop callback (iw_loop) walks
 *   the steps it chooses.  A phase [a, b) of 6 steps or more: steps a, a+1 and a+2
 *   run as always; the states before a+2 and before a+3 give the guess:
 *   each ring index of the state (content tags of ring blocks, run starts,
 *   the blocks posted recvs declare; mod R) and each run length moves per
 *   step by what it moved on a+2, Z(s) = X(a+3) + (s - a - 3) D; everything
 *   else (flags, provenance, layouts, run counts, steps and heads, requests
 *   and their queues, the buffer-to-memory map up to renaming) must be
 *   equal, else not decided.  Then step s0 = a+3 runs once with every value
 *   carrying its slope in s (a block's: evaluated at s0 + 1; the tag rule
 *   picks an input or a coordinate, so tags stay affine): each check that
 *   two ring indices are equal must hold for the values AND the slopes (two
 *   affine functions mod R equal at two consecutive steps are equal on
 *   every step; slopes differing: not decided), and a contribution run is
 *   joined to another only where the joined run is one run on every step
 *   from s0 on (ends and slopes identities, lengths not decreasing; not
 *   joining is always exact).  Peers, message tags, groups and `when`s are
 *   the same on every step of the phase, so which requests match and which
 *   waits block are too.  So for every s of the phase the step takes Z(s)
 *   to a state affine in s; its result at s0, values and slopes, must be
 *   Z(s0 + 1) with the slopes D: then it is Z(s + 1) for every s (equal
 *   values and slopes), by induction the state before step s is Z(s) for s
 *   in [a+3, b], and the proof goes on from Z(b).  Requests in flight
 *   across the step boundary are part of the state and move with it (a
 *   lagged ring's dK/dV send, posted at the end of a step and completed in
 *   the next).  Memory slots are compared through the buffers naming them
 *   (a swap renames slots; states equal up to a renaming behave the same).
 *   Every simulated rank stops at these step boundaries together (the same
 *   marker of the same loop and step); one waiting there for a rank that
 *   waits on it is not decided.  A fault met on a concrete step or on step
 *   s0 is a fault of that real step (the values are the real ones).
 *   Whatever is not decided is proven again with every loop unrolled (the
 *   symmetric domain as before), so the induction never accepts what
 *   unrolling refuses (tests/test_verify_bwd.c induction_agrees_on_mutants:
 *   induction, unrolled and enumeration agree on every mutant;
 *   induction_refuses_planted_faults: a step skipped, a loop count off by
 *   one, a recv one block off from step 1 on, an in-flight accumulator
 *   overwritten or a block met twice on the last step only).  The OUTPUT
 *   exactly-once rule is checked by runs (arcs of blocks x head intervals
 *   tiling the (block, head) grid), element by element only to name the
 *   first pair that fails.  Cost per phase: 4 steps of the body per
 *   simulated rank, whatever its length.
 *
 *   ROTATIONS OF U (one ulysses member for all; verify_bwd.c usym_class).
 *   When U > 1, H and Hkv are divisible by U, no `when`, count, peer or
 *   block reads u, no point-to-point message runs in the ulysses or world
 *   group, and there is no cross-attention: member u holds heads
 *   [u*w, (u+1)*w) of every head-part buffer (w = H / U; its K/V heads are those heads' GQA groups, no K/V head is
 *   shared), every member runs the same ops, and each op's effect on member
 *   u is its effect on member 0 with every head moved by u*w (mod H) and
 *   every shard index by u: attn_bwd, copies and the GQA rule take heads
 *   from the buffer's part, ring messages stay within a ring group (member
 *   u's ring is member 0's, rotated in u), a seq_to_heads gives member u
 *   every member's shard of its own heads, a heads_to_seq every member's
 *   part of the gradient (member 0's runs moved by j*w for every member j:
 *   a run over member 0's whole part becomes one run over every head), and
 *   the parts are disjoint (no reduce needed); a world all_reduce sums
 *   member 0's set rotated in r (as above) and in u (heads moved by u*w).
 *   The final checks (own
 *   shard, every head exactly once) are invariant under the rotation.  So
 *   member u's state is member 0's rotated, and only member 0 (with the
 *   ring rotation: rank (0, 0)) is simulated.  Cost: one simulated rank
 *   (pure ulysses at 65536 ranks and heads: 0.002 ms; unified with U = 256:
 *   0.02 ms).  Programs with uneven head parts: CLASSES OF U below.
 *
 *   CLASSES OF U (one member per class; verify_bwd.c uclass_build,
 *   a2a_union_classes, uc_shared_heads, uc_whole).  When the ops commute
 *   with moving u as above (no `when`, count, peer or block reads u, no
 *   point-to-point message in the ulysses or world group, no cross-attention;
 *   the twin below takes part) but H or Hkv does not divide by U (ulysses_anything H = 24
 *   over U = 16; GQA groups straddling members; K/V heads replicated over
 *   the members of a group; one K/V head for all).  Heads are split as
 *   tensor_split does: members [0, m) hold n0 = H/U + 1 query heads, the
 *   others n1 = H/U (m = H % U), so member u's first head a_u is linear in
 *   u inside each of these two REGIONS; its K/V heads are the GQA groups
 *   its query heads use, [floor(a_u/g), ceil((a_u + n)/g)) with g = H/Hkv.
 *   Within a region, two members u and v with a_u = a_v (mod g) (always,
 *   with Hkv = 1) are related by the rotation of the heads by d = a_v - a_u
 *   (mod H): d is a multiple of g, so it maps GQA groups onto groups; it
 *   maps u's query part onto v's and u's K/V part onto v's (the formula
 *   above moves by d/g groups; with Hkv = 1 both hold every head), and every
 *   buffer with all heads onto itself.  So a region of n heads per member
 *   splits into T = g / gcd(n, g) residues (T = 1 with one K/V head): the
 *   members u0 + c + kT, a progression moved by T n heads a step.  Members
 *   whose part lies inside one GQA group (n < g, a_u mod g + n <= g: K/V
 *   replicated over a group's members, e.g. one query head a member) are
 *   related whatever their residue: the permutation of the heads that moves
 *   every group by a_v/g - a_u/g groups and rotates each within by
 *   (a_v - a_u) mod g keeps the GQA groups, takes u's query part to v's
 *   (inside the group the rotation is a shift: no wrap) and u's group (its
 *   K/V part) to v's, and fixes the all-heads buffers; they form one class
 *   per region, the others one class per residue (uclass_build).  It
 *   checks the layout against this (a class's first two members and its
 *   last, every head-part buffer: uc_interval) and takes at most 64
 *   classes (else every member is simulated).  Only the first member of
 *   each class is simulated (its rank (0, u), with the ring rotation).
 *   Member v of a class stands as its representative moved to v (the
 *   rotation or the permutation above, both keeping the GQA groups) and its
 *   shard index moved by v - rep: every op but a collective over ulysses
 *   members acts
 *   on one member's state through its buffers' head ranges, shard and ring
 *   indices only (the rules above), and each commutes with a permutation
 *   of the heads that keeps the GQA groups and takes the representative's
 *   ranges to v's (ring messages stay in the member's ring).  A seq_to_heads gives each
 *   member content that is its own (checked on each representative). A
 *   heads_to_seq of a gradient gives every member the same set G: the union
 *   of every member's part, each kept to the heads it holds; it is computed
 *   by class, in head order (uc_union; member v's part is its
 *   representative's moved to v by uc_move): a region of one class whose
 *   kept run is one member's width n (inside a group: the
 *   representative's part) is one run over the region, a region of several
 *   classes placed one period (T members) at a time when that period is
 *   runs over its whole span (member u0 + kT + c is member u0 + c moved by
 *   k T n, a multiple of g), else member by member; the world all_reduce
 *   sums every member's set the same way.
 *   The members then hold the same G, which is G moved to v only if G is
 *   unchanged by those moves: every run of G must hold every head
 *   (uc_whole), else the classes do not stand for their members and every
 *   member is simulated instead (slower, never weaker).  A head held by
 *   two members without reduce=sum: member v's K/V range and member v+1's
 *   overlap exactly when a_v + n is not a multiple of g, the same for every
 *   member of v's residue; checked on the first T members of each region
 *   (layout only), and the pair is named by sweeping every member.  The final
 *   checks (own shard, every head exactly once) are invariant under the
 *   move.  Cost: the classes' count of simulated ranks (2 for
 *   ulysses_anything with H = P + 3: 0.005 ms at any size; GQA groups of 2
 *   over 1.5 P heads: 2; ulysses with K/V replicated over groups of 4 or
 *   of 8192: 1) plus a few runs per region and one period of members
 *   placed (tests/test_verify_bwd.c
 *   ulysses_classes_agree_on_mutants: classes, every member unrolled and
 *   the enumeration agree on every mutant; ulysses_classes_refuse_planted_
 *   faults at 5, 7, 8, 40000, 65535 and 65536 members).
 *
 *   REPLICATED ROWS (`split: replicate`).  Their index R (query block R,
 *   key unit R) names the same rows on every rank, so a rotation fixes it:
 *   rotating a contribution (q, k) by e moves each ring index (< R) to
 *   index + e mod R and leaves R as it is.  Runs keep ring indices mod R and
 *   step 0 through index R, in both domains (the enumeration uses the same
 *   arithmetic, so the two agree on what a run holds).  An all_reduce over
 *   the world sums, for every simulated rank, the rotations of its set over
 *   the ring positions it stands for (all R; with the twin below: position
 *   0 for rank (0, u), the other R - 1 for its twin): element (q, k) gives
 *   the run (q + e, k + e), e over those positions, each fixed index (R, or
 *   the cross-attention's one key unit) staying put; an element whose both
 *   indices are fixed gives that element once per position (kept as at most
 *   2 copies: "exactly once" is decided the same, no op subtracts).  A ring
 *   collective or a reduce_scatter of the replicated keys' gradient is not
 *   in the class (not decided here: enumeration or CP051).
 *
 *   RING RANK 0 (`when r==0`: the replicated (R, R) block, computed once).
 *   With R > 1 and such an op, each member (0, u) has a TWIN, simulated
 *   beside it: the program walked on ring rank 1, every ring peer and block
 *   taken back by one (so the twin runs in rank 0's frame: the class makes
 *   every such value rank 0's + r), the `r==0` ops absent.  Ring rank r != 0
 *   runs exactly the twin's ops rotated by r, ring rank 0 the member's; the
 *   two differ only in the `r==0` ops, which are local and never block, so
 *   every rank posts and waits on the same communication ops in the same
 *   order (the progress argument above holds) and a message's content differs
 *   only through them.  Content made by an `r==0` op, or from such content
 *   (slot r0: taint through every local op's inputs to its outputs), must not
 *   leave the rank except by the world all_reduce: a send, an all_to_all or
 *   a ring collective of it stops the symmetric proof (not decided:
 *   enumeration or CP051).  Without it, the member and its twin send the same
 *   values (they ran the same ops on the same inputs), so each matches its
 *   own sends by rotation as above, whichever of the two the real sender is.
 *   The all_reduce sums ring rank 0's set once and the twin's rotated to the
 *   R - 1 other positions, and its result (the same on every rank) carries no
 *   taint.  The final checks run on both (the twin's OUTPUTs are those of
 *   every ring rank r != 0, seen from rank 0).  Cost: 2U simulated ranks,
 *   2 with ROTATIONS OF U, twice the classes with CLASSES OF U: the `r==0`
 *   ops read neither u nor p, so ring rank 0's member u and its twin are
 *   member 0's (the class representative's) and its twin moved in the
 *   heads; a heads_to_seq unions ring rank 0's members (the twins') from
 *   its representatives (the twins of the representatives), the world
 *   all_reduce moves both (unified with a replicated text at 4 x 16384:
 *   0.05 ms).  Simulated rank k * Us + j: k = 1 the twins, j the member
 *   (every member: Us = U), or 0 (one for all), or the class.
 *   Any other guard reading r or p is outside the class.
 *
 *   ENUMERATION (P <= 256).  Every rank is simulated; the reference the
 *   symmetric domain is checked against (tests/test_verify_bwd.c: random
 *   mutants of every variant are proven by both or refused by both).
 *
 * THE BOUND.  At most 2^23 op instances are simulated (all simulated ranks
 * together), 2^27 units of work done (a contribution run added, or a
 * simulated rank visited by a round of the scheduler; about a second) and 4096
 * requests in flight on one rank (the checks scan them); a
 * program that needs more is refused with CP051 saying so, before the work
 * is done.  A gradient set past 4096 runs of blocks (contributions repeated)
 * stops the simulation at once: "not decided" for the symmetric domain, a
 * CP051 for the enumeration, never a proof (the enumeration took the stop as
 * one: a dV added twice a step was proven at 14-20 ranks; found by
 * tests/test_verify_attack.c's oracle).  Memory: O(simulated ranks x buffers), 32 bytes per instance (256
 * MiB at most) and 28 bytes per contribution run kept.  A program outside
 * the symmetric class with more than 256 ranks is refused with a
 * CP051 naming the op and the reason.  cprun and cpc_artifact_load call
 * cpc_verify_backward: the same bound.
 *
 * WHAT IS PROVED, for every rank p = r*U + u:
 *   1. Coverage: the OUTPUT DQ buffer holds shard p's rows (SHARD p, or
 *      BLOCK p when U == 1) with every head, and has every (block r, key
 *      unit, head) triple exactly once and nothing else; the OUTPUT DK and
 *      DV hold this rank's K/V shard with every K/V head and every (query
 *      block, key block r, head) triple exactly once (gradients reach their
 *      owner); cross-attention: DK/DV whole (KV), every (query block, head)
 *      exactly once on every rank.  Exactly one OUTPUT of each of dq, dk, dv
 *      (yunchang #149).  Replicated segments (`split: replicate`): their
 *      rows are query block R and key unit R (NQ = NK = R + 1); one more
 *      OUTPUT of each role holds them (KV, every head, the same on every
 *      rank): dq_rep every (R, key unit, head) once, dk/dv_rep every (query
 *      block, R, head) once; the sharded outputs also cover unit R / block R
 *      (the replicated keys / queries) exactly once.  Such programs are in
 *      the symmetric class (REPLICATED ROWS, RING RANK 0 above): any world
 *      size.
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
 *   4. Matching: every recv takes the next send of its (group, peer, tag),
 *      with as many buffers, each with the role, layout (tokens, heads) and
 *      element size it declares and the content its `block` says; every
 *      request is matched and completed by a wait; no rank
 *      waits forever on a wait (its partner posted only after that partner
 *      blocks) or on a collective some member never reaches (reported,
 *      naming the op and the unmatched request).
 *   5. Non-blocking lifetimes (the op table's CPC_LIFE_UNTIL_WAIT and
 *      operand access columns): between a send's post and its wait its
 *      buffer is only read (never written, accumulated into or swapped);
 *      a recv's buffer is not touched at all until its wait.
 *   6. Provenance (the op table's in_content column): each operand holds
 *      what the op needs by where it came from, not by role: attn_bwd reads
 *      q, k, v, dout, the forward's saved LSE and the delta that the `delta`
 *      op made (both role lse), in that order; delta reads dout and out;
 *      add, reduce_scatter and all_reduce read gradients.  Content moves
 *      with copies, messages and collectives.
 *
 *   7. Forward ops in a backward program: barrier (a collective without
 *      data); attn, merge and a forward init_acc (acc, lse) recompute
 *      attention (e.g. the LSE instead of reading the saved one): K/V ring
 *      blocks, q a shard (U == 1) or a ring block, no cross-attention.  Its
 *      (query block, key block, head) pairs are kept as runs like
 *      gradients; where delta or attn_bwd reads a recomputed result, every
 *      pair of its rows and heads is there exactly once (with a causal mask
 *      the key blocks entirely above the diagonal may be missing:
 *      vc_units_needed); it stays on its rank until proven so (a send or
 *      collective of it is refused before, as the step refuses an
 *      incomplete forward result; copying it is always refused).
 *
 * Refused with CP051 (never silently accepted): ops outside {delta,
 * init_acc, attn_bwd, add, send, recv, wait, swap, loop, all_to_all,
 * all_gather, reduce_scatter, all_reduce, copy, barrier, attn, merge} (the
 * op table's CPC_OPF_BWD) and recomputation outside the class of 7; a
 * collective without a ring, ulysses or world group; world sizes over 256
 * outside the symmetric class; programs over the bound.
 * Errors: CPC_E_PLAN rule CPC_RULE_VERIFY (51) naming the rank and the op;
 * CPC_E_NOMEM.  Thread-safe (no shared state).
 */
#ifndef CPC_VERIFY_BWD_H
#define CPC_VERIFY_BWD_H

#include "program.h"
#include "status.h"
#include "verify.h"

typedef struct cpc_verify_bwd_stats {
    cpc_verify_mode mode;  /* CPC_VERIFY_SYMBOLIC (the symmetric domain), _FULL (every rank), _REFUSED */
    int ranks;             /* ranks the proof covers (P when it succeeds) */
    int64_t work;          /* units spent (op instances collected + contribution runs added) */
    int64_t jumps;         /* loop phases proven by induction (LOOPS BY INDUCTION), not unrolled */
    bool usym;             /* one ulysses member simulated for all (ROTATIONS OF U), or one per class */
    int classes;           /* members simulated, one per class (CLASSES OF U); 0 when not used */
} cpc_verify_bwd_stats;

/* Proves backward program `prog` (borrowed, only read) as above, with the
 * default options (cpc_verify_backward_ex with NULL opts and stats).
 * Returns NULL when proven, else a new status (the caller's,
 * cpc_status_free): CP051 naming the rank and op, or CPC_E_NOMEM. */
cpc_status *cpc_verify_backward(const cpc_program *prog);
/* As cpc_verify_backward, with options (NULL: defaults; `method` as for
 * cpc_verify_ex: AUTO, SYMBOLIC_ONLY = the symmetric domain or CP051,
 * ENUMERATE = every rank or CP051; full_limit is not used) and statistics
 * (NULL allowed; filled also on failure). */
cpc_status *cpc_verify_backward_ex(const cpc_program *prog, const cpc_verify_opts *opts,
                                   cpc_verify_bwd_stats *stats);
/* As cpc_verify_backward_ex; induction false: every loop unrolled (the
 * symmetric domain as before LOOPS BY INDUCTION; what the tests compare the
 * induction with). */
cpc_status *cpc_verify_backward_ind(const cpc_program *prog, const cpc_verify_opts *opts,
                                    cpc_verify_bwd_stats *stats, bool induction);

#endif
