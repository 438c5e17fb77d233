/*
 * executor.h - runs one rank's op program (SPEC section 5; program.h is the
 * contract): the runtime as a library.
 *
 * Life cycle of one rank:
 *   cpc_exec_create()      allocate every buffer once, at capacity, through
 *                          the backend (plus the all-to-all staging space),
 *                          before any op runs
 *   cpc_exec_bind_input()  give the host tensors of this rank (q/k/v shard)
 *   cpc_exec_reset()       upload the bound inputs, reset content tags
 *   cpc_exec_run()         run the ops (timed), collecting per-op events
 *   cpc_exec_read_output() download this rank's `out` shard
 *   cpc_exec_destroy()
 * reset + run may be repeated (warmup and timed iterations).
 *
 * BUFFER MEMORY (the executor's convention; nothing outside the executor
 * depends on it): a Q/K/V/O/ACC buffer holding T tokens and h heads is a
 * contiguous [B, T, h, D] array of its element type (the plan's dtype, fp32
 * for ACC); an LSE buffer is a contiguous [B, h, T] fp32 array.  T is the
 * buffer's current content: SHARD -> shard_tokens(p), BLOCK -> block_tokens
 * (content tag), ALL -> the R ring blocks concatenated in ring order (batch
 * major, block i at token offset block_offset(i)), KV -> Skv.  Heads: ALL ->
 * H (Q/O/ACC/LSE) or Hkv (K/V); PART -> the rank's ulysses heads
 * (cpc_buffer_heads).
 *
 * CONTENT TAGS: every BLOCK buffer starts as block r (the rank's own ring
 * block: what the query side always holds); all_to_all sets its output to r,
 * recv to its `block` expression, copy/attn/merge carry the tag of their
 * input, swap exchanges tags with the memory.  Sizes of sends and receives
 * follow the tags, so uneven blocks (ring_anything) need no padding.
 *
 * SWAP exchanges the two buffers' memory (no copy); buffers connected by
 * swaps are allocated at the largest capacity among them.
 *
 * BACKWARD COLLECTIVES (program.h): the reducing all_to_all, reduce_scatter
 * (ring) and all_reduce (world) run on the transport's all_to_all_v and
 * all_gather_v (every transport has them, on every group) and sum in fp32
 * with the backend's optional add_strided: a backend without it refuses
 * those ops (CPC_E_UNSUPPORTED, naming the backend).  Their pack/unpack space
 * is part of the staging (both sides at once for reduce_scatter and
 * all_reduce, whatever the batch).
 *
 * ERRORS name the rank and the op: "rank 3: ops[4] all_to_all: ..." and in
 * loops "rank 1: ops[2].body[3] (s=2) recv: ..." (indices 1-based, as in
 * cpc's diagnostics and Lua's plan.ops).  When an op fails the
 * executor calls the transport's abort, so every other rank's pending and
 * later communication fails instead of hanging.
 *
 * Thread-safety: one executor per rank, used by one thread; executors of
 * different ranks share only the (read-only) program.
 */
#ifndef CPC_EXECUTOR_H
#define CPC_EXECUTOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "event.h"
#include "program.h"
#include "status.h"
#include "backend.h"
#include "transport.h"

typedef struct cpc_exec cpc_exec;

typedef struct cpc_exec_config {
    const cpc_program *prog;   /* borrowed; must outlive the executor */
    int rank;                  /* flat rank p, 0 <= p < P */
    cpc_backend *backend;      /* borrowed */
    cpc_transport *transport;  /* borrowed; may be NULL when the program has no
                                  communication op that runs on this rank */
    double scale;              /* softmax scale (plan's model.scale; <= 0: 1/sqrt(D)) */
    const uint8_t *kv_mask;    /* key padding: host [B, Skv] u8 (1 = key takes part),
                                  borrowed, or NULL (no key padding) */
    bool record_events;        /* keep one event per executed op (for traces) */
} cpc_exec_config;

/* cpc_exec_event (one executed op) is ir's event.h: the trace (io) reads it. */

typedef struct cpc_exec_stats {
    double t0_us, t1_us;       /* CLOCK_MONOTONIC, microseconds, of the whole run */
    double ms;                 /* (t1 - t0) / 1000 */
    double compute_ms;         /* sum over compute ops */
    double comm_ms;            /* sum over communication ops (waits included) */
    int64_t bytes_sent;        /* payload bytes this rank sent to other ranks */
    double attn_flops;         /* 4 * B * sq * skv * hq * D over attn ops (masked
                                  blocks counted whole) */
    int n_events;
    const cpc_exec_event *events;  /* owned by the executor; valid until the next
                                      run or destroy; NULL unless record_events */
} cpc_exec_stats;

/* Memory of one rank, computed without allocating anything. */
typedef struct cpc_exec_memory {
    int n_buffers;
    int64_t *buffer_bytes;     /* [n_buffers] allocation per program buffer */
    int64_t staging_bytes;     /* all-to-all pack/unpack space */
    int64_t total_bytes;       /* sum: the rank's peak */
} cpc_exec_memory;

/* Computes rank `rank`'s memory (capacities, swap classes merged, staging).
 * Errors: CPC_E_INTERNAL for an inconsistent program, CPC_E_NOMEM.  Free
 * with cpc_exec_memory_free. */
cpc_status *cpc_exec_memory_plan(const cpc_program *prog, int rank, cpc_exec_memory *out);
void cpc_exec_memory_free(cpc_exec_memory *m);

/* Prints rank `rank`'s buffers (name, role, tokens, heads, io, bytes) and
 * its peak memory, for cprun --dry-run.  Allocates nothing on any device. */
