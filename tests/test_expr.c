/* test_expr.c - rank-coordinate expressions (compiler/ir/expr.h): precedence,
 * non-negative %, Euclidean /, short-circuit, errors, canonical text. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "expr.h"

static cpc_coords C(int64_t r, int64_t u, int64_t s, int64_t R, int64_t U)
{
    cpc_coords c = {.r = r, .u = u, .p = r * U + u, .s = s, .R = R, .U = U, .P = R * U};
    return c;
}

/* Parses and evaluates; fails the test on any error. */
static int64_t ev(const char *text, cpc_coords c)
{
    cpc_expr *e = NULL;
    cpc_status *st = cpc_expr_parse(text, CPC_NO_SPAN, &e);
    cr_assert_null(st, "parse '%s': %s", text, st ? st->message : "");
    int64_t v = 0;
    st = cpc_expr_eval(e, &c, &v);
    cr_assert_null(st, "eval '%s': %s", text, st ? st->message : "");
    cpc_expr_free(e);
    return v;
}

static char *canon(const char *text)
{
    cpc_expr *e = NULL;
    cpc_status *st = cpc_expr_parse(text, CPC_NO_SPAN, &e);
    cr_assert_null(st, "parse '%s': %s", text, st ? st->message : "");
    char *s = strdup(cpc_expr_text(e));
    cpc_expr_free(e);
    return s;
}

/* Expects a parse error whose message mentions `needle`. */
static void parse_fails(const char *text, const char *needle)
{
    cpc_expr *e = NULL;
    cpc_span sp = {"plan.lua", 7, 3};
    cpc_status *st = cpc_expr_parse(text, sp, &e);
    cr_assert_not_null(st, "'%s' should not parse", text);
    cr_assert_null(e);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cr_assert(strstr(st->message, needle), "'%s': message '%s' lacks '%s'", text, st->message, needle);
    cr_assert_eq(st->span.line, 7);
    cr_assert_str_eq(st->span.file, "plan.lua");
    cpc_status_free(st);
}

static void eval_fails(const char *text, cpc_coords c, const char *needle)
{
    cpc_expr *e = NULL;
    cpc_status *st = cpc_expr_parse(text, CPC_NO_SPAN, &e);
    cr_assert_null(st);
    int64_t v = 12345;
    st = cpc_expr_eval(e, &c, &v);
    cr_assert_not_null(st, "'%s' should fail", text);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cr_assert(strstr(st->message, needle), "message '%s' lacks '%s'", st->message, needle);
    cr_assert_eq(v, 12345, "output must not be written on error");
    cpc_status_free(st);
    cpc_expr_free(e);
}

Test(expr, variables)
{
    cpc_coords c = C(3, 1, 2, 4, 2);
    cr_assert_eq(ev("r", c), 3);
    cr_assert_eq(ev("u", c), 1);
    cr_assert_eq(ev("p", c), 7);
    cr_assert_eq(ev("s", c), 2);
    cr_assert_eq(ev("R", c), 4);
    cr_assert_eq(ev("U", c), 2);
    cr_assert_eq(ev("P", c), 8);
}

Test(expr, precedence)
{
    cpc_coords c = C(1, 0, 2, 5, 1);
    cr_assert_eq(ev("2+3*4", c), 14);
    cr_assert_eq(ev("(2+3)*4", c), 20);
    cr_assert_eq(ev("10-4-3", c), 3);          /* left associative */
    cr_assert_eq(ev("100/10/5", c), 2);
    cr_assert_eq(ev("2*3%4", c), 2);           /* (2*3)%4 */
    cr_assert_eq(ev("-2*3", c), -6);
    cr_assert_eq(ev("--4", c), 4);
    cr_assert_eq(ev("s<R-1", c), 1);           /* 2 < 4 */
    cr_assert_eq(ev("s+2<R-1", c), 0);         /* 4 < 4 */
    cr_assert_eq(ev("1+1==2", c), 1);
    cr_assert_eq(ev("1<2&&3<4||0", c), 1);
    cr_assert_eq(ev("0&&1||1", c), 1);         /* && binds tighter than || */
    cr_assert_eq(ev("1||0&&0", c), 1);
    cr_assert_eq(ev("!0+1", c), 2);            /* unary binds tighter than + */
    cr_assert_eq(ev("!(0+1)", c), 0);
    cr_assert_eq(ev("min(r,s)+max(r,s)*10", c), 21);
    cr_assert_eq(ev("min(3-5,-1)", c), -2);
    cr_assert_eq(ev(" ( r + 1 ) % R ", c), 2);
}

