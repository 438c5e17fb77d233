/* backend_cuda.c - see backend_cuda.h */
#include "backend_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>

#include "attention_cudnn.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_ctx {
    int device;
    cpc_kernel_spec spec;
    cudaStream_t compute;
    cudaLibrary_t libs[4];
    int n_libs;
    cpc_backend_vtable vt;     /* this backend's methods: the optional ones its modules serve */
    cudaKernel_t k_add_f32;    /* fp32 add_strided; NULL when the artifact predates it */
    cudaKernel_t k_copy, k_copy_f32, k_merge, k_init, k_from_f32, k_to_f32, k_attn_tc,
        k_attn_rowwarp, k_attn_mma;
    /* the backward (kernels/attention_bwd.cu); NULL when the artifact predates it */
    cudaKernel_t k_bwd_delta, k_bwd_delta_f32, k_bwd_dkdv, k_bwd_dq;
    /* its tensor-core pair (bf16/fp16, head_dim % 16 == 0, <= 128), NULL otherwise */
    cudaKernel_t k_bwd_dkdv_mma, k_bwd_dq_mma;
    const char *bwd_kernel;    /* "mma" or "simt": the backward kernels used */
    const char *attn_kernel;   /* "mma", "wmma" or "rowwarp": the generated kernel used */
    long long *pos;      /* device scratch for q/kv positions */
    size_t pos_cap;      /* elements */
    unsigned char *mask_dev; /* device copy of a host key padding mask (device_mask) */
    size_t mask_cap;         /* bytes */
    int sm_count;
    /* Attention path (cpc_cuda_backend_set_attention) and what served. */
    cpc_cuda_attention attn_mode;
    cpc_cudnn_sdpa *sdpa;      /* created on first need */
    bool sdpa_failed;          /* creation failed: sdpa_why says why */
    char sdpa_why[256];
    void *o16;                 /* cuDNN's output in the plan's dtype [B, sq, hq, d] */
    size_t o16_cap;            /* bytes */
    void *neginf;              /* fp32 -inf row for query rows that see no key */
    size_t neginf_bytes;
    long long n_cudnn, n_nvrtc, n_fallback;
    char fallback_why[256];
} cuda_ctx;

static cpc_status *cuda_err(cudaError_t e, const char *what)
{
    return cpc_error(e == cudaErrorMemoryAllocation ? CPC_E_NOMEM : CPC_E_RUNTIME,
                     "CUDA: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define CK(call, what)                                                                         \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess)                                                                 \
            return cuda_err(e_, what);                                                         \
    } while (0)

cpc_status *cpc_cuda_device_count(int *n)
{
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e != cudaSuccess || *n == 0) {
        (void)cudaGetLastError();
        *n = 0;
        return cpc_error(CPC_E_UNSUPPORTED, "no usable CUDA device: %s",
                         e == cudaSuccess ? "no GPU visible" : cudaGetErrorString(e));
    }
    return NULL;
}

static cuda_ctx *C(cpc_backend *be) { return be->ctx; }

static cpc_status *b_alloc(cpc_backend *be, size_t bytes, void **out)
{
    CK(cudaSetDevice(C(be)->device), "cudaSetDevice");
    CK(cudaMalloc(out, bytes ? bytes : 256), "cudaMalloc");
    return NULL;
}

static void b_free(cpc_backend *be, void *p)
{
    (void)be;
    if (p)
        cudaFree(p);
}

static cpc_status *b_upload(cpc_backend *be, void *dst, const void *host, size_t bytes)
{
    CK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, C(be)->compute), "upload");
    CK(cudaStreamSynchronize(C(be)->compute), "upload sync");
    return NULL;
}

static cpc_status *b_download(cpc_backend *be, void *host, const void *src, size_t bytes)
{
    CK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, C(be)->compute), "download");
    CK(cudaStreamSynchronize(C(be)->compute), "download sync");
    return NULL;
}

static cpc_status *b_copy(cpc_backend *be, void *dst, const void *src, size_t bytes)
{
    /* cudaMemcpyDefault: unified addressing finds the devices (a peer copy when
     * another rank's buffer lives on another GPU: transport_device.h). */
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, C(be)->compute), "copy");
    return NULL;
}

static cpc_status *launch(cuda_ctx *c, cudaKernel_t k, unsigned gx, unsigned gy, unsigned gz,
                          unsigned block, size_t smem, void **args, const char *what)
{
    if (gx == 0 || gy == 0 || gz == 0)
        return NULL;
    dim3 grid = {gx, gy, gz}, blk = {block, 1, 1};
    CK(cudaLaunchKernel((const void *)k, grid, blk, args, smem, c->compute), what);
    return NULL;
}

static unsigned grid_for(long long n, unsigned block, int sms)
{
    long long g = (n + block - 1) / block;
    long long cap = (long long)sms * 32;
    if (g > cap)
        g = cap;
    return (unsigned)(g < 1 ? 1 : g);
}

static int dsize(cpc_dtype t) { return t == CPC_DTYPE_FP32 ? 4 : 2; }

/* Device positions of the problem's rows (attn_problem.h): query rows at
 * c->pos[0..sq), key rows at c->pos[sq..sq+skv) (grown on demand; the
 * launches still queued may read the old array, so a growth synchronises). */
