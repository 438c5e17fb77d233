/*
 * test_bwd_program.h - the backward (training) program cpc builds for a
 * small plan, for the backward prover's tests (test_verify_bwd.c,
 * test_verify_attack.c, test_verify_attack_u.c), a run of such a program on
 * the CPU executor, an edit of an artifact's backward_schedule text and
 * its content hash recomputed.  Header-only (static functions): tests only.
 */
#ifndef CPC_TEST_BWD_PROGRAM_H
#define CPC_TEST_BWD_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "plan_load.h"
#include "program.h"
#include "run.h"
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

/* Runs backward program `bwd` (copied) in place of the one cpc builds, after
 * the forward of the training plan of test_train_plan's arguments (v: the
 * variant as enum), once, on R*U rank threads over the local transport with
 * the CPU backend, on fresh random inputs from `seed` (the job layer's
 * Philox streams), checked against the float64 reference (run.h
 * cpc_job_run; fp32: 1e-5), a stalled rank failing after timeout_s.  The
 * program is not proven again: this is a prover's verdict against the
 * numbers.  Returns the run's error (caller frees), or NULL with *rep
 * filled (caller clears with cpc_run_report_clear; zeroed first). */
static inline cpc_status *test_bwd_run(const char *variant, cpc_variant v, int R, int U, int H, int Hkv, int tokens,
                                       const char *mask, const char *rotate, int rep, const cpc_program *bwd,
                                       uint64_t seed, double timeout_s, cpc_run_report *out)
{
    cpc_status *st = NULL;
    memset(out, 0, sizeof *out);
    cpc_plan *plan = test_train_plan(variant, R, U, H, Hkv, tokens, mask, rotate, rep, &st);
    if (!plan)
        return st;
    cpc_job *job = NULL;
    st = cpc_job_from_plan(plan, v, R, U, &job);
    if (!job || cpc_status_has_error(st)) {
        cpc_job_free(job);
        cpc_plan_free(plan);
        return st ? st : cpc_error(CPC_E_INTERNAL, "job: not made");
    }
    cpc_status_free(st);
    cpc_program_free(job->bwd);
    job->bwd = NULL;
    if ((st = cpc_program_clone(bwd, &job->bwd))) {
        cpc_job_free(job);
        cpc_plan_free(plan);
        return st;
    }
    cpc_run_options o;
    cpc_run_options_default(&o);
    o.backend = "cpu";
    o.transport = "local";
    o.seed = seed;
    o.warmup = 0;
    o.iters = 1;
    o.timeout_s = timeout_s;
    st = cpc_job_run(job, &o, out, NULL);
    cpc_job_free(job);
    cpc_plan_free(plan);
    return st;
}

/* Replaces the first `from` in artifact text *t's backward_schedule by `to`
 * (*t realloc'd); false when the text has no backward_schedule or no `from`
 * there, or out of memory (*t unchanged). */
static inline bool test_bwd_text_replace(char **t, const char *from, const char *to)
{
    char *bwd = strstr(*t, "\nbackward_schedule:\n");
    char *at = bwd ? strstr(bwd, from) : NULL;
    if (!at)
        return false;
    size_t pre = (size_t)(at - *t), fl = strlen(from), tl = strlen(to), n = strlen(*t);
    char *x = malloc(n - fl + tl + 1);
    if (!x)
        return false;
    memcpy(x, *t, pre);
    memcpy(x + pre, to, tl);
    memcpy(x + pre + tl, at + fl, n - pre - fl + 1);
    free(*t);
    *t = x;
    return true;
}

/* Recomputes the content hash of an edited artifact text t (NUL-terminated,
 * edited in place), as a careful hand editor would: the hash is SHA-256 of
 * the text with its 64 hex digits zeroed.  False when t has no
 * "content_hash: sha256:" field or the digest fails. */
static inline bool test_rehash(char *t)
{
    char *h = strstr(t, "content_hash: sha256:");
    if (!h)
        return false;
    h += strlen("content_hash: sha256:");
    memset(h, '0', 64);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_Digest(t, strlen(t), md, &n, EVP_sha256(), NULL) != 1 || n < 32)
        return false;
    for (unsigned i = 0; i < 32; i++) {
        char two[3];
        snprintf(two, sizeof two, "%02x", md[i]);
        memcpy(h + 2 * i, two, 2);
    }
    return true;
}

#endif
