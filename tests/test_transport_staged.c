/*
 * test_transport_staged.c - the staged transport (runtime/transport/transport_staged.h)
 * without a GPU:
 *
 *  - the transport conformance suite (tests/transport_conformance.h), every
 *    check including abort, on staged endpoints over the local transport
 *    with the CPU backend (upload/download = memcpy);
 *  - "device" memory that host code cannot read as is: each rank's fake
 *    backend stores bytes XOR a per-rank key, so a message is only right when
 *    the sender downloads and the receiver uploads it exactly once (the same
 *    exchange over the bare local transport must come out wrong, which shows
 *    the test can fail); staged byte counters;
 *  - a failing upload is reported (naming the staged transport) and leaks
 *    nothing;
 *  - the job layer (run.h) with options.staged: cprun's CUDA-path plumbing
 *    (every endpoint wrapped) on the CPU backend, checked against the float64
 *    reference and bit-identical to the unstaged run.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "backend.h"
#include "run.h"
#include "transport_local.h"
#include "transport_staged.h"
#include "transport_conformance.h"

/* ---- the conformance suite on staged(local) + CPU backend ----------------------------- */

static const cpc_conformance_opts conf_opts = {
    .name = "local+staged",
    .skip = 0,
    .large_bytes = (size_t)2 << 20,
    .same_clock = true,
};

static cpc_status *wrap_staged(void *ctx, int rank, cpc_transport *in, cpc_transport **out)
{
    return cpc_transport_staged_create(in, ((cpc_backend **)ctx)[rank], out);
}

static void conformance(int R, int U)
{
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_create(R, U, &w));
    cpc_local_world_set_timeout(w, 30.0);
    int P = R * U;
    cpc_backend *bes[8];
    for (int p = 0; p < P; p++)
        cr_assert_null(cpc_cpu_backend_create(&bes[p]));
    cpc_status *all = cpc_conformance_local_threads(w, R, U, wrap_staged, bes, &conf_opts);
    cpc_local_world_destroy(w);
    for (int p = 0; p < P; p++)
        cpc_backend_destroy(bes[p]);
    if (all)
        cpc_status_print(all, stderr, "test_transport_staged");
    cr_expect_null(all, "staged transport failed the conformance suite on mesh %d x %d: %s", R, U,
                   all ? all->message : "");
    cpc_status_free(all);
}

TestSuite(transport_staged, .timeout = 120);

Test(transport_staged, conformance_2x2) { conformance(2, 2); }
Test(transport_staged, conformance_4x1) { conformance(4, 1); }
Test(transport_staged, conformance_1x3) { conformance(1, 3); }

/* ---- keyed "device" memory --------------------------------------------------------------- */

/* A backend whose device bytes are the host bytes XOR `key`. */
typedef struct keyed {
    unsigned char key;
    bool fail_upload;
    size_t uploads, downloads;
} keyed;

static cpc_status *k_alloc(cpc_backend *be, size_t bytes, void **out)
{
    (void)be;
    *out = malloc(bytes ? bytes : 1);
    return *out ? NULL : &cpc_status_oom;
}

static void k_free(cpc_backend *be, void *p)
{
    (void)be;
    free(p);
}

static void xor_copy(void *dst, const void *src, size_t n, unsigned char key)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = s[i] ^ key;
}

static cpc_status *k_upload(cpc_backend *be, void *dst, const void *host, size_t bytes)
{
    keyed *k = be->ctx;
    if (k->fail_upload)
        return cpc_error(CPC_E_RUNTIME, "fake device: upload failed");
    xor_copy(dst, host, bytes, k->key);
    k->uploads += bytes;
    return NULL;
}

static cpc_status *k_download(cpc_backend *be, void *host, const void *src, size_t bytes)
{
    keyed *k = be->ctx;
    xor_copy(host, src, bytes, k->key);
    k->downloads += bytes;
    return NULL;
}

