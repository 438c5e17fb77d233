/* transport_nccl.c - see transport_nccl.h */
#include "transport_nccl.h"

#if defined(CPC_HAVE_NCCL) && defined(CPC_HAVE_MPI)

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "transport_mpi.h"

/* ---- the endpoint ------------------------------------------------------------ */

typedef struct nccl_group {
    ncclComm_t comm;
    int rank, size;
} nccl_group;

typedef enum req_state { REQ_POSTED, REQ_ISSUED, REQ_DONE, REQ_FAILED } req_state;

struct cpc_request {
    bool is_recv;
    cpc_group group;
    int peer, tag;
    size_t bytes;
    uint64_t seq;          /* posting order on this endpoint */
    void *user;            /* the caller's buffer */
    void *dev;             /* what NCCL reads/writes: user, or a bounce buffer */
    bool staged;           /* user is host memory; dev is our bounce buffer */
    req_state state;
    cudaEvent_t ev;        /* recorded on the comm stream after its batch */
    bool has_ev;
};

typedef struct nccl_ctx {
    cpc_transport base;
    nccl_group groups[CPC_GROUP__COUNT];   /* RING, ULYSSES, WORLD */
    int world_rank, world_size;
    int ring_degree, ulysses_degree;
    int device;
    bool owns_mpi;            /* destroy calls cpc_mpi_finalize */
    bool mpi_boot;            /* made by cpc_transport_nccl_create (abort: MPI_Abort) */
    bool world_borrowed;      /* the caller's world communicator: never destroyed here */
    cudaStream_t comm;        /* all NCCL work */
    cudaStream_t stage;       /* host <-> bounce copies (otherwise idle) */
    cudaStream_t compute;     /* borrowed; NULL: host-synchronising mode */
    cudaEvent_t ev_compute;   /* compute -> comm */
    cudaEvent_t ev_done;      /* end of a collective */
    int *scratch;             /* barrier's all-reduce word (device) */
    /* Messages posted but not yet issued, in posting order. */
    cpc_request **pend;
    int n_pend, cap_pend;
    uint64_t seq;
    /* Spare events for requests. */
    cudaEvent_t *evpool;
    int n_ev, cap_ev;
} nccl_ctx;

static const cpc_transport_vtable nccl_vtable;

static nccl_ctx *ctx_of(cpc_transport *t) { return (nccl_ctx *)t->ctx; }

static const char *gname(cpc_group g)
{
    switch (g) {
    case CPC_GROUP_RING: return "ring";
    case CPC_GROUP_ULYSSES: return "ulysses";
    case CPC_GROUP_WORLD: return "world";
    default: return "?";
    }
}

static nccl_group *group_of(nccl_ctx *c, cpc_group g)
{
    if (g != CPC_GROUP_RING && g != CPC_GROUP_ULYSSES && g != CPC_GROUP_WORLD)
        return NULL;
    return &c->groups[g];
}

/* The CUDA current device is per thread: every entry point selects the
 * endpoint's device, so the endpoint may be used from another thread than
 * the one that created it (one thread at a time). */
static void use_device(nccl_ctx *c)
{
    cudaSetDevice(c->device);
}

/* ---- foreign errors to statuses ------------------------------------------------ */

static cpc_status *cuda_status(nccl_ctx *c, cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "rank P: <what>: CUDA: <string> (<name>)"; allocation failures are NOMEM. */
static cpc_status *cuda_status(nccl_ctx *c, cudaError_t e, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    (void)cudaGetLastError();   /* clear a sticky non-fatal error */
    return cpc_error(e == cudaErrorMemoryAllocation ? CPC_E_NOMEM : CPC_E_RUNTIME,
                     "rank %d: %s: CUDA: %s (%s)", c ? c->world_rank : -1, what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

static cpc_status *nccl_status(nccl_ctx *c, ncclComm_t comm, ncclResult_t r, const char *fmt,
                               ...) __attribute__((format(printf, 4, 5)));

/* "rank P: <what>: NCCL: <ncclGetErrorString> (<ncclGetLastError>)". */
static cpc_status *nccl_status(nccl_ctx *c, ncclComm_t comm, ncclResult_t r, const char *fmt,
                               ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *last = ncclGetLastError(comm);
    return cpc_error(CPC_E_RUNTIME, "rank %d: %s: NCCL: %s%s%s%s", c ? c->world_rank : -1, what,
                     ncclGetErrorString(r), last && *last ? " (" : "", last ? last : "",
                     last && *last ? ")" : "");
}

static cpc_status *mpi_status(int world_rank, int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    else
        msg[len < 0 ? 0 : (len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len)] = '\0';
    return cpc_error(CPC_E_RUNTIME, "rank %d: %s: %s", world_rank, what, msg);
}

#define CUDA_TRY(c, call, ...)                                                                \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess)                                                                \
            return cuda_status((c), e_, __VA_ARGS__);                                         \
    } while (0)

/* ---- memory kinds and staging ----------------------------------------------------- */

typedef enum mem_kind { MEM_DEVICE, MEM_HOST } mem_kind;

/* Device memory of this GPU (or managed) -> DEVICE; pageable or pinned host
 * memory -> HOST; device memory of another GPU -> CPC_E_USAGE. */
static cpc_status *mem_kind_of(nccl_ctx *c, const void *p, const char *what, mem_kind *k)
{
    *k = MEM_HOST;
    if (!p)
        return NULL;
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   /* older runtimes: unregistered host memory */
        return NULL;
    }
    if (a.type == cudaMemoryTypeManaged) {
        *k = MEM_DEVICE;
    } else if (a.type == cudaMemoryTypeDevice) {
        if (a.device != c->device)
            return cpc_error(CPC_E_USAGE,
                             "rank %d: %s: the buffer is memory of CUDA device %d, but this "
                             "rank's NCCL endpoint uses device %d",
                             c->world_rank, what, a.device, c->device);
        *k = MEM_DEVICE;
    }
    return NULL;
}

/* A device copy of `bytes` bytes of host memory (stream-ordered allocation
 * on the stage stream, complete when this returns). */
static cpc_status *stage_in(nccl_ctx *c, const void *host, size_t bytes, void **dev,
                            const char *what)
{
    *dev = NULL;
    CUDA_TRY(c, cudaMallocAsync(dev, bytes ? bytes : 1, c->stage), "%s: bounce buffer of %zu bytes",
             what, bytes);
    cudaError_t e = bytes ? cudaMemcpyAsync(*dev, host, bytes, cudaMemcpyHostToDevice, c->stage)
                          : cudaSuccess;
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stage);
    if (e != cudaSuccess) {
        cudaFreeAsync(*dev, c->stage);
        *dev = NULL;
        return cuda_status(c, e, "%s: copying %zu bytes to the device", what, bytes);
    }
    return NULL;
}

/* A device buffer for receiving into host memory (ordered on the comm
 * stream, where NCCL uses it). */
