/*
 * test_transport_nccl.c - the NCCL transport (runtime/transport/transport_nccl.h).
 *
 * Built with the CUDA toolkit (without it this file holds no test: the
 * transport is not compiled).
 *
 * Without a GPU or driver (these dev machines: toolkit, no libcuda):
 *  - cpc_transport_nccl_create fails with CPC_E_UNSUPPORTED "no CUDA device:
 *    ..." naming the CUDA error, *out stays NULL, nothing crashes, and MPI is
 *    not initialised behind the caller's back (a single process has nobody
 *    to agree with);
 *  - bad degrees are CPC_E_USAGE before anything is touched;
 *  - the helper API on another transport answers "not nccl".
 * With a GPU (if this is ever run on one): the transport conformance suite
 * (tests/transport_conformance.h) on every mesh the job allows (1x1 as a
 * single process; P x 1, 1 x P and 2 x P/2 under `mpirun -np P`, one GPU per
 * rank), three ways:
 *   host   - the suite's own host buffers: the transport stages them
 *            through device bounce buffers;
 *   device - every buffer moved to device memory by the decorator below,
 *            host-synchronising mode (no compute stream);
 *   events - the same with a compute stream set: the decorator writes send
 *            data on the compute stream WITHOUT synchronising (so a missing
 *            compute -> comm ordering shows as wrong bytes) and reads
 *            received data on the compute stream after wait (so a missing
 *            comm -> compute ordering does too).
 * The suite takes host memory only (it fills and checks buffers with the
 * CPU); device memory needs a decorator like this one, or an allocator hook
 * in cpc_conformance_opts (alloc/free/upload/download) - not needed so far.
 * CPC_CONF_ABORT is skipped: this transport's abort ends the process
 * (MPI_Abort), as the MPI transport's (tests/mpi/run_fault.sh covers that).
 *
 * Without a GPU the "with a GPU" half runs on the CUDA emulator with the fake
 * NCCL (tests/emu/fake_nccl.c): tests/cli/nccl_emu.sh runs this binary with
 * LD_LIBRARY_PATH=<build>/emu-cudart under mpirun -np 2 and 4 (one emulated
 * GPU per rank, CPC_EMU_DEVICES), and as one process (1x1).  On a real GPU,
 * tests/gpu/run.sh runs it as one process (1x1).
 */
#include <criterion/criterion.h>

#ifdef CPC_HAVE_CUDA

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "transport_local.h"
#include "transport_nccl.h"

static bool have_gpu(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    return e == cudaSuccess && n > 0;
}

#if defined(CPC_HAVE_NCCL) && defined(CPC_HAVE_MPI)

#include <mpi.h>

#include "transport_mpi.h"
#include "transport_conformance.h"

Test(transport_nccl, no_gpu_fails_cleanly)
{
    if (have_gpu())
        cr_skip_test("a GPU is present: transport_nccl::conformance covers it");
    if (cpc_mpi_launched())
        cr_skip_test("started by an MPI launcher: the single-process path is not taken");
    int meshes[][2] = {{1, 1}, {2, 1}, {2, 2}};
    for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++) {
        cpc_transport *t = (cpc_transport *)0x1;
        cpc_status *st = cpc_transport_nccl_create(meshes[i][0], meshes[i][1], -1, &t);
        cr_assert_not_null(st, "creation without a GPU succeeded");
        cr_expect_null(t, "*out not NULL after a failure");
        cr_expect_eq(st->code, CPC_E_UNSUPPORTED, "code %s, message: %s", cpc_code_name(st->code),
                     st->message);
        cr_expect(strncmp(st->message, "no CUDA device: ", 16) == 0, "message: %s", st->message);
        /* The CUDA error is named (cudaGetDeviceCount and the error's name). */
        cr_expect(strstr(st->message, "cudaGetDeviceCount") != NULL, "message: %s", st->message);
        cr_expect(strstr(st->message, "cudaError") != NULL || strstr(st->message, "no GPU"),
                  "message: %s", st->message);
        cpc_status_free(st);
    }
    /* A single process with no GPU never initialised MPI. */
    int init = 1;
    MPI_Initialized(&init);
    cr_expect_eq(init, 0, "MPI was initialised by a creation that could not succeed");
    /* An explicit device index fails the same way. */
    cpc_transport *t = NULL;
    cpc_status *st = cpc_transport_nccl_create(1, 1, 3, &t);
    cr_assert_not_null(st);
    cr_expect_eq(st->code, CPC_E_UNSUPPORTED);
    cr_expect_null(t);
    cpc_status_free(st);
}

