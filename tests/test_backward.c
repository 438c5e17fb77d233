/* test_backward.c - the backward op program (schedule_bwd.h) and its prover
 * (verify_bwd.h): the built programs prove for R = 1..8, causal and not;
 * broken programs are CP051 with the reason (diffusers #14265: a ring
 * backward that keeps step 0's K/V; a dK/dV accumulator that never travels;
 * a wrong `block` on the accumulator's recv; no delta); ulysses, unified and
 * the anything variants (head parts, shared K/V heads) prove, and planted
 * faults in them (a missing reduce, a dropped or reversed inverse
 * all-to-all, a dropped head part, a deadlocked all-to-all, K/V reuse) are
 * CP051; yunchang #149; cross-attention is CP018; the forward verifier
 * refuses backward ops. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cost.h"
#include "executor.h"
#include "plan_load.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "verify.h"
#include "verify_bwd.h"

static cpc_plan *plan_of(const char *variant, int world, const char *mask, int tokens)
{
    char text[512];
    snprintf(text, sizeof text,
             "version: 1\nname: t\nmodel: {heads: 4, kv_heads: 2, head_dim: 16, dtype: fp32}\n"
             "input: {batch: 1, tokens: %d, mask: %s, mode: training}\n"
             "cluster: {world_size: %d, device: cpu}\nparallel: {variant: %s}\n",
             tokens, mask, world, variant);
    cpc_plan *p = NULL;
    cpc_status *st = cpc_plan_load_string(text, strlen(text), "t.yaml", NULL, 0, &p);
    cr_assert(p != NULL, "plan: %s", st ? st->message : "?");
    cpc_status_free(st);
    return p;
}

/* The non-lagged P2P ring (schedule.overlap false: the ops[3] loop below). */
static cpc_program *build(cpc_plan *p, cpc_variant v, int R)
{
    p->schedule.overlap = false;
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build_backward(p, v, R, 1, &prog);
    cr_assert(st == NULL, "build: %s", st ? st->message : "");
    return prog;
}

/* Disables body op i of the ring loop (ops[3]). */
static void disable(cpc_program *prog, int i)
{
    cpc_op *loop = &prog->ops[3];
    cr_assert_eq(loop->kind, CPC_OP_LOOP);
    cpc_op *op = &loop->body[i];
    cpc_expr_free(op->when);
    op->when = NULL;
    cr_assert(cpc_expr_parse("0", CPC_NO_SPAN, &op->when) == NULL);
}

/* Both domains of the prover (verify_bwd.h): the symmetric one (when the
 * program is in its class) and the enumeration of every rank must agree:
 * a program is proven by both or refused by both. */
static cpc_status *prove_both(const cpc_program *prog)
{
    cpc_verify_bwd_stats sa, se;
    cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
    cpc_status *st = cpc_verify_backward_ex(prog, NULL, &sa);
    cpc_status *se_st = cpc_verify_backward_ex(prog, &eo, &se);
    cr_assert_eq(st == NULL, se_st == NULL, "the domains disagree: %s (mode %d) / enumeration: %s",
                 st ? st->message : "proven", (int)sa.mode, se_st ? se_st->message : "proven");
    cpc_status_free(se_st);
    return st;
}
#define cpc_verify_backward(p) prove_both(p)

static void expect_cp051(const cpc_program *prog, const char *needle)
{
    cpc_status *st = cpc_verify_backward(prog);
    cr_assert(st != NULL, "expected a CP051 (%s)", needle);
    cr_assert_eq(st->rule, CPC_RULE_VERIFY, "rule %d: %s", st->rule, st->message);
    cr_assert(strstr(st->message, needle), "'%s' not in: %s", needle, st->message);
    cpc_status_free(st);
}

Test(backward, programs_prove)
{
    const char *masks[] = {"none", "causal", "key_padding"};
    int Rs[] = {1, 2, 3, 4, 8};
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < 5; i++) {
            int R = Rs[i];
            cpc_plan *p = plan_of(R == 1 ? "none" : "ring", R, masks[m], 96 * R);
            cpc_program *prog = build(p, R == 1 ? CPC_VARIANT_NONE : CPC_VARIANT_RING, R);
            cpc_status *st = cpc_verify_backward(prog);
            cr_assert(st == NULL, "R=%d %s: %s", R, masks[m], st ? st->message : "");
            cpc_program_free(prog);
            cpc_plan_free(p);
        }
}