static cpc_status *stage_scratch(nccl_ctx *c, size_t bytes, void **dev, const char *what)
{
    *dev = NULL;
    CUDA_TRY(c, cudaMallocAsync(dev, bytes ? bytes : 1, c->comm),
             "%s: bounce buffer of %zu bytes", what, bytes);
    return NULL;
}

/* Frees a bounce buffer after the work queued on the comm stream. */
static void stage_free(nccl_ctx *c, void *dev)
{
    if (dev)
        cudaFreeAsync(dev, c->comm);
}

/* Copies device bytes to host memory (the caller has already waited for the
 * comm work that wrote them). */
static cpc_status *stage_out(nccl_ctx *c, void *host, const void *dev, size_t bytes,
                             const char *what)
{
    if (!bytes)
        return NULL;
    CUDA_TRY(c, cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, c->stage),
             "%s: copying %zu bytes to the host", what, bytes);
    CUDA_TRY(c, cudaStreamSynchronize(c->stage), "%s: copying %zu bytes to the host", what,
             bytes);
    return NULL;
}

/* ---- events and waiting ------------------------------------------------------------- */

static cpc_status *event_get(nccl_ctx *c, cudaEvent_t *ev)
{
    if (c->n_ev > 0) {
        *ev = c->evpool[--c->n_ev];
        return NULL;
    }
    CUDA_TRY(c, cudaEventCreateWithFlags(ev, cudaEventDisableTiming), "cudaEventCreate");
    return NULL;
}

static void event_put(nccl_ctx *c, cudaEvent_t ev)
{
    if (c->n_ev == c->cap_ev) {
        int nc = c->cap_ev ? 2 * c->cap_ev : 16;
        cudaEvent_t *p = realloc(c->evpool, (size_t)nc * sizeof *p);
        if (!p) {
            cudaEventDestroy(ev);
            return;
        }
        c->evpool = p;
        c->cap_ev = nc;
    }
    c->evpool[c->n_ev++] = ev;
}

/* The first asynchronous NCCL error of the three communicators, or NULL. */
static cpc_status *async_errors(nccl_ctx *c, const char *what)
{
    for (int g = 0; g < CPC_GROUP__COUNT; g++) {
        ncclComm_t comm = c->groups[g].comm;
        if (!comm)
            continue;
        ncclResult_t ar = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &ar);
        if (r != ncclSuccess)
            return nccl_status(c, comm, r, "%s: ncclCommGetAsyncError (%s group)", what,
                               gname((cpc_group)g));
        if (ar != ncclSuccess && ar != ncclInProgress)
            return nccl_status(c, comm, ar, "%s: asynchronous error in the %s group", what,
                               gname((cpc_group)g));
    }
    return NULL;
}

/* Blocks the host until `ev` has completed, watching NCCL's asynchronous
 * errors (a failed peer or network reports there instead of completing). */
static cpc_status *host_wait(nccl_ctx *c, cudaEvent_t ev, const char *what)
{
    for (long spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return NULL;
        if (e != cudaErrorNotReady)
            return cuda_status(c, e, "%s: waiting for the transfer", what);
        if (spins % 64 == 0) {
            cpc_status *st = async_errors(c, what);
            if (st)
                return st;
        }
        if (spins > 1000) {
            struct timespec ts = {0, 50000};   /* 50 us */
            nanosleep(&ts, NULL);
        }
    }
}

/* compute -> comm before issuing NCCL work: with a compute stream, the comm
 * stream waits for it; without one, the host waits for the whole device
 * (whatever queued the data to send is finished). */
static cpc_status *before_issue(nccl_ctx *c, const char *what)
{
    if (c->compute) {
        CUDA_TRY(c, cudaEventRecord(c->ev_compute, c->compute), "%s: recording the compute event",
                 what);
        CUDA_TRY(c, cudaStreamWaitEvent(c->comm, c->ev_compute, 0),
                 "%s: ordering communication after compute", what);
        return NULL;
    }
    CUDA_TRY(c, cudaDeviceSynchronize(), "%s: waiting for the device before communicating", what);
    return NULL;
}

/* End of a collective: the compute stream waits for it (event mode, no host
 * buffer involved), or the host does. */
static cpc_status *complete(nccl_ctx *c, bool host_needed, const char *what)
{
    CUDA_TRY(c, cudaEventRecord(c->ev_done, c->comm), "%s: recording the completion event", what);
    if (c->compute && !host_needed) {
        CUDA_TRY(c, cudaStreamWaitEvent(c->compute, c->ev_done, 0),
                 "%s: ordering compute after communication", what);
        return async_errors(c, what);
    }
    return host_wait(c, c->ev_done, what);
}

/* ---- point-to-point ---------------------------------------------------------------- */

static int cmp_req(const void *a, const void *b)
{
    const cpc_request *x = *(cpc_request *const *)a, *y = *(cpc_request *const *)b;
    if (x->tag != y->tag)
        return x->tag < y->tag ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Issues every posted message (see POINT-TO-POINT in the header). */
static cpc_status *flush(nccl_ctx *c, const char *what)
{
    if (c->n_pend == 0)
        return NULL;
    cpc_status *st = before_issue(c, what);
    cpc_request **tmp = st ? NULL : malloc((size_t)c->n_pend * sizeof *tmp);
    if (!st && !tmp)
        st = cpc_error(CPC_E_NOMEM, "rank %d: %s: out of memory", c->world_rank, what);
    for (int g = 0; g < CPC_GROUP__COUNT && !st; g++) {
        int n = 0;
        for (int i = 0; i < c->n_pend; i++)
            if ((int)c->pend[i]->group == g)
                tmp[n++] = c->pend[i];
        if (n == 0)
            continue;
        qsort(tmp, (size_t)n, sizeof *tmp, cmp_req);
        ncclComm_t comm = c->groups[g].comm;
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) {
            st = nccl_status(c, comm, r, "%s: ncclGroupStart (%s group)", what,
                             gname((cpc_group)g));
            break;
        }
        for (int i = 0; i < n && !st; i++) {
            cpc_request *q = tmp[i];
            r = q->is_recv ? ncclRecv(q->dev, q->bytes, ncclUint8, q->peer, comm, c->comm)
                           : ncclSend(q->dev, q->bytes, ncclUint8, q->peer, comm, c->comm);
            if (r != ncclSuccess)
                st = nccl_status(c, comm, r, "%s: %s %s member %d (%zu bytes, tag %d)", what,
                                 q->is_recv ? "ncclRecv from" : "ncclSend to",
                                 gname((cpc_group)g), q->peer, q->bytes, q->tag);
        }
        r = ncclGroupEnd();
        if (r != ncclSuccess && !st)
            st = nccl_status(c, comm, r, "%s: ncclGroupEnd (%d messages in the %s group)", what, n,
                             gname((cpc_group)g));
    }
    free(tmp);
    for (int i = 0; i < c->n_pend; i++) {
        cpc_request *q = c->pend[i];
        if (!st) {
            cudaError_t e = cudaEventRecord(q->ev, c->comm);
            if (e != cudaSuccess)
                st = cuda_status(c, e, "%s: recording a request's event", what);
        }
        q->state = st ? REQ_FAILED : REQ_ISSUED;
    }
    c->n_pend = 0;
    return st;
}

