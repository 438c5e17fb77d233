// attention_bwd.cu - attention backward (template): the generated kernels of
// the CUDA backend's attn_bwd (runtime/backend/backend.h, cpc_attn_bwd_args).
//
// Prepended by compiler/codegen.c (the specialisation): CPC_DTYPE,
// CPC_DTYPE_ID (0 bf16, 1 fp16, 2 fp32), CPC_HEAD_DIM (D), CPC_CAUSAL (0/1),
// CPC_GQA (H / Hkv).  Lengths, head offsets, strides and positions are
// ARGUMENTS, as in attention.cu.
//
// FlashAttention-2's backward (Dao 2023, Algorithm 2) with the row's saved
// LSE (natural log, as every forward of this project writes it:
// attention.cu stores (m + log2 l) * ln 2, cuDNN's stats are natural log):
//
//   delta_i = sum_e dout[i,e] out[i,e]                   cpc_attn_bwd_delta[_f32]
//   P       = exp(q k^T * scale - lse)   (0 where masked, 0 for lse = -inf)
//   dP      = dout V^T
//   dS      = P * (dP - delta)
//   dV     += P^T dout,  dK += dS^T Q * scale            cpc_attn_bwd_dkdv
//   dQ     += dS K * scale                               cpc_attn_bwd_dq
//
// Shapes (BSHD, elements): q, dout [B, sq, hq, D] (batch strides q_bstride,
// dout_bstride); k, v [B, skv, hkv, D] (kv_bstride); lse, delta [B, hq, sq]
// fp32 contiguous; dq [B, sq, hq, D] fp32 (dq_bstride), dk, dv [B, skv, hkv,
// D] fp32 (dkv_bstride); the host passes the resolved strides (never 0).
// Query head h is global head q_head_off + h and reads local K/V head
// (q_head_off + h) / CPC_GQA - kv_head_off.  q_pos / kv_pos: int64 global
// positions of the rows (NULL = the row index) for the causal mask (key pos
// <= query pos) and the key padding mask kv_mask [B, mask_len] (u8, 1 = the
// key takes part; NULL = none).
//
// Why two kernels and no atomics: dK/dV are accumulated by a block that owns
// BN keys of one K/V head and loops over the query tiles of every query head
// of its GQA group that the call sees (so dK/dV of a group are summed in one
// place, K/V heads no query head uses are never written); dQ by a block that
// owns BM query rows of one head and loops over the key tiles.  Every output
// element is therefore read-modified-written by exactly one thread, in a
// fixed order: the gradients are deterministic (bitwise reproducible from run
// to run, which the emulator's two thread orders check), the `+=` into the
// caller's fp32 buffers needs no atomicAdd (FlashAttention-2's dQ atomics
// make dQ depend on the block schedule), and no dQ scratch of
// [key tiles, sq, hq, D] is needed.  The price is recomputing S and dP in the
// dQ kernel: 7 tile products instead of 5 (about 1.4x the FLOPs of the
// single-pass form).
//
// Tiles: BM query rows x BN keys (64 x 64 for D <= 64, else 32 x 32), staged
// in shared memory as fp32 (pitch D + 1: the column reads of a warp hit
// distinct banks); S/P and dS tiles of BM x (BN + 1) fp32.  Products are
// fp32 FMAs on CUDA cores (no tensor cores yet), accumulators in registers:
// thread t owns elements t, t + NT, t + 2 NT, ... of its block's dK/dV (or
// dQ) tile.  Causal tiles no row can see are skipped (uniformly per block),
// and so are key tiles whose every key is padded.
// Dynamic shared memory: bwd_smem_bytes() in runtime/backend/backend_cuda.c
// mirrors BWD_SMEM_BYTES below.

// The shared device pieces (element loads, key padding and causal lookups,
// tensor-core fragments, staging) are kernels/attn_common.cu, prepended by
// compiler/codegen.c.

#define BWD_D CPC_HEAD_DIM
#define BWD_BM (CPC_HEAD_DIM <= 64 ? 64 : 32)
#define BWD_BN BWD_BM
#define BWD_NT (CPC_HEAD_DIM > 128 ? 256 : 128)
#define BWD_LD (CPC_HEAD_DIM + 1)
#define BWD_SLD (BWD_BN + 1)
// per thread: S/dP elements of a tile, and dK/dV (dQ) accumulator elements
#define BWD_NS ((BWD_BM * BWD_BN + BWD_NT - 1) / BWD_NT)
#define BWD_NR ((BWD_BN * BWD_D + BWD_NT - 1) / BWD_NT)
// Ks, Vs [BN][LD]; Qs, dOs [BM][LD]; Ps, dSs [BM][SLD]; m, delta [BM] fp32;
// then (8-byte aligned) query positions [BM] and key positions [BN] (int64).
#define BWD_SMEM_FLOATS (2 * BWD_BN * BWD_LD + 2 * BWD_BM * BWD_LD + 2 * BWD_BM * BWD_SLD + 2 * BWD_BM)
#define BWD_SMEM_BYTES (((BWD_SMEM_FLOATS * 4 + 7) / 8) * 8 + 8 * (BWD_BM + BWD_BN))

