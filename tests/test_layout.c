/* test_layout.c - token and head placement (compiler/ir/layout.h): tensor_split,
 * segment-wise shards, zigzag, ring blocks, uneven heads, GQA. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

/* A plan filled by hand (the YAML loader is tested elsewhere); freed by
 * free_plan, not cpc_plan_free, so this suite depends only on layout.c. */
static cpc_plan *mk_plan(int H, int Hkv, int D, int P, const int64_t *seg, int n_seg)
{
    cpc_plan *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    p->file = strdup("test.yaml");
    p->name = strdup("test");
    p->version = 1;
    p->model.heads = H;
    p->model.kv_heads = Hkv;
    p->model.head_dim = D;
    p->model.dtype = CPC_DTYPE_BF16;
    p->model.layers = 1;
    p->input.batch = 1;
    p->input.n_segments = n_seg;
    p->input.segments = calloc((size_t)n_seg, sizeof *p->input.segments);
    cr_assert_not_null(p->input.segments);
    for (int i = 0; i < n_seg; i++) {
        p->input.segments[i].name = strdup(i == 0 ? "text" : "image");
        p->input.segments[i].tokens = seg[i];
        p->input.total_tokens += seg[i];
    }
    p->cluster.world_size = P;
    p->schedule.overlap = true;
    return p;
}

static void free_plan(cpc_plan *p)
{
    for (int i = 0; i < p->input.n_segments; i++)
        free(p->input.segments[i].name);
    free(p->input.segments);
    free(p->file);
    free(p->name);
    free(p);
}

static cpc_layout mk_layout(cpc_plan *plan, cpc_variant v, int R, int U)
{
    cpc_layout L;
    cpc_status *st = cpc_layout_init(&L, plan, v, R, U);
    cr_assert_null(st, "layout_init: %s", st ? st->message : "");
    return L;
}

Test(layout, tensor_split)
{
    const int64_t want[4] = {993, 992, 992, 992};
    const int64_t off[4] = {0, 993, 1985, 2977};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(cpc_split_len(3969, 4, i), want[i]);
        cr_assert_eq(cpc_split_off(3969, 4, i), off[i]);
    }
    cr_assert_eq(cpc_split_len(7, 2, 0), 4);
    cr_assert_eq(cpc_split_len(7, 2, 1), 3);
    cr_assert_eq(cpc_split_off(7, 2, 1), 4);
    cr_assert_eq(cpc_split_off(7, 2, 2), 7);
    /* Fewer items than chunks: the first n get one, the rest none. */
    cr_assert_eq(cpc_split_len(3, 5, 2), 1);
    cr_assert_eq(cpc_split_len(3, 5, 3), 0);
    cr_assert_eq(cpc_split_off(3, 5, 4), 3);
    /* Invariants over a range of sizes. */
    for (int64_t n = 0; n < 40; n++)
        for (int64_t w = 1; w < 12; w++) {
            int64_t sum = 0;
            for (int64_t i = 0; i < w; i++) {
                int64_t l = cpc_split_len(n, w, i);
                cr_assert_eq(cpc_split_off(n, w, i), sum);
                cr_assert(l == n / w || l == n / w + 1);
                if (i > 0)
                    cr_assert_leq(l, cpc_split_len(n, w, i - 1));
                sum += l;
            }
            cr_assert_eq(sum, n);
            cr_assert_eq(cpc_split_off(n, w, w), n);
        }
}

/* FLUX at 1008x1008 over 4 ranks: 512 text tokens + 3969 image tokens, each
 * segment split separately; each rank holds its text chunk then its image
 * chunk (positions are global, text first). */
