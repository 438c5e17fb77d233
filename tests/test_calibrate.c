/*
 * test_calibrate.c - `cprun --calibrate` as a library (runtime/session/calibrate.h):
 * a quick calibration on local rank threads gives a complete, plausible
 * profile; cpc_profile_write / cpc_profile_read round-trip it; and a plan
 * whose cluster.profile names the file (relative to the plan) is priced with
 * exactly those figures (compiler/cost.h).  Also the sharing model:
 * cpc_core_sharing.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compile.h"
#include "cost.h"
#include "plan_load.h"
#include "calibrate.h"

static cpc_calibration quick_calibration(void)
{
    cpc_calibrate_options o = {.quick = true, .ranks = 4, .transport = "local"};
    cpc_calibration c;
    cpc_status *st = cpc_calibrate(&o, &c, NULL);
    if (st)
        cpc_status_print(st, stderr, "test");
    cr_assert_null(st);
    return c;
}

static bool positive(double v) { return isfinite(v) && v > 0; }

Test(calibrate, quick_profile_is_complete)
{
    cpc_calibration c = quick_calibration();
    const cpc_device_profile *d = &c.profile;
    cr_expect_str_eq(d->name, "cpu-calibrated");
    cr_expect_str_eq(c.transport, "local");
    cr_expect_eq(c.ranks, 4);
    cr_expect(positive(d->attn_tflops) && d->attn_tflops < 100, "attn_tflops %g", d->attn_tflops);
    cr_expect(positive(d->attn_tflops_fp32) && d->attn_tflops_fp32 < 100, "fp32 %g",
              d->attn_tflops_fp32);
    cr_expect(positive(d->mem_gbps), "mem_gbps %g", d->mem_gbps);
    cr_expect(positive(d->intra_gbps), "intra_gbps %g", d->intra_gbps);
    cr_expect(positive(d->intra_p2p_gbps), "intra_p2p_gbps %g", d->intra_p2p_gbps);
    cr_expect(positive(d->intra_latency_us), "intra_latency_us %g", d->intra_latency_us);
    cr_expect(positive(d->op_overhead_us), "op_overhead_us %g", d->op_overhead_us);
    cr_expect(isfinite(d->attn_io_gbps) && d->attn_io_gbps >= 0, "attn_io_gbps %g", d->attn_io_gbps);
    /* how ranks share cores: ranks_per_core is the slowdown of the 4 ranks,
     * cores = 4 / slowdown */
    cr_expect(d->ranks_per_core >= 1.0 && isfinite(d->ranks_per_core), "ranks_per_core %g",
              d->ranks_per_core);
    cr_expect(positive(d->cores), "cores %g", d->cores);
    cr_expect_float_eq(d->cores * d->ranks_per_core, 4.0, 1e-9);
    /* the figures are the measurements, converted as calibrate.h says */
    cr_expect_float_eq(d->attn_tflops, c.attn_gflops_bf16 * 1e-3 / c.wall_factor, 1e-12);
    cr_expect(c.wall_factor >= 1.0);
    /* every op's fixed cost: the executor's per op, on a program of a few ops */
    cr_expect(c.exec_ops >= 2 && positive(c.exec_op_us) && c.exec_op_us < 1e4, "executor %d ops, %g us per op",
              c.exec_ops, c.exec_op_us);
    cr_expect_float_eq(d->op_overhead_us, c.exec_op_us * c.wall_factor, 1e-12);
    /* the dense GEMM rate of the whole step, and no separate host on a CPU */
    cr_expect(positive(c.gemm_gflops) && c.gemm_gflops < 1e4, "gemm %g GFLOP/s", c.gemm_gflops);
    cr_expect_float_eq(d->gemm_tflops, c.gemm_gflops * 1e-3 / c.wall_factor, 1e-12);
    cr_expect_eq(d->host_layer_us, 0);
    cr_expect_eq(d->host_op_us, 0);
    /* the softmax term: fitted (>= 0), in the profile per wall second */
    cr_expect(isfinite(d->attn_softmax_gps) && d->attn_softmax_gps >= 0, "softmax %g", d->attn_softmax_gps);
    cr_expect_float_eq(d->attn_softmax_gps, c.attn_softmax_gps_bf16 / c.wall_factor, 1e-12);
    cr_expect(c.attn_narrow_cpu_ms_bf16 > 0 && c.attn_narrow_cpu_ms_bf16 < c.attn_cpu_ms_bf16,
              "the narrow block (head_dim 16: %g ms) must cost less than the big one (%g ms)",
              c.attn_narrow_cpu_ms_bf16, c.attn_cpu_ms_bf16);
    cr_expect(c.attn_cpu_ms_bf16 > c.attn_small_cpu_ms_bf16,
              "the big block (%g ms) must cost more than the small one (%g ms)",
              c.attn_cpu_ms_bf16, c.attn_small_cpu_ms_bf16);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    cr_expect_float_eq(d->memory_gb, (double)pages * (double)psz / 1073741824.0, 1e-9);
    /* not measured: the cpu preset's inter-node figures */
    cpc_device_profile cpu;
    cr_assert(cpc_device_preset("cpu", &cpu));
    cr_expect_float_eq(d->inter_gbps, cpu.inter_gbps, 1e-12);
    cr_expect_float_eq(d->inter_latency_us, cpu.inter_latency_us, 1e-12);
    cr_expect(c.seconds > 0 && c.seconds < 30, "quick calibration took %g s", c.seconds);
}

