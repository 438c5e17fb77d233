/* backend_conformance.c - see backend_conformance.h */
#include "backend_conformance.h"

#include <Random123/philox.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "reference.h"
#include "test_random.h"

#define MAX_FAILS 40

/* ---- the case matrix --------------------------------------------------------------
 *
 * Every case of the three former tables (tests/test_backend_cpu.c's attention
 * and merge tests, tests/emu/test_kernels_emu.c's kernel launches, the
 * backend-level numerics of tests/test_backend_cuda.c) plus the edge cases of
 * the contract.  Names are stable (CPC_BC_ONLY selects by prefix).  Shapes
 * marked LARGE are the CPU tests' tile-crossing ones; every feature they show
 * also has a small case that the emulator runs. */

#define F32 (1u << CPC_DTYPE_FP32)
#define BF16 (1u << CPC_DTYPE_BF16)
#define FP16 (1u << CPC_DTYPE_FP16)
#define L CPC_BC_LARGE

static const cpc_bc_case CASES[] = {
    /* ---- head_dim and dtype (test_backend_cpu attn/head_dims_and_dtypes) ---- */
    {.name = "head_dim_8", .B = 1, .S = 300, .Skv = 300, .H = 2, .Hkv = 2, .D = 8, .extra = 3, .flags = L},
    {.name = "head_dim_64", .B = 1, .S = 300, .Skv = 300, .H = 2, .Hkv = 2, .D = 64, .extra = 3, .flags = L},
    {.name = "head_dim_128", .B = 1, .S = 300, .Skv = 300, .H = 2, .Hkv = 2, .D = 128, .extra = 3, .flags = L},
    {.name = "head_dim_40", .B = 1, .S = 300, .Skv = 300, .H = 2, .Hkv = 2, .D = 40, .extra = 3, .flags = L},
    {.name = "head_dim_3", .B = 1, .S = 300, .Skv = 300, .H = 2, .Hkv = 2, .D = 3, .extra = 3, .flags = L},
    {.name = "head_dim_256", .B = 1, .S = 300, .Skv = 300, .H = 1, .Hkv = 1, .D = 256, .extra = 1, .flags = L},
    /* small head_dim cases every backend runs (1, 16, 256) */
    {.name = "small_d1", .B = 2, .S = 19, .Skv = 23, .H = 2, .Hkv = 1, .D = 1, .extra = 1},
    {.name = "small_d16_causal", .B = 1, .S = 5, .Skv = 5, .H = 3, .Hkv = 3, .D = 16, .causal = true},
    {.name = "small_d256_causal", .dtypes = FP16 | F32, .B = 1, .S = 21, .Skv = 21, .H = 1, .Hkv = 1, .D = 256, .causal = true},
    /* ---- former emulator kernel cases (tests/emu/test_kernels_emu.c) ---- */
    {.name = "emu_bf16_d128_flux_block", .dtypes = BF16, .B = 1, .S = 150, .Skv = 200, .H = 2, .Hkv = 2, .D = 128},
    {.name = "emu_fp16_d64_causal_zigzag_gqa", .dtypes = FP16, .B = 2, .H = 4, .Hkv = 2, .D = 64, .causal = true,
     .pos = CPC_BC_POS_ZIGZAG, .sq = 96, .skv = 160, .slack = 8},
    {.name = "emu_bf16_d256_head_offsets_mask", .dtypes = BF16, .B = 2, .S = 70, .Skv = 90, .H = 4, .Hkv = 1, .D = 256,
     .qh0 = 2, .nqh = 2, .pad = 2, .min_empty = 70 * 2},
    {.name = "emu_fp16_d80_causal_strided_mask", .dtypes = FP16, .B = 1, .H = 1, .Hkv = 1, .D = 80, .causal = true,
     .pos = CPC_BC_POS_STRIDED, .sq = 65, .skv = 130, .pad = 1},
    {.name = "emu_bf16_d64_causal_square", .dtypes = BF16, .B = 1, .S = 200, .Skv = 200, .H = 1, .Hkv = 1, .D = 64, .causal = true},
    {.name = "emu_fp16_d80_causal_strided_mask_unaligned", .dtypes = FP16, .B = 2, .H = 1, .Hkv = 1, .D = 80, .causal = true,
     .pos = CPC_BC_POS_STRIDED, .sq = 65, .skv = 130, .pad = 2, .slack = 3},
    {.name = "emu_fp16_d32_gqa4_many_tiles", .dtypes = FP16, .B = 1, .S = 129, .Skv = 257, .H = 4, .Hkv = 1, .D = 32},
    {.name = "emu_bf16_d256_causal_zigzag", .dtypes = BF16, .B = 1, .H = 1, .Hkv = 1, .D = 256, .causal = true,
     .pos = CPC_BC_POS_ZIGZAG, .sq = 80, .skv = 100},
    {.name = "emu_fp32_d64", .dtypes = F32, .B = 2, .S = 37, .Skv = 53, .H = 3, .Hkv = 3, .D = 64, .slack = 5},
    /* ---- finite v near FLT_MAX (issue 23): P V accumulated scaled, the output is the
     * finite weighted mean (it used to be Inf): one block, and merged blocks with GQA ---- */
    {.name = "big_v", .dtypes = F32 | BF16, .B = 1, .S = 64, .Skv = 300, .H = 2, .Hkv = 2, .D = 64, .vamp = 5e37},
    {.name = "big_v_merged_gqa_d32", .dtypes = F32 | BF16, .B = 1, .S = 40, .Skv = 200, .H = 4, .Hkv = 2, .D = 32,
     .vamp = 5e37, .nblk = 3},
    {.name = "emu_fp32_d128_causal_zigzag_gqa_mask", .dtypes = F32, .B = 2, .H = 6, .Hkv = 2, .D = 128, .causal = true,
     .qh0 = 3, .nqh = 3, .pos = CPC_BC_POS_ZIGZAG, .sq = 30, .skv = 44, .pad = 2},
    {.name = "emu_bf16_d40", .dtypes = BF16, .B = 1, .S = 33, .Skv = 70, .H = 2, .Hkv = 2, .D = 40},
    /* ---- cross attention, sq != skv (attn/sq_ne_skv_cross_attention) ---- */
    {.name = "cross_short_q", .B = 2, .S = 37, .Skv = 700, .H = 3, .Hkv = 3, .D = 64, .extra = 5, .flags = L},
    {.name = "cross_short_kv", .B = 1, .S = 600, .Skv = 29, .H = 2, .Hkv = 1, .D = 40, .flags = L},
    {.name = "small_cross", .B = 2, .S = 9, .Skv = 40, .H = 2, .Hkv = 2, .D = 16, .extra = 1},
    /* ---- tiny (attn/tiny) ---- */
    {.name = "tiny_1x1", .B = 1, .S = 1, .Skv = 1, .H = 1, .Hkv = 1, .D = 8},
    {.name = "tiny_1q_9kv_d3", .B = 1, .S = 1, .Skv = 9, .H = 1, .Hkv = 1, .D = 3},
    {.name = "tiny_seven_causal", .B = 2, .S = 7, .Skv = 7, .H = 1, .Hkv = 1, .D = 8, .causal = true, .extra = 1},
    {.name = "tiny_1x1_d1", .B = 1, .S = 1, .Skv = 1, .H = 1, .Hkv = 1, .D = 1, .causal = true},
    /* ---- GQA and MQA (attn/gqa_28_7_and_mqa) ---- */
    {.name = "gqa_28_7_all_heads", .B = 1, .S = 96, .Skv = 96, .H = 28, .Hkv = 7, .D = 64, .row_step = 3, .flags = L},
    {.name = "gqa_28_7_ulysses_heads", .B = 2, .S = 80, .Skv = 80, .H = 28, .Hkv = 7, .D = 40, .qh0 = 10, .nqh = 7,
     .extra = 2, .causal = true, .flags = L},
    {.name = "mqa_8_1", .B = 1, .S = 130, .Skv = 130, .H = 8, .Hkv = 1, .D = 64, .qh0 = 3, .nqh = 4, .causal = true, .flags = L},
    {.name = "small_gqa_28_7", .dtypes = BF16 | FP16, .B = 1, .S = 20, .Skv = 24, .H = 28, .Hkv = 7, .D = 16,
     .qh0 = 10, .nqh = 7, .causal = true, .slack = 2},
    {.name = "small_mqa", .B = 2, .S = 17, .Skv = 17, .H = 8, .Hkv = 1, .D = 32, .qh0 = 3, .nqh = 4, .causal = true},
    /* ---- causal with zigzag runs (attn/causal_zigzag_runs) ---- */
    {.name = "zigzag_p2_r0_q_r1_kv", .B = 1, .S = 16, .Skv = 16, .H = 2, .Hkv = 2, .D = 8, .causal = true,
     .qr = {{0, 4}, {12, 4}}, .nqr = 2, .kr = {{4, 4}, {8, 4}}, .nkr = 2},
    {.name = "zigzag_p2_r1_q_r0_kv", .B = 1, .S = 16, .Skv = 16, .H = 2, .Hkv = 2, .D = 8, .causal = true,
     .qr = {{4, 4}, {8, 4}}, .nqr = 2, .kr = {{0, 4}, {12, 4}}, .nkr = 2},
    {.name = "zigzag_p4_ring_block", .B = 1, .S = 2048, .Skv = 2048, .H = 1, .Hkv = 1, .D = 64, .causal = true,
     .qr = {{256, 256}, {1536, 256}}, .nqr = 2, .kr = {{512, 256}, {1280, 256}, {0, 256}, {1792, 256}}, .nkr = 4,
     .row_step = 7, .flags = L},
    {.name = "zigzag_unified_128", .B = 1, .S = 1024, .Skv = 1024, .H = 2, .Hkv = 1, .D = 64, .causal = true,
     .qr = {{0, 128}, {896, 128}, {128, 128}, {768, 128}}, .nqr = 4,
     .kr = {{0, 128}, {896, 128}, {128, 128}, {768, 128}}, .nkr = 4, .row_step = 5, .flags = L},
    {.name = "zigzag_unified_64", .B = 1, .S = 512, .Skv = 512, .H = 1, .Hkv = 1, .D = 40, .causal = true,
     .qr = {{0, 64}, {448, 64}, {64, 64}, {384, 64}}, .nqr = 4,
     .kr = {{0, 64}, {448, 64}, {64, 64}, {384, 64}}, .nkr = 4, .row_step = 2, .flags = L},
    {.name = "small_zigzag_unified_diag", .B = 1, .S = 96, .Skv = 96, .H = 2, .Hkv = 1, .D = 16, .causal = true,
     .qr = {{0, 12}, {84, 12}, {12, 12}, {72, 12}}, .nqr = 4,
     .kr = {{0, 12}, {84, 12}, {12, 12}, {72, 12}}, .nkr = 4},
    /* ---- one block holding everything (attn/causal_full_many_tiles; the CPU test
     * also runs these under other tile sizes) ---- */
    {.name = "causal_full_1100", .B = 2, .S = 1100, .Skv = 1100, .H = 2, .Hkv = 1, .D = 64, .causal = true,
     .extra = 1, .row_step = 5, .flags = L},
    {.name = "causal_full_40", .B = 2, .S = 40, .Skv = 40, .H = 2, .Hkv = 1, .D = 64, .causal = true, .extra = 1},
    /* ---- key padding (attn/key_padding) ---- */
    {.name = "keypad_last_batch_empty", .B = 3, .S = 50, .Skv = 333, .H = 2, .Hkv = 2, .D = 40, .pad = 2,
     .extra = 4, .min_empty = 50 * 2, .flags = L},
    {.name = "keypad_causal_first_rows_empty", .B = 2, .S = 600, .Skv = 600, .H = 1, .Hkv = 1, .D = 64,
     .pad = 3, .causal = true, .row_step = 3, .min_empty = 2, .flags = L},
    {.name = "keypad_runs", .B = 2, .S = 64, .Skv = 64, .H = 2, .Hkv = 2, .D = 8, .pad = 1,
     .qr = {{8, 8}, {40, 8}}, .nqr = 2, .kr = {{16, 16}, {0, 8}, {56, 8}}, .nkr = 3},
    {.name = "small_keypad_empty_rows", .B = 2, .S = 24, .Skv = 24, .H = 2, .Hkv = 2, .D = 32, .pad = 3,
     .causal = true, .min_empty = 2 * 2 * 5},
    {.name = "small_keypad_last_batch_empty", .B = 2, .S = 11, .Skv = 30, .H = 1, .Hkv = 1, .D = 16, .pad = 2,
     .extra = 2, .min_empty = 11},
    /* ---- batch strides larger than the block (attn/batch_strides) ---- */
    {.name = "batch_strides", .B = 3, .S = 200, .Skv = 260, .H = 4, .Hkv = 2, .D = 64, .qh0 = 1, .nqh = 2,
     .extra = 17, .qr = {{20, 150}}, .nqr = 1, .kr = {{3, 250}}, .nkr = 1, .flags = L},
    {.name = "small_batch_strides", .B = 3, .S = 30, .Skv = 26, .H = 4, .Hkv = 2, .D = 32, .qh0 = 1, .nqh = 2,
     .extra = 5, .slack = 3, .qr = {{2, 20}}, .nqr = 1, .kr = {{3, 21}}, .nkr = 1},
    /* ---- large logits (attn/large_logits, attn/other_isas' second case) ---- */
    {.name = "logits_spread_30", .B = 1, .S = 300, .Skv = 1500, .H = 1, .Hkv = 1, .D = 64, .amp = 30.0,
     .row_step = 2, .flags = L},
    {.name = "logits_spread_10_fp32", .dtypes = F32, .B = 1, .S = 200, .Skv = 900, .H = 1, .Hkv = 1, .D = 64,
     .amp = 10.0, .flags = L},
    {.name = "small_logits_1000", .B = 1, .S = 24, .Skv = 40, .H = 2, .Hkv = 1, .D = 32, .amp = 1000.0,
     .causal = true},
    /* ---- the CPU test's ISA case (attn/other_isas' first case) ---- */
    {.name = "causal_keypad_cross_isa", .dtypes = BF16 | FP16, .B = 1, .S = 300, .Skv = 523, .H = 2, .Hkv = 1,
     .D = 40, .causal = true, .pad = 3, .flags = L},
    /* ---- NaN in q (attn/nan_in_q_propagates) ---- */
    {.name = "nan_in_q", .B = 1, .S = 9, .Skv = 9, .H = 1, .Hkv = 1, .D = 16, .nan_q = true},
    {.name = "nan_in_q_gqa_causal", .B = 2, .S = 20, .Skv = 20, .H = 4, .Hkv = 2, .D = 32, .causal = true,
     .nan_q = true},
    /* the NaN row's first merged block is one it cannot see (causal, rotated order):
     * merge(acc empty, NaN block) must give NaN, not keep the empty row */
    {.name = "nan_in_q_causal_merge", .B = 1, .S = 12, .Skv = 12, .H = 2, .Hkv = 1, .D = 16, .causal = true,
     .nblk = 2, .nan_q = true},
    /* ---- split keys merged (merge/split_keys_equals_full_attention) ---- */
    {.name = "merge_split_2", .B = 2, .S = 150, .Skv = 150, .H = 4, .Hkv = 2, .D = 64, .nblk = 2, .extra = 2, .flags = L},
    {.name = "merge_split_3", .B = 2, .S = 150, .Skv = 150, .H = 4, .Hkv = 2, .D = 64, .nblk = 3, .extra = 2, .flags = L},
    {.name = "merge_split_4", .B = 2, .S = 150, .Skv = 150, .H = 4, .Hkv = 2, .D = 64, .nblk = 4, .extra = 2, .flags = L},
    /* rank 0 of a zigzag ring of P = 4 over S = 512: blocks some rows cannot see
     * (LSE -inf merged in), key padding (merge/ring_causal_zigzag_blocks) */
    {.name = "merge_ring_zigzag_keypad", .B = 1, .S = 512, .Skv = 512, .H = 2, .Hkv = 2, .D = 64, .causal = true,
     .qr = {{0, 64}, {448, 64}}, .nqr = 2,
     .kr = {{64, 64}, {384, 64}, {128, 64}, {320, 64}, {192, 64}, {256, 64}, {0, 64}, {448, 64}}, .nkr = 8,
     .nblk = 4, .pad = 3, .flags = L},
    {.name = "small_merge_ring_zigzag", .B = 2, .S = 48, .Skv = 48, .H = 2, .Hkv = 1, .D = 32, .causal = true,
     .qr = {{0, 6}, {42, 6}}, .nqr = 2,
     .kr = {{6, 6}, {36, 6}, {12, 6}, {30, 6}, {18, 6}, {24, 6}, {0, 6}, {42, 6}}, .nkr = 8,
     .nblk = 4, .pad = 3, .extra = 1},
};

