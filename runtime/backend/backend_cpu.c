/*
 * backend_cpu.c - the CPU backend (see backend.h): tiled flash attention with
 * online softmax (FlashAttention-2, Dao 2023, Algorithm 1, forward pass), on
 * one thread, with OpenBLAS SGEMM for both products of every tile.
 *
 * attn, for every batch b and K/V head:
 *   - K and V of that head are made contiguous fp32 rows once (bf16/fp16
 *     widened into a scratch buffer, fp32 copied there too unless the block
 *     has a single K/V head, whose rows are already contiguous);
 *   - for every query head of the GQA group and every tile of TQ query rows:
 *     Q' = Q * scale * log2(e) (so the softmax uses exp2), O = 0, m = -inf,
 *     l = 0; for every tile of TK keys that some row of the tile can see:
 *         S = Q' K^T                      (cblas_sgemm, TQ x TK x D)
 *         mask S (causal by global position / key padding) on the tiles that
 *         need it; tiles no row can see are skipped before the product;
 *         m' = max(m, rowmax S); P = exp2(S - m'); l = l 2^(m-m') + rowsum P;
 *         O = O 2^(m-m') + P V            (cblas_sgemm, TQ x D x TK, beta 1)
 *     and finally O /= l, LSE = (m + log2 l) ln 2; a row with l = 0 (no
 *     visible key) keeps O = 0 and gets LSE = -inf.
 *   O is accumulated in place in the caller's fp32 output.  When skv * max|v|
 *   of a K/V head reaches 2^120 (finite bf16/fp32 values near FLT_MAX), V is
 *   scaled by a power of two 2^-(e-1) (max|v| = f 2^e) before P V and the
 *   final O /= l multiplies by 2^(e-1) again: the accumulator never exceeds
 *   2 skv, so a finite true result never reads as Inf (cpu_v_scale).
 *
 * The backward (attn_bwd) is in attention_bwd_cpu.c; the pieces both use
 * (2^x, scratch, positions from runs) are in cpu_kernels.h.
 *
 * The exponentials are a degree-6 polynomial for 2^f on [-1/2, 1/2]
 * (Chebyshev interpolation, max relative error 8e-8 in fp32) times 2^n built
 * in the exponent bits, vectorised for AVX-512 or AVX2 (chosen at run time;
 * a scalar version otherwise).
 *
 * Tile sizes: TQ x TK = 256 x 512 by default (measured best on an x86-64
 * AVX-512 machine with 2 MiB L2; see bench/bench_attention.c); the
 * environment variable CPC_CPU_ATTN_TILES="<TQ>x<TK>" overrides them when the
 * backend is created (for tuning).
 *
 * Thread-safety: one backend instance per rank thread; an instance's methods
 * must not be called from two threads at once (the scratch buffers are per
 * instance).  Instances share nothing.
 */
#include "backend.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

#define LN2_D 0.69314718055994530942
#include "dtype.h"

typedef float (*row_max_fn)(const float *s, int64_t n);
typedef float (*row_exp_fn)(float *s, int64_t n, float m); /* s = 2^(s-m), returns sum */

typedef struct cpu_ctx {
    int tq, tk;               /* tile sizes (query rows, keys) */
    row_max_fn row_max;
    row_exp_fn row_exp;
    /* scratch, grown on demand, 64-byte aligned */
    float *qt;     size_t qt_cap;    /* [tq, d] scaled query tile */
    float *s;      size_t s_cap;     /* [tq, tk] scores / probabilities */
    float *kbuf;   size_t kbuf_cap;  /* [skv, d] fp32 K of one head (16-bit inputs) */
    float *vbuf;   size_t vbuf_cap;  /* [skv, d] fp32 V of one head */
    float *m;      size_t m_cap;     /* [tq] running max (log2 units) */
    float *l;      size_t l_cap;     /* [tq] running sum */
    cpc_attn_tiling tiles;           /* positions, tiles and key padding (attn_problem.h) */
    cpc_cpu_bwd *bwd;                /* the backward's scratch (attention_bwd_cpu.c) */
} cpu_ctx;

