/*
 * cpc/rank.h - one rank of a context-parallel attention layer, embedded in
 * the caller's program (SPEC section 8).
 *
 * The embedding unit is ONE RANK.  The caller owns the processes, the
 * communicator, the stream and every tensor; libcpc borrows them.  A rank is
 * made from a proven artifact and a transport the caller supplies:
 *   - cpc_rank_new_mpi:   the caller's MPI communicator (size = world
 *                            size; cpc duplicates it and splits its ring and
 *                            Ulysses groups from the duplicate: the caller's
 *                            communicator is never used for cpc's traffic);
 *   - cpc_rank_new_local: a rank that is a thread of this process, in a
 *                            world made with cpc_local_world_new (one thread
 *                            per rank; every rank of the world must call
 *                            cpc_rank_forward for each layer);
 *   - cpc_rank_new_nccl:  the caller's ncclComm_t and cudaStream_t, or
 *     cpc_rank_new_nccl_id: a unique id (cpc_nccl_unique_id on one rank,
 *                            broadcast by the caller): NCCL without MPI,
 *                            e.g. under torchrun (see NCCL RANKS below).
 * Flat rank p has mesh coordinates r = p / U (ring), u = p % U (Ulysses).
 *
 * THE OUTER AXES.  An artifact with cfg_degree C or tp_degree T > 1 (SPEC
 * section 1; compiler.h THE OUTER AXES) has a world of P = C*T*R*U ranks:
 * world rank p = ((c*R + r)*U + u)*T + t runs the R x U program of its
 * (c, t) group on its slice (cpc_artifact_rank_slice: batch items
 * [c*B/C, (c+1)*B/C), query heads [t*H/T, (t+1)*H/T) and their K/V heads),
 * and every rank API function takes the world rank.  The caller passes
 * that slice's shards (cpc_artifact_shard_shape, cpc_artifact_shard_runs)
 * and gets that slice's output.  MPI: the caller's communicator is the
 * whole world (size P); each rank's group communicator is split from it
 * (color c*T + t).  Local: a world from cpc_local_world_new is ONE group's
 * R x U world: make C*T of them and create rank p in the world of its
 * group (cpc_rank_slice.group); forwards are collective per group.
 *
 * Each cpc_rank_forward computes softmax(q k^T * scale) v (scale: the plan's
 * model.scale, default 1/sqrt(head_dim); masks as the plan says) for this rank's
 * shard of the global sequence, exactly as the whole attention would give it
 * on one device (the artifact's schedule, proven).  It is COLLECTIVE: every
 * rank of the world calls it for the same layer, in the same order.
 *
 * For a training plan (cpc_artifact_trains), cpc_rank_backward runs the
 * artifact's proven backward program: dq, dk, dv of this rank's shard from
 * the forward's q, k, v, out and LSE and the caller's dout.  It is
 * collective like the forward (per group with the outer axes).  With
 * kv_heads < tp_degree a K/V head is replicated over T/Hkv tensor-parallel
 * ranks and each returns a PARTIAL dk/dv (its query heads only): the caller
 * sums them (as it reduces any replicated parameter's gradient).
 *
 * Memory: cpc_rank_new_* allocates every internal buffer (the schedule's
 * buffers, all-to-all staging, space to gather strided inputs; for a
 * training plan also the backward program's buffers and an fp32 gradient
 * buffer) from sizes the artifact states.  cpc_rank_forward and
 * cpc_rank_backward allocate nothing (tests/test_api.c counts allocations);
 * outputs go to caller memory.
 *
 * Errors: wrong shapes, strides (also strides whose extent overflows) or
 * element types are refused (CPC_E_USAGE) before anything is read or
 * written and leave the rank usable.  A NULL handle is never dereferenced
 * (functions returning a status give CPC_E_USAGE, the others -1, 0 or
 * nothing as documented).  A forward that fails while running (a peer
 * failed, a wait exceeded the stall limit, cpc_rank_options.timeout_s)
 * returns the error naming the rank and the op, and aborts the transport
 * so that the other ranks fail instead of hanging: a local world then stays
 * failed (make a new one); under MPI the abort is MPI_Abort on the
 * communicator, the only way MPI offers to release ranks blocked in a
 * collective, which ends the job with exit status 3.
 *
 * An error OUTSIDE libcpc (the caller's own check failed on one rank while
 * its peers are already inside a forward) leaves those peers waiting: they
 * fail at the stall limit.  To end them at once, call cpc_rank_abort on the
 * failing rank (Python: cpc.abort, or Attention.abort).
 *
 * Thread-safety: a rank is used by one thread at a time; different ranks may
 * run in different threads (that is what a local world is for).
 */
