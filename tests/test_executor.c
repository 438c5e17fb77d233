/*
 * test_executor.c - the executor (runtime/executor.h) through the job layer
 * (runtime/session/run.h): every variant's program, run by P rank threads over the
 * local transport with the CPU backend, on fresh random inputs (a new seed
 * every run, printed on failure), against the float64 reference with the
 * SPEC tolerances (fp32 1e-5, fp16 2e-3, bf16 1e-2).
 *
 * Shapes are small (head_dim 16-64, a few hundred tokens) so the suite runs
 * in seconds; the check compares every query row.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "expr.h"
#include "plan_load.h"
#include "schedule_bwd.h"
#include "program.h"
#include "executor.h"
#include "verify.h"
#include "reference.h"
#include "rng.h"
#include "run.h"
#include "safetensors.h"

typedef struct tcase {
    cpc_variant v;
    int R, U;
    int B, H, Hkv, D;
    cpc_dtype dt;
    int nseg;
    int64_t seg[4];
    cpc_mask mask;
    int64_t kv;          /* cross-attention K/V tokens, 0 = self-attention */
    bool overlap;
    cpc_rotate rotate;
} tcase;

static uint64_t fresh_seed(void)
{
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    return s + 0x9e3779b97f4a7c15ull * ++counter;
}

static cpc_plan *mk_plan(const tcase *c)
{
    cpc_plan *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    p->file = strdup("test_executor.yaml");
    p->name = strdup("test_executor");
    p->version = 1;
    p->model.heads = c->H;
    p->model.kv_heads = c->Hkv ? c->Hkv : c->H;
    p->model.head_dim = c->D;
    p->model.dtype = c->dt;
    p->model.layers = 1;
    p->model.scale = 1.0 / sqrt((double)c->D);
    p->input.batch = c->B ? c->B : 1;
    p->input.n_segments = c->nseg;
    p->input.segments = calloc((size_t)c->nseg, sizeof *p->input.segments);
    cr_assert_not_null(p->input.segments);
    for (int i = 0; i < c->nseg; i++) {
        p->input.segments[i].name = strdup(i == 0 && c->nseg > 1 ? "text" : "video");
        p->input.segments[i].tokens = c->seg[i];
        p->input.total_tokens += c->seg[i];
    }
    p->input.mask = c->mask;
    p->input.has_kv = c->kv > 0;
    p->input.kv_tokens = c->kv;
    p->input.mode = CPC_MODE_INFERENCE;
    p->cluster.world_size = c->R * c->U;
    p->cluster.gpus_per_node = c->R * c->U < 8 ? c->R * c->U : 8;
    p->cluster.device = strdup("cpu");
    p->parallel.variant = c->v;
    p->parallel.variant_given = true;
    p->parallel.ring_degree = c->R;
    p->parallel.ulysses_degree = c->U;
    p->schedule.overlap = c->overlap;
    p->schedule.rotate = c->rotate;
    return p;
}

static void describe(const tcase *c, char *buf, size_t n)
{
    char segs[64] = "";
    size_t k = 0;
    for (int i = 0; i < c->nseg; i++)
        k += (size_t)snprintf(segs + k, sizeof segs - k, "%s%lld", i ? "+" : "", (long long)c->seg[i]);
    snprintf(buf, n, "%s %dx%d B=%d S=%s H=%d Hkv=%d D=%d %s%s%s kv=%lld %s %s",
             cpc_variant_name(c->v), c->R, c->U, c->B ? c->B : 1, segs, c->H, c->Hkv ? c->Hkv : c->H,
             c->D, cpc_dtype_name(c->dt), c->mask == CPC_MASK_CAUSAL ? " causal" : "",
             c->mask == CPC_MASK_KEY_PADDING ? " key_padding" : "", (long long)c->kv,
             c->overlap ? "overlap" : "no-overlap", cpc_rotate_name(c->rotate));
}

/* Runs one case with a fresh seed; fills *rep (caller frees) and asserts
 * that the run completed and the check passed. */