static cpc_status *post(cpc_transport *t, bool is_recv, cpc_group g, int peer, void *buf,
                        size_t bytes, int tag, cpc_request **req)
{
    nccl_ctx *c = ctx_of(t);
    const char *op = is_recv ? "recv from" : "send to";
    *req = NULL;
    use_device(c);
    nccl_group *gr = group_of(c, g);
    if (!gr)
        return cpc_error(CPC_E_INTERNAL, "rank %d: %s: invalid group %d", c->world_rank,
                         is_recv ? "recv" : "send", (int)g);
    if (peer < 0 || peer >= gr->size)
        return cpc_error(CPC_E_RUNTIME, "rank %d: %s %s member %d: peer out of range [0, %d)",
                         c->world_rank, op, gname(g), peer, gr->size);
    if (tag < 0)
        return cpc_error(CPC_E_RUNTIME, "rank %d: %s %s member %d: tag %d is negative",
                         c->world_rank, op, gname(g), peer, tag);
    if (!buf && bytes > 0)
        return cpc_error(CPC_E_INTERNAL, "rank %d: %s %s member %d: NULL buffer of %zu bytes",
                         c->world_rank, op, gname(g), peer, bytes);
    char what[128];
    snprintf(what, sizeof what, "%s %s member %d (%zu bytes, tag %d)", op, gname(g), peer, bytes,
             tag);
    mem_kind k = MEM_DEVICE;
    cpc_status *st = bytes ? mem_kind_of(c, buf, what, &k) : NULL;
    if (st)
        return st;
    cpc_request *q = calloc(1, sizeof *q);
    if (!q)
        return cpc_error(CPC_E_NOMEM, "rank %d: %s: out of memory", c->world_rank, what);
    q->is_recv = is_recv;
    q->group = g;
    q->peer = peer;
    q->tag = tag;
    q->bytes = bytes;
    q->user = buf;
    q->dev = buf;
    q->seq = c->seq++;
    if (bytes == 0) {   /* nothing to move: complete now, on both sides */
        q->state = REQ_DONE;
        *req = q;
        return NULL;
    }
    if (k == MEM_HOST) {
        q->staged = true;
        st = is_recv ? stage_scratch(c, bytes, &q->dev, what)
                     : stage_in(c, buf, bytes, &q->dev, what);
        if (st) {
            free(q);
            return st;
        }
    }
    if ((st = event_get(c, &q->ev))) {
        if (q->staged)
            stage_free(c, q->dev);
        free(q);
        return st;
    }
    q->has_ev = true;
    if (c->n_pend == c->cap_pend) {
        int nc = c->cap_pend ? 2 * c->cap_pend : 16;
        cpc_request **p = realloc(c->pend, (size_t)nc * sizeof *p);
        if (!p) {
            event_put(c, q->ev);
            if (q->staged)
                stage_free(c, q->dev);
            free(q);
            return cpc_error(CPC_E_NOMEM, "rank %d: %s: out of memory", c->world_rank, what);
        }
        c->pend = p;
        c->cap_pend = nc;
    }
    q->state = REQ_POSTED;
    c->pend[c->n_pend++] = q;
    *req = q;
    return NULL;
}

static cpc_status *n_isend(cpc_transport *t, cpc_group g, int peer, const void *buf,
                           size_t bytes, int tag, cpc_request **req)
{
    return post(t, false, g, peer, (void *)buf, bytes, tag, req);
}

static cpc_status *n_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    return post(t, true, g, peer, buf, bytes, tag, req);
}

static void req_free(nccl_ctx *c, cpc_request *q)
{
    if (q->staged)
        stage_free(c, q->dev);
    if (q->has_ev)
        event_put(c, q->ev);
    free(q);
}

static cpc_status *n_wait(cpc_transport *t, cpc_request *q)
{
    nccl_ctx *c = ctx_of(t);
    if (!q)
        return cpc_error(CPC_E_INTERNAL, "rank %d: wait: NULL request", c->world_rank);
    use_device(c);
    char what[128];
    snprintf(what, sizeof what, "wait: %s %s member %d (%zu bytes, tag %d)",
             q->is_recv ? "recv from" : "send to", gname(q->group), q->peer, q->bytes, q->tag);
    cpc_status *st = NULL;
    if (q->state == REQ_POSTED) {
        st = flush(c, what);
        if (st) {
            /* flush marked every posted request FAILED and emptied the
             * pending list, so this one is no longer referenced. */
            req_free(c, q);
            return st;
        }
    }
    switch (q->state) {
    case REQ_DONE:
        break;
    case REQ_FAILED:
        st = cpc_error(CPC_E_RUNTIME, "rank %d: %s: the batch holding this message failed to "
                                      "be issued (see the first error)",
                       c->world_rank, what);
        break;
    case REQ_ISSUED:
        if (q->staged || !c->compute) {
            st = host_wait(c, q->ev, what);
            if (!st && q->staged && q->is_recv)
                st = stage_out(c, q->user, q->dev, q->bytes, what);
        } else {
            cudaError_t e = cudaStreamWaitEvent(c->compute, q->ev, 0);
            st = e != cudaSuccess ? cuda_status(c, e, "%s: ordering compute after the transfer",
                                                what)
                                  : async_errors(c, what);
        }
        break;
    case REQ_POSTED:
        st = cpc_error(CPC_E_INTERNAL, "rank %d: %s: still posted after a flush", c->world_rank,
                       what);
        break;
    }
    req_free(c, q);
    return st;
}

/* ---- collectives --------------------------------------------------------------------- */

static size_t extent(int n, const size_t *counts, const size_t *displs)
{
    size_t e = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] && displs[i] + counts[i] > e)
            e = displs[i] + counts[i];
    return e;
}

/* Device views of a collective's send and receive buffers (bounce buffers
 * for host memory). */
typedef struct coll_bufs {
    const char *s;        /* device send base */
    char *r;              /* device receive base */
    void *s_bounce, *r_bounce;
    bool r_host;          /* copy the received parts back to the host */
} coll_bufs;

static cpc_status *coll_prepare(nccl_ctx *c, const void *send, size_t s_ext, void *recv,
                                size_t r_ext, coll_bufs *b, const char *what)
{
    memset(b, 0, sizeof *b);
    b->s = send;
    b->r = recv;
    mem_kind ks = MEM_DEVICE, kr = MEM_DEVICE;
    cpc_status *st = NULL;
    if (s_ext && (st = mem_kind_of(c, send, what, &ks)))
        return st;
    if (r_ext && (st = mem_kind_of(c, recv, what, &kr)))
        return st;
    if (s_ext && ks == MEM_HOST) {
        if ((st = stage_in(c, send, s_ext, &b->s_bounce, what)))
            return st;
        b->s = b->s_bounce;
    }
    if (r_ext && kr == MEM_HOST) {
        if ((st = stage_scratch(c, r_ext, &b->r_bounce, what))) {
            stage_free(c, b->s_bounce);
            return st;
        }
        b->r = b->r_bounce;
        b->r_host = true;
    }
    return NULL;
}

