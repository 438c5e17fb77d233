/*
 * test_transport_callback.c - the transport conformance suite
 * (tests/transport_conformance.h) on the callback transport
 * (runtime/transport/transport_callback.h: what cpc_rank_create_callbacks and
 * Python's torch.distributed path use), meshes (P,1), (1,P), (2,2), (2,4).
 *
 * The callbacks are a stand-in for a caller's library: isend / irecv / wait
 * on the WORLD group of a local endpoint (one thread per rank), the handle
 * being the local request.  Every ring rotation, all-to-all, all-gather and
 * barrier of the suite is thus built from the callback transport's own
 * point-to-point composition.  Skipped: CPC_CONF_ABORT (the callback
 * transport's abort only fails its own later calls; a peer blocked in the
 * caller's library is that library's to time out, which the local stand-in
 * would only do at its 30 s timeout).
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "transport_callback.h"
#include "transport_conformance.h"
#include "transport_local.h"

typedef struct owner {        /* the endpoint under test + the local one it uses */
    cpc_transport base;
    cpc_transport *cb;
    cpc_transport *local;
    int fail_after;           /* > 0: the n-th isend fails (error path test) */
    int sends;
} owner;

static int cb_post(void *user, bool is_recv, int peer, void *buf, size_t bytes, int tag,
                   int64_t *handle)
{
    owner *o = user;
    if (!is_recv && o->fail_after > 0 && ++o->sends >= o->fail_after)
        return 42;
    cpc_request *r = NULL;
    cpc_status *st = is_recv ? cpc_transport_irecv(o->local, CPC_GROUP_WORLD, peer, buf, bytes,
                                                   tag, &r)
                             : cpc_transport_isend(o->local, CPC_GROUP_WORLD, peer, buf, bytes,
                                                   tag, &r);
    if (st) {
        cpc_status_free(st);
        return 1;
    }
    *handle = (int64_t)(intptr_t)r;
    return 0;
}

static int cb_isend(void *user, int peer, const void *buf, size_t bytes, int tag, int64_t *h)
{
    return cb_post(user, false, peer, (void *)buf, bytes, tag, h);
}

static int cb_irecv(void *user, int peer, void *buf, size_t bytes, int tag, int64_t *h)
{
    return cb_post(user, true, peer, buf, bytes, tag, h);
}

static int cb_wait(void *user, int64_t h)
{
    owner *o = user;
    cpc_status *st = cpc_transport_wait(o->local, (cpc_request *)(intptr_t)h);
    if (st) {
        cpc_status_free(st);
        return 2;
    }
    return 0;
}

/* The owner delegates everything to the callback endpoint and destroys both. */
static cpc_transport *cbt(cpc_transport *t) { return ((owner *)t->ctx)->cb; }
static int o_group_rank(cpc_transport *t, cpc_group g) { return cpc_transport_group_rank(cbt(t), g); }
static int o_group_size(cpc_transport *t, cpc_group g) { return cpc_transport_group_size(cbt(t), g); }
static cpc_status *o_isend(cpc_transport *t, cpc_group g, int peer, const void *buf, size_t bytes,
                           int tag, cpc_request **req)
{ return cpc_transport_isend(cbt(t), g, peer, buf, bytes, tag, req); }
static cpc_status *o_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                           int tag, cpc_request **req)
{ return cpc_transport_irecv(cbt(t), g, peer, buf, bytes, tag, req); }
static cpc_status *o_wait(cpc_transport *t, cpc_request *req) { return cpc_transport_wait(cbt(t), req); }
static cpc_status *o_a2a(cpc_transport *t, cpc_group g, const void *s, const size_t *sc,
                         const size_t *sd, void *r, const size_t *rc, const size_t *rd)
{ return cpc_transport_all_to_all_v(cbt(t), g, s, sc, sd, r, rc, rd); }
static cpc_status *o_ag(cpc_transport *t, cpc_group g, const void *s, size_t sb, void *r,
                        const size_t *c, const size_t *d)
{ return cpc_transport_all_gather_v(cbt(t), g, s, sb, r, c, d); }
static cpc_status *o_barrier(cpc_transport *t, cpc_group g) { return cpc_transport_barrier(cbt(t), g); }
static void o_abort(cpc_transport *t, const char *why)
{
    cpc_transport_abort(cbt(t), why);
    cpc_transport_abort(((owner *)t->ctx)->local, why);   /* wake the stand-in's waiters */
}
static void o_destroy(cpc_transport *t)
{
    owner *o = t->ctx;
    cpc_transport_destroy(o->cb);
    cpc_transport_destroy(o->local);
    free(o);
}

