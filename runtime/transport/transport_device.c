/* transport_device.c - see transport_device.h */
#include "transport_device.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct device_ep {
    cpc_transport *inner;
    cpc_backend *be;
    cpc_transport_vtable vt;   /* the shared methods, with this endpoint's name */
    char name[48];
    size_t sent;
} device_ep;

static device_ep *E(cpc_transport *t) { return t->ctx; }

/* Waits for the work queued on this rank's stream before a buffer is exposed. */
static cpc_status *quiesce(device_ep *e, const char *op)
{
    cpc_status *st = cpc_backend_sync(e->be);
    if (st)
        cpc_status_prefix(st, "device transport: %s", op);
    return st;
}

static int d_group_rank(cpc_transport *t, cpc_group g)
{
    return cpc_transport_group_rank(E(t)->inner, g);
}

static int d_group_size(cpc_transport *t, cpc_group g)
{
    return cpc_transport_group_size(E(t)->inner, g);
}

static cpc_status *d_isend(cpc_transport *t, cpc_group g, int peer, const void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    device_ep *e = E(t);
    *req = NULL;
    cpc_status *st = quiesce(e, "isend");
    if (st)
        return st;
    st = cpc_transport_isend(e->inner, g, peer, buf, bytes, tag, req);
    if (!st)
        e->sent += bytes;
    return st;
}

static cpc_status *d_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    device_ep *e = E(t);
    *req = NULL;
    cpc_status *st = quiesce(e, "irecv");
    if (st)
        return st;
    return cpc_transport_irecv(e->inner, g, peer, buf, bytes, tag, req);
}

static cpc_status *d_wait(cpc_transport *t, cpc_request *req)
{
    return cpc_transport_wait(E(t)->inner, req);
}

static cpc_status *d_all_to_all_v(cpc_transport *t, cpc_group g, const void *send,
                                  const size_t *send_counts, const size_t *send_displs,
                                  void *recv, const size_t *recv_counts,
                                  const size_t *recv_displs)
{
    device_ep *e = E(t);
    cpc_status *st = quiesce(e, "all_to_all_v");
    if (st)
        return st;
    st = cpc_transport_all_to_all_v(e->inner, g, send, send_counts, send_displs, recv,
                                    recv_counts, recv_displs);
    if (!st) {
        int n = cpc_transport_group_size(e->inner, g), me = cpc_transport_group_rank(e->inner, g);
        for (int j = 0; j < n; j++)
            if (j != me)
                e->sent += send_counts[j];
    }
    return st;
}

static cpc_status *d_all_gather_v(cpc_transport *t, cpc_group g, const void *send,
                                  size_t send_bytes, void *recv, const size_t *counts,
                                  const size_t *displs)
{
    device_ep *e = E(t);
    cpc_status *st = quiesce(e, "all_gather_v");
    if (st)
        return st;
    st = cpc_transport_all_gather_v(e->inner, g, send, send_bytes, recv, counts, displs);
    if (!st)
        e->sent += send_bytes * (size_t)(cpc_transport_group_size(e->inner, g) - 1);
    return st;
}

static cpc_status *d_barrier(cpc_transport *t, cpc_group g)
{
    return cpc_transport_barrier(E(t)->inner, g);
}

static cpc_status *d_flush(cpc_transport *t)
{
    cpc_transport *in = E(t)->inner;
    return cpc_transport_flush(in);
}

static void d_abort(cpc_transport *t, const char *why)
{
    cpc_transport_abort(E(t)->inner, why);
}

static void d_destroy(cpc_transport *t)
{
    if (!t)
        return;
    device_ep *e = E(t);
    cpc_transport_destroy(e->inner);
    free(e);
    free(t);
}

static const cpc_transport_vtable device_vt = {
    .name = "device",
    .group_rank = d_group_rank,
    .group_size = d_group_size,
    .isend = d_isend,
    .irecv = d_irecv,
    .wait = d_wait,
    .all_to_all_v = d_all_to_all_v,
    .all_gather_v = d_all_gather_v,
    .barrier = d_barrier,
    .abort = d_abort,
    .destroy = d_destroy,
    .flush = d_flush,
};

cpc_status *cpc_transport_device_create(cpc_transport *inner, cpc_backend *be, cpc_transport **out)
{
    *out = NULL;
    if (!inner || !be)
        return cpc_error(CPC_E_INTERNAL, "device transport: NULL %s",
                         inner ? "backend" : "inner endpoint");
    cpc_transport *t = calloc(1, sizeof *t);
    device_ep *e = calloc(1, sizeof *e);
    if (!t || !e) {
        free(t);
        free(e);
        return cpc_error(CPC_E_NOMEM, "device transport: out of memory");
    }
    e->inner = inner;
    e->be = be;
    e->vt = device_vt;
    snprintf(e->name, sizeof e->name, "%s+device", inner->vt->name ? inner->vt->name : "?");
    e->vt.name = e->name;
    t->vt = &e->vt;
    t->ctx = e;
    *out = t;
    return NULL;
}

bool cpc_transport_device_is(const cpc_transport *t)
{
    return t && t->vt && t->vt->destroy == d_destroy;
}

size_t cpc_transport_device_bytes(const cpc_transport *t)
{
    return cpc_transport_device_is(t) ? ((const device_ep *)t->ctx)->sent : 0;
}

cpc_status *cpc_device_copy(void *ctx, int copier, void *dst, const void *src, size_t bytes)
{
    cpc_backend *const *bes = ctx;
    cpc_backend *be = bes[copier];
    cpc_status *st = cpc_backend_copy(be, dst, src, bytes);
    if (!st)
        st = cpc_backend_sync(be);
    return st;
}
