/* transport_callback.c - see transport_callback.h. */
#include "transport_callback.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

#define WIRE_SPAN (1 << 20)

struct cpc_request {
    int64_t handle;
    bool done;       /* nothing to wait for (0 bytes) */
    bool is_recv;
    int peer;        /* world rank */
    size_t bytes;
    int tag;
    struct cpc_request *prev, *next; /* the endpoint's requests not yet waited for */
};

typedef struct cb_ctx {
    cpc_transport base;
    cpc_transport_p2p_fns cb;
    int p, R, U;
    bool aborted;
    char why[160];
    struct cpc_request *live; /* posted, not waited for: freed by destroy when a failed
                                 job abandons them */
} cb_ctx;

static void link_req(struct cb_ctx *c, struct cpc_request *r)
{
    r->prev = NULL;
    r->next = c->live;
    if (c->live)
        c->live->prev = r;
    c->live = r;
}

static void unlink_req(struct cb_ctx *c, struct cpc_request *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        c->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
}

static cb_ctx *ctx_of(cpc_transport *t) { return (cb_ctx *)t->ctx; }

static const char *gname(cpc_group g)
{
    return g == CPC_GROUP_RING ? "ring" : g == CPC_GROUP_ULYSSES ? "ulysses" : g == CPC_GROUP_WORLD ? "world" : "none";
}

static int c_group_rank(cpc_transport *t, cpc_group g)
{
    cb_ctx *c = ctx_of(t);
    return g == CPC_GROUP_RING ? c->p / c->U : g == CPC_GROUP_ULYSSES ? c->p % c->U : c->p;
}

static int c_group_size(cpc_transport *t, cpc_group g)
{
    cb_ctx *c = ctx_of(t);
    return g == CPC_GROUP_RING ? c->R : g == CPC_GROUP_ULYSSES ? c->U : c->R * c->U;
}

/* The world rank of member i of group g (of this endpoint). */
static int world_of(cb_ctx *c, cpc_group g, int i)
{
    int r = c->p / c->U, u = c->p % c->U;
    return g == CPC_GROUP_RING ? i * c->U + u : g == CPC_GROUP_ULYSSES ? r * c->U + i : i;
}

static cpc_status *check_live(cb_ctx *c, const char *op)
{
    if (c->aborted)
        return cpc_error(CPC_E_RUNTIME, "rank %d: %s: the job was aborted (%s)", c->p, op, c->why);
    return NULL;
}

static bool group_ok(cpc_group g)
{
    return g == CPC_GROUP_RING || g == CPC_GROUP_ULYSSES || g == CPC_GROUP_WORLD;
}

/* Posts one message through the callbacks (world peer, wire tag). */
static cpc_status *post(cb_ctx *c, bool is_recv, int peer, void *buf, size_t bytes, int wire,
                        const char *what, cpc_request *r)
{
    r->done = bytes == 0;
    r->is_recv = is_recv;
    r->peer = peer;
    r->bytes = bytes;
    r->tag = wire;
    r->handle = 0;
    if (r->done)
        return NULL;
    int rc = is_recv ? c->cb.irecv(c->cb.user, peer, buf, bytes, wire, &r->handle)
                     : c->cb.isend(c->cb.user, peer, buf, bytes, wire, &r->handle);
    if (rc != 0)
        return cpc_error(CPC_E_RUNTIME, "rank %d: %s: %s rank %d (%zu bytes, wire tag %d) failed in "
                         "the caller's callback (code %d)", c->p, what,
                         is_recv ? "irecv from" : "isend to", peer, bytes, wire, rc);
    return NULL;
}

static cpc_status *finish(cb_ctx *c, cpc_request *r, const char *what)
{
    if (r->done)
        return NULL;
    r->done = true;
    int rc = c->cb.wait(c->cb.user, r->handle);
    if (rc != 0)
        return cpc_error(CPC_E_RUNTIME, "rank %d: %s: waiting for the %s rank %d (%zu bytes, wire "
                         "tag %d) failed in the caller's callback (code %d)", c->p, what,
                         r->is_recv ? "recv from" : "send to", r->peer, r->bytes, r->tag, rc);
    return NULL;
}

