/*
 * main.c - `cpc`, the plan compiler's command line (SPEC section 3).
 *
 * A thin driver: it parses options, then runs every plan file through the
 * pipeline of stages (ARCHITECTURE.md), each a function job -> status:
 *
 *   load -> validate (+ price, select) -> schedule -> verify -> codegen -> emit
 *
 * `--check` and `--explain` stop before codegen (dry run, no artifact).  A
 * stage that reports an error ends the pipeline for that file; the other
 * files still run.  Diagnostics go to stderr (text) and the summary to
 * stdout; with --format json, one JSON object per file and line goes to
 * stdout and nothing to stderr but usage errors.
 *
 * Exit status (SPEC section 3): 0 valid/compiled (warnings allowed), 1 plan
 * rejected, 2 usage or I/O error, 3 internal error; with several files, the
 * worst.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "plan.h"
#include "plan_load.h"
#include "status.h"
#include "validate.h"
#include "compile.h"
#include "program.h"

#ifndef CPC_VERSION
#define CPC_VERSION "0.0.0"
#endif

typedef enum out_format { FORMAT_TEXT = 0, FORMAT_JSON } out_format;

typedef struct options {
    const char *output;          /* -o: artifact path (one plan only) */
    bool check;                  /* --check: dry run */
    bool explain;                /* --explain: every candidate side by side */
    out_format format;
    const char **sets;           /* --set KEY=VALUE, in order */
    int n_sets;
    bool dump_schedule;          /* --dump-schedule [--rank N] */
    int rank;                    /* -1: the SPMD program */
    const char *lua;             /* --lua FILE */
    const char *emit_kernels;    /* --emit-kernels DIR */
    const char *arch;            /* --arch, default sm_90 */
    bool no_kernels;             /* --no-kernels */
    const char *sweep;           /* --sweep KEY=V1,V2,... */
    const char *plot;            /* --plot FILE.svg (with --sweep) */
    char **files;
    int n_files;
} options;

/* Everything one plan file goes through. */
typedef struct job {
    const options *opt;
    const char *file;
    char *output;                /* artifact path (compile only; owned) */
    const char *const *sets;     /* opt->sets plus a --sweep value */
    int n_sets;
    cpc_compiled c;              /* the pipeline's results and diagnostics */
} job;

/* ------------------------------------------------------------------------ */
/* The pipeline (compile.h) and what cpc does with its results.             */
/* ------------------------------------------------------------------------ */

static void run_pipeline(job *j)
{
    const options *o = j->opt;
    bool dry = o->check || o->explain;
    cpc_compile_opts co = {
        .sets = j->sets, .n_sets = j->n_sets, .lua = o->lua, .arch = o->arch,
        .kernels = !o->no_kernels && !dry,
        .until = o->sweep ? CPC_UNTIL_VALIDATE : dry ? CPC_UNTIL_VERIFY : CPC_UNTIL_CODEGEN,
    };
    if (!cpc_compile_file(j->file, &co, &j->c) || o->sweep)
        return;
    cpc_status *st = NULL;
    if (o->dump_schedule) {
        if (o->rank >= 0 && o->rank >= j->c.program->layout.P)
            st = cpc_error(CPC_E_USAGE, "--rank %d: the plan has %d ranks", o->rank,
                           j->c.program->layout.P);
        else
            st = cpc_program_print(stdout, j->c.program, o->rank);
    }
    if (!st && o->emit_kernels && !dry && j->c.n_kernels > 0)
        st = cpc_codegen_emit(o->emit_kernels, j->c.kernels, j->c.n_kernels);
    if (!st && !dry && j->output)
        st = cpc_compiled_write(&j->c, j->output);
    cpc_status_append(&j->c.diags, st);
}

/* ------------------------------------------------------------------------ */
/* Reports                                                                  */
/* ------------------------------------------------------------------------ */

static const cpc_candidate *selected(const job *j)
{
    if (cpc_status_has_error(j->c.diags))
        return NULL;
    return cpc_compiled_selected(&j->c);
}

