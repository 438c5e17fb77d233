/*
 * test_replicate.c - replicated segments (`split: replicate`, SPEC section
 * 1; layout.h REPLICATED SEGMENTS): the plan key and its diagnostics, the
 * validation rules it changes (CP010/CP011/CP020 skip replicated segments,
 * CP027), the schedules of every variant proved by the verifier, and
 * planted faults in them: replicated keys met twice, a replicated key set
 * or a ring step of the replicated queries dropped, the replicated rows'
 * output missing; the backward programs (training) of every variant proved,
 * with planted faults (the replicated block's gradient on every ring rank,
 * the replicated queries against every block on every rank or not at all).
 * The numbers themselves (every variant against the float64 reference) are
 * tests/cli/replicate.sh's and tests/cli/replicate_training.sh's.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layout.h"
#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "validate.h"
#include "verify.h"
#include "verify_bwd.h"

static cpc_status *load_st(const char *yaml, cpc_plan **out)
{
    *out = NULL;
    return cpc_plan_load_string(yaml, strlen(yaml), "t.yaml", NULL, 0, out);
}

static cpc_plan *load(const char *yaml)
{
    cpc_plan *plan = NULL;
    cpc_status *st = load_st(yaml, &plan);
    if (st && cpc_status_has_error(st)) {
        char *m = cpc_status_format(st, "t");
        cr_assert_fail("plan load failed: %s", m ? m : "?");
    }
    cpc_status_free(st);
    cr_assert_not_null(plan);
    return plan;
}

/* A plan: text (replicated unless rep is false) then image tokens. */
static char *text_of(int H, int text, int image, bool rep, int P, const char *extra)
{
    char *s = malloc(1024);
    snprintf(s, 1024,
             "version: 1\n"
             "model: {heads: %d, head_dim: 8, dtype: fp32}\n"
             "input:\n  segments:\n"
             "    - {name: text, tokens: %d%s}\n"
             "    - {name: image, tokens: %d}\n%s"
             "cluster: {world_size: %d}\n",
             H, text, rep ? ", split: replicate" : "", image, extra ? extra : "", P);
    return s;
}

static bool has_rule(const cpc_status *st, int rule)
{
    for (const cpc_status *e = st; e; e = e->next)
        if (e->rule == rule && e->severity == CPC_SEV_ERROR)
            return true;
    return false;
}

Test(replicate, plan_key_and_its_diagnostics)
{
    cpc_plan *p = load("version: 1\nmodel: {heads: 4, head_dim: 8}\ninput:\n  segments:\n"
                       "    - {name: text, tokens: 7, split: replicate}\n"
                       "    - {name: image, tokens: 24, split: shard}\n"
                       "cluster: {world_size: 2}\n");
    cr_assert(p->input.segments[0].replicate);
    cr_assert(!p->input.segments[1].replicate);
    cpc_plan_free(p);
    /* a bad value: CP103 at the value, naming the choices */
    cpc_status *st = load_st("version: 1\nmodel: {heads: 4, head_dim: 8}\ninput:\n  segments:\n"
                             "    - {name: text, tokens: 7, split: whole}\n"
                             "    - {name: image, tokens: 24}\n"
                             "cluster: {world_size: 2}\n",
                             &p);
    cr_assert_not_null(st);
    char *m = cpc_status_format(st, "cpc");
    cr_assert(strstr(m, "t.yaml:5:") && strstr(m, "split") && strstr(m, "shard, replicate"), "%s", m);
    free(m);
    cpc_status_free(st);
    cpc_plan_free(p);
    st = load_st("version: 1\nmodel: {heads: 4, head_dim: 8}\ninput:\n  segments:\n"
                 "    - {name: text, tokens: 7, split: true}\n"
                 "    - {name: image, tokens: 24}\n"
                 "cluster: {world_size: 2}\n",
                 &p);
    cr_assert(st && cpc_status_has_error(st));
    cpc_status_free(st);
    cpc_plan_free(p);
}

/* The case: CogVideoX's 226 text tokens on ring 2 x ulysses 3
 * (world 6) were CP010; replicated, they are never divided. */
