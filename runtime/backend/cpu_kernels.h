/*
 * cpu_kernels.h - pieces shared by the CPU backend's forward (backend_cpu.c)
 * and backward (attention_bwd_cpu.c) attention: the vectorised 2^x, scratch
 * buffers, key/query positions from runs, and the backward's entry points.
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

/* Fills pos[0..n) from the runs (no runs: 0..n-1).  Returns false when the
 * runs do not add up to n. */
static inline bool fill_positions(int64_t *pos, int64_t n, const cpc_run *runs, int n_runs)
{
    if (!runs || n_runs == 0) {
        for (int64_t i = 0; i < n; i++)
            pos[i] = i;
        return true;
    }
    int64_t c = 0;
    for (int r = 0; r < n_runs; r++) {
        if (runs[r].len < 0 || c + runs[r].len > n)
            return false;
        for (int64_t t = 0; t < runs[r].len; t++)
            pos[c++] = runs[r].start + t;
    }
    return c == n;
}

/* For increasing a[0..n): how many elements are <= x, and < x. */
static inline int count_le(const int64_t *a, int n, int64_t x)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (a[mid] <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static inline int count_lt(const int64_t *a, int n, int64_t x)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---- tiles, key padding and GQA heads (forward and backward alike) ---- */

/* Per key tile: position range, whether positions increase, masked keys. */
enum { KT_MIN = 0, KT_MAX, KT_INC, KT_MASKED, KT_N };

/* For every tile of t rows of the positions pos[0..n): desc[k*stride + 0] =
 * the smallest position, + 1 the largest, + 2 whether they increase. */
static inline void cpu_tile_desc(const int64_t *pos, int64_t n, int t, int64_t *desc, int stride)
{
    for (int64_t k = 0, j0 = 0; j0 < n; k++, j0 += t) {
        int64_t j1 = j0 + t < n ? j0 + t : n;
        int64_t mn = pos[j0], mx = pos[j0], inc = 1;
        for (int64_t j = j0 + 1; j < j1; j++) {
            mn = pos[j] < mn ? pos[j] : mn;
            mx = pos[j] > mx ? pos[j] : mx;
            if (pos[j] < pos[j - 1])
                inc = 0;
        }
        desc[k * stride + 0] = mn;
        desc[k * stride + 1] = mx;
        desc[k * stride + 2] = inc;
    }
}

/* Key padding of one batch row (mk indexed by global key position): bias[j]
 * = 0 for a key that takes part, -inf otherwise, and kt[tile * KT_N +
 * KT_MASKED] = the masked keys of each tile of tk keys. */
static inline void cpu_key_padding(const uint8_t *mk, const int64_t *kpos, int64_t skv, int tk,
                                   float *bias, int64_t *kt)
{
    for (int64_t t = 0, j0 = 0; j0 < skv; t++, j0 += tk) {
        int64_t j1 = j0 + tk < skv ? j0 + tk : skv, cnt = 0;
        for (int64_t j = j0; j < j1; j++) {
            bool on = mk[kpos[j]] != 0;
            bias[j] = on ? 0.0f : -INFINITY;
            cnt += !on;
        }
        kt[t * KT_N + KT_MASKED] = cnt;
    }
}

/* The local query heads [h0, h1) that use local K/V head kvl (GQA: global
 * K/V head kv_head_off + kvl serves query heads g*group .. g*group+group-1);
 * false when no query head of the call uses it. */
static inline bool cpu_gqa_heads(int kv_head_off, int kvl, int group, int q_head_off, int hq, int *h0,
                                 int *h1)
{
    int g = kv_head_off + kvl;
    int a = g * group - q_head_off, b = a + group;
    *h0 = a < 0 ? 0 : a;
    *h1 = b > hq ? hq : b;
    return *h0 < *h1;
}

/* Masks one row of scores sr[0..bcx) of a key tile in place: on a tile that
 * straddles the causal diagonal (`diag`), keys at positions kp[j] > qp get
 * -inf (with increasing positions, `inc`, the visible keys are a prefix);
 * with key padding (`bias` not NULL) the tile's bias (0 or -inf) is added. */
static inline void cpu_mask_row(float *sr, int bcx, bool diag, bool inc, const int64_t *kp,
                                int64_t qp, const float *bias)
{
    if (diag) {
        if (inc) {
            for (int j = count_le(kp, bcx, qp); j < bcx; j++)
                sr[j] = -INFINITY;
        } else {
            for (int j = 0; j < bcx; j++)
                if (kp[j] > qp)
                    sr[j] = -INFINITY;
        }
    }
    if (bias)
        for (int j = 0; j < bcx; j++)
            sr[j] += bias[j];
}

/* ---- the backward (attention_bwd_cpu.c) ---- */

/* Per-instance scratch of the backward, created on first use. */
typedef struct cpc_cpu_bwd cpc_cpu_bwd;

/* Runs cpc_attn_bwd_args on one thread; *state is the instance's scratch
 * (NULL before the first call; grown on demand). */
cpc_status *cpc_cpu_attn_bwd(cpc_cpu_bwd **state, const cpc_attn_bwd_args *a);
/* Frees the scratch (NULL is fine). */
void cpc_cpu_attn_bwd_free(cpc_cpu_bwd *state);

#endif
