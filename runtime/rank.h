/*
 * rank.h - the ONE rank runtime: everything one rank of a compiled program
 * needs to run, shared by cprun's job layer (session/run.c drives N of them:
 * threads or MPI processes) and the public rank API (api/api_rank.c, a thin
 * facade over one of them; Python's cpc.Attention sits on that).
 *
 * A rank owns, from creation to destruction:
 *   - its BACKEND, made through the backend registry below (CPU or CUDA);
 *   - its TRANSPORT endpoint, made by the caller through the transport
 *     registry below (or any cpc_transport), then wrapped as the pair needs
 *     (cpc_rt_wrap: device memory over a host transport goes through the
 *     staged wrapper, ranks that are threads of one process sharing GPUs
 *     copy device to device through the device wrapper, NCCL takes device
 *     buffers itself);
 *   - its FORWARD executor and, for a training program, its BACKWARD
 *     executor on the same backend, transport and key padding mask;
 *   - the stall limit of its transport's waits (set by the transport's
 *     creator: cpc_local_world_set_timeout, cpc_transport_mpi_set_timeout).
 * Input staging (the caller's strided or device tensors into the executor's
 * inputs) is done by the facades; the rank binds what it is given: host
 * memory (cpc_exec_bind_input) or memory of its backend (device tensors of
 * the CUDA backend: bound with cpc_rt_rank_bind_device, copied device to
 * device at reset).
 *
 * REGISTRIES.  Backends and transports are tables of {kind, name,
 * available(), create()} (as ggml's backend registry and IREE's driver
 * registry): what this build has is the table's content, decided once in
 * rank.c; callers look entries up by kind or by name, never by #if.
 *
 * Thread-safety: one rank per thread; the registries are read-only.
 */
#ifndef CPC_RANK_RUNTIME_H
#define CPC_RANK_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "executor.h"
#include "kernel.h"
#include "status.h"
#include "transport.h"
#include "transport_local.h"

/* ---- backend registry ------------------------------------------------------ */

typedef enum cpc_rt_backend_kind {
    CPC_RT_BACKEND_CPU = 0,
    CPC_RT_BACKEND_CUDA,
    CPC_RT_BACKEND__COUNT
} cpc_rt_backend_kind;

/* What a backend is made from (fields a backend does not use are ignored). */
typedef struct cpc_rt_backend_params {
    int device;                     /* CUDA: the GPU (0-based; -1: the calling
                                       thread's current device) */
    const cpc_kernel_spec *spec;    /* CUDA: the plan's kernel specialisation */
    const cpc_kernel *kernels;      /* CUDA: compiled modules (PTX), borrowed */
    int n_kernels;
    const char *attention;          /* CUDA: the attention path, "auto" (or NULL),
                                       "cudnn" or "nvrtc" (backend_cuda.h) */
} cpc_rt_backend_params;

/* What served a backend's attention blocks since it was made (the report's
 * "attention" field): zeros and "" for a backend with one path. */
typedef struct cpc_rt_attention_report {
    double cudnn_blocks, nvrtc_blocks, fallback_blocks;
    char reason[256];               /* the first fallback reason, "" when none */
} cpc_rt_attention_report;

typedef struct cpc_rt_backend_entry {
    cpc_rt_backend_kind kind;
    const char *name;               /* "cpu", "cuda" */
    bool device_memory;             /* its tensors are device memory (a host
                                       transport needs the staged wrapper) */
    /* NULL when usable here (*n_devices: visible devices, 0 for the CPU);
     * else CPC_E_UNSUPPORTED naming why (no driver, no device). */
    cpc_status *(*available)(int *n_devices);
    cpc_status *(*create)(const cpc_rt_backend_params *p, cpc_backend **out);
    /* Device backends: blocks until the work queued so far on the caller's
     * stream `stream` (a cudaStream_t; NULL: the legacy default stream) is
     * done, so that a run reads what the caller's kernels wrote.  NULL for
     * host backends. */
    cpc_status *(*wait_stream)(void *stream);
    /* Device backends: the kernels' compile target of device `device`
     * ("sm_90"), written to arch[0..n); false (arch unchanged) when it cannot
     * be read.  NULL for host backends. */
    bool (*device_arch)(int device, char *arch, size_t n);
    /* Fills *out for a backend made by create (NULL: nothing to report). */
    void (*attention_report)(cpc_backend *be, cpc_rt_attention_report *out);
} cpc_rt_backend_entry;

