/* reference.c - float64 reference attention and comparison; see reference.h. */
#include "reference.h"

#include <Random123/philox.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

static cpc_status *check_problem(const cpc_ref_problem *p)
{
    if (!p)
        return cpc_error(CPC_E_INPUT, "reference: no problem given");
    if (p->B < 1 || p->S < 1 || p->Skv < 1 || p->H < 1 || p->Hkv < 1 || p->D < 1)
        return cpc_error(CPC_E_INPUT,
                         "reference: sizes must be >= 1 (B=%d S=%lld Skv=%lld H=%d Hkv=%d D=%d)",
                         p->B, (long long)p->S, (long long)p->Skv, p->H, p->Hkv, p->D);
    if (p->H % p->Hkv != 0)
        return cpc_error(CPC_E_INPUT, "reference: H=%d is not divisible by Hkv=%d", p->H,
                         p->Hkv);
    if ((int)p->dtype < 0 || p->dtype >= CPC_DTYPE__COUNT)
        return cpc_error(CPC_E_INPUT, "reference: unknown dtype %d", (int)p->dtype);
    if (!p->q || !p->k || !p->v)
        return cpc_error(CPC_E_INPUT, "reference: q, k and v are required");
    return NULL;
}

double cpc_reference_flops(const cpc_ref_problem *p, int64_t n_rows)
{
    if (!p)
        return 0.0;
    double rows = n_rows < 0 ? (double)p->B * (double)p->S * (double)p->H : (double)n_rows;
    return 4.0 * rows * (double)p->Skv * (double)p->D;
}

/* K/V of one (b, kv head) as fp32 rows (exact widening), row stride `ld`. */
typedef struct kv_view {
    const float *k, *v;
    int64_t ld;
} kv_view;

static size_t esize(cpc_dtype t) { return t == CPC_DTYPE_FP32 ? 4u : 2u; }

static void load_kv(const cpc_ref_problem *p, int b, int kvh, float *kbuf, float *vbuf,
                    kv_view *out)
{
    size_t es = esize(p->dtype);
    int64_t row = (int64_t)p->Hkv * p->D;
    const char *kb = (const char *)p->k + ((size_t)b * p->Skv * row + (size_t)kvh * p->D) * es;
    const char *vb = (const char *)p->v + ((size_t)b * p->Skv * row + (size_t)kvh * p->D) * es;
    if (p->dtype == CPC_DTYPE_FP32) {
        out->k = (const float *)kb;
        out->v = (const float *)vb;
        out->ld = row;
        return;
    }
    for (int64_t j = 0; j < p->Skv; j++) {
        cpc_to_f32_n(kbuf + j * p->D, kb + (size_t)j * row * es, p->dtype, (size_t)p->D);
        cpc_to_f32_n(vbuf + j * p->D, vb + (size_t)j * row * es, p->dtype, (size_t)p->D);
    }
    out->k = kbuf;
    out->v = vbuf;
    out->ld = p->D;
}

static double dot_f64(const double *q, const float *k, int D)
{
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int d = 0;
    for (; d + 4 <= D; d += 4) {
        a0 += q[d] * (double)k[d];
        a1 += q[d + 1] * (double)k[d + 1];
        a2 += q[d + 2] * (double)k[d + 2];
        a3 += q[d + 3] * (double)k[d + 3];
    }
    for (; d < D; d++)
        a0 += q[d] * (double)k[d];
    return (a0 + a1) + (a2 + a3);
}

static double dot_abs_f64(const double *q, const float *k, int D)
{
    double a = 0;
    for (int d = 0; d < D; d++)
        a += fabs(q[d] * (double)k[d]);
    return a;
}

/* One row: q row (double, D), writes out[D] and *lse; with `bound` (and
 * `asc`, Skv doubles of scratch) also the first-order rounding bound of
 * cpc_reference_attention_bound. */
