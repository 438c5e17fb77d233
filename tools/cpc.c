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
 * worst.  I/O errors include a write that fails (the artifact, --plot,
 * standard output), an output that is one of the inputs (plan, Lua script,
 * device profile: same device and inode) and an artifact given as a plan.
 * --sweep: see its --help line.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include <cpc/cpc.h>
#include <cpc/tool.h>

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
    cpc_compilation *c;          /* the pipeline's results and diagnostics (NULL: not run) */
    cpc_status *err;             /* cpc's own error about this file, after c's diagnostics */
    cpc_candidate_info *cands;   /* c's candidates (owned) */
    int n_cands;
    bool written;                /* the artifact was written to `output` */
} job;

/* Records cpc's own error about the job (one at most: each ends the job). */
static void job_fail(job *j, cpc_status *st)
{
    if (!st)
        return;
    if (j->err)
        cpc_status_free(st);
    else
        j->err = st;
}

/* The job's exit status: the worst over the pipeline's diagnostics and cpc's error. */
static int job_exit_code(const job *j)
{
    int a = cpc_status_exit_code(cpc_compilation_diagnostics(j->c));
    int b = cpc_status_exit_code(j->err);
    return a > b ? a : b;
}

static int job_count(const job *j, cpc_severity sev)
{
    int n = cpc_compilation_count(j->c, sev);
    for (const cpc_status *e = j->err; e; e = cpc_status_next(e))
        n += cpc_status_severity(e) == sev;
    return n;
}

/* Prints every diagnostic of the job, as one chain. */
static void job_print_diags(const job *j)
{
    cpc_status_print(cpc_compilation_diagnostics(j->c), stderr, "cpc");
    cpc_status_print(j->err, stderr, "cpc");
}

static void job_free(job *j)
{
    cpc_compilation_free(j->c);
    cpc_status_free(j->err);
    free(j->cands);
    j->c = NULL;
    j->err = NULL;
    j->cands = NULL;
    j->n_cands = 0;
}

