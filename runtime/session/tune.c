/* tune.c - `cprun --tune`: measure every valid candidate; see tune.h. */
#include "tune.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compile.h"
#include "report.h"
#include "run.h"
#ifdef CPC_HAVE_MPI
#include "transport_mpi.h"
#endif

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

void cpc_tune_result_free(cpc_tune_result *r)
{
    if (!r)
        return;
    cpc_measurements_free(&r->measured);
    free(r->entries);
    memset(r, 0, sizeof *r);
}

/* Whether two paths name one file, which may not exist yet: the same name
 * in the same directory (directories compared by realpath). */
static bool same_path(const char *a, const char *b)
{
    char da[4096], db[4096], ra[PATH_MAX], rb[PATH_MAX];
    const char *sa = strrchr(a, '/'), *sb = strrchr(b, '/');
    snprintf(da, sizeof da, "%.*s", sa ? (int)(sa - a) + 1 : 1, sa ? a : ".");
    snprintf(db, sizeof db, "%.*s", sb ? (int)(sb - b) + 1 : 1, sb ? b : ".");
    if (strcmp(sa ? sa + 1 : a, sb ? sb + 1 : b) != 0)
        return false;
    if (!realpath(da, ra) || !realpath(db, rb))
        return strcmp(da, db) == 0;
    return strcmp(ra, rb) == 0;
}

static bool has_error(const cpc_status *st)
{
    return cpc_status_count(st, CPC_SEV_ERROR) > 0;
}