/* The entry of `kind`, or NULL when this build lacks it (or kind is out of
 * range). */
const cpc_rt_backend_entry *cpc_rt_backend_get(cpc_rt_backend_kind kind);

/* The entry named `name`, or NULL (unknown or not built). */
const cpc_rt_backend_entry *cpc_rt_backend_find(const char *name);

/* ---- transport registry ---------------------------------------------------- */

typedef enum cpc_rt_transport_kind {
    CPC_RT_TRANSPORT_LOCAL = 0,     /* threads of one process (transport_local.h) */
    CPC_RT_TRANSPORT_MPI,           /* one process per rank (transport_mpi.h) */
    CPC_RT_TRANSPORT_NCCL,          /* one GPU process per rank (transport_nccl.h) */
    CPC_RT_TRANSPORT__COUNT
} cpc_rt_transport_kind;

/* What an endpoint is made from (fields a transport does not use are ignored). */
typedef struct cpc_rt_transport_params {
    int ring_degree, ulysses_degree;  /* the program's R x U mesh */
    /* local: the world and this rank's index in it */
    cpc_local_world *world;
    int rank;
    /* MPI: the communicator (a pointer to an MPI_Comm; NULL: MPI_COMM_WORLD).
     * split: the communicator is the whole job (C*T groups of R*U ranks) and
     * this rank's group `group` is split from it, ordered by `rank` (its
     * group rank); else its size must be R*U. */
    const void *comm;
    bool split;
    int group;
    /* MPI: the job's world of world_size processes as ONE group (P x 1: the
     * result collection with cfg_degree x tp_degree > 1); `mesh` names the
     * job's axes in the size-mismatch error.  ring/ulysses degrees ignored. */
    bool job_world;
    int world_size;
    const char *mesh;
    /* NCCL: the CUDA device, -1 for local rank mod visible GPUs */
    int device;
} cpc_rt_transport_params;

typedef struct cpc_rt_transport_entry {
    cpc_rt_transport_kind kind;
    const char *name;               /* "local", "mpi", "nccl" */
    bool device_memory;             /* takes device buffers itself (never staged) */
    bool (*available)(void);        /* built in and launched as it needs */
    cpc_status *(*create)(const cpc_rt_transport_params *p, cpc_transport **out);
    /* The stall limit of every wait of this transport's endpoints made by
     * this process from now on (seconds; 0: none).  NULL: set per world
     * (local: cpc_local_world_set_timeout). */
    void (*set_stall_limit)(double seconds);
    /* This process's rank in the caller's communicator `comm` and its size
     * (MPI); NULL for a transport without one. */
    cpc_status *(*comm_rank_size)(const void *comm, int *rank, int *size);
    /* The CUDA device of a device transport's endpoint (NCCL); NULL for host
     * transports. */
    int (*device_of)(const cpc_transport *t);
    /* This process's rank among the processes of its node (GPU placement;
     * may be collective: every process calls it), -1 when unknown; NULL for
     * in-process transports. */
    int (*local_rank)(void);
    /* Ends the whole job at once with `exit_code` after printing `why`
     * (MPI_Abort); does not return.  NULL for in-process transports (their
     * worlds are aborted through an endpoint). */
    void (*abort_job)(int exit_code, const char *why);
    /* Releases what creating an endpoint left initialised for the process
     * (NCCL's MPI bootstrap: MPI_Finalize when cpc initialised MPI); NULL:
     * nothing. */
    void (*finalize)(void);
} cpc_rt_transport_entry;

const cpc_rt_transport_entry *cpc_rt_transport_get(cpc_rt_transport_kind kind);
const cpc_rt_transport_entry *cpc_rt_transport_find(const char *name);

