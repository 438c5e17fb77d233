/*
 * test_verify_bwd.c - tampered backward programs (issue 21): a ring-4
 * training plan is compiled, its artifact's backward_schedule edited as an
 * attacker would (the content hash recomputed, so the reader accepts it),
 * and cpc_artifact_load (what cprun and cpc.load use) must refuse it with
 * CP051 before anything runs, for every class of fault the prover checks:
 * messages matched by group as well as (peer, tag); an in-flight buffer
 * accumulated into, written or read before its wait; operands by
 * provenance (the saved LSE and the delta op's output swapped); a wait on a
 * send whose recv is posted only after it (a deadlock under rendezvous);
 * a request never waited for.  The untampered artifact loads.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "artifact.h"
#include "cpc/compiler.h"
#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "verify.h"
#include "verify_bwd.h"

#include "test_bwd_program.h"
#include "test_random.h"

static void fail_status(const char *what, cpc_status *st)
{
    char *m = cpc_status_format(st, "t");
    cr_assert_fail("%s: %s", what, m ? m : "?");
}

/* The text of a ring-P training artifact (as cpc writes it). */
static char *training_text_masked(int P, const char *mask, size_t *len)
{
    char y[512];
    snprintf(y, sizeof y,
             "version: 1\nname: train\nmodel: {heads: 4, kv_heads: 2, head_dim: 8, dtype: bf16}\n"
             "input: {batch: 2, tokens: 64, mask: %s, mode: training}\ncluster: {world_size: %d}\n",
             mask, P);
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_string(y, strlen(y), "t.yaml", NULL, 0, &plan);
    if (cpc_status_has_error(st))
        fail_status("plan", st);
    cpc_status_free(st);
    cpc_program *prog = NULL, *bwd = NULL;
    st = cpc_schedule_build(plan, CPC_VARIANT_RING, P, 1, &prog);
    if (!st)
        st = cpc_schedule_build_backward(plan, CPC_VARIANT_RING, P, 1, &bwd);
    if (st)
        fail_status("schedule", st);
    cpc_artifact *a = NULL;
    if ((st = cpc_artifact_create(plan, prog, &a)) || (st = cpc_artifact_set_backward(a, bwd)))
        fail_status("create", st);
    char *t = NULL;
    if ((st = cpc_artifact_to_string(a, &t, len)))
        fail_status("to_string", st);
    cpc_artifact_free(a);
    cpc_program_free(prog);
    cpc_program_free(bwd);
    cpc_plan_free(plan);
    return t;
}


/* Recomputes the content hash of an edited text (as a careful hand editor would). */
static void rehash(char *t)
{
    cr_assert(test_rehash(t), "no content hash to recompute");
}

/* Applies the edits (pairs from, to; NULL-terminated) to a ring-4 training
 * artifact, rehashes, writes it and loads it with cpc_artifact_load. */
static cpc_status *load_tampered_masked(const char *mask, const char *const *edits)
{
    size_t len;
    char *t = training_text_masked(4, mask, &len);
    for (int i = 0; edits[i]; i += 2)
        cr_assert(test_bwd_text_replace(&t, edits[i], edits[i + 1]), "tamper: '%s' is not in the artifact", edits[i]);
    rehash(t);
    char path[] = "/tmp/cpc_test_verify_bwd_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(t, f);
    fclose(f);
    free(t);
    cpc_artifact *a = NULL;
    cpc_status *st = cpc_artifact_load(path, &a);
    unlink(path);
    if (!st)
        cpc_artifact_free(a);
    return st;
}

static cpc_status *load_tampered(const char *const *edits)
{
    return load_tampered_masked("causal", edits);
}

static void expect_cp051(const char *const *edits, const char *what, const char *needle)
{
    cpc_status *st = load_tampered(edits);
    cr_assert(cpc_status_has_error(st), "%s: the tampered backward program was accepted", what);
    cr_assert_eq(st->rule, 51, "%s: rule %d, CP051 expected: %s", what, st->rule, st->message);
    cr_assert(strstr(st->message, needle), "%s: '%s' not in: %s", what, needle, st->message);
    cpc_status_free(st);
}

/* Lines of the ring-4 backward program (compiler/schedule_bwd.c, lagged p2p ring). */
#define SEND_KV "    - {kind: send, group: ring, peer: (r+1)%R, in: [k_cur, v_cur], tag: 0, when: s<R-1}\n"
#define WAIT_KV "    - {kind: wait, tag: 0, when: s<R-1}\n"
#define WAIT_DKV "    - {kind: wait, tag: 1, when: s>0}\n"
#define ATTN_BWD "    - {kind: attn_bwd, in: [q, k_cur, v_cur, dout, lse, delta], out: [dq, dk_blk, dv_blk]}\n"
#define ADD_DV "    - {kind: add, in: [dv_cur], out: [dv_blk], when: s>0}\n"
#define SEND_DKV "    - {kind: send, group: ring, peer: (r+1)%R, in: [dk_out, dv_out], tag: 1}\n"
#define RECV_DKV "    - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur, dv_cur], block: (r-s)%R, tag: 1, when: s>0}\n"
#define RECV_DKV_END "  - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur, dv_cur], block: r, tag: 1}\n"

Test(verify_bwd, untampered_loads)
{
    const char *none[] = {NULL};
    cpc_status *st = load_tampered(none);
    cr_assert_null(st, "%s", st ? st->message : "");
}

/* dK sent in the world group and dV in the ring group with one tag: the
 * transports match by group, so the ring recv of dK takes dV. */
Test(verify_bwd, groups_are_part_of_matching)
{
    const char *e[] = {
        SEND_DKV,
        "    - {kind: send, group: world, peer: (r+1)%R, in: [dk_out], tag: 1}\n"
        "    - {kind: send, group: ring, peer: (r+1)%R, in: [dv_out], tag: 1}\n",
        RECV_DKV,
        "    - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur], block: (r-s)%R, tag: 1, when: s>0}\n"
        "    - {kind: recv, group: world, peer: (r-1)%R, out: [dv_cur], block: (r-s)%R, tag: 1, when: s>0}\n",
        RECV_DKV_END,
        "  - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur], block: r, tag: 1}\n"
        "  - {kind: recv, group: world, peer: (r-1)%R, out: [dv_cur], block: r, tag: 1}\n",
        NULL};
    expect_cp051(e, "dK/dV in different groups", "dv");
}

/* What the per-rank walk itself refuses (a peer outside its group, an
 * expression that does not evaluate, a loop count out of range) is a CP051
 * of the backward program naming the op, like every other fault (new-user
 * trial: "rank 0: send: peer 1 outside its group 0..0", no rule, no op). */
Test(verify_bwd, walk_errors_are_cp051_with_the_op)
{
    const char *grp[] = {SEND_KV, "    - {kind: send, group: ulysses, peer: (r+1)%R, in: [k_cur, v_cur], tag: 0, when: s<R-1}\n",
                         NULL};
    expect_cp051(grp, "K/V sent in a group of one", "(backward program): rank 0: ops[");
    expect_cp051(grp, "K/V sent in a group of one", "send: peer 1 outside its group 0..0");
    const char *mod0[] = {SEND_DKV, "    - {kind: send, group: ring, peer: (r+1)%0, in: [dk_out, dv_out], tag: 1}\n",
                          NULL};
    expect_cp051(mod0, "peer modulo zero", "modulo by zero");
}

/* attn_bwd adds into dk_out/dv_out after their send is posted, before its wait. */
Test(verify_bwd, in_flight_send_buffer_accumulated)
{
    const char *e[] = {ATTN_BWD, "",
                       SEND_DKV,
                       SEND_DKV "    - {kind: attn_bwd, in: [q, k_cur, v_cur, dout, lse, delta], out: [dq, dk_out, dv_out]}\n",
                       NULL};
    expect_cp051(e, "accumulate into an in-flight send", "in flight");
    /* one format with the forward faults (vc_fault, vc_op_desc): the rank with its coordinates, the
     * op and step, and the request in flight named by its op */
    expect_cp051(e, "accumulate into an in-flight send", "schedule verification failed (backward program): rank 0 (r 0, u 0), ops[");
    expect_cp051(e, "accumulate into an in-flight send",
                 "attn_bwd (step 0): accumulates into dk_out while a send from it is in flight (ops[");
    expect_cp051(e, "accumulate into an in-flight send", "send (step 0), tag 1): no `wait tag 1` between them");
}

