/*
 * test_verify_sym.c - the symbolic proof of the verifier (compiler/verify.h
 * "SYMBOLIC PROOF", compiler/verify_sym.c) and the rule that nothing reaches
 * an artifact unproven (SPEC section 4):
 *   - every variant the compiler emits is proved symbolically at 4, 1024,
 *     16384 and 65536 ranks, in well under 100 ms;
 *   - the bypass family of issue 13 (dead loops, huge counts behind false
 *     guards, nested loops, ops guarded off on one rank, duplicated ops
 *     behind complementary guards) is proved, or refused with CP051 naming
 *     the op, never accepted unproven, whatever the world size;
 *   - soundness against the enumeration: random mutations of small programs
 *     are never accepted symbolically when enumerating every rank finds a
 *     fault, and a fault the symbolic proof reports is one the enumeration
 *     finds too; mutations of 16384-rank programs are proved or refused, and
 *     a proved one is correct when the same edit is enumerated at small P.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "verify.h"

/* ---- helpers -------------------------------------------------------------------- */

static cpc_program *build_plan(int H, int Hkv, long long S, const char *mask, int kv, cpc_variant v, int R, int U,
                               const char *rotate, bool overlap)
{
    char kvs[64] = "";
    if (kv > 0)
        snprintf(kvs, sizeof kvs, ", kv: {tokens: %d}", kv);
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "version: 1\nmodel: {heads: %d, kv_heads: %d, head_dim: 8, dtype: fp32}\n"
             "input: {tokens: %lld, mask: %s%s}\ncluster: {world_size: %d}\n"
             "schedule: {rotate: %s, overlap: %s}\n",
             H, Hkv, S, mask, kvs, R * U, rotate, overlap ? "true" : "false");
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_string(yaml, strlen(yaml), "t.yaml", NULL, 0, &plan);
    cr_assert(!cpc_status_has_error(st) && plan, "plan: %s", st ? st->message : "?");
    cpc_status_free(st);
    cpc_program *prog = NULL;
    st = cpc_schedule_build(plan, v, R, U, &prog);
    cr_assert_null(st, "schedule: %s", st ? st->message : "");
    cpc_plan_free(plan);
    return prog;
}

static cpc_program *ring_prog(int R, const char *rotate, bool overlap)
{
    return build_plan(4, 4, 2LL * R, "none", 0, CPC_VARIANT_RING, R, 1, rotate, overlap);
}

static void set_expr(cpc_expr **slot, const char *text)
{
    cpc_expr_free(*slot);
    *slot = NULL;
    if (!text)
        return;
    cpc_status *st = cpc_expr_parse(text, CPC_NO_SPAN, slot);
    cr_assert_null(st, "bad expression %s", text);
}

static cpc_op *top_op(cpc_program *p, cpc_op_kind k, int nth)
{
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == k && nth-- == 0)
            return &p->ops[i];
    return NULL;
}

static cpc_op *body_op(cpc_op *loop, cpc_op_kind k, int nth)
{
    for (int i = 0; i < loop->n_body; i++)
        if (loop->body[i].kind == k && nth-- == 0)
            return &loop->body[i];
    return NULL;
}

static void release_op(cpc_op *op)
{
    cpc_expr_free(op->peer);
    cpc_expr_free(op->block);
    cpc_expr_free(op->when);
    cpc_expr_free(op->count);
    cpc_ops_free(op->body, op->n_body);
}

static void remove_at(cpc_op *ops, int *n, int i)
{
    release_op(&ops[i]);
    memmove(&ops[i], &ops[i + 1], sizeof(cpc_op) * (size_t)(*n - i - 1));
    (*n)--;
}

static void insert_copy(cpc_op **ops, int *n, int i, const cpc_op *src)
{
    cpc_op *c = NULL;
    int nc = 0;
    cr_assert_null(cpc_ops_clone(src, 1, &c, &nc));
    cpc_op *grown = realloc(*ops, sizeof(cpc_op) * (size_t)(*n + 1));
    cr_assert_not_null(grown);
    memmove(&grown[i + 1], &grown[i], sizeof(cpc_op) * (size_t)(*n - i));
    grown[i] = c[0];
    free(c);
    *ops = grown;
    (*n)++;
}

/* Appends `loop count=COUNT when=WHEN { copy of body_src }` at position i. */
static void insert_loop(cpc_op **ops, int *n, int i, const char *count, const char *when, const cpc_op *body_src)
{
    cpc_op l;
    memset(&l, 0, sizeof l);
    l.kind = CPC_OP_LOOP;
    set_expr(&l.count, count);
    set_expr(&l.when, when);
    if (body_src) {
        cr_assert_null(cpc_ops_clone(body_src, 1, &l.body, &l.n_body));
    }
    insert_copy(ops, n, i, &l);
    release_op(&l);
}

