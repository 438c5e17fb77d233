/*
 * test_transport_conformance_local.c - the transport conformance suite
 * (tests/transport_conformance.h) on the local transport (every rank a
 * thread of this process), for P = 1, 2, 3, 4, 8 with meshes (P,1), (1,P),
 * (2,2) and (2,4).  The local transport skips nothing: its abort returns
 * errors on every rank, so the destructive CPC_CONF_ABORT check runs too.
 *
 * The suite itself is tested here as well: wrapped around the local
 * transport, deliberately broken transports (a received byte flipped, a byte
 * written into an all_to_all_v gap, a barrier that does not wait, wrong
 * group ranks, tags ignored) must each make the suite fail.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "transport_local.h"
#include "transport_conformance.h"

/* ---- broken transports (wrappers around a local endpoint) ------------------ */

typedef enum mutant {
    M_NONE = 0,
    M_FLIP_RECV,      /* flips one byte of every non-empty received message */
    M_A2A_GAP,        /* writes a byte just before the first all_to_all_v part */
    M_NOOP_BARRIER,   /* barrier returns at once */
    M_WRONG_RANK,     /* ring group rank off by one */
    M_IGNORE_TAGS,    /* every message sent and received under tag 0 */
} mutant;

typedef struct wrap {
    cpc_transport base;
    cpc_transport *in;
    mutant m;
} wrap;

typedef struct wrap_req {   /* handed out as a cpc_request * */
    cpc_request *in;
    void *buf;
    size_t bytes;
    bool is_recv;
} wrap_req;

static cpc_transport *inner(cpc_transport *t) { return ((wrap *)t->ctx)->in; }
static mutant mode(cpc_transport *t) { return ((wrap *)t->ctx)->m; }

static int w_group_rank(cpc_transport *t, cpc_group g)
{
    int r = cpc_transport_group_rank(inner(t), g);
    if (mode(t) == M_WRONG_RANK && g == CPC_GROUP_RING) {
        int n = cpc_transport_group_size(inner(t), g);
        r = (r + 1) % n;
    }
    return r;
}

static int w_group_size(cpc_transport *t, cpc_group g)
{
    return cpc_transport_group_size(inner(t), g);
}

static cpc_status *w_post(cpc_transport *t, bool is_recv, cpc_group g, int peer, void *buf,
                          size_t bytes, int tag, cpc_request **req)
{
    wrap_req *w = calloc(1, sizeof *w);
    if (!w)
        return &cpc_status_oom;
    if (mode(t) == M_IGNORE_TAGS && tag >= 0)
        tag = 0;
    cpc_transport *in = inner(t);
    cpc_status *st = is_recv ? cpc_transport_irecv(in, g, peer, buf, bytes, tag, &w->in)
                             : cpc_transport_isend(in, g, peer, buf, bytes, tag, &w->in);
    if (st) {
        free(w);
        return st;
    }
    w->buf = buf;
    w->bytes = bytes;
    w->is_recv = is_recv;
    *req = (cpc_request *)w;
    return NULL;
}

static cpc_status *w_isend(cpc_transport *t, cpc_group g, int peer, const void *buf,
                           size_t bytes, int tag, cpc_request **req)
{
    return w_post(t, false, g, peer, (void *)buf, bytes, tag, req);
}

static cpc_status *w_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    return w_post(t, true, g, peer, buf, bytes, tag, req);
}

static cpc_status *w_wait(cpc_transport *t, cpc_request *req)
{
    wrap_req *w = (wrap_req *)req;
    cpc_status *st = cpc_transport_wait(inner(t), w->in);
    if (!st && w->is_recv && w->bytes > 0 && mode(t) == M_FLIP_RECV)
        ((unsigned char *)w->buf)[w->bytes / 2] ^= 0x10;
    free(w);
    return st;
}

static cpc_status *w_a2a(cpc_transport *t, cpc_group g, const void *send, const size_t *sc,
                         const size_t *sd, void *recv, const size_t *rc, const size_t *rd)
{
    cpc_status *st = cpc_transport_all_to_all_v(inner(t), g, send, sc, sd, recv, rc, rd);
    if (!st && mode(t) == M_A2A_GAP && rd[0] > 0)
        ((unsigned char *)recv)[rd[0] - 1] ^= 0xFF;
    return st;
}

static cpc_status *w_ag(cpc_transport *t, cpc_group g, const void *send, size_t send_bytes,
                        void *recv, const size_t *counts, const size_t *displs)
{
    return cpc_transport_all_gather_v(inner(t), g, send, send_bytes, recv, counts, displs);
}

static cpc_status *w_barrier(cpc_transport *t, cpc_group g)
{
    if (mode(t) == M_NOOP_BARRIER)
        return NULL;
    return cpc_transport_barrier(inner(t), g);
}

static void w_abort(cpc_transport *t, const char *why)
{
    cpc_transport_abort(inner(t), why);
}

static void w_destroy(cpc_transport *t)
{
    wrap *w = t->ctx;
    cpc_transport_destroy(w->in);
    free(w);
}

