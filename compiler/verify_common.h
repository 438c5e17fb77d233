/*
 * verify_common.h - what the two forward provers of the verify stage share
 * (the per-rank simulator in verify.c and the symbolic one in verify_sym.c,
 * which follows it check by check): the sources a buffer's content can come
 * from, which are the op table's contents (program.h cpc_content; the
 * backward prover uses the same enum).  Internal to the verify stage.
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

#endif
