/*
 * test_verify.c - the schedule verifier (compiler/verify.h): every variant's
 * schedule (cpc_schedule_build, and hand-built programs) is proved correct;
 * planted faults (a dropped ring step, a block attended twice, a swapped
 * peer, a missing wait, a read before write, a collective missing on some
 * ranks, a cycle of waits, ...) each give CP051 naming the op and the rank.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "verify.h"

/* ---- helpers ------------------------------------------------------------- */

static cpc_plan *load(const char *yaml)
{
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_string(yaml, strlen(yaml), "t.yaml", NULL, 0, &plan);
    if (st && cpc_status_has_error(st)) {
        char *m = cpc_status_format(st, "t");
        cr_assert_fail("plan load failed: %s", m ? m : "?");
    }
    cpc_status_free(st);
    cr_assert_not_null(plan);
    return plan;
}

/* A plan text: heads, kv_heads, tokens, world size, mask, kv tokens (0 =
 * none), rotate. */
static char *plan_text(int H, int Hkv, const char *tokens, int P, const char *mask, int kv, const char *rotate,
                       bool overlap)
{
    char *s = malloc(1024);
    char kvs[64] = "";
    if (kv > 0)
        snprintf(kvs, sizeof kvs, "\n  kv: {tokens: %d}", kv);
    snprintf(s, 1024,
             "version: 1\n"
             "model: {heads: %d, kv_heads: %d, head_dim: 8, dtype: fp32}\n"
             "input:\n  %s\n  mask: %s%s\n"
             "cluster: {world_size: %d}\n"
             "schedule: {rotate: %s, overlap: %s}\n",
             H, Hkv, tokens, mask, kvs, P, rotate, overlap ? "true" : "false");
    return s;
}

static cpc_program *build_text(const char *yaml, cpc_variant v, int R, int U)
{
    cpc_plan *plan = load(yaml);
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build(plan, v, R, U, &prog);
    if (st) {
        char *m = cpc_status_format(st, "t");
        cr_assert_fail("schedule failed: %s", m ? m : "?");
    }
    cpc_plan_free(plan);
    return prog;
}

static cpc_program *build(int H, int Hkv, const char *tokens, cpc_variant v, int R, int U, const char *mask,
                          int kv, const char *rotate, bool overlap)
{
    char *t = plan_text(H, Hkv, tokens, R * U, mask, kv, rotate, overlap);
    cpc_program *p = build_text(t, v, R, U);
    free(t);
    return p;
}

static cpc_program *simple(cpc_variant v, int R, int U)
{
    return build(4, 4, "tokens: 96", v, R, U, "none", 0, "p2p", true);
}

/* Proved: by the default method, by the enumeration of every rank, and,
 * for programs the symbolic proof covers, symbolically (a program the
 * enumeration proves must not be refused by the symbolic proof with a fault:
 * it may only say it cannot decide). */
static void expect_ok(const cpc_program *prog, const char *what)
{
    cpc_verify_stats stats;
    cpc_status *st = cpc_verify_ex(prog, NULL, &stats);
    if (st) {
        char *m = cpc_status_format(st, "cpc");
        for (cpc_status *n = st->notes; n; n = n->next)
            fprintf(stderr, "  note: %s\n", n->message);
        cr_assert_fail("%s: verification failed: %s", what, m ? m : "?");
    }
    cr_assert_neq(stats.mode, CPC_VERIFY_REFUSED, "%s", what);
    cr_assert_eq(stats.ranks, prog->layout.P, "%s", what);
    cr_assert_gt(stats.op_instances, 0);
    cpc_verify_opts en = {.method = CPC_VERIFY_ENUMERATE};
    st = cpc_verify_ex(prog, &en, &stats);
    cr_assert_null(st, "%s: enumeration: %s", what, st ? st->message : "");
    cr_assert_eq(stats.mode, CPC_VERIFY_FULL, "%s", what);
    cr_assert_eq(stats.ranks, prog->layout.P, "%s", what);
    cpc_verify_opts sy = {.method = CPC_VERIFY_SYMBOLIC_ONLY};
    st = cpc_verify_ex(prog, &sy, &stats);
    if (st) {
        cr_assert(strstr(st->message, "cannot prove the program symbolically"),
                  "%s: the symbolic proof reports a fault the enumeration does not see: %s", what, st->message);
        cpc_status_free(st);
    }
}

