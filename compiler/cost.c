/* cost.c - the dry-run cost model; see cost.h for the model. */
#include "cost.h"
#include "fileio.h"
#include "schedule.h"
#include "schedule_bwd.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* ---- device presets ----------------------------------------------------------
 * Every figure is a public number or derived from one by a rule stated here; the
 * same rules hold for every preset (nothing is fitted to one table).
 *
 * peak_tflops: dense BF16/FP16 tensor peak with FP32 accumulation (no sparsity),
 *   from the vendor datasheets / whitepapers:
 *   H100 SXM 989.4, H100 PCIe 756, H800 SXM 989.4 (H100 silicon, NVLink cut to
 *   400 GB/s), H200 989.4, H20 148, A100 SXM/PCIe 312, A800 SXM 312, L20 119.5,
 *   L40 181.05, L40S 362.05, RTX 4090 165.2 (Ada whitepaper, FP32 accumulate),
 *   B200 2250 (HGX B200 per GPU).
 * attn_tflops_fp32 (fp32 plans, no TF32): half the FP32 (non-tensor) peak: H100 SXM/
 *   H800/H200 67, H100 PCIe 51, H20 44, A100/A800 19.5, L20 59.8, L40 90.5, L40S 91.6,
 *   RTX 4090 82.6, B200 80 TFLOP/s (datasheets).
 * sms: streaming multiprocessors (the same sources): H100 SXM/H800/H200 132,
 *   H100 PCIe 114, H20 78, A100/A800 108, L20 92, L40/L40S 142, RTX 4090 128,
 *   B200 148.  arch: compute capability x 10.
 * clock_ghz: boost clock (datasheets / whitepapers): H100 SXM, H800, H200 1.98,
 *   H100 PCIe 1.755, A100/A800 1.41, L20, L40S, RTX 4090 2.52, L40 2.49; H20 1.98
 *   and B200 1.965 are not stated by NVIDIA (the Hopper SXM figure; B200 as
 *   reported by its board specifications).  With sms it gives the exponential
 *   throughput of the attention ceiling (cost.h ATTENTION KERNELS).
 * gemm_tflops: the large-GEMM rate cuBLAS sustains = peak x the architecture's
 *   sustained fraction: Hopper 0.75 (cuBLAS BF16 8k^3 ~740 TFLOP/s on H100 SXM
 *   under its 700 W limit); Ampere 0.75 (cuBLAS reaches ~0.85, ~265 of 312, on
 *   8k^3; with 0.85 the A100/A800 rows of bench/published/ come out ~10% fast
 *   (checked in issue 20's second pass: within-25% drops from 91% to 78% with
 *   the best-case figures below), so the DiT shapes' ~0.75 is used); Ada 0.90
 *   (its 165/119.5 TFLOP/s peaks are the FP32-accumulate figures, which cuBLAS
 *   nearly reaches); H20 0.90 (its peak is a capped clock: GEMMs run at the
 *   cap), Blackwell 0.70.  Shapes then lower it (cost.h GEMM EFFICIENCY: wave
 *   quantisation, short K, the roofline).
 * attn_tflops: FlashAttention-2-class forward (what PyTorch SDPA's flash backend
 *   runs), head_dim 128: Ampere 0.62 x peak (~193 of 312; the FlashAttention-2
 *   paper, Dao 2023, reaches up to 73% at its best lengths, the DiT rows run
 *   below it); Ada 0.73 x peak: the same FA2 kernel (mma.sync, no overlap of
 *   the softmax with the matmuls) reaches 0.62 / 0.80 = 0.775 of the A100's
 *   attention ceiling (cost.h ATTENTION KERNELS: matmuls + SFU exponentials),
 *   and Ada's ceiling is 0.94 x peak (its tensor rate is low beside its SFUs):
 *   0.775 x 0.94 = 0.73.  Measured: FA2's forward at head_dim 128 on an RTX
 *   4090, 169 TFLOP/s at 2k tokens (apache/tvm tl_doc/flash_perf.md; above the
 *   165.2 datasheet figure: boost clocks run higher), an FA2-style kernel with
 *   FP32 accumulation on L20 89-99 of 119.5 at head_dim 320-1024
 *   (xlite-dev/ffpa-attn README); the 0.60 used before (issue 20's first pass)
 *   put the L20 rows of bench/published/ 8% slow as a group.  Hopper 0.30 x peak (~297; the
 *   FlashAttention-3 paper, Shah et al. 2024, has FA2's forward at hdim 128 at
 *   324-370 TFLOP/s for 2k-16k tokens, FA2 cannot use wgmma; 0.35 puts the
 *   attention-bound H100 rows, Wan2.1 and HunyuanVideo, ~12% fast); H20 0.60 x its capped peak (the cap, not the
 *   instruction mix, bounds it); B200 0.30 x peak (FA2's mma.sync path on
 *   Blackwell).  Other kernels: ATTENTION KERNELS in cost.h.
 * mem_gbps: datasheet HBM/GDDR bandwidth x 0.9 (what streaming kernels reach):
 *   H100 SXM/H800 3350, H100 PCIe 2000, H200 4800, H20 4000, A100 SXM/A800 2039,
 *   A100 PCIe 1935, L20/L40/L40S 864, RTX 4090 1008, B200 8000.
 * intra_gbps: NCCL all-to-all / all-gather bus bandwidth inside a node
 *   (nccl-tests busBW): NVSwitch H100/H200/H20 (NVLink4 900 GB/s bidirectional)
 *   ~360; H800 and A800 (NVLink 400 GB/s bidirectional) ~160; A100 SXM (NVLink3
 *   600) ~230; B200 (NVLink5 1800) ~720; PCIe Gen4 x16 boards with P2P (A100 PCIe,
 *   L20, L40, L40S) 32 (the link's 32 GB/s per direction: a collective drives
 *   both directions of every board's link at once through the PCIe switch); H100
 *   PCIe (Gen5 x16) ~40; RTX 4090 (no P2P on GeForce: NCCL's shared-memory
 *   transport stages every chunk through host memory, both directions of each
 *   Gen4 x16 link in use) ~16.
 * intra_p2p_gbps: one send/recv pair: ~40% of the link each way on NVLink parts
 *   (H100 ~150, H800/A800 ~70, A100 ~100, B200 ~300); one PCIe Gen4 P2P copy
 *   ~22 (a single DMA stream), 12 without P2P.
 * inter_gbps: InfiniBand NDR 400 Gb/s ~47 GB/s per GPU (Hopper/Blackwell), HDR
 *   200 Gb/s ~24 GB/s (Ampere), 100 Gb/s Ethernet ~12 GB/s (PCIe boards).
 * latencies: NCCL intra-node ~10 us (NVLink) / 15 us (PCIe), inter-node 20-25 us.
 * memory_gb: datasheet (H100 80, H200 141, H20 96, A100/A800 80, L20/L40/L40S 48,
 *   RTX 4090 24, B200 180).
 * op_overhead_us: ~5 us per kernel launch and framework dispatch on GPUs (CUDA
 *   launch latency 2-5 us); 0.4 us on the CPU.
 * host_layer_us / host_op_us (eager PyTorch host time per transformer block and
 *   per op of the attention program): cost.h HOST; they belong to the framework,
 *   not the GPU, and are set from runtime.framework (cost.c host_costs).
 *  cpu:      this project's CI machines (2 cores shared by the rank threads), as
 *            `cprun --calibrate` measured them (full mode, 4 ranks): attention
 *            65 GFLOP/s bf16 (68 fp32) per rank plus its Q/K/V/O IO at 4 GB/s,
 *            memory-bound ops 18 GB/s, all-to-all bus 5.5 GB/s, point to point
 *            15 GB/s, 25 us per message, 0.4 us per op, 1.7 effective cores
 *            shared by the ranks (cores: 4 ranks ran 2.4x slower than one);
 *            dense GEMM: OpenBLAS SGEMM ~90 GFLOP/s single thread
 *            (platform-notes.md).  The softmax per score (attn_softmax_gps,
 *            cost.h): 0.9 G scores/s per rank, and the FLOP rate with it 73
 *            GFLOP/s bf16.
 *  TP all-reduces: the alpha-beta cost of the ring all-reduce, 2 (T-1) alpha +
 *            2 (T-1)/T n beta (Thakur, Rabenseifner, Gropp, IJHPCA 2005; NCCL's
 *            ring, whose bus bandwidth nccl-tests reports as algBW x 2 (T-1)/T).
 */
#define DEV(nm, peak, f32, sms_, arch_, clk, geff, aeff, memg, intra, p2p, inter, lat, ilat, gb)    \
    {.name = nm, .attn_tflops = (peak) * (aeff), .attn_tflops_fp32 = (f32) * 0.5,                \
     .mem_gbps = (memg) * 0.9, .intra_gbps = intra, .intra_p2p_gbps = p2p, .inter_gbps = inter,  \
     .intra_latency_us = lat, .inter_latency_us = ilat, .memory_gb = gb, .op_overhead_us = 5.0,  \
     .gemm_tflops = (peak) * (geff), .host_layer_us = 0, .host_op_us = 0,                         \
     .peak_tflops = peak, .sms = sms_, .arch = arch_, .clock_ghz = clk}
static const cpc_device_profile presets[] = {
    DEV("h100-sxm", 989.4, 67, 132, 90, 1.98, 0.75, 0.30, 3350, 360, 150, 47, 10, 20, 80),
    DEV("h100-pcie", 756.0, 51, 114, 90, 1.755, 0.75, 0.30, 2000, 40, 40, 47, 15, 20, 80),
    DEV("h800", 989.4, 67, 132, 90, 1.98, 0.75, 0.30, 3350, 160, 70, 47, 10, 20, 80),
    DEV("h200", 989.4, 67, 132, 90, 1.98, 0.75, 0.30, 4800, 360, 150, 47, 10, 20, 141),
    DEV("h20", 148.0, 44, 78, 90, 1.98, 0.90, 0.60, 4000, 360, 150, 47, 10, 20, 96),
    DEV("a100-sxm", 312.0, 19.5, 108, 80, 1.41, 0.75, 0.62, 2039, 230, 100, 24, 10, 20, 80),
    DEV("a100-pcie", 312.0, 19.5, 108, 80, 1.41, 0.75, 0.62, 1935, 32, 22, 24, 15, 25, 80),
    DEV("a800", 312.0, 19.5, 108, 80, 1.41, 0.75, 0.62, 2039, 160, 70, 24, 10, 20, 80),
    DEV("l20", 119.5, 59.8, 92, 89, 2.52, 0.90, 0.73, 864, 32, 22, 12, 15, 25, 48),
    DEV("l40", 181.05, 90.5, 142, 89, 2.49, 0.90, 0.73, 864, 32, 22, 12, 15, 25, 48),
    DEV("l40s", 362.05, 91.6, 142, 89, 2.52, 0.90, 0.73, 864, 32, 22, 12, 15, 25, 48),
    DEV("rtx4090", 165.2, 82.6, 128, 89, 2.52, 0.90, 0.73, 1008, 16, 12, 12, 15, 25, 24),
    DEV("b200", 2250.0, 80, 148, 100, 1.965, 0.70, 0.30, 8000, 720, 300, 47, 10, 20, 180),
    {.name = "cpu", .attn_tflops = 0.073, .attn_tflops_fp32 = 0.068, .mem_gbps = 18.0,
     .intra_gbps = 5.5, .intra_p2p_gbps = 15.0, .inter_gbps = 1.0, .intra_latency_us = 25.0,
     .inter_latency_us = 50.0, .memory_gb = 16.0, .op_overhead_us = 0.4, .cores = 1.7,
     .attn_io_gbps = 4.0, .gemm_tflops = 0.09, .attn_softmax_gps = 0.9},
};
#undef DEV

const char *const cpc_device_preset_names[] = {
    "h100-sxm", "h100-pcie", "h800", "h200", "h20", "a100-sxm", "a100-pcie", "a800", "l20",
    "l40", "l40s", "rtx4090", "b200", "cpu", NULL};

bool cpc_device_preset(const char *name, cpc_device_profile *out)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (name && strcmp(presets[i].name, name) == 0) {
            *out = presets[i];
            return true;
        }
    }
    return false;
}

/* ---- profile files ------------------------------------------------------------ */

typedef struct {
    const char *key;
    size_t off;
} profile_field;

#define PF(k) {#k, offsetof(cpc_device_profile, k)}
static const profile_field profile_fields[] = {
    PF(attn_tflops), PF(attn_tflops_fp32), PF(mem_gbps), PF(intra_gbps),
    PF(intra_p2p_gbps), PF(inter_gbps), PF(intra_latency_us), PF(inter_latency_us),
    PF(memory_gb), PF(ranks_per_core), PF(op_overhead_us), PF(cores), PF(attn_io_gbps),
    PF(gemm_tflops), PF(host_layer_us), PF(host_op_us), PF(attn_softmax_gps),
    PF(peak_tflops), PF(sms), PF(arch), PF(clock_ghz),
};
#undef PF
#define N_PROFILE_FIELDS (sizeof profile_fields / sizeof profile_fields[0])

cpc_status *cpc_profile_write_measured(const char *path, const cpc_device_profile *p,
                                       const cpc_measurements *m)
{
    /* a file: fileio.h (temporary file + rename, never half a profile) */
    cpc_outfile o = {.f = NULL};
    FILE *f = stdout;
    if (strcmp(path, "-") != 0) {
        cpc_status *st = cpc_outfile_open(&o, path, "cannot write the profile");
        if (st)
            return st;
        f = o.f;
    }
    fprintf(f, "# cpc device profile (written by cprun --calibrate / --tune); units: TFLOP/s, GB/s, us, GiB\n");
    fprintf(f, "device_profile: 1\nname: %s\n", p->name);
    for (size_t i = 0; i < N_PROFILE_FIELDS; i++)
        fprintf(f, "%s: %.6g\n", profile_fields[i].key,
                *(const double *)((const char *)p + profile_fields[i].off));
    if (m && m->n > 0) {
        fprintf(f, "# measured by cprun --tune: median ms per layer of each candidate, per problem\n");
        fprintf(f, "measured:\n");
        for (int i = 0; i < m->n; i++) {
            const cpc_measurement *x = &m->items[i];
            fprintf(f, "  - {key: \"%s\", variant: %s, ring_degree: %d, ulysses_degree: %d, "
                       "backend: %s, ms_per_layer: %.6g}\n",
                    x->key, cpc_variant_name(x->variant), x->ring_degree, x->ulysses_degree,
                    x->backend, x->ms_per_layer);
        }
    }
    if (f != stdout)
        return cpc_outfile_commit(&o); /* checks every write (the stream's error flag) */
    return ferror(f) ? cpc_errno_status(CPC_E_IO, errno ? errno : EIO, path) : NULL;
}

cpc_status *cpc_profile_write(const char *path, const cpc_device_profile *p)
{
    return cpc_profile_write_measured(path, p, NULL);
}

cpc_status *cpc_measurements_put(cpc_measurements *m, const cpc_measurement *x)
{
    for (int i = 0; i < m->n; i++) {
        cpc_measurement *y = &m->items[i];
        if (strcmp(y->key, x->key) == 0 && y->variant == x->variant &&
            y->ring_degree == x->ring_degree && y->ulysses_degree == x->ulysses_degree &&
            strcmp(y->backend, x->backend) == 0) {
            *y = *x;
            return NULL;
        }
    }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        cpc_measurement *n = realloc(m->items, (size_t)cap * sizeof *n);
        if (!n)
            return cpc_error(CPC_E_NOMEM, "out of memory");
        m->items = n;
        m->cap = cap;
    }
    m->items[m->n++] = *x;
    return NULL;
}

