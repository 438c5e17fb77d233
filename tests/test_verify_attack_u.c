/*
 * test_verify_attack_u.c - the backward prover's CLASSES OF U
 * (compiler/verify_bwd.c uclass_build, uc_union, uc_shared_heads, uc_whole;
 * verify_bwd.h "CLASSES OF U") and its message layer attacked (issue 21,
 * helper redteam2).  Beyond 256 ranks only the class proof decides, so a
 * program it accepts wrongly runs with wrong gradients.
 *
 *   - fuzz_classes_against_enumeration: the backward programs of
 *     ulysses_anything, ulysses and unified over random geometries (H below,
 *     at and above U; one K/V head, K/V = H, GQA groups straddling members,
 *     parts inside one group, up to 64 classes and past them; replicated
 *     texts: the twin), each edited 0-2 times by operators that the
 *     prover's own mutant tests lack (a buffer's heads / tokens / role
 *     changed, an op duplicated, dropped, moved, an all_to_all's direction
 *     or reduce flipped, operands retargeted or permuted, guards), proven by
 *     default (classes where they apply) and by enumerating every rank:
 *     the default must never accept what the enumeration refuses.  Rounds:
 *     CPC_ATTACK_U_ROUNDS (default 1200 per geometry family: half from a
 *     fixed seed, half from the clock, printed; CPC_TEST_SEED=N replays).
 *   - planted_faults_beyond_enumeration: at 300 to 65536 members (only the
 *     class proof runs) faults planted by construction in geometries chosen
 *     for the class code's edges (two regions, one K/V head, K/V = H, GQA
 *     groups straddling members of one region only, parts inside a group,
 *     more than 64 residues: every member simulated, unified R x U, a
 *     replicated text: the twin); whether a dK/dV reduce is needed is
 *     decided independently by sweeping every member's K/V heads
 *     (cpc_layout_kv_heads), not by the prover.  Each fault is also planted
 *     at a small world of the same kind, where the enumeration must agree
 *     with the expected verdict (so the expectations are checked too).
 *   - message_layer_with_members: the tamper classes of issue 21 (groups
 *     swapped, an in-flight buffer read-modify-written, a wait before its
 *     recv is posted, a request never waited, a tag reused while in flight)
 *     planted in unified R x U programs (ring messages of every member),
 *     at 4 x 3 (enumeration agrees) and 1024 x 3 / 300 x 5 (symbolic alone),
 *     and in ring 4 / ring 1024.
 *   - loop_faults_with_classes: faults on one step of the ring loop (a step
 *     skipped, a count off by one, a recv one block off from step 3 on, the
 *     text block on two steps) in unified R x U with classes and the twin, up
 *     to 4096 x 7; two correct placements of the text block proven.
 *   - numeric_judgement_of_class_mutants: role-keeping edits (every edit
 *     with CPC_ATTACK_U_ALL_EDITS=1) of small worlds with uneven heads and
 *     GQA; every proven mutant runs on the CPU executor and must match the
 *     float64 reference (CPC_ATTACK_U_NUMERIC sets the count, default 120).
 *   - classes_fall_back_to_every_member: programs whose summed gradient is
 *     not the same seen from every member (uc_whole): every member is
 *     simulated instead, and the verdicts match the enumeration.
 *   - head_part_from_another_member, exchanges_between_members_judged_
 *     numerically: K/V parts and partial dK/dV sent between ulysses members
 *     (the message rule of main's 4c9df2c): wrong ones refused, every proven
 *     one run on the CPU executor against float64 (CPC_ATTACK_U_XCH).
 * CPC_ATTACK_VERBOSE=1 prints every verdict.  Findings and counts:
 * /work/notes/redteam2-note.md (none unsound).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "artifact.h"
#include "cpc/compiler.h"
#include "expr.h"
#include "layout.h"
#include "plan.h"
#include "program.h"
#include "run.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "verify.h"
#include "verify_bwd.h"

#include "test_bwd_program.h"
#include "test_random.h"

static cpc_expr *expr_of(const char *t)
{
    cpc_expr *e = NULL;
    cpc_status *st = cpc_expr_parse(t, CPC_NO_SPAN, &e);
    cr_assert_null(st, "%s: %s", t, st ? st->message : "");
    return e;
}

static void set_when(cpc_op *op, const char *t)
{
    cpc_expr_free(op->when);
    op->when = expr_of(t);
}

static const char *const vnames[4] = {"ulysses_anything", "ulysses", "unified", "ring"};
static const cpc_variant vkinds[4] = {CPC_VARIANT_ULYSSES_ANYTHING, CPC_VARIANT_ULYSSES, CPC_VARIANT_UNIFIED,
                                      CPC_VARIANT_RING};

/* ---- the fuzz ---------------------------------------------------------- */

typedef struct fz {
    uint64_t seed;
    uint32_t round, i;
} fz;

static uint32_t fz_rn(fz *z, uint32_t n) { return test_bits_at(z->seed, z->round, z->i++) % n; }

/* A deep copy of op s into d (expressions and body). */
static void clone_op(cpc_op *d, const cpc_op *s)
{
    *d = *s;
    d->peer = cpc_expr_clone(s->peer);
    d->block = cpc_expr_clone(s->block);
    d->when = cpc_expr_clone(s->when);
    d->count = cpc_expr_clone(s->count);
    d->body = NULL;
    if (s->kind == CPC_OP_LOOP && s->n_body > 0) {
        d->body = malloc(sizeof *d->body * (size_t)s->n_body);
        cr_assert_not_null(d->body);
        for (int i = 0; i < s->n_body; i++)
            clone_op(&d->body[i], &s->body[i]);
    }
}

/* One edit of p, described into log. */
static void fz_mutate(fz *z, cpc_program *p, char *log, size_t ln)
{
    cpc_op **opsp = &p->ops;
    int *np = &p->n_ops;
    for (int j = 0; j < p->n_ops; j++)
        if (p->ops[j].kind == CPC_OP_LOOP && fz_rn(z, 2)) {
            opsp = &p->ops[j].body;
            np = &p->ops[j].n_body;
            break;
        }
    int n = *np;
    if (n == 0)
        return;
    int j = (int)fz_rn(z, (uint32_t)n);
    cpc_op *op = &(*opsp)[j];
    size_t L = strlen(log);
    switch (fz_rn(z, 16)) {
    case 12:
        if (op->kind == CPC_OP_SEND || op->kind == CPC_OP_RECV || op->kind == CPC_OP_WAIT) {
            op->tag = (int)fz_rn(z, 3);
            snprintf(log + L, ln - L, " op%d tag=%d", j, op->tag);
        }
        break;
    case 13:
        if (op->group != CPC_GROUP_NONE) {
            op->group = (cpc_group)(1 + fz_rn(z, 3));
            snprintf(log + L, ln - L, " op%d group=%d", j, (int)op->group);
        }
        break;
    case 14:
        if (op->peer) {
            static const char *const pe[] = {"(r+1)%R", "(r-1)%R", "(r+2)%R", "r", "(u+1)%U", "0"};
            const char *t = pe[fz_rn(z, 6)];
            cpc_expr_free(op->peer);
            op->peer = expr_of(t);
            snprintf(log + L, ln - L, " op%d peer=%s", j, t);
        }
        break;
    case 15:
        if (op->block) {
            static const char *const bl[] = {"(r-s)%R", "(r-s-1)%R", "r", "(r+1)%R", "(r-s+1)%R", "0"};
            const char *t = bl[fz_rn(z, 6)];
            cpc_expr_free(op->block);
            op->block = expr_of(t);
            snprintf(log + L, ln - L, " op%d block=%s", j, t);
        }
        break;
    case 0: {
        int b = (int)fz_rn(z, (uint32_t)p->n_buffers);
        p->buffers[b].heads = (cpc_buf_heads)fz_rn(z, CPC_HEADS__COUNT);
        snprintf(log + L, ln - L, " %s.heads=%d", p->buffers[b].name, (int)p->buffers[b].heads);
        break;
    }
    case 1: {
        int b = (int)fz_rn(z, (uint32_t)p->n_buffers);
        p->buffers[b].tokens = (cpc_buf_tokens)fz_rn(z, CPC_TOK__COUNT);
        snprintf(log + L, ln - L, " %s.tokens=%d", p->buffers[b].name, (int)p->buffers[b].tokens);
        break;
    }
    case 2: {
        int b = (int)fz_rn(z, (uint32_t)p->n_buffers);
        p->buffers[b].role = (cpc_buf_role)fz_rn(z, CPC_ROLE__COUNT);
        snprintf(log + L, ln - L, " %s.role=%d", p->buffers[b].name, (int)p->buffers[b].role);
        break;
    }
    case 3:
        if (op->kind == CPC_OP_ALL_TO_ALL) {
            op->reduce = !op->reduce;
            snprintf(log + L, ln - L, " op%d reduce flipped", j);
        }
        break;
    case 4:
        if (op->kind == CPC_OP_ALL_TO_ALL) {
            op->dir = op->dir == CPC_A2A_SEQ_TO_HEADS ? CPC_A2A_HEADS_TO_SEQ : CPC_A2A_SEQ_TO_HEADS;
            snprintf(log + L, ln - L, " op%d dir flipped", j);
        }
        break;
    case 5: { /* duplicated (the copy right after) */
        cpc_op *v = realloc(*opsp, sizeof *v * (size_t)(n + 1));
        cr_assert_not_null(v);
        memmove(&v[j + 1], &v[j], sizeof *v * (size_t)(n - j));
        clone_op(&v[j + 1], &v[j]);
        *opsp = v;
        (*np)++;
        snprintf(log + L, ln - L, " op%d duplicated", j);
        break;
    }
    case 6:
        set_when(op, "0");
        snprintf(log + L, ln - L, " op%d dropped", j);
        break;
    case 7:
        if (op->n_in) {
            int a = (int)fz_rn(z, (uint32_t)op->n_in), b = (int)fz_rn(z, (uint32_t)p->n_buffers);
            op->in[a] = b;
            snprintf(log + L, ln - L, " op%d in[%d]=%s", j, a, p->buffers[b].name);
        }
        break;
    case 8:
        if (op->n_out) {
            int a = (int)fz_rn(z, (uint32_t)op->n_out), b = (int)fz_rn(z, (uint32_t)p->n_buffers);
            op->out[a] = b;
            snprintf(log + L, ln - L, " op%d out[%d]=%s", j, a, p->buffers[b].name);
        }
        break;
    case 9: {
        static const char *const w[] = {"0", "s>0", "r==0", "1", "s<R-1"};
        const char *t = w[fz_rn(z, 5)];
        set_when(op, t);
        snprintf(log + L, ln - L, " op%d when=%s", j, t);
        break;
    }
    case 10:
        if (j + 1 < n) {
            cpc_op t = (*opsp)[j];
            (*opsp)[j] = (*opsp)[j + 1];
            (*opsp)[j + 1] = t;
            snprintf(log + L, ln - L, " op%d moved down", j);
        }
        break;
    default:
        if (op->n_in >= 2) {
            int a = (int)fz_rn(z, (uint32_t)op->n_in), b = (int)fz_rn(z, (uint32_t)op->n_in);
            int t = op->in[a];
            op->in[a] = op->in[b];
            op->in[b] = t;
            snprintf(log + L, ln - L, " op%d in[%d]<->in[%d]", j, a, b);
        }
        break;
    }
}

