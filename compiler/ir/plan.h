/*
 * plan.h - the plan: what a user's YAML file says, typed, with defaults filled
 * and the source position of every key kept (SPEC section 1).
 *
 * A cpc_plan is produced by cpc_plan_load() (plan_load.c) from the YAML tree
 * (yaml_tree.h) and read, never written, by every later stage (validate,
 * schedule, price, verify, codegen, emit, the runtime).  All memory of a plan
 * is owned by the plan and released by cpc_plan_free().
 *
 * Thread-safety: a loaded plan is immutable and may be read from several
 * threads at once.
 */
#ifndef CPC_PLAN_H
#define CPC_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

/* Element type of Q/K/V/O.  LSE and accumulators are always fp32. */
/* cpc_dtype (bf16, fp16, fp32) is the public API's: include/cpc/types.h. */
#include "cpc/types.h"

/* Variants.  The enum order of the five parallel variants is SPEC section 1's
 * tie order: ulysses, unified, ring, ulysses_anything, ring_anything. */
typedef enum cpc_variant {
    CPC_VARIANT_ULYSSES = 0,
    CPC_VARIANT_UNIFIED,
    CPC_VARIANT_RING,
    CPC_VARIANT_ULYSSES_ANYTHING,
    CPC_VARIANT_RING_ANYTHING,
    CPC_VARIANT_NONE,    /* world_size 1 baseline */
    CPC_VARIANT_AUTO,    /* choose among the valid ones */
    CPC_VARIANT__COUNT
} cpc_variant;

typedef enum cpc_mask { CPC_MASK_NONE = 0, CPC_MASK_CAUSAL, CPC_MASK_KEY_PADDING, CPC_MASK__COUNT } cpc_mask;
typedef enum cpc_mode { CPC_MODE_INFERENCE = 0, CPC_MODE_TRAINING, CPC_MODE__COUNT } cpc_mode;
typedef enum cpc_fallback { CPC_FALLBACK_STRICT = 0, CPC_FALLBACK_AUTO, CPC_FALLBACK__COUNT } cpc_fallback;
typedef enum cpc_rotate { CPC_ROTATE_P2P = 0, CPC_ROTATE_ALLGATHER, CPC_ROTATE__COUNT } cpc_rotate;

/* Names as written in plan files ("bf16", "ulysses_anything", "causal", ...).
 * The *_parse functions return -1 for an unknown name. */
const char *cpc_dtype_name(cpc_dtype d);
const char *cpc_variant_name(cpc_variant v);
const char *cpc_mask_name(cpc_mask m);
const char *cpc_mode_name(cpc_mode m);
const char *cpc_fallback_name(cpc_fallback f);
const char *cpc_rotate_name(cpc_rotate r);
int cpc_dtype_parse(const char *s);
int cpc_variant_parse(const char *s);
int cpc_mask_parse(const char *s);
int cpc_mode_parse(const char *s);
int cpc_fallback_parse(const char *s);
int cpc_rotate_parse(const char *s);
/* Bytes per element: 2, 2, 4. */
int cpc_dtype_size(cpc_dtype d);

/* One input segment (text, image, video, ...): its tokens after shorthand
 * arithmetic (FLUX 1024x1024 image -> 4096).  Segments are split separately
 * and concatenated in file order. */
typedef struct cpc_segment {
    char *name;          /* owned; "tokens" for the `tokens:` shorthand */
    int64_t tokens;      /* >= 1, <= 2^31-1 */
    int kind;            /* CPC_SEG_TOKENS, CPC_SEG_IMAGE or CPC_SEG_VIDEO: how it was given */
    int64_t frames;      /* video: frames as written (pixel frames); image: 1; tokens: 0 */
    int64_t pixels;      /* image: height x width; video: frames x height x width (the
                            VAE decoder's output, cost.h PIPELINE); tokens: 0 */
    cpc_span span;       /* the segment's mapping (or the shorthand key) */
    bool replicate;      /* `split: replicate`: held whole by every rank, never divided
                            by any degree; its queries run on every rank (layout.h
                            REPLICATED SEGMENTS); default false (`split: shard`) */
} cpc_segment;

/* Source positions of keys, recorded by the loader for diagnostics.  `key`
 * is the dotted path ("model.heads", "input.segments[1]", "parallel"). */