const cpc_measurement *cpc_measurements_find(const cpc_measurements *m, const char *key,
                                             cpc_variant variant, int ring_degree,
                                             int ulysses_degree, const char *backend)
{
    for (int i = 0; m && i < m->n; i++) {
        const cpc_measurement *y = &m->items[i];
        if (strcmp(y->key, key) == 0 && y->variant == variant && y->ring_degree == ring_degree &&
            y->ulysses_degree == ulysses_degree && strcmp(y->backend, backend) == 0)
            return y;
    }
    return NULL;
}

void cpc_measurements_free(cpc_measurements *m)
{
    if (!m)
        return;
    free(m->items);
    m->items = NULL;
    m->n = m->cap = 0;
}

void cpc_measure_key(const cpc_plan *plan, char *buf, size_t n)
{
    char segs[128];
    int ns = plan->input.n_segments;
    if (ns <= 8) {
        size_t used = 0;
        segs[0] = 0;
        for (int i = 0; i < ns && used < sizeof segs; i++) {
            /* a replicated segment (`split: replicate`) runs another program: "226r" */
            int w = snprintf(segs + used, sizeof segs - used, "%s%lld%s", i ? "," : "",
                             (long long)plan->input.segments[i].tokens,
                             plan->input.segments[i].replicate ? "r" : "");
            if (w < 0)
                break;
            used += (size_t)w;
        }
    } else {
        uint64_t h = 1469598103934665603ULL; /* FNV-1a over the lengths */
        for (int i = 0; i < ns; i++) {
            uint64_t t = (uint64_t)plan->input.segments[i].tokens;
            if (plan->input.segments[i].replicate)
                t = ~t;
            for (int b = 0; b < 8; b++) {
                h ^= (t >> (8 * b)) & 0xff;
                h *= 1099511628211ULL;
            }
        }
        snprintf(segs, sizeof segs, "%d segments %016llx", ns, (unsigned long long)h);
    }
    snprintf(buf, n,
             "B=%d S=[%s] Skv=%lld H=%d Hkv=%d D=%d dtype=%s mask=%s mode=%s P=%d C=%d T=%d "
             "overlap=%d rotate=%s",
             plan->input.batch, segs, plan->input.has_kv ? (long long)plan->input.kv_tokens : 0LL,
             plan->model.heads, plan->model.kv_heads, plan->model.head_dim,
             cpc_dtype_name(plan->model.dtype), cpc_mask_name(plan->input.mask),
             plan->input.mode == CPC_MODE_TRAINING ? "training" : "inference",
             plan->cluster.world_size, cpc_plan_cfg_degree(plan), cpc_plan_tp_degree(plan),
             plan->schedule.overlap ? 1 : 0, cpc_rotate_name(plan->schedule.rotate));
}

const char *cpc_measure_backend(const cpc_plan *plan)
{
    return plan->cluster.device && strcmp(plan->cluster.device, "cpu") == 0 ? "cpu" : "cuda";
}

bool cpc_plan_profile_path(const cpc_plan *plan, char *buf, size_t n)
{
    const char *p = plan->cluster.profile;
    if (!p)
        return false;
    if (p[0] != '/' && plan->file && strrchr(plan->file, '/')) {
        int dir = (int)(strrchr(plan->file, '/') - plan->file);
        snprintf(buf, n, "%.*s/%s", dir, plan->file, p);
    } else {
        snprintf(buf, n, "%s", p);
    }
    return true;
}

/* One entry of `measured:`: its fields as they are read. */
typedef struct {
    cpc_measurement m;
    bool has_key, has_variant, has_r, has_u, has_ms;
    cpc_span span;
} meas_entry;

static cpc_status *meas_field(meas_entry *e, const char *k, const char *v, cpc_span sp)
{
    if (strcmp(k, "key") == 0) {
        if (strlen(v) >= sizeof e->m.key || strchr(v, '"') || strchr(v, '\\'))
            return cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                            "device profile: measured key too long or with quotes");
        snprintf(e->m.key, sizeof e->m.key, "%s", v);
        /* profiles tuned before the outer axes ran wrote an unset degree
         * as 0: the same problem as C = T = 1 (cpc_measure_key now) */
        char *ct = strstr(e->m.key, " C=0 T=0 ");
        if (ct)
            memcpy(ct, " C=1 T=1 ", 9);
        e->has_key = true;
    } else if (strcmp(k, "variant") == 0) {
        int var = cpc_variant_parse(v);
        if (var < 0 || var == CPC_VARIANT_AUTO)
            return cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                            "device profile: measured variant '%s' is not a variant", v);
        e->m.variant = (cpc_variant)var;
        e->has_variant = true;
    } else if (strcmp(k, "backend") == 0) {
        if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
            return cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                            "device profile: measured backend '%s' (expected cpu or cuda)", v);
        snprintf(e->m.backend, sizeof e->m.backend, "%s", v);
    } else if (strcmp(k, "ring_degree") == 0 || strcmp(k, "ulysses_degree") == 0) {
        char *end = NULL;
        errno = 0;
        long d = strtol(v, &end, 10);
        if (!*v || *end || errno || d < 1 || d > (1L << 20))
            return cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                            "device profile: measured %s must be a positive integer, found '%s'", k, v);
        if (k[0] == 'r')
            e->m.ring_degree = (int)d, e->has_r = true;
        else
            e->m.ulysses_degree = (int)d, e->has_u = true;
    } else if (strcmp(k, "ms_per_layer") == 0) {
        char *end = NULL;
        errno = 0;
        double d = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(d) || d <= 0)
            return cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                            "device profile: measured ms_per_layer must be a positive number, found '%s'", v);
        e->m.ms_per_layer = d;
        e->has_ms = true;
    } else {
        return cpc_diag(CPC_E_PLAN, 101, CPC_SEV_ERROR, sp,
                        "device profile: unknown key '%s' in a measured entry (key, variant, "
                        "ring_degree, ulysses_degree, backend, ms_per_layer)", k);
    }
    return NULL;
}

/* The profile is a flat mapping of scalars, plus the `measured` list of flat
 * mappings; read it with libyaml's parser. */
cpc_status *cpc_profile_read_measured(const char *path, cpc_device_profile *out,
                                      cpc_measurements *m)
{
    /* fileio.h: a regular file only (a FIFO would block open() forever) */
    cpc_status *ost = NULL;
    FILE *f = cpc_fopen_read(path, "cluster.profile", false, &ost);
    if (!f)
        return ost;
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    cpc_status *err = NULL;
    char key[64] = "";
    bool have_key = false, done = false, seen_magic = false;
    bool in_measured = false, in_entry = false;
    meas_entry ent;
    memset(&ent, 0, sizeof ent);
    int depth = 0;
    while (!done && !err) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            err = cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR,
                           (cpc_span){path, (int)parser.problem_mark.line + 1,
                                      (int)parser.problem_mark.column + 1},
                           "device profile: %s", parser.problem ? parser.problem : "YAML error");
            break;
        }
        cpc_span sp = {path, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1};
        switch (ev.type) {
        case YAML_SEQUENCE_START_EVENT:
            depth++;
            if (depth == 2 && have_key && strcmp(key, "measured") == 0 && !in_measured) {
                in_measured = true;
                have_key = false;
            } else {
                err = cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                               "device profile: expected a flat mapping of numbers "
                               "(and a `measured:` list)");
            }
            break;
        case YAML_MAPPING_START_EVENT:
            depth++;
            if (depth == 3 && in_measured && !in_entry) {
                in_entry = true;
                memset(&ent, 0, sizeof ent);
                snprintf(ent.m.backend, sizeof ent.m.backend, "cpu");
                ent.span = sp;
            } else if (depth > 1) {
                err = cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                               "device profile: expected a flat mapping of numbers "
                               "(and a `measured:` list of mappings)");
            }
            break;
        case YAML_MAPPING_END_EVENT:
            if (depth == 3 && in_entry) {
                in_entry = false;
                if (!ent.has_key || !ent.has_variant || !ent.has_r || !ent.has_u || !ent.has_ms)
                    err = cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, ent.span,
                                   "device profile: a measured entry needs key, variant, "
                                   "ring_degree, ulysses_degree and ms_per_layer");
                else if (m)
                    err = cpc_measurements_put(m, &ent.m);
            }
            depth--;
            break;
        case YAML_SEQUENCE_END_EVENT:
            if (depth == 2)
                in_measured = false;
            depth--;
            break;
        case YAML_SCALAR_EVENT: {
            const char *v = (const char *)ev.data.scalar.value;
            if (in_measured && !in_entry) {
                err = cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                               "device profile: `measured` holds mappings, found '%s'", v);
                break;
            }
            if (!have_key) {
                snprintf(key, sizeof key, "%s", v);
                have_key = true;
                break;
            }
            have_key = false;
            if (in_entry) {
                err = meas_field(&ent, key, v, sp);
                break;
            }
            if (strcmp(key, "device_profile") == 0) {
                seen_magic = strcmp(v, "1") == 0;
                if (!seen_magic)
                    err = cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                                   "device profile: unsupported version '%s' (expected 1)", v);
                break;
            }
            if (strcmp(key, "name") == 0) {
                snprintf(out->name, sizeof out->name, "%s", v);
                break;
            }
            if (strcmp(key, "measured") == 0) { /* `measured:` empty */
                if (*v)
                    err = cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, sp,
                                   "device profile: `measured` must be a list");
                break;
            }
            size_t i = 0;
            for (; i < N_PROFILE_FIELDS; i++)
                if (strcmp(profile_fields[i].key, key) == 0)
                    break;
            if (i == N_PROFILE_FIELDS) {
                err = cpc_diag(CPC_E_PLAN, 101, CPC_SEV_ERROR, sp,
                               "device profile: unknown key '%s'", key);
                break;
            }
            char *end = NULL;
            errno = 0;
            double d = strtod(v, &end);
            if (!*v || *end || errno || !isfinite(d) || d < 0) {
                err = cpc_diag(CPC_E_PLAN, 102, CPC_SEV_ERROR, sp,
                               "device profile: '%s' must be a non-negative number, found '%s'",
                               key, v);
                break;
            }
            *(double *)((char *)out + profile_fields[i].off) = d;
            break;
        }
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    fclose(f);
    if (!err && !seen_magic)
        err = cpc_diag(CPC_E_PLAN, 104, CPC_SEV_ERROR, (cpc_span){path, 0, 0},
                       "device profile: missing 'device_profile: 1'");
    if (!err && (out->attn_tflops <= 0 || out->mem_gbps <= 0 || out->intra_gbps <= 0))
        err = cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, (cpc_span){path, 0, 0},
                       "device profile: attn_tflops, mem_gbps and intra_gbps must be > 0");
    return err;
}

cpc_status *cpc_profile_read(const char *path, cpc_device_profile *out)
{
    return cpc_profile_read_measured(path, out, NULL);
}

