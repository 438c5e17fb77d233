/* transport_mpi.c - see transport_mpi.h */
#include "transport_mpi.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

/* ---- environment helpers (no MPI needed) --------------------------------- */

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

/* Parses a non-negative decimal int; -1 when absent or malformed. */
static int env_int(const char *name)
{
    const char *v = env_nonempty(name);
    if (!v)
        return -1;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < 0 || x > INT_MAX)
        return -1;
    return (int)x;
}

static bool wd_arm(const char *what, int world_rank, double extra);
static void wd_disarm(bool armed);
static void finalize_watched(void);

bool cpc_mpi_launched(void)
{
    if (env_nonempty("OMPI_COMM_WORLD_SIZE") || env_nonempty("PMIX_RANK") ||
        env_nonempty("PMI_SIZE") || env_nonempty("PMI_RANK") ||
        env_nonempty("MV2_COMM_WORLD_SIZE"))
        return true;
    /* srun: a job step has a numeric step id; the batch script (step
     * "batch") and salloc shells are not ranks. */
    if (env_int("SLURM_PROCID") >= 0 &&
        (env_nonempty("SLURM_STEP_NUM_TASKS") || env_nonempty("SLURM_NTASKS")) &&
        (env_int("SLURM_STEP_ID") >= 0 || env_int("SLURM_STEPID") >= 0))
        return true;
    return false;
}

static bool mpi_is_live(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

int cpc_mpi_local_rank(void)
{
    static const char *const vars[] = {
        "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
        "SLURM_LOCALID",
    };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        int v = env_int(vars[i]);
        if (v >= 0)
            return v;
    }
    if (!mpi_is_live())
        return -1;
    MPI_Comm node = MPI_COMM_NULL;
    bool w = wd_arm("MPI_Comm_split_type (the node's ranks)", -1, 0);
    int src = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    wd_disarm(w);
    if (src != MPI_SUCCESS || node == MPI_COMM_NULL)
        return -1;
    int r = -1;
    if (MPI_Comm_rank(node, &r) != MPI_SUCCESS)
        r = -1;
    MPI_Comm_free(&node);
    return r;
}

/* ---- MPI errors to statuses ---------------------------------------------- */

static cpc_status *mpi_status(int rc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* CPC_E_RUNTIME "<what>: <MPI_Error_string(rc)>". */
static cpc_status *mpi_status(int rc, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    else
        msg[len < 0 ? 0 : (len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len)] = '\0';
    return cpc_error(CPC_E_RUNTIME, "%s: %s", what, msg);
}

/* ---- init / finalize ------------------------------------------------------ */

static bool g_cpc_initialised_mpi;   /* cpc_mpi_init called MPI_Init_thread */

/* Initialises MPI when needed; *did_init tells whether this call did. */
static cpc_status *ensure_mpi(bool *did_init)
{
    *did_init = false;
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (fin)
        return cpc_error(CPC_E_RUNTIME,
                         "MPI is already finalized; it cannot be initialised again");
    int provided = MPI_THREAD_SINGLE;
    if (!init) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return mpi_status(rc, "MPI_Init_thread");
        *did_init = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        cpc_status *st = cpc_error(CPC_E_UNSUPPORTED,
                                   "MPI thread support level %d is below MPI_THREAD_SERIALIZED",
                                   provided);
        cpc_status_set_hint(st, "use an MPI library built with thread support "
                                "(Open MPI gives MPI_THREAD_MULTIPLE)");
        if (*did_init) {
            finalize_watched();
            *did_init = false;
        }
        return st;
    }
    return NULL;
}

cpc_status *cpc_mpi_init(int *world_rank, int *world_size)
{
    bool did = false;
    bool w = wd_arm("MPI_Init_thread (every rank starts the job together)", -1, 0);
    cpc_status *st = ensure_mpi(&did);
    wd_disarm(w);
    if (st)
        return st;
    if (did)
        g_cpc_initialised_mpi = true;
    int rc;
    if (world_rank && (rc = MPI_Comm_rank(MPI_COMM_WORLD, world_rank)) != MPI_SUCCESS)
        return mpi_status(rc, "MPI_Comm_rank");
    if (world_size && (rc = MPI_Comm_size(MPI_COMM_WORLD, world_size)) != MPI_SUCCESS)
        return mpi_status(rc, "MPI_Comm_size");
    return NULL;
}

static bool g_cpc_mpi_held; /* cpc_mpi_hold(true): nobody finalises */

void cpc_mpi_hold(bool hold)
{
    g_cpc_mpi_held = hold;
}

void cpc_mpi_finalize(void)
{
    if (g_cpc_mpi_held)
        return;
    if (g_cpc_initialised_mpi && mpi_is_live())
        finalize_watched();
    g_cpc_initialised_mpi = false;
}

/* ---- limits (large-count paths) ------------------------------------------- */

#define DEFAULT_CHUNK ((size_t)1 << 30)
static size_t g_int_limit = (size_t)INT_MAX;
static size_t g_chunk = DEFAULT_CHUNK;

void cpc_transport_mpi_set_limits(size_t int_limit, size_t chunk_bytes)
{
    g_int_limit = (int_limit == 0 || int_limit > (size_t)INT_MAX) ? (size_t)INT_MAX : int_limit;
    g_chunk = (chunk_bytes == 0 || chunk_bytes > (size_t)INT_MAX) ? DEFAULT_CHUNK : chunk_bytes;
}