Test(replicate, cogvideox_text_226_on_world_6)
{
    char *t = text_of(6, 226, 1350, false, 6, NULL);
    cpc_plan *p = load(t);
    cpc_status *st = cpc_check_candidate(p, CPC_VARIANT_UNIFIED, 2, 3);
    cr_assert(has_rule(st, 10), "226 sharded over 6 must be CP010");
    cpc_status_free(st);
    cpc_plan_free(p);
    free(t);
    t = text_of(6, 226, 1350, true, 6, NULL);
    p = load(t);
    st = cpc_check_candidate(p, CPC_VARIANT_UNIFIED, 2, 3);
    cr_assert_null(st, "%s", st ? st->message : "");
    /* ulysses 6 (text not divisible by 6 either), ring 6 */
    cr_assert_null(cpc_check_candidate(p, CPC_VARIANT_ULYSSES, 1, 6));
    cr_assert_null(cpc_check_candidate(p, CPC_VARIANT_RING, 6, 1));
    cpc_plan_free(p);
    free(t);
    /* anything variants: a 2-token replicated segment on 3 ranks is no CP020 */
    t = text_of(6, 2, 25, true, 3, NULL);
    p = load(t);
    cr_assert_null(cpc_check_candidate(p, CPC_VARIANT_RING_ANYTHING, 3, 1));
    cr_assert_null(cpc_check_candidate(p, CPC_VARIANT_ULYSSES_ANYTHING, 1, 3));
    cpc_plan_free(p);
    free(t);
}

Test(replicate, cp027_every_segment_replicated_or_with_cross_attention)
{
    cpc_plan *p = load("version: 1\nmodel: {heads: 4, head_dim: 8}\ninput:\n  segments:\n"
                       "    - {name: text, tokens: 8, split: replicate}\n"
                       "    - {name: image, tokens: 24, split: replicate}\n"
                       "cluster: {world_size: 2}\n");
    cpc_status *st = cpc_check_candidate(p, CPC_VARIANT_RING, 2, 1);
    cr_assert(has_rule(st, 27));
    cr_assert(strstr(st->message, "every segment"), "%s", st->message);
    cr_assert_eq(st->span.line, 5);
    cpc_status_free(st);
    cpc_plan_free(p);
    char *t = text_of(4, 8, 24, true, 2, "  kv: {tokens: 16}\n");
    p = load(t);
    st = cpc_check_candidate(p, CPC_VARIANT_RING, 2, 1);
    cr_assert(has_rule(st, 27));
    cr_assert(strstr(st->message, "input.kv"), "%s", st->message);
    cpc_status_free(st);
    cpc_plan_free(p);
    free(t);
}

Test(replicate, layout_rank_runs)
{
    /* [text 7 rep][image 25 sharded over 3][tail 5 rep] */
    cpc_plan *p = load("version: 1\nmodel: {heads: 4, head_dim: 8}\ninput:\n  segments:\n"
                       "    - {name: text, tokens: 7, split: replicate}\n"
                       "    - {name: image, tokens: 25}\n"
                       "    - {name: tail, tokens: 5, split: replicate}\n"
                       "cluster: {world_size: 3}\n");
    cpc_layout L;
    cr_assert_null(cpc_layout_init(&L, p, CPC_VARIANT_RING_ANYTHING, 3, 1));
    cr_assert(L.rep);
    cr_assert_eq(L.Srep, 12);
    cr_assert_eq(L.S, 37);
    cr_assert_eq(L.n_seg, 1);
    cr_assert_eq(cpc_layout_kv_rows(&L), 12);
    cr_assert_eq(cpc_layout_shard_tokens(&L, 1), 8);
    cpc_run r[8];
    int n = cpc_layout_rank_runs(&L, 1, r, 8);
    /* rank 1: text [0,7), image [7+9, 7+17), tail [32, 37) */
    cr_assert_eq(n, 3);
    cr_assert(r[0].start == 0 && r[0].len == 7);
    cr_assert(r[1].start == 16 && r[1].len == 8);
    cr_assert(r[2].start == 32 && r[2].len == 5);
    cr_assert_eq(cpc_layout_rank_tokens(&L, 1), 20);
    cr_assert_eq(cpc_layout_rank_offset(&L, 1, 33), 16);
    cr_assert_eq(cpc_layout_rank_offset(&L, 1, 8), -1);
    /* rank 0: text and image chunk 0 [7, 16) are adjacent: one run */
    n = cpc_layout_rank_runs(&L, 0, r, 8);
    cr_assert_eq(n, 2);
    cr_assert(r[0].start == 0 && r[0].len == 16);
    cpc_plan_free(p);
}

