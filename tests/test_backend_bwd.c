/*
 * test_backend_bwd.c - the CPU attention backward (backend.h attn_bwd,
 * runtime/backend/attention_bwd_cpu.c) against the float64 reference
 * backward (runtime/session/reference.h cpc_reference_attention_bwd), and
 * both against central finite differences of a float64 forward written
 * here (independent of either's algebra).
 *
 * Inputs are fresh random normals every run: the seed comes from the clock
 * and every case prints it (stderr, with its errors); CPC_TEST_SEED=N
 * replays it (every case then uses N).  Inputs are rounded to the dtype
 * first and the reference reads the same rounded values, so the error
 * measured is the kernel's alone.  The kernel's saved `out` is the fp32
 * output of the forward kernel (so delta carries the forward's fp32 error
 * only), except in the case that passes the plan-dtype output as training
 * would.  Tolerances: the SPEC's (section 10: as for out, bf16 2e-2) and the
 * stricter 1e-5 for every dtype when out is fp32 (the kernel computes in
 * fp32 from exactly the reference's inputs).
 */
#include <criterion/criterion.h>

#include <Random123/philox.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "dtype.h"
#include "reference.h"
#include "test_random.h"

static void fill_poison(void *p, cpc_dtype t, size_t n)
{
    if (t == CPC_DTYPE_FP32) {
        float *f = p;
        for (size_t i = 0; i < n; i++)
            f[i] = NAN;
    } else {
        uint16_t *h = p;
        for (size_t i = 0; i < n; i++)
            h[i] = t == CPC_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
    }
}

static cpc_backend *make_backend(const char *tiles)
{
    if (tiles)
        setenv("CPC_CPU_ATTN_BWD_TILES", tiles, 1);
    else
        unsetenv("CPC_CPU_ATTN_BWD_TILES");
    cpc_backend *be = NULL;
    cpc_cpu_backend_single_thread_blas();
    cpc_status *st = cpc_cpu_backend_create(&be);
    cr_assert_null(st, "cpc_cpu_backend_create failed");
    cr_assert(cpc_backend_has_attn_bwd(be), "the CPU backend has attn_bwd");
    return be;
}

static int64_t runs_total(const cpc_run *r, int n)
{
    int64_t t = 0;
    for (int i = 0; i < n; i++)
        t += r[i].len;
    return t;
}

static int to_runs(const int64_t *pos, int64_t n, cpc_run *out, int max)
{
    int c = 0;
    for (int64_t i = 0; i < n; i++) {
        if (c > 0 && out[c - 1].start + out[c - 1].len == pos[i])
            out[c - 1].len++;
        else {
            cr_assert(c < max, "too many runs");
            out[c].start = pos[i];
            out[c].len = 1;
            c++;
        }
    }
    return c;
}

/* ---- the harness ------------------------------------------------------------------------
 *
 * A global problem q [B,S,H,D], k/v [B,Skv,Hkv,D], dout [B,S,H,D] (+ optional
 * key padding) and one rank's view of it: query rows = the concatenation of
 * q runs, keys = the concatenation of kv runs, query heads [qh0, qh0+nqh);
 * the local K/V hold one spare K/V head on each side where the global tensor
 * has it (their dk/dv must stay untouched).  Local q/dout/k/v buffers have
 * `extra` NaN rows per batch (batch strides larger than the block).  The
 * forward kernel runs over all the view's keys (out, lse of the whole row);
 * the backward then runs over the keys split into nblk consecutive blocks, in
 * a rotated order (ring steps), delta computed on the first only, each
 * block's dk/dv accumulated into the view's.  The reference is the float64
 * global backward with the keys restricted to the view (mask) and dout zeroed
 * outside the view's rows and heads (so those rows add nothing to dk/dv). */

typedef struct bcase {
    int B;
    int64_t S, Skv;
    int H, Hkv, D;
    cpc_dtype dt;
    bool causal;
    int pad;          /* 0 none; 1 random ~25% padded; 2 = 1 and batch B-1 fully padded;
                         3 = 1 and the first 5 keys padded (early causal rows see none) */
    cpc_run qr[8];
    int nqr;
    cpc_run kr[8];
    int nkr;
    int qh0, nqh;
    int extra;
    int nblk;
    bool prior;       /* dq/dk/dv start nonzero (+= checked) */
    bool out_plan_dtype; /* delta from the plan-dtype out (as training saves it) */
    double amp;       /* q amplitude (0 -> 1) */
    const char *tiles;
    double tol;       /* 0: the default (see the file comment) */
} bcase;

typedef struct bres {
    double dq, dk, dv; /* relative errors */
    int64_t empty_rows;
} bres;