/* diffusers #14265: K/V never rotate (the swaps are gone): every step reads
 * step 0's block while the accumulators rotate. */
Test(backward, diffusers_14265_step0_kv_reuse)
{
    cpc_plan *p = plan_of("ring", 4, "causal", 256);
    cpc_program *prog = build(p, CPC_VARIANT_RING, 4);
    int k0 = cpc_program_add_buffer(prog, "k0", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    int v0 = cpc_program_add_buffer(prog, "v0", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    cr_assert(k0 >= 0 && v0 >= 0);
    cpc_op *ab = &prog->ops[3].body[2];
    cr_assert_eq(ab->kind, CPC_OP_ATTN_BWD);
    ab->in[1] = k0; /* the rotation still runs; attn_bwd keeps reading block r */
    ab->in[2] = v0;
    expect_cp051(prog, "#14265");
    cpc_program_free(prog);
    cpc_plan_free(p);
}

Test(backward, accumulators_must_travel_home)
{
    cpc_plan *p = plan_of("ring", 4, "none", 256);
    cpc_program *prog = build(p, CPC_VARIANT_RING, 4);
    disable(prog, 9);  /* swap dk_cur,dk_nxt */
    disable(prog, 10); /* swap dv */
    expect_cp051(prog, "backward program");
    cpc_program_free(prog);
    prog = build(p, CPC_VARIANT_RING, 4);
    cpc_op *recv = &prog->ops[3].body[4];
    cr_assert_eq(recv->kind, CPC_OP_RECV);
    cpc_expr_free(recv->block);
    cr_assert(cpc_expr_parse("(r-s)%R", CPC_NO_SPAN, &recv->block) == NULL);
    expect_cp051(prog, "declares that block");
    cpc_program_free(prog);
    cpc_plan_free(p);
}

Test(backward, delta_before_attn_bwd)
{
    cpc_plan *p = plan_of("ring", 2, "none", 128);
    cpc_program *prog = build(p, CPC_VARIANT_RING, 2);
    cr_assert_eq(prog->ops[0].kind, CPC_OP_DELTA);
    cr_assert(cpc_expr_parse("0", CPC_NO_SPAN, &prog->ops[0].when) == NULL);
    expect_cp051(prog, "delta");
    cpc_program_free(prog);
    cpc_plan_free(p);
}

Test(backward, forward_verifier_refuses_backward_ops)
{
    cpc_plan *p = plan_of("ring", 2, "none", 128);
    cpc_program *prog = build(p, CPC_VARIANT_RING, 2);
    cpc_status *st = cpc_verify(prog);
    cr_assert(st && st->rule == CPC_RULE_VERIFY && strstr(st->message, "backward (training) op"),
              "%s", st ? st->message : "accepted");
    cpc_status_free(st);
    cpc_program_free(prog);
    cpc_plan_free(p);
}

/* A plan text with everything a test varies. */
static cpc_plan *plan_full(const char *variant, int world, const char *mask, int tokens, int H, int Hkv,
                           const char *extra_par, const char *extra_input)
{
    char text[768];
    snprintf(text, sizeof text,
             "version: 1\nname: t\nmodel: {heads: %d, kv_heads: %d, head_dim: 16, dtype: fp32}\n"
             "input: {batch: 1, tokens: %d, mask: %s, mode: training%s}\n"
             "cluster: {world_size: %d, device: cpu}\nparallel: {variant: %s%s}\n",
             H, Hkv, tokens, mask, extra_input, world, variant, extra_par);
    cpc_plan *p = NULL;
    cpc_status *st = cpc_plan_load_string(text, strlen(text), "t.yaml", NULL, 0, &p);
    cr_assert(p != NULL, "plan: %s", st ? st->message : "?");
    cpc_status_free(st);
    return p;
}

static cpc_program *build_ru(cpc_plan *p, cpc_variant v, int R, int U)
{
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build_backward(p, v, R, U, &prog);
    cr_assert(st == NULL, "build %s %dx%d: %s", cpc_variant_name(v), R, U, st ? st->message : "");
    return prog;
}

/* Ulysses, unified and both anything variants: the programs prove, with K/V
 * heads split (Hkv % U == 0), replicated (U > Hkv, MQA) and straddling
 * members (uneven heads of ulysses_anything), even and uneven tokens. */
Test(backward, head_part_programs_prove)
{
    struct {
        const char *v;
        cpc_variant var;
        int P, R, U, H, Hkv, tokens;
        const char *mask;
        bool shared; /* K/V heads shared: the dK/dV all-to-alls reduce */
    } rows[] = {
        {"ulysses", CPC_VARIANT_ULYSSES, 2, 1, 2, 4, 2, 128, "causal", false},
        {"ulysses", CPC_VARIANT_ULYSSES, 4, 1, 4, 4, 2, 128, "none", true},
        {"ulysses", CPC_VARIANT_ULYSSES, 4, 1, 4, 8, 1, 128, "key_padding", true},
        {"ulysses", CPC_VARIANT_ULYSSES, 8, 1, 8, 8, 8, 256, "causal", false},
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 4, 1, 4, 6, 2, 250, "none", true},
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 3, 1, 3, 7, 7, 100, "causal", false},
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 4, 1, 4, 6, 3, 250, "none", true},
        {"unified", CPC_VARIANT_UNIFIED, 4, 2, 2, 4, 2, 128, "causal", false},
        {"unified", CPC_VARIANT_UNIFIED, 8, 2, 4, 4, 1, 256, "none", true},
        {"unified", CPC_VARIANT_UNIFIED, 8, 4, 2, 4, 2, 256, "causal", false},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 3, 3, 1, 4, 2, 250, "none", false},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 4, 4, 1, 4, 1, 255, "key_padding", false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char par[96] = "";
        if (rows[i].var == CPC_VARIANT_UNIFIED)
            snprintf(par, sizeof par, ", ring_degree: %d, ulysses_degree: %d", rows[i].R, rows[i].U);
        cpc_plan *p = plan_full(rows[i].v, rows[i].P, rows[i].mask, rows[i].tokens, rows[i].H, rows[i].Hkv, par, "");
        cpc_program *prog = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
        cr_expect_eq(cpc_backward_kv_heads_shared(&prog->layout), rows[i].shared, "row %zu", i);
        cpc_status *st = cpc_verify_backward(prog);
        cr_expect(st == NULL, "row %zu %s %dx%d H %d/%d: %s", i, rows[i].v, rows[i].R, rows[i].U, rows[i].H,
                  rows[i].Hkv, st ? st->message : "");
        cpc_status_free(st);
        cpc_program_free(prog);
        cpc_plan_free(p);
    }
}

