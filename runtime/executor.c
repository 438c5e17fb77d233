/* executor.c - see executor.h.  The semantics of every op are program.h's
 * table; this file only interprets it for one rank. */
#include "executor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One program buffer as this rank holds it right now (swap exchanges these). */
typedef struct xbuf {
    void *ptr;
    size_t cap;       /* bytes allocated behind ptr */
} xbuf;

typedef struct pending {
    cpc_request *req;
    int tag;
    int buf;          /* program buffer the request reads or writes */
    bool send;        /* a send (its buffer may still be read) or a recv */
} pending;

struct cpc_exec {
    cpc_exec_config cfg;
    const cpc_program *prog;
    const cpc_layout *L;
    cpc_coords c;
    float scale;
    xbuf *bufs;
    int *tags;        /* per buffer: its content tag (BLOCK: which ring block), by the op
                         table's tag rule (cpc_op_apply_tags) */
    void **allocs;            /* what to free (one per buffer, before swaps) */
    void *stage_send, *stage_recv;
    size_t stage_send_cap, stage_recv_cap;
    int64_t allocated;
    const void *inputs[CPC_ROLE__COUNT];
    bool device_io;             /* cpc_exec_set_device_io: bound inputs and read
                                   destinations are memory of the backend */
    size_t input_bytes[CPC_ROLE__COUNT];
    pending *pend;
    int n_pend, cap_pend;
    cpc_run *qruns, *kvruns;
    int max_runs;
    size_t *a2a;              /* 4 * P: send counts/displs, recv counts/displs */
    size_t *ag;               /* 2 * R: all-gather counts/displs */
    cpc_exec_event *ev;
    int n_ev, cap_ev;
    cpc_exec_stats cur;
    int out_buf;              /* the OUTPUT buffer, -1 if none */
    int out_rep_buf;          /* replicated segments: the OUTPUT buffer of their rows (KV
                                 layout), -1 if none */
    int lse_buf;              /* the final LSE buffer, -1 if none */
    int lse_rep_buf;          /* replicated segments: the final LSE of their rows, -1 if none */
    bool unflushed;           /* send/recv posted since the last transport flush */
};

double cpc_exec_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* ---- geometry -------------------------------------------------------------------- */

static bool is_kv(cpc_buf_role r)
{
    return r == CPC_ROLE_K || r == CPC_ROLE_V;
}

/* Tokens of buffer b's content with tag `tag` on the rank at c. */
static int64_t rows_of(const cpc_program *prog, const cpc_coords *c, int b, int tag)
{
    const cpc_layout *L = &prog->layout;
    switch (prog->buffers[b].tokens) {
    case CPC_TOK_SHARD: return cpc_layout_shard_tokens(L, (int)c->p);
    case CPC_TOK_BLOCK: return cpc_layout_block_tokens(L, tag >= 0 ? tag : (int)c->r);
    case CPC_TOK_ALL: return cpc_layout_block_offset(L, L->R);
    case CPC_TOK_KV: return cpc_layout_kv_rows(L);
    default: return 0;
    }
}

typedef struct geom {
    int64_t T;        /* tokens */
    int hoff, hn;     /* heads */
    int es;           /* element size */
    int64_t elems;
    size_t bytes;
} geom;

static geom geom_of(const cpc_program *prog, const cpc_coords *c, int b, int tag)
{
    geom g;
    g.T = rows_of(prog, c, b, tag);
    cpc_buffer_heads(prog, b, (int)c->u, &g.hoff, &g.hn);
    g.es = cpc_buffer_elem_size(prog, b);
    int64_t per = prog->buffers[b].role == CPC_ROLE_LSE ? 1 : prog->layout.D;
    g.elems = (int64_t)prog->layout.B * g.T * g.hn * per;
    g.bytes = (size_t)g.elems * (size_t)g.es;
    return g;
}

/* Global token runs of buffer b's content; returns the count (<= max). */
static int runs_of(const cpc_program *prog, const cpc_coords *c, int b, int tag, cpc_run *out,
                   int max)
{
    const cpc_layout *L = &prog->layout;
    switch (prog->buffers[b].tokens) {
    case CPC_TOK_SHARD: return cpc_layout_shard_runs(L, (int)c->p, out, max);
    case CPC_TOK_BLOCK: return cpc_layout_block_runs(L, tag >= 0 ? tag : (int)c->r, out, max);
    case CPC_TOK_ALL: {
        int n = 0;
        for (int i = 0; i < L->R; i++)
            n += cpc_layout_block_runs(L, i, out + n, max - n);
        return n;
    }
    case CPC_TOK_KV: /* cross-attention K/V, or the replicated segments (layout.h) */
        return cpc_layout_kv_runs(L, out, max);
    default: return 0;
    }
}

/* Replicated segments (layout.h): the caller's q/k/v/out of a forward
 * program hold the rank's own tokens (its shard plus every replicated
 * segment, in segment order); the program's buffers hold the shard (SHARD,
 * or BLOCK r with U == 1) or the replicated rows (KV).  rank_io: whether
 * role `r` is moved that way; rank_bytes: the caller's tensor for buffer b's
 * role and heads. */
static bool rank_io(const cpc_exec *ex, cpc_buf_role r)
{
    return ex->L->rep && (r == CPC_ROLE_Q || r == CPC_ROLE_K || r == CPC_ROLE_V || r == CPC_ROLE_O ||
                          r == CPC_ROLE_DO || r == CPC_ROLE_DQ || r == CPC_ROLE_DK || r == CPC_ROLE_DV);
}

/* A backward program's saved LSE with replicated segments: two INPUT
 * buffers (the sharded rows' and the replicated rows', both in the layout
 * the forward computed them in).  The caller's LSE is, with U == 1, the
 * rank's own rows in order ([B, H, T], T the rank's tokens: layout.h rank
 * runs, as cpc_exec_lse_into gives it); with U > 1 the two buffers back to
 * back (the sharded rows' first).  rep_lse: whether buffer b is filled so. */
static bool rep_lse(const cpc_exec *ex, int b)
{
    const cpc_buffer *bf = &ex->prog->buffers[b];
    return ex->L->rep && bf->io == CPC_IO_INPUT && bf->role == CPC_ROLE_LSE;
}

static size_t rank_bytes(const cpc_exec *ex, int b)
{
    int off, hn;
    cpc_buffer_heads(ex->prog, b, (int)ex->c.u, &off, &hn);
    return (size_t)ex->L->B * (size_t)cpc_layout_rank_tokens(ex->L, (int)ex->c.p) * (size_t)hn *
           (size_t)ex->L->D * (size_t)cpc_buffer_elem_size(ex->prog, b);
}

/* Moves buffer b's rows between its memory and the caller's rank tensor
 * (rank_io above): every run of the buffer's content goes to / comes from
 * its rows among the rank's own tokens, batch by batch. */
static cpc_status *xfer_rank_rows(cpc_exec *ex, int b, void *host, const void *chost, bool upload);

/* Per-member sizes of an all_to_all on the rank at c: counts and
 * displacements (bytes) of what goes to and comes from each member j of the
 * ulysses group.  sc/sd/rc/rd hold U entries each. */
static cpc_status *a2a_sizes(const cpc_program *prog, const cpc_coords *c, const cpc_op *op,
                             size_t *sc, size_t *sd, size_t *rc, size_t *rd, size_t *stot,
                             size_t *rtot)
{
    const cpc_layout *L = &prog->layout;
    if (op->n_in < 1 || op->n_out < 1)
        return cpc_error(CPC_E_INTERNAL, "all_to_all needs one input and one output buffer");
    if (op->group != CPC_GROUP_ULYSSES)
        return cpc_error(CPC_E_INTERNAL, "all_to_all over the %s group is not supported (ulysses only)",
                         cpc_group_name(op->group));
    int in = op->in[0], out = op->out[0];
    const cpc_buffer *bi = &prog->buffers[in], *bo = &prog->buffers[out];
    if ((bi->role == CPC_ROLE_LSE) != (bo->role == CPC_ROLE_LSE) ||
        (bi->role == CPC_ROLE_LSE && op->dir != CPC_A2A_SEQ_TO_HEADS))
        return cpc_error(CPC_E_INTERNAL, "all_to_all of an LSE-layout buffer: seq_to_heads between two LSE "
                                         "buffers only ('%s', '%s')", bi->name, bo->name);
    if (cpc_buffer_elem_size(prog, in) != cpc_buffer_elem_size(prog, out))
        return cpc_error(CPC_E_INTERNAL, "all_to_all between buffers of different element types ('%s', '%s')",
                         bi->name, bo->name);
    if (op->reduce) {
        bool grad = bi->role == CPC_ROLE_DQ || bi->role == CPC_ROLE_DK || bi->role == CPC_ROLE_DV;
        if (op->dir != CPC_A2A_HEADS_TO_SEQ || !grad || bo->role != bi->role)
            return cpc_error(CPC_E_INTERNAL, "all_to_all reduce=sum: only heads_to_seq of a dq/dk/dv buffer "
                                             "into one of the same role ('%s' -> '%s')", bi->name, bo->name);
    }
    int part = op->dir == CPC_A2A_SEQ_TO_HEADS ? out : in;
    int full = op->dir == CPC_A2A_SEQ_TO_HEADS ? in : out;
    if (prog->buffers[part].heads != CPC_HEADS_PART || prog->buffers[full].heads != CPC_HEADS_ALL)
        return cpc_error(CPC_E_INTERNAL, "all_to_all %s: '%s' must have ALL heads and '%s' PART heads",
                         cpc_a2a_dir_name(op->dir), prog->buffers[full].name, prog->buffers[part].name);
    /* heads_to_seq of replicated rows (KV layout, no cross-attention): every
     * member sends its heads of all rows to every member (a head all-gather) */
    bool kvrep = op->dir == CPC_A2A_HEADS_TO_SEQ && L->rep && prog->buffers[full].tokens == CPC_TOK_KV &&
                 prog->buffers[part].tokens == CPC_TOK_KV;
    if (!kvrep && (prog->buffers[full].tokens != CPC_TOK_SHARD || prog->buffers[part].tokens != CPC_TOK_BLOCK))
        return cpc_error(CPC_E_INTERNAL, "all_to_all %s: '%s' must be SHARD and '%s' BLOCK (or both KV: "
                                         "replicated rows, heads_to_seq)",
                         cpc_a2a_dir_name(op->dir), prog->buffers[full].name, prog->buffers[part].name);
    /* bytes per (token, head): [B, T, h, D] buffers D elements, LSE ([B, h, T]) one */
    int64_t row = (int64_t)L->B * (bi->role == CPC_ROLE_LSE ? 1 : L->D) * cpc_buffer_elem_size(prog, in);
    int U = L->U;
    int64_t Tu = kvrep ? cpc_layout_kv_rows(L) : cpc_layout_shard_tokens(L, (int)c->p);
    int uo, un;
    cpc_buffer_heads(prog, part, (int)c->u, &uo, &un);
    size_t so = 0, ro = 0;
    for (int j = 0; j < U; j++) {
        int64_t Tj = kvrep ? Tu : cpc_layout_shard_tokens(L, (int)(c->r * U + j));
        int jo, jn;
        cpc_buffer_heads(prog, part, j, &jo, &jn);
        if (op->dir == CPC_A2A_SEQ_TO_HEADS) {
            sc[j] = (size_t)(row * Tu * jn);
            rc[j] = (size_t)(row * Tj * un);
        } else {
            sc[j] = (size_t)(row * Tj * un);
            rc[j] = (size_t)(row * Tu * jn);
        }
        sd[j] = so;
        rd[j] = ro;
        so += sc[j];
        ro += rc[j];
    }
    *stot = so;
    *rtot = ro;
    return NULL;
}

/* ---- memory plan -------------------------------------------------------------------- */

static int uf_find(int *par, int x)
{
    while (par[x] != x) {
        par[x] = par[par[x]];
        x = par[x];
    }
    return x;
}

static void uf_swaps(const cpc_op *ops, int n, int *par, int nb)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        if (op->kind == CPC_OP_LOOP)
            uf_swaps(op->body, op->n_body, par, nb);
        else if (op->kind == CPC_OP_SWAP && op->n_in >= 2 && op->in[0] >= 0 && op->in[0] < nb &&
                 op->in[1] >= 0 && op->in[1] < nb) {
            int a = uf_find(par, op->in[0]), b = uf_find(par, op->in[1]);
            if (a != b)
                par[a] = b;
        }
    }
}

typedef struct stage_ctx {
    const cpc_program *prog;
    cpc_coords c;
    size_t *tmp;      /* 4 * U */
    size_t send, recv;
    bool two_sided;   /* a reduce_scatter stages both sides at once */
} stage_ctx;

/* The staging one all_to_all pair needs (stage_ops). */
static cpc_status *stage_a2a(stage_ctx *s, const cpc_op *op)
{
    if (op->n_in < 1 || op->n_out < 1 || op->in[0] < 0 || op->in[0] >= s->prog->n_buffers ||
        op->out[0] < 0 || op->out[0] >= s->prog->n_buffers)
        return cpc_error(CPC_E_INTERNAL, "ops: all_to_all with bad buffers");
    int U = s->prog->layout.U;
    size_t st, rt;
    cpc_status *e = a2a_sizes(s->prog, &s->c, op, s->tmp, s->tmp + U, s->tmp + 2 * U,
                              s->tmp + 3 * U, &st, &rt);
    if (e) {
        cpc_status_prefix(e, "rank %lld: all_to_all", (long long)s->c.p);
        return e;
    }
    bool b1 = s->prog->layout.B == 1;
    /* B == 1: the SEQ_TO_HEADS receive and the HEADS_TO_SEQ send go
     * straight between the buffer and the transport (each member's part
     * is a contiguous token range). */
    bool lse = s->prog->buffers[op->in[0]].role == CPC_ROLE_LSE;
    bool need_send = lse || !(b1 && op->dir == CPC_A2A_HEADS_TO_SEQ);
    bool need_recv = lse || !(b1 && op->dir == CPC_A2A_SEQ_TO_HEADS);
    if (lse)
        s->two_sided = true; /* [B, h, T]: a member's part is not contiguous in the output */
    if (need_send && st > s->send)
        s->send = st;
    if (need_recv && rt > s->recv)
        s->recv = rt;
    return NULL;
}

