/*
 * test_backend_cuda_emu.c - the CUDA backend (runtime/backend/backend_cuda.c)
 * through the backend conformance suite (tests/backend_conformance.h), on the
 * CPU emulator of CUDA: this binary links cpc_internal, whose libcudart.so.13
 * is the fake one (tests/emu/fake_cudart.c) when <build>/emu-cudart is first
 * on LD_LIBRARY_PATH (ctest sets it), so every launch of the generated
 * kernels (the kernels folder through compiler/codegen.c, compiled to PTX by NVRTC)
 * runs on the emulator (tests/emu/emu.h).  On a machine with a GPU and the
 * real runtime the same test runs on the GPU.
 *
 * For each kernel specialisation a case needs (dtype, head_dim, causal, gqa),
 * the factory generates the modules, compiles them with NVRTC (cached under
 * $CPC_CACHE_DIR) and builds their emulator modules into $CPC_EMU_MODULES
 * under the SHA-256 of the PTX (what the fake cudaLibraryLoadData looks up).
 *
 * Every attention block runs twice, the second time with the threads of each
 * block in reverse order between barriers (cpc_emu_set_order): the outputs
 * must be bitwise equal, else a kernel reads shared data without a barrier.
 *
 * Variants (the generated kernel serving the blocks, CPC_NVRTC_ATTN):
 *  default  mma.sync for bf16/fp16 with head_dim % 16 == 0, rowwarp
 *           otherwise; every case of the matrix but the LARGE ones (minutes
 *           on the emulator; each feature they show has a small case), and
 *           the other backend methods and refused arguments;
 *  wmma     the cases the wmma kernel serves (bf16/fp16, head_dim % 16 == 0);
 *  rowwarp  the bf16/fp16 cases of the former emulator table (fp32 and
 *           head_dim % 16 != 0 already run it in the default variant).
 * backward: the backward case matrix (CPC_BC_BWD) on attn_bwd, the
 *           generated backward kernels (mma.sync for bf16/fp16 with head_dim
 *           % 16 == 0 and <= 128, SIMT otherwise), with the default forward;
 *           backward_simt forces the SIMT kernels (CPC_NVRTC_ATTN_BWD=simt) on
 *           the bf16/fp16 cases the default runs on mma.sync.
 * The NaN-in-q cases run on every variant (a NaN row must come out NaN, never
 * as an empty row).  Skipped: bf16 <-> fp16 conversion (the backend has no
 * kernel for it).
 *
 * The seed is printed with every failure; CPC_TEST_SEED=N replays,
 * CPC_BC_ONLY=NAME selects cases, CPC_TEST_VERBOSE=1 logs each case.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "backend_conformance.h"
#include "backend_cuda.h"
#include "codegen.h"
#include "emu.h"

typedef struct variant {
    const char *kernel;             /* CPC_NVRTC_ATTN choice, NULL: the default */
    const char *const *names;       /* NULL: every case; else these case names only */
} variant;

static const char *modules_dir(void)
{
    const char *d = getenv("CPC_EMU_MODULES");
    return d && *d ? d : NULL;
}

/* The emulator module of a compiled kernel, where the fake looks for it. */
static cpc_status *ensure_module(const cpc_kernel *k)
{
    const char *dir = modules_dir();
    if (!dir)
        return NULL; /* a real runtime (a GPU): nothing to build */
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (!EVP_Digest(k->ptx, strlen(k->ptx), md, &n, EVP_sha256(), NULL) || n != 32)
        return cpc_error(CPC_E_RUNTIME, "SHA-256 failed");
    char so[4096], tmp[4200], err[4096];
    int w = snprintf(so, sizeof so, "%s/", dir);
    for (int i = 0; i < 32; i++)
        w += snprintf(so + w, sizeof so - (size_t)w, "%02x", md[i]);
    snprintf(so + w, sizeof so - (size_t)w, ".so");
    if (access(so, R_OK) == 0)
        return NULL;
    mkdir(dir, 0777);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", so, (int)getpid());
    if (cpc_emu_build_module(k->source, tmp, err, sizeof err) != 0)
        return cpc_error(CPC_E_RUNTIME, "emulator module of '%s': %s", k->name, err);
    if (rename(tmp, so) != 0)
        return cpc_error(CPC_E_RUNTIME, "rename %s", tmp);
    return NULL;
}

static cpc_status *cuda_create(void *ctx, const cpc_kernel_spec *spec, cpc_backend **out)
{
    const variant *v = ctx;
    *out = NULL;
    cpc_kernel *k = NULL;
    int nk = 0;
    cpc_status *st = cpc_codegen_sources(spec, "sm_90", &k, &nk);
    for (int i = 0; !st && i < nk; i++)
        st = cpc_codegen_compile(&k[i]);
    for (int i = 0; !st && i < nk; i++)
        st = ensure_module(&k[i]);
    if (!st)
        st = cpc_cuda_backend_create(0, spec, k, nk, out);
    cpc_kernels_free(k, nk);
    if (!st)
        st = cpc_cuda_backend_set_attention(*out, CPC_CUDA_ATTN_NVRTC);
    if (!st && v->kernel)
        st = cpc_cuda_backend_set_nvrtc_kernel(*out, v->kernel);
    if (st && *out) {
        cpc_backend_destroy(*out);
        *out = NULL;
    }
    return st;
}