/* The last top-level op of `kind` with output role `role` (or any role when
 * role < 0). */
static cpc_op *find_top(cpc_program *prog, cpc_op_kind kind, int role)
{
    cpc_op *found = NULL;
    for (int i = 0; i < prog->n_ops; i++) {
        cpc_op *op = &prog->ops[i];
        if (op->kind == kind && (role < 0 || (op->n_out > 0 && (int)prog->buffers[op->out[0]].role == role)))
            found = op;
    }
    cr_assert_not_null(found, "no %s op", cpc_op_kind_name(kind));
    return found;
}

static void never(cpc_op *op)
{
    cpc_expr_free(op->when);
    op->when = NULL;
    cr_assert(cpc_expr_parse("0", CPC_NO_SPAN, &op->when) == NULL);
}

/* Planted faults in Ulysses/unified programs, each a CP051 with its reason. */
Test(backward, head_part_faults_are_cp051)
{
    /* 1. a missing reduce: K/V heads replicated (U 4 > Hkv 2) */
    cpc_plan *p = plan_full("ulysses", 4, "none", 128, 4, 2, "", "");
    cpc_program *prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 4);
    cpc_op *a = find_top(prog, CPC_OP_ALL_TO_ALL, CPC_ROLE_DK);
    cr_assert(a->reduce);
    a->reduce = false;
    expect_cp051(prog, "reduce=sum");
    cpc_program_free(prog);
    cpc_plan_free(p);

    /* the same with the uneven heads of ulysses_anything (6 heads, 2 K/V heads over 4) */
    p = plan_full("ulysses_anything", 4, "none", 250, 6, 2, "", "");
    prog = build_ru(p, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
    a = find_top(prog, CPC_OP_ALL_TO_ALL, CPC_ROLE_DV);
    cr_assert(a->reduce);
    a->reduce = false;
    expect_cp051(prog, "must be summed");
    cpc_program_free(prog);
    cpc_plan_free(p);

    /* 2. the inverse all-to-all of dq dropped: dq never leaves the head part */
    p = plan_full("ulysses", 2, "causal", 128, 4, 2, "", "");
    prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 2);
    never(find_top(prog, CPC_OP_ALL_TO_ALL, CPC_ROLE_DQ));
    expect_cp051(prog, "the OUTPUT buffer dq is never written");
    cpc_program_free(prog);

    /* 3. the inverse all-to-all in the wrong direction */
    prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 2);
    find_top(prog, CPC_OP_ALL_TO_ALL, CPC_ROLE_DK)->dir = CPC_A2A_SEQ_TO_HEADS;
    expect_cp051(prog, "seq_to_heads");
    cpc_program_free(prog);

    /* 4. a dropped head part: one member never runs attn_bwd (its query heads
     * reach neither dq nor dk/dv) */
    prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 2);
    cpc_op *ab = find_top(prog, CPC_OP_ATTN_BWD, -1);
    cr_assert(cpc_expr_parse("u!=1", CPC_NO_SPAN, &ab->when) == NULL);
    expect_cp051(prog, "contribute 0 times");
    cpc_program_free(prog);

    /* 5. only one member reaches an all_to_all: a deadlock, reported */
    prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 2);
    a = find_top(prog, CPC_OP_ALL_TO_ALL, CPC_ROLE_DV);
    cr_assert(cpc_expr_parse("u==0", CPC_NO_SPAN, &a->when) == NULL);
    expect_cp051(prog, "never reaches");
    cpc_program_free(prog);

    /* 6. delta from the all-to-all'd dout (head part) against the shard's
     * out: another layout */
    prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 2);
    cpc_op *d = find_top(prog, CPC_OP_DELTA, -1);
    d->in[0] = cpc_program_find_buffer(prog, "do_seq");
    expect_cp051(prog, "before it is written"); /* do_seq is made after the delta */
    cpc_program_free(prog);
    /* ... and delta never moved to the head part: read before written */
    prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 2);
    for (int i = 0; i < prog->n_ops; i++)
        if (prog->ops[i].kind == CPC_OP_ALL_TO_ALL && prog->buffers[prog->ops[i].in[0]].role == CPC_ROLE_LSE)
            never(&prog->ops[i]);
    expect_cp051(prog, "no delta op computed it");
    cpc_program_free(prog);
    cpc_plan_free(p);

    /* 7. unified: the ring part's K/V reuse (diffusers #14265) with head parts */
    p = plan_full("unified", 4, "causal", 128, 4, 2, ", ring_degree: 2, ulysses_degree: 2", "");
    prog = build_ru(p, CPC_VARIANT_UNIFIED, 2, 2);
    cpc_op *loop = find_top(prog, CPC_OP_LOOP, -1);
    for (int i = 0; i < loop->n_body; i++)
        if (loop->body[i].kind == CPC_OP_SWAP &&
            prog->buffers[loop->body[i].in[0]].role == CPC_ROLE_K)
            never(&loop->body[i]);
    expect_cp051(prog, "#14265");
    cpc_program_free(prog);
    cpc_plan_free(p);
}

