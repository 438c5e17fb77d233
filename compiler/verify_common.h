/*
 * verify_common.h - what the provers of the verify stage share: the per-rank
 * simulator (verify.c), the symbolic forward prover (verify_sym.c) and the
 * backward prover over its two domains (verify_bwd.c).
 *
 * - The sources a buffer's content can come from: the op table's contents
 *   (program.h cpc_content), by provenance.
 * - THE SHARED RULES (verify_common.c), written once over a domain
 *   interface (vc_domain: what a buffer holds and what is in flight on it):
 *   the op table's lifetime rule for every operand by its access column
 *   (CPC_LIFE_UNTIL_WAIT), the read-before-write rule and the content rule
 *   (in_content).  All three provers use them.
 * - THE STEP (verify_common.c vc_step and the vc_* op functions): the
 *   meaning of every forward op, written once: init_acc, attn (K and V one
 *   block, query rows set, GQA heads, the keys met), merge (provenance,
 *   accumulator rows and heads, keys met twice), copy (head selection,
 *   coverage of what leaves an accumulator), swap, send/recv (operands
 *   before posting; a matched message buffer by buffer: declared block,
 *   layout, element size), collectives (what each member's input must hold,
 *   what each output then holds), coverage (vc_complete) and the OUTPUT
 *   buffers at the end.  It asks its domain three-valued questions (vc_tri:
 *   YES / NO / UNDECIDED: same tokens, same heads, tokens of a class, heads
 *   of a class, fits a buffer, the keys of a merge disjoint, coverage
 *   complete, the declared block arrives) and has it build values (shape,
 *   attn_keys, merge_keys, select_heads).  Three domains implement it: one
 *   concrete rank of the enumeration (verify.c: always YES or NO), the
 *   symbolic rank (verify_sym.c: answers for every rank and loop step at
 *   once, UNDECIDED when they differ or it cannot tell; an UNDECIDED sends
 *   the program to enumeration, or to CP051 beyond its bound), and the
 *   backward prover's simulated rank (below).  In all three the step also
 *   runs the message layer (vc_rq, vc_post, the wait, vc_match,
 *   vc_finish), the collectives' read rule and their inputs
 *   (vc_coll_inputs), and faults get one format (vc_op_desc, vc_fault).
 *   What stays per domain is what differs in kind: the values'
 *   representation, how requests find their peers (channels between
 *   concrete ranks, offsets of the one generic rank, or FIFO queues per
 *   (group, peer, tag) with the ring rotation), a wait that blocks (the
 *   rank blocks, or every rank at once: a deadlock), the collectives'
 *   rendezvous (d->meet) and what their outputs hold (the backward
 *   domain's: sets of (query block, key unit, head) runs moved between
 *   members, summed by reduce_scatter and all_reduce), and loops (unrolled
 *   per rank, or induction on the step).  One fault thus gets one message
 *   from every domain (tests/test_verify_sym.c one_step_gives_one_message).
 *   The backward prover (verify_bwd.c) is the third domain: one simulated
 *   rank of its symmetric domain or of its enumeration (values: a content
 *   tag, the buffer's layout, and the (query block, key unit, head) pairs
 *   met, as runs).  Every op of a backward program runs through vc_step
 *   there; the backward ops (grad_op) are that domain's callback, absent in
 *   the forward domains, so a backward op stays a fault in a forward
 *   program, and the two entry points (cpc_verify, cpc_verify_backward)
 *   keep the directions apart.
 *
 * Internal to the verify stage; pure functions, thread-safe.
 */
#ifndef CPC_VERIFY_COMMON_H
#define CPC_VERIFY_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "program.h"

/* Where a buffer's content came from: an input tensor, or attention results. */
enum {
    SRC_NONE = CPC_CONTENT_NONE,
    SRC_Q = CPC_CONTENT_Q,
    SRC_K = CPC_CONTENT_K,
    SRC_V = CPC_CONTENT_V,
    SRC_O = CPC_CONTENT_OUT,
    SRC_LSE = CPC_CONTENT_LSE,
};
/* Data of another ulysses member's head part received here (verify_bwd.c: a
 * message between members of equal part sizes): it may be held and sent on,
 * never computed with (the content rule refuses it as any op's input). */