/* ---- schedules proved; planted faults refused -------------------------------- */

static cpc_program *build(int text, int image, cpc_variant v, int R, int U, const char *rotate, bool overlap)
{
    char extra[128];
    snprintf(extra, sizeof extra, "schedule: {rotate: %s, overlap: %s}\n", rotate, overlap ? "true" : "false");
    char *t = text_of(6, text, image, true, R * U, extra);
    cpc_plan *plan = load(t);
    free(t);
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build(plan, v, R, U, &prog);
    cr_assert_null(st, "schedule: %s", st ? st->message : "");
    cpc_plan_free(plan);
    return prog;
}

/* Proved by the default method (the symbolic proof), and by the enumeration
 * of every rank as well. */
static void expect_ok(const cpc_program *prog, const char *what)
{
    cpc_verify_stats stats;
    cpc_status *st = cpc_verify_ex(prog, NULL, &stats);
    cr_assert_null(st, "%s: %s", what, st ? st->message : "");
    cr_assert_eq(stats.mode, CPC_VERIFY_SYMBOLIC, "%s: not proved symbolically", what);
    cr_assert_eq(stats.ranks, prog->layout.P, "%s", what);
    cpc_verify_opts en = {.method = CPC_VERIFY_ENUMERATE};
    st = cpc_verify_ex(prog, &en, &stats);
    cr_assert_null(st, "%s: enumeration: %s", what, st ? st->message : "");
    cr_assert_eq(stats.mode, CPC_VERIFY_FULL, "%s", what);
}

/* CP051 from the default method, and from each method on its own (the
 * symbolic proof may only refuse or say it cannot decide). */
static void expect_fault(cpc_program *prog, const char *a, const char *b)
{
    cpc_verify_opts en = {.method = CPC_VERIFY_ENUMERATE}, sy = {.method = CPC_VERIFY_SYMBOLIC_ONLY};
    cpc_verify_stats stats;
    cpc_status *s2 = cpc_verify_ex(prog, &en, &stats);
    cr_assert_not_null(s2, "the enumeration proved a planted fault");
    cpc_status_free(s2);
    s2 = cpc_verify_ex(prog, &sy, &stats);
    cr_assert_not_null(s2, "the symbolic proof proved a planted fault");
    cpc_status_free(s2);
    cpc_status *st = cpc_verify(prog);
    cr_assert_not_null(st, "expected CP051, the program was proved");
    cr_assert_eq(st->rule, CPC_RULE_VERIFY, "%s", st->message);
    if (a)
        cr_assert(strstr(st->message, a), "missing '%s' in: %s", a, st->message);
    if (b)
        cr_assert(strstr(st->message, b), "missing '%s' in: %s", b, st->message);
    cpc_status_free(st);
}

Test(replicate, every_variant_is_proved)
{
    struct {
        cpc_variant v;
        int R, U, text, image;
    } c[] = {
        {CPC_VARIANT_RING, 2, 1, 8, 24},          {CPC_VARIANT_RING, 3, 1, 7, 24},
        {CPC_VARIANT_RING_ANYTHING, 3, 1, 7, 25}, {CPC_VARIANT_ULYSSES, 1, 2, 7, 24},
        {CPC_VARIANT_ULYSSES, 1, 3, 8, 24},       {CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, 5, 25},
        {CPC_VARIANT_UNIFIED, 2, 3, 226, 24},     {CPC_VARIANT_UNIFIED, 2, 2, 9, 32},
    };
    const char *rot[] = {"p2p", "allgather"};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        for (int r = 0; r < 2; r++)
            for (int ov = 0; ov < 2; ov++) {
                cpc_program *p = build(c[i].text, c[i].image, c[i].v, c[i].R, c[i].U, rot[r], ov);
                char what[128];
                snprintf(what, sizeof what, "%s %dx%d text %d %s overlap=%d", cpc_variant_name(c[i].v), c[i].R,
                         c[i].U, c[i].text, rot[r], ov);
                expect_ok(p, what);
                cpc_program_free(p);
            }
}

