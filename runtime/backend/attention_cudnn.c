/* attention_cudnn.c - see attention_cudnn.h */
#include "attention_cudnn.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The SDPA forward operation of the backend API (CUDNN_BACKEND_OPERATION_SDPA_FWD_
 * DESCRIPTOR, CUDNN_ATTR_OPERATION_SDPA_FWD_*) is in cudnn_graph.h from 9.13.0;
 * cudnn-frontend uses it ("UnifiedSDPANode") only from 9.13.1, at compile time
 * and at run time (node/scaled_dot_product_flash_attention.h,
 * node/sdpa_support_surface.h: "Unified SDPA node requires cuDNN 9.13.1"), so
 * older headers build the stubs below and older libraries are refused at run
 * time. */
#define SDPA_MIN_VERSION 91301
#ifdef CPC_HAVE_CUDNN
#include <cudnn_version.h>
#if CUDNN_VERSION >= SDPA_MIN_VERSION
#define CPC_CUDNN_SDPA 1
#endif
#endif

/* ---- the split (pure) ------------------------------------------------------- */

/* Keys at positions <= pos among sorted, disjoint runs. */
static int64_t visible_keys(const cpc_run *kv, int m, int64_t pos)
{
    int64_t n = 0;
    for (int i = 0; i < m; i++) {
        if (kv[i].len <= 0)
            continue;
        if (pos < kv[i].start)
            break;
        int64_t c = pos - kv[i].start + 1;
        n += c < kv[i].len ? c : kv[i].len;
    }
    return n;
}

static cpc_status *add_part(cpc_sdpa_split *sp, cpc_sdpa_part_kind kind, int64_t row0,
                            int64_t rows, int64_t nkv)
{
    if (rows <= 0)
        return NULL;
    if (sp->n_parts > 0) {
        cpc_sdpa_part *last = &sp->parts[sp->n_parts - 1];
        if (last->kind == kind && last->row0 + last->rows == row0 &&
            (kind == CPC_SDPA_PART_EMPTY || last->nkv == nkv)) {
            last->rows += rows;
            return NULL;
        }
    }
    if (sp->n_parts == CPC_SDPA_MAX_PARTS)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "cuDNN SDPA: the causal block splits into more than %d parts",
                         CPC_SDPA_MAX_PARTS);
    sp->parts[sp->n_parts++] = (cpc_sdpa_part){kind, row0, rows, kind == CPC_SDPA_PART_FULL ? nkv : 0};
    return NULL;
}

