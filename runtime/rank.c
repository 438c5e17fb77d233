/* rank.c - see rank.h.  The only file of the runtime that knows which
 * backends and transports this build has: the registries below. */
#include "rank.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport_device.h"
#include "transport_mpi.h"
#include "transport_nccl.h"
#include "transport_staged.h"

#ifdef CPC_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend_cuda.h"
#endif

/* ---- backends ------------------------------------------------------------------ */

static cpc_status *cpu_available(int *n)
{
    if (n)
        *n = 0;
    return NULL;
}

static cpc_status *cpu_create(const cpc_rt_backend_params *p, cpc_backend **out)
{
    (void)p;
    return cpc_cpu_backend_create(out);
}

#ifdef CPC_HAVE_CUDA
static cpc_status *cuda_available(int *n)
{
    int k = 0;
    cpc_status *st = cpc_cuda_device_count(&k);
    if (n)
        *n = st ? 0 : k;
    return st;
}

static cpc_status *cuda_create(const cpc_rt_backend_params *p, cpc_backend **out)
{
    *out = NULL;
    if (!p->spec || !p->kernels || p->n_kernels <= 0)
        return cpc_error(CPC_E_UNSUPPORTED, "the CUDA backend needs the artifact's compiled kernels "
                                            "(compile the plan with a cpc built with the CUDA toolkit)");
    int device = p->device;
    if (device < 0) {
        cudaError_t e = cudaGetDevice(&device);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return cpc_error(CPC_E_UNSUPPORTED, "no CUDA device: cudaGetDevice: %s", cudaGetErrorString(e));
        }
    }
    int mode = p->attention ? cpc_cuda_attention_parse(p->attention) : CPC_CUDA_ATTN_AUTO;
    if (mode < 0)
        return cpc_error(CPC_E_USAGE, "attention %s: expected auto, cudnn or nvrtc", p->attention);
    cpc_status *st = cpc_cuda_backend_create(device, p->spec, p->kernels, p->n_kernels, out);
    if (!st && mode != CPC_CUDA_ATTN_AUTO)
        st = cpc_cuda_backend_set_attention(*out, (cpc_cuda_attention)mode);
    if (st && *out) {
        cpc_backend_destroy(*out);
        *out = NULL;
    }
    return st;
}

static bool cuda_device_arch(int device, char *arch, size_t n)
{
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
        major > 0) {
        snprintf(arch, n, "sm_%d%d", major, minor);
        return true;
    }
    (void)cudaGetLastError();
    return false;
}

static void cuda_attention_report(cpc_backend *be, cpc_rt_attention_report *out)
{
    cpc_cuda_attn_info in;
    cpc_cuda_backend_attention_info(be, &in, false);
    out->cudnn_blocks = (double)in.cudnn_blocks;
    out->nvrtc_blocks = (double)in.nvrtc_blocks;
    out->fallback_blocks = (double)in.fallback_blocks;
    snprintf(out->reason, sizeof out->reason, "%s", in.fallback_reason);
}

static cpc_status *cuda_wait_stream(void *stream)
{
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cpc_error(CPC_E_RUNTIME, "cudaStreamSynchronize(the caller's stream): %s", cudaGetErrorString(e));
    }
    return NULL;
}
#endif

static const cpc_rt_backend_entry backends[] = {
    {CPC_RT_BACKEND_CPU, "cpu", false, cpu_available, cpu_create, NULL, NULL, NULL},
#ifdef CPC_HAVE_CUDA
    {CPC_RT_BACKEND_CUDA, "cuda", true, cuda_available, cuda_create, cuda_wait_stream, cuda_device_arch,
     cuda_attention_report},
#endif
};
enum { N_BACKENDS = sizeof backends / sizeof *backends };

const cpc_rt_backend_entry *cpc_rt_backend_get(cpc_rt_backend_kind kind)
{
    for (int i = 0; i < N_BACKENDS; i++)
        if (backends[i].kind == kind)
            return &backends[i];
    return NULL;
}

const cpc_rt_backend_entry *cpc_rt_backend_find(const char *name)
{
    for (int i = 0; name && i < N_BACKENDS; i++)
        if (strcmp(backends[i].name, name) == 0)
            return &backends[i];
    return NULL;
}

