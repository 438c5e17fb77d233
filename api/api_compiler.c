/*
 * api_compiler.c - the public status accessors, cpc_version and the compiler
 * calls of include/cpc/compiler.h over the compiler layer (compile.h) and the
 * IR's artifact format (artifact.h).  Functions whose internal signature is
 * already the public one (cpc_status_free, cpc_artifact_write, ...) are
 * exported as they are (api/libcpc.map lists every exported symbol).
 */
#include <stdlib.h>
#include <string.h>

#include "cpc/cpc.h"

#include "artifact.h"
#include "compile.h"
#include "api_options.h"
#include "status.h"
#include "verify.h"
#include "verify_bwd.h"

/* ---- status ---------------------------------------------------------------- */

cpc_code cpc_status_code(const cpc_status *st) { return st ? st->code : CPC_OK; }
cpc_severity cpc_status_severity(const cpc_status *st) { return st ? st->severity : CPC_SEV_NOTE; }
const char *cpc_status_message(const cpc_status *st) { return st ? st->message : NULL; }
int cpc_status_rule(const cpc_status *st) { return st ? st->rule : 0; }
const char *cpc_status_hint(const cpc_status *st) { return st ? st->hint : NULL; }
const cpc_status *cpc_status_next(const cpc_status *st) { return st ? st->next : NULL; }
const cpc_status *cpc_status_notes(const cpc_status *st) { return st ? st->notes : NULL; }

void cpc_status_position(const cpc_status *st, const char **file, int *line, int *column)
{
    if (file)
        *file = st ? st->span.file : NULL;
    if (line)
        *line = st ? st->span.line : 0;
    if (column)
        *column = st ? st->span.col : 0;
}

const char *cpc_version(void) { return CPC_VERSION; }

bool cpc_have_mpi(void)
{
#ifdef CPC_HAVE_MPI
    return true;
#else
    return false;
#endif
}