static cpc_status *upload_positions(cuda_ctx *c, const cpc_attn_problem *p, long long **qpos,
                                    long long **kvpos)
{
    size_t need = (size_t)(p->sq + p->skv);
    if (need > c->pos_cap) {
        CK(cudaStreamSynchronize(c->compute), "attention positions");
        if (c->pos)
            cudaFree(c->pos);
        c->pos = NULL;
        c->pos_cap = 0;
        CK(cudaMalloc((void **)&c->pos, need * sizeof(long long)), "cudaMalloc positions");
        c->pos_cap = need;
    }
    _Static_assert(sizeof(long long) == sizeof(int64_t), "positions are 64-bit");
    int64_t *host = malloc(sizeof(int64_t) * (need > 0 ? need : 1));
    if (!host)
        return &cpc_status_oom;
    cpc_attn_positions(p->q_runs, p->n_q_runs, p->sq, host);
    cpc_attn_positions(p->kv_runs, p->n_kv_runs, p->skv, host + p->sq);
    cudaError_t e = cudaMemcpyAsync(c->pos, host, sizeof(int64_t) * need, cudaMemcpyHostToDevice, c->compute);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->compute);
    free(host);
    if (e != cudaSuccess)
        return cuda_err(e, "upload positions");
    *qpos = c->pos;
    *kvpos = c->pos + p->sq;
    return NULL;
}

/* The key padding mask as the kernels read it: a pointer the device can
 * dereference.  The executor passes the caller's host mask ([B, mask_len] u8,
 * executor.h); pageable host memory is copied into a device scratch (on the
 * compute stream, synchronised: the mask is small), device, managed and
 * host-registered memory is used in place. */
static cpc_status *device_mask(cuda_ctx *c, const unsigned char *mask, size_t bytes,
                               const unsigned char **out)
{
    *out = mask;
    if (!mask || bytes == 0)
        return NULL;
    struct cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, mask);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* older runtimes: unknown host pointer */
        at.type = cudaMemoryTypeUnregistered;
    }
    if (at.type != cudaMemoryTypeUnregistered)
        return NULL;
    if (bytes > c->mask_cap) {
        CK(cudaStreamSynchronize(c->compute), "key padding mask");
        if (c->mask_dev)
            cudaFree(c->mask_dev);
        c->mask_dev = NULL;
        c->mask_cap = 0;
        CK(cudaMalloc((void **)&c->mask_dev, bytes), "cudaMalloc key padding mask");
        c->mask_cap = bytes;
    }
    CK(cudaMemcpyAsync(c->mask_dev, mask, bytes, cudaMemcpyHostToDevice, c->compute),
       "upload key padding mask");
    CK(cudaStreamSynchronize(c->compute), "upload key padding mask");
    *out = c->mask_dev;
    return NULL;
}

static size_t tc_smem_bytes(int D)
{
    int bm = 64, bn = D > 128 ? 32 : 64, ld = D + 8, sld = (bn > D ? bn : D) + 4;
    int pld = bn + 8, old = D + 4;
    return (size_t)(bm + 2 * bn) * ld * 2 + (size_t)4 * 16 * sld * 4 + (size_t)4 * 16 * old * 4 +
           (size_t)4 * 16 * pld * 2;
}

static cpc_status *pick_nvrtc_kernel(cuda_ctx *c, const char *name)
{
    if (strcmp(name, "mma") == 0 && c->k_attn_mma)
        c->attn_kernel = "mma";
    else if (strcmp(name, "wmma") == 0 && c->k_attn_tc)
        c->attn_kernel = "wmma";
    else if (strcmp(name, "rowwarp") == 0)
        c->attn_kernel = "rowwarp";
    else
        return cpc_error(CPC_E_USAGE,
                         "'%s' is not a generated attention kernel of this plan (mma, wmma: "
                         "bf16/fp16 with head_dim %% 16 == 0; rowwarp: any)",
                         name);
    return NULL;
}

/* Shared memory of cpc_flash_attn_mma (kernels/attention.cu: Q and K tiles
 * with a pitch of D + 8 elements, V transposed with a pitch of MMA_BN + 8,
 * then MMA_BN key positions). */
static size_t mma_smem_bytes(int D)
{
    int bm = 64, bn = D > 128 ? 32 : 64, ld = D + 8, vld = bn + 8;
    return (size_t)(bm + bn) * ld * 2 + (size_t)D * vld * 2 + (size_t)bn * 8;
}

