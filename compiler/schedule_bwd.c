/* schedule_bwd.c - the backward op program of a training plan; see
 * schedule_bwd.h for the program and docs/BACKWARD.md for the design. */
#include "schedule_bwd.h"

#include <string.h>

#include "schedule_build.h"

/* delta = rowsum(dout * o) into `delta` (BACKWARD.md 2). */
static void delta_op(cpc_sb *b, cpc_sb_list l, int dout, int o, int delta)
{
    cpc_sb_op(b, l, CPC_OP_DELTA, NULL, CPC_BUFS(dout, o), CPC_BUFS(delta));
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

static int rep_copy(cpc_sb *b, cpc_sb_list l, int in, const char *name, cpc_buf_role role)
{
    int out = cpc_sb_buf(b, name, role, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
    cpc_sb_copy(b, l, in, out);
    return out;
}

/* Inputs, delta and accumulators of the replicated rows, and the blocks of
 * the replicated keys: (sharded q = qa/da/lse/delta, replicated k) and
 * (replicated q, replicated k) on ring rank 0.  dq must be initialized
 * already. */
static void rep_pre(cpc_sb *b, cpc_sb_list l, const cpc_layout *L, repb *x, int qa, int da, int lse, int delta,
                    int dq)
{
    const bool uly = L->U > 1;
    const cpc_buf_heads qh = uly ? CPC_HEADS_PART : CPC_HEADS_ALL;
    x->q = cpc_sb_buf(b, "q_rep", CPC_ROLE_Q, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->k = cpc_sb_buf(b, "k_rep", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->v = cpc_sb_buf(b, "v_rep", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->dout = cpc_sb_buf(b, "dout_rep", CPC_ROLE_DO, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->o = cpc_sb_buf(b, "out_rep", CPC_ROLE_O, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    x->lse = cpc_sb_buf(b, "lse_rep", CPC_ROLE_LSE, CPC_TOK_KV, qh, CPC_IO_INPUT);
    if (uly) {
        x->q = rep_copy(b, l, x->q, "q_rep_part", CPC_ROLE_Q);
        x->k = rep_copy(b, l, x->k, "k_rep_part", CPC_ROLE_K);
        x->v = rep_copy(b, l, x->v, "v_rep_part", CPC_ROLE_V);
        x->dout = rep_copy(b, l, x->dout, "dout_rep_part", CPC_ROLE_DO);
        x->o = rep_copy(b, l, x->o, "out_rep_part", CPC_ROLE_O);
    }
    x->delta = cpc_sb_buf(b, "delta_rep", CPC_ROLE_LSE, CPC_TOK_KV, qh, CPC_IO_NONE);
    x->dq = cpc_sb_buf(b, "dq_rep_acc", CPC_ROLE_DQ, CPC_TOK_KV, qh, CPC_IO_NONE);
    x->dk = cpc_sb_buf(b, "dk_rep_acc", CPC_ROLE_DK, CPC_TOK_KV, qh, CPC_IO_NONE);
    x->dv = cpc_sb_buf(b, "dv_rep_acc", CPC_ROLE_DV, CPC_TOK_KV, qh, CPC_IO_NONE);
    delta_op(b, l, x->dout, x->o, x->delta);
    cpc_sb_op(b, l, CPC_OP_INIT_ACC, NULL, NULL, CPC_BUFS(x->dq));
    cpc_sb_op(b, l, CPC_OP_INIT_ACC, NULL, NULL, CPC_BUFS(x->dk, x->dv));
    /* (sharded q, replicated k) */
    cpc_sb_op(b, l, CPC_OP_ATTN_BWD, NULL, CPC_BUFS(qa, x->k, x->v, da, lse, delta), CPC_BUFS(dq, x->dk, x->dv));
    /* (replicated q, replicated k): once, on ring rank 0 */
    cpc_sb_op(b, l, CPC_OP_ATTN_BWD, "r==0", CPC_BUFS(x->q, x->k, x->v, x->dout, x->lse, x->delta),
              CPC_BUFS(x->dq, x->dk, x->dv));
}

/* (replicated q, the rank's own block of K/V k/v) into that block's dK/dV
 * accumulators dk/dv; `when` and `block` as the op takes them. */
static void rep_own(cpc_sb *b, cpc_sb_list l, const repb *x, int k, int v, int dk, int dv, const char *when,
                    const char *block)
{
    if (x->q < 0)
        return;
    cpc_op *op = cpc_sb_op(b, l, CPC_OP_ATTN_BWD, when, CPC_BUFS(x->q, k, v, x->dout, x->lse, x->delta),
                           CPC_BUFS(x->dq, dk, dv));
    cpc_sb_block(b, op, block);
}

/* After the key blocks: the replicated rows' gradients are summed over the
 * world into the OUTPUT dq_rep/dk_rep/dv_rep (KV, every head). */
static void rep_post(cpc_sb *b, cpc_sb_list l, const cpc_layout *L, const repb *x)
{
    const bool uly = L->U > 1;
    static const char *const fn[3] = {"dq_rep_full", "dk_rep_full", "dv_rep_full"};
    static const char *const on[3] = {"dq_rep", "dk_rep", "dv_rep"};
    static const cpc_buf_role rl[3] = {CPC_ROLE_DQ, CPC_ROLE_DK, CPC_ROLE_DV};
    int acc[3] = {x->dq, x->dk, x->dv};
    for (int i = 0; i < 3; i++) {
        int src = acc[i];
        if (uly) {
            /* this member's heads into every head (zeros elsewhere) */
            int full = cpc_sb_buf(b, fn[i], rl[i], CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_NONE);
            cpc_sb_copy(b, l, src, full);
            src = full;
        }
        int out = cpc_sb_buf(b, on[i], rl[i], CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        cpc_sb_coll(b, l, CPC_OP_ALL_REDUCE, CPC_GROUP_WORLD, 1, &src, &out);
    }
}

/* BACKWARD.md 3.7: cross-attention (K/V whole on every rank).  One local
 * block per rank; each rank's dK/dV holds its own query rows' (and, with
 * ulysses, its own query heads') part; all_reduce over the world sums them,
 * so that every rank ends with the unsplit K/V's gradient. */
static void build_cross(cpc_sb *b, const cpc_layout *L)
{
    cpc_sb_list top = cpc_sb_top(b);
    const bool uly = L->U > 1;
    const cpc_buf_tokens qt = uly ? CPC_TOK_BLOCK : CPC_TOK_SHARD;
    const cpc_buf_heads qh = uly ? CPC_HEADS_PART : CPC_HEADS_ALL;
    int q = cpc_sb_buf(b, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int dout = cpc_sb_buf(b, "dout", CPC_ROLE_DO, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int o = cpc_sb_buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int lse = cpc_sb_buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_INPUT);
    int k = cpc_sb_buf(b, "k", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    int v = cpc_sb_buf(b, "v", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    int qa = q, da = dout, ka = k, va = v, dshard = -1;
    int delta = cpc_sb_buf(b, "delta", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
    if (uly) {
        qa = cpc_sb_buf(b, "q_seq", CPC_ROLE_Q, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        da = cpc_sb_buf(b, "do_seq", CPC_ROLE_DO, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        dshard = cpc_sb_buf(b, "delta_shard", CPC_ROLE_LSE, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE);
        ka = cpc_sb_buf(b, "k_part", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
        va = cpc_sb_buf(b, "v_part", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
    }
    int dq = cpc_sb_buf(b, uly ? "dq_seq" : "dq", CPC_ROLE_DQ, qt, qh, uly ? CPC_IO_NONE : CPC_IO_OUTPUT);
    int dk_p = cpc_sb_buf(b, "dk_part", CPC_ROLE_DK, CPC_TOK_KV, qh, CPC_IO_NONE);
    int dv_p = cpc_sb_buf(b, "dv_part", CPC_ROLE_DV, CPC_TOK_KV, qh, CPC_IO_NONE);
    delta_op(b, top, dout, o, uly ? dshard : delta);
    if (uly) {
        cpc_sb_to_heads(b, top, q, qa);
        cpc_sb_to_heads(b, top, dout, da);
        cpc_sb_to_heads(b, top, dshard, delta);
        cpc_sb_copy(b, top, k, ka);
        cpc_sb_copy(b, top, v, va);
    }
    cpc_sb_op(b, top, CPC_OP_INIT_ACC, NULL, NULL, CPC_BUFS(dq));
    cpc_sb_op(b, top, CPC_OP_INIT_ACC, NULL, NULL, CPC_BUFS(dk_p, dv_p));
    cpc_sb_op(b, top, CPC_OP_ATTN_BWD, NULL, CPC_BUFS(qa, ka, va, da, lse, delta), CPC_BUFS(dq, dk_p, dv_p));
    if (uly) {
        int dq_o = cpc_sb_buf(b, "dq", CPC_ROLE_DQ, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        cpc_sb_a2a(b, top, CPC_A2A_HEADS_TO_SEQ, dq, dq_o, false);
        /* this member's K/V heads into every head (zeros elsewhere) */
        int dk_f = cpc_sb_buf(b, "dk_full", CPC_ROLE_DK, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_NONE);
        int dv_f = cpc_sb_buf(b, "dv_full", CPC_ROLE_DV, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_NONE);
        cpc_sb_copy(b, top, dk_p, dk_f);
        cpc_sb_copy(b, top, dv_p, dv_f);
        dk_p = dk_f;
        dv_p = dv_f;
    }
    int dk_o = cpc_sb_buf(b, "dk", CPC_ROLE_DK, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_OUTPUT);
    int dv_o = cpc_sb_buf(b, "dv", CPC_ROLE_DV, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_OUTPUT);
    cpc_sb_coll(b, top, CPC_OP_ALL_REDUCE, CPC_GROUP_WORLD, 2, CPC_BUFS(dk_p, dv_p), CPC_BUFS(dk_o, dv_o));
}

cpc_status *cpc_schedule_build_backward(const cpc_plan *plan, cpc_variant variant, int R, int U,
                                        cpc_program **out)
{
    *out = NULL;
    if (!plan)
        return cpc_error(CPC_E_INTERNAL, "backward schedule: no plan");
    cpc_status *st = cpc_backward_supported(plan, variant, R, U);
    if (!st)
        st = cpc_sb_check_candidate(plan, variant, R, U, "backward schedule");
    cpc_layout L;
    if (st || (st = cpc_layout_init(&L, plan, variant, R, U)))
        return st;
    cpc_sb bd, *b = &bd;
    cpc_sb_init(b, &L, false, CPC_ROTATE_P2P, "backward schedule");
    if (L.cross) {
        build_cross(b, &L);
        return cpc_sb_finish(b, out);
    }
    cpc_sb_list top = cpc_sb_top(b);
    const bool uly = U > 1;
    /* The query side and the K/V blocks of the attention layout: with
     * ulysses ring block r x this member's heads (BLOCK/PART), else the
     * shard with every head. */
    const cpc_buf_tokens qt = uly ? CPC_TOK_BLOCK : CPC_TOK_SHARD;
    const cpc_buf_heads qh = uly ? CPC_HEADS_PART : CPC_HEADS_ALL;
    const cpc_buf_io gio = uly ? CPC_IO_NONE : CPC_IO_OUTPUT;

    int q = cpc_sb_buf(b, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int dout = cpc_sb_buf(b, "dout", CPC_ROLE_DO, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int o = cpc_sb_buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    /* The forward's final LSE, in the layout the forward computed it in. */
    int lse = cpc_sb_buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_INPUT);
    int k = -1, v = -1, qa = q, da = dout, dshard = -1;
    if (uly) {
        k = cpc_sb_buf(b, "k", CPC_ROLE_K, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = cpc_sb_buf(b, "v", CPC_ROLE_V, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
        qa = cpc_sb_buf(b, "q_seq", CPC_ROLE_Q, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        da = cpc_sb_buf(b, "do_seq", CPC_ROLE_DO, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        dshard = cpc_sb_buf(b, "delta_shard", CPC_ROLE_LSE, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE);
    }
    int k_cur = cpc_sb_buf(b, "k_cur", CPC_ROLE_K, CPC_TOK_BLOCK, qh, uly ? CPC_IO_NONE : CPC_IO_INPUT);
    int v_cur = cpc_sb_buf(b, "v_cur", CPC_ROLE_V, CPC_TOK_BLOCK, qh, uly ? CPC_IO_NONE : CPC_IO_INPUT);
    int delta = cpc_sb_buf(b, "delta", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
    int dq = cpc_sb_buf(b, uly ? "dq_seq" : "dq", CPC_ROLE_DQ, qt, qh, gio);
    int dk_cur = cpc_sb_buf(b, "dk_cur", CPC_ROLE_DK, CPC_TOK_BLOCK, qh, gio);
    int dv_cur = cpc_sb_buf(b, "dv_cur", CPC_ROLE_DV, CPC_TOK_BLOCK, qh, gio);

    if (uly) {
        /* Re-exchanged (the forward's q/k/v_seq are not kept); delta is
         * computed on the shard and moved (D x fewer bytes than `out`). */
        delta_op(b, top, dout, o, dshard);
        cpc_sb_to_heads(b, top, q, qa);
        cpc_sb_to_heads(b, top, dout, da);
        cpc_sb_to_heads(b, top, dshard, delta);
        cpc_sb_to_heads(b, top, k, k_cur);
        cpc_sb_to_heads(b, top, v, v_cur);
    }
    const bool gather = R > 1 && plan->schedule.rotate == CPC_ROTATE_ALLGATHER;
    if (b->prog)
        b->prog->rotate = gather ? CPC_ROTATE_ALLGATHER : CPC_ROTATE_P2P;
    int k_all = -1, v_all = -1, dk_all = -1, dv_all = -1;
    if (gather) {
        k_all = cpc_sb_buf(b, "k_all", CPC_ROLE_K, CPC_TOK_ALL, qh, CPC_IO_NONE);
        v_all = cpc_sb_buf(b, "v_all", CPC_ROLE_V, CPC_TOK_ALL, qh, CPC_IO_NONE);
        dk_all = cpc_sb_buf(b, "dk_all", CPC_ROLE_DK, CPC_TOK_ALL, qh, CPC_IO_NONE);
        dv_all = cpc_sb_buf(b, "dv_all", CPC_ROLE_DV, CPC_TOK_ALL, qh, CPC_IO_NONE);
        cpc_sb_coll(b, top, CPC_OP_ALL_GATHER, CPC_GROUP_RING, 2, CPC_BUFS(k_cur, v_cur), CPC_BUFS(k_all, v_all));
    }
    if (!uly)
        delta_op(b, top, dout, o, delta);
    /* BACKWARD.md 3.1 lagged (overlap: the default): each step's dK/dV goes
     * into a fresh pair, the travelling accumulator is added once it has
     * arrived, so its transfer overlaps the step's attn_bwd */
    const bool lagged = R > 1 && !gather && plan->schedule.overlap;
    cpc_sb_op(b, top, CPC_OP_INIT_ACC, NULL, NULL, CPC_BUFS(dq));
    if (!lagged)
        cpc_sb_op(b, top, CPC_OP_INIT_ACC, NULL, NULL,
                  gather ? CPC_BUFS(dk_all, dv_all) : CPC_BUFS(dk_cur, dv_cur));
    repb x = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    if (L.rep)
        rep_pre(b, top, &L, &x, qa, da, lse, delta, dq);
    if (gather) {
        /* BACKWARD.md 3.2: K/V gathered again (the forward's are not kept),
         * every block's dK/dV accumulated in place in an ALL accumulator,
         * then reduce-scattered: each member gets its own block, summed. */
        cpc_sb_list body = cpc_sb_loop(b, top, "R");
        cpc_sb_block(b,
                     cpc_sb_op(b, body, CPC_OP_ATTN_BWD, NULL, CPC_BUFS(qa, k_all, v_all, da, lse, delta),
                               CPC_BUFS(dq, dk_all, dv_all)),
                     "(r-s)%R");
        rep_own(b, top, &x, k_all, v_all, dk_all, dv_all, NULL, "r");
        cpc_sb_coll(b, top, CPC_OP_REDUCE_SCATTER, CPC_GROUP_RING, 2, CPC_BUFS(dk_all, dv_all),
                    CPC_BUFS(dk_cur, dv_cur));
    } else if (R == 1) {
        /* One local block (none, ulysses): no rotation. */
        cpc_sb_op(b, top, CPC_OP_ATTN_BWD, NULL, CPC_BUFS(qa, k_cur, v_cur, da, lse, delta),
                  CPC_BUFS(dq, dk_cur, dv_cur));
        rep_own(b, top, &x, k_cur, v_cur, dk_cur, dv_cur, NULL, NULL);
    } else if (lagged) {
        /* dk_cur/dv_cur receive the travelling accumulators (the last one:
         * this rank's block, complete); dk_blk/dv_blk: this step's part,
         * swapped into dk_out/dv_out to travel on */
        int k_nxt = cpc_sb_buf(b, "k_nxt", CPC_ROLE_K, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int v_nxt = cpc_sb_buf(b, "v_nxt", CPC_ROLE_V, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dk_blk = cpc_sb_buf(b, "dk_blk", CPC_ROLE_DK, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dv_blk = cpc_sb_buf(b, "dv_blk", CPC_ROLE_DV, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dk_out = cpc_sb_buf(b, "dk_out", CPC_ROLE_DK, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dv_out = cpc_sb_buf(b, "dv_out", CPC_ROLE_DV, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        cpc_sb_list body = cpc_sb_loop(b, top, "R");
        const char *after = "s>0";
        cpc_sb_kv_post(b, body, k_cur, v_cur, k_nxt, v_nxt);
        cpc_sb_ring_p2p(b, body, false, 1, after, dk_cur, dv_cur, "(r-s)%R");
        cpc_sb_block(b, cpc_sb_op(b, body, CPC_OP_INIT_ACC, NULL, NULL, CPC_BUFS(dk_blk, dv_blk)), "(r-s)%R");
        cpc_sb_op(b, body, CPC_OP_ATTN_BWD, NULL, CPC_BUFS(qa, k_cur, v_cur, da, lse, delta),
                  CPC_BUFS(dq, dk_blk, dv_blk));
        rep_own(b, body, &x, k_cur, v_cur, dk_blk, dv_blk, "s==0", NULL);
        cpc_sb_wait(b, body, 1, after);
        cpc_sb_op(b, body, CPC_OP_ADD, after, CPC_BUFS(dk_cur), CPC_BUFS(dk_blk));
        cpc_sb_op(b, body, CPC_OP_ADD, after, CPC_BUFS(dv_cur), CPC_BUFS(dv_blk));
        cpc_sb_swap(b, body, dk_blk, dk_out, NULL);
        cpc_sb_swap(b, body, dv_blk, dv_out, NULL);
        cpc_sb_ring_p2p(b, body, true, 1, NULL, dk_out, dv_out, NULL);
        cpc_sb_wait(b, body, 0, CPC_SB_MORE);
        cpc_sb_kv_swap(b, body, k_cur, v_cur, k_nxt, v_nxt);
        /* home: the accumulator of this rank's block, all R contributions */
        cpc_sb_ring_p2p(b, top, false, 1, NULL, dk_cur, dv_cur, "r");
        cpc_sb_wait(b, top, 1, NULL);
    } else {
        int k_nxt = cpc_sb_buf(b, "k_nxt", CPC_ROLE_K, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int v_nxt = cpc_sb_buf(b, "v_nxt", CPC_ROLE_V, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dk_nxt = cpc_sb_buf(b, "dk_nxt", CPC_ROLE_DK, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int dv_nxt = cpc_sb_buf(b, "dv_nxt", CPC_ROLE_DV, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        cpc_sb_list body = cpc_sb_loop(b, top, "R");
        cpc_sb_kv_post(b, body, k_cur, v_cur, k_nxt, v_nxt);
        cpc_sb_op(b, body, CPC_OP_ATTN_BWD, NULL, CPC_BUFS(qa, k_cur, v_cur, da, lse, delta),
                  CPC_BUFS(dq, dk_cur, dv_cur));
        rep_own(b, body, &x, k_cur, v_cur, dk_cur, dv_cur, "s==0", NULL);
        cpc_sb_ring_p2p(b, body, true, 1, NULL, dk_cur, dv_cur, NULL);
        cpc_sb_ring_p2p(b, body, false, 1, NULL, dk_nxt, dv_nxt, "(r-s-1)%R");
        cpc_sb_wait(b, body, 0, CPC_SB_MORE);
        cpc_sb_wait(b, body, 1, NULL);
        cpc_sb_kv_swap(b, body, k_cur, v_cur, k_nxt, v_nxt);
        cpc_sb_swap(b, body, dk_cur, dk_nxt, NULL);
        cpc_sb_swap(b, body, dv_cur, dv_nxt, NULL);
    }
    if (L.rep)
        rep_post(b, top, &L, &x);
    if (uly) {
        /* Gradients back to the sequence layout; dK/dV of a K/V head held by
         * several members are summed (fp32) on the way (BACKWARD.md 3.4). */
        bool shared = cpc_backward_kv_heads_shared(&L);
        int dq_o = cpc_sb_buf(b, "dq", CPC_ROLE_DQ, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        int dk_o = cpc_sb_buf(b, "dk", CPC_ROLE_DK, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        int dv_o = cpc_sb_buf(b, "dv", CPC_ROLE_DV, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        cpc_sb_a2a(b, top, CPC_A2A_HEADS_TO_SEQ, dq, dq_o, false);
        cpc_sb_a2a(b, top, CPC_A2A_HEADS_TO_SEQ, dk_cur, dk_o, shared);
        cpc_sb_a2a(b, top, CPC_A2A_HEADS_TO_SEQ, dv_cur, dv_o, shared);
    }
    return cpc_sb_finish(b, out);
}
