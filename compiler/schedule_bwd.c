/* schedule_bwd.c - the backward op program of a training plan; see
 * schedule_bwd.h for the program and docs/BACKWARD.md for the design. */
#include "schedule_bwd.h"

#include <stdlib.h>
#include <string.h>

typedef struct bb {
    cpc_program *prog;
    cpc_status *err;
} bb;

static int buf(bb *b, const char *name, cpc_buf_role role, cpc_buf_tokens tokens, cpc_buf_heads heads,
               cpc_buf_io io)
{
    if (b->err)
        return -1;
    int i = cpc_program_add_buffer(b->prog, name, role, tokens, heads, io);
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

static void a2a(bb *b, cpc_op **ops, int *n, cpc_a2a_dir dir, int in, int out, bool reduce)
{
    cpc_op *op = add(b, ops, n, CPC_OP_ALL_TO_ALL, NULL);
    if (!op)
        return;
    op->group = CPC_GROUP_ULYSSES;
    op->dir = dir;
    op->reduce = reduce;
    bufs(op, true, 1, &in);
    bufs(op, false, 1, &out);
}

bool cpc_backward_kv_heads_shared(const cpc_layout *L)
{
    for (int u = 0; u + 1 < L->U; u++) {
        int o0, n0, o1, n1;
        cpc_layout_kv_heads(L, u, &o0, &n0);
        cpc_layout_kv_heads(L, u + 1, &o1, &n1);
        if (n0 > 0 && n1 > 0 && o1 < o0 + n0)
            return true;
    }
    return false;
}

cpc_status *cpc_backward_supported(const cpc_plan *plan, cpc_variant variant, int R, int U)
{
    const char *why = NULL, *key = "input.mode";
    if ((int)variant < 0 || variant >= CPC_VARIANT__COUNT || variant == CPC_VARIANT_AUTO)
        why = "the variant is not resolved";
    else if (plan->schedule.script) {
        /* the backward program is built from the layout, and takes the
         * forward's LSE in the built-in forward's layout: a script that
         * replaces the forward has no backward program to pair with it */
        why = "a Lua schedule script replaces the forward program, and scripts return no backward program yet";
        key = "schedule.script";
    }
    if (!why)
        return NULL;
    cpc_status *st = cpc_diag(CPC_E_PLAN, CPC_RULE_TRAIN, CPC_SEV_ERROR, cpc_plan_span(plan, key, true),
                              "training: %s (%s, %d x %d): the backward pass runs for the built-in schedules of "
                              "every variant (none, ring, ring_anything, ulysses, ulysses_anything, unified; "
                              "p2p and all-gather rotation; self- and cross-attention; causal zigzag, GQA, key "
                              "padding, uneven splits, fp32/bf16/fp16)",
                              why, cpc_variant_name(variant), R, U);
    if (strcmp(key, "input.segments") == 0)
        cpc_status_set_hint(st, "shard the segment (drop `split: replicate`) to train, or use input.mode: "
                                "inference for the forward pass");
    else
        cpc_status_set_hint(st, "drop schedule.script to train with the built-in schedule, or use input.mode: "
                                "inference for the forward pass");
    return st;
}

/* Replicated segments (layout.h "REPLICATED SEGMENTS"; SPEC section 10):
 * their rows are one logical tensor held whole by every rank.  Each (query,
 * key) pair meets the gradients exactly once in the world:
 *   (sharded q, replicated k): on every rank, its own query rows; the
 *     replicated K/V's part is summed over the world (all_reduce);
 *   (replicated q, sharded block k): on every rank with its OWN block only
 *     (the forward met every block on every ring rank), at the ring's first
 *     step (`when s==0`, into the accumulator of that block, which then
 *     travels home) or on the gathered K/V's block r; the replicated dQ is
 *     summed over the world;
 *   (replicated q, replicated k): on ring rank 0 only (`when r==0`: each
 *     ulysses member of it for its heads).
 * With ulysses each member works on its heads (PART copies); the parts go to
 * every head (zeros elsewhere) before the world sum, which thus also
 * gathers the heads. */
typedef struct repb {
    int q, k, v, dout, o, lse, delta; /* KV rows, the heads used here */
    int dq, dk, dv;                   /* KV accumulators (this rank's part) */
} repb;

static int rep_copy(bb *b, cpc_op **ops, int *n, int in, const char *name, cpc_buf_role role)
{
    int out = buf(b, name, role, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
    cpc_op *op = add(b, ops, n, CPC_OP_COPY, NULL);
    bufs(op, true, 1, &in);
    bufs(op, false, 1, &out);
    return out;
}

/* Inputs, delta and accumulators of the replicated rows, and the blocks of
 * the replicated keys: (sharded q = qa/da/lse/delta, replicated k) and
 * (replicated q, replicated k) on ring rank 0.  dq must be initialized
 * already. */
static void rep_pre(bb *b, cpc_op **ops, int *n, const cpc_layout *L, repb *x, int qa, int da, int lse,
                    int delta, int dq)
{
    const bool uly = L->U > 1;
    const cpc_buf_heads qh = uly ? CPC_HEADS_PART : CPC_HEADS_ALL;
    x->q = buf(b, "q_rep", CPC_ROLE_Q, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->k = buf(b, "k_rep", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->v = buf(b, "v_rep", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->dout = buf(b, "dout_rep", CPC_ROLE_DO, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->o = buf(b, "out_rep", CPC_ROLE_O, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->lse = buf(b, "lse_rep", CPC_ROLE_LSE, CPC_TOK_KV, qh, CPC_IO_INPUT);
    if (uly) {
        x->q = rep_copy(b, ops, n, x->q, "q_rep_part", CPC_ROLE_Q);
        x->k = rep_copy(b, ops, n, x->k, "k_rep_part", CPC_ROLE_K);
        x->v = rep_copy(b, ops, n, x->v, "v_rep_part", CPC_ROLE_V);
        x->dout = rep_copy(b, ops, n, x->dout, "dout_rep_part", CPC_ROLE_DO);
        x->o = rep_copy(b, ops, n, x->o, "out_rep_part", CPC_ROLE_O);
    }
    x->delta = buf(b, "delta_rep", CPC_ROLE_LSE, CPC_TOK_KV, qh, CPC_IO_NONE);
    x->dq = buf(b, "dq_rep_acc", CPC_ROLE_DQ, CPC_TOK_KV, qh, CPC_IO_NONE);
    x->dk = buf(b, "dk_rep_acc", CPC_ROLE_DK, CPC_TOK_KV, qh, CPC_IO_NONE);
    x->dv = buf(b, "dv_rep_acc", CPC_ROLE_DV, CPC_TOK_KV, qh, CPC_IO_NONE);
    cpc_op *op = add(b, ops, n, CPC_OP_DELTA, NULL);
    int dl[2] = {x->dout, x->o};
    bufs(op, true, 2, dl);
    bufs(op, false, 1, &x->delta);
    op = add(b, ops, n, CPC_OP_INIT_ACC, NULL);
    bufs(op, false, 1, &x->dq);
    op = add(b, ops, n, CPC_OP_INIT_ACC, NULL);
    int kv[2] = {x->dk, x->dv};
    bufs(op, false, 2, kv);
    /* (sharded q, replicated k) */
    op = add(b, ops, n, CPC_OP_ATTN_BWD, NULL);
    int a1[6] = {qa, x->k, x->v, da, lse, delta}, o1[3] = {dq, x->dk, x->dv};
    bufs(op, true, 6, a1);
    bufs(op, false, 3, o1);
    /* (replicated q, replicated k): once, on ring rank 0 */
    op = add(b, ops, n, CPC_OP_ATTN_BWD, "r==0");
    int a3[6] = {x->q, x->k, x->v, x->dout, x->lse, x->delta}, o3[3] = {x->dq, x->dk, x->dv};
    bufs(op, true, 6, a3);
    bufs(op, false, 3, o3);
}

/* (replicated q, the rank's own block of K/V k/v) into that block's dK/dV
 * accumulators dk/dv; `when` and `block` as the op takes them. */
static void rep_own(bb *b, cpc_op **ops, int *n, const repb *x, int k, int v, int dk, int dv, const char *when,
                    const char *block)
{
    if (x->q < 0)
        return;
    cpc_op *op = add(b, ops, n, CPC_OP_ATTN_BWD, when);
    int ai[6] = {x->q, k, v, x->dout, x->lse, x->delta}, ao[3] = {x->dq, dk, dv};
    bufs(op, true, 6, ai);
    bufs(op, false, 3, ao);
    if (op && block)
        setx(b, &op->block, block);
}

/* After the key blocks: the replicated rows' gradients are summed over the
 * world into the OUTPUT dq_rep/dk_rep/dv_rep (KV, every head). */
static void rep_post(bb *b, cpc_op **ops, int *n, const cpc_layout *L, const repb *x)
{
    const bool uly = L->U > 1;
    cpc_op *op;
    static const char *const fn[3] = {"dq_rep_full", "dk_rep_full", "dv_rep_full"};
    static const char *const on[3] = {"dq_rep", "dk_rep", "dv_rep"};
    static const cpc_buf_role rl[3] = {CPC_ROLE_DQ, CPC_ROLE_DK, CPC_ROLE_DV};
    int acc[3] = {x->dq, x->dk, x->dv};
    for (int i = 0; i < 3; i++) {
        int src = acc[i];
        if (uly) {
            /* this member's heads into every head (zeros elsewhere) */
            int full = buf(b, fn[i], rl[i], CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_NONE);
            op = add(b, ops, n, CPC_OP_COPY, NULL);
            bufs(op, true, 1, &src);
            bufs(op, false, 1, &full);
            src = full;
        }
        int out = buf(b, on[i], rl[i], CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        op = add(b, ops, n, CPC_OP_ALL_REDUCE, NULL);
        if (op)
            op->group = CPC_GROUP_WORLD;
        bufs(op, true, 1, &src);
        bufs(op, false, 1, &out);
    }
}

/* BACKWARD.md 3.7: cross-attention (K/V whole on every rank).  One local
 * block per rank; each rank's dK/dV holds its own query rows' (and, with
 * ulysses, its own query heads') part; all_reduce over the world sums them,
 * so that every rank ends with the unsplit K/V's gradient. */
static void build_cross(bb *b, const cpc_layout *L)
{
    cpc_program *P = b->prog;
    cpc_op **top = &P->ops;
    int *ntop = &P->n_ops;
    const bool uly = L->U > 1;
    const cpc_buf_tokens qt = uly ? CPC_TOK_BLOCK : CPC_TOK_SHARD;
    const cpc_buf_heads qh = uly ? CPC_HEADS_PART : CPC_HEADS_ALL;
    int q = buf(b, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int dout = buf(b, "dout", CPC_ROLE_DO, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int o = buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int lse = buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_INPUT);
    int k = buf(b, "k", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    int v = buf(b, "v", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    int qa = q, da = dout, ka = k, va = v, dshard = -1;
    int delta = buf(b, "delta", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
    if (uly) {
        qa = buf(b, "q_seq", CPC_ROLE_Q, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        da = buf(b, "do_seq", CPC_ROLE_DO, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        dshard = buf(b, "delta_shard", CPC_ROLE_LSE, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE);
        ka = buf(b, "k_part", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
        va = buf(b, "v_part", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
    }
    int dq = buf(b, uly ? "dq_seq" : "dq", CPC_ROLE_DQ, qt, qh, uly ? CPC_IO_NONE : CPC_IO_OUTPUT);
    int dk_p = buf(b, "dk_part", CPC_ROLE_DK, CPC_TOK_KV, qh, CPC_IO_NONE);
    int dv_p = buf(b, "dv_part", CPC_ROLE_DV, CPC_TOK_KV, qh, CPC_IO_NONE);
    cpc_op *op;
    op = add(b, top, ntop, CPC_OP_DELTA, NULL);
    int dl_in[2] = {dout, o};
    bufs(op, true, 2, dl_in);
    bufs(op, false, 1, uly ? &dshard : &delta);
    if (uly) {
        a2a(b, top, ntop, CPC_A2A_SEQ_TO_HEADS, q, qa, false);
        a2a(b, top, ntop, CPC_A2A_SEQ_TO_HEADS, dout, da, false);
        a2a(b, top, ntop, CPC_A2A_SEQ_TO_HEADS, dshard, delta, false);
        int cp[2][2] = {{k, ka}, {v, va}};
        for (int i = 0; i < 2; i++) {
            op = add(b, top, ntop, CPC_OP_COPY, NULL);
            bufs(op, true, 1, &cp[i][0]);
            bufs(op, false, 1, &cp[i][1]);
        }
    }
    op = add(b, top, ntop, CPC_OP_INIT_ACC, NULL);
    bufs(op, false, 1, &dq);
    op = add(b, top, ntop, CPC_OP_INIT_ACC, NULL);
    int dkv[2] = {dk_p, dv_p};
    bufs(op, false, 2, dkv);
    op = add(b, top, ntop, CPC_OP_ATTN_BWD, NULL);
    int ai[6] = {qa, ka, va, da, lse, delta}, ao[3] = {dq, dk_p, dv_p};
    bufs(op, true, 6, ai);
    bufs(op, false, 3, ao);
    if (uly) {
        int dq_o = buf(b, "dq", CPC_ROLE_DQ, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        a2a(b, top, ntop, CPC_A2A_HEADS_TO_SEQ, dq, dq_o, false);
        /* this member's K/V heads into every head (zeros elsewhere) */
        int dk_f = buf(b, "dk_full", CPC_ROLE_DK, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_NONE);
        int dv_f = buf(b, "dv_full", CPC_ROLE_DV, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_NONE);
        int cp[2][2] = {{dk_p, dk_f}, {dv_p, dv_f}};
        for (int i = 0; i < 2; i++) {
            op = add(b, top, ntop, CPC_OP_COPY, NULL);
            bufs(op, true, 1, &cp[i][0]);
            bufs(op, false, 1, &cp[i][1]);
        }
        dk_p = dk_f;
        dv_p = dv_f;
    }
    int dk_o = buf(b, "dk", CPC_ROLE_DK, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_OUTPUT);
    int dv_o = buf(b, "dv", CPC_ROLE_DV, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_OUTPUT);
    int ar[2][2] = {{dk_p, dk_o}, {dv_p, dv_o}};
    for (int i = 0; i < 2; i++) {
        op = add(b, top, ntop, CPC_OP_ALL_REDUCE, NULL);
        if (op)
            op->group = CPC_GROUP_WORLD;
        bufs(op, true, 1, &ar[i][0]);
        bufs(op, false, 1, &ar[i][1]);
    }
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
    cpc_op **top = &P->ops;
    int *ntop = &P->n_ops;
    if (L.cross) {
        build_cross(b, &L);
        if (b->err) {
            cpc_program_free(P);
            return b->err;
        }
        *out = P;
        return NULL;
    }
    const bool uly = U > 1;
    /* The query side and the K/V blocks of the attention layout: with
     * ulysses ring block r x this member's heads (BLOCK/PART), else the
     * shard with every head. */
    const cpc_buf_tokens qt = uly ? CPC_TOK_BLOCK : CPC_TOK_SHARD;
    const cpc_buf_heads qh = uly ? CPC_HEADS_PART : CPC_HEADS_ALL;
    const cpc_buf_io gio = uly ? CPC_IO_NONE : CPC_IO_OUTPUT;

    int q = buf(b, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int dout = buf(b, "dout", CPC_ROLE_DO, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int o = buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    /* The forward's final LSE, in the layout the forward computed it in. */
    int lse = buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_INPUT);
    int k = -1, v = -1, qa = q, da = dout, dshard = -1;
    if (uly) {
        k = buf(b, "k", CPC_ROLE_K, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = buf(b, "v", CPC_ROLE_V, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
        qa = buf(b, "q_seq", CPC_ROLE_Q, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        da = buf(b, "do_seq", CPC_ROLE_DO, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        dshard = buf(b, "delta_shard", CPC_ROLE_LSE, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE);
    }
    int k_cur = buf(b, "k_cur", CPC_ROLE_K, CPC_TOK_BLOCK, qh, uly ? CPC_IO_NONE : CPC_IO_INPUT);
    int v_cur = buf(b, "v_cur", CPC_ROLE_V, CPC_TOK_BLOCK, qh, uly ? CPC_IO_NONE : CPC_IO_INPUT);
    int delta = buf(b, "delta", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
    int dq = buf(b, uly ? "dq_seq" : "dq", CPC_ROLE_DQ, qt, qh, gio);
    int dk_cur = buf(b, "dk_cur", CPC_ROLE_DK, CPC_TOK_BLOCK, qh, gio);
    int dv_cur = buf(b, "dv_cur", CPC_ROLE_DV, CPC_TOK_BLOCK, qh, gio);

    if (uly) {
        /* Re-exchanged (the forward's q/k/v_seq are not kept); delta is
         * computed on the shard and moved (D x fewer bytes than `out`). */
        cpc_op *d = add(b, top, ntop, CPC_OP_DELTA, NULL);
        int dl[2] = {dout, o};
        bufs(d, true, 2, dl);
        bufs(d, false, 1, &dshard);
        a2a(b, top, ntop, CPC_A2A_SEQ_TO_HEADS, q, qa, false);
        a2a(b, top, ntop, CPC_A2A_SEQ_TO_HEADS, dout, da, false);
        a2a(b, top, ntop, CPC_A2A_SEQ_TO_HEADS, dshard, delta, false);
        a2a(b, top, ntop, CPC_A2A_SEQ_TO_HEADS, k, k_cur, false);
        a2a(b, top, ntop, CPC_A2A_SEQ_TO_HEADS, v, v_cur, false);
    }
    const bool gather = R > 1 && plan->schedule.rotate == CPC_ROTATE_ALLGATHER;
    P->rotate = gather ? CPC_ROTATE_ALLGATHER : CPC_ROTATE_P2P;
    int k_all = -1, v_all = -1, dk_all = -1, dv_all = -1;
    cpc_op *op;
    if (gather) {
        k_all = buf(b, "k_all", CPC_ROLE_K, CPC_TOK_ALL, qh, CPC_IO_NONE);
        v_all = buf(b, "v_all", CPC_ROLE_V, CPC_TOK_ALL, qh, CPC_IO_NONE);
        dk_all = buf(b, "dk_all", CPC_ROLE_DK, CPC_TOK_ALL, qh, CPC_IO_NONE);
        dv_all = buf(b, "dv_all", CPC_ROLE_DV, CPC_TOK_ALL, qh, CPC_IO_NONE);
        int ag[2][2] = {{k_cur, k_all}, {v_cur, v_all}};
        for (int i = 0; i < 2; i++) {
            op = add(b, top, ntop, CPC_OP_ALL_GATHER, NULL);
            if (op)
                op->group = CPC_GROUP_RING;
            bufs(op, true, 1, &ag[i][0]);
            bufs(op, false, 1, &ag[i][1]);
        }
    }
    if (!uly) {
        op = add(b, top, ntop, CPC_OP_DELTA, NULL);
        int dl_in[2] = {dout, o};
        bufs(op, true, 2, dl_in);
        bufs(op, false, 1, &delta);
    }
    /* BACKWARD.md 3.1 lagged (overlap: the default): each step's dK/dV goes
     * into a fresh pair, the travelling accumulator is added once it has
     * arrived, so its transfer overlaps the step's attn_bwd */
    const bool lagged = R > 1 && !gather && plan->schedule.overlap;
    op = add(b, top, ntop, CPC_OP_INIT_ACC, NULL);
    bufs(op, false, 1, &dq);
    if (!lagged) {
        op = add(b, top, ntop, CPC_OP_INIT_ACC, NULL);
        int dkv[2] = {gather ? dk_all : dk_cur, gather ? dv_all : dv_cur};
        bufs(op, false, 2, dkv);
    }
    repb x = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    if (L.rep)
        rep_pre(b, top, ntop, &L, &x, qa, da, lse, delta, dq);
    int ai[6] = {qa, k_cur, v_cur, da, lse, delta}, ao[3] = {dq, dk_cur, dv_cur};
    if (gather) {
        /* BACKWARD.md 3.2: K/V gathered again (the forward's are not kept),
         * every block's dK/dV accumulated in place in an ALL accumulator,
         * then reduce-scattered: each member gets its own block, summed. */
        cpc_op *loop = add(b, top, ntop, CPC_OP_LOOP, NULL);
        if (loop) {
            setx(b, &loop->count, "R");
            op = add(b, &loop->body, &loop->n_body, CPC_OP_ATTN_BWD, NULL);
            int gi[6] = {qa, k_all, v_all, da, lse, delta}, go[3] = {dq, dk_all, dv_all};
            bufs(op, true, 6, gi);
            bufs(op, false, 3, go);
            if (op)
                setx(b, &op->block, "(r-s)%R");
        }
        rep_own(b, top, ntop, &x, k_all, v_all, dk_all, dv_all, NULL, "r");
        int rs[2][2] = {{dk_all, dk_cur}, {dv_all, dv_cur}};
        for (int i = 0; i < 2; i++) {
            op = add(b, top, ntop, CPC_OP_REDUCE_SCATTER, NULL);
            if (op)
                op->group = CPC_GROUP_RING;
            bufs(op, true, 1, &rs[i][0]);
            bufs(op, false, 1, &rs[i][1]);
        }
    } else if (R == 1) {
        /* One local block (none, ulysses): no rotation. */
        op = add(b, top, ntop, CPC_OP_ATTN_BWD, NULL);
        bufs(op, true, 6, ai);
        bufs(op, false, 3, ao);
        rep_own(b, top, ntop, &x, k_cur, v_cur, dk_cur, dv_cur, NULL, NULL);
    } else if (lagged) {
        /* dk_cur/dv_cur receive the travelling accumulators (the last one:
         * this rank's block, complete); dk_blk/dv_blk: this step's part,
         * swapped into dk_out/dv_out to travel on */
        int k_nxt = buf(b, "k_nxt", CPC_ROLE_K, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int v_nxt = buf(b, "v_nxt", CPC_ROLE_V, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dk_blk = buf(b, "dk_blk", CPC_ROLE_DK, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dv_blk = buf(b, "dv_blk", CPC_ROLE_DV, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dk_out = buf(b, "dk_out", CPC_ROLE_DK, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dv_out = buf(b, "dv_out", CPC_ROLE_DV, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        cpc_op *loop = add(b, top, ntop, CPC_OP_LOOP, NULL);
        if (loop) {
            setx(b, &loop->count, "R");
            cpc_op **bo = &loop->body;
            int *bn = &loop->n_body;
            const char *more = "s<R-1", *after = "s>0";
            p2p(b, bo, bn, true, 0, more, k_cur, v_cur, NULL);
            p2p(b, bo, bn, false, 0, more, k_nxt, v_nxt, "(r-s-1)%R");
            p2p(b, bo, bn, false, 1, after, dk_cur, dv_cur, "(r-s)%R");
            op = add(b, bo, bn, CPC_OP_INIT_ACC, NULL);
            int blk[2] = {dk_blk, dv_blk};
            bufs(op, false, 2, blk);
            if (op)
                setx(b, &op->block, "(r-s)%R");
            op = add(b, bo, bn, CPC_OP_ATTN_BWD, NULL);
            int li[6] = {qa, k_cur, v_cur, da, lse, delta}, lo[3] = {dq, dk_blk, dv_blk};
            bufs(op, true, 6, li);
            bufs(op, false, 3, lo);
            rep_own(b, bo, bn, &x, k_cur, v_cur, dk_blk, dv_blk, "s==0", NULL);
            if ((op = add(b, bo, bn, CPC_OP_WAIT, after)))
                op->tag = 1;
            int ad[2][2] = {{dk_cur, dk_blk}, {dv_cur, dv_blk}};
            for (int i = 0; i < 2; i++) {
                op = add(b, bo, bn, CPC_OP_ADD, after);
                bufs(op, true, 1, &ad[i][0]);
                bufs(op, false, 1, &ad[i][1]);
            }
            int sw[2][2] = {{dk_blk, dk_out}, {dv_blk, dv_out}};
            for (int i = 0; i < 2; i++) {
                op = add(b, bo, bn, CPC_OP_SWAP, NULL);
                bufs(op, true, 2, sw[i]);
            }
            p2p(b, bo, bn, true, 1, NULL, dk_out, dv_out, NULL);
            if ((op = add(b, bo, bn, CPC_OP_WAIT, more)))
                op->tag = 0;
            int kv[2][2] = {{k_cur, k_nxt}, {v_cur, v_nxt}};
            for (int i = 0; i < 2; i++) {
                op = add(b, bo, bn, CPC_OP_SWAP, more);
                bufs(op, true, 2, kv[i]);
            }
        }
        /* home: the accumulator of this rank's block, all R contributions */
        p2p(b, top, ntop, false, 1, NULL, dk_cur, dv_cur, "r");
        if ((op = add(b, top, ntop, CPC_OP_WAIT, NULL)))
            op->tag = 1;
    } else {
        int k_nxt = buf(b, "k_nxt", CPC_ROLE_K, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int v_nxt = buf(b, "v_nxt", CPC_ROLE_V, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dk_nxt = buf(b, "dk_nxt", CPC_ROLE_DK, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dv_nxt = buf(b, "dv_nxt", CPC_ROLE_DV, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        cpc_op *loop = add(b, top, ntop, CPC_OP_LOOP, NULL);
        if (loop) {
            setx(b, &loop->count, "R");
            cpc_op **bo = &loop->body;
            int *bn = &loop->n_body;
            const char *more = "s<R-1";
            p2p(b, bo, bn, true, 0, more, k_cur, v_cur, NULL);
            p2p(b, bo, bn, false, 0, more, k_nxt, v_nxt, "(r-s-1)%R");
            op = add(b, bo, bn, CPC_OP_ATTN_BWD, NULL);
            bufs(op, true, 6, ai);
            bufs(op, false, 3, ao);
            rep_own(b, bo, bn, &x, k_cur, v_cur, dk_cur, dv_cur, "s==0", NULL);
            p2p(b, bo, bn, true, 1, NULL, dk_cur, dv_cur, NULL);
            p2p(b, bo, bn, false, 1, NULL, dk_nxt, dv_nxt, "(r-s-1)%R");
            if ((op = add(b, bo, bn, CPC_OP_WAIT, more)))
                op->tag = 0;
            if ((op = add(b, bo, bn, CPC_OP_WAIT, NULL)))
                op->tag = 1;
            int sw[4][2] = {{k_cur, k_nxt}, {v_cur, v_nxt}, {dk_cur, dk_nxt}, {dv_cur, dv_nxt}};
            for (int i = 0; i < 4; i++) {
                op = add(b, bo, bn, CPC_OP_SWAP, i < 2 ? more : NULL);
                bufs(op, true, 2, sw[i]);
            }
        }
    }
    if (L.rep)
        rep_post(b, top, ntop, &L, &x);
    if (uly) {
        /* Gradients back to the sequence layout; dK/dV of a K/V head held by
         * several members are summed (fp32) on the way (BACKWARD.md 3.4). */
        bool shared = cpc_backward_kv_heads_shared(&L);
        int dq_o = buf(b, "dq", CPC_ROLE_DQ, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        int dk_o = buf(b, "dk", CPC_ROLE_DK, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        int dv_o = buf(b, "dv", CPC_ROLE_DV, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        a2a(b, top, ntop, CPC_A2A_HEADS_TO_SEQ, dq, dq_o, false);
        a2a(b, top, ntop, CPC_A2A_HEADS_TO_SEQ, dk_cur, dk_o, shared);
        a2a(b, top, ntop, CPC_A2A_HEADS_TO_SEQ, dv_cur, dv_o, shared);
    }
    if (b->err) {
        cpc_program_free(P);
        return b->err;
    }
    *out = P;
    return NULL;
}
