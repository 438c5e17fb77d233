/*
 * transport_nccl.h - the NCCL transport: one process per rank (started by
 * mpirun or srun), one GPU per process, communicating with NCCL over the
 * GPUs' links (NVLink, PCIe, InfiniBand).  Bootstrapped over MPI
 * (cpc_transport_nccl_create: cprun), or from a unique id the caller
 * distributes or the caller's own ncclComm_t (cpc_transport_nccl_create_id /
 * _comm: libcpc's cpc_rank_new_nccl*, Python under torchrun); MPI is then not
 * touched.
 *
 * MESH AND GROUPS.  As the MPI transport (transport_mpi.h): world rank p =
 * r*U + u; CPC_GROUP_RING = the R ranks with the same u (member index r),
 * CPC_GROUP_ULYSSES = the U ranks with the same r (member index u),
 * CPC_GROUP_WORLD = all P ranks.  The world communicator is made with
 * ncclCommInitRank (rank 0 makes the ncclUniqueId, MPI_Bcast gives it to
 * the others); the ring and ulysses communicators with ncclCommSplit of it
 * (color u / key r, and color r / key u).
 *
 * BUFFERS.  Every buffer is normally device memory of this endpoint's GPU
 * (the CUDA backend's buffers).  Host memory (malloc, as cprun's gathering
 * of results to rank 0 uses) is accepted too and staged through device
 * bounce buffers (slow: every byte crosses PCIe; for small control and
 * result messages, and for the host-memory conformance suite).  Device
 * memory of another GPU is refused (CPC_E_USAGE).  The kind is asked of
 * cudaPointerGetAttributes on every call.  Sizes and displacements are in
 * bytes (ncclUint8 elements; NCCL counts are size_t, so no int limit).
 *
 * STREAMS AND ORDERING.  All communication runs on this endpoint's own
 * communication stream (cpc_transport_nccl_stream: a non-blocking stream of
 * the highest priority), separate from compute.  Two modes:
 *  - With a compute stream set (cpc_transport_nccl_set_compute_stream: the
 *    CUDA backend's stream), ordering is by events, the host never waits on
 *    the device for communication of device buffers:
 *      compute -> comm: before each batch of NCCL calls the comm stream
 *        waits for an event recorded on the compute stream, i.e. for every
 *        kernel queued on compute so far (the data to send is written);
 *      comm -> compute: wait(request) and the end of each collective make
 *        the compute stream wait for an event recorded on the comm stream
 *        after the NCCL calls (the received data is there, the sent buffer
 *        may be overwritten); the call returns at once.
 *    So an executor keeps queueing: pack (compute) -> isend/irecv (comm) ->
 *    attention on the current block (compute, overlapped with the transfer)
 *    -> wait (compute waits for comm) -> merge (compute).  Host memory
 *    buffers are still completed on the host (staging needs it).
 *    cpc_transport_nccl_compute_to_comm / _comm_to_compute give the same
 *    two orderings explicitly, for work the transport does not see.
 *  - Without one (the default), the transport synchronises with the host:
 *    before each batch it waits for all work queued on the device
 *    (cudaDeviceSynchronize), and wait / collectives return when the
 *    transfer is complete (polling the event, so NCCL's asynchronous
 *    errors are noticed instead of hanging).  Simple and always correct.
 *
 * POINT-TO-POINT.  NCCL has no tags and needs a send and its receive to be
 * in flight together (grouped), so isend/irecv only validate and record the
 * message; the recorded messages are issued as one batch - per group, in the
 * order ring, ulysses, world, one ncclGroupStart/ncclGroupEnd each, of
 * ncclSend/ncclRecv of ncclUint8 - by vt->flush (transport.h; the same as
 * cpc_transport_nccl_flush), or else
 * when this endpoint next waits for a request or enters a collective or
 * barrier (which issue earlier messages first).  vt->flush HOLDS a batch of
 * sends only (no receive posted) until the next flush with a receive (or a
 * wait, collective, barrier): a send whose receive the peer posts one step
 * later (the backward ring's dK/dV accumulators) then travels in the same
 * batch as that step's receives; issued alone, every rank's lone send would
 * wait for a receive queued behind it (a deadlock, found on the emulator's
 * fake NCCL: tests/cli/nccl_emu.sh trains over NCCL).  Each request then holds a
 * cudaEvent recorded on the comm stream after its batch.  OVERLAP: a
 * transfer starts only when its batch is issued, so an executor that wants
 * a ring step's K/V transfer to overlap the block's attention calls
 * cpc_transport_nccl_flush after posting the step's sends and receives and
 * before queueing the attention (without it, the transfer starts at the
 * wait, after the attention: correct, not overlapped).  Matching: within a batch, messages of one group are
 * issued sorted by (tag, posting order), so between two members the k-th
 * send with tag t meets the k-th receive with tag t, as with MPI - PROVIDED
 * both members post the matching messages in corresponding batches (each
 * side posts its sends and receives of one exchange before waiting for any
 * of them, as the executor's ring steps and the conformance suite do).
 * Sending to oneself is allowed (NCCL self send/recv; both posted before the
 * wait).  Zero-byte messages complete at once without NCCL calls.  A receive
 * must be posted with the size the sender sends: NCCL cannot detect a
 * mismatch (unlike the MPI transport); a larger receive waits forever, so
 * run with the MPI or local transport to debug a schedule.  Tags must be
 * >= 0 (any int; they only order messages).
 *
 * COLLECTIVES.  all_to_all_v: one ncclGroupStart/End of per-member
 * ncclSend/ncclRecv (zero-byte parts skipped; the own part a device-to-
 * device copy on the comm stream).  all_gather_v: ncclAllGather when every
 * count is equal and the parts are contiguous in member order (in place or
 * not), else grouped ncclSend/ncclRecv.  barrier: pending messages issued,
 * then a one-int ncclAllReduce on a device scratch word, and the host waits
 * for it (no member returns before every member has entered).
 *
 * ERRORS.  Every NCCL error becomes CPC_E_RUNTIME with ncclGetErrorString and
 * ncclGetLastError, naming the rank, the op, the group and the peer; CUDA
 * errors likewise (cudaGetErrorString, cudaGetErrorName; allocation failure
 * is CPC_E_NOMEM); bad arguments (group, peer out of range, tag < 0, NULL
 * buffer) are statuses and leave the endpoint usable.  Waits poll
 * ncclCommGetAsyncError.
 *
 * ABORT.  vt->abort calls ncclCommAbort on the communicators it owns (GPU
 * kernels blocked on a peer end), then, for an endpoint bootstrapped over
 * MPI, cpc_mpi_abort(3, why): prints "cprun: rank P: aborting: WHY" and
 * MPI_Abort ends every rank of the job within seconds (exit 3); endpoints
 * made from a unique id or a caller's communicator print the same line and
 * _Exit(3) (no MPI job to abort).  It does not return.
 *
 * INIT AND FINALIZE.  cpc_transport_nccl_create, as the MPI transport:
 * creation initialises MPI when nobody did (cpc_mpi_init), and that
 * endpoint's destroy then finalises it (the _id and _comm creators never
 * touch MPI).
 * After a FAILED creation MPI stays initialised (the caller may fall back
 * to the MPI transport, which needs MPI alive); cpc_mpi_finalize() ends it.
 * destroy is collective (ncclCommFinalize): every rank destroys its
 * endpoint; requests must all have been waited for.
 *
 * THREADS.  One endpoint per process and GPU, used from one thread at a
 * time (NCCL communicators are not to be used concurrently).
 *
 * TESTED: without a GPU on the CPU emulator with a fake NCCL
 * (tests/emu/fake_nccl.c, tests/cli/nccl_emu.sh: the conformance suite on 1,
 * 2 and 4 processes, cprun and the library); on a GPU by tests/gpu/run.sh
 * (world size 1: NCCL refuses two ranks on one GPU).
 *
 * Built only with CUDA and NCCL (and MPI for the bootstrap); this header is
 * usable everywhere, the functions exist when CPC_HAVE_NCCL and
 * CPC_HAVE_MPI are defined (CMake: CPC_NCCL_LIB found with the CUDA
 * toolkit; transport_nccl.c is excluded without CUDA, and reports
 * CPC_E_UNSUPPORTED when built without NCCL or MPI).
 */