typedef struct cpc_plan_key_span {
    char *key;           /* owned */
    cpc_span key_span;   /* where the key is written */
    cpc_span value_span; /* where its value starts */
} cpc_plan_key_span;

/* How a segment was given (cpc_segment.kind). */
enum { CPC_SEG_TOKENS = 0, CPC_SEG_IMAGE = 1, CPC_SEG_VIDEO = 2 };

/* runtime.framework (SPEC section 1; cost.h HOST and MEMORY-BOUND WORK). */
typedef enum cpc_framework {
    CPC_FRAMEWORK_EAGER = 0,     /* eager PyTorch, framework not named (the default) */
    CPC_FRAMEWORK_DIFFUSERS,     /* eager PyTorch: diffusers' own context parallelism */
    CPC_FRAMEWORK_XDIT,          /* eager PyTorch: xDiT (yunchang's USP) */
    CPC_FRAMEWORK_SGLANG,        /* eager with fused norm/RoPE/activation kernels */
    CPC_FRAMEWORK_COMPILED,      /* torch.compile / CUDA graphs */
    CPC_FRAMEWORK__COUNT
} cpc_framework;

/* runtime.attention_kernel (cost.h ATTENTION KERNELS). */
typedef enum cpc_attn_kernel {
    CPC_KERNEL_SDPA = 0, /* PyTorch SDPA (its flash backend: FlashAttention-2 class); default */
    CPC_KERNEL_FA2,
    CPC_KERNEL_FA3,      /* Hopper only; elsewhere priced as FA2 */
    CPC_KERNEL_CUDNN,
    CPC_KERNEL_SAGE,     /* SageAttention (INT8 Q K^T) */
    CPC_KERNEL__COUNT
} cpc_attn_kernel;

/* Names ("diffusers", "fa3", ...), NULL out of range. */
const char *cpc_framework_name(cpc_framework f);
const char *cpc_attn_kernel_name(cpc_attn_kernel k);

/* parallel.cfg_degree / tp_degree: `auto` */
#define CPC_DEGREE_AUTO (-(1 << 30))

typedef struct cpc_plan {
    char *file;          /* path as given (owned); spans point to this string */
    char *name;          /* `name`, default: file stem (owned) */
    int version;         /* 1 */

    struct {
        int heads;       /* H >= 1, <= 65536 */
        int kv_heads;    /* Hkv, default H */
        int head_dim;    /* D, 1..256 */
        cpc_dtype dtype; /* default bf16 */
        int layers;      /* default 1 */
        double scale;    /* default 1/sqrt(head_dim) */
        bool scale_given;
        int64_t parameters; /* transformer weights (count), 0 = not given: then the
                               cost model prices attention only, not the whole step */
        /* Structure (all optional; cost.h WHOLE STEP says how each is priced): */
        int64_t hidden;     /* model width, 0 = heads x head_dim */
        double mlp_ratio;   /* MLP inner width / hidden, 0 = not given (4) */
        bool mlp_gated;     /* SwiGLU/GEGLU: up, gate and down matrices */
        int dual_stream_layers;      /* of `layers`, dual-stream (MMDiT) blocks; 0 */
        int64_t cross_attention_tokens; /* text tokens each block cross-attends to, 0 = none */
        int experts;        /* MoE experts per block, 0 = not given (1) */
        int active_experts; /* experts per token, 0 = not given (1) */
        bool linear_attention; /* model.attention: linear (ReLU linear attention, as
                                  Sana's); default softmax.  A cost-model key: cost.h
                                  LINEAR ATTENTION prices it; cpc's kernels compute
                                  softmax attention */
        bool structure_given; /* any of mlp_ratio, mlp_gated, cross_attention_tokens,
                                 experts, active_experts was written */
    } model;

    struct {
        int batch;                 /* default 1 */
        int n_segments;
        cpc_segment *segments;     /* owned array */
        int64_t total_tokens;      /* S = sum of segment tokens */
        cpc_mask mask;             /* default none */
        bool has_kv;               /* cross-attention (input.kv) */
        int64_t kv_tokens;         /* Skv when has_kv */
        cpc_mode mode;             /* default inference */
        int steps;                 /* denoising steps per image/video, 0 = not given */
    } input;

    struct {
        int world_size;            /* P, required, 1..2^20 */
        int gpus_per_node;         /* default min(P, 8) */
        char *device;              /* preset name, default "h100-sxm" (owned) */
        char *profile;             /* path or NULL (owned) */
        bool profile_pending;      /* not a plan key: the caller is about to write the
                                      cluster.profile file (cprun --tune, compile opts
                                      profile_pending): while it does not exist the
                                      preset alone prices the plan */
        double memory_gb;          /* 0 = use the preset */
        double reserved_gb;        /* default 0 */
    } cluster;

    struct {
        cpc_variant variant;       /* as written; CPC_VARIANT_AUTO if inferred so */
        bool variant_given;        /* `variant:` key present */
        int ring_degree;           /* 0 = omitted (derived later) */
        int ulysses_degree;        /* 0 = omitted */
        bool ulysses_anything;     /* diffusers flag */
        bool ring_anything;        /* diffusers flag */
        cpc_fallback fallback;     /* default strict */
        int cfg_degree;            /* C: 0 = omitted (1), CPC_DEGREE_AUTO = auto, else as
                                      written (< 1 is CP002 in the validator) */
        int tp_degree;             /* T: the same */
    } parallel;

    struct {
        cpc_framework framework;   /* default eager */
        cpc_attn_kernel attention_kernel; /* default sdpa */
        int64_t text_encoder_parameters; /* -1 = not given (the default of cost.h PIPELINE) */
        bool vae;                  /* price the VAE decode (default true: `vae: auto`) */
        int vae_channels;          /* 0 = not given (128) */
        bool vae_parallel;         /* default false */
        bool vae_tiling;           /* default false: the decode runs in overlapping tiles
                                      (cost.h PIPELINE) */
        cpc_dtype vae_dtype;       /* the VAE decode's element type, default bf16 (fp32:
                                      TF32 convolutions and 4-byte activations, cost.h
                                      PIPELINE) */
        bool cfg_batched;          /* runtime.cfg: batched (true) | sequential (false,
                                      the default): how the step runs the two CFG passes
                                      of an even group batch (cost.h HOST) */
    } runtime;

    struct {
        bool overlap;              /* default true */
        cpc_rotate rotate;         /* default p2p */
        char *script;              /* path as written, or NULL (owned) */
    } schedule;

    int n_key_spans;
    cpc_plan_key_span *key_spans;  /* owned */
} cpc_plan;

