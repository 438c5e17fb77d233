/*
 * cprun.c - `cprun`, the runtime's command line (SPEC section 5): a thin
 * layer over libcpc's public API (cpc/session.h; it includes nothing else
 * of cpc).
 *
 * Exit status: 0 ok; 1 check failed; 2 usage or input error (bad option,
 * unreadable file, bad tensors, a plan cpc would reject, a training plan:
 * CP018, contradicting options such as --attention cudnn with --backend
 * cpu); 3 runtime failure (device, collective, out of memory, a feature this
 * build or machine lacks: --backend cuda without the CUDA toolkit or
 * without a GPU and driver, --transport nccl).  Diagnostics go to stderr,
 * the report to stdout; with --format json stdout always gets one JSON
 * object, the report or cpc_report_failure_json (report.h).  Where results
 * go (--output, --trace, --output-shards, --profile-out) is checked before
 * anything runs; a failed write, also of stdout, is exit status 2.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include <cpc/cpc.h>
#include <cpc/tool.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cprun PLAN.cplan|PLAN.yaml [options]\n"
            "  --backend auto|cpu|cuda         compute backend (auto: cuda when a GPU and driver are\n"
            "                                  present, else cpu; --verbose says which).  cuda: rank r\n"
            "                                  on GPU r mod visible GPUs (virtual ranks share a GPU);\n"
            "                                  under mpirun GPU = local rank; kernels from the .cplan,\n"
            "                                  or compiled with NVRTC for a plan YAML\n"
            "  --attention auto|cpu|cudnn|nvrtc attention path: cpu (CPU backend); cuda backend: auto\n"
            "                                  (cuDNN SDPA where it serves a block, else the generated\n"
            "                                  kernel), cudnn (cuDNN must work), nvrtc (generated only)\n"
            "  --transport auto|local|mpi|nccl  auto: under mpirun/srun nccl (cuda) or mpi (cpu),\n"
            "                                  else local threads; nccl: one process per GPU\n"
            "  --input QKV.safetensors         q, k, v (and mask) in global BSHD\n"
            "  --seed N                        random normal inputs (default 0)\n"
            "  --output OUT.safetensors        gathered `out` (and `lse` with --lse)\n"
            "  --output-shards DIR             each rank writes DIR/rankN.safetensors\n"
            "  --lse                           also write the LSE [B, H, S] fp32\n"
            "  --check / --no-check            compare with the float64 reference (default: check)\n"
            "  --check-rows N                  rows per (batch, head) when the check samples (default 64)\n"
            "  --warmup N --iters N            timing (defaults 1 and 5)\n"
            "  --trace FILE.json               Chrome trace-event JSON (one track per rank)\n"
            "  --format text|json              the report; json: one object on stdout, also when the\n"
            "                                  run fails (\"ok\": false, the report's keys null where\n"
            "                                  unknown, \"error\": {\"code\": CP code or error class,\n"
            "                                  \"class\", \"message\", \"exit_status\"})\n"
            "  --dry-run                       load and verify, print each rank's buffers and peak memory\n"
            "  --set KEY=VALUE                 override a plan key (YAML plans), repeatable\n"
            "  --timeout SECONDS               stall limit of every wait, every transport: a receive,\n"
            "                                  collective or barrier waiting longer ends the job (exit 3,\n"
            "                                  naming the rank and the op).  Default: local threads 3600;\n"
            "                                  MPI max(300, 20 x the predicted time of all iterations)\n"
            "  --calibrate                     measure this machine (attention rate, memory, copy and\n"
            "                                  collective bandwidth and latency, how ranks share cores)\n"
            "                                  with the CPU backend and --transport (local threads, or\n"
            "                                  mpi under mpirun) and print a cluster profile YAML for\n"
            "                                  a plan's `cluster.profile` (no PLAN argument)\n"
            "  --tune                          run every valid candidate of PLAN (each variant and\n"
            "                                  R x U) briefly (--warmup, default 1; --iters, default 3)\n"
            "                                  on the plan's backend (cpu for cluster.device cpu) and\n"
            "                                  write the plan's profile with the measured ms per layer\n"
            "                                  (key `measured`): `auto` then picks by measurement and\n"
            "                                  cpc --explain shows them.  Default destination: the\n"
            "                                  plan's cluster.profile, else stdout\n"
            "  --profile-out FILE              with --calibrate or --tune: write the profile to FILE\n"
            "  --quick                         with --calibrate: small problems (well under 1 s, less exact)\n"
            "  --calibrate-ranks N             with --calibrate: local rank threads that share the cores\n"
            "                                  (default 4)\n"
            "  --verbose                       progress messages on stderr\n"
            "  --version | --help\n"
            "exit status: 0 ok, 1 check failed, 2 usage or input error, 3 runtime failure\n");
}

/* --format json: whatever happens, stdout gets one JSON object (the report,
 * or cpc_report_failure_json).  Set from the command line before parsing,
 * so a usage error before --format is answered in JSON too. */
