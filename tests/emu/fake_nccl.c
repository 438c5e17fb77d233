/*
 * fake_nccl.c - a fake NCCL (libnccl.so.2) for the CPU CUDA emulator, so
 * that cpc's NCCL transport (runtime/transport/transport_nccl.c) and
 * cpc_rank_new_nccl run on machines without a GPU.  Test-only: built as
 * <build>/emu-cudart/libnccl.so.2 beside the fake CUDA runtime
 * (fake_cudart.c); putting that folder first on LD_LIBRARY_PATH makes
 * programs linked against NVIDIA's libnccl.so.2 bind to it unchanged (NCCL's
 * symbols are unversioned: libnccl.map exports nccl* without a version node).
 * Only the functions cpc calls are defined; a program needing another one
 * fails to load ("undefined symbol"), it is never faked.
 *
 * TRANSPORT: Unix-domain stream sockets in Linux's abstract namespace (no
 * file to clean up).  ncclGetUniqueId writes a random 128-bit name into the
 * id; rank r of a communicator listens on "@cpc-fake-nccl/<name>/<r>" and
 * connects to every lower rank (retrying until that rank listens), so a
 * communicator is a full mesh of sockets.  The id is all a rank needs, as
 * with NVIDIA's NCCL, so the fake works under any launcher that can pass 128
 * bytes around: mpirun (MPI_Bcast), torchrun (torch.distributed's
 * broadcast_object_list over gloo), or threads of one process (each thread
 * one rank).  Chosen over MPI because torchrun jobs have no MPI world and
 * because a rank per thread (the library's tests) cannot share one MPI
 * process's communicator safely.  ncclCommSplit agrees on (color, key) over
 * the parent's sockets and builds each new communicator's mesh under a name
 * derived from the parent's (its split count and the color).
 *
 * SEMANTICS:
 *  - devices: a communicator belongs to the CUDA device current at
 *    ncclCommInitRank (cudaGetDevice of the fake runtime); two ranks of one
 *    communicator on the same device index are refused (ncclInvalidUsage,
 *    "Duplicate GPU detected") as NVIDIA's NCCL refuses it: all emulated
 *    processes are taken to be on one machine, so give each rank its own
 *    device (CPC_EMU_DEVICES >= ranks, device = local rank).
 *  - buffers must be device memory of the communicator's device (the fake
 *    runtime's allocations, checked with cudaPointerGetAttributes at both
 *    ends of the range): host memory is ncclInvalidArgument, as it would
 *    fault on a GPU.
 *  - streams: the fake runtime runs every stream operation synchronously in
 *    call order, so an NCCL operation runs when it is issued: a call outside
 *    a group at once, the calls of a ncclGroupStart/ncclGroupEnd section at
 *    ncclGroupEnd, all progressed together (poll over every socket), so a
 *    group whose sends and receives need each other completes.  When the
 *    call returns, the data has moved; the stream is only validated
 *    (cudaStreamQuery).  A consequence: a real GPU's asynchrony (a missing
 *    event between compute and comm streams) cannot show here.
 *  - point-to-point: the k-th send from a to b in a communicator meets the
 *    k-th receive of b from a (NCCL's order rule); each message carries its
 *    size, and a receive of another size fails with ncclInvalidUsage naming
 *    both (NVIDIA's NCCL would hang or corrupt: the fake says so instead).
 *    Sends to oneself meet receives from oneself in order (memmove).
 *  - collectives: ncclAllGather (in place or not) and ncclAllReduce (sum,
 *    prod, max, min of the integer and float32/64 types; every rank sums in
 *    rank order, so all ranks get identical bits).
 *  - errors: a peer that closed its socket is ncclRemoteError; no progress
 *    for CPC_FAKE_NCCL_TIMEOUT seconds (default 120) is ncclSystemError
 *    ("timeout"), and the communicator keeps that as its asynchronous error
 *    (ncclCommGetAsyncError); ncclGetLastError gives the calling thread's last
 *    message.  Nothing aborts.
 *  - ncclCommFinalize is a no-op (everything completed already);
 *    ncclCommDestroy / ncclCommAbort close the sockets and free the handle.
 *
 * Thread-safety: as NCCL: a communicator is used by one thread at a time;
 * group state is per thread; different communicators may be used from
 * different threads concurrently.
 */
#include <nccl.h>

#include <cuda_runtime_api.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define COMM_MAGIC 0x4e43434cu   /* "NCCL" */
#define ID_MAGIC "cpc-fake-nccl-1"
#define NAME_LEN 64

