/* test_lua.c - embedded Lua schedule scripts (compiler/lua_script.h, SPEC
 * section 6): the example scripts of lua/examples on real schedules (FLUX.1-dev
 * 1024x1024, ring 4 and unified 2x2), the prelude's helpers, and every way a
 * script can be wrong, each with its code (CP050 or the verifier's CP051),
 * the script line, and the original program left untouched. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cost.h"
#include "lua_script.h"
#include "plan_load.h"
#include "schedule.h"
#include "validate.h"
#include "verify.h"

#define FLUX "plans/flux1-dev-1024.yaml"

/* ---- helpers ------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static cpc_plan *load_plan(const char *const *sets, int n)
{
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_file(FLUX, sets, n, &plan);
    cr_assert(!cpc_status_has_error(st), "load %s: %s", FLUX, st ? st->message : "");
    cpc_status_free(st);
    cr_assert_not_null(plan);
    return plan;
}

static cpc_plan *ring4_plan(void)
{
    const char *sets[] = {"parallel.variant=ring", "parallel.ulysses_degree=1"};
    return load_plan(sets, 2);
}

static cpc_program *build(const cpc_plan *plan, cpc_variant v, int R, int U)
{
    cpc_program *prog = NULL;
    cpc_status *st = cpc_schedule_build(plan, v, R, U, &prog);
    cr_assert_null(st, "schedule %s %dx%d: %s", cpc_variant_name(v), R, U, st ? st->message : "");
    return prog;
}

static char *text_of(const cpc_program *prog, int rank)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cpc_status *st = cpc_program_print(f, prog, rank);
    cr_assert_null(st, "print: %s", st ? st->message : "");
    fclose(f);
    return buf;
}

static cpc_lua_script *open_text(const char *name, const char *text)
{
    cpc_lua_script *s = NULL;
    cpc_status *st = cpc_lua_open(name, text, strlen(text), NULL, &s);
    cr_assert_null(st, "open %s: %s", name, st ? st->message : "");
    return s;
}

static cpc_lua_script *open_file(const char *path)
{
    cpc_lua_script *s = NULL;
    cpc_status *st = cpc_lua_open_file(path, NULL, &s);
    cr_assert_null(st, "open %s: %s", path, st ? st->message : "");
    cr_assert_not_null(s);
    return s;
}

/* A program and everything needed to show it was not touched. */
typedef struct fixture {
    cpc_plan *plan;
    cpc_program *prog;
    char *before;          /* text form before the script */
    const cpc_op *ops;     /* array pointers before the script */
    const cpc_buffer *bufs;
} fixture;

static fixture fx_ring4(void)
{
    fixture f = {.plan = ring4_plan()};
    f.prog = build(f.plan, CPC_VARIANT_RING, 4, 1);
    f.before = text_of(f.prog, -1);
    f.ops = f.prog->ops;
    f.bufs = f.prog->buffers;
    return f;
}

static void fx_untouched(const fixture *f)
{
    char *after = text_of(f->prog, -1);
    cr_assert_str_eq(after, f->before, "the original program changed");
    cr_assert_eq(f->prog->ops, f->ops);
    cr_assert_eq(f->prog->buffers, f->bufs);
    free(after);
}

static void fx_free(fixture *f)
{
    free(f->before);
    cpc_program_free(f->prog);
    cpc_plan_free(f->plan);
}

/* Asserts a single-error chain of class plan with `rule` at name:line
 * (line 0: any) whose message contains `needle` (NULL: any). */
static void expect_err(cpc_status *st, int rule, const char *file, int line, const char *needle)
{
    cr_assert_not_null(st, "expected CP%03d, got success", rule);
    char *txt = cpc_status_format(st, "test");
    cr_assert_eq(st->code, CPC_E_PLAN, "class %s: %s", cpc_code_name(st->code), txt);
    cr_assert_eq(st->severity, CPC_SEV_ERROR, "%s", txt);
    cr_assert_eq(st->rule, rule, "rule %d, expected %d: %s", st->rule, rule, txt);
    if (file) {
        cr_assert_not_null(st->span.file, "no span: %s", txt);
        cr_assert_str_eq(st->span.file, file, "%s", txt);
    }
    if (line > 0)
        cr_assert_eq(st->span.line, line, "line %d, expected %d: %s", st->span.line, line, txt);
    if (needle)
        cr_assert(strstr(st->message, needle), "'%s' not in: %s", needle, txt);
    free(txt);
}

/* Runs a schedule() script given as text on FLUX ring 4; expects error
 * `rule` at `line` mentioning `needle`, and the program untouched. */
static void expect_schedule_fails(const char *text, int rule, int line, const char *needle)
{
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("bad.lua", text);
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    expect_err(st, rule, rule == CPC_RULE_LUA ? "bad.lua" : NULL, line, needle);
    cpc_status_free(st);
    fx_untouched(&f);
    cpc_lua_close(s);
    fx_free(&f);
}

/* ---- the examples ----------------------------------------------------------- */

Test(lua_examples, no_overlap_equals_the_compilers_overlap_off)
{
    const char *off_sets[][3] = {{"parallel.variant=ring", "parallel.ulysses_degree=1", "schedule.overlap=false"},
                                 {"parallel.variant=unified", "parallel.ring_degree=2", "schedule.overlap=false"}};
    const char *on_sets[][2] = {{"parallel.variant=ring", "parallel.ulysses_degree=1"},
                                {"parallel.variant=unified", "parallel.ring_degree=2"}};
    cpc_variant vs[] = {CPC_VARIANT_RING, CPC_VARIANT_UNIFIED};
    int Rs[] = {4, 2}, Us[] = {1, 2};
    for (int i = 0; i < 2; i++) {
        cpc_plan *on = load_plan(on_sets[i], 2);
        cpc_plan *off = load_plan(off_sets[i], 3);
        cpc_program *prog = build(on, vs[i], Rs[i], Us[i]);
        cpc_program *want = build(off, vs[i], Rs[i], Us[i]);
        char *t_on = text_of(prog, -1), *t_want = text_of(want, -1);
        cr_assert_str_neq(t_on, t_want, "overlap on and off should differ");
        cpc_lua_script *s = open_file("lua/examples/no_overlap.lua");
        cr_assert(cpc_lua_has_schedule(s));
        cr_assert_not(cpc_lua_has_choose(s));
        cpc_status *st = cpc_lua_schedule(s, on, prog);
        cr_assert_null(st, "%s", st ? st->message : "");
        char *t_got = text_of(prog, -1);
        cr_assert_str_eq(t_got, t_want, "%s %dx%d: got\n%s\nwant\n%s", cpc_variant_name(vs[i]), Rs[i], Us[i],
                         t_got, t_want);
        cr_assert_not(prog->overlap);
        free(t_on);
        free(t_want);
        free(t_got);
        cpc_lua_close(s);
        cpc_program_free(prog);
        cpc_program_free(want);
        cpc_plan_free(on);
        cpc_plan_free(off);
    }
}

Test(lua_examples, no_overlap_leaves_ulysses_alone)
{
    cpc_plan *plan = load_plan(NULL, 0); /* FLUX as written: ulysses 1x4 */
    cpc_program *prog = build(plan, CPC_VARIANT_ULYSSES, 1, 4);
    char *before = text_of(prog, -1);
    cpc_lua_script *s = open_file("lua/examples/no_overlap.lua");
    cpc_status *st = cpc_lua_schedule(s, plan, prog);
    cr_assert_null(st, "%s", st ? st->message : "");
    char *after = text_of(prog, -1);
    cr_assert_str_eq(after, before);
    free(before);
    free(after);
    cpc_lua_close(s);
    cpc_program_free(prog);
    cpc_plan_free(plan);
}