/* Completes a collective: waits (see complete()), copies received parts to
 * host memory when staged, frees bounce buffers. */
static cpc_status *coll_finish(nccl_ctx *c, coll_bufs *b, void *recv, int n,
                               const size_t *counts, const size_t *displs, cpc_status *st,
                               const char *what)
{
    if (!st)
        st = complete(c, b->r_host, what);
    for (int j = 0; j < n && !st && b->r_host; j++)
        if (counts[j])
            st = stage_out(c, (char *)recv + displs[j], b->r + displs[j], counts[j], what);
    stage_free(c, b->s_bounce);
    stage_free(c, b->r_bounce);
    return st;
}

static cpc_status *n_all_to_all_v(cpc_transport *t, cpc_group g, const void *send,
                                  const size_t *sc, const size_t *sd, void *recv,
                                  const size_t *rc, const size_t *rd)
{
    nccl_ctx *c = ctx_of(t);
    nccl_group *gr = group_of(c, g);
    if (!gr)
        return cpc_error(CPC_E_INTERNAL, "rank %d: all_to_all_v: invalid group %d",
                         c->world_rank, (int)g);
    int n = gr->size, me = gr->rank;
    use_device(c);
    char what[96];
    snprintf(what, sizeof what, "all_to_all_v over the %s group", gname(g));
    if (sc[me] != rc[me])
        return cpc_error(CPC_E_INTERNAL, "rank %d: %s: own part: sends %zu bytes, receives %zu",
                         c->world_rank, what, sc[me], rc[me]);
    cpc_status *st = flush(c, what);
    if (st)
        return st;
    coll_bufs b;
    if ((st = coll_prepare(c, send, extent(n, sc, sd), recv, extent(n, rc, rd), &b, what)))
        return st;
    st = before_issue(c, what);
    if (!st && sc[me]) {
        cudaError_t e = cudaMemcpyAsync(b.r + rd[me], b.s + sd[me], sc[me],
                                        cudaMemcpyDeviceToDevice, c->comm);
        if (e != cudaSuccess)
            st = cuda_status(c, e, "%s: own part (%zu bytes)", what, sc[me]);
    }
    if (!st) {
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) {
            st = nccl_status(c, gr->comm, r, "%s: ncclGroupStart", what);
        } else {
            for (int j = 0; j < n && !st; j++) {
                if (j == me)
                    continue;
                if (sc[j]) {   /* zero-byte parts: skipped on both sides alike */
                    r = ncclSend(b.s + sd[j], sc[j], ncclUint8, j, gr->comm, c->comm);
                    if (r != ncclSuccess) {
                        st = nccl_status(c, gr->comm, r,
                                         "%s: ncclSend to member %d (%zu bytes)", what, j, sc[j]);
                        break;
                    }
                }
                if (rc[j]) {
                    r = ncclRecv(b.r + rd[j], rc[j], ncclUint8, j, gr->comm, c->comm);
                    if (r != ncclSuccess)
                        st = nccl_status(c, gr->comm, r,
                                         "%s: ncclRecv from member %d (%zu bytes)", what, j,
                                         rc[j]);
                }
            }
            r = ncclGroupEnd();
            if (r != ncclSuccess && !st)
                st = nccl_status(c, gr->comm, r, "%s: ncclGroupEnd", what);
        }
    }
    return coll_finish(c, &b, recv, n, rc, rd, st, what);
}

static cpc_status *n_all_gather_v(cpc_transport *t, cpc_group g, const void *send,
                                  size_t send_bytes, void *recv, const size_t *counts,
                                  const size_t *displs)
{
    nccl_ctx *c = ctx_of(t);
    nccl_group *gr = group_of(c, g);
    if (!gr)
        return cpc_error(CPC_E_INTERNAL, "rank %d: all_gather_v: invalid group %d",
                         c->world_rank, (int)g);
    int n = gr->size, me = gr->rank;
    use_device(c);
    char what[96];
    snprintf(what, sizeof what, "all_gather_v over the %s group", gname(g));
    if (counts[me] != send_bytes)
        return cpc_error(CPC_E_INTERNAL, "rank %d: %s: send_bytes %zu != counts[%d] %zu",
                         c->world_rank, what, send_bytes, me, counts[me]);
    cpc_status *st = flush(c, what);
    if (st)
        return st;
    bool uniform = true;   /* equal counts, parts contiguous in member order */
    for (int j = 0; j < n; j++)
        if (counts[j] != counts[0] || displs[j] != (size_t)j * counts[0])
            uniform = false;
    coll_bufs b;
    if ((st = coll_prepare(c, send, send_bytes, recv, extent(n, counts, displs), &b, what)))
        return st;
    const char *own = b.r + displs[me];
    /* Out of place, the send buffer must not overlap the receive extent. */
    size_t r_ext = extent(n, counts, displs);
    bool overlap = send_bytes && b.s != own && b.s < b.r + r_ext && b.r < b.s + send_bytes;
    st = before_issue(c, what);
    if (!st && uniform && !overlap) {
        if (counts[0]) {
            ncclResult_t r = ncclAllGather(b.s, b.r, counts[0], ncclUint8, gr->comm, c->comm);
            if (r != ncclSuccess)
                st = nccl_status(c, gr->comm, r, "%s: ncclAllGather (%zu bytes each)", what,
                                 counts[0]);
        }
    } else if (!st) {
        if (send_bytes && b.s != own) {
            cudaError_t e = cudaMemcpyAsync(b.r + displs[me], b.s, send_bytes,
                                            cudaMemcpyDeviceToDevice, c->comm);
            if (e != cudaSuccess)
                st = cuda_status(c, e, "%s: own part (%zu bytes)", what, send_bytes);
            /* Peers read the own part in place from now on (it is there
             * once the copy above has run: same stream). */
            b.s = b.r + displs[me];
        }
        ncclResult_t r = st ? ncclSuccess : ncclGroupStart();
        if (r != ncclSuccess) {
            st = nccl_status(c, gr->comm, r, "%s: ncclGroupStart", what);
        } else if (!st) {
            for (int j = 0; j < n && !st; j++) {
                if (j == me)
                    continue;
                if (send_bytes) {
                    r = ncclSend(b.s, send_bytes, ncclUint8, j, gr->comm, c->comm);
                    if (r != ncclSuccess) {
                        st = nccl_status(c, gr->comm, r,
                                         "%s: ncclSend to member %d (%zu bytes)", what, j,
                                         send_bytes);
                        break;
                    }
                }
                if (counts[j]) {
                    r = ncclRecv(b.r + displs[j], counts[j], ncclUint8, j, gr->comm, c->comm);
                    if (r != ncclSuccess)
                        st = nccl_status(c, gr->comm, r,
                                         "%s: ncclRecv from member %d (%zu bytes)", what, j,
                                         counts[j]);
                }
            }
            r = ncclGroupEnd();
            if (r != ncclSuccess && !st)
                st = nccl_status(c, gr->comm, r, "%s: ncclGroupEnd", what);
        }
    }
    return coll_finish(c, &b, recv, n, counts, displs, st, what);
}

