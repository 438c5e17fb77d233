/*
 * fake_cudart.c - a fake CUDA runtime (libcudart.so.13) over the CPU CUDA
 * emulator (emu.h), so that `cprun --backend cuda`, libcpc_runtime's CUDA
 * backend, the staged transport and the generated kernels run on a machine
 * without a GPU.  Test-only: put its folder first on LD_LIBRARY_PATH (cprun's
 * RUNPATH then loses to it) and set CPC_EMU_MODULES.
 *
 * Built as <build>/emu-cudart/libcudart.so.13 (SONAME libcudart.so.13, every
 * symbol in the version node `libcudart.so.13` as in NVIDIA's library:
 * tests/emu/libcudart.map), so binaries linked against the real runtime bind
 * to it unchanged.  Only the functions cpc uses are defined; a program that
 * needs another one fails to load ("undefined symbol"), it is never faked.
 *
 * Semantics:
 *  - devices: CPC_EMU_DEVICES (default 1, 0 = "no CUDA-capable device"), each
 *    an sm_90 with 132 SMs, 48 KiB default / 227 KiB opt-in shared memory per
 *    block; the current device is per host thread (cudaSetDevice).
 *  - device memory: host memory of exactly the requested size (256-byte
 *    aligned, so ASan sees every overrun), filled with 0xFF bytes (NaN in
 *    every float format) as real device memory is not zeroed; every device
 *    range of a copy or memset must lie inside one live allocation, and host
 *    ranges must not be device memory (cudaErrorInvalidValue otherwise, with
 *    a message on stderr): wrong-direction copies are found.
 *  - streams and events are bookkeeping: every asynchronous operation runs
 *    synchronously, in call order, on the calling thread; handles are
 *    validated (a destroyed one is cudaErrorInvalidResourceHandle).
 *  - kernels: cudaLibraryLoadData takes PTX text, hashes it (SHA-256 of its
 *    strlen bytes, OpenSSL EVP) and loads $CPC_EMU_MODULES/<hex>.so, which
 *    cpc_emu_prepare built from the same artifact's CUDA source;
 *    cudaLaunchKernel runs the grid with cpc_emu_launch.  Dynamic shared
 *    memory above 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize,
 *    and above that attribute the launch is cudaErrorInvalidValue, like the
 *    real runtime.  An emulator error (deadlock, divergent barrier, bad
 *    configuration) is cudaErrorLaunchFailure, printed to stderr, and sticky
 *    for the device as on hardware: every later call on it fails.
 *  - errors: per thread last error (cudaGetLastError / cudaPeekAtLastError),
 *    cudaGetErrorString/Name with the runtime's texts.
 *
 * Thread-safety: every function may be called from any thread; launches from
 * different threads run concurrently (the emulator allows it).
 */
#include <cuda_runtime_api.h>

#include <openssl/evp.h>
#include <dirent.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu.h"

#define API __attribute__((visibility("default")))
#define MAX_DEV 16
#define SMEM_DEFAULT 49152          /* bytes of dynamic shared memory without the attribute */
#define SMEM_OPTIN 232448           /* sm_90 sharedMemPerBlockOptin (227 KiB) */
#define SMEM_PER_SM 233472          /* sm_90 shared memory per multiprocessor */
#define SM_COUNT 132
#define MEM_BYTES ((size_t)143771 << 20)

static __thread cudaError_t t_last = cudaSuccess;
static __thread int t_device = 0;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaError_t g_sticky[MAX_DEV];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudart-emu: %s\n", buf);
}

/* Every failing call records its error for cudaGetLastError. */
static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last = e;
    return e;
}

/* ---- devices ---------------------------------------------------------------------- */

static int device_count(void)
{
    static int n = -1;
    pthread_mutex_lock(&g_mu);
    if (n < 0) {
        const char *s = getenv("CPC_EMU_DEVICES");
        n = 1;
        if (s && *s) {
            char *end = NULL;
            long v = strtol(s, &end, 10);
            if (*end || v < 0 || v > MAX_DEV)
                say("CPC_EMU_DEVICES=%s: expected 0..%d; using 1", s, MAX_DEV);
            else
                n = (int)v;
        }
    }
    int r = n;
    pthread_mutex_unlock(&g_mu);
    return r;
}

static cudaError_t sticky(int dev)
{
    if (dev < 0 || dev >= MAX_DEV)
        return cudaSuccess;
    pthread_mutex_lock(&g_mu);
    cudaError_t e = g_sticky[dev];
    pthread_mutex_unlock(&g_mu);
    return e;
}

/* The current device, usable: no device, or an earlier launch failure. */
static cudaError_t current(int *dev)
{
    int n = device_count();
    if (n == 0)
        return cudaErrorNoDevice;
    if (t_device >= n)
        return cudaErrorInvalidDevice;
    *dev = t_device;
    return sticky(t_device);
}

API cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return ret(cudaErrorInvalidValue);
    *count = device_count();
    return ret(*count == 0 ? cudaErrorNoDevice : cudaSuccess);
}


/* cudaErrorNoDevice / cudaErrorInvalidDevice for a device index that is not emulated. */
static cudaError_t check_device(int device)
{
    int n = device_count();
    if (n == 0)
        return cudaErrorNoDevice;
    return device < 0 || device >= n ? cudaErrorInvalidDevice : cudaSuccess;
}

API cudaError_t cudaSetDevice(int device)
{
    cudaError_t de = check_device(device);
    if (de != cudaSuccess)
        return ret(de);
    t_device = device;
    return ret(sticky(device));
}

API cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return ret(cudaErrorInvalidValue);
    if (device_count() == 0)
        return ret(cudaErrorNoDevice);
    *device = t_device;
    return cudaSuccess;
}

API cudaError_t cudaDeviceSynchronize(void)
{
    int dev;
    return ret(current(&dev));
}

API cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

API cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* Peer access: every pair of emulated devices can reach each other (one host
 * memory); enabling it twice from one device is an error, as on hardware. */
static pthread_mutex_t g_peer_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char g_peer[64][64];

API cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    int n = device_count();
    if (!can)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= n || peer < 0 || peer >= n)
        return ret(cudaErrorInvalidDevice);
    *can = device != peer;
    return cudaSuccess;
}

API cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    int dev;
    cudaError_t e = current(&dev);
    if (e != cudaSuccess)
        return ret(e);
    if (flags != 0 || peer < 0 || peer >= device_count() || peer == dev || dev >= 64 || peer >= 64)
        return ret(peer == dev ? cudaErrorInvalidDevice : cudaErrorInvalidValue);
    pthread_mutex_lock(&g_peer_mu);
    bool again = g_peer[dev][peer];
    g_peer[dev][peer] = 1;
    pthread_mutex_unlock(&g_peer_mu);
    return again ? ret(cudaErrorPeerAccessAlreadyEnabled) : cudaSuccess;
}

API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        return ret(cudaErrorInvalidValue);
    cudaError_t de = check_device(device);
    if (de != cudaSuccess)
        return ret(de);
    int v;
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: v = SM_COUNT; break;
    case cudaDevAttrComputeCapabilityMajor: v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: v = 0; break;
    case cudaDevAttrMaxThreadsPerBlock: v = 1024; break;
    case cudaDevAttrMaxBlockDimX: v = 1024; break;
    case cudaDevAttrMaxBlockDimY: v = 1024; break;
    case cudaDevAttrMaxBlockDimZ: v = 64; break;
    case cudaDevAttrMaxGridDimX: v = 2147483647; break;
    case cudaDevAttrMaxGridDimY: v = 65535; break;
    case cudaDevAttrMaxGridDimZ: v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: v = SMEM_DEFAULT; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: v = SMEM_OPTIN; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: v = SMEM_PER_SM; break;
    case cudaDevAttrWarpSize: v = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: v = 65536; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: v = 65536; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: v = 2048; break;
    case cudaDevAttrL2CacheSize: v = 50331648; break;
    case cudaDevAttrGlobalMemoryBusWidth: v = 6144; break;
    case cudaDevAttrTotalConstantMemory: v = 65536; break;
    case cudaDevAttrUnifiedAddressing: v = 1; break;
    case cudaDevAttrConcurrentKernels: v = 1; break;
    case cudaDevAttrMemoryPoolsSupported: v = 1; break;
    case cudaDevAttrIntegrated: v = 0; break;
    case cudaDevAttrPciBusId: v = device + 1; break;
    case cudaDevAttrPciDeviceId: v = 0; break;
    case cudaDevAttrPciDomainId: v = 0; break;
    default:
        say("cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
        return ret(cudaErrorNotSupported);
    }
    *value = v;
    return cudaSuccess;
}

API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (!p)
        return ret(cudaErrorInvalidValue);
    cudaError_t de = check_device(device);
    if (de != cudaSuccess)
        return ret(de);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H200 (cpc CPU emulator)");
    p->totalGlobalMem = MEM_BYTES;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = SMEM_PER_SM;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = SM_COUNT;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    p->l2CacheSize = 50331648;
    p->memoryBusWidth = 6144;
    p->concurrentKernels = 1;
    p->unifiedAddressing = 1;
    p->managedMemory = 1;
    p->memoryPoolsSupported = 1;
    p->streamPrioritiesSupported = 1;
    p->asyncEngineCount = 2;
    p->pciBusID = device + 1;
    return cudaSuccess;
}

API cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return cudaSuccess;
}

/* ---- errors ------------------------------------------------------------------------ */

API cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

API cudaError_t cudaPeekAtLastError(void) { return t_last; }

