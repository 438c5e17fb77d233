/*
 * expr.h - integer expressions of a rank's coordinates, used by the op
 * program wherever a value depends on the rank (peers, ring block indices,
 * loop counts, conditions), so that one SPMD program serves every rank and
 * its size does not grow with world_size (SPEC section 4).
 *
 * Grammar (C precedence, all integers are int64):
 *   expr   := or
 *   or     := and ('||' and)*
 *   and    := cmp ('&&' cmp)*
 *   cmp    := add (('<'|'<='|'>'|'>='|'=='|'!=') add)?
 *   add    := mul (('+'|'-') mul)*
 *   mul    := unary (('*'|'/'|'%') unary)*
 *   unary  := '-' unary | '!' unary | atom
 *   atom   := INTEGER | VAR | '(' expr ')' | 'min(' expr ',' expr ')' | 'max(' ... ')'
 *   VAR    := r | u | p | s | R | U | P
 * r: ring index, u: ulysses index, p: flat rank (r*U+u), s: the step of the
 * innermost enclosing loop (0 outside loops), R, U, P: degrees.
 * `%` is the non-negative modulo ((r-1)%R is R-1 for r = 0); `/` and `%` by
 * zero are evaluation errors; comparisons give 0 or 1.
 *
 * Details (expr.c; added by the implementer, additive):
 *  - `/` is Euclidean division, the partner of the non-negative `%`:
 *    a == (a/b)*b + a%b with 0 <= a%b < |b| (so -1/2 == -1, -7%2 == 1); for
 *    non-negative operands it is C's division.
 *  - `&&` and `||` short-circuit (the right side is not evaluated, so it
 *    cannot fail) and give 0 or 1; `!x` is 1 when x == 0.
 *  - Comparisons do not chain: `a<b<c` is a parse error.
 *  - Integer literals are decimal, 0..INT64_MAX; `-` before one is unary.
 *  - Overflow of + - * / and negation is an evaluation error, never wraps.
 *  - Texts longer than 4096 characters, or nested deeper than 200
 *    parentheses/unary operators, are parse errors.
 *  - Canonical text: no whitespace, the fewest parentheses that keep the
 *    tree ("( r + 1 ) % R" -> "(r+1)%R", "(a*b)+c" -> "a*b+c",
 *    "a-(b-c)" kept), min/max as "min(a,b)".  Parsing the canonical text
 *    gives the same canonical text.  Error messages name the text and the
 *    1-based column.
 *
 * Thread-safety: a compiled expression is immutable; evaluation is pure.
 */
#ifndef CPC_EXPR_H
#define CPC_EXPR_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

/* Values of the variables for one evaluation. */
typedef struct cpc_coords {
    int64_t r, u, p, s;
    int64_t R, U, P;
} cpc_coords;

typedef struct cpc_expr cpc_expr;  /* opaque, heap-allocated */

/* Parses `text`.  On error returns a CPC_E_INPUT status whose message names
 * the text and the column; `where` (may be NO_SPAN) is used as its span.
 * On success *out is owned by the caller (cpc_expr_free). */
cpc_status *cpc_expr_parse(const char *text, cpc_span where, cpc_expr **out);

/* Evaluates; errors (division by zero, overflow) give CPC_E_INPUT. */
cpc_status *cpc_expr_eval(const cpc_expr *e, const cpc_coords *c, int64_t *out);

/* The canonical text of the expression (as parsed, whitespace normalised).
 * Owned by the expression. */
const char *cpc_expr_text(const cpc_expr *e);

/* True when the expression reads variable `var` ('s', 'r', ...). */
bool cpc_expr_uses(const cpc_expr *e, char var);

/* Deep copy; NULL on OOM or NULL input. */
cpc_expr *cpc_expr_clone(const cpc_expr *e);

/* Frees a parsed expression.  NULL is ignored. */
void cpc_expr_free(cpc_expr *e);

/* ---- structure (added for the symbolic verifier, verify_sym.c) ----------
 * Read-only access to the parsed tree, so that a caller can reason about an
 * expression's form (affine in the rank, an interval of steps) instead of
 * evaluating it point by point.  Node indices are 0..n-1; children are node
 * indices (-1 = none).  Kinds follow the grammar above: NUM (val), VAR
 * (var), NEG/NOT (a), the binary operators (a, b), MIN/MAX (a, b). */
typedef enum cpc_expr_kind {
    CPC_EX_NUM = 0, CPC_EX_VAR, CPC_EX_NEG, CPC_EX_NOT,
    CPC_EX_ADD, CPC_EX_SUB, CPC_EX_MUL, CPC_EX_DIV, CPC_EX_MOD,
    CPC_EX_LT, CPC_EX_LE, CPC_EX_GT, CPC_EX_GE, CPC_EX_EQ, CPC_EX_NE,
    CPC_EX_AND, CPC_EX_OR, CPC_EX_MIN, CPC_EX_MAX,
} cpc_expr_kind;

typedef struct cpc_expr_node {
    cpc_expr_kind kind;
    char var;       /* CPC_EX_VAR: 'r', 'u', 'p', 's', 'R', 'U' or 'P' */
    int a, b;       /* children, -1 = none */
    int64_t val;    /* CPC_EX_NUM */
} cpc_expr_node;

/* Index of the root node; -1 for NULL. */
int cpc_expr_root(const cpc_expr *e);
/* Number of nodes of e (what one evaluation visits at most); 0 for NULL.
 * At most about EXPR_MAX_TEXT / 2 (the text is 4096 characters at most). */
int cpc_expr_size(const cpc_expr *e);
/* Node i of e into *out; false when e is NULL or i is out of range. */
bool cpc_expr_node_at(const cpc_expr *e, int i, cpc_expr_node *out);
/* Binary operator k (CPC_EX_ADD .. CPC_EX_MAX) on a and b into *out, as
 * evaluation computes it (Euclidean / and %, AND and OR give 0 or 1): NULL,
 * or why there is no value ("division by zero", "integer overflow in '+'"),
 * a static string.  The one meaning of the operators: cpc_expr_eval and the
 * symbolic verifier's constant folding (verify_sym.c) both use it. */
const char *cpc_expr_binop(cpc_expr_kind k, int64_t a, int64_t b, int64_t *out);

#endif