/* A message of `bytes` bytes as (count, type).  Small: (bytes, MPI_BYTE).
 * Large: (1, T) with T = n chunks of g_chunk bytes followed by the remainder,
 * a committed derived type the caller frees (*owned = true).  Either way the
 * type signature is `bytes` x MPI_BYTE, so sender and receiver match whatever
 * path each side took. */
static cpc_status *msg_type(size_t bytes, int *count, MPI_Datatype *type, bool *owned)
{
    *owned = false;
    if (bytes <= g_int_limit) {
        *count = (int)bytes;
        *type = MPI_BYTE;
        return NULL;
    }
    size_t nfull = bytes / g_chunk, rem = bytes % g_chunk;
    if (nfull > (size_t)INT_MAX)
        return cpc_error(CPC_E_RUNTIME, "message of %zu bytes is too large for MPI", bytes);
    MPI_Datatype chunk = MPI_DATATYPE_NULL, whole = MPI_DATATYPE_NULL;
    int rc = MPI_Type_contiguous((int)g_chunk, MPI_BYTE, &chunk);
    if (rc != MPI_SUCCESS)
        return mpi_status(rc, "MPI_Type_contiguous(%zu bytes)", g_chunk);
    int blocklens[2] = {(int)nfull, (int)rem};
    MPI_Aint displs[2] = {0, (MPI_Aint)(nfull * g_chunk)};
    MPI_Datatype types[2] = {chunk, MPI_BYTE};
    rc = MPI_Type_create_struct(rem ? 2 : 1, blocklens, displs, types, &whole);
    MPI_Type_free(&chunk);   /* `whole` keeps what it needs */
    if (rc != MPI_SUCCESS)
        return mpi_status(rc, "MPI_Type_create_struct(%zu bytes)", bytes);
    rc = MPI_Type_commit(&whole);
    if (rc != MPI_SUCCESS) {
        MPI_Type_free(&whole);
        return mpi_status(rc, "MPI_Type_commit(%zu bytes)", bytes);
    }
    *count = 1;
    *type = whole;
    *owned = true;
    return NULL;
}

/* ---- stall limit: every wait polls with a deadline ------------------------ */

static double g_stall_s;   /* 0: wait forever */

void cpc_transport_mpi_set_timeout(double seconds)
{
    g_stall_s = seconds > 0 ? seconds : 0;
}

double cpc_transport_mpi_timeout(void)
{
    return g_stall_s;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- watchdog: the MPI calls that cannot poll (issue 23) -------------------
 * MPI_Init_thread, the communicator setup (MPI_Comm_dup / split) and
 * MPI_Finalize block inside MPI until every rank takes part: a rank stopped
 * (SIGSTOP) before MPI_Init completes, or after the run while rank 0 checks,
 * hung the job forever.  While such a call runs, a watchdog thread waits
 * with a deadline; when it passes, it prints "rank N: stalled: WHAT did not
 * complete within S s" to stderr and ends the process with status 3 (the
 * launcher then ends the job).  The limit is the stall limit but at least
 * WD_MIN_S (MPI startup itself can take seconds on a loaded machine); a
 * rank other than 0 in MPI_Finalize also allows 10 x that, at least
 * WD_CHECK_MIN_S, for rank 0's check of the result, which it waits for
 * there.  No stall limit (0): no watchdog. */
#define WD_MIN_S 10.0
#define WD_CHECK_MIN_S 60.0

static pthread_mutex_t g_wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wd_cv;
static bool g_wd_started, g_wd_armed;
static double g_wd_deadline, g_wd_limit;
static int g_wd_rank = -1;
static char g_wd_what[160];

static void *wd_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_wd_mu);
    for (;;) {
        while (!g_wd_armed)
            pthread_cond_wait(&g_wd_cv, &g_wd_mu);
        double left = g_wd_deadline - mono_s();
        if (left <= 0) {
            char rank[32] = "";
            if (g_wd_rank >= 0)
                snprintf(rank, sizeof rank, "rank %d: ", g_wd_rank);
            fprintf(stderr,
                    "cpc: error: %sstalled: %s did not complete within %.3g s (the stall limit, "
                    "--timeout; at least %.0f s here): another rank is stopped or gone; ending "
                    "this rank with status 3\n",
                    rank, g_wd_what, g_wd_limit, WD_MIN_S);
            fflush(stderr);
            _exit(3);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (left < 1.0 ? left : 1.0);
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&g_wd_cv, &g_wd_mu, &ts);
    }
    return NULL;
}

/* Arms the watchdog for `what` with `extra` seconds beyond the limit; false
 * (nothing armed) without a stall limit or when the thread cannot start. */
