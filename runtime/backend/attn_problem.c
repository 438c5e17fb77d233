/*
 * attn_problem.c - the one attention problem (attn_problem.h): its check,
 * positions, GQA head mapping, key padding and tiling.
 */
#include "attn_problem.h"

#include <math.h>

#include "cpu_kernels.h" /* GROW: 64-byte aligned scratch */

/* Runs well formed (rule 8). */
static bool runs_ok(const cpc_run *runs, int n)
{
    if (n < 0 || (n > 0 && !runs))
        return false;
    for (int r = 0; r < n; r++)
        if (runs[r].len < 0)
            return false;
    return true;
}

/* Whether the runs add up to exactly n rows (none: n rows 0..n-1). */
static bool runs_cover(const cpc_run *runs, int n_runs, int64_t n)
{
    if (!runs || n_runs == 0)
        return true;
    int64_t c = 0;
    for (int r = 0; r < n_runs; r++) {
        if (runs[r].len > n - c)
            return false;
        c += runs[r].len;
    }
    return c == n;
}

cpc_status *cpc_attn_problem_check(const cpc_attn_problem *p)
{
    if (!p)
        return cpc_error(CPC_E_INTERNAL, "attention: no problem");
    if (p->B < 0 || p->sq < 0 || p->skv < 0 || p->hq < 0 || p->hkv < 1 || p->d < 1 || p->group < 1 ||
        p->q_head_off < 0 || p->kv_head_off < 0)
        return cpc_error(CPC_E_INTERNAL,
                         "attention: bad sizes (B=%d sq=%lld skv=%lld hq=%d hkv=%d d=%d group=%d "
                         "q_head_off=%d kv_head_off=%d)",
                         p->B, (long long)p->sq, (long long)p->skv, p->hq, p->hkv, p->d, p->group,
                         p->q_head_off, p->kv_head_off);
    if ((int)p->dtype < 0 || p->dtype >= CPC_DTYPE__COUNT)
        return cpc_error(CPC_E_INTERNAL, "attention: unknown dtype %d", (int)p->dtype);
    const int64_t qrow = (int64_t)p->hq * p->d, kvrow = (int64_t)p->hkv * p->d;
    if (qrow > 0x7fffffff || kvrow > 0x7fffffff || (qrow > 0 && p->sq > INT64_MAX / qrow) ||
        p->skv > INT64_MAX / kvrow)
        return cpc_error(CPC_E_INTERNAL, "attention: heads * head_dim (%lld, %lld) exceeds the BLAS "
                                         "index range, or a block's elements exceed int64",
                         (long long)qrow, (long long)kvrow);
    if (p->hq > 0) {
        int64_t first = p->q_head_off / p->group, last = ((int64_t)p->q_head_off + p->hq - 1) / p->group;
        if (first < p->kv_head_off || last >= (int64_t)p->kv_head_off + p->hkv)
            return cpc_error(CPC_E_INTERNAL,
                             "attention: query heads [%d, %lld) with group %d need K/V heads [%lld, %lld], "
                             "but this block holds K/V heads [%d, %lld)",
                             p->q_head_off, (long long)p->q_head_off + p->hq, p->group, (long long)first,
                             (long long)last, p->kv_head_off, (long long)p->kv_head_off + p->hkv);
    }
    const int64_t qblk = p->sq * p->hq * p->d, kvblk = p->skv * p->hkv * p->d;
    if (p->B > 1 && (p->q_bstride < qblk || p->kv_bstride < kvblk))
        return cpc_error(CPC_E_INTERNAL,
                         "attention: batch strides (q %lld, kv %lld elements) smaller than a batch's "
                         "block (q %lld, kv %lld)",
                         (long long)p->q_bstride, (long long)p->kv_bstride, (long long)qblk,
                         (long long)kvblk);
    const bool rows = cpc_attn_problem_has_rows(p), keys = rows && p->skv > 0;
    if ((rows && !p->q) || (keys && (!p->k || !p->v)))
        return cpc_error(CPC_E_INTERNAL, "attention: q (and k and v, with keys) are required");
    if (!runs_ok(p->q_runs, p->n_q_runs) || !runs_ok(p->kv_runs, p->n_kv_runs))
        return cpc_error(CPC_E_INTERNAL, "attention: bad run lists (%d query runs, %d key runs)",
                         p->n_q_runs, p->n_kv_runs);
    if (rows && !runs_cover(p->q_runs, p->n_q_runs, p->sq))
        return cpc_error(CPC_E_INTERNAL, "attention: query runs do not cover the %lld query rows",
                         (long long)p->sq);
    if (keys && !runs_cover(p->kv_runs, p->n_kv_runs, p->skv))
        return cpc_error(CPC_E_INTERNAL, "attention: key runs do not cover the %lld key rows",
                         (long long)p->skv);
    if (keys && p->kv_mask) {
        if (p->mask_len < 0)
            return cpc_error(CPC_E_INTERNAL, "attention: key padding mask of length %lld",
                             (long long)p->mask_len);
        bool none = !p->kv_runs || p->n_kv_runs == 0;
        for (int r = 0; r < (none ? 1 : p->n_kv_runs); r++) {
            int64_t s = none ? 0 : p->kv_runs[r].start, n = none ? p->skv : p->kv_runs[r].len;
            if (n > 0 && (s < 0 || s > p->mask_len - n))
                return cpc_error(CPC_E_INTERNAL,
                                 "attention: key positions [%lld, %lld) outside the key padding mask "
                                 "(length %lld)",
                                 (long long)s, (long long)(s + n), (long long)p->mask_len);
        }
    }
    return NULL;
}