/* the received dK/dV are added before the wait that completes their recv */
Test(verify_bwd, in_flight_recv_buffer_read)
{
    const char *e[] = {WAIT_DKV, "", ADD_DV, ADD_DV WAIT_DKV, NULL};
    expect_cp051(e, "read an in-flight recv", "in flight");
}

/* the dK/dV accumulators are re-initialised while their send is in flight
 * (the swaps dropped and dk_blk sent directly) */
Test(verify_bwd, in_flight_send_buffer_written)
{
    const char *e[] = {"    - {kind: swap, in: [dk_blk, dk_out]}\n", "",
                       "    - {kind: swap, in: [dv_blk, dv_out]}\n", "",
                       SEND_DKV, "    - {kind: send, group: ring, peer: (r+1)%R, in: [dk_blk, dv_blk], tag: 1}\n",
                       NULL};
    expect_cp051(e, "write an in-flight send", "in flight");
}

/* LSE and delta are both role lse: swapped, the gradients are off by 10^3 */
Test(verify_bwd, lse_delta_by_provenance)
{
    const char *e[] = {"in: [q, k_cur, v_cur, dout, lse, delta]", "in: [q, k_cur, v_cur, dout, delta, lse]", NULL};
    expect_cp051(e, "LSE/delta swapped", "delta");
    /* a delta computed from the wrong operands (out twice) */
    const char *e2[] = {"{kind: delta, in: [dout, out], out: [delta]}", "{kind: delta, in: [out, dout], out: [delta]}",
                        NULL};
    expect_cp051(e2, "delta operands swapped", "delta");
}

/* a wait on the K/V send before the matching recv is posted: every rank
 * blocks there (rendezvous) */
Test(verify_bwd, wait_before_recv_posted_deadlocks)
{
    const char *e[] = {WAIT_KV, "", SEND_KV, SEND_KV WAIT_KV, NULL};
    expect_cp051(e, "wait before the recv is posted",
                 "wait (step 0): deadlock: every rank blocks here: its send to ring member r+1 (ops[");
    expect_cp051(e, "wait before the recv is posted", "send (step 0), tag 0) has no matching recv posted before this wait");
}

/* a request never completed by a wait */
Test(verify_bwd, request_never_waited)
{
    const char *e[] = {"  - {kind: wait, tag: 1}\n", "", NULL};
    expect_cp051(e, "final wait dropped", "wait");
    expect_cp051(e, "final wait dropped", "send (step 3): this send (tag 1) is never completed: no `wait tag 1`");
    /* an OUTPUT gradient's fault stands at the op that last wrote it, as a forward OUTPUT's */
    const char *e3[] = {ADD_DV, "", NULL};
    expect_cp051(e3, "the received dV never added",
                 "recv: the OUTPUT buffer dv_cur: the pairs (query block 0, key block 0) contribute 0 times, expected 1");
}

/* ---- the two domains of the prover (verify_bwd.h) ------------------------------ */

/* rep > 0: a text segment of rep tokens held whole by every rank (`split:
 * replicate`) before the sharded tokens. */
static cpc_program *bwd_program_rep(const char *variant, cpc_variant v, int R, int U, int H, int Hkv, int tokens,
                                    const char *mask, const char *rotate, int rep)
{
    cpc_status *err = NULL;
    cpc_program *prog = test_bwd_program(variant, v, R, U, H, Hkv, tokens, mask, rotate, rep, &err);
    if (!prog)
        fail_status("plan or schedule", err);
    return prog;
}

static cpc_program *bwd_program(const char *variant, cpc_variant v, int R, int U, int H, int Hkv, int tokens,
                                const char *mask, const char *rotate)
{
    return bwd_program_rep(variant, v, R, U, H, Hkv, tokens, mask, rotate, 0);
}

static cpc_expr *expr_of(const char *t);

/* Every backward program the compiler builds is proven at 65536 ranks by the
 * symmetric domain, well under a second (bench_verify --backward has the
 * table); a program whose guards single out a rank leaves the class: at 4
 * ranks it is enumerated, at 1024 it is refused with CP051 saying why. */
/* Proves `p` (freed here) with the backward prover: it must be proven by the
 * symmetric domain (not enumeration) within `limit_s` seconds. */
static void proven_symbolically_in(cpc_program *p, const char *name, int R, int U, double limit_s)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cpc_verify_bwd_stats stats;
    cpc_status *st = cpc_verify_backward_ex(p, NULL, &stats);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect_null(st, "%s %dx%d: %s", name, R, U, st ? st->message : "");
    cr_expect_eq(stats.mode, CPC_VERIFY_SYMBOLIC, "%s %dx%d: mode %d", name, R, U, (int)stats.mode);
    cr_expect(sec < limit_s, "%s %dx%d: %.2f s", name, R, U, sec);
    cpc_status_free(st);
    cpc_program_free(p);
}

Test(verify_bwd, symmetric_domain_at_65536_ranks)
{
    struct {
        const char *name;
        cpc_variant v;
        int R, U, H;
        const char *rotate;
    } rows[] = {
        {"ring", CPC_VARIANT_RING, 65536, 1, 4, "p2p"},
        {"ring", CPC_VARIANT_RING, 65536, 1, 4, "allgather"},
        {"unified", CPC_VARIANT_UNIFIED, 256, 256, 256, "p2p"},
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 65536, 65536, "p2p"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        cpc_program *p = bwd_program(rows[i].name, rows[i].v, rows[i].R, rows[i].U, rows[i].H, rows[i].H,
                                     2 * rows[i].R * rows[i].U, "causal", rows[i].rotate);
        proven_symbolically_in(p, rows[i].name, rows[i].R, rows[i].U, 10.0);
    }
    /* with a replicated text (`split: replicate`): its `r==0` (text, text) block by the twin
     * simulation (verify_bwd.h RING RANK 0), the world all_reduce by rotations */
    struct {
        const char *name;
        cpc_variant v;
        int R, U, H;
        const char *rotate;
    } reps[] = {
        {"ring", CPC_VARIANT_RING, 65536, 1, 4, "p2p"},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 65536, 1, 4, "allgather"},
        {"unified", CPC_VARIANT_UNIFIED, 16384, 4, 48, "p2p"},
    };
    for (size_t i = 0; i < sizeof reps / sizeof reps[0]; i++) {
        cpc_program *p = bwd_program_rep(reps[i].name, reps[i].v, reps[i].R, reps[i].U, reps[i].H, reps[i].H,
                                         2 * reps[i].R * reps[i].U + 1, "none", reps[i].rotate, 226);
        proven_symbolically_in(p, reps[i].name, reps[i].R, reps[i].U, 10.0);
    }
    /* beyond enumeration (1024 ranks) the symmetric domain alone refuses the replicated
     * faults: the (text, text) block on every rank; the text's dK/dV never summed over the
     * world; and an `r==0` op whose result travels the ring (the text's queries against the
     * own block on ring rank 0 only, into the accumulator that is sent: not a rotation of
     * one rank, so not decided: CP051 says why) */
    for (int f = 0; f < 3; f++) {
        cpc_program *p = bwd_program_rep("ring", CPC_VARIANT_RING, 1024, 1, 4, 4, 2048, "none", "p2p", 7);
        cpc_op *loop = NULL;
        for (int j = 0; j < p->n_ops; j++) {
            cpc_op *op = &p->ops[j];
            if (f == 0 && op->kind == CPC_OP_ATTN_BWD && op->when) {
                cpc_expr_free(op->when);
                op->when = NULL;
            }
            if (f == 1 && op->kind == CPC_OP_ALL_REDUCE && p->buffers[op->out[0]].role == CPC_ROLE_DK) {
                op->kind = CPC_OP_COPY;
                op->group = CPC_GROUP_NONE;
            }
            if (op->kind == CPC_OP_LOOP)
                loop = op;
        }
        if (f == 2) {
            cr_assert_not_null(loop);
            cpc_op *own = NULL;
            for (int j = 0; j < loop->n_body && !own; j++)
                if (loop->body[j].kind == CPC_OP_ATTN_BWD && loop->body[j].when)
                    own = &loop->body[j];
            cr_assert_not_null(own, "the text's queries against the own block (`when s==0`)");
            cpc_expr_free(own->when);
            own->when = expr_of("r==0");
        }
        cpc_verify_bwd_stats stats;
        cpc_status *st = cpc_verify_backward_ex(p, NULL, &stats);
        cr_assert_not_null(st, "fault %d proved", f);
        cr_expect_eq(st->rule, CPC_RULE_VERIFY);
        static const char *const needle[] = {"2 times or more", "0 times", "is sent"};
        cr_expect(strstr(st->message, needle[f]), "fault %d: %s", f, st->message);
        cpc_status_free(st);
        cpc_program_free(p);
    }
    /* a guard reading p: outside the class */
    for (int k = 0; k < 2; k++) {
        int R = k ? 1024 : 4;
        cpc_program *p = bwd_program("ring", CPC_VARIANT_RING, R, 1, 4, 4, 2 * R, "none", "p2p");
        cpc_op *last = &p->ops[p->n_ops - 1];
        cr_assert_null(cpc_expr_parse("p>=0", CPC_NO_SPAN, &last->when));
        cpc_verify_bwd_stats stats;
        cpc_status *st = cpc_verify_backward_ex(p, NULL, &stats);
        if (!k) {
            cr_expect_null(st, "%s", st ? st->message : "");
            cr_expect_eq(stats.mode, CPC_VERIFY_FULL);
        } else {
            cr_assert_not_null(st);
            cr_expect(strstr(st->message, "reads r or p") && strstr(st->message, "limited to 256"), "%s",
                      st->message);
        }
        cpc_status_free(st);
        cpc_program_free(p);
    }
}

