/* plan_load.c - YAML plan file -> cpc_plan with the CP1xx rules.  See
 * plan_load.h for the contract; SPEC section 1 for the keys. */
#include "plan_load.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "layout.h" /* CPC_MAX_SEGMENTS */
#include "yaml_tree.h"

#define MAX_COUNT (1 << 20)        /* world_size, degrees, batch, layers, gpus_per_node */
#define MAX_HEADS 65536            /* heads <= 2^16 (SPEC section 1) */
#define MAX_TOKENS INT64_C(2147483647) /* tokens per segment <= 2^31 - 1 */
#define PATHLEN 160

enum { ABSENT = 0, OK = 1, BAD = 2 };

/* ======================================================================== */
/* keys of SPEC section 1                                                   */
/* ======================================================================== */

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const K_TOP[] = {"version", "name", "model", "input", "cluster", "parallel",
                                    "schedule", "runtime"};
static const char *const K_MODEL[] = {"heads", "kv_heads", "head_dim", "dtype", "layers", "scale",
                                      "parameters", "hidden", "mlp_ratio", "mlp_gated",
                                      "dual_stream_layers", "cross_attention_tokens", "experts",
                                      "active_experts", "attention"};
static const char *const K_RUNTIME[] = {"framework", "attention_kernel", "text_encoder_parameters",
                                        "vae", "vae_channels", "vae_parallel", "vae_tiling", "cfg",
                                        "vae_dtype"};
static const char *const K_INPUT[] = {"batch", "segments", "tokens", "image",
                                      "video", "mask",     "kv",     "mode",
                                      "steps"};
static const char *const K_CLUSTER[] = {"world_size", "gpus_per_node", "device",
                                        "profile",    "memory_gb",     "reserved_gb"};
static const char *const K_PARALLEL[] = {"variant",          "ring_degree",   "ulysses_degree",
                                         "ulysses_anything", "ring_anything", "fallback",
                                         "cfg_degree",       "tp_degree"};
static const char *const K_SCHEDULE[] = {"overlap", "rotate", "script"};
static const char *const K_SEGMENT[] = {"name", "tokens", "image", "video", "split"};
static const char *const K_IMAGE[] = {"height", "width", "vae_scale", "patch"};
static const char *const K_VIDEO[] = {"frames", "height", "width", "vae_scale", "vae_temporal",
                                      "patch"};
static const char *const K_KV[] = {"tokens"};

/* The sections, for "'world_size' belongs under 'cluster'" hints. */
static const struct {
    const char *name;
    const char *const *keys;
    int n;
} SECTIONS[] = {
    {"model", K_MODEL, N(K_MODEL)},       {"input", K_INPUT, N(K_INPUT)},
    {"cluster", K_CLUSTER, N(K_CLUSTER)}, {"parallel", K_PARALLEL, N(K_PARALLEL)},
    {"schedule", K_SCHEDULE, N(K_SCHEDULE)},
};

/* Device presets of the cost model (SPEC section 1). */
static const char *const DEVICES[] = {"h100-sxm", "h100-pcie", "h800", "h200", "h20", "a100-sxm",
                                      "a100-pcie", "a800", "l20", "l40", "l40s", "rtx4090",
                                      "b200", "cpu"}; /* cost.c presets */

/* ======================================================================== */
/* diagnostics                                                              */
/* ======================================================================== */

#define MAX_SUGGESTED 16

typedef struct ld {
    cpc_plan *plan;
    cpc_status *diags;
    cpc_status **tail;   /* &last->next of diags (NULL: &diags): O(1) appends */
    bool oom;
    bool error;
    /* Full paths that a CP101 hint suggested ("model.head_dim"): a CP104 for
     * them would only repeat the same mistake. */
    int n_suggested;
    char suggested[MAX_SUGGESTED][PATHLEN];
} ld;

static void set_oom(ld *L) { L->oom = true; L->error = true; }

/* Spans stored in the plan point to plan->file or to the CPC_SET_FILE
 * literal, never into the YAML tree. */
static cpc_span pspan(const ld *L, cpc_span s)
{
    if (s.file && strcmp(s.file, CPC_SET_FILE) == 0)
        s.file = CPC_SET_FILE;
    else
        s.file = L->plan->file;
    return s;
}

/* Appends a chain (not the static OOM status) at the tail. */
static void append(ld *L, cpc_status *st)
{
    if (!st)
        return;
    if (!L->tail)
        L->tail = &L->diags;
    *L->tail = st;
    while (st->next)
        st = st->next;
    L->tail = &st->next;
}

static cpc_status *emitv(ld *L, cpc_code code, cpc_severity sev, int rule, cpc_span sp,
                         const char *fmt, va_list ap)
{
    cpc_status *st = cpc_diagv(code, rule, sev, sp, fmt, ap);
    if (st == &cpc_status_oom) {
        set_oom(L);
        return NULL;
    }
    if (sev == CPC_SEV_ERROR)
        L->error = true;
    append(L, st);
    return st;
}

