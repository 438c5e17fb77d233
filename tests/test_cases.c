/*
 * test_cases.c - plan files end to end through the real loader
 * (plan_load.h) and the validator (validate.h):
 *   - every case in tests/cases/ gets the verdict of tests/cases/expected.tsv
 *     (accept with variant RxU, or reject with the code), and every case
 *     file has a verdict;
 *   - every plan in plans/ is accepted with the variant its comments name,
 *     and its token arithmetic gives the model's figures
 *     (reference/context-parallelism.md section 4);
 *   - the seed matrix: FLUX.1-dev 1024^2 and 1008^2 x the five variants x 4
 *     GPUs matches the seed's tables (1024: all five run; 1008: only the
 *     anything variants).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"
#include "plan_load.h"
#include "validate.h"

#ifndef CPC_SOURCE_DIR
#define CPC_SOURCE_DIR "."
#endif

#define CASES_DIR CPC_SOURCE_DIR "/tests/cases"
#define PLANS_DIR CPC_SOURCE_DIR "/plans"

typedef struct verdict {
    bool accept;
    cpc_variant variant;
    int R, U;
    int code; /* reject: the rule */
} verdict;

/* Loads and validates; returns the whole chain (loader + validator). */
static cpc_status *load_and_validate(const char *path, const char *const *sets, int n_sets,
                                     cpc_selection *sel, cpc_plan **plan_out)
{
    memset(sel, 0, sizeof *sel);
    sel->selected = -1;
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_file(path, sets, n_sets, &plan);
    if (!cpc_status_has_error(st)) {
        cr_assert_not_null(plan, "%s: no plan and no error", path);
        cpc_status_append(&st, cpc_validate(plan, sel));
    } else {
        cr_expect_null(plan, "%s: a plan together with errors", path);
    }
    if (plan_out)
        *plan_out = plan;
    else
        cpc_plan_free(plan);
    return st;
}

static bool has_error_rule(const cpc_status *st, int rule)
{
    for (; st; st = st->next)
        if (st->severity == CPC_SEV_ERROR && st->rule == rule)
            return true;
    return false;
}

static char *describe(const cpc_status *st)
{
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f)
        return NULL;
    cpc_status_print(st, f, "cpc");
    fclose(f);
    return out;
}

static void check_verdict(const char *path, const char *const *sets, int n_sets, const verdict *v)
{
    cpc_selection sel;
    cpc_status *st = load_and_validate(path, sets, n_sets, &sel, NULL);
    char *text = describe(st);
    if (v->accept) {
        cr_expect(!cpc_status_has_error(st), "%s: expected accept, got:\n%s", path, text ? text : "");
        cr_expect_geq(sel.selected, 0, "%s: nothing selected", path);
        if (sel.selected >= 0) {
            const cpc_candidate *c = &sel.candidates[sel.selected];
            cr_expect(c->variant == v->variant && c->ring_degree == v->R && c->ulysses_degree == v->U,
                      "%s: selected %s %dx%d, expected %s %dx%d", path, cpc_variant_name(c->variant),
                      c->ring_degree, c->ulysses_degree, cpc_variant_name(v->variant), v->R, v->U);
            cr_expect(c->ok);
        }
    } else {
        cr_expect(cpc_status_has_error(st), "%s: expected reject CP%03d, got accept", path, v->code);
        cr_expect(has_error_rule(st, v->code), "%s: expected CP%03d among the errors, got:\n%s", path, v->code,
                  text ? text : "");
        cr_expect_eq(sel.selected, -1);
        cr_expect_eq(cpc_status_exit_code(st), 1, "%s: a rejection is exit status 1", path);
    }
    free(text);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

/* "accept\tulysses 1x4" or "reject\tCP011" */
static bool parse_verdict(const char *kind, const char *detail, verdict *v)
{
    memset(v, 0, sizeof *v);
    if (strcmp(kind, "accept") == 0) {
        char name[64];
        if (sscanf(detail, "%63s %dx%d", name, &v->R, &v->U) != 3)
            return false;
        int pv = cpc_variant_parse(name);
        if (pv < 0)
            return false;
        v->accept = true;
        v->variant = (cpc_variant)pv;
        return true;
    }
    if (strcmp(kind, "reject") == 0)
        return sscanf(detail, "CP%d", &v->code) == 1;
    return false;
}

static int count_yaml(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        n += l > 5 && strcmp(e->d_name + l - 5, ".yaml") == 0;
    }
    closedir(d);
    return n;
}

