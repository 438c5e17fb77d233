/*
 * test_artifact.c - the .cplan artifact (compiler/ir/artifact.h): round trips
 * for every variant (program text, resolved plan, kernels, predictions,
 * spans) and for cfg_degree x tp_degree plans (the mesh's axes), refusal
 * of another artifact_version, of a hash mismatch after any one-byte edit,
 * of truncated and garbage files.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "artifact.h"
#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "verify.h"
#include "verify_bwd.h"

/* ---- helpers ------------------------------------------------------------- */

static char tmpdir[64];

static void setup_dir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cpc_test_artifact_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(artifact, .init = setup_dir, .fini = teardown_dir);

static cpc_plan *load(const char *yaml)
{
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_string(yaml, strlen(yaml), "plans/t.yaml", NULL, 0, &plan);
    if (cpc_status_has_error(st)) {
        char *m = cpc_status_format(st, "t");
        cr_assert_fail("plan load failed: %s", m ? m : "?");
    }
    cpc_status_free(st);
    return plan;
}

/* Text of cpc_program_print(prog, rank) (malloc'd). */
static char *print_text(const cpc_program *prog, int rank)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cpc_status *st = cpc_program_print(f, prog, rank);
    fclose(f);
    cr_assert_null(st, "print failed: %s", st ? st->message : "");
    return buf;
}

static void fail_status(const char *what, cpc_status *st)
{
    char *m = cpc_status_format(st, "t");
    for (cpc_status *n = st ? st->notes : NULL; n; n = n->next)
        fprintf(stderr, "note: %s\n", n->message);
    cr_assert_fail("%s: %s", what, m ? m : "?");
}

/* Builds plan + program + artifact with kernels and predictions. */
static cpc_artifact *make(const char *yaml, cpc_variant v, int R, int U)
{
    cpc_plan *plan = load(yaml);
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build(plan, v, R, U, &prog);
    if (st)
        fail_status("schedule", st);
    cpc_artifact *a = NULL;
    st = cpc_artifact_create(plan, prog, &a);
    if (st)
        fail_status("create", st);
    cpc_program_free(prog);
    cpc_plan_free(plan);
    st = cpc_artifact_add_kernel(a, "attn_fwd_d8_fp32", "sm_90",
                                 "// attention\r\nextern \"C\" __global__ void k(float *x) {\n\tx[0] = 1.0f;   \n}\n",
                                 ".version 8.0\n.target sm_90\n\t.entry k(\n\t.param .u64 x\n)\n{\n\tret;\n}\n");
    cr_assert_null(st);
    st = cpc_artifact_add_kernel(a, "merge", "sm_90", "void merge(void) {}", NULL);
    cr_assert_null(st);
    cpc_prediction pr = {.ms_per_layer = 1.0 / 3.0,
                         .ms_per_forward = 57.0 / 3.0,
                         .compute_ms_per_layer = 0.1,
                         .comm_ms_per_layer = 1e-7,
                         .memory_bytes_per_rank = 123456789012LL,
                         .buffer_bytes_per_rank = 4096,
                         .bytes_sent_per_rank = 0,
                         .flops_per_layer = 6.02e23,
                         .fits = true};
    cr_assert_null(cpc_artifact_set_predictions(a, &pr));
    cr_assert_null(cpc_artifact_set_prediction(a, "efficiency", 0.85));
    return a;
}

static char *to_text(cpc_artifact *a, size_t *len)
{
    char *t = NULL;
    cpc_status *st = cpc_artifact_to_string(a, &t, len);
    if (st)
        fail_status("to_string", st);
    return t;
}

static void expect_input_error(cpc_status *st, const char *needle)
{
    cr_assert_not_null(st, "expected an error containing '%s'", needle);
    cr_assert_eq(st->code, CPC_E_INPUT, "code %d: %s", st->code, st->message);
    if (needle)
        cr_assert(strstr(st->message, needle), "missing '%s' in: %s", needle, st->message);
    cpc_status_free(st);
}

static char *plan_yaml(int H, int Hkv, const char *input_extra, int P, const char *rotate)
{
    char *s = malloc(1024);
    snprintf(s, 1024,
             "version: 1\n"
             "name: flux test\n"
             "model: {heads: %d, kv_heads: %d, head_dim: 8, dtype: bf16, layers: 57}\n"
             "input:\n  %s\n"
             "cluster: {world_size: %d, reserved_gb: 24}\n"
             "schedule: {rotate: %s}\n",
             H, Hkv, input_extra, P, rotate);
    return s;
}