static void codes_of(const cpc_candidate *c, char *buf, size_t n)
{
    buf[0] = 0;
    size_t used = 0;
    for (const cpc_status *e = c->errors; e; e = e->next) {
        if (e->severity != CPC_SEV_ERROR || !e->rule)
            continue;
        char rb[8];
        cpc_rule_str(e->rule, rb);
        if (strstr(buf, rb))
            continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? "," : "", rb);
        if (w < 0 || (size_t)w >= n - used)
            break;
        used += (size_t)w;
    }
}

static void fmt_ms(char *buf, size_t n, const cpc_candidate *c, bool forward)
{
    if (!c->priced)
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%.3f", forward ? c->predicted_ms_per_forward : c->predicted_ms_per_layer);
}

static void fmt_bytes(char *buf, size_t n, const cpc_candidate *c, int64_t v)
{
    if (!c->priced)
        snprintf(buf, n, "-");
    else if (v >= (int64_t)1 << 30)
        snprintf(buf, n, "%.2f GiB", (double)v / (double)((int64_t)1 << 30));
    else
        snprintf(buf, n, "%.1f MiB", (double)v / (double)(1 << 20));
}

static void print_explain_text(const job *j)
{
    const cpc_selection *s = &j->c.sel;
    printf("%s: %d candidates", j->file, s->n_candidates);
    if (s->requested < CPC_VARIANT__COUNT)
        printf(", plan asks for %s", cpc_variant_name(s->requested));
    const cpc_candidate *sel = selected(j);
    if (sel)
        printf(", selected %s %dx%d%s\n", cpc_variant_name(sel->variant), sel->ring_degree, sel->ulysses_degree,
               s->fell_back ? " (fallback: auto)" : "");
    else
        printf(", none selected\n");
    printf("  %-17s %-11s %-18s %10s %11s %12s %12s\n", "variant", "R x U", "verdict", "ms/layer", "ms/forward",
           "memory/rank", "sent/rank");
    for (int i = 0; i < s->n_candidates; i++) {
        const cpc_candidate *c = &s->candidates[i];
        char deg[32], verdict[64], ml[32], mf[32], mem[32], sent[32];
        snprintf(deg, sizeof deg, "%dx%d", c->ring_degree, c->ulysses_degree);
        if (c->ok)
            snprintf(verdict, sizeof verdict, "ok");
        else
            codes_of(c, verdict, sizeof verdict);
        fmt_ms(ml, sizeof ml, c, false);
        fmt_ms(mf, sizeof mf, c, true);
        fmt_bytes(mem, sizeof mem, c, c->memory_bytes_per_rank);
        fmt_bytes(sent, sizeof sent, c, c->bytes_sent_per_rank);
        printf("%c %-17s %-11s %-18s %10s %11s %12s %12s\n", sel == c ? '*' : ' ', cpc_variant_name(c->variant),
               deg, verdict, ml, mf, mem, sent);
    }
}

static void print_summary_text(const job *j)
{
    if (j->opt->explain && j->c.validated) {
        print_explain_text(j);
        return;
    }
    int nerr = cpc_status_count(j->c.diags, CPC_SEV_ERROR);
    int nwarn = cpc_status_count(j->c.diags, CPC_SEV_WARNING);
    const cpc_candidate *c = selected(j);
    if (c)
        printf("%s: ok: %s %dx%d (ring_degree %d, ulysses_degree %d)%s", j->file, cpc_variant_name(c->variant),
               c->ring_degree, c->ulysses_degree, c->ring_degree, c->ulysses_degree,
               j->c.sel.fell_back ? " by fallback: auto" : "");
    else
        printf("%s: %s: %d error%s", j->file, cpc_status_exit_code(j->c.diags) == 1 ? "rejected" : "failed", nerr,
               nerr == 1 ? "" : "s");
    if (nwarn)
        printf(", %d warning%s", nwarn, nwarn == 1 ? "" : "s");
    printf("\n");
}

