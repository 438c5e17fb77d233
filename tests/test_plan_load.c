/* test_plan_load.c - the plan-file front end (compiler/ir/plan_load.h): every
 * key's type/range/default, the token shorthands with real model numbers,
 * overflow, conflicts, --set overrides, positions, the shared case files. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_load.h"

#ifndef CPC_SOURCE_DIR
#define CPC_SOURCE_DIR "."
#endif

#define FILE_NAME "plans/test-plan.yaml"

static cpc_status *load_n(const char *text, const char *const *sets, int n, cpc_plan **p)
{
    return cpc_plan_load_string(text, strlen(text), FILE_NAME, sets, n, p);
}

static cpc_status *load(const char *text, cpc_plan **p) { return load_n(text, NULL, 0, p); }

static const cpc_status *find_rule(const cpc_status *st, int rule)
{
    for (; st; st = st->next)
        if (st->rule == rule && st->severity == CPC_SEV_ERROR)
            return st;
    return NULL;
}

/* Loads text that must load; returns the plan; *warnings gets the count. */
static cpc_plan *load_ok_sets(const char *text, const char *const *sets, int n, int *warnings)
{
    cpc_plan *p = NULL;
    cpc_status *st = load_n(text, sets, n, &p);
    if (cpc_status_has_error(st))
        cpc_status_print(st, stderr, "test");
    cr_assert_not(cpc_status_has_error(st), "unexpected errors for:\n%s", text);
    cr_assert_not_null(p);
    if (warnings)
        *warnings = cpc_status_count(st, CPC_SEV_WARNING);
    else
        cr_assert_null(st, "unexpected warnings for:\n%s", text);
    cpc_status_free(st);
    return p;
}

static cpc_plan *load_ok(const char *text, int *warnings)
{
    return load_ok_sets(text, NULL, 0, warnings);
}

/* Loads text that must fail with `rule` among its errors; returns a copy of
 * that diagnostic's position packed as line*1000+col (for position checks). */
static int load_fails_sets(const char *text, const char *const *sets, int n, int rule)
{
    cpc_plan *p = NULL;
    cpc_status *st = load_n(text, sets, n, &p);
    cr_assert_null(p, "a plan with errors must not be returned");
    const cpc_status *d = find_rule(st, rule);
    if (!d)
        cpc_status_print(st, stderr, "test");
    cr_assert_not_null(d, "expected CP%03d for:\n%s", rule, text);
    cr_assert_eq(d->code, CPC_E_PLAN);
    cr_assert_not_null(d->span.file);
    cr_assert_gt(d->span.line, 0, "every diagnostic has a position (%s)", d->message);
    cr_assert_gt(d->span.col, 0);
    int pos = d->span.line * 1000 + d->span.col;
    cpc_status_free(st);
    return pos;
}

static int load_fails(const char *text, int rule) { return load_fails_sets(text, NULL, 0, rule); }

/* A plan with `model_extra` in model, `input` as input's body, etc. */
static char *plan_text(const char *model, const char *input, const char *cluster,
                       const char *parallel)
{
    char *s = NULL;
    int n = asprintf(&s,
                     "version: 1\n"
                     "model: {heads: 24, head_dim: 128%s%s}\n"
                     "input:\n  %s\n"
                     "cluster: {world_size: 4%s%s}\n"
                     "%s%s%s",
                     model[0] ? ", " : "", model, input, cluster[0] ? ", " : "", cluster,
                     parallel[0] ? "parallel: {" : "", parallel, parallel[0] ? "}\n" : "");
    cr_assert_geq(n, 0);
    return s;
}

/* Tokens of the single segment given by an input fragment. */
static int64_t tokens_of(const char *input, int expect_warnings)
{
    char *t = plan_text("", input, "", "");
    int w = 0;
    cpc_plan *p = load_ok(t, &w);
    cr_assert_eq(w, expect_warnings, "warnings: %d, expected %d for %s", w, expect_warnings, input);
    cr_assert_eq(p->input.n_segments, 1);
    int64_t v = p->input.segments[0].tokens;
    cr_assert_eq(p->input.total_tokens, v);
    cpc_plan_free(p);
    free(t);
    return v;
}

static void input_fails(const char *input, int rule)
{
    char *t = plan_text("", input, "", "");
    load_fails(t, rule);
    free(t);
}

/* ---- shorthands with real model numbers -------------------------------- */

Test(plan_load, image_shorthand_flux)
{
    cr_assert_eq(tokens_of("image: {height: 1024, width: 1024}", 0), 4096);
    cr_assert_eq(tokens_of("image: {height: 1008, width: 1008, vae_scale: 8, patch: 2}", 0), 3969);
    /* not divisible: floored, one warning per dimension */
    cr_assert_eq(tokens_of("image: {height: 1000, width: 1024}", 1), 62 * 64);
    cr_assert_eq(tokens_of("image: {height: 1000, width: 1000}", 2), 62 * 62);
    cr_assert_eq(tokens_of("image: {height: 64, width: 32, vae_scale: 4, patch: 1}", 0), 16 * 8);
}

Test(plan_load, video_shorthand_models)
{
    /* Wan2.1: T = (F-1)/4 + 1, (H/16)(W/16) */
    cr_assert_eq(tokens_of("video: {frames: 81, height: 480, width: 832}", 0), 32760);
    cr_assert_eq(tokens_of("video: {frames: 81, height: 720, width: 1280}", 0), 75600);
    /* HunyuanVideo 129f 720x1280 -> 33*45*80 */
    cr_assert_eq(tokens_of("video: {frames: 129, height: 720, width: 1280, patch: [1, 2, 2]}", 0),
                 118800);
    /* CogVideoX 49f 480x720 */
    cr_assert_eq(tokens_of("video: {frames: 49, height: 480, width: 720, vae_scale: 8, "
                           "vae_temporal: 4}", 0), 17550);
    /* LTX-Video 161f 512x704, VAE 32x spatial 8x temporal, patch 1 */
    cr_assert_eq(tokens_of("video: {frames: 161, height: 512, width: 704, vae_scale: 32, "
                           "vae_temporal: 8, patch: [1, 1, 1]}", 0), 7392);
    /* frames - 1 not a multiple of vae_temporal: floored with a warning */
    cr_assert_eq(tokens_of("video: {frames: 80, height: 480, width: 832}", 1), 20 * 30 * 52);
    /* a temporal patch that does not divide the latent frames */
    cr_assert_eq(tokens_of("video: {frames: 81, height: 480, width: 832, patch: [2, 2, 2]}", 1),
                 10 * 30 * 52);
    /* one frame */
    cr_assert_eq(tokens_of("video: {frames: 1, height: 480, width: 832}", 0), 30 * 52);
}