/* The generated attention kernel (any block). */
static cpc_status *attn_nvrtc(cuda_ctx *c, const cpc_attn_args *a)
{
    const cpc_attn_problem *p = &a->p;
    long long *qpos = NULL, *kvpos = NULL;
    if (p->causal || p->kv_mask) {
        cpc_status *st = upload_positions(c, p, &qpos, &kvpos);
        if (st)
            return st;
    }
    int B = p->B, hq = p->hq, hkv = p->hkv, qoff = p->q_head_off, kvoff = p->kv_head_off;
    long long sq = p->sq, skv = p->skv, qbs = p->q_bstride, kvbs = p->kv_bstride;
    long long mlen = p->mask_len;
    float scale = p->scale;
    const void *q = p->q, *k = p->k, *v = p->v;
    float *o = a->o, *lse = a->lse;
    const unsigned char *mask = NULL;
    cpc_status *mst = device_mask(c, p->kv_mask, (size_t)p->B * (size_t)p->mask_len, &mask);
    if (mst)
        return mst;
    void *args[] = {&q, &k, &v, &o, &lse, &B, &sq, &skv, &hq, &hkv, &qoff, &kvoff,
                    &qbs, &kvbs, &scale, &qpos, &kvpos, &mask, &mlen};
    if (c->k_attn_mma && strcmp(c->attn_kernel, "mma") == 0) {
        size_t smem = mma_smem_bytes(p->d);
        CK(cudaKernelSetAttributeForDevice(c->k_attn_mma, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem, c->device),
           "set attention shared memory");
        return launch(c, c->k_attn_mma, (unsigned)((sq + 63) / 64), (unsigned)hq, (unsigned)B, 128,
                      smem, args, "attention (mma.sync)");
    }
    if (c->k_attn_tc && strcmp(c->attn_kernel, "rowwarp") != 0) {
        size_t smem = tc_smem_bytes(p->d);
        CK(cudaKernelSetAttributeForDevice(c->k_attn_tc, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem, c->device),
           "set attention shared memory");
        return launch(c, c->k_attn_tc, (unsigned)((sq + 63) / 64), (unsigned)hq, (unsigned)B, 128,
                      smem, args, "attention (tensor cores)");
    }
    return launch(c, c->k_attn_rowwarp, (unsigned)((sq + 3) / 4), (unsigned)hq, (unsigned)B, 128, 0,
                  args, "attention (row per warp)");
}

static void note_fallback(cuda_ctx *c, const char *why)
{
    c->n_fallback++;
    if (!c->fallback_why[0])
        snprintf(c->fallback_why, sizeof c->fallback_why, "%s", why);
}

/* Grows a device scratch buffer to `bytes` (contents not kept). */
static cpc_status *grow(cuda_ctx *c, void **buf, size_t *cap, size_t bytes, const char *what)
{
    if (bytes <= *cap)
        return NULL;
    if (*buf) {
        CK(cudaStreamSynchronize(c->compute), what);
        cudaFree(*buf);
    }
    *buf = NULL;
    *cap = 0;
    CK(cudaMalloc(buf, bytes), what);
    *cap = bytes;
    return NULL;
}

/* Tries cuDNN for block `a`: *served tells whether it did.  A block cuDNN
 * cannot serve is noted (fallback) and returns NULL with *served false; only
 * device failures while running are errors. */
static cpc_status *attn_cudnn(cuda_ctx *c, const cpc_attn_args *a, bool *served)
{
    const cpc_attn_problem *pr = &a->p;
    *served = false;
    cpc_sdpa_split sp;
    cpc_status *st = cpc_cudnn_sdpa_split(pr, &sp);
    if (st) {
        note_fallback(c, st->message);
        cpc_status_free(st);
        return NULL;
    }
    if (!c->sdpa) {
        if (!c->sdpa_failed) {
            st = cpc_cudnn_sdpa_create(c->device, &c->sdpa);
            if (st) {
                snprintf(c->sdpa_why, sizeof c->sdpa_why, "%s", st->message);
                c->sdpa_failed = true;
                cpc_status_free(st);
            }
        }
        if (!c->sdpa) {
            note_fallback(c, c->sdpa_why);
            return NULL;
        }
    }
    int64_t es = cpc_dtype_size(pr->dtype);
    int64_t row_elems = (int64_t)pr->hq * pr->d;
    size_t o_elems = (size_t)((int64_t)pr->B * pr->sq * row_elems);
    if ((st = grow(c, &c->o16, &c->o16_cap, o_elems * (size_t)es, "cuDNN output scratch")))
        return st;
    st = cpc_cudnn_sdpa_run(c->sdpa, pr, &sp, c->o16, a->lse, c->compute);
    if (st) {
        if (st->code != CPC_E_UNSUPPORTED)
            return st;
        note_fallback(c, st->message);
        cpc_status_free(st);
        return NULL;
    }
    /* Rows that see no key: o = 0, lse = -inf. */
    for (int i = 0; i < sp.n_parts; i++) {
        const cpc_sdpa_part *p = &sp.parts[i];
        if (p->kind != CPC_SDPA_PART_EMPTY || p->rows <= 0)
            continue;
        size_t pitch = (size_t)(pr->sq * row_elems * es), width = (size_t)(p->rows * row_elems * es);
        CK(cudaMemset2DAsync((char *)c->o16 + p->row0 * row_elems * es, pitch, 0, width,
                             (size_t)pr->B, c->compute),
           "cuDNN: zero the rows that see no key");
        size_t need = (size_t)p->rows * sizeof(float);
        if (need > c->neginf_bytes) {
            if ((st = grow(c, &c->neginf, &c->neginf_bytes, need, "-inf row")))
                return st;
            float *nil = NULL;
            long long zero = 0, n = (long long)(c->neginf_bytes / sizeof(float));
            void *iargs[] = {&nil, &zero, &c->neginf, &n};
            if ((st = launch(c, c->k_init, grid_for(n, 256, c->sm_count), 1, 1, 256, 0, iargs,
                             "fill -inf")))
                return st;
        }
        float *dst = a->lse + p->row0;
        const void *src = c->neginf;
        long long nb = pr->B, nt = pr->hq, nh = 1, inner = p->rows, dbs = (long long)pr->hq * pr->sq,
                  dts = pr->sq, dhs = 0, sbs = 0, sts = 0, shs = 0;
        void *cargs[] = {&dst, &src, &nb, &nt, &nh, &inner, &dbs, &dts, &dhs, &sbs, &sts, &shs};
        long long rows = nb * nt;
        unsigned g = (unsigned)(rows < (long long)c->sm_count * 64 ? rows : (long long)c->sm_count * 64);
        if ((st = launch(c, c->k_copy_f32, g, 1, 1, 128, 0, cargs, "lse = -inf for rows without keys")))
            return st;
    }
    /* cuDNN wrote the plan's dtype; the executor's O is fp32. */
    float *o = a->o;
    const void *src = c->o16;
    long long nn = (long long)o_elems;
    void *args[] = {&o, &src, &nn};
    if ((st = launch(c, c->k_to_f32, grid_for(nn, 256, c->sm_count), 1, 1, 256, 0, args,
                     "cuDNN output to fp32")))
        return st;
    *served = true;
    return NULL;
}