static bool g_json;
static bool g_json_printed;

/* Under a launcher only world rank 0 prints the failure object (the
 * launcher merges every rank's stdout). */
static bool launcher_rank0(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return strcmp(v, "0") == 0;
    }
    return true;
}

/* With --format json: prints the failure object (once) for diagnostics `st`
 * (or `message` when st is NULL), with what is known of the job. */
static void json_failure(const cpc_job *job, const cpc_status *st, const char *message, int exit_status)
{
    if (!g_json || g_json_printed || !launcher_rank0())
        return;
    char *s = cpc_report_failure_json(job ? cpc_job_variant(job) : NULL,
                                      job ? cpc_job_ring_degree(job) : 0,
                                      job ? cpc_job_ulysses_degree(job) : 0,
                                      job ? cpc_job_world_size(job) : 0, st, message, exit_status);
    if (s) {
        printf("%s\n", s);
        free(s);
    }
    g_json_printed = true;
}

/* cpc_job_options.before_abort: an MPI job failing during setup is aborted
 * inside cpc_job_execute, so the JSON failure object is printed from here. */
static void json_before_abort(void *ctx, const cpc_status *st, int exit_status)
{
    json_failure(ctx, st, NULL, exit_status);
    fflush(stdout);
}

static int usage_error(const char *fmt, const char *arg)
{
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, arg);
    fprintf(stderr, "cprun: error: %s\n(see cprun --help)\n", msg);
    if (g_json) {
        char full[1100];
        snprintf(full, sizeof full, "cprun: error: %s", msg);
        json_failure(NULL, NULL, full, 2);
    }
    return 2;
}

/* Standard output carries the report: a failure to write it (a full disk,
 * a closed pipe) is an I/O error (2), never a success. */
static int finish_stdout(int rc)
{
    errno = 0;
    int e = fflush(stdout) != 0 ? errno : 0;
    if (!e && !ferror(stdout))
        return rc;
    fprintf(stderr, "cprun: error: cannot write to standard output: %s\n", strerror(e ? e : EIO));
    return rc > 2 ? rc : 2;
}

