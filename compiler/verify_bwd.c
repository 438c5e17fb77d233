/* verify_bwd.c - the backward prover: the shared step (verify_common.h) on this file's domain,
 * symmetric (any world size) or enumerated (every rank); see verify_bwd.h. */
#include "verify_bwd.h"
#include "verify_common.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "verify.h"

#define VB_MAX_P 256
#define VB_WORK_MAX ((int64_t)1 << 27) /* contribution runs added, all ranks together */

typedef struct xop xop;
struct xop {
    const cpc_op *op;
    const vc_node *nd; /* its node (path, for messages: vc_op_desc) */
    int64_t peer, block, s;
    int64_t bs;  /* induction (verify_bwd.h LOOPS BY INDUCTION): the block's slope in s (mod R) */
    int mk;      /* 0: an op; else a marker of the induction (MK_*: op is the loop), every simulated rank
                    stops there until all have reached it */
    int64_t jn;  /* MK_JUMP: the steps the symbolic step stands for beyond itself */
};

enum { MK_SNAP = 1, MK_SLOPE, MK_JUMP };

typedef struct rank_ops {
    xop *v;
    int n, cap;
} rank_ops;


/* The gradient contributions an accumulator holds: a multiset of (query
 * block, key unit, query head) triples, as runs {(q0 + i*dq, k0 + i*dk) :
 * 0 <= i < len} (q mod R, k mod NK) x heads [h0, h0 + hn).  A ring's
 * accumulator grows by one block a step, so its runs stay few whatever R
 * (what lets the symmetric domain prove 65536 ranks); duplicates are runs
 * that overlap, found when the OUTPUT is checked. */
typedef struct run {
    int32_t q0, k0, len, h0, hn;
    int32_t dq, dk;
    int32_t qb, kb, lb; /* the symbolic step (induction): slopes of q0, k0 (mod R) and len in s; 0 otherwise */
} run;

typedef struct cset {
    run *v;
    int n, cap;
} cset;

typedef struct slot {
    union {
        vc_val h; /* the fields every domain shares (verify_common.h): written (init_acc'd, delta
                     written, received, input) and src (provenance: program.h cpc_content) */
        struct {
            VC_VAL_FIELDS;
        };
    };
    int tag;
    int32_t tb;     /* the symbolic step (induction): the tag's slope in s (mod R); 0 otherwise */
    bool grad;      /* a D* role: `cnt` is meaningful */
    bool fwd;       /* an attention result recomputed here (attn, merge): `cnt` holds its (query block,
                       key unit, query head) pairs; not sent or gathered before it is proven complete
                       (final), never copied */
    bool r0;        /* twin: content that differs on ring rank 0 (made by or from a `when r==0` op) */
    const struct xop *wop; /* the op instance that last wrote it (NULL: none, or an INPUT) */
    int8_t role, tk, hd; /* the layout of the buffer the slot belongs to (a scratch value of the step: of
                            the buffer it is made for; role CPC_ROLE__COUNT: any) */
    cset cnt;
} slot;

/* One posted send or recv: the shared layer's request (verify_common.h vc_rq:
 * posted by vc_post, met by vc_match, completed by the step's wait, checked at
 * the end by vc_finish), matched here in FIFO order per (sender, receiver,
 * GROUP, tag) as MPI and the local transport match them; a send's snapshots
 * are its buffers' contents at the post, a recv's what arrives once matched. */
typedef struct req {
    union {
        vc_rq h;
        struct {
            VC_RQ_FIELDS; /* peer: the partner's flat rank; -1 for a rotated ring message */
        };
    };
    const xop *x;          /* the op instance that posted it */
    int p;                 /* the poster (simulated rank) */
    int to;                /* the partner: its flat rank, or rotated (verify_bwd.h SYMMETRIC) the ring offset
                              (a send's to its receiver; a recv's from its sender) */
    int32_t blk, blkb;     /* recv: the block it declares (x->block) and its slope in s (induction) */
    slot snap[CPC_OP_MAX_BUFS];
} req;

#define RQ(V, id) ((req *)VC_POOL_AT(&(V)->reqs, (id)))

typedef struct rank_reqs {
    vc_open open;          /* posted, not yet completed by a wait */
    int sh, st;            /* sends to this rank no recv matched yet: head, tail (-1: empty) */
    int rh, rt;            /* recvs posted by this rank no send matched yet */
} rank_reqs;

typedef struct vb {
    const cpc_program *prog;
    const vc_node *nodes;          /* the program's op tree (vc_nodes: paths for messages) */
    int P, R, U, nb, nh;           /* nh: query-head units (H with U > 1, else 1) */
    bool sym;                      /* the symmetric domain: ranks (0, u) simulated, ring by rotation */
    bool twin;                     /* sym with `when r==0` ops (R > 1): ranks U..2U-1 stand for ring ranks
                                      r != 0 (rank (0, u) with the guards false), 0..U-1 for ring rank 0 */
    const char *asym;              /* sym: why the proof does not apply after all (not decided) */
    int nsim;                      /* simulated ranks: P, or U (sym), or 2U (twin) */
    int64_t work;                  /* units spent (verify_bwd.h THE BOUND) */
    bool over;                     /* a run list outgrew VB_MAX_RUNS (sym: not decided) */
    bool bound_hit;                /* the work passed VB_WORK_MAX: refused */
    int NK;                        /* key units: ring blocks, or 1 (cross-attention: all of K/V); with
                                      replicated segments R + 1 (unit R: the replicated keys) */
    int NQ;                        /* query blocks: R, or R + 1 with replicated segments (block R: the
                                      replicated rows, held whole by every rank) */
    int32_t stamps;                /* identities of recomputed attention outputs / accumulator pairs */
    bool usym;                     /* sym: one ulysses member simulated, the others its rotations in u
                                      (verify_bwd.h ROTATIONS OF U) */
    int Us;                        /* ulysses members simulated per group: U, 1 (usym) or the classes' count */
    const struct uclasses *uc;     /* usym with uneven head parts: the member classes (verify_bwd.h
                                      CLASSES OF U); simulated rank i is member uc->mem[i] */
    const char *ubreak;            /* uc: the classes do not stand for their members after all
                                      (then every member is simulated) */
    bool ind_on;                   /* sym: loops by induction (verify_bwd.h LOOPS BY INDUCTION) */
    bool ind;                      /* in a symbolic step: values carry slopes in s, comparisons must hold
                                      as identities in s */
    const char *undec;             /* the induction could not decide (then the loops are unrolled) */
    int64_t jumps;                 /* phases proven by induction */
    struct vsnap *snap;            /* the state at the last marker (induction) */
    slot tmpv[CPC_OP_MAX_BUFS];    /* the step's scratch values (vc_domain tmp) */
    char ob[256];                  /* the domain's writer, in words (one message at a time) */
    rank_ops *ro;
    slot *slots;    /* [P * nb] slot storage */
    int *map;       /* [P * nb]: buffer -> slot index (swap permutes) */
    int *pc;
    int32_t *nsend, *rpend; /* [P * nb]: per buffer, the sends in flight reading it and the recv in flight
                               writing it (-1): the shared message layer's (vc_domain) */
    rank_reqs *rr; /* [P] */
    vc_pool reqs;  /* every simulated rank's requests (of req: RQ) */
    cpc_status *err;
} vb;

static cpc_status *collect(const struct vb *V, rank_ops *r, const cpc_exec_op *x)
{
    if (r->n == r->cap) {
        int nc = r->cap ? 2 * r->cap : 64;
        xop *v = realloc(r->v, (size_t)nc * sizeof *v);
        if (!v)
            return &cpc_status_oom;
        r->v = v;
        r->cap = nc;
    }
    r->v[r->n++] = (xop){x->op, vc_node_of(V->nodes, V->prog->n_ops, x->op), x->peer, x->block,
                         x->depth ? x->c.s : -1, 0, 0, 0};
    return NULL;
}

/* A CP051 on simulated rank p (-1: the program as a whole) at op instance x
 * (NULL: the end of the program, or none when p < 0): vc_fault's one format. */
