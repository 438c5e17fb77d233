/*
 * cost.h - the dry-run cost model: memory, bytes and time per rank for an op
 * program (SPEC section 3 `--check`/`--explain` and the JSON `predicted`
 * fields; CP040).
 *
 * The model prices the op program itself, so what the scheduler, a Lua script
 * or the runtime does is what is priced:
 *   - attn: FLOPs = 4 * B * (query rows x visible keys) * heads * D (the
 *     causal mask counts only visible pairs, from the global positions of the
 *     runs), at the device's attention rate (fp32: its fp32 rate), plus, when
 *     the profile has attn_io_gbps (calibrated CPUs), the block's Q, K, V
 *     (plan dtype) and O, LSE (fp32) bytes at that rate, and, when it has
 *     attn_softmax_gps (calibrated CPUs), B x visible pairs x heads score
 *     elements at that rate (the softmax's cost does not scale with D: at
 *     head_dim 8 it is most of the kernel's time, at 128 about a fifth);
 *   - init_acc, merge, copy, pack: bytes touched / memory bandwidth;
 *   - send/recv: latency + bytes / link bandwidth, on a communication stream
 *     that runs beside the compute stream; `wait` joins them, so ring
 *     transfers overlap the attention of the same step (schedule.overlap);
 *   - all_to_all: latency + bytes sent to the other members / bus bandwidth
 *     (all peers are served at once), on GPU profiles each peer's part of m
 *     bytes priced as m + one NCCL chunk (512 KiB over NVLink, 128 KiB over
 *     PCIe and networks: NCCL's P2P chunk defaults; the pipeline's first chunk
 *     is not hidden), so small parts (high Ulysses degrees, short sequences)
 *     reach less of the bus bandwidth; all_gather: latency * (W-1) (ring
 *     algorithm steps) + bytes received / bus bandwidth (nccl-tests'
 *     bus-bandwidth convention: busBW = algBW * (n-1)/n for both);
 *   - every compute op also pays a fixed op_overhead_us (kernel launch and
 *     dispatch), which is what makes many small ring steps cost more than
 *     one big attention call;
 *   - a group whose members sit on more than one node (rank r on node
 *     r / gpus_per_node) uses the inter-node bandwidth and latency.
 * Each rank is priced alone (its own timeline) and the prediction is the
 * maximum over ranks; ms_per_forward = ms_per_layer * model.layers.
 * Large meshes: every rank is priced up to 64 ranks, beyond that a sample
 * (both ends of ring group 0 and ulysses group 0, and the last rank: the
 * uneven splits put the largest shards first and the smallest last); a loop
 * of more than 512 steps is priced exactly on its first and last 256 steps
 * and the steps between are extrapolated from the first 256 (their average
 * time, bytes and FLOPs), so pricing stays O(1) in the ring degree.
 * Memory per rank = the sum of the program's buffer capacities on that rank
 * + the all-to-all staging space the executor allocates (the largest
 * pack/unpack side; both sides when B > 1) + the attention workspace +
 * cluster.reserved_gb.  The first two are what cprun measures and reports
 * as peak_memory_bytes_per_rank (runtime/executor.h: the executor's
 * allocations; buffer_bytes_per_rank below is the buffers alone), so
 *   memory_bytes_per_rank = cprun's peak_memory_bytes_per_rank
 *                         + workspace + reserved_gb,
 * workspace = a GPU flash-attention kernel's per-rank scratch, fixed:
 * 128 x 128 fp32 scores x 2 + 4 x 128 x head_dim fp32 = 131072 + 2048 * D
 * bytes (147456 for D = 8, 393216 for D = 128).  cprun's CPU backend does
 * not allocate it (nor reserved_gb, memory the rest of the model holds), so
 * its figure is lower by exactly that much.  With model.parameters on a GPU
 * preset the deployment's weights, activations and VAE decode are added too
 * (MEMORY below; buffer_bytes_per_rank stays the program's own).
 *
 * WHOLE STEP (model.parameters).  Per rank of a (C, T, R, U) split, M = tokens
 * per rank = B/C x S/(R*U), h = model.hidden (default heads x head_dim), layers =
 * model.layers.  On a GPU preset (arch > 0) every term below is physical, the
 * same for every model and table; on the CPU (arch 0: cpc's own runtime) the
 * dense work is 2 x W x M / T at gemm_tflops x the GEMM ROOFLINE factor.
 *   gemm   = per block, each GEMM at its shape: QKV (M x 3h/T x h), output
 *            projection (M x h x h/T), MLP up (M x g r h/T x h, g = 2 when
 *            model.mlp_gated) and down (M x h x r h/T), r = model.mlp_ratio
 *            (4); with model.cross_attention_tokens Lt also cross Q and O and the
 *            text's K, V (B Lt rows); MoE: each of model.experts sees M x
 *            active_experts / experts rows.  Without structure keys the block's
 *            GEMMs are scaled to min(parameters / layers, 12 h^2) weights per
 *            token (cpc_weights_per_token).  Each GEMM takes max(2MNK / (
 *            gemm_tflops x GEMM EFFICIENCY), element bytes x (MK + KN + MN) /
 *            mem_gbps) (the roofline: Williams, Waterman, Patterson, CACM 2009).
 *   GEMM EFFICIENCY = the best of a few tile shapes of its wave quantisation
 *            (tiles / (waves x SMs), the tile's own rate) x K / (K + 64) (each
 *            tile's prologue/epilogue ~64 steps of K): narrow TP slices and
 *            few tokens per rank run below the large-GEMM rate.
 *   attn   = the op program's attn ops (LINEAR ATTENTION with model.attention:
 *            linear; else their FLOPs at attn_tflops, set for
 *            runtime.attention_kernel and head_dim: ATTENTION KERNELS, times
 *            keys / (keys + 256) for a block of `keys` keys: short ring steps
 *            run below the long-sequence rate) + cross-attention scores.
 *   memory-bound = element passes over the hidden state per token per block at
 *            mem_gbps, by framework (MEMORY-BOUND WORK), plus the MLP
 *            activation ((g + 1) r h per token), plus the program's merges,
 *            copies and all-to-all packs.
 *   comm   = the program's communication not hidden by its compute, plus TP's
 *            two ring all-reduces per block of M x h (2 (T-1) latencies +
 *            bytes x 2 (T-1)/T at intra_gbps, and a launch each).
 *   device = gemm + attn + memory-bound + comm (x core sharing on the CPU).
 *   host   = layers x host_layer_us x (1 + 0.1 x dual-stream share) + layers x
 *            (program ops + TP calls) x host_op_us (HOST), x 2 for sequential
 *            CFG calls (runtime.cfg).
 *   ms_per_step = (device^4 + host^4)^(1/4) on GPUs: kernels are issued
 *            asynchronously, so the slower side sets the pace, and where the two
 *            are close the device also waits on the host's slower stretches
 *            (equal times cost 1.19x); max(device, host) on the CPU.  The part
 *            above the device time is the exposed host time.
 *   ms_per_image = steps x ms_per_step + PIPELINE.
 * CFG groups (C) never talk during a step: each prices its own batch slice.
 *
 * ATTENTION KERNELS (cpc_attn_kernel_factor): a GPU preset's attn_tflops is the
 *   FlashAttention-2-class forward rate at head_dim 128 (runtime.attention_kernel
 *   sdpa, the default, and fa2); fa3 x 1.8 on Hopper (FlashAttention-3 paper:
 *   ~600-660 vs FA2's ~330-370 TFLOP/s at head_dim 128); cudnn x 1.6 on Hopper,
 *   x 2.5 on Blackwell, x 1 elsewhere; sage x 2 on Ada (SageAttention paper: ~2.1x
 *   FlashAttention-2 on RTX 4090), x 1.6 elsewhere; head_dim <= 64 x 0.8,
 *   <= 32 x 0.6 (FlashAttention-2 paper: head_dim 64 runs at ~0.8-0.85 of 128).
 *   No kernel runs above its ceiling (cpc_attn_ceiling): per score and head
 *   the two matmuls at the dense peak (4 x head_dim FLOPs) and one exponential
 *   on the special-function units, 16 a
 *   clock per SM (CUDA C++ Programming Guide, throughput of exp2f), one after
 *   the other: 4 D / (4 D / peak + 1 / (SMs x 16 x clock)).  On H100 at D 128
 *   that is 676 TFLOP/s (0.68 x peak), at D 256 803 and at D 64 514: the
 *   FlashAttention-3 paper (Shah et al. 2024) measures ~650, ~750 and ~500,
 *   and names the exponential as the limit (989 TFLOP/s of matmul against
 *   3.9 T exponentials/s).  Parts whose tensor rate is low beside their SFUs
 *   (Ada: L20 0.94 x peak, RTX 4090 0.94; the power-capped H20 0.90) allow
 *   nearly their peak; A100 0.80.  It binds where a kernel factor would pass
 *   it: fa3 (x 1.8) on the H20 (0.6 x peak for FA2-class kernels) stops at
 *   0.90 x peak.  None for sage (INT8 Q K^T, and a P V whose accumulator
 *   and type differ from the FP16/FP32-accumulate peak the ceiling is built
 *   on) nor on Blackwell (arch >= 100: FlashAttention-4 and cuDNN compute
 *   part of the exponentials on the FMA units, a polynomial, past the SFU
 *   limit).
 *
 * ATTENTION GRID: not modelled.  Wave quantisation of the kernel's grid (B x
 *   heads x ceil(queries / 128) tiles over the SMs) was tried in issue 20's
 *   fourth pass and left out: as a hard wave model it moves the Hopper
 *   Ulysses-8 rows only 3-8% and puts the FLUX rows on L20 (216 tiles on 92
 *   SMs) 12% slower than published (bench/published.sh within 25%: 91% ->
 *   88%); the rate figures above are measured on real shapes and already
 *   carry the average tail loss.
 *
 * LINEAR ATTENTION (model.attention: linear; Sana's ReLU linear attention,
 *   diffusers SanaLinearAttnProcessor2_0): each attention op of the program
 *   costs, per head, K^T V over its keys and Q (K^T V) over its queries, 2 x
 *   (queries + keys) x D^2 FLOPs at the FP32 rate (the processor casts q, k, v
 *   to float32), or its element passes (ReLU, casts, V padded with ones for
 *   the normaliser, the division: ~4 float32 reads or writes of each element
 *   of Q, K, V and O) at mem_gbps, whichever is slower.  The program's
 *   communication is priced as written.
 *
 * MEMORY-BOUND WORK: element passes (reads + writes of hidden-sized rows) per
 *   token per block, counted from an eager DiT block (diffusers, xdit): two
 *   norms with modulation (2 x 6), q/k RMSNorm (2 x 6), RoPE on q and k (2 x 6),
 *   head-layout copies (6), two gated residual adds (2 x 4): 20 that TP does not
 *   split (norms, modulation, residuals) and 30 that it does; sglang (fused
 *   norm/RoPE kernels) 14 + 8; compiled (torch.compile fuses the elementwise
 *   chains) 10 + 4.
 *
 * HOST: per transformer block of eager PyTorch (runtime.framework eager, the
 *   default): ~100 kernels, each a Python call through PyTorch's dispatcher
 *   (~16 us): 1637 us, x 1.1 for a dual-stream block; per op of the attention
 *   program (a
 *   collective with its reshapes and wait, an attention call with its LSE, an
 *   LSE-merge update) 110 us; TP adds 2 all-reduce calls and ~6
 *   tensor-parallel dispatches per block.  With runtime.cfg: sequential (the
 *   default) an even batch per CFG group is the two guidance passes run as two
 *   transformer calls (diffusers' and vLLM-Omni's QwenImage pipelines, the Wan
 *   pipelines): the host time doubles, the device work does not change;
 *   runtime.cfg: batched (CogVideoX, Mochi: torch.cat([latents] * 2)) is one
 *   call.  These are pinned by the host-bound
 *   FLUX.1-dev rows on 4 x H100, where the GPUs finish a step in ~50 ms and
 *   wait for the host: the seeds' diffusers table (ulysses 133, all-gather ring
 *   262 ms per step: diffusers 952 us per block, 225 us per op), xDiT's flux.md
 *   (ulysses 150, p2p ring 180 ms: xdit 2253 us per block, 50 us per op: its
 *   blocks run through more Python wrappers, its ring steps through fewer
 *   calls) and cache-dit's H100 table; eager sits between them.  sglang 581 /
 *   120 us, compiled (CUDA graphs) 46 / 10 us.  The dual-stream factor: cache-dit's
 *   H100 table (docs/benchmark/NVIDIA_GPU.md, commit 18152db6) has FLUX.1-dev (19
 *   of 57 blocks dual-stream, 121 ms per step) and Qwen-Image (60 of 60, two CFG
 *   calls: 256 ms per step) both host-bound at Ulysses 2, which puts a
 *   dual-stream block within ~10% of a single-stream one (more kernels per
 *   block, but fewer Python wrappers per kernel); the per-block figures above
 *   keep FLUX.1-dev's pinned totals (57 + 0.1 x 19 blocks).  The same figures hold for every
 *   GPU (the host is not the GPU).  Without model.dual_stream_layers (and
 *   structure keys) the dual-stream share is estimated from the weights per
 *   block (cpc_dual_stream_layers).
 *
 * PIPELINE (with input.steps, on GPUs; inside ms_per_image, once per image or
 *   video): the text encoder (runtime.text_encoder_parameters, default T5-XXL's
 *   encoder 4.76e9): 2 x weights FLOPs per prompt token (the batch's prompts,
 *   the text segment's tokens or cross_attention_tokens, else 512) at the GEMM
 *   rate + its weights read once, at least 24 eager blocks of host time; the VAE
 *   decode of the image/video segments' pixels (runtime.vae: auto) by a decoder
 *   of base width c = runtime.vae_channels (128): ~512 c^2 FLOPs per output
 *   pixel for an image decoder, ~1300 c^2 for a causal video decoder (cost.c
 *   counts the convolutions), at half (image) or a quarter (video: 3-D
 *   convolutions of narrow channels) of the GEMM rate, plus ~152 c x 2 bytes
 *   per pixel of normalisation and activation at mem_gbps; over the ranks with
 *   runtime.vae_parallel; with runtime.vae_tiling a frame larger than one tile
 *   (256^2 pixels for a video decoder, 512^2 for an image one) costs (4/3)^2 of
 *   its pixels (tiles overlapping by a quarter on each side, diffusers'
 *   defaults); with runtime.vae_dtype: fp32 (Wan's VAE decodes in float32:
 *   wan/modules/vae.py WanVAE dtype torch.float) the convolutions run in TF32
 *   (PyTorch's default for cuDNN convolutions), half the BF16 tensor rate
 *   (A100 156 of 312, H100 495 of 989, L40 90.5 of 181 TFLOP/s dense:
 *   datasheets), and the activations take 4 bytes.
 *
 * MEMORY of the deployment (with model.parameters, on GPUs; inside
 *   memory_bytes_per_rank): weights = parameters x dtype bytes / T (CP and CFG
 *   replicate them); a block's activations M x h x dtype x (4 + (4 + (g + 1) r x
 *   active_experts) / T); after the steps, the VAE decode (its weights ~84M /
 *   250M x (c/128)^2 and four c-wide maps of a tile of at most 1024 x 1024
 *   pixels (x 17 frames)); memory = weights + max(activations + the program's
 *   buffers, VAE) + workspace + reserved_gb.  The text encoder is not counted
 *   (pipelines offload or free it after encoding).  CP040's hint proposes the
 *   smallest tp_degree whose split weights fit (checked by the same sum).
 *
 * CALIBRATION: bench/published.sh compares the model with 32 published
 * timings of other projects (bench/published/, README.md there) and
 * tests/cli/published.sh holds its metrics to floors.  The figures above are
 * global (per device from datasheets, per framework from the eager block's
 * anatomy, the host figures from the host-bound rows); nothing is per table
 * or per plan.  An out-of-sample set (bench/published-holdout/: 28 timings of
 * other models, GPUs and tables, written before the model's predictions for
 * them were seen; `bench/published.sh --set holdout`) is held to its own
 * floors by the same test; no figure is set from it.
 *
 * GEMM ROOFLINE (CPU path, cpc_gemm_roofline_factor): a block's GEMMs per rank
 * (QKV, output projection, MLP up and down, a 4x MLP) each take max(2MNK /
 * gemm rate, dtype bytes x (MK + KN + MN) / mem_gbps); the factor is their
 * total over the compute-bound total.
 *
 * Device figures are public numbers, each with its source in cost.c; a
 * profile written by `cprun --calibrate` (cluster.profile) overrides them.
 *
 * Thread-safety: pure functions over immutable inputs.
 */