/* The kernels are specialised on dtype, head_dim, causal and group: a
 * problem that differs from the backend's kernels is refused (after
 * cpc_attn_args_check / cpc_attn_bwd_args_check, the checks every backend
 * makes, before anything is launched or written). */
static cpc_status *check_spec(const cuda_ctx *c, const cpc_attn_problem *p)
{
    if (p->d != c->spec.head_dim || p->dtype != c->spec.dtype || p->causal != c->spec.causal ||
        p->group != c->spec.gqa)
        return cpc_error(CPC_E_INTERNAL,
                         "CUDA attention: kernels built for %s head_dim %d causal %d group %d, "
                         "called with %s %d causal %d group %d",
                         cpc_dtype_name(c->spec.dtype), c->spec.head_dim, c->spec.causal, c->spec.gqa,
                         cpc_dtype_name(p->dtype), p->d, p->causal, p->group);
    return NULL;
}

static cpc_status *b_attn(cpc_backend *be, const cpc_attn_args *a)
{
    cuda_ctx *c = C(be);
    cpc_status *st0 = cpc_attn_args_check(a);
    if (st0 || (st0 = check_spec(c, &a->p)))
        return st0;
    if (!cpc_attn_problem_has_rows(&a->p))
        return NULL;
    if (c->attn_mode != CPC_CUDA_ATTN_NVRTC) {
        bool served = false;
        cpc_status *st = attn_cudnn(c, a, &served);
        if (st)
            return st;
        if (served) {
            c->n_cudnn++;
            return NULL;
        }
    }
    c->n_nvrtc++;
    return attn_nvrtc(c, a);
}

/* ---- the backward (kernels/attention_bwd.cu) ------------------------------------ */

/* Tile geometry of cpc_attn_bwd_dkdv / cpc_attn_bwd_dq: mirrors BWD_BM,
 * BWD_NT and BWD_SMEM_BYTES of kernels/attention_bwd.cu. */
static int bwd_tile(int D) { return D <= 64 ? 64 : 32; }
static unsigned bwd_threads(int D) { return D > 128 ? 256u : 128u; }
static size_t bwd_smem_bytes(int D)
{
    size_t bm = (size_t)bwd_tile(D), bn = bm, ld = (size_t)D + 1, sld = bn + 1;
    size_t floats = 2 * bn * ld + 2 * bm * ld + 2 * bm * sld + 2 * bm;
    return (floats * 4 + 7) / 8 * 8 + 8 * (bm + bn);
}

/* Shared memory of cpc_attn_bwd_dkdv_mma / cpc_attn_bwd_dq_mma: mirrors
 * BWD_MMA_KV_SMEM / BWD_MMA_Q_SMEM (64 keys, 32-row query steps; 64 query
 * rows, key steps of 64 (D <= 64) or 32; pitch D + 8; transposed tiles
 * pitch rows + 8). */
static size_t bwd_mma_kv_smem(int D)
{
    size_t ld = (size_t)D + 8, bn = 64, bm = 32, tld = bm + 8;
    size_t halfs = 2 * bn * ld + 2 * bm * ld + 2 * (size_t)D * tld;
    return (halfs * 2 + 2 * bm * 4 + 7) / 8 * 8 + 8 * (bm + bn);
}
static size_t bwd_mma_q_smem(int D)
{
    size_t ld = (size_t)D + 8, bm = 64, bn = D <= 64 ? 64 : 32, tld = bn + 8;
    size_t halfs = 2 * bm * ld + 2 * bn * ld + (size_t)D * tld;
    return (halfs * 2 + 2 * bm * 4 + 7) / 8 * 8 + 8 * (bm + bn);
}

/* delta (when asked), then dK/dV and dQ, all on the compute stream (in
 * order): see kernels/attention_bwd.cu for the design. */
