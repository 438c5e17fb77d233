/*
 * test_attn_problem.c - the one attention problem (runtime/backend/
 * attn_problem.h): cpc_attn_problem_check refuses each inconsistency, one
 * case per rule, with CPC_E_INTERNAL and a message naming it; the CPU
 * backend's forward and backward refuse every one of those problems with
 * the very same message (one check, two directions); and the shared
 * helpers (positions, GQA heads, tiling) on small hand-worked cases.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn_problem.h"
#include "backend.h"

enum { B = 2, SQ = 3, SKV = 4, HQ = 4, HKV = 2, D = 4, GROUP = 2, MASK_LEN = 8 };

static float q[B * SQ * HQ * D], k[B * SKV * HKV * D], v[B * SKV * HKV * D];
static const cpc_run q_runs[2] = {{5, 2}, {1, 1}};  /* rows at positions 5, 6, 1 */
static const cpc_run kv_runs[2] = {{4, 3}, {0, 1}}; /* keys at 4, 5, 6, 0 */
static const uint8_t mask[B * MASK_LEN] = {1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

/* A valid problem using every feature: batch, GQA, runs, causal, padding. */
static cpc_attn_problem good(void)
{
    return (cpc_attn_problem){.B = B, .sq = SQ, .skv = SKV, .hq = HQ, .hkv = HKV, .d = D, .group = GROUP,
                              .dtype = CPC_DTYPE_FP32, .q = q, .k = k, .v = v,
                              .q_bstride = SQ * HQ * D, .kv_bstride = SKV * HKV * D, .scale = 0.5f,
                              .causal = true, .q_runs = q_runs, .n_q_runs = 2, .kv_runs = kv_runs,
                              .n_kv_runs = 2, .kv_mask = mask, .mask_len = MASK_LEN};
}

/* One broken problem per rule of cpc_attn_problem_check (2..11; rule 1 is
 * NULL) and a word its message must contain. */
typedef struct bad_case {
    const char *name, *word;
    cpc_attn_problem p;
} bad_case;

static const cpc_run neg_len[1] = {{0, -1}};
static const cpc_run q_short[1] = {{0, 2}};
static const cpc_run kv_long[2] = {{0, 4}, {9, 1}};
static const cpc_run kv_past_mask[1] = {{6, 4}};

static int bad_cases(bad_case *c)
{
    int n = 0;
    c[n] = (bad_case){"negative size", "bad sizes", good()};
    c[n++].p.skv = -1;
    c[n] = (bad_case){"unknown dtype", "unknown dtype", good()};
    c[n++].p.dtype = (cpc_dtype)77;
    c[n] = (bad_case){"heads * head_dim beyond BLAS", "BLAS index range", good()};
    c[n].p.d = 1 << 30, c[n].p.B = 1, c[n++].p.sq = 0; /* no stride rule in the way */
    c[n] = (bad_case){"query heads need a K/V head the block lacks", "need K/V heads", good()};
    c[n++].p.kv_head_off = 1;
    c[n] = (bad_case){"batch stride smaller than a batch's block", "batch strides", good()};
    c[n++].p.kv_bstride = SKV * HKV * D - 1;
    c[n] = (bad_case){"no q with rows", "are required", good()};
    c[n++].p.q = NULL;
    c[n] = (bad_case){"malformed run list", "bad run lists", good()};
    c[n].p.kv_runs = neg_len, c[n++].p.n_kv_runs = 1;
    c[n] = (bad_case){"query runs short of the rows", "query runs do not cover", good()};
    c[n].p.q_runs = q_short, c[n++].p.n_q_runs = 1;
    c[n] = (bad_case){"key runs beyond the keys", "key runs do not cover", good()};
    c[n].p.kv_runs = kv_long, c[n++].p.n_kv_runs = 2;
    c[n] = (bad_case){"key position outside the mask", "outside the key padding mask", good()};
    c[n].p.kv_runs = kv_past_mask, c[n++].p.n_kv_runs = 1;
    return n;
}

Test(attn_problem, valid_problems_pass)
{
    cpc_attn_problem p = good();
    cr_assert_null(cpc_attn_problem_check(&p));
    /* nothing to compute is valid whatever the (absent) inputs */
    p = good();
    p.sq = 0, p.q = NULL, p.q_runs = NULL, p.n_q_runs = 0;
    cr_assert_null(cpc_attn_problem_check(&p));
    p = good();
    p.skv = 0, p.k = p.v = NULL, p.kv_runs = NULL, p.n_kv_runs = 0;
    cr_assert_null(cpc_attn_problem_check(&p));
    /* no runs: positions 0..skv-1, inside a mask of length skv */
    p = good();
    p.kv_runs = NULL, p.n_kv_runs = 0, p.mask_len = SKV;
    cr_assert_null(cpc_attn_problem_check(&p));
}

Test(attn_problem, each_rule_refuses_its_inconsistency)
{
    cpc_status *st = cpc_attn_problem_check(NULL);
    cr_assert_not_null(st, "rule 1: NULL");
    cr_assert_eq(cpc_status_code(st), CPC_E_INTERNAL);
    cpc_status_free(st);
    bad_case c[16];
    int n = bad_cases(c);
    cr_assert_eq(n, 10, "one case for each of rules 2..11");
    for (int i = 0; i < n; i++) {
        st = cpc_attn_problem_check(&c[i].p);
        cr_assert_not_null(st, "%s: accepted", c[i].name);
        cr_assert_eq(cpc_status_code(st), CPC_E_INTERNAL, "%s: code %d", c[i].name, cpc_status_code(st));
        cr_assert(strstr(st->message, c[i].word) != NULL, "%s: message \"%s\" does not say \"%s\"", c[i].name,
                  st->message, c[i].word);
        cr_assert(strncmp(st->message, "attention: ", 11) == 0, "%s: \"%s\"", c[i].name, st->message);
        cpc_status_free(st);
    }
    /* the other rules of rule 2: every size has its bound */
    const char *field[] = {"B", "sq", "hq", "hkv", "d", "group", "q_head_off", "kv_head_off"};
    for (int f = 0; f < 8; f++) {
        cpc_attn_problem p = good();
        int *slot[] = {&p.B, NULL, &p.hq, &p.hkv, &p.d, &p.group, &p.q_head_off, &p.kv_head_off};
        if (slot[f])
            *slot[f] = f == 3 || f == 4 || f == 5 ? 0 : -1;
        else
            p.sq = -1;
        st = cpc_attn_problem_check(&p);
        cr_assert_not_null(st, "%s out of range accepted", field[f]);
        cr_assert(strstr(st->message, "bad sizes") != NULL, "%s: %s", field[f], st->message);
        cpc_status_free(st);
    }
    /* rule 4: a block whose element count overflows int64 */
    cpc_attn_problem big = good();
    big.B = 1, big.skv = INT64_MAX / 2;
    st = cpc_attn_problem_check(&big);
    cr_assert(st && strstr(st->message, "int64"), "%s", st ? st->message : "accepted");
    cpc_status_free(st);
    /* rule 11: a negative mask length */
    cpc_attn_problem p = good();
    p.mask_len = -1;
    st = cpc_attn_problem_check(&p);
    cr_assert_not_null(st);
    cpc_status_free(st);
}

Test(attn_problem, forward_and_backward_refuse_alike)
{
    cpc_backend *be = NULL;
    cr_assert_null(cpc_cpu_backend_create(&be));
    static float o[B * SQ * HQ * D], lse[B * HQ * SQ], dout[B * SQ * HQ * D], delta[B * HQ * SQ];
    static float dq[B * SQ * HQ * D], dk[B * SKV * HKV * D], dv[B * SKV * HKV * D];
    bad_case c[16];
    int n = bad_cases(c);
    for (int i = -1; i < n; i++) {
        cpc_attn_problem p = i < 0 ? good() : c[i].p;
        const char *name = i < 0 ? "valid" : c[i].name;
        cpc_attn_args fa = {.p = p, .o = o, .lse = lse};
        cpc_attn_bwd_args ba = {.p = p, .dout = dout, .dout_bstride = p.q_bstride, .lse = lse, .delta = delta,
                                .dq = dq, .dk = dk, .dv = dv};
        cpc_status *sf = cpc_backend_attn(be, &fa);
        cpc_status *sb = cpc_backend_attn_bwd(be, &ba);
        cpc_status *sp = cpc_attn_problem_check(&p);
        if (i < 0) {
            cr_assert_null(sf, "%s", sf ? sf->message : "");
            cr_assert_null(sb, "%s", sb ? sb->message : "");
            cr_assert_null(sp);
            continue;
        }
        cr_assert(sf && sb && sp, "%s: forward %p backward %p check %p", name, (void *)sf, (void *)sb, (void *)sp);
        cr_assert_str_eq(sf->message, sb->message, "%s", name);
        cr_assert_str_eq(sf->message, sp->message, "%s", name);
        cr_assert_eq(cpc_status_code(sf), CPC_E_INTERNAL);
        cr_assert_eq(cpc_status_code(sb), CPC_E_INTERNAL);
        cpc_status_free(sf);
        cpc_status_free(sb);
        cpc_status_free(sp);
    }
    /* a direction's own pointer is that direction's refusal only */
    cpc_attn_args fa = {.p = good(), .o = o, .lse = NULL};
    cpc_status *st = cpc_backend_attn(be, &fa);
    cr_assert(st && strstr(st->message, "attention forward: ") == st->message, "%s", st ? st->message : "");
    cpc_status_free(st);
    cpc_attn_bwd_args ba = {.p = good(), .dout = dout, .dout_bstride = SQ * HQ * D, .lse = lse, .delta = delta,
                            .dq = dq, .dk = NULL, .dv = dv};
    st = cpc_backend_attn_bwd(be, &ba);
    cr_assert(st && strstr(st->message, "attention backward: ") == st->message, "%s", st ? st->message : "");
    cpc_status_free(st);
    cpc_backend_destroy(be);
}

Test(attn_problem, positions_and_heads)
{
    int64_t pos[4];
    cpc_attn_positions(kv_runs, 2, 4, pos);
    cr_assert(pos[0] == 4 && pos[1] == 5 && pos[2] == 6 && pos[3] == 0);
    cpc_attn_positions(NULL, 0, 3, pos);
    cr_assert(pos[0] == 0 && pos[1] == 1 && pos[2] == 2);
    /* group 2: query heads 2..5 (q_head_off 2, hq 4) use global K/V heads 1, 2;
     * the block holds K/V heads 1..2 (kv_head_off 1) */
    cpc_attn_problem p = good();
    p.q_head_off = 2, p.kv_head_off = 1;
    int h0, h1;
    cr_assert(cpc_attn_q_heads(&p, 0, &h0, &h1) && h0 == 0 && h1 == 2);
    cr_assert(cpc_attn_q_heads(&p, 1, &h0, &h1) && h0 == 2 && h1 == 4);
    /* a query block that starts mid-group: heads 3..4 -> K/V heads 1 (head 3) and 2 (head 4) */
    p.q_head_off = 3, p.hq = 2;
    cr_assert(cpc_attn_q_heads(&p, 0, &h0, &h1) && h0 == 0 && h1 == 1);
    cr_assert(cpc_attn_q_heads(&p, 1, &h0, &h1) && h0 == 1 && h1 == 2);
    cr_assert_null(cpc_attn_problem_check(&p));
}

Test(attn_problem, tiling_skips_trims_and_masks)
{
    /* 4 query rows at positions 0..3, 4 keys at 0..3, tiles of 2 x 2, causal,
     * batch 1 pads key 1 out, batch 0 keeps every key */
    static const uint8_t mk[2 * 4] = {1, 1, 1, 1, 1, 0, 1, 1};
    cpc_attn_problem p = {.B = 2, .sq = 4, .skv = 4, .hq = 1, .hkv = 1, .d = 1, .group = 1,
                          .dtype = CPC_DTYPE_FP32, .q = q, .k = k, .v = v, .q_bstride = 4, .kv_bstride = 4,
                          .scale = 1.0f, .causal = true, .kv_mask = mk, .mask_len = 4};
    cr_assert_null(cpc_attn_problem_check(&p));
    cpc_attn_tiling t = {0};
    cr_assert_null(cpc_attn_tiling_prepare(&t, &p, 2, 2));
    cr_assert(t.n_qt == 2 && t.n_kt == 2);
    cpc_attn_tiling_batch(&t, &p, 0);
    cpc_attn_tile tl;
    cr_assert(!cpc_attn_tile_pair(&t, &p, 0, 1, &tl), "rows 0..1 see no key of 2..3");
    cr_assert(cpc_attn_tile_pair(&t, &p, 1, 0, &tl) && !tl.diag && !tl.pad && tl.bcx == 2 && tl.r0 == 0);
    cr_assert(cpc_attn_tile_pair(&t, &p, 0, 0, &tl) && tl.diag && tl.bcx == 2 && tl.r0 == 0);
    float sr[2] = {1.0f, 1.0f};
    cpc_attn_mask_row(&t, &tl, 0, sr); /* row at position 0 sees key 0 only */
    cr_assert(sr[0] == 1.0f && sr[1] == -INFINITY);
    cpc_attn_tiling_batch(&t, &p, 1);
    cr_assert(cpc_attn_tile_pair(&t, &p, 1, 0, &tl) && tl.pad);
    sr[0] = sr[1] = 1.0f;
    cpc_attn_mask_row(&t, &tl, 0, sr); /* key 1 padded out */
    cr_assert(sr[0] == 1.0f && sr[1] == -INFINITY);
    cpc_attn_tiling_free(&t);
}
