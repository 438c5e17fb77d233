/*
 * test_kernels_emu.c - the generated CUDA kernels (kernels/NAME.cu through
 * compiler/codegen.c), run on the CPU emulator (tests/emu/emu.h) and checked
 * against float64 references on fresh random inputs (SPEC tolerances: rel err
 * ||o - ref||_2 / ||ref||_2 <= 1e-5 fp32, 2e-3 fp16, 1e-2 bf16).  Every
 * attention launch also runs with the fibers in reverse order: a result that
 * depends on the order is a missing barrier (a race on a GPU).  The launch
 * geometry mirrors runtime/backend/backend_cuda.c.
 *
 * The seed is printed with every failure; CPC_TEST_SEED=N repeats a run.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen.h"
#include "emu.h"
#include "dtype.h"

static uint64_t g_seed;
static uint64_t g_state;

static void seed_once(void)
{
    if (g_seed)
        return;
    const char *e = getenv("CPC_TEST_SEED");
    g_seed = e ? strtoull(e, NULL, 10) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (!g_seed)
        g_seed = 1;
    g_state = g_seed;
}

static uint64_t rnd_u64(void)
{
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rnd_uniform(double lo, double hi)
{
    return lo + (hi - lo) * (double)(rnd_u64() >> 11) / 9007199254740992.0;
}

static const char *cache_dir(void)
{
    const char *e = getenv("CPC_EMU_CACHE");
    return e ? e : "/tmp/cpc-emu-modules";
}

/* Builds (or finds in the cache) and loads the module of CUDA source `src`. */
static cpc_emu_module *load_source(const char *src)
{
    char err[4096], *so = NULL;
    int rc = cpc_emu_build_cached(src, cache_dir(), &so, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cpc_emu_module *m = NULL;
    rc = cpc_emu_module_load(so, &m, err, sizeof err);
    free(so);
    cr_assert_eq(rc, 0, "%s", err);
    return m;
}

/* Loads module `name` ("memory" / "attention") generated for `spec`. */
static cpc_emu_module *load(cpc_dtype dt, int D, bool causal, int gqa, const char *name)
{
    cpc_kernel_spec spec = {.dtype = dt, .head_dim = D, .causal = causal, .gqa = gqa};
    cpc_kernel *k = NULL;
    int n = 0;
    cpc_status *st = cpc_codegen_sources(&spec, "sm_90", &k, &n);
    cr_assert_null(st, "codegen: %s", st ? st->message : "");
    const char *src = NULL;
    for (int i = 0; i < n; i++)
        if (strcmp(k[i].name, name) == 0)
            src = k[i].source;
    cr_assert_not_null(src, "no module %s", name);
    cpc_emu_module *m = load_source(src);
    cpc_kernels_free(k, n);
    return m;
}

static size_t esize(cpc_dtype t) { return t == CPC_DTYPE_FP32 ? 4 : 2; }

static void store(void *p, cpc_dtype t, size_t i, float v)
{
    if (t == CPC_DTYPE_FP32)
        ((float *)p)[i] = v;
    else if (t == CPC_DTYPE_BF16)
        ((uint16_t *)p)[i] = cpc_f32_to_bf16(v);
    else
        ((uint16_t *)p)[i] = cpc_f32_to_fp16(v);
}

static double load_d(const void *p, cpc_dtype t, size_t i)
{
    if (t == CPC_DTYPE_FP32)
        return ((const float *)p)[i];
    if (t == CPC_DTYPE_BF16)
        return cpc_bf16_to_f32(((const uint16_t *)p)[i]);
    return cpc_fp16_to_f32(((const uint16_t *)p)[i]);
}

static double tol_of(cpc_dtype t) { return t == CPC_DTYPE_FP32 ? 1e-5 : t == CPC_DTYPE_FP16 ? 2e-3 : 1e-2; }

/* ---- attention ------------------------------------------------------------------ */

typedef struct attn_case {
    cpc_dtype dt;
    int D;
    bool causal;
    int gqa;           /* global H / Hkv */
    int B;
    long long sq, skv;
    int hq, hkv;       /* local heads in q and in k/v */
    int q_head_off, kv_head_off;
    int pos;           /* 0: none (index), 1: zigzag-like permutation, 2: strided */
    bool mask;         /* random key padding (batch 0 fully masked when B > 1) */
    long long pad;     /* extra elements per batch (strides) */
} attn_case;

/* Float64 attention of one case (mirrors the kernel contract in attention.cu). */
static void attn_ref(const attn_case *c, const void *q, const void *k, const void *v,
                     const long long *qpos, const long long *kvpos, const unsigned char *mask,
                     long long mask_len, long long qbs, long long kvbs, double scale, double *o,
                     double *lse)
{
    const int D = c->D;
    double *s = malloc(sizeof(double) * (size_t)c->skv);
    for (int b = 0; b < c->B; b++)
        for (long long r = 0; r < c->sq; r++)
            for (int h = 0; h < c->hq; h++) {
                int kvh = (c->q_head_off + h) / c->gqa - c->kv_head_off;
                long long qp = qpos ? qpos[r] : r;
                double m = -INFINITY;
                for (long long n = 0; n < c->skv; n++) {
                    long long kp = kvpos ? kvpos[n] : n;
                    bool vis = !(c->causal && kp > qp) &&
                               !(mask && (kp < 0 || kp >= mask_len || !mask[b * mask_len + kp]));
                    if (!vis) {
                        s[n] = -INFINITY;
                        continue;
                    }
                    double dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += load_d(q, c->dt, (size_t)(b * qbs + (r * c->hq + h) * D + d)) *
                               load_d(k, c->dt, (size_t)(b * kvbs + (n * c->hkv + kvh) * D + d));
                    s[n] = dot * scale;
                    if (s[n] > m)
                        m = s[n];
                }
                double *orow = o + (((size_t)b * c->sq + r) * c->hq + h) * D;
                for (int d = 0; d < D; d++)
                    orow[d] = 0;
                double l = 0;
                if (m > -INFINITY)
                    for (long long n = 0; n < c->skv; n++) {
                        if (s[n] == -INFINITY)
                            continue;
                        double p = exp(s[n] - m);
                        l += p;
                        for (int d = 0; d < D; d++)
                            orow[d] += p * load_d(v, c->dt, (size_t)(b * kvbs + (n * c->hkv + kvh) * D + d));
                    }
                for (int d = 0; d < D; d++)
                    orow[d] = l > 0 ? orow[d] / l : 0;
                lse[((size_t)b * c->hq + h) * c->sq + r] = l > 0 ? m + log(l) : -INFINITY;
            }
    free(s);
}

/* Shared memory of cpc_flash_attn_tc: mirrors smem_bytes in runtime/backend/backend_cuda.c. */
static size_t tc_smem_bytes(int D)
{
    int bm = 64, bn = D > 128 ? 32 : 64, ld = D + 8, sld = (bn > D ? bn : D) + 4;
    int pld = bn + 8, old = D + 4;
    return (size_t)(bm + 2 * bn) * ld * 2 + (size_t)4 * 16 * sld * 4 + (size_t)4 * 16 * old * 4 +
           (size_t)4 * 16 * pld * 2;
}

/* Shared memory of cpc_flash_attn_mma: mirrors runtime/backend/backend_cuda.c. */
static size_t mma_smem_bytes(int D)
{
    int bm = 64, bn = D > 128 ? 32 : 64, ld = D + 8, vld = bn + 8;
    return (size_t)(bm + bn) * ld * 2 + (size_t)D * vld * 2 + (size_t)bn * 8;
}

/* Runs one case through `kernel` ("cpc_flash_attn_tc" or "cpc_attn_rowwarp"),
 * forward and reverse fiber order; checks o and lse against float64. */
static void run_attn(const attn_case *c, const char *kernel)
{
    seed_once();
    cpc_emu_module *m = load(c->dt, c->D, c->causal, c->gqa, "attention");
    const cpc_emu_kernel *k = cpc_emu_module_kernel(m, kernel);
    cr_assert_not_null(k, "module has no %s", kernel);
    const int D = c->D;
    long long qbs = c->sq * c->hq * D + c->pad, kvbs = c->skv * c->hkv * D + c->pad;
    size_t es = esize(c->dt);
    void *q = malloc((size_t)(c->B * qbs) * es), *kk = malloc((size_t)(c->B * kvbs) * es),
         *v = malloc((size_t)(c->B * kvbs) * es);
    for (long long i = 0; i < c->B * qbs; i++)
        store(q, c->dt, (size_t)i, (float)rnd_uniform(-2, 2));
    for (long long i = 0; i < c->B * kvbs; i++) {
        store(kk, c->dt, (size_t)i, (float)rnd_uniform(-2, 2));
        store(v, c->dt, (size_t)i, (float)rnd_uniform(-1, 1));
    }
    long long *qpos = NULL, *kvpos = NULL;
    long long total = c->sq > c->skv ? c->sq : c->skv;
    if (c->pos) {
        qpos = malloc(sizeof(long long) * (size_t)c->sq);
        kvpos = malloc(sizeof(long long) * (size_t)c->skv);
        /* zigzag: first half of rows from the front, second half from the back */
        for (long long i = 0; i < c->sq; i++)
            qpos[i] = c->pos == 1 ? (i < c->sq / 2 ? i : total - 1 - (i - c->sq / 2)) : 3 * i % (2 * total);
        for (long long i = 0; i < c->skv; i++)
            kvpos[i] = c->pos == 1 ? (i % 2 ? total - 1 - i / 2 : i / 2) : 2 * i + 1;
    }
    unsigned char *mask = NULL;
    long long mask_len = 0;
    if (c->mask) {
        mask_len = c->pos ? 2 * total + 2 : c->skv;
        mask = malloc((size_t)(c->B * mask_len));
        for (long long i = 0; i < c->B * mask_len; i++)
            mask[i] = (c->B > 1 && i < mask_len) ? 0 : (rnd_u64() % 4 != 0);
    }
    size_t no = (size_t)(c->B * c->sq * c->hq * D), nl = (size_t)(c->B * c->hq * c->sq);
    float *o = malloc(no * 4), *lse = malloc(nl * 4), *o2 = malloc(no * 4), *lse2 = malloc(nl * 4);
    double *ro = malloc(no * 8), *rl = malloc(nl * 8);
    float scale = 1.0f / sqrtf((float)D);
    attn_ref(c, q, kk, v, qpos, kvpos, mask, mask_len, qbs, kvbs, scale, ro, rl);

    int B = c->B, hq = c->hq, hkv = c->hkv, qoff = c->q_head_off, kvoff = c->kv_head_off;
    long long sq = c->sq, skv = c->skv;
    const void *qa = q, *ka = kk, *va = v;
    const long long *qp = qpos, *kp = kvpos;
    const unsigned char *ma = mask;
    bool tc = strcmp(kernel, "cpc_flash_attn_tc") == 0, mma = strcmp(kernel, "cpc_flash_attn_mma") == 0;
    bool big = tc || mma;
    cpc_emu_dim3 grid = {(unsigned)((sq + (big ? 63 : 3)) / (big ? 64 : 4)), (unsigned)hq, (unsigned)B};
    cpc_emu_dim3 block = {128, 1, 1};
    size_t smem = tc ? tc_smem_bytes(D) : mma ? mma_smem_bytes(D) : 0;
    char err[2048];
    for (int order = 0; order < 2; order++) {
        float *oo = order ? o2 : o, *ll = order ? lse2 : lse;
        memset(oo, 0xff, no * 4);   /* NaN: every element must be written */
        memset(ll, 0xff, nl * 4);
        void *args[] = {&qa, &ka, &va, &oo, &ll, &B, &sq, &skv, &hq, &hkv, &qoff, &kvoff,
                        &qbs, &kvbs, &scale, &qp, &kp, &ma, &mask_len};
        cpc_emu_set_order(order);
        int rc = cpc_emu_launch(k, grid, block, smem, args, err, sizeof err);
        cpc_emu_set_order(0);
        cr_assert_eq(rc, 0, "%s", err);
    }
    double num = 0, den = 0, lse_err = 0;
    long long bad_lse = -1;
    for (size_t i = 0; i < no; i++) {
        double d = (double)o[i] - ro[i];
        num += d * d;
        den += ro[i] * ro[i];
        if (isnan(o[i]))
            num = INFINITY;
    }
    double tol = tol_of(c->dt);
    for (size_t i = 0; i < nl; i++) {
        if (rl[i] == -INFINITY) {
            if (lse[i] != -INFINITY)
                bad_lse = (long long)i;
            continue;
        }
        double e = fabs((double)lse[i] - rl[i]) / (1.0 + fabs(rl[i]));
        if (!(e <= tol))
            bad_lse = (long long)i;
        if (e > lse_err)
            lse_err = e;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    cr_expect(rel <= tol, "%s %s D=%d causal=%d gqa=%d B=%d sq=%lld skv=%lld: rel err %.3e > %.0e (seed %llu)",
              kernel, cpc_dtype_name(c->dt), D, c->causal, c->gqa, B, sq, skv, rel, tol,
              (unsigned long long)g_seed);
    cr_expect(bad_lse < 0, "%s: lse[%lld] = %g, reference %g (seed %llu)", kernel, bad_lse,
              bad_lse >= 0 ? lse[bad_lse] : 0.0, bad_lse >= 0 ? rl[bad_lse] : 0.0,
              (unsigned long long)g_seed);
    cr_expect(memcmp(o, o2, no * 4) == 0 && memcmp(lse, lse2, nl * 4) == 0,
              "%s: output depends on the thread order (missing barrier) (seed %llu)", kernel,
              (unsigned long long)g_seed);
    if (getenv("CPC_TEST_VERBOSE"))
        fprintf(stderr, "%s %s D=%d c=%d: rel %.3e lse %.3e\n", kernel, cpc_dtype_name(c->dt), D,
                c->causal, rel, lse_err);
    free(q); free(kk); free(v); free(qpos); free(kvpos); free(mask);
    free(o); free(lse); free(o2); free(lse2); free(ro); free(rl);
    cpc_emu_module_unload(m);
}

/* Cases for both tensor-core kernels (wmma: suite attention_tc, and mma.sync). */
static void both_tc_kernels(const attn_case *c)
{
    run_attn(c, "cpc_flash_attn_tc");
    run_attn(c, "cpc_flash_attn_mma");
}

Test(attention_tc, bf16_d128_flux_block)
{
    attn_case c = {.dt = CPC_DTYPE_BF16, .D = 128, .gqa = 1, .B = 1, .sq = 150, .skv = 200,
                   .hq = 2, .hkv = 2};
    both_tc_kernels(&c);
}

Test(attention_tc, fp16_d64_causal_zigzag_gqa)
{
    attn_case c = {.dt = CPC_DTYPE_FP16, .D = 64, .causal = true, .gqa = 2, .B = 2, .sq = 96,
                   .skv = 160, .hq = 4, .hkv = 2, .pos = 1, .pad = 8};
    both_tc_kernels(&c);
}

Test(attention_tc, bf16_d256_head_offsets_mask)
{
    /* local heads 2..3 of 4 global query heads, K/V replicated (gqa 4, one kv head) */
    attn_case c = {.dt = CPC_DTYPE_BF16, .D = 256, .gqa = 4, .B = 2, .sq = 70, .skv = 90,
                   .hq = 2, .hkv = 1, .q_head_off = 2, .kv_head_off = 0, .mask = true};
    both_tc_kernels(&c);
}

Test(attention_tc, fp16_d80_causal_strided_positions_mask)
{
    attn_case c = {.dt = CPC_DTYPE_FP16, .D = 80, .causal = true, .gqa = 1, .B = 1, .sq = 65,
                   .skv = 130, .hq = 1, .hkv = 1, .pos = 2, .mask = true};
    both_tc_kernels(&c);
}

Test(attention_mma, bf16_causal_plain_square)
{
    /* causal without positions: diagonal tiles, tile and warp skipping */
    attn_case c = {.dt = CPC_DTYPE_BF16, .D = 64, .causal = true, .gqa = 1, .B = 1, .sq = 200,
                   .skv = 200, .hq = 1, .hkv = 1};
    run_attn(&c, "cpc_flash_attn_mma");
}

Test(attention_mma, fp16_d80_causal_strided_positions_mask_unaligned)
{
    /* pad 3: batch strides not a multiple of 16 bytes (scalar staging) */
    attn_case c = {.dt = CPC_DTYPE_FP16, .D = 80, .causal = true, .gqa = 1, .B = 2, .sq = 65,
                   .skv = 130, .hq = 1, .hkv = 1, .pos = 2, .mask = true, .pad = 3};
    run_attn(&c, "cpc_flash_attn_mma");
}

Test(attention_mma, bf16_d16_causal_tiny)
{
    /* the smallest head_dim of the kernel: one k-step, two output n-tiles; 5 tokens */
    attn_case c = {.dt = CPC_DTYPE_BF16, .D = 16, .causal = true, .gqa = 1, .B = 1, .sq = 5,
                   .skv = 5, .hq = 3, .hkv = 3};
    run_attn(&c, "cpc_flash_attn_mma");
}

Test(attention_mma, fp16_d32_gqa4_many_tiles)
{
    attn_case c = {.dt = CPC_DTYPE_FP16, .D = 32, .gqa = 4, .B = 1, .sq = 129, .skv = 257,
                   .hq = 4, .hkv = 1};
    run_attn(&c, "cpc_flash_attn_mma");
}

Test(attention_mma, bf16_d256_causal_zigzag)
{
    attn_case c = {.dt = CPC_DTYPE_BF16, .D = 256, .causal = true, .gqa = 1, .B = 1, .sq = 80,
                   .skv = 100, .hq = 1, .hkv = 1, .pos = 1};
    run_attn(&c, "cpc_flash_attn_mma");
}

Test(attention_rowwarp, fp32_d64)
{
    attn_case c = {.dt = CPC_DTYPE_FP32, .D = 64, .gqa = 1, .B = 2, .sq = 37, .skv = 53,
                   .hq = 3, .hkv = 3, .pad = 5};
    run_attn(&c, "cpc_attn_rowwarp");
}

Test(attention_rowwarp, fp32_d128_causal_zigzag_gqa_mask)
{
    attn_case c = {.dt = CPC_DTYPE_FP32, .D = 128, .causal = true, .gqa = 3, .B = 2, .sq = 30,
                   .skv = 44, .hq = 3, .hkv = 1, .q_head_off = 3, .kv_head_off = 1, .pos = 1,
                   .mask = true};
    run_attn(&c, "cpc_attn_rowwarp");
}

Test(attention_rowwarp, bf16_d40)
{
    attn_case c = {.dt = CPC_DTYPE_BF16, .D = 40, .gqa = 1, .B = 1, .sq = 33, .skv = 70,
                   .hq = 2, .hkv = 2};
    run_attn(&c, "cpc_attn_rowwarp");
}

Test(attention_rowwarp, fp16_d256_causal)
{
    attn_case c = {.dt = CPC_DTYPE_FP16, .D = 256, .causal = true, .gqa = 1, .B = 1, .sq = 21,
                   .skv = 21, .hq = 1, .hkv = 1};
    run_attn(&c, "cpc_attn_rowwarp");
}

/* ---- memory-bound kernels ------------------------------------------------------ */

static void launch_ok(const cpc_emu_kernel *k, unsigned grid, unsigned block, void **args)
{
    char err[2048];
    int rc = cpc_emu_launch(k, (cpc_emu_dim3){grid, 1, 1}, (cpc_emu_dim3){block, 1, 1}, 0, args,
                            err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
}

/* Strided 4-D copy as used for all-to-all pack/unpack (aligned: 16-byte
 * vectors; unaligned: odd inner size and offset pointers). */
static void check_copy(cpc_dtype dt, bool aligned, unsigned grid)
{
    seed_once();
    cpc_emu_module *m = load(dt, 64, false, 1, "memory");
    const cpc_emu_kernel *k = cpc_emu_module_kernel(m, "cpc_copy_strided");
    cr_assert_not_null(k);
    size_t es = esize(dt);
    long long nb = 2, nt = 7, nh = 3, inner = aligned ? 64 : 37;
    /* source [nb, nt+1, nh+2, inner+3], destination [nb, nh, nt, inner] */
    long long shs = inner + 3, sts = (nh + 2) * shs, sbs = (nt + 1) * sts;
    long long dts = inner, dhs = nt * inner, dbs = nh * dhs;
    size_t src_n = (size_t)(nb * sbs) + 8, dst_n = (size_t)(nb * dbs) + 8;
    unsigned char *src = malloc(src_n * es), *dst = malloc(dst_n * es), *exp_ = malloc(dst_n * es);
    for (size_t i = 0; i < src_n * es; i++)
        src[i] = (unsigned char)rnd_u64();
    memset(dst, 0x5a, dst_n * es);
    memcpy(exp_, dst, dst_n * es);
    long long off = aligned ? 0 : 1;
    for (long long b = 0; b < nb; b++)
        for (long long t = 0; t < nt; t++)
            for (long long h = 0; h < nh; h++)
                memcpy(exp_ + (size_t)(off + b * dbs + t * dts + h * dhs) * es,
                       src + (size_t)(off + b * sbs + t * sts + h * shs) * es, (size_t)inner * es);
    void *d = dst + off * (long long)es;
    const void *s = src + off * (long long)es;
    void *args[] = {&d, &s, &nb, &nt, &nh, &inner, &dbs, &dts, &dhs, &sbs, &sts, &shs};
    launch_ok(k, grid, 128, args);
    cr_expect(memcmp(dst, exp_, dst_n * es) == 0, "copy_strided %s aligned=%d grid=%u differs (seed %llu)",
              cpc_dtype_name(dt), aligned, grid, (unsigned long long)g_seed);
    free(src); free(dst); free(exp_);
    cpc_emu_module_unload(m);
}

Test(memory, copy_strided_bf16_aligned) { check_copy(CPC_DTYPE_BF16, true, 5); }
Test(memory, copy_strided_fp16_unaligned) { check_copy(CPC_DTYPE_FP16, false, 64); }
Test(memory, copy_strided_fp32_aligned_one_block) { check_copy(CPC_DTYPE_FP32, true, 1); }

Test(memory, merge_lse_matches_float64)
{
    seed_once();
    const int D = 128;
    cpc_emu_module *m = load(CPC_DTYPE_BF16, D, false, 1, "memory");
    const cpc_emu_kernel *k = cpc_emu_module_kernel(m, "cpc_merge_lse");
    cr_assert_not_null(k);
    int B = 2, H = 3;
    long long S = 45;
    size_t rows = (size_t)(B * S * H), n = rows * D;
    float *acc = malloc(n * 4), *o = malloc(n * 4), *al = malloc(rows * 4), *l = malloc(rows * 4);
    double *ea = malloc(n * 8), *el = malloc(rows * 8);
    for (size_t i = 0; i < n; i++) {
        acc[i] = (float)rnd_uniform(-1, 1);
        o[i] = (float)rnd_uniform(-1, 1);
    }
    for (size_t i = 0; i < rows; i++) {
        int kind = (int)(rnd_u64() % 8);   /* some rows: one or both sides -inf */
        al[i] = kind == 0 || kind == 2 ? -INFINITY : (float)rnd_uniform(-30, 30);
        l[i] = kind == 1 || kind == 2 ? -INFINITY : (float)rnd_uniform(-30, 30);
    }
    for (int b = 0; b < B; b++)
        for (long long s = 0; s < S; s++)
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * S + s) * H + h, li = ((size_t)b * H + h) * S + s;
                double a = al[li], c = l[li], mx = fmax(a, c);
                if (mx == -INFINITY) {
                    el[li] = -INFINITY;
                    for (int d = 0; d < D; d++)
                        ea[row * D + d] = acc[row * D + d];
                    continue;
                }
                double lse = mx + log(exp(a - mx) + exp(c - mx));
                el[li] = lse;
                for (int d = 0; d < D; d++)
                    ea[row * D + d] = exp(a - lse) * acc[row * D + d] + exp(c - lse) * o[row * D + d];
            }
    float *acc2 = malloc(n * 4), *al2 = malloc(rows * 4);
    memcpy(acc2, acc, n * 4);
    memcpy(al2, al, rows * 4);
    void *args[] = {&acc, &al, &o, &l, &B, &S, &H};
    launch_ok(k, 3, 256, args);
    void *args2[] = {&acc2, &al2, &o, &l, &B, &S, &H};
    cpc_emu_set_order(1);
    launch_ok(k, 3, 256, args2);
    cpc_emu_set_order(0);
    cr_expect(memcmp(acc, acc2, n * 4) == 0 && memcmp(al, al2, rows * 4) == 0,
              "merge depends on the thread order (missing barrier)");
    free(acc2);
    free(al2);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (getenv("CPC_TEST_VERBOSE") && fabs(acc[i] - ea[i]) > 1e-3)
            fprintf(stderr, "i=%zu row=%zu got %g exp %g\n", i, i / D, acc[i], ea[i]);
        num += (acc[i] - ea[i]) * (acc[i] - ea[i]);
        den += ea[i] * ea[i];
    }
    cr_expect(sqrt(num / den) <= 1e-5, "merge rel err %.3e (seed %llu)", sqrt(num / den),
              (unsigned long long)g_seed);
    for (size_t i = 0; i < rows; i++) {
        if (el[i] == -INFINITY)
            cr_expect(l[i] == -INFINITY || al[i] == -INFINITY, "row %zu", i);
        else
            cr_expect(fabs(al[i] - el[i]) <= 1e-5 * (1 + fabs(el[i])), "lse[%zu] %g vs %g", i, al[i], el[i]);
        if (el[i] == -INFINITY)
            cr_expect(al[i] == -INFINITY, "both -inf stays -inf (row %zu)", i);
    }
    free(acc); free(o); free(al); free(l); free(ea); free(el);
    cpc_emu_module_unload(m);
}