static const cpc_backend_vtable keyed_vt = {
    .name = "keyed",
    .alloc = k_alloc,
    .free = k_free,
    .upload = k_upload,
    .download = k_download,
};

#define KP 4                 /* mesh 2 x 2 */
#define KR 2
#define KU 2
#define NB 1000              /* bytes per part */

typedef struct key_job {
    cpc_local_world *w;
    int p;
    bool staged;
    int mismatches;
    size_t downloaded, uploaded;
    cpc_status *st;
} key_job;

static unsigned char logical(int from, int to, int what, size_t i)
{
    return (unsigned char)(from * 37 + to * 11 + what * 101 + (int)(i * 7 % 251));
}

/* Device buffer of rank p holding the logical bytes f(i). */
static void put(cpc_backend *be, unsigned char *dev, size_t n, int from, int to, int what)
{
    unsigned char *h = malloc(n);
    cr_assert_not_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = logical(from, to, what, i);
    cr_assert_null(cpc_backend_upload(be, dev, h, n));
    free(h);
}

static int count_bad(cpc_backend *be, const unsigned char *dev, size_t n, int from, int to, int what)
{
    unsigned char *h = malloc(n);
    cr_assert_not_null(h);
    cr_assert_null(cpc_backend_download(be, h, dev, n));
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != logical(from, to, what, i);
    free(h);
    return bad;
}

static void *key_rank(void *arg)
{
    key_job *j = arg;
    keyed kctx = {.key = (unsigned char)(0x11 * (j->p + 1))};
    cpc_backend be = {.vt = &keyed_vt, .ctx = &kctx};
    cpc_transport *t = NULL;
    j->st = cpc_local_endpoint_create(j->w, j->p, &t);
    if (!j->st && j->staged) {
        cpc_transport *s = NULL;
        j->st = cpc_transport_staged_create(t, &be, &s);
        if (!j->st)
            t = s;
    }
    if (j->st) {
        cpc_local_world_abort(j->w, j->p, "setup failed");
        if (t)
            cpc_transport_destroy(t);
        return NULL;
    }
    int P = KP, p = j->p;
    unsigned char *send = malloc(P * NB), *recv = malloc(P * NB + 64);
    cr_assert(send && recv);
    /* 1. ring shift over the world: send to p+1, receive from p-1. */
    put(&be, send, NB, p, (p + 1) % P, 1);
    cpc_request *rs = NULL, *rr = NULL;
    cpc_status *st = cpc_transport_irecv(t, CPC_GROUP_WORLD, (p + P - 1) % P, recv, NB, 5, &rr);
    if (!st)
        st = cpc_transport_isend(t, CPC_GROUP_WORLD, (p + 1) % P, send, NB, 5, &rs);
    if (!st)
        st = cpc_transport_wait(t, rs);
    if (!st)
        st = cpc_transport_wait(t, rr);
    if (!st)
        j->mismatches += count_bad(&be, recv, NB, (p + P - 1) % P, p, 1);
    /* 2. all_to_all_v over the world, part i of size NB - 10*i, with a gap. */
    size_t sc[KP], sd[KP], rc[KP], rd[KP];
    for (int i = 0; i < P; i++) {
        sc[i] = NB - 10 * (size_t)i;
        sd[i] = (size_t)i * NB;
        rc[i] = NB - 10 * (size_t)p;
        rd[i] = (size_t)i * NB + 8;
        if (!st)
            put(&be, send + sd[i], sc[i], p, i, 2);
    }
    if (!st)
        st = cpc_transport_all_to_all_v(t, CPC_GROUP_WORLD, send, sc, sd, recv, rc, rd);
    for (int i = 0; !st && i < P; i++)
        j->mismatches += count_bad(&be, recv + rd[i], rc[i], i, p, 2);
    /* 3. all_gather_v over the ring group (members r = 0..R-1, same u). */
    int gr = cpc_transport_group_rank(t, CPC_GROUP_RING), gn = cpc_transport_group_size(t, CPC_GROUP_RING);
    size_t gc[KR], gd[KR];
    for (int i = 0; i < gn; i++) {
        gc[i] = 300 + 50 * (size_t)i;
        gd[i] = (size_t)(gn - 1 - i) * 512;
    }
    if (!st) {
        put(&be, send, gc[gr], gr, -1, 3);
        st = cpc_transport_all_gather_v(t, CPC_GROUP_RING, send, gc[gr], recv, gc, gd);
    }
    for (int i = 0; !st && i < gn; i++)
        j->mismatches += count_bad(&be, recv + gd[i], gc[i], i, -1, 3);
    if (st)
        cpc_transport_abort(t, st->message);
    cpc_transport_staged_bytes(t, &j->downloaded, &j->uploaded);
    j->st = st;
    free(send);
    free(recv);
    cpc_transport_destroy(t);
    return NULL;
}