static bool wd_arm(const char *what, int world_rank, double extra)
{
    if (g_stall_s <= 0)
        return false;
    pthread_mutex_lock(&g_wd_mu);
    if (!g_wd_started) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&g_wd_cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_t th;
        g_wd_started = pthread_create(&th, &at, wd_main, NULL) == 0;
        pthread_attr_destroy(&at);
        if (!g_wd_started) {
            pthread_mutex_unlock(&g_wd_mu);
            return false;
        }
    }
    g_wd_limit = (g_stall_s > WD_MIN_S ? g_stall_s : WD_MIN_S) + extra;
    g_wd_deadline = mono_s() + g_wd_limit;
    g_wd_rank = world_rank >= 0 ? world_rank
                : env_int("OMPI_COMM_WORLD_RANK") >= 0 ? env_int("OMPI_COMM_WORLD_RANK")
                : env_int("PMIX_RANK") >= 0 ? env_int("PMIX_RANK")
                : env_int("PMI_RANK") >= 0 ? env_int("PMI_RANK") : env_int("SLURM_PROCID");
    snprintf(g_wd_what, sizeof g_wd_what, "%s", what);
    g_wd_armed = true;
    pthread_cond_signal(&g_wd_cv);
    pthread_mutex_unlock(&g_wd_mu);
    return true;
}

static void wd_disarm(bool armed)
{
    if (!armed)
        return;
    pthread_mutex_lock(&g_wd_mu);
    g_wd_armed = false;
    pthread_mutex_unlock(&g_wd_mu);
}

/* MPI_Finalize under the watchdog (rank 0 checks the result while the others
 * wait here: they allow it more time, see above). */
static void finalize_watched(void)
{
    int wr = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    /* tests/mpi/run_stall.sh: a rank stopped after the run, deterministically */
    int stop = env_int("CPC_TEST_SIGSTOP_BEFORE_FINALIZE");
    if (stop >= 0 && stop == wr)
        raise(SIGSTOP);
    double base = g_stall_s > WD_MIN_S ? g_stall_s : WD_MIN_S;
    double extra = wr == 0 ? 0 : (10 * base > WD_CHECK_MIN_S ? 10 * base : WD_CHECK_MIN_S);
    bool w = wd_arm("MPI_Finalize (every rank ends the job together)", wr, extra);
    MPI_Finalize();
    wd_disarm(w);
}

/* Completes n requests (MPI_Waitall without a limit).  With a limit, polls
 * MPI_Testall: tightly for the first 10 ms (what MPI_Wait does anyway),
 * then sleeping 10 us doubling to 1 ms between polls, so a rank that waits
 * for a stopped peer does not take a core from the others; *stalled is set
 * when the limit passes first (the requests are then left pending: the job
 * is aborted).  Returns an MPI error code. */
static int wait_all(int n, MPI_Request *reqs, MPI_Status *sts, bool *stalled)
{
    *stalled = false;
    if (n <= 0)
        return MPI_SUCCESS;
    if (g_stall_s <= 0)
        return MPI_Waitall(n, reqs, sts);
    double t0 = mono_s(), dl = t0 + g_stall_s;
    long sleep_ns = 0;
    for (unsigned spins = 0;; spins++) {
        int flag = 0;
        int rc = MPI_Testall(n, reqs, &flag, sts);
        if (rc != MPI_SUCCESS || flag)
            return rc;
        if (sleep_ns || (spins & 63) == 63) {
            double t = mono_s();
            if (t > dl) {
                *stalled = true;
                return MPI_SUCCESS;
            }
            if (t - t0 > 0.01)
                sleep_ns = sleep_ns ? (sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2) : 10000;
        }
        if (sleep_ns) {
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
        }
    }
}