/* Random mutations of the backward programs of every variant (operands,
 * tags, groups, peers, blocks, guards, dropped and reordered ops): the
 * symmetric domain and the enumeration of every rank agree on every mutant
 * (proven by both or refused by both).  CPC_VERIFY_BWD_ROUNDS sets the
 * count (default 400). */
static cpc_expr *expr_of(const char *t)
{
    cpc_expr *e = NULL;
    cr_assert_null(cpc_expr_parse(t, CPC_NO_SPAN, &e), "%s", t);
    return e;
}

static uint32_t rnd(uint64_t seed, int round, uint32_t *i, int n)
{
    return test_bits_at(seed, (uint32_t)round, (*i)++) % (uint32_t)n;
}

static void mutate(cpc_program *p, uint64_t seed, int round)
{
    uint32_t i = 0;
#define RND(n) rnd(seed, round, &i, (int)(n))
    /* a random op (top level or in a loop body) */
    cpc_op *ops = p->ops;
    int n = p->n_ops;
    for (int j = 0; j < p->n_ops; j++)
        if (p->ops[j].kind == CPC_OP_LOOP && RND(2)) {
            ops = p->ops[j].body;
            n = p->ops[j].n_body;
            break;
        }
    if (n == 0)
        return;
    int j = (int)RND(n);
    cpc_op *op = &ops[j];
    static const char *const peers[] = {"(r+1)%R", "(r-1)%R", "(r+2)%R", "r", "(r+s)%R", "(u+1)%U", "0"};
    static const char *const blocks[] = {"(r-s)%R", "(r-s-1)%R", "r", "(r+1)%R", "(r-s+1)%R", "0"};
    static const char *const whens[] = {"0", "s>0", "s<R-1", "s==1", "u==0", "p!=1", "1", "r==0"};
    switch (RND(8)) {
    case 0:
        if (op->n_in > 0) {
            int at = (int)RND(op->n_in);
            op->in[at] = (int)RND(p->n_buffers);
        } else if (op->n_out > 0) {
            int at = (int)RND(op->n_out);
            op->out[at] = (int)RND(p->n_buffers);
        }
        break;
    case 1: op->tag = (int)RND(3); break;
    case 2:
        if (op->group != CPC_GROUP_NONE)
            op->group = (cpc_group)(1 + RND(3));
        break;
    case 3:
        if (op->peer) {
            cpc_expr_free(op->peer);
            op->peer = expr_of(peers[RND(7)]);
        }
        break;
    case 4:
        if (op->block) {
            cpc_expr_free(op->block);
            op->block = expr_of(blocks[RND(6)]);
        }
        break;
    case 5:
        cpc_expr_free(op->when);
        op->when = expr_of(whens[RND(8)]);
        break;
    case 6:
        if (j + 1 < n) {
            cpc_op t = ops[j];
            ops[j] = ops[j + 1];
            ops[j + 1] = t;
        }
        break;
    default:
        if (op->kind == CPC_OP_ALL_TO_ALL)
            op->reduce = !op->reduce;
        else if (op->n_in >= 2) {
            int t = op->in[0];
            op->in[0] = op->in[op->n_in - 1];
            op->in[op->n_in - 1] = t;
        }
        break;
    }
#undef RND
}

Test(verify_bwd, domains_agree_on_mutants)
{
    struct {
        const char *name;
        cpc_variant v;
        int R, U, H, Hkv, tokens;
        const char *rotate;
        int rep; /* replicated text tokens (0: none) */
    } rows[] = {
        {"ring", CPC_VARIANT_RING, 4, 1, 4, 2, 64, "p2p", 0},
        {"ring", CPC_VARIANT_RING, 5, 1, 4, 2, 80, "p2p", 0},
        {"ring", CPC_VARIANT_RING, 3, 1, 4, 4, 48, "allgather", 0},
        {"unified", CPC_VARIANT_UNIFIED, 2, 2, 4, 2, 64, "p2p", 0},
        {"unified", CPC_VARIANT_UNIFIED, 3, 2, 4, 4, 96, "allgather", 0},
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 4, 4, 2, 64, "p2p", 0},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 3, 1, 4, 2, 50, "p2p", 0},
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 3, 5, 1, 50, "p2p", 0},
        /* with a replicated text: its (text, text) block guarded `r==0`, world all_reduce */
        {"ring", CPC_VARIANT_RING, 4, 1, 4, 2, 64, "p2p", 7},
        {"ring", CPC_VARIANT_RING, 3, 1, 4, 4, 48, "allgather", 5},
        {"unified", CPC_VARIANT_UNIFIED, 2, 2, 4, 2, 64, "p2p", 6},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 3, 1, 4, 2, 50, "p2p", 3},
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 2, 4, 2, 64, "p2p", 5},
    };
    const char *env = getenv("CPC_VERIFY_BWD_ROUNDS");
    int rounds = env ? atoi(env) : 400;
    uint64_t seed = test_seed();
    int sym_used = 0, refused = 0, rep_rounds = 0, rep_sym = 0, rep_refused = 0;
    for (int k = 0; k < rounds; k++) {
        size_t i = (size_t)k % (sizeof rows / sizeof rows[0]);
        cpc_program *p = bwd_program_rep(rows[i].name, rows[i].v, rows[i].R, rows[i].U, rows[i].H, rows[i].Hkv,
                                         rows[i].tokens, k % 2 && !rows[i].rep ? "causal" : "none", rows[i].rotate,
                                         rows[i].rep);
        int nm = 1 + k % 3;
        for (int m = 0; m < nm; m++)
            mutate(p, seed, k * 4 + m);
        cpc_verify_bwd_stats sa, se;
        cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
        cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
        cpc_status *e = cpc_verify_backward_ex(p, &eo, &se);
        cr_assert_eq(a == NULL, e == NULL,
                     "seed %llu round %d (%s %dx%d): the domains disagree: %s (mode %d) / enumeration: %s",
                     (unsigned long long)seed, k, rows[i].name, rows[i].R, rows[i].U, a ? a->message : "proven",
                     (int)sa.mode, e ? e->message : "proven");
        bool by_sym = sa.mode == CPC_VERIFY_SYMBOLIC || (a && se.mode == CPC_VERIFY_REFUSED && sa.work > 0);
        sym_used += by_sym;
        refused += a != NULL;
        rep_rounds += rows[i].rep > 0;
        rep_sym += rows[i].rep > 0 && by_sym;
        rep_refused += rows[i].rep > 0 && a != NULL;
        cpc_status_free(a);
        cpc_status_free(e);
        cpc_program_free(p);
    }
    cr_expect(refused > rounds / 4 && refused < rounds, "seed %llu: %d of %d mutants refused",
              (unsigned long long)seed, refused, rounds);
    cr_expect(sym_used > rounds / 4, "seed %llu: the symmetric domain decided only %d of %d", (unsigned long long)seed,
              sym_used, rounds);
    /* the replicated programs too (their `r==0` block: the twin simulation) */
    cr_expect(rep_sym > rep_rounds / 4 && rep_refused > rep_rounds / 8 && rep_refused < rep_rounds,
              "seed %llu: replicated programs: %d of %d decided by the symmetric domain, %d refused",
              (unsigned long long)seed, rep_sym, rep_rounds, rep_refused);
    if (getenv("CPC_VERIFY_BWD_ROUNDS"))
        fprintf(stderr, "mutants: %d, %d refused, %d by the symmetric domain; replicated: %d, %d refused, %d symmetric\n",
                rounds, refused, sym_used, rep_rounds, rep_refused, rep_sym);
}

