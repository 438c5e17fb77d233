/*
 * calibrate.h - `cprun --calibrate` (SPEC section 5): measures this machine
 * with the runtime's own CPU backend and transport and fills a device profile
 * (compiler/cost.h) whose figures override a preset's when a plan names the
 * file in `cluster.profile`.
 *
 * What is measured.  Single-rank figures are measured in the thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID: stable whatever else runs on the machine),
 * then turned into wall-clock figures (what cprun reports) by `wall_factor`,
 * the wall / CPU time of one rank running the big block alone (1 on an idle
 * machine, more when other processes take part of the core).  Every figure
 * is a median over repetitions (cprun reports the median iteration).
 *   - attn_tflops, attn_tflops_fp32, attn_io_gbps: backend->vt->attn on a
 *     big block (B = 1, 1024 x 1024 tokens, 8 heads, D = 128; --quick: 2
 *     heads) and a small one (128 x 128 tokens, 32 heads; --quick: 8), bf16
 *     and fp32, fitted to  time = FLOPs / rate + bytes / io  (FLOPs = 4 sq
 *     skv H D as in SPEC; bytes = Q, K, V in the dtype + O, LSE in fp32, as
 *     cost.c charges them): the CPU kernel widens and gathers every block, so
 *     a ring's many small blocks cost more per FLOP than one big block.  When
 *     noise makes a term negative, io is left 0 (the rate takes it all).
 *   - attn_softmax_gps: a third, narrow block (the big one at head_dim 16)
 *     joins the fit, time = FLOPs / rate + bytes / io + scores / softmax
 *     (scores = sq x skv x heads): the kernel's max, exp and sums cost the
 *     same per score whatever head_dim, so at head_dim 8 they are most of
 *     its time and at 128 about a fifth; a plan priced at the head_dim-128
 *     FLOP rate alone was 2-4x optimistic at head_dim 8-16 (measured on
 *     this project's machines: 1.6 ns per score + 0.054 ns per score and
 *     unit of head_dim, CPU time).  When noise makes a term non-positive,
 *     the two-block fit above is kept (softmax 0).
 *   - gemm_tflops: an OpenBLAS SGEMM of a transformer block's shape
 *     ([512 tokens x 1024] x [1024 x 1024]; --quick: 256 x 512 x 512), one
 *     thread as in a rank: the rate of the whole step's dense work
 *     (model.parameters, cost.h WHOLE STEP).  host_layer_us and host_op_us
 *     are 0: on a CPU the ranks issue their own work, there is no separate
 *     host to wait for; what each op costs beyond its work is op_overhead_us
 *     (below).
 *   - op_overhead_us: what every compute op pays whatever its size: the
 *     executor's CPU time per op running a one-rank program of the smallest
 *     shape (variant none, one token, one head: init_acc, attn, copy ...
 *     through cpc_exec_run, as cprun runs them); the minimal attn and merge
 *     calls alone (one row, one key) are logged beside it (and used if the
 *     executor's figure is missing).
 *   - mem_gbps: the memory-bound ops merge, convert (fp32 -> bf16, the final
 *     `copy acc -> out`) and copy_strided (an all-to-all head pack) on 4 MiB
 *     buffers (--quick: 1 MiB), each in the bytes the cost model charges for
 *     it (merge: in + 2 x out; copy: in + out; pack: the buffer); the harmonic
 *     mean of the three.
 *   - cores and ranks_per_core, how rank threads share this machine's cores:
 *     the big bf16 block run by rank 0 alone (the others wait in a barrier)
 *     and by all P ranks at once (P = ranks, 4 by default; threads, or
 *     processes under MPI), alternately so that both see the same load;
 *     slowdown = (median of the slowest rank's wall time) / (median of the
 *     lone rank's).  ranks_per_core = that slowdown, cores = P / slowdown:
 *     the cost model multiplies a rank's compute and communication by
 *     max(1, ranks per node / cores) (cost.h), which is the measured
 *     slowdown for a plan of P ranks.
 *   - intra_p2p_gbps and the p2p latency: ping-pong between ranks 0 and 1
 *     (the other ranks wait), 8-byte and 8 MiB (--quick: 1 MiB) messages:
 *     latency = half a round trip, bandwidth = bytes / (one way - latency).
 *   - intra_gbps and the collective latency: all-to-all (8 bytes, then 1 MiB
 *     per member pair; --quick: 128 KiB) and all-gather over the P ranks, in
 *     the cost model's conventions: all_to_all = latency + bytes sent to the
 *     others / bandwidth, all_gather = latency * (P-1) + bytes received /
 *     bandwidth; the harmonic mean of the two (the all-gather alone is left
 *     out when it does not fit its convention: the local transport gathers in
 *     one step).  intra_latency_us = the larger of the two latencies.
 *     Communication on a CPU is done by the ranks' own threads and shares the
 *     cores like compute, so these wall-clock figures are divided by the
 *     sharing of the ranks that measured them (P ranks; 2 for the ping-pong)
 *     and the cost model applies the plan's own sharing.
 *   - memory_gb: physical memory (sysconf).
 *   - inter_gbps, inter_latency_us: not measured (one machine); the `cpu`
 *     preset's figures are kept.
 *
 * Transports: local (every rank a thread of this process) unless this
 * process was started by an MPI launcher (transport auto) or `mpi` is asked:
 * then every process is one rank (world size >= 2), rank 0 measures the
 * single-rank figures while the others wait in a barrier, and only rank 0
 * returns the profile (*is_root).
 *
 * Time: about 3 s on an idle 2-core machine, more under load (--quick: well
 * under 1 s).
 *
 * Thread-safety: starts and joins its own threads; call from one thread.
 * Sets OpenBLAS to one thread (cpc_cpu_backend_single_thread_blas).
 */