static void host_costs(cpc_framework f, double *layer_us, double *op_us);

double cpc_attn_kernel_factor(cpc_attn_kernel k, double arch, int head_dim)
{
    double f = 1.0;
    switch (k) {
    case CPC_KERNEL_FA3: f = arch >= 90 && arch < 100 ? 1.8 : 1.0; break;
    case CPC_KERNEL_CUDNN: f = arch >= 100 ? 2.5 : arch >= 90 ? 1.6 : 1.0; break;
    case CPC_KERNEL_SAGE: f = arch >= 89 && arch < 90 ? 2.0 : 1.6; break;
    default: break;
    }
    if (head_dim <= 32)
        f *= 0.6;
    else if (head_dim <= 64)
        f *= 0.8;
    return f;
}

double cpc_attn_ceiling(const cpc_device_profile *dev, cpc_attn_kernel k, int head_dim)
{
    if (!dev || dev->arch <= 0 || dev->arch >= 100 || !(dev->peak_tflops > 0) || !(dev->sms > 0) ||
        !(dev->clock_ghz > 0) || head_dim <= 0 || k == CPC_KERNEL_SAGE)
        return 0.0;
    /* per visible (query, key) score and head: Q K^T and P V, 2 x head_dim
     * FLOPs each, at the dense peak, and one exponential on the SFU, 16 a
     * clock per SM (CUDA C++ Programming Guide, arithmetic instruction
     * throughput, compute capability 5.x-9.0) */
    double d = head_dim, peak = dev->peak_tflops * 1e12;
    double exp_rate = dev->sms * 16.0 * dev->clock_ghz * 1e9;
    double t = 4.0 * d / peak + 1.0 / exp_rate;
    return 4.0 * d / t / 1e12;
}

static cpc_status *plan_device(const cpc_plan *plan, cpc_device_profile *out,
                               cpc_measurements *m)
{
    const char *dev = plan->cluster.device ? plan->cluster.device : "h100-sxm";
    if (!cpc_device_preset(dev, out)) {
        char names[256] = "";
        size_t o = 0;
        for (int i = 0; cpc_device_preset_names[i] && o < sizeof names - 20; i++)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "",
                                  cpc_device_preset_names[i]);
        return cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, cpc_plan_span(plan, "cluster.device", true),
                        "unknown device '%s' (%s)", dev, names);
    }
    if (out->arch > 0) {
        /* the plan's runtime on a GPU preset (cost.h ATTENTION KERNELS, HOST) */
        out->attn_tflops *= cpc_attn_kernel_factor(plan->runtime.attention_kernel, out->arch,
                                                   plan->model.head_dim);
        double ceil_tflops = cpc_attn_ceiling(out, plan->runtime.attention_kernel, plan->model.head_dim);
        if (ceil_tflops > 0 && out->attn_tflops > ceil_tflops)
            out->attn_tflops = ceil_tflops;
        host_costs(plan->runtime.framework, &out->host_layer_us, &out->host_op_us);
    }
    char path[4096];
    if (cpc_plan_profile_path(plan, path, sizeof path) &&
        !(plan->cluster.profile_pending && access(path, F_OK) != 0 && errno == ENOENT)) {
        cpc_status *st = cpc_profile_read_measured(path, out, m);
        if (st)
            return st;
    }
    if (plan->cluster.memory_gb > 0)
        out->memory_gb = plan->cluster.memory_gb;
    return NULL;
}

cpc_status *cpc_plan_device(const cpc_plan *plan, cpc_device_profile *out)
{
    return plan_device(plan, out, NULL);
}

/* T5-XXL's encoder (google/t5-v1_1-xxl encoder weights, as FLUX, SD3, CogVideoX and
 * PixArt load it): the text encoder of cost.h PIPELINE when the plan names none. */
#define CPC_TEXT_ENCODER_DEFAULT INT64_C(4762310656)

/* ---- pricing -------------------------------------------------------------------- */

/* Pairs (x, y), x in [q0, q1), y in [k0, k1), y <= x:  sum over x of
 * clamp(x + 1 - k0, 0, k1 - k0), an arithmetic series then a constant. */
static double causal_pairs(int64_t q0, int64_t q1, int64_t k0, int64_t k1)
{
    double lk = (double)(k1 - k0), total = 0;
    /* x in [max(q0, k0), min(q1, k1 - 1)): f(x) = x + 1 - k0, from a to b */
    int64_t x0 = q0 > k0 ? q0 : k0, x1 = q1 < k1 - 1 ? q1 : k1 - 1;
    if (x1 > x0) {
        double a = (double)(x0 + 1 - k0), b = (double)(x1 - k0), n = (double)(x1 - x0);
        total += n * (a + b) / 2.0;
    }
    /* x >= k1 - 1: the whole key run */
    int64_t y0 = q0 > k1 - 1 ? q0 : k1 - 1;
    if (q1 > y0)
        total += (double)(q1 - y0) * lk;
    return total;
}

/* Key runs sorted by start and disjoint (what layouts give): the fast path
 * of cpc_visible_pairs can binary-search them. */
static bool runs_sorted_disjoint(const cpc_run *k, int nk)
{
    for (int j = 1; j < nk; j++)
        if (k[j].start < k[j - 1].start + k[j - 1].len)
            return false;
    return true;
}

/* First index j in [0, nk) with k[j].start + k[j].len > x (nk if none); k
 * sorted and disjoint, so the ends are increasing. */