static void run_case(const tcase *c, cpc_run_report *rep, uint64_t *seed_out)
{
    char name[256];
    describe(c, name, sizeof name);
    cpc_plan *plan = mk_plan(c);
    cpc_job *job = NULL;
    cpc_status *st = cpc_job_from_plan(plan, c->v, c->R, c->U, &job);
    cr_assert(!cpc_status_has_error(st), "%s: schedule/verify: %s", name, st ? st->message : "");
    cpc_status_free(st);
    uint64_t seed = fresh_seed();
    if (seed_out)
        *seed_out = seed;
    cpc_run_options o;
    cpc_run_options_default(&o);
    o.seed = seed;
    o.warmup = 0;
    o.iters = 1;
    o.timeout_s = 60;
    st = cpc_job_run(job, &o, rep, NULL);
    cr_assert_null(st, "%s (seed %llu): run failed: %s", name, (unsigned long long)seed,
                   st ? st->message : "");
    cr_assert(rep->checked, "%s: no check ran", name);
    cr_assert(!rep->check_sampled, "%s: the check should compare every row here", name);
    cr_assert(rep->pass && rep->ok,
              "%s (seed %llu): check FAILED: rel_err %.3e (tolerance %.0e), max_abs_err %.3e, %lld NaN, %lld Inf",
              name, (unsigned long long)seed, rep->rel_err, rep->tolerance, rep->max_abs_err,
              (long long)rep->n_nan, (long long)rep->n_inf);
    cr_assert(rep->rel_err > 0, "%s: a zero error means nothing was compared", name);
    cr_assert_eq(rep->ranks, c->R * c->U);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

static void run_ok(const tcase *c)
{
    cpc_run_report rep;
    run_case(c, &rep, NULL);
    cpc_run_report_clear(&rep);
}

static const cpc_dtype DTYPES[3] = {CPC_DTYPE_FP32, CPC_DTYPE_BF16, CPC_DTYPE_FP16};

/* ---- every variant, even shapes, three dtypes ---------------------------------- */

Test(executor, none_world_size_1)
{
    for (int d = 0; d < 3; d++)
        run_ok(&(tcase){.v = CPC_VARIANT_NONE, .R = 1, .U = 1, .H = 4, .D = 32, .dt = DTYPES[d],
                        .nseg = 1, .seg = {200}, .overlap = true});
}

Test(executor, ring_p2p_overlap)
{
    for (int d = 0; d < 3; d++)
        run_ok(&(tcase){.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 4, .D = 32, .dt = DTYPES[d],
                        .nseg = 1, .seg = {256}, .overlap = true, .rotate = CPC_ROTATE_P2P});
}

Test(executor, ring_p2p_no_overlap)
{
    for (int d = 0; d < 3; d++)
        run_ok(&(tcase){.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 4, .D = 32, .dt = DTYPES[d],
                        .nseg = 1, .seg = {256}, .overlap = false, .rotate = CPC_ROTATE_P2P});
}

Test(executor, ring_allgather)
{
    for (int d = 0; d < 3; d++)
        run_ok(&(tcase){.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 4, .D = 32, .dt = DTYPES[d],
                        .nseg = 1, .seg = {256}, .overlap = true, .rotate = CPC_ROTATE_ALLGATHER});
}

Test(executor, ulysses)
{
    for (int d = 0; d < 3; d++)
        run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES, .R = 1, .U = 4, .H = 8, .D = 32, .dt = DTYPES[d],
                        .nseg = 1, .seg = {256}, .overlap = true});
}

Test(executor, unified_2x2)
{
    for (int d = 0; d < 3; d++)
        run_ok(&(tcase){.v = CPC_VARIANT_UNIFIED, .R = 2, .U = 2, .H = 8, .D = 32, .dt = DTYPES[d],
                        .nseg = 1, .seg = {256}, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_UNIFIED, .R = 2, .U = 2, .H = 8, .D = 32, .dt = CPC_DTYPE_FP32,
                    .nseg = 1, .seg = {256}, .overlap = true, .rotate = CPC_ROTATE_ALLGATHER});
}

/* ---- the anything variants: even and uneven tokens and heads ------------------------ */

Test(executor, ulysses_anything_even_and_uneven)
{
    for (int d = 0; d < 3; d++) {
        run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 4, .H = 8, .D = 32,
                        .dt = DTYPES[d], .nseg = 1, .seg = {256}, .overlap = true});
        /* 253 tokens (64,63,63,63) and 6 heads (2,2,1,1) over 4 ranks. */
        run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 4, .H = 6, .D = 32,
                        .dt = DTYPES[d], .nseg = 1, .seg = {253}, .overlap = true});
    }
}

Test(executor, ring_anything_even_and_uneven)
{
    for (int d = 0; d < 3; d++) {
        run_ok(&(tcase){.v = CPC_VARIANT_RING_ANYTHING, .R = 4, .U = 1, .H = 4, .D = 32,
                        .dt = DTYPES[d], .nseg = 1, .seg = {256}, .overlap = true});
        run_ok(&(tcase){.v = CPC_VARIANT_RING_ANYTHING, .R = 4, .U = 1, .H = 4, .D = 32,
                        .dt = DTYPES[d], .nseg = 2, .seg = {37, 218}, .overlap = true});
    }
}

Test(executor, seven_tokens_over_two_ranks)
{
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 2, .H = 4, .D = 16,
                    .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {7}, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_RING_ANYTHING, .R = 2, .U = 1, .H = 4, .D = 16,
                    .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {7}, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_RING_ANYTHING, .R = 2, .U = 1, .H = 4, .D = 16,
                    .dt = CPC_DTYPE_BF16, .nseg = 1, .seg = {7}, .overlap = false});
}