struct ncclComm {
    unsigned magic;
    int rank, nranks, device;
    int *fd;                 /* per peer; -1 for this rank */
    char name[NAME_LEN];     /* the mesh's name (from the unique id or the parent) */
    unsigned nsplit;         /* splits made from this communicator (same on every rank) */
    ncclResult_t async;      /* the first failure of an operation (ncclCommGetAsyncError) */
};

typedef struct fake_id {     /* the layout inside ncclUniqueId.internal */
    char magic[16];
    char name[NAME_LEN];
} fake_id;

_Static_assert(sizeof(fake_id) <= NCCL_UNIQUE_ID_BYTES, "fake id fits ncclUniqueId");

static __thread char t_last[512];

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last, sizeof t_last, fmt, ap);
    va_end(ap);
    if (getenv("CPC_FAKE_NCCL_DEBUG"))
        fprintf(stderr, "nccl-emu: %s\n", t_last);
    return r;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double timeout_s(void)
{
    const char *s = getenv("CPC_FAKE_NCCL_TIMEOUT");
    double v = s && *s ? atof(s) : 120.0;
    return v > 0 ? v : 120.0;
}

static bool comm_ok(const struct ncclComm *c)
{
    return c && c->magic == COMM_MAGIC;
}

/* ---- versions, errors ----------------------------------------------------------- */

API ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, "ncclGetVersion: NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

API const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return t_last;
}

/* ---- sockets ------------------------------------------------------------------- */

static socklen_t sock_addr(struct sockaddr_un *a, const char *name, int rank)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cpc-fake-nccl/%s/%d", name, rank);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Writes / reads exactly n bytes on a blocking socket (the mesh's setup). */
static bool write_all(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        b += w;
        n -= (size_t)w;
    }
    return true;
}

static bool read_all(int fd, void *p, size_t n)
{
    char *b = p;
    while (n) {
        ssize_t r = recv(fd, b, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

typedef struct hello {
    char magic[16];
    int rank, nranks, device;
} hello;

static void close_fds(struct ncclComm *c)
{
    if (!c->fd)
        return;
    for (int i = 0; i < c->nranks; i++)
        if (c->fd[i] >= 0)
            close(c->fd[i]);
    free(c->fd);
    c->fd = NULL;
}

/* The full mesh of communicator `name` for rank `rank` of `nranks`: listen,
 * connect to every lower rank (retrying while it does not listen yet), accept
 * every higher one; each side sends a hello (rank, size, device). */
static ncclResult_t mesh(struct ncclComm *c, const char *what)
{
    c->fd = malloc((size_t)c->nranks * sizeof *c->fd);
    int *devs = malloc((size_t)c->nranks * sizeof *devs);
    if (!c->fd || !devs) {
        free(devs);
        return fail(ncclSystemError, "%s: out of memory", what);
    }
    for (int i = 0; i < c->nranks; i++)
        c->fd[i] = -1;
    devs[c->rank] = c->device;
    ncclResult_t res = ncclSuccess;
    int lfd = -1;
    hello me = {.rank = c->rank, .nranks = c->nranks, .device = c->device};
    memcpy(me.magic, ID_MAGIC, sizeof ID_MAGIC);
    if (c->rank + 1 < c->nranks) {
        struct sockaddr_un a;
        socklen_t len = sock_addr(&a, c->name, c->rank);
        lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, len) != 0 ||
            listen(lfd, c->nranks) != 0) {
            res = fail(errno == EADDRINUSE ? ncclInvalidUsage : ncclSystemError,
                       "%s: rank %d cannot listen (%s)%s", what, c->rank, strerror(errno),
                       errno == EADDRINUSE ? ": this rank of this unique id is taken twice" : "");
            goto out;
        }
    }
    double t0 = now_s(), limit = timeout_s();
    for (int j = 0; j < c->rank; j++) {
        struct sockaddr_un a;
        socklen_t len = sock_addr(&a, c->name, j);
        for (;;) {
            int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0) {
                res = fail(ncclSystemError, "%s: socket: %s", what, strerror(errno));
                goto out;
            }
            if (connect(fd, (struct sockaddr *)&a, len) == 0) {
                c->fd[j] = fd;
                break;
            }
            int e = errno;
            close(fd);
            if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN) {
                res = fail(ncclSystemError, "%s: rank %d connecting to rank %d: %s", what, c->rank,
                           j, strerror(e));
                goto out;
            }
            if (now_s() - t0 > limit) {
                res = fail(ncclSystemError, "%s: rank %d: timeout (%.0f s) waiting for rank %d of "
                                            "%d to join", what, c->rank, limit, j, c->nranks);
                goto out;
            }
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        hello h;
        if (!write_all(c->fd[j], &me, sizeof me) || !read_all(c->fd[j], &h, sizeof h) ||
            memcmp(h.magic, ID_MAGIC, sizeof ID_MAGIC) != 0 || h.rank != j) {
            res = fail(ncclSystemError, "%s: rank %d: bad handshake with rank %d", what, c->rank, j);
            goto out;
        }
        if (h.nranks != c->nranks) {
            res = fail(ncclInvalidUsage, "%s: rank %d was told nranks %d, rank %d nranks %d", what,
                       c->rank, c->nranks, j, h.nranks);
            goto out;
        }
        devs[j] = h.device;
    }
    for (int k = c->rank + 1; k < c->nranks; k++) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int pr = poll(&p, 1, (int)(limit * 1000));
        if (pr <= 0) {
            res = fail(ncclSystemError, "%s: rank %d: timeout (%.0f s) waiting for the ranks above "
                                        "it to join (%d of %d joined)", what, c->rank, limit,
                       k - c->rank - 1, c->nranks - c->rank - 1);
            goto out;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        hello h;
        if (fd < 0 || !read_all(fd, &h, sizeof h) ||
            memcmp(h.magic, ID_MAGIC, sizeof ID_MAGIC) != 0 || h.rank <= c->rank ||
            h.rank >= c->nranks || c->fd[h.rank] >= 0) {
            if (fd >= 0)
                close(fd);
            res = fail(ncclSystemError, "%s: rank %d: bad handshake from a higher rank", what, c->rank);
            goto out;
        }
        c->fd[h.rank] = fd;
        if (!write_all(fd, &me, sizeof me)) {
            res = fail(ncclSystemError, "%s: rank %d: handshake with rank %d", what, c->rank, h.rank);
            goto out;
        }
        if (h.nranks != c->nranks) {
            res = fail(ncclInvalidUsage, "%s: rank %d was told nranks %d, rank %d nranks %d", what,
                       c->rank, c->nranks, h.rank, h.nranks);
            goto out;
        }
        devs[h.rank] = h.device;
    }
    /* NVIDIA's NCCL refuses two ranks of one communicator on one GPU. */
    for (int i = 0; i < c->nranks && res == ncclSuccess; i++)
        if (i != c->rank && devs[i] == c->device)
            res = fail(ncclInvalidUsage, "%s: Duplicate GPU detected: rank %d and rank %d both on "
                                         "CUDA device %d", what, c->rank < i ? c->rank : i,
                       c->rank < i ? i : c->rank, c->device);
    for (int i = 0; i < c->nranks && res == ncclSuccess; i++)
        if (c->fd[i] >= 0 && fcntl(c->fd[i], F_SETFL, fcntl(c->fd[i], F_GETFL) | O_NONBLOCK) != 0)
            res = fail(ncclSystemError, "%s: fcntl: %s", what, strerror(errno));
out:
    if (lfd >= 0)
        close(lfd);
    free(devs);
    if (res != ncclSuccess)
        close_fds(c);
    return res;
}

