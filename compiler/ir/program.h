/*
 * program.h - the op program: one SPMD schedule per candidate.
 *
 * The same program is what the scheduler builds (schedule.h), what a Lua
 * script sees and edits, what the verifier proves (verify.h), what the cost
 * model prices, what --dump-schedule prints, what the artifact stores and
 * what the runtime executes.  Every rank runs the same ops; whatever depends
 * on the rank is an expression of its coordinates (expr.h).  Ring steps are
 * one LOOP op with a body, so the program's size does not grow with
 * world_size.
 *
 * BUFFERS.  A buffer is a named per-rank tensor.  Its shape is
 *   Q/K/V/O/ACC roles: [B, T, h, D] (BSHD), LSE role: [B, h, T]
 * where T and h come from its token layout and head layout (layout.h):
 *   tokens SHARD : the rank's input shard (flat rank p)       T = shard_tokens(p)
 *          BLOCK : one ring block; WHICH block is the buffer's content tag,
 *                  set by the op that wrote it                T = block_tokens(tag)
 *                  (capacity: max_block_tokens)
 *          ALL   : all R ring blocks of the ring group, concatenated in ring
 *                  order (all-gather output)                  T = sum of blocks
 *          KV    : cross-attention K/V, whole                 T = Skv
 *                  or, without cross-attention, the replicated
 *                  segments' rows (`split: replicate`, layout.h),
 *                  whole on every rank: q, k, v, acc, lse, out  T = Srep
 *   heads  ALL   : H (Q/O/ACC/LSE) or Hkv (K/V)
 *          PART  : the rank's ulysses heads (q_heads(u) or kv_heads(u))
 * Element type: Q/K/V/O in the plan's dtype; ACC and LSE fp32 always.
 * An INPUT buffer is filled from the user's q/k/v before the program starts
 * (SHARD layout; with U == 1 a BLOCK-layout input holds block r == shard r);
 * an OUTPUT buffer (role O) is gathered as `out` after it ends.
 * Content tags: a SHARD buffer's content is shard p; a BLOCK buffer's tag is
 * set by all_to_all (to r), recv (to its `block` expression), copy/swap
 * (carried along) and, for INPUT buffers with U == 1, starts as r.
 *
 * OP KINDS, one line each.  Everything a reader needs about a kind as data
 * (arity, group, operand access, the content each operand must hold and
 * the content outputs get, how it matches its partners, how long it holds
 * its buffers, its cost rule) is in THE OP TABLE below (cpc_op_info_of), the
 * one place every reader takes it from; the details follow under SEMANTICS.
 *   loop           runs its body `count` times, s = 0..count-1.
 *   init_acc       zeroes out[]: (ACC, LSE) = (0, -inf), or DQ/DK/DV = 0 (with
 *                  `block`: the accumulators of that ring block).
 *   attn           (out[0] fp32, out[1] LSE) = softmax(q k^T scale [+mask]) v over
 *                  the K/V block(s) read.
 *   merge          (out[0], out[1]) accumulate the block result (in[0], in[1]):
 *                  lse = log(e^a + e^b), out = sum of w_i out_i (fp32).
 *   send           posts a non-blocking send of in[0..n) to member `peer` of
 *                  `group`; the buffers stay in flight until `wait tag`.
 *   recv           posts a non-blocking recv of out[0..n) from `peer`; their
 *                  content becomes ring block `block`; in flight until `wait tag`.
 *   wait           completes this rank's requests with `tag`.
 *   swap           exchanges the memory of in[0] and in[1] (tags move with it).
 *   all_to_all     ulysses group: shard x all heads <-> ring block r x head part
 *                  (`dir`; `reduce`: parts of a shared head summed).
 *   all_gather     ring group: every member's block r into one ALL buffer.
 *   copy           out[i] = in[i] (ACC -> O dtype, or a head part selected/placed).
 *   barrier        waits for every member of `group`.
 *   delta          out[0] = rowsum(dout * out) per (row, head), fp32.
 *   attn_bwd       (dq, dk, dv) += the block backward of (q, k, v, dout, the saved
 *                  LSE, delta), fp32.
 *   reduce_scatter ring group: member r gets the sum of every member's block-r slice.
 *   add            out[0] += in[0] (fp32 gradients of one block).
 *   all_reduce     world group: every rank gets the sum over all ranks (fp32).
 * Bytes each op sends: cpc_program_bytes_sent below.
 *
 * BACKWARD ROLES (training, BACKWARD.md): DO (the output gradient `dout`,
 * plan dtype, query heads, shaped as Q), DQ (fp32, query heads, shaped as
 * ACC), DK and DV (fp32, K/V heads, shaped as K/V).  INPUT buffers of a
 * backward program may also have roles O (the forward's `out`, plan dtype),
 * LSE (the forward's final LSE, [B, h, T] fp32) and DO; OUTPUT buffers of
 * roles DQ, DK, DV are read back as the gradients (fp32; SHARD, or with
 * U == 1 BLOCK whose content must be block r == shard r).  init_acc on DQ/DK/DV
 * buffers zeroes them (n_out = 1..3, no LSE operand); with a `block`
 * expression it also makes them the accumulators of that ring block (their
 * content tag, BLOCK buffers: the lagged ring's fresh dK/dV of each step).  Content tags: attn_bwd
 * gives out[0] (DQ) Q's tag and leaves DK/DV's tags unchanged (they must equal
 * K's: an accumulator is only ever added to from its own block, the check
 * that catches diffusers #14265); delta gives its output in[0]'s tag.
 *
 * `when` (any op, optional): the op runs only where the expression is
 * nonzero.  Ops inside a loop see s = the step.
 *
 * Memory: every buffer is allocated once, before the first op, at its
 * capacity; the program's memory per rank is the sum of its buffers.
 *
 * Ownership: a cpc_program owns its buffers, ops, bodies and expressions;
 * cpc_program_free releases everything.  Thread-safety: immutable after
 * construction; the runtime reads it from every rank thread.
 *
 * SEMANTICS (the details of the lines above).
 *
 *  Operand slots.  init_acc has n_in = 0, n_out = 2: out[0] ACC, out[1] LSE
 *  (or 1..3 gradients).  attn:
 *  in = {Q, K, V}, out = {ACC-role partial (fp32), LSE}.  merge: in = {ACC
 *  partial, LSE partial}, out = {ACC, LSE}, read and written (acc, lse <-
 *  merge(acc, lse, in)).  swap: n_in = 2, n_out = 0.  send: in[0..n) are n
 *  messages, in order; the matching recv's out[i] receives message i (same
 *  tag, send peer = the receiver, recv peer = the sender, group indices).
 *  copy, all_to_all, all_gather: in[0] -> out[0].
 *
 *  Rows.  A buffer's rows (tokens) are its content: SHARD = shard p (runs
 *  cpc_layout_shard_runs), BLOCK = ring block `tag` (cpc_layout_block_runs),
 *  ALL = blocks 0..R-1 in ring order (block i at cpc_layout_block_offset(i)),
 *  KV = K/V positions 0..Skv-1.  attn's query rows are Q's rows; its output
 *  (ACC, LSE) has Q's rows and heads.  K/V rows read by attn: BLOCK -> the
 *  block of K's content tag (K and V carry the same tag); ALL with `block`
 *  set -> that block's slice of the ALL buffer; ALL with `block` NULL -> all
 *  of it; SHARD -> the shard (world size 1, ulysses/ring never use it); KV ->
 *  all Skv positions.  Masks (causal, key padding) are applied by global
 *  positions of these rows (attn_problem.h cpc_attn_problem.q_runs/kv_runs).
 *
 *  Heads.  PART heads of a Q/O/ACC/LSE buffer on ulysses member u are
 *  cpc_layout_q_heads(u); of a K/V buffer cpc_layout_kv_heads(u) (GQA: the
 *  K/V heads its query heads use, replicated when U > Hkv).  attn maps query
 *  head h (global) to K/V head h / group (local index h/group - kv_off).
 *
 *  all_to_all (group ulysses, member u of ulysses group r, p = r*U+u):
 *   SEQ_TO_HEADS: in = SHARD rows, ALL heads; out = BLOCK rows (tag r), PART
 *     heads.  Member u sends member j its shard rows x heads PART(j) (by the
 *     in buffer's role: K/V use kv_heads(j)); it receives from member j the
 *     shard of rank r*U+j x heads PART(u), placed at token offset
 *     sum_{j'<j} shard_tokens(r*U+j') of the block (the block's run order).
 *   HEADS_TO_SEQ: the inverse: in = BLOCK (tag r) rows, PART heads; out =
 *     SHARD rows, ALL heads.  Member u sends member j the rows of shard
 *     r*U+j x its heads PART(u); receives from j its own shard's rows x
 *     heads PART(j), placed at those heads.  In a forward program only
 *     Q/O/ACC/LSE buffers go heads->seq (no K/V is sent back); a backward
 *     program sends DQ, and DK/DV with `reduce` when K/V heads are shared.
 *   HEADS_TO_SEQ of KV rows (replicated segments): in = KV rows, PART heads;
 *     out = KV rows, ALL heads: member u sends every member all rows x its
 *     heads PART(u) and places what member j sends at heads PART(j) (a head
 *     all-gather: every rank ends with every head of the replicated rows).
 *   LSE-layout buffers ([B, h, T]; the backward's delta) go SEQ_TO_HEADS
 *     only, with the same parts: member j gets [B, h_j, T_u].
 *   HEADS_TO_SEQ with `reduce` (backward programs only; DQ/DK/DV roles, fp32):
 *     the receiver zeroes its output and ADDS every member's part instead of
 *     placing it, so a head held by several members (K/V heads replicated
 *     when U > Hkv or the query heads of one K/V head straddle two members:
 *     ulysses_anything) ends with the SUM of their partial gradients.
 *     Without it such a head ends with one member's part only (the verifier
 *     refuses that: coverage).  Parts are placed in member order.
 *  all_gather (group ring, member r): in = BLOCK (tag r) or, with U == 1, a
 *   SHARD/BLOCK input (shard r == block r); out = ALL: member j's block at
 *   cpc_layout_block_offset(j).
 *  reduce_scatter (group ring, member r; backward programs): in = ALL
 *   (blocks 0..R-1 in ring order, DK/DV fp32), out = BLOCK of the same role,
 *   content tag r: the sum over every member of its in's block-r slice.
 *   Member r sends member j its block-j slice.
 *  all_reduce (group world; backward programs): in and out KV-layout
 *   DK/DV with ALL heads: every rank ends with the sum over all ranks (the
 *   unsplit K/V's gradient of cross-attention: each rank's part holds its
 *   own query rows' contributions).  Token chunk j of the Skv tokens
 *   (tensor_split over P) is summed on rank j, then all-gathered.
 *  copy of a gradient (DQ/DK/DV) from PART heads into ALL heads (backward,
 *   cross-attention with ulysses): the output is zeroed and this member's
 *   heads placed, so that a world all_reduce then assembles every head.
 *  attn_bwd on ALL K/V (the all-gather ring backward): `block` names the
 *   slice read, and DK/DV (ALL too) get that slice's gradient in place.
 *  copy: same rows.  Converts by role: ACC (fp32) -> O (dtype) or same
 *   type; when in has ALL heads and out has PART heads, it selects this
 *   member's heads (cpc_buffer_heads(out, u)): the cross-attention ulysses
 *   program copies K/V (KV, ALL) into (KV, PART).  The content tag is carried.
 *  send/recv are non-blocking: a send's input must not be written, a recv's
 *   output not read or written, until the `wait` with their tag.  recv sets
 *   its outputs' content tag to `block` (evaluated when the recv is posted).
 *  swap exchanges which memory the two names denote (both must have the
 *   same role, tokens and heads); their content tags move with the memory.
 *  wait completes every outstanding send/recv of this rank with that tag.
 *  loop: `count` is evaluated once, on entry (0 <= count <= CPC_LOOP_MAX);
 *   body ops see s = 0..count-1 (the innermost loop's step).
 *
 *  Content tags (tracked per rank by cpc_program_walk, the same rules as
 *  runtime/executor.h): every BLOCK buffer starts as r (the rank's own ring
 *  block, what the query side holds; INPUT BLOCK buffers exist only with
 *  U == 1, where block r == shard r); SHARD buffers are p; ALL and KV
 *  buffers CPC_TAG_NONE.  Updates: all_to_all SEQ_TO_HEADS -> out r,
 *  HEADS_TO_SEQ -> out p; recv -> `block`; copy -> out[i] gets in[i]'s tag; attn -> outs
 *  get Q's tag; merge -> outs get in[0]'s tag; swap exchanges; init_acc,
 *  all_gather and the rest leave tags unchanged; reduce_scatter -> out r;
 *  init_acc of DQ/DK/DV with `block` -> its outputs `block`.
 *
 *  Op spans: span.file is borrowed, not owned (it points to a string that
 *  outlives the program, e.g. the plan's file or the script path);
 *  cpc_ops_free/clone do not free/copy it.
 *
 *  Text form (cpc_program_print, rank < 0):
 *    program variant=V ring_degree=R ulysses_degree=U world_size=P overlap=B rotate=X
 *    buffer NAME role=R tokens=T heads=H io=IO        (one per buffer, aligned)
 *    KIND [group=G] [dir=D] [peer=E] [in=A,B] [out=C,D] [block=E] [count=E]
 *         [tag=N] [when=E]                            (one per op)
 *    loop count=E [when=E] ... end                    (body indented 2 spaces)
 *  `group` is printed when not none, `dir` for all_to_all, `tag` for
 *  send/recv/wait; expressions in canonical text (expr.h, no spaces).  With
 *  rank >= 0: the header adds "rank=N r=.. u=..", buffer lines add
 *  "bytes=N" (capacity on that rank), loops are unrolled, ops whose `when`
 *  is false are omitted, expressions are printed as values, ops inside loops
 *  add "step=s", and attn on BLOCK K/V adds "kv_block=N" (K's content tag).
 */
