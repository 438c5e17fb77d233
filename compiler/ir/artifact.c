/*
 * artifact.c - the .cplan artifact: libyaml emitter to write, libyaml's
 * document loader to read, SHA-256 (OpenSSL EVP) over the text; see
 * artifact.h for the format.
 */
#include "artifact.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <yaml.h>

#include "fileio.h"
#include "plan_load.h"

#ifndef CPC_VERSION
#define CPC_VERSION "unknown"
#endif

#define HASH_PREFIX "sha256:"
#define HASH_HEX 64
#define MAX_OP_DEPTH 9 /* loops nested up to 8 (program.c's walk) + the top level */

static const char *const RANK_RULE = "p = r * ulysses_degree + u";
/* With cfg_degree C or tp_degree T > 1 (SPEC section 1, "All four axes"). */
static const char *const RANK_RULE_AXES = "p = ((c * ring_degree + r) * ulysses_degree + u) * tp_degree + t";

/* ==== emitting =============================================================== */

typedef struct emitter {
    yaml_emitter_t e;
    char *buf;
    size_t len, cap;
    bool bad;      /* emitter error */
    bool nomem;
} emitter;

static int em_write(void *data, unsigned char *bytes, size_t size)
{
    emitter *m = data;
    if (m->len + size + 1 > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;
        while (m->len + size + 1 > cap)
            cap *= 2;
        char *n = realloc(m->buf, cap);
        if (!n) {
            m->nomem = true;
            return 0;
        }
        m->buf = n;
        m->cap = cap;
    }
    memcpy(m->buf + m->len, bytes, size);
    m->len += size;
    m->buf[m->len] = '\0';
    return 1;
}

static void em_emit(emitter *m, yaml_event_t *ev, int init_ok)
{
    if (m->bad || m->nomem) {
        if (init_ok)
            yaml_event_delete(ev);
        return;
    }
    if (!init_ok) {
        m->bad = true;
        return;
    }
    if (!yaml_emitter_emit(&m->e, ev))
        m->bad = true; /* the emitter deletes the event in every case */
}

static bool em_open(emitter *m)
{
    memset(m, 0, sizeof *m);
    if (!yaml_emitter_initialize(&m->e))
        return false;
    yaml_emitter_set_output(&m->e, em_write, m);
    yaml_emitter_set_unicode(&m->e, 1);
    yaml_emitter_set_width(&m->e, -1);
    yaml_emitter_set_indent(&m->e, 2);
    yaml_emitter_set_break(&m->e, YAML_LN_BREAK);
    yaml_event_t ev;
    em_emit(m, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING));
    em_emit(m, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1));
    return true;
}

/* Ends the document; returns the status (NULL when the text is ready). */
static cpc_status *em_close(emitter *m)
{
    yaml_event_t ev;
    em_emit(m, &ev, yaml_document_end_event_initialize(&ev, 1));
    em_emit(m, &ev, yaml_stream_end_event_initialize(&ev));
    if (!m->bad && !m->nomem && !yaml_emitter_flush(&m->e))
        m->bad = true;
    cpc_status *st = NULL;
    if (m->nomem)
        st = cpc_error(CPC_E_NOMEM, "artifact: out of memory while writing YAML");
    else if (m->bad)
        st = cpc_error(CPC_E_INTERNAL, "artifact: libyaml emitter failed: %s",
                       m->e.problem ? m->e.problem : "unknown error");
    yaml_emitter_delete(&m->e);
    if (st) {
        free(m->buf);
        m->buf = NULL;
    }
    return st;
}

static void em_str(emitter *m, const char *s, yaml_scalar_style_t style)
{
    yaml_event_t ev;
    em_emit(m, &ev,
            yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1, style));
}

static void em_plain(emitter *m, const char *s)
{
    em_str(m, s, YAML_ANY_SCALAR_STYLE);
}

static void em_int(emitter *m, int64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, v);
    em_str(m, b, YAML_PLAIN_SCALAR_STYLE);
}

/* A double that reads back bit-exactly and types as a float (has '.', 'e',
 * or is .inf/.nan). */
static void fmt_double(double v, char *b, size_t n)
{
    if (isnan(v)) {
        snprintf(b, n, ".nan");
        return;
    }
    if (isinf(v)) {
        snprintf(b, n, v < 0 ? "-.inf" : ".inf");
        return;
    }
    snprintf(b, n, "%.17g", v);
    if (!strpbrk(b, ".eE")) {
        size_t l = strlen(b);
        if (l + 2 < n)
            memcpy(b + l, ".0", 3);
    }
}

static void em_double(emitter *m, double v)
{
    char b[48];
    fmt_double(v, b, sizeof b);
    em_str(m, b, YAML_PLAIN_SCALAR_STYLE);
}

static void em_bool(emitter *m, bool v)
{
    em_str(m, v ? "true" : "false", YAML_PLAIN_SCALAR_STYLE);
}

static void em_map(emitter *m, bool flow)
{
    yaml_event_t ev;
    em_emit(m, &ev, yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
                                                        flow ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE));
}

static void em_map_end(emitter *m)
{
    yaml_event_t ev;
    em_emit(m, &ev, yaml_mapping_end_event_initialize(&ev));
}

static void em_seq(emitter *m, bool flow)
{
    yaml_event_t ev;
    em_emit(m, &ev, yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                         flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE));
}

static void em_seq_end(emitter *m)
{
    yaml_event_t ev;
    em_emit(m, &ev, yaml_sequence_end_event_initialize(&ev));
}

static void kv_str(emitter *m, const char *k, const char *v)
{
    em_plain(m, k);
    em_plain(m, v);
}

static void kv_int(emitter *m, const char *k, int64_t v)
{
    em_plain(m, k);
    em_int(m, v);
}

static void kv_double(emitter *m, const char *k, double v)
{
    em_plain(m, k);
    em_double(m, v);
}

static void kv_bool(emitter *m, const char *k, bool v)
{
    em_plain(m, k);
    em_bool(m, v);
}

/* ==== the resolved plan ========================================================= */

cpc_status *cpc_plan_resolved_yaml(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                                   int ulysses_degree, char **text, size_t *len)
{
    *text = NULL;
    if (len)
        *len = 0;
    if (!plan || (int)variant < 0 || variant >= CPC_VARIANT__COUNT || variant == CPC_VARIANT_AUTO)
        return cpc_error(CPC_E_INTERNAL, "resolved plan: no plan or unresolved variant");
    emitter m;
    if (!em_open(&m))
        return cpc_error(CPC_E_NOMEM, "resolved plan: cannot create the YAML emitter");
    em_map(&m, false);
    kv_int(&m, "version", plan->version ? plan->version : 1);
    kv_str(&m, "name", plan->name ? plan->name : "");

    em_plain(&m, "model");
    em_map(&m, false);
    kv_int(&m, "heads", plan->model.heads);
    kv_int(&m, "kv_heads", plan->model.kv_heads);
    kv_int(&m, "head_dim", plan->model.head_dim);
    kv_str(&m, "dtype", cpc_dtype_name(plan->model.dtype));
    kv_int(&m, "layers", plan->model.layers);
    kv_double(&m, "scale", plan->model.scale);
    if (plan->model.linear_attention) /* kept, so that no rank runs it as softmax */
        kv_str(&m, "attention", "linear");
    em_map_end(&m);

    em_plain(&m, "input");
    em_map(&m, false);
    kv_int(&m, "batch", plan->input.batch);
    em_plain(&m, "segments");
    em_seq(&m, false);
    for (int i = 0; i < plan->input.n_segments; i++) {
        em_map(&m, true);
        kv_str(&m, "name", plan->input.segments[i].name ? plan->input.segments[i].name : "");
        kv_int(&m, "tokens", plan->input.segments[i].tokens);
        if (plan->input.segments[i].replicate)
            kv_str(&m, "split", "replicate");
        em_map_end(&m);
    }
    em_seq_end(&m);
    kv_str(&m, "mask", cpc_mask_name(plan->input.mask));
    if (plan->input.has_kv) {
        em_plain(&m, "kv");
        em_map(&m, true);
        kv_int(&m, "tokens", plan->input.kv_tokens);
        em_map_end(&m);
    }
    kv_str(&m, "mode", cpc_mode_name(plan->input.mode));
    em_map_end(&m);

    em_plain(&m, "cluster");
    em_map(&m, false);
    kv_int(&m, "world_size", plan->cluster.world_size);
    kv_int(&m, "gpus_per_node", plan->cluster.gpus_per_node);
    kv_str(&m, "device", plan->cluster.device ? plan->cluster.device : "h100-sxm");
    if (plan->cluster.profile)
        kv_str(&m, "profile", plan->cluster.profile);
    if (plan->cluster.memory_gb > 0)
        kv_double(&m, "memory_gb", plan->cluster.memory_gb);
    kv_double(&m, "reserved_gb", plan->cluster.reserved_gb);
    em_map_end(&m);

    em_plain(&m, "parallel");
    em_map(&m, false);
    kv_str(&m, "variant", cpc_variant_name(variant));
    kv_int(&m, "ring_degree", ring_degree);
    kv_int(&m, "ulysses_degree", ulysses_degree);
    kv_bool(&m, "ulysses_anything", variant == CPC_VARIANT_ULYSSES_ANYTHING);
    kv_bool(&m, "ring_anything", variant == CPC_VARIANT_RING_ANYTHING);
    kv_str(&m, "fallback", cpc_fallback_name(plan->parallel.fallback));
    if (cpc_plan_cfg_degree(plan) * cpc_plan_tp_degree(plan) > 1) {
        kv_int(&m, "cfg_degree", cpc_plan_cfg_degree(plan));
        kv_int(&m, "tp_degree", cpc_plan_tp_degree(plan));
    }
    em_map_end(&m);

    em_plain(&m, "schedule");
    em_map(&m, false);
    kv_bool(&m, "overlap", plan->schedule.overlap);
    kv_str(&m, "rotate", cpc_rotate_name(plan->schedule.rotate));
    if (plan->schedule.script)
        kv_str(&m, "script", plan->schedule.script);
    em_map_end(&m);

    em_map_end(&m);
    cpc_status *st = em_close(&m);
    if (st)
        return st;
    *text = m.buf;
    if (len)
        *len = m.len;
    return NULL;
}