/* The rewritten program moves the same bytes and holds the same memory as
 * the compiler's own rotate=allgather program, on every rank, and passes the
 * verifier (inside cpc_lua_schedule). */
Test(lua_examples, allgather_rotation_matches_the_compilers)
{
    const char *p2p_sets[][2] = {{"parallel.variant=ring", "parallel.ulysses_degree=1"},
                                 {"parallel.variant=unified", "parallel.ring_degree=2"}};
    const char *ag_sets[][3] = {{"parallel.variant=ring", "parallel.ulysses_degree=1", "schedule.rotate=allgather"},
                                {"parallel.variant=unified", "parallel.ring_degree=2", "schedule.rotate=allgather"}};
    cpc_variant vs[] = {CPC_VARIANT_RING, CPC_VARIANT_UNIFIED};
    int Rs[] = {4, 2}, Us[] = {1, 2};
    for (int i = 0; i < 2; i++) {
        cpc_plan *p2p = load_plan(p2p_sets[i], 2);
        cpc_plan *ag = load_plan(ag_sets[i], 3);
        cpc_program *prog = build(p2p, vs[i], Rs[i], Us[i]);
        cpc_program *want = build(ag, vs[i], Rs[i], Us[i]);
        int64_t sent_before = 0;
        cr_assert_null(cpc_program_bytes_sent(prog, 0, &sent_before, NULL));
        cpc_lua_script *s = open_file("lua/examples/allgather.lua");
        cpc_status *st = cpc_lua_schedule(s, p2p, prog);
        cr_assert_null(st, "%s", st ? st->message : "");
        cr_assert_eq(prog->rotate, CPC_ROTATE_ALLGATHER);
        for (int p = 0; p < 4; p++) {
            int64_t got = -1, exp = -2, got_r = -1, exp_r = -2;
            cr_assert_null(cpc_program_bytes_sent(prog, p, &got, &got_r));
            cr_assert_null(cpc_program_bytes_sent(want, p, &exp, &exp_r));
            cr_assert_eq(got, exp, "rank %d sends %lld, compiler's allgather %lld", p, (long long)got,
                         (long long)exp);
            cr_assert_eq(got_r, exp_r);
            cr_assert_eq(cpc_program_peak_bytes(prog, p), cpc_program_peak_bytes(want, p), "rank %d memory", p);
        }
        int64_t sent_after = 0;
        cr_assert_null(cpc_program_bytes_sent(prog, 0, &sent_after, NULL));
        cr_assert_gt(sent_after, 0);
        cr_assert_gt(sent_before, 0);
        /* no send/recv remains */
        char *t = text_of(prog, -1);
        cr_assert_null(strstr(t, "send "), "%s", t);
        cr_assert_null(strstr(t, "recv "), "%s", t);
        cr_assert_not_null(strstr(t, "all_gather group=ring in=k_cur out=k_all"), "%s", t);
        cr_assert_not_null(strstr(t, "block=(r-s)%R"), "%s", t);
        cr_assert_null(strstr(t, "k_nxt"), "%s", t);
        free(t);
        /* and it verifies on its own */
        cpc_status *v = cpc_verify(prog);
        cr_assert_null(v, "%s", v ? v->message : "");
        cpc_lua_close(s);
        cpc_program_free(prog);
        cpc_program_free(want);
        cpc_plan_free(p2p);
        cpc_plan_free(ag);
    }
}

/* Candidates as the compiler makes them: validated and priced. */
static cpc_selection priced(const cpc_plan *plan)
{
    cpc_selection sel;
    cpc_status *st = cpc_validate_priced(plan, cpc_cost_price_candidate, NULL, &sel);
    cr_assert(!cpc_status_has_error(st), "validate: %s", st ? st->message : "");
    cpc_status_free(st);
    return sel;
}

Test(lua_examples, min_memory_chooses_the_least_memory)
{
    const char *sets[] = {"parallel.variant=auto"};
    cpc_plan *plan = load_plan(sets, 1);
    cpc_selection sel = priced(plan);
    /* the policy computed here: least memory, ties within 1% to the faster */
    int want = -1, n_ok = 0;
    for (int i = 0; i < sel.n_candidates; i++) {
        const cpc_candidate *c = &sel.candidates[i];
        if (!c->ok)
            continue;
        n_ok++;
        cr_assert(c->priced);
        if (want < 0) {
            want = i;
            continue;
        }
        const cpc_candidate *b = &sel.candidates[want];
        if (c->memory_bytes_per_rank < b->memory_bytes_per_rank * 0.99 ||
            (c->memory_bytes_per_rank <= b->memory_bytes_per_rank * 1.01 &&
             c->predicted_ms_per_layer < b->predicted_ms_per_layer))
            want = i;
    }
    cr_assert_geq(n_ok, 3);
    cpc_lua_script *s = open_file("lua/examples/min_memory.lua");
    cr_assert(cpc_lua_has_choose(s));
    int chosen = -7;
    cpc_status *st = cpc_lua_choose(s, plan, sel.candidates, sel.n_candidates, &chosen);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(chosen, want, "chose %d (%s), want %d (%s)", chosen,
                 chosen >= 0 ? cpc_variant_name(sel.candidates[chosen].variant) : "-", want,
                 cpc_variant_name(sel.candidates[want].variant));
    for (int i = 0; i < sel.n_candidates; i++)
        if (sel.candidates[i].ok)
            cr_assert_geq(sel.candidates[i].memory_bytes_per_rank * 1.01,
                          sel.candidates[chosen].memory_bytes_per_rank);
    cpc_lua_close(s);
    cpc_selection_free(&sel);
    cpc_plan_free(plan);
}

/* Hand-made candidates: the policy, not the cost model, decides. */
Test(lua_examples, min_memory_hand_made)
{
    const char *sets[] = {"parallel.variant=auto"};
    cpc_plan *plan = load_plan(sets, 1);
    cpc_candidate c[4] = {
        {.variant = CPC_VARIANT_ULYSSES, .ring_degree = 1, .ulysses_degree = 4, .ok = true, .priced = true,
         .predicted_ms_per_layer = 1.0, .memory_bytes_per_rank = 900},
        {.variant = CPC_VARIANT_UNIFIED, .ring_degree = 2, .ulysses_degree = 2, .ok = false, .priced = true,
         .predicted_ms_per_layer = 0.5, .memory_bytes_per_rank = 100}, /* invalid: never offered */
        {.variant = CPC_VARIANT_RING, .ring_degree = 4, .ulysses_degree = 1, .ok = true, .priced = true,
         .predicted_ms_per_layer = 3.0, .memory_bytes_per_rank = 500},
        {.variant = CPC_VARIANT_RING_ANYTHING, .ring_degree = 4, .ulysses_degree = 1, .ok = true,
         .priced = true, .predicted_ms_per_layer = 2.0, .memory_bytes_per_rank = 502},
    };
    cpc_lua_script *s = open_file("lua/examples/min_memory.lua");
    int chosen = -1;
    cpc_status *st = cpc_lua_choose(s, plan, c, 4, &chosen);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(chosen, 3, "ring_anything: within 1%% of ring's memory and faster");
    c[3].memory_bytes_per_rank = 700;
    st = cpc_lua_choose(s, plan, c, 4, &chosen);
    cr_assert_null(st);
    cr_assert_eq(chosen, 2);
    cpc_lua_close(s);
    cpc_plan_free(plan);
}

