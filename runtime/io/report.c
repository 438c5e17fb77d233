/* report.c - see report.h */
#include "report.h"

#include <math.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

void cpc_run_report_clear(cpc_run_report *r)
{
    if (!r)
        return;
    free(r->iter_ms);
    free(r->rank_bytes_sent);
    free(r->rank_peak_bytes);
    free(r->rank_comm_ms);
    free(r->rank_compute_ms);
    r->iter_ms = NULL;
    r->rank_bytes_sent = r->rank_peak_bytes = NULL;
    r->rank_comm_ms = r->rank_compute_ms = NULL;
}

static void human(char *buf, size_t n, double b)
{
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024)
        snprintf(buf, n, "%.2f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0)
        snprintf(buf, n, "%.2f KiB", b / 1024.0);
    else
        snprintf(buf, n, "%.0f B", b);
}

void cpc_run_report_print_text(const cpc_run_report *r, FILE *out)
{
    if (!out || !r)
        return;
    char a[32], b[32];
    fprintf(out, "plan:        %s (B=%lld, S=%lld, H=%d, Hkv=%d, D=%d, %s%s)\n", r->plan_name,
            (long long)r->B, (long long)r->S, r->H, r->Hkv, r->D, r->dtype,
            r->causal ? ", causal" : "");
    if (r->Skv != r->S)
        fprintf(out, "             cross-attention: %lld key/value tokens\n", (long long)r->Skv);
    if (r->cfg_degree * r->tp_degree > 1)
        fprintf(out, "variant:     %s, mesh %d x %d x %d x %d (cfg x tp x ring x ulysses: %d groups of %d x %d), "
                     "%d rank%s\n", r->variant, r->cfg_degree, r->tp_degree, r->ring_degree, r->ulysses_degree,
                r->cfg_degree * r->tp_degree, r->ring_degree, r->ulysses_degree, r->ranks, r->ranks == 1 ? "" : "s");
    else
        fprintf(out, "variant:     %s, mesh %d x %d (ring x ulysses), %d rank%s\n", r->variant,
                r->ring_degree, r->ulysses_degree, r->ranks, r->ranks == 1 ? "" : "s");
    fprintf(out, "backend:     %s (attention %s), transport %s\n", r->backend, r->attention,
            r->transport);
    fprintf(out, "input:       %s\n", r->input);
    fprintf(out, "time:        %.3f ms per iteration (median of %d, max over ranks; %d warmup)\n",
            r->ms_per_iter, r->iters, r->warmup);
    if (r->iters > 1) {
        fprintf(out, "             iterations:");
        for (int i = 0; i < r->iters; i++)
            fprintf(out, " %.3f", r->iter_ms[i]);
        fprintf(out, " ms\n");
    }
    fprintf(out, "attention:   %.4f TFLOP/s (%.3g FLOP per iteration%s)\n", r->tflops, r->flops,
            r->causal ? ", causal: halved" : "");
    human(a, sizeof a, (double)r->bytes_sent_per_rank);
    fprintf(out, "sent:        %lld bytes per rank (%s, max over ranks)", (long long)r->bytes_sent_per_rank, a);
    if (r->bandwidth_gbps > 0)
        fprintf(out, ", %.3g GB/s over the iteration", r->bandwidth_gbps);
    fprintf(out, "\n");
    human(b, sizeof b, (double)r->peak_memory_bytes_per_rank);
    fprintf(out, "memory:      %lld bytes peak per rank (%s, max over ranks; buffers and staging: cpc's "
                 "prediction adds the attention workspace and reserved_gb)\n",
            (long long)r->peak_memory_bytes_per_rank, b);
    if (r->rank_bytes_sent && r->ranks <= 64) {
        fprintf(out, "per rank:    rank  sent_bytes     peak_bytes     compute_ms  comm_ms\n");
        for (int i = 0; i < r->ranks; i++)
            fprintf(out, "             %4d  %-13lld  %-13lld  %-10.3f  %.3f\n", i,
                    (long long)r->rank_bytes_sent[i], (long long)r->rank_peak_bytes[i],
                    r->rank_compute_ms ? r->rank_compute_ms[i] : 0.0,
                    r->rank_comm_ms ? r->rank_comm_ms[i] : 0.0);
    }
    if (!r->checked) {
        fprintf(out, "check:       skipped (--no-check)\n");
    } else {
        char tol[160];
        if (r->tolerance_base > 0 && r->tolerance > r->tolerance_base)
            snprintf(tol, sizeof tol, "tolerance %.2e: %.0e widened for ill-conditioned inputs, fp32 logit rounding alone gives %.2e",
                     r->tolerance, r->tolerance_base, r->rounding_err);
        else
            snprintf(tol, sizeof tol, "tolerance %.0e", r->tolerance);
        fprintf(out, "check:       %s: rel_err %.3e (%s), max_abs_err %.3e, %lld rows%s vs float64 reference",
                r->pass ? "PASS" : "FAIL", r->rel_err, tol, r->max_abs_err,
                (long long)r->check_rows, r->check_sampled ? " (sampled per batch and head)" : " (all)");
        if (r->n_nan || r->n_inf)
            fprintf(out, "; output has %lld NaN and %lld Inf of %lld elements (first at [%lld, %lld, %lld, %lld])",
                    (long long)r->n_nan, (long long)r->n_inf,
                    (long long)(r->B * r->S * r->H * (int64_t)r->D), (long long)r->first_bad[0],
                    (long long)r->first_bad[1], (long long)r->first_bad[2], (long long)r->first_bad[3]);
        fprintf(out, "\n");
    }
    if (r->backward) {
        fprintf(out, "backward:    %.3f ms per iteration (%.3g TFLOP/s, %.2fx the forward), %lld bytes sent per rank\n",
                r->bwd_ms_per_iter, r->bwd_tflops, r->ms_per_iter > 0 ? r->bwd_ms_per_iter / r->ms_per_iter : 0.0,
                (long long)r->bwd_bytes_sent_per_rank);
        if (r->bwd_checked)
        {
            fprintf(out, "bwd check:   %s: rel_err dq %.3e, dk %.3e, dv %.3e (tolerance %.0e) vs float64 reference",
                    r->bwd_pass ? "PASS" : "FAIL", r->bwd_rel_err[0], r->bwd_rel_err[1], r->bwd_rel_err[2],
                    r->bwd_tolerance);
            static const char *const gn[3] = {"dq", "dk", "dv"};
            for (int i = 0; i < 3; i++)
                if (r->bwd_n_nan[i] || r->bwd_n_inf[i])
                    fprintf(out, "; %s has %lld NaN and %lld Inf", gn[i], (long long)r->bwd_n_nan[i],
                            (long long)r->bwd_n_inf[i]);
            fprintf(out, "\n");
        }
    }
}