static cpc_status *n_barrier(cpc_transport *t, cpc_group g)
{
    nccl_ctx *c = ctx_of(t);
    nccl_group *gr = group_of(c, g);
    if (!gr)
        return cpc_error(CPC_E_INTERNAL, "rank %d: barrier: invalid group %d", c->world_rank,
                         (int)g);
    use_device(c);
    char what[64];
    snprintf(what, sizeof what, "barrier over the %s group", gname(g));
    cpc_status *st = flush(c, what);
    if (!st)
        st = before_issue(c, what);
    if (st)
        return st;
    ncclResult_t r = ncclAllReduce(c->scratch, c->scratch, 1, ncclInt32, ncclSum, gr->comm,
                                   c->comm);
    if (r != ncclSuccess)
        return nccl_status(c, gr->comm, r, "%s: ncclAllReduce", what);
    return complete(c, true, what);
}

/* ---- abort, destroy -------------------------------------------------------------------- */

static void n_abort(cpc_transport *t, const char *why)
{
    nccl_ctx *c = ctx_of(t);
    /* Split communicators first, the world last (their parent). */
    static const cpc_group order[] = {CPC_GROUP_RING, CPC_GROUP_ULYSSES, CPC_GROUP_WORLD};
    for (int i = 0; i < 3; i++) {
        nccl_group *gr = &c->groups[order[i]];
        if (gr->comm && !(order[i] == CPC_GROUP_WORLD && c->world_borrowed))
            ncclCommAbort(gr->comm);
        gr->comm = NULL;
    }
    if (c->mpi_boot)
        cpc_mpi_abort(3, why);
    /* No MPI job to abort (a unique id or a communicator of the caller, e.g.
     * under torchrun): this process ends; its peers' NCCL calls fail when
     * its connections close, and the launcher ends the job. */
    fprintf(stderr, "cprun: rank %d: aborting: %s\n", c->world_rank, why ? why : "(no reason given)");
    fflush(stdout);
    fflush(stderr);
    _Exit(3);
}

static void free_local(nccl_ctx *c)
{
    for (int i = 0; i < c->n_ev; i++)
        cudaEventDestroy(c->evpool[i]);
    free(c->evpool);
    free(c->pend);
    if (c->ev_compute)
        cudaEventDestroy(c->ev_compute);
    if (c->ev_done)
        cudaEventDestroy(c->ev_done);
    if (c->scratch)
        cudaFree(c->scratch);
    if (c->comm)
        cudaStreamDestroy(c->comm);
    if (c->stage)
        cudaStreamDestroy(c->stage);
}

static void free_comms(nccl_ctx *c, bool abort)
{
    static const cpc_group order[] = {CPC_GROUP_RING, CPC_GROUP_ULYSSES, CPC_GROUP_WORLD};
    for (int i = 0; i < 3; i++) {
        nccl_group *gr = &c->groups[order[i]];
        if (!gr->comm)
            continue;
        if (order[i] == CPC_GROUP_WORLD && c->world_borrowed) {
            gr->comm = NULL;   /* the caller's */
            continue;
        }
        if (abort) {
            ncclCommAbort(gr->comm);
        } else {
            ncclCommFinalize(gr->comm);
            ncclCommDestroy(gr->comm);
        }
        gr->comm = NULL;
    }
}

static void n_destroy(cpc_transport *t)
{
    if (!t)
        return;
    nccl_ctx *c = ctx_of(t);
    cudaSetDevice(c->device);
    if (c->comm)
        cudaStreamSynchronize(c->comm);
    free_comms(c, false);
    free_local(c);
    bool owns = c->owns_mpi;
    free(c);
    if (owns)
        cpc_mpi_finalize();
}

/* vt->flush: issues the posted messages, but holds a batch of sends only
 * (no receive among them) until the next flush that has a receive, or a
 * wait, collective or barrier.  Why: a send whose receive the peer posts in
 * a LATER batch (the backward ring's dK/dV accumulator: sent at step s,
 * received at step s+1) must not be issued alone: both ranks' lone sends
 * would wait for each other's later receives, queued behind them on the
 * comm stream (NCCL deadlocks once a message exceeds its buffers).  Held,
 * it joins the batch of the step that receives.  Every rank runs the same
 * program, so every rank holds alike. */
static cpc_status *n_flush(cpc_transport *t)
{
    nccl_ctx *c = ctx_of(t);
    bool any_recv = false;
    for (int i = 0; i < c->n_pend && !any_recv; i++)
        any_recv = c->pend[i]->is_recv;
    if (!any_recv)
        return NULL;
    use_device(c);
    return flush(c, "flush");
}

static int n_group_rank(cpc_transport *t, cpc_group g)
{
    nccl_group *gr = group_of(ctx_of(t), g);
    return gr ? gr->rank : -1;
}

static int n_group_size(cpc_transport *t, cpc_group g)
{
    nccl_group *gr = group_of(ctx_of(t), g);
    return gr ? gr->size : -1;
}

static const cpc_transport_vtable nccl_vtable = {
    .name = "nccl",
    .group_rank = n_group_rank,
    .group_size = n_group_size,
    .isend = n_isend,
    .irecv = n_irecv,
    .wait = n_wait,
    .all_to_all_v = n_all_to_all_v,
    .all_gather_v = n_all_gather_v,
    .barrier = n_barrier,
    .abort = n_abort,
    .destroy = n_destroy,
    .flush = n_flush,
};

/* ---- creation --------------------------------------------------------------------------- */

static bool mpi_live(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

/* The GPU count, "" in `why` when usable, else the reason. */
static int gpu_count(char *why, size_t n)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, n, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return 0;
    }
    if (ndev <= 0)
        snprintf(why, n, "cudaGetDeviceCount found no GPU (CUDA_VISIBLE_DEVICES=%s)",
                 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    return ndev;
}

/* This rank's local resources on `device`: streams, events, scratch. */
static cpc_status *local_setup(nccl_ctx *c)
{
    int least = 0, greatest = 0;
    CUDA_TRY(c, cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities");
    CUDA_TRY(c, cudaStreamCreateWithPriority(&c->comm, cudaStreamNonBlocking, greatest),
             "creating the communication stream");
    CUDA_TRY(c, cudaStreamCreateWithFlags(&c->stage, cudaStreamNonBlocking),
             "creating the staging stream");
    CUDA_TRY(c, cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming),
             "cudaEventCreate");
    CUDA_TRY(c, cudaEventCreateWithFlags(&c->ev_done, cudaEventDisableTiming), "cudaEventCreate");
    CUDA_TRY(c, cudaMalloc((void **)&c->scratch, 4 * sizeof(int)), "barrier scratch");
    CUDA_TRY(c, cudaMemset(c->scratch, 0, 4 * sizeof(int)), "barrier scratch");
    return NULL;
}