static bres run_bwd(const bcase *tc0, uint64_t seed)
{
    bcase tc = *tc0;
    if (!tc.nqr) {
        tc.qr[0] = (cpc_run){0, tc.S};
        tc.nqr = 1;
    }
    if (!tc.nkr) {
        tc.kr[0] = (cpc_run){0, tc.Skv};
        tc.nkr = 1;
    }
    if (!tc.nqh) {
        tc.qh0 = 0;
        tc.nqh = tc.H;
    }
    if (tc.nblk < 1)
        tc.nblk = 1;
    if (tc.amp == 0)
        tc.amp = 1.0;
    const int B = tc.B, H = tc.H, Hkv = tc.Hkv, D = tc.D, group = H / Hkv;
    const int64_t S = tc.S, Skv = tc.Skv;
    const cpc_dtype dt = tc.dt;
    const size_t es = test_esz(dt);
    const float scale = (float)(1.0 / sqrt((double)D));

    void *q = test_rand_tensor(dt, (size_t)B * S * H * D, seed, 1, tc.amp);
    void *k = test_rand_tensor(dt, (size_t)B * Skv * Hkv * D, seed, 2, 1.0);
    void *v = test_rand_tensor(dt, (size_t)B * Skv * Hkv * D, seed, 3, 1.0);
    void *dout = test_rand_tensor(dt, (size_t)B * S * H * D, seed, 5, 1.0);
    uint8_t *pmask = NULL;
    if (tc.pad) {
        pmask = malloc((size_t)B * Skv);
        for (int b = 0; b < B; b++)
            for (int64_t j = 0; j < Skv; j++) {
                uint8_t on = (test_bits_at(seed, 4, (uint64_t)b * Skv + j) & 3u) != 0;
                if (tc.pad == 2 && b == B - 1)
                    on = 0;
                if (tc.pad == 3 && j < 5)
                    on = 0;
                pmask[(size_t)b * Skv + j] = on;
            }
    }

    /* the view */
    const int64_t sq = runs_total(tc.qr, tc.nqr), skv = runs_total(tc.kr, tc.nkr);
    int64_t *qpos = malloc(sizeof(int64_t) * (size_t)sq);
    int64_t *kpos = malloc(sizeof(int64_t) * (size_t)skv);
    for (int r = 0, c = 0; r < tc.nqr; r++)
        for (int64_t t = 0; t < tc.qr[r].len; t++)
            qpos[c++] = tc.qr[r].start + t;
    for (int r = 0, c = 0; r < tc.nkr; r++)
        for (int64_t t = 0; t < tc.kr[r].len; t++)
            kpos[c++] = tc.kr[r].start + t;
    const int nqh = tc.nqh, qh0 = tc.qh0;
    int kv_need0 = qh0 / group, kv_need1 = (qh0 + nqh - 1) / group + 1;
    int kv_off = kv_need0 > 0 ? kv_need0 - 1 : 0;
    int kv_end = kv_need1 < Hkv ? kv_need1 + 1 : Hkv;
    int hkv = kv_end - kv_off;

    /* local q and dout (NaN rows past the block in every batch) */
    const int64_t qbs = (sq + tc.extra) * nqh * D;
    void *ql = malloc(es * (size_t)(B * qbs)), *dol = malloc(es * (size_t)(B * qbs));
    fill_poison(ql, dt, (size_t)(B * qbs));
    fill_poison(dol, dt, (size_t)(B * qbs));
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++) {
            size_t src = ((((size_t)b * S + qpos[i]) * H + qh0) * D) * es;
            size_t dst = ((size_t)b * qbs + (size_t)i * nqh * D) * es;
            memcpy((char *)ql + dst, (char *)q + src, es * (size_t)nqh * D);
            memcpy((char *)dol + dst, (char *)dout + src, es * (size_t)nqh * D);
        }
    /* local K/V of keys [j0, j1) of the view, batch stride (j1-j0+extra)*hkv*D */