/* Staging space for every all_to_all of the program (whether or not its
 * `when` holds on this rank: an upper bound, nothing is evaluated). */
static cpc_status *stage_ops(stage_ctx *s, const cpc_op *ops, int n)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        if (op->kind == CPC_OP_LOOP) {
            cpc_status *e = stage_ops(s, op->body, op->n_body);
            if (e)
                return e;
            continue;
        }
        if (op->kind == CPC_OP_ALL_REDUCE) {
            /* pack chunks (the whole input); receive P parts of this rank's
             * chunk, later the P chunks of the all-gather */
            for (int k = 0; k < op->n_in; k++) {
                if (op->in[k] < 0 || op->in[k] >= s->prog->n_buffers)
                    return cpc_error(CPC_E_INTERNAL, "ops: all_reduce with bad buffers");
                const cpc_layout *L = &s->prog->layout;
                geom g = geom_of(s->prog, &s->c, op->in[k], -1);
                size_t per_tok = g.T > 0 ? g.bytes / (size_t)g.T : 0;
                size_t parts = per_tok * (size_t)cpc_split_len(g.T, L->P, s->c.p) * (size_t)L->P;
                s->two_sided = true;
                if (g.bytes > s->send)
                    s->send = g.bytes;
                if (g.bytes > s->recv)
                    s->recv = g.bytes;
                if (parts > s->recv)
                    s->recv = parts;
            }
            continue;
        }
        if (op->kind == CPC_OP_REDUCE_SCATTER) {
            /* pack every slice (the whole ALL input), receive R slices of block r */
            for (int k = 0; k < op->n_in && k < op->n_out; k++) {
                s->two_sided = true;
            if (op->in[k] < 0 || op->in[k] >= s->prog->n_buffers || op->out[k] < 0 ||
                    op->out[k] >= s->prog->n_buffers)
                    return cpc_error(CPC_E_INTERNAL, "ops: reduce_scatter with bad buffers");
                size_t in_b = geom_of(s->prog, &s->c, op->in[k], -1).bytes;
                size_t out_b = geom_of(s->prog, &s->c, op->out[k], (int)s->c.r).bytes * (size_t)s->prog->layout.R;
                if (in_b > s->send)
                    s->send = in_b;
                if (out_b > s->recv)
                    s->recv = out_b;
            }
            continue;
        }
        if (op->kind != CPC_OP_ALL_TO_ALL)
            continue;
        /* paired all_to_alls run pair by pair (exec_ops): size the staging for every pair */
        for (int k = 0; k < op->n_in && k < op->n_out; k++) {
            cpc_op one = *op;
            one.n_in = one.n_out = 1;
            one.in[0] = op->in[k];
            one.out[0] = op->out[k];
            cpc_status *e = stage_a2a(s, &one);
            if (e)
                return e;
        }
    }
    return NULL;
}

/* Capacities per buffer (swap classes merged) and staging sizes. */
static cpc_status *plan_memory(const cpc_program *prog, int rank, int64_t *caps, size_t *ssend,
                               size_t *srecv)
{
    int nb = prog->n_buffers;
    cpc_coords c = cpc_program_coords(prog, rank);
    int *par = malloc((size_t)(nb > 0 ? nb : 1) * sizeof *par);
    size_t *tmp = malloc((size_t)(4 * prog->layout.U) * sizeof *tmp);
    if (!par || !tmp) {
        free(par);
        free(tmp);
        return cpc_error(CPC_E_NOMEM, "executor: out of memory");
    }
    for (int b = 0; b < nb; b++) {
        par[b] = b;
        int64_t cap = cpc_buffer_capacity_bytes(prog, b, &c);
        /* Never below what this executor's geometry can put there. */
        /* a BLOCK buffer may hold any ring block: block 0 is the largest (layout.h: block
         * sizes never increase with the index), so this is O(1) per buffer, not O(R) */
        int64_t own = (int64_t)geom_of(prog, &c, b, prog->buffers[b].tokens == CPC_TOK_BLOCK ? 0 : -1).bytes;
        caps[b] = cap > own ? cap : own;
    }
    uf_swaps(prog->ops, prog->n_ops, par, nb);
    for (int b = 0; b < nb; b++) {
        int r = uf_find(par, b);
        if (caps[b] > caps[r])
            caps[r] = caps[b];
    }
    for (int b = 0; b < nb; b++)
        caps[b] = caps[uf_find(par, b)];
    free(par);
    stage_ctx s = {.prog = prog, .c = c, .tmp = tmp};
    cpc_status *st = stage_ops(&s, prog->ops, prog->n_ops);
    free(tmp);
    if (st)
        return st;
    if (prog->layout.B == 1 && !s.two_sided) {
        /* Each all_to_all then stages only one side: one space serves both. */
        *ssend = s.send > s.recv ? s.send : s.recv;
        *srecv = 0;
    } else {
        *ssend = s.send;
        *srecv = s.recv;
    }
    return NULL;
}

cpc_status *cpc_exec_memory_plan(const cpc_program *prog, int rank, cpc_exec_memory *out)
{
    memset(out, 0, sizeof *out);
    if (!prog || rank < 0 || rank >= prog->layout.P)
        return cpc_error(CPC_E_INTERNAL, "executor: rank %d outside the program's %d ranks", rank,
                         prog ? prog->layout.P : 0);
    out->n_buffers = prog->n_buffers;
    out->buffer_bytes = calloc((size_t)(prog->n_buffers > 0 ? prog->n_buffers : 1), sizeof(int64_t));
    if (!out->buffer_bytes)
        return cpc_error(CPC_E_NOMEM, "executor: out of memory");
    size_t ss = 0, sr = 0;
    cpc_status *st = plan_memory(prog, rank, out->buffer_bytes, &ss, &sr);
    if (st) {
        cpc_exec_memory_free(out);
        return st;
    }
    out->staging_bytes = (int64_t)(ss + sr);
    out->total_bytes = out->staging_bytes;
    for (int b = 0; b < prog->n_buffers; b++)
        out->total_bytes += out->buffer_bytes[b];
    return NULL;
}

void cpc_exec_memory_free(cpc_exec_memory *m)
{
    if (!m)
        return;
    free(m->buffer_bytes);
    memset(m, 0, sizeof *m);
}

static void fmt_bytes(char *buf, size_t n, double b)
{
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024)
        snprintf(buf, n, "%.2f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0)
        snprintf(buf, n, "%.2f KiB", b / 1024.0);
    else
        snprintf(buf, n, "%.0f B", b);
}

cpc_status *cpc_exec_print_memory(FILE *out, const cpc_program *prog, int rank)
{
    cpc_exec_memory m;
    cpc_status *st = cpc_exec_memory_plan(prog, rank, &m);
    if (st)
        return st;
    cpc_coords c = cpc_program_coords(prog, rank);
    fprintf(out, "rank %d (r=%lld, u=%lld):\n", rank, (long long)c.r, (long long)c.u);
    for (int b = 0; b < prog->n_buffers; b++) {
        const cpc_buffer *bf = &prog->buffers[b];
        int hoff, hn;
        cpc_buffer_heads(prog, b, (int)c.u, &hoff, &hn);
        char sz[32];
        fmt_bytes(sz, sizeof sz, (double)m.buffer_bytes[b]);
        char hs[32];
        snprintf(hs, sizeof hs, "[%d, %d)", hoff, hoff + hn);
        fprintf(out, "  %-12s %-4s %-6s %-4s heads %-10s %-6s %12lld bytes (%s)\n", bf->name,
                cpc_buf_role_name(bf->role), cpc_buf_tokens_name(bf->tokens),
                cpc_buf_heads_name(bf->heads), hs,
                bf->io != CPC_IO_NONE ? cpc_buf_io_name(bf->io) : "",
                (long long)m.buffer_bytes[b], sz);
    }
    if (m.staging_bytes) {
        char sz[32];
        fmt_bytes(sz, sizeof sz, (double)m.staging_bytes);
        fprintf(out, "  %-12s %-40s %12lld bytes (%s)\n", "(staging)", "all_to_all pack/unpack",
                (long long)m.staging_bytes, sz);
    }
    char sz[32];
    fmt_bytes(sz, sizeof sz, (double)m.total_bytes);
    fprintf(out, "  peak memory: %lld bytes (%s)\n", (long long)m.total_bytes, sz);
    cpc_exec_memory_free(&m);
    return NULL;
}

/* ---- create / destroy -------------------------------------------------------------- */

/* The first op that sums in fp32 through the backend's add_strided (the
 * reducing all_to_all, reduce_scatter, all_reduce), or NULL. */
static const cpc_op *find_summing_op(const cpc_op *ops, int n)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        if (op->kind == CPC_OP_LOOP) {
            const cpc_op *b = find_summing_op(op->body, op->n_body);
            if (b)
                return b;
        } else if ((op->kind == CPC_OP_ALL_TO_ALL && op->reduce) || op->kind == CPC_OP_REDUCE_SCATTER ||
                   op->kind == CPC_OP_ALL_REDUCE || op->kind == CPC_OP_ADD) {
            return op;
        }
    }
    return NULL;
}

/* Finds the final LSE buffer: out[1] of the last merge, else of the last attn. */
/* The last LSE a merge / an attn writes (the final one), of the sharded rows
 * (`kv` false) or of the replicated segments' rows (KV layout, `kv` true). */
static void find_lse(const cpc_program *prog, const cpc_op *ops, int n, bool kv, int *merge_lse,
                     int *attn_lse)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        if (op->kind == CPC_OP_LOOP) {
            find_lse(prog, op->body, op->n_body, kv, merge_lse, attn_lse);
            continue;
        }
        if ((op->kind != CPC_OP_MERGE && op->kind != CPC_OP_ATTN) || op->n_out < 2 || op->out[1] < 0 ||
            op->out[1] >= prog->n_buffers || (prog->buffers[op->out[1]].tokens == CPC_TOK_KV) != kv)
            continue;
        if (op->kind == CPC_OP_MERGE)
            *merge_lse = op->out[1];
        else
            *attn_lse = op->out[1];
    }
}

void cpc_exec_destroy(cpc_exec *ex)
{
    if (!ex)
        return;
    cpc_backend *be = ex->cfg.backend;
    for (int i = 0; i < ex->n_pend; i++) {
        /* Requests left by a failed run: complete them (errors ignored). */
        if (ex->cfg.transport && ex->pend[i].req)
            cpc_status_free(cpc_transport_wait(ex->cfg.transport, ex->pend[i].req));
    }
    if (ex->allocs)
        for (int b = 0; b < ex->prog->n_buffers; b++)
            if (ex->allocs[b])
                cpc_backend_free(be, ex->allocs[b]);
    if (ex->stage_send)
        cpc_backend_free(be, ex->stage_send);
    if (ex->stage_recv && ex->stage_recv != ex->stage_send)
        cpc_backend_free(be, ex->stage_recv);
    free(ex->allocs);
    free(ex->bufs);
    free(ex->tags);
    free(ex->pend);
    free(ex->qruns);
    free(ex->kvruns);
    free(ex->a2a);
    free(ex->ag);
    free(ex->ev);
    free(ex);
}