/* ==== construction ================================================================ */

static char *dupstr(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void kernel_free(cpc_artifact_kernel *k)
{
    free(k->name);
    free(k->arch);
    free(k->source);
    free(k->ptx);
    free(k->fns);
}

void cpc_artifact_free(cpc_artifact *a)
{
    if (!a)
        return;
    free(a->compiler_version);
    free(a->plan_file);
    free(a->plan_text);
    cpc_plan_free(a->plan);
    cpc_program_free(a->program);
    cpc_program_free(a->backward);
    for (int i = 0; i < a->n_kernels; i++)
        kernel_free(&a->kernels[i]);
    free(a->kernels);
    for (int i = 0; i < a->n_predictions; i++)
        free(a->predictions[i].name);
    free(a->predictions);
    free(a->path);
    for (int i = 0; i < a->n_span_files; i++)
        free(a->span_files[i]);
    free(a->span_files);
    free(a);
}

/* Loads a resolved plan text; diagnostics become notes of one error. */
static cpc_status *load_plan_text(const char *text, size_t len, const char *file, cpc_code code,
                                  const char *what, cpc_plan **out)
{
    cpc_status *diag = cpc_plan_load_string(text, len, file, NULL, 0, out);
    if (!cpc_status_has_error(diag)) {
        cpc_status_free(diag); /* warnings (floored sizes) were said at compile time */
        return NULL;
    }
    cpc_status *st = cpc_error(code, "%s: the resolved plan does not load", what);
    for (cpc_status *d = diag; d; d = d->next)
        if (d->severity == CPC_SEV_ERROR) {
            char *f = cpc_status_format(d, "plan");
            cpc_status_add_note(st, d->span, "%s", f ? f : d->message);
            free(f);
        }
    cpc_status_free(diag);
    return st;
}

static bool layouts_equal(const cpc_layout *a, const cpc_layout *b)
{
    if (a->variant != b->variant || a->R != b->R || a->U != b->U || a->P != b->P || a->B != b->B ||
        a->H != b->H || a->Hkv != b->Hkv || a->D != b->D || a->group != b->group || a->dtype != b->dtype ||
        a->causal != b->causal || a->zigzag != b->zigzag || a->cross != b->cross || a->S != b->S ||
        a->Skv != b->Skv || a->n_seg != b->n_seg)
        return false;
    for (int i = 0; i < a->n_seg && i < CPC_MAX_SEGMENTS; i++)
        if (a->seg_start[i] != b->seg_start[i] || a->seg_len[i] != b->seg_len[i])
            return false;
    return true;
}

/* The plan the program is laid out on: the plan itself, or with cfg_degree
 * or tp_degree > 1 one (c, t) group's sub-plan (plan.h cpc_plan_sub).
 * False when the axes do not cut the plan. */
static bool plan_for_layout(const cpc_plan *plan, cpc_plan *sub)
{
    int C = cpc_plan_cfg_degree(plan), T = cpc_plan_tp_degree(plan);
    if (C * T == 1) {
        *sub = *plan;
        return true;
    }
    return cpc_plan_sub(plan, C, T, sub);
}

cpc_status *cpc_artifact_create(const cpc_plan *plan, const cpc_program *prog, cpc_artifact **out)
{
    *out = NULL;
    if (!plan || !prog)
        return cpc_error(CPC_E_INTERNAL, "artifact: no plan or program");
    cpc_artifact *a = calloc(1, sizeof *a);
    if (!a)
        return &cpc_status_oom;
    a->artifact_version = CPC_ARTIFACT_VERSION;
    a->compiler_version = dupstr(CPC_VERSION);
    a->plan_file = dupstr(plan->file ? plan->file : "");
    if (!a->compiler_version || !a->plan_file) {
        cpc_artifact_free(a);
        return &cpc_status_oom;
    }
    const cpc_layout *L = &prog->layout;
    size_t len = 0;
    cpc_status *st = cpc_plan_resolved_yaml(plan, L->variant, L->R, L->U, &a->plan_text, &len);
    if (!st)
        st = load_plan_text(a->plan_text, len, a->plan_file, CPC_E_INTERNAL, "artifact", &a->plan);
    cpc_plan sub;
    if (!st && !plan_for_layout(a->plan, &sub))
        st = cpc_error(CPC_E_INTERNAL, "artifact: cfg_degree %d x tp_degree %d does not cut the resolved plan",
                       a->plan->parallel.cfg_degree, a->plan->parallel.tp_degree);
    if (!st) {
        cpc_layout L2;
        st = cpc_layout_init(&L2, &sub, L->variant, L->R, L->U);
        if (!st && !layouts_equal(&L2, L))
            st = cpc_error(CPC_E_INTERNAL,
                           "artifact: the resolved plan does not give the program's layout (%s %dx%d)",
                           cpc_variant_name(L->variant), L->R, L->U);
    }
    if (!st)
        st = cpc_program_clone(prog, &a->program);
    if (st) {
        cpc_artifact_free(a);
        return st;
    }
    *out = a;
    return NULL;
}

cpc_status *cpc_artifact_set_backward(cpc_artifact *a, const cpc_program *bwd)
{
    if (!a || !a->program || !a->plan || !bwd)
        return cpc_error(CPC_E_INTERNAL, "artifact: no artifact or backward program");
    if (a->plan->input.mode != CPC_MODE_TRAINING)
        return cpc_error(CPC_E_INTERNAL, "artifact: a backward program for a plan that is not mode: training");
    if (!layouts_equal(&a->program->layout, &bwd->layout))
        return cpc_error(CPC_E_INTERNAL, "artifact: the backward program's layout is not the forward's");
    cpc_program *c = NULL;
    cpc_status *st = cpc_program_clone(bwd, &c);
    if (st)
        return st;
    cpc_program_free(a->backward);
    a->backward = c;
    return NULL;
}

/* Whitespace normalisation of kernel text (artifact.h KERNELS). */
static char *normalise_text(const char *s)
{
    if (!s)
        return strdup("");
    size_t n = strlen(s);
    /* worst case: every char a tab expanding to 8 */
    if (n > (SIZE_MAX - 1) / 8)
        return NULL;
    char *o = malloc(8 * n + 1);
    if (!o)
        return NULL;
    size_t k = 0, col = 0, line_start = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\r' && s[i + 1] == '\n')
            continue;
        if (c == '\n') {
            while (k > line_start && (o[k - 1] == ' '))
                k--;
            o[k++] = '\n';
            line_start = k;
            col = 0;
        } else if (c == '\t') {
            do {
                o[k++] = ' ';
                col++;
            } while (col % 8 != 0);
        } else {
            o[k++] = c;
            col++;
        }
    }
    while (k > line_start && o[k - 1] == ' ')
        k--;
    o[k] = '\0';
    char *shrunk = realloc(o, k + 1);
    return shrunk ? shrunk : o;
}