/* Index of the n-th top-level op of kind k whose in[0] is buffer `b`. */
static int top_with_in0(const cpc_program *p, cpc_op_kind k, int b, int nth)
{
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == k && p->ops[i].n_in > 0 && p->ops[i].in[0] == b && nth-- == 0)
            return i;
    return -1;
}

static void insert_clone(cpc_op **ops, int *n, int at, const cpc_op *src, int count)
{
    cpc_op *c = NULL;
    int nc = 0;
    cr_assert_null(cpc_ops_clone(src, count, &c, &nc));
    cpc_op *g = realloc(*ops, sizeof(cpc_op) * (size_t)(*n + nc));
    cr_assert_not_null(g);
    memmove(&g[at + nc], &g[at], sizeof(cpc_op) * (size_t)(*n - at));
    memcpy(&g[at], c, sizeof(cpc_op) * (size_t)nc);
    free(c);
    *ops = g;
    *n += nc;
}

static void remove_ops(cpc_op *ops, int *n, int at, int count)
{
    for (int i = at; i < at + count; i++) {
        cpc_op *sub = &ops[i];
        cpc_expr_free(sub->peer);
        cpc_expr_free(sub->block);
        cpc_expr_free(sub->when);
        cpc_expr_free(sub->count);
        cpc_ops_free(sub->body, sub->n_body);
    }
    memmove(&ops[at], &ops[at + count], sizeof(cpc_op) * (size_t)(*n - at - count));
    *n -= count;
}

Test(replicate, replicated_keys_attended_twice_are_refused)
{
    for (int uly = 0; uly < 2; uly++) {
        cpc_program *p = uly ? build(7, 24, CPC_VARIANT_ULYSSES, 1, 2, "p2p", true)
                             : build(7, 24, CPC_VARIANT_RING, 2, 1, "p2p", true);
        int qr = cpc_program_find_buffer(p, uly ? "q_rep_part" : "q_rep");
        cr_assert_geq(qr, 0);
        /* the replicated queries' local block (attn q_rep,k_rep,v_rep;
         * merge) once more, as a ring that also rotated the replicated
         * keys would */
        int a = top_with_in0(p, CPC_OP_ATTN, qr, 0);
        cr_assert_geq(a, 0);
        cr_assert_eq(p->ops[a + 1].kind, CPC_OP_MERGE);
        insert_clone(&p->ops, &p->n_ops, a + 2, &p->ops[a], 2);
        expect_fault(p, "replicated segments' keys/values twice", NULL);
        cpc_program_free(p);
        /* the sharded queries' replicated-key block twice */
        p = uly ? build(7, 24, CPC_VARIANT_ULYSSES, 1, 2, "p2p", true)
                : build(7, 24, CPC_VARIANT_RING, 2, 1, "p2p", true);
        int kr = cpc_program_find_buffer(p, uly ? "k_rep_part" : "k_rep");
        int i = -1;
        for (int j = 0; j < p->n_ops; j++)
            if (p->ops[j].kind == CPC_OP_ATTN && p->ops[j].in[1] == kr && p->ops[j].in[0] != qr) {
                i = j;
                break;
            }
        cr_assert_geq(i, 0);
        insert_clone(&p->ops, &p->n_ops, i + 2, &p->ops[i], 2);
        expect_fault(p, "twice", NULL);
        cpc_program_free(p);
    }
}