/* A message status of class `code` (cpc's own errors). */
static cpc_status *tool_error(cpc_code code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cpc_status *tool_error(cpc_code code, const char *fmt, ...)
{
    char buf[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return cpc_status_new(code, buf);
}

/* ------------------------------------------------------------------------ */
/* The pipeline (compile.h) and what cpc does with its results.             */
/* ------------------------------------------------------------------------ */

/* True when paths a and b name the same existing file (device and inode). */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* An artifact starts with its version key (artifact.h), whatever its name. */
static bool looks_like_artifact(const char *path)
{
    /* only a regular file: reading a pipe (cpc --check <(...)) would eat
     * the plan's first bytes */
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return false;
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    char buf[32] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n >= 17 && strncmp(buf, "artifact_version:", 17) == 0;
}

/* Refuses an output path (`what`: "the artifact", "the plot") that is one
 * of the job's inputs: the plan, the Lua script, the device profile. */
static cpc_status *check_not_input(const job *j, const char *out, const char *what)
{
    struct {
        const char *path, *name;
    } in[] = {{j->file, "the plan file"},
              {j->opt->lua, "the Lua script"},
              {cpc_compilation_script_path(j->c), "the Lua script"},
              {cpc_compilation_profile_path(j->c), "the device profile"}};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        if (same_file(out, in[i].path))
            return tool_error(CPC_E_IO, "%s: refusing to overwrite %s %s with %s", out, in[i].name,
                             in[i].path, what);
    return NULL;
}

/* Copies the compilation's candidates into j->cands. */
static cpc_status *load_candidates(job *j)
{
    int n = cpc_compilation_n_candidates(j->c);
    if (n <= 0)
        return NULL;
    j->cands = calloc((size_t)n, sizeof *j->cands);
    if (!j->cands)
        return cpc_status_new(CPC_E_NOMEM, "out of memory");
    j->n_cands = n;
    for (int i = 0; i < n; i++) {
        cpc_status *st = cpc_compilation_candidate(j->c, i, &j->cands[i], sizeof j->cands[i]);
        if (st)
            return st;
    }
    return NULL;
}

static void run_pipeline(job *j)
{
    const options *o = j->opt;
    bool dry = o->check || o->explain;
    if (looks_like_artifact(j->file)) {
        job_fail(j, tool_error(CPC_E_USAGE, "%s is a cpc artifact, not a plan: run it with cprun", j->file));
        return;
    }
    if (!dry && !o->sweep && j->output) {
        cpc_status *st = check_not_input(j, j->output, "the artifact");
        if (st) {
            job_fail(j, st);
            return;
        }
    }
    /* --dump-schedule alone is an inspection: no kernels, no artifact */
    bool dump_only = o->dump_schedule && !o->emit_kernels && !j->output;
    cpc_compile_options co;
    cpc_compile_options_init(&co, sizeof co);
    co.sets = j->sets;
    co.n_sets = j->n_sets;
    co.lua = o->lua;
    co.arch = o->arch;
    co.kernels = !o->no_kernels && !dry && !dump_only;
    cpc_compile_stage until = o->sweep ? CPC_STAGE_VALIDATE
                              : dry || dump_only ? CPC_STAGE_VERIFY
                                                 : CPC_STAGE_CODEGEN;
    cpc_status *st = cpc_compilation_new(j->file, &co, until, &j->c);
    if (!st)
        st = load_candidates(j);
    if (st) {
        job_fail(j, st);
        return;
    }
    if (!cpc_compilation_ok(j->c) || o->sweep)
        return;
    if (o->dump_schedule)
        st = cpc_compilation_print_schedule(j->c, stdout, o->rank);
    if (!st && o->emit_kernels && !dry && cpc_compilation_n_kernels(j->c) > 0)
        st = cpc_compilation_emit_kernels(j->c, o->emit_kernels);
    if (!st && !dry && j->output)
        st = check_not_input(j, j->output, "the artifact"); /* the script and profile, now known */
    if (!st && !dry && j->output) {
        st = cpc_compilation_write(j->c, j->output);
        j->written = !st;
    }
    job_fail(j, st);
}

static void flush_stdout(void);

/* ------------------------------------------------------------------------ */
/* Reports                                                                  */
/* ------------------------------------------------------------------------ */

static const cpc_candidate_info *selected(const job *j)
{
    if (job_count(j, CPC_SEV_ERROR) > 0)
        return NULL;
    int i = cpc_compilation_selected(j->c);
    return i >= 0 && i < j->n_cands ? &j->cands[i] : NULL;
}

/* "CP011" for rule 11, "" for none. */
static const char *rule_str(int rule, char buf[8])
{
    buf[0] = 0;
    if (rule > 0 && rule <= 999)
        snprintf(buf, 8, "CP%03d", rule);
    return buf;
}

static void codes_of(const cpc_candidate_info *c, char *buf, size_t n)
{
    buf[0] = 0;
    size_t used = 0;
    for (const cpc_status *e = c->errors; e; e = cpc_status_next(e)) {
        if (cpc_status_severity(e) != CPC_SEV_ERROR || !cpc_status_rule(e))
            continue;
        char rb[8];
        rule_str(cpc_status_rule(e), rb);
        if (strstr(buf, rb))
            continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? "," : "", rb);
        if (w < 0 || (size_t)w >= n - used)
            break;
        used += (size_t)w;
    }
}

static void fmt_ms(char *buf, size_t n, const cpc_candidate_info *c, bool forward)
{
    if (!c->priced)
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%.3f", forward ? c->ms_per_forward : c->ms_per_layer);
}

static void fmt_bytes(char *buf, size_t n, const cpc_candidate_info *c, int64_t v)
{
    if (!c->priced)
        snprintf(buf, n, "-");
    else if (v >= (int64_t)1 << 30)
        snprintf(buf, n, "%.2f GiB", (double)v / (double)((int64_t)1 << 30));
    else
        snprintf(buf, n, "%.1f MiB", (double)v / (double)(1 << 20));
}

/* The rule codes already explained below a table (print_explain_text,
 * run_sweep). */
typedef struct code_legend {
    int shown[64];
    int n;
} code_legend;

/* Prints, for each rule code of rejected candidate c not yet in `l`, one line
 * "  CPnnn: MESSAGE" (" (KEY=VALUE)" after the code when key is given); the
 * first line of a legend is preceded by an empty line. */
static void explain_codes(code_legend *l, const cpc_candidate_info *c, const char *key, const char *value)
{
    if (!c || c->ok)
        return;
    for (const cpc_status *e = c->errors; e; e = cpc_status_next(e)) {
        int rule = cpc_status_rule(e);
        if (cpc_status_severity(e) != CPC_SEV_ERROR || !rule)
            continue;
        bool seen = false;
        for (int k = 0; k < l->n && !seen; k++)
            seen = l->shown[k] == rule;
        if (seen || l->n == (int)(sizeof l->shown / sizeof l->shown[0]))
            continue;
        l->shown[l->n++] = rule;
        char rb[8];
        rule_str(rule, rb);
        if (key)
            printf("%s  %s (%s=%s): %s\n", l->n == 1 ? "\n" : "", rb, key, value, cpc_status_message(e));
        else
            printf("%s  %s: %s\n", l->n == 1 ? "\n" : "", rb, cpc_status_message(e));
    }
}

/* As explain_codes, for the errors of sweep point j itself (plan-level
 * diagnostics, not a candidate's), shown in the table by point_code. */
static void explain_point(code_legend *l, const job *j, const char *key, const char *value)
{
    const cpc_status *chains[] = {cpc_compilation_diagnostics(j->c), j->err};
    cpc_candidate_info pseudo = {0};
    for (int ch = 0; ch < 2; ch++) {
        pseudo.errors = chains[ch];
        explain_codes(l, &pseudo, key, value);
    }
}

static void print_explain_text(const job *j)
{
    printf("%s: %d candidate%s", j->file, j->n_cands, j->n_cands == 1 ? "" : "s");
    const char *requested = cpc_compilation_requested_variant(j->c);
    if (requested)
        printf(", plan asks for %s", requested);
    const cpc_candidate_info *sel = selected(j);
    /* the outer axes (SPEC section 1, "All four axes"): a C x T column when
     * any candidate splits batch or heads */
    bool axes = false;
    for (int i = 0; i < j->n_cands; i++)
        axes = axes || j->cands[i].cfg_degree > 1 || j->cands[i].tp_degree > 1;
    if (sel && axes)
        printf(", selected %s %dx%d with cfg_degree %d, tp_degree %d%s\n", sel->variant, sel->ring_degree,
               sel->ulysses_degree, sel->cfg_degree, sel->tp_degree,
               cpc_compilation_fell_back(j->c) ? " (fallback: auto)" : "");
    else if (sel)
        printf(", selected %s %dx%d%s\n", sel->variant, sel->ring_degree, sel->ulysses_degree,
               cpc_compilation_fell_back(j->c) ? " (fallback: auto)" : "");
    else
        printf(", none selected\n");
    bool step = cpc_compilation_parameters(j->c) > 0;
    bool image = step && cpc_compilation_steps(j->c) > 0;
    bool measured = false; /* a `measured` column when the profile has any (cprun --tune) */
    bool bwd = false; /* training plans (SPEC section 10): backward columns */
    for (int i = 0; i < j->n_cands; i++) {
        measured = measured || j->cands[i].measured;
        bwd = bwd || j->cands[i].backward_priced;
    }
    if (axes)
        printf("  %-7s", "C x T");
    printf("  %-17s %-11s %-18s %10s", "variant", "R x U", "verdict", "ms/layer");
    if (measured)
        printf(" %10s", "measured");
    printf(" %11s %12s %12s", "ms/forward", "memory/rank", "sent/rank");
    if (bwd)
        printf(" %13s %14s", "bwd ms/layer", "bwd sent/rank");
    if (step)
        printf(" %10s %8s %8s %8s %8s %8s", "ms/step", "gemm", "attn", "membound", "comm", "host");
    if (image)
        printf(" %11s", "ms/image");
    printf("\n");
    for (int i = 0; i < j->n_cands; i++) {
        const cpc_candidate_info *c = &j->cands[i];
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
        if (axes) {
            char ct[32];
            snprintf(ct, sizeof ct, "%dx%d", c->cfg_degree, c->tp_degree);
            printf("%c %-7s  %-17s %-11s %-18s %10s", sel == c ? '*' : ' ', ct, c->variant, deg, verdict, ml);
        } else {
            printf("%c %-17s %-11s %-18s %10s", sel == c ? '*' : ' ', c->variant, deg, verdict, ml);
        }
        if (measured) {
            char mm[32];
            snprintf(mm, sizeof mm, c->measured ? "%.3f" : "-", c->measured_ms_per_layer);
            printf(" %10s", mm);
        }
        printf(" %11s %12s %12s", mf, mem, sent);
        if (bwd) {
            char bm[32] = "-", bs[32] = "-";
            if (c->backward_priced) {
                snprintf(bm, sizeof bm, "%.3f", c->ms_backward_per_layer);
                fmt_bytes(bs, sizeof bs, c, c->backward_bytes_sent_per_rank);
            }
            printf(" %13s %14s", bm, bs);
        }
        if (step) {
            char ms[32], part[5][32];
            snprintf(ms, sizeof ms, c->priced ? "%.2f" : "-", c->ms_per_step);
            const double v[5] = {c->gemm_ms_per_step, c->attn_ms_per_step, c->memory_ms_per_step,
                                 c->comm_ms_per_step, c->host_ms_per_step};
            for (int k = 0; k < 5; k++)
                snprintf(part[k], sizeof part[k], c->priced ? "%.1f" : "-", v[k]);
            printf(" %10s %8s %8s %8s %8s %8s", ms, part[0], part[1], part[2], part[3], part[4]);
        }
        if (image) {
            char mi[32];
            snprintf(mi, sizeof mi, c->priced ? "%.1f" : "-", c->ms_per_image);
            printf(" %11s", mi);
        }
        printf("\n");
    }
    /* what each rule code in the verdict column means here: the first rejected
     * candidate's message per code (a new user met "CP010" with no word of why) */
    code_legend legend = {0};
    for (int i = 0; i < j->n_cands; i++)
        explain_codes(&legend, &j->cands[i], NULL, NULL);
}

static void print_summary_text(const job *j)
{
    if (j->opt->explain && cpc_compilation_validated(j->c)) {
        print_explain_text(j);
        return;
    }
    int nerr = job_count(j, CPC_SEV_ERROR);
    int nwarn = job_count(j, CPC_SEV_WARNING);
    const cpc_candidate_info *c = selected(j);
    if (c && (c->cfg_degree > 1 || c->tp_degree > 1))
        printf("%s: ok: %s %dx%d (ring_degree %d, ulysses_degree %d, cfg_degree %d, tp_degree %d)%s", j->file,
               c->variant, c->ring_degree, c->ulysses_degree, c->ring_degree, c->ulysses_degree, c->cfg_degree,
               c->tp_degree, cpc_compilation_fell_back(j->c) ? " by fallback: auto" : "");
    else if (c)
        printf("%s: ok: %s %dx%d (ring_degree %d, ulysses_degree %d)%s", j->file, c->variant,
               c->ring_degree, c->ulysses_degree, c->ring_degree, c->ulysses_degree,
               cpc_compilation_fell_back(j->c) ? " by fallback: auto" : "");
    else
        printf("%s: %s: %d error%s", j->file, job_exit_code(j) == 1 ? "rejected" : "failed", nerr,
               nerr == 1 ? "" : "s");
    if (nwarn)
        printf(", %d warning%s", nwarn, nwarn == 1 ? "" : "s");
    printf("\n");
    if (j->written)
        printf("  wrote %s\n", j->output);
    if (c && c->priced) {
        char mem[32], sent[32];
        fmt_bytes(mem, sizeof mem, c, c->memory_bytes_per_rank);
        fmt_bytes(sent, sizeof sent, c, c->bytes_sent_per_rank);
        int layers = cpc_compilation_layers(j->c);
        printf("  predicted on %s: %.3f ms per layer, %.3f ms per forward (%d layer%s), "
               "%s per rank, %s sent per rank per layer\n",
               cpc_compilation_device_name(j->c)[0] ? cpc_compilation_device_name(j->c) : "the plan's device",
               c->ms_per_layer, c->ms_per_forward, layers, layers == 1 ? "" : "s", mem, sent);
        if (c->backward_priced) {
            char bs[32], bm[32];
            fmt_bytes(bs, sizeof bs, c, c->backward_bytes_sent_per_rank);
            fmt_bytes(bm, sizeof bm, c, c->backward_memory_bytes_per_rank);
            printf("  backward (training): %.3f ms per layer, %s per rank, %s sent per rank per layer\n",
                   c->ms_backward_per_layer, bm, bs);
        }
        if (c->ms_per_step > 0) {
            printf("  whole step: %.2f ms per forward step (gemm %.1f, attention %.1f, memory-bound "
                   "%.1f, comm %.1f, host %.1f)", c->ms_per_step, c->gemm_ms_per_step,
                   c->attn_ms_per_step, c->memory_ms_per_step, c->comm_ms_per_step, c->host_ms_per_step);
            if (c->ms_per_image > 0)
                printf(", %.1f ms per image (%d steps + text encoder %.1f + VAE decode %.1f)",
                       c->ms_per_image, cpc_compilation_steps(j->c), c->text_encoder_ms, c->vae_decode_ms);
            printf("\n");
        }
    }
    /* The generated kernels and ptxas' report (recorded in the artifact). */
    cpc_kernel_summary ks;
    if (c && cpc_compilation_kernel_summary(j->c, &ks, sizeof ks)) {
        printf("  kernels for %s: %d module%s", ks.arch, ks.modules, ks.modules == 1 ? "" : "s");
        if (ks.functions)
            printf(", %d functions, %s; attention: %s, %d registers", ks.functions,
                   ks.spilling_functions ? "SPILLS (see the warnings)" : "no spills",
                   ks.attention ? ks.attention : "?", ks.attention_registers);
        printf("\n");
    }
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
    rule_str(cpc_status_rule(d), rb);
    const char *file;
    int line, col;
    cpc_status_position(d, &file, &line, &col);
    cJSON_AddStringToObject(o, "severity", sev[cpc_status_severity(d)]);
    cJSON_AddItemToObject(o, "code", rb[0] ? cJSON_CreateString(rb) : cJSON_CreateNull());
    cJSON_AddStringToObject(o, "message", cpc_status_message(d));
    cJSON_AddItemToObject(o, "file", json_str_or_null(file));
    cJSON_AddItemToObject(o, "line", json_int_or_null(line));
    cJSON_AddItemToObject(o, "column", json_int_or_null(line > 0 ? (col > 0 ? col : 1) : 0));
    cJSON_AddItemToObject(o, "hint", json_str_or_null(cpc_status_hint(d)));
    cJSON_AddItemToArray(arr, o);
}

static cJSON *json_predicted(const cpc_candidate_info *c)
{
    if (!c || !c->priced)
        return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "ms_per_layer", c->ms_per_layer);
    cJSON_AddNumberToObject(o, "ms_per_forward", c->ms_per_forward);
    cJSON_AddNumberToObject(o, "memory_bytes_per_rank", (double)c->memory_bytes_per_rank);
    cJSON_AddNumberToObject(o, "bytes_sent_per_rank", (double)c->bytes_sent_per_rank);
    if (c->ms_per_step > 0)
        cJSON_AddNumberToObject(o, "ms_per_step", c->ms_per_step);
    if (c->ms_per_image > 0)
        cJSON_AddNumberToObject(o, "ms_per_image", c->ms_per_image);
    if (c->ms_per_step > 0) { /* SPEC section 3: the step's parts, ms per step */
        cJSON *b = cJSON_AddObjectToObject(o, "step_breakdown");
        cJSON_AddNumberToObject(b, "gemm_ms", c->gemm_ms_per_step);
        cJSON_AddNumberToObject(b, "attention_ms", c->attn_ms_per_step);
        cJSON_AddNumberToObject(b, "memory_bound_ms", c->memory_ms_per_step);
        cJSON_AddNumberToObject(b, "comm_ms", c->comm_ms_per_step);
        cJSON_AddNumberToObject(b, "host_ms", c->host_ms_per_step);
        if (c->ms_per_image > 0) {
            cJSON_AddNumberToObject(o, "text_encoder_ms", c->text_encoder_ms);
            cJSON_AddNumberToObject(o, "vae_decode_ms", c->vae_decode_ms);
        }
        cJSON_AddNumberToObject(o, "weights_bytes_per_rank", (double)c->weights_bytes_per_rank);
        cJSON_AddNumberToObject(o, "activation_bytes_per_rank", (double)c->activation_bytes_per_rank);
        cJSON_AddNumberToObject(o, "vae_bytes_per_rank", (double)c->vae_bytes_per_rank);
    }
    if (c->backward_priced) { /* mode: training (SPEC section 3) */
        cJSON_AddNumberToObject(o, "ms_backward_per_layer", c->ms_backward_per_layer);
        cJSON_AddNumberToObject(o, "backward_bytes_sent_per_rank", (double)c->backward_bytes_sent_per_rank);
        cJSON_AddNumberToObject(o, "backward_memory_bytes_per_rank", (double)c->backward_memory_bytes_per_rank);
    }
    return o;
}

