/* validate.c - see validate.h (SPEC sections 1 and 2). */
#include "validate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORLD (1 << 20)      /* SPEC section 1: world_size <= 2^20 */
#define HINT_WORLD_TRIES 64      /* world sizes tried by the hint search */

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static bool is_anything(cpc_variant v)
{
    return v == CPC_VARIANT_ULYSSES_ANYTHING || v == CPC_VARIANT_RING_ANYTHING;
}

static bool uses_ulysses_heads(cpc_variant v)
{
    return v == CPC_VARIANT_ULYSSES || v == CPC_VARIANT_UNIFIED;
}

static const char *vname(cpc_variant v)
{
    const char *n = cpc_variant_name(v);
    return n ? n : "?";
}

/* True when `key` (dotted path) was written in the plan file. */
static bool has_key(const cpc_plan *p, const char *key)
{
    for (int i = 0; i < p->n_key_spans; i++)
        if (p->key_spans[i].key && strcmp(p->key_spans[i].key, key) == 0)
            return true;
    return false;
}

static cpc_span vspan(const cpc_plan *p, const char *key)
{
    return cpc_plan_span(p, key, true);
}

static cpc_span kspan(const cpc_plan *p, const char *key)
{
    return cpc_plan_span(p, key, false);
}

static int world(const cpc_plan *p)
{
    return p->cluster.world_size;
}

static int gpus_per_node(const cpc_plan *p)
{
    int g = p->cluster.gpus_per_node;
    if (g < 1)
        g = world(p) < 8 ? world(p) : 8;
    return g < 1 ? 1 : g;
}

/* The span of segment i: its own, else the segments key. */
static cpc_span seg_span(const cpc_plan *p, int i)
{
    const cpc_segment *s = &p->input.segments[i];
    if (s->span.line > 0)
        return s->span;
    char key[64];
    snprintf(key, sizeof key, "input.segments[%d]", i);
    return vspan(p, key);
}

/* Appends printf text to a malloc'd string (*s may be NULL).  On OOM the
 * string is left as it was. */
