/* yaml_tree.c - see yaml_tree.h.  Builds the tree from libyaml events. */
#include "yaml_tree.h"
#include "fileio.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

/* ======================================================================== */
/* nodes                                                                    */
/* ======================================================================== */

static cpc_ynode *node_new(cpc_ynode_kind kind, cpc_span span)
{
    cpc_ynode *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->kind = kind;
    n->span = span;
    return n;
}

cpc_ynode *cpc_ynode_new_scalar(const char *s, size_t len, cpc_ystyle style, cpc_span span)
{
    cpc_ynode *n = node_new(CPC_YNODE_SCALAR, span);
    if (!n)
        return NULL;
    n->str = malloc(len + 1);
    if (!n->str) {
        free(n);
        return NULL;
    }
    if (len)
        memcpy(n->str, s, len);
    n->str[len] = 0;
    n->len = len;
    n->style = style;
    return n;
}

cpc_ynode *cpc_ynode_new_mapping(bool flow, cpc_span span)
{
    cpc_ynode *n = node_new(CPC_YNODE_MAPPING, span);
    if (n)
        n->flow = flow;
    return n;
}

cpc_ynode *cpc_ynode_new_sequence(bool flow, cpc_span span)
{
    cpc_ynode *n = node_new(CPC_YNODE_SEQUENCE, span);
    if (n)
        n->flow = flow;
    return n;
}

void cpc_ynode_free(cpc_ynode *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->n; i++) {
        if (n->keys)
            cpc_ynode_free(n->keys[i]);
        cpc_ynode_free(n->vals[i]);
    }
    free(n->keys);
    free(n->vals);
    free(n->str);
    free(n);
}

/* Makes room for one more entry.  False on OOM or size overflow. */
static bool grow(cpc_ynode *c)
{
    if (c->n < c->cap)
        return true;
    if (c->cap > (1 << 28))
        return false;
    int cap = c->cap ? c->cap * 2 : 4;
    cpc_ynode **v = realloc(c->vals, (size_t)cap * sizeof *v);
    if (!v)
        return false;
    c->vals = v;
    if (c->kind == CPC_YNODE_MAPPING) {
        cpc_ynode **k = realloc(c->keys, (size_t)cap * sizeof *k);
        if (!k)
            return false;
        c->keys = k;
    }
    c->cap = cap;
    return true;
}

static bool scalar_eq(const cpc_ynode *k, const char *s, size_t len)
{
    return k && k->kind == CPC_YNODE_SCALAR && k->len == len && memcmp(k->str, s, len) == 0;
}

static int find_len(const cpc_ynode *map, const char *s, size_t len)
{
    if (!map || map->kind != CPC_YNODE_MAPPING)
        return -1;
    for (int i = 0; i < map->n; i++)
        if (scalar_eq(map->keys[i], s, len))
            return i;
    return -1;
}

bool cpc_ynode_map_put(cpc_ynode *map, cpc_ynode *key, cpc_ynode *value)
{
    if (!map || map->kind != CPC_YNODE_MAPPING || !key || key->kind != CPC_YNODE_SCALAR) {
        cpc_ynode_free(key);
        cpc_ynode_free(value);
        return false;
    }
    int i = find_len(map, key->str, key->len);
    if (i >= 0) {
        cpc_ynode_free(map->keys[i]);
        cpc_ynode_free(map->vals[i]);
        map->keys[i] = key;
        map->vals[i] = value;
        return true;
    }
    if (!grow(map)) {
        cpc_ynode_free(key);
        cpc_ynode_free(value);
        return false;
    }
    map->keys[map->n] = key;
    map->vals[map->n] = value;
    map->n++;
    return true;
}

bool cpc_ynode_seq_append(cpc_ynode *seq, cpc_ynode *item)
{
    if (!seq || seq->kind != CPC_YNODE_SEQUENCE || !grow(seq)) {
        cpc_ynode_free(item);
        return false;
    }
    seq->vals[seq->n++] = item;
    return true;
}

bool cpc_ynode_seq_set(cpc_ynode *seq, int i, cpc_ynode *item)
{
    if (!seq || seq->kind != CPC_YNODE_SEQUENCE || i < 0 || i >= seq->n) {
        cpc_ynode_free(item);
        return false;
    }
    cpc_ynode_free(seq->vals[i]);
    seq->vals[i] = item;
    return true;
}