cpc_status *cpc_exec_print_memory(FILE *out, const cpc_program *prog, int rank);

/* Creates the executor and allocates every buffer (backend alloc).  Errors:
 * CPC_E_INTERNAL (bad program or rank), CPC_E_NOMEM, backend errors,
 * CPC_E_UNSUPPORTED when the program sums gradients (reducing all_to_all,
 * reduce_scatter, all_reduce, add) and the backend has no add_strided. */
cpc_status *cpc_exec_create(const cpc_exec_config *cfg, cpc_exec **out);

/* Binds the host tensor of role `role` (CPC_ROLE_Q, K or V; backward
 * programs also DO, O, LSE: see cpc_exec_read_grad) to every INPUT
 * buffer of that role: for SHARD-layout inputs (and BLOCK inputs with
 * U == 1) this rank's shard [B, shard_tokens(p), H or Hkv, D] in the plan's
 * dtype; for KV-layout inputs the whole [B, Skv, Hkv, D].  `host` is borrowed
 * and must stay valid while reset is called.  Errors: CPC_E_INPUT when
 * `bytes` is not the expected size (both named). */
cpc_status *cpc_exec_bind_input(cpc_exec *ex, cpc_buf_role role, const void *host, size_t bytes);

/* Device I/O: with `on`, the memory given to cpc_exec_bind_input is memory
 * of the executor's backend (a device pointer of the CUDA backend), copied
 * into the buffers at reset with the backend's copy, and the destinations of
 * cpc_exec_read_output, cpc_exec_lse_into and cpc_exec_read_grad are too
 * (cpc_exec_read_lse always downloads).  Off (the default): host memory,
 * uploaded and downloaded.  The caller's device memory must not be in use by
 * other work (the rank API synchronises with the caller's stream first). */
void cpc_exec_set_device_io(cpc_exec *ex, bool on);

/* Expected byte size of the bound tensor of `role` (0 when no INPUT buffer
 * has that role). */
size_t cpc_exec_input_bytes(const cpc_exec *ex, cpc_buf_role role);

/* Uploads the bound inputs and resets content tags (before every run).
 * Errors: CPC_E_INPUT when an INPUT role is unbound; backend errors. */
cpc_status *cpc_exec_reset(cpc_exec *ex);

/* Runs the program once.  `stats` may be NULL.  On error the transport is
 * aborted and the status names the rank and the op. */
cpc_status *cpc_exec_run(cpc_exec *ex, cpc_exec_stats *stats);

/* Size and token runs of this rank's output shard ([B, T, H, D] in the plan's
 * dtype, T = shard_tokens(p)). */
size_t cpc_exec_output_bytes(const cpc_exec *ex);

/* Downloads the OUTPUT buffer (after a run) into host (bytes must equal
 * cpc_exec_output_bytes).  Errors: CPC_E_INTERNAL when the program has no
 * OUTPUT buffer or its content is not this rank's shard. */
cpc_status *cpc_exec_read_output(cpc_exec *ex, void *host, size_t bytes);

/* The final LSE of this rank (out[1] of the last merge, else of the last
 * attn, in program order), downloaded: *lse is malloc'd [B, h_n, T] fp32
 * (caller frees), for query heads [h_off, h_off + h_n) and the global token
 * positions *runs (malloc'd, *n_runs entries, caller frees) in order.
 * Errors: CPC_E_INTERNAL when the program has no LSE. */
cpc_status *cpc_exec_read_lse(cpc_exec *ex, float **lse, int *h_off, int *h_n, cpc_run **runs,
                              int *n_runs);

/* As cpc_exec_read_lse without allocating: downloads the final LSE into
 * `dst` (`bytes` must be its exact size, [B, h_n, T] fp32) and writes its
 * token runs into runs[0..max_runs) (max_runs >= cpc_exec_max_runs).
 * Errors: CPC_E_INTERNAL (no LSE, wrong size), backend errors. */
cpc_status *cpc_exec_lse_into(cpc_exec *ex, float *dst, size_t bytes, int *h_off, int *h_n,
                              cpc_run *runs, int max_runs, int *n_runs);

/* Largest number of token runs any buffer of this rank can hold. */
int cpc_exec_max_runs(const cpc_exec *ex);

/* Total bytes allocated by this executor (its peak memory). */
int64_t cpc_exec_allocated_bytes(const cpc_exec *ex);

/* Frees the executor and every buffer it allocated through its backend (the
 * backend and transport are borrowed and stay alive).  NULL is ignored. */
void cpc_exec_destroy(cpc_exec *ex);

/* Microseconds of CLOCK_MONOTONIC (the executor's time base). */
double cpc_exec_now_us(void);

/* Backward programs (schedule_bwd.h): downloads the fp32 gradient of role
 * CPC_ROLE_DQ ([B, T, H, D]), CPC_ROLE_DK or CPC_ROLE_DV ([B, T, Hkv, D]) of
 * this rank's shard (T = shard_tokens(p); cross-attention dk/dv: the whole
 * [B, Skv, Hkv, D], the same on every rank) from the OUTPUT buffer of that role
 * into host (`bytes` must be its exact size).  Inputs of a backward program
 * are bound with cpc_exec_bind_input by role: Q, K, V (shards), DO (dout
 * shard, plan dtype, as Q), O (the forward's out shard) and LSE (the forward's
 * final LSE of the shard, [B, H, T] fp32).  Errors: CPC_E_INTERNAL (no such
 * buffer, not this rank's shard, wrong size), backend errors. */
cpc_status *cpc_exec_read_grad(cpc_exec *ex, cpc_buf_role role, float *host, size_t bytes);

#endif
