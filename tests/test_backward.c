/* test_backward.c - the backward op program (schedule_bwd.h) and its prover
 * (verify_bwd.h): the built programs prove for R = 1..8, causal and not;
 * broken programs are CP051 with the reason (diffusers #14265: a ring
 * backward that keeps step 0's K/V; a dK/dV accumulator that never travels;
 * a wrong `block` on the accumulator's recv; no delta); variants without a
 * backward are CP060; the forward verifier refuses backward ops. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "plan_load.h"
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

static cpc_program *build(cpc_plan *p, cpc_variant v, int R)
{
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
    expect_cp051(prog, "declares block");
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

Test(backward, variants_without_backward_are_cp060)
{
    cpc_plan *p = plan_of("ulysses", 2, "none", 128);
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build_backward(p, CPC_VARIANT_ULYSSES, 1, 2, &prog);
    cr_assert(st && st->rule == CPC_RULE_TRAIN && strstr(st->message, "variants none and ring"), "%s",
              st ? st->message : "accepted");
    cr_assert_null(prog);
    cpc_status_free(st);
    cpc_plan_free(p);
}