Test(lua_examples, ring_across_nodes)
{
    /* 16 ranks on two nodes of 8: the ulysses group must stay in a node */
    const char *sets2[] = {"parallel.variant=auto", "cluster.world_size=16", "cluster.gpus_per_node=8"};
    cpc_plan *plan = load_plan(sets2, 3);
    cpc_selection sel = priced(plan);
    int want = -1;
    for (int i = 0; i < sel.n_candidates; i++) {
        const cpc_candidate *c = &sel.candidates[i];
        if (!c->ok || 8 % c->ulysses_degree != 0)
            continue;
        if (want < 0 || c->ulysses_degree > sel.candidates[want].ulysses_degree ||
            (c->ulysses_degree == sel.candidates[want].ulysses_degree &&
             c->predicted_ms_per_layer < sel.candidates[want].predicted_ms_per_layer))
            want = i;
    }
    cr_assert_geq(want, 0);
    cr_assert_eq(sel.candidates[want].ulysses_degree, 8, "FLUX 16 ranks: unified 2x8 keeps ulysses in a node");
    cpc_lua_script *s = open_file("lua/examples/ring_across_nodes.lua");
    int chosen = -1;
    cpc_status *st = cpc_lua_choose(s, plan, sel.candidates, sel.n_candidates, &chosen);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(chosen, want, "chose %s %dx%d", cpc_variant_name(sel.candidates[chosen].variant),
                 sel.candidates[chosen].ring_degree, sel.candidates[chosen].ulysses_degree);
    cpc_selection_free(&sel);
    cpc_plan_free(plan);

    /* one node: the fastest */
    const char *sets1[] = {"parallel.variant=auto", "cluster.world_size=8", "cluster.gpus_per_node=8"};
    plan = load_plan(sets1, 3);
    sel = priced(plan);
    want = -1;
    for (int i = 0; i < sel.n_candidates; i++)
        if (sel.candidates[i].ok &&
            (want < 0 || sel.candidates[i].predicted_ms_per_layer < sel.candidates[want].predicted_ms_per_layer))
            want = i;
    st = cpc_lua_choose(s, plan, sel.candidates, sel.n_candidates, &chosen);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(chosen, want);
    cpc_selection_free(&sel);
    cpc_plan_free(plan);
    cpc_lua_close(s);
}

/* ---- what schedule() sees ---------------------------------------------------- */

Test(lua_view, plan_fields_and_round_trip)
{
    fixture f = fx_ring4();
    const char *text =
        "function schedule(plan)\n"
        "  local c = plan.config\n"
        "  assert(c.model.heads == 24 and c.model.head_dim == 128 and c.model.dtype == 'bf16')\n"
        "  assert(c.input.tokens == 4608 and #c.input.segments == 2)\n"
        "  assert(c.input.segments[1].name == 'text' and c.input.segments[2].tokens == 4096)\n"
        "  assert(c.parallel.variant == 'ring' and c.parallel.ring_degree == 4)\n"
        "  assert(c.parallel.ulysses_degree == 1 and c.cluster.world_size == 4 and c.cluster.nodes == 1)\n"
        "  assert(c.schedule.overlap == true and c.schedule.rotate == 'p2p')\n"
        "  local n = 0; for k, v in pairs(c.model) do n = n + 1 end; assert(n == 6, n)\n"
        "  local segs = 0; for i, s in ipairs(c.input.segments) do segs = segs + 1 end; assert(segs == 2)\n"
        "  assert(plan.config.model == plan.config.model)\n"
        "  assert(getmetatable(c) == 'read-only')\n"
        "  assert(cpc.mesh.R == 4 and cpc.mesh.U == 1 and cpc.mesh.P == 4)\n"
        "  assert(#plan.buffers == 10 and plan.buffers[1].name == 'q' and plan.buffers[1].io == 'input')\n"
        "  assert(plan.ops[1].kind == 'init_acc' and plan.ops[1].out[1] == 'acc')\n"
        "  local loop = plan.ops[2]\n"
        "  assert(loop.kind == 'loop' and loop.count == 'R' and #loop.body == 7)\n"
        "  local send = loop.body[1]\n"
        "  assert(send.kind == 'send' and send.group == 'ring' and send.peer == '(r+1)%R')\n"
        "  assert(send['in'][1] == 'k_cur' and send.tag == 0 and send.when == 's<R-1' and send.step == nil)\n"
        "  assert(loop.body[2].block == '(r-s-1)%R')\n"
        "  assert(plan.overlap == true and plan.rotate == 'p2p')\n"
        "  -- return a copy: a new array of new tables\n"
        "  local out = {}\n"
        "  for i, op in ipairs(plan.ops) do out[i] = cpc.copy(op) end\n"
        "  return out\n"
        "end\n";
    cpc_lua_script *s = open_text("view.lua", text);
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    cr_assert_null(st, "%s", st ? cpc_status_format(st, "t") : "");
    char *after = text_of(f.prog, -1);
    cr_assert_str_eq(after, f.before, "a copy of the program must come back identical");
    free(after);
    cpc_lua_close(s);
    fx_free(&f);
}

Test(lua_view, unchanged_ops_keep_their_spans_changed_ops_get_the_script_line)
{
    fixture f = fx_ring4();
    const char *text =
        "function schedule(plan)\n"
        "  cpc.insert_barrier(plan.ops, 1)\n"           /* line 2 */
        "  plan.ops[#plan.ops + 1] = cpc.op{kind = 'barrier', group = 'world'}\n" /* line 3 */
        "end\n";
    cpc_lua_script *s = open_text("spans.lua", text);
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    cr_assert_null(st, "%s", st ? cpc_status_format(st, "t") : "");
    cr_assert_eq(f.prog->n_ops, 5);
    cr_assert_eq(f.prog->ops[0].kind, CPC_OP_BARRIER);
    cr_assert_eq(f.prog->ops[0].group, CPC_GROUP_WORLD);
    cr_assert_str_eq(f.prog->ops[0].span.file, "spans.lua");
    cr_assert_eq(f.prog->ops[0].span.line, 2);
    cr_assert_eq(f.prog->ops[4].span.line, 3);
    cr_assert_null(f.prog->ops[1].span.file, "the compiler's init_acc keeps its (empty) span");
    cr_assert_eq(f.prog->ops[2].kind, CPC_OP_LOOP);
    cpc_lua_close(s);
    fx_free(&f);
}

Test(lua_view, no_schedule_function_is_a_no_op)
{
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("empty.lua", "local x = 1\n");
    cr_assert_not(cpc_lua_has_schedule(s));
    cr_assert_null(cpc_lua_schedule(s, f.plan, f.prog));
    int chosen = 42;
    cpc_candidate c = {.variant = CPC_VARIANT_RING, .ring_degree = 4, .ulysses_degree = 1, .ok = true};
    cr_assert_null(cpc_lua_choose(s, f.plan, &c, 1, &chosen));
    cr_assert_eq(chosen, 42);
    fx_untouched(&f);
    cpc_lua_close(s);
    fx_free(&f);
}

/* ---- the prelude --------------------------------------------------------------- */

Test(lua_prelude, embedded)
{
    const char *src = cpc_lua_prelude_source();
    cr_assert_not_null(src);
    cr_assert_not_null(strstr(src, "function cpc.swap"));
    cr_assert_not_null(strstr(src, "function cpc.insert_barrier"));
}