#ifndef CPC_PROGRAM_H
#define CPC_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "expr.h"
#include "layout.h"
#include "plan.h"
#include "status.h"

typedef enum cpc_op_kind {
    CPC_OP_LOOP = 0,
    CPC_OP_INIT_ACC,
    CPC_OP_ATTN,
    CPC_OP_MERGE,
    CPC_OP_SEND,
    CPC_OP_RECV,
    CPC_OP_WAIT,
    CPC_OP_SWAP,
    CPC_OP_ALL_TO_ALL,
    CPC_OP_ALL_GATHER,
    CPC_OP_COPY,
    CPC_OP_BARRIER,
    CPC_OP_DELTA,       /* backward (BACKWARD.md 2): delta = rowsum(dout * out) */
    CPC_OP_ATTN_BWD,    /* backward: dq, dk, dv += the block's gradients */
    CPC_OP_REDUCE_SCATTER, /* backward: sum over the ring group, each member keeps its block */
    CPC_OP_ALL_REDUCE,  /* backward: sum over the world (cross-attention dK/dV) */
    CPC_OP_ADD,         /* backward: out[0] += in[0] (the lagged ring's dK/dV accumulator) */
    CPC_OP__COUNT
} cpc_op_kind;

typedef enum cpc_group { CPC_GROUP_NONE = 0, CPC_GROUP_RING, CPC_GROUP_ULYSSES, CPC_GROUP_WORLD, CPC_GROUP__COUNT } cpc_group;
typedef enum cpc_buf_role { CPC_ROLE_Q = 0, CPC_ROLE_K, CPC_ROLE_V, CPC_ROLE_O, CPC_ROLE_ACC, CPC_ROLE_LSE,
                             CPC_ROLE_DO, CPC_ROLE_DQ, CPC_ROLE_DK, CPC_ROLE_DV, CPC_ROLE__COUNT } cpc_buf_role;