static void sappend(char **s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sappend(char **s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *add = NULL;
    int n = vasprintf(&add, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (!*s) {
        *s = add;
        return;
    }
    char *cat = NULL;
    if (asprintf(&cat, "%s%s", *s, add) >= 0) {
        free(*s);
        *s = cat;
    }
    free(add);
}

/* Deep copy of one diagnostic (not its `next`), notes included. */
static cpc_status *clone_one(const cpc_status *st)
{
    if (st == &cpc_status_oom)
        return &cpc_status_oom;
    cpc_status *c = cpc_diag(st->code, st->rule, st->severity, st->span, "%s", st->message);
    if (c == &cpc_status_oom)
        return c;
    if (st->hint)
        cpc_status_set_hint(c, "%s", st->hint);
    for (const cpc_status *n = st->notes; n; n = n->next)
        cpc_status_add_note(c, n->span, "%s", n->message);
    return c;
}

static bool same_span(cpc_span a, cpc_span b)
{
    if (a.line != b.line || a.col != b.col)
        return false;
    if (!a.file || !b.file)
        return a.file == b.file;
    return strcmp(a.file, b.file) == 0;
}

static int first_rule(const cpc_status *st)
{
    for (; st; st = st->next)
        if (st->severity == CPC_SEV_ERROR && st->rule)
            return st->rule;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Where a candidate's variant and degrees come from (for spans and notes)  */
/* ------------------------------------------------------------------------ */

typedef struct origin {
    bool r_given, u_given;   /* written in the plan */
    bool unified_rule;       /* unified, both derived by the gpus_per_node rule */
    const char *variant_key; /* key that set the variant, NULL when auto */
} origin;

static const origin NO_ORIGIN = {false, false, false, NULL};

/* Adds a note unless it would point where the diagnostic itself points. */
static void add_note(cpc_status *st, cpc_span span, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_note(cpc_status *st, cpc_span span, const char *fmt, ...)
{
    if (st == &cpc_status_oom || (span.line > 0 && same_span(span, st->span)))
        return;
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    if (n >= 0)
        cpc_status_add_note(st, span, "%s", msg);
    free(msg);
}

/* Adds notes at the keys the degrees of (v, R, U) come from; want_r/want_u
 * select which degrees the diagnostic involves. */
static void note_degrees(cpc_status *st, const cpc_plan *p, const origin *o, cpc_variant v, int R, int U,
                         bool want_r, bool want_u)
{
    int P = world(p);
    cpc_span wspan = vspan(p, "cluster.world_size");
    cpc_span varspan = vspan(p, o->variant_key ? o->variant_key : "cluster.world_size");
    bool uni = v == CPC_VARIANT_UNIFIED;
    if (uni && o->unified_rule && !o->r_given && !o->u_given) {
        if (want_r || want_u)
            add_note(st, wspan,
                     "unified %dx%d is derived from world_size %d (ulysses_degree: the largest divisor of %d "
                     "below it that divides gpus_per_node %d and the heads)",
                     R, U, P, P, gpus_per_node(p));
        return;
    }
    if (uni && !o->r_given && !o->u_given) {
        if (want_r || want_u)
            add_note(st, wspan, "unified %dx%d is one factorisation of world_size %d (variant auto tries each)", R,
                     U, P);
        return;
    }
    bool ring_like = v == CPC_VARIANT_RING || v == CPC_VARIANT_RING_ANYTHING;
    bool uly_like = v == CPC_VARIANT_ULYSSES || v == CPC_VARIANT_ULYSSES_ANYTHING;
    if (want_r) {
        if (o->r_given)
            add_note(st, vspan(p, "parallel.ring_degree"), "ring_degree %d is set here", R);
        else if (uni && o->u_given)
            add_note(st, wspan, "ring_degree %d = world_size %d / ulysses_degree %d", R, P, U);
        else if (ring_like)
            add_note(st, wspan, "ring_degree %d is derived from world_size %d", R, P);
        else
            add_note(st, varspan, "ring_degree %d: variant %s has no ring group", R, vname(v));
    }
    if (want_u) {
        if (o->u_given)
            add_note(st, vspan(p, "parallel.ulysses_degree"), "ulysses_degree %d is set here", U);
        else if (uni && o->r_given)
            add_note(st, wspan, "ulysses_degree %d = world_size %d / ring_degree %d", U, P, R);
        else if (uly_like)
            add_note(st, wspan, "ulysses_degree %d is derived from world_size %d", U, P);
        else
            add_note(st, varspan, "ulysses_degree %d: variant %s has no ulysses group", U, vname(v));
    }
}

static void note_variant(cpc_status *st, const cpc_plan *p, const origin *o, cpc_variant v)
{
    if (!o->variant_key)
        return;
    if (strcmp(o->variant_key, "parallel.variant") == 0)
        add_note(st, vspan(p, o->variant_key), "variant %s is set here", vname(v));
    else
        add_note(st, vspan(p, o->variant_key), "variant %s comes from %s: true", vname(v),
                            strchr(o->variant_key, '.') + 1);
}

/* ------------------------------------------------------------------------ */
/* Derived degrees                                                          */
/* ------------------------------------------------------------------------ */

/* CP012's head rule for ulysses/unified: H % U == 0 and (Hkv % U == 0 or
 * U % Hkv == 0). */
static bool heads_ok(const cpc_plan *p, int U)
{
    int H = p->model.heads, Hkv = p->model.kv_heads;
    if (U < 1 || H % U != 0)
        return false;
    if (Hkv < 1)
        return false;
    return Hkv % U == 0 || U % Hkv == 0;
}

/* Unified with neither degree: U = the largest divisor of P below P that
 * divides gpus_per_node and passes the heads rule; R = P / U. */
static void derive_unified(const cpc_plan *p, int *R, int *U)
{
    int P = world(p), g = gpus_per_node(p);
    int best = 1;
    for (int d = 1; (int64_t)d * d <= P; d++) {
        if (P % d)
            continue;
        int pair[2] = {d, P / d};
        for (int k = 0; k < 2; k++) {
            int u = pair[k];
            if (u < P && u > best && g % u == 0 && heads_ok(p, u))
                best = u;
        }
    }
    *U = best;
    *R = P / best;
}

void cpc_derive_degrees(const cpc_plan *p, cpc_variant v, int *R, int *U)
{
    int P = world(p);
    switch (v) {
    case CPC_VARIANT_RING:
    case CPC_VARIANT_RING_ANYTHING: *R = P; *U = 1; break;
    case CPC_VARIANT_ULYSSES:
    case CPC_VARIANT_ULYSSES_ANYTHING: *R = 1; *U = P; break;
    case CPC_VARIANT_UNIFIED: derive_unified(p, R, U); break;
    default: *R = 1; *U = 1; break;
    }
}

/* ------------------------------------------------------------------------ */
/* Stages 2 and 3 for one candidate                                         */
/* ------------------------------------------------------------------------ */

#define ERR(rule, span, ...) cpc_diag(CPC_E_PLAN, (rule), CPC_SEV_ERROR, (span), __VA_ARGS__)

/* Stage 2: degrees.  CP001-CP004, CP013-CP017. */
static cpc_status *check_degrees(const cpc_plan *p, cpc_variant v, int R, int U, const origin *o)
{
    cpc_status *errs = NULL, *e;
    int P = world(p);
    const char *vn = vname(v);
    cpc_span rspan = o->r_given ? vspan(p, "parallel.ring_degree")
                                : vspan(p, o->variant_key ? o->variant_key : "cluster.world_size");
    cpc_span uspan = o->u_given ? vspan(p, "parallel.ulysses_degree")
                                : vspan(p, o->variant_key ? o->variant_key : "cluster.world_size");
    cpc_span dspan = o->r_given ? rspan : o->u_given ? uspan
                   : vspan(p, o->variant_key ? o->variant_key : "cluster.world_size");

    bool bad_degree = false;
    if (R < 1) {
        e = ERR(2, rspan, "%s: ring_degree %d is < 1", vn, R);
        cpc_status_append(&errs, e);
        bad_degree = true;
    }
    if (U < 1) {
        e = ERR(2, uspan, "%s: ulysses_degree %d is < 1", vn, U);
        cpc_status_append(&errs, e);
        bad_degree = true;
    }
    if (bad_degree)
        return errs;

    if (R == 1 && U == 1 && v != CPC_VARIANT_NONE) {
        e = ERR(1, dspan, "%s: ring_degree and ulysses_degree are both 1: no parallelism (world_size %d)",
                vn, P);
        note_degrees(e, p, o, v, R, U, true, true);
        cpc_status_append(&errs, e);
    }
    int64_t prod = (int64_t)R * (int64_t)U;
    /* a sub-plan of a (C, T) split (cpc_plan_sub) reports the user's world */
    int64_t CT = (int64_t)(p->parallel.cfg_degree >= 1 ? p->parallel.cfg_degree : 1) *
                 (p->parallel.tp_degree >= 1 ? p->parallel.tp_degree : 1);
    /* the other degree derived from a world it does not divide: CP003 says
     * so, and the derived degree (P / given, rounded down) is no degree the
     * user chose, so no rule is checked on it (CP013 "got 1x4" was noise) */
    bool derived_bad = false;
    if (prod != P && v != CPC_VARIANT_NONE) {
        bool one_derived = v == CPC_VARIANT_UNIFIED && (o->r_given != o->u_given);
        derived_bad = one_derived;
        if (one_derived) {
            int given = o->r_given ? R : U;
            e = ERR(3, o->r_given ? rspan : uspan,
                    "%s: world_size %d is not divisible by %s %d (%d = %d*%d + %d): world_size must equal R*U",
                    vn, P, o->r_given ? "ring_degree" : "ulysses_degree", given, P, given, P / given,
                    P % given);
        } else if (CT > 1) {
            e = ERR(3, dspan,
                    "%s: world_size must equal C*T*R*U: cfg_degree %d x tp_degree %d x ring_degree %d x "
                    "ulysses_degree %d = %lld, but world_size is %lld (idle ranks are an error)",
                    vn, p->parallel.cfg_degree, p->parallel.tp_degree, R, U, (long long)(prod * CT),
                    (long long)P * CT);
            note_degrees(e, p, o, v, R, U, true, true);
        } else {
            e = ERR(3, dspan,
                    "%s: world_size must equal R*U: ring_degree %d x ulysses_degree %d = %lld, but "
                    "world_size is %d (cpc has no data-parallel axis: idle ranks are an error)",
                    vn, R, U, (long long)prod, P);
            note_degrees(e, p, o, v, R, U, true, true);
        }
        add_note(e, vspan(p, "cluster.world_size"), "world_size %lld is set here", (long long)P * CT);
        cpc_status_append(&errs, e);
    }
    if (v == CPC_VARIANT_NONE && P != 1) {
        e = ERR(4, vspan(p, "cluster.world_size"), "none: variant none needs world_size 1, world_size is %d", P);
        note_variant(e, p, o, v);
        cpc_status_append(&errs, e);
    }
    if (v == CPC_VARIANT_UNIFIED && (R == 1 || U == 1) && !derived_bad) {
        if (o->unified_rule)
            e = ERR(13, dspan,
                    "unified: needs ring_degree > 1 and ulysses_degree > 1 (at least 4 ranks), but "
                    "world_size %d has no divisor 1 < U < %d that divides gpus_per_node %d and heads %d%s",
                    P, P, gpus_per_node(p), p->model.heads,
                    p->model.kv_heads != p->model.heads ? " (with kv_heads)" : "");
        else
            e = ERR(13, dspan, "unified: needs ring_degree > 1 and ulysses_degree > 1 (at least 4 ranks), "
                               "got %dx%d", R, U);
        note_degrees(e, p, o, v, R, U, true, true);
        cpc_status_append(&errs, e);
    }
    if (v == CPC_VARIANT_ULYSSES_ANYTHING && R != 1) {
        e = ERR(14, rspan, "ulysses_anything: ring_degree must be 1, got %d", R);
        note_variant(e, p, o, v);
        cpc_status_append(&errs, e);
    }
    if (v == CPC_VARIANT_ULYSSES_ANYTHING && U <= 1) {
        e = ERR(15, uspan, "ulysses_anything: ulysses_degree must be > 1, got %d", U);
        note_degrees(e, p, o, v, R, U, false, true);
        cpc_status_append(&errs, e);
    }
    if (v == CPC_VARIANT_RING_ANYTHING && U != 1) {
        e = ERR(16, uspan, "ring_anything: ulysses_degree must be 1, got %d", U);
        note_variant(e, p, o, v);
        cpc_status_append(&errs, e);
    }
    if (v == CPC_VARIANT_RING_ANYTHING && R <= 1) {
        e = ERR(17, rspan, "ring_anything: ring_degree must be > 1, got %d", R);
        note_degrees(e, p, o, v, R, U, true, false);
        cpc_status_append(&errs, e);
    }
    return errs;
}

/* Stage 3: shapes.  CP010-CP012, CP018-CP024, CP027, CP030 (CP031 is the plan's). */
static cpc_status *check_shapes(const cpc_plan *p, cpc_variant v, int R, int U, const origin *o)
{
    cpc_status *errs = NULL, *e;
    int P = world(p);
    const char *vn = vname(v);
    int H = p->model.heads, Hkv = p->model.kv_heads;
    int nseg = p->input.n_segments;

    /* CP010 / CP011: even splits. */
    if (v == CPC_VARIANT_RING || v == CPC_VARIANT_UNIFIED || v == CPC_VARIANT_ULYSSES) {
        int64_t w = v == CPC_VARIANT_ULYSSES ? U : (int64_t)R * U;
        int rule = v == CPC_VARIANT_ULYSSES ? 11 : 10;
        for (int i = 0; i < nseg; i++) {
            const cpc_segment *s = &p->input.segments[i];
            if (s->tokens % w == 0 || s->replicate) /* a replicated segment is never divided */
                continue;
            long long n = (long long)s->tokens;
            if (v == CPC_VARIANT_UNIFIED)
                e = ERR(rule, seg_span(p, i),
                        "%s: segment '%s' has %lld tokens, not divisible by ring_degree*ulysses_degree %lld "
                        "(%dx%d) (%lld = %lld*%lld + %lld)",
                        vn, s->name, n, (long long)w, R, U, n, (long long)w, n / w, n % w);
            else
                e = ERR(rule, seg_span(p, i),
                        "%s: segment '%s' has %lld tokens, not divisible by %s %lld (%lld = %lld*%lld + %lld)",
                        vn, s->name, n, v == CPC_VARIANT_ULYSSES ? "ulysses_degree" : "ring_degree",
                        (long long)w, n, (long long)w, n / w, n % w);
            note_degrees(e, p, o, v, R, U, v != CPC_VARIANT_ULYSSES, v != CPC_VARIANT_RING);
            cpc_status_append(&errs, e);
        }
    }

    /* CP012: heads over the ulysses group (GQA: split or replicate K/V). */
    if (uses_ulysses_heads(v)) {
        if (H % U != 0) {
            e = ERR(12, vspan(p, "model.heads"), "%s: heads %d not divisible by ulysses_degree %d (%d = %d*%d + %d)",
                    vn, H, U, H, U, H / U, H % U);
            note_degrees(e, p, o, v, R, U, false, true);
            cpc_status_append(&errs, e);
        }
        if (Hkv >= 1 && Hkv != H && Hkv % U != 0 && U % Hkv != 0) {
            e = ERR(12, vspan(p, "model.kv_heads"),
                    "%s: kv_heads %d is neither divisible by ulysses_degree %d nor a divisor of it "
                    "(GQA: K/V heads are split with their query heads or replicated)",
                    vn, Hkv, U);
            note_degrees(e, p, o, v, R, U, false, true);
            cpc_status_append(&errs, e);
        }
    }

    /* CP018 (a variant that cannot run a backward pass) is not raised for
     * any variant any more: diffusers marks both anything variants inference
     * only, but cpc's backward programs (compiler/schedule_bwd.h) handle
     * their uneven splits (messages sized by content tag, the reducing
     * all-to-all for K/V heads shared by uneven head parts) and are proved
     * (verify_bwd.h); docs/BACKWARD.md 3.9.  What still cannot train
     * (cross-attention) is CP018 from cpc_backward_supported. */
    /* CP019: ring_anything needs no mask. */
    if (v == CPC_VARIANT_RING_ANYTHING && p->input.mask != CPC_MASK_NONE) {
        e = ERR(19, vspan(p, "input.mask"), "ring_anything: needs mask none, got mask %s (diffusers: attn_mask "
                                           "must be None)", cpc_mask_name(p->input.mask));
        note_variant(e, p, o, v);
        cpc_status_append(&errs, e);
    }
    /* CP020: every rank gets at least one token of every segment. */
    if (is_anything(v)) {
        int w = v == CPC_VARIANT_ULYSSES_ANYTHING ? U : R;
        for (int i = 0; i < nseg; i++) {
            const cpc_segment *s = &p->input.segments[i];
            if (s->tokens >= w || s->replicate)
                continue;
            e = ERR(20, seg_span(p, i), "%s: segment '%s' has %lld tokens, fewer than %s %d: a rank would get "
                                        "no token", vn, s->name, (long long)s->tokens,
                    v == CPC_VARIANT_ULYSSES_ANYTHING ? "ulysses_degree" : "ring_degree", w);
            note_degrees(e, p, o, v, R, U, v == CPC_VARIANT_RING_ANYTHING, v == CPC_VARIANT_ULYSSES_ANYTHING);
            cpc_status_append(&errs, e);
        }
    }
    /* CP021: ulysses_anything needs a head per rank. */
    if (v == CPC_VARIANT_ULYSSES_ANYTHING && H < U) {
        e = ERR(21, vspan(p, "model.heads"), "ulysses_anything: heads %d < ulysses_degree %d: a rank would get "
                                            "no head", H, U);
        note_degrees(e, p, o, v, R, U, false, true);
        cpc_status_append(&errs, e);
    }
    bool causal = p->input.mask == CPC_MASK_CAUSAL;
    /* CP022: causal with split segments. */
    if (causal && nseg > 1) {
        if (v == CPC_VARIANT_NONE)
            e = ERR(22, vspan(p, "input.mask"),
                    "causal mask with %d segments: refused for every variant, none included (split segments "
                    "are interleaved on the ranks, which breaks causality)", nseg);
        else
            e = ERR(22, vspan(p, "input.mask"),
                    "causal mask with %d segments: split segments are interleaved on the ranks, which breaks "
                    "causality", nseg);
        add_note(e, seg_span(p, 1), "segment '%s' is the second segment",
                            p->input.segments[1].name);
        cpc_status_append(&errs, e);
    }
    /* CP023: zigzag needs S % 2P == 0. */
    if (causal && (v == CPC_VARIANT_RING || v == CPC_VARIANT_UNIFIED)) {
        int64_t S = p->input.total_tokens, w = 2 * (int64_t)P;
        if (S % w != 0) {
            cpc_span sp = nseg == 1 ? seg_span(p, 0) : vspan(p, "input.segments");
            e = ERR(23, sp, "%s: causal mask: sequence length %lld not divisible by 2*world_size %lld "
                            "(%lld = %lld*%lld + %lld; zigzag: rank r holds chunks r and 2P-1-r)",
                    vn, (long long)S, (long long)w, (long long)S, (long long)w, (long long)(S / w),
                    (long long)(S % w));
            add_note(e, vspan(p, "cluster.world_size"), "world_size %d is set here", P);
            cpc_status_append(&errs, e);
        }
    }
    /* CP024: causal cross-attention. */
    if (causal && p->input.has_kv) {
        e = ERR(24, vspan(p, "input.mask"), "causal mask with cross-attention (input.kv: %lld key/value tokens)",
                (long long)p->input.kv_tokens);
        add_note(e, vspan(p, "input.kv"), "input.kv is set here");
        cpc_status_append(&errs, e);
    }
    /* CP027: replicated segments (`split: replicate`) need a sharded one,
     * and are self-attention tokens: not with input.kv. */
    int nrep = 0, first_rep = -1;
    for (int i = 0; i < nseg; i++)
        if (p->input.segments[i].replicate) {
            nrep++;
            if (first_rep < 0)
                first_rep = i;
        }
    if (nrep > 0 && nrep == nseg) {
        e = ERR(27, seg_span(p, first_rep),
                "every segment is `split: replicate`: at least one segment must be sharded (a plan with "
                "nothing to split has no context parallelism)");
        cpc_status_set_hint(e, "drop `split: replicate` from the segment the ranks should divide (the image or "
                               "video tokens), or use variant none on one rank");
        cpc_status_append(&errs, e);
    }
    if (nrep > 0 && p->input.has_kv) {
        e = ERR(27, seg_span(p, first_rep),
                "segment '%s' is `split: replicate`, but the plan has cross-attention (input.kv): replicated "
                "segments are joint self-attention tokens, cross-attention K/V are already whole on every rank",
                p->input.segments[first_rep].name);
        add_note(e, vspan(p, "input.kv"), "input.kv is set here");
        cpc_status_set_hint(e, "drop `split: replicate`, or drop input.kv");
        cpc_status_append(&errs, e);
    }
    /* CP030: GQA ratio. */
    if (Hkv >= 1 && H % Hkv != 0) {
        e = ERR(30, vspan(p, "model.kv_heads"), "heads %d not divisible by kv_heads %d (%d = %d*%d + %d)", H, Hkv,
                H, Hkv, H / Hkv, H % Hkv);
        add_note(e, vspan(p, "model.heads"), "heads %d is set here", H);
        cpc_status_append(&errs, e);
    }
    return errs;
}

static cpc_status *check_with_origin(const cpc_plan *p, cpc_variant v, int R, int U, const origin *o)
{
    cpc_status *errs = check_degrees(p, v, R, U, o);
    if (errs)
        return errs;
    return check_shapes(p, v, R, U, o);
}

cpc_status *cpc_check_candidate(const cpc_plan *p, cpc_variant v, int R, int U)
{
    if (!p || v == CPC_VARIANT_AUTO || v < 0 || v >= CPC_VARIANT__COUNT)
        return cpc_error(CPC_E_INTERNAL, "cpc_check_candidate: bad arguments");
    origin o = {true, true, false, NULL};
    return check_with_origin(p, v, R, U, &o);
}

/* ------------------------------------------------------------------------ */
/* Plan sanity (the loader's job; checked so that hand-built plans cannot    */
/* crash the rules)                                                          */
/* ------------------------------------------------------------------------ */

static cpc_status *check_sanity(const cpc_plan *p)
{
    cpc_status *errs = NULL;
    if (p->cluster.world_size < 1 || p->cluster.world_size > MAX_WORLD)
        cpc_status_append(&errs, ERR(103, vspan(p, "cluster.world_size"),
                                     "world_size %d is out of range 1..%d", p->cluster.world_size, MAX_WORLD));
    if (p->model.heads < 1)
        cpc_status_append(&errs, ERR(103, vspan(p, "model.heads"), "heads %d is < 1", p->model.heads));
    if (p->model.kv_heads < 1)
        cpc_status_append(&errs, ERR(103, vspan(p, "model.kv_heads"), "kv_heads %d is < 1", p->model.kv_heads));
    if (p->input.n_segments < 1 || !p->input.segments)
        cpc_status_append(&errs, ERR(104, vspan(p, "input"), "input: no segment"));
    else
        for (int i = 0; i < p->input.n_segments; i++)
            if (p->input.segments[i].tokens < 1)
                cpc_status_append(&errs, ERR(103, seg_span(p, i), "segment '%s' has %lld tokens (< 1)",
                                             p->input.segments[i].name ? p->input.segments[i].name : "?",
                                             (long long)p->input.segments[i].tokens));
    return errs;
}

/* ------------------------------------------------------------------------ */
/* Stage 1: variant inference                                               */
/* ------------------------------------------------------------------------ */

typedef struct request {
    cpc_variant variant;   /* concrete, AUTO, or __COUNT (no parallelism: CP001/CP002) */
    origin o;
    int r, u;              /* given values (when r_given / u_given) */
    cpc_status *pre;       /* stage-2 errors of an unusable request (owned) */
} request;

static cpc_status *infer(const cpc_plan *p, request *rq)
{
    cpc_status *errs = NULL, *e;
    const char *vkey = "parallel.variant";
    memset(rq, 0, sizeof *rq);
    rq->o.r_given = has_key(p, "parallel.ring_degree") || p->parallel.ring_degree != 0;
    rq->o.u_given = has_key(p, "parallel.ulysses_degree") || p->parallel.ulysses_degree != 0;
    rq->r = p->parallel.ring_degree;
    rq->u = p->parallel.ulysses_degree;
    bool fua = p->parallel.ulysses_anything, fra = p->parallel.ring_anything;
    int P = world(p);

    if (fua && fra) {
        e = ERR(105, kspan(p, "parallel.ring_anything"),
                "ulysses_anything and ring_anything are both true: a plan has one variant");
        add_note(e, kspan(p, "parallel.ulysses_anything"), "ulysses_anything: true is set here");
        cpc_status_set_hint(e, "keep the flag of the variant you want, or write variant: "
                               "ulysses_anything or variant: ring_anything");
        cpc_status_append(&errs, e);
    }
    if (p->parallel.variant_given) {
        cpc_variant v = p->parallel.variant;
        rq->variant = v;
        rq->o.variant_key = vkey;
        const char *flags[2] = {"ulysses_anything", "ring_anything"};
        bool fset[2] = {fua, fra};
        cpc_variant fv[2] = {CPC_VARIANT_ULYSSES_ANYTHING, CPC_VARIANT_RING_ANYTHING};
        for (int k = 0; k < 2; k++) {
            if (!fset[k] || v == fv[k])
                continue;
            char key[64];
            snprintf(key, sizeof key, "parallel.%s", flags[k]);
            e = ERR(105, kspan(p, key), "%s: true conflicts with variant %s", flags[k], vname(v));
            add_note(e, vspan(p, vkey), "variant %s is set here", vname(v));
            cpc_status_set_hint(e, "remove %s: true, or write variant: %s", flags[k], flags[k]);
            cpc_status_append(&errs, e);
        }
        if (v == CPC_VARIANT_RING && rq->o.u_given && rq->u > 1) {
            e = ERR(105, vspan(p, "parallel.ulysses_degree"), "ring: ulysses_degree %d conflicts with variant ring "
                                                             "(ring has ulysses_degree 1)", rq->u);
            add_note(e, vspan(p, vkey), "variant ring is set here");
            cpc_status_set_hint(e, "remove ulysses_degree, or write variant: unified");
            cpc_status_append(&errs, e);
        }
        if (v == CPC_VARIANT_ULYSSES && rq->o.r_given && rq->r > 1) {
            e = ERR(105, vspan(p, "parallel.ring_degree"), "ulysses: ring_degree %d conflicts with variant ulysses "
                                                          "(ulysses has ring_degree 1)", rq->r);
            add_note(e, vspan(p, vkey), "variant ulysses is set here");
            cpc_status_set_hint(e, "remove ring_degree, or write variant: unified");
            cpc_status_append(&errs, e);
        }
        if (v == CPC_VARIANT_NONE && ((rq->o.r_given && rq->r > 1) || (rq->o.u_given && rq->u > 1))) {
            bool r = rq->o.r_given && rq->r > 1;
            e = ERR(105, vspan(p, r ? "parallel.ring_degree" : "parallel.ulysses_degree"),
                    "none: %s %d conflicts with variant none (no parallelism)", r ? "ring_degree" : "ulysses_degree",
                    r ? rq->r : rq->u);
            add_note(e, vspan(p, vkey), "variant none is set here");
            cpc_status_set_hint(e, "remove the degrees, or name a parallel variant");
            cpc_status_append(&errs, e);
        }
        if (v == CPC_VARIANT_AUTO && (rq->o.r_given || rq->o.u_given)) {
            e = ERR(105, vspan(p, rq->o.r_given ? "parallel.ring_degree" : "parallel.ulysses_degree"),
                    "auto: variant auto chooses the degrees itself; %s conflicts with it",
                    rq->o.r_given ? "ring_degree" : "ulysses_degree");
            add_note(e, vspan(p, vkey), "variant auto is set here");
            cpc_status_set_hint(e, "remove ring_degree and ulysses_degree, or name a variant");
            cpc_status_append(&errs, e);
        }
        if (errs)
            return errs;
        if (v == CPC_VARIANT_AUTO) {
            rq->o.variant_key = NULL;
            if (P == 1) {
                rq->variant = CPC_VARIANT_NONE;
                rq->o.variant_key = vkey;
            }
        }
        return NULL;
    }
    if (errs)
        return errs;

    /* variant omitted: infer as diffusers does. */
    if (fua) {
        rq->variant = CPC_VARIANT_ULYSSES_ANYTHING;
        rq->o.variant_key = "parallel.ulysses_anything";
    } else if (fra) {
        rq->variant = CPC_VARIANT_RING_ANYTHING;
        rq->o.variant_key = "parallel.ring_anything";
    } else if (!rq->o.r_given && !rq->o.u_given) {
        rq->variant = P == 1 ? CPC_VARIANT_NONE : CPC_VARIANT_AUTO;
    } else {
        bool r_par = rq->o.r_given && rq->r > 1, u_par = rq->o.u_given && rq->u > 1;
        if (r_par && u_par)
            rq->variant = CPC_VARIANT_UNIFIED;
        else if (r_par)
            rq->variant = CPC_VARIANT_RING;
        else if (u_par)
            rq->variant = CPC_VARIANT_ULYSSES;
        else {
            /* Degrees given, none > 1: diffusers' "no parallelism" (CP001), or CP002. */
            rq->variant = CPC_VARIANT__COUNT;
            if (rq->o.r_given && rq->r < 1)
                cpc_status_append(&rq->pre, ERR(2, vspan(p, "parallel.ring_degree"), "ring_degree %d is < 1", rq->r));
            if (rq->o.u_given && rq->u < 1)
                cpc_status_append(&rq->pre,
                                  ERR(2, vspan(p, "parallel.ulysses_degree"), "ulysses_degree %d is < 1", rq->u));
            if (!rq->pre) {
                e = ERR(1, vspan(p, rq->o.u_given ? "parallel.ulysses_degree" : "parallel.ring_degree"),
                        "ring_degree and ulysses_degree are both 1: no parallelism (world_size %d)", P);
                add_note(e, vspan(p, "cluster.world_size"), "world_size %d is set here", P);
                cpc_status_append(&rq->pre, e);
            }
        }
    }
    return NULL;
}

/* The degrees of the plan's own candidate: given values, else derived. */
static void request_degrees(const cpc_plan *p, request *rq, int *R, int *U)
{
    cpc_variant v = rq->variant;
    int P = world(p);
    int dr, du;
    if (v == CPC_VARIANT_UNIFIED && !rq->o.r_given && !rq->o.u_given) {
        derive_unified(p, R, U);
        rq->o.unified_rule = true;
        return;
    }
    cpc_derive_degrees(p, v, &dr, &du);
    *R = rq->o.r_given ? rq->r : dr;
    *U = rq->o.u_given ? rq->u : du;
    if (v == CPC_VARIANT_UNIFIED) {
        /* One given: the other is P / it (truncated; CP003 reports a remainder). */
        if (rq->o.r_given && !rq->o.u_given)
            *U = (*R >= 1 && P / *R >= 1) ? P / *R : 1;
        else if (rq->o.u_given && !rq->o.r_given)
            *R = (*U >= 1 && P / *U >= 1) ? P / *U : 1;
    }
}

/* ------------------------------------------------------------------------ */
/* Candidates                                                               */
/* ------------------------------------------------------------------------ */

typedef struct clist {
    cpc_candidate *c;
    origin *o;
    int n, cap;
} clist;

static bool clist_insert(clist *l, int at, cpc_variant v, int R, int U, origin o)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        cpc_candidate *c = realloc(l->c, (size_t)cap * sizeof *c);
        if (!c)
            return false;
        l->c = c;
        origin *oo = realloc(l->o, (size_t)cap * sizeof *oo);
        if (!oo)
            return false;
        l->o = oo;
        l->cap = cap;
    }
    memmove(&l->c[at + 1], &l->c[at], (size_t)(l->n - at) * sizeof *l->c);
    memmove(&l->o[at + 1], &l->o[at], (size_t)(l->n - at) * sizeof *l->o);
    memset(&l->c[at], 0, sizeof l->c[at]);
    l->c[at].variant = v;
    l->c[at].ring_degree = R;
    l->c[at].ulysses_degree = U;
    l->c[at].cfg_degree = 1;
    l->c[at].tp_degree = 1;
    l->o[at] = o;
    l->n++;
    return true;
}

static bool clist_push(clist *l, cpc_variant v, int R, int U, origin o)
{
    return clist_insert(l, l->n, v, R, U, o);
}

/* Every variant for world_size P, in the SPEC tie order. */
static bool build_auto_list(const cpc_plan *p, clist *l)
{
    int P = world(p);
    origin o = NO_ORIGIN;
    if (P == 1)
        return clist_push(l, CPC_VARIANT_NONE, 1, 1, o);
    bool ok = clist_push(l, CPC_VARIANT_ULYSSES, 1, P, o);
    /* unified: every R x U = P with R, U > 1, U descending. */
    int n_uni = 0;
    for (int u = P / 2; u >= 2 && ok; u--) {
        if (P % u || P / u < 2)
            continue;
        ok = clist_push(l, CPC_VARIANT_UNIFIED, P / u, u, o);
        n_uni++;
    }
    if (ok && n_uni == 0) {
        int R, U;
        derive_unified(p, &R, &U);
        origin ou = o;
        ou.unified_rule = true;
        ok = clist_push(l, CPC_VARIANT_UNIFIED, R, U, ou);
    }
    ok = ok && clist_push(l, CPC_VARIANT_RING, P, 1, o);
    ok = ok && clist_push(l, CPC_VARIANT_ULYSSES_ANYTHING, 1, P, o);
    ok = ok && clist_push(l, CPC_VARIANT_RING_ANYTHING, P, 1, o);
    return ok;
}

/* Index in the tie order (none last). */
static int order_of(cpc_variant v)
{
    return v == CPC_VARIANT_NONE ? CPC_VARIANT_RING_ANYTHING + 1 : (int)v;
}

/* Puts the plan's own candidate into the list; returns its index or -1 on OOM. */
static int add_preferred(clist *l, cpc_variant v, int R, int U, origin o)
{
    for (int i = 0; i < l->n; i++)
        if (l->c[i].variant == v && l->c[i].ring_degree == R && l->c[i].ulysses_degree == U) {
            l->o[i] = o;
            return i;
        }
    int at = l->n;
    for (int i = 0; i < l->n; i++)
        if (order_of(l->c[i].variant) >= order_of(v)) {
            at = i;
            break;
        }
    return clist_insert(l, at, v, R, U, o) ? at : -1;
}

/* ------------------------------------------------------------------------ */
/* Selection (SPEC section 1 tie rule)                                      */
/* ------------------------------------------------------------------------ */

/* The time a candidate is chosen by: the whole step when the plan has
 * model.parameters (cost.h WHOLE STEP), else the attention forward. */
static double select_time(const cpc_candidate *c)
{
    if (c->measured)
        return c->measured_ms_per_step > 0 ? c->measured_ms_per_step : c->measured_ms_per_forward;
    return c->predicted_ms_per_step > 0 ? c->predicted_ms_per_step : c->predicted_ms_per_forward;
}

int cpc_select_best(const cpc_candidate *c, int n)
{
    int first_ok = -1;
    double lowest = 0;
    bool any_priced = false;
    for (int i = 0; i < n; i++) {
        if (!c[i].ok)
            continue;
        if (first_ok < 0)
            first_ok = i;
        if (c[i].priced && (!any_priced || select_time(&c[i]) < lowest)) {
            lowest = select_time(&c[i]);
            any_priced = true;
        }
    }
    if (!any_priced)
        return first_ok;
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!c[i].ok || !c[i].priced || select_time(&c[i]) > 1.02 * lowest)
            continue;
        if (best < 0 || c[i].memory_bytes_per_rank < c[best].memory_bytes_per_rank)
            best = i;
    }
    return best;
}