cpc_status *cpc_cudnn_sdpa_split(const cpc_attn_problem *a, cpc_sdpa_split *sp)
{
    memset(sp, 0, sizeof *sp);
    cpc_status *st = cpc_attn_problem_check(a);
    if (st)
        return st;
    if (a->dtype != CPC_DTYPE_BF16 && a->dtype != CPC_DTYPE_FP16)
        return cpc_error(CPC_E_UNSUPPORTED, "cuDNN SDPA: %s is not supported (bf16/fp16 only)",
                         cpc_dtype_name(a->dtype));
    if (a->d % 8 != 0 || a->d < 8 || a->d > 256)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "cuDNN SDPA: head_dim %d is not a multiple of 8 in 8..256", a->d);
    if (a->kv_mask)
        return cpc_error(CPC_E_UNSUPPORTED, "cuDNN SDPA: key padding masks are not supported");
    if (a->B < 1 || a->hq < 1)
        return cpc_error(CPC_E_UNSUPPORTED, "cuDNN SDPA: empty block (B %d, hq %d)", a->B, a->hq);
    /* GQA: local query head h uses local K/V head (q_head_off + h) / group -
     * kv_head_off; cuDNN needs h / ratio + kv_head0. */
    int g = a->group, first = a->q_head_off / g, last = (a->q_head_off + a->hq - 1) / g;
    if (first == last) {
        sp->ratio = a->hq;   /* every query head on one K/V head (MQA, or g == hq) */
    } else if (a->q_head_off % g == 0 && a->hq % g == 0) {
        sp->ratio = g;
    } else {
        return cpc_error(CPC_E_UNSUPPORTED,
                         "cuDNN SDPA: query heads [%d, %d) with GQA ratio %d do not map to whole "
                         "K/V head groups",
                         a->q_head_off, a->q_head_off + a->hq, g);
    }
    sp->hkv = a->hq / sp->ratio;
    sp->kv_head0 = first - a->kv_head_off; /* inside the block: cpc_attn_problem_check */
    if (a->sq == 0)
        return NULL;
    if (a->skv == 0)
        return add_part(sp, CPC_SDPA_PART_EMPTY, 0, a->sq, 0);
    if (!a->causal)
        return add_part(sp, CPC_SDPA_PART_FULL, 0, a->sq, a->skv);

    /* Causal: positions come from the runs (they cover the rows:
     * cpc_attn_problem_check). */
    int64_t prev_end = INT64_MIN;
    for (int i = 0; i < a->n_kv_runs; i++) {
        const cpc_run *r = &a->kv_runs[i];
        if (r->len <= 0)
            continue;
        if (r->start < prev_end)
            return cpc_error(CPC_E_UNSUPPORTED,
                             "cuDNN SDPA: causal block whose key runs are not in increasing order");
        prev_end = r->start + r->len;
    }
    int64_t row = 0;
    for (int i = 0; i < a->n_q_runs; i++) {
        const cpc_run *r = &a->q_runs[i];
        if (r->len <= 0)
            continue;
        int64_t lf = visible_keys(a->kv_runs, a->n_kv_runs, r->start);
        int64_t ll = visible_keys(a->kv_runs, a->n_kv_runs, r->start + r->len - 1);
        if (ll == 0)
            st = add_part(sp, CPC_SDPA_PART_EMPTY, row, r->len, 0);
        else if (lf == ll)
            st = add_part(sp, CPC_SDPA_PART_FULL, row, r->len, lf);
        else
            st = cpc_error(CPC_E_UNSUPPORTED,
                           "cuDNN SDPA: causal block on the diagonal (query positions [%lld, %lld) "
                           "see %lld to %lld keys); the SDPA operation of the backend API has no "
                           "causal mask",
                           (long long)r->start, (long long)(r->start + r->len), (long long)lf,
                           (long long)ll);
        if (st)
            return st;
        row += r->len;
    }
    return NULL;
}

#ifndef CPC_CUDNN_SDPA

size_t cpc_cudnn_version(void) { return 0; }

cpc_status *cpc_cudnn_sdpa_create(int device, cpc_cudnn_sdpa **out)
{
    (void)device;
    *out = NULL;
    return cpc_error(CPC_E_UNSUPPORTED,
                     "cuDNN: this build has no cuDNN SDPA (libcudnn not found at build time, or "
                     "cudnn_version.h older than 9.13.1)");
}

cpc_status *cpc_cudnn_sdpa_run(cpc_cudnn_sdpa *s, const cpc_attn_problem *a,
                               const cpc_sdpa_split *split, void *o, float *lse, void *stream)
{
    (void)s, (void)a, (void)split, (void)o, (void)lse, (void)stream;
    return cpc_error(CPC_E_UNSUPPORTED, "cuDNN: this build has no cuDNN");
}

void cpc_cudnn_sdpa_counts(const cpc_cudnn_sdpa *s, int *plans_built, int *refused)
{
    (void)s;
    *plans_built = 0;
    *refused = 0;
}

void cpc_cudnn_sdpa_destroy(cpc_cudnn_sdpa *s) { (void)s; }

#else /* CPC_CUDNN_SDPA */

#include <cuda_runtime.h>
#include <cudnn_graph.h>

#define SDPA_CACHE 32
#define SDPA_MAX_DESC 24

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE };

/* Everything a plan depends on (int64 only: no padding, compared with memcmp). */
typedef struct sdpa_key {
    int64_t dtype, B, hq, hkv, sq, skv, d, stats;
    int64_t lse_align;                          /* bytes: 4, 8 or 16 (of the STATS pointer) */
    int64_t q_str[4], kv_str[4], o_str[4], lse_str[4];
} sdpa_key;