void cpc_attn_positions(const cpc_run *runs, int n_runs, int64_t n, int64_t *pos)
{
    int64_t c = 0;
    for (int r = 0; runs && r < n_runs; r++)
        for (int64_t t = 0; t < runs[r].len && c < n; t++)
            pos[c++] = runs[r].start + t;
    for (; c < n; c++)
        pos[c] = c; /* no runs: identity */
}

bool cpc_attn_q_heads(const cpc_attn_problem *p, int kvl, int *h0, int *h1)
{
    int64_t g = (int64_t)p->kv_head_off + kvl;
    int64_t a = g * p->group - p->q_head_off, b = a + p->group;
    *h0 = a < 0 ? 0 : (int)(a > p->hq ? p->hq : a);
    *h1 = b > p->hq ? p->hq : (int)(b < 0 ? 0 : b);
    return *h0 < *h1;
}

/* ---- tiling --------------------------------------------------------------------- */

/* For increasing a[0..n): how many elements are <= x, and < x. */
static int count_le(const int64_t *a, int n, int64_t x)
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

static int count_lt(const int64_t *a, int n, int64_t x)
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

/* For every tile of t rows of pos[0..n): min, max, increasing; masked 0. */
static void tile_desc(const int64_t *pos, int64_t n, int t, int64_t *desc)
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
        desc[k * CPC_TILE_N + CPC_TILE_MIN] = mn;
        desc[k * CPC_TILE_N + CPC_TILE_MAX] = mx;
        desc[k * CPC_TILE_N + CPC_TILE_INC] = inc;
        desc[k * CPC_TILE_N + CPC_TILE_MASKED] = 0;
    }
}

cpc_status *cpc_attn_tiling_prepare(cpc_attn_tiling *t, const cpc_attn_problem *p, int tq, int tk)
{
    cpc_status *st;
    t->tq = tq;
    t->tk = tk;
    t->n_qt = (p->sq + tq - 1) / tq;
    t->n_kt = (p->skv + tk - 1) / tk;
    if ((st = GROW(t, qpos, sizeof(int64_t) * (size_t)p->sq)) ||
        (st = GROW(t, kpos, sizeof(int64_t) * (size_t)p->skv)) ||
        (st = GROW(t, qt, sizeof(int64_t) * CPC_TILE_N * (size_t)t->n_qt)) ||
        (st = GROW(t, kt, sizeof(int64_t) * CPC_TILE_N * (size_t)t->n_kt)) ||
        (p->kv_mask && (st = GROW(t, bias, sizeof(float) * (size_t)p->skv))))
        return st;
    cpc_attn_positions(p->q_runs, p->n_q_runs, p->sq, t->qpos);
    cpc_attn_positions(p->kv_runs, p->n_kv_runs, p->skv, t->kpos);
    tile_desc(t->qpos, p->sq, tq, t->qt);
    tile_desc(t->kpos, p->skv, tk, t->kt);
    return NULL;
}

void cpc_attn_tiling_batch(cpc_attn_tiling *t, const cpc_attn_problem *p, int b)
{
    if (!p->kv_mask)
        return;
    const uint8_t *mk = p->kv_mask + (size_t)b * (size_t)p->mask_len;
    const int64_t skv = p->skv;
    for (int64_t k = 0, j0 = 0; j0 < skv; k++, j0 += t->tk) {
        int64_t j1 = j0 + t->tk < skv ? j0 + t->tk : skv, cnt = 0;
        for (int64_t j = j0; j < j1; j++) {
            bool on = mk[t->kpos[j]] != 0;
            t->bias[j] = on ? 0.0f : -INFINITY;
            cnt += !on;
        }
        t->kt[k * CPC_TILE_N + CPC_TILE_MASKED] = cnt;
    }
}

