// attention.cu - attention forward with LSE output (template), for when
// cuDNN cannot serve a block (or --attention nvrtc).
//
// Prepended by compiler/codegen.c (the specialisation: what changes the code):
//   CPC_DTYPE, CPC_DTYPE_ID (0 bf16, 1 fp16, 2 fp32), CPC_HEAD_DIM (D),
//   CPC_CAUSAL (0/1), CPC_GQA (H / Hkv).
// Sequence lengths, head offsets, strides and positions are ARGUMENTS.
//
// Shapes (BSHD): q [B, sq, hq, D] with batch stride q_bstride (elements),
// k/v [B, skv, hkv, D] with batch stride kv_bstride; o [B, sq, hq, D] fp32
// contiguous; lse [B, hq, sq] fp32 (natural log).  Query head h is global
// head q_head_off + h and reads local K/V head (q_head_off + h) / CPC_GQA -
// kv_head_off.  q_pos / kv_pos (int64 global token positions, or NULL =
// index) drive the causal mask (key pos <= query pos) and the key-padding
// mask kv_mask [B, mask_len] (u8, 1 = key takes part, NULL = none).  A row
// that sees no key gets o = 0 and lse = -inf.
//
// Two kernels:
//  cpc_flash_attn_tc : bf16/fp16, D % 16 == 0.  FlashAttention-2 style: a block
//      of 4 warps owns 64 query rows of one (b, head); K/V tiles of BLOCK_N
//      keys are staged in shared memory; S = Q K^T and P V on tensor cores
//      (wmma 16x16x16, fp32 accumulate); online softmax in fp32 with two lanes
//      per row; the output accumulator lives in shared memory.  Dynamic shared
//      memory: cpc_flash_attn_tc_smem_bytes() in the host code mirrors
//      smem_bytes() below.
//  cpc_attn_rowwarp  : any dtype and D (fp32 without TF32, to meet 1e-5):
//      one warp per query row, lanes split D, online softmax per key.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef INFINITY  // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif
#include <mma.h>

// Dynamic shared memory; the CPU emulator of the tests (tests/emu) defines
// its own version of this macro.
#ifndef CPC_DYNAMIC_SMEM
#define CPC_DYNAMIC_SMEM(type, name) extern __shared__ __align__(128) type name[]
#endif

#ifndef CPC_HEAD_DIM
#error "CPC_HEAD_DIM must be defined by the code generator"
#endif

__device__ __forceinline__ float cpc_load_f32(float x) { return x; }
__device__ __forceinline__ float cpc_load_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float cpc_load_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ bool cpc_key_masked(long long qp, long long kp, int b,
                                               const unsigned char *kv_mask, long long mask_len)
{
#if CPC_CAUSAL
    if (kp > qp)
        return true;
#endif
    if (kv_mask && (kp < 0 || kp >= mask_len || kv_mask[(long long)b * mask_len + kp] == 0))
        return true;
    return false;
}

// ---------------------------------------------------------------------------
// Generic kernel: one warp per query row.
#define CPC_RW_PER_LANE ((CPC_HEAD_DIM + 31) / 32)

extern "C" __global__ void __launch_bounds__(128)
cpc_attn_rowwarp(const CPC_DTYPE *__restrict__ q, const CPC_DTYPE *__restrict__ k,
                 const CPC_DTYPE *__restrict__ v, float *__restrict__ o, float *__restrict__ lse,
                 int B, long long sq, long long skv, int hq, int hkv, int q_head_off,
                 int kv_head_off, long long q_bstride, long long kv_bstride, float scale,
                 const long long *__restrict__ q_pos, const long long *__restrict__ kv_pos,
                 const unsigned char *__restrict__ kv_mask, long long mask_len)
{
    const int D = CPC_HEAD_DIM;
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int h = blockIdx.y, b = blockIdx.z;
    if (row >= sq || b >= B)
        return;
    int kvh = (q_head_off + h) / CPC_GQA - kv_head_off;
    const CPC_DTYPE *qr = q + b * q_bstride + (row * hq + h) * (long long)D;
    float qv[CPC_RW_PER_LANE], acc[CPC_RW_PER_LANE];
#pragma unroll
    for (int i = 0; i < CPC_RW_PER_LANE; i++) {
        int d = lane + 32 * i;
        qv[i] = d < D ? cpc_load_f32(qr[d]) * scale : 0.0f;
        acc[i] = 0.0f;
    }
    long long qp = q_pos ? q_pos[row] : row;
    float m = -INFINITY, l = 0.0f;
    for (long long n = 0; n < skv; n++) {
        long long kp = kv_pos ? kv_pos[n] : n;
        if (cpc_key_masked(qp, kp, b, kv_mask, mask_len))
            continue;
        const CPC_DTYPE *kr = k + b * kv_bstride + (n * hkv + kvh) * (long long)D;
        const CPC_DTYPE *vr = v + b * kv_bstride + (n * hkv + kvh) * (long long)D;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < CPC_RW_PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < D)
                dot += qv[i] * cpc_load_f32(kr[d]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
        float m_new = fmaxf(m, dot);
        float alpha = __expf(m - m_new);
        float p = __expf(dot - m_new);
        l = l * alpha + p;
#pragma unroll
        for (int i = 0; i < CPC_RW_PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < D)
                acc[i] = acc[i] * alpha + p * cpc_load_f32(vr[d]);
        }
        m = m_new;
    }
    float *orow = o + ((long long)b * sq * hq + row * hq + h) * D;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < CPC_RW_PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < D)
            orow[d] = acc[i] * inv;
    }
    if (lane == 0)
        lse[((long long)b * hq + h) * sq + row] = l > 0.0f ? m + __logf(l) : -INFINITY;
}