Test(layout, shards_of_two_segments)
{
    const int64_t seg[2] = {512, 3969};
    cpc_plan *plan = mk_plan(24, 24, 128, 4, seg, 2);
    cpc_layout L = mk_layout(plan, CPC_VARIANT_ULYSSES_ANYTHING, 1, 4);
    cr_assert_eq(L.S, 4481);
    cr_assert_eq(L.Skv, 4481);
    cr_assert_eq(cpc_layout_max_shard_runs(&L), 2);
    const int64_t img_len[4] = {993, 992, 992, 992};
    const int64_t img_off[4] = {0, 993, 1985, 2977};
    for (int p = 0; p < 4; p++) {
        cpc_run runs[4];
        int n = cpc_layout_shard_runs(&L, p, runs, 4);
        cr_assert_eq(n, 2, "rank %d", p);
        cr_assert_eq(runs[0].start, 128 * p);
        cr_assert_eq(runs[0].len, 128);
        cr_assert_eq(runs[1].start, 512 + img_off[p]);
        cr_assert_eq(runs[1].len, img_len[p]);
        cr_assert_eq(cpc_layout_shard_tokens(&L, p), 128 + img_len[p]);
    }
    cr_assert_eq(cpc_layout_max_shard_tokens(&L), 128 + 993);
    /* Ulysses (R = 1): the one ring block is everything, in shard order. */
    cr_assert_eq(cpc_layout_block_tokens(&L, 0), 4481);
    cr_assert_eq(cpc_layout_max_block_runs(&L), 8);
    cpc_run br[8];
    cr_assert_eq(cpc_layout_block_runs(&L, 0, br, 8), 8);
    cr_assert_eq(br[2].start, 128);
    cr_assert_eq(br[3].start, 512 + 993);
    /* A too-small output array still reports the count and writes only max. */
    cpc_run one[1] = {{-1, -1}};
    cr_assert_eq(cpc_layout_shard_runs(&L, 3, one, 1), 2);
    cr_assert_eq(one[0].start, 384);
    free_plan(plan);
}

/* Every global position is held by exactly one rank. */
static void check_partition(const cpc_layout *L)
{
    char *seen = calloc((size_t)L->S, 1);
    int max = cpc_layout_max_shard_runs(L);
    cpc_run *runs = calloc((size_t)max, sizeof *runs);
    int64_t total = 0;
    for (int p = 0; p < L->P; p++) {
        int n = cpc_layout_shard_runs(L, p, runs, max);
        cr_assert_leq(n, max);
        int64_t t = 0;
        for (int i = 0; i < n; i++) {
            cr_assert_gt(runs[i].len, 0);
            for (int64_t j = runs[i].start; j < runs[i].start + runs[i].len; j++) {
                cr_assert_lt(j, L->S);
                cr_assert_eq(seen[j], 0, "position %lld twice", (long long)j);
                seen[j] = 1;
            }
            t += runs[i].len;
        }
        cr_assert_eq(t, cpc_layout_shard_tokens(L, p));
        cr_assert_leq(t, cpc_layout_max_shard_tokens(L));
        total += t;
    }
    cr_assert_eq(total, L->S);
    /* Blocks are the concatenation of their ulysses group's shards. */
    int bmax = cpc_layout_max_block_runs(L);
    cpc_run *br = calloc((size_t)bmax, sizeof *br);
    int64_t off = 0;
    for (int i = 0; i < L->R; i++) {
        cr_assert_eq(cpc_layout_block_offset(L, i), off);
        int n = cpc_layout_block_runs(L, i, br, bmax);
        int64_t t = 0;
        for (int k = 0; k < n; k++)
            t += br[k].len;
        cr_assert_eq(t, cpc_layout_block_tokens(L, i));
        int64_t s = 0;
        for (int u = 0; u < L->U; u++)
            s += cpc_layout_shard_tokens(L, i * L->U + u);
        cr_assert_eq(t, s);
        cr_assert_leq(t, cpc_layout_max_block_tokens(L));
        off += t;
    }
    cr_assert_eq(cpc_layout_block_offset(L, L->R), L->S);
    free(br);
    free(runs);
    free(seen);
}