/* Full round trip of one candidate through a file. */
static void round_trip(const char *yaml, cpc_variant v, int R, int U)
{
    cpc_artifact *a = make(yaml, v, R, U);
    char path[128];
    snprintf(path, sizeof path, "%s/x.cplan", tmpdir);
    cpc_status *st = cpc_artifact_write(a, path);
    if (st)
        fail_status("write", st);
    cr_assert_eq(strncmp(a->content_hash, "sha256:", 7), 0);
    cpc_artifact *b = NULL;
    st = cpc_artifact_read(path, &b);
    if (st)
        fail_status("read", st);
    cr_assert_str_eq(b->content_hash, a->content_hash);
    cr_assert_eq(b->artifact_version, CPC_ARTIFACT_VERSION);
    cr_assert_str_eq(b->compiler_version, CPC_VERSION);
    cr_assert_str_eq(b->plan_file, "plans/t.yaml");
    cr_assert_str_eq(b->plan_text, a->plan_text);
    cr_assert_str_eq(b->plan->name, "flux test");
    cr_assert_eq(b->plan->parallel.variant, v);
    cr_assert_eq(b->plan->parallel.ring_degree, R);
    cr_assert_eq(b->plan->parallel.ulysses_degree, U);
    cr_assert_eq(b->plan->model.scale, a->plan->model.scale);
    cr_assert_eq(b->plan->cluster.reserved_gb, 24.0);
    /* the program: identical text, SPMD and per rank */
    char *t1 = print_text(a->program, -1), *t2 = print_text(b->program, -1);
    cr_assert_str_eq(t1, t2);
    free(t1);
    free(t2);
    int last = a->program->layout.P - 1;
    t1 = print_text(a->program, last);
    t2 = print_text(b->program, last);
    cr_assert_str_eq(t1, t2);
    free(t1);
    free(t2);
    /* the read program is still proved correct */
    st = cpc_verify(b->program);
    if (st)
        fail_status("verify after read", st);
    /* kernels: normalised text, byte-identical after reading */
    cr_assert_eq(b->n_kernels, 2);
    const cpc_artifact_kernel *k = cpc_artifact_find_kernel(b, "attn_fwd_d8_fp32");
    cr_assert_not_null(k);
    cr_assert_str_eq(k->arch, "sm_90");
    cr_assert_str_eq(k->source, a->kernels[0].source);
    cr_assert_str_eq(k->ptx, a->kernels[0].ptx);
    cr_assert_str_eq(k->source, "// attention\nextern \"C\" __global__ void k(float *x) {\n        x[0] = 1.0f;\n}\n");
    cr_assert_eq(strchr(k->ptx, '\t'), NULL);
    cr_assert_str_eq(cpc_artifact_find_kernel(b, "merge")->ptx, "");
    /* predictions: bit-exact */
    cr_assert_eq(b->n_predictions, a->n_predictions);
    for (int i = 0; i < a->n_predictions; i++) {
        cr_assert_str_eq(b->predictions[i].name, a->predictions[i].name);
        cr_assert_eq(memcmp(&b->predictions[i].value, &a->predictions[i].value, sizeof(double)), 0, "%s",
                     a->predictions[i].name);
    }
    /* writing what was read gives the same bytes */
    size_t l1, l2;
    char *x1 = to_text(a, &l1), *x2 = to_text(b, &l2);
    cr_assert_eq(l1, l2);
    cr_assert_eq(memcmp(x1, x2, l1), 0);
    /* literal blocks for the plan and the kernels */
    cr_assert(strstr(x1, "\nplan: |"), "%s", x1);
    cr_assert(strstr(x1, "source: |"), "%s", x1);
    cr_assert(strstr(x1, "ptx: |"), "%s", x1);
    free(x1);
    free(x2);
    cpc_artifact_free(a);
    cpc_artifact_free(b);
}

/* ---- round trips ----------------------------------------------------------------- */

Test(artifact, round_trip_every_variant)
{
    struct {
        cpc_variant v;
        int R, U;
    } c[] = {
        {CPC_VARIANT_ULYSSES, 1, 4},          {CPC_VARIANT_UNIFIED, 2, 2},
        {CPC_VARIANT_RING, 4, 1},             {CPC_VARIANT_ULYSSES_ANYTHING, 1, 4},
        {CPC_VARIANT_RING_ANYTHING, 4, 1},
    };
    const char *rot[] = {"p2p", "allgather"};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        for (int r = 0; r < 2; r++) {
            char *y = plan_yaml(8, 8, "tokens: 64", 4, rot[r]);
            round_trip(y, c[i].v, c[i].R, c[i].U);
            free(y);
        }
    char *y = plan_yaml(8, 8, "tokens: 64", 1, "p2p");
    round_trip(y, CPC_VARIANT_NONE, 1, 1);
    free(y);
}

Test(artifact, round_trip_shapes)
{
    /* uneven segments (FLUX 1008: text + image shorthand), GQA, causal, cross,
     * key padding, training mode */
    const char *inputs[] = {
        "segments: [{name: text, tokens: 512}, {name: image, image: {height: 1008, width: 1008}}]",
        "tokens: 96\n  mask: causal",
        "tokens: 96\n  kv: {tokens: 40}",
        "tokens: 96\n  mask: key_padding\n  mode: training\n  batch: 2",
    };
    cpc_variant vs[] = {CPC_VARIANT_ULYSSES_ANYTHING, CPC_VARIANT_RING, CPC_VARIANT_UNIFIED, CPC_VARIANT_UNIFIED};
    int Rs[] = {1, 4, 2, 2}, Us[] = {4, 1, 2, 2};
    for (int i = 0; i < 4; i++) {
        char *y = plan_yaml(24, 6, inputs[i], 4, "p2p");
        round_trip(y, vs[i], Rs[i], Us[i]);
        free(y);
    }
}