static cJSON *json_str_or_null(const char *s)
{
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

static cJSON *json_int_or_null(int v)
{
    return v > 0 ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

static void json_add_diag(cJSON *arr, const cpc_status *d)
{
    static const char *const sev[] = {"error", "warning", "note"};
    cJSON *o = cJSON_CreateObject();
    char rb[8];
    cpc_rule_str(d->rule, rb);
    cJSON_AddStringToObject(o, "severity", sev[d->severity]);
    cJSON_AddItemToObject(o, "code", rb[0] ? cJSON_CreateString(rb) : cJSON_CreateNull());
    cJSON_AddStringToObject(o, "message", d->message);
    cJSON_AddItemToObject(o, "file", json_str_or_null(d->span.file));
    cJSON_AddItemToObject(o, "line", json_int_or_null(d->span.line));
    cJSON_AddItemToObject(o, "column", json_int_or_null(d->span.line > 0 ? (d->span.col > 0 ? d->span.col : 1) : 0));
    cJSON_AddItemToObject(o, "hint", json_str_or_null(d->hint));
    cJSON_AddItemToArray(arr, o);
}

static cJSON *json_predicted(const cpc_candidate *c)
{
    if (!c || !c->priced)
        return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "ms_per_layer", c->predicted_ms_per_layer);
    cJSON_AddNumberToObject(o, "ms_per_forward", c->predicted_ms_per_forward);
    cJSON_AddNumberToObject(o, "memory_bytes_per_rank", (double)c->memory_bytes_per_rank);
    cJSON_AddNumberToObject(o, "bytes_sent_per_rank", (double)c->bytes_sent_per_rank);
    return o;
}

static void print_json(const job *j, int exit_code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "file", j->file);
    cJSON_AddBoolToObject(root, "ok", exit_code == 0);
    cJSON *diags = cJSON_AddArrayToObject(root, "diagnostics");
    for (const cpc_status *d = j->c.diags; d; d = d->next) {
        json_add_diag(diags, d);
        for (const cpc_status *n = d->notes; n; n = n->next)
            json_add_diag(diags, n);
    }
    const cpc_candidate *c = selected(j);
    if (c) {
        cJSON *s = cJSON_AddObjectToObject(root, "selected");
        cJSON_AddStringToObject(s, "variant", cpc_variant_name(c->variant));
        cJSON_AddNumberToObject(s, "ring_degree", c->ring_degree);
        cJSON_AddNumberToObject(s, "ulysses_degree", c->ulysses_degree);
    } else {
        cJSON_AddNullToObject(root, "selected");
    }
    cJSON_AddItemToObject(root, "predicted", json_predicted(c));
    if (j->opt->explain) {
        cJSON *arr = cJSON_AddArrayToObject(root, "candidates");
        for (int i = 0; j->c.validated && i < j->c.sel.n_candidates; i++) {
            const cpc_candidate *k = &j->c.sel.candidates[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "variant", cpc_variant_name(k->variant));
            cJSON_AddNumberToObject(o, "ring_degree", k->ring_degree);
            cJSON_AddNumberToObject(o, "ulysses_degree", k->ulysses_degree);
            cJSON_AddBoolToObject(o, "ok", k->ok);
            cJSON *codes = cJSON_AddArrayToObject(o, "codes");
            for (const cpc_status *e = k->errors; e; e = e->next) {
                char rb[8];
                if (e->severity != CPC_SEV_ERROR || !e->rule)
                    continue;
                cpc_rule_str(e->rule, rb);
                bool seen = false;
                cJSON *it;
                cJSON_ArrayForEach(it, codes) seen = seen || strcmp(it->valuestring, rb) == 0;
                if (!seen)
                    cJSON_AddItemToArray(codes, cJSON_CreateString(rb));
            }
            cJSON_AddItemToObject(o, "predicted", json_predicted(k));
            cJSON_AddItemToArray(arr, o);
        }
    }
    char *text = cJSON_PrintUnformatted(root);
    if (text) {
        printf("%s\n", text);
        cJSON_free(text);
    } else {
        fprintf(stderr, "cpc: error: out of memory writing JSON\n");
    }
    cJSON_Delete(root);
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

static const char USAGE[] =
    "usage: cpc PLAN.yaml [-o OUT.cplan]       compile: validate, select, schedule, verify,\n"
    "                                          generate kernels, write the artifact\n"
    "                                          (default: PLAN's stem + .cplan in the cwd)\n"
    "       cpc --check PLAN.yaml...           dry run: everything but code generation\n"
    "       cpc --explain PLAN.yaml            every variant side by side: verdict, degrees,\n"
    "                                          predicted time, memory and bytes sent per rank\n"
    "options:\n"
    "  -o, --output FILE      artifact path (one plan only)\n"
    "  --set KEY=VALUE        override a plan key (dotted path, e.g. cluster.world_size=8);\n"
    "                         repeatable\n"
    "  --dump-schedule        print the schedule in its stable text form\n"
    "  --rank N               with --dump-schedule: rank N's program, loops unrolled\n"
    "  --lua FILE             apply a Lua schedule script\n"
    "  --emit-kernels DIR     also write the generated CUDA sources\n"
    "  --arch ARCH            NVRTC target (default sm_90)\n"
    "  --no-kernels           skip code generation\n"
    "  --format text|json     diagnostics and reports as text (default) or JSON\n"
    "  --sweep KEY=V1,V2,...  price every variant across the values of one plan key\n"
    "                         (e.g. cluster.world_size=2,4,8,16,32) and print the table\n"
    "  --plot FILE.svg        with --sweep: draw predicted time and memory per variant\n"
    "                         against the swept value (gnuplot)\n"
    "  --version, --help\n"
    "exit status: 0 ok (warnings allowed), 1 plan rejected, 2 usage or I/O error,\n"
    "             3 internal error; with several files, the worst\n";

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "cpc: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see cpc --help)\n");
    return 2;
}