/* ---- communicators ------------------------------------------------------------- */

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL");
    unsigned char rnd[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && read(fd, rnd, sizeof rnd) == (ssize_t)sizeof rnd;
    if (fd >= 0)
        close(fd);
    if (!ok)
        return fail(ncclSystemError, "ncclGetUniqueId: /dev/urandom: %s", strerror(errno));
    fake_id f;
    memset(&f, 0, sizeof f);
    memcpy(f.magic, ID_MAGIC, sizeof ID_MAGIC);
    for (int i = 0; i < 16; i++)
        snprintf(f.name + 2 * i, 3, "%02x", rnd[i]);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &f, sizeof f);
    return ncclSuccess;
}

static ncclResult_t comm_new(int nranks, int rank, int device, const char *name,
                             ncclComm_t *out, const char *what)
{
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return fail(ncclSystemError, "%s: out of memory", what);
    c->magic = COMM_MAGIC;
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    snprintf(c->name, sizeof c->name, "%s", name);
    ncclResult_t r = mesh(c, what);
    if (r != ncclSuccess) {
        c->magic = 0;
        free(c);
        return r;
    }
    *out = c;
    return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d, nranks %d", rank, nranks);
    fake_id f;
    memcpy(&f, id.internal, sizeof f);
    if (memcmp(f.magic, ID_MAGIC, sizeof ID_MAGIC) != 0 || !memchr(f.name, 0, sizeof f.name) ||
        !f.name[0])
        return fail(ncclInvalidArgument, "ncclCommInitRank: not a unique id made by "
                                         "ncclGetUniqueId (rank %d)", rank);
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(ncclUnhandledCudaError, "ncclCommInitRank: cudaGetDevice: %s",
                    cudaGetErrorString(e));
    }
    return comm_new(nranks, rank, dev, f.name, comm, "ncclCommInitRank");
}

