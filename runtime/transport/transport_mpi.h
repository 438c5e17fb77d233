/*
 * transport_mpi.h - the MPI transport: one process per rank, started by
 * mpirun or srun, communicating with MPI (host memory; the CPU backend).
 *
 * MESH.  The job's MPI_COMM_WORLD has world_size = ring_degree * ulysses_degree
 * processes.  World rank p is flat rank p of the mesh, with coordinates
 *   r = p / U (ring index), u = p % U (ulysses index), i.e. p = r*U + u,
 * as cpc_program_coords.  Groups (transport.h):
 *   CPC_GROUP_RING    : the R ranks with the same u, member index r
 *   CPC_GROUP_ULYSSES : the U ranks with the same r, member index u
 *   CPC_GROUP_WORLD   : all P ranks, member index p
 * Each group is its own communicator (MPI_Comm_split of a duplicate of
 * MPI_COMM_WORLD), with MPI_ERRORS_RETURN set, so an MPI error becomes a
 * cpc_status (CPC_E_RUNTIME, message from MPI_Error_string, naming the op,
 * the group and the peer) instead of killing the job.
 *
 * SIZES.  Every size and displacement is in bytes (size_t).  Counts above
 * INT_MAX bytes are supported: point-to-point messages then use one derived
 * datatype (MPI_Type_contiguous chunks of 1 GiB plus a remainder, so still ONE
 * message); collectives whose counts or displacements do not fit an int (on
 * any member: the group agrees with a small MPI_Allreduce first) fall back to
 * pairwise MPI_Isend/MPI_Irecv of such datatypes.  Otherwise all_to_all_v is
 * MPI_Alltoallv and all_gather_v is MPI_Allgatherv on MPI_BYTE.
 *
 * POINT-TO-POINT.  isend/irecv are MPI_Isend/MPI_Irecv on the group's
 * communicator with the caller's tag (0 <= tag <= MPI_TAG_UB, at least 32767).
 * Messages between the same pair with the same tag and group match in the
 * order they were posted (MPI's non-overtaking rule).  A receive must be
 * posted with the size the sender sends; wait reports CPC_E_RUNTIME when a
 * different number of bytes arrived (a larger message is MPI_ERR_TRUNCATE).
 * Sending to oneself is allowed (MPI self-messages).
 *
 * ABORT.  cpc_transport_abort (vt->abort) prints "cprun: rank P: aborting:
 * WHY" to stderr, flushes, and calls MPI_Abort(MPI_COMM_WORLD, 3): the launcher
 * then ends every rank of the job within seconds with a non-zero status (exit
 * 3, like any runtime failure, SPEC section 5).  It does not return.  Under MPI
 * a failed rank therefore never leaves its peers blocked: the executor calls
 * abort as soon as one of its ops fails.
 *
 * THREADS.  MPI is initialised with MPI_THREAD_MULTIPLE requested; creation
 * fails (CPC_E_UNSUPPORTED) if the library gives less than
 * MPI_THREAD_SERIALIZED.  With MULTIPLE (Open MPI 4.1 gives it) every method
 * may be called from any thread; with SERIALIZED, from one thread at a time.
 * The endpoint itself keeps no mutable state besides what MPI holds.
 *
 * INIT AND FINALIZE.  Whoever initialises MPI finalises it:
 *   - cpc_mpi_init() initialises MPI if it is not yet initialised (and
 *     remembers that cpc did); cpc_mpi_finalize() then calls MPI_Finalize.
 *   - cpc_transport_mpi_create() initialises MPI itself when nobody did; that
 *     transport's destroy then calls MPI_Finalize.  When MPI was already
 *     initialised (by cpc_mpi_init or by an embedding application), destroy
 *     only frees the transport's communicators.
 * MPI cannot be initialised again after MPI_Finalize (an MPI rule): a process
 * can create several MPI transports one after another only while MPI stays
 * initialised (call cpc_mpi_init first).
 *
 * Built only when CMake finds MPI (CPC_HAVE_MPI defined); otherwise this
 * header is still usable and cpc_mpi_launched() is the caller's cue, but the
 * functions are not linked.
 */
#ifndef CPC_TRANSPORT_MPI_H
#define CPC_TRANSPORT_MPI_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"
#include "transport.h"

