/*
 * test_validate.c - the validate stage (compiler/validate.h): every CP0xx rule
 * of SPEC section 2 that needs only the plan, at its boundaries (degree 1,
 * equal, one more, one less, zero, overflow), variant inference and derived
 * degrees (SPEC section 1), the staged reporting, the candidate list and the
 * tie rule, fallback: auto, spans and notes, and a randomized check that
 * every hint that is offered actually runs the plan.
 *
 * Plans are built by hand here (no YAML); tests/test_cases.c goes through
 * the real loader.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "validate.h"

/* ------------------------------------------------------------------------ */
/* A hand-built plan: FLUX.1-dev 1024x1024 (24 heads x 128, text 512 +      */
/* image 4096) on P ranks, variant omitted (auto).                           */
/* ------------------------------------------------------------------------ */

typedef struct tplan {
    cpc_plan p;
    cpc_segment seg[8];
    cpc_plan_key_span keys[16];
} tplan;

static void set_segs(tplan *t, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    static const char *const names[] = {"text", "image", "s2", "s3", "s4", "s5", "s6", "s7"};
    t->p.input.n_segments = n;
    t->p.input.segments = t->seg;
    t->p.input.total_tokens = 0;
    for (int i = 0; i < n; i++) {
        t->seg[i].name = (char *)names[i];
        t->seg[i].tokens = va_arg(ap, int64_t);
        t->seg[i].span = CPC_NO_SPAN;
        t->p.input.total_tokens += t->seg[i].tokens;
    }
    va_end(ap);
}

static void base(tplan *t, int P)
{
    memset(t, 0, sizeof *t);
    cpc_plan *p = &t->p;
    p->file = (char *)"t.yaml";
    p->name = (char *)"t";
    p->version = 1;
    p->model.heads = 24;
    p->model.kv_heads = 24;
    p->model.head_dim = 128;
    p->model.dtype = CPC_DTYPE_BF16;
    p->model.layers = 57;
    p->input.batch = 1;
    set_segs(t, 2, (int64_t)512, (int64_t)4096);
    p->cluster.world_size = P;
    p->cluster.gpus_per_node = P < 8 ? P : 8;
    p->parallel.variant = CPC_VARIANT_AUTO;
    p->parallel.variant_given = false;
}

static void variant(tplan *t, cpc_variant v)
{
    t->p.parallel.variant = v;
    t->p.parallel.variant_given = true;
}

static void degrees(tplan *t, int R, int U)
{
    t->p.parallel.ring_degree = R;
    t->p.parallel.ulysses_degree = U;
}

/* Records a key as written (so that an explicit 0 counts as given). */
static void key(tplan *t, const char *k, int line, int col)
{
    cpc_plan_key_span *ks = &t->keys[t->p.n_key_spans++];
    ks->key = (char *)k;
    ks->key_span = (cpc_span){"t.yaml", line, col};
    ks->value_span = (cpc_span){"t.yaml", line, col + 10};
    t->p.key_spans = t->keys;
}

static bool has_rule(const cpc_status *st, int rule, cpc_severity sev)
{
    for (; st; st = st->next)
        if (st->rule == rule && st->severity == sev)
            return true;
    return false;
}

static int count_rule(const cpc_status *st, int rule)
{
    int n = 0;
    for (; st; st = st->next)
        n += st->rule == rule && st->severity == CPC_SEV_ERROR;
    return n;
}

static const cpc_status *find_rule(const cpc_status *st, int rule)
{
    for (; st; st = st->next)
        if (st->rule == rule)
            return st;
    return NULL;
}

/* Runs the validator; returns the chain and leaves the selection in *sel. */
static cpc_status *run(tplan *t, cpc_selection *sel)
{
    return cpc_validate(&t->p, sel);
}

/* Expects rejection with `rule` as an error (and only errors of its stage). */
static void expect_reject(tplan *t, int rule)
{
    cpc_selection sel;
    cpc_status *st = run(t, &sel);
    cr_expect(cpc_status_has_error(st), "expected CP%03d, got acceptance", rule);
    cr_expect(has_rule(st, rule, CPC_SEV_ERROR), "expected CP%03d among the errors (first: CP%03d %s)", rule,
              st ? st->rule : 0, st ? st->message : "");
    cr_expect_eq(sel.selected, -1);
    for (const cpc_status *e = st; e; e = e->next)
        cr_expect_eq(e->code, CPC_E_PLAN);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

static void expect_accept(tplan *t, cpc_variant v, int R, int U)
{
    cpc_selection sel;
    cpc_status *st = run(t, &sel);
    cr_expect(!cpc_status_has_error(st), "expected acceptance of %s %dx%d, got CP%03d: %s", cpc_variant_name(v),
              R, U, st ? st->rule : 0, st ? st->message : "");
    cr_assert_geq(sel.selected, 0);
    const cpc_candidate *c = &sel.candidates[sel.selected];
    cr_expect_eq(c->variant, v, "selected %s, expected %s", cpc_variant_name(c->variant), cpc_variant_name(v));
    cr_expect_eq(c->ring_degree, R, "ring_degree %d, expected %d", c->ring_degree, R);
    cr_expect_eq(c->ulysses_degree, U, "ulysses_degree %d, expected %d", c->ulysses_degree, U);
    cr_expect(c->ok);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

/* ------------------------------------------------------------------------ */
/* Stage 2: degrees                                                          */
/* ------------------------------------------------------------------------ */

Test(degrees, cp001_both_one)
{
    tplan t;
    base(&t, 1);
    variant(&t, CPC_VARIANT_ULYSSES);
    degrees(&t, 0, 1);
    expect_reject(&t, 1);
    base(&t, 1);
    variant(&t, CPC_VARIANT_RING); /* derived 1x1 at world_size 1 */
    expect_reject(&t, 1);
    base(&t, 4); /* variant omitted, both written as 1 (diffusers' default) */
    degrees(&t, 1, 1);
    expect_reject(&t, 1);
    base(&t, 1); /* none is the world_size 1 baseline */
    variant(&t, CPC_VARIANT_NONE);
    expect_accept(&t, CPC_VARIANT_NONE, 1, 1);
}

Test(degrees, cp002_below_one)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_RING);
    degrees(&t, 0, 0);
    key(&t, "parallel.ring_degree", 20, 3); /* written as 0 */
    expect_reject(&t, 2);
    base(&t, 4);
    variant(&t, CPC_VARIANT_RING);
    degrees(&t, -1, 0);
    expect_reject(&t, 2);
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES);
    degrees(&t, 0, -4);
    expect_reject(&t, 2);
    base(&t, 4); /* variant omitted: a degree written as 0 */
    degrees(&t, 0, 0);
    key(&t, "parallel.ulysses_degree", 20, 3);
    expect_reject(&t, 2);
    base(&t, 4); /* degree 1 is fine */
    variant(&t, CPC_VARIANT_RING);
    degrees(&t, 4, 1);
    expect_accept(&t, CPC_VARIANT_RING, 4, 1);
}