typedef struct sdpa_entry {
    bool used;
    bool ok;
    sdpa_key key;
    char *why;                                  /* refusal (when !ok), owned */
    cudnnBackendDescriptor_t desc[SDPA_MAX_DESC];  /* destroyed in reverse order */
    int n_desc;
    cudnnBackendDescriptor_t plan;              /* one of desc[] */
    int64_t workspace;
    uint64_t last_use;
} sdpa_entry;

struct cpc_cudnn_sdpa {
    int device;
    cudnnHandle_t handle;
    void *ws;
    size_t ws_cap;
    float *lse_tmp;    /* packed [B, hq, rows] stats of a part that is not all rows */
    size_t lse_tmp_cap;   /* floats */
    uint64_t clock;
    int built, refused;
    sdpa_entry cache[SDPA_CACHE];
};

size_t cpc_cudnn_version(void) { return cudnnGetVersion(); }

/* A cuDNN failure as a status: cudnnGetErrorString and the last error text. */
static cpc_status *dnn_err(cpc_code code, cudnnStatus_t s, const char *what)
{
    char last[512];
    last[0] = 0;
    cudnnGetLastErrorString(last, sizeof last);
    size_t n = strlen(last);
    while (n > 0 && (last[n - 1] == '\n' || last[n - 1] == ' '))
        last[--n] = 0;
    return cpc_error(code, "cuDNN: %s: %s (%d)%s%s", what, cudnnGetErrorString(s), (int)s,
                     last[0] ? ": " : "", last);
}

#define DNN(call, code, what)                                                                  \
    do {                                                                                       \
        cudnnStatus_t s_ = (call);                                                             \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                        \
            return dnn_err(code, s_, what);                                                    \
    } while (0)

cpc_status *cpc_cudnn_sdpa_create(int device, cpc_cudnn_sdpa **out)
{
    *out = NULL;
    size_t v = cudnnGetVersion();
    if (v < SDPA_MIN_VERSION)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "cuDNN %zu.%zu.%zu has no usable SDPA forward operation in its backend API "
                         "(9.13.1 or newer needed)",
                         v / 10000, v / 100 % 100, v % 100);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cpc_error(CPC_E_UNSUPPORTED, "cuDNN: no usable CUDA device %d: %s", device,
                         cudaGetErrorString(e));
    }
    cpc_cudnn_sdpa *s = calloc(1, sizeof *s);
    if (!s)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    s->device = device;
    cudnnStatus_t ds = cudnnCreate(&s->handle);
    if (ds != CUDNN_STATUS_SUCCESS) {
        cpc_status *st = dnn_err(CPC_E_UNSUPPORTED, ds, "cudnnCreate");
        (void)cudaGetLastError();
        free(s);
        return st;
    }
    *out = s;
    return NULL;
}

static void entry_clear(sdpa_entry *en)
{
    for (int i = en->n_desc - 1; i >= 0; i--)
        if (en->desc[i])
            cudnnBackendDestroyDescriptor(en->desc[i]);
    free(en->why);
    memset(en, 0, sizeof *en);
}

void cpc_cudnn_sdpa_destroy(cpc_cudnn_sdpa *s)
{
    if (!s)
        return;
    /* Work queued with these plans may still be running: wait for it before
     * the plans (and whatever device code they own) go away. */
    cudaSetDevice(s->device);
    if (s->built > 0) {
        (void)cudaDeviceSynchronize();
        (void)cudaGetLastError();
    }
    for (int i = 0; i < SDPA_CACHE; i++)
        if (s->cache[i].used)
            entry_clear(&s->cache[i]);
    if (s->ws)
        cudaFree(s->ws);
    if (s->lse_tmp)
        cudaFree(s->lse_tmp);
    if (s->handle)
        cudnnDestroy(s->handle);
    free(s);
}

void cpc_cudnn_sdpa_counts(const cpc_cudnn_sdpa *s, int *plans_built, int *refused)
{
    *plans_built = s ? s->built : 0;
    *refused = s ? s->refused : 0;
}

