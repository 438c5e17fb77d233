/* verify_common.c - the provers' shared rules, the op tree, the step and the message layer of
 * every domain (verify_common.h). */
#include "verify_common.h"

#include "verify.h" /* CPC_RULE_VERIFY */

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ST(d, b) (d->val(d->self, b)->stamp)
#define NM(b) d->name(d->self, b)
#define SELF d->self

static const char *verb_of(cpc_access acc)
{
    return acc == CPC_ACCESS_READ    ? "reads"
           : acc == CPC_ACCESS_WRITE ? "writes"
           : acc == CPC_ACCESS_REBIND ? "swaps"
                                      : "accumulates into";
}

/* The request in flight on buffer b: the recv writing it (send: a send reading it); NULL: none. */
static const vc_rq *req_on(const vc_domain *d, int b, bool send)
{
    if (!send)
        return d->rpend[b] < 0 ? NULL : d->rq(SELF, d->rpend[b]);
    for (int i = 0, id; d->nsend[b] > 0 && (id = d->open(SELF, i)) >= 0; i++) {
        const vc_rq *x = d->rq(SELF, id);
        for (int j = 0; x->is_send && !x->done && j < x->nb; j++)
            if (x->bufs[j] == b)
                return x;
    }
    return NULL;
}

/* " (op, tag t, from rank p)" of q into buf, " tag t" (the wait completing it) into wt. */
static void req_words(const vc_rq *q, const char *dir, char *buf, size_t n, char *wt, size_t nt)
{
    char ob[256], peer[48] = "";
    if (q->peer >= 0)
        snprintf(peer, sizeof peer, ", %s rank %d", dir, q->peer);
    snprintf(buf, n, " (%s, tag %d%s)", vc_op_desc(q->on, q->slo, q->shi, ob, sizeof ob), q->tag, peer);
    snprintf(wt, nt, " tag %d", q->tag);
}

/* The lifetime rule for buffer b used with access acc: true when it is broken (msg: how). */
static bool vc_in_flight(const vc_domain *d, int b, cpc_access acc, char *msg, size_t n)
{
    if (acc == CPC_ACCESS_NONE)
        return false;
    const vc_rq *q;
    char w[320], wt[32];
    if ((q = req_on(d, b, false))) {
        req_words(q, "from", w, sizeof w, wt, sizeof wt);
        snprintf(msg, n, "%s %s while the recv into it%s is not complete (in flight): no `wait%s` between them",
                 verb_of(acc), d->name(d->self, b), w, wt);
        return true;
    }
    if (acc != CPC_ACCESS_READ && (q = req_on(d, b, true))) {
        req_words(q, "to", w, sizeof w, wt, sizeof wt);
        snprintf(msg, n, "%s %s while a send from it is in flight%s: no `wait%s` between them",
                 acc == CPC_ACCESS_WRITE ? "overwrites" : verb_of(acc), d->name(d->self, b), w, wt);
        return true;
    }
    return false;
}

/* THE SHARED RULES: each is true when broken, the violation in msg (n bytes). */
/* The op table's lifetime rule (program.h CPC_LIFE_UNTIL_WAIT) for every operand of op, by its
 * in_access / out_access columns: a buffer with a recv in flight may not be used at all, one with
 * a send in flight only read, before the wait. */
static bool vc_operands_in_flight(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    if (!info)
        return false;
    for (int j = 0; j < op->n_in; j++)
        if (vc_in_flight(d, op->in[j], info->in_access, msg, n))
            return true;
    for (int j = 0; j < op->n_out; j++)
        if (vc_in_flight(d, op->out[j], info->out_access, msg, n))
            return true;
    return false;
}

/* The read rule: b is not in flight as a recv, and written before it is
 * read (`want` DELTA names the missing delta op). */
static bool vc_read(const vc_domain *d, int b, cpc_content want, char *msg, size_t n)
{
    if (vc_in_flight(d, b, CPC_ACCESS_READ, msg, n))
        return true;
    if (!d->val(d->self, b)->written) {
        snprintf(msg, n, "reads %s before it is written%s", d->name(d->self, b),
                 want == CPC_CONTENT_DELTA ? " (no delta op computed it)" : "");
        return true;
    }
    return false;
}

/* The content rule: every input slot of op with a table in_content is written and holds that
 * content (by provenance: the delta op's output is not the saved LSE).  `base` is how input slots
 * are numbered in the message (0 or 1). */
static bool vc_contents(const vc_domain *d, const cpc_op *op, int base, char *msg, size_t n)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    for (int i = 0; info && i < op->n_in && i < CPC_OP_MAX_BUFS; i++) {
        cpc_content want = (cpc_content)info->in_content[i];
        if (want == CPC_CONTENT_NONE)
            continue;
        if (!d->val(d->self, op->in[i])->written) {
            snprintf(msg, n, "reads %s before it is written%s", d->name(d->self, op->in[i]),
                     want == CPC_CONTENT_DELTA ? " (no delta op computed it)" : "");
            return true;
        }
        int got = d->val(d->self, op->in[i])->src;
        if (got == SRC_FOREIGN) {
            snprintf(msg, n, "input %d (%s) holds %s (received), not this rank's %s", i + base,
                     d->name(d->self, op->in[i]), src_names_of(got), cpc_content_name(want));
            return true;
        }
        if (got != (int)want) {
            snprintf(msg, n, "input %d (%s) holds %s data, not %s (operands are identified by what made them, "
                             "not by role)",
                     i + base, d->name(d->self, op->in[i]), cpc_content_name((cpc_content)got),
                     cpc_content_name(want));
            return true;
        }
    }
    return false;
}

/* The overwrite rule (forward): b is not in flight, and does not hold an
 * attention output no op has read (a block attended twice, a merge missing). */