Test(lua_prelude, find_walk_and_eval)
{
    fixture f = fx_ring4();
    const char *text =
        "function schedule(plan)\n"
        "  local all = cpc.find(plan.ops, 'send')\n"
        "  assert(#all == 1 and all[1].index == 1 and all[1].loop == plan.ops[2], 'find send')\n"
        "  assert(#cpc.find(plan.ops, 'send', 0) == 1, 'send at step 0')\n"
        "  assert(#cpc.find(plan.ops, 'send', 3) == 0, 'no send at the last step')\n"
        "  assert(#cpc.find(plan.ops, 'attn', 3) == 1, 'attn at every step')\n"
        "  assert(#cpc.find(plan.ops, 'attn', 4) == 0, 'no step 4')\n"
        "  assert(#cpc.find(plan.ops, 'copy', 0) == 0, 'top-level ops have no step')\n"
        "  assert(#cpc.find(plan.ops) == 10, 'every op')\n"
        "  local kinds = {}\n"
        "  cpc.walk(plan.ops, function(op, list, i, loop) kinds[#kinds + 1] = op.kind end)\n"
        "  assert(table.concat(kinds, ',') == 'init_acc,loop,send,recv,attn,merge,wait,swap,swap,copy', table.concat(kinds, ','))\n"
        "  local n = 0\n"
        "  assert(cpc.walk(plan.ops, function() n = n + 1; if n == 3 then return false end end) == false and n == 3)\n"
        "end\n";
    cpc_lua_script *s = open_text("find.lua", text);
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    cr_assert_null(st, "%s", st ? cpc_status_format(st, "t") : "");
    cpc_lua_close(s);
    fx_free(&f);
}

/* cpc.eval in Lua agrees with the compiler's evaluator (expr.h) on every
 * rank and step of several meshes. */
Test(lua_prelude, eval_agrees_with_expr_h)
{
    static const char *exprs[] = {"(r+1)%R", "(r-s-1)%R", "s<R-1", "r*U+u", "(p-7)/3", "-7%2",
                                  "min(r,u)+max(s,2)*3", "!(s==1)||r>=2&&u!=0", "-(r-5)/2", "p%U+P",
                                  "(r-3)/-2", "(r-3)%-2", "(u-s)%(R+1)"};
    for (int Rv = 1; Rv <= 4; Rv++)
        for (int Uv = 1; Uv <= 3; Uv++) {
            char *src = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&src, &len);
            fprintf(f, "function choose(c)\n  local got = {}\n");
            for (int r = 0; r < Rv; r++)
                for (int u = 0; u < Uv; u++)
                    for (int sv = 0; sv < 3; sv++)
                        for (size_t e = 0; e < sizeof exprs / sizeof exprs[0]; e++)
                            fprintf(f, "  got[#got+1] = cpc.eval('%s', {r=%d, u=%d, s=%d, R=%d, U=%d})\n",
                                    exprs[e], r, u, sv, Rv, Uv);
            fprintf(f, "  _G.got = got\n  return c[1]\nend\n");
            fprintf(f, "function results() return table.concat(_G.got, ',') end\n");
            fclose(f);
            /* expected, from expr.h */
            char *want = NULL;
            size_t wl = 0;
            FILE *w = open_memstream(&want, &wl);
            int k = 0;
            for (int r = 0; r < Rv; r++)
                for (int u = 0; u < Uv; u++)
                    for (int sv = 0; sv < 3; sv++)
                        for (size_t e = 0; e < sizeof exprs / sizeof exprs[0]; e++) {
                            cpc_expr *x = NULL;
                            cr_assert_null(cpc_expr_parse(exprs[e], CPC_NO_SPAN, &x));
                            cpc_coords c = {.r = r, .u = u, .p = r * Uv + u, .s = sv, .R = Rv, .U = Uv,
                                            .P = Rv * Uv};
                            int64_t v;
                            cr_assert_null(cpc_expr_eval(x, &c, &v));
                            fprintf(w, "%s%lld", k++ ? "," : "", (long long)v);
                            cpc_expr_free(x);
                        }
            fclose(w);
            /* run choose(), then read the results back through a second
             * choose that returns them in an error message */
            size_t l2 = strlen(src) + 200;
            char *src2 = malloc(l2);
            snprintf(src2, l2, "%s\nlocal first = choose\nfunction choose(c) first(c); error('R=' .. results()) end\n",
                     src);
            cpc_lua_script *s = open_text("eval.lua", src2);
            cpc_plan *plan = ring4_plan();
            cpc_candidate cand = {.variant = CPC_VARIANT_RING, .ring_degree = 4, .ulysses_degree = 1, .ok = true};
            int chosen = -1;
            cpc_status *st = cpc_lua_choose(s, plan, &cand, 1, &chosen);
            cr_assert_not_null(st);
            const char *m = strstr(st->message, "R=");
            cr_assert_not_null(m, "%s", st->message);
            cr_assert_str_eq(m + 2, want, "R=%d U=%d", Rv, Uv);
            cpc_status_free(st);
            cpc_lua_close(s);
            cpc_plan_free(plan);
            free(src);
            free(src2);
            free(want);
        }
}

