/* test_schedule.c - the scheduler (compiler/schedule.h) and the op program
 * container (compiler/ir/program.h): every variant builds, the programs are
 * correct when simulated rank by rank (messages match, every K/V block is
 * seen exactly once), their size does not grow with world_size, the text
 * form is stable, and memory / bytes sent match hand-computed numbers. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

/* ---- plans filled by hand (plan_load/plan.c are tested elsewhere) ---- */

static cpc_plan *mk_plan(int H, int Hkv, int D, cpc_dtype dt, int B, int P, const int64_t *seg,
                         int n_seg)
{
    cpc_plan *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    p->file = strdup("test.yaml");
    p->name = strdup("test");
    p->version = 1;
    p->model.heads = H;
    p->model.kv_heads = Hkv;
    p->model.head_dim = D;
    p->model.dtype = dt;
    p->model.layers = 1;
    p->input.batch = B;
    p->input.n_segments = n_seg;
    p->input.segments = calloc((size_t)n_seg, sizeof *p->input.segments);
    cr_assert_not_null(p->input.segments);
    for (int i = 0; i < n_seg; i++) {
        p->input.segments[i].name = strdup(i == 0 && n_seg > 1 ? "text" : "image");
        p->input.segments[i].tokens = seg[i];
        p->input.total_tokens += seg[i];
    }
    p->cluster.world_size = P;
    p->schedule.overlap = true;
    p->schedule.rotate = CPC_ROTATE_P2P;
    return p;
}

static void free_plan(cpc_plan *p)
{
    for (int i = 0; i < p->input.n_segments; i++)
        free(p->input.segments[i].name);
    free(p->input.segments);
    free(p->file);
    free(p->name);
    free(p);
}

static cpc_program *build(const cpc_plan *plan, cpc_variant v, int R, int U)
{
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build(plan, v, R, U, &prog);
    cr_assert_null(st, "build %s %dx%d: %s", cpc_variant_name(v), R, U, st ? st->message : "");
    cr_assert_not_null(prog);
    return prog;
}

static char *print_str(const cpc_program *prog, int rank)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cpc_status *st = cpc_program_print(f, prog, rank);
    cr_assert_null(st, "print: %s", st ? st->message : "");
    fclose(f);
    return buf;
}

static int count_ops(const cpc_op *ops, int n)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += 1 + count_ops(ops[i].body, ops[i].n_body);
    return c;
}

/* ---- a small simulation of all ranks (a mini verifier) -------------------- */

#define MAXR 64
#define MAXMSG 4096

typedef struct msg {
    int src, dst, tag;
    int n;
    int content[CPC_OP_MAX_BUFS];  /* content tags of the sent buffers */
    int64_t rows[CPC_OP_MAX_BUFS];
    bool taken;
} msg;

typedef struct sim {
    const cpc_program *prog;
    int rank;
    msg *msgs;
    int n_msgs;
    int seen[MAXR];        /* attn K/V blocks seen by this rank */
    int n_attn;
    int n_recv_checked;
    int pending;           /* outstanding send/recv not yet waited */
} sim;

static int flat_peer(const cpc_program *prog, const cpc_exec_op *x)
{
    const cpc_layout *L = &prog->layout;
    if (x->op->group == CPC_GROUP_RING)
        return (int)(x->peer * L->U + x->c.u);
    if (x->op->group == CPC_GROUP_ULYSSES)
        return (int)(x->c.r * L->U + x->peer);
    return (int)x->peer;
}

static cpc_status *collect_sends(void *ctx, const cpc_exec_op *x)
{
    sim *s = ctx;
    if (x->op->kind != CPC_OP_SEND)
        return NULL;
    cr_assert_lt(s->n_msgs, MAXMSG);
    msg *m = &s->msgs[s->n_msgs++];
    memset(m, 0, sizeof *m);
    m->src = s->rank;
    m->dst = flat_peer(s->prog, x);
    m->tag = x->op->tag;
    m->n = x->op->n_in;
    for (int i = 0; i < m->n; i++) {
        int b = x->op->in[i];
        m->content[i] = x->tags[b];
        m->rows[i] = cpc_buffer_rows(s->prog, b, &x->c, x->tags[b]);
    }
    return NULL;
}

static cpc_status *check_rank(void *ctx, const cpc_exec_op *x)
{
    sim *s = ctx;
    const cpc_program *prog = s->prog;
    const cpc_op *op = x->op;
    switch (op->kind) {
    case CPC_OP_RECV: {
        int src = flat_peer(prog, x);
        msg *m = NULL;
        for (int i = 0; i < s->n_msgs; i++)
            if (!s->msgs[i].taken && s->msgs[i].src == src && s->msgs[i].dst == s->rank &&
                s->msgs[i].tag == op->tag) {
                m = &s->msgs[i];
                break;
            }
        cr_assert_not_null(m, "rank %d step %lld: recv from %d has no matching send", s->rank,
                           (long long)x->c.s, src);
        m->taken = true;
        cr_assert_eq(m->n, op->n_out);
        for (int i = 0; i < m->n; i++) {
            cr_assert_eq(m->content[i], (int)x->block,
                         "rank %d step %lld: recv says block %lld, sender sent block %d", s->rank,
                         (long long)x->c.s, (long long)x->block, m->content[i]);
            cr_assert_eq(m->rows[i], cpc_buffer_rows(prog, op->out[i], &x->c, (int)x->block));
        }
        s->n_recv_checked++;
        s->pending++;
        break;
    }
    case CPC_OP_SEND:
        s->pending++;
        break;
    case CPC_OP_WAIT:
        s->pending = 0;
        break;
    case CPC_OP_ATTN: {
        int kb = op->in[1];
        const cpc_buffer *K = &prog->buffers[kb];
        int blk;
        if (K->tokens == CPC_TOK_BLOCK)
            blk = x->tags[kb];
        else if (K->tokens == CPC_TOK_ALL && op->block)
            blk = (int)x->block;
        else
            break; /* KV / SHARD: one local block */
        cr_assert_eq(x->tags[kb], x->tags[op->in[2]], "K and V must hold the same block");
        cr_assert(blk >= 0 && blk < prog->layout.R);
        s->seen[blk]++;
        s->n_attn++;
        /* Double buffering: attention never reads a buffer being received. */
        break;
    }
    default:
        break;
    }
    return NULL;
}

