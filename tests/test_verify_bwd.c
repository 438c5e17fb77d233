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

#include <openssl/evp.h>

#include "artifact.h"
#include "cpc/compiler.h"
#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "verify.h"
#include "verify_bwd.h"

static void fail_status(const char *what, cpc_status *st)
{
    char *m = cpc_status_format("t", st);
    cr_assert_fail("%s: %s", what, m ? m : "?");
}

/* The text of a ring-P training artifact (as cpc writes it). */
static char *training_text(int P, size_t *len)
{
    char y[512];
    snprintf(y, sizeof y,
             "version: 1\nname: train\nmodel: {heads: 4, kv_heads: 2, head_dim: 8, dtype: bf16}\n"
             "input: {batch: 2, tokens: 64, mask: causal, mode: training}\ncluster: {world_size: %d}\n",
             P);
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

/* Replaces the first occurrence of `from` in *t's backward_schedule by `to`
 * (realloc'd). */
static void replace(char **t, const char *from, const char *to)
{
    char *bwd = strstr(*t, "\nbackward_schedule:\n");
    cr_assert_not_null(bwd);
    char *at = strstr(bwd, from);
    cr_assert_not_null(at, "tamper: '%s' is not in the artifact", from);
    size_t pre = (size_t)(at - *t), fl = strlen(from), tl = strlen(to), n = strlen(*t);
    char *x = malloc(n - fl + tl + 1);
    memcpy(x, *t, pre);
    memcpy(x + pre, to, tl);
    memcpy(x + pre + tl, at + fl, n - pre - fl + 1);
    free(*t);
    *t = x;
}

/* Recomputes the content hash of an edited text (as a careful hand editor would). */
static void rehash(char *t)
{
    char *h = strstr(t, "content_hash: sha256:");
    cr_assert_not_null(h);
    h += strlen("content_hash: sha256:");
    memset(h, '0', 64);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    cr_assert_eq(EVP_Digest(t, strlen(t), md, &n, EVP_sha256(), NULL), 1);
    for (unsigned i = 0; i < 32; i++) {
        char two[3];
        snprintf(two, sizeof two, "%02x", md[i]);
        memcpy(h + 2 * i, two, 2);
    }
}

/* Applies the edits (pairs from, to; NULL-terminated) to a ring-4 training
 * artifact, rehashes, writes it and loads it with cpc_artifact_load. */
static cpc_status *load_tampered(const char *const *edits)
{
    size_t len;
    char *t = training_text(4, &len);
    for (int i = 0; edits[i]; i += 2)
        replace(&t, edits[i], edits[i + 1]);
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

/* attn_bwd adds into dk_out/dv_out after their send is posted, before its wait. */
Test(verify_bwd, in_flight_send_buffer_accumulated)
{
    const char *e[] = {ATTN_BWD, "",
                       SEND_DKV,
                       SEND_DKV "    - {kind: attn_bwd, in: [q, k_cur, v_cur, dout, lse, delta], out: [dq, dk_out, dv_out]}\n",
                       NULL};
    expect_cp051(e, "accumulate into an in-flight send", "in flight");
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
    expect_cp051(e, "wait before the recv is posted", "forever");
}

/* a request never completed by a wait */
Test(verify_bwd, request_never_waited)
{
    const char *e[] = {"  - {kind: wait, tag: 1}\n", "", NULL};
    expect_cp051(e, "final wait dropped", "wait");
}