static bool parse_int(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Exit status of a failure chain: a plan rejection is 2 for cprun. */
static int exit_of(const cpc_status *st)
{
    int worst = 0;
    for (; st; st = cpc_status_next(st)) {
        if (cpc_status_severity(st) != CPC_SEV_ERROR)
            continue;
        cpc_code code = cpc_status_code(st);
        int e = code == CPC_E_PLAN ? 2 : code == CPC_E_CHECK ? 1 : cpc_status_exit_code(st);
        if (e == 0)
            e = 3;
        if (e > worst)
            worst = e;
    }
    return worst;
}

/* cprun --calibrate: measures, prints the measurements on stderr and the
 * profile YAML on stdout (or writes it to `out`). */
static int run_calibrate(bool quick, int ranks, cpc_transport_kind transport, const char *out)
{
    if (transport == CPC_TRANSPORT_NCCL) {
        fprintf(stderr, "cprun: error: --calibrate measures the CPU backend: --transport auto, local or mpi\n");
        return 2;
    }
    if (out && strcmp(out, "-") != 0) {
        /* before measuring: a path that cannot be written fails now */
        cpc_status *wst = cpc_check_writable_file("--profile-out", out);
        if (wst) {
            cpc_status_print(wst, stderr, "cprun");
            cpc_status_free(wst);
            return 2;
        }
    }
    bool root = true;
    /* written atomically: a failed write leaves the previous profile */
    cpc_status *st = cpc_calibrate_profile(quick, ranks, transport, stderr, out ? out : "-", &root);
    if (st) {
        cpc_status_print(st, stderr, "cprun");
        int rc = exit_of(st);
        cpc_status_free(st);
        return rc ? rc : 3;
    }
    if (root && out)
        fprintf(stderr, "cprun --calibrate: profile written to %s (use it with cluster.profile: %s)\n",
                out, out);
    return 0;
}

/* cprun --tune: measures every valid candidate (one line each on stderr)
 * and writes the profile with the measurements. */
static int run_tune(const char *path, const char **sets, int n_sets, int warmup, int iters,
                    cpc_transport_kind transport, double timeout_s, const char *out)
{
    if (transport == CPC_TRANSPORT_NCCL) {
        fprintf(stderr, "cprun: error: --tune runs over --transport auto, local or mpi\n");
        return 2;
    }
    if (out && strcmp(out, "-") != 0) {
        /* before measuring: a path that cannot be written fails now */
        cpc_status *wst = cpc_check_writable_file("--profile-out", out);
        if (wst) {
            cpc_status_print(wst, stderr, "cprun");
            cpc_status_free(wst);
            return 2;
        }
    }
    bool root = true;
    char *written = NULL;
    cpc_status *st = cpc_tune_profile(path, sets, n_sets, warmup, iters, transport, timeout_s,
                                      stderr, out, &written, &root);
    if (st) {
        cpc_status_print(st, stderr, "cprun");
        int rc = exit_of(st);
        cpc_status_free(st);
        free(written);
        return rc ? rc : 3;
    }
    if (root && written && strcmp(written, "-") != 0)
        fprintf(stderr, "cprun --tune: profile with the measurements written to %s (plans whose "
                        "cluster.profile names it select by them)\n", written);
    free(written);
    return 0;
}

/* Command-line names of the enums, in enum order. */
static const char *const BACKENDS[] = {"auto", "cpu", "cuda", NULL};
static const char *const ATTENTIONS[] = {"auto", "cpu", "cudnn", "nvrtc", NULL};
static const char *const TRANSPORTS[] = {"auto", "local", "mpi", "nccl", NULL};

static bool pick(const char *s, const char *const *names, int *out)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return true;
        }
    return false;
}

enum {
    OPT_BACKEND = 1000, OPT_ATTENTION, OPT_TRANSPORT, OPT_INPUT, OPT_SEED, OPT_OUTPUT,
    OPT_SHARDS, OPT_LSE, OPT_CHECK, OPT_NO_CHECK, OPT_CHECK_ROWS, OPT_WARMUP, OPT_ITERS,
    OPT_TRACE, OPT_FORMAT, OPT_DRY_RUN, OPT_SET, OPT_TIMEOUT, OPT_CALIBRATE, OPT_VERBOSE,
    OPT_VERSION, OPT_HELP, OPT_PROFILE_OUT, OPT_QUICK, OPT_CAL_RANKS, OPT_TUNE,
};