/* Asserts a CP051 error whose message holds every non-NULL substring. */
static void expect_cp051(cpc_status *st, const char *a, const char *b, const char *c)
{
    cr_assert_not_null(st, "expected CP051, verification passed");
    char *m = cpc_status_format(st, "cpc");
    cr_assert_eq(st->code, CPC_E_PLAN, "%s", m);
    cr_assert_eq(st->rule, CPC_RULE_VERIFY, "%s", m);
    cr_assert_eq(st->severity, CPC_SEV_ERROR, "%s", m);
    cr_assert(strstr(m, "CP051"), "%s", m);
    if (getenv("CPC_TEST_VERBOSE"))
        cpc_status_print(st, stderr, "cpc");
    const char *want[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (want[i])
            cr_assert(strstr(st->message, want[i]), "missing '%s' in: %s", want[i], st->message);
    free(m);
    cpc_status_free(st);
}

static cpc_op *top_op(cpc_program *prog, cpc_op_kind k, int nth)
{
    for (int i = 0; i < prog->n_ops; i++)
        if (prog->ops[i].kind == k && nth-- == 0)
            return &prog->ops[i];
    cr_assert_fail("no top-level %s #%d", cpc_op_kind_name(k), nth);
    return NULL;
}

static int top_index(cpc_program *prog, cpc_op_kind k, int nth)
{
    return (int)(top_op(prog, k, nth) - prog->ops);
}

static cpc_op *loop_op(cpc_program *prog)
{
    return top_op(prog, CPC_OP_LOOP, 0);
}

static int body_index(cpc_op *loop, cpc_op_kind k, int nth)
{
    for (int i = 0; i < loop->n_body; i++)
        if (loop->body[i].kind == k && nth-- == 0)
            return i;
    cr_assert_fail("no %s in the loop body", cpc_op_kind_name(k));
    return -1;
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

static void release_op(cpc_op *op)
{
    cpc_expr_free(op->peer);
    cpc_expr_free(op->block);
    cpc_expr_free(op->when);
    cpc_expr_free(op->count);
    cpc_ops_free(op->body, op->n_body);
}

/* Removes ops[i] from an array of n ops. */
static void remove_at(cpc_op *ops, int *n, int i)
{
    release_op(&ops[i]);
    memmove(&ops[i], &ops[i + 1], sizeof(cpc_op) * (size_t)(*n - i - 1));
    (*n)--;
}

/* Inserts a deep copy of `src` at position i of (*ops, *n). */
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

static int bufi(const cpc_program *prog, const char *name)
{
    int b = cpc_program_find_buffer(prog, name);
    cr_assert_geq(b, 0, "no buffer %s", name);
    return b;
}

/* ---- every variant passes ------------------------------------------------------ */

Test(verify, every_variant_small_plans_pass)
{
    struct {
        cpc_variant v;
        int R, U;
    } cands[] = {
        {CPC_VARIANT_NONE, 1, 1},
        {CPC_VARIANT_ULYSSES, 1, 2},
        {CPC_VARIANT_ULYSSES, 1, 4},
        {CPC_VARIANT_RING, 2, 1},
        {CPC_VARIANT_RING, 4, 1},
        {CPC_VARIANT_RING, 3, 1},
        {CPC_VARIANT_UNIFIED, 2, 2},
        {CPC_VARIANT_UNIFIED, 3, 2},
        {CPC_VARIANT_UNIFIED, 2, 4},
        {CPC_VARIANT_ULYSSES_ANYTHING, 1, 3},
        {CPC_VARIANT_RING_ANYTHING, 5, 1},
    };
    const char *rot[] = {"p2p", "allgather"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++)
        for (int r = 0; r < 2; r++)
            for (int ov = 0; ov < 2; ov++) {
                /* 96 tokens: divisible by 2, 3, 4, 6, 8; 4 heads. */
                cpc_program *p = build(4, 4, "tokens: 96", cands[i].v, cands[i].R, cands[i].U, "none", 0,
                                       rot[r], ov);
                char what[128];
                snprintf(what, sizeof what, "%s %dx%d %s overlap=%d", cpc_variant_name(cands[i].v), cands[i].R,
                         cands[i].U, rot[r], ov);
                expect_ok(p, what);
                cpc_program_free(p);
            }
}

Test(verify, uneven_anything_variants_pass)
{
    /* FLUX-like: two segments (text + image), lengths not divisible. */
    const char *segs = "segments: [{name: text, tokens: 13}, {name: image, tokens: 61}]";
    cpc_program *p = build(6, 6, segs, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, "none", 0, "p2p", true);
    expect_ok(p, "ulysses_anything 1x4 uneven tokens and heads (6 over 4)");
    cpc_program_free(p);
    p = build(6, 6, segs, CPC_VARIANT_RING_ANYTHING, 3, 1, "none", 0, "p2p", true);
    expect_ok(p, "ring_anything 3 uneven");
    cpc_program_free(p);
    p = build(6, 6, segs, CPC_VARIANT_RING_ANYTHING, 4, 1, "none", 0, "allgather", true);
    expect_ok(p, "ring_anything 4 allgather uneven");
    cpc_program_free(p);
    /* 7 tokens over 2 ranks (tokens7-ring-anything2). */
    p = build(2, 2, "tokens: 7", CPC_VARIANT_RING_ANYTHING, 2, 1, "none", 0, "p2p", true);
    expect_ok(p, "ring_anything 7 tokens over 2");
    cpc_program_free(p);
}

Test(verify, gqa_causal_cross_and_masks_pass)
{
    /* GQA 8:2, ulysses 4 > Hkv 2: K/V heads replicated. */
    cpc_program *p = build(8, 2, "tokens: 64", CPC_VARIANT_ULYSSES, 1, 4, "none", 0, "p2p", true);
    expect_ok(p, "gqa replicated");
    cpc_program_free(p);
    /* GQA 28:7 over ulysses_anything 2 (uneven K/V straddling). */
    p = build(28, 7, "tokens: 30", CPC_VARIANT_ULYSSES_ANYTHING, 1, 2, "none", 0, "p2p", true);
    expect_ok(p, "gqa 28:7 ua2");
    cpc_program_free(p);
    p = build(12, 4, "tokens: 40", CPC_VARIANT_ULYSSES_ANYTHING, 1, 5, "none", 0, "p2p", true);
    expect_ok(p, "gqa 12:4 ua5");
    cpc_program_free(p);
    /* causal zigzag ring and unified. */
    p = build(4, 4, "tokens: 64", CPC_VARIANT_RING, 4, 1, "causal", 0, "p2p", true);
    cr_assert(p->layout.zigzag);
    expect_ok(p, "causal ring zigzag");
    cpc_program_free(p);
    p = build(4, 4, "tokens: 64", CPC_VARIANT_UNIFIED, 2, 2, "causal", 0, "allgather", true);
    expect_ok(p, "causal unified allgather");
    cpc_program_free(p);
    p = build(4, 4, "tokens: 64", CPC_VARIANT_ULYSSES, 1, 4, "causal", 0, "p2p", true);
    expect_ok(p, "causal ulysses");
    cpc_program_free(p);
    /* key padding: same coverage as no mask. */
    p = build(4, 4, "tokens: 64", CPC_VARIANT_UNIFIED, 2, 2, "key_padding", 0, "p2p", false);
    expect_ok(p, "key padding unified");
    cpc_program_free(p);
    /* cross-attention: K/V whole on every rank. */
    p = build(4, 4, "tokens: 64", CPC_VARIANT_ULYSSES, 1, 4, "none", 24, "p2p", true);
    expect_ok(p, "cross ulysses");
    cpc_program_free(p);
    p = build(4, 4, "tokens: 64", CPC_VARIANT_RING, 4, 1, "none", 24, "p2p", true);
    expect_ok(p, "cross ring");
    cpc_program_free(p);
    p = build(4, 4, "tokens: 64", CPC_VARIANT_UNIFIED, 2, 2, "none", 24, "p2p", true);
    expect_ok(p, "cross unified");
    cpc_program_free(p);
}

Test(verify, larger_mesh_symbolic_and_enumerated)
{
    /* unified 8x8 = 64 ranks */
    cpc_program *p = build(8, 8, "tokens: 1024", CPC_VARIANT_UNIFIED, 8, 8, "none", 0, "p2p", true);
    expect_ok(p, "unified 8x8");
    cpc_verify_stats s;
    cpc_status *st = cpc_verify_ex(p, NULL, &s);
    cr_assert_null(st);
    cr_assert_eq(s.mode, CPC_VERIFY_SYMBOLIC, "the compiler's unified program is proved symbolically");
    /* A fault is found by both methods. */
    set_expr(&loop_op(p)->count, "R-1");
    expect_cp051(cpc_verify(p), "incomplete", "rank ", NULL);
    cpc_verify_opts sy = {.method = CPC_VERIFY_SYMBOLIC_ONLY};
    char want[64];
    snprintf(want, sizeof want, "ops[%d] copy", top_index(p, CPC_OP_COPY, 0) + 1);
    expect_cp051(cpc_verify_ex(p, &sy, NULL), "incomplete", "never met the keys/values", want);
    /* Too large to enumerate and not symbolic: an ERROR (never a warning),
     * naming the op that made it irregular. */
    set_expr(&loop_op(p)->count, "R");
    set_expr(&loop_op(p)->when, "p!=5");
    cpc_verify_opts tiny = {.full_limit = 10};
    st = cpc_verify_ex(p, &tiny, &s);
    cr_assert_eq(s.mode, CPC_VERIFY_REFUSED);
    cr_assert_gt(s.estimate, 10);
    snprintf(want, sizeof want, "ops[%d] loop", top_index(p, CPC_OP_LOOP, 0) + 1);
    expect_cp051(st, "cannot be proven", want, "`when` `p!=5` depends on the rank");
    /* ... which the enumeration proves when it may run (rank 5 skips the
     * ring loop: its output misses every block but its own) */
    expect_cp051(cpc_verify(p), "rank 5", "holds no attention result", NULL);
    cpc_program_free(p);

    /* ring over 128 ranks: 128 steps each */
    p = build(2, 2, "tokens: 256", CPC_VARIANT_RING, 128, 1, "none", 0, "p2p", true);
    expect_ok(p, "ring 128");
    cpc_program_free(p);
}

/* ---- hand-built programs (independent of the scheduler) ------------------------- */

static cpc_layout hand_layout(int R, int U, int64_t S, int H, bool causal)
{
    static cpc_segment seg = {.name = "tokens"};
    seg.tokens = S;
    cpc_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.model.heads = H;
    plan.model.kv_heads = H;
    plan.model.head_dim = 8;
    plan.model.dtype = CPC_DTYPE_FP32;
    plan.input.batch = 1;
    plan.input.n_segments = 1;
    plan.input.segments = &seg;
    plan.input.total_tokens = S;
    plan.input.mask = causal ? CPC_MASK_CAUSAL : CPC_MASK_NONE;
    plan.cluster.world_size = R * U;
    cpc_layout L;
    cr_assert_null(cpc_layout_init(&L, &plan, U > 1 ? (R > 1 ? CPC_VARIANT_UNIFIED : CPC_VARIANT_ULYSSES)
                                                    : CPC_VARIANT_RING,
                                   R, U));
    return L;
}

static cpc_op *hop(cpc_op **ops, int *n, const cpc_program *prog, cpc_op_kind k, cpc_group g, const char *in,
                   const char *out)
{
    cpc_op *op = cpc_ops_append(ops, n, k);
    cr_assert_not_null(op);
    op->group = g;
    char buf[128];
    for (int pass = 0; pass < 2; pass++) {
        const char *list = pass ? out : in;
        if (!list)
            continue;
        snprintf(buf, sizeof buf, "%s", list);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (pass)
                op->out[op->n_out++] = bufi(prog, t);
            else
                op->in[op->n_in++] = bufi(prog, t);
        }
    }
    return op;
}

/* The ring program of schedule.h, written by hand (p2p with overlap). */
static cpc_program *hand_ring(int R, int64_t S, bool causal)
{
    cpc_layout L = hand_layout(R, 1, S, 2, causal);
    cpc_program *p = cpc_program_new(&L, true, CPC_ROTATE_P2P);
    cpc_program_add_buffer(p, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    cpc_program_add_buffer(p, "k", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    cpc_program_add_buffer(p, "v", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    cpc_program_add_buffer(p, "kn", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_program_add_buffer(p, "vn", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_program_add_buffer(p, "ob", CPC_ROLE_ACC, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_program_add_buffer(p, "lb", CPC_ROLE_LSE, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_program_add_buffer(p, "acc", CPC_ROLE_ACC, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_program_add_buffer(p, "lse", CPC_ROLE_LSE, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_program_add_buffer(p, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
    hop(&p->ops, &p->n_ops, p, CPC_OP_INIT_ACC, CPC_GROUP_NONE, NULL, "acc,lse");
    cpc_op *loop = hop(&p->ops, &p->n_ops, p, CPC_OP_LOOP, CPC_GROUP_NONE, NULL, NULL);
    set_expr(&loop->count, "R");
    cpc_op *op = hop(&loop->body, &loop->n_body, p, CPC_OP_SEND, CPC_GROUP_RING, "k,v", NULL);
    set_expr(&op->peer, "(r+1)%R");
    set_expr(&op->when, "s<R-1");
    op = hop(&loop->body, &loop->n_body, p, CPC_OP_RECV, CPC_GROUP_RING, NULL, "kn,vn");
    set_expr(&op->peer, "(r-1)%R");
    set_expr(&op->block, "(r-s-1)%R");
    set_expr(&op->when, "s<R-1");
    hop(&loop->body, &loop->n_body, p, CPC_OP_ATTN, CPC_GROUP_NONE, "q,k,v", "ob,lb");
    hop(&loop->body, &loop->n_body, p, CPC_OP_MERGE, CPC_GROUP_NONE, "ob,lb", "acc,lse");
    op = hop(&loop->body, &loop->n_body, p, CPC_OP_WAIT, CPC_GROUP_NONE, NULL, NULL);
    set_expr(&op->when, "s<R-1");
    op = hop(&loop->body, &loop->n_body, p, CPC_OP_SWAP, CPC_GROUP_NONE, "k,kn", NULL);
    set_expr(&op->when, "s<R-1");
    op = hop(&loop->body, &loop->n_body, p, CPC_OP_SWAP, CPC_GROUP_NONE, "v,vn", NULL);
    set_expr(&op->when, "s<R-1");
    hop(&p->ops, &p->n_ops, p, CPC_OP_COPY, CPC_GROUP_NONE, "acc", "out");
    return p;
}

/* Messages land buffer by buffer (the executor posts one request per
 * buffer): every buffer's element size must match, not only the message's
 * total.  Ring of two in bf16: after the ring, each rank sends its complete
 * accumulator (fp32) and its output (bf16) to the next; the receiver takes
 * them in that order (proved) or swapped (the same total bytes: refused). */
static cpc_program *send_results(bool swapped)
{
    cpc_program *p = hand_ring(2, 16, false);
    p->layout.dtype = CPC_DTYPE_BF16;
    cpc_program_add_buffer(p, "acc2", CPC_ROLE_ACC, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_program_add_buffer(p, "o2", CPC_ROLE_O, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_op *op = hop(&p->ops, &p->n_ops, p, CPC_OP_SEND, CPC_GROUP_RING, "acc,out", NULL);
    set_expr(&op->peer, "(r+1)%R");
    op->tag = 5;
    op = hop(&p->ops, &p->n_ops, p, CPC_OP_RECV, CPC_GROUP_RING, NULL, swapped ? "o2,acc2" : "acc2,o2");
    set_expr(&op->peer, "(r-1)%R");
    set_expr(&op->block, "(r-1)%R");
    op->tag = 5;
    op = hop(&p->ops, &p->n_ops, p, CPC_OP_WAIT, CPC_GROUP_NONE, NULL, NULL);
    op->tag = 5;
    return p;
}

Test(verify, messages_match_buffer_by_buffer)
{
    cpc_program *p = send_results(false);
    cr_assert_eq(cpc_buffer_elem_size(p, bufi(p, "acc")), 4);
    cr_assert_eq(cpc_buffer_elem_size(p, bufi(p, "out")), 2);
    expect_ok(p, "accumulator and output, in order");
    cpc_program_free(p);
    p = send_results(true);
    expect_cp051(cpc_verify(p), "expects elements of 2 bytes in o2", "sends 4-byte elements from acc", NULL);
    cpc_program_free(p);
}

Test(verify, hand_ring_passes)
{
    for (int R = 1; R <= 5; R++) {
        cpc_program *p = hand_ring(R, 60, false);
        expect_ok(p, "hand ring");
        cpc_program_free(p);
    }
    cpc_program *p = hand_ring(4, 64, true);
    expect_ok(p, "hand ring causal");
    cpc_program_free(p);
}

Test(verify, causal_blocks_above_the_diagonal_may_be_skipped)
{
    /* contiguous (not zigzag) causal shards: rank r needs blocks 0..r only;
     * at step s it holds block (r-s)%R, above the diagonal when s > r. */
    cpc_program *p = hand_ring(4, 60, true);
    cr_assert_not(p->layout.zigzag);
    expect_ok(p, "causal contiguous, every block attended");
    cpc_op *loop = &p->ops[1];
    set_expr(&loop->body[2].when, "s<=r"); /* attn */
    set_expr(&loop->body[3].when, "s<=r"); /* merge */
    expect_ok(p, "causal contiguous, masked blocks skipped");
    /* skipping one block that has visible keys is caught */
    set_expr(&loop->body[2].when, "s<r");
    set_expr(&loop->body[3].when, "s<r");
    expect_cp051(cpc_verify(p), "incomplete", "ops[3] copy", NULL);
    cpc_program_free(p);
    /* without the mask, skipping is a missing block */
    p = hand_ring(4, 60, false);
    set_expr(&p->ops[1].body[2].when, "s<=r");
    set_expr(&p->ops[1].body[3].when, "s<=r");
    expect_cp051(cpc_verify(p), "incomplete", "ops[3] copy", "never met the keys/values");
    cpc_program_free(p);
}

Test(verify, hand_ring_faults)
{
    /* drop a ring step */
    cpc_program *p = hand_ring(4, 64, false);
    set_expr(&p->ops[1].count, "R-1");
    expect_cp051(cpc_verify(p), "ops[3] copy", "incomplete", "rank ");
    cpc_program_free(p);

    /* the same with a causal mask (zigzag: every block has visible keys) */
    p = hand_ring(4, 64, true);
    set_expr(&p->ops[1].count, "R-1");
    expect_cp051(cpc_verify(p), "ops[3] copy", "incomplete", NULL);
    cpc_program_free(p);

    /* wrong peer: send two ahead (R = 4) */
    p = hand_ring(4, 64, false);
    set_expr(&p->ops[1].body[0].peer, "(r+2)%R");
    expect_cp051(cpc_verify(p), "rank ", "ops[2].body[", NULL);
    cpc_program_free(p);

    /* wrong block declared by the recv */
    p = hand_ring(4, 64, false);
    set_expr(&p->ops[1].body[1].block, "(r-s)%R");
    expect_cp051(cpc_verify(p), "ops[2].body[2] recv (step 0)", "declares that ring block", NULL);
    cpc_program_free(p);

    /* a cycle of waits: recv, wait, send, wait on both ranks of R = 2 */
    cpc_layout L = hand_layout(2, 1, 16, 2, false);
    p = cpc_program_new(&L, true, CPC_ROTATE_P2P);
    cpc_program_add_buffer(p, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    cpc_program_add_buffer(p, "k", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    cpc_program_add_buffer(p, "kn", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_NONE);
    cpc_program_add_buffer(p, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
    cpc_op *op = hop(&p->ops, &p->n_ops, p, CPC_OP_RECV, CPC_GROUP_RING, NULL, "kn");
    set_expr(&op->peer, "(r+1)%R");
    set_expr(&op->block, "(r+1)%R");
    hop(&p->ops, &p->n_ops, p, CPC_OP_WAIT, CPC_GROUP_NONE, NULL, NULL);
    op = hop(&p->ops, &p->n_ops, p, CPC_OP_SEND, CPC_GROUP_RING, "k", NULL);
    set_expr(&op->peer, "(r+1)%R");
    hop(&p->ops, &p->n_ops, p, CPC_OP_WAIT, CPC_GROUP_NONE, NULL, NULL);
    expect_cp051(cpc_verify(p), "deadlock", "cycle of waits: rank 0 (ops[2] wait) -> rank 1 (ops[2] wait) -> rank 0",
                 "rank 0 (r 0, u 0), ops[2] wait");
    cpc_program_free(p);
}

/* ---- faults planted in scheduler-built programs ---------------------------------- */

Test(verify, fault_drop_ring_step)
{
    cpc_variant vs[] = {CPC_VARIANT_RING, CPC_VARIANT_UNIFIED, CPC_VARIANT_RING_ANYTHING};
    int Rs[] = {4, 2, 3}, Us[] = {1, 2, 1};
    const char *rot[] = {"p2p", "allgather"};
    for (int i = 0; i < 3; i++)
        for (int r = 0; r < 2; r++) {
            cpc_program *p = build(4, 4, "tokens: 96", vs[i], Rs[i], Us[i], "none", 0, rot[r], true);
            set_expr(&loop_op(p)->count, "R-1");
            char want[64];
            int ci = top_index(p, CPC_OP_COPY, 0);
            snprintf(want, sizeof want, "ops[%d] copy", ci + 1); /* 1-based */
            expect_cp051(cpc_verify(p), want, "never met the keys/values", "rank ");
            cpc_program_free(p);
        }
}

Test(verify, fault_duplicate_block)
{
    /* attn twice in a row: the first output is overwritten unused. */
    cpc_program *p = simple(CPC_VARIANT_RING, 4, 1);
    cpc_op *loop = loop_op(p);
    int a = body_index(loop, CPC_OP_ATTN, 0);
    insert_copy(&loop->body, &loop->n_body, a, &loop->body[a]);
    char want[64];
    snprintf(want, sizeof want, "ops[%d].body[%d] attn (step 0)", (int)(loop - p->ops) + 1, a + 2);
    expect_cp051(cpc_verify(p), want, "overwrites the attention output", "rank 0");
    cpc_program_free(p);

    /* attn + merge twice: the second merge repeats a block. */
    p = simple(CPC_VARIANT_UNIFIED, 2, 2);
    loop = loop_op(p);
    a = body_index(loop, CPC_OP_ATTN, 0);
    int m = body_index(loop, CPC_OP_MERGE, 0);
    insert_copy(&loop->body, &loop->n_body, m + 1, &loop->body[a]);
    insert_copy(&loop->body, &loop->n_body, m + 2, &loop->body[m]);
    snprintf(want, sizeof want, "ops[%d].body[%d] merge (step 0)", (int)(loop - p->ops) + 1, m + 3);
    expect_cp051(cpc_verify(p), want, "twice", "rank 0");
    cpc_program_free(p);

    /* a second copy of the loop's last block, in the allgather variant: attend
     * block (r-s)%R and also (r-s+1)%R in step R-1 via a changed block. */
    p = build(4, 4, "tokens: 96", CPC_VARIANT_RING, 3, 1, "none", 0, "allgather", true);
    loop = loop_op(p);
    a = body_index(loop, CPC_OP_ATTN, 0);
    set_expr(&loop->body[a].block, "(r+min(s,1))%R");
    expect_cp051(cpc_verify(p), "merge (step 2)", "twice", NULL);
    cpc_program_free(p);

    /* a merge of a stale output: attn only at step 0, merge every step */
    p = simple(CPC_VARIANT_RING, 3, 1);
    loop = loop_op(p);
    a = body_index(loop, CPC_OP_ATTN, 0);
    set_expr(&loop->body[a].when, "s==0");
    expect_cp051(cpc_verify(p), "merge (step 1)", "a second time", NULL);
    cpc_program_free(p);
}

Test(verify, fault_swap_peer)
{
    /* send to (r+2)%R instead of (r+1)%R, R = 4 and R = 3 */
    for (int R = 3; R <= 4; R++) {
        cpc_program *p = simple(CPC_VARIANT_RING, R, 1);
        cpc_op *loop = loop_op(p);
        set_expr(&loop->body[body_index(loop, CPC_OP_SEND, 0)].peer, "(r+2)%R");
        cpc_status *st = cpc_verify(p);
        cr_assert_not_null(st);
        /* the block that arrives is not the one the recv declares, or a wait blocks forever */
        cr_assert(strstr(st->message, "declares that ring block") || strstr(st->message, "deadlock") ||
                      strstr(st->message, "blocked forever"),
                  "%s", st->message);
        expect_cp051(st, "rank ", ".body[", NULL);
        cpc_program_free(p);
    }
    /* recv from the wrong peer: a deadlock whose note names the mismatch */
    cpc_program *p = simple(CPC_VARIANT_RING, 4, 1);
    cpc_op *loop = loop_op(p);
    set_expr(&loop->body[body_index(loop, CPC_OP_RECV, 0)].peer, "(r+1)%R");
    cpc_status *st = cpc_verify(p);
    cr_assert_not_null(st);
    bool mismatch_note = false;
    for (cpc_status *n = st->notes; n; n = n->next)
        mismatch_note |= strstr(n->message, "peers do not match") != NULL;
    cr_assert(mismatch_note, "%s", st->message);
    expect_cp051(st, "deadlock", "wait (step 0)", NULL);
    cpc_program_free(p);
    /* unified: ring peers inside the ring group */
    p = simple(CPC_VARIANT_UNIFIED, 3, 2);
    loop = loop_op(p);
    set_expr(&loop->body[body_index(loop, CPC_OP_SEND, 0)].peer, "(r+2)%R");
    expect_cp051(cpc_verify(p), "rank ", NULL, NULL);
    cpc_program_free(p);
}

Test(verify, fault_remove_wait)
{
    bool overlap[] = {true, false};
    for (int i = 0; i < 2; i++) {
        cpc_program *p = build(4, 4, "tokens: 96", CPC_VARIANT_RING, 4, 1, "none", 0, "p2p", overlap[i]);
        cpc_op *loop = loop_op(p);
        remove_at(loop->body, &loop->n_body, body_index(loop, CPC_OP_WAIT, 0));
        expect_cp051(cpc_verify(p), "swap (step 0)", "no `wait tag 0` between them", "rank ");
        cpc_program_free(p);
    }
}

Test(verify, fault_read_before_write)
{
    /* attn reads k_nxt (written only by the recv of step 0, after its wait) */
    cpc_program *p = simple(CPC_VARIANT_RING, 4, 1);
    cpc_op *loop = loop_op(p);
    int a = body_index(loop, CPC_OP_ATTN, 0);
    loop->body[a].in[1] = bufi(p, "k_nxt");
    expect_cp051(cpc_verify(p), "attn (step 0)", "k_nxt", "not complete");
    cpc_program_free(p);

    /* ulysses: attention before the all-to-all of v: v_seq never written yet */
    p = simple(CPC_VARIANT_ULYSSES, 1, 4);
    int ia = top_index(p, CPC_OP_ATTN, 0);
    int iv = top_index(p, CPC_OP_ALL_TO_ALL, 2);
    cpc_op t = p->ops[iv];
    memmove(&p->ops[iv], &p->ops[iv + 1], sizeof(cpc_op) * (size_t)(ia - iv));
    p->ops[ia] = t;
    char want[64];
    snprintf(want, sizeof want, "ops[%d] attn", iv + 1);
    expect_cp051(cpc_verify(p), want, "reads v_seq before it is written", "rank 0");
    cpc_program_free(p);

    /* merge without init_acc */
    p = simple(CPC_VARIANT_RING, 2, 1);
    remove_at(p->ops, &p->n_ops, top_index(p, CPC_OP_INIT_ACC, 0));
    expect_cp051(cpc_verify(p), "merge (step 0)", "not initialised", NULL);
    cpc_program_free(p);

    /* the OUTPUT buffer never written */
    p = simple(CPC_VARIANT_ULYSSES, 1, 2);
    remove_at(p->ops, &p->n_ops, top_index(p, CPC_OP_ALL_TO_ALL, 3));
    expect_cp051(cpc_verify(p), "OUTPUT buffer out is never written", "rank 0", NULL);
    cpc_program_free(p);
}

Test(verify, fault_collective_on_some_ranks)
{
    /* all_to_all of k skipped on ulysses member 1: collective mismatch */
    cpc_program *p = simple(CPC_VARIANT_ULYSSES, 1, 4);
    cpc_op *a2a_k = top_op(p, CPC_OP_ALL_TO_ALL, 1);
    set_expr(&a2a_k->when, "u!=1");
    char want[64];
    snprintf(want, sizeof want, "ops[%d] all_to_all", (int)(a2a_k - p->ops) + 1);
    expect_cp051(cpc_verify(p), "collective mismatch", want, "rank 1 (r 0, u 1)");
    cpc_program_free(p);

    /* the final all_to_all skipped on rank 3 only: the others wait forever */
    p = simple(CPC_VARIANT_UNIFIED, 2, 2);
    cpc_op *last = top_op(p, CPC_OP_ALL_TO_ALL, 3);
    set_expr(&last->when, "p!=3");
    cpc_status *st = cpc_verify(p);
    expect_cp051(st, "rank 2", "has not reached this collective", NULL);
    cpc_program_free(p);

    /* all_gather skipped on ring member 0 of a 3-ring */
    p = build(4, 4, "tokens: 96", CPC_VARIANT_RING, 3, 1, "none", 0, "allgather", true);
    set_expr(&top_op(p, CPC_OP_ALL_GATHER, 0)->when, "r!=0");
    expect_cp051(cpc_verify(p), "collective mismatch", "all_gather", NULL);
    cpc_program_free(p);
}

Test(verify, fault_heads_and_layouts)
{
    /* copy acc -> out on a ulysses program: the output gets part heads */
    cpc_program *p = simple(CPC_VARIANT_ULYSSES, 1, 2);
    cpc_op *c = top_op(p, CPC_OP_COPY, 0);
    c->out[0] = bufi(p, "out");
    expect_cp051(cpc_verify(p), "rank 0", "copy", NULL);
    cpc_program_free(p);

    /* attention of q against v as keys */
    p = simple(CPC_VARIANT_NONE, 1, 1);
    cpc_op *a = top_op(p, CPC_OP_ATTN, 0);
    a->in[1] = a->in[2];
    expect_cp051(cpc_verify(p), "ops[1] attn", "holds v data, not k", NULL);
    cpc_program_free(p);

    /* static shape errors: attn with two inputs, recv without block */
    p = simple(CPC_VARIANT_NONE, 1, 1);
    top_op(p, CPC_OP_ATTN, 0)->n_in = 2;
    expect_cp051(cpc_verify(p), "ops[1] attn", "needs 3 inputs", NULL);
    cpc_program_free(p);
    p = simple(CPC_VARIANT_RING, 2, 1);
    cpc_op *loop = loop_op(p);
    set_expr(&loop->body[body_index(loop, CPC_OP_RECV, 0)].block, NULL);
    expect_cp051(cpc_verify(p), "recv", "needs a block", NULL);
    cpc_program_free(p);

    /* a peer outside the group; an expression that fails */
    p = simple(CPC_VARIANT_RING, 2, 1);
    loop = loop_op(p);
    set_expr(&loop->body[body_index(loop, CPC_OP_SEND, 0)].peer, "r+1");
    expect_cp051(cpc_verify(p), "rank 1 (r 1, u 0)", "outside the ring group", NULL);
    cpc_program_free(p);
    p = simple(CPC_VARIANT_RING, 2, 1);
    set_expr(&loop_op(p)->count, "R/(1-r)");
    expect_cp051(cpc_verify(p), "rank 1", "cannot evaluate count", NULL);
    cpc_program_free(p);
}

Test(verify, fault_never_waited_or_matched)
{
    /* the send and recv of the last step run (when removed) but nobody waits */
    cpc_program *p = simple(CPC_VARIANT_RING, 2, 1);
    cpc_op *loop = loop_op(p);
    set_expr(&loop->body[body_index(loop, CPC_OP_SEND, 0)].when, NULL);
    set_expr(&loop->body[body_index(loop, CPC_OP_RECV, 0)].when, NULL);
    expect_cp051(cpc_verify(p), "never completed", "(step 1)", NULL);
    cpc_program_free(p);
    /* a recv with no send anywhere, never waited */
    p = simple(CPC_VARIANT_RING, 2, 1);
    loop = loop_op(p);
    remove_at(loop->body, &loop->n_body, body_index(loop, CPC_OP_SEND, 0));
    cpc_status *st = cpc_verify(p);
    cr_assert_not_null(st);
    bool note_ok = false;
    for (cpc_status *n = st->notes; n; n = n->next)
        note_ok |= strstr(n->message, "has no matching send on rank") != NULL;
    cr_assert(note_ok, "%s", st->message);
    expect_cp051(st, "rank ", "deadlock", NULL);
    cpc_program_free(p);
}

Test(verify, bad_arguments)
{
    cpc_status *st = cpc_verify(NULL);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INTERNAL);
    cpc_status_free(st);
    cpc_program *p = cpc_program_new(NULL, true, CPC_ROTATE_P2P);
    st = cpc_verify(p);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INTERNAL);
    cpc_status_free(st);
    cpc_program_free(p);
}

/* ---- robustness: random mutations never crash and are mostly caught ---------- */

static unsigned lcg(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

/* Picks a random op (top level or in the first loop's body). */
static cpc_op *pick(cpc_program *p, unsigned *s, cpc_op **arr, int **n)
{
    cpc_op *loop = NULL;
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == CPC_OP_LOOP)
            loop = &p->ops[i];
    if (loop && loop->n_body > 0 && lcg(s) % 2) {
        *arr = loop->body;
        *n = &loop->n_body;
    } else {
        *arr = p->ops;
        *n = &p->n_ops;
    }
    return &(*arr)[lcg(s) % (unsigned)**n];
}

Test(verify, random_mutations_never_crash)
{
    static const char *const exprs[] = {"(r+1)%R", "(r-1)%R", "(r+2)%R", "s<R-1", "s<R", "s==0", "u!=1",
                                        "R",       "R-1",     "R+1",     "0",     "1",    "p%2",  "(r-s)%R"};
    cpc_variant vs[] = {CPC_VARIANT_RING, CPC_VARIANT_UNIFIED, CPC_VARIANT_ULYSSES, CPC_VARIANT_RING_ANYTHING};
    int Rs[] = {3, 2, 1, 4}, Us[] = {1, 2, 3, 1};
    unsigned seed = 2024;
    int caught = 0, total = 0;
    for (int round = 0; round < 400; round++) {
        int c = round % 4;
        cpc_program *p = build(6, 6, "tokens: 96", vs[c], Rs[c], Us[c], "none", 0,
                               round % 8 < 4 ? "p2p" : "allgather", round % 3 != 0);
        int muts = 1 + (int)(lcg(&seed) % 3);
        for (int m = 0; m < muts; m++) {
            cpc_op *arr;
            int *n;
            cpc_op *op = pick(p, &seed, &arr, &n);
            switch (lcg(&seed) % 6) {
            case 0: /* change a buffer operand */
                if (op->n_in > 0)
                    op->in[lcg(&seed) % (unsigned)op->n_in] = (int)(lcg(&seed) % (unsigned)p->n_buffers);
                else if (op->n_out > 0)
                    op->out[lcg(&seed) % (unsigned)op->n_out] = (int)(lcg(&seed) % (unsigned)p->n_buffers);
                break;
            case 1: /* change or set an expression */
                if (op->kind == CPC_OP_LOOP)
                    set_expr(&op->count, exprs[lcg(&seed) % 14]);
                else if (op->peer && lcg(&seed) % 2)
                    set_expr(&op->peer, exprs[lcg(&seed) % 3]);
                else
                    set_expr(&op->when, exprs[3 + lcg(&seed) % 11]);
                break;
            case 2: /* delete an op */
                if (*n > 1 && op->kind != CPC_OP_LOOP)
                    remove_at(arr, n, (int)(op - arr));
                break;
            case 3: { /* swap two neighbours */
                int i = (int)(op - arr);
                if (i + 1 < *n) {
                    cpc_op t = arr[i];
                    arr[i] = arr[i + 1];
                    arr[i + 1] = t;
                }
                break;
            }
            case 4: /* change the tag or the direction */
                op->tag = (int)(lcg(&seed) % 2);
                if (op->kind == CPC_OP_ALL_TO_ALL)
                    op->dir = (cpc_a2a_dir)(lcg(&seed) % 2);
                break;
            default: /* change the group */
                if (op->group != CPC_GROUP_NONE)
                    op->group = (cpc_group)(1 + lcg(&seed) % 3);
                break;
            }
        }
        cpc_status *st = cpc_verify(p);
        total++;
        if (!st && getenv("CPC_TEST_VERBOSE")) {
            fprintf(stderr, "--- accepted mutant (round %d):\n", round);
            cpc_status_free(cpc_program_print(stderr, p, -1));
        }
        if (st) {
            cr_assert_eq(st->code, CPC_E_PLAN, "%s", st->message);
            cr_assert_eq(st->rule, CPC_RULE_VERIFY, "%s", st->message);
            cr_assert(strstr(st->message, "schedule verification failed"), "%s", st->message);
            caught++;
            cpc_status_free(st);
        }
        cpc_program_free(p);
    }
    /* most random edits break something; a few are harmless (a tag change on
     * both sides, a swap of independent ops) */
    cr_assert_gt(caught, total / 2, "caught %d of %d", caught, total);
    cr_log_info("random mutations: %d of %d rejected", caught, total);
}

/* THE PROVER'S BOUND (verify.h; issue 21): a live loop of N ops, each
 * guarded by s==a1||...||s==a32 with its own constants (a script inside
 * every Lua limit can write it), took 41 s at N = 400 and hours at 4000.
 * Now the work is counted before it is done: small N is still proven, large
 * N is a CP051 naming the bound, both in well under a second; the same call
 * is what cprun and cpc_artifact_load make. */
static void add_guarded_barriers(cpc_program *p, int n)
{
    cpc_op *loop = NULL;
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == CPC_OP_LOOP)
            loop = &p->ops[i];
    cr_assert_not_null(loop);
    for (int i = 0; i < n; i++) {
        char w[1024] = "";
        for (int j = 0; j < 32; j++) {
            char t[32];
            snprintf(t, sizeof t, "%ss==%d", j ? "||" : "", ((i * 32 + j) * 7) % 1000);
            strcat(w, t);
        }
        cpc_op *b = cpc_ops_append(&loop->body, &loop->n_body, CPC_OP_BARRIER);
        cr_assert_not_null(b);
        b->group = CPC_GROUP_WORLD;
        cr_assert_null(cpc_expr_parse(w, CPC_NO_SPAN, &b->when));
    }
}

Test(verify, work_is_bounded)
{
    const int Ns[] = {20, 4000};
    for (int k = 0; k < 2; k++) {
        cpc_program *p = simple(CPC_VARIANT_RING, 1024, 1);
        add_guarded_barriers(p, Ns[k]);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        cpc_verify_stats stats;
        cpc_status *st = cpc_verify_ex(p, NULL, &stats);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (k == 0)
            cr_expect_null(st, "N=%d: %s", Ns[k], st ? st->message : "");
        else {
            cr_assert_not_null(st, "N=%d: accepted", Ns[k]);
            cr_expect_eq(st->rule, CPC_RULE_VERIFY);
            cr_expect(strstr(st->message, "prover's bound") != NULL, "%s", st->message);
        }
        cr_expect(sec < 5.0, "N=%d: %.2f s (the bound is about 0.4 s)", Ns[k], sec);
        cpc_status_free(st);
        cpc_program_free(p);
    }
}