#define SRC_FOREIGN CPC_CONTENT__COUNT
#define src_names_of(s) ((s) == SRC_FOREIGN ? "another ulysses member's head part" : cpc_content_name((cpc_content)(s)))

/* The source an INPUT buffer of role r holds in a forward program (O and
 * ACC: attention output; backward roles: nothing). */
static inline int src_of_role(cpc_buf_role r)
{
    cpc_content c = cpc_content_of_role(r);
    return c <= CPC_CONTENT_LSE ? (int)c : SRC_NONE;
}

/* x mod m in [0, m) (m >= 1).  Pure. */
static inline int64_t vc_mod(int64_t x, int64_t m)
{
    int64_t r = x % m;
    return r < 0 ? r + m : r;
}

/* The greatest common divisor of |a| and |b| (vc_gcd(0, 0) == 0; a and b
 * above INT64_MIN).  Pure. */
static inline int64_t vc_gcd(int64_t a, int64_t b)
{
    a = a < 0 ? -a : a;
    b = b < 0 ? -b : b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static inline bool src_is_kv(int s) { return s == SRC_K || s == SRC_V; }
static inline bool src_is_attn(int s) { return s == SRC_O || s == SRC_LSE; }

/* A request of the message layer: what every domain shares.  A
 * domain's request type begins with these fields (VC_RQ_FIELDS in an
 * anonymous union with a vc_rq `h`), and holds its snapshots (CPC_OP_MAX_BUFS
 * values of the domain's value type) at vc_domain.snap_off. */
#define VC_RQ_FIELDS                                                                                       \
    bool is_send, done;                                                                                   \
    bool used;          /* a pool's (vc_pool): in use, not in its free list */                             \
    int next;           /* next in the domain's queue, or in the pool's free list (-1: none) */           \
    int match;          /* the request it met (the domain's id); -1: none yet */                          \
    int tag, group;                                                                                       \
    int peer;           /* the rank at the other end; -1 where the domain has no one rank */              \
    int nb;                                                                                               \
    int bufs[CPC_OP_MAX_BUFS];                                                                            \
    const struct vc_node *on; /* the op that posted it, for the steps [slo, shi) (vc_op_desc) */         \
    int64_t slo, shi
typedef struct vc_rq {
    VC_RQ_FIELDS;
} vc_rq;

/* A pool of a domain's requests (verify.c, verify_bwd.c): items of `size` bytes, the domain's
 * request type (a vc_rq first), reused through a free list; release frees an item's snapshots. */
typedef struct vc_pool {
    void *v;
    size_t size;
    int n, cap, free;
    void (*release)(vc_rq *q);
} vc_pool;
#define VC_POOL_AT(pl, id) ((vc_rq *)((char *)(pl)->v + (size_t)(id) * (pl)->size))
/* The ids of one rank's requests in flight, in posting order. */
typedef struct vc_open {
    int *v;
    int n, cap;
} vc_open;
/* A new request, zeroed (used, next -1), its id appended to o; -1 when out of memory
 * (the pool's items may move). */
int vc_pool_new(vc_pool *pl, vc_open *o);
/* After a wait: the done requests leave o; a request and its match go back to the pool
 * (released) once both are done. */
void vc_pool_drop_done(vc_pool *pl, vc_open *o);
/* Releases every request in use, and the pool's storage. */
void vc_pool_free(vc_pool *pl);
/* A FIFO queue of a pool's requests (a channel's unmatched sends or recvs), linked by their
 * `next`: *head and *tail are ids, -1 when empty.  push appends request id; pop removes the
 * first and returns its id (-1: empty). */
void vc_queue_push(vc_pool *pl, int *head, int *tail, int id);
int vc_queue_pop(vc_pool *pl, int *head, int *tail);

/* An op of the program with its index path ("ops[3].body[1]": 1-based, as
 * Lua scripts index plan.ops and CP050 counts) for diagnostics. */
typedef struct vc_node {
    const cpc_op *op;
    const struct vc_node *parent; /* the loop it is in (NULL: top level) */
    int index;                    /* its index there (0-based) */
    bool in_loop;
    struct vc_node *body;
    int n_body;
} vc_node;

/* The tree of ops[0..n) with loop bodies down to max_depth levels (a loop at
 * that depth keeps no body).  NULL when n <= 0 or out of memory (*oom). */
vc_node *vc_nodes(const cpc_op *ops, int n, int max_depth, bool *oom);
void vc_nodes_free(vc_node *nodes, int n);
/* The node of op (a pointer into the program's op arrays) in nodes[0..n);
 * NULL when it is not there.  Cost: the loops on its path's levels. */
const vc_node *vc_node_of(const vc_node *nodes, int n, const cpc_op *op);
/* nd's index path ("ops[3].body[1]") into buf; returns buf. */
const char *vc_node_path(const vc_node *nd, char *buf, size_t n);

/* Three-valued answers: a concrete domain (one rank) always answers YES or
 * NO; the symbolic one (every rank and step at once) answers UNDECIDED when
 * the answer differs between ranks or steps, or it cannot tell.  The step
 * functions below return VC_YES (the op ran), VC_NO (a fault: the message
 * says which), VC_UNDECIDED (outside the domain's class: the message says
 * why; the caller enumerates or refuses), VC_OOM, or VC_BLOCKED (a wait
 * or collective that cannot complete yet: vc_step). */
typedef enum vc_tri { VC_NO = 0, VC_YES = 1, VC_UNDECIDED = 2, VC_OOM = 3, VC_BLOCKED = 4 } vc_tri;

/* YES if both are, NO if either is, else UNDECIDED. */
static inline vc_tri vc_and(vc_tri a, vc_tri b)
{
    return a == VC_NO || b == VC_NO ? VC_NO : a == VC_YES && b == VC_YES ? VC_YES : VC_UNDECIDED;
}

/* The part of an abstract value every domain shares; each domain's
 * value type begins with these fields (VC_VAL_FIELDS in an anonymous union
 * with a vc_val `h`), so the step reads and sets them directly.  Geometry
 * (tokens, heads, keys met) is the domain's own representation, reached
 * only through the callbacks. */
#define VC_VAL_FIELDS                                                                                      \
    uint8_t written; /* holds something */                                                                \
    uint8_t src;     /* what: SRC_* (cpc_content) */                                                      \
    uint8_t final;   /* attention result whose coverage was proved complete */                            \
    uint8_t fresh;   /* attention block output not read by any op yet */                                  \
    uint8_t merged;  /* attention block output already merged */                                         \
    int32_t stamp;   /* identity of an attention output / accumulator pair */                             \
    int32_t kvcov    /* cross-attention: times the K/V sequence was merged */
typedef struct vc_val {
    VC_VAL_FIELDS;
} vc_val;

/* Token classes and head classes the step names (what a buffer layout or a
 * collective produces).  VC_T_BLOCK is the rank's own ring block r. */
enum { VC_T_UNSET = 0, VC_T_OWN, VC_T_BLOCK, VC_T_ALL, VC_T_KV };
enum { VC_H_ALL = 0, VC_H_PART, VC_H_BUF, VC_H_LIKE };

/* A prover's domain, as the shared rules and the step see it.  Callbacks
 * may report a fault themselves (with their own location and notes) and
 * return VC_NO with an empty message: the step then stops. */
typedef struct vc_domain {
    void *self;
    const char *(*name)(void *self, int b);              /* buffer b's name */
    vc_val *(*val)(void *self, int b);                   /* buffer b's value */
    /* The forward geometry: attention results' tokens, heads and keys met (every domain; the
     * backward one for recomputed attention, verify_bwd.h item 7). */
    const char *(*writer)(void *self, int b);            /* the op that last wrote b, in words */
    vc_val *(*tmp)(void *self, int j);                   /* scratch value j < CPC_OP_MAX_BUFS, emptied */
    bool (*copy)(void *self, vc_val *dst, const vc_val *src); /* dst := src; false: out of memory */
    /* v fits buffer b (role, token layout, heads); NO/UNDECIDED: why. */
    vc_tri (*fits)(void *self, int b, const vc_val *v, char *why, size_t n);
    void (*put)(void *self, int b, vc_val *v);           /* moves v into b (v emptied; v may be b's own
                                                            value: then only the writer is set); writer: the op */
    void (*exchange)(void *self, int a, int b);          /* swaps the values of a and b */
    int32_t (*new_stamp)(void *self);
    /* v's tokens := class tok (VC_T_*), heads := all, the rank's part (of
     * v's head space), buffer b's, or like's. */
    void (*shape)(void *self, vc_val *v, int tok, int heads, int b, const vc_val *like);
    vc_tri (*tok_is)(void *self, const vc_val *v, int tok);
    vc_tri (*heads_are)(void *self, const vc_val *v, int heads);
    vc_tri (*same_tokens)(void *self, const vc_val *x, const vc_val *y);
    vc_tri (*same_heads)(void *self, const vc_val *x, const vc_val *y);
    const char *(*words)(void *self, const vc_val *v, char *buf, size_t n); /* tokens and heads */
    bool (*has_keys)(void *self, const vc_val *v);       /* some key block was met */
    /* attn: o := query rows of Q met with the keys of K (or ring block op->block
     * of K); the GQA rule.  NO / UNDECIDED: why (whole message). */
    vc_tri (*attn_keys)(void *self, const cpc_op *op, const vc_val *Q, const vc_val *K, vc_val *o, char *why,
                        size_t n);
    /* merge: acc's keys := acc's U a's, rows := a's (in place; acc may be
     * left changed when it fails).  NO: the keys met twice,
     * in words ("the keys/values of ..."); UNDECIDED: why. */
    vc_tri (*merge_keys)(void *self, vc_val *acc, const vc_val *a, char *why, size_t n);
    /* copy: v's heads := buffer b's, a selection of v's. NO / UNDECIDED: why. */
    vc_tri (*select_heads)(void *self, vc_val *v, int b, int from, char *why, size_t n);
    /* coverage: v's keys are every key its rows need (attention of one
     * sequence, some key met).  NO / UNDECIDED: why (after "NAME ").  The
     * backward domain also answers for an OUTPUT gradient (v's src
     * CPC_CONTENT_GRAD, from vc_output): the rank's own rows, every (query
     * block, key unit, head) exactly once; why after "the OUTPUT buffer NAME: ". */
    vc_tri (*covered)(void *self, const vc_val *v, const char *name, char *why, size_t n);
    /* a recv's declared block: v (what arrives) is it; YES may normalise v
     * to the declared form.  `rq` is the domain's request.  words: the
     * declared block. */
    vc_tri (*declared)(void *self, vc_val *v, const void *rq, char *words, size_t n);
    /* the sender of recv rq's message, in words ("rank 3", "ring member
     * r-1"), and its op */
    void (*sender)(void *self, const void *rq, char *who, size_t nw, char *op, size_t no);
    /* The backward ops (the op table's CPC_OPF_BWD kinds outside the forward's: attn_bwd, delta,
     * add, init_acc of gradients, reduce_scatter, all_reduce) over gradient values, after the
     * step's lifetime and content rules; NULL in the forward domains, where they are a fault. */
    vc_tri (*grad_op)(void *self, const cpc_op *op, char *why, size_t n);
    const cpc_program *prog;
    bool cross;     /* cross-attention (the layout's) */
    bool rep;       /* replicated segments (layout.h): the kv layout holds their rows, which
                       are query rows too; every query meets their keys once (kvcov 1) and
                       every shard's keys once */
    bool p2p_attn;  /* attention results may travel point to point */
    /* The message layer (vc_post, the step's wait): per buffer, the sends in flight reading it and
     * the request of the recv in flight writing it (-1), and the size of the domain's value type
     * (a request's snapshots are an array of them). */
    int32_t *nsend, *rpend;
    size_t val_size;
    /* The domain's requests: request id; the id of the rank's i-th request in flight
     * (-1 past the last); at: the domain now stands at q's op (the writer of what completing q
     * stores); the offset of the snapshots in the domain's request type. */
    vc_rq *(*rq)(void *self, int id);
    int (*open)(void *self, int i);
    void (*at)(void *self, const vc_rq *q);
    void (*at_writer)(void *self, int b);                /* ... at the op that last wrote b (NULL: none) */
    /* send/recv op, after its checks: the domain's request (peer, declared block; vc_post),
     * matched as the domain matches.  VC_NO: a fault (reported itself when msg is empty). */
    vc_tri (*post)(void *self, const cpc_op *op);
    /* collective op, its inputs read: VC_BLOCKED while members are missing (the domain runs it,
     * vc_coll_inputs on each member, then vc_coll_outputs or (backward) its own gradient sets,
     * when the last arrives); NULL: every member is here at once (the symbolic rank), and it
     * runs now. */
    vc_tri (*meet)(void *self, const cpc_op *op);
    /* dst := what send s's snapshot src is in the receiver's terms (src may be emptied) */
    void (*deliver)(void *self, vc_val *dst, vc_val *src, const vc_rq *s);
    size_t snap_off;
} vc_domain;

/* The key units (shards) query rows of units [lo, hi) must meet: all P, or
 * with a causal mask the prefix [0, n) of units whose first token is at or
 * before the rows' last one (blocks entirely above the diagonal may be
 * skipped, or attended once). */
int vc_units_needed(const cpc_layout *L, int lo, int hi);

/* THE STEP.  Each returns VC_YES when the op ran, else VC_NO (a fault),
 * VC_UNDECIDED (outside the domain's class), VC_OOM or VC_BLOCKED (below),
 * with the message in msg (n bytes; empty when a callback reported it
 * itself). */
/* One op: the lifetime rule for its operands, then init_acc, attn (with
 * the content rule), merge (provenance: in[0], in[1] the output and LSE of
 * one block not merged yet, out[0], out[1] one initialised accumulator
 * pair, not the input; the overwrite rule: an attention output no op read
 * is not overwritten), copy and swap whole; send/recv's checks before
 * posting (what is sent is read, and complete if attention; what is
 * received may be overwritten; no buffer named twice), then it is posted
 * (d->post); a wait completes every request with its tag (a send's buffers
 * are one send less in flight; a recv stores what arrived, moved: written,
 * read by no op yet, by vc_store; each on the domain at its op, d->at), or
 * is VC_BLOCKED with the domain at the first one not matched yet, nothing
 * done (the enumerations block the rank, the symbolic proof reports a
 * deadlock); a collective's inputs are read (and a backward one's contents),
 * then it runs when every member is there (d->meet; VC_BLOCKED while one is
 * missing).  The backward ops other than collectives go to d->grad_op after
 * the content rule; without it (a forward domain) a kind outside the
 * forward ops is a fault. */
vc_tri vc_step(const vc_domain *d, const cpc_op *op, char *msg, size_t n);
vc_tri vc_rd(const vc_domain *d, int b, char *msg, size_t n);         /* the read rule; marks b's output used */
vc_tri vc_store(const vc_domain *d, int b, vc_val *v, char *msg, size_t n); /* fits (role, then layout), put */
/* A matched message, on the receiver's domain: snap[j] is what arrives in
 * rbufs[j] (the sender's value in the receiver's terms); rq is the recv,
 * its sender named by the domain's `sender` (only when a check fails). */
vc_tri vc_arrive(const vc_domain *d, int nbs, const int *sbufs, int nbr, const int *rbufs, vc_val *const *snap,
                 const void *rq, char *msg, size_t n);
/* A collective reached by every member, on one member's domain: its inputs
 * (after vc_rd of each at arrival: attention complete, all_to_all
 * seq_to_heads the rank's shard with all heads, heads_to_seq its ring block
 * with its head part, all_gather its ring block; reduce_scatter and
 * all_reduce: nothing more), then its outputs (forward collectives). */
vc_tri vc_coll_inputs(const vc_domain *d, const cpc_op *op, char *msg, size_t n);
vc_tri vc_coll_outputs(const vc_domain *d, const cpc_op *op, char *msg, size_t n);
/* The end of the program: OUTPUT buffer b holds the rank's shard with all
 * heads and a complete attention (coverage: no result, K/V rows,
 * cross-attention's K/V once, then the domain's block coverage); in the
 * backward domain (d->grad_op) a gradient OUTPUT is written and the
 * domain's `covered` decides the rest. */
vc_tri vc_output(const vc_domain *d, int b, char *msg, size_t n);

/* THE MESSAGE LAYER of every domain (verify.c, verify_sym.c, verify_bwd.c):
 * what posting and completing a request does to its buffers, the same
 * whether requests meet over channels between concrete ranks, as offsets of
 * the generic rank or in the backward domain's queues (the matching itself
 * stays the domain's). */
/* The program's start: every INPUT buffer holds its role's source, the
 * rank's own shard (or the K/V sequence) with the buffer's heads. */
void vc_inputs(const vc_domain *d);
/* Posts send/recv op (after vc_step) as the domain's request `id`, whose own
 * fields and peer, on, slo, shi the caller set: the shared fields and
 * buffers; a send snapshots each buffer (d->copy; its attention output
 * counts as read) and counts a send in flight on it; a recv marks its
 * buffers as written by request id.  False when out of memory. */
bool vc_post(const vc_domain *d, const cpc_op *op, int id);
/* Send request sid meets recv request rid, on the receiver's domain: each is
 * the other's match, the send's snapshots are handed to the recv (d->deliver)
 * and checked buffer by buffer (vc_arrive). */
vc_tri vc_match(const vc_domain *d, int sid, int rid, char *msg, size_t n);
/* The end of the rank's program: every request was completed (else a fault
 * with the domain at the request: never matched, naming the peer rank where
 * the domain has one, or never waited), then every OUTPUT buffer (vc_output,
 * with the domain at the op that wrote it). */
vc_tri vc_finish(const vc_domain *d, char *msg, size_t n);
/* A wait that can never complete because of request q, in msg: "deadlock: ALL: its send to WHO
 * (OP, tag t) has no matching recv posted before this wait (WHY)" (a recv: "from", "send"); who is
 * the peer in the domain's words ("ring member r+1", "rank 3"). */
void vc_deadlock(const vc_rq *q, const char *all, const char *who, const char *why, char *msg, size_t n);
/* "ops[3].body[1] merge", with " (step s)" for one step [slo, slo+1) of a
 * loop or " (steps a..b)" for the range a symbolic run stands for (none
 * when shi <= slo); nd NULL: "the end of the program". */
const char *vc_op_desc(const vc_node *nd, int64_t slo, int64_t shi, char *buf, size_t n);
/* A CP051 verification fault at span: "schedule verification failed: rank p
 * (r p/U, u p%U), WHERE: MSG" (p >= 0), else "...: WHERE: MSG" (WHERE may be
 * NULL); a backward program's (bwd) begins "schedule verification failed
 * (backward program): ".  MSG is fmt formatted with ap (at most 1023 bytes).
 * Caller owns the status. */
cpc_status *vc_fault(cpc_span span, bool bwd, int64_t p, int64_t U, const char *where, const char *fmt, va_list ap);

#endif