Test(degrees, cp003_product_equals_world)
{
    tplan t;
    int P = 8;
    int Rs[] = {P - 1, P, P + 1};
    for (int i = 0; i < 3; i++) {
        base(&t, P);
        variant(&t, CPC_VARIANT_RING);
        degrees(&t, Rs[i], 0);
        if (Rs[i] == P)
            expect_accept(&t, CPC_VARIANT_RING, P, 1);
        else
            expect_reject(&t, 3);
    }
    /* the seed case: 2x2 on 8 ranks */
    base(&t, 8);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 2, 2);
    expect_reject(&t, 3);
    /* unified with one degree that does not divide world_size */
    base(&t, 8);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 3, 0);
    expect_reject(&t, 3);
    /* one degree that does: the other is derived */
    base(&t, 8);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 2, 0);
    expect_accept(&t, CPC_VARIANT_UNIFIED, 2, 4);
    base(&t, 8);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 0, 2);
    expect_accept(&t, CPC_VARIANT_UNIFIED, 4, 2);
    /* a given degree that does not divide: CP003 only, no rule on the
     * derived degree (6 / 4 = 1 gave a CP013 "got 1x4": new-user trial) */
    base(&t, 6);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 0, 4);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_expect_not_null(find_rule(st, 3));
    cr_expect_null(find_rule(st, 13));
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(degrees, cp003_no_overflow)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, INT_MAX, INT_MAX);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    const cpc_status *e = find_rule(st, 3);
    cr_assert_not_null(e);
    /* the product is computed in 64 bits, never wrapped */
    cr_expect(strstr(e->message, "4611686014132420609") != NULL, "%s", e->message);
    cpc_status_free(st);
    cpc_selection_free(&sel);

    base(&t, 4);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 1 << 20, 1 << 20);
    st = run(&t, &sel);
    e = find_rule(st, 3);
    cr_assert_not_null(e);
    cr_expect(strstr(e->message, "1099511627776") != NULL, "%s", e->message);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(degrees, cp004_none_needs_world_one)
{
    tplan t;
    base(&t, 2);
    variant(&t, CPC_VARIANT_NONE);
    expect_reject(&t, 4);
    base(&t, 1);
    variant(&t, CPC_VARIANT_NONE);
    expect_accept(&t, CPC_VARIANT_NONE, 1, 1);
}

Test(degrees, cp013_unified_needs_both)
{
    tplan t;
    base(&t, 2);
    variant(&t, CPC_VARIANT_UNIFIED);
    expect_reject(&t, 13);
    base(&t, 7); /* prime: no factorisation */
    variant(&t, CPC_VARIANT_UNIFIED);
    expect_reject(&t, 13);
    base(&t, 4);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 1, 4);
    expect_reject(&t, 13);
    base(&t, 4);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 4, 1);
    expect_reject(&t, 13);
    base(&t, 4);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 2, 2);
    expect_accept(&t, CPC_VARIANT_UNIFIED, 2, 2);
}

Test(degrees, cp014_cp015_ulysses_anything)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
    degrees(&t, 2, 2);
    expect_reject(&t, 14);
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
    degrees(&t, 1, 4);
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
    base(&t, 1);
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
    degrees(&t, 1, 1);
    expect_reject(&t, 15);
    base(&t, 2);
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING); /* one more than 1 */
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 2);
}

Test(degrees, cp016_cp017_ring_anything)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_RING_ANYTHING);
    degrees(&t, 2, 2);
    expect_reject(&t, 16);
    base(&t, 1);
    variant(&t, CPC_VARIANT_RING_ANYTHING);
    expect_reject(&t, 17);
    base(&t, 2);
    variant(&t, CPC_VARIANT_RING_ANYTHING);
    expect_accept(&t, CPC_VARIANT_RING_ANYTHING, 2, 1);
}

/* ------------------------------------------------------------------------ */
/* Stage 3: shapes                                                           */
/* ------------------------------------------------------------------------ */

Test(shapes, cp010_ring_and_unified_split)
{
    tplan t;
    int64_t lens[] = {4095, 4096, 4097};
    for (int i = 0; i < 3; i++) {
        base(&t, 4);
        variant(&t, CPC_VARIANT_RING);
        set_segs(&t, 2, (int64_t)512, lens[i]);
        if (lens[i] % 4 == 0)
            expect_accept(&t, CPC_VARIANT_RING, 4, 1);
        else
            expect_reject(&t, 10);
    }
    base(&t, 4);
    variant(&t, CPC_VARIANT_RING);
    set_segs(&t, 2, (int64_t)4097, (int64_t)4097);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_expect_eq(count_rule(st, 10), 2, "every violation of the stage is reported");
    const cpc_status *e = find_rule(st, 10);
    cr_assert_not_null(e);
    cr_expect_str_eq(e->message,
                     "ring: segment 'text' has 4097 tokens, not divisible by ring_degree 4 (4097 = 4*1024 + 1)");
    cpc_status_free(st);
    cpc_selection_free(&sel);
    /* unified splits by R*U */
    base(&t, 8);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 2, 4);
    set_segs(&t, 1, (int64_t)4100); /* divisible by 4 (U) but not by 8 */
    expect_reject(&t, 10);
}

Test(shapes, cp011_ulysses_split_spec_text)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES);
    set_segs(&t, 2, (int64_t)512, (int64_t)3969);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_assert_not_null(st);
    cr_expect_eq(st->rule, 11);
    cr_expect_eq(st->severity, CPC_SEV_ERROR);
    cr_expect_str_eq(st->message, "ulysses: segment 'image' has 3969 tokens, not divisible by ulysses_degree 4 "
                                  "(3969 = 4*992 + 1)");
    cr_assert_not_null(st->hint);
    cr_expect_str_eq(st->hint, "variant ulysses_anything or ring_anything runs this plan");
    cr_expect_null(st->next);
    cpc_status_free(st);
    cpc_selection_free(&sel);
    set_segs(&t, 2, (int64_t)512, (int64_t)3968);
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 4);
}

Test(shapes, cp012_heads_and_gqa)
{
    tplan t;
    struct { int H, Hkv, P; bool ok; } rows[] = {
        {24, 24, 4, true},  {30, 30, 4, false}, /* Z-Image's 30 heads */
        {32, 8, 4, true},   /* Hkv % U == 0: K/V heads split with their query heads */
        {32, 2, 4, true},   /* U % Hkv == 0: each K/V head replicated */
        {32, 1, 8, true},   /* MQA */
        {28, 7, 2, false},  /* neither */
        {24, 3, 4, false},  {24, 24, 16, false}, /* H % U != 0 */
        {24, 4, 8, true},   /* 8 % 4 == 0: replication */
        {16, 16, 16, true}, {16, 16, 32, false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        base(&t, rows[i].P);
        t.p.model.heads = rows[i].H;
        t.p.model.kv_heads = rows[i].Hkv;
        set_segs(&t, 1, (int64_t)4096);
        variant(&t, CPC_VARIANT_ULYSSES);
        if (rows[i].ok)
            expect_accept(&t, CPC_VARIANT_ULYSSES, 1, rows[i].P);
        else
            expect_reject(&t, 12);
    }
    /* unified checks the same rule over its ulysses group */
    base(&t, 8);
    t.p.model.heads = 28;
    t.p.model.kv_heads = 7;
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 4, 2);
    expect_reject(&t, 12);
    /* ulysses_anything accepts any H >= U and any Hkv */
    base(&t, 2);
    t.p.model.heads = 28;
    t.p.model.kv_heads = 7;
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 2);
}

/* CP018 lifted (BACKWARD.md 3.9): both anything variants train (their
 * backward programs are built and proved); CP019 still applies to masks. */
Test(shapes, cp018_anything_variants_train)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
    t.p.input.mode = CPC_MODE_TRAINING;
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
    base(&t, 4);
    variant(&t, CPC_VARIANT_RING_ANYTHING);
    t.p.input.mode = CPC_MODE_TRAINING;
    expect_accept(&t, CPC_VARIANT_RING_ANYTHING, 4, 1);
    base(&t, 4);
    variant(&t, CPC_VARIANT_RING);
    t.p.input.mode = CPC_MODE_TRAINING;
    expect_accept(&t, CPC_VARIANT_RING, 4, 1);
}

Test(shapes, cp019_ring_anything_no_mask)
{
    tplan t;
    cpc_mask ms[] = {CPC_MASK_CAUSAL, CPC_MASK_KEY_PADDING};
    for (int i = 0; i < 2; i++) {
        base(&t, 4);
        set_segs(&t, 1, (int64_t)4099);
        variant(&t, CPC_VARIANT_RING_ANYTHING);
        t.p.input.mask = ms[i];
        expect_reject(&t, 19);
    }
    /* ulysses_anything takes a causal mask (one segment) */
    base(&t, 4);
    set_segs(&t, 1, (int64_t)4099);
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
    t.p.input.mask = CPC_MASK_CAUSAL;
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
}