/* The bootstrap without MPI (a unique id the caller distributes, or the
 * caller's communicator): bad arguments are usage errors before anything is
 * touched; without a GPU the id path says "no CUDA device" and never touches
 * MPI or NCCL. */
Test(transport_nccl, bootstrap_without_mpi_refusals)
{
    unsigned char id[CPC_NCCL_UNIQUE_ID_BYTES] = {0};
    cpc_transport *t = (cpc_transport *)0x1;
    struct {
        const unsigned char *id;
        size_t n;
        int rank, R, U;
        const char *what;
    } bad[] = {{id, 64, 0, 1, 1, "short id"}, {NULL, sizeof id, 0, 1, 1, "NULL id"},
               {id, sizeof id, 2, 2, 1, "rank == world"}, {id, sizeof id, -1, 2, 1, "rank -1"},
               {id, sizeof id, 0, 0, 1, "ring 0"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cpc_status *st = cpc_transport_nccl_create_id(bad[i].id, bad[i].n, bad[i].rank, bad[i].R,
                                                      bad[i].U, -1, &t);
        cr_assert_not_null(st, "%s accepted", bad[i].what);
        cr_expect_eq(st->code, CPC_E_USAGE, "%s: %s", bad[i].what, st->message);
        cr_expect_null(t);
        cpc_status_free(st);
    }
    cpc_status *st = cpc_transport_nccl_create_comm(NULL, 1, 1, &t);
    cr_assert_not_null(st);
    cr_expect_eq(st->code, CPC_E_USAGE, "%s", st->message);
    cpc_status_free(st);
    st = cpc_transport_nccl_unique_id(id, 64);
    cr_assert_not_null(st);
    cr_expect_eq(st->code, CPC_E_USAGE, "%s", st->message);
    cpc_status_free(st);
    if (!have_gpu()) {
        st = cpc_transport_nccl_create_id(id, sizeof id, 0, 1, 1, -1, &t);
        cr_assert_not_null(st);
        cr_expect_eq(st->code, CPC_E_UNSUPPORTED, "%s", st->message);
        cr_expect(strncmp(st->message, "no CUDA device: ", 16) == 0, "%s", st->message);
        cr_expect_null(t);
        cpc_status_free(st);
        int init = 1;
        MPI_Initialized(&init);
        cr_expect_eq(init, 0, "MPI initialised by the bootstrap without MPI");
    }
}

Test(transport_nccl, bad_degrees)
{
    int bad[][2] = {{0, 1}, {1, 0}, {-2, 4}, {1 << 16, 1 << 16}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cpc_transport *t = NULL;
        cpc_status *st = cpc_transport_nccl_create(bad[i][0], bad[i][1], -1, &t);
        cr_assert_not_null(st, "mesh %d x %d accepted", bad[i][0], bad[i][1]);
        cr_expect_eq(st->code, CPC_E_USAGE, "mesh %d x %d: %s", bad[i][0], bad[i][1],
                     st->message);
        cr_expect_null(t);
        cpc_status_free(st);
    }
}

Test(transport_nccl, helpers_on_another_transport)
{
    cpc_local_world *w = NULL;
    cpc_transport *t = NULL;
    cr_assert_null(cpc_local_world_create(1, 1, &w));
    cr_assert_null(cpc_local_endpoint_create(w, 0, &t));
    cr_expect(!cpc_transport_is_nccl(t));
    cr_expect(!cpc_transport_is_nccl(NULL));
    cr_expect_eq(cpc_transport_nccl_device(t), -1);
    cr_expect_null(cpc_transport_nccl_stream(t));
    cpc_status *st = cpc_transport_nccl_set_compute_stream(t, NULL);
    cr_expect(st && st->code == CPC_E_USAGE);
    cpc_status_free(st);
    st = cpc_transport_nccl_compute_to_comm(t, NULL);
    cr_expect(st && st->code == CPC_E_USAGE);
    cpc_status_free(st);
    st = cpc_transport_nccl_comm_to_compute(t, NULL);
    cr_expect(st && st->code == CPC_E_USAGE);
    cpc_status_free(st);
    st = cpc_transport_nccl_flush(t);
    cr_expect(st && st->code == CPC_E_USAGE);
    cpc_status_free(st);
    cpc_transport_destroy(t);
    cpc_local_world_destroy(w);
}

/* ---- with a GPU: the conformance suite ------------------------------------------ */

/* A decorator that moves every buffer of the suite into device memory (see
 * the file comment).  `copy` is the stream its copies run on: the compute
 * stream in events mode (H2D not synchronised), else its own stream
 * (synchronised after every copy). */
typedef struct devwrap {
    cpc_transport base;
    cpc_transport *in;        /* the NCCL endpoint (borrowed) */
    cudaStream_t copy;
    bool events;
} devwrap;

typedef struct dev_req {      /* handed out as a cpc_request * */
    cpc_request *in;
    void *dev, *host;
    size_t bytes;
    bool is_recv;
} dev_req;

static devwrap *DW(cpc_transport *t) { return t->ctx; }

static cpc_status *cuda_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return cpc_error(CPC_E_RUNTIME, "test decorator: %s: %s", what, cudaGetErrorString(e));
}

