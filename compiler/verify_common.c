/* verify_common.c - the provers' shared rules (verify_common.h). */
#include "verify_common.h"

#include <stdio.h>

static const char *verb_of(cpc_access acc)
{
    return acc == CPC_ACCESS_READ    ? "reads"
           : acc == CPC_ACCESS_WRITE ? "writes"
           : acc == CPC_ACCESS_REBIND ? "swaps"
                                      : "accumulates into";
}

/* " (op, tag t, from rank p)" */
static void req_words(const vc_req *q, const char *dir, char *buf, size_t n)
{
    if (q->tag < 0 && !q->op) {
        buf[0] = 0;
        return;
    }
    char peer[48] = "";
    if (q->peer >= 0)
        snprintf(peer, sizeof peer, ", %s rank %d", dir, q->peer);
    snprintf(buf, n, " (%s%stag %d%s)", q->op ? q->op : "", q->op ? ", " : "", q->tag, peer);
}

/* " tag t" of the wait that completes q ("" when the domain does not know) */
static const char *wait_words(const vc_req *q, char *buf, size_t n)
{
    if (q->tag < 0)
        buf[0] = 0;
    else
        snprintf(buf, n, " tag %d", q->tag);
    return buf;
}

const char *vc_in_flight(const vc_domain *d, int b, cpc_access acc, char *msg, size_t n)
{
    if (acc == CPC_ACCESS_NONE)
        return NULL;
    vc_req q = {NULL, -1, -1};
    char w[320], wt[32];
    if (d->recv_on(d->self, b, &q)) {
        req_words(&q, "from", w, sizeof w);
        snprintf(msg, n, "%s %s while the recv into it%s is not complete (in flight): no `wait%s` between them",
                 verb_of(acc), d->name(d->self, b), w, wait_words(&q, wt, sizeof wt));
        return msg;
    }
    if (acc != CPC_ACCESS_READ && d->send_on(d->self, b, &q)) {
        req_words(&q, "to", w, sizeof w);
        snprintf(msg, n, "%s %s while a send from it is in flight%s: no `wait%s` between them",
                 acc == CPC_ACCESS_WRITE ? "overwrites" : verb_of(acc), d->name(d->self, b), w,
                 wait_words(&q, wt, sizeof wt));
        return msg;
    }
    return NULL;
}

const char *vc_operands_in_flight(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    if (!info)
        return NULL;
    for (int j = 0; j < op->n_in; j++)
        if (vc_in_flight(d, op->in[j], info->in_access, msg, n))
            return msg;
    for (int j = 0; j < op->n_out; j++)
        if (vc_in_flight(d, op->out[j], info->out_access, msg, n))
            return msg;
    return NULL;
}

const char *vc_read(const vc_domain *d, int b, cpc_content want, char *msg, size_t n)
{
    if (vc_in_flight(d, b, CPC_ACCESS_READ, msg, n))
        return msg;
    if (!d->written(d->self, b)) {
        snprintf(msg, n, "reads %s before it is written%s", d->name(d->self, b),
                 want == CPC_CONTENT_DELTA ? " (no delta op computed it)" : "");
        return msg;
    }
    return NULL;
}

const char *vc_contents(const vc_domain *d, const cpc_op *op, int base, char *msg, size_t n)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    for (int i = 0; info && i < op->n_in && i < CPC_OP_MAX_BUFS; i++) {
        cpc_content want = (cpc_content)info->in_content[i];
        if (want == CPC_CONTENT_NONE)
            continue;
        if (!d->written(d->self, op->in[i])) {
            snprintf(msg, n, "reads %s before it is written%s", d->name(d->self, op->in[i]),
                     want == CPC_CONTENT_DELTA ? " (no delta op computed it)" : "");
            return msg;
        }
        int got = d->content(d->self, op->in[i]);
        if (got != (int)want) {
            snprintf(msg, n, "input %d (%s) holds %s data, not %s (operands are identified by what made them, "
                             "not by role)",
                     i + base, d->name(d->self, op->in[i]), cpc_content_name((cpc_content)got),
                     cpc_content_name(want));
            return msg;
        }
    }
    return NULL;
}

const char *vc_write(const vc_domain *d, int b, char *msg, size_t n)
{
    if (vc_in_flight(d, b, CPC_ACCESS_WRITE, msg, n))
        return msg;
    if (d->written(d->self, b) && d->fresh(d->self, b)) {
        snprintf(msg, n,
                 "overwrites the attention output in %s (written by %s) before any op used it: a block attended "
                 "twice, or a merge missing",
                 d->name(d->self, b), d->writer(d->self, b));
        return msg;
    }
    return NULL;
}

const char *vc_merge(const vc_domain *d, const cpc_op *op, char *msg, size_t n)
{
    vc_req q;
    for (int j = 0; j < 2; j++) {
        int b = op->out[j];
        if (!d->recv_on(d->self, b, &q) && !d->written(d->self, b)) {
            snprintf(msg, n, "merges into %s, which is not initialised (no init_acc or attn before)",
                     d->name(d->self, b));
            return msg;
        }
    }
    const signed char *mc = cpc_op_info_of(CPC_OP_MERGE)->in_content; /* o, lse: the op table */
    int a = op->in[0], al = op->in[1], acc = op->out[0], accl = op->out[1];
    if (d->content(d->self, a) != mc[0] || d->content(d->self, al) != mc[1] ||
        d->stamp(d->self, a) != d->stamp(d->self, al)) {
        snprintf(msg, n, "inputs %s and %s are not the output and LSE of one attention block", d->name(d->self, a),
                 d->name(d->self, al));
        return msg;
    }
    if (d->content(d->self, acc) != CPC_CONTENT_OUT || d->content(d->self, accl) != CPC_CONTENT_LSE ||
        d->stamp(d->self, acc) != d->stamp(d->self, accl)) {
        snprintf(msg, n, "outputs %s and %s are not one accumulator and its LSE", d->name(d->self, acc),
                 d->name(d->self, accl));
        return msg;
    }
    if (a == acc || d->stamp(d->self, a) == d->stamp(d->self, acc)) {
        snprintf(msg, n, "merges %s into itself", d->name(d->self, acc));
        return msg;
    }
    if (d->merged(d->self, a)) {
        snprintf(msg, n,
                 "merges the attention output in %s (written by %s) a second time: no attn wrote it since the last "
                 "merge",
                 d->name(d->self, a), d->writer(d->self, a));
        return msg;
    }
    return NULL;
}
