/*
 * cpc/cpc.h - libcpc, the context-parallel attention plan compiler and
 * runtime as a C library (SPEC section 8).  Include this one header.
 *
 *   cpc/status.h    errors and diagnostics (OK is NULL)
 *   cpc/types.h     dtypes, tensor views (BSHD), token runs
 *   cpc/compiler.h  compile a plan (file or string) into a proven artifact;
 *                   read / write .cplan files; query mesh, shapes, predictions
 *   cpc/rank.h      one rank bound to the caller's MPI communicator, NCCL
 *                   communicator or an in-process world; attention forward
 *                   on caller buffers with no allocation per call
 *   cpc/compilation.h  the pipeline's whole result as `cpc` shows it:
 *                   diagnostics, candidates, schedule, kernels
 *   cpc/session.h   the whole job as cprun runs it (every rank, inputs,
 *                   check, report), and machine calibration
 *   (cpc/tool.h     NOT part of libcpc: the tools' policy, exit statuses,
 *                   atomic files, --option checks; static cpc_tool, not
 *                   installed, not included here)
 *
 * Conventions of every header:
 *   - one lifecycle vocabulary: an object is made by cpc_X_new (or by the
 *     verbs that name how: cpc_compile_plan_*, cpc_artifact_load) and freed
 *     by cpc_X_free (NULL ignored); options structs are filled by
 *     cpc_X_options_init(&o, sizeof o);
 *   - subject first: a function on an object takes that object as its first
 *     argument (cpc_artifact_write(a, path), cpc_status_print(st, out,
 *     prog), cpc_run_report_print_json(r, out));
 *   - input structs begin with `size` (compiler.h THE SIZE MEMBER);
 *   - the names before these conventions are deprecated macros (rank.h
 *     DEPRECATED NAMES; CPC_NO_DEPRECATED drops them).
 *
 * Link: `pkg-config --cflags --libs cpc`, or CMake `find_package(cpc)` and
 * target `cpc::cpc`.  Only `cpc_` symbols are exported.
 */
#ifndef CPC_PUBLIC_CPC_H
#define CPC_PUBLIC_CPC_H

#include "cpc/export.h"

#include "cpc/compilation.h"
#include "cpc/compiler.h"
#include "cpc/rank.h"
#include "cpc/session.h"
#include "cpc/status.h"
#include "cpc/types.h"
#include "cpc/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library version, "MAJOR.MINOR.PATCH" (what `cpc --version` prints):
 * the linked library's, where cpc/version.h's CPC_VERSION_MAJOR/MINOR/PATCH
 * are the headers' (compiled in).  Static string; thread-safe. */
CPC_API const char *cpc_version(void);

/* Whether this build of libcpc has MPI, CUDA (NVRTC and the runtime), NCCL
 * and cuDNN support; a feature that is absent answers CPC_E_UNSUPPORTED
 * when used. */
CPC_API bool cpc_have_mpi(void);
CPC_API bool cpc_have_cuda(void);
CPC_API bool cpc_have_nccl(void);
CPC_API bool cpc_have_cudnn(void);

#ifdef __cplusplus
}
#endif
#endif