/* Every rank learns the lowest world rank whose `ok` is false (INT_MAX:
 * none).  Collective over MPI_COMM_WORLD. */
static cpc_status *agree(int world_rank, bool ok, int *first_bad, const char *what)
{
    int mine = ok ? INT_MAX : world_rank;
    int rc = MPI_Allreduce(&mine, first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return mpi_status(world_rank, rc, what);
    return NULL;
}

static cpc_status *split_groups(nccl_ctx *c, ncclComm_t world, int ring_degree,
                                int ulysses_degree);

/* The mesh degrees every creation takes: >= 1, and R x U an int. */
static cpc_status *check_degrees(int ring_degree, int ulysses_degree)
{
    if (ring_degree < 1 || ulysses_degree < 1)
        return cpc_error(CPC_E_USAGE, "nccl transport: ring_degree %d and ulysses_degree %d "
                                      "must be >= 1", ring_degree, ulysses_degree);
    if ((long long)ring_degree * ulysses_degree > INT_MAX)
        return cpc_error(CPC_E_USAGE, "nccl transport: mesh %d x %d is too large", ring_degree,
                         ulysses_degree);
    return NULL;
}

cpc_status *cpc_transport_nccl_create(int ring_degree, int ulysses_degree, int device,
                                      cpc_transport **out)
{
    *out = NULL;
    cpc_status *dst = check_degrees(ring_degree, ulysses_degree);
    if (dst)
        return dst;
    /* 1. The GPU, before MPI is touched. */
    char why[384] = "";
    int ndev = gpu_count(why, sizeof why);
    bool was_live = mpi_live();
    if (why[0] && !was_live && !cpc_mpi_launched()) {
        /* A single process: nobody to agree with, leave MPI alone. */
        cpc_status *st = cpc_error(CPC_E_UNSUPPORTED, "no CUDA device: %s", why);
        cpc_status_set_hint(st, "run with --backend cpu and the local or MPI transport");
        return st;
    }

    /* 2. MPI, the world size, the device. */
    int wr = 0, ws = 0;
    cpc_status *st = cpc_mpi_init(&wr, &ws);
    if (st) {
        cpc_status_prefix(st, "nccl transport: bootstrapping with MPI");
        return st;
    }
    int want = ring_degree * ulysses_degree;
    if (ws != want) {
        st = cpc_error(CPC_E_USAGE,
                       "nccl transport: the plan's mesh needs world_size %d (ring_degree %d x "
                       "ulysses_degree %d) but the job has %d MPI processes",
                       want, ring_degree, ulysses_degree, ws);
        cpc_status_set_hint(st, "start %d processes (mpirun -np %d / srun -n %d), one per GPU",
                            want, want, want);
        return st;
    }
    nccl_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return cpc_error(CPC_E_NOMEM, "nccl transport: out of memory");
    c->world_rank = wr;
    c->world_size = ws;
    c->ring_degree = ring_degree;
    c->ulysses_degree = ulysses_degree;
    c->owns_mpi = !was_live;
    c->mpi_boot = true;
    c->base.vt = &nccl_vtable;
    c->base.ctx = c;
    int local = cpc_mpi_local_rank();   /* collective when the environment lacks it */
    if (!why[0]) {
        c->device = device >= 0 ? device : (local < 0 ? 0 : local % ndev);
        if (c->device >= ndev) {
            snprintf(why, sizeof why, "device %d requested, %d visible", c->device, ndev);
        } else {
            cudaError_t e = cudaSetDevice(c->device);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                snprintf(why, sizeof why, "cudaSetDevice(%d): %s (%s)", c->device,
                         cudaGetErrorString(e), cudaGetErrorName(e));
            }
        }
    }
    cpc_status *local_st = why[0] ? NULL : local_setup(c);
    int first_bad = INT_MAX;
    if ((st = agree(wr, !why[0] && !local_st, &first_bad, "nccl transport: MPI_Allreduce")))
        goto fail;
    if (first_bad != INT_MAX) {
        if (why[0]) {
            st = cpc_error(CPC_E_UNSUPPORTED, "no CUDA device: world rank %d: %s", wr, why);
            cpc_status_set_hint(st, "run with --backend cpu --transport mpi, or on a node "
                                    "with one GPU per rank");
        } else if (local_st) {
            st = local_st;
            local_st = NULL;
        } else {
            st = cpc_error(CPC_E_UNSUPPORTED,
                           "nccl transport: world rank %d cannot use its GPU (its own "
                           "message says why); no rank starts",
                           first_bad);
        }
        goto fail;
    }

    /* 3. The unique id from rank 0. */
    struct {
        int ok;
        ncclUniqueId id;
    } boot;
    memset(&boot, 0, sizeof boot);
    ncclResult_t r = ncclSuccess;
    if (wr == 0) {
        r = ncclGetUniqueId(&boot.id);
        boot.ok = r == ncclSuccess;
    }
    int rc = MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        st = mpi_status(wr, rc, "nccl transport: MPI_Bcast of the ncclUniqueId");
        goto fail;
    }
    if (!boot.ok) {
        st = wr == 0 ? nccl_status(c, NULL, r, "nccl transport: ncclGetUniqueId")
                     : cpc_error(CPC_E_RUNTIME, "rank %d: nccl transport: rank 0 could not "
                                                "make the ncclUniqueId",
                                 wr);
        goto fail;
    }

    /* 4. The world communicator, then the two groups split from it. */
    ncclComm_t world = NULL;
    r = ncclCommInitRank(&world, ws, boot.id, wr);
    bool init_ok = r == ncclSuccess;
    if (!init_ok)
        st = nccl_status(c, NULL, r, "nccl transport: ncclCommInitRank (world of %d)", ws);
    else
        c->groups[CPC_GROUP_WORLD].comm = world;
    cpc_status *st2 = agree(wr, init_ok, &first_bad, "nccl transport: MPI_Allreduce");
    if (st2 || first_bad != INT_MAX) {
        if (!st)
            st = st2 ? st2
                     : cpc_error(CPC_E_RUNTIME, "rank %d: nccl transport: ncclCommInitRank "
                                                "failed on world rank %d",
                                 wr, first_bad);
        else
            cpc_status_free(st2);
        goto fail;
    }
    if ((st = split_groups(c, world, ring_degree, ulysses_degree)))
        goto fail;
    *out = &c->base;
    return NULL;

fail:
    cpc_status_free(local_st);
    free_comms(c, true);
    free_local(c);   /* only what local_setup made (NULL fields are skipped) */
    /* MPI stays initialised (see INIT AND FINALIZE): cpc_mpi_finalize ends it. */
    free(c);
    return st;
}

/* The ring and ulysses communicators split from `world` (this rank's world
 * rank c->world_rank), then every group's rank and size checked. */