Test(replicate, replicated_key_set_or_ring_step_dropped_is_refused)
{
    /* the sharded queries never meet the replicated keys */
    cpc_program *p = build(7, 24, CPC_VARIANT_RING, 2, 1, "p2p", true);
    int qr = cpc_program_find_buffer(p, "q_rep"), kr = cpc_program_find_buffer(p, "k_rep");
    int i = -1;
    for (int j = 0; j < p->n_ops; j++)
        if (p->ops[j].kind == CPC_OP_ATTN && p->ops[j].in[1] == kr && p->ops[j].in[0] != qr)
            i = j;
    cr_assert_geq(i, 0);
    remove_ops(p->ops, &p->n_ops, i, 2);
    expect_fault(p, "never met the keys/values of the replicated segments", NULL);
    cpc_program_free(p);
    /* the replicated queries skip the rotating blocks (their attn + merge
     * in the loop body) */
    p = build(7, 24, CPC_VARIANT_RING, 3, 1, "p2p", true);
    qr = cpc_program_find_buffer(p, "q_rep");
    cpc_op *loop = NULL;
    for (int j = 0; j < p->n_ops; j++)
        if (p->ops[j].kind == CPC_OP_LOOP)
            loop = &p->ops[j];
    cr_assert_not_null(loop);
    i = -1;
    for (int j = 0; j < loop->n_body; j++)
        if (loop->body[j].kind == CPC_OP_ATTN && loop->body[j].in[0] == qr)
            i = j;
    cr_assert_geq(i, 0);
    remove_ops(loop->body, &loop->n_body, i, 2);
    expect_fault(p, "incomplete", "replicated segments");
    cpc_program_free(p);
    /* no output of the replicated rows */
    p = build(7, 24, CPC_VARIANT_RING, 2, 1, "p2p", true);
    int o = cpc_program_find_buffer(p, "out_rep");
    cr_assert_geq(o, 0);
    p->buffers[o].io = CPC_IO_NONE;
    expect_fault(p, "replicated segments' rows", NULL);
    cpc_program_free(p);
}

/* Random plans: 2..4 segments of 1..40 tokens, each replicated or not (at
 * least one sharded), random heads and world; every candidate the rules
 * accept is scheduled and proved by both methods. */
Test(replicate, random_plans_are_proved)
{
    unsigned seed = (unsigned)time(NULL);
    cr_log_info("seed %u", seed);
    srand(seed);
    static const cpc_variant vs[] = {CPC_VARIANT_RING, CPC_VARIANT_ULYSSES, CPC_VARIANT_UNIFIED,
                                     CPC_VARIANT_RING_ANYTHING, CPC_VARIANT_ULYSSES_ANYTHING};
    int proved = 0;
    for (int it = 0; it < 60; it++) {
        int nseg = 2 + rand() % 3, P = 2 + rand() % 5, H = 1 + rand() % 8;
        char segs[512] = "";
        size_t o = 0;
        bool sharded = false;
        for (int i = 0; i < nseg; i++) {
            bool rep = (rand() % 2) && (sharded || i + 1 < nseg);
            sharded |= !rep;
            o += (size_t)snprintf(segs + o, sizeof segs - o, "    - {name: s%d, tokens: %d%s}\n", i,
                                  1 + rand() % 40, rep ? ", split: replicate" : "");
        }
        char yaml[1024];
        snprintf(yaml, sizeof yaml,
                 "version: 1\nmodel: {heads: %d, head_dim: 8, dtype: fp32}\ninput:\n  segments:\n%s"
                 "cluster: {world_size: %d}\n",
                 H, segs, P);
        cpc_plan *p = load(yaml);
        for (size_t k = 0; k < sizeof vs / sizeof *vs; k++) {
            int R = vs[k] == CPC_VARIANT_ULYSSES || vs[k] == CPC_VARIANT_ULYSSES_ANYTHING ? 1 : P;
            int U = P / R;
            if (vs[k] == CPC_VARIANT_UNIFIED) {
                if (P != 4 && P != 6)
                    continue;
                R = 2, U = P / 2;
            }
            cpc_status *st = cpc_check_candidate(p, vs[k], R, U);
            if (st) {
                cpc_status_free(st);
                continue;
            }
            cpc_program *prog = NULL;
            st = cpc_schedule_build(p, vs[k], R, U, &prog);
            cr_assert_null(st, "%s", st ? st->message : "");
            char what[1200];
            snprintf(what, sizeof what, "%s %dx%d:\n%s", cpc_variant_name(vs[k]), R, U, yaml);
            expect_ok(prog, what);
            cpc_program_free(prog);
            proved++;
        }
        cpc_plan_free(p);
    }
    cr_assert_gt(proved, 20, "only %d candidates were valid", proved);
}