enum {
    OPT_CHECK = 256, OPT_EXPLAIN, OPT_SET, OPT_DUMP, OPT_RANK, OPT_LUA, OPT_EMIT, OPT_ARCH, OPT_NOKERN,
    OPT_FORMAT, OPT_VERSION, OPT_HELP, OPT_SWEEP, OPT_PLOT
};

static const struct option LONG_OPTS[] = {
    {"output", required_argument, NULL, 'o'},
    {"check", no_argument, NULL, OPT_CHECK},
    {"explain", no_argument, NULL, OPT_EXPLAIN},
    {"set", required_argument, NULL, OPT_SET},
    {"dump-schedule", no_argument, NULL, OPT_DUMP},
    {"rank", required_argument, NULL, OPT_RANK},
    {"lua", required_argument, NULL, OPT_LUA},
    {"emit-kernels", required_argument, NULL, OPT_EMIT},
    {"arch", required_argument, NULL, OPT_ARCH},
    {"no-kernels", no_argument, NULL, OPT_NOKERN},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"sweep", required_argument, NULL, OPT_SWEEP},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"version", no_argument, NULL, OPT_VERSION},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

/* Returns -1 to go on, else the exit status. */
static int parse_options(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->rank = -1;
    o->arch = "sm_90";
    o->sets = calloc((size_t)argc, sizeof *o->sets);
    if (!o->sets) {
        fprintf(stderr, "cpc: error: out of memory\n");
        return 3;
    }
    bool rank_given = false;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":o:", LONG_OPTS, NULL)) != -1) {
        switch (c) {
        case 'o': o->output = optarg; break;
        case OPT_CHECK: o->check = true; break;
        case OPT_EXPLAIN: o->explain = true; break;
        case OPT_SET:
            if (!strchr(optarg, '=') || optarg[0] == '=')
                return usage_error("--set '%s': expected KEY=VALUE", optarg);
            o->sets[o->n_sets++] = optarg;
            break;
        case OPT_DUMP: o->dump_schedule = true; break;
        case OPT_RANK: {
            char *end;
            errno = 0;
            long r = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || r < 0 || r > INT_MAX)
                return usage_error("--rank '%s': expected an integer >= 0", optarg);
            o->rank = (int)r;
            rank_given = true;
            break;
        }
        case OPT_LUA: o->lua = optarg; break;
        case OPT_EMIT: o->emit_kernels = optarg; break;
        case OPT_ARCH:
            if (strncmp(optarg, "sm_", 3) != 0 || !optarg[3] || strspn(optarg + 3, "0123456789a") != strlen(optarg + 3))
                return usage_error("--arch '%s': expected sm_XX (e.g. sm_90)", optarg);
            o->arch = optarg;
            break;
        case OPT_NOKERN: o->no_kernels = true; break;
        case OPT_SWEEP:
            if (!strchr(optarg, '=') || optarg[0] == '=' || !strchr(optarg, '=')[1])
                return usage_error("--sweep '%s': expected KEY=V1,V2,...", optarg);
            o->sweep = optarg;
            break;
        case OPT_PLOT: o->plot = optarg; break;
        case OPT_FORMAT:
            if (strcmp(optarg, "text") == 0)
                o->format = FORMAT_TEXT;
            else if (strcmp(optarg, "json") == 0)
                o->format = FORMAT_JSON;
            else
                return usage_error("--format '%s': expected text or json", optarg);
            break;
        case OPT_VERSION: printf("cpc %s\n", CPC_VERSION); return 0;
        case OPT_HELP: fputs(USAGE, stdout); return 0;
        case ':': return usage_error("option '%s' needs a value", argv[optind - 1]);
        default: return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    o->files = argv + optind;
    o->n_files = argc - optind;
    if (o->n_files == 0)
        return usage_error("%s", "no plan file given");
    if (rank_given && !o->dump_schedule)
        return usage_error("%s", "--rank needs --dump-schedule");
    if (o->output && (o->check || o->explain))
        return usage_error("%s", "-o writes an artifact; --check and --explain write none");
    if (o->plot && !o->sweep)
        return usage_error("%s", "--plot needs --sweep");
    if (o->sweep && (o->n_files != 1 || o->output || o->dump_schedule))
        return usage_error("%s", "--sweep takes exactly one plan file and no -o/--dump-schedule");
    if (o->output && o->n_files > 1)
        return usage_error("%s", "-o needs exactly one plan file");
    return -1;
}

