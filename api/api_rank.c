/*
 * api_rank.c - include/cpc/rank.h: a thin facade over the rank runtime
 * (runtime/rank.h: backend, endpoint and wrappers, executors, stall limit),
 * which cprun's job layer drives too.  What is here is the public contract:
 * argument checks, the caller's tensors (strided host tensors gathered into
 * staging, device tensors of the CUDA backend bound as they are), the
 * caller's stream, and the refusals.
 *
 * Memory: everything is allocated in cpc_rank_new_* (the executor's
 * buffers through the backend, staging space for strided tensors, the key
 * padding mask, the LSE runs; for a training artifact the backward
 * executor on the same backend and transport, dout/dq/dk/dv staging and an
 * fp32 gradient buffer); cpc_rank_forward and cpc_rank_backward only copy
 * and run (tests/test_api.c counts allocations).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpc/cpc.h"

#include "api_options.h"
#include "artifact.h"
#include "codegen.h"
#include "dtype.h"
#include "rank.h"
#include "status.h"
#include "transport_callback.h"
#include "transport_local.h"
#include "transport_mpi.h"
#include "transport_nccl.h"

struct cpc_rank {
    const cpc_artifact *a;
    int p, P;
    cpc_rt_rank *rt;                 /* the rank runtime: backend, endpoint, executors */
    cpc_backend *be;                 /* rt's */
    cpc_transport *t;                /* rt's */
    cpc_exec *ex;                    /* rt's forward executor */
    cpc_exec *bex;                   /* rt's backward executor (training artifacts), or NULL */
    bool device;                     /* CUDA backend: the caller's tensors are device memory */
    void *stream;                    /* the caller's cudaStream_t (CUDA), or NULL */
    cpc_kernel *kernels;             /* CUDA: the artifact's modules (strings borrowed) */
    cpc_kernel_spec spec;
    float *gbuf;                     /* fp32 gradient of the largest of dq, dk, dv (device
                                        memory for a CUDA rank) */
    float *saved_lse;                /* the last forward's LSE in the layout the backward
                                        program takes (cpc_rank_backward with lse NULL;
                                        device memory for a CUDA rank) */
    size_t saved_lse_bytes;
    bool lse_in_shard_layout;        /* the backward takes the LSE as [B, H, T] (U = 1) */
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

void cpc_rank_options_init(cpc_rank_options *o, size_t size)
{
    cpc_rank_options d = {.size = sizeof d, .backend = CPC_BACKEND_AUTO, .device = -1,
                          .timeout_s = CPC_RANK_DEFAULT_TIMEOUT_S};
    cpc_api_init_options(o, size, &d, sizeof d);
}

/* "plan 'NAME' (ring 2 x 1, fp32, batch 1, 32 tokens, heads 4/4, head_dim 16)":
 * how a refusal names an artifact. */
static void artifact_label(const cpc_artifact *a, char *buf, size_t n)
{
    const cpc_layout *L = &a->program->layout;
    snprintf(buf, n, "plan '%s' (%s %d x %d, %s, batch %d, %lld tokens, heads %d/%d, head_dim %d%s)",
             a->plan->name ? a->plan->name : "?", cpc_variant_name(L->variant), L->R, L->U,
             cpc_dtype_name(L->dtype), L->B, (long long)L->S, L->H, L->Hkv, L->D,
             L->cross ? ", cross-attention" : "");
}