Test(memory, init_and_conversions)
{
    seed_once();
    for (int t = 0; t < 2; t++) {
        cpc_dtype dt = t ? CPC_DTYPE_FP16 : CPC_DTYPE_BF16;
        cpc_emu_module *m = load(dt, 64, false, 1, "memory");
        const cpc_emu_kernel *ki = cpc_emu_module_kernel(m, "cpc_init_acc");
        const cpc_emu_kernel *kf = cpc_emu_module_kernel(m, "cpc_convert_from_f32");
        const cpc_emu_kernel *kt = cpc_emu_module_kernel(m, "cpc_convert_to_f32");
        cr_assert(ki && kf && kt);
        long long n = 1000, nl = 333;
        float *a = malloc((size_t)n * 4), *l = malloc((size_t)nl * 4), *back = malloc((size_t)n * 4);
        uint16_t *h = malloc((size_t)n * 2);
        for (long long i = 0; i < n; i++)
            a[i] = (float)rnd_uniform(-70000, 70000) * (i % 3 ? 1e-4f : 1.0f);
        a[0] = INFINITY; a[1] = -0.0f; a[2] = 1e-8f; a[3] = NAN;
        void *fargs[] = {&h, &a, &n};
        launch_ok(kf, 2, 256, fargs);
        for (long long i = 0; i < n; i++) {
            uint16_t e = dt == CPC_DTYPE_BF16 ? cpc_f32_to_bf16(a[i]) : cpc_f32_to_fp16(a[i]);
            if (isnan(a[i]))
                cr_expect((h[i] & 0x7fff) > (dt == CPC_DTYPE_BF16 ? 0x7f80 : 0x7c00), "NaN stays NaN");
            else
                cr_expect_eq(h[i], e, "%s convert %g: 0x%04x, expected 0x%04x", cpc_dtype_name(dt),
                             a[i], h[i], e);
        }
        void *targs[] = {&back, &h, &n};
        launch_ok(kt, 3, 128, targs);
        for (long long i = 4; i < n; i++)
            cr_expect_eq(back[i], dt == CPC_DTYPE_BF16 ? cpc_bf16_to_f32(h[i]) : cpc_fp16_to_f32(h[i]));
        void *iargs[] = {&a, &n, &l, &nl};
        launch_ok(ki, 1, 64, iargs);
        for (long long i = 0; i < n; i++)
            cr_expect(a[i] == 0.0f && !signbit(a[i]), "acc[%lld] = %g", i, a[i]);
        for (long long i = 0; i < nl; i++)
            cr_expect(l[i] == -INFINITY, "lse[%lld] = %g", i, l[i]);
        free(a); free(l); free(back); free(h);
        cpc_emu_module_unload(m);
    }
}