#ifndef CPC_COST_H
#define CPC_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "plan.h"
#include "prediction.h"
#include "program.h"
#include "status.h"
#include "validate.h"

typedef struct cpc_device_profile {
    char name[32];
    double attn_tflops;        /* attention forward, bf16/fp16, TFLOP/s */
    double attn_tflops_fp32;   /* attention forward, fp32 (no TF32), TFLOP/s */
    double mem_gbps;           /* device memory bandwidth for memory-bound ops, GB/s */
    double intra_gbps;         /* collective bus bandwidth inside a node, GB/s */
    double intra_p2p_gbps;     /* send/recv bandwidth inside a node, GB/s */
    double inter_gbps;         /* bandwidth across nodes per rank, GB/s */
    double intra_latency_us;   /* per message / per collective step, us */
    double inter_latency_us;
    double memory_gb;          /* device memory, GiB */
    double ranks_per_core;     /* CPU only: >1 when ranks share cores (calibrated); 0 = n/a.
                                  A compute-time multiplier, used when `cores` is 0;
                                  `cprun --calibrate` writes the slowdown it measured
                                  for its own number of ranks */
    double op_overhead_us;     /* fixed cost of every compute op (kernel launch, dispatch), us */
    double cores;              /* CPU only (calibrated): effective cores the ranks of one
                                  node share; 0 = every rank has its own device.  When
                                  > 0, compute and communication times (the transports
                                  move bytes with the ranks' own cores) are multiplied
                                  by max(1, ranks per node / cores), ranks per node =
                                  min(world_size, gpus_per_node) */
    double attn_io_gbps;       /* CPU only (calibrated): rate at which the attention kernel
                                  reads Q, K, V and writes O and LSE, GB/s; each attn op
                                  then costs FLOPs / attn rate + those bytes / attn_io_gbps
                                  (the CPU kernel widens and gathers every block it is
                                  given, so many small blocks cost more than one big one).
                                  0 = no separate term (GPU presets: flash attention
                                  overlaps its IO with the math) */
    /* Whole step (model.parameters; see WHOLE STEP below): */
    double gemm_tflops;        /* achieved dense GEMM rate (bf16/fp16), TFLOP/s; fp32 plans
                                  scale it by attn_tflops_fp32 / attn_tflops.  0 = use
                                  attn_tflops */
    double host_layer_us;      /* host time to issue one transformer block's dense work in
                                  the serving framework (eager PyTorch: ~100 kernel launches
                                  with Python dispatch), us; 0 = never host-bound */
    double host_op_us;         /* host time to issue one op of the attention program in that
                                  framework (a collective with its reshapes, an attention call
                                  with its LSE, one LSE-merge update: ~10-20 PyTorch calls), us;
                                  a merge is two (output and LSE); a TP all-reduce is one */
    double attn_softmax_gps;   /* CPU only (calibrated): score elements per second (G/s) of the
                                  attention kernel's softmax (the max, exp and sums of every
                                  visible (query, key, head) score), a cost that does not
                                  scale with head_dim: each attn op also costs
                                  B x visible pairs x heads / this rate, so a small head_dim
                                  is not priced at the big-head_dim FLOP rate.  0 = no
                                  separate term (GPU presets: the attention rate is measured
                                  at head_dim 128 with its softmax) */
    double peak_tflops;        /* dense BF16/FP16 tensor peak (FP32 accumulate), TFLOP/s;
                                  0 = unknown (CPU) */
    double sms;                /* streaming multiprocessors (GEMM wave quantisation); 0 = n/a */
    double arch;               /* compute capability x 10 (80 Ampere, 89 Ada, 90 Hopper,
                                  100 Blackwell); 0 = not a GPU (no kernel-family factors) */
    double clock_ghz;          /* boost clock, GHz: with sms, the SFU exponential rate of the
                                  attention ceiling (cpc_attn_ceiling); 0 = unknown (no
                                  ceiling) */
} cpc_device_profile;

