/*
 * validate.h - the validate stage: SPEC section 1 ("Variant omitted",
 * "Derived degrees", variant auto, fallback) and section 2 (the CP0xx rules
 * that need only the plan).
 *
 * Input: a loaded plan (plan.h), read only.  Output: a diagnostics chain and a
 * selection: every candidate (variant, ring_degree R, ulysses_degree U) with
 * its verdict, the candidate the plan itself asks for, and the chosen one.
 * Later stages read the chosen candidate, never the YAML.
 *
 * STAGES (SPEC section 2).  Validation stops at the first stage that has an
 * error and reports every violation of that stage:
 *   1. file:      CP105 from variant inference (a flag set to true with a
 *                 different variant, both flags, a variant whose explicit
 *                 degrees contradict it, degrees with variant auto).  The
 *                 loader (plan_load.h) reports the other CP1xx codes.
 *   2. degrees:   CP001-CP004, CP013-CP017 (per candidate).
 *   3. shapes:    CP010-CP012, CP018-CP024, CP027, CP030 (per candidate) and the
 *                 CP031 warning (once per plan).
 *   4. resources: CP040 and whatever a price callback rejects (see below).
 * CP040, CP050, CP051 and CP018 belong to later stages (cost model, Lua,
 * verifier, cprun); a price callback may add CP040.
 *
 * VARIANT INFERENCE (SPEC section 1, as diffusers does).  With `variant:`
 * omitted: a ulysses_anything/ring_anything flag -> that variant; both
 * degrees > 1 -> unified; only ring_degree > 1 -> ring; only ulysses_degree
 * > 1 -> ulysses; neither degrees nor flags -> auto; degrees given but none
 * > 1 -> CP001 (diffusers' "no parallelism"); a degree < 1 -> CP002.  auto
 * (written or inferred) with world_size 1 -> none.  A degree counts as given
 * when its key is in plan->key_spans or its value is non-zero.
 *
 * DERIVED DEGREES.  ring, ring_anything -> P x 1; ulysses,
 * ulysses_anything -> 1 x P; none -> 1 x 1; unified with one degree -> the
 * other is P / it (CP003 when it does not divide); unified with none -> U =
 * the largest divisor of P below P that divides gpus_per_node and passes the
 * H and Hkv rules (CP012's), R = P / U (CP013 when that leaves U = 1).
 *
 * CANDIDATES.  The list always holds every variant for the plan's world_size
 * P (what `cpc --explain` prints): for P > 1 ulysses 1xP, unified R x U for
 * every factorisation with R, U > 1 (U descending; when P has none, one
 * unified entry with the derived degrees, rejected CP013), ring Px1,
 * ulysses_anything 1xP, ring_anything Px1; for P = 1 only none 1x1.  When the
 * plan names (or implies) a variant, its own candidate (with the plan's
 * degrees, which may be wrong) is in the list too: the identical entry if
 * there is one, else inserted before the entries of its variant (none goes
 * last); `preferred` is its index.  The list order is the SPEC tie order.
 *
 * SELECTION.  Explicit variant: the preferred candidate when valid.  If it
 * is rejected: with fallback strict, nothing is selected and its errors are
 * reported; with fallback auto, the choice among the valid candidates
 * (below) is selected and a warning carries the original codes (rule = the
 * first code, message lists them all, one note per original error).  Variant
 * auto: the choice among the valid candidates; when none is valid, every
 * candidate's errors are reported (deduplicated: rules shared by every
 * variant, such as CP030, appear once).
 * The choice (cpc_select_best, SPEC section 1): among valid candidates, the
 * lowest predicted ms_per_forward wins (a candidate the plan's profile has
 * measured, cost.h MEASURED TIMES, competes with its measured time); the
 * tie set is every priced valid
 * candidate with time <= 1.02 x the lowest; it is broken by less
 * memory_bytes_per_rank, then by list order (ulysses, unified, ring,
 * ulysses_anything, ring_anything).  Unpriced candidates only compete when
 * no valid candidate is priced (then: the first valid one in list order).
 *
 * HINTS.  A hint states every change the user makes, as `--set` takes it,
 * and was applied to a copy of the plan and validated (stages 1-4, the
 * price callback included, without falling back) before it is shown.
 * Forms, alternatives joined by "; or ":
 *   "variant A, unified RxU or C runs this plan"   set parallel.variant to
 *       any one of them, nothing else (unified's RxU is what it derives);
 *   "KEY: VALUE, KEY: VALUE runs this plan (variant RxU)"   set exactly
 *       these keys (dotted, as --set); the annotation, present when a
 *       parallel or cluster key changes, is what the plan then selects.
 *       Keys: parallel.variant, parallel.ring_degree, parallel.ulysses_degree,
 *       parallel.ulysses_anything / ring_anything (false), cluster.world_size,
 *       input.mask, input.mode, model.kv_heads, input.segments
 *       ("[{tokens: N}]": one segment).
 * The plan's explicit degrees and flags stay unless the hint names them:
 * a degree written in the plan that the target contradicts, or a derived
 * one that would come out differently, is set to the target's value; an
 * anything-flag of another variant is set to false; parallel.variant is
 * named unless the plan already asks for that variant.  Search order: the
 * same variant with other degrees (the fewest changes), other variants at
 * the same world_size (those that need only the variant key, else the one
 * with the fewest changes), a rule-specific change (input.mode: inference,
 * input.mask: none, one segment, a kv_heads that divides heads,
 * cluster.world_size = R*U for CP003, which also offers the same variant's
 * other degrees), the nearest world_size where the plan runs.  No hint when
 * none works.  Stage-1 CP105 conflicts carry fixed advice (the loader
 * reports them first for plan files).
 *
 * THE OUTER AXES (SPEC section 1, "All four axes").  parallel.cfg_degree C
 * and tp_degree T, each N or auto.  A (C, T, R, U) candidate is C*T
 * independent R x U problems, each the plan cut by cpc_plan_sub (plan.h; batch
 * B/C, heads H/T): they share no data and no traffic, so everything above
 * (inference, derived degrees, candidates, rules, hints, selection) runs on
 * that sub-plan unchanged, and each candidate records its C and T.
 * Messages then speak of the sub-plan's world (P/(C*T)) except CP003,
 * which states C*T*R*U, and hints, whose world sizes are the user's.
 * With C = T = 1 (the default) nothing differs from a ring x ulysses plan.
 * The compiler schedules the selected candidate's sub-plan, the artifact
 * records C and T (artifact.h), and cprun places the C*T groups
 * (runtime/session/placement.h).
 * Axis rules, stage 2, checked first for the values written: CP003
 * (C*T does not divide world_size), CP005 (batch % C), CP006 (H % T, or
 * Hkv % T with T % Hkv); each hint offers another value of the axis (or a
 * world size for CP003), applied and validated first.  `auto`: every C
 * that divides P and B, every T that divides P, every pair with C*T | P
 * that passes CP003/CP005/CP006; the candidate list is the pairs' lists,
 * (C, T) ascending; variant auto picks among all of them by the tie rule,
 * an explicit variant among each pair's own selection.  When no pair
 * runs, the diagnostics are those of the first pair (C and T smallest).
 *
 * SPANS.  An error points at the segment or key its value comes from (the
 * value's position); a note points at the other key involved (the degree
 * key, or cluster.world_size for a derived degree).
 *
 * Ownership: a selection owns its candidates and their error chains; the
 * returned diagnostics chain is the caller's (cpc_status_free).
 * Thread-safety: pure functions of their inputs; a price callback is called
 * from the calling thread only.
 */
