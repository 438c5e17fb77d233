/*
 * cpc/status.h - errors and diagnostics of libcpc (SPEC section 8).
 *
 * Every call that can fail returns `cpc_status *`: NULL means OK, anything
 * else is an error owned by the caller (free it with cpc_status_free, which
 * frees the whole chain).  Warnings and notes never make a call fail: calls
 * that can produce them (compiling a plan) hand them out separately, as a
 * diagnostics chain of the same type, also owned by the caller.
 *
 * A status (an error or a diagnostic) carries an error class (cpc_code, which
 * decides the exit status of the tools), an optional rule code (CP011 ->
 * 11), a severity, a message, an optional hint and, when it comes from a plan,
 * the position file:line:column (1-based).  Several are chained (next).
 * Errors of libyaml, NVRTC, CUDA, NCCL, MPI and Lua are converted into a
 * status where they occur; nothing in libcpc aborts the process on bad input.
 *
 * Thread-safety: a status is a plain value; different statuses may be used
 * from different threads.  Out of memory while making a status yields a
 * static "out of memory" status, which cpc_status_free ignores.
 */
#ifndef CPC_PUBLIC_STATUS_H
#define CPC_PUBLIC_STATUS_H

#include "cpc/export.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error classes: callers branch on the class, never on the message.  (The
 * cpc and cprun programs map classes to exit statuses: 1 plan/check, 2
 * usage/io/input, 3 the rest; that policy is the tooling layer's, cpc/tool.h
 * cpc_status_exit_code, not part of libcpc.) */
typedef enum cpc_code {
    CPC_OK = 0,
    CPC_E_PLAN,        /* plan rejected by a rule (a CP code is set) */
    CPC_E_CHECK,       /* numerical check failed */
    CPC_E_USAGE,       /* bad option or argument (wrong shape, stride, size, ...) */
    CPC_E_IO,          /* unreadable / unwritable file */
    CPC_E_INPUT,       /* bad input tensors or artifact */
    CPC_E_NOMEM,       /* out of host memory */
    CPC_E_INTERNAL,    /* a cpc bug, or NVRTC rejecting generated code */
    CPC_E_RUNTIME,     /* device, collective or transport failure */
    CPC_E_UNSUPPORTED, /* not available in this build or on this machine */
    CPC_CODE__COUNT
} cpc_code;

typedef enum cpc_severity {
    CPC_SEV_ERROR = 0,
    CPC_SEV_WARNING,
    CPC_SEV_NOTE,
} cpc_severity;

/* Opaque. */
typedef struct cpc_status cpc_status;

/* The error class.  NULL (OK) gives CPC_OK. */
CPC_API cpc_code cpc_status_code(const cpc_status *st);

/* Severity of one diagnostic (an error returned by a call is CPC_SEV_ERROR). */
CPC_API cpc_severity cpc_status_severity(const cpc_status *st);

/* The message (never NULL for a non-NULL status; borrowed, valid while st
 * lives).  NULL for NULL. */
CPC_API const char *cpc_status_message(const cpc_status *st);

/* The rule number (11 for CP011), 0 when none. */
CPC_API int cpc_status_rule(const cpc_status *st);

/* The hint ("variant ulysses_anything runs this plan"), or NULL.  Borrowed. */
CPC_API const char *cpc_status_hint(const cpc_status *st);

/* Where in a plan the diagnostic points: file (borrowed, NULL when it is not
 * about a plan position), line and column (1-based; 0 when unknown).  Any
 * output pointer may be NULL. */
CPC_API void cpc_status_position(const cpc_status *st, const char **file, int *line, int *column);

/* The next status of a chain, or NULL.  Borrowed. */
CPC_API const cpc_status *cpc_status_next(const cpc_status *st);

/* The first note attached to a diagnostic (a chain of CPC_SEV_NOTE statuses,
 * walk it with cpc_status_next), or NULL.  Borrowed. */
CPC_API const cpc_status *cpc_status_notes(const cpc_status *st);

/* Frees a status and its whole chain.  NULL is ignored. */
CPC_API void cpc_status_free(cpc_status *st);

/* "plan", "usage", ... for a code. Static string. */
CPC_API const char *cpc_code_name(cpc_code code);

/* One diagnostic (neither its notes nor the rest of its chain) as
 * compiler-style text ("file:line:col: error[CP011]: message; hint: ...");
 * without a position the prefix is "PROG: " (PROG NULL: "cpc").  For st
 * NULL (no error) the text is "PROG: ok".  Malloc'd; the caller frees it
 * with free().  NULL when out of memory. */
CPC_API char *cpc_status_format(const cpc_status *st, const char *prog);

/* Prints every diagnostic of the chain as cpc_status_format does, one per
 * line, each followed by its notes ("...: note: ..."), to `out` (nothing for
 * NULL). */
CPC_API void cpc_status_print(const cpc_status *st, FILE *out, const char *prog);

#ifdef __cplusplus
}
#endif
#endif
