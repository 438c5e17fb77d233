/* test_yaml.c - the YAML tree (compiler/ir/yaml_tree.h): structure, spans,
 * strict typing, refused features (CP100), duplicate keys (CP105), caps
 * (CP106), the file reader and the editing API. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "yaml_tree.h"

/* Parses `text`; returns the diagnostics, tree in *t. */
static cpc_status *parse(const char *text, cpc_ytree **t)
{
    return cpc_ytree_parse_string(text, strlen(text), "t.yaml", t);
}

/* Parses text that must be fine. */
static cpc_ytree *parse_ok(const char *text)
{
    cpc_ytree *t = NULL;
    cpc_status *st = parse(text, &t);
    if (st)
        cpc_status_print(st, stderr, "test");
    cr_assert_null(st, "unexpected diagnostics for: %s", text);
    cr_assert_not_null(t);
    return t;
}

/* Parses text that must fail with `rule` first, at line:col. */
static void parse_fails(const char *text, int rule, int line, int col)
{
    cpc_ytree *t = NULL;
    cpc_status *st = parse(text, &t);
    cr_assert_not_null(st, "expected CP%03d for: %s", rule, text);
    cr_assert(cpc_status_has_error(st));
    cr_assert_eq(st->code, CPC_E_PLAN);
    cr_assert_eq(st->rule, rule, "rule %d, expected %d (%s) for: %s", st->rule, rule,
                 st->message, text);
    cr_assert_str_eq(st->span.file, "t.yaml");
    if (line) {
        cr_assert_eq(st->span.line, line, "line %d, expected %d (%s)", st->span.line, line,
                     st->message);
        cr_assert_eq(st->span.col, col, "col %d, expected %d (%s)", st->span.col, col,
                     st->message);
    }
    if (rule != 105)
        cr_assert_null(t);
    cpc_ytree_free(t);
    cpc_status_free(st);
}

/* Type of the value of key v in "v: TEXT". */
static cpc_ytype type_of(const char *value_text)
{
    char buf[256];
    snprintf(buf, sizeof buf, "v: %s\n", value_text);
    cpc_ytree *t = parse_ok(buf);
    cpc_ytype ty = cpc_ynode_type(cpc_ynode_get(t->root, "v"));
    cpc_ytree_free(t);
    return ty;
}