/* PLAN's stem + ".cplan", in the current directory. */
static char *default_output(const char *plan)
{
    const char *base = strrchr(plan, '/');
    base = base ? base + 1 : plan;
    size_t n = strlen(base);
    const char *dot = strrchr(base, '.');
    if (dot && dot != base)
        n = (size_t)(dot - base);
    char *out = malloc(n + 7);
    if (out) {
        memcpy(out, base, n);
        memcpy(out + n, ".cplan", 7);
    }
    return out;
}

/* ------------------------------------------------------------------------ */
/* --sweep / --plot                                                          */
/* ------------------------------------------------------------------------ */

/* The candidate shown for `variant` in a sweep column: the selected one when
 * it has that variant, else the best valid one (SPEC tie rule), else the
 * first (rejected) one, or NULL. */
static const cpc_candidate *sweep_pick(const job *j, cpc_variant v)
{
    const cpc_candidate *best = NULL, *first = NULL;
    for (int i = 0; j->c.validated && i < j->c.sel.n_candidates; i++) {
        const cpc_candidate *c = &j->c.sel.candidates[i];
        if (c->variant != v)
            continue;
        if (!first)
            first = c;
        if (c->ok && c->priced && (!best || c->predicted_ms_per_layer < best->predicted_ms_per_layer))
            best = c;
    }
    return best ? best : first;
}

static const cpc_variant SWEEP_VARIANTS[] = {CPC_VARIANT_ULYSSES, CPC_VARIANT_UNIFIED, CPC_VARIANT_RING,
                                             CPC_VARIANT_ULYSSES_ANYTHING, CPC_VARIANT_RING_ANYTHING};
#define N_SWEEP_VARIANTS 5