static bool vc_write(const vc_domain *d, int b, char *msg, size_t n)
{
    if (vc_in_flight(d, b, CPC_ACCESS_WRITE, msg, n))
        return true;
    if (d->val(d->self, b)->written && d->val(d->self, b)->fresh) {
        snprintf(msg, n,
                 "overwrites the attention output in %s (written by %s) before any op used it: a block attended "
                 "twice, or a merge missing",
                 d->name(d->self, b), d->writer(d->self, b));
        return true;
    }
    return false;
}

/* The merge's provenance rules: its outputs are initialised (or arriving), in[0], in[1] the output
 * and LSE of one attention block (one stamp) not merged yet, out[0], out[1] one accumulator pair
 * (one stamp), not the input.  Needs the domain's val and writer. */
static bool vc_merge(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    for (int j = 0; j < 2; j++) {
        int b = op->out[j];
        if (!req_on(d, b, false) && !d->val(d->self, b)->written) {
            snprintf(msg, n, "merges into %s, which is not initialised (no init_acc or attn before)",
                     d->name(d->self, b));
            return true;
        }
    }
    const signed char *mc = cpc_op_info_of(CPC_OP_MERGE)->in_content; /* o, lse: the op table */
    int a = op->in[0], al = op->in[1], acc = op->out[0], accl = op->out[1];
    if (d->val(d->self, a)->src != mc[0] || d->val(d->self, al)->src != mc[1] ||
        ST(d, a) != ST(d, al)) {
        snprintf(msg, n, "inputs %s and %s are not the output and LSE of one attention block", d->name(d->self, a),
                 d->name(d->self, al));
        return true;
    }
    if (d->val(d->self, acc)->src != CPC_CONTENT_OUT || d->val(d->self, accl)->src != CPC_CONTENT_LSE ||
        ST(d, acc) != ST(d, accl)) {
        snprintf(msg, n, "outputs %s and %s are not one accumulator and its LSE", d->name(d->self, acc),
                 d->name(d->self, accl));
        return true;
    }
    if (a == acc || ST(d, a) == ST(d, acc)) {
        snprintf(msg, n, "merges %s into itself", d->name(d->self, acc));
        return true;
    }
    if (d->val(d->self, a)->merged) {
        snprintf(msg, n,
                 "merges the attention output in %s (written by %s) a second time: no attn wrote it since the last "
                 "merge",
                 d->name(d->self, a), d->writer(d->self, a));
        return true;
    }
    return false;
}

/* ---- coverage under a causal mask ------------------------------------------------------------ */

/* Smallest / largest global token position of shard unit u (flat rank u's shard). */
static int64_t unit_min(const cpc_layout *L, int u)
{
    if (L->zigzag)
        return (int64_t)u * (L->S / (2 * (int64_t)L->P));
    int64_t best = INT64_MAX;
    for (int j = 0; j < L->n_seg; j++)
        if (cpc_split_len(L->seg_len[j], L->P, u) > 0) {
            int64_t x = L->seg_start[j] + cpc_split_off(L->seg_len[j], L->P, u);
            if (x < best)
                best = x;
        }
    return best;
}

static int64_t unit_max(const cpc_layout *L, int u)
{
    if (L->zigzag) {
        int64_t c = L->S / (2 * (int64_t)L->P);
        return (int64_t)(2 * L->P - 1 - u) * c + c - 1;
    }
    int64_t best = -1;
    for (int j = 0; j < L->n_seg; j++) {
        int64_t len = cpc_split_len(L->seg_len[j], L->P, u);
        if (len > 0) {
            int64_t x = L->seg_start[j] + cpc_split_off(L->seg_len[j], L->P, u) + len - 1;
            if (x > best)
                best = x;
        }
    }
    return best;
}

int vc_units_needed(const cpc_layout *L, int lo, int hi)
{
    if (!L->causal)
        return L->P;
    int64_t qmax = -1;
    for (int u = lo; u < hi; u++) {
        int64_t m = unit_max(L, u);
        if (m > qmax)
            qmax = m;
    }
    int a = 0, b = L->P; /* the first unit with unit_min > qmax (unit_min is nondecreasing) */
    while (a < b) {
        int mid = a + (b - a) / 2;
        if (unit_min(L, mid) <= qmax)
            a = mid + 1;
        else
            b = mid;
    }
    return a;
}

/* ---- the op tree -------------------------------------------------------------------------- */

void vc_nodes_free(vc_node *nodes, int n)
{
    for (int i = 0; nodes && i < n; i++)
        vc_nodes_free(nodes[i].body, nodes[i].n_body);
    free(nodes);
}

static vc_node *nodes_at(const cpc_op *ops, int n, const vc_node *parent, int depth, int max_depth, bool *oom)
{
    vc_node *nodes = n > 0 ? calloc((size_t)n, sizeof(vc_node)) : NULL;
    *oom |= n > 0 && !nodes;
    for (int i = 0; nodes && i < n && !*oom; i++) {
        vc_node *nd = &nodes[i];
        *nd = (vc_node){.op = &ops[i], .parent = parent, .index = i, .in_loop = depth > 0};
        if (ops[i].kind == CPC_OP_LOOP && ops[i].n_body > 0 && ops[i].body && depth < max_depth) {
            nd->body = nodes_at(ops[i].body, ops[i].n_body, nd, depth + 1, max_depth, oom);
            nd->n_body = nd->body ? ops[i].n_body : 0;
        }
    }
    if (*oom) {
        vc_nodes_free(nodes, n);
        return NULL;
    }
    return nodes;
}

vc_node *vc_nodes(const cpc_op *ops, int n, int max_depth, bool *oom)
{
    *oom = false;
    return nodes_at(ops, n, NULL, 0, max_depth, oom);
}

