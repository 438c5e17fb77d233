/* verify_bwd.c - enumeration prover of backward programs; see verify_bwd.h. */
#include "verify_bwd.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "verify.h"

#define VB_MAX_P 256

typedef struct xop {
    const cpc_op *op;
    int64_t peer, block, s;
} xop;

typedef struct rank_ops {
    xop *v;
    int n, cap;
} rank_ops;

/* Pair counts saturate here (any count above 1 is already an error). */
#define VB_CNT_MAX 255
/* Largest abstract state (count cells over all ranks and gradient buffers). */
#define VB_MAX_CELLS ((int64_t)1 << 28)

typedef struct slot {
    int tag;
    bool written;   /* init_acc'd / delta written / received / input */
    cpc_content src; /* provenance: what it holds (program.h cpc_content) */
    uint8_t *cnt;   /* [R * NK * nh] (query block, key unit, query head), D* roles only */
} slot;

/* One posted point-to-point request (one buffer of a send or recv op, as the
 * executor posts them), from its post to the wait that completes it.  Sends
 * and recvs match buffer by buffer in FIFO order per (sender, receiver,
 * group, tag), as MPI and the local transport do. */
typedef struct req {
    struct req *qnext;     /* next in its unmatched queue */
    const xop *x;          /* the op that posted it */
    int p, peer;           /* poster and its partner (flat ranks) */
    cpc_group group;
    int tag, buf, slot;    /* program buffer; memory slot (swaps move names, not slots) */
    cpc_buf_role role;
    bool send, matched;
    slot snap;             /* send: its content at the post; recv: what arrives once matched */
} req;

typedef struct rank_reqs {
    req **v;               /* posted, not yet completed by a wait */
    int n, cap;
    req *sq, *sq_tail;     /* sends to this rank no recv matched yet */
    req *rq, *rq_tail;     /* recvs posted by this rank no send matched yet */
} rank_reqs;

typedef struct vb {
    const cpc_program *prog;
    int P, R, U, nb, nh, npairs;   /* nh: query-head units (H with U > 1, else 1) */
    int NK;                        /* key units: ring blocks, or 1 (cross-attention: all of K/V) */
    rank_ops *ro;
    slot *slots;    /* [P * nb] slot storage */
    int *map;       /* [P * nb]: buffer -> slot index (swap permutes) */
    int *pc;
    rank_reqs *rr; /* [P] */
    cpc_status *err;
} vb;

static cpc_status *collect(void *ctx, const cpc_exec_op *x)
{
    rank_ops *r = ctx;
    if (r->n == r->cap) {
        int nc = r->cap ? 2 * r->cap : 64;
        xop *v = realloc(r->v, (size_t)nc * sizeof *v);
        if (!v)
            return &cpc_status_oom;
        r->v = v;
        r->cap = nc;
    }
    r->v[r->n++] = (xop){x->op, x->peer, x->block, x->depth ? x->c.s : -1};
    return NULL;
}

static cpc_status *vfail(int p, const xop *x, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cpc_status *vfail(int p, const xop *x, const char *fmt, ...)
{
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (x && x->s >= 0)
        return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, x->op->span,
                        "backward program: rank %d, %s (step %lld): %s", p, cpc_op_kind_name(x->op->kind),
                        (long long)x->s, m);
    return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, x ? x->op->span : CPC_NO_SPAN,
                    "backward program: rank %d%s%s: %s", p, x ? ", " : "", x ? cpc_op_kind_name(x->op->kind) : "", m);
}

static bool is_grad(cpc_buf_role r)
{
    return r == CPC_ROLE_DQ || r == CPC_ROLE_DK || r == CPC_ROLE_DV;
}

static bool is_kvr(cpc_buf_role r)
{
    return r == CPC_ROLE_K || r == CPC_ROLE_V || r == CPC_ROLE_DK || r == CPC_ROLE_DV;
}

static slot *S(vb *V, int p, int b)
{
    return &V->slots[V->map[p * V->nb + b]];
}

static cpc_buf_role role(const vb *V, int b)
{
    return V->prog->buffers[b].role;
}

static const char *bn(const vb *V, int b)
{
    return V->prog->buffers[b].name;
}

static const cpc_buffer *BF(const vb *V, int b)
{
    return &V->prog->buffers[b];
}

static size_t cnt_bytes(const vb *V)
{
    return (size_t)V->npairs;
}

/* Flat rank of member `peer` of rank p's group g. */
static int flat_of(const vb *V, int p, cpc_group g, int64_t peer)
{
    int r = p / V->U, u = p % V->U;
    if (g == CPC_GROUP_RING)
        return (int)peer * V->U + u;
    if (g == CPC_GROUP_ULYSSES)
        return r * V->U + (int)peer;
    return (int)peer;
}

/* Does buffer b (on ulysses member u) hold query-head unit h?  DQ: its query
 * heads; DK/DV: the query heads whose K/V head it holds. */
static bool holds_unit(const vb *V, int b, int u, int h)
{
    if (V->nh == 1)
        return true;
    int off, n;
    cpc_buffer_heads(V->prog, b, u, &off, &n);
    int kh = is_kvr(role(V, b)) ? h / V->prog->layout.group : h;
    return kh >= off && kh < off + n;
}

static void sat_add(uint8_t *c, int v)
{
    int x = *c + v;
    *c = (uint8_t)(x > VB_CNT_MAX ? VB_CNT_MAX : x);
}

/* Executes the all_to_all every member of ulysses group r has reached
 * (SPMD: the same op on every member).  Returns NULL or the failure. */
