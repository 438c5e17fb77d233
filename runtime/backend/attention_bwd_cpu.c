/*
 * attention_bwd_cpu.c - the CPU backend's attention backward (backend.h,
 * cpc_attn_bwd_args): FlashAttention-2's backward (Dao 2023, "FlashAttention-2:
 * Faster Attention with Better Parallelism and Work Partitioning",
 * Algorithm 2), on one thread, with OpenBLAS SGEMM for the five products of
 * every tile.
 *
 * For every batch b (delta first, when asked: delta_i = sum_e dO[i,e] O[i,e],
 * accumulated in double, stored fp32) and every K/V head:
 *   - K and V of the head are widened/copied to contiguous fp32 rows, its
 *     dK and dV accumulators (contiguous fp32, zeroed) are kept in scratch;
 *   - for every query head of the GQA group this call sees:
 *       Q' = Q * scale * log2(e) and dO as contiguous fp32 rows, dQ = 0,
 *       m_i = lse_i * log2(e) (+inf for a row with lse = -inf, so that its
 *       P is exactly 0), and for every tile of TQ query rows and every tile
 *       of TK keys that some row of the tile can see (causal tiles no row
 *       sees, and tiles whose keys are all padded, are skipped before any
 *       product; tiles straddling the diagonal are trimmed to the keys some
 *       row sees and the rows that see some key, as in the forward):
 *         S  = Q' K^T                  (sgemm NT, TQ x TK x D)
 *         dP = dO V^T                  (sgemm NT, TQ x TK x D)
 *         mask S (causal by global positions, key padding) where needed;
 *         P = 2^(S - m) and dS = P * (dP - delta) in one vectorised pass
 *         (S and dP are overwritten by P and dS);
 *         dV += P^T dO                 (sgemm TN, TK x D x TQ)
 *         dQ += scale * dS K           (sgemm NN, TQ x D x TK)
 *         dK += ln(2) * dS^T Q'        (sgemm TN, TK x D x TQ; ln 2 * Q' = scale * Q)
 *     then dQ is added to the caller's dq;
 *   - finally dK and dV are added to the caller's dk and dv.
 * P = 2^(S - m) is exp(q.k * scale - lse): the softmax probability of the
 * row over all the keys its lse covers, so blocks of keys can be processed
 * by separate calls and their gradients summed (ring attention).
 *
 * The exponential is the forward's (cpu_kernels.h: degree-6 polynomial,
 * 8e-8 relative error), AVX-512 or AVX2 chosen at run time, scalar
 * otherwise; CPC_CPU_ISA=avx2|scalar forces one (tests).
 *
 * Tile sizes: TQ x TK = 256 x 512 by default, as the forward's (measured on
 * an AMD EPYC AVX2 machine with bench/bench_attention_bwd.c, S = 2048:
 * 256x512 gave the lowest backward / forward ratio, 2.3-2.5; 128x128 2.3-2.9,
 * 64xN 3.0-3.4: the products dV += P^T dO and dK += dS^T Q reduce over the
 * TQ rows of the tile, so short query tiles starve them); CPC_CPU_ATTN_BWD_TILES=
 * "<TQ>x<TK>" overrides them when the scratch is created (first call).
 *
 * Memory: scratch of 3 [sq, d] + 4 [skv, d] + 2 [TQ, TK] fp32 and
 * positions, grown on demand and kept by the backend instance.
 * Thread-safety: as the backend instance (one thread at a time).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "dtype.h"

/* s[j] <- P = 2^(s[j] - m); dp[j] <- dS = P * (dp[j] - dl), j < n. */
typedef void (*fused_fn)(float *s, float *dp, int64_t n, float m, float dl);

struct cpc_cpu_bwd {
    int tq, tk;
    fused_fn fused;
    float *qb;     size_t qb_cap;    /* [sq, d] Q * scale * log2 e of one head */
    float *dob;    size_t dob_cap;   /* [sq, d] dO of one head */
    float *dqb;    size_t dqb_cap;   /* [sq, d] dQ of one head */
    float *kb;     size_t kb_cap;    /* [skv, d] K of one K/V head */
    float *vb;     size_t vb_cap;    /* [skv, d] V */
    float *dkb;    size_t dkb_cap;   /* [skv, d] dK accumulator */
    float *dvb;    size_t dvb_cap;   /* [skv, d] dV accumulator */
    float *s;      size_t s_cap;     /* [tq, tk] S, then P */
    float *dp;     size_t dp_cap;    /* [tq, tk] dP, then dS */
    float *m;      size_t m_cap;     /* [sq] lse * log2 e (+inf: empty row) */
    float *row;    size_t row_cap;   /* [2 d] delta's rows */
    cpc_attn_tiling tiles;           /* positions, tiles and key padding (attn_problem.h) */
};