int cpc_ynode_depth(const cpc_ynode *n)
{
    if (!n || n->kind == CPC_YNODE_SCALAR)
        return 0;
    int d = 0;
    for (int i = 0; i < n->n; i++) {
        int c = cpc_ynode_depth(n->vals[i]);
        if (c > d)
            d = c;
    }
    return d + 1;
}

/* ======================================================================== */
/* trees                                                                    */
/* ======================================================================== */

void cpc_ytree_free(cpc_ytree *tree)
{
    if (!tree)
        return;
    cpc_ynode_free(tree->root);
    for (int i = 0; i < tree->n_files; i++)
        free(tree->files[i]);
    free(tree->files);
    free(tree);
}

static bool add_file_ptr(cpc_ytree *t, char *s)
{
    char **f = realloc(t->files, (size_t)(t->n_files + 1) * sizeof *f);
    if (!f)
        return false;
    t->files = f;
    t->files[t->n_files++] = s;
    return true;
}

const char *cpc_ytree_intern_file(cpc_ytree *tree, const char *name)
{
    if (!tree || !name)
        return NULL;
    for (int i = 0; i < tree->n_files; i++)
        if (strcmp(tree->files[i], name) == 0)
            return tree->files[i];
    char *s = strdup(name);
    if (!s)
        return NULL;
    if (!add_file_ptr(tree, s)) {
        free(s);
        return NULL;
    }
    return s;
}

cpc_ynode *cpc_ytree_adopt(cpc_ytree *dst, cpc_ytree *src)
{
    if (!src)
        return NULL;
    cpc_ynode *root = src->root;
    src->root = NULL;
    bool ok = true;
    for (int i = 0; i < src->n_files; i++) {
        if (ok && add_file_ptr(dst, src->files[i])) {
            src->files[i] = NULL;
        } else {
            ok = false;
        }
    }
    if (!ok) {
        cpc_ynode_free(root);
        root = NULL;
    }
    cpc_ytree_free(src);
    return root;
}

/* ======================================================================== */
/* reading                                                                  */
/* ======================================================================== */

int cpc_ynode_find(const cpc_ynode *map, const char *key)
{
    return key ? find_len(map, key, strlen(key)) : -1;
}

const cpc_ynode *cpc_ynode_get2(const cpc_ynode *map, const char *key,
                                const cpc_ynode **key_node)
{
    int i = cpc_ynode_find(map, key);
    if (key_node)
        *key_node = i >= 0 ? map->keys[i] : NULL;
    return i >= 0 ? map->vals[i] : NULL;
}

const cpc_ynode *cpc_ynode_get(const cpc_ynode *map, const char *key)
{
    return cpc_ynode_get2(map, key, NULL);
}

int cpc_ynode_count(const cpc_ynode *n)
{
    return (n && n->kind != CPC_YNODE_SCALAR) ? n->n : 0;
}

const cpc_ynode *cpc_ynode_key(const cpc_ynode *map, int i)
{
    if (!map || map->kind != CPC_YNODE_MAPPING || i < 0 || i >= map->n)
        return NULL;
    return map->keys[i];
}

const cpc_ynode *cpc_ynode_value(const cpc_ynode *map, int i)
{
    if (!map || map->kind != CPC_YNODE_MAPPING || i < 0 || i >= map->n)
        return NULL;
    return map->vals[i];
}

const cpc_ynode *cpc_ynode_item(const cpc_ynode *seq, int i)
{
    if (!seq || seq->kind != CPC_YNODE_SEQUENCE || i < 0 || i >= seq->n)
        return NULL;
    return seq->vals[i];
}

bool cpc_ynode_is(const cpc_ynode *n, const char *s)
{
    return s && scalar_eq(n, s, strlen(s));
}

/* ======================================================================== */
/* typing                                                                   */
/* ======================================================================== */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool eq(const cpc_ynode *n, const char *s)
{
    return strlen(s) == n->len && memcmp(n->str, s, n->len) == 0;
}

/* [-+]?[0-9]+ */
static bool text_is_int(const char *s, size_t len)
{
    size_t i = 0;
    if (i < len && (s[i] == '-' || s[i] == '+'))
        i++;
    if (i == len)
        return false;
    for (; i < len; i++)
        if (!is_digit(s[i]))
            return false;
    return true;
}

