/*
 * test_fake_cudart.c - the fake CUDA runtime (fake_cudart.c) behaves like the
 * real one where cpc depends on it: device attributes, memory checks (ranges,
 * directions, frees), stream/event handles, PTX -> module lookup by SHA-256,
 * kernel lookup, the dynamic shared memory rule of cudaLaunchKernel (48 KiB
 * without the attribute, the attribute's value with it, 227 KiB at most),
 * launch configuration errors, and a failing launch (divergent barrier) that
 * is cudaErrorLaunchFailure and sticky.
 *
 * Linked against the fake libcudart.so.13 itself.  The module is built from
 * the CUDA source below into $CPC_FAKE_TEST_DIR (default /tmp/cpc-fake-cudart-test)
 * /<sha256 of its "PTX">.so (the
 * "PTX" is any text: the fake only hashes it).  Criterion runs every test in
 * its own process, so a sticky error does not leak into the next test.
 */
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emu.h"

static const char SRC[] =
    "#ifndef CPC_DYNAMIC_SMEM\n"
    "#define CPC_DYNAMIC_SMEM(type, name) extern __shared__ type name[]\n"
    "#endif\n"
    "extern \"C\" __global__ void k_reverse(float *out, const float *in, int n)\n"
    "{\n"
    "    CPC_DYNAMIC_SMEM(float, buf);\n"
    "    int i = threadIdx.x;\n"
    "    if (i < n) buf[i] = in[i];\n"
    "    __syncthreads();\n"
    "    if (i < n) out[blockIdx.x * n + i] = buf[n - 1 - i] + 1000.0f * blockIdx.x;\n"
    "}\n"
    "extern \"C\" __global__ void k_diverge(int *x)\n"
    "{\n"
    "    if (threadIdx.x < 16) __syncwarp(); else __syncthreads();\n"
    "    x[threadIdx.x] = 1;\n"
    "}\n";

static char g_ptx[sizeof SRC + 64];

/* Builds the module for g_ptx (once per build tree) and points the fake at it. */
static void setup(void)
{
    snprintf(g_ptx, sizeof g_ptx, "// fake PTX of the fake_cudart test\n%s", SRC);
    const char *dir = getenv("CPC_FAKE_TEST_DIR");   /* ctest: <build>/emu-cudart/test-modules */
    if (!dir || !*dir)
        dir = "/tmp/cpc-fake-cudart-test";
    mkdir(dir, 0777);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    cr_assert(EVP_Digest(g_ptx, strlen(g_ptx), md, &n, EVP_sha256(), NULL) && n == 32);
    char so[4096];
    int k = snprintf(so, sizeof so, "%s/", dir);
    for (int i = 0; i < 32; i++)
        k += snprintf(so + k, sizeof so - (size_t)k, "%02x", md[i]);
    snprintf(so + k, sizeof so - (size_t)k, ".so");
    char err[4096];
    if (access(so, R_OK) != 0)
        cr_assert(cpc_emu_build_module(SRC, so, err, sizeof err) == 0, "%s", err);
    setenv("CPC_EMU_MODULES", dir, 1);
}

TestSuite(fake, .init = setup, .timeout = 60);

static cudaKernel_t kernel(const char *name)
{
    cudaLibrary_t lib = NULL;
    cr_assert_eq(cudaLibraryLoadData(&lib, g_ptx, NULL, NULL, 0, NULL, NULL, 0), cudaSuccess);
    cudaKernel_t k = NULL;
    cr_assert_eq(cudaLibraryGetKernel(&k, lib, name), cudaSuccess);
    return k;
}