Test(plan_load, tokens_shorthand_and_segments)
{
    cr_assert_eq(tokens_of("tokens: 4608", 0), 4608);
    cr_assert_eq(tokens_of("tokens: 2147483647", 0), 2147483647);
    char *t = plan_text("", "segments:\n"
                            "    - {name: text, tokens: 512}\n"
                            "    - {name: image, image: {height: 1024, width: 1024}}\n"
                            "    - name: clip\n"
                            "      video: {frames: 49, height: 480, width: 720}\n"
                            "    - {tokens: 7}",
                        "", "");
    cpc_plan *p = load_ok(t, NULL);
    cr_assert_eq(p->input.n_segments, 4);
    cr_assert_str_eq(p->input.segments[0].name, "text");
    cr_assert_eq(p->input.segments[0].tokens, 512);
    cr_assert_str_eq(p->input.segments[1].name, "image");
    cr_assert_eq(p->input.segments[1].tokens, 4096);
    cr_assert_str_eq(p->input.segments[2].name, "clip");
    cr_assert_eq(p->input.segments[2].tokens, 17550);
    cr_assert_str_eq(p->input.segments[3].name, "segment3");
    cr_assert_eq(p->input.segments[3].tokens, 7);
    cr_assert_eq(p->input.total_tokens, 512 + 4096 + 17550 + 7);
    /* segment spans: the segment's mapping */
    cr_assert_eq(p->input.segments[0].span.line, 5);
    cr_assert_eq(p->input.segments[0].span.col, 7);
    cr_assert_str_eq(p->input.segments[0].span.file, FILE_NAME);
    cr_assert_eq(p->input.segments[2].span.line, 7);
    cr_assert_eq(p->input.segments[2].span.col, 7);
    cpc_plan_free(p);
    free(t);

    /* shorthand segment names and spans (the shorthand key) */
    t = plan_text("", "image: {height: 1024, width: 1024}", "", "");
    p = load_ok(t, NULL);
    cr_assert_str_eq(p->input.segments[0].name, "image");
    cr_assert_eq(p->input.segments[0].span.line, 4);
    cr_assert_eq(p->input.segments[0].span.col, 3);
    cpc_plan_free(p);
    free(t);
    t = plan_text("", "tokens: 77", "", "");
    p = load_ok(t, NULL);
    cr_assert_str_eq(p->input.segments[0].name, "tokens");
    cpc_plan_free(p);
    free(t);
    t = plan_text("", "video: {frames: 1, height: 16, width: 16}", "", "");
    p = load_ok(t, NULL);
    cr_assert_str_eq(p->input.segments[0].name, "video");
    cr_assert_eq(p->input.segments[0].tokens, 1);
    cpc_plan_free(p);
    free(t);
}

Test(plan_load, token_arithmetic_overflow)
{
    /* 2^40 x 2^40: 2^36 * 2^36 patches overflow int64 */
    input_fails("image: {height: 1099511627776, width: 1099511627776}", 103);
    /* vae_scale * patch overflows */
    input_fails("image: {height: 16, width: 16, vae_scale: 4611686018427387904, patch: 4}", 103);
    /* fits in int64 but more than 2^31-1 tokens in a segment */
    input_fails("image: {height: 1048576, width: 1048576, vae_scale: 1, patch: 1}", 103);
    input_fails("tokens: 2147483648", 103);
    input_fails("tokens: 99999999999999999999999", 103);
    input_fails("video: {frames: 9223372036854775807, height: 4294967296, width: 4294967296}", 103);
    input_fails("video: {frames: 81, height: 4294967296, width: 4294967296, vae_scale: 1, "
                "patch: [1, 1, 1]}", 103);
    input_fails("video: {frames: 81, height: 480, width: 832, vae_scale: 4611686018427387904}", 103);
    /* smaller than one patch: no tokens */
    input_fails("image: {height: 8, width: 1024}", 103);
    input_fails("video: {frames: 81, height: 480, width: 832, patch: [22, 2, 2]}", 103);
    input_fails("tokens: 0", 103);
    input_fails("tokens: -5", 103);
    input_fails("image: {height: 0, width: 1024}", 103);
    input_fails("image: {height: 1024, width: 1024, patch: -2}", 103);
    input_fails("video: {frames: 0, height: 480, width: 832}", 103);
    input_fails("video: {frames: 81, height: 480, width: 832, patch: [1, 0, 2]}", 103);
}

/* ---- defaults and full plans --------------------------------------------- */

Test(plan_load, defaults)
{
    const char *text = "version: 1\n"
                       "model: {heads: 24, head_dim: 128}\n"
                       "input: {tokens: 4096}\n"
                       "cluster: {world_size: 4}\n";
    cpc_plan *p = NULL;
    cpc_status *st = cpc_plan_load_string(text, strlen(text), "plans/flux-min.yaml", NULL, 0, &p);
    cr_assert_null(st);
    cr_assert_not_null(p);
    cr_assert_str_eq(p->file, "plans/flux-min.yaml");
    cr_assert_str_eq(p->name, "flux-min");
    cr_assert_eq(p->version, 1);
    cr_assert_eq(p->model.heads, 24);
    cr_assert_eq(p->model.kv_heads, 24);
    cr_assert_eq(p->model.head_dim, 128);
    cr_assert_eq(p->model.dtype, CPC_DTYPE_BF16);
    cr_assert_eq(p->model.layers, 1);
    cr_assert_float_eq(p->model.scale, 1.0 / sqrt(128.0), 1e-15);
    cr_assert_not(p->model.scale_given);
    cr_assert_eq(p->input.batch, 1);
    cr_assert_eq(p->input.n_segments, 1);
    cr_assert_eq(p->input.total_tokens, 4096);
    cr_assert_eq(p->input.mask, CPC_MASK_NONE);
    cr_assert_not(p->input.has_kv);
    cr_assert_eq(p->input.mode, CPC_MODE_INFERENCE);
    cr_assert_eq(p->cluster.world_size, 4);
    cr_assert_eq(p->cluster.gpus_per_node, 4);
    cr_assert_str_eq(p->cluster.device, "h100-sxm");
    cr_assert_null(p->cluster.profile);
    cr_assert_eq(p->cluster.memory_gb, 0.0);
    cr_assert_eq(p->cluster.reserved_gb, 0.0);
    cr_assert_eq(p->parallel.variant, CPC_VARIANT_AUTO);
    cr_assert_not(p->parallel.variant_given);
    cr_assert_eq(p->parallel.ring_degree, 0);
    cr_assert_eq(p->parallel.ulysses_degree, 0);
    cr_assert_not(p->parallel.ulysses_anything);
    cr_assert_not(p->parallel.ring_anything);
    cr_assert_eq(p->parallel.fallback, CPC_FALLBACK_STRICT);
    cr_assert(p->schedule.overlap);
    cr_assert_eq(p->schedule.rotate, CPC_ROTATE_P2P);
    cr_assert_null(p->schedule.script);
    cpc_plan_free(p);

    /* gpus_per_node = min(world_size, 8) */
    text = "version: 1\nmodel: {heads: 8, head_dim: 64}\ninput: {tokens: 64}\n"
           "cluster: {world_size: 16}\n";
    st = cpc_plan_load_string(text, strlen(text), NULL, NULL, 0, &p);
    cr_assert_null(st);
    cr_assert_eq(p->cluster.gpus_per_node, 8);
    cr_assert_float_eq(p->model.scale, 0.125, 1e-15);
    cr_assert_str_eq(p->file, "<string>");
    cr_assert_str_eq(p->name, "<string>");
    cpc_plan_free(p);
}