static void print_json(const job *j, int exit_code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "file", j->file);
    cJSON_AddBoolToObject(root, "ok", exit_code == 0);
    cJSON *diags = cJSON_AddArrayToObject(root, "diagnostics");
    const cpc_status *chains[] = {cpc_compilation_diagnostics(j->c), j->err};
    for (int ch = 0; ch < 2; ch++)
        for (const cpc_status *d = chains[ch]; d; d = cpc_status_next(d)) {
            json_add_diag(diags, d);
            for (const cpc_status *n = cpc_status_notes(d); n; n = cpc_status_next(n))
                json_add_diag(diags, n);
        }
    const cpc_candidate_info *c = selected(j);
    if (c) {
        cJSON *s = cJSON_AddObjectToObject(root, "selected");
        cJSON_AddStringToObject(s, "variant", c->variant);
        cJSON_AddNumberToObject(s, "ring_degree", c->ring_degree);
        cJSON_AddNumberToObject(s, "ulysses_degree", c->ulysses_degree);
        cJSON_AddNumberToObject(s, "cfg_degree", c->cfg_degree);
        cJSON_AddNumberToObject(s, "tp_degree", c->tp_degree);
    } else {
        cJSON_AddNullToObject(root, "selected");
    }
    cJSON_AddItemToObject(root, "predicted", json_predicted(c));
    if (!j->opt->check && !j->opt->explain && !j->opt->sweep)
        cJSON_AddItemToObject(root, "artifact", j->written ? cJSON_CreateString(j->output) : cJSON_CreateNull());
    if (j->opt->explain) {
        cJSON *arr = cJSON_AddArrayToObject(root, "candidates");
        for (int i = 0; cpc_compilation_validated(j->c) && i < j->n_cands; i++) {
            const cpc_candidate_info *k = &j->cands[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "variant", k->variant);
            cJSON_AddNumberToObject(o, "ring_degree", k->ring_degree);
            cJSON_AddNumberToObject(o, "ulysses_degree", k->ulysses_degree);
            /* always (SPEC section 3), 1 where the plan has no cfg/tp axes */
            cJSON_AddNumberToObject(o, "cfg_degree", k->cfg_degree);
            cJSON_AddNumberToObject(o, "tp_degree", k->tp_degree);
            cJSON_AddBoolToObject(o, "ok", k->ok);
            cJSON *codes = cJSON_AddArrayToObject(o, "codes");
            for (const cpc_status *e = k->errors; e; e = cpc_status_next(e)) {
                char rb[8];
                if (cpc_status_severity(e) != CPC_SEV_ERROR || !cpc_status_rule(e))
                    continue;
                rule_str(cpc_status_rule(e), rb);
                bool seen = false;
                cJSON *it;
                cJSON_ArrayForEach(it, codes) seen = seen || strcmp(it->valuestring, rb) == 0;
                if (!seen)
                    cJSON_AddItemToArray(codes, cJSON_CreateString(rb));
            }
            cJSON_AddItemToObject(o, "predicted", json_predicted(k));
            if (k->measured) /* cprun --tune measured it (the profile's `measured`) */
                cJSON_AddNumberToObject(o, "measured_ms_per_layer", k->measured_ms_per_layer);
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
    "  --set KEY=VALUE        override a plan key, repeatable.  KEY is a dotted path of\n"
    "                         mapping keys, each optionally indexed into an existing\n"
    "                         sequence: cluster.world_size=8,\n"
    "                         input.segments[1].image.height=1008; VALUE is YAML\n"
    "                         (8, ring, {height: 1024, width: 1024}, [1,2,2])\n"
    "  --dump-schedule        print the schedule in its stable text form (no artifact\n"
    "                         is written unless -o is given)\n"
    "  --rank N               with --dump-schedule: rank N's program, loops unrolled\n"
    "  --lua FILE             apply a Lua schedule script\n"
    "  --emit-kernels DIR     write the generated CUDA sources (no artifact unless -o)\n"
    "  --arch ARCH            NVRTC target (default sm_90)\n"
    "  --no-kernels           skip code generation\n"
    "  --format text|json     diagnostics and reports as text (default) or JSON\n"
    "  --sweep KEY=V1,V2,...  price every variant across the values of one plan key, KEY\n"
    "                         as for --set (e.g. cluster.world_size=2,4,8,16,32 or\n"
    "                         'input.segments[1].image.height=512,1008,1024'; values\n"
    "                         are split at commas) and print the table (one --sweep\n"
    "                         per run; '-' selected: the point is rejected); exit status 0\n"
    "                         when a value is valid, 1 when every value is rejected,\n"
    "                         2 or 3 when a value meets a usage, I/O or internal error;\n"
    "                         with cfg_degree/tp_degree splits (auto) also every valid\n"
    "                         (C, T, R, U) per value, fastest first, '*' selected\n"
    "  --plot FILE.svg        with --sweep: draw predicted time and memory per variant\n"
    "                         (per C x T family with cfg/tp splits) against the swept\n"
    "                         value, the selected candidate ringed (gnuplot)\n"
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

/* True when s has a control character (newline, tab, escape, DEL). */
static bool has_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

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
            if (has_control(optarg))
                return usage_error("%s", "--sweep: control characters (newline, tab, ...) are not allowed");
            if (o->sweep)
                return usage_error("--sweep '%s': only one --sweep per run (one KEY with its values; "
                                   "fix the other keys with --set)", optarg);
            o->sweep = optarg;
            break;
        case OPT_PLOT:
            if (!optarg[0] || has_control(optarg))
                return usage_error("%s", "--plot: expected a file name without control characters (newline, tab, ...)");
            o->plot = optarg;
            break;
        case OPT_FORMAT:
            if (strcmp(optarg, "text") == 0)
                o->format = FORMAT_TEXT;
            else if (strcmp(optarg, "json") == 0)
                o->format = FORMAT_JSON;
            else
                return usage_error("--format '%s': expected text or json", optarg);
            break;
        case OPT_VERSION: printf("cpc %s\n", cpc_version()); return 0;
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

/* What a sweep compares: the whole step when the plan has model.parameters,
 * else the attention per layer. */
static double sweep_time(const cpc_candidate_info *c)
{
    return c->ms_per_step > 0 ? c->ms_per_step : c->ms_per_layer;
}

/* The candidate shown for `variant` in a sweep column: the selected one when
 * it has that variant, else the best valid one (SPEC tie rule), else the
 * first (rejected) one, or NULL. */
static const cpc_candidate_info *sweep_pick(const job *j, const char *v)
{
    const cpc_candidate_info *best = NULL, *first = NULL;
    for (int i = 0; cpc_compilation_validated(j->c) && i < j->n_cands; i++) {
        const cpc_candidate_info *c = &j->cands[i];
        if (strcmp(c->variant, v) != 0)
            continue;
        if (!first)
            first = c;
        if (c->ok && c->priced && (!best || sweep_time(c) < sweep_time(best)))
            best = c;
    }
    return best ? best : first;
}

/* The rule of a sweep point rejected before any variant was tried (the
 * value itself: CP103, a stage-1 CP105, ...), shown in every variant's cell
 * and plot label; "error" for an error without a rule, "-" for none. */
static void point_code(const job *j, char *buf, size_t n)
{
    snprintf(buf, n, "-");
    const cpc_status *chains[] = {cpc_compilation_diagnostics(j->c), j->err};
    for (int ch = 0; ch < 2; ch++)
        for (const cpc_status *e = chains[ch]; e; e = cpc_status_next(e))
            if (cpc_status_severity(e) == CPC_SEV_ERROR) {
                char rb[8];
                snprintf(buf, n, "%s", cpc_status_rule(e) ? rule_str(cpc_status_rule(e), rb) : "error");
                return;
            }
}

static const char *const SWEEP_VARIANTS[] = {"ulysses", "unified", "ring", "ulysses_anything",
                                            "ring_anything"};
#define N_SWEEP_VARIANTS 5

/* Does the job list splits over the outer axes (cfg_degree or tp_degree > 1)? */
static bool job_has_axes(const job *j)
{
    for (int i = 0; cpc_compilation_validated(j->c) && i < j->n_cands; i++)
        if (j->cands[i].cfg_degree > 1 || j->cands[i].tp_degree > 1)
            return true;
    return false;
}

/* A series of a sweep's plot: a variant (variant mode), or a (C, T) family
 * (four-axis mode: a sweep whose points list cfg/tp splits), whose point is
 * the family's fastest valid (C, T, R, U) candidate. */
#define MAX_SERIES 16
typedef struct sweep_series {
    const char *variant;   /* variant mode; NULL for a (C, T) family */
    int C, T;
    char name[32];         /* the legend: "ulysses", "C 2 x T 1" */
} sweep_series;

/* The candidate a series shows at one point: its best valid one, else its
 * first (rejected) one, or NULL (the family does not exist at that point). */
static const cpc_candidate_info *series_pick(const job *j, const sweep_series *s)
{
    if (s->variant)
        return sweep_pick(j, s->variant);
    const cpc_candidate_info *best = NULL, *first = NULL;
    for (int i = 0; cpc_compilation_validated(j->c) && i < j->n_cands; i++) {
        const cpc_candidate_info *c = &j->cands[i];
        if (c->cfg_degree != s->C || c->tp_degree != s->T)
            continue;
        if (!first)
            first = c;
        if (c->ok && c->priced && (!best || sweep_time(c) < sweep_time(best)))
            best = c;
    }
    return best ? best : first;
}

/* The series of a sweep: the five variants, or, when any point splits over
 * the outer axes, every (C, T) family some point has (C, then T, ascending;
 * at most MAX_SERIES).  Returns the count. */
static int sweep_series_of(const job *jobs, int n, sweep_series *out)
{
    bool axes = false;
    for (int i = 0; i < n && !axes; i++)
        axes = job_has_axes(&jobs[i]);
    int ns = 0;
    if (!axes) {
        for (int v = 0; v < N_SWEEP_VARIANTS; v++) {
            out[ns] = (sweep_series){.variant = SWEEP_VARIANTS[v]};
            snprintf(out[ns].name, sizeof out[ns].name, "%s", SWEEP_VARIANTS[v]);
            ns++;
        }
        return ns;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; cpc_compilation_validated(jobs[i].c) && k < jobs[i].n_cands; k++) {
            int C = jobs[i].cands[k].cfg_degree, T = jobs[i].cands[k].tp_degree;
            int at = 0;
            while (at < ns && (out[at].C < C || (out[at].C == C && out[at].T < T)))
                at++;
            if ((at < ns && out[at].C == C && out[at].T == T) || ns == MAX_SERIES)
                continue;
            memmove(&out[at + 1], &out[at], (size_t)(ns - at) * sizeof *out);
            out[at] = (sweep_series){.variant = NULL, .C = C, .T = T};
            snprintf(out[at].name, sizeof out[at].name, "C %d x T %d", C, T);
            ns++;
        }
    return ns;
}

/* The x shift of series k of ns (coinciding series stay apart): the five
 * variants at -0.08 .. 0.08, families spread over -0.16 .. 0.16. */
static double series_shift(int k, int ns, bool families)
{
    if (!families)
        return -0.08 + 0.04 * k;
    return ns > 1 ? -0.16 + 0.32 * k / (ns - 1) : 0.0;
}

/* Writes s as a gnuplot single-quoted string: no escapes are interpreted
 * inside one, and a ' is written as ''.  Callers refuse control characters
 * first (a newline would end the command). */
static void gp_quote(FILE *g, const char *s)
{
    fputc('\'', g);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', g);
        fputc(*s, g);
    }
    fputc('\'', g);
}

/* A label in the data file: double-quoted there, with no escape; a '"'
 * becomes '\''. */
static void gp_data_label(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++)
        fputc(*s == '"' ? '\'' : *s, f);
    fputc('"', f);
}