Test(fake, device)
{
    int n = -1, v = 0, maj = 0, sms = 0;
    cr_assert_eq(cudaGetDeviceCount(&n), cudaSuccess);
    cr_assert_geq(n, 1);
    cr_assert_eq(cudaDeviceGetAttribute(&maj, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    cr_assert_eq(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    cr_assert_eq(maj, 9);
    cr_assert_eq(sms, 132);
    cr_assert_eq(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, n), cudaErrorInvalidDevice);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidDevice);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "cudaGetLastError resets");
    cr_assert_eq(cudaSetDevice(n), cudaErrorInvalidDevice);
    struct cudaDeviceProp p;
    cr_assert_eq(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    cr_assert_eq(p.sharedMemPerBlockOptin, 232448);
    cr_assert_str_eq(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
    cr_assert_str_eq(cudaGetErrorName(cudaErrorLaunchFailure), "cudaErrorLaunchFailure");
}

Test(fake, memory)
{
    float *d = NULL, h[64];
    cr_assert_eq(cudaMalloc((void **)&d, sizeof h), cudaSuccess);
    cr_assert_eq((uintptr_t)d % 256, 0);
    for (int i = 0; i < 64; i++)
        h[i] = (float)i;
    cr_assert_eq(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    float back[64];
    cr_assert_eq(cudaMemcpy(back, d, sizeof h, cudaMemcpyDefault), cudaSuccess);
    cr_assert_arr_eq(back, h, sizeof h);
    /* past the end, wrong direction, device range of the host, interior free */
    cr_assert_eq(cudaMemcpy(back, d + 1, sizeof h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    cr_assert_eq(cudaMemcpy(d, h, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    cr_assert_eq(cudaMemcpy(h, back, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    cr_assert_eq(cudaMemset2DAsync(d, 64, 0, 64, 5, NULL), cudaErrorInvalidValue);
    cr_assert_eq(cudaMemset2DAsync(d, 64, 0, 32, 4, NULL), cudaSuccess);
    cr_assert_eq(cudaMemcpy(back, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert(back[0] == 0.0f && back[7] == 0.0f && back[8] == 8.0f && back[48] == 0.0f && back[63] == 63.0f);
    struct cudaPointerAttributes a;
    cr_assert_eq(cudaPointerGetAttributes(&a, d + 3), cudaSuccess);
    cr_assert_eq(a.type, cudaMemoryTypeDevice);
    cr_assert_eq(cudaPointerGetAttributes(&a, h), cudaSuccess);
    cr_assert_eq(a.type, cudaMemoryTypeUnregistered);
    cr_assert_eq(cudaFree(d + 1), cudaErrorInvalidValue);
    cr_assert_eq(cudaFree(d), cudaSuccess);
    cr_assert_eq(cudaFree(d), cudaErrorInvalidValue, "double free");
    void *z = (void *)1;
    cr_assert_eq(cudaMalloc(&z, 0), cudaSuccess);
    cr_assert_null(z);
}

Test(fake, handles)
{
    cudaStream_t s = NULL;
    cudaEvent_t e = NULL;
    cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    cr_assert_eq(cudaEventRecord(e, s), cudaSuccess);
    cr_assert_eq(cudaStreamWaitEvent(NULL, e, 0), cudaSuccess);
    cr_assert_eq(cudaEventQuery(e), cudaSuccess);
    float ms;
    cr_assert_eq(cudaEventElapsedTime(&ms, e, e), cudaErrorInvalidResourceHandle);
    cr_assert_eq(cudaEventDestroy(e), cudaSuccess);
    cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    cr_assert_eq(cudaEventQuery(e), cudaErrorInvalidResourceHandle);
}

Test(fake, library)
{
    cudaLibrary_t lib = NULL;
    cr_assert_eq(cudaLibraryLoadData(&lib, "// not a PTX anyone prepared\n", NULL, NULL, 0, NULL,
                                     NULL, 0),
                 cudaErrorFileNotFound);
    cr_assert_eq(cudaLibraryLoadData(&lib, g_ptx, NULL, NULL, 0, NULL, NULL, 0), cudaSuccess);
    cudaKernel_t k = NULL, k2 = NULL;
    cr_assert_eq(cudaLibraryGetKernel(&k, lib, "no_such_kernel"), cudaErrorSymbolNotFound);
    cr_assert_eq(cudaLibraryGetKernel(&k, lib, "k_reverse"), cudaSuccess);
    cr_assert_eq(cudaLibraryGetKernel(&k2, lib, "k_reverse"), cudaSuccess);
    cr_assert_eq(k, k2, "one handle per kernel");
    cr_assert_eq(cudaLibraryUnload(lib), cudaSuccess);
}

Test(fake, launch_and_shared_memory)
{
    cudaKernel_t k = kernel("k_reverse");
    int n = 100;
    float h[100], *in, *out;
    for (int i = 0; i < n; i++)
        h[i] = (float)i;
    cr_assert_eq(cudaMalloc((void **)&in, sizeof h), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&out, 2 * sizeof h), cudaSuccess);
    cr_assert_eq(cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    void *args[] = {&out, &in, &n};
    dim3 g1 = {1, 1, 1}, blk = {128, 1, 1};
    /* dynamic shared memory: 48 KiB without the attribute */
    cr_assert_eq(cudaLaunchKernel((const void *)k, g1, blk, args, 49152, NULL), cudaSuccess);
    cr_assert_eq(cudaLaunchKernel((const void *)k, g1, blk, args, 49153, NULL), cudaErrorInvalidValue);
    cr_assert_eq(cudaKernelSetAttributeForDevice(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 100000, 0),
                 cudaSuccess);
    cr_assert_eq(cudaLaunchKernel((const void *)k, g1, blk, args, 100000, NULL), cudaSuccess);
    cr_assert_eq(cudaLaunchKernel((const void *)k, g1, blk, args, 100001, NULL), cudaErrorInvalidValue);
    cr_assert_eq(cudaKernelSetAttributeForDevice(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 232449, 0),
                 cudaErrorInvalidValue);
    /* configuration */
    dim3 big = {1025, 1, 1}, g0 = {0, 1, 1};
    cr_assert_eq(cudaLaunchKernel((const void *)k, g1, big, args, 400, NULL), cudaErrorInvalidConfiguration);
    cr_assert_eq(cudaLaunchKernel((const void *)k, g0, blk, args, 400, NULL), cudaErrorInvalidConfiguration);
    cr_assert_eq(cudaLaunchKernel((const void *)&n, g1, blk, args, 400, NULL), cudaErrorInvalidDeviceFunction);
    /* results of two blocks */
    dim3 g2 = {2, 1, 1};
    cr_assert_eq(cudaLaunchKernel((const void *)k, g2, blk, args, 400, NULL), cudaSuccess);
    float back[200];
    cr_assert_eq(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < n; i++) {
        cr_assert_float_eq(back[i], (float)(n - 1 - i), 0.0f, "out[%d] = %g", i, back[i]);
        cr_assert_float_eq(back[n + i], (float)(n - 1 - i) + 1000.0f, 0.0f, "out[%d] = %g", n + i,
                           back[n + i]);
    }
}

Test(fake, launch_failure_is_sticky)
{
    cudaKernel_t k = kernel("k_diverge");
    int *x;
    cr_assert_eq(cudaMalloc((void **)&x, 32 * sizeof(int)), cudaSuccess);
    void *args[] = {&x};
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    cr_assert_eq(cudaLaunchKernel((const void *)k, g, b, args, 0, NULL), cudaErrorLaunchFailure);
    void *p = NULL;
    cr_assert_eq(cudaMalloc(&p, 16), cudaErrorLaunchFailure, "sticky");
    cr_assert_eq(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
}

/* cudaMemcpy2DAsync (the cuDNN path scatters packed stats with it): rows land
 * at their pitch, bytes between rows untouched, a row past the allocation is
 * refused. */
Test(fake, memcpy_2d)
{
    float *src = NULL, *dst = NULL;
    cr_assert_eq(cudaMalloc((void **)&src, 6 * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&dst, 12 * sizeof(float)), cudaSuccess);
    float h[6] = {1, 2, 3, 4, 5, 6}, out[12];
    cr_assert_eq(cudaMemcpy(src, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    cr_assert_eq(cudaMemset(dst, 0, 12 * sizeof(float)), cudaSuccess);
    /* 3 rows of 2 floats into a pitch of 4 floats, starting at column 1 */
    cr_assert_eq(cudaMemcpy2DAsync(dst + 1, 4 * sizeof(float), src, 2 * sizeof(float),
                                   2 * sizeof(float), 3, cudaMemcpyDeviceToDevice, NULL),
                 cudaSuccess);
    cr_assert_eq(cudaMemcpy(out, dst, sizeof out, cudaMemcpyDeviceToHost), cudaSuccess);
    const float want[12] = {0, 1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0};
    for (int i = 0; i < 12; i++)
        cr_expect_eq(out[i], want[i], "dst[%d] = %g, want %g", i, out[i], want[i]);
    /* a fourth row would run past dst */
    cr_expect_neq(cudaMemcpy2DAsync(dst + 1, 4 * sizeof(float), src, 1 * sizeof(float),
                                    1 * sizeof(float), 4, cudaMemcpyDeviceToDevice, NULL),
                  cudaSuccess);
    (void)cudaGetLastError();
    cudaFree(src);
    cudaFree(dst);
}