/* [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?  or .inf/.nan forms */
static bool text_is_float(const char *s, size_t len)
{
    size_t i = 0;
    if (i < len && (s[i] == '-' || s[i] == '+'))
        i++;
    const char *r = s + i;
    size_t rl = len - i;
    static const char *const infs[] = {".inf", ".Inf", ".INF"};
    for (int k = 0; k < 3; k++)
        if (rl == 4 && memcmp(r, infs[k], 4) == 0)
            return true;
    if (i == 0) {
        static const char *const nans[] = {".nan", ".NaN", ".NAN"};
        for (int k = 0; k < 3; k++)
            if (len == 4 && memcmp(s, nans[k], 4) == 0)
                return true;
    }
    size_t d0 = i;
    while (i < len && is_digit(s[i]))
        i++;
    size_t nint = i - d0;
    size_t nfrac = 0;
    if (i < len && s[i] == '.') {
        i++;
        size_t f0 = i;
        while (i < len && is_digit(s[i]))
            i++;
        nfrac = i - f0;
    } else if (nint == 0) {
        return false;
    }
    if (nint == 0 && nfrac == 0)
        return false;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '-' || s[i] == '+'))
            i++;
        size_t e0 = i;
        while (i < len && is_digit(s[i]))
            i++;
        if (i == e0)
            return false;
    }
    return i == len;
}

static bool is_null_text(const cpc_ynode *n)
{
    return n->len == 0 || eq(n, "~") || eq(n, "null") || eq(n, "Null") || eq(n, "NULL");
}

cpc_ytype cpc_ynode_type(const cpc_ynode *n)
{
    if (!n)
        return CPC_YTYPE_NULL;
    if (n->kind == CPC_YNODE_MAPPING)
        return CPC_YTYPE_MAPPING;
    if (n->kind == CPC_YNODE_SEQUENCE)
        return CPC_YTYPE_SEQUENCE;
    if (n->style != CPC_YSTYLE_PLAIN)
        return CPC_YTYPE_STRING;
    if (is_null_text(n))
        return CPC_YTYPE_NULL;
    if (eq(n, "true") || eq(n, "false"))
        return CPC_YTYPE_BOOL;
    if (text_is_int(n->str, n->len))
        return CPC_YTYPE_INT;
    if (text_is_float(n->str, n->len))
        return CPC_YTYPE_FLOAT;
    return CPC_YTYPE_STRING;
}

const char *cpc_ytype_name(cpc_ytype t)
{
    static const char *const names[CPC_YTYPE__COUNT] = {
        [CPC_YTYPE_NULL] = "null",       [CPC_YTYPE_BOOL] = "boolean",
        [CPC_YTYPE_INT] = "integer",     [CPC_YTYPE_FLOAT] = "float",
        [CPC_YTYPE_STRING] = "string",   [CPC_YTYPE_MAPPING] = "mapping",
        [CPC_YTYPE_SEQUENCE] = "sequence",
    };
    return (t >= 0 && t < CPC_YTYPE__COUNT) ? names[t] : "?";
}

cpc_yconv cpc_ynode_int(const cpc_ynode *n, int64_t *out)
{
    if (cpc_ynode_type(n) != CPC_YTYPE_INT)
        return CPC_YCONV_TYPE;
    const char *s = n->str;
    size_t i = 0;
    bool neg = false;
    if (s[0] == '-' || s[0] == '+') {
        neg = s[0] == '-';
        i = 1;
    }
    /* Accumulate negatively so that INT64_MIN is representable. */
    int64_t v = 0;
    for (; i < n->len; i++) {
        int d = s[i] - '0';
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_sub_overflow(v, d, &v))
            return CPC_YCONV_RANGE;
    }
    if (!neg) {
        if (v == INT64_MIN)
            return CPC_YCONV_RANGE;
        v = -v;
    }
    *out = v;
    return CPC_YCONV_OK;
}

cpc_yconv cpc_ynode_bool(const cpc_ynode *n, bool *out)
{
    if (cpc_ynode_type(n) != CPC_YTYPE_BOOL)
        return CPC_YCONV_TYPE;
    *out = n->str[0] == 't';
    return CPC_YCONV_OK;
}

