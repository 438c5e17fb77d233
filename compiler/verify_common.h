/*
 * verify_common.h - what the two provers of the verify stage share (the
 * per-rank simulator in verify.c and the symbolic one in verify_sym.c, which
 * follows it check by check): the sources a buffer's content can come from.
 * Internal to the verify stage; static functions of enums only.
 */
#ifndef CPC_VERIFY_COMMON_H
#define CPC_VERIFY_COMMON_H

#include <stdbool.h>

#include "program.h"

/* Where a buffer's content came from: an input tensor, or attention results. */
enum { SRC_NONE = 0, SRC_Q, SRC_K, SRC_V, SRC_O, SRC_LSE };
static const char *const src_names[] = {"nothing", "q", "k", "v", "attention output", "LSE"};

/* The source an INPUT buffer of role r holds (O and ACC: attention output). */
static inline int src_of_role(cpc_buf_role r)
{
    switch (r) {
    case CPC_ROLE_Q: return SRC_Q;
    case CPC_ROLE_K: return SRC_K;
    case CPC_ROLE_V: return SRC_V;
    case CPC_ROLE_O:
    case CPC_ROLE_ACC: return SRC_O;
    case CPC_ROLE_LSE: return SRC_LSE;
    default: return SRC_NONE;
    }
}

static inline bool src_is_kv(int s) { return s == SRC_K || s == SRC_V; }
static inline bool src_is_attn(int s) { return s == SRC_O || s == SRC_LSE; }

#endif