#undef L

const cpc_bc_case *cpc_bc_cases(int *n)
{
    *n = (int)(sizeof CASES / sizeof CASES[0]);
    return CASES;
}

/* ---- the backward case matrix (BWD) -----------------------------------------------------
 *
 * The features of cpc_attn_bwd_args, each in a small case the emulator runs
 * (dtypes, head_dim 1..256 across the CUDA kernel's 64- and 32-row tiles,
 * GQA with a head subset, causal zigzag runs split into ring blocks, key
 * padding with empty rows, cross-attention, batch strides, accumulation,
 * out in the plan dtype, a delta-only call), plus LARGE ones for fast
 * backends. */

#define L CPC_BC_LARGE
static const cpc_bc_case BWD_CASES[] = {
    {.name = "bwd_d64_cross_strides", .B = 2, .S = 37, .Skv = 53, .H = 3, .Hkv = 3, .D = 64, .extra = 2, .slack = 3},
    {.name = "bwd_d16_causal", .B = 1, .S = 20, .Skv = 20, .H = 2, .Hkv = 2, .D = 16, .causal = true},
    {.name = "bwd_d256_causal", .B = 1, .S = 21, .Skv = 21, .H = 1, .Hkv = 1, .D = 256, .causal = true},
    {.name = "bwd_d40_cross_gqa", .B = 1, .S = 9, .Skv = 70, .H = 2, .Hkv = 1, .D = 40},
    {.name = "bwd_d3_many_tiles", .dtypes = F32, .B = 1, .S = 70, .Skv = 130, .H = 1, .Hkv = 1, .D = 3},
    {.name = "bwd_tiny_d1", .B = 1, .S = 1, .Skv = 1, .H = 1, .Hkv = 1, .D = 1},
    {.name = "bwd_gqa_28_7_heads", .dtypes = BF16 | F32, .B = 1, .S = 20, .Skv = 24, .H = 28, .Hkv = 7, .D = 16,
     .qh0 = 10, .nqh = 7, .causal = true, .slack = 2},
    {.name = "bwd_mqa_heads", .dtypes = FP16, .B = 2, .S = 17, .Skv = 17, .H = 8, .Hkv = 1, .D = 32, .qh0 = 3,
     .nqh = 4, .causal = true, .extra = 1},
    /* rank 0 of a zigzag ring of P = 4: keys in 4 blocks (rotated), padding, empty rows */
    {.name = "bwd_ring_zigzag_keypad", .B = 2, .S = 48, .Skv = 48, .H = 2, .Hkv = 1, .D = 32, .causal = true,
     .qr = {{0, 6}, {42, 6}}, .nqr = 2,
     .kr = {{6, 6}, {36, 6}, {12, 6}, {30, 6}, {18, 6}, {24, 6}, {0, 6}, {42, 6}}, .nkr = 8,
     .nblk = 4, .pad = 3, .extra = 1},
    {.name = "bwd_keypad_last_batch_empty", .B = 2, .S = 11, .Skv = 30, .H = 1, .Hkv = 1, .D = 16, .pad = 2,
     .extra = 2},
    {.name = "bwd_zigzag_pos_gqa_keypad", .dtypes = F32, .B = 2, .H = 6, .Hkv = 2, .D = 128, .causal = true,
     .qh0 = 3, .nqh = 3, .pos = CPC_BC_POS_ZIGZAG, .sq = 30, .skv = 44, .pad = 2},
    {.name = "bwd_d80_strided_keypad", .dtypes = FP16, .B = 1, .H = 1, .Hkv = 1, .D = 80, .causal = true,
     .pos = CPC_BC_POS_STRIDED, .sq = 40, .skv = 70, .pad = 1},
    {.name = "bwd_prior_out_dtype_split", .B = 2, .S = 24, .Skv = 24, .H = 2, .Hkv = 2, .D = 32, .nblk = 2,
     .prior = true, .out_dtype = true, .extra = 1},
    {.name = "bwd_logits_10", .dtypes = F32, .B = 1, .S = 30, .Skv = 50, .H = 1, .Hkv = 1, .D = 32, .amp = 10.0},
    /* tile-crossing shapes for fast backends */
    {.name = "bwd_large_causal_300", .B = 1, .S = 300, .Skv = 300, .H = 2, .Hkv = 1, .D = 64, .causal = true,
     .extra = 1, .flags = L},
    {.name = "bwd_large_cross_d128", .B = 2, .S = 150, .Skv = 230, .H = 2, .Hkv = 2, .D = 128, .pad = 1,
     .nblk = 3, .flags = L},
};
#undef L

const cpc_bc_case *cpc_bc_bwd_cases(int *n)
{
    *n = (int)(sizeof BWD_CASES / sizeof BWD_CASES[0]);
    return BWD_CASES;
}

/* ---- the suite ------------------------------------------------------------------- */

typedef struct suite {
    const cpc_bc_backend *be;
    const cpc_bc_opts *o;
    uint64_t seed;
    FILE *log;
    int fails;
    cpc_status *chain;
    cpc_bc_report rep;
} suite;