Test(yaml, structure_and_spans)
{
    const char *text = "# comment\n"
                       "model:\n"
                       "  heads: 24\n"
                       "  name: 'abc'\n"
                       "list:\n"
                       "  - {a: 1, b: [x, \"y\"]}\n"
                       "  - |\n"
                       "    block\n";
    cpc_ytree *t = parse_ok(text);
    const cpc_ynode *root = t->root;
    cr_assert_eq(root->kind, CPC_YNODE_MAPPING);
    cr_assert_eq(cpc_ynode_count(root), 2);
    cr_assert_eq(root->span.line, 2);
    cr_assert_eq(root->span.col, 1);
    cr_assert_str_eq(root->span.file, "t.yaml");

    const cpc_ynode *kn = NULL;
    const cpc_ynode *model = cpc_ynode_get2(root, "model", &kn);
    cr_assert_eq(kn->span.line, 2);
    cr_assert_eq(kn->span.col, 1);
    cr_assert_eq(model->kind, CPC_YNODE_MAPPING);
    cr_assert_not(model->flow);
    const cpc_ynode *heads = cpc_ynode_get2(model, "heads", &kn);
    cr_assert_eq(kn->span.line, 3);
    cr_assert_eq(kn->span.col, 3);
    cr_assert_eq(heads->span.line, 3);
    cr_assert_eq(heads->span.col, 10);
    cr_assert_eq(heads->style, CPC_YSTYLE_PLAIN);
    const cpc_ynode *name = cpc_ynode_get(model, "name");
    cr_assert_eq(name->style, CPC_YSTYLE_SINGLE_QUOTED);
    cr_assert_eq(name->span.col, 9);
    cr_assert(cpc_ynode_is(name, "abc"));

    const cpc_ynode *list = cpc_ynode_get(root, "list");
    cr_assert_eq(list->kind, CPC_YNODE_SEQUENCE);
    cr_assert_eq(cpc_ynode_count(list), 2);
    const cpc_ynode *m0 = cpc_ynode_item(list, 0);
    cr_assert(m0->flow);
    cr_assert_eq(m0->span.line, 6);
    cr_assert_eq(m0->span.col, 5);
    const cpc_ynode *b = cpc_ynode_get(m0, "b");
    cr_assert(b->flow);
    cr_assert_eq(b->kind, CPC_YNODE_SEQUENCE);
    cr_assert_eq(cpc_ynode_item(b, 1)->style, CPC_YSTYLE_DOUBLE_QUOTED);
    cr_assert_eq(cpc_ynode_item(b, 1)->span.col, 19);
    const cpc_ynode *blk = cpc_ynode_item(list, 1);
    cr_assert_eq(blk->style, CPC_YSTYLE_LITERAL);
    cr_assert_str_eq(blk->str, "block\n");
    cr_assert_eq(blk->span.line, 7);
    cr_assert_eq(blk->span.col, 5);

    /* iteration helpers */
    cr_assert(cpc_ynode_is(cpc_ynode_key(root, 1), "list"));
    cr_assert_eq(cpc_ynode_value(root, 1), list);
    cr_assert_null(cpc_ynode_key(root, 2));
    cr_assert_null(cpc_ynode_item(root, 0));
    cr_assert_null(cpc_ynode_get(list, "x"));
    cr_assert_null(cpc_ynode_get(NULL, "x"));
    cr_assert_eq(cpc_ynode_find(root, "list"), 1);
    cr_assert_eq(cpc_ynode_find(root, "nope"), -1);
    cr_assert_eq(cpc_ynode_depth(root), 4);
    cpc_ytree_free(t);
}

Test(yaml, empty_stream_has_no_root)
{
    cpc_ytree *t = parse_ok("# only a comment\n");
    cr_assert_null(t->root);
    cpc_ytree_free(t);
    t = parse_ok("");
    cr_assert_null(t->root);
    cpc_ytree_free(t);
}