typedef enum cpc_buf_tokens { CPC_TOK_SHARD = 0, CPC_TOK_BLOCK, CPC_TOK_ALL, CPC_TOK_KV, CPC_TOK__COUNT } cpc_buf_tokens;
typedef enum cpc_buf_heads { CPC_HEADS_ALL = 0, CPC_HEADS_PART, CPC_HEADS__COUNT } cpc_buf_heads;
typedef enum cpc_buf_io { CPC_IO_NONE = 0, CPC_IO_INPUT, CPC_IO_OUTPUT, CPC_IO__COUNT } cpc_buf_io;
typedef enum cpc_a2a_dir { CPC_A2A_SEQ_TO_HEADS = 0, CPC_A2A_HEADS_TO_SEQ, CPC_A2A__COUNT } cpc_a2a_dir;

#define CPC_OP_MAX_BUFS 8

/* THE OP TABLE (as Lua's lopcodes): what every layer needs to know about an
 * op kind, in one place, and read from here by every reader: the provers
 * (arity, groups, required fields: verify.c's shape checks; which kinds a
 * forward / backward program may use: CPC_OPF_FWD/BWD; operand access,
 * content and matching: the step all three provers share, verify_common.c;
 * lifetimes and out_content: the backward prover, verify_bwd.c), the
 * per-rank walk (tag rules: cpc_op_out_tag), the executor (its
 * pending-request guard reads `in_access`/`out_access`, its layout guard
 * `in_content`/`out_content` through cpc_role_can_hold; paired ops run pair
 * by pair by `same_in_out`; event classes CPC_OPF_COMM_TIME),
 * the Lua layer (names, fields), the cost model (host launches; the price
 * rule `cost`, on which cost.c dispatches; the tag rule for its content
 * tags). */