#define MAKE_KV(dst_k, dst_v, j0, j1, bs)                                                       \
    do {                                                                                    \
        (bs) = ((j1) - (j0) + tc.extra) * hkv * D;                                           \
        dst_k = malloc(es * (size_t)(B * (bs) + 1));                                         \
        dst_v = malloc(es * (size_t)(B * (bs) + 1));                                         \
        fill_poison(dst_k, dt, (size_t)(B * (bs)));                                          \
        fill_poison(dst_v, dt, (size_t)(B * (bs)));                                          \
        for (int b_ = 0; b_ < B; b_++)                                                       \
            for (int64_t j_ = (j0); j_ < (j1); j_++) {                                       \
                size_t s_ = (((size_t)b_ * Skv + kpos[j_]) * Hkv + kv_off) * D * es;         \
                size_t d_ = ((size_t)b_ * (bs) + (size_t)(j_ - (j0)) * hkv * D) * es;        \
                memcpy((char *)dst_k + d_, (char *)k + s_, es * (size_t)hkv * D);            \
                memcpy((char *)dst_v + d_, (char *)v + s_, es * (size_t)hkv * D);            \
            }                                                                                \
    } while (0)

    cpc_backend *be = make_backend(tc.tiles);
    cpc_status *st;
    /* forward over the view's keys: out and the row's full lse */
    const size_t no = (size_t)B * sq * nqh * D, nl = (size_t)B * nqh * sq;
    const size_t nkv = (size_t)B * skv * hkv * D;
    float *o = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * nl);
    {
        void *kl, *vl;
        int64_t kvbs;
        MAKE_KV(kl, vl, 0, skv, kvbs);
        cpc_attn_args fa = {
            .p.B = B, .p.sq = sq, .p.skv = skv, .p.hq = nqh, .p.hkv = hkv, .p.d = D, .p.group = group,
            .p.q_head_off = qh0, .p.kv_head_off = kv_off, .p.dtype = dt, .p.q = ql, .p.k = kl, .p.v = vl,
            .p.q_bstride = qbs, .p.kv_bstride = kvbs, .o = o, .lse = lse, .p.scale = scale,
            .p.causal = tc.causal, .p.q_runs = tc.qr, .p.n_q_runs = tc.nqr, .p.kv_runs = tc.kr,
            .p.n_kv_runs = tc.nkr, .p.kv_mask = pmask, .p.mask_len = pmask ? Skv : 0};
        st = cpc_backend_attn(be, &fa);
        cr_assert_null(st, "forward failed (seed %llu)", (unsigned long long)seed);
        free(kl);
        free(vl);
    }
    /* the saved out the backward reads: fp32, or the plan dtype with a batch stride */
    const void *outp = o;
    cpc_dtype out_dt = CPC_DTYPE_FP32;
    int64_t out_bs = (int64_t)sq * nqh * D;
    void *o_plan = NULL;
    if (tc.out_plan_dtype) {
        out_dt = dt;
        out_bs = qbs;
        o_plan = malloc(es * (size_t)(B * qbs));
        fill_poison(o_plan, dt, (size_t)(B * qbs));
        const size_t ob = (size_t)sq * nqh * D;
        for (int b = 0; b < B; b++)
            cpc_from_f32_n((char *)o_plan + (size_t)b * qbs * es, dt, o + (size_t)b * ob, ob);
        outp = o_plan;
    }

    /* gradients: prior values (accumulation) or 0, in buffers with `extra`
     * sentinel rows per batch (batch strides; the sentinels must survive); the
     * blocks write their slices of dk/dv in place (dkv_bstride) */
    const int64_t dqbs = (sq + tc.extra) * nqh * D, dkvbs = (skv + tc.extra) * hkv * D;
    const size_t ndq = (size_t)B * dqbs, ndkv = (size_t)B * dkvbs;
    const float sentinel = 12345.0f;
    float *dq = malloc(sizeof(float) * ndq), *dk = malloc(sizeof(float) * ndkv);
    float *dv = malloc(sizeof(float) * ndkv);
    float *pq = malloc(sizeof(float) * ndq), *pk = malloc(sizeof(float) * ndkv);
    float *pv = malloc(sizeof(float) * ndkv);
    for (size_t i = 0; i < ndq; i++)
        pq[i] = (int64_t)(i % (size_t)dqbs) >= sq * nqh * D ? sentinel
                : tc.prior ? (float)(0.01 * test_normal_at(seed, 6, i)) : 0.0f;
    for (size_t i = 0; i < ndkv; i++) {
        bool gap = (int64_t)(i % (size_t)dkvbs) >= skv * hkv * D;
        pk[i] = gap ? sentinel : tc.prior ? (float)(0.01 * test_normal_at(seed, 7, i)) : 0.0f;
        pv[i] = gap ? sentinel : tc.prior ? (float)(0.01 * test_normal_at(seed, 8, i)) : 0.0f;
    }
    memcpy(dq, pq, sizeof(float) * ndq);
    memcpy(dk, pk, sizeof(float) * ndkv);
    memcpy(dv, pv, sizeof(float) * ndkv);
    float *delta = malloc(sizeof(float) * nl);
    for (size_t i = 0; i < nl; i++)
        delta[i] = NAN;

    for (int blk = 0; blk < tc.nblk; blk++) {
        int bi = (blk + 1) % tc.nblk; /* rotated, as a ring rank sees the blocks */
        int64_t j0 = skv * bi / tc.nblk, j1 = skv * (bi + 1) / tc.nblk, bn = j1 - j0;
        cpc_run kr[64];
        int nkr = to_runs(kpos + j0, bn, kr, 64);
        void *kl, *vl;
        int64_t kvbs;
        MAKE_KV(kl, vl, j0, j1, kvbs);
        /* contiguous (stride 0) only when the block is the whole, gapless buffer */
        const bool whole = tc.nblk == 1 && tc.extra == 0;
        cpc_attn_bwd_args a = {
            .p.B = B, .p.sq = sq, .p.skv = bn, .p.hq = nqh, .p.hkv = hkv, .p.d = D, .p.group = group,
            .p.q_head_off = qh0, .p.kv_head_off = kv_off, .p.dtype = dt,
            .p.q = ql, .p.k = kl, .p.v = vl, .dout = dol,
            .p.q_bstride = qbs, .p.kv_bstride = kvbs, .dout_bstride = qbs,
            .out = blk == 0 ? outp : NULL, .out_dtype = out_dt, .out_bstride = out_bs,
            .lse = lse, .delta = delta, .compute_delta = blk == 0,
            .dq = dq, .dk = dk + (size_t)j0 * hkv * D, .dv = dv + (size_t)j0 * hkv * D,
            .dq_bstride = whole ? 0 : dqbs, .dkv_bstride = whole ? 0 : dkvbs,
            .p.scale = scale, .p.causal = tc.causal,
            .p.q_runs = tc.qr, .p.n_q_runs = tc.nqr, .p.kv_runs = kr, .p.n_kv_runs = nkr,
            .p.kv_mask = pmask, .p.mask_len = pmask ? Skv : 0};
        st = cpc_backend_attn_bwd(be, &a);
        if (st)
            cpc_status_print(st, stderr, "test");
        cr_assert_null(st, "attn_bwd failed (seed %llu)", (unsigned long long)seed);
        free(kl);
        free(vl);
    }