#ifndef CPC_VALIDATE_H
#define CPC_VALIDATE_H

#include <stdbool.h>
#include <stdint.h>

#include "plan.h"
#include "prediction.h"
#include "status.h"

/* One (variant, degrees) the compiler could run. */
typedef struct cpc_candidate {
    cpc_variant variant;         /* never AUTO */
    int ring_degree;             /* R */
    int ulysses_degree;          /* U */
    bool ok;                     /* passes stages 2-4 */
    cpc_status *errors;          /* why rejected (owned; NULL when ok): the
                                    errors of the stage it stopped at */
    /* Filled by a price callback (SPEC section 3 `predicted`): */
    double predicted_ms_per_layer;
    double predicted_ms_per_forward;   /* x model.layers */
    int64_t memory_bytes_per_rank;     /* peak over ranks, reserved_gb included */
    int64_t bytes_sent_per_rank;       /* per layer, max over ranks */
    double predicted_ms_per_step;      /* whole forward step (model.parameters), else 0 */
    double predicted_ms_per_image;     /* x input.steps, else 0 */
    bool priced;                       /* the fields above are set */
    /* Set by the cost model when the plan's profile has a measurement of
     * this candidate (cost.h MEASURED TIMES); selection then uses these: */
    bool measured;
    double measured_ms_per_layer;      /* as `cprun --tune` measured it */
    double measured_ms_per_forward;    /* x model.layers */
    double measured_ms_per_step;       /* whole step with the measured attention, else 0 */
    /* The outer axes (SPEC section 1, "All four axes"): the candidate is
     * cfg_degree x tp_degree independent R x U problems (cpc_plan_sub). */
    int cfg_degree;                    /* C >= 1 */
    int tp_degree;                     /* T >= 1 */
    /* mode: training (SPEC section 10), candidates with a backward program
     * (schedule_bwd.h), set by the cost model's price callback: the backward
     * program priced (not proven: the compiler proves the selected one's). */
    bool bwd_priced;
    double predicted_ms_backward_per_layer;
    int64_t bwd_bytes_sent_per_rank;   /* per layer, max over ranks */
    int64_t bwd_memory_bytes_per_rank; /* peak over ranks */
    /* The cost model's whole prediction (its step breakdown, pipeline and
     * memory parts; prediction.h), set with `priced`. */
    cpc_prediction pred;
} cpc_candidate;