/* ---- training (the backward program, SPEC section 10) ------------------------------ */

static cpc_program *build_bwd(int text, int image, cpc_variant v, int R, int U, const char *rotate, bool overlap)
{
    char extra[160];
    snprintf(extra, sizeof extra, "  mode: training\nschedule: {rotate: %s, overlap: %s}\n", rotate,
             overlap ? "true" : "false");
    char *t = text_of(6, text, image, true, R * U, extra);
    cpc_plan *plan = load(t);
    free(t);
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build_backward(plan, v, R, U, &prog);
    cr_assert_null(st, "backward schedule: %s", st ? st->message : "");
    cpc_plan_free(plan);
    return prog;
}

/* The (replicated q, replicated k) attn_bwd: the one guarded `r==0`. */
static cpc_op *rep_rep_op(cpc_program *p)
{
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == CPC_OP_ATTN_BWD && p->ops[i].when)
            return &p->ops[i];
    return NULL;
}

/* The attn_bwd of the replicated queries against the own K/V block (top
 * level or in the ring loop's body). */
static cpc_op *find_rep_own_in(cpc_program *p, cpc_op *ops, int n)
{
    for (int i = 0; i < n; i++) {
        if (ops[i].kind == CPC_OP_LOOP) {
            cpc_op *o = find_rep_own_in(p, ops[i].body, ops[i].n_body);
            if (o)
                return o;
        }
        if (ops[i].kind == CPC_OP_ATTN_BWD && p->buffers[ops[i].in[0]].tokens == CPC_TOK_KV &&
            p->buffers[ops[i].in[1]].tokens != CPC_TOK_KV)
            return &ops[i];
    }
    return NULL;
}

static cpc_op *find_rep_own(cpc_program *p)
{
    return find_rep_own_in(p, p->ops, p->n_ops);
}

/* Proves p with both domains of the backward prover (the symmetric one, by
 * default, and the enumeration of every rank): they must agree.  Returns
 * the symmetric domain's status (NULL: proved; the caller frees it) and its
 * mode. */
static cpc_status *verify_both(const cpc_program *p, size_t row, cpc_verify_mode *mode)
{
    cpc_verify_bwd_stats sa, se;
    cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
    cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
    cpc_status *e = cpc_verify_backward_ex(p, &eo, &se);
    cr_assert_eq(a == NULL, e == NULL, "row %zu: the domains disagree: %s / enumeration: %s", row,
                 a ? a->message : "proved", e ? e->message : "proved");
    if (a && e) {
        cr_assert_eq(a->rule, CPC_RULE_VERIFY, "row %zu: %s", row, a->message);
        cr_assert_eq(e->rule, CPC_RULE_VERIFY, "row %zu: %s", row, e->message);
    }
    cpc_status_free(e);
    *mode = sa.mode;
    return a;
}

/* The all_reduce of a replicated gradient (role `role`, KV OUTPUT). */
static cpc_op *rep_all_reduce(cpc_program *p, cpc_buf_role role)
{
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == CPC_OP_ALL_REDUCE && p->buffers[p->ops[i].out[0]].role == role)
            return &p->ops[i];
    return NULL;
}

/* Every variant's backward program with a replicated text is proved by the
 * symmetric domain (any world size: its (replicated q, replicated k) block,
 * guarded `r==0`, by the twin simulation of verify_bwd.h) and by the
 * enumeration of every rank; planted faults are CP051 in both: that
 * block's gradient counted on every rank (its guard dropped), the
 * replicated queries meeting every ring block on every rank (the `s==0`
 * guard dropped), the replicated queries' part of the own block dropped,
 * a replicated gradient's world all_reduce missing (a local copy instead). */