static cpc_status *split_groups(nccl_ctx *c, ncclComm_t world, int ring_degree, int ulysses_degree)
{
    int wr = c->world_rank, ws = c->world_size;
    ncclResult_t r;
    cpc_status *st = NULL;
    int rr = wr / ulysses_degree, uu = wr % ulysses_degree;
    ncclComm_t ring = NULL, uly = NULL;
    if ((r = ncclCommSplit(world, uu, rr, &ring, NULL)) != ncclSuccess) {
        st = nccl_status(c, world, r, "nccl transport: ncclCommSplit (ring group: color u=%d)",
                         uu);
        goto fail;
    }
    c->groups[CPC_GROUP_RING].comm = ring;
    if ((r = ncclCommSplit(world, rr, uu, &uly, NULL)) != ncclSuccess) {
        st = nccl_status(c, world, r,
                         "nccl transport: ncclCommSplit (ulysses group: color r=%d)", rr);
        goto fail;
    }
    c->groups[CPC_GROUP_ULYSSES].comm = uly;
    static const cpc_group all3[] = {CPC_GROUP_RING, CPC_GROUP_ULYSSES, CPC_GROUP_WORLD};
    for (int i = 0; i < 3; i++) {
        nccl_group *gr = &c->groups[all3[i]];
        if ((r = ncclCommUserRank(gr->comm, &gr->rank)) != ncclSuccess ||
            (r = ncclCommCount(gr->comm, &gr->size)) != ncclSuccess) {
            st = nccl_status(c, gr->comm, r, "nccl transport: querying the %s group",
                             gname(all3[i]));
            goto fail;
        }
    }
    if (c->groups[CPC_GROUP_RING].rank != rr || c->groups[CPC_GROUP_RING].size != ring_degree ||
        c->groups[CPC_GROUP_ULYSSES].rank != uu ||
        c->groups[CPC_GROUP_ULYSSES].size != ulysses_degree ||
        c->groups[CPC_GROUP_WORLD].rank != wr || c->groups[CPC_GROUP_WORLD].size != ws) {
        st = cpc_error(CPC_E_INTERNAL, "rank %d: nccl transport: ncclCommSplit gave unexpected "
                                       "groups", wr);
        goto fail;
    }
    return NULL;
fail:
    return st;
}

/* ---- creation over the caller's bootstrap (no MPI) ------------------------------------ */


/* The endpoint over an existing world communicator (rank wr of ws, on
 * `device`): local resources, then the ring and ulysses splits (collective
 * over `world`).  On failure an owned world is aborted, a borrowed one left
 * alone. */
static cpc_status *create_over(ncclComm_t world, bool borrowed, int wr, int ws, int device,
                               int ring_degree, int ulysses_degree, cpc_transport **out)
{
    nccl_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (!borrowed)
            ncclCommAbort(world);
        return cpc_error(CPC_E_NOMEM, "nccl transport: out of memory");
    }
    c->world_rank = wr;
    c->world_size = ws;
    c->ring_degree = ring_degree;
    c->ulysses_degree = ulysses_degree;
    c->device = device;
    c->world_borrowed = borrowed;
    c->base.vt = &nccl_vtable;
    c->base.ctx = c;
    c->groups[CPC_GROUP_WORLD].comm = world;
    cpc_status *st = local_setup(c);
    if (!st)
        st = split_groups(c, world, ring_degree, ulysses_degree);
    if (st) {
        free_comms(c, true);
        free_local(c);
        free(c);
        return st;
    }
    *out = &c->base;
    return NULL;
}

cpc_status *cpc_transport_nccl_unique_id(unsigned char *id, size_t n)
{
    if (!id || n != CPC_NCCL_UNIQUE_ID_BYTES)
        return cpc_error(CPC_E_USAGE, "nccl unique id: a buffer of %d bytes is needed (got %zu%s)",
                         CPC_NCCL_UNIQUE_ID_BYTES, n, id ? "" : ", NULL");
    _Static_assert(sizeof(ncclUniqueId) == CPC_NCCL_UNIQUE_ID_BYTES, "ncclUniqueId size");
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return nccl_status(NULL, NULL, r, "ncclGetUniqueId");
    memcpy(id, &u, sizeof u);
    return NULL;
}

cpc_status *cpc_transport_nccl_create_id(const unsigned char *id, size_t n, int rank,
                                         int ring_degree, int ulysses_degree, int device,
                                         cpc_transport **out)
{
    *out = NULL;
    cpc_status *st = check_degrees(ring_degree, ulysses_degree);
    if (st)
        return st;
    int ws = ring_degree * ulysses_degree;
    if (!id || n != CPC_NCCL_UNIQUE_ID_BYTES)
        return cpc_error(CPC_E_USAGE, "nccl transport: the unique id must be %d bytes (got %zu%s)",
                         CPC_NCCL_UNIQUE_ID_BYTES, n, id ? "" : ", NULL");
    if (rank < 0 || rank >= ws)
        return cpc_error(CPC_E_USAGE, "nccl transport: rank %d out of range (world %d = ring %d x "
                                      "ulysses %d)", rank, ws, ring_degree, ulysses_degree);
    char why[384] = "";
    int ndev = gpu_count(why, sizeof why);
    if (!why[0] && device < 0) {
        cudaError_t e = cudaGetDevice(&device);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(why, sizeof why, "cudaGetDevice: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        }
    }
    if (!why[0] && device >= ndev)
        snprintf(why, sizeof why, "device %d requested, %d visible", device, ndev);
    if (!why[0]) {
        cudaError_t e = cudaSetDevice(device);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(why, sizeof why, "cudaSetDevice(%d): %s (%s)", device,
                     cudaGetErrorString(e), cudaGetErrorName(e));
        }
    }
    if (why[0]) {
        st = cpc_error(CPC_E_UNSUPPORTED, "no CUDA device: rank %d: %s", rank, why);
        cpc_status_set_hint(st, "run each rank on a node with its own GPU, or use CPU tensors "
                                "(the gloo / MPI path)");
        return st;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t world = NULL;
    ncclResult_t r = ncclCommInitRank(&world, ws, u, rank);
    if (r != ncclSuccess) {
        st = cpc_error(CPC_E_RUNTIME, "rank %d: nccl transport: ncclCommInitRank (world of %d, "
                                      "device %d): NCCL: %s (%s)", rank, ws, device,
                       ncclGetErrorString(r), ncclGetLastError(NULL));
        cpc_status_set_hint(st, "every rank must pass the same unique id (made once, by one "
                                "rank, and broadcast), its own rank and its own GPU");
        return st;
    }
    return create_over(world, false, rank, ws, device, ring_degree, ulysses_degree, out);
}

cpc_status *cpc_transport_nccl_create_comm(void *nccl_comm, int ring_degree, int ulysses_degree,
                                           cpc_transport **out)
{
    *out = NULL;
    cpc_status *st = check_degrees(ring_degree, ulysses_degree);
    if (st)
        return st;
    if (!nccl_comm)
        return cpc_error(CPC_E_USAGE, "nccl transport: no communicator (NULL)");
    ncclComm_t world = (ncclComm_t)nccl_comm;
    int ws = 0, wr = 0, dev = 0;
    ncclResult_t r;
    if ((r = ncclCommCount(world, &ws)) != ncclSuccess ||
        (r = ncclCommUserRank(world, &wr)) != ncclSuccess ||
        (r = ncclCommCuDevice(world, &dev)) != ncclSuccess)
        return nccl_status(NULL, world, r, "nccl transport: querying the caller's communicator");
    if (ws != ring_degree * ulysses_degree) {
        st = cpc_error(CPC_E_USAGE, "nccl transport: the communicator has %d ranks, the plan's "
                                    "mesh needs %d (ring_degree %d x ulysses_degree %d)",
                       ws, ring_degree * ulysses_degree, ring_degree, ulysses_degree);
        cpc_status_set_hint(st, "pass a communicator of every rank of the plan's world");
        return st;
    }
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess)
        return cuda_status(NULL, e, "nccl transport: cudaSetDevice(%d) (the communicator's device)",
                           dev);
    return create_over(world, true, wr, ws, dev, ring_degree, ulysses_degree, out);
}