static cpc_status *run_a2a(vb *V, int r)
{
    const int U = V->U;
    const xop *x0 = &V->ro[r * U].v[V->pc[r * U]];
    const cpc_op *op = x0->op;
    int in = op->in[0], out = op->out[0];
    const cpc_buffer *bi = BF(V, in), *bo = BF(V, out);
    int p0 = r * U;
    if (op->n_in != 1 || op->n_out != 1)
        return vfail(p0, x0, "the backward prover takes all_to_all with one input and one output");
    if (bi->role != bo->role)
        return vfail(p0, x0, "'%s' (role %s) and '%s' (role %s) differ in role", bi->name,
                     cpc_buf_role_name(bi->role), bo->name, cpc_buf_role_name(bo->role));
    bool s2h = op->dir == CPC_A2A_SEQ_TO_HEADS;
    const cpc_buffer *full = s2h ? bi : bo, *part = s2h ? bo : bi;
    if (full->tokens != CPC_TOK_SHARD || full->heads != CPC_HEADS_ALL || part->tokens != CPC_TOK_BLOCK ||
        part->heads != CPC_HEADS_PART)
        return vfail(p0, x0, "%s: '%s' must be SHARD with all heads and '%s' BLOCK with a head part",
                     cpc_a2a_dir_name(op->dir), full->name, part->name);
    if (op->reduce && (s2h || !is_grad(bi->role)))
        return vfail(p0, x0, "reduce=sum applies to heads_to_seq of dq/dk/dv only");
    if (bi->role == CPC_ROLE_LSE && !s2h)
        return vfail(p0, x0, "heads_to_seq of an LSE-role buffer is not executable");
    for (int j = 0; j < U; j++) {
        int p = r * U + j;
        slot *si = S(V, p, in);
        int want = s2h ? p : r;
        if (!si->written || si->tag != want)
            return vfail(p, &V->ro[p].v[V->pc[p]], "'%s' must hold %s %d (holds %d%s)", bi->name,
                         s2h ? "this rank's shard" : "this rank's ring block", want, si->tag,
                         si->written ? "" : ", never written");
    }
    if (s2h && is_grad(bi->role))
        return vfail(p0, x0, "seq_to_heads of a gradient is outside the backward prover's class");
    if (!s2h && is_grad(bi->role) && !op->reduce) {
        /* A head held by two members keeps one part: refused here. */
        for (int h = 0; h < V->nh; h++) {
            int first = -1;
            for (int j = 0; j < U; j++)
                if (holds_unit(V, in, j, h)) {
                    if (first >= 0)
                        return vfail(p0, x0,
                                     "'%s': query head %d's gradient is held by members %d and %d: their parts "
                                     "must be summed (all_to_all reduce=sum), not placed",
                                     bi->name, h, first, j);
                    first = j;
                }
        }
    }
    /* Outputs, computed from the inputs before any is written (in may alias
     * nothing: different buffers). */
    uint8_t *tmp = NULL;
    if (is_grad(bi->role) && !(tmp = calloc((size_t)U * cnt_bytes(V), 1)))
        return &cpc_status_oom;
    for (int j = 0; tmp && j < U; j++) {
        uint8_t *o = tmp + (size_t)j * cnt_bytes(V);
        for (int u = 0; u < U; u++) {
            const uint8_t *c = S(V, r * U + u, in)->cnt;
            for (int h = 0; h < V->nh; h++) {
                if (!holds_unit(V, in, u, h))
                    continue;
                for (int qk = 0; qk < V->R * V->NK; qk++) {
                    size_t i = (size_t)qk * (size_t)V->nh + (size_t)h;
                    if (op->reduce)
                        sat_add(&o[i], c[i]);
                    else
                        o[i] = c[i];
                }
            }
        }
    }
    for (int j = 0; j < U; j++) {
        int p = r * U + j;
        slot *so = S(V, p, out);
        so->written = true;
        so->tag = s2h ? r : p;
        so->src = S(V, p, in)->src;
        if (tmp && so->cnt)
            memcpy(so->cnt, tmp + (size_t)j * cnt_bytes(V), cnt_bytes(V));
        V->pc[p]++;
    }
    free(tmp);
    return NULL;
}

/* Executes the all_gather or reduce_scatter every member of ring group u
 * has reached. */
static cpc_status *run_ring_coll(vb *V, int u)
{
    const int U = V->U, R = V->R;
    const xop *x0 = &V->ro[u].v[V->pc[u]];
    const cpc_op *op = x0->op;
    if (op->n_in != op->n_out || op->n_in < 1)
        return vfail(u, x0, "needs as many outputs as inputs");
    for (int k = 0; k < op->n_in; k++) {
        int in = op->in[k], out = op->out[k];
        const cpc_buffer *bi = BF(V, in), *bo = BF(V, out);
        if (bi->role != bo->role || bi->heads != bo->heads)
            return vfail(u, x0, "'%s' and '%s' differ in role or heads", bi->name, bo->name);
        bool ag = op->kind == CPC_OP_ALL_GATHER;
        bool ok = ag ? !is_grad(bi->role) && bi->tokens == CPC_TOK_BLOCK && bo->tokens == CPC_TOK_ALL
                     : is_grad(bi->role) && bi->tokens == CPC_TOK_ALL && bo->tokens == CPC_TOK_BLOCK;
        if (!ok)
            return vfail(u, x0, ag ? "all_gather takes a K/V ring block to a gathered (ALL) buffer"
                                   : "reduce_scatter takes a gathered (ALL) dq/dk/dv to a ring block");
        for (int r = 0; r < R; r++) {
            int p = r * U + u;
            slot *si = S(V, p, in);
            if (!si->written || (ag && si->tag != r))
                return vfail(p, &V->ro[p].v[V->pc[p]], "'%s' must hold %s (holds %d%s)", bi->name,
                             ag ? "this rank's ring block" : "a value", si->tag, si->written ? "" : ", never written");
        }
        uint8_t *tmp = NULL;
        if (!ag && (R < 1 || !(tmp = calloc((size_t)(unsigned)R, cnt_bytes(V)))))
            return &cpc_status_oom;
        for (int r = 0; !ag && r < R; r++) {
            uint8_t *o = tmp + (size_t)r * cnt_bytes(V);
            for (int m = 0; m < R; m++) {
                const uint8_t *c = S(V, m * U + u, in)->cnt;
                for (int qb = 0; qb < R; qb++)
                    for (int h = 0; h < V->nh; h++) {
                        size_t i = ((size_t)qb * (size_t)V->NK + (size_t)r) * (size_t)V->nh + (size_t)h;
                        sat_add(&o[i], c[i]);
                    }
            }
        }
        for (int r = 0; r < R; r++) {
            slot *so = S(V, r * U + u, out);
            so->written = true;
            so->tag = ag ? CPC_TAG_NONE : r;
            so->src = S(V, r * U + u, in)->src;
            if (tmp && so->cnt)
                memcpy(so->cnt, tmp + (size_t)r * cnt_bytes(V), cnt_bytes(V));
        }
        free(tmp);
    }
    for (int r = 0; r < R; r++)
        V->pc[r * U + u]++;
    return NULL;
}