/* The --plot target: a temporary file beside it (fileio.h), opened before the
 * sweep runs, so that a path that cannot be written fails at once (2); it
 * replaces the target only when the whole SVG is in. */
typedef struct plot_out {
    cpc_atomic_file *of;
    bool open;
} plot_out;

static int plot_open(const options *o, plot_out *po)
{
    po->open = false;
    if (same_file(o->plot, o->files[0])) {
        fprintf(stderr, "cpc: error: --plot %s: refusing to overwrite the plan file\n", o->plot);
        return 2;
    }
    cpc_status *st = cpc_atomic_file_open(o->plot, "cannot create", &po->of);
    if (st) {
        fprintf(stderr, "cpc: error: --plot %s\n", cpc_status_message(st));
        cpc_status_free(st);
        return 2;
    }
    po->open = true;
    return 0;
}

/* Drops the temporary file when no plot went in (the target is untouched). */
static void plot_close(const options *o, plot_out *po, bool written)
{
    (void)o;
    (void)written;
    if (po->open)
        cpc_atomic_file_discard(po->of);
    po->open = false;
}

/* Copies the SVG gnuplot wrote (fd `from`) into the target and puts it in
 * place.  0, 2 (the target) or 3 (reading back our own temporary file). */
static int plot_copy(const options *o, plot_out *po, int from)
{
    if (lseek(from, 0, SEEK_SET) < 0) {
        fprintf(stderr, "cpc: error: --plot: cannot read gnuplot's output: %s\n", strerror(errno));
        return 3;
    }
    char buf[65536];
    for (;;) {
        ssize_t r = read(from, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fprintf(stderr, "cpc: error: --plot: cannot read gnuplot's output: %s\n", strerror(errno));
            return 3;
        }
        if (r == 0)
            break;
        cpc_status *st = cpc_atomic_file_write(po->of, buf, (size_t)r);
        if (st) {
            fprintf(stderr, "cpc: error: --plot %s\n", cpc_status_message(st));
            cpc_status_free(st);
            return 2;
        }
    }
    (void)o;
    po->open = false;
    cpc_status *st = cpc_atomic_file_commit(po->of);
    if (st) {
        fprintf(stderr, "cpc: error: --plot %s\n", cpc_status_message(st));
        cpc_status_free(st);
        return 2;
    }
    return 0;
}