static cpc_status *vfail_(const struct vb *V, int p, const xop *x, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Every caller has the prover's state as V. */
#define vfail(...) vfail_(V, __VA_ARGS__)

/* A CP051 of the program as a whole, at span (WHERE: NULL, or the op). */
static cpc_status *bfail(cpc_span span, const char *where, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cpc_status *bfail(cpc_span span, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = vc_fault(span, true, -1, 1, where, fmt, ap);
    va_end(ap);
    return st;
}

static int32_t md32(int64_t x, int64_t m);
static int cp(const vb *V, int p);
static int sim_flat(const vb *V, int p);

/* With one member for all or the classes of U, simulated rank p is reported
 * as the rank it walks as (sim_flat). */
static cpc_status *vfail_(const vb *V, int p, const xop *x, const char *fmt, ...)
{
    char where[320];
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = vc_fault(x ? x->op->span : CPC_NO_SPAN, true, p >= 0 && V->sym && V->Us != V->U ? sim_flat(V, p) : p, V->U,
                              x ? vc_op_desc(x->nd, x->s, x->s + 1, where, sizeof where) : NULL, fmt, ap);
    va_end(ap);
    return st;
}

/* CLASSES OF U (verify_bwd.h): the ulysses members in at most two regions
 * of equal head counts n (tensor_split: the first H % U members hold one
 * head more), member u0 + t of a region starting at head a0 + t n.  Its
 * class is rc[t % T] (T = g / gcd(n, g), 1 with one K/V head: the first
 * head modulo the GQA group g repeats with period T).  A class of shift
 * (in[i] false) holds the members with one residue: member v is its
 * representative mem[i] with every head moved by a_v - a_rep (a multiple
 * of g); the class of a region's members whose part lies in one GQA group
 * (in[i]) holds every such member: member v is the representative with the
 * GQA groups moved by a_v/g - a_rep/g and each rotated within by
 * (a_v - a_rep) mod g.  Both keep the groups and move the shard index by
 * v - rep. */
#define VB_MAX_CLASSES 64
typedef struct uregion {
    int u0, cnt, n, a0, T; /* members [u0, u0 + cnt), n heads each from head a0; residues mod T */
    int *rc;               /* [min(T, cnt)]: member u0 + t is of class rc[t % T] */
    bool one;              /* every member of the region in one class */
} uregion;
typedef struct uclasses {
    int nreg, ncls, g;
    uregion reg[2];
    int mem[VB_MAX_CLASSES], reg_of[VB_MAX_CLASSES];
    bool in[VB_MAX_CLASSES]; /* the class of the members whose part lies in one GQA group */
} uclasses;

/* The flat rank whose coordinates simulated rank p's state is written in:
 * p itself, or in the symmetric domain rank (0, u) (every simulated rank is
 * seen rotated to ring position 0; twin: also the ranks r != 0), or with the
 * classes of U the member simulated rank p stands for. */
static int cp(const vb *V, int p)
{
    if (!V->sym)
        return p;
    return V->uc ? V->uc->mem[p % V->Us] : V->usym ? 0 : p % V->U;
}

/* The flat rank simulated rank p walks as: itself, or in the symmetric
 * domain (0, u) for the member it stands for, (1, u) for its twin (the
 * simulated ranks are k * Us + j: k = 1 the twins, j the member or class). */
static int sim_flat(const vb *V, int p)
{
    return V->sym ? (p / V->Us) * V->U + cp(V, p) : p;
}

/* The op table's tag rule for out[i] of x on simulated rank p. */
static int out_tag(const vb *V, int p, const xop *x, int i, int in0, int ini, int old)
{
    cpc_coords c = cpc_program_coords(V->prog, cp(V, p));
    c.s = x->s > 0 ? x->s : 0;
    return cpc_op_out_tag(V->prog, x->op, i, &c, x->block, in0, ini, old);
}

/* out_tag with slopes (the symbolic step): the rule applied on the next step
 * too (the block and the input tags each moved by their slope); *tb = the
 * difference.  The rule picks one of its inputs or a coordinate, so the
 * result is affine in s as they are. */
static int out_tag_s(vb *V, int p, const xop *x, int i, const slot *in0, const slot *ini, const slot *old, int32_t *tb)
{
    int t0 = out_tag(V, p, x, i, in0 ? in0->tag : CPC_TAG_NONE, ini ? ini->tag : CPC_TAG_NONE, old->tag);
    if (!V->ind) {
        *tb = 0;
        return t0;
    }
#define NX(sl) (!(sl) || (sl)->tag == CPC_TAG_NONE || !(sl)->tb ? ((sl) ? (sl)->tag : CPC_TAG_NONE) \
                                                                 : md32((int64_t)(sl)->tag + (sl)->tb, V->R))
    xop y = *x;
    y.s = x->s + 1;
    if (x->op->block)
        y.block = md32(x->block + x->bs, V->R);
    int t1 = out_tag(V, p, &y, i, NX(in0), NX(ini), NX(old)); /* before *tb is written (it may be old's) */
#undef NX
    *tb = 0;
    if (t0 == CPC_TAG_NONE || t1 == CPC_TAG_NONE) {
        if (t0 != t1 && !V->undec)
            V->undec = "a content tag is set on one step and not on the next";
    } else
        *tb = md32((int64_t)t1 - t0, V->R);
    return t0;
}

static bool is_grad(cpc_buf_role r)
{
    return r == CPC_ROLE_DQ || r == CPC_ROLE_DK || r == CPC_ROLE_DV;
}

static bool is_kvr(cpc_buf_role r)
{
    return r == CPC_ROLE_K || r == CPC_ROLE_V || r == CPC_ROLE_DK || r == CPC_ROLE_DV;
}

static slot *S(vb *V, int p, int b)
{
    return &V->slots[V->map[p * V->nb + b]];
}

static cpc_buf_role role(const vb *V, int b)
{
    return V->prog->buffers[b].role;
}

static const char *bn(const vb *V, int b)
{
    return V->prog->buffers[b].name;
}

static const cpc_buffer *BF(const vb *V, int b)
{
    return &V->prog->buffers[b];
}


/* Flat rank of member `peer` of rank p's group g. */
static int flat_of(const vb *V, int p, cpc_group g, int64_t peer)
{
    int r = p / V->U, u = p % V->U;
    if (g == CPC_GROUP_RING)
        return (int)peer * V->U + u;
    if (g == CPC_GROUP_ULYSSES)
        return r * V->U + (int)peer;
    return (int)peer;
}



/* ---- contribution sets (cset) ------------------------------------------------ */

/* The failure of an operation that returned false: the prover's bound
 * (CP051), or out of memory. */
static cpc_status *cs_err(const vb *V)
{
    if (V->bound_hit)
        return bfail(CPC_NO_SPAN, NULL, "proving it takes more than %lld units of work (the prover's bound, "
                                        "verify_bwd.h)",
                     (long long)VB_WORK_MAX);
    return &cpc_status_oom;
}

static int32_t md32(int64_t x, int64_t m)
{
    return (int32_t)vc_mod(x, m); /* m: R, NQ, NK or H, all int */
}

/* x - y as the representative of smallest magnitude mod m. */
static int32_t diff_mod(int64_t x, int64_t y, int64_t m)
{
    int32_t d = md32(x - y, m);
    return d > m / 2 ? (int32_t)(d - m) : d;
}

/* The symbolic step (induction): two values found equal on its step s0 are
 * equal on every step it stands for only if their slopes in s are equal too;
 * else it cannot decide (V->undec: the loops are unrolled instead). */
static void sym_same(vb *V, int64_t ab, int64_t bb)
{
    if (V->ind && md32(ab - bb, V->R) != 0 && !V->undec)
        V->undec = "two contents equal on one step differ on the next";
}

/* Query block / key unit arithmetic: ring indices mod R (key units mod 1
 * for cross-attention); the replicated rows' index R (NQ or NK = R + 1)
 * is fixed (a run through it has step 0).  ix(V, x0, t, d, nmod) is
 * element t of a run starting at x0 with step d; nmod is NQ or NK. */
static int32_t ix_mod(const vb *V, int nmod)
{
    return nmod > V->R ? V->R : nmod;
}

static bool ix_rep(const vb *V, int32_t x0, int nmod)
{
    return nmod > V->R && x0 == V->R;
}

static int32_t ix(const vb *V, int32_t x0, int64_t t, int32_t d, int nmod)
{
    return ix_rep(V, x0, nmod) ? x0 : md32((int64_t)x0 + t * d, ix_mod(V, nmod));
}

static void cs_clear(cset *c)
{
    c->n = 0;
}

static void cs_free(cset *c)
{
    free(c->v);
    c->v = NULL;
    c->n = c->cap = 0;
}

/* Runs x and y of the same blocks with adjacent head ranges: y takes both
 * ranges.  Returns true when joined. */
static bool join_heads(run *y, const run *x)
{
    if (y->h0 + y->hn == x->h0) {
        y->hn += x->hn;
        return true;
    }
    if (x->h0 + x->hn == y->h0) {
        y->h0 = x->h0;
        y->hn += x->hn;
        return true;
    }
    return false;
}

/* Joins run x onto run y when one continues the other with one step
 * (heads equal).  Returns true when joined (y updated). */
static bool cs_join(const vb *V, run *y, const run *x)
{
    /* the same blocks, adjacent heads: one run with both head ranges */
    if (y->q0 == x->q0 && y->k0 == x->k0 && y->len == x->len &&
        (y->len == 1 || (y->dq == x->dq && y->dk == x->dk))) {
        if (join_heads(y, x))
            return true;
    }
    if (y->h0 != x->h0 || y->hn != x->hn || ix_rep(V, y->q0, V->NQ) != ix_rep(V, x->q0, V->NQ) ||
        ix_rep(V, y->k0, V->NK) != ix_rep(V, x->k0, V->NK))
        return false;
    int32_t dq, dk;
    if (y->len >= 2 && x->len >= 2) {
        if (y->dq != x->dq || y->dk != x->dk)
            return false;
        dq = y->dq;
        dk = y->dk;
    } else if (y->len >= 2) {
        dq = y->dq;
        dk = y->dk;
    } else if (x->len >= 2) {
        dq = x->dq;
        dk = x->dk;
    } else {
        dq = ix_rep(V, x->q0, V->NQ) ? 0 : diff_mod(x->q0, y->q0, ix_mod(V, V->NQ));
        dk = ix_rep(V, x->k0, V->NK) ? 0 : diff_mod(x->k0, y->k0, ix_mod(V, V->NK));
        if ((dq == 0 && dk == 0) || dq < -2 || dq > 2 || dk < -2 || dk > 2)
            return false;
    }
    /* y then x */
    if (ix(V, y->q0, y->len, dq, V->NQ) == x->q0 && ix(V, y->k0, y->len, dk, V->NK) == x->k0) {
        y->len += x->len;
        y->dq = dq;
        y->dk = dk;
        return true;
    }
    /* x then y */
    if (ix(V, x->q0, x->len, dq, V->NQ) == y->q0 && ix(V, x->k0, x->len, dk, V->NK) == y->k0) {
        y->q0 = x->q0;
        y->k0 = x->k0;
        y->len += x->len;
        y->dq = dq;
        y->dk = dk;
        return true;
    }
    return false;
}

/* The symbolic step's join (induction): run x onto run y only where the
 * result is one run for every step s the symbolic step stands for (s >= its
 * first, s0): equalities of ring indices as identities in s (values and
 * slopes), lengths growing (slope >= 0, so `len >= 2` holds from s0 on).
 * Not joining is always right (the same multiset, one run more). */
static bool cs_join_sym(const vb *V, run *y, const run *x)
{
    const int64_t R = V->R;
    if (y->q0 == x->q0 && y->k0 == x->k0 && y->len == x->len && y->qb == x->qb && y->kb == x->kb &&
        y->lb == x->lb && y->dq == x->dq && y->dk == x->dk) {
        if (join_heads(y, x))
            return true;
    }
    /* a fixed index (the replicated rows' R, the one key unit of cross-attention) is the same
     * on every element and every step: equal in both runs, step 0, slope 0 */
    bool qf = ix_rep(V, y->q0, V->NQ), kf = V->NK == 1 || ix_rep(V, y->k0, V->NK);
    if (y->h0 != x->h0 || y->hn != x->hn || qf != ix_rep(V, x->q0, V->NQ) ||
        kf != (V->NK == 1 || ix_rep(V, x->k0, V->NK)) || (qf && (y->q0 != x->q0 || y->qb || x->qb)) ||
        (kf && (y->k0 != x->k0 || y->kb || x->kb)))
        return false;
    /* a run of one element (length 1, slope 0) has no step; one of two or more (slope >= 0:
     * from s0 on) has its own */
    bool ym = y->len >= 2 && y->lb >= 0, xm = x->len >= 2 && x->lb >= 0;
    if ((!ym && (y->len != 1 || y->lb)) || (!xm && (x->len != 1 || x->lb)))
        return false;
    int32_t dq, dk;
    if (ym && xm) {
        if (y->dq != x->dq || y->dk != x->dk)
            return false;
        dq = y->dq, dk = y->dk;
    } else if (ym || xm) {
        dq = ym ? y->dq : x->dq;
        dk = ym ? y->dk : x->dk;
    } else {
        if (x->qb != y->qb || x->kb != y->kb) /* the step between them must not follow s */
            return false;
        dq = qf ? 0 : diff_mod(x->q0, y->q0, R);
        dk = kf ? 0 : diff_mod(x->k0, y->k0, R);
        if ((dq == 0 && dk == 0) || dq < -2 || dq > 2 || dk < -2 || dk > 2)
            return false;
    }
    if ((qf && dq) || (kf && dk))
        return false;
    /* y then x: y's end is x's start, as values and as slopes */
    if (ix(V, y->q0, y->len, dq, V->NQ) == x->q0 && ix(V, y->k0, y->len, dk, V->NK) == x->k0 &&
        md32((int64_t)y->qb + (int64_t)y->lb * dq - x->qb, R) == 0 &&
        md32((int64_t)y->kb + (int64_t)y->lb * dk - x->kb, R) == 0) {
        y->len += x->len;
        y->lb += x->lb;
        y->dq = dq;
        y->dk = dk;
        return true;
    }
    /* x then y */
    if (ix(V, x->q0, x->len, dq, V->NQ) == y->q0 && ix(V, x->k0, x->len, dk, V->NK) == y->k0 &&
        md32((int64_t)x->qb + (int64_t)x->lb * dq - y->qb, R) == 0 &&
        md32((int64_t)x->kb + (int64_t)x->lb * dk - y->kb, R) == 0) {
        y->q0 = x->q0, y->qb = x->qb;
        y->k0 = x->k0, y->kb = x->kb;
        y->len += x->len;
        y->lb += x->lb;
        y->dq = dq;
        y->dk = dk;
        return true;
    }
    return false;
}

#define VB_MAX_RUNS 4096 /* runs per set in the symmetric domain (beyond: not decided) */

/* Adds run x (a multiset union).  False on OOM. */
static bool cs_add_run(vb *V, cset *c, run x)
{
    if (x.len <= 0 || x.hn <= 0)
        return true;
    if (++V->work > VB_WORK_MAX) {
        V->bound_hit = true;
        return false;
    }
    for (int i = c->n - 1; i >= 0 && i >= c->n - 4; i--)
        if (V->ind ? cs_join_sym(V, &c->v[i], &x) : cs_join(V, &c->v[i], &x))
            return true;
    if (c->n == c->cap) {
        int nc = c->cap ? 2 * c->cap : 4;
        run *v = realloc(c->v, (size_t)nc * sizeof *v);
        if (!v)
            return false;
        c->v = v;
        c->cap = nc;
    }
    if (c->n >= VB_MAX_RUNS)
        V->over = true;
    c->v[c->n++] = x;
    return true;
}

/* dst += src restricted to query heads [lo, hi) (all: 0, nh). */
static bool cs_add_set(vb *V, cset *dst, const cset *src, int lo, int hi)
{
    int n = src->n; /* dst may be src */
    for (int i = 0; i < n; i++) {
        run x = src->v[i];
        int a = x.h0 > lo ? x.h0 : lo, b = x.h0 + x.hn < hi ? x.h0 + x.hn : hi;
        if (b <= a)
            continue;
        x.h0 = a;
        x.hn = b - a;
        if (!cs_add_run(V, dst, x))
            return false;
    }
    return true;
}

static bool cs_copy(vb *V, cset *dst, const cset *src)
{
    if (dst == src)
        return true;
    cs_clear(dst);
    return cs_add_set(V, dst, src, 0, V->nh);
}

/* The set seen from rank r + e (symmetric domain: every ring index + e). */
static void cs_rotate(const vb *V, cset *c, int64_t e)
{
    for (int i = 0; i < c->n; i++) {
        if (!ix_rep(V, c->v[i].q0, V->NQ))
            c->v[i].q0 = md32((int64_t)c->v[i].q0 + e, V->R);
        if (V->NK != 1 && !ix_rep(V, c->v[i].k0, V->NK))
            c->v[i].k0 = md32((int64_t)c->v[i].k0 + e, V->R);
    }
}

/* The query heads buffer b holds on ulysses member u, as [*lo, *hi). */
static void held_heads(const vb *V, int b, int u, int *lo, int *hi)
{
    if (V->nh == 1) {
        *lo = 0;
        *hi = 1;
        return;
    }
    int off, n;
    cpc_buffer_heads(V->prog, b, u, &off, &n);
    int g = is_kvr(role(V, b)) ? V->prog->layout.group : 1;
    *lo = off * g;
    *hi = (off + n) * g;
    if (*hi > V->nh)
        *hi = V->nh;
}

typedef struct hrange {
    int lo, hi, j;
} hrange;

static int cmp_hrange(const void *a, const void *b)
{
    const hrange *x = a, *y = b;
    return x->lo != y->lo ? (x->lo > y->lo) - (x->lo < y->lo) : (x->j > y->j) - (x->j < y->j);
}

/* usym (ROTATIONS OF U): what every member holds of buffer b's heads,
 * placed together: member u's set is member 0's with every head moved by
 * u*w (w = the heads one member holds), kept to the heads it holds.  A run
 * over member 0's whole part becomes one run over every head; other runs
 * are placed member by member.  False on OOM or the bound. */
static bool a2a_union_rotated(vb *V, cset *dst, const cset *src, int b)
{
    int lo, hi;
    held_heads(V, b, 0, &lo, &hi);
    int w = hi - lo;
    for (int i = 0; i < src->n; i++) {
        run x = src->v[i];
        int a = x.h0 > lo ? x.h0 : lo, e = x.h0 + x.hn < hi ? x.h0 + x.hn : hi;
        if (e <= a)
            continue;
        if (a == lo && e == hi) {
            x.h0 = 0;
            x.hn = w * V->U;
            if (!cs_add_run(V, dst, x))
                return false;
            continue;
        }
        for (int u = 0; u < V->U; u++) {
            x.h0 = a + u * w;
            x.hn = e - a;
            if (!cs_add_run(V, dst, x))
                return false;
        }
    }
    return true;
}

static cpc_status *coll_inputs(vb *V, int p);

/* Output b of the collective simulated rank p stands at: written by it, rows tag, content src, not
 * a recomputed result (the inputs were complete: vc_coll_inputs). */
static slot *coll_out(vb *V, int p, int b, int tag, int src)
{
    slot *so = S(V, p, b);
    so->written = so->final = 1;
    so->fwd = false;
    so->tag = tag;
    so->src = (uint8_t)src;
    so->wop = &V->ro[p].v[V->pc[p]];
    return so;
}

/* Whether the set every member got from a collective is the same when
 * seen from any member: each run over every head (a rotation of the heads
 * leaves it as it is).  Else the classes do not stand for their members
 * (V->ubreak: every member is simulated instead). */
static void uc_whole(vb *V, const cset *c)
{
    for (int i = 0; i < c->n && !V->ubreak; i++)
        if (c->v[i].h0 != 0 || c->v[i].hn != V->nh)
            V->ubreak = "a collective's gradient does not hold every head (the classes of U stand for their "
                        "members only when it does)";
}

/* uc: run x moved by d heads (mod H: a run over every head, e.g. of a
 * buffer with all heads, wraps; a member's part never does). */
static bool uc_add_moved(vb *V, cset *dst, run x, int64_t d)
{
    x.h0 = (int32_t)((((int64_t)x.h0 + d) % V->nh + V->nh) % V->nh);
    if (x.h0 + x.hn > V->nh) { /* wraps past the last head */
        run t = x;
        t.h0 = 0;
        t.hn = x.h0 + x.hn - V->nh;
        x.hn = V->nh - x.h0;
        if (!cs_add_run(V, dst, t))
            return false;
    }
    return cs_add_run(V, dst, x);
}

/* uc: the first head of member v (of region R). */
static int64_t uc_first(const uregion *R, int v)
{
    return R->a0 + (int64_t)(v - R->u0) * R->n;
}

/* uc: run x of class i's representative as member v of the class holds it
 * (CLASSES OF U): moved by a_v - a_rep; for the in-one-group class, each
 * GQA group moved by (a_v/g - a_rep/g) groups and rotated within by
 * (a_v - a_rep) mod g (whole groups stay whole, a piece of one group may
 * become two). */
static bool uc_move(vb *V, cset *dst, run x, int i, int v)
{
    const uclasses *C = V->uc;
    const uregion *R = &C->reg[C->reg_of[i]];
    const int64_t av = uc_first(R, v), ar = uc_first(R, C->mem[i]);
    if (!C->in[i])
        return uc_add_moved(V, dst, x, av - ar);
    const int g = C->g;
    const int64_t dG = (av / g - ar / g) * g, del = ((av % g - ar % g) % g + g) % g;
    int h = x.h0, e = x.h0 + x.hn;
    while (h < e) {
        int G0 = h / g * g;
        if (h == G0 && e >= G0 + g) { /* whole groups */
            run y = x;
            y.h0 = h;
            y.hn = (e - h) / g * g;
            if (!uc_add_moved(V, dst, y, dG))
                return false;
            h += y.hn;
            continue;
        }
        int end = e < G0 + g ? e : G0 + g, o = (int)((h - G0 + del) % g), len = end - h;
        run y = x;
        y.h0 = G0 + o;
        y.hn = o + len <= g ? len : g - o;
        if (!uc_add_moved(V, dst, y, dG))
            return false;
        if (o + len > g) { /* the rotation wraps within the group */
            y.h0 = G0;
            y.hn = o + len - g;
            if (!uc_add_moved(V, dst, y, dG))
                return false;
        }
        h = end;
    }
    return true;
}

/* uc: run x of class i's set kept to [lo, hi) (lo > hi: every head):
 * false (x unchanged) when nothing is left. */
static bool uc_keep(run *x, int lo, int hi)
{
    int a = x->h0, e = x->h0 + x->hn;
    if (lo <= hi) {
        a = a > lo ? a : lo;
        e = e < hi ? e : hi;
    }
    if (e <= a)
        return false;
    x->h0 = a;
    x->hn = e - a;
    return true;
}

/* uc: members u0 + t, t in [t0, t1), of region R placed one by one: member
 * v = u0 + t is its class's representative moved to v (uc_move): its set
 * src[class], kept to the representative's heads [lo, hi) of its class. */
static bool uc_place(vb *V, cset *dst, const uregion *R, const cset *const *src, const int *lo, const int *hi,
                     int t0, int t1)
{
    for (int t = t0; t < t1; t++) {
        int i = R->rc[t % R->T];
        const cset *sc = src[i];
        for (int j = 0; j < sc->n; j++) {
            run x = sc->v[j];
            if (uc_keep(&x, lo[i], hi[i]) && !uc_move(V, dst, x, i, R->u0 + t))
                return false;
        }
    }
    return true;
}

/* uc: what every member holds, placed together in head order: member v's
 * set is its class representative's (src[class]) moved to v, kept to the
 * representative's heads of buffer b (b < 0: all of it).  A region of one
 * class whose kept run is one member's width n (for the in-one-group class:
 * the representative's part) gives one run over the region; a region of
 * several classes, when one period (members u0 .. u0 + T - 1) is runs over
 * its whole span [a0, a0 + T n), gives runs over its whole periods (member
 * u0 + kT + c is member u0 + c moved by k T n, a multiple of g); the members
 * after the last whole period, and any other case, are placed one by one
 * (adjacent runs join).  False on OOM or the bound. */
static bool uc_union(vb *V, cset *dst, const cset *const *src, int b)
{
    const uclasses *C = V->uc;
    int lo[VB_MAX_CLASSES], hi[VB_MAX_CLASSES];
    for (int i = 0; i < C->ncls; i++) {
        lo[i] = 1, hi[i] = 0; /* every head */
        if (b >= 0)
            held_heads(V, b, C->mem[i], &lo[i], &hi[i]);
    }
    for (int ri = 0; ri < C->nreg; ri++) {
        const uregion *R = &C->reg[ri];
        if (R->one) {
            const int i = R->rc[0];
            const int64_t ar = uc_first(R, C->mem[i]);
            const cset *sc = src[i];
            for (int j = 0; j < sc->n; j++) {
                run x = sc->v[j];
                if (!uc_keep(&x, lo[i], hi[i]))
                    continue;
                bool tile = x.hn == R->n && (!C->in[i] || x.h0 == ar) && x.h0 + (int64_t)R->cnt * R->n <= V->nh;
                if (tile) { /* the members' copies, n apart, tile one run from member u0's */
                    x.h0 = (int32_t)(R->a0 + (x.h0 - ar));
                    x.hn = (int32_t)((int64_t)R->cnt * R->n);
                    if (!cs_add_run(V, dst, x))
                        return false;
                    continue;
                }
                for (int t = 0; t < R->cnt; t++)
                    if (!uc_move(V, dst, x, i, R->u0 + t))
                        return false;
            }
            continue;
        }
        int t0 = 0;
        if (R->cnt >= 2 * R->T) {
            cset per = {0};
            bool ok = uc_place(V, &per, R, src, lo, hi, 0, R->T), whole = ok;
            for (int j = 0; j < per.n && whole; j++)
                whole = per.v[j].h0 == R->a0 && per.v[j].hn == (int64_t)R->T * R->n;
            int full = R->cnt / R->T;
            for (int j = 0; j < per.n && whole && ok; j++) {
                run x = per.v[j];
                x.hn = (int32_t)((int64_t)full * R->T * R->n);
                ok = cs_add_run(V, dst, x);
            }
            cs_free(&per);
            if (!ok)
                return false;
            if (whole)
                t0 = full * R->T;
        }
        if (!uc_place(V, dst, R, src, lo, hi, t0, R->cnt))
            return false;
    }
    return true;
}

/* uc: every member's part of buffer b (heads_to_seq); the classes'
 * simulated ranks are base + i (base Us: the twins). */
static bool a2a_union_classes(vb *V, cset *dst, int b, int base)
{
    const cset *src[VB_MAX_CLASSES];
    for (int i = 0; i < V->uc->ncls; i++)
        src[i] = &S(V, base + i, b)->cnt;
    return uc_union(V, dst, src, b);
}

/* uc: does any member hold a head of buffer b that the next member holds
 * too?  Member v's range ends where member v + 1's starts unless a GQA
 * group straddles them, which depends on v's first head modulo g and its
 * width only: the same for every member with v's residue (checked on the
 * first T members of each region that have a next member). */
static bool uc_shared_heads(const vb *V, int b)
{
    for (int ri = 0; ri < V->uc->nreg; ri++) {
        const uregion *R = &V->uc->reg[ri];
        int nres = R->T < R->cnt ? R->T : R->cnt;
        for (int t = 0; t < nres; t++) {
            int v = R->u0 + t, lo, hi, lo1, hi1;
            if (v + 1 >= V->U)
                continue;
            held_heads(V, b, v, &lo, &hi);
            held_heads(V, b, v + 1, &lo1, &hi1);
            if (hi > lo && hi1 > lo1 && hi > lo1)
                return true;
        }
    }
    return false;
}

/* Executes the all_to_all every member of ulysses group r has reached
 * (SPMD: the same op on every member).  Returns NULL or the failure. */
static cpc_status *run_a2a(vb *V, int r)
{
    const int U = V->U, Us = V->Us; /* simulated rank (r, j): r * Us + j (r = 1: the twins) */
    const xop *x0 = &V->ro[r * Us].v[V->pc[r * Us]];
    const cpc_op *op = x0->op;
    int in = op->in[0], out = op->out[0];
    const cpc_buffer *bi = BF(V, in), *bo = BF(V, out);
    int p0 = r * Us;
    if (op->n_in != 1 || op->n_out != 1)
        return vfail(p0, x0, "the backward prover takes all_to_all with one input and one output");
    if (bi->role != bo->role)
        return vfail(p0, x0, "'%s' (role %s) and '%s' (role %s) differ in role", bi->name,
                     cpc_buf_role_name(bi->role), bo->name, cpc_buf_role_name(bo->role));
    bool s2h = op->dir == CPC_A2A_SEQ_TO_HEADS;
    const cpc_buffer *full = s2h ? bi : bo, *part = s2h ? bo : bi;
    if (full->tokens != CPC_TOK_SHARD || full->heads != CPC_HEADS_ALL || part->tokens != CPC_TOK_BLOCK ||
        part->heads != CPC_HEADS_PART)
        return vfail(p0, x0, "%s: '%s' must be SHARD with all heads and '%s' BLOCK with a head part",
                     cpc_a2a_dir_name(op->dir), full->name, part->name);
    if (op->reduce && (s2h || !is_grad(bi->role)))
        return vfail(p0, x0, "reduce=sum applies to heads_to_seq of dq/dk/dv only");
    if (bi->role == CPC_ROLE_LSE && !s2h)
        return vfail(p0, x0, "heads_to_seq of an LSE-role buffer is not executable");
    cpc_status *st = NULL;
    for (int j = 0; j < Us && !st; j++) /* usym: member 0 stands for its rotations */
        st = coll_inputs(V, r * Us + j);
    if (st)
        return st;
    if (s2h && is_grad(bi->role))
        return vfail(p0, x0, "seq_to_heads of a gradient is outside the backward prover's class");
    if (!s2h && is_grad(bi->role) && !op->reduce && (!V->usym || (V->uc && uc_shared_heads(V, in)))) {
        /* usym: the parts are disjoint (usym_class); the classes of U: checked by class
         * (uc_shared_heads), the pair named here */
        /* A head held by two members keeps one part: refused here (the
         * members' head ranges, swept in order of their first head). */
        hrange *hr = malloc((size_t)U * sizeof *hr);
        if (!hr)
            return &cpc_status_oom;
        for (int j = 0; j < U; j++) {
            held_heads(V, in, j, &hr[j].lo, &hr[j].hi);
            hr[j].j = j;
        }
        qsort(hr, (size_t)U, sizeof *hr, cmp_hrange);
        int end = 0, who = -1;
        for (int j = 0; j < U; j++) {
            if (hr[j].hi <= hr[j].lo)
                continue;
            if (who >= 0 && hr[j].lo < end) {
                int h = hr[j].lo, a = who < hr[j].j ? who : hr[j].j, b = who < hr[j].j ? hr[j].j : who;
                free(hr);
                return vfail(p0, x0,
                             "'%s': query head %d's gradient is held by members %d and %d: their parts "
                             "must be summed (all_to_all reduce=sum), not placed",
                             bi->name, h, a, b);
            }
            if (hr[j].hi > end) {
                end = hr[j].hi;
                who = hr[j].j;
            }
        }
        free(hr);
    }
    /* Outputs, computed from the inputs before any is written: every
     * member gets the sum over the members of the heads each holds (placed
     * when no two hold one head, checked above; summed with reduce). */
    cset tmp = {0};
    for (int u = 0; is_grad(bi->role) && u < U && !V->usym; u++) {
        int lo, hi;
        held_heads(V, in, u, &lo, &hi);
        if (!cs_add_set(V, &tmp, &S(V, r * Us + u, in)->cnt, lo, hi)) {
            cs_free(&tmp);
            return cs_err(V);
        }
    }
    if (is_grad(bi->role) && V->usym &&
        !(V->uc ? a2a_union_classes(V, &tmp, in, r * Us) : a2a_union_rotated(V, &tmp, &S(V, r * Us, in)->cnt, in))) {
        cs_free(&tmp);
        return cs_err(V);
    }
    if (V->uc && is_grad(bi->role)) {
        uc_whole(V, &tmp);
        if (V->ubreak) {
            cs_free(&tmp);
            return NULL; /* prove() stops: every member is simulated instead */
        }
    }
    for (int j = 0; j < V->Us; j++)
        if (S(V, r * Us + j, in)->r0)
            V->asym = "a `when r==0` op's result goes through an all_to_all";
    for (int j = 0; j < V->Us; j++) {
        int p = r * Us + j;
        slot *so = coll_out(V, p, out, s2h ? cp(V, p) / U : cp(V, p), S(V, p, in)->src);
        if (so->grad && !cs_copy(V, &so->cnt, &tmp)) {
            cs_free(&tmp);
            return cs_err(V);
        }
        V->pc[p]++;
    }
    cs_free(&tmp);
    return NULL;
}

/* Executes the all_gather or reduce_scatter every member of ring group u
 * has reached (symmetric domain: member (0, u) stands for all: the others
 * are its rotations). */
static cpc_status *run_ring_coll(vb *V, int u)
{
    const int U = V->Us, R = V->R, nm = V->sym ? 1 : R, nsm = V->twin ? 2 : nm; /* members computed, simulated;
                                                                                  simulated rank (r, u): r * Us + u */
    const xop *x0 = &V->ro[u].v[V->pc[u]];
    const cpc_op *op = x0->op;
    if (op->n_in != op->n_out || op->n_in < 1)
        return vfail(u, x0, "needs as many outputs as inputs");
    for (int r = 0; r < nsm; r++) {
        cpc_status *st = coll_inputs(V, r * U + u);
        if (st)
            return st;
    }
    for (int k = 0; k < op->n_in; k++) {
        int in = op->in[k], out = op->out[k];
        const cpc_buffer *bi = BF(V, in), *bo = BF(V, out);
        if (bi->role != bo->role || bi->heads != bo->heads)
            return vfail(u, x0, "'%s' and '%s' differ in role or heads", bi->name, bo->name);
        bool ag = op->kind == CPC_OP_ALL_GATHER;
        bool ok = ag ? !is_grad(bi->role) && bi->tokens == CPC_TOK_BLOCK && bo->tokens == CPC_TOK_ALL
                     : is_grad(bi->role) && bi->tokens == CPC_TOK_ALL && bo->tokens == CPC_TOK_BLOCK;
        if (!ok)
            return vfail(u, x0, ag ? "all_gather takes a K/V ring block to a gathered (ALL) buffer"
                                   : "reduce_scatter takes a gathered (ALL) dq/dk/dv to a ring block");
        for (int r = 0; r < nsm; r++)
            if (S(V, r * U + u, in)->r0) /* ring rank 0's own content would reach the other ranks: not rotations */
                V->asym = "a `when r==0` op's result travels over the ring";
        /* reduce_scatter: member r gets the sum over the members m of the
         * elements of their sets with key block r */
        cset *outs = NULL;
        if (!ag && (nm < 1 || !(outs = calloc((size_t)(unsigned)nm, sizeof *outs))))
            return cs_err(V);
        bool oom = false;
        for (int m = 0; !ag && m < nm && !oom; m++) {
            const cset *c = &S(V, m * U + u, in)->cnt;
            for (int i = 0; i < c->n && !oom; i++) {
                run x = c->v[i];
                if (V->sym) {
                    /* seen from the owner of each element's key block k: (q - k, 0); the
                     * replicated queries (block R) stay R */
                    if (ix_rep(V, x.k0, V->NK)) {
                        V->asym = "reduce_scatter of the replicated keys' gradient";
                        continue;
                    }
                    bool qr = ix_rep(V, x.q0, V->NQ);
                    run y = {qr ? R : md32((int64_t)x.q0 - x.k0, R), 0, x.len, x.h0, x.hn, qr ? 0 : x.dq - x.dk, 0, 0, 0, 0};
                    if (y.len > 1 && y.dq == 0)
                        for (int t = 0; t < x.len && !oom; t++) {
                            y.len = 1;
                            oom = !cs_add_run(V, &outs[0], y);
                        }
                    else
                        oom = !cs_add_run(V, &outs[0], y);
                    continue;
                }
                for (int t = 0; t < x.len && !oom; t++) {
                    run y = {ix(V, x.q0, t, x.dq, V->NQ), ix(V, x.k0, t, x.dk, V->NK), 1, x.h0, x.hn, 0, 0, 0, 0, 0};
                    if (y.k0 < nm)
                        oom = !cs_add_run(V, &outs[y.k0], y);
                }
            }
        }
        for (int r = 0; r < nsm && !oom; r++) {
            slot *so = coll_out(V, r * U + u, out, ag ? CPC_TAG_NONE : cp(V, r * U + u) / V->U,
                                S(V, r * U + u, in)->src);
            /* twin: both simulated members' inputs are free of ring rank 0's own content
             * (checked above), so equal: member 0's result is both's */
            if (!ag && so->grad && !cs_copy(V, &so->cnt, &outs[V->sym ? 0 : r]))
                oom = true;
        }
        for (int r = 0; outs && r < nm; r++)
            cs_free(&outs[r]);
        free(outs);
        if (oom)
            return cs_err(V);
    }
    for (int r = 0; r < nsm; r++)
        V->pc[r * U + u]++;
    return NULL;
}

/* Adds run y as every simulated rank's rotations hold it: itself, or with
 * usym (ROTATIONS OF U) once per member u, its heads moved by u*w (mod H);
 * a run over member 0's part [0, w) gives one run over every head. */
static bool add_members(vb *V, cset *c, run y)
{
    if (!V->usym)
        return cs_add_run(V, c, y);
    const int w = V->nh / V->U;
    if (y.h0 == 0 && y.hn == w) {
        y.hn = V->nh;
        return cs_add_run(V, c, y);
    }
    for (int u = 0; u < V->U; u++)
        if (!uc_add_moved(V, c, y, (int64_t)u * w))
            return false;
    return true;
}

/* Executes the all_reduce every rank has reached: the sum of every rank's
 * contributions, on every rank (symmetric domain: the sum over the ring of
 * the rotations of each member's set; each element (q, k) of member u then
 * counts once for every query block q, and must be the cross-attention's
 * single key unit). */
static cpc_status *run_all_reduce(vb *V)
{
    const xop *x0 = &V->ro[0].v[V->pc[0]];
    const cpc_op *op = x0->op;
    if (op->n_in != op->n_out || op->n_in < 1)
        return vfail(0, x0, "needs as many outputs as inputs");
    for (int k = 0; k < op->n_in; k++) {
        int in = op->in[k], out = op->out[k];
        const cpc_buffer *bi = BF(V, in), *bo = BF(V, out);
        if (!is_grad(bi->role) || bi->role != bo->role || bi->tokens != CPC_TOK_KV || bo->tokens != CPC_TOK_KV ||
            bi->heads != CPC_HEADS_ALL || bo->heads != CPC_HEADS_ALL)
            return vfail(0, x0, "all_reduce takes cross-attention dk/dv (or replicated segments' gradients) with every "
                                "head ('%s' -> '%s')", bi->name,
                         bo->name);
        cset sum = {0}, ys[2 * VB_MAX_CLASSES] = {{0}}; /* uc: each simulated rank's set over the ring (its
                                                               class; the twins after), then placed */
        bool oom = false;
        for (int p = 0; p < V->nsim && !oom; p++) {
            slot *si = S(V, p, in); /* written: vc_rd when the rank reached it */
            if (!V->sym) {
                oom = !cs_add_set(V, &sum, &si->cnt, 0, V->nh);
                continue;
            }
            /* the ring ranks this simulated rank stands for, as rotations e0 .. e0 + ne - 1 of
             * its set: every e (sym), e = 0 (twin: ring rank 0), e = 1 .. R-1 (twin: the others) */
            int e0 = V->twin && p >= V->Us ? 1 : 0, ne = !V->twin ? V->R : p < V->Us ? 1 : V->R - 1;
            for (int i = 0; i < si->cnt.n && !oom; i++) {
                run x = si->cnt.v[i];
                for (int t = 0; t < x.len && !oom; t++) {
                    int32_t q = ix(V, x.q0, t, x.dq, V->NQ), k = ix(V, x.k0, t, x.dk, V->NK);
                    bool qf = ix_rep(V, q, V->NQ), kf = V->NK == 1 || ix_rep(V, k, V->NK);
                    run y = {qf ? q : md32((int64_t)q + e0, V->R), kf ? k : md32((int64_t)k + e0, V->R), ne, x.h0,
                             x.hn, qf ? 0 : 1, kf ? 0 : 1, 0, 0, 0};
                    if (qf && kf) /* one element, ne times: 2 copies decide "exactly once" as well */
                        for (int c = 0; c < (ne < 2 ? ne : 2) && !oom; c++) {
                            y.len = 1;
                            oom = !(V->uc ? cs_add_run(V, &ys[p], y) : add_members(V, &sum, y));
                        }
                    else
                        oom = !(V->uc ? cs_add_run(V, &ys[p], y) : add_members(V, &sum, y));
                }
            }
        }
        if (V->uc) {
            const cset *src[VB_MAX_CLASSES];
            for (int k = 0; k < V->nsim; k += V->Us) { /* the members of ring rank 0, then the twins' */
                for (int j = 0; j < V->uc->ncls; j++)
                    src[j] = &ys[k + j];
                oom = oom || !uc_union(V, &sum, src, -1);
            }
            for (int j = 0; j < V->nsim; j++)
                cs_free(&ys[j]);
        }
        if (V->uc && !oom) {
            uc_whole(V, &sum);
            if (V->ubreak) {
                cs_free(&sum);
                return NULL; /* prove() stops: every member is simulated instead */
            }
        }
        for (int p = 0; p < V->nsim && !oom; p++) {
            slot *so = coll_out(V, p, out, CPC_TAG_NONE, CPC_CONTENT_GRAD);
            so->r0 = false; /* the same on every rank */
            oom = !cs_copy(V, &so->cnt, &sum);
        }
        cs_free(&sum);
        if (oom)
            return cs_err(V);
    }
    for (int p = 0; p < V->nsim; p++)
        V->pc[p]++;
    return NULL;
}

static bool same_layout(const vb *V, int a, int b)
{
    return BF(V, a)->tokens == BF(V, b)->tokens && BF(V, a)->heads == BF(V, b)->heads;
}

/* The shared rules (verify_common.h) over this domain: rank p's slots and
 * requests (requests hold memory slots: a swap moves names, not slots). */
typedef struct bwd_dom {
    vb *V;
    int p;
    const xop *x; /* the op instance the step runs, or where the domain stands (NULL: the end) */
    const struct vc_domain *dom; /* the domain over this (bwd_domain) */
} bwd_dom;

static void bwd_domain(bwd_dom *dd, vc_domain *dom);

static const char *dom_name(void *self, int b) { return bn(((bwd_dom *)self)->V, b); }
static vc_val *dom_val(void *self, int b) { return &S(((bwd_dom *)self)->V, ((bwd_dom *)self)->p, b)->h; }
static const char *dom_writer(void *self, int b)
{
    bwd_dom *dd = self;
    const xop *w = S(dd->V, dd->p, b)->wop;
    return w ? vc_op_desc(w->nd, w->s, w->s + 1, dd->V->ob, sizeof dd->V->ob) : "the program's input";
}

static bool rotated(const vb *V, cpc_group g);
static cpc_status *recomputed_complete(vb *V, int p, const xop *x, int b);

/* The step's geometry over this domain's values: rows are the content tag (a ring block, or
 * a shard), heads the buffer's layout on this member, keys met the (query block, key unit,
 * query head) pairs in `cnt`. */
#define SL(v) ((slot *)(v))
#define DV(self) (((bwd_dom *)(self))->V)
#define DP(self) (((bwd_dom *)(self))->p)

static void slot_empty(slot *s)
{
    cset c = s->cnt;
    cs_clear(&c);
    *s = (slot){.tag = CPC_TAG_NONE, .role = CPC_ROLE__COUNT, .cnt = c};
}

static vc_val *dom_tmp(void *self, int j)
{
    slot *s = &DV(self)->tmpv[j];
    slot_empty(s);
    return &s->h;
}

static bool dom_copy(void *self, vc_val *dst, const vc_val *src)
{
    slot *d = SL(dst);
    const slot *s = (const slot *)src;
    if (d == s)
        return true;
    cset c = d->cnt;
    *d = *s;
    d->cnt = c;
    return cs_copy(DV(self), &d->cnt, &s->cnt);
}

static vc_tri dom_fits(void *self, int b, const vc_val *v, char *why, size_t n)
{
    const slot *s = (const slot *)v;
    const cpc_buffer *B = BF(DV(self), b);
    if ((s->role == CPC_ROLE__COUNT || (int)B->role == s->role) && (int)B->tokens == s->tk && (int)B->heads == s->hd)
        return VC_YES;
    snprintf(why, n, "%s (role %s, %s/%s) cannot hold a value of the layout %s/%s%s%s", B->name,
             cpc_buf_role_name(B->role), cpc_buf_tokens_name(B->tokens), cpc_buf_heads_name(B->heads),
             cpc_buf_tokens_name((cpc_buf_tokens)s->tk), cpc_buf_heads_name((cpc_buf_heads)s->hd),
             s->role == CPC_ROLE__COUNT ? "" : " and role ",
             s->role == CPC_ROLE__COUNT ? "" : cpc_buf_role_name((cpc_buf_role)s->role));
    return VC_NO;
}

static void dom_put(void *self, int b, vc_val *v)
{
    slot *d = S(DV(self), DP(self), b), *s = SL(v);
    s->wop = ((bwd_dom *)self)->x; /* the op the domain stands at */
    if (d == s)
        return;
    slot keep = *d; /* the slot's own layout, gradient flag and run storage */
    *d = *s;
    d->role = keep.role, d->tk = keep.tk, d->hd = keep.hd, d->grad = keep.grad;
    s->cnt = keep.cnt; /* v emptied; its runs move */
    slot_empty(s);
}

static void dom_exchange(void *self, int a, int b)
{
    vb *V = DV(self);
    int *m = &V->map[DP(self) * V->nb];
    int t = m[a];
    m[a] = m[b];
    m[b] = t;
}

static int32_t dom_new_stamp(void *self) { return ++DV(self)->stamps; }

/* init_acc of a forward accumulator pair: rows by its layout (a ring block's: set by the first merge). */
static void dom_shape(void *self, vc_val *v, int tok, int heads, int b, const vc_val *like)
{
    (void)heads, (void)like;
    slot *s = SL(v);
    const cpc_buffer *B = BF(DV(self), b);
    cs_clear(&s->cnt);
    s->tag = tok == VC_T_OWN ? DP(self) : CPC_TAG_NONE;
    s->tk = (int8_t)B->tokens;
    s->hd = (int8_t)B->heads;
    s->fwd = true;
}

static vc_tri dom_tok_is(void *self, const vc_val *v, int tok)
{
    const slot *s = (const slot *)v;
    vb *V = DV(self);
    bool y = tok == VC_T_UNSET ? !s->written || (s->tag == CPC_TAG_NONE && s->tk != CPC_TOK_ALL && s->tk != CPC_TOK_KV)
             : tok == VC_T_OWN ? s->tag == cp(V, DP(self)) && s->tk == CPC_TOK_SHARD
             : tok == VC_T_BLOCK ? s->tag == cp(V, DP(self)) / V->U && s->tk == CPC_TOK_BLOCK
             : tok == VC_T_ALL ? s->tk == CPC_TOK_ALL
                               : s->tk == CPC_TOK_KV;
    if (y && (tok == VC_T_OWN || tok == VC_T_BLOCK))
        sym_same(V, s->tb, 0); /* this rank's own rows on every step */
    return y ? VC_YES : VC_NO;
}

static vc_tri dom_heads_are(void *self, const vc_val *v, int heads)
{
    (void)self;
    int hd = ((const slot *)v)->hd;
    return (heads == VC_H_ALL ? hd == CPC_HEADS_ALL : hd == CPC_HEADS_PART) ? VC_YES : VC_NO;
}

static vc_tri dom_same_tokens(void *self, const vc_val *x, const vc_val *y)
{
    const slot *a = (const slot *)x, *b = (const slot *)y;
    if (a->tk != b->tk || a->tag != b->tag)
        return VC_NO;
    if (a->tag != CPC_TAG_NONE)
        sym_same(DV(self), a->tb, b->tb);
    return VC_YES;
}

static vc_tri dom_same_heads(void *self, const vc_val *x, const vc_val *y)
{
    (void)self;
    return ((const slot *)x)->hd == ((const slot *)y)->hd ? VC_YES : VC_NO;
}

static const char *dom_words(void *self, const vc_val *v, char *buf, size_t n)
{
    (void)self;
    const slot *s = (const slot *)v;
    if (s->tag == CPC_TAG_NONE)
        snprintf(buf, n, "no rows (%s/%s)", cpc_buf_tokens_name((cpc_buf_tokens)s->tk),
                 cpc_buf_heads_name((cpc_buf_heads)s->hd));
    else
        snprintf(buf, n, "block %d (%s/%s)", s->tag, cpc_buf_tokens_name((cpc_buf_tokens)s->tk),
                 cpc_buf_heads_name((cpc_buf_heads)s->hd));
    return buf;
}

static bool dom_has_keys(void *self, const vc_val *v) { (void)self; return ((const slot *)v)->cnt.n > 0; }

/* attn recomputed in a backward program: K/V ring blocks, q a shard (U == 1) or a ring block, no
 * cross-attention (the backward prover's class); the GQA rule; o's pairs: (q's block, k's block,
 * the heads q holds). */
static vc_tri dom_attn_keys(void *self, const cpc_op *op, const vc_val *Q, const vc_val *K, vc_val *o, char *why,
                            size_t n)
{
    vb *V = DV(self);
    const cpc_program *prog = V->prog;
    const int u = cp(V, DP(self)) % V->U, qi = op->in[0], ki = op->in[1];
    const slot *q = (const slot *)Q, *k = (const slot *)K;
    cpc_buf_tokens qt = BF(V, qi)->tokens;
    if (prog->layout.cross || op->block || BF(V, ki)->tokens != CPC_TOK_BLOCK ||
        !((qt == CPC_TOK_SHARD && V->U == 1) || qt == CPC_TOK_BLOCK)) {
        snprintf(why, n, "recomputing attention in a backward program takes K/V ring blocks, q a shard "
                         "(ulysses_degree 1) or a ring block, and no cross-attention (the backward prover's class)");
        return VC_NO;
    }
    int lo, hi, ko, kn;
    held_heads(V, qi, u, &lo, &hi);
    cpc_buffer_heads(prog, ki, u, &ko, &kn);
    int g = prog->layout.group, qo = V->nh > 1 ? lo : 0, qn = V->nh > 1 ? hi - lo : 0;
    if (qn > 0 && (qo / g < ko || (qo + qn - 1) / g >= ko + kn)) {
        snprintf(why, n, "query heads [%d, %d) use K/V heads this rank does not hold ([%d, %d))", qo, qo + qn, ko,
                 ko + kn);
        return VC_NO;
    }
    slot *s = SL(o);
    s->tag = q->tag;
    s->tk = q->tk;
    s->hd = q->hd;
    s->fwd = true;
    return cs_add_run(V, &s->cnt, (run){q->tag, k->tag, 1, lo, hi - lo, 0, 0, 0, 0, 0}) ? VC_YES : VC_OOM;
}

/* merge: the accumulator's rows := the block's, its pairs += the block's (pairs met twice are found
 * where the result is read: recomputed_complete). */
static vc_tri dom_merge_keys(void *self, vc_val *acc, const vc_val *a, char *why, size_t n)
{
    (void)why, (void)n;
    slot *A = SL(acc);
    const slot *B = (const slot *)a;
    if (A->tag == CPC_TAG_NONE)
        A->tag = B->tag;
    return cs_add_set(DV(self), &A->cnt, &B->cnt, 0, DV(self)->nh) ? VC_YES : VC_OOM;
}

/* copy: a gradient's head part keeps its own heads' pairs (placed into every head: the others
 * stay empty); only a gradient's head part widens; a recomputed result stays where it was made. */
static vc_tri dom_select_heads(void *self, vc_val *v, int b, int from, char *why, size_t n)
{
    vb *V = DV(self);
    slot *s = SL(v);
    const cpc_buffer *B = BF(V, b), *F = BF(V, from);
    if (s->fwd) {
        snprintf(why, n, "copies '%s', an attention result recomputed here: it stays where it was made (the backward "
                         "prover's class)", F->name);
        return VC_NO;
    }
    if (F->heads == CPC_HEADS_PART && B->heads == CPC_HEADS_ALL && !is_grad(F->role) && F->role == B->role) {
        snprintf(why, n, "'%s' -> '%s': only a gradient's head part is placed into every head", F->name, B->name);
        return VC_NO;
    }
    if (is_grad(F->role) && is_grad(B->role)) {
        int u = cp(V, DP(self)) % V->U, la, ha, lb, hb;
        held_heads(V, from, u, &la, &ha);
        held_heads(V, b, u, &lb, &hb);
        cset c = {0};
        if (!cs_add_set(V, &c, &s->cnt, la > lb ? la : lb, ha < hb ? ha : hb)) {
            cs_free(&c);
            return VC_OOM;
        }
        cs_free(&s->cnt);
        s->cnt = c;
    }
    s->hd = (int8_t)B->heads;
    return VC_YES;
}

static vc_tri grad_covered(vb *V, int p, const slot *sl, char *why, size_t n);

/* Sending: what is not a recomputed result was proved complete where it was made (the saved
 * forward's out and LSE: by the forward proof); a recomputed one stays on its rank until proven
 * complete (recomputed_complete sets final; vc_complete does not ask then).  An OUTPUT
 * gradient (vc_output): grad_covered. */
static vc_tri dom_covered(void *self, const vc_val *v, const char *name, char *why, size_t n)
{
    (void)name;
    const slot *sl = (const slot *)v;
    if (sl->src == CPC_CONTENT_GRAD)
        return grad_covered(DV(self), DP(self), sl, why, n);
    if (!sl->fwd)
        return VC_YES;
    snprintf(why, n, "is an attention result recomputed here: it stays on its rank (the backward prover's class)");
    return VC_NO;
}

/* A recv's declared block (verify_bwd.h 4): what arrives in a BLOCK buffer is that block. */
static vc_tri dom_declared(void *self, vc_val *v, const void *rq, char *words, size_t n)
{
    const req *r = rq;
    int b = r->bufs[SL(v) - r->snap]; /* v: r's snapshot of buffer j (vc_match) */
    if (BF(DV(self), b)->tokens != CPC_TOK_BLOCK || !r->x->op->block)
        return VC_YES;
    if (SL(v)->tag == (int)r->blk) {
        sym_same(DV(self), SL(v)->tb, r->blkb);
        return VC_YES;
    }
    snprintf(words, n, "block %lld", (long long)r->blk);
    return VC_NO;
}

static void dom_sender(void *self, const void *rq, char *who, size_t nw, char *op, size_t no)
{
    const vb *V = DV(self);
    const req *r = rq, *s = RQ(V, r->match);
    char ob[256];
    if (rotated(V, r->group))
        snprintf(who, nw, "ring member r%+d", diff_mod(r->to, 0, V->R));
    else
        snprintf(who, nw, "rank %d", s->p);
    snprintf(op, no, "%s, %s group, tag %d", vc_op_desc(s->on, s->slo, s->shi, ob, sizeof ob),
             cpc_group_name((cpc_group)s->group), s->tag);
}

/* The backward ops' gradient geometry (the step's grad_op, after the lifetime and content rules):
 * delta, init_acc of gradients, add, attn_bwd; a fault is reported here (V->err). */
static vc_tri dom_grad_op(void *self, const cpc_op *op, char *why, size_t n)
{
    (void)why, (void)n;
    bwd_dom *dd = self;
    vb *V = dd->V;
    const int p = dd->p, u = cp(V, p) % V->U;
    const xop *x = dd->x;
    const cpc_program *prog = V->prog;
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    switch (op->kind) {
    case CPC_OP_DELTA: {
        if (op->n_in != 2 || op->n_out != 1 || role(V, op->in[0]) != CPC_ROLE_DO ||
            role(V, op->in[1]) != CPC_ROLE_O || role(V, op->out[0]) != CPC_ROLE_LSE) {
            V->err = vfail(p, x, "operands must be (do, o) -> lse-role delta");
            return VC_NO;
        }
        if ((V->err = recomputed_complete(V, p, x, op->in[1])))
            return VC_NO;
        slot *a = S(V, p, op->in[0]), *o = S(V, p, op->in[1]), *d = S(V, p, op->out[0]);
        sym_same(V, a->tb, o->tb);
        if (a->tag != o->tag || !same_layout(V, op->in[0], op->in[1]) ||
            !same_layout(V, op->in[0], op->out[0])) {
            V->err = vfail(p, x, "dout '%s', out '%s' and delta '%s' must hold the same rows "
                           "and heads", bn(V, op->in[0]), bn(V, op->in[1]), bn(V, op->out[0]));
            return VC_NO;
        }
        d->tag = out_tag_s(V, p, x, 0, a, a, d, &d->tb);
        d->written = true;
        break;
    }
    case CPC_OP_INIT_ACC:
        for (int i = 0; i < op->n_out; i++) {
            int b = op->out[i];
            if (!is_grad(role(V, b))) {
                V->err = vfail(p, x, "'%s' (role %s): a backward program initialises only dq/dk/dv",
                               bn(V, b), cpc_buf_role_name(role(V, b)));
                return VC_NO;
            }
            slot *sl = S(V, p, b);
            cs_clear(&sl->cnt);
            sl->written = true;
            sl->src = CPC_CONTENT_GRAD;
            if (op->block) {
                /* made the accumulator of ring block `block` */
                if (BF(V, b)->tokens != CPC_TOK_BLOCK || x->block < 0 || x->block >= V->R) {
                    V->err = vfail(p, x, "init_acc block=%lld of '%s': a ring block's accumulator (BLOCK, "
                                         "0..%d)", (long long)x->block, bn(V, b), V->R - 1);
                    return VC_NO;
                }
                sl->tag = out_tag_s(V, p, x, i, NULL, NULL, sl, &sl->tb);
            }
        }
        break;
    case CPC_OP_ADD: {
        int a = op->in[0], b = op->out[0];
        slot *sa = S(V, p, a), *sb = S(V, p, b);
        if (op->n_in != 1 || op->n_out != 1 || !is_grad(role(V, a)) || role(V, a) != role(V, b) ||
            !same_layout(V, a, b)) {
            V->err = vfail(p, x, "add: '%s' and '%s' must be gradients of one role and layout", bn(V, a), bn(V, b));
            return VC_NO;
        }
        if (!sa->written || !sb->written) {
            V->err = vfail(p, x, "adds '%s' into '%s' before both hold a value", bn(V, a), bn(V, b));
            return VC_NO;
        }
        if (sa->tag != sb->tag) {
            V->err = vfail(p, x, "adds the gradient of block %d ('%s') to that of block %d ('%s')", sa->tag,
                           bn(V, a), sb->tag, bn(V, b));
            return VC_NO;
        }
        sym_same(V, sa->tb, sb->tb);
        if (!cs_add_set(V, &sb->cnt, &sa->cnt, 0, V->nh)) {
            V->err = cs_err(V);
            return VC_NO;
        }
        break;
    }
    case CPC_OP_ATTN_BWD: {
        /* the inputs: written, holding q, k, v, dout, the saved LSE and the delta op's output (the
         * step's content rule: by provenance, so by role too) */
        static const cpc_buf_role want_out[3] = {CPC_ROLE_DQ, CPC_ROLE_DK, CPC_ROLE_DV};
        if (op->n_in != 6 || op->n_out != 3) {
            V->err = vfail(p, x, "needs 6 inputs and 3 outputs");
            return VC_NO;
        }
        for (int i = 0; i < 3; i++)
            if (role(V, op->out[i]) != want_out[i]) {
                V->err = vfail(p, x, "output %d '%s' has role %s, %s expected", i + 1, bn(V, op->out[i]),
                               cpc_buf_role_name(role(V, op->out[i])), cpc_buf_role_name(want_out[i]));
                return VC_NO;
            }
        for (int i = 0; i < 3; i++)
            if (!S(V, p, op->out[i])->written) {
                V->err = vfail(p, x, "adds to '%s' before init_acc (or a recv) gave it a value",
                               bn(V, op->out[i]));
                return VC_NO;
            }
        if ((V->err = recomputed_complete(V, p, x, op->in[4])))
            return VC_NO;
        slot *q = S(V, p, op->in[0]), *k = S(V, p, op->in[1]), *v = S(V, p, op->in[2]);
        slot *dk = S(V, p, op->out[1]), *dv = S(V, p, op->out[2]), *dq = S(V, p, op->out[0]);
        /* Query side: q, dout, lse, delta, dq in one layout and rows; K side:
         * k, v, dk, dv in one layout (heads: this member's part or all). */
        int qside[5] = {op->in[3], op->in[4], op->in[5], op->out[0], op->in[0]};
        for (int i = 0; i < 4; i++)
            if (!same_layout(V, qside[i], op->in[0]) ||
                (i < 3 && S(V, p, qside[i])->tag != q->tag)) {
                V->err = vfail(p, x, "'%s' (%s/%s, rows %d) does not match q '%s' (%s/%s, rows %d)",
                               bn(V, qside[i]), cpc_buf_tokens_name(BF(V, qside[i])->tokens),
                               cpc_buf_heads_name(BF(V, qside[i])->heads), S(V, p, qside[i])->tag,
                               bn(V, op->in[0]), cpc_buf_tokens_name(BF(V, op->in[0])->tokens),
                               cpc_buf_heads_name(BF(V, op->in[0])->heads), q->tag);
                return VC_NO;
            }
        for (int i = 0; i < 3; i++)
            sym_same(V, S(V, p, qside[i])->tb, q->tb);
        int kside[3] = {op->in[2], op->out[1], op->out[2]};
        for (int i = 0; i < 3; i++)
            if (!same_layout(V, kside[i], op->in[1]) || BF(V, op->in[1])->heads != BF(V, op->in[0])->heads) {
                V->err = vfail(p, x, "'%s' does not have the layout of k '%s' (and of the query side's heads)",
                               bn(V, kside[i]), bn(V, op->in[1]));
                return VC_NO;
            }
        bool kall = BF(V, op->in[1])->tokens == CPC_TOK_ALL;
        bool kkv = BF(V, op->in[1])->tokens == CPC_TOK_KV;
        const bool rep = V->prog->layout.rep;
        if (kkv) {
            /* cross-attention: all of K/V, one key unit; replicated
             * segments: their keys, key unit R */
        } else if (kall) {
            /* gathered K/V: the op's `block` is what it reads, and dK/dV
             * (gathered too, same layout) get that slice */
            if (!op->block || x->block < 0 || x->block >= V->R) {
                V->err = vfail(p, x, "attn_bwd on gathered K/V needs a block in 0..%d", V->R - 1);
                return VC_NO;
            }
        } else if (k->tag != v->tag || k->tag != dk->tag || k->tag != dv->tag) {
            V->err = vfail(p, x,
                           "reads K/V blocks %d/%d but adds to dK/dV accumulators of blocks %d/%d: a K/V "
                           "block's gradient must come from that block (diffusers #14265: a ring backward "
                           "that reuses one step's K/V)",
                           k->tag, v->tag, dk->tag, dv->tag);
            return VC_NO;
        } else if (op->block && x->block != k->tag) {
            /* a block names what K/V hold (the executor reads it so and refuses another) */
            V->err = vfail(p, x, "reads block %lld but K/V '%s' hold block %d", (long long)x->block,
                           bn(V, op->in[1]), k->tag);
            return VC_NO;
        } else {
            sym_same(V, k->tb, v->tb);
            sym_same(V, k->tb, dk->tb);
            sym_same(V, k->tb, dv->tb);
            if (op->block) /* ... on every step: the slopes too */
                sym_same(V, k->tb, (int32_t)x->bs);
        }
        cpc_buf_tokens qt = BF(V, op->in[0])->tokens;
        int kb = kkv ? (rep ? V->R : 0) : kall ? (int)x->block : k->tag;
        if ((!kall && !kkv && BF(V, op->in[1])->tokens != CPC_TOK_BLOCK) ||
            (kkv && !rep && !(V->NK == 1 && V->prog->layout.cross)) ||
            (qt != CPC_TOK_SHARD && qt != CPC_TOK_BLOCK && !(rep && qt == CPC_TOK_KV)) ||
            (qt == CPC_TOK_SHARD && V->U != 1)) {
            V->err = vfail(p, x, "q must be a shard (ulysses_degree 1) or a ring block, K/V ring blocks "
                                 "or gathered (the class this prover handles)");
            return VC_NO;
        }
        /* Query rows as a ring block: with U == 1 shard p is block p. */
        int qb = qt == CPC_TOK_KV ? V->R : q->tag;
        if (kb < 0 || kb >= V->NK || qb < 0 || qb >= V->NQ) {
            V->err = vfail(p, x, "K/V content (block %d) or query rows (%d) unknown", k->tag, q->tag);
            return VC_NO;
        }
        int qo = 0, qn = 1;
        if (V->nh > 1)
            cpc_buffer_heads(prog, op->in[0], u, &qo, &qn);
        int ko, kn;
        cpc_buffer_heads(prog, op->in[1], u, &ko, &kn);
        if (V->nh > 1 && qn > 0 &&
            (qo / prog->layout.group < ko || (qo + qn - 1) / prog->layout.group >= ko + kn)) {
            V->err = vfail(p, x, "query heads [%d, %d) use K/V heads this rank does not hold ([%d, %d))", qo,
                           qo + qn, ko, ko + kn);
            return VC_NO;
        }
        /* the symbolic step: the blocks' slopes in s */
        int32_t qbs = qt == CPC_TOK_KV ? 0 : q->tb, kbs = kkv ? 0 : kall ? (int32_t)x->bs : k->tb;
        run one = {qb, kb, 1, qo, qn, 0, 0, qbs, kbs, 0};
        if (!cs_add_run(V, &dq->cnt, one) || !cs_add_run(V, &dk->cnt, one) || !cs_add_run(V, &dv->cnt, one)) {
            V->err = cs_err(V);
            return VC_NO;
        }
        dq->tag = out_tag_s(V, p, x, 0, q, q, dq, &dq->tb);
        break;
    }
    default:
        V->err = vfail(p, x, "op kind %s is outside the backward prover's class", cpc_op_kind_name(op->kind));
        return VC_NO;
    }
    /* the table's output content (NONE: carried, set above); what an op other than
     * the step's writes is no recomputed attention result */
    for (int i = 0; i < op->n_out && i < CPC_OP_MAX_BUFS; i++) {
        slot *o = S(V, p, op->out[i]);
        if (info->out_content[i] != CPC_CONTENT_NONE)
            o->src = (cpc_content)info->out_content[i];
        o->fwd = false;
        o->fresh = 0;
        o->wop = x;
    }
    return VC_YES;
}

static vc_rq *dom_rq(void *self, int id);
static int dom_open(void *self, int i);
static void dom_at(void *self, const vc_rq *q);
static void dom_at_writer(void *self, int b);
static vc_tri dom_post(void *self, const cpc_op *op);
static void dom_deliver(void *self, vc_val *dst, vc_val *src, const vc_rq *s);

/* Collectives: the members meet in prove, which fires run_a2a / run_ring_coll / run_all_reduce
 * once every member is there. */
static vc_tri dom_meet(void *self, const cpc_op *op)
{
    (void)op;
    vb *V = DV(self);
    if (V->ind && !V->undec) /* not in an inductive loop's body (loop_inductive) */
        V->undec = "a collective in a loop proven by induction";
    return VC_BLOCKED;
}

/* Rank p's domain for the shared rules and the step (what the backward prover runs through
 * vc_step: every op, its messages through the shared layer). */
static void bwd_domain(bwd_dom *dd, vc_domain *dom)
{
    vb *V = dd->V;
    *dom = (vc_domain){.self = dd, .name = dom_name, .val = dom_val, .writer = dom_writer, .tmp = dom_tmp,
                       .copy = dom_copy, .fits = dom_fits, .put = dom_put, .exchange = dom_exchange,
                       .new_stamp = dom_new_stamp, .shape = dom_shape, .tok_is = dom_tok_is,
                       .heads_are = dom_heads_are, .same_tokens = dom_same_tokens, .same_heads = dom_same_heads,
                       .words = dom_words, .has_keys = dom_has_keys, .attn_keys = dom_attn_keys,
                       .merge_keys = dom_merge_keys, .select_heads = dom_select_heads, .covered = dom_covered,
                       .declared = dom_declared, .sender = dom_sender, .grad_op = dom_grad_op, .p2p_attn = true,
                       .prog = V->prog, .cross = V->prog->layout.cross, .rep = V->prog->layout.rep,
                       .nsend = V->nsend + (size_t)dd->p * V->nb, .rpend = V->rpend + (size_t)dd->p * V->nb,
                       .val_size = sizeof(slot), .rq = dom_rq, .open = dom_open, .at = dom_at,
                       .at_writer = dom_at_writer, .post = dom_post, .meet = dom_meet, .deliver = dom_deliver,
                       .snap_off = offsetof(req, snap)};
    dd->dom = dom;
}

/* The shared rules for the inputs of the collective simulated rank p stands at (vc_coll_inputs:
 * an all_to_all's the rank's own shard or ring block, an all_gather's its ring block; attention
 * results complete, so not recomputed here). */
static cpc_status *coll_inputs(vb *V, int p)
{
    bwd_dom dd = {.V = V, .p = p, .x = &V->ro[p].v[V->pc[p]]};
    vc_domain dom;
    bwd_domain(&dd, &dom);
    char m[640] = "";
    vc_tri t = vc_coll_inputs(&dom, dd.x->op, m, sizeof m);
    return t == VC_YES ? NULL : t == VC_OOM ? &cpc_status_oom : vfail(p, dd.x, "%s", m);
}

/* One op through the shared step on rank p's domain (every op of a backward program: the
 * lifetime and content rules, its meaning, posting and matching (dom_post), the wait): 1 when it
 * ran, 0 when it blocks (a wait whose requests are not all matched yet; a collective, which
 * prove fires once every member is there), -1 on a fault (V->err, at the op the domain stands). */
static int step(vb *V, int p, const xop *x, const vc_domain *dom)
{
    bwd_dom *dd = dom->self;
    dd->x = x;
    char m[640];
    if (x->op->kind == CPC_OP_MERGE) {
        const slot *a = S(V, p, x->op->in[0]), *acc = S(V, p, x->op->out[0]), *accl = S(V, p, x->op->out[1]);
        if (!a->fwd || !acc->fwd || !accl->fwd) { /* not the saved forward output (the class) */
            V->err = vfail(p, x, "merges '%s' into '%s': both must be attention results made here",
                           bn(V, x->op->in[0]), bn(V, x->op->out[0]));
            return -1;
        }
    }
    if (x->op->kind == CPC_OP_SWAP) {
        const cpc_buffer *A = BF(V, x->op->in[0]), *B = BF(V, x->op->in[1]);
        if (A == B || A->role != B->role || A->tokens != B->tokens || A->heads != B->heads) { /* even unwritten */
            V->err = vfail(p, x, "swaps '%s' and '%s' of different layouts", A->name, B->name);
            return -1;
        }
    }
    m[0] = 0;
    V->err = NULL;
    vc_tri t = vc_step(dom, x->op, m, sizeof m);
    if (t == VC_YES || t == VC_BLOCKED)
        return t == VC_YES && cpc_op_info_of(x->op->kind)->match != CPC_MATCH_COLLECTIVE;
    if (!V->err)
        V->err = t == VC_OOM ? cs_err(V) : vfail(p, dd->x, "%s", m);
    return -1;
}

static vc_tri exactly_once(vb *V, const cset *c, bool isq, int own, int nfree, int need, int hlo, int hhi,
                           char *why, size_t n);

/* A recomputed attention result (slot fwd) read by delta or attn_bwd must
 * be complete: every (query block, key block, query head) pair of its rows
 * and the heads its buffer holds exactly once, nothing else; with a causal
 * mask the key blocks entirely above the diagonal may be missing (each at
 * most once; vc_units_needed). */
static cpc_status *recomputed_complete(vb *V, int p, const xop *x, int b)
{
    slot *sl = S(V, p, b);
    if (!sl->fwd || sl->final) /* final: proved complete since it was last written (the loop reads it R times) */
        return NULL;
    int lo, hi, U = V->U, need = (vc_units_needed(&V->prog->layout, sl->tag * U, sl->tag * U + U) + U - 1) / U;
    held_heads(V, b, cp(V, p) % V->U, &lo, &hi);
    char why[400];
    vc_tri t = exactly_once(V, &sl->cnt, true, sl->tag, V->NK, need, lo, hi, why, sizeof why);
    if (t == VC_OOM)
        return &cpc_status_oom;
    if (t != VC_YES)
        return vfail(p, x, "reads '%s', a recomputed attention result %s: %s", bn(V, b),
                     strstr(why, "2 times") ? "whose query rows meet a key block twice"
                     : strstr(why, "0 times") ? "that is incomplete"
                                              : "holding pairs outside its rows and heads",
                     why);
    sl->final = 1;
    return NULL;
}

#define VB_MAX_PENDING 4096 /* requests one rank has in flight (the bound: checks scan them) */

static void req_release(vc_rq *q)
{
    for (int j = 0; j < CPC_OP_MAX_BUFS; j++)
        cs_free(&((req *)q)->snap[j].cnt);
}

/* Symmetric domain: is this message between ring rotations of one member
 * (ring group, or the world when U == 1)? */
static bool rotated(const vb *V, cpc_group g)
{
    return V->sym && (g == CPC_GROUP_RING || (g == CPC_GROUP_WORLD && V->U == 1));
}

/* Takes from queue (*head, *tail) the first request whose sender is `from`
 * on (group, tag) (a send queue holds sends, whose poster is the sender; a
 * recv queue recvs, whose partner is).  Rotated ring messages: `from` is the
 * rotation offset (a send's to its receiver; a recv's from its sender,
 * negated).  -1 when none. */
static int take(vb *V, int *head, int *tail, int from, int g, int tag, bool rot)
{
    for (int prev = -1, id = *head; id >= 0; prev = id, id = RQ(V, id)->next) {
        req *q = RQ(V, id);
        int who = rot ? (q->is_send ? q->to : md32(-(int64_t)q->to, V->R)) : (q->is_send ? q->p : q->to);
        if (who == from && q->group == g && q->tag == tag) {
            if (prev >= 0)
                RQ(V, prev)->next = q->next;
            else
                *head = q->next;
            if (*tail == id)
                *tail = prev;
            q->next = -1;
            return id;
        }
    }
    return -1;
}

/* Content tag `tag` of a buffer with token layout t, seen from the rank e
 * ring positions further (symmetric domain). */
static int rotate_tag(const vb *V, cpc_buf_tokens t, int tag, int64_t e)
{
    if (tag == CPC_TAG_NONE)
        return tag;
    if (t == CPC_TOK_BLOCK)
        return md32((int64_t)tag + e, V->R);
    if (t == CPC_TOK_SHARD)
        return md32((int64_t)tag + e * V->U, V->P);
    return tag;
}

/* What send s's snapshot src is on its receiver (moved): rotated, the
 * content seen from the receiver, -s->to ring positions from the sender. */
static void dom_deliver(void *self, vc_val *dst, vc_val *src, const vc_rq *s)
{
    vb *V = DV(self);
    slot *d = SL(dst), *x = SL(src);
    cset keep = d->cnt;
    *d = *x;
    x->cnt = keep;
    slot_empty(x);
    int64_t e = rotated(V, (cpc_group)s->group) ? -(int64_t)((const req *)s)->to : 0;
    if (e) {
        d->tag = rotate_tag(V, (cpc_buf_tokens)d->tk, d->tag, e);
        cs_rotate(V, &d->cnt, e);
    }
}

static vc_rq *dom_rq(void *self, int id) { return VC_POOL_AT(&DV(self)->reqs, id); }

static int dom_open(void *self, int i)
{
    const vc_open *o = &DV(self)->rr[DP(self)].open;
    return i < o->n ? o->v[i] : -1;
}

/* The domain stands at request q's op (where a fault it meets is reported), or at the end. */
static void dom_at(void *self, const vc_rq *q) { ((bwd_dom *)self)->x = ((const req *)q)->x; }
static void dom_at_writer(void *self, int b) { ((bwd_dom *)self)->x = S(DV(self), DP(self), b)->wop; }

/* A send/recv after the step's checks: posted (vc_post) as one request, met with the first request
 * of its (sender, receiver, group, tag) waiting in the receiver's queues (vc_match on the
 * receiver: the snapshots handed over and checked), else queued.  Rotated ring messages meet the
 * member's own requests: its send at offset d is, seen from rank r + d, a send from offset -d. */
static vc_tri dom_post(void *self, const cpc_op *op)
{
    bwd_dom *dd = self;
    vb *V = dd->V;
    const int p = dd->p;
    const xop *x = dd->x;
    bool rot = rotated(V, op->group), send = op->kind == CPC_OP_SEND;
    rank_reqs *me = &V->rr[p];
    if (me->open.n >= VB_MAX_PENDING) {
        V->err = vfail(p, x, "more than %d requests in flight on one rank (the prover's bound, verify_bwd.h)",
                       VB_MAX_PENDING);
        return VC_NO;
    }
    for (int i = 0; send && i < op->n_in; i++)
        if (S(V, p, op->in[i])->r0) /* twin: the receivers' states would not be the simulated ones */
            V->asym = "a `when r==0` op's result is sent";
    int id = vc_pool_new(&V->reqs, &me->open);
    if (id < 0)
        return VC_OOM;
    req *q = RQ(V, id);
    q->x = x;
    q->p = p;
    q->to = rot ? (int)x->peer : flat_of(V, p, op->group, x->peer);
    q->peer = rot ? -1 : q->to;
    q->on = x->nd;
    q->slo = x->s;
    q->shi = x->s + 1;
    q->blk = (int32_t)x->block;
    q->blkb = (int32_t)x->bs;
    if (!vc_post(dd->dom, op, id))
        return VC_OOM;
    q = RQ(V, id);
    /* the receiver's queues: a send looks among the receiver's recvs, a recv among the sends to it */
    rank_reqs *rr = &V->rr[!send || rot ? p : q->to];
    int who = rot ? (send ? q->to : md32(-(int64_t)q->to, V->R)) : send ? p : q->to;
    int other = send ? take(V, &rr->rh, &rr->rt, who, op->group, op->tag, rot)
                     : take(V, &rr->sh, &rr->st, who, op->group, op->tag, rot);
    if (other < 0) {
        if (send)
            vc_queue_push(&V->reqs, &rr->sh, &rr->st, id);
        else
            vc_queue_push(&V->reqs, &rr->rh, &rr->rt, id);
        return VC_YES;
    }
    int sid = send ? id : other, rid = send ? other : id;
    const req *r = RQ(V, rid), *sq = RQ(V, sid);
    /* a buffer's heads are its member's (a head part): a message carries the sender's part, which
     * must be the receiver's (a ring message stays within one member; one between members of
     * other parts would be read as the receiver's heads, or not fit: the transport's size rule) */
    bool foreign[CPC_OP_MAX_BUFS] = {false};
    for (int j = 0; !rot && j < sq->nb && j < r->nb; j++) {
        int us = cp(V, sq->p) % V->U, ur = cp(V, r->p) % V->U, so, sn, ro, rn;
        cpc_buffer_heads(V->prog, sq->bufs[j], us, &so, &sn);
        cpc_buffer_heads(V->prog, r->bufs[j], ur, &ro, &rn);
        if (sn != rn || (so != ro && is_grad(role(V, r->bufs[j])))) {
            V->err = vfail(r->p, r->x,
                           "'%s' receives heads %d..%d from ulysses member %d's '%s' but holds heads %d..%d (member "
                           "%d's)%s",
                           bn(V, r->bufs[j]), so, so + sn - 1, us, bn(V, sq->bufs[j]), ro, ro + rn - 1, ur,
                           sn != rn ? ": parts of other sizes (the transports refuse the message)" : "");
            return VC_NO;
        }
        foreign[j] = so != ro;
    }
    bwd_dom rd = {.V = V, .p = r->p, .x = r->x};
    vc_domain rdom;
    bwd_domain(&rd, &rdom);
    char m[640] = "";
    V->err = NULL;
    vc_tri t = vc_match(&rdom, sid, rid, m, sizeof m); /* this domain answers YES or NO (or OOM) */
    if (t != VC_YES && t != VC_OOM && !V->err)
        V->err = vfail(r->p, r->x, "%s", m);
    /* data of another member's head part (of the same size) arrives as no content this rank can
     * compute with: harmless unread, refused by the content rule where an op reads it */
    for (int j = 0; t == VC_YES && j < r->nb; j++)
        if (foreign[j])
            RQ(V, rid)->snap[j].src = SRC_FOREIGN;
    return t == VC_YES || t == VC_OOM ? t : VC_NO;
}

/* Runs rank p until it blocks on a wait or reaches a collective (returns 0),
 * ends (1) or fails (-1). */
static int advance(vb *V, int p)
{
    rank_ops *ro = &V->ro[p];
    bwd_dom dd = {.V = V, .p = p, .x = NULL};
    vc_domain dom;
    bwd_domain(&dd, &dom);
    while (V->pc[p] < ro->n) {
        const xop *x = &ro->v[V->pc[p]];
        const cpc_op *op = x->op;
        if (x->mk)
            return 0; /* the induction's marker: every simulated rank stops there (prove) */
        /* the op table's rules, for every op: the kinds a backward program
         * may use, then the step (lifetimes, contents, the op's meaning, the
         * messages), a collective's group */
        const cpc_op_info *info = cpc_op_info_of(op->kind);
        if (!info || !(info->flags & CPC_OPF_BWD)) {
            V->err = vfail(p, x, "op kind %s is outside the backward prover's class", cpc_op_kind_name(op->kind));
            return -1;
        }
        if ((info->match == CPC_MATCH_SEND || info->match == CPC_MATCH_RECV) && info->life != CPC_LIFE_UNTIL_WAIT) {
            V->err = vfail(p, x, "a point-to-point op must be non-blocking (the op table)");
            return -1;
        }
        if (info->match == CPC_MATCH_COLLECTIVE &&
            ((info->group != CPC_GROUP_NONE && op->group != info->group) ||
             (op->group != CPC_GROUP_RING && op->group != CPC_GROUP_ULYSSES && op->group != CPC_GROUP_WORLD))) {
            V->err = vfail(p, x, "%s runs over the %s group", cpc_op_kind_name(op->kind),
                           info->group != CPC_GROUP_NONE ? cpc_group_name(info->group) : "ring, ulysses or world");
            return -1;
        }
        int r = step(V, p, x, &dom);
        if (r <= 0)
            return r; /* -1: a fault (V->err); 0: a wait blocked until the peers post, or a collective
                         (fired by run_a2a / run_ring_coll / run_all_reduce once every member is here) */
        if (op->kind == CPC_OP_WAIT)
            vc_pool_drop_done(&V->reqs, &V->rr[p].open);
        if (V->twin && info->match == CPC_MATCH_NONE) {
            /* ring rank 0's own content: what a `when r==0` op writes, and what is made from it */
            bool t = op->when != NULL && cpc_expr_uses(op->when, 'r');
            for (int i = 0; i < op->n_in && !t; i++)
                t = S(V, p, op->in[i])->r0;
            for (int i = 0; i < op->n_out && t; i++)
                S(V, p, op->out[i])->r0 = true;
        }
        V->pc[p]++;
    }
    return 1;
}

static int cmp_free_heads(const void *a, const void *b)
{
    const hrange *x = a, *y = b;
    return x->j != y->j ? (x->j > y->j) - (x->j < y->j) : (x->lo > y->lo) - (x->lo < y->lo);
}

typedef struct rect {
    int f0, f1, h0, h1;
} rect;

static int cmp_rect_f(const void *a, const void *b)
{
    const rect *x = a, *y = b;
    return (x->f0 > y->f0) - (x->f0 < y->f0);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The exactly-once rule of an OUTPUT gradient by runs, not elements (so
 * independent of R): each run's fixed coordinate (the query block for DQ,
 * the key block otherwise) is `own` on every element, and its free
 * coordinate walks an arc of [0, nfree) with step +-1 (or is one point);
 * the arcs x head intervals must tile [0, nfree) x [0, nh) exactly.  True
 * when they do; false otherwise or when a run is not of that form (then the
 * element-wise check decides and names the first pair). */
static bool cover_fast(const vb *V, const cset *c, bool isq, int own, int nfree)
{
    const int fm = ix_mod(V, nfree), nr = c->n;
    rect *rc = malloc((size_t)(2 * nr + 1) * sizeof *rc);
    int *hb = malloc((size_t)(4 * nr + 2) * sizeof *hb);
    bool ok = rc && hb;
    int n = 0, nh = 0;
    for (int i = 0; i < nr && ok; i++) {
        const run *x = &c->v[i];
        int32_t fs = isq ? x->q0 : x->k0, fd = isq ? x->dq : x->dk, f0 = isq ? x->k0 : x->q0, df = isq ? x->dk : x->dq;
        int fnm = isq ? V->NQ : V->NK, fmod = ix_mod(V, fnm);
        if (fs != own || (x->len >= 2 && !ix_rep(V, fs, fnm) && md32(fd, fmod) != 0)) {
            ok = false;
            break;
        }
        int a, len = x->len;
        if (ix_rep(V, f0, nfree) || len == 1) {
            if (len != 1) {
                ok = false;
                break;
            }
            a = f0;
            rc[n++] = (rect){a, a + 1, x->h0, x->h0 + x->hn};
        } else {
            int d = md32(df, fm);
            if (len > fm || (d != 1 && d != fm - 1)) {
                ok = false;
                break;
            }
            a = d == 1 ? f0 : md32((int64_t)f0 - (len - 1), fm);
            rc[n++] = (rect){a, a + len < fm ? a + len : fm, x->h0, x->h0 + x->hn};
            if (a + len > fm)
                rc[n++] = (rect){0, a + len - fm, x->h0, x->h0 + x->hn};
        }
        hb[nh++] = x->h0;
        hb[nh++] = x->h0 + x->hn;
    }
    if (ok) {
        hb[nh++] = 0;
        hb[nh++] = V->nh;
        qsort(hb, (size_t)nh, sizeof *hb, cmp_int);
        qsort(rc, (size_t)n, sizeof *rc, cmp_rect_f);
        for (int j = 0; j + 1 < nh && ok; j++) {
            int lo = hb[j], hi = hb[j + 1];
            if (hi <= lo || lo < 0 || hi > V->nh)
                continue;
            int at = 0; /* the f covered so far in this head strip: exactly [0, at) */
            for (int i = 0; i < n && ok; i++)
                if (rc[i].h0 <= lo && rc[i].h1 >= hi) {
                    ok = rc[i].f0 == at;
                    at = rc[i].f1;
                } else
                    ok = rc[i].h1 <= lo || rc[i].h0 >= hi; /* partly in the strip: not elementary */
            ok = ok && at == nfree;
        }
    }
    free(rc);
    free(hb);
    return ok;
}

/* The OUTPUT buffers of the program (verify_bwd.h 1): exactly one of each of dq, dk and dv (and one
 * of the replicated rows' with replicated segments), each a shard with every head. */
static cpc_status *check_outputs(const vb *V)
{
    const cpc_layout *L = &V->prog->layout;
    int have[3] = {0, 0, 0}, have_rep[3] = {0, 0, 0};
    for (int b = 0; b < V->nb; b++) {
        const cpc_buffer *B = BF(V, b);
        if (B->io != CPC_IO_OUTPUT)
            continue;
        if (!is_grad(B->role))
            return vfail(-1, NULL, "OUTPUT buffer '%s' has role %s (dq, dk or dv expected)", B->name,
                         cpc_buf_role_name(B->role));
        have[B->role - CPC_ROLE_DQ]++;
        if (L->rep && B->tokens == CPC_TOK_KV)
            have_rep[B->role - CPC_ROLE_DQ]++;
        /* the rank's shard with every head: SHARD, or with U == 1 BLOCK; cross-attention dK/dV and
         * the replicated rows' gradients whole (KV), the same on every rank */
        bool kv = B->tokens == CPC_TOK_KV && ((B->role != CPC_ROLE_DQ && L->cross) || L->rep);
        if (B->heads != CPC_HEADS_ALL ||
            !(B->tokens == CPC_TOK_SHARD || (B->tokens == CPC_TOK_BLOCK && V->U == 1) || kv))
            return vfail(-1, NULL, "OUTPUT '%s' (%s/%s) is not a shard with every head (a head part or a ring "
                                   "block never went back to the sequence layout)",
                         B->name, cpc_buf_tokens_name(B->tokens), cpc_buf_heads_name(B->heads));
    }
    for (int i = 0; i < 3; i++)
        if (have[i] != (L->rep ? 2 : 1) || (L->rep && have_rep[i] != 1))
            return vfail(-1, NULL, "%d OUTPUT buffers of role %s (exactly one expected%s: yunchang #149)", have[i],
                         cpc_buf_role_name((cpc_buf_role)(CPC_ROLE_DQ + i)),
                         L->rep ? ", and one of the replicated segments' rows (kv layout)" : "");
    return NULL;
}

/* Exactly once over a set of (query block, key unit, head) runs: every element's fixed coordinate
 * (the query block when isq, else the key unit) is `own` and its heads in [hlo, hhi); every free
 * coordinate f < need has each head of [hlo, hhi) exactly once, f >= need at most once (a causal
 * mask's skipped blocks).  Each element of a run is an interval of heads at one free coordinate;
 * sorted, they must tile (cover_fast decides on runs first where it applies; element by element
 * names the first pair that fails).  NO: why. */
static vc_tri exactly_once(vb *V, const cset *c, bool isq, int own, int nfree, int need, int hlo, int hhi,
                           char *why, size_t n)
{
    int64_t ne = 0;
    for (int i = 0; i < c->n; i++)
        ne += c->v[i].len;
    if (ne > (int64_t)nfree * (hhi - hlo)) {
        snprintf(why, n, "%lld contributions for %lld (query block, key block, head) triples: some pairs "
                         "contribute 2 times or more",
                 (long long)ne, (long long)nfree * (hhi - hlo));
        return VC_NO;
    }
    if (need == nfree && hlo == 0 && hhi == V->nh && cover_fast(V, c, isq, own, nfree))
        return VC_YES;
    hrange *e = malloc((size_t)(ne > 0 ? ne : 1) * sizeof *e);
    if (!e)
        return VC_OOM;
    int64_t k = 0;
    bool bad = false;
    char hs[48] = "";
    for (int i = 0; i < c->n && !bad; i++) {
        const run *x = &c->v[i];
        for (int t = 0; t < x->len && !bad; t++) {
            int qb = ix(V, x->q0, t, x->dq, V->NQ), kb = ix(V, x->k0, t, x->dk, V->NK);
            if ((isq ? qb != own : kb != own) || x->h0 < hlo || x->h0 + x->hn > hhi) {
                if (V->nh > 1)
                    snprintf(hs, sizeof hs, ", query head %d", x->h0);
                snprintf(why, n, "the pairs (query block %d, key block %d%s) contribute at least once, expected 0 "
                                 "(not this rank's rows, block or heads)", qb, kb, hs);
                bad = true;
            } else
                e[k++] = (hrange){x->h0, x->h0 + x->hn, isq ? kb : qb}; /* j: the free coordinate */
        }
    }
    if (!bad)
        qsort(e, (size_t)k, sizeof *e, cmp_free_heads);
    int64_t i = 0;
    for (int f = 0; f < nfree && !bad; f++) {
        int h = hlo, at = -1;
        const char *how = "0 times";
        for (; i < k && e[i].j == f && at < 0; i++) {
            if (e[i].lo < h || (e[i].lo > h && f < need)) {
                at = e[i].lo < h ? e[i].lo : h;
                how = e[i].lo < h ? "2 times or more" : "0 times";
            }
            h = e[i].hi > h ? e[i].hi : h;
        }
        if (at < 0 && h != hhi && f < need)
            at = h;
        if (at >= 0) {
            if (V->nh > 1)
                snprintf(hs, sizeof hs, ", query head %d", at);
            snprintf(why, n, "the pairs (query block %d, key block %d%s) contribute %s, expected 1", isq ? own : f,
                     isq ? f : own, hs, how);
            bad = true;
        }
    }
    free(e);
    return bad ? VC_NO : VC_YES;
}

/* An OUTPUT gradient sl on simulated rank p (the domain's `covered`, from vc_output): this rank's own
 * rows or block, and exactly once: DQ every (r, k, h); DK/DV every (q, r, h); cross dK/dV every
 * (q, 0, h); the replicated rows' every (R, k, h) / (q, R, h).  NO: why (after "the OUTPUT buffer
 * NAME: "). */
static vc_tri grad_covered(vb *V, int p, const slot *sl, char *why, size_t n)
{
    const cpc_layout *L = &V->prog->layout;
    bool isq = sl->role == CPC_ROLE_DQ;
    bool kvout = sl->tk == CPC_TOK_KV && !isq && L->cross, repout = sl->tk == CPC_TOK_KV && L->rep;
    if (!kvout && !repout && sl->tag != cp(V, p)) {
        snprintf(why, n, "it ends holding %s %d, not this rank's own %d", isq ? "rows of shard" : "the gradient of block",
                 sl->tag, cp(V, p));
        return VC_NO;
    }
    int nfree = isq ? V->NK : V->NQ;
    return exactly_once(V, &sl->cnt, isq, repout ? V->R : kvout ? 0 : cp(V, p) / V->U, nfree, nfree, 0, V->nh, why,
                        n);
}

/* The INPUT layouts the executor fills: q/k/v/dout/out shards with every
 * head (with U == 1 also as BLOCK r == shard r); the saved LSE in the
 * forward's attention layout (SHARD with U == 1, BLOCK/PART with U > 1). */
static cpc_status *check_input(const vb *V, const cpc_buffer *B)
{
    bool ok;
    const bool rep = V->prog->layout.rep && B->tokens == CPC_TOK_KV;
    if (B->role == CPC_ROLE_LSE)
        ok = V->U == 1 ? (B->tokens == CPC_TOK_SHARD || rep) && B->heads == CPC_HEADS_ALL
                       : (B->tokens == CPC_TOK_BLOCK || rep) && B->heads == CPC_HEADS_PART;
    else if (rep) /* replicated segments' rows, whole */
        ok = (B->role == CPC_ROLE_Q || B->role == CPC_ROLE_K || B->role == CPC_ROLE_V || B->role == CPC_ROLE_DO ||
              B->role == CPC_ROLE_O) && B->heads == CPC_HEADS_ALL;
    else
        ok = (B->role == CPC_ROLE_Q || is_kvr(B->role) || B->role == CPC_ROLE_DO || B->role == CPC_ROLE_O) &&
             !is_grad(B->role) && B->heads == CPC_HEADS_ALL &&
             (B->tokens == CPC_TOK_SHARD || (B->tokens == CPC_TOK_BLOCK && V->U == 1) ||
              (B->tokens == CPC_TOK_KV && V->prog->layout.cross && (B->role == CPC_ROLE_K || B->role == CPC_ROLE_V)));
    if (ok)
        return NULL;
    return vfail(-1, NULL, "INPUT buffer '%s' (role %s, %s/%s) is not a layout the runtime fills", B->name,
                 cpc_buf_role_name(B->role), cpc_buf_tokens_name(B->tokens), cpc_buf_heads_name(B->heads));
}

/* ---- the symmetric domain's class ------------------------------------------------ */

/* Does the subtree at node i read the rank (r or p)? */
static bool reads_rank(const cpc_expr *e, int i)
{
    cpc_expr_node n;
    if (!cpc_expr_node_at(e, i, &n))
        return true;
    if (n.kind == CPC_EX_VAR)
        return n.var == 'r' || n.var == 'p';
    return (n.a >= 0 && reads_rank(e, n.a)) || (n.b >= 0 && reads_rank(e, n.b));
}

/* Is the subtree at node i `r + g`: the rank once, with coefficient +1,
 * through + and - only, g free of r and p (p is r when U == 1)? */
static bool unit_chain(const vb *V, const cpc_expr *e, int i)
{
    cpc_expr_node n;
    if (!cpc_expr_node_at(e, i, &n))
        return false;
    if (n.kind == CPC_EX_VAR)
        return n.var == 'r' || (n.var == 'p' && V->U == 1);
    if (n.kind == CPC_EX_ADD) {
        bool ra = reads_rank(e, n.a), rb = reads_rank(e, n.b);
        return ra != rb && unit_chain(V, e, ra ? n.a : n.b);
    }
    if (n.kind == CPC_EX_SUB)
        return !reads_rank(e, n.b) && unit_chain(V, e, n.a);
    return false;
}

/* The forms a ring peer or block may take in the symmetric domain: 1 for
 * (r + g) % R, 2 for r + g (g must then be 0, checked when evaluated), 0
 * for anything else.  Then the value on rank r is the value on rank 0 plus
 * r (mod R): the program commutes with rotations of the ring. */
static int unit_form(const vb *V, const cpc_expr *e)
{
    cpc_expr_node n, m;
    if (!e || !cpc_expr_node_at(e, cpc_expr_root(e), &n))
        return 0;
    if (n.kind == CPC_EX_MOD && cpc_expr_node_at(e, n.b, &m) &&
        ((m.kind == CPC_EX_VAR && (m.var == 'R' || (m.var == 'P' && V->U == 1))) ||
         (m.kind == CPC_EX_NUM && m.val == V->R)))
        return unit_chain(V, e, n.a) ? 1 : 0;
    return unit_chain(V, e, cpc_expr_root(e)) ? 2 : 0;
}

/* Is `when` exactly `r==0` (or `0==r`): ring rank 0 only? */
static bool is_r0_guard(const cpc_expr *e)
{
    cpc_expr_node n, a, b;
    if (!e || !cpc_expr_node_at(e, cpc_expr_root(e), &n) || n.kind != CPC_EX_EQ ||
        !cpc_expr_node_at(e, n.a, &a) || !cpc_expr_node_at(e, n.b, &b))
        return false;
    return (a.kind == CPC_EX_VAR && a.var == 'r' && b.kind == CPC_EX_NUM && b.val == 0) ||
           (b.kind == CPC_EX_VAR && b.var == 'r' && a.kind == CPC_EX_NUM && a.val == 0);
}

/* Does any op (loop bodies too) have the guard `r==0`? */
static bool has_r0_guard(const cpc_op *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (is_r0_guard(ops[i].when) || (ops[i].kind == CPC_OP_LOOP && has_r0_guard(ops[i].body, ops[i].n_body)))
            return true;
    return false;
}

/* Is the program in the symmetric class?  NULL if so, else why not (for
 * the CP051 when the world is too large to enumerate). */
static const char *sym_class(const vb *V, const cpc_op *ops, int n, int depth, const cpc_op **at)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        *at = op;
        bool g0 = is_r0_guard(op->when);
        if (g0 && (cpc_op_info_of(op->kind)->match != CPC_MATCH_NONE || op->kind == CPC_OP_LOOP ||
                   op->kind == CPC_OP_SWAP))
            return "a `when r==0` op that communicates, loops or swaps";
        if ((op->when && !g0 && (cpc_expr_uses(op->when, 'r') || cpc_expr_uses(op->when, 'p'))) ||
            (op->count && (cpc_expr_uses(op->count, 'r') || cpc_expr_uses(op->count, 'p'))))
            return "its `when` or `count` reads r or p other than as `r==0`: the ranks do not all run the same "
                   "ops";
        if (op->kind == CPC_OP_SEND || op->kind == CPC_OP_RECV) {
            bool ring = op->group == CPC_GROUP_RING || (op->group == CPC_GROUP_WORLD && V->U == 1);
            if (ring ? !unit_form(V, op->peer)
                     : op->group != CPC_GROUP_ULYSSES || !op->peer || cpc_expr_uses(op->peer, 'r') ||
                           cpc_expr_uses(op->peer, 'p'))
                return "its peer is not (r + g) % R in the ring group (g not reading r or p), or a ulysses "
                       "member that does not read r or p";
        }
        if (op->block && !unit_form(V, op->block))
            return "its block is not (r + g) % R (g not reading r or p)";
        if (op->kind == CPC_OP_LOOP) {
            if (depth >= 8)
                return "loops nest deeper than 8";
            const char *why = sym_class(V, op->body, op->n_body, depth + 1, at);
            if (why)
                return why;
        }
    }
    return NULL;
}