static int first_run_ending_after(const cpc_run *k, int nk, int64_t x)
{
    int lo = 0, hi = nk;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (k[mid].start + k[mid].len > x)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static int cmp_run_start(const void *a, const void *b)
{
    const cpc_run *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

double cpc_visible_pairs(const cpc_run *q, int nq, const cpc_run *k, int nk, bool causal)
{
    double total = 0;
    bool qsorted = true;
    for (int i = 1; i < nq && qsorted; i++)
        qsorted = q[i].start >= q[i - 1].start;
    if (causal && (int64_t)nq * nk > 4096 && (!runs_sorted_disjoint(k, nk) || !qsorted)) {
        /* a zigzag Ulysses rank's runs come in member order (each member's front and back
         * chunk): the same sets sorted by start (the pairs do not depend on the order), when
         * disjoint, take the fast path below in O((nq + nk) log nk) */
        cpc_run *ks = malloc((size_t)(nk + nq) * sizeof *ks);
        if (ks) {
            cpc_run *qs = ks + nk;
            memcpy(ks, k, (size_t)nk * sizeof *ks);
            memcpy(qs, q, (size_t)nq * sizeof *qs);
            qsort(ks, (size_t)nk, sizeof *ks, cmp_run_start);
            qsort(qs, (size_t)nq, sizeof *qs, cmp_run_start);
            total = runs_sorted_disjoint(ks, nk) ? cpc_visible_pairs(qs, nq, ks, nk, causal) : -1;
            free(ks);
            if (total >= 0)
                return total;
            total = 0;
        }
    }
    if (!causal) {
        double tq = 0, tk = 0;
        for (int i = 0; i < nq; i++)
            tq += (double)q[i].len;
        for (int j = 0; j < nk; j++)
            tk += (double)k[j].len;
        return tq * tk;
    }
    if ((int64_t)nq * nk <= 4096 || !runs_sorted_disjoint(k, nk)) {
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < nk; j++)
                total += causal_pairs(q[i].start, q[i].start + q[i].len, k[j].start, k[j].start + k[j].len);
        return total;
    }
    /* Causal over many runs (a Ulysses rank holds U runs of the sequence):
     * for a query run [q0, q1), key runs that end at or before q0 + 1 are
     * seen whole by every row (a prefix sum), runs that start at or after q1
     * not at all, and only the runs in between need the closed form, so the
     * cost is O((nq + overlaps) log nk), not O(nq * nk). */
    double prefix = 0; /* keys in runs [0, done) */
    int done = 0;
    for (int i = 0; i < nq; i++) {
        int64_t q0 = q[i].start, q1 = q[i].start + q[i].len;
        if (q1 <= q0)
            continue;
        int whole = first_run_ending_after(k, nk, q0 + 1); /* runs [0, whole) end <= q0 + 1 */
        /* prefix sum of [0, whole): move `done` there (query runs need not be sorted) */
        if (whole >= done)
            for (; done < whole; done++)
                prefix += (double)k[done].len;
        else
            for (; done > whole; done--)
                prefix -= (double)k[done - 1].len;
        total += (double)(q1 - q0) * prefix;
        for (int j = whole; j < nk && k[j].start < q1; j++)
            total += causal_pairs(q0, q1, k[j].start, k[j].start + k[j].len);
    }
    return total;
}

typedef struct {
    const cpc_plan *plan;
    const cpc_program *prog;
    const cpc_device_profile *dev;
    const cpc_layout *L;
    cpc_coords c;
    int *tag;            /* content tag per buffer (ring block), -1 = shard / n.a. */
    double t_comp, t_comm; /* seconds */
    double comp_busy;    /* seconds of compute */
    double pending[64];  /* completion time per request tag (mod 64) */
    int64_t sent;
    double flops;
    cpc_run *runs_a, *runs_b;
    int max_runs;
    double compute_scale; /* >1 when ranks share cores */
    int64_t stage_send, stage_recv; /* all-to-all staging the executor allocates */
    double comm_scale;    /* the same on a CPU device with `cores` (copies use the cores), else 1 */
    double host_ops;      /* ops the serving framework's host issues (WHOLE STEP) */
    double attn_busy;     /* seconds of attn / attn_bwd ops (part of comp_busy) */
    int64_t *head_sum;    /* per buffer: its heads summed over the U members, -1 = not
                             yet (the same for every rank priced: shared) */
    int64_t block_shards; /* this rank's ring block's shard tokens summed over the U
                             members, -1 = not yet */
} pricer;

static bool spans_nodes(const cpc_layout *L, int gpn, cpc_group g, const cpc_coords *c)
{
    if (gpn <= 0)
        return false;
    int first = -1;
    int n = g == CPC_GROUP_RING ? L->R : g == CPC_GROUP_ULYSSES ? L->U : L->P;
    for (int j = 0; j < n; j++) {
        int64_t p = g == CPC_GROUP_RING ? j * (int64_t)L->U + c->u
                  : g == CPC_GROUP_ULYSSES ? c->r * (int64_t)L->U + j : j;
        int node = (int)(p / gpn);
        if (first < 0)
            first = node;
        else if (node != first)
            return true;
    }
    return false;
}

/* Tokens each of RU ranks runs the model's dense layers on: its share of
 * the sharded segments plus every replicated segment whole (layout.h: the
 * replicated text's projections and MLP run on every rank, as in xDiT). */
static double rank_tokens(const cpc_plan *plan, double RU)
{
    double rep = 0;
    for (int i = 0; i < plan->input.n_segments; i++)
        if (plan->input.segments[i].replicate)
            rep += (double)plan->input.segments[i].tokens;
    return ((double)plan->input.total_tokens - rep) / RU + rep;
}

/* Tokens held by buffer b now (its content). */
static int64_t buf_tokens(const pricer *pr, int b)
{
    const cpc_buffer *B = &pr->prog->buffers[b];
    const cpc_layout *L = pr->L;
    switch (B->tokens) {
    case CPC_TOK_SHARD: return cpc_layout_shard_tokens(L, (int)pr->c.p);
    case CPC_TOK_BLOCK: return cpc_layout_block_tokens(L, pr->tag[b] >= 0 ? pr->tag[b] : (int)pr->c.r);
    case CPC_TOK_ALL: return L->R == 1 ? cpc_layout_block_tokens(L, 0)
                                       : cpc_layout_block_offset(L, L->R - 1) + cpc_layout_block_tokens(L, L->R - 1);
    case CPC_TOK_KV: return cpc_layout_kv_rows(L); /* cross-attention K/V, or replicated rows */
    default: return 0;
    }
}

static int buf_heads(const pricer *pr, int b, int u)
{
    int off = 0, n = 0;
    cpc_buffer_heads(pr->prog, b, u, &off, &n);
    return n;
}

static int64_t buf_bytes(const pricer *pr, int b)
{
    const cpc_buffer *B = &pr->prog->buffers[b];
    int64_t per_tok = (int64_t)buf_heads(pr, b, (int)pr->c.u) * cpc_buffer_elem_size(pr->prog, b);
    if (B->role != CPC_ROLE_LSE)
        per_tok *= pr->L->D;
    return (int64_t)pr->L->B * buf_tokens(pr, b) * per_tok;
}

/* Ring block i's token set, for pricing: with the zigzag layout its U
 * members' front chunks i*U .. i*U+U-1 and back chunks are two ranges (one
 * when they meet), sorted, in O(1).  The buffer's row order (member by
 * member, cpc_layout_block_runs: 2U runs) does not change what is seen, and
 * the 2U unsorted runs cost a sort per attention op and sampled rank (a
 * causal Ulysses training plan's check at 65536 ranks: 20 s). */
static int block_set_runs(const cpc_layout *L, int i, cpc_run *out, int max)
{
    if (!L->zigzag || i < 0 || i >= L->R || max < 2)
        return cpc_layout_block_runs(L, i, out, max);
    int64_t c = L->S / (2 * (int64_t)L->P), lo = (int64_t)i * L->U, hi = 2 * (int64_t)L->P - lo - L->U;
    out[0] = (cpc_run){lo * c, (int64_t)L->U * c};
    out[1] = (cpc_run){hi * c, (int64_t)L->U * c};
    if (out[0].start + out[0].len == out[1].start) {
        out[0].len += out[1].len;
        return 1;
    }
    return 2;
}

static int buf_runs(const pricer *pr, int b, int block, cpc_run *out)
{
    const cpc_buffer *B = &pr->prog->buffers[b];
    const cpc_layout *L = pr->L;
    switch (B->tokens) {
    case CPC_TOK_SHARD: return cpc_layout_shard_runs(L, (int)pr->c.p, out, pr->max_runs);
    case CPC_TOK_BLOCK:
        return block_set_runs(L, pr->tag[b] >= 0 ? pr->tag[b] : (int)pr->c.r, out, pr->max_runs);
    case CPC_TOK_ALL: return block_set_runs(L, block, out, pr->max_runs);
    case CPC_TOK_KV: return cpc_layout_kv_runs(L, out, pr->max_runs);
    default: return 0;
    }
}

static double link_bw(const pricer *pr, cpc_group g, bool p2p, double *lat_s)
{
    bool inter = spans_nodes(pr->L, pr->plan->cluster.gpus_per_node, g, &pr->c);
    const cpc_device_profile *d = pr->dev;
    *lat_s = (inter ? d->inter_latency_us : d->intra_latency_us) * 1e-6;
    double gbps = inter ? d->inter_gbps : p2p ? d->intra_p2p_gbps : d->intra_gbps;
    return gbps > 0 ? gbps * 1e9 : 1e9;
}

static void compute(pricer *pr, double seconds)
{
    seconds = seconds * pr->compute_scale + pr->dev->op_overhead_us * 1e-6;
    pr->t_comp += seconds;
    pr->comp_busy += seconds;
}

static double mem_time(const pricer *pr, int64_t bytes)
{
    return (double)bytes / (pr->dev->mem_gbps * 1e9);
}

static cpc_status *eval(const pricer *pr, const cpc_expr *e, int64_t *v)
{
    return cpc_expr_eval(e, &pr->c, v);
}

static cpc_status *price_ops(pricer *pr, const cpc_op *ops, int n);

/* a loop: its body per step (long loops: the first and last 256 steps
 * exactly, the middle extrapolated, cost.h) */
static cpc_status *price_loop(pricer *pr, const cpc_op *op)
{
    cpc_status *st = NULL;
    int64_t n = 0;
    if ((st = eval(pr, op->count, &n)))
        return st;
    int64_t saved = pr->c.s;
    const int64_t edge = 256;
    if (n <= 2 * edge) {
        for (int64_t s = 0; s < n && !st; s++) {
            pr->c.s = s;
            st = price_ops(pr, op->body, op->n_body);
        }
    } else {
        /* first `edge` steps exactly, the middle extrapolated from their
         * average, the last `edge` steps exactly (see cost.h) */
        double t0c = pr->t_comp, t0m = pr->t_comm, b0 = pr->comp_busy, f0 = pr->flops,
               h0 = pr->host_ops, a0 = pr->attn_busy;
        int64_t s0 = pr->sent;
        for (int64_t s = 0; s < edge && !st; s++) {
            pr->c.s = s;
            st = price_ops(pr, op->body, op->n_body);
        }
        double k = (double)(n - 2 * edge) / (double)edge;
        double shift = (pr->t_comp - t0c) * k;
        pr->t_comp += shift;
        pr->t_comm += (pr->t_comm - t0m) * k;
        if (pr->t_comm < pr->t_comp - shift)
            pr->t_comm = pr->t_comp - shift;
        for (int i = 0; i < 64; i++)
            if (pr->pending[i] > 0)
                pr->pending[i] += shift;
        pr->comp_busy += (pr->comp_busy - b0) * k;
        pr->flops += (pr->flops - f0) * k;
        pr->host_ops += (pr->host_ops - h0) * k;
        pr->attn_busy += (pr->attn_busy - a0) * k;
        pr->sent += (int64_t)((double)(pr->sent - s0) * k);
        for (int64_t s = n - edge; s < n && !st; s++) {
            pr->c.s = s;
            st = price_ops(pr, op->body, op->n_body);
        }
    }
    pr->c.s = saved;
    return st;
}

/* init_acc: writes its buffers (memory-bound; their new content, tags set
 * by the table's rule before the op is priced: price_op) */
static cpc_status *price_init_acc(pricer *pr, const cpc_op *op)
{
    for (int i = 0; i < op->n_in; i++)
        compute(pr, mem_time(pr, buf_bytes(pr, op->in[i])));
    for (int i = 0; i < op->n_out; i++)
        compute(pr, mem_time(pr, buf_bytes(pr, op->out[i])));
    return NULL;
}

/* LINEAR ATTENTION (cost.h): model.attention: linear (Sana's ReLU linear
 * attention, diffusers SanaLinearAttnProcessor2_0): per head, K^T V over the
 * block's keys (2 x keys x D x D FLOPs) and Q (K^T V) over its queries (2 x
 * queries x D x D), in float32 (the processor casts q, k, v to float32 before
 * its two matmuls), at the FP32 rate; and its element passes: ReLU on q and k,
 * the float32 casts, V padded with a row of ones (the normaliser), the
 * division and the cast back: ~4 float32 reads or writes of every element of
 * Q, K, V and O, at mem_gbps.  The slower of the two (skinny D-wide matmuls
 * are memory-bound at D = 32). */
static cpc_status *price_linear_attn(pricer *pr, const cpc_op *op, double mult, int64_t block,
                                     int nq, int nk)
{
    (void)block;
    const cpc_layout *L = pr->L;
    double tq = 0, tk = 0;
    for (int i = 0; i < nq; i++)
        tq += (double)pr->runs_a[i].len;
    for (int i = 0; i < nk; i++)
        tk += (double)pr->runs_b[i].len;
    double hq = buf_heads(pr, op->in[0], (int)pr->c.u);
    double flops = mult * 2.0 * L->B * (tq + tk) * hq * L->D * L->D;
    double rate = pr->dev->attn_tflops_fp32 > 0 ? pr->dev->attn_tflops_fp32 : pr->dev->attn_tflops;
    double bytes = mult * 4.0 * 4.0 * L->B * hq * L->D * (2.0 * tq + 2.0 * tk);
    double c = flops / (rate * 1e12), m = mem_time(pr, (int64_t)bytes);
    pr->flops += flops;
    double before = pr->comp_busy;
    compute(pr, c > m ? c : m);
    pr->attn_busy += pr->comp_busy - before;
    return NULL;
}

/* attn / attn_bwd: FLOPs of the visible (query, key) pairs at the attention
 * rate, plus the block's I/O (the backward: 2.5 x the forward's, BACKWARD.md) */
static cpc_status *price_attn(pricer *pr, const cpc_op *op)
{
    const cpc_layout *L = pr->L;
    cpc_status *st = NULL;
    if (op->n_in < 3)
        return NULL;
    const double mult = op->kind == CPC_OP_ATTN_BWD ? 2.5 : 1.0;
    int64_t block = 0;
    if (op->block && (st = eval(pr, op->block, &block)))
        return st;
    int nq = buf_runs(pr, op->in[0], 0, pr->runs_a);
    int nk = buf_runs(pr, op->in[1], (int)block, pr->runs_b);
    if (pr->plan->model.linear_attention)
        return price_linear_attn(pr, op, mult, block, nq, nk);
    double pairs = cpc_visible_pairs(pr->runs_a, nq, pr->runs_b, nk, L->causal);
    double flops = mult * 4.0 * L->B * pairs * buf_heads(pr, op->in[0], (int)pr->c.u) * L->D;
    double rate = (L->dtype == CPC_DTYPE_FP32 ? pr->dev->attn_tflops_fp32 : pr->dev->attn_tflops) * 1e12;
    pr->flops += flops;
    double io_s = 0;
    if (pr->dev->attn_io_gbps > 0) {
        /* the block's Q rows and K/V rows once, O and LSE once (fp32) */
        int64_t tq = 0, tk = 0;
        for (int i = 0; i < nq; i++)
            tq += pr->runs_a[i].len;
        for (int i = 0; i < nk; i++)
            tk += pr->runs_b[i].len;
        double hq = buf_heads(pr, op->in[0], (int)pr->c.u);
        double hk = buf_heads(pr, op->in[1], (int)pr->c.u);
        double es = cpc_dtype_size(L->dtype);
        double bytes = (double)L->B * ((double)tq * hq * L->D * es + 2.0 * (double)tk * hk * L->D * es +
                                       (double)tq * hq * (L->D + 1) * 4.0);
        io_s = mult * bytes / (pr->dev->attn_io_gbps * 1e9);
    }
    if (pr->dev->attn_softmax_gps > 0) /* the softmax of every visible score (cost.h) */
        io_s += mult * L->B * pairs * buf_heads(pr, op->in[0], (int)pr->c.u) /
                (pr->dev->attn_softmax_gps * 1e9);
    if (pr->dev->arch > 0) {
        /* GPU kernels (cost.h ATTENTION KERNELS): each query tile streams the
         * block's keys; its prologue, epilogue and softmax rescaling cost
         * about as much as 256 keys, so short key blocks (ring steps, short
         * sequences) run at keys / (keys + 256) of the long-sequence rate */
        double tk = 0;
        for (int i = 0; i < nk; i++)
            tk += (double)pr->runs_b[i].len;
        if (tk > 0)
            rate *= tk / (tk + 256.0);
    }
    double before = pr->comp_busy;
    compute(pr, flops / rate + io_s);
    pr->attn_busy += pr->comp_busy - before;
    return NULL;
}

/* delta / merge / copy / add: bytes read and written at the memory bandwidth
 * (an op that reads its outputs too, CPC_OPF_READS_OUT: merge, add, counts
 * them twice); every buffer pair of a copy */
static cpc_status *price_memory(pricer *pr, const cpc_op *op)
{
    int64_t bytes = 0;
    bool reads_out = (cpc_op_info_of(op->kind)->flags & CPC_OPF_READS_OUT) != 0;
    for (int i = 0; i < op->n_in; i++)
        bytes += buf_bytes(pr, op->in[i]);
    for (int i = 0; i < op->n_out; i++)
        bytes += buf_bytes(pr, op->out[i]) * (reads_out ? 2 : 1);
    compute(pr, mem_time(pr, bytes));
    return NULL;
}

/* send: one message on the group's link, completing at `pending[tag]` */
static cpc_status *price_send(pricer *pr, const cpc_op *op)
{
    int64_t bytes = 0;
    for (int i = 0; i < op->n_in; i++)
        bytes += buf_bytes(pr, op->in[i]);
    double lat;
    double bw = link_bw(pr, op->group, true, &lat);
    double start = pr->t_comp > pr->t_comm ? pr->t_comp : pr->t_comm;
    pr->t_comm = start + (lat + (double)bytes / bw) * pr->comm_scale;
    int t = op->tag & 63;
    if (pr->pending[t] < pr->t_comm)
        pr->pending[t] = pr->t_comm;
    pr->sent += bytes;
    return NULL;
}

/* wait: compute waits for the tag's messages */
static cpc_status *price_wait(pricer *pr, const cpc_op *op)
{
    int t = op->tag & 63;
    if (pr->t_comp < pr->pending[t])
        pr->t_comp = pr->pending[t];
    return NULL;
}

/* the NCCL point-to-point chunk an all-to-all part is pipelined in: NCCL's
 * defaults NCCL_P2P_NVL_CHUNKSIZE 512 KiB over NVLink, NCCL_P2P_PCI_CHUNKSIZE
 * and NCCL_P2P_NET_CHUNKSIZE 128 KiB over PCIe and the network (src/init.cc);
 * NVLink parts are the presets with an intra-node bus >= 100 GB/s; 0 for
 * profiles without a GPU architecture (the CPU transport) */
static double a2a_chunk_bytes(const pricer *pr)
{
    if (pr->dev->arch <= 0)
        return 0.0;
    bool inter = spans_nodes(pr->L, pr->plan->cluster.gpus_per_node, CPC_GROUP_ULYSSES, &pr->c);
    return (inter || pr->dev->intra_gbps < 100) ? 131072.0 : 524288.0;
}

/* all_to_all: the bytes this member sends over the ulysses link, plus
 * pack/unpack, for every buffer pair (one exchange per pair, as the executor
 * runs them) */
static cpc_status *price_all_to_all(pricer *pr, const cpc_op *op)
{
    const cpc_layout *L = pr->L;
    for (int i = 0; i < op->n_in && i < op->n_out; i++) {
        int b = op->in[i], o = op->out[i];
        const cpc_buffer *B = &pr->prog->buffers[b];
        int64_t per_head = (int64_t)L->B * (B->role == CPC_ROLE_LSE ? 1 : L->D) *
                           cpc_buffer_elem_size(pr->prog, b);
        /* the sum over the other members j != u, in closed form from sums over
         * all members that are computed once (O(U) once, not per op and rank:
         * Ulysses at 65536 members spent 0.9 s here) */
        int64_t bytes, own_shard = cpc_layout_shard_tokens(L, (int)(pr->c.r * L->U + pr->c.u));
        if (op->dir == CPC_A2A_SEQ_TO_HEADS) { /* member j gets its head part */
            if (pr->head_sum[o] < 0) {
                pr->head_sum[o] = 0;
                for (int j = 0; j < L->U; j++)
                    pr->head_sum[o] += buf_heads(pr, o, j);
            }
            bytes = cpc_layout_shard_tokens(L, (int)pr->c.p) *
                    (pr->head_sum[o] - buf_heads(pr, o, (int)pr->c.u)) * per_head;
        } else if (B->tokens == CPC_TOK_KV) { /* replicated rows: this member's heads to all */
            bytes = (int64_t)(L->U - 1) * cpc_layout_kv_rows(L) * buf_heads(pr, b, (int)pr->c.u) * per_head;
        } else {
            if (pr->block_shards < 0) {
                pr->block_shards = 0;
                for (int j = 0; j < L->U; j++)
                    pr->block_shards += cpc_layout_shard_tokens(L, (int)(pr->c.r * L->U + j));
            }
            bytes = (pr->block_shards - own_shard) * buf_heads(pr, b, (int)pr->c.u) * per_head;
        }
        double lat;
        double bw = link_bw(pr, CPC_GROUP_ULYSSES, false, &lat);
        double start = pr->t_comp > pr->t_comm ? pr->t_comp : pr->t_comm;
        /* pack + unpack touch the whole buffer twice */
        /* each peer's part is sent in NCCL chunks through a pipeline: the first
         * chunk's time is not hidden, so a part of m bytes costs (m + chunk) / bw
         * (cost.h; GPU presets only, the calibrated CPU transport has no chunks) */
        double peer = L->U > 1 ? (double)bytes / (L->U - 1) : 0.0;
        double fill = peer > 0 ? a2a_chunk_bytes(pr) / peer : 0.0;
        double t = start + (lat + (double)bytes / bw * (1.0 + fill)) * pr->comm_scale +
                   pr->dev->op_overhead_us * 2e-6 + 2.0 * mem_time(pr, buf_bytes(pr, b)) * pr->compute_scale;
        pr->t_comp = pr->t_comm = t;
        pr->sent += bytes;
        /* the executor's pack/unpack space (runtime/executor.c): with B == 1
         * seq_to_heads stages only its send side, heads_to_seq its receive */
        int64_t in_b = buf_bytes(pr, b), out_b = buf_bytes(pr, o);
        bool b1 = L->B == 1;
        if (!(b1 && op->dir == CPC_A2A_HEADS_TO_SEQ) && in_b > pr->stage_send)
            pr->stage_send = in_b;
        if (!(b1 && op->dir == CPC_A2A_SEQ_TO_HEADS) && out_b > pr->stage_recv)
            pr->stage_recv = out_b;
    }
    return NULL;
}

/* A blocking collective over group g: compute and communication both wait
 * for it, from when both are free, for n_lat latencies of g's link plus
 * `bytes` over it (comm_scale), plus mem_s seconds of memory work
 * (compute_scale); `sent` bytes count as this rank's. */
static void collective(pricer *pr, cpc_group g, double n_lat, int64_t bytes, double mem_s, int64_t sent)
{
    double lat;
    double bw = link_bw(pr, g, false, &lat);
    double start = pr->t_comp > pr->t_comm ? pr->t_comp : pr->t_comm;
    pr->t_comp = pr->t_comm =
        start + (lat * n_lat + (double)bytes / bw) * pr->comm_scale + mem_s * pr->compute_scale;
    pr->sent += sent;
}

/* all_gather: the other blocks over the ring link, for every buffer pair */
static cpc_status *price_all_gather(pricer *pr, const cpc_op *op)
{
    const cpc_layout *L = pr->L;
    for (int i = 0; i < op->n_in && i < op->n_out; i++) {
        int64_t own = buf_bytes(pr, op->in[i]);
        int64_t per_tok = own / (buf_tokens(pr, op->in[i]) > 0 ? buf_tokens(pr, op->in[i]) : 1);
        int64_t total = 0;
        for (int j = 0; j < L->R; j++)
            total += cpc_layout_block_tokens(L, j) * per_tok;
        collective(pr, CPC_GROUP_RING, L->R - 1, total - own, 0.0, own * (L->R - 1));
    }
    return NULL;
}

/* reduce_scatter (backward, all-gather ring): block j's fp32 slice to each
 * member j over the ring link, plus pack and the sum of R parts */
static cpc_status *price_reduce_scatter(pricer *pr, const cpc_op *op)
{
    const cpc_layout *L = pr->L;
    for (int i = 0; i < op->n_in && i < op->n_out; i++) {
        int64_t all = buf_bytes(pr, op->in[i]);
        int64_t tot = buf_tokens(pr, op->in[i]);
        int64_t per_tok = all / (tot > 0 ? tot : 1);
        int r = (int)pr->c.r;
        int64_t out = cpc_layout_block_tokens(L, r) * per_tok;
        int64_t bytes = all - out; /* the other members' slices */
        collective(pr, CPC_GROUP_RING, L->R - 1, bytes, mem_time(pr, all) + mem_time(pr, out * L->R), bytes);
        if (all > pr->stage_send)
            pr->stage_send = all;
        if (out * L->R > pr->stage_recv)
            pr->stage_recv = out * L->R;
    }
    return NULL;
}

/* all_reduce (backward, cross-attention dK/dV, or the replicated segments'
 * dq/dk/dv): reduce-scatter of the buffer's token chunks (as the executor
 * splits them) then all-gather over the world link, plus pack and sum */
static cpc_status *price_all_reduce(pricer *pr, const cpc_op *op)
{
    const cpc_layout *L = pr->L;
    for (int i = 0; i < op->n_in && i < op->n_out; i++) {
        int64_t all = buf_bytes(pr, op->in[i]);
        int64_t tot = buf_tokens(pr, op->in[i]);
        int64_t per_tok = all / (tot > 0 ? tot : 1);
        int64_t mine = cpc_split_len(tot, L->P, pr->c.p) * per_tok;
        int64_t bytes = (all - mine) + mine * (L->P - 1);
        collective(pr, CPC_GROUP_WORLD, 2.0 * (L->P - 1), bytes,
                   2.0 * mem_time(pr, all) + mem_time(pr, mine * L->P), bytes);
        if (all > pr->stage_send)
            pr->stage_send = all;
        if (all > pr->stage_recv)
            pr->stage_recv = all;
        if (mine * L->P > pr->stage_recv)
            pr->stage_recv = mine * L->P;
    }
    return NULL;
}

/* barrier: one latency of its group */
static cpc_status *price_barrier(pricer *pr, const cpc_op *op)
{
    collective(pr, op->group, 1, 0, 0.0, 0);
    return NULL;
}

/* The op table's tag rule (cpc_op_out_tag), applied to the pricer's content
 * tags before the op is priced: an op's outputs are priced at their new
 * content (init_acc's block accumulators, a copy's rows). */
static cpc_status *price_tags(pricer *pr, const cpc_op *op, const cpc_op_info *info)
{
    int64_t block = -1;
    cpc_status *st;
    if (info->tags != CPC_TAGR_KEEP && op->block && (st = eval(pr, op->block, &block)))
        return st;
    cpc_op_apply_tags(pr->prog, op, &pr->c, block, pr->tag);
    return NULL;
}

/* One op: its `when`, the host's launches and tags from the op table, then
 * the table's price rule (cpc_op_info.cost; cost.c keeps no table of its
 * own). */
static cpc_status *price_op(pricer *pr, const cpc_op *op)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    if (!info)
        return NULL;
    cpc_status *st;
    if (op->when) {
        int64_t w = 0;
        if ((st = eval(pr, op->when, &w)))
            return st;
        if (!w)
            return NULL;
    }
    /* the host's launches per op (op table: a merge is the output and the LSE update) */
    pr->host_ops += info->host_launches;
    if ((st = price_tags(pr, op, info)))
        return st;
    switch (info->cost) {
    case CPC_COST_NONE: return NULL;
    case CPC_COST_LOOP: return price_loop(pr, op);
    case CPC_COST_INIT: return price_init_acc(pr, op);
    case CPC_COST_ATTN: return price_attn(pr, op);
    case CPC_COST_MEMORY: return price_memory(pr, op);
    case CPC_COST_SEND: return price_send(pr, op);
    case CPC_COST_WAIT: return price_wait(pr, op);
    case CPC_COST_ALL_TO_ALL: return price_all_to_all(pr, op);
    case CPC_COST_ALL_GATHER: return price_all_gather(pr, op);
    case CPC_COST_REDUCE_SCATTER: return price_reduce_scatter(pr, op);
    case CPC_COST_ALL_REDUCE: return price_all_reduce(pr, op);
    case CPC_COST_BARRIER: return price_barrier(pr, op);
    case CPC_COST__COUNT: break;
    }
    return NULL;
}