#ifndef CPC_TRANSPORT_NCCL_H
#define CPC_TRANSPORT_NCCL_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"
#include "transport.h"

/* Creates this process's endpoint of the NCCL transport for the mesh
 * ring_degree x ulysses_degree.  Collective over MPI_COMM_WORLD: every
 * process calls it with the same degrees.  `device`: the CUDA device
 * (0-based) of this rank, or -1 for the usual placement, local rank
 * (cpc_mpi_local_rank) mod visible GPUs.
 *
 * Steps: the GPU is checked first (cudaGetDeviceCount, cudaSetDevice),
 * before MPI is touched; MPI is initialised (cpc_mpi_init) and the ranks
 * agree (MPI_Allreduce) that every one has its GPU, so all fail alike;
 * rank 0 makes the ncclUniqueId and broadcasts it; ncclCommInitRank for the
 * world; ncclCommSplit for the ring and ulysses groups; the comm stream,
 * events and scratch.  In a process not started by a launcher (and with
 * MPI not initialised) a GPU failure is reported without initialising MPI.
 *
 * On success *out is owned by the caller (out->vt->destroy).  Errors
 * (*out = NULL):
 *   CPC_E_UNSUPPORTED "no CUDA device: ..." (no driver, no GPU, the device
 *     index out of range) on the rank that lacks it; the other ranks get
 *     CPC_E_UNSUPPORTED naming that rank; also a build without NCCL/MPI,
 *     or an MPI without thread support;
 *   CPC_E_USAGE: a degree < 1, or the job's MPI world size is not
 *     ring_degree * ulysses_degree (every rank alike; the hint says how to
 *     launch);
 *   CPC_E_RUNTIME: MPI, CUDA or NCCL failures (named); CPC_E_NOMEM. */