/* ---- the fused P / dS pass ------------------------------------------------------ */

static void fused_scalar(float *s, float *dp, int64_t n, float m, float dl)
{
    for (int64_t j = 0; j < n; j++) {
        float p = exp2_scalar(s[j] - m);
        s[j] = p;
        dp[j] = p * (dp[j] - dl);
    }
}

#ifdef CPC_X86
__attribute__((target("avx2,fma"))) static void fused_avx2(float *s, float *dp, int64_t n,
                                                          float m, float dl)
{
    const __m256 vm = _mm256_set1_ps(m), vd = _mm256_set1_ps(dl);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 p0 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        __m256 p1 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm));
        _mm256_storeu_ps(s + j, p0);
        _mm256_storeu_ps(s + j + 8, p1);
        _mm256_storeu_ps(dp + j, _mm256_mul_ps(p0, _mm256_sub_ps(_mm256_loadu_ps(dp + j), vd)));
        _mm256_storeu_ps(dp + j + 8,
                         _mm256_mul_ps(p1, _mm256_sub_ps(_mm256_loadu_ps(dp + j + 8), vd)));
    }
    for (; j < n; j += 8) {
        __m256i mk = tail_mask_avx2(n - j);
        __m256 p = exp2_avx2(_mm256_sub_ps(_mm256_maskload_ps(s + j, mk), vm));
        _mm256_maskstore_ps(s + j, mk, p);
        __m256 g = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_maskload_ps(dp + j, mk), vd));
        _mm256_maskstore_ps(dp + j, mk, g);
    }
}

__attribute__((target("avx512f"))) static void fused_avx512(float *s, float *dp, int64_t n,
                                                           float m, float dl)
{
    const __m512 vm = _mm512_set1_ps(m), vd = _mm512_set1_ps(dl);
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 p0 = exp2_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
        __m512 p1 = exp2_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), vm));
        _mm512_storeu_ps(s + j, p0);
        _mm512_storeu_ps(s + j + 16, p1);
        _mm512_storeu_ps(dp + j, _mm512_mul_ps(p0, _mm512_sub_ps(_mm512_loadu_ps(dp + j), vd)));
        _mm512_storeu_ps(dp + j + 16,
                         _mm512_mul_ps(p1, _mm512_sub_ps(_mm512_loadu_ps(dp + j + 16), vd)));
    }
    for (; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 p = exp2_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm));
        _mm512_mask_storeu_ps(s + j, k, p);
        __m512 g = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), vd));
        _mm512_mask_storeu_ps(dp + j, k, g);
    }
}
#endif

/* ---- scratch ---------------------------------------------------------------------- */

static cpc_status *bwd_state(cpc_cpu_bwd **state, cpc_cpu_bwd **out)
{
    if (*state) {
        *out = *state;
        return NULL;
    }
    cpc_cpu_bwd *c = calloc(1, sizeof *c);
    if (!c)
        return cpc_error(CPC_E_NOMEM, "attn_bwd: out of memory");
    c->tq = 256;
    c->tk = 512;
    const char *env = getenv("CPC_CPU_ATTN_BWD_TILES");
    if (env) {
        int q = 0, k = 0;
        if (sscanf(env, "%dx%d", &q, &k) == 2 && q >= 1 && q <= 4096 && k >= 1 && k <= 65536) {
            c->tq = q;
            c->tk = k;
        }
    }
    c->fused = fused_scalar;
#ifdef CPC_X86
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (__builtin_cpu_supports("avx512f"))
        c->fused = fused_avx512;
    else if (avx2)
        c->fused = fused_avx2;
    const char *isa = getenv("CPC_CPU_ISA");
    if (isa && strcmp(isa, "scalar") == 0)
        c->fused = fused_scalar;
    else if (isa && strcmp(isa, "avx2") == 0 && avx2)
        c->fused = fused_avx2;
#endif
    *state = *out = c;
    return NULL;
}

void cpc_cpu_attn_bwd_free(cpc_cpu_bwd *c)
{
    if (!c)
        return;
    free(c->qb);
    free(c->dob);
    free(c->dqb);
    free(c->kb);
    free(c->vb);
    free(c->dkb);
    free(c->dvb);
    free(c->s);
    free(c->dp);
    free(c->m);
    free(c->row);
    cpc_attn_tiling_free(&c->tiles);
    free(c);
}

/* ---- arguments ---------------------------------------------------------------------- */