static cpc_status *p2p(cpc_transport *t, bool is_recv, cpc_group g, int peer, void *buf,
                       size_t bytes, int tag, cpc_request **req)
{
    cb_ctx *c = ctx_of(t);
    *req = NULL;
    const char *op = is_recv ? "irecv" : "isend";
    cpc_status *st = check_live(c, op);
    if (st)
        return st;
    if (!group_ok(g) || peer < 0 || peer >= c_group_size(t, g))
        return cpc_error(CPC_E_INTERNAL, "rank %d: %s: %s member %d does not exist", c->p, op,
                         gname(g), peer);
    if (tag < 0 || tag >= WIRE_SPAN)
        return cpc_error(CPC_E_RUNTIME, "rank %d: %s %s member %d: tag %d out of range [0, %d)", c->p,
                         op, gname(g), peer, tag, WIRE_SPAN);
    cpc_request *r = calloc(1, sizeof *r);
    if (!r)
        return &cpc_status_oom;
    st = post(c, is_recv, world_of(c, g, peer), buf, bytes, (int)g * WIRE_SPAN + tag, op, r);
    if (st) {
        free(r);
        c->aborted = true;
        snprintf(c->why, sizeof c->why, "rank %d: %s failed", c->p, op);
        return st;
    }
    link_req(c, r);
    *req = r;
    return NULL;
}

static cpc_status *c_isend(cpc_transport *t, cpc_group g, int peer, const void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    return p2p(t, false, g, peer, (void *)buf, bytes, tag, req);
}

static cpc_status *c_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    return p2p(t, true, g, peer, buf, bytes, tag, req);
}

static cpc_status *c_wait(cpc_transport *t, cpc_request *r)
{
    cb_ctx *c = ctx_of(t);
    if (!r)
        return cpc_error(CPC_E_INTERNAL, "rank %d: wait: NULL request", c->p);
    cpc_status *st = check_live(c, "wait");
    if (!st)
        st = finish(c, r, "wait");
    if (st && !c->aborted) {
        c->aborted = true;
        snprintf(c->why, sizeof c->why, "rank %d: a wait failed", c->p);
    }
    unlink_req(c, r);
    free(r);
    return st;
}

/* Every member j != me: recv recv_counts[j] bytes at recv + recv_displs[j] and send
 * send_counts[j] bytes from send + send_displs[j]; the own part is copied.  For
 * all_gather_v the send part is the same buffer for every member (send_displs NULL). */
static cpc_status *exchange(cb_ctx *c, cpc_group g, const char *op, const void *send,
                            const size_t *send_counts, const size_t *send_displs, size_t send_one,
                            void *recv, const size_t *recv_counts, const size_t *recv_displs)
{
    cpc_status *st = check_live(c, op);
    if (st)
        return st;
    if (!group_ok(g))
        return cpc_error(CPC_E_INTERNAL, "rank %d: %s over group %d", c->p, op, (int)g);
    int n = c_group_size(&c->base, g), me = c_group_rank(&c->base, g);
    cpc_request *reqs = calloc((size_t)2 * (size_t)n, sizeof *reqs);
    if (!reqs)
        return &cpc_status_oom;
    int wire = (4 + (int)g) * WIRE_SPAN;
    int posted = 0;
    for (int j = 0; j < n && !st; j++) {
        if (j == me)
            continue;
        st = post(c, true, world_of(c, g, j), (char *)recv + recv_displs[j], recv_counts[j], wire,
                  op, &reqs[posted]);
        if (!st)
            posted++;
    }
    for (int j = 0; j < n && !st; j++) {
        if (j == me)
            continue;
        const char *p = send_displs ? (const char *)send + send_displs[j] : (const char *)send;
        size_t b = send_displs ? send_counts[j] : send_one;
        st = post(c, false, world_of(c, g, j), (void *)p, b, wire, op, &reqs[posted]);
        if (!st)
            posted++;
    }
    if (!st) {
        size_t mine = send_displs ? send_counts[me] : send_one;
        const char *src = send_displs ? (const char *)send + send_displs[me] : (const char *)send;
        if (mine != recv_counts[me])
            st = cpc_error(CPC_E_INTERNAL, "rank %d: %s: own part %zu bytes, %zu expected", c->p, op,
                           mine, recv_counts[me]);
        else if (mine && (char *)recv + recv_displs[me] != src)
            memmove((char *)recv + recv_displs[me], src, mine);
    }
    /* wait for everything posted (also after an error: buffers must not be in flight) */
    for (int i = 0; i < posted; i++) {
        cpc_status *w = finish(c, &reqs[i], op);
        if (w && !st)
            st = w;
        else if (w)
            cpc_status_free(w);
    }
    free(reqs);
    if (st && !c->aborted) {
        c->aborted = true;
        snprintf(c->why, sizeof c->why, "rank %d: %s failed", c->p, op);
    }
    return st;
}

