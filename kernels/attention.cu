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
// that sees no key gets o = 0 and lse = -inf.  A NaN score (a NaN in q, or in
// a visible key) makes its row NaN (o and lse), never an empty row: fmaxf
// drops NaNs from the running max, so the kernels carry the NaN in p =
// exp(s - max) instead: it reaches the row sum l (which stays NaN once it is)
// and o (through P V, so o = acc * (l > 0 ? 1 / l : 0) is NaN), and the lse
// tells an empty row by l == 0, never by !(l > 0).
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

// The shared device pieces (element loads, key padding and causal lookups,
// tensor-core fragments, staging) are kernels/attn_common.cu, prepended by
// compiler/codegen.c.

#include <mma.h>

// 2^80: above it a value of V is accumulated scaled (P V of finite bf16/fp32
// values near FLT_MAX overflows fp32 otherwise; see cpc_attn_rowwarp).
#define CPC_V_BIG 1.2089258196146292e+24f

// The V scale of a block (bf16 only; issue 23): with finite bf16 V near
// FLT_MAX, P V overflows fp32 inside the tensor-core sums although the
// output (a weighted mean) is finite.  Every tile, the block's largest |v|
// (warp maxima in s_vmax[4], read after the staging barrier) decides the
// exponent vex >= 0 of the block: V is used as V 2^-vex (the staged tile
// scaled in place), the accumulators are rescaled when vex grows, and the
// output is multiplied by 2^vex at the end.  vex stays 0 (no scaling, no
// extra pass) unless some |v| > 2^80.  Returns the new vex (uniform).
__device__ __forceinline__ int cpc_v_tile_exp(const float *s_vmax, int vex)
{
    float vmax = fmaxf(fmaxf(s_vmax[0], s_vmax[1]), fmaxf(s_vmax[2], s_vmax[3]));
    int need = vmax > CPC_V_BIG && vmax < INFINITY ? ilogbf(vmax) - 80 : 0;
    return need > vex ? need : vex;
}

// Warp maximum of x into s_vmax[warp] (lane 0 writes).
__device__ __forceinline__ void cpc_warp_vmax(float x, float *s_vmax)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    if ((threadIdx.x & 31) == 0)
        s_vmax[threadIdx.x / 32] = x;
}

// The parameters of every attention kernel (one argument array in
// runtime/backend/backend_cuda.c serves all three; see the contract at the top).
#define CPC_ATTN_PARAMS                                                                          \
    const CPC_DTYPE *__restrict__ q, const CPC_DTYPE *__restrict__ k,                          \
        const CPC_DTYPE *__restrict__ v, float *__restrict__ o, float *__restrict__ lse, int B,  \
        long long sq, long long skv, int hq, int hkv, int q_head_off, int kv_head_off,           \
        long long q_bstride, long long kv_bstride, float scale,                                  \
        const long long *__restrict__ q_pos, const long long *__restrict__ kv_pos,               \
        const unsigned char *__restrict__ kv_mask, long long mask_len

// ---------------------------------------------------------------------------
// Generic kernel: one warp per query row.
#define CPC_RW_PER_LANE ((CPC_HEAD_DIM + 31) / 32)

