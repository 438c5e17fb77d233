/*
 * test_bwd_program.h - the backward (training) program cpc builds for a
 * small plan, for the backward prover's tests (test_verify_bwd.c,
 * test_verify_attack.c).  Header-only (static functions): tests only.
 */
#ifndef CPC_TEST_BWD_PROGRAM_H
#define CPC_TEST_BWD_PROGRAM_H

#include <stdio.h>
#include <string.h>

#include "plan_load.h"
#include "program.h"
#include "schedule_bwd.h"

/* The training plan behind test_bwd_program (the arguments as there):
 * `variant` on R x U ranks, H query and Hkv K/V heads of head_dim 8, fp32,
 * `tokens` sharded tokens (rep > 0: a text segment of rep tokens before
 * them, held whole by every rank: `split: replicate`), `mask` (none /
 * causal / key_padding), schedule.rotate `rotate`.  Returns the
 * plan (caller frees with cpc_plan_free), or NULL with *err (caller frees). */
static inline cpc_plan *test_train_plan(const char *variant, int R, int U, int H, int Hkv, int tokens,
                                        const char *mask, const char *rotate, int rep, cpc_status **err)
{
    char y[900], tk[160];
    *err = NULL;
    if (rep > 0)
        snprintf(tk, sizeof tk, "segments: [{name: text, tokens: %d, split: replicate}, {name: image, tokens: %d}]",
                 rep, tokens);
    else
        snprintf(tk, sizeof tk, "tokens: %d", tokens);
    snprintf(y, sizeof y,
             "version: 1\nname: t\nmodel: {heads: %d, kv_heads: %d, head_dim: 8, dtype: fp32}\n"
             "input: {batch: 1, %s, mask: %s, mode: training}\ncluster: {world_size: %d}\n"
             "parallel: {variant: %s, ring_degree: %d, ulysses_degree: %d}\nschedule: {rotate: %s}\n",
             H, Hkv, tk, mask, R * U, variant, R, U, rotate);
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_string(y, strlen(y), "t.yaml", NULL, 0, &plan);
    if (cpc_status_has_error(st) || !plan) {
        cpc_plan_free(plan);
        *err = st ? st : cpc_error(CPC_E_INTERNAL, "plan: not loaded");
        return NULL;
    }
    cpc_status_free(st);
    return plan;
}

/* The backward program of a training plan (test_train_plan's arguments; v:
 * `variant` as enum).  Returns the program (caller frees with
 * cpc_program_free), or NULL with *err (caller frees) when the plan does not
 * load or the planner refuses the geometry. */
static inline cpc_program *test_bwd_program(const char *variant, cpc_variant v, int R, int U, int H, int Hkv,
                                            int tokens, const char *mask, const char *rotate, int rep,
                                            cpc_status **err)
{
    cpc_plan *plan = test_train_plan(variant, R, U, H, Hkv, tokens, mask, rotate, rep, err);
    if (!plan)
        return NULL;
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build_backward(plan, v, R, U, &prog);
    cpc_plan_free(plan);
    if (st) {
        *err = st;
        return NULL;
    }
    return prog;
}

#endif