/* Simulates every rank: messages match in FIFO order per (src, dst, tag)
 * with the content the receiver expects, every K/V block is attended
 * exactly once per rank, every send is received, nothing left pending. */
static void simulate(const cpc_program *prog)
{
    const cpc_layout *L = &prog->layout;
    cr_assert_leq(L->P, MAXR);
    msg *msgs = calloc(MAXMSG, sizeof *msgs);
    int n_msgs = 0;
    for (int p = 0; p < L->P; p++) {
        sim s = {.prog = prog, .rank = p, .msgs = msgs, .n_msgs = n_msgs};
        cpc_status *st = cpc_program_walk(prog, p, collect_sends, &s);
        cr_assert_null(st, "walk: %s", st ? st->message : "");
        n_msgs = s.n_msgs;
    }
    for (int p = 0; p < L->P; p++) {
        sim s = {.prog = prog, .rank = p, .msgs = msgs, .n_msgs = n_msgs};
        cpc_status *st = cpc_program_walk(prog, p, check_rank, &s);
        cr_assert_null(st, "walk: %s", st ? st->message : "");
        cr_assert_eq(s.pending, 0, "rank %d ends with unwaited send/recv", p);
        if (s.n_attn > 0)
            for (int b = 0; b < L->R; b++)
                cr_assert_eq(s.seen[b], 1, "rank %d attends block %d %d times", p, b, s.seen[b]);
    }
    for (int i = 0; i < n_msgs; i++)
        cr_assert(msgs[i].taken, "send %d -> %d never received", msgs[i].src, msgs[i].dst);
    free(msgs);
}

/* ---- tests ------------------------------------------------------------------ */

Test(schedule, names)
{
    for (int k = 0; k < CPC_OP__COUNT; k++)
        cr_assert_eq(cpc_op_kind_parse(cpc_op_kind_name((cpc_op_kind)k)), k);
    for (int k = 0; k < CPC_GROUP__COUNT; k++)
        cr_assert_eq(cpc_group_parse(cpc_group_name((cpc_group)k)), k);
    for (int k = 0; k < CPC_ROLE__COUNT; k++)
        cr_assert_eq(cpc_buf_role_parse(cpc_buf_role_name((cpc_buf_role)k)), k);
    for (int k = 0; k < CPC_TOK__COUNT; k++)
        cr_assert_eq(cpc_buf_tokens_parse(cpc_buf_tokens_name((cpc_buf_tokens)k)), k);
    for (int k = 0; k < CPC_HEADS__COUNT; k++)
        cr_assert_eq(cpc_buf_heads_parse(cpc_buf_heads_name((cpc_buf_heads)k)), k);
    for (int k = 0; k < CPC_IO__COUNT; k++)
        cr_assert_eq(cpc_buf_io_parse(cpc_buf_io_name((cpc_buf_io)k)), k);
    for (int k = 0; k < CPC_A2A__COUNT; k++)
        cr_assert_eq(cpc_a2a_dir_parse(cpc_a2a_dir_name((cpc_a2a_dir)k)), k);
    cr_assert_str_eq(cpc_op_kind_name(CPC_OP_ALL_TO_ALL), "all_to_all");
    cr_assert_str_eq(cpc_op_kind_name(CPC_OP_INIT_ACC), "init_acc");
    cr_assert_eq(cpc_op_kind_parse("pad"), -1);
    cr_assert_eq(cpc_group_parse(NULL), -1);
    cr_assert_str_eq(cpc_op_kind_name((cpc_op_kind)99), "?");
}