// ---------------------------------------------------------------------------
// delta[b, h, i] = sum_e dout[b, i, h, e] * out[b, i, h, e] (fp32 sum, one
// warp per (b, i, h) row, lanes split D, a fixed shuffle tree: deterministic).
template <typename TO>
__device__ void bwd_delta(const CPC_DTYPE *__restrict__ dout, const TO *__restrict__ out,
                          float *__restrict__ delta, int B, long long sq, int hq,
                          long long dout_bstride, long long out_bstride)
{
    const int D = BWD_D;
    const long long rows = (long long)B * sq * hq;
    const int lane = threadIdx.x & 31;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) / 32;
    for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows;
         row += nwarps) {
        const int h = (int)(row % hq);
        const long long i = (row / hq) % sq, b = row / ((long long)hq * sq);
        const CPC_DTYPE *dr = dout + b * dout_bstride + (i * hq + h) * (long long)D;
        const TO *orow = out + b * out_bstride + (i * hq + h) * (long long)D;
        float s = 0.0f;
        for (int e = lane; e < D; e += 32)
            s += cpc_load_f32(dr[e]) * cpc_load_f32(orow[e]);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0)
            delta[(b * hq + h) * sq + i] = s;
    }
}

// out in the plan dtype (the O buffer a training forward keeps)
extern "C" __global__ void cpc_attn_bwd_delta(const CPC_DTYPE *dout, const CPC_DTYPE *out,
                                              float *delta, int B, long long sq, int hq,
                                              long long dout_bstride, long long out_bstride)
{
    bwd_delta<CPC_DTYPE>(dout, out, delta, B, sq, hq, dout_bstride, out_bstride);
}

// out in fp32 (the forward's ACC)
extern "C" __global__ void cpc_attn_bwd_delta_f32(const CPC_DTYPE *dout, const float *out,
                                                  float *delta, int B, long long sq, int hq,
                                                  long long dout_bstride, long long out_bstride)
{
    bwd_delta<float>(dout, out, delta, B, sq, hq, dout_bstride, out_bstride);
}

// ---------------------------------------------------------------------------
// The parameters of cpc_attn_bwd_dkdv and cpc_attn_bwd_dq (one argument
// array in runtime/backend/backend_cuda.c serves both).
#define CPC_ATTN_BWD_PARAMS                                                                      \
    const CPC_DTYPE *__restrict__ q, const CPC_DTYPE *__restrict__ k,                          \
        const CPC_DTYPE *__restrict__ v, const CPC_DTYPE *__restrict__ dout,                   \
        const float *__restrict__ lse, const float *__restrict__ delta, float *__restrict__ dq, \
        float *__restrict__ dk, float *__restrict__ dv, int B, long long sq, long long skv,     \
        int hq, int hkv, int q_head_off, int kv_head_off, long long q_bstride,                  \
        long long kv_bstride, long long dout_bstride, long long dq_bstride,                     \
        long long dkv_bstride, float scale, const long long *__restrict__ q_pos,               \
        const long long *__restrict__ kv_pos, const unsigned char *__restrict__ kv_mask,       \
        long long mask_len

struct bwd_smem {
    float *Ks, *Vs, *Qs, *dOs, *Ps, *dSs, *m, *dl;
    long long *qp, *kp;
};

__device__ __forceinline__ bwd_smem bwd_carve(unsigned char *raw)
{
    bwd_smem s;
    float *f = reinterpret_cast<float *>(raw);
    s.Ks = f;
    s.Vs = s.Ks + BWD_BN * BWD_LD;
    s.Qs = s.Vs + BWD_BN * BWD_LD;
    s.dOs = s.Qs + BWD_BM * BWD_LD;
    s.Ps = s.dOs + BWD_BM * BWD_LD;
    s.dSs = s.Ps + BWD_BM * BWD_SLD;
    s.m = s.dSs + BWD_BM * BWD_SLD;
    s.dl = s.m + BWD_BM;
    s.qp = reinterpret_cast<long long *>(raw + ((BWD_SMEM_FLOATS * 4 + 7) / 8) * 8);
    s.kp = s.qp + BWD_BM;
    return s;
}

// Stages rows [r0, r0 + rows) of head column `col` of a BSHD tensor as fp32
// (pitch BWD_LD), zero past `limit`.
__device__ __forceinline__ void bwd_stage(float *dst, const CPC_DTYPE *src, long long row_stride,
                                          long long r0, int rows, long long limit)
{
    const int D = BWD_D;
    for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
        int r = i / D, c = i % D;
        dst[r * BWD_LD + c] = r0 + r < limit ? cpc_load_f32(src[(r0 + r) * row_stride + c]) : 0.0f;
    }
}

// Stages the query side of rows [m0, m0 + BM) of head h: Q, dO, the row's
// lse * log2(e) (+inf for a row that saw no key, or past sq: P = 0 exactly),
// delta, positions (-1 past sq).
__device__ __forceinline__ void bwd_stage_rows(const bwd_smem &s, const CPC_DTYPE *q,
                                               const CPC_DTYPE *dout, const float *lse,
                                               const float *delta, long long b, int h, int hq,
                                               long long sq, long long m0, long long q_bstride,
                                               long long dout_bstride, const long long *q_pos)
{
    const int D = BWD_D;
    const long long rs = (long long)hq * D;
    bwd_stage(s.Qs, q + b * q_bstride + (long long)h * D, rs, m0, BWD_BM, sq);
    bwd_stage(s.dOs, dout + b * dout_bstride + (long long)h * D, rs, m0, BWD_BM, sq);
    for (int r = threadIdx.x; r < BWD_BM; r += blockDim.x) {
        long long row = m0 + r;
        if (row < sq) {
            float l = lse[(b * hq + h) * sq + row];
            s.m[r] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
            s.dl[r] = delta[(b * hq + h) * sq + row];
            s.qp[r] = q_pos ? q_pos[row] : row;
        } else {
            s.m[r] = INFINITY;
            s.dl[r] = 0.0f;
            s.qp[r] = -1;
        }
    }
}

