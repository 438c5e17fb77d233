/* schedule_bwd.c - the backward op program of a training plan; see
 * schedule_bwd.h for the program and docs/BACKWARD.md for the design. */
#include "schedule_bwd.h"

#include <stdlib.h>
#include <string.h>

typedef struct bb {
    cpc_program *prog;
    cpc_status *err;
} bb;

static int buf(bb *b, const char *name, cpc_buf_role role, cpc_buf_tokens tokens, cpc_buf_io io)
{
    if (b->err)
        return -1;
    int i = cpc_program_add_buffer(b->prog, name, role, tokens, CPC_HEADS_ALL, io);
    if (i < 0)
        b->err = &cpc_status_oom;
    return i;
}

static cpc_op *add(bb *b, cpc_op **ops, int *n, cpc_op_kind kind, const char *when)
{
    if (b->err)
        return NULL;
    cpc_op *op = cpc_ops_append(ops, n, kind);
    if (!op) {
        b->err = &cpc_status_oom;
        return NULL;
    }
    if (when) {
        cpc_status *st = cpc_expr_parse(when, CPC_NO_SPAN, &op->when);
        if (st) {
            b->err = st;
            return NULL;
        }
    }
    return op;
}

static void setx(bb *b, cpc_expr **slot, const char *text)
{
    if (b->err)
        return;
    cpc_status *st = cpc_expr_parse(text, CPC_NO_SPAN, slot);
    if (st) {
        cpc_status_prefix(st, "backward schedule (internal)");
        b->err = st;
    }
}

static void bufs(cpc_op *op, bool in, int n, const int *v)
{
    if (!op)
        return;
    for (int i = 0; i < n; i++)
        (in ? op->in : op->out)[i] = v[i];
    if (in)
        op->n_in = n;
    else
        op->n_out = n;
}

static void p2p(bb *b, cpc_op **ops, int *n, bool send, int tag, const char *when, int x, int y,
                const char *block)
{
    cpc_op *op = add(b, ops, n, send ? CPC_OP_SEND : CPC_OP_RECV, when);
    if (!op)
        return;
    op->group = CPC_GROUP_RING;
    op->tag = tag;
    setx(b, &op->peer, send ? "(r+1)%R" : "(r-1)%R");
    int v[2] = {x, y};
    bufs(op, send, 2, v);
    if (block)
        setx(b, &op->block, block);
}

cpc_status *cpc_backward_supported(const cpc_plan *plan, cpc_variant variant, int R, int U)
{
    const char *why = NULL;
    if (variant != CPC_VARIANT_NONE && variant != CPC_VARIANT_RING)
        why = "this variant has no backward program yet";
    else if (U != 1)
        why = "ulysses_degree > 1 has no backward program yet";
    else if (plan->input.has_kv)
        why = "cross-attention (input.kv) has no backward program yet";
    if (!why)
        return NULL;
    cpc_status *st = cpc_diag(CPC_E_PLAN, CPC_RULE_TRAIN, CPC_SEV_ERROR,
                              cpc_plan_span(plan, "input.mode", true),
                              "training: %s (%s, %d x %d): the backward pass runs for variants none and ring "
                              "(ulysses_degree 1, self-attention; causal zigzag, GQA, key padding, fp32/bf16/fp16)",
                              why, cpc_variant_name(variant), R, U);
    cpc_status_set_hint(st, "use variant ring or none to train, or input.mode: inference for the forward pass");
    return st;
}