static void fail(suite *S, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(suite *S, const char *what, const char *fmt, ...)
{
    S->fails++;
    if (S->fails > MAX_FAILS)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cpc_status_append(&S->chain,
                      cpc_error(CPC_E_CHECK, "backend conformance %s: %s: %s (CPC_TEST_SEED=%llu)%s",
                                S->be->name, what, msg, (unsigned long long)S->seed,
                                S->fails == MAX_FAILS ? " (further failures not listed)" : ""));
    if (S->log)
        fprintf(S->log, "conformance %s: %s: FAIL: %s\n", S->be->name, what, msg);
}

/* Records a failing status (consumed). */
static void fail_st(suite *S, const char *what, const char *call, cpc_status *st)
{
    fail(S, what, "%s failed: %s", call, st ? st->message : "?");
    cpc_status_free(st);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- random numbers: test_random.h (Random123 Philox, keyed by the case seed) ------- */

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_nan(void *p, cpc_dtype t, size_t n)
{
    if (t == CPC_DTYPE_FP32) {
        float *f = p;
        for (size_t i = 0; i < n; i++)
            f[i] = NAN;
    } else {
        uint16_t *h = p;
        for (size_t i = 0; i < n; i++)
            h[i] = t == CPC_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
    }
}

static void fill_f32(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

static uint32_t ubits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- device buffers ------------------------------------------------------------- */

/* Allocates `bytes` on the backend and uploads `host` (NULL: nothing). */
static cpc_status *dev_put(cpc_backend *be, const void *host, size_t bytes, void **out)
{
    *out = NULL;
    cpc_status *st = cpc_backend_alloc(be, bytes, out);
    if (!st && host && bytes)
        st = cpc_backend_upload(be, *out, host, bytes);
    if (st && *out) {
        cpc_backend_free(be, *out);
        *out = NULL;
    }
    return st;
}

static cpc_status *dev_sync(cpc_backend *be)
{
    return cpc_backend_sync(be);
}

static void dev_free(cpc_backend *be, void *p)
{
    if (p)
        cpc_backend_free(be, p);
}

static cpc_status *make_backend(suite *S, const cpc_kernel_spec *spec, cpc_backend **out)
{
    *out = NULL;
    cpc_status *st = S->be->create(S->be->ctx, spec, out);
    if (!st && !*out)
        st = cpc_error(CPC_E_INTERNAL, "create returned no backend");
    return st;
}

/* ---- attention -------------------------------------------------------------------- */

static int64_t runs_total(const cpc_run *r, int n)
{
    int64_t t = 0;
    for (int i = 0; i < n; i++)
        t += r[i].len;
    return t;
}

/* Runs of positions pos[0..n) (consecutive positions coalesced) into a
 * malloc'd array. */
static cpc_run *to_runs(const int64_t *pos, int64_t n, int *count)
{
    cpc_run *out = test_xmalloc(sizeof(cpc_run) * (size_t)(n > 0 ? n : 1));
    int c = 0;
    for (int64_t i = 0; i < n; i++) {
        if (c > 0 && out[c - 1].start + out[c - 1].len == pos[i])
            out[c - 1].len++;
        else {
            out[c].start = pos[i];
            out[c].len = 1;
            c++;
        }
    }
    *count = c;
    return out;
}

typedef struct view {
    int64_t S, Skv;       /* global */
    int64_t sq, skv;      /* view rows */
    int64_t *qpos, *kpos;
} view;

static void make_view(const cpc_bc_case *c, view *v)
{
    if (c->pos == CPC_BC_POS_RUNS) {
        v->S = c->S;
        v->Skv = c->Skv;
        cpc_run all_q = {0, c->S}, all_k = {0, c->Skv};
        const cpc_run *qr = c->nqr ? c->qr : &all_q, *kr = c->nkr ? c->kr : &all_k;
        int nq = c->nqr ? c->nqr : 1, nk = c->nkr ? c->nkr : 1;
        v->sq = runs_total(qr, nq);
        v->skv = runs_total(kr, nk);
        v->qpos = test_xmalloc(sizeof(int64_t) * (size_t)v->sq);
        v->kpos = test_xmalloc(sizeof(int64_t) * (size_t)v->skv);
        for (int r = 0, i = 0; r < nq; r++)
            for (int64_t t = 0; t < qr[r].len; t++)
                v->qpos[i++] = qr[r].start + t;
        for (int r = 0, i = 0; r < nk; r++)
            for (int64_t t = 0; t < kr[r].len; t++)
                v->kpos[i++] = kr[r].start + t;
        return;
    }
    int64_t sq = c->sq, skv = c->skv, total = sq > skv ? sq : skv;
    v->sq = sq;
    v->skv = skv;
    v->qpos = test_xmalloc(sizeof(int64_t) * (size_t)sq);
    v->kpos = test_xmalloc(sizeof(int64_t) * (size_t)skv);
    if (c->pos == CPC_BC_POS_ZIGZAG) {
        v->S = v->Skv = total;
        for (int64_t i = 0; i < sq; i++)
            v->qpos[i] = i < sq / 2 ? i : total - 1 - (i - sq / 2);
        for (int64_t i = 0; i < skv; i++)
            v->kpos[i] = i % 2 ? total - 1 - i / 2 : i / 2;
    } else {
        v->S = v->Skv = 2 * total;
        for (int64_t i = 0; i < sq; i++)
            v->qpos[i] = 3 * i % (2 * total);
        for (int64_t i = 0; i < skv; i++)
            v->kpos[i] = 2 * i + 1;
    }
}

static float from16v(cpc_dtype t, uint16_t h)
{
    return t == CPC_DTYPE_BF16 ? cpc_bf16_to_f32(h) : cpc_fp16_to_f32(h);
}

/* The attention of one (case, dtype). */
static void attn_case(suite *S, const cpc_bc_case *tc, cpc_dtype dt, uint64_t seed)
{
    char what[160];
    snprintf(what, sizeof what, "attn %s %s (case seed %llu)", tc->name, cpc_dtype_name(dt),
             (unsigned long long)seed);
    double t0 = now_s();
    view vw;
    make_view(tc, &vw);
    const int B = tc->B, H = tc->H, Hkv = tc->Hkv, D = tc->D, group = H / Hkv;
    const int64_t Sg = vw.S, Skvg = vw.Skv, sq = vw.sq, skv_all = vw.skv;
    const int nqh = tc->nqh ? tc->nqh : H, qh0 = tc->nqh ? tc->qh0 : 0;
    const int nblk = tc->nblk > 1 ? tc->nblk : 1, step = tc->row_step > 1 ? tc->row_step : 1;
    const size_t es = test_esz(dt);
    const float scale = (float)(1.0 / sqrt((double)D));

    /* global tensors */
    void *q = test_rand_tensor(dt, (size_t)B * Sg * H * D, seed, 1, tc->amp > 0 ? tc->amp : 1.0);
    void *k = test_rand_tensor(dt, (size_t)B * Skvg * Hkv * D, seed, 2, 1.0);
    void *v = test_rand_tensor(dt, (size_t)B * Skvg * Hkv * D, seed, 3, tc->vamp > 0 ? tc->vamp : 1.0);
    int64_t nan_i = -1;
    if (tc->nan_q) {
        nan_i = (sq > 3 ? 3 : 0) / step * step;
        size_t at = (((size_t)vw.qpos[nan_i] * H + qh0) * D + (size_t)D / 2);
        fill_nan((char *)q + at * es, dt, 1);
    }
    uint8_t *pmask = NULL;
    if (tc->pad) {
        pmask = test_xmalloc((size_t)B * Skvg);
        for (int b = 0; b < B; b++)
            for (int64_t j = 0; j < Skvg; j++) {
                uint8_t on = (test_bits_at(seed, 4, (uint64_t)b * Skvg + j) & 3u) != 0;
                if (tc->pad == 2 && b == B - 1)
                    on = 0;
                if (tc->pad == 3 && j < 5)
                    on = 0;
                pmask[(size_t)b * Skvg + j] = on;
            }
    }
    /* K/V heads of the block: those the view's query heads need, plus a spare one
     * on each side where the global tensor has it */
    int kv_need0 = qh0 / group, kv_need1 = (qh0 + nqh - 1) / group + 1;
    int kv_off = kv_need0 > 0 ? kv_need0 - 1 : 0;
    int kv_end = kv_need1 < Hkv ? kv_need1 + 1 : Hkv;
    int hkv = kv_end - kv_off;

    /* local queries: `extra` poison rows and `slack` poison elements per batch */
    const int64_t qbs = (sq + tc->extra) * nqh * D + tc->slack;
    void *ql = test_xmalloc(es * (size_t)(B * qbs));
    fill_nan(ql, dt, (size_t)(B * qbs));
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++)
            memcpy((char *)ql + ((size_t)b * qbs + (size_t)i * nqh * D) * es,
                   (char *)q + ((((size_t)b * Sg + vw.qpos[i]) * H + qh0) * D) * es,
                   es * (size_t)nqh * D);
    const size_t no = (size_t)B * sq * nqh * D, nl = (size_t)B * nqh * sq;
    float *acc = test_xmalloc(sizeof(float) * no), *acc_lse = test_xmalloc(sizeof(float) * nl);
    float *acc2 = NULL, *acc_lse2 = NULL;
    float *nanbuf = test_xmalloc(sizeof(float) * (no > nl ? no : nl));
    fill_f32(nanbuf, no > nl ? no : nl, NAN);
    cpc_run *qruns = NULL;
    int nqr = 0;
    qruns = to_runs(vw.qpos, sq, &nqr);

    cpc_kernel_spec spec = {dt, D, tc->causal, group};
    cpc_backend *be = NULL;
    void *dq = NULL, *dm = NULL, *dacc = NULL, *dacc_lse = NULL, *dO = NULL, *dL = NULL;
    cpc_status *st = make_backend(S, &spec, &be);
    if (st) {
        fail_st(S, what, "create backend", st);
        goto out;
    }
    if ((st = dev_put(be, ql, es * (size_t)(B * qbs), &dq)) ||
        (pmask && (st = dev_put(be, pmask, (size_t)B * Skvg, &dm))) ||
        (st = dev_put(be, NULL, sizeof(float) * no, &dacc)) ||
        (st = dev_put(be, NULL, sizeof(float) * nl, &dacc_lse)) ||
        (nblk > 1 && (st = dev_put(be, NULL, sizeof(float) * no, &dO))) ||
        (nblk > 1 && (st = dev_put(be, NULL, sizeof(float) * nl, &dL)))) {
        fail_st(S, what, "device buffers", st);
        goto out;
    }
    int runs_of_attn = S->o->repeat && nblk == 1 ? 2 : 1;
    for (int run = 0; run < runs_of_attn; run++) {
        if (run == 1 && S->be->perturb)
            S->be->perturb(S->be->ctx, 1);
        if (nblk > 1) {
            /* the accumulator starts as NaN: init_acc must overwrite all of it */
            if ((st = cpc_backend_upload(be, dacc, nanbuf, sizeof(float) * no)) ||
                (st = cpc_backend_upload(be, dacc_lse, nanbuf, sizeof(float) * nl)) ||
                (st = cpc_backend_init_acc(be, dacc, no, dacc_lse, nl))) {
                fail_st(S, what, "init_acc", st);
                goto out;
            }
        }
        for (int blk = 0; blk < nblk; blk++) {
            int bi = (blk + 1) % nblk; /* a rotated order, as a ring rank sees it */
            int64_t j0 = skv_all * bi / nblk, j1 = skv_all * (bi + 1) / nblk, skv = j1 - j0;
            int nkr = 0;
            cpc_run *kr = to_runs(vw.kpos + j0, skv, &nkr);
            const int64_t kvbs = (skv + tc->extra) * hkv * D + tc->slack;
            size_t kvn = (size_t)(B * kvbs);
            void *kl = test_xmalloc(es * kvn), *vl = test_xmalloc(es * kvn);
            fill_nan(kl, dt, kvn);
            fill_nan(vl, dt, kvn);
            for (int b = 0; b < B; b++)
                for (int64_t j = 0; j < skv; j++) {
                    size_t src = (((size_t)b * Skvg + vw.kpos[j0 + j]) * Hkv + kv_off) * D * es;
                    size_t dst = ((size_t)b * kvbs + (size_t)j * hkv * D) * es;
                    memcpy((char *)kl + dst, (char *)k + src, es * (size_t)hkv * D);
                    memcpy((char *)vl + dst, (char *)v + src, es * (size_t)hkv * D);
                }
            void *dk = NULL, *dv = NULL;
            float *o_t = nblk > 1 ? dO : dacc, *l_t = nblk > 1 ? dL : dacc_lse;
            if (!(st = dev_put(be, kl, es * kvn, &dk)) && !(st = dev_put(be, vl, es * kvn, &dv)) &&
                !(st = cpc_backend_upload(be, o_t, nanbuf, sizeof(float) * no)) &&
                !(st = cpc_backend_upload(be, l_t, nanbuf, sizeof(float) * nl))) {
                cpc_attn_args a = {
                    .p.B = B, .p.sq = sq, .p.skv = skv, .p.hq = nqh, .p.hkv = hkv, .p.d = D, .p.group = group,
                    .p.q_head_off = qh0, .p.kv_head_off = kv_off, .p.dtype = dt,
                    .p.q = dq, .p.k = dk, .p.v = dv, .p.q_bstride = qbs, .p.kv_bstride = kvbs,
                    .o = o_t, .lse = l_t, .p.scale = scale, .p.causal = tc->causal,
                    .p.q_runs = qruns, .p.n_q_runs = nqr, .p.kv_runs = kr, .p.n_kv_runs = nkr,
                    .p.kv_mask = dm, .p.mask_len = dm ? Skvg : 0,
                };
                st = cpc_backend_attn(be, &a);
                if (st)
                    cpc_status_prefix(st, "attn (block %d of %d)", bi, nblk);
            }
            if (!st && nblk > 1) {
                cpc_merge_args m = {.B = B, .s = sq, .h = nqh, .d = D, .acc = dacc,
                                    .acc_lse = dacc_lse, .o = dO, .lse = dL};
                st = cpc_backend_merge(be, &m);
                if (st)
                    cpc_status_prefix(st, "merge");
            }
            if (!st)
                st = dev_sync(be);
            dev_free(be, dk);
            dev_free(be, dv);
            free(kl);
            free(vl);
            free(kr);
            if (st) {
                fail_st(S, what, "block", st);
                goto out;
            }
        }
        float *ho = run ? acc2 : acc, *hl = run ? acc_lse2 : acc_lse;
        if (run == 1) {
            ho = acc2 = test_xmalloc(sizeof(float) * no);
            hl = acc_lse2 = test_xmalloc(sizeof(float) * nl);
            if (S->be->perturb)
                S->be->perturb(S->be->ctx, 0);
        }
        if ((st = cpc_backend_download(be, ho, dacc, sizeof(float) * no)) ||
            (st = cpc_backend_download(be, hl, dacc_lse, sizeof(float) * nl))) {
            fail_st(S, what, "download", st);
            goto out;
        }
    }
    if (acc2 && (memcmp(acc, acc2, sizeof(float) * no) != 0 ||
                 memcmp(acc_lse, acc_lse2, sizeof(float) * nl) != 0))
        fail(S, what, "a second run (perturbed: %s) gives different bits (a race, or a result "
                      "that depends on the thread order)",
             S->be->perturb ? "yes" : "no");

    /* the reference restricted to the view's keys */
    uint8_t *rmask = calloc((size_t)B * Skvg, 1);
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < skv_all; j++) {
            size_t id = (size_t)b * Skvg + vw.kpos[j];
            rmask[id] = pmask ? pmask[id] : 1;
        }
    int64_t nr_max = (int64_t)B * nqh * ((sq + step - 1) / step);
    cpc_ref_row *rows = test_xmalloc(sizeof(cpc_ref_row) * (size_t)nr_max);
    int64_t *vi = test_xmalloc(sizeof(int64_t) * (size_t)nr_max);
    int64_t nr = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nqh; h++)
            for (int64_t i = 0; i < sq; i += step) {
                rows[nr] = (cpc_ref_row){b, qh0 + h, vw.qpos[i]};
                vi[nr] = i;
                nr++;
            }
    double *ref = test_xmalloc(sizeof(double) * (size_t)nr * D), *rlse = test_xmalloc(sizeof(double) * (size_t)nr);
    double *got = test_xmalloc(sizeof(double) * (size_t)nr * D), *want = test_xmalloc(sizeof(double) * (size_t)nr * D);
    cpc_ref_problem p = {.B = B, .S = Sg, .Skv = Skvg, .H = H, .Hkv = Hkv, .D = D, .dtype = dt,
                         .q = q, .k = k, .v = v, .scale = scale, .causal = tc->causal,
                         .kv_mask = rmask};
    double *bound = test_xmalloc(sizeof(double) * (size_t)nr * D);
    st = cpc_reference_attention_bound(&p, rows, nr, ref, rlse, bound);
    if (st) {
        fail_st(S, what, "the reference", st);
        goto ref_out;
    }
    /* fp32 logits carry a rounding error of up to about u * scale * ||q|| ||k||
     * (u = 2^-24), which the lse inherits: ill-conditioned rows (large logits
     * that cancel) get that much (x8) on top of the relative tolerance */
    double kmax = 0;
    for (size_t r = 0; r < (size_t)B * Skvg * Hkv; r++) {
        double n2 = 0;
        for (int e = 0; e < D; e++) {
            double x = dt == CPC_DTYPE_FP32 ? ((const float *)k)[r * D + e]
                                             : (double)from16v(dt, ((const uint16_t *)k)[r * D + e]);
            n2 += x * x;
        }
        kmax = n2 > kmax ? n2 : kmax;
    }
    kmax = sqrt(kmax);
    /* the output's tolerance: the backend's own (or the dtype's), widened
     * as cprun's check is (reference.h) only where the logits' own fp32
     * rounding error on these very inputs is larger */
    double rounding = 0;
    (void)cpc_check_tolerance_conditioned(dt, ref, bound, nr * D, &rounding);
    double otol = S->o->out_tol > 0 ? S->o->out_tol : cpc_check_tolerance(dt);
    if (CPC_CHECK_ROUNDING_FACTOR * rounding > otol)
        otol = CPC_CHECK_ROUNDING_FACTOR * rounding;
    const double ltol = S->o->lse_tol > 0 ? S->o->lse_tol : otol;
    int64_t empty = 0, nan_rows = 0, ncmp = 0, lse_bad = 0, row_bad = 0;
    double lse_err = 0;
    for (int64_t r = 0; r < nr; r++) {
        int b = rows[r].b, h = rows[r].h - qh0;
        int64_t i = vi[r];
        const float *orow = acc + (((size_t)b * sq + i) * nqh + h) * D;
        double gl = acc_lse[((size_t)b * nqh + h) * sq + i];
        if (isnan(rlse[r])) { /* NaN planted in this row's q */
            nan_rows++;
            bool all = isnan(gl);
            for (int e = 0; e < D; e++)
                all = all && isnan(orow[e]);
            if (!all && row_bad++ < 3)
                fail(S, what,
                     "row (b=%d h=%d pos=%lld) has a NaN in q: o and lse must be NaN, got "
                     "o[0] %g lse %g",
                     b, rows[r].h, (long long)rows[r].s, (double)orow[0], gl);
            continue;
        }
        if (rlse[r] == -INFINITY) {
            empty++;
            bool zero = gl == -INFINITY;
            for (int e = 0; e < D; e++)
                zero = zero && orow[e] == 0.0f;
            if (!zero && row_bad++ < 3)
                fail(S, what,
                     "row (b=%d h=%d pos=%lld) sees no key: o must be 0 and lse -inf, got "
                     "o[0] %g lse %g",
                     b, rows[r].h, (long long)rows[r].s, (double)orow[0], gl);
            continue;
        }
        for (int e = 0; e < D; e++) {
            got[ncmp * D + e] = orow[e];
            want[ncmp * D + e] = ref[r * D + e];
        }
        ncmp++;
        double qn = 0;
        for (int e = 0; e < D; e++) {
            size_t at = (((size_t)b * Sg + rows[r].s) * H + rows[r].h) * D + e;
            double x = dt == CPC_DTYPE_FP32 ? ((const float *)q)[at]
                                             : (double)from16v(dt, ((const uint16_t *)q)[at]);
            qn += x * x;
        }
        double cond = 8.0 * 0x1p-24 * scale * sqrt(qn) * kmax;
        double le = fabs(gl - rlse[r]) / (1.0 + fabs(rlse[r]));
        if (!(fabs(gl - rlse[r]) <= ltol * (1.0 + fabs(rlse[r])) + cond)) {
            if (lse_bad++ < 3)
                fail(S, what,
                     "lse of row (b=%d h=%d pos=%lld) %.9g, reference %.9g (tol %.0e relative + "
                     "%.1e for fp32 logit rounding)",
                     b, rows[r].h, (long long)rows[r].s, gl, rlse[r], ltol, cond);
        } else if (le > lse_err)
            lse_err = le;
    }
    cpc_compare_result co;
    cpc_compare_init(&co);
    cpc_compare_add_f64(&co, got, want, ncmp * D);
    cpc_compare_finish(&co, otol);
    if (co.n_nan || co.n_inf)
        fail(S, what, "NaN/Inf in the output of rows that see keys: %lld NaN, %lld Inf, first at "
                      "element %lld",
             (long long)co.n_nan, (long long)co.n_inf, (long long)co.first_bad);
    else if (!co.pass)
        fail(S, what, "out rel err %.3e > %.0e (max abs %.3e; B=%d S=%lld Skv=%lld H=%d Hkv=%d D=%d "
                      "causal %d pad %d nblk %d)",
             co.rel_err, otol, co.max_abs_err, B, (long long)Sg, (long long)Skvg, H, Hkv, D,
             tc->causal, tc->pad, nblk);
    if (tc->nan_q && nan_rows == 0)
        fail(S, what, "the planted NaN row was not compared (harness)");
    if (empty < tc->min_empty)
        fail(S, what, "%lld compared rows see no key, expected at least %lld", (long long)empty,
             (long long)tc->min_empty);
    if (S->log)
        fprintf(S->log,
                "conformance %s: attn %-44s %s: rows %lld (empty %lld, nan %lld) out rel %.2e "
                "lse %.2e  %.2f s\n",
                S->be->name, tc->name, cpc_dtype_name(dt), (long long)nr, (long long)empty,
                (long long)nan_rows, co.rel_err, lse_err, now_s() - t0);
ref_out:
    free(rmask);
    free(rows);
    free(vi);
    free(ref);
    free(bound);
    free(rlse);
    free(got);
    free(want);
out:
    if (be) {
        dev_free(be, dq);
        dev_free(be, dm);
        dev_free(be, dacc);
        dev_free(be, dacc_lse);
        dev_free(be, dO);
        dev_free(be, dL);
        cpc_backend_destroy(be);
    }
    free(q);
    free(k);
    free(v);
    free(pmask);
    free(ql);
    free(acc);
    free(acc_lse);
    free(acc2);
    free(acc_lse2);
    free(nanbuf);
    free(qruns);
    free(vw.qpos);
    free(vw.kpos);
}