/* Runs the exchange on every rank; returns the total of wrong bytes. */
static int key_exchange(bool staged, key_job *jobs)
{
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_create(KR, KU, &w));
    cpc_local_world_set_timeout(w, 30.0);
    pthread_t th[KP];
    for (int p = 0; p < KP; p++) {
        jobs[p] = (key_job){.w = w, .p = p, .staged = staged};
        cr_assert_eq(pthread_create(&th[p], NULL, key_rank, &jobs[p]), 0);
    }
    int bad = 0;
    for (int p = 0; p < KP; p++) {
        pthread_join(th[p], NULL);
        cr_assert_null(jobs[p].st, "rank %d: %s", p, jobs[p].st ? jobs[p].st->message : "");
        bad += jobs[p].mismatches;
    }
    cpc_local_world_destroy(w);
    return bad;
}

Test(transport_staged, device_bytes_cross_the_host_once)
{
    key_job jobs[KP];
    int bad = key_exchange(true, jobs);
    cr_expect_eq(bad, 0, "staged exchange: %d wrong bytes", bad);
    for (int p = 0; p < KP; p++) {
        /* downloads: ring NB, all_to_all extent (last part end), gather own part;
         * uploads: ring NB, all_to_all parts, gather parts. */
        size_t a2a_extent = 3 * NB + (NB - 30);
        size_t a2a_in = (size_t)KP * (NB - 10 * (size_t)p);
        int gr = p / KU;
        size_t down = NB + a2a_extent + (300 + 50 * (size_t)gr);
        size_t up = NB + a2a_in + 300 + 350;
        cr_expect_eq(jobs[p].downloaded, down, "rank %d downloaded %zu bytes, expected %zu", p,
                     jobs[p].downloaded, down);
        cr_expect_eq(jobs[p].uploaded, up, "rank %d uploaded %zu bytes, expected %zu", p,
                     jobs[p].uploaded, up);
    }
}

Test(transport_staged, bare_local_transport_garbles_device_bytes)
{
    /* The same exchange without staging moves the encoded bytes: the check
     * above is able to fail. */
    key_job jobs[KP];
    int bad = key_exchange(false, jobs);
    cr_expect_gt(bad, 1000, "the unstaged exchange should garble device bytes (%d wrong)", bad);
    for (int p = 0; p < KP; p++)
        cr_expect_eq(jobs[p].downloaded + jobs[p].uploaded, 0);
}

Test(transport_staged, name_and_identity)
{
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_create(1, 1, &w));
    cpc_transport *in = NULL, *t = NULL;
    cpc_backend *be = NULL;
    cr_assert_null(cpc_local_endpoint_create(w, 0, &in));
    cr_assert_null(cpc_cpu_backend_create(&be));
    cpc_status *st = cpc_transport_staged_create(in, NULL, &t);
    cr_expect_not_null(st, "a NULL backend must be refused");
    cr_expect_null(t);
    cpc_status_free(st);
    cr_assert_null(cpc_transport_staged_create(in, be, &t));   /* in is still ours above */
    cr_expect_str_eq(t->vt->name, "local+staged");
    cr_expect(cpc_transport_staged_is(t));
    cr_expect(!cpc_transport_staged_is(in));
    cr_expect_eq(cpc_transport_group_size(t, CPC_GROUP_WORLD), 1);
    cpc_transport_destroy(t);   /* destroys in */
    cpc_backend_destroy(be);
    cpc_local_world_destroy(w);
}