cpc_status *cpc_exec_create(const cpc_exec_config *cfg, cpc_exec **out)
{
    *out = NULL;
    const cpc_program *prog = cfg->prog;
    if (!prog || !cfg->backend)
        return cpc_error(CPC_E_INTERNAL, "executor: no program or backend");
    if (cfg->rank < 0 || cfg->rank >= prog->layout.P)
        return cpc_error(CPC_E_INTERNAL, "executor: rank %d outside the program's %d ranks",
                         cfg->rank, prog->layout.P);
    const cpc_op *sum_op = find_summing_op(prog->ops, prog->n_ops);
    if (sum_op && !cfg->backend->vt->add_strided)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "rank %d: the %s backend has no fp32 accumulate (add_strided), which the program's %s%s "
                         "needs (it sums gradients of several ranks)", cfg->rank, cpc_backend_name(cfg->backend),
                         cpc_op_kind_name(sum_op->kind), sum_op->kind == CPC_OP_ALL_TO_ALL ? " reduce=sum" : "");
    cpc_exec *ex = calloc(1, sizeof *ex);
    if (!ex)
        return cpc_error(CPC_E_NOMEM, "executor: out of memory");
    ex->cfg = *cfg;
    ex->prog = prog;
    ex->L = &prog->layout;
    ex->c = cpc_program_coords(prog, cfg->rank);
    ex->scale = (float)(cfg->scale > 0 ? cfg->scale : 1.0 / sqrt((double)prog->layout.D));
    ex->out_buf = -1;
    ex->out_rep_buf = -1;
    ex->lse_buf = -1;
    ex->lse_rep_buf = -1;
    int nb = prog->n_buffers;
    const cpc_layout *L = ex->L;
    cpc_status *st = NULL;
    int64_t *caps = calloc((size_t)(nb > 0 ? nb : 1), sizeof *caps);
    ex->bufs = calloc((size_t)(nb > 0 ? nb : 1), sizeof *ex->bufs);
    ex->tags = calloc((size_t)(nb > 0 ? nb : 1), sizeof *ex->tags);
    ex->allocs = calloc((size_t)(nb > 0 ? nb : 1), sizeof *ex->allocs);
    ex->max_runs = L->R * cpc_layout_max_block_runs(L) + 2 + L->n_rep;
    ex->qruns = malloc((size_t)ex->max_runs * sizeof *ex->qruns);
    ex->kvruns = malloc((size_t)ex->max_runs * sizeof *ex->kvruns);
    ex->a2a = malloc((size_t)(4 * L->P) * sizeof *ex->a2a); /* ulysses all_to_all, ring reduce_scatter */
    ex->ag = malloc((size_t)(2 * L->R) * sizeof *ex->ag);
    if (!caps || !ex->bufs || !ex->tags || !ex->allocs || !ex->qruns || !ex->kvruns || !ex->a2a || !ex->ag) {
        st = cpc_error(CPC_E_NOMEM, "executor: out of memory");
        goto fail;
    }
    size_t ss = 0, sr = 0;
    if ((st = plan_memory(prog, cfg->rank, caps, &ss, &sr)))
        goto fail;
    cpc_backend *be = cfg->backend;
    for (int b = 0; b < nb; b++) {
        const cpc_buffer *bf = &prog->buffers[b];
        if ((st = cpc_backend_alloc(be, (size_t)caps[b], &ex->allocs[b]))) {
            cpc_status_prefix(st, "rank %d: allocating buffer '%s' (%lld bytes)", cfg->rank,
                              bf->name, (long long)caps[b]);
            goto fail;
        }
        ex->bufs[b].ptr = ex->allocs[b];
        ex->bufs[b].cap = (size_t)caps[b];
        ex->tags[b] = (int)ex->c.r;
        ex->allocated += caps[b];
        if (bf->io == CPC_IO_OUTPUT && bf->role == CPC_ROLE_O && L->rep && bf->tokens == CPC_TOK_KV &&
            ex->out_rep_buf < 0)
            ex->out_rep_buf = b;
        else if (bf->io == CPC_IO_OUTPUT && bf->role == CPC_ROLE_O && ex->out_buf < 0)
            ex->out_buf = b;
        if (bf->io == CPC_IO_INPUT) {
            if (bf->role != CPC_ROLE_Q && !is_kv(bf->role) && bf->role != CPC_ROLE_DO &&
                bf->role != CPC_ROLE_O && bf->role != CPC_ROLE_LSE) {
                st = cpc_error(CPC_E_INTERNAL, "rank %d: input buffer '%s' has role %s (q, k, v, or for a backward program dout, o, lse expected)",
                               cfg->rank, bf->name, cpc_buf_role_name(bf->role));
                goto fail;
            }
            /* A backward program's saved LSE stays in the layout the forward
             * computed it in: with ulysses, ring block r x this member's heads. */
            bool lse_seq = bf->role == CPC_ROLE_LSE && L->U > 1 &&
                           (bf->tokens == CPC_TOK_BLOCK || (bf->tokens == CPC_TOK_KV && L->rep));
            bool ok = lse_seq || (bf->heads == CPC_HEADS_ALL &&
                                  (bf->tokens == CPC_TOK_SHARD || bf->tokens == CPC_TOK_KV ||
                                   (bf->tokens == CPC_TOK_BLOCK && L->U == 1)));
            if (!ok) {
                st = cpc_error(CPC_E_INTERNAL, "rank %d: input buffer '%s' must hold ALL heads of a SHARD (or KV) layout (a saved LSE: also BLOCK), not %s/%s",
                               cfg->rank, bf->name, cpc_buf_tokens_name(bf->tokens),
                               cpc_buf_heads_name(bf->heads));
                goto fail;
            }
            size_t want = geom_of(prog, &ex->c, b, (int)ex->c.r).bytes;
            if (rank_io(ex, bf->role))
                want = rank_bytes(ex, b);
            if (rep_lse(ex, b)) {
                /* the sharded rows' and the replicated rows' LSE, one input */
                ex->input_bytes[bf->role] += want;
                continue;
            }
            if (ex->input_bytes[bf->role] && ex->input_bytes[bf->role] != want) {
                st = cpc_error(CPC_E_INTERNAL, "rank %d: input buffers of role %s disagree in size",
                               cfg->rank, cpc_buf_role_name(bf->role));
                goto fail;
            }
            ex->input_bytes[bf->role] = want;
        }
    }
    if (ss && (st = cpc_backend_alloc(be, ss, &ex->stage_send)))
        goto fail;
    if (sr && (st = cpc_backend_alloc(be, sr, &ex->stage_recv)))
        goto fail;
    ex->stage_send_cap = ss;
    ex->stage_recv_cap = sr;
    if (prog->layout.B == 1 && sr == 0) {
        ex->stage_recv = ex->stage_send;
        ex->stage_recv_cap = ss;
    }
    ex->allocated += (int64_t)(ss + sr);
    int ml = -1, al = -1;
    find_lse(prog, prog->ops, prog->n_ops, false, &ml, &al);
    ex->lse_buf = ml >= 0 ? ml : al;
    if (L->rep) {
        ml = al = -1;
        find_lse(prog, prog->ops, prog->n_ops, true, &ml, &al);
        ex->lse_rep_buf = ml >= 0 ? ml : al;
    }
    free(caps);
    *out = ex;
    return NULL;
fail:
    free(caps);
    cpc_exec_destroy(ex);
    return st;
}

int64_t cpc_exec_allocated_bytes(const cpc_exec *ex)
{
    return ex->allocated;
}

size_t cpc_exec_input_bytes(const cpc_exec *ex, cpc_buf_role role)
{
    if (role < 0 || role >= CPC_ROLE__COUNT)
        return 0;
    return ex->input_bytes[role];
}

cpc_status *cpc_exec_bind_input(cpc_exec *ex, cpc_buf_role role, const void *host, size_t bytes)
{
    if (role != CPC_ROLE_Q && role != CPC_ROLE_K && role != CPC_ROLE_V && role != CPC_ROLE_DO &&
        role != CPC_ROLE_O && role != CPC_ROLE_LSE)
        return cpc_error(CPC_E_INTERNAL, "rank %d: bind_input: role %s is not an input role",
                         ex->cfg.rank, cpc_buf_role_name(role));
    if (!ex->input_bytes[role])
        return NULL; /* no buffer takes it */
    if (bytes != ex->input_bytes[role])
        return cpc_error(CPC_E_INPUT, "rank %d: input %s: %zu bytes given, this rank's shard needs %zu",
                         ex->cfg.rank, cpc_buf_role_name(role), bytes, ex->input_bytes[role]);
    ex->inputs[role] = host;
    return NULL;
}

void cpc_exec_set_device_io(cpc_exec *ex, bool on) { ex->device_io = on; }

/* The caller's memory <-> a buffer: host memory through upload/download, or
 * with device_io memory of the backend through its copy. */
static cpc_status *xfer_in(cpc_exec *ex, void *buf, const void *src, size_t n)
{
    return ex->device_io ? cpc_backend_copy(ex->cfg.backend, buf, src, n)
                         : cpc_backend_upload(ex->cfg.backend, buf, src, n);
}

static cpc_status *xfer_out(cpc_exec *ex, void *dst, const void *buf, size_t n)
{
    return ex->device_io ? cpc_backend_copy(ex->cfg.backend, dst, buf, n)
                         : cpc_backend_download(ex->cfg.backend, dst, buf, n);
}

static cpc_status *xfer_rank_rows(cpc_exec *ex, int b, void *host, const void *chost, bool upload)
{
    const cpc_layout *L = ex->L;
    geom g = geom_of(ex->prog, &ex->c, b, ex->tags[b]);
    size_t row = (size_t)g.hn * (size_t)L->D * (size_t)g.es;
    int64_t Trank = cpc_layout_rank_tokens(L, (int)ex->c.p);
    if (g.bytes > ex->bufs[b].cap)
        return cpc_error(CPC_E_INTERNAL, "rank %d: buffer '%s' is too small (%zu > %zu)", ex->cfg.rank,
                         ex->prog->buffers[b].name, g.bytes, ex->bufs[b].cap);
    int n = runs_of(ex->prog, &ex->c, b, ex->tags[b], ex->qruns, ex->max_runs);
    for (int64_t bi = 0; bi < L->B; bi++) {
        int64_t t = 0;
        for (int i = 0; i < n; i++) {
            int64_t ro = cpc_layout_rank_offset(L, (int)ex->c.p, ex->qruns[i].start);
            if (ro < 0 || ro + ex->qruns[i].len > Trank)
                return cpc_error(CPC_E_INTERNAL, "rank %d: buffer '%s': tokens [%lld, +%lld) are not this "
                                                 "rank's", ex->cfg.rank, ex->prog->buffers[b].name,
                                 (long long)ex->qruns[i].start, (long long)ex->qruns[i].len);
            char *bp = (char *)ex->bufs[b].ptr + ((size_t)(bi * g.T + t)) * row;
            size_t ho = (size_t)(bi * Trank + ro) * row, nb = (size_t)ex->qruns[i].len * row;
            cpc_status *st = upload ? xfer_in(ex, bp, (const char *)chost + ho, nb)
                                    : xfer_out(ex, (char *)host + ho, bp, nb);
            if (st)
                return st;
            t += ex->qruns[i].len;
        }
    }
    return NULL;
}

/* Uploads the saved LSE's buffer b (rep_lse) from the caller's `host`. */
static cpc_status *upload_rep_lse(cpc_exec *ex, int b, const float *host)
{
    const cpc_layout *L = ex->L;
    const cpc_program *prog = ex->prog;
    geom g = geom_of(prog, &ex->c, b, ex->tags[b]);
    if (g.bytes > ex->bufs[b].cap)
        return cpc_error(CPC_E_INTERNAL, "rank %d: buffer '%s' is too small", ex->cfg.rank, prog->buffers[b].name);
    if (L->U > 1) {
        /* back to back: the sharded rows' buffer, then the replicated rows' */
        size_t off = 0;
        if (prog->buffers[b].tokens == CPC_TOK_KV)
            for (int i = 0; i < prog->n_buffers; i++)
                if (i != b && rep_lse(ex, i) && prog->buffers[i].tokens != CPC_TOK_KV)
                    off = geom_of(prog, &ex->c, i, ex->tags[i]).bytes;
        return xfer_in(ex, ex->bufs[b].ptr, (const char *)host + off, g.bytes);
    }
    /* U == 1: [B, H, T] in the rank's token order; this buffer's rows */
    int64_t T = cpc_layout_rank_tokens(L, (int)ex->c.p), rows = (int64_t)L->B * g.hn;
    int n = runs_of(prog, &ex->c, b, ex->tags[b], ex->qruns, ex->max_runs);
    int64_t t = 0;
    for (int i = 0; i < n; i++) {
        int64_t ro = cpc_layout_rank_offset(L, (int)ex->c.p, ex->qruns[i].start);
        if (ro < 0 || ro + ex->qruns[i].len > T)
            return cpc_error(CPC_E_INTERNAL, "rank %d: LSE rows not this rank's", ex->cfg.rank);
        for (int64_t r = 0; r < rows; r++) {
            cpc_status *st = xfer_in(ex, (float *)ex->bufs[b].ptr + r * g.T + t, host + r * T + ro,
                                     (size_t)ex->qruns[i].len * sizeof(float));
            if (st)
                return st;
        }
        t += ex->qruns[i].len;
    }
    return NULL;
}

cpc_status *cpc_exec_reset(cpc_exec *ex)
{
    const cpc_program *prog = ex->prog;
    for (int b = 0; b < prog->n_buffers; b++) {
        const cpc_buffer *bf = &prog->buffers[b];
        ex->tags[b] = (int)ex->c.r;
        if (bf->io != CPC_IO_INPUT)
            continue;
        if (!ex->inputs[bf->role])
            return cpc_error(CPC_E_INPUT, "rank %d: input %s is not bound", ex->cfg.rank,
                             cpc_buf_role_name(bf->role));
        size_t n = ex->input_bytes[bf->role];
        if (rep_lse(ex, b)) {
            cpc_status *st = upload_rep_lse(ex, b, ex->inputs[bf->role]);
            if (st) {
                cpc_status_prefix(st, "rank %d: uploading input '%s'", ex->cfg.rank, bf->name);
                return st;
            }
            continue;
        }
        if (!rank_io(ex, bf->role) && n > ex->bufs[b].cap)
            return cpc_error(CPC_E_INTERNAL, "rank %d: input buffer '%s' is too small (%zu > %zu)",
                             ex->cfg.rank, bf->name, n, ex->bufs[b].cap);
        cpc_status *st = rank_io(ex, bf->role) ? xfer_rank_rows(ex, b, NULL, ex->inputs[bf->role], true)
                                                : xfer_in(ex, ex->bufs[b].ptr, ex->inputs[bf->role], n);
        if (st) {
            cpc_status_prefix(st, "rank %d: uploading input '%s'", ex->cfg.rank, bf->name);
            return st;
        }
    }
    return NULL;
}

/* ---- op execution ------------------------------------------------------------------- */

static cpc_status *errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static cpc_status *errf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = cpc_diagv(CPC_E_INTERNAL, 0, CPC_SEV_ERROR, CPC_NO_SPAN, fmt, ap);
    va_end(ap);
    return st;
}

static const char *bname(const cpc_exec *ex, int b)
{
    return ex->prog->buffers[b].name;
}

static geom cur_geom(const cpc_exec *ex, int b)
{
    return geom_of(ex->prog, &ex->c, b, ex->tags[b]);
}

static cpc_status *check_fits(const cpc_exec *ex, int b, size_t bytes)
{
    if (bytes > ex->bufs[b].cap)
        return errf("buffer '%s' would hold %zu bytes, its capacity is %zu", bname(ex, b), bytes,
                    ex->bufs[b].cap);
    return NULL;
}

/* The pending-request guard, for every op that touches a buffer (program.h
 * CPC_LIFE_UNTIL_WAIT): by the op table's operand access, a buffer with a
 * send in flight may be read (sent again, attended), nothing else; a buffer
 * with a recv in flight may not be touched at all, until the wait. */