Test(artifact, resolved_plan_has_every_default)
{
    cpc_plan *plan = load("version: 1\nmodel: {heads: 4, head_dim: 64}\ninput: {tokens: 32}\ncluster: {world_size: 2}\n");
    char *t = NULL;
    size_t len = 0;
    cr_assert_null(cpc_plan_resolved_yaml(plan, CPC_VARIANT_RING, 2, 1, &t, &len));
    cr_assert_eq(strlen(t), len);
    const char *want[] = {"name: t\n", "kv_heads: 4", "dtype: bf16", "layers: 1", "scale: 0.125", "batch: 1",
                          "{name: tokens, tokens: 32}", "mask: none", "mode: inference", "gpus_per_node: 2",
                          "device: h100-sxm", "reserved_gb: 0.0", "variant: ring", "ring_degree: 2",
                          "ulysses_degree: 1", "ulysses_anything: false", "fallback: strict", "overlap: true",
                          "rotate: p2p"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(t, want[i]), "missing '%s' in:\n%s", want[i], t);
    /* and it loads back to the same values */
    cpc_plan *p2 = load(t);
    cr_assert_eq(p2->model.scale, plan->model.scale);
    cr_assert_eq(p2->parallel.variant, CPC_VARIANT_RING);
    cr_assert_eq(p2->cluster.gpus_per_node, 2);
    free(t);
    cpc_plan_free(p2);
    cpc_plan_free(plan);
}

Test(artifact, spans_and_odd_text_round_trip)
{
    char *y = plan_yaml(4, 4, "tokens: 32", 2, "p2p");
    cpc_artifact *a = make(y, CPC_VARIANT_RING, 2, 1);
    free(y);
    static const char script[] = "weird: name, with [flow] chars.lua";
    a->program->ops[1].span = (cpc_span){script, 12, 3};
    a->program->ops[1].body[0].span = (cpc_span){"tweak.lua", 7, 0};
    /* a kernel with a control character: written double-quoted, read back exactly */
    cr_assert_null(cpc_artifact_add_kernel(a, "odd", "sm_80", "a\x01" "b\n  lead\n", "é ünïcode\n"));
    size_t len;
    char *t = to_text(a, &len);
    cpc_artifact *b = NULL;
    cpc_status *st = cpc_artifact_read_string(t, len, "mem.cplan", &b);
    if (st)
        fail_status("read", st);
    cr_assert_str_eq(b->program->ops[1].span.file, script);
    cr_assert_eq(b->program->ops[1].span.line, 12);
    cr_assert_eq(b->program->ops[1].span.col, 3);
    cr_assert_str_eq(b->program->ops[1].body[0].span.file, "tweak.lua");
    cr_assert_eq(b->program->ops[1].body[0].span.line, 7);
    cr_assert_eq(b->program->ops[0].span.line, 0);
    const cpc_artifact_kernel *k = cpc_artifact_find_kernel(b, "odd");
    cr_assert_str_eq(k->source, "a\x01" "b\n  lead\n");
    cr_assert_str_eq(k->ptx, "é ünïcode\n");
    cr_assert_str_eq(k->arch, "sm_80");
    /* replacing a kernel keeps one entry */
    cr_assert_null(cpc_artifact_add_kernel(b, "odd", "sm_90", "x", "y"));
    cr_assert_eq(b->n_kernels, 3);
    cr_assert_str_eq(cpc_artifact_find_kernel(b, "odd")->arch, "sm_90");
    double v;
    cr_assert(cpc_artifact_get_prediction(b, "fits", &v));
    cr_assert_eq(v, 1.0);
    cr_assert_not(cpc_artifact_get_prediction(b, "nope", &v));
    free(t);
    cpc_artifact_free(a);
    cpc_artifact_free(b);
}

static cpc_status *edit_and_read(const char *t, size_t len, const char *from, const char *to);