const char *vc_node_path(const vc_node *nd, char *buf, size_t n)
{
    int idx[64], k = 0;
    for (; nd && k < 64; nd = nd->parent)
        idx[k++] = nd->index;
    size_t o = 0;
    buf[0] = 0;
    while (k-- > 0 && o < n)
        o += (size_t)snprintf(buf + o, n - o, o ? ".body[%d]" : "ops[%d]", idx[k] + 1);
    return buf;
}

const vc_node *vc_node_of(const vc_node *nodes, int n, const cpc_op *op)
{
    if (n <= 0 || !nodes)
        return NULL;
    if (op >= nodes[0].op && op < nodes[0].op + n)
        return &nodes[op - nodes[0].op];
    for (int i = 0; i < n; i++) {
        const vc_node *nd = nodes[i].n_body ? vc_node_of(nodes[i].body, nodes[i].n_body, op) : NULL;
        if (nd)
            return nd;
    }
    return NULL;
}

/* ---- the step ------------------------------------------------------------------------------- */

#define FAULT(...) (snprintf(msg, n, __VA_ARGS__), VC_NO)
#define UNDEC(...) (snprintf(msg, n, __VA_ARGS__), VC_UNDECIDED)
/* A three-valued answer t that is not YES: its message, a fault or undecided. */
#define NOT_YES(t, ...) (snprintf(msg, n, __VA_ARGS__), (t))
#define W(v, buf) d->words(SELF, (v), (buf), sizeof(buf))

vc_tri vc_rd(const vc_domain *d, int b, char *msg, size_t n)
{
    if (vc_read(d, b, CPC_CONTENT_NONE, msg, n))
        return VC_NO;
    d->val(SELF, b)->fresh = 0;
    return VC_YES;
}

/* v may live in buffer b: its role holds v's content, then the domain's
 * token and head layout. */
static vc_tri fits(const vc_domain *d, int b, const vc_val *v, char *msg, size_t n)
{
    const cpc_buffer *B = &d->prog->buffers[b];
    if (!v->written)
        return VC_YES;
    /* forward contents by src_of_role; the backward ones (dout, delta, gradients) by the op table's role
     * content, the delta op's output in an lse-role buffer */
    bool holds = v->src == SRC_FOREIGN ? true /* of the same size (verify_bwd.c); unusable */
                 : v->src <= SRC_LSE   ? src_of_role(B->role) == v->src
                                   : cpc_content_of_role(B->role) == (cpc_content)v->src ||
                                         (B->role == CPC_ROLE_LSE && v->src == CPC_CONTENT_DELTA);
    if (!holds)
        return FAULT("buffer %s (role %s) cannot hold %s data", B->name, cpc_buf_role_name(B->role),
                     src_names_of(v->src));
    return d->fits(SELF, b, v, msg, n);
}

static vc_tri wr(const vc_domain *d, int b, char *msg, size_t n)
{
    return vc_write(d, b, msg, n) ? VC_NO : VC_YES;
}

vc_tri vc_store(const vc_domain *d, int b, vc_val *v, char *msg, size_t n)
{
    vc_tri t = fits(d, b, v, msg, n);
    if (t != VC_YES)
        return t;
    d->put(SELF, b, v);
    return VC_YES;
}

/* Coverage: attention result v covers every key its rows need (marks it final). */
static vc_tri vc_complete(const vc_domain *d, vc_val *v, const char *name, char *msg, size_t n)
{
    char w[200], why[600];
    if (!src_is_attn(v->src) || v->final)
        return VC_YES;
    bool keys = d->has_keys(SELF, v);
    if (d->tok_is(SELF, v, VC_T_UNSET) == VC_YES || (!keys && v->kvcov == 0))
        return FAULT("%s holds no attention result: no attention block was merged into it", name);
    if (!d->rep && d->tok_is(SELF, v, VC_T_KV) == VC_YES)
        return FAULT("%s has cross-attention K/V as its query rows", name);
    if (d->rep) {
        if (v->kvcov != 1)
            return FAULT("%s: query rows of %s never met the keys/values of the replicated segments", name, W(v, w));
    } else if (d->cross) {
        if (v->kvcov != 1 || keys)
            return FAULT("%s: query rows of %s %s", name, W(v, w),
                         v->kvcov == 0 ? "never met the cross-attention keys/values"
                                       : "met self-attention keys instead of the cross-attention keys/values");
        v->final = 1;
        return VC_YES;
    }
    if (v->kvcov != 0 && !d->rep)
        return FAULT("%s mixes cross-attention and self-attention keys", name);
    why[0] = 0;
    vc_tri t = d->covered(SELF, v, name, why, sizeof why);
    if (t == VC_YES)
        v->final = 1;
    else if (why[0])
        snprintf(msg, n, "%s %s", name, why);
    else
        msg[0] = 0;
    return t;
}

/* Token class of buffer layout tk for an accumulator being initialised. */
static int tok_of_layout(cpc_buf_tokens tk)
{
    return tk == CPC_TOK_SHARD ? VC_T_OWN : tk == CPC_TOK_ALL ? VC_T_ALL : VC_T_UNSET;
}

/* init_acc: an accumulator pair, rows by its buffer layout (or unset until the first merge). */
static vc_tri vc_init_acc(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    const int *bufs = op->n_out >= 2 ? op->out : op->in;
    for (int j = 0; j < 2; j++)
        if (wr(d, bufs[j], msg, n) != VC_YES)
            return VC_NO;
    int32_t stamp = d->new_stamp(SELF);
    for (int j = 0; j < 2; j++) {
        int b = bufs[j];
        vc_val *v = d->tmp(SELF, 0);
        v->written = 1;
        v->src = j == 0 ? SRC_O : SRC_LSE;
        v->stamp = stamp;
        d->shape(SELF, v, tok_of_layout(d->prog->buffers[b].tokens), VC_H_BUF, b, NULL);
        vc_tri t = vc_store(d, b, v, msg, n);
        if (t != VC_YES)
            return t;
    }
    return VC_YES;
}