static const struct {
    cudaError_t e;
    const char *name, *text;
} ERRS[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {cudaErrorInvalidPtx, "cudaErrorInvalidPtx", "a PTX JIT compilation failed"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device"},
    {cudaErrorFileNotFound, "cudaErrorFileNotFound", "file not found"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

API const char *cudaGetErrorName(cudaError_t e)
{
    for (size_t i = 0; i < sizeof ERRS / sizeof ERRS[0]; i++)
        if (ERRS[i].e == e)
            return ERRS[i].name;
    return "unrecognized error code";
}

API const char *cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof ERRS / sizeof ERRS[0]; i++)
        if (ERRS[i].e == e)
            return ERRS[i].text;
    return "unrecognized error code";
}

/* ---- memory ------------------------------------------------------------------------ */

typedef struct alloc {
    uintptr_t base;
    size_t size;
    int device;
} alloc;

static alloc *g_allocs;     /* sorted by base */
static size_t g_nallocs, g_capallocs;

/* Index of the first allocation with base > p (caller holds g_mu). */
static size_t upper(uintptr_t p)
{
    size_t lo = 0, hi = g_nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_allocs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The live allocation holding byte p, copied to *out (false: none). */
static bool find_alloc(const void *p, alloc *out)
{
    uintptr_t u = (uintptr_t)p;
    pthread_mutex_lock(&g_mu);
    size_t i = upper(u);
    bool hit = i > 0 && u < g_allocs[i - 1].base + (g_allocs[i - 1].size ? g_allocs[i - 1].size : 1);
    if (hit)
        *out = g_allocs[i - 1];
    pthread_mutex_unlock(&g_mu);
    return hit;
}

static cudaError_t dev_malloc(void **out, size_t size, const char *fn)
{
    if (!out)
        return ret(cudaErrorInvalidValue);
    *out = NULL;
    int dev;
    cudaError_t e = current(&dev);
    if (e)
        return ret(e);
    if (size == 0)
        return cudaSuccess; /* as the runtime: success, NULL */
    void *p = NULL;
    if (size > MEM_BYTES || posix_memalign(&p, 256, size) != 0) {
        say("%s: %zu bytes: out of (host) memory", fn, size);
        return ret(cudaErrorMemoryAllocation);
    }
    memset(p, 0xFF, size);
    pthread_mutex_lock(&g_mu);
    if (g_nallocs == g_capallocs) {
        size_t nc = g_capallocs ? 2 * g_capallocs : 256;
        alloc *na = realloc(g_allocs, nc * sizeof *na);
        if (!na) {
            pthread_mutex_unlock(&g_mu);
            free(p);
            return ret(cudaErrorMemoryAllocation);
        }
        g_allocs = na;
        g_capallocs = nc;
    }
    size_t i = upper((uintptr_t)p);
    memmove(g_allocs + i + 1, g_allocs + i, (g_nallocs - i) * sizeof *g_allocs);
    g_allocs[i] = (alloc){(uintptr_t)p, size, dev};
    g_nallocs++;
    pthread_mutex_unlock(&g_mu);
    *out = p;
    return cudaSuccess;
}

static cudaError_t dev_free(void *p, const char *fn)
{
    if (!p)
        return cudaSuccess;
    pthread_mutex_lock(&g_mu);
    size_t i = upper((uintptr_t)p);
    bool ok = i > 0 && g_allocs[i - 1].base == (uintptr_t)p;
    if (ok) {
        memmove(g_allocs + i - 1, g_allocs + i, (g_nallocs - i) * sizeof *g_allocs);
        g_nallocs--;
    }
    pthread_mutex_unlock(&g_mu);
    if (!ok) {
        say("%s(%p): not the start of a live device allocation", fn, p);
        return ret(cudaErrorInvalidValue);
    }
    free(p);
    return cudaSuccess;
}

/* ---- streams and events ------------------------------------------------------------ */

#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x4556544eu
#define KERNEL_MAGIC 0x4b45524eu
#define LIB_MAGIC 0x4c494252u

struct CUstream_st {
    unsigned magic;
    int device;
    unsigned flags;
    int priority;
};

struct CUevent_st {
    unsigned magic;
    int device;
    unsigned flags;
    bool recorded;
    struct timespec when;
};

/* Live handles of every kind (streams, events, libraries, kernels). */
static void **g_handles;
static size_t g_nhandles, g_caphandles;

static bool handle_add(void *h)
{
    pthread_mutex_lock(&g_mu);
    if (g_nhandles == g_caphandles) {
        size_t nc = g_caphandles ? 2 * g_caphandles : 64;
        void **nh = realloc(g_handles, nc * sizeof *nh);
        if (!nh) {
            pthread_mutex_unlock(&g_mu);
            return false;
        }
        g_handles = nh;
        g_caphandles = nc;
    }
    g_handles[g_nhandles++] = h;
    pthread_mutex_unlock(&g_mu);
    return true;
}

/* True when h is live and starts with `magic`; remove=true forgets it. */
static bool handle_check(const void *h, unsigned magic, bool remove)
{
    bool ok = false;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_nhandles; i++)
        if (g_handles[i] == h) {
            ok = *(const unsigned *)h == magic;
            if (ok && remove)
                g_handles[i] = g_handles[--g_nhandles];
            break;
        }
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* A stream argument: NULL, the legacy or per-thread stream, or a live one.
 * *dev is its device (the current one for the special streams). */
static cudaError_t check_stream(cudaStream_t s, const char *fn, int *dev)
{
    cudaError_t e = current(dev);
    if (e)
        return e;
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return cudaSuccess;
    if (!handle_check(s, STREAM_MAGIC, false)) {
        say("%s: stream %p is not a live stream", fn, (void *)s);
        return cudaErrorInvalidResourceHandle;
    }
    *dev = s->device;
    return sticky(s->device);
}

static cudaError_t stream_create(cudaStream_t *out, unsigned flags, int priority)
{
    if (!out)
        return ret(cudaErrorInvalidValue);
    int dev;
    cudaError_t e = current(&dev);
    if (e)
        return ret(e);
    if (flags & ~(unsigned)cudaStreamNonBlocking)
        return ret(cudaErrorInvalidValue);
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return ret(cudaErrorMemoryAllocation);
    *s = (struct CUstream_st){STREAM_MAGIC, dev, flags, priority < -5 ? -5 : priority > 0 ? 0 : priority};
    if (!handle_add(s)) {
        free(s);
        return ret(cudaErrorMemoryAllocation);
    }
    *out = s;
    return cudaSuccess;
}

API cudaError_t cudaStreamCreate(cudaStream_t *s) { return stream_create(s, 0, 0); }
API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    return stream_create(s, flags, 0);
}
API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority)
{
    return stream_create(s, flags, priority);
}

API cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return ret(cudaErrorInvalidResourceHandle);
    if (!handle_check(s, STREAM_MAGIC, true)) {
        say("cudaStreamDestroy: stream %p is not a live stream", (void *)s);
        return ret(cudaErrorInvalidResourceHandle);
    }
    s->magic = 0;
    free(s);
    return cudaSuccess;
}

API cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    int dev;
    return ret(check_stream(s, "cudaStreamSynchronize", &dev));
}

API cudaError_t cudaStreamQuery(cudaStream_t s)
{
    int dev;
    return ret(check_stream(s, "cudaStreamQuery", &dev));
}

static cudaError_t check_event(cudaEvent_t ev, const char *fn)
{
    if (!ev || !handle_check(ev, EVENT_MAGIC, false)) {
        say("%s: event %p is not a live event", fn, (void *)ev);
        return cudaErrorInvalidResourceHandle;
    }
    return cudaSuccess;
}

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    if (!out)
        return ret(cudaErrorInvalidValue);
    int dev;
    cudaError_t e = current(&dev);
    if (e)
        return ret(e);
    if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))
        return ret(cudaErrorInvalidValue);
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (!ev)
        return ret(cudaErrorMemoryAllocation);
    ev->magic = EVENT_MAGIC;
    ev->device = dev;
    ev->flags = flags;
    if (!handle_add(ev)) {
        free(ev);
        return ret(cudaErrorMemoryAllocation);
    }
    *out = ev;
    return cudaSuccess;
}

API cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, 0); }

API cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    if (!ev || !handle_check(ev, EVENT_MAGIC, true)) {
        say("cudaEventDestroy: event %p is not a live event", (void *)ev);
        return ret(cudaErrorInvalidResourceHandle);
    }
    ev->magic = 0;
    free(ev);
    return cudaSuccess;
}

API cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
    cudaError_t e = check_event(ev, "cudaEventRecord");
    int dev;
    if (!e)
        e = check_stream(s, "cudaEventRecord", &dev);
    if (e)
        return ret(e);
    if (dev != ev->device) {
        say("cudaEventRecord: event of device %d recorded on a stream of device %d", ev->device, dev);
        return ret(cudaErrorInvalidResourceHandle);
    }
    ev->recorded = true;
    clock_gettime(CLOCK_MONOTONIC, &ev->when);
    return cudaSuccess;
}

API cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    cudaError_t e = check_event(ev, "cudaEventQuery");
    if (!e)
        e = sticky(ev->device);
    return ret(e);
}

API cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    cudaError_t e = check_event(ev, "cudaEventSynchronize");
    if (!e)
        e = sticky(ev->device);
    return ret(e);
}

API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (!ms)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = check_event(a, "cudaEventElapsedTime");
    if (!e)
        e = check_event(b, "cudaEventElapsedTime");
    if (e)
        return ret(e);
    if ((a->flags | b->flags) & cudaEventDisableTiming)
        return ret(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded)
        return ret(cudaErrorInvalidResourceHandle);
    *ms = (float)((double)(b->when.tv_sec - a->when.tv_sec) * 1e3 +
                  (double)(b->when.tv_nsec - a->when.tv_nsec) / 1e6);
    return cudaSuccess;
}