#ifndef CPC_PUBLIC_RANK_H
#define CPC_PUBLIC_RANK_H

#include "cpc/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpc/compiler.h"
#include "cpc/status.h"
#include "cpc/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpc_rank cpc_rank;
typedef struct cpc_local_world cpc_local_world;

typedef enum cpc_backend_kind {
    CPC_BACKEND_AUTO = 0,   /* CUDA for the NCCL transport, else CPU */
    CPC_BACKEND_CPU,        /* host memory; OpenBLAS; any transport but NCCL */
    CPC_BACKEND_CUDA,       /* device memory; the artifact's generated kernels:
                               every tensor passed is the caller's
                               CONTIGUOUS device memory (on the rank's
                               device), bound as it is (no host copy);
                               transports other than NCCL move the rank's
                               buffers through host memory (staged) */
} cpc_backend_kind;

/* The stall limit of a rank's waits when cpc_rank_options.timeout_s is 0
 * (seconds). */
#define CPC_RANK_DEFAULT_TIMEOUT_S 600.0

/* Rank options; fill with cpc_rank_options_init(&o, sizeof o), then change
 * fields.  Out of range values (a backend not below, device < -1,
 * timeout_s NaN, a cuda_stream on a CPU rank) make cpc_rank_new_* fail
 * with CPC_E_USAGE.  `size` as compiler.h's THE SIZE MEMBER says; first
 * version: the fields through timeout_s (CPC_RANK_OPTIONS_SIZE_V1: a caller
 * of that size gets cuda_stream NULL). */
typedef struct cpc_rank_options {
    size_t size;               /* sizeof(cpc_rank_options) of the caller */
    cpc_backend_kind backend;  /* default CPC_BACKEND_AUTO */
    int device;                /* CUDA device of this rank; -1 (default): the
                                  current device */
    double timeout_s;          /* THE STALL LIMIT: a wait of this rank's
                                  forward or backward (a send, receive or
                                  collective) that lasts longer fails the call
                                  (CPC_E_RUNTIME "stalled", naming the op and
                                  the peer) and aborts the world: a peer that
                                  failed or never came ends this rank's call
                                  within the limit instead of hanging it.
                                  0: CPC_RANK_DEFAULT_TIMEOUT_S (600 s), the
                                  default; < 0: wait forever.  Local worlds
                                  keep the last value set by any of their
                                  ranks; under MPI it is the limit of every
                                  MPI wait of the process (the last rank
                                  created sets it). */
    void *cuda_stream;         /* CUDA backend: the caller's cudaStream_t
                                  (NULL, the default: the legacy default
                                  stream).  Every forward and backward first
                                  waits until the work queued on it is done
                                  (so it reads what the caller's kernels
                                  wrote) and returns with its outputs
                                  complete on the device. */
} cpc_rank_options;

/* The smallest size a libcpc accepts: the struct's first version. */
#define CPC_RANK_OPTIONS_SIZE_V1 (offsetof(cpc_rank_options, timeout_s) + sizeof(double))

/* Fills the first `size` bytes of *o (size = sizeof *o as the caller knows
 * it) with the defaults documented per field and sets o->size = size (a
 * larger struct than this libcpc's gets its tail zeroed).  o NULL or
 * size < sizeof(size_t): nothing. */
CPC_API void cpc_rank_options_init(cpc_rank_options *o, size_t size);

/* Makes an in-process world of ring_degree x ulysses_degree thread ranks:
 * the whole world, or with cfg_degree x tp_degree > 1 one (c, t) group's
 * (see THE OUTER AXES).  The world is borrowed by its ranks; free it after
 * them.  The world belongs to `a`: ranks of another artifact (other than
 * an identical one: the same resolved plan) are refused.  Errors:
 * CPC_E_USAGE (NULL), CPC_E_NOMEM. */