static cpc_status *price_ops(pricer *pr, const cpc_op *ops, int n)
{
    for (int i = 0; i < n; i++) {
        cpc_status *st = price_op(pr, &ops[i]);
        if (st)
            return st;
    }
    return NULL;
}

/* Ranks priced: every rank up to 64, else a sample (see cost.h): the first
 * and last 8 members of ring group 0 (u = 0) and of ulysses group 0 (r = 0),
 * and the last rank. */
#define CPC_PRICE_ALL_RANKS 64
#define CPC_PRICE_MAX_SAMPLE 40
static int pick_ranks(const cpc_layout *L, int *out, int max)
{
    int n = 0;
    if (L->P <= CPC_PRICE_ALL_RANKS) {
        for (int p = 0; p < L->P && n < max; p++)
            out[n++] = p;
        return n;
    }
    for (int r = 0; r < L->R && n < max; r++) {
        if (r >= 8 && r < L->R - 8)
            continue;
        out[n++] = r * L->U; /* ring group 0 (u = 0) */
    }
    for (int u = 1; u < L->U && n < max; u++) {
        if (u >= 8 && u < L->U - 8)
            continue;
        out[n++] = u; /* ulysses group 0 (r = 0) */
    }
    if (n < max && L->P - 1 != out[n - 1])
        out[n++] = L->P - 1;
    return n;
}

/* Roofline time factor of a transformer block's GEMMs (cost.h WHOLE STEP,
 * GEMM ROOFLINE): sum over the four GEMM families of
 * max(FLOPs / gemm, bytes / mem) over their FLOPs / gemm; >= 1. */
double cpc_gemm_roofline_factor(double tokens, double hidden, int T, double elem_bytes,
                                double gemm_flops_s, double mem_bytes_s)
{
    if (!(tokens > 0) || !(hidden > 0) || T < 1 || !(gemm_flops_s > 0) || !(mem_bytes_s > 0))
        return 1.0;
    double h = hidden, M = tokens;
    /* {K, N} per rank: QKV (h, 3h/T), out projection (h/T, h), MLP up (h, 4h/T),
     * MLP down (4h/T, h) */
    const double kn[4][2] = {{h, 3 * h / T}, {h / T, h}, {h, 4 * h / T}, {4 * h / T, h}};
    double ideal = 0, real = 0;
    for (int i = 0; i < 4; i++) {
        double K = kn[i][0], N = kn[i][1];
        double c = 2.0 * M * N * K / gemm_flops_s;
        double m = elem_bytes * (M * K + K * N + M * N) / mem_bytes_s;
        ideal += c;
        real += c > m ? c : m;
    }
    return ideal > 0 ? real / ideal : 1.0;
}

/* The model's width (cost.h WHOLE STEP): model.hidden, else heads x T x head_dim
 * (`plan` may be a TP sub-plan, whose heads are H / T). */
static double model_hidden(const cpc_plan *plan)
{
    if (plan->model.hidden > 0)
        return (double)plan->model.hidden;
    int T = plan->parallel.tp_degree > 0 ? plan->parallel.tp_degree : 1;
    return (double)plan->model.heads * T * plan->model.head_dim;
}

/* Per-token weights of one block from the structure keys (cost.h WHOLE STEP). */
static double block_weights_structured(const cpc_plan *plan, double h)
{
    double r = plan->model.mlp_ratio > 0 ? plan->model.mlp_ratio : 4.0;
    double act = plan->model.active_experts > 0 ? plan->model.active_experts : 1;
    double w = 4.0 * h * h + act * (plan->model.mlp_gated ? 3.0 : 2.0) * r * h * h;
    if (plan->model.cross_attention_tokens > 0)
        w += 2.0 * h * h;
    return w;
}

double cpc_weights_per_token(const cpc_plan *plan)
{
    if (plan->model.parameters <= 0)
        return 0;
    double hidden = model_hidden(plan);
    double layers = plan->model.layers > 0 ? plan->model.layers : 1;
    if (plan->model.structure_given)
        return block_weights_structured(plan, hidden) * layers;
    double w = 12.0 * hidden * hidden * layers;
    return w < (double)plan->model.parameters ? w : (double)plan->model.parameters;
}

