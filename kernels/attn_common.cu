// attn_common.cu - the attention problem on the device: the pieces the
// forward (attention.cu) and backward (attention_bwd.cu) kernels share, the
// device side of runtime/backend/attn_problem.h.  compiler/codegen.c
// prepends this file to both templates, after the specialisation's
// #defines (CPC_DTYPE, CPC_DTYPE_ID, CPC_HEAD_DIM, CPC_CAUSAL, CPC_GQA).
//
//   cpc_load_f32     an element of q, k, v or dout as fp32
//   cpc_key_padded   key padding by global key position (kv_mask [B,
//                    mask_len] u8, 1 = the key takes part, NULL = none; a
//                    position outside [0, mask_len) is padded out)
//   cpc_key_masked   whether a query at global position qp does not see the
//                    key at kp (causal: kp > qp; key padding)
//   cpc_key_pos      the global position of key row n of the block (kv_pos,
//                    NULL = n), -1 past skv or for a padded key
//   cpc_kv_head / cpc_q_heads   GQA: the local K/V head of a local query
//                    head, the local query heads of a local K/V head (the
//                    host's cpc_attn_q_heads)
//   cpc_max_pos / cpc_min_pos   the position range of a tile of rows (the
//                    causal skip of tiles no row can see)
//   16-bit tensor cores (bf16/fp16, D % 16 == 0): cpc_mma16816 (mma.sync
//   m16n8k16, fp32 accumulate), cpc_bits / cpc_pack2 / cpc_ld2 (fragments),
//   cpc_stage (rows of one head of a BSHD tensor into shared memory).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef INFINITY  // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif

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

__device__ __forceinline__ bool cpc_key_padded(long long p, long long b, const unsigned char *kv_mask,
                                               long long mask_len)
{
    return kv_mask && (p < 0 || p >= mask_len || kv_mask[b * mask_len + p] == 0);
}

__device__ __forceinline__ bool cpc_key_masked(long long qp, long long kp, long long b,
                                               const unsigned char *kv_mask, long long mask_len)
{
#if CPC_CAUSAL
    if (kp > qp)
        return true;
#endif
    return cpc_key_padded(kp, b, kv_mask, mask_len);
}

__device__ __forceinline__ long long cpc_key_pos(long long n, long long skv, long long b, const long long *kv_pos,
                                                 const unsigned char *kv_mask, long long mask_len)
{
    if (n >= skv)
        return -1;
    long long p = kv_pos ? kv_pos[n] : n;
    return cpc_key_padded(p, b, kv_mask, mask_len) ? -1 : p;
}

__device__ __forceinline__ int cpc_kv_head(int h, int q_head_off, int kv_head_off)
{
    return (q_head_off + h) / CPC_GQA - kv_head_off;
}

// [*h0, *h1): the local query heads (of hq, global head q_head_off + h)
// that read local K/V head kvh (global kv_head_off + kvh); false when none.
__device__ __forceinline__ bool cpc_q_heads(int kvh, int kv_head_off, int q_head_off, int hq, int *h0, int *h1)
{
    const int g = kv_head_off + kvh;
    int lo = g * CPC_GQA - q_head_off, hi = (g + 1) * CPC_GQA - q_head_off;
    *h0 = lo < 0 ? 0 : lo;
    *h1 = hi > hq ? hq : hi;
    return *h0 < *h1;
}

// Largest / smallest position of rows [r0, r0 + n) below `limit` (positions
// from `pos`, or the row index when pos is NULL); -1 / 2^63 - 1 when there
// is none.
__device__ __forceinline__ long long cpc_max_pos(const long long *pos, long long r0, int n, long long limit)
{
    long long mx = -1;
    for (long long r = r0; r < r0 + n && r < limit; r++) {
        long long p = pos ? pos[r] : r;
        mx = p > mx ? p : mx;
    }
    return mx;
}

__device__ __forceinline__ long long cpc_min_pos(const long long *pos, long long r0, int n, long long limit)
{
    long long mn = 0x7fffffffffffffffll;
    for (long long r = r0; r < r0 + n && r < limit; r++) {
        long long p = pos ? pos[r] : r;
        mn = p < mn ? p : mn;
    }
    return mn;
}

#if CPC_DTYPE_ID != 2 && (CPC_HEAD_DIM % 16) == 0 && CPC_HEAD_DIM <= 256

#ifdef CPC_EMU
#define cpc_mma16816(d, a, b) cpc_emu_mma_m16n8k16<CPC_DTYPE>(d, a, b)
#else
__device__ __forceinline__ void cpc_mma16816(float *d, const unsigned *a, const unsigned *b)
{
#if CPC_DTYPE_ID == 0
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

__device__ __forceinline__ unsigned short cpc_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ unsigned short cpc_bits(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned cpc_pack2(CPC_DTYPE lo, CPC_DTYPE hi)
{
    return (unsigned)cpc_bits(lo) | ((unsigned)cpc_bits(hi) << 16);
}
__device__ __forceinline__ unsigned cpc_ld2(const CPC_DTYPE *p)  // two adjacent elements
{
    return *reinterpret_cast<const unsigned *>(p);
}

// Stages rows [r0, r0 + rows) x D of one head of a BSHD tensor (src: its
// first element, rows row_stride elements apart) into shared memory with
// pitch ld (elements), zero past `limit`; 16-byte vectors when `vec` (src,
// the row stride and ld 16-byte aligned).
__device__ __forceinline__ void cpc_stage(CPC_DTYPE *dst, int ld, const CPC_DTYPE *src, long long row_stride,
                                          long long r0, int rows, long long limit, bool vec)
{
    const int D = CPC_HEAD_DIM;
    if (vec) {
        const int per_row = D / 8;
        for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
            int r = i / per_row, c = (i % per_row) * 8;
            int4 val = {0, 0, 0, 0};
            if (r0 + r < limit)
                val = *reinterpret_cast<const int4 *>(src + (r0 + r) * row_stride + c);
            *reinterpret_cast<int4 *>(dst + r * ld + c) = val;
        }
    } else {
        for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
            int r = i / D, c = i % D;
            dst[r * ld + c] = r0 + r < limit ? src[(r0 + r) * row_stride + c] : (CPC_DTYPE)0.0f;
        }
    }
}

#endif