Test(cases, expected_tsv)
{
    FILE *f = fopen(CASES_DIR "/expected.tsv", "r");
    cr_assert_not_null(f, "cannot open " CASES_DIR "/expected.tsv");
    char line[512];
    int n = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = 0;
        if (lineno == 1 || !line[0])
            continue; /* header */
        char *file = strtok(line, "\t"), *kind = strtok(NULL, "\t"), *detail = strtok(NULL, "\t");
        cr_assert(file && kind && detail, "expected.tsv:%d: three columns expected", lineno);
        verdict v;
        cr_assert(parse_verdict(kind, detail, &v), "expected.tsv:%d: bad verdict '%s %s'", lineno, kind, detail);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", CASES_DIR, file);

        /* the case's own "# expect:" line agrees with the table */
        FILE *cf = fopen(path, "r");
        cr_assert_not_null(cf, "cannot open %s", path);
        char first[256] = "";
        if (!fgets(first, sizeof first, cf))
            first[0] = 0;
        fclose(cf);
        first[strcspn(first, "\r\n")] = 0;
        char want[256];
        snprintf(want, sizeof want, "# expect: %s %s", kind, detail);
        if (strncmp(first, "# expect:", 9) == 0)
            cr_expect_str_eq(first, want, "%s: its expect line disagrees with expected.tsv", file);

        check_verdict(path, NULL, 0, &v);
        n++;
    }
    fclose(f);
    cr_expect_eq(n, count_yaml(CASES_DIR), "every case in tests/cases has a verdict in expected.tsv (%d rows)", n);
    cr_expect_geq(n, 32);
}

/* ------------------------------------------------------------------------ */
/* plans/                                                                   */
/* ------------------------------------------------------------------------ */

static const struct plan_row {
    const char *file;
    cpc_variant variant;
    int R, U;
    int64_t tokens; /* S, from the model's figures (context-parallelism.md section 4) */
    int heads, head_dim, layers;
} PLANS[] = {
    {"flux1-dev-1024.yaml", CPC_VARIANT_ULYSSES, 1, 4, 512 + 4096, 24, 128, 57},
    {"flux1-dev-1008.yaml", CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, 512 + 3969, 24, 128, 57},
    {"wan2.1-14b-480p.yaml", CPC_VARIANT_ULYSSES, 1, 8, 32760, 40, 128, 40},
    {"wan2.1-14b-720p.yaml", CPC_VARIANT_ULYSSES, 1, 8, 75600, 40, 128, 40},
    {"hunyuanvideo-720p.yaml", CPC_VARIANT_ULYSSES, 1, 8, 118800 + 256, 24, 128, 60},
    {"cogvideox-5b.yaml", CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, 226 + 17550, 48, 64, 42},
    /* issue 24: the text held whole by every rank (split: replicate), xDiT's layout */
    {"cogvideox-5b-replicate-6gpu.yaml", CPC_VARIANT_UNIFIED, 2, 3, 226 + 17550, 48, 64, 42},
    {"sd3.5-large.yaml", CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, 4096 + 333, 38, 64, 38},
    {"qwenimage-1024.yaml", CPC_VARIANT_ULYSSES, 1, 4, 512 + 4096, 24, 128, 60},
    {"ltx-video.yaml", CPC_VARIANT_ULYSSES, 1, 4, 7392, 32, 64, 28},
    /* batch 2 over 8 GPUs, every axis auto; unpriced here (the tie order:
     * ulysses over all 8 ranks), the priced choice is test_cost's
     * axes_plans_pick_the_fastest */
    {"flux1-dev-8gpu-axes.yaml", CPC_VARIANT_ULYSSES, 1, 8, 512 + 4096, 24, 128, 57},
    {"wan2.1-14b-720p-8gpu-axes.yaml", CPC_VARIANT_ULYSSES, 1, 8, 75600, 40, 128, 40},
};

Test(plans, every_plan_is_accepted)
{
    int n = (int)(sizeof PLANS / sizeof PLANS[0]);
    for (int i = 0; i < n; i++) {
        const struct plan_row *r = &PLANS[i];
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", PLANS_DIR, r->file);
        cpc_selection sel;
        cpc_plan *plan = NULL;
        cpc_status *st = load_and_validate(path, NULL, 0, &sel, &plan);
        char *text = describe(st);
        cr_expect_eq(cpc_status_count(st, CPC_SEV_ERROR), 0, "%s:\n%s", r->file, text ? text : "");
        cr_expect_eq(cpc_status_count(st, CPC_SEV_WARNING), 0, "%s: warnings:\n%s", r->file, text ? text : "");
        free(text);
        if (plan) {
            cr_expect_eq(plan->input.total_tokens, r->tokens, "%s: %lld tokens, expected %lld", r->file,
                         (long long)plan->input.total_tokens, (long long)r->tokens);
            cr_expect_eq(plan->model.heads, r->heads, "%s", r->file);
            cr_expect_eq(plan->model.head_dim, r->head_dim, "%s", r->file);
            cr_expect_eq(plan->model.layers, r->layers, "%s", r->file);
            cr_expect(plan->parallel.variant_given, "%s: name the variant a user would choose", r->file);
        }
        cr_assert_geq(sel.selected, 0, "%s", r->file);
        const cpc_candidate *c = &sel.candidates[sel.selected];
        cr_expect(c->variant == r->variant && c->ring_degree == r->R && c->ulysses_degree == r->U,
                  "%s: %s %dx%d", r->file, cpc_variant_name(c->variant), c->ring_degree, c->ulysses_degree);
        cpc_status_free(st);
        cpc_selection_free(&sel);
        cpc_plan_free(plan);
    }
    cr_expect_eq(count_yaml(PLANS_DIR), n, "every plan in plans/ is listed here");
}