Test(shapes, cp020_a_token_per_rank)
{
    tplan t;
    cpc_variant vs[] = {CPC_VARIANT_ULYSSES_ANYTHING, CPC_VARIANT_RING_ANYTHING};
    for (int i = 0; i < 2; i++) {
        for (int64_t n = 3; n <= 5; n++) {
            base(&t, 4);
            set_segs(&t, 2, n, (int64_t)4096);
            variant(&t, vs[i]);
            if (n >= 4)
                expect_accept(&t, vs[i], vs[i] == CPC_VARIANT_RING_ANYTHING ? 4 : 1,
                              vs[i] == CPC_VARIANT_RING_ANYTHING ? 1 : 4);
            else
                expect_reject(&t, 20);
        }
    }
}

Test(shapes, cp021_a_head_per_rank)
{
    tplan t;
    for (int H = 3; H <= 5; H++) {
        base(&t, 4);
        t.p.model.heads = t.p.model.kv_heads = H;
        variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
        if (H >= 4)
            expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
        else
            expect_reject(&t, 21);
    }
    /* beyond diffusers: uneven heads without padding, H=24 over 16 or 7 */
    int Ps[] = {16, 7};
    for (int i = 0; i < 2; i++) {
        base(&t, Ps[i]);
        variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
        expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, Ps[i]);
    }
}

Test(shapes, cp022_causal_one_segment)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES);
    t.p.input.mask = CPC_MASK_CAUSAL;
    expect_reject(&t, 22);
    set_segs(&t, 1, (int64_t)4608);
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 4);
    /* SPEC section 2 has no exception: also variant none, and auto at
     * world_size 1 (which is none) */
    base(&t, 1);
    variant(&t, CPC_VARIANT_NONE);
    t.p.input.mask = CPC_MASK_CAUSAL;
    expect_reject(&t, 22);
    base(&t, 1);
    t.p.input.mask = CPC_MASK_CAUSAL;
    expect_reject(&t, 22);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_assert_not_null(st);
    cr_expect_str_eq(st->hint, "input.segments: [{tokens: 4608}] runs this plan");
    cpc_status_free(st);
    cpc_selection_free(&sel);
    set_segs(&t, 1, (int64_t)4608);
    expect_accept(&t, CPC_VARIANT_NONE, 1, 1);
}

Test(shapes, cp023_zigzag)
{
    tplan t;
    int64_t lens[] = {4096 - 4, 4096, 4096 + 4}; /* divisible by P=4, only 4096 by 2P=8 */
    cpc_variant vs[] = {CPC_VARIANT_RING, CPC_VARIANT_UNIFIED};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) {
            base(&t, 4);
            set_segs(&t, 1, lens[i]);
            t.p.input.mask = CPC_MASK_CAUSAL;
            variant(&t, vs[k]);
            if (lens[i] % 8 == 0)
                expect_accept(&t, vs[k], vs[k] == CPC_VARIANT_RING ? 4 : 2, vs[k] == CPC_VARIANT_RING ? 1 : 2);
            else
                expect_reject(&t, 23);
        }
    /* ulysses has no zigzag */
    base(&t, 4);
    set_segs(&t, 1, (int64_t)4100);
    t.p.input.mask = CPC_MASK_CAUSAL;
    variant(&t, CPC_VARIANT_ULYSSES);
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 4);
}

Test(shapes, cp024_causal_cross_attention)
{
    tplan t;
    base(&t, 4);
    set_segs(&t, 1, (int64_t)4096);
    t.p.input.has_kv = true;
    t.p.input.kv_tokens = 512;
    variant(&t, CPC_VARIANT_ULYSSES);
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 4);
    t.p.input.mask = CPC_MASK_CAUSAL;
    expect_reject(&t, 24);
}

Test(shapes, cp030_gqa_ratio_reported_once)
{
    tplan t;
    base(&t, 4);
    t.p.model.kv_heads = 5;
    cpc_selection sel;
    cpc_status *st = run(&t, &sel); /* auto: every candidate fails CP030 */
    cr_expect_eq(count_rule(st, 30), 1, "CP030 is the plan's, reported once");
    const cpc_status *e = find_rule(st, 30);
    cr_assert_not_null(e);
    cr_assert_not_null(e->hint);
    cr_expect(strstr(e->hint, "model.kv_heads: ") == e->hint, "%s", e->hint);
    cpc_status_free(st);
    cpc_selection_free(&sel);
    for (int hkv = 1; hkv <= 24; hkv++) {
        base(&t, 2);
        t.p.model.kv_heads = hkv;
        variant(&t, CPC_VARIANT_RING);
        if (24 % hkv == 0)
            expect_accept(&t, CPC_VARIANT_RING, 2, 1);
        else
            expect_reject(&t, 30);
    }
}

Test(shapes, cp031_head_dim_warning)
{
    int ds[] = {7, 8, 9, 100, 128, 256};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        tplan t;
        base(&t, 4);
        t.p.model.head_dim = ds[i];
        cpc_selection sel;
        cpc_status *st = run(&t, &sel);
        cr_expect(!cpc_status_has_error(st));
        cr_expect_eq(has_rule(st, 31, CPC_SEV_WARNING), ds[i] % 8 != 0, "head_dim %d", ds[i]);
        cr_expect_geq(sel.selected, 0);
        cpc_status_free(st);
        cpc_selection_free(&sel);
    }
}

Test(stages, stops_at_degrees)
{
    /* CP003 (stage 2) and an indivisible segment (stage 3): only stage 2 */
    tplan t;
    base(&t, 8);
    variant(&t, CPC_VARIANT_UNIFIED);
    degrees(&t, 2, 2);
    set_segs(&t, 2, (int64_t)512, (int64_t)3969);
    t.p.model.head_dim = 100;
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_expect(has_rule(st, 3, CPC_SEV_ERROR));
    cr_expect(!has_rule(st, 10, CPC_SEV_ERROR));
    cr_expect(!has_rule(st, 31, CPC_SEV_WARNING), "CP031 is stage 3");
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(stages, every_violation_of_shapes)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES);
    t.p.model.heads = t.p.model.kv_heads = 30;
    set_segs(&t, 2, (int64_t)513, (int64_t)3969);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_expect_eq(count_rule(st, 11), 2);
    cr_expect_eq(count_rule(st, 12), 1);
    cr_expect_eq(cpc_status_count(st, CPC_SEV_ERROR), 3);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

/* ------------------------------------------------------------------------ */
/* Inference and derivation (SPEC section 1)                                 */
/* ------------------------------------------------------------------------ */

Test(infer, from_degrees_and_flags)
{
    tplan t;
    base(&t, 4);
    degrees(&t, 2, 2);
    expect_accept(&t, CPC_VARIANT_UNIFIED, 2, 2);
    base(&t, 4);
    degrees(&t, 4, 0);
    expect_accept(&t, CPC_VARIANT_RING, 4, 1);
    base(&t, 4);
    degrees(&t, 0, 4);
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 4);
    base(&t, 4);
    degrees(&t, 4, 1); /* only ring_degree > 1 */
    expect_accept(&t, CPC_VARIANT_RING, 4, 1);
    base(&t, 4);
    t.p.parallel.ulysses_anything = true;
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
    base(&t, 4);
    t.p.parallel.ring_anything = true;
    degrees(&t, 4, 0);
    expect_accept(&t, CPC_VARIANT_RING_ANYTHING, 4, 1);
    base(&t, 4);
    t.p.parallel.ulysses_anything = true;
    degrees(&t, 2, 2);
    expect_reject(&t, 14);
    /* neither degrees nor flags: auto; auto at world_size 1: none */
    base(&t, 4);
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 4);
    base(&t, 1);
    expect_accept(&t, CPC_VARIANT_NONE, 1, 1);
    base(&t, 1);
    variant(&t, CPC_VARIANT_AUTO);
    expect_accept(&t, CPC_VARIANT_NONE, 1, 1);
}