/* Executes the all_reduce every rank has reached: the sum of every rank's
 * pairs, on every rank. */
static cpc_status *run_all_reduce(vb *V)
{
    const xop *x0 = &V->ro[0].v[V->pc[0]];
    const cpc_op *op = x0->op;
    if (op->n_in != op->n_out || op->n_in < 1)
        return vfail(0, x0, "needs as many outputs as inputs");
    for (int k = 0; k < op->n_in; k++) {
        int in = op->in[k], out = op->out[k];
        const cpc_buffer *bi = BF(V, in), *bo = BF(V, out);
        if (!is_grad(bi->role) || bi->role != bo->role || bi->tokens != CPC_TOK_KV || bo->tokens != CPC_TOK_KV ||
            bi->heads != CPC_HEADS_ALL || bo->heads != CPC_HEADS_ALL)
            return vfail(0, x0, "all_reduce takes cross-attention dk/dv with every head ('%s' -> '%s')", bi->name,
                         bo->name);
        uint8_t *sum = calloc(1, cnt_bytes(V));
        if (!sum)
            return &cpc_status_oom;
        for (int p = 0; p < V->P; p++) {
            slot *si = S(V, p, in);
            if (!si->written) {
                free(sum);
                return vfail(p, &V->ro[p].v[V->pc[p]], "'%s' is never written", bi->name);
            }
            for (size_t i = 0; i < cnt_bytes(V); i++)
                sat_add(&sum[i], si->cnt[i]);
        }
        for (int p = 0; p < V->P; p++) {
            slot *so = S(V, p, out);
            so->written = true;
            so->tag = CPC_TAG_NONE;
            so->src = CPC_CONTENT_GRAD;
            memcpy(so->cnt, sum, cnt_bytes(V));
        }
        free(sum);
    }
    for (int p = 0; p < V->P; p++)
        V->pc[p]++;
    return NULL;
}

static bool same_layout(const vb *V, int a, int b)
{
    return BF(V, a)->tokens == BF(V, b)->tokens && BF(V, a)->heads == BF(V, b)->heads;
}

static const char *access_word(cpc_access a)
{
    return a == CPC_ACCESS_READ ? "reads" : a == CPC_ACCESS_WRITE ? "writes" : a == CPC_ACCESS_REBIND ? "swaps"
                                                                                                   : "accumulates into";
}

/* The op table's lifetime rule (program.h CPC_LIFE_UNTIL_WAIT): an op may
 * read a buffer whose send is in flight, nothing else; it may not touch a
 * buffer whose recv is in flight.  Returns the failure or NULL. */
static cpc_status *check_in_flight(vb *V, int p, const xop *x)
{
    const cpc_op *op = x->op;
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    rank_reqs *rq = &V->rr[p];
    if (!info || rq->n == 0)
        return NULL;
    for (int side = 0; side < 2; side++) {
        cpc_access acc = side ? info->out_access : info->in_access;
        int n = side ? op->n_out : op->n_in;
        const int *bufs = side ? op->out : op->in;
        for (int i = 0; acc != CPC_ACCESS_NONE && i < n; i++) {
            int sl = V->map[p * V->nb + bufs[i]];
            for (int j = 0; j < rq->n; j++) {
                const req *q = rq->v[j];
                if (q->slot != sl || (q->send && acc == CPC_ACCESS_READ))
                    continue;
                return vfail(p, x,
                             "%s '%s' while its %s (tag %d, posted by %s) is in flight: a non-blocking %s's "
                             "buffer may not be %s before the wait that completes it",
                             access_word(acc), bn(V, bufs[i]), q->send ? "send" : "recv", q->tag,
                             cpc_op_kind_name(q->x->op->kind), q->send ? "send" : "recv",
                             q->send ? "written" : "read or written");
            }
        }
    }
    return NULL;
}

/* The op table's content rule: in[i] must hold in_content[i] (by
 * provenance: the delta op's output is not the saved LSE). */
static cpc_status *check_content(vb *V, int p, const xop *x)
{
    const cpc_op *op = x->op;
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    for (int i = 0; info && i < op->n_in && i < CPC_OP_MAX_BUFS; i++) {
        cpc_content want = (cpc_content)info->in_content[i];
        if (want == CPC_CONTENT_NONE)
            continue;
        const slot *sl = S(V, p, op->in[i]);
        if (!sl->written)
            return vfail(p, x, "reads '%s' (input %d) before it is written%s", bn(V, op->in[i]), i + 1,
                         want == CPC_CONTENT_DELTA ? " (no delta op computed it)" : "");
        if (sl->src != want)
            return vfail(p, x, "input %d '%s' holds %s, %s expected (operands are identified by what made "
                               "them, not by role)",
                         i + 1, bn(V, op->in[i]), cpc_content_name(sl->src), cpc_content_name(want));
    }
    return NULL;
}

static cpc_status *push_req(vb *V, int p, req *q)
{
    rank_reqs *rq = &V->rr[p];
    if (rq->n == rq->cap) {
        int nc = rq->cap ? 2 * rq->cap : 8;
        req **v = realloc(rq->v, (size_t)nc * sizeof *v);
        if (!v)
            return &cpc_status_oom;
        rq->v = v;
        rq->cap = nc;
    }
    rq->v[rq->n++] = q;
    return NULL;
}

/* Takes from queue (*head, *tail) the first request whose sender is `from`
 * on (group, tag) (a send queue holds sends, whose poster is the sender; a
 * recv queue recvs, whose peer is); NULL when none. */
static req *take(req **head, req **tail, int from, cpc_group g, int tag)
{
    req *prev = NULL;
    for (req *q = *head; q; prev = q, q = q->qnext)
        if ((q->send ? q->p : q->peer) == from && q->group == g && q->tag == tag) {
            if (prev)
                prev->qnext = q->qnext;
            else
                *head = q->qnext;
            if (*tail == q)
                *tail = prev;
            q->qnext = NULL;
            return q;
        }
    return NULL;
}

static void enqueue(req **head, req **tail, req *q)
{
    if (*tail)
        (*tail)->qnext = q;
    else
        *head = q;
    *tail = q;
}

/* Send s meets recv r: what arrives is s's snapshot; its role and block must
 * be what r declares. */
