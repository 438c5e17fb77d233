/*
 * api_compilation.c - include/cpc/compilation.h over the compiler driver
 * (compile.h: cpc_compile_file, cpc_compiled), the schedule's text form
 * (program.h), kernel emission (codegen.h) and the IR's atomic writes
 * (fileio.h).  Every accessor takes NULL as "nothing compiled".
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cpc/cpc.h"

#include "api_options.h"
#include "codegen.h"
#include "compile.h"
#include "fileio.h"
#include "program.h"
#include "status.h"

struct cpc_compilation {
    cpc_compiled c;
    char *profile_path; /* cluster.profile as resolved, or NULL */
};

/* cluster.profile as the cost model resolves it (relative to the plan file). */
static char *resolve_profile(const cpc_plan *plan)
{
    const char *p = plan ? plan->cluster.profile : NULL;
    if (!p)
        return NULL;
    const char *slash = plan->file ? strrchr(plan->file, '/') : NULL;
    char *out = NULL;
    if (p[0] != '/' && slash) {
        if (asprintf(&out, "%.*s/%s", (int)(slash - plan->file), plan->file, p) < 0)
            out = NULL;
    } else {
        out = strdup(p);
    }
    return out;
}

cpc_status *cpc_compilation_new(const char *path, const cpc_compile_options *opts,
                                cpc_compile_stage until, cpc_compilation **out)
{
    if (!out)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_new: out must not be NULL");
    *out = NULL;
    if (!path)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_new: path must not be NULL");
    if ((unsigned)until > CPC_STAGE_CODEGEN)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_new: unknown stage %d", (int)until);
    cpc_compile_options d;
    cpc_compile_options_init(&d, sizeof d);
    cpc_status *ost = cpc_api_read_options(&d, sizeof d, CPC_COMPILE_OPTIONS_SIZE_V1, opts,
                                           "cpc_compilation_new", "cpc_compile_options");
    if (ost)
        return ost;
    opts = &d;
    cpc_compilation *c = calloc(1, sizeof *c);
    if (!c)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    cpc_compile_opts o = {
        .sets = opts->sets, .n_sets = opts->n_sets, .lua = opts->lua, .arch = opts->arch,
        .kernels = opts->kernels,
        .until = until == CPC_STAGE_VALIDATE ? CPC_UNTIL_VALIDATE
                 : until == CPC_STAGE_VERIFY ? CPC_UNTIL_VERIFY
                                             : CPC_UNTIL_CODEGEN,
    };
    (void)cpc_compile_file(path, &o, &c->c); /* the outcome is in c->c.diags */
    if (c->c.plan && c->c.plan->cluster.profile) {
        c->profile_path = resolve_profile(c->c.plan);
        if (!c->profile_path) {
            cpc_compilation_free(c);
            return cpc_error(CPC_E_NOMEM, "out of memory");
        }
    }
    *out = c;
    return NULL;
}

void cpc_compilation_free(cpc_compilation *c)
{
    if (!c)
        return;
    cpc_compiled_free(&c->c);
    free(c->profile_path);
    free(c);
}

const cpc_status *cpc_compilation_diagnostics(const cpc_compilation *c) { return c ? c->c.diags : NULL; }

int cpc_compilation_count(const cpc_compilation *c, cpc_severity sev)
{
    return c ? cpc_status_count(c->c.diags, sev) : 0;
}

bool cpc_compilation_ok(const cpc_compilation *c) { return c && !cpc_status_has_error(c->c.diags); }
bool cpc_compilation_validated(const cpc_compilation *c) { return c && c->c.validated; }

int cpc_compilation_n_candidates(const cpc_compilation *c)
{
    return c && c->c.validated ? c->c.sel.n_candidates : 0;
}

int cpc_compilation_selected(const cpc_compilation *c)
{
    if (!cpc_compilation_ok(c))
        return -1;
    const cpc_candidate *s = cpc_compiled_selected(&c->c);
    return s ? (int)(s - c->c.sel.candidates) : -1;
}