static int plot_sweep(const options *o, const char *key, char **values, int n, job *jobs)
{
    char gp[4096] = "";
    FILE *w = popen("command -v gnuplot", "r");
    if (w) {
        if (!fgets(gp, sizeof gp, w))
            gp[0] = 0;
        pclose(w);
    }
    if (!gp[0]) {
        fprintf(stderr, "cpc: warning: --plot: gnuplot is not installed (apt-get install gnuplot-nox); "
                        "the table above has the same figures\n");
        return 0;
    }
    char dat[] = "/tmp/cpc_sweep_XXXXXX";
    int fd = mkstemp(dat);
    if (fd < 0) {
        fprintf(stderr, "cpc: error: --plot: cannot create a temporary file: %s\n", strerror(errno));
        return 2;
    }
    FILE *f = fdopen(fd, "w");
    /* one block per variant: index, value label, ms/layer, GiB, ok, rejecting codes */
    for (int v = 0; v < N_SWEEP_VARIANTS; v++) {
        fprintf(f, "# %s\n", cpc_variant_name(SWEEP_VARIANTS[v]));
        for (int i = 0; i < n; i++) {
            const cpc_candidate *c = sweep_pick(&jobs[i], SWEEP_VARIANTS[v]);
            char codes[64] = "-";
            if (c && !c->ok)
                codes_of(c, codes, sizeof codes);
            bool ok = c && c->ok && c->priced;
            if (ok)
                fprintf(f, "%d \"%s\" %.6g %.6g 1 \"-\"\n", i, values[i], c->predicted_ms_per_layer,
                        (double)c->memory_bytes_per_rank / 1073741824.0);
            else
                fprintf(f, "%d \"%s\" NaN NaN 0 \"%s\"\n", i, values[i], codes[0] ? codes : "-");
        }
        fprintf(f, "\n\n");
    }
    fclose(f);
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        unlink(dat);
        fprintf(stderr, "cpc: error: --plot: cannot run gnuplot\n");
        return 2;
    }
    fprintf(g, "set terminal svg size 900,700 dynamic noenhanced font 'sans,11'\n");
    fprintf(g, "set output '%s'\n", o->plot);
    fprintf(g, "set datafile missing 'NaN'\nset key outside right top\nset grid\n");
    fprintf(g, "set multiplot layout 2,1 title \"%s: predicted per layer vs %s\"\n", jobs[0].file, key);
    fprintf(g, "set ylabel 'ms per layer'\nset offsets 0.3,0.3,0,0\n");
    const char *colors[] = {"#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e"};
    const int points[] = {7, 5, 9, 11, 13};
    for (int panel = 0; panel < 2; panel++) {
        if (panel == 1)
            fprintf(g, "set ylabel 'memory per rank (GiB)'\nset xlabel '%s'\n", key);
        fprintf(g, "plot ");
        for (int v = 0; v < N_SWEEP_VARIANTS; v++)
            fprintf(g, "'%s' index %d using 1:%d:xtic(2) with linespoints lw 2 ps 1 lc rgb '%s' pt %d dt %d title '%s', ",
                    dat, v, panel ? 4 : 3, colors[v], points[v], v + 1, cpc_variant_name(SWEEP_VARIANTS[v]));
        /* rejected points: their codes, stacked under the curves */
        for (int v = 0; v < N_SWEEP_VARIANTS; v++)
            fprintf(g, "'%s' index %d using 1:($5 == 0 ? 0 : NaN):6 with labels offset 0,%d "
                       "font ',8' tc rgb '%s' notitle%s",
                    dat, v, 1 + v, colors[v], v + 1 < N_SWEEP_VARIANTS ? ", " : "\n");
    }
    fprintf(g, "unset multiplot\n");
    int rc = pclose(g);
    unlink(dat);
    if (rc != 0) {
        fprintf(stderr, "cpc: error: --plot: gnuplot failed (status %d)\n", rc);
        return 3;
    }
    fprintf(stderr, "cpc: wrote %s\n", o->plot);
    return 0;
}

