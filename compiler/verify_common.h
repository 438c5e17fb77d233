/*
 * verify_common.h - what the provers of the verify stage share: the per-rank
 * simulator (verify.c), the symbolic forward prover (verify_sym.c) and the
 * backward prover over its two domains (verify_bwd.c).
 *
 * - The sources a buffer's content can come from: the op table's contents
 *   (program.h cpc_content), by provenance.
 * - THE SHARED RULES (verify_common.c), written once over a domain
 *   interface (vc_domain: what a buffer holds and what is in flight on it,
 *   on one concrete rank or on the symbolic rank): the op table's lifetime
 *   rule for every operand by its access column (CPC_LIFE_UNTIL_WAIT), the
 *   read-before-write rule and the content rule (in_content).  Each prover
 *   supplies its domain's answers and turns a violation's text into its
 *   CP051 (with its own location: rank and step, or the symbolic op).
 *
 * Internal to the verify stage; pure functions, thread-safe.
 */
#ifndef CPC_VERIFY_COMMON_H
#define CPC_VERIFY_COMMON_H

#include <stdbool.h>

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
#define src_names_of(s) cpc_content_name((cpc_content)(s))

/* The source an INPUT buffer of role r holds in a forward program (O and
 * ACC: attention output; backward roles: nothing). */
static inline int src_of_role(cpc_buf_role r)
{
    cpc_content c = cpc_content_of_role(r);
    return c <= CPC_CONTENT_LSE ? (int)c : SRC_NONE;
}

static inline bool src_is_kv(int s) { return s == SRC_K || s == SRC_V; }
static inline bool src_is_attn(int s) { return s == SRC_O || s == SRC_LSE; }

/* A request in flight on a buffer, as a domain describes it. */
typedef struct vc_req {
    const char *op;  /* the op that posted it, in words (NULL: not known) */
    int tag;
    int peer;        /* the rank at the other end; -1 where the domain has no one rank */
} vc_req;

/* A prover's domain, as the shared rules see it. */
typedef struct vc_domain {
    void *self;
    const char *(*name)(void *self, int b);              /* buffer b's name */
    bool (*written)(void *self, int b);                  /* b holds something */
    int (*content)(void *self, int b);                   /* what b holds (cpc_content) */
    bool (*recv_on)(void *self, int b, vc_req *q);       /* a recv into b is in flight: *q */
    bool (*send_on)(void *self, int b, vc_req *q);       /* a send from b is in flight: *q */
    /* Forward attention results (NULL in a domain without attn/merge: backward): */
    int (*stamp)(void *self, int b);      /* identity of the attention output / accumulator pair */
    bool (*fresh)(void *self, int b);     /* an attention output no op has read yet */
    bool (*merged)(void *self, int b);    /* an attention output already merged */
    const char *(*writer)(void *self, int b); /* the op that last wrote b, in words */
} vc_domain;

/* The op table's lifetime rule (program.h CPC_LIFE_UNTIL_WAIT) for buffer b
 * used with access `acc`: a buffer with a recv in flight may not be used at
 * all, one with a send in flight only read, before the wait.  NULL when it
 * holds, else the violation in msg (n bytes). */
const char *vc_in_flight(const vc_domain *d, int b, cpc_access acc, char *msg, size_t n);

/* The lifetime rule for every operand of op, by the table's in_access /
 * out_access columns. */
const char *vc_operands_in_flight(const vc_domain *d, const cpc_op *op, char *msg, size_t n);

/* The read rule: b is not in flight as a recv, and written before it is
 * read (`want` DELTA names the missing delta op). */
const char *vc_read(const vc_domain *d, int b, cpc_content want, char *msg, size_t n);

/* The content rule: every input slot of op with a table in_content is
 * written and holds that content (by provenance: the delta op's output is not
 * the saved LSE).  The lifetime rule is vc_operands_in_flight's, which every
 * prover runs before an op's own checks.  `base` is how input slots are numbered in the
 * message (0 or 1). */
const char *vc_contents(const vc_domain *d, const cpc_op *op, int base, char *msg, size_t n);

/* The overwrite rule (forward): b is not in flight, and does not hold an
 * attention output no op has read (a block attended twice, a merge missing). */
const char *vc_write(const vc_domain *d, int b, char *msg, size_t n);

/* The merge's provenance rules (forward): its outputs are initialised (or
 * arriving), in[0], in[1] are the output and LSE of one attention block not
 * merged yet, out[0], out[1] one accumulator and its LSE, not the input. */
const char *vc_merge(const vc_domain *d, const cpc_op *op, char *msg, size_t n);

#endif