enum {
    CPC_OPF_GROUP = 1 << 0,      /* runs over a group (ring, ulysses or world) */
    CPC_OPF_COLLECTIVE = 1 << 1, /* every member of the group takes part */
    CPC_OPF_TAG = 1 << 2,        /* has a request tag (send, recv, wait) */
    CPC_OPF_PEER = 1 << 3,       /* needs a peer expression */
    CPC_OPF_BLOCK = 1 << 4,      /* needs a block expression (what arrives) */
    CPC_OPF_BODY = 1 << 5,       /* has a body and a count (loop) */
    CPC_OPF_COMM_TIME = 1 << 6,  /* its time is communication (waits included) */
    CPC_OPF_READS_OUT = 1 << 7,  /* reads its outputs too (merge accumulates) */
    CPC_OPF_FWD = 1 << 8,        /* may appear in a forward program (cpc_verify) */
    CPC_OPF_BWD = 1 << 9,        /* may appear in a backward program (cpc_verify_backward) */
};

/* THE PRICE COLUMN: which cost-model rule prices an op.  compiler/cost.c has
 * one function per rule and dispatches on this column only (it keeps no
 * table of its own); the rules are described there (cost.h: the model). */
typedef enum cpc_op_cost {
    CPC_COST_NONE = 0,       /* no time of its own: swap (only the tags move), recv (posting; the
                                message's time is its sender's) */
    CPC_COST_LOOP,           /* its body, step by step (long loops extrapolated, cost.h) */
    CPC_COST_INIT,           /* writes its outputs at memory bandwidth */
    CPC_COST_ATTN,           /* attention FLOPs of the visible pairs and the block's I/O (attn_bwd:
                                the backward's multiple) */
    CPC_COST_MEMORY,         /* bytes of every input and output at memory bandwidth (outputs
                                twice with CPC_OPF_READS_OUT) */
    CPC_COST_SEND,           /* one message on its group's link; completes at its tag's wait */
    CPC_COST_WAIT,           /* compute waits for the tag's messages */
    CPC_COST_ALL_TO_ALL,     /* every pair's parts to / from the other ulysses members, plus pack */
    CPC_COST_ALL_GATHER,     /* every pair's other ring blocks over the ring link */
    CPC_COST_REDUCE_SCATTER, /* every pair: block slices over the ring link, plus the sum */
    CPC_COST_ALL_REDUCE,     /* every pair: reduce-scatter + all-gather over the world link */
    CPC_COST_BARRIER,        /* one latency of its group */
    CPC_COST__COUNT
} cpc_op_cost;

