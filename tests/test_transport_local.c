/*
 * test_transport_local.c - the local (threads) transport beyond the shared
 * conformance suite (test_transport_conformance_local.c): FIFO matching of
 * same-tag messages of different sizes, size mismatches, members calling
 * different collectives, abort waking blocked ranks, the timeout diagnostic,
 * endpoint bookkeeping, and uneven all_to_all_v / all_gather_v contents on a
 * 2 x 2 mesh.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transport_local.h"

typedef struct job job;
typedef void (*rank_fn)(job *j, int p, cpc_transport *t);

struct job {
    cpc_local_world *w;
    rank_fn fn;
    cpc_status *st[16];     /* per-rank result (the rank's first error) */
    char info[16][256];
};

typedef struct targ {
    job *j;
    int p;
    cpc_transport *t;
} targ;

static void *thr(void *a)
{
    targ *x = a;
    x->j->fn(x->j, x->p, x->t);
    return NULL;
}

/* Runs fn on P = R*U rank threads of a fresh world. */
static void run_world(job *j, int R, int U, double timeout, rank_fn fn)
{
    memset(j, 0, sizeof *j);
    cr_assert_null(cpc_local_world_create(R, U, &j->w));
    cpc_local_world_set_timeout(j->w, timeout);
    j->fn = fn;
    int P = R * U;
    pthread_t th[16];
    targ a[16];
    for (int p = 0; p < P; p++) {
        a[p] = (targ){j, p, NULL};
        cr_assert_null(cpc_local_endpoint_create(j->w, p, &a[p].t));
    }
    for (int p = 0; p < P; p++)
        pthread_create(&th[p], NULL, thr, &a[p]);
    for (int p = 0; p < P; p++)
        pthread_join(th[p], NULL);
    for (int p = 0; p < P; p++)
        cpc_transport_destroy(a[p].t);
}

static void end_world(job *j, int P)
{
    for (int p = 0; p < P; p++)
        cpc_status_free(j->st[p]);
    cpc_local_world_destroy(j->w);
}

static void keep(job *j, int p, cpc_status *st)
{
    if (st && !j->st[p])
        j->st[p] = st;
    else
        cpc_status_free(st);
}

/* ---- same tag, three sizes, matched in posting order --------------------------- */

static void fifo_rank(job *j, int p, cpc_transport *t)
{
    size_t sz[3] = {10, 2000, 0};
    if (p == 0) {
        unsigned char *m[3];
        cpc_request *r[3];
        for (int i = 0; i < 3; i++) {
            m[i] = malloc(sz[i] + 1);
            memset(m[i], 0x40 + i, sz[i] + 1);
            keep(j, p, cpc_transport_isend(t, CPC_GROUP_WORLD, 1, m[i], sz[i], 5, &r[i]));
        }
        for (int i = 2; i >= 0; i--)
            keep(j, p, cpc_transport_wait(t, r[i]));
        for (int i = 0; i < 3; i++)
            free(m[i]);
    } else {
        usleep(20000); /* the sends are posted first */
        unsigned char *m[3];
        cpc_request *r[3];
        for (int i = 0; i < 3; i++) {
            m[i] = calloc(1, sz[i] + 1);
            keep(j, p, cpc_transport_irecv(t, CPC_GROUP_WORLD, 0, m[i], sz[i], 5, &r[i]));
        }
        for (int i = 0; i < 3; i++)
            keep(j, p, cpc_transport_wait(t, r[i]));
        for (int i = 0; i < 3; i++) {
            for (size_t k = 0; k < sz[i]; k++)
                if (m[i][k] != 0x40 + i) {
                    snprintf(j->info[p], sizeof j->info[p], "message %d byte %zu is %d", i, k, m[i][k]);
                    break;
                }
            if (m[i][sz[i]] != 0)
                snprintf(j->info[p], sizeof j->info[p], "message %d overran its buffer", i);
            free(m[i]);
        }
    }
}

Test(transport_local, same_tag_messages_match_in_posting_order)
{
    job j;
    run_world(&j, 2, 1, 10, fifo_rank);
    for (int p = 0; p < 2; p++) {
        cr_assert_null(j.st[p], "rank %d: %s", p, j.st[p]->message);
        cr_assert_eq(j.info[p][0], 0, "rank %d: %s", p, j.info[p]);
    }
    end_world(&j, 2);
}