static size_t dt_size(cpc_dtype t) { return t == CPC_DTYPE_FP32 ? 4u : 2u; }

#define BGROW(c, field, bytes) grow((void **)&(c)->field, &(c)->field##_cap, (bytes))

/* delta[b, h, i] = sum_e dout[b, i, h, e] * out[b, i, h, e], in double. */
static void compute_delta(cpc_cpu_bwd *c, const cpc_attn_bwd_args *a)
{
    const cpc_attn_problem *p = &a->p;
    const int d = p->d, hq = p->hq;
    const size_t es = dt_size(p->dtype), eo = dt_size(a->out_dtype);
    float *dr = c->row, *orow = c->row + d;
    for (int b = 0; b < p->B; b++)
        for (int64_t i = 0; i < p->sq; i++)
            for (int h = 0; h < hq; h++) {
                size_t e0 = ((size_t)i * hq + (size_t)h) * (size_t)d;
                cpc_to_f32_n(dr, (const char *)a->dout + ((size_t)b * a->dout_bstride + e0) * es,
                             p->dtype, (size_t)d);
                cpc_to_f32_n(orow, (const char *)a->out + ((size_t)b * a->out_bstride + e0) * eo,
                             a->out_dtype, (size_t)d);
                double acc = 0.0;
                for (int e = 0; e < d; e++)
                    acc += (double)dr[e] * (double)orow[e];
                a->delta[((size_t)b * hq + (size_t)h) * p->sq + (size_t)i] = (float)acc;
            }
}


/* ---- the backward ------------------------------------------------------------------- */