/* yunchang #149 (a wrong number of gradients): a second dk OUTPUT, or none. */
Test(backward, yunchang_149_gradient_count)
{
    cpc_plan *p = plan_full("ulysses", 2, "none", 128, 4, 2, "", "");
    cpc_program *prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 2);
    int extra = cpc_program_add_buffer(prog, "dk2", CPC_ROLE_DK, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
    cr_assert(extra >= 0);
    expect_cp051(prog, "yunchang #149");
    cpc_program_free(prog);
    prog = build_ru(p, CPC_VARIANT_ULYSSES, 1, 2);
    prog->buffers[cpc_program_find_buffer(prog, "dv")].io = CPC_IO_NONE;
    expect_cp051(prog, "yunchang #149");
    cpc_program_free(prog);
    cpc_plan_free(p);
}

/* BACKWARD.md 3.7: cross-attention (K/V whole on every rank) proves for
 * every variant (one local block per rank, dK/dV summed over the world by
 * all_reduce; with ulysses, the head part widened to every head first); a
 * missing all_reduce or a head part never widened is CP051. */
Test(backward, cross_attention_programs_prove_and_faults)
{
    struct {
        const char *v;
        cpc_variant var;
        int P, R, U, H, Hkv;
        const char *par;
    } rows[] = {
        {"none", CPC_VARIANT_NONE, 1, 1, 1, 4, 2, ""},
        {"ring", CPC_VARIANT_RING, 4, 4, 1, 4, 2, ""},
        {"ulysses", CPC_VARIANT_ULYSSES, 4, 1, 4, 4, 2, ""},
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 4, 1, 4, 6, 2, ""},
        {"unified", CPC_VARIANT_UNIFIED, 4, 2, 2, 4, 1, ", ring_degree: 2, ulysses_degree: 2"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        cpc_plan *p = plan_full(rows[i].v, rows[i].P, "none", 128, rows[i].H, rows[i].Hkv, rows[i].par,
                                ", kv: {tokens: 40}");
        cpc_program *prog = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
        find_top(prog, CPC_OP_ALL_REDUCE, CPC_ROLE_DK);
        cpc_status *st = cpc_verify_backward(prog);
        cr_expect(st == NULL, "row %zu %s: %s", i, rows[i].v, st ? st->message : "");
        cpc_status_free(st);
        cpc_program_free(prog);
        if (rows[i].P > 1) {
            /* each rank keeps its own rows' part: the other ranks' pairs are missing */
            prog = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
            cpc_op *ar = find_top(prog, CPC_OP_ALL_REDUCE, CPC_ROLE_DK);
            ar->kind = CPC_OP_COPY;
            ar->group = CPC_GROUP_NONE;
            expect_cp051(prog, "contribute 0 times");
            cpc_program_free(prog);
        }
        if (rows[i].U > 1) {
            /* the head part widened into the wrong buffer role: refused */
            prog = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
            cpc_op *cp = find_top(prog, CPC_OP_COPY, CPC_ROLE_DV);
            cp->in[0] = cpc_program_find_buffer(prog, "v_part");
            expect_cp051(prog, "cannot hold");
            cpc_program_free(prog);
        }
        cpc_plan_free(p);
    }
}