/* ---- max / exp kernels (2^x itself: cpu_kernels.h) ------------------------------ */

static float row_max_scalar(const float *s, int64_t n)
{
    float m = -INFINITY;
    bool nan = false;
    for (int64_t j = 0; j < n; j++) {
        m = s[j] > m ? s[j] : m;
        nan |= s[j] != s[j];
    }
    return nan ? NAN : m;
}

static float row_exp_scalar(float *s, int64_t n, float m)
{
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float p = exp2_scalar(s[j] - m);
        s[j] = p;
        sum += p;
    }
    return sum;
}

#ifdef CPC_X86
__attribute__((target("avx2,fma"))) static float row_max_avx2(const float *s, int64_t n)
{
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m256 un = _mm256_setzero_ps(); /* NaN lanes seen (max_ps drops NaNs) */
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 x0 = _mm256_loadu_ps(s + j), x1 = _mm256_loadu_ps(s + j + 8);
        __m256 x2 = _mm256_loadu_ps(s + j + 16), x3 = _mm256_loadu_ps(s + j + 24);
        m0 = _mm256_max_ps(m0, x0);
        m1 = _mm256_max_ps(m1, x1);
        m2 = _mm256_max_ps(m2, x2);
        m3 = _mm256_max_ps(m3, x3);
        un = _mm256_or_ps(un, _mm256_or_ps(_mm256_cmp_ps(x0, x1, _CMP_UNORD_Q),
                                           _mm256_cmp_ps(x2, x3, _CMP_UNORD_Q)));
    }
    for (; j + 8 <= n; j += 8) {
        __m256 x0 = _mm256_loadu_ps(s + j);
        m0 = _mm256_max_ps(m0, x0);
        un = _mm256_or_ps(un, _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(un))
        return NAN;
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float m = _mm_cvtss_f32(h);
    for (; j < n; j++) {
        if (s[j] != s[j])
            return NAN;
        m = s[j] > m ? s[j] : m;
    }
    return m;
}

__attribute__((target("avx2,fma"))) static float row_exp_avx2(float *s, int64_t n, float m)
{
    __m256 vm = _mm256_set1_ps(m);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 p0 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        __m256 p1 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm));
        _mm256_storeu_ps(s + j, p0);
        _mm256_storeu_ps(s + j + 8, p1);
        a0 = _mm256_add_ps(a0, p0);
        a1 = _mm256_add_ps(a1, p1);
    }
    for (; j < n; j += 8) {
        __m256i mk = tail_mask_avx2(n - j);
        __m256 x = _mm256_maskload_ps(s + j, mk);
        __m256 p = exp2_avx2(_mm256_sub_ps(x, vm));
        p = _mm256_and_ps(p, _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(s + j, mk, p);
        a0 = _mm256_add_ps(a0, p);
    }
    a0 = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

__attribute__((target("avx512f"))) static float row_max_avx512(const float *s, int64_t n)
{
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
    __mmask16 un = 0; /* NaN lanes seen (max_ps drops NaNs) */
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 x0 = _mm512_loadu_ps(s + j), x1 = _mm512_loadu_ps(s + j + 16);
        m0 = _mm512_max_ps(m0, x0);
        m1 = _mm512_max_ps(m1, x1);
        un |= _mm512_cmp_ps_mask(x0, x1, _CMP_UNORD_Q);
    }
    for (; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 x0 = _mm512_maskz_loadu_ps(k, s + j);
        m0 = _mm512_mask_max_ps(m0, k, m0, x0);
        un |= _mm512_mask_cmp_ps_mask(k, x0, x0, _CMP_UNORD_Q);
    }
    if (un)
        return NAN;
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

__attribute__((target("avx512f"))) static float row_exp_avx512(float *s, int64_t n, float m)
{
    __m512 vm = _mm512_set1_ps(m);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 p0 = exp2_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
        __m512 p1 = exp2_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), vm));
        _mm512_storeu_ps(s + j, p0);
        _mm512_storeu_ps(s + j + 16, p1);
        a0 = _mm512_add_ps(a0, p0);
        a1 = _mm512_add_ps(a1, p1);
    }
    for (; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 p = exp2_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm));
        _mm512_mask_storeu_ps(s + j, k, p);
        a0 = _mm512_mask_add_ps(a0, k, a0, p);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}
