/*
 * transport_local.h - the in-process transport: every rank is a thread of one
 * process and all ranks share one "world" object (shared memory).
 *
 * Mesh as in layout.h: R x U ranks, flat rank p = r * U + u; the ring group
 * of p is {i * U + u}, indexed by i (= r); the ulysses group is {r * U + i},
 * indexed by i (= u); the world group is every rank, indexed by p.
 *
 * Point-to-point: isend/irecv are matched by (group, sender, receiver, tag),
 * first posted first matched (MPI's non-overtaking rule), so several buffers
 * sent under one tag arrive in the order they were posted.  The data is
 * copied once, straight from the sender's buffer into the receiver's, by the
 * thread that posts the second half of the pair; `wait` returns when the copy
 * is done.  A size mismatch fails both requests (CPC_E_RUNTIME).
 *
 * Collectives (all_to_all_v, all_gather_v, barrier): every member publishes
 * its buffers, a generation-counted barrier, every member copies the parts
 * addressed to it directly from the others' send buffers into its receive
 * buffer, a second barrier.  No staging copy.  A member calling a different
 * collective than the others, or sizes that do not agree between sender and
 * receiver, is an error naming both ranks.
 *
 * Abort: cpc_transport_abort (the vtable's abort) or cpc_local_world_abort
 * marks the world failed and wakes every waiter; every blocked and every
 * later call returns CPC_E_RUNTIME.  With a timeout set, a wait that lasts
 * longer aborts the world with a message saying who waited for what.
 *
 * Thread-safety: one endpoint per rank thread; an endpoint is used by one
 * thread only; the world object is shared and internally locked.
 */
#ifndef CPC_TRANSPORT_LOCAL_H
#define CPC_TRANSPORT_LOCAL_H

#include <stdbool.h>
#include <stddef.h>

#include "transport.h"

typedef struct cpc_local_world cpc_local_world;

/* Creates a world of ring_degree * ulysses_degree ranks (both >= 1, product
 * <= 2^20).  Errors: CPC_E_INTERNAL for bad degrees, CPC_E_NOMEM.  *out is
 * owned by the caller: destroy it after every endpoint is destroyed. */
cpc_status *cpc_local_world_create(int ring_degree, int ulysses_degree,
                                   cpc_local_world **out);

/* Seconds any single wait may last before the world is aborted with a
 * diagnostic (0 = wait forever, the default).  Call before ranks start. */
void cpc_local_world_set_timeout(cpc_local_world *w, double seconds);

/* How the world moves bytes between ranks' buffers: copies `bytes` from src
 * to dst on behalf of rank `copier` (the thread calling it: the rank that
 * posts the second half of a send/recv pair, or the receiving member of a
 * collective), and returns when the bytes are in place.  NULL or an error
 * status (the transfer then fails: both requests of a pair, or the
 * collective on the copier's side, with the status' message).  Buffers may
 * overlap only when identical (never copied).  Called without the world's
 * lock, concurrently from several rank threads. */
typedef cpc_status *(*cpc_local_copy_fn)(void *ctx, int copier, void *dst, const void *src,
                                         size_t bytes);

/* Sets the copy function (default: memmove, for host memory).  The CUDA path
 * sets one that copies device memory with the copier's stream
 * (transport_device.h).  Call before ranks start; ctx is borrowed. */
void cpc_local_world_set_copy(cpc_local_world *w, cpc_local_copy_fn fn, void *ctx);

/* The world's owner: an opaque identity `tag` (e.g. the resolved plan text
 * of the artifact the world was made for) and a human `label` naming it;
 * both copied.  Setting it again replaces them.  Returns false when out of
 * memory (the world then has no owner).  cpc_local_world_owner gives them
 * back (borrowed, valid until the world is destroyed or the owner set
 * again; NULL when none was set).  The transport does not use them: the
 * rank API refuses a rank whose artifact is not the world's owner. */
bool cpc_local_world_set_owner(cpc_local_world *w, const char *tag, const char *label);
void cpc_local_world_owner(const cpc_local_world *w, const char **tag, const char **label);

/* Creates rank `rank`'s endpoint (0 <= rank < P).  Each rank gets exactly one
 * endpoint; release it with cpc_transport_destroy(t) (pending requests are freed).
 * Errors: CPC_E_INTERNAL (bad rank, endpoint exists), CPC_E_NOMEM. */
cpc_status *cpc_local_endpoint_create(cpc_local_world *w, int rank, cpc_transport **out);

/* Marks the world failed with reason `why` (copied; the first reason wins)
 * and wakes every waiter.  `rank` is the rank that failed, or -1. */
void cpc_local_world_abort(cpc_local_world *w, int rank, const char *why);

/* True when the world was aborted; *rank and *why (owned by the world, valid
 * until it is destroyed) tell by whom and why.  Either pointer may be NULL. */
bool cpc_local_world_aborted(cpc_local_world *w, int *rank, const char **why);

/* Frees the world (all endpoints must be destroyed first).  NULL is ignored. */
void cpc_local_world_destroy(cpc_local_world *w);

#endif