static cpc_status *match(vb *V, req *s, req *r)
{
    s->matched = r->matched = true;
    r->snap = s->snap;
    s->snap.cnt = NULL;
    if (s->role != r->role)
        return vfail(r->p, r->x,
                     "'%s' (role %s) is matched on (%s group, tag %d) with rank %d's send of '%s' (role %s): "
                     "messages match by (group, peer, tag) in posting order",
                     bn(V, r->buf), cpc_buf_role_name(r->role), cpc_group_name(r->group), r->tag, s->p,
                     bn(V, s->buf), cpc_buf_role_name(s->role));
    if (V->prog->buffers[r->buf].tokens == CPC_TOK_BLOCK && r->x->op->block && r->snap.tag != (int)r->x->block)
        return vfail(r->p, r->x, "declares block %lld for '%s' but rank %d sends block %d", (long long)r->x->block,
                     bn(V, r->buf), s->p, r->snap.tag);
    return NULL;
}

static cpc_status *post_send(vb *V, int p, const xop *x)
{
    const cpc_op *op = x->op;
    int dst = flat_of(V, p, op->group, x->peer);
    for (int i = 0; i < op->n_in; i++) {
        slot *sl = S(V, p, op->in[i]);
        if (!sl->written)
            return vfail(p, x, "sends '%s' before it is written", bn(V, op->in[i]));
        req *q = calloc(1, sizeof *q);
        if (!q)
            return &cpc_status_oom;
        *q = (req){.x = x, .p = p, .peer = dst, .group = op->group, .tag = op->tag, .buf = op->in[i],
                   .slot = V->map[p * V->nb + op->in[i]], .role = role(V, op->in[i]), .send = true, .snap = *sl};
        q->snap.cnt = NULL;
        cpc_status *st = push_req(V, p, q);
        if (st) {
            free(q);
            return st;
        }
        if (sl->cnt) {
            if (!(q->snap.cnt = malloc(cnt_bytes(V))))
                return &cpc_status_oom;
            memcpy(q->snap.cnt, sl->cnt, cnt_bytes(V));
        }
        rank_reqs *d = &V->rr[dst];
        req *r = take(&d->rq, &d->rq_tail, p, op->group, op->tag);
        if (r) {
            if ((st = match(V, q, r)))
                return st;
        } else
            enqueue(&d->sq, &d->sq_tail, q);
    }
    return NULL;
}

static cpc_status *post_recv(vb *V, int p, const xop *x)
{
    const cpc_op *op = x->op;
    int src = flat_of(V, p, op->group, x->peer);
    for (int i = 0; i < op->n_out; i++) {
        req *q = calloc(1, sizeof *q);
        if (!q)
            return &cpc_status_oom;
        *q = (req){.x = x, .p = p, .peer = src, .group = op->group, .tag = op->tag, .buf = op->out[i],
                   .slot = V->map[p * V->nb + op->out[i]], .role = role(V, op->out[i])};
        cpc_status *st = push_req(V, p, q);
        if (st) {
            free(q);
            return st;
        }
        rank_reqs *me = &V->rr[p];
        req *s = take(&me->sq, &me->sq_tail, src, op->group, op->tag);
        if (s) {
            if ((st = match(V, s, q)))
                return st;
        } else
            enqueue(&me->rq, &me->rq_tail, q);
    }
    return NULL;
}

/* wait: 1 when every request of its tag is matched (then completed: a recv's
 * buffer takes what arrived), 0 when one is not yet (the rank blocks:
 * rendezvous, a send completes only once its recv is posted). */
static int do_wait(vb *V, int p, const xop *x)
{
    rank_reqs *rq = &V->rr[p];
    for (int j = 0; j < rq->n; j++)
        if (rq->v[j]->tag == x->op->tag && !rq->v[j]->matched)
            return 0;
    int k = 0;
    for (int j = 0; j < rq->n; j++) {
        req *q = rq->v[j];
        if (q->tag != x->op->tag) {
            rq->v[k++] = q;
            continue;
        }
        if (!q->send) {
            slot *sl = &V->slots[q->slot];
            sl->tag = q->snap.tag;
            sl->written = true;
            sl->src = q->snap.src;
            if (sl->cnt && q->snap.cnt)
                memcpy(sl->cnt, q->snap.cnt, cnt_bytes(V));
            else if (sl->cnt)
                memset(sl->cnt, 0, cnt_bytes(V));
        }
        free(q->snap.cnt);
        free(q);
    }
    rq->n = k;
    return 1;
}

/* Runs rank p until it blocks on a wait or reaches a collective (returns 0),
 * ends (1) or fails (-1). */