Test(yaml, strict_typing)
{
    /* integers: plain decimal only */
    cr_assert_eq(type_of("8"), CPC_YTYPE_INT);
    cr_assert_eq(type_of("-7"), CPC_YTYPE_INT);
    cr_assert_eq(type_of("+7"), CPC_YTYPE_INT);
    cr_assert_eq(type_of("007"), CPC_YTYPE_INT);
    cr_assert_eq(type_of("\"8\""), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("'8'"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("0x18"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("0o17"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("1_000"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("24.0"), CPC_YTYPE_FLOAT);
    cr_assert_eq(type_of("1e3"), CPC_YTYPE_FLOAT);
    cr_assert_eq(type_of(".5"), CPC_YTYPE_FLOAT);
    cr_assert_eq(type_of("5."), CPC_YTYPE_FLOAT);
    cr_assert_eq(type_of("-.inf"), CPC_YTYPE_FLOAT);
    cr_assert_eq(type_of(".NaN"), CPC_YTYPE_FLOAT);
    cr_assert_eq(type_of("1e"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("."), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("-x"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("inf"), CPC_YTYPE_STRING);
    /* booleans: true/false only */
    cr_assert_eq(type_of("true"), CPC_YTYPE_BOOL);
    cr_assert_eq(type_of("false"), CPC_YTYPE_BOOL);
    cr_assert_eq(type_of("True"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("yes"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("on"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("\"true\""), CPC_YTYPE_STRING);
    /* null */
    cr_assert_eq(type_of(""), CPC_YTYPE_NULL);
    cr_assert_eq(type_of("~"), CPC_YTYPE_NULL);
    cr_assert_eq(type_of("null"), CPC_YTYPE_NULL);
    cr_assert_eq(type_of("NULL"), CPC_YTYPE_NULL);
    cr_assert_eq(type_of("nULL"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("''"), CPC_YTYPE_STRING);
    /* strings and collections */
    cr_assert_eq(type_of("bf16"), CPC_YTYPE_STRING);
    cr_assert_eq(type_of("{a: 1}"), CPC_YTYPE_MAPPING);
    cr_assert_eq(type_of("[1]"), CPC_YTYPE_SEQUENCE);
    cr_assert_str_eq(cpc_ytype_name(CPC_YTYPE_INT), "integer");
    cr_assert_str_eq(cpc_ytype_name(CPC_YTYPE_BOOL), "boolean");
}

Test(yaml, typed_values_and_overflow)
{
    cpc_ytree *t = parse_ok("max: 9223372036854775807\n"
                            "over: 9223372036854775808\n"
                            "min: -9223372036854775808\n"
                            "under: -9223372036854775809\n"
                            "q: \"8\"\n"
                            "f: 24.5\n"
                            "i: 24\n"
                            "big: 1e400\n"
                            "tiny: 1e-400\n"
                            "t: true\n"
                            "y: yes\n"
                            "s: hello\n"
                            "n: ~\n");
    const cpc_ynode *r = t->root;
    int64_t v = 0;
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(r, "max"), &v), CPC_YCONV_OK);
    cr_assert_eq(v, INT64_MAX);
    v = 42;
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(r, "over"), &v), CPC_YCONV_RANGE);
    cr_assert_eq(v, 42, "unchanged on failure");
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(r, "min"), &v), CPC_YCONV_OK);
    cr_assert_eq(v, INT64_MIN);
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(r, "under"), &v), CPC_YCONV_RANGE);
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(r, "q"), &v), CPC_YCONV_TYPE);
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(r, "f"), &v), CPC_YCONV_TYPE);
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(r, "i"), &v), CPC_YCONV_OK);
    cr_assert_eq(v, 24);

    double d = 0;
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(r, "f"), &d), CPC_YCONV_OK);
    cr_assert_float_eq(d, 24.5, 0);
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(r, "i"), &d), CPC_YCONV_OK, "ints are floats");
    cr_assert_float_eq(d, 24.0, 0);
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(r, "big"), &d), CPC_YCONV_RANGE);
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(r, "tiny"), &d), CPC_YCONV_OK);
    cr_assert(d >= 0 && d < 1e-300);
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(r, "q"), &d), CPC_YCONV_TYPE);

    bool b = false;
    cr_assert_eq(cpc_ynode_bool(cpc_ynode_get(r, "t"), &b), CPC_YCONV_OK);
    cr_assert(b);
    cr_assert_eq(cpc_ynode_bool(cpc_ynode_get(r, "y"), &b), CPC_YCONV_TYPE);
    cr_assert_eq(cpc_ynode_bool(cpc_ynode_get(r, "i"), &b), CPC_YCONV_TYPE);

    const char *s = NULL;
    cr_assert_eq(cpc_ynode_string(cpc_ynode_get(r, "s"), &s), CPC_YCONV_OK);
    cr_assert_str_eq(s, "hello");
    cr_assert_eq(cpc_ynode_string(cpc_ynode_get(r, "q"), &s), CPC_YCONV_OK);
    cr_assert_str_eq(s, "8");
    cr_assert_eq(cpc_ynode_string(cpc_ynode_get(r, "i"), &s), CPC_YCONV_TYPE);
    cr_assert_eq(cpc_ynode_string(cpc_ynode_get(r, "n"), &s), CPC_YCONV_TYPE);
    cr_assert_eq(cpc_ynode_string(cpc_ynode_get(r, "y"), &s), CPC_YCONV_OK, "yes is a string");
    cr_assert_eq(cpc_ynode_string(NULL, &s), CPC_YCONV_TYPE);
    cpc_ytree_free(t);
}