Test(plan_load, every_key_of_the_spec)
{
    const char *text = "version: 1\n"
                       "name: flux1-dev-1024\n"
                       "model:\n"
                       "  heads: 24\n"
                       "  kv_heads: 8\n"
                       "  head_dim: 128\n"
                       "  dtype: fp16\n"
                       "  layers: 57\n"
                       "  scale: 0.1\n"
                       "input:\n"
                       "  batch: 2\n"
                       "  segments:\n"
                       "    - {name: text, tokens: 512}\n"
                       "    - {name: image, image: {height: 1024, width: 1024, vae_scale: 8, patch: 2}}\n"
                       "  mask: key_padding\n"
                       "  kv: {tokens: 300}\n"
                       "  mode: training\n"
                       "cluster:\n"
                       "  world_size: 16\n"
                       "  gpus_per_node: 4\n"
                       "  device: rtx4090\n"
                       "  profile: cluster.yaml\n"
                       "  memory_gb: 48\n"
                       "  reserved_gb: 24.5\n"
                       "parallel:\n"
                       "  variant: ulysses_anything\n"
                       "  ring_degree: 1\n"
                       "  ulysses_degree: 16\n"
                       "  ulysses_anything: true\n"
                       "  ring_anything: false\n"
                       "  fallback: auto\n"
                       "schedule:\n"
                       "  overlap: false\n"
                       "  rotate: allgather\n"
                       "  script: tweak.lua\n";
    cpc_plan *p = load_ok(text, NULL);
    cr_assert_str_eq(p->name, "flux1-dev-1024");
    cr_assert_eq(p->model.kv_heads, 8);
    cr_assert_eq(p->model.dtype, CPC_DTYPE_FP16);
    cr_assert_eq(p->model.layers, 57);
    cr_assert_float_eq(p->model.scale, 0.1, 1e-15);
    cr_assert(p->model.scale_given);
    cr_assert_eq(p->input.batch, 2);
    cr_assert_eq(p->input.n_segments, 2);
    cr_assert_eq(p->input.total_tokens, 4608);
    cr_assert_eq(p->input.mask, CPC_MASK_KEY_PADDING);
    cr_assert(p->input.has_kv);
    cr_assert_eq(p->input.kv_tokens, 300);
    cr_assert_eq(p->input.mode, CPC_MODE_TRAINING);
    cr_assert_eq(p->cluster.world_size, 16);
    cr_assert_eq(p->cluster.gpus_per_node, 4);
    cr_assert_str_eq(p->cluster.device, "rtx4090");
    cr_assert_str_eq(p->cluster.profile, "cluster.yaml");
    cr_assert_float_eq(p->cluster.memory_gb, 48.0, 0);
    cr_assert_float_eq(p->cluster.reserved_gb, 24.5, 0);
    cr_assert_eq(p->parallel.variant, CPC_VARIANT_ULYSSES_ANYTHING);
    cr_assert(p->parallel.variant_given);
    cr_assert_eq(p->parallel.ring_degree, 1);
    cr_assert_eq(p->parallel.ulysses_degree, 16);
    cr_assert(p->parallel.ulysses_anything);
    cr_assert_not(p->parallel.ring_anything);
    cr_assert_eq(p->parallel.fallback, CPC_FALLBACK_AUTO);
    cr_assert_not(p->schedule.overlap);
    cr_assert_eq(p->schedule.rotate, CPC_ROTATE_ALLGATHER);
    cr_assert_str_eq(p->schedule.script, "tweak.lua");

    /* key spans, dotted paths, with fallback to the parent */
    cpc_span s = cpc_plan_span(p, "model.heads", false);
    cr_assert_eq(s.line, 4);
    cr_assert_eq(s.col, 3);
    cr_assert_str_eq(s.file, FILE_NAME);
    cr_assert_eq(s.file, p->file, "spans point to plan->file");
    s = cpc_plan_span(p, "model.heads", true);
    cr_assert_eq(s.line, 4);
    cr_assert_eq(s.col, 10);
    s = cpc_plan_span(p, "input.segments[1]", false);
    cr_assert_eq(s.line, 14);
    cr_assert_eq(s.col, 7);
    s = cpc_plan_span(p, "input.segments[1].image.height", false);
    cr_assert_eq(s.line, 14);
    cr_assert_eq(s.col, 29);
    s = cpc_plan_span(p, "input.segments[1].image.height", true);
    cr_assert_eq(s.col, 37);
    s = cpc_plan_span(p, "input.segments[1].tokens", false); /* absent: the segment */
    cr_assert_eq(s.line, 14);
    cr_assert_eq(s.col, 7);
    s = cpc_plan_span(p, "parallel.ulysses_degree", true);
    cr_assert_eq(s.line, 28);
    cr_assert_eq(s.col, 19);
    s = cpc_plan_span(p, "input.kv.tokens", true);
    cr_assert_eq(s.line, 16);
    cr_assert_eq(s.col, 16);
    s = cpc_plan_span(p, "schedule", false);
    cr_assert_eq(s.line, 32);
    s = cpc_plan_span(p, "nothing.at.all", false);
    cr_assert_eq(s.line, 0);
    cr_assert_str_eq(s.file, FILE_NAME);
    cpc_plan_free(p);
}

Test(plan_load, parent_span_fallback)
{
    char *t = plan_text("", "tokens: 64", "", "");
    cpc_plan *p = load_ok(t, NULL);
    cpc_span s = cpc_plan_span(p, "parallel.ring_degree", false);
    cr_assert_eq(s.line, 0, "no parallel section: no position");
    s = cpc_plan_span(p, "model.kv_heads", false);
    cr_assert_eq(s.line, 2, "absent key: its section");
    cr_assert_eq(s.col, 1);
    cpc_plan_free(p);
    free(t);
}

/* ---- types --------------------------------------------------------------- */