extern "C" __global__ void __launch_bounds__(128)
cpc_attn_rowwarp(CPC_ATTN_PARAMS)
{
    const int D = CPC_HEAD_DIM;
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int h = blockIdx.y, b = blockIdx.z;
    if (row >= sq || b >= B)
        return;
    int kvh = cpc_kv_head(h, q_head_off, kv_head_off);
    const CPC_DTYPE *qr = q + b * q_bstride + (row * hq + h) * (long long)D;
    float qv[CPC_RW_PER_LANE], acc[CPC_RW_PER_LANE];
    // acc[] is in units of 2^ex: 0 unless one of this lane's columns met
    // |v| > 2^80 (finite bf16/fp32 values near FLT_MAX: sum p v over the keys
    // would overflow fp32 although the result, a weighted mean, is finite).
    // Each output column depends on its own column of V only, so every lane
    // keeps its own exponent (no communication); one per lane, not one per
    // column: an array of CPC_RW_PER_LANE exponents spilled at head_dim 128.
    int ex = 0;
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
            if (d < D) {
                float vv = cpc_load_f32(vr[d]);
                if (ex == 0 && !(fabsf(vv) > CPC_V_BIG && fabsf(vv) < INFINITY)) {
                    acc[i] = acc[i] * alpha + p * vv;
                } else {
                    int need = fabsf(vv) > CPC_V_BIG && fabsf(vv) < INFINITY ? ilogbf(vv) - 80 : 0;
                    if (need > ex) {
#pragma unroll
                        for (int j = 0; j < CPC_RW_PER_LANE; j++)
                            acc[j] = ldexpf(acc[j], ex - need);
                        ex = need;
                    }
                    acc[i] = acc[i] * alpha + p * ldexpf(vv, -ex);
                }
            }
        }
        m = m_new;
    }
    float *orow = o + ((long long)b * sq * hq + row * hq + h) * D;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;  // l NaN: acc is NaN already
#pragma unroll
    for (int i = 0; i < CPC_RW_PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < D)
            orow[d] = ex ? ldexpf(acc[i] * inv, ex) : acc[i] * inv;
    }
    if (lane == 0)
        lse[((long long)b * hq + h) * sq + row] = l == 0.0f ? -INFINITY : m + __logf(l);
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
cpc_flash_attn_tc(CPC_ATTN_PARAMS)
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
    int kvh = cpc_kv_head(h, q_head_off, kv_head_off);
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
    if (threadIdx.x == 0)
        s_qmax = cpc_max_pos(q_pos, m0, TC_BM, sq);
#endif
    __syncthreads();

    // Two lanes per query row: row = lane / 2, half = lane & 1.
    int my_row = lane >> 1, half = lane & 1;
    long long grow = m0 + warp * 16 + my_row;
    long long qp = grow < sq ? (q_pos ? q_pos[grow] : grow) : -1;
    float m = -INFINITY, l = 0.0f;
    int vex = 0;  // V used as V 2^-vex (cpc_v_tile_exp; bf16 only)
#if CPC_DTYPE_ID == 0
    __shared__ float s_vmax[4];