Test(schedule, buffers)
{
    cpc_program *p = cpc_program_new(NULL, true, CPC_ROTATE_P2P);
    cr_assert_eq(cpc_program_add_buffer(p, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_INPUT), 0);
    cr_assert_eq(cpc_program_add_buffer(p, "k_cur", CPC_ROLE_K, CPC_TOK_BLOCK, CPC_HEADS_ALL, CPC_IO_NONE), 1);
    cr_assert_eq(cpc_program_add_buffer(p, "q", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE), -1);
    cr_assert_eq(cpc_program_add_buffer(p, "", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE), -1);
    cr_assert_eq(cpc_program_add_buffer(p, "a b", CPC_ROLE_Q, CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE), -1);
    cr_assert_eq(cpc_program_add_buffer(p, "a_name_that_is_far_too_long_for_it", CPC_ROLE_Q,
                                        CPC_TOK_SHARD, CPC_HEADS_ALL, CPC_IO_NONE), -1);
    cr_assert_eq(cpc_program_add_buffer(p, "x", (cpc_buf_role)42, CPC_TOK_SHARD, CPC_HEADS_ALL,
                                        CPC_IO_NONE), -1);
    cr_assert_eq(cpc_program_find_buffer(p, "k_cur"), 1);
    cr_assert_eq(cpc_program_find_buffer(p, "k_nxt"), -1);
    cr_assert_eq(p->n_buffers, 2);
    cpc_op *op = cpc_ops_append(&p->ops, &p->n_ops, CPC_OP_LOOP);
    cr_assert_not_null(op);
    cr_assert_eq(op->n_in, 0);
    cr_assert_null(op->when);
    cr_assert_null(cpc_expr_parse("R", CPC_NO_SPAN, &op->count));
    cpc_op *b = cpc_ops_append(&op->body, &op->n_body, CPC_OP_WAIT);
    cr_assert_null(cpc_expr_parse("s<R-1", CPC_NO_SPAN, &b->when));
    cpc_program *c = NULL;
    cr_assert_null(cpc_program_clone(p, &c));
    cr_assert_eq(c->n_ops, 1);
    cr_assert_eq(c->ops[0].n_body, 1);
    cr_assert_neq(c->ops[0].body, p->ops[0].body);
    cr_assert_neq(c->ops[0].body[0].when, p->ops[0].body[0].when);
    cr_assert_str_eq(cpc_expr_text(c->ops[0].body[0].when), "s<R-1");
    cpc_program_free(p);
    cr_assert_str_eq(c->buffers[1].name, "k_cur"); /* independent of the original */
    cpc_program_free(c);
    cpc_program_free(NULL);
}

/* The stable text form of a small ulysses program. */
Test(schedule, print_ulysses)
{
    const int64_t seg[1] = {1024};
    cpc_plan *plan = mk_plan(8, 8, 64, CPC_DTYPE_BF16, 1, 4, seg, 1);
    cpc_program *prog = build(plan, CPC_VARIANT_ULYSSES, 1, 4);
    char *s = print_str(prog, -1);
    const char *want =
        "program variant=ulysses ring_degree=1 ulysses_degree=4 world_size=4 overlap=true rotate=p2p\n"
        "buffer q     role=q   tokens=shard heads=all  io=input\n"
        "buffer k     role=k   tokens=shard heads=all  io=input\n"
        "buffer v     role=v   tokens=shard heads=all  io=input\n"
        "buffer q_seq role=q   tokens=block heads=part io=none\n"
        "buffer k_seq role=k   tokens=block heads=part io=none\n"
        "buffer v_seq role=v   tokens=block heads=part io=none\n"
        "buffer acc   role=acc tokens=block heads=part io=none\n"
        "buffer lse   role=lse tokens=block heads=part io=none\n"
        "buffer o_seq role=o   tokens=block heads=part io=none\n"
        "buffer out   role=o   tokens=shard heads=all  io=output\n"
        "all_to_all group=ulysses dir=seq_to_heads in=q out=q_seq\n"
        "all_to_all group=ulysses dir=seq_to_heads in=k out=k_seq\n"
        "all_to_all group=ulysses dir=seq_to_heads in=v out=v_seq\n"
        "attn in=q_seq,k_seq,v_seq out=acc,lse\n"
        "copy in=acc out=o_seq\n"
        "all_to_all group=ulysses dir=heads_to_seq in=o_seq out=out\n";
    cr_assert_str_eq(s, want);
    free(s);
    /* One rank: capacities on that rank (T = 256 per shard, 1024 per block,
     * 2 heads of 8 per member, D = 64, bf16 / fp32 accumulators). */
    s = print_str(prog, 2);
    const char *want2 =
        "program variant=ulysses ring_degree=1 ulysses_degree=4 world_size=4 overlap=true rotate=p2p"
        " rank=2 r=0 u=2\n"
        "buffer q     role=q   tokens=shard heads=all  io=input  bytes=262144\n"
        "buffer k     role=k   tokens=shard heads=all  io=input  bytes=262144\n"
        "buffer v     role=v   tokens=shard heads=all  io=input  bytes=262144\n"
        "buffer q_seq role=q   tokens=block heads=part io=none   bytes=262144\n"
        "buffer k_seq role=k   tokens=block heads=part io=none   bytes=262144\n"
        "buffer v_seq role=v   tokens=block heads=part io=none   bytes=262144\n"
        "buffer acc   role=acc tokens=block heads=part io=none   bytes=524288\n"
        "buffer lse   role=lse tokens=block heads=part io=none   bytes=8192\n"
        "buffer o_seq role=o   tokens=block heads=part io=none   bytes=262144\n"
        "buffer out   role=o   tokens=shard heads=all  io=output bytes=262144\n"
        "all_to_all group=ulysses dir=seq_to_heads in=q out=q_seq\n"
        "all_to_all group=ulysses dir=seq_to_heads in=k out=k_seq\n"
        "all_to_all group=ulysses dir=seq_to_heads in=v out=v_seq\n"
        "attn in=q_seq,k_seq,v_seq out=acc,lse kv_block=0\n"
        "copy in=acc out=o_seq\n"
        "all_to_all group=ulysses dir=heads_to_seq in=o_seq out=out\n";
    cr_assert_str_eq(s, want2);
    free(s);
    cpc_program_free(prog);
    free_plan(plan);
}

/* The stable text form of a small ring program (p2p, overlap), SPMD and
 * unrolled for rank 1. */