Test(plan_load, strict_types)
{
    const char *model_bad[] = {"kv_heads: \"8\"", "kv_heads: 0x18", "kv_heads: 1_000",
                               "kv_heads: 24.0", "layers: 1e3", "dtype: 16", "scale: \"0.1\"",
                               "scale: true", "layers: [1]", "layers: {a: 1}", "kv_heads: ~",
                               "kv_heads: 0o17"};
    for (size_t i = 0; i < sizeof model_bad / sizeof model_bad[0]; i++) {
        char *t = plan_text(model_bad[i], "tokens: 64", "", "");
        load_fails(t, 102);
        free(t);
    }
    const char *parallel_bad[] = {"ulysses_anything: yes", "ulysses_anything: on",
                                  "ring_anything: True", "ring_anything: 1",
                                  "ring_degree: \"2\"", "variant: 4", "fallback: true"};
    for (size_t i = 0; i < sizeof parallel_bad / sizeof parallel_bad[0]; i++) {
        char *t = plan_text("", "tokens: 64", "", parallel_bad[i]);
        load_fails(t, 102);
        free(t);
    }
    const char *cluster_bad[] = {"gpus_per_node: 8.0", "device: 4090", "memory_gb: \"80\"",
                                 "profile: 3"};
    for (size_t i = 0; i < sizeof cluster_bad / sizeof cluster_bad[0]; i++) {
        char *t = plan_text("", "tokens: 64", cluster_bad[i], "");
        load_fails(t, 102);
        free(t);
    }
    const char *input_bad[] = {"tokens: \"64\"", "tokens: 6.4e1", "image: [1024, 1024]",
                               "image: {height: \"1024\", width: 1024}",
                               "video: {frames: 81, height: 480, width: 832, patch: 2}",
                               "video: {frames: 81, height: 480, width: 832, patch: [1, 2]}",
                               "video: {frames: 81, height: 480, width: 832, patch: [1, 2, x]}",
                               "segments: {name: a, tokens: 5}", "segments: [5]",
                               "segments: [{name: 5, tokens: 5}]", "kv: 5",
                               "tokens: 5\n  kv: {tokens: yes}", "tokens: 5\n  mask: false",
                               "tokens: 5\n  batch: 0x1"};
    for (size_t i = 0; i < sizeof input_bad / sizeof input_bad[0]; i++)
        input_fails(input_bad[i], 102);

    /* the heads themselves, and whole sections of the wrong type */
    load_fails("version: 1\nmodel: {heads: \"24\", head_dim: 128}\ninput: {tokens: 8}\n"
               "cluster: {world_size: 2}\n", 102);
    load_fails("version: 1\nmodel: {heads: 0x18, head_dim: 128}\ninput: {tokens: 8}\n"
               "cluster: {world_size: 2}\n", 102);
    load_fails("version: 1\nmodel: {heads: 24, head_dim: 128.0}\ninput: {tokens: 8}\n"
               "cluster: {world_size: 2}\n", 102);
    load_fails("version: 1\nmodel: 5\ninput: {tokens: 8}\ncluster: {world_size: 2}\n", 102);
    load_fails("version: 1\nmodel: {heads: 2, head_dim: 8}\ninput: [1]\n"
               "cluster: {world_size: 2}\n", 102);
    load_fails("version: \"1\"\nmodel: {heads: 2, head_dim: 8}\ninput: {tokens: 8}\n"
               "cluster: {world_size: 2}\n", 102);
    load_fails("version: 1\nname: 2024\nmodel: {heads: 2, head_dim: 8}\ninput: {tokens: 8}\n"
               "cluster: {world_size: 2}\n", 102);
    load_fails("- version: 1\n", 102);
    load_fails("just a string\n", 102);

    /* the message names what was expected and what was found */
    cpc_plan *p = NULL;
    const char *t = "version: 1\nmodel: {heads: 24, head_dim: 24.0}\ninput: {tokens: 8}\n"
                    "cluster: {world_size: 2}\n";
    cpc_status *st = load(t, &p);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "model.head_dim"), "%s", st->message);
    cr_assert(strstr(st->message, "expected an integer"), "%s", st->message);
    cr_assert(strstr(st->message, "float 24.0"), "%s", st->message);
    cr_assert_not_null(st->hint);
    cr_assert(strstr(st->hint, "write 24"), "%s", st->hint);
    cpc_status_free(st);
}

/* ---- ranges -------------------------------------------------------------- */

Test(plan_load, ranges)
{
    const char *model_bad[] = {"kv_heads: 0", "kv_heads: 65537", "layers: 0",
                               "layers: 1048577", "dtype: fp8", "dtype: BF16", "scale: 0",
                               "scale: -0.5", "scale: .inf", "scale: .nan", "scale: 1e999"};
    for (size_t i = 0; i < sizeof model_bad / sizeof model_bad[0]; i++) {
        char *t = plan_text(model_bad[i], "tokens: 64", "", "");
        load_fails(t, 103);
        free(t);
    }
    const char *cluster_bad[] = {"device: h300",   "device: H100-SXM", "gpus_per_node: 0",
                                 "memory_gb: 0",   "reserved_gb: -1",  "memory_gb: -.inf",
                                 "profile: ''"};
    for (size_t i = 0; i < sizeof cluster_bad / sizeof cluster_bad[0]; i++) {
        char *t = plan_text("", "tokens: 64", cluster_bad[i], "");
        load_fails(t, 103);
        free(t);
    }
    const char *parallel_bad[] = {"variant: rings", "fallback: never", "ulysses_degree: 1048577"};
    for (size_t i = 0; i < sizeof parallel_bad / sizeof parallel_bad[0]; i++) {
        char *t = plan_text("", "tokens: 64", "", parallel_bad[i]);
        load_fails(t, 103);
        free(t);
    }
    input_fails("tokens: 5\n  mask: diagonal", 103);
    input_fails("tokens: 5\n  mode: train", 103);
    input_fails("tokens: 5\n  batch: 0", 103);
    input_fails("tokens: 5\n  kv: {tokens: 0}", 103);
    input_fails("tokens: 5\n  kv: {tokens: 2147483648}", 103);
    input_fails("segments: []", 103);
    input_fails("segments: [{name: '', tokens: 5}]", 103);

    /* heads, head_dim, world_size: the edges */
    static const struct {
        int heads, head_dim, world;
        bool ok;
    } edges[] = {
        {1, 1, 1, true},         {65536, 256, 1048576, true}, {0, 64, 4, false},
        {65537, 64, 4, false},   {24, 0, 4, false},           {24, 257, 4, false},
        {24, 64, 0, false},      {24, 64, 1048577, false},    {-1, 64, 4, false},
    };
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        char t[256];
        snprintf(t, sizeof t,
                 "version: 1\nmodel: {heads: %d, head_dim: %d}\ninput: {tokens: 8}\n"
                 "cluster: {world_size: %d}\n",
                 edges[i].heads, edges[i].head_dim, edges[i].world);
        if (edges[i].ok) {
            cpc_plan *p = load_ok(t, NULL);
            cr_assert_eq(p->model.heads, edges[i].heads);
            cr_assert_eq(p->cluster.world_size, edges[i].world);
            cpc_plan_free(p);
        } else {
            load_fails(t, 103);
        }
    }

    /* version must be 1 */
    load_fails("version: 2\nmodel: {heads: 2, head_dim: 8}\ninput: {tokens: 8}\n"
               "cluster: {world_size: 2}\n", 103);
    load_fails("version: 0\nmodel: {heads: 2, head_dim: 8}\ninput: {tokens: 8}\n"
               "cluster: {world_size: 2}\n", 103);

    /* 64 segments are accepted, 65 are not */
    for (int n = 64; n <= 65; n++) {
        size_t cap = 64 + (size_t)n * 32;
        char *in = malloc(cap);
        size_t o = (size_t)snprintf(in, cap, "segments:");
        for (int i = 0; i < n; i++)
            o += (size_t)snprintf(in + o, cap - o, "\n    - {name: s%d, tokens: 3}", i);
        char *t = plan_text("", in, "", "");
        if (n == 64) {
            cpc_plan *p = load_ok(t, NULL);
            cr_assert_eq(p->input.n_segments, 64);
            cr_assert_eq(p->input.total_tokens, 192);
            cpc_plan_free(p);
        } else {
            load_fails(t, 103);
        }
        free(t);
        free(in);
    }

    /* an enum typo gets a suggestion */
    cpc_plan *p = NULL;
    char *t = plan_text("", "tokens: 64", "device: h100", "");
    cpc_status *st = load(t, &p);
    cr_assert_eq(st->rule, 103);
    cr_assert_not_null(st->hint);
    cr_assert(strstr(st->hint, "h100-sxm"), "%s", st->hint);
    cpc_status_free(st);
    free(t);
}

