/* status.c - see status.h */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "status.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

cpc_status cpc_status_oom = {
    .code = CPC_E_NOMEM,
    .rule = 0,
    .severity = CPC_SEV_ERROR,
    .message = "out of memory",
    .hint = NULL,
    .span = {NULL, 0, 0},
    .notes = NULL,
    .next = NULL,
};

static const char *const code_names[CPC_CODE__COUNT] = {
    [CPC_OK] = "ok",
    [CPC_E_PLAN] = "plan",
    [CPC_E_CHECK] = "check",
    [CPC_E_USAGE] = "usage",
    [CPC_E_IO] = "io",
    [CPC_E_INPUT] = "input",
    [CPC_E_NOMEM] = "nomem",
    [CPC_E_INTERNAL] = "internal",
    [CPC_E_RUNTIME] = "runtime",
    [CPC_E_UNSUPPORTED] = "unsupported",
};
_Static_assert(sizeof(code_names) / sizeof(code_names[0]) == CPC_CODE__COUNT,
               "code_names must name every cpc_code");

const char *cpc_code_name(cpc_code code)
{
    return (code >= 0 && code < CPC_CODE__COUNT) ? code_names[code] : "?";
}

static char *vfmt(const char *fmt, va_list ap)
{
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        return NULL;
    return s;
}

cpc_status *cpc_diagv(cpc_code code, int rule, cpc_severity sev, cpc_span span,
                      const char *fmt, va_list ap)
{
    cpc_status *st = calloc(1, sizeof *st);
    if (!st)
        return &cpc_status_oom;
    st->code = code;
    st->rule = rule;
    st->severity = sev;
    st->message = vfmt(fmt, ap);
    if (span.file) {
        st->span.file = strdup(span.file);
        if (!st->span.file) {
            free(st->message);
            free(st);
            return &cpc_status_oom;
        }
    }
    st->span.line = span.line;
    st->span.col = span.col;
    if (!st->message) {
        free((char *)st->span.file);
        free(st);
        return &cpc_status_oom;
    }
    return st;
}

cpc_status *cpc_diag(cpc_code code, int rule, cpc_severity sev, cpc_span span,
                     const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = cpc_diagv(code, rule, sev, span, fmt, ap);
    va_end(ap);
    return st;
}

cpc_status *cpc_error(cpc_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = cpc_diagv(code, 0, CPC_SEV_ERROR, CPC_NO_SPAN, fmt, ap);
    va_end(ap);
    return st;
}