Test(yaml, special_floats)
{
    cpc_ytree *t = parse_ok("a: .inf\nb: -.Inf\nc: .nan\nd: -2.5e-3\n");
    double d = 0;
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(t->root, "a"), &d), CPC_YCONV_OK);
    cr_assert(isinf(d) && d > 0);
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(t->root, "b"), &d), CPC_YCONV_OK);
    cr_assert(isinf(d) && d < 0);
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(t->root, "c"), &d), CPC_YCONV_OK);
    cr_assert(isnan(d));
    cr_assert_eq(cpc_ynode_float(cpc_ynode_get(t->root, "d"), &d), CPC_YCONV_OK);
    cr_assert_float_eq(d, -2.5e-3, 1e-18);
    cpc_ytree_free(t);
}

Test(yaml, describe)
{
    cpc_ytree *t = parse_ok("a: \"8\"\nb: 0x18\nc: 1_000\nd: 24.0\ne: yes\nf: 24\ng: abc\n"
                            "h: {x: 1}\ni: [1]\nj:\nk: True\nl: \"a\\nb\"\nm: null\nn: ~\n");
    char buf[200];
    const cpc_ynode *r = t->root;
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "a"), buf, sizeof buf),
                     "quoted string \"8\"");
    cr_assert(strstr(cpc_ynode_describe(cpc_ynode_get(r, "b"), buf, sizeof buf),
                     "hexadecimal number 0x18"));
    cr_assert(strstr(cpc_ynode_describe(cpc_ynode_get(r, "c"), buf, sizeof buf),
                     "number with underscores 1_000"));
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "d"), buf, sizeof buf), "float 24.0");
    cr_assert(strstr(cpc_ynode_describe(cpc_ynode_get(r, "e"), buf, sizeof buf),
                     "YAML 1.1 boolean"));
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "f"), buf, sizeof buf), "integer 24");
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "g"), buf, sizeof buf), "string 'abc'");
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "h"), buf, sizeof buf), "a mapping");
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "i"), buf, sizeof buf), "a sequence");
    cr_assert(strstr(cpc_ynode_describe(cpc_ynode_get(r, "j"), buf, sizeof buf), "null"));
    cr_assert(strstr(cpc_ynode_describe(cpc_ynode_get(r, "k"), buf, sizeof buf), "lowercase"));
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "l"), buf, sizeof buf),
                     "quoted string \"a\\nb\"");
    /* null itself is not named twice ("found null null"); ~ says which null */
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "m"), buf, sizeof buf), "null");
    cr_assert_str_eq(cpc_ynode_describe(cpc_ynode_get(r, "n"), buf, sizeof buf), "null ~");
    /* truncation keeps the buffer terminated */
    char small[16];
    cpc_ynode_describe(cpc_ynode_get(r, "b"), small, sizeof small);
    cr_assert_lt(strlen(small), sizeof small);
    cpc_ytree_free(t);

    char e[16];
    cr_assert_str_eq(cpc_yaml_escape("a\x01\"", 3, e, sizeof e), "a\\x01\\\"");
    cr_assert_str_eq(cpc_yaml_escape("0123456789abcdef", 16, e, sizeof e), "0123456789ab...");
}

Test(yaml, nul_in_double_quoted)
{
    cpc_ytree *t = parse_ok("a: \"x\\0y\"\n");
    const cpc_ynode *a = cpc_ynode_get(t->root, "a");
    cr_assert_eq(a->len, 3);
    cr_assert_eq(a->str[1], 0);
    cr_assert_not(cpc_ynode_is(a, "x"));
    cpc_ytree_free(t);
}

Test(yaml, refused_features)
{
    parse_fails("a: &x 1\nb: 2\n", 100, 1, 4);          /* anchor */
    parse_fails("a: 1\nb: *x\n", 100, 2, 4);            /* alias */
    parse_fails("a: !!int 5\n", 100, 1, 4);             /* tag */
    parse_fails("a: !foo x\n", 100, 1, 4);              /* local tag */
    parse_fails("a: !!map {b: 1}\n", 100, 1, 4);        /* tag on a collection */
    parse_fails("a: &m [1]\n", 100, 1, 4);              /* anchor on a collection */
    parse_fails("a: 1\n---\nb: 2\n", 100, 2, 1);        /* second document */
    parse_fails("--- 1\n--- 2\n", 100, 2, 1);
    parse_fails("%TAG !e! tag:example.com,2000:\n---\na: 1\n", 100, 0, 0);
    parse_fails("? [a, b]\n: 1\n", 100, 1, 3);          /* complex key */
    parse_fails("{[1]: 2}\n", 100, 1, 2);
}