// Stages keys [n0, n0 + BN) of local K/V head kvh: K, V, positions (-1 past
// skv or where the key padding mask excludes the key).
__device__ __forceinline__ void bwd_stage_keys(const bwd_smem &s, const CPC_DTYPE *k,
                                               const CPC_DTYPE *v, long long b, int kvh, int hkv,
                                               long long skv, long long n0, long long kv_bstride,
                                               const long long *kv_pos,
                                               const unsigned char *kv_mask, long long mask_len)
{
    const int D = BWD_D;
    const long long rs = (long long)hkv * D;
    bwd_stage(s.Ks, k + b * kv_bstride + (long long)kvh * D, rs, n0, BWD_BN, skv);
    bwd_stage(s.Vs, v + b * kv_bstride + (long long)kvh * D, rs, n0, BWD_BN, skv);
    for (int j = threadIdx.x; j < BWD_BN; j += blockDim.x)
        s.kp[j] = cpc_key_pos(n0 + j, skv, b, kv_pos, kv_mask, mask_len);
}

// S and dP of the staged tiles, then P (into Ps, when `want_p`) and dS:
// P = exp(S * scale - lse), 0 where the key is masked or the row is empty /
// past sq; dS = P * (dP - delta).
__device__ __forceinline__ void bwd_scores(const bwd_smem &s, float scale_log2, bool want_p)
{
    const int D = BWD_D;
    for (int r = 0; r < BWD_NS; r++) {
        int e = threadIdx.x + BWD_NT * r;
        if (e >= BWD_BM * BWD_BN)
            break;
        int i = e / BWD_BN, j = e % BWD_BN;
        const float *qr = s.Qs + i * BWD_LD, *dor = s.dOs + i * BWD_LD;
        const float *kr = s.Ks + j * BWD_LD, *vr = s.Vs + j * BWD_LD;
        float sc = 0.0f, dp = 0.0f;
#pragma unroll 8
        for (int d = 0; d < D; d++) {
            sc += qr[d] * kr[d];
            dp += dor[d] * vr[d];
        }
        long long qp = s.qp[i], kp = s.kp[j];
        bool masked = qp < 0 || kp < 0;
#if CPC_CAUSAL
        masked = masked || kp > qp;
#endif
        float p = masked ? 0.0f : exp2f(sc * scale_log2 - s.m[i]);
        if (want_p)
            s.Ps[i * BWD_SLD + j] = p;
        s.dSs[i * BWD_SLD + j] = p * (dp - s.dl[i]);
    }
}

// dK and dV of BN keys of one K/V head: grid (ceil(skv / BN), hkv, B).
extern "C" __global__ void __launch_bounds__(BWD_NT, 1) cpc_attn_bwd_dkdv(CPC_ATTN_BWD_PARAMS)
{
    const int D = BWD_D;
    CPC_DYNAMIC_SMEM(unsigned char, smem_raw);
    const bwd_smem s = bwd_carve(smem_raw);
    const int kvh = blockIdx.y, b = blockIdx.z;
    const long long n0 = (long long)blockIdx.x * BWD_BN;
    // the query heads of this call that use K/V head kvh (uniform per block)
    int h_lo, h_hi;
    if (!cpc_q_heads(kvh, kv_head_off, q_head_off, hq, &h_lo, &h_hi) || n0 >= skv)
        return;  // no query head of the call uses this K/V head: dk/dv untouched
    bwd_stage_keys(s, k, v, b, kvh, hkv, skv, n0, kv_bstride, kv_pos, kv_mask, mask_len);
    __syncthreads();
    long long kmin = 0x7fffffffffffffffll;
    for (int j = 0; j < BWD_BN; j++)
        if (s.kp[j] >= 0 && s.kp[j] < kmin)
            kmin = s.kp[j];
    if (kmin == 0x7fffffffffffffffll)
        return;  // every key of the tile is padded (or past skv): nothing to add

    float adk[BWD_NR], adv[BWD_NR];
#pragma unroll
    for (int r = 0; r < BWD_NR; r++)
        adk[r] = adv[r] = 0.0f;
    const float scale_log2 = scale * 1.4426950408889634f;
    for (int h = h_lo; h < h_hi; h++) {
        for (long long m0 = 0; m0 < sq; m0 += BWD_BM) {
#if CPC_CAUSAL
            // skip a query tile whose every row is before every key (uniform)
            long long qmax = cpc_max_pos(q_pos, m0, BWD_BM, sq);
            if (qmax < kmin)
                continue;
#endif
            __syncthreads();  // the previous query tile is consumed
            bwd_stage_rows(s, q, dout, lse, delta, b, h, hq, sq, m0, q_bstride, dout_bstride, q_pos);
            __syncthreads();
            bwd_scores(s, scale_log2, true);
            __syncthreads();
            // dV += P^T dO, dK += dS^T Q (scale applied at the end)
#pragma unroll
            for (int r = 0; r < BWD_NR; r++) {
                int e = threadIdx.x + BWD_NT * r;
                if (e < BWD_BN * D) {
                    int j = e / D, d = e % D;
                    float sv = adv[r], sk = adk[r];
                    for (int i = 0; i < BWD_BM; i++) {
                        sv += s.Ps[i * BWD_SLD + j] * s.dOs[i * BWD_LD + d];
                        sk += s.dSs[i * BWD_SLD + j] * s.Qs[i * BWD_LD + d];
                    }
                    adv[r] = sv;
                    adk[r] = sk;
                }
            }
        }
    }
    const long long rs = (long long)hkv * D;
#pragma unroll
    for (int r = 0; r < BWD_NR; r++) {
        int e = threadIdx.x + BWD_NT * r;
        if (e < BWD_BN * D) {
            int j = e / D, d = e % D;
            if (n0 + j < skv) {
                long long at = b * dkv_bstride + (n0 + j) * rs + (long long)kvh * D + d;
                dk[at] += adk[r] * scale;
                dv[at] += adv[r];
            }
        }
    }
}