/* Do the ops commute with rotating u (verify_bwd.h ROTATIONS OF U)?  No
 * `when`, count, peer or block reads u; no point-to-point message in the
 * ulysses or world group. */
static bool usym_ops(const cpc_op *ops, int n)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        if ((op->when && cpc_expr_uses(op->when, 'u')) || (op->count && cpc_expr_uses(op->count, 'u')) ||
            (op->peer && cpc_expr_uses(op->peer, 'u')) || (op->block && cpc_expr_uses(op->block, 'u')) ||
            ((op->kind == CPC_OP_SEND || op->kind == CPC_OP_RECV) && op->group != CPC_GROUP_RING) ||
            (op->kind == CPC_OP_LOOP && !usym_ops(op->body, op->n_body)))
            return false;
    }
    return true;
}

/* One ulysses member for all (ROTATIONS OF U): the ops commute with
 * rotating u, and member u holds heads [u*w, (u+1)*w) of every head-part
 * buffer, w = H / U (query heads and K/V heads alike: H and Hkv divisible by
 * U, so no K/V head is shared and the GQA groups move with the heads). */
static bool usym_class(const vb *V)
{
    const cpc_layout *L = &V->prog->layout;
    if (V->U < 2 || L->cross || L->H % V->U || L->Hkv % V->U || V->nh != L->H ||
        !usym_ops(V->prog->ops, V->prog->n_ops))
        return false;
    const int w = L->H / V->U, us[3] = {0, 1, V->U - 1};
    for (int b = 0; b < V->nb; b++) {
        if (V->prog->buffers[b].heads != CPC_HEADS_PART)
            continue;
        for (int i = 0; i < 3; i++) {
            int lo, hi;
            held_heads(V, b, us[i], &lo, &hi);
            if (lo != us[i] * w || hi != lo + w)
                return false;
        }
    }
    return true;
}