Test(infer, requested_variant_recorded)
{
    tplan t;
    base(&t, 4);
    degrees(&t, 2, 2);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_expect_eq(sel.requested, CPC_VARIANT_UNIFIED);
    cr_assert_geq(sel.preferred, 0);
    cr_expect_eq(sel.preferred, sel.selected);
    cpc_status_free(st);
    cpc_selection_free(&sel);
    base(&t, 4);
    st = run(&t, &sel);
    cr_expect_eq(sel.requested, CPC_VARIANT_AUTO);
    cr_expect_eq(sel.preferred, -1);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(infer, conflicts_are_cp105)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_RING);
    t.p.parallel.ulysses_anything = true;
    expect_reject(&t, 105);
    base(&t, 4);
    t.p.parallel.ulysses_anything = true;
    t.p.parallel.ring_anything = true;
    expect_reject(&t, 105);
    base(&t, 4);
    variant(&t, CPC_VARIANT_RING);
    degrees(&t, 0, 2);
    expect_reject(&t, 105);
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES);
    degrees(&t, 2, 0);
    expect_reject(&t, 105);
    base(&t, 4); /* a flag that names the variant itself is fine */
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
    t.p.parallel.ulysses_anything = true;
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
}

Test(derive, unified_rule)
{
    struct { int P, gpn, H, Hkv, R, U; } rows[] = {
        {4, 4, 24, 24, 2, 2},  /* SPEC: P=4 -> 2x2 */
        {8, 8, 24, 24, 2, 4},  /* SPEC: P=8 with 8 GPUs per node -> 2x4 */
        {6, 6, 24, 24, 2, 3},  /* largest divisor below 6 */
        {7, 7, 24, 24, 7, 1},  /* prime: U = 1 (CP013) */
        {8, 2, 24, 24, 4, 2},  /* a ulysses group never straddles nodes */
        {8, 8, 6, 6, 4, 2},    /* U = 4 fails H % U */
        {8, 8, 32, 2, 2, 4},   /* U % Hkv == 0: replication is fine */
        {8, 8, 28, 7, 4, 2},   /* U = 4 fails the Hkv rule, U = 2 too: ... */
        {16, 8, 24, 24, 4, 4}, /* U = 8 fails 24 % 8? no: 24 % 8 == 0 -> see below */
        {2, 2, 24, 24, 2, 1},
    };
    /* fix-ups computed by hand: 28/7 with U=2: 7 % 2 != 0 and 2 % 7 != 0 -> U=1 */
    rows[7].R = 8;
    rows[7].U = 1;
    rows[8].R = 2; /* P=16, gpn 8: U = 8 divides 16, 8 and 24 */
    rows[8].U = 8;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        tplan t;
        base(&t, rows[i].P);
        t.p.cluster.gpus_per_node = rows[i].gpn;
        t.p.model.heads = rows[i].H;
        t.p.model.kv_heads = rows[i].Hkv;
        int R = -1, U = -1;
        cpc_derive_degrees(&t.p, CPC_VARIANT_UNIFIED, &R, &U);
        cr_expect(R == rows[i].R && U == rows[i].U, "P=%d gpn=%d H=%d Hkv=%d: got %dx%d, expected %dx%d",
                  rows[i].P, rows[i].gpn, rows[i].H, rows[i].Hkv, R, U, rows[i].R, rows[i].U);
    }
    int R, U;
    tplan t;
    base(&t, 5);
    cpc_derive_degrees(&t.p, CPC_VARIANT_RING, &R, &U);
    cr_expect(R == 5 && U == 1);
    cpc_derive_degrees(&t.p, CPC_VARIANT_RING_ANYTHING, &R, &U);
    cr_expect(R == 5 && U == 1);
    cpc_derive_degrees(&t.p, CPC_VARIANT_ULYSSES, &R, &U);
    cr_expect(R == 1 && U == 5);
    cpc_derive_degrees(&t.p, CPC_VARIANT_ULYSSES_ANYTHING, &R, &U);
    cr_expect(R == 1 && U == 5);
    cpc_derive_degrees(&t.p, CPC_VARIANT_NONE, &R, &U);
    cr_expect(R == 1 && U == 1);
}

Test(derive, unified_through_validate)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_UNIFIED);
    expect_accept(&t, CPC_VARIANT_UNIFIED, 2, 2);
    base(&t, 8);
    variant(&t, CPC_VARIANT_UNIFIED);
    expect_accept(&t, CPC_VARIANT_UNIFIED, 2, 4);
    base(&t, 6);
    variant(&t, CPC_VARIANT_UNIFIED);
    set_segs(&t, 2, (int64_t)516, (int64_t)4098); /* divisible by 6 */
    expect_accept(&t, CPC_VARIANT_UNIFIED, 2, 3);
    base(&t, 7);
    variant(&t, CPC_VARIANT_UNIFIED);
    expect_reject(&t, 13);
}

/* ------------------------------------------------------------------------ */
/* Candidates, selection, the tie rule                                       */
/* ------------------------------------------------------------------------ */

Test(select, candidate_list_is_every_variant)
{
    tplan t;
    base(&t, 8);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    /* ulysses 1x8, unified 2x4, unified 4x2, ring 8x1, ulysses_anything 1x8, ring_anything 8x1 */
    cr_assert_eq(sel.n_candidates, 6);
    cpc_variant want[] = {CPC_VARIANT_ULYSSES, CPC_VARIANT_UNIFIED, CPC_VARIANT_UNIFIED, CPC_VARIANT_RING,
                          CPC_VARIANT_ULYSSES_ANYTHING, CPC_VARIANT_RING_ANYTHING};
    int wr[] = {1, 2, 4, 8, 1, 8}, wu[] = {8, 4, 2, 1, 8, 1};
    for (int i = 0; i < 6; i++) {
        cr_expect_eq(sel.candidates[i].variant, want[i]);
        cr_expect_eq(sel.candidates[i].ring_degree, wr[i]);
        cr_expect_eq(sel.candidates[i].ulysses_degree, wu[i]);
        cr_expect(sel.candidates[i].ok);
        cr_expect(!sel.candidates[i].priced);
    }
    cr_expect_eq(sel.selected, 0);
    cpc_status_free(st);
    cpc_selection_free(&sel);
    /* prime world size: one unified entry, rejected CP013 */
    base(&t, 7);
    set_segs(&t, 1, (int64_t)7000);
    st = run(&t, &sel);
    cr_assert_eq(sel.n_candidates, 5);
    cr_expect_eq(sel.candidates[1].variant, CPC_VARIANT_UNIFIED);
    cr_expect(!sel.candidates[1].ok);
    cr_expect_eq(sel.candidates[1].errors->rule, 13);
    cr_expect_eq(sel.candidates[0].errors->rule, 12); /* 24 heads % 7 != 0 */
    cr_expect_eq(sel.selected, 2);                     /* ring 7x1: 7000 % 7 == 0 */
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(select, tie_order_without_prices)
{
    tplan t;
    base(&t, 4); /* everything runs: ulysses */
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 4);
    base(&t, 4); /* 30 heads: ulysses fails, unified 2x2 next */
    t.p.model.heads = t.p.model.kv_heads = 30;
    expect_accept(&t, CPC_VARIANT_UNIFIED, 2, 2);
    base(&t, 2); /* 2 ranks, 4097 tokens: no even split, no unified: anything */
    set_segs(&t, 1, (int64_t)4097);
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 2);
    base(&t, 4); /* training, uneven: the anything variants train (CP018 lifted) */
    set_segs(&t, 1, (int64_t)4097);
    t.p.input.mode = CPC_MODE_TRAINING;
    expect_accept(&t, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
}

