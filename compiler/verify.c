/*
 * verify.c - the schedule verifier (verify.h): the driver (symbolic proof
 * of verify_sym.c first, then enumeration, else refusal) and the
 * enumeration: an abstract interpretation of the op program on every rank,
 * with blocking semantics.
 *
 * Structure of the enumeration:
 *   - a tree of `opnode`s mirrors the program's ops with their index paths
 *     ("ops[3].body[1]") for diagnostics;
 *   - every simulated rank is a coroutine (`rank_st`): a stack of loop
 *     frames, the abstract content of each buffer (`aval`), its in-flight
 *     requests;
 *   - point-to-point requests are matched in FIFO order per channel
 *     (sender, receiver, group, tag); a collective completes when every
 *     member of its group instance has arrived;
 *   - a worklist runs ready ranks until they block; when it is empty and
 *     some rank is not finished, the wait-for graph is walked to report the
 *     cycle.
 */
#include "verify.h"
#include "verify_common.h"
#include "verify_sym.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 8        /* loop nesting accepted (as cpc_program_walk) */
#define TOK_KV (-1)        /* tokens: the cross-attention K/V sequence, or the replicated
                              segments' rows (layout.h) */
#define TOK_UNSET (-2)     /* tokens: accumulator not merged into yet */


enum { ST_RUN = 0, ST_WAIT, ST_COLL, ST_DONE };

/* ---- abstract values ------------------------------------------------------ */

typedef vc_node opnode;

typedef struct aval {
    union {
        vc_val h; /* the fields every domain shares (verify_common.h) */
        struct {
            VC_VAL_FIELDS;
        };
    };
    int32_t tlo, thi; /* shard units [tlo, thi), or TOK_KV / TOK_UNSET */
    int32_t hoff, hn; /* heads (query-head space for q/o/lse, K/V-head space for k/v) */
    int32_t ncov, capcov;
    int32_t *cov;     /* merged key units: ncov sorted disjoint [lo, hi) pairs */
    const opnode *wop; /* last writer */
    int64_t wstep;
} aval;

static void aval_free(aval *v)
{
    free(v->cov);
    memset(v, 0, sizeof *v);
}

static bool aval_copy(aval *dst, const aval *src)
{
    int32_t *cov = NULL;
    if (src->ncov > 0) {
        cov = malloc(sizeof(int32_t) * 2 * (size_t)src->ncov);
        if (!cov)
            return false;
        memcpy(cov, src->cov, sizeof(int32_t) * 2 * (size_t)src->ncov);
    }
    free(dst->cov);
    *dst = *src;
    dst->cov = cov;
    dst->capcov = src->ncov;
    return true;
}

/* ---- requests and channels ------------------------------------------------ */

#define RQ(C, id) ((req *)VC_POOL_AT(&(C)->reqs, (id)))

typedef struct req {
    union {
        vc_rq h; /* the fields every domain shares (verify_common.h); peer: the flat rank */
        struct {
            VC_RQ_FIELDS;
        };
    };
    int rank;                /* the poster (flat) */
    aval snap[CPC_OP_MAX_BUFS]; /* send: sender's content; recv: what arrives */
    int64_t block;           /* recv: declared block, -1 when none */
} req;

typedef struct chan {
    int src, dst, group, tag;
    int sh, st;              /* unmatched sends: head, tail (-1 = empty) */
    int rh, rt;              /* unmatched recvs */
    bool used;
} chan;

typedef struct frame {
    const opnode *ops;
    int n, i;
    int64_t s, count;
} frame;

typedef struct rank_st {
    int p;
    cpc_coords c;
    frame fr[MAX_DEPTH + 1];
    int depth;
    aval *v;                 /* per buffer */
    int32_t *nsend;          /* per buffer: sends in flight reading it */
    int32_t *rpend;          /* per buffer: recv in flight writing it, -1 */
    vc_open open;            /* requests not completed yet */
    int state;
    bool queued;
    int wait_tag;            /* ST_WAIT */
    const opnode *bnode;     /* ST_WAIT / ST_COLL: the op it is blocked at */
    int64_t bstep;
    int cgroup, cinst;       /* ST_COLL: group kind and instance */
    int32_t next_stamp;
} rank_st;

/* The domain of the step (verify_common.h) on one concrete rank: every
 * answer is YES or NO.  One for the enumeration, moved from rank to rank
 * (at). */
typedef struct rank_dom {
    struct ctx *C;
    rank_st *rk;
    const opnode *nd; /* the op being run (writer of what it stores; where a fault is) */
    int64_t step;
    char ob[256];
} rank_dom;

typedef struct ctx {
    const cpc_program *prog;
    const cpc_layout *L;
    int R, U, P;
    opnode *root;
    int n_root;
    rank_st *rk;             /* every rank is simulated: rank p is rk[p] */
    /* worklist */
    int *queue;
    int qh, qn;
    /* requests */
    vc_pool reqs;            /* of req */
    /* channels: open addressing */
    chan *ch;
    int capch, nch;
    /* collectives: per group kind, per instance, arrivals */
    int *arrived[CPC_GROUP__COUNT];
    /* results */
    cpc_status *err;
    bool oom;
    int64_t instances, cap_instances;
    bool capped;
    cpc_verify_stats st;
    aval tmp[CPC_OP_MAX_BUFS]; /* the step's scratch values */
    rank_dom d;              /* the domain (at) and the step's message */
    vc_domain dom;
    char m[1024];
} ctx;

/* ---- diagnostics ------------------------------------------------------------ */

static cpc_span op_span(const opnode *nd)
{
    return nd && nd->op ? nd->op->span : CPC_NO_SPAN;
}

/* "ops[3].body[1] merge (step 2)" into buf. */
#define op_desc(nd, step, buf, n) vc_op_desc((nd), (step), (step) + 1, (buf), (n))

static const char *rank_desc(const ctx *C, int p, char *buf, size_t n)
{
    snprintf(buf, n, "rank %d (r %d, u %d)", p, p / C->U, p % C->U);
    return buf;
}

__attribute__((format(printf, 5, 6)))
static int fail(ctx *C, int p, const opnode *nd, int64_t step, const char *fmt, ...)
{
    if (C->err)
        return -1;
    char ob[256];
    va_list ap;
    va_start(ap, fmt);
    C->err = vc_fault(op_span(nd), false, p, C->U, p >= 0 || nd ? op_desc(nd, step, ob, sizeof ob) : NULL, fmt, ap);
    va_end(ap);
    return -1;
}

__attribute__((format(printf, 5, 6)))
static void note(ctx *C, int p, const opnode *nd, int64_t step, const char *fmt, ...)
{
    if (!C->err || C->err == &cpc_status_oom)
        return;
    char msg[1024], rb[64], ob[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p >= 0)
        cpc_status_add_note(C->err, op_span(nd), "%s, %s: %s", rank_desc(C, p, rb, sizeof rb),
                            op_desc(nd, step, ob, sizeof ob), msg);
    else
        cpc_status_add_note(C->err, op_span(nd), "%s", msg);
}

static int oom(ctx *C)
{
    C->oom = true;
    return -1;
}

/* ---- layout helpers ----------------------------------------------------------- */

static bool is_kv_role(cpc_buf_role r)
{
    return r == CPC_ROLE_K || r == CPC_ROLE_V;
}

/* Total heads of the head space data of `src` lives in. */
static int heads_total(const ctx *C, int src)
{
    return src_is_kv(src) ? C->L->Hkv : C->L->H;
}

/* Head part of ulysses member u for data of `src`. */
static void part_heads(const ctx *C, int src, int u, int *off, int *n)
{
    if (src_is_kv(src))
        cpc_layout_kv_heads(C->L, u, off, n);
    else
        cpc_layout_q_heads(C->L, u, off, n);
}

static const char *buf_name(const ctx *C, int b)
{
    return C->prog->buffers[b].name;
}

/* Words for a token range. */
static const char *tok_desc(const ctx *C, int lo, int hi, char *buf, size_t n)
{
    if (lo == TOK_KV && C->L->rep)
        snprintf(buf, n, "the replicated segments (%" PRId64 " tokens)", C->L->Srep);
    else if (lo == TOK_KV)
        snprintf(buf, n, "the cross-attention K/V sequence (%" PRId64 " tokens)", C->L->Skv);
    else if (lo == TOK_UNSET)
        snprintf(buf, n, "no tokens yet");
    else if (lo == 0 && hi == C->P && C->P > 1)
        snprintf(buf, n, "all %" PRId64 " tokens (every ring block)", C->L->S);
    else if (hi - lo == 1) {
        cpc_run run[2];
        int nr = cpc_layout_shard_runs(C->L, lo, run, 2);
        char blk[32] = "";
        if (C->U == 1)
            snprintf(blk, sizeof blk, "ring block %d = ", lo);
        if (nr >= 1)
            snprintf(buf, n, "%sshard %d (tokens [%" PRId64 ", %" PRId64 ")%s)", blk, lo, run[0].start,
                     run[0].start + run[0].len, nr > 1 ? " and more" : "");
        else
            snprintf(buf, n, "%sshard %d (empty)", blk, lo);
    } else if (hi - lo == C->U && lo % C->U == 0)
        snprintf(buf, n, "ring block %d (shards %d..%d, %" PRId64 " tokens)", lo / C->U, lo, hi - 1,
                 cpc_layout_block_tokens(C->L, lo / C->U));
    else
        snprintf(buf, n, "shards %d..%d", lo, hi - 1);
    return buf;
}