Test(lua_prelude, swap_only_when_legal)
{
    /* legal: wait past merge (no common buffer); illegal: attn and merge
     * (merge reads attn's output) */
    fixture f = fx_ring4();
    const char *ok =
        "function schedule(plan)\n"
        "  local body = plan.ops[2].body\n"
        "  cpc.swap(body, 4, 5)\n"                  /* merge <-> wait */
        "  cpc.swap(body, 4, 5)\n"                  /* and back */
        "end\n";
    cpc_lua_script *s = open_text("swap.lua", ok);
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    cr_assert_null(st, "%s", st ? cpc_status_format(st, "t") : "");
    char *after = text_of(f.prog, -1);
    cr_assert_str_eq(after, f.before);
    free(after);
    cpc_lua_close(s);
    fx_free(&f);

    expect_schedule_fails("function schedule(plan)\n"
                          "  local body = plan.ops[2].body\n"
                          "  cpc.swap(body, 3, 4)\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "cannot swap ops 3 (attn) and 4 (merge)");
    /* wait before its recv: the wait completes it */
    expect_schedule_fails("function schedule(plan)\n"
                          "  local body = plan.ops[2].body\n"
                          "\n"
                          "  cpc.swap(body, 2, 5)\n"
                          "end\n",
                          CPC_RULE_LUA, 4, "cannot swap");
}

Test(lua_prelude, insert_barrier_verifies)
{
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("barrier.lua", "function schedule(plan)\n"
                                                 "  cpc.insert_barrier(plan.ops[2].body, 3, 'ring')\n"
                                                 "  cpc.insert_barrier(plan.ops, #plan.ops + 1)\n"
                                                 "end\n");
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    cr_assert_null(st, "%s", st ? cpc_status_format(st, "t") : "");
    cr_assert_eq(f.prog->ops[1].body[2].kind, CPC_OP_BARRIER);
    cr_assert_eq(f.prog->ops[1].body[2].group, CPC_GROUP_RING);
    cr_assert_eq(f.prog->ops[f.prog->n_ops - 1].kind, CPC_OP_BARRIER);
    cr_assert_eq(f.prog->ops[f.prog->n_ops - 1].group, CPC_GROUP_WORLD);
    cpc_lua_close(s);
    fx_free(&f);
}

/* ---- every way a script can be wrong --------------------------------------------- */

Test(lua_errors, syntax_error)
{
    cpc_lua_script *s = NULL;
    const char *text = "function schedule(plan)\n  local x = = 1\nend\n";
    cpc_status *st = cpc_lua_open("syntax.lua", text, strlen(text), NULL, &s);
    expect_err(st, CPC_RULE_LUA, "syntax.lua", 2, "syntax error");
    cr_assert_null(s);
    cpc_status_free(st);
}

Test(lua_errors, runtime_error_in_the_main_chunk)
{
    cpc_lua_script *s = NULL;
    const char *text = "local a = 1\nlocal b = nil + a\n";
    cpc_status *st = cpc_lua_open("main.lua", text, strlen(text), NULL, &s);
    expect_err(st, CPC_RULE_LUA, "main.lua", 2, "arithmetic on a nil value");
    cr_assert_null(s);
    cpc_status_free(st);
}

Test(lua_errors, runtime_error)
{
    expect_schedule_fails("local function helper(t)\n"
                          "  return t.x.y\n"
                          "end\n"
                          "function schedule(plan)\n"
                          "  helper(plan)\n"
                          "end\n",
                          CPC_RULE_LUA, 2, "attempt to index a nil value");
}

Test(lua_errors, traceback_is_a_note)
{
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("tb.lua", "local function inner() error('boom') end\n"
                                            "function schedule(plan)\n"
                                            "  inner()\n"
                                            "end\n");
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    expect_err(st, CPC_RULE_LUA, "tb.lua", 1, "boom");
    bool seen = false;
    for (const cpc_status *n = st->notes; n; n = n->next)
        if (n->span.file && strcmp(n->span.file, "tb.lua") == 0 && n->span.line == 3)
            seen = true;
    cr_assert(seen, "a traceback note at tb.lua:3");
    cpc_status_free(st);
    fx_untouched(&f);
    cpc_lua_close(s);
    fx_free(&f);
}

Test(lua_errors, endless_loop_stops_within_two_seconds)
{
    double t0 = now_s();
    expect_schedule_fails("function schedule(plan)\n"
                          "  local i = 0\n"
                          "  while true do i = i + 1 end\n"
                          "end\n",
                          CPC_RULE_LUA, 3, NULL);
    double dt = now_s() - t0;
    cr_assert_lt(dt, 2.5, "took %.2f s", dt);
}

Test(lua_errors, endless_loop_under_pcall_stops)
{
    double t0 = now_s();
    expect_schedule_fails("function schedule(plan)\n"
                          "  while true do\n"
                          "    pcall(function() while true do end end)\n"
                          "    xpcall(function() while true do end end, function(e) return e end)\n"
                          "  end\n"
                          "end\n",
                          CPC_RULE_LUA, 0, "exceeded");
    cr_assert_lt(now_s() - t0, 2.5);
}

Test(lua_errors, memory_bomb_stops_within_two_seconds)
{
    /* default limits: the memory cap (or, on a slow machine, the 1 s clock)
     * stops it */
    double t0 = now_s();
    expect_schedule_fails("function schedule(plan)\n"
                          "  local t = {}\n"
                          "  while true do t[#t + 1] = ('x'):rep(65536) .. #t end\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "exceeded");
    double dt = now_s() - t0;
    cr_assert_lt(dt, 2.5, "took %.2f s", dt);
    /* with time to spare, it is the memory cap */
    fixture f = fx_ring4();
    cpc_lua_limits lim = {.seconds = 10.0};
    const char *text = "function schedule(plan)\n"
                       "  local t = {}\n"
                       "  while true do t[#t + 1] = ('x'):rep(1 << 20) .. #t end\n"
                       "end\n";
    cpc_lua_script *s = NULL;
    cr_assert_null(cpc_lua_open("bomb.lua", text, strlen(text), &lim, &s));
    t0 = now_s();
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    dt = now_s() - t0;
    expect_err(st, CPC_RULE_LUA, "bomb.lua", 3, "memory cap of 67108864 bytes exceeded");
    cr_assert_lt(dt, 2.5, "took %.2f s", dt);
    cpc_status_free(st);
    fx_untouched(&f);
    cpc_lua_close(s);
    fx_free(&f);
    /* one big allocation */
    expect_schedule_fails("function schedule(plan)\n  local s = ('x'):rep(1 << 30)\nend\n", CPC_RULE_LUA, 2,
                          "memory cap");
}

Test(lua_errors, c_loops_cannot_hang)
{
    double t0 = now_s();
    /* string.rep of an empty string a huge number of times returns at once */
    expect_schedule_fails("function schedule(plan)\n"
                          "  assert(string.rep('', 1 << 62) == '')\n"
                          "  assert(string.rep('', 1 << 62, '') == '')\n"
                          "  error('done')\n"
                          "end\n",
                          CPC_RULE_LUA, 4, "done");
    /* table.insert with a huge __len: the loop runs in Lua, under the budget */
    expect_schedule_fails("function schedule(plan)\n"
                          "  local t = setmetatable({}, {__len = function() return 1 << 62 end})\n"
                          "  table.insert(t, 1, 5)\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "exceeded");
    expect_schedule_fails("function schedule(plan)\n"
                          "  table.move({}, 1, math.maxinteger - 1, 2)\n"
                          "end\n",
                          CPC_RULE_LUA, 2, "exceeded");
    /* a backtracking pattern that would run for hours is refused */
    expect_schedule_fails("function schedule(plan)\n"
                          "  local s = ('a'):rep(100000)\n"
                          "  return s:find('.-.-.-.-b')\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "pattern too costly");
    cr_assert_lt(now_s() - t0, 8.0);
}

Test(lua_errors, no_os_io_require_debug_or_binary_chunks)
{
    const char *marker = "/tmp/cpc_test_lua_pwned";
    unlink(marker);
    expect_schedule_fails("function schedule(plan)\n"
                          "  os.execute('touch /tmp/cpc_test_lua_pwned')\n"
                          "end\n",
                          CPC_RULE_LUA, 2, "global 'os'");
    struct stat sb;
    cr_assert_neq(stat(marker, &sb), 0, "os.execute ran");
    expect_schedule_fails("function schedule(plan)\n  io.open('/etc/passwd')\nend\n", CPC_RULE_LUA, 2,
                          "global 'io'");
    expect_schedule_fails("function schedule(plan)\n  require('os')\nend\n", CPC_RULE_LUA, 2, "require");
    expect_schedule_fails("function schedule(plan)\n  debug.sethook()\nend\n", CPC_RULE_LUA, 2, "debug");
    expect_schedule_fails("function schedule(plan)\n  dofile('/etc/passwd')\nend\n", CPC_RULE_LUA, 2,
                          "dofile");
    expect_schedule_fails("function schedule(plan)\n  loadfile('/etc/passwd')\nend\n", CPC_RULE_LUA, 2,
                          "loadfile");
    expect_schedule_fails("function schedule(plan)\n  local d = string.dump(schedule)\nend\n", CPC_RULE_LUA, 2,
                          "dump");
    /* load: text works, binary is refused even when asked for */
    expect_schedule_fails("function schedule(plan)\n"
                          "  assert(load('return 1')() == 1)\n"
                          "  local f, err = load('\\27Lua\\84\\0', 'x', 'b')\n"
                          "  assert(f == nil and err:find('binary'))\n"
                          "  f, err = load('\\27Lua\\84\\0')\n"
                          "  assert(f == nil)\n"
                          "  error(err)\n"
                          "end\n",
                          CPC_RULE_LUA, 7, "binary");
    /* a binary script is refused too */
    cpc_lua_script *s = NULL;
    const char bin[] = "\x1bLua\x54\x00\x19\x93\r\n\x1a\n";
    cpc_status *st = cpc_lua_open("bin.lua", bin, sizeof bin - 1, NULL, &s);
    expect_err(st, CPC_RULE_LUA, "bin.lua", 0, "binary");
    cpc_status_free(st);
    /* finalizers would run outside the budget: refused */
    expect_schedule_fails("function schedule(plan)\n"
                          "  setmetatable({}, {__gc = function() while true do end end})\n"
                          "end\n",
                          CPC_RULE_LUA, 2, "__gc");
}

Test(lua_errors, writing_the_config)
{
    expect_schedule_fails("function schedule(plan)\n"
                          "  local m = plan.config.model\n"
                          "  m.heads = 8\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "plan.config is read-only: model.heads");
    expect_schedule_fails("function schedule(plan)\n  plan.config.input.segments[2].tokens = 1\nend\n",
                          CPC_RULE_LUA, 2, "plan.config is read-only: input.segments[2].tokens");
    expect_schedule_fails("function schedule(plan)\n  plan.config.new_key = 1\nend\n", CPC_RULE_LUA, 2,
                          "plan.config is read-only: new_key");
    expect_schedule_fails("function schedule(plan)\n  rawset(plan.config.cluster, 'world_size', 1)\nend\n",
                          CPC_RULE_LUA, 2, "plan.config is read-only: cluster.world_size");
    expect_schedule_fails("function schedule(plan)\n  table.insert(plan.config.input.segments, {})\nend\n",
                          CPC_RULE_LUA, 0, "plan.config is read-only: input.segments[3]");
    expect_schedule_fails("function schedule(plan)\n  setmetatable(plan.config, nil)\nend\n", CPC_RULE_LUA, 2,
                          "protected metatable");
}

/* Issue 14: pairs() on a read-only proxy used to hand out the backing table
 * as the loop's state; writing into it changed plan.config.  Every level
 * (root, nested, array of segments) and both ways in (the state, and
 * next() on it) must end in "read-only". */
Test(lua_errors, pairs_does_not_hand_out_the_config)
{
    expect_schedule_fails("function schedule(plan)\n"
                          "  local _, s = pairs(plan.config.cluster)\n"
                          "  s.world_size = 99\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "plan.config is read-only: cluster.world_size");
    expect_schedule_fails("function schedule(plan)\n"
                          "  local _, s = pairs(plan.config)\n"
                          "  rawset(s, 'name', 'x')\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "plan.config is read-only: name");
    expect_schedule_fails("function schedule(plan)\n"
                          "  local _, s = pairs(plan.config.input.segments)\n"
                          "  s[1] = {}\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "plan.config is read-only: input.segments[1]");
    /* what pairs gives is the proxy itself, and iteration still sees every field */
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("pairs.lua",
                                  "function schedule(plan)\n"
                                  "  local c = plan.config.cluster\n"
                                  "  local it, st, k0 = pairs(c)\n"
                                  "  assert(st == c and k0 == nil)\n"
                                  "  assert(next(st) == nil) -- the proxy is empty; its fields are behind it\n"
                                  "  local n = 0; for k, v in pairs(c) do n = n + 1; assert(c[k] == v) end\n"
                                  "  assert(n >= 5, n)\n"
                                  "  local op = plan.ops[1]\n"
                                  "  local _, os = pairs(op)\n"
                                  "  assert(os == op, 'pairs(op) hands out the backing table')\n"
                                  "end\n");
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    cr_assert_null(st, "%s", st ? cpc_status_format(st, "t") : "");
    cpc_lua_close(s);
    fx_free(&f);
}

Test(lua_errors, returning_a_number)
{
    expect_schedule_fails("function schedule(plan)\n  return 42\nend\n", CPC_RULE_LUA, 1, "got integer");
    expect_schedule_fails("function schedule(plan)\n  return 'ops'\nend\n", CPC_RULE_LUA, 1, "got string");
    expect_schedule_fails("function schedule(plan)\n  plan.ops = 7\nend\n", CPC_RULE_LUA, 1, "plan.ops");
}

/* `return plan` is returning nothing: plan.ops as edited (it was read as an
 * ops array: "ops: not an array (has a key of type string)") */
Test(lua_schedule, returning_the_plan)
{
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("ret.lua", "function schedule(plan)\n"
                                             "  cpc.insert_barrier(plan.ops, #plan.ops + 1)\n"
                                             "  return plan\n"
                                             "end\n");
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    cr_assert_null(st, "%s", st ? cpc_status_format(st, "t") : "");
    cr_expect_eq(f.prog->ops[f.prog->n_ops - 1].kind, CPC_OP_BARRIER, "the in-place edit was applied");
    cpc_lua_close(s);
    fx_free(&f);
}

Test(lua_errors, dropping_an_op)
{
    /* the attention of each ring step: K/V blocks are missed */
    expect_schedule_fails("function schedule(plan)\n  table.remove(plan.ops[2].body, 3)\nend\n",
                          CPC_RULE_VERIFY, 0, NULL);
    /* the final copy: the output is never written */
    expect_schedule_fails("function schedule(plan)\n  table.remove(plan.ops)\nend\n", CPC_RULE_VERIFY, 0, NULL);
    /* the wait: requests never completed */
    expect_schedule_fails("function schedule(plan)\n  table.remove(plan.ops[2].body, 5)\nend\n",
                          CPC_RULE_VERIFY, 0, NULL);
}

Test(lua_errors, duplicating_an_op)
{
    expect_schedule_fails("function schedule(plan)\n  table.insert(plan.ops, 2, plan.ops[2])\nend\n",
                          CPC_RULE_VERIFY, 0, NULL);
    expect_schedule_fails("function schedule(plan)\n"
                          "  local b = plan.ops[2].body\n"
                          "  table.insert(b, 4, cpc.copy(b[4]))\n"
                          "end\n",
                          CPC_RULE_VERIFY, 0, NULL);
}

Test(lua_errors, reversing_the_ops)
{
    expect_schedule_fails("function schedule(plan)\n"
                          "  local o, n = plan.ops, #plan.ops\n"
                          "  for i = 1, n // 2 do o[i], o[n - i + 1] = o[n - i + 1], o[i] end\n"
                          "end\n",
                          CPC_RULE_VERIFY, 0, NULL);
    expect_schedule_fails("function schedule(plan)\n"
                          "  local r = {}\n"
                          "  local b = plan.ops[2].body\n"
                          "  for i = #b, 1, -1 do r[#r + 1] = b[i] end\n"
                          "  plan.ops[2].body = r\n"
                          "end\n",
                          CPC_RULE_VERIFY, 0, NULL);
}

Test(lua_errors, verifier_errors_point_at_the_script)
{
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("edit.lua", "\nfunction schedule(plan)\n  table.remove(plan.ops)\nend\n");
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    expect_err(st, CPC_RULE_VERIFY, NULL, 0, NULL);
    bool seen = false;
    for (const cpc_status *n = st->notes; n; n = n->next)
        if (n->span.file && strcmp(n->span.file, "edit.lua") == 0 && n->span.line == 2)
            seen = true;
    cr_assert(seen, "a note names the script's schedule() at edit.lua:2");
    cpc_status_free(st);
    fx_untouched(&f);
    cpc_lua_close(s);
    fx_free(&f);
}

/* CP050 and CP051 name the same op the same way (1-based, as Lua indexes
 * plan.ops), and both point at the script line that changed it. */
Test(lua_errors, cp050_and_cp051_paths_are_1_based_and_point_at_the_edit)
{
    /* CP050: the edited send (plan.ops[2].body[1] in Lua), at its line 4 */
    expect_schedule_fails("function schedule(plan)\n"
                          "  cpc.walk(plan.ops, function(op)\n"
                          "    if op.kind == 'send' then\n"
                          "      op.peer = '(r+1)/0'\n"
                          "    end\n"
                          "  end)\n"
                          "end\n",
                          CPC_RULE_LUA, 4, "ops[2].body[1]: peer '(r+1)/0' cannot be evaluated");

    /* CP051: rank 0 never sends; the failing op is the compiler's wait
     * (ops[2].body[5], no span of its own: compile.c places it at the plan),
     * and a note points at the line that changed the send */
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("dl.lua", "function schedule(plan)\n"
                                            "  cpc.walk(plan.ops, function(op)\n"
                                            "    if op.kind == 'send' then op.when = 'r != 0' end\n"
                                            "  end)\n"
                                            "end\n");
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    expect_err(st, CPC_RULE_VERIFY, NULL, 0, "ops[2].body[5] wait");
    cr_assert(strstr(st->message, "ops[2].body[2] recv"), "%s", st->message);
    bool edit_note = false;
    for (const cpc_status *n = st->notes; n; n = n->next)
        if (n->span.file && strcmp(n->span.file, "dl.lua") == 0 && n->span.line == 3 &&
            strstr(n->message, "ops[2].body[1] send"))
            edit_note = true;
    cr_assert(edit_note, "a note at dl.lua:3 names ops[2].body[1] send");
    cpc_status_free(st);
    fx_untouched(&f);
    cpc_lua_close(s);
    fx_free(&f);

    /* the failing op is the edited one: the error itself is at the edit */
    f = fx_ring4();
    s = open_text("dl.lua", "function schedule(plan)\n"
                            "  local loop = plan.ops[2]\n"
                            "\n"
                            "  loop.body[2].block = '(r-s)%R'\n"
                            "end\n");
    st = cpc_lua_schedule(s, f.plan, f.prog);
    expect_err(st, CPC_RULE_VERIFY, "dl.lua", 4, "ops[2].body[2] recv");
    cpc_status_free(st);
    fx_untouched(&f);
    cpc_lua_close(s);
    fx_free(&f);
}

/* Op tables still behave as tables: pairs, copies, a protected metatable. */
Test(lua_schedule, op_tables_iterate_and_copy)
{
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("it.lua", "function schedule(plan)\n"
                                            "  local op = plan.ops[1]\n"
                                            "  local n = 0\n"
                                            "  for k, v in pairs(op) do n = n + 1 end\n"
                                            "  assert(n >= 3 and op.kind == 'init_acc', 'pairs sees the fields')\n"
                                            "  assert(getmetatable(op) == 'op')\n"
                                            "  assert(not pcall(setmetatable, op, nil))\n"
                                            "  local c = cpc.copy(op)\n"
                                            "  assert(c.kind == op.kind and c.out[1] == op.out[1])\n"
                                            "  op._mine = 1\n"
                                            "  assert(op._mine == 1)\n"
                                            "end\n");
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_null(f.prog->ops[0].span.file, "a scratch field is no change: the compiler's span stays");
    cpc_lua_close(s);
    fx_free(&f);
}

Test(lua_errors, invalid_fields)
{
    expect_schedule_fails("function schedule(plan)\n  plan.ops[1].kind = 'sned'\nend\n", CPC_RULE_LUA, 2,
                          "ops[1].kind: unknown op kind 'sned'");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[1].kind = 3\nend\n", CPC_RULE_LUA, 2,
                          "ops[1].kind: expected a string, got integer");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].tag = 'x'\nend\n", CPC_RULE_LUA, 2,
                          "ops[2].body[1].tag: expected an integer");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].tag = -1\nend\n", CPC_RULE_LUA, 2,
                          "ops[2].body[1].tag: -1 is out of range");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].group = 'galaxy'\nend\n", CPC_RULE_LUA,
                          2, "unknown group 'galaxy'");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].group = nil\nend\n", CPC_RULE_LUA, 2,
                          "needs a group");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].peer = '(r+'\nend\n", CPC_RULE_LUA, 2,
                          "ops[2].body[1].peer");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].peer = {}\nend\n", CPC_RULE_LUA, 2,
                          "expected an expression string or an integer, got table");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].peer = 1.5\nend\n", CPC_RULE_LUA, 2,
                          "got 1.5");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1]['in'] = 'k_cur'\nend\n", CPC_RULE_LUA,
                          2, "expected an array of buffer names, got string");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1]['in'] = {'k_cur', 'v_cur', 'q', 'acc', 'lse', 'k_nxt', 'v_nxt', 'o_blk', 'lse_blk'}\nend\n",
                          CPC_RULE_LUA, 2, "9 buffers, at most 8");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[3].out[1] = 'nope'\nend\n", CPC_RULE_LUA,
                          1, "no buffer named 'nope'");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[3].out[1] = 7\nend\n", CPC_RULE_LUA, 1,
                          "expected a buffer name, got integer");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[1].peerr = 1\nend\n", CPC_RULE_LUA, 2,
                          "unknown field 'peerr'");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[1].step = 1\nend\n", CPC_RULE_LUA, 2,
                          "no fixed step");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].count = nil\nend\n", CPC_RULE_LUA, 2,
                          "needs a 'count'");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].kind = 'attn'\nend\n", CPC_RULE_LUA, 2,
                          "only loop ops have a body");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[3] = nil\n  plan.ops[5] = plan.ops[1]\nend\n",
                          CPC_RULE_LUA, 1, "not an array");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1] = 'send'\nend\n", CPC_RULE_LUA, 1,
                          "expected an op table, got string");
    expect_schedule_fails("function schedule(plan)\n  plan.ops.name = 'x'\nend\n", CPC_RULE_LUA, 1,
                          "not an array");
    expect_schedule_fails("function schedule(plan)\n  plan.overlap = 'no'\nend\n", CPC_RULE_LUA, 1,
                          "plan.overlap: expected a boolean");
    expect_schedule_fails("function schedule(plan)\n  plan.rotate = 'ring'\nend\n", CPC_RULE_LUA, 1, "plan.rotate");
    expect_schedule_fails("function schedule(plan)\n"
                          "  local l = plan.ops[2]\n"
                          "  l.body[#l.body + 1] = l\n"
                          "end\n",
                          CPC_RULE_LUA, 1, "loops nested deeper than 8");
    expect_schedule_fails("function schedule(plan)\n"
                          "  for i = 1, 5000 do plan.ops[#plan.ops + 1] = cpc.op{kind = 'barrier', group = 'world'} end\n"
                          "end\n",
                          CPC_RULE_LUA, 0, "too many ops");
    /* buffers */
    expect_schedule_fails("function schedule(plan)\n  plan.buffers[1].role = 'x'\nend\n", CPC_RULE_LUA, 0,
                          "plan.buffers[1].role: unknown buffer role 'x'");
    expect_schedule_fails("function schedule(plan)\n  plan.buffers[2].name = 'q'\nend\n", CPC_RULE_LUA, 0,
                          "a buffer named 'q' already exists");
    expect_schedule_fails("function schedule(plan)\n  plan.buffers[2].name = 'a very long name that does not fit'\nend\n",
                          CPC_RULE_LUA, 0, "is not a buffer name");
    expect_schedule_fails("function schedule(plan)\n  plan.buffers[#plan.buffers + 1] = {name = 'x', role = 'k'}\nend\n",
                          CPC_RULE_LUA, 0, "missing field 'tokens'");
}