static void ref_row(const cpc_ref_problem *p, const kv_view *kv, int b, int64_t i,
                    const double *q, double *sc, double *out, double *lse, double *asc,
                    double *bound)
{
    const int D = p->D;
    int64_t nvis = p->causal ? (i + 1 < p->Skv ? i + 1 : p->Skv) : p->Skv;
    const uint8_t *mask = p->kv_mask ? p->kv_mask + (size_t)b * p->Skv : NULL;
    double m = -INFINITY;
    bool nan_seen = false;
    for (int64_t j = 0; j < nvis; j++) {
        if (mask && !mask[j]) {
            sc[j] = -INFINITY;
            continue;
        }
        double s = p->scale * dot_f64(q, kv->k + j * kv->ld, D);
        sc[j] = s;
        if (bound)
            asc[j] = fabs(p->scale) * dot_abs_f64(q, kv->k + j * kv->ld, D);
        if (s > m)
            m = s;
        else if (s != s)
            nan_seen = true;
    }
    if (bound)
        for (int d = 0; d < D; d++)
            bound[d] = 0.0;
    if (nan_seen) { /* a NaN input makes the row NaN, as the math says */
        if (out)
            for (int d = 0; d < D; d++)
                out[d] = NAN;
        if (lse)
            *lse = NAN;
        return;
    }
    if (out)
        for (int d = 0; d < D; d++)
            out[d] = 0.0;
    if (m == -INFINITY) { /* sees no key (or every score -inf) */
        if (lse)
            *lse = -INFINITY;
        return;
    }
    double l = 0.0;
    for (int64_t j = 0; j < nvis; j++) {
        if (sc[j] == -INFINITY)
            continue;
        double w = exp(sc[j] - m);
        l += w;
        if (out) {
            const float *vr = kv->v + j * kv->ld;
            for (int d = 0; d < D; d++)
                out[d] += w * (double)vr[d];
        }
    }
    if (out)
        for (int d = 0; d < D; d++)
            out[d] /= l;
    if (lse)
        *lse = m + log(l);
    if (bound && out) {
        /* d out = sum_j p_j (d s_j - sum_l p_l d s_l) v_j = sum_j p_j d s_j (v_j - out),
         * |d s_j| ~ a_j (in units of the logits' rounding), independent signs:
         * the root of the sum of squares */
        for (int64_t j = 0; j < nvis; j++) {
            if (sc[j] == -INFINITY)
                continue;
            double pa = exp(sc[j] - m) / l * asc[j];
            if (pa == 0.0)
                continue;
            const float *vr = kv->v + j * kv->ld;
            for (int d = 0; d < D; d++) {
                double t = pa * ((double)vr[d] - out[d]);
                bound[d] += t * t;
            }
        }
        for (int d = 0; d < D; d++)
            bound[d] = sqrt(bound[d]);
    }
}

typedef struct row_key {
    int64_t idx;  /* index into rows */
    int b, kvh;
} row_key;

static int cmp_row_key(const void *x, const void *y)
{
    const row_key *a = x, *c = y;
    if (a->b != c->b)
        return a->b < c->b ? -1 : 1;
    if (a->kvh != c->kvh)
        return a->kvh < c->kvh ? -1 : 1;
    return a->idx < c->idx ? -1 : (a->idx > c->idx);
}

cpc_status *cpc_reference_attention(const cpc_ref_problem *p, const cpc_ref_row *rows,
                                    int64_t n_rows, double *out, double *lse)
{
    return cpc_reference_attention_bound(p, rows, n_rows, out, lse, NULL);
}