/* One mutant's three verdicts: the default method (a), with the fast paths
 * off (u: every loop unrolled, every ulysses member simulated:
 * cpc_verify_backward_ind(..., false)) and the enumeration (e), asserted to
 * agree; `what` names the mutant in a failure.  verdicts3_free frees them. */
typedef struct verdicts3 {
    cpc_status *a, *u, *e;
    cpc_verify_bwd_stats sa, su, se;
} verdicts3;

static void verdicts3_of(const cpc_program *p, verdicts3 *v, const char *what)
{
    cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
    v->a = cpc_verify_backward_ex(p, NULL, &v->sa);
    v->u = cpc_verify_backward_ind(p, NULL, &v->su, false);
    v->e = cpc_verify_backward_ex(p, &eo, &v->se);
    cr_assert_eq(v->a == NULL, v->e == NULL, "%s (%lld jumps, %d classes): %s / enumeration: %s", what,
                 (long long)v->sa.jumps, v->sa.classes, v->a ? v->a->message : "proven",
                 v->e ? v->e->message : "proven");
    cr_assert_eq(v->a == NULL, v->u == NULL, "%s: %s / fast paths off: %s", what, v->a ? v->a->message : "proven",
                 v->u ? v->u->message : "proven");
    cr_assert_eq(v->su.jumps, 0);
    cr_assert(!v->su.usym && v->su.classes == 0);
}

static void verdicts3_free(verdicts3 *v)
{
    cpc_status_free(v->a);
    cpc_status_free(v->u);
    cpc_status_free(v->e);
}

/* Loops by induction (verify_bwd.h LOOPS BY INDUCTION): random mutants of
 * programs whose loops are long enough to be jumped (R >= 8), with guards
 * and blocks that follow s among the mutations, proven by the symmetric
 * domain with induction, by it with every loop unrolled, and by the
 * enumeration of every rank: the three agree on every mutant, and the
 * induction decides a good share of them itself. */
static void mutate_steps(cpc_program *p, uint64_t seed, int round)
{
    uint32_t i = 0;
#define RND(n) rnd(seed, round, &i, (int)(n))
    cpc_op *loop = NULL;
    for (int j = 0; j < p->n_ops; j++)
        if (p->ops[j].kind == CPC_OP_LOOP)
            loop = &p->ops[j];
    if (!loop || !loop->n_body || RND(3) == 0) {
        mutate(p, seed, round);
        return;
    }
    cpc_op *op = &loop->body[RND(loop->n_body)];
    static const char *const whens[] = {"s!=5", "s>2", "s<R-3", "s==4", "s>=R-2", "s!=R-4", "s+1<R", "!(s==6)"};
    static const char *const blocks[] = {"(r-s+1)%R", "(r+s)%R", "(r-s-2)%R", "(r-s)%R", "(r-s-1)%R", "(s-r)%R"};
    static const char *const counts[] = {"R+1", "R-1", "R", "2*R", "R-2"};
    switch (RND(4)) {
    case 0:
        cpc_expr_free(op->when);
        op->when = expr_of(whens[RND(8)]);
        break;
    case 1:
        if (op->block) {
            cpc_expr_free(op->block);
            op->block = expr_of(blocks[RND(6)]);
        }
        break;
    case 2:
        cpc_expr_free(loop->count);
        loop->count = expr_of(counts[RND(5)]);
        break;
    default:
        mutate(p, seed, round);
        break;
    }
#undef RND
}

Test(verify_bwd, induction_agrees_on_mutants)
{
    struct {
        const char *name;
        cpc_variant v;
        int R, U, H, Hkv, tokens;
        const char *rotate;
        int rep; /* replicated text tokens (the twin: RING RANK 0) */
    } rows[] = {
        {"ring", CPC_VARIANT_RING, 12, 1, 4, 2, 96, "p2p", 0},
        {"ring", CPC_VARIANT_RING, 9, 1, 4, 4, 72, "allgather", 0},
        {"unified", CPC_VARIANT_UNIFIED, 10, 2, 4, 2, 160, "p2p", 0},
        {"unified", CPC_VARIANT_UNIFIED, 8, 3, 6, 3, 144, "allgather", 0},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 11, 1, 4, 2, 100, "p2p", 0},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 8, 1, 4, 2, 70, "allgather", 0},
        /* one ulysses member for all (ROTATIONS OF U): heads and K/V heads divisible by U */
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 4, 8, 4, 64, "p2p", 0},
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 3, 6, 3, 50, "p2p", 0},
        {"unified", CPC_VARIANT_UNIFIED, 9, 2, 4, 4, 144, "p2p", 0},
        /* replicated text: the twin and the fixed index R in the runs */
        {"ring", CPC_VARIANT_RING, 10, 1, 4, 2, 80, "p2p", 7},
        {"ring_anything", CPC_VARIANT_RING_ANYTHING, 9, 1, 4, 2, 70, "allgather", 5},
        {"unified", CPC_VARIANT_UNIFIED, 8, 2, 4, 2, 128, "p2p", 6},
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 4, 8, 4, 64, "p2p", 5}, /* one member, world all_reduce */
        /* the ring without overlap: the accumulator travels in the same step (BACKWARD.md 3.1) */
        {"ring", CPC_VARIANT_RING, 11, 1, 4, 2, 88, "p2p, overlap: false", 0},
        {"unified", CPC_VARIANT_UNIFIED, 8, 2, 4, 2, 128, "p2p, overlap: false", 0},
    };
    const char *env = getenv("CPC_VERIFY_BWD_ROUNDS");
    int rounds = env ? atoi(env) : 300;
    uint64_t seed = test_seed();
    int jumped = 0, jumped_ok = 0, refused = 0, usym = 0, usym_ok = 0;
    for (int k = 0; k < rounds; k++) {
        size_t i = (size_t)k % (sizeof rows / sizeof rows[0]);
        cpc_program *p = bwd_program_rep(rows[i].name, rows[i].v, rows[i].R, rows[i].U, rows[i].H, rows[i].Hkv,
                                         rows[i].tokens, k % 2 && !rows[i].rep ? "causal" : "none", rows[i].rotate,
                                         rows[i].rep);
        int nm = k % 4 == 3 ? 0 : 1 + k % 2;
        for (int m = 0; m < nm; m++)
            mutate_steps(p, seed, k * 4 + m);
        char what[160];
        snprintf(what, sizeof what, "seed %llu round %d (%s %dx%d)", (unsigned long long)seed, k, rows[i].name,
                 rows[i].R, rows[i].U);
        verdicts3 v;
        verdicts3_of(p, &v, what);
        usym += v.sa.usym;
        usym_ok += v.sa.usym && !v.a;
        jumped += v.sa.jumps > 0;
        jumped_ok += v.sa.jumps > 0 && !v.a;
        refused += v.a != NULL;
        verdicts3_free(&v);
        cpc_program_free(p);
    }
    cr_expect(jumped > rounds / 4 && jumped_ok > rounds / 8, "seed %llu: %d of %d mutants jumped a phase, %d proven",
              (unsigned long long)seed, jumped, rounds, jumped_ok);
    cr_expect(refused > rounds / 8 && refused < rounds, "seed %llu: %d of %d refused", (unsigned long long)seed,
              refused, rounds);
    cr_expect(usym > rounds / 8 && usym_ok > rounds / 16, "seed %llu: %d of %d mutants by one ulysses member, %d proven",
              (unsigned long long)seed, usym, rounds, usym_ok);
    if (env)
        fprintf(stderr, "induction mutants: %d, %d refused, %d jumped (%d of them proven), %d by one ulysses member (%d proven)\n",
                rounds, refused, jumped, jumped_ok, usym, usym_ok);
}

