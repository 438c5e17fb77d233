/*
 * transport_conformance.h - one conformance suite for every transport
 * (runtime/transport/transport.h), written once and run against each implementation
 * (local threads, MPI processes, NCCL), as IREE's CTS does for its HAL
 * drivers.
 *
 * Every rank of the mesh calls cpc_transport_conformance() with its own
 * endpoint, at the same time (threads of one process for the local transport,
 * processes for MPI).  The suite runs the checks below in order; each rank
 * issues exactly the same sequence of communication calls whatever the data
 * it sees, so a data mismatch on one rank never leaves another rank blocked.
 *
 * Errors:
 *   - A wrong value (group rank/size, a received byte, a byte outside a
 *     receive region that changed, a barrier that let a member out before
 *     another entered) is recorded as a CPC_E_CHECK diagnostic naming the
 *     transport, the rank, the check, the group, the peer, the tag and the
 *     first differing byte offset; the suite goes on.
 *   - A transport call that returns an error (outside the bad-argument and
 *     abort checks, where errors are expected) is fatal: the suite calls the
 *     transport's abort (so every other rank's calls fail or, under MPI, the
 *     job ends) and returns that status, prefixed with the check's name.
 * The returned chain (NULL = every check passed on this rank) is owned by the
 * caller (cpc_status_free).
 *
 * Thread-safety: the suite keeps no global state; one call per rank thread.
 * Memory: at most about 4 * large_bytes per rank (LARGE), much less otherwise.
 */
#ifndef CPC_TRANSPORT_CONFORMANCE_H
#define CPC_TRANSPORT_CONFORMANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "status.h"
#include "transport.h"

/* The checks, as bits (for cpc_conformance_opts.skip). */
typedef enum cpc_conf_check {
    /* group_rank/group_size of ring, ulysses and world; and the members of
     * each group (all_gather_v of world ranks): ring = {i*U + u}, ulysses =
     * {r*U + i}, world = {p} - flat rank p = r*U + u. */
    CPC_CONF_GROUPS = 1u << 0,
    /* In each group of size n > 1: for every shift s = 1..n-1, send to
     * member (i+s) mod n and receive from (i-s) mod n, tag per shift, sizes
     * depending on the sender, every byte checked. */
    CPC_CONF_RING = 1u << 1,
    /* In each group: a message to oneself (isend then irecv on the same
     * endpoint, tag 7). */
    CPC_CONF_SELF = 1u << 2,
    /* In each group: 6 receives outstanding at once from the left neighbour,
     * posted in a different tag order than the 6 sends (tags 0..3, tag 1
     * twice: same-tag messages must match in posting order), one of 0 bytes,
     * completed in a third order. */
    CPC_CONF_OUTSTANDING = 1u << 3,
    /* In each group: all_to_all_v with uneven counts including zero-byte
     * parts, gaps between the parts of both buffers (gaps and the tail of
     * the receive buffer must stay untouched), parts sent in reverse member
     * order, and one call where every count is zero. */
    CPC_CONF_ALL_TO_ALL = 1u << 4,
    /* In each group: all_gather_v with uneven counts (zeros included),
     * displacements in reverse member order with gaps (left untouched). */
    CPC_CONF_ALL_GATHER = 1u << 5,
    /* In each group: 20 back-to-back barriers; with same_clock, member n-1
     * enters late and no member may leave before the last one entered
     * (CLOCK_MONOTONIC entry times gathered and compared). */
    CPC_CONF_BARRIER = 1u << 6,
    /* large_bytes messages: world ring shift, all_to_all_v over world with
     * parts of about large_bytes / P, all_gather_v over the ring group. */
    CPC_CONF_LARGE = 1u << 7,
    /* Bad arguments (peer -1 and n, tag -1, group NONE) give a status, not a
     * crash or a hang, and leave the transport usable (a barrier follows). */
    CPC_CONF_BAD_ARGS = 1u << 8,
    /* DESTRUCTIVE, always last: world member 0 calls abort; then every
     * rank's receive that nobody sends and its world barrier must return an
     * error instead of hanging.  Only for transports whose abort returns
     * (local); MPI's abort ends the processes (tests/mpi/run_fault.sh). */
    CPC_CONF_ABORT = 1u << 9,
    CPC_CONF_ALL = (1u << 10) - 1,
} cpc_conf_check;

/* Name of one check bit ("groups", "ring", ...), "?" for anything else. */
const char *cpc_conf_check_name(unsigned check);

typedef struct cpc_conformance_opts {
    const char *name;        /* transport name in messages; NULL: t->vt->name */
    unsigned skip;           /* cpc_conf_check bits NOT run */
    const char *skip_reason; /* why (printed in the log), may be NULL */
    size_t large_bytes;      /* LARGE message size; 0: 6 MiB + 3 bytes */
    bool same_clock;         /* every rank reads the same CLOCK_MONOTONIC (one
                                host): enables the barrier ordering check */
    FILE *log;               /* NULL: quiet; else world member 0 writes one
                                line per check ("conformance mpi: ring: ok") */
} cpc_conformance_opts;

/* Runs the suite on endpoint `t`, which belongs to the rank with ring index
 * `r` and ulysses index `u` of a ring_degree x ulysses_degree mesh.  `opts`
 * may be NULL: then every check runs except CPC_CONF_ABORT (destructive: it
 * runs only when opts is given and does not skip it).  Returns NULL when every check passed
 * on this rank, else the chain described above. */
cpc_status *cpc_transport_conformance(cpc_transport *t, int ring_degree, int ulysses_degree,
                                      int r, int u, const cpc_conformance_opts *opts);

struct cpc_local_world;

/* Turns rank `rank`'s local endpoint `inner` into the endpoint under test
 * (*out; on success *out owns inner, on failure inner is still the
 * caller's).  Called on the rank's thread. */
typedef cpc_status *(*cpc_conformance_wrap_fn)(void *ctx, int rank, cpc_transport *inner,
                                               cpc_transport **out);

/* Runs the suite on every rank of the in-process world `w` (ring_degree x
 * ulysses_degree, transport_local.h), one thread per rank: each creates its
 * local endpoint, wraps it with `wrap` (NULL: tests the local endpoint
 * itself), runs cpc_transport_conformance and destroys the endpoint.  A
 * rank that cannot set up aborts the world.  The caller creates and
 * destroys `w` (timeout, copy hook).  Returns every rank's diagnostics
 * chained (NULL: all passed; the caller frees). */
cpc_status *cpc_conformance_local_threads(struct cpc_local_world *w, int ring_degree,
                                          int ulysses_degree, cpc_conformance_wrap_fn wrap,
                                          void *ctx, const cpc_conformance_opts *opts);

#endif