static void uclass_free(uclasses *C)
{
    for (int k = 0; k < 2; k++) {
        free(C->reg[k].rc);
        C->reg[k].rc = NULL;
    }
}

/* uc: [lo, hi) of class i's representative as member v holds it (uc_move
 * on an interval): false when that is not one interval. */
static bool uc_interval(const uclasses *C, int i, int v, int H, int *lo, int *hi)
{
    const uregion *R = &C->reg[C->reg_of[i]];
    const int64_t av = uc_first(R, v), ar = uc_first(R, C->mem[i]);
    if (*lo == 0 && *hi == H)
        return true; /* every head: kept by every move */
    if (!C->in[i]) {
        *lo = (int)(*lo + av - ar);
        *hi = (int)(*hi + av - ar);
        return *lo >= 0 && *hi <= H;
    }
    const int g = C->g;
    if (*lo == ar && *hi == ar + R->n) { /* the representative's part: v's */
        *lo = (int)av;
        *hi = (int)(av + R->n);
        return true;
    }
    if (*lo == ar / g * g && *hi == *lo + g) { /* its group: v's */
        *lo = (int)(av / g * g);
        *hi = *lo + g;
        return true;
    }
    return false;
}

/* The classes of U (verify_bwd.h CLASSES OF U) when the ops commute with
 * moving u but the heads do not divide evenly (or the K/V heads not by U):
 * false when the program is outside (then every member is simulated).
 * uclass_free frees it either way. */