#ifndef CPC_CALIBRATE_H
#define CPC_CALIBRATE_H

#include <stdbool.h>
#include <stdio.h>

#include "cost.h"
#include "status.h"

typedef struct cpc_calibrate_options {
    bool quick;             /* smaller problems and fewer repetitions (tests, CI) */
    int ranks;              /* P for the sharing and collective measurements with the
                               local transport; 0: 4.  2 <= ranks <= 64.  Under MPI the
                               world size is used instead. */
    const char *transport;  /* "auto" (default when NULL), "local" or "mpi" */
    FILE *log;              /* each measurement as it is made, or NULL (quiet) */
} cpc_calibrate_options;

/* Everything measured, with the profile built from it. */
typedef struct cpc_calibration {
    cpc_device_profile profile;  /* the result (name "cpu-calibrated") */
    char transport[8];           /* "local" or "mpi" */
    int ranks;                   /* P of the shared measurements */
    /* one rank, CPU time (ms): the big and the small block per dtype */
    double attn_cpu_ms_bf16, attn_small_cpu_ms_bf16, attn_cpu_ms_fp32, attn_small_cpu_ms_fp32;
    double attn_gflops_bf16, attn_gflops_fp32;   /* fitted, per CPU second */
    double attn_io_gbps_bf16, attn_io_gbps_fp32; /* fitted, per CPU second (0: no fit) */
    /* (added for the softmax term and the whole step; at the end of the
     * per-rank figures) */
    double attn_narrow_cpu_ms_bf16, attn_narrow_cpu_ms_fp32; /* the narrow block, CPU time */
    double attn_softmax_gps_bf16, attn_softmax_gps_fp32;     /* fitted, G scores per CPU second
                                                                (0: no fit) */
    double gemm_cpu_ms, gemm_gflops;  /* the SGEMM: CPU time (ms), GFLOP/s per CPU second */
    double exec_op_us;                /* the executor's CPU time per op (a one-token program) */
    int exec_ops;                     /*   and the ops that program runs */
    double attn_ms_bf16;         /* the big bf16 block, one rank alone, wall time */
    double wall_factor;          /* its wall time / its CPU time (>= 1) */
    double attn_shared_ms;       /* the slowest of P ranks running it at once, wall time */
    double slowdown;             /* attn_shared_ms / attn_ms_bf16 */
    double merge_gbps, convert_gbps, strided_gbps; /* per CPU second */
    double tiny_attn_us, tiny_merge_us;            /* CPU time */
    double p2p_latency_us, p2p_gbps;          /* wall, as measured (2 ranks busy) */
    double a2a_latency_us, a2a_gbps, allgather_gbps; /* wall, as measured (P ranks busy) */
    double seconds;              /* wall time of the whole calibration */
} cpc_calibration;

/* Measures this machine (see above) and fills *out.  Errors: CPC_E_USAGE (bad
 * option), CPC_E_UNSUPPORTED (mpi asked in a build without MPI, or an MPI
 * world of one process), CPC_E_RUNTIME (a transport or backend failure,
 * naming the rank), CPC_E_NOMEM.  Under MPI only world rank 0 gets the
 * result: *is_root (may be NULL) is false on the others. */
cpc_status *cpc_calibrate(const cpc_calibrate_options *opt, cpc_calibration *out, bool *is_root);

#endif