static int run_sweep(options *o)
{
    const char *eq = strchr(o->sweep, '=');
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - o->sweep), o->sweep);
    char *list = strdup(eq + 1);
    char *values[256];
    int n = 0;
    for (char *tok = strtok(list, ","); tok && n < 256; tok = strtok(NULL, ","))
        values[n++] = tok;
    if (n == 0) {
        free(list);
        return usage_error("--sweep '%s': no values", o->sweep);
    }
    job *jobs = calloc((size_t)n, sizeof *jobs);
    char **sets_store = calloc((size_t)n, sizeof *sets_store);
    const char **sets = calloc((size_t)(o->n_sets + 1) * (size_t)n, sizeof *sets);
    int worst = 0;
    for (int i = 0; i < n; i++) {
        if (asprintf(&sets_store[i], "%s=%s", key, values[i]) < 0)
            sets_store[i] = NULL;
        const char **s = sets + (size_t)i * (size_t)(o->n_sets + 1);
        for (int k = 0; k < o->n_sets; k++)
            s[k] = o->sets[k];
        s[o->n_sets] = sets_store[i];
        jobs[i].opt = o;
        jobs[i].file = o->files[0];
        jobs[i].sets = s;
        jobs[i].n_sets = o->n_sets + 1;
        run_pipeline(&jobs[i]);
        if (o->format == FORMAT_JSON) {
            print_json(&jobs[i], cpc_status_exit_code(jobs[i].c.diags));
        } else if (!jobs[i].c.validated) {
            fprintf(stderr, "%s=%s:\n", key, values[i]);
            cpc_status_print(stderr, "cpc", jobs[i].c.diags);
        }
        int code = cpc_status_exit_code(jobs[i].c.diags);
        if (code > 1 && code > worst)
            worst = code;
    }
    if (o->format == FORMAT_TEXT) {
        printf("%s: sweep of %s (ms per layer / memory per rank, or the rule that rejects)\n",
               o->files[0], key);
        int kw = (int)strlen(key) > 12 ? (int)strlen(key) : 12;
        printf("%-*s", kw, key);
        for (int v = 0; v < N_SWEEP_VARIANTS; v++)
            printf(" %-22s", cpc_variant_name(SWEEP_VARIANTS[v]));
        printf(" %s\n", "selected");
        for (int i = 0; i < n; i++) {
            printf("%-*s", kw, values[i]);
            for (int v = 0; v < N_SWEEP_VARIANTS; v++) {
                const cpc_candidate *c = sweep_pick(&jobs[i], SWEEP_VARIANTS[v]);
                char cell[64];
                if (!c)
                    snprintf(cell, sizeof cell, "-");
                else if (c->ok && c->priced)
                    snprintf(cell, sizeof cell, "%.3f/%.2fG %dx%d", c->predicted_ms_per_layer,
                             (double)c->memory_bytes_per_rank / 1073741824.0, c->ring_degree,
                             c->ulysses_degree);
                else
                    codes_of(c, cell, sizeof cell);
                printf(" %-22s", cell);
            }
            const cpc_candidate *s = selected(&jobs[i]);
            if (s)
                printf(" %s %dx%d\n", cpc_variant_name(s->variant), s->ring_degree, s->ulysses_degree);
            else
                printf(" none\n");
        }
    }
    if (o->plot && worst < 2) {
        int rc = plot_sweep(o, key, values, n, jobs);
        if (rc > worst)
            worst = rc;
    }
    for (int i = 0; i < n; i++) {
        cpc_compiled_free(&jobs[i].c);
        free(sets_store[i]);
    }
    free(jobs);
    free(sets_store);
    free(sets);
    free(list);
    return worst;
}

int main(int argc, char **argv)
{
    options opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc >= 0) {
        free(opt.sets);
        return rc;
    }
    if (opt.sweep) {
        rc = run_sweep(&opt);
        free(opt.sets);
        return rc;
    }
    int worst = 0;
    for (int i = 0; i < opt.n_files; i++) {
        job j;
        memset(&j, 0, sizeof j);
        j.opt = &opt;
        j.file = opt.files[i];
        j.sets = opt.sets;
        j.n_sets = opt.n_sets;
        if (!opt.check && !opt.explain) {
            j.output = opt.output ? strdup(opt.output) : default_output(j.file);
            if (!j.output)
                cpc_status_append(&j.c.diags, &cpc_status_oom);
        }
        if (!j.c.diags)
            run_pipeline(&j);
        int code = cpc_status_exit_code(j.c.diags);
        if (opt.format == FORMAT_JSON) {
            print_json(&j, code);
        } else {
            cpc_status_print(stderr, "cpc", j.c.diags);
            print_summary_text(&j);
        }
        fflush(stdout);
        if (code > worst)
            worst = code;
        cpc_compiled_free(&j.c);
        free(j.output);
    }
    free(opt.sets);
    return worst;
}
