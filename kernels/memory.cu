// memory.cu - the memory-bound kernels of the CUDA backend (template).
//
// The compiler (compiler/codegen.c) prepends the specialisation constants
//   CPC_DTYPE      element type of Q/K/V/O: __nv_bfloat16, __half or float
//   CPC_DTYPE_ID   0 bf16, 1 fp16, 2 fp32
//   CPC_HEAD_DIM   head_dim (D)
// and compiles the result with NVRTC.  Lengths, offsets and strides are
// kernel ARGUMENTS, never constants, so a new resolution reuses the module.
// Layouts: BSHD tensors, LSE [B, H, S] fp32 (natural log); strides in elements.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef INFINITY  // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif

__device__ __forceinline__ float cpc_to_f32(float x) { return x; }
__device__ __forceinline__ float cpc_to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float cpc_to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T cpc_from_f32(float x);
template <> __device__ __forceinline__ float cpc_from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half cpc_from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 cpc_from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Strided 4-D copy (all-to-all pack/unpack, head selection): for b < nb,
// t < nt, h < nh: dst[b*dbs + t*dts + h*dhs + i] = src[b*sbs + t*sts + h*shs + i]
// for i < inner.  Elements of CPC_DTYPE (use cpc_copy_strided_f32 for ACC/LSE).
// One thread per 16-byte vector when aligned, else per element.
template <typename T>
__device__ void copy_strided(T *__restrict__ dst, const T *__restrict__ src, long long nb,
                             long long nt, long long nh, long long inner, long long dbs,
                             long long dts, long long dhs, long long sbs, long long sts,
                             long long shs)
{
    long long rows = nb * nt * nh;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        long long h = row % nh, t = (row / nh) % nt, b = row / (nh * nt);
        const T *s = src + b * sbs + t * sts + h * shs;
        T *d = dst + b * dbs + t * dts + h * dhs;
        const int vec = 16 / (int)sizeof(T);
        bool aligned = (((unsigned long long)s | (unsigned long long)d) % 16 == 0) && inner % vec == 0;
        if (aligned) {
            const int4 *s4 = reinterpret_cast<const int4 *>(s);
            int4 *d4 = reinterpret_cast<int4 *>(d);
            for (long long i = threadIdx.x; i < inner / vec; i += blockDim.x)
                d4[i] = s4[i];
        } else {
            for (long long i = threadIdx.x; i < inner; i += blockDim.x)
                d[i] = s[i];
        }
    }
}

extern "C" __global__ void cpc_copy_strided(CPC_DTYPE *dst, const CPC_DTYPE *src, long long nb,
                                            long long nt, long long nh, long long inner,
                                            long long dbs, long long dts, long long dhs,
                                            long long sbs, long long sts, long long shs)
{
    copy_strided<CPC_DTYPE>(dst, src, nb, nt, nh, inner, dbs, dts, dhs, sbs, sts, shs);
}

extern "C" __global__ void cpc_copy_strided_f32(float *dst, const float *src, long long nb,
                                                long long nt, long long nh, long long inner,
                                                long long dbs, long long dts, long long dhs,
                                                long long sbs, long long sts, long long shs)
{
    copy_strided<float>(dst, src, nb, nt, nh, inner, dbs, dts, dhs, sbs, sts, shs);
}

// LSE merge in fp32 (ring attention): for every (b, s, h):
//   m = max(a, c); lse' = m + log(e^(a-m) + e^(c-m))
//   acc' = e^(a-lse') acc + e^(c-lse') o
// Rows where both LSEs are -inf stay (0, -inf).  A NaN LSE (a row with a NaN
// score) makes the row NaN: m = a > c ? a : c is NaN when c is (fmaxf would
// drop it, and with a = -inf the NaN block would be skipped as empty), and a
// NaN a reaches lse' and acc' through e^(a-m) unless c = -inf (acc kept, NaN).
// acc/o [B, S, H, D];
// acc_lse/lse [B, H, S].  One warp per (b, s, h) row.
extern "C" __global__ void cpc_merge_lse(float *acc, float *acc_lse, const float *o,
                                         const float *lse, int B, long long S, int H)
{
    const int D = CPC_HEAD_DIM;
    long long rows = (long long)B * S * H;
    long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    long long nwarps = (gridDim.x * (long long)blockDim.x) / 32;
    for (long long row = warp; row < rows; row += nwarps) {
        int h = (int)(row % H);
        long long s = (row / H) % S;
        long long b = row / ((long long)H * S);
        long long li = (b * H + h) * S + s;
        float a = acc_lse[li], c = lse[li];
        float m = a > c ? a : c;
        if (m == -INFINITY)
            continue;
        // Weights from the difference of the two LSEs only (the larger gets
        // e^0 = 1 exactly), so they sum to 1 whatever the rounding of the new
        // LSE; precise expf/log1pf (the fast intrinsics lose digits when |LSE|
        // is large, e.g. ill-conditioned fp32 logits).
        float ea = a == m ? 1.0f : expf(a - m), ec = c == m ? 1.0f : expf(c - m);
        float inv = 1.0f / (ea + ec);
        float wa = ea * inv, wc = ec * inv;
        float *ar = acc + row * D;
        const float *orow = o + row * D;
        for (int i = lane; i < D; i += 32)
            ar[i] = wa * ar[i] + wc * orow[i];
        __syncwarp();  // every lane has read acc_lse[li] before lane 0 overwrites it
        if (lane == 0)
            acc_lse[li] = m + log1pf(a == m ? ec : ea);
    }
}

// acc = 0 (n_acc floats), lse = -inf (n_lse floats).
extern "C" __global__ void cpc_init_acc(float *acc, long long n_acc, float *lse, long long n_lse)
{
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_acc; i += stride)
        acc[i] = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_lse; i += stride)
        lse[i] = -INFINITY;
}

// fp32 -> CPC_DTYPE (round to nearest even) and back, n elements.
extern "C" __global__ void cpc_convert_from_f32(CPC_DTYPE *dst, const float *src, long long n)
{
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = cpc_from_f32<CPC_DTYPE>(src[i]);
}

extern "C" __global__ void cpc_convert_to_f32(float *dst, const CPC_DTYPE *src, long long n)
{
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = cpc_to_f32(src[i]);
}

// fp32 strided accumulate (backend.h add_strided): for b < nb, t < nt, h < nh,
// i < inner: dst[b*dbs + t*dts + h*dhs + i] += src[b*sbs + t*sts + h*shs + i]
// (strides in floats; dst and src do not overlap).  One thread per element,
// grid-stride over all nb*nt*nh*inner of them, so a single long row (the
// executor's plain sums) spreads over the whole grid.
extern "C" __global__ void cpc_add_strided_f32(float *dst, const float *src, long long nb,
                                               long long nt, long long nh, long long inner,
                                               long long dbs, long long dts, long long dhs,
                                               long long sbs, long long sts, long long shs)
{
    const long long total = nb * nt * nh * inner;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total; e += stride) {
        long long row = e / inner, i = e % inner;
        long long h = row % nh, t = (row / nh) % nt, b = row / (nh * nt);
        dst[b * dbs + t * dts + h * dhs + i] += src[b * sbs + t * sts + h * shs + i];
    }
}