/* Looks up the span of a dotted key ("model.heads").  `value` selects the
 * value's span instead of the key's.  When the key is absent, falls back to
 * the nearest present parent ("model"), then to {file, 0, 0}. */
cpc_span cpc_plan_span(const cpc_plan *plan, const char *key, bool value);

/* The sub-problem one (c, t) group of a (C, T, R, U) split solves (SPEC
 * section 1, "All four axes"): a shallow copy of `plan` (it shares the
 * plan's strings, segments and key spans: do not free it, and let the plan
 * outlive it) with world_size P/(C*T), batch B/C, heads H/T, kv_heads
 * Hkv/T (1 when Hkv < T: each K/V head is replicated to the T/Hkv ranks
 * that use it), gpus_per_node max(1, gpus_per_node/T) (gpus_per_node
 * omitted: min(P, 8) first; TP is the innermost axis: a Ulysses group's
 * ranks are T apart) and parallel.cfg_degree = C, tp_degree = T (the cost
 * model's whole step reads T back: cost.h).  The validator cuts every (C, T)
 * candidate with it (validate.h THE OUTER AXES), the compiler schedules
 * the selected one's sub-plan, the artifact reader lays out the program of
 * a C*T artifact with it (artifact.h) and cprun places ranks on it.
 * Returns false, leaving *sub unchanged, when (C, T) breaks CP003 (C*T
 * does not divide P), CP005 (B % C) or CP006 (H % T; Hkv neither divisible
 * by T nor a divisor of it).  Thread-safety: a pure function. */
bool cpc_plan_sub(const cpc_plan *plan, int cfg_degree, int tp_degree, cpc_plan *sub);

/* The plan's cfg_degree and tp_degree as numbers >= 1 (omitted, and the
 * `auto` of an unresolved plan, count as 1). */
int cpc_plan_cfg_degree(const cpc_plan *plan);
int cpc_plan_tp_degree(const cpc_plan *plan);

/* Frees a plan and everything it owns.  NULL is ignored. */
void cpc_plan_free(cpc_plan *plan);

#endif
