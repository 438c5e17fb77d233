// cuda_emu.h - the CUDA device API as seen by cpc's kernel templates,
// implemented on the CPU for the test emulator (tests/emu/emu.h).
// Force-included (-include) before a generated module; cuda_bf16.h,
// cuda_fp16.h and mma.h in this directory only include it.
//
// Model: every CUDA thread is a fiber; the emulator switches fibers only
// inside the barrier functions below, so code between two barriers runs
// atomically per thread, in an order the emulator chooses (forward or
// reverse).  Static __shared__ variables are static thread_local (shared by
// the fibers of one launch, which run on one OS thread); dynamic shared memory
// is CPC_DYNAMIC_SMEM (see kernels/attention.cu).
#ifndef CPC_CUDA_EMU_H
#define CPC_CUDA_EMU_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstddef>
#include <type_traits>
#include <utility>

#define CPC_EMU 1

// ---- qualifiers -------------------------------------------------------------
#ifdef CPC_EMU_SCAN
#define __global__ CPC_EMU_GLOBAL_MARK
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __constant__ static
#define CPC_DYNAMIC_SMEM(type, name) type *name = static_cast<type *>(cpc_emu_dynamic_smem())

// ---- runtime entry points (tests/emu/emu.cpp) ------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };

struct cpc_emu_thread_view {
    uint3 threadIdx;
    uint3 blockIdx;
    dim3 blockDim;
    dim3 gridDim;
    unsigned lane;       // linear thread index % 32
    unsigned warp;       // linear thread index / 32
};

extern "C" {
const cpc_emu_thread_view *cpc_emu_self(void);
void *cpc_emu_dynamic_smem(void);
void cpc_emu_syncthreads(void);
// Warp barrier of kind `kind` (a collective id; lanes must agree) over `mask`.
void cpc_emu_warp_barrier(int kind, unsigned mask);
// Per-warp exchange slots (one 8-byte value per lane) for shuffles.
uint64_t *cpc_emu_warp_slots(void);
// All lanes of the warp exchange `bytes` (<= 64) bytes: lane l's data lands
// at all + l * bytes.  A full-warp collective (like mma.sync).
void cpc_emu_warp_exchange(const void *mine, unsigned bytes, void *all);
void cpc_emu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
}

enum { CPC_EMU_K_SYNCWARP = 1, CPC_EMU_K_SHFL, CPC_EMU_K_SHFL_OUT, CPC_EMU_K_WMMA_LOAD,
       CPC_EMU_K_WMMA_MMA, CPC_EMU_K_WMMA_STORE, CPC_EMU_K_MMA_SYNC, CPC_EMU_K_MMA_SYNC_OUT };

#define threadIdx (cpc_emu_self()->threadIdx)
#define blockIdx (cpc_emu_self()->blockIdx)
#define blockDim (cpc_emu_self()->blockDim)
#define gridDim (cpc_emu_self()->gridDim)
#define warpSize 32

inline void __syncthreads(void) { cpc_emu_syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cpc_emu_warp_barrier(CPC_EMU_K_SYNCWARP, mask); }

// ---- shuffles ----------------------------------------------------------------------
template <typename T> inline T cpc_emu_shfl(unsigned mask, T v, int src_lane)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle type");
    uint64_t *slots = cpc_emu_warp_slots();
    unsigned lane = cpc_emu_self()->lane;
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    slots[lane] = bits;
    cpc_emu_warp_barrier(CPC_EMU_K_SHFL, mask);
    if (src_lane < 0 || src_lane > 31 || !(mask >> src_lane & 1u))
        src_lane = (int)lane;   // reading an inactive lane: undefined on a GPU; keep own
    bits = slots[src_lane];
    cpc_emu_warp_barrier(CPC_EMU_K_SHFL_OUT, mask);
    T r;
    std::memcpy(&r, &bits, sizeof r);
    return r;
}
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    int lane = (int)cpc_emu_self()->lane;
    return cpc_emu_shfl(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32)
{
    int lane = (int)cpc_emu_self()->lane;
    int src = lane ^ lm;
    if ((src & ~(width - 1)) != (lane & ~(width - 1)))
        src = lane;
    return cpc_emu_shfl(mask, v, src);
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    int lane = (int)cpc_emu_self()->lane;
    int src = lane + (int)d;
    if ((src & ~(width - 1)) != (lane & ~(width - 1)))
        src = lane;
    return cpc_emu_shfl(mask, v, src);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    int lane = (int)cpc_emu_self()->lane;
    int src = lane - (int)d;
    if (src < (lane & ~(width - 1)))
        src = lane;
    return cpc_emu_shfl(mask, v, src);
}

