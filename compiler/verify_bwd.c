/* verify_bwd.c - enumeration prover of backward programs; see verify_bwd.h. */
#include "verify_bwd.h"

#include <stdarg.h>
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

typedef struct slot {
    int tag;
    bool written;   /* init_acc'd / delta written / received / input */
    int *cnt;       /* [P * R] pairs (query shard, key block), D* roles only */
} slot;

typedef struct msg {
    int src, dst, tag, n;
    slot part[CPC_OP_MAX_BUFS];
    cpc_buf_role role[CPC_OP_MAX_BUFS];
    struct msg *next;
} msg;

typedef struct vb {
    const cpc_program *prog;
    int P, R, nb, npairs;
    rank_ops *ro;
    slot *slots;    /* [P * nb] slot storage */
    int *map;       /* [P * nb]: buffer -> slot index (swap permutes) */
    int *pc;
    msg *head, *tail;
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

/* Runs rank p until it blocks on a recv (returns 0), ends (1) or fails (-1). */
static int advance(vb *V, int p)
{
    const cpc_program *prog = V->prog;
    rank_ops *ro = &V->ro[p];
    while (V->pc[p] < ro->n) {
        const xop *x = &ro->v[V->pc[p]];
        const cpc_op *op = x->op;
        switch (op->kind) {
        case CPC_OP_WAIT:
            break;
        case CPC_OP_DELTA: {
            if (op->n_in != 2 || op->n_out != 1 || role(V, op->in[0]) != CPC_ROLE_DO ||
                role(V, op->in[1]) != CPC_ROLE_O || role(V, op->out[0]) != CPC_ROLE_LSE) {
                V->err = vfail(p, x, "operands must be (do, o) -> lse-role delta");
                return -1;
            }
            slot *a = S(V, p, op->in[0]), *o = S(V, p, op->in[1]), *d = S(V, p, op->out[0]);
            if (!a->written || !o->written || a->tag != o->tag) {
                V->err = vfail(p, x, "dout '%s' and out '%s' must be written and hold the same rows",
                               bn(V, op->in[0]), bn(V, op->in[1]));
                return -1;
            }
            d->tag = a->tag;
            d->written = true;
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
                memset(sl->cnt, 0, (size_t)V->npairs * sizeof *sl->cnt);
                sl->written = true;
            }
            break;
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
            for (int i = 3; i < 6; i++)
                if (S(V, p, op->in[i])->tag != q->tag) {
                    V->err = vfail(p, x, "'%s' holds rows %d but q '%s' holds rows %d", bn(V, op->in[i]),
                                   S(V, p, op->in[i])->tag, bn(V, op->in[0]), q->tag);
                    return -1;
                }
            if (k->tag != v->tag || k->tag != dk->tag || k->tag != dv->tag) {
                V->err = vfail(p, x,
                               "reads K/V blocks %d/%d but adds to dK/dV accumulators of blocks %d/%d: a K/V "
                               "block's gradient must come from that block (diffusers #14265: a ring backward "
                               "that reuses one step's K/V)",
                               k->tag, v->tag, dk->tag, dv->tag);
                return -1;
            }
            if (prog->buffers[op->in[0]].tokens != CPC_TOK_SHARD || prog->buffers[op->out[0]].tokens != CPC_TOK_SHARD) {
                V->err = vfail(p, x, "q and dq must be shards (the class this prover handles)");
                return -1;
            }
            if (k->tag < 0 || k->tag >= V->R || q->tag < 0 || q->tag >= V->P) {
                V->err = vfail(p, x, "K/V content (block %d) or query rows (shard %d) unknown", k->tag, q->tag);
                return -1;
            }
            int pair = q->tag * V->R + k->tag;
            dq->cnt[pair]++;
            dk->cnt[pair]++;
            dv->cnt[pair]++;
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
        case CPC_OP_SEND: {
            if (op->group != CPC_GROUP_RING && op->group != CPC_GROUP_WORLD) {
                V->err = vfail(p, x, "backward sends run over the ring (or world) group");
                return -1;
            }
            msg *m = calloc(1, sizeof *m);
            if (!m) {
                V->err = &cpc_status_oom;
                return -1;
            }
            m->src = p;
            m->dst = (int)x->peer; /* U == 1: ring index == flat rank */
            m->tag = op->tag;
            m->n = op->n_in;
            for (int i = 0; i < op->n_in; i++) {
                slot *sl = S(V, p, op->in[i]);
                if (!sl->written) {
                    for (int j = 0; j < i; j++)
                        free(m->part[j].cnt);
                    free(m);
                    V->err = vfail(p, x, "sends '%s' before it is written", bn(V, op->in[i]));
                    return -1;
                }
                m->part[i] = *sl;
                m->role[i] = role(V, op->in[i]);
                m->part[i].cnt = NULL;
                if (sl->cnt) {
                    m->part[i].cnt = malloc((size_t)V->npairs * sizeof(int));
                    if (!m->part[i].cnt) {
                        V->err = &cpc_status_oom;
                        for (int j = 0; j < i; j++)
                            free(m->part[j].cnt);
                        free(m);
                        return -1;
                    }
                    memcpy(m->part[i].cnt, sl->cnt, (size_t)V->npairs * sizeof(int));
                }
            }
            if (V->tail)
                V->tail->next = m;
            else
                V->head = m;
            V->tail = m;
            break;
        }
        case CPC_OP_RECV: {
            msg *prev = NULL, *m = V->head;
            while (m && !(m->dst == p && m->src == (int)x->peer && m->tag == op->tag)) {
                prev = m;
                m = m->next;
            }
            if (!m)
                return 0; /* blocked */
            if (prev)
                prev->next = m->next;
            else
                V->head = m->next;
            if (V->tail == m)
                V->tail = prev;
            cpc_status *st = NULL;
            if (m->n != op->n_out)
                st = vfail(p, x, "receives %d buffers, rank %d sent %d (tag %d)", op->n_out, m->src, m->n, m->tag);
            for (int i = 0; !st && i < op->n_out; i++) {
                int b = op->out[i];
                if (m->role[i] != role(V, b))
                    st = vfail(p, x, "'%s' (role %s) receives a %s buffer from rank %d", bn(V, b),
                               cpc_buf_role_name(role(V, b)), cpc_buf_role_name(m->role[i]), m->src);
                else if (m->part[i].tag != (int)x->block)
                    st = vfail(p, x, "declares block %lld for '%s' but rank %d sends block %d", (long long)x->block,
                               bn(V, b), m->src, m->part[i].tag);
                else {
                    slot *sl = S(V, p, b);
                    sl->tag = m->part[i].tag;
                    sl->written = true;
                    if (sl->cnt && m->part[i].cnt)
                        memcpy(sl->cnt, m->part[i].cnt, (size_t)V->npairs * sizeof(int));
                }
            }
            for (int i = 0; i < m->n; i++)
                free(m->part[i].cnt);
            free(m);
            if (st) {
                V->err = st;
                return -1;
            }
            break;
        }
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
    int have[3] = {0, 0, 0};
    for (int b = 0; b < V->nb; b++) {
        const cpc_buffer *B = &prog->buffers[b];
        if (B->io != CPC_IO_OUTPUT)
            continue;
        if (!is_grad(B->role))
            return vfail(p, NULL, "OUTPUT buffer '%s' has role %s (dq, dk or dv expected)", B->name,
                         cpc_buf_role_name(B->role));
        have[B->role - CPC_ROLE_DQ]++;
        slot *sl = S(V, p, b);
        bool isq = B->role == CPC_ROLE_DQ;
        int own = isq ? p : p; /* U == 1: shard p == block p */
        if (!sl->written || sl->tag != own)
            return vfail(p, NULL, "OUTPUT '%s' ends holding %s %d, not this rank's own %d", B->name,
                         isq ? "rows of shard" : "the gradient of block", sl->tag, own);
        for (int qs = 0; qs < V->P; qs++)
            for (int kb = 0; kb < V->R; kb++) {
                int c = sl->cnt[qs * V->R + kb];
                int want = isq ? (qs == p) : (kb == p);
                if (c != want)
                    return vfail(p, NULL,
                                 "OUTPUT '%s': the pairs (query shard %d, key block %d) contribute %d time%s, "
                                 "expected %d",
                                 B->name, qs, kb, c, c == 1 ? "" : "s", want);
            }
    }
    for (int i = 0; i < 3; i++)
        if (have[i] != 1)
            return vfail(p, NULL, "%d OUTPUT buffers of role %s (exactly one expected: yunchang #149)", have[i],
                         cpc_buf_role_name((cpc_buf_role)(CPC_ROLE_DQ + i)));
    return NULL;
}

cpc_status *cpc_verify_backward(const cpc_program *prog)
{
    if (!prog)
        return cpc_error(CPC_E_INTERNAL, "verify_backward: no program");
    const cpc_layout *L = &prog->layout;
    if (L->U != 1 || L->P != L->R)
        return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, CPC_NO_SPAN,
                        "backward program: ulysses_degree %d: the backward prover handles ulysses_degree 1 only",
                        L->U);
    if (L->P > VB_MAX_P)
        return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, CPC_NO_SPAN,
                        "backward program: %d ranks: enumeration is limited to %d ranks", L->P, VB_MAX_P);
    vb V = {.prog = prog, .P = L->P, .R = L->R, .nb = prog->n_buffers};
    V.npairs = V.P * V.R;
    size_t ns = (size_t)V.P * (size_t)(V.nb > 0 ? V.nb : 1);
    V.ro = calloc((size_t)V.P, sizeof *V.ro);
    V.slots = calloc(ns, sizeof *V.slots);
    V.map = calloc(ns, sizeof *V.map);
    V.pc = calloc((size_t)V.P, sizeof *V.pc);
    cpc_status *st = NULL;
    if (!V.ro || !V.slots || !V.map || !V.pc) {
        st = &cpc_status_oom;
        goto done;
    }
    for (int p = 0; p < V.P && !st; p++) {
        cpc_coords c = cpc_program_coords(prog, p);
        for (int b = 0; b < V.nb; b++) {
            const cpc_buffer *B = &prog->buffers[b];
            slot *sl = &V.slots[p * V.nb + b];
            V.map[p * V.nb + b] = p * V.nb + b;
            sl->tag = B->tokens == CPC_TOK_SHARD ? p : B->tokens == CPC_TOK_BLOCK ? (int)c.r : CPC_TAG_NONE;
            sl->written = B->io == CPC_IO_INPUT;
            if (B->heads != CPC_HEADS_ALL) {
                st = vfail(p, NULL, "buffer '%s' holds a head part: outside the backward prover's class", B->name);
                break;
            }
            if (is_grad(B->role) && !(sl->cnt = calloc((size_t)V.npairs, sizeof(int)))) {
                st = &cpc_status_oom;
                break;
            }
        }
        if (!st)
            st = cpc_program_walk(prog, p, collect, &V.ro[p]);
    }
    if (st)
        goto done;
    /* Round-robin until every rank ends; a round without progress is a deadlock. */
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
        if (!moved) {
            for (int p = 0; p < V.P; p++)
                if (V.pc[p] < V.ro[p].n) {
                    st = vfail(p, &V.ro[p].v[V.pc[p]], "waits forever: no rank sends what this recv expects (peer %lld, tag %d)",
                               (long long)V.ro[p].v[V.pc[p]].peer, V.ro[p].v[V.pc[p]].op->tag);
                    break;
                }
            goto done;
        }
    }
    if (V.head) {
        st = vfail(V.head->src, NULL, "a message to rank %d (tag %d) is never received", V.head->dst, V.head->tag);
        goto done;
    }
    for (int p = 0; p < V.P && !st; p++)
        st = final_checks(&V, p);
done:
    while (V.head) {
        msg *m = V.head;
        V.head = m->next;
        for (int i = 0; i < m->n; i++)
            free(m->part[i].cnt);
        free(m);
    }
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