Test(plan_load, degrees_below_one_pass_through)
{
    /* a degree < 1 is the validator's CP002: the loader keeps the value and
     * the key span, so that a written 0 differs from an omitted one */
    char *t = plan_text("", "tokens: 64", "", "ring_degree: 0, ulysses_degree: -3");
    cpc_plan *p = load_ok(t, NULL);
    cr_assert_eq(p->parallel.ring_degree, 0);
    cr_assert_eq(p->parallel.ulysses_degree, -3);
    cr_assert_eq(cpc_plan_span(p, "parallel.ring_degree", true).line, 6);
    cpc_plan_free(p);
    free(t);
    t = plan_text("", "tokens: 64", "", "ring_degree: -1048577");
    load_fails(t, 103);
    free(t);
}

/* ---- missing keys -------------------------------------------------------- */

Test(plan_load, missing_required)
{
    load_fails("model: {heads: 2, head_dim: 8}\ninput: {tokens: 8}\ncluster: {world_size: 2}\n",
               104);
    load_fails("version: 1\nmodel: {head_dim: 8}\ninput: {tokens: 8}\ncluster: {world_size: 2}\n",
               104);
    load_fails("version: 1\nmodel: {heads: 2}\ninput: {tokens: 8}\ncluster: {world_size: 2}\n",
               104);
    load_fails("version: 1\ninput: {tokens: 8}\ncluster: {world_size: 2}\n", 104);
    load_fails("version: 1\nmodel: {heads: 2, head_dim: 8}\ninput: {tokens: 8}\n", 104);
    load_fails("version: 1\nmodel: {heads: 2, head_dim: 8}\ninput: {tokens: 8}\ncluster: {}\n",
               104);
    load_fails("version: 1\nmodel: {heads: 2, head_dim: 8}\ncluster: {world_size: 2}\n", 104);
    input_fails("batch: 1", 104);
    input_fails("image: {height: 1024}", 104);
    input_fails("video: {height: 480, width: 832}", 104);
    input_fails("segments: [{name: text}]", 104);
    input_fails("tokens: 5\n  kv: {}", 104);
    load_fails("", 104);
    load_fails("# nothing but a comment\n", 104);

    /* a missing key points at its section's key */
    int pos = load_fails("version: 1\nmodel: {heads: 2, head_dim: 8}\ninput: {tokens: 8}\n"
                         "cluster:\n  device: cpu\n", 104);
    cr_assert_eq(pos, 4001);
}

/* ---- conflicts ----------------------------------------------------------- */

Test(plan_load, conflicts)
{
    input_fails("tokens: 8\n  segments: [{name: a, tokens: 4}]", 105);
    input_fails("image: {height: 64, width: 64}\n  video: {frames: 1, height: 64, width: 64}", 105);
    input_fails("segments: [{name: a, tokens: 4, image: {height: 64, width: 64}}]", 105);
    input_fails("segments: [{name: a, tokens: 4}, {name: a, tokens: 5}]", 105);
    input_fails("tokens: 8\n  tokens: 9", 105); /* duplicate key */
    const char *par[] = {
        "ulysses_anything: true, ring_anything: true",
        "variant: ring, ulysses_anything: true",
        "variant: auto, ring_anything: true",
        "variant: none, ulysses_anything: true",
        "variant: ulysses_anything, ring_anything: true",
        "variant: ring, ulysses_degree: 2",
        "variant: ulysses, ring_degree: 2",
    };
    for (size_t i = 0; i < sizeof par / sizeof par[0]; i++) {
        char *t = plan_text("", "tokens: 64", "", par[i]);
        load_fails(t, 105);
        free(t);
    }
    /* not conflicts: false flags, the matching variant, degrees of 1, unified */
    const char *fine[] = {
        "variant: ring, ulysses_anything: false, ring_anything: false",
        "variant: ulysses_anything, ulysses_anything: true",
        "variant: ring_anything, ring_anything: true",
        "ulysses_anything: true",
        "variant: ring, ulysses_degree: 1",
        "variant: ulysses, ring_degree: 1, ulysses_degree: 4",
        "variant: unified, ring_degree: 2, ulysses_degree: 2",
        "ring_degree: 2, ulysses_degree: 2",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        char *t = plan_text("", "tokens: 64", "", fine[i]);
        cpc_plan *p = load_ok(t, NULL);
        cpc_plan_free(p);
        free(t);
    }

    /* the conflict points at the later key with a note at the earlier one */
    cpc_plan *p = NULL;
    const char *t = "version: 1\n"
                    "model: {heads: 2, head_dim: 8}\n"
                    "input:\n"
                    "  tokens: 8\n"
                    "  image: {height: 16, width: 16}\n"
                    "cluster: {world_size: 2}\n";
    cpc_status *st = load(t, &p);
    cr_assert_null(p);
    cr_assert_eq(st->rule, 105);
    cr_assert_eq(st->span.line, 5);
    cr_assert_eq(st->span.col, 3);
    cr_assert_not_null(st->notes);
    cr_assert_eq(st->notes->span.line, 4);
    cr_assert_eq(st->notes->span.col, 3);
    cpc_status_free(st);
}