void cpc_selection_free(cpc_selection *sel)
{
    if (!sel)
        return;
    for (int i = 0; i < sel->n_candidates; i++)
        cpc_status_free(sel->candidates[i].errors);
    free(sel->candidates);
    sel->candidates = NULL;
    sel->n_candidates = 0;
    sel->selected = -1;
    sel->preferred = -1;
}

/* ------------------------------------------------------------------------ */
/* Hints: every suggestion is applied to the user's plan and validated      */
/* before it is offered                                                     */
/* ------------------------------------------------------------------------ */

/* A hint is one or more alternatives ("; or "), each a set of plan keys to
 * set, written as `--set` would take them ("parallel.variant: ring,
 * parallel.ulysses_degree: 1 runs this plan (ring 6x1)"; one key and value
 * per entry, in the order given).  The short form "variant A, B or C runs
 * this plan" means: set parallel.variant to any one of them, nothing else.
 * Before an alternative is offered, exactly its keys are applied to a copy
 * of the user's plan (explicit degrees and flags included) and the copy
 * must be accepted by this stage (stages 1-4, without falling back); the
 * "(variant RxU)" annotation is what the copy selects. */

typedef enum hkey {
    HK_VARIANT, HK_RING, HK_ULYSSES, HK_UA_FLAG, HK_RA_FLAG, HK_WORLD, HK_MASK, HK_MODE, HK_KV_HEADS,
    HK_ONE_SEGMENT, HK__COUNT
} hkey;

