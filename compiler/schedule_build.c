/* schedule_build.c - the program builder of both schedulers; see
 * schedule_build.h. */
#include "schedule_build.h"

static void oom(cpc_sb *b)
{
    if (!b->err)
        b->err = &cpc_status_oom;
}

void cpc_sb_init(cpc_sb *b, const cpc_layout *L, bool overlap, cpc_rotate rotate, const char *who)
{
    b->prog = cpc_program_new(L, overlap, rotate);
    b->err = b->prog ? NULL : &cpc_status_oom;
    b->who = who;
}

cpc_sb_list cpc_sb_top(cpc_sb *b)
{
    if (!b->prog)
        return (cpc_sb_list){NULL, NULL};
    return (cpc_sb_list){&b->prog->ops, &b->prog->n_ops};
}

cpc_status *cpc_sb_finish(cpc_sb *b, cpc_program **out)
{
    *out = NULL;
    if (b->err) {
        cpc_program_free(b->prog);
        b->prog = NULL;
        return b->err;
    }
    *out = b->prog;
    b->prog = NULL;
    return NULL;
}

int cpc_sb_buf(cpc_sb *b, const char *name, cpc_buf_role role, cpc_buf_tokens tokens, cpc_buf_heads heads,
               cpc_buf_io io)
{
    if (b->err)
        return -1;
    int i = cpc_program_add_buffer(b->prog, name, role, tokens, heads, io);
    if (i < 0)
        oom(b);
    return i;
}

void cpc_sb_expr(cpc_sb *b, cpc_expr **slot, const char *text)
{
    if (b->err)
        return;
    cpc_status *st = cpc_expr_parse(text, CPC_NO_SPAN, slot);
    if (st) {
        cpc_status_prefix(st, "%s (internal)", b->who);
        if (st != &cpc_status_oom)
            st->code = CPC_E_INTERNAL;
        b->err = st;
    }
}

static int fill(int *dst, const int *src)
{
    int n = 0;
    for (; src && src[n] >= 0 && n < CPC_OP_MAX_BUFS; n++)
        dst[n] = src[n];
    return n;
}

cpc_op *cpc_sb_op(cpc_sb *b, cpc_sb_list l, cpc_op_kind kind, const char *when, const int *in, const int *out)
{
    if (b->err)
        return NULL;
    cpc_op *op = cpc_ops_append(l.ops, l.n, kind);
    if (!op) {
        oom(b);
        return NULL;
    }
    op->n_in = fill(op->in, in);
    op->n_out = fill(op->out, out);
    if (when)
        cpc_sb_expr(b, &op->when, when);
    return b->err ? NULL : op;
}

void cpc_sb_block(cpc_sb *b, cpc_op *op, const char *text)
{
    if (op && text)
        cpc_sb_expr(b, &op->block, text);
}

cpc_sb_list cpc_sb_loop(cpc_sb *b, cpc_sb_list l, const char *count)
{
    cpc_op *loop = cpc_sb_op(b, l, CPC_OP_LOOP, NULL, NULL, NULL);
    if (!loop)
        return (cpc_sb_list){NULL, NULL};
    cpc_sb_expr(b, &loop->count, count);
    return (cpc_sb_list){&loop->body, &loop->n_body};
}

void cpc_sb_a2a(cpc_sb *b, cpc_sb_list l, cpc_a2a_dir dir, int in, int out, bool reduce)
{
    cpc_op *op = cpc_sb_op(b, l, CPC_OP_ALL_TO_ALL, NULL, CPC_BUFS(in), CPC_BUFS(out));
    if (!op)
        return;
    op->group = CPC_GROUP_ULYSSES;
    op->dir = dir;
    op->reduce = reduce;
}

void cpc_sb_to_heads(cpc_sb *b, cpc_sb_list l, int in, int out)
{
    cpc_sb_a2a(b, l, CPC_A2A_SEQ_TO_HEADS, in, out, false);
}

