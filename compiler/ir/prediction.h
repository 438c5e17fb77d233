/*
 * prediction.h - the cost model's prediction for one candidate, as the IR
 * carries it: computed by the compiler's cost stage (cost.h, which documents
 * each figure's model), stored in artifacts (artifact.h), reported by cpc and
 * cprun.  Times in milliseconds, sizes in bytes, FLOPs as counts.  Plain
 * data: no functions.
 */
#ifndef CPC_PREDICTION_H
#define CPC_PREDICTION_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cpc_prediction {
    double ms_per_layer;            /* max over ranks */
    double ms_per_forward;          /* x model.layers */
    double compute_ms_per_layer;    /* attention + memory-bound ops, max over ranks */
    double comm_ms_per_layer;       /* communication not hidden, max over ranks */
    int64_t memory_bytes_per_rank;  /* peak over ranks: cprun's peak_memory_bytes_per_rank
                                       + attention workspace + reserved_gb (see above); with
                                       model.parameters on a GPU also the deployment's weights,
                                       activations and VAE decode (cost.h MEMORY) */
    int64_t buffer_bytes_per_rank;  /* peak over ranks, buffers and all-to-all staging */
    int64_t bytes_sent_per_rank;    /* per layer, max over ranks */
    double flops_per_layer;         /* total over ranks */
    bool fits;                      /* memory <= device memory */
    /* Whole step (model.parameters > 0, else 0; see WHOLE STEP in cost.h): */
    double ms_per_step;             /* max(device, host) */
    double ms_per_image;            /* x input.steps (0 without it) */
    double dense_ms_per_step;       /* dense GEMMs (+ TP all-reduces) on the device */
    double device_ms_per_step;      /* dense + attention forward */
    double host_ms_per_step;        /* the framework's host time */
    double host_ops_per_layer;      /* attention-program ops the host issues per layer */
    double tp_ms_per_step;          /* part of dense_ms_per_step: TP all-reduces, their launches
                                       and the work TP does not split (0 when tp_degree is 1) */
    double gemm_roofline;           /* GEMM time / the time at the GEMM rate (>= 1: the
                                       roofline's memory-bound share; 0 without model.parameters) */
    /* The step broken down (cost.h WHOLE STEP; each per step, ms; they add up to
     * ms_per_step: gemm + attention + memory_bound + comm + host_exposed): */
    double gemm_ms_per_step;        /* the blocks' GEMMs (shape efficiency, roofline) */
    double attn_ms_per_step;        /* attention kernels (the op program's attn ops) */
    double memory_ms_per_step;      /* memory-bound work: norms, modulation, RoPE, activations,
                                       residuals, casts, the program's merges/copies/packs */
    double comm_ms_per_step;        /* communication not hidden (attention program + TP) */
    double host_exposed_ms_per_step;/* host time the device waits for: max(0, host - device) */
    double gemm_efficiency;         /* achieved GEMM rate / the device's peak (0 = n/a) */
    /* PIPELINE (per image/video, included in ms_per_image): */
    double text_encoder_ms;
    double vae_decode_ms;
    /* MEMORY of the deployment (included in memory_bytes_per_rank): */
    int64_t weights_bytes_per_rank;     /* model.parameters x dtype / tp_degree */
    int64_t activation_bytes_per_rank;  /* a block's live activations */
    int64_t vae_bytes_per_rank;         /* the VAE decode's peak besides the weights */
} cpc_prediction;

#endif