/* An unlinked temporary file (for gnuplot's output and messages). */
static int temp_fd(void)
{
    char name[] = "/tmp/cpc_plot_XXXXXX";
    int fd = mkstemp(name);
    if (fd >= 0)
        unlink(name);
    return fd;
}

/* Prints at most 4 KiB of fd (from its start) to stderr, each line indented. */
static void show_fd(int fd)
{
    char buf[4097];
    if (lseek(fd, 0, SEEK_SET) < 0)
        return;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    if (r <= 0)
        return;
    buf[r] = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        fprintf(stderr, "  gnuplot: %s\n", line);
}

/* Writes the gnuplot script; only blocks with points to draw are plotted
 * (so gnuplot has no "no valid points" to warn about).  Three panels:
 * predicted time, memory per rank (one series per variant, or per (C, T)
 * family in a four-axis sweep, each shifted a little along x and drawn with
 * its own line, dash and point type, so series that coincide, such as ring
 * and ring_anything, stay visible side by side; the selected candidate of
 * each point ringed in black) and, below them, the rule codes of rejected
 * points, one row per series, off the data.  The title is the plan's name. */
static void plot_script(FILE *g, const char *dat, const char *name, const char *key, char **values, int n,
                        const sweep_series *ser, int ns, bool families, const bool *any_ok,
                        const bool *any_bad, bool any_sel, bool step)
{
    fprintf(g, "set terminal svg size 900,%d dynamic noenhanced font 'sans,11'\n", families ? 960 : 860);
    fprintf(g, "set datafile missing 'NaN'\nset key outside right top Left reverse\nset grid\n");
    fprintf(g, "set multiplot title ");
    gp_quote(g, name);
    fprintf(g, " . ': predicted %s vs ' . ", step ? "per step" : "per layer");
    gp_quote(g, key);
    if (families)
        fprintf(g, " . ' (each C x T family: its fastest R x U)'");
    fprintf(g, "\nset offsets 0.3,0.3,0,0\nset xrange [-0.5:%d.5]\nset xtics (", n - 1);
    for (int i = 0; i < n; i++) {
        fprintf(g, "%s", i ? ", " : "");
        gp_quote(g, values[i]);
        fprintf(g, " %d", i);
    }
    fprintf(g, ")\nset lmargin 18\nset rmargin 24\n");
    /* the variants keep their colours and points (filled for the three,
     * open for the anything ones); families cycle through ten of each */
    static const char *const colors[] = {"#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    static const int points[] = {7, 5, 9, 6, 8, 11, 13, 4, 10, 12};
    /* panel heights (screen fractions): time, memory, codes */
    const double orig[] = {families ? 0.6 : 0.54, families ? 0.3 : 0.2, 0.0};
    const double size[] = {families ? 0.36 : 0.4, families ? 0.3 : 0.34, families ? 0.3 : 0.2};
    for (int panel = 0; panel < 3; panel++) {
        fprintf(g, "set origin 0,%g\nset size 1,%g\n", orig[panel], size[panel]);
        if (panel == 0)
            fprintf(g, "set ylabel '%s'\nset format x ''\n", step ? "ms per step" : "ms per layer");
        else if (panel == 1)
            fprintf(g, "set ylabel 'memory per rank (GiB)'\nset format x ''\n");
        if (panel < 2) {
            fprintf(g, "plot ");
            const char *sep = "";
            for (int v = 0; v < ns; v++) {
                if (!any_ok[v])
                    continue;
                fprintf(g, "%s", sep);
                gp_quote(g, dat);
                fprintf(g, " index %d using ($1%+g):%d with linespoints lw 2 ps 1.2 lc rgb '%s' pt %d dt %d title ",
                        v, series_shift(v, ns, families), panel ? 4 : 3, colors[v % 10], points[v % 10],
                        v % 5 + 1);
                gp_quote(g, ser[v].name);
                sep = ", ";
            }
            if (any_sel) {
                fprintf(g, "%s", sep);
                gp_quote(g, dat);
                fprintf(g, " index %d using ($1+$5):%d with points pt 6 ps 2.6 lw 2 lc rgb 'black' "
                           "title 'selected'",
                        ns, panel ? 4 : 3);
                sep = ", ";
            }
            if (!sep[0]) /* nothing valid: an empty frame keeps the layout */
                fprintf(g, "NaN notitle");
            fprintf(g, "\n");
            continue;
        }
        /* the codes: y = series row, labels only, no data above */
        fprintf(g, "set format x '%%g'\nset xtics (");
        for (int i = 0; i < n; i++) {
            fprintf(g, "%s", i ? ", " : "");
            gp_quote(g, values[i]);
            fprintf(g, " %d", i);
        }
        fprintf(g, ")\nset xlabel ");
        gp_quote(g, key);
        fprintf(g, "\nset ylabel 'rejected'\nset yrange [-0.7:%d.7]\nunset grid\nset ytics (", ns - 1);
        for (int v = 0; v < ns; v++) {
            fprintf(g, "%s", v ? ", " : "");
            gp_quote(g, ser[v].name);
            fprintf(g, " %d", ns - 1 - v);
        }
        fprintf(g, ")\nplot ");
        const char *sep = "";
        for (int v = 0; v < ns; v++) {
            if (!any_bad[v])
                continue;
            fprintf(g, "%s", sep);
            gp_quote(g, dat);
            fprintf(g, " index %d using 1:($5 == 0 ? %d : NaN):6 with labels font ',9' tc rgb '%s' notitle", v,
                    ns - 1 - v, colors[v % 10]);
            sep = ", ";
        }
        if (!sep[0])
            fprintf(g, "NaN notitle");
        fprintf(g, "\n");
    }
    fprintf(g, "unset multiplot\n");
}

/* Runs gnuplot on the sweep's figures and copies its SVG into po.
 * Returns 0, -1 (gnuplot not installed: warned, no plot), 2 (I/O) or 3
 * (gnuplot failed: its exit status and messages are shown). */
static int plot_sweep(const options *o, plot_out *po, const char *key, char **values, int n,
                      job *jobs)
{
    /* the title: the plan's name (its `name:`, else the file's stem), never a path */
    char plot_name[256];
    {
        const char *nm = NULL;
        for (int i = 0; i < n && !nm; i++)
            nm = cpc_compilation_plan_name(jobs[i].c);
        if (nm) {
            snprintf(plot_name, sizeof plot_name, "%s", nm);
        } else {
            const char *b = strrchr(jobs[0].file, '/');
            snprintf(plot_name, sizeof plot_name, "%s", b ? b + 1 : jobs[0].file);
            char *dot = strrchr(plot_name, '.');
            if (dot && dot != plot_name)
                *dot = 0;
        }
    }
    bool bad_value = false;
    for (int i = 0; i < n; i++)
        bad_value = bad_value || has_control(values[i]);
    if (has_control(plot_name) || has_control(key) || bad_value) {
        fprintf(stderr, "cpc: error: --plot: the plan's name, the key and its values must not hold control characters\n");
        return 2;
    }
    char dat[] = "/tmp/cpc_sweep_XXXXXX";
    int fd = mkstemp(dat);
    if (fd < 0) {
        fprintf(stderr, "cpc: error: --plot: cannot create a temporary file: %s\n", strerror(errno));
        return 2;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(dat);
        fprintf(stderr, "cpc: error: --plot: cannot write a temporary file: %s\n", strerror(errno));
        return 2;
    }
    /* one block per series: index, value label, ms, GiB, ok, rejecting
     * codes; which blocks have valid and which rejected points */
    sweep_series ser[MAX_SERIES];
    int ns = sweep_series_of(jobs, n, ser);
    bool families = ns > 0 && !ser[0].variant;
    bool any_ok[MAX_SERIES] = {0}, any_bad[MAX_SERIES] = {0};
    for (int v = 0; v < ns; v++) {
        fprintf(f, "# %s\n", ser[v].name);
        for (int i = 0; i < n; i++) {
            const cpc_candidate_info *c = series_pick(&jobs[i], &ser[v]);
            char codes[64] = "-";
            if (c && !c->ok)
                codes_of(c, codes, sizeof codes);
            else if (!c && (!families || !cpc_compilation_validated(jobs[i].c)))
                point_code(&jobs[i], codes, sizeof codes);
            else if (!c) /* a family this point does not have (P not divisible) */
                continue;
            bool ok = c && c->ok && c->priced;
            fprintf(f, "%d ", i);
            gp_data_label(f, values[i]);
            if (ok)
                fprintf(f, " %.6g %.6g 1 \"-\"\n", sweep_time(c),
                        (double)c->memory_bytes_per_rank / 1073741824.0);
            else
                fprintf(f, " NaN NaN 0 \"%s\"\n", codes[0] ? codes : "-");
            any_ok[v] = any_ok[v] || ok;
            any_bad[v] = any_bad[v] || !ok;
        }
        fprintf(f, "\n\n");
    }
    /* the selected candidate of each point: x shift of its series */
    bool any_sel = false, step = false;
    fprintf(f, "# selected\n");
    for (int i = 0; i < n; i++) {
        const cpc_candidate_info *c = selected(&jobs[i]);
        int v = 0;
        while (c && v < ns &&
               (families ? (ser[v].C != c->cfg_degree || ser[v].T != c->tp_degree)
                         : strcmp(ser[v].variant, c->variant) != 0))
            v++;
        if (!c || v == ns || !c->priced || (!families && sweep_pick(&jobs[i], c->variant) != c))
            continue;
        fprintf(f, "%d ", i);
        gp_data_label(f, values[i]);
        fprintf(f, " %.6g %.6g %g\n", sweep_time(c), (double)c->memory_bytes_per_rank / 1073741824.0,
                series_shift(v, ns, families));
        any_sel = true;
        step = step || c->ms_per_step > 0;
    }
    fprintf(f, "\n\n");
    for (int i = 0; i < n && !step; i++)
        step = cpc_compilation_parameters(jobs[i].c) > 0;
    bool dat_ok = !ferror(f);
    if (fclose(f) != 0)
        dat_ok = false;
    if (!dat_ok) {
        unlink(dat);
        fprintf(stderr, "cpc: error: --plot: cannot write the temporary data file %s\n", dat);
        return 2;
    }

    /* gnuplot reads the script on stdin, writes the SVG to a temporary file
     * (copied into the target when it succeeds) and its messages to another
     * (shown only when it fails): no shell, and no file name of the user's
     * in the script but the quoted plan path and key in the titles. */
    int svg = temp_fd(), err = temp_fd(), pfd[2] = {-1, -1};
    int rc = 0;
    pid_t pid = -1;
    posix_spawn_file_actions_t fa;
    bool fa_ok = false;
    if (svg < 0 || err < 0 || pipe(pfd) != 0) {
        fprintf(stderr, "cpc: error: --plot: cannot set up gnuplot: %s\n", strerror(errno));
        rc = 2;
        goto done;
    }
    fa_ok = posix_spawn_file_actions_init(&fa) == 0;
    if (!fa_ok || posix_spawn_file_actions_adddup2(&fa, pfd[0], 0) != 0 ||
        posix_spawn_file_actions_adddup2(&fa, svg, 1) != 0 ||
        posix_spawn_file_actions_adddup2(&fa, err, 2) != 0 ||
        posix_spawn_file_actions_addclose(&fa, pfd[1]) != 0) {
        fprintf(stderr, "cpc: error: --plot: cannot set up gnuplot\n");
        rc = 3;
        goto done;
    }
    char *argv[] = {"gnuplot", NULL};
    int se = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    if (se != 0) {
        pid = -1;
        if (se == ENOENT) {
            fprintf(stderr, "cpc: warning: --plot: gnuplot is not installed (apt-get install gnuplot-nox); "
                            "the table above has the same figures\n");
            rc = -1;
        } else {
            fprintf(stderr, "cpc: error: --plot: cannot run gnuplot: %s\n", strerror(se));
            rc = 3;
        }
        goto done;
    }
    close(pfd[0]);
    pfd[0] = -1;
    /* gnuplot may stop reading early: then a write error here, not SIGPIPE */
    struct sigaction ign, old_pipe;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe);
    bool fed = false;
    FILE *g = fdopen(pfd[1], "w");
    if (g) {
        pfd[1] = -1;
        plot_script(g, dat, plot_name, key, values, n, ser, ns, families, any_ok, any_bad, any_sel, step);
        fed = !ferror(g);
        fed = fclose(g) == 0 && fed;
    } else {
        close(pfd[1]);
        pfd[1] = -1;
    }
    sigaction(SIGPIPE, &old_pipe, NULL);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && fed) {
        rc = plot_copy(o, po, svg);
    } else {
        if (WIFEXITED(ws) && WEXITSTATUS(ws) != 0)
            fprintf(stderr, "cpc: error: --plot: gnuplot failed (exit status %d)\n", WEXITSTATUS(ws));
        else if (WIFSIGNALED(ws))
            fprintf(stderr, "cpc: error: --plot: gnuplot was killed by signal %d (%s)\n", WTERMSIG(ws),
                    strsignal(WTERMSIG(ws)));
        else
            fprintf(stderr, "cpc: error: --plot: gnuplot did not read the whole script\n");
        show_fd(err);
        rc = 3;
    }