static cpc_status *stall_status(int world_rank, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "rank P: stalled: OP did not complete within S s (--timeout) ..." */
static cpc_status *stall_status(int world_rank, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    cpc_status *st = cpc_error(CPC_E_RUNTIME,
                               "rank %d: stalled: waited %.3g s in %s (the stall limit: cprun --timeout, "
                               "cpc_rank_options.timeout_s): "
                               "a peer stopped, hangs or is far behind",
                               world_rank, g_stall_s, what);
    cpc_status_set_hint(st, "raise the limit (cprun --timeout SECONDS, timeout_s in libcpc) if the peers are only slow");
    return st;
}

/* ---- the transport -------------------------------------------------------- */

typedef struct mpi_group {
    MPI_Comm comm;   /* user point-to-point and MPI collectives */
    MPI_Comm aux;    /* the large-count collective fallback's own messages */
    int rank, size;
} mpi_group;

typedef struct mpi_ctx {
    cpc_transport base;
    mpi_group groups[CPC_GROUP__COUNT];   /* RING, ULYSSES, WORLD */
    int world_rank;
    int ring_degree, ulysses_degree;
    int tag_ub;
    bool owns_mpi;                        /* destroy calls MPI_Finalize */
} mpi_ctx;

struct cpc_request {
    MPI_Request req;
    MPI_Datatype type;
    bool type_owned;
    bool is_recv;
    size_t bytes;
    cpc_group group;
    int peer, tag;
};

static mpi_ctx *ctx_of(cpc_transport *t) { return (mpi_ctx *)t->ctx; }

static const char *gname(cpc_group g)
{
    switch (g) {
    case CPC_GROUP_RING: return "ring";
    case CPC_GROUP_ULYSSES: return "ulysses";
    case CPC_GROUP_WORLD: return "world";
    default: return "?";
    }
}

static mpi_group *group_of(mpi_ctx *c, cpc_group g)
{
    if (g != CPC_GROUP_RING && g != CPC_GROUP_ULYSSES && g != CPC_GROUP_WORLD)
        return NULL;
    return &c->groups[g];
}

static int m_group_rank(cpc_transport *t, cpc_group g)
{
    mpi_group *gr = group_of(ctx_of(t), g);
    return gr ? gr->rank : -1;
}

static int m_group_size(cpc_transport *t, cpc_group g)
{
    mpi_group *gr = group_of(ctx_of(t), g);
    return gr ? gr->size : -1;
}

static cpc_status *bad_group(mpi_ctx *c, const char *op, cpc_group g)
{
    return cpc_error(CPC_E_INTERNAL, "rank %d: %s: invalid group %d", c->world_rank, op, (int)g);
}

static cpc_status *post_p2p(cpc_transport *t, bool is_recv, cpc_group g, int peer,
                            void *buf, size_t bytes, int tag, cpc_request **req)
{
    mpi_ctx *c = ctx_of(t);
    const char *op = is_recv ? "recv" : "send";
    *req = NULL;
    mpi_group *gr = group_of(c, g);
    if (!gr)
        return bad_group(c, op, g);
    if (peer < 0 || peer >= gr->size)
        return cpc_error(CPC_E_RUNTIME, "rank %d: %s %s member %d: peer out of range [0, %d)",
                         c->world_rank, op, gname(g), peer, gr->size);
    if (tag < 0 || tag > c->tag_ub)
        return cpc_error(CPC_E_RUNTIME, "rank %d: %s %s member %d: tag %d out of range [0, %d]",
                         c->world_rank, op, gname(g), peer, tag, c->tag_ub);
    if (!buf && bytes > 0)
        return cpc_error(CPC_E_INTERNAL, "rank %d: %s %s member %d: NULL buffer of %zu bytes",
                         c->world_rank, op, gname(g), peer, bytes);
    cpc_request *r = calloc(1, sizeof *r);
    if (!r)
        return &cpc_status_oom;
    r->is_recv = is_recv;
    r->bytes = bytes;
    r->group = g;
    r->peer = peer;
    r->tag = tag;
    int count = 0;
    cpc_status *st = msg_type(bytes, &count, &r->type, &r->type_owned);
    if (st) {
        free(r);
        cpc_status_prefix(st, "rank %d: %s %s member %d tag %d", c->world_rank, op, gname(g),
                          peer, tag);
        return st;
    }
    int rc = is_recv ? MPI_Irecv(buf, count, r->type, peer, tag, gr->comm, &r->req)
                     : MPI_Isend(buf, count, r->type, peer, tag, gr->comm, &r->req);
    if (rc != MPI_SUCCESS) {
        if (r->type_owned)
            MPI_Type_free(&r->type);
        free(r);
        return mpi_status(rc, "rank %d: %s %s member %d (%zu bytes, tag %d)", c->world_rank,
                          is_recv ? "MPI_Irecv from" : "MPI_Isend to", gname(g), peer, bytes,
                          tag);
    }
    *req = r;
    return NULL;
}

static cpc_status *m_isend(cpc_transport *t, cpc_group g, int peer, const void *buf,
                           size_t bytes, int tag, cpc_request **req)
{
    return post_p2p(t, false, g, peer, (void *)buf, bytes, tag, req);
}

static cpc_status *m_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    return post_p2p(t, true, g, peer, buf, bytes, tag, req);
}

static cpc_status *m_wait(cpc_transport *t, cpc_request *r)
{
    mpi_ctx *c = ctx_of(t);
    if (!r)
        return cpc_error(CPC_E_INTERNAL, "rank %d: wait: NULL request", c->world_rank);
    MPI_Status mst;
    memset(&mst, 0, sizeof mst);
    bool stalled = false;
    int rc = wait_all(1, &r->req, &mst, &stalled);
    cpc_status *st = NULL;
    const char *op = r->is_recv ? "recv from" : "send to";
    if (stalled) {
        /* the request stays posted (its buffer with it): the caller aborts the job */
        st = stall_status(c->world_rank, "%s %s member %d (%zu bytes, tag %d)", op, gname(r->group),
                          r->peer, r->bytes, r->tag);
        return st;
    }
    if (rc != MPI_SUCCESS) {
        st = mpi_status(rc, "rank %d: %s %s member %d (%zu bytes, tag %d)", c->world_rank, op,
                        gname(r->group), r->peer, r->bytes, r->tag);
    } else if (r->is_recv) {
        MPI_Count got = 0;
        rc = MPI_Get_elements_x(&mst, r->type, &got);
        /* `got` counts basic elements (MPI_BYTE) whatever the type was. */
        if (rc != MPI_SUCCESS)
            st = mpi_status(rc, "rank %d: recv from %s member %d: MPI_Get_elements_x",
                            c->world_rank, gname(r->group), r->peer);
        else if (got != (MPI_Count)r->bytes)
            st = cpc_error(CPC_E_RUNTIME,
                           "rank %d: recv from %s member %d (tag %d): %lld bytes arrived, "
                           "%zu expected",
                           c->world_rank, gname(r->group), r->peer, r->tag, (long long)got,
                           r->bytes);
    }
    if (r->type_owned)
        MPI_Type_free(&r->type);
    free(r);
    return st;
}

/* True when any value of the n counts/displacements exceeds the int limit. */
static bool any_large(const size_t *a, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i] > g_int_limit)
            return true;
    return false;
}

/* The group agrees on whether some member needs the large path (collective;
 * every member calls it at the same point). */
