/*
 * report.h - what cprun reports after a run (SPEC section 5), as text for
 * people and as JSON for tools.
 *
 * JSON (one object, exactly these keys):
 *   {"ok", "variant", "ring_degree", "ulysses_degree", "ranks", "backend",
 *    "transport", "attention", "ms_per_iter", "tflops", "bytes_sent_per_rank",
 *    "peak_memory_bytes_per_rank", "check": {"max_abs_err", "rel_err", "pass"}
 *    or null}, and with cfg_degree x tp_degree > 1 also "cfg_degree" and
 *    "tp_degree" (after "ulysses_degree"; "ranks" is then C*T*R*U)
 * bytes_sent_per_rank and peak_memory_bytes_per_rank are the maximum over
 * ranks (as cpc's `predicted` figures), bytes per iteration (one layer).
 * peak_memory_bytes_per_rank is what the executor allocates (buffers and
 * all-to-all staging); cpc's predicted memory_bytes_per_rank adds a fixed
 * GPU attention workspace (131072 + 2048 * head_dim bytes) and
 * cluster.reserved_gb (compiler/cost.h), so it is larger by exactly that;
 * the text form says so.
 * ms_per_iter is the median over timed iterations of the maximum over ranks;
 * tflops = 4*B*S*Skv*H*D (S^2 for self-attention; halved when causal) /
 * ms_per_iter.  The text form adds per-rank figures and the bandwidth.
 *
 * Thread-safety: pure functions of the report.
 */
#ifndef CPC_REPORT_H
#define CPC_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef struct cpc_run_report {
    bool ok;                        /* ran, and the check passed (or was off) */
    char plan_name[128];
    char variant[32];
    int ring_degree, ulysses_degree, ranks;
    int cfg_degree, tp_degree;      /* the outer axes (placement.h); 0 or 1: none */
    char backend[16], transport[16];
    char attention[320];            /* what served the blocks: "cpu", "cudnn", "nvrtc",
                                       "cudnn+nvrtc fallback (N of M blocks: reason)" */
    char dtype[8];
    int64_t B, S, Skv;
    int H, Hkv, D;
    bool causal;
    int warmup, iters;
    double *iter_ms;                /* [iters] max over ranks of each timed iteration (owned) */
    double ms_per_iter;             /* median of iter_ms */
    double flops;                   /* per iteration (formula above) */
    double tflops;
    int64_t bytes_sent_per_rank;    /* max over ranks */
    int64_t peak_memory_bytes_per_rank;  /* max over ranks */
    int64_t *rank_bytes_sent;       /* [ranks] (owned) */
    int64_t *rank_peak_bytes;       /* [ranks] (owned) */
    double *rank_comm_ms;           /* [ranks] communication time of the median iteration (owned) */
    double *rank_compute_ms;        /* [ranks] (owned) */
    double bandwidth_gbps;          /* bytes_sent_per_rank / max comm time, GB/s (0 if none) */
    bool checked;                   /* a check ran */
    bool check_sampled;             /* only a sample of rows was compared */
    int64_t check_rows;             /* query rows compared (per (b, head) summed) */
    double max_abs_err, rel_err, tolerance;
    double tolerance_base;          /* the dtype's tolerance (SPEC section 5) */
    double rounding_err;            /* relative error that rounding the logits in fp32
                                       causes on these inputs (reference.h bound);
                                       tolerance = max(tolerance_base, 8 x this) */
    int64_t n_nan, n_inf;           /* non-finite output elements, over the whole
                                       output of every rank (not only checked rows) */
    int64_t first_bad[4];           /* [b, s, h, d] of the first one (n_nan + n_inf > 0) */
    bool pass;
    char input[64];                 /* "seed 0" or the file name */
    /* Training plans (SPEC section 10): the backward pass after the forward. */
    bool backward;                  /* a backward pass ran */
    double bwd_ms_per_iter;         /* median over timed iterations, max over ranks */
    double bwd_flops, bwd_tflops;   /* 2.5 x the forward's FLOPs (halved if causal) */
    int64_t bwd_bytes_sent_per_rank;
    bool bwd_checked, bwd_pass;
    /* dq, dk, dv as the run returns them (--output, libcpc: rounded once to
     * the plan dtype from the fp32 accumulators) vs the float64 reference
     * gradients; the pass/fail check is on these */
    double bwd_rel_err[3];
    double bwd_max_abs_err[3];
    double bwd_rel_err_fp32[3];     /* the fp32 accumulators before that rounding
                                       (what grows with the world size, if anything) */
    double bwd_tolerance;           /* fp32 1e-5, fp16 as `out`, bf16 2e-2 */
    int64_t bwd_n_nan[3], bwd_n_inf[3]; /* non-finite dq, dk, dv elements (a NaN in
                                       dout or the inputs reaches them) */
} cpc_run_report;

/* Frees the arrays a report owns (the struct itself is the caller's). */
void cpc_run_report_clear(cpc_run_report *r);

/* Writes the human-readable report. */
CPC_API void cpc_run_report_print_text(const cpc_run_report *r, FILE *out);

/* The JSON object (exact keys above) as a malloc'd string (caller frees),
 * NULL on OOM. */
char *cpc_report_json(const cpc_run_report *r);

/* Writes cpc_report_json + newline.  Errors: CPC_E_NOMEM (CPC_E_IO when
 * the stream reports a write error). */
CPC_API cpc_status *cpc_run_report_print_json(const cpc_run_report *r, FILE *out);

/* The one JSON object cprun --format json prints when there is no report
 * (a rejected plan, a usage or input error, a runtime failure), so stdout
 * always parses: the report's keys, those not known null (`variant` NULL,
 * degrees and `ranks` <= 0: null), "ok": false, "check": null, and
 *   "error": {"code": "CP011" (the first error's rule) or its class name
 *             ("usage", "io", "input", "runtime", ...), "class": the class
 *             name, "message": the first error as on stderr
 *             ("file:line:col: error[CP011]: ...; hint: ..."),
 *             "exit_status": exit_status}.
 * `err` is the diagnostics chain (its first error is used; NULL: class
 * "usage" with `message`).  Malloc'd string (caller frees), NULL on OOM. */
char *cpc_report_failure_json(const char *variant, int ring_degree, int ulysses_degree, int ranks,
                              const cpc_status *err, const char *message, int exit_status);

#endif