double cpc_dual_stream_layers(const cpc_plan *plan)
{
    if (plan->model.dual_stream_layers > 0 || plan->model.structure_given || plan->model.parameters <= 0)
        return plan->model.dual_stream_layers;
    /* from the weights per block: a single-stream block holds ~15 h^2 (QKV,
     * output and a 4x MLP 12 h^2, adaLN modulation 3 h^2), a dual-stream one
     * ~36 h^2 (both streams' 12 h^2 and 6 h^2 modulation), so a fraction
     * x = (parameters / layers / h^2 - 15) / 21 of the blocks is dual-stream
     * (FLUX.1: 0.33, 19 of 57; QwenImage: 1; Wan, CogVideoX: 0) */
    double h = model_hidden(plan);
    double layers = plan->model.layers > 0 ? plan->model.layers : 1;
    double x = ((double)plan->model.parameters / layers / (h * h) - 15.0) / 21.0;
    if (x < 0)
        x = 0;
    if (x > 1)
        x = 1;
    return x * layers;
}

/* GEMM EFFICIENCY (cost.h): the fraction of gemm_tflops one GEMM of M x N x K
 * reaches.  Wave quantisation: the output is cut into tiles, the tiles run in
 * waves of one tile per SM, and the last wave is partly idle; cuBLAS picks the
 * tile that loses least (large tiles run fastest: on Hopper/Blackwell 128x256
 * at 1.0, 128x128 at 0.95, 64x128 at 0.85; on Ampere/Ada 128x128 at 1.0,
 * 128x64 at 0.92, 64x64 at 0.8 of the large-GEMM rate).  Short K: each tile's
 * prologue and epilogue cost about as much as 64 steps of K, so K / (K + 64). */
static double gemm_shape_eff(const cpc_device_profile *dev, double M, double N, double K)
{
    static const double hop[3][3] = {{128, 256, 1.0}, {128, 128, 0.95}, {64, 128, 0.85}};
    static const double amp[3][3] = {{128, 128, 1.0}, {128, 64, 0.92}, {64, 64, 0.80}};
    const double(*t)[3] = dev->arch >= 90 ? hop : amp;
    double sms = dev->sms > 0 ? dev->sms : 1, best = 0;
    for (int i = 0; i < 3; i++) {
        double tiles = ceil(M / t[i][0]) * ceil(N / t[i][1]);
        double waves = ceil(tiles / sms);
        double e = tiles / (waves * sms) * t[i][2];
        if (e > best)
            best = e;
    }
    return best * K / (K + 64.0);
}

/* One GEMM's time, s: max of its FLOPs at the shape's rate and its bytes at the
 * memory bandwidth (the roofline). */
static double gemm_time(const cpc_device_profile *dev, double M, double N, double K, double es,
                        double rate, double mem, double *flops)
{
    if (!(M > 0) || !(N > 0) || !(K > 0))
        return 0;
    double f = 2.0 * M * N * K;
    *flops += f;
    double c = f / (rate * gemm_shape_eff(dev, M, N, K));
    double m = es * (M * K + K * N + M * N) / mem;
    return c > m ? c : m;
}

/* HOST (cost.h): host time per transformer block and per op of the attention
 * program, by runtime.framework.  The per-block figures hold FLUX.1-dev's
 * host-bound totals (cost.h HOST) over its 57 + 0.1 x 19 block-equivalents. */
static void host_costs(cpc_framework f, double *layer_us, double *op_us)
{
    switch (f) {
    case CPC_FRAMEWORK_COMPILED: *layer_us = 46, *op_us = 10; break;
    case CPC_FRAMEWORK_SGLANG: *layer_us = 581, *op_us = 120; break;
    case CPC_FRAMEWORK_DIFFUSERS: *layer_us = 952, *op_us = 225; break;
    case CPC_FRAMEWORK_XDIT: *layer_us = 2253, *op_us = 50; break;
    default: *layer_us = 1637, *op_us = 110; break;
    }
}

/* MEMORY-BOUND WORK (cost.h): hidden-sized element passes (reads + writes) per
 * token per block that TP does not split (norms, modulation, gated residuals)
 * and that it splits (q/k norms, RoPE, attention layout copies), by framework. */
static void mem_passes(cpc_framework f, double *repl, double *split)
{
    switch (f) {
    case CPC_FRAMEWORK_COMPILED: *repl = 10, *split = 4; break;
    case CPC_FRAMEWORK_SGLANG: *repl = 14, *split = 8; break;
    default: *repl = 20, *split = 30; break;
    }
}

/* The whole forward step (cost.h WHOLE STEP).  `plan` is the plan one
 * (R x U) group prices: with cfg/tp degrees resolved, its batch is B / C and
 * its heads H / T (parallel.cfg_degree / tp_degree say C and T). */
static void price_step(const cpc_plan *plan, const cpc_device_profile *dev, double scale,
                       double attn_s_per_layer, cpc_prediction *out)
{
    double W = cpc_weights_per_token(plan);
    if (W <= 0)
        return;
    int T = plan->parallel.tp_degree > 0 ? plan->parallel.tp_degree : 1;
    double layers = plan->model.layers > 0 ? plan->model.layers : 1;
    double hidden = model_hidden(plan);
    double RU = plan->cluster.world_size > 0 ? plan->cluster.world_size : 1;
    double tokens = (double)plan->input.batch * rank_tokens(plan, RU);
    double gemm = (dev->gemm_tflops > 0 ? dev->gemm_tflops : dev->attn_tflops) * 1e12;
    if (plan->model.dtype == CPC_DTYPE_FP32 && dev->attn_tflops > 0)
        gemm *= dev->attn_tflops_fp32 / dev->attn_tflops;
    double es = cpc_dtype_size(plan->model.dtype);
    double mem = (dev->mem_gbps > 0 ? dev->mem_gbps : 1) * 1e9;
    double dense, roof = 1, mem_s = 0, gemm_flops = 0, cross_s = 0;
    if (dev->arch > 0) {
        /* GPU: every GEMM of a block by its shape (GEMM EFFICIENCY) */
        double h = hidden, M = tokens;
        double r = plan->model.mlp_ratio > 0 ? plan->model.mlp_ratio : 4.0;
        double g = plan->model.mlp_gated ? 2.0 : 1.0;
        double ne = plan->model.experts > 0 ? plan->model.experts : 1;
        double act = plan->model.active_experts > 0 ? plan->model.active_experts : 1;
        double Me = M * act / ne; /* rows per expert */
        double t = 0, f = 0;
        t += gemm_time(dev, M, 3 * h / T, h, es, gemm, mem, &f);         /* QKV */
        t += gemm_time(dev, M, h, h / T, es, gemm, mem, &f);             /* out projection */
        double fm = 0;
        double tm = gemm_time(dev, Me, g * r * h / T, h, es, gemm, mem, &fm) + /* MLP up (+gate) */
                    gemm_time(dev, Me, h, r * h / T, es, gemm, mem, &fm);      /* MLP down */
        t += tm * ne;
        f += fm * ne;
        if (plan->model.cross_attention_tokens > 0) {
            double Mt = (double)plan->input.batch * (double)plan->model.cross_attention_tokens;
            t += gemm_time(dev, M, h / T, h, es, gemm, mem, &f);         /* cross Q */
            t += gemm_time(dev, M, h, h / T, es, gemm, mem, &f);         /* cross O */
            t += gemm_time(dev, Mt, 2 * h / T, h, es, gemm, mem, &f);    /* text K, V */
        }
        double scale_w = 1.0;
        if (!plan->model.structure_given) {
            /* a generic block (4 h^2 + 8 h^2 per token) scaled to the weights a
             * token passes through (min(parameters / layers, 12 h^2)) */
            double nominal = 12.0 * h * h;
            scale_w = (W / layers) / nominal;
        }
        dense = t * scale_w * layers;
        gemm_flops = f * scale_w * layers;
        out->gemm_efficiency = dense > 0 && dev->peak_tflops > 0
                                   ? gemm_flops / dense / (dev->peak_tflops * 1e12) : 0;
        /* memory-bound work of the block: element passes over the hidden state,
         * plus the MLP activation (reads and writes its inner width; a gated one
         * reads two) */
        double repl = 0, split = 0;
        mem_passes(plan->runtime.framework, &repl, &split);
        double passes = repl + (split + (g + 1.0) * r * act) / T;
        mem_s = layers * M * passes * h * es / mem;
        if (plan->model.cross_attention_tokens > 0) { /* cross-attention over the text */
            double lt = (double)plan->model.cross_attention_tokens;
            cross_s = layers * 4.0 * M * lt * h / T / (dev->attn_tflops * 1e12 * lt / (lt + 256.0));
        }
    } else {
        roof = cpc_gemm_roofline_factor(tokens, hidden, T, es, gemm, mem);
        dense = 2.0 * W * tokens / T / gemm * roof;
        gemm_flops = 2.0 * W * tokens / T;
    }
    double tp = 0, tp_host_ops = 0, tp_comm = 0;
    if (T > 1) {
        /* Megatron-style: an all-reduce after attention's output projection
         * and one after the MLP's down projection, per block, each of
         * tokens x hidden (ring all-reduce: 2 (T-1) latency steps + bytes x
         * 2 (T-1) / T at the bus bandwidth), each a kernel launch on the
         * device and a collective call on the host; TP is the innermost
         * axis, so a TP group sits inside a node (T <= gpus_per_node) */
        double lat = dev->intra_latency_us * 1e-6;
        double gbps = dev->intra_gbps > 0 ? dev->intra_gbps * 1e9 : 1e9;
        double bytes = tokens * hidden * es;
        double ar = 2.0 * (T - 1) * lat + bytes * 2.0 * (T - 1) / T / gbps + dev->op_overhead_us * 1e-6;
        tp_comm = layers * 2.0 * ar;
        if (dev->arch <= 0) {
            /* the block's norms, modulation and gated residual adds act on the
             * whole hidden state of every token on every TP rank: 14 x hidden
             * elements read or written per token per block; at T = 1 that work
             * is inside the GEMM efficiency and divided like the GEMMs, so TP
             * brings back (1 - 1/T) of it */
            double repl = tokens * 14.0 * hidden * es * (1.0 - 1.0 / T) / mem;
            tp = tp_comm + layers * repl;
        } else {
            tp = tp_comm; /* the unsplit work is in mem_s (repl passes) */
        }
        /* host: the two all-reduce calls, and in an eager framework the
         * sharded projections' tensor-parallel dispatch (DTensor / the TP
         * plan's hooks redistribute QKV, out, MLP up and down: ~6 more
         * PyTorch calls per block) */
        tp_host_ops = 2.0 + (dev->arch > 0 && plan->runtime.framework != CPC_FRAMEWORK_COMPILED ? 6.0 : 0.0);
    }
    double host_layer = dev->host_layer_us, host_op = dev->host_op_us;
    /* a dual-stream block costs 1.1 x a single-stream one on the host (HOST:
     * cache-dit's H100 FLUX.1-dev and Qwen-Image rows) */
    double dual = cpc_dual_stream_layers(plan);
    double host = (layers * (host_layer + (out->host_ops_per_layer + tp_host_ops) * host_op) +
                   dual * 0.1 * host_layer) * 1e-6;
    /* classifier-free guidance run as two transformer calls per step
     * (runtime.cfg: sequential, the default; HOST): an even group batch is
     * dispatched twice, each call half the rows (the device work is the same) */
    int B = plan->input.batch > 0 ? plan->input.batch : 1;
    if (!plan->runtime.cfg_batched && B >= 2 && B % 2 == 0)
        host *= 2.0;
    double attn_total = attn_s_per_layer * layers;            /* already core-scaled */
    double prog = out->ms_per_forward * 1e-3;                 /* attention program, whole */
    double prog_other = prog - attn_total;                    /* its merges, packs, exposed comm */
    if (prog_other < 0)
        prog_other = 0;
    double comm_exposed = out->comm_ms_per_layer * 1e-3 * layers;
    if (comm_exposed > prog_other)
        comm_exposed = prog_other;
    double dense_all = (dense + tp + mem_s) * scale;
    double device = dense_all + prog + cross_s * scale;
    out->dense_ms_per_step = dense_all * 1e3;
    out->tp_ms_per_step = tp * scale * 1e3;
    out->gemm_roofline = roof;
    out->device_ms_per_step = device * 1e3;
    out->host_ms_per_step = host * 1e3;
    /* the host issues asynchronously: the step is the slower of the two, and
     * where they are close the device also waits for the host's slower
     * stretches (a smooth maximum, the 4-norm: equal times cost 1.19x one) */
    double step = dev->arch > 0 ? sqrt(sqrt(device * device * device * device + host * host * host * host))
                                : (device > host ? device : host);
    out->ms_per_step = step * 1e3;
    out->gemm_ms_per_step = dense * scale * 1e3;
    out->attn_ms_per_step = (attn_total + cross_s * scale) * 1e3;
    out->memory_ms_per_step = (mem_s * scale + (prog_other - comm_exposed)) * 1e3;
    out->comm_ms_per_step = (tp_comm * scale + comm_exposed) * 1e3;
    if (dev->arch <= 0) /* the CPU path's unsplit TP work sits in tp */
        out->memory_ms_per_step += (tp - tp_comm) * scale * 1e3;
    out->host_exposed_ms_per_step = (step - device) * 1e3;
    out->ms_per_image = plan->input.steps > 0 ? out->ms_per_step * plan->input.steps : 0;
}

/* PIPELINE (cost.h): the text encoder and the VAE decode, once per image or
 * video, on one GPU (the VAE over the ranks with runtime.vae_parallel). */