static const char *const HKEY_NAME[HK__COUNT] = {
    "parallel.variant", "parallel.ring_degree", "parallel.ulysses_degree", "parallel.ulysses_anything",
    "parallel.ring_anything", "cluster.world_size", "input.mask", "input.mode", "model.kv_heads",
    "input.segments",
};

typedef struct change {
    hkey key;
    int64_t val;        /* enum value, integer, 0/1 for flags, tokens for HK_ONE_SEGMENT */
} change;

typedef struct chset {
    int n;
    change c[HK__COUNT]; /* each key at most once, in the order set */
} chset;

static void chset_set(chset *cs, hkey key, int64_t val)
{
    for (int i = 0; i < cs->n; i++)
        if (cs->c[i].key == key) {
            cs->c[i].val = val;
            return;
        }
    cs->c[cs->n].key = key;
    cs->c[cs->n].val = val;
    cs->n++;
}

/* Memo of accepts() on the user's plan with a change set applied: the hint
 * search asks the same questions for many errors (every candidate of an
 * auto plan tries the same world sizes). */
typedef struct memo_ent {
    bool used, ok;
    chset cs;
    cpc_variant v;
    int R, U;
} memo_ent;

typedef struct memo {
    memo_ent *e;
    size_t cap, n;   /* cap: a power of two (0: empty) */
} memo;

