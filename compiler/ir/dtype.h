/*
 * dtype.h - element conversions between fp32 and the 16-bit storage types
 * (bf16, fp16), scalar and bulk.
 *
 * Rounding (fp32 -> bf16/fp16) is IEEE 754 round to nearest, ties to even,
 * with subnormals produced and read exactly (no flush to zero), overflow to
 * +-inf (fp16: |x| >= 65520 becomes inf), +-inf kept, and NaN kept NaN: the
 * result is a quiet NaN with the same sign and the top payload bits (what
 * x86 F16C's VCVTPS2PH does).  Widening (bf16/fp16 -> fp32) is exact; a
 * signalling NaN comes back quiet.
 *
 * The bulk helpers use AVX2/F16C when the CPU has them (checked at run time,
 * so the binary runs on any x86-64) and give bit-identical results to the
 * scalar functions (tests/test_backend_cpu.c checks this).  All functions are
 * pure and thread-safe; none allocate.  `n` counts elements, never bytes.
 * Source and destination must not overlap unless they are the same pointer
 * with the same element size (then the call is a no-op or in place).
 *
 * The scalar functions are also declared in backend.h (same prototypes).
 */
#ifndef CPC_DTYPE_H
#define CPC_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

/* Scalar conversions (bit patterns in uint16_t). */
float cpc_bf16_to_f32(uint16_t h);
uint16_t cpc_f32_to_bf16(float f);
float cpc_fp16_to_f32(uint16_t h);
uint16_t cpc_f32_to_fp16(float f);

/* Bulk conversions of n elements. */
void cpc_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void cpc_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
void cpc_fp16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void cpc_f32_to_fp16_n(uint16_t *dst, const float *src, size_t n);

/* dst[i] = (float)src[i] for src of dtype t (fp32: a copy). */
void cpc_to_f32_n(float *dst, const void *src, cpc_dtype t, size_t n);

/* dst[i] = src[i] * scale (src of dtype t; the product is rounded once, in
 * fp32).  Used to load query tiles with the softmax scale folded in. */
void cpc_to_f32_scaled_n(float *dst, const void *src, cpc_dtype t, size_t n, float scale);

/* dst (dtype t) = round(src[i]) (fp32: a copy). */
void cpc_from_f32_n(void *dst, cpc_dtype t, const float *src, size_t n);

/* Element i of an array of dtype t, widened exactly to double. */
double cpc_dtype_get_f64(const void *base, cpc_dtype t, size_t i);

/* Converts n elements of src (dtype src_t) into dst (dtype dst_t), any pair
 * of dtypes (bf16 <-> fp16 goes through fp32 exactly, then rounds once).
 * Same dtype: a memmove. */
void cpc_convert_n(void *dst, cpc_dtype dst_t, const void *src, cpc_dtype src_t, size_t n);

#endif
