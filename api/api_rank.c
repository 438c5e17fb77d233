/*
 * api_rank.c - include/cpc/rank.h: one rank of an artifact over the runtime
 * layer (executor.h, backend.h, transport_*.h).
 *
 * Memory: everything is allocated in cpc_rank_create_* (the executor's
 * buffers through the backend, staging space for strided tensors, the key
 * padding mask, the LSE runs); cpc_rank_forward only copies and runs
 * (tests/test_api.c counts allocations).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpc/cpc.h"

#include "artifact.h"
#include "backend.h"
#include "executor.h"
#include "status.h"
#include "transport_local.h"
#ifdef CPC_HAVE_MPI
#include "transport_mpi.h"
#endif

struct cpc_rank {
    const cpc_artifact *a;
    int p, P;
    cpc_backend *be;
    cpc_transport *t;
    cpc_exec *ex;
    size_t esz;                      /* element size of the plan's dtype */
    int ndim[CPC_TENSOR__COUNT];
    int64_t shape[CPC_TENSOR__COUNT][4];
    void *stage[CPC_TENSOR__COUNT];  /* contiguous copies of strided tensors */
    size_t bytes[CPC_TENSOR__COUNT];
    uint8_t *mask;                   /* key padding [B, Skv], or NULL */
    bool lse_supported;
    cpc_run *lse_runs;
    int max_runs;
    cpc_token_run *shard_runs;
    int n_shard_runs;
};

void cpc_rank_options_init(cpc_rank_options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = CPC_BACKEND_AUTO;
    o->device = -1;
    o->timeout_s = 600.0;
}

cpc_status *cpc_local_world_new(const cpc_artifact *a, cpc_local_world **out)
{
    if (!a || !out)
        return cpc_error(CPC_E_USAGE, "cpc_local_world_new: artifact and out must not be NULL");
    return cpc_local_world_create(a->program->layout.R, a->program->layout.U, out);
}

void cpc_local_world_free(cpc_local_world *w)
{
    if (w)
        cpc_local_world_destroy(w);
}

void cpc_rank_destroy(cpc_rank *r)
{
    if (!r)
        return;
    cpc_exec_destroy(r->ex);
    if (r->t)
        cpc_transport_destroy(r->t);
    if (r->be)
        cpc_backend_destroy(r->be);
    for (int i = 0; i < CPC_TENSOR__COUNT; i++)
        free(r->stage[i]);
    free(r->mask);
    free(r->lse_runs);
    free(r->shard_runs);
    free(r);
}

static size_t elem_size(cpc_dtype d)
{
    return d == CPC_DTYPE_FP32 ? 4 : d == CPC_DTYPE_U8 ? 1 : 2;
}

