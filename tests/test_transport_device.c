/*
 * test_transport_device.c - the device-to-device transport of virtual ranks
 * (runtime/transport/transport_device.h) without a GPU:
 *
 *  - the transport conformance suite (tests/transport_conformance.h) on
 *    local+device endpoints whose world copies with cpc_device_copy over CPU
 *    backends;
 *  - ordering: a "lazy" backend applies uploads and copies only when synced
 *    (like a stream).  A send buffer written just before isend, a receive
 *    buffer, and collective buffers must be right at the receiver, which
 *    only holds when the decorator waits for the owner's stream before
 *    exposing a buffer; the same exchange on undecorated endpoints must come
 *    out wrong (so the test can fail);
 *  - a failing copy is reported on both sides of a transfer.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "transport_device.h"
#include "transport_local.h"
#include "transport_conformance.h"

/* ---- conformance on local+device + CPU backends ---------------------------------------- */

static const cpc_conformance_opts conf_opts = {
    .name = "local+device",
    .skip = 0,
    .large_bytes = (size_t)2 << 20,
    .same_clock = true,
};

static cpc_status *wrap_device(void *ctx, int rank, cpc_transport *in, cpc_transport **out)
{
    cpc_status *st = cpc_transport_device_create(in, ((cpc_backend **)ctx)[rank], out);
    if (!st && (!cpc_transport_device_is(*out) || strcmp((*out)->vt->name, "local+device") != 0))
        return cpc_error(CPC_E_INTERNAL, "not a local+device endpoint: %s", (*out)->vt->name);
    return st;
}

static void conformance(int R, int U)
{
    int P = R * U;
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_create(R, U, &w));
    cpc_local_world_set_timeout(w, 30.0);
    cpc_backend *bes[8];
    for (int p = 0; p < P; p++)
        cr_assert_null(cpc_cpu_backend_create(&bes[p]));
    cpc_local_world_set_copy(w, cpc_device_copy, bes);
    cpc_status *all = cpc_conformance_local_threads(w, R, U, wrap_device, bes, &conf_opts);
    cpc_local_world_destroy(w);
    for (int p = 0; p < P; p++)
        cpc_backend_destroy(bes[p]);
    cr_expect_null(all, "device transport failed the conformance suite on mesh %d x %d: %s", R, U,
                   all ? all->message : "");
    cpc_status_free(all);
}

TestSuite(transport_device, .timeout = 120);

Test(transport_device, conformance_2x2) { conformance(2, 2); }
Test(transport_device, conformance_4x1) { conformance(4, 1); }
Test(transport_device, conformance_1x3) { conformance(1, 3); }

/* ---- a lazy "stream": uploads and copies apply at sync ------------------------------------ */

typedef struct pending {
    void *dst;
    const void *src;   /* copy source (read when applied) or NULL */
    unsigned char *data;  /* upload bytes (owned) or NULL */
    size_t n;
} pending;

typedef struct lazy {
    pending q[64];
    int n;
    bool fail_copy;
    size_t syncs;
} lazy;

static cpc_status *l_alloc(cpc_backend *be, size_t bytes, void **out)
{
    (void)be;
    *out = calloc(1, bytes ? bytes : 1);
    return *out ? NULL : &cpc_status_oom;
}

static void l_free(cpc_backend *be, void *p)
{
    (void)be;
    free(p);
}

static cpc_status *l_sync(cpc_backend *be)
{
    lazy *l = be->ctx;
    for (int i = 0; i < l->n; i++) {
        pending *p = &l->q[i];
        memcpy(p->dst, p->data ? p->data : p->src, p->n);
        free(p->data);
    }
    l->n = 0;
    l->syncs++;
    return NULL;
}

static cpc_status *l_upload(cpc_backend *be, void *dst, const void *host, size_t bytes)
{
    lazy *l = be->ctx;
    cr_assert_lt(l->n, 64);
    unsigned char *d = malloc(bytes);
    memcpy(d, host, bytes);
    l->q[l->n++] = (pending){.dst = dst, .data = d, .n = bytes};
    return NULL;
}