static const char *heads_desc(int off, int n, char *buf, size_t sz)
{
    snprintf(buf, sz, "heads [%d, %d)", off, off + n);
    return buf;
}

/* Heads buffer b holds on the rank with ulysses index u. */
static void buf_heads(const ctx *C, int b, int u, int *off, int *n)
{
    cpc_buffer_heads(C->prog, b, u, off, n);
}

/* Why value v cannot live in buffer b on rank rk (NULL when it can). */
static const char *misfit(const ctx *C, const rank_st *rk, int b, const aval *v, char *buf, size_t n)
{
    const cpc_buffer *B = &C->prog->buffers[b];
    char t1[160], h1[48], h2[48];
    if (v->tlo != TOK_UNSET) {
        bool ok;
        switch (B->tokens) {
        case CPC_TOK_SHARD: ok = v->tlo == rk->p && v->thi == rk->p + 1; break;
        case CPC_TOK_BLOCK: ok = v->tlo >= 0 && v->thi - v->tlo == C->U && v->tlo % C->U == 0; break;
        case CPC_TOK_ALL: ok = v->tlo == 0 && v->thi == C->P; break;
        case CPC_TOK_KV: ok = v->tlo == TOK_KV; break;
        default: ok = false;
        }
        if (!ok) {
            snprintf(buf, n, "buffer %s (tokens %s) cannot hold %s", B->name, cpc_buf_tokens_name(B->tokens),
                     tok_desc(C, v->tlo, v->thi, t1, sizeof t1));
            return buf;
        }
    }
    int off, hn;
    buf_heads(C, b, (int)rk->c.u, &off, &hn);
    if (off != v->hoff || hn != v->hn) {
        snprintf(buf, n, "buffer %s holds %s here, but the data has %s", B->name,
                 heads_desc(off, hn, h1, sizeof h1), heads_desc(v->hoff, v->hn, h2, sizeof h2));
        return buf;
    }
    return NULL;
}

/* ---- coverage -------------------------------------------------------------------- */

/* dst->cov := dst->cov U add->cov; returns the first overlapping unit, -1
 * when disjoint, -2 on OOM. */
static int cov_union(aval *dst, const aval *add)
{
    int n = dst->ncov + add->ncov;
    if (n == 0)
        return -1;
    int32_t *out = malloc(sizeof(int32_t) * 2 * (size_t)n);
    if (!out)
        return -2;
    int i = 0, j = 0, k = 0, overlap = -1;
    while (i < dst->ncov || j < add->ncov) {
        int32_t lo, hi;
        if (j >= add->ncov || (i < dst->ncov && dst->cov[2 * i] <= add->cov[2 * j])) {
            lo = dst->cov[2 * i];
            hi = dst->cov[2 * i + 1];
            i++;
        } else {
            lo = add->cov[2 * j];
            hi = add->cov[2 * j + 1];
            j++;
        }
        if (k > 0 && lo < out[2 * (k - 1) + 1]) {
            if (overlap < 0)
                overlap = lo;
            if (hi > out[2 * (k - 1) + 1])
                out[2 * (k - 1) + 1] = hi;
        } else if (k > 0 && lo == out[2 * (k - 1) + 1]) {
            out[2 * (k - 1) + 1] = hi;
        } else {
            out[2 * k] = lo;
            out[2 * k + 1] = hi;
            k++;
        }
    }
    free(dst->cov);
    dst->cov = out;
    dst->ncov = k;
    dst->capcov = n;
    return overlap;
}

/* The block part of coverage (the step's vc_complete ran the rest): v's
 * keys are every unit its query rows need.  Reports the fault itself (with a
 * note on the missing shard's block). */
static vc_tri covered_at(ctx *C, rank_st *rk, const opnode *nd, int64_t step, const aval *v, const char *bname)
{
    char t1[160], t2[160], h1[48];
    /* Required units (vc_units_needed): all, or with a causal mask a prefix. */
    int need = vc_units_needed(C->L, v->tlo, v->thi);
    int missing = -1; /* the first unit not covered */
    if (v->ncov == 0 || v->cov[0] > 0)
        missing = 0;
    else if (v->cov[1] < need)
        missing = v->cov[1];
    if (missing < 0 || missing >= need)
        return VC_YES;
    int nmiss = 0, prev = 0; /* every missing unit below need */
    for (int i = 0; i < v->ncov && prev < need; i++) {
        int a = v->cov[2 * i];
        nmiss += (a < need ? a : need) - prev;
        prev = v->cov[2 * i + 1];
    }
    if (prev < need)
        nmiss += need - prev;
    fail(C, rk->p, nd, step,
         "%s is incomplete: query rows of %s (%s) never met the keys/values of %s; %d of %d "
         "shards of keys %s missing (a ring step dropped or a block skipped?)",
         bname, tok_desc(C, v->tlo, v->thi, t1, sizeof t1), heads_desc(v->hoff, v->hn, h1, sizeof h1),
         tok_desc(C, missing, missing + 1, t2, sizeof t2), nmiss, need, nmiss == 1 ? "is" : "are");
    if (C->err && C->U > 1)
        note(C, -1, NULL, 0, "the missing shard %d belongs to ring block %d", missing, missing / C->U);
    return VC_NO;
}

/* ---- buffer access ----------------------------------------------------------------- */

static int eval(ctx *C, rank_st *rk, const opnode *nd, int64_t step, const cpc_expr *e, const char *what,
                int64_t *out);


#define RD(self) ((rank_dom *)(self))
#define AV(v) ((aval *)(v))
#define CAV(v) ((const aval *)(v))

static const char *dom_name(void *self, int b) { return buf_name(RD(self)->C, b); }

static vc_rq *dom_rq(void *self, int id) { return VC_POOL_AT(&RD(self)->C->reqs, id); }

static int dom_open(void *self, int i) { return i < RD(self)->rk->open.n ? RD(self)->rk->open.v[i] : -1; }

static void dom_at(void *self, const vc_rq *q) { RD(self)->nd = q->on, RD(self)->step = q->slo; }

static void dom_at_writer(void *self, int b)
{
    const aval *v = &RD(self)->rk->v[b];
    RD(self)->nd = v->written ? v->wop : NULL, RD(self)->step = v->wstep;
}

static void dom_deliver(void *self, vc_val *dst, vc_val *src, const vc_rq *s)
{
    (void)self, (void)s;
    aval_free(AV(dst));
    *AV(dst) = *AV(src); /* move */
    memset(src, 0, sizeof(aval));
}

static const char *dom_writer(void *self, int b)
{
    rank_dom *d = self;
    const aval *v = &d->rk->v[b];
    return op_desc(v->wop, v->wstep, d->ob, sizeof d->ob);
}

static vc_val *dom_val(void *self, int b) { return &RD(self)->rk->v[b].h; }

static vc_val *dom_tmp(void *self, int j)
{
    aval *v = &RD(self)->C->tmp[j];
    aval_free(v);
    return &v->h;
}

static bool dom_copy(void *self, vc_val *dst, const vc_val *src)
{
    (void)self;
    return aval_copy(AV(dst), CAV(src));
}

static vc_tri dom_fits(void *self, int b, const vc_val *v, char *why, size_t n)
{
    return misfit(RD(self)->C, RD(self)->rk, b, CAV(v), why, n) ? VC_NO : VC_YES;
}

static void dom_put(void *self, int b, vc_val *v)
{
    rank_dom *d = self;
    aval *a = AV(v);
    a->wop = d->nd;
    a->wstep = d->step;
    if (a == &d->rk->v[b])
        return;
    aval_free(&d->rk->v[b]);
    d->rk->v[b] = *a;
    memset(a, 0, sizeof *a);
}

static void dom_exchange(void *self, int a, int b)
{
    aval *v = RD(self)->rk->v, t = v[a];
    v[a] = v[b];
    v[b] = t;
}

static int32_t dom_new_stamp(void *self) { return RD(self)->rk->next_stamp++; }