typedef struct fz_count {
    int built, cls, many, proven, cls_proven, refused_both, enum_only, disagree;
} fz_count;

/* Round z->round of geometry family fam: 0 small (U 2..48, H 1..3U+6, K/V
 * heads any divisor, 1 or H), 1 GQA groups of 2..128 over 50..256 members
 * (parts inside a group and straddling), 2 members wider than a group
 * (n >= g: up to 64 residues and past them).  Returns false when the
 * planner refuses the geometry. */
static bool fz_round(fz *z, int fam, fz_count *c)
{
    z->i = 0;
    int kind = (int)fz_rn(z, 3), R = kind == 2 ? 2 + (int)fz_rn(z, 3) : 1, U, H, Hkv;
    if (fam == 0) {
        int maxU = 256 / R < 48 ? 256 / R : 48;
        U = 2 + (int)fz_rn(z, (uint32_t)maxU - 1);
        H = 1 + (int)fz_rn(z, (uint32_t)(3 * U + 6));
        int divs[64], nd = 0;
        for (int d = 1; d <= H && nd < 64; d++)
            if (H % d == 0)
                divs[nd++] = d;
        Hkv = fz_rn(z, 4) == 0 ? (fz_rn(z, 2) ? 1 : H) : divs[fz_rn(z, (uint32_t)nd)];
    } else if (fam == 1) {
        R = kind == 2 ? 2 : 1;
        U = R == 1 ? 50 + (int)fz_rn(z, 207) : 25 + (int)fz_rn(z, 104);
        int g = 2 + (int)fz_rn(z, 127);
        Hkv = (U + (int)fz_rn(z, (uint32_t)(3 * U))) / g + 1;
        H = g * Hkv;
    } else {
        R = kind == 2 ? 2 : 1;
        U = R == 1 ? 20 + (int)fz_rn(z, 237) : 10 + (int)fz_rn(z, 119);
        int g = 2 + (int)fz_rn(z, 69), n = g + (int)fz_rn(z, (uint32_t)(2 * g));
        H = n * U + (int)fz_rn(z, (uint32_t)U);
        H = (H + g - 1) / g * g;
        Hkv = H / g;
    }
    int rep = fz_rn(z, 4) == 0 ? 3 + (int)fz_rn(z, 5) : 0;
    const char *mask = fz_rn(z, 2) && !rep ? "causal" : "none", *rot = fz_rn(z, 3) == 0 ? "allgather" : "p2p";
    int tokens = 3 * R * U + 1 + (int)fz_rn(z, 7);
    cpc_status *err = NULL;
    cpc_program *p = test_bwd_program(vnames[kind], vkinds[kind], R, U, H, Hkv, tokens, mask, rot, rep, &err);
    if (!p) {
        cpc_status_free(err);
        return false;
    }
    c->built++;
    char log[800];
    log[0] = 0;
    int nm = (int)fz_rn(z, 3);
    for (int m = 0; m < nm; m++)
        fz_mutate(z, p, log, sizeof log);
    cpc_verify_bwd_stats sa, se;
    cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
    cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
    cpc_status *e = cpc_verify_backward_ex(p, &eo, &se);
    c->cls += sa.classes > 0;
    c->many += sa.classes > 8;
    c->proven += a == NULL;
    c->cls_proven += a == NULL && sa.classes > 0;
    c->refused_both += a && e;
    c->enum_only += a && !e;
    if (getenv("CPC_ATTACK_VERBOSE"))
        fprintf(stderr, "u-fuzz %llu/%u %s %dx%d H %d Hkv %d rep %d %s: %d classes: %s | enumeration: %s\n",
                (unsigned long long)z->seed, z->round, vnames[kind], R, U, H, Hkv, rep, log[0] ? log : " unedited",
                sa.classes, a ? a->message : "proven", e ? e->message : "proven");
    cr_expect(!(a == NULL && e != NULL),
              "UNSOUND: seed %llu round %u family %d: %s %dx%d H %d Hkv %d rep %d tokens %d %s %s, edits:%s: "
              "proven by default (%d classes, mode %d), the enumeration refuses: %s",
              (unsigned long long)z->seed, z->round, fam, vnames[kind], R, U, H, Hkv, rep, tokens, mask, rot, log,
              sa.classes, (int)sa.mode, e ? e->message : "");
    c->disagree += a == NULL && e != NULL;
    cpc_status_free(a);
    cpc_status_free(e);
    cpc_program_free(p);
    return true;
}

Test(attack_u, fuzz_classes_against_enumeration)
{
    const char *env = getenv("CPC_ATTACK_U_ROUNDS");
    int rounds = env ? atoi(env) : 1200;
    const uint64_t seeds[2] = {20261202u, test_seed()};
    for (int f = 0; f < 3; f++) {
        for (int si = 0; si < 2; si++) {
            fz_count c = {0};
            fz z = {seeds[si], 0, 0};
            for (int k = 0; k < rounds / 2; k++) {
                z.round = (uint32_t)(k + 1000000 * f);
                fz_round(&z, f, &c);
            }
            fprintf(stderr,
                    "attack_u fuzz family %d seed %llu: %d programs, %d by classes (%d with > 8), %d proven (%d by "
                    "classes), refused by both %d, by the default only %d, UNSOUND %d\n",
                    f, (unsigned long long)seeds[si], c.built, c.cls, c.many, c.proven, c.cls_proven, c.refused_both,
                    c.enum_only, c.disagree);
            cr_expect(c.built > rounds / 4, "family %d: %d built", f, c.built);
            cr_expect(c.cls > c.built / 3, "family %d: %d of %d by classes", f, c.cls, c.built);
            cr_expect(c.refused_both > c.built / 10, "family %d: the edits are not vacuous (%d refused)", f,
                      c.refused_both);
            cr_expect(c.cls_proven > c.built / 10, "family %d: %d proven by classes", f, c.cls_proven);
            cr_assert_eq(c.disagree, 0, "family %d seed %llu: %d accepted wrongly", f, (unsigned long long)seeds[si],
                         c.disagree);
        }
    }
}

/* ---- planted faults beyond the enumeration ------------------------------ */

/* The op of `kind` whose in[0] is buffer `in0` (NULL: any) and out[0] is
 * `out0` (NULL: any), top level or in a loop body; the nth such. */
static cpc_op *find_op_in(cpc_program *p, cpc_op *ops, int n, cpc_op_kind kind, const char *in0, const char *out0,
                          int *nth)
{
    for (int j = 0; j < n; j++) {
        cpc_op *op = &ops[j];
        if (op->kind == CPC_OP_LOOP) {
            cpc_op *f = find_op_in(p, op->body, op->n_body, kind, in0, out0, nth);
            if (f)
                return f;
            continue;
        }
        if (op->kind != kind)
            continue;
        if (in0 && (op->n_in < 1 || strcmp(p->buffers[op->in[0]].name, in0)))
            continue;
        if (out0 && (op->n_out < 1 || strcmp(p->buffers[op->out[0]].name, out0)))
            continue;
        if ((*nth)-- == 0)
            return op;
    }
    return NULL;
}

static cpc_op *find_op(cpc_program *p, cpc_op_kind kind, const char *in0, const char *out0)
{
    int nth = 0;
    return find_op_in(p, p->ops, p->n_ops, kind, in0, out0, &nth);
}

/* Inserts a copy of *op right after it (in its own op array). */
static void duplicate_op(cpc_program *p, cpc_op *op)
{
    cpc_op **arrs[64];
    int *ns[64], na = 0;
    arrs[na] = &p->ops;
    ns[na++] = &p->n_ops;
    for (int k = 0; k < na; k++)
        for (int j = 0; j < *ns[k]; j++)
            if ((*arrs[k])[j].kind == CPC_OP_LOOP && na < 64) {
                arrs[na] = &(*arrs[k])[j].body;
                ns[na++] = &(*arrs[k])[j].n_body;
            }
    for (int k = 0; k < na; k++) {
        int n = *ns[k];
        for (int j = 0; j < n; j++)
            if (&(*arrs[k])[j] == op) {
                cpc_op *v = realloc(*arrs[k], sizeof *v * (size_t)(n + 1));
                cr_assert_not_null(v);
                memmove(&v[j + 1], &v[j], sizeof *v * (size_t)(n - j));
                clone_op(&v[j + 1], &v[j]);
                *arrs[k] = v;
                (*ns[k])++;
                return;
            }
    }
    cr_assert_fail("duplicate_op: op not found");
}

/* Independent of the prover: does any K/V head lie in two members' parts
 * (so dK/dV must be summed, not placed)?  Every member swept. */
static bool kv_shared(int R, int U, int H, int Hkv)
{
    cpc_layout L = {0};
    L.R = R;
    L.U = U;
    L.P = R * U;
    L.H = H;
    L.Hkv = Hkv;
    L.group = H / Hkv;
    int prev_end = -1;
    for (int u = 0; u < U; u++) {
        int off, n;
        cpc_layout_kv_heads(&L, u, &off, &n);
        if (n <= 0)
            continue;
        if (off < prev_end)
            return true;
        prev_end = off + n;
    }
    return false;
}

enum { PF_NONE, PF_DK_PLACED, PF_DV_PLACED, PF_ATTN_DROPPED, PF_DQ_NOT_BACK, PF_ATTN_TWICE, PF_DQ_REDUCE,
       PF_DK_FROM_DV, PF_LSE_DELTA, PF_DQ_NO_INIT, PF_DKV_REDUCE_ALWAYS, PF_DELTA_NOT_SENT, PF_DQ_BACK_TWICE,
       PF_TEXT_EVERY_RING_RANK, PF_TEXT_DK_PART, PF_TEXT_DQ_NOT_PLACED, PF__COUNT };