cpc_yconv cpc_ynode_float(const cpc_ynode *n, double *out)
{
    cpc_ytype t = cpc_ynode_type(n);
    if (t != CPC_YTYPE_INT && t != CPC_YTYPE_FLOAT)
        return CPC_YCONV_TYPE;
    const char *s = n->str;
    size_t len = n->len;
    bool neg = s[0] == '-';
    const char *r = (s[0] == '-' || s[0] == '+') ? s + 1 : s;
    if (r[0] == '.' && (r[1] == 'i' || r[1] == 'I')) {
        *out = neg ? -INFINITY : INFINITY;
        return CPC_YCONV_OK;
    }
    if (r[0] == '.' && (r[1] == 'n' || r[1] == 'N')) {
        *out = NAN;
        return CPC_YCONV_OK;
    }
    /* strtod in the C locale would also accept hex and "inf": the text was
     * already checked against the core-schema pattern above.  Copy it so that
     * strtod stops at its end. */
    char buf[128];
    char *tmp = len < sizeof buf ? buf : malloc(len + 1);
    if (!tmp)
        return CPC_YCONV_RANGE;
    memcpy(tmp, s, len);
    tmp[len] = 0;
    errno = 0;
    char *end = NULL;
    double v = strtod(tmp, &end);
    int err = errno;
    if (tmp != buf)
        free(tmp);
    if (err == ERANGE && isinf(v))
        return CPC_YCONV_RANGE;
    *out = v; /* underflow to 0 or a denormal is accepted */
    return CPC_YCONV_OK;
}

cpc_yconv cpc_ynode_string(const cpc_ynode *n, const char **out)
{
    if (cpc_ynode_type(n) != CPC_YTYPE_STRING)
        return CPC_YCONV_TYPE;
    *out = n->str;
    return CPC_YCONV_OK;
}