static int advance(vb *V, int p)
{
    const cpc_program *prog = V->prog;
    rank_ops *ro = &V->ro[p];
    const int u = p % V->U;
    while (V->pc[p] < ro->n) {
        const xop *x = &ro->v[V->pc[p]];
        const cpc_op *op = x->op;
        /* the op table's rules, for every op: lifetimes of in-flight
         * buffers, then the content each operand must hold */
        if ((V->err = check_in_flight(V, p, x)) || (V->err = check_content(V, p, x)))
            return -1;
        switch (op->kind) {
        case CPC_OP_WAIT:
            if (!do_wait(V, p, x))
                return 0; /* blocked until the peers post */
            break;
        case CPC_OP_ALL_TO_ALL:
            if (op->group != CPC_GROUP_ULYSSES) {
                V->err = vfail(p, x, "all_to_all runs over the ulysses group");
                return -1;
            }
            return 0; /* fired by run_a2a once every member is here */
        case CPC_OP_ALL_REDUCE:
            if (op->group != CPC_GROUP_WORLD) {
                V->err = vfail(p, x, "all_reduce runs over the world group");
                return -1;
            }
            return 0; /* fired by run_all_reduce once every rank is here */
        case CPC_OP_COPY:
            for (int i = 0; i < op->n_in; i++) {
                int a = op->in[i], b = op->out[i];
                slot *si = S(V, p, a), *so = S(V, p, b);
                if (op->n_in != op->n_out || role(V, a) != role(V, b) || BF(V, a)->tokens != BF(V, b)->tokens) {
                    V->err = vfail(p, x, "copies '%s' into '%s' of another role or token layout", bn(V, a), bn(V, b));
                    return -1;
                }
                if (!si->written) {
                    V->err = vfail(p, x, "copies '%s' before it is written", bn(V, a));
                    return -1;
                }
                bool widen = BF(V, a)->heads == CPC_HEADS_PART && BF(V, b)->heads == CPC_HEADS_ALL;
                if (widen && !is_grad(role(V, a))) {
                    V->err = vfail(p, x, "'%s' -> '%s': only a gradient's head part is placed into every head",
                                   bn(V, a), bn(V, b));
                    return -1;
                }
                so->written = true;
                so->tag = si->tag;
                so->src = si->src;
                if (si->cnt && so->cnt) {
                    /* a head part keeps its own heads' pairs, zeros elsewhere */
                    for (int qk = 0; qk < V->R * V->NK; qk++)
                        for (int h = 0; h < V->nh; h++) {
                            size_t j = (size_t)qk * (size_t)V->nh + (size_t)h;
                            so->cnt[j] = holds_unit(V, a, u, h) && holds_unit(V, b, u, h) ? si->cnt[j] : 0;
                        }
                }
            }
            break;
        case CPC_OP_ALL_GATHER:
        case CPC_OP_REDUCE_SCATTER:
            if (op->group != CPC_GROUP_RING) {
                V->err = vfail(p, x, "%s runs over the ring group", cpc_op_kind_name(op->kind));
                return -1;
            }
            return 0; /* fired by run_ring_coll once every member is here */
        case CPC_OP_DELTA: {
            if (op->n_in != 2 || op->n_out != 1 || role(V, op->in[0]) != CPC_ROLE_DO ||
                role(V, op->in[1]) != CPC_ROLE_O || role(V, op->out[0]) != CPC_ROLE_LSE) {
                V->err = vfail(p, x, "operands must be (do, o) -> lse-role delta");
                return -1;
            }
            slot *a = S(V, p, op->in[0]), *o = S(V, p, op->in[1]), *d = S(V, p, op->out[0]);
            if (!a->written || !o->written || a->tag != o->tag || !same_layout(V, op->in[0], op->in[1]) ||
                !same_layout(V, op->in[0], op->out[0])) {
                V->err = vfail(p, x, "dout '%s', out '%s' and delta '%s' must be written and hold the same rows "
                               "and heads", bn(V, op->in[0]), bn(V, op->in[1]), bn(V, op->out[0]));
                return -1;
            }
            d->tag = a->tag;
            d->written = true;
            d->src = CPC_CONTENT_DELTA;
            break;
        }
        case CPC_OP_INIT_ACC:
            for (int i = 0; i < op->n_out; i++) {
                int b = op->out[i];
                if (!is_grad(role(V, b))) {
                    V->err = vfail(p, x, "'%s' (role %s): a backward program initialises only dq/dk/dv",
                                   bn(V, b), cpc_buf_role_name(role(V, b)));
                    return -1;
                }
                slot *sl = S(V, p, b);
                memset(sl->cnt, 0, cnt_bytes(V));
                sl->written = true;
                sl->src = CPC_CONTENT_GRAD;
                if (op->block) {
                    /* made the accumulator of ring block `block` */
                    if (BF(V, b)->tokens != CPC_TOK_BLOCK || x->block < 0 || x->block >= V->R) {
                        V->err = vfail(p, x, "init_acc block=%lld of '%s': a ring block's accumulator (BLOCK, "
                                             "0..%d)", (long long)x->block, bn(V, b), V->R - 1);
                        return -1;
                    }
                    sl->tag = (int)x->block;
                }
            }
            break;
        case CPC_OP_ADD: {
            int a = op->in[0], b = op->out[0];
            slot *sa = S(V, p, a), *sb = S(V, p, b);
            if (op->n_in != 1 || op->n_out != 1 || !is_grad(role(V, a)) || role(V, a) != role(V, b) ||
                !same_layout(V, a, b)) {
                V->err = vfail(p, x, "add: '%s' and '%s' must be gradients of one role and layout", bn(V, a), bn(V, b));
                return -1;
            }
            if (!sa->written || !sb->written) {
                V->err = vfail(p, x, "adds '%s' into '%s' before both hold a value", bn(V, a), bn(V, b));
                return -1;
            }
            if (sa->tag != sb->tag) {
                V->err = vfail(p, x, "adds the gradient of block %d ('%s') to that of block %d ('%s')", sa->tag,
                               bn(V, a), sb->tag, bn(V, b));
                return -1;
            }
            for (size_t i = 0; i < cnt_bytes(V); i++)
                sat_add(&sb->cnt[i], sa->cnt[i]);
            break;
        }
        case CPC_OP_ATTN_BWD: {
            static const cpc_buf_role want_in[6] = {CPC_ROLE_Q, CPC_ROLE_K, CPC_ROLE_V, CPC_ROLE_DO, CPC_ROLE_LSE,
                                                    CPC_ROLE_LSE};
            static const cpc_buf_role want_out[3] = {CPC_ROLE_DQ, CPC_ROLE_DK, CPC_ROLE_DV};
            if (op->n_in != 6 || op->n_out != 3) {
                V->err = vfail(p, x, "needs 6 inputs and 3 outputs");
                return -1;
            }
            for (int i = 0; i < 6; i++)
                if (role(V, op->in[i]) != want_in[i]) {
                    V->err = vfail(p, x, "input %d '%s' has role %s, %s expected", i + 1, bn(V, op->in[i]),
                                   cpc_buf_role_name(role(V, op->in[i])), cpc_buf_role_name(want_in[i]));
                    return -1;
                }
            for (int i = 0; i < 3; i++)
                if (role(V, op->out[i]) != want_out[i]) {
                    V->err = vfail(p, x, "output %d '%s' has role %s, %s expected", i + 1, bn(V, op->out[i]),
                                   cpc_buf_role_name(role(V, op->out[i])), cpc_buf_role_name(want_out[i]));
                    return -1;
                }
            for (int i = 0; i < 6; i++)
                if (!S(V, p, op->in[i])->written) {
                    V->err = vfail(p, x, "reads '%s' before it is written%s", bn(V, op->in[i]),
                                   i == 5 ? " (no delta op computed it)" : "");
                    return -1;
                }
            for (int i = 0; i < 3; i++)
                if (!S(V, p, op->out[i])->written) {
                    V->err = vfail(p, x, "adds to '%s' before init_acc (or a recv) gave it a value",
                                   bn(V, op->out[i]));
                    return -1;
                }
            slot *q = S(V, p, op->in[0]), *k = S(V, p, op->in[1]), *v = S(V, p, op->in[2]);
            slot *dk = S(V, p, op->out[1]), *dv = S(V, p, op->out[2]), *dq = S(V, p, op->out[0]);
            /* Query side: q, dout, lse, delta, dq in one layout and rows; K side:
             * k, v, dk, dv in one layout (heads: this member's part or all). */
            int qside[5] = {op->in[3], op->in[4], op->in[5], op->out[0], op->in[0]};
            for (int i = 0; i < 4; i++)
                if (!same_layout(V, qside[i], op->in[0]) ||
                    (i < 3 && S(V, p, qside[i])->tag != q->tag)) {
                    V->err = vfail(p, x, "'%s' (%s/%s, rows %d) does not match q '%s' (%s/%s, rows %d)",
                                   bn(V, qside[i]), cpc_buf_tokens_name(BF(V, qside[i])->tokens),
                                   cpc_buf_heads_name(BF(V, qside[i])->heads), S(V, p, qside[i])->tag,
                                   bn(V, op->in[0]), cpc_buf_tokens_name(BF(V, op->in[0])->tokens),
                                   cpc_buf_heads_name(BF(V, op->in[0])->heads), q->tag);
                    return -1;
                }
            int kside[3] = {op->in[2], op->out[1], op->out[2]};
            for (int i = 0; i < 3; i++)
                if (!same_layout(V, kside[i], op->in[1]) || BF(V, op->in[1])->heads != BF(V, op->in[0])->heads) {
                    V->err = vfail(p, x, "'%s' does not have the layout of k '%s' (and of the query side's heads)",
                                   bn(V, kside[i]), bn(V, op->in[1]));
                    return -1;
                }
            bool kall = BF(V, op->in[1])->tokens == CPC_TOK_ALL;
            bool kkv = BF(V, op->in[1])->tokens == CPC_TOK_KV;
            if (kkv) {
                /* cross-attention: all of K/V, one key unit */
            } else if (kall) {
                /* gathered K/V: the op's `block` is what it reads, and dK/dV
                 * (gathered too, same layout) get that slice */
                if (!op->block || x->block < 0 || x->block >= V->R) {
                    V->err = vfail(p, x, "attn_bwd on gathered K/V needs a block in 0..%d", V->R - 1);
                    return -1;
                }
            } else if (k->tag != v->tag || k->tag != dk->tag || k->tag != dv->tag) {
                V->err = vfail(p, x,
                               "reads K/V blocks %d/%d but adds to dK/dV accumulators of blocks %d/%d: a K/V "
                               "block's gradient must come from that block (diffusers #14265: a ring backward "
                               "that reuses one step's K/V)",
                               k->tag, v->tag, dk->tag, dv->tag);
                return -1;
            }
            cpc_buf_tokens qt = BF(V, op->in[0])->tokens;
            int kb = kkv ? 0 : kall ? (int)x->block : k->tag;
            if ((!kall && !kkv && BF(V, op->in[1])->tokens != CPC_TOK_BLOCK) || (kkv != (V->NK == 1 && V->prog->layout.cross)) ||
                (qt != CPC_TOK_SHARD && qt != CPC_TOK_BLOCK) ||
                (qt == CPC_TOK_SHARD && V->U != 1)) {
                V->err = vfail(p, x, "q must be a shard (ulysses_degree 1) or a ring block, K/V ring blocks "
                                     "or gathered (the class this prover handles)");
                return -1;
            }
            /* Query rows as a ring block: with U == 1 shard p is block p. */
            int qb = q->tag;
            if (kb < 0 || kb >= V->NK || qb < 0 || qb >= V->R) {
                V->err = vfail(p, x, "K/V content (block %d) or query rows (%d) unknown", k->tag, q->tag);
                return -1;
            }
            int qo = 0, qn = 1;
            if (V->nh > 1)
                cpc_buffer_heads(prog, op->in[0], u, &qo, &qn);
            int ko, kn;
            cpc_buffer_heads(prog, op->in[1], u, &ko, &kn);
            if (V->nh > 1 && qn > 0 &&
                (qo / prog->layout.group < ko || (qo + qn - 1) / prog->layout.group >= ko + kn)) {
                V->err = vfail(p, x, "query heads [%d, %d) use K/V heads this rank does not hold ([%d, %d))", qo,
                               qo + qn, ko, ko + kn);
                return -1;
            }
            for (int h = qo; h < qo + qn; h++) {
                size_t i = ((size_t)qb * (size_t)V->NK + (size_t)kb) * (size_t)V->nh + (size_t)h;
                sat_add(&dq->cnt[i], 1);
                sat_add(&dk->cnt[i], 1);
                sat_add(&dv->cnt[i], 1);
            }
            dq->tag = q->tag;
            break;
        }
        case CPC_OP_SWAP: {
            int a = op->in[0], b = op->in[1];
            const cpc_buffer *A = &prog->buffers[a], *B = &prog->buffers[b];
            if (a == b || A->role != B->role || A->tokens != B->tokens || A->heads != B->heads) {
                V->err = vfail(p, x, "swaps '%s' and '%s' of different layouts", A->name, B->name);
                return -1;
            }
            int t = V->map[p * V->nb + a];
            V->map[p * V->nb + a] = V->map[p * V->nb + b];
            V->map[p * V->nb + b] = t;
            break;
        }
        case CPC_OP_SEND:
            if ((V->err = post_send(V, p, x)))
                return -1;
            break;
        case CPC_OP_RECV:
            if ((V->err = post_recv(V, p, x)))
                return -1;
            break;
        default:
            V->err = vfail(p, x, "op kind %s is outside the backward prover's class", cpc_op_kind_name(op->kind));
            return -1;
        }
        V->pc[p]++;
    }
    return 1;
}

