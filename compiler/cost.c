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
#include <yaml.h>

/* ---- device presets ----------------------------------------------------------
 * Sources (public figures; see ../shared/reference/context-parallelism.md):
 *  h100-sxm: attention 640 TFLOP/s bf16 (FlashAttention-3 paper, ~640-648
 *            forward, hdim 128); fp32 without TF32: 67 TFLOP/s FP32 peak x ~0.5;
 *            HBM3 3.35 TB/s (NVIDIA H100 SXM datasheet), ~90% achievable;
 *            NVLink4 450 GB/s each way; NCCL all-to-all / all-gather bus
 *            bandwidth ~360 GB/s on 8 x H100 NVSwitch (nccl-tests); send/recv
 *            ~150 GB/s (80-260 GB/s observed); InfiniBand NDR 400 Gb/s ~47 GB/s
 *            per NIC; 80 GB.
 *  h200:     cuDNN SDPA 654/669/642/613 TFLOP/s at S=4k/8k/16k/32k (cudnn-frontend
 *            benchmark results) -> 640; HBM3e 4.8 TB/s (4.0-4.3 measured);
 *            NVLink as H100; 141 GB.
 *  a100-sxm: FlashAttention-2 forward up to ~230 TFLOP/s (FA2 paper, 73% of 312);
 *            FP32 19.5 TFLOP/s peak; HBM2e 2.0 TB/s; NVLink3 300 GB/s each way,
 *            NCCL bus ~230 GB/s; HDR IB 200 Gb/s ~24 GB/s; 80 GB.
 *  l20:      FP16 tensor 119.5 TFLOP/s dense (NVIDIA L20 datasheet), attention
 *            ~60% -> 70; GDDR6 864 GB/s; PCIe Gen4 x16 without NVLink ~22 GB/s
 *            achieved per direction; 48 GB.
 *  rtx4090:  FP16 tensor with FP32 accumulate 165 TFLOP/s dense (Ada whitepaper),
 *            attention ~60% -> 100; GDDR6X 1008 GB/s; PCIe Gen4 x16 ~22 GB/s, no
 *            P2P on GeForce (staged through host: ~12 GB/s); 24 GB (the seed's
 *            table used 48 GB boards: set cluster.memory_gb: 48).
 *  cpu:      this project's CI machines (2 cores shared by the rank threads), as
 *            `cprun --calibrate` measured them (full mode, 4 ranks): attention
 *            65 GFLOP/s bf16 (68 fp32) per rank plus its Q/K/V/O IO at 4 GB/s,
 *            memory-bound ops 18 GB/s, all-to-all bus 5.5 GB/s, point to point
 *            15 GB/s, 25 us per message, 0.4 us per op, 1.7 effective cores
 *            shared by the ranks (cores: 4 ranks ran 2.4x slower than one);
 *            dense GEMM: OpenBLAS SGEMM ~90 GFLOP/s single thread
 *            (platform-notes.md).  The earlier preset (60 GFLOP/s, no core
 *            sharing, no attention IO term) was 3-5x optimistic here.
 *            The softmax per score (attn_softmax_gps, cost.h): 0.9 G scores/s
 *            per rank, and the FLOP rate with it 73 GFLOP/s bf16 (the
 *            three-block fit of cprun --calibrate gave 1.125x the two-block
 *            rate and 0.87 G scores/s in CPU time under load; the two-block
 *            figure alone priced head_dim 8 3.1x optimistic, CPU time, while
 *            head_dim 128 stays where it was).
 *  WHOLE STEP figures (cost.h):
 *  gemm_tflops = 0.72 x the dense bf16 tensor peak with FP32 accumulation:
 *            H100 SXM 989 (datasheet) -> 712, H200 the same silicon -> 712,
 *            A100 312 -> 225, L20 119.5 (datasheet) -> 86, RTX 4090 165.2
 *            (Ada whitepaper, FP32 accumulate) -> 119.  0.72 is what cuBLAS
 *            reaches on a DiT's GEMMs with ~1-5k token rows per rank (large
 *            square GEMMs reach 0.75-0.8).
 *  host_layer_us = 990, host_op_us = 225: eager PyTorch (diffusers), where
 *            each transformer block issues ~100 kernels through Python
 *            dispatch (~10 us each) and each op of the attention program is
 *            ~15-20 PyTorch calls (a funcol collective with its reshapes and
 *            wait, an attention call returning its LSE, an fp32 LSE-merge
 *            update).  The seeds' 4 x H100 table is the one host-bound case
 *            (the GPUs finish a FLUX.1-dev step in ~45 ms and wait for the
 *            host) and is what pins these two figures; the same host drives
 *            every GPU preset.  `cluster.profile` may set them to 0 for a
 *            compiled (CUDA graph) deployment.
 *  TP (tp_degree > 1, cost.h WHOLE STEP): the all-reduces use the alpha-beta
 *            cost of the ring all-reduce, 2 (T-1) alpha + 2 (T-1)/T n beta
 *            (Thakur, Rabenseifner, Gropp, "Optimization of collective
 *            communication operations in MPICH", IJHPCA 2005; NCCL's ring,
 *            whose bus bandwidth nccl-tests reports as algBW x 2 (T-1)/T),
 *            with the preset's intra_latency_us and intra_gbps (the NCCL bus
 *            figures above); the unsplit work is counted, not measured: per
 *            sub-block (attention, MLP) a norm (read + write), the adaLN
 *            modulation (read + write) and the gated residual add (two reads,
 *            one write) = 7 hidden-sized passes, 14 per block, at mem_gbps;
 *            the GEMM roofline is Williams, Waterman, Patterson, "Roofline",
 *            CACM 52(4) 2009, with gemm_tflops and mem_gbps as its roof.
 *            context-parallelism.md has no TP or CFG-parallel measurement to
 *            check these against (section 5 quotes xDiT's Ulysses figures only).
 *  rtx4090 intra_gbps 12: GeForce boards have no P2P, so NCCL collectives go
 *            through host shared memory (~12 GB/s bus bandwidth on PCIe Gen4).
 * op_overhead_us: ~5 us per kernel launch plus framework dispatch on GPUs
 * (CUDA launch latency is 2-5 us); 1 us on the CPU.
 */
