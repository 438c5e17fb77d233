/* transport_staged.c - see transport_staged.h */
#include "transport_staged.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct staged {
    cpc_transport *inner;
    cpc_backend *be;
    cpc_transport_vtable vt;   /* the shared methods, with this endpoint's name */
    char name[48];
    size_t downloaded, uploaded;
} staged;

/* This file's requests; the inner transport's are opaque. */
struct cpc_request {
    cpc_request *inner;
    void *host;                /* the staging copy (owned) */
    void *dev;                 /* irecv: the device buffer to upload to */
    size_t bytes;
    bool recv;
};

static staged *S(cpc_transport *t) { return t->ctx; }

static int st_group_rank(cpc_transport *t, cpc_group g)
{
    return cpc_transport_group_rank(S(t)->inner, g);
}

static int st_group_size(cpc_transport *t, cpc_group g)
{
    return cpc_transport_group_size(S(t)->inner, g);
}

static cpc_status *host_alloc(size_t bytes, void **out)
{
    *out = malloc(bytes ? bytes : 1);
    return *out ? NULL
                : cpc_error(CPC_E_NOMEM, "staged transport: out of host memory (%zu bytes)", bytes);
}

static cpc_status *st_isend(cpc_transport *t, cpc_group g, int peer, const void *buf, size_t bytes,
                            int tag, cpc_request **req)
{
    staged *s = S(t);
    *req = NULL;
    cpc_request *r = calloc(1, sizeof *r);
    if (!r)
        return cpc_error(CPC_E_NOMEM, "staged transport: out of memory");
    cpc_status *st = host_alloc(bytes, &r->host);
    if (!st && bytes) {
        st = cpc_backend_download(s->be, r->host, buf, bytes);
        if (st)
            cpc_status_prefix(st, "staged transport: isend of %zu bytes to peer %d", bytes, peer);
        else
            s->downloaded += bytes;
    }
    if (!st)
        st = cpc_transport_isend(s->inner, g, peer, r->host, bytes, tag, &r->inner);
    if (st) {
        free(r->host);
        free(r);
        return st;
    }
    r->bytes = bytes;
    *req = r;
    return NULL;
}

static cpc_status *st_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                            int tag, cpc_request **req)
{
    staged *s = S(t);
    *req = NULL;
    cpc_request *r = calloc(1, sizeof *r);
    if (!r)
        return cpc_error(CPC_E_NOMEM, "staged transport: out of memory");
    cpc_status *st = host_alloc(bytes, &r->host);
    if (!st)
        st = cpc_transport_irecv(s->inner, g, peer, r->host, bytes, tag, &r->inner);
    if (st) {
        free(r->host);
        free(r);
        return st;
    }
    r->dev = buf;
    r->bytes = bytes;
    r->recv = true;
    *req = r;
    return NULL;
}

static cpc_status *st_wait(cpc_transport *t, cpc_request *r)
{
    staged *s = S(t);
    cpc_status *st = cpc_transport_wait(s->inner, r->inner);
    if (!st && r->recv && r->bytes) {
        st = cpc_backend_upload(s->be, r->dev, r->host, r->bytes);
        if (st)
            cpc_status_prefix(st, "staged transport: upload of a %zu-byte receive", r->bytes);
        else
            s->uploaded += r->bytes;
    }
    free(r->host);
    free(r);
    return st;
}

/* Bytes from the start of a buffer to the end of its last non-empty part. */
static size_t extent(int n, const size_t *counts, const size_t *displs)
{
    size_t e = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] && displs[i] + counts[i] > e)
            e = displs[i] + counts[i];
    return e;
}

static cpc_status *upload_parts(staged *s, char *dev, const char *host, int n, const size_t *counts,
                                const size_t *displs, const char *op)
{
    for (int i = 0; i < n; i++)
        if (counts[i]) {
            cpc_status *st = cpc_backend_upload(s->be, dev + displs[i], host + displs[i], counts[i]);
            if (st) {
                cpc_status_prefix(st, "staged transport: %s: upload of member %d's %zu bytes", op,
                                  i, counts[i]);
                return st;
            }
            s->uploaded += counts[i];
        }
    return NULL;
}