cpc_status *cpc_reference_attention_bound(const cpc_ref_problem *p, const cpc_ref_row *rows,
                                          int64_t n_rows, double *out, double *lse, double *bound)
{
    cpc_status *st = check_problem(p);
    if (st)
        return st;
    if (rows && n_rows < 0)
        return cpc_error(CPC_E_INPUT, "reference: negative row count");
    const int D = p->D, group = p->H / p->Hkv;
    const size_t es = esize(p->dtype);
    if (rows) {
        for (int64_t r = 0; r < n_rows; r++)
            if (rows[r].b < 0 || rows[r].b >= p->B || rows[r].h < 0 || rows[r].h >= p->H ||
                rows[r].s < 0 || rows[r].s >= p->S)
                return cpc_error(CPC_E_INPUT,
                                 "reference: row %lld (b=%d h=%d s=%lld) is out of range "
                                 "(B=%d H=%d S=%lld)",
                                 (long long)r, rows[r].b, rows[r].h, (long long)rows[r].s, p->B,
                                 p->H, (long long)p->S);
    }
    int64_t total = rows ? n_rows : (int64_t)p->B * p->S * p->H;
    if (total == 0)
        return NULL;

    bool conv = p->dtype != CPC_DTYPE_FP32;
    double *tmp_out = NULL;
    float *kbuf = NULL, *vbuf = NULL;
    double *sc = malloc(sizeof(double) * (size_t)p->Skv);
    double *asc = bound ? malloc(sizeof(double) * (size_t)p->Skv) : NULL;
    double *qd = malloc(sizeof(double) * (size_t)D);
    float *qf = malloc(sizeof(float) * (size_t)D);
    row_key *keys = NULL;
    if (conv) {
        kbuf = malloc(sizeof(float) * (size_t)p->Skv * (size_t)D);
        vbuf = malloc(sizeof(float) * (size_t)p->Skv * (size_t)D);
    }
    if (rows)
        keys = malloc(sizeof(row_key) * (size_t)n_rows);
    if (bound && !out)
        out = tmp_out = malloc(sizeof(double) * (size_t)D * (size_t)total);
    if (!sc || !qd || !qf || (conv && (!kbuf || !vbuf)) || (rows && !keys) || (bound && (!asc || !out))) {
        st = cpc_error(CPC_E_NOMEM, "reference: out of memory (Skv=%lld, D=%d)",
                       (long long)p->Skv, D);
        goto done;
    }

    const int64_t qrow = (int64_t)p->H * D;
    kv_view kv;
    if (!rows) {
        for (int b = 0; b < p->B; b++)
            for (int kvh = 0; kvh < p->Hkv; kvh++) {
                load_kv(p, b, kvh, kbuf, vbuf, &kv);
                for (int h = kvh * group; h < (kvh + 1) * group; h++)
                    for (int64_t i = 0; i < p->S; i++) {
                        size_t qoff = ((size_t)b * p->S + (size_t)i) * qrow + (size_t)h * D;
                        cpc_to_f32_n(qf, (const char *)p->q + qoff * es, p->dtype, (size_t)D);
                        for (int d = 0; d < D; d++)
                            qd[d] = (double)qf[d];
                        ref_row(p, &kv, b, i, qd, sc, out ? out + qoff : NULL,
                                lse ? lse + ((size_t)b * p->H + (size_t)h) * p->S + i : NULL, asc,
                                bound ? bound + qoff : NULL);
                    }
            }
    } else {
        for (int64_t r = 0; r < n_rows; r++) {
            keys[r].idx = r;
            keys[r].b = rows[r].b;
            keys[r].kvh = rows[r].h / group;
        }
        qsort(keys, (size_t)n_rows, sizeof *keys, cmp_row_key);
        int cur_b = -1, cur_kvh = -1;
        for (int64_t t = 0; t < n_rows; t++) {
            const cpc_ref_row *rw = &rows[keys[t].idx];
            if (keys[t].b != cur_b || keys[t].kvh != cur_kvh) {
                cur_b = keys[t].b;
                cur_kvh = keys[t].kvh;
                load_kv(p, cur_b, cur_kvh, kbuf, vbuf, &kv);
            }
            size_t qoff = ((size_t)rw->b * p->S + (size_t)rw->s) * qrow + (size_t)rw->h * D;
            cpc_to_f32_n(qf, (const char *)p->q + qoff * es, p->dtype, (size_t)D);
            for (int d = 0; d < D; d++)
                qd[d] = (double)qf[d];
            ref_row(p, &kv, rw->b, rw->s, qd, sc, out ? out + keys[t].idx * D : NULL,
                    lse ? lse + keys[t].idx : NULL, asc, bound ? bound + keys[t].idx * D : NULL);
        }
    }
done:
    free(sc);
    free(asc);
    free(tmp_out);
    free(qd);
    free(qf);
    free(kbuf);
    free(vbuf);
    free(keys);
    return st;
}