static void expect_same(const cpc_device_profile *a, const cpc_device_profile *b)
{
#define SAME(f) cr_expect(fabs(a->f - b->f) <= 1e-5 * fabs(a->f) + 1e-12, #f ": %g vs %g", a->f, b->f)
    SAME(attn_tflops);
    SAME(attn_tflops_fp32);
    SAME(mem_gbps);
    SAME(intra_gbps);
    SAME(intra_p2p_gbps);
    SAME(inter_gbps);
    SAME(intra_latency_us);
    SAME(inter_latency_us);
    SAME(memory_gb);
    SAME(ranks_per_core);
    SAME(op_overhead_us);
    SAME(cores);
    SAME(attn_io_gbps);
    SAME(attn_softmax_gps);
    SAME(gemm_tflops);
    SAME(host_layer_us);
    SAME(host_op_us);
#undef SAME
    cr_expect_str_eq(a->name, b->name);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static double predicted_ms(const char *plan_path, cpc_device_profile *dev)
{
    cpc_compile_opts o = {.until = CPC_UNTIL_VERIFY};
    cpc_compiled c;
    bool ok = cpc_compile_file(plan_path, &o, &c);
    if (!ok)
        cpc_status_print(c.diags, stderr, "test");
    cr_assert(ok && c.priced, "%s does not compile", plan_path);
    *dev = c.device;
    double ms = c.pred.ms_per_layer;
    cpc_compiled_free(&c);
    return ms;
}

/* The profile round-trips, and a plan naming it (relative path) is priced
 * with its figures: halving attn_tflops adds exactly the attention's
 * FLOPs / rate x sharing to the predicted time of a one-rank plan. */
Test(calibrate, plan_is_priced_with_the_profile)
{
    cpc_calibration c = quick_calibration();
    char dir[] = "/tmp/cpc_calibrate_XXXXXX";
    cr_assert(mkdtemp(dir));
    char prof[256], prof2[256], plan[256], plan2[256], plan_preset[256];
    snprintf(prof, sizeof prof, "%s/machine.yaml", dir);
    snprintf(prof2, sizeof prof2, "%s/slow.yaml", dir);
    snprintf(plan, sizeof plan, "%s/plan.yaml", dir);
    snprintf(plan2, sizeof plan2, "%s/plan_slow.yaml", dir);
    snprintf(plan_preset, sizeof plan_preset, "%s/plan_preset.yaml", dir);
    cr_assert_null(cpc_profile_write(prof, &c.profile));
    cpc_device_profile back;
    memset(&back, 0, sizeof back);
    cr_assert_null(cpc_profile_read(prof, &back));
    expect_same(&c.profile, &back);

    cpc_device_profile slow = back;
    slow.attn_tflops *= 0.5;
    cr_assert_null(cpc_profile_write(prof2, &slow));
    const char *body = "model: {heads: 4, head_dim: 64, dtype: bf16}\n"
                       "input: {tokens: 2048}\n"
                       "parallel: {variant: none}\n";
    char text[1024];
    snprintf(text, sizeof text, "version: 1\n%scluster: {world_size: 1, device: cpu, profile: machine.yaml}\n", body);
    write_file(plan, text);
    snprintf(text, sizeof text, "version: 1\n%scluster: {world_size: 1, device: cpu, profile: slow.yaml}\n", body);
    write_file(plan2, text);
    snprintf(text, sizeof text, "version: 1\n%scluster: {world_size: 1, device: cpu}\n", body);
    write_file(plan_preset, text);

    cpc_device_profile d1, d2, d0;
    double t1 = predicted_ms(plan, &d1);
    double t2 = predicted_ms(plan2, &d2);
    double t0 = predicted_ms(plan_preset, &d0);
    expect_same(&back, &d1);
    cr_expect_str_eq(d0.name, "cpu");
    /* one rank: sharing = max(1, 1 / cores) */
    double share = back.cores < 1.0 ? 1.0 / back.cores : 1.0;
    double flops = 4.0 * 2048.0 * 2048.0 * 4 * 64;
    double want = flops / (back.attn_tflops * 1e12) * share * 1e3;
    /* profile files keep 6 significant digits: compare to 1e-4 */
    cr_expect(fabs((t2 - t1) - want) <= 1e-4 * want, "halving attn_tflops added %g ms, expected %g ms",
              t2 - t1, want);
    cr_expect(t1 > 0 && fabs(t1 - t0) > 1e-6 * t0,
              "the calibrated prediction (%g ms) equals the preset's (%g ms)", t1, t0);
    unlink(prof);
    unlink(prof2);
    unlink(plan);
    unlink(plan2);
    unlink(plan_preset);
    rmdir(dir);
}

Test(calibrate, bad_options)
{
    cpc_calibration c;
    cpc_calibrate_options o = {.quick = true, .ranks = 1};
    cpc_status *st = cpc_calibrate(&o, &c, NULL);
    cr_expect(st && st->code == CPC_E_USAGE);
    cpc_status_free(st);
    o = (cpc_calibrate_options){.quick = true, .transport = "nccl"};
    st = cpc_calibrate(&o, &c, NULL);
    cr_expect(st && st->code == CPC_E_USAGE);
    cpc_status_free(st);
}

/* Sharing of cores (cost.h): with `cores`, max(1, ranks per node / cores);
 * without, ranks_per_core; a GPU profile: 1. */
Test(calibrate, core_sharing_model)
{
    cpc_plan *plan = NULL;
    const char *sets[] = {"cluster.world_size=8", "cluster.gpus_per_node=4"};
    const char *text = "version: 1\nmodel: {heads: 8, head_dim: 64}\ninput: {tokens: 1024}\n"
                       "cluster: {world_size: 4, device: cpu}\nparallel: {variant: ulysses}\n";
    cpc_status *st = cpc_plan_load_string(text, strlen(text), "mem.yaml", NULL, 0, &plan);
    cr_assert_not(cpc_status_has_error(st));
    cpc_status_free(st);
    cpc_device_profile d;
    cr_assert(cpc_device_preset("cpu", &d));
    /* the cpu preset is this project's machines: 1.7 effective cores */
    cr_expect_float_eq(cpc_core_sharing(plan, &d), 4.0 / 1.7, 1e-12);
    d.cores = 0; /* a profile without cores */
    cr_expect_float_eq(cpc_core_sharing(plan, &d), 1.0, 1e-12);
    d.ranks_per_core = 3.0;
    cr_expect_float_eq(cpc_core_sharing(plan, &d), 3.0, 1e-12);
    d.cores = 2.0; /* 4 ranks on 2 cores; ranks_per_core no longer used */
    cr_expect_float_eq(cpc_core_sharing(plan, &d), 2.0, 1e-12);
    d.cores = 8.0;
    cr_expect_float_eq(cpc_core_sharing(plan, &d), 1.0, 1e-12);
    cpc_plan_free(plan);
    /* 8 ranks, 4 per node, 1.6 cores per node: 2.5 */
    st = cpc_plan_load_string(text, strlen(text), "mem.yaml", sets, 2, &plan);
    cr_assert_not(cpc_status_has_error(st));
    cpc_status_free(st);
    d.cores = 1.6;
    cr_expect_float_eq(cpc_core_sharing(plan, &d), 2.5, 1e-12);
    cpc_plan_free(plan);
}

/* The whole step uses the calibrated GEMM rate: a profile whose gemm_tflops
 * is halved doubles the dense part of the step prediction (model.parameters;
 * the CPU has no separate host, so the step is the device time), and the
 * step grows by exactly that much. */
Test(calibrate, gemm_rate_scales_the_step)
{
    cpc_calibration c = quick_calibration();
    char dir[] = "/tmp/cpc_calibrate_XXXXXX";
    cr_assert(mkdtemp(dir));
    char prof[256], prof2[256], plan[256], plan2[256];
    snprintf(prof, sizeof prof, "%s/machine.yaml", dir);
    snprintf(prof2, sizeof prof2, "%s/slow_gemm.yaml", dir);
    snprintf(plan, sizeof plan, "%s/plan.yaml", dir);
    snprintf(plan2, sizeof plan2, "%s/plan_slow.yaml", dir);
    cr_assert_null(cpc_profile_write(prof, &c.profile));
    cpc_device_profile slow;
    memset(&slow, 0, sizeof slow);
    cr_assert_null(cpc_profile_read(prof, &slow));
    slow.gemm_tflops *= 0.5;
    cr_assert_null(cpc_profile_write(prof2, &slow));
    const char *body = "model: {heads: 8, head_dim: 64, dtype: bf16, layers: 4, parameters: 50000000}\n"
                       "input: {tokens: 1024, steps: 10}\n"
                       "parallel: {variant: ulysses}\n";
    char text[1024];
    snprintf(text, sizeof text, "version: 1\n%scluster: {world_size: 4, device: cpu, profile: machine.yaml}\n", body);
    write_file(plan, text);
    snprintf(text, sizeof text, "version: 1\n%scluster: {world_size: 4, device: cpu, profile: slow_gemm.yaml}\n", body);
    write_file(plan2, text);
    cpc_compile_opts o = {.until = CPC_UNTIL_VERIFY};
    cpc_compiled a, b;
    cr_assert(cpc_compile_file(plan, &o, &a));
    cr_assert(cpc_compile_file(plan2, &o, &b));
    cr_assert_gt(a.pred.dense_ms_per_step, 0);
    cr_log_info("calibrated: dense %.3f ms of a %.3f ms step; half the GEMM rate: dense %.3f, step %.3f",
                a.pred.dense_ms_per_step, a.pred.ms_per_step, b.pred.dense_ms_per_step, b.pred.ms_per_step);
    /* 6 significant digits in the profile file */
    cr_expect(fabs(b.pred.dense_ms_per_step / a.pred.dense_ms_per_step - 2.0) < 1e-5, "dense x%g",
              b.pred.dense_ms_per_step / a.pred.dense_ms_per_step);
    double grew = b.pred.ms_per_step - a.pred.ms_per_step;
    cr_expect(fabs(grew - a.pred.dense_ms_per_step) < 1e-5 * b.pred.ms_per_step,
              "the step grew by %g ms, the dense part was %g ms", grew, a.pred.dense_ms_per_step);
    cr_expect_float_eq(a.pred.ms_per_image, 10 * a.pred.ms_per_step, 1e-9 * a.pred.ms_per_image);
    /* the dense work by hand: 2 x weights x tokens per rank at the calibrated
     * rate, times the cores' sharing (4 ranks) */
    cpc_plan *p = NULL;
    cpc_status *st = cpc_plan_load_file(plan, NULL, 0, &p);
    cr_assert(p);
    cpc_status_free(st);
    double W = cpc_weights_per_token(p);
    double want = 2.0 * W * 1024 / 4 / (a.device.gemm_tflops * 1e12) * cpc_core_sharing(p, &a.device) * 1e3;
    cr_expect(fabs(a.pred.dense_ms_per_step - want) < 1e-9 * want, "dense %g ms, by hand %g ms",
              a.pred.dense_ms_per_step, want);
    cpc_plan_free(p);
    cpc_compiled_free(&a);
    cpc_compiled_free(&b);
    unlink(prof), unlink(prof2), unlink(plan), unlink(plan2);
    rmdir(dir);
}
