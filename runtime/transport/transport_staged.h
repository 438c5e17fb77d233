/*
 * transport_staged.h - device buffers over a host-memory transport: a
 * decorator (a transport that wraps another endpoint) for the CUDA backend.
 *
 * The local transport (transport_local.h) moves bytes with memcpy and the
 * MPI transport (transport_mpi.h) is built for host memory, but the CUDA
 * backend's buffers are device memory.  A staged endpoint wraps one rank's
 * endpoint of either and stages every message through host memory with that
 * rank's backend (backend.h upload/download, which wait for the work queued
 * on the backend's stream):
 *
 *   isend         downloads the device buffer into a host copy (malloc'd,
 *                 `bytes`) at once and sends the copy; the device buffer is
 *                 free again when isend returns (stricter than transport.h
 *                 requires);
 *   irecv         receives into a host buffer (`bytes`); wait uploads it to
 *                 the device buffer, then frees it;
 *   all_to_all_v  downloads the send extent (max over members of displs +
 *   all_gather_v  counts, bytes), runs the inner collective on host buffers,
 *                 uploads each received part [displs[i], displs[i] +
 *                 counts[i]) to the device buffer: bytes of the receive
 *                 buffer outside the parts are not touched, as with the
 *                 inner transport;
 *   group_rank, group_size, barrier, abort: the inner endpoint's.
 *
 * Cost: every byte crosses the host link twice (device -> host at the
 * sender, host -> device at the receiver) plus the inner transport's copy,
 * and each message allocates host memory of its size.  The staging memory is
 * pageable (malloc): the backend interface has no pinned-memory allocation,
 * so the copies run at pageable speed.  It serves correctness (virtual ranks
 * on one GPU, MPI ranks without a device-aware transport) rather than speed;
 * NCCL (transport_nccl) is the fast path between GPUs.
 *
 * Works with any backend: with the CPU backend (upload/download = memcpy)
 * it is an exact, slower copy of the inner transport, which is how it is
 * tested without a GPU.
 *
 * Errors: the inner transport's (named by it) and the backend's
 * (CPC_E_RUNTIME naming the CUDA call); CPC_E_NOMEM when host memory for a
 * message cannot be allocated.  A failed isend/irecv leaves nothing pending.
 *
 * Ownership: on success the staged endpoint OWNS `inner` (its destroy
 * destroys inner) and BORROWS `be`, which must outlive it (the staged
 * endpoint's destroy does not touch `be`).
 * Requests are the staged endpoint's (wait completes and frees them).
 * Thread-safety: as the inner endpoint (one rank thread uses it); `be` is
 * used only from that thread.
 */
#ifndef CPC_TRANSPORT_STAGED_H
#define CPC_TRANSPORT_STAGED_H

#include "status.h"
#include "backend.h"
#include "transport.h"

/* Wraps `inner` (non-NULL) so that its buffers may be device memory of `be`
 * (non-NULL).  The endpoint's vtable name is "<inner name>+staged" (e.g.
 * "local+staged").  On success *out owns inner; on failure *out is NULL and
 * inner is untouched and still the caller's (so the caller can still abort
 * through it).  Errors: CPC_E_INTERNAL (NULL argument), CPC_E_NOMEM. */
cpc_status *cpc_transport_staged_create(cpc_transport *inner, cpc_backend *be,
                                        cpc_transport **out);

/* True when `t` is a staged endpoint (made by cpc_transport_staged_create). */
bool cpc_transport_staged_is(const cpc_transport *t);

/* Bytes staged through host memory by `t` so far: downloaded (sent) and
 * uploaded (received), summed over every call.  0 for another transport. */
void cpc_transport_staged_bytes(const cpc_transport *t, size_t *downloaded, size_t *uploaded);

#endif
