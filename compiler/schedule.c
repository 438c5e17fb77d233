/* schedule.c - builds one SPMD op program per candidate; see schedule.h for
 * the programs and program.h for the meaning of every op. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

typedef struct builder {
    cpc_program *prog;
    cpc_status *err;   /* first error; later calls become no-ops */
} builder;

static void oom(builder *b)
{
    if (!b->err)
        b->err = &cpc_status_oom;
}

static int buf(builder *b, const char *name, cpc_buf_role role, cpc_buf_tokens tokens,
               cpc_buf_heads heads, cpc_buf_io io)
{
    if (b->err)
        return -1;
    int i = cpc_program_add_buffer(b->prog, name, role, tokens, heads, io);
    if (i < 0)
        oom(b);
    return i;
}

static cpc_op *add(builder *b, cpc_op **ops, int *n, cpc_op_kind kind)
{
    if (b->err)
        return NULL;
    cpc_op *op = cpc_ops_append(ops, n, kind);
    if (!op)
        oom(b);
    return op;
}

static void setx(builder *b, cpc_expr **slot, const char *text)
{
    if (b->err)
        return;
    cpc_status *st = cpc_expr_parse(text, CPC_NO_SPAN, slot);
    if (st) {
        cpc_status_prefix(st, "schedule (internal)");
        if (st != &cpc_status_oom)
            st->code = CPC_E_INTERNAL;
        b->err = st;
    }
}

static void ins(cpc_op *op, int a, int b2, int c)
{
    int v[3] = {a, b2, c};
    op->n_in = 0;
    for (int i = 0; i < 3; i++)
        if (v[i] >= 0)
            op->in[op->n_in++] = v[i];
}

static void outs(cpc_op *op, int a, int b2)
{
    int v[2] = {a, b2};
    op->n_out = 0;
    for (int i = 0; i < 2; i++)
        if (v[i] >= 0)
            op->out[op->n_out++] = v[i];
}

/* --- op helpers on the top-level list or a loop body --- */

typedef struct oplist {
    cpc_op **ops;
    int *n;
} oplist;

static void a2a(builder *b, oplist l, cpc_a2a_dir dir, int in, int out)
{
    cpc_op *op = add(b, l.ops, l.n, CPC_OP_ALL_TO_ALL);
    if (!op)
        return;
    op->group = CPC_GROUP_ULYSSES;
    op->dir = dir;
    ins(op, in, -1, -1);
    outs(op, out, -1);
}

static void copy(builder *b, oplist l, int in, int out)
{
    cpc_op *op = add(b, l.ops, l.n, CPC_OP_COPY);
    if (!op)
        return;
    ins(op, in, -1, -1);
    outs(op, out, -1);
}

static void attn(builder *b, oplist l, int q, int k, int v, int o, int lse, const char *block)
{
    cpc_op *op = add(b, l.ops, l.n, CPC_OP_ATTN);
    if (!op)
        return;
    ins(op, q, k, v);
    outs(op, o, lse);
    if (block)
        setx(b, &op->block, block);
}

static void merge(builder *b, oplist l, int o_blk, int lse_blk, int acc, int lse)
{
    cpc_op *op = add(b, l.ops, l.n, CPC_OP_MERGE);
    if (!op)
        return;
    ins(op, o_blk, lse_blk, -1);
    outs(op, acc, lse);
}

static void init_acc(builder *b, oplist l, int acc, int lse)
{
    cpc_op *op = add(b, l.ops, l.n, CPC_OP_INIT_ACC);
    if (op)
        outs(op, acc, lse);
}

static void all_gather(builder *b, oplist l, int in, int out)
{
    cpc_op *op = add(b, l.ops, l.n, CPC_OP_ALL_GATHER);
    if (!op)
        return;
    op->group = CPC_GROUP_RING;
    ins(op, in, -1, -1);
    outs(op, out, -1);
}

/* Replicated segments (layout.h): their q/k/v (KV layout, the rank's heads:
 * q/k/v, or their PART copies with ulysses) and the accumulators of their
 * query rows.  q < 0: the plan has none. */
typedef struct repbufs {
    int q, k, v;          /* KV rows, the heads attention uses here */
    int acc, lse;         /* KV rows: the replicated queries' result */
    int o_blk, lse_blk;   /* KV rows: one block's partial result */
} repbufs;

/* Before the key blocks: zero the replicated queries' accumulators, and let
 * every query (the rank's sharded rows q, and the replicated rows) meet the
 * replicated keys, which are local: exactly once, here, never in the ring. */
