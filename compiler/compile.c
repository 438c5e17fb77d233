/* compile.c - see compile.h */
#include "compile.h"

#include <stdlib.h>
#include <string.h>

#include "artifact.h"
#include "lua_script.h"
#include "plan_load.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "verify.h"
#include "verify_bwd.h"

static bool add(cpc_compiled *c, cpc_status *st)
{
    bool err = cpc_status_has_error(st);
    cpc_status_append(&c->diags, st);
    return !err;
}

/* The plan key that chose the schedule: parallel.variant, else a diffusers
 * flag or degree that implied the variant, else the parallel section, else
 * cluster.world_size (variant auto).  Its value's span. */
static cpc_span schedule_span(const cpc_plan *p)
{
    static const char *const keys[] = {"parallel.variant", "parallel.ulysses_anything", "parallel.ring_anything",
                                       "parallel.ring_degree", "parallel.ulysses_degree", "parallel",
                                       "cluster.world_size", NULL};
    for (int k = 0; keys[k]; k++)
        for (int i = 0; i < p->n_key_spans; i++)
            if (p->key_spans[i].key && strcmp(p->key_spans[i].key, keys[k]) == 0)
                return strcmp(keys[k], "parallel") == 0 ? p->key_spans[i].key_span : p->key_spans[i].value_span;
    return CPC_NO_SPAN;
}

/* SPEC section 3: every diagnostic has a file:line:col.  CP051 diagnostics
 * about ops the compiler built (they have no span of their own; ops a Lua
 * script changed point at the script) and the "schedule not verified"
 * warning point at the key that chose the schedule. */
static cpc_status *place_schedule_diags(cpc_status *st, const cpc_plan *p)
{
    cpc_span sp = schedule_span(p);
    if (sp.line <= 0 || !sp.file)
        return st;
    for (cpc_status *d = st; d && d != &cpc_status_oom; d = d->next) {
        if (d->rule != CPC_RULE_VERIFY || d->span.line > 0)
            continue;
        char *f = strdup(sp.file);
        if (!f)
            continue;
        free((char *)d->span.file);
        d->span = (cpc_span){f, sp.line, sp.col};
    }
    return st;
}

/* The script path: --lua as given, or schedule.script relative to the plan. */
static char *script_path(const cpc_plan *plan, const cpc_compile_opts *o)
{
    if (o->lua)
        return strdup(o->lua);
    if (!plan->schedule.script)
        return NULL;
    const char *s = plan->schedule.script;
    const char *slash = plan->file ? strrchr(plan->file, '/') : NULL;
    if (s[0] == '/' || !slash)
        return strdup(s);
    char *p = NULL;
    if (asprintf(&p, "%.*s/%s", (int)(slash - plan->file), plan->file, s) < 0)
        return NULL;
    return p;
}

const cpc_candidate *cpc_compiled_selected(const cpc_compiled *c)
{
    if (!c->validated || c->sel.selected < 0 || c->sel.selected >= c->sel.n_candidates)
        return NULL;
    return &c->sel.candidates[c->sel.selected];
}

static bool compile_loaded(const cpc_compile_opts *o, cpc_compiled *c);

bool cpc_compile_file(const char *path, const cpc_compile_opts *o, cpc_compiled *c)
{
    memset(c, 0, sizeof *c);
    c->sel.selected = -1;
    if (!add(c, cpc_plan_load_file(path, o->sets, o->n_sets, &c->plan)) || !c->plan)
        return false;
    return compile_loaded(o, c);
}

bool cpc_compile_string(const char *text, size_t len, const char *name, const cpc_compile_opts *o,
                        cpc_compiled *c)
{
    memset(c, 0, sizeof *c);
    c->sel.selected = -1;
    if (!add(c, cpc_plan_load_string(text, len, name, o->sets, o->n_sets, &c->plan)) || !c->plan)
        return false;
    return compile_loaded(o, c);
}