Test(lua_errors, a_new_op_is_blamed_on_its_line)
{
    expect_schedule_fails("function schedule(plan)\n"
                          "  local b = plan.ops[2].body\n"
                          "  b[#b + 1] = cpc.op{kind = 'barrier', group = 'ring', colour = 'red'}\n"
                          "end\n",
                          CPC_RULE_LUA, 3, "unknown field 'colour'");
}

Test(lua_errors, rank_or_block_out_of_range)
{
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].peer = 'r+1'\nend\n", CPC_RULE_LUA, 2,
                          "peer 'r+1' is 4 on rank 3");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[2].block = 's+r'\nend\n", CPC_RULE_LUA, 2,
                          "outside 0..3");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[2].peer = 'r/(s-1)'\nend\n", CPC_RULE_LUA,
                          2, "cannot be evaluated");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].count = 'R-5'\nend\n", CPC_RULE_LUA, 2,
                          "count 'R-5' is -1");
    expect_schedule_fails("function schedule(plan)\n  plan.ops[2].body[1].group = 'ulysses'\nend\n", CPC_RULE_LUA,
                          2, "outside the ulysses group's members 0..0");
}

Test(lua_errors, breach_poisons_the_script)
{
    fixture f = fx_ring4();
    cpc_lua_script *s = open_text("poison.lua", "function schedule(plan) while true do end end\n"
                                                "function choose(c) return c[1] end\n");
    cpc_status *st = cpc_lua_schedule(s, f.plan, f.prog);
    expect_err(st, CPC_RULE_LUA, "poison.lua", 1, "exceeded");
    cpc_status_free(st);
    int chosen = -1;
    cpc_candidate c = {.variant = CPC_VARIANT_RING, .ring_degree = 4, .ulysses_degree = 1, .ok = true};
    st = cpc_lua_choose(s, f.plan, &c, 1, &chosen);
    expect_err(st, CPC_RULE_LUA, "poison.lua", 0, "cannot be used again");
    cr_assert_eq(chosen, -1);
    cpc_status_free(st);
    fx_untouched(&f);
    cpc_lua_close(s);
    fx_free(&f);
}