/* Finds a preset by name (SPEC section 1: h100-sxm, h100-pcie, h800, h200, h20,
 * a100-sxm, a100-pcie, a800, l20, l40, l40s, rtx4090, b200, cpu; the figures and
 * their sources are in cost.c).  The preset alone, before the plan's runtime
 * (cpc_plan_device applies that).  Returns false when unknown. */
bool cpc_device_preset(const char *name, cpc_device_profile *out);
/* ATTENTION KERNELS (cost.h): the factor on a GPU preset's attn_tflops (the
 * FlashAttention-2-class rate at head_dim 128) for kernel `k` on compute
 * capability `arch` (x 10) at `head_dim`. */
double cpc_attn_kernel_factor(cpc_attn_kernel k, double arch, int head_dim);

/* The ceiling of the attention forward rate, TFLOP/s, for kernel `k` at
 * `head_dim` on `dev` (cost.h ATTENTION KERNELS: the two matmuls at the dense
 * peak and one exponential per score on the SFUs, SMs x 16 x clock_ghz a
 * second).  0 (no ceiling) where it does not apply: not a GPU, Blackwell
 * (arch >= 100), k sage, or peak_tflops, sms, clock_ghz or head_dim not
 * positive. */
double cpc_attn_ceiling(const cpc_device_profile *dev, cpc_attn_kernel k, int head_dim);