static cpc_status *d_alloc(devwrap *w, size_t n, void **p)
{
    cudaError_t e = cudaMallocAsync(p, n ? n : 1, w->copy);
    return e == cudaSuccess ? NULL : cuda_fail(e, "cudaMallocAsync");
}

static void d_free(devwrap *w, void *p)
{
    if (p)
        cudaFreeAsync(p, w->copy);
}

static cpc_status *h2d(devwrap *w, void *dev, const void *host, size_t n)
{
    if (!n)
        return NULL;
    cudaError_t e = cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, w->copy);
    if (e == cudaSuccess && !w->events)
        e = cudaStreamSynchronize(w->copy);
    return e == cudaSuccess ? NULL : cuda_fail(e, "host to device");
}

static cpc_status *d2h(devwrap *w, void *host, const void *dev, size_t n)
{
    if (!n)
        return NULL;
    cudaError_t e = cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, w->copy);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(w->copy);
    return e == cudaSuccess ? NULL : cuda_fail(e, "device to host");
}

static int d_group_rank(cpc_transport *t, cpc_group g)
{
    return cpc_transport_group_rank(DW(t)->in, g);
}

static int d_group_size(cpc_transport *t, cpc_group g)
{
    return cpc_transport_group_size(DW(t)->in, g);
}

static cpc_status *d_post(cpc_transport *t, bool is_recv, cpc_group g, int peer, void *buf,
                          size_t bytes, int tag, cpc_request **req)
{
    devwrap *w = DW(t);
    *req = NULL;
    dev_req *r = calloc(1, sizeof *r);
    if (!r)
        return cpc_error(CPC_E_NOMEM, "test decorator: out of memory");
    r->host = buf;
    r->bytes = bytes;
    r->is_recv = is_recv;
    cpc_status *st = d_alloc(w, bytes, &r->dev);
    if (!st && !is_recv)
        st = h2d(w, r->dev, buf, bytes);
    if (!st)
        st = is_recv ? cpc_transport_irecv(w->in, g, peer, r->dev, bytes, tag, &r->in)
                     : cpc_transport_isend(w->in, g, peer, r->dev, bytes, tag, &r->in);
    if (st) {
        d_free(w, r->dev);
        free(r);
        return st;
    }
    *req = (cpc_request *)r;
    return NULL;
}