static cpc_status *guard_pending(const cpc_exec *ex, const cpc_op *op)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    if (!info || ex->n_pend == 0)
        return NULL;
    for (int side = 0; side < 2; side++) {
        cpc_access acc = side ? info->out_access : info->in_access;
        int n = side ? op->n_out : op->n_in;
        const int *bufs = side ? op->out : op->in;
        if (acc == CPC_ACCESS_NONE)
            continue;
        for (int i = 0; i < n && i < CPC_OP_MAX_BUFS; i++)
            for (int j = 0; j < ex->n_pend; j++) {
                const pending *pe = &ex->pend[j];
                if (pe->buf != bufs[i] || (pe->send && acc == CPC_ACCESS_READ))
                    continue;
                return errf("'%s' is %s while its %s (tag %d) is in flight (before the wait that completes it)",
                            bname(ex, bufs[i]),
                            acc == CPC_ACCESS_READ    ? "read"
                            : acc == CPC_ACCESS_WRITE ? "written"
                            : acc == CPC_ACCESS_REBIND ? "swapped"
                                                       : "accumulated into",
                            pe->send ? "send" : "recv", pe->tag);
            }
    }
    return NULL;
}

/* The layout guard, for every op with a table content column (program.h
 * cpc_role_can_hold): an operand of another layout (an LSE-role buffer as
 * attn_bwd's dq, a gradient as its lse) is refused before a kernel sizes it
 * by the slot and runs past the buffer. */
static cpc_status *guard_layouts(const cpc_exec *ex, const cpc_op *op)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    if (!info)
        return NULL;
    for (int side = 0; side < 2; side++) {
        int n = side ? op->n_out : op->n_in;
        const int *bufs = side ? op->out : op->in;
        const signed char *want = side ? info->out_content : info->in_content;
        for (int i = 0; i < n && i < CPC_OP_MAX_BUFS; i++) {
            cpc_buf_role r = ex->prog->buffers[bufs[i]].role;
            if (!cpc_role_can_hold(r, (cpc_content)want[i]))
                return errf("%s[%d] '%s' (role %s) cannot hold %s: another layout", side ? "out" : "in", i,
                            bname(ex, bufs[i]), cpc_buf_role_name(r), cpc_content_name((cpc_content)want[i]));
        }
    }
    return NULL;
}

/* Content tags (which ring block a BLOCK buffer holds) by the op table's
 * tag rule (cpc_op_apply_tags; program.h "Content tags"), set before the op
 * runs: the op reads and writes its outputs at their new content's geometry
 * (a recv's block, attn's query rows, ...).  The per-op code sets no tag
 * itself (one exception, op_copy: SHARD p carried into a BLOCK buffer is
 * block r when U == 1, the same content).  An evaluation error of `block` is
 * the op's error. */
static cpc_status *apply_tags(cpc_exec *ex, const cpc_op *op, const cpc_coords *c)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    if (!info || info->tags == CPC_TAGR_KEEP)
        return NULL;
    int64_t block = -1;
    if (op->block && info->tags != CPC_TAGR_EXCHANGE) {
        cpc_status *st = cpc_expr_eval(op->block, c, &block);
        if (st)
            return st;
    }
    cpc_op_apply_tags(ex->prog, op, c, block, ex->tags);
    return NULL;
}

static cpc_status *need(const cpc_op *op, int n_in, int n_out)
{
    if (op->n_in < n_in || op->n_out < n_out)
        return errf("needs %d input and %d output buffers, has %d and %d", n_in, n_out, op->n_in,
                    op->n_out);
    return NULL;
}

static bool is_grad(cpc_buf_role r)
{
    return r == CPC_ROLE_DQ || r == CPC_ROLE_DK || r == CPC_ROLE_DV;
}

static cpc_status *op_init_acc(cpc_exec *ex, const cpc_op *op, const cpc_coords *c)
{
    if (op->n_out >= 1 && is_grad(ex->prog->buffers[op->out[0]].role)) {
        /* Gradient accumulators (backward): zero the whole capacity; with a
         * `block`, they become that ring block's accumulators (tag). */
        int64_t blk = -1;
        if (op->block) {
            cpc_status *st = cpc_expr_eval(op->block, c, &blk);
            if (st)
                return st;
            if (blk < 0 || blk >= ex->L->R)
                return errf("block %lld outside 0..%d", (long long)blk, ex->L->R - 1);
        }
        for (int i = 0; i < op->n_out; i++) {
            int b = op->out[i];
            if (!is_grad(ex->prog->buffers[b].role))
                return errf("'%s': init_acc of gradients takes only dq/dk/dv buffers", bname(ex, b));
            cpc_status *st = cpc_backend_init_acc(ex->cfg.backend, ex->bufs[b].ptr, ex->bufs[b].cap / 4, NULL, 0);
            if (st)
                return st;
        }
        return NULL;
    }
    int acc, lse;
    if (op->n_out >= 2) {
        acc = op->out[0];
        lse = op->out[1];
    } else if (op->n_in >= 2) {
        acc = op->in[0];
        lse = op->in[1];
    } else {
        return errf("needs an ACC and an LSE buffer");
    }
    /* The accumulator's rows are whatever the first merge brings (its tag:
     * the table's rule, KEEP here, then merge's FROM_IN0): zero the whole
     * capacity, as the provers take an initialised accumulator to fit any
     * rows. */
    geom ga = cur_geom(ex, acc), gl = cur_geom(ex, lse);
    if (ga.es != 4 || gl.es != 4)
        return errf("'%s' and '%s' must be fp32 (ACC/LSE roles)", bname(ex, acc), bname(ex, lse));
    return cpc_backend_init_acc(ex->cfg.backend, ex->bufs[acc].ptr, ex->bufs[acc].cap / 4,
                                ex->bufs[lse].ptr, ex->bufs[lse].cap / 4);
}

/* The attention problem (attn_problem.h) of an attn, attn_bwd or delta op:
 * the query side from buffer q (rows, heads, runs, the plan's geometry and
 * key padding); with k >= 0 the key side from k and v: block op->block of
 * gathered (ALL) K/V read in place, *kv_off its first element (0 otherwise).
 * The checks here are those that name the program's buffers (K and V of
 * one layout and block, the plan's dtype); the problem's own geometry is
 * checked once, by the backend (cpc_attn_problem_check). */
static cpc_status *attn_problem(cpc_exec *ex, const cpc_op *op, const cpc_coords *c, int q, int k, int v,
                                cpc_attn_problem *p, int64_t *kv_off)
{
    const cpc_program *prog = ex->prog;
    const cpc_layout *L = ex->L;
    geom gq = cur_geom(ex, q);
    memset(p, 0, sizeof *p);
    *kv_off = 0;
    p->B = L->B;
    p->d = L->D;
    p->group = L->group;
    p->dtype = L->dtype;
    p->scale = ex->scale;
    p->causal = L->causal;
    p->kv_mask = ex->cfg.kv_mask;
    p->mask_len = L->Skv;
    p->sq = gq.T;
    p->hq = gq.hn;
    p->q_head_off = gq.hoff;
    p->q = ex->bufs[q].ptr;
    p->q_bstride = gq.T * gq.hn * L->D;
    p->n_q_runs = runs_of(prog, &ex->c, q, ex->tags[q], ex->qruns, ex->max_runs);
    p->q_runs = ex->qruns;
    p->kv_runs = ex->kvruns;
    if (k < 0) { /* no key (delta): every K/V head, no rows */
        p->hkv = L->Hkv;
        return NULL;
    }
    geom gk = cur_geom(ex, k), gv = cur_geom(ex, v);
    if (prog->buffers[k].tokens != prog->buffers[v].tokens || gk.hn != gv.hn || gk.hoff != gv.hoff)
        return errf("K '%s' and V '%s' have different layouts", bname(ex, k), bname(ex, v));
    if (prog->buffers[k].tokens == CPC_TOK_BLOCK && ex->tags[k] != ex->tags[v])
        return errf("K '%s' holds block %d but V '%s' holds block %d", bname(ex, k), ex->tags[k],
                    bname(ex, v), ex->tags[v]);
    if (gq.es != cpc_dtype_size(L->dtype) || gk.es != gq.es)
        return errf("Q/K/V buffers must be in the plan's dtype");
    p->hkv = gk.hn;
    p->kv_head_off = gk.hoff;
    p->skv = gk.T;
    p->kv_bstride = gk.T * gk.hn * L->D;
    int64_t bi = -1;
    cpc_status *st;
    if (op->block && (st = cpc_expr_eval(op->block, c, &bi)))
        return st;
    if (op->block && prog->buffers[k].tokens == CPC_TOK_ALL) {
        if (bi < 0 || bi >= L->R)
            return errf("block %lld outside 0..%d", (long long)bi, L->R - 1);
        *kv_off = cpc_layout_block_offset(L, (int)bi) * gk.hn * L->D;
        p->skv = cpc_layout_block_tokens(L, (int)bi);
        p->n_kv_runs = cpc_layout_block_runs(L, (int)bi, ex->kvruns, ex->max_runs);
    } else {
        if (op->block && prog->buffers[k].tokens == CPC_TOK_BLOCK && bi != ex->tags[k])
            return errf("reads block %lld but '%s' holds block %d", (long long)bi, bname(ex, k), ex->tags[k]);
        p->n_kv_runs = runs_of(prog, &ex->c, k, ex->tags[k], ex->kvruns, ex->max_runs);
    }
    p->k = (const char *)ex->bufs[k].ptr + *kv_off * gk.es;
    p->v = (const char *)ex->bufs[v].ptr + *kv_off * gk.es;
    return NULL;
}

static cpc_status *op_attn(cpc_exec *ex, const cpc_op *op, const cpc_coords *c)
{
    cpc_status *st = need(op, 3, 2);
    if (st)
        return st;
    int q = op->in[0], k = op->in[1], v = op->in[2], o = op->out[0], lse = op->out[1];
    cpc_attn_args a = {0};
    int64_t kv_off;
    if ((st = attn_problem(ex, op, c, q, k, v, &a.p, &kv_off)))
        return st;
    geom go = cur_geom(ex, o), gl = cur_geom(ex, lse);
    if (go.es != 4 || gl.es != 4)
        return errf("outputs '%s' and '%s' must be fp32", bname(ex, o), bname(ex, lse));
    if (go.hn != a.p.hq || go.T != a.p.sq || gl.hn != a.p.hq)
        return errf("output '%s' (%lld tokens, %d heads) does not match Q '%s' (%lld tokens, %d heads)",
                    bname(ex, o), (long long)go.T, go.hn, bname(ex, q), (long long)a.p.sq, a.p.hq);
    if ((st = check_fits(ex, o, go.bytes)) || (st = check_fits(ex, lse, gl.bytes)))
        return st;
    a.o = ex->bufs[o].ptr;
    a.lse = ex->bufs[lse].ptr;
    ex->cur.attn_flops += 4.0 * (double)a.p.B * (double)a.p.sq * (double)a.p.skv * a.p.hq * a.p.d;
    return cpc_backend_attn(ex->cfg.backend, &a);
}

/* delta in=dout,out out=delta: the block backward with no key (backend.h). */
static cpc_status *op_delta(cpc_exec *ex, const cpc_op *op, const cpc_coords *c)
{
    cpc_status *st = need(op, 2, 1);
    if (st)
        return st;
    int d = op->in[0], o = op->in[1], dl = op->out[0];
    geom gd = cur_geom(ex, d), go = cur_geom(ex, o);
    geom gl = cur_geom(ex, dl);
    if (gd.T != go.T || gd.hn != go.hn || gl.T != gd.T || gl.hn != gd.hn || gl.es != 4)
        return errf("dout '%s', out '%s' and delta '%s' must hold the same rows and heads", bname(ex, d),
                    bname(ex, o), bname(ex, dl));
    if ((st = check_fits(ex, dl, gl.bytes)))
        return st;
    cpc_attn_bwd_args a = {0};
    int64_t kv_off;
    if ((st = attn_problem(ex, op, c, d, -1, -1, &a.p, &kv_off)))
        return st;
    a.dout = ex->bufs[d].ptr;
    a.dout_bstride = a.out_bstride = a.p.q_bstride;
    a.out = ex->bufs[o].ptr;
    a.out_dtype = go.es == 4 ? CPC_DTYPE_FP32 : ex->L->dtype;
    a.delta = ex->bufs[dl].ptr;
    a.compute_delta = true;
    return cpc_backend_attn_bwd(ex->cfg.backend, &a);
}