#endif

/* ---- attention ----------------------------------------------------------------- */

static size_t dt_size(cpc_dtype t) { return t == CPC_DTYPE_FP32 ? 4u : 2u; }

/* Whether P V must be accumulated scaled: the accumulator of a row is at most
 * l * max|v| <= skv * max|v| (every p <= 1), which overflows fp32 for finite v
 * near FLT_MAX (bf16/fp32 inputs).  When skv * max|v| >= 2^120, *vs = 2^-(e-1)
 * with max|v| = f 2^e, f in [0.5, 1) (so max|v| vs < 2 and the accumulator
 * stays below 2 skv), *vinv = 2^(e-1) <= 2^127, and true is returned; else
 * 1, 1, false.  An Inf or NaN in v is left to propagate (no scaling).  V has
 * skv rows of d floats, row stride ldv. */
static bool cpu_v_scale(const float *V, int64_t ldv, int64_t skv, int d, float *vs, float *vinv)
{
    float vmax = 0.0f;
    for (int64_t j = 0; j < skv; j++)
        for (int e = 0; e < d; e++) {
            float x = fabsf(V[j * ldv + e]);
            vmax = x > vmax ? x : vmax;
        }
    *vs = *vinv = 1.0f;
    if (!isfinite(vmax) || (double)vmax * (double)skv < 0x1p120)
        return false;
    int ex;
    (void)frexpf(vmax, &ex);
    *vs = ldexpf(1.0f, -(ex - 1));
    *vinv = ldexpf(1.0f, ex - 1);
    return true;
}


