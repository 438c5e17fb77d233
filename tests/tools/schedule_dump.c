/*
 * schedule_dump.c - prints every program the scheduler builds, forward
 * (cpc_schedule_build) and backward (cpc_schedule_build_backward), for a
 * matrix of small plans (every variant and factorisation of world sizes 1 to
 * 8; head counts even, GQA, uneven; tokens even and uneven; masks none,
 * causal, key_padding; rotate p2p/allgather; overlap on/off; self-,
 * cross-attention and replicated segments) and for every plan file named on
 * the command line (every variant and factorisation of its world size, with
 * both rotations and overlaps).
 *
 * For each program: the raw structure (every buffer field, every op field,
 * expressions in canonical text, spans), the text form of cpc_program_print
 * (rank -1) and the unrolled programs of rank 0 and rank P-1; for a
 * candidate the scheduler refuses, the error's code and message.  Only the
 * candidates of each variant's shape are built (ring: U == 1, ulysses:
 * R == 1, none: P == 1).  Used by
 * tests/tools/schedule_compare.sh to show that a refactor of the scheduler
 * changes no program byte: run it against two builds and diff.
 *
 * Usage: schedule_dump [PLAN.yaml ...] > dump.txt (a plan file that does
 * not load prints its error).  Exit 0.  Test tool only (not installed).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"
#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "schedule_bwd.h"

static void dump_expr(const char *key, const cpc_expr *e)
{
    if (!e)
        return;
    const char *s = cpc_expr_text(e);
    printf(" %s=%s", key, s ? s : "?");
}

static void dump_ops(const cpc_op *ops, int n, int depth)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        printf("%*sop %d kind=%d group=%d dir=%d reduce=%d tag=%d in=[", depth * 2, "", i, (int)op->kind,
               (int)op->group, (int)op->dir, (int)op->reduce, op->tag);
        for (int j = 0; j < op->n_in; j++)
            printf("%s%d", j ? "," : "", op->in[j]);
        printf("] out=[");
        for (int j = 0; j < op->n_out; j++)
            printf("%s%d", j ? "," : "", op->out[j]);
        printf("]");
        dump_expr("peer", op->peer);
        dump_expr("block", op->block);
        dump_expr("when", op->when);
        dump_expr("count", op->count);
        printf(" span=%s:%d:%d\n", op->span.file ? op->span.file : "-", op->span.line, op->span.col);
        dump_ops(op->body, op->n_body, depth + 1);
    }
}

static void dump_program(const char *what, cpc_status *st, const cpc_program *p)
{
    printf("== %s\n", what);
    if (st) {
        printf("error code=%d rule=%d: %s hint=%s\n", (int)st->code, st->rule, st->message, st->hint ? st->hint : "-");
        cpc_status_free(st);
        return;
    }
    printf("raw overlap=%d rotate=%d buffers=%d ops=%d\n", (int)p->overlap, (int)p->rotate, p->n_buffers,
           p->n_ops);
    for (int i = 0; i < p->n_buffers; i++) {
        const cpc_buffer *b = &p->buffers[i];
        printf("buf %d %s role=%d tokens=%d heads=%d io=%d\n", i, b->name, (int)b->role, (int)b->tokens,
               (int)b->heads, (int)b->io);
    }
    dump_ops(p->ops, p->n_ops, 0);
    fflush(stdout);
    int ranks[2] = {-1, 0};
    for (int i = 0; i < 3; i++) {
        int rank = i < 2 ? ranks[i] : p->layout.P - 1;
        if (i == 2 && rank <= 0)
            break;
        cpc_status *ps = cpc_program_print(stdout, p, rank);
        if (ps) {
            printf("print rank %d: error code=%d: %s\n", rank, (int)ps->code, ps->message);
            cpc_status_free(ps);
        }
        fflush(stdout);
    }
}

/* Both programs of every candidate of `plan` (world size P). */
static void dump_plan(const char *name, cpc_plan *plan)
{
    int P = plan->cluster.world_size;
    for (int v = 0; v < CPC_VARIANT__COUNT; v++) {
        if (v == CPC_VARIANT_AUTO)
            continue;
        for (int R = 1; R <= P; R++) {
            if (P % R)
                continue;
            int U = P / R;
            /* only the candidates of the variant's shape (schedule.h's
             * CPC_E_INTERNAL refusals are not programs) */
            bool ring_only = v == CPC_VARIANT_RING || v == CPC_VARIANT_RING_ANYTHING;
            bool uly_only = v == CPC_VARIANT_ULYSSES || v == CPC_VARIANT_ULYSSES_ANYTHING;
            if ((ring_only && U != 1) || (uly_only && R != 1) || (v == CPC_VARIANT_NONE && P != 1))
                continue;
            char what[512];
            cpc_program *prog = NULL;
            snprintf(what, sizeof what, "%s forward %s %dx%d", name, cpc_variant_name((cpc_variant)v), R, U);
            cpc_status *st = cpc_schedule_build(plan, (cpc_variant)v, R, U, &prog);
            dump_program(what, st, prog);
            cpc_program_free(prog);
            prog = NULL;
            snprintf(what, sizeof what, "%s backward %s %dx%d", name, cpc_variant_name((cpc_variant)v), R, U);
            st = cpc_schedule_build_backward(plan, (cpc_variant)v, R, U, &prog);
            dump_program(what, st, prog);
            cpc_program_free(prog);
        }
    }
}