/* ---- size mismatch ---------------------------------------------------------------- */

static void mismatch_rank(job *j, int p, cpc_transport *t)
{
    char buf[64] = {0};
    cpc_request *r = NULL;
    if (p == 0)
        keep(j, p, cpc_transport_isend(t, CPC_GROUP_RING, 1, buf, 48, 3, &r));
    else
        keep(j, p, cpc_transport_irecv(t, CPC_GROUP_RING, 0, buf, 64, 3, &r));
    if (r)
        keep(j, p, cpc_transport_wait(t, r));
}

Test(transport_local, size_mismatch_fails_both_sides)
{
    job j;
    run_world(&j, 2, 1, 10, mismatch_rank);
    for (int p = 0; p < 2; p++) {
        cr_assert_not_null(j.st[p], "rank %d saw no error", p);
        cr_assert_eq(j.st[p]->code, CPC_E_RUNTIME);
        cr_assert(strstr(j.st[p]->message, "size mismatch") != NULL, "%s", j.st[p]->message);
        cr_assert(strstr(j.st[p]->message, "48") && strstr(j.st[p]->message, "64"), "%s",
                  j.st[p]->message);
    }
    end_world(&j, 2);
}

/* ---- members calling different collectives --------------------------------------- */

static void coll_mismatch_rank(job *j, int p, cpc_transport *t)
{
    if (p == 1) {
        keep(j, p, cpc_transport_barrier(t, CPC_GROUP_ULYSSES));
    } else {
        int x = p, y[2];
        size_t cnt[2] = {sizeof x, sizeof x}, dsp[2] = {0, sizeof x};
        keep(j, p, cpc_transport_all_gather_v(t, CPC_GROUP_ULYSSES, &x, sizeof x, y, cnt, dsp));
    }
    /* The transport stays usable. */
    keep(j, p, cpc_transport_barrier(t, CPC_GROUP_WORLD));
}

Test(transport_local, different_collectives_are_an_error_on_every_member)
{
    job j;
    run_world(&j, 1, 2, 10, coll_mismatch_rank);
    for (int p = 0; p < 2; p++) {
        cr_assert_not_null(j.st[p], "rank %d saw no error", p);
        cr_assert(strstr(j.st[p]->message, "barrier") && strstr(j.st[p]->message, "all_gather_v"),
                  "%s", j.st[p]->message);
    }
    end_world(&j, 2);
}

/* ---- abort wakes every blocked rank ------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void abort_rank(job *j, int p, cpc_transport *t)
{
    if (p == 0) {
        usleep(50000);
        cpc_transport_abort(t, "rank 0 gave up");
        return;
    }
    double t0 = now_s();
    if (p == 1) {
        char b[8];
        cpc_request *r = NULL;
        cpc_status *st = cpc_transport_irecv(t, CPC_GROUP_WORLD, 0, b, sizeof b, 9, &r);
        if (!st)
            st = cpc_transport_wait(t, r);
        keep(j, p, st);
    } else if (p == 2) {
        keep(j, p, cpc_transport_barrier(t, CPC_GROUP_WORLD));
    } else {
        char s[8] = {0}, rbuf[16];
        size_t c[2] = {4, 4}, d[2] = {0, 4};
        keep(j, p, cpc_transport_all_to_all_v(t, CPC_GROUP_ULYSSES, s, c, d, rbuf, c, d));
    }
    snprintf(j->info[p], sizeof j->info[p], "%.3f", now_s() - t0);
    /* Later calls fail at once too. */
    keep(j, p, cpc_transport_barrier(t, CPC_GROUP_RING));
}

Test(transport_local, abort_wakes_every_waiter)
{
    job j;
    run_world(&j, 2, 2, 0 /* no timeout: only the abort can wake them */, abort_rank);
    for (int p = 1; p < 4; p++) {
        cr_assert_not_null(j.st[p], "rank %d was not woken with an error", p);
        cr_assert(strstr(j.st[p]->message, "aborted") != NULL, "%s", j.st[p]->message);
        cr_assert(strstr(j.st[p]->message, "rank 0 gave up") != NULL, "%s", j.st[p]->message);
        cr_assert(atof(j.info[p]) < 5.0, "rank %d took %s s", p, j.info[p]);
    }
    int who = -2;
    const char *why = NULL;
    cr_assert(cpc_local_world_aborted(j.w, &who, &why));
    cr_assert_eq(who, 0);
    cr_assert_str_eq(why, "rank 0 gave up");
    end_world(&j, 4);
}