static cpc_candidate cand(cpc_variant v, bool ok, bool priced, double ms, int64_t mem)
{
    cpc_candidate c;
    memset(&c, 0, sizeof c);
    c.variant = v;
    c.ok = ok;
    c.priced = priced;
    c.predicted_ms_per_forward = ms;
    c.predicted_ms_per_layer = ms / 57;
    c.memory_bytes_per_rank = mem;
    return c;
}

Test(select, tie_rule)
{
    const cpc_variant U_ = CPC_VARIANT_ULYSSES, N_ = CPC_VARIANT_UNIFIED, R_ = CPC_VARIANT_RING;
    /* lowest time wins */
    cpc_candidate a[] = {cand(U_, true, true, 10.0, 100), cand(N_, true, true, 5.0, 100), cand(R_, true, true, 7, 1)};
    cr_expect_eq(cpc_select_best(a, 3), 1);
    /* within 2%: less memory wins */
    cpc_candidate b[] = {cand(U_, true, true, 10.2, 100), cand(N_, true, true, 10.0, 200)};
    cr_expect_eq(cpc_select_best(b, 2), 0);
    /* just above 2%: time wins */
    cpc_candidate c[] = {cand(U_, true, true, 10.21, 100), cand(N_, true, true, 10.0, 200)};
    cr_expect_eq(cpc_select_best(c, 2), 1);
    /* tie in time and memory: the order */
    cpc_candidate d[] = {cand(U_, true, true, 10.0, 100), cand(N_, true, true, 10.1, 100)};
    cr_expect_eq(cpc_select_best(d, 2), 0);
    cpc_candidate d2[] = {cand(U_, true, true, 10.1, 100), cand(N_, true, true, 10.0, 100)};
    cr_expect_eq(cpc_select_best(d2, 2), 0);
    /* rejected candidates never win, however fast */
    cpc_candidate e[] = {cand(U_, false, true, 1.0, 1), cand(N_, true, true, 10.0, 200)};
    cr_expect_eq(cpc_select_best(e, 2), 1);
    /* nothing priced: the first valid in order */
    cpc_candidate f[] = {cand(U_, false, false, 0, 0), cand(N_, true, false, 0, 0), cand(R_, true, false, 0, 0)};
    cr_expect_eq(cpc_select_best(f, 3), 1);
    /* priced ones beat unpriced ones */
    cpc_candidate g[] = {cand(U_, true, false, 0, 0), cand(N_, true, true, 10.0, 200)};
    cr_expect_eq(cpc_select_best(g, 2), 1);
    /* none valid */
    cpc_candidate h[] = {cand(U_, false, false, 0, 0)};
    cr_expect_eq(cpc_select_best(h, 1), -1);
    cr_expect_eq(cpc_select_best(NULL, 0), -1);
}

/* A fake cost model: ring fastest, ring_anything rejected for memory. */
typedef struct fake_ctx {
    int calls;
} fake_ctx;

static cpc_status *fake_price(void *ctx, const cpc_plan *plan, cpc_candidate *c)
{
    fake_ctx *f = ctx;
    f->calls++;
    cr_assert(c->ok, "only valid candidates are priced");
    static const double ms[] = {[CPC_VARIANT_ULYSSES] = 10, [CPC_VARIANT_UNIFIED] = 12, [CPC_VARIANT_RING] = 5,
                                [CPC_VARIANT_ULYSSES_ANYTHING] = 11, [CPC_VARIANT_RING_ANYTHING] = 1,
                                [CPC_VARIANT_NONE] = 20};
    c->predicted_ms_per_layer = ms[c->variant];
    c->predicted_ms_per_forward = ms[c->variant] * plan->model.layers;
    c->memory_bytes_per_rank = 1000;
    c->bytes_sent_per_rank = 10;
    c->priced = true;
    if (c->variant == CPC_VARIANT_RING_ANYTHING) {
        c->ok = false;
        cpc_status_append(&c->errors, cpc_diag(CPC_E_PLAN, 40, CPC_SEV_ERROR, CPC_NO_SPAN,
                                               "ring_anything: predicted memory exceeds the device"));
    }
    return NULL;
}

Test(select, price_callback_decides)
{
    tplan t;
    base(&t, 4);
    fake_ctx f = {0};
    cpc_selection sel;
    cpc_status *st = cpc_validate_priced(&t.p, fake_price, &f, &sel);
    cr_expect(!cpc_status_has_error(st));
    cr_expect_eq(f.calls, 5);
    cr_assert_geq(sel.selected, 0);
    cr_expect_eq(sel.candidates[sel.selected].variant, CPC_VARIANT_RING);
    cr_expect(!sel.candidates[4].ok, "ring_anything rejected by the price callback");
    cpc_status_free(st);
    cpc_selection_free(&sel);

    /* the price callback's rejection counts for hints too */
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES);
    set_segs(&t, 2, (int64_t)512, (int64_t)3969);
    st = cpc_validate_priced(&t.p, fake_price, &f, &sel);
    cr_assert_not_null(st);
    cr_assert_not_null(st->hint);
    cr_expect_str_eq(st->hint, "variant ulysses_anything runs this plan");
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

static cpc_status *failing_price(void *ctx, const cpc_plan *plan, cpc_candidate *c)
{
    (void)ctx;
    (void)plan;
    (void)c;
    return cpc_error(CPC_E_INTERNAL, "cost model broke");
}

Test(select, price_failure_is_returned)
{
    tplan t;
    base(&t, 4);
    cpc_selection sel;
    cpc_status *st = cpc_validate_priced(&t.p, failing_price, NULL, &sel);
    cr_assert_not_null(st);
    cr_expect_eq(st->code, CPC_E_INTERNAL);
    cr_expect_eq(cpc_status_exit_code(st), 3);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(select, fallback_auto_warns_with_codes)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES);
    t.p.parallel.fallback = CPC_FALLBACK_AUTO;
    set_segs(&t, 2, (int64_t)512, (int64_t)3969);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_expect(!cpc_status_has_error(st));
    cr_assert_not_null(st);
    cr_expect_eq(st->severity, CPC_SEV_WARNING);
    cr_expect_eq(st->rule, 11);
    cr_expect(strstr(st->message, "CP011") != NULL, "%s", st->message);
    cr_assert_not_null(st->notes);
    cr_expect(strstr(st->notes->message, "3969") != NULL, "%s", st->notes->message);
    cr_expect(sel.fell_back);
    cr_assert_geq(sel.selected, 0);
    cr_expect_eq(sel.candidates[sel.selected].variant, CPC_VARIANT_ULYSSES_ANYTHING);
    cr_assert_geq(sel.preferred, 0);
    cr_expect_eq(sel.candidates[sel.preferred].variant, CPC_VARIANT_ULYSSES);
    cr_expect(!sel.candidates[sel.preferred].ok);
    cpc_status_free(st);
    cpc_selection_free(&sel);

    /* strict: the same plan is rejected */
    t.p.parallel.fallback = CPC_FALLBACK_STRICT;
    expect_reject(&t, 11);

    /* fallback auto with nothing valid (a causal mask over split segments,
     * CP022 for every variant; training no longer rules out the anything
     * variants): the preferred variant's errors */
    t.p.parallel.fallback = CPC_FALLBACK_AUTO;
    t.p.input.mask = CPC_MASK_CAUSAL;
    st = run(&t, &sel);
    cr_expect(cpc_status_has_error(st));
    cr_expect_eq(st->rule, 11);
    cr_expect_eq(sel.selected, -1);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

/* ------------------------------------------------------------------------ */
/* Spans and notes                                                           */
/* ------------------------------------------------------------------------ */