#endif

    for (long long n0 = 0; n0 < skv; n0 += TC_BN) {
#if CPC_CAUSAL
        // Skip a tile whose every key is after every query of the block.
        long long kmin = cpc_min_pos(kv_pos, n0, TC_BN, skv);
        if (kmin > s_qmax)
            continue;  // uniform across the block: every thread computed the same kmin
#endif
        __syncthreads();
#if CPC_DTYPE_ID == 0
        float tvmax = 0.0f;
#endif
        for (int i = threadIdx.x; i < TC_BN * D; i += blockDim.x) {
            int r = i / D, c = i % D;
            long long n = n0 + r;
            bool in = n < skv;
            long long off = b * kv_bstride + n * kv_row_stride + (long long)kvh * D + c;
            Ks[r * TC_LD + c] = in ? k[off] : (CPC_DTYPE)0.0f;
            CPC_DTYPE vv = in ? v[off] : (CPC_DTYPE)0.0f;
            Vs[r * TC_LD + c] = vv;
#if CPC_DTYPE_ID == 0
            tvmax = fmaxf(tvmax, fabsf(cpc_load_f32(vv)));
#endif
        }
#if CPC_DTYPE_ID == 0
        cpc_warp_vmax(tvmax, s_vmax);
#endif
        __syncthreads();
        float vr = 1.0f;  // rescale of the O accumulator this tile (vex grew)
#if CPC_DTYPE_ID == 0
        {
            int nv = cpc_v_tile_exp(s_vmax, vex);  // uniform across the block
            if (nv != vex) {
                vr = ldexpf(1.0f, vex - nv);
                vex = nv;
            }
            if (vex > 0) {
                for (int i = threadIdx.x; i < TC_BN * D; i += blockDim.x) {
                    CPC_DTYPE *e = Vs + (i / D) * TC_LD + i % D;
                    *e = (CPC_DTYPE)ldexpf(cpc_load_f32(*e), -vex);
                }
                __syncthreads();
            }
        }
#endif

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
        // m_new == -inf: every score is masked (p = e^-inf = 0) or NaN (p NaN,
        // so l turns NaN: fmaxf dropped the NaN from the max).
        float sub = m_new == -INFINITY ? 0.0f : m_new;
        float psum = 0.0f;
        CPC_DTYPE *prow = Ps + my_row * TC_PLD + half * cols;
        for (int c = 0; c < cols; c++) {
            float p = __expf(srow[c] - sub);
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
        const float ar = alpha * vr;
        for (int c = 0; c < D / 2; c++)
            orow[c] = orow[c] * ar + pv[c];
        __syncwarp();
    }

    if (grow < sq) {
        float inv = l > 0.0f ? 1.0f / l : 0.0f;  // l NaN: acc is NaN already
        float *dst = o + ((long long)b * sq * hq + grow * hq + h) * D + half * (D / 2);
        const float *orow = Os + my_row * TC_OLD + half * (D / 2);
        for (int c = 0; c < D / 2; c++)
            dst[c] = vex ? ldexpf(orow[c] * inv, vex) : orow[c] * inv;
        if (half == 0)
            lse[((long long)b * hq + h) * sq + grow] = l == 0.0f ? -INFINITY : m + __logf(l);
    }
}
#endif

// ---------------------------------------------------------------------------
// mma.sync kernel (bf16/fp16, D % 16 == 0, D <= 256): FlashAttention-2 with
// the score tile S, the probabilities P and the output accumulator O held in
// registers in the m16n8k16 fragment layouts of the PTX ISA ("Matrix
// Fragments for mma.m16n8k16 with floating point type"):
//   groupID g = lane >> 2, t = lane % 4;
//   A (16x16): a{0,1} row g,   cols 2t, 2t+1;  a{2,3} row g+8, same cols;
//              a{4,5} row g,   cols 2t+8, 2t+9; a{6,7} row g+8, same cols;
//   B (16x8):  b{0,1} rows (k) 2t, 2t+1, col (n) g; b{2,3} rows 2t+8, 2t+9;
//   C (16x8):  c{0,1} row g, cols 2t, 2t+1; c{2,3} row g+8, same cols.
// The C fragments of S for key columns [16j, 16j+16) are exactly the A
// fragment of P for the j-th k-step of P V, so P never leaves registers.
// A block of 4 warps owns 64 query rows of one (b, head), 16 per warp;
// K/V tiles of MMA_BN keys are staged in shared memory: K row-major (pitch
// D + 8 elements), V transposed (Vt[d][key], pitch MMA_BN + 8), so that every
// fragment load is one 32-bit load of two adjacent elements, free of bank
// conflicts.  For head_dim <= 128 the warp's Q fragments stay in registers.
// Online softmax in fp32; each thread keeps a partial row sum for its 2
// columns of each n-tile, summed over the 4 threads of a group at the end.
// Dynamic shared memory: mma_smem_bytes() in runtime/backend/backend_cuda.c mirrors
// the layout (Q tile, K tile, Vt tile, then MMA_BN key positions).
#if CPC_DTYPE_ID != 2 && (CPC_HEAD_DIM % 16) == 0 && CPC_HEAD_DIM <= 256

#define MMA_BM 64
#define MMA_BN (CPC_HEAD_DIM > 128 ? 32 : 64)
#define MMA_LD (CPC_HEAD_DIM + 8)
#define MMA_VLD (MMA_BN + 8)
#define MMA_Q_IN_REGS (CPC_HEAD_DIM <= 128)