static void price_pipeline(const cpc_plan *plan, const cpc_device_profile *dev, int ranks,
                           cpc_prediction *out)
{
    if (dev->arch <= 0 || plan->input.steps <= 0 || plan->model.parameters <= 0)
        return;
    double gemm = (dev->gemm_tflops > 0 ? dev->gemm_tflops : dev->attn_tflops) * 1e12;
    double mem = (dev->mem_gbps > 0 ? dev->mem_gbps : 1) * 1e9;
    double es = 2.0; /* encoders and VAEs run in bf16/fp16 */
    /* text encoder: 2 x parameters FLOPs per prompt token (every prompt of the
     * batch: the negative prompt of CFG too), its weights read once, and its
     * blocks' eager dispatch (24 blocks, as T5-XXL's encoder) */
    int64_t te = plan->runtime.text_encoder_parameters;
    if (te < 0)
        te = CPC_TEXT_ENCODER_DEFAULT;
    if (te > 0) {
        double lt = 0;
        for (int i = 0; i < plan->input.n_segments; i++)
            if (plan->input.segments[i].kind == CPC_SEG_TOKENS && strstr(plan->input.segments[i].name, "text"))
                lt += (double)plan->input.segments[i].tokens;
        if (lt <= 0)
            lt = plan->model.cross_attention_tokens > 0 ? (double)plan->model.cross_attention_tokens : 512;
        double rows = lt * (plan->input.batch > 0 ? plan->input.batch : 1);
        double dev_s = 2.0 * (double)te * rows / (gemm * gemm_shape_eff(dev, rows, 4096, 4096)) +
                       (double)te * es / mem;
        double host_s = 24.0 * dev->host_layer_us * 1e-6;
        out->text_encoder_ms = (dev_s > host_s ? dev_s : host_s) * 1e3;
    }
    /* VAE decode of the image/video segments' pixels (one image or video: input.batch
     * counts the CFG passes).  A decoder of base width c has four levels of width
     * c, 2c, 4c, 4c at 1, 1/4, 1/16, 1/64 of the output pixels, each three
     * res-blocks of two 3x3 convolutions, and an upsampling convolution at the
     * finer level after each of the lower three: 2-D (FLUX, SD, QwenImage image
     * VAEs) ~512 c^2 FLOPs per output pixel (c = 128: 8.4 MFLOP); a causal 3-D
     * video decoder (HunyuanVideo, CogVideoX, Mochi, Wan: 3x3x3 kernels, the
     * lower two levels at 1/4 and 1/2 of the frames) ~1300 c^2 (c = 128: 21
     * MFLOP).  Image decoders run at half the GEMM rate (cuDNN implicit-GEMM
     * convolutions between GroupNorm/SiLU); video decoders at a quarter of it
     * (3-D convolutions over narrow channels; a check: Wan2.2-TI2V-5B's VAE
     * decodes 832x480x81 on an RTX 4090 in 19.8 s, utensils/mold issue #802, and
     * this formula gives ~19.7 s; HunyuanVideo's decodes 848x480x77 on an H200
     * in 5.7 s tiled, sgl-project/sglang PR #36012, ~3.9 s untiled here).
     * Each convolution's activation is also normalised, activated, read and
     * written (~6 passes): ~152 c x element bytes per output pixel.  With
     * runtime.vae_tiling a frame larger than one tile (256^2 output pixels for a
     * video decoder, 512^2 for an image decoder: diffusers' tile_sample_min
     * defaults) is decoded in tiles that overlap by a quarter on each side
     * (tile / stride = 4/3 per dimension, diffusers' defaults), so (4/3)^2 of
     * its pixels are computed. */
    if (plan->runtime.vae) {
        double c = plan->runtime.vae_channels > 0 ? plan->runtime.vae_channels : 128;
        double t = 0;
        for (int i = 0; i < plan->input.n_segments; i++) {
            const cpc_segment *s = &plan->input.segments[i];
            if (s->kind == CPC_SEG_TOKENS || s->pixels <= 0)
                continue;
            double px = (double)s->pixels;
            bool video = s->kind == CPC_SEG_VIDEO;
            double frame = px / (double)(s->frames > 0 ? s->frames : 1);
            if (plan->runtime.vae_tiling && frame > (video ? 256.0 * 256.0 : 512.0 * 512.0))
                px *= 16.0 / 9.0;
            double rate = (video ? 0.25 : 0.5) * gemm;
            double eb = es;
            if (plan->runtime.vae_dtype == CPC_DTYPE_FP32) {
                /* an FP32 VAE (Wan's WanVAE: dtype torch.float): its
                 * convolutions run in TF32 (cuDNN's default in PyTorch), half
                 * the BF16 tensor rate on A100/H100/Ada datasheets, and its
                 * activations are 4 bytes */
                rate *= 0.5;
                eb = 4.0;
            }
            t += px * (video ? 1300.0 : 512.0) * c * c / rate + px * 152.0 * c * eb / mem;
        }
        if (t > 0) {
            double split = plan->runtime.vae_parallel && ranks > 1 ? ranks : 1;
            out->vae_decode_ms = t / split * 1e3;
        }
    }
    out->ms_per_image += out->text_encoder_ms + out->vae_decode_ms;
}

/* Ranks of the WHOLE job on one node.  `plan` may be the (c, t) sub-plan
 * of the outer axes (cpc_plan_sub: world_size P/(C*T), gpus_per_node g/T):
 * its C*T groups run at once on the same nodes, so the ranks that share a
 * node's cores are min(C*T*world_size, g), not the group's. */
static double job_ranks_per_node(const cpc_plan *plan)
{
    int C = cpc_plan_cfg_degree(plan), T = cpc_plan_tp_degree(plan);
    double whole = (double)plan->cluster.world_size * C * T;
    double g = plan->cluster.gpus_per_node > 0 ? (double)plan->cluster.gpus_per_node * T : whole;
    return g < whole ? g : whole;
}

double cpc_core_sharing(const cpc_plan *plan, const cpc_device_profile *dev)
{
    if (dev->cores > 0) {
        double per_node = job_ranks_per_node(plan);
        return per_node > dev->cores ? per_node / dev->cores : 1.0;
    }
    return dev->ranks_per_core > 1 ? dev->ranks_per_core : 1.0;
}

/* MEMORY of the deployment (cost.h): on a GPU with model.parameters, the
 * transformer's weights (replicated by the CP and CFG axes, split by TP), a
 * block's live activations and, after the denoising loop, the VAE decode's
 * peak (its weights and one tile's activations) are added to the attention
 * program's buffers: memory = weights + max(activations + buffers, VAE) +
 * workspace + reserved. */
static void deployment_memory(const cpc_plan *plan, const cpc_device_profile *dev, cpc_prediction *out)
{
    if (dev->arch <= 0 || plan->model.parameters <= 0)
        return;
    int T = plan->parallel.tp_degree > 0 ? plan->parallel.tp_degree : 1;
    double es = cpc_dtype_size(plan->model.dtype);
    double h = model_hidden(plan);
    double RU = plan->cluster.world_size > 0 ? plan->cluster.world_size : 1;
    double M = (double)plan->input.batch * rank_tokens(plan, RU);
    double r = plan->model.mlp_ratio > 0 ? plan->model.mlp_ratio : 4.0;
    double g = plan->model.mlp_gated ? 2.0 : 1.0;
    double act = plan->model.active_experts > 0 ? plan->model.active_experts : 1;
    double weights = (double)plan->model.parameters * es / T;
    /* the residual stream, its normalised copy, the attention output and the
     * gated sum (4 x hidden, whole on every TP rank), and the split Q, K, V,
     * attention output and the MLP's inner activations (and gate) */
    double acts = M * h * es * (4.0 + (4.0 + (g + 1.0) * r * act) / T);
    double vae = 0;
    if (plan->runtime.vae && plan->input.steps > 0) {
        double c = plan->runtime.vae_channels > 0 ? plan->runtime.vae_channels : 128;
        for (int i = 0; i < plan->input.n_segments; i++) {
            const cpc_segment *s = &plan->input.segments[i];
            if (s->kind == CPC_SEG_TOKENS || s->pixels <= 0)
                continue;
            bool video = s->kind == CPC_SEG_VIDEO;
            /* decoder weights: ~84M (2-D, c = 128) / ~250M (3-D) x (c / 128)^2;
             * activations: four full-width (c) maps of one tile, tiles of at most
             * 1024 x 1024 pixels (x 17 frames for video: diffusers' tiled decode) */
            double w = (video ? 250e6 : 84e6) * (c / 128.0) * (c / 128.0) * 2.0;
            double px = (double)s->pixels / (s->frames > 1 ? (double)s->frames : 1.0);
            if (px > 1024.0 * 1024.0)
                px = 1024.0 * 1024.0;
            if (video)
                px *= s->frames < 17 ? (double)s->frames : 17.0;
            double need = w + 4.0 * px * c * 2.0;
            if (need > vae)
                vae = need;
        }
    }
    double rest = (double)out->memory_bytes_per_rank; /* buffers + workspace + reserved */
    double work = acts + (double)out->buffer_bytes_per_rank;
    double total = rest - (double)out->buffer_bytes_per_rank + weights + (work > vae ? work : vae);
    out->weights_bytes_per_rank = (int64_t)weights;
    out->activation_bytes_per_rank = (int64_t)acts;
    out->vae_bytes_per_rank = (int64_t)vae;
    out->memory_bytes_per_rank = (int64_t)total;
}

cpc_status *cpc_price_program(const cpc_plan *plan, const cpc_program *prog,
                              const cpc_device_profile *dev, cpc_prediction *out)
{
    memset(out, 0, sizeof *out);
    const cpc_layout *L = &prog->layout;
    int max_runs = cpc_layout_max_block_runs(L);
    if (max_runs < cpc_layout_max_shard_runs(L))
        max_runs = cpc_layout_max_shard_runs(L);
    if (max_runs < L->n_rep)
        max_runs = L->n_rep;
    if (max_runs < 1)
        max_runs = 1;
    int max_ranks = L->P <= CPC_PRICE_ALL_RANKS ? L->P : CPC_PRICE_MAX_SAMPLE;
    int *ranks = malloc(sizeof(int) * (size_t)max_ranks);
    int *tags = malloc(sizeof(int) * (size_t)(prog->n_buffers > 0 ? prog->n_buffers : 1));
    cpc_run *ra = malloc(sizeof(cpc_run) * (size_t)max_runs);
    cpc_run *rb = malloc(sizeof(cpc_run) * (size_t)max_runs);
    int64_t *head_sum = malloc(sizeof(int64_t) * (size_t)(prog->n_buffers > 0 ? prog->n_buffers : 1));
    if (!ranks || !tags || !ra || !rb || !head_sum) {
        free(ranks), free(tags), free(ra), free(rb), free(head_sum);
        return &cpc_status_oom;
    }
    for (int b = 0; b < prog->n_buffers; b++)
        head_sum[b] = -1;
    int n_ranks = pick_ranks(L, ranks, max_ranks);
    cpc_status *st = NULL;
    double worst_t = 0, worst_comp = 0, worst_comm = 0, worst_host = 0, worst_attn = 0;
    int64_t worst_mem = 0, worst_sent = 0;
    double flops = 0;
    double scale = cpc_core_sharing(plan, dev);
    if (scale > 1.0 && dev->cores > 0 && n_ranks == L->P) {
        /* Ranks that share cores: a rank with less work (uneven heads or
         * tokens) finishes early and leaves its cores to the others, so the
         * node's time is its total compute over its cores, not the busiest
         * rank times (ranks / cores).  Price every rank's compute alone
         * first; the sharing factor is then (sum / cores) / busiest. */
        double sum = 0, busiest = 0;
        for (int i = 0; i < n_ranks && !st; i++) {
            pricer pr = {.plan = plan, .prog = prog, .dev = dev, .L = L,
                         .c = cpc_program_coords(prog, ranks[i]), .tag = tags,
                         .runs_a = ra, .runs_b = rb, .max_runs = max_runs, .compute_scale = 1.0,
                         .comm_scale = 1.0, .head_sum = head_sum, .block_shards = -1};
            for (int b = 0; b < prog->n_buffers; b++)
                tags[b] = (prog->buffers[b].tokens == CPC_TOK_BLOCK && prog->buffers[b].io == CPC_IO_INPUT)
                              ? (int)pr.c.r : -1;
            st = price_ops(&pr, prog->ops, prog->n_ops);
            double busy = pr.comp_busy; /* compute seconds */
            sum += busy;
            if (busy > busiest)
                busiest = busy;
        }
        if (st) {
            free(ranks), free(tags), free(ra), free(rb), free(head_sum);
            return st;
        }
        /* every (c, t) group runs this program on its own slice at once:
         * the job's compute is C*T times this group's, over the job's nodes */
        double ct = (double)cpc_plan_cfg_degree(plan) * cpc_plan_tp_degree(plan);
        double per_node = job_ranks_per_node(plan);
        double cores = dev->cores, nodes = (double)L->P * ct / per_node;
        if (busiest > 0 && cores > 0) {
            double s2 = (sum * ct / nodes / cores) / busiest;
            if (s2 < 1.0)
                s2 = 1.0;
            if (s2 < scale)
                scale = s2;
        }
    }
    for (int i = 0; i < n_ranks && !st; i++) {
        pricer pr = {.plan = plan, .prog = prog, .dev = dev, .L = L,
                     .c = cpc_program_coords(prog, ranks[i]), .tag = tags,
                     .runs_a = ra, .runs_b = rb, .max_runs = max_runs, .compute_scale = scale,
                     .comm_scale = dev->cores > 0 ? scale : 1.0, .head_sum = head_sum,
                     .block_shards = -1};
        for (int b = 0; b < prog->n_buffers; b++)
            tags[b] = (prog->buffers[b].tokens == CPC_TOK_BLOCK && prog->buffers[b].io == CPC_IO_INPUT)
                          ? (int)pr.c.r : -1;
        st = price_ops(&pr, prog->ops, prog->n_ops);
        if (st) {
            cpc_status_prefix(st, "pricing rank %d", ranks[i]);
            break;
        }
        double t = pr.t_comp > pr.t_comm ? pr.t_comp : pr.t_comm;
        if (t > worst_t)
            worst_t = t;
        if (pr.comp_busy > worst_comp)
            worst_comp = pr.comp_busy;
        if (t - pr.comp_busy > worst_comm)
            worst_comm = t - pr.comp_busy;
        int64_t mem = pr.stage_send + pr.stage_recv;
        if (L->B == 1) /* one staging space serves both directions */
            mem = pr.stage_send > pr.stage_recv ? pr.stage_send : pr.stage_recv;
        for (int b = 0; b < prog->n_buffers; b++)
            mem += cpc_buffer_capacity_bytes(prog, b, &pr.c);
        if (mem > worst_mem)
            worst_mem = mem;
        if (pr.sent > worst_sent)
            worst_sent = pr.sent;
        if (pr.host_ops > worst_host)
            worst_host = pr.host_ops;
        if (pr.attn_busy > worst_attn)
            worst_attn = pr.attn_busy;
        flops += pr.flops;
    }
    free(ranks), free(tags), free(ra), free(rb), free(head_sum);
    if (st)
        return st;
    if (n_ranks < L->P && n_ranks > 0)
        flops *= (double)L->P / n_ranks;
    /* attention workspace: one query tile x key tile of fp32 scores per rank
     * (flash attention never holds the S x S matrix) */
    int64_t workspace = (int64_t)128 * 128 * 4 * 2 + (int64_t)128 * L->D * 4 * 4;
    int64_t reserved = (int64_t)(plan->cluster.reserved_gb * 1073741824.0);
    out->ms_per_layer = worst_t * 1e3;
    out->ms_per_forward = out->ms_per_layer * (plan->model.layers > 0 ? plan->model.layers : 1);
    out->compute_ms_per_layer = worst_comp * 1e3;
    out->comm_ms_per_layer = worst_comm * 1e3;
    out->buffer_bytes_per_rank = worst_mem;
    out->memory_bytes_per_rank = worst_mem + workspace + reserved;
    out->bytes_sent_per_rank = worst_sent;
    out->flops_per_layer = flops;
    out->fits = (double)out->memory_bytes_per_rank <= dev->memory_gb * 1073741824.0;
    out->host_ops_per_layer = worst_host;
    price_step(plan, dev, scale, worst_attn, out);
    {
        int ranks = plan->cluster.world_size * cpc_plan_cfg_degree(plan) * cpc_plan_tp_degree(plan);
        price_pipeline(plan, dev, ranks, out);
    }
    deployment_memory(plan, dev, out);
    out->fits = (double)out->memory_bytes_per_rank <= dev->memory_gb * 1073741824.0;
    return NULL;
}