static cpc_status *d_isend(cpc_transport *t, cpc_group g, int peer, const void *buf,
                           size_t bytes, int tag, cpc_request **req)
{
    return d_post(t, false, g, peer, (void *)buf, bytes, tag, req);
}

static cpc_status *d_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    return d_post(t, true, g, peer, buf, bytes, tag, req);
}

static cpc_status *d_wait(cpc_transport *t, cpc_request *q)
{
    devwrap *w = DW(t);
    dev_req *r = (dev_req *)q;
    cpc_status *st = cpc_transport_wait(w->in, r->in);
    if (!st && r->is_recv)
        st = d2h(w, r->host, r->dev, r->bytes);
    d_free(w, r->dev);
    free(r);
    return st;
}

static size_t ext(int n, const size_t *c, const size_t *d)
{
    size_t e = 0;
    for (int i = 0; i < n; i++)
        if (c[i] && d[i] + c[i] > e)
            e = d[i] + c[i];
    return e;
}

static cpc_status *d_all_to_all_v(cpc_transport *t, cpc_group g, const void *send,
                                  const size_t *sc, const size_t *sd, void *recv,
                                  const size_t *rc, const size_t *rd)
{
    devwrap *w = DW(t);
    int n = d_group_size(t, g);
    if (n < 1)
        return cpc_transport_all_to_all_v(w->in, g, send, sc, sd, recv, rc, rd);
    size_t se = ext(n, sc, sd), re = ext(n, rc, rd);
    void *ds = NULL, *dr = NULL;
    /* The receive extent is uploaded too (sentinels in the gaps), and
     * downloaded whole: a byte written into a gap shows. */
    cpc_status *st = d_alloc(w, se, &ds);
    if (!st)
        st = d_alloc(w, re, &dr);
    if (!st)
        st = h2d(w, ds, send, se);
    if (!st)
        st = h2d(w, dr, recv, re);
    if (!st)
        st = cpc_transport_all_to_all_v(w->in, g, ds, sc, sd, dr, rc, rd);
    if (!st)
        st = d2h(w, recv, dr, re);
    d_free(w, ds);
    d_free(w, dr);
    return st;
}

static cpc_status *d_all_gather_v(cpc_transport *t, cpc_group g, const void *send,
                                  size_t send_bytes, void *recv, const size_t *counts,
                                  const size_t *displs)
{
    devwrap *w = DW(t);
    int n = d_group_size(t, g);
    if (n < 1)
        return cpc_transport_all_gather_v(w->in, g, send, send_bytes, recv, counts, displs);
    size_t re = ext(n, counts, displs);
    void *ds = NULL, *dr = NULL;
    cpc_status *st = d_alloc(w, send_bytes, &ds);
    if (!st)
        st = d_alloc(w, re, &dr);
    if (!st)
        st = h2d(w, ds, send, send_bytes);
    if (!st)
        st = h2d(w, dr, recv, re);
    if (!st)
        st = cpc_transport_all_gather_v(w->in, g, ds, send_bytes, dr, counts, displs);
    if (!st)
        st = d2h(w, recv, dr, re);
    d_free(w, ds);
    d_free(w, dr);
    return st;
}

static cpc_status *d_barrier(cpc_transport *t, cpc_group g)
{
    return cpc_transport_barrier(DW(t)->in, g);
}

static void d_abort(cpc_transport *t, const char *why)
{
    cpc_transport_abort(DW(t)->in, why);
}