/* Creates a descriptor kept by the entry (freed with it). */
static cpc_status *new_desc(sdpa_entry *en, cudnnBackendDescriptorType_t type,
                            cudnnBackendDescriptor_t *out, const char *what)
{
    *out = NULL;
    if (en->n_desc == SDPA_MAX_DESC)
        return cpc_error(CPC_E_INTERNAL, "cuDNN SDPA: too many descriptors");
    DNN(cudnnBackendCreateDescriptor(type, out), CPC_E_UNSUPPORTED, what);
    en->desc[en->n_desc++] = *out;
    return NULL;
}

/* `align`: the byte alignment every data pointer given for this tensor has
 * (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT; cuDNN may use vector accesses that need it). */
static cpc_status *make_tensor(sdpa_entry *en, int64_t uid, cudnnDataType_t dt,
                               const int64_t dims[4], const int64_t strides[4], bool by_value,
                               int64_t align, cudnnBackendDescriptor_t *out)
{
    cpc_status *st = new_desc(en, CUDNN_BACKEND_TENSOR_DESCRIPTOR, out, "create tensor descriptor");
    if (st)
        return st;
    bool virt = false;
    cudnnBackendDescriptor_t t = *out;
    DNN(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt),
        CPC_E_UNSUPPORTED, "tensor data type");
    DNN(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims),
        CPC_E_UNSUPPORTED, "tensor dimensions");
    DNN(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides),
        CPC_E_UNSUPPORTED, "tensor strides");
    DNN(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid),
        CPC_E_UNSUPPORTED, "tensor unique id");
    DNN(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align),
        CPC_E_UNSUPPORTED, "tensor alignment");
    DNN(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt),
        CPC_E_UNSUPPORTED, "tensor is-virtual");
    if (by_value)
        DNN(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1,
                                     &by_value),
            CPC_E_UNSUPPORTED, "tensor by-value");
    DNN(cudnnBackendFinalize(t), CPC_E_UNSUPPORTED, "finalize tensor");
    return NULL;
}

static cpc_status *set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                            cudnnBackendDescriptor_t value, const char *what)
{
    DNN(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value),
        CPC_E_UNSUPPORTED, what);
    return NULL;
}

/* Asks the heuristics in `mode` and keeps the first config that finalizes
 * into a plan.  Leaves en->plan NULL when none does (st describes the last
 * failure). */
static cpc_status *try_heuristics(cpc_cudnn_sdpa *s, sdpa_entry *en,
                                  cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode)
{
    cudnnBackendDescriptor_t heur;
    cpc_status *st = new_desc(en, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur, "create heuristics");
    if (st)
        return st;
    if ((st = set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph")))
        return st;
    DNN(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode),
        CPC_E_UNSUPPORTED, "heuristics mode");
    DNN(cudnnBackendFinalize(heur), CPC_E_UNSUPPORTED, "finalize heuristics");
    int64_t count = 0;
    DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 0, &count, NULL),
        CPC_E_UNSUPPORTED, "heuristics result count");
    if (count <= 0)
        return cpc_error(CPC_E_UNSUPPORTED, "cuDNN: the heuristics (mode %d) offer no engine",
                         (int)mode);
    if (count > 8)
        count = 8;
    cudnnBackendDescriptor_t cfg[8];
    int64_t got = 0;
    int n_cfg = 0;
    cpc_status *last = NULL;
    for (int i = 0; i < count; i++) {
        cudnnStatus_t ds = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[i]);
        if (ds != CUDNN_STATUS_SUCCESS) {
            st = dnn_err(CPC_E_UNSUPPORTED, ds, "create engine config");
            break;
        }
        n_cfg++;
    }
    if (!st) {
        cudnnStatus_t ds = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg);
        if (ds != CUDNN_STATUS_SUCCESS)
            st = dnn_err(CPC_E_UNSUPPORTED, ds, "heuristics results");
    }
    int chosen = -1;
    for (int i = 0; !st && i < got && i < n_cfg; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        cudnnStatus_t ds = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        if (ds == CUDNN_STATUS_SUCCESS)
            ds = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                          &s->handle);
        if (ds == CUDNN_STATUS_SUCCESS)
            ds = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (ds == CUDNN_STATUS_SUCCESS)
            ds = cudnnBackendFinalize(plan);
        if (ds == CUDNN_STATUS_SUCCESS) {
            chosen = i;
            en->plan = plan;
            cpc_status_free(last);
            last = NULL;
            break;
        }
        cpc_status_free(last);
        last = dnn_err(CPC_E_UNSUPPORTED, ds, "build an execution plan");
        if (plan)
            cudnnBackendDestroyDescriptor(plan);
    }
    /* Keep the chosen config and the plan with the entry; free the others. */
    for (int i = 0; i < n_cfg; i++) {
        if (i != chosen) {
            cudnnBackendDestroyDescriptor(cfg[i]);
        } else if (en->n_desc + 2 <= SDPA_MAX_DESC) {
            en->desc[en->n_desc++] = cfg[i];
            en->desc[en->n_desc++] = en->plan;
        } else {
            cudnnBackendDestroyDescriptor(en->plan);
            cudnnBackendDestroyDescriptor(cfg[i]);
            en->plan = NULL;
            if (!st)
                st = cpc_error(CPC_E_INTERNAL, "cuDNN SDPA: too many descriptors");
        }
    }
    if (!st && !en->plan && last) {
        st = last;
        last = NULL;
    }
    cpc_status_free(last);
    if (!st && !en->plan)
        st = cpc_error(CPC_E_UNSUPPORTED, "cuDNN: no engine config of the heuristics (mode %d) "
                                          "builds an execution plan", (int)mode);
    return st;
}