Test(lua_errors, choose_must_return_a_candidate)
{
    cpc_plan *plan = ring4_plan();
    cpc_candidate c[2] = {
        {.variant = CPC_VARIANT_RING, .ring_degree = 4, .ulysses_degree = 1, .ok = true},
        {.variant = CPC_VARIANT_ULYSSES, .ring_degree = 1, .ulysses_degree = 4, .ok = true},
    };
    struct {
        const char *text;
        int line;
        const char *needle;
    } cases[] = {
        {"function choose(c)\n  return 1\nend\n", 1, "got integer"},
        {"function choose(c)\n  return nil\nend\n", 1, "got nil"},
        {"function choose(c)\n  return {variant = 'unified', ring_degree = 2, ulysses_degree = 2}\nend\n", 1,
         "not one of the valid candidates"},
        {"function choose(c)\n  return {variant = 'ring'}\nend\n", 1, "no valid variant"},
        {"function choose(c)\n  error('no')\nend\n", 2, "no"},
        {"function choose(c, config)\n  config.cluster.world_size = 2\nend\n", 2, "read-only: cluster.world_size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cpc_lua_script *s = open_text("choose.lua", cases[i].text);
        int chosen = -1;
        cpc_status *st = cpc_lua_choose(s, plan, c, 2, &chosen);
        expect_err(st, CPC_RULE_LUA, "choose.lua", cases[i].line, cases[i].needle);
        cr_assert_eq(chosen, -1);
        cpc_status_free(st);
        cpc_lua_close(s);
    }
    /* by identity, by equal fields, and the second valid one */
    const char *ok[] = {"function choose(c) return c[2] end\n",
                        "function choose(c) return {variant = 'ulysses', ring_degree = 1, ulysses_degree = 4} end\n",
                        "function choose(c) assert(#c == 2 and c[2].index == 2); return c[#c] end\n"};
    for (size_t i = 0; i < 3; i++) {
        cpc_lua_script *s = open_text("choose.lua", ok[i]);
        int chosen = -1;
        cpc_status *st = cpc_lua_choose(s, plan, c, 2, &chosen);
        cr_assert_null(st, "%s", st ? st->message : "");
        cr_assert_eq(chosen, 1);
        cpc_lua_close(s);
    }
    /* invalid candidates are not offered */
    c[0].ok = false;
    cpc_lua_script *s = open_text("choose.lua", "function choose(c) assert(#c == 1); return c[1] end\n");
    int chosen = -1;
    cpc_status *st = cpc_lua_choose(s, plan, c, 2, &chosen);
    cr_assert_null(st, "%s", st ? st->message : "");
    cr_assert_eq(chosen, 1);
    cpc_lua_close(s);
    cpc_plan_free(plan);
}

Test(lua_errors, unreadable_file_is_io)
{
    cpc_lua_script *s = NULL;
    cpc_status *st = cpc_lua_open_file("lua/examples/does-not-exist.lua", NULL, &s);
    cr_assert_not_null(st);
    cr_assert_eq(st->code, CPC_E_IO);
    cr_assert_null(s);
    cpc_status_free(st);
}

Test(lua_errors, print_goes_to_the_given_stream)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cpc_lua_limits lim = {.print = f};
    const char *text = "print('hello', 42, nil)\n";
    cpc_lua_script *s = NULL;
    cpc_status *st = cpc_lua_open("p.lua", text, strlen(text), &lim, &s);
    cr_assert_null(st);
    cpc_lua_close(s);
    fclose(f);
    cr_assert_str_eq(buf, "hello\t42\tnil\n");
    free(buf);
}