bool cpc_have_cuda(void)
{
#ifdef CPC_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

bool cpc_have_nccl(void)
{
#ifdef CPC_HAVE_NCCL
    return true;
#else
    return false;
#endif
}

bool cpc_have_cudnn(void)
{
#ifdef CPC_HAVE_CUDNN
    return true;
#else
    return false;
#endif
}

/* ---- compile ------------------------------------------------------------------ */

void cpc_compile_options_init(cpc_compile_options *o, size_t size)
{
    cpc_compile_options d = {.size = sizeof d};
    cpc_api_init_options(o, size, &d, sizeof d);
}

/* Splits c->diags into the error chain (returned) and the rest (*diagnostics,
 * or freed when diagnostics is NULL). */
static cpc_status *split_diags(cpc_compiled *c, cpc_status **diagnostics)
{
    cpc_status *errors = NULL, *rest = NULL;
    cpc_status **et = &errors, **rt = &rest;
    cpc_status *d = c->diags;
    c->diags = NULL;
    while (d) {
        cpc_status *next = d->next;
        d->next = NULL;
        if (d->severity == CPC_SEV_ERROR) {
            *et = d;
            et = &d->next;
        } else {
            *rt = d;
            rt = &d->next;
        }
        d = next;
    }
    if (diagnostics)
        *diagnostics = rest;
    else
        cpc_status_free(rest);
    return errors;
}

static cpc_status *finish(bool ok, cpc_compiled *c, cpc_artifact **out, cpc_status **diagnostics)
{
    cpc_status *st = split_diags(c, diagnostics);
    if (ok && !st)
        st = cpc_compiled_to_artifact(c, out);
    else if (!st)
        st = cpc_error(CPC_E_INTERNAL, "the compiler failed without a diagnostic");
    cpc_compiled_free(c);
    return st;
}

/* The compiler's options for the caller's (NULL: defaults); a bad size is
 * CPC_E_USAGE (compiler.h THE SIZE MEMBER). */
static cpc_status *internal_opts(const cpc_compile_options *caller, cpc_compile_opts *o,
                                 const char *fn)
{
    cpc_compile_options d;
    cpc_compile_options_init(&d, sizeof d);
    cpc_status *st = cpc_api_read_options(&d, sizeof d, CPC_COMPILE_OPTIONS_SIZE_V1, caller, fn,
                                          "cpc_compile_options");
    if (st)
        return st;
    const cpc_compile_options *opts = &d;
    memset(o, 0, sizeof *o);
    o->sets = opts->sets;
    o->n_sets = opts->n_sets;
    o->lua = opts->lua;
    o->arch = opts->arch;
    o->kernels = opts->kernels;
    o->until = opts->kernels ? CPC_UNTIL_CODEGEN : CPC_UNTIL_VERIFY;
    return NULL;
}

cpc_status *cpc_compile_plan_file(const char *path, const cpc_compile_options *opts,
                                  cpc_artifact **out, cpc_status **diagnostics)
{
    if (out)
        *out = NULL;
    if (diagnostics)
        *diagnostics = NULL;
    if (!path || !out)
        return cpc_error(CPC_E_USAGE, "cpc_compile_plan_file: path and out must not be NULL");
    cpc_compile_opts o;
    cpc_status *ost = internal_opts(opts, &o, "cpc_compile_plan_file");
    if (ost)
        return ost;
    cpc_compiled c;
    bool ok = cpc_compile_file(path, &o, &c);
    return finish(ok, &c, out, diagnostics);
}

cpc_status *cpc_compile_plan_string(const char *yaml, size_t len, const char *name,
                                    const cpc_compile_options *opts, cpc_artifact **out,
                                    cpc_status **diagnostics)
{
    if (out)
        *out = NULL;
    if (diagnostics)
        *diagnostics = NULL;
    if (!yaml || !out)
        return cpc_error(CPC_E_USAGE, "cpc_compile_plan_string: yaml and out must not be NULL");
    cpc_compile_opts o;
    cpc_status *ost = internal_opts(opts, &o, "cpc_compile_plan_string");
    if (ost)
        return ost;
    cpc_compiled c;
    bool ok = cpc_compile_string(yaml, len ? len : strlen(yaml), name, &o, &c);
    return finish(ok, &c, out, diagnostics);
}

cpc_status *cpc_artifact_load(const char *path, cpc_artifact **out)
{
    if (!out)
        return cpc_error(CPC_E_USAGE, "cpc_artifact_load: out must not be NULL");
    *out = NULL;
    if (!path)
        return cpc_error(CPC_E_USAGE, "cpc_artifact_load: path must not be NULL");
    cpc_artifact *a = NULL;
    cpc_status *st = cpc_artifact_read(path, &a);
    if (!st && !a)
        st = cpc_error(CPC_E_INTERNAL, "%s: the artifact reader returned nothing", path);
    if (!st)
        st = cpc_verify(a->program); /* never run an unproven program */
    if (!cpc_status_has_error(st) && a->backward)
        cpc_status_append(&st, cpc_verify_backward(a->backward));
    if (st && cpc_status_has_error(st)) {
        cpc_artifact_free(a);
        return st;
    }
    cpc_status_free(st); /* warnings only */
    *out = a;
    return NULL;
}

/* ---- queries ------------------------------------------------------------------ */

static const cpc_layout *layout_of(const cpc_artifact *a) { return &a->program->layout; }
static int axes_of(const cpc_artifact *a) { return cpc_plan_cfg_degree(a->plan) * cpc_plan_tp_degree(a->plan); }
/* World rank -> its rank in its (c, t) group's program (compiler.h THE OUTER AXES). */
static int group_rank_of(const cpc_artifact *a, int rank)
{
    return rank / cpc_plan_tp_degree(a->plan) % layout_of(a)->P;
}

/* A NULL artifact: the queries answer 0, false, NULL or CPC_DTYPE__COUNT
 * (compiler.h), the functions that return a status CPC_E_USAGE. */
const char *cpc_artifact_variant(const cpc_artifact *a) { return a ? cpc_variant_name(layout_of(a)->variant) : NULL; }
int cpc_artifact_world_size(const cpc_artifact *a) { return a ? layout_of(a)->P * axes_of(a) : 0; }
int cpc_artifact_cfg_degree(const cpc_artifact *a) { return a ? cpc_plan_cfg_degree(a->plan) : 0; }
int cpc_artifact_tp_degree(const cpc_artifact *a) { return a ? cpc_plan_tp_degree(a->plan) : 0; }

static cpc_status *null_artifact(const char *fn) { return cpc_error(CPC_E_USAGE, "%s: the artifact is NULL", fn); }

cpc_status *cpc_artifact_rank_slice(const cpc_artifact *a, int rank, cpc_rank_slice *out)
{
    if (!a)
        return null_artifact("cpc_artifact_rank_slice");
    if (!out)
        return cpc_error(CPC_E_USAGE, "cpc_artifact_rank_slice: out must not be NULL");
    const cpc_layout *L = layout_of(a);
    int P = cpc_artifact_world_size(a);
    if (rank < 0 || rank >= P)
        return cpc_error(CPC_E_USAGE, "rank %d is out of range (world size %d)", rank, P);
    int T = cpc_plan_tp_degree(a->plan);
    int H = a->plan->model.heads, Hkv = a->plan->model.kv_heads;
    memset(out, 0, sizeof *out);
    out->t = rank % T;
    out->group_rank = group_rank_of(a, rank);
    out->c = rank / T / L->P;
    out->group = out->c * T + out->t;
    out->batch_len = L->B;
    out->batch_start = (int64_t)out->c * L->B;
    out->head_len = L->H;
    out->head_start = (int64_t)out->t * L->H;
    out->kv_head_len = L->Hkv;
    out->kv_head_start = out->head_start / (H / Hkv);
    return NULL;
}
int cpc_artifact_ring_degree(const cpc_artifact *a) { return a ? layout_of(a)->R : 0; }
int cpc_artifact_ulysses_degree(const cpc_artifact *a) { return a ? layout_of(a)->U : 0; }
cpc_dtype cpc_artifact_dtype(const cpc_artifact *a) { return a ? layout_of(a)->dtype : CPC_DTYPE__COUNT; }
bool cpc_artifact_causal(const cpc_artifact *a) { return a && layout_of(a)->causal; }
bool cpc_artifact_key_padding(const cpc_artifact *a) { return a && a->plan->input.mask == CPC_MASK_KEY_PADDING; }
bool cpc_artifact_cross_attention(const cpc_artifact *a) { return a && layout_of(a)->cross; }
bool cpc_artifact_trains(const cpc_artifact *a) { return a && a->backward; }

void cpc_artifact_shape(const cpc_artifact *a, int64_t *batch, int64_t *tokens, int64_t *kv_tokens,
                        int64_t *heads, int64_t *kv_heads, int64_t *head_dim)
{
    int64_t *all[6] = {batch, tokens, kv_tokens, heads, kv_heads, head_dim};
    if (!a) {
        for (int i = 0; i < 6; i++)
            if (all[i])
                *all[i] = 0;
        return;
    }
    const cpc_layout *L = layout_of(a);
    if (batch)
        *batch = a->plan->input.batch;
    if (tokens)
        *tokens = L->S;
    if (kv_tokens)
        *kv_tokens = L->Skv;
    if (heads)
        *heads = a->plan->model.heads;
    if (kv_heads)
        *kv_heads = a->plan->model.kv_heads;
    if (head_dim)
        *head_dim = L->D;
}

cpc_status *cpc_artifact_shard_shape(const cpc_artifact *a, int rank, cpc_tensor_role role,
                                     int *ndim, int64_t shape[4])
{
    if (!a)
        return null_artifact("cpc_artifact_shard_shape");
    if (!ndim || !shape)
        return cpc_error(CPC_E_USAGE, "cpc_artifact_shard_shape: ndim and shape must not be NULL");
    const cpc_layout *L = layout_of(a);
    int P = cpc_artifact_world_size(a);
    if (rank < 0 || rank >= P)
        return cpc_error(CPC_E_USAGE, "rank %d is out of range (world size %d)", rank, P);
    /* the rank's own tokens: its shard plus every replicated segment (layout.h) */
    int64_t T = cpc_layout_rank_tokens(L, group_rank_of(a, rank));
    memset(shape, 0, 4 * sizeof *shape);
    switch (role) {
    case CPC_TENSOR_Q:
    case CPC_TENSOR_OUT:
    case CPC_TENSOR_DOUT:
    case CPC_TENSOR_DQ:
        *ndim = 4;
        shape[0] = L->B, shape[1] = T, shape[2] = L->H, shape[3] = L->D;
        return NULL;
    case CPC_TENSOR_K:
    case CPC_TENSOR_V:
    case CPC_TENSOR_DK:
    case CPC_TENSOR_DV:
        *ndim = 4;
        shape[0] = L->B, shape[1] = L->cross ? L->Skv : T, shape[2] = L->Hkv, shape[3] = L->D;
        return NULL;
    case CPC_TENSOR_LSE:
        *ndim = 3;
        shape[0] = L->B, shape[1] = L->H, shape[2] = T;
        return NULL;
    case CPC_TENSOR_MASK:
        *ndim = 2;
        shape[0] = L->B, shape[1] = L->Skv;
        return NULL;
    default:
        return cpc_error(CPC_E_USAGE, "unknown tensor role %d", (int)role);
    }
}

cpc_status *cpc_artifact_shard_runs(const cpc_artifact *a, int rank, cpc_token_run *runs, int max,
                                    int *n)
{
    if (!a)
        return null_artifact("cpc_artifact_shard_runs");
    if (!n || (max > 0 && !runs) || max < 0)
        return cpc_error(CPC_E_USAGE, "cpc_artifact_shard_runs: n must not be NULL, and runs must hold "
                                      "max >= 0 runs (max %d)", max);
    const cpc_layout *L = layout_of(a);
    int P = cpc_artifact_world_size(a);
    if (rank < 0 || rank >= P)
        return cpc_error(CPC_E_USAGE, "rank %d is out of range (world size %d)", rank, P);
    int cap = cpc_layout_max_rank_runs(L);
    cpc_run *tmp = calloc((size_t)cap, sizeof *tmp);
    if (!tmp)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    int k = cpc_layout_rank_runs(L, group_rank_of(a, rank), tmp, cap);
    for (int i = 0; i < k && i < max; i++)
        runs[i].start = tmp[i].start, runs[i].len = tmp[i].len;
    *n = k;
    free(tmp);
    return NULL;
}