Test(yaml, one_explicit_document_is_fine)
{
    cpc_ytree *t = parse_ok("%YAML 1.1\n---\na: 1\n...\n");
    cr_assert_eq(cpc_ynode_count(t->root), 1);
    cpc_ytree_free(t);
}

Test(yaml, syntax_errors_carry_libyaml_text)
{
    cpc_ytree *t = NULL;
    cpc_status *st = parse("a: [1, 2\nb: 3\n", &t);
    cr_assert_null(t);
    cr_assert_not_null(st);
    cr_assert_eq(st->rule, 100);
    cr_assert(strstr(st->message, "did not find expected ',' or ']'"), "%s", st->message);
    cr_assert_eq(st->span.line, 2);
    cr_assert_not_null(st->notes, "libyaml's context position is a note");
    cr_assert_eq(st->notes->span.line, 1);
    cr_assert_eq(st->notes->span.col, 4);
    cpc_status_free(st);

    st = parse("a: b: c\n", &t);
    cr_assert_null(t);
    cr_assert_eq(st->rule, 100);
    cr_assert(strstr(st->message, "mapping values are not allowed"), "%s", st->message);
    cr_assert_eq(st->span.line, 1);
    cr_assert_eq(st->span.col, 5);
    cpc_status_free(st);

    st = parse("a:\n\tb: 1\n", &t); /* a tab as indentation */
    cr_assert_null(t);
    cr_assert_eq(st->rule, 100);
    cpc_status_free(st);

    /* invalid UTF-8 (reader error): position from the byte offset */
    st = parse("a: 1\nb: \xff\n", &t);
    cr_assert_null(t);
    cr_assert_eq(st->rule, 100);
    cr_assert_eq(st->span.line, 2);
    cr_assert_eq(st->span.col, 4);
    cpc_status_free(st);

    /* a NUL byte in the input */
    static const char withnul[] = "a: 1\0\nb: 2\n";
    st = cpc_ytree_parse_string(withnul, sizeof withnul - 1, "t.yaml", &t);
    cr_assert_null(t);
    cr_assert_eq(st->rule, 100);
    cpc_status_free(st);
}

Test(yaml, duplicate_keys)
{
    cpc_ytree *t = NULL;
    cpc_status *st = parse("a: 1\nb: 2\na: 3\nm: {x: 1, x: 2, x: 3}\n", &t);
    cr_assert_not_null(st);
    cr_assert_not_null(t, "CP105 only: the tree is returned");
    cr_assert_eq(cpc_status_count(st, CPC_SEV_ERROR), 3);
    cr_assert_eq(st->rule, 105);
    cr_assert_eq(st->span.line, 3);
    cr_assert_eq(st->span.col, 1);
    cr_assert(strstr(st->message, "'a'"));
    cr_assert_not_null(st->notes);
    cr_assert_eq(st->notes->span.line, 1);
    cr_assert_eq(st->next->rule, 105);
    cr_assert_eq(st->next->span.col, 11);
    cr_assert_eq(st->next->next->span.col, 17);
    /* the first occurrence is kept */
    cr_assert_eq(cpc_ynode_count(t->root), 3);
    int64_t v = 0;
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(t->root, "a"), &v), CPC_YCONV_OK);
    cr_assert_eq(v, 1);
    const cpc_ynode *m = cpc_ynode_get(t->root, "m");
    cr_assert_eq(cpc_ynode_count(m), 1);
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(m, "x"), &v), CPC_YCONV_OK);
    cr_assert_eq(v, 1);
    cpc_status_free(st);
    cpc_ytree_free(t);

    /* keys compare by text: "1" and 1 are the same key */
    st = parse("1: a\n'1': b\n", &t);
    cr_assert_not_null(st);
    cr_assert_eq(st->rule, 105);
    cpc_status_free(st);
    cpc_ytree_free(t);
}