static cpc_status *cpu_attn(cpc_backend *be, const cpc_attn_args *a)
{
    cpu_ctx *c = be->ctx;
    cpc_status *st = cpc_attn_args_check(a);
    if (st)
        return st;
    const cpc_attn_problem *p = &a->p;
    const int64_t sq = p->sq, skv = p->skv;
    const int hq = p->hq, hkv = p->hkv, d = p->d, B = p->B;
    if (!cpc_attn_problem_has_rows(p))
        return NULL;
    const int64_t ldo = (int64_t)hq * d;
    if (skv == 0) { /* no key: every row sees nothing */
        memset(a->o, 0, sizeof(float) * (size_t)B * (size_t)sq * (size_t)ldo);
        for (size_t i = 0; i < (size_t)B * (size_t)hq * (size_t)sq; i++)
            a->lse[i] = -INFINITY;
        return NULL;
    }
    const int tq = c->tq, tk = c->tk;
    const size_t es = dt_size(p->dtype);
    /* fp32 K/V are read in place when their rows are contiguous (one K/V head);
     * otherwise copied per head: OpenBLAS packs K and V tiles again for every query
     * tile, and packing from rows strided by Hkv*D (a page apart) costs TLB misses. */
    const bool conv = p->dtype != CPC_DTYPE_FP32 || hkv > 1;
    cpc_attn_tiling *T = &c->tiles;

    if ((st = GROW(c, qt, sizeof(float) * (size_t)tq * d)) ||
        (st = GROW(c, s, sizeof(float) * (size_t)tq * tk)) ||
        (st = GROW(c, m, sizeof(float) * (size_t)tq)) ||
        (st = GROW(c, l, sizeof(float) * (size_t)tq)) ||
        (conv && (st = GROW(c, kbuf, sizeof(float) * (size_t)skv * d))) ||
        (conv && (st = GROW(c, vbuf, sizeof(float) * (size_t)skv * d))) ||
        (st = cpc_attn_tiling_prepare(T, p, tq, tk)))
        return st;

    const float qscale = p->scale * LOG2E_F;
    const int64_t ldq = (int64_t)hq * d, ldkv_in = (int64_t)hkv * d;
    float *S = c->s, *M = c->m, *L = c->l;

    for (int b = 0; b < B; b++) {
        const char *qb = (const char *)p->q + (size_t)b * (size_t)p->q_bstride * es;
        const char *kb = (const char *)p->k + (size_t)b * (size_t)p->kv_bstride * es;
        const char *vb = (const char *)p->v + (size_t)b * (size_t)p->kv_bstride * es;
        cpc_attn_tiling_batch(T, p, b);
        for (int kvl = 0; kvl < hkv; kvl++) {
            int h0, h1; /* local query heads using this K/V head */
            if (!cpc_attn_q_heads(p, kvl, &h0, &h1))
                continue;
            const float *K, *V;
            int64_t ldk, ldv;
            if (conv) {
                for (int64_t j = 0; j < skv; j++) {
                    size_t off = ((size_t)j * (size_t)ldkv_in + (size_t)kvl * d) * es;
                    cpc_to_f32_n(c->kbuf + j * d, kb + off, p->dtype, (size_t)d);
                    cpc_to_f32_n(c->vbuf + j * d, vb + off, p->dtype, (size_t)d);
                }
                K = c->kbuf;
                V = c->vbuf;
                ldk = ldv = d;
            } else {
                K = (const float *)kb + (size_t)kvl * d;
                V = (const float *)vb + (size_t)kvl * d;
                ldk = ldv = ldkv_in;
            }
            /* P V is accumulated in units of vinv = 1/vs (a power of two) when
             * skv * max|v| could overflow fp32 (finite v up to FLT_MAX) */
            float vs = 1.0f, vinv = 1.0f;
            if (cpu_v_scale(V, ldv, skv, d, &vs, &vinv)) {
                if (!conv) {
                    if ((st = GROW(c, vbuf, sizeof(float) * (size_t)skv * d)))
                        return st;
                    for (int64_t j = 0; j < skv; j++)
                        memcpy(c->vbuf + j * d, V + j * ldv, sizeof(float) * (size_t)d);
                    V = c->vbuf;
                    ldv = d;
                }
                for (size_t i = 0; i < (size_t)skv * (size_t)d; i++)
                    c->vbuf[i] *= vs;
            }
            for (int h = h0; h < h1; h++) {
                for (int64_t qi = 0; qi < T->n_qt; qi++) {
                    const int64_t i0 = qi * tq;
                    const int br = (int)(sq - i0 < tq ? sq - i0 : tq);
                    float *O = a->o + ((size_t)b * sq + (size_t)i0) * ldo + (size_t)h * d;
                    for (int r = 0; r < br; r++) {
                        const char *src = qb + ((size_t)(i0 + r) * ldq + (size_t)h * d) * es;
                        cpc_to_f32_scaled_n(c->qt + (size_t)r * d, src, p->dtype, (size_t)d,
                                            qscale);
                        memset(O + (size_t)r * ldo, 0, sizeof(float) * d);
                        M[r] = -INFINITY;
                        L[r] = 0.0f;
                    }
                    for (int64_t kj = 0; kj < T->n_kt; kj++) {
                        cpc_attn_tile tl;
                        if (!cpc_attn_tile_pair(T, p, qi, kj, &tl))
                            continue;
                        const int64_t j0 = tl.j0;
                        const int r0 = tl.r0, bcx = tl.bcx;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, br - r0, bcx, d,
                                    1.0f, c->qt + (size_t)r0 * d, d, K + (size_t)j0 * ldk,
                                    (int)ldk, 0.0f, S + (size_t)r0 * tk, tk);
                        bool any = false;
                        for (int r = r0; r < br; r++) {
                            float *sr = S + (size_t)r * tk;
                            cpc_attn_mask_row(T, &tl, r, sr);
                            float mx = c->row_max(sr, bcx);
                            if (mx != mx) { /* a NaN score: the row is NaN */
                                M[r] = L[r] = NAN;
                                memset(sr, 0, sizeof(float) * (size_t)bcx);
                                continue;
                            }
                            float mold = M[r];
                            float mnew = mx > mold ? mx : mold;
                            if (mnew == -INFINITY) { /* nothing visible yet */
                                memset(sr, 0, sizeof(float) * (size_t)bcx);
                                continue;
                            }
                            any = true;
                            float sum = c->row_exp(sr, bcx, mnew);
                            if (mnew != mold) {
                                float alpha = exp2_scalar(mold - mnew);
                                if (L[r] > 0.0f) {
                                    float *orow = O + (size_t)r * ldo;
                                    for (int e = 0; e < d; e++)
                                        orow[e] *= alpha;
                                }
                                L[r] = L[r] * alpha + sum;
                                M[r] = mnew;
                            } else {
                                L[r] += sum;
                            }
                        }
                        if (any)
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, br - r0, d,
                                        bcx, 1.0f, S + (size_t)r0 * tk, tk, V + (size_t)j0 * ldv,
                                        (int)ldv, 1.0f, O + (size_t)r0 * ldo, (int)ldo);
                    }
                    for (int r = 0; r < br; r++) {
                        float *orow = O + (size_t)r * ldo;
                        float lse;
                        if (L[r] > 0.0f || L[r] != L[r]) { /* a NaN input propagates */
                            float inv = vinv / L[r]; /* L >= 1: exact power-of-two vinv */
                            for (int e = 0; e < d; e++)
                                orow[e] *= inv;
                            /* one rounding (M is ~|logit|, log2 L at most 63:
                             * in fp32 the sum and the product round twice) */
                            lse = (float)(((double)M[r] + log2((double)L[r])) * LN2_D);
                        } else {
                            memset(orow, 0, sizeof(float) * d);
                            lse = -INFINITY;
                        }
                        a->lse[((size_t)b * hq + (size_t)h) * sq + (size_t)(i0 + r)] = lse;
                    }
                }
            }
        }
    }
    return NULL;
}