Test(lua_errors, limits_are_configurable)
{
    cpc_lua_limits lim = {.memory_bytes = 1 << 20, .instructions = 1000000, .seconds = 5.0};
    const char *text = "local t = {} for i = 1, 1e6 do t[i] = i end\n";
    cpc_lua_script *s = NULL;
    cpc_status *st = cpc_lua_open("lim.lua", text, strlen(text), &lim, &s);
    expect_err(st, CPC_RULE_LUA, "lim.lua", 1, NULL);
    cpc_status_free(st);
    const char *spin = "local i = 0 while true do i = i + 1 end\n";
    double t0 = now_s();
    st = cpc_lua_open("lim.lua", spin, strlen(spin), &lim, &s);
    expect_err(st, CPC_RULE_LUA, "lim.lua", 1, "instruction budget of 1000000");
    cr_assert_lt(now_s() - t0, 0.5);
    cpc_status_free(st);
}

/* Refused allocations trigger Lua's emergency collection first: garbage near
 * the cap is not a breach.  (The default memory cap; a generous time limit:
 * copying 480 MB of strings is checked against the wall clock too, and a
 * loaded machine takes over the default second.) */
Test(lua_errors, garbage_near_the_cap_is_not_a_breach)
{
    cpc_lua_limits lim = {.seconds = 60.0};
    const char *text = "for i = 1, 12 do local s = ('x'):rep(20 << 20) .. i end\n";
    cpc_lua_script *s = NULL;
    cpc_status *st = cpc_lua_open("gc.lua", text, strlen(text), &lim, &s);
    cr_assert_null(st, "%s", st ? st->message : "");
    cpc_lua_close(s);
    /* but live data over the cap is */
    const char *live = "local keep = {}\nfor i = 1, 12 do keep[i] = ('x'):rep(20 << 20) .. i end\n";
    st = cpc_lua_open("gc.lua", live, strlen(live), &lim, &s);
    expect_err(st, CPC_RULE_LUA, "gc.lua", 2, "memory cap");
    cpc_status_free(st);
}

Test(lua_errors, schedule_that_is_not_a_function)
{
    expect_schedule_fails("schedule = 42\n", CPC_RULE_LUA, 0, "not a function");
}