CPC_API cpc_status *cpc_local_world_new(const cpc_artifact *a, cpc_local_world **out);

/* Frees a local world (every rank of it destroyed first).  NULL is ignored. */
CPC_API void cpc_local_world_free(cpc_local_world *w);

/* Rank `rank` (0 <= rank < world size) of a local world (with the outer
 * axes: the world of rank's group, joined as its group rank).  `a` and `w`
 * are borrowed and must outlive the rank.  opts may be NULL.  Errors:
 * CPC_E_USAGE (rank out of range, world of another size, backend CUDA
 * unavailable is CPC_E_UNSUPPORTED, a world made by cpc_local_world_new for
 * another artifact names both), CPC_E_INTERNAL (the world already has that
 * group rank: two groups given one world), CPC_E_NOMEM. */
CPC_API cpc_status *cpc_rank_new_local(const cpc_artifact *a, cpc_local_world *w, int rank,
                                  const cpc_rank_options *opts, cpc_rank **out);

/* This process's rank of an MPI communicator.  `mpi_comm` points to the
 * caller's MPI_Comm handle (e.g. &comm; mpi4py: MPI._addressof(comm)); its
 * size must be the world size, and this process is the rank of its
 * communicator rank (with the outer axes its group's communicator is split
 * from it: see THE OUTER AXES).  MPI must be initialised with at least
 * MPI_THREAD_SERIALIZED.  COLLECTIVE over the communicator.  Errors:
 * CPC_E_UNSUPPORTED (libcpc built without MPI), CPC_E_USAGE (size
 * mismatch: every process fails alike), CPC_E_RUNTIME (MPI errors). */
CPC_API cpc_status *cpc_rank_new_mpi(const cpc_artifact *a, const void *mpi_comm,
                                const cpc_rank_options *opts, cpc_rank **out);

/* Point-to-point functions of the caller's own communication library, which
 * then carries the rank's traffic (cpc_rank_new_callbacks): e.g.
 * torch.distributed's send/recv over a gloo process group under torchrun,
 * where no MPI world exists.  Peers are WORLD ranks (0 .. world size - 1);
 * `buf` is host memory of `bytes` bytes (never 0: empty messages are not
 * sent), valid until the matching wait returns; `tag` is in [0, 2^23):
 * messages of one (sender, receiver, tag) must be matched in the order they
 * were posted (MPI's non-overtaking rule).  isend / irecv start a transfer
 * and store a handle of the caller's choosing in *handle; wait(handle)
 * completes it (the receive's bytes are in buf then).  Each returns 0 on
 * success, any other value on failure (cpc reports it as CPC_E_RUNTIME with
 * the op, the peer and the value, and fails the rank's later calls).  The
 * functions are called from the thread that called cpc_rank_forward /
 * cpc_rank_backward, one at a time per rank.  `user` is passed back
 * unchanged. */
typedef struct cpc_p2p_callbacks {
    size_t size;   /* sizeof(cpc_p2p_callbacks) of the caller (compiler.h THE
                      SIZE MEMBER; no init function: set it and the other
                      fields, e.g. {.size = sizeof cb, ...}); first version:
                      the whole struct (CPC_P2P_CALLBACKS_SIZE_V1) */
    void *user;
    int (*isend)(void *user, int peer, const void *buf, size_t bytes, int tag, int64_t *handle);
    int (*irecv)(void *user, int peer, void *buf, size_t bytes, int tag, int64_t *handle);
    int (*wait)(void *user, int64_t handle);
} cpc_p2p_callbacks;

#define CPC_P2P_CALLBACKS_SIZE_V1 (offsetof(cpc_p2p_callbacks, wait) + sizeof(void (*)(void)))