/* Units of token class tok on rank rk. */
static void tok_units(const ctx *C, const rank_st *rk, int tok, int32_t *lo, int32_t *hi)
{
    switch (tok) {
    case VC_T_OWN: *lo = rk->p; *hi = rk->p + 1; break;
    case VC_T_BLOCK: *lo = (int32_t)rk->c.r * C->U; *hi = *lo + C->U; break;
    case VC_T_ALL: *lo = 0; *hi = C->P; break;
    case VC_T_KV: *lo = *hi = TOK_KV; break;
    default: *lo = *hi = TOK_UNSET; break;
    }
}

/* Heads of class h (VC_H_ALL / VC_H_PART) of data src on rank rk. */
static void head_range(const ctx *C, const rank_st *rk, int src, int h, int *off, int *n)
{
    if (h == VC_H_PART) {
        part_heads(C, src, (int)rk->c.u, off, n);
    } else {
        *off = 0;
        *n = heads_total(C, src);
    }
}

static void dom_shape(void *self, vc_val *v, int tok, int heads, int b, const vc_val *like)
{
    rank_dom *d = self;
    aval *a = AV(v);
    tok_units(d->C, d->rk, tok, &a->tlo, &a->thi);
    if (heads == VC_H_BUF)
        buf_heads(d->C, b, (int)d->rk->c.u, &a->hoff, &a->hn);
    else if (heads == VC_H_LIKE)
        a->hoff = CAV(like)->hoff, a->hn = CAV(like)->hn;
    else
        head_range(d->C, d->rk, a->src, heads, &a->hoff, &a->hn);
}

static vc_tri dom_tok_is(void *self, const vc_val *v, int tok)
{
    int32_t lo, hi;
    tok_units(RD(self)->C, RD(self)->rk, tok, &lo, &hi);
    return CAV(v)->tlo == lo && (lo < 0 || CAV(v)->thi == hi) ? VC_YES : VC_NO;
}

static vc_tri dom_heads_are(void *self, const vc_val *v, int h)
{
    int off, n;
    head_range(RD(self)->C, RD(self)->rk, v->src, h, &off, &n);
    return CAV(v)->hoff == off && CAV(v)->hn == n ? VC_YES : VC_NO;
}

static vc_tri dom_same_tokens(void *self, const vc_val *x, const vc_val *y)
{
    (void)self;
    return CAV(x)->tlo == CAV(y)->tlo && CAV(x)->thi == CAV(y)->thi ? VC_YES : VC_NO;
}

static vc_tri dom_same_heads(void *self, const vc_val *x, const vc_val *y)
{
    (void)self;
    return CAV(x)->hoff == CAV(y)->hoff && CAV(x)->hn == CAV(y)->hn ? VC_YES : VC_NO;
}

static const char *dom_words(void *self, const vc_val *v, char *buf, size_t n)
{
    char t[160], h[48];
    snprintf(buf, n, "%s, %s", tok_desc(RD(self)->C, CAV(v)->tlo, CAV(v)->thi, t, sizeof t),
             heads_desc(CAV(v)->hoff, CAV(v)->hn, h, sizeof h));
    return buf;
}

static bool dom_has_keys(void *self, const vc_val *v)
{
    (void)self;
    return CAV(v)->ncov > 0;
}

static vc_tri dom_attn_keys(void *self, const cpc_op *op, const vc_val *q, const vc_val *k, vc_val *o, char *why,
                            size_t n)
{
    rank_dom *d = self;
    ctx *C = d->C;
    const aval *Q = CAV(q), *K = CAV(k);
    char t1[160], h1[48], h2[48];
    int klo = K->tlo, khi = K->thi;
    if (op->block && C->prog->buffers[op->in[1]].tokens == CPC_TOK_ALL) {
        int64_t blk;
        if (eval(C, d->rk, d->nd, d->step, op->block, "block", &blk))
            return VC_NO;
        if (blk < 0 || blk >= C->R)
            return snprintf(why, n, "block %" PRId64 " (`%s`) is not a ring block (0..%d)", blk,
                            cpc_expr_text(op->block), C->R - 1), VC_NO;
        if (klo != 0 || khi != C->P)
            return snprintf(why, n, "reads ring block %" PRId64 " of %s, which holds %s", blk, buf_name(C, op->in[1]),
                            tok_desc(C, klo, khi, t1, sizeof t1)), VC_NO;
        klo = (int)blk * C->U;
        khi = klo + C->U;
    }
    /* GQA: query head h uses K/V head h / group. */
    int g = C->L->group;
    int need_lo = Q->hoff / g, need_hi = Q->hn > 0 ? (Q->hoff + Q->hn - 1) / g + 1 : need_lo;
    if (need_lo < K->hoff || need_hi > K->hoff + K->hn)
        return snprintf(why, n, "query %s need K/V heads [%d, %d), but %s holds K/V %s",
                        heads_desc(Q->hoff, Q->hn, h1, sizeof h1), need_lo, need_hi, buf_name(C, op->in[1]),
                        heads_desc(K->hoff, K->hn, h2, sizeof h2)), VC_NO;
    aval *a = AV(o);
    a->tlo = Q->tlo;
    a->thi = Q->thi;
    a->hoff = Q->hoff;
    a->hn = Q->hn;
    if (klo == TOK_KV) {
        a->kvcov = 1;
        return VC_YES;
    }
    a->cov = malloc(2 * sizeof(int32_t));
    if (!a->cov)
        return VC_OOM;
    a->cov[0] = klo;
    a->cov[1] = khi;
    a->ncov = a->capcov = 1;
    return VC_YES;
}

static vc_tri dom_merge_keys(void *self, vc_val *acc, const vc_val *av, char *why, size_t n)
{
    ctx *C = RD(self)->C;
    aval *Acc = AV(acc);
    const aval *A = CAV(av);
    char t1[160];
    int ov = cov_union(Acc, A);
    if (ov == -2)
        return VC_OOM;
    if (ov >= 0)
        return snprintf(why, n, "the keys/values of %s", tok_desc(C, ov, ov + 1, t1, sizeof t1)), VC_NO;
    Acc->tlo = A->tlo;
    Acc->thi = A->thi;
    return VC_YES;
}

static vc_tri dom_select_heads(void *self, vc_val *v, int bo, int bi, char *why, size_t n)
{
    rank_dom *d = self;
    aval *a = AV(v);
    char h1[48], h2[48];
    int off, hn;
    buf_heads(d->C, bo, (int)d->rk->c.u, &off, &hn);
    if (off == a->hoff && hn == a->hn)
        return VC_YES;
    if (off < a->hoff || off + hn > a->hoff + a->hn)
        return snprintf(why, n, "cannot select %s of %s from %s, which holds %s", heads_desc(off, hn, h1, sizeof h1),
                        buf_name(d->C, bo), buf_name(d->C, bi), heads_desc(a->hoff, a->hn, h2, sizeof h2)), VC_NO;
    a->hoff = off;
    a->hn = hn;
    return VC_YES;
}

static vc_tri dom_covered(void *self, const vc_val *v, const char *name, char *why, size_t n)
{
    rank_dom *d = self;
    (void)why, (void)n;
    return covered_at(d->C, d->rk, d->nd, d->step, CAV(v), name);
}

static vc_tri dom_declared(void *self, vc_val *v, const void *rq, char *words, size_t n)
{
    const req *r = rq;
    int U = RD(self)->C->U;
    if (r->block < 0 || (CAV(v)->tlo == (int)r->block * U && CAV(v)->thi == (int)r->block * U + U))
        return VC_YES;
    snprintf(words, n, "ring block %" PRId64, r->block);
    return VC_NO;
}

static void dom_sender(void *self, const void *rq, char *who, size_t nw, char *op, size_t no)
{
    ctx *C = RD(self)->C;
    const req *s = RQ(C, ((const req *)rq)->match);
    snprintf(who, nw, "rank %d", s->rank);
    op_desc(s->on, s->slo, op, no);
}

static vc_tri dom_post(void *self, const cpc_op *op);
static vc_tri dom_meet(void *self, const cpc_op *op);

static const vc_domain rank_ops = {
    .name = dom_name, .rq = dom_rq, .open = dom_open, .at = dom_at, .at_writer = dom_at_writer, .post = dom_post, .meet = dom_meet,
    .deliver = dom_deliver, .snap_off = offsetof(req, snap),
    .writer = dom_writer, .val = dom_val, .tmp = dom_tmp, .copy = dom_copy, .fits = dom_fits, .put = dom_put,
    .exchange = dom_exchange, .new_stamp = dom_new_stamp, .shape = dom_shape, .tok_is = dom_tok_is,
    .heads_are = dom_heads_are, .same_tokens = dom_same_tokens, .same_heads = dom_same_heads, .words = dom_words,
    .has_keys = dom_has_keys, .attn_keys = dom_attn_keys, .merge_keys = dom_merge_keys,
    .select_heads = dom_select_heads, .covered = dom_covered, .declared = dom_declared,
    .sender = dom_sender, .p2p_attn = true, .val_size = sizeof(aval)};

