/*
 * test_backend_cpu.c - the CPU backend through the backend conformance suite
 * (tests/backend_conformance.h: the attention contract's case matrix, merge,
 * init_acc, convert, copy_strided, memory and the refused arguments, against
 * the float64 reference), under its other tile sizes and ISAs too; plus what
 * is not about the backend contract: the fp32 <-> bf16/fp16 conversions and
 * the reference/compare functions themselves.
 *
 * Inputs are fresh random normals every run: the seed comes from the clock
 * and every failure message prints it; CPC_TEST_SEED=N replays it,
 * CPC_BC_ONLY=NAME runs only the cases whose name starts with NAME, and
 * CPC_TEST_VERBOSE=1 prints one line per case (errors, time).
 * Inputs are rounded to the dtype first and the reference reads the same
 * rounded values, so the error measured is the backend's alone: it computes
 * in fp32, hence every dtype must reach rel err <= 1e-5 (stricter than the
 * SPEC tolerances fp32 1e-5 / fp16 2e-3 / bf16 1e-2).
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
#include "backend_conformance.h"
#include "dtype.h"
#include "reference.h"
#include "test_random.h"

/* ---- the backend under test ----------------------------------------------------------- */

static cpc_status *cpu_create(void *ctx, const cpc_kernel_spec *spec, cpc_backend **out)
{
    (void)ctx;
    (void)spec; /* the CPU backend serves every dtype, head_dim, mask and group */
    return cpc_cpu_backend_create(out);
}

static const cpc_bc_backend CPU = {.name = "cpu", .create = cpu_create};

/* Runs the conformance suite on the CPU backend; `only` selects cases by name
 * prefix (NULL: all), `dtypes` restricts their dtypes (0: all). */
static void conformance(unsigned checks, const char *only, unsigned dtypes)
{
    cpc_cpu_backend_single_thread_blas();
    cpc_bc_opts o = {.checks = checks, .only = only, .dtypes = dtypes,
                     /* fp32 compute on rounded inputs: 1e-5 for every dtype */
                     .out_tol = 1e-5, .lse_tol = 1e-5,
                     .log = getenv("CPC_TEST_VERBOSE") ? stderr : NULL};
    cpc_bc_report rep;
    cpc_status *st = cpc_backend_conformance(&CPU, &o, &rep);
    if (st)
        cpc_status_print(st, stderr, "test_backend_cpu");
    cr_assert_null(st, "%d conformance failures (seed %llu; CPC_TEST_SEED=%llu replays)",
                   cpc_status_count(st, CPC_SEV_ERROR), (unsigned long long)rep.seed,
                   (unsigned long long)rep.seed);
    cr_assert_gt(rep.cases_run + rep.checks_run, 0, "no case ran (only=%s)", only ? only : "");
    cr_assert_eq(rep.cases_skipped, 0);
}

#define F32 (1u << CPC_DTYPE_FP32)
#define BF16 (1u << CPC_DTYPE_BF16)
#define FP16 (1u << CPC_DTYPE_FP16)

/* ---- the conformance suite ------------------------------------------------------------ */

Test(conformance, attention_case_matrix, .timeout = 900)
{
    conformance(CPC_BC_ATTN, NULL, 0);
}

Test(conformance, methods_and_refused_arguments)
{
    conformance(CPC_BC_ALL & ~(CPC_BC_ATTN | CPC_BC_BWD), NULL, 0);
}

/* attn_bwd on the backward case matrix (the same one the CUDA backend runs
 * on the emulator), at 1e-5 (fp32 compute on rounded inputs). */
Test(conformance, backward_case_matrix, .timeout = 900)
{
    conformance(CPC_BC_BWD, NULL, 0);
}

/* The full causal block under other tile sizes (diagonal tiles with increasing
 * positions, skipped tiles above the diagonal, odd tiles), one dtype each. */
Test(conformance, other_tile_sizes)
{
    setenv("CPC_CPU_ATTN_TILES", "7x13", 1);
    conformance(CPC_BC_ATTN, "causal_full_1100", BF16);
    setenv("CPC_CPU_ATTN_TILES", "64x32", 1);
    conformance(CPC_BC_ATTN, "causal_full_1100", FP16);
    setenv("CPC_CPU_ATTN_TILES", "1x1", 1);
    conformance(CPC_BC_ATTN, "causal_full_40", F32);
    unsetenv("CPC_CPU_ATTN_TILES");
}