/* How an op uses the buffers of its in[] or out[] slots. */
typedef enum cpc_access {
    CPC_ACCESS_NONE = 0,
    CPC_ACCESS_READ,        /* read, not written */
    CPC_ACCESS_WRITE,       /* overwritten; the old content is not read */
    CPC_ACCESS_ACCUMULATE,  /* read and written: out += ... (merge, attn_bwd, add) */
    CPC_ACCESS_REBIND,      /* the name is bound to other memory (swap) */
} cpc_access;

/* What a buffer holds, by provenance (where it came from), not by role: the
 * LSE the forward saved and the delta the `delta` op made are both role LSE
 * but different contents.  An INPUT buffer holds cpc_content_of_role(role);
 * an op's outputs hold its out_content (CPC_CONTENT_NONE there: what the
 * input in the same slot held, carried: copy, send/recv, collectives). */
typedef enum cpc_content {
    CPC_CONTENT_NONE = 0,   /* nothing yet (in a table slot: no requirement) */
    CPC_CONTENT_Q,
    CPC_CONTENT_K,
    CPC_CONTENT_V,
    CPC_CONTENT_OUT,        /* attention output (attn, merge; the forward's `out`) */
    CPC_CONTENT_LSE,        /* attention LSE (attn, merge; the forward's saved LSE) */
    CPC_CONTENT_DOUT,       /* the output gradient */
    CPC_CONTENT_DELTA,      /* rowsum(dout * out): the delta op's output */
    CPC_CONTENT_GRAD,       /* a gradient accumulator (dq, dk, dv) */
    CPC_CONTENT__COUNT
} cpc_content;

/* How a communicating op meets its partners. */
typedef enum cpc_match {
    CPC_MATCH_NONE = 0,     /* local */
    CPC_MATCH_SEND,         /* point to point: rank a's k-th send to b on (group, tag) meets */
    CPC_MATCH_RECV,         /*   b's k-th recv from a on (group, tag), buffer by buffer (MPI) */
    CPC_MATCH_COMPLETE,     /* wait: completes this rank's requests with its tag; blocks until
                               each is matched (rendezvous, the conservative semantics) */
    CPC_MATCH_COLLECTIVE,   /* every member of the group reaches the same op */
} cpc_match;

/* How long an op uses its buffers. */
typedef enum cpc_lifetime {
    CPC_LIFE_OP = 0,        /* until the op returns */
    CPC_LIFE_UNTIL_WAIT,    /* non-blocking: in flight until the wait with the op's tag; an
                               in-flight send buffer may be read, not written; an in-flight
                               recv buffer neither read nor written (nor swapped) */
} cpc_lifetime;

/* How an op sets the content tags of its outputs (the rules under "Content
 * tags" below; cpc_op_out_tag applies them). */