static cpc_status *agree_large(mpi_ctx *c, mpi_group *gr, const char *op, bool mine,
                               bool *any)
{
    int in = mine ? 1 : 0, out = 0;
    MPI_Request rq = MPI_REQUEST_NULL;
    bool stalled = false;
    int rc = MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_MAX, gr->comm, &rq);
    if (rc == MPI_SUCCESS)
        rc = wait_all(1, &rq, MPI_STATUSES_IGNORE, &stalled);
    if (stalled)
        return stall_status(c->world_rank, "%s over the %s group (agreeing on the message sizes)",
                            op, gname((cpc_group)(gr - c->groups)));
    if (rc != MPI_SUCCESS)
        return mpi_status(rc, "rank %d: %s: MPI_Allreduce", c->world_rank, op);
    *any = out != 0;
    return NULL;
}

/* Pairwise exchange on gr->aux: receives recv_counts[j] bytes from every
 * member j at recv + recv_displs[j], sends send_counts[j] bytes (at send +
 * send_displs[j]) to j.  The own part is copied locally.  NULL arrays mean
 * "the same for every j" via the *_one values (all_gather_v's send side). */
static cpc_status *pairwise(mpi_ctx *c, mpi_group *gr, const char *op, const void *send,
                            const size_t *send_counts, const size_t *send_displs,
                            size_t send_one, void *recv, const size_t *recv_counts,
                            const size_t *recv_displs)
{
    int n = gr->size, me = gr->rank;
    MPI_Request *reqs = calloc((size_t)2 * n, sizeof *reqs);
    MPI_Datatype *types = calloc((size_t)2 * n, sizeof *types);
    bool *owned = calloc((size_t)2 * n, sizeof *owned);
    cpc_status *st = NULL;
    if (!reqs || !types || !owned) {
        free(reqs);
        free(types);
        free(owned);
        return &cpc_status_oom;
    }
    int nreq = 0, ntypes = 0;
    for (int j = 0; j < n && !st; j++) {
        if (j == me || recv_counts[j] == 0)
            continue;
        int cnt = 0;
        st = msg_type(recv_counts[j], &cnt, &types[ntypes], &owned[ntypes]);
        if (st)
            break;
        int rc = MPI_Irecv((char *)recv + recv_displs[j], cnt, types[ntypes], j, 0, gr->aux,
                           &reqs[nreq]);
        ntypes++;
        if (rc != MPI_SUCCESS)
            st = mpi_status(rc, "rank %d: %s: MPI_Irecv from %s member %d (%zu bytes)",
                            c->world_rank, op, gname((cpc_group)(gr - c->groups)), j,
                            recv_counts[j]);
        else
            nreq++;
    }
    for (int j = 0; j < n && !st; j++) {
        size_t cnt_b = send_counts ? send_counts[j] : send_one;
        if (j == me || cnt_b == 0)
            continue;
        const char *p = (const char *)send + (send_displs ? send_displs[j] : 0);
        int cnt = 0;
        st = msg_type(cnt_b, &cnt, &types[ntypes], &owned[ntypes]);
        if (st)
            break;
        int rc = MPI_Isend(p, cnt, types[ntypes], j, 0, gr->aux, &reqs[nreq]);
        ntypes++;
        if (rc != MPI_SUCCESS)
            st = mpi_status(rc, "rank %d: %s: MPI_Isend to %s member %d (%zu bytes)",
                            c->world_rank, op, gname((cpc_group)(gr - c->groups)), j, cnt_b);
        else
            nreq++;
    }
    if (!st) {
        size_t own = send_counts ? send_counts[me] : send_one;
        const char *src = (const char *)send + (send_displs ? send_displs[me] : 0);
        char *dst = (char *)recv + recv_displs[me];
        if (own && src != dst)
            memmove(dst, src, own);
    }
    if (st) {
        /* A posted request cannot be withdrawn safely; the job is about to be
         * aborted by the caller, so leave them (MPI_Abort reclaims them). */
    } else if (nreq > 0) {
        bool stalled = false;
        int rc = wait_all(nreq, reqs, MPI_STATUSES_IGNORE, &stalled);
        if (stalled)
            st = stall_status(c->world_rank, "%s over the %s group (pairwise exchange)", op,
                              gname((cpc_group)(gr - c->groups)));
        else if (rc != MPI_SUCCESS)
            st = mpi_status(rc, "rank %d: %s: MPI_Waitall", c->world_rank, op);
    }
    for (int i = 0; i < ntypes; i++)
        if (owned[i])
            MPI_Type_free(&types[i]);
    free(reqs);
    free(types);
    free(owned);
    return st;
}