Test(schedule, print_ring)
{
    const int64_t seg[1] = {1024};
    cpc_plan *plan = mk_plan(8, 8, 64, CPC_DTYPE_BF16, 1, 4, seg, 1);
    cpc_program *prog = build(plan, CPC_VARIANT_RING, 4, 1);
    char *s = print_str(prog, -1);
    const char *want =
        "program variant=ring ring_degree=4 ulysses_degree=1 world_size=4 overlap=true rotate=p2p\n"
        "buffer q       role=q   tokens=shard heads=all  io=input\n"
        "buffer k_cur   role=k   tokens=block heads=all  io=input\n"
        "buffer v_cur   role=v   tokens=block heads=all  io=input\n"
        "buffer k_nxt   role=k   tokens=block heads=all  io=none\n"
        "buffer v_nxt   role=v   tokens=block heads=all  io=none\n"
        "buffer o_blk   role=acc tokens=shard heads=all  io=none\n"
        "buffer lse_blk role=lse tokens=shard heads=all  io=none\n"
        "buffer acc     role=acc tokens=shard heads=all  io=none\n"
        "buffer lse     role=lse tokens=shard heads=all  io=none\n"
        "buffer out     role=o   tokens=shard heads=all  io=output\n"
        "init_acc out=acc,lse\n"
        "loop count=R\n"
        "  send group=ring peer=(r+1)%R in=k_cur,v_cur tag=0 when=s<R-1\n"
        "  recv group=ring peer=(r-1)%R out=k_nxt,v_nxt block=(r-s-1)%R tag=0 when=s<R-1\n"
        "  attn in=q,k_cur,v_cur out=o_blk,lse_blk\n"
        "  merge in=o_blk,lse_blk out=acc,lse\n"
        "  wait tag=0 when=s<R-1\n"
        "  swap in=k_cur,k_nxt when=s<R-1\n"
        "  swap in=v_cur,v_nxt when=s<R-1\n"
        "end\n"
        "copy in=acc out=out\n";
    cr_assert_str_eq(s, want);
    free(s);

    s = print_str(prog, 1);
    /* Rank 1: sends to 2, receives from 0 blocks 0, 3, 2 while attending
     * blocks 1, 0, 3, 2; the last step has no transfer. */
    const char *ops1 =
        "init_acc out=acc,lse\n"
        "send group=ring peer=2 in=k_cur,v_cur tag=0 step=0\n"
        "recv group=ring peer=0 out=k_nxt,v_nxt block=0 tag=0 step=0\n"
        "attn in=q,k_cur,v_cur out=o_blk,lse_blk kv_block=1 step=0\n"
        "merge in=o_blk,lse_blk out=acc,lse step=0\n"
        "wait tag=0 step=0\n"
        "swap in=k_cur,k_nxt step=0\n"
        "swap in=v_cur,v_nxt step=0\n"
        "send group=ring peer=2 in=k_cur,v_cur tag=0 step=1\n"
        "recv group=ring peer=0 out=k_nxt,v_nxt block=3 tag=0 step=1\n"
        "attn in=q,k_cur,v_cur out=o_blk,lse_blk kv_block=0 step=1\n"
        "merge in=o_blk,lse_blk out=acc,lse step=1\n"
        "wait tag=0 step=1\n"
        "swap in=k_cur,k_nxt step=1\n"
        "swap in=v_cur,v_nxt step=1\n"
        "send group=ring peer=2 in=k_cur,v_cur tag=0 step=2\n"
        "recv group=ring peer=0 out=k_nxt,v_nxt block=2 tag=0 step=2\n"
        "attn in=q,k_cur,v_cur out=o_blk,lse_blk kv_block=3 step=2\n"
        "merge in=o_blk,lse_blk out=acc,lse step=2\n"
        "wait tag=0 step=2\n"
        "swap in=k_cur,k_nxt step=2\n"
        "swap in=v_cur,v_nxt step=2\n"
        "attn in=q,k_cur,v_cur out=o_blk,lse_blk kv_block=2 step=3\n"
        "merge in=o_blk,lse_blk out=acc,lse step=3\n"
        "copy in=acc out=out\n";
    const char *body = strstr(s, "init_acc");
    cr_assert_not_null(body);
    cr_assert_str_eq(body, ops1);
    cr_assert(strstr(s, " rank=1 r=1 u=0\n"));
    cr_assert(strstr(s, "buffer k_nxt   role=k   tokens=block heads=all  io=none   bytes=262144\n"));
    free(s);

    /* Printing is deterministic, and a clone prints the same. */
    cpc_program *c = NULL;
    cr_assert_null(cpc_program_clone(prog, &c));
    char *a = print_str(prog, -1), *b = print_str(c, -1);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
    a = print_str(prog, 3);
    b = print_str(c, 3);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
    cpc_program_free(c);

    /* A rank outside the program is an error, not a crash. */
    cpc_status *st = cpc_program_print(stderr, prog, 4);
    cr_assert_not_null(st);
    cpc_status_free(st);
    cpc_program_free(prog);
    free_plan(plan);
}

/* overlap = false: the wait comes before the attention of the step. */
Test(schedule, no_overlap)
{
    const int64_t seg[1] = {1024};
    cpc_plan *plan = mk_plan(8, 8, 64, CPC_DTYPE_BF16, 1, 4, seg, 1);
    plan->schedule.overlap = false;
    cpc_program *prog = build(plan, CPC_VARIANT_RING, 4, 1);
    char *s = print_str(prog, -1);
    const char *w = strstr(s, "  wait tag=0");
    const char *a = strstr(s, "  attn ");
    cr_assert(w && a && w < a, "%s", s);
    cr_assert(strstr(s, "overlap=false"));
    free(s);
    simulate(prog);
    cpc_program_free(prog);
    free_plan(plan);
}

