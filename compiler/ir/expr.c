/* expr.c - rank-coordinate expressions; see expr.h.
 *
 * A recursive-descent parser builds a small AST stored in one array of
 * nodes (children by index), so that cloning is a copy.  Evaluation walks
 * the AST with checked int64 arithmetic.  The canonical text is printed from
 * the AST with no whitespace and the fewest parentheses that keep the parse
 * (so parse(text(e)) has the same text). */
#include "expr.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The node operators, in the order of the public kinds (expr.h cpc_expr_kind). */
typedef enum node_op {
    N_NUM = 0, N_VAR, N_NEG, N_NOT,
    N_ADD, N_SUB, N_MUL, N_DIV, N_MOD,
    N_LT, N_LE, N_GT, N_GE, N_EQ, N_NE,
    N_AND, N_OR, N_MIN, N_MAX,
} node_op;
_Static_assert(N_ADD == (int)CPC_EX_ADD && N_MOD == (int)CPC_EX_MOD && N_MAX == (int)CPC_EX_MAX, "node ops = kinds");

typedef struct node {
    node_op op;
    char var;      /* N_VAR */
    int a, b;      /* children (-1 = none) */
    int64_t val;   /* N_NUM */
} node;

struct cpc_expr {
    int n;
    int root;
    char *text;
    node *nodes;
};

#define EXPR_MAX_TEXT 4096
#define EXPR_MAX_DEPTH 200

/* ---- parser ------------------------------------------------------------- */

typedef struct parser {
    const char *src;
    size_t pos;
    int depth;
    node *nodes;
    int n, cap;
    bool oom;
    char err[160];
    size_t err_pos;
    bool failed;
} parser;

static void fail(parser *ps, size_t at, const char *msg)
{
    if (ps->failed)
        return;
    ps->failed = true;
    ps->err_pos = at;
    snprintf(ps->err, sizeof ps->err, "%s", msg);
}

static void skip_ws(parser *ps)
{
    while (ps->src[ps->pos] == ' ' || ps->src[ps->pos] == '\t' || ps->src[ps->pos] == '\n' ||
           ps->src[ps->pos] == '\r')
        ps->pos++;
}

static int new_node(parser *ps, node_op op, int a, int b)
{
    if (ps->failed)
        return -1;
    if (ps->n == ps->cap) {
        int cap = ps->cap ? ps->cap * 2 : 16;
        node *nn = realloc(ps->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            ps->oom = true;
            fail(ps, ps->pos, "out of memory");
            return -1;
        }
        ps->nodes = nn;
        ps->cap = cap;
    }
    node *x = &ps->nodes[ps->n];
    memset(x, 0, sizeof *x);
    x->op = op;
    x->a = a;
    x->b = b;
    return ps->n++;
}

/* Matches the literal token `t` (after whitespace); advances on success. */
static bool accept(parser *ps, const char *t)
{
    skip_ws(ps);
    size_t l = strlen(t);
    if (strncmp(ps->src + ps->pos, t, l) != 0)
        return false;
    /* '<' must not match the start of "<=", etc.: callers try longer first. */
    ps->pos += l;
    return true;
}

static int parse_or(parser *ps);

