/*
 * backend_cuda.h - the CUDA backend: device buffers, the NVRTC-generated
 * kernels of the artifact (the kernels folder, via compiler/codegen.h) for attention
 * blocks, LSE merge, pack/unpack, conversion; a compute stream and a
 * communication stream with events between them.
 *
 * attn_bwd (backend.h cpc_attn_bwd_args) runs the generated backward kernels
 * of the artifact's "attention_bwd" module (kernels/attention_bwd.cu: delta,
 * then dK/dV and dQ as two deterministic kernels without atomics, on the
 * compute stream; docs/BACKWARD.md section 1.5); a backend made from an
 * artifact without that module has attn_bwd NULL (cpc_backend_has_attn_bwd).
 * Its refusals are the CPU backend's (CPC_E_INTERNAL, nothing launched), plus
 * a block whose dtype, head_dim, causal flag or group differs from the
 * kernels' specialisation, or whose saved out is neither fp32 nor the plan
 * dtype.  Tensors are device memory; the key padding mask (attn and
 * attn_bwd) may be the caller's pageable host mask, which is then copied to a
 * device scratch on every call (B x mask_len bytes, synchronised).
 *
 * Built only with the CUDA toolkit (CPC_HAVE_CUDA).  Without a GPU or driver,
 * cpc_cuda_device_count returns CPC_E_UNSUPPORTED ("no CUDA driver": cudart
 * reports cudaErrorInsufficientDriver), the cue for `--backend auto` to fall
 * back to the CPU and for `--backend cuda` to exit 3.
 *
 * Thread-safety: one backend instance per rank thread; instances on the same
 * GPU (virtual ranks) share the device but not streams or buffers.
 */
#ifndef CPC_BACKEND_CUDA_H
#define CPC_BACKEND_CUDA_H

#include "kernel.h"
#include "backend.h"

/* Number of visible GPUs, or CPC_E_UNSUPPORTED naming the CUDA error when
 * there is no usable driver/device. */
cpc_status *cpc_cuda_device_count(int *n);

/* Creates a backend on `device` (0-based) from compiled kernel modules
 * (`kernels[i].ptx` non-NULL, as stored in the artifact): loads every PTX
 * with cudaLibraryLoadData and looks up its kernels.  *out is owned by the
 * caller (vt->destroy).  Errors: CPC_E_UNSUPPORTED (no device),
 * CPC_E_RUNTIME (CUDA errors, named), CPC_E_INPUT (a module lacks PTX or a
 * kernel). */
cpc_status *cpc_cuda_backend_create(int device, const cpc_kernel_spec *spec,
                                    const cpc_kernel *kernels, int n_kernels,
                                    cpc_backend **out);

/* Attention path of a CUDA backend (cprun --attention).  Blocks that cuDNN
 * cannot serve (attention_cudnn.h: fp32, key padding, a causal block on the
 * diagonal, GQA head ranges it cannot express, a shape it refuses) run on
 * the generated kernel in every mode; the backend counts them.
 *   AUTO  (default) cuDNN's SDPA when it can serve the block, else the
 *         generated kernel; cuDNN being unusable (not built, older than
 *         9.13, cudnnCreate failing) only means every block falls back.
 *   CUDNN as AUTO, but cuDNN must be usable: setting it fails otherwise.
 *   NVRTC always the generated kernel (cuDNN is never touched). */
typedef enum cpc_cuda_attention {
    CPC_CUDA_ATTN_AUTO = 0,
    CPC_CUDA_ATTN_CUDNN,
    CPC_CUDA_ATTN_NVRTC,
    CPC_CUDA_ATTN__COUNT
} cpc_cuda_attention;

/* "auto", "cudnn", "nvrtc"; parse returns -1 for another name. */
const char *cpc_cuda_attention_name(cpc_cuda_attention m);
int cpc_cuda_attention_parse(const char *s);

/* Selects the attention path of `be` (a backend made by
 * cpc_cuda_backend_create).  CUDNN creates the cuDNN handle now.  Errors:
 * CPC_E_USAGE (not a CUDA backend, mode out of range), CPC_E_UNSUPPORTED
 * (CUDNN while cuDNN is unusable: the reason is named); the mode is then
 * unchanged.  Call between runs, from the thread that uses the backend. */
cpc_status *cpc_cuda_backend_set_attention(cpc_backend *be, cpc_cuda_attention mode);

/* Chooses the generated attention kernel of `be` for nvrtc blocks: "mma"
 * (default where available), "wmma" or "rowwarp" (see nvrtc_kernel below).
 * Errors: CPC_E_USAGE for another name, a kernel this plan's module lacks, or
 * a backend that is not CUDA; the choice is then unchanged.  Call between
 * runs, from the thread that uses the backend. */
cpc_status *cpc_cuda_backend_set_nvrtc_kernel(cpc_backend *be, const char *name);

/* What served the attention blocks of `be` since creation or the last reset,
 * for the report ("cudnn", or "cudnn (12 blocks fell back to nvrtc: ...)"). */
typedef struct cpc_cuda_attn_info {
    cpc_cuda_attention mode;
    bool cudnn_usable;          /* a cuDNN handle exists (created on first need) */
    long long cudnn_blocks;     /* blocks computed by cuDNN */
    long long nvrtc_blocks;     /* blocks computed by the generated kernel */
    long long fallback_blocks;  /* of those, blocks cuDNN was asked for and could not serve */
    char fallback_reason[256];  /* the first reason ("" when none) */
    size_t cudnn_version;       /* cudnnGetVersion() at run time, 0 without cuDNN */
    const char *nvrtc_kernel;   /* the generated kernel for nvrtc blocks: "mma" (mma.sync,
                                   bf16/fp16 with head_dim % 16 == 0 and <= 256), "wmma", or
                                   "rowwarp" (any dtype); the environment variable
                                   CPC_NVRTC_ATTN=mma|wmma|rowwarp overrides the choice at
                                   backend creation.  Static string. */
    const char *bwd_kernel;     /* the generated backward kernels of attn_bwd: "mma"
                                   (mma.sync, bf16/fp16 with head_dim % 16 == 0 and <= 128)
                                   or "simt" (fp32 FMAs, any dtype and head_dim); the
                                   environment variable CPC_NVRTC_ATTN_BWD=mma|simt overrides
                                   the choice at backend creation.  NULL: the artifact has no
                                   backward module (attn_bwd is then NULL).  Static string. */
} cpc_cuda_attn_info;

/* Fills *out (zeroed when `be` is not a CUDA backend); reset=true then
 * clears the counters and the reason. */
void cpc_cuda_backend_attention_info(cpc_backend *be, cpc_cuda_attn_info *out, bool reset);

#endif