static bool single_line_name(const char *s)
{
    if (!s || !*s)
        return false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

cpc_status *cpc_artifact_add_kernel(cpc_artifact *a, const char *name, const char *arch, const char *source,
                                    const char *ptx)
{
    if (!a || !single_line_name(name) || !single_line_name(arch) || !source)
        return cpc_error(CPC_E_INTERNAL, "artifact: a kernel needs a name, an arch (one line each) and a source");
    cpc_artifact_kernel k = {strdup(name), strdup(arch), normalise_text(source), normalise_text(ptx), 0, NULL};
    if (!k.name || !k.arch || !k.source || !k.ptx) {
        kernel_free(&k);
        return &cpc_status_oom;
    }
    for (int i = 0; i < a->n_kernels; i++)
        if (strcmp(a->kernels[i].name, name) == 0) {
            kernel_free(&a->kernels[i]);
            a->kernels[i] = k;
            return NULL;
        }
    cpc_artifact_kernel *n = realloc(a->kernels, sizeof *n * (size_t)(a->n_kernels + 1));
    if (!n) {
        kernel_free(&k);
        return &cpc_status_oom;
    }
    a->kernels = n;
    a->kernels[a->n_kernels++] = k;
    return NULL;
}

cpc_status *cpc_artifact_set_kernel_report(cpc_artifact *a, const char *name,
                                           const cpc_kernel_fn_report *fns, int n)
{
    cpc_artifact_kernel *k = (cpc_artifact_kernel *)cpc_artifact_find_kernel(a, name);
    if (!k || n < 0 || (n > 0 && !fns))
        return cpc_error(CPC_E_INTERNAL, "artifact: no kernel '%s' for a ptxas report", name ? name : "");
    cpc_kernel_fn_report *c = NULL;
    if (n > 0) {
        c = malloc(sizeof *c * (size_t)n);
        if (!c)
            return &cpc_status_oom;
        memcpy(c, fns, sizeof *c * (size_t)n);
        for (int i = 0; i < n; i++)
            c[i].name[sizeof c[i].name - 1] = 0;
    }
    free(k->fns);
    k->fns = c;
    k->n_fns = n;
    return NULL;
}

const cpc_artifact_kernel *cpc_artifact_find_kernel(const cpc_artifact *a, const char *name)
{
    if (!a || !name)
        return NULL;
    for (int i = 0; i < a->n_kernels; i++)
        if (strcmp(a->kernels[i].name, name) == 0)
            return &a->kernels[i];
    return NULL;
}

cpc_status *cpc_artifact_set_prediction(cpc_artifact *a, const char *name, double value)
{
    if (!a || !single_line_name(name))
        return cpc_error(CPC_E_INTERNAL, "artifact: a prediction needs a one-line name");
    for (int i = 0; i < a->n_predictions; i++)
        if (strcmp(a->predictions[i].name, name) == 0) {
            a->predictions[i].value = value;
            return NULL;
        }
    char *nm = strdup(name);
    cpc_artifact_prediction *n = realloc(a->predictions, sizeof *n * (size_t)(a->n_predictions + 1));
    if (!nm || !n) {
        free(nm);
        if (n)
            a->predictions = n;
        return &cpc_status_oom;
    }
    a->predictions = n;
    a->predictions[a->n_predictions].name = nm;
    a->predictions[a->n_predictions].value = value;
    a->n_predictions++;
    return NULL;
}

cpc_status *cpc_artifact_set_predictions(cpc_artifact *a, const cpc_prediction *p)
{
    if (!p)
        return cpc_error(CPC_E_INTERNAL, "artifact: no prediction");
    struct {
        const char *k;
        double v;
    } f[] = {
        {"ms_per_layer", p->ms_per_layer},
        {"ms_per_forward", p->ms_per_forward},
        {"compute_ms_per_layer", p->compute_ms_per_layer},
        {"comm_ms_per_layer", p->comm_ms_per_layer},
        {"memory_bytes_per_rank", (double)p->memory_bytes_per_rank},
        {"buffer_bytes_per_rank", (double)p->buffer_bytes_per_rank},
        {"bytes_sent_per_rank", (double)p->bytes_sent_per_rank},
        {"flops_per_layer", p->flops_per_layer},
        {"fits", p->fits ? 1.0 : 0.0},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        cpc_status *st = cpc_artifact_set_prediction(a, f[i].k, f[i].v);
        if (st)
            return st;
    }
    /* the whole step (model.parameters) and per image (input.steps): only
     * when priced, as SPEC section 3's JSON has them */
    cpc_status *st = p->ms_per_step > 0 ? cpc_artifact_set_prediction(a, "ms_per_step", p->ms_per_step) : NULL;
    if (!st && p->ms_per_image > 0)
        st = cpc_artifact_set_prediction(a, "ms_per_image", p->ms_per_image);
    if (st || p->ms_per_step <= 0)
        return st;
    /* the step's parts and the deployment's memory (SPEC section 3's
     * step_breakdown and memory keys), named as `cpc --format json` names them */
    const struct {
        const char *k;
        double v;
        bool per_image;
    } w[] = {
        {"gemm_ms", p->gemm_ms_per_step, false},
        {"attention_ms", p->attn_ms_per_step, false},
        {"memory_bound_ms", p->memory_ms_per_step, false},
        {"comm_ms", p->comm_ms_per_step, false},
        {"host_ms", p->host_exposed_ms_per_step, false},
        {"text_encoder_ms", p->text_encoder_ms, true},
        {"vae_decode_ms", p->vae_decode_ms, true},
        {"weights_bytes_per_rank", (double)p->weights_bytes_per_rank, false},
        {"activation_bytes_per_rank", (double)p->activation_bytes_per_rank, false},
        {"vae_bytes_per_rank", (double)p->vae_bytes_per_rank, false},
    };
    for (size_t i = 0; !st && i < sizeof w / sizeof w[0]; i++)
        if (!w[i].per_image || p->ms_per_image > 0)
            st = cpc_artifact_set_prediction(a, w[i].k, w[i].v);
    return st;
}

bool cpc_artifact_get_prediction(const cpc_artifact *a, const char *name, double *value)
{
    if (!a || !name)
        return false;
    for (int i = 0; i < a->n_predictions; i++)
        if (strcmp(a->predictions[i].name, name) == 0) {
            if (value)
                *value = a->predictions[i].value;
            return true;
        }
    return false;
}

/* ==== writing ===================================================================== */

static void em_bufs(emitter *m, const cpc_program *prog, const char *key, const int *idx, int n)
{
    if (n <= 0)
        return;
    em_plain(m, key);
    em_seq(m, true);
    for (int i = 0; i < n; i++)
        em_plain(m, prog->buffers[idx[i]].name);
    em_seq_end(m);
}

static void em_expr(emitter *m, const char *key, const cpc_expr *e)
{
    if (!e)
        return;
    em_plain(m, key);
    em_str(m, cpc_expr_text(e), YAML_ANY_SCALAR_STYLE);
}

static bool has_tag(cpc_op_kind k)
{
    return k == CPC_OP_SEND || k == CPC_OP_RECV || k == CPC_OP_WAIT;
}

static void em_ops(emitter *m, const cpc_program *prog, const cpc_op *ops, int n)
{
    em_seq(m, false);
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        bool loop = op->kind == CPC_OP_LOOP;
        em_map(m, !loop);
        kv_str(m, "kind", cpc_op_kind_name(op->kind));
        if (op->group != CPC_GROUP_NONE)
            kv_str(m, "group", cpc_group_name(op->group));
        if (op->kind == CPC_OP_ALL_TO_ALL || op->dir != CPC_A2A_SEQ_TO_HEADS)
            kv_str(m, "dir", cpc_a2a_dir_name(op->dir));
        if (op->reduce) /* backward all_to_all (program.h) */
            kv_str(m, "reduce", "sum");
        em_expr(m, "peer", op->peer);
        em_bufs(m, prog, "in", op->in, op->n_in);
        em_bufs(m, prog, "out", op->out, op->n_out);
        em_expr(m, "block", op->block);
        em_expr(m, "count", op->count);
        if (has_tag(op->kind) || op->tag != 0)
            kv_int(m, "tag", op->tag);
        em_expr(m, "when", op->when);
        if (op->span.line > 0) {
            char sp[1200];
            snprintf(sp, sizeof sp, "%s:%d:%d", op->span.file ? op->span.file : "", op->span.line, op->span.col);
            em_plain(m, "span");
            em_str(m, sp, YAML_DOUBLE_QUOTED_SCALAR_STYLE);
        }
        if (loop || op->n_body > 0) {
            em_plain(m, "body");
            em_ops(m, prog, op->body, op->n_body);
        }
        em_map_end(m);
    }
    em_seq_end(m);
}