static const cpc_transport_vtable owner_vt = {
    .name = "callback", .group_rank = o_group_rank, .group_size = o_group_size,
    .isend = o_isend, .irecv = o_irecv, .wait = o_wait, .all_to_all_v = o_a2a,
    .all_gather_v = o_ag, .barrier = o_barrier, .abort = o_abort, .destroy = o_destroy,
};

typedef struct mesh { int R, U, fail_after; } mesh;

static cpc_status *wrap_callback(void *ctx, int rank, cpc_transport *inner, cpc_transport **out)
{
    const mesh *m = ctx;
    owner *o = calloc(1, sizeof *o);
    if (!o)
        return &cpc_status_oom;
    o->local = inner;
    o->fail_after = m->fail_after;
    cpc_transport_p2p_fns cb = {.user = o, .isend = cb_isend, .irecv = cb_irecv, .wait = cb_wait};
    cpc_status *st = cpc_transport_callback_create(&cb, rank, m->R, m->U, &o->cb);
    if (st) {
        free(o);
        return st;
    }
    o->base.vt = &owner_vt;
    o->base.ctx = o;
    *out = &o->base;
    return NULL;
}

static const cpc_conformance_opts opts = {
    .name = "callback",
    .skip = CPC_CONF_ABORT,
    .skip_reason = "its abort fails only its own later calls (the caller's library ends the job)",
    .large_bytes = 0,
    .same_clock = true,
    .log = NULL,
};

static cpc_status *run(int R, int U, int fail_after)
{
    cpc_local_world *w = NULL;
    cpc_status *st = cpc_local_world_create(R, U, &w);
    if (st)
        return st;
    cpc_local_world_set_timeout(w, 30.0);
    mesh m = {R, U, fail_after};
    cpc_status *all = cpc_conformance_local_threads(w, R, U, wrap_callback, &m, &opts);
    cpc_local_world_destroy(w);
    return all;
}

static void expect_pass(int R, int U)
{
    cpc_status *st = run(R, U, 0);
    if (st)
        cpc_status_print(st, stderr, "test_transport_callback");
    cr_expect_null(st, "callback transport failed the conformance suite on mesh %d x %d (first: %s)",
                   R, U, st ? st->message : "");
    cpc_status_free(st);
}

TestSuite(transport_callback, .timeout = 120);

Test(transport_callback, world_1) { expect_pass(1, 1); }
Test(transport_callback, world_2) { expect_pass(2, 1); expect_pass(1, 2); }
Test(transport_callback, world_3) { expect_pass(3, 1); expect_pass(1, 3); }
Test(transport_callback, world_4) { expect_pass(4, 1); expect_pass(1, 4); }
Test(transport_callback, mesh_2x2) { expect_pass(2, 2); }
Test(transport_callback, mesh_2x4) { expect_pass(2, 4); }

/* A failing callback is a CPC_E_RUNTIME naming the callback's code, not a crash or a
 * hang (the suite then aborts the world, so every rank ends). */
Test(transport_callback, failing_callback_is_an_error)
{
    cpc_status *st = run(2, 1, 3);
    cr_expect_not_null(st, "a failing isend passed the suite");
    bool named = false;
    for (cpc_status *s = st; s; s = s->next)
        if (s->code == CPC_E_RUNTIME && strstr(s->message, "code 42"))
            named = true;
    cr_expect(named, "no error naming the callback's code 42; first: %s", st ? st->message : "");
    cpc_status_free(st);
}

Test(transport_callback, bad_arguments)
{
    cpc_transport *t = NULL;
    cpc_transport_p2p_fns none = {0};
    cpc_status *st = cpc_transport_callback_create(&none, 0, 1, 1, &t);
    cr_expect(st && st->code == CPC_E_USAGE && !t);
    cpc_status_free(st);
    cpc_transport_p2p_fns cb = {.user = NULL, .isend = cb_isend, .irecv = cb_irecv, .wait = cb_wait};
    st = cpc_transport_callback_create(&cb, 4, 2, 2, &t);
    cr_expect(st && st->code == CPC_E_USAGE && !t);
    cpc_status_free(st);
}
