/*
 * transport.h - the communication interface of the executor: send/recv,
 * all-to-all(v), all-gather(v), barrier over the groups of the mesh (ring
 * group: same ulysses index; ulysses group: same ring index; world).
 *
 * One transport endpoint per rank (for the local transport: one per rank
 * thread, all attached to one shared world).  Buffers are device pointers of
 * the backend in use (host memory for the CPU backend).  Sizes and
 * displacements are in BYTES.  Peers are indices inside the group.
 *
 * Errors: CPC_E_RUNTIME naming the op and the peer; after any rank fails,
 * the transport is aborted (cpc_transport_abort) and every pending or later
 * call on every rank returns an error instead of hanging.
 */
#ifndef CPC_TRANSPORT_H
#define CPC_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "program.h"
#include "status.h"

typedef struct cpc_transport cpc_transport;
typedef struct cpc_request cpc_request;   /* an outstanding send or recv */

typedef struct cpc_transport_vtable {
    const char *name;                                  /* "local", "mpi", "nccl" */
    /* This endpoint's index and size in a group. */
    int (*group_rank)(cpc_transport *t, cpc_group g);
    int (*group_size)(cpc_transport *t, cpc_group g);
    /* Non-blocking point-to-point; complete with wait.  The buffer must stay
     * valid and untouched until then. */
    cpc_status *(*isend)(cpc_transport *t, cpc_group g, int peer, const void *buf,
                         size_t bytes, int tag, cpc_request **req);
    cpc_status *(*irecv)(cpc_transport *t, cpc_group g, int peer, void *buf,
                         size_t bytes, int tag, cpc_request **req);
    /* Completes and frees a request. */
    cpc_status *(*wait)(cpc_transport *t, cpc_request *req);
    /* Blocking all-to-all with per-member sizes (bytes) and displacements. */
    cpc_status *(*all_to_all_v)(cpc_transport *t, cpc_group g,
                                const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv,
                                const size_t *recv_counts, const size_t *recv_displs);
    /* Blocking all-gather with per-member sizes; member i's bytes land at
     * recv + displs[i]. */
    cpc_status *(*all_gather_v)(cpc_transport *t, cpc_group g, const void *send,
                                size_t send_bytes, void *recv, const size_t *counts,
                                const size_t *displs);
    cpc_status *(*barrier)(cpc_transport *t, cpc_group g);
    /* Marks the whole job failed: every rank's blocked or later call returns
     * an error.  Safe from any thread. */
    void (*abort)(cpc_transport *t, const char *why);
    void (*destroy)(cpc_transport *t);
    /* OPTIONAL (NULL: nothing to do).  Starts the transfers of the isend /
     * irecv posted so far that the transport still holds back: NCCL batches
     * point-to-point messages until a wait (transport_nccl.h), so an
     * executor that wants a ring step's transfer to overlap the attention
     * calls flush after posting the step's sends and receives and before
     * queueing that compute.  Every member of a group calls it at the same
     * program points (SPMD).  Errors: as isend/irecv. */
    cpc_status *(*flush)(cpc_transport *t);
} cpc_transport_vtable;

struct cpc_transport {
    const cpc_transport_vtable *vt;
    void *ctx;
};

/* Calls through the vtable: every caller uses these, never t->vt->...
 * directly, so that the optional methods' checks live in one place (a NULL
 * `flush` is a no-op).  Arguments, results and errors are the methods'
 * (above). */
static inline const char *cpc_transport_name(const cpc_transport *t) { return t->vt->name; }
static inline int cpc_transport_group_rank(cpc_transport *t, cpc_group g) { return t->vt->group_rank(t, g); }
static inline int cpc_transport_group_size(cpc_transport *t, cpc_group g) { return t->vt->group_size(t, g); }
static inline cpc_status *cpc_transport_isend(cpc_transport *t, cpc_group g, int peer, const void *buf,
                                              size_t bytes, int tag, cpc_request **req)
{ return t->vt->isend(t, g, peer, buf, bytes, tag, req); }
static inline cpc_status *cpc_transport_irecv(cpc_transport *t, cpc_group g, int peer, void *buf,
                                              size_t bytes, int tag, cpc_request **req)
{ return t->vt->irecv(t, g, peer, buf, bytes, tag, req); }
static inline cpc_status *cpc_transport_wait(cpc_transport *t, cpc_request *req)
{ return t->vt->wait(t, req); }
static inline cpc_status *cpc_transport_all_to_all_v(cpc_transport *t, cpc_group g, const void *send,
                                                     const size_t *send_counts,
                                                     const size_t *send_displs, void *recv,
                                                     const size_t *recv_counts,
                                                     const size_t *recv_displs)
{ return t->vt->all_to_all_v(t, g, send, send_counts, send_displs, recv, recv_counts, recv_displs); }
static inline cpc_status *cpc_transport_all_gather_v(cpc_transport *t, cpc_group g, const void *send,
                                                     size_t send_bytes, void *recv,
                                                     const size_t *counts, const size_t *displs)
{ return t->vt->all_gather_v(t, g, send, send_bytes, recv, counts, displs); }
static inline cpc_status *cpc_transport_barrier(cpc_transport *t, cpc_group g)
{ return t->vt->barrier(t, g); }
static inline void cpc_transport_abort(cpc_transport *t, const char *why) { t->vt->abort(t, why); }
static inline cpc_status *cpc_transport_flush(cpc_transport *t)
{ return t->vt->flush ? t->vt->flush(t) : NULL; }
/* NULL is ignored. */
static inline void cpc_transport_destroy(cpc_transport *t)
{
    if (t)
        t->vt->destroy(t);
}

#endif