Test(expr, comparisons)
{
    cpc_coords c = C(0, 0, 0, 1, 1);
    cr_assert_eq(ev("3<3", c), 0);
    cr_assert_eq(ev("3<=3", c), 1);
    cr_assert_eq(ev("3>2", c), 1);
    cr_assert_eq(ev("2>=3", c), 0);
    cr_assert_eq(ev("3==3", c), 1);
    cr_assert_eq(ev("3!=3", c), 0);
    cr_assert_eq(ev("5&&7", c), 1);            /* logical results are 0/1 */
    cr_assert_eq(ev("!7", c), 0);
}

Test(expr, nonnegative_modulo)
{
    /* The ring's peers and blocks: (r-1)%R is R-1 for r = 0. */
    for (int R = 1; R <= 9; R++)
        for (int r = 0; r < R; r++)
            for (int s = 0; s < R; s++) {
                cpc_coords c = C(r, 0, s, R, 1);
                cr_assert_eq(ev("(r-1)%R", c), (r - 1 + R) % R);
                cr_assert_eq(ev("(r+1)%R", c), (r + 1) % R);
                cr_assert_eq(ev("(r-s-1)%R", c), ((r - s - 1) % R + R) % R);
                cr_assert_eq(ev("(r-s)%R", c), ((r - s) % R + R) % R);
            }
    cpc_coords z = C(0, 0, 0, 1, 1);
    cr_assert_eq(ev("-7%2", z), 1);
    cr_assert_eq(ev("-7%-2", z), 1);
    cr_assert_eq(ev("7%-2", z), 1);
    cr_assert_eq(ev("-6%3", z), 0);
    /* Euclidean division: a == (a/b)*b + a%b. */
    cr_assert_eq(ev("-7/2", z), -4);
    cr_assert_eq(ev("-7/-2", z), 4);
    cr_assert_eq(ev("7/-2", z), -3);
    cr_assert_eq(ev("7/2", z), 3);
    for (int a = -9; a <= 9; a++)
        for (int b = -4; b <= 4; b++) {
            if (b == 0)
                continue;
            char t1[64], t2[64];
            snprintf(t1, sizeof t1, "(%d)/(%d)*(%d)+(%d)%%(%d)", a, b, b, a, b);
            snprintf(t2, sizeof t2, "(%d)%%(%d)", a, b);
            cr_assert_eq(ev(t1, z), a, "%s", t1);
            int64_t m = ev(t2, z);
            cr_assert(m >= 0 && m < (b < 0 ? -b : b), "%s = %lld", t2, (long long)m);
        }
    cr_assert_eq(ev("-9223372036854775807-1", z), INT64_MIN);
    cr_assert_eq(ev("(-9223372036854775807-1)%-1", z), 0);
    cr_assert_eq(ev("(-9223372036854775807-1)%7", z), (int64_t)(((__int128)INT64_MIN % 7 + 7) % 7));
}

Test(expr, short_circuit)
{
    cpc_coords c = C(0, 0, 0, 1, 1);
    cr_assert_eq(ev("0&&1/0", c), 0);
    cr_assert_eq(ev("1||1/0", c), 1);
    eval_fails("1&&1/0", c, "division by zero");
}