static char *nested(int levels, bool flow)
{
    size_t cap = flow ? (size_t)levels * 2 + 16 : (size_t)levels * ((size_t)levels + 4) + 16;
    char *s = malloc(cap);
    size_t o = 0;
    if (flow) {
        for (int i = 0; i < levels; i++)
            s[o++] = '[';
        s[o++] = '1';
        for (int i = 0; i < levels; i++)
            s[o++] = ']';
    } else {
        for (int i = 0; i < levels; i++) {
            for (int j = 0; j < i; j++)
                s[o++] = ' ';
            s[o++] = 'k';
            s[o++] = ':';
            s[o++] = '\n';
        }
        s[o - 1] = ' ';
        s[o++] = '1';
    }
    s[o++] = '\n';
    s[o] = 0;
    return s;
}

Test(yaml, depth_cap)
{
    char *s = nested(64, true);
    cpc_ytree *t = parse_ok(s);
    cr_assert_eq(cpc_ynode_depth(t->root), 64);
    cpc_ytree_free(t);
    free(s);
    s = nested(65, true);
    parse_fails(s, 106, 1, 65);
    free(s);
    s = nested(64, false);
    t = parse_ok(s);
    cr_assert_eq(cpc_ynode_depth(t->root), 64);
    cpc_ytree_free(t);
    free(s);
    s = nested(65, false);
    parse_fails(s, 106, 65, 65);
    free(s);
    /* very deep input stops at the cap without exhausting anything */
    s = nested(100000, true);
    parse_fails(s, 106, 1, 65);
    free(s);
}

Test(yaml, size_cap)
{
    size_t n = CPC_YAML_MAX_BYTES;
    char *s = malloc(n + 2);
    memcpy(s, "a: 1\n#", 6);
    memset(s + 6, 'x', n - 7);
    s[n - 1] = '\n';
    cpc_ytree *t = NULL;
    cpc_status *st = cpc_ytree_parse_string(s, n, "big.yaml", &t);
    cr_assert_null(st, "exactly 1 MiB is accepted");
    cr_assert_not_null(t);
    cpc_ytree_free(t);
    s[n] = '\n';
    st = cpc_ytree_parse_string(s, n + 1, "big.yaml", &t);
    cr_assert_not_null(st);
    cr_assert_eq(st->rule, 106);
    cr_assert_null(t);
    cpc_status_free(st);

    /* the same through the file reader */
    char path[] = "/tmp/cpc_test_yaml_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, s, n + 1), (ssize_t)(n + 1));
    close(fd);
    st = cpc_ytree_parse_file(path, &t);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_PLAN);
    cr_assert_eq(st->rule, 106);
    cr_assert_str_eq(st->span.file, path);
    cr_assert_null(t);
    cpc_status_free(st);
    unlink(path);
    free(s);
}

Test(yaml, file_reader)
{
    char path[] = "/tmp/cpc_test_yaml_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *text = "x: 1\ny: [a, b]\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    cpc_ytree *t = NULL;
    cpc_status *st = cpc_ytree_parse_file(path, &t);
    cr_assert_null(st);
    cr_assert_str_eq(cpc_ynode_get(t->root, "y")->span.file, path);
    cr_assert_eq(cpc_ynode_get(t->root, "y")->span.line, 2);
    cpc_ytree_free(t);
    unlink(path);

    st = cpc_ytree_parse_file("/nonexistent/dir/plan.yaml", &t);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_IO);
    cr_assert_null(t);
    cpc_status_free(st);

    st = cpc_ytree_parse_file("/tmp", &t); /* a directory */
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_IO);
    cr_assert_null(t);
    cpc_status_free(st);
}