static const char *const pf_name[PF__COUNT] = {
    "unedited", "dk placed (no reduce)", "dv placed (no reduce)", "attn_bwd dropped", "dq never brought back",
    "attn_bwd twice", "dq summed (reduce=sum)", "dk's heads_to_seq reads dv", "lse and delta swapped",
    "dq accumulator never zeroed", "dk/dv summed everywhere", "delta never sent", "dq brought back twice",
    "text block on every ring rank", "text dk all_reduced from the part", "text dq never placed"};

/* Plants fault f in p; false when p has no place for it (not applicable). */
static bool plant(cpc_program *p, int f)
{
    cpc_op *att = NULL;
    int nth = 0;
    /* the image attention (q_seq's), in the loop for unified */
    att = find_op_in(p, p->ops, p->n_ops, CPC_OP_ATTN_BWD, "q_seq", NULL, &nth);
    cpc_op *h_dq = find_op(p, CPC_OP_ALL_TO_ALL, "dq_seq", "dq"), *h_dk = find_op(p, CPC_OP_ALL_TO_ALL, "dk_cur", "dk"),
           *h_dv = find_op(p, CPC_OP_ALL_TO_ALL, "dv_cur", "dv");
    cr_assert(att && h_dq && h_dk && h_dv, "the program's ops");
    switch (f) {
    case PF_NONE: return true;
    case PF_DK_PLACED: h_dk->reduce = false; return true;
    case PF_DV_PLACED: h_dv->reduce = false; return true;
    case PF_ATTN_DROPPED: set_when(att, "0"); return true;
    case PF_DQ_NOT_BACK: set_when(h_dq, "0"); return true;
    case PF_ATTN_TWICE: duplicate_op(p, att); return true;
    case PF_DQ_REDUCE: h_dq->reduce = true; return true;
    case PF_DK_FROM_DV: h_dk->in[0] = h_dv->in[0]; return true;
    case PF_LSE_DELTA: {
        int t = att->in[4];
        att->in[4] = att->in[5];
        att->in[5] = t;
        return true;
    }
    case PF_DQ_NO_INIT: {
        cpc_op *i = find_op(p, CPC_OP_INIT_ACC, NULL, "dq_seq");
        cr_assert_not_null(i);
        set_when(i, "0");
        return true;
    }
    case PF_DKV_REDUCE_ALWAYS: h_dk->reduce = h_dv->reduce = true; return true;
    case PF_DELTA_NOT_SENT: {
        cpc_op *s = find_op(p, CPC_OP_ALL_TO_ALL, "delta_shard", NULL);
        cr_assert_not_null(s);
        set_when(s, "0");
        return true;
    }
    case PF_DQ_BACK_TWICE: duplicate_op(p, h_dq); return true;
    case PF_TEXT_EVERY_RING_RANK: {
        cpc_op *t = find_op(p, CPC_OP_ATTN_BWD, "q_rep_part", "dq_rep_acc");
        if (!t || !t->when)
            return false;
        cpc_expr_free(t->when);
        t->when = NULL;
        return true;
    }
    case PF_TEXT_DK_PART: {
        cpc_op *a = find_op(p, CPC_OP_ALL_REDUCE, "dk_rep_full", NULL);
        if (!a)
            return false;
        int b = cpc_program_find_buffer(p, "dk_rep_acc");
        cr_assert(b >= 0);
        a->in[0] = b;
        return true;
    }
    case PF_TEXT_DQ_NOT_PLACED: {
        cpc_op *c = find_op(p, CPC_OP_COPY, "dq_rep_acc", "dq_rep_full");
        if (!c)
            return false;
        set_when(c, "0");
        return true;
    }
    default: return false;
    }
}

/* Expected verdict of fault f (true: must be refused), by construction. */
static bool pf_wrong(int f, bool shared)
{
    switch (f) {
    case PF_NONE:
    case PF_DQ_REDUCE:
    case PF_DKV_REDUCE_ALWAYS:
    case PF_DQ_BACK_TWICE: return false;
    case PF_DK_PLACED:
    case PF_DV_PLACED: return shared;
    default: return true;
    }
}

typedef struct pgeo {
    int v, R, U, H, Hkv, rep; /* v: index into vnames */
    const char *what;
} pgeo;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs every fault on geometry g; enumerate: also the enumeration (P <= 256),
 * which must give the expected verdict too.  Returns the faults planted. */
static int planted_on(const pgeo *g, bool enumerate, int *cls_used)
{
    bool shared = kv_shared(g->R, g->U, g->H, g->Hkv);
    int planted = 0;
    for (int f = 0; f < PF__COUNT; f++) {
        cpc_status *err = NULL;
        cpc_program *p = test_bwd_program(vnames[g->v], vkinds[g->v], g->R, g->U, g->H, g->Hkv,
                                          2 * g->R * g->U + 3, f % 2 && !g->rep ? "causal" : "none", "p2p", g->rep,
                                          &err);
        cr_assert_not_null(p, "%s %dx%d H %d Hkv %d: %s", vnames[g->v], g->R, g->U, g->H, g->Hkv,
                           err ? err->message : "");
        if (!plant(p, f)) {
            cpc_program_free(p);
            continue;
        }
        planted++;
        bool wrong = pf_wrong(f, shared);
        cpc_verify_bwd_stats sa;
        double t0 = now_s();
        cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
        double dt = now_s() - t0;
        if (getenv("CPC_ATTACK_VERBOSE"))
            fprintf(stderr, "planted %s (%s %dx%d H %d Hkv %d rep %d, shared %d): %s: %d classes, mode %d, %.2f ms: %s\n",
                    g->what, vnames[g->v], g->R, g->U, g->H, g->Hkv, g->rep, shared, pf_name[f], sa.classes,
                    (int)sa.mode, dt * 1e3, a ? a->message : "proven");
        *cls_used += sa.classes > 0;
        if (wrong)
            cr_expect_not_null(a, "UNSOUND: %s (%s %dx%d H %d Hkv %d rep %d): '%s' proven (%d classes)", g->what,
                               vnames[g->v], g->R, g->U, g->H, g->Hkv, g->rep, pf_name[f], sa.classes);
        else
            cr_expect_null(a, "%s (%s %dx%d H %d Hkv %d rep %d): '%s' (correct) refused: %s", g->what, vnames[g->v],
                           g->R, g->U, g->H, g->Hkv, g->rep, pf_name[f], a ? a->message : "");
        if (a)
            cr_expect_eq(a->rule, CPC_RULE_VERIFY, "%s: '%s': rule %d", g->what, pf_name[f], (int)a->rule);
        cr_expect(dt < 1.0, "%s: '%s': %.2f s", g->what, pf_name[f], dt);
        if (enumerate) {
            cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
            cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
            cr_expect_eq(e != NULL, wrong, "%s (%dx%d): '%s': the enumeration says %s (expected %s)", g->what, g->R,
                         g->U, pf_name[f], e ? e->message : "proven", wrong ? "wrong" : "right");
            cpc_status_free(e);
        }
        cpc_status_free(a);
        cpc_program_free(p);
    }
    return planted;
}

/* Each large geometry beside a small one of the same structure (the
 * enumeration checks the expected verdicts there). */
Test(attack_u, planted_faults_beyond_enumeration)
{
    static const pgeo small[] = {
        {0, 1, 5, 6, 1, 0, "two regions, one K/V head (small)"},
        {0, 1, 7, 10, 2, 0, "g 5 over parts of 2 and 1 (small)"},
        {1, 1, 8, 8, 2, 0, "inside one group (small)"},
        {0, 1, 8, 40, 10, 0, "parts wider than a group (small)"},
        {0, 1, 5, 17, 17, 0, "K/V = H (small)"},
        {2, 2, 5, 12, 4, 0, "unified, straddling (small)"},
        {2, 2, 3, 7, 1, 4, "unified, replicated text, one K/V head (small)"},
        {0, 1, 7, 16, 8, 0, "sharing in the second region only (small)"},
        {0, 1, 6, 9, 3, 0, "g 3 over 2,2,2,1,1,1 (small)"},
        {2, 3, 4, 10, 5, 5, "unified, replicated text, g 2 (small)"},
    };
    static const pgeo large[] = {
        {0, 1, 300, 301, 1, 0, "two regions, one K/V head"},
        {0, 1, 1000, 1003, 17, 0, "g 59 over parts of 2 and 1"},
        {1, 1, 65536, 65536, 8, 0, "inside one group (g 8192)"},
        {0, 1, 384, 49536, 387, 0, "parts of 129 over groups of 128: 128 residues, every member"},
        {0, 1, 4097, 12293, 12293, 0, "K/V = H"},
        {2, 3, 300, 301, 7, 0, "unified, straddling"},
        {2, 2, 300, 301, 1, 5, "unified, replicated text, one K/V head"},
        {0, 1, 40000, 65536, 32768, 0, "sharing in the second region only"},
        {0, 1, 1000, 1500, 750, 0, "g 2 over 500 of 2 then 500 of 1"},
        {2, 4, 1000, 2010, 1005, 5, "unified 4 x 1000, replicated text, g 2"},
        {0, 1, 65535, 65536, 2, 0, "g 32768 (two K/V heads) over 65535"},
        {0, 1, 257, 257 * 64 + 256, 257 * 64 + 256, 0, "257 members, the last alone in its region"},
        {0, 1, 509, 65500, 500, 0, "parts of 129 and 128 over groups of 131: past 64 classes, every member"},
    };
    int cls = 0, n = 0;
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        n += planted_on(&small[i], true, &cls);
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++)
        n += planted_on(&large[i], false, &cls);
    cr_expect(cls > n / 2, "%d of %d planted programs proven by classes", cls, n);
    fprintf(stderr, "attack_u planted: %d programs (%d decided by classes)\n", n, cls);
}

/* ---- the message layer with ulysses members ----------------------------- */

/* The loop body of p (the ring's steps). */
static cpc_op *loop_of(cpc_program *p, int **n)
{
    for (int j = 0; j < p->n_ops; j++)
        if (p->ops[j].kind == CPC_OP_LOOP) {
            *n = &p->ops[j].n_body;
            return p->ops[j].body;
        }
    return NULL;
}