// dQ of BM query rows of one head: grid (ceil(sq / BM), hq, B).
extern "C" __global__ void __launch_bounds__(BWD_NT, 1) cpc_attn_bwd_dq(CPC_ATTN_BWD_PARAMS)
{
    const int D = BWD_D;
    CPC_DYNAMIC_SMEM(unsigned char, smem_raw);
    const bwd_smem s = bwd_carve(smem_raw);
    const int h = blockIdx.y, b = blockIdx.z;
    const long long m0 = (long long)blockIdx.x * BWD_BM;
    const int kvh = cpc_kv_head(h, q_head_off, kv_head_off);
    if (m0 >= sq)
        return;
    bwd_stage_rows(s, q, dout, lse, delta, b, h, hq, sq, m0, q_bstride, dout_bstride, q_pos);
    __syncthreads();
    bool any_row = false;
    long long qmax = -1;
    for (int i = 0; i < BWD_BM; i++) {
        any_row = any_row || s.m[i] != INFINITY;
        qmax = s.qp[i] > qmax ? s.qp[i] : qmax;
    }
    if (!any_row)
        return;  // no row of the tile saw a key (or every lse is -inf): dq unchanged
    (void)qmax;

    float aq[BWD_NR];
#pragma unroll
    for (int r = 0; r < BWD_NR; r++)
        aq[r] = 0.0f;
    const float scale_log2 = scale * 1.4426950408889634f;
    for (long long n0 = 0; n0 < skv; n0 += BWD_BN) {
#if CPC_CAUSAL
        // skip a key tile whose every key is after every row (uniform)
        long long kmin = cpc_min_pos(kv_pos, n0, BWD_BN, skv);
        if (kmin > qmax)
            continue;
#endif
        __syncthreads();  // the previous key tile is consumed
        bwd_stage_keys(s, k, v, b, kvh, hkv, skv, n0, kv_bstride, kv_pos, kv_mask, mask_len);
        __syncthreads();
        bwd_scores(s, scale_log2, false);
        __syncthreads();
        // dQ += dS K (scale applied at the end); BM == BN, so BWD_NR covers BM x D
#pragma unroll
        for (int r = 0; r < BWD_NR; r++) {
            int e = threadIdx.x + BWD_NT * r;
            if (e < BWD_BM * D) {
                int i = e / D, d = e % D;
                float sq_ = aq[r];
                for (int j = 0; j < BWD_BN; j++)
                    sq_ += s.dSs[i * BWD_SLD + j] * s.Ks[j * BWD_LD + d];
                aq[r] = sq_;
            }
        }
    }
    const long long rs = (long long)hq * D;
#pragma unroll
    for (int r = 0; r < BWD_NR; r++) {
        int e = threadIdx.x + BWD_NT * r;
        if (e < BWD_BM * D) {
            int i = e / D, d = e % D;
            if (m0 + i < sq)
                dq[b * dq_bstride + (m0 + i) * rs + (long long)h * D + d] += aq[r] * scale;
        }
    }
}

// ---------------------------------------------------------------------------
// Tensor-core kernels (bf16/fp16, head_dim % 16 == 0 and <= 128): the same
// two-kernel algorithm with every tile product on mma.sync.m16n8k16 (fp32
// accumulate), in the fragment layouts of the PTX ISA that attention.cu's
// cpc_flash_attn_mma documents (groupID g = lane >> 2, t = lane % 4; A rows
// g / g + 8, cols 2t, 2t + 1 (+ 8); B rows (k) 2t, 2t + 1 (+ 8), col (n) g;
// C rows g / g + 8, cols 2t, 2t + 1).  A C fragment pair of a 16 x 16 tile
// is the A fragment of the next product, so P and dS never leave registers;
// they are rounded to the plan dtype for the products that read them (as
// the forward rounds P), which costs ~2^-9 (bf16) / 2^-11 (fp16) relative
// per element, well inside the gradient tolerances.
//
//  cpc_attn_bwd_dkdv_mma: 4 warps own 64 keys (16 each) of one K/V head and
//      loop over the query tiles (32 rows) of the group's query heads.  Each
//      warp computes S^T = K Q^T and dP^T = V dO^T (16 keys x 32 queries: the
//      keys are the M side, so P^T and dS^T come out as A fragments), then
//      dV += P^T dO and dK += dS^T Q with dO and Q staged transposed (the B
//      operand's k index is the query).  dK, dV accumulators: 16 x D per
//      warp in registers.
//  cpc_attn_bwd_dq_mma: 4 warps own 64 query rows (16 each) of one head and
//      loop over key tiles (64 keys for D <= 64, else 32): S = Q K^T and
//      dP = dO V^T, dS in registers, dQ += dS K with K staged transposed.
//
// Dynamic shared memory: BWD_MMA_KV_SMEM / BWD_MMA_Q_SMEM, mirrored by
// bwd_mma_kv_smem / bwd_mma_q_smem in runtime/backend/backend_cuda.c.
#if CPC_DTYPE_ID != 2 && (CPC_HEAD_DIM % 16) == 0 && CPC_HEAD_DIM <= 128