/* True when this process was started by an MPI launcher, judged from the
 * environment only (MPI is not touched; safe before MPI_Init and without MPI
 * built in): Open MPI's mpirun (OMPI_COMM_WORLD_SIZE), a PMIx launcher
 * (PMIX_RANK), MPICH/Intel MPI hydra or srun --mpi=pmi2 (PMI_SIZE or
 * PMI_RANK), MVAPICH (MV2_COMM_WORLD_SIZE), or a Slurm job step started by
 * srun (SLURM_PROCID with SLURM_STEP_NUM_TASKS or SLURM_NTASKS, and a numeric
 * SLURM_STEP_ID: a batch script itself is not a launched rank).
 * Thread-safe (reads the environment). */
bool cpc_mpi_launched(void);

/* This process's rank among the processes of its node (to pick GPU = local
 * rank), from the environment: OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID
 * (MPICH/Intel MPI), MV2_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID.  When none is
 * set and MPI is initialised, it is this process's rank in
 * MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED) - a COLLECTIVE
 * call: then every rank must call cpc_mpi_local_rank (they all take the same
 * branch, the environment being uniform).  Returns -1 when it cannot tell
 * (no variable set and MPI not initialised, or MPI not built in).
 * Safe before MPI_Init (then only the environment is read). */
int cpc_mpi_local_rank(void);

/* Initialises MPI if needed (MPI_Init_thread with MPI_THREAD_MULTIPLE
 * requested, argc/argv not passed) and returns this process's world rank and
 * the world size (MPI_COMM_WORLD).  Either output may be NULL.  Idempotent:
 * later calls only query.  Errors: CPC_E_RUNTIME when MPI_Init_thread fails
 * or MPI was already finalised, CPC_E_UNSUPPORTED when the thread level is
 * below MPI_THREAD_SERIALIZED.  Not thread-safe: call from the main thread
 * before any transport exists. */
cpc_status *cpc_mpi_init(int *world_rank, int *world_size);

/* Calls MPI_Finalize if cpc_mpi_init initialised MPI, it is not yet
 * finalised and no cpc_mpi_hold is in force; otherwise does nothing.  Every
 * MPI transport must have been destroyed first.  Collective over
 * MPI_COMM_WORLD (as MPI_Finalize). */
void cpc_mpi_finalize(void);

/* Keeps MPI alive across several jobs of one process (cprun --tune runs one
 * job per candidate, and a job's end finalises the MPI it initialised):
 * cpc_mpi_hold(true) after cpc_mpi_init makes cpc_mpi_finalize and the
 * transports' destroy leave MPI initialised; cpc_mpi_hold(false) ends that,
 * and the caller then calls cpc_mpi_finalize.  Not thread-safe (main
 * thread, no transport alive while it changes). */
void cpc_mpi_hold(bool hold);

/* Ends the whole job: prints "cprun: rank P: aborting: WHY" to stderr
 * (P = world rank, or "?" before MPI_Init), flushes stdout and stderr, and
 * calls MPI_Abort(MPI_COMM_WORLD, exit_code); without MPI initialised it
 * exits with exit_code.  Does not return.  For failures on one rank before
 * (or without) a transport, e.g. an input file that only one rank cannot
 * read: the other ranks would otherwise wait in the next collective. */
void cpc_mpi_abort(int exit_code, const char *why) __attribute__((noreturn));

/* Creates this process's endpoint of the MPI transport for the mesh
 * ring_degree x ulysses_degree (see MESH).  Collective: every process of
 * MPI_COMM_WORLD must call it with the same degrees.  Initialises MPI when
 * not yet initialised (see INIT AND FINALIZE).
 *
 * On success *out is a transport owned by the caller (out->vt->destroy).
 * Errors (*out = NULL): CPC_E_USAGE when a degree is < 1 or when the world
 * size is not ring_degree * ulysses_degree (the message names both and the
 * hint says how to launch: mpirun -np R*U / srun -n R*U); CPC_E_RUNTIME for
 * MPI failures; CPC_E_UNSUPPORTED for a too-low thread level; CPC_E_NOMEM.
 * The world-size check is made on every rank with the same result, so every
 * rank fails alike and none is left waiting. */
cpc_status *cpc_transport_mpi_create(int ring_degree, int ulysses_degree,
                                     cpc_transport **out);

/* As cpc_transport_mpi_create(world_size, 1, out) (the world group of a job
 * whose mesh is not R x U: the outer axes' C*T*R*U ranks, placement.h), the
 * size mismatch message naming the mesh as `mesh` (e.g. "cfg_degree 2 x
 * tp_degree 2 x ring_degree 1 x ulysses_degree 2"; borrowed for the call). */