cpc_status *cpc_compilation_candidate(const cpc_compilation *c, int i, cpc_candidate_info *info,
                                      size_t size)
{
    size_t need = offsetof(cpc_candidate_info, errors) + sizeof info->errors;
    if (!info || size < need)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_candidate: info too small (%zu bytes)", size);
    if (i < 0 || i >= cpc_compilation_n_candidates(c))
        return cpc_error(CPC_E_USAGE, "candidate %d is out of range (%d candidates)", i,
                         cpc_compilation_n_candidates(c));
    const cpc_candidate *k = &c->c.sel.candidates[i];
    cpc_candidate_info v = {
        .variant = cpc_variant_name(k->variant),
        .ring_degree = k->ring_degree,
        .ulysses_degree = k->ulysses_degree,
        .ok = k->ok,
        .selected = cpc_compilation_selected(c) == i,
        .priced = k->priced,
        .ms_per_layer = k->predicted_ms_per_layer,
        .ms_per_forward = k->predicted_ms_per_forward,
        .ms_per_step = k->predicted_ms_per_step,
        .ms_per_image = k->predicted_ms_per_image,
        .memory_bytes_per_rank = k->memory_bytes_per_rank,
        .bytes_sent_per_rank = k->bytes_sent_per_rank,
        .errors = k->errors,
        .measured = k->measured,
        .measured_ms_per_layer = k->measured ? k->measured_ms_per_layer : 0,
        .cfg_degree = k->cfg_degree >= 1 ? k->cfg_degree : 1,
        .tp_degree = k->tp_degree >= 1 ? k->tp_degree : 1,
        .backward_priced = k->bwd_priced,
        .ms_backward_per_layer = k->bwd_priced ? k->predicted_ms_backward_per_layer : 0,
        .backward_bytes_sent_per_rank = k->bwd_priced ? k->bwd_bytes_sent_per_rank : 0,
        .backward_memory_bytes_per_rank = k->bwd_priced ? k->bwd_memory_bytes_per_rank : 0,
        .gemm_ms_per_step = k->priced ? k->pred.gemm_ms_per_step : 0,
        .attn_ms_per_step = k->priced ? k->pred.attn_ms_per_step : 0,
        .memory_ms_per_step = k->priced ? k->pred.memory_ms_per_step : 0,
        .comm_ms_per_step = k->priced ? k->pred.comm_ms_per_step : 0,
        .host_ms_per_step = k->priced ? k->pred.host_exposed_ms_per_step : 0,
        .text_encoder_ms = k->priced ? k->pred.text_encoder_ms : 0,
        .vae_decode_ms = k->priced ? k->pred.vae_decode_ms : 0,
        .weights_bytes_per_rank = k->priced ? k->pred.weights_bytes_per_rank : 0,
        .activation_bytes_per_rank = k->priced ? k->pred.activation_bytes_per_rank : 0,
        .vae_bytes_per_rank = k->priced ? k->pred.vae_bytes_per_rank : 0,
    };
    memcpy(info, &v, sizeof v < size ? sizeof v : size);
    return NULL;
}

const char *cpc_compilation_requested_variant(const cpc_compilation *c)
{
    if (!c || !c->c.validated || c->c.sel.requested >= CPC_VARIANT__COUNT)
        return NULL;
    return cpc_variant_name(c->c.sel.requested);
}

bool cpc_compilation_fell_back(const cpc_compilation *c) { return c && c->c.validated && c->c.sel.fell_back; }
const char *cpc_compilation_device_name(const cpc_compilation *c) { return c ? c->c.device.name : ""; }
const char *cpc_compilation_plan_name(const cpc_compilation *c) { return c && c->c.plan ? c->c.plan->name : NULL; }
int cpc_compilation_layers(const cpc_compilation *c) { return c && c->c.plan ? c->c.plan->model.layers : 1; }
int64_t cpc_compilation_parameters(const cpc_compilation *c) { return c && c->c.plan ? c->c.plan->model.parameters : 0; }
int cpc_compilation_steps(const cpc_compilation *c) { return c && c->c.plan ? c->c.plan->input.steps : 0; }
const char *cpc_compilation_script_path(const cpc_compilation *c) { return c ? c->c.script_path : NULL; }
const char *cpc_compilation_profile_path(const cpc_compilation *c) { return c ? c->profile_path : NULL; }