/* `key`: {overlap, rotate, buffers, ops} of one program (FORMAT). */
static void em_schedule(emitter *mm, const char *key, const cpc_program *prog)
{
    emitter *m = mm;
    em_plain(m, key);
    em_map(m, false);
    kv_bool(m, "overlap", prog->overlap);
    kv_str(m, "rotate", cpc_rotate_name(prog->rotate));
    em_plain(m, "buffers");
    em_seq(m, false);
    for (int b = 0; b < prog->n_buffers; b++) {
        const cpc_buffer *B = &prog->buffers[b];
        em_map(m, true);
        kv_str(m, "name", B->name);
        kv_str(m, "role", cpc_buf_role_name(B->role));
        kv_str(m, "tokens", cpc_buf_tokens_name(B->tokens));
        kv_str(m, "heads", cpc_buf_heads_name(B->heads));
        kv_str(m, "io", cpc_buf_io_name(B->io));
        em_map_end(m);
    }
    em_seq_end(m);
    em_plain(m, "ops");
    em_ops(m, prog, prog->ops, prog->n_ops);
    em_map_end(m);
}

static void hash_hex(const char *text, size_t len, char out[HASH_HEX + 1], bool *ok)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    *ok = EVP_Digest(text, len, md, &mdlen, EVP_sha256(), NULL) == 1 && mdlen == 32;
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", *ok ? md[i] : 0);
    out[HASH_HEX] = '\0';
}

/* Byte offset of the hash's hex digits: the line `content_hash: sha256:`
 * at the start of the text or after a newline; (size_t)-1 when absent. */
static size_t find_hash_line(const char *text, size_t len)
{
    static const char key[] = "content_hash: " HASH_PREFIX;
    size_t kl = sizeof key - 1;
    for (size_t i = 0; i + kl <= len; i++) {
        if ((i == 0 || text[i - 1] == '\n') && memcmp(text + i, key, kl) == 0)
            return i + kl;
        const char *nl = memchr(text + i, '\n', len - i);
        if (!nl)
            break;
        i = (size_t)(nl - text);
    }
    return (size_t)-1;
}

cpc_status *cpc_artifact_to_string(cpc_artifact *a, char **text, size_t *len)
{
    *text = NULL;
    if (len)
        *len = 0;
    if (!a || !a->program || !a->plan_text)
        return cpc_error(CPC_E_INTERNAL, "artifact: nothing to write (no plan or program)");
    const cpc_program *prog = a->program;
    const cpc_layout *L = &prog->layout;
    char zeros[HASH_HEX + 16];
    snprintf(zeros, sizeof zeros, HASH_PREFIX "%0*d", HASH_HEX, 0);

    emitter m;
    if (!em_open(&m))
        return cpc_error(CPC_E_NOMEM, "artifact: cannot create the YAML emitter");
    em_map(&m, false);
    kv_int(&m, "artifact_version", CPC_ARTIFACT_VERSION);
    em_plain(&m, "compiler_version");
    em_str(&m, a->compiler_version ? a->compiler_version : CPC_VERSION, YAML_DOUBLE_QUOTED_SCALAR_STYLE);
    em_plain(&m, "content_hash");
    em_str(&m, zeros, YAML_PLAIN_SCALAR_STYLE);
    em_plain(&m, "plan_file");
    em_str(&m, a->plan_file ? a->plan_file : "", YAML_DOUBLE_QUOTED_SCALAR_STYLE);
    em_plain(&m, "plan");
    em_str(&m, a->plan_text, YAML_LITERAL_SCALAR_STYLE);

    em_plain(&m, "mesh");
    em_map(&m, false);
    kv_str(&m, "variant", cpc_variant_name(L->variant));
    kv_int(&m, "ring_degree", L->R);
    kv_int(&m, "ulysses_degree", L->U);
    int C = a->plan ? cpc_plan_cfg_degree(a->plan) : 1, T = a->plan ? cpc_plan_tp_degree(a->plan) : 1;
    if (C * T > 1) {
        kv_int(&m, "cfg_degree", C);
        kv_int(&m, "tp_degree", T);
    }
    kv_int(&m, "world_size", (int64_t)L->P * C * T);
    kv_str(&m, "rank_rule", C * T > 1 ? RANK_RULE_AXES : RANK_RULE);
    em_map_end(&m);

    em_schedule(&m, "schedule", prog);
    if (a->backward)
        em_schedule(&m, "backward_schedule", a->backward);

    em_plain(&m, "kernels");
    em_seq(&m, a->n_kernels == 0);
    for (int i = 0; i < a->n_kernels; i++) {
        const cpc_artifact_kernel *k = &a->kernels[i];
        em_map(&m, false);
        kv_str(&m, "name", k->name);
        kv_str(&m, "arch", k->arch);
        em_plain(&m, "source");
        em_str(&m, k->source ? k->source : "", YAML_LITERAL_SCALAR_STYLE);
        em_plain(&m, "ptx");
        em_str(&m, k->ptx ? k->ptx : "", YAML_LITERAL_SCALAR_STYLE);
        if (k->n_fns > 0) {
            em_plain(&m, "ptxas");
            em_seq(&m, false);
            for (int f = 0; f < k->n_fns; f++) {
                const cpc_kernel_fn_report *fr = &k->fns[f];
                em_map(&m, true);
                kv_str(&m, "function", fr->name);
                kv_int(&m, "registers", fr->registers);
                kv_int(&m, "stack_bytes", fr->stack_bytes);
                kv_int(&m, "spill_store_bytes", fr->spill_store_bytes);
                kv_int(&m, "spill_load_bytes", fr->spill_load_bytes);
                em_map_end(&m);
            }
            em_seq_end(&m);
        }
        em_map_end(&m);
    }
    em_seq_end(&m);

    em_plain(&m, "predictions");
    em_map(&m, a->n_predictions == 0);
    for (int i = 0; i < a->n_predictions; i++)
        kv_double(&m, a->predictions[i].name, a->predictions[i].value);
    em_map_end(&m);
    em_map_end(&m);
    cpc_status *st = em_close(&m);
    if (st)
        return st;

    size_t at = find_hash_line(m.buf, m.len);
    if (at == (size_t)-1 || at + HASH_HEX > m.len) {
        free(m.buf);
        return cpc_error(CPC_E_INTERNAL, "artifact: the emitter did not write the content_hash line as expected");
    }
    char hex[HASH_HEX + 1];
    bool ok;
    hash_hex(m.buf, m.len, hex, &ok);
    if (!ok) {
        free(m.buf);
        return cpc_error(CPC_E_INTERNAL, "artifact: SHA-256 (OpenSSL EVP) failed");
    }
    memcpy(m.buf + at, hex, HASH_HEX);
    snprintf(a->content_hash, sizeof a->content_hash, HASH_PREFIX "%s", hex);
    *text = m.buf;
    if (len)
        *len = m.len;
    return NULL;
}

cpc_status *cpc_artifact_write_file(FILE *f, cpc_artifact *a)
{
    if (!f)
        return cpc_error(CPC_E_INTERNAL, "artifact: no output stream");
    char *text;
    size_t len;
    cpc_status *st = cpc_artifact_to_string(a, &text, &len);
    if (st)
        return st;
    size_t w = fwrite(text, 1, len, f);
    free(text);
    if (w != len || fflush(f) != 0)
        return cpc_errno_status(CPC_E_IO, errno ? errno : EIO, "artifact: write");
    return NULL;
}

cpc_status *cpc_artifact_write(cpc_artifact *a, const char *path)
{
    if (!path || !*path)
        return cpc_error(CPC_E_USAGE, "artifact: no output path");
    if (!a || !a->plan || !a->program)
        return cpc_error(CPC_E_USAGE, "%s: no artifact to write (NULL)", path);
    /* fileio.h: a regular file (or a link's target) is replaced atomically
     * (temporary file, fsync, rename); a device or FIFO is written through;
     * a directory or anything else is refused.  Checked before the text is
     * built, so a bad path fails fast. */
    cpc_outfile o;
    cpc_status *st = cpc_outfile_open(&o, path, "cannot write the artifact");
    if (st)
        return st;
    char *text;
    size_t len;
    if ((st = cpc_artifact_to_string(a, &text, &len))) {
        cpc_outfile_discard(&o);
        return st;
    }
    errno = 0;
    size_t w = fwrite(text, 1, len, o.f);
    int e = errno;
    free(text);
    if (w != len) {
        st = cpc_error(CPC_E_IO, "%s: cannot write the artifact: %s", path, strerror(e ? e : EIO));
        cpc_outfile_discard(&o);
        return st;
    }
    return cpc_outfile_commit(&o);
}

/* ==== reading ====================================================================== */

typedef struct reader {
    const char *name;       /* for messages and spans */
    yaml_document_t doc;
    cpc_status *err;
    cpc_artifact *a;
    cpc_program *prog;      /* the program being read (schedule or backward_schedule) */
} reader;