static cpc_status *verify_with(const cpc_program *p, cpc_verify_method m, cpc_verify_stats *s)
{
    cpc_verify_opts o = {.method = m};
    return cpc_verify_ex(p, &o, s);
}

static void expect_proved_symbolically(const cpc_program *p, const char *what)
{
    cpc_verify_stats s;
    cpc_status *st = cpc_verify_ex(p, NULL, &s);
    cr_assert_null(st, "%s: %s", what, st ? st->message : "");
    cr_assert_eq(s.mode, CPC_VERIFY_SYMBOLIC, "%s: proved by enumeration, not symbolically", what);
    cr_assert_eq(s.ranks, p->layout.P, "%s", what);
}

/* A CP051 ERROR holding every non-NULL substring. */
static void expect_cp051(cpc_status *st, const char *a, const char *b, const char *c)
{
    cr_assert_not_null(st, "expected CP051, the program was accepted");
    cr_assert_eq(st->rule, CPC_RULE_VERIFY, "%s", st->message);
    cr_assert_eq(st->severity, CPC_SEV_ERROR, "%s", st->message);
    cr_assert(cpc_status_has_error(st));
    const char *want[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (want[i])
            cr_assert(strstr(st->message, want[i]), "missing '%s' in: %s", want[i], st->message);
    cpc_status_free(st);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- the compiler's programs, at every size ------------------------------------------------ */

Test(verify_sym, every_variant_at_every_world_size)
{
    static const int sizes[] = {4, 1024, 16384, 65536};
    for (int i = 0; i < 4; i++) {
        int P = sizes[i], U = 2;
        while ((long long)U * U < P)
            U *= 2;
        if ((long long)U * U > P)
            U /= 2;
        int R = P / U;
        const char *rot[] = {"p2p", "allgather"};
        for (int r = 0; r < 2; r++)
            for (int ov = 0; ov < 2; ov++) {
                char what[128];
                struct {
                    cpc_variant v;
                    int R, U, H;
                    long long S;
                } c[] = {
                    {CPC_VARIANT_RING, P, 1, 4, 2LL * P},
                    {CPC_VARIANT_RING_ANYTHING, P, 1, 4, 3LL * P + 7},
                    {CPC_VARIANT_UNIFIED, R, U, U, 2LL * P},
                    {CPC_VARIANT_ULYSSES_ANYTHING, 1, P, P + 3 > 65536 ? 65536 : P + 3, 3LL * P + 7},
                    {CPC_VARIANT_ULYSSES, 1, P, P, 2LL * P},
                };
                for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
                    if (r == 1 && c[k].U == P)
                        continue; /* no ring: rotate does not apply */
                    cpc_program *p = build_plan(c[k].H, c[k].H, c[k].S, "none", 0, c[k].v, c[k].R, c[k].U, rot[r],
                                                ov);
                    snprintf(what, sizeof what, "%s %dx%d %s overlap=%d", cpc_variant_name(c[k].v), c[k].R, c[k].U,
                             rot[r], ov);
                    double t0 = now();
                    expect_proved_symbolically(p, what);
                    double dt = now() - t0;
                    cr_assert_lt(dt, 0.1, "%s: %.3f s", what, dt);
                    cpc_program_free(p);
                }
            }
    }
}

Test(verify_sym, masks_gqa_and_cross_attention_at_large_p)
{
    /* causal zigzag ring and unified */
    cpc_program *p = build_plan(4, 4, 2LL * 2 * 16384, "causal", 0, CPC_VARIANT_RING, 16384, 1, "p2p", true);
    cr_assert(p->layout.zigzag);
    expect_proved_symbolically(p, "causal ring 16384");
    cpc_program_free(p);
    p = build_plan(8, 8, 2LL * 2 * 4096, "causal", 0, CPC_VARIANT_UNIFIED, 512, 8, "allgather", false);
    expect_proved_symbolically(p, "causal unified 512x8");
    cpc_program_free(p);
    /* GQA: K/V heads replicated (U > Hkv) and uneven (28:7 over 16) */
    p = build_plan(16, 2, 2LL * 16384, "none", 0, CPC_VARIANT_UNIFIED, 1024, 16, "p2p", true);
    expect_proved_symbolically(p, "gqa 16:2 unified 1024x16");
    cpc_program_free(p);
    p = build_plan(28, 7, 3LL * 16 + 5, "none", 0, CPC_VARIANT_ULYSSES_ANYTHING, 1, 16, "p2p", true);
    expect_proved_symbolically(p, "gqa 28:7 ulysses_anything 16");
    cpc_program_free(p);
    /* key padding; cross-attention on every variant shape */
    p = build_plan(4, 4, 2LL * 16384, "key_padding", 0, CPC_VARIANT_UNIFIED, 4096, 4, "p2p", false);
    expect_proved_symbolically(p, "key padding unified");
    cpc_program_free(p);
    p = build_plan(4, 4, 2LL * 16384, "none", 77, CPC_VARIANT_RING, 16384, 1, "p2p", true);
    expect_proved_symbolically(p, "cross ring 16384");
    cpc_program_free(p);
    p = build_plan(4, 4, 2LL * 16384, "none", 77, CPC_VARIANT_UNIFIED, 4096, 4, "p2p", true);
    expect_proved_symbolically(p, "cross unified 4096x4");
    cpc_program_free(p);
}

/* ---- planted faults at large P: found symbolically -------------------------------------- */

Test(verify_sym, planted_faults_at_65536)
{
    /* a ring step dropped */
    cpc_program *p = ring_prog(65536, "p2p", true);
    set_expr(&top_op(p, CPC_OP_LOOP, 0)->count, "R-1");
    expect_cp051(cpc_verify(p), "incomplete", "never met the keys/values", "ops[3] copy");
    cpc_program_free(p);
    /* init_acc dropped */
    p = ring_prog(65536, "p2p", true);
    remove_at(p->ops, &p->n_ops, (int)(top_op(p, CPC_OP_INIT_ACC, 0) - p->ops));
    expect_cp051(cpc_verify(p), "not initialised", "merge (step 0)", NULL);
    cpc_program_free(p);
    /* k used as v */
    p = ring_prog(65536, "p2p", true);
    cpc_op *a = body_op(top_op(p, CPC_OP_LOOP, 0), CPC_OP_ATTN, 0);
    a->in[2] = a->in[1];
    expect_cp051(cpc_verify(p), "holds k data, not v", "attn", NULL);
    cpc_program_free(p);
    /* the send removed: every rank blocks at the wait */
    p = ring_prog(65536, "p2p", false);
    cpc_op *loop = top_op(p, CPC_OP_LOOP, 0);
    remove_at(loop->body, &loop->n_body, (int)(body_op(loop, CPC_OP_SEND, 0) - loop->body));
    expect_cp051(cpc_verify(p), "deadlock", "wait (step 0)", NULL);
    cpc_program_free(p);
    /* the wrong peer: the block that arrives is not the one declared */
    p = ring_prog(65536, "p2p", true);
    set_expr(&body_op(top_op(p, CPC_OP_LOOP, 0), CPC_OP_SEND, 0)->peer, "(r+2)%R");
    expect_cp051(cpc_verify(p), "deadlock", NULL, NULL);
    cpc_program_free(p);
    p = ring_prog(65536, "p2p", true);
    set_expr(&body_op(top_op(p, CPC_OP_LOOP, 0), CPC_OP_RECV, 0)->block, "(r-s)%R");
    expect_cp051(cpc_verify(p), "declares that ring block", "recv (step 0)", NULL);
    cpc_program_free(p);
    /* a block attended twice (allgather: block (r+min(s,1))%R is not affine: refused) */
    p = ring_prog(65536, "allgather", true);
    set_expr(&body_op(top_op(p, CPC_OP_LOOP, 0), CPC_OP_ATTN, 0)->block, "(r-2*s)%R");
    expect_cp051(cpc_verify(p), "twice", "merge", NULL);
    cpc_program_free(p);
    p = ring_prog(65536, "allgather", true);
    set_expr(&body_op(top_op(p, CPC_OP_LOOP, 0), CPC_OP_ATTN, 0)->block, "(r+min(s,1))%R");
    expect_cp051(cpc_verify(p), "cannot be proven", "not an affine form", NULL);
    cpc_program_free(p);
    /* the wait removed */
    p = ring_prog(65536, "p2p", true);
    loop = top_op(p, CPC_OP_LOOP, 0);
    remove_at(loop->body, &loop->n_body, (int)(body_op(loop, CPC_OP_WAIT, 0) - loop->body));
    expect_cp051(cpc_verify(p), "swap (step 0)", "while a send from it is in flight", NULL);
    cpc_program_free(p);
    /* unified: an all_to_all skipped everywhere, a peer outside the group */
    p = build_plan(256, 256, 2LL * 65536, "none", 0, CPC_VARIANT_UNIFIED, 256, 256, "p2p", true);
    remove_at(p->ops, &p->n_ops, (int)(top_op(p, CPC_OP_ALL_TO_ALL, 2) - p->ops));
    expect_cp051(cpc_verify(p), "reads v_cur before it is written", NULL, NULL);
    cpc_program_free(p);
    p = build_plan(256, 256, 2LL * 65536, "none", 0, CPC_VARIANT_UNIFIED, 256, 256, "p2p", true);
    set_expr(&body_op(top_op(p, CPC_OP_LOOP, 0), CPC_OP_SEND, 0)->peer, "r+1");
    expect_cp051(cpc_verify(p), "rank 65280 (r 255, u 0)", "outside the ring group", NULL);
    cpc_program_free(p);
}

/* ---- one step, two domains: one message per fault ---------------------------------------- */

/* The fault's own words: what follows the op ("..., ops[2].body[4] merge (step 0): ") */
static const char *fault_words(const char *m)
{
    const char *at = strstr(m, "ops[");
    at = at ? strstr(at, ": ") : NULL;
    return at ? at + 2 : m;
}

/* The ops' semantics are written once (verify_common.c, vc_step) over the
 * enumeration's concrete rank and the symbolic rank: a fault both find is
 * worded the same by both. */
Test(verify_sym, one_step_gives_one_message)
{
    for (int k = 0; k < 6; k++) {
        cpc_program *p = ring_prog(4, "p2p", true);
        cpc_op *loop = top_op(p, CPC_OP_LOOP, 0);
        switch (k) {
        case 0: /* init_acc dropped */
            remove_at(p->ops, &p->n_ops, (int)(top_op(p, CPC_OP_INIT_ACC, 0) - p->ops));
            break;
        case 1: { /* k used as v */
            cpc_op *a = body_op(loop, CPC_OP_ATTN, 0);
            a->in[2] = a->in[1];
            break;
        }
        case 2: { /* a send naming one buffer twice */
            cpc_op *sd = body_op(loop, CPC_OP_SEND, 0);
            sd->in[1] = sd->in[0];
            break;
        }
        case 3: { /* the merge's output and LSE swapped */
            cpc_op *m = body_op(loop, CPC_OP_MERGE, 0);
            int t = m->in[0];
            m->in[0] = m->in[1];
            m->in[1] = t;
            break;
        }
        case 4: { /* merged into itself */
            cpc_op *m = body_op(loop, CPC_OP_MERGE, 0);
            m->out[0] = m->in[0];
            m->out[1] = m->in[1];
            break;
        }
        default: /* the last step's send and recv run, but no wait completes them */
            set_expr(&body_op(loop, CPC_OP_SEND, 0)->when, NULL);
            set_expr(&body_op(loop, CPC_OP_RECV, 0)->when, NULL);
            break;
        }
        cpc_status *sy = verify_with(p, CPC_VERIFY_SYMBOLIC_ONLY, NULL), *en = verify_with(p, CPC_VERIFY_ENUMERATE, NULL);
        cr_assert(sy && en, "fault %d: symbolic %s, enumeration %s", k, sy ? "refuses" : "proves",
                  en ? "refuses" : "proves");
        cr_assert_str_eq(k == 5 ? strstr(sy->message, "ops[") : fault_words(sy->message),
                         k == 5 ? strstr(en->message, "ops[") : fault_words(en->message), "fault %d:\n%s\n%s", k,
                         sy->message, en->message); /* (5: the same request named, the step it was posted in) */
        cpc_status_free(sy);
        cpc_status_free(en);
        cpc_program_free(p);
    }
}

/* ---- the bypass family (issue 13) ------------------------------------------------------------- */

/* A correct ring program with a dead loop of 2^20 steps in front: proved,
 * and with each planted fault: refused, at 16384 ranks (and the estimate of
 * an enumeration counts what executes: the dead loop costs one visit). */
Test(verify_sym, dead_loops_do_not_hide_faults)
{
    for (int fault = 0; fault <= 4; fault++) {
        cpc_program *p = ring_prog(16384, "p2p", fault == 4);
        cpc_op *loop = top_op(p, CPC_OP_LOOP, 0);
        cpc_op body_copy = loop->body[0];
        (void)body_copy;
        /* outer dead loop with a nested live-looking loop inside */
        cpc_op inner;
        memset(&inner, 0, sizeof inner);
        inner.kind = CPC_OP_LOOP;
        set_expr(&inner.count, "1048576");
        cr_assert_null(cpc_ops_clone(&loop->body[0], 1, &inner.body, &inner.n_body));
        insert_loop(&p->ops, &p->n_ops, 0, "1048576", "0", &inner);
        release_op(&inner);
        /* huge count behind a false guard inside the live ring loop */
        loop = top_op(p, CPC_OP_LOOP, 1);
        insert_loop(&loop->body, &loop->n_body, 0, "1048576", "s>R", &loop->body[0]);
        loop = top_op(p, CPC_OP_LOOP, 1);
        switch (fault) {
        case 0: break;
        case 1: set_expr(&loop->count, "R-1"); break;
        case 2: remove_at(p->ops, &p->n_ops, (int)(top_op(p, CPC_OP_INIT_ACC, 0) - p->ops)); break;
        case 3: {
            cpc_op *a = body_op(loop, CPC_OP_ATTN, 0);
            a->in[2] = a->in[1];
            break;
        }
        case 4: remove_at(loop->body, &loop->n_body, (int)(body_op(loop, CPC_OP_SEND, 0) - loop->body)); break;
        }
        cpc_verify_stats s;
        cpc_status *st = cpc_verify_ex(p, NULL, &s);
        if (fault == 0) {
            cr_assert_null(st, "%s", st ? st->message : "");
            cr_assert_eq(s.mode, CPC_VERIFY_SYMBOLIC);
        } else {
            cr_assert_not_null(st, "fault %d accepted", fault);
            cr_assert(cpc_status_has_error(st), "fault %d: only %s", fault, st->message);
            cr_assert_eq(st->rule, CPC_RULE_VERIFY);
            cpc_status_free(st);
        }
        cpc_program_free(p);
    }
    /* what executes, not what is written: 8 ranks, a dead loop of 2^20 steps */
    cpc_program *p = ring_prog(8, "p2p", true);
    cpc_verify_stats s0, s1;
    cpc_verify_opts en = {.method = CPC_VERIFY_ENUMERATE};
    cr_assert_null(cpc_verify_ex(p, &en, &s0));
    insert_loop(&p->ops, &p->n_ops, 0, "1048576", "R>P", &p->ops[0]);
    cr_assert_null(cpc_verify_ex(p, &en, &s1));
    cr_assert_eq(s1.mode, CPC_VERIFY_FULL);
    cr_assert_eq(s1.estimate, s0.estimate + 8, "dead loop counted: %lld vs %lld", (long long)s1.estimate,
                 (long long)s0.estimate);
    cpc_program_free(p);
}

Test(verify_sym, ops_guarded_off_on_one_rank)
{
    /* the send guarded off on rank 7: at 8 ranks the enumeration finds the
     * hang; at 16384 ranks the program is refused, naming the op */
    for (int big = 0; big < 2; big++) {
        cpc_program *p = ring_prog(big ? 16384 : 8, "p2p", true);
        cpc_op *loop = top_op(p, CPC_OP_LOOP, 0);
        set_expr(&body_op(loop, CPC_OP_SEND, 0)->when, "s<R-1&&p!=7");
        cpc_verify_stats s;
        cpc_status *st = cpc_verify_ex(p, NULL, &s);
        if (big) {
            cr_assert_eq(s.mode, CPC_VERIFY_REFUSED);
            expect_cp051(st, "cannot be proven", "ops[2].body[1] send", "depends on the rank");
        } else {
            cr_assert_eq(s.mode, CPC_VERIFY_FULL);
            expect_cp051(st, "rank ", NULL, NULL);
        }
        cpc_program_free(p);
    }
    /* a loop that runs on one rank only (count 2^20): refused at 16384 */
    cpc_program *p = ring_prog(16384, "p2p", true);
    insert_loop(&p->ops, &p->n_ops, 0, "1048576", "p==3", &top_op(p, CPC_OP_LOOP, 0)->body[2]);
    expect_cp051(cpc_verify(p), "cannot be proven", "ops[1] loop", "p==3");
    cpc_program_free(p);
}

Test(verify_sym, duplicated_ops_behind_complementary_guards)
{
    /* attn+merge split into two copies over complementary step ranges: the
     * same program, proved symbolically */
    cpc_program *p = ring_prog(16384, "p2p", true);
    cpc_op *loop = top_op(p, CPC_OP_LOOP, 0);
    int a = (int)(body_op(loop, CPC_OP_ATTN, 0) - loop->body);
    set_expr(&loop->body[a].when, "s<R/2");
    set_expr(&loop->body[a + 1].when, "s<R/2");
    insert_copy(&loop->body, &loop->n_body, a + 2, &loop->body[a]);
    insert_copy(&loop->body, &loop->n_body, a + 3, &loop->body[a + 1]);
    set_expr(&loop->body[a + 2].when, "s>=R/2");
    set_expr(&loop->body[a + 3].when, "s>=R/2");
    expect_proved_symbolically(p, "complementary step guards");
    /* overlapping guards: block R/2 attended twice */
    set_expr(&loop->body[a + 2].when, "s>=R/2-1");
    set_expr(&loop->body[a + 3].when, "s>=R/2-1");
    expect_cp051(cpc_verify(p), "twice", "merge (step 8191)", NULL);
    cpc_program_free(p);

    /* the send split by rank parity: correct, proved by enumeration at 8
     * ranks, refused (naming the op) at 16384 */
    for (int big = 0; big < 2; big++) {
        p = ring_prog(big ? 16384 : 8, "p2p", true);
        loop = top_op(p, CPC_OP_LOOP, 0);
        int sd = (int)(body_op(loop, CPC_OP_SEND, 0) - loop->body);
        set_expr(&loop->body[sd].when, "s<R-1&&r%2==0");
        insert_copy(&loop->body, &loop->n_body, sd + 1, &loop->body[sd]);
        set_expr(&loop->body[sd + 1].when, "s<R-1&&r%2==1");
        cpc_verify_stats s;
        cpc_status *st = cpc_verify_ex(p, NULL, &s);
        if (big) {
            expect_cp051(st, "cannot be proven", "ops[2].body[1] send", NULL);
        } else {
            cr_assert_null(st, "%s", st ? st->message : "");
            cr_assert_eq(s.mode, CPC_VERIFY_FULL);
        }
        cpc_program_free(p);
    }
}

/* ---- soundness against the enumeration ----------------------------------------------------- */

static unsigned lcg(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

static const char *const whens[] = {"s<R-1", "s<R", "s==0", "s>0", "s<R-2", "s>=1&&s<R-1", "s!=1", "R>1", "0",
                                    "1", "s<=R/2", "s>R/2", "!(s<R-1)", "s+1<R", "2*s<R", "(s+1)%2==0", "r!=1",
                                    "u==0", "R-1-s>0"};
static const char *const peers[] = {"(r+1)%R", "(r-1)%R", "(r+2)%R", "(r+R-1)%R", "r", "(r+1)%R", "(r-1+R)%R",
                                    "(r+s)%R"};
static const char *const blocks[] = {"(r-s-1)%R", "(r-s)%R", "(r+s)%R", "(r-s+1)%R", "s", "(s+1)%R", "r",
                                     "0", "(2*r-s)%R", "(r-2*s)%R", "(r+R-s-1)%R", "(R-1-s+r)%R"};
static const char *const counts[] = {"R", "R-1", "R+1", "1", "0", "2*R", "R"};

typedef struct shape {
    cpc_variant v;
    int R, U, H, Hkv;
    long long S;
    const char *mask;
    int kv;
} shape;

/* Applies `n` random edits (from `seed`) to p; the choices depend on the
 * program's structure only, so the same seed edits the same ops of the
 * same variant at any world size. */
static void mutate(cpc_program *p, unsigned seed, int n)
{
    for (int m = 0; m < n; m++) {
        cpc_op *loop = top_op(p, CPC_OP_LOOP, 0);
        cpc_op *arr = p->ops;
        int *cnt = &p->n_ops;
        if (loop && loop->n_body > 0 && lcg(&seed) % 2) {
            arr = loop->body;
            cnt = &loop->n_body;
        }
        if (*cnt == 0)
            return;
        int i = (int)(lcg(&seed) % (unsigned)*cnt);
        cpc_op *op = &arr[i];
        switch (lcg(&seed) % 10) {
        case 0:
            if (op->n_in > 0)
                op->in[lcg(&seed) % (unsigned)op->n_in] = (int)(lcg(&seed) % (unsigned)p->n_buffers);
            else if (op->n_out > 0)
                op->out[lcg(&seed) % (unsigned)op->n_out] = (int)(lcg(&seed) % (unsigned)p->n_buffers);
            break;
        case 1: set_expr(&op->when, whens[lcg(&seed) % (sizeof whens / sizeof whens[0])]); break;
        case 2:
            if (op->kind == CPC_OP_LOOP)
                set_expr(&op->count, counts[lcg(&seed) % (sizeof counts / sizeof counts[0])]);
            else if (op->peer)
                set_expr(&op->peer, peers[lcg(&seed) % (sizeof peers / sizeof peers[0])]);
            else if (op->kind == CPC_OP_RECV || op->kind == CPC_OP_ATTN)
                set_expr(&op->block, blocks[lcg(&seed) % (sizeof blocks / sizeof blocks[0])]);
            break;
        case 3:
            if (*cnt > 1 && op->kind != CPC_OP_LOOP)
                remove_at(arr, cnt, i);
            break;
        case 4:
            if (i + 1 < *cnt) {
                cpc_op t = arr[i];
                arr[i] = arr[i + 1];
                arr[i + 1] = t;
            }
            break;
        case 5:
            if (op->kind != CPC_OP_LOOP) {
                if (arr == p->ops)
                    insert_copy(&p->ops, &p->n_ops, i, op);
                else
                    insert_copy(&loop->body, &loop->n_body, i, op);
            }
            break;
        case 6:
            op->tag = (int)(lcg(&seed) % 2);
            if (op->kind == CPC_OP_ALL_TO_ALL)
                op->dir = (cpc_a2a_dir)(lcg(&seed) % 2);
            break;
        case 7:
            if (op->kind == CPC_OP_RECV || op->kind == CPC_OP_ATTN)
                set_expr(&op->block, blocks[lcg(&seed) % (sizeof blocks / sizeof blocks[0])]);
            else
                set_expr(&op->when, whens[lcg(&seed) % 8]);
            break;
        case 8: /* a dead loop with a copy of the op */
            if (op->kind != CPC_OP_LOOP && arr == p->ops)
                insert_loop(&p->ops, &p->n_ops, i, "1048576", lcg(&seed) % 2 ? "0" : "R>P", op);
            break;
        default:
            if (op->group == CPC_GROUP_RING && (op->kind == CPC_OP_SEND || op->kind == CPC_OP_RECV))
                op->group = CPC_GROUP_ULYSSES;
            break;
        }
    }
}

Test(verify_sym, never_accepts_what_the_enumeration_rejects)
{
    shape shapes[] = {
        {CPC_VARIANT_RING, 4, 1, 4, 4, 64, "none", 0},
        {CPC_VARIANT_RING, 5, 1, 4, 4, 60, "none", 0},
        {CPC_VARIANT_RING, 3, 1, 4, 4, 60, "causal", 0},
        {CPC_VARIANT_RING, 4, 1, 4, 4, 64, "causal", 0},
        {CPC_VARIANT_UNIFIED, 2, 2, 4, 4, 64, "none", 0},
        {CPC_VARIANT_UNIFIED, 3, 2, 4, 2, 60, "none", 0},
        {CPC_VARIANT_UNIFIED, 2, 3, 6, 6, 60, "key_padding", 0},
        {CPC_VARIANT_RING_ANYTHING, 3, 1, 4, 4, 31, "none", 0},
        {CPC_VARIANT_RING_ANYTHING, 6, 1, 4, 4, 47, "none", 0},
        {CPC_VARIANT_ULYSSES, 1, 4, 8, 2, 64, "none", 0},
        {CPC_VARIANT_ULYSSES_ANYTHING, 1, 3, 7, 7, 29, "none", 0},
        {CPC_VARIANT_UNIFIED, 2, 2, 4, 4, 64, "none", 24},
    };
    int nshape = sizeof shapes / sizeof shapes[0];
    /* CPC_VERIFY_SYM_ROUNDS / CPC_VERIFY_SYM_SEED: a longer search, by hand */
    int rounds = getenv("CPC_VERIFY_SYM_ROUNDS") ? atoi(getenv("CPC_VERIFY_SYM_ROUNDS")) : 1500;
    unsigned seed = getenv("CPC_VERIFY_SYM_SEED") ? (unsigned)atoi(getenv("CPC_VERIFY_SYM_SEED")) : 13;
    int decided = 0, accepted = 0, total = 0;
    for (int round = 0; round < rounds; round++) {
        shape *sh = &shapes[round % nshape];
        cpc_program *p = build_plan(sh->H, sh->Hkv, sh->S, sh->mask, sh->kv, sh->v, sh->R, sh->U,
                                    round % 4 < 2 ? "p2p" : "allgather", round % 3 != 0);
        mutate(p, lcg(&seed) * 7919u + (unsigned)round, 1 + (int)(lcg(&seed) % 3));
        cpc_verify_stats ss, se;
        cpc_status *sy = verify_with(p, CPC_VERIFY_SYMBOLIC_ONLY, &ss);
        cpc_status *en = verify_with(p, CPC_VERIFY_ENUMERATE, &se);
        total++;
        bool sy_ok = !sy, en_ok = !en;
        bool sy_undecided = sy && strstr(sy->message, "cannot prove the program symbolically");
        if (!sy_ok && !sy_undecided)
            decided++;
        if (sy_ok) {
            decided++;
            accepted++;
        }
        if (sy_ok && !en_ok) {
            fprintf(stderr, "round %d (%s %dx%d): accepted symbolically, the enumeration says: %s\n", round,
                    cpc_variant_name(sh->v), sh->R, sh->U, en->message);
            cpc_status_free(cpc_program_print(stderr, p, -1));
        }
        cr_assert(!(sy_ok && !en_ok), "round %d: unsound: symbolic accepted a program the enumeration rejects",
                  round);
        if (!sy_ok && !sy_undecided && en_ok) {
            fprintf(stderr, "round %d (%s %dx%d): symbolic fault on a correct program: %s\n", round,
                    cpc_variant_name(sh->v), sh->R, sh->U, sy->message);
            cpc_status_free(cpc_program_print(stderr, p, -1));
        }
        cr_assert(!(!sy_ok && !sy_undecided && en_ok), "round %d: the symbolic proof reports a fault that is not one",
                  round);
        cpc_status_free(sy);
        cpc_status_free(en);
        cpc_program_free(p);
    }
    cr_log_info("mutations: %d, decided symbolically %d, accepted %d", total, decided, accepted);
    cr_assert_gt(decided, total / 2, "the symbolic proof decides only %d of %d", decided, total);
    cr_assert_gt(accepted, 10, "only %d mutants accepted: the test would not see unsoundness", accepted);
}

Test(verify_sym, mutations_at_16384_are_proved_or_refused)
{
    /* the same edits at 16384 ranks and at small ones: what is proved at
     * 16384 is correct when enumerated at 5, 6 and 7 ring ranks */
    struct {
        cpc_variant v;
        int big_R, big_U;
        int small_U;
        long long (*S)(int P);
    } cases[] = {
        {CPC_VARIANT_RING, 16384, 1, 1, NULL},
        {CPC_VARIANT_UNIFIED, 128, 128, 2, NULL},
        {CPC_VARIANT_RING_ANYTHING, 16384, 1, 1, NULL},
    };
    unsigned seed = 7;
    int proved = 0, refused = 0;
    for (int round = 0; round < 120; round++) {
        int c = round % 3;
        const char *rot = round % 4 < 2 ? "p2p" : "allgather";
        bool ov = round % 3 != 0;
        int H = cases[c].v == CPC_VARIANT_UNIFIED ? 4 : 4;
        long long Sbig = cases[c].v == CPC_VARIANT_RING_ANYTHING ? 3LL * 16384 + 7 : 2LL * 16384;
        unsigned ms = lcg(&seed) * 31u + (unsigned)round;
        int nm = 1 + (int)(lcg(&seed) % 2);
        cpc_program *p = build_plan(cases[c].v == CPC_VARIANT_UNIFIED ? 128 : H,
                                    cases[c].v == CPC_VARIANT_UNIFIED ? 128 : H, Sbig, "none", 0, cases[c].v,
                                    cases[c].big_R, cases[c].big_U, rot, ov);
        mutate(p, ms, nm);
        cpc_verify_stats s;
        cpc_verify_opts small = {.full_limit = 1000000}; /* keep the test short: no 16384-rank enumeration */
        cpc_status *st = cpc_verify_ex(p, &small, &s);
        if (st) {
            cr_assert(cpc_status_has_error(st), "round %d: not an error: %s", round, st->message);
            cr_assert_eq(st->rule, CPC_RULE_VERIFY);
            refused++;
            cpc_status_free(st);
            cpc_program_free(p);
            continue;
        }
        cr_assert(s.mode == CPC_VERIFY_SYMBOLIC || s.mode == CPC_VERIFY_FULL);
        proved++;
        cpc_program_free(p);
        for (int R = 5; R <= 7; R++) {
            int U = cases[c].small_U;
            long long S = cases[c].v == CPC_VARIANT_RING_ANYTHING ? 3LL * R + 7 : 2LL * R * U;
            cpc_program *q = build_plan(U > 1 ? 2 * U : H, U > 1 ? 2 * U : H, S, "none", 0, cases[c].v, R, U, rot, ov);
            mutate(q, ms, nm);
            cpc_status *en = verify_with(q, CPC_VERIFY_ENUMERATE, NULL);
            if (en) {
                fprintf(stderr, "round %d: proved at 16384, wrong at R=%d: %s\n", round, R, en->message);
                cpc_status_free(cpc_program_print(stderr, q, -1));
            }
            cr_assert_null(en, "round %d: proved at 16384 ranks, the enumeration at R=%d rejects it", round, R);
            cpc_program_free(q);
        }
    }
    cr_log_info("16384-rank mutants: %d proved, %d refused", proved, refused);
    cr_assert_gt(proved, 5);
    cr_assert_gt(refused, 5);
}