// ---- math ------------------------------------------------------------------------------
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

// ---- fp16 / bf16 (round to nearest even, like __float2half_rn / __float2bfloat16_rn) ----
struct __half {
    uint16_t x;
    __half() = default;
    __half(float f) { _Float16 h = (_Float16)f; std::memcpy(&x, &h, 2); }
    operator float() const { _Float16 h; std::memcpy(&h, &x, 2); return (float)h; }
};
struct __nv_bfloat16 {
    uint16_t x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f)
    {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            x = (uint16_t)((u >> 16) | 0x40u);      // quiet NaN
        else
            x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    operator float() const { uint32_t u = (uint32_t)x << 16; float f; std::memcpy(&f, &u, 4); return f; }
};
typedef __half half;
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 h; h.x = u; return h; }
inline __half __ushort_as_half(unsigned short u) { __half h; h.x = u; return h; }
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half(float f) { return __half(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }

// ---- wmma (tensor cores) ------------------------------------------------------------
// A fragment holds the whole tile in every lane (row-major logical order).
// Collectives wait for every lane of the warp first, as the *_sync functions
// do.  Accumulator element e belongs to lane e % 32: mma_sync computes and
// store_matrix_sync writes only the lane's own elements, so every element is
// computed and stored exactly once per warp (as on the hardware), and code
// that forgets a __syncwarp between a store and another lane's read changes
// with the fiber order.
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct cpc_emu_shape;
template <int M, int N, int K> struct cpc_emu_shape<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct cpc_emu_shape<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct cpc_emu_shape<accumulator, M, N, K> { enum { rows = M, cols = N }; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> class fragment {
  public:
    enum { rows = cpc_emu_shape<Use, M, N, K>::rows, cols = cpc_emu_shape<Use, M, N, K>::cols,
           num_elements = rows * cols };
    typedef T element_type;
    T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const T &v)
{
    for (int i = 0; i < f.num_elements; i++)
        f.x[i] = v;
}
template <typename Use, int M, int N, int K, typename T, typename L, typename V>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const V &v)
{
    for (int i = 0; i < f.num_elements; i++)
        f.x[i] = T(v);
}

template <typename Use, int M, int N, int K, typename T, typename L>
inline void cpc_emu_load(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm, bool col)
{
    cpc_emu_warp_barrier(CPC_EMU_K_WMMA_LOAD, 0xffffffffu);
    typedef fragment<Use, M, N, K, T, L> F;
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.x[r * F::cols + c] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
}
template <typename Use, int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major> &f, const T *p, unsigned ldm)
{
    cpc_emu_load(f, p, ldm, false);
}
template <typename Use, int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major> &f, const T *p, unsigned ldm)
{
    cpc_emu_load(f, p, ldm, true);
}
template <int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const T *p, unsigned ldm,
                             layout_t layout)
{
    cpc_emu_load(f, p, ldm, layout == mem_col_major);
}