static cpc_status *final_checks(vb *V, int p)
{
    const cpc_program *prog = V->prog;
    const int r = p / V->U;
    int have[3] = {0, 0, 0};
    for (int b = 0; b < V->nb; b++) {
        const cpc_buffer *B = &prog->buffers[b];
        if (B->io != CPC_IO_OUTPUT)
            continue;
        if (!is_grad(B->role))
            return vfail(p, NULL, "OUTPUT buffer '%s' has role %s (dq, dk or dv expected)", B->name,
                         cpc_buf_role_name(B->role));
        have[B->role - CPC_ROLE_DQ]++;
    }
    for (int i = 0; i < 3; i++)
        if (have[i] != 1)
            return vfail(p, NULL, "%d OUTPUT buffers of role %s (exactly one expected: yunchang #149)", have[i],
                         cpc_buf_role_name((cpc_buf_role)(CPC_ROLE_DQ + i)));
    for (int b = 0; b < V->nb; b++) {
        const cpc_buffer *B = &prog->buffers[b];
        if (B->io != CPC_IO_OUTPUT)
            continue;
        slot *sl = S(V, p, b);
        bool isq = B->role == CPC_ROLE_DQ;
        /* This rank's shard with every head: SHARD p, or with U == 1 BLOCK p;
         * cross-attention dK/dV: all of K/V (KV), the same on every rank. */
        bool kvout = B->tokens == CPC_TOK_KV && !isq && V->prog->layout.cross;
        bool shard = B->tokens == CPC_TOK_SHARD || (B->tokens == CPC_TOK_BLOCK && V->U == 1) || kvout;
        if (B->heads != CPC_HEADS_ALL || !shard)
            return vfail(p, NULL, "OUTPUT '%s' (%s/%s) is not a shard with every head (a head part or a ring "
                                  "block never went back to the sequence layout)",
                         B->name, cpc_buf_tokens_name(B->tokens), cpc_buf_heads_name(B->heads));
        if (!sl->written)
            return vfail(p, NULL, "OUTPUT '%s' is never written", B->name);
        if (!kvout && sl->tag != p)
            return vfail(p, NULL, "OUTPUT '%s' ends holding %s %d, not this rank's own %d", B->name,
                         isq ? "rows of shard" : "the gradient of block", sl->tag, p);
        for (int qb = 0; qb < V->R; qb++)
            for (int kb = 0; kb < V->NK; kb++)
                for (int h = 0; h < V->nh; h++) {
                    int c = sl->cnt[((size_t)qb * (size_t)V->NK + (size_t)kb) * (size_t)V->nh + (size_t)h];
                    int want = isq ? (qb == r) : kvout ? 1 : (kb == r);
                    if (c != want) {
                        char hs[48] = "";
                        if (V->nh > 1)
                            snprintf(hs, sizeof hs, ", query head %d", h);
                        return vfail(p, NULL,
                                     "OUTPUT '%s': the pairs (query block %d, key block %d%s) contribute %d "
                                     "time%s, expected %d",
                                     B->name, qb, kb, hs, c, c == 1 ? "" : "s", want);
                    }
                }
    }
    return NULL;
}