bool cpc_attn_tile_pair(const cpc_attn_tiling *t, const cpc_attn_problem *p, int64_t qi, int64_t kj,
                        cpc_attn_tile *out)
{
    const int64_t *q = t->qt + qi * CPC_TILE_N, *k = t->kt + kj * CPC_TILE_N;
    const int64_t i0 = qi * t->tq, j0 = kj * t->tk;
    const int br = (int)(p->sq - i0 < t->tq ? p->sq - i0 : t->tq);
    const int bc = (int)(p->skv - j0 < t->tk ? p->skv - j0 : t->tk);
    if (p->causal && k[CPC_TILE_MIN] > q[CPC_TILE_MAX])
        return false; /* no row sees any key of this tile */
    if (k[CPC_TILE_MASKED] == bc)
        return false; /* every key padded out */
    out->i0 = i0;
    out->j0 = j0;
    out->br = br;
    out->r0 = 0;
    out->bcx = bc;
    out->diag = p->causal && k[CPC_TILE_MAX] > q[CPC_TILE_MIN];
    out->pad = k[CPC_TILE_MASKED] > 0;
    if (out->diag) {
        if (k[CPC_TILE_INC])
            out->bcx = count_le(t->kpos + j0, bc, q[CPC_TILE_MAX]);
        if (q[CPC_TILE_INC])
            out->r0 = count_lt(t->qpos + i0, br, k[CPC_TILE_MIN]);
    }
    return true;
}

void cpc_attn_mask_row(const cpc_attn_tiling *t, const cpc_attn_tile *tl, int r, float *sr)
{
    const int bcx = tl->bcx;
    if (tl->diag) {
        const int64_t *kp = t->kpos + tl->j0, qp = t->qpos[tl->i0 + r];
        if (t->kt[(tl->j0 / t->tk) * CPC_TILE_N + CPC_TILE_INC]) {
            for (int j = count_le(kp, bcx, qp); j < bcx; j++)
                sr[j] = -INFINITY;
        } else {
            for (int j = 0; j < bcx; j++)
                if (kp[j] > qp)
                    sr[j] = -INFINITY;
        }
    }
    if (tl->pad) {
        const float *bias = t->bias + tl->j0;
        for (int j = 0; j < bcx; j++)
            sr[j] += bias[j];
    }
}

void cpc_attn_tiling_free(cpc_attn_tiling *t)
{
    if (!t)
        return;
    free(t->qpos);
    free(t->kpos);
    free(t->qt);
    free(t->kt);
    free(t->bias);
    *t = (cpc_attn_tiling){0};
}

/* ---- the two directions (backend.h) ---------------------------------------------- */

cpc_status *cpc_attn_args_check(const cpc_attn_args *a)
{
    cpc_status *st = cpc_attn_problem_check(a ? &a->p : NULL);
    if (st)
        return st;
    if (cpc_attn_problem_has_rows(&a->p) && (!a->o || !a->lse))
        return cpc_error(CPC_E_INTERNAL, "attention forward: o and lse are required");
    return NULL;
}

cpc_status *cpc_attn_bwd_args_check(const cpc_attn_bwd_args *a)
{
    cpc_status *st = cpc_attn_problem_check(a ? &a->p : NULL);
    if (st)
        return st;
    const cpc_attn_problem *p = &a->p;
    if (a->compute_delta && ((int)a->out_dtype < 0 || a->out_dtype >= CPC_DTYPE__COUNT))
        return cpc_error(CPC_E_INTERNAL, "attention backward: unknown out dtype %d", (int)a->out_dtype);
    const int64_t qblk = p->sq * p->hq * p->d, kvblk = p->skv * p->hkv * p->d;
    if (a->dq_bstride < 0 || a->dkv_bstride < 0 ||
        (p->B > 1 && ((a->dq_bstride && a->dq_bstride < qblk) || (a->dkv_bstride && a->dkv_bstride < kvblk))))
        return cpc_error(CPC_E_INTERNAL,
                         "attention backward: gradient batch strides (dq %lld, dk/dv %lld elements) "
                         "smaller than a batch's block (q %lld, kv %lld)",
                         (long long)a->dq_bstride, (long long)a->dkv_bstride, (long long)qblk,
                         (long long)kvblk);
    if (p->B > 1 && (a->dout_bstride < qblk || (a->compute_delta && a->out_bstride < qblk)))
        return cpc_error(CPC_E_INTERNAL,
                         "attention backward: batch strides (dout %lld, out %lld elements) smaller "
                         "than a batch's block (%lld)",
                         (long long)a->dout_bstride, (long long)a->out_bstride, (long long)qblk);
    const bool rows = cpc_attn_problem_has_rows(p);
    if (rows && (!a->dout || !a->delta || (a->compute_delta && !a->out)))
        return cpc_error(CPC_E_INTERNAL, "attention backward: dout and delta (and out, to compute "
                                         "delta) are required");
    if (rows && p->skv > 0 && (!a->lse || !a->dq || !a->dk || !a->dv))
        return cpc_error(CPC_E_INTERNAL, "attention backward: lse, dq, dk and dv are required");
    return NULL;
}