/* ptxas' per-function report round-trips; an artifact without it still reads. */
Test(artifact, kernel_ptxas_report_round_trip)
{
    char *y = plan_yaml(4, 4, "tokens: 32", 2, "p2p");
    cpc_artifact *a = make(y, CPC_VARIANT_RING, 2, 1);
    free(y);
    cr_assert_null(cpc_artifact_add_kernel(a, "attention", "sm_90", "// src\n", "// ptx\n"));
    cpc_kernel_fn_report fns[2] = {{"cpc_flash_attn_mma", 168, 0, 0, 0}, {"cpc_attn_rowwarp", 32, 16, 8, 4}};
    cr_assert_null(cpc_artifact_set_kernel_report(a, "attention", fns, 2));
    cpc_status *nope = cpc_artifact_set_kernel_report(a, "nope", fns, 2);
    cr_assert_not_null(nope);
    cpc_status_free(nope);
    size_t len;
    char *t = to_text(a, &len);
    cpc_artifact *b = NULL;
    cpc_status *st = cpc_artifact_read_string(t, len, "k.cplan", &b);
    if (st)
        fail_status("read", st);
    const cpc_artifact_kernel *k = cpc_artifact_find_kernel(b, "attention");
    cr_assert_not_null(k);
    cr_assert_eq(k->n_fns, 2);
    cr_expect_str_eq(k->fns[0].name, "cpc_flash_attn_mma");
    cr_expect_eq(k->fns[0].registers, 168);
    cr_expect_str_eq(k->fns[1].name, "cpc_attn_rowwarp");
    cr_expect(k->fns[1].registers == 32 && k->fns[1].stack_bytes == 16 &&
              k->fns[1].spill_store_bytes == 8 && k->fns[1].spill_load_bytes == 4);
    /* a negative register count is refused (edited, re-hashed) */
    cpc_status *bad = edit_and_read(t, len, "registers: 168", "registers: -1");
    cr_expect_not_null(bad, "a negative register count must be refused");
    cpc_status_free(bad);
    free(t);
    cpc_artifact_free(a);
    cpc_artifact_free(b);
}

/* The text at 1-based line:col of t, or NULL. */
static const char *at_line_col(const char *t, int line, int col)
{
    const char *p = t;
    for (int l = 1; l < line && p; l++) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return p ? p + col - 1 : NULL;
}

/* Diagnostics about the plan of an artifact (cprun's CP018, ...) point into
 * the artifact file, where the embedded plan's text is. */
Test(artifact, plan_spans_point_into_the_artifact)
{
    char *y = plan_yaml(8, 2, "tokens: 64", 4, "p2p");
    cpc_artifact *a = make(y, CPC_VARIANT_UNIFIED, 2, 2);
    free(y);
    size_t len;
    char *t = to_text(a, &len);
    cpc_artifact *b = NULL;
    cpc_status *st = cpc_artifact_read_string(t, len, "run/flux.cplan", &b);
    if (st)
        fail_status("read", st);
    static const struct { const char *key, *text; } keys[] = {
        {"model.heads", "8"}, {"model.kv_heads", "2"}, {"cluster.world_size", "4"},
        {"parallel.variant", "unified"}, {"input.mask", "none"}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        cpc_span sp = cpc_plan_span(b->plan, keys[i].key, true);
        cr_assert_str_eq(sp.file, "run/flux.cplan", "%s", keys[i].key);
        const char *p = at_line_col(t, sp.line, sp.col);
        cr_assert_not_null(p, "%s at %d:%d", keys[i].key, sp.line, sp.col);
        cr_expect(strncmp(p, keys[i].text, strlen(keys[i].text)) == 0,
                  "%s: %d:%d shows '%.20s', expected '%s'", keys[i].key, sp.line, sp.col, p,
                  keys[i].text);
        const char *leaf = strrchr(keys[i].key, '.') + 1;
        sp = cpc_plan_span(b->plan, keys[i].key, false);
        p = at_line_col(t, sp.line, sp.col);
        cr_expect(p && strncmp(p, leaf, strlen(leaf)) == 0, "%s: key span shows '%.20s'",
                  keys[i].key, p ? p : "");
    }
    free(t);
    cpc_artifact_free(a);
    cpc_artifact_free(b);
}

/* ---- refusals ------------------------------------------------------------------- */

static char *sample_text(size_t *len)
{
    char *y = plan_yaml(8, 2, "tokens: 64", 4, "p2p");
    cpc_artifact *a = make(y, CPC_VARIANT_UNIFIED, 2, 2);
    free(y);
    char *t = to_text(a, len);
    cpc_artifact_free(a);
    return t;
}

Test(artifact, refuses_other_version)
{
    size_t len;
    char *t = sample_text(&len);
    char *at = strstr(t, "artifact_version: 2\n");
    cr_assert_eq(at, t);
    at[18] = '3';
    cpc_artifact *b = (cpc_artifact *)0x1;
    cpc_status *st = cpc_artifact_read_string(t, len, "v3.cplan", &b);
    cr_assert_null(b);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "v3.cplan"), "%s", st->message);
    cr_assert_eq(st->span.line, 1);
    expect_input_error(st, "artifact version 3 is not supported");
    /* version 1 (before backward_schedule) is refused: recompile */
    at[18] = '1';
    expect_input_error(cpc_artifact_read_string(t, len, "v1.cplan", &b), "recompile the plan");
    /* not an integer */
    memcpy(at, "artifact_version: x\n", 20);
    expect_input_error(cpc_artifact_read_string(t, len, "vx.cplan", &b), "artifact_version must be an integer");
    free(t);
}