const char *cpc_yaml_escape(const char *s, size_t len, char *buf, size_t size)
{
    size_t o = 0;
    if (size < 8) {
        if (size)
            buf[0] = 0;
        return buf;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        size_t k;
        if (c == '\n')
            k = (size_t)snprintf(tmp, sizeof tmp, "\\n");
        else if (c == '\t')
            k = (size_t)snprintf(tmp, sizeof tmp, "\\t");
        else if (c == '\\' || c == '"' || c == '\'')
            k = (size_t)snprintf(tmp, sizeof tmp, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            k = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
        else {
            tmp[0] = (char)c;
            k = 1;
        }
        if (o + k + 4 > size) { /* room for "..." and NUL */
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, tmp, k);
        o += k;
    }
    buf[o] = 0;
    return buf;
}

static bool all_digits_underscores(const char *s, size_t len, bool *has_us)
{
    size_t i = 0;
    *has_us = false;
    if (i < len && (s[i] == '-' || s[i] == '+'))
        i++;
    if (i == len || !is_digit(s[i]))
        return false;
    for (; i < len; i++) {
        if (s[i] == '_')
            *has_us = true;
        else if (!is_digit(s[i]) && s[i] != '.')
            return false;
    }
    return true;
}

static bool is_yaml11_bool(const cpc_ynode *n)
{
    static const char *const words[] = {
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON",
        "off", "Off", "OFF",
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (eq(n, words[i]))
            return true;
    return false;
}

const char *cpc_ynode_describe(const cpc_ynode *n, char *buf, size_t size)
{
    char esc[96];
    if (size == 0)
        return buf;
    if (!n) {
        snprintf(buf, size, "nothing");
        return buf;
    }
    if (n->kind == CPC_YNODE_MAPPING) {
        snprintf(buf, size, "a mapping");
        return buf;
    }
    if (n->kind == CPC_YNODE_SEQUENCE) {
        snprintf(buf, size, "a sequence");
        return buf;
    }
    cpc_yaml_escape(n->str, n->len, esc, sizeof esc);
    if (n->style == CPC_YSTYLE_SINGLE_QUOTED || n->style == CPC_YSTYLE_DOUBLE_QUOTED) {
        snprintf(buf, size, "quoted string \"%s\"", esc);
        return buf;
    }
    if (n->style != CPC_YSTYLE_PLAIN) {
        snprintf(buf, size, "block string \"%s\"", esc);
        return buf;
    }
    bool us = false;
    switch (cpc_ynode_type(n)) {
    case CPC_YTYPE_NULL:
        /* "null ~", "null (empty value)", but plain "null" for null itself */
        snprintf(buf, size, !n->len ? "null (empty value)%s" : strcasecmp(esc, "null") == 0 ? "null" : "null %s",
                 esc);
        break;
    case CPC_YTYPE_BOOL: snprintf(buf, size, "boolean %s", esc); break;
    case CPC_YTYPE_INT: snprintf(buf, size, "integer %s", esc); break;
    case CPC_YTYPE_FLOAT: snprintf(buf, size, "float %s", esc); break;
    default: {
        const char *s = n->str;
        size_t len = n->len;
        const char *r = (len && (s[0] == '-' || s[0] == '+')) ? s + 1 : s;
        size_t rl = len - (size_t)(r - s);
        if (rl > 2 && r[0] == '0' && (r[1] == 'x' || r[1] == 'X'))
            snprintf(buf, size, "hexadecimal number %s (only plain decimal integers are accepted)", esc);
        else if (rl > 2 && r[0] == '0' && (r[1] == 'o' || r[1] == 'O'))
            snprintf(buf, size, "octal number %s (only plain decimal integers are accepted)", esc);
        else if (all_digits_underscores(s, len, &us) && us)
            snprintf(buf, size, "number with underscores %s (write it without underscores)", esc);
        else if (is_yaml11_bool(n))
            snprintf(buf, size, "%s (a YAML 1.1 boolean: write true or false)", esc);
        else if (eq(n, "True") || eq(n, "TRUE") || eq(n, "False") || eq(n, "FALSE"))
            snprintf(buf, size, "%s (booleans are lowercase: write true or false)", esc);
        else
            snprintf(buf, size, "string '%s'", esc);
    }
    }
    return buf;
}

/* ======================================================================== */
/* parsing                                                                  */
/* ======================================================================== */

typedef struct frame {
    cpc_ynode *node;     /* the open collection (already attached to its parent) */
    cpc_ynode *pending;  /* mapping: key waiting for its value (owned here) */
} frame;

typedef struct builder {
    const char *file;    /* interned in tree */
    int line0, col0;     /* position of text[0] (1-based) */
    const char *text;
    size_t len;
    cpc_ytree *tree;
    frame stack[CPC_YAML_MAX_DEPTH + 1];
    int depth;
    int docs;
    bool fatal;          /* stop: CP100/CP106/OOM */
    bool oom;
    yaml_mark_t end;     /* line/column (0-based) just past the last character */
    cpc_status *diags;
    cpc_status **tail;   /* &last->next of diags (NULL: &diags) */
} builder;

static yaml_mark_t offset_mark(const builder *b, size_t off);

static cpc_span mark_span(const builder *b, yaml_mark_t m)
{
    /* libyaml puts the end of the stream on a line of its own when the text
     * does not end with a line break: clamp to the real end of the text. */
    if (m.line > b->end.line || (m.line == b->end.line && m.column > b->end.column))
        m = b->end;
    cpc_span s;
    s.file = b->file;
    s.line = (int)m.line + b->line0;
    s.col = (int)m.column + 1 + (m.line == 0 ? b->col0 - 1 : 0);
    return s;
}

/* Adds a diagnostic; the static OOM status is never linked into a chain
 * mid-way (it is appended once, at the end, by the parser driver). */
static void push(builder *b, cpc_status *st)
{
    if (st == &cpc_status_oom) {
        b->oom = true;
        b->fatal = true;
        return;
    }
    /* Append at the remembered tail: O(1), also with 10^5 diagnostics. */
    if (!b->tail)
        b->tail = &b->diags;
    *b->tail = st;
    while (st->next)
        st = st->next;
    b->tail = &st->next;
}

static void fatal(builder *b, int rule, cpc_span span, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fatal(builder *b, int rule, cpc_span span, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = cpc_diagv(CPC_E_PLAN, rule, CPC_SEV_ERROR, span, fmt, ap);
    va_end(ap);
    push(b, st);
    b->fatal = true;
}

static void set_oom(builder *b)
{
    b->oom = true;
    b->fatal = true;
}

/* Line/column (0-based, columns in characters) of byte `off` of the input. */
static yaml_mark_t offset_mark(const builder *b, size_t off)
{
    yaml_mark_t m = {0, 0, 0};
    if (off > b->len)
        off = b->len;
    for (size_t i = 0; i < off; i++) {
        unsigned char c = (unsigned char)b->text[i];
        if (c == '\n') {
            m.line++;
            m.column = 0;
        } else if ((c & 0xc0) != 0x80) {
            m.column++;
        }
    }
    return m;
}

/* Position of byte `off` (reader errors give an offset, not a mark). */
static cpc_span offset_span(const builder *b, size_t off)
{
    return mark_span(b, offset_mark(b, off));
}

/* Attaches a finished (or just opened) node to the open collection on top
 * of the stack, or makes it the root.  Takes ownership of n. */
static bool attach(builder *b, cpc_ynode *n, cpc_span where)
{
    if (b->depth == 0) {
        if (b->tree->root) { /* cannot happen with one document */
            cpc_ynode_free(n);
            fatal(b, 100, where, "more than one root node");
            return false;
        }
        b->tree->root = n;
        return true;
    }
    frame *f = &b->stack[b->depth - 1];
    cpc_ynode *c = f->node;
    if (c->kind == CPC_YNODE_SEQUENCE) {
        if (!grow(c)) {
            cpc_ynode_free(n);
            set_oom(b);
            return false;
        }
        c->vals[c->n++] = n;
        return true;
    }
    if (!f->pending) {
        if (n->kind != CPC_YNODE_SCALAR) {
            const char *what = n->kind == CPC_YNODE_MAPPING ? "mapping" : "sequence";
            cpc_ynode_free(n);
            fatal(b, 100, where,
                  "a %s used as a mapping key is not supported (keys must be scalars)", what);
            return false;
        }
        f->pending = n;
        return true;
    }
    if (!grow(c)) {
        cpc_ynode_free(n);
        set_oom(b);
        return false;
    }
    c->keys[c->n] = f->pending;
    c->vals[c->n] = n;
    c->n++;
    f->pending = NULL;
    return true;
}

typedef struct keyref {
    const char *s;
    size_t len;
    int idx;
} keyref;

static int keyref_cmp(const void *a, const void *b)
{
    const keyref *x = a, *y = b;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    int c = memcmp(x->s, y->s, x->len);
    if (c)
        return c;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* CP105 for repeated keys of a finished mapping; drops the later pairs.
 * O(n log n). */
static void check_duplicates(builder *b, cpc_ynode *m)
{
    if (m->n < 2)
        return;
    keyref *refs = malloc((size_t)m->n * sizeof *refs);
    bool *drop = calloc((size_t)m->n, sizeof *drop);
    if (!refs || !drop) {
        free(refs);
        free(drop);
        set_oom(b);
        return;
    }
    for (int i = 0; i < m->n; i++)
        refs[i] = (keyref){m->keys[i]->str, m->keys[i]->len, i};
    qsort(refs, (size_t)m->n, sizeof *refs, keyref_cmp);
    /* first[i]: index of the first pair with the same key as pair i, or -1
     * when pair i is itself the first. */
    int *first = malloc((size_t)m->n * sizeof *first);
    if (!first) {
        free(refs);
        free(drop);
        set_oom(b);
        return;
    }
    int ndrop = 0;
    for (int i = 0; i < m->n; i++) {
        int g = i; /* start of the group of equal keys (sorted by index inside) */
        first[refs[i].idx] = -1;
        while (i + 1 < m->n && refs[i + 1].len == refs[g].len &&
               memcmp(refs[i + 1].s, refs[g].s, refs[g].len) == 0) {
            i++;
            drop[refs[i].idx] = true;
            first[refs[i].idx] = refs[g].idx;
            ndrop++;
        }
    }
    if (ndrop) {
        /* Report in document order, each with a note at the first occurrence. */
        for (int i = 0; i < m->n; i++) {
            if (!drop[i])
                continue;
            char esc[96];
            cpc_yaml_escape(m->keys[i]->str, m->keys[i]->len, esc, sizeof esc);
            cpc_status *st = cpc_diag(CPC_E_PLAN, 105, CPC_SEV_ERROR, m->keys[i]->span,
                                      "duplicate key '%s'", esc);
            if (st != &cpc_status_oom) {
                cpc_status_add_note(st, m->keys[first[i]]->span, "'%s' first defined here", esc);
                cpc_status_set_hint(st, "remove one of the two");
            }
            push(b, st);
        }
        int o = 0;
        for (int i = 0; i < m->n; i++) {
            if (drop[i]) {
                cpc_ynode_free(m->keys[i]);
                cpc_ynode_free(m->vals[i]);
            } else {
                m->keys[o] = m->keys[i];
                m->vals[o] = m->vals[i];
                o++;
            }
        }
        m->n = o;
    }
    free(first);
    free(refs);
    free(drop);
}

static bool refuse_props(builder *b, yaml_char_t *anchor, yaml_char_t *tag, yaml_mark_t at)
{
    char esc[96];
    if (anchor) {
        cpc_yaml_escape((const char *)anchor, strlen((const char *)anchor), esc, sizeof esc);
        fatal(b, 100, mark_span(b, at), "YAML anchors are not supported (anchor '&%s')", esc);
        return true;
    }
    if (tag) {
        cpc_yaml_escape((const char *)tag, strlen((const char *)tag), esc, sizeof esc);
        fatal(b, 100, mark_span(b, at), "YAML tags are not supported (tag '%s')", esc);
        return true;
    }
    return false;
}

static void handle_event(builder *b, yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_NO_EVENT:
    case YAML_STREAM_START_EVENT:
    case YAML_STREAM_END_EVENT:
    case YAML_DOCUMENT_END_EVENT:
        break;
    case YAML_DOCUMENT_START_EVENT:
        if (++b->docs > 1) {
            fatal(b, 100, mark_span(b, ev->start_mark),
                  "more than one YAML document (a plan file holds exactly one)");
            break;
        }
        if (ev->data.document_start.tag_directives.start !=
            ev->data.document_start.tag_directives.end)
            fatal(b, 100, mark_span(b, ev->start_mark),
                  "YAML %%TAG directives are not supported");
        break;
    case YAML_ALIAS_EVENT: {
        char esc[96];
        const char *a = (const char *)ev->data.alias.anchor;
        cpc_yaml_escape(a ? a : "", a ? strlen(a) : 0, esc, sizeof esc);
        fatal(b, 100, mark_span(b, ev->start_mark), "YAML aliases are not supported (alias '*%s')",
              esc);
        break;
    }
    case YAML_SCALAR_EVENT: {
        if (refuse_props(b, ev->data.scalar.anchor, ev->data.scalar.tag, ev->start_mark))
            break;
        cpc_ystyle st;
        switch (ev->data.scalar.style) {
        case YAML_SINGLE_QUOTED_SCALAR_STYLE: st = CPC_YSTYLE_SINGLE_QUOTED; break;
        case YAML_DOUBLE_QUOTED_SCALAR_STYLE: st = CPC_YSTYLE_DOUBLE_QUOTED; break;
        case YAML_LITERAL_SCALAR_STYLE: st = CPC_YSTYLE_LITERAL; break;
        case YAML_FOLDED_SCALAR_STYLE: st = CPC_YSTYLE_FOLDED; break;
        default: st = CPC_YSTYLE_PLAIN; break;
        }
        cpc_span sp = mark_span(b, ev->start_mark);
        cpc_ynode *n = cpc_ynode_new_scalar((const char *)ev->data.scalar.value,
                                            ev->data.scalar.length, st, sp);
        if (!n) {
            set_oom(b);
            break;
        }
        attach(b, n, sp);
        break;
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        bool map = ev->type == YAML_MAPPING_START_EVENT;
        yaml_char_t *anchor = map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor;
        yaml_char_t *tag = map ? ev->data.mapping_start.tag : ev->data.sequence_start.tag;
        if (refuse_props(b, anchor, tag, ev->start_mark))
            break;
        cpc_span sp = mark_span(b, ev->start_mark);
        if (b->depth >= CPC_YAML_MAX_DEPTH) {
            fatal(b, 106, sp, "YAML nested deeper than %d levels", CPC_YAML_MAX_DEPTH);
            break;
        }
        bool flow = map ? ev->data.mapping_start.style == YAML_FLOW_MAPPING_STYLE
                        : ev->data.sequence_start.style == YAML_FLOW_SEQUENCE_STYLE;
        cpc_ynode *n = map ? cpc_ynode_new_mapping(flow, sp) : cpc_ynode_new_sequence(flow, sp);
        if (!n) {
            set_oom(b);
            break;
        }
        if (!attach(b, n, sp))
            break;
        b->stack[b->depth].node = n;
        b->stack[b->depth].pending = NULL;
        b->depth++;
        break;
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT: {
        if (b->depth == 0)
            break; /* libyaml guarantees balance; be defensive */
        frame *f = &b->stack[b->depth - 1];
        if (f->pending) { /* cannot happen: libyaml emits a null value */
            cpc_ynode_free(f->pending);
            f->pending = NULL;
        }
        if (f->node->kind == CPC_YNODE_MAPPING)
            check_duplicates(b, f->node);
        b->depth--;
        break;
    }
    }
}

static void parser_error(builder *b, yaml_parser_t *p)
{
    if (p->error == YAML_MEMORY_ERROR) {
        set_oom(b);
        return;
    }
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR) {
        cpc_span sp = offset_span(b, p->problem_offset);
        if (p->problem_value != -1)
            fatal(b, 100, sp, "YAML: %s (byte 0x%02x)", problem, (unsigned)p->problem_value & 0xff);
        else
            fatal(b, 100, sp, "YAML: %s", problem);
        return;
    }
    cpc_span sp = mark_span(b, p->problem_mark);
    cpc_status *st;
    if (p->context)
        st = cpc_diag(CPC_E_PLAN, 100, CPC_SEV_ERROR, sp, "YAML syntax error: %s %s", problem,
                      p->context);
    else
        st = cpc_diag(CPC_E_PLAN, 100, CPC_SEV_ERROR, sp, "YAML syntax error: %s", problem);
    if (p->context)
        cpc_status_add_note(st, mark_span(b, p->context_mark), "%s started here", p->context);
    push(b, st);
    b->fatal = true;
}

/* Stable sort of a chain by position (duplicate-key errors are found when a
 * mapping ends, inner mappings first). */
static cpc_status *sort_by_position(cpc_status *list)
{
    return cpc_status_sort(list, NULL);
}

cpc_status *cpc_ytree_parse_string_at(const char *text, size_t len, const char *file,
                                      int first_line, int first_col, cpc_ytree **out)
{
    *out = NULL;
    if (!file)
        file = "<string>";
    if (first_line < 1)
        first_line = 1;
    if (first_col < 1)
        first_col = 1;
    if (len > CPC_YAML_MAX_BYTES)
        return cpc_diag(CPC_E_PLAN, 106, CPC_SEV_ERROR, (cpc_span){file, first_line, first_col},
                        "YAML input is %zu bytes, more than the limit of %zu bytes (1 MiB)", len,
                        CPC_YAML_MAX_BYTES);
    if (!text && len)
        return cpc_error(CPC_E_INTERNAL, "cpc_ytree_parse_string: NULL text");

    builder *b = calloc(1, sizeof *b);
    cpc_ytree *tree = calloc(1, sizeof *tree);
    if (!b || !tree) {
        free(b);
        free(tree);
        return &cpc_status_oom;
    }
    b->tree = tree;
    b->text = text ? text : "";
    b->len = len;
    b->line0 = first_line;
    b->col0 = first_col;
    b->end = offset_mark(b, len);
    b->file = cpc_ytree_intern_file(tree, file);
    if (!b->file) {
        free(b);
        cpc_ytree_free(tree);
        return &cpc_status_oom;
    }

    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        free(b);
        cpc_ytree_free(tree);
        return &cpc_status_oom;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)b->text, len);
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            parser_error(b, &p);
            break;
        }
        yaml_event_type_t t = ev.type;
        handle_event(b, &ev);
        yaml_event_delete(&ev);
        if (b->fatal || t == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&p);

    for (int i = 0; i < b->depth; i++)
        cpc_ynode_free(b->stack[i].pending);
    cpc_status *diags = sort_by_position(b->diags);
    if (b->oom)
        cpc_status_append(&diags, &cpc_status_oom); /* last, never followed */
    if (b->fatal) {
        cpc_ytree_free(tree);
        tree = NULL;
    }
    free(b);
    *out = tree;
    return diags;
}