// Stages keys [n0, n0 + MMA_BN) x D of V transposed: Vt[d * MMA_VLD + key],
// zero past `limit`.  Consecutive threads take consecutive keys of the same 8
// head-dim columns, so the 2-byte shared stores of a warp hit distinct banks.
// Returns the largest |v| this thread staged (bf16 only: fp16 cannot
// overflow P V; 0 there), for the tile's V scale (cpc_v_tile_scale).
__device__ __forceinline__ float cpc_stage_vt(CPC_DTYPE *vt, const CPC_DTYPE *src, long long row_stride,
                                              long long n0, long long limit, bool vec)
{
    const int D = CPC_HEAD_DIM;
    float vmax = 0.0f;
    for (int i = threadIdx.x; i < MMA_BN * (D / 8); i += blockDim.x) {
        int r = i % MMA_BN, c = (i / MMA_BN) * 8;
        const CPC_DTYPE *g = src + (n0 + r) * row_stride + c;
        bool in = n0 + r < limit;
        if (vec) {
            int4 val = {0, 0, 0, 0};
            if (in)
                val = *reinterpret_cast<const int4 *>(g);
            const CPC_DTYPE *e = reinterpret_cast<const CPC_DTYPE *>(&val);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                vt[(c + k) * MMA_VLD + r] = e[k];
#if CPC_DTYPE_ID == 0
                vmax = fmaxf(vmax, fabsf(cpc_load_f32(e[k])));
#endif
            }
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                CPC_DTYPE x = in ? g[k] : (CPC_DTYPE)0.0f;
                vt[(c + k) * MMA_VLD + r] = x;
#if CPC_DTYPE_ID == 0
                vmax = fmaxf(vmax, fabsf(cpc_load_f32(x)));
#endif
            }
        }
    }
    return vmax;
}

extern "C" __global__ void __launch_bounds__(128)
cpc_flash_attn_mma(CPC_ATTN_PARAMS)
{
    const int D = CPC_HEAD_DIM;
    const int NT_S = MMA_BN / 8, NT_O = D / 8;
    CPC_DYNAMIC_SMEM(unsigned char, smem_raw);
    CPC_DTYPE *Qs = reinterpret_cast<CPC_DTYPE *>(smem_raw);
    CPC_DTYPE *Ks = Qs + MMA_BM * MMA_LD;
    CPC_DTYPE *Vt = Ks + MMA_BN * MMA_LD;
    long long *kpos_s = reinterpret_cast<long long *>(Vt + CPC_HEAD_DIM * MMA_VLD);
#if CPC_CAUSAL
    __shared__ long long s_qmax;  // largest query position of the block
#endif

    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z;
    const long long m0 = (long long)blockIdx.x * MMA_BM;
    const int kvh = cpc_kv_head(h, q_head_off, kv_head_off);
    const long long q_row_stride = (long long)hq * D, kv_row_stride = (long long)hkv * D;
    const CPC_DTYPE *qb = q + b * q_bstride + (long long)h * D;
    const CPC_DTYPE *kb = k + b * kv_bstride + (long long)kvh * D;
    const CPC_DTYPE *vb = v + b * kv_bstride + (long long)kvh * D;
    const bool qvec = ((reinterpret_cast<unsigned long long>(qb) | (unsigned long long)(q_row_stride * 2)) & 15) == 0;
    const bool kvvec = ((reinterpret_cast<unsigned long long>(kb) | reinterpret_cast<unsigned long long>(vb) |
                         (unsigned long long)(kv_row_stride * 2)) & 15) == 0;

    cpc_stage(Qs, MMA_LD, qb, q_row_stride, m0, MMA_BM, sq, qvec);
#if CPC_CAUSAL
    if (threadIdx.x == 0)
        s_qmax = cpc_max_pos(q_pos, m0, MMA_BM, sq);
#endif

    // This thread's two rows (g and g + 8 of the warp's 16) and their positions.
    const long long row0 = m0 + warp * 16 + g, row1 = row0 + 8;
    const long long qp0 = row0 < sq ? (q_pos ? q_pos[row0] : row0) : -1;
    const long long qp1 = row1 < sq ? (q_pos ? q_pos[row1] : row1) : -1;
#if CPC_CAUSAL
    // Smallest / largest position of the warp's rows (for tile skipping).
    long long wmin = qp0 < 0 ? 0x7fffffffffffffffll : qp0, wmax = qp0 > qp1 ? qp0 : qp1;
    if (qp1 >= 0 && qp1 < wmin)
        wmin = qp1;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        long long a = __shfl_xor_sync(0xffffffffu, wmin, off);
        long long c = __shfl_xor_sync(0xffffffffu, wmax, off);
        wmin = a < wmin ? a : wmin;
        wmax = c > wmax ? c : wmax;
    }