/* ---- unknown keys ---------------------------------------------------------- */

Test(plan_load, unknown_keys_and_suggestions)
{
    cpc_plan *p = NULL;
    const char *t = "version: 1\n"
                    "model: {heads: 2, head_dims: 8, Layers: 3}\n"
                    "input: {tokens: 8, zzz: 1}\n"
                    "cluster: {world_size: 2}\n"
                    "world_size: 2\n"
                    "paralel: {}\n";
    cpc_status *st = load(t, &p);
    cr_assert_null(p);
    /* no CP104 for head_dim: the CP101 hint covers it */
    cr_assert_null(find_rule(st, 104));
    cr_assert_eq(cpc_status_count(st, CPC_SEV_ERROR), 5);
    const cpc_status *d = st;
    cr_assert_eq(d->rule, 101);
    cr_assert(strstr(d->message, "'head_dims'"), "%s", d->message);
    cr_assert_str_eq(d->hint, "did you mean 'head_dim'?");
    cr_assert_eq(d->span.line, 2);
    cr_assert_eq(d->span.col, 19);
    d = d->next;
    cr_assert(strstr(d->message, "'Layers'"));
    cr_assert(strstr(d->hint, "'layers'"));
    d = d->next;
    cr_assert(strstr(d->message, "'zzz'"));
    cr_assert(strstr(d->hint, "known keys here"), "%s", d->hint);
    d = d->next;
    cr_assert(strstr(d->message, "'world_size'"));
    cr_assert(strstr(d->hint, "belongs under 'cluster'"), "%s", d->hint);
    d = d->next;
    cr_assert_str_eq(d->hint, "did you mean 'parallel'?");
    cr_assert_eq(d->span.line, 6);
    cpc_status_free(st);

    /* unknown keys inside image, video, segments and kv */
    input_fails("image: {height: 64, width: 64, patch_size: 2}", 101);
    input_fails("video: {frames: 1, height: 64, width: 64, fps: 24}", 101);
    input_fails("segments: [{name: a, tokens: 4, order: 1}]", 101);
    input_fails("tokens: 4\n  kv: {tokens: 4, heads: 2}", 101);
    char *tt = plan_text("", "tokens: 4", "", "variant: ring, rotate: p2p");
    load_fails(tt, 101);
    free(tt);
}

Test(plan_load, all_errors_reported_in_order)
{
    cpc_plan *p = NULL;
    const char *t = "version: 1\n"
                    "model:\n"
                    "  heads: \"8\"\n"
                    "  head_dim: 0\n"
                    "  foo: 1\n"
                    "input: {tokens: 8}\n"
                    "cluster:\n"
                    "  device: cpu\n"
                    "parallel: {ulysses_anything: yes}\n";
    cpc_status *st = load(t, &p);
    cr_assert_null(p);
    cr_assert_eq(cpc_status_count(st, CPC_SEV_ERROR), 5);
    static const int want[5][3] = {
        {102, 3, 10}, {103, 4, 13}, {101, 5, 3}, {104, 7, 1}, {102, 9, 30}};
    const cpc_status *d = st;
    for (int i = 0; i < 5; i++, d = d->next) {
        cr_assert_eq(d->rule, want[i][0], "diag %d: CP%03d (%s)", i, d->rule, d->message);
        cr_assert_eq(d->span.line, want[i][1], "diag %d line %d", i, d->span.line);
        cr_assert_eq(d->span.col, want[i][2], "diag %d col %d", i, d->span.col);
        cr_assert_str_eq(d->span.file, FILE_NAME);
        cr_assert_eq(d->code, CPC_E_PLAN);
    }
    cpc_status_free(st);
}

/* ---- refused YAML and caps through the loader ------------------------------ */

Test(plan_load, yaml_level_rules)
{
    load_fails("version: 1\nmodel: &m {heads: 2, head_dim: 8}\n", 100);
    load_fails("version: 1\nx: *m\n", 100);
    load_fails("version: !!int 1\n", 100);
    load_fails("version: 1\n---\nversion: 1\n", 100);
    load_fails("version: [1\n", 100);
    int pos = load_fails("version: 1\nversion: 1\nmodel: {heads: 2, head_dim: 8}\n"
                         "input: {tokens: 8}\ncluster: {world_size: 2}\n", 105);
    cr_assert_eq(pos, 2001);

    /* depth: 64 levels parse, 65 do not */
    char *deep = malloc(400);
    strcpy(deep, "version: 1\nx: ");
    for (int i = 0; i < 64; i++)
        strcat(deep, "[");
    for (int i = 0; i < 64; i++)
        strcat(deep, "]");
    strcat(deep, "\n");
    load_fails(deep, 106);
    free(deep);

    size_t n = (1u << 20) + 1;
    char *big = malloc(n);
    memset(big, '#', n);
    big[0] = 'a';
    big[1] = ':';
    big[2] = '\n';
    cpc_plan *p = NULL;
    cpc_status *st = cpc_plan_load_string(big, n, "big.yaml", NULL, 0, &p);
    cr_assert_null(p);
    cr_assert_not_null(st);
    cr_assert_eq(st->rule, 106);
    cpc_status_free(st);
    free(big);
}

Test(plan_load, io_error)
{
    cpc_plan *p = (cpc_plan *)1;
    cpc_status *st = cpc_plan_load_file("/nonexistent/plan.yaml", NULL, 0, &p);
    cr_assert_null(p);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_IO);
    cr_assert_eq(cpc_status_exit_code(st), 2);
    cpc_status_free(st);
}

/* ---- --set -------------------------------------------------------------- */

#define FLUX_1024                                                                              \
    "version: 1\n"                                                                             \
    "model: {heads: 24, head_dim: 128}\n"                                                      \
    "input:\n"                                                                                 \
    "  segments:\n"                                                                            \
    "    - {name: text, tokens: 512}\n"                                                        \
    "    - {name: image, image: {height: 1024, width: 1024}}\n"                                \
    "cluster: {world_size: 4}\n"

