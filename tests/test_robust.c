/*
 * test_robust.c - issue 23 (robustness round three) at the unit level:
 *   kernels/  the CPU forward with finite v near FLT_MAX (P V accumulated
 *             scaled: exact 3e38 out of uniform scores, fp32 and bf16, every
 *             ISA the machine has) and the LSE merge with |LSE| ~ 1e5 against
 *             the float64 merge of the same (rounded) operands;
 *   verdict/  cpc_run_report_failure quotes the backward's figures when only
 *             the backward check failed, and says "non-finite" for NaN
 *             gradients.
 * Inputs are fresh random values every run (seed from the clock, printed on
 * failure; CPC_TEST_SEED=N replays).
 */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpc/session.h"
#include "dtype.h"
#include "report.h"

static unsigned long long seed_now(void)
{
    const char *e = getenv("CPC_TEST_SEED");
    return e ? strtoull(e, NULL, 10) : (unsigned long long)time(NULL);
}

static uint64_t rng_state;
static double urand(void) /* [0, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) * 0x1p-53;
}

/* One attention call on the CPU backend (ISA from CPC_CPU_ISA at creation). */
static void run_attn(const char *isa, cpc_dtype dt, const void *q, const void *k, const void *v, int sq,
                     int skv, int d, float *o, float *lse)
{
    if (isa)
        setenv("CPC_CPU_ISA", isa, 1);
    else
        unsetenv("CPC_CPU_ISA");
    cpc_backend *be = NULL;
    cr_assert_null(cpc_cpu_backend_create(&be));
    cpc_attn_args a = {.p.B = 1, .p.sq = sq, .p.skv = skv, .p.hq = 1, .p.hkv = 1, .p.d = d, .p.group = 1,
                       .p.dtype = dt, .p.q = q, .p.k = k, .p.v = v, .o = o, .lse = lse,
                       .p.scale = 1.0f / sqrtf((float)d)};
    cpc_status *st = cpc_backend_attn(be, &a);
    cr_assert_null(st, "%s", st ? st->message : "");
    cpc_backend_destroy(be);
    unsetenv("CPC_CPU_ISA");
}

Test(kernels, v_near_flt_max)
{
    unsigned long long seed = seed_now();
    rng_state = seed;
    enum { SQ = 8, SKV = 1500, D = 16 };
    static float q[SQ * D], k[SKV * D], v[SKV * D], o[SQ * D], lse[SQ];
    static uint16_t q16[SQ * D], k16[SKV * D], v16[SKV * D];
    const char *isas[] = {NULL, "avx2", "scalar"};
    for (int dti = 0; dti < 2; dti++) {
        cpc_dtype dt = dti ? CPC_DTYPE_BF16 : CPC_DTYPE_FP32;
        /* uniform scores (q = 0): the output is the mean of v, per column;
         * column e holds +-c_e with c_e near FLT_MAX, signs chosen so that
         * the mean is a known finite value */
        for (int i = 0; i < SQ * D; i++)
            q[i] = 0.0f;
        for (int i = 0; i < SKV * D; i++)
            k[i] = (float)(urand() * 2 - 1);
        double want[D];
        for (int e = 0; e < D; e++) {
            float c = (float)(1e38 + urand() * 2e38);
            if (dt == CPC_DTYPE_BF16)
                c = cpc_bf16_to_f32(cpc_f32_to_bf16(c));
            double sum = 0;
            for (int j = 0; j < SKV; j++) {
                float x = (e % 2 == 0 || j % 3 != 0) ? c : -c;
                v[j * D + e] = x;
                sum += x;
            }
            want[e] = sum / SKV;
        }
        const void *qp = q, *kp = k, *vp = v;
        if (dt == CPC_DTYPE_BF16) {
            cpc_from_f32_n(q16, dt, q, SQ * D);
            cpc_from_f32_n(k16, dt, k, SKV * D);
            cpc_from_f32_n(v16, dt, v, SKV * D);
            qp = q16, kp = k16, vp = v16;
        }
        for (int ii = 0; ii < 3; ii++) {
            run_attn(isas[ii], dt, qp, kp, vp, SQ, SKV, D, o, lse);
            for (int r = 0; r < SQ; r++)
                for (int e = 0; e < D; e++) {
                    double got = o[r * D + e];
                    cr_assert(isfinite(got) && fabs(got - want[e]) <= 1e-5 * fabs(want[e]),
                              "%s %s row %d col %d: %g, want %g (seed %llu)", dti ? "bf16" : "fp32",
                              isas[ii] ? isas[ii] : "auto", r, e, got, want[e], seed);
                }
        }
    }
    /* ordinary values are not scaled: the same call is bit-identical to one
     * with v / 2^100 times 2^100 (a power of two changes no rounding) */
    for (int i = 0; i < SKV * D; i++)
        v[i] = (float)(urand() * 2 - 1);
    for (int i = 0; i < SQ * D; i++)
        q[i] = (float)(urand() * 4 - 2);
    static float o2[SQ * D], v2[SKV * D];
    run_attn(NULL, CPC_DTYPE_FP32, q, k, v, SQ, SKV, D, o, lse);
    for (int i = 0; i < SKV * D; i++)
        v2[i] = ldexpf(v[i], 100);
    run_attn(NULL, CPC_DTYPE_FP32, q, k, v2, SQ, SKV, D, o2, lse);
    for (int i = 0; i < SQ * D; i++)
        cr_assert_eq(ldexpf(o[i], 100), o2[i], "element %d (seed %llu)", i, seed);
}