/* CogVideoX-like: 226 text tokens first, then the video, over 8 ranks. */
Test(executor, two_segments_over_8_ranks)
{
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 8, .H = 16, .D = 16,
                    .dt = CPC_DTYPE_BF16, .nseg = 2, .seg = {226, 390}, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_RING_ANYTHING, .R = 8, .U = 1, .H = 16, .D = 16,
                    .dt = CPC_DTYPE_FP32, .nseg = 2, .seg = {226, 390}, .overlap = true});
    /* Divisible segments: unified 2x4 splits each segment separately. */
    run_ok(&(tcase){.v = CPC_VARIANT_UNIFIED, .R = 2, .U = 4, .H = 16, .D = 16,
                    .dt = CPC_DTYPE_FP16, .nseg = 2, .seg = {232, 384}, .overlap = true});
}

Test(executor, gqa_28_7_over_2)
{
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 2, .H = 28, .Hkv = 7, .D = 16,
                    .dt = CPC_DTYPE_BF16, .nseg = 1, .seg = {96}, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES, .R = 1, .U = 2, .H = 28, .Hkv = 14, .D = 16,
                    .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {96}, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_RING, .R = 2, .U = 1, .H = 28, .Hkv = 7, .D = 16,
                    .dt = CPC_DTYPE_FP16, .nseg = 1, .seg = {96}, .overlap = true});
    /* K/V heads replicated: U = 4 > Hkv = 2. */
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES, .R = 1, .U = 4, .H = 8, .Hkv = 2, .D = 16,
                    .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {64}, .overlap = true});
}

Test(executor, heads_24_over_7_and_16)
{
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 7, .H = 24, .D = 16,
                    .dt = CPC_DTYPE_BF16, .nseg = 1, .seg = {100}, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 16, .H = 24, .D = 16,
                    .dt = CPC_DTYPE_FP32, .nseg = 2, .seg = {20, 97}, .overlap = true});
}

Test(executor, causal_ring_4_and_unified_2x2)
{
    for (int d = 0; d < 3; d++) {
        run_ok(&(tcase){.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 4, .D = 32, .dt = DTYPES[d],
                        .nseg = 1, .seg = {256}, .mask = CPC_MASK_CAUSAL, .overlap = true});
        run_ok(&(tcase){.v = CPC_VARIANT_UNIFIED, .R = 2, .U = 2, .H = 4, .D = 32, .dt = DTYPES[d],
                        .nseg = 1, .seg = {256}, .mask = CPC_MASK_CAUSAL, .overlap = true});
    }
    run_ok(&(tcase){.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 4, .D = 32, .dt = CPC_DTYPE_FP32,
                    .nseg = 1, .seg = {256}, .mask = CPC_MASK_CAUSAL, .overlap = true,
                    .rotate = CPC_ROTATE_ALLGATHER});
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES, .R = 1, .U = 4, .H = 4, .D = 32, .dt = CPC_DTYPE_FP32,
                    .nseg = 1, .seg = {256}, .mask = CPC_MASK_CAUSAL, .overlap = true});
}

Test(executor, cross_attention)
{
    run_ok(&(tcase){.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 4, .D = 32, .dt = CPC_DTYPE_BF16,
                    .nseg = 1, .seg = {256}, .kv = 77, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES, .R = 1, .U = 4, .H = 8, .D = 32, .dt = CPC_DTYPE_FP16,
                    .nseg = 1, .seg = {256}, .kv = 77, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_UNIFIED, .R = 2, .U = 2, .H = 8, .Hkv = 2, .D = 32,
                    .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {256}, .kv = 50, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 3, .H = 7, .D = 16,
                    .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {100}, .kv = 33, .overlap = true});
}

Test(executor, key_padding_mask)
{
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES, .R = 1, .U = 4, .H = 8, .D = 32, .dt = CPC_DTYPE_FP32,
                    .nseg = 2, .seg = {64, 192}, .mask = CPC_MASK_KEY_PADDING, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 4, .D = 32, .dt = CPC_DTYPE_BF16,
                    .B = 2, .nseg = 1, .seg = {256}, .mask = CPC_MASK_KEY_PADDING, .overlap = true});
}

/* Batch > 1 takes the staged (pack/unpack) all-to-all path and the per-batch
 * all-gather. */
Test(executor, batch_two)
{
    run_ok(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 4, .B = 2, .H = 6, .D = 16,
                    .dt = CPC_DTYPE_FP16, .nseg = 2, .seg = {31, 97}, .overlap = true});
    run_ok(&(tcase){.v = CPC_VARIANT_UNIFIED, .R = 2, .U = 2, .B = 3, .H = 4, .D = 16,
                    .dt = CPC_DTYPE_BF16, .nseg = 1, .seg = {128}, .overlap = true,
                    .rotate = CPC_ROTATE_ALLGATHER});
    run_ok(&(tcase){.v = CPC_VARIANT_RING_ANYTHING, .R = 3, .U = 1, .B = 2, .H = 4, .D = 16,
                    .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {100}, .overlap = true});
}