/* ---- merge and simple methods ------------------------------------------------- */

static cpc_status *cpu_merge(cpc_backend *be, const cpc_merge_args *mg)
{
    (void)be;
    if (!mg || mg->B < 0 || mg->s < 0 || mg->h < 0 || mg->d < 1)
        return cpc_error(CPC_E_INTERNAL, "merge: bad arguments");
    if (mg->B == 0 || mg->s == 0 || mg->h == 0)
        return NULL;
    if (!mg->acc || !mg->acc_lse || !mg->o || !mg->lse)
        return cpc_error(CPC_E_INTERNAL, "merge: NULL buffer");
    const int h = mg->h, d = mg->d;
    const int64_t s = mg->s;
    /* rows outer, heads inner: acc and o are [B, s, h, d], so this walks them
     * sequentially (the LSEs, one float per row, are the strided ones) */
    for (int b = 0; b < mg->B; b++)
        for (int64_t i = 0; i < s; i++)
            for (int hh = 0; hh < h; hh++) {
                size_t li = ((size_t)b * h + (size_t)hh) * s + (size_t)i;
                size_t oi = (((size_t)b * s + (size_t)i) * h + (size_t)hh) * d;
                float la = mg->acc_lse[li], lb = mg->lse[li];
                float *acc = mg->acc + oi;
                const float *o = mg->o + oi;
                if (lb == -INFINITY)
                    continue; /* the new block saw nothing: acc unchanged */
                if (la == -INFINITY) {
                    memcpy(acc, o, sizeof(float) * d);
                    mg->acc_lse[li] = lb;
                    continue;
                }
                /* The weights come from the difference la - lb alone (exact when
                 * the two are close, where it matters), in float64: wa = 1/(1 +
                 * e^(lb-la)), wb = 1 - wa sum to 1; going through the rounded
                 * new LSE (e^(la - lnew)) would scale the row by up to half an
                 * ulp of the LSE (|LSE| ~ 1e5 for ill-conditioned logits:
                 * 4e-3). */
                double dl = (double)lb - (double)la, wa, wb, lnew;
                if (dl <= 0) {
                    double e = exp(dl);
                    wa = 1.0 / (1.0 + e);
                    wb = e * wa;
                    lnew = (double)la + log1p(e);
                } else {
                    double e = exp(-dl);
                    wb = 1.0 / (1.0 + e);
                    wa = e * wb;
                    lnew = (double)lb + log1p(e);
                }
                for (int e = 0; e < d; e++)
                    acc[e] = (float)(wa * (double)acc[e] + wb * (double)o[e]);
                mg->acc_lse[li] = (float)lnew;
            }
    return NULL;
}