Test(spans, error_at_segment_note_at_world_size)
{
    tplan t;
    base(&t, 4);
    variant(&t, CPC_VARIANT_ULYSSES);
    set_segs(&t, 2, (int64_t)512, (int64_t)3969);
    t.seg[1].span = (cpc_span){"t.yaml", 9, 7};
    key(&t, "cluster.world_size", 13, 3);
    key(&t, "parallel.variant", 16, 3);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_assert_not_null(st);
    cr_expect_eq(st->span.line, 9);
    cr_expect_eq(st->span.col, 7);
    cr_assert_not_null(st->notes);
    cr_expect_eq(st->notes->span.line, 13);
    cr_expect(strstr(st->notes->message, "world_size 4") != NULL, "%s", st->notes->message);
    char *line = cpc_status_format(st, "cpc");
    cr_expect_str_eq(line, "t.yaml:9:7: error[CP011]: ulysses: segment 'image' has 3969 tokens, not divisible by "
                           "ulysses_degree 4 (3969 = 4*992 + 1); hint: variant ulysses_anything or ring_anything "
                           "runs this plan");
    free(line);
    cpc_status_free(st);
    cpc_selection_free(&sel);

    /* an explicit degree: the note points at it */
    key(&t, "parallel.ulysses_degree", 17, 3);
    degrees(&t, 0, 4);
    st = run(&t, &sel);
    cr_assert_not_null(st);
    cr_assert_not_null(st->notes);
    cr_expect_eq(st->notes->span.line, 17);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

/* ------------------------------------------------------------------------ */
/* Every hint works: apply it to the plan and validate again                 */
/* ------------------------------------------------------------------------ */

/* Accepted without falling back; when v < __COUNT, as (v, R, U). */
static bool accepted_as(tplan *t, cpc_variant v, int R, int U)
{
    cpc_selection sel;
    cpc_status *st = run(t, &sel);
    bool ok = !cpc_status_has_error(st) && sel.selected >= 0 && !sel.fell_back;
    if (ok && v < CPC_VARIANT__COUNT) {
        const cpc_candidate *c = &sel.candidates[sel.selected];
        ok = c->variant == v && c->ring_degree == R && c->ulysses_degree == U;
    }
    cpc_status_free(st);
    cpc_selection_free(&sel);
    return ok;
}

static bool has_key_span(const tplan *t, const char *k)
{
    for (int i = 0; i < t->p.n_key_spans; i++)
        if (strcmp(t->p.key_spans[i].key, k) == 0)
            return true;
    return false;
}

/* Sets one plan key to a value as `cpc --set KEY=VALUE` would (the hint's
 * "KEY: VALUE" text); false for a key or value the test does not know. */
static bool set_key(tplan *t, const char *k, const char *v)
{
    int n;
    if (strcmp(k, "parallel.variant") == 0) {
        int pv = cpc_variant_parse(v);
        if (pv < 0)
            return false;
        variant(t, (cpc_variant)pv);
        return true;
    }
    if (strcmp(k, "parallel.ulysses_anything") == 0 || strcmp(k, "parallel.ring_anything") == 0) {
        bool b = strcmp(v, "true") == 0;
        if (!b && strcmp(v, "false") != 0)
            return false;
        if (k[9] == 'u')
            t->p.parallel.ulysses_anything = b;
        else
            t->p.parallel.ring_anything = b;
        return true;
    }
    if (strcmp(k, "input.mask") == 0) {
        int m = cpc_mask_parse(v);
        t->p.input.mask = (cpc_mask)m;
        return m >= 0;
    }
    if (strcmp(k, "input.mode") == 0) {
        int m = cpc_mode_parse(v);
        t->p.input.mode = (cpc_mode)m;
        return m >= 0;
    }
    if (strcmp(k, "input.segments") == 0) {
        if (sscanf(v, "[{tokens: %d}]", &n) != 1)
            return false;
        set_segs(t, 1, (int64_t)n);
        return true;
    }
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || end == v)
        return false;
    if (strcmp(k, "parallel.ring_degree") == 0)
        t->p.parallel.ring_degree = (int)x;
    else if (strcmp(k, "parallel.ulysses_degree") == 0)
        t->p.parallel.ulysses_degree = (int)x;
    else if (strcmp(k, "model.kv_heads") == 0)
        t->p.model.kv_heads = (int)x;
    else if (strcmp(k, "cluster.world_size") == 0) {
        t->p.cluster.world_size = (int)x;
        if (!has_key_span(t, "cluster.gpus_per_node")) /* the loader's default */
            t->p.cluster.gpus_per_node = x < 8 ? (int)x : 8;
    } else
        return false;
    return true;
}

/* Applies every alternative of `hint` mechanically to a copy of `t0` (only
 * the keys the hint names: the plan's own degrees and flags stay), and
 * checks that the copy is accepted, as the "(variant RxU)" the hint names
 * when it names one.  The forms: "variant A, unified RxU or C runs this
 * plan" (set parallel.variant only), "KEY: VALUE, KEY: VALUE runs this plan
 * [(variant RxU)]", alternatives joined by "; or ". */
static bool hint_works(const tplan *t0, const char *hint, char *why, size_t whylen)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", hint);
    static const char RUNS[] = " runs this plan";
    char *alt = buf;
    while (alt) {
        char *next = strstr(alt, "; or ");
        if (next) {
            *next = '\0';
            next += 5;
        }
        char *runs = strstr(alt, RUNS);
        if (!runs) {
            snprintf(why, whylen, "no \"runs this plan\" in '%.100s'", alt);
            return false;
        }
        *runs = '\0';
        const char *tail = runs + strlen(RUNS);
        cpc_variant wv = CPC_VARIANT__COUNT;
        int wr = 0, wu = 0;
        char name[40];
        if (*tail) {
            if (sscanf(tail, " (%39[a-z_] %dx%d)", name, &wr, &wu) != 3 || cpc_variant_parse(name) < 0) {
                snprintf(why, whylen, "bad annotation '%.100s'", tail);
                return false;
            }
            wv = (cpc_variant)cpc_variant_parse(name);
        }
        if (strncmp(alt, "variant ", 8) == 0) {
            /* one key: parallel.variant, any of the names */
            char *s = alt + 8;
            while (*s) {
                int n = 0, r = 0, u = 0;
                if (sscanf(s, "%39[a-z_]%n", name, &n) != 1 || cpc_variant_parse(name) < 0) {
                    snprintf(why, whylen, "bad variant list at '%.100s'", s);
                    return false;
                }
                s += n;
                cpc_variant v = (cpc_variant)cpc_variant_parse(name);
                int m = 0;
                bool sized = sscanf(s, " %dx%d%n", &r, &u, &m) == 2 && m > 0;
                if (sized)
                    s += m;
                tplan t = *t0;
                t.p.input.segments = t.seg;
                t.p.key_spans = t.keys;
                variant(&t, v);
                if (!accepted_as(&t, sized ? v : CPC_VARIANT__COUNT, r, u)) {
                    snprintf(why, whylen, "parallel.variant: %s is not accepted%s", name, sized ? " as RxU" : "");
                    return false;
                }
                if (strncmp(s, ", ", 2) == 0)
                    s += 2;
                else if (strncmp(s, " or ", 4) == 0)
                    s += 4;
                else if (*s) {
                    snprintf(why, whylen, "bad variant list at '%.100s'", s);
                    return false;
                }
            }
        } else {
            tplan t = *t0;
            t.p.input.segments = t.seg;
            t.p.key_spans = t.keys;
            char *save = NULL;
            for (char *kv = strtok_r(alt, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
                while (*kv == ' ')
                    kv++;
                char *colon = strstr(kv, ": ");
                if (!colon) {
                    snprintf(why, whylen, "not KEY: VALUE: '%.100s'", kv);
                    return false;
                }
                *colon = '\0';
                if (!set_key(&t, kv, colon + 2)) {
                    snprintf(why, whylen, "unknown key or value '%.60s: %.60s'", kv, colon + 2);
                    return false;
                }
            }
            if (!accepted_as(&t, wv, wr, wu)) {
                snprintf(why, whylen, "not accepted%s after applying it", wv < CPC_VARIANT__COUNT ? " as named" : "");
                return false;
            }
        }
        alt = next;
    }
    return true;
}