Test(artifact, refuses_hash_mismatch_after_one_byte_edit)
{
    size_t len;
    char *t = sample_text(&len);
    cpc_artifact *b = NULL;
    cpc_status *st = cpc_artifact_read_string(t, len, "ok.cplan", &b);
    cr_assert_null(st, "%s", st ? st->message : "");
    cpc_artifact_free(b);
    /* a digit of a prediction */
    char *p = strstr(t, "ms_per_layer: 0.33");
    cr_assert_not_null(p);
    p[strlen("ms_per_layer: 0.3")] = '4';
    expect_input_error(cpc_artifact_read_string(t, len, "edit.cplan", &b), "content hash mismatch");
    p[strlen("ms_per_layer: 0.3")] = '3';
    /* the world size inside the embedded plan */
    p = strstr(t, "heads: 8");
    cr_assert_not_null(p);
    p[7] = '4';
    expect_input_error(cpc_artifact_read_string(t, len, "edit.cplan", &b), "content hash mismatch");
    p[7] = '8';
    /* a digit of the hash itself */
    p = strstr(t, "content_hash: sha256:") + strlen("content_hash: sha256:");
    char old = p[10];
    p[10] = old == 'a' ? 'b' : 'a';
    expect_input_error(cpc_artifact_read_string(t, len, "edit.cplan", &b), "content hash mismatch");
    p[10] = old;
    /* every single-byte change (sampled) is refused, never accepted, never a crash */
    int refused = 0;
    for (size_t i = 0; i < len; i += 7) {
        char c = t[i];
        t[i] = (char)(c == 'x' ? 'y' : 'x');
        st = cpc_artifact_read_string(t, len, "flip.cplan", &b);
        cr_assert_not_null(st, "edit at byte %zu accepted", i);
        cr_assert_null(b);
        cr_assert_eq(st->code, CPC_E_INPUT, "byte %zu: %s", i, st->message);
        cpc_status_free(st);
        refused++;
        t[i] = c;
    }
    cr_assert_gt(refused, 100);
    /* through a file: a hand edit shows the message naming the file */
    char path[128];
    snprintf(path, sizeof path, "%s/edited.cplan", tmpdir);
    p = strstr(t, "overlap: true");
    cr_assert_not_null(p);
    memcpy(p, "overlap: fals", 13);
    p[13] = 'e';
    /* (same length: "true\n" -> "fals" + 'e' overwrites the newline) */
    FILE *f = fopen(path, "wb");
    fwrite(t, 1, len, f);
    fclose(f);
    st = cpc_artifact_read(path, &b);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, path), "%s", st->message);
    cr_assert_eq(st->code, CPC_E_INPUT);
    cpc_status_free(st);
    free(t);
}

Test(artifact, refuses_truncated_files)
{
    size_t len;
    char *t = sample_text(&len);
    cpc_artifact *b = NULL;
    for (size_t cut = 0; cut < len; cut += (cut < 200 ? 1 : 13)) {
        cpc_status *st = cpc_artifact_read_string(t, cut, "cut.cplan", &b);
        cr_assert_not_null(st, "truncated at %zu accepted", cut);
        cr_assert_null(b);
        cr_assert_eq(st->code, CPC_E_INPUT, "cut %zu: %s", cut, st->message);
        cpc_status_free(st);
    }
    /* a truncated file on disk */
    char path[128];
    snprintf(path, sizeof path, "%s/cut.cplan", tmpdir);
    FILE *f = fopen(path, "wb");
    fwrite(t, 1, len / 2, f);
    fclose(f);
    expect_input_error(cpc_artifact_read(path, &b), NULL);
    free(t);
}

Test(artifact, refuses_garbage)
{
    const char *bad[] = {
        "",
        "\n",
        "hello",
        "[1, 2, 3]",
        "{unclosed: [",
        "artifact_version: 1\n",
        "artifact_version: 1\ncontent_hash: sha256:abc\n",
        "- a\n- b\n",
        "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
        "artifact_version: 1\n---\nartifact_version: 1\n",
        "a: &x 1\nb: *x\n",
        "\t\t\tx: y",
        "\xff\xfe\xfd garbage",
    };
    cpc_artifact *b = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t len = i == 8 ? 16 : strlen(bad[i]);
        cpc_status *st = cpc_artifact_read_string(bad[i], len, "junk.cplan", &b);
        cr_assert_not_null(st, "garbage %zu accepted", i);
        cr_assert_null(b);
        cr_assert_eq(st->code, CPC_E_INPUT, "garbage %zu: %s", i, st->message);
        cpc_status_free(st);
    }
    /* random bytes */
    unsigned s = 12345;
    char buf[4096];
    for (int round = 0; round < 200; round++) {
        size_t n = (size_t)(round * 20 + 1);
        for (size_t i = 0; i < n; i++) {
            s = s * 1103515245u + 12345u;
            buf[i] = (char)(s >> 16);
        }
        cpc_status *st = cpc_artifact_read_string(buf, n, "rand.cplan", &b);
        cr_assert_not_null(st);
        cr_assert_null(b);
        cpc_status_free(st);
    }
    /* deep nesting is refused quickly (libyaml slows down with depth) */
    size_t dn = 200000;
    char *deep = malloc(2 * dn + 64);
    size_t k = (size_t)sprintf(deep, "artifact_version: 1\nx: ");
    memset(deep + k, '[', dn);
    memset(deep + k + dn, ']', dn);
    expect_input_error(cpc_artifact_read_string(deep, k + 2 * dn, "deep.cplan", &b), "nested deeper than 64");
    free(deep);
    /* a valid artifact with an extra key, recomputed hash: strict keys */
    size_t len;
    char *t = sample_text(&len);
    char *extra = malloc(len + 32);
    memcpy(extra, t, len);
    memcpy(extra + len, "bogus: 1\n", 10);
    expect_input_error(cpc_artifact_read_string(extra, len + 9, "extra.cplan", &b), "content hash mismatch");
    free(extra);
    free(t);
}