/* World rank `rank` of the artifact whose messages (ring rotations,
 * all-to-alls, all-gathers, barriers: all built from point-to-point
 * messages, runtime/transport/transport_callback.h) go through `cb` (copied;
 * cb->user is borrowed and must outlive the rank).  Every rank of the world
 * makes its rank this way, with callbacks that reach the others.  Only
 * cfg_degree x tp_degree = 1 artifacts.  Not collective (nothing is sent at
 * creation).  Errors: CPC_E_USAGE (NULL callbacks, rank out of range),
 * CPC_E_UNSUPPORTED (outer axes), CPC_E_NOMEM. */
CPC_API cpc_status *cpc_rank_new_callbacks(const cpc_artifact *a, int rank, const cpc_p2p_callbacks *cb,
                                              const cpc_rank_options *opts, cpc_rank **out);

/* NCCL RANKS: one process per GPU, cpc's traffic (ring rotations,
 * all-to-alls, all-gathers) carried by NCCL straight between the GPUs'
 * device buffers (runtime/transport/transport_nccl.h), with no MPI: the
 * way for torchrun jobs (torch.distributed) and any launcher of one process
 * per GPU.  The rank uses the CUDA backend (opts->backend AUTO or CUDA;
 * CPU is CPC_E_USAGE): every tensor of cpc_rank_forward / _backward is the
 * caller's contiguous device memory on the rank's device, ordered on
 * opts->cuda_stream (see cpc_rank_options).  Only artifacts with
 * cfg_degree x tp_degree = 1 (else CPC_E_UNSUPPORTED).  Flat rank p has mesh
 * coordinates r = p / U, u = p % U; the ring and Ulysses groups are NCCL
 * communicators split from the world (ncclCommSplit), owned by the rank.
 * Communication is host-synchronising (the transport waits for the device
 * before each batch; correct, not overlapped with compute).  The stall
 * limit (opts->timeout_s) does not apply: NCCL's waits have none (a peer
 * that died shows as an NCCL error once its connections close; one that
 * hangs, hangs its peers: cpc_rank_abort ends this process).  An abort
 * (cpc_rank_abort, a failed forward) prints "cprun: rank P: aborting: WHY"
 * and ends this process with exit status 3 (no MPI job to abort: the peers'
 * NCCL calls fail when its connections close; torchrun then ends the job).
 * Thread-safety: one thread at a time per rank (NCCL communicators are not
 * thread-safe); cpc_rank_free is collective (ncclCommFinalize). */

/* Bytes of an NCCL unique id (NCCL's NCCL_UNIQUE_ID_BYTES). */
#define CPC_NCCL_UNIQUE_ID_BYTES 128

/* A fresh NCCL unique id (ncclGetUniqueId) into id[0 .. id_bytes), id_bytes
 * = CPC_NCCL_UNIQUE_ID_BYTES.  Call it on ONE rank (world rank 0), then give
 * the same bytes to every rank (torch.distributed.broadcast_object_list,
 * MPI_Bcast, a file): they are the whole bootstrap, as with NCCL itself (on
 * NVIDIA's NCCL it names a socket rank 0's process listens on, so make it in
 * the process that will be rank 0).  Not collective; any thread.  Errors:
 * CPC_E_USAGE (NULL, wrong size), CPC_E_RUNTIME (NCCL's own error, e.g. no
 * network interface), CPC_E_UNSUPPORTED (libcpc built without NCCL). */
CPC_API cpc_status *cpc_nccl_unique_id(void *id, size_t id_bytes);

/* World rank `rank` (0 <= rank < cpc_artifact_world_size) of an NCCL world
 * made from `id` (id_bytes = CPC_NCCL_UNIQUE_ID_BYTES bytes from
 * cpc_nccl_unique_id, the same on every rank): the device opts->device (-1,
 * the default: the current device) becomes current, ncclCommInitRank makes
 * the world communicator (owned by the rank), the groups are split from it.
 * `id` is copied.  COLLECTIVE: every rank of the world calls it with the
 * same id and artifact (NCCL's init blocks until all have come: a rank that
 * never comes leaves the others waiting).  Errors: CPC_E_USAGE (NULL, id
 * size, rank out of range, a CPU backend or a cuda_stream with another
 * backend); CPC_E_UNSUPPORTED "no CUDA device: ..." (no GPU or driver, the
 * device out of range; nothing of NCCL touched), outer axes, libcpc built
 * without CUDA or NCCL; CPC_E_RUNTIME (NCCL failures named, e.g. two ranks
 * of one world on one GPU; CUDA), CPC_E_NOMEM. */