typedef struct hctx {
    const cpc_plan *plan;
    const cpc_selection *sel;
    cpc_price_fn price;
    void *pctx;
    memo *memo;      /* mutable cache (NULL: none) */
} hctx;

static uint64_t chset_hash(const chset *cs)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < cs->n; i++) {
        h = (h ^ (uint64_t)cs->c[i].key) * 1099511628211ull;
        h = (h ^ (uint64_t)cs->c[i].val) * 1099511628211ull;
    }
    return h ^ (uint64_t)cs->n;
}

static bool chset_eq(const chset *a, const chset *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->c[i].key != b->c[i].key || a->c[i].val != b->c[i].val)
            return false;
    return true;
}

/* The slot of `cs` (used: found; else where to put it); NULL when empty. */
static memo_ent *memo_slot(memo *m, const chset *cs)
{
    if (!m || !m->cap)
        return NULL;
    size_t i = (size_t)chset_hash(cs) & (m->cap - 1);
    while (m->e[i].used && !chset_eq(&m->e[i].cs, cs))
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

/* Room for one more entry (false on OOM: the cache is just not used). */
static bool memo_grow(memo *m)
{
    if (m->cap && 2 * (m->n + 1) <= m->cap)
        return true;
    size_t cap = m->cap ? 2 * m->cap : 256;
    memo_ent *e = calloc(cap, sizeof *e);
    if (!e)
        return false;
    memo old = *m;
    m->e = e;
    m->cap = cap;
    m->n = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.e[i].used) {
            *memo_slot(m, &old.e[i].cs) = old.e[i];
            m->n++;
        }
    free(old.e);
    return true;
}

/* A copy of the plan at another world size (gpus_per_node re-defaulted when
 * the plan did not set it, as the loader does after a --set). */
static cpc_plan at_world(const cpc_plan *p, int P)
{
    cpc_plan q = *p;
    q.cluster.world_size = P;
    if (!has_key(p, "cluster.gpus_per_node"))
        q.cluster.gpus_per_node = P < 8 ? P : 8;
    return q;
}

/* The user's plan with `cs` applied, as `--set` would (a degree set to
 * n >= 1 is given; a flag set to false is unset).  The copy shares the
 * plan's memory; a one-segment change points into *seg, which must outlive
 * the copy. */
static cpc_plan apply(const cpc_plan *p, const chset *cs, cpc_segment *seg)
{
    cpc_plan q = *p;
    for (int i = 0; i < cs->n; i++) {
        int64_t v = cs->c[i].val;
        switch (cs->c[i].key) {
        case HK_VARIANT:
            q.parallel.variant = (cpc_variant)v;
            q.parallel.variant_given = true;
            break;
        case HK_RING: q.parallel.ring_degree = (int)v; break;
        case HK_ULYSSES: q.parallel.ulysses_degree = (int)v; break;
        case HK_UA_FLAG: q.parallel.ulysses_anything = v != 0; break;
        case HK_RA_FLAG: q.parallel.ring_anything = v != 0; break;
        case HK_WORLD: q = at_world(&q, (int)v); break;
        case HK_MASK: q.input.mask = (cpc_mask)v; break;
        case HK_MODE: q.input.mode = (cpc_mode)v; break;
        case HK_KV_HEADS: q.model.kv_heads = (int)v; break;
        case HK_ONE_SEGMENT:
            *seg = (cpc_segment){.name = (char *)"segment0", .tokens = v, .span = CPC_NO_SPAN};
            q.input.segments = seg;
            q.input.n_segments = 1;
            q.input.total_tokens = v;
            break;
        case HK__COUNT: break;
        }
    }
    return q;
}

/* Appends "key: value, key: value" for `cs`. */
static void print_changes(char **s, const chset *cs, int64_t world_mult)
{
    for (int i = 0; i < cs->n; i++) {
        const change *c = &cs->c[i];
        sappend(s, "%s%s: ", i ? ", " : "", HKEY_NAME[c->key]);
        switch (c->key) {
        case HK_VARIANT: sappend(s, "%s", vname((cpc_variant)c->val)); break;
        case HK_UA_FLAG:
        case HK_RA_FLAG: sappend(s, "%s", c->val ? "true" : "false"); break;
        case HK_MASK: sappend(s, "%s", cpc_mask_name((cpc_mask)c->val)); break;
        case HK_MODE: sappend(s, "%s", cpc_mode_name((cpc_mode)c->val)); break;
        case HK_ONE_SEGMENT: sappend(s, "[{tokens: %lld}]", (long long)c->val); break;
        case HK_WORLD: sappend(s, "%lld", (long long)(c->val * world_mult)); break;
        default: sappend(s, "%lld", (long long)c->val); break;
        }
    }
}

/* Does (v, R, U) pass stages 2-4 on `p`? */
static bool works(const hctx *h, const cpc_plan *p, cpc_variant v, int R, int U)
{
    origin o = {true, true, false, NULL};
    cpc_status *e = check_with_origin(p, v, R, U, &o);
    if (e) {
        cpc_status_free(e);
        return false;
    }
    if (!h->price)
        return true;
    cpc_candidate c;
    memset(&c, 0, sizeof c);
    c.variant = v;
    c.ring_degree = R;
    c.ulysses_degree = U;
    c.ok = true;
    cpc_status *st = h->price(h->pctx, p, &c);
    bool ok = !st && c.ok;
    cpc_status_free(st);
    cpc_status_free(c.errors);
    return ok;
}

/* The variant and degrees `q` asks for (stage 1 and the derived degrees);
 * false when it asks for auto, has no parallelism, or fails stage 1. */
/* The request of `q` (stage 1): false when it fails sanity or inference or
 * asks for no variant at all.  Nothing to free in *rq afterwards. */
static bool request_of(const cpc_plan *q, request *rq)
{
    cpc_status *e = check_sanity(q);
    if (e) {
        cpc_status_free(e);
        return false;
    }
    e = infer(q, rq);
    bool ok = !e && rq->variant != CPC_VARIANT__COUNT;
    cpc_status_free(e);
    cpc_status_free(rq->pre);
    rq->pre = NULL;
    return ok;
}

static bool resolve(const cpc_plan *q, cpc_variant *v, int *R, int *U)
{
    request rq;
    if (!request_of(q, &rq) || rq.variant == CPC_VARIANT_AUTO)
        return false;
    request_degrees(q, &rq, R, U);
    *v = rq.variant;
    return true;
}

/* Is `q` accepted by this stage without falling back?  *v, *R, *U: what it
 * selects. */
static bool accepts(const hctx *h, const cpc_plan *q, cpc_variant *v, int *R, int *U)
{
    request rq;
    if (!request_of(q, &rq))
        return false;
    if (rq.variant != CPC_VARIANT_AUTO) {
        request_degrees(q, &rq, R, U);
        *v = rq.variant;
        return works(h, q, *v, *R, *U);
    }
    /* auto: the tie rule among the valid candidates */
    clist l = {0};
    bool ok = build_auto_list(q, &l);
    for (int i = 0; ok && i < l.n; i++) {
        cpc_candidate *c = &l.c[i];
        c->errors = check_with_origin(q, c->variant, c->ring_degree, c->ulysses_degree, &l.o[i]);
        c->ok = c->errors == NULL;
        if (c->ok && h->price) {
            cpc_status *st = h->price(h->pctx, q, c);
            if (st || c->errors)
                c->ok = false;
            cpc_status_free(st);
        }
    }
    int best = ok ? cpc_select_best(l.c, l.n) : -1;
    if (best >= 0) {
        *v = l.c[best].variant;
        *R = l.c[best].ring_degree;
        *U = l.c[best].ulysses_degree;
    }
    for (int i = 0; i < l.n; i++)
        cpc_status_free(l.c[i].errors);
    free(l.c);
    free(l.o);
    return best >= 0;
}

/* accepts() on the user's plan with `cs` applied, memoised. */
static bool accepts_cs(const hctx *h, const chset *cs, cpc_variant *v, int *R, int *U)
{
    memo_ent *e = memo_slot(h->memo, cs);
    if (e && e->used) {
        *v = e->v;
        *R = e->R;
        *U = e->U;
        return e->ok;
    }
    cpc_segment seg;
    cpc_plan q = apply(h->plan, cs, &seg);
    *v = CPC_VARIANT__COUNT;
    *R = *U = 0;
    bool ok = accepts(h, &q, v, R, U);
    if (h->memo && memo_grow(h->memo)) {
        e = memo_slot(h->memo, cs);
        *e = (memo_ent){.used = true, .ok = ok, .cs = *cs, .v = *v, .R = *R, .U = *U};
        h->memo->n++;
    }
    return ok;
}

static bool degree_given(const cpc_plan *q, hkey k)
{
    if (k == HK_RING)
        return has_key(q, "parallel.ring_degree") || q->parallel.ring_degree != 0;
    return has_key(q, "parallel.ulysses_degree") || q->parallel.ulysses_degree != 0;
}

/* The changes, on top of `base`, that make the user's plan select exactly
 * (v, R, U): the variant key when the plan does not already ask for v,
 * anything-flags of another variant set to false, and every degree whose
 * value (written or derived) differs.  Verified: false when the result is
 * not accepted as (v, R, U). */
static bool reach(const hctx *h, const chset *base, cpc_variant v, int R, int U, chset *out)
{
    const cpc_plan *p = h->plan;
    for (int pass = 0; pass < 2; pass++) {
        chset cs = *base;
        if (pass == 1)
            chset_set(&cs, HK_VARIANT, v);
        cpc_segment seg;
        cpc_plan q = apply(p, &cs, &seg);
        if (q.parallel.ulysses_anything && v != CPC_VARIANT_ULYSSES_ANYTHING)
            chset_set(&cs, HK_UA_FLAG, 0);
        if (q.parallel.ring_anything && v != CPC_VARIANT_RING_ANYTHING)
            chset_set(&cs, HK_RA_FLAG, 0);
        if (degree_given(&q, HK_RING) && q.parallel.ring_degree != R)
            chset_set(&cs, HK_RING, R);
        if (degree_given(&q, HK_ULYSSES) && q.parallel.ulysses_degree != U)
            chset_set(&cs, HK_ULYSSES, U);
        bool settled = false;
        for (int k = 0; k < 3 && !settled; k++) {
            q = apply(p, &cs, &seg);
            cpc_variant v2;
            int r2, u2;
            if (!resolve(&q, &v2, &r2, &u2) || v2 != v)
                break;
            if (u2 != U)
                chset_set(&cs, HK_ULYSSES, U);
            else if (r2 != R)
                chset_set(&cs, HK_RING, R);
            else
                settled = true;
        }
        if (!settled)
            continue;
        cpc_variant sv;
        int sr, su;
        if (accepts_cs(h, &cs, &sv, &sr, &su) && sv == v && sr == R && su == U) {
            *out = cs;
            return true;
        }
    }
    return false;
}