static int parse_atom(parser *ps)
{
    skip_ws(ps);
    size_t at = ps->pos;
    char ch = ps->src[at];
    if (isdigit((unsigned char)ch)) {
        int64_t v = 0;
        while (isdigit((unsigned char)ps->src[ps->pos])) {
            int d = ps->src[ps->pos] - '0';
            if (v > (INT64_MAX - d) / 10) {
                fail(ps, at, "integer literal out of range");
                return -1;
            }
            v = v * 10 + d;
            ps->pos++;
        }
        if (isalpha((unsigned char)ps->src[ps->pos]) || ps->src[ps->pos] == '_') {
            fail(ps, ps->pos, "unexpected character after number");
            return -1;
        }
        int i = new_node(ps, N_NUM, -1, -1);
        if (i >= 0)
            ps->nodes[i].val = v;
        return i;
    }
    if (isalpha((unsigned char)ch) || ch == '_') {
        size_t e = at;
        while (isalnum((unsigned char)ps->src[e]) || ps->src[e] == '_')
            e++;
        size_t len = e - at;
        if (len == 1 && strchr("rupsRUP", ch)) {
            ps->pos = e;
            int i = new_node(ps, N_VAR, -1, -1);
            if (i >= 0)
                ps->nodes[i].var = ch;
            return i;
        }
        if (len == 3 && (strncmp(ps->src + at, "min", 3) == 0 || strncmp(ps->src + at, "max", 3) == 0)) {
            node_op op = ps->src[at + 1] == 'i' ? N_MIN : N_MAX;
            ps->pos = e;
            if (!accept(ps, "(")) {
                fail(ps, ps->pos, "expected '(' after min/max");
                return -1;
            }
            int a = parse_or(ps);
            if (a < 0)
                return -1;
            if (!accept(ps, ",")) {
                fail(ps, ps->pos, "expected ',' in min/max");
                return -1;
            }
            int b = parse_or(ps);
            if (b < 0)
                return -1;
            if (!accept(ps, ")")) {
                fail(ps, ps->pos, "expected ')' closing min/max");
                return -1;
            }
            return new_node(ps, op, a, b);
        }
        fail(ps, at, "unknown name (variables are r, u, p, s, R, U, P; functions min, max)");
        return -1;
    }
    if (ch == '(') {
        ps->pos++;
        int a = parse_or(ps);
        if (a < 0)
            return -1;
        if (!accept(ps, ")")) {
            fail(ps, ps->pos, "expected ')'");
            return -1;
        }
        return a;
    }
    if (ch == '\0')
        fail(ps, at, "unexpected end of expression; expected a number, a variable or '('");
    else
        fail(ps, at, "expected a number, a variable or '('");
    return -1;
}

static int parse_unary(parser *ps)
{
    if (++ps->depth > EXPR_MAX_DEPTH) {
        fail(ps, ps->pos, "expression nested too deeply");
        return -1;
    }
    int r;
    skip_ws(ps);
    if (ps->src[ps->pos] == '-') {
        ps->pos++;
        int a = parse_unary(ps);
        r = a < 0 ? -1 : new_node(ps, N_NEG, a, -1);
    } else if (ps->src[ps->pos] == '!' && ps->src[ps->pos + 1] != '=') {
        ps->pos++;
        int a = parse_unary(ps);
        r = a < 0 ? -1 : new_node(ps, N_NOT, a, -1);
    } else {
        r = parse_atom(ps);
    }
    ps->depth--;
    return r;
}

static int parse_mul(parser *ps)
{
    int a = parse_unary(ps);
    while (a >= 0) {
        skip_ws(ps);
        char c = ps->src[ps->pos];
        node_op op = c == '*' ? N_MUL : c == '/' ? N_DIV : c == '%' ? N_MOD : N_NUM;
        if (op == N_NUM)
            break;
        ps->pos++;
        int b = parse_unary(ps);
        if (b < 0)
            return -1;
        a = new_node(ps, op, a, b);
    }
    return a;
}

static int parse_add(parser *ps)
{
    int a = parse_mul(ps);
    while (a >= 0) {
        skip_ws(ps);
        char c = ps->src[ps->pos];
        if (c != '+' && c != '-')
            break;
        ps->pos++;
        int b = parse_mul(ps);
        if (b < 0)
            return -1;
        a = new_node(ps, c == '+' ? N_ADD : N_SUB, a, b);
    }
    return a;
}