Test(transport_staged, failed_upload_is_reported)
{
    cpc_local_world *w = NULL;
    cr_assert_null(cpc_local_world_create(1, 1, &w));
    keyed kctx = {.key = 0x5a, .fail_upload = true};
    cpc_backend be = {.vt = &keyed_vt, .ctx = &kctx};
    cpc_transport *in = NULL, *t = NULL;
    cr_assert_null(cpc_local_endpoint_create(w, 0, &in));
    cr_assert_null(cpc_transport_staged_create(in, &be, &t));
    unsigned char a[64] = {1, 2, 3}, b[64];
    cpc_request *rs = NULL, *rr = NULL;
    cr_assert_null(cpc_transport_irecv(t, CPC_GROUP_WORLD, 0, b, sizeof b, 1, &rr));
    cr_assert_null(cpc_transport_isend(t, CPC_GROUP_WORLD, 0, a, sizeof a, 1, &rs));
    cr_assert_null(cpc_transport_wait(t, rs));
    cpc_status *st = cpc_transport_wait(t, rr);
    cr_assert_not_null(st, "a failed upload must fail the receive");
    cr_expect(strstr(st->message, "staged transport") && strstr(st->message, "upload failed"),
              "message: %s", st->message);
    cpc_status_free(st);
    cpc_transport_destroy(t);
    cpc_local_world_destroy(w);
}

/* ---- the job layer with staged endpoints (cprun's CUDA plumbing, CPU backend) ----------- */

static cpc_plan *mk_plan(int H, int Hkv, int D, cpc_dtype dt, int64_t s0, int64_t s1, int P)
{
    cpc_plan *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    p->file = strdup("test_transport_staged.yaml");
    p->name = strdup("staged");
    p->version = 1;
    p->model.heads = H;
    p->model.kv_heads = Hkv;
    p->model.head_dim = D;
    p->model.dtype = dt;
    p->model.layers = 1;
    p->model.scale = 1.0 / sqrt((double)D);
    p->input.batch = 1;
    p->input.n_segments = 2;
    p->input.segments = calloc(2, sizeof *p->input.segments);
    cr_assert_not_null(p->input.segments);
    p->input.segments[0].name = strdup("text");
    p->input.segments[0].tokens = s0;
    p->input.segments[1].name = strdup("image");
    p->input.segments[1].tokens = s1;
    p->input.total_tokens = s0 + s1;
    p->input.mask = CPC_MASK_NONE;
    p->input.mode = CPC_MODE_INFERENCE;
    p->cluster.world_size = P;
    p->cluster.gpus_per_node = P;
    p->cluster.device = strdup("cpu");
    p->schedule.overlap = true;
    p->schedule.rotate = CPC_ROTATE_P2P;
    return p;
}

/* device = false: options.staged (host staging); true: options.device_transport
 * (device-to-device copies, transport_device.h) - both on the CPU backend. */