/* A random plan: FLUX-like base with random heads, segments, mask, mode,
 * kv, variant, explicit degrees (also written as 0), diffusers flags and
 * fallback, as users write them (also contradictory ones: stage 1 rejects
 * those with CP105). */
static void random_plan(tplan *t)
{
    static const int heads[] = {1, 2, 3, 4, 7, 8, 12, 24, 28, 30, 38, 40, 48};
    int P = 1 + rand() % 12;
    base(t, P);
    int H = heads[rand() % 13];
    t->p.model.heads = H;
    int g = 1 + rand() % 4;
    t->p.model.kv_heads = (rand() % 3 == 0 && H % g == 0) ? H / g : (rand() % 8 == 0 ? 5 : H);
    int nseg = 1 + rand() % 3;
    int64_t lens[3];
    for (int k = 0; k < 3; k++)
        lens[k] = rand() % 3 == 0 ? 1 + rand() % 20 : 512 * (1 + rand() % 8) + rand() % 3;
    set_segs(t, nseg, lens[0], lens[1], lens[2]);
    t->p.input.mask = rand() % 4 == 0 ? CPC_MASK_CAUSAL : rand() % 6 == 0 ? CPC_MASK_KEY_PADDING : CPC_MASK_NONE;
    t->p.input.mode = rand() % 5 == 0 ? CPC_MODE_TRAINING : CPC_MODE_INFERENCE;
    if (rand() % 6 == 0) {
        t->p.input.has_kv = true;
        t->p.input.kv_tokens = 77;
    }
    if (rand() % 5 == 0) {
        key(t, "cluster.gpus_per_node", 5, 3);
        t->p.cluster.gpus_per_node = 1 + rand() % 8;
    }
    int pick = rand() % 8;
    if (pick < 6)
        variant(t, (cpc_variant)pick); /* five variants and none */
    int dr = rand() % 3, du = rand() % 3; /* 0: omitted, else written */
    if (dr) {
        t->p.parallel.ring_degree = rand() % 4 == 0 ? P : rand() % 5;
        key(t, "parallel.ring_degree", 20, 3);
    }
    if (du) {
        t->p.parallel.ulysses_degree = rand() % 4 == 0 ? P : rand() % 5;
        key(t, "parallel.ulysses_degree", 21, 3);
    }
    int fl = rand() % 6;
    if (fl == 0)
        t->p.parallel.ulysses_anything = true;
    else if (fl == 1)
        t->p.parallel.ring_anything = true;
    if (rand() % 6 == 0)
        t->p.parallel.fallback = CPC_FALLBACK_AUTO;
}

Test(hints, every_hint_runs_the_plan)
{
    srand(20240611);
    int checked = 0, with_hint = 0, explicit_hints = 0;
    for (int it = 0; it < 1500; it++) {
        tplan t;
        random_plan(&t);
        cpc_selection sel;
        cpc_status *st = run(&t, &sel);
        for (const cpc_status *e = st; e; e = e->next) {
            if (e->severity != CPC_SEV_ERROR)
                continue;
            checked++;
            /* a hint is given whenever another candidate runs at this world size */
            bool other_ok = false;
            for (int i = 0; i < sel.n_candidates; i++)
                other_ok = other_ok || sel.candidates[i].ok;
            if (other_ok && e->rule != 105)
                cr_expect_not_null(e->hint, "no hint for CP%03d (%s) though a candidate runs", e->rule, e->message);
            if (!e->hint || e->rule == 105)
                continue;
            with_hint++;
            explicit_hints += t.p.parallel.ring_degree || t.p.parallel.ulysses_degree ||
                              t.p.parallel.ulysses_anything || t.p.parallel.ring_anything;
            char why[256] = "";
            cr_expect(hint_works(&t, e->hint, why, sizeof why),
                      "hint does not work: CP%03d %s; hint: %s (%s; P=%d H=%d Hkv=%d variant %s R=%d U=%d ua=%d "
                      "ra=%d fallback %d)",
                      e->rule, e->message, e->hint, why, t.p.cluster.world_size, t.p.model.heads,
                      t.p.model.kv_heads, t.p.parallel.variant_given ? cpc_variant_name(t.p.parallel.variant) : "-",
                      t.p.parallel.ring_degree, t.p.parallel.ulysses_degree, t.p.parallel.ulysses_anything,
                      t.p.parallel.ring_anything, t.p.parallel.fallback);
        }
        cpc_status_free(st);
        cpc_selection_free(&sel);
    }
    cr_expect_gt(checked, 400, "the random plans must exercise rejections (%d)", checked);
    cr_expect_gt(with_hint, 200, "and hints (%d)", with_hint);
    cr_expect_gt(explicit_hints, 100, "and hints on plans with explicit degrees or flags (%d)", explicit_hints);
}

/* The QA reproducers: hints on plans with explicit degrees and flags name
 * every key to change. */