/* `base` alone, when the plan with it is accepted; else, for a concrete
 * variant, `base` plus the changes that keep (v, R, U).  *sv, *sr, *su:
 * what the result selects. */
static bool try_changes(const hctx *h, const chset *base, cpc_variant v, int R, int U, chset *out,
                        cpc_variant *sv, int *sr, int *su)
{
    if (accepts_cs(h, base, sv, sr, su)) {
        *out = *base;
        return true;
    }
    /* an auto plan that the change alone does not make run: no variant
     * runs with it (auto tried them all) */
    if (v >= CPC_VARIANT_AUTO || h->sel->requested == CPC_VARIANT_AUTO || !reach(h, base, v, R, U, out))
        return false;
    *sv = v;
    *sr = R;
    *su = U;
    return true;
}

/* "CHANGES runs this plan", with "(variant RxU)" when a parallel or
 * cluster key changes. */
static char *alt_text(const hctx *h, const chset *cs, cpc_variant v, int R, int U)
{
    char *s = NULL;
    int C = h->plan->parallel.cfg_degree, T = h->plan->parallel.tp_degree;
    C = C >= 1 ? C : 1;
    T = T >= 1 ? T : 1;
    /* a sub-plan of a (C, T) split (cpc_plan_sub): world sizes are the user's */
    print_changes(&s, cs, (int64_t)C * T);
    sappend(&s, " runs this plan");
    bool par = false;
    for (int i = 0; i < cs->n; i++)
        par = par || cs->c[i].key <= HK_WORLD;
    if (par && C * T > 1)
        sappend(&s, " (%s %dx%d, cfg_degree %d, tp_degree %d)", vname(v), R, U, C, T);
    else if (par)
        sappend(&s, " (%s %dx%d)", vname(v), R, U);
    return s;
}

/* (a) the same variant with other degrees, among the valid candidates: the
 * one that needs the fewest changes. */
static char *hint_same_variant(const hctx *h, cpc_variant v, int R, int U)
{
    const chset none = {0};
    chset best = {0};
    int bi = -1;
    for (int i = 0; i < h->sel->n_candidates; i++) {
        const cpc_candidate *c = &h->sel->candidates[i];
        if (!c->ok || c->variant != v || (c->ring_degree == R && c->ulysses_degree == U))
            continue;
        chset cs;
        if (reach(h, &none, v, c->ring_degree, c->ulysses_degree, &cs) && (bi < 0 || cs.n < best.n)) {
            best = cs;
            bi = i;
        }
    }
    if (bi < 0)
        return NULL;
    const cpc_candidate *c = &h->sel->candidates[bi];
    return alt_text(h, &best, v, c->ring_degree, c->ulysses_degree);
}

/* (b) other variants at the same world_size, among the valid candidates:
 * "variant A, B or C runs this plan" for those that need only the variant
 * key; when there is none, the variant that needs the fewest changes. */
static char *hint_other_variants(const hctx *h, cpc_variant v)
{
    const chset none = {0};
    chset best[CPC_VARIANT__COUNT];
    int bi[CPC_VARIANT__COUNT];
    for (int k = 0; k < CPC_VARIANT__COUNT; k++)
        bi[k] = -1;
    for (int i = 0; i < h->sel->n_candidates; i++) {
        const cpc_candidate *c = &h->sel->candidates[i];
        if (!c->ok || c->variant == v)
            continue;
        chset cs;
        int w = c->variant;
        if (reach(h, &none, c->variant, c->ring_degree, c->ulysses_degree, &cs) &&
            (bi[w] < 0 || cs.n < best[w].n)) {
            best[w] = cs;
            bi[w] = i;
        }
    }
    char *s = NULL;
    int n_short = 0, n_total = 0, fewest = -1;
    for (int w = 0; w < CPC_VARIANT__COUNT; w++) {
        if (bi[w] < 0)
            continue;
        n_total++;
        if (best[w].n == 1 && best[w].c[0].key == HK_VARIANT)
            n_short++;
        if (fewest < 0 || best[w].n < best[fewest].n)
            fewest = w;
    }
    if (!n_total)
        return NULL;
    if (!n_short) {
        const cpc_candidate *c = &h->sel->candidates[bi[fewest]];
        return alt_text(h, &best[fewest], c->variant, c->ring_degree, c->ulysses_degree);
    }
    sappend(&s, "variant ");
    int k = 0;
    for (int w = 0; w < CPC_VARIANT__COUNT; w++) {
        if (bi[w] < 0 || !(best[w].n == 1 && best[w].c[0].key == HK_VARIANT))
            continue;
        if (k)
            sappend(&s, k == n_short - 1 ? " or " : ", ");
        k++;
        const cpc_candidate *c = &h->sel->candidates[bi[w]];
        if (c->variant == CPC_VARIANT_UNIFIED)
            sappend(&s, "unified %dx%d", c->ring_degree, c->ulysses_degree);
        else
            sappend(&s, "%s", vname(c->variant));
    }
    sappend(&s, " runs this plan");
    return s;
}

/* One alternative from `base` (see try_changes), as text; NULL when it
 * does not run the plan. */
static char *hint_changes(const hctx *h, const chset *base, cpc_variant v, int R, int U)
{
    chset cs;
    cpc_variant sv;
    int sr, su;
    if (!try_changes(h, base, v, R, U, &cs, &sv, &sr, &su))
        return NULL;
    return alt_text(h, &cs, sv, sr, su);
}

/* (c) a rule-specific change of the plan. */
static char *hint_rule(const hctx *h, int rule, cpc_variant v, int R, int U)
{
    const cpc_plan *p = h->plan;
    chset base = {0};
    switch (rule) {
    case 3: {
        int64_t prod = (int64_t)R * U;
        if (R < 1 || U < 1 || prod > MAX_WORLD)
            return NULL;
        chset_set(&base, HK_WORLD, prod);
        return hint_changes(h, &base, v, R, U);
    }
    case 18:
        chset_set(&base, HK_MODE, CPC_MODE_INFERENCE);
        return hint_changes(h, &base, v, R, U);
    case 19:
    case 24:
        chset_set(&base, HK_MASK, CPC_MASK_NONE);
        return hint_changes(h, &base, v, R, U);
    case 22: {
        chset_set(&base, HK_ONE_SEGMENT, p->input.total_tokens);
        char *s = hint_changes(h, &base, v, R, U);
        if (s)
            return s;
        base.n = 0;
        chset_set(&base, HK_MASK, CPC_MASK_NONE);
        return hint_changes(h, &base, v, R, U);
    }
    case 30: {
        int H = p->model.heads, Hkv = p->model.kv_heads;
        /* the divisors of H nearest to Hkv, below first */
        for (int d = 0; d < H; d++) {
            int cand[2] = {Hkv - d, Hkv + d};
            for (int k = 0; k < 2; k++) {
                int c = cand[k];
                if (c < 1 || c > H || H % c)
                    continue;
                base.n = 0;
                chset_set(&base, HK_KV_HEADS, c);
                char *s = hint_changes(h, &base, v, R, U);
                if (s)
                    return s;
            }
        }
        return NULL;
    }
    default: return NULL;
    }
}

/* (d) the nearest world size where the plan runs (as it is, else with the
 * same variant's derived degrees there). */
static char *hint_world(const hctx *h, cpc_variant v)
{
    const cpc_plan *p = h->plan;
    int P = world(p);
    int tries = 0;
    for (int d = 1; tries < HINT_WORLD_TRIES && d <= P + 1; d++) {
        int cand[2] = {P - d, P + d};
        for (int k = 0; k < 2; k++) {
            int w = cand[k];
            if (w < 1 || w > MAX_WORLD || (w == 1) != (v == CPC_VARIANT_NONE))
                continue;
            tries++;
            chset base = {0};
            chset_set(&base, HK_WORLD, w);
            int R = 1, U = 1;
            if (v < CPC_VARIANT_AUTO) {
                cpc_segment seg;
                cpc_plan q = apply(p, &base, &seg);
                cpc_derive_degrees(&q, v, &R, &U);
            }
            char *s = hint_changes(h, &base, v, R, U);
            if (s)
                return s;
        }
    }
    return NULL;
}

static char *find_hint(const hctx *h, int rule, cpc_variant v, int R, int U)
{
    char *s = NULL;
    if (rule == 3) {
        s = hint_rule(h, rule, v, R, U);
        char *more = v < CPC_VARIANT__COUNT ? hint_same_variant(h, v, R, U) : NULL;
        if (!more)
            more = hint_other_variants(h, v);
        if (more) {
            if (s)
                sappend(&s, "; or %s", more);
            else
                s = strdup(more);
            free(more);
        }
        return s;
    }
    if (v < CPC_VARIANT__COUNT && (s = hint_same_variant(h, v, R, U)))
        return s;
    if ((s = hint_other_variants(h, v)))
        return s;
    if (v >= CPC_VARIANT__COUNT)
        return NULL;
    if ((s = hint_rule(h, rule, v, R, U)))
        return s;
    return hint_world(h, v);
}

/* Clones `errs` and attaches a validated hint to every error. */
static cpc_status *with_hints(const hctx *h, const cpc_status *errs, cpc_variant v, int R, int U)
{
    cpc_status *out = NULL;
    for (const cpc_status *e = errs; e; e = e->next) {
        cpc_status *c = clone_one(e);
        if (c != &cpc_status_oom && e->severity == CPC_SEV_ERROR && !c->hint) {
            char *hint = find_hint(h, e->rule, v, R, U);
            if (hint)
                cpc_status_set_hint(c, "%s", hint);
            free(hint);
        }
        cpc_status_append(&out, c);
    }
    return out;
}