API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm_ok(comm) || !count)
        return fail(ncclInvalidArgument, "ncclCommCount: invalid argument");
    *count = comm->nranks;
    return ncclSuccess;
}

API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm_ok(comm) || !rank)
        return fail(ncclInvalidArgument, "ncclCommUserRank: invalid argument");
    *rank = comm->rank;
    return ncclSuccess;
}

API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm_ok(comm) || !device)
        return fail(ncclInvalidArgument, "ncclCommCuDevice: invalid argument");
    *device = comm->device;
    return ncclSuccess;
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
    if (!comm_ok(comm) || !async)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: invalid argument");
    *async = comm->async;
    return ncclSuccess;
}

API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm_ok(comm))
        return fail(ncclInvalidArgument, "ncclCommFinalize: invalid communicator");
    return ncclSuccess;
}

static ncclResult_t comm_free(ncclComm_t comm, const char *fn)
{
    if (!comm)
        return ncclSuccess;
    if (!comm_ok(comm))
        return fail(ncclInvalidArgument, "%s: invalid communicator (destroyed twice?)", fn);
    close_fds(comm);
    comm->magic = 0;
    free(comm);
    return ncclSuccess;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm) { return comm_free(comm, "ncclCommDestroy"); }
API ncclResult_t ncclCommAbort(ncclComm_t comm) { return comm_free(comm, "ncclCommAbort"); }

/* ---- operations ------------------------------------------------------------------ */

typedef enum op_kind { OP_SEND, OP_RECV, OP_ALLGATHER, OP_ALLREDUCE } op_kind;

typedef struct op {
    op_kind kind;
    struct ncclComm *comm;
    int peer;
    const void *sbuf;
    void *rbuf;
    size_t bytes;          /* per rank */
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t red;
    char *tmp;             /* allreduce: nranks * bytes */
} op;

static __thread int t_depth;
static __thread op *t_ops;
static __thread int t_nops, t_capops;
static __thread ncclResult_t t_group_err;

static size_t dt_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

/* The whole range [p, p + n) is device memory of `device` (n > 0). */
static bool dev_buffer(const void *p, size_t n, int device)
{
    struct cudaPointerAttributes a, b;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess ||
        cudaPointerGetAttributes(&b, (const char *)p + n - 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice && b.type == cudaMemoryTypeDevice &&
           a.device == device && b.device == device;
}

static ncclResult_t check_common(const char *fn, struct ncclComm *comm, cudaStream_t stream)
{
    if (!comm_ok(comm))
        return fail(ncclInvalidArgument, "%s: invalid communicator", fn);
    if (comm->async != ncclSuccess)
        return fail(comm->async, "%s: the communicator failed earlier (rank %d)", fn, comm->rank);
    cudaError_t e = cudaStreamQuery(stream);
    if (e != cudaSuccess && e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        return fail(ncclInvalidArgument, "%s: invalid stream (%s)", fn, cudaGetErrorString(e));
    }
    return ncclSuccess;
}

static ncclResult_t check_buf(const char *fn, struct ncclComm *comm, const void *p, size_t n,
                              const char *which)
{
    if (n == 0)
        return ncclSuccess;
    if (!p)
        return fail(ncclInvalidArgument, "%s: %s is NULL (%zu bytes)", fn, which, n);
    if (!dev_buffer(p, n, comm->device))
        return fail(ncclInvalidArgument, "%s: rank %d: %s %p (%zu bytes) is not device memory of "
                                         "CUDA device %d (the communicator's)", fn, comm->rank,
                    which, p, n, comm->device);
    return ncclSuccess;
}

static ncclResult_t run_ops(op *ops, int n);

/* Adds an operation to the group, or runs it alone outside one. */
static ncclResult_t enqueue(const op *o)
{
    if (t_depth == 0) {
        op one = *o;
        return run_ops(&one, 1);
    }
    if (t_nops == t_capops) {
        int nc = t_capops ? 2 * t_capops : 16;
        op *p = realloc(t_ops, (size_t)nc * sizeof *p);
        if (!p)
            return t_group_err = fail(ncclSystemError, "out of memory");
        t_ops = p;
        t_capops = nc;
    }
    t_ops[t_nops++] = *o;
    return ncclSuccess;
}

static ncclResult_t p2p(bool is_send, const void *buf, size_t count, ncclDataType_t dt, int peer,
                        ncclComm_t comm, cudaStream_t stream)
{
    const char *fn = is_send ? "ncclSend" : "ncclRecv";
    ncclResult_t r = check_common(fn, comm, stream);
    size_t es = dt_size(dt);
    if (r == ncclSuccess && es == 0)
        r = fail(ncclInvalidArgument, "%s: datatype %d", fn, (int)dt);
    if (r == ncclSuccess && (peer < 0 || peer >= comm->nranks))
        r = fail(ncclInvalidArgument, "%s: rank %d: peer %d out of range [0, %d)", fn, comm->rank,
                 peer, comm->nranks);
    if (r == ncclSuccess)
        r = check_buf(fn, comm, buf, count * es, is_send ? "sendbuff" : "recvbuff");
    if (r != ncclSuccess) {
        if (t_depth > 0 && t_group_err == ncclSuccess)
            t_group_err = r;
        return r;
    }
    op o = {.kind = is_send ? OP_SEND : OP_RECV, .comm = comm, .peer = peer,
            .sbuf = is_send ? buf : NULL, .rbuf = is_send ? NULL : (void *)buf,
            .bytes = count * es, .count = count, .dt = dt};
    return enqueue(&o);
}

API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                          ncclComm_t comm, cudaStream_t stream)
{
    return p2p(true, sendbuff, count, datatype, peer, comm, stream);
}