/* Recomputes the content hash of an edited text (as a careful hand editor
 * or a newer cpc would), so that the checks after the hash can be tested. */
static void rehash(char *t, size_t len)
{
    char *h = strstr(t, "content_hash: sha256:");
    cr_assert_not_null(h);
    h += strlen("content_hash: sha256:");
    memset(h, '0', 64);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    cr_assert_eq(EVP_Digest(t, len, md, &n, EVP_sha256(), NULL), 1);
    for (unsigned i = 0; i < 32; i++) {
        char two[3];
        snprintf(two, sizeof two, "%02x", md[i]);
        memcpy(h + 2 * i, two, 2);
    }
}

/* Replaces the first `from` by `to` in a malloc'd text, rehashes, reads. */
static cpc_status *edit_and_read(const char *t, size_t len, const char *from, const char *to)
{
    const char *at = strstr(t, from);
    cr_assert_not_null(at, "'%s' not in the artifact", from);
    size_t nl = len - strlen(from) + strlen(to);
    char *x = malloc(nl + 1);
    size_t pre = (size_t)(at - t);
    memcpy(x, t, pre);
    memcpy(x + pre, to, strlen(to));
    memcpy(x + pre + strlen(to), at + strlen(from), len - pre - strlen(from));
    x[nl] = '\0';
    rehash(x, nl);
    cpc_artifact *b = NULL;
    cpc_status *st = cpc_artifact_read_string(x, nl, "edited.cplan", &b);
    if (!st)
        cpc_artifact_free(b);
    free(x);
    return st;
}

Test(artifact, strict_structure_after_the_hash)
{
    size_t len;
    char *t = sample_text(&len);
    /* the rehash helper itself: an unchanged text still reads */
    cr_assert_null(edit_and_read(t, len, "rotate: p2p", "rotate: p2p"));
    /* a version bump is reported as such even with a valid hash */
    expect_input_error(edit_and_read(t, len, "artifact_version: 2", "artifact_version: 3"), "version 3");
    expect_input_error(edit_and_read(t, len, "predictions:", "bogus: 1\npredictions:"), "unknown key 'bogus'");
    expect_input_error(edit_and_read(t, len, "kind: attn", "kind: attention"), "unknown name 'attention'");
    expect_input_error(edit_and_read(t, len, "in: [q_seq, k_cur, v_cur]", "in: [q_seq, k_cur, w]"),
                       "unknown buffer 'w'");
    expect_input_error(edit_and_read(t, len, "peer: (r+1)%R", "peer: (r+1)%%R"), "peer");
    expect_input_error(edit_and_read(t, len, "tag: 0", "tag: -1"), "tag");
    expect_input_error(edit_and_read(t, len, "  world_size: 4\n  rank_rule", "  world_size: 8\n  rank_rule"),
                       "contradicts the plan");
    expect_input_error(edit_and_read(t, len, "heads: 8", "heads: 0"), "resolved plan does not load");
    expect_input_error(edit_and_read(t, len, "kind: copy", "kind: copy, body: []"), "only a loop has a body");
    expect_input_error(edit_and_read(t, len, "count: R", "count: R\n    tag: x"), "tag must be an integer");
    expect_input_error(edit_and_read(t, len, "ms_per_layer: ", "ms_per_layer: abc"), "must be a number");
    free(t);
}

Test(artifact, io_errors)
{
    cpc_artifact *b = NULL;
    char path[160];
    snprintf(path, sizeof path, "%s/does-not-exist.cplan", tmpdir);
    cpc_status *st = cpc_artifact_read(path, &b);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_IO);
    cpc_status_free(st);
    char *y = plan_yaml(4, 4, "tokens: 32", 2, "p2p");
    cpc_artifact *a = make(y, CPC_VARIANT_RING, 2, 1);
    free(y);
    snprintf(path, sizeof path, "%s/no/such/dir/x.cplan", tmpdir);
    st = cpc_artifact_write(a, path);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_IO);
    cpc_status_free(st);
    /* writing to a stream gives the same bytes as to_string */
    char *mem = NULL;
    size_t mlen = 0;
    FILE *f = open_memstream(&mem, &mlen);
    cr_assert_null(cpc_artifact_write_file(f, a));
    fclose(f);
    size_t len;
    char *t = to_text(a, &len);
    cr_assert_eq(mlen, len);
    cr_assert_eq(memcmp(mem, t, len), 0);
    free(mem);
    free(t);
    cpc_artifact_free(a);
}