cpc_status *cpc_ytree_parse_string(const char *text, size_t len, const char *file,
                                   cpc_ytree **out)
{
    return cpc_ytree_parse_string_at(text, len, file, 1, 1, out);
}

cpc_status *cpc_ytree_parse_file(const char *path, cpc_ytree **out)
{
    *out = NULL;
    /* fileio.h: a FIFO without a writer reads as empty instead of blocking
     * open(); pipes (cpc --check <(...)) still work */
    cpc_status *ost = NULL;
    FILE *f = cpc_fopen_read(path, "plan", true, &ost);
    if (!f)
        return ost;
    size_t cap = CPC_YAML_MAX_BYTES + 1;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return &cpc_status_oom;
    }
    errno = 0;
    size_t n = fread(buf, 1, cap, f);
    int err = ferror(f) ? (errno ? errno : EIO) : 0;
    fclose(f);
    if (err) {
        free(buf);
        return cpc_error(CPC_E_IO, "%s: cannot read: %s", path, strerror(err));
    }
    if (n > CPC_YAML_MAX_BYTES) {
        free(buf);
        return cpc_diag(CPC_E_PLAN, 106, CPC_SEV_ERROR, (cpc_span){path, 1, 1},
                        "file is larger than the limit of %zu bytes (1 MiB)", CPC_YAML_MAX_BYTES);
    }
    cpc_status *st = cpc_ytree_parse_string(buf, n, path, out);
    free(buf);
    return st;
}