/* Names of the presets, NULL-terminated. */
extern const char *const cpc_device_preset_names[];

/* The profile a plan asks for: its preset with the plan's runtime applied
 * (ATTENTION KERNELS: attn_tflops for runtime.attention_kernel; HOST:
 * host_layer_us and host_op_us for runtime.framework), overridden by
 * cluster.profile (a YAML file written by `cprun --calibrate`, path relative
 * to the plan file) and by cluster.memory_gb.  Errors: CPC_E_IO (unreadable profile),
 * CPC_E_PLAN rule 103 (unknown device, bad profile field). */
cpc_status *cpc_plan_device(const cpc_plan *plan, cpc_device_profile *out);

/* Reads/writes a profile YAML file ("device_profile: 1" + the fields above).
 * cpc_profile_read accepts (and checks, then drops) a `measured:` list. */
cpc_status *cpc_profile_read(const char *path, cpc_device_profile *out);
cpc_status *cpc_profile_write(const char *path, const cpc_device_profile *p);

/* MEASURED TIMES (`cprun --tune`, issue 15).  A profile may also carry what
 * each candidate took on this machine, for one problem:
 *   measured:
 *     - {key: "B=1 S=1024 ...", variant: ring, ring_degree: 4, ulysses_degree: 1,
 *        backend: cpu, ms_per_layer: 12.3}
 * `key` (cpc_measure_key) names the problem: batch, segment lengths (a
 * replicated segment's with an `r`: "S=[226r,17550]"), Skv, H, Hkv, D, dtype, mask, mode, world size, CFG and TP degrees, overlap and
 * rotation; a measurement applies to a plan only when the key, the
 * candidate (variant, R, U) and the backend (`cpu` for the cpu device,
 * else `cuda`) all match.  Then the cost model's time for that candidate is
 * the measured one: cpc_cost_price_candidate sets cand->measured and the
 * measured_* fields (the step prediction recomputed with the measured
 * attention), and selection (validate.h) uses them; predicted_* stay the
 * model's. */