#define GEMM_H100 712.0
#define GEMM_H200 712.0
#define GEMM_A100 225.0
#define GEMM_L20 86.0
#define GEMM_4090 119.0
#define HOST_LAYER_US 990.0
#define HOST_OP_US 225.0
static const cpc_device_profile presets[] = {
    {"h100-sxm", 640.0, 33.0, 3000.0, 360.0, 150.0, 47.0, 10.0, 20.0, 80.0, 0, 5.0, 0, 0,
     GEMM_H100, HOST_LAYER_US, HOST_OP_US, 0},
    {"h200", 640.0, 33.0, 4100.0, 360.0, 150.0, 47.0, 10.0, 20.0, 141.0, 0, 5.0, 0, 0,
     GEMM_H200, HOST_LAYER_US, HOST_OP_US, 0},
    {"a100-sxm", 230.0, 10.0, 1800.0, 230.0, 100.0, 24.0, 10.0, 20.0, 80.0, 0, 5.0, 0, 0,
     GEMM_A100, HOST_LAYER_US, HOST_OP_US, 0},
    {"l20", 70.0, 30.0, 780.0, 22.0, 22.0, 12.0, 15.0, 25.0, 48.0, 0, 5.0, 0, 0,
     GEMM_L20, HOST_LAYER_US, HOST_OP_US, 0},
    {"rtx4090", 100.0, 40.0, 900.0, 12.0, 12.0, 12.0, 15.0, 25.0, 24.0, 0, 5.0, 0, 0,
     GEMM_4090, HOST_LAYER_US, HOST_OP_US, 0},
    {"cpu", 0.073, 0.068, 18.0, 5.5, 15.0, 1.0, 25.0, 50.0, 16.0, 0, 0.4, 1.7, 4.0, 0.09, 0, 0, 0.9},
};