static cpc_status *b_attn_bwd(cpc_backend *be, const cpc_attn_bwd_args *a)
{
    cuda_ctx *c = C(be);
    cpc_status *st = cpc_attn_bwd_args_check(a);
    if (st || (st = check_spec(c, &a->p)))
        return st;
    const cpc_attn_problem *p = &a->p;
    if (a->compute_delta && a->out_dtype != CPC_DTYPE_FP32 && a->out_dtype != c->spec.dtype)
        return cpc_error(CPC_E_INTERNAL, "CUDA attention backward: out in %s: the kernels read fp32 or the plan's %s",
                         cpc_dtype_name(a->out_dtype), cpc_dtype_name(c->spec.dtype));
    if (!cpc_attn_problem_has_rows(p))
        return NULL;
    int B = p->B, hq = p->hq, hkv = p->hkv, qoff = p->q_head_off, kvoff = p->kv_head_off;
    long long sq = p->sq, skv = p->skv;
    const long long qblk = sq * hq * p->d, kvblk = skv * hkv * p->d;
    long long qbs = p->q_bstride, kvbs = p->kv_bstride, dobs = a->dout_bstride;
    long long obs = a->out_bstride;
    long long dqbs = a->dq_bstride ? a->dq_bstride : qblk;
    long long dkvbs = a->dkv_bstride ? a->dkv_bstride : kvblk;
    const void *q = p->q, *k = p->k, *v = p->v, *dout = a->dout, *out = a->out;
    const float *lse = a->lse;
    float *delta = a->delta, *dq = a->dq, *dk = a->dk, *dv = a->dv;
    if (a->compute_delta) {
        void *dargs[] = {&dout, &out, &delta, &B, &sq, &hq, &dobs, &obs};
        cudaKernel_t kd = a->out_dtype == CPC_DTYPE_FP32 ? c->k_bwd_delta_f32 : c->k_bwd_delta;
        long long rows = (long long)B * sq * hq;
        if ((st = launch(c, kd, grid_for(rows * 32, 256, c->sm_count), 1, 1, 256, 0, dargs,
                         "attn_bwd delta")))
            return st;
    }
    if (skv == 0)
        return NULL; /* no key: no gradient */
    long long *qpos = NULL, *kvpos = NULL;
    if (p->causal || p->kv_mask) {
        if ((st = upload_positions(c, p, &qpos, &kvpos)))
            return st;
    }
    float scale = p->scale;
    const unsigned char *mask = NULL;
    if ((st = device_mask(c, p->kv_mask, (size_t)p->B * (size_t)p->mask_len, &mask)))
        return st;
    long long mlen = p->mask_len;
    void *args[] = {&q, &k, &v, &dout, &lse, &delta, &dq, &dk, &dv, &B, &sq, &skv, &hq, &hkv,
                    &qoff, &kvoff, &qbs, &kvbs, &dobs, &dqbs, &dkvbs, &scale, &qpos, &kvpos,
                    &mask, &mlen};
    const int D = p->d;
    if (c->k_bwd_dkdv_mma && strcmp(c->bwd_kernel, "mma") == 0) {
        const size_t skv_mem = bwd_mma_kv_smem(D), sq_mem = bwd_mma_q_smem(D);
        CK(cudaKernelSetAttributeForDevice(c->k_bwd_dkdv_mma, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)skv_mem, c->device),
           "set attn_bwd shared memory");
        CK(cudaKernelSetAttributeForDevice(c->k_bwd_dq_mma, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)sq_mem, c->device),
           "set attn_bwd shared memory");
        if ((st = launch(c, c->k_bwd_dkdv_mma, (unsigned)((skv + 63) / 64), (unsigned)hkv, (unsigned)B,
                         128, skv_mem, args, "attn_bwd dK/dV (mma.sync)")))
            return st;
        return launch(c, c->k_bwd_dq_mma, (unsigned)((sq + 63) / 64), (unsigned)hq, (unsigned)B, 128,
                      sq_mem, args, "attn_bwd dQ (mma.sync)");
    }
    const int tile = bwd_tile(D);
    const size_t smem = bwd_smem_bytes(D);
    const unsigned nt = bwd_threads(D);
    CK(cudaKernelSetAttributeForDevice(c->k_bwd_dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem, c->device),
       "set attn_bwd shared memory");
    CK(cudaKernelSetAttributeForDevice(c->k_bwd_dq, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem, c->device),
       "set attn_bwd shared memory");
    if ((st = launch(c, c->k_bwd_dkdv, (unsigned)((skv + tile - 1) / tile), (unsigned)hkv,
                     (unsigned)B, nt, smem, args, "attn_bwd dK/dV")))
        return st;
    return launch(c, c->k_bwd_dq, (unsigned)((sq + tile - 1) / tile), (unsigned)hq, (unsigned)B, nt,
                  smem, args, "attn_bwd dQ");
}