static cpc_status *m_all_to_all_v(cpc_transport *t, cpc_group g, const void *send,
                                  const size_t *send_counts, const size_t *send_displs,
                                  void *recv, const size_t *recv_counts,
                                  const size_t *recv_displs)
{
    mpi_ctx *c = ctx_of(t);
    mpi_group *gr = group_of(c, g);
    if (!gr)
        return bad_group(c, "all_to_all_v", g);
    int n = gr->size;
    bool mine = any_large(send_counts, n) || any_large(send_displs, n) ||
                any_large(recv_counts, n) || any_large(recv_displs, n);
    bool large = false;
    cpc_status *st = agree_large(c, gr, "all_to_all_v", mine, &large);
    if (st)
        return st;
    if (large)
        return pairwise(c, gr, "all_to_all_v", send, send_counts, send_displs, 0, recv,
                        recv_counts, recv_displs);
    int *a = malloc((size_t)4 * n * sizeof *a);
    if (!a)
        return &cpc_status_oom;
    for (int i = 0; i < n; i++) {
        a[i] = (int)send_counts[i];
        a[n + i] = (int)send_displs[i];
        a[2 * n + i] = (int)recv_counts[i];
        a[3 * n + i] = (int)recv_displs[i];
    }
    MPI_Request rq = MPI_REQUEST_NULL;
    bool stalled = false;
    int rc = MPI_Ialltoallv(send, a, a + n, MPI_BYTE, recv, a + 2 * n, a + 3 * n, MPI_BYTE,
                            gr->comm, &rq);
    if (rc == MPI_SUCCESS)
        rc = wait_all(1, &rq, MPI_STATUSES_IGNORE, &stalled);
    if (stalled) /* `a` stays with the pending request: the job is aborted */
        return stall_status(c->world_rank, "all_to_all_v over the %s group (MPI_Ialltoallv)", gname(g));
    free(a);
    if (rc != MPI_SUCCESS)
        return mpi_status(rc, "rank %d: all_to_all_v over %s group: MPI_Alltoallv",
                          c->world_rank, gname(g));
    return NULL;
}

static cpc_status *m_all_gather_v(cpc_transport *t, cpc_group g, const void *send,
                                  size_t send_bytes, void *recv, const size_t *counts,
                                  const size_t *displs)
{
    mpi_ctx *c = ctx_of(t);
    mpi_group *gr = group_of(c, g);
    if (!gr)
        return bad_group(c, "all_gather_v", g);
    int n = gr->size, me = gr->rank;
    if (counts[me] != send_bytes)
        /* A caller bug; the other members are left in the collective until
         * the caller aborts the transport (as after any failed op). */
        return cpc_error(CPC_E_INTERNAL,
                         "rank %d: all_gather_v over %s group: send_bytes %zu != counts[%d] %zu",
                         c->world_rank, gname(g), send_bytes, me, counts[me]);
    bool mine = send_bytes > g_int_limit || any_large(counts, n) || any_large(displs, n);
    bool large = false;
    cpc_status *st = agree_large(c, gr, "all_gather_v", mine, &large);
    if (st)
        return st;
    if (large)
        return pairwise(c, gr, "all_gather_v", send, NULL, NULL, send_bytes, recv, counts,
                        displs);
    int *a = malloc((size_t)2 * n * sizeof *a);
    if (!a)
        return &cpc_status_oom;
    for (int i = 0; i < n; i++) {
        a[i] = (int)counts[i];
        a[n + i] = (int)displs[i];
    }
    /* MPI forbids overlapping send and receive buffers; the own block
     * already in place is MPI_IN_PLACE. */
    const void *sbuf = (send == (const char *)recv + displs[me]) ? MPI_IN_PLACE : send;
    MPI_Request rq = MPI_REQUEST_NULL;
    bool stalled = false;
    int rc = MPI_Iallgatherv(sbuf, (int)send_bytes, MPI_BYTE, recv, a, a + n, MPI_BYTE,
                             gr->comm, &rq);
    if (rc == MPI_SUCCESS)
        rc = wait_all(1, &rq, MPI_STATUSES_IGNORE, &stalled);
    if (stalled) /* `a` stays with the pending request: the job is aborted */
        return stall_status(c->world_rank, "all_gather_v over the %s group (MPI_Iallgatherv)", gname(g));
    free(a);
    if (rc != MPI_SUCCESS)
        return mpi_status(rc, "rank %d: all_gather_v over %s group: MPI_Allgatherv",
                          c->world_rank, gname(g));
    return NULL;
}

static cpc_status *m_barrier(cpc_transport *t, cpc_group g)
{
    mpi_ctx *c = ctx_of(t);
    mpi_group *gr = group_of(c, g);
    if (!gr)
        return bad_group(c, "barrier", g);
    MPI_Request rq = MPI_REQUEST_NULL;
    bool stalled = false;
    int rc = MPI_Ibarrier(gr->comm, &rq);
    if (rc == MPI_SUCCESS)
        rc = wait_all(1, &rq, MPI_STATUSES_IGNORE, &stalled);
    if (stalled)
        return stall_status(c->world_rank, "barrier over the %s group (MPI_Ibarrier)", gname(g));
    if (rc != MPI_SUCCESS)
        return mpi_status(rc, "rank %d: barrier over %s group: MPI_Barrier", c->world_rank,
                          gname(g));
    return NULL;
}

void cpc_mpi_abort(int exit_code, const char *why)
{
    bool live = mpi_is_live();
    int rank = -1;
    if (live)
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank >= 0)
        fprintf(stderr, "cprun: rank %d: aborting: %s\n", rank, why ? why : "(no reason given)");
    else
        fprintf(stderr, "cprun: rank ?: aborting: %s\n", why ? why : "(no reason given)");
    fflush(stdout);
    fflush(stderr);
    if (live)
        MPI_Abort(MPI_COMM_WORLD, exit_code);
    /* MPI_Abort should not return; if it does (or without MPI), do not let
     * the rank go on as if nothing happened. */
    _Exit(exit_code);
}

