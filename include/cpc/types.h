/*
 * cpc/types.h - plain data types shared by libcpc's calls (SPEC section 8).
 *
 * Tensors are BSHD: [batch, sequence (tokens), heads, head_dim], the layout of
 * diffusers, xDiT and FlashAttention.  A cpc_tensor describes caller-owned
 * memory; libcpc never frees it and never keeps it past the call it is
 * passed to.
 */
#ifndef CPC_PUBLIC_TYPES_H
#define CPC_PUBLIC_TYPES_H

#include "cpc/export.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. */
typedef enum cpc_dtype {
    CPC_DTYPE_BF16 = 0,   /* bfloat16, 2 bytes */
    CPC_DTYPE_FP16,       /* IEEE half, 2 bytes */
    CPC_DTYPE_FP32,       /* IEEE single, 4 bytes */
    CPC_DTYPE__COUNT
} cpc_dtype;

/* Element types of tensors passed to a rank besides the plan's dtype. */
#define CPC_DTYPE_U8 ((cpc_dtype)100)   /* masks: 1 byte, 1 = the key takes part */

/* Roles of the tensors of one attention call. */
typedef enum cpc_tensor_role {
    CPC_TENSOR_Q = 0, /* queries  [B, S, H, D]   (this rank's shard: [B, T, H, D]) */
    CPC_TENSOR_K,     /* keys     [B, Skv, Hkv, D] */
    CPC_TENSOR_V,     /* values   [B, Skv, Hkv, D] */
    CPC_TENSOR_OUT,   /* output   [B, S, H, D] */
    CPC_TENSOR_LSE,   /* log-sum-exp (natural log), F32 [B, H, S] */
    CPC_TENSOR_MASK,   /* key padding, U8 [B, Skv] */
    /* the backward (training plans, cpc_rank_backward): */
    CPC_TENSOR_DOUT,  /* gradient of the loss w.r.t. out  [B, S, H, D] */
    CPC_TENSOR_DQ,    /* gradient w.r.t. q                [B, S, H, D] */
    CPC_TENSOR_DK,    /* gradient w.r.t. k                [B, Skv, Hkv, D] */
    CPC_TENSOR_DV,    /* gradient w.r.t. v                [B, Skv, Hkv, D] */
    CPC_TENSOR__COUNT
} cpc_tensor_role;

/* A strided view of caller memory.  Up to 4 dimensions (rank: 4 for BSHD
 * tensors, 3 for LSE [B, H, S], 2 for a mask [B, Skv]).  strides are in
 * ELEMENTS (not bytes), one per dimension; all zero means contiguous
 * row-major.  Strides must be positive, except that a dimension of extent 1
 * may have any stride.  `data` is host memory for the CPU backend and device
 * memory for the CUDA backend. */
typedef struct cpc_tensor {
    void *data;
    cpc_dtype dtype;
    int ndim;
    int64_t shape[4];
    int64_t strides[4];
} cpc_tensor;

/* A run of consecutive global token positions [start, start + len) (a
 * rank's shard is one run per segment, or several for zigzag layouts). */
typedef struct cpc_token_run {
    int64_t start;
    int64_t len;
} cpc_token_run;

#ifdef __cplusplus
}
#endif
#endif
