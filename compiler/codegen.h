/*
 * codegen.h - CUDA kernel generation for a plan (compiler stage "codegen").
 *
 * Kernels are specialised on what changes the code - dtype, head_dim, causal,
 * GQA ratio - and take sequence lengths, offsets and strides as arguments, so
 * a new resolution reuses compiled kernels.  Templates live in kernels/NAME.cu
 * (embedded into the binary at build time); this stage prepends the
 * specialisation constants (CPC_DTYPE, CPC_DTYPE_ID, CPC_HEAD_DIM,
 * CPC_CAUSAL, CPC_GQA) and compiles each module with NVRTC to PTX for the
 * target arch (default sm_90).  A second NVRTC compile to a cubin with
 * `-Xptxas=-v` yields ptxas' register / spill report per kernel.
 *
 * Cache: compiled PTX is stored under the cache directory
 * ($CPC_CACHE_DIR, else $XDG_CACHE_HOME/cpc, else $HOME/.cache/cpc) as
 * kernels/<sha256 of arch + options + source>.ptx, with the source beside it
 * (.cu); an unchanged kernel is not compiled again.  The cache is best effort: an unwritable
 * directory only costs a recompile.
 *
 * Without the CUDA toolkit (no CPC_HAVE_CUDA), sources are still generated;
 * compiling returns CPC_E_UNSUPPORTED.
 *
 * Thread-safety: NVRTC is thread-safe; the functions share no state except
 * the cache files (written atomically by rename).
 */
#ifndef CPC_CODEGEN_H
#define CPC_CODEGEN_H

#include <stdbool.h>

#include "kernel.h"
#include "plan.h"
#include "status.h"


/* Spec of a plan: its dtype, head_dim, mask and GQA ratio. */
cpc_kernel_spec cpc_kernel_spec_of(const cpc_plan *plan);

/* The modules generated for every plan, in this order: "memory"
 * (kernels/memory.cu: copies, LSE merge, init, conversions), "attention"
 * (kernels/attention.cu: the forward kernels) and "attention_bwd"
 * (kernels/attention_bwd.cu: the backward kernels of attn_bwd).  An artifact
 * written before the backward module existed holds the first two; its
 * CUDA backend then has no attn_bwd. */
#define CPC_CODEGEN_MODULES 3

/* Generates the modules' sources for `spec` and `arch` ("sm_90"): writes a
 * malloc'd array of *n = CPC_CODEGEN_MODULES kernels to *out (free with
 * cpc_kernels_free).
 * Errors: CPC_E_USAGE for a malformed arch or one this NVRTC cannot target
 * ("--arch sm_10: not supported by this NVRTC (supported: sm_75, ...)"),
 * CPC_E_NOMEM. */
cpc_status *cpc_codegen_sources(const cpc_kernel_spec *spec, const char *arch,
                                cpc_kernel **out, int *n);

/* Compiles one module to PTX with NVRTC (or takes it from the cache).
 * Errors: CPC_E_INTERNAL carrying NVRTC's log as a note when NVRTC rejects
 * the source; CPC_E_UNSUPPORTED without the CUDA toolkit. */
cpc_status *cpc_codegen_compile(cpc_kernel *k);

/* Compiles one module to a cubin with -Xptxas=-v and fills k->fns from
 * ptxas' report (registers, stack frame, spill stores/loads per function). */
cpc_status *cpc_codegen_report(cpc_kernel *k);

/* Fills k->fns from a ptxas -v log (what cpc_codegen_report does with
 * NVRTC's log or a cached one): per "Compiling entry function 'NAME'" the
 * "N bytes stack frame, N bytes spill stores, N bytes spill loads" and
 * "Used N registers" lines that follow.  Errors: CPC_E_INTERNAL when the log
 * names no function, CPC_E_NOMEM. */
cpc_status *cpc_codegen_parse_report(cpc_kernel *k, const char *log);

/* True when built with the CUDA toolkit (NVRTC available). */
bool cpc_codegen_available(void);

/* Writes each kernel's source to DIR/<name>_<arch>.cu (cpc --emit-kernels). */
cpc_status *cpc_codegen_emit(const char *dir, const cpc_kernel *k, int n);

/* Frees an array of n kernels from cpc_codegen_sources and everything they own.
 * NULL is ignored. */
void cpc_kernels_free(cpc_kernel *k, int n);

#endif