/* The command line; `sets` has room for argc entries (owned by main). */
static int cprun_main(int argc, char **argv, const char **sets)
{
    static const struct option longopts[] = {
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"attention", required_argument, NULL, OPT_ATTENTION},
        {"transport", required_argument, NULL, OPT_TRANSPORT},
        {"input", required_argument, NULL, OPT_INPUT},
        {"seed", required_argument, NULL, OPT_SEED},
        {"output", required_argument, NULL, OPT_OUTPUT},
        {"output-shards", required_argument, NULL, OPT_SHARDS},
        {"lse", no_argument, NULL, OPT_LSE},
        {"check", no_argument, NULL, OPT_CHECK},
        {"no-check", no_argument, NULL, OPT_NO_CHECK},
        {"check-rows", required_argument, NULL, OPT_CHECK_ROWS},
        {"warmup", required_argument, NULL, OPT_WARMUP},
        {"iters", required_argument, NULL, OPT_ITERS},
        {"trace", required_argument, NULL, OPT_TRACE},
        {"format", required_argument, NULL, OPT_FORMAT},
        {"dry-run", no_argument, NULL, OPT_DRY_RUN},
        {"set", required_argument, NULL, OPT_SET},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"calibrate", no_argument, NULL, OPT_CALIBRATE},
        {"tune", no_argument, NULL, OPT_TUNE},
        {"profile-out", required_argument, NULL, OPT_PROFILE_OUT},
        {"quick", no_argument, NULL, OPT_QUICK},
        {"calibrate-ranks", required_argument, NULL, OPT_CAL_RANKS},
        {"verbose", no_argument, NULL, OPT_VERBOSE},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    cpc_job_options opt;
    cpc_job_options_init(&opt, sizeof opt);
    bool json = false, dry = false, calibrate = false, quick = false, tune = false;
    bool warmup_given = false, iters_given = false;
    const char *profile_out = NULL;
    int cal_ranks = 0;
    int n_sets = 0;
    int c;
    long long v;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_BACKEND:
            if (!pick(optarg, BACKENDS, (int *)&opt.backend))
                return usage_error("--backend %s: expected auto, cpu or cuda", optarg);
            break;
        case OPT_ATTENTION:
            if (!pick(optarg, ATTENTIONS, (int *)&opt.attention))
                return usage_error("--attention %s: expected auto, cpu, cudnn or nvrtc", optarg);
            break;
        case OPT_TRANSPORT:
            if (!pick(optarg, TRANSPORTS, (int *)&opt.transport))
                return usage_error("--transport %s: expected auto, local, mpi or nccl", optarg);
            break;
        case OPT_INPUT: opt.input_path = optarg; break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            if (!*optarg || *optarg == '-')
                return usage_error("--seed %s: expected a non-negative integer", optarg);
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || *end)
                return usage_error("--seed %s: expected a non-negative integer", optarg);
            opt.seed = s;
            break;
        }
        case OPT_OUTPUT: opt.output_path = optarg; break;
        case OPT_SHARDS: opt.output_shards_dir = optarg; break;
        case OPT_LSE: opt.write_lse = true; break;
        case OPT_CHECK: opt.check = true; break;
        case OPT_NO_CHECK: opt.check = false; break;
        case OPT_CHECK_ROWS:
            if (!parse_int(optarg, 1, 1LL << 31, &v))
                return usage_error("--check-rows %s: expected a positive integer", optarg);
            opt.check_rows = v;
            break;
        case OPT_WARMUP:
            if (!parse_int(optarg, 0, 1000000, &v))
                return usage_error("--warmup %s: expected an integer >= 0", optarg);
            opt.warmup = (int)v;
            warmup_given = true;
            break;
        case OPT_ITERS:
            if (!parse_int(optarg, 1, 1000000, &v))
                return usage_error("--iters %s: expected an integer >= 1", optarg);
            opt.iters = (int)v;
            iters_given = true;
            break;
        case OPT_TRACE: opt.trace_path = optarg; break;
        case OPT_FORMAT:
            if (strcmp(optarg, "text") == 0)
                json = false;
            else if (strcmp(optarg, "json") == 0)
                json = true;
            else
                return usage_error("--format %s: expected text or json", optarg);
            break;
        case OPT_DRY_RUN: dry = true; break;
        case OPT_SET: sets[n_sets++] = optarg; break;
        case OPT_TIMEOUT: {
            char *end;
            errno = 0;
            double t = strtod(optarg, &end);
            if (errno || *end || !(t > 0))
                return usage_error("--timeout %s: expected a positive number of seconds", optarg);
            opt.timeout_s = t;
            break;
        }
        case OPT_CALIBRATE: calibrate = true; break;
        case OPT_TUNE: tune = true; break;
        case OPT_PROFILE_OUT: profile_out = optarg; break;
        case OPT_QUICK: quick = true; break;
        case OPT_CAL_RANKS:
            if (!parse_int(optarg, 2, 64, &v))
                return usage_error("--calibrate-ranks %s: expected an integer 2..64", optarg);
            cal_ranks = (int)v;
            break;
        case OPT_VERBOSE: opt.log = stderr; break;
        case OPT_VERSION:
            printf("cprun %s\n", cpc_version());
            return 0;
        case OPT_HELP:
            usage(stdout);
            return 0;
        case '?':
        default:
            if (optopt)
                return usage_error("option needs a value or is unknown: -%c", (char[]){(char)optopt, 0});
            return usage_error("unknown option or missing value: %s", argv[optind - 1]);
        }
    }
    if (calibrate && tune)
        return usage_error("%s", "--calibrate and --tune: one at a time");
    if (tune) {
        if (opt.backend != CPC_BACKEND_AUTO || opt.attention != CPC_ATTENTION_AUTO || json || dry ||
            quick || cal_ranks || opt.input_path || opt.output_path || opt.output_shards_dir ||
            opt.trace_path)
            return usage_error("%s", "--tune takes a plan and --set, --warmup, --iters, --transport, "
                                     "--timeout, --profile-out, --verbose only (the backend is the "
                                     "plan's: cpu for cluster.device cpu)");
        if (optind >= argc)
            return usage_error("%s", "--tune needs a plan: cprun --tune PLAN.yaml");
        if (optind + 1 < argc)
            return usage_error("one plan at a time (extra argument '%s')", argv[optind + 1]);
        return run_tune(argv[optind], sets, n_sets, warmup_given ? opt.warmup : 1,
                        iters_given ? opt.iters : 3, opt.transport, opt.timeout_s, profile_out);
    }
    if (calibrate) {
        if (opt.backend == CPC_BACKEND_CUDA || opt.attention == CPC_ATTENTION_CUDNN ||
            opt.attention == CPC_ATTENTION_NVRTC)
            return usage_error("%s", "--calibrate measures the CPU backend: --backend auto or cpu, --attention auto or cpu");
        if (optind < argc)
            return usage_error("--calibrate takes no plan (extra argument '%s')", argv[optind]);
        return run_calibrate(quick, cal_ranks, opt.transport, profile_out);
    }
    if (quick || profile_out || cal_ranks)
        return usage_error("%s", "--quick, --profile-out and --calibrate-ranks go with --calibrate");
    if (opt.write_lse && !opt.output_path)
        return usage_error("%s", "--lse writes the LSE into --output: give --output OUT.safetensors");
    if (optind >= argc)
        return usage_error("%s", "no plan given: cprun PLAN.cplan|PLAN.yaml [options]");
    if (optind + 1 < argc)
        return usage_error("one plan at a time (extra argument '%s')", argv[optind + 1]);
    const char *path = argv[optind];

    /* where the results go: checked before the plan is compiled and run */
    if (!dry) {
        cpc_status *ost = cpc_job_check_outputs(&opt, path);
        if (ost) {
            cpc_status_print(ost, stderr, "cprun");
            int e = exit_of(ost);
            json_failure(NULL, ost, NULL, e ? e : 2);
            cpc_status_free(ost);
            return e ? e : 2;
        }
    }

    cpc_job *job = NULL;
    cpc_status *diags = NULL;
    cpc_status *err = cpc_job_new(path, sets, n_sets, &job, &diags);
    cpc_status_print(diags, stderr, "cprun");
    cpc_status_free(diags);
    if (err) {
        cpc_status_print(err, stderr, "cprun");
        int e = exit_of(err);
        json_failure(NULL, err, path, e ? e : 2);
        cpc_status_free(err);
        return e ? e : 2;
    }

    if (dry) {
        int rc = 0;
        if (json) {
            int64_t peak = 0;
            cpc_status *st = cpc_job_peak_memory(job, &peak);
            if (st) {
                cpc_status_print(st, stderr, "cprun");
                rc = exit_of(st);
                json_failure(job, st, NULL, rc);
                cpc_status_free(st);
            } else {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddBoolToObject(o, "ok", true);
                cJSON_AddBoolToObject(o, "dry_run", true);
                cJSON_AddStringToObject(o, "variant", cpc_job_variant(job));
                cJSON_AddNumberToObject(o, "ring_degree", cpc_job_ring_degree(job));
                cJSON_AddNumberToObject(o, "ulysses_degree", cpc_job_ulysses_degree(job));
                cJSON_AddNumberToObject(o, "ranks", cpc_job_world_size(job));
                cJSON_AddNumberToObject(o, "peak_memory_bytes_per_rank", (double)peak);
                char *s = cJSON_PrintUnformatted(o);
                if (s)
                    printf("%s\n", s);
                free(s);
                cJSON_Delete(o);
            }
        } else {
            cpc_status *st = cpc_job_dry_run(job, stdout, 64);
            if (st) {
                cpc_status_print(st, stderr, "cprun");
                rc = exit_of(st);
                cpc_status_free(st);
            }
        }
        cpc_job_free(job);
        return rc;
    }

    cpc_run_report *rep = NULL;
    bool root = true;
    opt.before_abort = json_before_abort;
    opt.before_abort_ctx = job;
    cpc_status *st = cpc_job_execute(job, &opt, &rep, &root);
    int rc;
    if (st) {
        cpc_status_print(st, stderr, "cprun");
        rc = exit_of(st);
        json_failure(job, st, NULL, rc ? rc : 3);
        cpc_status_free(st);
    } else if (!root) {
        rc = 0;
    } else {
        if (json) {
            cpc_status *e = cpc_run_report_print_json(rep, stdout);
            g_json_printed = true;
            cpc_status_free(e); /* a write error: finish_stdout reports it */
        } else {
            cpc_run_report_print_text(rep, stdout);
        }
        rc = cpc_run_report_ok(rep) ? 0 : 1;
        char *why = cpc_run_report_failure(rep);
        if (why)
            fprintf(stderr, "cprun: error: check failed: %s\n", why);
        free(why);
    }
    cpc_run_report_free(rep);
    cpc_job_free(job);
    return rc;
}