/* attn: K and V one block, query rows set, GQA heads; outputs the rows of q met with the keys of k. */
static vc_tri vc_attn(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    char w1[200], w2[200];
    for (int j = 0; j < 3; j++)
        if (vc_rd(d, op->in[j], msg, n) != VC_YES)
            return VC_NO;
    if (vc_contents(d, op, 0, msg, n))
        return VC_NO;
    const vc_val *Q = d->val(SELF, op->in[0]), *K = d->val(SELF, op->in[1]), *V = d->val(SELF, op->in[2]);
    vc_tri t = vc_and(d->same_tokens(SELF, K, V), d->same_heads(SELF, K, V));
    if (t == VC_NO)
        return FAULT("k (%s: %s) and v (%s: %s) do not hold the same block", NM(op->in[1]), W(K, w1), NM(op->in[2]),
                     W(V, w2));
    if (t != VC_YES)
        return UNDEC("cannot decide for every rank that k (%s) and v (%s) hold the same block", NM(op->in[1]),
                     NM(op->in[2]));
    if (d->tok_is(SELF, Q, VC_T_UNSET) == VC_YES || (!d->rep && d->tok_is(SELF, Q, VC_T_KV) == VC_YES))
        return FAULT("query input %s holds %s", NM(op->in[0]), W(Q, w1));
    vc_val *o = d->tmp(SELF, 0);
    t = d->attn_keys(SELF, op, Q, K, o, msg, n);
    if (t != VC_YES)
        return t;
    for (int j = 0; j < 2; j++)
        if (wr(d, op->out[j], msg, n) != VC_YES)
            return VC_NO;
    o->written = 1;
    o->src = SRC_O;
    o->fresh = 1;
    o->stamp = d->new_stamp(SELF);
    vc_val *ol = d->tmp(SELF, 1);
    if (!d->copy(SELF, ol, o))
        return VC_OOM;
    ol->src = SRC_LSE;
    t = vc_store(d, op->out[0], o, msg, n);
    return t == VC_YES ? vc_store(d, op->out[1], ol, msg, n) : t;
}

/* merge: the provenance rules, the accumulator's rows and heads those of the output, no key met twice. */
static vc_tri vc_merge_op(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    char w1[200], w2[200], ob[256], why[300];
    for (int j = 0; j < 2; j++)
        if (vc_rd(d, op->in[j], msg, n) != VC_YES)
            return VC_NO;
    if (vc_merge(d, op, msg, n))
        return VC_NO;
    for (int j = 0; j < 2; j++)
        if (vc_rd(d, op->out[j], msg, n) != VC_YES)
            return VC_NO;
    vc_val *A = d->val(SELF, op->in[0]), *AL = d->val(SELF, op->in[1]);
    vc_val *Acc = d->val(SELF, op->out[0]), *AccL = d->val(SELF, op->out[1]);
    vc_tri t = d->tok_is(SELF, Acc, VC_T_UNSET) == VC_YES ? VC_YES : d->same_tokens(SELF, Acc, A);
    const char *what = "query rows";
    if (t == VC_YES) {
        t = d->same_heads(SELF, Acc, A);
        what = "query heads";
    }
    if (t == VC_NO)
        return FAULT("the accumulator %s (%s) and the attention output %s (%s) hold other %s", NM(op->out[0]),
                     W(Acc, w1), NM(op->in[0]), W(A, w2), what);
    if (t != VC_YES)
        return UNDEC("cannot decide for every rank that the accumulator %s and the attention output %s hold the same "
                     "%s",
                     NM(op->out[0]), NM(op->in[0]), what);
    for (int j = 0; j < 2; j++)
        if (wr(d, op->out[j], msg, n) != VC_YES)
            return VC_NO;
    if (Acc->kvcov + A->kvcov > 1)
        return FAULT("query rows of %s meet the %s keys/values twice (%s, from %s)", W(A, w1),
                     d->rep ? "replicated segments'" : "cross-attention", NM(op->in[0]), d->writer(SELF, op->in[0]));
    why[0] = 0;
    t = d->merge_keys(SELF, Acc, A, why, sizeof why); /* in place: a fault ends the proof */
    if (t == VC_NO) {
        snprintf(ob, sizeof ob, "%s", d->writer(SELF, op->in[0]));
        return FAULT("query rows of %s meet %s twice: the attention output in %s (from %s) repeats a block already "
                     "merged into %s",
                     W(A, w1), why, NM(op->in[0]), ob, NM(op->out[0]));
    }
    if (t == VC_UNDECIDED)
        return UNDEC("cannot decide for every rank and step that the block merged from %s is new in %s: %s",
                     NM(op->in[0]), NM(op->out[0]), why);
    if (t != VC_YES)
        return t;
    Acc->kvcov += A->kvcov;
    Acc->final = 0;
    Acc->fresh = 0;
    int32_t lstamp = AccL->stamp;
    vc_val *accl = d->tmp(SELF, 1);
    if (!d->copy(SELF, accl, Acc))
        return VC_OOM;
    accl->src = SRC_LSE;
    accl->stamp = lstamp;
    A->merged = AL->merged = 1;
    A->fresh = AL->fresh = 0;
    d->put(SELF, op->out[0], Acc); /* (its own value: the writer only) */
    d->put(SELF, op->out[1], accl);
    return VC_YES;
}