static void rep_local(builder *b, oplist l, const repbufs *x, int q, int o_blk, int lse_blk, int acc, int lse)
{
    if (x->q < 0)
        return;
    init_acc(b, l, x->acc, x->lse);
    attn(b, l, q, x->k, x->v, o_blk, lse_blk, NULL);
    merge(b, l, o_blk, lse_blk, acc, lse);
    attn(b, l, x->q, x->k, x->v, x->o_blk, x->lse_blk, NULL);
    merge(b, l, x->o_blk, x->lse_blk, x->acc, x->lse);
}

/* The replicated queries meet one block of sharded keys (k, v; `block` for
 * an ALL buffer). */
static void rep_block(builder *b, oplist l, const repbufs *x, int k, int v, const char *block)
{
    if (x->q < 0)
        return;
    attn(b, l, x->q, k, v, x->o_blk, x->lse_blk, block);
    merge(b, l, x->o_blk, x->lse_blk, x->acc, x->lse);
}

/* The ring loop (p2p) over K/V blocks k_cur/v_cur, double-buffered. */
static void ring_p2p_loop(builder *b, oplist top, bool overlap, int q, int k_cur, int v_cur, int k_nxt,
                          int v_nxt, int o_blk, int lse_blk, int acc, int lse, const repbufs *x)
{
    init_acc(b, top, acc, lse);
    rep_local(b, top, x, q, o_blk, lse_blk, acc, lse);
    cpc_op *loop = add(b, top.ops, top.n, CPC_OP_LOOP);
    if (!loop)
        return;
    setx(b, &loop->count, "R");
    oplist body = {&loop->body, &loop->n_body};
    /* `loop` may move if top is realloc'd: it is not touched again below
     * except through body, which points into it; nothing appends to top
     * until the body is complete. */
    const char *more = "s<R-1";

    cpc_op *op = add(b, body.ops, body.n, CPC_OP_SEND);
    if (op) {
        op->group = CPC_GROUP_RING;
        setx(b, &op->peer, "(r+1)%R");
        ins(op, k_cur, v_cur, -1);
        op->tag = 0;
        setx(b, &op->when, more);
    }
    op = add(b, body.ops, body.n, CPC_OP_RECV);
    if (op) {
        op->group = CPC_GROUP_RING;
        setx(b, &op->peer, "(r-1)%R");
        outs(op, k_nxt, v_nxt);
        setx(b, &op->block, "(r-s-1)%R");
        op->tag = 0;
        setx(b, &op->when, more);
    }
    if (!overlap) {
        op = add(b, body.ops, body.n, CPC_OP_WAIT);
        if (op) {
            op->tag = 0;
            setx(b, &op->when, more);
        }
    }
    attn(b, body, q, k_cur, v_cur, o_blk, lse_blk, NULL);
    merge(b, body, o_blk, lse_blk, acc, lse);
    rep_block(b, body, x, k_cur, v_cur, NULL);
    if (overlap) {
        op = add(b, body.ops, body.n, CPC_OP_WAIT);
        if (op) {
            op->tag = 0;
            setx(b, &op->when, more);
        }
    }
    op = add(b, body.ops, body.n, CPC_OP_SWAP);
    if (op) {
        ins(op, k_cur, k_nxt, -1);
        setx(b, &op->when, more);
    }
    op = add(b, body.ops, body.n, CPC_OP_SWAP);
    if (op) {
        ins(op, v_cur, v_nxt, -1);
        setx(b, &op->when, more);
    }
}

/* The ring loop (allgather): attention over the gathered blocks in the same
 * order as p2p. */
static void ring_allgather_loop(builder *b, oplist top, int q, int k_all, int v_all, int o_blk,
                                int lse_blk, int acc, int lse, const repbufs *x)
{
    init_acc(b, top, acc, lse);
    rep_local(b, top, x, q, o_blk, lse_blk, acc, lse);
    cpc_op *loop = add(b, top.ops, top.n, CPC_OP_LOOP);
    if (!loop)
        return;
    setx(b, &loop->count, "R");
    oplist body = {&loop->body, &loop->n_body};
    attn(b, body, q, k_all, v_all, o_blk, lse_blk, "(r-s)%R");
    merge(b, body, o_blk, lse_blk, acc, lse);
    rep_block(b, body, x, k_all, v_all, "(r-s)%R");
}