static cpc_status *b_merge(cpc_backend *be, const cpc_merge_args *m)
{
    cuda_ctx *c = C(be);
    if (m->d != c->spec.head_dim)
        return cpc_error(CPC_E_INTERNAL, "CUDA merge: head_dim %d, kernels built for %d", m->d,
                         c->spec.head_dim);
    int B = m->B, H = m->h;
    long long S = m->s;
    float *acc = m->acc, *acc_lse = m->acc_lse;
    const float *o = m->o, *lse = m->lse;
    void *args[] = {&acc, &acc_lse, &o, &lse, &B, &S, &H};
    long long rows = (long long)B * S * H;
    return launch(c, c->k_merge, grid_for(rows * 32, 256, c->sm_count), 1, 1, 256, 0, args,
                  "merge");
}

static cpc_status *b_init_acc(cpc_backend *be, float *acc, size_t n_acc, float *lse, size_t n_lse)
{
    cuda_ctx *c = C(be);
    long long na = (long long)n_acc, nl = (long long)n_lse;
    void *args[] = {&acc, &na, &lse, &nl};
    return launch(c, c->k_init, grid_for(na > nl ? na : nl, 256, c->sm_count), 1, 1, 256, 0, args,
                  "init_acc");
}

static cpc_status *b_convert(cpc_backend *be, void *dst, cpc_dtype dt, const void *src,
                             cpc_dtype st, size_t n)
{
    cuda_ctx *c = C(be);
    long long nn = (long long)n;
    if (dt == st)
        return b_copy(be, dst, src, n * (size_t)dsize(dt));
    void *args[] = {&dst, &src, &nn};
    if (st == CPC_DTYPE_FP32 && dt == c->spec.dtype)
        return launch(c, c->k_from_f32, grid_for(nn, 256, c->sm_count), 1, 1, 256, 0, args,
                      "convert from fp32");
    if (dt == CPC_DTYPE_FP32 && st == c->spec.dtype)
        return launch(c, c->k_to_f32, grid_for(nn, 256, c->sm_count), 1, 1, 256, 0, args,
                      "convert to fp32");
    return cpc_error(CPC_E_INTERNAL, "CUDA convert %s -> %s: no kernel for this pair",
                     cpc_dtype_name(st), cpc_dtype_name(dt));
}

static cpc_status *b_copy_strided(cpc_backend *be, void *dst, const void *src, size_t esize,
                                  int64_t nb, int64_t nt, int64_t nh, int64_t inner, int64_t dbs,
                                  int64_t dts, int64_t dhs, int64_t sbs, int64_t sts, int64_t shs)
{
    cuda_ctx *c = C(be);
    cudaKernel_t k;
    if (esize == 4 && c->spec.dtype != CPC_DTYPE_FP32)
        k = c->k_copy_f32;
    else if (esize == (size_t)dsize(c->spec.dtype))
        k = c->k_copy;
    else
        return cpc_error(CPC_E_INTERNAL, "CUDA copy_strided: element size %zu not supported",
                         esize);
    long long a0 = nb, a1 = nt, a2 = nh, a3 = inner, a4 = dbs, a5 = dts, a6 = dhs, a7 = sbs,
              a8 = sts, a9 = shs;
    void *args[] = {&dst, &src, &a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7, &a8, &a9};
    long long rows = nb * nt * nh;
    unsigned g = (unsigned)(rows < (long long)c->sm_count * 64 ? rows : (long long)c->sm_count * 64);
    return launch(c, k, g, 1, 1, 128, 0, args, "copy_strided");
}

static cpc_status *b_add_strided(cpc_backend *be, float *dst, const float *src, int64_t nb,
                                 int64_t nt, int64_t nh, int64_t inner, int64_t dbs, int64_t dts,
                                 int64_t dhs, int64_t sbs, int64_t sts, int64_t shs)
{
    cuda_ctx *c = C(be);
    if (nb < 0 || nt < 0 || nh < 0 || inner < 0)
        return cpc_error(CPC_E_INTERNAL, "CUDA add_strided: bad sizes");
    if (nb == 0 || nt == 0 || nh == 0 || inner == 0)
        return NULL;
    if (!dst || !src)
        return cpc_error(CPC_E_INTERNAL, "CUDA add_strided: NULL buffer");
    long long a0 = nb, a1 = nt, a2 = nh, a3 = inner, a4 = dbs, a5 = dts, a6 = dhs, a7 = sbs,
              a8 = sts, a9 = shs;
    void *args[] = {&dst, &src, &a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7, &a8, &a9};
    return launch(c, c->k_add_f32, grid_for(nb * nt * nh * inner, 256, c->sm_count), 1, 1, 256, 0,
                  args, "add_strided");
}

static cpc_status *b_sync(cpc_backend *be)
{
    CK(cudaStreamSynchronize(C(be)->compute), "stream synchronize");
    return NULL;
}

static void b_destroy(cpc_backend *be)
{
    if (!be)
        return;
    cuda_ctx *c = C(be);
    if (c) {
        cudaSetDevice(c->device);
        if (c->pos)
            cudaFree(c->pos);
        if (c->o16)
            cudaFree(c->o16);
        if (c->neginf)
            cudaFree(c->neginf);
        if (c->mask_dev)
            cudaFree(c->mask_dev);
        cpc_cudnn_sdpa_destroy(c->sdpa);
        for (int i = 0; i < c->n_libs; i++)
            cudaLibraryUnload(c->libs[i]);
        if (c->compute)
            cudaStreamDestroy(c->compute);
        free(c);
    }
    free(be);
}