/* Index in ops[0..n) of the op of `kind` naming buffer `buf` (in[0] or
 * out[0]; NULL: any) with tag `tag` (-1: any), the nth; -1 if none. */
static int index_of(const cpc_program *p, const cpc_op *ops, int n, cpc_op_kind kind, const char *buf, int tag,
                    int nth)
{
    for (int j = 0; j < n; j++) {
        const cpc_op *op = &ops[j];
        if (op->kind != kind || (tag >= 0 && op->tag != tag))
            continue;
        if (buf && !(op->n_in > 0 && !strcmp(p->buffers[op->in[0]].name, buf)) &&
            !(op->n_out > 0 && !strcmp(p->buffers[op->out[0]].name, buf)))
            continue;
        if (nth-- == 0)
            return j;
    }
    return -1;
}

/* Moves ops[from] to position `to` (the others shift). */
static void move_op(cpc_op *ops, int from, int to)
{
    cpc_op t = ops[from];
    if (from < to)
        memmove(&ops[from], &ops[from + 1], sizeof *ops * (size_t)(to - from));
    else
        memmove(&ops[to + 1], &ops[to], sizeof *ops * (size_t)(from - to));
    ops[to] = t;
}

enum { MF_NONE, MF_SEND_WORLD, MF_RECV_WORLD_SAME_RANK, MF_ADD_INTO_IN_FLIGHT_SEND, MF_READ_IN_FLIGHT_RECV,
       MF_WAIT_BEFORE_RECV, MF_NEVER_WAITED, MF_TAG_REUSED, MF_SWAP_IN_FLIGHT, MF_TAG_REUSED_ALL, MF_GROUPS_SPLIT_CROSSED, MF_RECV_WAITED_BEFORE_SEND,
       MF_LAST_RECV_DROPPED, MF_KV_SENT_TWICE, MF__COUNT };
static const char *const mf_name[MF__COUNT] = {
    "unedited", "dK/dV sent in the world group, received in the ring group",
    "dK/dV received in the world group from the same rank (flat index)",
    "dk_out accumulated into while its send is in flight", "dk_cur read before the wait of its recv",
    "the dK/dV send waited before its recv is posted (next step)", "the last dK/dV request never waited",
    "dK/dV sent with K/V's tag (their wait left on tag 1)", "dk_out swapped while in flight",
    "every dK/dV op on K/V's tag (FIFO pairs a K/V recv with a dK/dV send)",
    "dK sent in the world group, dV in the ring group, received the other way round (issue 21's first tamper)",
    "the K/V recv waited before the K/V send is posted", "the last dK/dV recv dropped (its send never matched)",
    "the K/V sent twice a step"};

/* Plants message fault f in the unified p2p program p; false if no place. */
static bool plant_msg(cpc_program *p, int f)
{
    int *np = NULL;
    cpc_op *b = loop_of(p, &np);
    cr_assert_not_null(b);
    int send_d = index_of(p, b, *np, CPC_OP_SEND, "dk_out", 1, 0), recv_d = index_of(p, b, *np, CPC_OP_RECV, "dk_cur", 1, 0);
    int wait1 = index_of(p, b, *np, CPC_OP_WAIT, NULL, 1, 0), add_k = index_of(p, b, *np, CPC_OP_ADD, "dk_cur", -1, 0);
    cr_assert(send_d >= 0 && recv_d >= 0 && wait1 >= 0 && add_k >= 0, "the lagged ring's ops");
    switch (f) {
    case MF_NONE: return true;
    case MF_SEND_WORLD: b[send_d].group = CPC_GROUP_WORLD; return true;
    case MF_RECV_WORLD_SAME_RANK:
        b[recv_d].group = CPC_GROUP_WORLD;
        cpc_expr_free(b[recv_d].peer);
        b[recv_d].peer = expr_of("((r-1)%R)*U+u");
        return true;
    case MF_ADD_INTO_IN_FLIGHT_SEND:
        duplicate_op(p, &b[add_k]);
        b = loop_of(p, &np);
        b[add_k + 1].out[0] = cpc_program_find_buffer(p, "dk_out");
        send_d = index_of(p, b, *np, CPC_OP_SEND, "dk_out", 1, 0);
        move_op(b, add_k + 1, send_d); /* right after the send (which moved up by one) */
        return true;
    case MF_READ_IN_FLIGHT_RECV: move_op(b, add_k, wait1); return true;
    case MF_WAIT_BEFORE_RECV:
        duplicate_op(p, &b[wait1]);
        b = loop_of(p, &np);
        cpc_expr_free(b[wait1 + 1].when);
        b[wait1 + 1].when = expr_of("s<R-1");
        send_d = index_of(p, b, *np, CPC_OP_SEND, "dk_out", 1, 0);
        move_op(b, wait1 + 1, send_d);
        return true;
    case MF_NEVER_WAITED: {
        int w = index_of(p, p->ops, p->n_ops, CPC_OP_WAIT, NULL, 1, 0);
        cr_assert(w >= 0);
        set_when(&p->ops[w], "0");
        return true;
    }
    case MF_TAG_REUSED: {
        b[send_d].tag = 0;
        b[recv_d].tag = 0;
        int r2 = index_of(p, p->ops, p->n_ops, CPC_OP_RECV, "dk_cur", 1, 0),
            w2 = index_of(p, p->ops, p->n_ops, CPC_OP_WAIT, NULL, 1, 0);
        cr_assert(r2 >= 0 && w2 >= 0);
        p->ops[r2].tag = 0;
        p->ops[w2].tag = 0;
        return true;
    }
    case MF_SWAP_IN_FLIGHT: {
        int sw = index_of(p, b, *np, CPC_OP_SWAP, "dk_blk", -1, 0);
        if (sw < 0)
            return false;
        duplicate_op(p, &b[sw]);
        b = loop_of(p, &np);
        send_d = index_of(p, b, *np, CPC_OP_SEND, "dk_out", 1, 0);
        move_op(b, sw + 1, send_d);
        return true;
    }
    case MF_TAG_REUSED_ALL: { /* every tag-1 op (loop body and after it) on tag 0 */
        for (int j = 0; j < *np; j++)
            if (b[j].tag == 1)
                b[j].tag = 0;
        for (int j = 0; j < p->n_ops; j++)
            if (p->ops[j].kind != CPC_OP_LOOP && p->ops[j].tag == 1)
                p->ops[j].tag = 0;
        return true;
    }
    case MF_GROUPS_SPLIT_CROSSED: { /* one op per buffer: send dk (world), dv (ring); recv dk (ring), dv (world) */
        const bool U1 = p->layout.U == 1;
        duplicate_op(p, &b[send_d]);
        b = loop_of(p, &np);
        recv_d = index_of(p, b, *np, CPC_OP_RECV, "dk_cur", 1, 0);
        duplicate_op(p, &b[recv_d]);
        b = loop_of(p, &np);
        send_d = index_of(p, b, *np, CPC_OP_SEND, "dk_out", 1, 0);
        recv_d = index_of(p, b, *np, CPC_OP_RECV, "dk_cur", 1, 0);
        cpc_op *sk = &b[send_d], *sv = &b[send_d + 1], *rk = &b[recv_d], *rv = &b[recv_d + 1];
        sk->n_in = 1;
        sv->n_in = 1;
        sv->in[0] = sv->in[1];
        rk->n_out = 1;
        rv->n_out = 1;
        rv->out[0] = rv->out[1];
        sk->group = CPC_GROUP_WORLD;
        rv->group = CPC_GROUP_WORLD;
        cpc_expr_free(sk->peer);
        sk->peer = expr_of(U1 ? "(r+1)%R" : "((r+1)%R)*U+u");
        cpc_expr_free(rv->peer);
        rv->peer = expr_of(U1 ? "(r-1)%R" : "((r-1)%R)*U+u");
        return true;
    }
    case MF_RECV_WAITED_BEFORE_SEND: {
        int sk = index_of(p, b, *np, CPC_OP_SEND, "k_cur", 0, 0), w0 = index_of(p, b, *np, CPC_OP_WAIT, NULL, 0, 0);
        cr_assert(sk >= 0 && w0 > sk);
        move_op(b, sk, w0); /* right after the wait (which moved up by one) */
        return true;
    }
    case MF_LAST_RECV_DROPPED: {
        int r2 = index_of(p, p->ops, p->n_ops, CPC_OP_RECV, "dk_cur", 1, 0);
        cr_assert(r2 >= 0);
        set_when(&p->ops[r2], "0");
        return true;
    }
    case MF_KV_SENT_TWICE: {
        int sk = index_of(p, b, *np, CPC_OP_SEND, "k_cur", 0, 0);
        cr_assert(sk >= 0);
        duplicate_op(p, &b[sk]);
        return true;
    }
    default: return false;
    }
}

Test(attack_u, message_layer_with_members)
{
    static const pgeo geos[] = {
        {2, 4, 3, 7, 7, 0, "unified 4 x 3, uneven heads"},
        {2, 3, 4, 8, 2, 0, "unified 3 x 4, K/V replicated"},
        {2, 3, 3, 7, 1, 4, "unified 3 x 3, replicated text (twin)"},
        {2, 1024, 3, 7, 7, 0, "unified 1024 x 3, uneven heads"},
        {2, 300, 5, 12, 4, 0, "unified 300 x 5, GQA straddling"},
        {2, 512, 3, 7, 1, 4, "unified 512 x 3, replicated text (twin)"},
        {3, 4, 1, 4, 4, 0, "ring 4"},
        {3, 1024, 1, 4, 2, 0, "ring 1024"},
    };
    int refused = 0, n = 0;
    for (size_t gi = 0; gi < sizeof geos / sizeof geos[0]; gi++) {
        const pgeo *g = &geos[gi];
        for (int f = 0; f < MF__COUNT; f++) {
            cpc_status *err = NULL;
            cpc_program *p = test_bwd_program(vnames[g->v], vkinds[g->v], g->R, g->U, g->H, g->Hkv,
                                              2 * g->R * g->U + 3, "none", "p2p", g->rep, &err);
            cr_assert_not_null(p, "%s: %s", g->what, err ? err->message : "");
            if (!plant_msg(p, f)) {
                cpc_program_free(p);
                continue;
            }
            n++;
            cpc_verify_bwd_stats sa;
            double t0 = now_s();
            cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
            double dt = now_s() - t0;
            if (getenv("CPC_ATTACK_VERBOSE"))
                fprintf(stderr, "message %s: %s: mode %d, %d classes, %.2f ms: %s\n", g->what, mf_name[f],
                        (int)sa.mode, sa.classes, dt * 1e3, a ? a->message : "proven");
            if (f == MF_NONE) {
                cr_expect_null(a, "%s unedited: %s", g->what, a ? a->message : "");
            } else {
                cr_expect_not_null(a, "UNSOUND: %s: '%s' proven (mode %d, %d classes)", g->what, mf_name[f],
                                   (int)sa.mode, sa.classes);
                if (a)
                    cr_expect_eq(a->rule, CPC_RULE_VERIFY, "%s: '%s': rule %d", g->what, mf_name[f], (int)a->rule);
                refused += a != NULL;
            }
            cr_expect(dt < 2.0, "%s: '%s': %.2f s", g->what, mf_name[f], dt);
            if (g->R * g->U <= 256) {
                cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
                cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
                cr_expect_eq(e != NULL, f != MF_NONE, "%s: '%s': the enumeration says %s", g->what, mf_name[f],
                             e ? e->message : "proven");
                cpc_status_free(e);
            }
            cpc_status_free(a);
            cpc_program_free(p);
        }
    }
    fprintf(stderr, "attack_u messages: %d programs, %d faults refused\n", n, refused);
}