#undef MAKE_KV
    cpc_backend_destroy(be);

    /* reference: keys restricted to the view, dout zero outside the view */
    uint8_t *rmask = calloc((size_t)B * Skv, 1);
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < skv; j++) {
            size_t id = (size_t)b * Skv + kpos[j];
            rmask[id] = pmask ? pmask[id] : 1;
        }
    void *rdout = calloc((size_t)B * S * H * D, es);
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++) {
            size_t off = ((((size_t)b * S + qpos[i]) * H + qh0) * D) * es;
            memcpy((char *)rdout + off, (char *)dout + off, es * (size_t)nqh * D);
        }
    double *rq = malloc(sizeof(double) * (size_t)B * S * H * D);
    double *rk = malloc(sizeof(double) * (size_t)B * Skv * Hkv * D);
    double *rv = malloc(sizeof(double) * (size_t)B * Skv * Hkv * D);
    cpc_ref_problem p = {.B = B, .S = S, .Skv = Skv, .H = H, .Hkv = Hkv, .D = D, .dtype = dt,
                         .q = q, .k = k, .v = v, .scale = scale, .causal = tc.causal,
                         .kv_mask = rmask};
    st = cpc_reference_attention_bwd(&p, rdout, rq, rk, rv);
    cr_assert_null(st, "reference backward failed");

    /* compare got - prior against the reference */
    bres res = {0};
    double *got = malloc(sizeof(double) * (no > nkv ? no : nkv));
    double *ref = malloc(sizeof(double) * (no > nkv ? no : nkv));
    size_t n = 0;
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++)
            for (int h = 0; h < nqh; h++) {
                size_t li = (size_t)b * dqbs + ((size_t)i * nqh + (size_t)h) * D;
                size_t gi = (((size_t)b * S + (size_t)qpos[i]) * H + (size_t)(qh0 + h)) * D;
                if (lse[((size_t)b * nqh + h) * sq + (size_t)i] == -INFINITY) {
                    res.empty_rows++;
                    for (int e = 0; e < D; e++)
                        cr_assert(dq[li + e] == pq[li + e],
                                  "row (b=%d h=%d s=%lld) sees no key: dq must be unchanged "
                                  "(seed %llu)",
                                  b, qh0 + h, (long long)qpos[i], (unsigned long long)seed);
                }
                for (int e = 0; e < D; e++) {
                    got[n] = (double)dq[li + e] - (double)pq[li + e];
                    ref[n++] = rq[gi + e];
                }
            }
    const double tol = tc.tol > 0 ? tc.tol
                       : tc.out_plan_dtype ? (dt == CPC_DTYPE_BF16 ? 2e-2 : cpc_check_tolerance(dt))
                                           : 1e-5;
    cpc_compare_result cq, ck, cv;
    cpc_compare_init(&cq);
    cpc_compare_add_f64(&cq, got, ref, (int64_t)n);
    cpc_compare_finish(&cq, tol);
    double *gk = malloc(sizeof(double) * nkv), *rkk = malloc(sizeof(double) * nkv);
    double *gv = malloc(sizeof(double) * nkv), *rvv = malloc(sizeof(double) * nkv);
    n = 0;
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < skv; j++)
            for (int kh = 0; kh < hkv; kh++) {
                size_t li = (size_t)b * dkvbs + ((size_t)j * hkv + (size_t)kh) * D;
                size_t gi = (((size_t)b * Skv + (size_t)kpos[j]) * Hkv + (size_t)(kv_off + kh)) * D;
                int g = kv_off + kh;
                bool used = (g + 1) * group > qh0 && g * group < qh0 + nqh;
                for (int e = 0; e < D; e++) {
                    if (!used)
                        cr_assert(dk[li + e] == pk[li + e] && dv[li + e] == pv[li + e],
                                  "K/V head %d is used by no query head of the call: dk/dv "
                                  "must be untouched (seed %llu)",
                                  g, (unsigned long long)seed);
                    gk[n] = (double)dk[li + e] - (double)pk[li + e];
                    gv[n] = (double)dv[li + e] - (double)pv[li + e];
                    rkk[n] = rk[gi + e];
                    rvv[n++] = rv[gi + e];
                }
            }
    for (size_t i = 0; i < ndq; i++)
        if ((int64_t)(i % (size_t)dqbs) >= sq * nqh * D)
            cr_assert(dq[i] == sentinel, "dq written between batches (seed %llu)",
                      (unsigned long long)seed);
    for (size_t i = 0; i < ndkv; i++)
        if ((int64_t)(i % (size_t)dkvbs) >= skv * hkv * D)
            cr_assert(dk[i] == sentinel && dv[i] == sentinel,
                      "dk/dv written between batches (seed %llu)", (unsigned long long)seed);
    cpc_compare_init(&ck);
    cpc_compare_add_f64(&ck, gk, rkk, (int64_t)n);
    cpc_compare_finish(&ck, tol);
    cpc_compare_init(&cv);
    cpc_compare_add_f64(&cv, gv, rvv, (int64_t)n);
    cpc_compare_finish(&cv, tol);
    fprintf(stderr,
            "bwd B=%d S=%lld Skv=%lld H=%d Hkv=%d D=%d %s%s causal=%d pad=%d nblk=%d "
            "view q %lld k %lld heads %d+%d: dq %.2e dk %.2e dv %.2e (empty rows %lld) "
            "seed %llu\n",
            B, (long long)S, (long long)Skv, H, Hkv, D,
            dt == CPC_DTYPE_FP32 ? "fp32" : dt == CPC_DTYPE_BF16 ? "bf16" : "fp16",
            tc.out_plan_dtype ? " (out in dtype)" : "", tc.causal, tc.pad, tc.nblk,
            (long long)sq, (long long)skv, qh0, nqh, cq.rel_err, ck.rel_err, cv.rel_err,
            (long long)res.empty_rows, (unsigned long long)seed);
    cr_assert(cq.n_nan + cq.n_inf + ck.n_nan + ck.n_inf + cv.n_nan + cv.n_inf == 0,
              "NaN/Inf in the gradients: dq %lld/%lld dk %lld/%lld dv %lld/%lld (seed %llu)",
              (long long)cq.n_nan, (long long)cq.n_inf, (long long)ck.n_nan,
              (long long)ck.n_inf, (long long)cv.n_nan, (long long)cv.n_inf,
              (unsigned long long)seed);
    /* a gradient that vanishes in exact arithmetic (dq and dk with a single
     * visible key: dS = P (dP - delta) = 0; the double reference then holds
     * rounding noise, rms < 1e-6) has no meaningful relative error: there the
     * absolute error must be at the fp32 rounding level of its O(1) terms (dP
     * and delta are sums of D products of unit normals: an ulp of ~8 is 1e-6) */
    cpc_compare_result *cr3[3] = {&cq, &ck, &cv};
    for (int i = 0; i < 3; i++)
        if (cr3[i]->n > 0 && sqrt(cr3[i]->sum_sq_ref / (double)cr3[i]->n) < 1e-6 &&
            cr3[i]->max_abs_err <= 1e-5)
            cr3[i]->pass = cr3[i]->n_nan == 0 && cr3[i]->n_inf == 0;
    cr_assert(cq.pass && ck.pass && cv.pass,
              "gradient rel err dq %.3e dk %.3e dv %.3e > %.0e (B=%d S=%lld Skv=%lld H=%d "
              "Hkv=%d D=%d dtype %d causal %d pad %d nblk %d) (seed %llu)",
              cq.rel_err, ck.rel_err, cv.rel_err, tol, B, (long long)S, (long long)Skv, H,
              Hkv, D, (int)dt, tc.causal, tc.pad, tc.nblk, (unsigned long long)seed);
    res.dq = cq.rel_err;
    res.dk = ck.rel_err;
    res.dv = cv.rel_err;

    free(q);
    free(k);
    free(v);
    free(dout);
    free(pmask);
    free(qpos);
    free(kpos);
    free(ql);
    free(dol);
    free(o);
    free(lse);
    free(o_plan);
    free(dq);
    free(dk);
    free(dv);
    free(pq);
    free(pk);
    free(pv);
    free(delta);
    free(rmask);
    free(rdout);
    free(rq);
    free(rk);
    free(rv);
    free(got);
    free(ref);
    free(gk);
    free(rkk);
    free(gv);
    free(rvv);
    return res;
}