cpc_status *cpc_transport_mpi_create_world(int world_size, const char *mesh, cpc_transport **out);

/* As cpc_transport_mpi_create, over the caller's communicator instead of
 * MPI_COMM_WORLD (libcpc's cpc_rank_new_mpi): `comm` points to an
 * MPI_Comm handle (void * so that callers need no mpi.h); flat rank p is the
 * process's rank in it.  The communicator is duplicated (cpc never sends on
 * the caller's own) and is borrowed only during the call.  MPI must already
 * be initialised with at least MPI_THREAD_SERIALIZED (the caller's job;
 * destroy never finalises it).  Collective over `comm`.  Errors: CPC_E_USAGE
 * (MPI not initialised or finalised, NULL or MPI_COMM_NULL communicator, size
 * not ring_degree * ulysses_degree), CPC_E_UNSUPPORTED (thread level),
 * CPC_E_RUNTIME (MPI errors), CPC_E_NOMEM. */
cpc_status *cpc_transport_mpi_create_comm(const void *comm, int ring_degree, int ulysses_degree,
                                          cpc_transport **out);
/* The endpoint of one group of an outer-axes job (cfg_degree x tp_degree
 * > 1: cprun, placement.h; libcpc's rank API): `comm` (pointer to an
 * MPI_Comm; NULL: MPI_COMM_WORLD) split by `color` (the group, c*T + t) and
 * ordered by `key` (the rank in the group's program, r*U + u), then as
 * cpc_transport_mpi_create_comm on that communicator (ring_degree x
 * ulysses_degree must be the group's size).  MPI must be initialised (the
 * job's world endpoint, cpc_transport_mpi_create, does it first); destroy
 * never finalises it.  Collective over `comm`.  Errors: those of
 * cpc_transport_mpi_create_comm, CPC_E_RUNTIME when the split fails. */
cpc_status *cpc_transport_mpi_create_split(const void *comm, int color, int key, int ring_degree,
                                           int ulysses_degree, cpc_transport **out);

/* This process's rank in `comm` (pointer to an MPI_Comm; NULL:
 * MPI_COMM_WORLD) and its size.  Errors: CPC_E_USAGE (MPI not initialised
 * or finalised, MPI_COMM_NULL). */
cpc_status *cpc_mpi_comm_rank_size(const void *comm, int *rank, int *size);

/* TESTING ONLY.  Lowers the limits of the large-count paths so that tests can
 * exercise them with small messages: a point-to-point message or collective
 * is "large" when a count or displacement exceeds `int_limit` bytes (default
 * INT_MAX), and large messages are built from chunks of `chunk_bytes`
 * (default 1 GiB).  0 restores a default.  Every rank must set the same
 * values, before the communication they are meant to affect.  Not
 * thread-safe. */
void cpc_transport_mpi_set_limits(size_t int_limit, size_t chunk_bytes);

/* The stall limit of this process's MPI waits (every wait, send, receive,
 * all-to-all, all-gather and barrier of every MPI endpoint): a wait that has
 * not completed after `seconds` returns CPC_E_RUNTIME "rank P: stalled:
 * waited S s in OP (...)" (OP names the peer or group, bytes and tag), and
 * the caller aborts the job (transport abort: MPI_Abort, exit 3), so a
 * stopped or hung rank ends the whole job in bounded time.  The wait polls
 * MPI_Test (tightly for 10 ms, then sleeping up to 1 ms between polls).
 * 0 (the default): no limit, MPI_Wait.  cprun sets --timeout, or its
 * default (run.h).  Not thread-safe against concurrent waits (set it
 * before the endpoint is used).
 * The MPI calls that cannot poll run under a watchdog thread with the same
 * limit, but at least 10 s (issue 23): MPI_Init_thread and the
 * communicators' setup (cpc_mpi_init, the endpoint constructors), the
 * node split of cpc_mpi_local_rank, and MPI_Finalize (endpoint destroy,
 * cpc_mpi_finalize; ranks other than 0 allow 10 x the limit more there, at
 * least 60 s, for rank 0's check of the result).  Past it the process prints "cpc: error: rank N:
 * stalled: WHAT did not complete within S s ..." and exits with status 3
 * (_exit: the call cannot be unwound), and the launcher ends the job.  Set
 * the limit before MPI is initialised for init to be covered. */
void cpc_transport_mpi_set_timeout(double seconds);
double cpc_transport_mpi_timeout(void);

#endif