__attribute__((format(printf, 3, 4)))
static int rfail(reader *r, const yaml_node_t *n, const char *fmt, ...)
{
    if (r->err)
        return -1;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cpc_span sp = CPC_NO_SPAN;
    if (n) {
        sp.file = r->name;
        sp.line = (int)n->start_mark.line + 1;
        sp.col = (int)n->start_mark.column + 1;
    }
    r->err = cpc_diag(CPC_E_INPUT, 0, CPC_SEV_ERROR, sp, "artifact %s: %s", r->name, msg);
    return -1;
}

static yaml_node_t *node(reader *r, int id)
{
    return yaml_document_get_node(&r->doc, id);
}

/* A scalar's text, or NULL (not a scalar, or holds a NUL byte). */
static const char *scalar(const yaml_node_t *n)
{
    if (!n || n->type != YAML_SCALAR_NODE)
        return NULL;
    if (strlen((const char *)n->data.scalar.value) != n->data.scalar.length)
        return NULL;
    return (const char *)n->data.scalar.value;
}

/* Checks that mapping n has only keys in `allowed` and no duplicates. */
static int check_keys(reader *r, const yaml_node_t *n, const char *what, const char *const *allowed, int na)
{
    if (!n || n->type != YAML_MAPPING_NODE)
        return rfail(r, n, "%s must be a mapping", what);
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = scalar(node(r, p->key));
        if (!k)
            return rfail(r, node(r, p->key), "%s: keys must be plain text", what);
        bool known = false;
        for (int i = 0; i < na; i++)
            known |= strcmp(k, allowed[i]) == 0;
        if (!known)
            return rfail(r, node(r, p->key), "%s: unknown key '%s'", what, k);
        for (yaml_node_pair_t *q = n->data.mapping.pairs.start; q < p; q++) {
            const char *k2 = scalar(node(r, q->key));
            if (k2 && strcmp(k, k2) == 0)
                return rfail(r, node(r, p->key), "%s: duplicate key '%s'", what, k);
        }
    }
    return 0;
}

/* Value of `key` in mapping n (NULL when absent). */
static yaml_node_t *get(reader *r, const yaml_node_t *n, const char *key)
{
    if (!n || n->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = scalar(node(r, p->key));
        if (k && strcmp(k, key) == 0)
            return node(r, p->value);
    }
    return NULL;
}

static yaml_node_t *need(reader *r, const yaml_node_t *map, const char *what, const char *key)
{
    yaml_node_t *v = get(r, map, key);
    if (!v)
        rfail(r, map, "%s: missing key '%s'", what, key);
    return v;
}

static int get_str(reader *r, const yaml_node_t *map, const char *what, const char *key, const char **out)
{
    yaml_node_t *v = need(r, map, what, key);
    if (!v)
        return -1;
    *out = scalar(v);
    if (!*out)
        return rfail(r, v, "%s.%s must be text", what, key);
    return 0;
}

static int parse_i64(const char *s, int64_t *out)
{
    if (!s || !*s)
        return -1;
    const char *p = s;
    if (*p == '-' || *p == '+')
        p++;
    if (!*p)
        return -1;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int get_int(reader *r, const yaml_node_t *map, const char *what, const char *key, int64_t lo, int64_t hi,
                   int64_t *out)
{
    yaml_node_t *v = need(r, map, what, key);
    if (!v)
        return -1;
    const char *s = scalar(v);
    if (!s || v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || parse_i64(s, out))
        return rfail(r, v, "%s.%s must be an integer", what, key);
    if (*out < lo || *out > hi)
        return rfail(r, v, "%s.%s = %" PRId64 " is outside %" PRId64 "..%" PRId64, what, key, *out, lo, hi);
    return 0;
}

static int get_bool(reader *r, const yaml_node_t *map, const char *what, const char *key, bool *out)
{
    yaml_node_t *v = need(r, map, what, key);
    if (!v)
        return -1;
    const char *s = scalar(v);
    if (s && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && strcmp(s, "true") == 0)
        *out = true;
    else if (s && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && strcmp(s, "false") == 0)
        *out = false;
    else
        return rfail(r, v, "%s.%s must be true or false", what, key);
    return 0;
}

static int parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return -1;
    if (strcmp(s, ".nan") == 0) {
        *out = NAN;
        return 0;
    }
    if (strcmp(s, ".inf") == 0 || strcmp(s, "+.inf") == 0) {
        *out = INFINITY;
        return 0;
    }
    if (strcmp(s, "-.inf") == 0) {
        *out = -INFINITY;
        return 0;
    }
    for (const char *p = s; *p; p++)
        if (!strchr("0123456789+-.eE", *p))
            return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE)
        return -1;
    *out = v;
    return 0;
}

/* Parses one enum name with a cpc_*_parse function. */
static int get_enum(reader *r, const yaml_node_t *map, const char *what, const char *key, int (*parse)(const char *),
                    int *out)
{
    const char *s;
    if (get_str(r, map, what, key, &s))
        return -1;
    *out = parse(s);
    if (*out < 0)
        return rfail(r, get(r, map, key), "%s.%s: unknown name '%s'", what, key, s);
    return 0;
}

static cpc_span node_span(reader *r, const yaml_node_t *n)
{
    cpc_span sp = {r->name, (int)n->start_mark.line + 1, (int)n->start_mark.column + 1};
    return sp;
}

static int get_expr(reader *r, const yaml_node_t *map, const char *what, const char *key, cpc_expr **out)
{
    yaml_node_t *v = get(r, map, key);
    if (!v)
        return 0;
    const char *s = scalar(v);
    if (!s)
        return rfail(r, v, "%s.%s must be an expression (text)", what, key);
    cpc_status *st = cpc_expr_parse(s, node_span(r, v), out);
    if (st) {
        rfail(r, v, "%s.%s: %s", what, key, st->message);
        cpc_status_free(st);
        return -1;
    }
    return 0;
}

static int get_bufs(reader *r, const yaml_node_t *map, const char *what, const char *key, int *idx, int *n)
{
    *n = 0;
    yaml_node_t *v = get(r, map, key);
    if (!v)
        return 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return rfail(r, v, "%s.%s must be a list of buffer names", what, key);
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
        yaml_node_t *item = node(r, *it);
        const char *s = scalar(item);
        if (!s)
            return rfail(r, item, "%s.%s: buffer names are text", what, key);
        if (*n >= CPC_OP_MAX_BUFS)
            return rfail(r, item, "%s.%s: more than %d buffers", what, key, CPC_OP_MAX_BUFS);
        int b = cpc_program_find_buffer(r->prog, s);
        if (b < 0)
            return rfail(r, item, "%s.%s: unknown buffer '%s'", what, key, s);
        idx[(*n)++] = b;
    }
    return 0;
}

/* Interns a span file name in the artifact (spans borrow it). */
static const char *intern(reader *r, const char *s, size_t len)
{
    cpc_artifact *a = r->a;
    for (int i = 0; i < a->n_span_files; i++)
        if (strlen(a->span_files[i]) == len && memcmp(a->span_files[i], s, len) == 0)
            return a->span_files[i];
    char **n = realloc(a->span_files, sizeof *n * (size_t)(a->n_span_files + 1));
    if (!n)
        return NULL;
    a->span_files = n;
    char *c = strndup(s, len);
    if (!c)
        return NULL;
    a->span_files[a->n_span_files++] = c;
    return c;
}

static int get_span(reader *r, const yaml_node_t *map, const char *what, cpc_span *out)
{
    yaml_node_t *v = get(r, map, "span");
    if (!v)
        return 0;
    const char *s = scalar(v);
    /* "file:line:col": the last two colons split it. */
    const char *c2 = s ? strrchr(s, ':') : NULL;
    const char *c1 = NULL;
    if (c2)
        for (const char *p = c2 - 1; p >= s; p--)
            if (*p == ':') {
                c1 = p;
                break;
            }
    int64_t line, col;
    char lb[24], cb[24];
    if (!c1 || c2 - c1 - 1 <= 0 || c2 - c1 - 1 >= (long)sizeof lb || strlen(c2 + 1) >= sizeof cb)
        return rfail(r, v, "%s.span must be \"file:line:col\"", what);
    memcpy(lb, c1 + 1, (size_t)(c2 - c1 - 1));
    lb[c2 - c1 - 1] = '\0';
    strcpy(cb, c2 + 1);
    if (parse_i64(lb, &line) || parse_i64(cb, &col) || line < 1 || line > INT_MAX || col < 0 || col > INT_MAX)
        return rfail(r, v, "%s.span must be \"file:line:col\"", what);
    const char *file = intern(r, s, (size_t)(c1 - s));
    if (!file)
        return rfail(r, v, "out of memory");
    out->file = file;
    out->line = (int)line;
    out->col = (int)col;
    return 0;
}