API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags)
{
    int dev;
    cudaError_t e = check_stream(s, "cudaStreamWaitEvent", &dev);
    if (!e)
        e = check_event(ev, "cudaStreamWaitEvent");
    if (!e && flags & ~(unsigned)cudaEventWaitExternal)
        e = cudaErrorInvalidValue;
    return ret(e);
}

/* ---- memory (continued): copies, sets, pointer attributes ---------------------------- */

API cudaError_t cudaMalloc(void **p, size_t size) { return dev_malloc(p, size, "cudaMalloc"); }

API cudaError_t cudaFree(void *p)
{
    int dev;
    cudaError_t e = current(&dev);
    if (e)
        return ret(e);
    return dev_free(p, "cudaFree");
}

API cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s)
{
    int dev;
    cudaError_t e = check_stream(s, "cudaMallocAsync", &dev);
    if (e)
        return ret(e);
    return dev_malloc(p, size, "cudaMallocAsync");
}

API cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    int dev;
    cudaError_t e = check_stream(s, "cudaFreeAsync", &dev);
    if (e)
        return ret(e);
    return dev_free(p, "cudaFreeAsync");
}

/* [p, p + n) lies inside one live device allocation. */
static bool dev_range(const void *p, size_t n, const char *fn, const char *what)
{
    alloc a;
    if (!find_alloc(p, &a)) {
        say("%s: %s %p is not device memory", fn, what, p);
        return false;
    }
    if ((uintptr_t)p + n > a.base + a.size) {
        say("%s: %s [%p, +%zu) runs %zu bytes past the end of its %zu-byte device allocation", fn,
            what, p, n, (size_t)((uintptr_t)p + n - a.base - a.size), a.size);
        return false;
    }
    return true;
}

/* [p, p + n) is host memory: it touches no device allocation. */
static bool host_range(const void *p, size_t n, const char *fn, const char *what)
{
    uintptr_t u = (uintptr_t)p;
    pthread_mutex_lock(&g_mu);
    size_t i = upper(u + n - 1);
    bool clash = i > 0 && g_allocs[i - 1].base + g_allocs[i - 1].size > u;
    pthread_mutex_unlock(&g_mu);
    if (clash)
        say("%s: %s %p (%zu bytes) is device memory", fn, what, p, n);
    return !clash;
}

static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                        cudaStream_t s, const char *fn)
{
    int dev;
    cudaError_t e = check_stream(s, fn, &dev);
    if (e)
        return ret(e);
    if (n == 0)
        return cudaSuccess;
    if (!dst || !src)
        return ret(cudaErrorInvalidValue);
    alloc a;
    if (kind == cudaMemcpyDefault) {
        bool dd = find_alloc(dst, &a), sd = find_alloc(src, &a);
        kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    }
    bool ok;
    switch (kind) {
    case cudaMemcpyHostToHost:
        ok = host_range(dst, n, fn, "host destination") && host_range(src, n, fn, "host source");
        break;
    case cudaMemcpyHostToDevice:
        ok = dev_range(dst, n, fn, "destination") && host_range(src, n, fn, "host source");
        break;
    case cudaMemcpyDeviceToHost:
        ok = host_range(dst, n, fn, "host destination") && dev_range(src, n, fn, "source");
        break;
    case cudaMemcpyDeviceToDevice:
        ok = dev_range(dst, n, fn, "destination") && dev_range(src, n, fn, "source");
        break;
    default:
        return ret(cudaErrorInvalidMemcpyDirection);
    }
    if (!ok)
        return ret(cudaErrorInvalidValue);
    memmove(dst, src, n);
    return cudaSuccess;
}

/* 2-D copies: `height` rows of `width` bytes, each range checked as one span. */
static cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height, enum cudaMemcpyKind kind, cudaStream_t s, const char *fn)
{
    if (width == 0 || height == 0)
        return cudaSuccess;
    if ((height > 1 && (dpitch < width || spitch < width)))
        return ret(cudaErrorInvalidPitchValue);
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, s, fn);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                  size_t width, size_t height, enum cudaMemcpyKind kind,
                                  cudaStream_t s)
{
    return copy2d(dst, dpitch, src, spitch, width, height, kind, s, "cudaMemcpy2DAsync");
}

API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                             size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return copy2d(dst, dpitch, src, spitch, width, height, kind, NULL, "cudaMemcpy2D");
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return copy(dst, src, n, kind, NULL, "cudaMemcpy");
}

API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                cudaStream_t s)
{
    return copy(dst, src, n, kind, s, "cudaMemcpyAsync");
}

