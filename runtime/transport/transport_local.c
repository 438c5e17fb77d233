/* transport_local.c - see transport_local.h */
#include "transport_local.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { REQ_POSTED = 0, REQ_COPYING, REQ_DONE };
enum { COLL_NONE = 0, COLL_A2A, COLL_AG, COLL_BARRIER };

static const char *coll_name(int k)
{
    switch (k) {
    case COLL_A2A: return "all_to_all_v";
    case COLL_AG: return "all_gather_v";
    case COLL_BARRIER: return "barrier";
    default: return "none";
    }
}

struct cpc_request {
    bool is_send;
    cpc_group g;
    int src, dst;          /* flat ranks */
    int peer_idx;          /* the peer's index in the group (diagnostics) */
    int tag;
    void *buf;             /* recv: destination; send: source (const) */
    size_t bytes;
    int state;
    char *err;             /* set when the pair failed (size mismatch) */
    struct cpc_request *next;  /* unmatched queue link */
    struct cpc_request *pair;  /* matched partner while copying */
};

/* One member's published arguments of a collective. */
typedef struct coll_slot {
    int kind;
    const void *send;
    const size_t *send_counts, *send_displs;  /* a2a */
    size_t send_bytes;                        /* all-gather */
} coll_slot;

/* One group instance (a ring group, a ulysses group, or the world). */
typedef struct coll_group {
    int n;
    int count;             /* members arrived at the current barrier */
    unsigned long gen;     /* barrier generation */
    coll_slot *slots;      /* n */
    int mismatch;          /* set by the last arriver: a member whose collective kind
                              differs from member 0's, or -1 */
    int inside;            /* members between coll_enter and coll_leave: they may be
                              reading the others' send buffers; after an abort nobody
                              leaves (and frees its buffers) until this is 0 */
} coll_group;

struct cpc_local_world {
    int R, U, P;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double timeout_s;
    bool aborted;
    int abort_rank;
    char *abort_why;
    cpc_request *sends;    /* unmatched sends, in posting order */
    cpc_request *recvs;    /* unmatched recvs, in posting order */
    coll_group *ring;      /* U instances */
    coll_group *uly;       /* R instances */
    coll_group world;
    bool *has_endpoint;    /* P */
    cpc_local_copy_fn copy_fn;  /* NULL: memmove */
    void *copy_ctx;
    char *owner_tag, *owner_label; /* cpc_local_world_set_owner, or NULL */
};

typedef struct endpoint {
    cpc_local_world *w;
    int p, r, u;
    cpc_request *spare;  /* finished requests kept for reuse (this rank's thread only),
                            so that a steady state posts without allocating */
} endpoint;

/* ---- world ------------------------------------------------------------------ */

/* Moves n bytes for rank `me` with the world's copy function (memmove when
 * none is set). */
static cpc_status *world_copy(cpc_local_world *w, int me, void *dst, const void *src, size_t n)
{
    if (!n || dst == src)
        return NULL;
    if (w->copy_fn)
        return w->copy_fn(w->copy_ctx, me, dst, src, n);
    memmove(dst, src, n);
    return NULL;
}

void cpc_local_world_set_copy(cpc_local_world *w, cpc_local_copy_fn fn, void *ctx)
{
    w->copy_fn = fn;
    w->copy_ctx = ctx;
}

static void coll_group_free(coll_group *g)
{
    free(g->slots);
}

static bool coll_group_init(coll_group *g, int n)
{
    g->n = n;
    g->count = 0;
    g->gen = 0;
    g->slots = calloc((size_t)n, sizeof *g->slots);
    return g->slots != NULL;
}

cpc_status *cpc_local_world_create(int ring_degree, int ulysses_degree, cpc_local_world **out)
{
    *out = NULL;
    if (ring_degree < 1 || ulysses_degree < 1 ||
        (int64_t)ring_degree * ulysses_degree > (1 << 20))
        return cpc_error(CPC_E_INTERNAL, "local transport: bad degrees %d x %d", ring_degree,
                         ulysses_degree);
    cpc_local_world *w = calloc(1, sizeof *w);
    if (!w)
        return cpc_error(CPC_E_NOMEM, "local transport: out of memory");
    w->R = ring_degree;
    w->U = ulysses_degree;
    w->P = ring_degree * ulysses_degree;
    w->abort_rank = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->ring = calloc((size_t)w->U, sizeof *w->ring);
    w->uly = calloc((size_t)w->R, sizeof *w->uly);
    w->has_endpoint = calloc((size_t)w->P, sizeof *w->has_endpoint);
    bool ok = w->ring && w->uly && w->has_endpoint && coll_group_init(&w->world, w->P);
    for (int i = 0; ok && i < w->U; i++)
        ok = coll_group_init(&w->ring[i], w->R);
    for (int i = 0; ok && i < w->R; i++)
        ok = coll_group_init(&w->uly[i], w->U);
    if (!ok) {
        cpc_local_world_destroy(w);
        return cpc_error(CPC_E_NOMEM, "local transport: out of memory");
    }
    *out = w;
    return NULL;
}