cpc_status *cpc_reference_attention_bwd(const cpc_ref_problem *p, const void *dout, double *dq,
                                        double *dk, double *dv)
{
    cpc_status *st = check_problem(p);
    if (st)
        return st;
    if (!dout)
        return cpc_error(CPC_E_INPUT, "reference backward: dout is required");
    const int D = p->D, H = p->H, Hkv = p->Hkv, group = H / Hkv;
    const int64_t S = p->S, Skv = p->Skv;
    const size_t es = esize(p->dtype);
    const bool conv = p->dtype != CPC_DTYPE_FP32;
    double *sc = malloc(sizeof(double) * (size_t)Skv);
    double *dkh = malloc(sizeof(double) * (size_t)Skv * D);
    double *dvh = malloc(sizeof(double) * (size_t)Skv * D);
    double *qd = malloc(sizeof(double) * (size_t)D * 4);
    float *qf = malloc(sizeof(float) * (size_t)D);
    float *kbuf = conv ? malloc(sizeof(float) * (size_t)Skv * D) : NULL;
    float *vbuf = conv ? malloc(sizeof(float) * (size_t)Skv * D) : NULL;
    if (!sc || !dkh || !dvh || !qd || !qf || (conv && (!kbuf || !vbuf))) {
        st = cpc_error(CPC_E_NOMEM, "reference backward: out of memory (Skv=%lld, D=%d)",
                       (long long)Skv, D);
        goto done;
    }
    double *dod = qd + D, *od = qd + 2 * D, *dqd = qd + 3 * D;
    if (dq) /* rows that see no key keep dq = 0 */
        memset(dq, 0, sizeof(double) * (size_t)p->B * (size_t)S * (size_t)H * (size_t)D);
    const int64_t qrow = (int64_t)H * D, kvrow = (int64_t)Hkv * D;
    kv_view kv;
    for (int b = 0; b < p->B; b++)
        for (int kvh = 0; kvh < Hkv; kvh++) {
            load_kv(p, b, kvh, kbuf, vbuf, &kv);
            memset(dkh, 0, sizeof(double) * (size_t)Skv * D);
            memset(dvh, 0, sizeof(double) * (size_t)Skv * D);
            const uint8_t *mask = p->kv_mask ? p->kv_mask + (size_t)b * Skv : NULL;
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (int64_t i = 0; i < S; i++) {
                    size_t qoff = ((size_t)b * S + (size_t)i) * qrow + (size_t)h * D;
                    cpc_to_f32_n(qf, (const char *)p->q + qoff * es, p->dtype, (size_t)D);
                    for (int e = 0; e < D; e++)
                        qd[e] = (double)qf[e];
                    cpc_to_f32_n(qf, (const char *)dout + qoff * es, p->dtype, (size_t)D);
                    for (int e = 0; e < D; e++) {
                        dod[e] = (double)qf[e];
                        od[e] = 0.0;
                        dqd[e] = 0.0;
                    }
                    int64_t nvis = p->causal ? (i + 1 < Skv ? i + 1 : Skv) : Skv;
                    /* scores, max, sum: the forward of ref_row */
                    double m = -INFINITY;
                    bool nan_seen = false;
                    for (int64_t j = 0; j < nvis; j++) {
                        if (mask && !mask[j]) {
                            sc[j] = -INFINITY;
                            continue;
                        }
                        double s = p->scale * dot_f64(qd, kv.k + j * kv.ld, D);
                        sc[j] = s;
                        if (s > m)
                            m = s;
                        else if (s != s)
                            nan_seen = true;
                    }
                    if (m == -INFINITY && !nan_seen)
                        continue; /* sees no key: no gradient */
                    double l = 0.0;
                    for (int64_t j = 0; j < nvis; j++)
                        if (sc[j] != -INFINITY)
                            l += exp(sc[j] - m);
                    if (nan_seen)
                        l = NAN;
                    /* P_j = exp(s_j - m) / l; out = sum_j P_j v_j */
                    for (int64_t j = 0; j < nvis; j++) {
                        if (sc[j] == -INFINITY) {
                            sc[j] = 0.0;
                            continue;
                        }
                        double pj = exp(sc[j] - m) / l;
                        sc[j] = pj;
                        const float *vr = kv.v + j * kv.ld;
                        for (int e = 0; e < D; e++)
                            od[e] += pj * (double)vr[e];
                    }
                    double Di = 0.0;
                    for (int e = 0; e < D; e++)
                        Di += dod[e] * od[e];
                    for (int64_t j = 0; j < nvis; j++) {
                        double pj = sc[j];
                        if (pj == 0.0)
                            continue; /* masked (or underflowed: contributes 0 exactly) */
                        const float *kr = kv.k + j * kv.ld, *vr = kv.v + j * kv.ld;
                        double dsj = pj * (dot_f64(dod, vr, D) - Di);
                        double *dkr = dkh + j * D, *dvr = dvh + j * D;
                        for (int e = 0; e < D; e++) {
                            dqd[e] += dsj * (double)kr[e];
                            dkr[e] += dsj * qd[e];
                            dvr[e] += pj * dod[e];
                        }
                    }
                    if (dq)
                        for (int e = 0; e < D; e++)
                            dq[qoff + e] = p->scale * dqd[e];
                }
            for (int64_t j = 0; j < Skv; j++) {
                size_t koff = ((size_t)b * Skv + (size_t)j) * kvrow + (size_t)kvh * D;
                for (int e = 0; e < D; e++) {
                    if (dk)
                        dk[koff + e] = p->scale * dkh[j * D + e];
                    if (dv)
                        dv[koff + e] = dvh[j * D + e];
                }
            }
        }
done:
    free(sc);
    free(dkh);
    free(dvh);
    free(qd);
    free(qf);
    free(kbuf);
    free(vbuf);
    return st;
}