/* The methods every CUDA backend has; each instance copies them into its
 * context and adds the optional ones its kernel modules serve: attn_bwd with
 * the backward module, add_strided with memory.cu's cpc_add_strided_f32
 * (artifacts written before either lack them: training then refuses). */
static const cpc_backend_vtable cuda_vt = {
    .name = "cuda", .alloc = b_alloc, .free = b_free, .upload = b_upload,
    .download = b_download, .copy = b_copy, .attn = b_attn, .merge = b_merge,
    .init_acc = b_init_acc, .convert = b_convert, .copy_strided = b_copy_strided,
    .sync = b_sync, .destroy = b_destroy};

static bool is_cuda(const cpc_backend *be) { return be && be->vt && be->vt->destroy == b_destroy; }

static cpc_status *get_kernel(cudaLibrary_t lib, const char *name, cudaKernel_t *out, bool optional)
{
    cudaError_t e = cudaLibraryGetKernel(out, lib, name);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        if (optional)
            return NULL;
        return cpc_error(CPC_E_INPUT, "CUDA: kernel '%s' missing from the artifact's PTX: %s", name,
                         cudaGetErrorString(e));
    }
    return NULL;
}

cpc_status *cpc_cuda_backend_create(int device, const cpc_kernel_spec *spec,
                                    const cpc_kernel *kernels, int n_kernels, cpc_backend **out)
{
    *out = NULL;
    int n = 0;
    cpc_status *st = cpc_cuda_device_count(&n);
    if (st)
        return st;
    if (device < 0 || device >= n)
        return cpc_error(CPC_E_UNSUPPORTED, "GPU %d requested, %d visible", device, n);
    cpc_backend *be = calloc(1, sizeof *be);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return &cpc_status_oom;
    }
    c->vt = cuda_vt;
    be->vt = &c->vt;
    be->ctx = c;
    c->device = device;
    c->spec = *spec;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) {
        b_destroy(be);
        return cuda_err(e, "device setup");
    }
    /* Ranks on other GPUs of this process copy straight into this GPU's
     * buffers (transport_device.h): enable peer access where the hardware
     * has it (else the driver stages peer copies itself).  Enabling twice
     * (another rank on this GPU did) is fine. */
    for (int peer = 0; peer < n; peer++) {
        int can = 0;
        if (peer == device || cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess || !can)
            continue;
        cudaError_t pe = cudaDeviceEnablePeerAccess(peer, 0);
        if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) {
            b_destroy(be);
            return cuda_err(pe, "enable peer access");
        }
    }
    (void)cudaGetLastError();   /* "already enabled" is not sticky, but clear it */
    for (int i = 0; i < n_kernels && !st; i++) {
        if (!kernels[i].ptx) {
            st = cpc_error(CPC_E_INPUT, "kernel module '%s' has no PTX (compiled with --no-kernels?)",
                           kernels[i].name);
            break;
        }
        if (c->n_libs == 4)
            break;
        e = cudaLibraryLoadData(&c->libs[c->n_libs], kernels[i].ptx, NULL, NULL, 0, NULL, NULL, 0);
        if (e != cudaSuccess) {
            st = cuda_err(e, "load PTX");
            cpc_status_prefix(st, "kernel module '%s'", kernels[i].name);
            break;
        }
        cudaLibrary_t lib = c->libs[c->n_libs++];
        if (strcmp(kernels[i].name, "memory") == 0) {
            if (!st) st = get_kernel(lib, "cpc_copy_strided", &c->k_copy, false);
            if (!st) st = get_kernel(lib, "cpc_copy_strided_f32", &c->k_copy_f32, false);
            if (!st) st = get_kernel(lib, "cpc_merge_lse", &c->k_merge, false);
            if (!st) st = get_kernel(lib, "cpc_init_acc", &c->k_init, false);
            if (!st) st = get_kernel(lib, "cpc_convert_from_f32", &c->k_from_f32, false);
            if (!st) st = get_kernel(lib, "cpc_convert_to_f32", &c->k_to_f32, false);
            if (!st) st = get_kernel(lib, "cpc_add_strided_f32", &c->k_add_f32, true);
        } else if (strcmp(kernels[i].name, "attention") == 0) {
            if (!st) st = get_kernel(lib, "cpc_flash_attn_mma", &c->k_attn_mma, true);
            if (!st) st = get_kernel(lib, "cpc_flash_attn_tc", &c->k_attn_tc, true);
            if (!st) st = get_kernel(lib, "cpc_attn_rowwarp", &c->k_attn_rowwarp, false);
        } else if (strcmp(kernels[i].name, "attention_bwd") == 0) {
            if (!st) st = get_kernel(lib, "cpc_attn_bwd_delta", &c->k_bwd_delta, false);
            if (!st) st = get_kernel(lib, "cpc_attn_bwd_delta_f32", &c->k_bwd_delta_f32, false);
            if (!st) st = get_kernel(lib, "cpc_attn_bwd_dkdv", &c->k_bwd_dkdv, false);
            if (!st) st = get_kernel(lib, "cpc_attn_bwd_dq", &c->k_bwd_dq, false);
            if (!st) st = get_kernel(lib, "cpc_attn_bwd_dkdv_mma", &c->k_bwd_dkdv_mma, true);
            if (!st) st = get_kernel(lib, "cpc_attn_bwd_dq_mma", &c->k_bwd_dq_mma, true);
        }
    }
    /* Which generated attention kernel serves (CPC_NVRTC_ATTN overrides). */
    c->attn_kernel = c->k_attn_mma ? "mma" : c->k_attn_tc ? "wmma" : "rowwarp";
    const char *want = getenv("CPC_NVRTC_ATTN");
    if (!st && want && *want && (st = pick_nvrtc_kernel(c, want)))
        cpc_status_prefix(st, "CPC_NVRTC_ATTN");
    /* Which backward kernels serve (CPC_NVRTC_ATTN_BWD=mma|simt overrides). */
    c->bwd_kernel = c->k_bwd_dkdv_mma && c->k_bwd_dq_mma ? "mma" : "simt";
    const char *want_bwd = getenv("CPC_NVRTC_ATTN_BWD");
    if (!st && want_bwd && *want_bwd) {
        if (strcmp(want_bwd, "simt") == 0)
            c->bwd_kernel = "simt";
        else if (strcmp(want_bwd, "mma") != 0 || strcmp(c->bwd_kernel, "mma") != 0)
            st = cpc_error(CPC_E_USAGE,
                           "CPC_NVRTC_ATTN_BWD: '%s' is not a backward kernel of this plan (mma: "
                           "bf16/fp16 with head_dim %% 16 == 0 and <= 128; simt: any)",
                           want_bwd);
    }
    if (!st && (!c->k_merge || !c->k_attn_rowwarp))
        st = cpc_error(CPC_E_INPUT, "the artifact lacks the 'memory' or 'attention' kernel module");
    if (st) {
        b_destroy(be);
        return st;
    }
    if (c->k_bwd_dkdv)
        c->vt.attn_bwd = b_attn_bwd; /* the backward module is loaded */
    if (c->k_add_f32)
        c->vt.add_strided = b_add_strided;
    *out = be;
    return NULL;
}