Test(expr, eval_errors)
{
    cpc_coords c = C(0, 0, 0, 4, 1);
    eval_fails("1/0", c, "division by zero");
    eval_fails("r%0", c, "modulo by zero");
    eval_fails("1%(R-4)", c, "modulo by zero");
    eval_fails("9223372036854775807+1", c, "overflow");
    eval_fails("-9223372036854775807-2", c, "overflow");
    eval_fails("4611686018427387904*2", c, "overflow");
    eval_fails("(-9223372036854775807-1)/-1", c, "overflow");
    eval_fails("-(-9223372036854775807-1)", c, "overflow");
}

Test(expr, parse_errors)
{
    parse_fails("", "end of expression");
    parse_fails("r+", "column 3");
    parse_fails("(r+1", "expected ')'");
    parse_fails("r+1)", "column 4");
    parse_fails("x+1", "unknown name");
    parse_fails("rr", "unknown name");
    parse_fails("min(r)", "expected ','");
    parse_fails("min r", "expected '('");
    parse_fails("a<b<c", "unknown name");
    parse_fails("r<s<R", "do not chain");
    parse_fails("r & s", "unexpected text");
    parse_fails("3r", "after number");
    parse_fails("99999999999999999999", "out of range");
    parse_fails("r $ s", "column 3");
    char deep[700];
    memset(deep, '(', 300);
    deep[300] = '1';
    memset(deep + 301, ')', 300);
    deep[601] = '\0';
    parse_fails(deep, "nested too deeply");
}

Test(expr, canonical_text)
{
    static const char *const cases[][2] = {
        {" ( r + 1 ) % R ", "(r+1)%R"},
        {"s < R - 1", "s<R-1"},
        {"(r - s - 1) % R", "(r-s-1)%R"},
        {"((2*3))+4", "2*3+4"},
        {"2*(3+4)", "2*(3+4)"},
        {"10-(4-3)", "10-(4-3)"},
        {"(10-4)-3", "10-4-3"},
        {"r/(s/2+1)", "r/(s/2+1)"},
        {"-(r+1)", "-(r+1)"},
        {"- - r", "--r"},
        {"3 - -5", "3--5"},
        {"!(r<s)", "!(r<s)"},
        {"(r<s)==(s<r)", "(r<s)==(s<r)"},
        {"(r||s)&&u", "(r||s)&&u"},
        {"r||(s&&u)", "r||s&&u"},
        {"min( r , max(s,1) )", "min(r,max(s,1))"},
        {"(min(r,s))", "min(r,s)"},
        {"p == r*U+u", "p==r*U+u"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = canon(cases[i][0]);
        cr_assert_str_eq(t, cases[i][1], "canonical of '%s'", cases[i][0]);
        /* Round trip: the canonical text is a fixed point ... */
        char *t2 = canon(t);
        cr_assert_str_eq(t2, t);
        /* ... and means the same thing. */
        for (int r = 0; r < 3; r++)
            for (int s = 0; s < 3; s++) {
                cpc_coords c = C(r, 1, s, 3, 2);
                cr_assert_eq(ev(cases[i][0], c), ev(t, c), "'%s' vs '%s'", cases[i][0], t);
            }
        free(t);
        free(t2);
    }
}

Test(expr, uses_and_clone)
{
    cpc_expr *e = NULL;
    cr_assert_null(cpc_expr_parse("(r-s-1)%R", CPC_NO_SPAN, &e));
    cr_assert(cpc_expr_uses(e, 'r'));
    cr_assert(cpc_expr_uses(e, 's'));
    cr_assert(cpc_expr_uses(e, 'R'));
    cr_assert_not(cpc_expr_uses(e, 'u'));
    cr_assert_not(cpc_expr_uses(e, 'U'));
    cpc_expr *c = cpc_expr_clone(e);
    cr_assert_not_null(c);
    cr_assert_str_eq(cpc_expr_text(c), cpc_expr_text(e));
    cpc_expr_free(e); /* the clone is independent */
    cpc_coords k = C(0, 0, 1, 4, 1);
    int64_t v;
    cr_assert_null(cpc_expr_eval(c, &k, &v));
    cr_assert_eq(v, 2);
    cpc_expr_free(c);
    cr_assert_null(cpc_expr_clone(NULL));
    cpc_expr_free(NULL);
}