/* The AVX2 and scalar paths (the default is the best the machine has). */
Test(conformance, other_isas)
{
    const char *isas[] = {"avx2", "scalar"};
    const unsigned dts[] = {BF16, FP16};
    for (int i = 0; i < 2; i++) {
        setenv("CPC_CPU_ISA", isas[i], 1);
        setenv("CPC_CPU_ATTN_TILES", "64x96", 1);
        conformance(CPC_BC_ATTN, "causal_keypad_cross_isa", dts[i]);
        unsetenv("CPC_CPU_ATTN_TILES");
        conformance(CPC_BC_ATTN, "logits_spread_10_fp32", F32);
        conformance(CPC_BC_ATTN, "nan_in_q", 0);
        conformance(CPC_BC_ATTN, "small_", 0);
    }
    unsetenv("CPC_CPU_ISA");
}

/* ---- CPU specifics beyond the contract ------------------------------------------------- */

Test(backend, cpu_name_and_alignment)
{
    cpc_backend *be = NULL;
    cr_assert_null(cpc_cpu_backend_create(&be));
    cr_assert_str_eq(be->vt->name, "cpu");
    void *p = NULL;
    cr_assert_null(cpc_backend_alloc(be, 1000, &p));
    cr_assert_eq((uintptr_t)p % 64, 0, "CPU buffers are 64-byte aligned");
    cpc_backend_free(be, p);
    cpc_backend_destroy(be);
}

/* ---- dtype conversions ---------------------------------------------------------------- */

static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t ubits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Independent decoders (no shared code with dtype.c). */
static double fp16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double bf16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
    return s ? -v : v;
}