/* Every stage after load (the plan is in c->plan). */
static bool compile_loaded(const cpc_compile_opts *o, cpc_compiled *c)
{
    cpc_lua_script *script = NULL;
    c->plan->cluster.profile_pending = o->profile_pending;
    c->script_path = script_path(c->plan, o);
    if (c->script_path &&
        !add(c, cpc_lua_open_file(c->script_path, NULL, &script)))
        return false;

    if (!add(c, cpc_plan_device(c->plan, &c->device)))
        goto fail;
    /* FlashAttention-3 is written for Hopper (sm_90) only: elsewhere the
     * cost model prices it as fa2 (cost.h ATTENTION KERNELS), which the
     * user should hear (new-user trial: fa3 on an L40S passed silently). */
    if (c->plan->runtime.attention_kernel == CPC_KERNEL_FA3 && c->device.arch > 0 &&
        !(c->device.arch >= 90 && c->device.arch < 100)) {
        cpc_status *w = cpc_diag(CPC_E_PLAN, 0, CPC_SEV_WARNING,
                                 cpc_plan_span(c->plan, "runtime.attention_kernel", true),
                                 "attention_kernel fa3 (FlashAttention-3) runs on Hopper (sm_90) only; "
                                 "device %s is sm_%.0f, so it is priced as fa2",
                                 c->device.name, c->device.arch);
        cpc_status_set_hint(w, "set runtime.attention_kernel to fa2 or sdpa for this device");
        add(c, w);
    }
    cpc_status *st = cpc_validate_priced(c->plan, cpc_cost_price_candidate, NULL, &c->sel);
    c->validated = true;
    if (!add(c, st))
        goto fail;

    /* Lua choose(): for auto and fallback-auto selections */
    if (script && cpc_lua_has_choose(script) &&
        (c->sel.requested == CPC_VARIANT_AUTO || c->sel.fell_back)) {
        int chosen = c->sel.selected;
        if (!add(c, cpc_lua_choose(script, c->plan, c->sel.candidates, c->sel.n_candidates,
                                   &chosen)))
            goto fail;
        c->sel.selected = chosen;
    }
    if (o->until == CPC_UNTIL_VALIDATE)
        goto done;

    const cpc_candidate *cand = cpc_compiled_selected(c);
    if (!cand) {
        add(c, cpc_error(CPC_E_INTERNAL, "validation accepted the plan but selected nothing"));
        goto fail;
    }
    /* The outer axes (validate.h THE OUTER AXES): the resolved plan records
     * the chosen C and T; the program is the R x U program of one (c, t)
     * group's sub-plan (every group runs the same one on its own slice). */
    c->plan->parallel.cfg_degree = cand->cfg_degree >= 1 ? cand->cfg_degree : 1;
    c->plan->parallel.tp_degree = cand->tp_degree >= 1 ? cand->tp_degree : 1;
    cpc_plan sub_plan;
    const cpc_plan *sp = c->plan;
    if (c->plan->parallel.cfg_degree * c->plan->parallel.tp_degree > 1) {
        if (!cpc_plan_sub(c->plan, c->plan->parallel.cfg_degree, c->plan->parallel.tp_degree, &sub_plan)) {
            add(c, cpc_error(CPC_E_INTERNAL, "the selected cfg/tp split does not cut the plan"));
            goto fail;
        }
        sp = &sub_plan;
    }
    if (!add(c, cpc_schedule_build(sp, cand->variant, cand->ring_degree,
                                   cand->ulysses_degree, &c->program)))
        goto fail;
    if (script && cpc_lua_has_schedule(script)) {
        /* cpc_lua_schedule verifies what the script returns (CP051) */
        if (!add(c, place_schedule_diags(cpc_lua_schedule(script, sp, c->program), c->plan)))
            goto fail;
        c->script_applied = true;
    } else if (!add(c, place_schedule_diags(cpc_verify(c->program), c->plan))) {
        goto fail;
    }
    /* price the final program: what a script returned is what is priced */
    if (!add(c, cpc_price_program(sp, c->program, &c->device, &c->pred)))
        goto fail;
    c->priced = true;
    {
        cpc_candidate *sc = &c->sel.candidates[c->sel.selected];
        sc->predicted_ms_per_layer = c->pred.ms_per_layer;
        sc->predicted_ms_per_forward = c->pred.ms_per_forward;
        sc->memory_bytes_per_rank = c->pred.memory_bytes_per_rank;
        sc->bytes_sent_per_rank = c->pred.bytes_sent_per_rank;
        sc->predicted_ms_per_step = c->pred.ms_per_step;
        sc->predicted_ms_per_image = c->pred.ms_per_image;
        sc->pred = c->pred;
        sc->priced = true;
    }
    /* SPEC section 10: a training plan compiles, proves and prices its
     * backward program too (CP018 for a Lua schedule script) */
    if (c->plan->input.mode == CPC_MODE_TRAINING) {
        cpc_status *bst;
        if (c->script_applied) {
            /* a script's schedule() replaced the forward (--lua; the plan's
             * schedule.script is refused at pricing already): scripts
             * return no backward program to pair with it */
            bst = cpc_diag(CPC_E_PLAN, CPC_RULE_TRAIN, CPC_SEV_ERROR, schedule_span(c->plan),
                           "training: the Lua schedule script %s replaced the forward program, and scripts "
                           "return no backward program yet",
                           c->script_path ? c->script_path : "");
            cpc_status_set_hint(bst, "drop the script to train with the built-in schedule, or use "
                                     "input.mode: inference for the forward pass");
        } else {
            bst = cpc_schedule_build_backward(sp, cand->variant, cand->ring_degree, cand->ulysses_degree,
                                              &c->backward);
        }
        if (!bst)
            bst = cpc_verify_backward(c->backward);
        if (!add(c, place_schedule_diags(bst, c->plan)))
            goto fail;
        if (!add(c, cpc_price_program(sp, c->backward, &c->device, &c->bwd_pred)))
            goto fail;
        c->bwd_priced = true;
        cpc_candidate *sc = &c->sel.candidates[c->sel.selected];
        sc->bwd_priced = true;
        sc->predicted_ms_backward_per_layer = c->bwd_pred.ms_per_layer;
        sc->bwd_bytes_sent_per_rank = c->bwd_pred.bytes_sent_per_rank;
        sc->bwd_memory_bytes_per_rank = c->bwd_pred.memory_bytes_per_rank;
    }
    if (o->until == CPC_UNTIL_VERIFY || !o->kernels)
        goto done;

    if (!cpc_codegen_available()) {
        add(c, cpc_diag(CPC_E_UNSUPPORTED, 0, CPC_SEV_WARNING, CPC_NO_SPAN,
                        "no kernels generated: cpc was built without the CUDA toolkit (NVRTC); "
                        "the artifact runs on the CPU backend only"));
        goto done;
    }
    cpc_kernel_spec spec = cpc_kernel_spec_of(sp);
    if (!add(c, cpc_codegen_sources(&spec, o->arch ? o->arch : "sm_90", &c->kernels,
                                    &c->n_kernels)))
        goto fail;
    for (int i = 0; i < c->n_kernels; i++)
        if (!add(c, cpc_codegen_compile(&c->kernels[i])))
            goto fail;
    /* ptxas' report per function (registers, stack, spills), recorded in the
     * artifact; a function that spills to local memory is a warning. */
    for (int i = 0; i < c->n_kernels; i++) {
        cpc_kernel *k = &c->kernels[i];
        cpc_status *rst = cpc_codegen_report(k);
        if (rst) {
            add(c, cpc_diag(CPC_E_UNSUPPORTED, 0, CPC_SEV_WARNING, CPC_NO_SPAN,
                            "kernel module '%s': no ptxas report for %s: %s", k->name, k->arch,
                            rst->message));
            cpc_status_free(rst);
            continue;
        }
        for (int f = 0; f < k->n_fns; f++)
            if (k->fns[f].spill_store_bytes > 0 || k->fns[f].spill_load_bytes > 0)
                add(c, cpc_diag(CPC_E_RUNTIME, 0, CPC_SEV_WARNING, CPC_NO_SPAN,
                                "kernel %s (%s): spills to local memory for %s: %d bytes stored, "
                                "%d bytes loaded (ptxas, %d registers)",
                                k->fns[f].name, k->name, k->arch, k->fns[f].spill_store_bytes,
                                k->fns[f].spill_load_bytes, k->fns[f].registers));
    }

done:
    cpc_lua_close(script);
    return !cpc_status_has_error(c->diags);
fail:
    cpc_lua_close(script);
    return false;
}

