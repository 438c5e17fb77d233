/*
 * verify_sym.h - the symbolic proof of the verifier (verify.h, "SYMBOLIC
 * PROOF"): proves an op program for every rank of its world at a cost that
 * does not depend on the world size, or says why it cannot.
 *
 * Internal to the verify stage: cpc_verify_ex (verify.c) calls it after the
 * static shape checks (buffer indices, operand counts, groups, peers and
 * blocks present, loop depth), which it may therefore assume.
 *
 * The argument for soundness is in verify.h's header comment and in
 * docs/VERIFY.md; verify_sym.c is the symbolic domain of the one step of
 * verify_common.h (the enumeration's verify.c is the concrete one), on
 * values that are functions of the rank (r, u) and of the loop step s.
 *
 * Thread-safety: pure function of an immutable program; no global state.
 */
#ifndef CPC_VERIFY_SYM_H
#define CPC_VERIFY_SYM_H

#include <stdint.h>

#include "program.h"
#include "status.h"

typedef enum cpc_sym_result {
    CPC_SYM_PROVED = 0,   /* correct on every rank: nothing returned */
    CPC_SYM_ERROR,        /* a definite fault, on every rank alike: *diag is the CP051 error */
    CPC_SYM_UNDECIDED,    /* outside the symbolic class: *diag is a CP051 error saying which
                             op (path, span) and why; the caller may enumerate instead */
    CPC_SYM_NOMEM,        /* out of memory (*diag NULL) */
} cpc_sym_result;

typedef struct cpc_sym_stats {
    int64_t op_instances; /* ops executed by the generic rank (symbolic steps count once) */
    int64_t phases;       /* loop phases (step intervals with the same active ops) */
    int64_t jumps;        /* phases closed by induction instead of unrolling */
} cpc_sym_stats;

/* Proves `prog` symbolically.  `diag` receives the CP051 status for
 * CPC_SYM_ERROR and CPC_SYM_UNDECIDED (caller frees); `stats` may be NULL. */
cpc_sym_result cpc_verify_symbolic(const cpc_program *prog, cpc_status **diag, cpc_sym_stats *stats);

#endif