/* ---- the outer axes (plan.h cpc_plan_sub, SPEC section 1 "All four axes") ---------- */

/* A cfg_degree x tp_degree plan: the resolved plan keeps C and T, the mesh
 * records them with the whole world, the program is the (c, t) sub-plan's
 * R x U program; reading lays it out on the sub-plan again and it proves. */
Test(artifact, round_trip_cfg_tp_axes)
{
    const char *yaml = "version: 1\nname: axes\n"
                       "model: {heads: 8, kv_heads: 2, head_dim: 8, dtype: bf16}\n"
                       "input: {batch: 4, tokens: 64, mask: causal}\n"
                       "cluster: {world_size: 32}\n"
                       "parallel: {variant: unified, ring_degree: 2, ulysses_degree: 2, cfg_degree: 2, "
                       "tp_degree: 4}\n";
    cpc_plan *plan = load(yaml);
    cpc_plan sub;
    cr_assert(cpc_plan_sub(plan, 2, 4, &sub));
    cr_assert_eq(sub.cluster.world_size, 4);
    cr_assert_eq(sub.input.batch, 2);
    cr_assert_eq(sub.model.heads, 2);
    cr_assert_eq(sub.model.kv_heads, 1); /* Hkv 2 < T 4: one replicated K/V head per rank */
    cr_assert(!cpc_plan_sub(plan, 3, 1, &sub));
    cr_assert(cpc_plan_sub(plan, 2, 4, &sub));
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build(&sub, CPC_VARIANT_UNIFIED, 2, 2, &prog);
    if (st)
        fail_status("schedule", st);
    cpc_artifact *a = NULL;
    if ((st = cpc_artifact_create(plan, prog, &a)))
        fail_status("create", st);
    cpc_program_free(prog);
    cpc_plan_free(plan);
    size_t len;
    char *t = to_text(a, &len);
    cr_assert(strstr(t, "    cfg_degree: 2\n    tp_degree: 4\n"), "%s", t);
    cr_assert(strstr(t, "  ulysses_degree: 2\n  cfg_degree: 2\n  tp_degree: 4\n  world_size: 32\n"
                        "  rank_rule: p = ((c * ring_degree + r) * ulysses_degree + u) * tp_degree + t\n"),
              "%s", t);
    cpc_artifact *b = NULL;
    if ((st = cpc_artifact_read_string(t, len, "axes.cplan", &b)))
        fail_status("read", st);
    cr_assert_eq(b->plan->parallel.cfg_degree, 2);
    cr_assert_eq(b->plan->parallel.tp_degree, 4);
    cr_assert_eq(b->plan->cluster.world_size, 32);
    cr_assert_eq(b->program->layout.P, 4);
    cr_assert_eq(b->program->layout.B, 2);
    cr_assert_eq(b->program->layout.H, 2);
    cr_assert_eq(b->program->layout.Hkv, 1);
    char *t1 = print_text(a->program, -1), *t2 = print_text(b->program, -1);
    cr_assert_str_eq(t1, t2);
    free(t1);
    free(t2);
    if ((st = cpc_verify(b->program)))
        fail_status("verify after read", st);
    size_t l2;
    char *x2 = to_text(b, &l2);
    cr_assert_eq(len, l2);
    cr_assert_eq(memcmp(t, x2, len), 0);
    free(x2);
    /* a mesh that contradicts the plan's axes, or the rule of the other mesh */
    expect_input_error(edit_and_read(t, len, "  cfg_degree: 2\n  tp_degree: 4\n  world_size",
                                     "  cfg_degree: 4\n  tp_degree: 2\n  world_size"),
                       "contradicts the plan");
    expect_input_error(edit_and_read(t, len, "  cfg_degree: 2\n  tp_degree: 4\n  world_size: 32",
                                     "  world_size: 32"),
                       "is not the one this build uses ('p = r * ulysses_degree + u')");
    expect_input_error(edit_and_read(t, len, "rank_rule: p = ((c", "rank_rule: p = ((x"), "rank_rule");
    /* axes that do not cut the plan (batch 4 over cfg_degree 8) */
    expect_input_error(edit_and_read(t, len, "    cfg_degree: 2\n    tp_degree: 4\n", "    cfg_degree: 8\n    tp_degree: 1\n"),
                       "contradicts the plan");
    free(t);
    cpc_artifact_free(a);
    cpc_artifact_free(b);
}

/* ---- training: the backward program (backward_schedule, format version 2) ---- */