/* ------------------------------------------------------------------------ */
/* The stage                                                                */
/* ------------------------------------------------------------------------ */

static bool reached_shapes(const cpc_status *errs)
{
    for (; errs; errs = errs->next)
        if (errs->rule >= 10 && errs->rule <= 39)
            return true;
    return false;
}

/* ------------------------------------------------------------------------ */
/* The outer axes: cfg_degree and tp_degree (validate.h THE OUTER AXES)     */
/* ------------------------------------------------------------------------ */

static cpc_status *validate_rxu(const cpc_plan *p, cpc_price_fn price, void *pctx, cpc_selection *sel);

static bool tp_heads_ok(const cpc_plan *p, int T)
{
    int H = p->model.heads, Hkv = p->model.kv_heads;
    return T >= 1 && H % T == 0 && Hkv >= 1 && (Hkv % T == 0 || T % Hkv == 0);
}

/* C or T as written: omitted -> 1; CPC_DEGREE_AUTO stays. */
static int axis_of(const cpc_plan *p, bool tp)
{
    int v = tp ? p->parallel.tp_degree : p->parallel.cfg_degree;
    return v == 0 ? 1 : v;
}

/* Does `q` (the user's plan with one change) validate without error?
 * *desc: what it selects, as a hint annotation. */
static bool axes_accept(const cpc_plan *q, cpc_price_fn price, void *pctx, char *desc, size_t n)
{
    cpc_selection s;
    cpc_status *d = cpc_validate_priced(q, price, pctx, &s);
    bool ok = !cpc_status_has_error(d) && s.selected >= 0;
    if (ok) {
        const cpc_candidate *c = &s.candidates[s.selected];
        snprintf(desc, n, "%s %dx%d, cfg_degree %d, tp_degree %d", vname(c->variant), c->ring_degree,
                 c->ulysses_degree, c->cfg_degree, c->tp_degree);
    }
    cpc_status_free(d);
    cpc_selection_free(&s);
    return ok;
}

/* A hint for an axis rule: other values of the axis (divisors of P, the
 * nearest first), or for CP003 also the nearest world sizes; each applied
 * to a copy of the plan and validated.  NULL when none runs. */
static char *axis_hint(const cpc_plan *p, cpc_price_fn price, void *pctx, int rule, bool tp)
{
    int P = world(p);
    int cur = axis_of(p, tp);
    int other = axis_of(p, !tp);
    other = other >= 1 ? other : 1;
    char desc[128];
    const char *key = tp ? "parallel.tp_degree" : "parallel.cfg_degree";
    for (int d = 1; d <= P + (cur > 0 ? cur : 0); d++) {
        int vals[2] = {cur - d, cur + d};
        for (int k = 0; k < 2; k++) {
            int v = vals[k];
            if (v < 1 || v > P || P % v)
                continue;
            cpc_plan q = *p;
            if (tp)
                q.parallel.tp_degree = v;
            else
                q.parallel.cfg_degree = v;
            cpc_plan sub;
            if (!cpc_plan_sub(&q, tp ? other : v, tp ? v : other, &sub))
                continue;
            if (axes_accept(&q, price, pctx, desc, sizeof desc)) {
                char *s = NULL;
                sappend(&s, "%s: %d runs this plan (%s)", key, v, desc);
                return s;
            }
        }
    }
    if (rule == 3) {
        int64_t ct = (int64_t)(axis_of(p, false) >= 1 ? axis_of(p, false) : 1) * other;
        if (!tp)
            ct = (int64_t)cur * (axis_of(p, true) >= 1 ? axis_of(p, true) : 1);
        for (int64_t w = (P / ct) * ct; w <= (P / ct + 1) * ct; w += ct) {
            if (w < 1 || w > MAX_WORLD)
                continue;
            cpc_plan q = at_world(p, (int)w);
            int qc = axis_of(&q, false), qt = axis_of(&q, true);
            cpc_plan sub;
            /* only a world where the axis rules pass (no recursion into hints) */
            if (!cpc_plan_sub(&q, qc >= 1 ? qc : 1, qt >= 1 ? qt : 1, &sub))
                continue;
            if (axes_accept(&q, price, pctx, desc, sizeof desc)) {
                char *s = NULL;
                sappend(&s, "cluster.world_size: %lld runs this plan (%s)", (long long)w, desc);
                return s;
            }
        }
    }
    return NULL;
}

/* CP003 / CP005 / CP006 for the written values (auto: 1), with hints. */
static cpc_status *check_axes(const cpc_plan *p, cpc_price_fn price, void *pctx)
{
    int C = axis_of(p, false), T = axis_of(p, true);
    bool Ca = C == CPC_DEGREE_AUTO, Ta = T == CPC_DEGREE_AUTO;
    C = Ca ? 1 : C;
    T = Ta ? 1 : T;
    int P = world(p), B = p->input.batch, H = p->model.heads, Hkv = p->model.kv_heads;
    cpc_status *errs = NULL, *e;
    if (P % ((int64_t)C * T) != 0) {
        bool tkey = !Ta && T > 1;
        e = ERR(3, vspan(p, tkey ? "parallel.tp_degree" : "parallel.cfg_degree"),
                "world_size must equal C*T*R*U: world_size %d is not divisible by cfg_degree %d x tp_degree %d "
                "= %lld (%d = %lld*%lld + %lld)",
                P, C, T, (long long)C * T, P, (long long)C * T, (long long)(P / ((int64_t)C * T)),
                (long long)(P % ((int64_t)C * T)));
        add_note(e, vspan(p, "cluster.world_size"), "world_size %d is set here", P);
        char *hint = axis_hint(p, price, pctx, 3, tkey);
        if (hint)
            cpc_status_set_hint(e, "%s", hint);
        free(hint);
        cpc_status_append(&errs, e);
    }
    if (B % C != 0) {
        e = ERR(5, vspan(p, "parallel.cfg_degree"),
                "batch %d not divisible by cfg_degree %d (%d = %d*%d + %d): a cfg group holds batch items "
                "[c*B/C, (c+1)*B/C)", B, C, B, C, B / C, B % C);
        add_note(e, vspan(p, "input.batch"), "batch %d is set here", B);
        char *hint = axis_hint(p, price, pctx, 5, false);
        if (hint)
            cpc_status_set_hint(e, "%s", hint);
        free(hint);
        cpc_status_append(&errs, e);
    }
    if (!tp_heads_ok(p, T)) {
        if (H % T != 0)
            e = ERR(6, vspan(p, "parallel.tp_degree"),
                    "heads %d not divisible by tp_degree %d (%d = %d*%d + %d)", H, T, H, T, H / T, H % T);
        else
            e = ERR(6, vspan(p, "parallel.tp_degree"),
                    "kv_heads %d is neither divisible by tp_degree %d nor a divisor of it (K/V heads are "
                    "split with their query heads or replicated)", Hkv, T);
        add_note(e, vspan(p, H % T != 0 ? "model.heads" : "model.kv_heads"), "%s %d is set here",
                 H % T != 0 ? "heads" : "kv_heads", H % T != 0 ? H : Hkv);
        char *hint = axis_hint(p, price, pctx, 6, true);
        if (hint)
            cpc_status_set_hint(e, "%s", hint);
        free(hint);
        cpc_status_append(&errs, e);
    }
    return errs;
}

static bool sel_append(cpc_selection *dst, cpc_selection *src, int C, int T)
{
    if (src->n_candidates == 0)
        return true;
    cpc_candidate *c = realloc(dst->candidates, (size_t)(dst->n_candidates + src->n_candidates) * sizeof *c);
    if (!c)
        return false;
    dst->candidates = c;
    for (int i = 0; i < src->n_candidates; i++) {
        src->candidates[i].cfg_degree = C;
        src->candidates[i].tp_degree = T;
        c[dst->n_candidates + i] = src->candidates[i];
    }
    dst->n_candidates += src->n_candidates;
    free(src->candidates);
    src->candidates = NULL;
    src->n_candidates = 0;
    return true;
}

/* Per (C, T) pair: where its candidates start in the merged list, its own
 * selection and preferred index (merged), its fallback and diagnostics. */
typedef struct axis_pair {
    int base, selected, preferred;
    bool fell_back;
    cpc_status *diags;
} axis_pair;

static void pairs_free(axis_pair *pr, int n)
{
    for (int i = 0; i < n; i++)
        cpc_status_free(pr[i].diags);
    free(pr);
}

