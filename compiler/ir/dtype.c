/* dtype.c - fp32 <-> bf16/fp16 conversions; see dtype.h. */
#include "dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <string.h>

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- scalar ------------------------------------------------------------------ */

float cpc_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x00400000u; /* quiet a signalling NaN */
    return u2f(u);
}

uint16_t cpc_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign and top payload kept */
    /* Round to nearest even on the 16 dropped bits; a carry out of the
     * mantissa bumps the exponent, and the largest finite values round to inf
     * exactly as IEEE prescribes. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float cpc_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in fp32 */
        float v = (float)mant * 0x1p-24f;
        return u2f(f2u(v) | sign);
    }
    if (exp == 31) {
        if (mant == 0)
            return u2f(sign | 0x7f800000u);
        return u2f(sign | 0x7fc00000u | (mant << 13)); /* quiet NaN */
    }
    return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t cpc_f32_to_fp16(float f)
{
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t x = u & 0x7fffffffu;
    if (x >= 0x7f800000u) {
        if (x > 0x7f800000u)
            return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu)); /* quiet NaN */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (x >= 0x477ff000u) /* >= 65520: rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (x >= 0x38800000u) { /* normal fp16 (>= 2^-14) */
        x += 0xfffu + ((x >> 13) & 1u);
        x -= 112u << 23;
        return (uint16_t)(sign | (x >> 13));
    }
    /* Subnormal fp16 or zero.  0.5f + |f| rounds (ties to even, default
     * rounding mode) to a multiple of 2^-24, the fp16 subnormal step; the
     * difference of the bit patterns is the fp16 mantissa (1024 = the
     * smallest normal, when |f| rounds up to 2^-14). */
    float v = 0.5f + u2f(x);
    return (uint16_t)(sign | (f2u(v) - 0x3f000000u));
}

/* ---- bulk, AVX2 + F16C --------------------------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)
#define CPC_X86 1
#include <cpuid.h>

static int have_avx2_f16c(void)
{
    static int cached = -1;
    int c = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (c < 0) {
        __builtin_cpu_init();
        /* F16C is CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports
         * does not know "f16c") */
        unsigned a = 0, b = 0, cx = 0, d = 0;
        int f16c = __get_cpuid(1, &a, &b, &cx, &d) && (cx & (1u << 29));
        c = __builtin_cpu_supports("avx2") && f16c && __builtin_cpu_supports("fma");
        __atomic_store_n(&cached, c, __ATOMIC_RELAXED);
    }
    return c;
}

__attribute__((target("avx2,f16c,fma"))) static size_t bf16_to_f32_avx2(float *dst,
                                                                       const uint16_t *src,
                                                                       size_t n, float scale,
                                                                       int scaled)
{
    size_t i = 0;
    __m256 vs = _mm256_set1_ps(scale);
    const __m256i nanmin = _mm256_set1_epi32(0x7f800000);
    const __m256i absm = _mm256_set1_epi32(0x7fffffff);
    const __m256i quiet = _mm256_set1_epi32(0x00400000);
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        w = _mm256_slli_epi32(w, 16);
        __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(w, absm), nanmin);
        w = _mm256_or_si256(w, _mm256_and_si256(isnan, quiet));
        __m256 f = _mm256_castsi256_ps(w);
        if (scaled)
            f = _mm256_mul_ps(f, vs);
        _mm256_storeu_ps(dst + i, f);
    }
    return i;
}

__attribute__((target("avx2,f16c,fma"))) static size_t f32_to_bf16_avx2(uint16_t *dst,
                                                                       const float *src,
                                                                       size_t n)
{
    size_t i = 0;
    const __m256i absm = _mm256_set1_epi32(0x7fffffff);
    const __m256i infb = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff);
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i qbit = _mm256_set1_epi32(0x0040);
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), infb);
        __m256i hi = _mm256_srli_epi32(u, 16);
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one)));
        r = _mm256_srli_epi32(r, 16);
        __m256i nanv = _mm256_or_si256(hi, qbit);
        r = _mm256_blendv_epi8(r, nanv, isnan);
        /* pack 8 x u32 (each < 65536) into 8 x u16 */
        __m256i p = _mm256_packus_epi32(r, r);           /* lanes: [0..3 0..3 | 4..7 4..7] */
        p = _mm256_permute4x64_epi64(p, 0x08);           /* [0..3 4..7 ...] */
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(p));
    }
    return i;
}

__attribute__((target("avx2,f16c,fma"))) static size_t fp16_to_f32_avx2(float *dst,
                                                                       const uint16_t *src,
                                                                       size_t n, float scale,
                                                                       int scaled)
{
    size_t i = 0;
    __m256 vs = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
        if (scaled)
            f = _mm256_mul_ps(f, vs);
        _mm256_storeu_ps(dst + i, f);
    }
    return i;
}