/* ---- transports ---------------------------------------------------------------- */

static bool always(void) { return true; }

static cpc_status *local_create(const cpc_rt_transport_params *p, cpc_transport **out)
{
    if (!p->world)
        return cpc_error(CPC_E_INTERNAL, "local transport: no world");
    return cpc_local_endpoint_create(p->world, p->rank, out);
}

#ifdef CPC_HAVE_MPI
static bool mpi_available(void) { return cpc_mpi_launched(); }

static cpc_status *mpi_create(const cpc_rt_transport_params *p, cpc_transport **out)
{
    int R = p->ring_degree, U = p->ulysses_degree;
    if (p->job_world)
        return cpc_transport_mpi_create_world(p->world_size, p->mesh ? p->mesh : "", out);
    if (p->split)
        return cpc_transport_mpi_create_split(p->comm, p->group, p->rank, R, U, out);
    if (p->comm)
        return cpc_transport_mpi_create_comm(p->comm, R, U, out);
    return cpc_transport_mpi_create(R, U, out);
}
#endif

#if defined(CPC_HAVE_NCCL) && defined(CPC_HAVE_MPI)
static cpc_status *nccl_create(const cpc_rt_transport_params *p, cpc_transport **out)
{
    if (p->split || p->comm)
        return cpc_error(CPC_E_UNSUPPORTED, "the NCCL transport bootstraps over MPI_COMM_WORLD only "
                                            "(no communicator of the caller, no group split yet)");
    return cpc_transport_nccl_create(p->ring_degree, p->ulysses_degree, p->device, out);
}
#endif

static const cpc_rt_transport_entry transports[] = {
    {CPC_RT_TRANSPORT_LOCAL, "local", false, always, local_create, NULL, NULL, NULL, NULL, NULL, NULL},
#ifdef CPC_HAVE_MPI
    {CPC_RT_TRANSPORT_MPI, "mpi", false, mpi_available, mpi_create, cpc_transport_mpi_set_timeout,
     cpc_mpi_comm_rank_size, NULL, cpc_mpi_local_rank, cpc_mpi_abort, NULL},
#endif
#if defined(CPC_HAVE_NCCL) && defined(CPC_HAVE_MPI)
    {CPC_RT_TRANSPORT_NCCL, "nccl", true, mpi_available, nccl_create, cpc_transport_mpi_set_timeout,
     cpc_mpi_comm_rank_size, cpc_transport_nccl_device, cpc_mpi_local_rank, cpc_mpi_abort,
     cpc_mpi_finalize},
#endif
};
enum { N_TRANSPORTS = sizeof transports / sizeof *transports };

const cpc_rt_transport_entry *cpc_rt_transport_get(cpc_rt_transport_kind kind)
{
    for (int i = 0; i < N_TRANSPORTS; i++)
        if (transports[i].kind == kind)
            return &transports[i];
    return NULL;
}

const cpc_rt_transport_entry *cpc_rt_transport_find(const char *name)
{
    for (int i = 0; name && i < N_TRANSPORTS; i++)
        if (strcmp(transports[i].name, name) == 0)
            return &transports[i];
    return NULL;
}

/* ---- the rank ------------------------------------------------------------------- */

void cpc_rt_rank_destroy(cpc_rt_rank *r)
{
    if (!r)
        return;
    cpc_exec_destroy(r->bex);
    cpc_exec_destroy(r->ex);
    if (r->t)
        cpc_transport_destroy(r->t);
    if (r->publish)
        *r->publish = NULL;
    if (r->be)
        cpc_backend_destroy(r->be);
    free(r);
}

void cpc_rt_rank_abort(cpc_rt_rank *r, const char *why)
{
    if (r && r->t)
        cpc_transport_abort(r->t, why);
}