// ---------------------------------------------------------------------------
// Tensor-core kernel (bf16/fp16, D % 16 == 0).
#if CPC_DTYPE_ID != 2 && (CPC_HEAD_DIM % 16) == 0

#define TC_BM 64                                   // query rows per block (4 warps x 16)
#define TC_BN (CPC_HEAD_DIM > 128 ? 32 : 64)       // keys per tile
#define TC_LD (CPC_HEAD_DIM + 8)                   // smem row pitch of Q/K/V (elements)
#define TC_SLD ((TC_BN > CPC_HEAD_DIM ? TC_BN : CPC_HEAD_DIM) + 4) // fp32 scratch pitch
#define TC_PLD (TC_BN + 8)                         // P pitch
#define TC_OLD (CPC_HEAD_DIM + 4)                  // O accumulator pitch

using namespace nvcuda;

extern "C" __global__ void __launch_bounds__(128)
cpc_flash_attn_tc(const CPC_DTYPE *__restrict__ q, const CPC_DTYPE *__restrict__ k,
                  const CPC_DTYPE *__restrict__ v, float *__restrict__ o, float *__restrict__ lse,
                  int B, long long sq, long long skv, int hq, int hkv, int q_head_off,
                  int kv_head_off, long long q_bstride, long long kv_bstride, float scale,
                  const long long *__restrict__ q_pos, const long long *__restrict__ kv_pos,
                  const unsigned char *__restrict__ kv_mask, long long mask_len)
{
    const int D = CPC_HEAD_DIM;
    CPC_DYNAMIC_SMEM(unsigned char, smem_raw);
    CPC_DTYPE *Qs = reinterpret_cast<CPC_DTYPE *>(smem_raw);
    CPC_DTYPE *Ks = Qs + TC_BM * TC_LD;
    CPC_DTYPE *Vs = Ks + TC_BN * TC_LD;
    float *scratch_all = reinterpret_cast<float *>(Vs + TC_BN * TC_LD);
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    float *Sb = scratch_all + warp * (16 * TC_SLD);               // per-warp fp32 scratch
    float *Os = scratch_all + 4 * 16 * TC_SLD + warp * (16 * TC_OLD);
    CPC_DTYPE *Ps = reinterpret_cast<CPC_DTYPE *>(scratch_all + 4 * 16 * TC_SLD + 4 * 16 * TC_OLD) +
                    warp * (16 * TC_PLD);
#if CPC_CAUSAL
    __shared__ long long s_qmax;  // largest query position of the block
#endif

    int h = blockIdx.y, b = blockIdx.z;
    long long m0 = (long long)blockIdx.x * TC_BM;
    int kvh = (q_head_off + h) / CPC_GQA - kv_head_off;
    const long long q_row_stride = (long long)hq * D, kv_row_stride = (long long)hkv * D;

    // Q tile -> smem (zero rows past sq); O accumulator = 0.
    for (int i = threadIdx.x; i < TC_BM * D; i += blockDim.x) {
        int r = i / D, c = i % D;
        long long row = m0 + r;
        Qs[r * TC_LD + c] = row < sq ? q[b * q_bstride + row * q_row_stride + (long long)h * D + c]
                                     : (CPC_DTYPE)0.0f;
    }
    for (int i = lane; i < 16 * D; i += 32)
        Os[(i / D) * TC_OLD + i % D] = 0.0f;
#if CPC_CAUSAL
    if (threadIdx.x == 0) {
        long long mx = -1;
        for (long long r = m0; r < m0 + TC_BM && r < sq; r++) {
            long long p = q_pos ? q_pos[r] : r;
            mx = p > mx ? p : mx;
        }
        s_qmax = mx;
    }
#endif
    __syncthreads();

    // Two lanes per query row: row = lane / 2, half = lane & 1.
    int my_row = lane >> 1, half = lane & 1;
    long long grow = m0 + warp * 16 + my_row;
    long long qp = grow < sq ? (q_pos ? q_pos[grow] : grow) : -1;
    float m = -INFINITY, l = 0.0f;

    for (long long n0 = 0; n0 < skv; n0 += TC_BN) {
#if CPC_CAUSAL
        // Skip a tile whose every key is after every query of the block.
        long long kmin = kv_pos ? kv_pos[n0] : n0;
        if (kv_pos)
            for (long long n = n0 + 1; n < n0 + TC_BN && n < skv; n++)
                kmin = kv_pos[n] < kmin ? kv_pos[n] : kmin;
        if (kmin > s_qmax)
            continue;  // uniform across the block: every thread computed the same kmin
#endif
        __syncthreads();
        for (int i = threadIdx.x; i < TC_BN * D; i += blockDim.x) {
            int r = i / D, c = i % D;
            long long n = n0 + r;
            bool in = n < skv;
            long long off = b * kv_bstride + n * kv_row_stride + (long long)kvh * D + c;
            Ks[r * TC_LD + c] = in ? k[off] : (CPC_DTYPE)0.0f;
            Vs[r * TC_LD + c] = in ? v[off] : (CPC_DTYPE)0.0f;
        }
        __syncthreads();

        // S = Q_w K^T  (16 x TC_BN) into Sb.
        for (int j = 0; j < TC_BN / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.0f);
            for (int kk = 0; kk < D / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, CPC_DTYPE, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, CPC_DTYPE, wmma::col_major> bt;
                wmma::load_matrix_sync(a, Qs + (warp * 16) * TC_LD + kk * 16, TC_LD);
                wmma::load_matrix_sync(bt, Ks + (j * 16) * TC_LD + kk * 16, TC_LD);
                wmma::mma_sync(c, a, bt, c);
            }
            wmma::store_matrix_sync(Sb + j * 16, c, TC_SLD, wmma::mem_row_major);
        }
        __syncwarp();

        // Online softmax on this lane's half row.
        const int cols = TC_BN / 2;
        float *srow = Sb + my_row * TC_SLD + half * cols;
        float tmax = -INFINITY;
        for (int c = 0; c < cols; c++) {
            long long n = n0 + half * cols + c;
            float s = srow[c] * scale;
            bool masked = n >= skv || qp < 0 ||
                          cpc_key_masked(qp, kv_pos ? kv_pos[n] : n, b, kv_mask, mask_len);
            s = masked ? -INFINITY : s;
            srow[c] = s;
            tmax = fmaxf(tmax, s);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        float m_new = fmaxf(m, tmax);
        float alpha = m_new == -INFINITY ? 1.0f : __expf(m - m_new);
        float psum = 0.0f;
        CPC_DTYPE *prow = Ps + my_row * TC_PLD + half * cols;
        for (int c = 0; c < cols; c++) {
            float p = m_new == -INFINITY ? 0.0f : __expf(srow[c] - m_new);
            CPC_DTYPE pd = (CPC_DTYPE)p;
            prow[c] = pd;
            psum += cpc_load_f32(pd);  // sum what P V will actually use
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l = l * alpha + psum;
        m = m_new;
        __syncwarp();

        // Sb = P V (16 x D), then O = O * alpha + Sb (per row).
        for (int j = 0; j < D / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.0f);
            for (int kk = 0; kk < TC_BN / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, CPC_DTYPE, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, CPC_DTYPE, wmma::row_major> vb;
                wmma::load_matrix_sync(a, Ps + kk * 16, TC_PLD);
                wmma::load_matrix_sync(vb, Vs + (kk * 16) * TC_LD + j * 16, TC_LD);
                wmma::mma_sync(c, a, vb, c);
            }
            wmma::store_matrix_sync(Sb + j * 16, c, TC_SLD, wmma::mem_row_major);
        }
        __syncwarp();
        float *orow = Os + my_row * TC_OLD + half * (D / 2);
        const float *pv = Sb + my_row * TC_SLD + half * (D / 2);
        for (int c = 0; c < D / 2; c++)
            orow[c] = orow[c] * alpha + pv[c];
        __syncwarp();
    }

    if (grow < sq) {
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float *dst = o + ((long long)b * sq * hq + grow * hq + h) * D + half * (D / 2);
        const float *orow = Os + my_row * TC_OLD + half * (D / 2);
        for (int c = 0; c < D / 2; c++)
            dst[c] = orow[c] * inv;
        if (half == 0)
            lse[((long long)b * hq + h) * sq + grow] = l > 0.0f ? m + __logf(l) : -INFINITY;
    }
}
#endif