static cpc_status *st_all_to_all_v(cpc_transport *t, cpc_group g, const void *send,
                                   const size_t *sc, const size_t *sd, void *recv, const size_t *rc,
                                   const size_t *rd)
{
    staged *s = S(t);
    int n = st_group_size(t, g);
    size_t se = extent(n, sc, sd), re = extent(n, rc, rd);
    void *hs = NULL, *hr = NULL;
    cpc_status *st = host_alloc(se, &hs);
    if (!st)
        st = host_alloc(re, &hr);
    if (!st && se) {
        st = cpc_backend_download(s->be, hs, send, se);
        if (st)
            cpc_status_prefix(st, "staged transport: all_to_all_v: download of %zu bytes", se);
        else
            s->downloaded += se;
    }
    if (!st)
        st = cpc_transport_all_to_all_v(s->inner, g, hs, sc, sd, hr, rc, rd);
    if (!st)
        st = upload_parts(s, recv, hr, n, rc, rd, "all_to_all_v");
    free(hs);
    free(hr);
    return st;
}

static cpc_status *st_all_gather_v(cpc_transport *t, cpc_group g, const void *send,
                                   size_t send_bytes, void *recv, const size_t *counts,
                                   const size_t *displs)
{
    staged *s = S(t);
    int n = st_group_size(t, g);
    size_t re = extent(n, counts, displs);
    void *hs = NULL, *hr = NULL;
    cpc_status *st = host_alloc(send_bytes, &hs);
    if (!st)
        st = host_alloc(re, &hr);
    if (!st && send_bytes) {
        st = cpc_backend_download(s->be, hs, send, send_bytes);
        if (st)
            cpc_status_prefix(st, "staged transport: all_gather_v: download of %zu bytes",
                              send_bytes);
        else
            s->downloaded += send_bytes;
    }
    if (!st)
        st = cpc_transport_all_gather_v(s->inner, g, hs, send_bytes, hr, counts, displs);
    if (!st)
        st = upload_parts(s, recv, hr, n, counts, displs, "all_gather_v");
    free(hs);
    free(hr);
    return st;
}

static cpc_status *st_barrier(cpc_transport *t, cpc_group g)
{
    return cpc_transport_barrier(S(t)->inner, g);
}

static void st_abort(cpc_transport *t, const char *why)
{
    cpc_transport_abort(S(t)->inner, why);
}

static void st_destroy(cpc_transport *t)
{
    if (!t)
        return;
    staged *s = S(t);
    if (s) {
        if (s->inner)
            cpc_transport_destroy(s->inner);
        free(s);
    }
    free(t);
}

static const cpc_transport_vtable staged_vt = {
    .name = "staged",
    .group_rank = st_group_rank,
    .group_size = st_group_size,
    .isend = st_isend,
    .irecv = st_irecv,
    .wait = st_wait,
    .all_to_all_v = st_all_to_all_v,
    .all_gather_v = st_all_gather_v,
    .barrier = st_barrier,
    .abort = st_abort,
    .destroy = st_destroy,
};

cpc_status *cpc_transport_staged_create(cpc_transport *inner, cpc_backend *be, cpc_transport **out)
{
    *out = NULL;
    if (!inner || !be)
        return cpc_error(CPC_E_INTERNAL, "staged transport: NULL %s", inner ? "backend" : "inner endpoint");
    cpc_transport *t = calloc(1, sizeof *t);
    staged *s = calloc(1, sizeof *s);
    if (!t || !s) {
        free(t);
        free(s);
        return cpc_error(CPC_E_NOMEM, "staged transport: out of memory");
    }
    s->inner = inner;
    s->be = be;
    s->vt = staged_vt;
    snprintf(s->name, sizeof s->name, "%s+staged", inner->vt->name ? inner->vt->name : "?");
    s->vt.name = s->name;
    t->vt = &s->vt;
    t->ctx = s;
    *out = t;
    return NULL;
}

bool cpc_transport_staged_is(const cpc_transport *t)
{
    return t && t->vt && t->vt->destroy == st_destroy;
}

void cpc_transport_staged_bytes(const cpc_transport *t, size_t *downloaded, size_t *uploaded)
{
    size_t d = 0, u = 0;
    if (cpc_transport_staged_is(t)) {
        const staged *s = t->ctx;
        d = s->downloaded;
        u = s->uploaded;
    }
    if (downloaded)
        *downloaded = d;
    if (uploaded)
        *uploaded = u;
}