void cpc_local_world_set_timeout(cpc_local_world *w, double seconds)
{
    if (w)
        w->timeout_s = seconds > 0 ? seconds : 0;
}

static void free_queue(cpc_request *q)
{
    while (q) {
        cpc_request *n = q->next;
        free(q->err);
        free(q);
        q = n;
    }
}

bool cpc_local_world_set_owner(cpc_local_world *w, const char *tag, const char *label)
{
    free(w->owner_tag);
    free(w->owner_label);
    w->owner_tag = tag ? strdup(tag) : NULL;
    w->owner_label = label ? strdup(label) : NULL;
    if ((tag && !w->owner_tag) || (label && !w->owner_label)) {
        free(w->owner_tag);
        free(w->owner_label);
        w->owner_tag = w->owner_label = NULL;
        return false;
    }
    return true;
}

void cpc_local_world_owner(const cpc_local_world *w, const char **tag, const char **label)
{
    if (tag)
        *tag = w->owner_tag;
    if (label)
        *label = w->owner_label;
}

void cpc_local_world_destroy(cpc_local_world *w)
{
    if (!w)
        return;
    free_queue(w->sends);
    free_queue(w->recvs);
    if (w->ring)
        for (int i = 0; i < w->U; i++)
            coll_group_free(&w->ring[i]);
    if (w->uly)
        for (int i = 0; i < w->R; i++)
            coll_group_free(&w->uly[i]);
    coll_group_free(&w->world);
    free(w->ring);
    free(w->uly);
    free(w->has_endpoint);
    free(w->abort_why);
    free(w->owner_tag);
    free(w->owner_label);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static void abort_locked(cpc_local_world *w, int rank, const char *why)
{
    if (!w->aborted) {
        w->aborted = true;
        w->abort_rank = rank;
        w->abort_why = strdup(why ? why : "aborted");
    }
    pthread_cond_broadcast(&w->cv);
}

void cpc_local_world_abort(cpc_local_world *w, int rank, const char *why)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    abort_locked(w, rank, why);
    pthread_mutex_unlock(&w->mu);
}

bool cpc_local_world_aborted(cpc_local_world *w, int *rank, const char **why)
{
    pthread_mutex_lock(&w->mu);
    bool a = w->aborted;
    if (rank)
        *rank = w->abort_rank;
    if (why)
        *why = w->abort_why;
    pthread_mutex_unlock(&w->mu);
    return a;
}

static cpc_status *aborted_status(cpc_local_world *w, int me, const char *what)
{
    if (w->abort_rank >= 0)
        return cpc_error(CPC_E_RUNTIME, "local transport: rank %d: %s: job aborted by rank %d (%s)",
                         me, what, w->abort_rank, w->abort_why ? w->abort_why : "");
    return cpc_error(CPC_E_RUNTIME, "local transport: rank %d: %s: job aborted (%s)", me, what,
                     w->abort_why ? w->abort_why : "");
}

/* Deadline for the current wait (monotonic clock). */
static struct timespec deadline_of(const cpc_local_world *w)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = w->timeout_s;
    time_t sec = (time_t)t;
    long ns = (long)((t - (double)sec) * 1e9);
    ts.tv_sec += sec;
    ts.tv_nsec += ns;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Waits on the world condition; returns false when the timeout expired (the
 * world is then aborted with `what`). */
static bool cond_wait_locked(cpc_local_world *w, const struct timespec *dl, int me,
                             const char *what)
{
    if (w->timeout_s <= 0) {
        pthread_cond_wait(&w->cv, &w->mu);
        return true;
    }
    int rc = pthread_cond_timedwait(&w->cv, &w->mu, dl);
    if (rc == ETIMEDOUT) {
        char msg[512];
        /* "stalled", as the MPI transport and cpc/rank.h (timeout_s) say it */
        snprintf(msg, sizeof msg, "stalled: rank %d waited %.1f s for %s (the stall limit: "
                 "timeout_s, cprun --timeout)", me, w->timeout_s, what);
        abort_locked(w, me, msg);
        return false;
    }
    return true;
}