/* copy: every pair; heads selected; an attention result leaving for O / OUTPUT must be complete. */
static vc_tri vc_copy(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    for (int j = 0; j < op->n_in; j++) {
        int bi = op->in[j], bo = op->out[j];
        if (vc_rd(d, bi, msg, n) != VC_YES)
            return VC_NO;
        vc_val *v = d->tmp(SELF, 0);
        if (!d->copy(SELF, v, d->val(SELF, bi)))
            return VC_OOM;
        v->fresh = 0;
        v->merged = 0;
        vc_tri t = d->select_heads(SELF, v, bo, bi, msg, n);
        if (t != VC_YES)
            return t;
        const cpc_buffer *BO = &d->prog->buffers[bo];
        if (src_is_attn(v->src) && (BO->role == CPC_ROLE_O || BO->io == CPC_IO_OUTPUT)) {
            t = vc_complete(d, d->val(SELF, bi), NM(bi), msg, n);
            if (t != VC_YES)
                return t;
            v->final = 1;
        }
        if (wr(d, bo, msg, n) != VC_YES)
            return VC_NO;
        t = vc_store(d, bo, v, msg, n);
        if (t != VC_YES)
            return t;
    }
    return VC_YES;
}

/* swap: each value must fit the other buffer. */
static vc_tri vc_swap(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    char why[512];
    /* in flight: the lifetime rule (REBIND) already ran (vc_operands_in_flight) */
    d->exchange(SELF, op->in[0], op->in[1]);
    for (int j = 0; j < 2; j++) {
        vc_val *v = d->val(SELF, op->in[j]);
        vc_tri t = fits(d, op->in[j], v, why, sizeof why);
        if (t != VC_YES)
            return NOT_YES(t, "%safter the swap, %s", t == VC_NO ? "" : "cannot decide for every rank whether, ", why);
    }
    return VC_YES;
}

/* send/recv before posting. */
static vc_tri vc_post_operands(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    bool is_send = op->kind == CPC_OP_SEND;
    int nb = is_send ? op->n_in : op->n_out;
    const int *bufs = is_send ? op->in : op->out;
    for (int j = 0; j < nb; j++) {
        if (is_send) {
            if (vc_rd(d, bufs[j], msg, n) != VC_YES)
                return VC_NO;
            vc_val *v = d->val(SELF, bufs[j]);
            if (src_is_attn(v->src)) {
                if (!d->p2p_attn)
                    return UNDEC("sends attention data (only q, k and v travel point to point in the symbolic "
                                 "proof)");
                vc_tri t = vc_complete(d, v, NM(bufs[j]), msg, n);
                if (t != VC_YES)
                    return t;
            }
        } else if (wr(d, bufs[j], msg, n) != VC_YES) {
            return VC_NO;
        }
        for (int k = 0; k < j; k++)
            if (bufs[k] == bufs[j])
                return FAULT("names buffer %s twice", NM(bufs[j]));
    }
    return VC_YES;
}

vc_tri vc_arrive(const vc_domain *d, int nbs, const int *sbufs, int nbr, const int *rbufs, vc_val *const *snap,
                 const void *rq, char *msg, size_t n)
{
    char w1[200], blk[100], why[512], from[64], sop[256];
#define SENDER() d->sender(SELF, rq, from, sizeof from, sop, sizeof sop)
    if (nbs != nbr)
        return SENDER(), FAULT("receives %d buffer(s) from %s, which sends %d (%s)", nbr, from, nbs, sop);
    for (int j = 0; j < nbs; j++) {
        vc_val *in = snap[j];
        int rb = rbufs[j];
        vc_tri t = d->declared(SELF, in, rq, blk, sizeof blk);
        if (t == VC_NO)
            return SENDER(), FAULT("declares that %s arrives in %s, but %s sends %s from %s (%s)", blk, NM(rb), from,
                                   W(in, w1), NM(sbufs[j]), sop);
        if (t != VC_YES)
            return UNDEC("cannot decide for every rank that the block declared arrives in %s", NM(rb));
        t = fits(d, rb, in, why, sizeof why);
        if (t == VC_NO)
            return SENDER(), FAULT("what %s sends (%s of %s from %s, %s) does not fit: %s", from,
                                   src_names_of(in->src), W(in, w1), NM(sbufs[j]), sop, why);
        if (t != VC_YES)
            return UNDEC("cannot decide for every rank whether %s", why);
        int es = cpc_buffer_elem_size(d->prog, sbufs[j]), er = cpc_buffer_elem_size(d->prog, rb);
        if (es != er)
            return SENDER(), FAULT("expects elements of %d bytes in %s but %s sends %d-byte elements from %s (%s)",
                                   er, NM(rb), from, es, NM(sbufs[j]), sop);
    }
    return VC_YES;
#undef SENDER
}