cpc_status *cpc_transport_nccl_create(int ring_degree, int ulysses_degree, int device,
                                      cpc_transport **out);

/* Bytes of an ncclUniqueId (NCCL's NCCL_UNIQUE_ID_BYTES; cpc/rank.h has the
 * same value). */
#ifndef CPC_NCCL_UNIQUE_ID_BYTES
#define CPC_NCCL_UNIQUE_ID_BYTES 128
#endif

/* BOOTSTRAP WITHOUT MPI (torchrun, or any launcher that can pass 128 bytes
 * around).  cpc_transport_nccl_unique_id: ncclGetUniqueId into `id` (n must
 * be CPC_NCCL_UNIQUE_ID_BYTES); call it on one rank and give the bytes to
 * every rank (e.g. torch.distributed.broadcast_object_list, MPI_Bcast).
 * Not collective.  Errors: CPC_E_USAGE (size), CPC_E_RUNTIME (NCCL),
 * CPC_E_UNSUPPORTED (no NCCL in this build). */
cpc_status *cpc_transport_nccl_unique_id(unsigned char *id, size_t n);

/* This process's endpoint as rank `rank` of the world ring_degree x
 * ulysses_degree made from `id` (the same bytes on every rank): `device` (-1:
 * the current device) becomes current, ncclCommInitRank makes the world
 * communicator (owned: destroyed with the endpoint), then the ring and
 * ulysses groups are split from it as in cpc_transport_nccl_create.
 * COLLECTIVE over the world: every rank calls it with the same id and
 * degrees; a rank that never comes leaves the others in ncclCommInitRank
 * (NCCL has no timeout there; the launcher ends the job).  MPI is not used:
 * abort prints "cprun: rank P: aborting: WHY" and ends this process
 * (_Exit(3)) after ncclCommAbort; its peers fail when its connections close.
 * Errors: CPC_E_USAGE (degrees, rank out of range, id size);
 * CPC_E_UNSUPPORTED "no CUDA device: ..." (no GPU/driver, device out of
 * range) before NCCL is touched; CPC_E_RUNTIME (NCCL: a bad id, two ranks
 * on one GPU, ...; CUDA), CPC_E_NOMEM. */