/* Everything after the transport: backend, executor, staging. Takes t. */
static cpc_status *rank_finish(const cpc_artifact *a, int p, cpc_transport *t,
                               const cpc_rank_options *opts, cpc_rank **out)
{
    cpc_rank_options d;
    if (!opts) {
        cpc_rank_options_init(&d);
        opts = &d;
    }
    cpc_rank *r = calloc(1, sizeof *r);
    if (!r) {
        if (t)
            cpc_transport_destroy(t);
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    r->a = a;
    r->p = p;
    r->t = t;
    const cpc_layout *L = &a->program->layout;
    r->P = cpc_artifact_world_size(a);
    /* the program's rank: p's rank in its (c, t) group (compiler.h THE OUTER AXES) */
    cpc_rank_slice sl;
    cpc_status *sst = cpc_artifact_rank_slice(a, p, &sl);
    if (sst) {
        cpc_rank_destroy(r);
        return sst;
    }
    cpc_status *st = NULL;
    if (opts->backend == CPC_BACKEND_CUDA) {
        st = cpc_error(CPC_E_UNSUPPORTED,
                       "rank %d: the rank API runs on the CPU backend only in this release "
                       "(device tensors are not bound yet); cprun --backend cuda runs the "
                       "CUDA path", p);
        goto fail;
    }
    cpc_cpu_backend_single_thread_blas();
    if ((st = cpc_cpu_backend_create(&r->be)))
        goto fail;
    r->esz = elem_size(L->dtype);
    for (int role = 0; role < CPC_TENSOR__COUNT; role++) {
        if ((st = cpc_artifact_shard_shape(a, p, (cpc_tensor_role)role, &r->ndim[role],
                                           r->shape[role])))
            goto fail;
        size_t n = 1;
        for (int i = 0; i < r->ndim[role]; i++)
            n *= (size_t)r->shape[role][i];
        size_t es = role == CPC_TENSOR_LSE ? 4 : role == CPC_TENSOR_MASK ? 1 : r->esz;
        r->bytes[role] = n * es;
        if (role == CPC_TENSOR_MASK && !cpc_artifact_key_padding(a))
            continue;
        r->stage[role] = malloc(r->bytes[role] ? r->bytes[role] : 1);
        if (!r->stage[role]) {
            st = cpc_error(CPC_E_NOMEM, "rank %d: out of memory for staging", p);
            goto fail;
        }
    }
    if (cpc_artifact_key_padding(a)) {
        r->mask = calloc(r->bytes[CPC_TENSOR_MASK] ? r->bytes[CPC_TENSOR_MASK] : 1, 1);
        if (!r->mask) {
            st = cpc_error(CPC_E_NOMEM, "out of memory");
            goto fail;
        }
    }
    double scale = a->plan->model.scale > 0 ? a->plan->model.scale : 1.0 / sqrt((double)L->D);
    cpc_exec_config cfg = {.prog = a->program, .rank = sl.group_rank, .backend = r->be, .transport = t,
                           .scale = scale, .kv_mask = r->mask, .record_events = false};
    if ((st = cpc_exec_create(&cfg, &r->ex)))
        goto fail;
    /* The executor's input sizes must be the shapes we promise. */
    const int in_roles[3][2] = {{CPC_TENSOR_Q, CPC_ROLE_Q}, {CPC_TENSOR_K, CPC_ROLE_K},
                                {CPC_TENSOR_V, CPC_ROLE_V}};
    for (int i = 0; i < 3; i++) {
        size_t want = cpc_exec_input_bytes(r->ex, (cpc_buf_role)in_roles[i][1]);
        if (want && want != r->bytes[in_roles[i][0]]) {
            st = cpc_error(CPC_E_INTERNAL, "rank %d: executor input %d is %zu bytes, shape says %zu",
                           p, i, want, r->bytes[in_roles[i][0]]);
            goto fail;
        }
    }
    if (cpc_exec_output_bytes(r->ex) != r->bytes[CPC_TENSOR_OUT]) {
        st = cpc_error(CPC_E_INTERNAL, "rank %d: executor output is %zu bytes, shape says %zu", p,
                       cpc_exec_output_bytes(r->ex), r->bytes[CPC_TENSOR_OUT]);
        goto fail;
    }
    r->lse_supported = L->U == 1;
    r->max_runs = cpc_exec_max_runs(r->ex);
    r->lse_runs = calloc((size_t)(r->max_runs > 0 ? r->max_runs : 1), sizeof *r->lse_runs);
    int cap = cpc_layout_max_shard_runs(L);
    r->shard_runs = calloc((size_t)cap, sizeof *r->shard_runs);
    if (!r->lse_runs || !r->shard_runs) {
        st = cpc_error(CPC_E_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = cpc_artifact_shard_runs(a, p, r->shard_runs, cap, &r->n_shard_runs)))
        goto fail;
    *out = r;
    return NULL;
fail:
    cpc_rank_destroy(r);
    return st;
}

cpc_status *cpc_rank_create_local(const cpc_artifact *a, cpc_local_world *w, int rank,
                                  const cpc_rank_options *opts, cpc_rank **out)
{
    if (!out)
        return cpc_error(CPC_E_USAGE, "cpc_rank_create_local: out must not be NULL");
    *out = NULL;
    if (!a || !w)
        return cpc_error(CPC_E_USAGE, "cpc_rank_create_local: artifact and world must not be NULL");
    int P = cpc_artifact_world_size(a);
    if (rank < 0 || rank >= P)
        return cpc_error(CPC_E_USAGE, "rank %d is out of range (world size %d)", rank, P);
    double timeout = opts ? opts->timeout_s : 600.0;
    cpc_local_world_set_timeout(w, timeout < 0 ? 0 : timeout == 0 ? 600.0 : timeout);
    cpc_transport *t = NULL;
    /* with cfg_degree x tp_degree > 1, `w` is rank's group's world (rank.h) */
    cpc_rank_slice sl;
    cpc_status *st = cpc_artifact_rank_slice(a, rank, &sl);
    if (!st)
        st = cpc_local_endpoint_create(w, sl.group_rank, &t);
    if (st)
        return st;
    return rank_finish(a, rank, t, opts, out);
}

cpc_status *cpc_rank_create_mpi(const cpc_artifact *a, const void *mpi_comm,
                                const cpc_rank_options *opts, cpc_rank **out)
{
    if (!out)
        return cpc_error(CPC_E_USAGE, "cpc_rank_create_mpi: out must not be NULL");
    *out = NULL;
    if (!a)
        return cpc_error(CPC_E_USAGE, "cpc_rank_create_mpi: artifact must not be NULL");
#ifdef CPC_HAVE_MPI
    cpc_transport *t = NULL;
    const cpc_layout *L = &a->program->layout;
    if (cpc_artifact_cfg_degree(a) * cpc_artifact_tp_degree(a) == 1) {
        cpc_status *st = cpc_transport_mpi_create_comm(mpi_comm, L->R, L->U, &t);
        if (st)
            return st;
        return rank_finish(a, cpc_transport_group_rank(t, CPC_GROUP_WORLD), t, opts, out);
    }
    /* the outer axes (rank.h): the caller's communicator is the whole world;
     * this rank's group is split from it (color c*T + t, key its group rank) */
    int p = 0, size = 0, P = cpc_artifact_world_size(a);
    cpc_status *st = mpi_comm ? cpc_mpi_comm_rank_size(mpi_comm, &p, &size)
                              : cpc_error(CPC_E_USAGE, "mpi transport: no communicator (NULL)");
    if (st)
        return st;
    if (size != P) {
        st = cpc_error(CPC_E_USAGE,
                       "the communicator has %d processes, the artifact's world is %d (cfg_degree %d x "
                       "tp_degree %d x ring_degree %d x ulysses_degree %d)", size, P, cpc_artifact_cfg_degree(a),
                       cpc_artifact_tp_degree(a), L->R, L->U);
        cpc_status_set_hint(st, "pass a communicator of %d processes", P);
        return st;
    }
    cpc_rank_slice sl;
    if ((st = cpc_artifact_rank_slice(a, p, &sl)) ||
        (st = cpc_transport_mpi_create_split(mpi_comm, sl.group, sl.group_rank, L->R, L->U, &t)))
        return st;
    return rank_finish(a, p, t, opts, out);
#else
    (void)mpi_comm;
    (void)opts;
    return cpc_error(CPC_E_UNSUPPORTED, "libcpc was built without MPI");
#endif
}

cpc_status *cpc_rank_create_nccl(const cpc_artifact *a, void *nccl_comm, void *cuda_stream,
                                 const cpc_rank_options *opts, cpc_rank **out)
{
    (void)a, (void)nccl_comm, (void)cuda_stream, (void)opts;
    if (out)
        *out = NULL;
    return cpc_error(CPC_E_UNSUPPORTED,
                     "cpc_rank_create_nccl: ranks over a caller's NCCL communicator are not "
                     "available in this release (the rank API runs on the CPU backend; cprun "
                     "--backend cuda --transport nccl runs the GPU path)");
}

int cpc_rank_index(const cpc_rank *r) { return r->p; }
int cpc_rank_world_size(const cpc_rank *r) { return r->P; }
int64_t cpc_rank_allocated_bytes(const cpc_rank *r)
{
    int64_t n = cpc_exec_allocated_bytes(r->ex);
    for (int i = 0; i < CPC_TENSOR__COUNT; i++)
        if (r->stage[i])
            n += (int64_t)r->bytes[i];
    return n;
}

/* ---- tensors ------------------------------------------------------------------- */

static const char *role_name(int role)
{
    static const char *const n[] = {"q", "k", "v", "out", "lse", "mask"};
    return n[role];
}

static const char *dtype_str(cpc_dtype d)
{
    return d == CPC_DTYPE_U8 ? "u8" : (int)d >= 0 && d < CPC_DTYPE__COUNT ? cpc_dtype_name(d) : "?";
}

/* Checks t against the role's shape and dtype; *contig tells whether it is
 * row-major contiguous.  Writable tensors must not overlap themselves. */
static cpc_status *check_tensor(const cpc_rank *r, int role, const cpc_tensor *t, cpc_dtype want,
                                bool writable, bool *contig)
{
    const int nd = r->ndim[role];
    const int64_t *shape = r->shape[role];
    if (!t)
        return cpc_error(CPC_E_USAGE, "rank %d: tensor %s is missing", r->p, role_name(role));
    if (t->dtype != want)
        return cpc_error(CPC_E_USAGE, "rank %d: tensor %s is %s, the plan needs %s", r->p,
                         role_name(role), dtype_str(t->dtype), dtype_str(want));
    if (t->ndim != nd)
        return cpc_error(CPC_E_USAGE, "rank %d: tensor %s has %d dimensions, expected %d", r->p,
                         role_name(role), t->ndim, nd);
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != shape[i]) {
            char got[96] = "", exp[96] = "";
            for (int j = 0; j < nd; j++) {
                size_t lg = strlen(got), le = strlen(exp);
                snprintf(got + lg, sizeof got - lg, "%s%lld", j ? ", " : "", (long long)t->shape[j]);
                snprintf(exp + le, sizeof exp - le, "%s%lld", j ? ", " : "", (long long)shape[j]);
            }
            return cpc_error(CPC_E_USAGE, "rank %d: tensor %s has shape [%s], this rank's shard is [%s]",
                             r->p, role_name(role), got, exp);
        }
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    if (!t->data && n > 0)
        return cpc_error(CPC_E_USAGE, "rank %d: tensor %s has no data (NULL)", r->p, role_name(role));
    bool all_zero = true;
    for (int i = 0; i < nd; i++)
        all_zero = all_zero && t->strides[i] == 0;
    *contig = true;
    if (all_zero || n == 0)
        return NULL;
    int64_t expect = 1;
    for (int i = nd - 1; i >= 0; i--) {
        if (shape[i] > 1 && t->strides[i] <= 0)
            return cpc_error(CPC_E_USAGE, "rank %d: tensor %s: stride %lld of dimension %d must be "
                                          "positive", r->p, role_name(role),
                             (long long)t->strides[i], i);
        if (shape[i] > 1 && t->strides[i] != expect)
            *contig = false;
        expect *= shape[i];
    }
    if (writable && !*contig) {
        /* no two elements at the same address: sorted by stride, each stride
         * must step over the whole extent of the smaller ones */
        int idx[4] = {0, 1, 2, 3};
        for (int i = 0; i < nd; i++)
            for (int j = i + 1; j < nd; j++)
                if (t->strides[idx[j]] < t->strides[idx[i]]) {
                    int x = idx[i];
                    idx[i] = idx[j];
                    idx[j] = x;
                }
        int64_t span = 1;
        for (int i = 0; i < nd; i++) {
            int dmn = idx[i];
            if (shape[dmn] <= 1)
                continue;
            if (t->strides[dmn] < span)
                return cpc_error(CPC_E_USAGE, "rank %d: tensor %s: its strides make elements overlap "
                                              "(an output must not)", r->p, role_name(role));
            span = t->strides[dmn] * shape[dmn];
        }
    }
    return NULL;
}