/* The INPUT layouts the executor fills: q/k/v/dout/out shards with every
 * head (with U == 1 also as BLOCK r == shard r); the saved LSE in the
 * forward's attention layout (SHARD with U == 1, BLOCK/PART with U > 1). */
static cpc_status *check_input(const vb *V, const cpc_buffer *B)
{
    bool ok;
    if (B->role == CPC_ROLE_LSE)
        ok = V->U == 1 ? B->tokens == CPC_TOK_SHARD && B->heads == CPC_HEADS_ALL
                       : B->tokens == CPC_TOK_BLOCK && B->heads == CPC_HEADS_PART;
    else
        ok = (B->role == CPC_ROLE_Q || is_kvr(B->role) || B->role == CPC_ROLE_DO || B->role == CPC_ROLE_O) &&
             !is_grad(B->role) && B->heads == CPC_HEADS_ALL &&
             (B->tokens == CPC_TOK_SHARD || (B->tokens == CPC_TOK_BLOCK && V->U == 1) ||
              (B->tokens == CPC_TOK_KV && V->prog->layout.cross && (B->role == CPC_ROLE_K || B->role == CPC_ROLE_V)));
    if (ok)
        return NULL;
    return vfail(0, NULL, "INPUT buffer '%s' (role %s, %s/%s) is not a layout the runtime fills", B->name,
                 cpc_buf_role_name(B->role), cpc_buf_tokens_name(B->tokens), cpc_buf_heads_name(B->heads));
}