/* Builds the plan of `en->key` (operation, graph, heuristics, plan). */
static cpc_status *build_plan(cpc_cudnn_sdpa *s, sdpa_entry *en)
{
    const sdpa_key *k = &en->key;
    cudnnDataType_t io = k->dtype == CPC_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    int64_t qd[4] = {k->B, k->hq, k->sq, k->d}, kvd[4] = {k->B, k->hkv, k->skv, k->d};
    int64_t sd[4] = {k->B, k->hq, k->sq, 1}, one[4] = {1, 1, 1, 1};
    cudnnBackendDescriptor_t tq, tk, tv, to, ts = NULL, tsc, op, graph;
    cpc_status *st;
    if ((st = make_tensor(en, UID_Q, io, qd, k->q_str, false, 16, &tq)) ||
        (st = make_tensor(en, UID_K, io, kvd, k->kv_str, false, 16, &tk)) ||
        (st = make_tensor(en, UID_V, io, kvd, k->kv_str, false, 16, &tv)) ||
        (st = make_tensor(en, UID_O, io, qd, k->o_str, false, 16, &to)) ||
        (k->stats && (st = make_tensor(en, UID_STATS, CUDNN_DATA_FLOAT, sd, k->lse_str, false,
                                       k->lse_align, &ts))) ||
        (st = make_tensor(en, UID_SCALE, CUDNN_DATA_FLOAT, one, one, true, 16, &tsc)))
        return st;
    if ((st = new_desc(en, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, &op,
                       "create the SDPA forward operation")) ||
        (st = set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, tq, "SDPA Q")) ||
        (st = set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, tk, "SDPA K")) ||
        (st = set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, tv, "SDPA V")) ||
        (st = set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, to, "SDPA O")) ||
        (ts && (st = set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, ts, "SDPA STATS"))) ||
        (st = set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, tsc, "SDPA SCALE")))
        return st;
    DNN(cudnnBackendFinalize(op), CPC_E_UNSUPPORTED, "finalize the SDPA forward operation");
    if ((st = new_desc(en, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph, "create graph")))
        return st;
    DNN(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                 &s->handle),
        CPC_E_UNSUPPORTED, "graph handle");
    if ((st = set_desc(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op, "graph operations")))
        return st;
    DNN(cudnnBackendFinalize(graph), CPC_E_UNSUPPORTED, "finalize the operation graph");
    st = try_heuristics(s, en, graph, CUDNN_HEUR_MODE_A);
    if (st) {
        cpc_status *st2 = try_heuristics(s, en, graph, CUDNN_HEUR_MODE_FALLBACK);
        if (!st2) {
            cpc_status_free(st);
            st = NULL;
        } else {
            cpc_status_free(st2);
        }
    }
    if (st)
        return st;
    DNN(cudnnBackendGetAttribute(en->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, &(int64_t){0}, &en->workspace),
        CPC_E_UNSUPPORTED, "plan workspace size");
    return NULL;
}