/* The error of the distributed result must not grow with world size: bf16,
 * P = 1 (none) vs P = 8 (ring, 8 merges), same inputs. */
Test(executor, error_does_not_grow_with_world_size)
{
    tcase one = {.v = CPC_VARIANT_NONE, .R = 1, .U = 1, .H = 4, .D = 64, .dt = CPC_DTYPE_BF16,
                 .nseg = 1, .seg = {512}, .overlap = true};
    tcase eight = one;
    eight.v = CPC_VARIANT_RING;
    eight.R = 8;
    cpc_plan *p1 = mk_plan(&one), *p8 = mk_plan(&eight);
    cpc_job *j1 = NULL, *j8 = NULL;
    cpc_status *st = cpc_job_from_plan(p1, one.v, 1, 1, &j1);
    cr_assert(!cpc_status_has_error(st));
    cpc_status_free(st);
    st = cpc_job_from_plan(p8, eight.v, 8, 1, &j8);
    cr_assert(!cpc_status_has_error(st));
    cpc_status_free(st);
    cpc_run_options o;
    cpc_run_options_default(&o);
    o.seed = fresh_seed();
    o.warmup = 0;
    o.iters = 1;
    cpc_run_report r1, r8;
    st = cpc_job_run(j1, &o, &r1, NULL);
    cr_assert_null(st);
    st = cpc_job_run(j8, &o, &r8, NULL);
    cr_assert_null(st);
    cr_assert(r1.pass && r8.pass, "seed %llu: P=1 rel %.3e, P=8 rel %.3e",
              (unsigned long long)o.seed, r1.rel_err, r8.rel_err);
    cr_assert(r8.rel_err <= 1.5 * r1.rel_err,
              "seed %llu: error grows with world size: P=1 rel_err %.3e, P=8 rel_err %.3e",
              (unsigned long long)o.seed, r1.rel_err, r8.rel_err);
    cpc_run_report_clear(&r1);
    cpc_run_report_clear(&r8);
    cpc_job_free(j1);
    cpc_job_free(j8);
    cpc_plan_free(p1);
    cpc_plan_free(p8);
}

/* Same seed, different world sizes and variants: the same inputs, so the
 * outputs agree (the generator is keyed by global element index). */
Test(executor, inputs_do_not_depend_on_world_size)
{
    tcase a = {.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 3, .H = 6, .D = 32,
               .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {150}, .overlap = true};
    tcase b = {.v = CPC_VARIANT_RING_ANYTHING, .R = 5, .U = 1, .H = 6, .D = 32,
               .dt = CPC_DTYPE_FP32, .nseg = 1, .seg = {150}, .overlap = true};
    cpc_plan *pa = mk_plan(&a), *pb = mk_plan(&b);
    cpc_job *ja = NULL, *jb = NULL;
    cpc_status_free(cpc_job_from_plan(pa, a.v, a.R, a.U, &ja));
    cpc_status_free(cpc_job_from_plan(pb, b.v, b.R, b.U, &jb));
    cr_assert(ja && jb);
    char fa[] = "/tmp/cpc_exec_a_XXXXXX", fb[] = "/tmp/cpc_exec_b_XXXXXX";
    int da = mkstemp(fa), db = mkstemp(fb);
    cr_assert(da >= 0 && db >= 0);
    close(da);
    close(db);
    cpc_run_options o;
    cpc_run_options_default(&o);
    o.seed = fresh_seed();
    o.warmup = 0;
    o.iters = 1;
    o.check = false;
    cpc_run_report ra, rb;
    o.output_path = fa;
    cr_assert_null(cpc_job_run(ja, &o, &ra, NULL));
    o.output_path = fb;
    cr_assert_null(cpc_job_run(jb, &o, &rb, NULL));
    FILE *f1 = fopen(fa, "rb"), *f2 = fopen(fb, "rb");
    cr_assert(f1 && f2);
    fseek(f1, 0, SEEK_END);
    fseek(f2, 0, SEEK_END);
    long n1 = ftell(f1), n2 = ftell(f2);
    cr_assert_eq(n1, n2);
    rewind(f1);
    rewind(f2);
    char *b1 = malloc((size_t)n1), *b2 = malloc((size_t)n2);
    cr_assert_eq(fread(b1, 1, (size_t)n1, f1), (size_t)n1);
    cr_assert_eq(fread(b2, 1, (size_t)n2, f2), (size_t)n2);
    /* Header identical; data close (different merge orders round differently). */
    uint64_t hl;
    memcpy(&hl, b1, 8);
    cr_assert_eq(memcmp(b1, b2, 8 + hl), 0);
    const float *x1 = (const float *)(b1 + 8 + hl), *x2 = (const float *)(b2 + 8 + hl);
    size_t n = (size_t)(n1 - 8 - (long)hl) / 4;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)x1[i] - x2[i]) * ((double)x1[i] - x2[i]);
        den += (double)x1[i] * x1[i];
    }
    cr_assert(den > 0);
    cr_assert(sqrt(num / den) < 1e-5, "seed %llu: outputs differ (rel %.3e)",
              (unsigned long long)o.seed, sqrt(num / den));
    free(b1);
    free(b2);
    fclose(f1);
    fclose(f2);
    unlink(fa);
    unlink(fb);
    cpc_run_report_clear(&ra);
    cpc_run_report_clear(&rb);
    cpc_job_free(ja);
    cpc_job_free(jb);
    cpc_plan_free(pa);
    cpc_plan_free(pb);
}