static bool is_aborted(cpc_local_world *w)
{
    pthread_mutex_lock(&w->mu);
    bool a = w->aborted;
    pthread_mutex_unlock(&w->mu);
    return a;
}

/* ---- endpoint helpers ----------------------------------------------------------- */

static int ep_group_size(const endpoint *e, cpc_group g)
{
    switch (g) {
    case CPC_GROUP_RING: return e->w->R;
    case CPC_GROUP_ULYSSES: return e->w->U;
    case CPC_GROUP_WORLD: return e->w->P;
    default: return 0;
    }
}

static int ep_group_rank(const endpoint *e, cpc_group g)
{
    switch (g) {
    case CPC_GROUP_RING: return e->r;
    case CPC_GROUP_ULYSSES: return e->u;
    case CPC_GROUP_WORLD: return e->p;
    default: return -1;
    }
}

/* Flat rank of member `idx` of this endpoint's group g. */
static int ep_member(const endpoint *e, cpc_group g, int idx)
{
    switch (g) {
    case CPC_GROUP_RING: return idx * e->w->U + e->u;
    case CPC_GROUP_ULYSSES: return e->r * e->w->U + idx;
    default: return idx;
    }
}

static coll_group *ep_coll(const endpoint *e, cpc_group g)
{
    switch (g) {
    case CPC_GROUP_RING: return &e->w->ring[e->u];
    case CPC_GROUP_ULYSSES: return &e->w->uly[e->r];
    default: return &e->w->world;
    }
}

static int t_group_rank(cpc_transport *t, cpc_group g)
{
    return ep_group_rank(t->ctx, g);
}

static int t_group_size(cpc_transport *t, cpc_group g)
{
    return ep_group_size(t->ctx, g);
}

static cpc_status *check_group(const endpoint *e, cpc_group g, const char *op)
{
    if (g != CPC_GROUP_RING && g != CPC_GROUP_ULYSSES && g != CPC_GROUP_WORLD)
        return cpc_error(CPC_E_INTERNAL, "local transport: rank %d: %s: bad group %d", e->p,
                         op, (int)g);
    return NULL;
}

/* ---- point to point --------------------------------------------------------------- */

static void describe_req(const cpc_request *q, char *buf, size_t n)
{
    snprintf(buf, n, "%s %s %s peer %d (rank %d) tag %d (%zu bytes)",
             q->is_send ? "send to" : "recv from", cpc_group_name(q->g), "group", q->peer_idx,
             q->is_send ? q->dst : q->src, q->tag, q->bytes);
}

/* Unlinks and returns the first unmatched request in `*list` that pairs with
 * `q` (same group, sender, receiver, tag), or NULL. */
static cpc_request *take_match(cpc_request **list, const cpc_request *q)
{
    for (cpc_request **pp = list; *pp; pp = &(*pp)->next) {
        cpc_request *c = *pp;
        if (c->g == q->g && c->src == q->src && c->dst == q->dst && c->tag == q->tag) {
            *pp = c->next;
            c->next = NULL;
            return c;
        }
    }
    return NULL;
}

static void append(cpc_request **list, cpc_request *q)
{
    while (*list)
        list = &(*list)->next;
    *list = q;
}

static bool unlink_req(cpc_request **list, cpc_request *q)
{
    for (cpc_request **pp = list; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            q->next = NULL;
            return true;
        }
    return false;
}