done:
    if (fa_ok)
        posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < 2; i++)
        if (pfd[i] >= 0)
            close(pfd[i]);
    if (svg >= 0)
        close(svg);
    if (err >= 0)
        close(err);
    unlink(dat);
    if (rc == 0)
        fprintf(stderr, "cpc: wrote %s\n", o->plot);
    return rc;
}

/* A four-axis sweep's second table: at each point every valid (C, T, R, U)
 * split, fastest first, the selected one marked '*'. */
static void print_sweep_splits(job *jobs, int n, const char *key, char **values, bool step)
{
    for (int i = 0; i < n; i++) {
        const job *j = &jobs[i];
        int nv = 0;
        for (int k = 0; cpc_compilation_validated(j->c) && k < j->n_cands; k++)
            nv += j->cands[k].ok && j->cands[k].priced;
        printf("\n%s=%s: %d valid split%s (C x T, variant, R x U; fastest first, * selected)\n", key,
               values[i], nv, nv == 1 ? "" : "s");
        if (nv == 0)
            continue;
        printf("  %-7s  %-17s %-7s %12s %12s\n", "C x T", "variant", "R x U", step ? "ms/step" : "ms/layer",
               "memory/rank");
        const cpc_candidate_info *sel = selected(j);
        bool *done = calloc((size_t)j->n_cands, sizeof *done);
        if (!done)
            return;
        for (int r = 0; r < nv; r++) {
            int b = -1;
            for (int k = 0; k < j->n_cands; k++) {
                const cpc_candidate_info *c = &j->cands[k];
                if (!done[k] && c->ok && c->priced && (b < 0 || sweep_time(c) < sweep_time(&j->cands[b])))
                    b = k;
            }
            if (b < 0)
                break;
            done[b] = true;
            const cpc_candidate_info *c = &j->cands[b];
            char ct[32], ru[32], mem[32];
            snprintf(ct, sizeof ct, "%dx%d", c->cfg_degree, c->tp_degree);
            snprintf(ru, sizeof ru, "%dx%d", c->ring_degree, c->ulysses_degree);
            fmt_bytes(mem, sizeof mem, c, c->memory_bytes_per_rank);
            printf("%c %-7s  %-17s %-7s %12.3f %12s\n", c == sel ? '*' : ' ', ct, c->variant, ru, sweep_time(c),
                   mem);
        }
        free(done);
    }
}