API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                          ncclComm_t comm, cudaStream_t stream)
{
    return p2p(false, recvbuff, count, datatype, peer, comm, stream);
}

API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                               ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    const char *fn = "ncclAllGather";
    ncclResult_t r = check_common(fn, comm, stream);
    size_t es = dt_size(datatype);
    if (r == ncclSuccess && es == 0)
        r = fail(ncclInvalidArgument, "%s: datatype %d", fn, (int)datatype);
    if (r == ncclSuccess)
        r = check_buf(fn, comm, sendbuff, sendcount * es, "sendbuff");
    if (r == ncclSuccess)
        r = check_buf(fn, comm, recvbuff, sendcount * es * (size_t)comm->nranks, "recvbuff");
    if (r != ncclSuccess) {
        if (t_depth > 0 && t_group_err == ncclSuccess)
            t_group_err = r;
        return r;
    }
    op o = {.kind = OP_ALLGATHER, .comm = comm, .sbuf = sendbuff, .rbuf = recvbuff,
            .bytes = sendcount * es, .count = sendcount, .dt = datatype};
    return enqueue(&o);
}

API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op_, ncclComm_t comm,
                               cudaStream_t stream)
{
    const char *fn = "ncclAllReduce";
    ncclResult_t r = check_common(fn, comm, stream);
    size_t es = dt_size(datatype);
    if (r == ncclSuccess && (es == 0 || datatype == ncclFloat16 || datatype == ncclBfloat16 ||
                             datatype == ncclFloat8e4m3 || datatype == ncclFloat8e5m2))
        r = fail(ncclInvalidArgument, "%s: datatype %d is not emulated", fn, (int)datatype);
    if (r == ncclSuccess && op_ != ncclSum && op_ != ncclProd && op_ != ncclMax && op_ != ncclMin)
        r = fail(ncclInvalidArgument, "%s: reduction %d is not emulated", fn, (int)op_);
    if (r == ncclSuccess)
        r = check_buf(fn, comm, sendbuff, count * es, "sendbuff");
    if (r == ncclSuccess)
        r = check_buf(fn, comm, recvbuff, count * es, "recvbuff");
    if (r != ncclSuccess) {
        if (t_depth > 0 && t_group_err == ncclSuccess)
            t_group_err = r;
        return r;
    }
    op o = {.kind = OP_ALLREDUCE, .comm = comm, .sbuf = sendbuff, .rbuf = recvbuff,
            .bytes = count * es, .count = count, .dt = datatype, .red = op_};
    return enqueue(&o);
}

API ncclResult_t ncclGroupStart(void)
{
    if (t_depth == 0)
        t_group_err = ncclSuccess;
    t_depth++;
    return ncclSuccess;
}

API ncclResult_t ncclGroupEnd(void)
{
    if (t_depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--t_depth > 0)
        return ncclSuccess;
    ncclResult_t r = t_group_err;
    if (r == ncclSuccess)
        r = run_ops(t_ops, t_nops);
    /* A group with a failed call launches nothing (as NCCL).  The list is
     * freed after every group: thread-local storage has no destructor, and a
     * rank thread that ends must leave nothing behind. */
    free(t_ops);
    t_ops = NULL;
    t_capops = 0;
    t_nops = 0;
    t_group_err = ncclSuccess;
    return r;
}

/* ---- the progress engine ----------------------------------------------------------- */

/* One message on a socket: a 16-byte header (size, the sender's rank) then
 * the payload. */
typedef struct msg_hdr {
    uint64_t bytes;
    int32_t rank;
    int32_t pad;
} msg_hdr;