/* attn_bwd in=q,k,v,dout,lse,delta out=dq,dk,dv (+=). */
static cpc_status *op_attn_bwd(cpc_exec *ex, const cpc_op *op, const cpc_coords *c)
{
    cpc_status *st = need(op, 6, 3);
    if (st)
        return st;
    const cpc_program *prog = ex->prog;
    int q = op->in[0], k = op->in[1], v = op->in[2], d = op->in[3], l = op->in[4], dl = op->in[5];
    int dq = op->out[0], dk = op->out[1], dv = op->out[2];
    bool all = prog->buffers[k].tokens == CPC_TOK_ALL;
    if (all != (prog->buffers[dk].tokens == CPC_TOK_ALL) || all != (prog->buffers[dv].tokens == CPC_TOK_ALL))
        return errf("K, V, dK and dV must all be gathered (ALL) or none");
    if (all && !op->block)
        return errf("attn_bwd on gathered K/V needs a block");
    int kt = ex->tags[k];
    if (prog->buffers[k].tokens == CPC_TOK_BLOCK && (ex->tags[dk] != kt || ex->tags[dv] != kt))
        return errf("K '%s' holds block %d but dK/dV hold blocks %d/%d", bname(ex, k), kt, ex->tags[dk],
                    ex->tags[dv]);
    cpc_attn_bwd_args a = {0};
    int64_t kv_off;
    if ((st = attn_problem(ex, op, c, q, k, v, &a.p, &kv_off)))
        return st;
    geom gq = cur_geom(ex, q), gk = cur_geom(ex, k), gd = cur_geom(ex, d);
    geom gdq = cur_geom(ex, dq), gdk = cur_geom(ex, dk), gl = cur_geom(ex, l), gdl = cur_geom(ex, dl);
    if (gd.T != gq.T || gdq.T != gq.T || gl.T != gq.T || gdl.T != gq.T || gd.hn != gq.hn || gdq.hn != gq.hn ||
        gl.hn != gq.hn || gdl.hn != gq.hn)
        return errf("dout/lse/delta/dq do not match Q '%s' (%lld tokens, %d heads)", bname(ex, q),
                    (long long)gq.T, gq.hn);
    if (gdk.T != gk.T || gdk.hn != gk.hn || gdk.hoff != gk.hoff || gdq.es != 4 || gdk.es != 4)
        return errf("dK '%s' does not match K '%s', or a gradient is not fp32", bname(ex, dk), bname(ex, k));
    if ((st = check_fits(ex, dq, gdq.bytes)) || (st = check_fits(ex, dk, gdk.bytes)) ||
        (st = check_fits(ex, dv, gdk.bytes)))
        return st;
    a.dout = ex->bufs[d].ptr;
    a.dout_bstride = a.out_bstride = a.p.q_bstride;
    a.lse = ex->bufs[l].ptr;
    a.delta = ex->bufs[dl].ptr;
    a.dq = ex->bufs[dq].ptr;
    a.dk = (float *)ex->bufs[dk].ptr + kv_off;
    a.dv = (float *)ex->bufs[dv].ptr + kv_off;
    if (all) /* block bi's slice of the gathered dK/dV, in place */
        a.dkv_bstride = a.p.kv_bstride;
    ex->cur.attn_flops += 2.5 * 4.0 * (double)a.p.B * (double)a.p.sq * (double)a.p.skv * a.p.hq * a.p.d;
    return cpc_backend_attn_bwd(ex->cfg.backend, &a);
}

/* add in=a out=b: b += a (fp32 gradients of the same rows, heads and block). */
static cpc_status *op_add(cpc_exec *ex, const cpc_op *op)
{
    cpc_status *st = need(op, 1, 1);
    if (st)
        return st;
    int a = op->in[0], b = op->out[0];
    const cpc_buffer *ba = &ex->prog->buffers[a], *bb = &ex->prog->buffers[b];
    geom ga = cur_geom(ex, a), gb = cur_geom(ex, b);
    if (!is_grad(ba->role) || ba->role != bb->role || ba->tokens != bb->tokens || ga.T != gb.T || ga.hn != gb.hn ||
        ga.hoff != gb.hoff || ex->tags[a] != ex->tags[b])
        return errf("add: '%s' (block %d) and '%s' (block %d) must be gradients of one role, rows and heads",
                    ba->name, ex->tags[a], bb->name, ex->tags[b]);
    return cpc_backend_add_strided(ex->cfg.backend, ex->bufs[b].ptr, ex->bufs[a].ptr, 1, 1, 1, ga.elems, 0, 0, 0,
                                   0, 0, 0);
}

static cpc_status *op_merge(cpc_exec *ex, const cpc_op *op)
{
    cpc_status *st = need(op, 2, 2);
    if (st)
        return st;
    int o = op->in[0], l = op->in[1], acc = op->out[0], al = op->out[1];
    geom go = cur_geom(ex, o), gl = cur_geom(ex, l);
    geom ga = cur_geom(ex, acc), gal = cur_geom(ex, al);
    if (go.es != 4 || gl.es != 4 || ga.es != 4 || gal.es != 4)
        return errf("merge operands must be fp32");
    if (go.T != ga.T || go.hn != ga.hn || gl.T != gal.T || gl.hn != gal.hn || go.T != gl.T)
        return errf("block '%s' (%lld tokens, %d heads) does not match accumulator '%s' (%lld tokens, %d heads)",
                    bname(ex, o), (long long)go.T, go.hn, bname(ex, acc), (long long)ga.T, ga.hn);
    if ((st = check_fits(ex, acc, ga.bytes)) || (st = check_fits(ex, al, gal.bytes)))
        return st;
    cpc_merge_args m = {.B = ex->L->B, .s = go.T, .h = go.hn, .d = ex->L->D,
                        .acc = ex->bufs[acc].ptr, .acc_lse = ex->bufs[al].ptr,
                        .o = ex->bufs[o].ptr, .lse = ex->bufs[l].ptr};
    return cpc_backend_merge(ex->cfg.backend, &m);
}

static cpc_status *push_pending(cpc_exec *ex, cpc_request *req, int tag, int buf, bool send)
{
    if (ex->n_pend == ex->cap_pend) {
        int nc = ex->cap_pend ? 2 * ex->cap_pend : 16;
        pending *p = realloc(ex->pend, (size_t)nc * sizeof *p);
        if (!p)
            return cpc_error(CPC_E_NOMEM, "executor: out of memory");
        ex->pend = p;
        ex->cap_pend = nc;
    }
    ex->pend[ex->n_pend++] = (pending){req, tag, buf, send};
    return NULL;
}

static cpc_status *need_transport(const cpc_exec *ex)
{
    if (!ex->cfg.transport)
        return errf("no transport (communication op in a program run without one)");
    return NULL;
}

static cpc_status *op_send(cpc_exec *ex, const cpc_op *op, const cpc_coords *c, int64_t *sent)
{
    cpc_status *st = need_transport(ex);
    if (st)
        return st;
    if (!op->peer)
        return errf("send without a peer");
    int64_t peer;
    if ((st = cpc_expr_eval(op->peer, c, &peer)))
        return st;
    cpc_transport *t = ex->cfg.transport;
    int me = cpc_transport_group_rank(t, op->group);
    for (int i = 0; i < op->n_in; i++) {
        int b = op->in[i];
        geom g = cur_geom(ex, b);
        cpc_request *req = NULL;
        if ((st = cpc_transport_isend(t, op->group, (int)peer, ex->bufs[b].ptr, g.bytes, op->tag, &req)))
            return st;
        if ((st = push_pending(ex, req, op->tag, b, true)))
            return st;
        if (peer != me)
            *sent += (int64_t)g.bytes;
    }
    return NULL;
}

static cpc_status *op_recv(cpc_exec *ex, const cpc_op *op, const cpc_coords *c)
{
    cpc_status *st = need_transport(ex);
    if (st)
        return st;
    if (!op->peer)
        return errf("recv without a peer");
    int64_t peer, blk = -1;
    if ((st = cpc_expr_eval(op->peer, c, &peer)))
        return st;
    if (op->block) {
        if ((st = cpc_expr_eval(op->block, c, &blk)))
            return st;
        if (blk < 0 || blk >= ex->L->R)
            return errf("block %lld outside 0..%d", (long long)blk, ex->L->R - 1);
    }
    cpc_transport *t = ex->cfg.transport;
    for (int i = 0; i < op->n_out; i++) {
        int b = op->out[i];
        if (ex->prog->buffers[b].tokens == CPC_TOK_BLOCK && blk < 0)
            return errf("recv into BLOCK buffer '%s' without a block", bname(ex, b));
        geom g = cur_geom(ex, b);
        if ((st = check_fits(ex, b, g.bytes)))
            return st;
        cpc_request *req = NULL;
        if ((st = cpc_transport_irecv(t, op->group, (int)peer, ex->bufs[b].ptr, g.bytes, op->tag, &req)))
            return st;
        if ((st = push_pending(ex, req, op->tag, b, false)))
            return st;
    }
    return NULL;
}

static cpc_status *op_wait(cpc_exec *ex, const cpc_op *op)
{
    cpc_status *first = NULL;
    int j = 0;
    for (int i = 0; i < ex->n_pend; i++) {
        if (ex->pend[i].tag != op->tag) {
            ex->pend[j++] = ex->pend[i];
            continue;
        }
        cpc_status *st = cpc_transport_wait(ex->cfg.transport, ex->pend[i].req);
        if (st && !first)
            first = st;
        else
            cpc_status_free(st);
    }
    ex->n_pend = j;
    return first;
}

static cpc_status *op_swap(cpc_exec *ex, const cpc_op *op)
{
    if (op->n_in < 2)
        return errf("needs two buffers");
    int a = op->in[0], b = op->in[1];
    /* the memory; the tags were exchanged by the table's rule (apply_tags) */
    xbuf t = ex->bufs[a];
    ex->bufs[a] = ex->bufs[b];
    ex->bufs[b] = t;
    return NULL;
}

static cpc_status *op_all_to_all(cpc_exec *ex, const cpc_op *op, int64_t *sent)
{
    cpc_status *st = need_transport(ex);
    if (st)
        return st;
    const cpc_program *prog = ex->prog;
    const cpc_layout *L = ex->L;
    int U = L->U;
    size_t *sc = ex->a2a, *sd = sc + U, *rc = sd + U, *rd = rc + U;
    size_t stot, rtot;
    if ((st = a2a_sizes(prog, &ex->c, op, sc, sd, rc, rd, &stot, &rtot)))
        return st;
    int in = op->in[0], out = op->out[0];
    cpc_backend *be = ex->cfg.backend;
    int es = cpc_buffer_elem_size(prog, in);
    int64_t B = L->B, D = L->D;
    int64_t r = ex->c.r;
    int u = (int)ex->c.u;
    bool b1 = B == 1;
    const void *sendp;
    void *recvp;
    int64_t Tu = cpc_layout_shard_tokens(L, (int)ex->c.p);
    int64_t Tblk = cpc_layout_block_tokens(L, (int)r);
    if (prog->buffers[in].role == CPC_ROLE_LSE) {
        /* seq_to_heads of an LSE-layout buffer (the backward's delta):
         * in [B, H, Tu] -> out [B, hu, Tblk]; member j gets [B, h_j, Tu],
         * member j's [B, hu, Tj] lands at token offset tok_j of every row. */
        int hin = geom_of(prog, &ex->c, in, (int)ex->c.p).hn;
        int uo, un;
        cpc_buffer_heads(prog, out, u, &uo, &un);
        geom go = cur_geom(ex, out);
        if ((st = check_fits(ex, out, go.bytes)))
            return st;
        if (stot > ex->stage_send_cap || rtot > ex->stage_recv_cap)
            return errf("staging space too small (%zu > %zu or %zu > %zu)", stot, ex->stage_send_cap, rtot,
                        ex->stage_recv_cap);
        for (int j = 0; j < U; j++) {
            int jo, jn;
            cpc_buffer_heads(prog, out, j, &jo, &jn);
            if (jn > 0 && Tu > 0 &&
                (st = cpc_backend_copy_strided(be, (char *)ex->stage_send + sd[j],
                                               (const char *)ex->bufs[in].ptr + (int64_t)jo * Tu * 4, 4, B, 1, 1,
                                               jn * Tu, jn * Tu, 0, 0, hin * Tu, 0, 0)))
                return st;
        }
        if ((st = cpc_transport_all_to_all_v(ex->cfg.transport, op->group, ex->stage_send, sc, sd, ex->stage_recv,
                                             rc, rd)))
            return st;
        int64_t tok = 0;
        for (int j = 0; j < U; j++) {
            int64_t Tj = cpc_layout_shard_tokens(L, (int)(r * U + j));
            if (Tj > 0 && un > 0 &&
                (st = cpc_backend_copy_strided(be, (char *)ex->bufs[out].ptr + tok * 4,
                                               (const char *)ex->stage_recv + rd[j], 4, B, un, 1, Tj, un * Tblk,
                                               Tblk, 0, un * Tj, Tj, 0)))
                return st;
            tok += Tj;
        }
        for (int j = 0; j < U; j++)
            if (j != u)
                *sent += (int64_t)sc[j];
        return NULL;
    }
    if (op->dir == CPC_A2A_SEQ_TO_HEADS) {
        /* in [B, Tu, Hin, D] -> out [B, Tblk, hu, D]. */
        geom gi = geom_of(prog, &ex->c, in, (int)ex->c.p);
        int hin = gi.hn;
        int uo, un;
        cpc_buffer_heads(prog, out, u, &uo, &un);
        geom go = cur_geom(ex, out);
        if ((st = check_fits(ex, out, go.bytes)))
            return st;
        if (stot > ex->stage_send_cap)
            return errf("staging space too small (%zu > %zu)", stot, ex->stage_send_cap);
        for (int j = 0; j < U; j++) {
            int jo, jn;
            cpc_buffer_heads(prog, out, j, &jo, &jn);
            if (jn == 0 || Tu == 0)
                continue;
            if ((st = cpc_backend_copy_strided(be, (char *)ex->stage_send + sd[j],
                                           (const char *)ex->bufs[in].ptr + (int64_t)jo * D * es,
                                           (size_t)es, B, Tu, 1, jn * D, Tu * jn * D, jn * D, 0,
                                           Tu * hin * D, hin * D, 0)))
                return st;
        }
        sendp = ex->stage_send;
        if (b1) {
            /* Member j's tokens land at its token offset within the block. */
            size_t off = 0;
            for (int j = 0; j < U; j++) {
                rd[j] = off;
                off += rc[j];
            }
            recvp = ex->bufs[out].ptr;
        } else {
            if (rtot > ex->stage_recv_cap)
                return errf("staging space too small (%zu > %zu)", rtot, ex->stage_recv_cap);
            recvp = ex->stage_recv;
        }
        if ((st = cpc_transport_all_to_all_v(ex->cfg.transport, op->group, sendp, sc, sd,
                                                      recvp, rc, rd)))
            return st;
        if (!b1) {
            int64_t tok = 0;
            for (int j = 0; j < U; j++) {
                int64_t Tj = cpc_layout_shard_tokens(L, (int)(r * U + j));
                if (Tj > 0 && un > 0 &&
                    (st = cpc_backend_copy_strided(be, (char *)ex->bufs[out].ptr + tok * un * D * es,
                                               (const char *)ex->stage_recv + rd[j], (size_t)es,
                                               B, 1, 1, Tj * un * D, Tblk * un * D, 0, 0,
                                               Tj * un * D, 0, 0)))
                    return st;
                tok += Tj;
            }
        }
    } else {
        /* in [B, Tblk, hu, D] (block r) -> out [B, Tu, Hout, D]. */
        if (prog->buffers[in].tokens != CPC_TOK_KV && ex->tags[in] != (int)r)
            return errf("'%s' holds block %d, not this rank's block %lld", bname(ex, in),
                        ex->tags[in], (long long)r);
        int uo, un;
        cpc_buffer_heads(prog, in, u, &uo, &un);
        geom go = geom_of(prog, &ex->c, out, (int)ex->c.p);
        int hout = go.hn;
        if ((st = check_fits(ex, out, go.bytes)))
            return st;
        /* replicated rows (KV): all of them go to every member */
        bool kvrep = prog->buffers[in].tokens == CPC_TOK_KV;
        if (kvrep)
            Tu = Tblk = cpc_layout_kv_rows(L);
        if (b1) {
            size_t off = 0;
            for (int j = 0; j < U; j++) {
                sd[j] = kvrep ? 0 : off;
                off += sc[j];
            }
            sendp = ex->bufs[in].ptr;
        } else {
            if (stot > ex->stage_send_cap)
                return errf("staging space too small (%zu > %zu)", stot, ex->stage_send_cap);
            int64_t tok = 0;
            for (int j = 0; j < U; j++) {
                int64_t Tj = kvrep ? Tu : cpc_layout_shard_tokens(L, (int)(r * U + j));
                if (kvrep)
                    tok = 0;
                if (Tj > 0 && un > 0 &&
                    (st = cpc_backend_copy_strided(be, (char *)ex->stage_send + sd[j],
                                               (const char *)ex->bufs[in].ptr + tok * un * D * es,
                                               (size_t)es, B, 1, 1, Tj * un * D, Tj * un * D, 0, 0,
                                               Tblk * un * D, 0, 0)))
                    return st;
                tok += Tj;
            }
            sendp = ex->stage_send;
        }
        if (rtot > ex->stage_recv_cap)
            return errf("staging space too small (%zu > %zu)", rtot, ex->stage_recv_cap);
        recvp = ex->stage_recv;
        if (!op->reduce) {
            /* Members' head parts must not overlap: a head held by two
             * members (shared K/V heads) would keep only one part. */
            int prev_end = 0;
            for (int j = 0; j < U; j++) {
                int jo, jn;
                cpc_buffer_heads(prog, in, j, &jo, &jn);
                if (jn > 0 && jo < prev_end)
                    return errf("'%s': head %d is held by two ulysses members: its parts must be summed "
                                "(all_to_all reduce=sum)", bname(ex, in), jo);
                if (jn > 0)
                    prev_end = jo + jn;
            }
        }
        if ((st = cpc_transport_all_to_all_v(ex->cfg.transport, op->group, sendp, sc, sd,
                                                      recvp, rc, rd)))
            return st;
        if (op->reduce && (st = cpc_backend_init_acc(be, ex->bufs[out].ptr, (size_t)go.elems, NULL, 0)))
            return st;
        for (int j = 0; j < U; j++) {
            int jo, jn;
            cpc_buffer_heads(prog, in, j, &jo, &jn);
            if (jn == 0 || Tu == 0)
                continue;
            if (op->reduce)
                st = cpc_backend_add_strided(be, (float *)ex->bufs[out].ptr + (int64_t)jo * D,
                                             (const float *)(const void *)((const char *)ex->stage_recv + rd[j]),
                                             B, Tu, 1, jn * D, Tu * hout * D, hout * D, 0, Tu * jn * D, jn * D, 0);
            else
                st = cpc_backend_copy_strided(be, (char *)ex->bufs[out].ptr + (int64_t)jo * D * es,
                                              (const char *)ex->stage_recv + rd[j], (size_t)es, B, Tu, 1,
                                              jn * D, Tu * hout * D, hout * D, 0, Tu * jn * D, jn * D, 0);
            if (st)
                return st;
        }
    }
    for (int j = 0; j < U; j++)
        if (j != u)
            *sent += (int64_t)sc[j];
    return NULL;
}