Test(replicate, backward_every_variant_is_proved_and_faults_refused)
{
    struct { cpc_variant v; int R, U, text, image; const char *rotate; bool overlap; } rows[] = {
        {CPC_VARIANT_RING, 2, 1, 8, 24, "p2p", true},           {CPC_VARIANT_RING, 3, 1, 7, 27, "p2p", false},
        {CPC_VARIANT_RING, 3, 1, 7, 27, "allgather", true},     {CPC_VARIANT_RING_ANYTHING, 3, 1, 5, 26, "p2p", true},
        {CPC_VARIANT_ULYSSES, 1, 2, 7, 24, "p2p", true},        {CPC_VARIANT_ULYSSES_ANYTHING, 1, 3, 5, 25, "p2p", true},
        {CPC_VARIANT_UNIFIED, 2, 3, 226, 24, "p2p", true},      {CPC_VARIANT_UNIFIED, 2, 2, 7, 24, "allgather", true},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        cpc_program *p = build_bwd(rows[i].text, rows[i].image, rows[i].v, rows[i].R, rows[i].U, rows[i].rotate,
                                   rows[i].overlap);
        cpc_verify_bwd_stats stats;
        cpc_verify_mode mode;
        cpc_status *st = cpc_verify_backward_ex(p, NULL, &stats);
        cr_assert_null(st, "row %zu: %s", i, st ? st->message : "");
        cr_assert_eq(stats.mode, CPC_VERIFY_SYMBOLIC, "row %zu", i);
        cr_assert_eq(stats.ranks, p->layout.P, "row %zu", i);
        cr_assert_null(st = verify_both(p, i, &mode), "row %zu: %s", i, st ? st->message : "");
        /* the replicated block's gradients on every rank */
        cpc_op *rr = rep_rep_op(p);
        cr_assert_not_null(rr);
        cpc_expr *w = rr->when;
        rr->when = NULL;
        st = verify_both(p, i, &mode);
        if (rows[i].R > 1) { /* with R == 1 every rank is ring rank 0: each member's heads once */
            cr_assert_not_null(st, "row %zu: the replicated block counted on every rank was proved", i);
            cr_assert_eq(st->rule, CPC_RULE_VERIFY);
            cr_assert(strstr(st->message, "2 times or more"), "row %zu: %s", i, st->message);
        } else {
            cr_assert_null(st, "row %zu: %s", i, st ? st->message : "");
        }
        cpc_status_free(st);
        rr->when = w;
        /* the replicated queries against the own block: their attn_bwd (q_rep or
         * its head part, K/V not the replicated keys), at the ring's first step */
        cpc_op *own = find_rep_own(p);
        cr_assert_not_null(own, "row %zu", i);
        if (own->when) {
            /* every step: every block's gradient from the replicated queries on every ring rank */
            cpc_expr *w2 = own->when;
            own->when = NULL;
            st = verify_both(p, i, &mode);
            cr_assert_not_null(st, "row %zu: the replicated queries met every block on every rank", i);
            cr_assert(strstr(st->message, "2 times or more"), "row %zu: %s", i, st->message);
            cpc_status_free(st);
            own->when = w2;
        }
        /* dropped: the own block never meets the replicated queries */
        cpc_op keep = *own;
        own->kind = CPC_OP_BARRIER;
        own->n_in = own->n_out = 0;
        own->group = CPC_GROUP_WORLD;
        own->when = NULL;
        st = verify_both(p, i, &mode);
        cr_assert_not_null(st, "row %zu: the replicated queries' part of the own block dropped was proved", i);
        cr_assert(strstr(st->message, "0 times"), "row %zu: %s", i, st->message);
        cpc_status_free(st);
        *own = keep;
        /* a replicated gradient not summed over the world: each rank keeps its own part */
        for (int role = CPC_ROLE_DQ; role <= CPC_ROLE_DV; role++) {
            cpc_op *ar = rep_all_reduce(p, (cpc_buf_role)role);
            cr_assert_not_null(ar, "row %zu", i);
            ar->kind = CPC_OP_COPY;
            ar->group = CPC_GROUP_NONE;
            st = verify_both(p, i, &mode);
            cr_assert_not_null(st, "row %zu: %s's all_reduce missing was proved", i,
                               cpc_buf_role_name((cpc_buf_role)role));
            cr_assert(strstr(st->message, "0 times"), "row %zu: %s", i, st->message);
            cr_assert_eq(mode, CPC_VERIFY_REFUSED, "row %zu", i);
            cpc_status_free(st);
            ar->kind = CPC_OP_ALL_REDUCE;
            ar->group = CPC_GROUP_WORLD;
        }
        cpc_program_free(p);
    }
}