cpc_status *cpc_cpu_attn_bwd(cpc_cpu_bwd **state, const cpc_attn_bwd_args *a)
{
    cpc_status *st = cpc_attn_bwd_args_check(a);
    if (st)
        return st;
    if (!state)
        return cpc_error(CPC_E_INTERNAL, "attn_bwd: no scratch state");
    const cpc_attn_problem *p = &a->p;
    const int64_t sq = p->sq, skv = p->skv;
    const int hq = p->hq, hkv = p->hkv, d = p->d, B = p->B;
    if (!cpc_attn_problem_has_rows(p))
        return NULL;
    cpc_cpu_bwd *c = NULL;
    if ((st = bwd_state(state, &c)))
        return st;
    if (a->compute_delta) {
        if ((st = BGROW(c, row, sizeof(float) * 2 * (size_t)d)))
            return st;
        compute_delta(c, a);
    }
    if (skv == 0)
        return NULL; /* no key: no gradient */

    const int tq = c->tq, tk = c->tk;
    const size_t es = dt_size(p->dtype);
    const size_t qd = (size_t)sq * d, kd = (size_t)skv * d;
    cpc_attn_tiling *T = &c->tiles;
    if ((st = BGROW(c, qb, sizeof(float) * qd)) || (st = BGROW(c, dob, sizeof(float) * qd)) ||
        (st = BGROW(c, dqb, sizeof(float) * qd)) || (st = BGROW(c, kb, sizeof(float) * kd)) ||
        (st = BGROW(c, vb, sizeof(float) * kd)) || (st = BGROW(c, dkb, sizeof(float) * kd)) ||
        (st = BGROW(c, dvb, sizeof(float) * kd)) ||
        (st = BGROW(c, s, sizeof(float) * (size_t)tq * tk)) ||
        (st = BGROW(c, dp, sizeof(float) * (size_t)tq * tk)) ||
        (st = BGROW(c, m, sizeof(float) * (size_t)sq)) ||
        (st = cpc_attn_tiling_prepare(T, p, tq, tk)))
        return st;

    const float qscale = p->scale * LOG2E_F;
    const int64_t ldq = (int64_t)hq * d, ldkv = (int64_t)hkv * d;
    const int64_t dq_bs = a->dq_bstride ? a->dq_bstride : sq * ldq;
    const int64_t dkv_bs = a->dkv_bstride ? a->dkv_bstride : skv * ldkv;
    float *S = c->s, *DP = c->dp;

    for (int b = 0; b < B; b++) {
        const char *qsrc = (const char *)p->q + (size_t)b * (size_t)p->q_bstride * es;
        const char *dosrc = (const char *)a->dout + (size_t)b * (size_t)a->dout_bstride * es;
        const char *ksrc = (const char *)p->k + (size_t)b * (size_t)p->kv_bstride * es;
        const char *vsrc = (const char *)p->v + (size_t)b * (size_t)p->kv_bstride * es;
        cpc_attn_tiling_batch(T, p, b);
        for (int kvl = 0; kvl < hkv; kvl++) {
            int h0, h1;
            if (!cpc_attn_q_heads(p, kvl, &h0, &h1))
                continue; /* no query head of this call uses it: dk/dv untouched */
            for (int64_t j = 0; j < skv; j++) {
                size_t off = ((size_t)j * (size_t)ldkv + (size_t)kvl * d) * es;
                cpc_to_f32_n(c->kb + j * d, ksrc + off, p->dtype, (size_t)d);
                cpc_to_f32_n(c->vb + j * d, vsrc + off, p->dtype, (size_t)d);
            }
            memset(c->dkb, 0, sizeof(float) * kd);
            memset(c->dvb, 0, sizeof(float) * kd);
            for (int h = h0; h < h1; h++) {
                const float *lse = a->lse + ((size_t)b * hq + (size_t)h) * sq;
                const float *delta = a->delta + ((size_t)b * hq + (size_t)h) * sq;
                bool any_row = false;
                for (int64_t i = 0; i < sq; i++) {
                    float l = lse[i];
                    c->m[i] = l == -INFINITY ? INFINITY : l * LOG2E_F;
                    any_row |= l != -INFINITY;
                }
                if (!any_row)
                    continue; /* no row of this head saw a key */
                for (int64_t i = 0; i < sq; i++) {
                    size_t off = ((size_t)i * (size_t)ldq + (size_t)h * d) * es;
                    cpc_to_f32_scaled_n(c->qb + i * d, qsrc + off, p->dtype, (size_t)d, qscale);
                    cpc_to_f32_n(c->dob + i * d, dosrc + off, p->dtype, (size_t)d);
                }
                memset(c->dqb, 0, sizeof(float) * qd);
                for (int64_t qi = 0; qi < T->n_qt; qi++) {
                    for (int64_t kj = 0; kj < T->n_kt; kj++) {
                        cpc_attn_tile tl;
                        if (!cpc_attn_tile_pair(T, p, qi, kj, &tl))
                            continue;
                        const int64_t i0 = tl.i0, j0 = tl.j0;
                        const int r0 = tl.r0, br = tl.br, bcx = tl.bcx, nr = br - r0;
                        const float *Qt = c->qb + (size_t)(i0 + r0) * d;
                        const float *dOt = c->dob + (size_t)(i0 + r0) * d;
                        float *St = S + (size_t)r0 * tk, *DPt = DP + (size_t)r0 * tk;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, bcx, d, 1.0f, Qt,
                                    d, c->kb + (size_t)j0 * d, d, 0.0f, St, tk);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, bcx, d, 1.0f,
                                    dOt, d, c->vb + (size_t)j0 * d, d, 0.0f, DPt, tk);
                        for (int r = r0; r < br; r++) {
                            float *sr = S + (size_t)r * tk;
                            cpc_attn_mask_row(T, &tl, r, sr);
                            c->fused(sr, DP + (size_t)r * tk, bcx, c->m[i0 + r], delta[i0 + r]);
                        }
                        /* dV += P^T dO */
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bcx, d, nr, 1.0f, St,
                                    tk, dOt, d, 1.0f, c->dvb + (size_t)j0 * d, d);
                        /* dQ += scale dS K */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, d, bcx,
                                    p->scale, DPt, tk, c->kb + (size_t)j0 * d, d, 1.0f,
                                    c->dqb + (size_t)(i0 + r0) * d, d);
                        /* dK += scale dS^T Q = ln 2 dS^T Q' */
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bcx, d, nr, LN2_F,
                                    DPt, tk, Qt, d, 1.0f, c->dkb + (size_t)j0 * d, d);
                    }
                }
                float *dq = a->dq + (size_t)b * (size_t)dq_bs + (size_t)h * d;
                for (int64_t i = 0; i < sq; i++) {
                    float *dst = dq + (size_t)i * (size_t)ldq;
                    const float *src = c->dqb + (size_t)i * d;
                    for (int e = 0; e < d; e++)
                        dst[e] += src[e];
                }
            }
            float *dk = a->dk + (size_t)b * (size_t)dkv_bs + (size_t)kvl * d;
            float *dv = a->dv + (size_t)b * (size_t)dkv_bs + (size_t)kvl * d;
            for (int64_t j = 0; j < skv; j++) {
                float *dkr = dk + (size_t)j * (size_t)ldkv, *dvr = dv + (size_t)j * (size_t)ldkv;
                const float *sk = c->dkb + (size_t)j * d, *sv = c->dvb + (size_t)j * d;
                for (int e = 0; e < d; e++) {
                    dkr[e] += sk[e];
                    dvr[e] += sv[e];
                }
            }
        }
    }
    return NULL;
}