static void m_abort(cpc_transport *t, const char *why)
{
    (void)t;
    cpc_mpi_abort(3, why);
}

static void free_groups(mpi_ctx *c)
{
    for (int g = 0; g < CPC_GROUP__COUNT; g++) {
        if (c->groups[g].comm != MPI_COMM_NULL)
            MPI_Comm_free(&c->groups[g].comm);
        if (c->groups[g].aux != MPI_COMM_NULL)
            MPI_Comm_free(&c->groups[g].aux);
    }
}

static void m_destroy(cpc_transport *t)
{
    if (!t)
        return;
    mpi_ctx *c = ctx_of(t);
    if (mpi_is_live()) {
        free_groups(c);
        if (c->owns_mpi && !g_cpc_mpi_held)
            finalize_watched();
    }
    free(c);
}

static const cpc_transport_vtable mpi_vtable = {
    .name = "mpi",
    .group_rank = m_group_rank,
    .group_size = m_group_size,
    .isend = m_isend,
    .irecv = m_irecv,
    .wait = m_wait,
    .all_to_all_v = m_all_to_all_v,
    .all_gather_v = m_all_gather_v,
    .barrier = m_barrier,
    .abort = m_abort,
    .destroy = m_destroy,
};

/* Fills gr from comm (takes ownership) and makes its aux duplicate. */
static cpc_status *setup_group(mpi_ctx *c, cpc_group g, MPI_Comm comm)
{
    mpi_group *gr = &c->groups[g];
    gr->comm = comm;
    int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_rank(comm, &gr->rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(comm, &gr->size);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(comm, &gr->aux);
    if (rc != MPI_SUCCESS)
        return mpi_status(rc, "rank %d: setting up the %s group", c->world_rank, gname(g));
    return NULL;
}

static cpc_status *create_on(MPI_Comm base, bool caller_comm, int ring_degree, int ulysses_degree,
                             const char *mesh, cpc_transport **out);

cpc_status *cpc_transport_mpi_create(int ring_degree, int ulysses_degree, cpc_transport **out)
{
    return create_on(MPI_COMM_WORLD, false, ring_degree, ulysses_degree, NULL, out);
}

cpc_status *cpc_transport_mpi_create_world(int world_size, const char *mesh, cpc_transport **out)
{
    return create_on(MPI_COMM_WORLD, false, world_size, 1, mesh, out);
}

cpc_status *cpc_transport_mpi_create_comm(const void *comm, int ring_degree, int ulysses_degree,
                                          cpc_transport **out)
{
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return cpc_error(CPC_E_USAGE, "mpi transport: MPI is %s; initialise it before making "
                                      "a rank on a communicator",
                         finalized ? "already finalised" : "not initialised");
    if (!comm)
        return cpc_error(CPC_E_USAGE, "mpi transport: no communicator (NULL)");
    MPI_Comm base = *(const MPI_Comm *)comm;
    if (base == MPI_COMM_NULL)
        return cpc_error(CPC_E_USAGE, "mpi transport: the communicator is MPI_COMM_NULL");
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "mpi transport: MPI was initialised with thread level %d; cpc needs at "
                         "least MPI_THREAD_SERIALIZED (MPI_Init_thread)", provided);
    return create_on(base, true, ring_degree, ulysses_degree, NULL, out);
}

cpc_status *cpc_mpi_comm_rank_size(const void *comm, int *rank, int *size)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return cpc_error(CPC_E_USAGE, "mpi transport: MPI is %s", finalized ? "already finalised" : "not initialised");
    MPI_Comm base = comm ? *(const MPI_Comm *)comm : MPI_COMM_WORLD;
    if (base == MPI_COMM_NULL)
        return cpc_error(CPC_E_USAGE, "mpi transport: the communicator is MPI_COMM_NULL");
    MPI_Comm_rank(base, rank);
    MPI_Comm_size(base, size);
    return NULL;
}

cpc_status *cpc_transport_mpi_create_split(const void *comm, int color, int key, int ring_degree,
                                           int ulysses_degree, cpc_transport **out)
{
    *out = NULL;
    int wr = 0, ws = 0;
    cpc_status *st0 = cpc_mpi_comm_rank_size(comm, &wr, &ws);
    if (st0)
        return st0;
    MPI_Comm base = comm ? *(const MPI_Comm *)comm : MPI_COMM_WORLD;
    MPI_Comm sub = MPI_COMM_NULL;
    int rc = MPI_Comm_split(base, color, key, &sub);
    if (rc != MPI_SUCCESS)
        return mpi_status(rc, "rank %d: MPI_Comm_split (group %d)", wr, color);
    cpc_status *st = cpc_transport_mpi_create_comm(&sub, ring_degree, ulysses_degree, out);
    MPI_Comm_free(&sub); /* create_comm duplicated it */
    if (st)
        cpc_status_prefix(st, "world rank %d, group %d", wr, color);
    return st;
}

static cpc_status *create_on_inner(MPI_Comm base, bool caller_comm, int ring_degree,
                                   int ulysses_degree, const char *mesh, cpc_transport **out);

/* create_on_inner under the watchdog: MPI_Init_thread and the communicators'
 * setup block until every rank takes part. */