static int run_sweep(options *o)
{
    const char *eq = strchr(o->sweep, '=');
    char key[256];
    if ((size_t)(eq - o->sweep) >= sizeof key)
        return usage_error("--sweep '%s': KEY too long", o->sweep);
    snprintf(key, sizeof key, "%.*s", (int)(eq - o->sweep), o->sweep);
    char *list = strdup(eq + 1);
    if (!list) {
        fprintf(stderr, "cpc: error: out of memory\n");
        return 3;
    }
    enum { MAX_VALUES = 256 };
    char *values[MAX_VALUES];
    int n = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        if (n == MAX_VALUES) {
            free(list);
            return usage_error("--sweep: more than %s values", "256");
        }
        values[n++] = tok;
    }
    if (n == 0) {
        free(list);
        return usage_error("--sweep '%s': no values", o->sweep);
    }
    /* the plot's file first: a path that cannot be written fails now */
    plot_out po = {.open = false};
    if (o->plot) {
        int prc = plot_open(o, &po);
        if (prc) {
            free(list);
            return prc;
        }
    }
    job *jobs = calloc((size_t)n, sizeof *jobs);
    char **sets_store = calloc((size_t)n, sizeof *sets_store);
    const char **sets = calloc((size_t)(o->n_sets + 1) * (size_t)n, sizeof *sets);
    if (!jobs || !sets_store || !sets) {
        free(jobs);
        free(sets_store);
        free(sets);
        free(list);
        plot_close(o, &po, false);
        fprintf(stderr, "cpc: error: out of memory\n");
        return 3;
    }
    /* Exit status (cpc --help): the worst class >= 2 over the points; else 0
     * when a point is valid, 1 when every point is rejected. */
    int worst = 0, n_valid = 0;
    bool aborted = false;
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
        if (!sets_store[i])
            job_fail(&jobs[i], cpc_status_new(CPC_E_NOMEM, "out of memory"));
        else
            run_pipeline(&jobs[i]);
        int code = job_exit_code(&jobs[i]);
        /* a usage error about the sweep's own KEY (an index out of range,
         * input.segments[0] on a plan with the tokens shorthand) is the
         * same for every value: say it once, no table */
        bool key_usage = false;
        for (const cpc_status *e = cpc_compilation_diagnostics(jobs[i].c); e; e = cpc_status_next(e)) {
            const char *file;
            int line;
            cpc_status_position(e, &file, &line, NULL);
            key_usage = key_usage || (cpc_status_code(e) == CPC_E_USAGE && file &&
                                      strcmp(file, CPC_SET_FILE) == 0 && line == o->n_sets + 1);
        }
        if (key_usage) {
            if (o->format == FORMAT_JSON)
                print_json(&jobs[i], code);
            else
                job_print_diags(&jobs[i]);
            n = i + 1;
            worst = 2;
            aborted = true;
            break;
        }
        if (o->format == FORMAT_JSON) {
            print_json(&jobs[i], code);
            flush_stdout();
        } else if (!cpc_compilation_validated(jobs[i].c) || code > 1) {
            fprintf(stderr, "%s=%s:\n", key, values[i]);
            job_print_diags(&jobs[i]);
        }
        if (code > 1 && code > worst)
            worst = code;
        if (selected(&jobs[i]))
            n_valid++;
    }
    if (worst < 2 && n_valid == 0)
        worst = 1;
    if (o->format == FORMAT_TEXT && !aborted) {
        bool step = false;
        for (int i = 0; i < n && !step; i++)
            step = cpc_compilation_parameters(jobs[i].c) > 0;
        bool axes = false;
        for (int i = 0; i < n && !axes; i++)
            axes = job_has_axes(&jobs[i]);
        printf("%s: sweep of %s (ms per %s / memory per rank, or the rule that rejects%s)\n",
               o->files[0], key, step ? "step" : "layer",
               axes ? "; each variant's best over every C x T split" : "");
        int kw = (int)strlen(key) > 12 ? (int)strlen(key) : 12;
        printf("%-*s", kw, key);
        for (int v = 0; v < N_SWEEP_VARIANTS; v++)
            printf(" %-22s", SWEEP_VARIANTS[v]);
        printf(" %s\n", "selected");
        for (int i = 0; i < n; i++) {
            printf("%-*s", kw, values[i]);
            /* a point rejected before any variant was tried (the value
             * itself: CP103, a stage-1 CP105, ...): its rule in every cell */
            char whole[64];
            point_code(&jobs[i], whole, sizeof whole);
            for (int v = 0; v < N_SWEEP_VARIANTS; v++) {
                const cpc_candidate_info *c = sweep_pick(&jobs[i], SWEEP_VARIANTS[v]);
                char cell[64];
                if (!c)
                    snprintf(cell, sizeof cell, "%s", whole);
                else if (c->ok && c->priced)
                    snprintf(cell, sizeof cell, "%.3f/%.2fG %dx%d", sweep_time(c),
                             (double)c->memory_bytes_per_rank / 1073741824.0, c->ring_degree,
                             c->ulysses_degree);
                else
                    codes_of(c, cell, sizeof cell);
                printf(" %-22s", cell);
            }
            const cpc_candidate_info *s = selected(&jobs[i]);
            if (s && axes)
                printf(" %s %dx%d, C x T %dx%d\n", s->variant, s->ring_degree, s->ulysses_degree,
                       s->cfg_degree, s->tp_degree);
            else if (s)
                printf(" %s %dx%d\n", s->variant, s->ring_degree, s->ulysses_degree);
            else
                printf(" -\n"); /* rejected ("none" is a variant's name) */
        }
        /* each rule code of the table's cells, once, with the first point's message */
        code_legend legend = {0};
        for (int i = 0; i < n; i++) {
            for (int v = 0; v < N_SWEEP_VARIANTS; v++)
                explain_codes(&legend, sweep_pick(&jobs[i], SWEEP_VARIANTS[v]), key, values[i]);
            /* a point rejected before any variant was tried (its code in every
             * cell): its own errors, e.g. a stage-1 CP105 of auto with pinned degrees */
            explain_point(&legend, &jobs[i], key, values[i]);
        }
        if (axes)
            print_sweep_splits(jobs, n, key, values, step);
    }
    flush_stdout();
    bool plotted = false;
    if (o->plot && worst < 2) {
        int rc = plot_sweep(o, &po, key, values, n, jobs);
        plotted = rc == 0;
        if (rc > worst)
            worst = rc;
    } else if (o->plot) {
        fprintf(stderr, "cpc: --plot: no plot written (a point failed with status %d)\n", worst);
    }
    plot_close(o, &po, plotted);
    for (int i = 0; i < n; i++) {
        job_free(&jobs[i]);
        free(sets_store[i]);
    }
    free(jobs);
    free(sets_store);
    free(sets);
    free(list);
    return worst;
}