#define BMMA_LD (CPC_HEAD_DIM + 8)           // row-major tiles (elements)
#define BMMA_KV_BN 64                        // keys per dK/dV block
#define BMMA_KV_BM 32                        // query rows per dK/dV step
#define BMMA_KV_TLD (BMMA_KV_BM + 8)         // transposed Q / dO pitch
#define BMMA_Q_BM 64                         // query rows per dQ block
#define BMMA_Q_BN (CPC_HEAD_DIM <= 64 ? 64 : 32)  // keys per dQ step
#define BMMA_Q_TLD (BMMA_Q_BN + 8)           // transposed K pitch
#define BMMA_KV_HALFS (2 * BMMA_KV_BN * BMMA_LD + 2 * BMMA_KV_BM * BMMA_LD + 2 * CPC_HEAD_DIM * BMMA_KV_TLD)
#define BMMA_KV_POS ((BMMA_KV_HALFS * 2 + 2 * BMMA_KV_BM * 4 + 7) / 8 * 8)
#define BWD_MMA_KV_SMEM (BMMA_KV_POS + 8 * (BMMA_KV_BM + BMMA_KV_BN))
#define BMMA_Q_HALFS (2 * BMMA_Q_BM * BMMA_LD + 2 * BMMA_Q_BN * BMMA_LD + CPC_HEAD_DIM * BMMA_Q_TLD)
#define BMMA_Q_POS ((BMMA_Q_HALFS * 2 + 2 * BMMA_Q_BM * 4 + 7) / 8 * 8)
#define BWD_MMA_Q_SMEM (BMMA_Q_POS + 8 * (BMMA_Q_BM + BMMA_Q_BN))

// Rows [r0, r0 + rows) of one head of a BSHD tensor (src: its first
// element) into smem (pitch BMMA_LD, plan dtype), zero past `limit`
// (cpc_stage); 16-byte vectors when src and the row stride are 16-byte
// aligned (uniform per block: BMMA_LD * 2 bytes and the tile offsets are
// multiples of 16).
__device__ __forceinline__ void bmma_stage(CPC_DTYPE *dst, const CPC_DTYPE *src, long long row_stride,
                                           long long r0, int rows, long long limit)
{
    cpc_stage(dst, BMMA_LD, src, row_stride, r0, rows, limit,
              ((reinterpret_cast<unsigned long long>(src) | (unsigned long long)(row_stride * 2)) & 15) == 0);
}

// dst[d * tld + r] = src[r * BMMA_LD + d] for r < rows (smem to smem).
__device__ __forceinline__ void bmma_transpose(CPC_DTYPE *dst, int tld, const CPC_DTYPE *src, int rows)
{
    const int D = CPC_HEAD_DIM;
    for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
        int r = i % rows, d = i / rows;
        dst[d * tld + r] = src[r * BMMA_LD + d];
    }
}

// The query side of rows [m0, m0 + rows) of head h: lse * log2(e) (+inf for an
// empty row or past sq), delta, positions (-1 past sq).
__device__ __forceinline__ void bmma_rows(float *ms, float *dls, long long *qps, const float *lse,
                                          const float *delta, long long b, int h, int hq,
                                          long long sq, long long m0, int rows,
                                          const long long *q_pos)
{
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        long long row = m0 + r;
        if (row < sq) {
            float l = lse[(b * hq + h) * sq + row];
            ms[r] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
            dls[r] = delta[(b * hq + h) * sq + row];
            qps[r] = q_pos ? q_pos[row] : row;
        } else {
            ms[r] = INFINITY;
            dls[r] = 0.0f;
            qps[r] = -1;
        }
    }
}

// Positions of keys [n0, n0 + n): -1 past skv or where the key padding mask
// excludes the key.
__device__ __forceinline__ void bmma_keys(long long *kps, long long b, long long skv, long long n0,
                                          int n, const long long *kv_pos,
                                          const unsigned char *kv_mask, long long mask_len)
{
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        kps[j] = cpc_key_pos(n0 + j, skv, b, kv_pos, kv_mask, mask_len);
}