/* all_to_all `reduce` (program.h): the only value is "sum". */
static int reduce_parse(const char *s)
{
    return strcmp(s, "sum") == 0 ? 1 : -1;
}

static int read_ops(reader *r, const yaml_node_t *seq, const char *where, int depth, cpc_op **ops, int *n)
{
    static const char *const keys[] = {"kind", "group", "dir", "reduce", "peer", "in", "out", "block",
                                       "count", "tag", "when", "span", "body"};
    if (!seq || seq->type != YAML_SEQUENCE_NODE)
        return rfail(r, seq, "%s must be a list of ops", where);
    if (depth > MAX_OP_DEPTH)
        return rfail(r, seq, "%s: loops nested deeper than %d", where, MAX_OP_DEPTH - 1);
    int i = 0;
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top; it++, i++) {
        yaml_node_t *m = node(r, *it);
        char what[160];
        snprintf(what, sizeof what, "%s[%d]", where, i);
        if (check_keys(r, m, what, keys, (int)(sizeof keys / sizeof keys[0])))
            return -1;
        int kind;
        if (get_enum(r, m, what, "kind", cpc_op_kind_parse, &kind))
            return -1;
        cpc_op *op = cpc_ops_append(ops, n, (cpc_op_kind)kind);
        if (!op)
            return rfail(r, m, "out of memory");
        int g = CPC_GROUP_NONE, dir = CPC_A2A_SEQ_TO_HEADS;
        if (get(r, m, "group") && get_enum(r, m, what, "group", cpc_group_parse, &g))
            return -1;
        if (get(r, m, "dir") && get_enum(r, m, what, "dir", cpc_a2a_dir_parse, &dir))
            return -1;
        int red = 0;
        if (get(r, m, "reduce") && get_enum(r, m, what, "reduce", reduce_parse, &red))
            return -1;
        op->group = (cpc_group)g;
        op->dir = (cpc_a2a_dir)dir;
        op->reduce = red == 1;
        if (get_expr(r, m, what, "peer", &op->peer) || get_expr(r, m, what, "block", &op->block) ||
            get_expr(r, m, what, "count", &op->count) || get_expr(r, m, what, "when", &op->when))
            return -1;
        if (get_bufs(r, m, what, "in", op->in, &op->n_in) || get_bufs(r, m, what, "out", op->out, &op->n_out))
            return -1;
        if (get(r, m, "tag")) {
            int64_t t;
            if (get_int(r, m, what, "tag", 0, INT_MAX, &t))
                return -1;
            op->tag = (int)t;
        }
        if (get_span(r, m, what, &op->span))
            return -1;
        yaml_node_t *body = get(r, m, "body");
        if (kind == CPC_OP_LOOP) {
            if (!op->count)
                return rfail(r, m, "%s: a loop needs a count", what);
            if (!body)
                return rfail(r, m, "%s: a loop needs a body", what);
        } else if (body) {
            return rfail(r, body, "%s: only a loop has a body", what);
        }
        if (body) {
            char bw[200];
            snprintf(bw, sizeof bw, "%s.body", what);
            cpc_op *bops = NULL;
            int nb = 0;
            int rc = read_ops(r, body, bw, depth + 1, &bops, &nb);
            /* `op` may have moved?  No: *ops is only realloc'd by appends
             * to this list, which happen after this op is complete. */
            op->body = bops;
            op->n_body = nb;
            if (rc)
                return -1;
        }
    }
    return 0;
}

/* The program under key `sk` (schedule, backward_schedule) into p. */
static int read_schedule(reader *r, const yaml_node_t *s, const char *sk, cpc_program *p)
{
    static const char *const keys[] = {"overlap", "rotate", "buffers", "ops"};
    r->prog = p;
    if (check_keys(r, s, sk, keys, 4))
        return -1;
    bool overlap = true;
    int rot = 0;
    if (get_bool(r, s, sk, "overlap", &overlap) || get_enum(r, s, sk, "rotate", cpc_rotate_parse, &rot))
        return -1;
    p->overlap = overlap;
    p->rotate = (cpc_rotate)rot;
    yaml_node_t *bufs = need(r, s, sk, "buffers");
    if (!bufs)
        return -1;
    if (bufs->type != YAML_SEQUENCE_NODE)
        return rfail(r, bufs, "%s.buffers must be a list", sk);
    static const char *const bkeys[] = {"name", "role", "tokens", "heads", "io"};
    int i = 0;
    for (yaml_node_item_t *it = bufs->data.sequence.items.start; it < bufs->data.sequence.items.top; it++, i++) {
        yaml_node_t *b = node(r, *it);
        char what[64];
        snprintf(what, sizeof what, "%s.buffers[%d]", sk, i);
        const char *name;
        int role, tok, heads, io;
        if (check_keys(r, b, what, bkeys, 5) || get_str(r, b, what, "name", &name) ||
            get_enum(r, b, what, "role", cpc_buf_role_parse, &role) ||
            get_enum(r, b, what, "tokens", cpc_buf_tokens_parse, &tok) ||
            get_enum(r, b, what, "heads", cpc_buf_heads_parse, &heads) ||
            get_enum(r, b, what, "io", cpc_buf_io_parse, &io))
            return -1;
        if (cpc_program_add_buffer(p, name, (cpc_buf_role)role, (cpc_buf_tokens)tok, (cpc_buf_heads)heads,
                                   (cpc_buf_io)io) < 0)
            return rfail(r, b, "%s: invalid or repeated buffer name '%s'", what, name);
    }
    yaml_node_t *ops = need(r, s, sk, "ops");
    if (!ops)
        return -1;
    char ow[40];
    snprintf(ow, sizeof ow, "%s.ops", sk);
    return read_ops(r, ops, ow, 1, &p->ops, &p->n_ops);
}

/* A kernel's optional ptxas report: [{function, registers, stack_bytes,
 * spill_store_bytes, spill_load_bytes}]. */
static int read_ptxas(reader *r, const yaml_node_t *ps, const char *kwhat, cpc_artifact_kernel *k)
{
    static const char *const keys[] = {"function", "registers", "stack_bytes", "spill_store_bytes",
                                       "spill_load_bytes"};
    if (!ps)
        return 0;
    if (ps->type != YAML_SEQUENCE_NODE)
        return rfail(r, ps, "%s.ptxas must be a list", kwhat);
    int n = (int)(ps->data.sequence.items.top - ps->data.sequence.items.start);
    if (n > 4096)
        return rfail(r, ps, "%s.ptxas: too many entries", kwhat);
    k->fns = n ? calloc((size_t)n, sizeof *k->fns) : NULL;
    if (n && !k->fns)
        return rfail(r, ps, "out of memory");
    for (int i = 0; i < n; i++) {
        yaml_node_t *e = node(r, ps->data.sequence.items.start[i]);
        char what[80];
        snprintf(what, sizeof what, "%s.ptxas[%d]", kwhat, i);
        const char *fn;
        int64_t v[4];
        if (check_keys(r, e, what, keys, 5) || get_str(r, e, what, "function", &fn) ||
            get_int(r, e, what, "registers", 0, 65536, &v[0]) ||
            get_int(r, e, what, "stack_bytes", 0, INT32_MAX, &v[1]) ||
            get_int(r, e, what, "spill_store_bytes", 0, INT32_MAX, &v[2]) ||
            get_int(r, e, what, "spill_load_bytes", 0, INT32_MAX, &v[3]))
            return -1;
        if (!single_line_name(fn) || strlen(fn) >= sizeof k->fns[i].name)
            return rfail(r, e, "%s.function must be one line of at most %zu bytes", what,
                         sizeof k->fns[i].name - 1);
        snprintf(k->fns[i].name, sizeof k->fns[i].name, "%s", fn);
        k->fns[i].registers = (int)v[0];
        k->fns[i].stack_bytes = (int)v[1];
        k->fns[i].spill_store_bytes = (int)v[2];
        k->fns[i].spill_load_bytes = (int)v[3];
        k->n_fns = i + 1;
    }
    return 0;
}