vc_tri vc_coll_inputs(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    char w1[200];
    if (op->kind == CPC_OP_BARRIER)
        return VC_YES;
    for (int j = 0; j < op->n_in; j++) {
        vc_val *in = d->val(SELF, op->in[j]);
        vc_tri t = src_is_attn(in->src) ? vc_complete(d, in, NM(op->in[j]), msg, n) : VC_YES;
        if (t != VC_YES)
            return t;
        if (op->kind == CPC_OP_ALL_TO_ALL && !(op->dir == CPC_A2A_SEQ_TO_HEADS) && d->rep &&
            d->prog->buffers[op->in[j]].tokens == CPC_TOK_KV) {
            /* heads_to_seq of replicated rows: every member's head part, whole rows */
            t = vc_and(d->tok_is(SELF, in, VC_T_KV), d->heads_are(SELF, in, VC_H_PART));
            if (t != VC_YES)
                return NOT_YES(t, "all_to_all heads_to_seq of replicated rows needs them with the rank's head part in "
                               "%s, which holds %s%s", NM(op->in[j]), W(in, w1), t == VC_NO ? "" : " on some ranks only");
        } else if (op->kind == CPC_OP_ALL_TO_ALL) {
            bool s2h = op->dir == CPC_A2A_SEQ_TO_HEADS;
            t = vc_and(d->tok_is(SELF, in, s2h ? VC_T_OWN : VC_T_BLOCK),
                       d->heads_are(SELF, in, s2h ? VC_H_ALL : VC_H_PART));
            if (t != VC_YES)
                return NOT_YES(t, "all_to_all %s needs %s with %s in %s, which holds %s%s", cpc_a2a_dir_name(op->dir),
                               s2h ? "the rank's own shard" : "its ring block", s2h ? "all heads" : "the rank's head part",
                               NM(op->in[j]), W(in, w1), t == VC_NO ? "" : " on some ranks only");
        } else if (op->kind == CPC_OP_ALL_GATHER) {
            t = d->tok_is(SELF, in, VC_T_BLOCK);
            if (t != VC_YES)
                return NOT_YES(t, "all_gather needs this member's ring block in %s, which holds %s%s", NM(op->in[j]),
                               W(in, w1), t == VC_NO ? "" : " on some ranks only");
        }
    }
    return VC_YES;
}

vc_tri vc_coll_outputs(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    if (op->kind == CPC_OP_BARRIER)
        return VC_YES;
    int nio = op->n_in < op->n_out ? op->n_in : op->n_out;
    if (nio > CPC_OP_MAX_BUFS)
        nio = CPC_OP_MAX_BUFS; /* checked statically */
    vc_val *outv[CPC_OP_MAX_BUFS];
    for (int j = 0; j < nio; j++) {
        const vc_val *in = d->val(SELF, op->in[j]);
        vc_val *o = outv[j] = d->tmp(SELF, j);
        o->written = 1;
        o->src = in->src;
        o->final = in->final;
        if (op->kind == CPC_OP_ALL_TO_ALL && op->dir == CPC_A2A_SEQ_TO_HEADS)
            d->shape(SELF, o, VC_T_BLOCK, VC_H_PART, -1, NULL);
        else if (op->kind == CPC_OP_ALL_TO_ALL && d->rep && d->prog->buffers[op->in[j]].tokens == CPC_TOK_KV)
            d->shape(SELF, o, VC_T_KV, VC_H_ALL, -1, NULL); /* replicated rows, every head */
        else if (op->kind == CPC_OP_ALL_TO_ALL)
            d->shape(SELF, o, VC_T_OWN, VC_H_ALL, -1, NULL);
        else
            d->shape(SELF, o, VC_T_ALL, VC_H_LIKE, -1, in);
    }
    for (int j = 0; j < op->n_in; j++)
        d->val(SELF, op->in[j])->fresh = 0;
    for (int j = 0; j < nio; j++) {
        if (wr(d, op->out[j], msg, n) != VC_YES)
            return VC_NO;
        vc_tri t = vc_store(d, op->out[j], outv[j], msg, n);
        if (t != VC_YES)
            return t;
    }
    return VC_YES;
}

vc_tri vc_output(const vc_domain *d, int b, char *msg, size_t n)
{
    char w1[200], why[600] = "";
    vc_val *v = d->val(SELF, b);
    if (!v->written)
        return FAULT("the OUTPUT buffer %s is never written", NM(b));
    if (d->grad_op && cpc_content_of_role(d->prog->buffers[b].role) == CPC_CONTENT_GRAD) {
        /* a gradient (the backward domain): its rows and exactly-once coverage are the domain's rule */
        vc_tri t = v->src != CPC_CONTENT_GRAD ? VC_NO : d->covered(SELF, v, NM(b), why, sizeof why);
        if (t == VC_YES || t == VC_OOM)
            return t;
        return NOT_YES(t, "the OUTPUT buffer %s: %s", NM(b), why[0] ? why : "does not hold a gradient");
    }
    if (!src_is_attn(v->src))
        return FAULT("the OUTPUT buffer %s ends holding %s data, not the attention output", NM(b),
                     src_names_of(v->src));
    bool kv = d->rep && d->prog->buffers[b].tokens == CPC_TOK_KV; /* the replicated rows' output */
    vc_tri t = vc_and(d->tok_is(SELF, v, kv ? VC_T_KV : VC_T_OWN), d->heads_are(SELF, v, VC_H_ALL));
    if (t != VC_YES)
        return NOT_YES(t, "%sthe OUTPUT buffer %s ends holding %s, not this rank's shard (or replicated rows) with all heads (last written "
                          "by %s)",
                       t == VC_NO ? "" : "cannot decide for every rank whether ", NM(b), W(v, w1), d->writer(SELF, b));
    return vc_complete(d, v, NM(b), msg, n);
}

static vc_tri vc_wait(const vc_domain *d, int tag, char *msg, size_t n);

/* A collective on any domain: its inputs are read, then it runs when
 * every member is here (the domain's meet; at once without one). */
static vc_tri vc_collective(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    for (int j = 0; j < op->n_in; j++) {
        vc_tri t = vc_rd(d, op->in[j], msg, n);
        if (t != VC_YES)
            return t;
    }
    if (d->meet)
        return d->meet(SELF, op);
    vc_tri t = vc_coll_inputs(d, op, msg, n);
    return t == VC_YES ? vc_coll_outputs(d, op, msg, n) : t;
}