/* Appends an error; returns it (for notes/hints) or NULL on OOM. */
static cpc_status *err(ld *L, int rule, cpc_span sp, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static cpc_status *err(ld *L, int rule, cpc_span sp, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = emitv(L, CPC_E_PLAN, CPC_SEV_ERROR, rule, pspan(L, sp), fmt, ap);
    va_end(ap);
    return st;
}

static cpc_status *warn(ld *L, cpc_span sp, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static cpc_status *warn(ld *L, cpc_span sp, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = emitv(L, CPC_E_PLAN, CPC_SEV_WARNING, 0, pspan(L, sp), fmt, ap);
    va_end(ap);
    return st;
}

static void note(ld *L, cpc_status *st, cpc_span sp, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void note(ld *L, cpc_status *st, cpc_span sp, const char *fmt, ...)
{
    if (!st)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cpc_status_add_note(st, pspan(L, sp), "%s", buf);
}

/* Adds `st` (a chain from another module) to the list, taking ownership.
 * The static OOM status (only ever last in a chain) is unlinked and turned
 * into the flag, so that nothing is ever chained after it. */
static void take(ld *L, cpc_status *st)
{
    if (st == &cpc_status_oom) {
        set_oom(L);
        return;
    }
    for (cpc_status *s = st; s; s = s->next) {
        if (s->next == &cpc_status_oom) {
            s->next = NULL;
            set_oom(L);
        }
    }
    if (cpc_status_has_error(st))
        L->error = true;
    append(L, st);
}

/* ======================================================================== */
/* suggestions                                                              */
/* ======================================================================== */

/* Optimal string alignment distance (edits incl. transpositions),
 * case-insensitive; -1 when a string is too long to bother. */
static int edit_distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b);
    if (la > 48 || lb > 48)
        return -1;
    int d[50][50];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int cost = ca != cb;
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

/* The closest of `names` to s, or NULL when none is close enough.  A name
 * that s is a prefix of (or that is a prefix of s) also counts ("h100" ->
 * "h100-sxm"). */
static const char *closest(const char *s, size_t len, const char *const *names, int n)
{
    /* A prefix relation wins over edit distance ("h100" -> "h100-sxm", not
     * "h200"). */
    if (len >= 3) {
        for (int i = 0; i < n; i++) {
            size_t ln = strlen(names[i]);
            if (len < ln && strncmp(names[i], s, len) == 0)
                return names[i];
            if (ln >= 3 && ln < len && strncmp(names[i], s, ln) == 0 &&
                !isalnum((unsigned char)s[ln]))
                return names[i];
        }
    }
    const char *best = NULL;
    int bestd = 1 << 30;
    for (int i = 0; i < n; i++) {
        int dist = edit_distance(s, len, names[i]);
        if (dist < 0)
            continue;
        size_t ln = strlen(names[i]);
        size_t mx = ln > len ? ln : len;
        int limit = mx <= 4 ? 1 : mx <= 8 ? 2 : 3;
        if (dist > limit || dist >= (int)ln)
            continue;
        if (dist < bestd) {
            bestd = dist;
            best = names[i];
        }
    }
    return best;
}

/* ======================================================================== */
/* plan helpers                                                             */
/* ======================================================================== */

/* dst = "path.key" (or "key" at the top).  Paths are built from known key
 * names and indices, so they fit; a longer one is truncated. */
static void join(char *dst, const char *path, const char *key)
{
    int n = (path && path[0]) ? snprintf(dst, PATHLEN, "%s.%s", path, key)
                              : snprintf(dst, PATHLEN, "%s", key);
    if (n < 0 || n >= PATHLEN)
        dst[PATHLEN - 1] = 0;
}

static void record(ld *L, const char *path, const cpc_ynode *k, const cpc_ynode *v)
{
    cpc_plan *p = L->plan;
    if (p->n_key_spans % 16 == 0) {
        cpc_plan_key_span *a =
            realloc(p->key_spans, (size_t)(p->n_key_spans + 16) * sizeof *a);
        if (!a) {
            set_oom(L);
            return;
        }
        p->key_spans = a;
    }
    char *key = strdup(path);
    if (!key) {
        set_oom(L);
        return;
    }
    cpc_plan_key_span *ks = &p->key_spans[p->n_key_spans++];
    ks->key = key;
    ks->key_span = pspan(L, k ? k->span : v->span);
    ks->value_span = pspan(L, v ? v->span : k->span);
}

static char *xstrdup(ld *L, const char *s)
{
    char *d = strdup(s);
    if (!d)
        set_oom(L);
    return d;
}

/* A looked-up field: key node, value node, dotted path. */
typedef struct fld {
    const cpc_ynode *k, *v;
    char path[PATHLEN];
} fld;

/* Looks up `key` in `map` (which may be NULL). */
static bool field(const cpc_ynode *map, const char *path, const char *key, fld *f)
{
    join(f->path, path, key);
    f->v = cpc_ynode_get2(map, key, &f->k);
    return f->k != NULL;
}

/* CP101 for every key of `map` not in `known`; records the spans of the
 * known ones.  `path` is the mapping's own path ("" for the top). */
static void check_keys(ld *L, const cpc_ynode *map, const char *path, const char *const *known,
                       int n_known)
{
    for (int i = 0; i < cpc_ynode_count(map); i++) {
        const cpc_ynode *k = cpc_ynode_key(map, i);
        const cpc_ynode *v = cpc_ynode_value(map, i);
        int j;
        for (j = 0; j < n_known; j++)
            if (cpc_ynode_is(k, known[j]))
                break;
        if (j < n_known) {
            char full[PATHLEN];
            join(full, path, known[j]);
            record(L, full, k, v);
            continue;
        }
        char esc[96];
        cpc_yaml_escape(k->str, k->len, esc, sizeof esc);
        cpc_status *st;
        if (path[0])
            st = err(L, 101, k->span, "unknown key '%s' in '%s'", esc, path);
        else
            st = err(L, 101, k->span, "unknown key '%s'", esc);
        const char *sugg = closest(k->str, k->len, known, n_known);
        if (sugg && strlen(sugg) == k->len && strncasecmp(sugg, k->str, k->len) == 0) {
            cpc_status_set_hint(st, "did you mean '%s'? (keys are case-sensitive)", sugg);
            if (L->n_suggested < MAX_SUGGESTED)
                join(L->suggested[L->n_suggested++], path, sugg);
            continue;
        }
        if (sugg) {
            cpc_status_set_hint(st, "did you mean '%s'?", sugg);
            if (L->n_suggested < MAX_SUGGESTED)
                join(L->suggested[L->n_suggested++], path, sugg);
            continue;
        }
        /* A key of another section? */
        bool found = false;
        for (int s = 0; s < N(SECTIONS) && !found; s++) {
            if (strcmp(SECTIONS[s].name, path) == 0)
                continue;
            for (int m = 0; m < SECTIONS[s].n; m++) {
                if (cpc_ynode_is(k, SECTIONS[s].keys[m])) {
                    cpc_status_set_hint(st, "'%s' belongs under '%s' (%s.%s)", esc,
                                        SECTIONS[s].name, SECTIONS[s].name, esc);
                    found = true;
                    break;
                }
            }
        }
        if (!found && n_known > 0) {
            char list[256] = "";
            size_t o = 0;
            for (int m = 0; m < n_known && o < sizeof list - 40; m++)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", m ? ", " : "", known[m]);
            cpc_status_set_hint(st, "known keys here: %s", list);
        }
    }
}

/* CP102: "path: expected X, found Y" with a hint for the usual mistakes. */
static void type_error(ld *L, const fld *f, const char *expected)
{
    char found[160];
    cpc_ynode_describe(f->v, found, sizeof found);
    cpc_status *st = err(L, 102, f->v->span, "%s: expected %s, found %s", f->path, expected, found);
    if (!st || f->v->kind != CPC_YNODE_SCALAR)
        return;
    cpc_ynode plain = *f->v;
    plain.style = CPC_YSTYLE_PLAIN;
    cpc_ytype as_plain = cpc_ynode_type(&plain);
    bool quoted = f->v->style == CPC_YSTYLE_SINGLE_QUOTED || f->v->style == CPC_YSTYLE_DOUBLE_QUOTED;
    if (quoted && (as_plain == CPC_YTYPE_INT || as_plain == CPC_YTYPE_BOOL ||
                   as_plain == CPC_YTYPE_FLOAT) && strstr(expected, "string") == NULL)
        cpc_status_set_hint(st, "remove the quotes");
    else if (cpc_ynode_type(f->v) == CPC_YTYPE_FLOAT && strcmp(expected, "an integer") == 0) {
        double d = 0;
        if (cpc_ynode_float(f->v, &d) == CPC_YCONV_OK && isfinite(d) && d == floor(d) &&
            fabs(d) < 1e15)
            cpc_status_set_hint(st, "write %.0f", d);
    } else if ((as_plain == CPC_YTYPE_INT || as_plain == CPC_YTYPE_FLOAT ||
                as_plain == CPC_YTYPE_BOOL || as_plain == CPC_YTYPE_NULL) &&
               strstr(expected, "string") != NULL)
    {
        char esc[96];
        cpc_yaml_escape(f->v->str, f->v->len, esc, sizeof esc);
        cpc_status_set_hint(st, "quote it: \"%s\"", esc);
    }
}

static int want_int(ld *L, const fld *f, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v = 0;
    cpc_yconv c = cpc_ynode_int(f->v, &v);
    if (c == CPC_YCONV_TYPE) {
        type_error(L, f, "an integer");
        return BAD;
    }
    if (c == CPC_YCONV_RANGE || v < lo || v > hi) {
        char esc[96];
        cpc_yaml_escape(f->v->str, f->v->len, esc, sizeof esc);
        if (hi == INT64_MAX)
            err(L, 103, f->v->span, "%s: %s is out of range (must be >= %lld)", f->path, esc,
                (long long)lo);
        else
            err(L, 103, f->v->span, "%s: %s is out of range (%lld..%lld)", f->path, esc,
                (long long)lo, (long long)hi);
        return BAD;
    }
    *out = v;
    return OK;
}

/* An int field: ABSENT, OK (stored in *out) or BAD (reported). */
static int get_int(ld *L, const cpc_ynode *map, const char *path, const char *key, int64_t lo,
                   int64_t hi, int64_t *out, fld *fo)
{
    fld f;
    if (!field(map, path, key, &f))
        return ABSENT;
    if (fo)
        *fo = f;
    return want_int(L, &f, lo, hi, out);
}

static int get_bool(ld *L, const cpc_ynode *map, const char *path, const char *key, bool *out,
                    fld *fo)
{
    fld f;
    if (!field(map, path, key, &f))
        return ABSENT;
    if (fo)
        *fo = f;
    if (cpc_ynode_bool(f.v, out) != CPC_YCONV_OK) {
        type_error(L, &f, "a boolean (true or false)");
        return BAD;
    }
    return OK;
}

/* A float field with lo < v (lo_open) or lo <= v, finite, v <= hi. */
static int get_float(ld *L, const cpc_ynode *map, const char *path, const char *key, double lo,
                     bool lo_open, double hi, double *out)
{
    fld f;
    if (!field(map, path, key, &f))
        return ABSENT;
    double v = 0;
    cpc_yconv c = cpc_ynode_float(f.v, &v);
    if (c == CPC_YCONV_TYPE) {
        type_error(L, &f, "a number");
        return BAD;
    }
    if (c == CPC_YCONV_RANGE || !isfinite(v) || (lo_open ? v <= lo : v < lo) || v > hi) {
        char esc[96];
        cpc_yaml_escape(f.v->str, f.v->len, esc, sizeof esc);
        err(L, 103, f.v->span, "%s: %s is out of range (a finite number %s %.10g and <= %.10g)", f.path,
            esc, lo_open ? ">" : ">=", lo, hi);
        return BAD;
    }
    *out = v;
    return OK;
}

/* A non-empty string without NUL bytes. */
static int want_str(ld *L, const fld *f, const char **out)
{
    const char *s = NULL;
    if (cpc_ynode_string(f->v, &s) != CPC_YCONV_OK) {
        type_error(L, f, "a string");
        return BAD;
    }
    if (f->v->len == 0) {
        err(L, 103, f->v->span, "%s: must not be empty", f->path);
        return BAD;
    }
    if (strlen(s) != f->v->len) {
        err(L, 103, f->v->span, "%s: contains a NUL character", f->path);
        return BAD;
    }
    *out = s;
    return OK;
}

static int get_str(ld *L, const cpc_ynode *map, const char *path, const char *key,
                   const char **out)
{
    fld f;
    if (!field(map, path, key, &f))
        return ABSENT;
    return want_str(L, &f, out);
}

/* One of `names` (index in *out). */
static int get_enum(ld *L, const cpc_ynode *map, const char *path, const char *key,
                    const char *const *names, int n, int *out, fld *fo)
{
    fld f;
    if (!field(map, path, key, &f))
        return ABSENT;
    if (fo)
        *fo = f;
    char list[256] = "";
    size_t o = 0;
    for (int i = 0; i < n && o < sizeof list - 40; i++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", names[i]);
    const char *s = NULL;
    if (cpc_ynode_string(f.v, &s) != CPC_YCONV_OK) {
        char exp[300];
        snprintf(exp, sizeof exp, "one of %s", list);
        type_error(L, &f, exp);
        return BAD;
    }
    for (int i = 0; i < n; i++) {
        if (strlen(names[i]) == f.v->len && memcmp(names[i], s, f.v->len) == 0) {
            *out = i;
            return OK;
        }
    }
    char esc[96];
    cpc_yaml_escape(f.v->str, f.v->len, esc, sizeof esc);
    cpc_status *st = err(L, 103, f.v->span, "%s: '%s' is not one of %s", f.path, esc, list);
    const char *sugg = closest(s, f.v->len, names, n);
    if (sugg)
        cpc_status_set_hint(st, "did you mean '%s'?", sugg);
    return BAD;
}

/* A mapping-valued section.  Returns it, or NULL when absent (*present =
 * false) or of the wrong type (reported; *present = true). */
static const cpc_ynode *get_map(ld *L, const cpc_ynode *map, const char *path, const char *key,
                                bool *present, fld *fo)
{
    fld f;
    *present = field(map, path, key, &f);
    if (fo)
        *fo = f;
    if (!*present)
        return NULL;
    if (f.v->kind != CPC_YNODE_MAPPING) {
        type_error(L, &f, "a mapping");
        return NULL;
    }
    return f.v;
}

/* CP104 for a required key missing from `map`; points at the mapping's key
 * (`at`), or at the parent when the mapping itself is absent. */
static void missing(ld *L, cpc_span at, const char *path, const char *key, const char *what)
{
    char full[PATHLEN];
    join(full, path, key);
    for (int i = 0; i < L->n_suggested; i++)
        if (strcmp(L->suggested[i], full) == 0)
            return; /* the CP101 "did you mean" already covers it */
    err(L, 104, at, "missing required key '%s'%s%s", full, what ? ": " : "", what ? what : "");
}

/* ======================================================================== */
/* token arithmetic                                                         */
/* ======================================================================== */

/* floor(a / b) with a warning when not exact; a >= 1, b >= 1. */
static int64_t floor_div(ld *L, int64_t a, int64_t b, const fld *fa, const char *what_b,
                         const char *unit)
{
    int64_t q = a / b;
    if (a % b != 0) {
        char esc[96];
        cpc_yaml_escape(fa->v->str, fa->v->len, esc, sizeof esc);
        warn(L, fa->v->span,
             "%s: %s is not a multiple of %s = %lld: floored to %lld %s, as the pipeline does",
             fa->path, esc, what_b, (long long)b, (long long)q, unit);
    }
    return q;
}

static bool mul_checked(ld *L, int64_t a, int64_t b, int64_t *out, cpc_span sp, const char *path,
                        const char *what)
{
    if (__builtin_mul_overflow(a, b, out)) {
        err(L, 103, sp, "%s: %s overflows (%lld * %lld does not fit in 64 bits)", path, what,
            (long long)a, (long long)b);
        return false;
    }
    return true;
}

/* Final range check of a segment's tokens. */
static bool tokens_ok(ld *L, int64_t t, cpc_span sp, const char *path)
{
    if (t < 1) {
        err(L, 103, sp, "%s: gives %lld tokens (must be >= 1)", path, (long long)t);
        return false;
    }
    if (t > MAX_TOKENS) {
        err(L, 103, sp, "%s: gives %lld tokens, more than 2^31-1 per segment", path, (long long)t);
        return false;
    }
    return true;
}

/* A required positive int of an image/video mapping. */
static int dim(ld *L, const cpc_ynode *m, const char *path, const char *key, bool required,
               int64_t def, int64_t *out, fld *f, cpc_span at)
{
    int r = get_int(L, m, path, key, 1, INT64_MAX, out, f);
    if (r == ABSENT) {
        if (required) {
            missing(L, at, path, key, NULL);
            return BAD;
        }
        *out = def;
        f->k = f->v = NULL;
        join(f->path, path, key);
        return OK;
    }
    return r;
}

/* image: {height, width, vae_scale: 8, patch: 2} -> tokens.  `at` is the
 * span of the `image` key. */
static bool image_tokens(ld *L, const fld *img, int64_t *tokens, int64_t *pixels)
{
    if (img->v->kind != CPC_YNODE_MAPPING) {
        type_error(L, img, "a mapping {height, width, vae_scale, patch}");
        return false;
    }
    const cpc_ynode *m = img->v;
    const char *p = img->path;
    check_keys(L, m, p, K_IMAGE, N(K_IMAGE));
    int64_t h = 0, w = 0, vae = 0, patch = 0;
    fld fh, fw, fv, fp;
    int ok = 1;
    ok &= dim(L, m, p, "height", true, 0, &h, &fh, img->k->span) == OK;
    ok &= dim(L, m, p, "width", true, 0, &w, &fw, img->k->span) == OK;
    ok &= dim(L, m, p, "vae_scale", false, 8, &vae, &fv, img->k->span) == OK;
    ok &= dim(L, m, p, "patch", false, 2, &patch, &fp, img->k->span) == OK;
    if (!ok)
        return false;
    int64_t f = 0;
    if (!mul_checked(L, vae, patch, &f, img->v->span, p, "vae_scale * patch"))
        return false;
    int64_t th = floor_div(L, h, f, &fh, "vae_scale * patch", "patches");
    int64_t tw = floor_div(L, w, f, &fw, "vae_scale * patch", "patches");
    if (th == 0 || tw == 0) {
        const fld *z = th == 0 ? &fh : &fw;
        char esc[96];
        cpc_yaml_escape(z->v->str, z->v->len, esc, sizeof esc);
        err(L, 103, z->v->span, "%s: %s is smaller than vae_scale * patch = %lld: the image has no tokens",
            z->path, esc, (long long)f);
        return false;
    }
    int64_t t = 0;
    if (!mul_checked(L, th, tw, &t, img->v->span, p, "the token count"))
        return false;
    if (!tokens_ok(L, t, img->v->span, p))
        return false;
    *tokens = t;
    *pixels = h <= INT64_MAX / w ? h * w : INT64_MAX;
    return true;
}

/* video: {frames, height, width, vae_scale: 8, vae_temporal: 4,
 * patch: [pt, ph, pw] = [1, 2, 2]} -> tokens. */
static bool video_tokens(ld *L, const fld *vid, int64_t *tokens, int64_t *frames, int64_t *pixels)
{
    if (vid->v->kind != CPC_YNODE_MAPPING) {
        type_error(L, vid, "a mapping {frames, height, width, vae_scale, vae_temporal, patch}");
        return false;
    }
    const cpc_ynode *m = vid->v;
    const char *p = vid->path;
    check_keys(L, m, p, K_VIDEO, N(K_VIDEO));
    int64_t fr = 0, h = 0, w = 0, vae = 0, vt = 0;
    int64_t pt = 1, ph = 2, pw = 2;
    fld ffr, fh, fw, fv, fvt, fp;
    int ok = 1;
    cpc_span at = vid->k->span;
    ok &= dim(L, m, p, "frames", true, 0, &fr, &ffr, at) == OK;
    ok &= dim(L, m, p, "height", true, 0, &h, &fh, at) == OK;
    ok &= dim(L, m, p, "width", true, 0, &w, &fw, at) == OK;
    ok &= dim(L, m, p, "vae_scale", false, 8, &vae, &fv, at) == OK;
    ok &= dim(L, m, p, "vae_temporal", false, 4, &vt, &fvt, at) == OK;
    if (field(m, p, "patch", &fp)) {
        const cpc_ynode *s = fp.v;
        if (s->kind != CPC_YNODE_SEQUENCE || s->n != 3) {
            type_error(L, &fp, "a sequence of 3 integers [pt, ph, pw]");
            ok = 0;
        } else {
            int64_t pv[3] = {0, 0, 0};
            for (int i = 0; i < 3; i++) {
                fld fi;
                fi.k = fp.k;
                fi.v = s->vals[i];
                if (snprintf(fi.path, sizeof fi.path, "%s[%d]", fp.path, i) >= (int)sizeof fi.path)
                    fi.path[sizeof fi.path - 1] = 0; /* truncated (paths are short) */
                if (want_int(L, &fi, 1, INT64_MAX, &pv[i]) != OK)
                    ok = 0;
            }
            pt = pv[0];
            ph = pv[1];
            pw = pv[2];
        }
    }
    if (!ok)
        return false;
    /* Latent frames: (frames - 1) / vae_temporal + 1 (causal video VAE). */
    int64_t lat = (fr - 1) / vt + 1;
    if ((fr - 1) % vt != 0) {
        char esc[96];
        cpc_yaml_escape(ffr.v->str, ffr.v->len, esc, sizeof esc);
        warn(L, ffr.v->span,
             "%s: %s - 1 is not a multiple of vae_temporal = %lld: floored to %lld latent frames, "
             "as the pipeline does", ffr.path, esc, (long long)vt, (long long)lat);
    }
    int64_t tt = lat / pt;
    if (lat % pt != 0)
        warn(L, (fp.k ? fp.v : ffr.v)->span,
             "%s: %lld latent frames are not a multiple of the temporal patch %lld: floored to %lld",
             p, (long long)lat, (long long)pt, (long long)tt);
    if (tt == 0) {
        err(L, 103, ffr.v->span, "%s: %lld latent frames are fewer than the temporal patch %lld: "
            "the video has no tokens", p, (long long)lat, (long long)pt);
        return false;
    }
    int64_t fhh = 0, fww = 0;
    if (!mul_checked(L, vae, ph, &fhh, vid->v->span, p, "vae_scale * patch height") ||
        !mul_checked(L, vae, pw, &fww, vid->v->span, p, "vae_scale * patch width"))
        return false;
    int64_t th = floor_div(L, h, fhh, &fh, "vae_scale * patch", "patches");
    int64_t tw = floor_div(L, w, fww, &fw, "vae_scale * patch", "patches");
    if (th == 0 || tw == 0) {
        const fld *z = th == 0 ? &fh : &fw;
        char esc[96];
        cpc_yaml_escape(z->v->str, z->v->len, esc, sizeof esc);
        err(L, 103, z->v->span, "%s: %s is smaller than vae_scale * patch = %lld: the video has no tokens",
            z->path, esc, (long long)(th == 0 ? fhh : fww));
        return false;
    }
    int64_t t = 0;
    if (!mul_checked(L, tt, th, &t, vid->v->span, p, "the token count") ||
        !mul_checked(L, t, tw, &t, vid->v->span, p, "the token count"))
        return false;
    if (!tokens_ok(L, t, vid->v->span, p))
        return false;
    *tokens = t;
    *frames = fr;
    double px = (double)fr * (double)h * (double)w;
    *pixels = px < 9e18 ? (int64_t)px : INT64_MAX;
    return true;
}

/* tokens: N */
static bool plain_tokens(ld *L, const fld *f, int64_t *tokens)
{
    return want_int(L, f, 1, MAX_TOKENS, tokens) == OK;
}

static bool add_segment_px(ld *L, const char *name, int64_t tokens, cpc_span sp, int kind,
                           int64_t frames, int64_t pixels);
static bool add_segment(ld *L, const char *name, int64_t tokens, cpc_span sp)
{
    return add_segment_px(L, name, tokens, sp, CPC_SEG_TOKENS, 0, 0);
}

/* A segment with what it was given as (an image or video: its output pixels). */
static bool add_segment_px(ld *L, const char *name, int64_t tokens, cpc_span sp, int kind,
                           int64_t frames, int64_t pixels)
{
    cpc_plan *p = L->plan;
    if (!p->input.segments) {
        p->input.segments = calloc(CPC_MAX_SEGMENTS, sizeof *p->input.segments);
        if (!p->input.segments) {
            set_oom(L);
            return false;
        }
    }
    if (p->input.n_segments >= CPC_MAX_SEGMENTS)
        return false; /* checked by the caller */
    cpc_segment *s = &p->input.segments[p->input.n_segments];
    s->name = xstrdup(L, name);
    if (!s->name)
        return false;
    s->tokens = tokens;
    s->kind = kind;
    s->frames = frames;
    s->pixels = pixels;
    s->span = pspan(L, sp);
    p->input.n_segments++;
    return true;
}

/* The first-written of two conflicting keys gets the note. */
static void conflict(ld *L, const cpc_ynode *a_key, const char *a, const cpc_ynode *b_key,
                     const char *b, const char *why)
{
    const cpc_ynode *first = a_key, *second = b_key;
    const char *fn = a, *sn = b;
    /* "later": a --set comes after the whole file, then by position */
    bool a_set = a_key->span.file && strcmp(a_key->span.file, CPC_SET_FILE) == 0;
    bool b_set = b_key->span.file && strcmp(b_key->span.file, CPC_SET_FILE) == 0;
    if (b_set != a_set ? a_set
                       : (b_key->span.line < a_key->span.line ||
                          (b_key->span.line == a_key->span.line &&
                           b_key->span.col < a_key->span.col))) {
        first = b_key;
        second = a_key;
        fn = b;
        sn = a;
    }
    cpc_status *st = err(L, 105, second->span, "'%s' conflicts with '%s'%s%s", sn, fn,
                         why ? ": " : "", why ? why : "");
    note(L, st, first->span, "'%s' is set here", fn);
}

/* ======================================================================== */
/* sections                                                                 */
/* ======================================================================== */

static void load_model(ld *L, const cpc_ynode *root, cpc_span root_at)
{
    cpc_plan *p = L->plan;
    bool present;
    fld fm;
    const cpc_ynode *m = get_map(L, root, "", "model", &present, &fm);
    if (!present) {
        missing(L, root_at, "model", "heads", NULL);
        missing(L, root_at, "model", "head_dim", NULL);
        return;
    }
    if (!m)
        return;
    check_keys(L, m, "model", K_MODEL, N(K_MODEL));
    int64_t v = 0;
    int r = get_int(L, m, "model", "heads", 1, MAX_HEADS, &v, NULL);
    if (r == ABSENT)
        missing(L, fm.k->span, "model", "heads", NULL);
    p->model.heads = r == OK ? (int)v : 0;
    r = get_int(L, m, "model", "kv_heads", 1, MAX_HEADS, &v, NULL);
    p->model.kv_heads = r == OK ? (int)v : p->model.heads;
    r = get_int(L, m, "model", "head_dim", 1, 256, &v, NULL);
    if (r == ABSENT)
        missing(L, fm.k->span, "model", "head_dim", NULL);
    p->model.head_dim = r == OK ? (int)v : 0;
    const char *dn[CPC_DTYPE__COUNT];
    for (int i = 0; i < CPC_DTYPE__COUNT; i++)
        dn[i] = cpc_dtype_name((cpc_dtype)i);
    int e = 0;
    if (get_enum(L, m, "model", "dtype", dn, CPC_DTYPE__COUNT, &e, NULL) == OK)
        p->model.dtype = (cpc_dtype)e;
    if (get_int(L, m, "model", "layers", 1, MAX_COUNT, &v, NULL) == OK)
        p->model.layers = (int)v;
    if (get_int(L, m, "model", "parameters", 1, (int64_t)1 << 50, &v, NULL) == OK)
        p->model.parameters = v;
    if (get_int(L, m, "model", "hidden", 1, (int64_t)1 << 24, &v, NULL) == OK)
        p->model.hidden = v;
    double d = 0;
    bool b = false;
    if (get_float(L, m, "model", "mlp_ratio", 0.0, true, 1024.0, &d) == OK)
        p->model.mlp_ratio = d, p->model.structure_given = true;
    if (get_bool(L, m, "model", "mlp_gated", &b, NULL) == OK)
        p->model.mlp_gated = b, p->model.structure_given = true;
    static const char *const an[] = {"softmax", "linear"};
    fld fat;
    if (get_enum(L, m, "model", "attention", an, 2, &e, &fat) == OK) {
        p->model.linear_attention = e == 1;
        /* said at --check time, not first at `cpc -o` / cprun (compile.c refuses it) */
        if (e == 1)
            warn(L, fat.v->span,
                 "model.attention: linear is priced only: cpc's kernels compute softmax attention, "
                 "so `cpc -o` and cprun refuse this plan");
    }
    fld fds;
    if (get_int(L, m, "model", "dual_stream_layers", 0, MAX_COUNT, &v, &fds) == OK) {
        p->model.dual_stream_layers = (int)v;
        if (v > p->model.layers)
            err(L, 103, fds.v->span, "model.dual_stream_layers: %lld is more than model.layers (%d)",
                (long long)v, p->model.layers);
    }
    if (get_int(L, m, "model", "cross_attention_tokens", 0, MAX_TOKENS, &v, NULL) == OK)
        p->model.cross_attention_tokens = v, p->model.structure_given = true;
    if (get_int(L, m, "model", "experts", 1, 1 << 16, &v, NULL) == OK)
        p->model.experts = (int)v, p->model.structure_given = true;
    fld fae;
    if (get_int(L, m, "model", "active_experts", 1, 1 << 16, &v, &fae) == OK) {
        p->model.active_experts = (int)v, p->model.structure_given = true;
        if (v > (p->model.experts > 0 ? p->model.experts : 1))
            err(L, 103, fae.v->span, "model.active_experts: %lld is more than model.experts (%d)",
                (long long)v, p->model.experts > 0 ? p->model.experts : 1);
    }
    if (get_float(L, m, "model", "scale", 0.0, true, 1e30, &d) == OK) {
        p->model.scale = d;
        p->model.scale_given = true;
    } else if (p->model.head_dim > 0) {
        p->model.scale = 1.0 / sqrt((double)p->model.head_dim);
    }
}

/* One segment of input.segments (mapping `m` at `path`). */
static void load_segment(ld *L, const cpc_ynode *m, const char *path, int index)
{
    check_keys(L, m, path, K_SEGMENT, N(K_SEGMENT));
    const char *name = NULL;
    char defname[32];
    if (get_str(L, m, path, "name", &name) == ABSENT) {
        snprintf(defname, sizeof defname, "segment%d", index);
        name = defname;
    }
    static const char *const kinds[] = {"tokens", "image", "video"};
    fld f[3];
    int given = 0, which = -1;
    for (int i = 0; i < 3; i++) {
        if (field(m, path, kinds[i], &f[i])) {
            if (which >= 0)
                conflict(L, f[which].k, f[which].path, f[i].k, f[i].path,
                         "a segment is one of tokens, image or video");
            else
                which = i;
            given++;
        }
    }
    if (given == 0) {
        err(L, 104, m->span, "%s: a segment needs one of 'tokens', 'image' or 'video'", path);
        return;
    }
    /* split: shard (default) | replicate (SPEC section 1: held whole by every rank) */
    static const char *const splits[] = {"shard", "replicate"};
    int split = 0;
    (void)get_enum(L, m, path, "split", splits, 2, &split, NULL);
    if (given > 1 || !name)
        return;
    int64_t t = 0, px = 0, fr = 0;
    bool ok = which == 0 ? plain_tokens(L, &f[0], &t)
            : which == 1 ? image_tokens(L, &f[1], &t, &px)
                         : video_tokens(L, &f[2], &t, &fr, &px);
    if (ok)
    if (ok && add_segment_px(L, name, t, m->span, which == 0 ? CPC_SEG_TOKENS : which == 1 ? CPC_SEG_IMAGE : CPC_SEG_VIDEO,
                             which == 1 ? 1 : fr, px))
        L->plan->input.segments[L->plan->input.n_segments - 1].replicate = split == 1;
}

static void load_input(ld *L, const cpc_ynode *root, cpc_span root_at)
{
    cpc_plan *p = L->plan;
    bool present;
    fld fi;
    const cpc_ynode *m = get_map(L, root, "", "input", &present, &fi);
    if (!present) {
        missing(L, root_at, "", "input",
                "the tokens to attend over (input.tokens, input.image, input.video or "
                "input.segments)");
        return;
    }
    if (!m)
        return;
    check_keys(L, m, "input", K_INPUT, N(K_INPUT));
    int64_t v = 0;
    if (get_int(L, m, "input", "batch", 1, MAX_COUNT, &v, NULL) == OK)
        p->input.batch = (int)v;

    /* Exactly one of tokens / image / video / segments. */
    static const char *const kinds[] = {"tokens", "image", "video", "segments"};
    fld f[4];
    int which = -1, given = 0;
    for (int i = 0; i < 4; i++) {
        if (field(m, "input", kinds[i], &f[i])) {
            if (which >= 0)
                conflict(L, f[which].k, f[which].path, f[i].k, f[i].path,
                         "give the tokens one way: tokens, image, video or segments");
            else
                which = i;
            given++;
        }
    }
    if (given == 0) {
        missing(L, fi.k->span, "input", "segments",
                "the input needs tokens (input.tokens, input.image, input.video or "
                "input.segments)");
    } else if (given == 1) {
        int64_t t = 0, px = 0, fr = 0;
        if (which == 0 && plain_tokens(L, &f[0], &t))
            add_segment(L, "tokens", t, f[0].k->span);
        else if (which == 1 && image_tokens(L, &f[1], &t, &px))
            add_segment_px(L, "image", t, f[1].k->span, CPC_SEG_IMAGE, 1, px);
        else if (which == 2 && video_tokens(L, &f[2], &t, &fr, &px))
            add_segment_px(L, "video", t, f[2].k->span, CPC_SEG_VIDEO, fr, px);
        else if (which == 3) {
            const cpc_ynode *s = f[3].v;
            if (s->kind != CPC_YNODE_SEQUENCE) {
                type_error(L, &f[3], "a sequence of segments");
            } else if (s->n < 1 || s->n > CPC_MAX_SEGMENTS) {
                err(L, 103, s->span, "input.segments: %d segments (must be 1..%d)", s->n,
                    CPC_MAX_SEGMENTS);
            } else {
                for (int i = 0; i < s->n; i++) {
                    fld fs;
                    fs.k = NULL;
                    fs.v = s->vals[i];
                    snprintf(fs.path, sizeof fs.path, "input.segments[%d]", i);
                    record(L, fs.path, fs.v, fs.v);
                    if (fs.v->kind != CPC_YNODE_MAPPING) {
                        type_error(L, &fs, "a mapping {name, tokens | image | video}");
                        continue;
                    }
                    load_segment(L, fs.v, fs.path, i);
                }
                /* Segment names must be unique (diagnostics name segments). */
                for (int i = 0; i < p->input.n_segments; i++) {
                    for (int j = 0; j < i; j++) {
                        if (strcmp(p->input.segments[i].name, p->input.segments[j].name) == 0) {
                            char esc[96];
                            cpc_yaml_escape(p->input.segments[i].name,
                                            strlen(p->input.segments[i].name), esc, sizeof esc);
                            cpc_status *st = err(L, 105, p->input.segments[i].span,
                                                 "two segments are named '%s'", esc);
                            note(L, st, p->input.segments[j].span, "the first one is here");
                            cpc_status_set_hint(st, "give each segment its own name");
                            break;
                        }
                    }
                }
            }
        }
    }

    const char *mn[CPC_MASK__COUNT];
    for (int i = 0; i < CPC_MASK__COUNT; i++)
        mn[i] = cpc_mask_name((cpc_mask)i);
    int e = 0;
    if (get_enum(L, m, "input", "mask", mn, CPC_MASK__COUNT, &e, NULL) == OK)
        p->input.mask = (cpc_mask)e;
    const char *on[CPC_MODE__COUNT];
    for (int i = 0; i < CPC_MODE__COUNT; i++)
        on[i] = cpc_mode_name((cpc_mode)i);
    if (get_enum(L, m, "input", "mode", on, CPC_MODE__COUNT, &e, NULL) == OK)
        p->input.mode = (cpc_mode)e;
    if (get_int(L, m, "input", "steps", 1, MAX_COUNT, &v, NULL) == OK)
        p->input.steps = (int)v;

    fld fk;
    const cpc_ynode *kv = get_map(L, m, "input", "kv", &present, &fk);
    if (kv) {
        check_keys(L, kv, "input.kv", K_KV, N(K_KV));
        int r = get_int(L, kv, "input.kv", "tokens", 1, MAX_TOKENS, &v, NULL);
        if (r == ABSENT)
            missing(L, fk.k->span, "input.kv", "tokens", "the length of the key/value sequence");
        if (r == OK) {
            p->input.has_kv = true;
            p->input.kv_tokens = v;
        }
    }
}

static void load_cluster(ld *L, const cpc_ynode *root, cpc_span root_at)
{
    cpc_plan *p = L->plan;
    bool present;
    fld fc;
    const cpc_ynode *m = get_map(L, root, "", "cluster", &present, &fc);
    if (!present) {
        missing(L, root_at, "cluster", "world_size", "the number of ranks");
        return;
    }
    if (!m)
        return;
    check_keys(L, m, "cluster", K_CLUSTER, N(K_CLUSTER));
    int64_t v = 0;
    int r = get_int(L, m, "cluster", "world_size", 1, MAX_COUNT, &v, NULL);
    if (r == ABSENT)
        missing(L, fc.k->span, "cluster", "world_size", "the number of ranks");
    if (r == OK)
        p->cluster.world_size = (int)v;
    r = get_int(L, m, "cluster", "gpus_per_node", 1, MAX_COUNT, &v, NULL);
    if (r == OK)
        p->cluster.gpus_per_node = (int)v;
    else if (p->cluster.world_size > 0)
        p->cluster.gpus_per_node = p->cluster.world_size < 8 ? p->cluster.world_size : 8;
    int e = 0;
    if (get_enum(L, m, "cluster", "device", DEVICES, N(DEVICES), &e, NULL) == OK) {
        free(p->cluster.device);
        p->cluster.device = xstrdup(L, DEVICES[e]);
    }
    const char *s = NULL;
    if (get_str(L, m, "cluster", "profile", &s) == OK)
        p->cluster.profile = xstrdup(L, s);
    double d = 0;
    if (get_float(L, m, "cluster", "memory_gb", 0.0, true, 1048576.0, &d) == OK)
        p->cluster.memory_gb = d;
    if (get_float(L, m, "cluster", "reserved_gb", 0.0, false, 1048576.0, &d) == OK)
        p->cluster.reserved_gb = d;
}

static void load_parallel(ld *L, const cpc_ynode *root)
{
    cpc_plan *p = L->plan;
    bool present;
    const cpc_ynode *m = get_map(L, root, "", "parallel", &present, NULL);
    if (!m)
        return;
    check_keys(L, m, "parallel", K_PARALLEL, N(K_PARALLEL));
    const char *vn[CPC_VARIANT__COUNT];
    for (int i = 0; i < CPC_VARIANT__COUNT; i++)
        vn[i] = cpc_variant_name((cpc_variant)i);
    int e = 0;
    fld fvar = {0}, fr = {0}, fu = {0}, fua = {0}, fra = {0};
    int rv = get_enum(L, m, "parallel", "variant", vn, CPC_VARIANT__COUNT, &e, &fvar);
    if (rv == OK) {
        p->parallel.variant = (cpc_variant)e;
        p->parallel.variant_given = true;
    }
    int64_t v = 0;
    /* Degrees are stored as written, also 0 or negative: the validator
     * reports a degree < 1 as CP002 in its own stage, and tells "written"
     * from "omitted" (0) by the key span recorded here. */
    static const char *const dk[2] = {"ring_degree", "ulysses_degree"};
    int *dst[2] = {&p->parallel.ring_degree, &p->parallel.ulysses_degree};
    fld *fd[2] = {&fr, &fu};
    for (int i = 0; i < 2; i++) {
        if (!field(m, "parallel", dk[i], fd[i]))
            continue;
        if (want_int(L, fd[i], -MAX_COUNT, MAX_COUNT, &v) == OK)
            *dst[i] = (int)v;
        else
            fd[i]->k = NULL;
    }
    bool b = false;
    if (get_bool(L, m, "parallel", "ulysses_anything", &b, &fua) == OK)
        p->parallel.ulysses_anything = b;
    if (get_bool(L, m, "parallel", "ring_anything", &b, &fra) == OK)
        p->parallel.ring_anything = b;
    /* cfg_degree / tp_degree: an integer (stored as written, the validator
     * reports < 1 as CP002) or `auto` */
    static const char *const ak[2] = {"cfg_degree", "tp_degree"};
    int *adst[2] = {&p->parallel.cfg_degree, &p->parallel.tp_degree};
    for (int i = 0; i < 2; i++) {
        fld fa;
        if (!field(m, "parallel", ak[i], &fa))
            continue;
        const char *s = NULL;
        if (cpc_ynode_type(fa.v) == CPC_YTYPE_STRING && cpc_ynode_string(fa.v, &s) == CPC_YCONV_OK &&
            fa.v->len == 4 && memcmp(s, "auto", 4) == 0) {
            *adst[i] = CPC_DEGREE_AUTO;
            continue;
        }
        if (cpc_ynode_type(fa.v) == CPC_YTYPE_STRING) {
            type_error(L, &fa, "an integer or auto");
            continue;
        }
        if (want_int(L, &fa, -MAX_COUNT, MAX_COUNT, &v) == OK)
            *adst[i] = v == 0 ? 0 : (int)v;
    }
    const char *fn[CPC_FALLBACK__COUNT];
    for (int i = 0; i < CPC_FALLBACK__COUNT; i++)
        fn[i] = cpc_fallback_name((cpc_fallback)i);
    if (get_enum(L, m, "parallel", "fallback", fn, CPC_FALLBACK__COUNT, &e, NULL) == OK)
        p->parallel.fallback = (cpc_fallback)e;

    /* Conflicts (CP105, SPEC section 1). */
    if (p->parallel.ulysses_anything && p->parallel.ring_anything)
        conflict(L, fua.k, "parallel.ulysses_anything: true", fra.k, "parallel.ring_anything: true",
                 "choose one of the two variants");
    cpc_variant var = p->parallel.variant;
    if (p->parallel.variant_given) {
        char vs[64];
        snprintf(vs, sizeof vs, "parallel.variant: %s", cpc_variant_name(var));
        if (p->parallel.ulysses_anything && var != CPC_VARIANT_ULYSSES_ANYTHING)
            conflict(L, fvar.k, vs, fua.k, "parallel.ulysses_anything: true",
                     "the flag selects variant ulysses_anything");
        if (p->parallel.ring_anything && var != CPC_VARIANT_RING_ANYTHING)
            conflict(L, fvar.k, vs, fra.k, "parallel.ring_anything: true",
                     "the flag selects variant ring_anything");
        char ds[64];
        if (var == CPC_VARIANT_RING && p->parallel.ulysses_degree > 1 && fu.k) {
            snprintf(ds, sizeof ds, "parallel.ulysses_degree: %d", p->parallel.ulysses_degree);
            conflict(L, fvar.k, vs, fu.k, ds, "ring uses ulysses_degree 1 (unified uses both)");
        }
        if (var == CPC_VARIANT_ULYSSES && p->parallel.ring_degree > 1 && fr.k) {
            snprintf(ds, sizeof ds, "parallel.ring_degree: %d", p->parallel.ring_degree);
            conflict(L, fvar.k, vs, fr.k, ds, "ulysses uses ring_degree 1 (unified uses both)");
        }
    }
}

/* runtime: what the deployment runs (cost.h HOST, ATTENTION KERNELS, PIPELINE). */
static void load_runtime(ld *L, const cpc_ynode *root)
{
    cpc_plan *p = L->plan;
    bool present;
    const cpc_ynode *m = get_map(L, root, "", "runtime", &present, NULL);
    if (!m)
        return;
    check_keys(L, m, "runtime", K_RUNTIME, N(K_RUNTIME));
    const char *fn[CPC_FRAMEWORK__COUNT];
    for (int i = 0; i < CPC_FRAMEWORK__COUNT; i++)
        fn[i] = cpc_framework_name((cpc_framework)i);
    int e = 0;
    if (get_enum(L, m, "runtime", "framework", fn, CPC_FRAMEWORK__COUNT, &e, NULL) == OK)
        p->runtime.framework = (cpc_framework)e;
    const char *kn[CPC_KERNEL__COUNT];
    for (int i = 0; i < CPC_KERNEL__COUNT; i++)
        kn[i] = cpc_attn_kernel_name((cpc_attn_kernel)i);
    if (get_enum(L, m, "runtime", "attention_kernel", kn, CPC_KERNEL__COUNT, &e, NULL) == OK)
        p->runtime.attention_kernel = (cpc_attn_kernel)e;
    int64_t v = 0;
    if (get_int(L, m, "runtime", "text_encoder_parameters", 0, (int64_t)1 << 50, &v, NULL) == OK)
        p->runtime.text_encoder_parameters = v;
    static const char *const vn[] = {"none", "auto"};
    if (get_enum(L, m, "runtime", "vae", vn, 2, &e, NULL) == OK)
        p->runtime.vae = e == 1;
    if (get_int(L, m, "runtime", "vae_channels", 1, 4096, &v, NULL) == OK)
        p->runtime.vae_channels = (int)v;
    bool b = false;
    if (get_bool(L, m, "runtime", "vae_parallel", &b, NULL) == OK)
        p->runtime.vae_parallel = b;
    if (get_bool(L, m, "runtime", "vae_tiling", &b, NULL) == OK)
        p->runtime.vae_tiling = b;
    static const char *const cn[] = {"sequential", "batched"};
    if (get_enum(L, m, "runtime", "cfg", cn, 2, &e, NULL) == OK)
        p->runtime.cfg_batched = e == 1;
    const char *dn[CPC_DTYPE__COUNT];
    for (int i = 0; i < CPC_DTYPE__COUNT; i++)
        dn[i] = cpc_dtype_name((cpc_dtype)i);
    if (get_enum(L, m, "runtime", "vae_dtype", dn, CPC_DTYPE__COUNT, &e, NULL) == OK)
        p->runtime.vae_dtype = (cpc_dtype)e;
}

static void load_schedule(ld *L, const cpc_ynode *root)
{
    cpc_plan *p = L->plan;
    bool present;
    const cpc_ynode *m = get_map(L, root, "", "schedule", &present, NULL);
    if (!m)
        return;
    check_keys(L, m, "schedule", K_SCHEDULE, N(K_SCHEDULE));
    bool b = false;
    if (get_bool(L, m, "schedule", "overlap", &b, NULL) == OK)
        p->schedule.overlap = b;
    const char *rn[CPC_ROTATE__COUNT];
    for (int i = 0; i < CPC_ROTATE__COUNT; i++)
        rn[i] = cpc_rotate_name((cpc_rotate)i);
    int e = 0;
    if (get_enum(L, m, "schedule", "rotate", rn, CPC_ROTATE__COUNT, &e, NULL) == OK)
        p->schedule.rotate = (cpc_rotate)e;
    const char *s = NULL;
    if (get_str(L, m, "schedule", "script", &s) == OK)
        p->schedule.script = xstrdup(L, s);
}

/* "dir/flux.yaml" -> "flux". */
static char *file_stem(const char *file)
{
    const char *b = strrchr(file, '/');
    b = b ? b + 1 : file;
    const char *dot = strrchr(b, '.');
    size_t n = (dot && dot != b) ? (size_t)(dot - b) : strlen(b);
    if (n == 0)
        return strdup("plan");
    return strndup(b, n);
}

/* input.steps and the runtime keys are read by the whole-step cost model only
 * (cost.h WHOLE STEP): without model.parameters they change nothing, so one
 * warning, at the first of them, names every one present.  (runtime.
 * attention_kernel also prices attention alone, so it is not among them; the
 * model structure keys are as inert, but they describe the model, and
 * cpc.from_diffusers writes them whether or not it could count the weights.) */
static void warn_whole_step_keys(ld *L, const cpc_ynode *root)
{
    static const char *const keys[][2] = {
        {"input", "steps"},
        {"runtime", "framework"},   {"runtime", "text_encoder_parameters"},
        {"runtime", "vae"},         {"runtime", "vae_channels"},
        {"runtime", "vae_parallel"}, {"runtime", "vae_tiling"},
        {"runtime", "cfg"},         {"runtime", "vae_dtype"},
    };
    if (L->plan->model.parameters > 0 || !root || root->kind != CPC_YNODE_MAPPING)
        return;
    char names[512] = "";
    size_t o = 0;
    int n = 0;
    cpc_span first = {0};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        fld fs, fk;
        if (!field(root, "", keys[i][0], &fs) || !fs.v || fs.v->kind != CPC_YNODE_MAPPING ||
            !field(fs.v, keys[i][0], keys[i][1], &fk))
            continue;
        if (n++ == 0)
            first = fk.k->span;
        if (o < sizeof names - 64)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", n > 1 ? ", " : "", fk.path);
    }
    if (n > 0)
        warn(L, first,
             "%s %s no effect without model.parameters: cpc then predicts attention alone, not "
             "the whole step (set model.parameters, the transformer's weight count)",
             names, n > 1 ? "have" : "has");
}

static void load_root(ld *L, const cpc_ynode *root)
{
    cpc_plan *p = L->plan;
    cpc_span top = {p->file, 1, 1};
    if (!root) {
        cpc_status *st = err(L, 104, top, "the plan file is empty");
        cpc_status_set_hint(st, "a plan needs at least version: 1, model (heads, head_dim), "
                                "input (tokens) and cluster (world_size)");
        return;
    }
    if (root->kind != CPC_YNODE_MAPPING) {
        fld f = {NULL, root, "the plan"};
        type_error(L, &f, "a mapping of keys (version, model, input, cluster, ...)");
        return;
    }
    top = root->span;
    check_keys(L, root, "", K_TOP, N(K_TOP));

    int64_t v = 0;
    fld fv;
    int r = get_int(L, root, "", "version", INT64_MIN, INT64_MAX, &v, &fv);
    if (r == ABSENT)
        missing(L, top, "", "version", "write version: 1");
    else if (r == OK && v != 1)
        err(L, 103, fv.v->span, "version: %lld is not supported (this cpc reads version 1)",
            (long long)v);
    p->version = 1;

    const char *name = NULL;
    if (get_str(L, root, "", "name", &name) == OK)
        p->name = xstrdup(L, name);

    load_model(L, root, top);
    load_input(L, root, top);
    load_cluster(L, root, top);
    load_parallel(L, root);
    load_schedule(L, root);
    load_runtime(L, root);
    warn_whole_step_keys(L, root);
}

/* ======================================================================== */
/* --set                                                                    */
/* ======================================================================== */

/* A usage error about a --set argument. */
static void set_usage(ld *L, int ordinal, const char *arg, int col, const char *what)
{
    char esc[128];
    cpc_yaml_escape(arg, strlen(arg), esc, sizeof esc);
    cpc_status *st = cpc_diag(CPC_E_USAGE, 0, CPC_SEV_ERROR,
                              (cpc_span){CPC_SET_FILE, ordinal, col}, "--set '%s': %s", esc, what);
    if (st == &cpc_status_oom) {
        set_oom(L);
        return;
    }
    cpc_status_set_hint(st, "write --set KEY=VALUE with a dotted KEY such as cluster.world_size "
                            "or input.segments[1].tokens");
    L->error = true;
    append(L, st);
}

/* A usage error about an index of a --set KEY (exit status 2, like a
 * malformed KEY), with its own hint (NULL: none). */
static void set_index_usage(ld *L, int ordinal, int col, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void set_index_usage(ld *L, int ordinal, int col, const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = cpc_diagv(CPC_E_USAGE, 0, CPC_SEV_ERROR, (cpc_span){CPC_SET_FILE, ordinal, col}, fmt, ap);
    va_end(ap);
    if (st == &cpc_status_oom) {
        set_oom(L);
        return;
    }
    if (hint)
        cpc_status_set_hint(st, "%s", hint);
    L->error = true;
    append(L, st);
}

/* One path component: name (pointer + length + column) and up to 8 indices. */
typedef struct comp {
    const char *name;
    size_t len;
    int col;
    int n_idx;
    long idx[8];
    int idx_col[8];
} comp;

#define MAX_SET_COMPONENTS CPC_YAML_MAX_DEPTH

/* Parses "a.b[1].c" (the part before '=') into components.  False on a
 * malformed key (reported). */
static bool parse_set_key(ld *L, int ordinal, const char *arg, size_t klen, comp *c, int *nc)
{
    size_t i = 0;
    *nc = 0;
    for (;;) {
        if (*nc >= MAX_SET_COMPONENTS) {
            set_usage(L, ordinal, arg, (int)i + 1, "too many key components");
            return false;
        }
        comp *k = &c[(*nc)++];
        k->name = arg + i;
        k->col = (int)i + 1;
        k->n_idx = 0;
        while (i < klen && arg[i] != '.' && arg[i] != '[' && arg[i] != ']')
            i++;
        k->len = (size_t)(arg + i - k->name);
        if (k->len == 0) {
            set_usage(L, ordinal, arg, k->col, "empty key component");
            return false;
        }
        while (i < klen && arg[i] == '[') {
            int c0 = (int)i + 1;
            i++;
            long n = 0;
            size_t d0 = i;
            while (i < klen && arg[i] >= '0' && arg[i] <= '9') {
                n = n * 10 + (arg[i] - '0');
                if (n > 1000000000L) {
                    set_usage(L, ordinal, arg, c0, "index too large");
                    return false;
                }
                i++;
            }
            if (i == d0 || i >= klen || arg[i] != ']' || k->n_idx >= 8) {
                set_usage(L, ordinal, arg, c0, "malformed [index]");
                return false;
            }
            i++;
            k->idx_col[k->n_idx] = c0;
            k->idx[k->n_idx++] = n;
        }
        if (i == klen)
            return true;
        if (arg[i] != '.') {
            set_usage(L, ordinal, arg, (int)i + 1, "unexpected character in KEY");
            return false;
        }
        i++;
        if (i == klen) {
            set_usage(L, ordinal, arg, (int)i, "KEY ends with '.'");
            return false;
        }
    }
}

/* Applies one --set argument to `tree` (its root may be NULL). */
static void apply_set(ld *L, cpc_ytree *tree, const char *arg, int ordinal)
{
    const char *eq = strchr(arg, '=');
    if (!eq) {
        set_usage(L, ordinal, arg, 1, "expected KEY=VALUE");
        return;
    }
    size_t klen = (size_t)(eq - arg);
    comp *c = calloc(MAX_SET_COMPONENTS, sizeof *c);
    if (!c) {
        set_oom(L);
        return;
    }
    int nc = 0;
    if (klen == 0) {
        set_usage(L, ordinal, arg, 1, "empty KEY");
        free(c);
        return;
    }
    if (!parse_set_key(L, ordinal, arg, klen, c, &nc)) {
        free(c);
        return;
    }
    const char *sf = cpc_ytree_intern_file(tree, CPC_SET_FILE);
    if (!sf) {
        set_oom(L);
        free(c);
        return;
    }
    /* The value, parsed as YAML at its place in the argument. */
    const char *val = eq + 1;
    int vcol = (int)klen + 2;
    cpc_ytree *vt = NULL;
    cpc_status *vst = cpc_ytree_parse_string_at(val, strlen(val), CPC_SET_FILE, ordinal, vcol, &vt);
    if (vst && cpc_status_has_error(vst)) {
        take(L, vst);
        cpc_ytree_free(vt);
        free(c);
        return;
    }
    take(L, vst);
    cpc_ynode *value = NULL;
    if (vt && vt->root) {
        if (vt->root->kind != CPC_YNODE_SCALAR && !vt->root->flow) {
            err(L, 102, vt->root->span,
                "--set value must be a scalar or a flow collection ({...} or [...])");
            cpc_ytree_free(vt);
            free(c);
            return;
        }
        value = cpc_ytree_adopt(tree, vt);
        if (!value) {
            set_oom(L);
            free(c);
            return;
        }
    } else {
        cpc_ytree_free(vt);
        value = cpc_ynode_new_scalar("", 0, CPC_YSTYLE_PLAIN, (cpc_span){sf, ordinal, vcol});
        if (!value) {
            set_oom(L);
            free(c);
            return;
        }
    }

    if (!tree->root) {
        tree->root = cpc_ynode_new_mapping(false, (cpc_span){sf, ordinal, 1});
        if (!tree->root) {
            set_oom(L);
            cpc_ynode_free(value);
            free(c);
            return;
        }
    }
    cpc_ynode *cur = tree->root;
    char path[PATHLEN] = "";
    for (int i = 0; i < nc; i++) {
        comp *k = &c[i];
        cpc_span ksp = {sf, ordinal, k->col};
        char esc[96];
        cpc_yaml_escape(k->name, k->len, esc, sizeof esc);
        size_t pl = strlen(path);
        snprintf(path + pl, sizeof path - pl, "%s%s", pl ? "." : "", esc);
        if (cur->kind != CPC_YNODE_MAPPING) {
            char d[160];
            cpc_ynode_describe(cur, d, sizeof d);
            err(L, 102, ksp, "--set: cannot set '%s': its parent is %s, not a mapping", path, d);
            break;
        }
        bool last = i == nc - 1 && k->n_idx == 0;
        if (last) {
            cpc_ynode *key = cpc_ynode_new_scalar(k->name, k->len, CPC_YSTYLE_PLAIN, ksp);
            if (!key || !cpc_ynode_map_put(cur, key, value))
                set_oom(L);
            value = NULL;
            break;
        }
        int at = -1;
        for (int j = 0; j < cur->n; j++)
            if (cur->keys[j]->len == k->len && memcmp(cur->keys[j]->str, k->name, k->len) == 0)
                at = j;
        if (at < 0) {
            if (k->n_idx > 0) {
                /* input.segments[N] on a plan written with a shorthand */
                char hint[160] = "";
                static const char *const shorthands[] = {"tokens", "image", "video"};
                for (int sh = 0; sh < 3 && strcmp(path, "input.segments") == 0; sh++)
                    for (int j = 0; j < cur->n; j++)
                        if (cur->keys[j]->len == strlen(shorthands[sh]) &&
                            memcmp(cur->keys[j]->str, shorthands[sh], cur->keys[j]->len) == 0)
                            snprintf(hint, sizeof hint,
                                     "the plan's input is the input.%s shorthand (one segment): "
                                     "set input.%s%s instead", shorthands[sh], shorthands[sh],
                                     sh == 0 ? "" : ".KEY");
                set_index_usage(L, ordinal, k->col, hint[0] ? hint : NULL,
                                "--set '%.*s': '%s' does not exist, so it has no element [%ld]",
                                (int)klen, arg, path, k->idx[0]);
                break;
            }
            cpc_ynode *key = cpc_ynode_new_scalar(k->name, k->len, CPC_YSTYLE_PLAIN, ksp);
            cpc_ynode *map = cpc_ynode_new_mapping(false, ksp);
            if (!key || !map) {
                cpc_ynode_free(key);
                cpc_ynode_free(map);
                set_oom(L);
                break;
            }
            if (!cpc_ynode_map_put(cur, key, map)) {
                set_oom(L);
                break;
            }
            cur = map;
            continue;
        }
        cur = cur->vals[at];
        bool stop = false;
        for (int x = 0; x < k->n_idx; x++) {
            cpc_span isp = {sf, ordinal, k->idx_col[x]};
            if (cur->kind != CPC_YNODE_SEQUENCE) {
                char d[160];
                cpc_ynode_describe(cur, d, sizeof d);
                err(L, 102, isp, "--set: '%s' is %s, not a sequence, so it has no element [%ld]",
                    path, d, k->idx[x]);
                stop = true;
                break;
            }
            if (k->idx[x] >= cur->n) {
                if (cur->n == 0)
                    set_index_usage(L, ordinal, k->idx_col[x], NULL,
                                    "--set '%.*s': '%s' is empty, so [%ld] is out of range", (int)klen, arg,
                                    path, k->idx[x]);
                else
                    set_index_usage(L, ordinal, k->idx_col[x], NULL,
                                    "--set '%.*s': '%s' has %d element%s, so [%ld] is out of range "
                                    "(valid: %s0..%d)",
                                    (int)klen, arg, path, cur->n, cur->n == 1 ? "" : "s", k->idx[x],
                                    cur->n == 1 ? "only " : "", cur->n - 1);
                stop = true;
                break;
            }
            pl = strlen(path);
            snprintf(path + pl, sizeof path - pl, "[%ld]", k->idx[x]);
            if (i == nc - 1 && x == k->n_idx - 1) {
                if (!cpc_ynode_seq_set(cur, (int)k->idx[x], value))
                    set_oom(L);
                value = NULL;
                stop = true;
                break;
            }
            cur = cur->vals[k->idx[x]];
        }
        if (stop)
            break;
    }
    cpc_ynode_free(value);
    free(c);
}

/* ======================================================================== */
/* driver                                                                   */
/* ======================================================================== */

static int span_group(const cpc_status *s)
{
    if (!s->span.file || s->span.line <= 0)
        return 0;
    return strcmp(s->span.file, CPC_SET_FILE) == 0 ? 2 : 1;
}

/* Stable sort of the chain by position, plan file first, then --set. */
static cpc_status *sort_diags(cpc_status *list)
{
    return cpc_status_sort(list, span_group);
}

static cpc_plan *new_plan(const char *file)
{
    cpc_plan *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->file = strdup(file);
    p->cluster.device = strdup("h100-sxm");
    if (!p->file || !p->cluster.device) {
        cpc_plan_free(p);
        return NULL;
    }
    p->version = 1;
    p->model.dtype = CPC_DTYPE_BF16;
    p->model.layers = 1;
    p->input.batch = 1;
    p->input.mask = CPC_MASK_NONE;
    p->input.mode = CPC_MODE_INFERENCE;
    p->parallel.variant = CPC_VARIANT_AUTO;
    p->parallel.fallback = CPC_FALLBACK_STRICT;
    p->schedule.overlap = true;
    p->schedule.rotate = CPC_ROTATE_P2P;
    p->runtime.text_encoder_parameters = -1;
    p->runtime.vae = true;
    return p;
}

/* Takes the parse result (tree and its diagnostics) and finishes. */
static cpc_status *load_tree(const char *file, cpc_ytree *tree, cpc_status *parse_diags,
                             const char *const *sets, int n_sets, cpc_plan **out)
{
    *out = NULL;
    ld L = {0};
    L.plan = new_plan(file);
    if (!L.plan) {
        cpc_status_free(parse_diags);
        cpc_ytree_free(tree);
        return &cpc_status_oom;
    }
    take(&L, parse_diags);
    if (tree) {
        for (int i = 0; i < n_sets && !L.oom; i++)
            if (sets && sets[i])
                apply_set(&L, tree, sets[i], i + 1);
        if (n_sets > 0 && cpc_ynode_depth(tree->root) > CPC_YAML_MAX_DEPTH)
            err(&L, 106, (cpc_span){CPC_SET_FILE, 1, 1},
                "--set makes the plan nested deeper than %d levels", CPC_YAML_MAX_DEPTH);
        else if (!L.oom)
            load_root(&L, tree->root);
        cpc_ytree_free(tree);
    }
    if (!L.oom && !L.error && !L.plan->name) {
        L.plan->name = file_stem(file);
        if (!L.plan->name)
            set_oom(&L);
    }
    if (!L.oom && !L.error) {
        int64_t S = 0;
        for (int i = 0; i < L.plan->input.n_segments; i++)
            S += L.plan->input.segments[i].tokens; /* <= 64 * (2^31-1): no overflow */
        L.plan->input.total_tokens = S;
    }
    cpc_status *diags = sort_diags(L.diags);
    if (L.oom)
        cpc_status_append(&diags, &cpc_status_oom);
    if (L.error || L.oom) {
        cpc_plan_free(L.plan);
        return diags;
    }
    *out = L.plan;
    return diags;
}

cpc_status *cpc_plan_load_string(const char *text, size_t len, const char *file,
                                 const char *const *sets, int n_sets, cpc_plan **out)
{
    *out = NULL;
    if (!file)
        file = "<string>";
    cpc_ytree *tree = NULL;
    cpc_status *st = cpc_ytree_parse_string(text, len, file, &tree);
    return load_tree(file, tree, st, sets, n_sets, out);
}

cpc_status *cpc_plan_load_file(const char *path, const char *const *sets, int n_sets,
                               cpc_plan **out)
{
    *out = NULL;
    cpc_ytree *tree = NULL;
    cpc_status *st = cpc_ytree_parse_file(path, &tree);
    for (cpc_status *s = st; s; s = s->next)
        if (s->code == CPC_E_IO || s->code == CPC_E_NOMEM) {
            cpc_ytree_free(tree);
            return st;
        }
    return load_tree(path, tree, st, sets, n_sets, out);
}