/* How a rank's endpoint carries its backend's buffers. */
typedef enum cpc_rt_wrap {
    CPC_RT_WRAP_AUTO = 0,   /* staged when the backend's memory is device memory
                               and the transport takes host memory; else none */
    CPC_RT_WRAP_NONE,
    CPC_RT_WRAP_STAGED,     /* through host memory (transport_staged.h) */
    CPC_RT_WRAP_DEVICE,     /* device to device between threads of one process
                               (transport_device.h; the world's copy function
                               must be cpc_device_copy over the ranks' backends) */
} cpc_rt_wrap;

/* ---- the rank ---------------------------------------------------------------- */

typedef struct cpc_rt_rank_config {
    const cpc_program *prog;        /* the forward program (borrowed) */
    const cpc_program *bwd;         /* its backward program, or NULL (borrowed) */
    int rank;                       /* this rank in the programs' R x U world */
    double scale;                   /* softmax scale */
    const uint8_t *kv_mask;         /* key padding: host [B, Skv] u8 of this rank's
                                       batch items (borrowed; read at every run), or NULL */
    bool record_events;             /* forward executor: per-op events (traces) */
    cpc_rt_backend_kind backend;
    cpc_rt_backend_params backend_params;
    cpc_transport *transport;       /* TAKEN: owned by the rank from the call on
                                       (destroyed with it, also on failure) */
    cpc_rt_wrap wrap;
    cpc_backend **publish;          /* CPC_RT_WRAP_DEVICE: where the world's copy
                                       function finds this rank's backend (set
                                       after creation, cleared at destroy), or NULL */
    const char *abort_prefix;       /* non-NULL: a failed creation aborts the
                                       endpoint before destroying it, with
                                       cpc_status_format(error, abort_prefix) (so
                                       that the peers fail: cprun); NULL: it is
                                       only destroyed (the library: a failed
                                       create is an error value, peers fail at
                                       the stall limit) */
} cpc_rt_rank_config;

typedef struct cpc_rt_rank {
    int rank;
    cpc_backend *be;
    cpc_transport *t;               /* the rank's endpoint as wrapped */
    const cpc_rt_backend_entry *backend;
    cpc_exec *ex;                   /* forward */
    cpc_exec *bex;                  /* backward, or NULL */
    cpc_backend **publish;
} cpc_rt_rank;

/* Creates the backend, wraps the endpoint, creates the executors (every
 * buffer allocated now).  Errors: CPC_E_UNSUPPORTED (a backend this build or
 * machine lacks, named), the backend's and executor's errors (prefixed
 * "rank P"); on failure everything made is freed, the transport too. */
cpc_status *cpc_rt_rank_create(const cpc_rt_rank_config *cfg, cpc_rt_rank **out);

/* Binds memory of the rank's backend (a device pointer of the CUDA backend)
 * as the input of `role` of executor `ex` (r->ex or r->bex): copied device
 * to device at every reset.  On the CPU backend this is cpc_exec_bind_input.
 * Errors: those of cpc_exec_bind_input. */
cpc_status *cpc_rt_rank_bind_device(cpc_rt_rank *r, cpc_exec *ex, cpc_buf_role role, const void *dev,
                                    size_t bytes);

/* One run of `ex` (r->ex or r->bex): reset (uploads the bound inputs), a
 * barrier of the world group when `barrier`, the run, and on a device
 * backend a sync, the time in stats->ms then being the wall time until the
 * device is done.  stats may be NULL.  Errors: the executor's (the
 * transport is then aborted: the peers fail too), "rank P: device sync". */
cpc_status *cpc_rt_rank_run(cpc_rt_rank *r, cpc_exec *ex, bool barrier, cpc_exec_stats *stats);

/* Ends the rank's world (cpc_transport_abort: MPI does not return). */
void cpc_rt_rank_abort(cpc_rt_rank *r, const char *why);

/* Destroys the executors, the endpoint (with its wrappers and what they
 * own) and the backend.  NULL is ignored. */
void cpc_rt_rank_destroy(cpc_rt_rank *r);

#endif