static cpc_status *cpu_alloc(cpc_backend *be, size_t bytes, void **out)
{
    (void)be;
    if (!out)
        return cpc_error(CPC_E_INTERNAL, "alloc: NULL out");
    *out = aligned_alloc64(bytes);
    if (!*out)
        return cpc_error(CPC_E_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    return NULL;
}

static void cpu_free(cpc_backend *be, void *ptr)
{
    (void)be;
    free(ptr);
}

static cpc_status *cpu_memcpy(cpc_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes == 0 || dst == src)
        return NULL;
    if (!dst || !src)
        return cpc_error(CPC_E_INTERNAL, "copy: NULL buffer");
    memmove(dst, src, bytes);
    return NULL;
}

static cpc_status *cpu_upload(cpc_backend *be, void *dst, const void *host, size_t bytes)
{
    return cpu_memcpy(be, dst, host, bytes);
}

static cpc_status *cpu_download(cpc_backend *be, void *host, const void *src, size_t bytes)
{
    return cpu_memcpy(be, host, src, bytes);
}

static cpc_status *cpu_init_acc(cpc_backend *be, float *acc, size_t n_acc, float *lse,
                                size_t n_lse)
{
    (void)be;
    if ((n_acc && !acc) || (n_lse && !lse))
        return cpc_error(CPC_E_INTERNAL, "init_acc: NULL buffer");
    if (n_acc)
        memset(acc, 0, n_acc * sizeof(float));
    for (size_t i = 0; i < n_lse; i++)
        lse[i] = -INFINITY;
    return NULL;
}

static cpc_status *cpu_convert(cpc_backend *be, void *dst, cpc_dtype dst_t, const void *src,
                               cpc_dtype src_t, size_t n)
{
    (void)be;
    if ((int)dst_t < 0 || dst_t >= CPC_DTYPE__COUNT || (int)src_t < 0 ||
        src_t >= CPC_DTYPE__COUNT)
        return cpc_error(CPC_E_INTERNAL, "convert: unknown dtype");
    if (n == 0)
        return NULL;
    if (!dst || !src)
        return cpc_error(CPC_E_INTERNAL, "convert: NULL buffer");
    if (dst == src && dst_t != src_t)
        return cpc_error(CPC_E_INTERNAL, "convert: in-place conversion between dtypes");
    cpc_convert_n(dst, dst_t, src, src_t, n);
    return NULL;
}

static cpc_status *cpu_copy_strided(cpc_backend *be, void *dst, const void *src, size_t esize,
                                    int64_t nb, int64_t nt, int64_t nh, int64_t inner,
                                    int64_t dbs, int64_t dts, int64_t dhs, int64_t sbs,
                                    int64_t sts, int64_t shs)
{
    (void)be;
    if (esize == 0 || nb < 0 || nt < 0 || nh < 0 || inner < 0)
        return cpc_error(CPC_E_INTERNAL, "copy_strided: bad sizes");
    if (nb == 0 || nt == 0 || nh == 0 || inner == 0)
        return NULL;
    if (!dst || !src)
        return cpc_error(CPC_E_INTERNAL, "copy_strided: NULL buffer");
    /* Fold dimensions that are contiguous in both source and destination. */
    if ((nh == 1) || (dhs == inner && shs == inner)) {
        inner *= nh;
        nh = 1;
        if (nt == 1 || (dts == inner && sts == inner)) {
            inner *= nt;
            nt = 1;
            if (nb == 1 || (dbs == inner && sbs == inner)) {
                inner *= nb;
                nb = 1;
            }
        }
    }
    const size_t row = (size_t)inner * esize;
    char *d = dst;
    const char *s = src;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t t = 0; t < nt; t++)
            for (int64_t h = 0; h < nh; h++) {
                int64_t de = b * dbs + t * dts + h * dhs, se = b * sbs + t * sts + h * shs;
                memcpy(d + (size_t)de * esize, s + (size_t)se * esize, row);
            }
    return NULL;
}