/* ---- the backward ------------------------------------------------------------------ */

/* Uploads float host data to a new device buffer of n floats. */
static cpc_status *dev_put_f32(cpc_backend *be, const float *host, size_t n, void **out)
{
    return dev_put(be, host, sizeof(float) * n, out);
}

/* SPEC section 10: gradients as `out` (fp32 1e-5, fp16 2e-3), bf16 2e-2. */
static double grad_tolerance(cpc_dtype dt)
{
    return dt == CPC_DTYPE_BF16 ? 2e-2 : cpc_check_tolerance(dt);
}

/* The backward of one (case, dtype): the harness of the BWD comment in
 * backend_conformance.h.  With `run` 1 the second pass is perturbed and its
 * gradients must equal the first's bitwise. */
static void bwd_case(suite *S, const cpc_bc_case *tc, cpc_dtype dt, uint64_t seed)
{
    char what[160];
    snprintf(what, sizeof what, "attn_bwd %s %s (case seed %llu)", tc->name, cpc_dtype_name(dt),
             (unsigned long long)seed);
    double t0 = now_s();
    view vw;
    make_view(tc, &vw);
    const int B = tc->B, H = tc->H, Hkv = tc->Hkv, D = tc->D, group = H / Hkv;
    const int64_t Sg = vw.S, Skvg = vw.Skv, sq = vw.sq, skv_all = vw.skv;
    const int nqh = tc->nqh ? tc->nqh : H, qh0 = tc->nqh ? tc->qh0 : 0;
    const int nblk = tc->nblk > 1 ? tc->nblk : 1;
    const size_t es = test_esz(dt);
    const float scale = (float)(1.0 / sqrt((double)D));

    void *q = test_rand_tensor(dt, (size_t)B * Sg * H * D, seed, 1, tc->amp > 0 ? tc->amp : 1.0);
    void *k = test_rand_tensor(dt, (size_t)B * Skvg * Hkv * D, seed, 2, 1.0);
    void *v = test_rand_tensor(dt, (size_t)B * Skvg * Hkv * D, seed, 3, 1.0);
    void *dout = test_rand_tensor(dt, (size_t)B * Sg * H * D, seed, 5, 1.0);
    uint8_t *pmask = NULL;
    if (tc->pad) {
        pmask = test_xmalloc((size_t)B * Skvg);
        for (int b = 0; b < B; b++)
            for (int64_t j = 0; j < Skvg; j++) {
                uint8_t on = (test_bits_at(seed, 4, (uint64_t)b * Skvg + j) & 3u) != 0;
                if (tc->pad == 2 && b == B - 1)
                    on = 0;
                if (tc->pad == 3 && j < 5)
                    on = 0;
                pmask[(size_t)b * Skvg + j] = on;
            }
    }
    int kv_need0 = qh0 / group, kv_need1 = (qh0 + nqh - 1) / group + 1;
    int kv_off = kv_need0 > 0 ? kv_need0 - 1 : 0;
    int kv_end = kv_need1 < Hkv ? kv_need1 + 1 : Hkv;
    int hkv = kv_end - kv_off;

    /* local q and dout: `extra` poison rows and `slack` poison elements per batch */
    const int64_t qbs = (sq + tc->extra) * nqh * D + tc->slack;
    void *ql = test_xmalloc(es * (size_t)(B * qbs)), *dol = test_xmalloc(es * (size_t)(B * qbs));
    fill_nan(ql, dt, (size_t)(B * qbs));
    fill_nan(dol, dt, (size_t)(B * qbs));
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++) {
            size_t src = (((size_t)b * Sg + vw.qpos[i]) * H + qh0) * D * es;
            size_t dst = ((size_t)b * qbs + (size_t)i * nqh * D) * es;
            memcpy((char *)ql + dst, (char *)q + src, es * (size_t)nqh * D);
            memcpy((char *)dol + dst, (char *)dout + src, es * (size_t)nqh * D);
        }
    /* local K/V of keys [j0, j1) of the view */
    const int64_t kvbs_all = (skv_all + tc->extra) * hkv * D + tc->slack;
    const size_t kvn_all = (size_t)(B * kvbs_all);
    void *kl = test_xmalloc(es * kvn_all), *vl = test_xmalloc(es * kvn_all);
    fill_nan(kl, dt, kvn_all);
    fill_nan(vl, dt, kvn_all);
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < skv_all; j++) {
            size_t src = (((size_t)b * Skvg + vw.kpos[j]) * Hkv + kv_off) * D * es;
            size_t dst = ((size_t)b * kvbs_all + (size_t)j * hkv * D) * es;
            memcpy((char *)kl + dst, (char *)k + src, es * (size_t)hkv * D);
            memcpy((char *)vl + dst, (char *)v + src, es * (size_t)hkv * D);
        }
    cpc_run *qruns = NULL, *kruns_all = NULL;
    int nqr = 0, nkr_all = 0;
    qruns = to_runs(vw.qpos, sq, &nqr);
    kruns_all = to_runs(vw.kpos, skv_all, &nkr_all);

    /* gradients with sentinel rows per batch, prior values when asked */
    const int64_t dqbs = (sq + tc->extra) * nqh * D, dkvbs = (skv_all + tc->extra) * hkv * D;
    const size_t ndq = (size_t)B * dqbs, ndkv = (size_t)B * dkvbs;
    const size_t no = (size_t)B * sq * nqh * D, nl = (size_t)B * nqh * sq;
    const float sentinel = 12345.0f;
    float *pq = test_xmalloc(sizeof(float) * ndq), *pk = test_xmalloc(sizeof(float) * ndkv);
    float *pv = test_xmalloc(sizeof(float) * ndkv);
    float *gq[2] = {test_xmalloc(sizeof(float) * ndq), test_xmalloc(sizeof(float) * ndq)};
    float *gk[2] = {test_xmalloc(sizeof(float) * ndkv), test_xmalloc(sizeof(float) * ndkv)};
    float *gv[2] = {test_xmalloc(sizeof(float) * ndkv), test_xmalloc(sizeof(float) * ndkv)};
    for (size_t i = 0; i < ndq; i++)
        pq[i] = (int64_t)(i % (size_t)dqbs) >= sq * nqh * D ? sentinel
                : tc->prior ? (float)(0.01 * test_normal_at(seed, 6, i)) : 0.0f;
    for (size_t i = 0; i < ndkv; i++) {
        bool gap = (int64_t)(i % (size_t)dkvbs) >= skv_all * hkv * D;
        pk[i] = gap ? sentinel : tc->prior ? (float)(0.01 * test_normal_at(seed, 7, i)) : 0.0f;
        pv[i] = gap ? sentinel : tc->prior ? (float)(0.01 * test_normal_at(seed, 8, i)) : 0.0f;
    }
    float *o = test_xmalloc(sizeof(float) * no), *lse = test_xmalloc(sizeof(float) * nl);
    float *nanbuf = test_xmalloc(sizeof(float) * (no > nl ? no : nl));
    fill_f32(nanbuf, no > nl ? no : nl, NAN);
    void *o_plan = NULL;
    double *rq = NULL, *rk = NULL, *rv = NULL, *got = NULL, *ref = NULL;
    uint8_t *rmask = NULL;
    void *rdout = NULL;

    cpc_kernel_spec spec = {dt, D, tc->causal, group};
    cpc_backend *be = NULL;
    void *dq_ = NULL, *ddo = NULL, *dk_ = NULL, *dv_ = NULL, *dm = NULL, *dO = NULL, *dL = NULL,
         *dOut = NULL, *dDelta = NULL, *dgq = NULL, *dgk = NULL, *dgv = NULL;
    cpc_status *st = make_backend(S, &spec, &be);
    if (st) {
        fail_st(S, what, "create backend", st);
        goto out;
    }
    if (!cpc_backend_has_attn_bwd(be)) {
        fail(S, what, "the backend has no attn_bwd");
        goto out;
    }
    if ((st = dev_put(be, ql, es * (size_t)(B * qbs), &dq_)) ||
        (st = dev_put(be, dol, es * (size_t)(B * qbs), &ddo)) ||
        (st = dev_put(be, kl, es * kvn_all, &dk_)) || (st = dev_put(be, vl, es * kvn_all, &dv_)) ||
        (pmask && (st = dev_put(be, pmask, (size_t)B * Skvg, &dm))) ||
        (st = dev_put_f32(be, nanbuf, no, &dO)) || (st = dev_put_f32(be, nanbuf, nl, &dL)) ||
        (st = dev_put_f32(be, nanbuf, nl, &dDelta)) ||
        (st = dev_put(be, NULL, sizeof(float) * ndq, &dgq)) ||
        (st = dev_put(be, NULL, sizeof(float) * ndkv, &dgk)) ||
        (st = dev_put(be, NULL, sizeof(float) * ndkv, &dgv))) {
        fail_st(S, what, "device buffers", st);
        goto out;
    }
    /* the key padding mask: on the device, or (pad 1) the host mask the executor
     * passes (backend_cuda.h: copied to the device per call) */
    const uint8_t *kvm = tc->pad == 1 ? pmask : (const uint8_t *)dm;
    /* the forward over the view's keys: out (fp32) and the row's full lse */
    cpc_attn_args fa = {
        .p.B = B, .p.sq = sq, .p.skv = skv_all, .p.hq = nqh, .p.hkv = hkv, .p.d = D, .p.group = group,
        .p.q_head_off = qh0, .p.kv_head_off = kv_off, .p.dtype = dt, .p.q = dq_, .p.k = dk_, .p.v = dv_,
        .p.q_bstride = qbs, .p.kv_bstride = kvbs_all, .o = dO, .lse = dL, .p.scale = scale,
        .p.causal = tc->causal, .p.q_runs = qruns, .p.n_q_runs = nqr, .p.kv_runs = kruns_all,
        .p.n_kv_runs = nkr_all, .p.kv_mask = kvm, .p.mask_len = kvm ? Skvg : 0};
    if ((st = cpc_backend_attn(be, &fa)) || (st = dev_sync(be)) ||
        (st = cpc_backend_download(be, o, dO, sizeof(float) * no)) ||
        (st = cpc_backend_download(be, lse, dL, sizeof(float) * nl))) {
        fail_st(S, what, "forward", st);
        goto out;
    }
    const void *outp = dO;
    cpc_dtype out_dt = CPC_DTYPE_FP32;
    int64_t out_bs = (int64_t)sq * nqh * D;
    if (tc->out_dtype) {
        out_dt = dt;
        out_bs = qbs;
        o_plan = test_xmalloc(es * (size_t)(B * qbs));
        fill_nan(o_plan, dt, (size_t)(B * qbs));
        const size_t ob = (size_t)sq * nqh * D;
        for (int b = 0; b < B; b++)
            cpc_from_f32_n((char *)o_plan + (size_t)b * qbs * es, dt, o + (size_t)b * ob, ob);
        if ((st = dev_put(be, o_plan, es * (size_t)(B * qbs), &dOut))) {
            fail_st(S, what, "device buffers", st);
            goto out;
        }
        outp = dOut;
    }
    const int passes = S->o->repeat ? 2 : 1;
    for (int pass = 0; pass < passes; pass++) {
        if (pass == 1 && S->be->perturb)
            S->be->perturb(S->be->ctx, 1);
        if ((st = cpc_backend_upload(be, dgq, pq, sizeof(float) * ndq)) ||
            (st = cpc_backend_upload(be, dgk, pk, sizeof(float) * ndkv)) ||
            (st = cpc_backend_upload(be, dgv, pv, sizeof(float) * ndkv)) ||
            (st = cpc_backend_upload(be, dDelta, nanbuf, sizeof(float) * nl))) {
            fail_st(S, what, "upload", st);
            goto out;
        }
        const cpc_attn_bwd_args base = {
            .p.B = B, .p.sq = sq, .p.hq = nqh, .p.hkv = hkv, .p.d = D, .p.group = group, .p.q_head_off = qh0,
            .p.kv_head_off = kv_off, .p.dtype = dt, .p.q = dq_, .dout = ddo, .p.q_bstride = qbs,
            .p.kv_bstride = kvbs_all, .dout_bstride = qbs, .out_dtype = out_dt,
            .out_bstride = out_bs, .lse = dL, .delta = dDelta, .dq = dgq, .dq_bstride = dqbs,
            .dkv_bstride = dkvbs, .p.scale = scale, .p.causal = tc->causal, .p.q_runs = qruns,
            .p.n_q_runs = nqr, .p.kv_mask = kvm, .p.mask_len = kvm ? Skvg : 0};
        if (nblk > 1) { /* delta alone first (a schedule's `delta` op) */
            cpc_attn_bwd_args a = base;
            a.p.skv = 0;
            a.out = outp;
            a.compute_delta = true;
            if ((st = cpc_backend_attn_bwd(be, &a))) {
                fail_st(S, what, "attn_bwd (delta only, skv = 0)", st);
                goto out;
            }
        }
        for (int blk = 0; blk < nblk; blk++) {
            int bi = (blk + 1) % nblk; /* rotated, as a ring rank sees the blocks */
            int64_t j0 = skv_all * bi / nblk, j1 = skv_all * (bi + 1) / nblk;
            int nkr = 0;
            cpc_run *kr = to_runs(vw.kpos + j0, j1 - j0, &nkr);
            cpc_attn_bwd_args a = base;
            a.p.skv = j1 - j0;
            a.p.k = (const char *)dk_ + (size_t)j0 * hkv * D * es;
            a.p.v = (const char *)dv_ + (size_t)j0 * hkv * D * es;
            a.dk = (float *)dgk + (size_t)j0 * hkv * D;
            a.dv = (float *)dgv + (size_t)j0 * hkv * D;
            a.p.kv_runs = kr;
            a.p.n_kv_runs = nkr;
            a.compute_delta = nblk == 1;
            a.out = nblk == 1 ? outp : NULL;
            st = cpc_backend_attn_bwd(be, &a);
            free(kr);
            if (st) {
                cpc_status_prefix(st, "block %d of %d", bi, nblk);
                fail_st(S, what, "attn_bwd", st);
                goto out;
            }
        }
        if ((st = dev_sync(be)) || (st = cpc_backend_download(be, gq[pass], dgq, sizeof(float) * ndq)) ||
            (st = cpc_backend_download(be, gk[pass], dgk, sizeof(float) * ndkv)) ||
            (st = cpc_backend_download(be, gv[pass], dgv, sizeof(float) * ndkv))) {
            fail_st(S, what, "download", st);
            goto out;
        }
        if (pass == 1 && S->be->perturb)
            S->be->perturb(S->be->ctx, 0);
    }
    if (passes == 2 && (memcmp(gq[0], gq[1], sizeof(float) * ndq) != 0 ||
                        memcmp(gk[0], gk[1], sizeof(float) * ndkv) != 0 ||
                        memcmp(gv[0], gv[1], sizeof(float) * ndkv) != 0))
        fail(S, what, "a second backward (perturbed: %s) gives different bits (a race, or a "
                      "result that depends on the thread order)",
             S->be->perturb ? "yes" : "no");

    /* the reference: keys restricted to the view, dout zero outside the view */
    rmask = calloc((size_t)B * Skvg, 1);
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < skv_all; j++) {
            size_t id = (size_t)b * Skvg + vw.kpos[j];
            rmask[id] = pmask ? pmask[id] : 1;
        }
    rdout = calloc((size_t)B * Sg * H * D, es);
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++) {
            size_t off = (((size_t)b * Sg + vw.qpos[i]) * H + qh0) * D * es;
            memcpy((char *)rdout + off, (char *)dout + off, es * (size_t)nqh * D);
        }
    rq = test_xmalloc(sizeof(double) * (size_t)B * Sg * H * D);
    rk = test_xmalloc(sizeof(double) * (size_t)B * Skvg * Hkv * D);
    rv = test_xmalloc(sizeof(double) * (size_t)B * Skvg * Hkv * D);
    cpc_ref_problem p = {.B = B, .S = Sg, .Skv = Skvg, .H = H, .Hkv = Hkv, .D = D, .dtype = dt,
                         .q = q, .k = k, .v = v, .scale = scale, .causal = tc->causal,
                         .kv_mask = rmask};
    if ((st = cpc_reference_attention_bwd(&p, rdout, rq, rk, rv))) {
        fail_st(S, what, "the reference backward", st);
        goto out;
    }
    const float *g_q = gq[0], *g_k = gk[0], *g_v = gv[0];
    size_t nmax = ndq > ndkv ? ndq : ndkv;
    got = test_xmalloc(sizeof(double) * nmax);
    ref = test_xmalloc(sizeof(double) * nmax);
    double tol = S->o->out_tol > 0 ? S->o->out_tol : grad_tolerance(dt);
    /* delta from an out rounded to the plan dtype carries that rounding: the
     * SPEC's gradient tolerance at least, whatever the backend's own */
    if (tc->out_dtype && tol < grad_tolerance(dt))
        tol = grad_tolerance(dt);
    cpc_compare_result cr[3];
    int64_t empty = 0, bad = 0;
    size_t n = 0;
    cpc_compare_init(&cr[0]);
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++)
            for (int h = 0; h < nqh; h++) {
                size_t li = (size_t)b * dqbs + ((size_t)i * nqh + (size_t)h) * D;
                size_t gi = (((size_t)b * Sg + (size_t)vw.qpos[i]) * H + (size_t)(qh0 + h)) * D;
                bool is_empty = lse[((size_t)b * nqh + h) * sq + (size_t)i] == -INFINITY;
                empty += is_empty;
                for (int e = 0; e < D; e++) {
                    if (is_empty && g_q[li + e] != pq[li + e] && bad++ < 3)
                        fail(S, what, "row (b=%d h=%d pos=%lld) sees no key: dq must be unchanged, "
                                      "got %g (prior %g)",
                             b, qh0 + h, (long long)vw.qpos[i], (double)g_q[li + e], (double)pq[li + e]);
                    got[n] = (double)g_q[li + e] - (double)pq[li + e];
                    ref[n++] = rq[gi + e];
                }
            }
    cpc_compare_add_f64(&cr[0], got, ref, (int64_t)n);
    for (int w = 1; w < 3; w++) {
        const float *g = w == 1 ? g_k : g_v, *pr = w == 1 ? pk : pv;
        const double *r = w == 1 ? rk : rv;
        n = 0;
        for (int b = 0; b < B; b++)
            for (int64_t j = 0; j < skv_all; j++)
                for (int kh = 0; kh < hkv; kh++) {
                    size_t li = (size_t)b * dkvbs + ((size_t)j * hkv + (size_t)kh) * D;
                    size_t gi = (((size_t)b * Skvg + (size_t)vw.kpos[j]) * Hkv + (size_t)(kv_off + kh)) * D;
                    int gh = kv_off + kh;
                    bool used = (gh + 1) * group > qh0 && gh * group < qh0 + nqh;
                    for (int e = 0; e < D; e++) {
                        if (!used && memcmp(&g[li + e], &pr[li + e], 4) != 0 && bad++ < 3)
                            fail(S, what, "K/V head %d is used by no query head of the call: %s "
                                          "must be untouched",
                                 gh, w == 1 ? "dk" : "dv");
                        got[n] = (double)g[li + e] - (double)pr[li + e];
                        ref[n++] = r[gi + e];
                    }
                }
        cpc_compare_init(&cr[w]);
        cpc_compare_add_f64(&cr[w], got, ref, (int64_t)n);
    }
    for (size_t i = 0; i < ndq; i++)
        if ((int64_t)(i % (size_t)dqbs) >= sq * nqh * D && g_q[i] != sentinel && bad++ < 3)
            fail(S, what, "dq written between batches (element %zu)", i);
    for (size_t i = 0; i < ndkv; i++)
        if ((int64_t)(i % (size_t)dkvbs) >= skv_all * hkv * D &&
            (g_k[i] != sentinel || g_v[i] != sentinel) && bad++ < 3)
            fail(S, what, "dk/dv written between batches (element %zu)", i);
    static const char *const gname[3] = {"dq", "dk", "dv"};
    for (int w = 0; w < 3; w++) {
        cpc_compare_finish(&cr[w], tol);
        /* a gradient that vanishes in exact arithmetic (one visible key: dS = 0)
         * has no meaningful relative error: there the absolute error must be at
         * the fp32 rounding level of its O(1) terms */
        if (cr[w].n > 0 && sqrt(cr[w].sum_sq_ref / (double)cr[w].n) < 1e-6 &&
            cr[w].max_abs_err <= 1e-5)
            cr[w].pass = cr[w].n_nan == 0 && cr[w].n_inf == 0;
        if (cr[w].n_nan || cr[w].n_inf)
            fail(S, what, "NaN/Inf in %s: %lld NaN, %lld Inf, first at element %lld", gname[w],
                 (long long)cr[w].n_nan, (long long)cr[w].n_inf, (long long)cr[w].first_bad);
        else if (!cr[w].pass)
            fail(S, what, "%s rel err %.3e > %.0e (max abs %.3e; B=%d S=%lld Skv=%lld H=%d "
                          "Hkv=%d D=%d causal %d pad %d nblk %d)",
                 gname[w], cr[w].rel_err, tol, cr[w].max_abs_err, B, (long long)Sg,
                 (long long)Skvg, H, Hkv, D, tc->causal, tc->pad, nblk);
    }
    if (S->log)
        fprintf(S->log,
                "conformance %s: attn_bwd %-36s %s: dq %.2e dk %.2e dv %.2e (tol %.0e, empty "
                "rows %lld)  %.2f s\n",
                S->be->name, tc->name, cpc_dtype_name(dt), cr[0].rel_err, cr[1].rel_err,
                cr[2].rel_err, tol, (long long)empty, now_s() - t0);