typedef struct xfer {
    struct ncclComm *comm;
    int peer;
    bool is_send;
    char *p;
    size_t bytes;
    size_t done;           /* bytes of header + payload done */
    msg_hdr hdr;
    int op_index;
} xfer;

/* Per (comm, peer, direction) queues are implicit: transfers are kept in op
 * order and a socket works on its first unfinished send and first unfinished
 * receive. */
static void reduce(op *o)
{
    int n = o->comm->nranks;
    size_t cnt = o->count;
#define RED(T)                                                                             \
    do {                                                                                   \
        T *dst = (T *)o->rbuf;                                                             \
        for (size_t i = 0; i < cnt; i++) {                                                 \
            T acc = ((const T *)o->tmp)[i];                                                \
            for (int k = 1; k < n; k++) {                                                  \
                T v = ((const T *)(o->tmp + (size_t)k * o->bytes))[i];                     \
                switch (o->red) {                                                          \
                case ncclSum: acc = (T)(acc + v); break;                                   \
                case ncclProd: acc = (T)(acc * v); break;                                  \
                case ncclMax: acc = v > acc ? v : acc; break;                              \
                default: acc = v < acc ? v : acc; break;                                   \
                }                                                                          \
            }                                                                              \
            dst[i] = acc;                                                                  \
        }                                                                                  \
    } while (0)
    switch (o->dt) {
    case ncclInt8: RED(int8_t); break;
    case ncclUint8: RED(uint8_t); break;
    case ncclInt32: RED(int32_t); break;
    case ncclUint32: RED(uint32_t); break;
    case ncclInt64: RED(int64_t); break;
    case ncclUint64: RED(uint64_t); break;
    case ncclFloat32: RED(float); break;
    case ncclFloat64: RED(double); break;
    default: break;
    }
#undef RED
}

static ncclResult_t add_xfer(xfer **xs, int *nx, int *cap, struct ncclComm *comm, int peer,
                             bool is_send, const void *p, size_t bytes, int op_index)
{
    if (*nx == *cap) {
        int nc = *cap ? 2 * *cap : 32;
        xfer *q = realloc(*xs, (size_t)nc * sizeof *q);
        if (!q)
            return fail(ncclSystemError, "out of memory");
        *xs = q;
        *cap = nc;
    }
    xfer x = {.comm = comm, .peer = peer, .is_send = is_send, .p = (char *)p, .bytes = bytes,
              .op_index = op_index};
    x.hdr.bytes = bytes;
    x.hdr.rank = comm->rank;
    (*xs)[(*nx)++] = x;
    return ncclSuccess;
}