/* ---- failures: the message names the rank and the op, and nobody hangs -------------- */

static cpc_op *find_op(cpc_op *ops, int n, cpc_op_kind k)
{
    for (int i = 0; i < n; i++) {
        if (ops[i].kind == k)
            return &ops[i];
        if (ops[i].kind == CPC_OP_LOOP) {
            cpc_op *o = find_op(ops[i].body, ops[i].n_body, k);
            if (o)
                return o;
        }
    }
    return NULL;
}

/* One checked iteration of `job` (no warmup) under a stall limit of timeout_s
 * seconds; the report goes to *rep (clear it with cpc_run_report_clear). */
static cpc_status *run_once(cpc_job *job, double timeout_s, cpc_run_report *rep)
{
    cpc_run_options o;
    cpc_run_options_default(&o);
    o.warmup = 0;
    o.iters = 1;
    o.timeout_s = timeout_s;
    return cpc_job_run(job, &o, rep, NULL);
}

Test(executor, failing_rank_is_named_and_others_stop)
{
    tcase c = {.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 4, .D = 16, .dt = CPC_DTYPE_FP32,
               .nseg = 1, .seg = {64}, .overlap = true};
    cpc_plan *plan = mk_plan(&c);
    cpc_job *job = NULL;
    cpc_status_free(cpc_job_from_plan(plan, c.v, 4, 1, &job));
    cr_assert_not_null(job);
    /* Rank 2's recv peer divides by zero; the others evaluate it fine. */
    cpc_op *recv = find_op(job->prog->ops, job->prog->n_ops, CPC_OP_RECV);
    cr_assert_not_null(recv);
    cpc_expr *e = NULL;
    cpc_status *st = cpc_expr_parse("(r-1)%R + 0*(1/(p-2))", CPC_NO_SPAN, &e);
    cr_assert_null(st);
    cpc_expr_free(recv->peer);
    recv->peer = e;
    cpc_run_report rep;
    st = run_once(job, 20, &rep);
    cr_assert_not_null(st, "the broken program ran");
    cr_assert(strstr(st->message, "rank 2:") != NULL, "message: %s", st->message);
    cr_assert(strstr(st->message, "recv") != NULL, "message: %s", st->message);
    cr_assert(strstr(st->message, "ops[") != NULL, "message: %s", st->message);
    cr_assert_eq(cpc_status_exit_code(st), 3, "a failing op is a runtime failure (exit 3)");
    cpc_status_free(st);
    cpc_run_report_clear(&rep);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

Test(executor, deadlock_times_out_instead_of_hanging)
{
    tcase c = {.v = CPC_VARIANT_RING, .R = 2, .U = 1, .H = 2, .D = 16, .dt = CPC_DTYPE_FP32,
               .nseg = 1, .seg = {32}, .overlap = true};
    cpc_plan *plan = mk_plan(&c);
    cpc_job *job = NULL;
    cpc_status_free(cpc_job_from_plan(plan, c.v, 2, 1, &job));
    cr_assert_not_null(job);
    cpc_op *send = find_op(job->prog->ops, job->prog->n_ops, CPC_OP_SEND);
    cr_assert_not_null(send);
    send->tag += 7; /* nobody receives this tag; the recv never completes */
    cpc_run_report rep;
    cpc_status *st = run_once(job, 0.5, &rep);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "timeout") != NULL || strstr(st->message, "never waited") != NULL,
              "message: %s", st->message);
    cr_assert(strstr(st->message, "rank ") != NULL, "message: %s", st->message);
    cpc_status_free(st);
    cpc_run_report_clear(&rep);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

/* The pending-request guard (program.h CPC_LIFE_UNTIL_WAIT), read from the op
 * table for every op: an attn reading the K block whose recv is still in
 * flight is refused by the executor (a program that slipped past a proof
 * still cannot read a half-received buffer). */