cpc_status *cpc_compilation_print_schedule(const cpc_compilation *c, FILE *out, int rank)
{
    if (!c || !c->c.program)
        return cpc_error(CPC_E_USAGE, "no schedule: the plan was not scheduled");
    int RU = c->c.program->layout.P;
    int C = cpc_plan_cfg_degree(c->c.plan), T = cpc_plan_tp_degree(c->c.plan);
    int P = RU * C * T;
    if (rank >= 0 && rank >= P) {
        if (P == 1)
            return cpc_error(CPC_E_USAGE, "--rank %d: the plan has only rank 0", rank);
        return cpc_error(CPC_E_USAGE, "--rank %d: the plan has ranks 0..%d", rank, P - 1);
    }
    if (rank >= 0 && C * T > 1) {
        /* world rank ((c*R + r)*U + u)*T + t is rank r*U + u of group (c, t) */
        int q = rank / T % RU;
        fprintf(out, "# world rank %d: rank %d of group (c %d, t %d) (cfg_degree %d x tp_degree %d)\n", rank, q,
                rank / T / RU, rank % T, C, T);
        rank = q;
    }
    return cpc_program_print(out, c->c.program, rank);
}

int cpc_compilation_n_kernels(const cpc_compilation *c) { return c ? c->c.n_kernels : 0; }

cpc_status *cpc_compilation_emit_kernels(const cpc_compilation *c, const char *dir)
{
    if (!dir)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_emit_kernels: dir must not be NULL");
    if (!c || c->c.n_kernels == 0)
        return NULL;
    return cpc_codegen_emit(dir, c->c.kernels, c->c.n_kernels);
}

bool cpc_compilation_kernel_summary(const cpc_compilation *c, cpc_kernel_summary *s, size_t size)
{
    if (!c || !s || c->c.n_kernels <= 0 || !c->c.kernels[0].ptx)
        return false;
    const cpc_compiled *cc = &c->c;
    int nf = 0, spills = 0;
    const cpc_kernel_fn_report *attn = NULL; /* the attention kernel used by default */
    for (int i = 0; i < cc->n_kernels; i++)
        for (int f = 0; f < cc->kernels[i].n_fns; f++) {
            const cpc_kernel_fn_report *r = &cc->kernels[i].fns[f];
            nf++;
            spills += r->spill_store_bytes > 0 || r->spill_load_bytes > 0;
            if (strcmp(cc->kernels[i].name, "attention") == 0 &&
                (!attn || strcmp(r->name, "cpc_flash_attn_mma") == 0 ||
                 (strcmp(attn->name, "cpc_attn_rowwarp") == 0 &&
                  strcmp(r->name, "cpc_flash_attn_tc") == 0)))
                attn = r;
        }
    cpc_kernel_summary v = {
        .modules = cc->n_kernels,
        .arch = cc->kernels[0].arch,
        .functions = nf,
        .spilling_functions = spills,
        .attention = attn ? attn->name : NULL,
        .attention_registers = attn ? attn->registers : 0,
    };
    memcpy(s, &v, sizeof v < size ? sizeof v : size);
    return true;
}

cpc_status *cpc_compilation_artifact(const cpc_compilation *c, cpc_artifact **out)
{
    if (!out)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_artifact: out must not be NULL");
    *out = NULL;
    if (!c)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_artifact: the compilation is NULL");
    if (!cpc_compilation_ok(c))
        return cpc_error(CPC_E_INTERNAL, "no artifact: the plan was not compiled");
    return cpc_compiled_to_artifact(&c->c, out);
}

cpc_status *cpc_compilation_write(const cpc_compilation *c, const char *path)
{
    if (!path)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_write: path must not be NULL");
    if (!c)
        return cpc_error(CPC_E_USAGE, "cpc_compilation_write: the compilation is NULL");
    if (!cpc_compilation_ok(c))
        return cpc_error(CPC_E_INTERNAL, "no artifact: the plan was not compiled");
    return cpc_compiled_write(&c->c, path);
}