static const char *cuda_skip(void *ctx, const cpc_bc_case *c, cpc_dtype dt)
{
    const variant *v = ctx;
    if (v->names) {
        bool listed = false;
        for (int i = 0; v->names[i]; i++)
            listed = listed || strcmp(v->names[i], c->name) == 0;
        if (!listed)
            return "not in this variant's list";
    }
    if (v->kernel && strcmp(v->kernel, "rowwarp") != 0 &&
        (dt == CPC_DTYPE_FP32 || c->D % 16 != 0 || c->D > 256))
        return "the mma.sync and wmma kernels serve bf16/fp16 with head_dim % 16 == 0 (<= 256) "
               "only (kernels/attention.cu); rowwarp serves this case in the default variant";
    return NULL;
}

static void perturb(void *ctx, int on)
{
    (void)ctx;
    cpc_emu_set_order(on); /* the fake runs launches on the calling thread */
}

static void need_device(void)
{
    int n = 0;
    cpc_status *st = cpc_cuda_device_count(&n);
    if (st) {
        Dl_info info = {0};
        void *sym = dlsym(RTLD_DEFAULT, "cudaGetDeviceCount");
        if (sym)
            dladdr(sym, &info);
        cr_assert_fail("no CUDA device: %s (libcudart here is %s; run with LD_LIBRARY_PATH=<build>/emu-cudart "
                "and CPC_EMU_MODULES set, as ctest does)",
                st->message, info.dli_fname ? info.dli_fname : "?");
    }
}

static void run(const variant *v, unsigned checks)
{
    need_device();
    cpc_bc_backend be = {.name = v->kernel ? v->kernel : "cuda", .ctx = (void *)v,
                         .create = cuda_create, .skip_case = cuda_skip, .perturb = perturb};
    cpc_bc_opts o = {.checks = checks,
                     /* CUDA converts only between fp32 and the plan's dtype */
                     .skip = CPC_BC_CONVERT_16_16,
                     .skip_reason = "the CUDA backend converts between fp32 and the plan dtype "
                                    "only (no bf16 <-> fp16 kernel)",
                     .exclude_flags = CPC_BC_LARGE, .repeat = true,
                     .log = getenv("CPC_TEST_VERBOSE") ? stderr : NULL};
    cpc_bc_report rep;
    cpc_status *st = cpc_backend_conformance(&be, &o, &rep);
    if (st)
        cpc_status_print(st, stderr, "test_backend_cuda_emu");
    cr_assert_null(st, "%d conformance failures (seed %llu; CPC_TEST_SEED=%llu replays)",
                   cpc_status_count(st, CPC_SEV_ERROR), (unsigned long long)rep.seed,
                   (unsigned long long)rep.seed);
    cr_assert_gt(rep.cases_run + rep.checks_run, 0, "nothing ran");
    fprintf(stderr, "test_backend_cuda_emu %s: %d cases run, %d skipped, %d other checks, %.1f s\n",
            be.name, rep.cases_run, rep.cases_skipped, rep.checks_run, rep.seconds);
}

TestSuite(cuda_emu, .timeout = 600);

Test(cuda_emu, default_kernels_case_matrix)
{
    variant v = {0};
    run(&v, CPC_BC_ATTN);
}

Test(cuda_emu, methods_and_refused_arguments)
{
    variant v = {0};
    run(&v, CPC_BC_ALL & ~(CPC_BC_ATTN | CPC_BC_BWD));
}

/* attn_bwd (kernels/attention_bwd.cu) on the backward case matrix, each
 * backward twice (the second in reverse thread order: bitwise equal), the
 * saved out and LSE from the default forward kernel. */
Test(cuda_emu, backward_case_matrix)
{
    variant v = {0};
    run(&v, CPC_BC_BWD);
}

/* The SIMT backward kernels on the bf16/fp16 cases the default variant runs
 * on mma.sync (fp32 and other head_dims run SIMT there already). */
Test(cuda_emu, backward_simt_kernels)
{
    static const char *const names[] = {"bwd_d64_cross_strides", "bwd_d16_causal",
                                        "bwd_ring_zigzag_keypad", "bwd_mqa_heads",
                                        "bwd_prior_out_dtype_split", NULL};
    variant v = {.names = names};
    setenv("CPC_NVRTC_ATTN_BWD", "simt", 1);
    run(&v, CPC_BC_BWD);
    unsetenv("CPC_NVRTC_ATTN_BWD");
}

Test(cuda_emu, wmma_kernel)
{
    static const char *const names[] = {
        "emu_bf16_d128_flux_block", "emu_fp16_d64_causal_zigzag_gqa",
        "emu_bf16_d256_head_offsets_mask", "emu_fp16_d80_causal_strided_mask",
        "small_d16_causal", "small_keypad_empty_rows", "small_merge_ring_zigzag", "nan_in_q",
        "nan_in_q_gqa_causal", "nan_in_q_causal_merge", "big_v", "big_v_merged_gqa_d32", NULL};
    variant v = {.kernel = "wmma", .names = names};
    run(&v, CPC_BC_ATTN);
}

Test(cuda_emu, rowwarp_kernel)
{
    static const char *const names[] = {"small_d256_causal", "emu_bf16_d40", "small_gqa_28_7",
                                        "small_zigzag_unified_diag", "nan_in_q", "nan_in_q_gqa_causal",
                                        "nan_in_q_causal_merge", "big_v", "big_v_merged_gqa_d32", NULL};
    variant v = {.kernel = "rowwarp", .names = names};
    run(&v, CPC_BC_ATTN);
}