vc_tri vc_step(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    if (vc_operands_in_flight(d, op, msg, n))
        return VC_NO;
    switch (op->kind) {
    case CPC_OP_INIT_ACC:
        if (d->grad_op && (op->block || op->n_out != 2 ||
                           cpc_content_of_role(d->prog->buffers[op->out[0]].role) == CPC_CONTENT_GRAD))
            return d->grad_op(SELF, op, msg, n); /* a gradient accumulator (a backward program) */
        return vc_init_acc(d, op, msg, n);
    case CPC_OP_ATTN: return vc_attn(d, op, msg, n);
    case CPC_OP_MERGE: return vc_merge_op(d, op, msg, n);
    case CPC_OP_COPY: return vc_copy(d, op, msg, n);
    case CPC_OP_SWAP: return vc_swap(d, op, msg, n);
    case CPC_OP_SEND:
    case CPC_OP_RECV: {
        vc_tri t = vc_post_operands(d, op, msg, n);
        return t == VC_YES ? d->post(SELF, op) : t;
    }
    case CPC_OP_WAIT: return vc_wait(d, op->tag, msg, n);
    case CPC_OP_ALL_TO_ALL:
    case CPC_OP_ALL_GATHER:
    case CPC_OP_BARRIER: return vc_collective(d, op, msg, n);
    default:
        if (d->grad_op && (int)op->kind >= 0 && op->kind < CPC_OP__COUNT &&
            (cpc_op_info_of(op->kind)->flags & CPC_OPF_BWD))
            return vc_contents(d, op, 1, msg, n)                                          ? VC_NO
                   : cpc_op_info_of(op->kind)->match == CPC_MATCH_COLLECTIVE ? vc_collective(d, op, msg, n)
                                                                              : d->grad_op(SELF, op, msg, n);
        if ((int)op->kind >= 0 && op->kind < CPC_OP__COUNT)
            return FAULT("op %s is not allowed in a forward program", cpc_op_kind_name(op->kind));
        return FAULT("unknown op kind %d", (int)op->kind);
    }
}

/* ---- every domain's message layer and diagnostics ------------------------------------------ */

const char *vc_op_desc(const vc_node *nd, int64_t slo, int64_t shi, char *buf, size_t n)
{
    const char *kind = nd ? cpc_op_kind_name(nd->op->kind) : NULL;
    char path[256];
    if (!nd)
        snprintf(buf, n, "the end of the program");
    else if (!nd->in_loop || shi <= slo) /* (no step: the loop's guards are being read) */
        snprintf(buf, n, "%s %s", vc_node_path(nd, path, sizeof path), kind);
    else if (shi - slo == 1)
        snprintf(buf, n, "%s %s (step %" PRId64 ")", vc_node_path(nd, path, sizeof path), kind, slo);
    else
        snprintf(buf, n, "%s %s (steps %" PRId64 "..%" PRId64 ")", vc_node_path(nd, path, sizeof path), kind, slo,
                 shi - 1);
    return buf;
}

void vc_deadlock(const vc_rq *q, const char *all, const char *who, const char *why, char *msg, size_t n)
{
    char ob[256];
    snprintf(msg, n, "deadlock: %s: its %s %s %s (%s, tag %d) has no matching %s posted before this wait (%s)", all,
             q->is_send ? "send" : "recv", q->is_send ? "to" : "from", who, vc_op_desc(q->on, q->slo, q->shi, ob, sizeof ob),
             q->tag, q->is_send ? "recv" : "send", why);
}

cpc_status *vc_fault(cpc_span span, bool bwd, int64_t p, int64_t U, const char *where, const char *fmt, va_list ap)
{
    char msg[1024];
    const char *dir = bwd ? " (backward program)" : "";
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (p >= 0)
        return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, span,
                        "schedule verification failed%s: rank %" PRId64 " (r %" PRId64 ", u %" PRId64 "), %s: %s", dir,
                        p, p / U, p % U, where ? where : "the end of the program", msg);
    return cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, span, "schedule verification failed%s: %s%s%s", dir,
                    where ? where : "", where ? ": " : "", msg);
}

#define SNAP(d, snap, j) ((vc_val *)((char *)(snap) + (size_t)(j) * (d)->val_size))

int vc_pool_new(vc_pool *pl, vc_open *o)
{
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 8, *v = realloc(o->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        o->v = v;
        o->cap = cap;
    }
    int id = pl->free;
    if (id >= 0) {
        pl->free = VC_POOL_AT(pl, id)->next;
    } else {
        if (pl->n == pl->cap) {
            int cap = pl->cap ? 2 * pl->cap : 64;
            void *v = realloc(pl->v, (size_t)cap * pl->size);
            if (!v)
                return -1;
            pl->v = v;
            pl->cap = cap;
        }
        id = pl->n++;
    }
    vc_rq *q = VC_POOL_AT(pl, id);
    memset(q, 0, pl->size);
    q->used = true;
    q->next = -1;
    o->v[o->n++] = id;
    return id;
}

static void pool_release(vc_pool *pl, int id)
{
    vc_rq *q = VC_POOL_AT(pl, id);
    pl->release(q);
    q->used = false;
    q->next = pl->free;
    pl->free = id;
}

void vc_pool_drop_done(vc_pool *pl, vc_open *o)
{
    int k = 0;
    for (int i = 0; i < o->n; i++) {
        vc_rq *q = VC_POOL_AT(pl, o->v[i]);
        if (!q->done) {
            o->v[k++] = o->v[i];
        } else if (q->used && q->match >= 0 && VC_POOL_AT(pl, q->match)->done) {
            int other = q->match;
            pool_release(pl, o->v[i]);
            pool_release(pl, other);
        }
    }
    o->n = k;
}