/* One planted fault per rule the induction relies on, in a 16-rank ring
 * (enumerated too) and a 65536-rank one (the induction alone): each refused
 * with CP051 naming it; the unedited programs are proven with a phase
 * jumped. */
Test(verify_bwd, induction_refuses_planted_faults)
{
    static const struct {
        const char *what, *rotate, *needle;
    } faults[] = {
        {"count R+1: the accumulators meet a block twice", "allgather", "2 times or more"},
        {"count R-1: a block never met", "allgather", "0 times"},
        {"attn_bwd skipped on step 7 only", "p2p", "0 times"},
        {"recv of K/V declares block r-s on steps >= 1 (r-s-1 on step 0)", "p2p", "block"},
        {"the dK accumulator in flight re-initialised on the last step only", "p2p", "in flight"},
        {"attn_bwd run twice on the last step only", "p2p", "2 times or more"},
        {"none", "p2p", NULL},
        {"none", "allgather", NULL},
        {"none", "p2p, overlap: false", NULL},
    };
    for (int R = 16; R <= 65536; R *= 4096) {
        for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
            cpc_program *p = bwd_program("ring", CPC_VARIANT_RING, R, 1, 4, 4, 2 * R, "none", faults[f].rotate);
            cpc_op *loop = NULL;
            for (int j = 0; j < p->n_ops; j++)
                if (p->ops[j].kind == CPC_OP_LOOP)
                    loop = &p->ops[j];
            cr_assert_not_null(loop);
            cpc_op *att = NULL, *rk = NULL, *sd = NULL;
            for (int j = 0; j < loop->n_body; j++) {
                cpc_op *op = &loop->body[j];
                if (op->kind == CPC_OP_ATTN_BWD && !att)
                    att = op;
                if (op->kind == CPC_OP_RECV && op->tag == 0 && !rk)
                    rk = op;
                if (op->kind == CPC_OP_SEND && op->tag == 1)
                    sd = op;
            }
            cr_assert_not_null(att);
            switch (f) {
            case 0:
            case 1:
                cpc_expr_free(loop->count);
                loop->count = expr_of(f == 0 ? "R+1" : "R-1");
                break;
            case 2:
                att->when = expr_of("s!=7");
                break;
            case 3: {
                cr_assert_not_null(rk);
                cpc_op *ops = calloc((size_t)loop->n_body + 1, sizeof *ops);
                int at = (int)(rk - loop->body), m = 0;
                for (int j = 0; j < loop->n_body; j++) {
                    ops[m++] = loop->body[j];
                    if (j == at) {
                        /* the same recv twice: step 0 as compiled, steps >= 1 one block off */
                        cpc_op *a = &ops[m - 1], *b = &ops[m++];
                        *b = *a;
                        cpc_expr_free(a->when);
                        a->when = expr_of("s==0");
                        b->when = expr_of("s>=1 && s<R-1");
                        b->block = expr_of("(r-s)%R");
                        b->peer = expr_of("(r-1)%R");
                    }
                }
                free(loop->body);
                loop->body = ops;
                loop->n_body = m;
                break;
            }
            case 5: {
                cpc_op *ops = calloc((size_t)loop->n_body + 1, sizeof *ops);
                int at = (int)(att - loop->body), m = 0;
                for (int j = 0; j < loop->n_body; j++) {
                    ops[m++] = loop->body[j];
                    if (j == at) {
                        cpc_op *x = &ops[m++];
                        *x = ops[m - 2];
                        x->when = expr_of("s==R-1");
                    }
                }
                free(loop->body);
                loop->body = ops;
                loop->n_body = m;
                break;
            }
            case 4: {
                /* after the dK/dV send of the lagged ring: an op on the last step only */
                cr_assert_not_null(sd);
                cpc_op *ops = calloc((size_t)loop->n_body + 1, sizeof *ops);
                int at = (int)(sd - loop->body), m = 0;
                for (int j = 0; j < loop->n_body; j++) {
                    ops[m++] = loop->body[j];
                    if (j == at) {
                        cpc_op *x = &ops[m++];
                        *x = (cpc_op){.kind = CPC_OP_INIT_ACC, .group = CPC_GROUP_NONE};
                        x->when = expr_of("s==R-1");
                        x->n_out = 1;
                        x->out[0] = sd->in[0];
                    }
                }
                free(loop->body);
                loop->body = ops;
                loop->n_body = m;
                break;
            }
            default:
                break;
            }
            cpc_verify_bwd_stats st1;
            cpc_status *st = cpc_verify_backward_ex(p, NULL, &st1);
            if (!faults[f].needle) {
                cr_expect_null(st, "R %d %s: %s", R, faults[f].rotate, st ? st->message : "");
                cr_expect_eq(st1.mode, CPC_VERIFY_SYMBOLIC);
                cr_expect(st1.jumps > 0, "R %d %s: no phase jumped", R, faults[f].rotate);
            } else {
                cr_assert_not_null(st, "R %d: %s: proven", R, faults[f].what);
                cr_expect_eq(st->rule, CPC_RULE_VERIFY);
                cr_expect(strstr(st->message, faults[f].needle), "R %d: %s: %s", R, faults[f].what, st->message);
                if (R <= 256) {
                    cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
                    cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
                    cr_expect_not_null(e, "R %d: %s: the enumeration proves it", R, faults[f].what);
                    cpc_status_free(e);
                }
            }
            cpc_status_free(st);
            cpc_program_free(p);
        }
    }
}

/* One ulysses member for all (verify_bwd.h ROTATIONS OF U): at 65536 ranks
 * (heads = ranks) the pure ulysses program is proven by member 0 alone;
 * faults are refused by it: a gradient never brought back to the sequence
 * layout, the dq sent back without its heads placed (a gradient's
 * heads_to_seq into the wrong output); a guard reading u leaves the class
 * (every member simulated, at 1024 ranks) and its fault is found there. */
Test(verify_bwd, one_ulysses_member_for_all)
{
    for (int f = 0; f < 4; f++) {
        int U = f == 3 ? 1024 : 65536;
        cpc_program *p = bwd_program("ulysses", CPC_VARIANT_ULYSSES, 1, U, U, U, 2 * U, "causal", "p2p");
        cpc_op *h2s[3] = {NULL, NULL, NULL}, *att = NULL;
        int nh = 0;
        for (int j = 0; j < p->n_ops; j++) {
            if (p->ops[j].kind == CPC_OP_ALL_TO_ALL && p->ops[j].dir == CPC_A2A_HEADS_TO_SEQ && nh < 3)
                h2s[nh++] = &p->ops[j];
            if (p->ops[j].kind == CPC_OP_ATTN_BWD)
                att = &p->ops[j];
        }
        cr_assert_eq(nh, 3);
        cr_assert_not_null(att);
        if (f == 1)
            h2s[1]->when = expr_of("0");
        if (f == 2)
            h2s[0]->out[0] = h2s[1]->out[0];
        if (f == 3)
            att->when = expr_of("u!=1");
        cpc_verify_bwd_stats st1;
        cpc_status *st = cpc_verify_backward_ex(p, NULL, &st1);
        cr_expect_eq(st1.usym, f != 3, "fault %d: usym %d", f, (int)st1.usym);
        if (f == 0) {
            cr_expect_null(st, "%s", st ? st->message : "");
            cr_expect_eq(st1.mode, CPC_VERIFY_SYMBOLIC);
        } else {
            static const char *const needle[] = {NULL, "never written", "'dk'", "0 times"};
            cr_assert_not_null(st, "fault %d proven", f);
            cr_expect_eq(st->rule, CPC_RULE_VERIFY);
            cr_expect(strstr(st->message, needle[f]), "fault %d: %s", f, st->message);
        }
        cpc_status_free(st);
        cpc_program_free(p);
    }
}

/* Unified with a replicated text at 65536 ranks (4 x 16384): ring rank 0's
 * members and their twins (RING RANK 0), one simulated member per class
 * (heads even, or 24576 heads in GQA groups of 3 over 16384 members: 3
 * classes), proven in milliseconds; the replicated faults refused there as
 * at 2 x 4 ranks by the enumeration: the (text, text) block on every ring
 * rank, the text's dK never summed over the world. */