/* Standard output is where the summary and the JSON go: a failure to write
 * it (a full disk, a closed pipe) is an I/O error (2), never a success.
 * flush_stdout keeps the first failure's errno for finish_stdout. */
static int stdout_errno;

static void flush_stdout(void)
{
    errno = 0;
    if ((fflush(stdout) != 0 || ferror(stdout)) && !stdout_errno)
        stdout_errno = errno ? errno : EIO;
}

static int finish_stdout(int rc)
{
    flush_stdout();
    if (!stdout_errno && !ferror(stdout))
        return rc;
    fprintf(stderr, "cpc: error: cannot write to standard output: %s\n",
            strerror(stdout_errno ? stdout_errno : EIO));
    return rc > 2 ? rc : 2;
}

int main(int argc, char **argv)
{
    options opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc >= 0) {
        free(opt.sets);
        return finish_stdout(rc);
    }
    if (opt.sweep) {
        rc = run_sweep(&opt);
        free(opt.sets);
        return finish_stdout(rc);
    }
    int worst = 0;
    for (int i = 0; i < opt.n_files; i++) {
        job j;
        memset(&j, 0, sizeof j);
        j.opt = &opt;
        j.file = opt.files[i];
        j.sets = opt.sets;
        j.n_sets = opt.n_sets;
        /* an artifact: -o, or the default for a plain compile; the
         * inspection options (--dump-schedule, --emit-kernels) write none
         * unless -o asks for it */
        bool inspect = opt.dump_schedule || opt.emit_kernels;
        if (!opt.check && !opt.explain && (opt.output || !inspect)) {
            j.output = opt.output ? strdup(opt.output) : default_output(j.file);
            if (!j.output)
                job_fail(&j, cpc_status_new(CPC_E_NOMEM, "out of memory"));
        }
        if (!j.err)
            run_pipeline(&j);
        int code = job_exit_code(&j);
        if (opt.format == FORMAT_JSON) {
            print_json(&j, code);
        } else {
            job_print_diags(&j);
            print_summary_text(&j);
        }
        flush_stdout();
        if (code > worst)
            worst = code;
        job_free(&j);
        free(j.output);
    }
    free(opt.sets);
    return finish_stdout(worst);
}