#define CPC_MEASURE_KEY_MAX 256
typedef struct cpc_measurement {
    char key[CPC_MEASURE_KEY_MAX]; /* cpc_measure_key of the problem */
    cpc_variant variant;           /* never AUTO */
    int ring_degree, ulysses_degree;
    char backend[8];               /* "cpu" or "cuda" */
    double ms_per_layer;           /* median wall time of one layer, ms (> 0) */
} cpc_measurement;

typedef struct cpc_measurements {
    int n, cap;
    cpc_measurement *items;        /* owned (cpc_measurements_free) */
} cpc_measurements;

/* As cpc_profile_read, also appending the file's measurements to *m (which
 * must be initialised: zeroed or from an earlier call).  Errors: those of
 * cpc_profile_read; a malformed `measured` entry is CPC_E_PLAN rule 103
 * with its position; CPC_E_NOMEM. */
cpc_status *cpc_profile_read_measured(const char *path, cpc_device_profile *out,
                                      cpc_measurements *m);
/* As cpc_profile_write, followed by the `measured:` list of `m` (may be NULL
 * or empty: none).  Atomic (fileio.h) unless path is "-" (stdout). */
cpc_status *cpc_profile_write_measured(const char *path, const cpc_device_profile *p,
                                       const cpc_measurements *m);