out:
    if (be) {
        dev_free(be, dq_);
        dev_free(be, ddo);
        dev_free(be, dk_);
        dev_free(be, dv_);
        dev_free(be, dm);
        dev_free(be, dO);
        dev_free(be, dL);
        dev_free(be, dOut);
        dev_free(be, dDelta);
        dev_free(be, dgq);
        dev_free(be, dgk);
        dev_free(be, dgv);
        cpc_backend_destroy(be);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    free(pmask);
    free(ql);
    free(dol);
    free(kl);
    free(vl);
    free(qruns);
    free(kruns_all);
    free(pq);
    free(pk);
    free(pv);
    for (int i = 0; i < 2; i++) {
        free(gq[i]);
        free(gk[i]);
        free(gv[i]);
    }
    free(o);
    free(lse);
    free(nanbuf);
    free(o_plan);
    free(rq);
    free(rk);
    free(rv);
    free(got);
    free(ref);
    free(rmask);
    free(rdout);
    free(vw.qpos);
    free(vw.kpos);
}

/* ---- merge ----------------------------------------------------------------------- */

static void check_merge(suite *S, cpc_backend *be, int D, uint64_t seed, const char *what)
{
    const int B = 2, H = 3;
    const int64_t Sq = 45;
    const size_t rows = (size_t)B * Sq * H, n = rows * D;
    float *acc = test_xmalloc(n * 4), *o = test_xmalloc(n * 4), *al = test_xmalloc(rows * 4), *l = test_xmalloc(rows * 4);
    float *gacc = test_xmalloc(n * 4), *gal = test_xmalloc(rows * 4);
    double *ea = test_xmalloc(n * 8), *el = test_xmalloc(rows * 8);
    for (size_t i = 0; i < n; i++) {
        acc[i] = (float)test_normal_at(seed, 20, i);
        o[i] = (float)test_normal_at(seed, 21, i);
    }
    /* row kinds: 0 acc empty (0, -inf), 1 block empty, 2 both, else both finite */
    for (size_t r = 0; r < rows; r++) {
        int kind = r < 3 ? (int)r : (int)(test_bits_at(seed, 22, r) % 8);
        al[r] = kind == 0 || kind == 2 ? -INFINITY : (float)(30.0 * test_normal_at(seed, 23, r));
        l[r] = kind == 1 || kind == 2 ? -INFINITY : (float)(30.0 * test_normal_at(seed, 24, r));
    }
    for (int b = 0; b < B; b++)
        for (int64_t s = 0; s < Sq; s++)
            for (int h = 0; h < H; h++) {
                size_t row = ((size_t)b * Sq + s) * H + h, li = ((size_t)b * H + h) * Sq + s;
                if (al[li] == -INFINITY)
                    for (int d = 0; d < D; d++)
                        acc[row * D + d] = 0.0f; /* the contract's empty accumulator */
                double a = al[li], c = l[li], mx = fmax(a, c);
                if (mx == -INFINITY) {
                    el[li] = -INFINITY;
                    for (int d = 0; d < D; d++)
                        ea[row * D + d] = 0.0;
                    continue;
                }
                double lse = mx + log(exp(a - mx) + exp(c - mx));
                el[li] = lse;
                for (int d = 0; d < D; d++)
                    ea[row * D + d] = exp(a - lse) * acc[row * D + d] + exp(c - lse) * o[row * D + d];
            }
    void *dacc = NULL, *do_ = NULL, *dal = NULL, *dl = NULL;
    cpc_status *st;
    if ((st = dev_put(be, acc, n * 4, &dacc)) || (st = dev_put(be, o, n * 4, &do_)) ||
        (st = dev_put(be, al, rows * 4, &dal)) || (st = dev_put(be, l, rows * 4, &dl))) {
        fail_st(S, what, "device buffers", st);
        goto out;
    }
    cpc_merge_args m = {.B = B, .s = Sq, .h = H, .d = D, .acc = dacc, .acc_lse = dal, .o = do_, .lse = dl};
    if ((st = cpc_backend_merge(be, &m)) || (st = dev_sync(be)) ||
        (st = cpc_backend_download(be, gacc, dacc, n * 4)) ||
        (st = cpc_backend_download(be, gal, dal, rows * 4))) {
        fail_st(S, what, "merge", st);
        goto out;
    }
    int bad = 0;
    for (int b = 0; b < B && bad < 3; b++)
        for (int64_t s = 0; s < Sq && bad < 3; s++)
            for (int h = 0; h < H && bad < 3; h++) {
                size_t row = ((size_t)b * Sq + s) * H + h, li = ((size_t)b * H + h) * Sq + s;
                bool ok;
                if (el[li] == -INFINITY)
                    ok = gal[li] == -INFINITY;
                else
                    ok = fabs(gal[li] - el[li]) <= 1e-5 * (1 + fabs(el[li]));
                for (int d = 0; d < D; d++) {
                    double x = gacc[row * D + d], e = ea[row * D + d];
                    /* rows where one side is empty take the other side (near) exactly */
                    if (al[li] == -INFINITY || l[li] == -INFINITY)
                        ok = ok && fabs(x - e) <= 1e-6 * (1 + fabs(e));
                    ok = ok && !isnan(x);
                }
                if (!ok && bad++ < 3)
                    fail(S, what,
                         "row (b=%d s=%lld h=%d) lse %g + %g: got lse %g acc[0] %g, expected "
                         "%g, %g",
                         b, (long long)s, h, (double)al[li], (double)l[li], (double)gal[li],
                         (double)gacc[row * D], el[li], ea[row * D]);
            }
    cpc_compare_result r;
    cpc_compare(gacc, CPC_DTYPE_FP32, ea, (int64_t)n, 1e-5, &r);
    if (!r.pass)
        fail(S, what, "merged acc rel err %.3e > 1e-5 (NaN %lld, Inf %lld)", r.rel_err,
             (long long)r.n_nan, (long long)r.n_inf);
out:
    dev_free(be, dacc);
    dev_free(be, do_);
    dev_free(be, dal);
    dev_free(be, dl);
    free(acc), free(o), free(al), free(l), free(gacc), free(gal), free(ea), free(el);
}