/* ---- faults on one step of the ring loop, with classes (and the twin) ------ */

enum { LF_NONE, LF_ATTN_NOT_LAST_BUT_ONE, LF_ATTN_NOT_FIRST, LF_ADD_SKIPS_STEP1, LF_INIT_NOT_LAST, LF_COUNT_PLUS1,
       LF_TEXT_TWO_STEPS, LF_TEXT_STEP1, LF_TEXT_LAST_STEP, LF_TEXT_EVERY_STEP, LF_KV_RECV_AHEAD_FROM_3, LF__COUNT };
static const char *const lf_name[LF__COUNT] = {
    "unedited", "image attn_bwd skipped on step R-2", "image attn_bwd skipped on step 0",
    "dK's add skipped on step 1", "dK/dV accumulators not zeroed on the last step", "loop count R+1",
    "text x image block on steps 0 and 1", "text x image block on step 1 (correct: every ring rank meets one block)",
    "text x image block on the last step (correct)", "text x image block on every step",
    "the K/V recv declares block s+2 from step 3 on"};

static bool lf_wrong(int f)
{
    return !(f == LF_NONE || f == LF_TEXT_STEP1 || f == LF_TEXT_LAST_STEP);
}

static bool plant_loop(cpc_program *p, int f)
{
    int *np = NULL;
    cpc_op *b = loop_of(p, &np);
    cr_assert_not_null(b);
    int att = index_of(p, b, *np, CPC_OP_ATTN_BWD, "q_seq", -1, 0), txt = index_of(p, b, *np, CPC_OP_ATTN_BWD, "q_rep_part", -1, 0);
    int addk = index_of(p, b, *np, CPC_OP_ADD, "dk_cur", -1, 0), ini = index_of(p, b, *np, CPC_OP_INIT_ACC, "dk_blk", -1, 0);
    int rk = index_of(p, b, *np, CPC_OP_RECV, "k_nxt", 0, 0);
    cr_assert(att >= 0 && addk >= 0 && ini >= 0 && rk >= 0);
    switch (f) {
    case LF_NONE: return true;
    case LF_ATTN_NOT_LAST_BUT_ONE: set_when(&b[att], "s!=R-2"); return true;
    case LF_ATTN_NOT_FIRST: set_when(&b[att], "s>0"); return true;
    case LF_ADD_SKIPS_STEP1: set_when(&b[addk], "s>1"); return true;
    case LF_INIT_NOT_LAST: set_when(&b[ini], "s<R-1"); return true;
    case LF_COUNT_PLUS1:
        for (int j = 0; j < p->n_ops; j++)
            if (p->ops[j].kind == CPC_OP_LOOP) {
                cpc_expr_free(p->ops[j].count);
                p->ops[j].count = expr_of("R+1");
            }
        return true;
    case LF_TEXT_TWO_STEPS:
    case LF_TEXT_STEP1:
    case LF_TEXT_LAST_STEP:
        if (txt < 0)
            return false;
        set_when(&b[txt], f == LF_TEXT_TWO_STEPS ? "s<2" : f == LF_TEXT_STEP1 ? "s==1" : "s==R-1");
        return true;
    case LF_TEXT_EVERY_STEP:
        if (txt < 0)
            return false;
        cpc_expr_free(b[txt].when);
        b[txt].when = NULL;
        return true;
    case LF_KV_RECV_AHEAD_FROM_3: { /* recv split: the right block before step 3, s+2 from it */
        duplicate_op(p, &b[rk]);
        b = loop_of(p, &np);
        set_when(&b[rk], "s<R-1&&s<3");
        set_when(&b[rk + 1], "s<R-1&&s>=3");
        cpc_expr_free(b[rk + 1].block);
        b[rk + 1].block = expr_of("(r-s-2)%R");
        return true;
    }
    default: return false;
    }
}

Test(attack_u, loop_faults_with_classes)
{
    static const pgeo geos[] = {
        {2, 5, 3, 7, 7, 4, "unified 5 x 3, uneven heads, text (small)"},
        {2, 6, 5, 12, 4, 0, "unified 6 x 5, GQA straddling (small)"},
        {2, 7, 4, 10, 5, 3, "unified 7 x 4, g 2, text (small)"},
        {2, 1024, 3, 7, 7, 4, "unified 1024 x 3, uneven heads, text"},
        {2, 300, 5, 12, 4, 0, "unified 300 x 5, GQA straddling"},
        {2, 16, 1000, 1003, 17, 3, "unified 16 x 1000, g 59, text"},
        {2, 4096, 7, 16, 8, 5, "unified 4096 x 7, g 2, text"},
    };
    int n = 0, cls = 0, jumped = 0;
    for (size_t gi = 0; gi < sizeof geos / sizeof geos[0]; gi++) {
        const pgeo *g = &geos[gi];
        for (int f = 0; f < LF__COUNT; f++) {
            cpc_status *err = NULL;
            cpc_program *p = test_bwd_program(vnames[g->v], vkinds[g->v], g->R, g->U, g->H, g->Hkv,
                                              2 * g->R * g->U + 3, f % 2 && !g->rep ? "causal" : "none", "p2p",
                                              g->rep, &err);
            cr_assert_not_null(p, "%s: %s", g->what, err ? err->message : "");
            /* the text block on every step of a long ring: refused, but only once its set passes
             * the run bound (1.1 s at 1024 x 3, 2.3 s at 16 x 1000 and 4096 x 7: noted in
             * redteam2-note.md), so only at the small sizes here */
            if ((f == LF_TEXT_EVERY_STEP && g->R * g->U > 256) || !plant_loop(p, f)) {
                cpc_program_free(p);
                continue;
            }
            n++;
            bool wrong = lf_wrong(f);
            cpc_verify_bwd_stats sa;
            double t0 = now_s();
            cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
            double dt = now_s() - t0;
            cls += sa.classes > 0;
            jumped += sa.jumps > 0;
            if (getenv("CPC_ATTACK_VERBOSE"))
                fprintf(stderr, "loop %s: %s: mode %d, %d classes, %lld jumps, %.2f ms: %s\n", g->what, lf_name[f],
                        (int)sa.mode, sa.classes, (long long)sa.jumps, dt * 1e3, a ? a->message : "proven");
            if (wrong)
                cr_expect_not_null(a, "UNSOUND: %s: '%s' proven (%d classes, %lld jumps)", g->what, lf_name[f],
                                   sa.classes, (long long)sa.jumps);
            else
                cr_expect_null(a, "%s: '%s' (correct) refused: %s", g->what, lf_name[f], a ? a->message : "");
            cr_expect(dt < 2.0, "%s: '%s': %.2f s", g->what, lf_name[f], dt);
            if (g->R * g->U <= 256) {
                cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
                cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
                cr_expect_eq(e != NULL, wrong, "%s: '%s': the enumeration says %s", g->what, lf_name[f],
                             e ? e->message : "proven");
                cpc_status_free(e);
            }
            cpc_status_free(a);
            cpc_program_free(p);
        }
    }
    fprintf(stderr, "attack_u loops: %d programs, %d by classes, %d with a phase jumped\n", n, cls, jumped);
}

/* ---- a numeric judgement: accepted class mutants run on the CPU executor ---- */

typedef struct nrow {
    int v, R, U, H, Hkv, tokens, rep;
    const char *mask, *rotate, *what;
} nrow;

/* Runs backward program bwd in place of the built one for row w's plan on the
 * CPU executor (local transport, seed): the run's report in *rep. */
static cpc_status *numeric_run_u(const nrow *w, const cpc_program *bwd, uint64_t seed, cpc_run_report *rep)
{
    return test_bwd_run(vnames[w->v], vkinds[w->v], w->R, w->U, w->H, w->Hkv, w->tokens, w->mask, w->rotate, w->rep,
                        bwd, seed, 20, rep);
}

/* Only the edits that keep every operand's role (reduce / direction flipped,
 * ops duplicated, dropped, moved, guards): the ones the class proof decides
 * differently from member to member, and none that the executor would run
 * past a buffer (test_verify_attack.c's finding E). */
static void fz_mutate_roles_kept(fz *z, cpc_program *p, char *log, size_t ln)
{
    for (int tries = 0; tries < 8; tries++) {
        uint32_t i0 = z->i;
        size_t L = strlen(log);
        cpc_program *c = NULL;
        cr_assert_null(cpc_program_clone(p, &c));
        fz_mutate(z, c, log, ln);
        const char *e = log + L;
        bool keep = getenv("CPC_ATTACK_U_ALL_EDITS") || strstr(e, "reduce") || strstr(e, "dir flipped") || strstr(e, "duplicated") ||
                    strstr(e, "dropped") || strstr(e, "moved") || strstr(e, "when=");
        cpc_program_free(c);
        log[L] = 0;
        z->i = i0;
        if (keep) {
            fz_mutate(z, p, log, ln);
            return;
        }
        z->i = i0 + 1000; /* another draw */
    }
}