static cpc_status *post(cpc_transport *t, bool is_send, cpc_group g, int peer, void *buf,
                        size_t bytes, int tag, cpc_request **req)
{
    endpoint *e = t->ctx;
    cpc_local_world *w = e->w;
    *req = NULL;
    const char *op = is_send ? "isend" : "irecv";
    cpc_status *st = check_group(e, g, op);
    if (st)
        return st;
    int n = ep_group_size(e, g);
    if (peer < 0 || peer >= n)
        return cpc_error(CPC_E_INTERNAL, "local transport: rank %d: %s: peer %d out of range of %s group (size %d)",
                         e->p, op, peer, cpc_group_name(g), n);
    if (tag < 0)
        return cpc_error(CPC_E_INTERNAL, "local transport: rank %d: %s: negative tag %d", e->p,
                         op, tag);
    cpc_request *q = e->spare;
    if (q) {
        e->spare = q->next;
        memset(q, 0, sizeof *q);
    } else if (!(q = calloc(1, sizeof *q))) {
        return cpc_error(CPC_E_NOMEM, "local transport: out of memory");
    }
    int other = ep_member(e, g, peer);
    q->is_send = is_send;
    q->g = g;
    q->src = is_send ? e->p : other;
    q->dst = is_send ? other : e->p;
    q->peer_idx = peer;
    q->tag = tag;
    q->buf = buf;
    q->bytes = bytes;
    q->state = REQ_POSTED;

    pthread_mutex_lock(&w->mu);
    if (w->aborted) {
        st = aborted_status(w, e->p, op);
        pthread_mutex_unlock(&w->mu);
        q->next = e->spare;
        e->spare = q;
        return st;
    }
    cpc_request *m = take_match(is_send ? &w->recvs : &w->sends, q);
    if (!m) {
        append(is_send ? &w->sends : &w->recvs, q);
        pthread_mutex_unlock(&w->mu);
        *req = q;
        return NULL;
    }
    cpc_request *s = is_send ? q : m, *r = is_send ? m : q;
    if (s->bytes != r->bytes) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "size mismatch on %s group tag %d: rank %d sends %zu bytes, rank %d expects %zu",
                 cpc_group_name(g), tag, s->src, s->bytes, r->dst, r->bytes);
        s->err = strdup(msg);
        r->err = strdup(msg);
        s->state = r->state = REQ_DONE;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        *req = q;
        return NULL;
    }
    s->state = r->state = REQ_COPYING;
    pthread_mutex_unlock(&w->mu);
    cpc_status *cst = world_copy(w, e->p, r->buf, s->buf, s->bytes);
    pthread_mutex_lock(&w->mu);
    if (cst) {
        char msg[384];
        snprintf(msg, sizeof msg, "copy of %zu bytes from rank %d to rank %d on %s group: %s",
                 s->bytes, s->src, r->dst, cpc_group_name(g), cst->message);
        cpc_status_free(cst);
        s->err = strdup(msg);
        r->err = strdup(msg);
    }
    s->state = r->state = REQ_DONE;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    *req = q;
    return NULL;
}

static cpc_status *t_isend(cpc_transport *t, cpc_group g, int peer, const void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    return post(t, true, g, peer, (void *)buf, bytes, tag, req);
}

static cpc_status *t_irecv(cpc_transport *t, cpc_group g, int peer, void *buf, size_t bytes,
                           int tag, cpc_request **req)
{
    return post(t, false, g, peer, buf, bytes, tag, req);
}

static cpc_status *t_wait(cpc_transport *t, cpc_request *q)
{
    endpoint *e = t->ctx;
    cpc_local_world *w = e->w;
    if (!q)
        return NULL;
    cpc_status *st = NULL;
    char what[200];
    describe_req(q, what, sizeof what);
    pthread_mutex_lock(&w->mu);
    struct timespec dl = deadline_of(w);
    while (q->state != REQ_DONE) {
        if (w->aborted && q->state == REQ_POSTED)
            break;
        if (!cond_wait_locked(w, &dl, e->p, what) && q->state == REQ_POSTED)
            break;
    }
    if (q->state == REQ_POSTED) {
        unlink_req(q->is_send ? &w->sends : &w->recvs, q);
        st = aborted_status(w, e->p, what);
    } else if (q->err) {
        st = cpc_error(CPC_E_RUNTIME, "local transport: rank %d: %s: %s", e->p, what, q->err);
    }
    pthread_mutex_unlock(&w->mu);
    free(q->err);
    q->err = NULL;
    q->next = e->spare;
    e->spare = q;
    return st;
}

/* ---- collectives --------------------------------------------------------------------- */

/* Generation-counted barrier of group instance c, called with the lock held.
 * The last member to arrive compares the collective kinds in the slots (all
 * from this generation at that moment) and records a mismatch; every member
 * reads it under the lock before anyone can start the next generation. */
static cpc_status *barrier_locked(cpc_local_world *w, coll_group *c, int me, const char *what,
                                  int *mismatch)
{
    if (w->aborted)
        return aborted_status(w, me, what);
    unsigned long gen = c->gen;
    if (++c->count == c->n) {
        c->mismatch = -1;
        for (int j = 1; j < c->n; j++)
            if (c->slots[j].kind != c->slots[0].kind) {
                c->mismatch = j;
                break;
            }
        c->count = 0;
        c->gen++;
        if (mismatch)
            *mismatch = c->mismatch;
        pthread_cond_broadcast(&w->cv);
        return NULL;
    }
    struct timespec dl = deadline_of(w);
    while (gen == c->gen) {
        if (w->aborted)
            return aborted_status(w, me, what);
        cond_wait_locked(w, &dl, me, what);
    }
    if (mismatch)
        *mismatch = c->mismatch;
    return NULL;
}