Test(yaml, parse_at_offsets)
{
    cpc_ytree *t = NULL;
    cpc_status *st = cpc_ytree_parse_string_at("{a: 1}", 6, "<--set>", 3, 20, &t);
    cr_assert_null(st);
    const cpc_ynode *k = NULL;
    const cpc_ynode *v = cpc_ynode_get2(t->root, "a", &k);
    cr_assert_str_eq(v->span.file, "<--set>");
    cr_assert_eq(t->root->span.line, 3);
    cr_assert_eq(t->root->span.col, 20);
    cr_assert_eq(k->span.col, 21);
    cr_assert_eq(v->span.col, 24);
    cpc_ytree_free(t);
    st = cpc_ytree_parse_string_at("[1,", 3, "<--set>", 2, 10, &t);
    cr_assert_not_null(st);
    cr_assert_eq(st->rule, 100);
    cr_assert_str_eq(st->span.file, "<--set>");
    cr_assert_eq(st->span.line, 2, "the error at the end stays on the argument's line");
    cr_assert_eq(st->span.col, 13);
    cpc_status_free(st);
}

Test(yaml, editing)
{
    cpc_ytree *t = parse_ok("a: 1\ns: [x, y]\n");
    const char *f = cpc_ytree_intern_file(t, "<--set>");
    cr_assert_eq(f, cpc_ytree_intern_file(t, "<--set>"), "interned once");
    cpc_span sp = {f, 1, 1};
    /* replace */
    cr_assert(cpc_ynode_map_put(t->root, cpc_ynode_new_scalar("a", 1, CPC_YSTYLE_PLAIN, sp),
                                cpc_ynode_new_scalar("2", 1, CPC_YSTYLE_PLAIN, sp)));
    cr_assert_eq(cpc_ynode_count(t->root), 2);
    int64_t v = 0;
    cr_assert_eq(cpc_ynode_int(cpc_ynode_get(t->root, "a"), &v), CPC_YCONV_OK);
    cr_assert_eq(v, 2);
    cr_assert_str_eq(cpc_ynode_get(t->root, "a")->span.file, "<--set>");
    /* append */
    cpc_ynode *m = cpc_ynode_new_mapping(false, sp);
    cr_assert(cpc_ynode_map_put(t->root, cpc_ynode_new_scalar("b", 1, CPC_YSTYLE_PLAIN, sp), m));
    cr_assert_eq(cpc_ynode_count(t->root), 3);
    cr_assert_eq(cpc_ynode_get(t->root, "b"), m);
    /* a non-scalar key is refused (and freed) */
    cr_assert_not(cpc_ynode_map_put(m, cpc_ynode_new_mapping(true, sp),
                                    cpc_ynode_new_scalar("1", 1, CPC_YSTYLE_PLAIN, sp)));
    /* sequences */
    cpc_ynode *s = (cpc_ynode *)cpc_ynode_get(t->root, "s");
    cr_assert(cpc_ynode_seq_set(s, 1, cpc_ynode_new_scalar("z", 1, CPC_YSTYLE_PLAIN, sp)));
    cr_assert(cpc_ynode_is(cpc_ynode_item(s, 1), "z"));
    cr_assert_not(cpc_ynode_seq_set(s, 2, cpc_ynode_new_scalar("w", 1, CPC_YSTYLE_PLAIN, sp)));
    cr_assert(cpc_ynode_seq_append(s, cpc_ynode_new_scalar("w", 1, CPC_YSTYLE_PLAIN, sp)));
    cr_assert_eq(cpc_ynode_count(s), 3);
    /* adopt a parsed value: its spans stay valid after its tree is gone */
    cpc_ytree *vt = NULL;
    cr_assert_null(cpc_ytree_parse_string("{h: 5}", 6, "other", &vt));
    cpc_ynode *val = cpc_ytree_adopt(t, vt);
    cr_assert_not_null(val);
    cr_assert(cpc_ynode_map_put(t->root, cpc_ynode_new_scalar("c", 1, CPC_YSTYLE_PLAIN, sp), val));
    cr_assert_str_eq(cpc_ynode_get(cpc_ynode_get(t->root, "c"), "h")->span.file, "other");
    cr_assert_eq(cpc_ynode_depth(t->root), 2);
    cpc_ytree_free(t);
}