/* The start of every collective but all_to_all: a transport, an input and
 * an output, and the one group the executor runs it over. */
static cpc_status *coll_begin(const cpc_exec *ex, const cpc_op *op, cpc_group group)
{
    cpc_status *st = need_transport(ex);
    if (!st)
        st = need(op, 1, 1);
    if (!st && op->group != group)
        st = errf("%s over the %s group is not supported (%s only)", cpc_op_kind_name(op->kind),
                  cpc_group_name(op->group), cpc_group_name(group));
    return st;
}

static cpc_status *op_all_gather(cpc_exec *ex, const cpc_op *op, int64_t *sent)
{
    cpc_status *st = coll_begin(ex, op, CPC_GROUP_RING);
    if (st)
        return st;
    const cpc_program *prog = ex->prog;
    const cpc_layout *L = ex->L;
    int in = op->in[0], out = op->out[0];
    const cpc_buffer *bi = &prog->buffers[in], *bo = &prog->buffers[out];
    if (bo->tokens != CPC_TOK_ALL)
        return errf("output '%s' must have the ALL token layout", bo->name);
    bool in_ok = bi->tokens == CPC_TOK_BLOCK || (bi->tokens == CPC_TOK_SHARD && L->U == 1);
    if (!in_ok)
        return errf("input '%s' must hold this rank's ring block", bi->name);
    int r = (int)ex->c.r;
    if (bi->tokens == CPC_TOK_BLOCK && ex->tags[in] != r)
        return errf("'%s' holds block %d, not this rank's block %d", bi->name, ex->tags[in], r);
    geom gi = cur_geom(ex, in), go = geom_of(prog, &ex->c, out, -1);
    if (gi.hn != go.hn || gi.hoff != go.hoff || gi.es != go.es || bi->role == CPC_ROLE_LSE)
        return errf("'%s' and '%s' differ in heads or element type", bi->name, bo->name);
    if ((st = check_fits(ex, out, go.bytes)))
        return st;
    int R = L->R;
    int64_t rowb = (int64_t)gi.hn * L->D * gi.es;
    size_t *cnt = ex->ag, *dsp = ex->ag + R;
    int64_t Tr = cpc_layout_block_tokens(L, r);
    for (int64_t b = 0; b < L->B; b++) {
        for (int i = 0; i < R; i++) {
            cnt[i] = (size_t)(cpc_layout_block_tokens(L, i) * rowb);
            dsp[i] = (size_t)((b * go.T + cpc_layout_block_offset(L, i)) * rowb);
        }
        if ((st = cpc_transport_all_gather_v(ex->cfg.transport, op->group,
                                                      (const char *)ex->bufs[in].ptr + b * Tr * rowb,
                                                      (size_t)(Tr * rowb), ex->bufs[out].ptr, cnt,
                                                      dsp)))
            return st;
        *sent += Tr * rowb * (R - 1);
    }
    return NULL;
}

/* The summing step both reducing collectives share (reduce_scatter over
 * the ring, all_reduce over the world): slice j of this member's fp32 `in`
 * (B batches of T tokens x `row` floats; slice j = ring block j when
 * `blocks`, else part j of tensor_split(T, P)) goes to member j, packed in
 * the send staging, by one all_to_all_v over `group`; the slices every
 * member sent this one are summed into `dst` (dst_elems floats: B x this
 * member's slice x row).  *sent += the bytes sent to the other members. */
static cpc_status *sum_slices(cpc_exec *ex, cpc_group group, bool blocks, const void *in, int64_t T,
                              int64_t row, float *dst, size_t dst_elems, int64_t *sent)
{
    const cpc_layout *L = ex->L;
    cpc_backend *be = ex->cfg.backend;
    int n = blocks ? L->R : L->P, me = blocks ? (int)ex->c.r : (int)ex->c.p;
    size_t *sc = ex->a2a, *sd = sc + n, *rc = sd + n, *rd = rc + n;
    int64_t Tme = blocks ? cpc_layout_block_tokens(L, me) : cpc_split_len(T, n, me);
    size_t so = 0, ro = 0;
    cpc_status *st;
    for (int j = 0; j < n; j++) {
        int64_t Tj = blocks ? cpc_layout_block_tokens(L, j) : cpc_split_len(T, n, j);
        int64_t oj = blocks ? cpc_layout_block_offset(L, j) : cpc_split_off(T, n, j);
        sc[j] = (size_t)(L->B * Tj * row) * 4;
        sd[j] = so;
        rc[j] = (size_t)(L->B * Tme * row) * 4;
        rd[j] = ro;
        if (Tj > 0 && (st = cpc_backend_copy_strided(be, (char *)ex->stage_send + so,
                                                     (const char *)in + oj * row * 4, 4, L->B, 1, 1, Tj * row,
                                                     Tj * row, 0, 0, T * row, 0, 0)))
            return st;
        so += sc[j];
        ro += rc[j];
    }
    if (so > ex->stage_send_cap || ro > ex->stage_recv_cap)
        return errf("staging space too small (%zu > %zu or %zu > %zu)", so, ex->stage_send_cap, ro,
                    ex->stage_recv_cap);
    if ((st = cpc_transport_all_to_all_v(ex->cfg.transport, group, ex->stage_send, sc, sd, ex->stage_recv, rc,
                                         rd)))
        return st;
    if ((st = cpc_backend_init_acc(be, dst, dst_elems, NULL, 0)))
        return st;
    for (int j = 0; j < n && Tme > 0; j++)
        if ((st = cpc_backend_add_strided(be, dst, (const float *)(const void *)((const char *)ex->stage_recv + rd[j]),
                                          1, 1, 1, L->B * Tme * row, 0, 0, 0, 0, 0, 0)))
            return st;
    for (int j = 0; j < n; j++)
        if (j != me)
            *sent += (int64_t)sc[j];
    return NULL;
}

/* reduce_scatter (ring): block j's slice of each ALL input to member j, the
 * R slices of block r summed (fp32) into the BLOCK output (tag r). */
static cpc_status *op_reduce_scatter(cpc_exec *ex, const cpc_op *op, int64_t *sent)
{
    cpc_status *st = coll_begin(ex, op, CPC_GROUP_RING);
    if (st)
        return st;
    const cpc_program *prog = ex->prog;
    const cpc_layout *L = ex->L;
    for (int k = 0; k < op->n_in && k < op->n_out; k++) {
        int in = op->in[k], out = op->out[k];
        const cpc_buffer *bi = &prog->buffers[in], *bo = &prog->buffers[out];
        bool grad = bi->role == CPC_ROLE_DK || bi->role == CPC_ROLE_DV || bi->role == CPC_ROLE_DQ;
        if (!grad || bo->role != bi->role || bi->tokens != CPC_TOK_ALL || bo->tokens != CPC_TOK_BLOCK)
            return errf("reduce_scatter: '%s' must be a gathered (ALL) gradient and '%s' a ring block of the "
                        "same role", bi->name, bo->name);
        geom gi = geom_of(prog, &ex->c, in, -1);
        geom go = cur_geom(ex, out);
        if (gi.hn != go.hn || gi.hoff != go.hoff || gi.es != 4 || go.es != 4)
            return errf("'%s' and '%s' differ in heads, or are not fp32", bi->name, bo->name);
        if ((st = check_fits(ex, out, go.bytes)) ||
            (st = sum_slices(ex, op->group, true, ex->bufs[in].ptr, gi.T, (int64_t)gi.hn * L->D, ex->bufs[out].ptr,
                             (size_t)go.elems, sent)))
            return st;
    }
    return NULL;
}

/* all_reduce (world; cross-attention dK/dV): chunk j of the KV tokens
 * (tensor_split over P) of every rank's part is summed on rank j (all_to_all_v
 * + fp32 sum), then the summed chunks are all-gathered into the output. */
static cpc_status *op_all_reduce(cpc_exec *ex, const cpc_op *op, int64_t *sent)
{
    cpc_status *st = coll_begin(ex, op, CPC_GROUP_WORLD);
    if (st)
        return st;
    const cpc_program *prog = ex->prog;
    const cpc_layout *L = ex->L;
    cpc_backend *be = ex->cfg.backend;
    int P = L->P, p = (int)ex->c.p;
    size_t *sc = ex->a2a, *sd = sc + P;
    for (int k = 0; k < op->n_in && k < op->n_out; k++) {
        int in = op->in[k], out = op->out[k];
        const cpc_buffer *bi = &prog->buffers[in], *bo = &prog->buffers[out];
        bool grad = bi->role == CPC_ROLE_DK || bi->role == CPC_ROLE_DV || bi->role == CPC_ROLE_DQ;
        if (!grad || bo->role != bi->role || bi->tokens != CPC_TOK_KV || bo->tokens != CPC_TOK_KV ||
            bi->heads != CPC_HEADS_ALL || bo->heads != CPC_HEADS_ALL)
            return errf("all_reduce: '%s' and '%s' must be cross-attention (KV) gradients of one role with "
                        "every head", bi->name, bo->name);
        geom g = geom_of(prog, &ex->c, in, -1);
        if ((st = check_fits(ex, out, g.bytes)))
            return st;
        if (g.bytes > ex->stage_recv_cap)
            return errf("staging space too small");
        int64_t row = (int64_t)g.hn * L->D; /* floats per token */
        /* the sum of chunk p, in the send staging (its packed parts are sent) */
        float *sum = ex->stage_send;
        size_t n = (size_t)(L->B * cpc_split_len(g.T, P, p) * row);
        if ((st = sum_slices(ex, op->group, false, ex->bufs[in].ptr, g.T, row, sum, n, sent)))
            return st;
        size_t off = 0;
        for (int j = 0; j < P; j++) {
            sc[j] = (size_t)(L->B * cpc_split_len(g.T, P, j) * row) * 4;
            sd[j] = off;
            off += sc[j];
        }
        if ((st = cpc_transport_all_gather_v(ex->cfg.transport, op->group, sum, n * 4, ex->stage_recv, sc, sd)))
            return st;
        for (int j = 0; j < P; j++) {
            int64_t Tj = cpc_split_len(g.T, P, j), oj = cpc_split_off(g.T, P, j);
            if (Tj > 0 && (st = cpc_backend_copy_strided(be, (char *)ex->bufs[out].ptr + oj * row * 4,
                                                         (const char *)ex->stage_recv + sd[j], 4, L->B, 1, 1,
                                                         Tj * row, g.T * row, 0, 0, Tj * row, 0, 0)))
                return st;
        }
        *sent += (int64_t)n * 4 * (P - 1); /* the gather; sum_slices counted the scatter */
    }
    return NULL;
}