int64_t cpc_reference_sample_rows(int B, int H, int64_t S, int64_t per_bh, uint64_t seed,
                                  cpc_ref_row *out)
{
    if (B < 1 || H < 1 || S < 1 || per_bh < 1 || !out)
        return 0;
    int64_t n = per_bh < S ? per_bh : S;
    int64_t c = 0;
    philox4x32_key_t key = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int64_t k = 0; k < n; k++) {
                int64_t lo = k * S / n, hi = (k + 1) * S / n; /* stratum [lo, hi), nonempty */
                int64_t s;
                if (k == 0)
                    s = 0;
                else if (k == n - 1)
                    s = S - 1;
                else {
                    philox4x32_ctr_t ctr = {{(uint32_t)b, (uint32_t)h, (uint32_t)k,
                                             (uint32_t)((uint64_t)k >> 32)}};
                    philox4x32_ctr_t r = philox4x32(ctr, key);
                    uint64_t x = ((uint64_t)r.v[0] << 32) | r.v[1];
                    s = lo + (int64_t)(x % (uint64_t)(hi - lo));
                }
                out[c].b = b;
                out[c].h = h;
                out[c].s = s;
                c++;
            }
    return c;
}

cpc_status *cpc_reference_gather_out(const void *t, cpc_dtype dt, int B, int64_t S, int H,
                                     int D, const cpc_ref_row *rows, int64_t n_rows,
                                     double *dst)
{
    for (int64_t r = 0; r < n_rows; r++) {
        const cpc_ref_row *rw = &rows[r];
        if (rw->b < 0 || rw->b >= B || rw->h < 0 || rw->h >= H || rw->s < 0 || rw->s >= S)
            return cpc_error(CPC_E_INPUT, "gather: row %lld (b=%d h=%d s=%lld) out of range",
                             (long long)r, rw->b, rw->h, (long long)rw->s);
        size_t off = (((size_t)rw->b * S + (size_t)rw->s) * H + (size_t)rw->h) * D;
        for (int d = 0; d < D; d++)
            dst[r * D + d] = cpc_dtype_get_f64(t, dt, off + (size_t)d);
    }
    return NULL;
}

