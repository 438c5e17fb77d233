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
 * OP KINDS (one line per kind: reads, writes, communication, bytes moved per
 * rank; e = element size of the dtype, h = heads of the buffer, T its tokens)
 *
 * kind        reads            writes            comm / semantics                       bytes sent
 * ----------  ---------------  ----------------  -------------------------------------  ----------------------
 * loop        -                -                 body runs `count` times, s = 0..count-1  sum of body
 * init_acc    -                in[0] ACC,         ACC = 0, LSE = -inf                      0
 *                              in[1] LSE (out)
 * attn        in[0] Q, in[1] K, out[0] ACC-like  softmax(Q K^T * scale [+mask]) V for the  0
 *             in[2] V          out[1] LSE        K/V block (ALL layout: block `block`),
 *                                                fp32 out + LSE (natural log)
 * merge       in[0] O blk,     out[0] ACC,       LSE merge in fp32:                       0
 *             in[1] LSE blk    out[1] LSE        lse=log(e^a+e^b), out=sum w_i out_i
 * send        in[0..n)         -                 non-blocking send to group member `peer`  sum B*T*h*D*e
 *                                                of `group`; completes at `wait tag`
 * recv        -                out[0..n)         non-blocking receive from `peer`; the    0 (recv'd: same)
 *                                                content becomes ring block `block`
 * wait        -                -                 completes every send/recv with `tag`   0
 * swap        in[0], in[1]     in[0], in[1]      exchange the two buffers (no copy)        0
 * all_to_all  in[0]            out[0]            group ulysses. dir SEQ_TO_HEADS:         B*T*h*D*e*(U-1)/U approx
 *                                                SHARD/ALL heads -> BLOCK(r)/PART heads;  (exact: sizes of the
 *                                                HEADS_TO_SEQ: the inverse               other members' parts)
 * all_gather  in[0] BLOCK      out[0] ALL        group ring; gathers every member's block  B*T*h*D*e*(R-1)
 * copy        in[0]            out[0]            out = in, converting ACC(fp32)->O dtype,   0
 *                                                or selecting PART heads of a KV/ALL input
 * barrier     -                -                 group barrier                             0
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
    CPC_OP__COUNT
} cpc_op_kind;

typedef enum cpc_group { CPC_GROUP_NONE = 0, CPC_GROUP_RING, CPC_GROUP_ULYSSES, CPC_GROUP_WORLD, CPC_GROUP__COUNT } cpc_group;
typedef enum cpc_buf_role { CPC_ROLE_Q = 0, CPC_ROLE_K, CPC_ROLE_V, CPC_ROLE_O, CPC_ROLE_ACC, CPC_ROLE_LSE, CPC_ROLE__COUNT } cpc_buf_role;
typedef enum cpc_buf_tokens { CPC_TOK_SHARD = 0, CPC_TOK_BLOCK, CPC_TOK_ALL, CPC_TOK_KV, CPC_TOK__COUNT } cpc_buf_tokens;
typedef enum cpc_buf_heads { CPC_HEADS_ALL = 0, CPC_HEADS_PART, CPC_HEADS__COUNT } cpc_buf_heads;
typedef enum cpc_buf_io { CPC_IO_NONE = 0, CPC_IO_INPUT, CPC_IO_OUTPUT, CPC_IO__COUNT } cpc_buf_io;
typedef enum cpc_a2a_dir { CPC_A2A_SEQ_TO_HEADS = 0, CPC_A2A_HEADS_TO_SEQ, CPC_A2A__COUNT } cpc_a2a_dir;

/* Names as printed in the text form and seen by Lua ("attn", "ring", ...).
 * *_parse return -1 for an unknown name. */
const char *cpc_op_kind_name(cpc_op_kind k);
const char *cpc_group_name(cpc_group g);
const char *cpc_buf_role_name(cpc_buf_role r);
const char *cpc_buf_tokens_name(cpc_buf_tokens t);
const char *cpc_buf_heads_name(cpc_buf_heads h);
const char *cpc_buf_io_name(cpc_buf_io io);
const char *cpc_a2a_dir_name(cpc_a2a_dir d);
int cpc_op_kind_parse(const char *s);
int cpc_group_parse(const char *s);
int cpc_buf_role_parse(const char *s);
int cpc_buf_tokens_parse(const char *s);
int cpc_buf_heads_parse(const char *s);
int cpc_buf_io_parse(const char *s);
int cpc_a2a_dir_parse(const char *s);

#define CPC_BUF_NAME_MAX 32
#define CPC_OP_MAX_BUFS 4

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

/* Stable text form (what --dump-schedule prints).  rank < 0: the SPMD
 * program with expressions; rank >= 0: that rank's program with expressions
 * evaluated and loops unrolled.  Returns a status on evaluation errors. */
cpc_status *cpc_program_print(FILE *out, const cpc_program *prog, int rank);

#endif