/* ---- init_acc ------------------------------------------------------------------------ */

static void check_init(suite *S, cpc_backend *be, const char *what)
{
    const size_t sizes[][2] = {{1037, 333}, {5, 40}, {1, 1}, {64, 0}};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        size_t na = sizes[c][0], nl = sizes[c][1];
        const size_t tail = 8;
        float *a = test_xmalloc((na + tail) * 4), *l = test_xmalloc((nl + tail) * 4);
        fill_f32(a, na + tail, 1.5f);
        fill_f32(l, nl + tail, 2.5f);
        void *da = NULL, *dl = NULL;
        cpc_status *st;
        if ((st = dev_put(be, a, (na + tail) * 4, &da)) || (st = dev_put(be, l, (nl + tail) * 4, &dl)) ||
            (st = cpc_backend_init_acc(be, da, na, dl, nl)) || (st = dev_sync(be)) ||
            (st = cpc_backend_download(be, a, da, (na + tail) * 4)) ||
            (st = cpc_backend_download(be, l, dl, (nl + tail) * 4)))
            fail_st(S, what, "init_acc", st);
        else {
            int bad = 0;
            for (size_t i = 0; i < na + tail; i++)
                if (i < na ? (ubits(a[i]) != 0) : a[i] != 1.5f)
                    bad++;
            for (size_t i = 0; i < nl + tail; i++)
                if (i < nl ? l[i] != -INFINITY : l[i] != 2.5f)
                    bad++;
            if (bad)
                fail(S, what, "init_acc(n_acc %zu, n_lse %zu): %d elements wrong (acc must be +0, "
                              "lse -inf, and nothing beyond n written)",
                     na, nl, bad);
        }
        dev_free(be, da);
        dev_free(be, dl);
        free(a);
        free(l);
    }
}

/* ---- convert ----------------------------------------------------------------------- */

static uint16_t to16(cpc_dtype t, float f) { return t == CPC_DTYPE_BF16 ? cpc_f32_to_bf16(f) : cpc_f32_to_fp16(f); }
static float from16(cpc_dtype t, uint16_t h) { return t == CPC_DTYPE_BF16 ? cpc_bf16_to_f32(h) : cpc_fp16_to_f32(h); }

/* dst (dtype dt) must be exactly src (dtype st) converted; returns the number of
 * mismatches (NaN for NaN is a match). */
static int convert_and_compare(suite *S, cpc_backend *be, cpc_dtype dt, cpc_dtype stt,
                               const void *src, size_t n, const char *what)
{
    void *ds = NULL, *dd = NULL;
    void *got = test_xmalloc(n * test_esz(dt));
    cpc_status *st;
    int bad = 0;
    if ((st = dev_put(be, src, n * test_esz(stt), &ds)) || (st = dev_put(be, NULL, n * test_esz(dt), &dd)) ||
        (st = cpc_backend_convert(be, dd, dt, ds, stt, n)) || (st = dev_sync(be)) ||
        (st = cpc_backend_download(be, got, dd, n * test_esz(dt)))) {
        char w[200];
        snprintf(w, sizeof w, "%s: convert %s -> %s", what, cpc_dtype_name(stt), cpc_dtype_name(dt));
        fail_st(S, w, "convert", st);
        bad = -1;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        float x = stt == CPC_DTYPE_FP32 ? ((const float *)src)[i] : from16(stt, ((const uint16_t *)src)[i]);
        bool ok;
        if (dt == CPC_DTYPE_FP32) {
            float g = ((float *)got)[i];
            ok = isnan(x) ? isnan(g) : ubits(g) == ubits(x);
        } else {
            uint16_t g = ((uint16_t *)got)[i], e = to16(dt, x);
            ok = isnan(x) ? isnan(from16(dt, g)) : g == e;
        }
        if (!ok && bad++ < 3)
            fail(S, what, "convert %s -> %s: element %zu (%a) converted wrong", cpc_dtype_name(stt),
                 cpc_dtype_name(dt), i, (double)x);
    }
out:
    dev_free(be, ds);
    dev_free(be, dd);
    free(got);
    return bad;
}

static void check_convert(suite *S, cpc_backend *be, cpc_dtype dt, uint64_t seed,
                          bool pairs16, const char *what)
{
    enum { N = 1003 };
    float *f = test_xmalloc(N * 4);
    for (int i = 0; i < N; i++) {
        double x = test_normal_at(seed, 30, (uint64_t)i);
        f[i] = (float)(i % 3 == 0 ? 100.0 * x : i % 3 == 1 ? 70000.0 * x : 1e-6 * x);
    }
    const float special[] = {INFINITY, -INFINITY, -0.0f, 0.0f, NAN, 1e-8f, 0x1p-24f, 0x1p-25f,
                             65504.0f, 65520.0f, 3.4e38f, fbits(0x00010000u), 1.0f + 0x1p-8f,
                             1.0f + 0x3p-11f, -NAN, fbits(0x7f800001u)};
    memcpy(f, special, sizeof special);
    void *h = test_xmalloc(N * 2);
    if (dt != CPC_DTYPE_FP32) {
        cpc_from_f32_n(h, dt, f, N);
        convert_and_compare(S, be, dt, CPC_DTYPE_FP32, f, N, what);
        convert_and_compare(S, be, CPC_DTYPE_FP32, dt, h, N, what);
        convert_and_compare(S, be, dt, dt, h, N, what);
        if (pairs16) {
            cpc_dtype other = dt == CPC_DTYPE_BF16 ? CPC_DTYPE_FP16 : CPC_DTYPE_BF16;
            convert_and_compare(S, be, other, dt, h, N, what);
        }
    } else
        convert_and_compare(S, be, CPC_DTYPE_FP32, CPC_DTYPE_FP32, f, N, what);
    free(f);
    free(h);
}

/* ---- copy_strided ----------------------------------------------------------------------- */