static cudaError_t set2d(void *p, size_t pitch, int value, size_t width, size_t height,
                         cudaStream_t s, const char *fn)
{
    int dev;
    cudaError_t e = check_stream(s, fn, &dev);
    if (e)
        return ret(e);
    if (width == 0 || height == 0)
        return cudaSuccess;
    if (height > 1 && pitch < width)
        return ret(cudaErrorInvalidPitchValue);
    if (!dev_range(p, (height - 1) * pitch + width, fn, "destination"))
        return ret(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++)
        memset((char *)p + r * pitch, value, width);
    return cudaSuccess;
}

API cudaError_t cudaMemset(void *p, int value, size_t n)
{
    return set2d(p, n, value, n, 1, NULL, "cudaMemset");
}

API cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
    return set2d(p, n, value, n, 1, s, "cudaMemsetAsync");
}

API cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height,
                                  cudaStream_t s)
{
    return set2d(p, pitch, value, width, height, s, "cudaMemset2DAsync");
}

API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p)
{
    if (!attr)
        return ret(cudaErrorInvalidValue);
    memset(attr, 0, sizeof *attr);
    alloc a;
    if (p && find_alloc(p, &a)) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = a.device;
        attr->devicePointer = (void *)p;
    } else {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2;
        attr->hostPointer = (void *)p;
    }
    return cudaSuccess;
}

/* ---- libraries and kernels --------------------------------------------------------- */

struct CUkern_st {
    unsigned magic;
    struct CUlib_st *lib;
    const cpc_emu_kernel *k;
    char name[128];
    int max_dyn_smem[MAX_DEV];      /* 0: not set (48 KiB) */
    struct CUkern_st *next;
};

struct CUlib_st {
    unsigned magic;
    cpc_emu_module *m;
    char hash[65];
    struct CUkern_st *kernels;
    pthread_mutex_t mu;
};

static void build_from_kernel_cache(const char *code, size_t len, const char *so_path);

API cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
                                    enum cudaJitOption *jitOptions, void **jitOptionsValues,
                                    unsigned int numJitOptions, enum cudaLibraryOption *libraryOptions,
                                    void **libraryOptionValues, unsigned int numLibraryOptions)
{
    (void)jitOptions;
    (void)jitOptionsValues;
    (void)libraryOptions;
    (void)libraryOptionValues;
    if (!library || !code)
        return ret(cudaErrorInvalidValue);
    *library = NULL;
    int dev;
    cudaError_t e = current(&dev);
    if (e)
        return ret(e);
    if (numJitOptions || numLibraryOptions) {
        say("cudaLibraryLoadData: JIT/library options are not emulated");
        return ret(cudaErrorNotSupported);
    }
    const unsigned char *b = code;
    if ((b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') ||
        (b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba)) {
        say("cudaLibraryLoadData: cubin/fatbin images are not emulated (PTX text only)");
        return ret(cudaErrorNotSupported);
    }
    size_t len = strlen(code);
    /* The driver JIT-compiles PTX for the device's arch or an older one; PTX
     * for a newer target (".target sm_100" on this sm_90 device) has no image. */
    const char *tg = strstr(code, ".target sm_");
    if (tg) {
        int arch = atoi(tg + strlen(".target sm_"));
        if (arch > 90) {
            say("cudaLibraryLoadData: PTX for sm_%d cannot run on this sm_90 device", arch);
            return ret(cudaErrorNoKernelImageForDevice);
        }
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(code, len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
        return ret(cudaErrorUnknown);
    struct CUlib_st *lib = calloc(1, sizeof *lib);
    if (!lib)
        return ret(cudaErrorMemoryAllocation);
    for (int i = 0; i < 32; i++)
        snprintf(lib->hash + 2 * i, 3, "%02x", md[i]);
    const char *dir = getenv("CPC_EMU_MODULES");
    if (!dir || !*dir) {
        say("cudaLibraryLoadData: CPC_EMU_MODULES is not set (the folder of the modules "
            "cpc_emu_prepare built; PTX sha256 %s)", lib->hash);
        free(lib);
        return ret(cudaErrorFileNotFound);
    }
    char path[4096], err[2048];
    snprintf(path, sizeof path, "%s/%s.so", dir, lib->hash);
    if (access(path, R_OK) != 0)
        build_from_kernel_cache(code, len, path);
    if (cpc_emu_module_load(path, &lib->m, err, sizeof err) != 0) {
        say("cudaLibraryLoadData: no emulator module for this PTX (%zu bytes): %s: %s "
            "(run cpc_emu_prepare on the artifact)", len, path, err);
        free(lib);
        return ret(cudaErrorFileNotFound);
    }
    lib->magic = LIB_MAGIC;
    pthread_mutex_init(&lib->mu, NULL);
    if (!handle_add(lib)) {
        cpc_emu_module_unload(lib->m);
        free(lib);
        return ret(cudaErrorMemoryAllocation);
    }
    *library = lib;
    return cudaSuccess;
}

/* A module missing from $CPC_EMU_MODULES for PTX that cpc compiled in this
 * process tree: cpc's kernel cache ($CPC_CACHE_DIR/kernels, or the default
 * place) keeps each PTX with its source (<hash>.ptx, <hash>.cu); find the PTX
 * equal to `code` and build its module into `so_path`.  Lets programs that
 * compile kernels themselves (cprun on a plan YAML, gpu_check) run on the
 * emulator without cpc_emu_prepare.  Best effort: on failure the load below
 * reports the missing module. */
/* PTX texts equal up to runs of blanks (spaces/tabs) and trailing blanks of
 * lines: the artifact stores PTX with tabs expanded (artifact.h, KERNELS),
 * the kernel cache as NVRTC wrote it. */
static bool same_ptx(const char *a, size_t na, const char *b, size_t nb)
{
    size_t i = 0, j = 0;
    for (;;) {
        bool ba = false, bb = false;
        while (i < na && (a[i] == ' ' || a[i] == '\t'))
            i++, ba = true;
        while (j < nb && (b[j] == ' ' || b[j] == '\t'))
            j++, bb = true;
        bool ea = i >= na || a[i] == '\n', eb = j >= nb || b[j] == '\n';
        if (!(ea && eb) && ba != bb)
            return false;   /* a blank run against none, inside a line */
        if (i >= na || j >= nb)
            return i >= na && j >= nb;
        if (a[i] != b[j])
            return false;
        i++, j++;
    }
}

static pthread_mutex_t g_build_mu = PTHREAD_MUTEX_INITIALIZER;

static void build_from_kernel_cache(const char *code, size_t len, const char *so_path)
{
    /* one build at a time (rank threads load the same modules at once); the
     * first builds, the others find the module */
    pthread_mutex_lock(&g_build_mu);
    if (access(so_path, R_OK) == 0) {
        pthread_mutex_unlock(&g_build_mu);
        return;
    }
    char dir[4096];
    const char *c = getenv("CPC_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (c && *c)
        snprintf(dir, sizeof dir, "%s/kernels", c);
    else if (x && *x)
        snprintf(dir, sizeof dir, "%s/cpc/kernels", x);
    else if (h && *h)
        snprintf(dir, sizeof dir, "%s/.cache/cpc/kernels", h);
    else {
        pthread_mutex_unlock(&g_build_mu);
        return;
    }
    DIR *d = opendir(dir);
    if (!d) {
        pthread_mutex_unlock(&g_build_mu);
        return;
    }
    struct dirent *e;
    char *source = NULL;
    while (!source && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".ptx") != 0)
            continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        long fsz = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = fsz > 0 ? malloc((size_t)fsz + 1) : NULL;
        size_t got = buf ? fread(buf, 1, (size_t)fsz, f) : 0;
        fclose(f);
        if (buf && got == (size_t)fsz && same_ptx(buf, got, code, len)) {
            snprintf(p, sizeof p, "%s/%.*s.cu", dir, (int)(n - 4), e->d_name);
            FILE *g = fopen(p, "rb");
            if (g) {
                fseek(g, 0, SEEK_END);
                long sz = ftell(g);
                fseek(g, 0, SEEK_SET);
                source = sz > 0 ? malloc((size_t)sz + 1) : NULL;
                if (source && fread(source, 1, (size_t)sz, g) == (size_t)sz)
                    source[sz] = 0;
                else {
                    free(source);
                    source = NULL;
                }
                fclose(g);
            }
        }
        free(buf);
    }
    closedir(d);
    if (!source) {
        pthread_mutex_unlock(&g_build_mu);
        return;
    }
    char err[4096], mods[4096];
    snprintf(mods, sizeof mods, "%s", so_path);
    char *slash = strrchr(mods, '/');
    if (slash && slash != mods) {
        *slash = 0;
        mkdir(mods, 0755);   /* $CPC_EMU_MODULES may not exist yet */
    }
    if (cpc_emu_build_module(source, so_path, err, sizeof err) != 0)
        say("cudaLibraryLoadData: building the module from the kernel cache failed: %s", err);
    free(source);
    pthread_mutex_unlock(&g_build_mu);
}

API cudaError_t cudaLibraryGetKernel(cudaKernel_t *out, cudaLibrary_t lib, const char *name)
{
    if (!out || !name)
        return ret(cudaErrorInvalidValue);
    *out = NULL;
    if (!lib || !handle_check(lib, LIB_MAGIC, false))
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&lib->mu);
    struct CUkern_st *k = lib->kernels;
    while (k && strcmp(k->name, name) != 0)
        k = k->next;
    cudaError_t e = cudaSuccess;
    if (!k) {
        const cpc_emu_kernel *ek = cpc_emu_module_kernel(lib->m, name);
        if (!ek || strlen(name) >= sizeof k->name) {
            e = cudaErrorSymbolNotFound;
        } else if (!(k = calloc(1, sizeof *k))) {
            e = cudaErrorMemoryAllocation;
        } else {
            k->magic = KERNEL_MAGIC;
            k->lib = lib;
            k->k = ek;
            snprintf(k->name, sizeof k->name, "%s", name);
            if (!handle_add(k)) {
                free(k);
                k = NULL;
                e = cudaErrorMemoryAllocation;
            } else {
                k->next = lib->kernels;
                lib->kernels = k;
            }
        }
    }
    pthread_mutex_unlock(&lib->mu);
    if (e)
        return ret(e);
    *out = k;
    return cudaSuccess;
}

API cudaError_t cudaLibraryUnload(cudaLibrary_t lib)
{
    if (!lib || !handle_check(lib, LIB_MAGIC, true))
        return ret(cudaErrorInvalidResourceHandle);
    struct CUkern_st *k = lib->kernels;
    while (k) {
        struct CUkern_st *n = k->next;
        handle_check(k, KERNEL_MAGIC, true);
        k->magic = 0;
        free(k);
        k = n;
    }
    cpc_emu_module_unload(lib->m);
    pthread_mutex_destroy(&lib->mu);
    lib->magic = 0;
    free(lib);
    return cudaSuccess;
}

API cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t k, enum cudaFuncAttribute attr,
                                                int value, int device)
{
    if (!k || !handle_check(k, KERNEL_MAGIC, false))
        return ret(cudaErrorInvalidResourceHandle);
    int n = device_count();
    if (device < 0 || device >= n)
        return ret(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || value > SMEM_OPTIN) {
            say("cudaKernelSetAttributeForDevice(%s): %d bytes of dynamic shared memory: more "
                "than sm_90's %d", k->name, value, SMEM_OPTIN);
            return ret(cudaErrorInvalidValue);
        }
        pthread_mutex_lock(&k->lib->mu);
        k->max_dyn_smem[device] = value;
        pthread_mutex_unlock(&k->lib->mu);
        return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        return value < -1 || value > 100 ? ret(cudaErrorInvalidValue) : cudaSuccess;
    default:
        say("cudaKernelSetAttributeForDevice(%s): attribute %d is not emulated", k->name, (int)attr);
        return ret(cudaErrorNotSupported);
    }
}

API cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                                 size_t smem, cudaStream_t s)
{
    struct CUkern_st *k = (struct CUkern_st *)func;
    if (!k || !handle_check(k, KERNEL_MAGIC, false)) {
        say("cudaLaunchKernel: %p is not a kernel from cudaLibraryGetKernel", func);
        return ret(cudaErrorInvalidDeviceFunction);
    }
    int dev;
    cudaError_t e = check_stream(s, "cudaLaunchKernel", &dev);
    if (e)
        return ret(e);
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread && dev != t_device) {
        say("cudaLaunchKernel(%s): stream of device %d, current device %d", k->name, dev, t_device);
        return ret(cudaErrorInvalidResourceHandle);
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 ||
        block.z == 0 || (unsigned long long)block.x * block.y * block.z > 1024 || block.x > 1024 ||
        block.y > 1024 || block.z > 64 || grid.x > 2147483647u || grid.y > 65535 ||
        grid.z > 65535) {
        say("cudaLaunchKernel(%s): grid (%u, %u, %u) x block (%u, %u, %u) is not a valid "
            "configuration", k->name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return ret(cudaErrorInvalidConfiguration);
    }
    pthread_mutex_lock(&k->lib->mu);
    int attr = k->max_dyn_smem[dev];
    pthread_mutex_unlock(&k->lib->mu);
    size_t limit = attr > 0 ? (size_t)attr : SMEM_DEFAULT;
    if (smem > limit) {
        say("cudaLaunchKernel(%s): %zu bytes of dynamic shared memory, more than the %zu %s", k->name,
            smem, limit, attr > 0 ? "set with cudaFuncAttributeMaxDynamicSharedMemorySize"
                                  : "allowed without cudaFuncAttributeMaxDynamicSharedMemorySize");
        return ret(cudaErrorInvalidValue);
    }
    if (!args) {
        say("cudaLaunchKernel(%s): args is NULL", k->name);
        return ret(cudaErrorInvalidValue);
    }
    char err[4096];
    cpc_emu_dim3 g = {grid.x, grid.y, grid.z}, b = {block.x, block.y, block.z};
    if (cpc_emu_launch(k->k, g, b, smem, args, err, sizeof err) != 0) {
        say("kernel %s, grid (%u, %u, %u) x block (%u, %u, %u), %zu bytes of dynamic shared "
            "memory: %s", k->name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, err);
        pthread_mutex_lock(&g_mu);
        g_sticky[dev] = cudaErrorLaunchFailure;
        pthread_mutex_unlock(&g_mu);
        return ret(cudaErrorLaunchFailure);
    }
    return cudaSuccess;
}
