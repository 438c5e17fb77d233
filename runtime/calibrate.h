/*
 * calibrate.h - `cprun --calibrate` (SPEC section 5): measures this machine
 * with the runtime's own CPU backend and transport and fills a device profile
 * (compiler/cost.h) whose figures override a preset's when a plan names the
 * file in `cluster.profile`.
 *
 * What is measured (wall clock, CLOCK_MONOTONIC, as the executor times an
 * iteration; each figure is the median of several repetitions, because cprun
 * reports the median iteration):
 *   - attn_tflops / attn_tflops_fp32: one rank alone, backend->vt->attn on a
 *     block of B = 1, 1024 x 1024 tokens, 4 heads, D = 128, bf16 and fp32
 *     (--quick: 512 x 512, 2 heads); FLOPs = 4 * sq * skv * H * D (SPEC).
 *   - op_overhead_us: the time of a minimal attn and a minimal merge call
 *     (one row, one key): what every compute op pays whatever its size.
 *   - mem_gbps: the memory-bound ops merge, convert (fp32 -> bf16, the final
 *     `copy acc -> out`) and copy_strided (an all-to-all head pack) on
 *     buffers of a few MiB, each in the bytes the cost model counts for it
 *     (merge: in + 2 x out; copy: in + out); the harmonic mean of the three.
 *   - cores and ranks_per_core: how rank threads share this machine's cores:
 *     the same bf16 attention block run by P ranks at once (P = ranks, 4 by
 *     default; each rank on its own thread, or its own process under MPI),
 *     slowdown = (median over repetitions of the slowest rank's time) /
 *     (one rank's time alone).  ranks_per_core = that slowdown (what a plan of
 *     P ranks pays), cores = P / slowdown (the effective number of cores the
 *     ranks share; the cost model scales compute by max(1, ranks per node /
 *     cores), so a plan of another world size is priced too).
 *   - intra_p2p_gbps, intra_latency_us: ping-pong between ranks 0 and 1 of the
 *     transport (the other ranks wait), 8 bytes (latency = half a round trip)
 *     and 8 MiB (--quick: 1 MiB) messages: bandwidth = bytes / (one-way time
 *     - latency).  intra_latency_us is the larger of this latency and that of
 *     an 8-byte all-to-all (the cost model charges it per message and per
 *     collective step).
 *   - intra_gbps: all-to-all and all-gather over the P ranks, 1 MiB per
 *     member pair (--quick: 128 KiB), in the cost model's convention:
 *     all_to_all = latency + bytes sent to the others / bandwidth,
 *     all_gather = latency * (P-1) + bytes received / bandwidth; the mean of
 *     the two bandwidths.  The local transport moves bytes with the ranks' own
 *     threads, so on a machine where P ranks share fewer cores these figures
 *     already include the sharing; they are divided by the sharing factor of
 *     the P measuring ranks (the cost model multiplies communication on a
 *     CPU device whose profile has `cores` by the same factor for the plan's
 *     ranks, see cost.h).
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
 * Time: about 5-15 s on a 2-core machine (--quick: about 1-2 s).
 *
 * Thread-safety: starts and joins its own threads; call from one thread.
 * Sets OpenBLAS to one thread (cpc_cpu_backend_single_thread_blas).
 */
#ifndef CPC_CALIBRATE_H
#define CPC_CALIBRATE_H

#include <stdbool.h>
#include <stdio.h>

#include "../compiler/cost.h"
#include "../compiler/status.h"

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
    double attn_ms_bf16, attn_ms_fp32;  /* one rank, the calibration block */
    double attn_gflops_bf16, attn_gflops_fp32;
    double attn_shared_ms;       /* the slowest of P ranks running the bf16 block at once */
    double slowdown;             /* attn_shared_ms / attn_ms_bf16 (>= 0) */
    double merge_gbps, convert_gbps, strided_gbps;
    double tiny_attn_us, tiny_merge_us;
    double p2p_latency_us, p2p_gbps;          /* as measured (2 ranks busy) */
    double a2a_latency_us, a2a_gbps, allgather_gbps; /* as measured (P ranks busy) */
    double seconds;              /* wall time of the whole calibration */
} cpc_calibration;

/* Measures this machine (see above) and fills *out.  Errors: CPC_E_USAGE (bad
 * option), CPC_E_UNSUPPORTED (mpi asked in a build without MPI, or an MPI
 * world of one process), CPC_E_RUNTIME (a transport or backend failure,
 * naming the rank), CPC_E_NOMEM.  Under MPI only world rank 0 gets the
 * result: *is_root (may be NULL) is false on the others. */
cpc_status *cpc_calibrate(const cpc_calibrate_options *opt, cpc_calibration *out, bool *is_root);

#endif