static cpc_status *validate_axes(const cpc_plan *p, cpc_price_fn price, void *pctx, cpc_selection *sel)
{
    int Cw = axis_of(p, false), Tw = axis_of(p, true);
    bool Ca = Cw == CPC_DEGREE_AUTO, Ta = Tw == CPC_DEGREE_AUTO;
    if (!Ca && !Ta && Cw == 1 && Tw == 1)
        return validate_rxu(p, price, pctx, sel);
    cpc_status *diags = check_axes(p, price, pctx);
    if (diags)
        return diags;
    int P = world(p);
    axis_pair *pr = NULL;
    int n = 0, cap = 0;
    cpc_variant requested = CPC_VARIANT__COUNT;
    for (int C = 1; C <= P; C++) {
        if ((!Ca && C != Cw) || P % C)
            continue;
        for (int T = 1; T <= P / C; T++) {
            if ((!Ta && T != Tw) || (P / C) % T)
                continue;
            cpc_plan q;
            if (!cpc_plan_sub(p, C, T, &q))
                continue;
            if (n == cap) {
                int nc = cap ? 2 * cap : 16;
                axis_pair *g = realloc(pr, (size_t)nc * sizeof *g);
                if (!g) {
                    pairs_free(pr, n);
                    return &cpc_status_oom;
                }
                pr = g;
                cap = nc;
            }
            cpc_selection s;
            cpc_status *d = validate_rxu(&q, price, pctx, &s);
            int base = sel->n_candidates;
            pr[n] = (axis_pair){base, s.selected >= 0 ? base + s.selected : -1,
                                s.preferred >= 0 ? base + s.preferred : -1, s.fell_back, d};
            n++;
            /* requested: the variant the plan asks for (a pair with one
             * rank per group infers none from auto) */
            if (requested == CPC_VARIANT__COUNT || requested == CPC_VARIANT_NONE)
                requested = s.requested;
            bool fatal = d == &cpc_status_oom || (d && d->code != CPC_E_PLAN);
            if (fatal || !sel_append(sel, &s, C, T)) {
                cpc_selection_free(&s);
                if (fatal)
                    pr[n - 1].diags = NULL;
                pairs_free(pr, n);
                return fatal ? d : &cpc_status_oom;
            }
        }
    }
    sel->requested = requested;
    int b;
    if (requested == CPC_VARIANT_AUTO || requested == CPC_VARIANT_NONE) {
        /* variant auto: the tie rule over every pair's candidates */
        b = cpc_select_best(sel->candidates, sel->n_candidates);
    } else {
        /* an explicit variant: the best of the pairs' own selections */
        cpc_candidate *c = sel->candidates;
        bool *was = malloc((size_t)(sel->n_candidates > 0 ? sel->n_candidates : 1) * sizeof *was);
        if (!was) {
            pairs_free(pr, n);
            return &cpc_status_oom;
        }
        for (int i = 0; i < sel->n_candidates; i++) {
            was[i] = c[i].ok;
            c[i].ok = false;
        }
        for (int i = 0; i < n; i++)
            if (pr[i].selected >= 0)
                c[pr[i].selected].ok = was[pr[i].selected];
        b = cpc_select_best(c, sel->n_candidates);
        for (int i = 0; i < sel->n_candidates; i++)
            c[i].ok = was[i];
        free(was);
    }
    int win = -1;
    for (int i = 0; i < n && b >= 0; i++)
        if (pr[i].base <= b)
            win = i;
    sel->selected = b;
    int keep = win >= 0 ? win : 0;
    if (n > 0) {
        sel->preferred = pr[keep].preferred;
        sel->fell_back = win >= 0 && pr[keep].fell_back;
        diags = pr[keep].diags;
        pr[keep].diags = NULL;
        /* a winner's fallback warning is its own pair's */
    }
    pairs_free(pr, n);
    return diags;
}

cpc_status *cpc_validate_priced(const cpc_plan *p, cpc_price_fn price, void *pctx, cpc_selection *sel)
{
    memset(sel, 0, sizeof *sel);
    sel->selected = -1;
    sel->preferred = -1;
    sel->requested = CPC_VARIANT__COUNT;
    if (!p)
        return cpc_error(CPC_E_INTERNAL, "cpc_validate: no plan");

    cpc_status *diags = check_sanity(p);
    if (diags)
        return diags;

    /* parallel.cfg_degree / tp_degree (SPEC section 1, "All four axes"): a
     * degree < 1 (other than auto) is CP002. */
    static const char *const axis_key[2] = {"parallel.cfg_degree", "parallel.tp_degree"};
    const int axis_val[2] = {p->parallel.cfg_degree, p->parallel.tp_degree};
    for (int i = 0; i < 2; i++) {
        if (!has_key(p, axis_key[i]) || axis_val[i] == CPC_DEGREE_AUTO || axis_val[i] >= 1)
            continue;
        cpc_status_append(&diags, cpc_diag(CPC_E_PLAN, 2, CPC_SEV_ERROR, vspan(p, axis_key[i]),
                                           "%s is %d, must be >= 1", axis_key[i], axis_val[i]));
    }
    if (diags)
        return diags;
    return validate_axes(p, price, pctx, sel);
}

/* Ring x Ulysses validation of one (sub-)plan: everything after sanity. */
static cpc_status *validate_rxu(const cpc_plan *p, cpc_price_fn price, void *pctx, cpc_selection *sel)
{
    cpc_status *diags = NULL;
    memset(sel, 0, sizeof *sel);
    sel->selected = -1;
    sel->preferred = -1;
    sel->requested = CPC_VARIANT__COUNT;
    /* Stage 1: inference (CP105). */
    request rq;
    diags = infer(p, &rq);
    if (diags)
        return diags;
    sel->requested = rq.variant;

    /* Candidates. */
    clist l = {0};
    if (!build_auto_list(p, &l))
        goto oom;
    int R0 = 0, U0 = 0;
    if (rq.variant != CPC_VARIANT_AUTO && rq.variant != CPC_VARIANT__COUNT) {
        request_degrees(p, &rq, &R0, &U0);
        sel->preferred = add_preferred(&l, rq.variant, R0, U0, rq.o);
        if (sel->preferred < 0)
            goto oom;
    }
    sel->candidates = l.c;
    sel->n_candidates = l.n;

    /* Stages 2 and 3 per candidate, stage 4 through the price callback. */
    for (int i = 0; i < l.n; i++) {
        cpc_candidate *c = &l.c[i];
        c->errors = check_with_origin(p, c->variant, c->ring_degree, c->ulysses_degree, &l.o[i]);
        c->ok = c->errors == NULL;
    }
    if (price) {
        for (int i = 0; i < l.n; i++) {
            if (!l.c[i].ok)
                continue;
            cpc_status *st = price(pctx, p, &l.c[i]);
            if (st) {
                free(l.o);
                cpc_status_free(rq.pre);
                return st;
            }
            if (l.c[i].errors)
                l.c[i].ok = false;
        }
    }

    memo hmemo = {NULL, 0, 0};
    hctx h = {p, sel, price, pctx, &hmemo};
    bool stage3 = false;
    if (rq.variant == CPC_VARIANT_AUTO) {
        sel->selected = cpc_select_best(l.c, l.n);
        if (sel->selected < 0) {
            /* Nothing runs: every candidate's errors, each distinct one once. */
            for (int i = 0; i < l.n; i++) {
                const cpc_candidate *c = &l.c[i];
                for (const cpc_status *e = c->errors; e; e = e->next) {
                    bool dup = false;
                    for (const cpc_status *d = diags; d && !dup; d = d->next)
                        dup = d->rule == e->rule && same_span(d->span, e->span) &&
                              strcmp(d->message, e->message) == 0;
                    if (dup)
                        continue;
                    cpc_status *one = clone_one(e);
                    if (one != &cpc_status_oom && e->severity == CPC_SEV_ERROR) {
                        char *hint = find_hint(&h, e->rule, c->variant, c->ring_degree, c->ulysses_degree);
                        if (hint)
                            cpc_status_set_hint(one, "%s", hint);
                        free(hint);
                    }
                    cpc_status_append(&diags, one);
                }
                stage3 = stage3 || reached_shapes(c->errors);
            }
        }
    } else {
        const cpc_status *perr;
        cpc_variant pv;
        int pr, pu;
        if (sel->preferred >= 0) {
            const cpc_candidate *pc = &l.c[sel->preferred];
            perr = pc->ok ? NULL : pc->errors;
            pv = pc->variant;
            pr = pc->ring_degree;
            pu = pc->ulysses_degree;
        } else {
            perr = rq.pre;
            pv = CPC_VARIANT__COUNT;
            pr = rq.r;
            pu = rq.u;
        }
        if (!perr) {
            sel->selected = sel->preferred;
        } else {
            int best = p->parallel.fallback == CPC_FALLBACK_AUTO ? cpc_select_best(l.c, l.n) : -1;
            if (best >= 0) {
                const cpc_candidate *b = &l.c[best];
                sel->selected = best;
                sel->fell_back = true;
                char *codes = NULL;
                char rb[8];
                int nerr = 0;
                for (const cpc_status *e = perr; e; e = e->next) {
                    if (e->severity != CPC_SEV_ERROR)
                        continue;
                    bool again = false;
                    for (const cpc_status *f = perr; f != e; f = f->next)
                        again = again || (f->severity == CPC_SEV_ERROR && f->rule == e->rule);
                    if (!again)
                        sappend(&codes, "%s%s", nerr++ ? ", " : "", cpc_rule_str(e->rule, rb));
                }
                char pdesc[64];
                if (pv < CPC_VARIANT__COUNT)
                    snprintf(pdesc, sizeof pdesc, "variant %s %dx%d", vname(pv), pr, pu);
                else
                    snprintf(pdesc, sizeof pdesc, "the plan's degrees");
                cpc_status *w = cpc_diag(CPC_E_PLAN, first_rule(perr), CPC_SEV_WARNING,
                                         vspan(p, "parallel.fallback"),
                                         "fallback: auto: %s is rejected (%s); using %s %dx%d instead", pdesc,
                                         codes ? codes : "?", vname(b->variant), b->ring_degree,
                                         b->ulysses_degree);
                free(codes);
                for (const cpc_status *e = perr; e; e = e->next) {
                    char *line = NULL;
                    sappend(&line, "%s%s%s", e->rule ? cpc_rule_str(e->rule, rb) : "", e->rule ? ": " : "",
                            e->message);
                    cpc_status_add_note(w, e->span, "%s", line ? line : e->message);
                    free(line);
                }
                cpc_status_append(&diags, w);
                stage3 = true;
            } else {
                cpc_status_append(&diags, with_hints(&h, perr, pv, pr, pu));
                if (p->parallel.fallback == CPC_FALLBACK_AUTO && diags) {
                    cpc_status_add_note(diags, vspan(p, "parallel.fallback"),
                                        "fallback: auto found no other variant that runs this plan");
                }
                stage3 = reached_shapes(perr);
            }
        }
    }
    if (sel->selected >= 0)
        stage3 = true;

    /* CP031 (stage 3, once per plan). */
    if (stage3 && p->model.head_dim % 8 != 0) {
        cpc_status *w = cpc_diag(CPC_E_PLAN, 31, CPC_SEV_WARNING, vspan(p, "model.head_dim"),
                                 "head_dim %d is not a multiple of 8: the GPU attention paths (cuDNN, tensor "
                                 "cores) cannot serve it; the CPU path can",
                                 p->model.head_dim);
        cpc_status_append(&diags, w);
    }
    free(l.o);
    free(hmemo.e);
    cpc_status_free(rq.pre);
    return diags;

oom:
    for (int i = 0; i < l.n; i++)
        cpc_status_free(l.c[i].errors);
    free(l.c);
    free(l.o);
    cpc_status_free(rq.pre);
    sel->candidates = NULL;
    sel->n_candidates = 0;
    return &cpc_status_oom;
}

cpc_status *cpc_validate(const cpc_plan *plan, cpc_selection *sel)
{
    return cpc_validate_priced(plan, NULL, NULL, sel);
}