/* The domain of rank rk standing at the op nd (step), the message emptied. */
static const vc_domain *at(ctx *C, rank_st *rk, const opnode *nd, int64_t step)
{
    C->d.rk = rk, C->d.nd = nd, C->d.step = step, C->m[0] = 0;
    C->dom.nsend = rk->nsend, C->dom.rpend = rk->rpend;
    return &C->dom;
}

#define MSG(C) (C)->m, sizeof (C)->m

/* A step's answer as the result of the rank the domain stands on: a fault
 * (the domain always decides) where it stands. */
static int res(ctx *C, vc_tri t)
{
    if (t == VC_YES)
        return 0;
    if (t == VC_OOM)
        return oom(C);
    return fail(C, C->d.rk->p, C->d.nd, C->d.step, "%s", C->m[0] ? C->m : "fault (no message)");
}

/* ---- requests ------------------------------------------------------------------------ */

static void req_release(vc_rq *q)
{
    for (int j = 0; j < CPC_OP_MAX_BUFS; j++)
        aval_free(&((req *)q)->snap[j]);
}

static uint64_t chan_hash(int src, int dst, int group, int tag)
{
    uint64_t h = (uint64_t)(uint32_t)src * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uint32_t)dst * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
    h ^= (uint64_t)(uint32_t)group * 0x165667B19E3779F9ull + (h << 6) + (h >> 2);
    h ^= (uint64_t)(uint32_t)tag * 0x27D4EB2F165667C5ull + (h << 6) + (h >> 2);
    return h;
}

static chan *chan_get(ctx *C, int src, int dst, int group, int tag)
{
    if (2 * (C->nch + 1) > C->capch) {
        int cap = C->capch ? 2 * C->capch : 256;
        chan *n = calloc((size_t)cap, sizeof(chan));
        if (!n)
            return NULL;
        for (int i = 0; i < C->capch; i++) {
            if (!C->ch[i].used)
                continue;
            const chan *o = &C->ch[i];
            size_t k = chan_hash(o->src, o->dst, o->group, o->tag) & (size_t)(cap - 1);
            while (n[k].used)
                k = (k + 1) & (size_t)(cap - 1);
            n[k] = *o;
        }
        free(C->ch);
        C->ch = n;
        C->capch = cap;
    }
    size_t k = chan_hash(src, dst, group, tag) & (size_t)(C->capch - 1);
    while (C->ch[k].used) {
        chan *c = &C->ch[k];
        if (c->src == src && c->dst == dst && c->group == group && c->tag == tag)
            return c;
        k = (k + 1) & (size_t)(C->capch - 1);
    }
    chan *c = &C->ch[k];
    c->used = true;
    c->src = src;
    c->dst = dst;
    c->group = group;
    c->tag = tag;
    c->sh = c->st = c->rh = c->rt = -1;
    C->nch++;
    return c;
}

static void enqueue(ctx *C, int p)
{
    rank_st *rk = &C->rk[p];
    if (rk->queued || rk->state == ST_DONE)
        return;
    rk->queued = true;
    C->queue[(C->qh + C->qn) % C->P] = p;
    C->qn++;
}

/* Checks a matched pair and prepares what the recv delivers. */
static int match_pair(ctx *C, int sid, int rid)
{
    const req *r = RQ(C, rid);
    C->st.messages++;
    return res(C, vc_match(at(C, &C->rk[r->rank], r->on, r->slo), sid, rid, MSG(C)));
}

/* Posts request id: matches it against its channel. */
static int post(ctx *C, int id)
{
    req *q = RQ(C, id);
    int src = q->is_send ? q->rank : q->peer, dst = q->is_send ? q->peer : q->rank;
    chan *c = chan_get(C, src, dst, q->group, q->tag);
    if (!c)
        return oom(C);
    /* the channel's first unmatched request of the other kind, else this one waits in its queue */
    int other = q->is_send ? vc_queue_pop(&C->reqs, &c->rh, &c->rt) : vc_queue_pop(&C->reqs, &c->sh, &c->st);
    if (other < 0) {
        if (q->is_send)
            vc_queue_push(&C->reqs, &c->sh, &c->st, id);
        else
            vc_queue_push(&C->reqs, &c->rh, &c->rt, id);
        return 0;
    }
    if (q->is_send ? match_pair(C, id, other) : match_pair(C, other, id))
        return -1;
    enqueue(C, RQ(C, other)->rank);
    return 0;
}

/* Flat rank of index `idx` of group g of rank rk; -1 if out of range. */
static int group_member(const ctx *C, const rank_st *rk, int g, int64_t idx)
{
    switch (g) {
    case CPC_GROUP_RING:
        return idx >= 0 && idx < C->R ? (int)idx * C->U + (int)rk->c.u : -1;
    case CPC_GROUP_ULYSSES:
        return idx >= 0 && idx < C->U ? (int)rk->c.r * C->U + (int)idx : -1;
    case CPC_GROUP_WORLD:
        return idx >= 0 && idx < C->P ? (int)idx : -1;
    default:
        return -1;
    }
}

static int group_size(const ctx *C, int g)
{
    return g == CPC_GROUP_RING ? C->R : g == CPC_GROUP_ULYSSES ? C->U : C->P;
}

static int group_inst(const rank_st *rk, int g)
{
    return g == CPC_GROUP_RING ? (int)rk->c.u : g == CPC_GROUP_ULYSSES ? (int)rk->c.r : 0;
}

/* Flat rank of member m of instance inst of group g. */
static int inst_member(const ctx *C, int g, int inst, int m)
{
    return g == CPC_GROUP_RING ? m * C->U + inst : g == CPC_GROUP_ULYSSES ? inst * C->U + m : m;
}

static int eval(ctx *C, rank_st *rk, const opnode *nd, int64_t step, const cpc_expr *e, const char *what,
                int64_t *out)
{
    cpc_coords c = rk->c;
    c.s = step;
    cpc_status *st = cpc_expr_eval(e, &c, out);
    if (st) {
        fail(C, rk->p, nd, step, "cannot evaluate %s `%s`: %s", what, cpc_expr_text(e), st->message);
        cpc_status_free(st);
        return -1;
    }
    return 0;
}

/* ---- ops ------------------------------------------------------------------------------- */

enum { RES_NEXT = 0, RES_BLOCK, RES_PUSHED, RES_ERR };

/* A send/recv on the rank the domain stands at: its peer and declared block
 * evaluated, posted, matched on its channel. */
static vc_tri dom_post(void *self, const cpc_op *op)
{
    ctx *C = RD(self)->C;
    rank_st *rk = RD(self)->rk;
    const opnode *nd = RD(self)->nd;
    int64_t step = RD(self)->step, idx, block = -1;
    if (eval(C, rk, nd, step, op->peer, "peer", &idx))
        return VC_NO;
    int peer = group_member(C, rk, op->group, idx);
    if (peer < 0)
        return fail(C, rk->p, nd, step, "peer %" PRId64 " (`%s`) is outside the %s group (size %d)", idx,
                    cpc_expr_text(op->peer), cpc_group_name(op->group), group_size(C, op->group)), VC_NO;
    if (op->kind == CPC_OP_RECV && op->block) {
        if (eval(C, rk, nd, step, op->block, "block", &block))
            return VC_NO;
        if (block < 0 || block >= C->R)
            return fail(C, rk->p, nd, step, "block %" PRId64 " (`%s`) is not a ring block (0..%d)", block,
                        cpc_expr_text(op->block), C->R - 1), VC_NO;
    }
    int id = vc_pool_new(&C->reqs, &rk->open);
    if (id < 0)
        return VC_OOM;
    req *q = RQ(C, id);
    q->rank = rk->p;
    q->peer = peer;
    q->on = nd;
    q->slo = step;
    q->shi = step + 1;
    q->block = block;
    if (!vc_post(&C->dom, op, id))
        return VC_OOM;
    return post(C, id) ? VC_NO : VC_YES;
}

/* ---- collectives -------------------------------------------------------------------- */

/* Signature text of a rank's collective (for mismatch messages). */
static void coll_sig(const ctx *C, const rank_st *rk, char *buf, size_t n)
{
    const cpc_op *op = rk->bnode->op;
    int k = snprintf(buf, n, "%s", cpc_op_kind_name(op->kind));
    if (op->kind == CPC_OP_ALL_TO_ALL)
        k += snprintf(buf + k, n - (size_t)k, " %s", cpc_a2a_dir_name(op->dir));
    for (int j = 0; j < op->n_in && (size_t)k < n; j++)
        k += snprintf(buf + k, n - (size_t)k, "%s%s data of %s", j ? ", " : " of ", src_names_of(rk->v[op->in[j]].src),
                      buf_name(C, op->in[j]));
}