/* The cached entry of `key`, building it when absent.  On refusal returns
 * CPC_E_UNSUPPORTED (also for a refusal cached earlier). */
static cpc_status *get_plan(cpc_cudnn_sdpa *s, const sdpa_key *key, void *stream,
                            sdpa_entry **out)
{
    *out = NULL;
    sdpa_entry *victim = NULL;
    for (int i = 0; i < SDPA_CACHE; i++) {
        sdpa_entry *en = &s->cache[i];
        if (en->used && memcmp(&en->key, key, sizeof *key) == 0) {
            en->last_use = ++s->clock;
            if (!en->ok)
                return cpc_error(CPC_E_UNSUPPORTED, "%s", en->why ? en->why : "cuDNN SDPA: refused");
            *out = en;
            return NULL;
        }
        /* A free slot first, else the least recently used. */
        if (!victim || (victim->used && (!en->used || en->last_use < victim->last_use)))
            victim = en;
    }
    if (victim->used) {
        /* Work queued with the evicted plan may still be running on `stream`. */
        if (victim->ok)
            (void)cudaStreamSynchronize((cudaStream_t)stream);
        entry_clear(victim);
    }
    victim->used = true;
    victim->key = *key;
    victim->last_use = ++s->clock;
    cpc_status *st = build_plan(s, victim);
    if (st == &cpc_status_oom) {
        entry_clear(victim);
        return st;
    }
    if (st) {
        cpc_status_prefix(st,
                          "cuDNN SDPA cannot serve %s B=%lld hq=%lld hkv=%lld rows=%lld keys=%lld "
                          "head_dim=%lld",
                          cpc_dtype_name((cpc_dtype)key->dtype), (long long)key->B,
                          (long long)key->hq, (long long)key->hkv, (long long)key->sq,
                          (long long)key->skv, (long long)key->d);
        /* Keep the refusal, drop the descriptors. */
        char *why = strdup(st->message);
        for (int i = victim->n_desc - 1; i >= 0; i--)
            cudnnBackendDestroyDescriptor(victim->desc[i]);
        victim->n_desc = 0;
        victim->plan = NULL;
        victim->ok = false;
        victim->why = why;
        s->refused++;
        if (st->code != CPC_E_NOMEM && st->code != CPC_E_INTERNAL)
            st->code = CPC_E_UNSUPPORTED;
        return st;
    }
    victim->ok = true;
    s->built++;
    *out = victim;
    return NULL;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Byte alignment of a 4-byte-aligned pointer: 16, 8 or 4. */
static int64_t align_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    return (u & 15u) == 0 ? 16 : (u & 7u) == 0 ? 8 : 4;
}

/* cuDNN refused the call before queuing anything (bad parameter or not
 * supported, cudnn_graph.h's status families 2000 and 3000): the caller can
 * run the block another way. */
static bool dnn_refused(cudnnStatus_t s)
{
    return (int)s / 1000 == CUDNN_STATUS_BAD_PARAM / 1000 ||
           (int)s / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000;
}