/* ---- the emulator's own checks can fail ------------------------------------------ */

Test(emulator, race_changes_with_order)
{
    cpc_emu_module *m = load_source(
        "extern \"C\" __global__ void racy(float *out, int seed)\n"
        "{\n"
        "    __shared__ float s[128];\n"
        "    s[threadIdx.x] = (float)(threadIdx.x + seed);\n"
        "    out[threadIdx.x] = s[(threadIdx.x + 1) % 128];   // no __syncthreads\n"
        "}\n"
        "extern \"C\" __global__ void fine(float *out, int seed)\n"
        "{\n"
        "    __shared__ float s[128];\n"
        "    s[threadIdx.x] = (float)(threadIdx.x + seed);\n"
        "    __syncthreads();\n"
        "    out[threadIdx.x] = s[(threadIdx.x + 1) % 128];\n"
        "}\n");
    float a[128], b[128];
    char err[512];
    for (int which = 0; which < 2; which++) {
        const cpc_emu_kernel *k = cpc_emu_module_kernel(m, which ? "fine" : "racy");
        cr_assert_not_null(k);
        float *pa = a, *pb = b;
        int s1 = 1000, s2 = 2000;
        void *a1[] = {&pa, &s1}, *a2[] = {&pb, &s2};
        cr_assert_eq(cpc_emu_launch(k, (cpc_emu_dim3){1, 1, 1}, (cpc_emu_dim3){128, 1, 1}, 0, a1, err, sizeof err), 0, "%s", err);
        cpc_emu_set_order(1);
        cr_assert_eq(cpc_emu_launch(k, (cpc_emu_dim3){1, 1, 1}, (cpc_emu_dim3){128, 1, 1}, 0, a2, err, sizeof err), 0, "%s", err);
        cpc_emu_set_order(0);
        int differ = 0;
        for (int i = 0; i < 128; i++)
            differ += a[i] - 1000 != b[i] - 2000;
        if (which)
            cr_expect_eq(differ, 0, "the kernel with a barrier must not depend on the order");
        else
            cr_expect_gt(differ, 0, "the racy kernel must depend on the order");
    }
    cpc_emu_module_unload(m);
}