static const struct {
    cpc_variant v;
    int R, U;
} flux_candidates[] = {
    {CPC_VARIANT_ULYSSES, 1, 4},          {CPC_VARIANT_UNIFIED, 2, 2},
    {CPC_VARIANT_RING, 4, 1},             {CPC_VARIANT_ULYSSES_ANYTHING, 1, 4},
    {CPC_VARIANT_RING_ANYTHING, 4, 1},
};

/* FLUX.1-dev (24 heads x 128, bf16, 512 text tokens first) at 1024x1024
 * (4096 image tokens) and 1008x1008 (3969): every variant builds, in both
 * rotate modes and both overlap settings, and simulates correctly. */
Test(schedule, flux_every_variant)
{
    const int64_t res[2][2] = {{512, 4096}, {512, 3969}};
    for (int r = 0; r < 2; r++)
        for (size_t c = 0; c < sizeof flux_candidates / sizeof flux_candidates[0]; c++)
            for (int rot = 0; rot < 2; rot++)
                for (int ov = 0; ov < 2; ov++) {
                    cpc_plan *plan = mk_plan(24, 24, 128, CPC_DTYPE_BF16, 1, 4, res[r], 2);
                    plan->schedule.rotate = rot ? CPC_ROTATE_ALLGATHER : CPC_ROTATE_P2P;
                    plan->schedule.overlap = ov;
                    cpc_program *prog = build(plan, flux_candidates[c].v, flux_candidates[c].R,
                                              flux_candidates[c].U);
                    simulate(prog);
                    for (int p = 0; p < 4; p++) {
                        int64_t sent = -1, recvd = -1;
                        cr_assert_null(cpc_program_bytes_sent(prog, p, &sent, &recvd));
                        cr_assert_gt(sent, 0);
                        cr_assert_gt(recvd, 0);
                        cr_assert_gt(cpc_program_peak_bytes(prog, p), 0);
                    }
                    char *s = print_str(prog, -1);
                    cr_assert(strstr(s, cpc_variant_name(flux_candidates[c].v)));
                    free(s);
                    cpc_program_free(prog);
                    free_plan(plan);
                }
    /* World size 1: plain attention, no communication. */
    cpc_plan *plan = mk_plan(24, 24, 128, CPC_DTYPE_BF16, 1, 1, res[0], 2);
    cpc_program *prog = build(plan, CPC_VARIANT_NONE, 1, 1);
    char *s = print_str(prog, -1);
    cr_assert(strstr(s, "\nattn in=q,k,v out=acc,lse\ncopy in=acc out=out\n"), "%s", s);
    free(s);
    int64_t sent = -1;
    cr_assert_null(cpc_program_bytes_sent(prog, 0, &sent, NULL));
    cr_assert_eq(sent, 0);
    /* q, k, v, out: 4608 x 24 x 128 bf16; acc fp32; lse [24, 4608] fp32 */
    int64_t t = 4608LL * 24 * 128;
    cr_assert_eq(cpc_program_peak_bytes(prog, 0), 4 * t * 2 + t * 4 + 24 * 4608 * 4);
    cpc_program_free(prog);
    free_plan(plan);
}

/* Ring programs on many shapes: uneven blocks, zigzag, GQA, up to 8x8. */
Test(schedule, simulate_many)
{
    const int degrees[][2] = {{2, 1}, {3, 1}, {8, 1}, {2, 2}, {2, 4}, {4, 2}, {3, 3}, {8, 8}, {1, 8}, {1, 3}};
    for (size_t d = 0; d < sizeof degrees / sizeof degrees[0]; d++)
        for (int rot = 0; rot < 2; rot++)
            for (int causal = 0; causal < 2; causal++) {
                int R = degrees[d][0], U = degrees[d][1];
                int64_t seg[1] = {causal ? 2 * R * U * 5 : 1000 + R};
                cpc_plan *plan = mk_plan(24, 8, 16, CPC_DTYPE_FP16, 2, R * U, seg, 1);
                plan->input.mask = causal ? CPC_MASK_CAUSAL : CPC_MASK_NONE;
                plan->schedule.rotate = rot ? CPC_ROTATE_ALLGATHER : CPC_ROTATE_P2P;
                cpc_variant v = R > 1 && U > 1 ? CPC_VARIANT_UNIFIED
                                : R > 1        ? CPC_VARIANT_RING_ANYTHING
                                               : CPC_VARIANT_ULYSSES_ANYTHING;
                if (causal && R > 1 && U == 1)
                    v = CPC_VARIANT_RING;
                cpc_program *prog = build(plan, v, R, U);
                simulate(prog);
                cpc_program_free(prog);
                free_plan(plan);
            }
}