static void copy_one(suite *S, cpc_backend *be, size_t es, bool aligned, uint64_t seed,
                     const char *what)
{
    const int64_t nb = 2, nt = 7, nh = 3, inner = aligned ? 64 : 37;
    /* source [nb, nt+1, nh+2, inner+3]; destination [nb, nh, nt, inner] (heads
     * outside tokens, as an all-to-all part) */
    const int64_t shs = inner + 3, sts = (nh + 2) * shs, sbs = (nt + 1) * sts;
    const int64_t dts = inner, dhs = nt * inner, dbs = nh * dhs;
    const int64_t off = aligned ? 0 : 1;
    const size_t src_n = (size_t)(nb * sbs) + 8, dst_n = (size_t)(nb * dbs) + 8;
    unsigned char *src = test_xmalloc(src_n * es), *dst = test_xmalloc(dst_n * es), *exp_ = test_xmalloc(dst_n * es);
    unsigned char *back = test_xmalloc(src_n * es), *eback = test_xmalloc(src_n * es);
    for (size_t i = 0; i < src_n * es; i++)
        src[i] = (unsigned char)test_bits_at(seed, 40, i);
    memset(dst, 0x5a, dst_n * es);
    memcpy(exp_, dst, dst_n * es);
    memset(back, 0x33, src_n * es);
    memcpy(eback, back, src_n * es);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t t = 0; t < nt; t++)
            for (int64_t h = 0; h < nh; h++) {
                size_t so = (size_t)(off + b * sbs + (t + 1) * sts + (h + 2) * shs) * es;
                memcpy(exp_ + (size_t)(off + b * dbs + t * dts + h * dhs) * es, src + so,
                       (size_t)inner * es);
                memcpy(eback + so, src + so, (size_t)inner * es);
            }
    void *ds = NULL, *dd = NULL, *db = NULL;
    cpc_status *st;
    char w[200];
    snprintf(w, sizeof w, "%s: copy_strided %zu-byte %s", what, es, aligned ? "aligned" : "unaligned");
    if ((st = dev_put(be, src, src_n * es, &ds)) || (st = dev_put(be, dst, dst_n * es, &dd)) ||
        (st = dev_put(be, back, src_n * es, &db))) {
        fail_st(S, w, "device buffers", st);
        goto out;
    }
    /* gather tokens 1..7, heads 2..4 */
    char *s0 = (char *)ds + (size_t)(off + sts + 2 * shs) * es, *d0 = (char *)dd + (size_t)off * es;
    if ((st = cpc_backend_copy_strided(be, d0, s0, es, nb, nt, nh, inner, dbs, dts, dhs, sbs, sts, shs)) ||
        (st = dev_sync(be)) || (st = cpc_backend_download(be, dst, dd, dst_n * es))) {
        fail_st(S, w, "gather", st);
        goto out;
    }
    if (memcmp(dst, exp_, dst_n * es) != 0)
        fail(S, w, "gathered tokens/heads differ (or bytes outside the parts were written)");
    /* scatter them back into a buffer of the source's shape */
    char *b0 = (char *)db + (size_t)(off + sts + 2 * shs) * es;
    if ((st = cpc_backend_copy_strided(be, b0, d0, es, nb, nt, nh, inner, sbs, sts, shs, dbs, dts, dhs)) ||
        (st = dev_sync(be)) || (st = cpc_backend_download(be, back, db, src_n * es))) {
        fail_st(S, w, "scatter", st);
        goto out;
    }
    if (memcmp(back, eback, src_n * es) != 0)
        fail(S, w, "scattered tokens/heads differ (or bytes outside them were written)");
    /* fully contiguous (a backend may fold it into one copy) */
    const size_t cn = (size_t)(nb * nt * nh * inner);
    if ((st = cpc_backend_copy_strided(be, dd, ds, es, nb, nt, nh, inner, nt * nh * inner, nh * inner,
                                   inner, nt * nh * inner, nh * inner, inner)) ||
        (st = dev_sync(be)) || (st = cpc_backend_download(be, dst, dd, cn * es))) {
        fail_st(S, w, "contiguous copy", st);
        goto out;
    }
    if (memcmp(dst, src, cn * es) != 0)
        fail(S, w, "contiguous copy differs");
out:
    dev_free(be, ds);
    dev_free(be, dd);
    dev_free(be, db);
    free(src), free(dst), free(exp_), free(back), free(eback);
}

/* ---- memory ------------------------------------------------------------------------------ */

static void check_memory(suite *S, cpc_backend *be, uint64_t seed, const char *what)
{
    void *p0 = NULL, *p1 = NULL, *p2 = NULL, *p3 = NULL;
    unsigned char host[1000], back[1000];
    cpc_status *st;
    if ((st = cpc_backend_alloc(be, 0, &p0)) || (st = cpc_backend_alloc(be, 0, &p1)) ||
        (st = cpc_backend_alloc(be, 1000, &p2)) || (st = cpc_backend_alloc(be, 1000, &p3))) {
        fail_st(S, what, "alloc", st);
        goto out;
    }
    if (!p0 || !p1 || !p2 || !p3 || p0 == p1)
        fail(S, what, "alloc(0) must return valid unique pointers");
    if ((uintptr_t)p2 % 16 || (uintptr_t)p3 % 16)
        fail(S, what, "allocations must be aligned to at least 16 bytes");
    for (int i = 0; i < 1000; i++)
        host[i] = (unsigned char)test_bits_at(seed, 50, (uint64_t)i);
    if ((st = cpc_backend_upload(be, p2, host, 1000)) || (st = cpc_backend_copy(be, p3, p2, 1000)) ||
        (st = dev_sync(be)) || (st = cpc_backend_download(be, back, p3, 1000))) {
        fail_st(S, what, "upload/copy/download", st);
        goto out;
    }
    if (memcmp(host, back, 1000) != 0)
        fail(S, what, "upload, copy, download: the bytes differ");
out:
    dev_free(be, p0);
    dev_free(be, p1);
    dev_free(be, p2);
    dev_free(be, p3);
}

/* ---- bad arguments ------------------------------------------------------------------------ */

/* The spec every bad-argument call is consistent with (only the tested
 * argument is wrong): fp32, head_dim 64, causal, group 2. */
enum { BA_D = 64 };

typedef struct bad_bufs {
    void *q, *k, *v, *o, *lse, *mask, *delta, *dq, *dk, *dv;
} bad_bufs;

/* Runs `a` and checks: refused with CPC_E_INTERNAL (want_error) or accepted,
 * and o/lse (n_o, n_l elements, filled with 7 before) untouched when refused.
 * Then, on a backend with a backward, the backward of the same problem
 * (attn_problem.h: one check for both directions): refused or accepted
 * alike, with the forward's message. */
static void bad_call(suite *S, cpc_backend *be, const bad_bufs *bb, const cpc_attn_args *a,
                     bool want_error, const char *name)
{
    enum { NO = 4 * 4 * 4 * BA_D, NL = 4 * 4 * 4 };
    static float seven[NO];
    for (int i = 0; i < NO; i++)
        seven[i] = 7.0f;
    char w[160];
    snprintf(w, sizeof w, "bad_args %s", name);
    cpc_status *st = cpc_backend_upload(be, bb->o, seven, sizeof seven);
    if (!st)
        st = cpc_backend_upload(be, bb->lse, seven, sizeof(float) * NL);
    if (st) {
        fail_st(S, w, "upload", st);
        return;
    }
    st = cpc_backend_attn(be, a);
    if (!st)
        st = dev_sync(be);
    char fwd_msg[512] = "";
    if (st)
        snprintf(fwd_msg, sizeof fwd_msg, "%s", st->message);
    if (cpc_backend_has_attn_bwd(be)) {
        cpc_attn_bwd_args g = {.p = a->p, .dout = bb->q, .dout_bstride = a->p.q_bstride, .lse = bb->lse,
                               .delta = bb->delta, .dq = bb->dq, .dk = bb->dk, .dv = bb->dv};
        cpc_status *sb = cpc_backend_attn_bwd(be, &g);
        if (!sb)
            sb = dev_sync(be);
        if ((sb != NULL) != want_error)
            fail(S, w, "the backward of the problem is %s, the forward %s", sb ? "refused" : "accepted",
                 want_error ? "refuses it" : "accepts it");
        else if (sb && strcmp(sb->message, fwd_msg) != 0)
            fail(S, w, "the backward refuses it with \"%s\", the forward with \"%s\"", sb->message, fwd_msg);
        cpc_status_free(sb);
    }
    if (want_error) {
        if (!st) {
            fail(S, w, "accepted; the contract refuses it (CPC_E_INTERNAL)");
        } else if (st->code != CPC_E_INTERNAL) {
            fail(S, w, "refused with %s, expected CPC_E_INTERNAL: %s", cpc_code_name(st->code),
                 st->message);
        }
        cpc_status_free(st);
        float o[NO], l[NL];
        if ((st = cpc_backend_download(be, o, bb->o, sizeof o)) ||
            (st = cpc_backend_download(be, l, bb->lse, sizeof l))) {
            fail_st(S, w, "download", st);
            return;
        }
        for (int i = 0; i < NO; i++)
            if (o[i] != 7.0f) {
                fail(S, w, "refused, but o[%d] was written (%g)", i, (double)o[i]);
                break;
            }
        for (int i = 0; i < NL; i++)
            if (l[i] != 7.0f) {
                fail(S, w, "refused, but lse[%d] was written (%g)", i, (double)l[i]);
                break;
            }
    } else if (st) {
        fail_st(S, w, "attn", st);
    }
}

