/*
 * cpu_kernels.h - pieces shared by the CPU backend's forward (backend_cpu.c)
 * and backward (attention_bwd_cpu.c) attention: the vectorised 2^x, scratch
 * buffers, and the backward's entry points
 * (positions, tiles, key padding and GQA heads are the problem's:
 * attn_problem.h).
 * Internal to runtime/backend (not part of the backend interface).
 *
 * The exponentials are a degree-6 polynomial for 2^f on [-1/2, 1/2]
 * (Chebyshev interpolation, max relative error 8e-8 in fp32) times 2^n built
 * in the exponent bits; inputs below -127 (and -inf) give exactly 0, NaN
 * stays NaN.
 */
#ifndef CPC_CPU_KERNELS_H
#define CPC_CPU_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPC_X86 1
#endif

#include "backend.h"

#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f

/* 2^f on [-0.5, 0.5]: Chebyshev interpolant of degree 6 (coefficients from
 * the monomial form, rounded to fp32). */
#define EXP2_C0 1.000000000e+00f
#define EXP2_C1 6.931471825e-01f
#define EXP2_C2 2.402265072e-01f
#define EXP2_C3 5.550327152e-02f
#define EXP2_C4 9.618056938e-03f
#define EXP2_C5 1.340042800e-03f
#define EXP2_C6 1.546144485e-04f

static inline float exp2_scalar(float x)
{
    if (!(x >= -127.0f)) /* also catches NaN: keep it */
        return x != x ? x : 0.0f;
    float n = nearbyintf(x);
    float f = x - n;
    float p = EXP2_C6;
    p = fmaf(p, f, EXP2_C5);
    p = fmaf(p, f, EXP2_C4);
    p = fmaf(p, f, EXP2_C3);
    p = fmaf(p, f, EXP2_C2);
    p = fmaf(p, f, EXP2_C1);
    p = fmaf(p, f, EXP2_C0);
    uint32_t e = (uint32_t)((int32_t)n + 127) << 23;
    float sc;
    memcpy(&sc, &e, sizeof sc);
    return p * sc;
}

#ifdef CPC_X86
__attribute__((target("avx2,fma"))) static inline __m256 exp2_avx2(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x); /* NaN in x stays NaN */
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(EXP2_C6);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C0));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) static inline __m256i tail_mask_avx2(int64_t r)
{
    /* lanes < r set */
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), idx);
}

__attribute__((target("avx512f"))) static inline __m512 exp2_avx512(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(EXP2_C6);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C0));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
#endif

/* ---- scratch ---- */

static inline void *aligned_alloc64(size_t bytes)
{
    void *p = NULL;
    size_t sz = (bytes + 63) & ~(size_t)63;
    if (sz == 0)
        sz = 64;
    if (posix_memalign(&p, 64, sz) != 0)
        return NULL;
    return p;
}

/* Makes *buf hold at least `bytes`; contents are not kept. */
static inline cpc_status *grow(void **buf, size_t *cap, size_t bytes)
{
    if (*cap >= bytes && *buf)
        return NULL;
    free(*buf);
    *buf = aligned_alloc64(bytes);
    if (!*buf) {
        *cap = 0;
        return cpc_error(CPC_E_NOMEM, "cpu backend: cannot allocate %zu bytes of scratch", bytes);
    }
    *cap = bytes;
    return NULL;
}

#define GROW(ctx, field, bytes) grow((void **)&(ctx)->field, &(ctx)->field##_cap, (bytes))

/* ---- the backward (attention_bwd_cpu.c) ---- */

/* Per-instance scratch of the backward, created on first use. */
typedef struct cpc_cpu_bwd cpc_cpu_bwd;

/* Runs cpc_attn_bwd_args on one thread; *state is the instance's scratch
 * (NULL before the first call; grown on demand). */
cpc_status *cpc_cpu_attn_bwd(cpc_cpu_bwd **state, const cpc_attn_bwd_args *a);
/* Frees the scratch (NULL is fine). */
void cpc_cpu_attn_bwd_free(cpc_cpu_bwd *state);

#endif