static bool coll_same(const ctx *C, const rank_st *a, const rank_st *b)
{
    const cpc_op *x = a->bnode->op, *y = b->bnode->op;
    if (x->kind != y->kind || x->group != y->group || x->n_in != y->n_in)
        return false;
    if (x->kind == CPC_OP_ALL_TO_ALL && x->dir != y->dir)
        return false;
    for (int j = 0; j < x->n_in; j++) {
        if (a->v[x->in[j]].src != b->v[y->in[j]].src)
            return false;
        if (cpc_buffer_elem_size(C->prog, x->in[j]) != cpc_buffer_elem_size(C->prog, y->in[j]))
            return false;
        if (cpc_buffer_elem_size(C->prog, x->out[j]) != cpc_buffer_elem_size(C->prog, y->out[j]))
            return false;
    }
    return true;
}

/* Runs a complete collective: members[0..n) are simulated ranks indices. */
static int run_collective(ctx *C, int *members, int n)
{
    rank_st *first = &C->rk[members[0]];
    char s1[256], s2[256], ob[256], h1[48], h2[48];
    for (int m = 1; m < n; m++) {
        rank_st *rk = &C->rk[members[m]];
        if (!coll_same(C, first, rk)) {
            coll_sig(C, rk, s1, sizeof s1);
            coll_sig(C, first, s2, sizeof s2);
            fail(C, rk->p, rk->bnode, rk->bstep,
                 "collective mismatch in the %s group: this rank is at %s while rank %d is at %s (%s)",
                 cpc_group_name(rk->bnode->op->group), s1, first->p, s2,
                 op_desc(first->bnode, first->bstep, ob, sizeof ob));
            return -1;
        }
    }
    const cpc_op *op0 = first->bnode->op;
    C->st.collectives++;
    if (op0->kind == CPC_OP_BARRIER)
        goto advance;
    for (int m = 0; m < n; m++) {
        rank_st *rk = &C->rk[members[m]];
        const cpc_op *op = rk->bnode->op;
        if (res(C, vc_coll_inputs(at(C, rk, rk->bnode, rk->bstep), op, MSG(C))))
            return -1;
        /* all_gather concatenates blocks: the heads of its members agree */
        for (int j = 0; op->kind == CPC_OP_ALL_GATHER && j < op->n_in; j++) {
            const aval *in = &rk->v[op->in[j]], *f0 = &first->v[first->bnode->op->in[j]];
            if (in->hoff != f0->hoff || in->hn != f0->hn)
                return fail(C, rk->p, rk->bnode, rk->bstep, "all_gather: %s holds %s, rank %d's %s",
                            buf_name(C, op->in[j]), heads_desc(in->hoff, in->hn, h1, sizeof h1), first->p,
                            heads_desc(f0->hoff, f0->hn, h2, sizeof h2));
        }
    }
    for (int m = 0; m < n; m++) {
        rank_st *rk = &C->rk[members[m]];
        if (res(C, vc_coll_outputs(at(C, rk, rk->bnode, rk->bstep), rk->bnode->op, MSG(C))))
            return -1;
    }
advance:
    for (int m = 0; m < n; m++) {
        rank_st *rk = &C->rk[members[m]];
        rk->state = ST_RUN;
        rk->fr[rk->depth].i++;
        enqueue(C, rk->p);
    }
    return 0;
}

/* A collective reached by the rank the domain stands at: it blocks until
 * every member of its group instance has arrived; the last runs it. */
static vc_tri dom_meet(void *self, const cpc_op *op)
{
    ctx *C = RD(self)->C;
    rank_st *rk = RD(self)->rk;
    int g = op->group, inst = group_inst(rk, g), W = group_size(C, g);
    rk->state = ST_COLL;
    rk->bnode = RD(self)->nd;
    rk->bstep = RD(self)->step;
    rk->cgroup = g;
    rk->cinst = inst;
    if (++C->arrived[g][inst] < W)
        return VC_BLOCKED;
    C->arrived[g][inst] = 0;
    int *members = malloc(sizeof(int) * (size_t)W);
    if (!members)
        return VC_OOM;
    for (int m = 0; m < W; m++)
        members[m] = inst_member(C, g, inst, m);
    int rc = run_collective(C, members, W);
    free(members);
    return rc ? VC_NO : VC_BLOCKED; /* members (this one too) were advanced and queued */
}

static int exec_op(ctx *C, rank_st *rk, const opnode *nd, int64_t step)
{
    const cpc_op *op = nd->op;
    switch (op->kind) {
    case CPC_OP_LOOP: {
        int64_t count;
        if (eval(C, rk, nd, step, op->count, "count", &count))
            return RES_ERR;
        if (count < 0 || count > CPC_LOOP_MAX) {
            fail(C, rk->p, nd, step, "loop count %" PRId64 " (`%s`) is outside 0..%d", count,
                 cpc_expr_text(op->count), CPC_LOOP_MAX);
            return RES_ERR;
        }
        if (count == 0 || op->n_body == 0)
            return RES_NEXT; /* (nesting: check_nodes) */
        frame *f = &rk->fr[++rk->depth];
        f->ops = nd->body;
        f->n = nd->n_body;
        f->i = 0;
        f->s = 0;
        f->count = count;
        return RES_PUSHED;
    }
    default:
        break;
    }
    vc_tri t = vc_step(at(C, rk, nd, step), op, MSG(C));
    if (t == VC_BLOCKED && op->kind == CPC_OP_WAIT) { /* a request with its tag is not matched yet */
        rk->state = ST_WAIT;
        rk->wait_tag = op->tag;
        rk->bnode = nd;
        rk->bstep = step;
    }
    if (t == VC_BLOCKED)
        return RES_BLOCK;
    if (res(C, t))
        return RES_ERR;
    if (op->kind == CPC_OP_WAIT)
        vc_pool_drop_done(&C->reqs, &rk->open);
    return RES_NEXT;
}

/* End of a rank's program: every request completed, every OUTPUT buffer
 * holds the rank's shard with all heads and a complete attention. */
static int finish_rank(ctx *C, rank_st *rk)
{
    return res(C, vc_finish(at(C, rk, NULL, 0), MSG(C))); /* (at the request, or the OUTPUT's writer) */
}

/* Runs rank rk until it blocks, finishes or fails. */
static int run_rank(ctx *C, rank_st *rk)
{
    for (;;) {
        if (rk->state == ST_DONE || rk->state == ST_COLL)
            return 0;
        frame *f = &rk->fr[rk->depth];
        if (f->i >= f->n) {
            if (rk->depth == 0) {
                rk->state = ST_DONE; /* end checks run after the simulation */
                return 0;
            }
            f->s++;
            if (f->s < f->count) {
                f->i = 0;
                continue;
            }
            rk->depth--;
            rk->fr[rk->depth].i++;
            continue;
        }
        const opnode *nd = &f->ops[f->i];
        int64_t step = rk->depth > 0 ? f->s : 0;
        if (++C->instances > C->cap_instances) {
            C->capped = true;
            return 0;
        }
        if (nd->op->when) {
            int64_t w;
            if (eval(C, rk, nd, step, nd->op->when, "when", &w))
                return -1;
            if (!w) {
                f->i++;
                continue;
            }
        }
        int r = exec_op(C, rk, nd, step);
        if (C->oom)
            return -1;
        if (r == RES_ERR)
            return -1;
        if (r == RES_BLOCK)
            return 0;
        if (r == RES_PUSHED)
            continue;
        f->i++;
    }
}

/* ---- deadlock report ------------------------------------------------------------------ */

/* The first rank rk waits for (flat), and why. */
static int waits_for(ctx *C, rank_st *rk, char *why, size_t n)
{
    char ob[256];
    if (rk->state == ST_WAIT) {
        for (int i = 0; i < rk->open.n; i++) {
            req *q = RQ(C, rk->open.v[i]);
            if (q->tag != rk->wait_tag || q->match >= 0)
                continue;
            snprintf(why, n, "its %s %s rank %d (%s, tag %d) has no matching %s on rank %d", q->is_send ? "send" : "recv",
                     q->is_send ? "to" : "from", q->peer, op_desc(q->on, q->slo, ob, sizeof ob), q->tag,
                     q->is_send ? "recv" : "send", q->peer);
            return q->peer;
        }
    } else if (rk->state == ST_COLL) {
        int W = group_size(C, rk->cgroup);
        for (int m = 0; m < W; m++) {
            int p = inst_member(C, rk->cgroup, rk->cinst, m);
            rank_st *o = &C->rk[p];
            if (o->state == ST_COLL && o->cgroup == rk->cgroup && o->cinst == rk->cinst)
                continue;
            snprintf(why, n, "member rank %d of its %s group has not reached this collective", p,
                     cpc_group_name(rk->cgroup));
            return p;
        }
    }
    snprintf(why, n, "nothing");
    return -1;
}