cpc_status *cpc_cudnn_sdpa_run(cpc_cudnn_sdpa *s, const cpc_attn_problem *a,
                               const cpc_sdpa_split *split, void *o, float *lse, void *stream)
{
    cpc_sdpa_split local;
    cpc_status *st;
    if (!split) {
        if ((st = cpc_cudnn_sdpa_split(a, &local)))
            return st;
        for (int i = 0; i < local.n_parts; i++)
            if (local.parts[i].kind == CPC_SDPA_PART_EMPTY)
                return cpc_error(CPC_E_UNSUPPORTED,
                                 "cuDNN SDPA: query rows that see no key need the caller's fill");
        split = &local;
    }
    /* cudnn-frontend's SDPA test harness skips s_q == s_kv == 1 as a known
     * issue (test/python/sdpa/fp16.py); such a part is cheap elsewhere. */
    for (int i = 0; i < split->n_parts; i++)
        if (split->parts[i].kind == CPC_SDPA_PART_FULL && split->parts[i].rows == 1 &&
            split->parts[i].nkv == 1)
            return cpc_error(CPC_E_UNSUPPORTED,
                             "cuDNN SDPA: a part of one query row and one key (a known cuDNN issue)");
    /* Q/K/V/O are declared 16-byte aligned (make_tensor): every batch start
     * must be too (head and row strides are, d being a multiple of 8). */
    if (a->q_bstride % 8 != 0 || a->kv_bstride % 8 != 0)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "cuDNN SDPA: batch strides (%lld, %lld elements) are not multiples of 8",
                         (long long)a->q_bstride, (long long)a->kv_bstride);
    /* The handle belongs to s->device; the calling thread may have another
     * device current. */
    cudaError_t ce = cudaSetDevice(s->device);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return cpc_error(CPC_E_RUNTIME, "cuDNN SDPA: cudaSetDevice(%d): %s", s->device,
                         cudaGetErrorString(ce));
    }
    DNN(cudnnSetStream(s->handle, (cudaStream_t)stream), CPC_E_RUNTIME, "cudnnSetStream");
    const int64_t es = 2, d = a->d, hq = a->hq, sq = a->sq;
    const char *qb = a->q, *kb = a->k, *vb = a->v;
    char *ob = o;
    kb += (int64_t)split->kv_head0 * d * es;
    vb += (int64_t)split->kv_head0 * d * es;
    float scale = a->scale;
    for (int i = 0; i < split->n_parts; i++) {
        const cpc_sdpa_part *p = &split->parts[i];
        if (p->kind != CPC_SDPA_PART_FULL || p->rows <= 0)
            continue;
        sdpa_key key;
        memset(&key, 0, sizeof key);
        key.dtype = a->dtype;
        key.B = a->B;
        key.hq = hq;
        key.hkv = split->hkv;
        key.sq = p->rows;
        key.skv = p->nkv;
        key.d = d;
        key.stats = lse != NULL;
        /* A part that is not every row (causal splits) gets its stats packed
         * [B, hq, rows, 1] in a scratch buffer, scattered into lse after the
         * run: cuDNN's own tests only use packed stats strides, and a packed
         * buffer from cudaMalloc is 16-byte aligned. */
        bool lse_packed_tmp = lse && (p->row0 != 0 || p->rows != sq);
        int64_t qs[4] = {a->q_bstride, d, hq * d, 1}, kvs[4] = {a->kv_bstride, d, (int64_t)a->hkv * d, 1};
        int64_t os[4] = {sq * hq * d, d, hq * d, 1}, ls[4] = {hq * sq, sq, 1, 1};
        if (lse_packed_tmp) {
            ls[0] = hq * p->rows;
            ls[1] = p->rows;
        }
        memcpy(key.q_str, qs, sizeof qs);
        memcpy(key.kv_str, kvs, sizeof kvs);
        memcpy(key.o_str, os, sizeof os);
        if (lse)
            memcpy(key.lse_str, ls, sizeof ls);
        const void *qp = qb + p->row0 * hq * d * es;
        void *op = ob + p->row0 * hq * d * es;
        float *lp = lse ? lse + p->row0 : NULL;
        if (lse_packed_tmp) {
            size_t need = (size_t)(a->B * hq * p->rows);
            if (need > s->lse_tmp_cap) {
                if (s->lse_tmp) {
                    cudaStreamSynchronize((cudaStream_t)stream);
                    cudaFree(s->lse_tmp);
                }
                s->lse_tmp = NULL;
                s->lse_tmp_cap = 0;
                cudaError_t e = cudaMalloc((void **)&s->lse_tmp, need * sizeof(float));
                if (e != cudaSuccess) {
                    (void)cudaGetLastError();
                    s->lse_tmp = NULL;
                    return cpc_error(e == cudaErrorMemoryAllocation ? CPC_E_NOMEM : CPC_E_RUNTIME,
                                     "cuDNN SDPA: stats scratch of %zu floats: %s", need,
                                     cudaGetErrorString(e));
                }
                s->lse_tmp_cap = need;
            }
            lp = s->lse_tmp;
        }
        if (!aligned16(qp) || !aligned16(kb) || !aligned16(vb) || !aligned16(op) ||
            (lse && ((uintptr_t)lp & 3u)))
            return cpc_error(CPC_E_UNSUPPORTED,
                             "cuDNN SDPA: a Q/K/V/O pointer is not 16-byte aligned (or LSE not 4)");
        /* The STATS pointer of a part at row0 > 0 is only 4-byte aligned in
         * general: declare what it has (part of the plan's key). */
        key.lse_align = lse ? align_of(lp) : 0;
        sdpa_entry *en;
        if ((st = get_plan(s, &key, stream, &en)))
            return st;
        if ((size_t)en->workspace > s->ws_cap) {
            if (s->ws) {
                cudaStreamSynchronize((cudaStream_t)stream);
                cudaFree(s->ws);
                s->ws = NULL;
                s->ws_cap = 0;
            }
            cudaError_t e = cudaMalloc(&s->ws, (size_t)en->workspace);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                s->ws = NULL;
                return cpc_error(e == cudaErrorMemoryAllocation ? CPC_E_NOMEM : CPC_E_RUNTIME,
                                 "cuDNN SDPA: workspace of %lld bytes: %s",
                                 (long long)en->workspace, cudaGetErrorString(e));
            }
            s->ws_cap = (size_t)en->workspace;
        }
        int64_t uids[6] = {UID_Q, UID_K, UID_V, UID_O, UID_SCALE, UID_STATS};
        void *ptrs[6] = {(void *)qp, (void *)kb, (void *)vb, op, &scale, lp};
        int64_t n = lse ? 6 : 5;
        cudnnBackendDescriptor_t vp = NULL;
        cudnnStatus_t ds = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
        if (ds == CUDNN_STATUS_SUCCESS)
            ds = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                          uids);
        if (ds == CUDNN_STATUS_SUCCESS)
            ds = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                          CUDNN_TYPE_VOID_PTR, n, ptrs);
        if (ds == CUDNN_STATUS_SUCCESS)
            ds = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                          &s->ws);
        if (ds == CUDNN_STATUS_SUCCESS)
            ds = cudnnBackendFinalize(vp);
        if (ds == CUDNN_STATUS_SUCCESS)
            ds = cudnnBackendExecute(s->handle, en->plan, vp);
        if (ds != CUDNN_STATUS_SUCCESS) {
            /* A refusal at execution (e.g. a pointer or launch parameter the
             * engine does not take) queued nothing: the caller falls back.
             * Parts run before this one are overwritten by the fallback. */
            st = dnn_err(dnn_refused(ds) ? CPC_E_UNSUPPORTED : CPC_E_RUNTIME, ds,
                         "execute the SDPA plan");
            if (vp)
                cudnnBackendDestroyDescriptor(vp);
            return st;
        }
        cudnnBackendDestroyDescriptor(vp);
        if (lse_packed_tmp) {
            /* [B*hq rows of `rows` floats] -> lse[(b*hq + h)*sq + row0 + r] */
            cudaError_t e = cudaMemcpy2DAsync(lse + p->row0, (size_t)sq * sizeof(float), s->lse_tmp,
                                              (size_t)p->rows * sizeof(float),
                                              (size_t)p->rows * sizeof(float), (size_t)(a->B * hq),
                                              cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                return cpc_error(CPC_E_RUNTIME, "cuDNN SDPA: scatter of the stats: %s",
                                 cudaGetErrorString(e));
            }
        }
    }
    return NULL;
}

#endif /* CPC_CUDNN_SDPA */