Test(executor, in_flight_buffers_are_guarded)
{
    tcase c = {.v = CPC_VARIANT_RING, .R = 2, .U = 1, .H = 2, .D = 16, .dt = CPC_DTYPE_FP32,
               .nseg = 1, .seg = {32}, .overlap = true};
    cpc_plan *plan = mk_plan(&c);
    cpc_job *job = NULL;
    cpc_status_free(cpc_job_from_plan(plan, c.v, 2, 1, &job));
    cr_assert_not_null(job);
    cpc_op *recv = find_op(job->prog->ops, job->prog->n_ops, CPC_OP_RECV);
    cpc_op *attn = find_op(job->prog->ops, job->prog->n_ops, CPC_OP_ATTN);
    cr_assert(recv && attn && recv < attn, "the ring loop posts its recv before the attention");
    attn->in[1] = recv->out[0];
    cpc_run_report rep;
    cpc_status *st = run_once(job, 20, &rep);
    cr_assert_not_null(st, "an attention reading an in-flight recv buffer ran");
    cr_assert(strstr(st->message, "in flight") != NULL && strstr(st->message, "recv") != NULL, "message: %s",
              st->message);
    cpc_status_free(st);
    cpc_run_report_clear(&rep);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

/* The same guard on a backward program that slipped past its proof (edited
 * after cpc_job_from_plan proved it): attn_bwd accumulating into dk_out/dv_out
 * while their send is in flight (issue 21: rel_err 0.78-0.92, varying run to
 * run) is refused by the executor. */
Test(executor, in_flight_guard_covers_attn_bwd)
{
    const char *y = "version: 1\nname: t\nmodel: {heads: 2, head_dim: 16, dtype: fp32}\n"
                    "input: {batch: 1, tokens: 64, mode: training}\ncluster: {world_size: 4, device: cpu}\n"
                    "parallel: {variant: ring}\n";
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_string(y, strlen(y), "t.yaml", NULL, 0, &plan);
    cr_assert(plan && !cpc_status_has_error(st), "%s", st ? st->message : "");
    cpc_status_free(st);
    cpc_job *job = NULL;
    st = cpc_job_from_plan(plan, CPC_VARIANT_RING, 4, 1, &job);
    cr_assert(job && !cpc_status_has_error(st), "%s", st ? st->message : "");
    cpc_status_free(st);
    if (!job->bwd) /* the library's job_from_plan leaves the backward to the caller */
        cr_assert_null(cpc_schedule_build_backward(plan, CPC_VARIANT_RING, 4, 1, &job->bwd));
    cpc_program *b = job->bwd;
    cpc_op *loop = NULL;
    for (int i = 0; i < b->n_ops; i++)
        if (b->ops[i].kind == CPC_OP_LOOP)
            loop = &b->ops[i];
    cr_assert_not_null(loop);
    int ia = -1, is = -1;
    for (int i = 0; i < loop->n_body; i++) {
        if (loop->body[i].kind == CPC_OP_ATTN_BWD)
            ia = i;
        if (loop->body[i].kind == CPC_OP_SEND && b->buffers[loop->body[i].in[0]].role == CPC_ROLE_DK)
            is = i;
    }
    cr_assert(ia >= 0 && is > ia, "the lagged ring sends dK after its attn_bwd");
    /* attn_bwd moved right after the send, into the buffers being sent */
    cpc_op ab = loop->body[ia];
    memmove(&loop->body[ia], &loop->body[ia + 1], (size_t)(is - ia) * sizeof ab);
    ab.out[1] = loop->body[is - 1].in[0];
    ab.out[2] = loop->body[is - 1].in[1];
    loop->body[is] = ab;
    cpc_run_report rep;
    st = run_once(job, 20, &rep);
    cr_assert_not_null(st, "attn_bwd into an in-flight send buffer ran");
    cr_assert(strstr(st->message, "in flight") && strstr(st->message, "accumulated into"), "%s", st->message);
    cpc_status_free(st);
    cpc_run_report_clear(&rep);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

/* Paired ops run every pair (the op table's same_in_out: copy, all_to_all and
 * all_gather take 1..8 pairs; the executor ran only the first, so a proven
 * program gathering k and v in one op left v_all unfilled).  The allgather
 * ring's two all_gathers merged into one two-pair op: still proven, and the
 * run matches the float64 reference. */
Test(executor, paired_ops_run_every_pair)
{
    tcase c = {.v = CPC_VARIANT_RING, .R = 4, .U = 1, .H = 2, .D = 16, .dt = CPC_DTYPE_FP32,
               .nseg = 1, .seg = {64}, .overlap = true, .rotate = CPC_ROTATE_ALLGATHER};
    cpc_plan *plan = mk_plan(&c);
    cpc_job *job = NULL;
    cpc_status_free(cpc_job_from_plan(plan, c.v, 4, 1, &job));
    cr_assert_not_null(job);
    cpc_program *p = job->prog;
    cpc_op *a = NULL, *b = NULL;
    for (int i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == CPC_OP_ALL_GATHER) {
            if (!a)
                a = &p->ops[i];
            else if (!b)
                b = &p->ops[i];
        }
    cr_assert(a && b && a != b, "the allgather ring has two all_gathers");
    int64_t sent0 = -1, sent1 = -2;
    cr_assert_null(cpc_program_bytes_sent(p, 1, &sent0, NULL));
    a->in[1] = b->in[0];
    a->out[1] = b->out[0];
    a->n_in = a->n_out = 2;
    cpc_expr_free(b->when);
    cr_assert_null(cpc_expr_parse("0", CPC_NO_SPAN, &b->when));
    cpc_status *st = cpc_verify(p);
    cr_assert_null(st, "the two-pair all_gather program: %s", st ? st->message : "");
    /* the byte count (cost model, cprun's report) counts both pairs too */
    cr_assert_null(cpc_program_bytes_sent(p, 1, &sent1, NULL));
    cr_assert_eq(sent0, sent1, "bytes sent: two ops %lld, one two-pair op %lld", (long long)sent0, (long long)sent1);
    cpc_run_report rep;
    st = run_once(job, 60, &rep);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert(rep.checked && rep.pass && rep.rel_err > 0, "rel_err %.3e", rep.rel_err);
    cpc_run_report_clear(&rep);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

/* ---- the executor API directly: memory plan and buffers ----------------------------- */

Test(executor, memory_plan_matches_allocation)
{
    tcase c = {.v = CPC_VARIANT_RING_ANYTHING, .R = 3, .U = 1, .H = 4, .D = 16, .dt = CPC_DTYPE_BF16,
               .nseg = 1, .seg = {100}, .overlap = true};
    cpc_plan *plan = mk_plan(&c);
    cpc_job *job = NULL;
    cpc_status_free(cpc_job_from_plan(plan, c.v, 3, 1, &job));
    cr_assert_not_null(job);
    for (int p = 0; p < 3; p++) {
        cpc_exec_memory m;
        cr_assert_null(cpc_exec_memory_plan(job->prog, p, &m));
        cpc_backend *be = NULL;
        cr_assert_null(cpc_cpu_backend_create(&be));
        cpc_exec_config cfg = {.prog = job->prog, .rank = p, .backend = be};
        cpc_exec *ex = NULL;
        cr_assert_null(cpc_exec_create(&cfg, &ex));
        cr_assert_eq(cpc_exec_allocated_bytes(ex), m.total_bytes);
        /* Swapped K/V buffers hold the largest block (34 tokens of 100 over 3). */
        int kc = cpc_program_find_buffer(job->prog, "k_cur");
        int kn = cpc_program_find_buffer(job->prog, "k_nxt");
        if (kc >= 0 && kn >= 0) {
            cr_assert_eq(m.buffer_bytes[kc], m.buffer_bytes[kn]);
            cr_assert_geq(m.buffer_bytes[kc], (int64_t)34 * 4 * 16 * 2);
        }
        /* The shard input size is this rank's tokens. */
        int64_t T = p == 0 ? 34 : 33;
        cr_assert_eq(cpc_exec_input_bytes(ex, CPC_ROLE_Q), (size_t)(T * 4 * 16 * 2));
        cr_assert_eq(cpc_exec_output_bytes(ex), (size_t)(T * 4 * 16 * 2));
        cpc_exec_destroy(ex);
        cpc_backend_destroy(be);
        cpc_exec_memory_free(&m);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_null(cpc_job_dry_run(job, f, 8));
    fclose(f);
    cr_assert(strstr(buf, "peak memory") != NULL, "%s", buf);
    cr_assert(strstr(buf, "rank 2") != NULL, "%s", buf);
    free(buf);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

Test(executor, bind_input_rejects_wrong_size)
{
    tcase c = {.v = CPC_VARIANT_ULYSSES, .R = 1, .U = 2, .H = 4, .D = 16, .dt = CPC_DTYPE_FP32,
               .nseg = 1, .seg = {32}, .overlap = true};
    cpc_plan *plan = mk_plan(&c);
    cpc_job *job = NULL;
    cpc_status_free(cpc_job_from_plan(plan, c.v, 1, 2, &job));
    cr_assert_not_null(job);
    cpc_backend *be = NULL;
    cr_assert_null(cpc_cpu_backend_create(&be));
    cpc_exec_config cfg = {.prog = job->prog, .rank = 1, .backend = be};
    cpc_exec *ex = NULL;
    cr_assert_null(cpc_exec_create(&cfg, &ex));
    float dummy[4];
    cpc_status *st = cpc_exec_bind_input(ex, CPC_ROLE_Q, dummy, sizeof dummy);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cr_assert(strstr(st->message, "rank 1") != NULL, "%s", st->message);
    cpc_status_free(st);
    /* Unbound inputs are reported at reset. */
    st = cpc_exec_reset(ex);
    cr_assert_not_null(st);
    cpc_status_free(st);
    cpc_exec_destroy(ex);
    cpc_backend_destroy(be);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

/* --lse: the gathered LSE [B, H, S] equals the reference LSE (every variant
 * places its ranks' heads and token runs correctly). */
static void check_lse(const tcase *c)
{
    char name[256];
    describe(c, name, sizeof name);
    cpc_plan *plan = mk_plan(c);
    cpc_job *job = NULL;
    cpc_status_free(cpc_job_from_plan(plan, c->v, c->R, c->U, &job));
    cr_assert_not_null(job, "%s", name);
    char path[] = "/tmp/cpc_exec_lse_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cpc_run_options o;
    cpc_run_options_default(&o);
    o.seed = fresh_seed();
    o.warmup = 0;
    o.iters = 1;
    o.check = false;
    o.write_lse = true;
    o.output_path = path;
    cpc_run_report rep;
    cpc_status *st = cpc_job_run(job, &o, &rep, NULL);
    cr_assert_null(st, "%s: %s", name, st ? st->message : "");
    const cpc_layout *L = &job->prog->layout;
    cpc_st_file *f = NULL;
    cr_assert_null(cpc_st_open(path, &f));
    const cpc_st_tensor *t = NULL;
    int64_t shape[3] = {L->B, L->H, L->S};
    cr_assert_null(cpc_st_expect(f, "lse", 3, shape, true, &t));
    size_t n = (size_t)(L->B * L->H * L->S);
    float *got = malloc(n * sizeof *got);
    cpc_run all = {0, L->B * L->H * L->S};
    /* Read [B*H*S] as one "token" axis: a [1, B*H*S] view. */
    cpc_st_tensor flat = *t;
    flat.ndim = 2;
    flat.shape[0] = 1;
    flat.shape[1] = L->B * L->H * L->S;
    cr_assert_null(cpc_st_read_runs(f, &flat, &all, 1, CPC_DTYPE_FP32, got));
    cpc_st_close(f);
    unlink(path);
    size_t es = (size_t)cpc_dtype_size(L->dtype);
    size_t nq = (size_t)(L->B * L->S * L->H * L->D), nk = (size_t)(L->B * L->Skv * L->Hkv * L->D);
    void *q = malloc(nq * es), *k = malloc(nk * es), *v = malloc(nk * es);
    cpc_run rq = {0, L->S}, rk = {0, L->Skv};
    cpc_rng_fill_runs(q, L->dtype, o.seed, CPC_RNG_Q, L->B, L->S, L->H, L->D, &rq, 1);
    cpc_rng_fill_runs(k, L->dtype, o.seed, CPC_RNG_K, L->B, L->Skv, L->Hkv, L->D, &rk, 1);
    cpc_rng_fill_runs(v, L->dtype, o.seed, CPC_RNG_V, L->B, L->Skv, L->Hkv, L->D, &rk, 1);
    cpc_ref_problem pb = {.B = L->B, .S = L->S, .Skv = L->Skv, .H = L->H, .Hkv = L->Hkv,
                          .D = L->D, .dtype = L->dtype, .q = q, .k = k, .v = v,
                          .scale = (double)(float)(1.0 / sqrt((double)L->D)),
                          .causal = L->causal};
    double *ref = malloc(n * sizeof *ref);
    cr_assert_null(cpc_reference_attention(&pb, NULL, 0, NULL, ref));
    cpc_compare_result cr;
    cpc_compare(got, CPC_DTYPE_FP32, ref, (int64_t)n, 1e-5, &cr);
    cr_assert(cr.pass, "%s (seed %llu): LSE rel_err %.3e, max_abs %.3e", name,
              (unsigned long long)o.seed, cr.rel_err, cr.max_abs_err);
    free(got);
    free(ref);
    free(q);
    free(k);
    free(v);
    cpc_run_report_clear(&rep);
    cpc_job_free(job);
    cpc_plan_free(plan);
}

Test(executor, lse_output_matches_reference)
{
    check_lse(&(tcase){.v = CPC_VARIANT_ULYSSES_ANYTHING, .R = 1, .U = 4, .B = 2, .H = 6, .Hkv = 3,
                       .D = 16, .dt = CPC_DTYPE_FP32, .nseg = 2, .seg = {21, 110}, .overlap = true});
    check_lse(&(tcase){.v = CPC_VARIANT_UNIFIED, .R = 2, .U = 2, .H = 4, .D = 16,
                       .dt = CPC_DTYPE_BF16, .nseg = 1, .seg = {128}, .mask = CPC_MASK_CAUSAL,
                       .overlap = true});
    check_lse(&(tcase){.v = CPC_VARIANT_RING_ANYTHING, .R = 3, .U = 1, .H = 2, .D = 16,
                       .dt = CPC_DTYPE_FP16, .nseg = 1, .seg = {100}, .overlap = false});
}