/* A barrier, then collectives while a rank outside the group aborts the world: the members
 * leave with the abort's error.  Each barrier used to leave its members counted inside the
 * group, and a collective's leave after an abort waited for that count forever (found by the
 * numeric oracle of test_verify_attack: two ranks in an all_reduce, never woken). */
static void barrier_then_abort_rank(job *j, int p, cpc_transport *t)
{
    double t0 = now_s();
    if (p >= 2) {
        if (p == 2) {
            usleep(30000);
            cpc_transport_abort(t, "rank 2 gave up");
        }
        return;
    }
    cpc_status *st = cpc_transport_barrier(t, CPC_GROUP_ULYSSES);
    char s[64] = {0}, r[128];
    size_t c[2] = {64, 64}, d[2] = {0, 64};
    for (int i = 0; i < 1000000 && !st; i++)
        st = cpc_transport_all_gather_v(t, CPC_GROUP_ULYSSES, s, sizeof s, r, c, d);
    keep(j, p, st);
    snprintf(j->info[p], sizeof j->info[p], "%.3f", now_s() - t0);
}

Test(transport_local, collectives_after_a_barrier_leave_on_an_abort, .timeout = 30)
{
    job j;
    run_world(&j, 2, 2, 0 /* no timeout: only the abort can end the loop */, barrier_then_abort_rank);
    for (int p = 0; p < 2; p++) {
        cr_assert_not_null(j.st[p], "rank %d was not woken with an error", p);
        cr_assert(strstr(j.st[p]->message, "rank 2 gave up") != NULL, "%s", j.st[p]->message);
        cr_assert(atof(j.info[p]) < 20.0, "rank %d took %s s", p, j.info[p]);
    }
    end_world(&j, 4);
}

/* ---- timeout diagnostics -------------------------------------------------------------- */

static void timeout_rank(job *j, int p, cpc_transport *t)
{
    if (p == 1) {
        char b[8];
        cpc_request *r = NULL;
        cpc_status *st = cpc_transport_irecv(t, CPC_GROUP_RING, 0, b, sizeof b, 4, &r);
        if (!st)
            st = cpc_transport_wait(t, r);
        keep(j, p, st);
    } else {
        keep(j, p, cpc_transport_barrier(t, CPC_GROUP_WORLD));
    }
}

Test(transport_local, timeout_names_who_waits_for_what)
{
    job j;
    run_world(&j, 2, 1, 0.2, timeout_rank);
    for (int p = 0; p < 2; p++)
        cr_assert_not_null(j.st[p], "rank %d did not time out", p);
    /* The first timeout is the diagnostic every rank reports. */
    int who;
    const char *why;
    cr_assert(cpc_local_world_aborted(j.w, &who, &why));
    cr_assert(strstr(why, "stalled: ") != NULL && strstr(why, "timeout") != NULL, "%s", why);
    cr_assert(strstr(why, "recv from") != NULL || strstr(why, "barrier") != NULL, "%s", why);
    end_world(&j, 2);
}

/* ---- uneven collectives on a 2 x 2 mesh ------------------------------------------------ */