/* Every rotation and overlap of one loaded plan. */
static void dump_schedules(const char *name, cpc_plan *plan)
{
    for (int rot = 0; rot < CPC_ROTATE__COUNT; rot++)
        for (int ov = 0; ov < 2; ov++) {
            char n2[400];
            snprintf(n2, sizeof n2, "%s rotate=%d overlap=%d", name, rot, ov);
            plan->schedule.rotate = (cpc_rotate)rot;
            plan->schedule.overlap = ov;
            dump_plan(n2, plan);
        }
}

int main(int argc, char **argv)
{
    static const int worlds[] = {1, 2, 4, 6, 8};
    static const int heads[][2] = {{8, 8}, {8, 2}, {6, 1}, {3, 3}};
    static const int tokens[] = {96, 61};
    static const char *const masks[] = {"none", "causal", "key_padding"};
    static const char *const extra[] = {"", "cross", "rep"};
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
        for (size_t h = 0; h < sizeof heads / sizeof *heads; h++)
            for (size_t t = 0; t < sizeof tokens / sizeof *tokens; t++)
                for (size_t m = 0; m < sizeof masks / sizeof *masks; m++)
                    for (size_t x = 0; x < sizeof extra / sizeof *extra; x++) {
                        char tk[200], y[1200];
                        if (strcmp(extra[x], "rep") == 0)
                            snprintf(tk, sizeof tk,
                                     "segments: [{name: text, tokens: 5, split: replicate}, "
                                     "{name: image, tokens: %d}]",
                                     tokens[t]);
                        else if (strcmp(extra[x], "cross") == 0)
                            snprintf(tk, sizeof tk, "tokens: %d, kv: {tokens: 40}", tokens[t]);
                        else
                            snprintf(tk, sizeof tk, "tokens: %d", tokens[t]);
                        snprintf(y, sizeof y,
                                 "version: 1\nname: t\nmodel: {heads: %d, kv_heads: %d, head_dim: 8, dtype: "
                                 "bf16}\ninput: {batch: 1, %s, mask: %s, mode: training}\n"
                                 "cluster: {world_size: %d}\n",
                                 heads[h][0], heads[h][1], tk, masks[m], worlds[w]);
                        cpc_plan *plan = NULL;
                        cpc_status *st = cpc_plan_load_string(y, strlen(y), "t.yaml", NULL, 0, &plan);
                        char name[300];
                        snprintf(name, sizeof name, "P=%d H=%d/%d T=%d mask=%s %s", worlds[w], heads[h][0],
                                 heads[h][1], tokens[t], masks[m], extra[x]);
                        if (cpc_status_has_error(st) || !plan) {
                            printf("== %s: plan error: %s\n", name, st ? st->message : "?");
                            cpc_status_free(st);
                            cpc_plan_free(plan);
                            continue;
                        }
                        cpc_status_free(st);
                        dump_schedules(name, plan);
                        cpc_plan_free(plan);
                    }
    for (int i = 1; i < argc; i++) {
        cpc_plan *plan = NULL;
        cpc_status *st = cpc_plan_load_file(argv[i], NULL, 0, &plan);
        if (cpc_status_has_error(st) || !plan) {
            printf("== %s: plan error: %s\n", argv[i], st ? st->message : "not loaded");
        } else {
            dump_schedules(argv[i], plan);
        }
        cpc_status_free(st);
        cpc_plan_free(plan);
    }
    return 0;
}
