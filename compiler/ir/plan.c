/* plan.c - name tables of the plan's enums, span lookup and freeing (plan.h). */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

static const char *const dtype_names[CPC_DTYPE__COUNT] = {
    [CPC_DTYPE_BF16] = "bf16",
    [CPC_DTYPE_FP16] = "fp16",
    [CPC_DTYPE_FP32] = "fp32",
};
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == CPC_DTYPE__COUNT, "dtype names");

static const char *const variant_names[CPC_VARIANT__COUNT] = {
    [CPC_VARIANT_ULYSSES] = "ulysses",
    [CPC_VARIANT_UNIFIED] = "unified",
    [CPC_VARIANT_RING] = "ring",
    [CPC_VARIANT_ULYSSES_ANYTHING] = "ulysses_anything",
    [CPC_VARIANT_RING_ANYTHING] = "ring_anything",
    [CPC_VARIANT_NONE] = "none",
    [CPC_VARIANT_AUTO] = "auto",
};
_Static_assert(sizeof variant_names / sizeof variant_names[0] == CPC_VARIANT__COUNT, "variant names");

static const char *const mask_names[CPC_MASK__COUNT] = {
    [CPC_MASK_NONE] = "none",
    [CPC_MASK_CAUSAL] = "causal",
    [CPC_MASK_KEY_PADDING] = "key_padding",
};
_Static_assert(sizeof mask_names / sizeof mask_names[0] == CPC_MASK__COUNT, "mask names");

static const char *const mode_names[CPC_MODE__COUNT] = {
    [CPC_MODE_INFERENCE] = "inference",
    [CPC_MODE_TRAINING] = "training",
};
_Static_assert(sizeof mode_names / sizeof mode_names[0] == CPC_MODE__COUNT, "mode names");

static const char *const fallback_names[CPC_FALLBACK__COUNT] = {
    [CPC_FALLBACK_STRICT] = "strict",
    [CPC_FALLBACK_AUTO] = "auto",
};
_Static_assert(sizeof fallback_names / sizeof fallback_names[0] == CPC_FALLBACK__COUNT,
               "fallback names");

static const char *const rotate_names[CPC_ROTATE__COUNT] = {
    [CPC_ROTATE_P2P] = "p2p",
    [CPC_ROTATE_ALLGATHER] = "allgather",
};
_Static_assert(sizeof rotate_names / sizeof rotate_names[0] == CPC_ROTATE__COUNT, "rotate names");

static const char *const framework_names[CPC_FRAMEWORK__COUNT] = {
    [CPC_FRAMEWORK_EAGER] = "eager",
    [CPC_FRAMEWORK_DIFFUSERS] = "diffusers",
    [CPC_FRAMEWORK_XDIT] = "xdit",
    [CPC_FRAMEWORK_SGLANG] = "sglang",
    [CPC_FRAMEWORK_COMPILED] = "compiled",
};
static const char *const attn_kernel_names[CPC_KERNEL__COUNT] = {
    [CPC_KERNEL_SDPA] = "sdpa", [CPC_KERNEL_FA2] = "fa2", [CPC_KERNEL_FA3] = "fa3",
    [CPC_KERNEL_CUDNN] = "cudnn", [CPC_KERNEL_SAGE] = "sage",
};

static const char *name_of(const char *const *names, int n, int v)
{
    return (v >= 0 && v < n && names[v]) ? names[v] : "?";
}

static int parse_of(const char *const *names, int n, const char *s)
{
    if (!s)
        return -1;
    for (int i = 0; i < n; i++)
        if (names[i] && strcmp(names[i], s) == 0)
            return i;
    return -1;
}

#define TABLE(fn, type, names, count)                                                   \
    const char *cpc_##fn##_name(type v) { return name_of(names, count, (int)v); }      \
    int cpc_##fn##_parse(const char *s) { return parse_of(names, count, s); }

TABLE(dtype, cpc_dtype, dtype_names, CPC_DTYPE__COUNT)
TABLE(variant, cpc_variant, variant_names, CPC_VARIANT__COUNT)
TABLE(mask, cpc_mask, mask_names, CPC_MASK__COUNT)
TABLE(mode, cpc_mode, mode_names, CPC_MODE__COUNT)
TABLE(fallback, cpc_fallback, fallback_names, CPC_FALLBACK__COUNT)
TABLE(rotate, cpc_rotate, rotate_names, CPC_ROTATE__COUNT)

const char *cpc_framework_name(cpc_framework f)
{
    return (int)f >= 0 && f < CPC_FRAMEWORK__COUNT ? framework_names[f] : NULL;
}

const char *cpc_attn_kernel_name(cpc_attn_kernel k)
{
    return (int)k >= 0 && k < CPC_KERNEL__COUNT ? attn_kernel_names[k] : NULL;
}

int cpc_dtype_size(cpc_dtype d)
{
    switch (d) {
    case CPC_DTYPE_BF16:
    case CPC_DTYPE_FP16: return 2;
    case CPC_DTYPE_FP32: return 4;
    default: return 0;
    }
}

static const cpc_plan_key_span *find_key(const cpc_plan *plan, const char *key, size_t len)
{
    for (int i = 0; i < plan->n_key_spans; i++) {
        const char *k = plan->key_spans[i].key;
        if (k && strlen(k) == len && memcmp(k, key, len) == 0)
            return &plan->key_spans[i];
    }
    return NULL;
}

cpc_span cpc_plan_span(const cpc_plan *plan, const char *key, bool value)
{
    if (!plan)
        return CPC_NO_SPAN;
    cpc_span none = {plan->file, 0, 0};
    if (!key)
        return none;
    size_t len = strlen(key);
    while (len > 0) {
        const cpc_plan_key_span *ks = find_key(plan, key, len);
        if (ks)
            return value ? ks->value_span : ks->key_span;
        /* Drop the last component: ".name" or "[i]". */
        size_t i = len;
        if (key[i - 1] == ']') {
            while (i > 0 && key[i - 1] != '[')
                i--;
            len = i > 0 ? i - 1 : 0;
        } else {
            while (i > 0 && key[i - 1] != '.' && key[i - 1] != ']')
                i--;
            len = (i > 0 && key[i - 1] == '.') ? i - 1 : i;
        }
    }
    return none;
}

void cpc_plan_free(cpc_plan *plan)
{
    if (!plan)
        return;
    for (int i = 0; i < plan->input.n_segments; i++)
        free(plan->input.segments[i].name);
    free(plan->input.segments);
    for (int i = 0; i < plan->n_key_spans; i++)
        free(plan->key_spans[i].key);
    free(plan->key_spans);
    free(plan->cluster.device);
    free(plan->cluster.profile);
    free(plan->schedule.script);
    free(plan->name);
    free(plan->file);
    free(plan);
}