/* What still cannot train: a Lua schedule script (it replaces the forward
 * and returns no backward program): CP018 naming what trains. */
Test(backward, lua_script_is_cp060)
{
    cpc_plan *p = plan_full("ring", 2, "none", 128, 4, 2, "", "");
    p->schedule.script = strdup("ring.lua");
    cr_assert_not_null(p->schedule.script);
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build_backward(p, CPC_VARIANT_RING, 2, 1, &prog);
    cr_assert(st && st->rule == CPC_RULE_TRAIN && strstr(st->message, "Lua schedule script") &&
                  strstr(st->message, "ulysses_anything"),
              "%s", st ? st->message : "accepted");
    cr_assert_null(prog);
    cpc_status_free(st);
    cpc_plan_free(p);
}

/* BACKWARD.md 3.2: the all-gather ring backward (dK/dV accumulated in the
 * gathered layout, then reduce-scattered) proves for ring, ring_anything
 * and unified; a block expression that reads one block at every step, or a
 * dropped reduce_scatter, is CP051. */
Test(backward, allgather_programs_prove_and_faults)
{
    const char *ag = "\nschedule: {rotate: allgather}";
    struct {
        const char *v;
        cpc_variant var;
        int P, R, U, H, Hkv, tokens;
        const char *par;
    } rows[] = {
        {"ring", CPC_VARIANT_RING, 2, 2, 1, 4, 2, 128, ""},
        {"ring", CPC_VARIANT_RING, 4, 4, 1, 4, 1, 256, ""},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 3, 3, 1, 4, 2, 250, ""},
        {"unified", CPC_VARIANT_UNIFIED, 4, 2, 2, 4, 2, 128, ", ring_degree: 2, ulysses_degree: 2"},
        {"unified", CPC_VARIANT_UNIFIED, 8, 2, 4, 4, 1, 256, ", ring_degree: 2, ulysses_degree: 4"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "version: 1\nname: t\nmodel: {heads: %d, kv_heads: %d, head_dim: 16, dtype: fp32}\n"
                 "input: {batch: 1, tokens: %d, mask: none, mode: training}\n"
                 "cluster: {world_size: %d, device: cpu}\nparallel: {variant: %s%s}%s\n",
                 rows[i].H, rows[i].Hkv, rows[i].tokens, rows[i].P, rows[i].v, rows[i].par, ag);
        cpc_plan *p = NULL;
        cpc_status *st = cpc_plan_load_string(text, strlen(text), "t.yaml", NULL, 0, &p);
        cr_assert(p != NULL, "plan: %s", st ? st->message : "?");
        cpc_status_free(st);
        cpc_program *prog = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
        cr_assert_eq(prog->rotate, CPC_ROTATE_ALLGATHER);
        find_top(prog, CPC_OP_REDUCE_SCATTER, CPC_ROLE_DK);
        st = cpc_verify_backward(prog);
        cr_expect(st == NULL, "row %zu: %s", i, st ? st->message : "");
        cpc_status_free(st);
        cpc_program_free(prog);
        if (i == 1 || i == 3) {
            /* every step reads the rank's own block */
            prog = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
            cpc_op *loop = find_top(prog, CPC_OP_LOOP, -1);
            cpc_expr_free(loop->body[0].block);
            cr_assert(cpc_expr_parse("r", CPC_NO_SPAN, &loop->body[0].block) == NULL);
            expect_cp051(prog, "contribute");
            cpc_program_free(prog);
            /* dV never reduce-scattered */
            prog = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
            never(find_top(prog, CPC_OP_REDUCE_SCATTER, CPC_ROLE_DV));
            expect_cp051(prog, "backward program");
            cpc_program_free(prog);
        }
        cpc_plan_free(p);
    }
}

