/*
 * test_kernels_emu.c - the CPU emulator of CUDA itself (tests/emu/emu.h):
 * a racy kernel changes with the thread order and a kernel with a barrier
 * does not, divergent warp collectives and exited lanes are errors, sm_90's
 * launch limits are enforced.
 *
 * The generated kernels' numerics (attention with every kernel choice,
 * merge, init, conversions, strided copies), formerly launched directly
 * here, run through the CUDA backend on the fake runtime in the backend
 * conformance suite (test_backend_cuda_emu.c, tests/backend_conformance.h),
 * each attention block also with the threads in reverse order.
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

/* Shared memory of cpc_flash_attn_tc: mirrors smem_bytes in runtime/backend/backend_cuda.c. */
static size_t tc_smem_bytes(int D)
{
    int bm = 64, bn = D > 128 ? 32 : 64, ld = D + 8, sld = (bn > D ? bn : D) + 4;
    int pld = bn + 8, old = D + 4;
    return (size_t)(bm + 2 * bn) * ld * 2 + (size_t)4 * 16 * sld * 4 + (size_t)4 * 16 * old * 4 +
           (size_t)4 * 16 * pld * 2;
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