static cpc_status *check_candidate(const cpc_plan *plan, cpc_variant v, int R, int U)
{
    if ((int)v < 0 || v >= CPC_VARIANT__COUNT || v == CPC_VARIANT_AUTO)
        return cpc_error(CPC_E_INTERNAL, "schedule: variant must be resolved (got %d)", (int)v);
    if (R < 1 || U < 1)
        return cpc_error(CPC_E_INTERNAL, "schedule: %s with ring_degree %d, ulysses_degree %d",
                         cpc_variant_name(v), R, U);
    switch (v) {
    case CPC_VARIANT_RING:
    case CPC_VARIANT_RING_ANYTHING:
        if (U != 1)
            return cpc_error(CPC_E_INTERNAL, "schedule: %s needs ulysses_degree 1 (got %d)",
                             cpc_variant_name(v), U);
        break;
    case CPC_VARIANT_ULYSSES:
    case CPC_VARIANT_ULYSSES_ANYTHING:
        if (R != 1)
            return cpc_error(CPC_E_INTERNAL, "schedule: %s needs ring_degree 1 (got %d)",
                             cpc_variant_name(v), R);
        break;
    case CPC_VARIANT_NONE:
        if (R != 1 || U != 1)
            return cpc_error(CPC_E_INTERNAL, "schedule: none needs ring_degree = ulysses_degree = 1");
        break;
    default:
        break;
    }
    if ((int64_t)R * U != plan->cluster.world_size)
        return cpc_error(CPC_E_INTERNAL, "schedule: %s %dx%d does not match world_size %d",
                         cpc_variant_name(v), R, U, plan->cluster.world_size);
    return NULL;
}