typedef struct cpc_selection {
    int n_candidates;
    cpc_candidate *candidates;   /* owned array, SPEC tie order */
    int selected;                /* index of the chosen candidate, -1 if none */
    int preferred;               /* index of the plan's own variant, -1 for auto
                                    (or when inference failed) */
    cpc_variant requested;       /* the variant after inference (AUTO for auto;
                                    NONE for auto at world_size 1);
                                    CPC_VARIANT__COUNT when inference failed */
    bool fell_back;              /* fallback: auto replaced the preferred one */
} cpc_selection;

/* Pricing hook for the cost model (cost.h).  Called once for every candidate
 * that passed stages 2 and 3, before selection.  It fills the predicted
 * fields and sets `priced`; it may reject the candidate (stage 4, e.g. CP040)
 * by setting ok = false and appending its errors to cand->errors.  A
 * returned status is an internal failure: validation stops and returns it.
 * `plan` may be a modified copy of the user's plan (hint search). */
typedef cpc_status *(*cpc_price_fn)(void *ctx, const cpc_plan *plan, cpc_candidate *cand);

/* Validates `plan` and fills `sel` (which need not be initialised; free it
 * with cpc_selection_free, also after errors).  Returns the diagnostics
 * chain: errors and warnings of class CPC_E_PLAN with rule numbers, or NULL.
 * The plan is accepted when the chain has no error; then sel->selected >= 0.
 * Errors besides CPC_E_PLAN: CPC_E_NOMEM. */
cpc_status *cpc_validate(const cpc_plan *plan, cpc_selection *sel);

/* As cpc_validate, with a price callback (NULL = none) and its context. */
cpc_status *cpc_validate_priced(const cpc_plan *plan, cpc_price_fn price, void *ctx,
                                cpc_selection *sel);

/* Checks one (variant, R, U) against stages 2 and 3 as if the plan had
 * asked for it with both degrees explicit.  Returns the errors of the stage
 * it stops at (class CPC_E_PLAN, no hints), NULL when it runs.  variant
 * must not be AUTO. */
cpc_status *cpc_check_candidate(const cpc_plan *plan, cpc_variant variant, int ring_degree,
                                int ulysses_degree);

/* Degrees the plan gets for `variant` when both are omitted (SPEC "Derived
 * degrees"; unified: the gpus_per_node/heads rule, which may give U = 1).
 * variant must not be AUTO. */
void cpc_derive_degrees(const cpc_plan *plan, cpc_variant variant, int *ring_degree,
                        int *ulysses_degree);

/* The SPEC tie rule over `n` candidates (see SELECTION above); returns the
 * index of the chosen one, -1 when none is ok. */
int cpc_select_best(const cpc_candidate *cands, int n);

/* Frees what `sel` owns and resets it (n_candidates 0, selected -1).
 * NULL is ignored. */
void cpc_selection_free(cpc_selection *sel);

#endif