/* The cost model prices backward programs: bytes per rank as the program's
 * own count (and, for the ring, the closed form cprun measures), backward
 * FLOPs 2.5 x the forward's, more time than the forward. */
Test(backward, cost_prices_backward_programs)
{
    struct {
        const char *v;
        cpc_variant var;
        int P, R, U, H, Hkv;
        const char *mask, *dtype, *extra;
    } rows[] = {
        {"ring", CPC_VARIANT_RING, 4, 4, 1, 4, 2, "causal", "bf16", ""},
        {"ring", CPC_VARIANT_RING, 4, 4, 1, 4, 2, "none", "fp32", "\nschedule: {rotate: allgather}"},
        {"ulysses", CPC_VARIANT_ULYSSES, 4, 1, 4, 4, 2, "none", "bf16", ""},
        {"ulysses", CPC_VARIANT_ULYSSES, 2, 1, 2, 8, 8, "causal", "fp32", ""},
        {"unified", CPC_VARIANT_UNIFIED, 4, 2, 2, 4, 1, "causal", "bf16", ""},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "version: 1\nname: t\nmodel: {heads: %d, kv_heads: %d, head_dim: 32, dtype: %s}\n"
                 "input: {batch: 2, tokens: 256, mask: %s, mode: training}\n"
                 "cluster: {world_size: %d, device: h100-sxm}\nparallel: {variant: %s%s}%s\n",
                 rows[i].H, rows[i].Hkv, rows[i].dtype, rows[i].mask, rows[i].P, rows[i].v,
                 rows[i].var == CPC_VARIANT_UNIFIED ? ", ring_degree: 2, ulysses_degree: 2" : "", rows[i].extra);
        cpc_plan *p = NULL;
        cpc_status *st = cpc_plan_load_string(text, strlen(text), "t.yaml", NULL, 0, &p);
        cr_assert(p != NULL, "plan: %s", st ? st->message : "?");
        cpc_status_free(st);
        cpc_device_profile dev;
        cr_assert_null(cpc_plan_device(p, &dev));
        cpc_program *fwd = NULL, *bwd = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
        cr_assert_null(cpc_schedule_build(p, rows[i].var, rows[i].R, rows[i].U, &fwd));
        cpc_prediction pf, pb;
        st = cpc_price_program(p, fwd, &dev, &pf);
        cr_assert_null(st, "%s", st ? st->message : "");
        st = cpc_price_program(p, bwd, &dev, &pb);
        cr_assert_null(st, "%s", st ? st->message : "");
        int64_t most = 0;
        for (int r = 0; r < rows[i].P; r++) {
            int64_t sent = 0;
            cr_assert_null(cpc_program_bytes_sent(bwd, r, &sent, NULL));
            if (sent > most)
                most = sent;
        }
        cr_expect_eq(pb.bytes_sent_per_rank, most, "row %zu: priced %lld bytes, the program sends %lld", i,
                     (long long)pb.bytes_sent_per_rank, (long long)most);
        if (i == 0) {
            /* K/V 3 hops (bf16) + dK/dV 4 hops (fp32): B 2 x 64 tokens x Hkv 2 x D 32 per block */
            int64_t blk = 2 * 64 * 2 * 32;
            cr_expect_eq(pb.bytes_sent_per_rank, 3 * 2 * blk * 2 + 4 * 2 * blk * 4);
        }
        if (i == 1) {
            /* all-gather 3 blocks of K, V (fp32) + reduce-scatter 3 slices of dK, dV (fp32) */
            int64_t blk = 2 * 64 * 2 * 32 * 4;
            cr_expect_eq(pb.bytes_sent_per_rank, 3 * 2 * blk + 3 * 2 * blk);
        }
        double ratio = pb.flops_per_layer / pf.flops_per_layer;
        cr_expect(ratio > 2.5 * (1 - 1e-9) && ratio < 2.5 * (1 + 1e-9), "row %zu: backward/forward FLOPs %g", i,
                  ratio);
        cr_expect(pb.ms_per_layer > pf.ms_per_layer, "row %zu: backward %g ms, forward %g ms", i, pb.ms_per_layer,
                  pf.ms_per_layer);
        cpc_program_free(fwd);
        cpc_program_free(bwd);
        cpc_plan_free(p);
    }
}