static bool cmp_op(parser *ps, node_op *op)
{
    static const struct { const char *t; node_op op; } ops[] = {
        {"<=", N_LE}, {">=", N_GE}, {"==", N_EQ}, {"!=", N_NE}, {"<", N_LT}, {">", N_GT},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (accept(ps, ops[i].t)) {
            *op = ops[i].op;
            return true;
        }
    return false;
}

static int parse_cmp(parser *ps)
{
    int a = parse_add(ps);
    if (a < 0)
        return -1;
    node_op op;
    if (!cmp_op(ps, &op))
        return a;
    int b = parse_add(ps);
    if (b < 0)
        return -1;
    a = new_node(ps, op, a, b);
    node_op op2;
    skip_ws(ps);
    size_t at = ps->pos;
    if (a >= 0 && cmp_op(ps, &op2)) {
        fail(ps, at, "comparisons do not chain; use parentheses or &&");
        return -1;
    }
    return a;
}

static int parse_and(parser *ps)
{
    int a = parse_cmp(ps);
    while (a >= 0 && accept(ps, "&&")) {
        int b = parse_cmp(ps);
        if (b < 0)
            return -1;
        a = new_node(ps, N_AND, a, b);
    }
    return a;
}

static int parse_or(parser *ps)
{
    if (++ps->depth > EXPR_MAX_DEPTH) {
        fail(ps, ps->pos, "expression nested too deeply");
        return -1;
    }
    int a = parse_and(ps);
    while (a >= 0 && accept(ps, "||")) {
        int b = parse_and(ps);
        if (b < 0)
            return -1;
        a = new_node(ps, N_OR, a, b);
    }
    ps->depth--;
    return a;
}

/* ---- canonical text ----------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *t)
{
    size_t l = strlen(t);
    if (b->oom)
        return;
    if (b->n + l + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->n + l + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, t, l + 1);
    b->n += l;
}

static int prec(node_op op)
{
    switch (op) {
    case N_OR: return 1;
    case N_AND: return 2;
    case N_LT: case N_LE: case N_GT: case N_GE: case N_EQ: case N_NE: return 3;
    case N_ADD: case N_SUB: return 4;
    case N_MUL: case N_DIV: case N_MOD: return 5;
    case N_NEG: case N_NOT: return 6;
    default: return 7;
    }
}

static const char *op_text(node_op op)
{
    switch (op) {
    case N_ADD: return "+";
    case N_SUB: return "-";
    case N_MUL: return "*";
    case N_DIV: return "/";
    case N_MOD: return "%";
    case N_LT: return "<";
    case N_LE: return "<=";
    case N_GT: return ">";
    case N_GE: return ">=";
    case N_EQ: return "==";
    case N_NE: return "!=";
    case N_AND: return "&&";
    case N_OR: return "||";
    case N_NEG: return "-";
    case N_NOT: return "!";
    case N_MIN: return "min";
    case N_MAX: return "max";
    default: return "?";
    }
}

static void emit(sbuf *b, const node *nodes, int i, int min_prec)
{
    const node *x = &nodes[i];
    int p = prec(x->op);
    bool paren = p < min_prec;
    if (paren)
        sb_put(b, "(");
    char tmp[32];
    switch (x->op) {
    case N_NUM:
        snprintf(tmp, sizeof tmp, "%lld", (long long)x->val);
        sb_put(b, tmp);
        break;
    case N_VAR:
        tmp[0] = x->var;
        tmp[1] = '\0';
        sb_put(b, tmp);
        break;
    case N_NEG:
    case N_NOT:
        sb_put(b, op_text(x->op));
        emit(b, nodes, x->a, 6);
        break;
    case N_MIN:
    case N_MAX:
        sb_put(b, op_text(x->op));
        sb_put(b, "(");
        emit(b, nodes, x->a, 1);
        sb_put(b, ",");
        emit(b, nodes, x->b, 1);
        sb_put(b, ")");
        break;
    default:
        /* Left-associative binary operators; comparisons do not chain, so
         * both of their operands need a higher precedence. */
        emit(b, nodes, x->a, p == 3 ? p + 1 : p);
        sb_put(b, op_text(x->op));
        emit(b, nodes, x->b, p + 1);
        break;
    }
    if (paren)
        sb_put(b, ")");
}