void vc_queue_push(vc_pool *pl, int *head, int *tail, int id)
{
    VC_POOL_AT(pl, id)->next = -1;
    if (*tail >= 0)
        VC_POOL_AT(pl, *tail)->next = id;
    else
        *head = id;
    *tail = id;
}

int vc_queue_pop(vc_pool *pl, int *head, int *tail)
{
    int id = *head;
    if (id >= 0 && (*head = VC_POOL_AT(pl, id)->next) < 0)
        *tail = -1;
    return id;
}

void vc_pool_free(vc_pool *pl)
{
    for (int i = 0; i < pl->n; i++)
        if (VC_POOL_AT(pl, i)->used)
            pl->release(VC_POOL_AT(pl, i));
    free(pl->v);
    *pl = (vc_pool){.size = pl->size, .free = -1, .release = pl->release};
}

void vc_inputs(const vc_domain *d)
{
    for (int b = 0; b < d->prog->n_buffers; b++) {
        const cpc_buffer *B = &d->prog->buffers[b];
        if (B->io != CPC_IO_INPUT)
            continue;
        vc_val *v = d->val(SELF, b);
        v->written = 1;
        v->src = (uint8_t)src_of_role(B->role);
        d->shape(SELF, v, B->tokens == CPC_TOK_KV ? VC_T_KV : VC_T_OWN, VC_H_BUF, b, NULL);
    }
}

#define RQ_SNAP(d, q) ((void *)((char *)(q) + (d)->snap_off))

bool vc_post(const vc_domain *d, const cpc_op *op, int id)
{
    vc_rq *q = d->rq(SELF, id);
    q->is_send = op->kind == CPC_OP_SEND;
    q->done = false;
    q->match = -1;
    q->tag = op->tag;
    q->group = op->group;
    q->nb = q->is_send ? op->n_in : op->n_out; /* checked by vc_step */
    for (int j = 0; j < q->nb; j++) {
        int b = q->bufs[j] = q->is_send ? op->in[j] : op->out[j];
        if (q->is_send) {
            vc_val *v = d->val(SELF, b);
            if (!d->copy(SELF, SNAP(d, RQ_SNAP(d, q), j), v))
                return false;
            v->fresh = 0;
            d->nsend[b]++;
        } else {
            d->rpend[b] = id;
        }
    }
    return true;
}

/* A wait for tag on the domain's rank: VC_BLOCKED with the domain at the
 * first request in flight with that tag not matched yet (nothing done: the
 * domain blocks the rank or reports a deadlock); else completes each with
 * that tag, on the domain at its op (d->at): a send's buffers are one send
 * less in flight; a recv stores what arrived (its snapshots, moved: written,
 * read by no op yet) by vc_store; each is marked done. */
static vc_tri vc_wait(const vc_domain *d, int tag, char *msg, size_t n)
{
    for (int i = 0, k; (k = d->open(SELF, i)) >= 0; i++) {
        const vc_rq *q = d->rq(SELF, k);
        if (!q->done && q->tag == tag && q->match < 0)
            return d->at(SELF, q), VC_BLOCKED;
    }
    for (int i = 0, k; (k = d->open(SELF, i)) >= 0; i++) {
        vc_rq *q = d->rq(SELF, k);
        if (q->done || q->tag != tag)
            continue;
        d->at(SELF, q);
        for (int j = 0; j < q->nb; j++) {
            int b = q->bufs[j];
            if (q->is_send) {
                d->nsend[b]--;
                continue;
            }
            d->rpend[b] = -1;
            vc_val *v = SNAP(d, RQ_SNAP(d, q), j);
            v->written = 1;
            v->fresh = 0;
            vc_tri t = vc_store(d, b, v, msg, n);
            if (t != VC_YES)
                return t;
        }
        q->done = true;
    }
    return VC_YES;
}

vc_tri vc_match(const vc_domain *d, int sid, int rid, char *msg, size_t n)
{
    vc_rq *s = d->rq(SELF, sid), *r = d->rq(SELF, rid);
    s->match = rid;
    r->match = sid;
    vc_val *snap[CPC_OP_MAX_BUFS];
    for (int j = 0; j < s->nb; j++)
        d->deliver(SELF, snap[j] = SNAP(d, RQ_SNAP(d, r), j), SNAP(d, RQ_SNAP(d, s), j), s);
    return vc_arrive(d, s->nb, s->bufs, r->nb, r->bufs, snap, r, msg, n);
}

vc_tri vc_finish(const vc_domain *d, char *msg, size_t n)
{
    for (int i = 0, k; (k = d->open(SELF, i)) >= 0; i++) {
        const vc_rq *q = d->rq(SELF, k);
        if (q->done)
            continue;
        const char *what = q->is_send ? "send" : "recv", *other = q->is_send ? "recv" : "send";
        d->at(SELF, q);
        if (q->match >= 0)
            snprintf(msg, n, "this %s (tag %d) is never completed: no `wait tag %d` after it", what, q->tag, q->tag);
        else if (q->peer >= 0)
            snprintf(msg, n, "this %s %s rank %d (tag %d) is never matched nor waited: rank %d posts no %s %s this "
                     "rank with tag %d", what, q->is_send ? "to" : "from", q->peer, q->tag, q->peer, other,
                     q->is_send ? "from" : "to", q->tag);
        else
            snprintf(msg, n, "this %s (tag %d) is never matched nor waited: no %s with tag %d meets it", what, q->tag,
                     other, q->tag);
        return VC_NO;
    }
    for (int b = 0; b < d->prog->n_buffers; b++) {
        if (d->prog->buffers[b].io != CPC_IO_OUTPUT)
            continue;
        d->at_writer(SELF, b);
        vc_tri t = vc_output(d, b, msg, n);
        if (t != VC_YES)
            return t;
    }
    return VC_YES;
}