/* A backend without add_strided (the CUDA backend today) cannot run a
 * program that sums gradients: the executor refuses it at creation, naming
 * the op, before any communication. */
Test(backward, executor_refuses_summing_ops_without_add_strided)
{
    cpc_backend *cpu = NULL;
    cr_assert_null(cpc_cpu_backend_create(&cpu));
    cpc_backend_vtable vt = *cpu->vt;
    vt.add_strided = NULL;
    cpc_backend fake = {&vt, cpu->ctx};
    struct {
        const char *v;
        cpc_variant var;
        int P, R, U;
        const char *extra, *needle;
    } rows[] = {
        {"ulysses", CPC_VARIANT_ULYSSES, 4, 1, 4, "", "all_to_all reduce=sum"},
        {"ring", CPC_VARIANT_RING, 2, 2, 1, ", kv: {tokens: 40}", "all_reduce"},
    };
    for (size_t i = 0; i < 2; i++) {
        cpc_plan *p = plan_full(rows[i].v, rows[i].P, "none", 128, 4, 2, "", rows[i].extra);
        cpc_program *prog = build_ru(p, rows[i].var, rows[i].R, rows[i].U);
        cpc_exec_config cfg = {.prog = prog, .rank = 0, .backend = &fake};
        cpc_exec *ex = NULL;
        cpc_status *st = cpc_exec_create(&cfg, &ex);
        cr_assert(st && st->code == CPC_E_UNSUPPORTED && strstr(st->message, rows[i].needle) &&
                      strstr(st->message, "add_strided"),
                  "%s", st ? st->message : "accepted");
        cr_assert_null(ex);
        cpc_status_free(st);
        /* the real CPU backend has it */
        cfg.backend = cpu;
        cr_assert_null(cpc_exec_create(&cfg, &ex));
        cpc_exec_destroy(ex);
        cpc_program_free(prog);
        cpc_plan_free(p);
    }
    cpc_backend_destroy(cpu);
}

/* The body op of the loop of `prog` of kind k whose first output (or input,
 * for sends) has role `role` (-1: any), the n-th such (0-based). */
static cpc_op *body_op(cpc_program *prog, cpc_op_kind k, int role, int nth)
{
    cpc_op *loop = find_top(prog, CPC_OP_LOOP, -1);
    for (int i = 0; i < loop->n_body; i++) {
        cpc_op *op = &loop->body[i];
        int b = op->n_out > 0 ? op->out[0] : op->n_in > 0 ? op->in[0] : -1;
        if (op->kind == k && (role < 0 || (b >= 0 && (int)prog->buffers[b].role == role)) && nth-- == 0)
            return op;
    }
    cr_assert_fail("no %s in the loop", cpc_op_kind_name(k));
    return NULL;
}

/* BACKWARD.md 3.1 lagged (overlap, the default): each step's dK/dV in a
 * fresh pair (init_acc block=(r-s)%R), the travelling accumulator added
 * after it arrived, sent on; the last hop brings each block home.  Proves
 * for R = 2..8, causal and not; planted faults are CP051. */