/* ---- attention path selection ------------------------------------------------ */

static const char *const attn_names[CPC_CUDA_ATTN__COUNT] = {"auto", "cudnn", "nvrtc"};

const char *cpc_cuda_attention_name(cpc_cuda_attention m)
{
    return m >= 0 && m < CPC_CUDA_ATTN__COUNT ? attn_names[m] : "?";
}

int cpc_cuda_attention_parse(const char *s)
{
    for (int i = 0; s && i < CPC_CUDA_ATTN__COUNT; i++)
        if (strcmp(s, attn_names[i]) == 0)
            return i;
    return -1;
}

cpc_status *cpc_cuda_backend_set_attention(cpc_backend *be, cpc_cuda_attention mode)
{
    if (!is_cuda(be))
        return cpc_error(CPC_E_USAGE, "attention mode: not a CUDA backend");
    if (mode < 0 || mode >= CPC_CUDA_ATTN__COUNT)
        return cpc_error(CPC_E_USAGE, "attention mode %d out of range", (int)mode);
    cuda_ctx *c = C(be);
    if (mode == CPC_CUDA_ATTN_CUDNN && !c->sdpa) {
        if (!c->sdpa_failed) {
            cpc_status *st = cpc_cudnn_sdpa_create(c->device, &c->sdpa);
            if (st) {
                snprintf(c->sdpa_why, sizeof c->sdpa_why, "%s", st->message);
                c->sdpa_failed = true;
                cpc_status_free(st);
            }
        }
        if (!c->sdpa)
            return cpc_error(CPC_E_UNSUPPORTED, "--attention cudnn: %s", c->sdpa_why);
    }
    c->attn_mode = mode;
    return NULL;
}

cpc_status *cpc_cuda_backend_set_nvrtc_kernel(cpc_backend *be, const char *name)
{
    if (!is_cuda(be))
        return cpc_error(CPC_E_USAGE, "not a CUDA backend");
    return pick_nvrtc_kernel(C(be), name ? name : "");
}

void cpc_cuda_backend_attention_info(cpc_backend *be, cpc_cuda_attn_info *out, bool reset)
{
    memset(out, 0, sizeof *out);
    if (!is_cuda(be))
        return;
    cuda_ctx *c = C(be);
    out->mode = c->attn_mode;
    out->cudnn_usable = c->sdpa != NULL;
    out->cudnn_blocks = c->n_cudnn;
    out->nvrtc_blocks = c->n_nvrtc;
    out->fallback_blocks = c->n_fallback;
    snprintf(out->fallback_reason, sizeof out->fallback_reason, "%s", c->fallback_why);
    out->cudnn_version = cpc_cudnn_version();
    out->nvrtc_kernel = c->attn_kernel;
    out->bwd_kernel = c->k_bwd_dkdv ? c->bwd_kernel : NULL;
    if (reset) {
        c->n_cudnn = c->n_nvrtc = c->n_fallback = 0;
        c->fallback_why[0] = 0;
    }
}
