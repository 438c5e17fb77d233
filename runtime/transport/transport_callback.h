/*
 * transport_callback.h - a transport whose bytes are moved by the caller's own
 * point-to-point functions (cpc_transport_p2p_fns below; the public API's
 * cpc_p2p_callbacks, include/cpc/rank.h, is converted into it by api/): e.g. a
 * Python process under torchrun whose torch.distributed process group (gloo)
 * carries cpc's traffic.
 *
 * Mesh as in transport_local.h: R x U ranks, flat rank p = r * U + u; the ring
 * group of p is {i * U + u} (index i = r), the ulysses group {r * U + i}
 * (index i = u), the world every rank.  Peers handed to the callbacks are
 * WORLD ranks.
 *
 * Point-to-point: isend/irecv go to the callbacks with the wire tag
 * group * 2^20 + tag (tag must be < 2^20); sizes are exact on both sides (as
 * the MPI transport requires), so a 0-byte message is skipped by both and
 * completes at once.  Collectives are built from the same callbacks (wire
 * tag (4 + group) * 2^20): all_to_all_v and all_gather_v post every receive,
 * then every send, then wait for all; the member's own part is a memcpy;
 * barrier exchanges one byte with every other member.  Messages of one
 * (sender, receiver, wire tag) must arrive in the order posted (MPI's
 * non-overtaking rule; torch.distributed's gloo keeps it).
 *
 * Errors: a callback returning nonzero is CPC_E_RUNTIME naming the rank, the
 * op, the peer and the callback's code.  Abort marks the endpoint failed:
 * later calls return CPC_E_RUNTIME at once (a callback already blocked is the
 * caller's library's to time out).
 *
 * Thread-safety: one endpoint per rank; used by one thread at a time; the
 * callbacks are called from that thread.
 */
#ifndef CPC_TRANSPORT_CALLBACK_H
#define CPC_TRANSPORT_CALLBACK_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

/* The caller's point-to-point functions (the runtime layer's own copy of the
 * public cpc_p2p_callbacks: the runtime does not see include/cpc).  Peers are
 * WORLD ranks; `buf` is host memory of `bytes` (> 0) bytes, valid until the
 * matching wait returns; isend/irecv store a handle of the caller's choosing
 * in *handle, wait(handle) completes it; each returns 0 on success, nonzero
 * on failure.  `user` is passed back unchanged. */
typedef struct cpc_transport_p2p_fns {
    void *user;
    int (*isend)(void *user, int peer, const void *buf, size_t bytes, int tag, int64_t *handle);
    int (*irecv)(void *user, int peer, void *buf, size_t bytes, int tag, int64_t *handle);
    int (*wait)(void *user, int64_t handle);
} cpc_transport_p2p_fns;

/* An endpoint for world rank `rank` of an R x U mesh whose traffic goes
 * through `cb` (copied; cb->user is borrowed and must outlive the
 * endpoint).  Errors: CPC_E_USAGE (NULL callbacks, rank out of range),
 * CPC_E_NOMEM. */
cpc_status *cpc_transport_callback_create(const cpc_transport_p2p_fns *cb, int rank, int ring_degree,
                                          int ulysses_degree, cpc_transport **out);

#endif