/* Adds `x`, replacing an entry with the same key, variant, degrees and
 * backend.  Errors: CPC_E_NOMEM. */
cpc_status *cpc_measurements_put(cpc_measurements *m, const cpc_measurement *x);
/* The entry matching all of key, variant, degrees and backend, or NULL. */
const cpc_measurement *cpc_measurements_find(const cpc_measurements *m, const char *key,
                                             cpc_variant variant, int ring_degree,
                                             int ulysses_degree, const char *backend);
/* Frees what `m` owns and zeroes it.  NULL is ignored. */
void cpc_measurements_free(cpc_measurements *m);
/* The problem key of `plan` (see MEASURED TIMES) into buf (n >=
 * CPC_MEASURE_KEY_MAX; more than 8 segments are summarised by count and a
 * hash of their lengths). */
void cpc_measure_key(const cpc_plan *plan, char *buf, size_t n);
/* The backend whose measurements apply to `plan`: "cpu" when
 * cluster.device is cpu, else "cuda". */
const char *cpc_measure_backend(const cpc_plan *plan);
/* The path of the plan's cluster.profile (relative paths resolved against
 * the plan file's directory) into buf; false when the plan names none. */
bool cpc_plan_profile_path(const cpc_plan *plan, char *buf, size_t n);


/* Dual-stream (MMDiT) blocks of the plan's model: model.dual_stream_layers,
 * else, without structure keys, estimated from the weights per block (cost.h
 * HOST); 0 without model.parameters.  Not necessarily an integer. */
