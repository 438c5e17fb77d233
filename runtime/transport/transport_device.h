/*
 * transport_device.h - device buffers moved device-to-device: a decorator for
 * virtual ranks of the CUDA backend that share one process (SPEC section 5,
 * "placement without a launcher": every rank a thread; on one GPU all ranks
 * are virtual ranks with device-to-device copies as the transport).
 *
 * The wrapped endpoint is a local-transport endpoint (transport_local.h) whose
 * world copies with cpc_device_copy (below), so bytes go straight from the
 * sender's device buffer into the receiver's, once, on the copier's stream:
 * no host staging (transport_staged.h is the host-staged alternative).
 *
 * Ordering.  Kernels run asynchronously on each rank's stream, while the
 * local transport copies as soon as both sides of a transfer are posted, on
 * either side's thread.  So before a buffer is exposed to the transport, its
 * owner waits for its own stream (backend sync):
 *   isend         the kernels that wrote the send buffer are done;
 *   irecv         the kernels that read the old contents of the receive
 *                 buffer are done;
 *   all_to_all_v, all_gather_v: both;
 *   wait          returns after the copy has completed (cpc_device_copy is
 *                 synchronous), so kernels queued afterwards see the data.
 * The sync costs the compute/communication overlap within one rank's stream
 * at the point of posting; the copies themselves run on the copy engines
 * while other ranks compute.
 *
 * Ownership: on success the decorator OWNS `inner` and BORROWS `be` (which
 * must outlive it).  Thread-safety: as the inner endpoint (one rank thread).
 * Errors: the backend's sync error (naming the operation) or the inner
 * transport's.
 */
#ifndef CPC_TRANSPORT_DEVICE_H
#define CPC_TRANSPORT_DEVICE_H

#include "status.h"
#include "backend.h"
#include "transport.h"

/* Wraps `inner` (non-NULL) for device buffers of `be` (non-NULL).  Vtable
 * name "<inner name>+device" (e.g. "local+device").  On failure *out is NULL
 * and inner is still the caller's.  Errors: CPC_E_INTERNAL (NULL argument),
 * CPC_E_NOMEM. */
cpc_status *cpc_transport_device_create(cpc_transport *inner, cpc_backend *be,
                                        cpc_transport **out);

/* True when `t` was made by cpc_transport_device_create. */
bool cpc_transport_device_is(const cpc_transport *t);

/* Bytes sent by `t` (isend, and the parts of collectives addressed to other
 * ranks), for the report.  0 for another transport. */
size_t cpc_transport_device_bytes(const cpc_transport *t);

/* A copy function for cpc_local_world_set_copy: ctx is an array of P
 * backends (cpc_backend *const *, rank order); the copy runs on the copier's
 * backend (be->vt->copy, then be->vt->sync), so it is complete on return.
 * With the CUDA backend that is a cudaMemcpyAsync on the copier's stream
 * (device to device; peer copies across GPUs go through unified addressing);
 * with the CPU backend, memcpy. */
cpc_status *cpc_device_copy(void *ctx, int copier, void *dst, const void *src, size_t bytes);

#endif
