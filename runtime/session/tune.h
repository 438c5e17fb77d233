/*
 * tune.h - `cprun --tune PLAN` (issue 15, "choice by measurement"): runs
 * every valid candidate of a plan briefly on this machine and returns the
 * plan's profile with the measured times added, so that `variant: auto`
 * (and `fallback: auto`) pick by measurement (cost.h MEASURED TIMES).
 *
 * What runs.  The plan YAML (with its --set overrides) is loaded and
 * validated as `cpc --explain` does (compile.h, CPC_UNTIL_VALIDATE: every
 * candidate priced); each candidate that validation accepts, in list order
 * (every variant and R x U factorisation), is scheduled, proved
 * (cpc_job_from_plan: the built-in schedule; a schedule.script is not
 * applied) and run with the job layer (run.h) on the backend whose
 * measurements the plan uses (cpc_measure_backend: cpu for cluster.device
 * cpu, else cuda), random inputs, no reference check, `warmup` + `iters`
 * iterations; its time is the report's ms_per_iter (median over the timed
 * iterations of the slowest rank: one attention layer).  Under an MPI
 * launcher every process runs the same candidates in the same order (the
 * list is a pure function of the plan) and world rank 0 gets the result.
 *
 * The profile.  The plan's own: its cluster.device preset overridden by its
 * cluster.profile file (not by cluster.memory_gb, which is the plan's), with
 * that file's measurements; this run's measurements are merged in
 * (replacing those with the same key, candidate and backend).
 *
 * Thread-safety: one tune at a time per process (it starts rank threads).
 */
#ifndef CPC_TUNE_H
#define CPC_TUNE_H

#include <stdbool.h>
#include <stdio.h>

#include "cost.h"
#include "status.h"

typedef struct cpc_tune_options {
    const char *const *sets;   /* --set KEY=VALUE overrides of the plan */
    int n_sets;
    const char *transport;     /* "auto" (NULL), "local" or "mpi" */
    int warmup, iters;         /* per candidate; 0: 1 and 3 */
    double timeout_s;          /* stall limit of every wait (run.h); 0: default */
    FILE *log;                 /* one line per candidate, or NULL */
    const char *profile_out;   /* where the caller writes the profile ("-": stdout);
                                  NULL: the plan's cluster.profile.  A cluster.profile file
                                  that does not exist yet is the preset alone when
                                  it is this file (tuning creates it), else
                                  CPC_E_IO */
} cpc_tune_options;

/* One candidate this run measured. */
typedef struct cpc_tune_entry {
    cpc_variant variant;
    int ring_degree, ulysses_degree;
    int cfg_degree, tp_degree;     /* the candidate's outer axes (1 when unsplit) */
    double ms_per_layer;           /* measured */
    double predicted_ms_per_layer; /* the cost model's (without measurements) */
} cpc_tune_entry;

typedef struct cpc_tune_result {
    cpc_device_profile profile;    /* the plan's profile (see above) */
    cpc_measurements measured;     /* its measurements merged with this run's (owned) */
    int n_entries;
    cpc_tune_entry *entries;       /* this run's, in candidate order (owned) */
    char key[CPC_MEASURE_KEY_MAX]; /* cpc_measure_key of the plan */
    char backend[8];               /* "cpu" or "cuda" */
    char profile_path[4096];       /* the plan's cluster.profile, resolved; "" if none */
} cpc_tune_result;

/* Tunes the plan YAML at `path` (see above) and fills *out (zeroed first;
 * free with cpc_tune_result_free, also after errors).  Errors: the plan's
 * diagnostics when it does not load or validate (CPC_E_PLAN, CPC_E_IO; the
 * returned chain may also hold warnings), CP018 for a training plan,
 * CPC_E_USAGE (an artifact: tuning needs the plan YAML; bad options),
 * CPC_E_PLAN when no candidate is valid, and those of cpc_job_from_plan /
 * cpc_job_run for a candidate (the message names it).  Under MPI only world
 * rank 0 gets entries and measurements (*is_root, may be NULL). */
cpc_status *cpc_tune(const char *path, const cpc_tune_options *opt, cpc_tune_result *out,
                     bool *is_root);

/* Frees what *r owns and zeroes it.  NULL is ignored. */
void cpc_tune_result_free(cpc_tune_result *r);

#endif
