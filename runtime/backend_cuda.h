/*
 * backend_cuda.h - the CUDA backend: device buffers, the NVRTC-generated
 * kernels of the artifact (the kernels folder, via compiler/codegen.h) for attention
 * blocks, LSE merge, pack/unpack, conversion; a compute stream and a
 * communication stream with events between them.
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

#include "../compiler/codegen.h"
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

#endif