void cpc_status_set_hint(cpc_status *st, const char *fmt, ...)
{
    if (!st || st == &cpc_status_oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    char *h = vfmt(fmt, ap);
    va_end(ap);
    if (!h)
        return;
    free(st->hint);
    st->hint = h;
}

void cpc_status_add_note(cpc_status *st, cpc_span span, const char *fmt, ...)
{
    if (!st || st == &cpc_status_oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    cpc_status *n = cpc_diagv(st->code, 0, CPC_SEV_NOTE, span, fmt, ap);
    va_end(ap);
    if (n == &cpc_status_oom)
        return;
    cpc_status_append(&st->notes, n);
}

void cpc_status_prefix(cpc_status *st, const char *fmt, ...)
{
    if (!st || st == &cpc_status_oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    char *p = vfmt(fmt, ap);
    va_end(ap);
    if (!p)
        return;
    char *m = NULL;
    if (asprintf(&m, "%s: %s", p, st->message) >= 0) {
        free(st->message);
        st->message = m;
    }
    free(p);
}

void cpc_status_append(cpc_status **list, cpc_status *more)
{
    if (!more)
        return;
    if (!*list) {
        *list = more;
        return;
    }
    if (*list == &cpc_status_oom)
        return; /* cannot chain onto the static object; keep the OOM */
    cpc_status *t = *list;
    while (t->next)
        t = t->next;
    if (t == &cpc_status_oom) {
        /* the static OOM status is shared and never written: what follows
         * an OOM is dropped (memory ran out anyway) */
        cpc_status_free(more);
        return;
    }
    t->next = more;
}

void cpc_status_free(cpc_status *st)
{
    while (st) {
        cpc_status *next = st->next;
        if (st == &cpc_status_oom)
            return;
        cpc_status_free(st->notes);
        free(st->message);
        free(st->hint);
        free((char *)st->span.file);
        free(st);
        st = next;
    }
}

bool cpc_status_has_error(const cpc_status *st)
{
    for (; st; st = st->next)
        if (st->severity == CPC_SEV_ERROR)
            return true;
    return false;
}

int cpc_status_count(const cpc_status *st, cpc_severity sev)
{
    int n = 0;
    for (; st; st = st->next)
        n += st->severity == sev;
    return n;
}

static int class_exit(cpc_code c)
{
    switch (c) {
    case CPC_OK: return 0;
    case CPC_E_PLAN:
    case CPC_E_CHECK: return 1;
    case CPC_E_USAGE:
    case CPC_E_IO:
    case CPC_E_INPUT: return 2;
    default: return 3;
    }
}

int cpc_status_exit_code(const cpc_status *st)
{
    int worst = 0;
    for (; st; st = st->next) {
        if (st->severity != CPC_SEV_ERROR)
            continue;
        int e = class_exit(st->code);
        if (e > worst)
            worst = e;
    }
    return worst;
}

const char *cpc_rule_str(int rule, char buf[8])
{
    if (rule <= 0 || rule > 999) {
        buf[0] = 0;
        return buf;
    }
    snprintf(buf, 8, "CP%03d", rule);
    return buf;
}

static const char *sev_name(cpc_severity s)
{
    return s == CPC_SEV_ERROR ? "error" : s == CPC_SEV_WARNING ? "warning" : "note";
}

char *cpc_status_format(const cpc_status *st, const char *prog)
{
    if (!st) { /* OK: "PROG: ok" */
        char *s = NULL;
        return asprintf(&s, "%s: ok", prog ? prog : "cpc") < 0 ? NULL : s;
    }
    char where[512];
    if (st->span.file && st->span.line > 0)
        snprintf(where, sizeof where, "%s:%d:%d", st->span.file, st->span.line,
                 st->span.col > 0 ? st->span.col : 1);
    else if (st->span.file)
        snprintf(where, sizeof where, "%s", st->span.file);
    else
        snprintf(where, sizeof where, "%s", prog ? prog : "cpc");
    char rb[8];
    cpc_rule_str(st->rule, rb);
    char *s = NULL;
    int n = asprintf(&s, "%s: %s%s%s%s: %s%s%s", where, sev_name(st->severity),
                     rb[0] ? "[" : "", rb, rb[0] ? "]" : "", st->message,
                     st->hint ? "; hint: " : "", st->hint ? st->hint : "");
    return n < 0 ? NULL : s;
}

void cpc_status_print(const cpc_status *st, FILE *out, const char *prog)
{
    for (; st; st = st->next) {
        char *s = cpc_status_format(st, prog);
        fprintf(out, "%s\n", s ? s : st->message);
        free(s);
        for (const cpc_status *n = st->notes; n; n = n->next) {
            char *ns = cpc_status_format(n, prog);
            fprintf(out, "%s\n", ns ? ns : n->message);
            free(ns);
        }
    }
}

cpc_status *cpc_errno_status(cpc_code code, int err, const char *what)
{
    return cpc_error(code, "%s: %s", what, strerror(err));
}

typedef struct diag_ref {
    cpc_status *st;
    int idx;
    int group;
} diag_ref;

static int diag_ref_cmp(const void *pa, const void *pb)
{
    const diag_ref *a = pa, *b = pb;
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    if (a->st->span.line != b->st->span.line)
        return a->st->span.line < b->st->span.line ? -1 : 1;
    if (a->st->span.col != b->st->span.col)
        return a->st->span.col < b->st->span.col ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx); /* stable */
}

cpc_status *cpc_status_sort(cpc_status *list, int (*group)(const cpc_status *d))
{
    int n = 0;
    for (cpc_status *s = list; s; s = s->next)
        n++;
    if (n < 2 || list == &cpc_status_oom)
        return list;
    diag_ref *a = malloc((size_t)n * sizeof *a);
    if (!a)
        return list;
    int i = 0;
    for (cpc_status *s = list; s; s = s->next, i++)
        a[i] = (diag_ref){s, i, group ? group(s) : 0};
    qsort(a, (size_t)n, sizeof *a, diag_ref_cmp);
    for (i = 0; i < n - 1; i++)
        a[i].st->next = a[i + 1].st;
    a[n - 1].st->next = NULL;
    cpc_status *head = a[0].st;
    free(a);
    return head;
}