Test(plan_load, set_overrides)
{
    const char *sets[] = {"cluster.world_size=8", "parallel.variant=ring",
                          "input.segments[0].tokens=100", "model.dtype=fp32",
                          "schedule.overlap=false", "input.segments[1].image.height=512"};
    cpc_plan *p = load_ok_sets(FLUX_1024, sets, 6, NULL);
    cr_assert_eq(p->cluster.world_size, 8);
    cr_assert_eq(p->cluster.gpus_per_node, 8);
    cr_assert_eq(p->parallel.variant, CPC_VARIANT_RING);
    cr_assert(p->parallel.variant_given);
    cr_assert_eq(p->input.segments[0].tokens, 100);
    cr_assert_eq(p->input.segments[1].tokens, 32 * 64);
    cr_assert_eq(p->model.dtype, CPC_DTYPE_FP32);
    cr_assert_not(p->schedule.overlap);
    /* spans of overridden values point at the --set argument */
    cpc_span s = cpc_plan_span(p, "cluster.world_size", true);
    cr_assert_str_eq(s.file, CPC_SET_FILE);
    cr_assert_eq(s.line, 1);
    cr_assert_eq(s.col, 20);
    s = cpc_plan_span(p, "cluster.world_size", false);
    cr_assert_eq(s.line, 1);
    cr_assert_eq(s.col, 9);
    s = cpc_plan_span(p, "parallel.variant", true);
    cr_assert_str_eq(s.file, CPC_SET_FILE);
    cr_assert_eq(s.line, 2);
    cr_assert_eq(s.col, 18);
    s = cpc_plan_span(p, "model.heads", false); /* untouched keys keep their place */
    cr_assert_str_eq(s.file, FILE_NAME);
    cr_assert_eq(s.line, 2);
    cpc_plan_free(p);

    /* a whole segment, a flow mapping, a later --set wins */
    const char *sets2[] = {"input.segments[1]={name: img, tokens: 7}", "cluster.world_size=2",
                           "cluster.world_size=3", "model={heads: 8, head_dim: 64, kv_heads: 2}"};
    p = load_ok_sets(FLUX_1024, sets2, 4, NULL);
    cr_assert_str_eq(p->input.segments[1].name, "img");
    cr_assert_eq(p->input.segments[1].tokens, 7);
    cr_assert_eq(p->cluster.world_size, 3);
    cr_assert_eq(p->model.heads, 8);
    cr_assert_eq(p->model.kv_heads, 2);
    cpc_plan_free(p);

    /* a whole plan from --set alone */
    const char *sets3[] = {"version=1", "model.heads=8", "model.head_dim=64", "input.tokens=128",
                           "cluster.world_size=2", "name=\"from set\""};
    p = load_ok_sets("", sets3, 6, NULL);
    cr_assert_eq(p->input.total_tokens, 128);
    cr_assert_str_eq(p->name, "from set");
    cpc_plan_free(p);
}

Test(plan_load, bad_set_overrides)
{
    /* wrong type, exact position within the argument */
    const char *s1[] = {"cluster.world_size=\"8\""};
    cr_assert_eq(load_fails_sets(FLUX_1024, s1, 1, 102), 1020);
    const char *s2[] = {"cluster.world_size=8", "model.headdim=5"};
    cpc_plan *p = NULL;
    cpc_status *st = load_n(FLUX_1024, s2, 2, &p);
    cr_assert_null(p);
    cr_assert_eq(st->rule, 101);
    cr_assert_str_eq(st->span.file, CPC_SET_FILE);
    cr_assert_eq(st->span.line, 2);
    cr_assert_eq(st->span.col, 7);
    cr_assert_str_eq(st->hint, "did you mean 'head_dim'?");
    cpc_status_free(st);
    /* malformed KEY: usage errors */
    const char *usage[] = {"nokey", "=5", "a..b=1", "a.=1", "a[x]=1", "a[1=1", "a]b=1", ".a=1"};
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        st = load_n(FLUX_1024, &usage[i], 1, &p);
        cr_assert_null(p);
        cr_assert_not_null(st, "%s", usage[i]);
        cr_assert_eq(st->code, CPC_E_USAGE, "%s: %s", usage[i], st->message);
        cr_assert_eq(cpc_status_exit_code(st), 2);
        cpc_status_free(st);
    }
    /* an index out of range, or into a key that does not exist: usage
     * errors (2) like a malformed KEY, naming the valid range */
    const char *s3[] = {"input.segments[5].tokens=1"};
    st = load_n(FLUX_1024, s3, 1, &p);
    cr_assert_null(p);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_USAGE, "%s", st->message);
    cr_assert_eq(cpc_status_exit_code(st), 2);
    cr_assert(strstr(st->message, "'input.segments' has 2 elements, so [5] is out of range (valid: 0..1)"), "%s",
              st->message);
    cr_assert_str_eq(st->span.file, CPC_SET_FILE);
    cr_assert_eq(st->span.col, 15);
    cpc_status_free(st);
    const char *s3b[] = {"input.segments[2].tokens=1"};
    st = load_n(FLUX_1024, s3b, 1, &p);
    cr_assert_eq(cpc_status_exit_code(st), 2, "%s", st->message);
    cpc_status_free(st);
    const char *s3c[] = {"input.segments[0].tokens=8"}; /* a plan with the tokens shorthand */
    st = load_n("version: 1\nmodel: {heads: 4, head_dim: 8}\ninput: {tokens: 16}\ncluster: {world_size: 4}\n",
                s3c, 1, &p);
    cr_assert_null(p);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_USAGE, "%s", st->message);
    cr_assert(strstr(st->message, "'input.segments' does not exist"), "%s", st->message);
    cr_assert_not_null(st->hint);
    cr_assert(strstr(st->hint, "set input.tokens instead"), "%s", st->hint);
    cpc_status_free(st);
    const char *s4[] = {"model.heads.x=1"};
    load_fails_sets(FLUX_1024, s4, 1, 102);
    const char *s5[] = {"model.heads=[1,"};
    st = load_n(FLUX_1024, s5, 1, &p);
    cr_assert_null(p);
    cr_assert_eq(st->rule, 100);
    cr_assert_str_eq(st->span.file, CPC_SET_FILE);
    cpc_status_free(st);
    const char *s6[] = {"model=a: 1"};
    load_fails_sets(FLUX_1024, s6, 1, 102);
    const char *s7[] = {"model.heads="};
    load_fails_sets(FLUX_1024, s7, 1, 102);
    const char *s8[] = {"model.heads=&a 5"};
    load_fails_sets(FLUX_1024, s8, 1, 100);
    const char *s9[] = {"cluster.world_size[0]=4"};
    load_fails_sets(FLUX_1024, s9, 1, 102);
    const char *s10[] = {"input.nothing[0]=4"};
    st = load_n(FLUX_1024, s10, 1, &p);
    cr_assert_null(p);
    cr_assert_eq(cpc_status_exit_code(st), 2, "%s", st->message);
    cpc_status_free(st);
    const char *s11[] = {"input.tokens=5"}; /* conflicts with the file's segments */
    cr_assert_eq(load_fails_sets(FLUX_1024, s11, 1, 105) / 1000, 1);
    const char *s12[] = {"model.heads={a: 1, a: 2}"};
    load_fails_sets(FLUX_1024, s12, 1, 105);

    /* --set cannot build something deeper than 64 levels */
    char deep[200] = "x=";
    for (int i = 0; i < 64; i++)
        strcat(deep, "[");
    for (int i = 0; i < 64; i++)
        strcat(deep, "]");
    const char *s13[] = {deep};
    load_fails_sets(FLUX_1024, s13, 1, 106);
}

