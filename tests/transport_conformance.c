/* transport_conformance.c - see transport_conformance.h */
#include "transport_conformance.h"

#include "transport_local.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SENTINEL 0xA5
#define MAX_FAILS_PER_CHECK 8

static const struct {
    unsigned bit;
    const char *name;
} check_names[] = {
    {CPC_CONF_GROUPS, "groups"},           {CPC_CONF_RING, "ring"},
    {CPC_CONF_SELF, "self"},               {CPC_CONF_OUTSTANDING, "outstanding"},
    {CPC_CONF_ALL_TO_ALL, "all_to_all_v"}, {CPC_CONF_ALL_GATHER, "all_gather_v"},
    {CPC_CONF_BARRIER, "barrier"},         {CPC_CONF_LARGE, "large"},
    {CPC_CONF_BAD_ARGS, "bad_args"},       {CPC_CONF_ABORT, "abort"},
};

const char *cpc_conf_check_name(unsigned check)
{
    for (size_t i = 0; i < sizeof check_names / sizeof check_names[0]; i++)
        if (check_names[i].bit == check)
            return check_names[i].name;
    return "?";
}

typedef struct suite {
    cpc_transport *t;
    const char *name;
    int R, U, r, u, p, P;
    unsigned skip;
    bool same_clock;
    size_t large;
    FILE *log;
    unsigned check;          /* the check running */
    int fails;               /* mismatches recorded in this check */
    cpc_status *chain;       /* CPC_E_CHECK diagnostics */
} suite;

static const cpc_group groups[3] = {CPC_GROUP_RING, CPC_GROUP_ULYSSES, CPC_GROUP_WORLD};

static const char *gname(cpc_group g)
{
    switch (g) {
    case CPC_GROUP_RING: return "ring";
    case CPC_GROUP_ULYSSES: return "ulysses";
    case CPC_GROUP_WORLD: return "world";
    default: return "none";
    }
}

/* Expected size of group g, this rank's index in it, and the world rank of
 * member i (flat rank p = r*U + u). */
static int gsize(const suite *S, cpc_group g)
{
    return g == CPC_GROUP_RING ? S->R : g == CPC_GROUP_ULYSSES ? S->U : S->P;
}
static int gindex(const suite *S, cpc_group g)
{
    return g == CPC_GROUP_RING ? S->r : g == CPC_GROUP_ULYSSES ? S->u : S->p;
}
static int gmember_world(const suite *S, cpc_group g, int i)
{
    return g == CPC_GROUP_RING ? i * S->U + S->u : g == CPC_GROUP_ULYSSES ? S->r * S->U + i : i;
}

static void fail(suite *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records a wrong value (CPC_E_CHECK); the suite goes on. */
static void fail(suite *S, const char *fmt, ...)
{
    S->fails++;
    if (S->fails > MAX_FAILS_PER_CHECK)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cpc_status_append(&S->chain,
                      cpc_error(CPC_E_CHECK, "conformance %s: rank %d (r=%d, u=%d): %s: %s%s",
                                S->name, S->p, S->r, S->u, cpc_conf_check_name(S->check), msg,
                                S->fails == MAX_FAILS_PER_CHECK ? " (further mismatches of "
                                                                  "this check not listed)"
                                                                : ""));
}

/* A transport call failed where it must not: abort the transport so that no
 * other rank stays blocked, and return the error with context. */
static cpc_status *fatal(suite *S, cpc_status *st, const char *call)
{
    cpc_status_prefix(st, "conformance %s: rank %d (r=%d, u=%d): %s: %s", S->name, S->p, S->r,
                      S->u, cpc_conf_check_name(S->check), call);
    char *why = cpc_status_format(st, "conformance");
    cpc_transport_abort(S->t, why ? why : st->message);
    free(why);
    return st;
}

/* Runs a transport call that must succeed; on failure the check returns at
 * once through fatal().  Buffers of the failed check are deliberately not
 * freed: a request still in flight may refer to them. */
#define CALL(S, expr)                                                                         \
    do {                                                                                      \
        cpc_status *st_ = (expr);                                                             \
        if (st_)                                                                              \
            return fatal((S), st_, #expr);                                                    \
    } while (0)

/* ---- data patterns ---------------------------------------------------------- */

/* splitmix64's finaliser (a bijective mixer of 64-bit words). */
static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Seed of one message: what check, group, sender, receiver, tag/step. */
static uint64_t seed_of(unsigned check, int g, int src, int dst, int k)
{
    uint64_t h = mix64(check);
    h = mix64(h ^ (uint64_t)(uint32_t)g);
    h = mix64(h ^ (uint64_t)(uint32_t)src);
    h = mix64(h ^ (uint64_t)(uint32_t)dst);
    return mix64(h ^ (uint64_t)(uint32_t)k);
}

static void fill(void *buf, size_t n, uint64_t seed)
{
    unsigned char *b = buf;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = mix64(seed + i / 8);
        memcpy(b + i, &w, 8);
    }
    if (i < n) {
        uint64_t w = mix64(seed + i / 8);
        memcpy(b + i, &w, n - i);
    }
}

/* Offset of the first byte that differs from fill(seed), or SIZE_MAX. */
static size_t first_diff(const void *buf, size_t n, uint64_t seed)
{
    const unsigned char *b = buf;
    size_t i = 0;
    for (; i < n; i += 8) {
        uint64_t w = mix64(seed + i / 8);
        size_t m = n - i < 8 ? n - i : 8;
        if (memcmp(b + i, &w, m) != 0) {
            const unsigned char *e = (const unsigned char *)&w;
            for (size_t j = 0; j < m; j++)
                if (b[i + j] != e[j])
                    return i + j;
        }
    }
    return SIZE_MAX;
}

static size_t first_not_sentinel(const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != SENTINEL)
            return i;
    return SIZE_MAX;
}

