/* schedule.c - builds one SPMD op program per candidate; see schedule.h for
 * the programs and program.h for the meaning of every op. */
#include "schedule.h"

#include "schedule_build.h"

static void attn(cpc_sb *b, cpc_sb_list l, int q, int k, int v, int o, int lse, const char *block)
{
    cpc_sb_block(b, cpc_sb_op(b, l, CPC_OP_ATTN, NULL, CPC_BUFS(q, k, v), CPC_BUFS(o, lse)), block);
}

static void merge(cpc_sb *b, cpc_sb_list l, int o_blk, int lse_blk, int acc, int lse)
{
    cpc_sb_op(b, l, CPC_OP_MERGE, NULL, CPC_BUFS(o_blk, lse_blk), CPC_BUFS(acc, lse));
}

static void init_acc(cpc_sb *b, cpc_sb_list l, int acc, int lse)
{
    cpc_sb_op(b, l, CPC_OP_INIT_ACC, NULL, NULL, CPC_BUFS(acc, lse));
}

/* With ulysses: declares `name` (role, ring block r x this member's heads)
 * and fills it from `in` (the rank's shard, every head) by all_to_all
 * seq_to_heads; its buffer index (-1 after a builder error). */
static int heads_part(cpc_sb *b, cpc_sb_list l, int in, const char *name, cpc_buf_role role)
{
    int part = cpc_sb_buf(b, name, role, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
    cpc_sb_to_heads(b, l, in, part);
    return part;
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
static void rep_local(cpc_sb *b, cpc_sb_list l, const repbufs *x, int q, int o_blk, int lse_blk, int acc,
                      int lse)
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
static void rep_block(cpc_sb *b, cpc_sb_list l, const repbufs *x, int k, int v, const char *block)
{
    if (x->q < 0)
        return;
    attn(b, l, x->q, k, v, x->o_blk, x->lse_blk, block);
    merge(b, l, x->o_blk, x->lse_blk, x->acc, x->lse);
}

/* The ring loop (p2p) over K/V blocks k_cur/v_cur, double-buffered. */
static void ring_p2p_loop(cpc_sb *b, cpc_sb_list top, bool overlap, int q, int k_cur, int v_cur, int k_nxt,
                          int v_nxt, int o_blk, int lse_blk, int acc, int lse, const repbufs *x)
{
    init_acc(b, top, acc, lse);
    rep_local(b, top, x, q, o_blk, lse_blk, acc, lse);
    cpc_sb_list body = cpc_sb_loop(b, top, "R");
    cpc_sb_kv_post(b, body, k_cur, v_cur, k_nxt, v_nxt);
    if (!overlap)
        cpc_sb_wait(b, body, 0, CPC_SB_MORE);
    attn(b, body, q, k_cur, v_cur, o_blk, lse_blk, NULL);
    merge(b, body, o_blk, lse_blk, acc, lse);
    rep_block(b, body, x, k_cur, v_cur, NULL);
    if (overlap)
        cpc_sb_wait(b, body, 0, CPC_SB_MORE);
    cpc_sb_kv_swap(b, body, k_cur, v_cur, k_nxt, v_nxt);
}

/* The ring loop (allgather): attention over the gathered blocks in the same
 * order as p2p. */
static void ring_allgather_loop(cpc_sb *b, cpc_sb_list top, int q, int k_all, int v_all, int o_blk,
                                int lse_blk, int acc, int lse, const repbufs *x)
{
    init_acc(b, top, acc, lse);
    rep_local(b, top, x, q, o_blk, lse_blk, acc, lse);
    cpc_sb_list body = cpc_sb_loop(b, top, "R");
    attn(b, body, q, k_all, v_all, o_blk, lse_blk, "(r-s)%R");
    merge(b, body, o_blk, lse_blk, acc, lse);
    rep_block(b, body, x, k_all, v_all, "(r-s)%R");
}

cpc_status *cpc_schedule_build(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                               int ulysses_degree, cpc_program **out)
{
    *out = NULL;
    if (!plan)
        return cpc_error(CPC_E_INTERNAL, "schedule: no plan");
    cpc_status *st = cpc_sb_check_candidate(plan, variant, ring_degree, ulysses_degree, "schedule");
    if (st)
        return st;
    cpc_layout L;
    st = cpc_layout_init(&L, plan, variant, ring_degree, ulysses_degree);
    if (st)
        return st;
    cpc_sb bd, *b = &bd;
    cpc_sb_init(b, &L, plan->schedule.overlap, plan->schedule.rotate, "schedule");
    cpc_sb_list top = cpc_sb_top(b);

    const int U = L.U;
    const bool ring = variant != CPC_VARIANT_NONE && variant != CPC_VARIANT_ULYSSES &&
                      variant != CPC_VARIANT_ULYSSES_ANYTHING && !L.cross;
    const bool uly = U > 1;
    const bool p2p = plan->schedule.rotate == CPC_ROTATE_P2P;
    /* Rows/heads of the query side after the ulysses all-to-all. */
    const cpc_buf_tokens qt = uly ? CPC_TOK_BLOCK : CPC_TOK_SHARD;
    const cpc_buf_heads qh = uly ? CPC_HEADS_PART : CPC_HEADS_ALL;

    /* Inputs. */
    int q = cpc_sb_buf(b, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    int k = -1, v = -1;
    if (L.cross) {
        k = cpc_sb_buf(b, "k", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = cpc_sb_buf(b, "v", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
    } else if (ring && !uly && p2p) {
        k = cpc_sb_buf(b, "k_cur", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = cpc_sb_buf(b, "v_cur", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    } else if (ring && !uly) {
        k = cpc_sb_buf(b, "k", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = cpc_sb_buf(b, "v", CPC_ROLE_V, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_INPUT);
    } else {
        k = cpc_sb_buf(b, "k", CPC_ROLE_K, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
        v = cpc_sb_buf(b, "v", CPC_ROLE_V, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT);
    }

    /* Replicated segments: whole on every rank (KV layout), never sent;
     * with ulysses each member uses its own heads of them. */
    repbufs x = {-1, -1, -1, -1, -1, -1, -1};
    int q_rep = -1;
    if (L.rep) {
        q_rep = cpc_sb_buf(b, "q_rep", CPC_ROLE_Q, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
        x.k = cpc_sb_buf(b, "k_rep", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
        x.v = cpc_sb_buf(b, "v_rep", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_INPUT);
        x.q = q_rep;
        if (uly) {
            int k_in = x.k, v_in = x.v;
            x.q = cpc_sb_buf(b, "q_rep_part", CPC_ROLE_Q, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            x.k = cpc_sb_buf(b, "k_rep_part", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            x.v = cpc_sb_buf(b, "v_rep_part", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            cpc_sb_copy(b, top, q_rep, x.q);
            cpc_sb_copy(b, top, k_in, x.k);
            cpc_sb_copy(b, top, v_in, x.v);
        }
        x.acc = cpc_sb_buf(b, "acc_rep", CPC_ROLE_ACC, CPC_TOK_KV, qh, CPC_IO_NONE);
        x.lse = cpc_sb_buf(b, "lse_rep", CPC_ROLE_LSE, CPC_TOK_KV, qh, CPC_IO_NONE);
        x.o_blk = cpc_sb_buf(b, "o_rep_blk", CPC_ROLE_ACC, CPC_TOK_KV, qh, CPC_IO_NONE);
        x.lse_blk = cpc_sb_buf(b, "lse_rep_blk", CPC_ROLE_LSE, CPC_TOK_KV, qh, CPC_IO_NONE);
    }

    /* Query side of attention. */
    int qa = q;
    if (uly) {
        qa = heads_part(b, top, q, "q_seq", CPC_ROLE_Q);
    }

    int acc = -1, lse = -1;
    if (L.cross || !ring) {
        /* One local attention block: cross-attention (any variant), none,
         * ulysses. */
        int ka = k, va = v;
        if (uly && L.cross) {
            ka = cpc_sb_buf(b, "k_part", CPC_ROLE_K, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            va = cpc_sb_buf(b, "v_part", CPC_ROLE_V, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            cpc_sb_copy(b, top, k, ka);
            cpc_sb_copy(b, top, v, va);
        } else if (uly) {
            ka = heads_part(b, top, k, "k_seq", CPC_ROLE_K);
            va = heads_part(b, top, v, "v_seq", CPC_ROLE_V);
        }
        acc = cpc_sb_buf(b, "acc", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        lse = cpc_sb_buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        if (L.rep) {
            /* two key sets (the replicated ones, then the sharded block),
             * merged into one accumulator per query side */
            int o_blk = cpc_sb_buf(b, "o_blk", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
            int lse_blk = cpc_sb_buf(b, "lse_blk", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
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
            k_cur = heads_part(b, top, k, "k_cur", CPC_ROLE_K);
            v_cur = heads_part(b, top, v, "v_cur", CPC_ROLE_V);
        }
        int k_nxt = cpc_sb_buf(b, "k_nxt", CPC_ROLE_K, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int v_nxt = cpc_sb_buf(b, "v_nxt", CPC_ROLE_V, CPC_TOK_BLOCK, qh, CPC_IO_NONE);
        int o_blk = cpc_sb_buf(b, "o_blk", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        int lse_blk = cpc_sb_buf(b, "lse_blk", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        acc = cpc_sb_buf(b, "acc", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        lse = cpc_sb_buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        ring_p2p_loop(b, top, plan->schedule.overlap, qa, k_cur, v_cur, k_nxt, v_nxt, o_blk, lse_blk,
                      acc, lse, &x);
    } else {
        int k_blk = k, v_blk = v;
        if (uly) {
            k_blk = heads_part(b, top, k, "k_blk", CPC_ROLE_K);
            v_blk = heads_part(b, top, v, "v_blk", CPC_ROLE_V);
        }
        int k_all = cpc_sb_buf(b, "k_all", CPC_ROLE_K, CPC_TOK_ALL, qh, CPC_IO_NONE);
        int v_all = cpc_sb_buf(b, "v_all", CPC_ROLE_V, CPC_TOK_ALL, qh, CPC_IO_NONE);
        cpc_sb_coll(b, top, CPC_OP_ALL_GATHER, CPC_GROUP_RING, 2, CPC_BUFS(k_blk, v_blk),
                    CPC_BUFS(k_all, v_all));
        int o_blk = cpc_sb_buf(b, "o_blk", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        int lse_blk = cpc_sb_buf(b, "lse_blk", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        acc = cpc_sb_buf(b, "acc", CPC_ROLE_ACC, qt, qh, CPC_IO_NONE);
        lse = cpc_sb_buf(b, "lse", CPC_ROLE_LSE, qt, qh, CPC_IO_NONE);
        ring_allgather_loop(b, top, qa, k_all, v_all, o_blk, lse_blk, acc, lse, &x);
    }

    /* Output. */
    if (uly) {
        int o_seq = cpc_sb_buf(b, "o_seq", CPC_ROLE_O, CPC_TOK_BLOCK, CPC_HEADS_PART, CPC_IO_NONE);
        int o = cpc_sb_buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        cpc_sb_copy(b, top, acc, o_seq);
        cpc_sb_a2a(b, top, CPC_A2A_HEADS_TO_SEQ, o_seq, o, false);
    } else {
        int o = cpc_sb_buf(b, "out", CPC_ROLE_O, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        cpc_sb_copy(b, top, acc, o);
    }

    /* The replicated rows' output: whole on every rank, every head (with
     * ulysses each member computed its heads: heads_to_seq of KV rows sends
     * them to every member). */
    if (L.rep) {
        int o_rep = cpc_sb_buf(b, "out_rep", CPC_ROLE_O, CPC_TOK_KV, CPC_HEADS_ALL, CPC_IO_OUTPUT);
        if (uly) {
            int o_part = cpc_sb_buf(b, "o_rep_part", CPC_ROLE_O, CPC_TOK_KV, CPC_HEADS_PART, CPC_IO_NONE);
            cpc_sb_copy(b, top, x.acc, o_part);
            cpc_sb_a2a(b, top, CPC_A2A_HEADS_TO_SEQ, o_part, o_rep, false);
        } else {
            cpc_sb_copy(b, top, x.acc, o_rep);
        }
    }

    return cpc_sb_finish(b, out);
}