/* Issue 23: OpenBLAS (pthread build) starts its worker threads when the
 * library is loaded, before main(); under a finite RLIMIT_AS / RLIMIT_DATA
 * (ulimit -v / -d) a worker whose buffer cannot be mapped retries forever,
 * and exit() joins it: even `cprun --version` never ended.  So, first thing
 * in main(): when such a limit is set and OPENBLAS_NUM_THREADS is not 1,
 * set OPENBLAS_NUM_THREADS=1 (ranks run BLAS on one thread anyway) and
 * CPC_BLAS_REEXEC=1 and re-execute /proc/self/exe with the same argv, so
 * that no worker thread exists.  Nothing happens without a limit, after the
 * re-exec, or when exec fails. */
static void blas_single_thread_reexec(char **argv)
{
    if (!argv || !argv[0] || getenv("CPC_BLAS_REEXEC"))
        return; /* already done: never a loop */
    const char *e = getenv("OPENBLAS_NUM_THREADS");
    if (e && strcmp(e, "1") == 0)
        return;
    struct rlimit as, ds;
    bool limited = (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) ||
                   (getrlimit(RLIMIT_DATA, &ds) == 0 && ds.rlim_cur != RLIM_INFINITY);
    if (!limited || setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0 || setenv("CPC_BLAS_REEXEC", "1", 1) != 0)
        return;
    execv("/proc/self/exe", argv);
}

int main(int argc, char **argv)
{
    blas_single_thread_reexec(argv);
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) {
        fprintf(stderr, "cprun: error: out of memory\n");
        return 3;
    }
    /* --format json given anywhere (also after a bad option) */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--format") == 0)
            g_json = strcmp(argv[i + 1], "json") == 0;
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--format=", 9) == 0)
            g_json = strcmp(argv[i] + 9, "json") == 0;
    int rc = cprun_main(argc, argv, sets);
    free(sets);
    return finish_stdout(rc);
}