/* ---- the shared case files ---------------------------------------------------- */

Test(plan_load, case_files)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/cases/expected.tsv", CPC_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s", path);
    char line[512];
    int n_cases = 0, n_file_stage = 0;
    while (fgets(line, sizeof line, f)) {
        char file[256], verdict[32], detail[128];
        if (sscanf(line, "%255[^\t]\t%31[^\t]\t%127[^\n]", file, verdict, detail) != 3)
            continue;
        if (strcmp(file, "file") == 0)
            continue; /* header */
        n_cases++;
        char cpath[1024];
        snprintf(cpath, sizeof cpath, "%s/tests/cases/%s", CPC_SOURCE_DIR, file);
        cpc_plan *p = NULL;
        cpc_status *st = cpc_plan_load_file(cpath, NULL, 0, &p);
        int rule = 0;
        bool file_stage = strcmp(verdict, "reject") == 0 && sscanf(detail, "CP%d", &rule) == 1 &&
                          rule >= 100;
        if (file_stage) {
            n_file_stage++;
            cr_assert_null(p, "%s must be rejected by the loader", file);
            cr_assert_not_null(find_rule(st, rule), "%s: expected CP%03d", file, rule);
            for (const cpc_status *d = st; d; d = d->next) {
                cr_assert_gt(d->span.line, 0, "%s: diagnostic without a position", file);
                cr_assert_str_eq(d->span.file, cpath);
            }
        } else {
            if (cpc_status_has_error(st))
                cpc_status_print(st, stderr, "test");
            cr_assert_not(cpc_status_has_error(st), "%s must load (its verdict is %s %s)", file,
                          verdict, detail);
            cr_assert_not_null(p);
            cr_assert_geq(p->input.n_segments, 1);
            /* the file stem is not the name when `name:` is given */
            cr_assert_not_null(p->name);
            cpc_plan_free(p);
        }
        cpc_status_free(st);
    }
    fclose(f);
    cr_assert_geq(n_cases, 32);
    cr_assert_eq(n_file_stage, 4);
}

Test(plan_load, case_file_positions)
{
    static const struct {
        const char *file;
        int rule, line, col, note_line, note_col;
    } want[] = {
        {"bad-heads-string.yaml", 102, 5, 10, 0, 0},
        {"bad-unknown-key.yaml", 101, 6, 3, 0, 0},
        {"bad-missing-world.yaml", 104, 16, 1, 0, 0},
        {"bad-conflict-flags.yaml", 105, 21, 3, 20, 3},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char cpath[1024];
        snprintf(cpath, sizeof cpath, "%s/tests/cases/%s", CPC_SOURCE_DIR, want[i].file);
        cpc_plan *p = NULL;
        cpc_status *st = cpc_plan_load_file(cpath, NULL, 0, &p);
        cr_assert_null(p);
        cr_assert_not_null(st);
        cr_assert_eq(cpc_status_count(st, CPC_SEV_ERROR), 1, "%s: one error", want[i].file);
        cr_assert_eq(st->rule, want[i].rule);
        cr_assert_eq(st->span.line, want[i].line, "%s line %d", want[i].file, st->span.line);
        cr_assert_eq(st->span.col, want[i].col, "%s col %d", want[i].file, st->span.col);
        if (want[i].note_line) {
            cr_assert_not_null(st->notes);
            cr_assert_eq(st->notes->span.line, want[i].note_line);
            cr_assert_eq(st->notes->span.col, want[i].note_col);
        }
        char *s = cpc_status_format(st, "cpc");
        char prefix[1100];
        snprintf(prefix, sizeof prefix, "%s:%d:%d: error[CP%03d]: ", cpath, want[i].line,
                 want[i].col, want[i].rule);
        cr_assert(strncmp(s, prefix, strlen(prefix)) == 0, "%s", s);
        free(s);
        cpc_status_free(st);
    }
}

/* ---- plan.c: names and spans -------------------------------------------- */

Test(plan, names_roundtrip)
{
    for (int i = 0; i < CPC_VARIANT__COUNT; i++)
        cr_assert_eq(cpc_variant_parse(cpc_variant_name((cpc_variant)i)), i);
    for (int i = 0; i < CPC_DTYPE__COUNT; i++)
        cr_assert_eq(cpc_dtype_parse(cpc_dtype_name((cpc_dtype)i)), i);
    for (int i = 0; i < CPC_MASK__COUNT; i++)
        cr_assert_eq(cpc_mask_parse(cpc_mask_name((cpc_mask)i)), i);
    for (int i = 0; i < CPC_MODE__COUNT; i++)
        cr_assert_eq(cpc_mode_parse(cpc_mode_name((cpc_mode)i)), i);
    for (int i = 0; i < CPC_FALLBACK__COUNT; i++)
        cr_assert_eq(cpc_fallback_parse(cpc_fallback_name((cpc_fallback)i)), i);
    for (int i = 0; i < CPC_ROTATE__COUNT; i++)
        cr_assert_eq(cpc_rotate_parse(cpc_rotate_name((cpc_rotate)i)), i);
    cr_assert_str_eq(cpc_variant_name(CPC_VARIANT_ULYSSES_ANYTHING), "ulysses_anything");
    cr_assert_str_eq(cpc_mask_name(CPC_MASK_KEY_PADDING), "key_padding");
    cr_assert_str_eq(cpc_variant_name((cpc_variant)99), "?");
    cr_assert_eq(cpc_variant_parse("Ring"), -1);
    cr_assert_eq(cpc_variant_parse(NULL), -1);
    cr_assert_eq(cpc_dtype_size(CPC_DTYPE_BF16), 2);
    cr_assert_eq(cpc_dtype_size(CPC_DTYPE_FP16), 2);
    cr_assert_eq(cpc_dtype_size(CPC_DTYPE_FP32), 4);
    cpc_plan_free(NULL);
    cpc_span s = cpc_plan_span(NULL, "x", false);
    cr_assert_eq(s.line, 0);
}