Test(attack_u, numeric_judgement_of_class_mutants)
{
    static const nrow rows[] = {
        {0, 1, 5, 7, 1, 43, 0, "none", "p2p", "ulysses_anything 1x5 H 7, one K/V head"},
        {0, 1, 5, 12, 4, 45, 0, "causal", "p2p", "ulysses_anything 1x5 H 12 Hkv 4 (3,3,2,2,2: straddling), causal"},
        {1, 1, 4, 8, 2, 32, 0, "none", "p2p", "ulysses 1x4 H 8 Hkv 2 (inside one group)"},
        {2, 2, 3, 7, 7, 48, 0, "none", "p2p", "unified 2x3 H 7"},
        {2, 2, 3, 6, 2, 48, 0, "causal", "p2p", "unified 2x3 H 6 Hkv 2 (straddling), causal"},
        {1, 1, 4, 8, 2, 32, 3, "none", "p2p", "ulysses 1x4 H 8 Hkv 2, a replicated text"},
        {2, 2, 3, 7, 1, 48, 4, "none", "p2p", "unified 2x3 H 7 Hkv 1, a replicated text (the twin)"},
        {2, 2, 3, 6, 2, 48, 0, "none", "allgather", "unified 2x3 H 6 Hkv 2, allgather"},
        /* a region of 6 members over residues of 3 (uc_union's whole periods), and 16 members of one
         * head inside groups of 8 (one run over the region) */
        {0, 1, 12, 18, 6, 100, 0, "none", "p2p", "ulysses_anything 1x12 H 18 Hkv 6 (periods of 3)"},
        {1, 1, 16, 16, 2, 64, 0, "none", "p2p", "ulysses 1x16 H 16 Hkv 2 (inside groups of 8)"},
    };
    const char *env = getenv("CPC_ATTACK_U_NUMERIC");
    int rounds = env ? atoi(env) : 120;
    const uint64_t seeds[2] = {20261203u, test_seed()};
    int accepted = 0, ran_ok = 0, cls = 0, refused = 0;
    for (int k = 0; k < rounds; k++) {
        const nrow *w = &rows[k % (int)(sizeof rows / sizeof rows[0])];
        fz z = {seeds[k < rounds / 3 ? 0 : 1], (uint32_t)(5000000 + k), 0};
        cpc_status *err = NULL;
        cpc_program *p = test_bwd_program(vnames[w->v], vkinds[w->v], w->R, w->U, w->H, w->Hkv, w->tokens, w->mask,
                                          w->rotate, w->rep, &err);
        cr_assert_not_null(p, "%s: %s", w->what, err ? err->message : "");
        char log[800];
        log[0] = 0;
        int nm = k % 5 == 0 ? 0 : 1 + (int)fz_rn(&z, 2);
        for (int m = 0; m < nm; m++)
            fz_mutate_roles_kept(&z, p, log, sizeof log);
        cpc_verify_bwd_stats sa;
        cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
        cls += sa.classes > 0;
        if (!a) { /* every accepted one (a refused one may deadlock: the run's 20 s timeout) */
            cpc_run_report rep;
            cpc_status *st = numeric_run_u(w, p, z.seed + (uint64_t)k, &rep);
            bool ok = !st && rep.checked && rep.pass && rep.bwd_checked && rep.bwd_pass;
            if (getenv("CPC_ATTACK_VERBOSE"))
                fprintf(stderr, "numeric %s%s: %s (%d classes): run %s, rel_err %.2g %.2g %.2g\n", w->what,
                        log[0] ? log : " unedited", a ? "refused" : "proven", sa.classes,
                        st ? st->message : ok ? "right" : "WRONG", rep.bwd_rel_err[0], rep.bwd_rel_err[1],
                        rep.bwd_rel_err[2]);
            if (!a) {
                accepted++;
                ran_ok += ok;
                cr_expect(ok, "UNSOUND: seed %llu round %d: %s, edits:%s: proven (%d classes), the run %s (rel_err "
                              "dq %.3g dk %.3g dv %.3g)",
                          (unsigned long long)z.seed, k, w->what, log, sa.classes,
                          st ? st->message : "is wrong", rep.bwd_rel_err[0], rep.bwd_rel_err[1], rep.bwd_rel_err[2]);
            }
            cpc_status_free(st);
            cpc_run_report_clear(&rep);
        }
        refused += a != NULL;
        cpc_status_free(a);
        cpc_program_free(p);
    }
    fprintf(stderr, "attack_u numeric: %d mutants, %d by classes, %d proven (%d ran right), %d refused\n", rounds, cls,
            accepted, ran_ok, refused);
    cr_expect(accepted >= rounds / 5, "only %d of %d proven", accepted, rounds);
}

/* ---- the classes' fallback (uc_whole -> ubreak: every member simulated) --- */

/* Appends to p: copy `g` (the replicated text's summed gradient, every head)
 * into its head part `g_acc`, place that into `g_full` and all_reduce it
 * into `g` again: each member sends its part of a whole set.  With K/V
 * groups straddling members (dK) the parts overlap, unevenly between the
 * two regions: the summed set is not the same seen from every member, so
 * the classes cannot stand for their members (uc_whole) and every member is
 * simulated; the overlap counts twice (wrong).  For dq the parts tile the
 * heads: with R == 1 the sum is the set again (right), with R > 1 it is R
 * times it (wrong). */
static void append_resum(cpc_program *p, const char *g, const char *g_acc, const char *g_full)
{
    int n = p->n_ops;
    cpc_op *v = realloc(p->ops, sizeof *v * (size_t)(n + 3));
    cr_assert_not_null(v);
    p->ops = v;
    memset(&v[n], 0, sizeof *v * 3);
    int bg = cpc_program_find_buffer(p, g), ba = cpc_program_find_buffer(p, g_acc),
        bf = cpc_program_find_buffer(p, g_full);
    cr_assert(bg >= 0 && ba >= 0 && bf >= 0);
    v[n] = (cpc_op){.kind = CPC_OP_COPY, .n_in = 1, .n_out = 1, .in = {bg}, .out = {ba}};
    v[n + 1] = (cpc_op){.kind = CPC_OP_COPY, .n_in = 1, .n_out = 1, .in = {ba}, .out = {bf}};
    v[n + 2] = (cpc_op){.kind = CPC_OP_ALL_REDUCE, .group = CPC_GROUP_WORLD, .n_in = 1, .n_out = 1, .in = {bf},
                        .out = {bg}};
    p->n_ops = n + 3;
}