cpc_status *cpc_schedule_build_backward(const cpc_plan *plan, cpc_variant variant, int R, int U,
                                        cpc_program **out)
{
    *out = NULL;
    if (!plan)
        return cpc_error(CPC_E_INTERNAL, "backward schedule: no plan");
    cpc_status *st = cpc_backward_supported(plan, variant, R, U);
    if (st)
        return st;
    if ((int64_t)R * U != plan->cluster.world_size || (variant == CPC_VARIANT_NONE && R != 1))
        return cpc_error(CPC_E_INTERNAL, "backward schedule: %s %dx%d does not match world_size %d",
                         cpc_variant_name(variant), R, U, plan->cluster.world_size);
    cpc_layout L;
    if ((st = cpc_layout_init(&L, plan, variant, R, U)))
        return st;
    bb bd = {.prog = cpc_program_new(&L, false, CPC_ROTATE_P2P)};
    bb *b = &bd;
    if (!b->prog)
        return &cpc_status_oom;
    cpc_program *P = b->prog;

    int q = buf(b, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_IO_INPUT);
    int dout = buf(b, "dout", CPC_ROLE_DO, CPC_TOK_SHARD, CPC_IO_INPUT);
    int o = buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_IO_INPUT);
    int lse = buf(b, "lse", CPC_ROLE_LSE, CPC_TOK_SHARD, CPC_IO_INPUT);
    int k_cur = buf(b, "k_cur", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_IO_INPUT);
    int v_cur = buf(b, "v_cur", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_IO_INPUT);
    int k_nxt = buf(b, "k_nxt", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_IO_NONE);
    int v_nxt = buf(b, "v_nxt", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_IO_NONE);
    int delta = buf(b, "delta", CPC_ROLE_LSE, CPC_TOK_SHARD, CPC_IO_NONE);
    int dq = buf(b, "dq", CPC_ROLE_DQ, CPC_TOK_SHARD, CPC_IO_OUTPUT);
    int dk_cur = buf(b, "dk_cur", CPC_ROLE_DK, CPC_TOK_BLOCK, CPC_IO_OUTPUT);
    int dv_cur = buf(b, "dv_cur", CPC_ROLE_DV, CPC_TOK_BLOCK, CPC_IO_OUTPUT);
    int dk_nxt = buf(b, "dk_nxt", CPC_ROLE_DK, CPC_TOK_BLOCK, CPC_IO_NONE);
    int dv_nxt = buf(b, "dv_nxt", CPC_ROLE_DV, CPC_TOK_BLOCK, CPC_IO_NONE);

    cpc_op *op = add(b, &P->ops, &P->n_ops, CPC_OP_DELTA, NULL);
    int dv_in[2] = {dout, o};
    bufs(op, true, 2, dv_in);
    bufs(op, false, 1, &delta);
    op = add(b, &P->ops, &P->n_ops, CPC_OP_INIT_ACC, NULL);
    bufs(op, false, 1, &dq);
    op = add(b, &P->ops, &P->n_ops, CPC_OP_INIT_ACC, NULL);
    int dkv[2] = {dk_cur, dv_cur};
    bufs(op, false, 2, dkv);
    cpc_op *loop = add(b, &P->ops, &P->n_ops, CPC_OP_LOOP, NULL);
    if (loop) {
        setx(b, &loop->count, "R");
        cpc_op **bo = &loop->body;
        int *bn = &loop->n_body;
        const char *more = "s<R-1", *ring = "R>1";
        p2p(b, bo, bn, true, 0, more, k_cur, v_cur, NULL);
        p2p(b, bo, bn, false, 0, more, k_nxt, v_nxt, "(r-s-1)%R");
        op = add(b, bo, bn, CPC_OP_ATTN_BWD, NULL);
        int ai[6] = {q, k_cur, v_cur, dout, lse, delta}, ao[3] = {dq, dk_cur, dv_cur};
        bufs(op, true, 6, ai);
        bufs(op, false, 3, ao);
        p2p(b, bo, bn, true, 1, ring, dk_cur, dv_cur, NULL);
        p2p(b, bo, bn, false, 1, ring, dk_nxt, dv_nxt, "(r-s-1)%R");
        if ((op = add(b, bo, bn, CPC_OP_WAIT, more)))
            op->tag = 0;
        if ((op = add(b, bo, bn, CPC_OP_WAIT, ring)))
            op->tag = 1;
        int sw[4][2] = {{k_cur, k_nxt}, {v_cur, v_nxt}, {dk_cur, dk_nxt}, {dv_cur, dv_nxt}};
        for (int i = 0; i < 4; i++) {
            op = add(b, bo, bn, CPC_OP_SWAP, i < 2 ? more : ring);
            bufs(op, true, 2, sw[i]);
        }
    }
    if (b->err) {
        cpc_program_free(P);
        return b->err;
    }
    *out = P;
    return NULL;
}