static const cpc_dtype all_dt[3] = {CPC_DTYPE_FP32, CPC_DTYPE_BF16, CPC_DTYPE_FP16};

/* ---- kernel vs reference --------------------------------------------------------------- */

Test(attn_bwd, head_dims_and_dtypes)
{
    const int dims[] = {16, 64, 128, 256, 40};
    for (int di = 0; di < 5; di++)
        for (int t = 0; t < 3; t++) {
            bcase tc = {.B = 1, .S = 150, .Skv = 150, .H = 2, .Hkv = 2, .D = dims[di],
                        .dt = all_dt[t], .extra = 3};
            run_bwd(&tc, test_seed());
        }
}

Test(attn_bwd, gqa_28_7_and_mqa)
{
    for (int t = 0; t < 3; t++) {
        bcase all = {.B = 1, .S = 64, .Skv = 64, .H = 28, .Hkv = 7, .D = 32, .dt = all_dt[t],
                     .causal = true};
        run_bwd(&all, test_seed());
        /* a ulysses rank's heads: query heads [10, 17) use K/V heads 2..4, the
         * block holds K/V heads [1, 6): heads 1 and 5 must stay untouched, heads 2
         * and 4 get the part of their group this call sees */
        bcase part = {.B = 2, .S = 48, .Skv = 48, .H = 28, .Hkv = 7, .D = 40, .dt = all_dt[t],
                      .qh0 = 10, .nqh = 7, .extra = 2, .causal = true, .prior = true};
        run_bwd(&part, test_seed());
        bcase mqa = {.B = 1, .S = 100, .Skv = 100, .H = 8, .Hkv = 1, .D = 64, .dt = all_dt[t],
                     .causal = true};
        run_bwd(&mqa, test_seed());
        bcase mqa_part = {.B = 1, .S = 70, .Skv = 70, .H = 8, .Hkv = 1, .D = 16,
                          .dt = all_dt[t], .qh0 = 3, .nqh = 4};
        run_bwd(&mqa_part, test_seed());
    }
}

Test(attn_bwd, causal_zigzag_runs)
{
    for (int t = 0; t < 3; t++) {
        /* S = 16 over P = 2 zigzag: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 */
        bcase r0_r1 = {.B = 1, .S = 16, .Skv = 16, .H = 2, .Hkv = 2, .D = 8, .dt = all_dt[t],
                       .causal = true, .qr = {{0, 4}, {12, 4}}, .nqr = 2,
                       .kr = {{4, 4}, {8, 4}}, .nkr = 2};
        run_bwd(&r0_r1, test_seed());
        /* S = 512 over P = 4 zigzag (chunks of 64): rank 1's queries (chunks 1, 6)
         * against rank 2's and rank 0's shards (positions not increasing inside the
         * block), small tiles so that diagonal tiles are trimmed and masked */
        bcase big = {.B = 1, .S = 512, .Skv = 512, .H = 2, .Hkv = 1, .D = 32,
                     .dt = all_dt[t], .causal = true,
                     .qr = {{64, 64}, {384, 64}}, .nqr = 2,
                     .kr = {{128, 64}, {320, 64}, {0, 64}, {448, 64}}, .nkr = 4,
                     .tiles = "32x48"};
        run_bwd(&big, test_seed());
        /* a unified ring block: chunks 0, 7, 1, 6 of 8 (positions jump back inside
         * a query tile and a key tile), default tiles */
        bcase blk = {.B = 1, .S = 512, .Skv = 512, .H = 1, .Hkv = 1, .D = 64,
                     .dt = all_dt[t], .causal = true,
                     .qr = {{0, 64}, {448, 64}, {64, 64}, {384, 64}}, .nqr = 4,
                     .kr = {{0, 64}, {448, 64}, {64, 64}, {384, 64}}, .nkr = 4};
        run_bwd(&blk, test_seed());
    }
}

Test(attn_bwd, causal_full_many_tiles)
{
    const char *tiles[] = {NULL, "7x13", "64x32", "1x1"};
    for (int ti = 0; ti < 4; ti++) {
        int64_t S = ti == 3 ? 30 : 400;
        bcase tc = {.B = 2, .S = S, .Skv = S, .H = 2, .Hkv = 1, .D = 32,
                    .dt = all_dt[ti % 3], .causal = true, .extra = 1, .tiles = tiles[ti]};
        run_bwd(&tc, test_seed());
    }
}