/* Copies between a strided tensor and a contiguous buffer (to_contig: gather). */
static void strided_copy(const cpc_tensor *t, const int64_t *shape, int nd, size_t es, void *contig,
                         bool to_contig)
{
    int64_t sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
    for (int i = 0; i < nd; i++) {
        sh[4 - nd + i] = shape[i];
        st[4 - nd + i] = t->strides[i];
    }
    unsigned char *c = contig;
    unsigned char *base = t->data;
    for (int64_t i0 = 0; i0 < sh[0]; i0++)
        for (int64_t i1 = 0; i1 < sh[1]; i1++)
            for (int64_t i2 = 0; i2 < sh[2]; i2++) {
                unsigned char *row = base + (size_t)(i0 * st[0] + i1 * st[1] + i2 * st[2]) * es;
                if (st[3] == 1) {
                    if (to_contig)
                        memcpy(c, row, (size_t)sh[3] * es);
                    else
                        memcpy(row, c, (size_t)sh[3] * es);
                    c += (size_t)sh[3] * es;
                    continue;
                }
                for (int64_t i3 = 0; i3 < sh[3]; i3++, c += es) {
                    unsigned char *e = row + (size_t)(i3 * st[3]) * es;
                    if (to_contig)
                        memcpy(c, e, es);
                    else
                        memcpy(e, c, es);
                }
            }
}