Test(dtype, known_values)
{
    cr_assert_eq(cpc_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(cpc_f32_to_bf16(-2.5f), 0xc020);
    cr_assert_eq(cpc_f32_to_fp16(1.0f), 0x3c00);
    cr_assert_eq(cpc_f32_to_fp16(-2.5f), 0xc100);
    cr_assert_eq(cpc_f32_to_fp16(65504.0f), 0x7bff);
    cr_assert(cpc_fp16_to_f32(0x7bff) == 65504.0f);
    cr_assert_eq(cpc_f32_to_fp16(65519.0f), 0x7bff);  /* below the midpoint */
    cr_assert_eq(cpc_f32_to_fp16(65520.0f), 0x7c00);  /* tie to even -> inf */
    cr_assert_eq(cpc_f32_to_fp16(1e6f), 0x7c00);
    cr_assert_eq(cpc_f32_to_fp16(-INFINITY), 0xfc00);
    cr_assert_eq(cpc_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(cpc_f32_to_bf16(3.4e38f), 0x7f80);   /* rounds over the max */
    /* fp16 subnormals */
    cr_assert_eq(cpc_f32_to_fp16(0x1p-24f), 0x0001);
    cr_assert_eq(cpc_f32_to_fp16(0x1p-25f), 0x0000);  /* tie -> even (0) */
    cr_assert_eq(cpc_f32_to_fp16(0x3p-25f), 0x0002);  /* tie -> even (2) */
    cr_assert_eq(cpc_f32_to_fp16(0x1.000002p-25f), 0x0001);
    cr_assert_eq(cpc_f32_to_fp16(-0x1p-14f), 0x8400);
    cr_assert_eq(cpc_f32_to_fp16(0x1.ff8p-15f), 0x03ff);  /* largest subnormal */
    cr_assert_eq(cpc_f32_to_fp16(0x1.ffcp-15f), 0x0400);  /* tie -> even: min normal */
    cr_assert_eq(cpc_f32_to_fp16(0x1.ff4p-15f), 0x03fe);  /* tie (1022.5) -> even (1022) */
    cr_assert(cpc_fp16_to_f32(0x0001) == 0x1p-24f);
    cr_assert(cpc_fp16_to_f32(0x03ff) == 0x1.ff8p-15f);
    cr_assert_eq(ubits(cpc_fp16_to_f32(0x8000)), 0x80000000u);
    /* bf16 subnormals (fp32 subnormals) */
    cr_assert_eq(cpc_f32_to_bf16(fbits(0x00010000u)), 0x0001);
    cr_assert_eq(cpc_f32_to_bf16(fbits(0x00008000u)), 0x0000);  /* tie -> even */
    cr_assert_eq(cpc_f32_to_bf16(fbits(0x00018000u)), 0x0002);  /* tie -> even */
    cr_assert(cpc_bf16_to_f32(0x0001) == fbits(0x00010000u));
    /* ties to even in the normal range */
    cr_assert_eq(cpc_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    cr_assert_eq(cpc_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
    cr_assert_eq(cpc_f32_to_bf16(1.0f + 0x1.2p-8f), 0x3f81);
    cr_assert_eq(cpc_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    cr_assert_eq(cpc_f32_to_fp16(1.0f + 0x3p-11f), 0x3c02);
    /* NaN stays NaN (quiet), sign kept */
    cr_assert(isnan(cpc_bf16_to_f32(cpc_f32_to_bf16(NAN))));
    cr_assert(isnan(cpc_fp16_to_f32(cpc_f32_to_fp16(NAN))));
    uint16_t snan_b = cpc_f32_to_bf16(fbits(0xff800001u)); /* payload only in low bits */
    cr_assert((snan_b & 0x7fff) > 0x7f80 && (snan_b & 0x8000));
    uint16_t snan_h = cpc_f32_to_fp16(fbits(0x7f800001u));
    cr_assert((snan_h & 0x7fff) > 0x7c00);
    cr_assert(isnan(cpc_fp16_to_f32(0x7c01)) && isnan(cpc_bf16_to_f32(0x7f81)));
}

Test(dtype, exhaustive_16bit_round_trips)
{
    for (uint32_t u = 0; u < 65536; u++) {
        uint16_t h = (uint16_t)u;
        double vh = fp16_value(h), vb = bf16_value(h);
        float fh = cpc_fp16_to_f32(h), fb = cpc_bf16_to_f32(h);
        if (isnan(vh))
            cr_assert(isnan(fh) && isnan(fp16_value(cpc_f32_to_fp16(fh))), "fp16 %04x", u);
        else {
            cr_assert((double)fh == vh && !!signbit(fh) == !!signbit(vh), "fp16 %04x", u);
            cr_assert_eq(cpc_f32_to_fp16(fh), h, "fp16 round trip %04x", u);
        }
        if (isnan(vb))
            cr_assert(isnan(fb) && isnan(bf16_value(cpc_f32_to_bf16(fb))), "bf16 %04x", u);
        else {
            cr_assert((double)fb == vb && !!signbit(fb) == !!signbit(vb), "bf16 %04x", u);
            cr_assert_eq(cpc_f32_to_bf16(fb), h, "bf16 round trip %04x", u);
        }
    }
}

/* r must be the nearest 16-bit value to x, ties to an even mantissa. */
static void check_nearest(float x, uint16_t r, double (*val)(uint16_t), uint16_t inf_bits,
                          double max_finite, double half_ulp_max, uint64_t seed)
{
    double xv = (double)x, rv = val(r);
    if (fabs(xv) >= max_finite + half_ulp_max) {
        cr_assert_eq(r & 0x7fff, inf_bits, "%a must overflow (seed %llu)", xv,
                     (unsigned long long)seed);
        return;
    }
    cr_assert(!isinf(rv), "%a rounded to inf (seed %llu)", xv, (unsigned long long)seed);
    uint16_t mag = r & 0x7fff, sign = r & 0x8000;
    double err = fabs(xv - rv);
    for (int dlt = -1; dlt <= 1; dlt += 2) {
        int nm = (int)mag + dlt;
        if (nm < 0 || nm >= inf_bits)
            continue;
        double nv = val((uint16_t)(sign | nm));
        double ne = fabs(xv - nv);
        cr_assert(err <= ne, "%a -> %04x is not nearest (seed %llu)", xv, r,
                  (unsigned long long)seed);
        if (err == ne)
            cr_assert((mag & 1) == 0, "%a -> %04x: tie not to even (seed %llu)", xv, r,
                      (unsigned long long)seed);
    }
}

Test(dtype, rounding_is_nearest_even_and_bulk_matches_scalar)
{
    uint64_t seed = test_seed();
    enum { N = 200003 };
    float *x = malloc(sizeof(float) * N), *wide = malloc(sizeof(float) * N);
    uint16_t *hb = malloc(2 * N), *hh = malloc(2 * N);
    for (int i = 0; i < N; i++) {
        uint32_t u = test_bits_at(seed, 8, (uint64_t)i);
        switch (i % 4) {
        case 0: /* any bit pattern: NaN, inf, subnormal fp32 */
            x[i] = fbits(u);
            break;
        case 1: /* fp16 range, including its subnormals: exponents 2^-26 .. 2^17 */
            x[i] = fbits((u & 0x807fffffu) | ((uint32_t)(101 + (u >> 8) % 43) << 23));
            break;
        case 2: /* exact ties for fp16/bf16: few low mantissa bits */
            x[i] = fbits(u & 0xfffff000u);
            break;
        default:
            x[i] = (float)test_normal_at(seed, 9, (uint64_t)i);
        }
    }
    cpc_f32_to_bf16_n(hb, x, N);
    cpc_f32_to_fp16_n(hh, x, N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(hb[i], cpc_f32_to_bf16(x[i]), "bulk bf16 %08x (seed %llu)", ubits(x[i]),
                     (unsigned long long)seed);
        cr_assert_eq(hh[i], cpc_f32_to_fp16(x[i]), "bulk fp16 %08x (seed %llu)", ubits(x[i]),
                     (unsigned long long)seed);
        if (isnan(x[i])) {
            cr_assert(isnan(bf16_value(hb[i])) && isnan(fp16_value(hh[i])));
            continue;
        }
        check_nearest(x[i], hb[i], bf16_value, 0x7f80, 0x1.fep127, 0x1p119, seed);
        check_nearest(x[i], hh[i], fp16_value, 0x7c00, 65504.0, 16.0, seed);
    }
    /* widening, bulk vs scalar, odd lengths */
    for (int i = 0; i < N; i++)
        hb[i] = (uint16_t)test_bits_at(seed, 10, (uint64_t)i);
    for (int len = 1; len < 40; len += 3) {
        cpc_bf16_to_f32_n(wide, hb, (size_t)len);
        for (int i = 0; i < len; i++) {
            float s = cpc_bf16_to_f32(hb[i]);
            cr_assert(ubits(wide[i]) == ubits(s));
        }
    }
    cpc_bf16_to_f32_n(wide, hb, N);
    for (int i = 0; i < N; i++)
        cr_assert(ubits(wide[i]) == ubits(cpc_bf16_to_f32(hb[i])), "bf16 widen %04x", hb[i]);
    cpc_fp16_to_f32_n(wide, hb, N);
    for (int i = 0; i < N; i++)
        cr_assert(ubits(wide[i]) == ubits(cpc_fp16_to_f32(hb[i])), "fp16 widen %04x", hb[i]);
    /* scaled widening is one fp32 multiply */
    cpc_to_f32_scaled_n(wide, hb, CPC_DTYPE_FP16, N, 0.37f);
    for (int i = 0; i < N; i++) {
        float s = cpc_fp16_to_f32(hb[i]) * 0.37f;
        cr_assert(ubits(wide[i]) == ubits(s) || (isnan(s) && isnan(wide[i])));
    }
    free(x);
    free(wide);
    free(hb);
    free(hh);
}

/* ---- the reference and the comparison themselves --------------------------------------- */

Test(reference, hand_computed)
{
    /* B=1, S=2, Skv=2, H=1, D=2, causal: row 0 sees key 0 only (out = v0,
     * lse = score); row 1 sees both */
    float q[4] = {1, 2, 0.5f, -1}, k[4] = {0.25f, 1, 2, -3}, v[4] = {3, 4, -5, 6};
    cpc_ref_problem p = {.B = 1, .S = 2, .Skv = 2, .H = 1, .Hkv = 1, .D = 2,
                         .dtype = CPC_DTYPE_FP32, .q = q, .k = k, .v = v, .scale = 0.5,
                         .causal = true};
    double out[4], lse[2];
    cr_assert_null(cpc_reference_attention(&p, NULL, -1, out, lse));
    cr_assert_float_eq(lse[0], 0.5 * (0.25 + 2), 1e-15);
    cr_assert(out[0] == 3 && out[1] == 4);
    double s0 = 0.5 * (0.5 * 0.25 - 1), s1 = 0.5 * (0.5 * 2 + 3);
    double L = log(exp(s0) + exp(s1));
    cr_assert_float_eq(lse[1], L, 1e-14);
    cr_assert_float_eq(out[2], (exp(s0) * 3 + exp(s1) * -5) / exp(L), 1e-14);
    cr_assert_float_eq(out[3], (exp(s0) * 4 + exp(s1) * 6) / exp(L), 1e-14);
    /* masking key 0 makes row 0 empty */
    uint8_t mk[2] = {0, 1};
    p.kv_mask = mk;
    cr_assert_null(cpc_reference_attention(&p, NULL, -1, out, lse));
    cr_assert(lse[0] == -INFINITY && out[0] == 0 && out[1] == 0);
    cr_assert_float_eq(lse[1], s1, 1e-15);
    cr_assert(out[2] == -5 && out[3] == 6);
    /* errors are statuses */
    p.Hkv = 3;
    cpc_status *st = cpc_reference_attention(&p, NULL, -1, out, lse);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cpc_status_free(st);
}

Test(reference, rows_match_all_rows_and_sampling)
{
    uint64_t seed = test_seed();
    const int B = 2, H = 6, Hkv = 3, D = 16;
    const int64_t S = 40;
    void *q = test_rand_tensor(CPC_DTYPE_BF16, (size_t)B * S * H * D, seed, 1, 1);
    void *k = test_rand_tensor(CPC_DTYPE_BF16, (size_t)B * S * Hkv * D, seed, 2, 1);
    void *v = test_rand_tensor(CPC_DTYPE_BF16, (size_t)B * S * Hkv * D, seed, 3, 1);
    cpc_ref_problem p = {.B = B, .S = S, .Skv = S, .H = H, .Hkv = Hkv, .D = D,
                         .dtype = CPC_DTYPE_BF16, .q = q, .k = k, .v = v, .scale = 0.25,
                         .causal = true};
    double *out = malloc(sizeof(double) * B * S * H * D), *lse = malloc(sizeof(double) * B * H * S);
    cr_assert_null(cpc_reference_attention(&p, NULL, -1, out, lse));
    cpc_ref_row rows[2 * 6 * 9];
    int64_t n = cpc_reference_sample_rows(B, H, S, 9, seed, rows);
    cr_assert_eq(n, B * H * 9);
    for (int64_t i = 0; i < n; i++) {
        if (i % 9 == 0)
            cr_assert_eq(rows[i].s, 0);
        else {
            cr_assert_gt(rows[i].s, rows[i - 1].s, "sample rows sorted and distinct");
            if (i % 9 == 8)
                cr_assert_eq(rows[i].s, S - 1);
        }
    }
    /* reversed order, to exercise the grouping */
    cpc_ref_row rev[2 * 6 * 9];
    for (int64_t i = 0; i < n; i++)
        rev[i] = rows[n - 1 - i];
    double ro[2 * 6 * 9 * 16], rl[2 * 6 * 9];
    cr_assert_null(cpc_reference_attention(&p, rev, n, ro, rl));
    double go[2 * 6 * 9 * 16], gl[2 * 6 * 9];
    float *lsef = malloc(sizeof(float) * B * H * S);
    float *outf = malloc(sizeof(float) * B * S * H * D);
    for (int64_t i = 0; i < (int64_t)B * S * H * D; i++)
        outf[i] = (float)out[i];
    cr_assert_null(cpc_reference_gather_out(outf, CPC_DTYPE_FP32, B, S, H, D, rev, n, go));
    for (int64_t i = 0; i < n * D; i++)
        cr_assert(go[i] == (double)(float)ro[i]);
    free(outf);
    for (int64_t i = 0; i < n; i++) {
        const cpc_ref_row *r = &rev[i];
        for (int e = 0; e < D; e++)
            cr_assert(ro[i * D + e] == out[(((size_t)r->b * S + r->s) * H + r->h) * D + e]);
        cr_assert(rl[i] == lse[((size_t)r->b * H + r->h) * S + r->s]);
    }
    for (int64_t i = 0; i < B * H * S; i++)
        lsef[i] = (float)lse[i];
    cr_assert_null(cpc_reference_gather_lse(lsef, B, H, S, rev, n, gl));
    for (int64_t i = 0; i < n; i++)
        cr_assert_float_eq(gl[i], rl[i], 1e-5 * fabs(rl[i]) + 1e-6);
    cpc_ref_row bad = {0, H, 0};
    cpc_status *st = cpc_reference_attention(&p, &bad, 1, ro, rl);
    cr_assert_not_null(st);
    cpc_status_free(st);
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    free(lsef);
}

Test(reference, compare_detects_nan_inf_and_error)
{
    double ref[4] = {1, -2, 3, -INFINITY};
    float good[4] = {1, -2, 3, -INFINITY};
    cpc_compare_result r;
    cpc_compare(good, CPC_DTYPE_FP32, ref, 4, 1e-5, &r);
    cr_assert(r.pass && r.rel_err == 0 && r.n_nan == 0 && r.n_inf == 0 && r.first_bad == -1);
    float off[4] = {1.1f, -2, 3, -INFINITY};
    cpc_compare(off, CPC_DTYPE_FP32, ref, 4, 1e-5, &r);
    cr_assert(!r.pass);
    cr_assert_float_eq(r.rel_err, (double)(1.1f - 1.0f) / sqrt(14.0), 1e-12);
    cr_assert_float_eq(r.max_abs_err, (double)(1.1f - 1.0f), 1e-12);
    cpc_compare(off, CPC_DTYPE_FP32, ref, 4, 0.1, &r);
    cr_assert(r.pass);
    float nanv[4] = {1, NAN, 3, -INFINITY};
    cpc_compare(nanv, CPC_DTYPE_FP32, ref, 4, 1.0, &r);
    cr_assert(!r.pass && r.n_nan == 1 && r.first_bad == 1);
    float infv[4] = {1, -2, INFINITY, -INFINITY};
    cpc_compare(infv, CPC_DTYPE_FP32, ref, 4, 1.0, &r);
    cr_assert(!r.pass && r.n_inf == 1 && r.first_bad == 2);
    float fin[4] = {1, -2, 3, -1e30f}; /* ref -inf, got finite */
    cpc_compare(fin, CPC_DTYPE_FP32, ref, 4, 1.0, &r);
    cr_assert(!r.pass && r.n_inf == 1 && r.first_bad == 3);
    /* bf16 storage compared after exact widening */
    uint16_t hb[3] = {cpc_f32_to_bf16(1.0f), cpc_f32_to_bf16(-2.0f), cpc_f32_to_bf16(3.0f)};
    cpc_compare(hb, CPC_DTYPE_BF16, ref, 3, 1e-12, &r);
    cr_assert(r.pass && r.rel_err == 0);
    cr_assert_float_eq(cpc_check_tolerance(CPC_DTYPE_FP32), 1e-5, 0);
    cr_assert_float_eq(cpc_check_tolerance(CPC_DTYPE_FP16), 2e-3, 0);
    cr_assert_float_eq(cpc_check_tolerance(CPC_DTYPE_BF16), 1e-2, 0);
}

/* add_strided (the fp32 accumulate of the reducing all-to-all, reduce_scatter
 * and all_reduce): a head sub-range of a [B, T, h, D] destination += a dense
 * source, fresh random values, against the sum in double; elements outside
 * the range are untouched, zero sizes are no-ops, NULL buffers refused. */
Test(backend, cpu_add_strided)
{
    cpc_backend *be = NULL;
    cr_assert_null(cpc_cpu_backend_create(&be));
    uint64_t seed = test_seed();
    const int64_t B = 2, T = 5, H = 6, D = 3, ho = 2, hn = 3;
    size_t nd = (size_t)(B * T * H * D), ns = (size_t)(B * T * hn * D);
    float *dst = malloc(nd * sizeof *dst), *src = malloc(ns * sizeof *src);
    double *want = malloc(nd * sizeof *want);
    cr_assert(dst && src && want);
    for (size_t i = 0; i < nd; i++) {
        dst[i] = (float)test_normal_at(seed, 1, i);
        want[i] = dst[i];
    }
    for (size_t i = 0; i < ns; i++)
        src[i] = (float)test_normal_at(seed, 2, i);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < hn; h++)
                for (int64_t d = 0; d < D; d++)
                    want[((b * T + t) * H + ho + h) * D + d] += (double)src[((b * T + t) * hn + h) * D + d];
    cr_assert_null(cpc_backend_add_strided(be, dst + ho * D, src, B, T, 1, hn * D, T * H * D, H * D, 0,
                                           T * hn * D, hn * D, 0));
    for (size_t i = 0; i < nd; i++)
        cr_assert(fabs(dst[i] - want[i]) <= 1e-6 * (1 + fabs(want[i])), "seed %llu, element %zu: %g vs %g",
                  (unsigned long long)seed, i, dst[i], want[i]);
    cr_assert_null(cpc_backend_add_strided(be, dst, src, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0));
    cpc_status *st = cpc_backend_add_strided(be, NULL, src, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0);
    cr_assert(st && st->code == CPC_E_INTERNAL);
    cpc_status_free(st);
    free(dst);
    free(src);
    free(want);
    cpc_backend_destroy(be);
}