cpc_status *cpc_tune(const char *path, const cpc_tune_options *opt, cpc_tune_result *out,
                     bool *is_root)
{
    memset(out, 0, sizeof *out);
    if (is_root)
        *is_root = true;
    if (ends_with(path, ".cplan"))
        return cpc_error(CPC_E_USAGE, "--tune needs the plan YAML, not the artifact %s "
                                      "(it compiles every candidate)", path);
    int warmup = opt->warmup > 0 ? opt->warmup : 1, iters = opt->iters > 0 ? opt->iters : 3;
    cpc_compile_opts co = {.sets = opt->sets, .n_sets = opt->n_sets, .until = CPC_UNTIL_VALIDATE,
                           .profile_pending = true};
    cpc_compiled cc;
    bool ok = cpc_compile_file(path, &co, &cc);
    cpc_status *diags = cc.diags;
    cc.diags = NULL;
    if (!ok || !cc.plan || !cc.validated) {
        cpc_compiled_free(&cc);
        if (!has_error(diags))
            cpc_status_append(&diags, cpc_error(CPC_E_INTERNAL, "%s: not validated", path));
        return diags;
    }
    cpc_status_free(diags); /* warnings: `cpc --check` reports them */
    const cpc_plan *plan = cc.plan;
    cpc_status *st = NULL;
    /* a training plan: every candidate runs forward and backward; the
     * forward's time is measured, as `auto` chooses training candidates by
     * the forward's time (validate.h) */
    /* the plan's profile without cluster.memory_gb, with its measurements */
    const char *dev = plan->cluster.device ? plan->cluster.device : "h100-sxm";
    if (!cpc_device_preset(dev, &out->profile)) {
        cpc_compiled_free(&cc);
        return cpc_error(CPC_E_PLAN, "unknown device '%s'", dev);
    }
    if (cpc_plan_profile_path(plan, out->profile_path, sizeof out->profile_path)) {
        if (access(out->profile_path, F_OK) == 0 || errno != ENOENT)
            st = cpc_profile_read_measured(out->profile_path, &out->profile, &out->measured);
        else if (opt->profile_out &&
                 (strcmp(opt->profile_out, "-") == 0 || !same_path(opt->profile_out, out->profile_path)))
            /* the tune writes elsewhere: the plan's profile stays missing */
            st = cpc_error(CPC_E_IO, "cluster.profile %s: cannot open: %s (cprun --tune creates the "
                                     "plan's profile only when it writes there: drop --profile-out, or "
                                     "give that path)",
                           out->profile_path, strerror(ENOENT));
    }
    cpc_measure_key(plan, out->key, sizeof out->key);
    snprintf(out->backend, sizeof out->backend, "%s", cpc_measure_backend(plan));
    const cpc_selection *sel = &cc.sel;
    int n_ok = 0;
    for (int i = 0; i < sel->n_candidates; i++)
        n_ok += sel->candidates[i].ok;
    if (!st && n_ok == 0)
        st = cpc_error(CPC_E_PLAN, "%s: no candidate is valid: nothing to tune", path);
    if (!st) {
        out->entries = calloc((size_t)n_ok, sizeof *out->entries);
        if (!out->entries)
            st = cpc_error(CPC_E_NOMEM, "out of memory");
    }
    if (!st && opt->log)
        fprintf(opt->log, "cprun --tune: %d valid candidate%s of %s (%s backend, %d warmup + %d "
                          "timed iterations each)\n  key: %s%s\n",
                n_ok, n_ok == 1 ? "" : "s", path, out->backend, warmup, iters, out->key,
                plan->parallel.cfg_degree == CPC_DEGREE_AUTO || plan->parallel.tp_degree == CPC_DEGREE_AUTO ||
                        cpc_plan_cfg_degree(plan) > 1 || cpc_plan_tp_degree(plan) > 1
                    ? " (C = T = 1; a cfg/tp split's entry is keyed by its (c, t) sub-problem)"
                    : "");
#ifdef CPC_HAVE_MPI
    /* Under a launcher every candidate is one MPI job of this process: MPI
     * is initialised once here and kept alive between them (a job's end
     * finalises the MPI it initialised, and MPI cannot start twice). */
    bool held = false;
    if (!st && cpc_mpi_launched() && !(opt->transport && strcmp(opt->transport, "local") == 0)) {
        st = cpc_mpi_init(NULL, NULL);
        if (!st) {
            cpc_mpi_hold(true);
            held = true;
        }
    }
#endif
    for (int i = 0; i < sel->n_candidates && !st; i++) {
        const cpc_candidate *c = &sel->candidates[i];
        if (!c->ok)
            continue;
        /* the plan's own candidate may appear twice (validate.h): measure once */
        int C = c->cfg_degree >= 1 ? c->cfg_degree : 1, T = c->tp_degree >= 1 ? c->tp_degree : 1;
        bool dup = false;
        for (int e = 0; e < out->n_entries; e++)
            dup = dup || (out->entries[e].variant == c->variant &&
                          out->entries[e].ring_degree == c->ring_degree &&
                          out->entries[e].ulysses_degree == c->ulysses_degree &&
                          out->entries[e].cfg_degree == C && out->entries[e].tp_degree == T);
        if (dup)
            continue;
        /* the candidate's outer axes (validate.h THE OUTER AXES): its C*T
         * groups of R x U ranks run (run.h), on a shallow copy of the plan.
         * Its measurement is keyed by the (c, t) sub-plan, the problem the
         * cost model prices for this candidate (cpc_cost_price_candidate
         * gets cpc_plan_sub's plan): (C, T) pairs with the same R x U are
         * different problems (batch B/C, heads H/T). */
        cpc_plan cp = *plan, sub;
        cp.parallel.cfg_degree = C;
        cp.parallel.tp_degree = T;
        if (!cpc_plan_sub(&cp, C, T, &sub)) {
            st = cpc_error(CPC_E_INTERNAL, "--tune: cfg_degree %d x tp_degree %d does not split the plan", C, T);
            break;
        }
        cpc_job *job = NULL;
        st = cpc_job_from_plan(&cp, c->variant, c->ring_degree, c->ulysses_degree, &job);
        if (has_error(st)) {
            cpc_job_free(job);
            break;
        }
        cpc_status_free(st);
        st = NULL;
        cpc_run_options ro;
        cpc_run_options_default(&ro);
        ro.backend = out->backend;
        ro.transport = opt->transport ? opt->transport : "auto";
        ro.check = false;
        ro.warmup = warmup;
        ro.iters = iters;
        ro.timeout_s = opt->timeout_s;
        cpc_run_report rep;
        bool root = true;
        st = cpc_job_run(job, &ro, &rep, &root);
        cpc_job_free(job);
        if (st) {
            cpc_status_prefix(st, "--tune: %s %dx%d", cpc_variant_name(c->variant),
                              c->ring_degree, c->ulysses_degree);
            cpc_run_report_clear(&rep);
            break;
        }
        if (is_root)
            *is_root = root;
        if (root) {
            cpc_tune_entry *e = &out->entries[out->n_entries++];
            e->variant = c->variant;
            e->ring_degree = c->ring_degree;
            e->ulysses_degree = c->ulysses_degree;
            e->cfg_degree = C;
            e->tp_degree = T;
            e->ms_per_layer = rep.ms_per_iter;
            e->predicted_ms_per_layer = c->predicted_ms_per_layer;
            cpc_measurement m = {.variant = c->variant, .ring_degree = c->ring_degree,
                                 .ulysses_degree = c->ulysses_degree,
                                 .ms_per_layer = rep.ms_per_iter > 0 ? rep.ms_per_iter : 1e-6};
            cpc_measure_key(&sub, m.key, sizeof m.key);
            snprintf(m.backend, sizeof m.backend, "%s", out->backend);
            st = cpc_measurements_put(&out->measured, &m);
            if (opt->log)
                fprintf(opt->log, "  %-17s %5dx%-5d cfg %d x tp %d %10.3f ms per layer measured (predicted %.3f)\n",
                        cpc_variant_name(c->variant), c->ring_degree, c->ulysses_degree, C, T,
                        rep.ms_per_iter, c->predicted_ms_per_layer);
        }
        cpc_run_report_clear(&rep);
    }
#ifdef CPC_HAVE_MPI
    if (held) {
        cpc_mpi_hold(false);
        cpc_mpi_finalize();
    }
#endif
    cpc_compiled_free(&cc);
    return st;
}