void cpc_sb_coll(cpc_sb *b, cpc_sb_list l, cpc_op_kind kind, cpc_group group, int n, const int *in,
                 const int *out)
{
    for (int i = 0; i < n; i++) {
        cpc_op *op = cpc_sb_op(b, l, kind, NULL, CPC_BUFS(in[i]), CPC_BUFS(out[i]));
        if (op)
            op->group = group;
    }
}

void cpc_sb_copy(cpc_sb *b, cpc_sb_list l, int in, int out)
{
    cpc_sb_op(b, l, CPC_OP_COPY, NULL, CPC_BUFS(in), CPC_BUFS(out));
}

void cpc_sb_ring_p2p(cpc_sb *b, cpc_sb_list l, bool send, int tag, const char *when, int x, int y,
                     const char *block)
{
    const int *xy = CPC_BUFS(x, y);
    cpc_op *op = cpc_sb_op(b, l, send ? CPC_OP_SEND : CPC_OP_RECV, when, send ? xy : NULL, send ? NULL : xy);
    if (!op)
        return;
    op->group = CPC_GROUP_RING;
    op->tag = tag;
    cpc_sb_expr(b, &op->peer, send ? "(r+1)%R" : "(r-1)%R");
    cpc_sb_block(b, op, block);
}

void cpc_sb_kv_post(cpc_sb *b, cpc_sb_list body, int k, int v, int k_nxt, int v_nxt)
{
    cpc_sb_ring_p2p(b, body, true, 0, CPC_SB_MORE, k, v, NULL);
    cpc_sb_ring_p2p(b, body, false, 0, CPC_SB_MORE, k_nxt, v_nxt, "(r-s-1)%R");
}

void cpc_sb_kv_swap(cpc_sb *b, cpc_sb_list body, int k, int v, int k_nxt, int v_nxt)
{
    cpc_sb_swap(b, body, k, k_nxt, CPC_SB_MORE);
    cpc_sb_swap(b, body, v, v_nxt, CPC_SB_MORE);
}

void cpc_sb_wait(cpc_sb *b, cpc_sb_list l, int tag, const char *when)
{
    cpc_op *op = cpc_sb_op(b, l, CPC_OP_WAIT, when, NULL, NULL);
    if (op)
        op->tag = tag;
}

void cpc_sb_swap(cpc_sb *b, cpc_sb_list l, int x, int y, const char *when)
{
    cpc_sb_op(b, l, CPC_OP_SWAP, when, CPC_BUFS(x, y), NULL);
}

cpc_status *cpc_sb_check_candidate(const cpc_plan *plan, cpc_variant v, int R, int U, const char *who)
{
    if ((int)v < 0 || v >= CPC_VARIANT__COUNT || v == CPC_VARIANT_AUTO)
        return cpc_error(CPC_E_INTERNAL, "%s: variant must be resolved (got %d)", who, (int)v);
    const char *name = cpc_variant_name(v);
    if (R < 1 || U < 1)
        return cpc_error(CPC_E_INTERNAL, "%s: %s with ring_degree %d, ulysses_degree %d", who, name, R, U);
    bool ring = v == CPC_VARIANT_RING || v == CPC_VARIANT_RING_ANYTHING;
    bool uly = v == CPC_VARIANT_ULYSSES || v == CPC_VARIANT_ULYSSES_ANYTHING;
    if (ring && U != 1)
        return cpc_error(CPC_E_INTERNAL, "%s: %s needs ulysses_degree 1 (got %d)", who, name, U);
    if (uly && R != 1)
        return cpc_error(CPC_E_INTERNAL, "%s: %s needs ring_degree 1 (got %d)", who, name, R);
    if (v == CPC_VARIANT_NONE && (R != 1 || U != 1))
        return cpc_error(CPC_E_INTERNAL, "%s: none needs ring_degree = ulysses_degree = 1", who);
    if ((int64_t)R * U != plan->cluster.world_size)
        return cpc_error(CPC_E_INTERNAL, "%s: %s %dx%d does not match world_size %d", who, name, R, U,
                         plan->cluster.world_size);
    return NULL;
}