Test(layout, partitions)
{
    const int64_t segs[][3] = {{512, 4096, 0}, {512, 3969, 0}, {7, 0, 0}, {333, 4096, 77}, {1023, 0, 0}};
    const int nseg[] = {2, 2, 1, 3, 1};
    const int degrees[][2] = {{1, 4}, {4, 1}, {2, 2}, {3, 2}, {2, 3}, {1, 7}, {7, 1}};
    for (size_t c = 0; c < 5; c++)
        for (size_t d = 0; d < 7; d++) {
            int R = degrees[d][0], U = degrees[d][1];
            cpc_plan *plan = mk_plan(24, 8, 64, R * U, segs[c], nseg[c]);
            cpc_variant v = R > 1 && U > 1 ? CPC_VARIANT_UNIFIED
                            : R > 1        ? CPC_VARIANT_RING_ANYTHING
                                           : CPC_VARIANT_ULYSSES_ANYTHING;
            cpc_layout L = mk_layout(plan, v, R, U);
            check_partition(&L);
            free_plan(plan);
        }
}

/* Causal ring: rank p holds chunks p and 2P-1-p of 2P equal chunks. */
Test(layout, zigzag_runs)
{
    const int64_t seg[1] = {32};
    cpc_plan *plan = mk_plan(8, 8, 64, 4, seg, 1);
    plan->input.mask = CPC_MASK_CAUSAL;
    cpc_layout L = mk_layout(plan, CPC_VARIANT_RING, 4, 1);
    cr_assert(L.zigzag);
    cr_assert(L.causal);
    cr_assert_eq(cpc_layout_max_shard_runs(&L), 2);
    const int64_t first[4] = {0, 4, 8, 12}, second[4] = {28, 24, 20, 16};
    for (int p = 0; p < 4; p++) {
        cpc_run runs[2];
        int n = cpc_layout_shard_runs(&L, p, runs, 2);
        cr_assert_eq(cpc_layout_shard_tokens(&L, p), 8);
        if (p == 3) {
            /* chunks 3 and 4 are adjacent: one run */
            cr_assert_eq(n, 1);
            cr_assert_eq(runs[0].start, 12);
            cr_assert_eq(runs[0].len, 8);
            continue;
        }
        cr_assert_eq(n, 2);
        cr_assert_eq(runs[0].start, first[p]);
        cr_assert_eq(runs[0].len, 4);
        cr_assert_eq(runs[1].start, second[p]);
        cr_assert_eq(runs[1].len, 4);
    }
    check_partition(&L);

    /* The same plan under ulysses is contiguous (the all-to-all restores
     * the whole sequence in order), and non-causal ring is contiguous. */
    cpc_layout Lu = mk_layout(plan, CPC_VARIANT_ULYSSES, 1, 4);
    cr_assert_not(Lu.zigzag);
    cpc_run r1[2];
    cr_assert_eq(cpc_layout_shard_runs(&Lu, 1, r1, 2), 1);
    cr_assert_eq(r1[0].start, 8);
    plan->input.mask = CPC_MASK_NONE;
    cpc_layout Ln = mk_layout(plan, CPC_VARIANT_RING, 4, 1);
    cr_assert_not(Ln.zigzag);
    /* Zigzag needs S % 2P == 0 (CP023): otherwise the layout stays plain. */
    plan->input.mask = CPC_MASK_CAUSAL;
    plan->input.segments[0].tokens = 36;
    cpc_layout Lo = mk_layout(plan, CPC_VARIANT_RING, 4, 1);
    cr_assert_not(Lo.zigzag);
    free_plan(plan);
}

/* Unified 2x2 on FLUX 1024x1024 (512 text + 4096 image): ring block i is the
 * shards of flat ranks 2i, 2i+1 concatenated. */