Test(hints, explicit_degrees_and_flags_are_changed_too)
{
    char why[256] = "";
    /* ulysses, ulysses_degree 6, world 6, 4 heads: ring alone would keep
     * ulysses_degree 6 (CP105), unified alone would be 1x6 (CP013) */
    tplan t;
    base(&t, 6);
    t.p.model.heads = t.p.model.kv_heads = 4;
    set_segs(&t, 1, (int64_t)48);
    variant(&t, CPC_VARIANT_ULYSSES);
    t.p.parallel.ulysses_degree = 6;
    key(&t, "parallel.ulysses_degree", 5, 30);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_assert_not_null(st);
    cr_expect_eq(st->rule, 12);
    cr_assert_not_null(st->hint);
    cr_expect_str_eq(st->hint, "parallel.variant: unified, parallel.ulysses_degree: 2 runs this plan (unified 3x2)");
    cr_expect(hint_works(&t, st->hint, why, sizeof why), "%s", why);
    cpc_status_free(st);
    cpc_selection_free(&sel);

    /* unified, ring_degree 1, world 7 */
    base(&t, 7);
    t.p.model.heads = t.p.model.kv_heads = 4;
    set_segs(&t, 1, (int64_t)64);
    variant(&t, CPC_VARIANT_UNIFIED);
    t.p.parallel.ring_degree = 1;
    key(&t, "parallel.ring_degree", 5, 30);
    st = run(&t, &sel);
    cr_assert_not_null(st);
    cr_expect_eq(st->rule, 13);
    cr_assert_not_null(st->hint);
    cr_expect_str_eq(st->hint,
                     "parallel.variant: ring_anything, parallel.ring_degree: 7 runs this plan (ring_anything 7x1)");
    cr_expect(hint_works(&t, st->hint, why, sizeof why), "%s", why);
    cpc_status_free(st);
    cpc_selection_free(&sel);

    /* ulysses_anything by its flag with ulysses_degree 4, a 2-token segment:
     * a smaller world needs the smaller degree too */
    base(&t, 4);
    t.p.model.heads = t.p.model.kv_heads = 4;
    set_segs(&t, 2, (int64_t)2, (int64_t)64);
    t.p.parallel.ulysses_anything = true;
    t.p.parallel.ulysses_degree = 4;
    key(&t, "parallel.ulysses_degree", 6, 20);
    st = run(&t, &sel);
    cr_assert_not_null(st);
    cr_expect_eq(st->rule, 20);
    cr_assert_not_null(st->hint);
    cr_expect_str_eq(st->hint,
                     "cluster.world_size: 2, parallel.ulysses_degree: 2 runs this plan (ulysses_anything 1x2)");
    cr_expect(hint_works(&t, st->hint, why, sizeof why), "%s", why);
    cpc_status_free(st);
    cpc_selection_free(&sel);

    /* variant ulysses_anything with its flag: another variant clears the flag */
    base(&t, 3);
    t.p.model.heads = 2;
    t.p.model.kv_heads = 1;
    set_segs(&t, 1, (int64_t)17);
    variant(&t, CPC_VARIANT_ULYSSES_ANYTHING);
    t.p.parallel.ulysses_anything = true;
    st = run(&t, &sel);
    cr_assert_not_null(st);
    cr_expect_eq(st->rule, 21);
    cr_assert_not_null(st->hint);
    cr_expect_str_eq(st->hint, "parallel.variant: ring_anything, parallel.ulysses_anything: false runs this plan "
                               "(ring_anything 3x1)");
    cr_expect(hint_works(&t, st->hint, why, sizeof why), "%s", why);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

/* ------------------------------------------------------------------------ */
/* The outer axes: cfg_degree C and tp_degree T (SPEC section 1, "All four  */
/* axes"; rules CP003, CP005, CP006)                                         */
/* ------------------------------------------------------------------------ */

static void axes(tplan *t, int C, int T)
{
    t->p.parallel.cfg_degree = C;
    t->p.parallel.tp_degree = T;
    key(t, "parallel.cfg_degree", 20, 3);
    key(t, "parallel.tp_degree", 21, 3);
}

/* The hint of the first error with `rule`, applied (one "key: N" per
 * alternative: the first), must make the plan validate. */
static void expect_axis_hint_runs(tplan *t, int rule)
{
    cpc_selection sel;
    cpc_status *st = run(t, &sel);
    const cpc_status *e = find_rule(st, rule);
    cr_assert(e, "expected CP%03d", rule);
    cr_assert(e->hint, "CP%03d without a hint: %s", rule, e->message);
    char k[64];
    int v = 0;
    cr_assert_eq(sscanf(e->hint, "%63[^:]: %d", k, &v), 2, "hint '%s'", e->hint);
    tplan u = *t;
    u.p.key_spans = u.keys;
    u.p.input.segments = u.seg;
    if (strcmp(k, "parallel.cfg_degree") == 0)
        u.p.parallel.cfg_degree = v;
    else if (strcmp(k, "parallel.tp_degree") == 0)
        u.p.parallel.tp_degree = v;
    else if (strcmp(k, "cluster.world_size") == 0)
        u.p.cluster.world_size = v;
    else
        cr_assert(false, "unexpected hint key '%s' in '%s'", k, e->hint);
    cpc_selection s2;
    cpc_status *st2 = run(&u, &s2);
    cr_expect(!cpc_status_has_error(st2), "hint '%s' does not run the plan: %s", e->hint,
              st2 ? st2->message : "");
    cr_expect_geq(s2.selected, 0);
    cpc_status_free(st2);
    cpc_selection_free(&s2);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(axes, default_is_one_by_one)
{
    tplan t;
    base(&t, 4);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_assert(!cpc_status_has_error(st));
    for (int i = 0; i < sel.n_candidates; i++) {
        cr_expect_eq(sel.candidates[i].cfg_degree, 1);
        cr_expect_eq(sel.candidates[i].tp_degree, 1);
    }
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(axes, fixed_splits_run_the_sub_plan)
{
    static const int cases[][4] = {{2, 2, 2, 1}, {2, 1, 2, 2}, {1, 2, 1, 4}, {2, 2, 1, 2}};
    for (int k = 0; k < 4; k++) {
        tplan t;
        base(&t, 8);
        t.p.input.batch = 2;
        axes(&t, cases[k][0], cases[k][1]);
        int R = cases[k][2], U = cases[k][3];
        variant(&t, R > 1 && U > 1 ? CPC_VARIANT_UNIFIED : R > 1 ? CPC_VARIANT_RING : CPC_VARIANT_ULYSSES);
        degrees(&t, R, U);
        cpc_selection sel;
        cpc_status *st = run(&t, &sel);
        cr_assert(!cpc_status_has_error(st), "%dx%dx%dx%d: %s", cases[k][0], cases[k][1], R, U,
                  st ? st->message : "");
        const cpc_candidate *c = &sel.candidates[sel.selected];
        cr_expect_eq(c->cfg_degree, cases[k][0]);
        cr_expect_eq(c->tp_degree, cases[k][1]);
        cr_expect_eq(c->ring_degree, R);
        cr_expect_eq(c->ulysses_degree, U);
        for (int i = 0; i < sel.n_candidates; i++)
            cr_expect_eq((int64_t)sel.candidates[i].cfg_degree * sel.candidates[i].tp_degree *
                             sel.candidates[i].ring_degree * sel.candidates[i].ulysses_degree, 8);
        cpc_status_free(st);
        cpc_selection_free(&sel);
    }
}

Test(axes, cp003_generalised)
{
    tplan t;
    base(&t, 8);
    t.p.input.batch = 3;
    axes(&t, 3, 1);
    expect_reject(&t, 3);
    expect_axis_hint_runs(&t, 3);
    /* C*T divides P but R*U does not fill it: CP003 names C*T*R*U */
    base(&t, 8);
    t.p.input.batch = 2;
    axes(&t, 2, 1);
    variant(&t, CPC_VARIANT_RING);
    degrees(&t, 2, 1);
    key(&t, "parallel.ring_degree", 22, 3);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    const cpc_status *e = find_rule(st, 3);
    cr_assert(e);
    cr_expect(strstr(e->message, "C*T*R*U") != NULL, "%s", e->message);
    cr_expect(strstr(e->message, "world_size is 8") != NULL, "%s", e->message);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

Test(axes, cp005_batch)
{
    tplan t;
    base(&t, 8);
    t.p.input.batch = 1;
    axes(&t, 2, 1);
    expect_reject(&t, 5);
    expect_axis_hint_runs(&t, 5);
    base(&t, 8);
    t.p.input.batch = 4;
    axes(&t, 4, 1);
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 2);
}

Test(axes, cp006_heads)
{
    tplan t;
    base(&t, 16);
    axes(&t, 1, 16); /* 24 heads % 16 */
    expect_reject(&t, 6);
    expect_axis_hint_runs(&t, 6);
    /* GQA: Hkv 3 with T 2 is neither; Hkv 2 with T 4 replicates */
    base(&t, 8);
    t.p.model.kv_heads = 3;
    axes(&t, 1, 2);
    expect_reject(&t, 6);
    expect_axis_hint_runs(&t, 6);
    base(&t, 8);
    t.p.model.kv_heads = 2;
    axes(&t, 1, 4);
    expect_accept(&t, CPC_VARIANT_ULYSSES, 1, 2);
    cpc_plan sub;
    cr_assert(cpc_plan_sub(&t.p, 1, 4, &sub));
    cr_expect_eq(sub.model.heads, 6);
    cr_expect_eq(sub.model.kv_heads, 1);
    cr_expect_eq(sub.cluster.world_size, 2);
}

Test(axes, auto_lists_every_split)
{
    tplan t;
    base(&t, 8);
    t.p.input.batch = 2;
    axes(&t, CPC_DEGREE_AUTO, CPC_DEGREE_AUTO);
    cpc_selection sel;
    cpc_status *st = run(&t, &sel);
    cr_assert(!cpc_status_has_error(st), "%s", st ? st->message : "");
    cr_assert_geq(sel.selected, 0);
    bool seen[4] = {false, false, false, false};
    static const int want[][4] = {{2, 2, 2, 1}, {2, 1, 2, 2}, {1, 2, 1, 4}, {2, 2, 1, 2}};
    for (int i = 0; i < sel.n_candidates; i++) {
        const cpc_candidate *c = &sel.candidates[i];
        cr_expect_eq((int64_t)c->cfg_degree * c->tp_degree * c->ring_degree * c->ulysses_degree, 8);
        cr_expect_eq(2 % c->cfg_degree, 0);
        for (int k = 0; k < 4; k++)
            seen[k] = seen[k] || (c->ok && c->cfg_degree == want[k][0] && c->tp_degree == want[k][1] &&
                                  c->ring_degree == want[k][2] && c->ulysses_degree == want[k][3]);
    }
    for (int k = 0; k < 4; k++)
        cr_expect(seen[k], "%dx%dx%dx%d not a valid candidate", want[k][0], want[k][1], want[k][2], want[k][3]);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}