/* A training ring plan's artifact with its backward program (as cpc makes it). */
static cpc_artifact *make_training(int P, const char *mask)
{
    char y[512];
    snprintf(y, sizeof y,
             "version: 1\nname: train\nmodel: {heads: 4, kv_heads: 2, head_dim: 8, dtype: bf16}\n"
             "input: {batch: 2, tokens: 64, mask: %s, mode: training}\ncluster: {world_size: %d}\n",
             mask, P);
    cpc_plan *plan = load(y);
    cpc_variant v = P == 1 ? CPC_VARIANT_NONE : CPC_VARIANT_RING;
    cpc_program *prog = NULL, *bwd = NULL;
    cpc_status *st = cpc_schedule_build(plan, v, P, 1, &prog);
    if (!st)
        st = cpc_schedule_build_backward(plan, v, P, 1, &bwd);
    if (st)
        fail_status("schedule", st);
    cpc_artifact *a = NULL;
    if ((st = cpc_artifact_create(plan, prog, &a)) || (st = cpc_artifact_set_backward(a, bwd)))
        fail_status("create", st);
    cpc_program_free(prog);
    cpc_program_free(bwd);
    cpc_plan_free(plan);
    return a;
}

Test(artifact, backward_program_round_trip)
{
    const int Ps[] = {1, 2, 4};
    const char *masks[] = {"none", "causal", "key_padding"};
    for (int i = 0; i < 3; i++) {
        cpc_artifact *a = make_training(Ps[i], masks[i]);
        size_t len;
        char *t = to_text(a, &len);
        cr_assert(strstr(t, "\nbackward_schedule:\n"), "no backward_schedule in:\n%s", t);
        cr_assert(strstr(t, "kind: attn_bwd"));
        cpc_artifact *b = NULL;
        cpc_status *st = cpc_artifact_read_string(t, len, "train.cplan", &b);
        if (st)
            fail_status("read", st);
        cr_assert_not_null(b->backward);
        /* the same program, rank by rank, and proven again */
        for (int p = -1; p < Ps[i]; p++) {
            char *x = print_text(a->backward, p), *y = print_text(b->backward, p);
            cr_assert_str_eq(x, y, "rank %d", p);
            free(x);
            free(y);
        }
        st = cpc_verify_backward(b->backward);
        cr_assert_null(st, "backward proof after reading: %s", st ? st->message : "");
        /* and it writes back byte-identically */
        size_t len2;
        char *t2 = to_text(b, &len2);
        cr_assert_eq(len, len2);
        cr_assert(memcmp(t, t2, len) == 0);
        free(t2);
        cpc_artifact_free(b);
        free(t);
        cpc_artifact_free(a);
    }
}

Test(artifact, backward_program_refusals)
{
    cpc_artifact *a = make_training(2, "causal");
    size_t len;
    char *t = to_text(a, &len);
    /* an inference plan with a backward_schedule */
    expect_input_error(edit_and_read(t, len, "mode: training", "mode: inference"), "not mode: training");
    /* backward ops name the backward program's buffers */
    expect_input_error(edit_and_read(t, len, "out: [dq, dk_blk, dv_blk]}", "out: [dq, dk_blk, dv_bogus]}"),
                       "unknown buffer 'dv_bogus'");
    /* a backward that reads the K/V arriving for the next step (diffusers
     * #14265 in reverse) reads back, and its proof fails (CP051) */
    {
        const char *from = "in: [q, k_cur, v_cur, dout, lse, delta]", *to = "in: [q, k_nxt, v_nxt, dout, lse, delta]";
        char *x = malloc(len + 1);
        memcpy(x, t, len + 1);
        char *at = strstr(x, from);
        cr_assert_not_null(at);
        memcpy(at, to, strlen(to));
        rehash(x, len);
        cpc_artifact *b = NULL;
        cpc_status *st = cpc_artifact_read_string(x, len, "bad.cplan", &b);
        cr_assert_null(st, "%s", st ? st->message : "");
        st = cpc_verify_backward(b->backward);
        cr_assert(cpc_status_has_error(st), "a backward reading the wrong K/V was proven");
        cr_assert_eq(st->rule, 51, "rule %d: %s", st->rule, st->message);
        cpc_status_free(st);
        cpc_artifact_free(b);
        free(x);
    }
    /* set_backward: not a training plan, or another layout */
    char *iy = plan_yaml(8, 2, "tokens: 64", 4, "p2p");
    cpc_artifact *inf = make(iy, CPC_VARIANT_RING, 4, 1);
    free(iy);
    cpc_status *st = cpc_artifact_set_backward(inf, a->backward);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_INTERNAL);
    cpc_status_free(st);
    cr_assert_null(inf->backward);
    cpc_artifact *four = make_training(4, "causal");
    st = cpc_artifact_set_backward(four, a->backward);
    cr_assert_not_null(st);
    cr_assert(strstr(st->message, "layout"), "%s", st->message);
    cpc_status_free(st);
    /* a training artifact without backward_schedule still reads (cprun refuses to train it) */
    cpc_program_free(four->backward);
    four->backward = NULL;
    char *t4 = to_text(four, &len);
    cr_assert_null(strstr(t4, "backward_schedule"));
    cpc_artifact *b = NULL;
    cr_assert_null(cpc_artifact_read_string(t4, len, "t4.cplan", &b));
    cr_assert_null(b->backward);
    cpc_artifact_free(b);
    free(t4);
    cpc_artifact_free(four);
    cpc_artifact_free(inf);
    free(t);
    cpc_artifact_free(a);
}