typedef enum cpc_tag_rule {
    CPC_TAGR_KEEP = 0,       /* outputs keep their tags */
    CPC_TAGR_FROM_IN0,       /* every output gets in[0]'s tag (attn, merge, delta: the query rows) */
    CPC_TAGR_FIRST_FROM_IN0, /* out[0] gets in[0]'s tag, the others keep theirs (attn_bwd: DQ gets
                                Q's, DK/DV keep the block they accumulate) */
    CPC_TAGR_PAIRED,         /* out[i] gets in[i]'s tag (copy, all_reduce) */
    CPC_TAGR_BLOCK,          /* outputs get the op's `block` (recv; init_acc of gradients with one) */
    CPC_TAGR_RING_INDEX,     /* outputs get r (reduce_scatter: this member's block) */
    CPC_TAGR_A2A,            /* seq_to_heads: r (ring block r); heads_to_seq: p (shard p) */
    CPC_TAGR_EXCHANGE,       /* swap: in[0] and in[1] exchange theirs */
} cpc_tag_rule;

typedef struct cpc_op_info {
    const char *name;        /* as printed in the text form and seen by Lua */
    int min_in, max_in;      /* input buffers (CPC_OP_MAX_BUFS at most) */
    int min_out, max_out;    /* output buffers */
    bool same_in_out;        /* as many outputs as inputs, paired (copy, collectives) */
    const char *operands;    /* the operands in words, for diagnostics */
    cpc_group group;         /* the group the op must run over; CPC_GROUP_NONE: any
                                (with CPC_OPF_GROUP) or none */
    unsigned flags;          /* CPC_OPF_* */
    cpc_op_cost cost;        /* the price rule (cost.c dispatches on it) */
    int host_launches;       /* kernels / calls the host issues for it (cost.h:
                                the framework's host time) */
    cpc_access in_access, out_access;   /* every in[] slot / every out[] slot */
    signed char in_content[CPC_OP_MAX_BUFS];  /* what in[i] must hold (NONE: anything its role allows) */
    signed char out_content[CPC_OP_MAX_BUFS]; /* what out[i] holds after (NONE: carried from in[i]) */
    cpc_match match;
    cpc_lifetime life;
    cpc_tag_rule tags;
} cpc_op_info;

/* The table entry of `k`, or NULL for a value outside the enum.  Static data;
 * thread-safe. */
const cpc_op_info *cpc_op_info_of(cpc_op_kind k);

/* Names as printed in the text form and seen by Lua ("attn", "ring", ...).
 * *_parse return -1 for an unknown name. */
const char *cpc_op_kind_name(cpc_op_kind k);
const char *cpc_group_name(cpc_group g);
const char *cpc_buf_role_name(cpc_buf_role r);
const char *cpc_buf_tokens_name(cpc_buf_tokens t);
const char *cpc_buf_heads_name(cpc_buf_heads h);
const char *cpc_buf_io_name(cpc_buf_io io);
const char *cpc_a2a_dir_name(cpc_a2a_dir d);
const char *cpc_content_name(cpc_content c);   /* "q", "the saved lse", "delta", ... */
/* What an INPUT buffer of role r holds (ACC and O: OUT; DQ/DK/DV: GRAD). */
cpc_content cpc_content_of_role(cpc_buf_role r);
/* Whether a buffer of role r has the layout content c needs: the LSE and
 * delta are [B, h, T] fp32 (role LSE only), gradients are fp32 rows of a
 * gradient role (DQ, DK, DV), the other contents [B, T, h, D] rows of a role
 * that is neither.  The executor refuses an op whose table slot
 * (in_content / out_content) names a content its buffer cannot hold, so no
 * kernel reads or writes past a buffer sized for another layout.  NONE:
 * true.  Pure. */
bool cpc_role_can_hold(cpc_buf_role r, cpc_content c);
int cpc_op_kind_parse(const char *s);
int cpc_group_parse(const char *s);
int cpc_buf_role_parse(const char *s);
int cpc_buf_tokens_parse(const char *s);
int cpc_buf_heads_parse(const char *s);
int cpc_buf_io_parse(const char *s);
int cpc_a2a_dir_parse(const char *s);

#define CPC_BUF_NAME_MAX 32

typedef struct cpc_buffer {
    char name[CPC_BUF_NAME_MAX];
    cpc_buf_role role;
    cpc_buf_tokens tokens;
    cpc_buf_heads heads;
    cpc_buf_io io;
    /* For INPUT buffers: which user tensor fills it (role Q, K or V). */
} cpc_buffer;