static cpc_status *op_copy(cpc_exec *ex, const cpc_op *op)
{
    cpc_status *st = need(op, 1, 1);
    if (st)
        return st;
    const cpc_program *prog = ex->prog;
    const cpc_layout *L = ex->L;
    int in = op->in[0], out = op->out[0];
    const cpc_buffer *bi = &prog->buffers[in], *bo = &prog->buffers[out];
    geom gi = cur_geom(ex, in);
    geom go = cur_geom(ex, out);
    if (bo->tokens != bi->tokens && go.T != gi.T) {
        /* SHARD p == BLOCK r when U == 1: the tag must say so. */
        if (bo->tokens == CPC_TOK_BLOCK && bi->tokens == CPC_TOK_SHARD && L->U == 1) {
            ex->tags[out] = (int)ex->c.r;
            go = cur_geom(ex, out);
        }
    }
    if (go.T != gi.T)
        return errf("'%s' holds %lld tokens, '%s' would hold %lld", bi->name, (long long)gi.T,
                    bo->name, (long long)go.T);
    bool lse_in = bi->role == CPC_ROLE_LSE, lse_out = bo->role == CPC_ROLE_LSE;
    if (lse_in != lse_out)
        return errf("cannot copy between an LSE buffer and a %s buffer", lse_in ? bo->name : bi->name);
    bool grad = bi->role == CPC_ROLE_DQ || bi->role == CPC_ROLE_DK || bi->role == CPC_ROLE_DV;
    if (grad && bo->role == bi->role && gi.es == 4 && go.es == 4 && !lse_in && go.hoff <= gi.hoff &&
        gi.hoff + gi.hn <= go.hoff + go.hn && go.hn > gi.hn) {
        /* a gradient's head part into every head: zeros elsewhere (then summed
         * over the world by all_reduce) */
        if ((st = check_fits(ex, out, go.bytes)) ||
            (st = cpc_backend_init_acc(ex->cfg.backend, ex->bufs[out].ptr, (size_t)go.elems, NULL, 0)))
            return st;
        int64_t D = L->D;
        return cpc_backend_copy_strided(ex->cfg.backend, (float *)ex->bufs[out].ptr + (gi.hoff - go.hoff) * D,
                                        ex->bufs[in].ptr, 4, L->B, gi.T, 1, gi.hn * D, gi.T * go.hn * D, go.hn * D,
                                        0, gi.T * gi.hn * D, gi.hn * D, 0);
    }
    if (go.hoff < gi.hoff || go.hoff + go.hn > gi.hoff + gi.hn)
        return errf("'%s' heads [%d, %d) are not all in '%s' heads [%d, %d)", bo->name, go.hoff,
                    go.hoff + go.hn, bi->name, gi.hoff, gi.hoff + gi.hn);
    if ((st = check_fits(ex, out, go.bytes)))
        return st;
    cpc_dtype ti = gi.es == 4 ? CPC_DTYPE_FP32 : L->dtype;
    cpc_dtype to = go.es == 4 ? CPC_DTYPE_FP32 : L->dtype;
    if (bi->role == CPC_ROLE_ACC || bi->role == CPC_ROLE_LSE)
        ti = CPC_DTYPE_FP32;
    if (bo->role == CPC_ROLE_ACC || bo->role == CPC_ROLE_LSE)
        to = CPC_DTYPE_FP32;
    cpc_backend *be = ex->cfg.backend;
    const char *src = ex->bufs[in].ptr;
    char *dst = ex->bufs[out].ptr;
    int64_t hsel = go.hoff - gi.hoff;
    int64_t B = L->B, T = gi.T, D = lse_in ? 1 : L->D;
    if (go.hn == gi.hn) {
        if (ti == to)
            return cpc_backend_copy(be, dst, src, go.bytes);
        return cpc_backend_convert(be, dst, to, src, ti, (size_t)go.elems);
    }
    if (lse_in) {
        /* [B, h, T]: heads are contiguous ranges of T. */
        if (ti == to)
            return cpc_backend_copy_strided(be, dst, src + hsel * T * gi.es, (size_t)gi.es, B, 1, 1,
                                        go.hn * T, go.hn * T, 0, 0, gi.hn * T, 0, 0);
        for (int64_t b = 0; b < B; b++)
            if ((st = cpc_backend_convert(be, dst + b * go.hn * T * go.es, to,
                                      src + (b * gi.hn + hsel) * T * gi.es, ti,
                                      (size_t)(go.hn * T))))
                return st;
        return NULL;
    }
    if (ti == to)
        return cpc_backend_copy_strided(be, dst, src + hsel * D * gi.es, (size_t)gi.es, B, T, 1,
                                    go.hn * D, T * go.hn * D, go.hn * D, 0, T * gi.hn * D,
                                    gi.hn * D, 0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            if ((st = cpc_backend_convert(be, dst + ((b * T + t) * go.hn) * D * go.es, to,
                                      src + ((b * T + t) * gi.hn + hsel) * D * gi.es, ti,
                                      (size_t)(go.hn * D))))
                return st;
    return NULL;
}

static cpc_status *op_barrier(cpc_exec *ex, const cpc_op *op)
{
    cpc_status *st = need_transport(ex);
    if (st)
        return st;
    return cpc_transport_barrier(ex->cfg.transport, op->group);
}

static cpc_exec_event_cat op_cat(cpc_op_kind k)
{
    const cpc_op_info *i = cpc_op_info_of(k);
    return i && (i->flags & CPC_OPF_COMM_TIME) ? CPC_EV_COMM : CPC_EV_COMPUTE;
}

static void record(cpc_exec *ex, const cpc_op *op, int step, double t0, double t1, int64_t bytes)
{
    double dt = (t1 - t0) * 1e-3;
    if (op_cat(op->kind) == CPC_EV_COMM)
        ex->cur.comm_ms += dt;
    else
        ex->cur.compute_ms += dt;
    if (!ex->cfg.record_events)
        return;
    if (ex->n_ev == ex->cap_ev) {
        int nc = ex->cap_ev ? 2 * ex->cap_ev : 64;
        cpc_exec_event *p = realloc(ex->ev, (size_t)nc * sizeof *p);
        if (!p)
            return; /* the trace loses events, the run goes on */
        ex->ev = p;
        ex->cap_ev = nc;
    }
    cpc_exec_event *e = &ex->ev[ex->n_ev++];
    int k = snprintf(e->name, sizeof e->name, "%s", cpc_op_kind_name(op->kind));
    int nb = op->n_in > 0 ? op->n_in : op->n_out;
    const int *bl = op->n_in > 0 ? op->in : op->out;
    if (op->kind == CPC_OP_RECV || op->kind == CPC_OP_INIT_ACC) {
        nb = op->n_out > 0 ? op->n_out : op->n_in;
        bl = op->n_out > 0 ? op->out : op->in;
    }
    for (int i = 0; i < nb && k > 0 && k < (int)sizeof e->name; i++)
        k += snprintf(e->name + k, sizeof e->name - (size_t)k, "%s%s", i ? "," : " ",
                      bname(ex, bl[i]));
    e->cat = op_cat(op->kind);
    e->step = step;
    e->t0_us = t0;
    e->t1_us = t1;
    e->bytes = bytes;
}

static cpc_status *exec_ops(cpc_exec *ex, const cpc_op *ops, int n, cpc_coords c, int depth,
                            const char *path)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        char here[160];
        /* 1-based, as cpc's diagnostics and Lua scripts index ops */
        if (depth == 0)
            snprintf(here, sizeof here, "ops[%d]", i + 1);
        else
            snprintf(here, sizeof here, "%s.body[%d]", path, i + 1);
        cpc_status *st = NULL;
        if ((int)op->kind < 0 || op->kind >= CPC_OP__COUNT) {
            st = errf("unknown op kind %d", (int)op->kind);
            goto fail;
        }
        if (op->when) {
            int64_t w;
            if ((st = cpc_expr_eval(op->when, &c, &w)))
                goto fail;
            if (!w)
                continue;
        }
        for (int j = 0; j < op->n_in; j++)
            if (op->in[j] < 0 || op->in[j] >= ex->prog->n_buffers) {
                st = errf("input buffer index %d out of range", op->in[j]);
                goto fail;
            }
        for (int j = 0; j < op->n_out; j++)
            if (op->out[j] < 0 || op->out[j] >= ex->prog->n_buffers) {
                st = errf("output buffer index %d out of range", op->out[j]);
                goto fail;
            }
        if (op->kind == CPC_OP_LOOP) {
            int64_t cnt;
            if (!op->count) {
                st = errf("loop without a count");
                goto fail;
            }
            if ((st = cpc_expr_eval(op->count, &c, &cnt)))
                goto fail;
            if (cnt < 0 || cnt > CPC_LOOP_MAX || depth >= 8) {
                st = errf("loop count %lld (depth %d) out of range", (long long)cnt, depth);
                goto fail;
            }
            for (int64_t s = 0; s < cnt; s++) {
                cpc_coords cs = c;
                cs.s = s;
                char p2[200];
                snprintf(p2, sizeof p2, "%s", here);
                if ((st = exec_ops(ex, op->body, op->n_body, cs, depth + 1, p2)))
                    return st; /* already names the op */
            }
            continue;
        }
        /* Transports that batch point-to-point messages (NCCL: no tags, a
         * send and its recv must be in flight together) start the posted
         * ones at flush: before the first op that is not a send/recv, so a
         * ring step's transfer overlaps the attention that follows. */
        if (ex->unflushed && op->kind != CPC_OP_SEND && op->kind != CPC_OP_RECV) {
            ex->unflushed = false;
            cpc_transport *t = ex->cfg.transport;
            if (t && (st = cpc_transport_flush(t)))
                goto fail;
        }
        double t0 = cpc_exec_now_us();
        int64_t sent = 0;
        if (op->kind == CPC_OP_SEND || op->kind == CPC_OP_RECV)
            ex->unflushed = true;
        if ((st = guard_pending(ex, op)) || (st = guard_layouts(ex, op)))
            goto fail;
        if ((st = apply_tags(ex, op, &c)))
            goto fail;
        switch (op->kind) {
        case CPC_OP_INIT_ACC: st = op_init_acc(ex, op, &c); break;
        case CPC_OP_ADD: st = op_add(ex, op); break;
        case CPC_OP_ATTN: st = op_attn(ex, op, &c); break;
        case CPC_OP_MERGE: st = op_merge(ex, op); break;
        case CPC_OP_SEND: st = op_send(ex, op, &c, &sent); break;
        case CPC_OP_RECV: st = op_recv(ex, op, &c); break;
        case CPC_OP_WAIT: st = op_wait(ex, op); break;
        case CPC_OP_SWAP: st = op_swap(ex, op); break;
        case CPC_OP_ALL_TO_ALL:
        case CPC_OP_ALL_GATHER:
        case CPC_OP_COPY:
            /* paired ops (the table's same_in_out): pair by pair, in order on
             * every rank (the collectives' calls match up) */
            for (int k = 0; k < op->n_in && k < op->n_out && !st; k++) {
                cpc_op one = *op;
                one.n_in = one.n_out = 1;
                one.in[0] = op->in[k];
                one.out[0] = op->out[k];
                st = op->kind == CPC_OP_COPY         ? op_copy(ex, &one)
                     : op->kind == CPC_OP_ALL_GATHER ? op_all_gather(ex, &one, &sent)
                                                     : op_all_to_all(ex, &one, &sent);
            }
            if (!st && (op->n_in < 1 || op->n_in != op->n_out))
                st = errf("needs as many outputs as inputs (1..%d), has %d and %d", CPC_OP_MAX_BUFS, op->n_in,
                          op->n_out);
            break;
        case CPC_OP_BARRIER: st = op_barrier(ex, op); break;
        case CPC_OP_DELTA: st = op_delta(ex, op, &c); break;
        case CPC_OP_ATTN_BWD: st = op_attn_bwd(ex, op, &c); break;
        case CPC_OP_REDUCE_SCATTER: st = op_reduce_scatter(ex, op, &sent); break;
        case CPC_OP_ALL_REDUCE: st = op_all_reduce(ex, op, &sent); break;
        default: st = errf("op kind not executable"); break;
        }
        double t1 = cpc_exec_now_us();
        ex->cur.bytes_sent += sent;
        record(ex, op, depth > 0 ? (int)c.s : -1, t0, t1, sent);
        if (st)
            goto fail;
        continue;
    fail:
        /* An expression that cannot be evaluated at run time is a runtime
         * failure of this rank (exit 3), not bad user input. */
        if (st != &cpc_status_oom && st->code == CPC_E_INPUT)
            st->code = CPC_E_RUNTIME;
        if (depth > 0)
            cpc_status_prefix(st, "rank %lld: %s (s=%lld) %s", (long long)c.p, here,
                              (long long)c.s, cpc_op_kind_name(op->kind));
        else
            cpc_status_prefix(st, "rank %lld: %s %s", (long long)c.p, here,
                              cpc_op_kind_name(op->kind));
        if (op->span.file && !st->span.file && st != &cpc_status_oom) {
            st->span.file = strdup(op->span.file);
            st->span.line = st->span.file ? op->span.line : 0;
            st->span.col = st->span.file ? op->span.col : 0;
        }
        return st;
    }
    return NULL;
}