extern "C" __global__ void __launch_bounds__(128, 1) cpc_attn_bwd_dkdv_mma(CPC_ATTN_BWD_PARAMS)
{
    const int D = CPC_HEAD_DIM, NTD = CPC_HEAD_DIM / 8, NTQ = BMMA_KV_BM / 8;
    CPC_DYNAMIC_SMEM(unsigned char, raw);
    CPC_DTYPE *Ks = reinterpret_cast<CPC_DTYPE *>(raw);
    CPC_DTYPE *Vs = Ks + BMMA_KV_BN * BMMA_LD;
    CPC_DTYPE *Qs = Vs + BMMA_KV_BN * BMMA_LD;
    CPC_DTYPE *dOs = Qs + BMMA_KV_BM * BMMA_LD;
    CPC_DTYPE *Qt = dOs + BMMA_KV_BM * BMMA_LD;
    CPC_DTYPE *dOt = Qt + D * BMMA_KV_TLD;
    float *ms = reinterpret_cast<float *>(dOt + D * BMMA_KV_TLD), *dls = ms + BMMA_KV_BM;
    long long *qps = reinterpret_cast<long long *>(raw + BMMA_KV_POS), *kps = qps + BMMA_KV_BM;

    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int kvh = blockIdx.y, b = blockIdx.z;
    const long long n0 = (long long)blockIdx.x * BMMA_KV_BN;
    int h_lo, h_hi;
    if (!cpc_q_heads(kvh, kv_head_off, q_head_off, hq, &h_lo, &h_hi) || n0 >= skv)
        return;  // no query head of the call uses this K/V head: dk/dv untouched
    const long long krs = (long long)hkv * D;
    bmma_stage(Ks, k + b * kv_bstride + (long long)kvh * D, krs, n0, BMMA_KV_BN, skv);
    bmma_stage(Vs, v + b * kv_bstride + (long long)kvh * D, krs, n0, BMMA_KV_BN, skv);
    bmma_keys(kps, b, skv, n0, BMMA_KV_BN, kv_pos, kv_mask, mask_len);
    __syncthreads();
    long long kmin = 0x7fffffffffffffffll, kmin_w = 0x7fffffffffffffffll;
    for (int j = 0; j < BMMA_KV_BN; j++) {
        long long p = kps[j];
        if (p >= 0 && p < kmin)
            kmin = p;
        if (p >= 0 && p < kmin_w && j / 16 == warp)
            kmin_w = p;
    }
    if (kmin == 0x7fffffffffffffffll)
        return;  // every key of the tile is padded (or past skv)
    (void)kmin_w;
    const long long kp0 = kps[warp * 16 + g], kp1 = kps[warp * 16 + g + 8];
    const CPC_DTYPE *kw = Ks + (warp * 16 + g) * BMMA_LD + 2 * t;
    const CPC_DTYPE *vw = Vs + (warp * 16 + g) * BMMA_LD + 2 * t;

    float adk[NTD][4], adv[NTD][4];
#pragma unroll
    for (int j = 0; j < NTD; j++)
        adk[j][0] = adk[j][1] = adk[j][2] = adk[j][3] = adv[j][0] = adv[j][1] = adv[j][2] = adv[j][3] = 0.0f;
    const float scale_log2 = scale * 1.4426950408889634f;
    const long long qrs = (long long)hq * D;
    for (int h = h_lo; h < h_hi; h++) {
        for (long long m0 = 0; m0 < sq; m0 += BMMA_KV_BM) {
#if CPC_CAUSAL
            long long qmax = cpc_max_pos(q_pos, m0, BMMA_KV_BM, sq);
            if (qmax < kmin)
                continue;  // uniform: every row is before every key of the block
#endif
            __syncthreads();  // the previous query tile is consumed
            bmma_stage(Qs, q + b * q_bstride + (long long)h * D, qrs, m0, BMMA_KV_BM, sq);
            bmma_stage(dOs, dout + b * dout_bstride + (long long)h * D, qrs, m0, BMMA_KV_BM, sq);
            bmma_rows(ms, dls, qps, lse, delta, b, h, hq, sq, m0, BMMA_KV_BM, q_pos);
            __syncthreads();
            bmma_transpose(Qt, BMMA_KV_TLD, Qs, BMMA_KV_BM);
            bmma_transpose(dOt, BMMA_KV_TLD, dOs, BMMA_KV_BM);
            __syncthreads();
#if CPC_CAUSAL
            if (qmax < kmin_w)
                continue;  // uniform in the warp: no barrier until the next tile
#endif
            // S^T = K Q^T and dP^T = V dO^T: 16 keys x BMMA_KV_BM queries
            float st[NTQ][4], dpt[NTQ][4];
#pragma unroll
            for (int j = 0; j < NTQ; j++)
                st[j][0] = st[j][1] = st[j][2] = st[j][3] = dpt[j][0] = dpt[j][1] = dpt[j][2] =
                    dpt[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                unsigned ka[4] = {cpc_ld2(kw + kk * 16), cpc_ld2(kw + 8 * BMMA_LD + kk * 16),
                                  cpc_ld2(kw + kk * 16 + 8), cpc_ld2(kw + 8 * BMMA_LD + kk * 16 + 8)};
                unsigned va[4] = {cpc_ld2(vw + kk * 16), cpc_ld2(vw + 8 * BMMA_LD + kk * 16),
                                  cpc_ld2(vw + kk * 16 + 8), cpc_ld2(vw + 8 * BMMA_LD + kk * 16 + 8)};
#pragma unroll
                for (int j = 0; j < NTQ; j++) {
                    const CPC_DTYPE *qr = Qs + (j * 8 + g) * BMMA_LD + kk * 16 + 2 * t;
                    const CPC_DTYPE *dr = dOs + (j * 8 + g) * BMMA_LD + kk * 16 + 2 * t;
                    unsigned qb[2] = {cpc_ld2(qr), cpc_ld2(qr + 8)};
                    unsigned db[2] = {cpc_ld2(dr), cpc_ld2(dr + 8)};
                    cpc_mma16816(st[j], ka, qb);
                    cpc_mma16816(dpt[j], va, db);
                }
            }
            // P^T, dS^T (rows = keys g / g + 8, cols = queries), packed as A fragments
            unsigned pa[NTQ / 2][4], sa[NTQ / 2][4];
#pragma unroll
            for (int j = 0; j < NTQ; j++) {
                float p[4], ds[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int col = j * 8 + 2 * t + (e & 1);
                    long long kp = e < 2 ? kp0 : kp1, qp = qps[col];
                    bool masked = qp < 0 || kp < 0;
#if CPC_CAUSAL
                    masked = masked || kp > qp;
#endif
                    p[e] = masked ? 0.0f : exp2f(st[j][e] * scale_log2 - ms[col]);
                    ds[e] = p[e] * (dpt[j][e] - dls[col]);
                }
                pa[j / 2][(j & 1) * 2 + 0] = cpc_pack2((CPC_DTYPE)p[0], (CPC_DTYPE)p[1]);
                pa[j / 2][(j & 1) * 2 + 1] = cpc_pack2((CPC_DTYPE)p[2], (CPC_DTYPE)p[3]);
                sa[j / 2][(j & 1) * 2 + 0] = cpc_pack2((CPC_DTYPE)ds[0], (CPC_DTYPE)ds[1]);
                sa[j / 2][(j & 1) * 2 + 1] = cpc_pack2((CPC_DTYPE)ds[2], (CPC_DTYPE)ds[3]);
            }
            // dV += P^T dO, dK += dS^T Q (B operands from the transposed tiles)
#pragma unroll
            for (int kk = 0; kk < BMMA_KV_BM / 16; kk++) {
#pragma unroll
                for (int j = 0; j < NTD; j++) {
                    const CPC_DTYPE *dc = dOt + (j * 8 + g) * BMMA_KV_TLD + kk * 16 + 2 * t;
                    const CPC_DTYPE *qc = Qt + (j * 8 + g) * BMMA_KV_TLD + kk * 16 + 2 * t;
                    unsigned db[2] = {cpc_ld2(dc), cpc_ld2(dc + 8)};
                    unsigned qb[2] = {cpc_ld2(qc), cpc_ld2(qc + 8)};
                    cpc_mma16816(adv[j], pa[kk], db);
                    cpc_mma16816(adk[j], sa[kk], qb);
                }
            }
        }
    }
    // rows g and g + 8 of the warp's 16 keys, two explicit blocks (as the forward)
    const long long row0 = n0 + warp * 16 + g, row1 = row0 + 8;
    if (row0 < skv) {
        const long long at = b * dkv_bstride + row0 * krs + (long long)kvh * D + 2 * t;
#pragma unroll
        for (int j = 0; j < NTD; j++) {
            dk[at + j * 8] += adk[j][0] * scale;
            dk[at + j * 8 + 1] += adk[j][1] * scale;
            dv[at + j * 8] += adv[j][0];
            dv[at + j * 8 + 1] += adv[j][1];
        }
    }
    if (row1 < skv) {
        const long long at = b * dkv_bstride + row1 * krs + (long long)kvh * D + 2 * t;
#pragma unroll
        for (int j = 0; j < NTD; j++) {
            dk[at + j * 8] += adk[j][2] * scale;
            dk[at + j * 8 + 1] += adk[j][3] * scale;
            dv[at + j * 8] += adv[j][2];
            dv[at + j * 8 + 1] += adv[j][3];
        }
    }
}