Test(verify_bwd, ulysses_classes_with_the_twin)
{
    struct {
        int R, U, H, Hkv;
    } geo[] = {{2, 4, 8, 8}, {2, 4, 12, 4}, {4, 16384, 16384, 16384}, {4, 16384, 24576, 8192}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        const int R = geo[gi].R, U = geo[gi].U;
        for (int f = 0; f < 3; f++) {
            cpc_program *p = bwd_program_rep("unified", CPC_VARIANT_UNIFIED, R, U, geo[gi].H, geo[gi].Hkv, 2 * R * U + 1,
                                             "none", "p2p", 7);
            for (int j = 0; j < p->n_ops; j++) {
                cpc_op *op = &p->ops[j];
                if (f == 1 && op->kind == CPC_OP_ATTN_BWD && op->when) {
                    cpc_expr_free(op->when);
                    op->when = NULL;
                }
                if (f == 2 && op->kind == CPC_OP_ALL_REDUCE && p->buffers[op->out[0]].role == CPC_ROLE_DK) {
                    op->kind = CPC_OP_COPY;
                    op->group = CPC_GROUP_NONE;
                }
            }
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            cpc_verify_bwd_stats st1;
            cpc_status *st = cpc_verify_backward_ex(p, NULL, &st1);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            cr_expect(sec < 0.5, "%dx%d fault %d: %.3f s", R, U, f, sec);
            cr_expect(st1.usym, "%dx%d H %d fault %d: every member simulated", R, U, geo[gi].H, f);
            if (f == 0) {
                cr_expect_null(st, "%dx%d H %d Hkv %d: %s", R, U, geo[gi].H, geo[gi].Hkv, st ? st->message : "");
                cr_expect_eq(st1.mode, CPC_VERIFY_SYMBOLIC);
            } else {
                static const char *const needle[] = {NULL, "2 times or more", "0 times"};
                cr_assert_not_null(st, "%dx%d fault %d proven", R, U, f);
                cr_expect_eq(st->rule, CPC_RULE_VERIFY);
                cr_expect(strstr(st->message, needle[f]), "%dx%d fault %d: %s", R, U, f, st->message);
                if (R * U <= 256) {
                    cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
                    cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
                    cr_expect_not_null(e, "%dx%d fault %d: the enumeration proves it", R, U, f);
                    cpc_status_free(e);
                }
            }
            cpc_status_free(st);
            cpc_program_free(p);
        }
    }
}

/* More tampers, one per rule the prover checks (verify_bwd.h WHAT IS
 * PROVED), each refused on load with the reason. */
/* barrier is a forward op the backward step takes too (a collective without
 * data over its group): proven in the ring group inside the loop and in the
 * world group at the top (the symmetric domain: 4 ranks, and the world
 * sizes of symmetric_domain_at_65536 by the same rule); on some ranks only,
 * the others never arrive: refused. */
Test(verify_bwd, barrier_in_a_backward_program)
{
    const char *ok[] = {ATTN_BWD, ATTN_BWD "    - {kind: barrier, group: ring}\n",
                        "  - {kind: delta, in: [dout, out], out: [delta]}\n",
                        "  - {kind: delta, in: [dout, out], out: [delta]}\n  - {kind: barrier, group: world}\n", NULL};
    cpc_status *st = load_tampered(ok);
    cr_assert_null(st, "%s", st ? st->message : "");
    const char *some[] = {ATTN_BWD, ATTN_BWD "    - {kind: barrier, group: ring, when: r==0}\n", NULL};
    expect_cp051(some, "a barrier rank 0 alone reaches", "never reaches this barrier");
    const char *nogroup[] = {ATTN_BWD, ATTN_BWD "    - {kind: barrier, group: ulysses}\n    - {kind: barrier}\n", NULL};
    expect_cp051(nogroup, "a barrier without a group", "group");
}

/* attn and merge are forward ops the backward step takes too: a backward
 * program that recomputes the LSE (a whole ring pass of attn + merge, K/V
 * back in place after R rotations) instead of reading the saved one is
 * proven, without a mask and under a causal one; the recomputed result must
 * be complete and exactly once where delta or attn_bwd read it, and stays
 * on its rank. */
#define RECOMPUTE_BUFS                                                                                      \
    "  - {name: dv_out, role: dv, tokens: block, heads: all, io: none}\n"                                   \
    "  - {name: o_blk, role: acc, tokens: shard, heads: all, io: none}\n"                                   \
    "  - {name: lse_blk, role: lse, tokens: shard, heads: all, io: none}\n"                                 \
    "  - {name: racc, role: acc, tokens: shard, heads: all, io: none}\n"                                    \
    "  - {name: rlse, role: lse, tokens: shard, heads: all, io: none}\n"
#define RECOMPUTE_LOOP(COUNT, ATTN_MERGE)                                                                   \
    "  - {kind: init_acc, out: [racc, rlse]}\n  - kind: loop\n    count: " COUNT "\n    body:\n"             \
    "    - {kind: send, group: ring, peer: (r+1)%R, in: [k_cur, v_cur], tag: 2}\n"                          \
    "    - {kind: recv, group: ring, peer: (r-1)%R, out: [k_nxt, v_nxt], block: (r-s-1)%R, tag: 2}\n"       \
    ATTN_MERGE "    - {kind: wait, tag: 2}\n    - {kind: swap, in: [k_cur, k_nxt]}\n"                        \
    "    - {kind: swap, in: [v_cur, v_nxt]}\n  - {kind: delta, in: [dout, out], out: [delta]}\n"
#define ATTN_MERGE                                                                                          \
    "    - {kind: attn, in: [q, k_cur, v_cur], out: [o_blk, lse_blk]}\n"                                    \
    "    - {kind: merge, in: [o_blk, lse_blk], out: [racc, rlse]}\n"
#define DELTA "  - {kind: delta, in: [dout, out], out: [delta]}\n"
#define DV_OUT "  - {name: dv_out, role: dv, tokens: block, heads: all, io: none}\n"
#define READS_LSE "in: [q, k_cur, v_cur, dout, lse, delta]"