cpc_status *cpc_local_world_new(const cpc_artifact *a, cpc_local_world **out)
{
    if (out)
        *out = NULL;
    if (!a || !out)
        return cpc_error(CPC_E_USAGE, "cpc_local_world_new: artifact and out must not be NULL");
    cpc_status *st = cpc_local_world_create(a->program->layout.R, a->program->layout.U, out);
    if (st)
        return st;
    /* the world belongs to this artifact (or an identical one: the same
     * resolved plan gives the same program): cpc_rank_new_local checks */
    char label[512];
    artifact_label(a, label, sizeof label);
    if (!cpc_local_world_set_owner(*out, a->plan_text ? a->plan_text : "", label)) {
        cpc_local_world_destroy(*out);
        *out = NULL;
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    return NULL;
}

void cpc_local_world_free(cpc_local_world *w)
{
    if (w)
        cpc_local_world_destroy(w);
}

void cpc_rank_free(cpc_rank *r)
{
    if (!r)
        return;
    if (r->device) {
        if (r->gbuf)
            cpc_backend_free(r->be, r->gbuf);
        if (r->saved_lse)
            cpc_backend_free(r->be, r->saved_lse);
    } else {
        free(r->gbuf);
        free(r->saved_lse);
    }
    cpc_rt_rank_destroy(r->rt);
    free(r->kernels);
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

/* Bytes per element of the caller's tensor `role` (cpc_tensor_role): the
 * LSE fp32, the key padding mask one byte, the others the plan's dtype. */
static size_t role_esz(const cpc_rank *r, int role)
{
    return role == CPC_TENSOR_LSE ? 4 : role == CPC_TENSOR_MASK ? 1 : r->esz;
}

/* Memory of the rank's tensors: host memory, or the CUDA backend's. */
static void *rank_alloc(cpc_rank *r, size_t bytes)
{
    if (!r->device)
        return malloc(bytes);
    void *p = NULL;
    cpc_status *st = cpc_backend_alloc(r->be, bytes, &p);
    if (st) {
        cpc_status_free(st);
        return NULL;
    }
    return p;
}

/* Everything after the transport: the rank runtime (backend, endpoint,
 * executors), staging. Takes t. */
static cpc_status *rank_finish(const cpc_artifact *a, int p, cpc_transport *t,
                               const cpc_rank_options *opts, cpc_rank **out)
{
    /* opts: read and checked by read_options (this libcpc's struct, whole) */
    cpc_rank *r = calloc(1, sizeof *r);
    if (!r) {
        if (t)
            cpc_transport_destroy(t);
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    r->a = a;
    r->p = p;
    const cpc_layout *L = &a->program->layout;
    r->P = cpc_artifact_world_size(a);
    /* the program's rank: p's rank in its (c, t) group (compiler.h THE OUTER AXES) */
    cpc_rank_slice sl;
    cpc_status *sst = cpc_artifact_rank_slice(a, p, &sl);
    if (sst) {
        if (t)
            cpc_transport_destroy(t);
        cpc_rank_free(r);
        return sst;
    }
    cpc_status *st = NULL;
    /* the backend: CPU (auto), or CUDA on the caller's device buffers and
     * stream with the artifact's kernels */
    cpc_rt_rank_config rc = {.prog = a->program, .bwd = a->backward, .rank = sl.group_rank,
                             .scale = a->plan->model.scale > 0 ? a->plan->model.scale : 1.0 / sqrt((double)L->D),
                             .backend = CPC_RT_BACKEND_CPU, .transport = t, .wrap = CPC_RT_WRAP_AUTO};
    if (opts->backend == CPC_BACKEND_CUDA) {
        if (!cpc_rt_backend_get(CPC_RT_BACKEND_CUDA)) {
            st = cpc_error(CPC_E_UNSUPPORTED, "rank %d: backend cuda: this libcpc was built without the "
                                              "CUDA toolkit", p);
            goto fail;
        }
        bool have = a->n_kernels > 0;
        for (int i = 0; have && i < a->n_kernels; i++)
            have = a->kernels[i].ptx && a->kernels[i].ptx[0];
        if (!have) {
            st = cpc_error(CPC_E_UNSUPPORTED, "rank %d: backend cuda: the artifact has no compiled kernels "
                                              "(compiled with --no-kernels or without CUDA)", p);
            cpc_status_set_hint(st, "compile the plan with a libcpc built with the CUDA toolkit");
            goto fail;
        }
        if (!(r->kernels = calloc((size_t)a->n_kernels, sizeof *r->kernels))) {
            st = cpc_error(CPC_E_NOMEM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < a->n_kernels; i++) /* borrowed: the artifact outlives the rank */
            r->kernels[i] = (cpc_kernel){.name = a->kernels[i].name, .arch = a->kernels[i].arch,
                                         .source = a->kernels[i].source, .ptx = a->kernels[i].ptx};
        r->spec = cpc_kernel_spec_of(a->plan);
        rc.backend = CPC_RT_BACKEND_CUDA;
        rc.backend_params = (cpc_rt_backend_params){.device = opts->device, .spec = &r->spec,
                                                    .kernels = r->kernels, .n_kernels = a->n_kernels};
        r->device = true;
        r->stream = opts->cuda_stream;
    } else {
        cpc_cpu_backend_single_thread_blas();
    }
    if (cpc_artifact_key_padding(a)) {
        size_t mb = (size_t)L->B * (size_t)L->Skv;
        if (!(r->mask = calloc(mb ? mb : 1, 1))) {
            st = cpc_error(CPC_E_NOMEM, "out of memory");
            goto fail;
        }
    }
    rc.kv_mask = r->mask;
    t = NULL; /* the runtime's from here on */
    if ((st = cpc_rt_rank_create(&rc, &r->rt)))
        goto fail;
    r->be = r->rt->be;
    r->t = r->rt->t;
    r->ex = r->rt->ex;
    r->bex = r->rt->bex;
    if (r->device) {
        /* the caller's tensors are device memory: bound and read as they are */
        cpc_exec_set_device_io(r->ex, true);
        if (r->bex)
            cpc_exec_set_device_io(r->bex, true);
    }
    r->esz = elem_size(L->dtype);
    for (int role = 0; role < CPC_TENSOR__COUNT; role++) {
        if ((st = cpc_artifact_shard_shape(a, p, (cpc_tensor_role)role, &r->ndim[role],
                                           r->shape[role])))
            goto fail;
        size_t n = 1;
        for (int i = 0; i < r->ndim[role]; i++)
            n *= (size_t)r->shape[role][i];
        r->bytes[role] = n * role_esz(r, role);
        if (role == CPC_TENSOR_MASK && !cpc_artifact_key_padding(a))
            continue;
        if (role >= CPC_TENSOR_DOUT && !a->backward)
            continue; /* the backward's tensors: training artifacts only */
        if (r->device)
            continue; /* device tensors are bound as they are (contiguous) */
        r->stage[role] = malloc(r->bytes[role] ? r->bytes[role] : 1);
        if (!r->stage[role]) {
            st = cpc_error(CPC_E_NOMEM, "rank %d: out of memory for staging", p);
            goto fail;
        }
    }
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
    if (a->backward) {
        /* the backward program (the runtime made it): same backend, transport and mask */
        const int bin[5][2] = {{CPC_TENSOR_Q, CPC_ROLE_Q},     {CPC_TENSOR_K, CPC_ROLE_K},
                               {CPC_TENSOR_V, CPC_ROLE_V},     {CPC_TENSOR_OUT, CPC_ROLE_O},
                               {CPC_TENSOR_DOUT, CPC_ROLE_DO}};
        for (int i = 0; i < 5; i++) {
            size_t want = cpc_exec_input_bytes(r->bex, (cpc_buf_role)bin[i][1]);
            if (want != r->bytes[bin[i][0]]) {
                st = cpc_error(CPC_E_INTERNAL, "rank %d: backward input %s is %zu bytes, shape says %zu", p,
                               cpc_buf_role_name((cpc_buf_role)bin[i][1]), want, r->bytes[bin[i][0]]);
                goto fail;
            }
        }
        /* the saved LSE: in the layout the forward computed it in (ulysses
         * and unified: ring block x this member's heads), which is the
         * caller's [B, H, T] only with U = 1 */
        r->saved_lse_bytes = cpc_exec_input_bytes(r->bex, CPC_ROLE_LSE);
        r->lse_in_shard_layout = L->U == 1 && r->saved_lse_bytes == r->bytes[CPC_TENSOR_LSE];
        size_t g = r->bytes[CPC_TENSOR_DQ] > r->bytes[CPC_TENSOR_DK] ? r->bytes[CPC_TENSOR_DQ]
                                                                      : r->bytes[CPC_TENSOR_DK];
        r->saved_lse = rank_alloc(r, r->saved_lse_bytes + sizeof(float));
        if (!r->saved_lse || !(r->gbuf = rank_alloc(r, g / r->esz * sizeof(float) + sizeof(float)))) {
            st = cpc_error(CPC_E_NOMEM, "rank %d: out of memory for the gradients", p);
            goto fail;
        }
    }
    r->lse_supported = L->U == 1;
    r->max_runs = cpc_exec_max_runs(r->ex);
    r->lse_runs = calloc((size_t)(r->max_runs > 0 ? r->max_runs : 1), sizeof *r->lse_runs);
    int cap = cpc_layout_max_rank_runs(L);
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
    if (t)
        cpc_transport_destroy(t);
    cpc_rank_free(r);
    return st;
}

/* The caller's options (NULL: defaults) read into *o (this libcpc's struct:
 * api_options.h, the size rule) and checked: a bad size and values out of
 * range are usage errors before anything is made. */
static cpc_status *read_options(const cpc_rank_options *caller, cpc_rank_options *o, const char *fn)
{
    cpc_rank_options_init(o, sizeof *o);
    cpc_status *st = cpc_api_read_options(o, sizeof *o, CPC_RANK_OPTIONS_SIZE_V1, caller, fn,
                                          "cpc_rank_options");
    if (st)
        return st;
    if ((unsigned)o->backend > CPC_BACKEND_CUDA)
        return cpc_error(CPC_E_USAGE, "%s: unknown backend %d (expected CPC_BACKEND_AUTO, _CPU or _CUDA)",
                         fn, (int)o->backend);
    if (o->device < -1)
        return cpc_error(CPC_E_USAGE, "%s: device %d: expected -1 (the current device) or a device "
                                      "index", fn, o->device);
    if (isnan(o->timeout_s))
        return cpc_error(CPC_E_USAGE, "%s: timeout_s is NaN", fn);
    if (o->cuda_stream && o->backend != CPC_BACKEND_CUDA)
        return cpc_error(CPC_E_USAGE, "%s: cuda_stream is set but the backend is not "
                                      "CPC_BACKEND_CUDA (a CPU rank has no stream)", fn);
    return NULL;
}

/* The start every cpc_rank_new_* shares: *out cleared, the handles checked
 * (args_ok false: CPC_E_USAGE "FN: ARGS must not be NULL") and the caller's
 * options read into *o (read_options). */
static cpc_status *rank_begin(const char *fn, const cpc_artifact *a, bool args_ok, const char *args,
                              cpc_rank **out, const cpc_rank_options *caller, cpc_rank_options *o)
{
    if (!out)
        return cpc_error(CPC_E_USAGE, "%s: out must not be NULL", fn);
    *out = NULL;
    if (!args_ok)
        return cpc_error(CPC_E_USAGE, "%s: %s must not be NULL", fn, args);
    if (a->plan && a->plan->model.linear_attention)
        return cpc_error(CPC_E_INPUT, "%s: the plan's model.attention is linear: cpc prices linear "
                         "attention but runs softmax attention only; drop the key to run softmax "
                         "attention", fn);
    return read_options(caller, o, fn);
}

/* The stall limit of options `o` in seconds: 0 (wait forever) for < 0, the
 * default for 0 or no options. */
static double stall_limit(const cpc_rank_options *o)
{
    double t = o ? o->timeout_s : 0;
    return t < 0 ? 0 : t == 0 ? CPC_RANK_DEFAULT_TIMEOUT_S : t;
}

cpc_status *cpc_rank_new_local(const cpc_artifact *a, cpc_local_world *w, int rank,
                                  const cpc_rank_options *opts, cpc_rank **out)
{
    cpc_rank_options o;
    cpc_status *ost = rank_begin("cpc_rank_new_local", a, a && w, "artifact and world", out, opts, &o);
    if (ost)
        return ost;
    opts = &o;
    int P = cpc_artifact_world_size(a);
    if (rank < 0 || rank >= P)
        return cpc_error(CPC_E_USAGE, "rank %d is out of range (world size %d)", rank, P);
    /* a world made for another artifact: its ranks would run other programs
     * on other shapes (and compute garbage) */
    const char *tag = NULL, *wlabel = NULL;
    cpc_local_world_owner(w, &tag, &wlabel);
    if (tag && strcmp(tag, a->plan_text ? a->plan_text : "") != 0) {
        char mine[512];
        artifact_label(a, mine, sizeof mine);
        cpc_status *e = cpc_error(CPC_E_USAGE, "rank %d: the local world was made for %s, this rank's "
                                               "artifact is %s", rank, wlabel ? wlabel : "another artifact", mine);
        cpc_status_set_hint(e, "make every rank of a world from the artifact given to cpc_local_world_new");
        return e;
    }
    cpc_local_world_set_timeout(w, stall_limit(opts));
    /* with cfg_degree x tp_degree > 1, `w` is rank's group's world (rank.h) */
    cpc_rank_slice sl;
    cpc_status *st = cpc_artifact_rank_slice(a, rank, &sl);
    if (st)
        return st;
    const cpc_rt_transport_entry *te = cpc_rt_transport_get(CPC_RT_TRANSPORT_LOCAL);
    cpc_rt_transport_params tp = {.ring_degree = a->program->layout.R,
                                  .ulysses_degree = a->program->layout.U, .world = w, .rank = sl.group_rank};
    cpc_transport *t = NULL;
    if ((st = te->create(&tp, &t)))
        return st;
    return rank_finish(a, rank, t, opts, out);
}

cpc_status *cpc_rank_new_mpi(const cpc_artifact *a, const void *mpi_comm,
                                const cpc_rank_options *opts, cpc_rank **out)
{
    cpc_rank_options o;
    cpc_status *ost = rank_begin("cpc_rank_new_mpi", a, a != NULL, "artifact", out, opts, &o);
    if (ost)
        return ost;
    opts = &o;
    const cpc_rt_transport_entry *te = cpc_rt_transport_get(CPC_RT_TRANSPORT_MPI);
    if (!te)
        return cpc_error(CPC_E_UNSUPPORTED, "libcpc was built without MPI");
    if (!mpi_comm)
        return cpc_error(CPC_E_USAGE, "mpi transport: no communicator (NULL)");
    /* the stall limit of every MPI wait of this process (transport_mpi.h):
     * a peer that failed or stopped ends this rank's call with
     * CPC_E_RUNTIME ("stalled") within it, then the job is aborted */
    te->set_stall_limit(stall_limit(opts));
    const cpc_layout *L = &a->program->layout;
    cpc_rt_transport_params tp = {.ring_degree = L->R, .ulysses_degree = L->U, .comm = mpi_comm};
    cpc_transport *t = NULL;
    cpc_status *st = NULL;
    if (cpc_artifact_cfg_degree(a) * cpc_artifact_tp_degree(a) == 1) {
        if ((st = te->create(&tp, &t)))
            return st;
        return rank_finish(a, cpc_transport_group_rank(t, CPC_GROUP_WORLD), t, opts, out);
    }
    /* the outer axes (rank.h): the caller's communicator is the whole world;
     * this rank's group is split from it (color c*T + t, key its group rank) */
    int p = 0, size = 0, P = cpc_artifact_world_size(a);
    if ((st = te->comm_rank_size(mpi_comm, &p, &size)))
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
    if ((st = cpc_artifact_rank_slice(a, p, &sl)))
        return st;
    tp.split = true;
    tp.group = sl.group;
    tp.rank = sl.group_rank;
    if ((st = te->create(&tp, &t)))
        return st;
    return rank_finish(a, p, t, opts, out);
}

cpc_status *cpc_rank_new_callbacks(const cpc_artifact *a, int rank, const cpc_p2p_callbacks *cb,
                                      const cpc_rank_options *opts, cpc_rank **out)
{
    cpc_rank_options o;
    cpc_status *ost = rank_begin("cpc_rank_new_callbacks", a, a && cb, "artifact and callbacks", out, opts, &o);
    if (ost)
        return ost;
    opts = &o;
    if (cpc_artifact_cfg_degree(a) * cpc_artifact_tp_degree(a) != 1)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "cpc_rank_new_callbacks: cfg_degree x tp_degree must be 1 (the outer "
                         "axes run over MPI or local worlds)");
    const cpc_layout *L = &a->program->layout;
    if (rank < 0 || rank >= L->R * L->U)
        return cpc_error(CPC_E_USAGE, "cpc_rank_new_callbacks: rank %d out of range (world %d)",
                         rank, L->R * L->U);
    cpc_p2p_callbacks c = {.size = sizeof c};
    if ((ost = cpc_api_read_options(&c, sizeof c, CPC_P2P_CALLBACKS_SIZE_V1, cb,
                                    "cpc_rank_new_callbacks", "cpc_p2p_callbacks")))
        return ost;
    if (!c.isend || !c.irecv || !c.wait)
        return cpc_error(CPC_E_USAGE, "cpc_rank_new_callbacks: isend, irecv and wait must not be NULL");
    const cpc_transport_p2p_fns fns = {c.user, c.isend, c.irecv, c.wait};
    cpc_transport *t = NULL;
    cpc_status *st = cpc_transport_callback_create(&fns, rank, L->R, L->U, &t);
    if (st)
        return st;
    return rank_finish(a, rank, t, opts, out);
}

/* NCCL ranks (rank.h NCCL RANKS): the CUDA backend, no outer axes. */
static cpc_status *nccl_begin(const char *fn, const cpc_artifact *a, bool args_ok, const char *args,
                              cpc_rank **out, const cpc_rank_options *caller, cpc_rank_options *o)
{
    cpc_status *st = rank_begin(fn, a, args_ok, args, out, caller, o);
    if (st)
        return st;
    if (o->backend == CPC_BACKEND_CPU)
        return cpc_error(CPC_E_USAGE, "%s: the NCCL transport moves device memory: the backend must "
                                      "be CPC_BACKEND_CUDA (or AUTO), not CPU", fn);
    o->backend = CPC_BACKEND_CUDA;
    if (cpc_artifact_cfg_degree(a) * cpc_artifact_tp_degree(a) != 1)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "%s: cfg_degree x tp_degree must be 1 (the outer axes run over MPI or "
                         "local worlds)", fn);
    return NULL;
}

cpc_status *cpc_nccl_unique_id(void *id, size_t id_bytes)
{
    if (!id)
        return cpc_error(CPC_E_USAGE, "cpc_nccl_unique_id: id must not be NULL");
#ifdef CPC_HAVE_CUDA
    return cpc_transport_nccl_unique_id(id, id_bytes);
#else
    (void)id_bytes;
    return cpc_error(CPC_E_UNSUPPORTED, "cpc_nccl_unique_id: this libcpc was built without the CUDA "
                                        "toolkit (no NCCL)");
#endif
}

cpc_status *cpc_rank_new_nccl_id(const cpc_artifact *a, const void *id, size_t id_bytes, int rank,
                                 const cpc_rank_options *opts, cpc_rank **out)
{
    cpc_rank_options o;
    cpc_status *st = nccl_begin("cpc_rank_new_nccl_id", a, a && id, "artifact and id", out, opts, &o);
    if (st)
        return st;
    const cpc_layout *L = &a->program->layout;
    if (rank < 0 || rank >= L->R * L->U)
        return cpc_error(CPC_E_USAGE, "cpc_rank_new_nccl_id: rank %d out of range (world %d)", rank,
                         L->R * L->U);
#ifdef CPC_HAVE_CUDA
    cpc_transport *t = NULL;
    if ((st = cpc_transport_nccl_create_id(id, id_bytes, rank, L->R, L->U, o.device, &t)))
        return st;
    o.device = cpc_transport_nccl_device(t);
    return rank_finish(a, rank, t, &o, out);
#else
    (void)id_bytes;
    return cpc_error(CPC_E_UNSUPPORTED, "cpc_rank_new_nccl_id: this libcpc was built without the "
                                        "CUDA toolkit (no NCCL)");
#endif
}

cpc_status *cpc_rank_new_nccl(const cpc_artifact *a, void *nccl_comm, void *cuda_stream,
                                 const cpc_rank_options *opts, cpc_rank **out)
{
    cpc_rank_options o;
    cpc_status *st = nccl_begin("cpc_rank_new_nccl", a, a && nccl_comm, "artifact and nccl_comm", out,
                                opts, &o);
    if (st)
        return st;
    if (cuda_stream && o.cuda_stream && cuda_stream != o.cuda_stream)
        return cpc_error(CPC_E_USAGE, "cpc_rank_new_nccl: cuda_stream and opts->cuda_stream are "
                                      "both set and differ");
    if (cuda_stream)
        o.cuda_stream = cuda_stream;
    const cpc_layout *L = &a->program->layout;
#ifdef CPC_HAVE_CUDA
    cpc_transport *t = NULL;
    if ((st = cpc_transport_nccl_create_comm(nccl_comm, L->R, L->U, &t)))
        return st;
    int dev = cpc_transport_nccl_device(t);
    if (o.device >= 0 && o.device != dev) {
        st = cpc_error(CPC_E_USAGE, "cpc_rank_new_nccl: opts->device is %d but the communicator's "
                                    "device is %d", o.device, dev);
        cpc_transport_destroy(t);   /* collective, as the creation was */
        return st;
    }
    o.device = dev;
    return rank_finish(a, cpc_transport_group_rank(t, CPC_GROUP_WORLD), t, &o, out);
#else
    (void)L;
    return cpc_error(CPC_E_UNSUPPORTED, "cpc_rank_new_nccl: this libcpc was built without the CUDA "
                                        "toolkit (no NCCL)");
#endif
}

int cpc_rank_index(const cpc_rank *r) { return r ? r->p : -1; }
int cpc_rank_world_size(const cpc_rank *r) { return r ? r->P : 0; }
int64_t cpc_rank_allocated_bytes(const cpc_rank *r)
{
    if (!r)
        return 0;
    int64_t n = cpc_exec_allocated_bytes(r->ex);
    for (int i = 0; i < CPC_TENSOR__COUNT; i++)
        if (r->stage[i])
            n += (int64_t)r->bytes[i];
    return n;
}

/* ---- tensors ------------------------------------------------------------------- */

static const char *role_name(int role)
{
    static const char *const n[] = {"q", "k", "v", "out", "lse", "mask", "dout", "dq", "dk", "dv"};
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
    /* the farthest element's offset, in bytes, must be addressable */
    int64_t reach = 0;
    const int64_t es = role == CPC_TENSOR_MASK ? 1 : t->dtype == CPC_DTYPE_FP32 ? 4 : 2;
    for (int i = 0; i < nd; i++) {
        int64_t step = 0;
        if (shape[i] > 1 && t->strides[i] > 0 &&
            (__builtin_mul_overflow(t->strides[i], shape[i] - 1, &step) ||
             __builtin_add_overflow(reach, step, &reach)))
            reach = -1;
        if (reach < 0)
            break;
    }
    int64_t reach_bytes = 0;
    if (reach < 0 || __builtin_mul_overflow(reach, es, &reach_bytes) ||
        __builtin_add_overflow(reach_bytes, es, &reach_bytes) || (uint64_t)reach_bytes > PTRDIFF_MAX)
        return cpc_error(CPC_E_USAGE, "rank %d: tensor %s: its strides overflow (the last element "
                                      "lies beyond any address)", r->p, role_name(role));
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

/* The key padding mask of a forward or backward: required (u8 [B, Skv],
 * the forward's for a backward) exactly when the plan pads keys. */
static cpc_status *check_mask(const cpc_rank *r, const cpc_tensor *mask, bool *contig)
{
    if (r->mask && !mask)
        return cpc_error(CPC_E_USAGE, "rank %d: the plan has key padding: pass its mask (u8 [B, Skv]; "
                                      "to a backward, the forward's)", r->p);
    if (!r->mask && mask)
        return cpc_error(CPC_E_USAGE, "rank %d: a mask was passed but the plan's mask is %s", r->p,
                         cpc_mask_name(r->a->plan->input.mask));
    return mask ? check_tensor(r, CPC_TENSOR_MASK, mask, CPC_DTYPE_U8, false, contig) : NULL;
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

/* Binds the caller's input tensors ts[0..n) (tensor roles roles[i]; the
 * LSE fp32, the others in the plan's dtype) to the executor's buffers of
 * role exec[i]: contiguous caller memory directly, strided tensors gathered
 * into the rank's staging first. */
static cpc_status *bind_inputs(cpc_rank *r, cpc_exec *ex, const cpc_tensor *const *ts, const int *roles,
                               const cpc_buf_role *exec, int n, const bool *contig)
{
    for (int i = 0; i < n; i++) {
        int role = roles[i];
        const void *src = ts[i]->data;
        if (!contig[role]) {
            strided_copy(ts[i], r->shape[role], r->ndim[role], role_esz(r, role), r->stage[role], true);
            src = r->stage[role];
        }
        cpc_status *st = cpc_exec_bind_input(ex, exec[i], src, r->bytes[role]);
        if (st)
            return st;
    }
    return NULL;
}

/* A CUDA rank binds the caller's device tensors as they are: each passed
 * tensor must be contiguous (the CPU gathers strided ones into staging). */
static cpc_status *device_contiguous(const cpc_rank *r, const cpc_tensor *const *ts, const int *roles, int n,
                                     const bool *contig)
{
    for (int i = 0; r->device && i < n; i++)
        if (ts[i] && !contig[roles[i]])
            return cpc_error(CPC_E_USAGE, "rank %d: tensor %s: the CUDA backend takes contiguous device "
                                          "tensors (row-major, BSHD)", r->p, role_name(roles[i]));
    return NULL;
}

/* The caller's key padding mask into the host copy the backend reads. */
static cpc_status *stage_mask(cpc_rank *r, const cpc_tensor *mask, bool contig)
{
    if (r->device)
        return cpc_backend_download(r->be, r->mask, mask->data, r->bytes[CPC_TENSOR_MASK]);
    if (contig)
        memcpy(r->mask, mask->data, r->bytes[CPC_TENSOR_MASK]);
    else
        strided_copy(mask, r->shape[CPC_TENSOR_MASK], 2, 1, r->mask, true);
    return NULL;
}

/* Runs program ex (the forward's or the backward's) once the caller's
 * inputs are bound: first the work the caller queued on its stream is done
 * (CUDA), and the key padding mask is staged (contig: whether the caller's
 * mask tensor is contiguous). */
static cpc_status *run_program(cpc_rank *r, cpc_exec *ex, const cpc_tensor *mask, bool contig)
{
    const cpc_rt_backend_entry *be = r->rt->backend;
    cpc_status *st = r->device && be->wait_stream ? be->wait_stream(r->stream) : NULL;
    if (!st && r->mask)
        st = stage_mask(r, mask, contig);
    return st ? st : cpc_rt_rank_run(r->rt, ex, false, NULL);
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
    if ((st = check_mask(r, mask, &contig[CPC_TENSOR_MASK])))
        return st;
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
    {
        const cpc_tensor *all[6] = {q, k, v, out, mask, lse};
        const int roles[6] = {CPC_TENSOR_Q, CPC_TENSOR_K, CPC_TENSOR_V, CPC_TENSOR_OUT, CPC_TENSOR_MASK,
                              CPC_TENSOR_LSE};
        if ((st = device_contiguous(r, all, roles, 6, contig)))
            return st;
    }

    static const int in_role[3] = {CPC_TENSOR_Q, CPC_TENSOR_K, CPC_TENSOR_V};
    static const cpc_buf_role in_exec[3] = {CPC_ROLE_Q, CPC_ROLE_K, CPC_ROLE_V};
    if ((st = bind_inputs(r, r->ex, in, in_role, in_exec, 3, contig)))
        return st;
    if ((st = run_program(r, r->ex, mask, contig[CPC_TENSOR_MASK])))
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

cpc_status *cpc_rank_backward(cpc_rank *r, const cpc_tensor *q, const cpc_tensor *k,
                              const cpc_tensor *v, const cpc_tensor *mask, const cpc_tensor *out,
                              const cpc_tensor *lse, const cpc_tensor *dout, const cpc_tensor *dq,
                              const cpc_tensor *dk, const cpc_tensor *dv)
{
    if (!r)
        return cpc_error(CPC_E_USAGE, "cpc_rank_backward: rank is NULL");
    if (!r->bex)
        return cpc_error(CPC_E_UNSUPPORTED,
                         "rank %d: the artifact has no backward program (its plan's input.mode is %s): "
                         "compile the plan with input.mode: training to train", r->p,
                         r->a->plan->input.mode == CPC_MODE_TRAINING ? "training, but it holds none"
                                                                      : "inference");
    const cpc_dtype dt = r->a->program->layout.dtype;
    enum { NIN = 5 }; /* and the LSE when the caller passes the forward's [B, H, T] */
    const cpc_tensor *in[NIN + 1] = {q, k, v, out, dout, lse};
    static const int in_role[NIN + 1] = {CPC_TENSOR_Q, CPC_TENSOR_K, CPC_TENSOR_V, CPC_TENSOR_OUT,
                                         CPC_TENSOR_DOUT, CPC_TENSOR_LSE};
    static const cpc_buf_role in_exec[NIN + 1] = {CPC_ROLE_Q, CPC_ROLE_K, CPC_ROLE_V, CPC_ROLE_O,
                                                  CPC_ROLE_DO, CPC_ROLE_LSE};
    const cpc_tensor *gr[3] = {dq, dk, dv};
    static const int g_role[3] = {CPC_TENSOR_DQ, CPC_TENSOR_DK, CPC_TENSOR_DV};
    static const cpc_buf_role g_exec[3] = {CPC_ROLE_DQ, CPC_ROLE_DK, CPC_ROLE_DV};
    bool contig[CPC_TENSOR__COUNT] = {0};
    cpc_status *st;
    /* every argument is checked before anything is read or written */
    for (int i = 0; i < NIN; i++)
        if ((st = check_tensor(r, in_role[i], in[i], dt, false, &contig[in_role[i]])))
            return st;
    /* lse: NULL (the last forward's), the saved LSE (1-D, cpc_rank_saved_lse) or,
     * with U = 1, the forward's [B, H, T] */
    bool lse_saved = lse && lse->ndim == 1;
    if (lse_saved) {
        if (lse->dtype != CPC_DTYPE_FP32 || !lse->data ||
            lse->shape[0] != (int64_t)(r->saved_lse_bytes / sizeof(float)) ||
            (lse->shape[0] > 1 && lse->strides[0] != 0 && lse->strides[0] != 1))
            return cpc_error(CPC_E_USAGE, "rank %d: a 1-D lse is the saved LSE: f32, %lld contiguous elements "
                                          "(cpc_rank_saved_lse)", r->p,
                             (long long)(r->saved_lse_bytes / sizeof(float)));
    } else if (lse && !r->lse_in_shard_layout) {
        return cpc_error(CPC_E_USAGE, "rank %d: variant %s keeps the LSE in the Ulysses head layout: pass the "
                                      "saved LSE (cpc_rank_saved_lse) or NULL", r->p,
                         cpc_variant_name(r->a->program->layout.variant));
    } else if (lse && (st = check_tensor(r, CPC_TENSOR_LSE, lse, CPC_DTYPE_FP32, false, &contig[CPC_TENSOR_LSE]))) {
        return st;
    }
    for (int i = 0; i < 3; i++) {
        cpc_dtype want = gr[i] && gr[i]->dtype == CPC_DTYPE_FP32 ? CPC_DTYPE_FP32 : dt;
        if ((st = check_tensor(r, g_role[i], gr[i], want, true, &contig[g_role[i]])))
            return st;
    }
    if ((st = check_mask(r, mask, &contig[CPC_TENSOR_MASK])))
        return st;
    if (r->device) {
        if (lse_saved)
            contig[CPC_TENSOR_LSE] = true; /* checked above: contiguous */
        const cpc_tensor *all[10] = {q, k, v, out, dout, dq, dk, dv, mask, lse};
        const int roles[10] = {CPC_TENSOR_Q, CPC_TENSOR_K, CPC_TENSOR_V, CPC_TENSOR_OUT, CPC_TENSOR_DOUT,
                               CPC_TENSOR_DQ, CPC_TENSOR_DK, CPC_TENSOR_DV, CPC_TENSOR_MASK, CPC_TENSOR_LSE};
        if ((st = device_contiguous(r, all, roles, 10, contig)))
            return st;
    }

    if ((st = bind_inputs(r, r->bex, in, in_role, in_exec, lse && !lse_saved ? NIN + 1 : NIN, contig)))
        return st;
    if (lse_saved) {
        if ((st = cpc_exec_bind_input(r->bex, CPC_ROLE_LSE, lse->data, r->saved_lse_bytes)))
            return st;
    } else if (!lse) {
        /* the LSE the forward executor holds from this rank's last forward */
        int h_off = 0, h_n = 0, n_runs = 0;
        if ((st = cpc_exec_lse_into(r->ex, r->saved_lse, r->saved_lse_bytes, &h_off, &h_n, r->lse_runs,
                                    r->max_runs, &n_runs)) ||
            (st = cpc_exec_bind_input(r->bex, CPC_ROLE_LSE, r->saved_lse, r->saved_lse_bytes)))
            return st;
    }
    if ((st = run_program(r, r->bex, mask, contig[CPC_TENSOR_MASK])))
        return st;

    /* gradients: fp32 accumulators -> the caller's dtype and strides */
    for (int i = 0; i < 3; i++) {
        int role = g_role[i];
        const cpc_tensor *t = gr[i];
        size_t n = r->bytes[role] / r->esz;
        bool f32 = t->dtype == CPC_DTYPE_FP32;
        float *g = f32 && contig[role] ? (float *)t->data : r->gbuf;
        if ((st = cpc_exec_read_grad(r->bex, g_exec[i], g, n * sizeof(float))))
            return st;
        if (f32) {
            if (!contig[role])
                strided_copy(t, r->shape[role], 4, sizeof(float), g, false);
        } else if (r->device) { /* contiguous: checked above */
            if ((st = cpc_backend_convert(r->be, t->data, dt, g, CPC_DTYPE_FP32, n)))
                return st;
            if (r->be->vt->sync && (st = cpc_backend_sync(r->be)))
                return st;
        } else if (contig[role]) {
            cpc_from_f32_n(t->data, dt, g, n);
        } else {
            cpc_from_f32_n(r->stage[role], dt, g, n);
            strided_copy(t, r->shape[role], 4, r->esz, r->stage[role], false);
        }
    }
    return NULL;
}

int64_t cpc_rank_saved_lse_elements(const cpc_rank *r)
{
    return r && r->bex ? (int64_t)(r->saved_lse_bytes / sizeof(float)) : 0;
}

cpc_status *cpc_rank_abort(cpc_rank *r, const char *why)
{
    if (!r)
        return cpc_error(CPC_E_USAGE, "cpc_rank_abort: rank is NULL");
    char msg[512];
    snprintf(msg, sizeof msg, "rank %d: aborted by the caller: %s", r->p, why && *why ? why : "(no reason given)");
    cpc_rt_rank_abort(r->rt, msg); /* MPI: does not return */
    return NULL;
}

cpc_status *cpc_rank_saved_lse(cpc_rank *r, float *dst, int64_t n)
{
    if (!r || !dst)
        return cpc_error(CPC_E_USAGE, "cpc_rank_saved_lse: rank and dst must not be NULL");
    if (!r->bex)
        return cpc_error(CPC_E_UNSUPPORTED, "rank %d: the artifact has no backward program (its plan's "
                                            "input.mode is not training)", r->p);
    if (n != cpc_rank_saved_lse_elements(r))
        return cpc_error(CPC_E_USAGE, "rank %d: the saved LSE has %lld elements, %lld given", r->p,
                         (long long)cpc_rank_saved_lse_elements(r), (long long)n);
    int h_off = 0, h_n = 0, n_runs = 0;
    return cpc_exec_lse_into(r->ex, dst, r->saved_lse_bytes, &h_off, &h_n, r->lse_runs, r->max_runs, &n_runs);
}
