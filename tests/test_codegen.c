/* test_codegen.c - kernels generated for every plan compile through NVRTC with no
 * warning, and the kernels do not spill to local memory beyond the known spills
 * listed below (each a bug to fix; a new spill, or a larger one, fails). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "plan_load.h"

/* Known spills (ptxas -v for sm_90 with cpc's NVRTC options), found when
 * the report's parser was fixed (it had read every spill as 0): the largest
 * store / load bytes allowed for a function at a specialisation.  Remove a
 * row when its kernel is fixed. */
static const struct known_spill {
    const char *fn;
    cpc_dtype dtype;   /* CPC_DTYPE__COUNT: any */
    int head_dim;      /* 0: any */
    int causal;        /* -1: any */
    int max_store, max_load;
} KNOWN_SPILLS[] = {
    /* mma kernel, head_dim 64, not causal: Q fragments in registers at 128 */
    {"cpc_flash_attn_mma", CPC_DTYPE__COUNT, 64, 0, 8, 8},
    /* wmma kernel (the fallback tensor-core kernel) at fp16 */
    {"cpc_flash_attn_tc", CPC_DTYPE_FP16, 0, -1, 48, 40},
};

static void allowed_spill(const cpc_kernel_spec *spec, const char *fn, int *st, int *ld)
{
    *st = *ld = 0;
    for (size_t i = 0; i < sizeof KNOWN_SPILLS / sizeof *KNOWN_SPILLS; i++) {
        const struct known_spill *k = &KNOWN_SPILLS[i];
        if (strcmp(k->fn, fn) == 0 && (k->dtype == CPC_DTYPE__COUNT || k->dtype == spec->dtype) &&
            (!k->head_dim || k->head_dim == spec->head_dim) &&
            (k->causal < 0 || k->causal == (int)spec->causal)) {
            *st = k->max_store;
            *ld = k->max_load;
        }
    }
}

Test(codegen, ptxas_report_is_parsed)
{
    /* the lines as NVRTC's ptxas writes them (spill figures after "ptxas    .") */
    const char *log = "ptxas info    : 0 bytes gmem\n"
                      "ptxas info    : Compiling entry function 'cpc_a' for 'sm_90'\n"
                      "ptxas info    : Function properties for cpc_a\n"
                      "ptxas         .    24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads\n"
                      "ptxas info    : Used 168 registers, used 1 barriers, 24 bytes cumulative stack size\n"
                      "ptxas info    : Compiling entry function 'cpc_b' for 'sm_90'\n"
                      "ptxas info    : Function properties for cpc_b\n"
                      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                      "ptxas info    : Used 32 registers\n";
    cpc_kernel k = {0};
    cr_assert_null(cpc_codegen_parse_report(&k, log));
    cr_assert_eq(k.n_fns, 2);
    cr_expect_str_eq(k.fns[0].name, "cpc_a");
    cr_expect_eq(k.fns[0].stack_bytes, 24);
    cr_expect_eq(k.fns[0].spill_store_bytes, 16);
    cr_expect_eq(k.fns[0].spill_load_bytes, 12);
    cr_expect_eq(k.fns[0].registers, 168);
    cr_expect_eq(k.fns[1].registers, 32);
    cr_expect_eq(k.fns[1].spill_store_bytes, 0);
    free(k.fns);
    cpc_kernel empty = {0};
    cpc_status *st = cpc_codegen_parse_report(&empty, "nothing here\n");
    cr_expect_not_null(st);
    cpc_status_free(st);
}

static void check_spec(const cpc_kernel_spec *spec, const char *what)
{
    cpc_kernel *k = NULL;
    int n = 0;
    cpc_status *st = cpc_codegen_sources(spec, "sm_90", &k, &n);
    cr_assert_null(st);
    cr_assert_eq(n, CPC_CODEGEN_MODULES);
    cr_expect_str_eq(k[2].name, "attention_bwd");
    for (int i = 0; i < n; i++) {
        cr_assert(strstr(k[i].source, "#define CPC_HEAD_DIM"), "specialisation prepended");
        st = cpc_codegen_report(&k[i]);
        if (st)
            cpc_status_print(st, stderr, "test_codegen");
        cr_assert_null(st, "%s: module %s compiles", what, k[i].name);
        cr_expect(!k[i].log || !strstr(k[i].log, "warning"), "%s: %s: NVRTC warning:\n%s", what,
                  k[i].name, k[i].log);
        for (int f = 0; f < k[i].n_fns; f++) {
            const cpc_kernel_fn_report *r = &k[i].fns[f];
            fprintf(stderr, "%-40s %-22s regs %3d stack %4d spill st %4d ld %4d\n", what, r->name,
                    r->registers, r->stack_bytes, r->spill_store_bytes, r->spill_load_bytes);
            int ast, ald;
            allowed_spill(spec, r->name, &ast, &ald);
            cr_expect_leq(r->spill_store_bytes, ast, "%s: %s spills %d bytes (known: %d)", what,
                          r->name, r->spill_store_bytes, ast);
            cr_expect_leq(r->spill_load_bytes, ald, "%s: %s spills %d bytes (known: %d)", what,
                          r->name, r->spill_load_bytes, ald);
            cr_expect_gt(r->registers, 0);
        }
        st = cpc_codegen_compile(&k[i]);
        cr_assert_null(st);
        cr_expect(k[i].ptx && strstr(k[i].ptx, ".target sm_90"), "PTX for sm_90");
    }
    cpc_kernels_free(k, n);
}