static int read_kernels(reader *r, const yaml_node_t *ks)
{
    static const char *const keys[] = {"name", "arch", "source", "ptx", "ptxas"};
    if (!ks || ks->type != YAML_SEQUENCE_NODE)
        return rfail(r, ks, "kernels must be a list");
    int i = 0;
    for (yaml_node_item_t *it = ks->data.sequence.items.start; it < ks->data.sequence.items.top; it++, i++) {
        yaml_node_t *k = node(r, *it);
        char what[48];
        snprintf(what, sizeof what, "kernels[%d]", i);
        const char *name, *arch, *src, *ptx;
        if (check_keys(r, k, what, keys, 5) || get_str(r, k, what, "name", &name) ||
            get_str(r, k, what, "arch", &arch) || get_str(r, k, what, "source", &src) ||
            get_str(r, k, what, "ptx", &ptx))
            return -1;
        if (!single_line_name(name) || !single_line_name(arch))
            return rfail(r, k, "%s: name and arch must be one non-empty line", what);
        if (cpc_artifact_find_kernel(r->a, name))
            return rfail(r, k, "%s: a second kernel called '%s'", what, name);
        /* Stored as read (already normalised by the writer). */
        cpc_artifact_kernel kk = {strdup(name), strdup(arch), strdup(src), strdup(ptx), 0, NULL};
        cpc_artifact_kernel *n = realloc(r->a->kernels, sizeof *n * (size_t)(r->a->n_kernels + 1));
        if (!kk.name || !kk.arch || !kk.source || !kk.ptx || !n) {
            kernel_free(&kk);
            if (n)
                r->a->kernels = n;
            return rfail(r, k, "out of memory");
        }
        r->a->kernels = n;
        r->a->kernels[r->a->n_kernels++] = kk;
        if (read_ptxas(r, get(r, k, "ptxas"), what, &r->a->kernels[r->a->n_kernels - 1]))
            return -1;
    }
    return 0;
}

static int read_predictions(reader *r, const yaml_node_t *ps)
{
    if (!ps || ps->type != YAML_MAPPING_NODE)
        return rfail(r, ps, "predictions must be a mapping of names to numbers");
    for (yaml_node_pair_t *p = ps->data.mapping.pairs.start; p < ps->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = node(r, p->key), *vn = node(r, p->value);
        const char *k = scalar(kn), *v = scalar(vn);
        double d;
        if (!k || !single_line_name(k))
            return rfail(r, kn, "predictions: names must be one line of text");
        if (cpc_artifact_get_prediction(r->a, k, NULL))
            return rfail(r, kn, "predictions: duplicate name '%s'", k);
        if (!v || vn->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || parse_double(v, &d))
            return rfail(r, vn, "predictions.%s must be a number", k);
        cpc_status *st = cpc_artifact_set_prediction(r->a, k, d);
        if (st) {
            cpc_status_free(st);
            return rfail(r, kn, "out of memory");
        }
    }
    return 0;
}

/* Checks the content hash of `text` against the value in the document. */
static int check_hash(reader *r, const char *text, size_t len, const yaml_node_t *hnode)
{
    const char *h = scalar(hnode);
    if (!h || hnode->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || strlen(h) != strlen(HASH_PREFIX) + HASH_HEX ||
        strncmp(h, HASH_PREFIX, strlen(HASH_PREFIX)) != 0)
        return rfail(r, hnode, "content_hash must be written `content_hash: sha256:<64 hex digits>`");
    for (const char *p = h + strlen(HASH_PREFIX); *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return rfail(r, hnode, "content_hash must be written `content_hash: sha256:<64 lowercase hex digits>`");
    size_t at = find_hash_line(text, len);
    if (at == (size_t)-1 || at + HASH_HEX > len || memcmp(text + at, h + strlen(HASH_PREFIX), HASH_HEX) != 0 ||
        (at + HASH_HEX < len && text[at + HASH_HEX] != '\n'))
        return rfail(r, hnode, "content_hash must be on its own top-level line `content_hash: sha256:<hex>`");
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return rfail(r, NULL, "out of memory");
    memcpy(copy, text, len);
    memset(copy + at, '0', HASH_HEX);
    char hex[HASH_HEX + 1];
    bool ok;
    hash_hex(copy, len, hex, &ok);
    free(copy);
    if (!ok)
        return rfail(r, NULL, "SHA-256 (OpenSSL EVP) failed");
    if (memcmp(hex, h + strlen(HASH_PREFIX), HASH_HEX) != 0)
        return rfail(r, hnode,
                     "content hash mismatch: the file says %s but its content hashes to " HASH_PREFIX
                     "%s; the file was modified or truncated after cpc wrote it: recompile the plan",
                     h, hex);
    snprintf(r->a->content_hash, sizeof r->a->content_hash, "%s", h);
    return 0;
}

/* The plan's spans point into the embedded plan text; later diagnostics about
 * it (cprun's CP018, ...) must point where that text is: the artifact file,
 * at the block scalar's lines (the content starts on the line after `plan: |`,
 * indented by the emitter's indentation).  plan->file stays the original
 * plan's path (relative paths in the plan are resolved against it). */
static void rebase_plan_spans(reader *r, const yaml_node_t *pn, const char *text, size_t len)
{
    cpc_plan *p = r->a->plan;
    if (!p || !pn || pn->type != YAML_SCALAR_NODE)
        return;
    size_t at = pn->start_mark.index;
    while (at < len && text[at] != '\n')
        at++;
    if (at >= len)
        return;
    at++;   /* the first content line */
    int indent = 0;
    while (at + (size_t)indent < len && text[at + (size_t)indent] == ' ')
        indent++;
    int line0 = (int)pn->start_mark.line + 1;   /* content line k is artifact line line0 + k */
    const char *file = intern(r, r->name, strlen(r->name));
    if (!file)
        return;
    for (int i = 0; i < p->n_key_spans; i++) {
        cpc_span *sp[2] = {&p->key_spans[i].key_span, &p->key_spans[i].value_span};
        for (int j = 0; j < 2; j++)
            if (sp[j]->line > 0) {
                sp[j]->file = file;
                sp[j]->line += line0;
                sp[j]->col += sp[j]->col > 0 ? indent : 0;
            }
    }
    for (int i = 0; i < p->input.n_segments; i++) {
        cpc_span *sp = &p->input.segments[i].span;
        if (sp->line > 0) {
            sp->file = file;
            sp->line += line0;
            sp->col += sp->col > 0 ? indent : 0;
        }
    }
}

static int read_doc(reader *r, const char *text, size_t len)
{
    yaml_node_t *root = yaml_document_get_root_node(&r->doc);
    if (!root || root->type != YAML_MAPPING_NODE)
        return rfail(r, root, "not a cpc artifact (the document is not a mapping)");
    /* 1. version, before anything else (a newer format may differ anywhere). */
    yaml_node_t *vn = get(r, root, "artifact_version");
    if (!vn)
        return rfail(r, root, "not a cpc artifact (no artifact_version)");
    const char *vs = scalar(vn);
    int64_t ver;
    if (!vs || parse_i64(vs, &ver))
        return rfail(r, vn, "artifact_version must be an integer");
    if (ver != CPC_ARTIFACT_VERSION)
        return rfail(r, vn,
                     "artifact version %" PRId64 " is not supported: this build reads version %d; recompile the "
                     "plan with this cpc",
                     ver, CPC_ARTIFACT_VERSION);
    r->a->artifact_version = (int)ver;
    /* 2. the hash. */
    yaml_node_t *hn = get(r, root, "content_hash");
    if (!hn)
        return rfail(r, root, "no content_hash");
    if (check_hash(r, text, len, hn))
        return -1;
    /* 3. the rest, strictly. */
    static const char *const keys[] = {"artifact_version", "compiler_version", "content_hash",
                                       "plan_file",        "plan",             "mesh",
                                       "schedule",         "backward_schedule", "kernels",
                                       "predictions"};
    if (check_keys(r, root, "artifact", keys, (int)(sizeof keys / sizeof keys[0])))
        return -1;
    const char *cv, *pf, *pt;
    if (get_str(r, root, "artifact", "compiler_version", &cv) || get_str(r, root, "artifact", "plan_file", &pf) ||
        get_str(r, root, "artifact", "plan", &pt))
        return -1;
    cpc_artifact *a = r->a;
    a->compiler_version = strdup(cv);
    a->plan_file = strdup(pf);
    a->plan_text = strdup(pt);
    if (!a->compiler_version || !a->plan_file || !a->plan_text)
        return rfail(r, NULL, "out of memory");
    cpc_status *st = load_plan_text(a->plan_text, strlen(a->plan_text), a->plan_file, CPC_E_INPUT, r->name, &a->plan);
    if (!st)
        rebase_plan_spans(r, get(r, root, "plan"), text, len);
    if (st) {
        r->err = st;
        return -1;
    }
    yaml_node_t *mesh = need(r, root, "artifact", "mesh");
    static const char *const mkeys[] = {"variant",   "ring_degree", "ulysses_degree", "cfg_degree",
                                        "tp_degree", "world_size",  "rank_rule"};
    int variant;
    int64_t R, U, P, C = 1, T = 1;
    const char *rule;
    if (!mesh || check_keys(r, mesh, "mesh", mkeys, 7) ||
        (get(r, mesh, "cfg_degree") && get_int(r, mesh, "mesh", "cfg_degree", 1, 1 << 20, &C)) ||
        (get(r, mesh, "tp_degree") && get_int(r, mesh, "mesh", "tp_degree", 1, 1 << 20, &T)) ||
        get_enum(r, mesh, "mesh", "variant", cpc_variant_parse, &variant) ||
        get_int(r, mesh, "mesh", "ring_degree", 1, 1 << 20, &R) ||
        get_int(r, mesh, "mesh", "ulysses_degree", 1, 1 << 20, &U) ||
        get_int(r, mesh, "mesh", "world_size", 1, 1 << 20, &P) || get_str(r, mesh, "mesh", "rank_rule", &rule))
        return -1;
    const char *want_rule = C * T > 1 ? RANK_RULE_AXES : RANK_RULE;
    if (strcmp(rule, want_rule) != 0)
        return rfail(r, get(r, mesh, "rank_rule"), "mesh.rank_rule '%s' is not the one this build uses ('%s')", rule,
                     want_rule);
    if (C * T * R * U != P || P != a->plan->cluster.world_size || variant == CPC_VARIANT_AUTO ||
        variant != (int)a->plan->parallel.variant || R != a->plan->parallel.ring_degree ||
        U != a->plan->parallel.ulysses_degree || C != cpc_plan_cfg_degree(a->plan) ||
        T != cpc_plan_tp_degree(a->plan))
        return rfail(r, mesh,
                     "the mesh (%s, ring_degree %" PRId64 ", ulysses_degree %" PRId64 ", cfg_degree %" PRId64
                     ", tp_degree %" PRId64 ", world_size %" PRId64
                     ") contradicts the plan (%s, %d x %d, cfg_degree %d, tp_degree %d, world_size %d)",
                     cpc_variant_name((cpc_variant)variant), R, U, C, T, P,
                     cpc_variant_name(a->plan->parallel.variant), a->plan->parallel.ring_degree,
                     a->plan->parallel.ulysses_degree, cpc_plan_cfg_degree(a->plan), cpc_plan_tp_degree(a->plan),
                     a->plan->cluster.world_size);
    cpc_plan sub;
    if (!plan_for_layout(a->plan, &sub))
        return rfail(r, mesh, "mesh: cfg_degree %" PRId64 " x tp_degree %" PRId64 " does not cut the plan "
                     "(batch %d, heads %d, kv_heads %d, world_size %d)", C, T, a->plan->input.batch,
                     a->plan->model.heads, a->plan->model.kv_heads, a->plan->cluster.world_size);
    cpc_layout L;
    st = cpc_layout_init(&L, &sub, (cpc_variant)variant, (int)R, (int)U);
    if (st) {
        rfail(r, mesh, "mesh: %s", st->message);
        cpc_status_free(st);
        return -1;
    }
    a->program = cpc_program_new(&L, true, CPC_ROTATE_P2P);
    if (!a->program)
        return rfail(r, NULL, "out of memory");
    yaml_node_t *s = need(r, root, "artifact", "schedule");
    if (!s || read_schedule(r, s, "schedule", a->program))
        return -1;
    yaml_node_t *bs = get(r, root, "backward_schedule");
    if (bs) {
        if (a->plan->input.mode != CPC_MODE_TRAINING)
            return rfail(r, bs, "backward_schedule in an artifact whose plan is not mode: training");
        a->backward = cpc_program_new(&L, true, CPC_ROTATE_P2P);
        if (!a->backward)
            return rfail(r, NULL, "out of memory");
        if (read_schedule(r, bs, "backward_schedule", a->backward))
            return -1;
    }
    yaml_node_t *k = need(r, root, "artifact", "kernels");
    if (!k || read_kernels(r, k))
        return -1;
    yaml_node_t *p = need(r, root, "artifact", "predictions");
    if (!p || read_predictions(r, p))
        return -1;
    return 0;
}

/* Collections nested deeper than this are refused (the format needs 8). */
#define MAX_YAML_DEPTH 64

static cpc_status *parse_error(yaml_parser_t *parser, const char *name)
{
    cpc_span sp = {name, (int)parser->problem_mark.line + 1, (int)parser->problem_mark.column + 1};
    return cpc_diag(CPC_E_INPUT, 0, CPC_SEV_ERROR, sp,
                    "artifact %s: not a valid YAML document (%s%s%s): truncated or garbled?", name,
                    parser->problem ? parser->problem : "syntax error", parser->context ? " " : "",
                    parser->context ? parser->context : "");
}

static cpc_status *check_depth(const char *text, size_t len, const char *name)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return &cpc_status_oom;
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    cpc_status *st = NULL;
    int depth = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            st = parse_error(&parser, name);
            break;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT)
            depth++;
        else if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT)
            depth--;
        int line = (int)ev.start_mark.line + 1, col = (int)ev.start_mark.column + 1;
        yaml_event_delete(&ev);
        if (depth > MAX_YAML_DEPTH) {
            cpc_span sp = {name, line, col};
            st = cpc_diag(CPC_E_INPUT, 0, CPC_SEV_ERROR, sp,
                          "artifact %s: collections nested deeper than %d levels (not a cpc artifact)", name,
                          MAX_YAML_DEPTH);
            break;
        }
        if (t == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&parser);
    return st;
}