Test(emulator, divergent_warp_collective_is_an_error)
{
    cpc_emu_module *m = load_source(
        "extern \"C\" __global__ void diverge(float *out)\n"
        "{\n"
        "    float v = threadIdx.x;\n"
        "    if ((threadIdx.x & 31) < 16)\n"
        "        v = __shfl_xor_sync(0xffffffffu, v, 1);\n"
        "    else\n"
        "        __syncwarp();\n"
        "    out[threadIdx.x] = v;\n"
        "}\n"
        "extern \"C\" __global__ void exited(float *out)\n"
        "{\n"
        "    if (threadIdx.x == 1) return;\n"
        "    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);\n"
        "}\n");
    float out[64];
    float *p = out;
    void *args[] = {&p};
    char err[1024];
    const cpc_emu_kernel *k = cpc_emu_module_kernel(m, "diverge");
    int rc = cpc_emu_launch(k, (cpc_emu_dim3){1, 1, 1}, (cpc_emu_dim3){64, 1, 1}, 0, args, err, sizeof err);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(err, "divergent warp collective") != NULL, "%s", err);
    k = cpc_emu_module_kernel(m, "exited");
    rc = cpc_emu_launch(k, (cpc_emu_dim3){1, 1, 1}, (cpc_emu_dim3){32, 1, 1}, 0, args, err, sizeof err);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(err, "exited") != NULL, "%s", err);
    cpc_emu_module_unload(m);
}

Test(emulator, launch_limits)
{
    cpc_emu_module *m = load(CPC_DTYPE_BF16, 128, false, 1, "attention");
    const cpc_emu_kernel *k = cpc_emu_module_kernel(m, "cpc_flash_attn_tc");
    cr_assert_not_null(k);
    char err[512];
    void *args[19] = {0};
    cr_expect_neq(cpc_emu_launch(k, (cpc_emu_dim3){1, 1, 1}, (cpc_emu_dim3){2048, 1, 1}, 0, args, err, sizeof err), 0);
    cr_expect_neq(cpc_emu_launch(k, (cpc_emu_dim3){1, 70000, 1}, (cpc_emu_dim3){128, 1, 1}, 0, args, err, sizeof err), 0);
    cr_expect_neq(cpc_emu_launch(k, (cpc_emu_dim3){1, 1, 1}, (cpc_emu_dim3){128, 1, 1}, 300000, args, err, sizeof err), 0);
    cr_expect(tc_smem_bytes(256) <= 232448, "the D=256 tile must fit sm_90 shared memory");
    cpc_emu_module_unload(m);
}