cpc_status *cpc_schedule_build(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                               int ulysses_degree, cpc_program **out)
{
    *out = NULL;
    if (!plan)
        return cpc_error(CPC_E_INTERNAL, "schedule: no plan");
    cpc_status *st = check_candidate(plan, variant, ring_degree, ulysses_degree);
    if (st)
        return st;
    cpc_layout L;
    st = cpc_layout_init(&L, plan, variant, ring_degree, ulysses_degree);
    if (st)
        return st;
    builder bd = {.prog = cpc_program_new(&L, plan->schedule.overlap, plan->schedule.rotate)};
    builder *b = &bd;
    if (!b->prog)
        return &cpc_status_oom;
    oplist top = {&b->prog->ops, &b->prog->n_ops};

    const int U = L.U;
    const bool ring = variant != CPC_VARIANT_NONE && variant != CPC_VARIANT_ULYSSES &&
                      variant != CPC_VARIANT_ULYSSES_ANYTHING && !L.cross;
    const bool uly = U > 1;
    const bool p2p = plan->schedule.rotate == CPC_ROTATE_P2P;
    /* Rows/heads of the query side after the ulysses all-to-all. */
    const cpc_buf_tokens qt = uly ? CPC_TOK_BLOCK : CPC_TOK_SHARD;
    const cpc_buf_heads qh = uly ? CPC_HEADS_PART : CPC_HEADS_ALL;

    /* Inputs. */
    int q = buf(b, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int k = -1, v = -1;
    if (L.cross) {
        k = buf(b, "k", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = buf(b, "v", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    } else if (ring && !uly && p2p) {
        k = buf(b, "k_cur", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = buf(b, "v_cur", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    } else if (ring && !uly) {
        k = buf(b, "k", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = buf(b, "v", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    } else {
        k = buf(b, "k", CPC_ROLE_K, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = buf(b, "v", CPC_ROLE_V, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    }

    /* Replicated segments: whole on every rank (KV layout), never sent;
     * with ulysses each member uses its own heads of them. */
    repbufs x = {-1, -1, -1, -1, -1, -1, -1};
    int q_rep = -1;
    if (L.rep) {
        q_rep = buf(b, "q_rep", CPC_ROLE_Q, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
        x.k = buf(b, "k_rep", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
        x.v = buf(b, "v_rep", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
        x.q = q_rep;
        if (uly) {
            int k_in = x.k, v_in = x.v;
            x.q = buf(b, "q_rep_part", CPC_ROLE_Q, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            x.k = buf(b, "k_rep_part", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            x.v = buf(b, "v_rep_part", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            copy(b, top, q_rep, x.q);
            copy(b, top, k_in, x.k);
            copy(b, top, v_in, x.v);
        }
        x.acc = buf(b, "acc_rep", CPC_ROLE_ACC, CPC_TOK_KV, qh, CPC_IO_NONE);
        x.lse = buf(b, "lse_rep", CPC_ROLE_LSE, CPC_TOK_KV, qh, CPC_IO_NONE);
        x.o_blk = buf(b, "o_rep_blk", CPC_ROLE_ACC, CPC_TOK_KV, qh, CPC_IO_NONE);
        x.lse_blk = buf(b, "lse_rep_blk", CPC_ROLE_LSE, CPC_TOK_KV, qh, CPC_IO_NONE);
    }

    /* Query side of attention. */
    int qa = q;
    if (uly) {
        qa = buf(b, "q_seq", CPC_ROLE_Q, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        a2a(b, top, CPC_A2A_SEQ_TO_HEADS, q, qa);
    }

    int acc = -1, lse = -1;
    if (L.cross || !ring) {
        /* One local attention block: cross-attention (any variant), none,
         * ulysses. */
        int ka = k, va = v;
        if (uly && L.cross) {
            ka = buf(b, "k_part", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            va = buf(b, "v_part", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            copy(b, top, k, ka);
            copy(b, top, v, va);
        } else if (uly) {
            ka = buf(b, "k_seq", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
            va = buf(b, "v_seq", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
            a2a(b, top, CPC_A2A_SEQ_TO_HEADS, k, ka);
            a2a(b, top, CPC_A2A_SEQ_TO_HEADS, v, va);
        }
        acc = buf(b, "acc", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        lse = buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        if (L.rep) {
            /* two key sets (the replicated ones, then the sharded block),
             * merged into one accumulator per query side */
            int o_blk = buf(b, "o_blk", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
            int lse_blk = buf(b, "lse_blk", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
            init_acc(b, top, acc, lse);
            rep_local(b, top, &x, qa, o_blk, lse_blk, acc, lse);
            attn(b, top, qa, ka, va, o_blk, lse_blk, NULL);
            merge(b, top, o_blk, lse_blk, acc, lse);
            rep_block(b, top, &x, ka, va, NULL);
        } else {
            attn(b, top, qa, ka, va, acc, lse, NULL);
        }
    } else if (p2p) {
        int k_cur = k, v_cur = v;
        if (uly) {
            k_cur = buf(b, "k_cur", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
            v_cur = buf(b, "v_cur", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
            a2a(b, top, CPC_A2A_SEQ_TO_HEADS, k, k_cur);
            a2a(b, top, CPC_A2A_SEQ_TO_HEADS, v, v_cur);
        }
        int k_nxt = buf(b, "k_nxt", CPC_ROLE_K, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int v_nxt = buf(b, "v_nxt", CPC_ROLE_V, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int o_blk = buf(b, "o_blk", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        int lse_blk = buf(b, "lse_blk", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        acc = buf(b, "acc", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        lse = buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        ring_p2p_loop(b, top, plan->schedule.overlap, qa, k_cur, v_cur, k_nxt, v_nxt, o_blk, lse_blk,
                      acc, lse, &x);
    } else {
        int k_blk = k, v_blk = v;
        if (uly) {
            k_blk = buf(b, "k_blk", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
            v_blk = buf(b, "v_blk", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
            a2a(b, top, CPC_A2A_SEQ_TO_HEADS, k, k_blk);
            a2a(b, top, CPC_A2A_SEQ_TO_HEADS, v, v_blk);
        }
        int k_all = buf(b, "k_all", CPC_ROLE_K, CPC_TOK_ALL, qh, CPC_IO_NONE);
        int v_all = buf(b, "v_all", CPC_ROLE_V, CPC_TOK_ALL, qh, CPC_IO_NONE);
        all_gather(b, top, k_blk, k_all);
        all_gather(b, top, v_blk, v_all);
        int o_blk = buf(b, "o_blk", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        int lse_blk = buf(b, "lse_blk", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        acc = buf(b, "acc", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        lse = buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        ring_allgather_loop(b, top, qa, k_all, v_all, o_blk, lse_blk, acc, lse, &x);
    }

    /* Output. */
    if (uly) {
        int o_seq = buf(b, "o_seq", CPC_ROLE_O, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        int o = buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        copy(b, top, acc, o_seq);
        a2a(b, top, CPC_A2A_HEADS_TO_SEQ, o_seq, o);
    } else {
        int o = buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        copy(b, top, acc, o);
    }

    /* The replicated rows' output: whole on every rank, every head (with
     * ulysses each member computed its heads: heads_to_seq of KV rows sends
     * them to every member). */
    if (L.rep) {
        int o_rep = buf(b, "out_rep", CPC_ROLE_O, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        if (uly) {
            int o_part = buf(b, "o_rep_part", CPC_ROLE_O, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            copy(b, top, x.acc, o_part);
            a2a(b, top, CPC_A2A_HEADS_TO_SEQ, o_part, o_rep);
        } else {
            copy(b, top, x.acc, o_rep);
        }
    }

    if (b->err) {
        cpc_program_free(b->prog);
        return b->err;
    }
    *out = b->prog;
    return NULL;
}
