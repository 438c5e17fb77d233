/*
 * staged_transport.h - device buffers over a host-memory transport (test
 * helper of tests/gpu/gpu_check.c).
 *
 * The local transport (runtime/transport_local.h) moves bytes with memcpy,
 * so it needs host pointers; the CUDA backend's buffers are device memory.
 * This decorator stages every message through host memory with the rank's
 * backend: a send downloads the device buffer (backend download: after the
 * work queued on the backend's stream) into a malloc'd host copy and sends
 * that; a receive lands in a host buffer and is uploaded to the device
 * buffer when waited for; all_to_all_v and all_gather_v download the send
 * extent and upload each received part (bytes outside the parts are not
 * touched).  Slow (every byte crosses PCIe twice) but exact: it serves the
 * numerical checks of virtual ranks on one GPU, not the timing.
 *
 * Ownership: the decorator owns `inner` (destroyed with it) and borrows
 * `be`, which must outlive it.  Thread-safety: as the inner endpoint (one
 * rank thread).
 */
#ifndef CPC_STAGED_TRANSPORT_H
#define CPC_STAGED_TRANSPORT_H

#include "runtime/backend.h"
#include "runtime/transport.h"

/* Errors: CPC_E_NOMEM. */
cpc_status *cpc_staged_transport_create(cpc_transport *inner, cpc_backend *be,
                                        cpc_transport **out);

#endif