static void uneven_rank(job *j, int p, cpc_transport *t)
{
    /* ulysses group: members send (src+1)*(dst+1) bytes of value 16*src+dst. */
    int me = cpc_transport_group_rank(t, CPC_GROUP_ULYSSES), n = cpc_transport_group_size(t, CPC_GROUP_ULYSSES);
    size_t sc[2], sd[2], rc[2], rd[2], so = 0, ro = 0;
    for (int k = 0; k < n; k++) {
        sc[k] = (size_t)((me + 1) * (k + 1));
        rc[k] = (size_t)((k + 1) * (me + 1));
        sd[k] = so;
        rd[k] = ro + 1; /* a gap of one byte before each part */
        so += sc[k];
        ro += rc[k] + 1;
    }
    unsigned char sb[16], rb[16];
    for (int k = 0; k < n; k++)
        memset(sb + sd[k], 16 * me + k, sc[k]);
    memset(rb, 0xEE, sizeof rb);
    keep(j, p, cpc_transport_all_to_all_v(t, CPC_GROUP_ULYSSES, sb, sc, sd, rb, rc, rd));
    for (int k = 0; k < n; k++) {
        if (rb[rd[k] - 1] != 0xEE)
            snprintf(j->info[p], sizeof j->info[p], "gap before part %d written", k);
        for (size_t i = 0; i < rc[k]; i++)
            if (rb[rd[k] + i] != 16 * k + me)
                snprintf(j->info[p], sizeof j->info[p], "part %d byte %zu wrong", k, i);
    }
    /* ring group all-gather: member i contributes i+1 bytes of value 100+p. */
    int ri = cpc_transport_group_rank(t, CPC_GROUP_RING);
    unsigned char g[8], mine[4];
    memset(mine, 100 + p, sizeof mine);
    size_t cnt[2] = {1, 2}, dsp[2] = {3, 0};
    memset(g, 0, sizeof g);
    keep(j, p, cpc_transport_all_gather_v(t, CPC_GROUP_RING, mine, (size_t)(ri + 1), g, cnt, dsp));
    int u = p % 2;
    if (g[3] != 100 + u || g[0] != 100 + 2 + u || g[1] != 100 + 2 + u || g[2] != 0)
        snprintf(j->info[p], sizeof j->info[p], "all_gather_v content wrong: %d %d %d %d", g[0],
                 g[1], g[2], g[3]);
}

Test(transport_local, uneven_collectives_on_a_2x2_mesh)
{
    job j;
    run_world(&j, 2, 2, 10, uneven_rank);
    for (int p = 0; p < 4; p++) {
        cr_assert_null(j.st[p], "rank %d: %s", p, j.st[p]->message);
        cr_assert_eq(j.info[p][0], 0, "rank %d: %s", p, j.info[p]);
    }
    end_world(&j, 4);
}

Test(transport_local, endpoints_and_bad_arguments)
{
    cpc_local_world *w = NULL;
    cpc_status *bad = cpc_local_world_create(0, 2, &w);
    cr_assert_not_null(bad);
    cr_assert_null(w);
    cpc_status_free(bad);
    cr_assert_null(cpc_local_world_create(2, 3, &w));
    cpc_transport *a = NULL, *b = NULL;
    cr_assert_null(cpc_local_endpoint_create(w, 5, &a));
    cpc_status *st = cpc_local_endpoint_create(w, 5, &b);
    cr_assert_not_null(st, "two endpoints for one rank");
    cpc_status_free(st);
    st = cpc_local_endpoint_create(w, 6, &b);
    cr_assert_not_null(st, "rank out of range");
    cpc_status_free(st);
    /* rank 5 = r 1, u 2 */
    cr_assert_eq(cpc_transport_group_rank(a, CPC_GROUP_RING), 1);
    cr_assert_eq(cpc_transport_group_rank(a, CPC_GROUP_ULYSSES), 2);
    cr_assert_eq(cpc_transport_group_size(a, CPC_GROUP_ULYSSES), 3);
    cr_assert_eq(cpc_transport_group_size(a, CPC_GROUP_WORLD), 6);
    cpc_request *r = NULL;
    char x;
    st = cpc_transport_isend(a, CPC_GROUP_RING, 2, &x, 1, 0, &r);
    cr_assert_not_null(st, "peer outside the ring group accepted");
    cpc_status_free(st);
    st = cpc_transport_irecv(a, CPC_GROUP_WORLD, 0, &x, 1, -1, &r);
    cr_assert_not_null(st, "negative tag accepted");
    cpc_status_free(st);
    st = cpc_transport_barrier(a, CPC_GROUP_NONE);
    cr_assert_not_null(st, "group none accepted");
    cpc_status_free(st);
    cpc_transport_destroy(a);
    /* After destroy the rank may get a new endpoint. */
    cr_assert_null(cpc_local_endpoint_create(w, 5, &a));
    cpc_transport_destroy(a);
    cpc_local_world_destroy(w);
}