const char *const cpc_device_preset_names[] = {"h100-sxm", "h200", "a100-sxm", "l20",
                                               "rtx4090", "cpu", NULL};

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
            int w = snprintf(segs + used, sizeof segs - used, "%s%lld", i ? "," : "",
                             (long long)plan->input.segments[i].tokens);
            if (w < 0)
                break;
            used += (size_t)w;
        }
    } else {
        uint64_t h = 1469598103934665603ULL; /* FNV-1a over the lengths */
        for (int i = 0; i < ns; i++) {
            uint64_t t = (uint64_t)plan->input.segments[i].tokens;
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

static cpc_status *plan_device(const cpc_plan *plan, cpc_device_profile *out,
                               cpc_measurements *m)
{
    const char *dev = plan->cluster.device ? plan->cluster.device : "h100-sxm";
    if (!cpc_device_preset(dev, out))
        return cpc_diag(CPC_E_PLAN, 103, CPC_SEV_ERROR, cpc_plan_span(plan, "cluster.device", true),
                        "unknown device '%s' (h100-sxm, h200, a100-sxm, l20, rtx4090, cpu)", dev);
    char path[4096];
    if (cpc_plan_profile_path(plan, path, sizeof path)) {
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

double cpc_visible_pairs(const cpc_run *q, int nq, const cpc_run *k, int nk, bool causal)
{
    double total = 0;
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++)
            total += causal ? causal_pairs(q[i].start, q[i].start + q[i].len, k[j].start,
                                           k[j].start + k[j].len)
                            : (double)q[i].len * (double)k[j].len;
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
    case CPC_TOK_KV: return L->Skv;
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

static int buf_runs(const pricer *pr, int b, int block, cpc_run *out)
{
    const cpc_buffer *B = &pr->prog->buffers[b];
    const cpc_layout *L = pr->L;
    switch (B->tokens) {
    case CPC_TOK_SHARD: return cpc_layout_shard_runs(L, (int)pr->c.p, out, pr->max_runs);
    case CPC_TOK_BLOCK:
        return cpc_layout_block_runs(L, pr->tag[b] >= 0 ? pr->tag[b] : (int)pr->c.r, out, pr->max_runs);
    case CPC_TOK_ALL: return cpc_layout_block_runs(L, block, out, pr->max_runs);
    case CPC_TOK_KV:
        out[0] = (cpc_run){0, L->Skv};
        return 1;
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
               h0 = pr->host_ops;
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
        pr->sent += (int64_t)((double)(pr->sent - s0) * k);
        for (int64_t s = n - edge; s < n && !st; s++) {
            pr->c.s = s;
            st = price_ops(pr, op->body, op->n_body);
        }
    }
    pr->c.s = saved;
    return st;
}

/* init_acc: writes its buffers (memory-bound) */
static cpc_status *price_init_acc(pricer *pr, const cpc_op *op)
{
    if (op->block) { /* a gradient accumulator made for a ring block (backward) */
        int64_t b = 0;
        cpc_status *st = eval(pr, op->block, &b);
        if (st)
            return st;
        for (int i = 0; i < op->n_out; i++)
            pr->tag[op->out[i]] = (int)b;
    }
    for (int i = 0; i < op->n_in; i++)
        compute(pr, mem_time(pr, buf_bytes(pr, op->in[i])));
    for (int i = 0; i < op->n_out; i++)
        compute(pr, mem_time(pr, buf_bytes(pr, op->out[i])));
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
    compute(pr, flops / rate + io_s);
    return NULL;
}

/* delta / merge / copy: bytes read and written at the memory bandwidth (a
 * merge reads its outputs too) */
static cpc_status *price_memory(pricer *pr, const cpc_op *op)
{
    int64_t bytes = 0;
    for (int i = 0; i < op->n_in; i++)
        bytes += buf_bytes(pr, op->in[i]);
    for (int i = 0; i < op->n_out; i++)
        bytes += buf_bytes(pr, op->out[i]) * (op->kind == CPC_OP_MERGE || op->kind == CPC_OP_ADD ? 2 : 1);
    compute(pr, mem_time(pr, bytes));
    if (op->kind == CPC_OP_COPY && op->n_in > 0 && op->n_out > 0)
        pr->tag[op->out[0]] = pr->tag[op->in[0]];
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

/* recv: the content tag of what arrives */
static cpc_status *price_recv(pricer *pr, const cpc_op *op)
{
    cpc_status *st = NULL;
    int64_t block = 0;
    if (op->block && (st = eval(pr, op->block, &block)))
        return st;
    for (int i = 0; i < op->n_out; i++)
        pr->tag[op->out[i]] = (int)block;
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

/* swap: exchanges content tags */
static cpc_status *price_swap(pricer *pr, const cpc_op *op)
{
    if (op->n_in >= 2) {
        int a = op->in[0], b = op->in[1];
        int tmp = pr->tag[a];
        pr->tag[a] = pr->tag[b];
        pr->tag[b] = tmp;
    }
    return NULL;
}

/* all_to_all: the bytes this member sends over the ulysses link, plus
 * pack/unpack */
static cpc_status *price_all_to_all(pricer *pr, const cpc_op *op)
{
    const cpc_layout *L = pr->L;
    if (op->n_in < 1 || op->n_out < 1)
        return NULL;
    int b = op->in[0];
    const cpc_buffer *B = &pr->prog->buffers[b];
    int64_t per_head = (int64_t)L->B * (B->role == CPC_ROLE_LSE ? 1 : L->D) *
                       cpc_buffer_elem_size(pr->prog, b);
    int64_t bytes = 0;
    for (int j = 0; j < L->U; j++) {
        if (j == pr->c.u)
            continue;
        if (op->dir == CPC_A2A_SEQ_TO_HEADS) /* member j gets its head part */
            bytes += cpc_layout_shard_tokens(L, (int)pr->c.p) * buf_heads(pr, op->out[0], j) * per_head;
        else
            bytes += cpc_layout_shard_tokens(L, (int)(pr->c.r * L->U + j)) *
                     buf_heads(pr, b, (int)pr->c.u) * per_head;
    }
    double lat;
    double bw = link_bw(pr, CPC_GROUP_ULYSSES, false, &lat);
    double start = pr->t_comp > pr->t_comm ? pr->t_comp : pr->t_comm;
    /* pack + unpack touch the whole buffer twice */
    double t = start + (lat + (double)bytes / bw) * pr->comm_scale + pr->dev->op_overhead_us * 2e-6 +
               2.0 * mem_time(pr, buf_bytes(pr, b)) * pr->compute_scale;
    pr->t_comp = pr->t_comm = t;
    pr->sent += bytes;
    pr->tag[op->out[0]] = op->dir == CPC_A2A_SEQ_TO_HEADS ? (int)pr->c.r : -1;
    /* the executor's pack/unpack space (runtime/executor.c): with B == 1
     * seq_to_heads stages only its send side, heads_to_seq its receive */
    {
        int64_t in_b = buf_bytes(pr, b), out_b = buf_bytes(pr, op->out[0]);
        bool b1 = L->B == 1;
        if (!(b1 && op->dir == CPC_A2A_HEADS_TO_SEQ) && in_b > pr->stage_send)
            pr->stage_send = in_b;
        if (!(b1 && op->dir == CPC_A2A_SEQ_TO_HEADS) && out_b > pr->stage_recv)
            pr->stage_recv = out_b;
    }
    return NULL;
}

/* all_gather: the other blocks over the ring link */
static cpc_status *price_all_gather(pricer *pr, const cpc_op *op)
{
    const cpc_layout *L = pr->L;
    if (op->n_in < 1)
        return NULL;
    int64_t own = buf_bytes(pr, op->in[0]);
    int64_t per_tok = own / (buf_tokens(pr, op->in[0]) > 0 ? buf_tokens(pr, op->in[0]) : 1);
    int64_t total = 0;
    for (int j = 0; j < L->R; j++)
        total += cpc_layout_block_tokens(L, j) * per_tok;
    double lat;
    double bw = link_bw(pr, CPC_GROUP_RING, false, &lat);
    double start = pr->t_comp > pr->t_comm ? pr->t_comp : pr->t_comm;
    pr->t_comp = pr->t_comm =
        start + (lat * (L->R - 1) + (double)(total - own) / bw) * pr->comm_scale;
    pr->sent += own * (L->R - 1);
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
        int64_t bytes = all - cpc_layout_block_tokens(L, r) * per_tok;
        double lat;
        double bw = link_bw(pr, CPC_GROUP_RING, false, &lat);
        double start = pr->t_comp > pr->t_comm ? pr->t_comp : pr->t_comm;
        pr->t_comp = pr->t_comm = start + (lat * (L->R - 1) + (double)bytes / bw) * pr->comm_scale +
                                  (mem_time(pr, all) + mem_time(pr, out * L->R)) * pr->compute_scale;
        pr->sent += bytes;
        pr->tag[op->out[i]] = r;
        if (all > pr->stage_send)
            pr->stage_send = all;
        if (out * L->R > pr->stage_recv)
            pr->stage_recv = out * L->R;
    }
    return NULL;
}

/* all_reduce (backward, cross-attention dK/dV): reduce-scatter of Skv
 * chunks then all-gather over the world link, plus pack and sum */
static cpc_status *price_all_reduce(pricer *pr, const cpc_op *op)
{
    const cpc_layout *L = pr->L;
    for (int i = 0; i < op->n_in && i < op->n_out; i++) {
        int64_t all = buf_bytes(pr, op->in[i]);
        int64_t tot = buf_tokens(pr, op->in[i]);
        int64_t per_tok = all / (tot > 0 ? tot : 1);
        int64_t mine = cpc_split_len(L->Skv, L->P, pr->c.p) * per_tok;
        int64_t bytes = (all - mine) + mine * (L->P - 1);
        double lat;
        double bw = link_bw(pr, CPC_GROUP_WORLD, false, &lat);
        double start = pr->t_comp > pr->t_comm ? pr->t_comp : pr->t_comm;
        pr->t_comp = pr->t_comm = start + (2.0 * lat * (L->P - 1) + (double)bytes / bw) * pr->comm_scale +
                                  (2.0 * mem_time(pr, all) + mem_time(pr, mine * L->P)) * pr->compute_scale;
        pr->sent += bytes;
        pr->tag[op->out[i]] = pr->tag[op->in[i]];
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
    double lat;
    (void)link_bw(pr, op->group, false, &lat);
    double start = pr->t_comp > pr->t_comm ? pr->t_comp : pr->t_comm;
    pr->t_comp = pr->t_comm = start + lat * pr->comm_scale;
    return NULL;
}

/* The cost hook of every op kind (the op table in program.h names its rule). */
static cpc_status *(*const price_fn[])(pricer *pr, const cpc_op *op) = {
    [CPC_OP_LOOP] = price_loop,
    [CPC_OP_INIT_ACC] = price_init_acc,
    [CPC_OP_ATTN] = price_attn,
    [CPC_OP_MERGE] = price_memory,
    [CPC_OP_SEND] = price_send,
    [CPC_OP_RECV] = price_recv,
    [CPC_OP_WAIT] = price_wait,
    [CPC_OP_SWAP] = price_swap,
    [CPC_OP_ALL_TO_ALL] = price_all_to_all,
    [CPC_OP_ALL_GATHER] = price_all_gather,
    [CPC_OP_COPY] = price_memory,
    [CPC_OP_BARRIER] = price_barrier,
    [CPC_OP_ATTN_BWD] = price_attn,
    [CPC_OP_DELTA] = price_memory,
    [CPC_OP_REDUCE_SCATTER] = price_reduce_scatter,
    [CPC_OP_ALL_REDUCE] = price_all_reduce,
    [CPC_OP_ADD] = price_memory,
};
_Static_assert(sizeof price_fn / sizeof price_fn[0] == CPC_OP__COUNT, "every op kind needs a cost hook");

static cpc_status *price_op(pricer *pr, const cpc_op *op)
{
    if (op->when) {
        int64_t w = 0;
        cpc_status *st = eval(pr, op->when, &w);
        if (st)
            return st;
        if (!w)
            return NULL;
    }
    /* the host's launches per op (op table: a merge is the output and the LSE update) */
    pr->host_ops += cpc_op_info_of(op->kind)->host_launches;
    return (int)op->kind >= 0 && op->kind < CPC_OP__COUNT ? price_fn[op->kind](pr, op) : NULL;
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

double cpc_weights_per_token(const cpc_plan *plan)
{
    if (plan->model.parameters <= 0)
        return 0;
    int T = plan->parallel.tp_degree > 0 ? plan->parallel.tp_degree : 1;
    double hidden = (double)plan->model.heads * T * plan->model.head_dim;
    double layers = plan->model.layers > 0 ? plan->model.layers : 1;
    double w = 12.0 * hidden * hidden * layers;
    return w < (double)plan->model.parameters ? w : (double)plan->model.parameters;
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

/* The whole forward step (cost.h WHOLE STEP).  `plan` is the plan one
 * (R x U) group prices: with cfg/tp degrees resolved, its batch is B / C and
 * its heads H / T (parallel.cfg_degree / tp_degree say C and T). */
static void price_step(const cpc_plan *plan, const cpc_device_profile *dev, double scale,
                       cpc_prediction *out)
{
    double W = cpc_weights_per_token(plan);
    if (W <= 0)
        return;
    int T = plan->parallel.tp_degree > 0 ? plan->parallel.tp_degree : 1;
    double layers = plan->model.layers > 0 ? plan->model.layers : 1;
    double hidden = (double)plan->model.heads * T * plan->model.head_dim;
    double RU = plan->cluster.world_size > 0 ? plan->cluster.world_size : 1;
    double tokens = (double)plan->input.batch * (double)plan->input.total_tokens / RU;
    double gemm = (dev->gemm_tflops > 0 ? dev->gemm_tflops : dev->attn_tflops) * 1e12;
    if (plan->model.dtype == CPC_DTYPE_FP32 && dev->attn_tflops > 0)
        gemm *= dev->attn_tflops_fp32 / dev->attn_tflops;
    double es = cpc_dtype_size(plan->model.dtype);
    double mem = (dev->mem_gbps > 0 ? dev->mem_gbps : 1) * 1e9;
    double roof = cpc_gemm_roofline_factor(tokens, hidden, T, es, gemm, mem);
    double dense = 2.0 * W * tokens / T / gemm * roof;
    double tp = 0, tp_host_ops = 0;
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
        /* the block's norms, modulation and gated residual adds act on the
         * whole hidden state of every token on every TP rank: 14 x hidden
         * elements read or written per token per block; at T = 1 that work
         * is inside the GEMM efficiency and divided like the GEMMs, so TP
         * brings back (1 - 1/T) of it */
        double repl = tokens * 14.0 * hidden * es * (1.0 - 1.0 / T) / mem;
        tp = layers * (2.0 * ar + repl);
        tp_host_ops = 2.0;
    }
    dense = (dense + tp) * scale;
    double device = dense + out->ms_per_forward * 1e-3;
    double host = layers * (dev->host_layer_us + (out->host_ops_per_layer + tp_host_ops) * dev->host_op_us) * 1e-6;
    out->dense_ms_per_step = dense * 1e3;
    out->tp_ms_per_step = tp * scale * 1e3;
    out->gemm_roofline = roof;
    out->device_ms_per_step = device * 1e3;
    out->host_ms_per_step = host * 1e3;
    out->ms_per_step = (device > host ? device : host) * 1e3;
    out->ms_per_image = plan->input.steps > 0 ? out->ms_per_step * plan->input.steps : 0;
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

cpc_status *cpc_price_program(const cpc_plan *plan, const cpc_program *prog,
                              const cpc_device_profile *dev, cpc_prediction *out)
{
    memset(out, 0, sizeof *out);
    const cpc_layout *L = &prog->layout;
    int max_runs = cpc_layout_max_block_runs(L);
    if (max_runs < cpc_layout_max_shard_runs(L))
        max_runs = cpc_layout_max_shard_runs(L);
    if (max_runs < 1)
        max_runs = 1;
    int max_ranks = L->P <= CPC_PRICE_ALL_RANKS ? L->P : CPC_PRICE_MAX_SAMPLE;
    int *ranks = malloc(sizeof(int) * (size_t)max_ranks);
    int *tags = malloc(sizeof(int) * (size_t)(prog->n_buffers > 0 ? prog->n_buffers : 1));
    cpc_run *ra = malloc(sizeof(cpc_run) * (size_t)max_runs);
    cpc_run *rb = malloc(sizeof(cpc_run) * (size_t)max_runs);
    if (!ranks || !tags || !ra || !rb) {
        free(ranks), free(tags), free(ra), free(rb);
        return &cpc_status_oom;
    }
    int n_ranks = pick_ranks(L, ranks, max_ranks);
    cpc_status *st = NULL;
    double worst_t = 0, worst_comp = 0, worst_comm = 0, worst_host = 0;
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
                         .comm_scale = 1.0};
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
            free(ranks), free(tags), free(ra), free(rb);
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
                     .comm_scale = dev->cores > 0 ? scale : 1.0};
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
        flops += pr.flops;
    }
    free(ranks), free(tags), free(ra), free(rb);
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
    price_step(plan, dev, scale, out);
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
        cpc_status *e = cpc_diag(CPC_E_PLAN, 40, CPC_SEV_ERROR,
                                 cpc_plan_span(plan, "cluster.world_size", true),
                                 "%s %dx%d: predicted memory per rank %.2f GiB (buffers %.2f GiB + "
                                 "reserved %.2f GiB) exceeds the device's %.2f GiB",
                                 cpc_variant_name(cand->variant), cand->ring_degree,
                                 cand->ulysses_degree, gib,
                                 (double)pred.buffer_bytes_per_rank / 1073741824.0,
                                 plan->cluster.reserved_gb, dev.memory_gb);
        double dev_bytes = dev.memory_gb * 1073741824.0;
        double reserved = plan->cluster.reserved_gb * 1073741824.0;
        bool ring_like = cand->variant == CPC_VARIANT_RING || cand->variant == CPC_VARIANT_RING_ANYTHING ||
                         cand->variant == CPC_VARIANT_UNIFIED;
        if (reserved >= dev_bytes)
            cpc_status_set_hint(e, "cluster.reserved_gb (%.2f GiB) alone exceeds the device memory: "
                                   "lower it, or use a device with more memory (cluster.memory_gb)",
                                plan->cluster.reserved_gb);
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
