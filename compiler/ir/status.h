/*
 * status.h - the one error/diagnostic type used by every stage of cpc and cprun.
 *
 * A status is a heap-allocated diagnostic: an error class (which decides the
 * exit status), an optional plan rule code (CP001..CP106, SPEC section 2), a
 * severity, a message, an optional hint, an optional source span
 * (file:line:col, 1-based) and a chain of notes.  Several diagnostics are
 * chained with `next` (a stage reports every violation it finds).
 *
 * Convention (as in IREE): a function that can fail returns `cpc_status *`;
 * NULL means OK.  The caller owns a returned status and frees it with
 * cpc_status_free() (which frees the whole chain, notes included).
 *
 * Foreign errors (libyaml, NVRTC with its log, CUDA, NCCL, MPI, Lua) are
 * converted into a cpc_status at the boundary where they occur.
 *
 * Thread-safety: a status object is not shared; creating statuses from
 * several threads at once is safe (no global state).  If memory runs out
 * while creating a status, the static cpc_status_oom object is returned; it
 * is recognised and never freed.
 */
#ifndef CPC_STATUS_H
#define CPC_STATUS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

/* cpc_code (error classes) and cpc_severity are the public API's
 * (include/cpc/status.h); the struct below is the opaque cpc_status. */
#include "cpc/status.h"

/* A source position; line == 0 means "no position".  `file` is owned by the
 * status that holds the span (copied on creation). */
typedef struct cpc_span {
    const char *file;
    int line;   /* 1-based, 0 = none */
    int col;    /* 1-based, 0 = none */
} cpc_span;

#define CPC_NO_SPAN ((cpc_span){NULL, 0, 0})

typedef struct cpc_status {
    cpc_code code;
    int rule;               /* CP rule number (11 for CP011), 0 = none */
    cpc_severity severity;
    char *message;          /* never NULL */
    char *hint;             /* NULL when there is none */
    cpc_span span;          /* span.file owned by this status */
    struct cpc_status *notes; /* chain (via next) of CPC_SEV_NOTE statuses */
    struct cpc_status *next;  /* further diagnostics */
} cpc_status;

/* Returned when allocating a status fails; never freed. */
extern cpc_status cpc_status_oom;

/* Creates an error (severity ERROR) of class `code`, no rule, no span.
 * printf-style message.  Never returns NULL (returns &cpc_status_oom). */
cpc_status *cpc_error(cpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Creates a diagnostic with every field: class, rule (0 = none), severity,
 * span (file copied) and message. */
cpc_status *cpc_diag(cpc_code code, int rule, cpc_severity sev, cpc_span span,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
cpc_status *cpc_diagv(cpc_code code, int rule, cpc_severity sev, cpc_span span,
                      const char *fmt, va_list ap);

/* Sets (replaces) the hint of `st`.  No-op on NULL or the OOM status. */
void cpc_status_set_hint(cpc_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends a note (with an optional span) to `st`.  No-op on NULL/OOM. */
void cpc_status_add_note(cpc_status *st, cpc_span span, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the message of `st` with "prefix: " (used to add context such as
 * "rank 3: all_to_all: ").  No-op on NULL/OOM. */
void cpc_status_prefix(cpc_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends chain `more` at the end of chain `*list` (either may be NULL).
 * Takes ownership of `more`. */
void cpc_status_append(cpc_status **list, cpc_status *more);

/* Stable sort of a chain by (group(d), span.line, span.col), O(n log n);
 * returns the new head.  `group` may be NULL (all in one group); it lets a
 * caller put, e.g., diagnostics about the plan file before those about
 * --set arguments.  On OOM the chain is returned unsorted. */
cpc_status *cpc_status_sort(cpc_status *list, int (*group)(const cpc_status *d));

/* Frees a whole chain with its notes.  NULL and &cpc_status_oom are ignored. */
void cpc_status_free(cpc_status *st);

/* True when the chain holds at least one ERROR diagnostic. */
bool cpc_status_has_error(const cpc_status *st);

/* Counts diagnostics in the chain (notes not counted). */
int cpc_status_count(const cpc_status *st, cpc_severity sev);

/* Exit status for a chain, per SPEC sections 3 and 5: 0 when no error,
 * otherwise the worst class: 1 (plan/check) < 2 (usage/io/input) < 3
 * (internal/runtime/nomem/unsupported). */
int cpc_status_exit_code(const cpc_status *st);

/* Name of an error class ("plan", "usage", ...). */
const char *cpc_code_name(cpc_code code);

/* Writes the chain in C-compiler style, one line per diagnostic, notes and
 * hints included:
 *   file:line:col: error[CP011]: message; hint: ...
 *   file:line:col: note: ...
 * Without a span the "file:line:col: " prefix is "cpc: " (`prog`). */
void cpc_status_print(const cpc_status *st, FILE *out, const char *prog);

/* Formats one diagnostic (not its chain) as above into a malloc'd string
 * (caller frees).  Returns NULL on OOM. */
char *cpc_status_format(const cpc_status *st, const char *prog);

/* Formats the rule as "CP011" into buf (size >= 8); "" when rule == 0. */
const char *cpc_rule_str(int rule, char buf[8]);

/* Converts a libc errno into a status of class `code` with "what: strerror". */
cpc_status *cpc_errno_status(cpc_code code, int err, const char *what);

#endif