Test(layout, ring_blocks_unified_2x2)
{
    const int64_t seg[2] = {512, 4096};
    cpc_plan *plan = mk_plan(24, 24, 128, 4, seg, 2);
    cpc_layout L = mk_layout(plan, CPC_VARIANT_UNIFIED, 2, 2);
    cr_assert_eq(L.P, 4);
    cr_assert_eq(cpc_layout_max_block_runs(&L), 4);
    cpc_run br[4];
    cr_assert_eq(cpc_layout_block_runs(&L, 0, br, 4), 4);
    const cpc_run want0[4] = {{0, 128}, {512, 1024}, {128, 128}, {1536, 1024}};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(br[i].start, want0[i].start, "run %d", i);
        cr_assert_eq(br[i].len, want0[i].len, "run %d", i);
    }
    cr_assert_eq(cpc_layout_block_runs(&L, 1, br, 4), 4);
    const cpc_run want1[4] = {{256, 128}, {2560, 1024}, {384, 128}, {3584, 1024}};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(br[i].start, want1[i].start, "run %d", i);
        cr_assert_eq(br[i].len, want1[i].len, "run %d", i);
    }
    cr_assert_eq(cpc_layout_block_tokens(&L, 0), 2304);
    cr_assert_eq(cpc_layout_block_offset(&L, 1), 2304);
    cr_assert_eq(cpc_layout_block_offset(&L, 2), 4608);

    /* Causal unified 2x2: zigzag shards, so each ring block holds two low
     * and two high chunks (balanced causal work). */
    const int64_t s64[1] = {64};
    cpc_plan *pc = mk_plan(8, 8, 64, 4, s64, 1);
    pc->input.mask = CPC_MASK_CAUSAL;
    cpc_layout Lc = mk_layout(pc, CPC_VARIANT_UNIFIED, 2, 2);
    cr_assert(Lc.zigzag);
    cpc_run zr[8];
    cr_assert_eq(cpc_layout_block_runs(&Lc, 0, zr, 8), 4);
    const cpc_run z0[4] = {{0, 8}, {56, 8}, {8, 8}, {48, 8}};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(zr[i].start, z0[i].start);
        cr_assert_eq(zr[i].len, z0[i].len);
    }
    /* block 1: shard 2 = [16,24)+[40,48), shard 3 = [24,32)+[32,40) merged */
    cr_assert_eq(cpc_layout_block_runs(&Lc, 1, zr, 8), 3);
    const cpc_run z1[3] = {{16, 8}, {40, 8}, {24, 16}};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(zr[i].start, z1[i].start);
        cr_assert_eq(zr[i].len, z1[i].len);
    }
    cr_assert_eq(cpc_layout_block_tokens(&Lc, 1), 32);
    check_partition(&Lc);
    free_plan(pc);
    free_plan(plan);
}

/* ring_anything: uneven blocks (1023 over 4: 256, 256, 256, 255). */
Test(layout, uneven_ring_blocks)
{
    const int64_t seg[1] = {1023};
    cpc_plan *plan = mk_plan(8, 8, 64, 4, seg, 1);
    cpc_layout L = mk_layout(plan, CPC_VARIANT_RING_ANYTHING, 4, 1);
    cr_assert_eq(cpc_layout_block_tokens(&L, 0), 256);
    cr_assert_eq(cpc_layout_block_tokens(&L, 3), 255);
    cr_assert_eq(cpc_layout_max_block_tokens(&L), 256);
    cr_assert_eq(cpc_layout_block_offset(&L, 3), 768);
    free_plan(plan);
}

static void heads(cpc_plan *plan, int U, cpc_variant v, cpc_layout *L)
{
    plan->cluster.world_size = U;
    *L = mk_layout(plan, v, 1, U);
}

/* Uneven heads without padding (beyond diffusers): H = 24 over U = 16 and 7. */
Test(layout, uneven_heads)
{
    const int64_t seg[1] = {4096};
    cpc_plan *plan = mk_plan(24, 24, 128, 16, seg, 1);
    cpc_layout L;
    heads(plan, 16, CPC_VARIANT_ULYSSES_ANYTHING, &L);
    int total = 0;
    for (int u = 0; u < 16; u++) {
        int off, n, koff, kn;
        cpc_layout_q_heads(&L, u, &off, &n);
        cr_assert_eq(n, u < 8 ? 2 : 1, "member %d", u);
        cr_assert_eq(off, total);
        cpc_layout_kv_heads(&L, u, &koff, &kn);
        cr_assert_eq(koff, off); /* MHA: K/V heads are the query heads */
        cr_assert_eq(kn, n);
        total += n;
    }
    cr_assert_eq(total, 24);
    cr_assert_eq(cpc_layout_max_q_heads(&L), 2);
    cr_assert_eq(cpc_layout_max_kv_heads(&L), 2);

    heads(plan, 7, CPC_VARIANT_ULYSSES_ANYTHING, &L);
    const int want[7] = {4, 4, 4, 3, 3, 3, 3};
    const int woff[7] = {0, 4, 8, 12, 15, 18, 21};
    for (int u = 0; u < 7; u++) {
        int off, n;
        cpc_layout_q_heads(&L, u, &off, &n);
        cr_assert_eq(n, want[u]);
        cr_assert_eq(off, woff[u]);
    }
    free_plan(plan);
}