static void d_destroy(cpc_transport *t)
{
    (void)t;   /* the inner endpoint and the stream belong to the test */
}

static const cpc_transport_vtable devwrap_vt = {
    .name = "nccl(device buffers)",
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
};

static void run_suite(cpc_transport *t, int R, int U, int wr, const char *name, bool same_clock)
{
    cpc_conformance_opts o = {
        .name = name,
        .skip = CPC_CONF_ABORT,
        .skip_reason = "the nccl transport's abort ends the job (MPI_Abort)",
        .same_clock = same_clock,
        .log = stderr,
    };
    cpc_status *st = cpc_transport_conformance(t, R, U, wr / U, wr % U, &o);
    if (st) {
        char *msg = cpc_status_format(st, "conformance");
        cpc_status_free(st);
        cr_expect(false, "%s %dx%d rank %d: %s", name, R, U, wr, msg ? msg : "?");
        free(msg);
    }
}

Test(transport_nccl, conformance, .timeout = 300)
{
    if (!have_gpu())
        cr_skip_test("no GPU: transport_nccl::no_gpu_fails_cleanly covers this machine");
    int wr = 0, ws = 1;
    cpc_status *st = cpc_mpi_init(&wr, &ws);   /* MPI outlives every endpoint below */
    cr_assert_null(st, "%s", st ? st->message : "");
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    bool same_clock = ws == 1 || (ls && atoi(ls) == ws);
    int meshes[3][2] = {{ws, 1}, {1, ws}, {2, ws / 2}};
    int n_mesh = ws == 1 ? 1 : (ws % 2 == 0 && ws >= 4) ? 3 : 2;
    for (int m = 0; m < n_mesh; m++) {
        int R = meshes[m][0], U = meshes[m][1];
        cpc_transport *t = NULL;
        st = cpc_transport_nccl_create(R, U, -1, &t);
        cr_assert_null(st, "create %dx%d: %s", R, U, st ? st->message : "");
        cr_assert(cpc_transport_is_nccl(t));
        cr_assert_not_null(cpc_transport_nccl_stream(t));
        int dev = cpc_transport_nccl_device(t);
        cr_assert_geq(dev, 0);
        cr_assert_eq(cudaSetDevice(dev), cudaSuccess);

        /* host: the suite's own buffers, staged by the transport */
        run_suite(t, R, U, wr, "nccl(host buffers)", same_clock);

        /* device, host-synchronising mode */
        devwrap w = {.base = {&devwrap_vt, NULL}, .in = t};
        w.base.ctx = &w;
        cr_assert_eq(cudaStreamCreateWithFlags(&w.copy, cudaStreamNonBlocking), cudaSuccess);
        run_suite(&w.base, R, U, wr, "nccl(device buffers)", same_clock);

        /* device, events mode: copies on the compute stream */
        w.events = true;
        cr_assert_null(cpc_transport_nccl_set_compute_stream(t, w.copy));
        run_suite(&w.base, R, U, wr, "nccl(device buffers, events)", same_clock);
        cr_assert_null(cpc_transport_nccl_set_compute_stream(t, NULL));
        cudaStreamSynchronize(w.copy);
        cudaStreamDestroy(w.copy);
        cpc_transport_destroy(t);
    }
    cpc_mpi_finalize();
}

#else /* CUDA without NCCL or MPI: creation says what is missing */

Test(transport_nccl, not_built)
{
    cpc_transport *t = (cpc_transport *)0x1;
    cpc_status *st = cpc_transport_nccl_create(1, 1, -1, &t);
    cr_assert_not_null(st);
    cr_expect_eq(st->code, CPC_E_UNSUPPORTED);
    cr_expect_null(t);
    cr_expect(strstr(st->message, "no NCCL") || strstr(st->message, "no MPI"), "%s",
              st->message);
    cpc_status_free(st);
    (void)have_gpu;
}

#endif
#endif /* CPC_HAVE_CUDA */