Test(verify_bwd, attention_recomputed_in_a_backward_program)
{
    const char *ok[] = {DV_OUT, RECOMPUTE_BUFS, DELTA, RECOMPUTE_LOOP("R", ATTN_MERGE), READS_LSE,
                        "in: [q, k_cur, v_cur, dout, rlse, delta]", NULL};
    cpc_status *st = load_tampered_masked("none", ok);
    cr_assert_null(st, "%s", st ? st->message : "");
    st = load_tampered_masked("causal", ok);
    cr_assert_null(st, "causal: %s", st ? st->message : "");
    struct {
        const char *what, *needle, *mask;
        const char *e[9];
    } bad[] = {
        {"a ring step of the recompute dropped", "incomplete", "none",
         {DV_OUT, RECOMPUTE_BUFS, DELTA,
          RECOMPUTE_LOOP("R", "    - {kind: attn, in: [q, k_cur, v_cur], out: [o_blk, lse_blk], when: s>0}\n"
                              "    - {kind: merge, in: [o_blk, lse_blk], out: [racc, rlse], when: s>0}\n"),
          READS_LSE, "in: [q, k_cur, v_cur, dout, rlse, delta]", NULL}},
        {"the recompute's K/V rotated one step short", "declares that block", "none",
         {DV_OUT, RECOMPUTE_BUFS, DELTA, RECOMPUTE_LOOP("R-1", ATTN_MERGE), READS_LSE,
          "in: [q, k_cur, v_cur, dout, rlse, delta]", NULL}},
        {"a block merged twice", "twice", "none",
         {DV_OUT, RECOMPUTE_BUFS, DELTA, RECOMPUTE_LOOP("R", ATTN_MERGE ATTN_MERGE), READS_LSE,
          "in: [q, k_cur, v_cur, dout, rlse, delta]", NULL}},
        {"one block's LSE read as the whole", "incomplete", "none",
         {DV_OUT, RECOMPUTE_BUFS, DELTA, RECOMPUTE_LOOP("R", ATTN_MERGE), READS_LSE,
          "in: [q, k_cur, v_cur, dout, lse_blk, delta]", NULL}},
        {"the recomputed LSE sent", "stays on its rank", "none",
         {DV_OUT, RECOMPUTE_BUFS, DELTA,
          RECOMPUTE_LOOP("R", ATTN_MERGE "    - {kind: send, group: ring, peer: (r+1)%R, in: [racc], tag: 3}\n"
                                          "    - {kind: recv, group: ring, peer: (r-1)%R, out: [o_blk], block: (r-1)%R, tag: 3}\n"
                                          "    - {kind: wait, tag: 3}\n"),
          READS_LSE, "in: [q, k_cur, v_cur, dout, rlse, delta]", NULL}},
        {"a block skipped under a causal mask (zigzag shards: every block is needed)", "incomplete", "causal",
         {DV_OUT, RECOMPUTE_BUFS, DELTA,
          RECOMPUTE_LOOP("R", "    - {kind: attn, in: [q, k_cur, v_cur], out: [o_blk, lse_blk], when: s>0}\n"
                              "    - {kind: merge, in: [o_blk, lse_blk], out: [racc, rlse], when: s>0}\n"),
          READS_LSE, "in: [q, k_cur, v_cur, dout, rlse, delta]", NULL}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st = load_tampered_masked(bad[i].mask, bad[i].e);
        cr_assert(cpc_status_has_error(st), "%s: accepted", bad[i].what);
        cr_assert_eq(st->rule, 51, "%s: rule %d: %s", bad[i].what, st->rule, st->message);
        cr_assert(strstr(st->message, bad[i].needle), "%s: '%s' not in: %s", bad[i].what, bad[i].needle,
                  st->message);
        cpc_status_free(st);
    }
}

Test(verify_bwd, every_rule_has_a_tamper)
{
    struct {
        const char *what, *needle;
        const char *e[7];
    } cases[] = {
        {"the accumulator's recv declares the next block", "declares that block",
         {RECV_DKV, "    - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur, dv_cur], block: (r-s-1)%R, tag: 1, when: s>0}\n", NULL}},
        {"no delta op", "no delta op computed it", {"  - {kind: delta, in: [dout, out], out: [delta]}\n", "", NULL}},
        {"attn_bwd twice", "2 times or more", {ATTN_BWD, ATTN_BWD ATTN_BWD, NULL}},
        {"K/V of the next step, still in flight", "in flight",
         {"in: [q, k_cur, v_cur, dout, lse, delta]", "in: [q, k_nxt, v_nxt, dout, lse, delta]", NULL}},
        {"the fresh dK/dV made for the wrong block (diffusers #14265)", "#14265",
         {"{kind: init_acc, out: [dk_blk, dv_blk], block: (r-s)%R}", "{kind: init_acc, out: [dk_blk, dv_blk], block: r}",
          NULL}},
        {"the K/V peer off by one", "has no matching recv",
         {SEND_KV, "    - {kind: send, group: ring, peer: (r+2)%R, in: [k_cur, v_cur], tag: 0, when: s<R-1}\n", NULL}},
        {"the accumulator's last recv posted after the wait that needs it", "deadlock",
         {RECV_DKV_END, "", "  - {kind: wait, tag: 1}\n", "  - {kind: wait, tag: 1}\n  - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur, dv_cur], block: r, tag: 1}\n  - {kind: wait, tag: 1}\n", NULL}},
        {"K/V swapped while their recv is in flight", "in flight",
         {WAIT_KV, "", "    - {kind: swap, in: [v_cur, v_nxt], when: s<R-1}\n",
          "    - {kind: swap, in: [v_cur, v_nxt], when: s<R-1}\n" WAIT_KV, NULL}},
        {"a K block received into a dK buffer", "role",
         {"out: [k_nxt, v_nxt]", "out: [dk_blk, v_nxt]", NULL}},
        {"dq accumulated from dout's slot", "holds",
         {"in: [q, k_cur, v_cur, dout, lse, delta]", "in: [q, k_cur, v_cur, out, lse, delta]", NULL}},
        {"two OUTPUT dq (yunchang #149)", "exactly one",
         {"{name: dk_out, role: dk, tokens: block, heads: all, io: none}", "{name: dk_out, role: dk, tokens: block, heads: all, io: output}", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_cp051(cases[i].e, cases[i].what, cases[i].needle);
}

/* Classes of U (verify_bwd.h CLASSES OF U): heads that do not divide by U
 * (ulysses_anything: the first H % U members hold one head more) or K/V
 * heads that do not (GQA groups straddling members, or one K/V head for
 * all).  Random mutants of such programs are proven with one member per
 * class (the default), with every member and every loop unrolled, and by
 * the enumeration of every rank: the three agree on every mutant, and the
 * classes decide a good share of them. */
Test(verify_bwd, ulysses_classes_agree_on_mutants)
{
    struct {
        const char *name;
        cpc_variant v;
        int R, U, H, Hkv, tokens;
        const char *rotate;
        int rep; /* replicated text tokens: the world all_reduce of its dK/dV, by class */
    } rows[] = {
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, 7, 7, 50, "p2p", 0},   /* 2,2,2,1 */
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 5, 12, 4, 53, "p2p", 0},  /* g 3: 3,3,2,2,2 straddling */
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 16, 24, 8, 70, "p2p", 0}, /* g 3 over 2,..,1,.. */
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 6, 10, 5, 45, "p2p", 0},  /* g 2: 2,2,2,2,1,1 */
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 3, 5, 1, 50, "p2p", 0},   /* one K/V head */
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 4, 8, 2, 64, "p2p", 0},                     /* K/V replicated */
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 4, 4, 1, 64, "p2p", 0},                     /* one K/V head */
        {"unified", CPC_VARIANT_UNIFIED, 2, 4, 8, 2, 64, "p2p", 0},                     /* ring x replicated K/V */
        {"unified", CPC_VARIANT_UNIFIED, 3, 4, 8, 1, 96, "allgather", 0},
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 4, 7, 7, 50, "p2p", 5},
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 4, 8, 2, 64, "p2p", 6},
        /* parts inside one GQA group: one class for them (groups moved, rotated within) */
        {"ulysses", CPC_VARIANT_ULYSSES, 1, 8, 8, 2, 64, "p2p", 0},                  /* g 4, one head each */
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 6, 9, 3, 40, "p2p", 0}, /* g 3: 2,2,2,1,1,1 */
        {"ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, 7, 12, 2, 40, "p2p", 4}, /* g 6: 2,2,2,2,2,1,1 */
        /* unified with a replicated text: ring rank 0 and its twin, each one member per class */
        {"unified", CPC_VARIANT_UNIFIED, 2, 4, 8, 2, 64, "p2p", 6},
        {"unified", CPC_VARIANT_UNIFIED, 3, 2, 4, 2, 48, "allgather", 5}, /* one member for all */
        {"unified", CPC_VARIANT_UNIFIED, 2, 3, 7, 7, 48, "p2p", 4},       /* uneven heads */
    };
    const char *env = getenv("CPC_VERIFY_BWD_ROUNDS");
    int rounds = env ? atoi(env) : 300;
    uint64_t seed = test_seed();
    int cls = 0, cls_ok = 0, refused = 0;
    for (int k = 0; k < rounds; k++) {
        size_t i = (size_t)k % (sizeof rows / sizeof rows[0]);
        cpc_program *p = bwd_program_rep(rows[i].name, rows[i].v, rows[i].R, rows[i].U, rows[i].H, rows[i].Hkv,
                                         rows[i].tokens, k % 2 && !rows[i].rep ? "causal" : "none", rows[i].rotate,
                                         rows[i].rep);
        int nm = k % 4 == 3 ? 0 : 1 + k % 2;
        for (int m = 0; m < nm; m++)
            mutate(p, seed, k * 4 + m);
        char what[160];
        snprintf(what, sizeof what, "seed %llu round %d (%s %dx%d H %d Hkv %d)", (unsigned long long)seed, k,
                 rows[i].name, rows[i].R, rows[i].U, rows[i].H, rows[i].Hkv);
        verdicts3 v;
        verdicts3_of(p, &v, what);
        cls += v.sa.classes > 0;
        cls_ok += v.sa.classes > 0 && !v.a;
        refused += v.a != NULL;
        verdicts3_free(&v);
        cpc_program_free(p);
    }
    cr_expect(refused > rounds / 8 && refused < rounds, "seed %llu: %d of %d refused", (unsigned long long)seed,
              refused, rounds);
    cr_expect(cls > rounds / 4 && cls_ok > rounds / 8, "seed %llu: %d of %d mutants by classes of members, %d proven",
              (unsigned long long)seed, cls, rounds, cls_ok);
    if (env)
        fprintf(stderr, "class mutants: %d, %d refused, %d by classes (%d proven)\n", rounds, refused, cls, cls_ok);
}