bool cpc_transport_is_nccl(const cpc_transport *t)
{
    return t && t->vt == &nccl_vtable;
}

int cpc_transport_nccl_device(const cpc_transport *t)
{
    return cpc_transport_is_nccl(t) ? ((const nccl_ctx *)t->ctx)->device : -1;
}

void *cpc_transport_nccl_stream(const cpc_transport *t)
{
    return cpc_transport_is_nccl(t) ? (void *)((const nccl_ctx *)t->ctx)->comm : NULL;
}

cpc_status *cpc_transport_nccl_set_compute_stream(cpc_transport *t, void *stream)
{
    if (!cpc_transport_is_nccl(t))
        return cpc_error(CPC_E_USAGE, "set_compute_stream: not an nccl transport");
    ctx_of(t)->compute = (cudaStream_t)stream;
    return NULL;
}

cpc_status *cpc_transport_nccl_flush(cpc_transport *t)
{
    if (!cpc_transport_is_nccl(t))
        return cpc_error(CPC_E_USAGE, "flush: not an nccl transport");
    return n_flush(t);
}

static cpc_status *pick_stream(cpc_transport *t, void *stream, const char *fn, cudaStream_t *s)
{
    if (!cpc_transport_is_nccl(t))
        return cpc_error(CPC_E_USAGE, "%s: not an nccl transport", fn);
    *s = stream ? (cudaStream_t)stream : ctx_of(t)->compute;
    if (!*s)
        return cpc_error(CPC_E_USAGE, "%s: no stream given and no compute stream set", fn);
    return NULL;
}

cpc_status *cpc_transport_nccl_compute_to_comm(cpc_transport *t, void *stream)
{
    cudaStream_t s;
    cpc_status *st = pick_stream(t, stream, "compute_to_comm", &s);
    if (st)
        return st;
    nccl_ctx *c = ctx_of(t);
    use_device(c);
    CUDA_TRY(c, cudaEventRecord(c->ev_compute, s), "compute_to_comm: cudaEventRecord");
    CUDA_TRY(c, cudaStreamWaitEvent(c->comm, c->ev_compute, 0),
             "compute_to_comm: cudaStreamWaitEvent");
    return NULL;
}

cpc_status *cpc_transport_nccl_comm_to_compute(cpc_transport *t, void *stream)
{
    cudaStream_t s;
    cpc_status *st = pick_stream(t, stream, "comm_to_compute", &s);
    if (st)
        return st;
    nccl_ctx *c = ctx_of(t);
    use_device(c);
    CUDA_TRY(c, cudaEventRecord(c->ev_done, c->comm), "comm_to_compute: cudaEventRecord");
    CUDA_TRY(c, cudaStreamWaitEvent(s, c->ev_done, 0), "comm_to_compute: cudaStreamWaitEvent");
    return NULL;
}

#else /* a build without NCCL or without MPI: the API answers, nothing runs */

static cpc_status *no_nccl(void)
{
    cpc_status *st = cpc_error(CPC_E_UNSUPPORTED, "nccl transport: this build of libcpc has no %s",
#if !defined(CPC_HAVE_NCCL)
                               "NCCL (CMake did not find libnccl under the CUDA root)"
#else
                               "MPI (the NCCL transport is built with MPI)"
#endif
    );
    cpc_status_set_hint(st, "use CPU tensors (the gloo / MPI path) or a libcpc built with NCCL");
    return st;
}

cpc_status *cpc_transport_nccl_unique_id(unsigned char *id, size_t n)
{
    (void)id;
    (void)n;
    return no_nccl();
}

cpc_status *cpc_transport_nccl_create_id(const unsigned char *id, size_t n, int rank,
                                         int ring_degree, int ulysses_degree, int device,
                                         cpc_transport **out)
{
    (void)id, (void)n, (void)rank, (void)ring_degree, (void)ulysses_degree, (void)device;
    *out = NULL;
    return no_nccl();
}

cpc_status *cpc_transport_nccl_create_comm(void *nccl_comm, int ring_degree, int ulysses_degree,
                                           cpc_transport **out)
{
    (void)nccl_comm, (void)ring_degree, (void)ulysses_degree;
    *out = NULL;
    return no_nccl();
}

cpc_status *cpc_transport_nccl_create(int ring_degree, int ulysses_degree, int device,
                                      cpc_transport **out)
{
    (void)ring_degree;
    (void)ulysses_degree;
    (void)device;
    *out = NULL;
    cpc_status *st = cpc_error(CPC_E_UNSUPPORTED,
                               "nccl transport: this build of cprun has no %s",
#if !defined(CPC_HAVE_NCCL)
                               "NCCL (CMake did not find libnccl under the CUDA root)"
#else
                               "MPI (needed to bootstrap NCCL)"
#endif
    );
    cpc_status_set_hint(st, "use --transport mpi (CPU) or --transport local");
    return st;
}

bool cpc_transport_is_nccl(const cpc_transport *t)
{
    (void)t;
    return false;
}

int cpc_transport_nccl_device(const cpc_transport *t)
{
    (void)t;
    return -1;
}

void *cpc_transport_nccl_stream(const cpc_transport *t)
{
    (void)t;
    return NULL;
}

cpc_status *cpc_transport_nccl_set_compute_stream(cpc_transport *t, void *stream)
{
    (void)t;
    (void)stream;
    return cpc_error(CPC_E_UNSUPPORTED, "nccl transport: not built");
}

cpc_status *cpc_transport_nccl_compute_to_comm(cpc_transport *t, void *stream)
{
    return cpc_transport_nccl_set_compute_stream(t, stream);
}

cpc_status *cpc_transport_nccl_flush(cpc_transport *t)
{
    return cpc_transport_nccl_set_compute_stream(t, NULL);
}

cpc_status *cpc_transport_nccl_comm_to_compute(cpc_transport *t, void *stream)
{
    return cpc_transport_nccl_set_compute_stream(t, stream);
}

#endif