cpc_status *cpc_rt_rank_create(const cpc_rt_rank_config *cfg, cpc_rt_rank **out)
{
    *out = NULL;
    cpc_rt_rank *r = calloc(1, sizeof *r);
    if (!r) {
        if (cfg->transport)
            cpc_transport_destroy(cfg->transport);
        return cpc_error(CPC_E_NOMEM, "out of memory");
    }
    r->rank = cfg->rank;
    r->t = cfg->transport;
    cpc_status *st = NULL;
    r->backend = cpc_rt_backend_get(cfg->backend);
    if (!r->backend) {
        st = cpc_error(CPC_E_UNSUPPORTED, "rank %d: backend %s: this build of libcpc has none (built "
                                          "without the CUDA toolkit)",
                       cfg->rank, cfg->backend == CPC_RT_BACKEND_CUDA ? "cuda" : "?");
        goto fail;
    }
    if ((st = r->backend->create(&cfg->backend_params, &r->be))) {
        if (r->backend->device_memory)
            cpc_status_prefix(st, "rank %d: %s backend on device %d", cfg->rank, r->backend->name,
                              cfg->backend_params.device);
        else
            cpc_status_prefix(st, "rank %d: %s backend", cfg->rank, r->backend->name);
        goto fail;
    }
    if (cfg->publish) {
        r->publish = cfg->publish;
        *cfg->publish = r->be;
    }
    /* the endpoint as the backend's buffers need it */
    cpc_rt_wrap wrap = cfg->wrap;
    if (wrap == CPC_RT_WRAP_AUTO) {
        const cpc_rt_transport_entry *te = r->t ? cpc_rt_transport_find(r->t->vt->name) : NULL;
        wrap = r->backend->device_memory && !(te && te->device_memory) ? CPC_RT_WRAP_STAGED
                                                                        : CPC_RT_WRAP_NONE;
    }
    if (r->t && wrap != CPC_RT_WRAP_NONE) {
        cpc_transport *w = NULL;
        st = wrap == CPC_RT_WRAP_DEVICE ? cpc_transport_device_create(r->t, r->be, &w)
                                        : cpc_transport_staged_create(r->t, r->be, &w);
        if (st)
            goto fail;
        r->t = w; /* owns the inner endpoint */
    }
    cpc_exec_config ec = {.prog = cfg->prog, .rank = cfg->rank, .backend = r->be, .transport = r->t,
                          .scale = cfg->scale, .kv_mask = cfg->kv_mask, .record_events = cfg->record_events};
    if ((st = cpc_exec_create(&ec, &r->ex)))
        goto fail;
    if (cfg->bwd) {
        ec.prog = cfg->bwd;
        ec.record_events = false;
        if ((st = cpc_exec_create(&ec, &r->bex)))
            goto fail;
    }
    *out = r;
    return NULL;
fail:
    if (cfg->abort_prefix && r->t) {
        char *msg = cpc_status_format(st, cfg->abort_prefix);
        cpc_transport_abort(r->t, msg ? msg : st->message); /* MPI: does not return */
        free(msg);
    }
    cpc_rt_rank_destroy(r);
    return st;
}

cpc_status *cpc_rt_rank_bind_device(cpc_rt_rank *r, cpc_exec *ex, cpc_buf_role role, const void *dev,
                                    size_t bytes)
{
    cpc_exec_set_device_io(ex, r->backend->device_memory);
    return cpc_exec_bind_input(ex, role, dev, bytes);
}

cpc_status *cpc_rt_rank_run(cpc_rt_rank *r, cpc_exec *ex, bool barrier, cpc_exec_stats *stats)
{
    cpc_exec_stats local;
    cpc_exec_stats *s = stats ? stats : &local;
    cpc_status *st = cpc_exec_reset(ex);
    if (st)
        return st;
    if (barrier && (st = cpc_transport_barrier(r->t, CPC_GROUP_WORLD))) {
        cpc_status_prefix(st, "rank %d: barrier before the run", r->rank);
        return st;
    }
    double t0 = cpc_exec_now_us();
    if ((st = cpc_exec_run(ex, s)))
        return st;
    if (r->be->vt->sync) {
        /* a device backend: its queued work belongs to the run, whose time
         * lasts until the device is done */
        if ((st = cpc_backend_sync(r->be))) {
            cpc_status_prefix(st, "rank %d: device sync", r->rank);
            return st;
        }
        double wall = (cpc_exec_now_us() - t0) / 1000.0;
        if (wall > s->ms)
            s->ms = wall;
    }
    return NULL;
}