static cpc_status *l_download(cpc_backend *be, void *host, const void *src, size_t bytes)
{
    cpc_status *st = l_sync(be);
    if (!st)
        memcpy(host, src, bytes);
    return st;
}

static cpc_status *l_copy(cpc_backend *be, void *dst, const void *src, size_t bytes)
{
    lazy *l = be->ctx;
    if (l->fail_copy)
        return cpc_error(CPC_E_RUNTIME, "fake device: copy engine on fire");
    cr_assert_lt(l->n, 64);
    l->q[l->n++] = (pending){.dst = dst, .src = src, .n = bytes};
    return NULL;
}

static const cpc_backend_vtable lazy_vt = {
    .name = "lazy",
    .alloc = l_alloc,
    .free = l_free,
    .upload = l_upload,
    .download = l_download,
    .copy = l_copy,
    .sync = l_sync,
};

#define LP 4
#define NB 777

static unsigned char logical(int from, int to, int what, size_t i)
{
    return (unsigned char)(from * 37 + to * 11 + what * 101 + (int)(i * 7 % 251));
}

typedef struct lazy_job {
    cpc_local_world *w;
    cpc_backend **bes;
    int p;
    bool decorated;
    int bad;
    cpc_status *st;
} lazy_job;

static void fill(cpc_backend *be, unsigned char *dev, size_t n, int from, int to, int what)
{
    unsigned char h[NB * LP];
    for (size_t i = 0; i < n; i++)
        h[i] = logical(from, to, what, i);
    cr_assert_null(cpc_backend_upload(be, dev, h, n));   /* pending until a sync */
}

static int count_bad(cpc_backend *be, const unsigned char *dev, size_t n, int from, int to, int what)
{
    unsigned char h[NB * LP];
    cr_assert_null(cpc_backend_download(be, h, dev, n));
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != logical(from, to, what, i);
    return bad;
}

static void *lazy_rank(void *arg)
{
    lazy_job *j = arg;
    cpc_backend *be = j->bes[j->p];
    cpc_transport *in = NULL, *t = NULL;
    cr_assert_null(cpc_local_endpoint_create(j->w, j->p, &in));
    if (j->decorated)
        cr_assert_null(cpc_transport_device_create(in, be, &t));
    else
        t = in;
    unsigned char *sbuf, *rbuf, *a2a_s, *a2a_r, *ag_r;
    cr_assert_null(cpc_backend_alloc(be, NB, (void **)&sbuf));
    cr_assert_null(cpc_backend_alloc(be, NB, (void **)&rbuf));
    cr_assert_null(cpc_backend_alloc(be, NB * LP, (void **)&a2a_s));
    cr_assert_null(cpc_backend_alloc(be, NB * LP, (void **)&a2a_r));
    cr_assert_null(cpc_backend_alloc(be, NB * LP, (void **)&ag_r));
    int me = j->p, next = (me + 1) % LP, prev = (me + LP - 1) % LP;
    /* ring step: the send buffer is written (queued) right before isend */
    fill(be, sbuf, NB, me, next, 0);
    cpc_request *rs = NULL, *rr = NULL;
    cpc_status *st = cpc_transport_irecv(t, CPC_GROUP_WORLD, prev, rbuf, NB, 5, &rr);
    if (!st)
        st = cpc_transport_isend(t, CPC_GROUP_WORLD, next, sbuf, NB, 5, &rs);
    /* wait for every posted request (each frees its request), keep the first error */
    cpc_status *ws = rs ? cpc_transport_wait(t, rs) : NULL, *wr = rr ? cpc_transport_wait(t, rr) : NULL;
    if (!st)
        st = ws ? ws : wr;
    if (ws && st != ws)
        cpc_status_free(ws);
    if (wr && st != wr)
        cpc_status_free(wr);
    if (!st)
        j->bad += count_bad(be, rbuf, NB, prev, me, 0);
    /* all-to-all: parts written (queued) right before the collective */
    size_t counts[LP], displs[LP];
    for (int i = 0; i < LP; i++) {
        counts[i] = NB;
        displs[i] = (size_t)i * NB;
        fill(be, a2a_s + displs[i], NB, me, i, 1);
    }
    if (!st)
        st = cpc_transport_all_to_all_v(t, CPC_GROUP_WORLD, a2a_s, counts, displs, a2a_r, counts, displs);
    for (int i = 0; i < LP && !st; i++)
        j->bad += count_bad(be, a2a_r + displs[i], NB, i, me, 1);
    /* all-gather of a freshly written part */
    fill(be, sbuf, NB, me, -1, 2);
    if (!st)
        st = cpc_transport_all_gather_v(t, CPC_GROUP_WORLD, sbuf, NB, ag_r, counts, displs);
    for (int i = 0; i < LP && !st; i++)
        j->bad += count_bad(be, ag_r + displs[i], NB, i, -1, 2);
    if (st)
        cpc_transport_abort(t, st->message);   /* as the executor does: the others stop waiting */
    j->st = st;
    l_sync(be);   /* drain this rank's queue before its buffers go */
    cpc_backend_free(be, sbuf);
    cpc_backend_free(be, rbuf);
    cpc_backend_free(be, a2a_s);
    cpc_backend_free(be, a2a_r);
    cpc_backend_free(be, ag_r);
    cpc_transport_destroy(t);
    return NULL;
}