cpc_status *cpc_transport_nccl_create_id(const unsigned char *id, size_t n, int rank,
                                         int ring_degree, int ulysses_degree, int device,
                                         cpc_transport **out);

/* This process's endpoint over the caller's world communicator `nccl_comm`
 * (an ncclComm_t of ring_degree x ulysses_degree ranks; world rank = its
 * rank in it, device = its device, made current): BORROWED, never used for
 * cpc's traffic and never destroyed here; the ring and ulysses groups are
 * split from it (ncclCommSplit, owned).  COLLECTIVE over the communicator.
 * Abort as above (the caller's communicator is not aborted).  Errors:
 * CPC_E_USAGE (NULL, size != ring_degree x ulysses_degree), CPC_E_RUNTIME
 * (NCCL, CUDA), CPC_E_NOMEM. */
cpc_status *cpc_transport_nccl_create_comm(void *nccl_comm, int ring_degree, int ulysses_degree,
                                           cpc_transport **out);

/* True when `t` is an endpoint made by cpc_transport_nccl_create(_id/_comm). */
bool cpc_transport_is_nccl(const cpc_transport *t);

/* The CUDA device of the endpoint, -1 for another transport. */
int cpc_transport_nccl_device(const cpc_transport *t);

/* The endpoint's communication stream (a cudaStream_t; void * so that this
 * header needs no CUDA headers), NULL for another transport.  Owned by the
 * endpoint (destroyed with it). */
void *cpc_transport_nccl_stream(const cpc_transport *t);

/* Sets the compute stream (a cudaStream_t of the endpoint's device, e.g. the
 * CUDA backend's) whose work the transport orders itself against with
 * events (see STREAMS AND ORDERING); NULL returns to the host-synchronising
 * default.  Borrowed: it must outlive the endpoint or be unset first.
 * Errors: CPC_E_USAGE for another transport, CPC_E_RUNTIME (CUDA). */
cpc_status *cpc_transport_nccl_set_compute_stream(cpc_transport *t, void *stream);

/* compute -> comm: communication issued after this call starts only after
 * every kernel queued on `stream` so far (an event recorded on `stream`, the
 * comm stream waits for it).  `stream` NULL: the compute stream set above
 * (CPC_E_USAGE when none).  Does not block the host. */
cpc_status *cpc_transport_nccl_compute_to_comm(cpc_transport *t, void *stream);

/* Issues every message posted so far (see POINT-TO-POINT: a batch of sends
 * only is held until a receive is posted or a wait), in event mode
 * without blocking the host.  Every member of a group must flush at
 * corresponding points (SPMD: after the same posts).  Errors: as the NCCL
 * calls (CPC_E_RUNTIME naming rank, op, group, peer); CPC_E_USAGE for
 * another transport; a failed batch fails its requests' waits. */
cpc_status *cpc_transport_nccl_flush(cpc_transport *t);

/* comm -> compute: work queued on `stream` after this call starts only after
 * every transfer ISSUED so far (a message only posted is not issued until
 * a wait, a collective or a barrier: wait for its request instead).
 * `stream` NULL: the compute stream set above (CPC_E_USAGE when none).
 * Does not block the host. */
cpc_status *cpc_transport_nccl_comm_to_compute(cpc_transport *t, void *stream);

#endif