/* This member reads no peer's buffers any more: one less inside (coll_leave's
 * abort path waits for none).  w->mu held. */
static void out_locked(cpc_local_world *w, coll_group *c)
{
    c->inside--;
    pthread_cond_broadcast(&w->cv);
}

/* Publishes this member's slot and waits for every member: phase 1. */
static cpc_status *coll_enter(endpoint *e, cpc_group g, const coll_slot *slot, coll_group **cg,
                              const char *what)
{
    cpc_local_world *w = e->w;
    coll_group *c = ep_coll(e, g);
    *cg = c;
    int me = ep_group_rank(e, g);
    int mm = -1, k0 = 0, kj = 0;
    pthread_mutex_lock(&w->mu);
    c->slots[me] = *slot;
    c->inside++; /* before the barrier: counted before anyone can read our slot */
    cpc_status *st = barrier_locked(w, c, e->p, what, &mm);
    if (!st && mm >= 0) {
        k0 = c->slots[0].kind;
        kj = c->slots[mm].kind;
    }
    if (st || mm >= 0) /* not reading anybody's buffers: out again */
        out_locked(w, c);
    pthread_mutex_unlock(&w->mu);
    if (st)
        return st;
    /* Every member must be in the same collective. */
    if (mm >= 0)
        return cpc_error(CPC_E_RUNTIME,
                         "local transport: rank %d: %s group: members disagree: rank %d called %s while rank %d called %s",
                         e->p, cpc_group_name(g), ep_member(e, g, 0), coll_name(k0),
                         ep_member(e, g, mm), coll_name(kj));
    return NULL;
}

/* Phase 2: waits until every member has finished reading the send buffers. */
static cpc_status *coll_leave(endpoint *e, coll_group *c, cpc_status *st, const char *what,
                              bool inside)
{
    cpc_local_world *w = e->w;
    pthread_mutex_lock(&w->mu);
    if (inside) /* coll_enter succeeded: this member may have been copying */
        out_locked(w, c);
    cpc_status *st2 = barrier_locked(w, c, e->p, what, NULL);
    /* After an abort the barrier lets everyone go at once: still wait until
     * no member is reading send buffers (copies are finite; members stuck at
     * an entry barrier leave it on the abort), so nobody frees a buffer that
     * a peer is copying from. */
    while (w->aborted && c->inside > 0)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    if (st) {
        cpc_status_free(st2);
        return st;
    }
    return st2;
}

static cpc_status *t_all_to_all_v(cpc_transport *t, cpc_group g, const void *send,
                                  const size_t *send_counts, const size_t *send_displs,
                                  void *recv, const size_t *recv_counts,
                                  const size_t *recv_displs)
{
    endpoint *e = t->ctx;
    cpc_status *st = check_group(e, g, "all_to_all_v");
    if (st)
        return st;
    char what[96];
    snprintf(what, sizeof what, "all_to_all_v on %s group", cpc_group_name(g));
    coll_slot slot = {.kind = COLL_A2A, .send = send, .send_counts = send_counts,
                      .send_displs = send_displs};
    coll_group *c;
    st = coll_enter(e, g, &slot, &c, what);
    if (st && is_aborted(e->w))
        return st;
    bool inside = !st;
    if (!st) {
        int me = ep_group_rank(e, g);
        for (int j = 0; j < c->n && !st; j++) {
            const coll_slot *s = &c->slots[j];
            size_t n = s->send_counts[me];
            if (n != recv_counts[j]) {
                st = cpc_error(CPC_E_RUNTIME,
                               "local transport: rank %d: %s: rank %d sends %zu bytes, this rank expects %zu",
                               e->p, what, ep_member(e, g, j), n, recv_counts[j]);
                break;
            }
            st = world_copy(e->w, e->p, (char *)recv + recv_displs[j],
                            (const char *)s->send + s->send_displs[me], n);
            if (st)
                cpc_status_prefix(st, "local transport: rank %d: %s: part from rank %d", e->p,
                                  what, ep_member(e, g, j));
        }
    }
    return coll_leave(e, c, st, what, inside);
}