cpc_status *cpc_exec_run(cpc_exec *ex, cpc_exec_stats *stats)
{
    memset(&ex->cur, 0, sizeof ex->cur);
    ex->n_ev = 0;
    ex->cur.t0_us = cpc_exec_now_us();
    cpc_status *st = exec_ops(ex, ex->prog->ops, ex->prog->n_ops, ex->c, 0, "");
    if (!st && ex->n_pend > 0)
        st = cpc_error(CPC_E_INTERNAL, "rank %d: %d send/recv requests (first tag %d) never waited for",
                       ex->cfg.rank, ex->n_pend, ex->pend[0].tag);
    ex->cur.t1_us = cpc_exec_now_us();
    ex->cur.ms = (ex->cur.t1_us - ex->cur.t0_us) * 1e-3;
    ex->cur.n_events = ex->n_ev;
    ex->cur.events = ex->cfg.record_events ? ex->ev : NULL;
    if (st) {
        if (ex->cfg.transport) {
            char *msg = cpc_status_format(st, "cprun");
            cpc_transport_abort(ex->cfg.transport, msg ? msg : st->message);
            free(msg);
        }
        /* Requests still pending complete (with errors) after the abort. */
        for (int i = 0; i < ex->n_pend; i++)
            cpc_status_free(cpc_transport_wait(ex->cfg.transport, ex->pend[i].req));
        ex->n_pend = 0;
    }
    if (stats)
        *stats = ex->cur;
    return st;
}

size_t cpc_exec_output_bytes(const cpc_exec *ex)
{
    if (ex->out_buf < 0)
        return 0;
    if (rank_io(ex, CPC_ROLE_O))
        return rank_bytes(ex, ex->out_buf);
    return geom_of(ex->prog, &ex->c, ex->out_buf, (int)ex->c.r).bytes;
}

/* Downloads OUTPUT buffer b (the output, or a gradient) into the caller's
 * memory: this rank's own rows with every head.  With replicated segments
 * (rank_io) the shard's rows (b) and those of rb, the replicated rows'
 * OUTPUT (KV, every head; -1: none), each at its place; else b as it is. */
static cpc_status *read_own(cpc_exec *ex, int b, int rb, void *host, size_t bytes)
{
    const cpc_buffer *bf = &ex->prog->buffers[b];
    bool own = bf->heads == CPC_HEADS_ALL &&
               (bf->tokens == CPC_TOK_SHARD || (bf->tokens == CPC_TOK_KV && bf->role != CPC_ROLE_O) ||
                (bf->tokens == CPC_TOK_BLOCK && ex->L->U == 1 && ex->tags[b] == (int)ex->c.r));
    if (!own)
        return cpc_error(CPC_E_INTERNAL, "rank %d: output buffer '%s' (%s/%s, role %s, tag %d) does not hold "
                         "this rank's shard with every head", ex->cfg.rank, bf->name,
                         cpc_buf_tokens_name(bf->tokens), cpc_buf_heads_name(bf->heads),
                         cpc_buf_role_name(bf->role), ex->tags[b]);
    bool rio = rank_io(ex, bf->role);
    size_t n = rio ? rank_bytes(ex, b) : cur_geom(ex, b).bytes;
    if (rio && (rb < 0 || ex->prog->buffers[rb].heads != CPC_HEADS_ALL))
        return cpc_error(CPC_E_INTERNAL, "rank %d: the program has no OUTPUT %s of the replicated segments' "
                         "rows (kv layout, every head)", ex->cfg.rank, cpc_buf_role_name(bf->role));
    if (bytes != n)
        return cpc_error(CPC_E_INTERNAL, "rank %d: '%s' needs %zu bytes, %zu given", ex->cfg.rank, bf->name, n,
                         bytes);
    if (rio) {
        cpc_status *st = xfer_rank_rows(ex, b, host, NULL, false);
        return st ? st : xfer_rank_rows(ex, rb, host, NULL, false);
    }
    return xfer_out(ex, host, ex->bufs[b].ptr, n);
}

cpc_status *cpc_exec_read_output(cpc_exec *ex, void *host, size_t bytes)
{
    if (ex->out_buf < 0)
        return cpc_error(CPC_E_INTERNAL, "rank %d: the program has no OUTPUT buffer", ex->cfg.rank);
    return read_own(ex, ex->out_buf, ex->out_rep_buf, host, bytes);
}

cpc_status *cpc_exec_read_lse(cpc_exec *ex, float **lse, int *h_off, int *h_n, cpc_run **runs,
                              int *n_runs)
{
    *lse = NULL;
    *runs = NULL;
    *n_runs = 0;
    if (ex->lse_buf < 0)
        return cpc_error(CPC_E_INTERNAL, "rank %d: the program computes no LSE", ex->cfg.rank);
    int b = ex->lse_buf, b2 = ex->lse_rep_buf;
    geom g = cur_geom(ex, b);
    geom g2 = b2 >= 0 ? cur_geom(ex, b2) : (geom){0};
    if (b2 >= 0 && (g2.hoff != g.hoff || g2.hn != g.hn))
        b2 = -1; /* not the same heads: the sharded rows' LSE only */
    cpc_run *rr = malloc((size_t)ex->max_runs * sizeof *rr);
    float *h = malloc(g.bytes + (b2 >= 0 ? g2.bytes : 0) + 1);
    float *h2 = b2 >= 0 ? malloc(g2.bytes + 1) : NULL;
    if (!rr || !h || (b2 >= 0 && !h2)) {
        free(rr);
        free(h);
        free(h2);
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    int n = runs_of(ex->prog, &ex->c, b, ex->tags[b], rr, ex->max_runs);
    cpc_status *st = cpc_backend_download(ex->cfg.backend, h, ex->bufs[b].ptr, g.bytes);
    if (!st && b2 >= 0)
        st = cpc_backend_download(ex->cfg.backend, h2, ex->bufs[b2].ptr, g2.bytes);
    if (st) {
        free(rr);
        free(h);
        free(h2);
        return st;
    }
    if (b2 >= 0) {
        /* replicated segments: their rows follow the sharded rows in every
         * [batch, head] row of the LSE, and their runs follow in the run list */
        int64_t T1 = g.T, T2 = g2.T, rows = (int64_t)ex->L->B * g.hn;
        for (int64_t i = rows - 1; i >= 0; i--) {
            memmove(h + i * (T1 + T2), h + i * T1, (size_t)T1 * sizeof *h);
            memcpy(h + i * (T1 + T2) + T1, h2 + i * T2, (size_t)T2 * sizeof *h);
        }
        n += runs_of(ex->prog, &ex->c, b2, ex->tags[b2], rr + n, ex->max_runs - n);
        free(h2);
    }
    *lse = h;
    *runs = rr;
    *n_runs = n;
    *h_off = g.hoff;
    *h_n = g.hn;
    return NULL;
}

/* Replicated segments: the LSE in the rank's own token order, [B, h, T]
 * with T the rank's tokens (its shard's rows and the replicated rows, each
 * at its place: layout.h rank runs), when both final LSEs hold every head
 * (ulysses_degree 1).  Row by row, so that nothing is allocated. */
static cpc_status *lse_rank_into(cpc_exec *ex, float *dst, size_t bytes, int *h_off, int *h_n, cpc_run *runs,
                                 int max_runs, int *n_runs)
{
    const cpc_layout *L = ex->L;
    int bs[2] = {ex->lse_buf, ex->lse_rep_buf};
    geom g = cur_geom(ex, bs[0]), g2 = cur_geom(ex, bs[1]);
    if (g.hoff != 0 || g.hn != L->H || g2.hoff != 0 || g2.hn != L->H)
        return cpc_error(CPC_E_UNSUPPORTED, "rank %d: the LSE is in the Ulysses head layout", ex->cfg.rank);
    int64_t T = cpc_layout_rank_tokens(L, (int)ex->c.p), rows = (int64_t)L->B * g.hn;
    if (bytes != (size_t)(rows * T) * sizeof(float))
        return cpc_error(CPC_E_INTERNAL, "rank %d: LSE is %zu bytes, %zu given", ex->cfg.rank,
                         (size_t)(rows * T) * sizeof(float), bytes);
    if (max_runs < cpc_layout_max_rank_runs(L))
        return cpc_error(CPC_E_INTERNAL, "rank %d: LSE runs need %d entries, %d given", ex->cfg.rank,
                         cpc_layout_max_rank_runs(L), max_runs);
    for (int k = 0; k < 2; k++) {
        int b = bs[k];
        geom gb = k ? g2 : g;
        int n = runs_of(ex->prog, &ex->c, b, ex->tags[b], ex->qruns, ex->max_runs);
        int64_t t = 0;
        for (int i = 0; i < n; i++) {
            int64_t ro = cpc_layout_rank_offset(L, (int)ex->c.p, ex->qruns[i].start);
            if (ro < 0)
                return cpc_error(CPC_E_INTERNAL, "rank %d: LSE rows not this rank's", ex->cfg.rank);
            const float *src = (const float *)ex->bufs[b].ptr + t;
            size_t nb = (size_t)ex->qruns[i].len * sizeof(float);
            cpc_status *st = NULL;
            if (ex->device_io)
                st = cpc_backend_copy_strided(ex->cfg.backend, dst + ro, src, sizeof(float), rows, 1, 1,
                                              ex->qruns[i].len, T, 0, 0, gb.T, 0, 0);
            else
                for (int64_t r = 0; r < rows && !st; r++)
                    st = cpc_backend_download(ex->cfg.backend, dst + r * T + ro, src + r * gb.T, nb);
            if (st)
                return st;
            t += ex->qruns[i].len;
        }
    }
    *n_runs = cpc_layout_rank_runs(L, (int)ex->c.p, runs, max_runs);
    *h_off = 0;
    *h_n = g.hn;
    return NULL;
}

cpc_status *cpc_exec_lse_into(cpc_exec *ex, float *dst, size_t bytes, int *h_off, int *h_n,
                              cpc_run *runs, int max_runs, int *n_runs)
{
    if (ex->lse_buf < 0)
        return cpc_error(CPC_E_INTERNAL, "rank %d: the program computes no LSE", ex->cfg.rank);
    int b = ex->lse_buf;
    geom g = cur_geom(ex, b);
    if (max_runs < ex->max_runs)
        return cpc_error(CPC_E_INTERNAL, "rank %d: LSE runs need %d entries, %d given",
                         ex->cfg.rank, ex->max_runs, max_runs);
    if (ex->L->rep && ex->lse_rep_buf >= 0 && ex->L->U > 1) {
        /* the saved LSE a backward program takes (rep_lse): both final
         * LSEs back to back, in the head layout */
        geom g2 = cur_geom(ex, ex->lse_rep_buf);
        if (bytes != g.bytes + g2.bytes)
            return cpc_error(CPC_E_INTERNAL, "rank %d: LSE is %zu bytes, %zu given", ex->cfg.rank,
                             (size_t)(g.bytes + g2.bytes), bytes);
        *n_runs = runs_of(ex->prog, &ex->c, b, ex->tags[b], runs, ex->max_runs);
        *h_off = g.hoff;
        *h_n = g.hn;
        cpc_status *st = xfer_out(ex, dst, ex->bufs[b].ptr, g.bytes);
        return st ? st : xfer_out(ex, (char *)dst + g.bytes, ex->bufs[ex->lse_rep_buf].ptr, g2.bytes);
    }
    if (ex->L->rep && ex->lse_rep_buf >= 0)
        return lse_rank_into(ex, dst, bytes, h_off, h_n, runs, max_runs, n_runs);
    if (bytes != g.bytes)
        return cpc_error(CPC_E_INTERNAL, "rank %d: LSE is %zu bytes, %zu given", ex->cfg.rank,
                         (size_t)g.bytes, bytes);
    *n_runs = runs_of(ex->prog, &ex->c, b, ex->tags[b], runs, ex->max_runs);
    *h_off = g.hoff;
    *h_n = g.hn;
    return xfer_out(ex, dst, ex->bufs[b].ptr, g.bytes);
}

int cpc_exec_max_runs(const cpc_exec *ex)
{
    return ex->max_runs;
}

cpc_status *cpc_exec_read_grad(cpc_exec *ex, cpc_buf_role role, float *host, size_t bytes)
{
    /* the OUTPUT of `role` (with replicated segments: the shard's, not the
     * replicated rows' KV one, which read_own adds) */
    const cpc_program *prog = ex->prog;
    int b = -1, rb = -1;
    for (int i = 0; i < prog->n_buffers; i++) {
        const cpc_buffer *bf = &prog->buffers[i];
        if (bf->io != CPC_IO_OUTPUT || bf->role != role)
            continue;
        if (rank_io(ex, role) && bf->tokens == CPC_TOK_KV) {
            if (rb < 0 && bf->heads == CPC_HEADS_ALL)
                rb = i;
        } else if (b < 0) {
            b = i;
        }
    }
    if (b < 0)
        return cpc_error(CPC_E_INTERNAL, "rank %d: the program has no OUTPUT buffer of role %s", ex->cfg.rank,
                         cpc_buf_role_name(role));
    return read_own(ex, b, rb, host, bytes);
}