static int lazy_exchange(bool decorated, bool fail_copy, cpc_status **err)
{
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_create(1, LP, &w));
    cpc_local_world_set_timeout(w, 20.0);
    lazy ls[LP];
    cpc_backend bk[LP], *bes[LP];
    for (int p = 0; p < LP; p++) {
        memset(&ls[p], 0, sizeof ls[p]);
        ls[p].fail_copy = fail_copy && p == 1;
        bk[p] = (cpc_backend){.vt = &lazy_vt, .ctx = &ls[p]};
        bes[p] = &bk[p];
    }
    cpc_local_world_set_copy(w, cpc_device_copy, bes);
    lazy_job jobs[LP];
    pthread_t th[LP];
    for (int p = 0; p < LP; p++) {
        jobs[p] = (lazy_job){.w = w, .bes = bes, .p = p, .decorated = decorated};
        cr_assert_eq(pthread_create(&th[p], NULL, lazy_rank, &jobs[p]), 0);
    }
    int bad = 0;
    *err = NULL;
    for (int p = 0; p < LP; p++) {
        pthread_join(th[p], NULL);
        bad += jobs[p].bad;
        cpc_status_append(err, jobs[p].st);
    }
    cpc_local_world_destroy(w);
    return bad;
}

Test(transport_device, buffers_are_ready_when_exposed)
{
    cpc_status *err = NULL;
    int bad = lazy_exchange(true, false, &err);
    cr_expect_null(err, "%s", err ? err->message : "");
    cr_expect_eq(bad, 0, "%d wrong bytes through local+device", bad);
    cpc_status_free(err);
}

Test(transport_device, undecorated_exchange_reads_stale_bytes)
{
    cpc_status *err = NULL;
    int bad = lazy_exchange(false, false, &err);
    cpc_status_free(err);
    cr_expect_gt(bad, 0, "without the decorator's sync, queued writes must be missed");
}

Test(transport_device, failing_copy_is_reported)
{
    cpc_status *err = NULL;
    lazy_exchange(true, true, &err);
    cr_expect_not_null(err, "a copy error must fail the transfer");
    int named = 0, n = 0;
    for (const cpc_status *s = err; s; s = s->next, n++)
        named += strstr(s->message, "copy engine on fire") != NULL;
    /* the copier and its peer of the failed transfer both name the cause */
    cr_expect_geq(named, 1, "%s", err ? err->message : "");
    cr_expect_eq(n, LP, "every rank returns an error once the job is aborted");
    cpc_status_free(err);
}