/* Advances transfer x on its socket; false with *res set on failure. */
static bool step(xfer *x, short revents, ncclResult_t *res)
{
    int fd = x->comm->fd[x->peer];
    size_t total = sizeof x->hdr + x->bytes;
    if (x->is_send) {
        if (!(revents & (POLLOUT | POLLERR | POLLHUP)))
            return true;
        while (x->done < total) {
            const char *src = x->done < sizeof x->hdr ? (const char *)&x->hdr + x->done
                                                      : x->p + (x->done - sizeof x->hdr);
            size_t n = x->done < sizeof x->hdr ? sizeof x->hdr - x->done : total - x->done;
            ssize_t w = send(fd, src, n, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return true;
            if (w <= 0) {
                *res = fail(ncclRemoteError, "rank %d: sending to rank %d: %s (the peer "
                                             "exited?)", x->comm->rank, x->peer, strerror(errno));
                return false;
            }
            x->done += (size_t)w;
        }
        return true;
    }
    if (!(revents & (POLLIN | POLLERR | POLLHUP)))
        return true;
    while (x->done < total) {
        bool in_hdr = x->done < sizeof x->hdr;
        char *dst = in_hdr ? (char *)&x->hdr + x->done : x->p + (x->done - sizeof x->hdr);
        size_t n = in_hdr ? sizeof x->hdr - x->done : total - x->done;
        ssize_t r = recv(fd, dst, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        if (r <= 0) {
            *res = fail(ncclRemoteError, "rank %d: receiving from rank %d: %s", x->comm->rank,
                        x->peer, r == 0 ? "the peer closed its connection (exited?)"
                                        : strerror(errno));
            return false;
        }
        x->done += (size_t)r;
        if (in_hdr && x->done == sizeof x->hdr && x->hdr.bytes != x->bytes) {
            *res = fail(ncclInvalidUsage, "rank %d: receive of %zu bytes from rank %d met a send "
                                          "of %llu bytes (NCCL would hang or corrupt memory)",
                        x->comm->rank, x->bytes, x->peer, (unsigned long long)x->hdr.bytes);
            return false;
        }
    }
    return true;
}

static ncclResult_t run_ops(op *ops, int n)
{
    xfer *xs = NULL;
    int nx = 0, cap = 0;
    ncclResult_t res = ncclSuccess;
    /* Expand: self messages are paired here (k-th send to self with the k-th
     * receive from self, per communicator); the rest become transfers. */
    for (int i = 0; i < n && res == ncclSuccess; i++) {
        op *o = &ops[i];
        o->tmp = NULL;
        struct ncclComm *c = o->comm;
        switch (o->kind) {
        case OP_SEND:
        case OP_RECV:
            if (o->peer == c->rank) {
                if (o->kind == OP_RECV)
                    continue;   /* paired from its send below */
                /* the k-th self send meets the k-th self receive of this comm */
                int k = 0;
                for (int j = 0; j < i; j++)
                    if (ops[j].kind == OP_SEND && ops[j].comm == c && ops[j].peer == c->rank)
                        k++;
                int m = -1;
                for (int j = 0; j < n; j++)
                    if (ops[j].kind == OP_RECV && ops[j].comm == c && ops[j].peer == c->rank &&
                        k-- == 0) {
                        m = j;
                        break;
                    }
                if (m < 0) {
                    res = fail(ncclInvalidUsage, "rank %d: a send to itself without a receive "
                                                 "from itself in the same group", c->rank);
                } else if (ops[m].bytes != o->bytes) {
                    res = fail(ncclInvalidUsage, "rank %d: send to itself of %zu bytes met a "
                                                 "receive of %zu", c->rank, o->bytes,
                               ops[m].bytes);
                } else if (o->bytes) {
                    memmove(ops[m].rbuf, o->sbuf, o->bytes);
                }
                continue;
            }
            if (o->bytes)
                res = add_xfer(&xs, &nx, &cap, c, o->peer, o->kind == OP_SEND,
                               o->kind == OP_SEND ? o->sbuf : o->rbuf, o->bytes, i);
            break;
        case OP_ALLGATHER: {
            char *own = (char *)o->rbuf + (size_t)c->rank * o->bytes;
            if (o->bytes && own != o->sbuf)
                memmove(own, o->sbuf, o->bytes);
            for (int j = 0; j < c->nranks && res == ncclSuccess && o->bytes; j++) {
                if (j == c->rank)
                    continue;
                res = add_xfer(&xs, &nx, &cap, c, j, true, own, o->bytes, i);
                if (res == ncclSuccess)
                    res = add_xfer(&xs, &nx, &cap, c, j, false,
                                   (char *)o->rbuf + (size_t)j * o->bytes, o->bytes, i);
            }
            break;
        }
        case OP_ALLREDUCE: {
            o->tmp = malloc((size_t)c->nranks * o->bytes + 1);
            if (!o->tmp) {
                res = fail(ncclSystemError, "out of memory");
                break;
            }
            char *own = o->tmp + (size_t)c->rank * o->bytes;
            memcpy(own, o->sbuf, o->bytes);
            for (int j = 0; j < c->nranks && res == ncclSuccess && o->bytes; j++) {
                if (j == c->rank)
                    continue;
                res = add_xfer(&xs, &nx, &cap, c, j, true, own, o->bytes, i);
                if (res == ncclSuccess)
                    res = add_xfer(&xs, &nx, &cap, c, j, false, o->tmp + (size_t)j * o->bytes,
                                   o->bytes, i);
            }
            break;
        }
        }
    }
    /* Progress: every socket works on its first unfinished send and first
     * unfinished receive (stream order = the order the ops were called). */
    struct pollfd *pf = res == ncclSuccess && nx ? malloc((size_t)nx * sizeof *pf) : NULL;
    int *who = pf ? malloc((size_t)nx * sizeof *who) : NULL;
    if (nx && res == ncclSuccess && (!pf || !who))
        res = fail(ncclSystemError, "out of memory");
    double last = now_s(), limit = timeout_s();
    while (res == ncclSuccess) {
        int np = 0;
        for (int i = 0; i < nx; i++) {
            xfer *x = &xs[i];
            if (x->done == sizeof x->hdr + x->bytes)
                continue;
            bool first = true;
            for (int j = 0; j < i && first; j++)
                if (xs[j].comm == x->comm && xs[j].peer == x->peer &&
                    xs[j].is_send == x->is_send && xs[j].done < sizeof xs[j].hdr + xs[j].bytes)
                    first = false;
            if (!first)
                continue;
            pf[np].fd = x->comm->fd[x->peer];
            pf[np].events = x->is_send ? POLLOUT : POLLIN;
            pf[np].revents = 0;
            who[np++] = i;
        }
        if (np == 0)
            break;
        int pr = poll(pf, (nfds_t)np, 100);
        if (pr < 0 && errno != EINTR) {
            res = fail(ncclSystemError, "poll: %s", strerror(errno));
            break;
        }
        if (pr <= 0) {
            if (now_s() - last > limit) {
                xfer *x = &xs[who[0]];
                res = fail(ncclSystemError, "rank %d: timeout: no progress for %.0f s %s rank %d "
                                            "(%zu of %zu bytes; CPC_FAKE_NCCL_TIMEOUT)",
                           x->comm->rank, limit, x->is_send ? "sending to" : "receiving from",
                           x->peer, x->done, sizeof x->hdr + x->bytes);
                for (int i = 0; i < nx; i++)
                    if (xs[i].comm->async == ncclSuccess)
                        xs[i].comm->async = ncclSystemError;
            }
            continue;
        }
        last = now_s();
        for (int k = 0; k < np && res == ncclSuccess; k++)
            if (pf[k].revents && !step(&xs[who[k]], pf[k].revents, &res))
                xs[who[k]].comm->async = res == ncclInvalidUsage ? ncclInvalidUsage : res;
    }
    for (int i = 0; i < n; i++) {
        if (ops[i].kind == OP_ALLREDUCE && ops[i].tmp && res == ncclSuccess)
            reduce(&ops[i]);
        free(ops[i].tmp);
        ops[i].tmp = NULL;
    }
    free(pf);
    free(who);
    free(xs);
    return res;
}

/* ---- splitting ------------------------------------------------------------------- */

API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                               ncclConfig_t *config)
{
    (void)config;
    if (!newcomm)
        return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    *newcomm = NULL;
    if (!comm_ok(comm))
        return fail(ncclInvalidArgument, "ncclCommSplit: invalid communicator");
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return fail(ncclInvalidArgument, "ncclCommSplit: color %d", color);
    int n = comm->nranks;
    /* Every rank learns every (color, key): an all-gather over the parent's
     * sockets (host memory here, so through the progress engine directly). */
    int32_t *ck = malloc((size_t)n * 2 * sizeof *ck);
    if (!ck)
        return fail(ncclSystemError, "ncclCommSplit: out of memory");
    ck[2 * comm->rank] = color;
    ck[2 * comm->rank + 1] = key;
    xfer *xs = NULL;
    int nx = 0, cap = 0;
    ncclResult_t res = ncclSuccess;
    for (int j = 0; j < n && res == ncclSuccess; j++) {
        if (j == comm->rank)
            continue;
        res = add_xfer(&xs, &nx, &cap, comm, j, true, &ck[2 * comm->rank], 8, 0);
        if (res == ncclSuccess)
            res = add_xfer(&xs, &nx, &cap, comm, j, false, &ck[2 * j], 8, 0);
    }
    double t0 = now_s(), limit = timeout_s();
    while (res == ncclSuccess) {
        bool busy = false;
        for (int i = 0; i < nx && res == ncclSuccess; i++) {
            xfer *x = &xs[i];
            if (x->done == sizeof x->hdr + x->bytes)
                continue;
            busy = true;
            struct pollfd p = {.fd = comm->fd[x->peer], .events = x->is_send ? POLLOUT : POLLIN};
            if (poll(&p, 1, 1) > 0)
                step(x, p.revents, &res);
        }
        if (!busy)
            break;
        if (now_s() - t0 > limit)
            res = fail(ncclSystemError, "ncclCommSplit: rank %d: timeout", comm->rank);
    }
    free(xs);
    unsigned split = comm->nsplit++;
    if (res != ncclSuccess || color == NCCL_SPLIT_NOCOLOR) {
        free(ck);
        return res;
    }
    int size = 0, rank = 0;
    for (int j = 0; j < n; j++) {
        if (ck[2 * j] != color)
            continue;
        size++;
        if (ck[2 * j + 1] < key || (ck[2 * j + 1] == key && j < comm->rank))
            rank++;
    }
    free(ck);
    /* The child's name: the id's 32 hex digits, then an FNV-1a hash of the
     * parent's whole name, the split count and the color (nested splits
     * stay distinct; every member computes the same). */
    char tail[128];
    snprintf(tail, sizeof tail, "%s/s%u/c%d", comm->name, split, color);
    uint64_t h = 1469598103934665603ull;
    for (const char *s = tail; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    char name[NAME_LEN];
    snprintf(name, sizeof name, "%.32s.%016llx", comm->name, (unsigned long long)h);
    return comm_new(size, rank, comm->device, name, newcomm, "ncclCommSplit");
}