static bool uclass_build(const vb *V, uclasses *C)
{
    const cpc_layout *L = &V->prog->layout;
    const int U = V->U, H = L->H, Hkv = L->Hkv, g = L->group;
    memset(C, 0, sizeof *C);
    if (U < 2 || L->cross || V->nh != H || H < U || Hkv < 1 || g < 1 || (int64_t)Hkv * g != H ||
        !usym_ops(V->prog->ops, V->prog->n_ops))
        return false;
    C->g = g;
    const int w = H / U, m0 = H % U;
    const int ru0[2] = {0, m0}, rcnt[2] = {m0, U - m0}, rn[2] = {w + 1, w};
    for (int k = 0; k < 2; k++) {
        if (rcnt[k] == 0)
            continue;
        uregion *R = &C->reg[C->nreg];
        R->u0 = ru0[k];
        R->cnt = rcnt[k];
        R->n = rn[k];
        R->a0 = (int)((int64_t)ru0[k] * (w + 1)); /* tensor_split: the first m0 members hold w + 1 heads */
        R->T = Hkv == 1 ? 1 : g / (int)vc_gcd(R->n, g);
        int nres = R->T < R->cnt ? R->T : R->cnt, inc = -1;
        R->rc = malloc((size_t)nres * sizeof *R->rc);
        if (!R->rc)
            return false;
        R->one = true;
        for (int t = 0; t < nres; t++) {
            int64_t a = R->a0 + (int64_t)t * R->n;
            bool in = Hkv > 1 && R->n < g && a % g + R->n <= g; /* the part lies in one GQA group */
            if (in && inc >= 0) {
                R->rc[t] = inc;
            } else {
                if (C->ncls == VB_MAX_CLASSES)
                    return false;
                C->mem[C->ncls] = R->u0 + t;
                C->reg_of[C->ncls] = C->nreg;
                C->in[C->ncls] = in;
                R->rc[t] = C->ncls++;
                if (in)
                    inc = R->rc[t];
            }
            R->one = R->one && R->rc[t] == R->rc[0];
        }
        C->nreg++;
    }
    /* The layout agrees: members v of each class (its first two and its last in the region)
     * hold n query heads from a0 + (v - u0) * n, and every head-part buffer the
     * representative's range moved to v (uc_interval: by a_v - a_rep, a multiple of g; in one
     * group: the part to v's part, the group to v's group), or every head on both (one K/V
     * head: every member holds it). */
    for (int i = 0; i < C->ncls; i++) {
        const uregion *R = &C->reg[C->reg_of[i]];
        int vs[3] = {-1, -1, -1}, nv = 0;
        for (int t = C->mem[i] - R->u0; t < R->cnt && nv < 2; t++)
            if (R->rc[t % R->T] == i)
                vs[nv++] = R->u0 + t;
        for (int t = R->cnt - 1; t >= 0; t--)
            if (R->rc[t % R->T] == i) {
                vs[2] = R->u0 + t;
                break;
            }
        for (int j = 0; j < 3; j++) {
            int v = vs[j], qo, qn;
            if (v < 0)
                continue;
            cpc_layout_q_heads(L, v, &qo, &qn);
            if (qn != R->n || qo != uc_first(R, v) || (Hkv > 1 && !C->in[i] && (uc_first(R, v) - uc_first(R, C->mem[i])) % g))
                return false;
            for (int b = 0; b < V->nb; b++) {
                if (V->prog->buffers[b].heads != CPC_HEADS_PART)
                    continue;
                int lo, hi, lv, hv;
                held_heads(V, b, C->mem[i], &lo, &hi);
                held_heads(V, b, v, &lv, &hv);
                if (!uc_interval(C, i, v, H, &lo, &hi) || lo != lv || hi != hv)
                    return false;
            }
        }
    }
    return true;
}