template <int M, int N, int K, typename Tab, typename La, typename Lb, typename Tc>
inline void mma_sync(fragment<accumulator, M, N, K, Tc> &d, const fragment<matrix_a, M, N, K, Tab, La> &a,
                     const fragment<matrix_b, M, N, K, Tab, Lb> &b,
                     const fragment<accumulator, M, N, K, Tc> &c)
{
    cpc_emu_warp_barrier(CPC_EMU_K_WMMA_MMA, 0xffffffffu);
    unsigned lane = cpc_emu_self()->lane;
    for (int e = (int)lane; e < M * N; e += 32) {
        int i = e / N, j = e % N;
        float s = (float)c.x[e];
        for (int k = 0; k < K; k++)
            s += (float)a.x[i * K + k] * (float)b.x[k * N + j];
        d.x[e] = Tc(s);
    }
}

template <int M, int N, int K, typename T>
inline void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm,
                              layout_t layout)
{
    cpc_emu_warp_barrier(CPC_EMU_K_WMMA_STORE, 0xffffffffu);
    unsigned lane = cpc_emu_self()->lane;
    for (int e = (int)lane; e < M * N; e += 32) {
        int i = e / N, j = e % N;
        if (layout == mem_col_major)
            p[(size_t)j * ldm + i] = f.x[e];
        else
            p[(size_t)i * ldm + j] = f.x[e];
    }
}
} // namespace wmma
} // namespace nvcuda

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 ----------
// d (4 floats per lane) += A (16x16) * B (16x8), with the fragment layouts of
// the PTX ISA (groupID g = lane >> 2, t = lane % 4; lower 16 bits of a
// register = the lower-indexed element):
//   A: a_i (i = 0..7, register i / 2): row g for i in {0,1,4,5}, else g + 8;
//      col 2t + (i & 1), + 8 for i >= 4.
//   B: b_i (i = 0..3, register i / 2): row (k) 2t + (i & 1), + 8 for i >= 2;
//      col (n) g.
//   C/D: c_i (i = 0..3): row g for i < 2, else g + 8; col 2t + (i & 1).
// Every lane rebuilds the whole A, B and C from all lanes' registers and
// computes its own four d elements (products summed in fp32, in k order).
template <typename T> inline void cpc_emu_mma_m16n8k16(float *d, const unsigned *a, const unsigned *b)
{
    struct lane_regs {
        unsigned a[4], b[2];
        float c[4];
    } mine, all[32];
    for (int i = 0; i < 4; i++) {
        mine.a[i] = a[i];
        mine.c[i] = d[i];
    }
    mine.b[0] = b[0];
    mine.b[1] = b[1];
    cpc_emu_warp_exchange(&mine, sizeof mine, all);
    float A[16][16], Bm[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 8; i++) {
            T e;
            e.x = (unsigned short)(all[l].a[i / 2] >> (16 * (i & 1)));
            A[(i % 4) < 2 ? g : g + 8][2 * t + (i & 1) + (i >= 4 ? 8 : 0)] = (float)e;
        }
        for (int i = 0; i < 4; i++) {
            T e;
            e.x = (unsigned short)(all[l].b[i / 2] >> (16 * (i & 1)));
            Bm[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = (float)e;
            C[i < 2 ? g : g + 8][2 * t + (i & 1)] = all[l].c[i];
        }
    }
    int lane = (int)cpc_emu_self()->lane, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        int r = i < 2 ? g : g + 8, c = 2 * t + (i & 1);
        float s = C[r][c];
        for (int kk = 0; kk < 16; kk++)
            s += A[r][kk] * Bm[kk][c];
        d[i] = s;
    }
}

// ---- kernel registration (appended to a module by the emulator's build step) ----
typedef void (*cpc_emu_invoke_fn)(void **args);
struct cpc_emu_kernel_entry {
    const char *name;
    cpc_emu_invoke_fn invoke;
};
template <typename... A, std::size_t... I>
inline void cpc_emu_call_impl(void (*f)(A...), void **args, std::index_sequence<I...>)
{
    f(*static_cast<typename std::remove_reference<A>::type *>(args[I])...);
}
template <typename... A> inline void cpc_emu_call(void (*f)(A...), void **args)
{
    cpc_emu_call_impl(f, args, std::index_sequence_for<A...>{});
}

#endif