/* The unedited programs with uneven heads are proven by a few members at
 * any size (40000 and 65535 members: well under a second), and faults are
 * refused there as by the enumeration at 5 members: dK's heads_to_seq
 * without reduce=sum where only some members share a K/V head (the GQA
 * groups straddle the members of the one-head region only); dq never
 * brought back; dq's heads_to_seq into dk's output; attn_bwd dropped. */
Test(verify_bwd, ulysses_classes_refuse_planted_faults)
{
    struct {
        int U, H, Hkv;
    } geo[] = {
        {5, 12, 4},          /* 3,3,2,2,2: members 2-3 and 3-4 share a K/V head */
        {7, 16, 8},          /* g 2: 3,3,2,2,2,2,2 */
        {40000, 65536, 32768}, /* g 2: 25536 members of 2 heads, then 14464 of 1 sharing in pairs */
        {65535, 65536, 65536}, /* one member of 2 heads */
        {65536, 65536, 1},     /* one K/V head for every member */
        {8, 8, 2},             /* g 4, one head a member: one class inside the groups */
        {65536, 65536, 8},     /* g 8192: the same at 65536 members */
    };
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        const int U = geo[gi].U;
        for (int f = 0; f < 5; f++) {
            cpc_program *p = bwd_program("ulysses_anything", CPC_VARIANT_ULYSSES_ANYTHING, 1, U, geo[gi].H,
                                         geo[gi].Hkv, 2 * U + 3, f % 2 ? "causal" : "none", "p2p");
            cpc_op *h2s[3] = {NULL, NULL, NULL}, *att = NULL;
            int nh = 0;
            for (int j = 0; j < p->n_ops; j++) {
                if (p->ops[j].kind == CPC_OP_ALL_TO_ALL && p->ops[j].dir == CPC_A2A_HEADS_TO_SEQ && nh < 3)
                    h2s[nh++] = &p->ops[j];
                if (p->ops[j].kind == CPC_OP_ATTN_BWD)
                    att = &p->ops[j];
            }
            cr_assert_eq(nh, 3);
            cr_assert_not_null(att);
            bool shared = geo[gi].Hkv < geo[gi].H; /* some member shares a K/V head (g does not divide every part) */
            const char *needle = NULL;
            switch (f) {
            case 1: /* dk's parts placed, not summed */
                if (!shared)
                    break;
                cr_assert(h2s[1]->reduce, "U %d: dk's heads_to_seq sums its parts", U);
                h2s[1]->reduce = false;
                needle = "must be summed";
                break;
            case 2:
                h2s[0]->when = expr_of("0");
                needle = "never written";
                break;
            case 3:
                h2s[0]->out[0] = h2s[1]->out[0];
                needle = "'dk'";
                break;
            case 4:
                att->when = expr_of("0");
                needle = "0 times";
                break;
            default:
                break;
            }
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            cpc_verify_bwd_stats st1;
            cpc_status *st = cpc_verify_backward_ex(p, NULL, &st1);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            cr_expect(st1.classes > 0 && st1.classes <= 4, "U %d H %d Hkv %d fault %d: %d classes", U, geo[gi].H,
                      geo[gi].Hkv, f, st1.classes);
            cr_expect(sec < 0.5, "U %d fault %d: %.3f s", U, f, sec);
            if (getenv("CPC_VERIFY_BWD_ROUNDS"))
                fprintf(stderr, "U %d H %d Hkv %d fault %d: %d classes, %.3f ms: %s\n", U, geo[gi].H, geo[gi].Hkv, f,
                        st1.classes, sec * 1e3, st ? st->message : "proven");
            if (!needle) {
                cr_expect_null(st, "U %d H %d Hkv %d: %s", U, geo[gi].H, geo[gi].Hkv, st ? st->message : "");
                cr_expect_eq(st1.mode, CPC_VERIFY_SYMBOLIC);
            } else {
                cr_assert_not_null(st, "U %d H %d Hkv %d fault %d proven", U, geo[gi].H, geo[gi].Hkv, f);
                cr_expect_eq(st->rule, CPC_RULE_VERIFY);
                cr_expect(strstr(st->message, needle), "U %d fault %d: %s", U, f, st->message);
                if (U <= 256) {
                    cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
                    cpc_status *e = cpc_verify_backward_ex(p, &eo, NULL);
                    cr_expect_not_null(e, "U %d fault %d: the enumeration proves it", U, f);
                    cpc_status_free(e);
                }
            }
            cpc_status_free(st);
            cpc_program_free(p);
        }
    }
}

/* Classes of U across geometries: random U (2 to 40), H (U to 3U + 5) and
 * K/V heads (a divisor of H), the backward programs of ulysses_anything,
 * ulysses and unified (R = 2) built for them (the schedule builder called
 * directly, so uneven heads for every variant), a seventh with a
 * replicated text; each unedited and with one mutation is proven by class
 * (the default) and by enumerating every rank: the two agree.
 * CPC_VERIFY_BWD_ROUNDS sets the count (default 200; 24000 checked over 8
 * seeds). */
Test(verify_bwd, ulysses_classes_agree_across_geometries)
{
    const char *env = getenv("CPC_VERIFY_BWD_ROUNDS");
    int rounds = env ? atoi(env) : 200;
    uint64_t seed = test_seed();
    int built = 0, cls = 0, refused = 0;
    for (int k = 0; k < rounds; k++) {
        uint32_t i = 0;
        int U = 2 + (int)rnd(seed, 100000 + k, &i, 39);
        int H = U + (int)rnd(seed, 100000 + k, &i, (uint32_t)(2 * U + 6));
        int divs[64], nd = 0;
        for (int d = 1; d <= H && nd < 64; d++)
            if (H % d == 0)
                divs[nd++] = d;
        int Hkv = divs[rnd(seed, 100000 + k, &i, nd)];
        int kind = (int)rnd(seed, 100000 + k, &i, 3), R = kind == 2 ? 2 : 1;
        static const char *const names[3] = {"ulysses_anything", "ulysses", "unified"};
        static const cpc_variant vs[3] = {CPC_VARIANT_ULYSSES_ANYTHING, CPC_VARIANT_ULYSSES, CPC_VARIANT_UNIFIED};
        cpc_status *err = NULL;
        int rep = k % 7 == 0 ? 5 : 0;
        cpc_program *p = test_bwd_program(names[kind], vs[kind], R, U, H, Hkv, 3 * R * U + 1 + k % 5,
                                          k % 2 && !rep ? "causal" : "none", "p2p", rep, &err);
        if (!p) { /* the planner refuses this geometry for the variant */
            cpc_status_free(err);
            continue;
        }
        built++;
        if (k % 3)
            mutate(p, seed, 200000 + k);
        cpc_verify_bwd_stats sa, se;
        cpc_verify_opts eo = {.method = CPC_VERIFY_ENUMERATE};
        cpc_status *a = cpc_verify_backward_ex(p, NULL, &sa);
        cpc_status *e = cpc_verify_backward_ex(p, &eo, &se);
        cr_assert_eq(a == NULL, e == NULL, "seed %llu round %d (%s %dx%d H %d Hkv %d, %d classes): %s / enumeration: %s",
                     (unsigned long long)seed, k, names[kind], R, U, H, Hkv, sa.classes, a ? a->message : "proven",
                     e ? e->message : "proven");
        cls += sa.classes > 0;
        refused += a != NULL;
        cpc_status_free(a);
        cpc_status_free(e);
        cpc_program_free(p);
    }
    cr_expect(built > rounds / 3 && cls > built / 3, "seed %llu: %d of %d geometries built, %d by classes",
              (unsigned long long)seed, built, rounds, cls);
    if (env)
        fprintf(stderr, "geometries: %d, %d built, %d by classes, %d refused\n", rounds, built, cls, refused);
}