/* Checks a received region; `what` describes it. */
static void expect_data(suite *S, const void *buf, size_t n, uint64_t seed, const char *what)
{
    size_t d = first_diff(buf, n, seed);
    if (d != SIZE_MAX)
        fail(S, "%s: byte %zu of %zu differs (got 0x%02x)", what, d, n,
             ((const unsigned char *)buf)[d]);
}

static void expect_untouched(suite *S, const void *buf, size_t n, const char *what)
{
    size_t d = first_not_sentinel(buf, n);
    if (d != SIZE_MAX)
        fail(S, "%s: byte %zu of %zu was written (0x%02x) though no data belongs there", what,
             d, n, ((const unsigned char *)buf)[d]);
}

static void *xmalloc(size_t n)
{
    /* Never malloc(0): a zero-byte buffer is still a valid pointer.
     * Zeroed, so no byte is ever read uninitialised. */
    return calloc(n ? n : 1, 1);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- GROUPS --------------------------------------------------------------- */

static cpc_status *check_groups(suite *S)
{
    cpc_transport *t = S->t;
    bool bad = false;
    for (int k = 0; k < 3; k++) {
        cpc_group g = groups[k];
        int n = cpc_transport_group_size(t, g), i = cpc_transport_group_rank(t, g);
        if (n != gsize(S, g) || i != gindex(S, g)) {
            fail(S, "%s group: rank %d of %d, expected %d of %d", gname(g), i, n, gindex(S, g),
                 gsize(S, g));
            bad = true;
        }
    }
    if (bad) {
        /* Every later check relies on the groups: stop here, and make sure
         * no other rank waits for this one. */
        cpc_status *st = cpc_error(CPC_E_CHECK, "conformance %s: rank %d: wrong groups; "
                                                "remaining checks not run", S->name, S->p);
        char *why = cpc_status_format(st, "conformance");
        cpc_transport_abort(t, why ? why : st->message);
        free(why);
        return st;
    }
    if (S->skip & CPC_CONF_ALL_GATHER)
        return NULL;   /* the members are checked with all_gather_v */
    /* Who is in each group, in which order. */
    for (int k = 0; k < 3; k++) {
        cpc_group g = groups[k];
        int n = gsize(S, g);
        int32_t mine = S->p;
        int32_t *all = calloc((size_t)n, sizeof *all);
        size_t *counts = calloc((size_t)n, sizeof *counts);
        size_t *displs = calloc((size_t)n, sizeof *displs);
        if (!all || !counts || !displs) {
            free(all);
            free(counts);
            free(displs);
            return fatal(S, &cpc_status_oom, "calloc");
        }
        for (int j = 0; j < n; j++) {
            counts[j] = sizeof(int32_t);
            displs[j] = (size_t)j * sizeof(int32_t);
            all[j] = -1;
        }
        cpc_status *st = cpc_transport_all_gather_v(t, g, &mine, sizeof mine, all, counts, displs);
        if (!st)
            for (int j = 0; j < n; j++)
                if (all[j] != gmember_world(S, g, j))
                    fail(S, "%s group: member %d is world rank %d, expected %d", gname(g), j,
                         (int)all[j], gmember_world(S, g, j));
        free(all);
        free(counts);
        free(displs);
        if (st)
            return fatal(S, st, "all_gather_v(world ranks)");
    }
    return NULL;
}

/* ---- RING ----------------------------------------------------------------- */

static size_t ring_bytes(int src, int s, int g)
{
    return 1 + ((size_t)src * 131 + (size_t)s * 17 + (size_t)g * 7) % 3001;
}

static cpc_status *check_ring(suite *S)
{
    cpc_transport *t = S->t;
    for (int k = 0; k < 3; k++) {
        cpc_group g = groups[k];
        int n = gsize(S, g), i = gindex(S, g);
        for (int s = 1; s < n; s++) {
            int dst = (i + s) % n, src = (i - s + n) % n, tag = 100 + s;
            size_t sb = ring_bytes(i, s, g), rb = ring_bytes(src, s, g);
            unsigned char *sbuf = xmalloc(sb), *rbuf = xmalloc(rb + 16);
            if (!sbuf || !rbuf) {
                free(sbuf);
                free(rbuf);
                return fatal(S, &cpc_status_oom, "malloc");
            }
            fill(sbuf, sb, seed_of(CPC_CONF_RING, g, i, dst, tag));
            memset(rbuf, SENTINEL, rb + 16);
            cpc_request *rq = NULL, *sq = NULL;
            /* as CALL, freeing the buffers first (a transport that fails, e.g. the
             * callback transport's failure injection, ends the suite here) */
#define CALL_FREEING(expr)                                                                    \
    do {                                                                                      \
        cpc_status *st_ = (expr);                                                             \
        if (st_) {                                                                            \
            free(sbuf);                                                                       \
            free(rbuf);                                                                       \
            return fatal(S, st_, #expr);                                                      \
        }                                                                                     \
    } while (0)
            CALL_FREEING(cpc_transport_irecv(t, g, src, rbuf, rb, tag, &rq));
            CALL_FREEING(cpc_transport_isend(t, g, dst, sbuf, sb, tag, &sq));
            if (s % 2) {
                CALL_FREEING(cpc_transport_wait(t, sq));
                CALL_FREEING(cpc_transport_wait(t, rq));
            } else {
                CALL_FREEING(cpc_transport_wait(t, rq));
                CALL_FREEING(cpc_transport_wait(t, sq));
            }
#undef CALL_FREEING
            char what[128];
            snprintf(what, sizeof what, "%s group shift %d: recv from member %d tag %d",
                     gname(g), s, src, tag);
            expect_data(S, rbuf, rb, seed_of(CPC_CONF_RING, g, src, i, tag), what);
            expect_untouched(S, rbuf + rb, 16, what);
            free(sbuf);
            free(rbuf);
        }
    }
    return NULL;
}

/* ---- SELF ----------------------------------------------------------------- */

static cpc_status *check_self(suite *S)
{
    cpc_transport *t = S->t;
    for (int k = 0; k < 3; k++) {
        cpc_group g = groups[k];
        int i = gindex(S, g);
        size_t n = 100 + (size_t)k * 33;
        unsigned char sbuf[256], rbuf[256 + 16];
        fill(sbuf, n, seed_of(CPC_CONF_SELF, g, i, i, 7));
        memset(rbuf, SENTINEL, sizeof rbuf);
        cpc_request *sq = NULL, *rq = NULL;
        CALL(S, cpc_transport_isend(t, g, i, sbuf, n, 7, &sq));
        CALL(S, cpc_transport_irecv(t, g, i, rbuf, n, 7, &rq));
        CALL(S, cpc_transport_wait(t, rq));
        CALL(S, cpc_transport_wait(t, sq));
        char what[96];
        snprintf(what, sizeof what, "%s group: message to self", gname(g));
        expect_data(S, rbuf, n, seed_of(CPC_CONF_SELF, g, i, i, 7), what);
        expect_untouched(S, rbuf + n, 16, what);
    }
    return NULL;
}

/* ---- OUTSTANDING ---------------------------------------------------------- */

enum { NOUT = 6 };
/* Message k (in the sender's posting order) has tag out_tag[k]. */
static const int out_tag[NOUT] = {2, 1, 0, 1, 3, 2};
/* The receiver posts the receive of message out_recv_order[j] j-th. */
static const int out_recv_order[NOUT] = {4, 1, 0, 2, 3, 5};

static size_t out_bytes(int k, int sender)
{
    return k == 2 ? 0 : 10 + 97 * (size_t)k + (size_t)(sender % 5);
}

static cpc_status *check_outstanding(suite *S)
{
    cpc_transport *t = S->t;
    for (int gk = 0; gk < 3; gk++) {
        cpc_group g = groups[gk];
        int n = gsize(S, g), i = gindex(S, g);
        if (n == 1 && (S->skip & CPC_CONF_SELF))
            continue;
        int right = (i + 1) % n, left = (i - 1 + n) % n;
        unsigned char *sbuf[NOUT], *rbuf[NOUT];
        cpc_request *sq[NOUT], *rq[NOUT];
        bool oom = false;
        for (int k = 0; k < NOUT; k++) {
            sbuf[k] = xmalloc(out_bytes(k, i));
            rbuf[k] = xmalloc(out_bytes(k, left) + 16);
            oom |= !sbuf[k] || !rbuf[k];
        }
        if (oom) {
            for (int k = 0; k < NOUT; k++) {
                free(sbuf[k]);
                free(rbuf[k]);
            }
            return fatal(S, &cpc_status_oom, "malloc");
        }
        for (int k = 0; k < NOUT; k++) {
            fill(sbuf[k], out_bytes(k, i), seed_of(CPC_CONF_OUTSTANDING, g, i, right, k));
            memset(rbuf[k], SENTINEL, out_bytes(k, left) + 16);
        }
        /* On a failure every posted request is still completed (the wait
         * frees it, with an error once the transport is aborted) and the
         * buffers are freed, so a failing transport leaks nothing. */
        for (int k = 0; k < NOUT; k++)
            sq[k] = rq[k] = NULL;
        cpc_status *err = NULL;
        const char *err_what = NULL;
        for (int j = 0; j < NOUT && !err; j++) {
            int k = out_recv_order[j];
            err = cpc_transport_irecv(t, g, left, rbuf[k], out_bytes(k, left), out_tag[k], &rq[k]);
            err_what = "irecv";
        }
        for (int k = 0; k < NOUT && !err; k++) {
            err = cpc_transport_isend(t, g, right, sbuf[k], out_bytes(k, i), out_tag[k], &sq[k]);
            err_what = "isend";
        }
        if (err && t->vt->abort)
            cpc_transport_abort(t, "conformance: outstanding: a post failed");
        /* Completion in a third order: receives last-posted first, then the
         * sends. */
        for (int j = NOUT - 1; j >= 0; j--) {
            cpc_request *q = rq[out_recv_order[j]];
            if (!q)
                continue;
            cpc_status *w = cpc_transport_wait(t, q);
            if (w && !err) {
                err = w;
                err_what = "wait (recv)";
            } else {
                cpc_status_free(w);
            }
        }
        for (int k = 0; k < NOUT; k++) {
            if (!sq[k])
                continue;
            cpc_status *w = cpc_transport_wait(t, sq[k]);
            if (w && !err) {
                err = w;
                err_what = "wait (send)";
            } else {
                cpc_status_free(w);
            }
        }
        if (err) {
            for (int k = 0; k < NOUT; k++) {
                free(sbuf[k]);
                free(rbuf[k]);
            }
            return fatal(S, err, err_what);
        }
        for (int k = 0; k < NOUT; k++) {
            char what[128];
            snprintf(what, sizeof what,
                     "%s group: message %d (tag %d, %zu bytes) from member %d", gname(g), k,
                     out_tag[k], out_bytes(k, left), left);
            expect_data(S, rbuf[k], out_bytes(k, left),
                        seed_of(CPC_CONF_OUTSTANDING, g, left, i, k), what);
            expect_untouched(S, rbuf[k] + out_bytes(k, left), 16, what);
            free(sbuf[k]);
            free(rbuf[k]);
        }
    }
    return NULL;
}

/* ---- ALL_TO_ALL ------------------------------------------------------------ */

static size_t a2a_bytes(int a, int b, int salt, size_t base)
{
    (void)base;
    if (salt == 2)
        return 0;
    if ((a * 5 + b * 3 + salt) % 4 == 0)
        return 0;
    return 1 + ((size_t)a * 37 + (size_t)b * 11 + (size_t)salt * 7) % 500;
}

/* One all_to_all_v over g; part(a -> b) has part_bytes(a, b) bytes.  Send
 * parts are laid out in reverse member order with send_gap bytes after each,
 * receive parts in member order with recv_gap bytes before each. */
static cpc_status *a2a_round(suite *S, cpc_group g,
                             size_t (*part_bytes)(int, int, int, size_t), size_t base,
                             int salt, size_t send_gap, size_t recv_gap, int seed_k)
{
    cpc_transport *t = S->t;
    int n = gsize(S, g), i = gindex(S, g);
    size_t *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
    size_t *rc = calloc((size_t)n, sizeof *rc), *rd = calloc((size_t)n, sizeof *rd);
    if (!sc || !sd || !rc || !rd) {
        free(sc);
        free(sd);
        free(rc);
        free(rd);
        return fatal(S, &cpc_status_oom, "calloc");
    }
    size_t stot = 0, rtot = 0;
    for (int j = n - 1; j >= 0; j--) {
        sc[j] = part_bytes(i, j, salt, base);
        sd[j] = stot;
        stot += sc[j] + send_gap;
    }
    for (int j = 0; j < n; j++) {
        rtot += recv_gap;
        rc[j] = part_bytes(j, i, salt, base);
        rd[j] = rtot;
        rtot += rc[j];
    }
    unsigned char *sbuf = xmalloc(stot), *rbuf = xmalloc(rtot + 16);
    cpc_status *st = NULL;
    if (!sbuf || !rbuf) {
        st = fatal(S, &cpc_status_oom, "malloc");
        goto out;
    }
    memset(sbuf, SENTINEL, stot);
    for (int j = 0; j < n; j++)
        fill(sbuf + sd[j], sc[j], seed_of(CPC_CONF_ALL_TO_ALL, g, i, j, seed_k));
    memset(rbuf, SENTINEL, rtot + 16);
    st = cpc_transport_all_to_all_v(t, g, sbuf, sc, sd, rbuf, rc, rd);
    if (st) {
        st = fatal(S, st, "all_to_all_v");
        goto out;
    }
    for (int j = 0; j < n; j++) {
        char what[128];
        snprintf(what, sizeof what, "%s group round %d: part from member %d (%zu bytes)",
                 gname(g), seed_k, j, rc[j]);
        expect_data(S, rbuf + rd[j], rc[j], seed_of(CPC_CONF_ALL_TO_ALL, g, j, i, seed_k), what);
        snprintf(what, sizeof what, "%s group round %d: gap before the part of member %d",
                 gname(g), seed_k, j);
        expect_untouched(S, rbuf + rd[j] - recv_gap, recv_gap, what);
    }
    {
        char what[96];
        snprintf(what, sizeof what, "%s group round %d: tail of the receive buffer", gname(g),
                 seed_k);
        expect_untouched(S, rbuf + rtot, 16, what);
    }
out:
    free(sbuf);
    free(rbuf);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
    return st;
}

static cpc_status *check_all_to_all(suite *S)
{
    for (int k = 0; k < 3; k++)
        for (int salt = 0; salt < 3; salt++) {
            cpc_status *st = a2a_round(S, groups[k], a2a_bytes, 0, salt, 3, 5, salt);
            if (st)
                return st;
        }
    return NULL;
}

/* ---- ALL_GATHER ------------------------------------------------------------ */

static size_t ag_bytes(int j, int salt, size_t base)
{
    (void)base;
    return (j % 3 == 1) ? 0 : 7 + 29 * (size_t)j + (size_t)salt;
}

/* One all_gather_v over g; member j contributes part_bytes(j, salt) bytes;
 * parts land in reverse member order with `gap` bytes before each. */
static cpc_status *ag_round(suite *S, cpc_group g, size_t (*part_bytes)(int, int, size_t),
                            size_t base, int salt, size_t gap, unsigned check)
{
    cpc_transport *t = S->t;
    int n = gsize(S, g), i = gindex(S, g);
    size_t *c = calloc((size_t)n, sizeof *c), *d = calloc((size_t)n, sizeof *d);
    if (!c || !d) {
        free(c);
        free(d);
        return fatal(S, &cpc_status_oom, "calloc");
    }
    size_t tot = 0;
    for (int j = n - 1; j >= 0; j--) {
        tot += gap;
        c[j] = part_bytes(j, salt, base);
        d[j] = tot;
        tot += c[j];
    }
    unsigned char *sbuf = xmalloc(c[i]), *rbuf = xmalloc(tot + 16);
    cpc_status *st = NULL;
    if (!sbuf || !rbuf) {
        st = fatal(S, &cpc_status_oom, "malloc");
        goto out;
    }
    fill(sbuf, c[i], seed_of(check, g, i, salt, 0));
    memset(rbuf, SENTINEL, tot + 16);
    st = cpc_transport_all_gather_v(t, g, sbuf, c[i], rbuf, c, d);
    if (st) {
        st = fatal(S, st, "all_gather_v");
        goto out;
    }
    for (int j = 0; j < n; j++) {
        char what[128];
        snprintf(what, sizeof what, "%s group round %d: part of member %d (%zu bytes)",
                 gname(g), salt, j, c[j]);
        expect_data(S, rbuf + d[j], c[j], seed_of(check, g, j, salt, 0), what);
        snprintf(what, sizeof what, "%s group round %d: gap before the part of member %d",
                 gname(g), salt, j);
        expect_untouched(S, rbuf + d[j] - gap, gap, what);
    }
    {
        char what[96];
        snprintf(what, sizeof what, "%s group round %d: tail of the receive buffer", gname(g),
                 salt);
        expect_untouched(S, rbuf + tot, 16, what);
    }
out:
    free(sbuf);
    free(rbuf);
    free(c);
    free(d);
    return st;
}

static cpc_status *check_all_gather(suite *S)
{
    for (int k = 0; k < 3; k++)
        for (int salt = 0; salt < 2; salt++) {
            cpc_status *st = ag_round(S, groups[k], ag_bytes, 0, salt, 4, CPC_CONF_ALL_GATHER);
            if (st)
                return st;
        }
    return NULL;
}

/* ---- BARRIER --------------------------------------------------------------- */

static cpc_status *check_barrier(suite *S)
{
    cpc_transport *t = S->t;
    for (int rep = 0; rep < 20; rep++)
        for (int k = 0; k < 3; k++)
            CALL(S, cpc_transport_barrier(t, groups[k]));
    if (!S->same_clock || (S->skip & CPC_CONF_ALL_GATHER))
        return NULL;
    for (int k = 0; k < 3; k++) {
        cpc_group g = groups[k];
        int n = gsize(S, g), i = gindex(S, g);
        if (n == 1)
            continue;
        CALL(S, cpc_transport_barrier(t, g));
        if (i == n - 1)
            sleep_ms(20);   /* the last member comes late */
        int64_t enter = now_ns();
        CALL(S, cpc_transport_barrier(t, g));
        int64_t leave = now_ns();
        int64_t *all = calloc((size_t)n, sizeof *all);
        size_t *c = calloc((size_t)n, sizeof *c), *d = calloc((size_t)n, sizeof *d);
        if (!all || !c || !d) {
            free(all);
            free(c);
            free(d);
            return fatal(S, &cpc_status_oom, "calloc");
        }
        for (int j = 0; j < n; j++) {
            c[j] = sizeof(int64_t);
            d[j] = (size_t)j * sizeof(int64_t);
        }
        cpc_status *st = cpc_transport_all_gather_v(t, g, &enter, sizeof enter, all, c, d);
        if (!st)
            for (int j = 0; j < n; j++)
                if (all[j] > leave)
                    fail(S, "%s group: left the barrier %.3f ms before member %d entered it",
                         gname(g), (double)(all[j] - leave) / 1e6, j);
        free(all);
        free(c);
        free(d);
        if (st)
            return fatal(S, st, "all_gather_v(entry times)");
    }
    return NULL;
}

/* ---- LARGE ------------------------------------------------------------------ */

static size_t large_a2a_bytes(int a, int b, int salt, size_t base)
{
    (void)salt;
    return base + (size_t)((a + 2 * b) % 7);
}

static size_t large_ag_bytes(int j, int salt, size_t base)
{
    (void)salt;
    return base + (size_t)j;
}

static cpc_status *check_large(suite *S)
{
    cpc_transport *t = S->t;
    size_t L = S->large;
    /* Ring shift over the world group with L-byte messages. */
    if (S->P > 1 || !(S->skip & CPC_CONF_SELF)) {
        int n = S->P, i = S->p, dst = (i + 1) % n, src = (i - 1 + n) % n;
        size_t sb = L + (size_t)i, rb = L + (size_t)src;
        unsigned char *sbuf = xmalloc(sb), *rbuf = xmalloc(rb + 16);
        if (!sbuf || !rbuf) {
            free(sbuf);
            free(rbuf);
            return fatal(S, &cpc_status_oom, "malloc");
        }
        fill(sbuf, sb, seed_of(CPC_CONF_LARGE, CPC_GROUP_WORLD, i, dst, 1));
        memset(rbuf, SENTINEL, rb + 16);
        cpc_request *rq = NULL, *sq = NULL;
        CALL(S, cpc_transport_irecv(t, CPC_GROUP_WORLD, src, rbuf, rb, 5, &rq));
        CALL(S, cpc_transport_isend(t, CPC_GROUP_WORLD, dst, sbuf, sb, 5, &sq));
        CALL(S, cpc_transport_wait(t, rq));
        CALL(S, cpc_transport_wait(t, sq));
        char what[96];
        snprintf(what, sizeof what, "world ring shift: %zu bytes from member %d", rb, src);
        expect_data(S, rbuf, rb, seed_of(CPC_CONF_LARGE, CPC_GROUP_WORLD, src, i, 1), what);
        expect_untouched(S, rbuf + rb, 16, what);
        free(sbuf);
        free(rbuf);
    }
    /* all_to_all_v over the world, parts of about L / P bytes. */
    cpc_status *st = a2a_round(S, CPC_GROUP_WORLD, large_a2a_bytes, L / (size_t)S->P, 0, 8, 8,
                               100);
    if (st)
        return st;
    /* all_gather_v over the ring group, parts of about L / R bytes. */
    return ag_round(S, CPC_GROUP_RING, large_ag_bytes, L / (size_t)S->R, 0, 8, CPC_CONF_LARGE);
}

/* ---- BAD_ARGS ----------------------------------------------------------------- */

static cpc_status *check_bad_args(suite *S)
{
    cpc_transport *t = S->t;
    unsigned char buf[16] = {0};
    int n = S->P;
    struct {
        bool send;
        cpc_group g;
        int peer, tag;
        const char *what;
    } cases[] = {
        {true, CPC_GROUP_WORLD, n, 1, "isend to peer == group size"},
        {false, CPC_GROUP_WORLD, -1, 1, "irecv from peer -1"},
        {true, CPC_GROUP_RING, S->R, 1, "isend to ring peer == ring size"},
        {false, CPC_GROUP_ULYSSES, S->U + 3, 1, "irecv from ulysses peer beyond the group"},
        {true, CPC_GROUP_WORLD, 0, -1, "isend with tag -1"},
        {true, CPC_GROUP_NONE, 0, 1, "isend on group none"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cpc_request *rq = NULL;
        cpc_status *st = cases[k].send
                             ? cpc_transport_isend(t, cases[k].g, cases[k].peer, buf, sizeof buf,
                                            cases[k].tag, &rq)
                             : cpc_transport_irecv(t, cases[k].g, cases[k].peer, buf, sizeof buf,
                                            cases[k].tag, &rq);
        if (st) {
            cpc_status_free(st);
            continue;
        }
        /* Accepted: a request is in flight that no one will match. */
        fail(S, "%s was accepted (no error)", cases[k].what);
        return fatal(S, cpc_error(CPC_E_CHECK, "bad arguments accepted"), cases[k].what);
    }
    /* Still usable. */
    CALL(S, cpc_transport_barrier(t, CPC_GROUP_WORLD));
    return NULL;
}

/* ---- ABORT -------------------------------------------------------------------- */

static cpc_status *check_abort(suite *S)
{
    cpc_transport *t = S->t;
    int n = S->P, i = S->p;
    char ready = 1, got[1];
    cpc_request *sq = NULL;
    /* Member 0 aborts only once every other rank has finished its earlier
     * calls (their "ready" messages prove it). */
    if (i != 0) {
        CALL(S, cpc_transport_isend(t, CPC_GROUP_WORLD, 0, &ready, 1, 998, &sq));
    } else {
        for (int j = 1; j < n; j++) {
            cpc_request *rq = NULL;
            CALL(S, cpc_transport_irecv(t, CPC_GROUP_WORLD, j, got, 1, 998, &rq));
            CALL(S, cpc_transport_wait(t, rq));
        }
        cpc_transport_abort(t, "conformance: deliberate abort by world member 0");
    }
    /* A receive nobody sends must fail (at post or at wait), not hang. */
    char never[16];
    cpc_request *rq = NULL;
    cpc_status *st = cpc_transport_irecv(t, CPC_GROUP_WORLD, (i + 1) % n, never, sizeof never, 999, &rq);
    if (!st) {
        st = cpc_transport_wait(t, rq);
        if (!st)
            fail(S, "after abort, a receive that nobody sent completed without error");
    }
    cpc_status_free(st);
    if (sq)
        cpc_status_free(cpc_transport_wait(t, sq));   /* may succeed or fail */
    st = cpc_transport_barrier(t, CPC_GROUP_WORLD);
    if (!st)
        fail(S, "after abort, a world barrier returned without error");
    cpc_status_free(st);
    return NULL;
}

/* ---- driver ---------------------------------------------------------------------- */

cpc_status *cpc_transport_conformance(cpc_transport *t, int ring_degree, int ulysses_degree,
                                      int r, int u, const cpc_conformance_opts *opts)
{
    suite S;
    memset(&S, 0, sizeof S);
    S.t = t;
    S.R = ring_degree;
    S.U = ulysses_degree;
    S.r = r;
    S.u = u;
    S.P = ring_degree * ulysses_degree;
    S.p = r * ulysses_degree + u;
    S.skip = opts ? opts->skip : CPC_CONF_ABORT;
    S.name = (opts && opts->name) ? opts->name : t->vt->name;
    S.same_clock = opts ? opts->same_clock : false;
    S.large = (opts && opts->large_bytes) ? opts->large_bytes : ((size_t)6 << 20) + 3;
    S.log = opts ? opts->log : NULL;
    const char *reason = (opts && opts->skip_reason) ? opts->skip_reason : "";
    if (ring_degree < 1 || ulysses_degree < 1 || r < 0 || r >= ring_degree || u < 0 ||
        u >= ulysses_degree)
        return cpc_error(CPC_E_INTERNAL, "conformance: bad mesh coordinates (%d, %d) of %d x %d",
                         r, u, ring_degree, ulysses_degree);

    static cpc_status *(*const fns[])(suite *) = {
        check_groups, check_ring, check_self, check_outstanding, check_all_to_all,
        check_all_gather, check_barrier, check_large, check_bad_args, check_abort,
    };
    _Static_assert(sizeof fns / sizeof fns[0] == sizeof check_names / sizeof check_names[0],
                   "one function per check");
    for (size_t k = 0; k < sizeof fns / sizeof fns[0]; k++) {
        unsigned bit = check_names[k].bit;
        S.check = bit;
        S.fails = 0;
        bool speak = S.log && S.p == 0;
        if (S.skip & bit) {
            if (speak)
                fprintf(S.log, "conformance %s %dx%d: %-12s skipped%s%s\n", S.name, S.R, S.U,
                        check_names[k].name, *reason ? ": " : "", reason);
            continue;
        }
        int64_t t0 = now_ns();
        cpc_status *st = fns[k](&S);
        if (speak)
            fprintf(S.log, "conformance %s %dx%d: %-12s %s (%.1f ms)\n", S.name, S.R, S.U,
                    check_names[k].name, st ? "ERROR" : S.fails ? "FAILED" : "ok",
                    (double)(now_ns() - t0) / 1e6);
        if (S.fails > MAX_FAILS_PER_CHECK)
            cpc_status_append(&S.chain,
                              cpc_error(CPC_E_CHECK, "conformance %s: rank %d: %s: %d mismatches "
                                                     "in all",
                                        S.name, S.p, check_names[k].name, S.fails));
        if (st) {
            /* Fatal: the transport is aborted; report what we have. */
            cpc_status_append(&st, S.chain);
            return st;
        }
    }
    return S.chain;
}

/* ---- the suite on rank threads of one local world -------------------------------- */

typedef struct conf_thread {
    cpc_local_world *w;
    int R, U, p;
    cpc_conformance_wrap_fn wrap;
    void *ctx;
    const cpc_conformance_opts *opts;
    cpc_status *st;
} conf_thread;

static void *conf_thread_main(void *arg)
{
    conf_thread *j = arg;
    cpc_transport *in = NULL, *t = NULL;
    j->st = cpc_local_endpoint_create(j->w, j->p, &in);
    if (!j->st) {
        if (j->wrap)
            j->st = j->wrap(j->ctx, j->p, in, &t);
        else
            t = in;
    }
    if (j->st) {
        cpc_local_world_abort(j->w, j->p, "conformance: endpoint setup failed");
        if (in)
            cpc_transport_destroy(in);
        return NULL;
    }
    j->st = cpc_transport_conformance(t, j->R, j->U, j->p / j->U, j->p % j->U, j->opts);
    cpc_transport_destroy(t);
    return NULL;
}

cpc_status *cpc_conformance_local_threads(cpc_local_world *w, int R, int U,
                                          cpc_conformance_wrap_fn wrap, void *ctx,
                                          const cpc_conformance_opts *opts)
{
    int P = R * U;
    conf_thread *jobs = calloc((size_t)P, sizeof *jobs);
    pthread_t *th = calloc((size_t)P, sizeof *th);
    bool *started = calloc((size_t)P, sizeof *started);
    cpc_status *all = NULL;
    if (!jobs || !th || !started) {
        free(jobs);
        free(th);
        free(started);
        return &cpc_status_oom;
    }
    for (int p = 0; p < P; p++) {
        jobs[p] = (conf_thread){.w = w, .R = R, .U = U, .p = p, .wrap = wrap, .ctx = ctx, .opts = opts};
        if (pthread_create(&th[p], NULL, conf_thread_main, &jobs[p]) == 0) {
            started[p] = true;
        } else {
            cpc_status_append(&all, cpc_error(CPC_E_RUNTIME, "conformance: cannot start rank %d", p));
            cpc_local_world_abort(w, p, "conformance: thread start failed");
        }
    }
    for (int p = 0; p < P; p++)
        if (started[p]) {
            pthread_join(th[p], NULL);
            cpc_status_append(&all, jobs[p].st);
        }
    free(jobs);
    free(th);
    free(started);
    return all;
}