static void check_bad_args(suite *S)
{
    const char *what = "bad_args";
    cpc_kernel_spec spec = {CPC_DTYPE_FP32, BA_D, true, 2};
    cpc_backend *be = NULL;
    cpc_status *st = make_backend(S, &spec, &be);
    if (st) {
        fail_st(S, what, "create backend", st);
        return;
    }
    enum { NO = 4 * 4 * 4 * BA_D, NL = 4 * 4 * 4 };
    bad_bufs bb = {0};
    float *ones = test_xmalloc(sizeof(float) * NO);
    fill_f32(ones, NO, 0.25f);
    uint8_t mk[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    if ((st = dev_put(be, ones, sizeof(float) * NO, &bb.q)) ||
        (st = dev_put(be, ones, sizeof(float) * NO, &bb.k)) ||
        (st = dev_put(be, ones, sizeof(float) * NO, &bb.v)) ||
        (st = dev_put(be, NULL, sizeof(float) * NO, &bb.o)) ||
        (st = dev_put(be, NULL, sizeof(float) * NL, &bb.lse)) ||
        (st = dev_put(be, mk, sizeof mk, &bb.mask)) ||
        (st = dev_put(be, NULL, sizeof(float) * NL, &bb.delta)) ||
        (st = dev_put(be, NULL, sizeof(float) * NO, &bb.dq)) ||
        (st = dev_put(be, NULL, sizeof(float) * NO, &bb.dk)) ||
        (st = dev_put(be, NULL, sizeof(float) * NO, &bb.dv))) {
        fail_st(S, what, "device buffers", st);
        goto out;
    }
    /* a valid base: B=1, sq=skv=2, query heads [0,2) of group 2 -> K/V head 0 */
    const cpc_attn_args base = {.p.B = 1, .p.sq = 2, .p.skv = 2, .p.hq = 2, .p.hkv = 1, .p.d = BA_D, .p.group = 2,
                                .p.dtype = CPC_DTYPE_FP32, .p.q = bb.q, .p.k = bb.k, .p.v = bb.v,
                                .p.q_bstride = 2 * 2 * BA_D, .p.kv_bstride = 2 * BA_D, .o = bb.o,
                                .lse = bb.lse, .p.scale = 0.125f, .p.causal = true};
    bad_call(S, be, &bb, &base, false, "valid_base");
    cpc_attn_args a;
    /* query heads [0, 4) with group 2 need K/V heads 0..1, the block holds one */
    a = base, a.p.hq = 4;
    bad_call(S, be, &bb, &a, true, "kv_heads_not_in_block");
    /* query heads [2, 4) need K/V head 1; the block holds head 0 only */
    a = base, a.p.q_head_off = 2;
    bad_call(S, be, &bb, &a, true, "kv_head_offset_wrong");
    /* query runs that do not cover the rows (5 positions for 2 rows), and too few */
    cpc_run r5 = {0, 5}, r1 = {0, 1};
    a = base, a.p.q_runs = &r5, a.p.n_q_runs = 1;
    bad_call(S, be, &bb, &a, true, "q_runs_longer_than_rows");
    a = base, a.p.kv_runs = &r1, a.p.n_kv_runs = 1;
    bad_call(S, be, &bb, &a, true, "kv_runs_shorter_than_rows");
    /* a key position beyond the key padding mask */
    cpc_run kr = {1, 2};
    a = base, a.p.kv_runs = &kr, a.p.n_kv_runs = 1, a.p.kv_mask = bb.mask, a.p.mask_len = 2;
    bad_call(S, be, &bb, &a, true, "key_position_outside_mask");
    /* batch strides smaller than a batch's block */
    a = base, a.p.B = 2, a.p.q_bstride = 2 * BA_D;
    bad_call(S, be, &bb, &a, true, "q_batch_stride_too_small");
    a = base, a.p.B = 2, a.p.q_bstride = 2 * 2 * BA_D, a.p.kv_bstride = BA_D;
    bad_call(S, be, &bb, &a, true, "kv_batch_stride_too_small");
    /* negative sizes, group 0 */
    a = base, a.p.sq = -1;
    bad_call(S, be, &bb, &a, true, "negative_sq");
    a = base, a.p.B = -1;
    bad_call(S, be, &bb, &a, true, "negative_B");
    a = base, a.p.group = 0;
    bad_call(S, be, &bb, &a, true, "group_0");
    /* no q with rows to compute; run counts without runs */
    a = base, a.p.q = NULL;
    bad_call(S, be, &bb, &a, true, "null_q");
    a = base, a.p.n_q_runs = 1;
    bad_call(S, be, &bb, &a, true, "run_count_without_runs");
    /* not errors: nothing to do */
    a = base, a.p.sq = 0;
    bad_call(S, be, &bb, &a, false, "sq_0");
    a = base, a.p.B = 0;
    bad_call(S, be, &bb, &a, false, "B_0");
    /* no key at all: every row o = 0, lse = -inf */
    a = base, a.p.skv = 0, a.p.k = NULL, a.p.v = NULL;
    bad_call(S, be, &bb, &a, false, "skv_0");
    {
        float o[2 * 2 * BA_D], l[4];
        if ((st = cpc_backend_download(be, o, bb.o, sizeof o)) || (st = cpc_backend_download(be, l, bb.lse, sizeof l)))
            fail_st(S, "bad_args skv_0", "download", st);
        else {
            for (int i = 0; i < 2 * 2 * BA_D; i++)
                if (o[i] != 0.0f) {
                    fail(S, "bad_args skv_0", "o[%d] = %g, every row sees no key: o must be 0", i,
                         (double)o[i]);
                    break;
                }
            for (int i = 0; i < 4; i++)
                if (l[i] != -INFINITY) {
                    fail(S, "bad_args skv_0", "lse[%d] = %g, must be -inf", i, (double)l[i]);
                    break;
                }
        }
    }
    /* the backend is still usable after the refusals */
    bad_call(S, be, &bb, &base, false, "valid_after_refusals");
out:
    dev_free(be, bb.q);
    dev_free(be, bb.k);
    dev_free(be, bb.v);
    dev_free(be, bb.o);
    dev_free(be, bb.lse);
    dev_free(be, bb.mask);
    dev_free(be, bb.delta);
    dev_free(be, bb.dq);
    dev_free(be, bb.dk);
    dev_free(be, bb.dv);
    cpc_backend_destroy(be);
    free(ones);
}

/* ---- add_strided ------------------------------------------------------------------------ */

/* fp32 dst += src with copy_strided's geometry: a strided [2, 5, 3, 7] block
 * (gaps between rows, heads and batches that must stay untouched) and one
 * long contiguous row; bitwise against the host's fp32 sums. */
static void check_add(suite *S, cpc_backend *be, uint64_t seed, const char *what)
{
    if (!be->vt->add_strided) {
        fail(S, what, "the backend has no add_strided");
        return;
    }
    for (int shape = 0; shape < 2; shape++) {
        int64_t nb = 2, nt = 5, nh = 3, inner = 7, dhs = 9, dts = 3 * 9 + 2, dbs = 5 * dts + 3;
        int64_t shs = 8, sts = 3 * 8 + 1, sbs = 5 * sts + 5;
        if (shape == 1) {
            nb = nt = nh = 1;
            inner = 1000;
            dhs = dts = dbs = shs = sts = sbs = 0;
        }
        size_t nd = shape ? (size_t)inner : (size_t)(nb * dbs), ns = shape ? (size_t)inner : (size_t)(nb * sbs);
        float *hd = test_xmalloc(nd * 4), *hs = test_xmalloc(ns * 4), *want = test_xmalloc(nd * 4),
              *got = test_xmalloc(nd * 4);
        for (size_t i = 0; i < nd; i++)
            hd[i] = want[i] = (float)test_normal_at(seed, 40 + (uint64_t)shape, i);
        for (size_t i = 0; i < ns; i++)
            hs[i] = (float)test_normal_at(seed, 42 + (uint64_t)shape, i);
        for (int64_t b = 0; b < nb; b++)
            for (int64_t t = 0; t < nt; t++)
                for (int64_t h = 0; h < nh; h++)
                    for (int64_t e = 0; e < inner; e++)
                        want[b * dbs + t * dts + h * dhs + e] += hs[b * sbs + t * sts + h * shs + e];
        void *dd = NULL, *ds = NULL;
        cpc_status *st;
        if ((st = dev_put(be, hd, nd * 4, &dd)) || (st = dev_put(be, hs, ns * 4, &ds)) ||
            (st = cpc_backend_add_strided(be, dd, ds, nb, nt, nh, inner, dbs, dts, dhs, sbs, sts, shs)) ||
            (st = dev_sync(be)) || (st = cpc_backend_download(be, got, dd, nd * 4)))
            fail_st(S, what, "add_strided", st);
        else if (memcmp(got, want, nd * 4) != 0) {
            size_t k = 0;
            while (k < nd && ubits(got[k]) == ubits(want[k]))
                k++;
            fail(S, what, "add_strided (%s): element %zu is %g, want %g (the sums, and nothing else)",
                 shape ? "one long row" : "strided block", k, (double)got[k], (double)want[k]);
        }
        dev_free(be, dd);
        dev_free(be, ds);
        free(hd);
        free(hs);
        free(want);
        free(got);
    }
}

/* ---- the driver ------------------------------------------------------------------------- */

static bool prefix(const char *name, const char *p) { return !p || !*p || strncmp(name, p, strlen(p)) == 0; }

cpc_status *cpc_backend_conformance(const cpc_bc_backend *be, const cpc_bc_opts *opts,
                                    cpc_bc_report *report)
{
    static const cpc_bc_opts defaults = {0};
    suite S = {.be = be, .o = opts ? opts : &defaults};
    S.log = S.o->log;
    double t0 = now_s();
    S.seed = S.o->seed;
    const char *env = getenv("CPC_TEST_SEED");
    if (!S.seed && env)
        S.seed = strtoull(env, NULL, 10);
    if (!S.seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        S.seed = (mix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40)) %
                  1000000007u) + 1;
    }
    S.rep.seed = S.seed;
    unsigned checks = (S.o->checks ? S.o->checks : CPC_BC_ALL) & ~S.o->skip;
    const char *only = S.o->only ? S.o->only : getenv("CPC_BC_ONLY");
    unsigned dts_all = (1u << CPC_DTYPE_FP32) | (1u << CPC_DTYPE_BF16) | (1u << CPC_DTYPE_FP16);
    unsigned dts_run = S.o->dtypes ? S.o->dtypes & dts_all : dts_all;
    if (S.log) {
        fprintf(S.log, "conformance %s: seed %llu (CPC_TEST_SEED=%llu replays)\n", be->name,
                (unsigned long long)S.seed, (unsigned long long)S.seed);
        if (S.o->skip)
            fprintf(S.log, "conformance %s: checks skipped (0x%x): %s\n", be->name, S.o->skip,
                    S.o->skip_reason ? S.o->skip_reason : "(no reason given)");
    }
    const cpc_dtype dorder[3] = {CPC_DTYPE_FP32, CPC_DTYPE_BF16, CPC_DTYPE_FP16};
    if (checks & CPC_BC_ATTN) {
        int n = 0;
        const cpc_bc_case *cs = cpc_bc_cases(&n);
        for (int ci = 0; ci < n; ci++) {
            const cpc_bc_case *c = &cs[ci];
            if (!prefix(c->name, only) || (c->flags & S.o->exclude_flags))
                continue;
            unsigned dts = (c->dtypes ? c->dtypes : dts_all) & dts_run;
            for (int t = 0; t < 3; t++) {
                cpc_dtype dt = dorder[t];
                if (!(dts & (1u << dt)))
                    continue;
                const char *why = be->skip_case ? be->skip_case(be->ctx, c, dt) : NULL;
                if (why) {
                    S.rep.cases_skipped++;
                    if (S.log)
                        fprintf(S.log, "conformance %s: attn %-44s %s: SKIP: %s\n", be->name,
                                c->name, cpc_dtype_name(dt), why);
                    continue;
                }
                attn_case(&S, c, dt, mix(S.seed ^ mix((uint64_t)ci * 3 + (uint64_t)t)));
                S.rep.cases_run++;
            }
        }
    }
    if (checks & CPC_BC_BWD) {
        int n = 0;
        const cpc_bc_case *cs = cpc_bc_bwd_cases(&n);
        for (int ci = 0; ci < n; ci++) {
            const cpc_bc_case *c = &cs[ci];
            if (!prefix(c->name, only) || (c->flags & S.o->exclude_flags))
                continue;
            unsigned dts = (c->dtypes ? c->dtypes : dts_all) & dts_run;
            for (int t = 0; t < 3; t++) {
                cpc_dtype dt = dorder[t];
                if (!(dts & (1u << dt)))
                    continue;
                const char *why = be->skip_case ? be->skip_case(be->ctx, c, dt) : NULL;
                if (why) {
                    S.rep.cases_skipped++;
                    if (S.log)
                        fprintf(S.log, "conformance %s: attn_bwd %-36s %s: SKIP: %s\n", be->name,
                                c->name, cpc_dtype_name(dt), why);
                    continue;
                }
                bwd_case(&S, c, dt, mix(S.seed ^ mix(0x5eedull + (uint64_t)ci * 3 + (uint64_t)t)));
                S.rep.cases_run++;
            }
        }
    }
    /* the other methods, once per dtype on a backend made for it */
    unsigned mem_checks = checks & (CPC_BC_MERGE | CPC_BC_INIT | CPC_BC_CONVERT | CPC_BC_COPY |
                                    CPC_BC_MEMORY | CPC_BC_ADD);
    bool want_mem = mem_checks && (!only || !*only || prefix("methods", only));
    for (int t = 0; want_mem && t < 3; t++) {
        cpc_dtype dt = dorder[t];
        if (!(dts_run & (1u << dt)))
            continue;
        char what[96];
        snprintf(what, sizeof what, "methods %s", cpc_dtype_name(dt));
        double t1 = now_s();
        uint64_t seed = mix(S.seed ^ (0xabcdull + (uint64_t)t));
        cpc_kernel_spec spec = {dt, 64, false, 1};
        cpc_backend *b = NULL;
        cpc_status *st = make_backend(&S, &spec, &b);
        if (st) {
            fail_st(&S, what, "create backend", st);
            continue;
        }
        int before = S.fails;
        char w[128];
        if (mem_checks & CPC_BC_MEMORY) {
            snprintf(w, sizeof w, "%s: memory", what);
            check_memory(&S, b, seed, w);
            S.rep.checks_run++;
        }
        if (mem_checks & CPC_BC_INIT) {
            snprintf(w, sizeof w, "%s: init_acc", what);
            check_init(&S, b, w);
            S.rep.checks_run++;
        }
        if (mem_checks & CPC_BC_MERGE) {
            snprintf(w, sizeof w, "%s: merge", what);
            check_merge(&S, b, spec.head_dim, seed, w);
            S.rep.checks_run++;
        }
        if (mem_checks & CPC_BC_CONVERT) {
            snprintf(w, sizeof w, "%s: convert", what);
            check_convert(&S, b, dt, seed, (checks & CPC_BC_CONVERT_16_16) != 0, w);
            S.rep.checks_run++;
        }
        if (mem_checks & CPC_BC_ADD) {
            snprintf(w, sizeof w, "%s: add_strided", what);
            check_add(&S, b, seed, w);
            S.rep.checks_run++;
        }
        if (mem_checks & CPC_BC_COPY) {
            snprintf(w, sizeof w, "%s: copy_strided", what);
            for (int al = 0; al < 2; al++) {
                copy_one(&S, b, test_esz(dt), al == 0, seed, w);
                if (dt != CPC_DTYPE_FP32)
                    copy_one(&S, b, 4, al == 0, seed, w);
            }
            S.rep.checks_run++;
        }
        cpc_backend_destroy(b);
        if (S.log)
            fprintf(S.log, "conformance %s: %s (memory, init_acc, merge, convert, copy_strided, add_strided): %s  %.2f s\n",
                    be->name, what, S.fails == before ? "ok" : "FAIL", now_s() - t1);
    }
    if ((checks & CPC_BC_BAD_ARGS) && (!only || !*only || prefix("bad_args", only))) {
        int before = S.fails;
        check_bad_args(&S);
        S.rep.checks_run++;
        if (S.log)
            fprintf(S.log, "conformance %s: bad_args: %s\n", be->name, S.fails == before ? "ok" : "FAIL");
    }
    S.rep.seconds = now_s() - t0;
    if (S.log)
        fprintf(S.log, "conformance %s: %d cases run, %d skipped, %d other checks, %d failures, %.1f s\n",
                be->name, S.rep.cases_run, S.rep.cases_skipped, S.rep.checks_run, S.fails,
                S.rep.seconds);
    if (report)
        *report = S.rep;
    return S.chain;
}