typedef struct cpc_op {
    cpc_op_kind kind;
    cpc_group group;             /* communication ops; NONE otherwise */
    int n_in, n_out;
    int in[CPC_OP_MAX_BUFS];     /* buffer indices */
    int out[CPC_OP_MAX_BUFS];
    cpc_expr *peer;              /* send/recv: group index of the peer */
    cpc_expr *block;             /* recv: block that arrives; attn on ALL K/V: block read */
    cpc_expr *when;              /* optional predicate (NULL = always) */
    cpc_expr *count;             /* loop: iterations */
    cpc_a2a_dir dir;             /* all_to_all */
    bool reduce;                 /* all_to_all HEADS_TO_SEQ of DK/DV (backward): the
                                    receiver SUMS (fp32) the parts of a head it gets
                                    from several members (K/V heads replicated across
                                    members); printed " reduce=sum" */
    int tag;                     /* send/recv/wait: request tag, >= 0 */
    int n_body;                  /* loop */
    struct cpc_op *body;         /* loop: owned array */
    cpc_span span;               /* where the op came from (Lua script line, artifact) */
} cpc_op;

typedef struct cpc_program {
    cpc_layout layout;           /* sizes of everything (copied) */
    bool overlap;                /* schedule.overlap */
    cpc_rotate rotate;
    int n_buffers;
    cpc_buffer *buffers;         /* owned */
    int n_ops;
    cpc_op *ops;                 /* owned */
} cpc_program;

/* Allocation helpers for builders (scheduler, artifact reader, Lua).
 * Return the new index, or -1 on OOM. */
int cpc_program_add_buffer(cpc_program *prog, const char *name, cpc_buf_role role,
                           cpc_buf_tokens tokens, cpc_buf_heads heads, cpc_buf_io io);
/* (also -1 when `name` is empty, not [A-Za-z0-9_] only, longer than
 * CPC_BUF_NAME_MAX-1, or already used, or an enum value is out of range) */
/* Index of the buffer called `name`, -1 if none. */
int cpc_program_find_buffer(const cpc_program *prog, const char *name);
/* Appends a zeroed op of `kind` to (ops, n) and returns a pointer to it (NULL
 * on OOM); `*ops` is realloc'd. */
cpc_op *cpc_ops_append(cpc_op **ops, int *n, cpc_op_kind kind);

/* Frees ops recursively (bodies and expressions), then the array. */
void cpc_ops_free(cpc_op *ops, int n);
/* Deep copy of an op array; NULL status on success. */
cpc_status *cpc_ops_clone(const cpc_op *ops, int n, cpc_op **out, int *n_out);
void cpc_program_free(cpc_program *prog);   /* frees contents and prog itself */
cpc_status *cpc_program_clone(const cpc_program *prog, cpc_program **out);

/* Size of buffer `b` on the rank with coordinates `c`, at its capacity
 * (maximum over the contents it can hold): elements and bytes. */
int64_t cpc_buffer_capacity_elems(const cpc_program *prog, int b, const cpc_coords *c);
int64_t cpc_buffer_capacity_bytes(const cpc_program *prog, int b, const cpc_coords *c);
/* Heads of buffer b on ulysses member u ([off, off+n)). */
void cpc_buffer_heads(const cpc_program *prog, int b, int u, int *off, int *n);
/* Element size in bytes of buffer b (dtype size, or 4 for ACC/LSE). */
int cpc_buffer_elem_size(const cpc_program *prog, int b);

/* Coordinates of flat rank p (s = 0). */
cpc_coords cpc_program_coords(const cpc_program *prog, int p);

/* ---- constructor, per-rank walk, byte counts ---- */

#define CPC_TAG_NONE (-1)
#define CPC_LOOP_MAX (1 << 20)   /* largest loop count a walk accepts */

/* A new empty program with a copy of `L` (NULL on OOM).  Free with
 * cpc_program_free. */
cpc_program *cpc_program_new(const cpc_layout *L, bool overlap, cpc_rotate rotate);

/* One op as rank `c.p` executes it, reported by cpc_program_walk. */
typedef struct cpc_exec_op {
    const cpc_op *op;     /* the op; loop ops themselves are not reported */
    cpc_coords c;         /* the rank's coordinates; s = innermost loop step (0 outside) */
    int depth;            /* loop nesting depth (0 = top level) */
    int64_t peer;         /* send/recv: evaluated peer (group index); else -1 */
    int64_t block;        /* evaluated `block` (recv, attn on ALL); else -1 */
    const int *tags;      /* content tag of every buffer BEFORE the op (n_buffers) */
} cpc_exec_op;

/* Called for each op that rank runs, in program order.  Returning a status
 * stops the walk and is returned by it. */
typedef cpc_status *(*cpc_walk_fn)(void *ctx, const cpc_exec_op *x);