CPC_API cpc_status *cpc_rank_new_nccl_id(const cpc_artifact *a, const void *id, size_t id_bytes,
                                         int rank, const cpc_rank_options *opts, cpc_rank **out);

/* This process's rank over the caller's NCCL communicator: `nccl_comm` an
 * ncclComm_t whose size is the artifact's world size (this process is its
 * rank in it; the device is the communicator's: opts->device must be -1 or
 * that device).  BORROWED: cpc never sends on it and never destroys it (it
 * splits its own ring and Ulysses communicators from it: COLLECTIVE over
 * nccl_comm), and it must outlive the rank.  `cuda_stream`: the
 * cudaStream_t the forward is ordered on, or NULL for opts->cuda_stream
 * (both set and different: CPC_E_USAGE).  Errors: as cpc_rank_new_nccl_id,
 * and CPC_E_USAGE for a NULL communicator or one of another size. */
CPC_API cpc_status *cpc_rank_new_nccl(const cpc_artifact *a, void *nccl_comm, void *cuda_stream,
                                 const cpc_rank_options *opts, cpc_rank **out);

/* The rank's flat index (world rank) and the world size (C*T*R*U); -1 and
 * 0 for NULL. */
CPC_API int cpc_rank_index(const cpc_rank *r);
CPC_API int cpc_rank_world_size(const cpc_rank *r);

/* Bytes this rank allocated at creation (its peak memory; nothing is
 * allocated later); 0 for NULL. */
CPC_API int64_t cpc_rank_allocated_bytes(const cpc_rank *r);

/* One attention forward.  q, k, v: this rank's shards (cpc_artifact_shard_shape
 * gives their shapes; element type the plan's dtype).  mask: U8 [B, Skv] for
 * a key-padding plan, else NULL.  out: this rank's output shard [B, T, H, D]
 * in the plan's dtype (written).  lse: NULL, or F32 [B, H, T] receiving the
 * natural-log LSE of this rank's rows (only for variants whose last merge
 * leaves the LSE in the output's layout: none, ring, ring_anything; others
 * give CPC_E_UNSUPPORTED before running).  With replicated segments
 * (`split: replicate`) q, k, v, out and lse hold the rank's own tokens: its
 * shard plus every replicated segment whole, in segment order
 * (cpc_artifact_shard_runs); every rank's out holds the whole replicated
 * rows.  Inputs may be strided (see
 * cpc_tensor); the CPU backend takes host memory, the CUDA backend
 * contiguous device memory (a strided device tensor is CPC_E_USAGE).  Collective (see above).  Errors: CPC_E_USAGE (shape, stride,
 * dtype or NULL data; nothing done), CPC_E_RUNTIME (a rank or the transport
 * failed; names the rank and op), CPC_E_UNSUPPORTED. */
CPC_API cpc_status *cpc_rank_forward(cpc_rank *r, const cpc_tensor *q, const cpc_tensor *k,
                             const cpc_tensor *v, const cpc_tensor *mask, const cpc_tensor *out,
                             const cpc_tensor *lse);

