/*
 * kernel.h - the compiled-kernel records of the IR: what a kernel module is
 * specialised on (cpc_kernel_spec), ptxas' per-function report and one
 * compiled module (cpc_kernel).  Produced by the compiler's codegen stage
 * (codegen.h), stored in artifacts (artifact.h) and consumed by the CUDA
 * backend (backend_cuda.h); kept here so that the runtime needs no compiler
 * stage header.  Plain data: no functions.
 */
#ifndef CPC_KERNEL_H
#define CPC_KERNEL_H

#include <stdbool.h>

#include "plan.h"

/* What a kernel module is specialised on. */
typedef struct cpc_kernel_spec {
    cpc_dtype dtype;
    int head_dim;
    bool causal;
    int gqa;          /* H / Hkv */
} cpc_kernel_spec;

/* ptxas' report for one __global__ function. */
typedef struct cpc_kernel_fn_report {
    char name[64];
    int registers;
    int stack_bytes;
    int spill_store_bytes;
    int spill_load_bytes;
} cpc_kernel_fn_report;

typedef struct cpc_kernel {
    char *name;        /* module name: "memory", "attention" (owned) */
    char *arch;        /* "sm_90" (owned) */
    char *source;      /* full CUDA source compiled (owned) */
    char *hash;        /* sha256 hex of arch + options + source (owned) */
    char *ptx;         /* NULL until compiled (owned) */
    char *log;         /* NVRTC log of the last compile, may be NULL (owned) */
    bool from_cache;   /* PTX came from the cache */
    int n_fns;
    cpc_kernel_fn_report *fns;   /* filled by cpc_codegen_report (owned) */
} cpc_kernel;

#endif