Test(attn_bwd, key_padding_and_empty_rows)
{
    for (int t = 0; t < 3; t++) {
        /* the last batch fully padded: none of its rows contributes */
        bcase full = {.B = 3, .S = 40, .Skv = 150, .H = 2, .Hkv = 2, .D = 40, .dt = all_dt[t],
                      .pad = 2, .extra = 4, .prior = true};
        bres r = run_bwd(&full, test_seed());
        cr_assert_eq(r.empty_rows, 40 * 2, "expected every row of batch 2 to be empty");
        /* causal + the first 5 keys padded: the first rows see no key */
        bcase early = {.B = 2, .S = 300, .Skv = 300, .H = 1, .Hkv = 1, .D = 64,
                       .dt = all_dt[t], .pad = 3, .causal = true, .prior = true};
        r = run_bwd(&early, test_seed());
        cr_assert_geq(r.empty_rows, 2, "the first rows must see no key");
        /* padding with runs (the mask is indexed by global key position) */
        bcase runs = {.B = 2, .S = 64, .Skv = 64, .H = 2, .Hkv = 2, .D = 8, .dt = all_dt[t],
                      .pad = 1, .qr = {{8, 8}, {40, 8}}, .nqr = 2,
                      .kr = {{16, 16}, {0, 8}, {56, 8}}, .nkr = 3, .causal = true};
        run_bwd(&runs, test_seed());
    }
}

Test(attn_bwd, cross_attention)
{
    for (int t = 0; t < 3; t++) {
        bcase wide = {.B = 2, .S = 37, .Skv = 500, .H = 3, .Hkv = 3, .D = 64, .dt = all_dt[t],
                      .extra = 5, .pad = 1};
        run_bwd(&wide, test_seed());
        bcase narrow = {.B = 1, .S = 400, .Skv = 29, .H = 2, .Hkv = 1, .D = 40,
                        .dt = all_dt[t]};
        run_bwd(&narrow, test_seed());
    }
}

Test(attn_bwd, batch_strides)
{
    for (int t = 0; t < 3; t++) {
        bcase tc = {.B = 3, .S = 120, .Skv = 160, .H = 4, .Hkv = 2, .D = 64, .dt = all_dt[t],
                    .qh0 = 1, .nqh = 2, .extra = 17, .qr = {{20, 90}}, .nqr = 1,
                    .kr = {{3, 150}}, .nkr = 1, .prior = true};
        run_bwd(&tc, test_seed());
    }
}

Test(attn_bwd, large_logits)
{
    /* scores with a spread of ~30: P recomputed from the LSE stays exact to the
     * fp32 rounding of the scores (absolute ~|s| 2^-24, hence relative ~1e-5 in
     * P), while the true dq and dk shrink as the softmax saturates (dS =
     * P (dP - delta) -> 0 on the dominant key): measured 5e-6 .. 1.1e-5 on dq
     * and dk over seeds, 3e-6 on dv; checked at 3e-5 */
    for (int t = 0; t < 3; t++) {
        bcase tc = {.B = 1, .S = 120, .Skv = 600, .H = 1, .Hkv = 1, .D = 64, .dt = all_dt[t],
                    .amp = 30.0, .tol = 3e-5};
        run_bwd(&tc, test_seed());
    }
}

/* The ring backward's premise: attn_bwd over a partition of the keys into
 * blocks, each with the row's full LSE (and delta computed once, on the first
 * block), sums to the backward over all the keys. */
Test(attn_bwd, split_keys_sum_to_whole)
{
    for (int t = 0; t < 3; t++) {
        bcase two = {.B = 2, .S = 256, .Skv = 256, .H = 4, .Hkv = 2, .D = 64, .dt = all_dt[t],
                     .causal = true, .nblk = 2, .extra = 2, .prior = true};
        run_bwd(&two, test_seed());
        /* zigzag queries of rank 1 of 4 against the whole sequence in 4 ring blocks
         * (the shards of ranks 2, 3, 0, 1 in ring order), key padding, GQA part */
        bcase ring = {.B = 1, .S = 256, .Skv = 256, .H = 6, .Hkv = 2, .D = 32,
                      .dt = all_dt[t], .causal = true, .pad = 1, .nblk = 4,
                      .qh0 = 2, .nqh = 3,
                      .qr = {{32, 32}, {192, 32}}, .nqr = 2,
                      .kr = {{0, 32}, {224, 32}, {32, 32}, {192, 32}, {64, 32}, {160, 32},
                             {96, 32}, {128, 32}}, .nkr = 8};
        run_bwd(&ring, test_seed());
        /* cross-attention with uneven blocks (3 blocks of 100 keys: 33/33/34) */
        bcase cross = {.B = 1, .S = 50, .Skv = 100, .H = 2, .Hkv = 1, .D = 16, .dt = all_dt[t],
                       .nblk = 3};
        run_bwd(&cross, test_seed());
    }
}

/* delta from the plan-dtype out (what a training plan saves): the SPEC's
 * gradient tolerances (fp32 1e-5, fp16 2e-3, bf16 2e-2). */
Test(attn_bwd, out_in_plan_dtype)
{
    for (int t = 0; t < 3; t++) {
        bcase tc = {.B = 2, .S = 200, .Skv = 200, .H = 2, .Hkv = 1, .D = 64, .dt = all_dt[t],
                    .causal = true, .extra = 3, .out_plan_dtype = true, .nblk = 2};
        run_bwd(&tc, test_seed());
    }
}

Test(attn_bwd, scalar_and_avx2_paths)
{
    const char *isa[] = {"scalar", "avx2"};
    for (int i = 0; i < 2; i++) {
        setenv("CPC_CPU_ISA", isa[i], 1);
        bcase tc = {.B = 1, .S = 130, .Skv = 130, .H = 2, .Hkv = 1, .D = 24,
                    .dt = all_dt[i + 1], .causal = true, .pad = 1, .tiles = "16x21"};
        run_bwd(&tc, test_seed());
        unsetenv("CPC_CPU_ISA");
    }
}

Test(attn_bwd, tiny)
{
    for (int t = 0; t < 3; t++) {
        bcase one = {.B = 1, .S = 1, .Skv = 1, .H = 1, .Hkv = 1, .D = 8, .dt = all_dt[t]};
        run_bwd(&one, test_seed());
        bcase seven = {.B = 2, .S = 7, .Skv = 7, .H = 1, .Hkv = 1, .D = 3, .dt = all_dt[t],
                       .causal = true, .extra = 1, .nblk = 3};
        run_bwd(&seven, test_seed());
    }
}