/* Symmetric domain: what the rank (0, u) evaluated for a peer or block must
 * hold on every ring position: v(R-1) = v(0) + R - 1 (mod R), evaluating
 * (so that no rank's evaluation fails: the chain is monotone in r), and for
 * the unreduced form r + g, g = 0. */
static cpc_status *sym_eval_check(const vb *V, const cpc_exec_op *x, const cpc_expr *e, int64_t v0)
{
    if (!e)
        return NULL;
    cpc_coords c = x->c;
    c.r = V->R - 1;
    c.p = (int64_t)(V->R - 1) * V->U + c.u;
    int64_t v1;
    cpc_status *st = cpc_expr_eval(e, &c, &v1);
    if (st)
        return st;
    int f = unit_form(V, e);
    if ((f == 2 && v0 != 0) || md32(v1 - v0, V->R) != md32(V->R - 1, V->R))
    {
        char where[320];
        return bfail(x->op->span,
                     vc_op_desc(vc_node_of(V->nodes, V->prog->n_ops, x->op), x->c.s, x->depth ? x->c.s + 1 : x->c.s,
                                where, sizeof where),
                     "`%s` is %lld on rank 0 and %lld on rank %d: not a rotation of the ring", cpc_expr_text(e),
                     (long long)v0, (long long)v1, V->R - 1);
    }
    return NULL;
}

typedef struct collect_ctx {
    vb *V;
    rank_ops *ro;
    bool back;  /* twin, ranks r != 0: walked as ring rank 1, every ring peer and block seen from rank 0 */
    bool slope; /* the induction's symbolic step: each block's slope in s too (xop bs) */
    int nmark;  /* the induction's markers so far */
} collect_ctx;

#define VB_MAX_INSTANCES ((int64_t)1 << 23) /* op instances simulated, all ranks together */

static cpc_status *collect_checked(void *ctx, const cpc_exec_op *x)
{
    collect_ctx *cc = ctx;
    vb *V = cc->V;
    if (++V->work > VB_MAX_INSTANCES)
        return bfail(x->op->span, NULL, "more than %lld op instances to simulate (the prover's bound, verify_bwd.h)",
                     (long long)VB_MAX_INSTANCES);
    cpc_exec_op y = *x;
    if (V->sym) {
        cpc_status *st = NULL;
        bool pr = (x->op->kind == CPC_OP_SEND || x->op->kind == CPC_OP_RECV) && rotated(V, x->op->group);
        /* the class: the value on rank 1 is rank 0's + 1 (mod R; checked below at R-1) */
        if (cc->back && pr)
            y.peer = md32(x->peer - 1, V->R);
        if (cc->back && x->op->block)
            y.block = unit_form(V, x->op->block) == 1 ? md32(x->block - 1, V->R) : x->block - 1;
        if (pr)
            st = sym_eval_check(V, &y, x->op->peer, y.peer);
        if (!st && x->op->block)
            st = sym_eval_check(V, &y, x->op->block, y.block);
        if (st)
            return st;
    }
    cpc_status *st = collect(V, cc->ro, &y);
    if (!st && cc->slope && x->op->block) { /* the block one step on (LOOPS BY INDUCTION) */
        cpc_coords c1 = x->c;
        c1.s++;
        int64_t b1 = x->block;
        if ((st = cpc_expr_eval(x->op->block, &c1, &b1))) {
            cpc_status_free(st);
            st = NULL;
            V->undec = "a block does not evaluate one step on";
        }
        cc->ro->v[cc->ro->n - 1].bs = md32(b1 - x->block, V->R);
    }
    return st;
}

/* ---- loops by induction (verify_bwd.h LOOPS BY INDUCTION) ---------------------------------------- */

#define IND_WARM 2 /* concrete steps of a phase before its state is taken */
#define IND_MIN 6  /* phases shorter than this are unrolled */

/* Does the subtree at node i read variable v? */
static bool reads_var(const cpc_expr *e, int i, char v)
{
    cpc_expr_node n;
    if (!cpc_expr_node_at(e, i, &n))
        return true;
    if (n.kind == CPC_EX_VAR)
        return n.var == v;
    return (n.a >= 0 && reads_var(e, n.a, v)) || (n.b >= 0 && reads_var(e, n.b, v));
}

/* Is the subtree at node i `c*s + k` through +, - and unary - only, with k
 * free of s?  *c its coefficient; with coords, *k its value where it can be
 * computed from NUM, VAR, +, -, unary - and * alone (false otherwise, or on
 * overflow).  Without coords k is not computed. */