static const cpc_transport_vtable wrap_vt = {
    .name = "local(broken)",
    .group_rank = w_group_rank,
    .group_size = w_group_size,
    .isend = w_isend,
    .irecv = w_irecv,
    .wait = w_wait,
    .all_to_all_v = w_a2a,
    .all_gather_v = w_ag,
    .barrier = w_barrier,
    .abort = w_abort,
    .destroy = w_destroy,
};

/* ---- running the suite on every rank thread ---------------------------------- */

/* Wraps a rank's endpoint in the mutant (ctx: the mutant). */
static cpc_status *wrap_mutant(void *ctx, int rank, cpc_transport *in, cpc_transport **out)
{
    (void)rank;
    wrap *w = calloc(1, sizeof *w);
    if (!w)
        return &cpc_status_oom;
    w->base.vt = &wrap_vt;
    w->base.ctx = w;
    w->in = in;
    w->m = *(const mutant *)ctx;
    *out = &w->base;
    return NULL;
}

/* Runs the suite on all R*U ranks; returns every rank's diagnostics chained
 * (NULL when all passed). */
static cpc_status *run_suite(int R, int U, mutant m, const cpc_conformance_opts *opts)
{
    cpc_local_world *w = NULL;
    cpc_status *st = cpc_local_world_create(R, U, &w);
    if (st)
        return st;
    /* A hang becomes an abort with a diagnostic instead of a stuck test. */
    cpc_local_world_set_timeout(w, 30.0);
    cpc_status *all = cpc_conformance_local_threads(w, R, U, m == M_NONE ? NULL : wrap_mutant, &m, opts);
    cpc_local_world_destroy(w);
    return all;
}

/* Every check, the destructive abort check included, on every rank. */
static const cpc_conformance_opts full_opts = {
    .name = "local",
    .skip = 0,
    .skip_reason = NULL,
    .large_bytes = 0,        /* the suite's default, 6 MiB + 3 */
    .same_clock = true,      /* threads of one process */
    .log = NULL,
};

static void expect_pass(int R, int U)
{
    cpc_status *st = run_suite(R, U, M_NONE, &full_opts);
    if (st)
        cpc_status_print(st, stderr, "test_transport_conformance_local");
    cr_expect_null(st, "local transport failed the conformance suite on mesh %d x %d "
                       "(first: %s)", R, U, st ? st->message : "");
    cpc_status_free(st);
}

/* Meshes (P,1) and (1,P) for each world size. */
static void expect_pass_world(int P)
{
    expect_pass(P, 1);
    if (P > 1)
        expect_pass(1, P);
}

TestSuite(transport_conformance_local, .timeout = 120);

Test(transport_conformance_local, world_1) { expect_pass_world(1); }
Test(transport_conformance_local, world_2) { expect_pass_world(2); }
Test(transport_conformance_local, world_3) { expect_pass_world(3); }
Test(transport_conformance_local, world_4) { expect_pass_world(4); }
Test(transport_conformance_local, world_8) { expect_pass_world(8); }
Test(transport_conformance_local, mesh_2x2) { expect_pass(2, 2); }
Test(transport_conformance_local, mesh_2x4) { expect_pass(2, 4); }

/* ---- the suite catches broken transports ------------------------------------- */

static const cpc_conformance_opts mutant_opts = {
    .name = "local(broken)",
    .skip = CPC_CONF_ABORT,
    .skip_reason = "not needed to catch the breakage",
    .large_bytes = (size_t)1 << 20,
    .same_clock = true,
    .log = NULL,
};

static bool chain_has(const cpc_status *st, cpc_code code, const char *needle)
{
    for (; st; st = st->next)
        if (st->code == code && (!needle || strstr(st->message, needle)))
            return true;
    return false;
}

/* The suite must fail on mesh R x U with mutant m, with a CPC_E_CHECK
 * diagnostic of check `check` (or any error when check is NULL). */
static void expect_caught(int R, int U, mutant m, const char *check)
{
    cpc_status *st = run_suite(R, U, m, &mutant_opts);
    cr_expect_not_null(st, "mutant %d on mesh %d x %d passed the suite", (int)m, R, U);
    if (check)
        cr_expect(chain_has(st, CPC_E_CHECK, check),
                  "mutant %d: no '%s' diagnostic; first: %s", (int)m, check,
                  st ? st->message : "(none)");
    cpc_status_free(st);
}

Test(transport_conformance_local, catches_corrupted_receive)
{
    expect_caught(2, 2, M_FLIP_RECV, ": ring: ");
}

Test(transport_conformance_local, catches_write_into_a2a_gap)
{
    expect_caught(2, 2, M_A2A_GAP, ": all_to_all_v: ");
}

Test(transport_conformance_local, catches_barrier_that_does_not_wait)
{
    expect_caught(2, 2, M_NOOP_BARRIER, ": barrier: ");
}

Test(transport_conformance_local, catches_wrong_group_rank)
{
    expect_caught(2, 2, M_WRONG_RANK, ": groups: ");
}

Test(transport_conformance_local, catches_ignored_tags)
{
    /* Messages then match the wrong receives: wrong data, or sizes that do
     * not agree (the local transport's own error).  Either fails the suite. */
    expect_caught(2, 1, M_IGNORE_TAGS, NULL);
}