/* GQA: H = 28 query heads, Hkv = 7 (ratio 4). */
Test(layout, gqa_heads)
{
    const int64_t seg[1] = {4096};
    cpc_plan *plan = mk_plan(28, 7, 128, 2, seg, 1);
    cpc_layout L;
    /* U = 2: 14 query heads each; member 0 uses K/V 0..3 (heads 0..13 ->
     * 13/4 = 3), member 1 uses K/V 3..6 (14/4 = 3 .. 27/4 = 6): K/V head 3
     * serves both (ulysses_anything; plain ulysses rejects it, CP012). */
    heads(plan, 2, CPC_VARIANT_ULYSSES_ANYTHING, &L);
    cr_assert_eq(L.group, 4);
    int off, n;
    cpc_layout_kv_heads(&L, 0, &off, &n);
    cr_assert_eq(off, 0);
    cr_assert_eq(n, 4);
    cpc_layout_kv_heads(&L, 1, &off, &n);
    cr_assert_eq(off, 3);
    cr_assert_eq(n, 4);

    /* U = 14 (divisible by Hkv = 7): 2 query heads each, one K/V head each,
     * every K/V head replicated on exactly U / Hkv = 2 members. */
    heads(plan, 14, CPC_VARIANT_ULYSSES, &L);
    int count[7] = {0};
    for (int u = 0; u < 14; u++) {
        cpc_layout_q_heads(&L, u, &off, &n);
        cr_assert_eq(n, 2);
        cpc_layout_kv_heads(&L, u, &off, &n);
        cr_assert_eq(n, 1);
        cr_assert_eq(off, u / 2);
        count[off]++;
    }
    for (int k = 0; k < 7; k++)
        cr_assert_eq(count[k], 2);
    cr_assert_eq(cpc_layout_max_kv_heads(&L), 1);

    /* U = 7 == Hkv: one K/V head and 4 query heads each, no replication. */
    heads(plan, 7, CPC_VARIANT_ULYSSES, &L);
    for (int u = 0; u < 7; u++) {
        cpc_layout_kv_heads(&L, u, &off, &n);
        cr_assert_eq(off, u);
        cr_assert_eq(n, 1);
    }
    free_plan(plan);

    /* MQA: every member needs the single K/V head. */
    cpc_plan *mqa = mk_plan(24, 1, 128, 4, seg, 1);
    heads(mqa, 4, CPC_VARIANT_ULYSSES, &L);
    cr_assert_eq(L.group, 24);
    for (int u = 0; u < 4; u++) {
        cpc_layout_kv_heads(&L, u, &off, &n);
        cr_assert_eq(off, 0);
        cr_assert_eq(n, 1);
    }
    free_plan(mqa);

    /* Divisible GQA: H = 24, Hkv = 8 over U = 4: K/V heads split with their
     * query heads, 2 each. */
    cpc_plan *g8 = mk_plan(24, 8, 128, 4, seg, 1);
    heads(g8, 4, CPC_VARIANT_ULYSSES, &L);
    for (int u = 0; u < 4; u++) {
        cpc_layout_kv_heads(&L, u, &off, &n);
        cr_assert_eq(off, 2 * u);
        cr_assert_eq(n, 2);
    }
    /* The widest K/V range need not be member 0's: H = 12, Hkv = 4, U = 5. */
    free_plan(g8);
    cpc_plan *w = mk_plan(12, 4, 64, 5, seg, 1);
    heads(w, 5, CPC_VARIANT_ULYSSES_ANYTHING, &L);
    cpc_layout_kv_heads(&L, 0, &off, &n);
    cr_assert_eq(n, 1);
    cpc_layout_kv_heads(&L, 3, &off, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(cpc_layout_max_kv_heads(&L), 2);
    free_plan(w);
}

/* Property: for every shape, a member's K/V range is exactly the set of K/V
 * heads its query heads use (first and last included, nothing outside). */
Test(layout, gqa_property)
{
    const int64_t seg[1] = {64};
    for (int Hkv = 1; Hkv <= 8; Hkv++)
        for (int g = 1; g <= 5; g++) {
            int H = Hkv * g;
            for (int U = 1; U <= H; U++) {
                cpc_plan *plan = mk_plan(H, Hkv, 8, U, seg, 1);
                cpc_layout L = mk_layout(plan, CPC_VARIANT_ULYSSES_ANYTHING, 1, U);
                for (int u = 0; u < U; u++) {
                    int qo, qn, ko, kn;
                    cpc_layout_q_heads(&L, u, &qo, &qn);
                    cpc_layout_kv_heads(&L, u, &ko, &kn);
                    cr_assert_gt(qn, 0);
                    cr_assert_eq(ko, qo / g);
                    cr_assert_eq(ko + kn - 1, (qo + qn - 1) / g);
                    cr_assert_leq(kn, cpc_layout_max_kv_heads(&L));
                }
                free_plan(plan);
            }
        }
}

Test(layout, cross_attention_and_errors)
{
    const int64_t seg[1] = {32760};
    cpc_plan *plan = mk_plan(40, 40, 128, 8, seg, 1);
    plan->input.has_kv = true;
    plan->input.kv_tokens = 512;
    cpc_layout L = mk_layout(plan, CPC_VARIANT_ULYSSES, 1, 8);
    cr_assert(L.cross);
    cr_assert_eq(L.Skv, 512);
    cr_assert_eq(L.S, 32760);

    cpc_layout X;
    cpc_status *st = cpc_layout_init(&X, plan, CPC_VARIANT_AUTO, 1, 8);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INTERNAL);
    cpc_status_free(st);
    st = cpc_layout_init(&X, plan, CPC_VARIANT_RING, 0, 1);
    cr_assert_not_null(st);
    cpc_status_free(st);
    st = cpc_layout_init(&X, plan, CPC_VARIANT_UNIFIED, 1 << 11, 1 << 10);
    cr_assert_not_null(st, "2^21 ranks overflow the mesh limit");
    cpc_status_free(st);
    plan->model.kv_heads = 7; /* 40 % 7 != 0 */
    st = cpc_layout_init(&X, plan, CPC_VARIANT_ULYSSES, 1, 8);
    cr_assert_not_null(st);
    cpc_status_free(st);
    plan->model.kv_heads = 40;
    int n = plan->input.n_segments;
    plan->input.n_segments = CPC_MAX_SEGMENTS + 1;
    st = cpc_layout_init(&X, plan, CPC_VARIANT_ULYSSES, 1, 8);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "segments"));
    cpc_status_free(st);
    plan->input.n_segments = n;
    free_plan(plan);
}

/* Large world sizes stay cheap (closed-form block sizes). */
Test(layout, large_world)
{
    const int64_t seg[2] = {512, 118800};
    cpc_plan *plan = mk_plan(24, 24, 128, 1 << 20, seg, 2);
    cpc_layout L = mk_layout(plan, CPC_VARIANT_RING_ANYTHING, 1 << 20, 1);
    cr_assert_eq(cpc_layout_block_tokens(&L, 0), 2);   /* 1 text + 1 image token */
    cr_assert_eq(cpc_layout_block_tokens(&L, 600), 1); /* text ends at rank 511 */
    cr_assert_eq(cpc_layout_shard_tokens(&L, 200000), 0);
    cr_assert_eq(cpc_layout_block_offset(&L, 1 << 20), 512 + 118800);
    free_plan(plan);
}