double cpc_dual_stream_layers(const cpc_plan *plan);

/* Weights a token passes through (see WHOLE STEP); 0 without model.parameters. */
double cpc_weights_per_token(const cpc_plan *plan);

/* The GEMM ROOFLINE factor (>= 1; 1 for non-positive inputs) of one
 * transformer block of hidden size `hidden` split over T tensor-parallel
 * ranks, `tokens` rows per rank, elements of `elem_bytes`, at
 * gemm_flops_s FLOP/s and mem_bytes_s bytes/s. */
double cpc_gemm_roofline_factor(double tokens, double hidden, int T, double elem_bytes,
                                double gemm_flops_s, double mem_bytes_s);

/* How much slower one rank's work gets because the ranks of a node share
 * cores (>= 1): with dev->cores > 0, max(1, ranks per node / cores) (ranks
 * per node = min(cluster.world_size, gpus_per_node) of the WHOLE job: for a
 * (c, t) sub-plan (plan.h cpc_plan_sub) its C*T groups share the node, so
 * C*T*world_size and T*gpus_per_node); else max(1, dev->ranks_per_core);
 * 1 for GPUs. */
double cpc_core_sharing(const cpc_plan *plan, const cpc_device_profile *dev);

/* Prices `prog` for `plan` on `dev`.  Ranks: all when P <= 4096, else a
 * sample (ranks 0, P-1 and every member of ring group 0 and ulysses group
 * 0), which is exact for the symmetric programs the scheduler emits.
 * Errors: expression evaluation failures (CPC_E_INPUT). */
cpc_status *cpc_price_program(const cpc_plan *plan, const cpc_program *prog,
                              const cpc_device_profile *dev, cpc_prediction *out);

/* Visible (query, key) pairs of a block: sum over pairs of runs of the number
 * of (i, j) with j <= i when causal, else (sum of q lengths) x (sum of k
 * lengths).  Causal: a closed form per pair of runs that overlap; key runs
 * that are disjoint (as layouts give; sorted by start first when they are
 * not in order, with the query runs: a zigzag Ulysses rank lists its runs
 * in member order) are binary-searched, so the time is
 * O((nq + overlapping pairs) log nk + (nq + nk) log(nq + nk)), else
 * O(nq * nk); allocates a sorted copy (on OOM: the O(nq * nk) path).  In double: S^2
 * exceeds int64 beyond ~3e9 tokens.  Pure; thread-safe. */
double cpc_visible_pairs(const cpc_run *q, int nq, const cpc_run *k, int nk, bool causal);

/* The price callback for cpc_validate_priced (validate.h): builds the
 * candidate's schedule, prices it on the plan's device and fills the
 * candidate's predicted fields.  A candidate whose memory per rank exceeds the
 * device memory is rejected with CP040 (the numbers and a hint: more ranks,
 * or a variant with less memory).  A `mode: training` candidate without a
 * backward program (cpc_backward_supported, schedule_bwd.h) is rejected with
 * CP018, so `auto` selects one that trains; the others get their backward
 * program priced too (bwd_priced: attn_bwd at 2.5x the forward's FLOPs, its
 * K/V and fp32 dK/dV messages).  `ctx` is unused (NULL).  Returns a status
 * only for internal failures (schedule or pricing errors). */
cpc_status *cpc_cost_price_candidate(void *ctx, const cpc_plan *plan, cpc_candidate *cand);

#endif