/* The SPEC section 3 example, reproduced from the shipped plan. */
Test(plans, spec_example_diagnostic)
{
    const char *sets[] = {"parallel.variant=ulysses"};
    cr_assert_eq(chdir(CPC_SOURCE_DIR), 0, "cannot enter " CPC_SOURCE_DIR); /* the path as a user types it */
    cpc_selection sel;
    cpc_status *st = load_and_validate("plans/flux1-dev-1008.yaml", sets, 1, &sel, NULL);
    cr_assert_not_null(st);
    char *line = cpc_status_format(st, "cpc");
    cr_expect_str_eq(line, "plans/flux1-dev-1008.yaml:9:7: error[CP011]: ulysses: segment 'image' has 3969 tokens, "
                           "not divisible by ulysses_degree 4 (3969 = 4*992 + 1); hint: variant ulysses_anything "
                           "or ring_anything runs this plan");
    free(line);
    cpc_status_free(st);
    cpc_selection_free(&sel);
}

/* ------------------------------------------------------------------------ */
/* The seed matrix                                                          */
/* ------------------------------------------------------------------------ */

static const char SEED_PLAN[] =
    "version: 1\n"
    "name: flux1-dev-seed\n"
    "model: {heads: 24, head_dim: 128, dtype: bf16, layers: 57}\n"
    "input:\n"
    "  segments:\n"
    "    - {name: text, tokens: 512}\n"
    "    - {name: image, image: {height: %d, width: %d, vae_scale: 8, patch: 2}}\n"
    "cluster: {world_size: 4, device: l20}\n"
    "parallel: {variant: %s}\n";

Test(seed, flux_matrix_4_gpus)
{
    static const struct {
        cpc_variant v;
        int R, U;
        int code1008; /* 0: runs at 1008^2 */
    } rows[] = {
        {CPC_VARIANT_ULYSSES, 1, 4, 11},
        {CPC_VARIANT_RING, 4, 1, 10},
        {CPC_VARIANT_UNIFIED, 2, 2, 10},
        {CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, 0},
        {CPC_VARIANT_RING_ANYTHING, 4, 1, 0},
    };
    int sizes[] = {1024, 1008};
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 5; i++) {
            char text[1024];
            int n = snprintf(text, sizeof text, SEED_PLAN, sizes[s], sizes[s], cpc_variant_name(rows[i].v));
            cpc_plan *plan = NULL;
            cpc_status *st = cpc_plan_load_string(text, (size_t)n, "seed.yaml", NULL, 0, &plan);
            cr_assert(!cpc_status_has_error(st), "seed plan does not load");
            cr_assert_not_null(plan);
            cr_expect_eq(plan->input.segments[1].tokens, sizes[s] == 1024 ? 4096 : 3969);
            cpc_selection sel;
            cpc_status_append(&st, cpc_validate(plan, &sel));
            bool runs = sizes[s] == 1024 || rows[i].code1008 == 0;
            if (runs) {
                cr_expect(!cpc_status_has_error(st), "%d^2 %s must run", sizes[s], cpc_variant_name(rows[i].v));
                cr_assert_geq(sel.selected, 0);
                const cpc_candidate *c = &sel.candidates[sel.selected];
                cr_expect(c->variant == rows[i].v && c->ring_degree == rows[i].R && c->ulysses_degree == rows[i].U);
            } else {
                cr_expect(has_error_rule(st, rows[i].code1008), "%d^2 %s: expected CP%03d", sizes[s],
                          cpc_variant_name(rows[i].v), rows[i].code1008);
                cr_expect_eq(sel.selected, -1);
            }
            cpc_status_free(st);
            cpc_selection_free(&sel);
            cpc_plan_free(plan);
        }
    }
}

/* The same matrix through --set on one file (the loader's override path). */
Test(seed, flux_1008_with_set)
{
    const char *variants[] = {"ulysses", "ring", "unified", "ulysses_anything", "ring_anything"};
    const bool runs[] = {false, false, false, true, true};
    for (int i = 0; i < 5; i++) {
        char set[64];
        snprintf(set, sizeof set, "parallel.variant=%s", variants[i]);
        const char *sets[] = {set};
        verdict v = {.accept = runs[i], .variant = (cpc_variant)cpc_variant_parse(variants[i]),
                     .R = i == 1 || i == 4 ? 4 : 1, .U = i == 1 || i == 4 ? 1 : 4, .code = i == 0 ? 11 : 10};
        check_verdict(PLANS_DIR "/flux1-dev-1008.yaml", sets, 1, &v);
    }
}