/* Adds notes about peers that do not match (a send to B while B receives
 * from someone else with the same tag). */
static void peer_mismatch_notes(ctx *C, rank_st *rk)
{
    char o1[256], o2[256];
    for (int i = 0; i < rk->open.n; i++) {
        req *q = RQ(C, rk->open.v[i]);
        if (q->match >= 0)
            continue;
        rank_st *o = &C->rk[q->peer];
        for (int k = 0; k < o->open.n; k++) {
            req *x = RQ(C, o->open.v[k]);
            if (x->match < 0 && x->is_send != q->is_send && x->tag == q->tag && x->group == q->group &&
                x->peer != rk->p) {
                note(C, -1, q->on, q->slo,
                     "peers do not match: rank %d %s rank %d (%s), but rank %d %s rank %d (%s)", rk->p,
                     q->is_send ? "sends to" : "receives from", q->peer, op_desc(q->on, q->slo, o1, sizeof o1),
                     o->p, x->is_send ? "sends to" : "receives from", x->peer,
                     op_desc(x->on, x->slo, o2, sizeof o2));
                return;
            }
        }
    }
}

static void report_deadlock(ctx *C)
{
    int start = -1;
    for (int i = 0; i < C->P; i++)
        if (C->rk[i].state != ST_DONE) {
            start = i;
            break;
        }
    if (start < 0)
        return;
    int *pos = malloc(sizeof(int) * (size_t)C->P);
    int *path = malloc(sizeof(int) * (size_t)C->P);
    if (!pos || !path) {
        free(pos);
        free(path);
        oom(C);
        return;
    }
    for (int i = 0; i < C->P; i++)
        pos[i] = -1;
    char why[512], o2[256];
    int n = 0, cur = start;
    for (;;) {
        pos[cur] = n;
        path[n++] = cur;
        rank_st *rk = &C->rk[cur];
        int target = waits_for(C, rk, why, sizeof why);
        int ti = target;
        if (ti < 0) {
            fail(C, rk->p, rk->bnode, rk->bstep, "blocked forever: %s", why);
            break;
        }
        rank_st *t = &C->rk[ti];
        if (t->state == ST_DONE) {
            fail(C, rk->p, rk->bnode, rk->bstep, "blocked forever: %s, and rank %d has finished its program", why,
                 t->p);
            peer_mismatch_notes(C, rk);
            break;
        }
        if (pos[ti] >= 0) {
            /* cycle path[pos[ti] .. n) */
            char cyc[1024];
            int k = 0;
            for (int i = pos[ti]; i < n && (size_t)k < sizeof cyc; i++) {
                rank_st *x = &C->rk[path[i]];
                k += snprintf(cyc + k, sizeof cyc - (size_t)k, "rank %d (%s) -> ", x->p,
                              op_desc(x->bnode, x->bstep, o2, sizeof o2));
            }
            if ((size_t)k < sizeof cyc)
                snprintf(cyc + k, sizeof cyc - (size_t)k, "rank %d", t->p);
            rank_st *h = &C->rk[path[pos[ti]]];
            fail(C, h->p, h->bnode, h->bstep, "deadlock: no rank can progress; cycle of waits: %s", cyc);
            for (int i = pos[ti]; i < n; i++) {
                rank_st *x = &C->rk[path[i]];
                waits_for(C, x, why, sizeof why);
                note(C, x->p, x->bnode, x->bstep, "waits: %s", why);
            }
            for (int i = pos[ti]; i < n; i++)
                peer_mismatch_notes(C, &C->rk[path[i]]);
            break;
        }
        cur = ti;
    }
    free(pos);
    free(path);
}

/* ---- static checks ---------------------------------------------------------------------- */

static int check_op_shape(ctx *C, const opnode *nd)
{
    const cpc_op *op = nd->op;
    const cpc_program *P = C->prog;
    char path[256];
    if ((int)op->kind < 0 || op->kind >= CPC_OP__COUNT)
        return fail(C, -1, NULL, 0, "%s: unknown op kind %d", vc_node_path(nd, path, sizeof path), (int)op->kind);
    if (op->n_in < 0 || op->n_in > CPC_OP_MAX_BUFS || op->n_out < 0 || op->n_out > CPC_OP_MAX_BUFS)
        return fail(C, -1, nd, 0, "has %d inputs and %d outputs (0..%d each)", op->n_in, op->n_out, CPC_OP_MAX_BUFS);
    for (int j = 0; j < op->n_in; j++)
        if (op->in[j] < 0 || op->in[j] >= P->n_buffers)
            return fail(C, -1, nd, 0, "input %d names buffer index %d (the program has %d)", j, op->in[j], P->n_buffers);
    for (int j = 0; j < op->n_out; j++)
        if (op->out[j] < 0 || op->out[j] >= P->n_buffers)
            return fail(C, -1, nd, 0, "output %d names buffer index %d (the program has %d)", j, op->out[j],
                        P->n_buffers);
    /* Arity, group and the fields each kind needs: the op table (program.h). */
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    int ni = op->n_in, no = op->n_out;
    if (ni < info->min_in || ni > info->max_in || no < info->min_out || no > info->max_out ||
        (info->same_in_out && ni != no))
        return fail(C, -1, nd, 0, "needs %s; has %d inputs and %d outputs", info->operands, ni, no);
    switch (op->kind) { /* what the table cannot say */
    case CPC_OP_INIT_ACC:
        if (!(no >= 2 || (no == 0 && ni >= 2)))
            return fail(C, -1, nd, 0, "needs %s, has %d in / %d out", info->operands, ni, no);
        break;
    case CPC_OP_SWAP: {
        if (op->in[0] == op->in[1])
            return fail(C, -1, nd, 0, "needs %s", info->operands);
        const cpc_buffer *a = &P->buffers[op->in[0]], *b = &P->buffers[op->in[1]];
        if (a->role != b->role || a->tokens != b->tokens || a->heads != b->heads)
            return fail(C, -1, nd, 0, "swaps %s and %s, which differ in role, tokens or heads", a->name, b->name);
        break;
    }
    case CPC_OP_ALL_TO_ALL:
        if ((int)op->dir < 0 || op->dir >= CPC_A2A__COUNT)
            return fail(C, -1, nd, 0, "unknown all_to_all direction %d", (int)op->dir);
        break;
    default:
        break;
    }
    if ((info->flags & CPC_OPF_BODY) && !op->count)
        return fail(C, -1, nd, 0, "a loop needs a count");
    if ((info->flags & CPC_OPF_BODY) && op->n_body > 0 && !op->body)
        return fail(C, -1, nd, 0, "loop body missing");
    if ((info->flags & CPC_OPF_GROUP) && (op->group <= CPC_GROUP_NONE || op->group >= CPC_GROUP__COUNT))
        return fail(C, -1, nd, 0, "a communication op needs a group (ring, ulysses or world)");
    if (info->group != CPC_GROUP_NONE && op->group != info->group)
        return fail(C, -1, nd, 0, "%s runs over the %s group, not %s", info->name,
                    cpc_group_name(info->group), cpc_group_name(op->group));
    if ((info->flags & CPC_OPF_PEER) && !op->peer)
        return fail(C, -1, nd, 0, "needs a peer");
    if ((info->flags & CPC_OPF_BLOCK) && !op->block)
        return fail(C, -1, nd, 0, "needs a block (the ring block that arrives)");
    if ((info->flags & CPC_OPF_TAG) && op->tag < 0)
        return fail(C, -1, nd, 0, "tag %d < 0", op->tag);
    if ((info->flags & CPC_OPF_TAG) && op->tag > CPC_VERIFY_TAG_MAX)
        return fail(C, -1, nd, 0, "tag %d > %d, the largest tag every MPI library accepts (MPI_TAG_UB >= 32767)",
                    op->tag, CPC_VERIFY_TAG_MAX);
    if (!(info->flags & CPC_OPF_BODY) && op->n_body != 0)
        return fail(C, -1, nd, 0, "only a loop has a body");
    return 0;
}

/* The static shape of every op, in program order (loops nested at most
 * MAX_DEPTH deep). */
static int check_nodes(ctx *C, const opnode *nodes, int n, int depth)
{
    for (int i = 0; i < n; i++) {
        const opnode *nd = &nodes[i];
        if (check_op_shape(C, nd))
            return -1;
        if (nd->op->kind == CPC_OP_LOOP && nd->op->n_body > 0) {
            if (depth >= MAX_DEPTH)
                return fail(C, -1, nd, 0, "loops nested deeper than %d", MAX_DEPTH);
            if (check_nodes(C, nd->body, nd->n_body, depth + 1))
                return -1;
        }
    }
    return 0;
}