__attribute__((target("avx2,f16c,fma"))) static size_t f32_to_fp16_avx2(uint16_t *dst,
                                                                       const float *src,
                                                                       size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    return i;
}

__attribute__((target("avx2,f16c,fma"))) static size_t f32_scale_avx2(float *dst,
                                                                     const float *src,
                                                                     size_t n, float scale)
{
    size_t i = 0;
    __m256 vs = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), vs));
    return i;
}
#endif

void cpc_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
#ifdef CPC_X86
    if (have_avx2_f16c())
        i = bf16_to_f32_avx2(dst, src, n, 1.0f, 0);
#endif
    for (; i < n; i++)
        dst[i] = cpc_bf16_to_f32(src[i]);
}

void cpc_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
#ifdef CPC_X86
    if (have_avx2_f16c())
        i = f32_to_bf16_avx2(dst, src, n);
#endif
    for (; i < n; i++)
        dst[i] = cpc_f32_to_bf16(src[i]);
}

void cpc_fp16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
#ifdef CPC_X86
    if (have_avx2_f16c())
        i = fp16_to_f32_avx2(dst, src, n, 1.0f, 0);
#endif
    for (; i < n; i++)
        dst[i] = cpc_fp16_to_f32(src[i]);
}

void cpc_f32_to_fp16_n(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
#ifdef CPC_X86
    if (have_avx2_f16c())
        i = f32_to_fp16_avx2(dst, src, n);
#endif
    for (; i < n; i++)
        dst[i] = cpc_f32_to_fp16(src[i]);
}

void cpc_to_f32_n(float *dst, const void *src, cpc_dtype t, size_t n)
{
    switch (t) {
    case CPC_DTYPE_BF16:
        cpc_bf16_to_f32_n(dst, src, n);
        break;
    case CPC_DTYPE_FP16:
        cpc_fp16_to_f32_n(dst, src, n);
        break;
    default:
        if ((const void *)dst != src)
            memmove(dst, src, n * sizeof(float));
        break;
    }
}

void cpc_to_f32_scaled_n(float *dst, const void *src, cpc_dtype t, size_t n, float scale)
{
    size_t i = 0;
    switch (t) {
    case CPC_DTYPE_BF16: {
        const uint16_t *s = src;
#ifdef CPC_X86
        if (have_avx2_f16c())
            i = bf16_to_f32_avx2(dst, s, n, scale, 1);
#endif
        for (; i < n; i++)
            dst[i] = cpc_bf16_to_f32(s[i]) * scale;
        break;
    }
    case CPC_DTYPE_FP16: {
        const uint16_t *s = src;
#ifdef CPC_X86
        if (have_avx2_f16c())
            i = fp16_to_f32_avx2(dst, s, n, scale, 1);
#endif
        for (; i < n; i++)
            dst[i] = cpc_fp16_to_f32(s[i]) * scale;
        break;
    }
    default: {
        const float *s = src;
#ifdef CPC_X86
        if (have_avx2_f16c())
            i = f32_scale_avx2(dst, s, n, scale);
#endif
        for (; i < n; i++)
            dst[i] = s[i] * scale;
        break;
    }
    }
}

void cpc_from_f32_n(void *dst, cpc_dtype t, const float *src, size_t n)
{
    switch (t) {
    case CPC_DTYPE_BF16:
        cpc_f32_to_bf16_n(dst, src, n);
        break;
    case CPC_DTYPE_FP16:
        cpc_f32_to_fp16_n(dst, src, n);
        break;
    default:
        if (dst != (const void *)src)
            memmove(dst, src, n * sizeof(float));
        break;
    }
}

double cpc_dtype_get_f64(const void *base, cpc_dtype t, size_t i)
{
    switch (t) {
    case CPC_DTYPE_BF16:
        return (double)cpc_bf16_to_f32(((const uint16_t *)base)[i]);
    case CPC_DTYPE_FP16:
        return (double)cpc_fp16_to_f32(((const uint16_t *)base)[i]);
    default:
        return (double)((const float *)base)[i];
    }
}

void cpc_convert_n(void *dst, cpc_dtype dst_t, const void *src, cpc_dtype src_t, size_t n)
{
    if (dst_t == src_t) {
        if (dst != src)
            memmove(dst, src, n * (dst_t == CPC_DTYPE_FP32 ? 4u : 2u));
        return;
    }
    if (src_t == CPC_DTYPE_FP32) {
        cpc_from_f32_n(dst, dst_t, src, n);
        return;
    }
    if (dst_t == CPC_DTYPE_FP32) {
        cpc_to_f32_n(dst, src, src_t, n);
        return;
    }
    /* bf16 <-> fp16: through fp32 in chunks (widening is exact). */
    float buf[1024];
    const uint16_t *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i += 1024) {
        size_t m = n - i < 1024 ? n - i : 1024;
        cpc_to_f32_n(buf, s + i, src_t, m);
        cpc_from_f32_n(d + i, dst_t, buf, m);
    }
}
