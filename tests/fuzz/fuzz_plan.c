/*
 * fuzz_plan.c - libFuzzer target for the plan-file front end
 * (cpc_plan_load_string: YAML tree, --set overrides, every CP1xx rule).
 *
 * Input layout: the bytes up to the first NUL are the plan file; the bytes
 * after it, split at further NULs, are `--set KEY=VALUE` arguments (at most
 * 8), so that the override path is fuzzed too.  Plain YAML seeds (no NUL)
 * exercise the file alone.
 *
 * Invariants checked (abort on violation, so libFuzzer reports them):
 *   - a plan is returned exactly when the chain holds no error;
 *   - every plan-rule diagnostic has a file and a position;
 *   - a returned plan respects the ranges of SPEC section 1;
 *   - the validator (every CP0xx rule, selection, hints) returns a selection
 *     exactly when it reports no error, and its diagnostics carry rule codes;
 *   - for small meshes (world_size <= 16), every valid candidate's schedule
 *     builds and the verifier proves it (a CP051 here is a scheduler bug).
 * Leaks and memory errors are found by ASan (the build adds
 * -fsanitize=fuzzer,address,undefined).
 *
 * Build: cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCPC_FUZZ=ON
 *        cmake --build build-fuzz --target fuzz_plan
 * Run:   ./build-fuzz/fuzz_plan -max_total_time=60 -dict=tests/fuzz/fuzz_plan.dict NEW_DIR \
 *            tests/fuzz/corpus   (new inputs go to NEW_DIR; the seeds stay as they are)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_load.h"
#include "schedule.h"
#include "validate.h"
#include "verify.h"

#define MAX_SETS 8

static void check(bool ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t text_len = nul ? (size_t)(nul - data) : size;

    /* --set arguments: NUL-terminated copies of the pieces after the first NUL */
    char *args = NULL;
    const char *sets[MAX_SETS];
    int n_sets = 0;
    if (nul) {
        size_t rest = size - text_len - 1;
        args = malloc(rest + 1);
        if (!args)
            return 0;
        memcpy(args, nul + 1, rest);
        args[rest] = 0;
        char *p = args;
        char *end = args + rest;
        while (p <= end && n_sets < MAX_SETS) {
            sets[n_sets++] = p;
            p += strlen(p) + 1;
        }
    }

    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_string(text, text_len, "fuzz.yaml", sets, n_sets, &plan);
    check((plan != NULL) == !cpc_status_has_error(st));
    for (const cpc_status *d = st; d; d = d->next) {
        check(d->message != NULL);
        if (d->code == CPC_E_PLAN && d->rule != 0)
            check(d->span.file != NULL && d->span.line > 0 && d->span.col > 0);
    }
    if (plan) {
        check(plan->version == 1);
        check(plan->model.heads >= 1 && plan->model.heads <= 65536);
        check(plan->model.kv_heads >= 1 && plan->model.kv_heads <= 65536);
        check(plan->model.head_dim >= 1 && plan->model.head_dim <= 256);
        check(plan->model.scale > 0);
        check(plan->cluster.world_size >= 1 && plan->cluster.world_size <= (1 << 20));
        check(plan->cluster.gpus_per_node >= 1);
        check(plan->input.n_segments >= 1 && plan->input.n_segments <= 64);
        int64_t total = 0;
        for (int i = 0; i < plan->input.n_segments; i++) {
            check(plan->input.segments[i].tokens >= 1 &&
                  plan->input.segments[i].tokens <= INT32_MAX);
            check(plan->input.segments[i].name && plan->input.segments[i].name[0]);
            total += plan->input.segments[i].tokens;
        }
        check(total == plan->input.total_tokens);
        check(plan->name && plan->cluster.device);
        for (int i = 0; i < plan->n_key_spans; i++) {
            cpc_span s = cpc_plan_span(plan, plan->key_spans[i].key, true);
            check(s.line > 0);
        }

        cpc_selection sel;
        cpc_status *vs = cpc_validate(plan, &sel);
        bool verr = cpc_status_has_error(vs);
        check(verr == (sel.selected < 0));
        for (const cpc_status *d = vs; d; d = d->next)
            check(d->code != CPC_E_PLAN || d->severity != CPC_SEV_ERROR || d->rule > 0);
        if (plan->cluster.world_size <= 16 && plan->input.total_tokens <= 1 << 16) {
            for (int i = 0; i < sel.n_candidates; i++) {
                const cpc_candidate *c = &sel.candidates[i];
                if (!c->ok)
                    continue;
                cpc_program *prog = NULL;
                cpc_status *ss = cpc_schedule_build(plan, c->variant, c->ring_degree,
                                                    c->ulysses_degree, &prog);
                check(ss == NULL && prog != NULL);
                cpc_status *ps = cpc_verify(prog);
                check(!cpc_status_has_error(ps));
                cpc_status_free(ps);
                cpc_program_free(prog);
            }
        }
        cpc_status_free(vs);
        cpc_selection_free(&sel);
    }
    cpc_status_free(st);
    cpc_plan_free(plan);
    free(args);
    return 0;
}