cpc_status *cpc_reference_gather_lse(const float *lse, int B, int H, int64_t S,
                                     const cpc_ref_row *rows, int64_t n_rows, double *dst)
{
    for (int64_t r = 0; r < n_rows; r++) {
        const cpc_ref_row *rw = &rows[r];
        if (rw->b < 0 || rw->b >= B || rw->h < 0 || rw->h >= H || rw->s < 0 || rw->s >= S)
            return cpc_error(CPC_E_INPUT, "gather: row %lld (b=%d h=%d s=%lld) out of range",
                             (long long)r, rw->b, rw->h, (long long)rw->s);
        dst[r] = (double)lse[((size_t)rw->b * H + (size_t)rw->h) * S + (size_t)rw->s];
    }
    return NULL;
}

double cpc_check_tolerance(cpc_dtype t)
{
    switch (t) {
    case CPC_DTYPE_BF16:
        return 1e-2;
    case CPC_DTYPE_FP16:
        return 2e-3;
    default:
        return 1e-5;
    }
}

double cpc_check_tolerance_conditioned(cpc_dtype t, const double *ref, const double *bound, int64_t n,
                                       double *rounding_err)
{
    double sb = 0, sr = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && isfinite(bound[i])) {
            sb += bound[i] * bound[i];
            sr += ref[i] * ref[i];
        }
    double re = sr > 0 ? CPC_FP32_UNIT_ROUNDOFF * sqrt(sb / sr) : 0;
    if (rounding_err)
        *rounding_err = re;
    double tol = cpc_check_tolerance(t);
    return CPC_CHECK_ROUNDING_FACTOR * re > tol ? CPC_CHECK_ROUNDING_FACTOR * re : tol;
}

void cpc_compare_init(cpc_compare_result *r)
{
    memset(r, 0, sizeof *r);
    r->first_bad = -1;
}

static void add_pair(cpc_compare_result *r, double g, double f)
{
    int64_t i = r->n++;
    if (isnan(g) || isnan(f)) {
        r->n_nan++;
        if (r->first_bad < 0)
            r->first_bad = i;
        return;
    }
    if (isinf(g) || isinf(f)) {
        if (g != f) {
            r->n_inf++;
            if (r->first_bad < 0)
                r->first_bad = i;
        }
        return;
    }
    double e = fabs(g - f);
    if (e > r->max_abs_err)
        r->max_abs_err = e;
    r->sum_sq_diff += e * e;
    r->sum_sq_ref += f * f;
}

void cpc_compare_add(cpc_compare_result *r, const void *got, cpc_dtype t, const double *ref,
                     int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        add_pair(r, cpc_dtype_get_f64(got, t, (size_t)i), ref[i]);
}

void cpc_compare_add_f64(cpc_compare_result *r, const double *got, const double *ref,
                         int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        add_pair(r, got[i], ref[i]);
}

void cpc_compare_finish(cpc_compare_result *r, double tol)
{
    if (r->sum_sq_ref > 0.0)
        r->rel_err = sqrt(r->sum_sq_diff / r->sum_sq_ref);
    else
        r->rel_err = r->sum_sq_diff > 0.0 ? INFINITY : 0.0;
    r->pass = r->n_nan == 0 && r->n_inf == 0 && r->rel_err <= tol;
}

void cpc_compare(const void *got, cpc_dtype t, const double *ref, int64_t n, double tol,
                 cpc_compare_result *r)
{
    cpc_compare_init(r);
    cpc_compare_add(r, got, t, ref, n);
    cpc_compare_finish(r, tol);
}