extern "C" __global__ void __launch_bounds__(128, 1) cpc_attn_bwd_dq_mma(CPC_ATTN_BWD_PARAMS)
{
    const int D = CPC_HEAD_DIM, NTD = CPC_HEAD_DIM / 8, NTK = BMMA_Q_BN / 8;
    CPC_DYNAMIC_SMEM(unsigned char, raw);
    CPC_DTYPE *Qs = reinterpret_cast<CPC_DTYPE *>(raw);
    CPC_DTYPE *dOs = Qs + BMMA_Q_BM * BMMA_LD;
    CPC_DTYPE *Ks = dOs + BMMA_Q_BM * BMMA_LD;
    CPC_DTYPE *Vs = Ks + BMMA_Q_BN * BMMA_LD;
    CPC_DTYPE *Kt = Vs + BMMA_Q_BN * BMMA_LD;
    float *ms = reinterpret_cast<float *>(Kt + D * BMMA_Q_TLD), *dls = ms + BMMA_Q_BM;
    long long *qps = reinterpret_cast<long long *>(raw + BMMA_Q_POS), *kps = qps + BMMA_Q_BM;

    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z;
    const long long m0 = (long long)blockIdx.x * BMMA_Q_BM;
    const int kvh = cpc_kv_head(h, q_head_off, kv_head_off);
    if (m0 >= sq)
        return;
    const long long qrs = (long long)hq * D, krs = (long long)hkv * D;
    bmma_stage(Qs, q + b * q_bstride + (long long)h * D, qrs, m0, BMMA_Q_BM, sq);
    bmma_stage(dOs, dout + b * dout_bstride + (long long)h * D, qrs, m0, BMMA_Q_BM, sq);
    bmma_rows(ms, dls, qps, lse, delta, b, h, hq, sq, m0, BMMA_Q_BM, q_pos);
    __syncthreads();
    bool any_row = false;
    long long qmax = -1, qmax_w = -1;
    for (int i = 0; i < BMMA_Q_BM; i++) {
        any_row = any_row || ms[i] != INFINITY;
        qmax = qps[i] > qmax ? qps[i] : qmax;
        if (i / 16 == warp && qps[i] > qmax_w)
            qmax_w = qps[i];
    }
    if (!any_row)
        return;  // no row of the tile saw a key: dq unchanged
    (void)qmax;
    (void)qmax_w;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const float m_0 = ms[r0], m_1 = ms[r1], dl_0 = dls[r0], dl_1 = dls[r1];
    const long long qp0 = qps[r0], qp1 = qps[r1];
    const CPC_DTYPE *qw = Qs + r0 * BMMA_LD + 2 * t, *dw = dOs + r0 * BMMA_LD + 2 * t;

    float adq[NTD][4];
#pragma unroll
    for (int j = 0; j < NTD; j++)
        adq[j][0] = adq[j][1] = adq[j][2] = adq[j][3] = 0.0f;
    const float scale_log2 = scale * 1.4426950408889634f;
    for (long long n0 = 0; n0 < skv; n0 += BMMA_Q_BN) {
#if CPC_CAUSAL
        long long kmin = cpc_min_pos(kv_pos, n0, BMMA_Q_BN, skv);
        if (kmin > qmax)
            continue;  // uniform: every key is after every row of the block
#endif
        __syncthreads();  // the previous key tile is consumed
        bmma_stage(Ks, k + b * kv_bstride + (long long)kvh * D, krs, n0, BMMA_Q_BN, skv);
        bmma_stage(Vs, v + b * kv_bstride + (long long)kvh * D, krs, n0, BMMA_Q_BN, skv);
        bmma_keys(kps, b, skv, n0, BMMA_Q_BN, kv_pos, kv_mask, mask_len);
        __syncthreads();
        bmma_transpose(Kt, BMMA_Q_TLD, Ks, BMMA_Q_BN);
        __syncthreads();
#if CPC_CAUSAL
        if (kmin > qmax_w)
            continue;  // uniform in the warp
#endif
        // S = Q K^T and dP = dO V^T: 16 rows x BMMA_Q_BN keys per warp
        float s[NTK][4], dp[NTK][4];
#pragma unroll
        for (int j = 0; j < NTK; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            unsigned qa[4] = {cpc_ld2(qw + kk * 16), cpc_ld2(qw + 8 * BMMA_LD + kk * 16),
                              cpc_ld2(qw + kk * 16 + 8), cpc_ld2(qw + 8 * BMMA_LD + kk * 16 + 8)};
            unsigned da[4] = {cpc_ld2(dw + kk * 16), cpc_ld2(dw + 8 * BMMA_LD + kk * 16),
                              cpc_ld2(dw + kk * 16 + 8), cpc_ld2(dw + 8 * BMMA_LD + kk * 16 + 8)};
#pragma unroll
            for (int j = 0; j < NTK; j++) {
                const CPC_DTYPE *kr = Ks + (j * 8 + g) * BMMA_LD + kk * 16 + 2 * t;
                const CPC_DTYPE *vr = Vs + (j * 8 + g) * BMMA_LD + kk * 16 + 2 * t;
                unsigned kb[2] = {cpc_ld2(kr), cpc_ld2(kr + 8)};
                unsigned vb[2] = {cpc_ld2(vr), cpc_ld2(vr + 8)};
                cpc_mma16816(s[j], qa, kb);
                cpc_mma16816(dp[j], da, vb);
            }
        }
        // dS (rows g / g + 8, cols = keys), packed as A fragments
        unsigned sa[NTK / 2][4];
#pragma unroll
        for (int j = 0; j < NTK; j++) {
            float ds[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = j * 8 + 2 * t + (e & 1);
                long long kp = kps[col], qp = e < 2 ? qp0 : qp1;
                bool masked = qp < 0 || kp < 0;
#if CPC_CAUSAL
                masked = masked || kp > qp;
#endif
                float p = masked ? 0.0f : exp2f(s[j][e] * scale_log2 - (e < 2 ? m_0 : m_1));
                ds[e] = p * (dp[j][e] - (e < 2 ? dl_0 : dl_1));
            }
            sa[j / 2][(j & 1) * 2 + 0] = cpc_pack2((CPC_DTYPE)ds[0], (CPC_DTYPE)ds[1]);
            sa[j / 2][(j & 1) * 2 + 1] = cpc_pack2((CPC_DTYPE)ds[2], (CPC_DTYPE)ds[3]);
        }
        // dQ += dS K (B operand from the transposed K tile)
#pragma unroll
        for (int kk = 0; kk < BMMA_Q_BN / 16; kk++) {
#pragma unroll
            for (int j = 0; j < NTD; j++) {
                const CPC_DTYPE *kc = Kt + (j * 8 + g) * BMMA_Q_TLD + kk * 16 + 2 * t;
                unsigned kb[2] = {cpc_ld2(kc), cpc_ld2(kc + 8)};
                cpc_mma16816(adq[j], sa[kk], kb);
            }
        }
    }
    const long long row0 = m0 + r0, row1 = m0 + r1;
    if (row0 < sq) {
        const long long at = b * dq_bstride + row0 * qrs + (long long)h * D + 2 * t;
#pragma unroll
        for (int j = 0; j < NTD; j++) {
            dq[at + j * 8] += adq[j][0] * scale;
            dq[at + j * 8 + 1] += adq[j][1] * scale;
        }
    }
    if (row1 < sq) {
        const long long at = b * dq_bstride + row1 * qrs + (long long)h * D + 2 * t;
#pragma unroll
        for (int j = 0; j < NTD; j++) {
            dq[at + j * 8] += adq[j][2] * scale;
            dq[at + j * 8 + 1] += adq[j][3] * scale;
        }
    }
}
#endif