/* Runs rank `rank`'s program symbolically: unrolls loops, evaluates `when`,
 * `count`, `peer` and `block`, skips ops whose `when` is 0 and tracks
 * content tags (rules above), calling `fn` for each op that runs.  Errors
 * (CPC_E_INPUT, naming the op): evaluation errors, rank out of range, buffer
 * index or operand count out of range, peer outside its group (0..W-1),
 * block outside 0..R-1, loop count outside 0..CPC_LOOP_MAX, loops nested
 * deeper than 8.  Thread-safe (no shared state). */
cpc_status *cpc_program_walk(const cpc_program *prog, int rank, cpc_walk_fn fn, void *ctx);

/* A walk in progress (cpc_program_walk_loops). */
typedef struct cpc_walk cpc_walk;
/* Called for each loop the walk reaches, its count evaluated (0..CPC_LOOP_MAX) on
 * coordinates c at nesting depth `depth`: set *ran when the callback walked the loop
 * itself (the steps it chooses, by cpc_walk_body; the walk goes on after the loop), else
 * the walk unrolls it.  A status stops the walk. */
typedef cpc_status *(*cpc_walk_loop_fn)(void *ctx, cpc_walk *w, const cpc_op *loop, int64_t count, cpc_coords c,
                                        int depth, bool *ran);
/* As cpc_program_walk, with `loop` (NULL: none) called for every loop reached (the
 * backward prover walks the steps of a loop it proves by induction, verify_bwd.h). */
cpc_status *cpc_program_walk_loops(const cpc_program *prog, int rank, cpc_walk_fn fn, cpc_walk_loop_fn loop,
                                   void *ctx);
/* Walks the body of `loop` (reached at depth `depth`) once, on coordinates c (c.s: the
 * step), with the walk's rules and content tags, calling its fn for each op. */
cpc_status *cpc_walk_body(cpc_walk *w, const cpc_op *loop, cpc_coords c, int depth);

/* The content tag out[i] of `op` gets by the table's tag rule, on the rank
 * with coordinates c: `block` is the op's evaluated `block` (-1 if none),
 * in_tag0 / in_tag_i the tags of in[0] and in[i] (CPC_TAG_NONE if absent),
 * old the tag out[i] had.  CPC_TAGR_EXCHANGE (swap: no outputs) returns old.
 * Pure; thread-safe. */
int cpc_op_out_tag(const cpc_program *prog, const cpc_op *op, int i, const cpc_coords *c, int64_t block, int in_tag0,
                   int in_tag_i, int old);

/* Applies op's tag rule to tags[] (one content tag per buffer of prog,
 * updated in place): every output by cpc_op_out_tag, computed from the tags
 * before the op; swap (CPC_TAGR_EXCHANGE) exchanges in[0]'s and in[1]'s.
 * `block` as for cpc_op_out_tag.  The one application the per-rank walk and
 * the cost model share (the executor applies cpc_op_out_tag to its own
 * buffer records).  Pure apart from tags; thread-safe. */
void cpc_op_apply_tags(const cpc_program *prog, const cpc_op *op, const cpc_coords *c, int64_t block, int *tags);

/* Rows (tokens) of buffer b's content with content tag `tag` on the rank
 * with coordinates c: SHARD shard_tokens(p), BLOCK block_tokens(tag) (the
 * largest block when tag is CPC_TAG_NONE), ALL S, KV Skv. */
int64_t cpc_buffer_rows(const cpc_program *prog, int b, const cpc_coords *c, int tag);

/* Memory of rank `rank`: the sum of its buffers' capacities, in bytes
 * (every buffer is allocated once, before the first op).  -1 when rank is
 * out of range. */
int64_t cpc_program_peak_bytes(const cpc_program *prog, int rank);

/* Bytes rank `rank` sends to / receives from OTHER ranks in one run of the
 * program (one layer): send/recv (the messages' content sizes, by content
 * tag), all_to_all (the parts that go to / come from the other members) and
 * all_gather (sent: its own block x, as a ring all-gather forwards;
 * received: the other members' blocks), reduce_scatter (sent: block j's
 * slice to each member j != r; received: R-1 slices of block r) and
 * all_reduce (sent: Skv chunk j to each rank j != p, then its own chunk to
 * every other rank; received alike).  Either pointer may be NULL.
 * Errors: those of cpc_program_walk. */
cpc_status *cpc_program_bytes_sent(const cpc_program *prog, int rank, int64_t *sent,
                                   int64_t *recvd);

/* Stable text form (what --dump-schedule prints).  rank < 0: the SPMD
 * program with expressions; rank >= 0: that rank's program with expressions
 * evaluated and loops unrolled.  Returns a status on evaluation errors. */
/* The format is specified under "Text form" above; rank >= P is
 * CPC_E_USAGE; with rank >= 0 nothing is printed when the walk fails. */
cpc_status *cpc_program_print(FILE *out, const cpc_program *prog, int rank);

#endif