/* The program's size does not depend on world_size (SPEC section 4). */
Test(schedule, size_independent_of_world)
{
    const int64_t seg[2] = {512, 4096};
    const struct {
        cpc_variant v;
        int R4, U4, R64, U64;
    } c[] = {
        {CPC_VARIANT_RING, 4, 1, 64, 1},       {CPC_VARIANT_RING_ANYTHING, 4, 1, 64, 1},
        {CPC_VARIANT_ULYSSES, 1, 4, 1, 64},    {CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, 1, 64},
        {CPC_VARIANT_UNIFIED, 2, 2, 8, 8},     {CPC_VARIANT_UNIFIED, 2, 2, 4, 16},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        for (int rot = 0; rot < 2; rot++) {
            cpc_plan *p4 = mk_plan(64, 64, 128, CPC_DTYPE_BF16, 1, 4, seg, 2);
            cpc_plan *p64 = mk_plan(64, 64, 128, CPC_DTYPE_BF16, 1, 64, seg, 2);
            p4->schedule.rotate = p64->schedule.rotate = rot ? CPC_ROTATE_ALLGATHER : CPC_ROTATE_P2P;
            cpc_program *a = build(p4, c[i].v, c[i].R4, c[i].U4);
            cpc_program *b = build(p64, c[i].v, c[i].R64, c[i].U64);
            cr_assert_eq(count_ops(a->ops, a->n_ops), count_ops(b->ops, b->n_ops), "%s",
                         cpc_variant_name(c[i].v));
            cr_assert_eq(a->n_buffers, b->n_buffers);
            /* Same text apart from the header line. */
            char *sa = print_str(a, -1), *sb = print_str(b, -1);
            cr_assert_str_eq(strchr(sa, '\n'), strchr(sb, '\n'));
            free(sa);
            free(sb);
            cpc_program_free(a);
            cpc_program_free(b);
            free_plan(p4);
            free_plan(p64);
        }
}

/* Ring: each rank sends (R-1) * 2 * B*T*Hkv*D*e bytes (K and V around the
 * ring) and holds two K/V blocks (cur, nxt): O(S/P) memory. */
Test(schedule, ring_bytes_and_memory)
{
    /* GQA 28/7, B = 2, S = 4096 over R = 4: T = 1024, fp16. */
    const int64_t seg[1] = {4096};
    cpc_plan *plan = mk_plan(28, 7, 64, CPC_DTYPE_FP16, 2, 4, seg, 1);
    cpc_program *prog = build(plan, CPC_VARIANT_RING, 4, 1);
    const int64_t B = 2, T = 1024, H = 28, Hkv = 7, D = 64, e = 2;
    for (int p = 0; p < 4; p++) {
        int64_t sent, recvd;
        cr_assert_null(cpc_program_bytes_sent(prog, p, &sent, &recvd));
        cr_assert_eq(sent, 3 * 2 * B * T * Hkv * D * e);
        cr_assert_eq(recvd, sent);
        int64_t want = B * T * H * D * e           /* q */
                       + 4 * B * T * Hkv * D * e   /* k_cur, v_cur, k_nxt, v_nxt */
                       + 2 * B * T * H * D * 4     /* o_blk, acc (fp32) */
                       + 2 * B * H * T * 4         /* lse_blk, lse */
                       + B * T * H * D * e;        /* out */
        cr_assert_eq(cpc_program_peak_bytes(prog, p), want);
    }
    cr_assert_eq(cpc_program_peak_bytes(prog, 4), -1);
    cpc_program_free(prog);

    /* allgather: same bytes, but the whole K/V is held (O(S) memory). */
    plan->schedule.rotate = CPC_ROTATE_ALLGATHER;
    prog = build(plan, CPC_VARIANT_RING, 4, 1);
    int64_t sent;
    cr_assert_null(cpc_program_bytes_sent(prog, 0, &sent, NULL));
    cr_assert_eq(sent, 3 * 2 * B * T * Hkv * D * e);
    int64_t want = B * T * H * D * e + 2 * B * T * Hkv * D * e /* k, v */
                   + 2 * B * (4 * T) * Hkv * D * e              /* k_all, v_all */
                   + 2 * B * T * H * D * 4 + 2 * B * H * T * 4 + B * T * H * D * e;
    cr_assert_eq(cpc_program_peak_bytes(prog, 0), want);
    cpc_program_free(prog);
    free_plan(plan);
}

/* ring_anything, 1023 tokens over 4 (blocks 256, 256, 256, 255): rank r
 * sends every block except (r+1)%R's and receives every block but its own. */
Test(schedule, ring_anything_uneven_bytes)
{
    const int64_t seg[1] = {1023};
    cpc_plan *plan = mk_plan(8, 8, 64, CPC_DTYPE_BF16, 1, 4, seg, 1);
    cpc_program *prog = build(plan, CPC_VARIANT_RING_ANYTHING, 4, 1);
    const int64_t blk[4] = {256, 256, 256, 255};
    const int64_t per_tok = 2 * 8 * 64 * 2; /* K and V, 8 heads, D 64, bf16 */
    for (int r = 0; r < 4; r++) {
        int64_t sent, recvd;
        cr_assert_null(cpc_program_bytes_sent(prog, r, &sent, &recvd));
        cr_assert_eq(sent, (1023 - blk[(r + 1) % 4]) * per_tok, "rank %d", r);
        cr_assert_eq(recvd, (1023 - blk[r]) * per_tok, "rank %d", r);
    }
    /* Rank 3 holds a 255-token shard: its shard-sized buffers are smaller;
     * block buffers are at the largest block's capacity. */
    cr_assert_eq(cpc_program_peak_bytes(prog, 0) - cpc_program_peak_bytes(prog, 3),
                 1 * 8 * 64 * (2 + 4 + 4 + 2) + 2 * 8 * 4);
    simulate(prog);
    cpc_program_free(prog);
    free_plan(plan);
}

/* Ulysses: 4 all-to-alls (q, k, v, out), each moving (U-1)/U of its data. */
Test(schedule, ulysses_bytes)
{
    /* FLUX 1024x1024 over 4: shard = 128 text + 1024 image = 1152 tokens. */
    const int64_t seg[2] = {512, 4096};
    cpc_plan *plan = mk_plan(24, 24, 128, CPC_DTYPE_BF16, 1, 4, seg, 2);
    cpc_program *prog = build(plan, CPC_VARIANT_ULYSSES, 1, 4);
    const int64_t per = 1152LL * 24 * 128 * 2; /* one shard tensor */
    for (int p = 0; p < 4; p++) {
        int64_t sent, recvd;
        cr_assert_null(cpc_program_bytes_sent(prog, p, &sent, &recvd));
        cr_assert_eq(sent, 4 * per * 3 / 4);
        cr_assert_eq(recvd, sent);
    }
    /* = 4 * N * d * b / P * (U-1)/U with N = 4608, d = 3072, b = 2 */
    int64_t sent;
    cr_assert_null(cpc_program_bytes_sent(prog, 0, &sent, NULL));
    cr_assert_eq(sent, 4LL * 4608 * 3072 * 2 / 4 * 3 / 4);
    cpc_program_free(prog);
    free_plan(plan);

    /* GQA with replication: H = 28, Hkv = 7 over U = 14 (2 query heads and
     * one K/V head per member), T = 100 per shard, D = 64, fp16. */
    const int64_t s1[1] = {1400};
    plan = mk_plan(28, 7, 64, CPC_DTYPE_FP16, 1, 14, s1, 1);
    prog = build(plan, CPC_VARIANT_ULYSSES, 1, 14);
    const int64_t T = 100, D = 64, e = 2;
    int64_t want = T * 26 * D * e       /* q: 13 others x 2 heads */
                   + 2 * 13 * T * D * e /* k, v: 13 others x 1 K/V head */
                   + 13 * T * 2 * D * e;  /* out: 13 others' shards x my 2 heads */
    for (int p = 0; p < 14; p++) {
        int64_t recvd;
        cr_assert_null(cpc_program_bytes_sent(prog, p, &sent, &recvd));
        cr_assert_eq(sent, want);
        cr_assert_eq(recvd, want);
    }
    /* Memory: q 100x28, k/v 100x7, q_seq 1400x2, k_seq/v_seq 1400x1, acc
     * 1400x2 fp32, lse 2x1400 fp32, o_seq 1400x2, out 100x28. */
    cr_assert_eq(cpc_program_peak_bytes(prog, 5),
                 (100 * 28 + 2 * 100 * 7 + 1400 * 2 + 2 * 1400 * 1 + 1400 * 2 + 100 * 28) * D * e +
                     1400 * 2 * D * 4 + 2 * 1400 * 4);
    cr_assert_eq(cpc_program_peak_bytes(prog, 5), 2699200);
    simulate(prog);
    cpc_program_free(prog);
    free_plan(plan);

    /* Uneven heads (ulysses_anything, H = 24 over U = 16): members 0..7
     * hold 2 heads, 8..15 one; the all-to-all sizes follow. */
    const int64_t s2[1] = {1600};
    plan = mk_plan(24, 24, 32, CPC_DTYPE_FP32, 1, 16, s2, 1);
    prog = build(plan, CPC_VARIANT_ULYSSES_ANYTHING, 1, 16);
    /* member 0: q/k/v out to others: T=100 x (24-2) heads each; out back:
     * 15 shards x 2 heads. member 15: 100 x 23 heads; 15 x 100 x 1 head. */
    int64_t s0, s15;
    cr_assert_null(cpc_program_bytes_sent(prog, 0, &s0, NULL));
    cr_assert_null(cpc_program_bytes_sent(prog, 15, &s15, NULL));
    cr_assert_eq(s0, (3 * 100 * 22 + 15 * 100 * 2) * 32 * 4);
    cr_assert_eq(s15, (3 * 100 * 23 + 15 * 100 * 1) * 32 * 4);
    cpc_program_free(prog);
    free_plan(plan);
}

/* Unified: [4(u-1)/u + 2(r-1)] * N*d*b/P bytes per rank. */
Test(schedule, unified_bytes)
{
    const int64_t seg[1] = {4096};
    for (int rot = 0; rot < 2; rot++) {
        cpc_plan *plan = mk_plan(16, 16, 64, CPC_DTYPE_BF16, 1, 8, seg, 1);
        plan->schedule.rotate = rot ? CPC_ROTATE_ALLGATHER : CPC_ROTATE_P2P;
        cpc_program *prog = build(plan, CPC_VARIANT_UNIFIED, 2, 4);
        int64_t Nd_b_P = 4096LL * 16 * 64 * 2 / 8;
        for (int p = 0; p < 8; p++) {
            int64_t sent;
            cr_assert_null(cpc_program_bytes_sent(prog, p, &sent, NULL));
            cr_assert_eq(sent, (4 * 3 / 4 + 2 * 1) * Nd_b_P);
        }
        cpc_program_free(prog);
        free_plan(plan);
    }
}

/* Cross-attention: K/V whole on every rank, no K/V traffic. */
Test(schedule, cross_attention)
{
    const int64_t seg[1] = {32760};
    cpc_plan *plan = mk_plan(40, 40, 128, CPC_DTYPE_BF16, 1, 8, seg, 1);
    plan->input.has_kv = true;
    plan->input.kv_tokens = 512;
    cpc_program *prog = build(plan, CPC_VARIANT_RING, 8, 1);
    char *s = print_str(prog, -1);
    cr_assert(strstr(s, "buffer k   role=k   tokens=kv    heads=all  io=input\n"), "%s", s);
    cr_assert_null(strstr(s, "send"));
    cr_assert_null(strstr(s, "loop"));
    free(s);
    int64_t sent;
    cr_assert_null(cpc_program_bytes_sent(prog, 3, &sent, NULL));
    cr_assert_eq(sent, 0);
    cpc_program_free(prog);

    prog = build(plan, CPC_VARIANT_ULYSSES, 1, 8);
    s = print_str(prog, -1);
    cr_assert(strstr(s, "copy in=k out=k_part\ncopy in=v out=v_part\n"), "%s", s);
    cr_assert(strstr(s, "attn in=q_seq,k_part,v_part out=acc,lse\n"));
    free(s);
    /* Only q and out travel: 2 x T x (H - H/U) x D x e. */
    cr_assert_null(cpc_program_bytes_sent(prog, 0, &sent, NULL));
    cr_assert_eq(sent, 2LL * 4095 * 35 * 128 * 2);
    /* k_part holds this member's 5 K/V heads of the 512 K/V tokens. */
    int kp = cpc_program_find_buffer(prog, "k_part");
    cpc_coords c = cpc_program_coords(prog, 3);
    cr_assert_eq(cpc_buffer_capacity_bytes(prog, kp, &c), 512LL * 5 * 128 * 2);
    int off, n;
    cpc_buffer_heads(prog, kp, 3, &off, &n);
    cr_assert_eq(off, 15);
    cr_assert_eq(n, 5);
    cpc_program_free(prog);

    plan->cluster.world_size = 4;
    prog = build(plan, CPC_VARIANT_UNIFIED, 2, 2);
    simulate(prog);
    cpc_program_free(prog);
    free_plan(plan);
}

/* Causal: the zigzag is in the layout; the program text is the same. */
Test(schedule, causal_same_program)
{
    const int64_t seg[1] = {4096};
    cpc_plan *plan = mk_plan(24, 24, 128, CPC_DTYPE_BF16, 1, 4, seg, 1);
    cpc_program *a = build(plan, CPC_VARIANT_RING, 4, 1);
    plan->input.mask = CPC_MASK_CAUSAL;
    cpc_program *b = build(plan, CPC_VARIANT_RING, 4, 1);
    cr_assert_not(a->layout.zigzag);
    cr_assert(b->layout.zigzag);
    char *sa = print_str(a, -1), *sb = print_str(b, -1);
    cr_assert_str_eq(sa, sb);
    free(sa);
    free(sb);
    simulate(b);
    cpc_program_free(a);
    cpc_program_free(b);
    free_plan(plan);
}

Test(schedule, bad_candidates)
{
    const int64_t seg[1] = {4096};
    cpc_plan *plan = mk_plan(24, 24, 128, CPC_DTYPE_BF16, 1, 4, seg, 1);
    struct {
        cpc_variant v;
        int R, U;
    } bad[] = {
        {CPC_VARIANT_AUTO, 4, 1},    {CPC_VARIANT_RING, 2, 2},    {CPC_VARIANT_ULYSSES, 2, 2},
        {CPC_VARIANT_NONE, 4, 1},    {CPC_VARIANT_RING, 8, 1},    {CPC_VARIANT_UNIFIED, 0, 4},
        {CPC_VARIANT_RING_ANYTHING, 1, 4}, {(cpc_variant)77, 4, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cpc_program *prog = (cpc_program *)1;
        cpc_status *st = cpc_schedule_build(plan, bad[i].v, bad[i].R, bad[i].U, &prog);
        cr_assert_not_null(st, "case %zu", i);
        cr_assert_eq(st->code, CPC_E_INTERNAL);
        cr_assert_null(prog);
        cpc_status_free(st);
    }
    free_plan(plan);
}

/* The per-rank walk reports errors in edited programs instead of crashing. */
Test(schedule, walk_errors)
{
    const int64_t seg[1] = {1024};
    cpc_plan *plan = mk_plan(8, 8, 64, CPC_DTYPE_BF16, 1, 4, seg, 1);
    cpc_program *prog = build(plan, CPC_VARIANT_RING, 4, 1);
    cpc_op *loop = &prog->ops[1];
    cr_assert_eq(loop->kind, CPC_OP_LOOP);
    cpc_op *send = &loop->body[0];
    cr_assert_eq(send->kind, CPC_OP_SEND);

    /* peer without % R: rank 3 would send to ring index 4 */
    cpc_expr_free(send->peer);
    cr_assert_null(cpc_expr_parse("r+1", CPC_NO_SPAN, &send->peer));
    cr_assert_null(cpc_program_bytes_sent(prog, 2, NULL, NULL));
    cpc_status *st = cpc_program_bytes_sent(prog, 3, NULL, NULL);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "rank 3") && strstr(st->message, "peer 4"), "%s", st->message);
    cpc_status_free(st);

    /* an evaluation error inside the loop */
    cpc_expr_free(send->when);
    cr_assert_null(cpc_expr_parse("1/(s-1)", CPC_NO_SPAN, &send->when));
    st = cpc_program_print(stdout, prog, 0);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "division by zero"), "%s", st->message);
    cpc_status_free(st);

    /* a loop count out of range */
    cpc_expr_free(loop->count);
    cr_assert_null(cpc_expr_parse("-1", CPC_NO_SPAN, &loop->count));
    st = cpc_program_walk(prog, 0, NULL, NULL);
    cr_assert_not_null(st);
    cpc_status_free(st);

    /* a buffer index out of range */
    cpc_expr_free(loop->count);
    cr_assert_null(cpc_expr_parse("R", CPC_NO_SPAN, &loop->count));
    cpc_expr_free(send->when);
    send->when = NULL;
    loop->body[2].in[0] = 99;
    st = cpc_program_walk(prog, 0, NULL, NULL);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "out of range"), "%s", st->message);
    cpc_status_free(st);
    cpc_program_free(prog);
    free_plan(plan);
}