/* ---- finite differences ------------------------------------------------------------------
 *
 * L(q, k, v) = sum dout * attention(q, k, v), with a plain float64 forward
 * (scores, max-subtracted softmax, weighted sum; positions 0..S-1, causal
 * j <= i, key padding); the gradient of every input element by central
 * differences with step 1e-4 (truncation ~1e-9 relative, rounding ~1e-12). */

typedef struct fd_prob {
    int S, Skv, H, Hkv, D;
    bool causal;
    const uint8_t *mask;   /* [Skv] or NULL */
    double scale;
    double *q, *k, *v, *dout;
} fd_prob;

static double fd_loss(const fd_prob *p)
{
    const int group = p->H / p->Hkv, D = p->D;
    double L = 0.0, sc[64];
    for (int h = 0; h < p->H; h++)
        for (int i = 0; i < p->S; i++) {
            const double *qi = p->q + ((size_t)i * p->H + h) * D;
            double m = -INFINITY;
            for (int j = 0; j < p->Skv; j++) {
                sc[j] = -INFINITY;
                if ((p->causal && j > i) || (p->mask && !p->mask[j]))
                    continue;
                const double *kj = p->k + ((size_t)j * p->Hkv + h / group) * D;
                double s = 0;
                for (int e = 0; e < D; e++)
                    s += qi[e] * kj[e];
                sc[j] = s * p->scale;
                m = sc[j] > m ? sc[j] : m;
            }
            if (m == -INFINITY)
                continue;
            double l = 0;
            for (int j = 0; j < p->Skv; j++)
                l += sc[j] == -INFINITY ? 0.0 : exp(sc[j] - m);
            const double *doi = p->dout + ((size_t)i * p->H + h) * D;
            for (int j = 0; j < p->Skv; j++) {
                if (sc[j] == -INFINITY)
                    continue;
                const double *vj = p->v + ((size_t)j * p->Hkv + h / group) * D;
                double w = exp(sc[j] - m) / l, dv = 0;
                for (int e = 0; e < D; e++)
                    dv += doi[e] * vj[e];
                L += w * dv;
            }
        }
    return L;
}

static void fd_grad(fd_prob *p, double *x, size_t n, double *g)
{
    const double hstep = 1e-4;
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + hstep;
        double lp = fd_loss(p);
        x[i] = x0 - hstep;
        double lm = fd_loss(p);
        x[i] = x0;
        g[i] = (lp - lm) / (2 * hstep);
    }
}

static double rel_err(const double *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

Test(attn_bwd, finite_differences)
{
    for (int cs = 0; cs < 2; cs++) {
        uint64_t seed = test_seed();
        const int S = 6, Skv = cs ? 6 : 9, H = 4, Hkv = 2, D = 5;
        const bool causal = cs == 1;
        uint8_t mask[9] = {1, 1, 0, 1, 1, 1, 0, 1, 1};
        const size_t nq = (size_t)S * H * D, nk = (size_t)Skv * Hkv * D;
        float *qf = test_rand_tensor(CPC_DTYPE_FP32, nq, seed, 1, 1.0);
        float *kf = test_rand_tensor(CPC_DTYPE_FP32, nk, seed, 2, 1.0);
        float *vf = test_rand_tensor(CPC_DTYPE_FP32, nk, seed, 3, 1.0);
        float *df = test_rand_tensor(CPC_DTYPE_FP32, nq, seed, 5, 1.0);
        double *qd = malloc(sizeof(double) * nq), *kd = malloc(sizeof(double) * nk);
        double *vd = malloc(sizeof(double) * nk), *dd = malloc(sizeof(double) * nq);
        for (size_t i = 0; i < nq; i++) {
            qd[i] = qf[i];
            dd[i] = df[i];
        }
        for (size_t i = 0; i < nk; i++) {
            kd[i] = kf[i];
            vd[i] = vf[i];
        }
        const float scale = (float)(1.0 / sqrt((double)D));
        fd_prob fp = {S, Skv, H, Hkv, D, causal, mask, (double)scale, qd, kd, vd, dd};
        double *gq = malloc(sizeof(double) * nq), *gk = malloc(sizeof(double) * nk);
        double *gv = malloc(sizeof(double) * nk);
        fd_grad(&fp, qd, nq, gq);
        fd_grad(&fp, kd, nk, gk);
        fd_grad(&fp, vd, nk, gv);

        /* the kernel: forward for out and lse, then the backward */
        cpc_backend *be = make_backend(NULL);
        float *o = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * (size_t)S * H);
        float *delta = malloc(sizeof(float) * (size_t)S * H);
        float *dq = calloc(nq, sizeof(float)), *dk = calloc(nk, sizeof(float));
        float *dv = calloc(nk, sizeof(float));
        cpc_attn_args fa = {.p.B = 1, .p.sq = S, .p.skv = Skv, .p.hq = H, .p.hkv = Hkv, .p.d = D,
                            .p.group = H / Hkv, .p.dtype = CPC_DTYPE_FP32, .p.q = qf, .p.k = kf,
                            .p.v = vf, .o = o, .lse = lse, .p.scale = scale, .p.causal = causal,
                            .p.kv_mask = mask, .p.mask_len = Skv};
        cr_assert_null(cpc_backend_attn(be, &fa));
        cpc_attn_bwd_args ba = {.p.B = 1, .p.sq = S, .p.skv = Skv, .p.hq = H, .p.hkv = Hkv, .p.d = D,
                                .p.group = H / Hkv, .p.dtype = CPC_DTYPE_FP32, .p.q = qf, .p.k = kf,
                                .p.v = vf, .dout = df, .out = o, .out_dtype = CPC_DTYPE_FP32,
                                .lse = lse, .delta = delta, .compute_delta = true, .dq = dq,
                                .dk = dk, .dv = dv, .p.scale = scale, .p.causal = causal,
                                .p.kv_mask = mask, .p.mask_len = Skv};
        cr_assert_null(cpc_backend_attn_bwd(be, &ba));
        cpc_backend_destroy(be);
        /* the reference, too */
        double *rq = malloc(sizeof(double) * nq), *rk = malloc(sizeof(double) * nk);
        double *rv = malloc(sizeof(double) * nk);
        uint8_t rmask[9];
        memcpy(rmask, mask, sizeof rmask);
        cpc_ref_problem p = {.B = 1, .S = S, .Skv = Skv, .H = H, .Hkv = Hkv, .D = D,
                             .dtype = CPC_DTYPE_FP32, .q = qf, .k = kf, .v = vf,
                             .scale = scale, .causal = causal, .kv_mask = rmask};
        cr_assert_null(cpc_reference_attention_bwd(&p, df, rq, rk, rv));
        double *kq = malloc(sizeof(double) * nq), *kk = malloc(sizeof(double) * nk);
        double *kv = malloc(sizeof(double) * nk);
        for (size_t i = 0; i < nq; i++)
            kq[i] = dq[i];
        for (size_t i = 0; i < nk; i++) {
            kk[i] = dk[i];
            kv[i] = dv[i];
        }
        double e[6] = {rel_err(kq, gq, nq), rel_err(kk, gk, nk), rel_err(kv, gv, nk),
                       rel_err(rq, gq, nq), rel_err(rk, gk, nk), rel_err(rv, gv, nk)};
        fprintf(stderr,
                "finite differences (%s): kernel dq %.2e dk %.2e dv %.2e, reference dq %.2e "
                "dk %.2e dv %.2e (seed %llu)\n",
                causal ? "causal, padded" : "cross, padded", e[0], e[1], e[2], e[3], e[4],
                e[5], (unsigned long long)seed);
        for (int i = 0; i < 3; i++) {
            cr_assert(e[i] <= 1e-5, "kernel vs finite differences: rel err %.3e (seed %llu)",
                      e[i], (unsigned long long)seed);
            cr_assert(e[3 + i] <= 1e-7,
                      "reference vs finite differences: rel err %.3e (seed %llu)", e[3 + i],
                      (unsigned long long)seed);
        }
        free(qf);
        free(kf);
        free(vf);
        free(df);
        free(qd);
        free(kd);
        free(vd);
        free(dd);
        free(gq);
        free(gk);
        free(gv);
        free(o);
        free(lse);
        free(delta);
        free(dq);
        free(dk);
        free(dv);
        free(rq);
        free(rk);
        free(rv);
        free(kq);
        free(kk);
        free(kv);
    }
}