static int check_buffers(ctx *C)
{
    const cpc_program *P = C->prog;
    for (int b = 0; b < P->n_buffers; b++) {
        const cpc_buffer *B = &P->buffers[b];
        if ((int)B->role < 0 || B->role >= CPC_ROLE__COUNT || (int)B->tokens < 0 || B->tokens >= CPC_TOK__COUNT ||
            (int)B->heads < 0 || B->heads >= CPC_HEADS__COUNT || (int)B->io < 0 || B->io >= CPC_IO__COUNT)
            return fail(C, -1, NULL, 0, "buffer %d (%.*s) has an unknown role, layout or io", b, CPC_BUF_NAME_MAX,
                        B->name);
        if (B->io == CPC_IO_INPUT) {
            bool ok = B->role == CPC_ROLE_Q || B->role == CPC_ROLE_K || B->role == CPC_ROLE_V;
            bool tok = B->tokens == CPC_TOK_SHARD || (B->tokens == CPC_TOK_BLOCK && C->U == 1) ||
                       (B->tokens == CPC_TOK_KV && C->L->cross && is_kv_role(B->role)) ||
                       (B->tokens == CPC_TOK_KV && C->L->rep && B->heads == CPC_HEADS_ALL);
            if (!ok || !tok)
                return fail(C, -1, NULL, 0,
                            "INPUT buffer %s (role %s, tokens %s) cannot be filled from q/k/v: inputs are q, k "
                            "or v shards (block layout only with ulysses_degree 1, kv layout for cross-attention "
                            "k/v)",
                            B->name, cpc_buf_role_name(B->role), cpc_buf_tokens_name(B->tokens));
        }
        if (B->io == CPC_IO_OUTPUT) {
            bool rep_out = C->L->rep && B->role == CPC_ROLE_O && B->tokens == CPC_TOK_KV;
            if (!(B->role == CPC_ROLE_O || B->role == CPC_ROLE_LSE) ||
                (B->tokens != CPC_TOK_SHARD && !rep_out) || B->heads != CPC_HEADS_ALL)
                return fail(C, -1, NULL, 0,
                            "OUTPUT buffer %s (role %s, tokens %s, heads %s) must be an o or lse shard with all heads",
                            B->name, cpc_buf_role_name(B->role), cpc_buf_tokens_name(B->tokens),
                            cpc_buf_heads_name(B->heads));
        }
        if (B->tokens == CPC_TOK_KV && !C->L->cross && !C->L->rep)
            return fail(C, -1, NULL, 0, "buffer %s has the kv token layout but the plan has no cross-attention "
                        "nor replicated segment", B->name);
    }
    bool has_out = false, has_rep_out = false;
    for (int b = 0; b < P->n_buffers; b++)
        has_rep_out |= P->buffers[b].io == CPC_IO_OUTPUT && P->buffers[b].tokens == CPC_TOK_KV;
    if (C->L->rep && !has_rep_out)
        return fail(C, -1, NULL, 0, "the program has no OUTPUT buffer of the replicated segments' rows "
                    "(kv layout): every rank returns their whole output");
    for (int b = 0; b < P->n_buffers; b++)
        has_out |= P->buffers[b].io == CPC_IO_OUTPUT;
    if (!has_out)
        return fail(C, -1, NULL, 0, "the program has no OUTPUT buffer");
    return 0;
}

/* ---- estimate ----------------------------------------------------------------------------- */

static int64_t sat_add(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static int64_t sat_mul(int64_t a, int64_t b)
{
    if (a == 0 || b == 0)
        return 0;
    return a > INT64_MAX / b ? INT64_MAX : a * b;
}

/* Does evaluating a loop op of this list (its `when`, its `count`) read s? */
static bool loops_read_s(const cpc_op *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (ops[i].kind == CPC_OP_LOOP &&
            (cpc_expr_uses(ops[i].when, 's') || cpc_expr_uses(ops[i].count, 's')))
            return true;
    return false;
}

/* What one visit of op costs (verify.h THE PROVER'S BOUND): 1, plus one
 * for every 8 expression nodes it evaluates (`when`, `peer`, `block`). */
static int64_t op_weight(const cpc_op *op)
{
    return 1 + (cpc_expr_size(op->when) + cpc_expr_size(op->peer) + cpc_expr_size(op->block)) / 8;
}

/* Op instances the simulator visits on the rank with coordinates *c,
 * weighted by op_weight: every
 * op of a list it walks costs one visit (its `when` is evaluated there), and
 * a loop's body is walked `count` times only when the loop's own `when`
 * holds: what executes, not what is written (a loop behind a false guard
 * costs one visit, whatever its count).  Stops soon after `cap`. */
static int64_t visits(const cpc_op *ops, int n, const cpc_coords *c, int depth, int64_t cap)
{
    int64_t total = 0;
    for (int i = 0; i < n && total <= cap; i++) {
        const cpc_op *op = &ops[i];
        total = sat_add(total, op_weight(op));
        if (op->kind != CPC_OP_LOOP || op->n_body <= 0 || !op->body || !op->count || depth >= MAX_DEPTH)
            continue;
        int64_t w = 1, cnt = 0;
        cpc_status *st = op->when ? cpc_expr_eval(op->when, c, &w) : NULL;
        if (!st)
            st = cpc_expr_eval(op->count, c, &cnt);
        if (st) { /* the simulation stops there with the error */
            cpc_status_free(st);
            continue;
        }
        if (!w || cnt <= 0 || cnt > CPC_LOOP_MAX)
            continue;
        cpc_coords in = *c;
        in.s = 0;
        if (!loops_read_s(op->body, op->n_body)) {
            total = sat_add(total, sat_mul(cnt, visits(op->body, op->n_body, &in, depth + 1, cap)));
            continue;
        }
        for (int64_t s = 0; s < cnt && total <= cap; s++) {
            in.s = s;
            total = sat_add(total, visits(op->body, op->n_body, &in, depth + 1, cap - total));
        }
    }
    return total;
}

/* Op instances an enumeration of every rank visits, or more than `cap` (the
 * count stops soon after it). */
static int64_t enumeration_cost(const cpc_program *prog, int64_t cap)
{
    int64_t total = 0;
    for (int p = 0; p < prog->layout.P && total <= cap; p++) {
        cpc_coords c = cpc_program_coords(prog, p);
        total = sat_add(total, visits(prog->ops, prog->n_ops, &c, 0, cap - total));
    }
    return total;
}

/* ---- driver --------------------------------------------------------------------------------- */

static void ctx_free(ctx *C)
{
    if (C->rk) {
        for (int i = 0; i < C->P; i++) {
            rank_st *rk = &C->rk[i];
            if (rk->v)
                for (int b = 0; b < C->prog->n_buffers; b++)
                    aval_free(&rk->v[b]);
            free(rk->v);
            free(rk->nsend);
            free(rk->rpend);
            free(rk->open.v);
        }
        free(C->rk);
    }
    vc_pool_free(&C->reqs);
    free(C->ch);
    for (int j = 0; j < CPC_OP_MAX_BUFS; j++)
        aval_free(&C->tmp[j]);
    free(C->queue);
    for (int g = 0; g < CPC_GROUP__COUNT; g++) {
        free(C->arrived[g]);
    }
    vc_nodes_free(C->root, C->n_root);
}

/* Every rank is simulated (the enumeration): rank p is rk[p]. */
static int init_ranks(ctx *C)
{
    int P = C->P, nb = C->prog->n_buffers;
    C->d.C = C;
    C->dom = rank_ops;
    C->dom.self = &C->d, C->dom.prog = C->prog, C->dom.cross = C->L->cross, C->dom.rep = C->L->rep;
    C->rk = calloc((size_t)C->P, sizeof(rank_st));
    C->queue = malloc(sizeof(int) * (size_t)C->P);
    if (!C->rk || !C->queue)
        return oom(C);
    for (int g = CPC_GROUP_RING; g < CPC_GROUP__COUNT; g++) {
        int ninst = g == CPC_GROUP_RING ? C->U : g == CPC_GROUP_ULYSSES ? C->R : 1;
        C->arrived[g] = calloc((size_t)ninst, sizeof(int));
        if (!C->arrived[g])
            return oom(C);
    }
    for (int p = 0; p < P; p++) {
        rank_st *rk = &C->rk[p];
        rk->p = p;
        rk->c = cpc_program_coords(C->prog, p);
        rk->fr[0].ops = C->root;
        rk->fr[0].n = C->n_root;
        rk->fr[0].count = 1;
        rk->v = calloc((size_t)(nb ? nb : 1), sizeof(aval));
        rk->nsend = calloc((size_t)(nb ? nb : 1), sizeof(int32_t));
        rk->rpend = malloc(sizeof(int32_t) * (size_t)(nb ? nb : 1));
        if (!rk->v || !rk->nsend || !rk->rpend)
            return oom(C);
        for (int b = 0; b < nb; b++)
            rk->rpend[b] = -1;
        vc_inputs(at(C, rk, NULL, 0));
        rk->queued = true;
        C->queue[C->qn++] = p;
    }
    return 0;
}

/* The first backward-only op of ops[0..n) at any loop depth, with its path
 * ("ops[2].body[1].body[3]", 1-based as in the diagnostics) in where; NULL
 * when there is none. */
static const cpc_op *find_backward_op(const cpc_op *ops, int n, char *where, size_t cap, size_t len)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *o = &ops[i];
        int w = snprintf(where + len, cap - len, len ? ".body[%d]" : "ops[%d]", i + 1);
        size_t l2 = w > 0 && (size_t)w < cap - len ? len + (size_t)w : len;
        const cpc_op_info *ki = cpc_op_info_of(o->kind);
        if (ki && !(ki->flags & CPC_OPF_FWD)) /* the op table: not a forward kind */
            return o;
        if (o->kind == CPC_OP_LOOP && o->body) {
            const cpc_op *b = find_backward_op(o->body, o->n_body, where, cap, l2);
            if (b)
                return b;
        }
        where[len] = 0;
    }
    return NULL;
}