Test(kernels, merge_keeps_the_digits)
{
    unsigned long long seed = seed_now();
    rng_state = seed ^ 0x9e3779b97f4a7c15ULL;
    enum { S = 64, H = 2, D = 8 };
    static float acc[S * H * D], accl[H * S], o[S * H * D], l[H * S], a0[S * H * D], al0[H * S];
    for (int i = 0; i < S * H * D; i++) {
        acc[i] = (float)(urand() * 2 - 1);
        o[i] = (float)(urand() * 2 - 1);
    }
    for (int i = 0; i < H * S; i++) {
        accl[i] = (float)(1e5 * (urand() + 0.5) * (urand() < 0.5 ? -1 : 1));
        l[i] = accl[i] + (float)(urand() * 4 - 2); /* competing blocks */
    }
    memcpy(a0, acc, sizeof acc);
    memcpy(al0, accl, sizeof accl);
    cpc_backend *be = NULL;
    cr_assert_null(cpc_cpu_backend_create(&be));
    cpc_merge_args m = {.B = 1, .s = S, .h = H, .d = D, .acc = acc, .acc_lse = accl, .o = o, .lse = l};
    cr_assert_null(cpc_backend_merge(be, &m));
    cpc_backend_destroy(be);
    double num = 0, den = 0;
    for (int i = 0; i < S; i++)
        for (int h = 0; h < H; h++) {
            int li = h * S + i;
            double la = al0[li], lb = l[li], mx = la > lb ? la : lb;
            double wa = exp(la - mx), wb = exp(lb - mx), z = wa + wb;
            double lnew = mx + log(z);
            cr_assert(fabs(accl[li] - lnew) <= 1.0 * (double)nextafterf((float)fabs(lnew), INFINITY) - fabs((float)lnew) + 1e-12,
                      "lse row %d head %d: %.9g, want %.9g (seed %llu)", i, h, accl[li], lnew, seed);
            for (int e = 0; e < D; e++) {
                int oi = (i * H + h) * D + e;
                double want = (wa * a0[oi] + wb * o[oi]) / z;
                num += (acc[oi] - want) * (acc[oi] - want);
                den += want * want;
            }
        }
    double rel = sqrt(num / den);
    /* the old merge (weights e^(l - lnew) with lnew rounded in fp32) gave ~1e-3 here */
    cr_assert(rel < 1e-6, "merged rel_err %.3e (seed %llu)", rel, seed);
}

Test(verdict, backward_only)
{
    cpc_run_report r;
    memset(&r, 0, sizeof r);
    snprintf(r.dtype, sizeof r.dtype, "fp32");
    r.checked = r.pass = true;
    r.rel_err = 3e-7;
    r.tolerance = 1e-5;
    r.bwd_checked = true;
    r.bwd_pass = false;
    r.bwd_rel_err[0] = 2e-4;
    r.bwd_rel_err[1] = 3e-6;
    r.bwd_rel_err[2] = 4e-6;
    r.bwd_tolerance = 1e-5;
    char *why = cpc_run_report_failure(&r);
    cr_assert(why && strstr(why, "backward relative error dq 2.000e-04, dk 3.000e-06, dv 4.000e-06") &&
                  strstr(why, "1.00e-05") && !strstr(why, "3.000e-07"),
              "%s", why ? why : "(null)");
    free(why);
    r.bwd_n_nan[1] = 12;
    r.bwd_n_inf[2] = 3;
    why = cpc_run_report_failure(&r);
    cr_assert(why && strstr(why, "non-finite") && strstr(why, "dk 12/0") && strstr(why, "dv 0/3"), "%s",
              why ? why : "(null)");
    free(why);
    /* the forward failing too: the forward's figure comes first */
    r.pass = false;
    r.rel_err = 5e-3;
    why = cpc_run_report_failure(&r);
    cr_assert(why && strstr(why, "relative error 5.000e-03"), "%s", why ? why : "(null)");
    free(why);
}