static bool s_lin(const cpc_expr *e, int i, const cpc_coords *c, int64_t *co, int64_t *k)
{
    cpc_expr_node n;
    if (!cpc_expr_node_at(e, i, &n))
        return false;
    int64_t ca = 0, cb = 0, ka = 0, kb = 0;
    switch (n.kind) {
    case CPC_EX_NUM:
        *co = 0, *k = n.val;
        return true;
    case CPC_EX_VAR:
        *co = n.var == 's';
        *k = !c || n.var == 's' ? 0
             : n.var == 'r'     ? c->r
             : n.var == 'u'     ? c->u
             : n.var == 'p'     ? c->p
             : n.var == 'R'     ? c->R
             : n.var == 'U'     ? c->U
                                : c->P;
        return true;
    case CPC_EX_NEG:
        if (!s_lin(e, n.a, c, &ca, &ka))
            return false;
        *co = -ca, *k = -ka;
        return true;
    case CPC_EX_ADD:
    case CPC_EX_SUB:
        if (!s_lin(e, n.a, c, &ca, &ka) || !s_lin(e, n.b, c, &cb, &kb))
            return false;
        if (n.kind == CPC_EX_SUB)
            cb = -cb, kb = -kb;
        *co = ca + cb;
        return !__builtin_add_overflow(ka, kb, k) && *co >= -(1 << 20) && *co <= (1 << 20);
    case CPC_EX_MUL:
        if (reads_var(e, i, 's') || !s_lin(e, n.a, c, &ca, &ka) || !s_lin(e, n.b, c, &cb, &kb))
            return false;
        *co = 0;
        return !__builtin_mul_overflow(ka, kb, k);
    default:
        if (c || reads_var(e, i, 's'))
            return false;
        *co = 0, *k = 0; /* free of s; its value is not needed without coords */
        return true;
    }
}

/* The steps where the truth of `when` (subtree i) may change: every
 * comparison of two sides linear in s (coefficients differing by 0 or 1) is
 * constant between the cuts added (t and t + 1 around the step t where both
 * sides meet), and so is any and/or/not of them.  False when the guard is
 * outside that grammar. */