cpc_status *cpc_verify_ex(const cpc_program *prog, const cpc_verify_opts *opts, cpc_verify_stats *stats)
{
    cpc_verify_stats dummy;
    if (!stats)
        stats = &dummy;
    memset(stats, 0, sizeof *stats);
    if (!prog)
        return cpc_error(CPC_E_INTERNAL, "verify: no program");
    if (prog->n_buffers < 0 || prog->n_ops < 0 || (prog->n_buffers > 0 && !prog->buffers) ||
        (prog->n_ops > 0 && !prog->ops))
        return cpc_error(CPC_E_INTERNAL, "verify: malformed program");
    const cpc_layout *L = &prog->layout;
    if (L->R < 1 || L->U < 1 || L->P != L->R * L->U || L->P > (1 << 20) || L->H < 1 || L->Hkv < 1 ||
        L->group < 1 || L->D < 1)
        return cpc_error(CPC_E_INTERNAL, "verify: program layout is not initialised (R %d, U %d, P %d)", L->R, L->U,
                         L->P);
    /* Backward ops (training) are proved by cpc_verify_backward (verify_bwd.h);
     * in a forward program they are refused before either prover runs. */
    {
        /* at any loop depth (issue 23: an `add` two loops deep reached the
         * simulation as "unknown op kind 16") */
        char where[256];
        const cpc_op *b = find_backward_op(prog->ops, prog->n_ops, where, sizeof where, 0);
        if (b)
            return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, b->span,
                            "%s: %s is a backward (training) op: a forward program may not use it "
                            "(backward programs are proved by cpc_verify_backward)",
                            where, cpc_op_kind_name(b->kind));
    }
    ctx C;
    memset(&C, 0, sizeof C);
    C.prog = prog;
    C.L = L;
    C.R = L->R;
    C.U = L->U;
    C.P = L->P;
    C.reqs = (vc_pool){.size = sizeof(req), .free = -1, .release = req_release};

    int64_t limit = opts && opts->full_limit ? opts->full_limit : CPC_VERIFY_DEFAULT_FULL_LIMIT;
    cpc_verify_method method = opts ? opts->method : CPC_VERIFY_AUTO;
    stats->estimate = -1;

    cpc_status *out = NULL;
    bool bad = false;
    if (check_buffers(&C) == 0) {
        C.root = vc_nodes(prog->ops, prog->n_ops, MAX_DEPTH, &bad);
        C.n_root = C.root ? prog->n_ops : 0;
        if (bad)
            oom(&C);
        else
            check_nodes(&C, C.root, C.n_root, 0);
    }
    if (C.err || C.oom)
        goto done;

    /* 1. the symbolic proof (verify_sym.h): cost independent of the world */
    cpc_status *sdiag = NULL;
    cpc_sym_result sr = CPC_SYM_UNDECIDED;
    if (method != CPC_VERIFY_ENUMERATE) {
        cpc_sym_stats ss;
        sr = cpc_verify_symbolic(prog, &sdiag, &ss);
        stats->op_instances = ss.op_instances;
        if (sr == CPC_SYM_NOMEM) {
            oom(&C);
            goto done;
        }
        if (sr == CPC_SYM_PROVED) {
            stats->mode = CPC_VERIFY_SYMBOLIC;
            stats->ranks = C.P;
            goto done;
        }
        if (method == CPC_VERIFY_SYMBOLIC_ONLY) {
            stats->mode = CPC_VERIFY_REFUSED;
            out = sdiag;
            if (sr == CPC_SYM_UNDECIDED && out && out != &cpc_status_oom)
                cpc_status_prefix(out, "schedule verification failed: cannot prove the program symbolically");
            goto done;
        }
    }
    stats->op_instances = 0;

    /* 2. enumeration of every rank, when it is affordable: counted as what
     * executes (guards evaluated), so dead code cannot inflate it */
    int64_t est = limit > 0 && C.P <= CPC_VERIFY_MAX_RANKS ? enumeration_cost(prog, limit) : INT64_MAX;
    stats->estimate = est;
    if (est > limit || limit <= 0 || C.P > CPC_VERIFY_MAX_RANKS) {
        /* 3. neither: a refusal, an error like any other CP051 */
        stats->mode = CPC_VERIFY_REFUSED;
        if (sr == CPC_SYM_ERROR) {
            out = sdiag;
            goto done;
        }
        if (!sdiag || sdiag == &cpc_status_oom) {
            out = cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, CPC_NO_SPAN,
                           "schedule verification failed: the program cannot be proven: enumerating its %d "
                           "ranks is too large (limit %" PRId64 " op instances)",
                           C.P, limit);
        } else {
            char est_words[96];
            if (est == INT64_MAX || est > limit)
                snprintf(est_words, sizeof est_words, "more than %" PRId64, limit > 0 ? limit : 0);
            else
                snprintf(est_words, sizeof est_words, "%" PRId64, est);
            out = cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, sdiag->span,
                           "schedule verification failed: the program cannot be proven: it is irregular at %s, so "
                           "the symbolic proof does not apply, and enumerating its %d ranks would visit %s op "
                           "instances (limit %" PRId64 ")",
                           sdiag->message, C.P, est_words, limit);
            if (out && out != &cpc_status_oom)
                cpc_status_set_hint(out,
                                    "keep every rank running the same ops (`when` and loop counts that do not "
                                    "read r, u or p; ring peers (r + constant) mod R; ring blocks (r + "
                                    "constant*s + constant) mod R) so that the symbolic proof applies, or use "
                                    "fewer ranks (docs/VERIFY.md)");
            cpc_status_free(sdiag);
        }
        if (!out)
            oom(&C);
        goto done;
    }
    cpc_status_free(sdiag);
    if (init_ranks(&C))
        goto done;
    stats->mode = CPC_VERIFY_FULL;
    stats->ranks = C.P;
    C.cap_instances = sat_add(sat_mul(limit, 4), 1000000);

    while (C.qn > 0 && !C.err && !C.oom && !C.capped) {
        int i = C.queue[C.qh];
        C.qh = (C.qh + 1) % C.P;
        C.qn--;
        rank_st *rk = &C.rk[i];
        rk->queued = false;
        if (rk->state == ST_WAIT)
            rk->state = ST_RUN;
        if (run_rank(&C, rk))
            break;
    }
    if (!C.err && !C.oom && !C.capped)
        report_deadlock(&C);
    /* End-of-program checks, in rank order, once no rank can progress (so
     * that a deadlock is reported as such, and requests still matched). */
    for (int i = 0; i < C.P && !C.err && !C.oom && !C.capped; i++)
        finish_rank(&C, &C.rk[i]);
    if (C.capped && !C.err && !C.oom) {
        stats->mode = CPC_VERIFY_REFUSED;
        out = cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, CPC_NO_SPAN,
                       "schedule verification failed: the program cannot be proven: the enumeration of its %d "
                       "ranks exceeded %" PRId64 " op instances",
                       C.P, C.cap_instances);
    }

done:
    if (stats->mode == CPC_VERIFY_FULL)
        stats->op_instances = C.instances;
    stats->messages = C.st.messages;
    stats->collectives = C.st.collectives;
    if (C.oom) {
        cpc_status_free(C.err);
        C.err = cpc_error(CPC_E_NOMEM, "verify: out of memory");
    }
    if (C.err) {
        cpc_status_free(out);
        out = C.err;
    }
    ctx_free(&C);
    return out;
}

cpc_status *cpc_verify(const cpc_program *prog)
{
    return cpc_verify_ex(prog, NULL, NULL);
}