static cpc_status *c_all_to_all_v(cpc_transport *t, cpc_group g, const void *send,
                                  const size_t *send_counts, const size_t *send_displs, void *recv,
                                  const size_t *recv_counts, const size_t *recv_displs)
{
    return exchange(ctx_of(t), g, "all_to_all_v", send, send_counts, send_displs, 0, recv,
                    recv_counts, recv_displs);
}

static cpc_status *c_all_gather_v(cpc_transport *t, cpc_group g, const void *send,
                                  size_t send_bytes, void *recv, const size_t *counts,
                                  const size_t *displs)
{
    return exchange(ctx_of(t), g, "all_gather_v", send, NULL, NULL, send_bytes, recv, counts,
                    displs);
}

static cpc_status *c_barrier(cpc_transport *t, cpc_group g)
{
    cb_ctx *c = ctx_of(t);
    if (!group_ok(g))
        return cpc_error(CPC_E_INTERNAL, "rank %d: barrier over group %d", c->p, (int)g);
    int n = c_group_size(t, g);
    unsigned char one = 1;
    unsigned char *in = calloc((size_t)n, 1);
    size_t *cnt = calloc((size_t)n, sizeof *cnt), *dsp = calloc((size_t)n, sizeof *dsp);
    cpc_status *st = NULL;
    if (!in || !cnt || !dsp) {
        st = &cpc_status_oom;
    } else {
        for (int j = 0; j < n; j++) {
            cnt[j] = 1;
            dsp[j] = (size_t)j;
        }
        int me = c_group_rank(t, g);
        in[me] = one;
        /* the own part: recv + me, from &in[me] itself (no copy needed) */
        st = exchange(c, g, "barrier", &in[me], NULL, NULL, 1, in, cnt, dsp);
    }
    free(in);
    free(cnt);
    free(dsp);
    return st;
}

static void c_abort(cpc_transport *t, const char *why)
{
    cb_ctx *c = ctx_of(t);
    c->aborted = true;
    snprintf(c->why, sizeof c->why, "%s", why ? why : "aborted");
}

static void c_destroy(cpc_transport *t)
{
    cb_ctx *c = ctx_of(t);
    while (c->live) { /* abandoned by a failed job: nothing waits for them any more */
        struct cpc_request *r = c->live;
        c->live = r->next;
        free(r);
    }
    free(c);
}

static const cpc_transport_vtable cb_vtable = {
    .name = "callback",
    .group_rank = c_group_rank,
    .group_size = c_group_size,
    .isend = c_isend,
    .irecv = c_irecv,
    .wait = c_wait,
    .all_to_all_v = c_all_to_all_v,
    .all_gather_v = c_all_gather_v,
    .barrier = c_barrier,
    .abort = c_abort,
    .destroy = c_destroy,
    .flush = NULL,
};

cpc_status *cpc_transport_callback_create(const cpc_transport_p2p_fns *cb, int rank, int ring_degree,
                                          int ulysses_degree, cpc_transport **out)
{
    *out = NULL;
    if (!cb || !cb->isend || !cb->irecv || !cb->wait)
        return cpc_error(CPC_E_USAGE, "callback transport: isend, irecv and wait are required");
    if (ring_degree < 1 || ulysses_degree < 1 || rank < 0 || rank >= ring_degree * ulysses_degree)
        return cpc_error(CPC_E_USAGE, "callback transport: rank %d of a %d x %d mesh", rank,
                         ring_degree, ulysses_degree);
    cb_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return &cpc_status_oom;
    c->cb = *cb;
    c->p = rank;
    c->R = ring_degree;
    c->U = ulysses_degree;
    c->base.vt = &cb_vtable;
    c->base.ctx = c;
    *out = &c->base;
    return NULL;
}