cpc_status *cpc_cost_price_candidate(void *ctx, const cpc_plan *plan, cpc_candidate *cand)
{
    (void)ctx;
    cpc_device_profile dev;
    cpc_measurements meas = {0};
    cpc_status *st = plan_device(plan, &dev, &meas);
    if (st) {
        cpc_measurements_free(&meas);
        return st;
    }
    const cpc_measurement *mx = NULL;
    if (meas.n > 0) {
        char key[CPC_MEASURE_KEY_MAX];
        cpc_measure_key(plan, key, sizeof key);
        mx = cpc_measurements_find(&meas, key, cand->variant, cand->ring_degree,
                                   cand->ulysses_degree, cpc_measure_backend(plan));
    }
    double measured_ms = mx ? mx->ms_per_layer : 0;
    cpc_measurements_free(&meas);
    cpc_program *prog = NULL;
    st = cpc_schedule_build(plan, cand->variant, cand->ring_degree, cand->ulysses_degree, &prog);
    if (st)
        return st;
    cpc_prediction pred;
    st = cpc_price_program(plan, prog, &dev, &pred);
    cpc_program_free(prog);
    if (st)
        return st;
    cand->measured = measured_ms > 0;
    cand->measured_ms_per_layer = cand->measured_ms_per_forward = cand->measured_ms_per_step = 0;
    if (cand->measured) {
        /* the whole step again, with the measured attention in place of the
         * model's (price_step: device = dense + attention, step = max(device, host)) */
        cand->measured_ms_per_layer = measured_ms;
        cand->measured_ms_per_forward =
            measured_ms * (plan->model.layers > 0 ? plan->model.layers : 1);
        if (pred.ms_per_step > 0) {
            double device = pred.dense_ms_per_step + cand->measured_ms_per_forward;
            cand->measured_ms_per_step =
                device > pred.host_ms_per_step ? device : pred.host_ms_per_step;
        }
    }
    cand->predicted_ms_per_layer = pred.ms_per_layer;
    cand->predicted_ms_per_forward = pred.ms_per_forward;
    cand->memory_bytes_per_rank = pred.memory_bytes_per_rank;
    cand->bytes_sent_per_rank = pred.bytes_sent_per_rank;
    cand->predicted_ms_per_step = pred.ms_per_step;
    cand->predicted_ms_per_image = pred.ms_per_image;
    cand->pred = pred;
    cand->priced = true;
    cand->bwd_priced = false;
    if (plan->input.mode == CPC_MODE_TRAINING) {
        /* SPEC section 10: a training candidate needs a backward program (else
         * it is rejected with CP018, so that `auto` picks one that trains) and
         * is priced with it */
        cpc_status *ns = cpc_backward_supported(plan, cand->variant, cand->ring_degree, cand->ulysses_degree);
        if (ns) {
            cand->ok = false;
            cpc_status_append(&cand->errors, ns);
        } else {
            cpc_program *bwd = NULL;
            cpc_prediction bp;
            ns = cpc_schedule_build_backward(plan, cand->variant, cand->ring_degree, cand->ulysses_degree, &bwd);
            if (!ns && !(ns = cpc_price_program(plan, bwd, &dev, &bp))) {
                cand->bwd_priced = true;
                cand->predicted_ms_backward_per_layer = bp.ms_per_layer;
                cand->bwd_bytes_sent_per_rank = bp.bytes_sent_per_rank;
                cand->bwd_memory_bytes_per_rank = bp.memory_bytes_per_rank;
            }
            cpc_program_free(bwd);
            cpc_status_free(ns); /* a failure here is the compiler's to report (compile.h) */
        }
    }
    if (!pred.fits) {
        double gib = (double)pred.memory_bytes_per_rank / 1073741824.0;
        /* the parts named add up to the total (MEMORY: the VAE decode runs after
         * the transformer, so its peak replaces buffers + activations when
         * larger; the fixed attention workspace, under 1 MiB, is left out) */
        double work = (double)pred.buffer_bytes_per_rank + (double)pred.activation_bytes_per_rank;
        char parts[256];
        if ((double)pred.vae_bytes_per_rank > work)
            snprintf(parts, sizeof parts,
                     "weights %.2f GiB + VAE decode %.2f GiB (its peak, above the transformer's "
                     "buffers %.2f GiB + activations %.2f GiB) + reserved %.2f GiB",
                     (double)pred.weights_bytes_per_rank / 1073741824.0,
                     (double)pred.vae_bytes_per_rank / 1073741824.0,
                     (double)pred.buffer_bytes_per_rank / 1073741824.0,
                     (double)pred.activation_bytes_per_rank / 1073741824.0, plan->cluster.reserved_gb);
        else
            snprintf(parts, sizeof parts,
                     "buffers %.2f GiB + weights %.2f GiB + activations %.2f GiB + reserved %.2f GiB",
                     (double)pred.buffer_bytes_per_rank / 1073741824.0,
                     (double)pred.weights_bytes_per_rank / 1073741824.0,
                     (double)pred.activation_bytes_per_rank / 1073741824.0, plan->cluster.reserved_gb);
        cpc_status *e = cpc_diag(CPC_E_PLAN, 40, CPC_SEV_ERROR,
                                 cpc_plan_span(plan, "cluster.world_size", true),
                                 "%s %dx%d: predicted memory per rank %.2f GiB (%s) exceeds "
                                 "the device's %.2f GiB",
                                 cpc_variant_name(cand->variant), cand->ring_degree,
                                 cand->ulysses_degree, gib, parts, dev.memory_gb);
        double dev_bytes = dev.memory_gb * 1073741824.0;
        double reserved = plan->cluster.reserved_gb * 1073741824.0;
        bool ring_like = cand->variant == CPC_VARIANT_RING || cand->variant == CPC_VARIANT_RING_ANYTHING ||
                         cand->variant == CPC_VARIANT_UNIFIED;
        /* the deployment's weights (MEMORY): a TP degree that splits them
         * enough, checked against the same sum with the weights / T' (the
         * activations would shrink too: the check is conservative) */
        int T = plan->parallel.tp_degree > 0 ? plan->parallel.tp_degree : 1;
        int H = plan->model.heads * T;
        int tp_hint = 0;
        double tp_mem = 0;
        /* world_size stays C*T*R*U: the ranks tp_degree takes come out of the
         * candidate's R or U, and a degree the plan states is named in the hint
         * with its new value (else applying tp_degree alone is CP003) */
        char tp_keys[96] = "";
        bool unified = cand->variant == CPC_VARIANT_UNIFIED;
        bool ring_only = cand->variant == CPC_VARIANT_RING || cand->variant == CPC_VARIANT_RING_ANYTHING;
        for (int t2 = 2 * T; pred.weights_bytes_per_rank > 0 && t2 <= 64 && !tp_hint; t2 *= 2) {
            if (H % t2 != 0)
                continue;
            double m2 = (double)pred.memory_bytes_per_rank -
                        (double)pred.weights_bytes_per_rank * (1.0 - (double)T / t2);
            if (m2 > dev_bytes)
                continue;
            int f = t2 / T;
            for (int take_u = 1; take_u >= 0 && !tp_hint; take_u--) {
                int R2 = cand->ring_degree, U2 = cand->ulysses_degree;
                if (take_u ? U2 % f != 0 : R2 % f != 0)
                    continue;
                if (take_u)
                    U2 /= f;
                else
                    R2 /= f;
                if (R2 * U2 < 2 || (unified && (R2 < 2 || U2 < 2)) || (ring_only && U2 != 1) ||
                    (!unified && !ring_only && R2 != 1))
                    continue;
                int n = 0;
                if (plan->parallel.ring_degree > 0 && plan->parallel.ring_degree != R2)
                    n += snprintf(tp_keys + n, sizeof tp_keys - n, ", parallel.ring_degree: %d", R2);
                if (plan->parallel.ulysses_degree > 0 && plan->parallel.ulysses_degree != U2)
                    snprintf(tp_keys + n, sizeof tp_keys - n, ", parallel.ulysses_degree: %d", U2);
                tp_hint = t2, tp_mem = m2;
            }
        }
        if (reserved >= dev_bytes)
            cpc_status_set_hint(e, "cluster.reserved_gb (%.2f GiB) alone exceeds the device memory: "
                                   "lower it, or use a device with more memory (cluster.memory_gb)",
                                plan->cluster.reserved_gb);
        else if (tp_hint)
            cpc_status_set_hint(e, "parallel.tp_degree: %d%s (the weights, %.2f GiB per rank, split %d ways: "
                                   "at most %.2f GiB per rank, within the device's %.2f GiB; world_size "
                                   "= cfg_degree x tp_degree x ring_degree x ulysses_degree)",
                                tp_hint, tp_keys, (double)pred.weights_bytes_per_rank / 1073741824.0, tp_hint,
                                tp_mem / 1073741824.0, dev.memory_gb);
        else if (pred.weights_bytes_per_rank > 0 &&
                 (double)pred.weights_bytes_per_rank >= 0.5 * dev_bytes)
            cpc_status_set_hint(e, "the weights alone take %.2f GiB per rank: a device with more memory "
                                   "(cluster.memory_gb), FP8 weights, or CPU offload (not priced by cpc)",
                                (double)pred.weights_bytes_per_rank / 1073741824.0);
        else if (ring_like && plan->schedule.rotate == CPC_ROTATE_ALLGATHER)
            cpc_status_set_hint(e, "schedule.rotate: p2p (O(S/P) K/V memory instead of the whole "
                                   "K/V), more ranks (cluster.world_size) or less cluster.reserved_gb");
        else
            cpc_status_set_hint(e, "more ranks (cluster.world_size: memory per rank falls as 1/P) "
                                   "or less cluster.reserved_gb");
        cand->ok = false;
        cpc_status_append(&cand->errors, e);
    }
    return NULL;
}