static cpc_status *create_on(MPI_Comm base, bool caller_comm, int ring_degree, int ulysses_degree,
                             const char *mesh, cpc_transport **out)
{
    bool w = wd_arm(caller_comm ? "setting up the communicators (MPI_Comm_dup / MPI_Comm_split)"
                                : "MPI_Init_thread and the communicators' setup (every rank starts "
                                  "the job together)",
                    -1, 0);
    /* tests/mpi/run_stall.sh: a rank stopped before MPI_Init, deterministically */
    int stop = env_int("CPC_TEST_SIGSTOP_BEFORE_INIT");
    if (stop >= 0 && !caller_comm && stop == env_int("OMPI_COMM_WORLD_RANK"))
        raise(SIGSTOP);
    cpc_status *st = create_on_inner(base, caller_comm, ring_degree, ulysses_degree, mesh, out);
    wd_disarm(w);
    return st;
}

static cpc_status *create_on_inner(MPI_Comm base, bool caller_comm, int ring_degree,
                                   int ulysses_degree, const char *mesh, cpc_transport **out)
{
    *out = NULL;
    if (ring_degree < 1 || ulysses_degree < 1)
        return cpc_error(CPC_E_USAGE, "mpi transport: ring_degree %d and ulysses_degree %d "
                                      "must be >= 1", ring_degree, ulysses_degree);
    if ((long long)ring_degree * ulysses_degree > INT_MAX)
        return cpc_error(CPC_E_USAGE, "mpi transport: mesh %d x %d is too large", ring_degree,
                         ulysses_degree);
    bool did_init = false;
    cpc_status *st = caller_comm ? NULL : ensure_mpi(&did_init);
    if (st)
        return st;
    int world_rank = 0, world_size = 0;
    MPI_Comm_rank(base, &world_rank);
    MPI_Comm_size(base, &world_size);
    int want = ring_degree * ulysses_degree;
    if (world_size != want) {
        if (mesh)
            st = cpc_error(CPC_E_USAGE,
                           "mpi transport: the plan's mesh needs world_size %d (%s) but the job has "
                           "%d MPI processes", want, mesh, world_size);
        else
            st = cpc_error(CPC_E_USAGE,
                           "mpi transport: the plan's mesh needs world_size %d (ring_degree %d x "
                           "ulysses_degree %d) but the job has %d MPI processes",
                           want, ring_degree, ulysses_degree, world_size);
        if (caller_comm)
            cpc_status_set_hint(st, "pass a communicator of %d processes", want);
        else
            cpc_status_set_hint(st, "start %d processes (mpirun -np %d / srun -n %d), or run "
                                    "without a launcher with --transport local",
                                want, want, want);
        if (did_init)
            finalize_watched();
        return st;
    }
    mpi_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (did_init)
            finalize_watched();
        return &cpc_status_oom;
    }
    for (int g = 0; g < CPC_GROUP__COUNT; g++)
        c->groups[g].comm = c->groups[g].aux = MPI_COMM_NULL;
    c->world_rank = world_rank;
    c->ring_degree = ring_degree;
    c->ulysses_degree = ulysses_degree;
    c->owns_mpi = did_init;
    c->base.vt = &mpi_vtable;
    c->base.ctx = c;

    int r = world_rank / ulysses_degree, u = world_rank % ulysses_degree;
    MPI_Comm world = MPI_COMM_NULL, ring = MPI_COMM_NULL, uly = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(base, &world);
    if (rc != MPI_SUCCESS) {
        st = mpi_status(rc, "rank %d: MPI_Comm_dup(%s)", world_rank,
                        caller_comm ? "the caller's communicator" : "MPI_COMM_WORLD");
        goto fail;
    }
    st = setup_group(c, CPC_GROUP_WORLD, world);
    if (st)
        goto fail;
    /* Ring group: same ulysses index, members ordered by ring index.
     * Ulysses group: same ring index, ordered by ulysses index. */
    rc = MPI_Comm_split(world, u, r, &ring);
    if (rc != MPI_SUCCESS) {
        st = mpi_status(rc, "rank %d: MPI_Comm_split (ring group)", world_rank);
        goto fail;
    }
    st = setup_group(c, CPC_GROUP_RING, ring);
    if (st)
        goto fail;
    rc = MPI_Comm_split(world, r, u, &uly);
    if (rc != MPI_SUCCESS) {
        st = mpi_status(rc, "rank %d: MPI_Comm_split (ulysses group)", world_rank);
        goto fail;
    }
    st = setup_group(c, CPC_GROUP_ULYSSES, uly);
    if (st)
        goto fail;
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(base, MPI_TAG_UB, &ub, &flag);
    c->tag_ub = (flag && ub) ? *(int *)ub : 32767;
    /* Our own invariants: the split reproduces the mesh coordinates. */
    if (c->groups[CPC_GROUP_RING].rank != r || c->groups[CPC_GROUP_RING].size != ring_degree ||
        c->groups[CPC_GROUP_ULYSSES].rank != u ||
        c->groups[CPC_GROUP_ULYSSES].size != ulysses_degree ||
        c->groups[CPC_GROUP_WORLD].rank != world_rank) {
        st = cpc_error(CPC_E_INTERNAL, "rank %d: MPI_Comm_split gave unexpected groups",
                       world_rank);
        goto fail;
    }
    *out = &c->base;
    return NULL;

fail:
    free_groups(c);
    if (did_init)
        finalize_watched();
    free(c);
    return st;
}
