/*
 * schedule_build.h - the one program builder of the forward scheduler
 * (schedule.c) and the backward scheduler (schedule_bwd.c): declaring
 * buffers, appending ops with their buffers to the program or to a loop body,
 * and the steps both directions share (the ring's K/V rotation, collectives
 * over a group, all-to-alls, waits and swaps), plus the candidate check both
 * make first.
 *
 * ERRORS AS A STICKY VALUE.  A cpc_sb keeps the first error; every later call
 * is a no-op that returns -1 / NULL / an empty list, so a builder calls on
 * without checking and asks once, at the end (cpc_sb_finish).  Errors: out
 * of memory (&cpc_status_oom); an expression the builder wrote that does not
 * parse (CPC_E_INTERNAL, "<who> (internal): ...": a bug, the texts are
 * constants).
 *
 * BUFFER LISTS.  An op's in[] and out[] come as -1-terminated arrays,
 * written CPC_BUFS(a, b, c) (at most CPC_OP_MAX_BUFS entries); NULL is the
 * empty list.
 *
 * Thread-safety: a builder is used by one thread; nothing else is shared.
 */
#ifndef CPC_SCHEDULE_BUILD_H
#define CPC_SCHEDULE_BUILD_H

#include "plan.h"
#include "program.h"
#include "status.h"

/* A -1-terminated buffer list (compound literal: lives in the enclosing block). */
#define CPC_BUFS(...) ((const int[]){__VA_ARGS__, -1})

/* The ring's "there is a next block" predicate: the K/V rotation runs at
 * every step but the last. */
#define CPC_SB_MORE "s<R-1"

typedef struct cpc_sb {
    cpc_program *prog;  /* being built; owned by the builder until cpc_sb_finish */
    cpc_status *err;    /* first error; later calls are no-ops */
    const char *who;    /* "schedule" / "backward schedule": prefix of internal errors */
} cpc_sb;

/* Where ops go: the program's top level or a loop's body. */
typedef struct cpc_sb_list {
    cpc_op **ops;
    int *n;
} cpc_sb_list;

/* Starts a program over a copy of `L` (cpc_program_new); on OOM b->err is
 * set (cpc_sb_finish returns it).  `who` is borrowed (a constant). */
void cpc_sb_init(cpc_sb *b, const cpc_layout *L, bool overlap, cpc_rotate rotate, const char *who);

/* The program's top-level op list. */
cpc_sb_list cpc_sb_top(cpc_sb *b);

/* Ends the build: on success *out = the program (the caller owns it,
 * cpc_program_free) and NULL is returned; after an error the program is
 * freed, *out = NULL and the error returned. */
cpc_status *cpc_sb_finish(cpc_sb *b, cpc_program **out);

/* Declares a buffer (cpc_program_add_buffer); its index, -1 after an error. */
int cpc_sb_buf(cpc_sb *b, const char *name, cpc_buf_role role, cpc_buf_tokens tokens, cpc_buf_heads heads,
               cpc_buf_io io);

/* Parses `text` into *slot (an op's peer, block, when or count). */
void cpc_sb_expr(cpc_sb *b, cpc_expr **slot, const char *text);

/* Appends an op of `kind` to `l` with predicate `when` (NULL: always) and
 * the buffer lists `in` and `out` (CPC_BUFS or NULL).  Returns the op (valid
 * until `l` is appended to again), NULL after an error. */
cpc_op *cpc_sb_op(cpc_sb *b, cpc_sb_list l, cpc_op_kind kind, const char *when, const int *in, const int *out);

/* Sets op->block to `text`; no-op for a NULL op (after an error) or text. */
void cpc_sb_block(cpc_sb *b, cpc_op *op, const char *text);

/* Appends `loop count=<count>` to `l` and returns its body.  Nothing may be
 * appended to `l` until the body is complete (the body lives in l's op). */
cpc_sb_list cpc_sb_loop(cpc_sb *b, cpc_sb_list l, const char *count);

/* all_to_all over the ulysses group, direction `dir`, in -> out; `reduce`:
 * the receiver sums the parts of a head several members send (program.h). */
void cpc_sb_a2a(cpc_sb *b, cpc_sb_list l, cpc_a2a_dir dir, int in, int out, bool reduce);

/* all_to_all seq_to_heads in -> out (no reduce): a ulysses member's heads of
 * the ring block. */
void cpc_sb_to_heads(cpc_sb *b, cpc_sb_list l, int in, int out);

/* A collective `kind` (all_gather, reduce_scatter, all_reduce) over `group`,
 * once per pair: in[i] -> out[i] for i < n, one op each. */
void cpc_sb_coll(cpc_sb *b, cpc_sb_list l, cpc_op_kind kind, cpc_group group, int n, const int *in,
                 const int *out);

/* copy in -> out. */
void cpc_sb_copy(cpc_sb *b, cpc_sb_list l, int in, int out);

/* One send or recv of the pair (x, y) around the ring: a send goes to
 * (r+1)%R, a recv comes from (r-1)%R holding block `block` (NULL: none);
 * request tag `tag`, predicate `when`. */
void cpc_sb_ring_p2p(cpc_sb *b, cpc_sb_list l, bool send, int tag, const char *when, int x, int y,
                     const char *block);

/* The K/V rotation's posting, the same in both directions: send (k, v) to
 * the next ring rank and receive the previous rank's block (r-s-1)%R into
 * (k_nxt, v_nxt), tag 0, both when CPC_SB_MORE. */
void cpc_sb_kv_post(cpc_sb *b, cpc_sb_list body, int k, int v, int k_nxt, int v_nxt);

/* The K/V rotation's end, the same in both directions: swap k <-> k_nxt and
 * v <-> v_nxt when CPC_SB_MORE (after the wait for tag 0). */
void cpc_sb_kv_swap(cpc_sb *b, cpc_sb_list body, int k, int v, int k_nxt, int v_nxt);

/* wait for the requests with `tag`, when `when` (NULL: always). */
void cpc_sb_wait(cpc_sb *b, cpc_sb_list l, int tag, const char *when);

/* swap x <-> y when `when`. */
void cpc_sb_swap(cpc_sb *b, cpc_sb_list l, int x, int y, const char *when);

/* Candidate (variant, R, U) of `plan`, the check both schedulers make
 * before building; `who` prefixes the message.  NULL when the variant is
 * resolved, R, U >= 1, ring/ring_anything have U == 1, ulysses/
 * ulysses_anything R == 1, none R == U == 1, and R x U == world_size; else
 * CPC_E_INTERNAL (a caller that passes a candidate validation rejects). */
cpc_status *cpc_sb_check_candidate(const cpc_plan *plan, cpc_variant v, int R, int U, const char *who);

#endif