Test(attack_u, classes_fall_back_to_every_member)
{
    static const struct {
        pgeo g;
        bool dk, wrong, fallback; /* dk: the dK loop (else dq's); fallback: ubreak expected */
    } rows[] = {
        {{1, 1, 6, 9, 3, 3, "ulysses 1x6 H 9 Hkv 3, text"}, true, true, true},
        {{2, 2, 5, 12, 4, 4, "unified 2x5 H 12 Hkv 4, text"}, true, true, true},
        {{0, 1, 1000, 1500, 500, 3, "ulysses_anything 1x1000 H 1500 Hkv 500, text"}, true, true, true},
        {{2, 2, 300, 600, 200, 4, "unified 2x300 H 600 Hkv 200 (overlap 2 everywhere), text"}, true, true, false},
        {{1, 1, 6, 9, 3, 3, "ulysses 1x6 H 9 Hkv 3, text"}, false, false, false},
        {{0, 1, 1000, 1500, 500, 3, "ulysses_anything 1x1000 H 1500 Hkv 500, text"}, false, false, false},
        {{2, 2, 5, 12, 4, 4, "unified 2x5 H 12 Hkv 4, text"}, false, true, false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const pgeo *g = &rows[i].g;
        cpc_status *err = NULL;
        cpc_program *p = test_bwd_program(vnames[g->v], vkinds[g->v], g->R, g->U, g->H, g->Hkv, 2 * g->R * g->U + 3,
                                          "none", "p2p", g->rep, &err);
        cr_assert_not_null(p, "%s: %s", g->what, err ? err->message : "");
        if (rows[i].dk)
            append_resum(p, "dk_rep", "dk_rep_acc", "dk_rep_full");
        else
            append_resum(p, "dq_rep", "dq_rep_acc", "dq_rep_full");
        cpc_verify_bwd_stats sa;
        double t0 = now_s();
        cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
        double dt = now_s() - t0;
        if (getenv("CPC_ATTACK_VERBOSE"))
            fprintf(stderr, "fallback %s (%s): mode %d, %d classes, %.2f ms: %s\n", g->what, rows[i].dk ? "dk" : "dq",
                    (int)sa.mode, sa.classes, dt * 1e3, a ? a->message : "proven");
        cr_expect_eq(a != NULL, rows[i].wrong, "%s (%s): %s", g->what, rows[i].dk ? "dk" : "dq",
                     a ? a->message : "proven");
        if (rows[i].fallback)
            cr_expect_eq(sa.classes, 0, "%s: the classes should have fallen back to every member (%d classes)",
                         g->what, sa.classes);
        else
            cr_expect(sa.classes > 0, "%s: %d classes", g->what, sa.classes);
        cr_expect(dt < 1.0, "%s: %.2f s", g->what, dt);
        if (g->R * g->U <= 256) {
            cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
            cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
            cr_expect_eq(e != NULL, rows[i].wrong, "%s: the enumeration says %s", g->what, e ? e->message : "proven");
            cpc_status_free(e);
        }
        cpc_status_free(a);
        cpc_program_free(p);
    }
    /* The fallback is also reached by the representation alone: the image
     * attn_bwd skipped on step 3 by a guard outside the induction's grammar
     * (`s*s!=9`: the loop unrolled), with 8 to 64 classes and a replicated
     * text, leaves each member's dq with an image run and a text run; the
     * union joins runs within the last four only (cs_add_run), so its runs
     * are pieces of the heads and uc_whole gives up (every member).  Refused
     * either way; the correct guard `s*s>=0` stays by class. */
    static const pgeo frag[] = {
        {2, 8, 8, 520, 65, 5, "unified 8x8 H 520 Hkv 65 (8 classes), text"},
        {2, 16, 8, 520, 65, 5, "unified 16x8 H 520 Hkv 65, text"},
        {2, 64, 64, 4160, 65, 5, "unified 64x64 H 4160 Hkv 65 (64 classes), text"},
    };
    for (size_t i = 0; i < sizeof frag / sizeof frag[0]; i++)
        for (int right = 0; right < 2; right++) {
            const pgeo *g = &frag[i];
            cpc_status *err = NULL;
            cpc_program *p = test_bwd_program(vnames[g->v], vkinds[g->v], g->R, g->U, g->H, g->Hkv,
                                              2 * g->R * g->U + 3, "none", "p2p", g->rep, &err);
            cr_assert_not_null(p, "%s: %s", g->what, err ? err->message : "");
            int *np = NULL;
            cpc_op *b = loop_of(p, &np);
            int att = index_of(p, b, *np, CPC_OP_ATTN_BWD, "q_seq", -1, 0);
            cr_assert(att >= 0);
            set_when(&b[att], right ? "s*s>=0" : "s*s!=9");
            cpc_verify_bwd_stats sa;
            double t0 = now_s();
            cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
            double dt = now_s() - t0;
            if (getenv("CPC_ATTACK_VERBOSE"))
                fprintf(stderr, "fallback %s (%s): mode %d, %d classes, %.2f ms: %s\n", g->what,
                        right ? "s*s>=0" : "s*s!=9", (int)sa.mode, sa.classes, dt * 1e3, a ? a->message : "proven");
            cr_expect_eq(a == NULL, right, "%s (%s): %s", g->what, right ? "s*s>=0" : "s*s!=9",
                         a ? a->message : "proven");
            cr_expect(right ? sa.classes > 0 : sa.classes == 0, "%s: %d classes", g->what, sa.classes);
            cr_expect(dt < 1.0, "%s: %.2f s", g->what, dt);
            if (g->R * g->U <= 256) {
                cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
                cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
                cr_expect_eq(e == NULL, right, "%s: the enumeration says %s", g->what, e ? e->message : "proven");
                cpc_status_free(e);
            }
            cpc_status_free(a);
            cpc_program_free(p);
        }
}

/* ---- a head part received from another member (main's fix of 4c9df2c) ---- */

/* Inserts at the top of the loop body, on step 0: send X to ulysses member
 * `ps`, recv Y from `pr`, wait, swap X and Y: X then holds what member pr
 * sent of its own X. */
static void insert_exchange(cpc_program *p, const char *X, const char *Y, const char *ps, const char *pr,
                            bool after_loop)
{
    int *np = NULL;
    cpc_op *b = loop_of(p, &np);
    cr_assert_not_null(b);
    if (after_loop) { /* before the first heads_to_seq instead, every op unguarded */
        int at = -1;
        for (int j = 0; j < p->n_ops && at < 0; j++)
            if (p->ops[j].kind == CPC_OP_ALL_TO_ALL && p->ops[j].dir == CPC_A2A_HEADS_TO_SEQ)
                at = j;
        cr_assert(at >= 0);
        int n = p->n_ops, bx = cpc_program_find_buffer(p, X), by = cpc_program_find_buffer(p, Y);
        cr_assert(bx >= 0 && by >= 0);
        cpc_op *v = realloc(p->ops, sizeof *v * (size_t)(n + 4));
        cr_assert_not_null(v);
        memmove(&v[at + 4], &v[at], sizeof *v * (size_t)(n - at));
        memset(&v[at], 0, sizeof *v * 4);
        v[at] = (cpc_op){.kind = CPC_OP_SEND, .group = CPC_GROUP_ULYSSES, .n_in = 1, .in = {bx}, .tag = 7};
        v[at].peer = expr_of(ps);
        v[at + 1] = (cpc_op){.kind = CPC_OP_RECV, .group = CPC_GROUP_ULYSSES, .n_out = 1, .out = {by}, .tag = 7};
        v[at + 1].peer = expr_of(pr);
        v[at + 1].block = expr_of("r");
        v[at + 2] = (cpc_op){.kind = CPC_OP_WAIT, .tag = 7};
        v[at + 3] = (cpc_op){.kind = CPC_OP_SWAP, .n_in = 2, .in = {bx, by}};
        p->ops = v;
        p->n_ops = n + 4;
        return;
    }
    int n = *np, bx = cpc_program_find_buffer(p, X), by = cpc_program_find_buffer(p, Y);
    cr_assert(bx >= 0 && by >= 0);
    cpc_op *v = realloc(b, sizeof *v * (size_t)(n + 4));
    cr_assert_not_null(v);
    memmove(&v[4], &v[0], sizeof *v * (size_t)n);
    memset(v, 0, sizeof *v * 4);
    v[0] = (cpc_op){.kind = CPC_OP_SEND, .group = CPC_GROUP_ULYSSES, .n_in = 1, .in = {bx}, .tag = 7};
    v[0].peer = expr_of(ps);
    v[1] = (cpc_op){.kind = CPC_OP_RECV, .group = CPC_GROUP_ULYSSES, .n_out = 1, .out = {by}, .tag = 7};
    v[1].peer = expr_of(pr);
    v[1].block = expr_of("r");
    v[2] = (cpc_op){.kind = CPC_OP_WAIT, .tag = 7};
    v[3] = (cpc_op){.kind = CPC_OP_SWAP, .n_in = 2, .in = {bx, by}};
    for (int i = 0; i < 4; i++)
        v[i].when = expr_of("s==0");
    for (int j = 0; j < p->n_ops; j++)
        if (p->ops[j].kind == CPC_OP_LOOP) {
            p->ops[j].body = v;
            p->ops[j].n_body = n + 4;
        }
}

Test(attack_u, head_part_from_another_member)
{
    static const struct {
        pgeo g;
        const char *ps, *pr;
        int wrong; /* 1 wrong, 0 right (the same K/V heads arrive) */
        bool dk;   /* after the loop: dk_cur (the partial dK) exchanged, not K on step 0 */
    } rows[] = {
        /* the partial dK of a K/V head two members share, swapped between them: the sum
         * heads_to_seq makes is the same (right); with members of other groups, wrong */
        {{2, 3, 4, 8, 2, 0, "unified 3x4 H 8 Hkv 2: partial dK swapped with the partner"}, "u+1-2*(u%2)",
         "u+1-2*(u%2)", 0, true},
        {{2, 3, 4, 8, 1, 0, "unified 3x4 H 8 Hkv 1: partial dK rotated over the members"}, "(u+1)%U", "(u-1)%U", 0,
         true},
        {{2, 3, 4, 8, 2, 0, "unified 3x4 H 8 Hkv 2: partial dK from the previous member"}, "(u+1)%U", "(u-1)%U", 1,
         true},
        {{2, 1024, 4, 8, 2, 0, "unified 1024x4 H 8 Hkv 2: partial dK from the previous member"}, "(u+1)%U",
         "(u-1)%U", 1, true},
        {{2, 3, 4, 8, 2, 0, "unified 3x4 H 8 Hkv 2: K from the previous member"}, "(u+1)%U", "(u-1)%U", 1, false},
        {{2, 3, 4, 8, 2, 0, "unified 3x4 H 8 Hkv 2: K from the partner in its group"}, "u+1-2*(u%2)", "u+1-2*(u%2)", 0, false},
        {{2, 3, 4, 8, 1, 0, "unified 3x4 H 8 Hkv 1: the one K head from the previous member"}, "(u+1)%U", "(u-1)%U", 0, false},
        {{2, 3, 4, 4, 4, 0, "unified 3x4 H 4 Hkv 4: K parts of one head each"}, "(u+1)%U", "(u-1)%U", 1, false},
        {{2, 3, 5, 12, 4, 0, "unified 3x5 H 12 Hkv 4: K parts of other sizes"}, "(u+1)%U", "(u-1)%U", 1, false},
        {{2, 3, 4, 16, 2, 0, "unified 3x4 H 16 Hkv 2: K from two members on"}, "(u+2)%U", "(u+2)%U", 1, false},
        {{2, 1024, 4, 8, 2, 0, "unified 1024x4 H 8 Hkv 2: K from the previous member"}, "(u+1)%U", "(u-1)%U", 1, false},
        {{2, 1024, 4, 4, 4, 0, "unified 1024x4 H 4 Hkv 4: K parts of one head each"}, "(u+1)%U", "(u-1)%U", 1, false},
        {{2, 300, 5, 12, 4, 0, "unified 300x5 H 12 Hkv 4: K parts of other sizes"}, "(u+1)%U", "(u-1)%U", 1, false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const pgeo *g = &rows[i].g;
        cpc_status *err = NULL;
        cpc_program *p = test_bwd_program(vnames[g->v], vkinds[g->v], g->R, g->U, g->H, g->Hkv, 2 * g->R * g->U + 3,
                                          "none", "p2p", 0, &err);
        cr_assert_not_null(p, "%s: %s", g->what, err ? err->message : "");
        if (rows[i].dk)
            insert_exchange(p, "dk_cur", "dk_blk", rows[i].ps, rows[i].pr, true);
        else
            insert_exchange(p, "k_cur", "k_nxt", rows[i].ps, rows[i].pr, false);
        cpc_status *a = cpc_verify_backward_ex(p, NULL, NULL);
        if (getenv("CPC_ATTACK_VERBOSE"))
            fprintf(stderr, "exchange %s: %s\n", g->what, a ? a->message : "proven");
        if (rows[i].wrong)
            cr_expect_not_null(a, "UNSOUND: %s: proven", g->what);
        if (!a && g->R * g->U <= 12) { /* proven: the CPU executor must agree */
            nrow w = {g->v, g->R, g->U, g->H, g->Hkv, 2 * g->R * g->U + 3, 0, "none", "p2p", g->what};
            cpc_run_report rep;
            cpc_status *st = numeric_run_u(&w, p, 20261204u + i, &rep);
            if (getenv("CPC_ATTACK_VERBOSE"))
                fprintf(stderr, "exchange %s: run %s, rel_err %.2g %.2g %.2g\n", g->what, st ? st->message : "done",
                        rep.bwd_rel_err[0], rep.bwd_rel_err[1], rep.bwd_rel_err[2]);
            cr_expect(!st && rep.bwd_checked && rep.bwd_pass, "UNSOUND: %s: proven, the run %s (rel_err %.3g %.3g %.3g)",
                      g->what, st ? st->message : "is wrong", rep.bwd_rel_err[0], rep.bwd_rel_err[1],
                      rep.bwd_rel_err[2]);
            cpc_status_free(st);
            cpc_run_report_clear(&rep);
        }
        if (g->R * g->U <= 256) {
            cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
            cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
            cr_expect_eq(e != NULL, a != NULL, "%s: default %s, enumeration %s", g->what, a ? a->message : "proven",
                         e ? e->message : "proven");
            if (rows[i].wrong)
                cr_expect_not_null(e, "%s: the enumeration proves it", g->what);
            cpc_status_free(e);
        }
        cpc_status_free(a);
        cpc_program_free(p);
    }
}

/* Exchanges between ulysses members fuzzed: a role-matched pair of buffers
 * (K, V, the partial dK/dV), on step 0 of the ring loop or before the
 * heads_to_seq, with peers from a list (some inconsistent: deadlocks), in
 * small unified worlds with GQA; every proven one runs on the CPU executor
 * and must match the float64 reference.  CPC_ATTACK_U_XCH sets the count. */
Test(attack_u, exchanges_between_members_judged_numerically)
{
    static const pgeo geos[] = {
        {2, 2, 4, 8, 2, 0, "unified 2x4 H 8 Hkv 2"}, {2, 2, 4, 8, 1, 0, "unified 2x4 H 8 Hkv 1"},
        {2, 2, 4, 8, 4, 0, "unified 2x4 H 8 Hkv 4"}, {2, 2, 3, 6, 3, 0, "unified 2x3 H 6 Hkv 3"},
        {2, 3, 4, 12, 3, 0, "unified 3x4 H 12 Hkv 3"}, {2, 2, 4, 16, 2, 0, "unified 2x4 H 16 Hkv 2"},
        {2, 2, 3, 12, 4, 0, "unified 2x3 H 12 Hkv 4"},
    };
    static const char *const pairs[][2] = {{"k_cur", "k_nxt"}, {"v_cur", "v_nxt"}, {"dk_cur", "dk_blk"},
                                           {"dv_cur", "dv_blk"}};
    static const char *const peers[][2] = {{"(u+1)%U", "(u-1)%U"}, {"u+1-2*(u%2)", "u+1-2*(u%2)"},
                                           {"(u+2)%U", "(u+2)%U"},   {"(u+2)%U", "(u-2)%U"},
                                           {"u", "u"},               {"(u+1)%U", "(u+1)%U"},
                                           {"(U-1-u)", "(U-1-u)"},   {"(u+3)%U", "(u-3)%U"}};
    const char *env = getenv("CPC_ATTACK_U_XCH");
    int rounds = env ? atoi(env) : 120;
    const uint64_t seeds[2] = {20261205u, test_seed()};
    int proven = 0, right = 0, refused = 0;
    for (int k = 0; k < rounds; k++) {
        fz z = {seeds[k < rounds / 2 ? 0 : 1], (uint32_t)(7000000 + k), 0};
        const pgeo *g = &geos[fz_rn(&z, sizeof geos / sizeof geos[0])];
        int pi = (int)fz_rn(&z, 4), qi = (int)fz_rn(&z, 8);
        bool after = pi >= 2 || fz_rn(&z, 4) == 0; /* the partial gradients only after the loop */
        if (g->U < 4 && (qi == 1 || qi == 7)) /* partner / u+3: members 0..U-1 only */
            qi = 0;
        cpc_status *err = NULL;
        cpc_program *p = test_bwd_program(vnames[g->v], vkinds[g->v], g->R, g->U, g->H, g->Hkv, 2 * g->R * g->U + 3,
                                          "none", "p2p", 0, &err);
        cr_assert_not_null(p, "%s: %s", g->what, err ? err->message : "");
        insert_exchange(p, pairs[pi][0], pairs[pi][1], peers[qi][0], peers[qi][1], after);
        cpc_status *a = cpc_verify_backward_ex(p, NULL, NULL);
        if (!a) {
            proven++;
            nrow w = {g->v, g->R, g->U, g->H, g->Hkv, 2 * g->R * g->U + 3, 0, "none", "p2p", g->what};
            cpc_run_report rep;
            cpc_status *st = numeric_run_u(&w, p, z.seed + (uint64_t)k, &rep);
            bool ok = !st && rep.bwd_checked && rep.bwd_pass;
            right += ok;
            if (getenv("CPC_ATTACK_VERBOSE"))
                fprintf(stderr, "xch %s: %s<-%s %s / %s%s: proven, run %s\n", g->what, pairs[pi][0], pairs[pi][1],
                        peers[qi][0], peers[qi][1], after ? " after the loop" : " on step 0",
                        st ? st->message : ok ? "right" : "WRONG");
            cr_expect(ok, "UNSOUND: seed %llu round %d: %s: %s exchanged (%s / %s%s): proven, the run %s (rel_err %.3g "
                          "%.3g %.3g)",
                      (unsigned long long)z.seed, k, g->what, pairs[pi][0], peers[qi][0], peers[qi][1],
                      after ? ", after the loop" : ", on step 0", st ? st->message : "is wrong", rep.bwd_rel_err[0],
                      rep.bwd_rel_err[1], rep.bwd_rel_err[2]);
            cpc_status_free(st);
            cpc_run_report_clear(&rep);
        } else {
            refused++;
            if (getenv("CPC_ATTACK_VERBOSE"))
                fprintf(stderr, "xch %s: %s<-%s %s / %s%s: %s\n", g->what, pairs[pi][0], pairs[pi][1], peers[qi][0],
                        peers[qi][1], after ? " after the loop" : " on step 0", a->message);
        }
        cpc_status_free(a);
        cpc_program_free(p);
    }
    fprintf(stderr, "attack_u exchanges: %d programs, %d proven (%d ran right), %d refused\n", rounds, proven, right,
            refused);
    cr_expect(proven > 0 && refused > 0, "the exchanges are not all one verdict (%d proven, %d refused)", proven,
              refused);
}

/* ---- tampered artifacts beyond the enumeration (what cprun and cpc.load read) ---- */

/* The artifact text of geometry g's training plan (forward and backward
 * programs, as cpc writes it); caller frees. */
static char *artifact_text(const pgeo *g)
{
    cpc_status *err = NULL;
    cpc_plan *plan = test_train_plan(vnames[g->v], g->R, g->U, g->H, g->Hkv, 2 * g->R * g->U + 3, "none", "p2p",
                                     g->rep, &err);
    cr_assert_not_null(plan, "%s: %s", g->what, err ? err->message : "");
    cpc_program *f = NULL, *b = NULL;
    cpc_status *st = cpc_schedule_build(plan, vkinds[g->v], g->R, g->U, &f);
    if (!st)
        st = cpc_schedule_build_backward(plan, vkinds[g->v], g->R, g->U, &b);
    cr_assert_null(st, "%s: %s", g->what, st ? st->message : "");
    cpc_artifact *a = NULL;
    st = cpc_artifact_create(plan, f, &a);
    if (!st)
        st = cpc_artifact_set_backward(a, b);
    cr_assert_null(st, "%s: %s", g->what, st ? st->message : "");
    char *t = NULL;
    size_t len = 0;
    st = cpc_artifact_to_string(a, &t, &len);
    cr_assert_null(st, "%s: %s", g->what, st ? st->message : "");
    cpc_artifact_free(a);
    cpc_program_free(f);
    cpc_program_free(b);
    cpc_plan_free(plan);
    return t;
}


/* The content hash recomputed, as a careful hand editor would; then loaded
 * with cpc_artifact_load (the prover runs on load). */
static cpc_status *load_rehashed(char *t)
{
    cr_assert(test_rehash(t), "no content hash to recompute");
    char path[] = "/tmp/cpc_test_attack_u_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fputs(t, f);
    fclose(f);
    cpc_artifact *a = NULL;
    cpc_status *st = cpc_artifact_load(path, &a);
    unlink(path);
    if (!cpc_status_has_error(st))
        cpc_artifact_free(a);
    return st;
}

Test(attack_u, tampered_artifacts_beyond_enumeration)
{
    static const pgeo geos[] = {
        {0, 1, 1000, 1003, 17, 0, "ulysses_anything 1x1000 H 1003 Hkv 17"},
        {0, 1, 40000, 65536, 32768, 0, "ulysses_anything 1x40000 H 65536 Hkv 32768"},
        {2, 2, 300, 301, 1, 5, "unified 2x300 H 301 Hkv 1, a replicated text"},
    };
    static const struct {
        const char *from, *to, *what;
    } edits[] = {
        {NULL, NULL, "unedited"},
        {"dir: heads_to_seq, reduce: sum, in: [dk_cur]", "dir: heads_to_seq, in: [dk_cur]", "dk placed (no reduce)"},
        {"in: [dq_seq], out: [dq]}", "in: [dq_seq], out: [dq], when: 0}", "dq never brought back"},
        {"out: [dq_seq, dk_cur, dv_cur]}", "out: [dq_seq, dk_cur, dv_cur], when: 0}", "attn_bwd dropped"},
        {"out: [dq_seq, dk_blk, dv_blk]}", "out: [dq_seq, dk_blk, dv_blk], when: s>0}", "attn_bwd skipped on step 0"},
        {"do_seq, lse, delta]", "do_seq, delta, lse]", "lse and delta swapped"},
        {"in: [dk_out, dv_out], tag: 1}", "in: [dk_out, dv_out], tag: 0}", "dK/dV sent on K/V's tag"},
    };
    int n = 0;
    for (size_t gi = 0; gi < sizeof geos / sizeof geos[0]; gi++) {
        char *base = artifact_text(&geos[gi]);
        for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
            char *t = strdup(base);
            cr_assert_not_null(t);
            if (edits[e].from && !test_bwd_text_replace(&t, edits[e].from, edits[e].to)) {
                free(t);
                continue;
            }
            n++;
            double t0 = now_s();
            cpc_status *st = load_rehashed(t);
            double dt = now_s() - t0;
            if (getenv("CPC_ATTACK_VERBOSE"))
                fprintf(stderr, "artifact %s: %s: %.1f ms: %s\n", geos[gi].what, edits[e].what, dt * 1e3,
                        st ? st->message : "loaded");
            if (!edits[e].from) {
                cr_expect(!cpc_status_has_error(st), "%s: the untampered artifact: %s", geos[gi].what,
                          st ? st->message : "");
            } else {
                cr_expect(cpc_status_has_error(st), "UNSOUND: %s: '%s' loaded", geos[gi].what, edits[e].what);
                if (cpc_status_has_error(st))
                    cr_expect_eq(st->rule, 51, "%s: '%s': rule %d: %s", geos[gi].what, edits[e].what, st->rule,
                                 st->message);
            }
            cr_expect(dt < 2.0, "%s: '%s': %.2f s", geos[gi].what, edits[e].what, dt);
            cpc_status_free(st);
            free(t);
        }
        free(base);
    }
    cr_expect(n >= 15, "%d tampered artifacts", n);
}