/* ---- refused arguments --------------------------------------------------------------------- */

Test(attn_bwd, refused_arguments)
{
    cpc_backend *be = make_backend(NULL);
    float q[2 * 4] = {0}, k[2 * 4] = {0}, v[2 * 4] = {0}, dout[2 * 4] = {0}, o[2 * 4] = {0};
    float lse[2] = {0}, delta[2] = {0}, dq[8] = {0}, dk[8] = {0}, dv[8] = {0};
    cpc_attn_bwd_args good = {.p.B = 1, .p.sq = 2, .p.skv = 2, .p.hq = 1, .p.hkv = 1, .p.d = 4,
                              .p.group = 1, .p.dtype = CPC_DTYPE_FP32, .p.q = q, .p.k = k, .p.v = v,
                              .dout = dout, .out = o, .out_dtype = CPC_DTYPE_FP32, .lse = lse,
                              .delta = delta, .compute_delta = true, .dq = dq, .dk = dk,
                              .dv = dv, .p.scale = 0.5f};
    cpc_status *st = cpc_backend_attn_bwd(be, &good);
    cr_assert_null(st);
    cpc_attn_bwd_args a = good;
    a.dq = NULL;
    st = cpc_backend_attn_bwd(be, &a);
    cr_assert_not_null(st, "NULL dq refused");
    cr_assert_eq(cpc_status_code(st), CPC_E_INTERNAL);
    cpc_status_free(st);
    a = good;
    a.out = NULL;
    st = cpc_backend_attn_bwd(be, &a);
    cr_assert_not_null(st, "compute_delta without out refused");
    cpc_status_free(st);
    a = good;
    a.p.hq = 2;
    a.p.group = 1;
    st = cpc_backend_attn_bwd(be, &a);
    cr_assert_not_null(st, "query heads needing a K/V head the block lacks refused");
    cpc_status_free(st);
    a = good;
    cpc_run r = {0, 3};
    a.p.q_runs = &r;
    a.p.n_q_runs = 1;
    st = cpc_backend_attn_bwd(be, &a);
    cr_assert_not_null(st, "runs that do not cover the rows refused");
    cpc_status_free(st);
    a = good;
    a.p.B = 2;
    a.p.q_bstride = a.dout_bstride = a.out_bstride = a.p.kv_bstride = 8;
    a.dkv_bstride = 4; /* smaller than a batch's 2 x 4 */
    st = cpc_backend_attn_bwd(be, &a);
    cr_assert_not_null(st, "a gradient batch stride smaller than the block refused");
    cpc_status_free(st);
    a = good;
    a.p.dtype = (cpc_dtype)99;
    st = cpc_backend_attn_bwd(be, &a);
    cr_assert_not_null(st, "unknown dtype refused");
    cpc_status_free(st);
    st = cpc_backend_attn_bwd(be, NULL);
    cr_assert_not_null(st, "NULL arguments refused");
    cpc_status_free(st);
    /* no key: delta still written, gradients unchanged */
    a = good;
    a.p.skv = 0;
    delta[0] = delta[1] = NAN;
    st = cpc_backend_attn_bwd(be, &a);
    cr_assert_null(st);
    cr_assert(delta[0] == 0.0f && delta[1] == 0.0f);
    cpc_backend_destroy(be);
}