static cpc_status *cpu_attn_bwd(cpc_backend *be, const cpc_attn_bwd_args *a)
{
    cpu_ctx *c = be->ctx;
    return cpc_cpu_attn_bwd(&c->bwd, a);
}

static cpc_status *cpu_sync(cpc_backend *be)
{
    (void)be;
    return NULL;
}

static void cpu_destroy(cpc_backend *be)
{
    if (!be)
        return;
    cpu_ctx *c = be->ctx;
    if (c) {
        free(c->qt);
        free(c->s);
        free(c->kbuf);
        free(c->vbuf);
        free(c->m);
        free(c->l);
        cpc_attn_tiling_free(&c->tiles);
        cpc_cpu_attn_bwd_free(c->bwd);
        free(c);
    }
    free(be);
}

static cpc_status *cpu_add_strided(cpc_backend *be, float *dst, const float *src, int64_t nb, int64_t nt,
                                   int64_t nh, int64_t inner, int64_t dbs, int64_t dts, int64_t dhs,
                                   int64_t sbs, int64_t sts, int64_t shs)
{
    (void)be;
    if (nb < 0 || nt < 0 || nh < 0 || inner < 0)
        return cpc_error(CPC_E_INTERNAL, "add_strided: bad sizes");
    if (nb == 0 || nt == 0 || nh == 0 || inner == 0)
        return NULL;
    if (!dst || !src)
        return cpc_error(CPC_E_INTERNAL, "add_strided: NULL buffer");
    for (int64_t b = 0; b < nb; b++)
        for (int64_t t = 0; t < nt; t++)
            for (int64_t h = 0; h < nh; h++) {
                float *d = dst + b * dbs + t * dts + h * dhs;
                const float *s = src + b * sbs + t * sts + h * shs;
                for (int64_t i = 0; i < inner; i++)
                    d[i] += s[i];
            }
    return NULL;
}

static const cpc_backend_vtable cpu_vtable = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_memcpy,
    .attn = cpu_attn,
    .merge = cpu_merge,
    .init_acc = cpu_init_acc,
    .convert = cpu_convert,
    .copy_strided = cpu_copy_strided,
    .attn_bwd = cpu_attn_bwd,
    .add_strided = cpu_add_strided,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
};

cpc_status *cpc_cpu_backend_create(cpc_backend **out)
{
    if (!out)
        return cpc_error(CPC_E_INTERNAL, "cpu backend: NULL out");
    *out = NULL;
    cpc_backend *be = calloc(1, sizeof *be);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return cpc_error(CPC_E_NOMEM, "cpu backend: out of memory");
    }
    c->tq = 256;
    c->tk = 512;
    const char *env = getenv("CPC_CPU_ATTN_TILES");
    if (env) {
        int q = 0, k = 0;
        if (sscanf(env, "%dx%d", &q, &k) == 2 && q >= 1 && q <= 4096 && k >= 1 && k <= 65536) {
            c->tq = q;
            c->tk = k;
        }
    }
    c->row_max = row_max_scalar;
    c->row_exp = row_exp_scalar;
#ifdef CPC_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        c->row_max = row_max_avx512;
        c->row_exp = row_exp_avx512;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        c->row_max = row_max_avx2;
        c->row_exp = row_exp_avx2;
    }
    const char *isa = getenv("CPC_CPU_ISA"); /* "avx2" or "scalar": for tests and tuning */
    if (isa && strcmp(isa, "scalar") == 0) {
        c->row_max = row_max_scalar;
        c->row_exp = row_exp_scalar;
    } else if (isa && strcmp(isa, "avx2") == 0 && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma")) {
        c->row_max = row_max_avx2;
        c->row_exp = row_exp_avx2;
    }
#endif
    be->vt = &cpu_vtable;
    be->ctx = c;
    *out = be;
    return NULL;
}

void cpc_cpu_backend_single_thread_blas(void) { openblas_set_num_threads(1); }