static void axes_job(bool device, cpc_variant v, int C, int T, int R, int U, cpc_dtype dt, int Hkv,
                     int64_t s0, int64_t s1)
{
    cpc_plan *plan = mk_plan(6, Hkv, 32, dt, s0, s1, C * T * R * U);
    plan->input.batch = C;
    plan->parallel.cfg_degree = C;
    plan->parallel.tp_degree = T;
    plan->parallel.variant = v;
    plan->parallel.variant_given = true;
    plan->parallel.ring_degree = R;
    plan->parallel.ulysses_degree = U;
    cpc_job *job = NULL;
    cpc_status *st = cpc_job_from_plan(plan, v, R, U, &job);
    cr_assert(!cpc_status_has_error(st), "%s: %s", cpc_variant_name(v), st ? st->message : "");
    cpc_status_free(st);
    cpc_run_report a, b;
    cpc_run_options o;
    cpc_run_options_default(&o);
    o.backend = "cpu";
    o.seed = 77;
    o.warmup = 0;
    o.iters = 1;
    o.timeout_s = 60;
    o.staged = !device;
    o.device_transport = device;
    st = cpc_job_run(job, &o, &a, NULL);
    cr_assert_null(st, "%s staged: %s", cpc_variant_name(v), st ? st->message : "");
    cr_expect_str_eq(a.transport, device ? "local+device" : "local+staged");
    cr_expect_str_eq(a.backend, "cpu");
    cr_expect_str_eq(a.attention, "cpu");
    cr_expect(a.checked && a.pass && a.rel_err > 0, "%s staged: rel_err %.3e", cpc_variant_name(v),
              a.rel_err);
    o.staged = false;
    o.device_transport = false;
    st = cpc_job_run(job, &o, &b, NULL);
    cr_assert_null(st);
    cr_expect_str_eq(b.transport, "local");
    /* Staging copies bytes exactly and the compute is the same: the same
     * output, so the same errors to the last bit. */
    cr_expect(a.rel_err == b.rel_err && a.max_abs_err == b.max_abs_err,
              "%s: staged %.17g / %.17g, unstaged %.17g / %.17g", cpc_variant_name(v), a.rel_err,
              a.max_abs_err, b.rel_err, b.max_abs_err);
    cr_expect_eq(a.bytes_sent_per_rank, b.bytes_sent_per_rank);
    cpc_run_report_clear(&a);
    cpc_run_report_clear(&b);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

static void wrapped_job(bool device, cpc_variant v, int R, int U, cpc_dtype dt, int Hkv,
                        int64_t s0, int64_t s1)
{
    axes_job(device, v, 1, 1, R, U, dt, Hkv, s0, s1);
}

static void staged_job(cpc_variant v, int R, int U, cpc_dtype dt, int Hkv, int64_t s0, int64_t s1)
{
    wrapped_job(false, v, R, U, dt, Hkv, s0, s1);
}

/* Uneven segments and GQA (anything variants); a 2 x 2 mesh (unified). */
Test(transport_staged, job_ring_anything) { staged_job(CPC_VARIANT_RING_ANYTHING, 4, 1, CPC_DTYPE_BF16, 3, 21, 111); }
Test(transport_staged, job_ulysses_anything) { staged_job(CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, CPC_DTYPE_FP32, 3, 21, 111); }
Test(transport_staged, job_unified) { staged_job(CPC_VARIANT_UNIFIED, 2, 2, CPC_DTYPE_FP16, 6, 24, 112); }

/* The same jobs with device-to-device copies (what the CUDA backend uses for
 * virtual ranks): bit-identical to the plain local transport. */
Test(transport_staged, job_device_ring_anything) { wrapped_job(true, CPC_VARIANT_RING_ANYTHING, 4, 1, CPC_DTYPE_BF16, 3, 21, 111); }
Test(transport_staged, job_device_ulysses_anything) { wrapped_job(true, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, CPC_DTYPE_FP32, 3, 21, 111); }
Test(transport_staged, job_device_unified) { wrapped_job(true, CPC_VARIANT_UNIFIED, 2, 2, CPC_DTYPE_FP16, 6, 24, 112); }

/* cfg_degree x tp_degree > 1 (runtime/session/placement.h): every (c, t) group's
 * world copies with its own slots of the device-copy table; staged and
 * device-to-device runs are bit-identical to the plain local one. */
Test(transport_staged, job_axes_staged_ring_anything) { axes_job(false, CPC_VARIANT_RING_ANYTHING, 2, 3, 4, 1, CPC_DTYPE_BF16, 3, 21, 111); }
Test(transport_staged, job_axes_device_unified) { axes_job(true, CPC_VARIANT_UNIFIED, 2, 3, 2, 2, CPC_DTYPE_FP16, 6, 24, 112); }