cpc_status *cpc_artifact_read_string(const char *text, size_t len, const char *name, cpc_artifact **out)
{
    *out = NULL;
    if (!name)
        name = "<artifact>";
    if (!text)
        return cpc_error(CPC_E_INTERNAL, "artifact: no text");
    if (len > CPC_ARTIFACT_MAX_BYTES)
        return cpc_error(CPC_E_INPUT, "artifact %s: %zu bytes, more than the %zu accepted", name, len,
                         CPC_ARTIFACT_MAX_BYTES);
    reader r;
    memset(&r, 0, sizeof r);
    r.a = calloc(1, sizeof *r.a);
    if (!r.a)
        return &cpc_status_oom;
    r.a->path = strdup(name);
    if (!r.a->path) {
        cpc_artifact_free(r.a);
        return &cpc_status_oom;
    }
    r.name = r.a->path;
    if (len == 0) {
        cpc_artifact_free(r.a);
        return cpc_error(CPC_E_INPUT, "artifact %s: empty file (not a cpc artifact)", name);
    }
    /* Pass 1: events only, to refuse deep nesting early (libyaml's scanner
     * slows down quadratically with flow nesting depth). */
    cpc_status *dst = check_depth(text, len, name);
    if (dst) {
        cpc_artifact_free(r.a);
        return dst;
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        cpc_artifact_free(r.a);
        return &cpc_status_oom;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &r.doc)) {
        cpc_status *st = parse_error(&parser, r.name);
        yaml_parser_delete(&parser);
        cpc_artifact_free(r.a);
        return st;
    }
    /* A second document is refused. */
    yaml_document_t extra;
    int more = 0;
    if (yaml_parser_load(&parser, &extra)) {
        more = yaml_document_get_root_node(&extra) != NULL;
        yaml_document_delete(&extra);
    } else {
        more = 1;
    }
    yaml_parser_delete(&parser);
    if (more)
        rfail(&r, NULL, "more than one YAML document, or garbage after the document");
    else
        read_doc(&r, text, len);
    yaml_document_delete(&r.doc);
    if (r.err) {
        cpc_artifact_free(r.a);
        return r.err;
    }
    *out = r.a;
    return NULL;
}

cpc_status *cpc_artifact_read(const char *path, cpc_artifact **out)
{
    *out = NULL;
    if (!path)
        return cpc_error(CPC_E_USAGE, "artifact: no path");
    cpc_status *ost = NULL;
    FILE *f = cpc_fopen_read(path, "artifact", true, &ost);
    if (!f)
        return ost;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return &cpc_status_oom;
    }
    for (;;) {
        if (len == cap) {
            if (cap > CPC_ARTIFACT_MAX_BYTES) {
                free(buf);
                fclose(f);
                return cpc_error(CPC_E_INPUT, "artifact %s: larger than %zu bytes", path, CPC_ARTIFACT_MAX_BYTES);
            }
            char *n = realloc(buf, cap * 2);
            if (!n) {
                free(buf);
                fclose(f);
                return &cpc_status_oom;
            }
            buf = n;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    bool err = ferror(f);
    int e = errno;
    fclose(f);
    if (err) {
        free(buf);
        return cpc_errno_status(CPC_E_IO, e ? e : EIO, path);
    }
    cpc_status *st = cpc_artifact_read_string(buf, len, path, out);
    free(buf);
    return st;
}
