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

#endif