cpc_status *cpc_compiled_to_artifact(const cpc_compiled *c, cpc_artifact **out)
{
    *out = NULL;
    if (!c->program || !c->plan)
        return cpc_error(CPC_E_INTERNAL, "nothing compiled to make an artifact of");
    cpc_artifact *a = NULL;
    cpc_status *st = cpc_artifact_create(c->plan, c->program, &a);
    for (int i = 0; !st && i < c->n_kernels; i++)
    {
        st = cpc_artifact_add_kernel(a, c->kernels[i].name, c->kernels[i].arch,
                                     c->kernels[i].source, c->kernels[i].ptx ? c->kernels[i].ptx : "");
        if (!st && c->kernels[i].n_fns > 0)
            st = cpc_artifact_set_kernel_report(a, c->kernels[i].name, c->kernels[i].fns,
                                                c->kernels[i].n_fns);
    }
    if (!st && c->backward)
        st = cpc_artifact_set_backward(a, c->backward);
    if (!st && c->priced)
        st = cpc_artifact_set_predictions(a, &c->pred);
    if (!st && c->bwd_priced) {
        const struct { const char *name; double v; } b[] = {
            {"ms_backward_per_layer", c->bwd_pred.ms_per_layer},
            {"backward_compute_ms_per_layer", c->bwd_pred.compute_ms_per_layer},
            {"backward_comm_ms_per_layer", c->bwd_pred.comm_ms_per_layer},
            {"backward_bytes_sent_per_rank", (double)c->bwd_pred.bytes_sent_per_rank},
            {"backward_memory_bytes_per_rank", (double)c->bwd_pred.memory_bytes_per_rank},
        };
        for (size_t i = 0; !st && i < sizeof b / sizeof b[0]; i++)
            st = cpc_artifact_set_prediction(a, b[i].name, b[i].v);
    }
    if (st) {
        cpc_artifact_free(a);
        return st;
    }
    *out = a;
    return NULL;
}

cpc_status *cpc_compiled_write(const cpc_compiled *c, const char *path)
{
    if (c->plan && c->plan->model.linear_attention)
        return cpc_error(CPC_E_INPUT,
                         "%s: model.attention is linear: cpc prices linear attention (cpc --check, "
                         "--explain) but runs softmax attention only, so an artifact would compute "
                         "another function; drop the key to run softmax attention",
                         c->plan->file ? c->plan->file : "plan");
    cpc_artifact *a = NULL;
    cpc_status *st = cpc_compiled_to_artifact(c, &a);
    if (!st)
        st = cpc_artifact_write(a, path);
    cpc_artifact_free(a);
    return st;
}

void cpc_compiled_free(cpc_compiled *c)
{
    if (!c)
        return;
    cpc_plan_free(c->plan);
    cpc_selection_free(&c->sel);
    cpc_program_free(c->program);
    cpc_program_free(c->backward);
    cpc_kernels_free(c->kernels, c->n_kernels);
    free(c->script_path);
    cpc_status_free(c->diags);
    memset(c, 0, sizeof *c);
}