#endif

    // The warp's Q fragments (A operand of S = Q K^T): registers or smem.
    const CPC_DTYPE *qw = Qs + (warp * 16 + g) * MMA_LD + 2 * t;
#if MMA_Q_IN_REGS
    __syncthreads();  // the Q tile is staged
    unsigned qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        qa[kk][0] = cpc_ld2(qw + kk * 16);
        qa[kk][1] = cpc_ld2(qw + 8 * MMA_LD + kk * 16);
        qa[kk][2] = cpc_ld2(qw + kk * 16 + 8);
        qa[kk][3] = cpc_ld2(qw + 8 * MMA_LD + kk * 16 + 8);
    }
#endif

    float oacc[NT_O][4];
#pragma unroll
    for (int j = 0; j < NT_O; j++)
        oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.0f;
    float m_r0 = -INFINITY, m_r1 = -INFINITY, l_r0 = 0.0f, l_r1 = 0.0f;
    const float scale_log2 = scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)
    const bool has_pos = kv_pos != 0;
    int vex = 0;  // V used as V 2^-vex (cpc_v_tile_exp; bf16 only)
#if CPC_DTYPE_ID == 0
    __shared__ float s_vmax[4];
#endif

    for (long long n0 = 0; n0 < skv; n0 += MMA_BN) {
        __syncthreads();  // previous tile fully consumed (and Q / s_qmax staged)
#if CPC_CAUSAL
        long long kmin = 0x7fffffffffffffffll, kmax = -0x7fffffffffffffffll;
        if (has_pos) {
            for (long long n = n0; n < n0 + MMA_BN && n < skv; n++) {
                long long p = kv_pos[n];
                kmin = p < kmin ? p : kmin;
                kmax = p > kmax ? p : kmax;
            }
        } else {
            kmin = n0;
            kmax = (n0 + MMA_BN < skv ? n0 + MMA_BN : skv) - 1;
        }
        if (kmin > s_qmax)
            continue;  // uniform: no key of the tile is visible to any row of the block
#endif
        cpc_stage(Ks, MMA_LD, kb, kv_row_stride, n0, MMA_BN, skv, kvvec);
        float tvmax = cpc_stage_vt(Vt, vb, kv_row_stride, n0, skv, kvvec);
#if CPC_DTYPE_ID == 0
        cpc_warp_vmax(tvmax, s_vmax);
#else
        (void)tvmax;
#endif
        if ((int)threadIdx.x < MMA_BN) {
            long long n = n0 + threadIdx.x;
            kpos_s[threadIdx.x] = n < skv ? (has_pos ? kv_pos[n] : n) : -1;
        }
        __syncthreads();
#if CPC_DTYPE_ID == 0
        {
            int nv = cpc_v_tile_exp(s_vmax, vex);  // uniform across the block
            if (nv != vex) {
                float r = ldexpf(1.0f, vex - nv);
#pragma unroll
                for (int j = 0; j < NT_O; j++) {
                    oacc[j][0] *= r;
                    oacc[j][1] *= r;
                    oacc[j][2] *= r;
                    oacc[j][3] *= r;
                }
                vex = nv;
            }
            if (vex > 0) {
                for (int i = threadIdx.x; i < D * MMA_BN; i += blockDim.x) {
                    CPC_DTYPE *e = Vt + (i / MMA_BN) * MMA_VLD + i % MMA_BN;
                    *e = (CPC_DTYPE)ldexpf(cpc_load_f32(*e), -vex);
                }
                __syncthreads();
            }
        }
#endif
#if CPC_CAUSAL
        if (kmin > wmax)
            continue;  // uniform in the warp: every key is after every row of the warp
#endif
        // S = Q K^T for the warp's 16 rows x MMA_BN keys.
        float s[NT_S][4];
#pragma unroll
        for (int j = 0; j < NT_S; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#if MMA_Q_IN_REGS
            const unsigned *a = qa[kk];
#else
            unsigned a[4];
            a[0] = cpc_ld2(qw + kk * 16);
            a[1] = cpc_ld2(qw + 8 * MMA_LD + kk * 16);
            a[2] = cpc_ld2(qw + kk * 16 + 8);
            a[3] = cpc_ld2(qw + 8 * MMA_LD + kk * 16 + 8);
#endif
#pragma unroll
            for (int j = 0; j < NT_S; j++) {
                const CPC_DTYPE *kr = Ks + (j * 8 + g) * MMA_LD + kk * 16 + 2 * t;
                unsigned bf[2] = {cpc_ld2(kr), cpc_ld2(kr + 8)};
                cpc_mma16816(s[j], a, bf);
            }
        }
        // Masks: only in tiles that need them (uniform per warp).
        bool need_mask = n0 + MMA_BN > skv || kv_mask != 0;
#if CPC_CAUSAL
        need_mask = need_mask || kmax > wmin;
#endif
        if (need_mask) {
#pragma unroll
            for (int j = 0; j < NT_S; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = j * 8 + 2 * t + (e & 1);
                    long long qp = e < 2 ? qp0 : qp1;
                    long long kp = kpos_s[c];
                    bool masked = n0 + c >= skv || qp < 0 || cpc_key_masked(qp, kp, b, kv_mask, mask_len);
                    if (masked)
                        s[j][e] = -INFINITY;
                }
        }
        // Online softmax (base 2 on scaled scores).
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT_S; j++) {
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        mx0 *= scale_log2;
        mx1 *= scale_log2;
        float mn0 = fmaxf(m_r0, mx0), mn1 = fmaxf(m_r1, mx1);
        float al0 = mn0 == -INFINITY ? 1.0f : exp2f(m_r0 - mn0);
        float al1 = mn1 == -INFINITY ? 1.0f : exp2f(m_r1 - mn1);
        // mn == -inf: every score of the row is masked (p = 0) or NaN (p NaN:
        // the NaN fmaxf dropped reaches l through p, see the contract above).
        float sub0 = mn0 == -INFINITY ? 0.0f : mn0, sub1 = mn1 == -INFINITY ? 0.0f : mn1;
        m_r0 = mn0;
        m_r1 = mn1;
        l_r0 *= al0;
        l_r1 *= al1;
#pragma unroll
        for (int j = 0; j < NT_O; j++) {
            oacc[j][0] *= al0;
            oacc[j][1] *= al0;
            oacc[j][2] *= al1;
            oacc[j][3] *= al1;
        }
        // P in the plan's dtype, packed as A fragments; row sums of what P V uses.
        unsigned pa[NT_S / 2][4];
#pragma unroll
        for (int j = 0; j < NT_S; j++) {
            CPC_DTYPE p0 = (CPC_DTYPE)exp2f(s[j][0] * scale_log2 - sub0);
            CPC_DTYPE p1 = (CPC_DTYPE)exp2f(s[j][1] * scale_log2 - sub0);
            CPC_DTYPE p2 = (CPC_DTYPE)exp2f(s[j][2] * scale_log2 - sub1);
            CPC_DTYPE p3 = (CPC_DTYPE)exp2f(s[j][3] * scale_log2 - sub1);
            l_r0 += cpc_load_f32(p0) + cpc_load_f32(p1);
            l_r1 += cpc_load_f32(p2) + cpc_load_f32(p3);
            pa[j / 2][(j & 1) * 2 + 0] = cpc_pack2(p0, p1);
            pa[j / 2][(j & 1) * 2 + 1] = cpc_pack2(p2, p3);
        }
        // O += P V.
#pragma unroll
        for (int kk = 0; kk < MMA_BN / 16; kk++) {
#pragma unroll
            for (int j = 0; j < NT_O; j++) {
                const CPC_DTYPE *vc = Vt + (j * 8 + g) * MMA_VLD + kk * 16 + 2 * t;
                unsigned bf[2] = {cpc_ld2(vc), cpc_ld2(vc + 8)};
                cpc_mma16816(oacc[j], pa[kk], bf);
            }
        }
    }

    // Full row sums over the 4 threads of the group; write O and LSE.
    l_r0 += __shfl_xor_sync(0xffffffffu, l_r0, 1);
    l_r0 += __shfl_xor_sync(0xffffffffu, l_r0, 2);
    l_r1 += __shfl_xor_sync(0xffffffffu, l_r1, 1);
    l_r1 += __shfl_xor_sync(0xffffffffu, l_r1, 2);
    // l == 0: no visible key (o = 0, lse = -inf); l NaN: a NaN score (lse NaN;
    // o is NaN already: the NaN p reached oacc through P V).
    const float inv0 = l_r0 > 0.0f ? 1.0f / l_r0 : 0.0f, inv1 = l_r1 > 0.0f ? 1.0f / l_r1 : 0.0f;
    // lse = m ln2 + log2(l) ln2 rounded once (fmaf): m is ~|logit| log2(e), and
    // (m + log2 l) * ln2 rounded twice, which the LSE merge of a ring amplifies.
    const float ln2 = 0.6931471805599453f;
    // Rows g and g + 8 written by two explicit blocks: a loop over the two rows
    // made ptxas use 216 instead of 168 registers at head_dim 256.
    if (row0 < sq) {
        float *dst = o + ((long long)b * sq * hq + row0 * hq + h) * D + 2 * t;
#pragma unroll
        for (int j = 0; j < NT_O; j++) {
            dst[j * 8] = vex ? ldexpf(oacc[j][0] * inv0, vex) : oacc[j][0] * inv0;
            dst[j * 8 + 1] = vex ? ldexpf(oacc[j][1] * inv0, vex) : oacc[j][1] * inv0;
        }
        if (t == 0)
            lse[((long long)b * hq + h) * sq + row0] = l_r0 == 0.0f ? -INFINITY : fmaf(m_r0, ln2, log2f(l_r0) * ln2);
    }
    if (row1 < sq) {
        float *dst = o + ((long long)b * sq * hq + row1 * hq + h) * D + 2 * t;
#pragma unroll
        for (int j = 0; j < NT_O; j++) {
            dst[j * 8] = vex ? ldexpf(oacc[j][2] * inv1, vex) : oacc[j][2] * inv1;
            dst[j * 8 + 1] = vex ? ldexpf(oacc[j][3] * inv1, vex) : oacc[j][3] * inv1;
        }
        if (t == 0)
            lse[((long long)b * hq + h) * sq + row1] = l_r1 == 0.0f ? -INFINITY : fmaf(m_r1, ln2, log2f(l_r1) * ln2);
    }
}
#endif