static cpc_status *t_all_gather_v(cpc_transport *t, cpc_group g, const void *send,
                                  size_t send_bytes, void *recv, const size_t *counts,
                                  const size_t *displs)
{
    endpoint *e = t->ctx;
    cpc_status *st = check_group(e, g, "all_gather_v");
    if (st)
        return st;
    char what[96];
    snprintf(what, sizeof what, "all_gather_v on %s group", cpc_group_name(g));
    coll_slot slot = {.kind = COLL_AG, .send = send, .send_bytes = send_bytes};
    coll_group *c;
    st = coll_enter(e, g, &slot, &c, what);
    if (st && is_aborted(e->w))
        return st;
    bool inside = !st;
    if (!st) {
        for (int j = 0; j < c->n && !st; j++) {
            const coll_slot *s = &c->slots[j];
            if (s->send_bytes != counts[j]) {
                st = cpc_error(CPC_E_RUNTIME,
                               "local transport: rank %d: %s: rank %d sends %zu bytes, this rank expects %zu",
                               e->p, what, ep_member(e, g, j), s->send_bytes, counts[j]);
                break;
            }
            st = world_copy(e->w, e->p, (char *)recv + displs[j], s->send, s->send_bytes);
            if (st)
                cpc_status_prefix(st, "local transport: rank %d: %s: part from rank %d", e->p,
                                  what, ep_member(e, g, j));
        }
    }
    return coll_leave(e, c, st, what, inside);
}

static cpc_status *t_barrier(cpc_transport *t, cpc_group g)
{
    endpoint *e = t->ctx;
    cpc_status *st = check_group(e, g, "barrier");
    if (st)
        return st;
    char what[64];
    snprintf(what, sizeof what, "barrier on %s group", cpc_group_name(g));
    coll_slot slot = {.kind = COLL_BARRIER};
    coll_group *c;
    st = coll_enter(e, g, &slot, &c, what);
    if (st && is_aborted(e->w))
        return st;
    /* A barrier needs no second phase unless the kinds disagreed; it reads
     * no buffer, so it leaves the members counted inside at once (a count
     * left behind would hold every later collective's leave after an abort
     * forever). */
    if (st)
        return coll_leave(e, c, st, what, false);
    pthread_mutex_lock(&e->w->mu);
    out_locked(e->w, c);
    pthread_mutex_unlock(&e->w->mu);
    return NULL;
}

static void t_abort(cpc_transport *t, const char *why)
{
    endpoint *e = t->ctx;
    cpc_local_world_abort(e->w, e->p, why);
}

static void t_destroy(cpc_transport *t)
{
    if (!t)
        return;
    endpoint *e = t->ctx;
    if (e) {
        pthread_mutex_lock(&e->w->mu);
        e->w->has_endpoint[e->p] = false;
        pthread_mutex_unlock(&e->w->mu);
        while (e->spare) {
            cpc_request *n = e->spare->next;
            free(e->spare);
            e->spare = n;
        }
        free(e);
    }
    free(t);
}

static const cpc_transport_vtable local_vt = {
    .name = "local",
    .group_rank = t_group_rank,
    .group_size = t_group_size,
    .isend = t_isend,
    .irecv = t_irecv,
    .wait = t_wait,
    .all_to_all_v = t_all_to_all_v,
    .all_gather_v = t_all_gather_v,
    .barrier = t_barrier,
    .abort = t_abort,
    .destroy = t_destroy,
};

cpc_status *cpc_local_endpoint_create(cpc_local_world *w, int rank, cpc_transport **out)
{
    *out = NULL;
    if (!w || rank < 0 || rank >= w->P)
        return cpc_error(CPC_E_INTERNAL, "local transport: rank %d out of range", rank);
    cpc_transport *t = calloc(1, sizeof *t);
    endpoint *e = calloc(1, sizeof *e);
    if (!t || !e) {
        free(t);
        free(e);
        return cpc_error(CPC_E_NOMEM, "local transport: out of memory");
    }
    pthread_mutex_lock(&w->mu);
    bool dup = w->has_endpoint[rank];
    if (!dup)
        w->has_endpoint[rank] = true;
    pthread_mutex_unlock(&w->mu);
    if (dup) {
        free(t);
        free(e);
        return cpc_error(CPC_E_INTERNAL, "local transport: rank %d already has an endpoint", rank);
    }
    e->w = w;
    e->p = rank;
    e->r = rank / w->U;
    e->u = rank % w->U;
    t->vt = &local_vt;
    t->ctx = e;
    *out = t;
    return NULL;
}