/* One attention backward (SPEC section 10) for a training plan: for the
 * loss L with dL/dout = dout, writes dq = dL/dq, dk = dL/dk, dv = dL/dv of
 * this rank's shard, exactly as the single-device backward would give them
 * (the artifact's backward program, proven; ring: K/V blocks rotate and
 * each block's dK/dV accumulator travels home in fp32).
 *   in:  q, k, v, mask: as passed to the cpc_rank_forward whose output this
 *        is; out: that forward's output shard [B, T, H, D]; lse: that
 *        forward's LSE, either as saved by cpc_rank_saved_lse right after it
 *        (F32, 1-D, cpc_rank_saved_lse_elements: any variant), or for
 *        ulysses_degree 1 as cpc_rank_forward's lse output F32 [B, H, T], or
 *        NULL: the LSE of this rank's LAST forward (only right when no other
 *        forward ran on this rank since: one rank per layer, or backward
 *        before the next forward); dout [B, T, H, D].  q, k, v, out, dout in
 *        the plan's dtype.
 *   out: dq [B, T, H, D], dk and dv [B, T, Hkv, D] (cpc_artifact_shard_shape
 *        with CPC_TENSOR_DQ/DK/DV), each either in the plan's dtype (rounded
 *        once from the fp32 accumulators) or CPC_DTYPE_FP32 (the accumulators
 *        themselves); OVERWRITTEN, not accumulated.  GQA: dk/dv of a K/V head
 *        sum its query heads.
 * Tensors may be strided (outputs must not overlap themselves) on the CPU
 * backend (host memory); the CUDA backend takes contiguous device memory.
 * Collective: every rank of the world calls it, after its forward, for the
 * same layer in the same order.  Thread-safety as the
 * forward (one thread per rank at a time).  Allocates nothing.
 * Errors: CPC_E_UNSUPPORTED when the artifact has no backward program
 * (an inference plan: compile it with input.mode: training); CPC_E_USAGE
 * for a missing, NULL, mis-shaped or mis-typed tensor (nothing is read or
 * written, the rank stays usable); CPC_E_RUNTIME as the forward. */
CPC_API cpc_status *cpc_rank_backward(cpc_rank *r, const cpc_tensor *q, const cpc_tensor *k,
                              const cpc_tensor *v, const cpc_tensor *mask, const cpc_tensor *out,
                              const cpc_tensor *lse, const cpc_tensor *dout, const cpc_tensor *dq,
                              const cpc_tensor *dk, const cpc_tensor *dv);

/* The saved state of a training forward that cpc_rank_backward needs besides
 * out: the LSE in the layout the forward computed it in (ulysses and
 * unified: the ring block's tokens x this member's heads; else [B, H, T]).
 * cpc_rank_saved_lse_elements: its size in floats (0 for an artifact that
 * does not train).  cpc_rank_saved_lse copies the LSE of this rank's last
 * cpc_rank_forward into dst (n floats: host memory, device memory for a
 * CUDA rank; call it after the forward, before the next one).  Not collective, allocates nothing.  Errors: CPC_E_USAGE
 * (NULL, n not the size), CPC_E_UNSUPPORTED (no backward program). */
CPC_API int64_t cpc_rank_saved_lse_elements(const cpc_rank *r);
CPC_API cpc_status *cpc_rank_saved_lse(cpc_rank *r, float *dst, int64_t n);

/* Ends rank r's world after an error the caller had outside libcpc, so
 * that no peer waits for this rank until the stall limit: a local world is
 * aborted (every rank's pending and later calls fail with CPC_E_RUNTIME
 * naming `why`; make a new world); an MPI or NCCL rank prints "cprun: rank
 * P: aborting: rank P: aborted by the caller: WHY" to stderr and calls
 * MPI_Abort (exit status 3 for every process of the job): it does NOT
 * return.  Not collective; any thread.  Errors: CPC_E_USAGE (r NULL). */
CPC_API cpc_status *cpc_rank_abort(cpc_rank *r, const char *why);

/* Destroys a rank (collective for MPI and NCCL ranks: frees the duplicated
 * or split communicators; a caller's NCCL communicator is left alone).  NULL
 * is ignored. */
CPC_API void cpc_rank_free(cpc_rank *r);

/* DEPRECATED NAMES (before 0.x's one lifecycle vocabulary: every object is
 * made by a *_new (or compile/load) function and freed by its *_free).  Kept
 * as macros for source compatibility only (no symbols); define
 * CPC_NO_DEPRECATED to drop them.  They will be removed. */
#ifndef CPC_NO_DEPRECATED
#define cpc_rank_create_local cpc_rank_new_local
#define cpc_rank_create_mpi cpc_rank_new_mpi
#define cpc_rank_create_callbacks cpc_rank_new_callbacks
#define cpc_rank_create_nccl cpc_rank_new_nccl
#define cpc_rank_destroy cpc_rank_free
#endif

#ifdef __cplusplus
}
#endif
#endif