cpc_status *cpc_verify_backward(const cpc_program *prog)
{
    if (!prog)
        return cpc_error(CPC_E_INTERNAL, "verify_backward: no program");
    const cpc_layout *L = &prog->layout;
    if (L->P > VB_MAX_P || L->P != L->R * L->U)
        return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, CPC_NO_SPAN,
                        "backward program: %d ranks: enumeration is limited to %d ranks", L->P, VB_MAX_P);
    vb V = {.prog = prog, .P = L->P, .R = L->R, .U = L->U, .nb = prog->n_buffers, .nh = L->U > 1 ? L->H : 1};
    V.NK = L->cross ? 1 : L->R;
    V.npairs = V.R * V.NK * V.nh;
    int ngrad = 0;
    for (int b = 0; b < V.nb; b++)
        ngrad += is_grad(prog->buffers[b].role);
    if ((int64_t)V.P * ngrad * V.npairs > VB_MAX_CELLS)
        return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, CPC_NO_SPAN,
                        "backward program: %d ranks x %d gradient buffers x %d (query block, key block, head) "
                        "pairs: more than the enumeration's %lld cells",
                        V.P, ngrad, V.npairs, (long long)VB_MAX_CELLS);
    size_t ns = (size_t)V.P * (size_t)(V.nb > 0 ? V.nb : 1);
    V.ro = calloc((size_t)V.P, sizeof *V.ro);
    V.slots = calloc(ns, sizeof *V.slots);
    V.map = calloc(ns, sizeof *V.map);
    V.pc = calloc((size_t)V.P, sizeof *V.pc);
    V.rr = calloc((size_t)V.P, sizeof *V.rr);
    cpc_status *st = NULL;
    if (!V.ro || !V.slots || !V.map || !V.pc || !V.rr) {
        st = &cpc_status_oom;
        goto done;
    }
    for (int b = 0; b < V.nb && !st; b++)
        if (prog->buffers[b].io == CPC_IO_INPUT)
            st = check_input(&V, &prog->buffers[b]);
    for (int p = 0; p < V.P && !st; p++) {
        cpc_coords c = cpc_program_coords(prog, p);
        for (int b = 0; b < V.nb; b++) {
            const cpc_buffer *B = &prog->buffers[b];
            slot *sl = &V.slots[p * V.nb + b];
            V.map[p * V.nb + b] = p * V.nb + b;
            sl->tag = B->tokens == CPC_TOK_SHARD ? p : B->tokens == CPC_TOK_BLOCK ? (int)c.r : CPC_TAG_NONE;
            sl->written = B->io == CPC_IO_INPUT;
            sl->src = sl->written ? cpc_content_of_role(B->role) : CPC_CONTENT_NONE;
            if (B->tokens == CPC_TOK_KV && !L->cross) {
                st = vfail(p, NULL, "buffer '%s' has the %s token layout without cross-attention", B->name,
                           cpc_buf_tokens_name(B->tokens));
                break;
            }
            if (is_grad(B->role) && !(sl->cnt = calloc(cnt_bytes(&V), 1))) {
                st = &cpc_status_oom;
                break;
            }
        }
        if (!st)
            st = cpc_program_walk(prog, p, collect, &V.ro[p]);
    }
    if (st)
        goto done;
    /* Round-robin until every rank ends; an all_to_all fires when every
     * member of its ulysses group has reached it; a round without progress
     * is a deadlock. */
    for (;;) {
        bool all = true, moved = false;
        for (int p = 0; p < V.P; p++) {
            int before = V.pc[p];
            int r = advance(&V, p);
            if (r < 0) {
                st = V.err;
                goto done;
            }
            if (r == 0)
                all = false;
            if (V.pc[p] != before)
                moved = true;
        }
        if (all)
            break;
        /* ulysses groups (all_to_all), then ring groups (all_gather, reduce_scatter) */
        for (int gk = 0; gk < 2; gk++) {
            int ng = gk == 0 ? V.R : V.U, nm = gk == 0 ? V.U : V.R;
            for (int g = 0; g < ng; g++) {
                bool ready = true;
                const cpc_op *op0 = NULL;
                for (int j = 0; j < nm && ready; j++) {
                    int p = gk == 0 ? g * V.U + j : j * V.U + g;
                    cpc_op_kind k = V.pc[p] < V.ro[p].n ? V.ro[p].v[V.pc[p]].op->kind : CPC_OP__COUNT;
                    bool here = gk == 0 ? k == CPC_OP_ALL_TO_ALL : (k == CPC_OP_ALL_GATHER || k == CPC_OP_REDUCE_SCATTER);
                    if (!here) {
                        ready = false;
                        break;
                    }
                    const cpc_op *op = V.ro[p].v[V.pc[p]].op;
                    if (op0 && op != op0) {
                        st = vfail(p, &V.ro[p].v[V.pc[p]], "members of its %s group reach different collective "
                                                           "ops", gk == 0 ? "ulysses" : "ring");
                        goto done;
                    }
                    op0 = op;
                }
                if (ready) {
                    if ((st = gk == 0 ? run_a2a(&V, g) : run_ring_coll(&V, g)))
                        goto done;
                    moved = true;
                }
            }
        }
        {
            /* the world group (all_reduce) */
            bool ready = true;
            for (int p = 0; p < V.P && ready; p++) {
                if (V.pc[p] >= V.ro[p].n || V.ro[p].v[V.pc[p]].op->kind != CPC_OP_ALL_REDUCE) {
                    ready = false;
                    break;
                }
                if (V.ro[p].v[V.pc[p]].op != V.ro[0].v[V.pc[0]].op) {
                    st = vfail(p, &V.ro[p].v[V.pc[p]], "ranks reach different all_reduce ops");
                    goto done;
                }
            }
            if (ready) {
                if ((st = run_all_reduce(&V)))
                    goto done;
                moved = true;
            }
        }
        if (!moved) {
            for (int p = 0; p < V.P; p++)
                if (V.pc[p] < V.ro[p].n) {
                    const xop *x = &V.ro[p].v[V.pc[p]];
                    if (x->op->kind == CPC_OP_ALL_TO_ALL || x->op->kind == CPC_OP_ALL_GATHER ||
                        x->op->kind == CPC_OP_REDUCE_SCATTER || x->op->kind == CPC_OP_ALL_REDUCE)
                        st = vfail(p, x, "waits forever: a member of its %s group never reaches this %s",
                                   x->op->kind == CPC_OP_ALL_TO_ALL ? "ulysses"
                                   : x->op->kind == CPC_OP_ALL_REDUCE ? "world" : "ring",
                                   cpc_op_kind_name(x->op->kind));
                    else {
                        const req *q = NULL;
                        for (int j = 0; j < V.rr[p].n && !q; j++)
                            if (V.rr[p].v[j]->tag == x->op->tag && !V.rr[p].v[j]->matched)
                                q = V.rr[p].v[j];
                        st = q ? vfail(p, x,
                                       "waits forever: its %s of '%s' (%s group, tag %d) %s rank %d is never "
                                       "matched: that rank posts no %s for it before it blocks itself (a wait "
                                       "completes only once the peer has posted: rendezvous)",
                                       q->send ? "send" : "recv", bn(&V, q->buf), cpc_group_name(q->group), q->tag,
                                       q->send ? "to" : "from", q->peer, q->send ? "matching recv" : "matching send")
                               : vfail(p, x, "waits forever");
                    }
                    break;
                }
            goto done;
        }
    }
    /* every request completed by a wait (a send never received is still posted) */
    for (int p = 0; p < V.P; p++)
        if (V.rr[p].n) {
            const req *q = V.rr[p].v[0];
            st = vfail(p, q->x, "its %s of '%s' (tag %d, %s rank %d) is %s and never completed by a wait",
                       q->send ? "send" : "recv", bn(&V, q->buf), q->tag, q->send ? "to" : "from", q->peer,
                       q->matched ? "matched" : "never matched");
            goto done;
        }
    for (int p = 0; p < V.P && !st; p++)
        st = final_checks(&V, p);
done:
    if (V.rr)
        for (int p = 0; p < V.P; p++) {
            for (int j = 0; j < V.rr[p].n; j++) {
                free(V.rr[p].v[j]->snap.cnt);
                free(V.rr[p].v[j]);
            }
            free(V.rr[p].v);
        }
    free(V.rr);
    if (V.slots)
        for (size_t i = 0; i < ns; i++)
            free(V.slots[i].cnt);
    if (V.ro)
        for (int p = 0; p < V.P; p++)
            free(V.ro[p].v);
    free(V.ro);
    free(V.slots);
    free(V.map);
    free(V.pc);
    return st;
}