Test(backward, lagged_ring_proves_and_faults)
{
    int Rs[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++)
        for (int m = 0; m < 2; m++) {
            cpc_plan *p = plan_of("ring", Rs[i], m ? "causal" : "none", 96 * Rs[i]);
            cpc_program *prog = build_ru(p, CPC_VARIANT_RING, Rs[i], 1);
            find_top(prog, CPC_OP_LOOP, -1);
            body_op(prog, CPC_OP_ADD, CPC_ROLE_DK, 0);
            cpc_status *st = cpc_verify_backward(prog);
            cr_expect(st == NULL, "R=%d: %s", Rs[i], st ? st->message : "");
            cpc_status_free(st);
            cpc_program_free(prog);
            cpc_plan_free(p);
        }
    cpc_plan *p = plan_of("ring", 4, "causal", 256);
    /* the travelling accumulator never added: its contributions are lost */
    cpc_program *prog = build_ru(p, CPC_VARIANT_RING, 4, 1);
    never(body_op(prog, CPC_OP_ADD, CPC_ROLE_DV, 0));
    expect_cp051(prog, "contribute 0 times");
    cpc_program_free(prog);
    /* the fresh pair made for the wrong block: K/V and dK/dV disagree */
    prog = build_ru(p, CPC_VARIANT_RING, 4, 1);
    cpc_op *ia = body_op(prog, CPC_OP_INIT_ACC, CPC_ROLE_DK, 0);
    cpc_expr_free(ia->block);
    cr_assert(cpc_expr_parse("r", CPC_NO_SPAN, &ia->block) == NULL);
    expect_cp051(prog, "#14265");
    cpc_program_free(prog);
    /* diffusers #14265: attn_bwd keeps reading block r while the rotation runs */
    prog = build_ru(p, CPC_VARIANT_RING, 4, 1);
    int k0 = cpc_program_add_buffer(prog, "k0", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    int v0 = cpc_program_add_buffer(prog, "v0", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    cr_assert(k0 >= 0 && v0 >= 0);
    cpc_op *ab = body_op(prog, CPC_OP_ATTN_BWD, -1, 0);
    ab->in[1] = k0;
    ab->in[2] = v0;
    expect_cp051(prog, "#14265");
    cpc_program_free(prog);
    /* ... and K/V that never rotate: what is sent is not what is declared */
    prog = build_ru(p, CPC_VARIANT_RING, 4, 1);
    never(body_op(prog, CPC_OP_SWAP, CPC_ROLE_K, 0));
    never(body_op(prog, CPC_OP_SWAP, CPC_ROLE_V, 0));
    expect_cp051(prog, "block"); /* what is sent is not what is declared, or step 1 reads step 0's K/V */
    cpc_program_free(prog);
    /* the accumulator's recv declares the next block */
    prog = build_ru(p, CPC_VARIANT_RING, 4, 1);
    cpc_op *rv = body_op(prog, CPC_OP_RECV, CPC_ROLE_DK, 0);
    cpc_expr_free(rv->block);
    cr_assert(cpc_expr_parse("(r-s-1)%R", CPC_NO_SPAN, &rv->block) == NULL);
    expect_cp051(prog, "declares that block");
    cpc_program_free(prog);
    cpc_plan_free(p);
}

/* The cost model sees the lagged ring's overlap: the dK/dV transfer hides
 * behind the next step's attn_bwd, so the lagged program is priced faster
 * than the non-lagged one (same bytes). */
Test(backward, cost_lagged_ring_hides_the_accumulator_transfer)
{
    const char *text = "version: 1\nname: t\nmodel: {heads: 24, kv_heads: 24, head_dim: 128, dtype: bf16}\n"
                       "input: {batch: 1, tokens: 32768, mask: causal, mode: training}\n"
                       "cluster: {world_size: 8, device: h100-sxm}\nparallel: {variant: ring}\n";
    cpc_plan *p = NULL;
    cpc_status *st = cpc_plan_load_string(text, strlen(text), "t.yaml", NULL, 0, &p);
    cr_assert(p != NULL, "plan: %s", st ? st->message : "?");
    cpc_status_free(st);
    cpc_device_profile dev;
    cr_assert_null(cpc_plan_device(p, &dev));
    cpc_prediction pr[2];
    for (int i = 0; i < 2; i++) {
        p->schedule.overlap = i == 0;
        cpc_program *prog = build_ru(p, CPC_VARIANT_RING, 8, 1);
        cr_assert_null(cpc_verify_backward(prog));
        st = cpc_price_program(p, prog, &dev, &pr[i]);
        cr_assert_null(st, "%s", st ? st->message : "");
        cpc_program_free(prog);
    }
    cr_log_info("ring 8 backward, S 32768 causal bf16 on h100-sxm: lagged %.3f ms, non-lagged %.3f ms per layer",
                pr[0].ms_per_layer, pr[1].ms_per_layer);
    cr_expect_eq(pr[0].bytes_sent_per_rank, pr[1].bytes_sent_per_rank);
    cr_expect(pr[0].ms_per_layer < pr[1].ms_per_layer, "lagged %g ms, non-lagged %g ms", pr[0].ms_per_layer,
              pr[1].ms_per_layer);
    cpc_plan_free(p);
}