static bool guard_cuts(const cpc_expr *e, int i, const cpc_coords *c, int64_t N, int64_t *cuts, int *nc, int cap)
{
    cpc_expr_node n;
    if (!cpc_expr_node_at(e, i, &n))
        return false;
    if (!reads_var(e, i, 's'))
        return true;
    switch (n.kind) {
    case CPC_EX_NOT:
        return guard_cuts(e, n.a, c, N, cuts, nc, cap);
    case CPC_EX_AND:
    case CPC_EX_OR:
        return guard_cuts(e, n.a, c, N, cuts, nc, cap) && guard_cuts(e, n.b, c, N, cuts, nc, cap);
    case CPC_EX_LT:
    case CPC_EX_LE:
    case CPC_EX_GT:
    case CPC_EX_GE:
    case CPC_EX_EQ:
    case CPC_EX_NE: {
        int64_t ca, cb, ka, kb;
        if (!s_lin(e, n.a, c, &ca, &ka) || !s_lin(e, n.b, c, &cb, &kb))
            return false;
        int64_t d = ca - cb, k;
        if (d == 0)
            return true;
        if ((d != 1 && d != -1) || __builtin_sub_overflow(kb, ka, &k))
            return false;
        int64_t t = d * k; /* both sides meet at s = t */
        for (int64_t x = t; x <= t + 1; x++)
            if (x > 0 && x < N) {
                if (*nc >= cap)
                    return false;
                cuts[(*nc)++] = x;
            }
        return true;
    }
    default:
        return false;
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* May the loop (at top level) be proven by induction?  Its body: no loops,
 * no collectives or recomputed attention; `when`s in the grammar of
 * guard_cuts reading neither the rank nor u; peers free of s; blocks free
 * of s or (r + g) % R with g linear in s.  Then every op's value on step s
 * is affine in s (mod R) and every `when` constant between the cuts. */
static bool loop_inductive(const vb *V, const cpc_op *loop)
{
    if (!V->ind_on || !loop->count || cpc_expr_uses(loop->count, 'u'))
        return false;
    for (int i = 0; i < loop->n_body; i++) {
        const cpc_op *op = &loop->body[i];
        switch (op->kind) {
        case CPC_OP_SEND:
        case CPC_OP_RECV:
        case CPC_OP_WAIT:
        case CPC_OP_SWAP:
        case CPC_OP_ATTN_BWD:
        case CPC_OP_ADD:
        case CPC_OP_COPY:
            break;
        case CPC_OP_INIT_ACC:
            for (int j = 0; j < op->n_out; j++)
                if (op->out[j] < 0 || op->out[j] >= V->nb || !is_grad(role(V, op->out[j])))
                    return false;
            break;
        default:
            return false;
        }
        if (op->when && (cpc_expr_uses(op->when, 'r') || cpc_expr_uses(op->when, 'u') ||
                         cpc_expr_uses(op->when, 'p')))
            return false;
        if (op->peer && cpc_expr_uses(op->peer, 's'))
            return false;
        if (op->block && cpc_expr_uses(op->block, 's')) {
            cpc_expr_node n;
            int64_t co, k;
            if (unit_form(V, op->block) != 1 || !cpc_expr_node_at(op->block, cpc_expr_root(op->block), &n) ||
                !s_lin(op->block, n.a, NULL, &co, &k))
                return false;
        }
    }
    return true;
}

/* An induction marker (MK_*) after the op instances so far: every simulated rank meets the same
 * markers in the same order (peer: its number). */
static cpc_status *iw_mark(collect_ctx *cc, const cpc_op *loop, int mk, int64_t s, int64_t jn)
{
    cpc_exec_op x = {.op = loop, .c = {0}, .depth = 0, .peer = -1, .block = -1};
    cpc_status *st = collect(cc->V, cc->ro, &x);
    if (st)
        return st;
    xop *y = &cc->ro->v[cc->ro->n - 1];
    y->mk = mk;
    y->jn = jn;
    y->s = s;
    y->peer = cc->nmark++;
    return NULL;
}

/* The walk's loop callback: a top-level loop of IND_MIN steps or more in the class
 * (loop_inductive) whose `when`s are constant on phases (guard_cuts, checked by evaluation at
 * both ends of each) is walked by phases: each of IND_MIN steps or more as IND_WARM concrete
 * steps, SNAP, one concrete step, SLOPE, the symbolic step (blocks with slopes), JUMP over the
 * rest; shorter phases unrolled.  Any other loop the walk unrolls. */
static cpc_status *iw_loop(void *ctx, cpc_walk *w, const cpc_op *loop, int64_t N, cpc_coords c, int depth,
                           bool *ran)
{
    collect_ctx *cc = ctx;
    if (!cc->V->ind_on || depth || N < IND_MIN || !loop_inductive(cc->V, loop))
        return NULL;
    int cap = 8 + 4 * 16 * (loop->n_body + 1), nc = 0;
    int64_t *cuts = malloc((size_t)cap * sizeof *cuts);
    if (!cuts)
        return &cpc_status_oom;
    cuts[nc++] = 0;
    cuts[nc++] = N;
    bool ok = true;
    for (int i = 0; i < loop->n_body && ok; i++)
        ok = !loop->body[i].when || guard_cuts(loop->body[i].when, cpc_expr_root(loop->body[i].when), &c, N, cuts,
                                               &nc, cap);
    qsort(cuts, (size_t)nc, sizeof *cuts, cmp_i64);
    for (int k = 0; k + 1 < nc && ok; k++) /* the grammar's claim against the evaluator, at both ends */
        for (int i = 0; i < loop->n_body && ok && cuts[k + 1] > cuts[k]; i++) {
            const cpc_expr *g = loop->body[i].when;
            int64_t v0, v1;
            cpc_coords c0 = c, c1 = c;
            c0.s = cuts[k], c1.s = cuts[k + 1] - 1;
            cpc_status *e0 = g ? cpc_expr_eval(g, &c0, &v0) : NULL, *e1 = g && !e0 ? cpc_expr_eval(g, &c1, &v1) : NULL;
            ok = !g || (!e0 && !e1 && (v0 != 0) == (v1 != 0));
            cpc_status_free(e0);
            cpc_status_free(e1);
        }
    *ran = ok;
    cpc_status *st = NULL;
    for (int k = 0; k + 1 < nc && ok && !st; k++) {
        int64_t a = cuts[k], b = cuts[k + 1], s = a;
        if (b - a >= IND_MIN) {
            for (; s < a + IND_WARM + 1 && !st; s++) {
                if (s == a + IND_WARM)
                    st = iw_mark(cc, loop, MK_SNAP, s, 0);
                c.s = s;
                if (!st)
                    st = cpc_walk_body(w, loop, c, depth);
            }
            if (!st)
                st = iw_mark(cc, loop, MK_SLOPE, s, 0);
            c.s = s;
            cc->slope = true;
            if (!st)
                st = cpc_walk_body(w, loop, c, depth);
            cc->slope = false;
            if (!st)
                st = iw_mark(cc, loop, MK_JUMP, s, b - s - 1);
            s = b;
        }
        for (; s < b && !st; s++) {
            c.s = s;
            st = cpc_walk_body(w, loop, c, depth);
        }
    }
    free(cuts);
    return st;
}

/* ---- the state at a step boundary, as the induction compares it ---- */

typedef struct vsnap {
    slot *slots;          /* [nsim * nb]: copies (runs deep) */
    int *map;             /* [nsim * nb] */
    int32_t *nsend, *rpend; /* [nsim * nb] */
    req *reqs;            /* every simulated rank's posted requests, rank by rank (snapshots' runs deep) */
    int *nreq;            /* [nsim] */
    int *queues;          /* per rank: its send queue, -1, its recv queue, -1 (indices into reqs) */
    int nr, nq;
    int32_t stamps;
} vsnap;

static void vsnap_free(vb *V, vsnap *S)
{
    if (!S)
        return;
    size_t ns = (size_t)V->nsim * (size_t)(V->nb > 0 ? V->nb : 1);
    if (S->slots)
        for (size_t i = 0; i < ns; i++)
            cs_free(&S->slots[i].cnt);
    for (int i = 0; S->reqs && i < S->nr; i++)
        for (int j = 0; j < CPC_OP_MAX_BUFS; j++)
            cs_free(&S->reqs[i].snap[j].cnt);
    free(S->slots);
    free(S->map);
    free(S->nsend);
    free(S->rpend);
    free(S->reqs);
    free(S->nreq);
    free(S->queues);
    free(S);
}

/* Index of request id among every rank's posted ones (rank by rank); -2 if none. */
static int req_index(const vb *V, int id)
{
    int base = 0;
    for (int p = 0; p < V->nsim; p++) {
        for (int j = 0; j < V->rr[p].open.n; j++)
            if (V->rr[p].open.v[j] == id)
                return base + j;
        base += V->rr[p].open.n;
    }
    return -2;
}

static bool slot_dup(slot *d, const slot *s)
{
    *d = *s;
    d->cnt = (cset){0};
    if (!s->cnt.n)
        return true;
    d->cnt.v = malloc((size_t)s->cnt.n * sizeof *d->cnt.v);
    if (!d->cnt.v)
        return false;
    memcpy(d->cnt.v, s->cnt.v, (size_t)s->cnt.n * sizeof *d->cnt.v);
    d->cnt.n = d->cnt.cap = s->cnt.n;
    return true;
}

static vsnap *vsnap_take(vb *V)
{
    size_t ns = (size_t)V->nsim * (size_t)(V->nb > 0 ? V->nb : 1);
    vsnap *S = calloc(1, sizeof *S);
    if (!S)
        return NULL;
    int nr = 0, nq = 0;
    for (int p = 0; p < V->nsim; p++) {
        nr += V->rr[p].open.n;
        for (int id = V->rr[p].sh; id >= 0; id = RQ(V, id)->next)
            nq++;
        for (int id = V->rr[p].rh; id >= 0; id = RQ(V, id)->next)
            nq++;
        nq += 2;
    }
    S->slots = calloc(ns, sizeof *S->slots);
    S->map = malloc(ns * sizeof *S->map);
    S->nsend = malloc(ns * sizeof *S->nsend);
    S->rpend = malloc(ns * sizeof *S->rpend);
    S->reqs = calloc((size_t)(nr ? nr : 1), sizeof *S->reqs);
    S->nreq = malloc((size_t)V->nsim * sizeof *S->nreq);
    S->queues = malloc((size_t)(nq ? nq : 1) * sizeof *S->queues);
    S->nr = nr;
    S->nq = nq;
    S->stamps = V->stamps;
    bool ok = S->slots && S->map && S->nsend && S->rpend && S->reqs && S->nreq && S->queues;
    for (size_t i = 0; i < ns && ok; i++)
        ok = slot_dup(&S->slots[i], &V->slots[i]);
    if (ok) {
        memcpy(S->map, V->map, ns * sizeof *S->map);
        memcpy(S->nsend, V->nsend, ns * sizeof *S->nsend);
        memcpy(S->rpend, V->rpend, ns * sizeof *S->rpend);
    }
    int k = 0, m = 0;
    for (int p = 0; p < V->nsim && ok; p++) {
        S->nreq[p] = V->rr[p].open.n;
        for (int j = 0; j < V->rr[p].open.n && ok; j++, k++) {
            const req *q = RQ(V, V->rr[p].open.v[j]);
            S->reqs[k] = *q;
            for (int b = 0; b < CPC_OP_MAX_BUFS; b++)
                S->reqs[k].snap[b].cnt = (cset){0};
            for (int b = 0; b < q->nb && ok; b++)
                ok = slot_dup(&S->reqs[k].snap[b], &q->snap[b]);
        }
        for (int h = 0; h < 2; h++) {
            for (int id = h ? V->rr[p].rh : V->rr[p].sh; id >= 0; id = RQ(V, id)->next)
                S->queues[m++] = req_index(V, id);
            S->queues[m++] = -1;
        }
    }
    if (!ok) {
        vsnap_free(V, S);
        return NULL;
    }
    return S;
}

enum { SM_SLOPE, SM_CHECK, SM_JUMP };

/* One numeric field of the state: *cv with slope *cb now, sv with slope sb
 * in the snapshot.  mod: R (a ring index), 0 (a length), -1 (must not follow
 * s).  SM_SLOPE: the slope := now - snapshot.  SM_CHECK: now = snapshot +
 * its slope, with the same slope (the symbolic step came back to the state
 * one step on).  SM_JUMP: n steps on. */
static bool fld(int mode, int64_t mod, int64_t n, int *cv, int32_t *cb, int sv, int32_t sb)
{
    switch (mode) {
    case SM_SLOPE:
        if (mod < 0) {
            *cb = 0;
            return *cv == sv;
        }
        *cb = mod ? md32((int64_t)*cv - sv, mod) : *cv - sv;
        return true;
    case SM_CHECK:
        if (mod < 0)
            return *cv == sv && *cb == 0 && sb == 0;
        if (mod)
            return md32((int64_t)*cv - sv - sb, mod) == 0 && md32((int64_t)*cb - sb, mod) == 0;
        return (int64_t)*cv == (int64_t)sv + sb && *cb == sb;
    default:
        if (mod > 0)
            *cv = md32((int64_t)*cv + n * *cb, mod);
        else if (mod == 0) {
            int64_t v = (int64_t)*cv + n * (int64_t)*cb;
            if (v < 0 || v > INT32_MAX)
                return false;
            *cv = (int)v;
        }
        *cb = 0;
        return true;
    }
}

static bool slot_pair(const vb *V, int mode, int64_t n, slot *c, const slot *s)
{
    static const slot none = {.tag = CPC_TAG_NONE};
    if (!s)
        s = &none;
    if (mode != SM_JUMP &&
        (c->written != s->written || c->src != s->src || c->final != s->final || c->fresh != s->fresh ||
         c->merged != s->merged || c->stamp != s->stamp || c->kvcov != s->kvcov || c->grad != s->grad ||
         c->fwd != s->fwd || c->r0 != s->r0 || c->role != s->role || c->tk != s->tk || c->hd != s->hd ||
         c->cnt.n != s->cnt.n || (c->tag == CPC_TAG_NONE) != (s->tag == CPC_TAG_NONE)))
        return false;
    int64_t tm = c->tag == CPC_TAG_NONE ? -1
                 : c->tk == CPC_TOK_BLOCK || (c->tk == CPC_TOK_SHARD && V->U == 1) ? V->R
                                                                                    : -1;
    if (!fld(mode, tm, n, &c->tag, &c->tb, s->tag, s->tb))
        return false;
    for (int i = 0; i < c->cnt.n; i++) {
        run *x = &c->cnt.v[i];
        const run *y = mode == SM_JUMP ? x : &s->cnt.v[i];
        if (mode != SM_JUMP && (x->h0 != y->h0 || x->hn != y->hn || x->dq != y->dq || x->dk != y->dk))
            return false;
        int64_t qm = ix_rep(V, x->q0, V->NQ) || ix_rep(V, y->q0, V->NQ) ? -1 : V->R;
        int64_t km = V->NK == 1 || ix_rep(V, x->k0, V->NK) || ix_rep(V, y->k0, V->NK) ? -1 : V->R;
        if (!fld(mode, qm, n, &x->q0, &x->qb, y->q0, y->qb) || !fld(mode, km, n, &x->k0, &x->kb, y->k0, y->kb) ||
            !fld(mode, 0, n, &x->len, &x->lb, y->len, y->lb))
            return false;
    }
    return true;
}

/* The whole simulated state against snapshot S (mode SM_SLOPE, SM_CHECK) or
 * n steps on (SM_JUMP, S unused).  False: not the same shape (slots' flags,
 * run counts, requests and queues), or not the state one step on. */
static bool state_pair(vb *V, int mode, int64_t n, const vsnap *S)
{
    size_t ns = (size_t)V->nsim * (size_t)(V->nb > 0 ? V->nb : 1);
    if (mode == SM_JUMP) {
        for (size_t i = 0; i < ns; i++)
            if (!slot_pair(V, mode, n, &V->slots[i], NULL))
                return false;
        for (int p = 0; p < V->nsim; p++)
            for (int j = 0; j < V->rr[p].open.n; j++) {
                req *q = RQ(V, V->rr[p].open.v[j]);
                if (!fld(mode, q->is_send || !q->x->op->block ? -1 : V->R, n, &q->blk, &q->blkb, 0, 0))
                    return false;
                for (int b = 0; b < q->nb; b++)
                    if (!slot_pair(V, mode, n, &q->snap[b], NULL))
                        return false;
            }
        return true;
    }
    if (S->stamps != V->stamps)
        return false;
    /* memory slots are compared through the buffers naming them (a swap renames: the state a
     * step on may be this one with slots permuted, which behaves the same); requests name buffers
     * (one in flight is never swapped: the lifetime rule) */
    bool ok = true;
    for (size_t i = 0; i < ns && ok; i++)
        ok = V->nsend[i] == S->nsend[i] && (V->rpend[i] < 0) == (S->rpend[i] < 0) &&
             slot_pair(V, mode, n, &V->slots[V->map[i]], &S->slots[S->map[i]]);
    int k = 0, m = 0;
    for (int p = 0; p < V->nsim && ok; p++) {
        if (S->nreq[p] != V->rr[p].open.n) {
            ok = false;
            break;
        }
        for (int j = 0; j < V->rr[p].open.n && ok; j++, k++) {
            req *q = RQ(V, V->rr[p].open.v[j]);
            const req *o = &S->reqs[k];
            ok = q->x->op == o->x->op && q->p == o->p && q->to == o->to && q->group == o->group &&
                 q->tag == o->tag && q->nb == o->nb && !memcmp(q->bufs, o->bufs, (size_t)q->nb * sizeof *q->bufs) &&
                 q->is_send == o->is_send && q->done == o->done && (q->match < 0) == (o->match < 0) &&
                 fld(mode, q->is_send || !q->x->op->block ? -1 : V->R, n, &q->blk, &q->blkb, o->blk, o->blkb);
            for (int b = 0; b < q->nb && ok; b++)
                ok = slot_pair(V, mode, n, &q->snap[b], &o->snap[b]);
        }
        for (int h = 0; h < 2 && ok; h++) {
            for (int id = h ? V->rr[p].rh : V->rr[p].sh; id >= 0 && ok; id = RQ(V, id)->next)
                ok = m < S->nq && S->queues[m++] == req_index(V, id);
            ok = ok && m < S->nq && S->queues[m++] == -1;
        }
    }
    return ok;
}

/* Every simulated rank stands at the same marker: the induction's step. */
static void ind_marker(vb *V, const xop *x)
{
    switch (x->mk) {
    case MK_SNAP:
        vsnap_free(V, V->snap);
        if (!(V->snap = vsnap_take(V)))
            V->err = &cpc_status_oom;
        break;
    case MK_SLOPE:
        /* the guess: every value moves per step as it moved on the last one */
        if (!V->snap || !state_pair(V, SM_SLOPE, 0, V->snap)) {
            V->undec = "the loop's state does not keep its shape from one step to the next";
            break;
        }
        vsnap_free(V, V->snap);
        if (!(V->snap = vsnap_take(V)))
            V->err = &cpc_status_oom;
        V->ind = true;
        break;
    default: /* MK_JUMP: the symbolic step must give the guess one step on, as identities in s */
        V->ind = false;
        if (V->undec)
            break;
        if (!V->snap || !state_pair(V, SM_CHECK, 0, V->snap)) {
            V->undec = "the loop's state one symbolic step on is not its state moved by one step";
            break;
        }
        if (!state_pair(V, SM_JUMP, x->jn, NULL)) {
            V->undec = "a run's length leaves its range";
            break;
        }
        vsnap_free(V, V->snap);
        V->snap = NULL;
        V->jumps++;
        break;
    }
}

/* The INPUT buffers, the initial state of every simulated rank and its op
 * instances; then the ranks run round-robin (blocking waits, collectives
 * when every member is there) until all end or none can move. */
static cpc_status *prove(vb *V)
{
    const cpc_program *prog = V->prog;
    const cpc_layout *L = &prog->layout;
    size_t ns = (size_t)V->nsim * (size_t)(V->nb > 0 ? V->nb : 1);
    V->ro = calloc((size_t)V->nsim, sizeof *V->ro);
    V->slots = calloc(ns, sizeof *V->slots);
    V->map = calloc(ns, sizeof *V->map);
    V->pc = calloc((size_t)V->nsim, sizeof *V->pc);
    V->nsend = calloc(ns, sizeof *V->nsend);
    V->rpend = malloc(ns * sizeof *V->rpend);
    V->rr = calloc((size_t)V->nsim, sizeof *V->rr);
    V->reqs = (vc_pool){.size = sizeof(req), .free = -1, .release = req_release};
    if (!V->ro || !V->slots || !V->map || !V->pc || !V->nsend || !V->rpend || !V->rr)
        return cs_err(V);
    for (size_t i = 0; i < ns; i++)
        V->rpend[i] = -1;
    for (int p = 0; p < V->nsim; p++)
        V->rr[p].sh = V->rr[p].st = V->rr[p].rh = V->rr[p].rt = -1;
    cpc_status *st = check_outputs(V);
    for (int b = 0; b < V->nb && !st; b++)
        if (prog->buffers[b].io == CPC_IO_INPUT)
            st = check_input(V, &prog->buffers[b]);
    for (int p = 0; p < V->nsim && !st; p++) {
        cpc_coords c = cpc_program_coords(prog, cp(V, p));
        for (int b = 0; b < V->nb; b++) {
            const cpc_buffer *B = &prog->buffers[b];
            slot *sl = &V->slots[p * V->nb + b];
            V->map[p * V->nb + b] = p * V->nb + b;
            sl->tag = B->tokens == CPC_TOK_SHARD ? cp(V, p) : B->tokens == CPC_TOK_BLOCK ? (int)c.r : CPC_TAG_NONE;
            sl->written = B->io == CPC_IO_INPUT;
            sl->src = sl->written ? cpc_content_of_role(B->role) : CPC_CONTENT_NONE;
            sl->final = sl->written; /* the saved out and LSE: complete (the forward's proof) */
            sl->grad = is_grad(B->role);
            sl->role = (int8_t)B->role;
            sl->tk = (int8_t)B->tokens;
            sl->hd = (int8_t)B->heads;
            if (B->tokens == CPC_TOK_KV && !L->cross && !L->rep) {
                st = vfail(-1, NULL, "buffer '%s' has the %s token layout without cross-attention", B->name,
                           cpc_buf_tokens_name(B->tokens));
                break;
            }
        }
        /* the coordinates the walk takes: rank (0, u), or (1, u) for the twin (collect_checked takes
         * its peers and blocks back to rank 0's frame); inductive loops by phases (iw_loop) */
        collect_ctx cc = {V, &V->ro[p], V->twin && p >= V->Us, false, 0};
        if (!st) {
            st = cpc_program_walk_loops(prog, sim_flat(V, p), collect_checked, iw_loop, &cc);
            if (st && st->code == CPC_E_INPUT && st->rule == 0) {
                /* the walk's own refusal (an expression that does not evaluate, a
                 * peer outside its group, a loop count out of range: program.h):
                 * a CP051 of the backward program like every other fault */
                cpc_status *d = bfail(st->span, NULL, "%s", st->message);
                cpc_status_free(st);
                st = d;
            }
        }
    }
    if (st)
        return st;
    /* Round-robin until every rank ends; an all_to_all fires when every
     * member of its ulysses group has reached it; a round without progress
     * is a deadlock. */
    const int ngr = V->twin ? 2 : V->sym ? 1 : V->R; /* ulysses groups simulated */
    const int nrm = V->twin ? 2 : V->sym ? 1 : V->R; /* ring members simulated per ring group */
    for (;;) {
        bool all = true, moved = false;
        V->work += V->nsim; /* a round visits every simulated rank */
        if (V->work > VB_WORK_MAX) {
            V->bound_hit = true;
            return cs_err(V);
        }
        for (int p = 0; p < V->nsim; p++) {
            int before = V->pc[p];
            int r = advance(V, p);
            if (r < 0)
                return V->err;
            if (V->over)
                return NULL; /* a set outgrew the bound: stop now (the caller refuses or
                                tries the next domain), not at the work bound seconds and
                                gigabytes later (redteam: 23.5 s, 3.5 GB at 24 ranks) */
            if (r == 0)
                all = false;
            if (V->pc[p] != before)
                moved = true;
        }
        if (all)
            break;
        if (V->ind_on) {
            /* the induction's markers: every simulated rank at the same one */
            const xop *m0 = V->pc[0] < V->ro[0].n ? &V->ro[0].v[V->pc[0]] : NULL;
            bool at = m0 && m0->mk;
            for (int p = 1; p < V->nsim && at; p++) {
                const xop *m = V->pc[p] < V->ro[p].n ? &V->ro[p].v[V->pc[p]] : NULL;
                at = m && m->mk == m0->mk && m->peer == m0->peer && m->op == m0->op && m->s == m0->s &&
                     m->jn == m0->jn; /* the same marker of the same loop and step on every rank */
            }
            if (at) {
                ind_marker(V, m0);
                if (V->err)
                    return V->err;
                if (V->undec)
                    return NULL;
                for (int p = 0; p < V->nsim; p++)
                    V->pc[p]++;
                continue;
            }
        }
        /* ulysses groups (all_to_all), then ring groups (all_gather, reduce_scatter) */
        for (int gk = 0; gk < 2; gk++) {
            int ng = gk == 0 ? ngr : V->Us, nm = gk == 0 ? V->Us : nrm;
            for (int g = 0; g < ng; g++) {
                bool ready = true;
                const cpc_op *op0 = NULL;
                for (int j = 0; j < nm && ready; j++) {
                    int p = gk == 0 ? g * V->Us + j : j * V->Us + g;
                    const cpc_op *at = V->pc[p] < V->ro[p].n ? V->ro[p].v[V->pc[p]].op : NULL;
                    cpc_op_kind k = at ? at->kind : CPC_OP__COUNT;
                    bool here = gk == 0 ? k == CPC_OP_ALL_TO_ALL : (k == CPC_OP_ALL_GATHER || k == CPC_OP_REDUCE_SCATTER);
                    here |= k == CPC_OP_BARRIER;
                    /* a member meets its group's collectives only: one over another group (an all_gather
                     * over the world) is left to the rank's step, whose group rule refuses it */
                    here &= at && at->group == (gk == 0 ? CPC_GROUP_ULYSSES : CPC_GROUP_RING);
                    if (!here) {
                        ready = false;
                        break;
                    }
                    const cpc_op *op = V->ro[p].v[V->pc[p]].op;
                    if (op0 && op != op0)
                        return vfail(p, &V->ro[p].v[V->pc[p]], "members of its %s group reach different collective ops",
                                     gk == 0 ? "ulysses" : "ring");
                    op0 = op;
                }
                if (ready) {
                    if (op0->kind == CPC_OP_BARRIER) /* no data: every member passes */
                        for (int j = 0; j < nm; j++)
                            V->pc[gk == 0 ? g * V->Us + j : j * V->Us + g]++;
                    else if ((st = gk == 0 ? run_a2a(V, g) : run_ring_coll(V, g)))
                        return st;
                    if (V->ubreak)
                        return NULL; /* the caller simulates every member */
                    moved = true;
                }
            }
        }
        {
            /* the world group (all_reduce) */
            bool ready = true;
            for (int p = 0; p < V->nsim && ready; p++) {
                const cpc_op *at = V->pc[p] < V->ro[p].n ? V->ro[p].v[V->pc[p]].op : NULL;
                if (!at || (at->kind != CPC_OP_ALL_REDUCE && at->kind != CPC_OP_BARRIER) || at->group != CPC_GROUP_WORLD) {
                    ready = false;
                    break;
                }
                if (at != V->ro[0].v[V->pc[0]].op)
                    return vfail(p, &V->ro[p].v[V->pc[p]], "ranks reach different %s ops", cpc_op_kind_name(at->kind));
            }
            if (ready) {
                if (V->ro[0].v[V->pc[0]].op->kind == CPC_OP_BARRIER)
                    for (int p = 0; p < V->nsim; p++)
                        V->pc[p]++;
                else if ((st = run_all_reduce(V)))
                    return st;
                if (V->ubreak)
                    return NULL; /* the caller simulates every member */
                moved = true;
            }
        }
        if (!moved) {
            for (int p = 0; p < V->nsim && V->ind_on; p++)
                if (V->pc[p] < V->ro[p].n && V->ro[p].v[V->pc[p]].mk) {
                    /* a rank waits at a step boundary for one that waits on it: unroll instead */
                    V->undec = "the simulated ranks do not reach the loop's step boundary together";
                    return NULL;
                }
            /* the symmetric domain: every rank runs the same ops, so blocks there at once (as
             * verify_sym's deadlock) */
            const char *all = V->sym ? "every rank blocks here" : "no rank can progress";
            for (int p = 0; p < V->nsim; p++)
                if (V->pc[p] < V->ro[p].n) {
                    const xop *x = &V->ro[p].v[V->pc[p]];
                    if (cpc_op_info_of(x->op->kind)->match == CPC_MATCH_COLLECTIVE)
                        return vfail(p, x, "deadlock: %s: a member of its %s group never reaches this %s", all,
                                     cpc_group_name(x->op->group), cpc_op_kind_name(x->op->kind));
                    const req *q = NULL;
                    for (int j = 0; j < V->rr[p].open.n && !q; j++) {
                        const req *o = RQ(V, V->rr[p].open.v[j]);
                        q = o->tag == x->op->tag && o->match < 0 ? o : NULL;
                    }
                    if (!q)
                        return vfail(p, x, "deadlock: %s", all);
                    char who[64], m[640];
                    if (rotated(V, (cpc_group)q->group))
                        snprintf(who, sizeof who, "ring member r%+d", diff_mod(q->to, 0, V->R));
                    else
                        snprintf(who, sizeof who, "rank %d (%s group)", q->to, cpc_group_name((cpc_group)q->group));
                    vc_deadlock(&q->h, all, who,
                                V->sym ? "the peer runs the same ops, so it is blocked here too, or never posts one"
                                       : "a wait completes only once the peer has posted: rendezvous",
                                m, sizeof m);
                    return vfail(p, x, "%s", m);
                }
            return vfail(-1, NULL, "no rank can progress");
        }
    }
    if (V->asym || V->undec)
        return NULL; /* the caller decides: not proven */
    /* the end of every simulated rank: every request completed by a wait, then every OUTPUT
     * gradient (vc_finish: its rows, exactly once: grad_covered) */
    for (int p = 0; p < V->nsim; p++) {
        bwd_dom dd = {.V = V, .p = p, .x = NULL};
        vc_domain dom;
        bwd_domain(&dd, &dom);
        char m[640] = "";
        vc_tri t = vc_finish(&dom, m, sizeof m);
        if (t != VC_YES)
            return t == VC_OOM ? &cpc_status_oom : vfail(p, dd.x, "%s", m);
    }
    return NULL;
}

static void vb_free(vb *V)
{
    size_t ns = (size_t)V->nsim * (size_t)(V->nb > 0 ? V->nb : 1);
    vsnap_free(V, V->snap);
    V->snap = NULL;
    for (int p = 0; V->rr && p < V->nsim; p++)
        free(V->rr[p].open.v);
    vc_pool_free(&V->reqs);
    if (V->slots)
        for (size_t i = 0; i < ns; i++)
            cs_free(&V->slots[i].cnt);
    if (V->ro)
        for (int p = 0; p < V->nsim; p++)
            free(V->ro[p].v);
    for (int j = 0; j < CPC_OP_MAX_BUFS; j++)
        cs_free(&V->tmpv[j].cnt);
    free(V->rr);
    free(V->ro);
    free(V->slots);
    free(V->map);
    free(V->pc);
    free(V->nsend);
    free(V->rpend);
}

/* The symmetric domain's state before prove(): umode 0 every member (with
 * the twin), 1 member 0 for all (ROTATIONS OF U), 2 one member per class
 * (CLASSES OF U, ucl). */
static void sym_setup(vb *V, const vb *base, int umode, const uclasses *ucl, bool ind)
{
    const cpc_program *prog = base->prog;
    *V = *base;
    V->sym = true;
    V->twin = base->R > 1 && has_r0_guard(prog->ops, prog->n_ops);
    V->nsim = V->twin ? 2 * V->U : V->U;
    if (umode == 1) {
        V->usym = true;
        V->Us = 1;
    } else if (umode == 2) {
        V->usym = true;
        V->uc = ucl;
        V->Us = ucl->ncls;
    }
    V->nsim = V->twin ? 2 * V->Us : V->Us; /* simulated rank k * Us + j: k = 1 the twins */
    V->ind_on = ind;
}

cpc_status *cpc_verify_backward(const cpc_program *prog)
{
    return cpc_verify_backward_ex(prog, NULL, NULL);
}

cpc_status *cpc_verify_backward_ex(const cpc_program *prog, const cpc_verify_opts *opts, cpc_verify_bwd_stats *stats)
{
    return cpc_verify_backward_ind(prog, opts, stats, true);
}

static cpc_status *verify_bwd(const cpc_program *prog, const cpc_verify_opts *opts, cpc_verify_bwd_stats *stats,
                              bool induction, const vc_node *nodes)
{
    cpc_verify_method method = opts ? opts->method : CPC_VERIFY_AUTO;
    cpc_verify_bwd_stats dummy;
    if (!stats)
        stats = &dummy;
    memset(stats, 0, sizeof *stats);
    if (!prog)
        return cpc_error(CPC_E_INTERNAL, "verify_backward: no program");
    const cpc_layout *L = &prog->layout;
    if (L->P != L->R * L->U || L->R < 1 || L->U < 1)
        return cpc_error(CPC_E_INTERNAL, "verify_backward: program layout is not initialised");
    vb base = {.prog = prog, .nodes = nodes, .P = L->P, .R = L->R, .U = L->U, .Us = L->U, .nb = prog->n_buffers,
               .nh = L->U > 1 ? L->H : 1};
    base.NK = L->cross ? 1 : L->R + (L->rep ? 1 : 0);
    base.NQ = L->R + (L->rep ? 1 : 0);
    /* 1. the symmetric domain (any world size) when the program commutes
     * with rotations of the ring */
    const cpc_op *at = NULL;
    const char *why = method == CPC_VERIFY_ENUMERATE ? "enumeration asked for"
                                                     : sym_class(&base, prog->ops, prog->n_ops, 0, &at);
    cpc_status *st = NULL;
    if (!why) {
        /* one ulysses member for all (umode 1), or one per class of members (umode 2), and
         * loops by induction first; where the induction cannot decide, unrolled; where the
         * classes do not stand for their members (ubreak), every member */
        uclasses ucl = {0};
        vb V;
        sym_setup(&V, &base, 0, NULL, induction);
        int umode = !induction ? 0 : usym_class(&V) ? 1 : uclass_build(&V, &ucl) ? 2 : 0;
        for (;;) {
            sym_setup(&V, &base, umode, &ucl, induction);
            st = prove(&V);
            if (V.undec && !V.ubreak) {
                cpc_status_free(st);
                vb_free(&V);
                sym_setup(&V, &base, umode, &ucl, false);
                st = prove(&V);
            }
            if (!V.ubreak)
                break;
            cpc_status_free(st);
            st = NULL;
            vb_free(&V);
            umode = 0;
        }
        stats->classes = V.uc ? V.uc->ncls : 0;
        uclass_free(&ucl);
        stats->usym = V.usym;
        stats->jumps = V.jumps;
        stats->work = V.work;
        /* not decided: a failure after the symmetry broke says nothing either */
        bool over = (V.over && !st) || V.asym;
        const char *asym = V.asym;
        vb_free(&V);
        if (!over) {
            stats->mode = st ? CPC_VERIFY_REFUSED : CPC_VERIFY_SYMBOLIC;
            stats->ranks = st ? 0 : L->P;
            return st;
        }
        cpc_status_free(st);
        st = NULL;
        why = asym ? asym : "its gradient sets do not stay a few runs of blocks";
        at = NULL;
    }
    /* 2. enumeration of every rank, within the bound */
    if (L->P > VB_MAX_P || method == CPC_VERIFY_SYMBOLIC_ONLY) {
        stats->mode = CPC_VERIFY_REFUSED;
        return bfail(at ? at->span : CPC_NO_SPAN, NULL,
                     "%d ranks: it cannot be proven: the symmetric proof does not apply (%s%s%s) and enumeration is "
                     "limited to %d ranks",
                     L->P, at ? cpc_op_kind_name(at->kind) : "", at ? ": " : "", why, VB_MAX_P);
    }
    vb V = base;
    V.nsim = V.P;
    st = prove(&V);
    /* prove() returns NULL without its final checks when a set outgrew the
     * bound (the symmetric domain's "not decided"): here that is a refusal,
     * never a proof (helper redteam: a dV added twice a step, doubling every
     * step, was proven at 14-20 ranks) */
    if (!st && (V.over || V.asym || V.undec))
        st = bfail(CPC_NO_SPAN, NULL,
                   "a gradient accumulator holds more than %d runs of blocks (contributions repeated: the "
                   "prover's bound, verify_bwd.h)",
                   VB_MAX_RUNS);
    stats->work = V.work;
    stats->mode = st ? CPC_VERIFY_REFUSED : CPC_VERIFY_FULL;
    stats->ranks = st ? 0 : L->P;
    vb_free(&V);
    return st;
}

cpc_status *cpc_verify_backward_ind(const cpc_program *prog, const cpc_verify_opts *opts, cpc_verify_bwd_stats *stats,
                                    bool induction)
{
    bool oom = false;
    vc_node *nodes = prog ? vc_nodes(prog->ops, prog->n_ops, 9, &oom) : NULL; /* the walk nests 8 loops */
    if (oom)
        return &cpc_status_oom;
    cpc_status *st = verify_bwd(prog, opts, stats, induction, nodes);
    vc_nodes_free(nodes, prog ? prog->n_ops : 0);
    return st;
}