static cJSON *num(double v)
{
    /* JSON has no NaN/Inf: they become null. */
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

char *cpc_report_json(const cpc_run_report *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddItemToObject(o, "ok", cJSON_CreateBool(r->ok));
    cJSON_AddStringToObject(o, "variant", r->variant);
    cJSON_AddNumberToObject(o, "ring_degree", r->ring_degree);
    cJSON_AddNumberToObject(o, "ulysses_degree", r->ulysses_degree);
    if (r->cfg_degree * r->tp_degree > 1) {
        cJSON_AddNumberToObject(o, "cfg_degree", r->cfg_degree);
        cJSON_AddNumberToObject(o, "tp_degree", r->tp_degree);
    }
    cJSON_AddNumberToObject(o, "ranks", r->ranks);
    cJSON_AddStringToObject(o, "backend", r->backend);
    cJSON_AddStringToObject(o, "transport", r->transport);
    cJSON_AddStringToObject(o, "attention", r->attention);
    cJSON_AddItemToObject(o, "ms_per_iter", num(r->ms_per_iter));
    cJSON_AddItemToObject(o, "tflops", num(r->tflops));
    cJSON_AddNumberToObject(o, "bytes_sent_per_rank", (double)r->bytes_sent_per_rank);
    cJSON_AddNumberToObject(o, "peak_memory_bytes_per_rank", (double)r->peak_memory_bytes_per_rank);
    if (r->checked) {
        cJSON *c = cJSON_AddObjectToObject(o, "check");
        if (c) {
            cJSON_AddItemToObject(c, "max_abs_err", num(r->max_abs_err));
            cJSON_AddItemToObject(c, "rel_err", num(r->rel_err));
            cJSON_AddItemToObject(c, "pass", cJSON_CreateBool(r->pass));
        }
    } else {
        cJSON_AddNullToObject(o, "check");
    }
    if (r->backward) {
        cJSON *b = cJSON_AddObjectToObject(o, "backward");
        if (b) {
            cJSON_AddItemToObject(b, "ms_per_iter", num(r->bwd_ms_per_iter));
            cJSON_AddItemToObject(b, "tflops", num(r->bwd_tflops));
            cJSON_AddNumberToObject(b, "bytes_sent_per_rank", (double)r->bwd_bytes_sent_per_rank);
            if (r->bwd_checked) {
                cJSON *c = cJSON_AddObjectToObject(b, "check");
                static const char *const nm[3] = {"dq", "dk", "dv"};
                for (int i = 0; c && i < 3; i++) {
                    cJSON *g = cJSON_AddObjectToObject(c, nm[i]);
                    if (g) {
                        cJSON_AddItemToObject(g, "max_abs_err", num(r->bwd_max_abs_err[i]));
                        cJSON_AddItemToObject(g, "rel_err", num(r->bwd_rel_err[i]));
                        cJSON_AddItemToObject(g, "rel_err_fp32", num(r->bwd_rel_err_fp32[i]));
                    }
                }
                if (c) {
                    cJSON_AddItemToObject(c, "tolerance", num(r->bwd_tolerance));
                    cJSON_AddItemToObject(c, "pass", cJSON_CreateBool(r->bwd_pass));
                }
            } else {
                cJSON_AddNullToObject(b, "check");
            }
        }
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

cpc_status *cpc_run_report_print_json(const cpc_run_report *r, FILE *out)
{
    if (!out || !r)
        return cpc_error(CPC_E_USAGE, "cpc_run_report_print_json: report and out must not be NULL");
    char *s = cpc_report_json(r);
    if (!s)
        return cpc_error(CPC_E_NOMEM, "report: out of memory");
    int w = fprintf(out, "%s\n", s);
    free(s);
    if (w < 0 || ferror(out))
        return cpc_error(CPC_E_IO, "report: write failed");
    return NULL;
}

static cJSON *pos_or_null(int v)
{
    return v > 0 ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

char *cpc_report_failure_json(const char *variant, int ring_degree, int ulysses_degree, int ranks,
                              const cpc_status *err, const char *message, int exit_status)
{
    const cpc_status *first = err;
    while (first && first->severity != CPC_SEV_ERROR)
        first = first->next;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddItemToObject(o, "ok", cJSON_CreateBool(false));
    cJSON_AddItemToObject(o, "variant", variant ? cJSON_CreateString(variant) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "ring_degree", pos_or_null(ring_degree));
    cJSON_AddItemToObject(o, "ulysses_degree", pos_or_null(ulysses_degree));
    cJSON_AddItemToObject(o, "ranks", pos_or_null(ranks));
    static const char *const unknown[] = {"backend", "transport", "attention", "ms_per_iter", "tflops",
                                          "bytes_sent_per_rank", "peak_memory_bytes_per_rank", "check"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
        cJSON_AddNullToObject(o, unknown[i]);
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    if (e) {
        const char *cls = cpc_code_name(first ? first->code : CPC_E_USAGE);
        char rb[8] = "";
        if (first)
            cpc_rule_str(first->rule, rb);
        cJSON_AddStringToObject(e, "code", rb[0] ? rb : cls);
        cJSON_AddStringToObject(e, "class", cls);
        char *m = first ? cpc_status_format(first, "cprun") : NULL;
        cJSON_AddStringToObject(e, "message", m ? m : first ? first->message : message ? message : "error");
        free(m);
        cJSON_AddNumberToObject(e, "exit_status", exit_status);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