static char *canonical(const node *nodes, int root)
{
    sbuf b = {0};
    emit(&b, nodes, root, 1);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- public API --------------------------------------------------------- */

cpc_status *cpc_expr_parse(const char *text, cpc_span where, cpc_expr **out)
{
    *out = NULL;
    if (!text)
        return cpc_diag(CPC_E_INPUT, 0, CPC_SEV_ERROR, where, "expression: missing text");
    size_t len = strlen(text);
    if (len > EXPR_MAX_TEXT)
        return cpc_diag(CPC_E_INPUT, 0, CPC_SEV_ERROR, where,
                        "expression of %zu characters is longer than %d", len, EXPR_MAX_TEXT);
    parser ps = {.src = text};
    int root = parse_or(&ps);
    if (!ps.failed) {
        skip_ws(&ps);
        if (text[ps.pos] != '\0')
            fail(&ps, ps.pos, "unexpected text after the expression");
    }
    if (ps.failed || root < 0) {
        free(ps.nodes);
        if (ps.oom)
            return &cpc_status_oom;
        return cpc_diag(CPC_E_INPUT, 0, CPC_SEV_ERROR, where, "expression '%s': column %zu: %s", text,
                        ps.err_pos + 1, ps.err);
    }
    cpc_expr *e = calloc(1, sizeof *e);
    if (!e) {
        free(ps.nodes);
        return &cpc_status_oom;
    }
    e->nodes = ps.nodes;
    e->n = ps.n;
    e->root = root;
    e->text = canonical(e->nodes, root);
    if (!e->text) {
        cpc_expr_free(e);
        return &cpc_status_oom;
    }
    *out = e;
    return NULL;
}

typedef struct evalctx {
    const node *nodes;
    const cpc_coords *c;
    const char *err;
} evalctx;

static bool ev(evalctx *x, int i, int64_t *v)
{
    const node *n = &x->nodes[i];
    int64_t a, b;
    switch (n->op) {
    case N_NUM:
        *v = n->val;
        return true;
    case N_VAR:
        switch (n->var) {
        case 'r': *v = x->c->r; break;
        case 'u': *v = x->c->u; break;
        case 'p': *v = x->c->p; break;
        case 's': *v = x->c->s; break;
        case 'R': *v = x->c->R; break;
        case 'U': *v = x->c->U; break;
        default: *v = x->c->P; break;
        }
        return true;
    case N_NEG:
        if (!ev(x, n->a, &a))
            return false;
        if (a == INT64_MIN) {
            x->err = "integer overflow in negation";
            return false;
        }
        *v = -a;
        return true;
    case N_NOT:
        if (!ev(x, n->a, &a))
            return false;
        *v = !a;
        return true;
    case N_AND:
        if (!ev(x, n->a, &a))
            return false;
        if (!a) {
            *v = 0;
            return true;
        }
        if (!ev(x, n->b, &b))
            return false;
        *v = b != 0;
        return true;
    case N_OR:
        if (!ev(x, n->a, &a))
            return false;
        if (a) {
            *v = 1;
            return true;
        }
        if (!ev(x, n->b, &b))
            return false;
        *v = b != 0;
        return true;
    default:
        break;
    }
    if (!ev(x, n->a, &a) || !ev(x, n->b, &b))
        return false;
    x->err = cpc_expr_binop((cpc_expr_kind)n->op, a, b, v);
    return !x->err;
}

const char *cpc_expr_binop(cpc_expr_kind k, int64_t a, int64_t b, int64_t *v)
{
    switch (k) {
    case CPC_EX_ADD: return __builtin_add_overflow(a, b, v) ? "integer overflow in '+'" : NULL;
    case CPC_EX_SUB: return __builtin_sub_overflow(a, b, v) ? "integer overflow in '-'" : NULL;
    case CPC_EX_MUL: return __builtin_mul_overflow(a, b, v) ? "integer overflow in '*'" : NULL;
    case CPC_EX_DIV:
    case CPC_EX_MOD: {
        if (b == 0)
            return k == CPC_EX_DIV ? "division by zero" : "modulo by zero";
        if (b == -1) {
            if (k == CPC_EX_MOD)
                return *v = 0, NULL;
            if (a == INT64_MIN)
                return "integer overflow in '/'";
            return *v = -a, NULL;
        }
        /* Euclidean: a == q*b + m with 0 <= m < |b|. */
        int64_t q = a / b, m = a % b;
        if (m < 0) {
            if (b > 0) {
                m += b;
                q -= 1;
            } else {
                m -= b;
                q += 1;
            }
        }
        *v = k == CPC_EX_DIV ? q : m;
        return NULL;
    }
    case CPC_EX_LT: *v = a < b; return NULL;
    case CPC_EX_LE: *v = a <= b; return NULL;
    case CPC_EX_GT: *v = a > b; return NULL;
    case CPC_EX_GE: *v = a >= b; return NULL;
    case CPC_EX_EQ: *v = a == b; return NULL;
    case CPC_EX_NE: *v = a != b; return NULL;
    case CPC_EX_AND: *v = a && b; return NULL;
    case CPC_EX_OR: *v = a || b; return NULL;
    case CPC_EX_MIN: *v = a < b ? a : b; return NULL;
    case CPC_EX_MAX: *v = a > b ? a : b; return NULL;
    default: return "corrupt expression";
    }
}

cpc_status *cpc_expr_eval(const cpc_expr *e, const cpc_coords *c, int64_t *out)
{
    if (!e || !c)
        return cpc_error(CPC_E_INTERNAL, "expression: evaluating NULL");
    evalctx x = {e->nodes, c, NULL};
    int64_t v = 0;
    if (!ev(&x, e->root, &v))
        return cpc_error(CPC_E_INPUT,
                         "expression '%s': %s (r=%lld u=%lld p=%lld s=%lld R=%lld U=%lld P=%lld)", e->text,
                         x.err, (long long)c->r, (long long)c->u, (long long)c->p, (long long)c->s,
                         (long long)c->R, (long long)c->U, (long long)c->P);
    *out = v;
    return NULL;
}

const char *cpc_expr_text(const cpc_expr *e)
{
    return e ? e->text : "";
}

bool cpc_expr_uses(const cpc_expr *e, char var)
{
    if (!e)
        return false;
    for (int i = 0; i < e->n; i++)
        if (e->nodes[i].op == N_VAR && e->nodes[i].var == var)
            return true;
    return false;
}

cpc_expr *cpc_expr_clone(const cpc_expr *e)
{
    if (!e)
        return NULL;
    cpc_expr *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->n = e->n;
    c->root = e->root;
    c->nodes = malloc((size_t)e->n * sizeof *c->nodes);
    c->text = strdup(e->text);
    if (!c->nodes || !c->text) {
        cpc_expr_free(c);
        return NULL;
    }
    memcpy(c->nodes, e->nodes, (size_t)e->n * sizeof *c->nodes);
    return c;
}

void cpc_expr_free(cpc_expr *e)
{
    if (!e)
        return;
    free(e->nodes);
    free(e->text);
    free(e);
}

int cpc_expr_root(const cpc_expr *e)
{
    return e ? e->root : -1;
}

int cpc_expr_size(const cpc_expr *e)
{
    return e ? e->n : 0;
}

bool cpc_expr_node_at(const cpc_expr *e, int i, cpc_expr_node *out)
{
    if (!e || !out || i < 0 || i >= e->n)
        return false;
    const node *x = &e->nodes[i];
    out->kind = (cpc_expr_kind)x->op;
    out->var = x->var;
    out->a = x->a;
    out->b = x->b;
    out->val = x->val;
    return true;
}