Test(codegen, every_plan_compiles_without_spills)
{
    if (!cpc_codegen_available())
        cr_skip_test("built without the CUDA toolkit");
    setenv("CPC_CACHE_DIR", "/tmp/cpc-test-cache", 1);
    DIR *d = opendir("plans");
    cr_assert(d, "plans/ folder");
    struct dirent *e;
    cpc_kernel_spec seen[64];
    int n_seen = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".yaml") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "plans/%s", e->d_name);
        cpc_plan *plan = NULL;
        cpc_status *st = cpc_plan_load_file(path, NULL, 0, &plan);
        cr_assert(plan, "%s loads", path);
        cpc_status_free(st);
        cpc_kernel_spec s = cpc_kernel_spec_of(plan);
        cpc_plan_free(plan);
        int dup = 0;
        for (int i = 0; i < n_seen; i++)
            dup |= memcmp(&seen[i], &s, sizeof s) == 0;
        if (dup || n_seen == 64)
            continue;
        seen[n_seen++] = s;
        check_spec(&s, path);
    }
    closedir(d);
    cr_assert_gt(n_seen, 0);
}

Test(codegen, dtype_headdim_matrix)
{
    if (!cpc_codegen_available())
        cr_skip_test("built without the CUDA toolkit");
    setenv("CPC_CACHE_DIR", "/tmp/cpc-test-cache", 1);
    /* 64 / 128 / 256: each tile and thread count of the backward kernels
     * (kernels/attention_bwd.cu), 40 and 80 the odd head_dims */
    const int dims[] = {64, 128, 40, 256, 80};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 5; i++) {
            cpc_kernel_spec s = {(cpc_dtype)t, dims[i], i == 1, i == 2 ? 4 : 1};
            char what[64];
            snprintf(what, sizeof what, "%s d=%d causal=%d", cpc_dtype_name(s.dtype), s.head_dim,
                     s.causal);
            check_spec(&s, what);
        }
}

Test(codegen, cache_reuses_ptx_and_hash_tracks_spec)
{
    if (!cpc_codegen_available())
        cr_skip_test("built without the CUDA toolkit");
    char dir[] = "/tmp/cpc_cache_XXXXXX";
    cr_assert(mkdtemp(dir));
    setenv("CPC_CACHE_DIR", dir, 1);
    cpc_kernel_spec s = {CPC_DTYPE_BF16, 64, false, 1};
    cpc_kernel *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    cr_assert_null(cpc_codegen_sources(&s, "sm_90", &a, &na));
    cr_assert_null(cpc_codegen_compile(&a[0]));
    cr_expect(!a[0].from_cache);
    cr_assert_null(cpc_codegen_sources(&s, "sm_90", &b, &nb));
    cr_assert_null(cpc_codegen_compile(&b[0]));
    cr_expect(b[0].from_cache, "second compile comes from the cache");
    cr_expect_str_eq(a[0].ptx, b[0].ptx);
    cpc_kernel *c = NULL;
    int nc = 0;
    s.head_dim = 128;
    cr_assert_null(cpc_codegen_sources(&s, "sm_90", &c, &nc));
    cr_expect_str_neq(a[0].hash, c[0].hash, "another head_dim is another kernel");
    cpc_kernels_free(a, na);
    cpc_kernels_free(b, nb);
    cpc_kernels_free(c, nc);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(codegen, bad_arch_is_usage_error)
{
    cpc_kernel_spec s = {CPC_DTYPE_BF16, 64, false, 1};
    cpc_kernel *k = NULL;
    int n = 0;
    cpc_status *st = cpc_codegen_sources(&s, "compute90", &k, &n);
    cr_assert(st);
    cr_expect_eq(st->code, CPC_E_USAGE);
    cpc_status_free(st);
}

Test(codegen, nvrtc_error_carries_log)
{
    if (!cpc_codegen_available())
        cr_skip_test("built without the CUDA toolkit");
    cpc_kernel_spec s = {CPC_DTYPE_FP16, 64, false, 1};
    cpc_kernel *k = NULL;
    int n = 0;
    cr_assert_null(cpc_codegen_sources(&s, "sm_90", &k, &n));
    free(k[0].source);
    k[0].source = strdup("extern \"C\" __global__ void broken() { undefined_thing(); }\n");
    free(k[0].hash);
    k[0].hash = strdup("0000000000000000000000000000000000000000000000000000000000000000broken");
    setenv("CPC_CACHE_DIR", "/dev/null/cpc", 1); /* cannot be created: no cache */
    cpc_status *st = cpc_codegen_compile(&k[0]);
    cr_assert(st);
    cr_expect_eq(st->code, CPC_E_INTERNAL);
    cr_assert(st->notes && strstr(st->notes->message, "undefined_thing"), "log in a note");
    cpc_status_free(st);
    cpc_kernels_free(k, n);
}