cpc_status *cpc_rank_forward(cpc_rank *r, const cpc_tensor *q, const cpc_tensor *k,
                             const cpc_tensor *v, const cpc_tensor *mask, const cpc_tensor *out,
                             const cpc_tensor *lse)
{
    if (!r)
        return cpc_error(CPC_E_USAGE, "cpc_rank_forward: rank is NULL");
    const cpc_dtype dt = r->a->program->layout.dtype;
    const cpc_tensor *in[3] = {q, k, v};
    bool contig[CPC_TENSOR__COUNT] = {0};
    cpc_status *st;
    /* every argument is checked before anything is read or written */
    for (int i = 0; i < 3; i++)
        if ((st = check_tensor(r, i, in[i], dt, false, &contig[i])))
            return st;
    if ((st = check_tensor(r, CPC_TENSOR_OUT, out, dt, true, &contig[CPC_TENSOR_OUT])))
        return st;
    if (r->mask) {
        if (!mask)
            return cpc_error(CPC_E_USAGE, "rank %d: the plan has key padding: pass a mask (u8 "
                                          "[B, Skv])", r->p);
        if ((st = check_tensor(r, CPC_TENSOR_MASK, mask, CPC_DTYPE_U8, false,
                               &contig[CPC_TENSOR_MASK])))
            return st;
    } else if (mask) {
        return cpc_error(CPC_E_USAGE, "rank %d: a mask was passed but the plan's mask is %s", r->p,
                         cpc_mask_name(r->a->plan->input.mask));
    }
    if (lse) {
        if (!r->lse_supported)
            return cpc_error(CPC_E_UNSUPPORTED,
                             "rank %d: variant %s leaves the LSE in the Ulysses head layout, not "
                             "in this rank's output layout; ask for the LSE with ring, "
                             "ring_anything or none", r->p,
                             cpc_variant_name(r->a->program->layout.variant));
        if ((st = check_tensor(r, CPC_TENSOR_LSE, lse, CPC_DTYPE_FP32, true,
                               &contig[CPC_TENSOR_LSE])))
            return st;
    }

    /* inputs: bind contiguous caller memory directly, gather strided ones */
    static const cpc_buf_role exec_role[3] = {CPC_ROLE_Q, CPC_ROLE_K, CPC_ROLE_V};
    for (int i = 0; i < 3; i++) {
        const void *src = in[i]->data;
        if (!contig[i]) {
            strided_copy(in[i], r->shape[i], r->ndim[i], r->esz, r->stage[i], true);
            src = r->stage[i];
        }
        if ((st = cpc_exec_bind_input(r->ex, exec_role[i], src, r->bytes[i])))
            return st;
    }
    if (r->mask) {
        if (contig[CPC_TENSOR_MASK])
            memcpy(r->mask, mask->data, r->bytes[CPC_TENSOR_MASK]);
        else
            strided_copy(mask, r->shape[CPC_TENSOR_MASK], 2, 1, r->mask, true);
    }
    if ((st = cpc_exec_reset(r->ex)))
        return st;
    if ((st = cpc_exec_run(r->ex, NULL)))
        return st;

    void *odst = contig[CPC_TENSOR_OUT] ? out->data : r->stage[CPC_TENSOR_OUT];
    if ((st = cpc_exec_read_output(r->ex, odst, r->bytes[CPC_TENSOR_OUT])))
        return st;
    if (!contig[CPC_TENSOR_OUT])
        strided_copy(out, r->shape[CPC_TENSOR_OUT], 4, r->esz, odst, false);

    if (lse) {
        float *ldst = contig[CPC_TENSOR_LSE] ? lse->data : r->stage[CPC_TENSOR_LSE];
        int h_off = 0, h_n = 0, n_runs = 0;
        if ((st = cpc_exec_lse_into(r->ex, ldst, r->bytes[CPC_TENSOR_LSE], &h_off, &h_n,
                                    r->lse_runs, r->max_runs, &n_runs)))
            return st;
        bool same = h_off == 0 && h_n == r->shape[CPC_TENSOR_LSE][1] && n_runs == r->n_shard_runs;
        for (int i = 0; same && i < n_runs; i++)
            same = r->lse_runs[i].start == r->shard_runs[i].start &&
                   r->lse_runs[i].len == r->shard_runs[i].len;
        if (!same)
            return cpc_error(CPC_E_INTERNAL, "rank %d: the final LSE is not in the output shard's "
                                             "layout", r->p);
        if (!contig[CPC_TENSOR_LSE])
            strided_copy(lse, r->shape[CPC_TENSOR_LSE], 3, 4, ldst, false);
    }
    return NULL;
}
