/*
 * verify_sym.c - the symbolic proof (verify_sym.h; the argument is in
 * verify.h "SYMBOLIC PROOF" and docs/VERIFY.md).
 *
 * One GENERIC rank is run: its coordinates r, u stay symbols, so every value
 * the program computes is a function of them.  The class of programs handled
 * (anything else is UNDECIDED, naming the op):
 *   - `when` and loop `count` do not read r, u or p: every rank runs the same
 *     ops in the same order (top-level `when`s are then constants; a `when`
 *     inside a loop is a set of steps, computed by the structure of the
 *     expression as a union of intervals);
 *   - send/recv run in the ring group with peer (r + d) mod R (d a constant):
 *     a rotation of the ring, so rank r's k-th message on (d, tag) meets rank
 *     r+d's k-th receive on (-d, tag), and both are the generic rank's own
 *     k-th post of that kind, seen from two ranks;
 *   - ring block indices are (a*r + b*s + c) mod R with a in {0, 1};
 *   - loops are top-level (a nested loop must not run).
 * Values: a buffer's tokens are its own shard, ring block (a*r+b*s+c) mod R,
 * all blocks, the K/V sequence or another rank's shard; heads are all or the
 * member's part (a property of every member, decided once per head space);
 * the keys merged into an accumulator are pieces {a*r + b*t + c : t in
 * [lo, hi)} whose bounds may follow the loop step.
 * Loops: the step range [0, count) is cut into phases where the same ops run.
 * A phase is unrolled (each step concrete) until the state at the start of a
 * step, written relative to s, repeats; one more step is then run with s a
 * symbol ranging over the rest of the phase: every check is decided for all
 * those s at once (linear congruences), and the state must come back to
 * itself, which closes the phase by induction.
 */
#include "verify_sym.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify.h"
#include "verify_common.h"

#define MAXPC 8          /* coverage pieces per value */
#define MAXREQ 32        /* requests in flight (the generic rank's) */
#define MAX_DEPTH 8
#define UNROLL_MAX 8     /* a phase this short is unrolled */
#define FIX_TRIES 8      /* steps tried before the state must repeat */
#define SMALL_LOOP 64    /* guards that are not intervals: evaluated per step up to this count */
#define MAX_IVL 32

enum { T_UNSET = 0, T_OWN, T_BLOCK, T_ALL, T_KV, T_OTHER };
enum { HD_ALL = 0, HD_PART };
enum { PC_BLK = 0, PC_ALL, PC_OWN };
enum { NEVER = 0, ALWAYS = 1, MIXED = 2 };
/* head classes: does member u's part equal all heads? */
enum { HC_NONE = 0, HC_ALL, HC_MIXED };

typedef struct aff {
    int64_t a, b, c; /* (a*r + b*s + c) mod R, each in [0, R) */
} aff;

typedef struct bnd {
    int64_t v;
    bool rel; /* v + s (the current loop step) */
} bnd;

typedef struct piece {
    uint8_t kind; /* PC_* */
    uint8_t grew; /* created or extended in the current step */
    aff f;        /* PC_BLK: block (a*r + b*t + c) mod R for t in [lo, hi) */
    bnd lo, hi;
} piece;

typedef vc_node snode;

typedef struct sval {
    union {
        vc_val h; /* the fields every domain shares (verify_common.h) */
        struct {
            VC_VAL_FIELDS;
        };
    };
    uint8_t touched;
    uint8_t tok, heads;
    aff blk;          /* T_BLOCK */
    int npc;
    piece pc[MAXPC];
    const snode *wop;
} sval;

typedef struct sreq {
    union {
        vc_rq h; /* the fields every domain shares (verify_common.h); peer -1 */
        struct {
            VC_RQ_FIELDS;
        };
    };
    int64_t d;        /* peer offset in the ring */
    int64_t key;      /* channel: send d, recv -d (mod R) */
    sval snap[CPC_OP_MAX_BUFS]; /* send: content at post; recv: what arrives */
    aff decl;         /* recv: declared block */
} sreq;

typedef struct sst {
    sval *v;
    int32_t *nsend;
    int32_t *rpend;
    sreq req[MAXREQ];
    int nreq;
    int32_t next_stamp;
} sst;

/* The domain of the step (verify_common.h) on the symbolic rank: answers
 * hold for every rank and every step the run stands for, or are UNDECIDED
 * (the peer is an offset, not one rank).  One per proof, moved from op to op
 * (at). */
typedef struct sym_dom {
    struct sctx *C;
    const snode *nd; /* the op being run (writer of what it stores; where a fault is) */
    int64_t slo, shi;     /* ... for the steps [slo, shi) */
    const struct sreq *q; /* the request it was last moved to (at) */
    char ob[256];
} sym_dom;

typedef struct sctx {
    const cpc_program *prog;
    const cpc_layout *L;
    int64_t R, U, P;
    int nb;
    snode *root;
    int n_root;
    sst *st;
    bool in_loop;
    int64_t slo, shi; /* the steps the current body run stands for */
    int qclass, kvclass;
    int kv_mixed_u;   /* a member whose K/V part is all heads, for HC_MIXED messages */
    int result;       /* 0, CPC_SYM_ERROR, CPC_SYM_UNDECIDED, CPC_SYM_NOMEM */
    cpc_status *diag;
    cpc_sym_stats stats;
    int64_t work;       /* the bound's units spent so far (verify.h THE PROVER'S BOUND) */
    sval tmp[CPC_OP_MAX_BUFS]; /* the step's scratch values */
    sym_dom d;          /* the domain (at) and the step's message */
    vc_domain dom;
    char m[1024];
} sctx;

/* ---- arithmetic ------------------------------------------------------------- */

/* Inverse of x modulo m (gcd(x, m) == 1, m >= 1). */
static int64_t inv_mod(int64_t x, int64_t m)
{
    int64_t g = m, x1 = vc_mod(x, m), a = 0, b = 1;
    if (m == 1)
        return 0;
    while (x1) {
        int64_t q = g / x1, t = g - q * x1;
        g = x1;
        x1 = t;
        t = a - q * b;
        a = b;
        b = t;
    }
    return vc_mod(a, m);
}

static aff aff_norm(const sctx *C, int64_t a, int64_t b, int64_t c)
{
    aff x = {vc_mod(a, C->R), vc_mod(b, C->R), vc_mod(c, C->R)};
    return x;
}

/* Is (da*r + db*t + dc) mod R zero for every r and every t in [lo, hi)
 * (ALWAYS), for none (NEVER), or for some only (MIXED)?  hi > lo. */
static int zero_on(const sctx *C, int64_t da, int64_t db, int64_t dc, int64_t lo, int64_t hi)
{
    int64_t R = C->R;
    if (R == 1)
        return ALWAYS;
    da = vc_mod(da, R);
    db = vc_mod(db, R);
    dc = vc_mod(dc, R);
    if (da != 0)
        return MIXED; /* a in {0,1}: some r solves it, not every r */
    if (db == 0)
        return dc == 0 ? ALWAYS : NEVER;
    int64_t g = vc_gcd(db, R), rhs = vc_mod(-dc, R);
    if (rhs % g)
        return NEVER;
    int64_t m = R / g;
    int64_t x = vc_mod((rhs / g) * inv_mod(db / g, m), m);
    int64_t first = lo + vc_mod(x - lo, m);
    if (first >= hi)
        return NEVER;
    return hi - lo == 1 ? ALWAYS : MIXED;
}

/* x == y for every rank and every step of the current run? */
static int aff_same(const sctx *C, aff x, aff y)
{
    return zero_on(C, x.a - y.a, x.b - y.b, x.c - y.c, C->slo, C->shi);
}

/* ---- expressions: linear forms ------------------------------------------------ */

typedef struct lin {
    int64_t cr, cu, cs, c;
    int64_t mod; /* > 0: the value is taken modulo `mod` */
} lin;

static bool lin_const(const lin *x)
{
    return x->mod == 0 && x->cr == 0 && x->cu == 0 && x->cs == 0;
}

static bool lin_eval_raw(const sctx *C, const cpc_expr *e, int i, lin *out);

/* The linear form of node i, or false when it has none.  Coefficients stay
 * within 2^31 and constants within 2^60: with r, u, s < 2^21 no value of the
 * node or of any node below it can overflow int64 on any rank or step, so
 * evaluation (expr.c, which fails on overflow) gives the same value. */
static bool lin_eval(const sctx *C, const cpc_expr *e, int i, lin *out)
{
    if (!lin_eval_raw(C, e, i, out))
        return false;
    const int64_t K = (int64_t)1 << 31, M = (int64_t)1 << 60;
    return out->cr >= -K && out->cr <= K && out->cu >= -K && out->cu <= K && out->cs >= -K && out->cs <= K &&
           out->c >= -M && out->c <= M;
}

static bool lin_eval_raw(const sctx *C, const cpc_expr *e, int i, lin *out)
{
    cpc_expr_node n;
    if (!cpc_expr_node_at(e, i, &n))
        return false;
    memset(out, 0, sizeof *out);
    switch (n.kind) {
    case CPC_EX_NUM: out->c = n.val; return true;
    case CPC_EX_VAR:
        switch (n.var) {
        case 'r': out->cr = 1; return true;
        case 'u': out->cu = 1; return true;
        case 'p': out->cr = C->U; out->cu = 1; return true;
        case 's': if (C->in_loop) out->cs = 1; return true;
        case 'R': out->c = C->R; return true;
        case 'U': out->c = C->U; return true;
        case 'P': out->c = C->P; return true;
        default: return false;
        }
    case CPC_EX_NEG: {
        lin a;
        if (!lin_eval(C, e, n.a, &a) || a.mod)
            return false;
        return !__builtin_sub_overflow((int64_t)0, a.cr, &out->cr) &&
               !__builtin_sub_overflow((int64_t)0, a.cu, &out->cu) &&
               !__builtin_sub_overflow((int64_t)0, a.cs, &out->cs) &&
               !__builtin_sub_overflow((int64_t)0, a.c, &out->c);
    }
    case CPC_EX_NOT: {
        lin a;
        if (!lin_eval(C, e, n.a, &a) || !lin_const(&a))
            return false;
        out->c = a.c == 0;
        return true;
    }
    default: break;
    }
    lin a, b;
    if (n.a < 0 || n.b < 0 || !lin_eval(C, e, n.a, &a) || !lin_eval(C, e, n.b, &b))
        return false;
    if (lin_const(&a) && lin_const(&b))
        return !cpc_expr_binop(n.kind, a.c, b.c, &out->c); /* constants fold as evaluation does */
    switch (n.kind) {
    case CPC_EX_ADD:
    case CPC_EX_SUB:
        if (a.mod || b.mod)
            return false;
        if (n.kind == CPC_EX_ADD)
            return !__builtin_add_overflow(a.cr, b.cr, &out->cr) && !__builtin_add_overflow(a.cu, b.cu, &out->cu) &&
                   !__builtin_add_overflow(a.cs, b.cs, &out->cs) && !__builtin_add_overflow(a.c, b.c, &out->c);
        return !__builtin_sub_overflow(a.cr, b.cr, &out->cr) && !__builtin_sub_overflow(a.cu, b.cu, &out->cu) &&
               !__builtin_sub_overflow(a.cs, b.cs, &out->cs) && !__builtin_sub_overflow(a.c, b.c, &out->c);
    case CPC_EX_MUL: {
        const lin *k = lin_const(&a) ? &a : lin_const(&b) ? &b : NULL;
        const lin *x = k == &a ? &b : &a;
        if (!k || x->mod)
            return false;
        return !__builtin_mul_overflow(x->cr, k->c, &out->cr) && !__builtin_mul_overflow(x->cu, k->c, &out->cu) &&
               !__builtin_mul_overflow(x->cs, k->c, &out->cs) && !__builtin_mul_overflow(x->c, k->c, &out->c);
    }
    case CPC_EX_MOD:
        if (!lin_const(&b) || b.c <= 0)
            return false;
        if (a.mod && a.mod != b.c)
            return false;
        *out = a;
        out->mod = b.c;
        return true;
    default: return false;
    }
}

/* ---- step sets of guards: unions of intervals of [0, N) ----------------------- */

typedef struct ivl {
    int64_t lo, hi;
} ivl;

typedef struct iset {
    int n;
    ivl v[MAX_IVL];
} iset;

static void is_all(iset *s, int64_t N)
{
    s->n = 0;
    if (N > 0)
        s->v[s->n++] = (ivl){0, N};
}

static bool is_add(iset *s, int64_t lo, int64_t hi, int64_t N)
{
    if (lo < 0)
        lo = 0;
    if (hi > N)
        hi = N;
    if (lo >= hi)
        return true;
    if (s->n == MAX_IVL)
        return false;
    s->v[s->n++] = (ivl){lo, hi};
    return true;
}

static void is_norm(iset *s)
{
    for (int i = 1; i < s->n; i++)
        for (int j = i; j > 0 && s->v[j].lo < s->v[j - 1].lo; j--) {
            ivl t = s->v[j];
            s->v[j] = s->v[j - 1];
            s->v[j - 1] = t;
        }
    int k = 0;
    for (int i = 0; i < s->n; i++) {
        if (k > 0 && s->v[i].lo <= s->v[k - 1].hi) {
            if (s->v[i].hi > s->v[k - 1].hi)
                s->v[k - 1].hi = s->v[i].hi;
        } else
            s->v[k++] = s->v[i];
    }
    s->n = k;
}

static bool is_not(const iset *a, int64_t N, iset *out)
{
    out->n = 0;
    int64_t at = 0;
    for (int i = 0; i < a->n; i++) {
        if (!is_add(out, at, a->v[i].lo, N))
            return false;
        at = a->v[i].hi;
    }
    return is_add(out, at, N, N);
}

static bool is_and(const iset *a, const iset *b, int64_t N, iset *out)
{
    out->n = 0;
    for (int i = 0; i < a->n; i++)
        for (int j = 0; j < b->n; j++) {
            int64_t lo = a->v[i].lo > b->v[j].lo ? a->v[i].lo : b->v[j].lo;
            int64_t hi = a->v[i].hi < b->v[j].hi ? a->v[i].hi : b->v[j].hi;
            if (!is_add(out, lo, hi, N))
                return false;
        }
    is_norm(out);
    return true;
}

static int64_t fdiv(int64_t a, int64_t b) /* floor, b > 0 */
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* Steps s in [0, N) where K*s CMP M holds (K, M integers). */
static bool is_cmp(cpc_expr_kind k, int64_t K, int64_t M, int64_t N, iset *out)
{
    out->n = 0;
    const int64_t big = (int64_t)1 << 61;
    if (K < -big || K > big || M < -big || M > big)
        return false;
    if (K == 0) {
        int64_t t;
        if (cpc_expr_binop(k, 0, M, &t))
            return false;
        if (t)
            is_all(out, N);
        return true;
    }
    if (K < 0) {
        K = -K;
        M = -M;
        k = k == CPC_EX_LT ? CPC_EX_GT : k == CPC_EX_LE ? CPC_EX_GE : k == CPC_EX_GT ? CPC_EX_LT
            : k == CPC_EX_GE ? CPC_EX_LE : k;
    }
    /* K > 0: s < M/K etc. */
    int64_t fl = fdiv(M, K), ce = -fdiv(-M, K);
    switch (k) {
    case CPC_EX_LT: return is_add(out, 0, ce, N);           /* s < M/K  <=> s <= ceil(M/K)-1 */
    case CPC_EX_LE: return is_add(out, 0, fl + 1, N);
    case CPC_EX_GT: return is_add(out, fl + 1, N, N);
    case CPC_EX_GE: return is_add(out, ce, N, N);
    case CPC_EX_EQ: return M % K == 0 ? is_add(out, M / K, M / K + 1, N) : true;
    case CPC_EX_NE: {
        iset eq;
        eq.n = 0;
        if (M % K == 0 && !is_add(&eq, M / K, M / K + 1, N))
            return false;
        return is_not(&eq, N, out);
    }
    default: return false;
    }
}

/* The steps of [0, N) where node i is nonzero; false when its form is not
 * handled (then the caller evaluates it step by step, or gives up). */
static bool steps_of(const sctx *C, const cpc_expr *e, int i, int64_t N, iset *out)
{
    cpc_expr_node n;
    if (!cpc_expr_node_at(e, i, &n))
        return false;
    iset a, b;
    switch (n.kind) {
    case CPC_EX_AND:
    case CPC_EX_OR:
        if (!steps_of(C, e, n.a, N, &a) || !steps_of(C, e, n.b, N, &b))
            return false;
        if (n.kind == CPC_EX_AND)
            return is_and(&a, &b, N, out);
        *out = a;
        for (int j = 0; j < b.n; j++)
            if (!is_add(out, b.v[j].lo, b.v[j].hi, N))
                return false;
        is_norm(out);
        return true;
    case CPC_EX_NOT:
        return steps_of(C, e, n.a, N, &a) && is_not(&a, N, out);
    case CPC_EX_LT:
    case CPC_EX_LE:
    case CPC_EX_GT:
    case CPC_EX_GE:
    case CPC_EX_EQ:
    case CPC_EX_NE: {
        lin x, y;
        if (!lin_eval(C, e, n.a, &x) || !lin_eval(C, e, n.b, &y))
            return false;
        if (x.mod || y.mod || x.cr || x.cu || y.cr || y.cu)
            return false;
        int64_t K, M;
        if (__builtin_sub_overflow(x.cs, y.cs, &K) || __builtin_sub_overflow(y.c, x.c, &M))
            return false;
        return is_cmp(n.kind, K, M, N, out);
    }
    default: {
        lin x;
        if (!lin_eval(C, e, i, &x) || x.mod || x.cr || x.cu)
            return false;
        return is_cmp(CPC_EX_NE, x.cs, -x.c, N, out); /* cs*s + c != 0 */
    }
    }
}

/* ---- diagnostics --------------------------------------------------------------- */

/* The op and the steps the current run stands for. */
#define op_desc(C, nd, buf, n) vc_op_desc((nd), (C)->slo, (C)->shi, (buf), (n))

/* A definite fault at the op nd for the steps [slo, shi): every rank runs
 * the same ops, so it shows on rank 0 (or on the rank `r`, u 0, given). */
__attribute__((format(printf, 6, 7)))
static int serr_in(sctx *C, const snode *nd, int64_t slo, int64_t shi, int64_t r, const char *fmt, ...)
{
    if (C->result)
        return -1;
    char ob[256];
    va_list ap;
    va_start(ap, fmt);
    C->result = CPC_SYM_ERROR;
    C->diag = vc_fault(nd && nd->op ? nd->op->span : CPC_NO_SPAN, false, r * C->U, C->U,
                       vc_op_desc(nd, slo, shi, ob, sizeof ob), fmt, ap);
    va_end(ap);
    return -1;
}

#define serr_at(C, nd, r, ...) serr_in(C, nd, (C)->slo, (C)->shi, r, __VA_ARGS__) /* the current steps */
#define serr(C, nd, ...) serr_at(C, nd, 0, __VA_ARGS__)

/* Outside the symbolic class: the op and why. */
__attribute__((format(printf, 3, 4)))
static int sund(sctx *C, const snode *nd, const char *fmt, ...)
{
    if (C->result)
        return -1;
    char msg[1024], ob[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    C->result = CPC_SYM_UNDECIDED;
    C->diag = cpc_diag(CPC_E_PLAN, CPC_RULE_VERIFY, CPC_SEV_ERROR, nd && nd->op ? nd->op->span : CPC_NO_SPAN,
                       "%s: %s", op_desc(C, nd, ob, sizeof ob), msg);
    return -1;
}

static int snomem(sctx *C)
{
    if (!C->result)
        C->result = CPC_SYM_NOMEM;
    return -1;
}

/* ---- layout helpers -------------------------------------------------------------- */

static const char *bname(const sctx *C, int b)
{
    return C->prog->buffers[b].name;
}

static int buf_heads(const sctx *C, int b)
{
    return C->prog->buffers[b].heads == CPC_HEADS_PART ? HD_PART : HD_ALL;
}

/* Do heads x and y of data `src` agree on every member? */
static int heads_same(const sctx *C, int src, int x, int y)
{
    if (x == y)
        return ALWAYS;
    int cls = src_is_kv(src) ? C->kvclass : C->qclass;
    return cls == HC_ALL ? ALWAYS : cls == HC_NONE ? NEVER : MIXED;
}

static void heads_classes(sctx *C)
{
    const cpc_layout *L = C->L;
    /* query heads: member u's part is all H heads only for u = 0 when the
     * split puts every head there (U == 1, or H == 1). */
    C->qclass = L->U == 1 ? HC_ALL : L->H == 1 ? HC_MIXED : HC_NONE;
    /* K/V heads: a member's part is all Hkv heads only if its first query
     * head is in group 0, i.e. q_off(u) < group; q_off grows with u, so only
     * a prefix of at most group+1 members can qualify. */
    int eq = 0;
    C->kv_mixed_u = -1;
    for (int u = 0; u < L->U; u++) {
        int qo, qn, ko, kn;
        cpc_layout_q_heads(L, u, &qo, &qn);
        if (qo >= L->group)
            break;
        cpc_layout_kv_heads(L, u, &ko, &kn);
        if (ko == 0 && kn == L->Hkv) {
            eq++;
            C->kv_mixed_u = u;
        }
    }
    C->kvclass = eq == L->U ? HC_ALL : eq == 0 ? HC_NONE : HC_MIXED;
}

/* ---- values ---------------------------------------------------------------------- */

static void canon(const sctx *C, sval *v)
{
    if (v->tok == T_OWN && C->U == 1) {
        v->tok = T_BLOCK;
        v->blk = aff_norm(C, 1, 0, 0);
    } else if (v->tok == T_ALL && C->R == 1) {
        v->tok = T_BLOCK;
        v->blk = aff_norm(C, 0, 0, 0);
    }
}

static sval sv_zero(void)
{
    sval v;
    memset(&v, 0, sizeof v);
    return v;
}

/* Token predicates for every rank and step of the run: ALWAYS/NEVER/MIXED. */
static int tok_is_own(const sctx *C, const sval *v)
{
    if (v->tok == T_OWN)
        return ALWAYS;
    if (v->tok == T_BLOCK && C->U == 1)
        return aff_same(C, v->blk, aff_norm(C, 1, 0, 0));
    return NEVER;
}

static int tok_is_all(const sctx *C, const sval *v)
{
    if (v->tok == T_ALL)
        return ALWAYS;
    if (v->tok == T_BLOCK && C->R == 1)
        return ALWAYS;
    return NEVER;
}

static int tok_same(const sctx *C, const sval *x, const sval *y)
{
    if (x->tok == T_BLOCK && y->tok == T_BLOCK)
        return aff_same(C, x->blk, y->blk);
    if (x->tok == T_BLOCK || y->tok == T_BLOCK) {
        const sval *o = x->tok == T_BLOCK ? y : x, *bl = x->tok == T_BLOCK ? x : y;
        if (o->tok == T_OWN)
            return tok_is_own(C, bl);
        if (o->tok == T_ALL)
            return tok_is_all(C, bl);
        return NEVER;
    }
    if (x->tok == T_OTHER || y->tok == T_OTHER)
        return MIXED; /* another rank's shard: not tracked which */
    return x->tok == y->tok ? ALWAYS : NEVER;
}

static const char *tok_words(const sctx *C, const sval *v, char *buf, size_t n)
{
    switch (v->tok) {
    case T_UNSET: snprintf(buf, n, "no tokens yet"); break;
    case T_OWN: snprintf(buf, n, "its own shard"); break;
    case T_ALL: snprintf(buf, n, "all %" PRId64 " tokens (every ring block)", C->L->S); break;
    case T_KV: snprintf(buf, n, C->L->rep ? "the replicated segments" : "the cross-attention K/V sequence"); break;
    case T_OTHER: snprintf(buf, n, "another rank's shard"); break;
    default:
        if (C->in_loop && v->blk.b)
            snprintf(buf, n, "ring block (%" PRId64 "*r%+" PRId64 "*s%+" PRId64 ")%%R", v->blk.a, v->blk.b - C->R,
                     v->blk.c);
        else
            snprintf(buf, n, "ring block (%" PRId64 "*r+%" PRId64 ")%%R", v->blk.a, v->blk.c);
    }
    return buf;
}

/* Why v cannot live in buffer b: returns ALWAYS when it fits everywhere,
 * NEVER (with words in buf) when it never does, MIXED when on some ranks. */
static int fits(const sctx *C, int b, const sval *v, char *buf, size_t n)
{
    const cpc_buffer *B = &C->prog->buffers[b];
    char t1[160];
    if (v->tok != T_UNSET) {
        int ok;
        switch (B->tokens) {
        case CPC_TOK_SHARD: ok = tok_is_own(C, v); break;
        case CPC_TOK_BLOCK: ok = v->tok == T_BLOCK ? ALWAYS : v->tok == T_OTHER ? MIXED : NEVER; break;
        case CPC_TOK_ALL: ok = tok_is_all(C, v); break;
        case CPC_TOK_KV: ok = v->tok == T_KV ? ALWAYS : NEVER; break;
        default: ok = NEVER;
        }
        if (ok != ALWAYS) {
            snprintf(buf, n, "buffer %s (tokens %s) cannot hold %s", B->name, cpc_buf_tokens_name(B->tokens),
                     tok_words(C, v, t1, sizeof t1));
            return ok;
        }
    }
    int h = heads_same(C, v->src, buf_heads(C, b), v->heads);
    if (h != ALWAYS)
        snprintf(buf, n, "buffer %s holds %s heads, but the data has %s heads", B->name,
                 buf_heads(C, b) == HD_PART ? "the member's part of the" : "all", v->heads == HD_PART ? "a part of the" : "all");
    return h;
}

/* ---- coverage pieces ------------------------------------------------------------------ */

/* Concrete value of a bound in the current run, or false when it follows a
 * step that is a symbol. */
static bool bnd_at(const sctx *C, bnd x, int64_t *out)
{
    if (!x.rel) {
        *out = x.v;
        return true;
    }
    if (C->shi - C->slo != 1)
        return false;
    *out = x.v + C->slo;
    return true;
}

typedef struct cyc {
    int64_t a, st, len; /* blocks (a*r + st + i) mod R, i in [0, len) */
} cyc;

enum { CY_OK = 0, CY_DUP, CY_UNK };

static int piece_cyc(const sctx *C, const piece *p, int64_t lo, int64_t hi, cyc *out)
{
    int64_t R = C->R, len = hi - lo;
    out->a = p->f.a;
    out->len = len < 0 ? 0 : len;
    out->st = 0;
    if (len <= 0)
        return CY_OK;
    if (len > R)
        return CY_DUP;
    if (len == 1) {
        out->st = vc_mod(p->f.b * vc_mod(lo, R) + p->f.c, R);
        return CY_OK;
    }
    if (R == 1)
        return CY_DUP;
    if (p->f.b == 1) {
        out->st = vc_mod(lo + p->f.c, R);
        return CY_OK;
    }
    if (p->f.b == R - 1) {
        out->st = vc_mod(p->f.c - (hi - 1), R);
        return CY_OK;
    }
    return p->f.b == 0 ? CY_DUP : CY_UNK;
}

static bool cyc_overlap(const sctx *C, const cyc *x, const cyc *y)
{
    if (x->len == 0 || y->len == 0)
        return false;
    return vc_mod(y->st - x->st, C->R) < x->len || vc_mod(x->st - y->st, C->R) < y->len;
}

enum { DJ_YES = 0, DJ_OVERLAP, DJ_UNK };

/* Are the keys of np (new) and ep (already merged) disjoint on every rank
 * and every step of the run? */
static int disjoint(const sctx *C, const piece *np, const piece *ep)
{
    int64_t nlo = 0, nhi = 0, elo = 0, ehi = 0;
    bool nconc = bnd_at(C, np->lo, &nlo) && bnd_at(C, np->hi, &nhi);
    bool econc = bnd_at(C, ep->lo, &elo) && bnd_at(C, ep->hi, &ehi);
    if (nconc && nhi <= nlo)
        return DJ_YES;
    if (econc && ehi <= elo)
        return DJ_YES;
    if (np->kind == PC_ALL || ep->kind == PC_ALL)
        return (nconc && econc) ? DJ_OVERLAP : DJ_UNK;
    if (np->kind == PC_OWN || ep->kind == PC_OWN)
        return (np->kind == PC_OWN && ep->kind == PC_OWN && nconc && econc) ? DJ_OVERLAP : DJ_UNK;
    if (nconc && econc) {
        cyc x, y;
        int a = piece_cyc(C, np, nlo, nhi, &x), b = piece_cyc(C, ep, elo, ehi, &y);
        if (a == CY_DUP || b == CY_DUP)
            return DJ_OVERLAP;
        if (a != CY_OK || b != CY_OK)
            return DJ_UNK;
        if (x.a != y.a)
            return C->R > 1 || x.len ? DJ_OVERLAP : DJ_YES;
        return cyc_overlap(C, &x, &y) ? DJ_OVERLAP : DJ_YES;
    }
    /* a single block per step: np = {f(s + k)} for k = np->lo.v */
    bool nsingle = np->lo.rel && np->hi.rel && np->hi.v == np->lo.v + 1;
    if (!nsingle)
        return DJ_UNK;
    int64_t k = np->lo.v;
    /* its blocks over the run: f(t) for t in [slo + k, shi + k) */
    piece img = *np;
    img.lo = (bnd){C->slo + k, false};
    img.hi = (bnd){C->shi + k, false};
    if (econc) {
        cyc x, y;
        int a = piece_cyc(C, &img, C->slo + k, C->shi + k, &x), b = piece_cyc(C, ep, elo, ehi, &y);
        if (b == CY_DUP)
            return DJ_OVERLAP;
        if (a != CY_OK || b != CY_OK)
            return DJ_UNK;
        if (x.a != y.a)
            return DJ_OVERLAP;
        return cyc_overlap(C, &x, &y) ? DJ_OVERLAP : DJ_YES;
    }
    /* ep grows with the step: ep = {g(t) : t in [t0, s + k)} with the same
     * function: f(s+k) == f(t) for t < s+k iff b*(s+k-t) == 0 mod R. */
    if (ep->lo.rel || !ep->hi.rel || ep->hi.v != k || memcmp(&ep->f, &np->f, sizeof(aff)) != 0)
        return DJ_UNK;
    int64_t t0 = ep->lo.v, maxdiff = C->shi - 1 + k - t0;
    if (maxdiff < 1)
        return DJ_YES;
    int64_t ord = C->R / vc_gcd(np->f.b ? np->f.b : C->R, C->R);
    return ord <= maxdiff ? DJ_OVERLAP : DJ_YES;
}

/* Appends / extends: acc's pieces U np's.  False when acc is full. */
static bool pieces_add(const sctx *C, sval *acc, const piece *np)
{
    for (int i = 0; i < acc->npc; i++) {
        piece *ep = &acc->pc[i];
        if (ep->kind != PC_BLK || np->kind != PC_BLK)
            continue;
        if (ep->hi.rel != np->lo.rel || ep->hi.v != np->lo.v)
            continue;
        /* ep's blocks written with np's function? */
        bool same = memcmp(&ep->f, &np->f, sizeof(aff)) == 0;
        if (!same) {
            int64_t lo, hi;
            if (!bnd_at(C, ep->lo, &lo) || !bnd_at(C, ep->hi, &hi) || hi <= lo)
                continue;
            same = zero_on(C, ep->f.a - np->f.a, ep->f.b - np->f.b, ep->f.c - np->f.c, lo, hi) == ALWAYS;
        }
        if (!same)
            continue;
        ep->f = np->f;
        ep->hi = np->hi;
        ep->grew = 1;
        return true;
    }
    if (acc->npc == MAXPC)
        return false;
    piece p = *np;
    int64_t lo;
    if (p.lo.rel && bnd_at(C, p.lo, &lo))
        p.lo = (bnd){lo, false}; /* where it starts is fixed */
    p.grew = 1;
    acc->pc[acc->npc++] = p;
    return true;
}

/* ---- state ------------------------------------------------------------------------------ */

static sst *sst_new(int nb)
{
    sst *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    size_t n = (size_t)(nb > 0 ? nb : 1);
    s->v = calloc(n, sizeof(sval));
    s->nsend = calloc(n, sizeof(int32_t));
    s->rpend = malloc(n * sizeof(int32_t));
    if (!s->v || !s->nsend || !s->rpend) {
        free(s->v);
        free(s->nsend);
        free(s->rpend);
        free(s);
        return NULL;
    }
    for (int b = 0; b < nb; b++)
        s->rpend[b] = -1;
    return s;
}

static void sst_free(sst *s)
{
    if (!s)
        return;
    free(s->v);
    free(s->nsend);
    free(s->rpend);
    free(s);
}

/* The buffers of a state at the start of a loop step (requests are not
 * copied: a state that repeats has none in flight). */
typedef struct snap {
    sval *v;
    int32_t *nsend, *rpend;
    int nreq;
} snap;

static bool snap_take(snap *d, const sst *x, int nb)
{
    size_t n = (size_t)(nb > 0 ? nb : 1);
    if (!d->v) {
        d->v = malloc(n * sizeof(sval));
        d->nsend = malloc(n * sizeof(int32_t));
        d->rpend = malloc(n * sizeof(int32_t));
        if (!d->v || !d->nsend || !d->rpend)
            return false;
    }
    memcpy(d->v, x->v, sizeof(sval) * (size_t)nb);
    memcpy(d->nsend, x->nsend, sizeof(int32_t) * (size_t)nb);
    memcpy(d->rpend, x->rpend, sizeof(int32_t) * (size_t)nb);
    d->nreq = x->nreq;
    return true;
}

static void snap_free(snap *d)
{
    free(d->v);
    free(d->nsend);
    free(d->rpend);
    memset(d, 0, sizeof *d);
}

/* Stamps of two states correspond one to one. */
typedef struct smap {
    int n;
    int32_t x[256], y[256];
} smap;

static bool stamp_match(smap *m, int32_t a, int32_t b)
{
    for (int i = 0; i < m->n; i++) {
        if (m->x[i] == a || m->y[i] == b)
            return m->x[i] == a && m->y[i] == b;
    }
    if (m->n == 256)
        return false;
    m->x[m->n] = a;
    m->y[m->n] = b;
    m->n++;
    return true;
}

static bool sval_eq(const sval *x, const sval *y, smap *m)
{
    if (x->written != y->written || x->src != y->src || x->final != y->final || x->fresh != y->fresh ||
        x->merged != y->merged || x->tok != y->tok || x->heads != y->heads || x->kvcov != y->kvcov ||
        x->npc != y->npc)
        return false;
    if (x->tok == T_BLOCK && memcmp(&x->blk, &y->blk, sizeof(aff)) != 0)
        return false;
    for (int i = 0; i < x->npc; i++) {
        const piece *p = &x->pc[i], *q = &y->pc[i];
        if (p->kind != q->kind || memcmp(&p->f, &q->f, sizeof(aff)) != 0 || p->lo.v != q->lo.v ||
            p->lo.rel != q->lo.rel || p->hi.v != q->hi.v || p->hi.rel != q->hi.rel)
            return false;
    }
    return stamp_match(m, x->stamp, y->stamp);
}

/* Equal states with nothing in flight (the start of a loop step). */
static bool sst_repeat(const sctx *C, const snap *x, const sst *y)
{
    if (x->nreq || y->nreq)
        return false;
    smap m;
    m.n = 0;
    for (int b = 0; b < C->nb; b++) {
        if (x->nsend[b] || y->nsend[b] || x->rpend[b] >= 0 || y->rpend[b] >= 0)
            return false;
        if (!sval_eq(&x->v[b], &y->v[b], &m))
            return false;
    }
    return true;
}

static void each_sval(sctx *C, void (*fn)(sctx *, sval *))
{
    sst *s = C->st;
    for (int b = 0; b < C->nb; b++)
        fn(C, &s->v[b]);
    for (int i = 0; i < s->nreq; i++)
        for (int j = 0; j < s->req[i].nb; j++)
            fn(C, &s->req[i].snap[j]);
}

/* End of a concrete step s = slo: what this step did not touch no longer
 * follows s. */
static void settle(sctx *C, sval *v)
{
    if (!v->touched && v->tok == T_BLOCK && v->blk.b) {
        v->blk.c = vc_mod(v->blk.c + v->blk.b * vc_mod(C->slo, C->R), C->R);
        v->blk.b = 0;
    }
    for (int i = 0; i < v->npc; i++) {
        piece *p = &v->pc[i];
        if (p->grew)
            continue;
        if (p->lo.rel)
            p->lo = (bnd){p->lo.v + C->slo, false};
        if (p->hi.rel)
            p->hi = (bnd){p->hi.v + C->slo, false};
    }
}

/* s -> s+1: the same values written relative to the next step. */
static void advance(sctx *C, sval *v)
{
    if (v->tok == T_BLOCK)
        v->blk.c = vc_mod(v->blk.c - v->blk.b, C->R);
    for (int i = 0; i < v->npc; i++) {
        piece *p = &v->pc[i];
        if (p->lo.rel)
            p->lo.v--;
        if (p->hi.rel)
            p->hi.v--;
        p->grew = 0;
    }
    v->touched = 0;
}

/* Loop exit at s = N (in C->slo): everything becomes absolute. */
static void fold(sctx *C, sval *v)
{
    int64_t N = C->slo;
    if (v->tok == T_BLOCK) {
        v->blk.c = vc_mod(v->blk.c + v->blk.b * vc_mod(N, C->R), C->R);
        v->blk.b = 0;
    }
    for (int i = 0; i < v->npc; i++) {
        piece *p = &v->pc[i];
        if (p->lo.rel)
            p->lo = (bnd){p->lo.v + N, false};
        if (p->hi.rel)
            p->hi = (bnd){p->hi.v + N, false};
        p->grew = 0;
    }
    v->touched = 0;
}

static void adv_decl(sctx *C)
{
    sst *s = C->st;
    for (int i = 0; i < s->nreq; i++)
        if (!s->req[i].is_send)
            s->req[i].decl.c = vc_mod(s->req[i].decl.c - s->req[i].decl.b, C->R);
}

static void fold_decl(sctx *C)
{
    sst *s = C->st;
    for (int i = 0; i < s->nreq; i++)
        if (!s->req[i].is_send) {
            aff *d = &s->req[i].decl;
            d->c = vc_mod(d->c + d->b * vc_mod(C->slo, C->R), C->R);
            d->b = 0;
        }
}

/* ---- buffer access -------------------------------------------------------------------------- */

static int eval_block(sctx *C, const snode *nd, const cpc_expr *e, aff *out);

/* The domain's callbacks (sym_dom). */
#define SD(self) ((sym_dom *)(self))
#define SV(v) ((sval *)(v))
#define CSV(v) ((const sval *)(v))

static const char *dom_name(void *self, int b) { return bname(SD(self)->C, b); }

static vc_rq *dom_rq(void *self, int id) { return &SD(self)->C->st->req[id].h; }

static int dom_open(void *self, int i) { return i < SD(self)->C->st->nreq ? i : -1; }

static void dom_at(void *self, const vc_rq *q)
{
    sym_dom *d = self;
    d->nd = q->on, d->slo = q->slo, d->shi = q->shi, d->q = (const sreq *)q;
}

static void dom_at_writer(void *self, int b)
{
    const sval *v = &SD(self)->C->st->v[b];
    SD(self)->nd = v->written ? v->wop : NULL;
}

static void translate(const sctx *C, sval *v, int64_t d);

static void dom_deliver(void *self, vc_val *dst, vc_val *src, const vc_rq *s)
{
    *SV(dst) = *CSV(src);
    translate(SD(self)->C, SV(dst), ((const sreq *)s)->d);
    canon(SD(self)->C, SV(dst));
}

static const char *dom_writer(void *self, int b)
{
    sym_dom *d = self;
    return op_desc(d->C, d->C->st->v[b].wop, d->ob, sizeof d->ob);
}

static vc_val *dom_val(void *self, int b) { return &SD(self)->C->st->v[b].h; }

static vc_val *dom_tmp(void *self, int j)
{
    sval *v = &SD(self)->C->tmp[j];
    *v = sv_zero();
    return &v->h;
}

static bool dom_copy(void *self, vc_val *dst, const vc_val *src)
{
    (void)self;
    *SV(dst) = *CSV(src);
    return true;
}

static vc_tri dom_fits(void *self, int b, const vc_val *v, char *why, size_t n)
{
    return (vc_tri)fits(SD(self)->C, b, CSV(v), why, n); /* NEVER, ALWAYS, MIXED = VC_NO, VC_YES, VC_UNDECIDED */
}

static void dom_put(void *self, int b, vc_val *v)
{
    sym_dom *d = self;
    sval *x = SV(v);
    x->wop = d->nd;
    x->touched = 1;
    canon(d->C, x); /* (values are made canonical: shape, arrivals, inputs) */
    if (x == &d->C->st->v[b])
        return;
    d->C->st->v[b] = *x;
    *x = sv_zero();
}

static void dom_exchange(void *self, int a, int b)
{
    sval *v = SD(self)->C->st->v, t = v[a];
    v[a] = v[b];
    v[b] = t;
    v[a].touched = v[b].touched = 1;
}

static int32_t dom_new_stamp(void *self) { return SD(self)->C->st->next_stamp++; }

static void dom_shape(void *self, vc_val *v, int tok, int heads, int b, const vc_val *like)
{
    sctx *C = SD(self)->C;
    sval *x = SV(v);
    static const uint8_t toks[] = {[VC_T_UNSET] = T_UNSET, [VC_T_OWN] = T_OWN, [VC_T_BLOCK] = T_BLOCK,
                                   [VC_T_ALL] = T_ALL, [VC_T_KV] = T_KV};
    x->tok = toks[tok];
    if (tok == VC_T_BLOCK)
        x->blk = aff_norm(C, 1, 0, 0);
    x->heads = (uint8_t)(heads == VC_H_BUF    ? buf_heads(C, b)
                         : heads == VC_H_LIKE ? CSV(like)->heads
                         : heads == VC_H_PART ? HD_PART
                                              : HD_ALL);
    canon(C, x);
}

static vc_tri dom_tok_is(void *self, const vc_val *v, int tok)
{
    sctx *C = SD(self)->C;
    const sval *x = CSV(v);
    switch (tok) {
    case VC_T_OWN: return (vc_tri)tok_is_own(C, x);
    case VC_T_ALL: return (vc_tri)tok_is_all(C, x);
    case VC_T_BLOCK: return x->tok == T_BLOCK ? (vc_tri)aff_same(C, x->blk, aff_norm(C, 1, 0, 0)) : VC_NO;
    case VC_T_KV: return x->tok == T_KV ? VC_YES : VC_NO;
    default: return x->tok == T_UNSET ? VC_YES : VC_NO;
    }
}

static vc_tri dom_heads_are(void *self, const vc_val *v, int h)
{
    return (vc_tri)heads_same(SD(self)->C, v->src, CSV(v)->heads, h == VC_H_PART ? HD_PART : HD_ALL);
}

static vc_tri dom_same_tokens(void *self, const vc_val *x, const vc_val *y)
{
    return (vc_tri)tok_same(SD(self)->C, CSV(x), CSV(y));
}

static vc_tri dom_same_heads(void *self, const vc_val *x, const vc_val *y)
{
    return (vc_tri)heads_same(SD(self)->C, x->src, CSV(x)->heads, CSV(y)->heads);
}

static const char *dom_words(void *self, const vc_val *v, char *buf, size_t n)
{
    char t[160];
    snprintf(buf, n, "%s, %s", tok_words(SD(self)->C, CSV(v), t, sizeof t),
             CSV(v)->heads == HD_PART ? "the member's part of the heads" : "all heads");
    return buf;
}

static bool dom_has_keys(void *self, const vc_val *v)
{
    (void)self;
    return CSV(v)->npc > 0;
}

static vc_tri dom_attn_keys(void *self, const cpc_op *op, const vc_val *q, const vc_val *k, vc_val *o, char *why,
                            size_t n)
{
    sym_dom *d = self;
    sctx *C = d->C;
    const sval *Q = CSV(q), *K = CSV(k);
    piece np;
    memset(&np, 0, sizeof np);
    bool kv = false;
    np.lo = (bnd){0, C->in_loop};
    np.hi = (bnd){1, C->in_loop};
    if (op->block && C->prog->buffers[op->in[1]].tokens == CPC_TOK_ALL) {
        aff blk;
        if (eval_block(C, d->nd, op->block, &blk))
            return VC_NO;
        int a = tok_is_all(C, K);
        if (a != ALWAYS)
            return snprintf(why, n, a == NEVER ? "reads a ring block of %s, which does not hold every block"
                                               : "cannot decide for every rank that %s holds every block",
                            bname(C, op->in[1])),
                   (vc_tri)a;
        np.kind = PC_BLK;
        np.f = blk;
    } else {
        switch (K->tok) {
        case T_KV: kv = true; break;
        case T_BLOCK: np.kind = PC_BLK; np.f = K->blk; break;
        case T_ALL: np.kind = PC_ALL; break;
        case T_OWN: np.kind = PC_OWN; break;
        default: return snprintf(why, n, "attends keys of another rank's shard"), VC_UNDECIDED;
        }
    }
    /* GQA: the K/V heads the query heads use */
    if (K->heads == HD_PART && Q->heads == HD_ALL && C->kvclass != HC_ALL)
        return snprintf(why, n, "query heads (all) need every K/V head; %s holds %s", bname(C, op->in[1]),
                        C->kvclass == HC_NONE ? "the member's part" : "all of them only on some members"),
               C->kvclass == HC_NONE ? VC_NO : VC_UNDECIDED;
    sval *x = SV(o);
    x->tok = Q->tok;
    x->blk = Q->blk;
    x->heads = Q->heads;
    if (kv) {
        x->kvcov = 1;
    } else {
        x->npc = 1;
        x->pc[0] = np;
        x->pc[0].grew = 1;
    }
    return VC_YES;
}

static vc_tri dom_merge_keys(void *self, vc_val *accv, const vc_val *av, char *why, size_t n)
{
    sctx *C = SD(self)->C;
    sval *acc = SV(accv);
    const sval *A = CSV(av);
    int npc = acc->npc;
    for (int i = 0; i < A->npc; i++)
        for (int k = 0; k < npc; k++) {
            int dj = disjoint(C, &A->pc[i], &acc->pc[k]);
            if (dj == DJ_OVERLAP)
                return snprintf(why, n, "some keys/values"), VC_NO;
            if (dj == DJ_UNK)
                return snprintf(why, n, "the blocks do not follow one rule"), VC_UNDECIDED;
        }
    for (int i = 0; i < A->npc; i++)
        if (!pieces_add(C, acc, &A->pc[i]))
            return snprintf(why, n, "more than %d separate runs of blocks", MAXPC), VC_UNDECIDED;
    acc->tok = A->tok;
    acc->blk = A->blk;
    return VC_YES;
}

static vc_tri dom_select_heads(void *self, vc_val *v, int bo, int bi, char *why, size_t n)
{
    sctx *C = SD(self)->C;
    sval *x = SV(v);
    int oh = buf_heads(C, bo);
    int same = heads_same(C, x->src, oh, x->heads);
    if (same == ALWAYS)
        return VC_YES;
    if (!(oh == HD_PART && x->heads == HD_ALL)) /* selecting the member's part of all heads always works */
        return same == NEVER ? (snprintf(why, n, "cannot select all heads of %s from %s, which holds the member's part",
                                         bname(C, bo), bname(C, bi)),
                                VC_NO)
                             : (snprintf(why, n, "cannot decide for every member the heads %s selects", bname(C, bo)),
                                VC_UNDECIDED);
    x->heads = (uint8_t)oh;
    return VC_YES;
}

/* The block part of coverage (the step's vc_complete ran the rest); reports
 * a fault or an undecided case itself. */
static vc_tri dom_covered(void *self, const vc_val *vv, const char *name, char *why, size_t wn)
{
    sctx *C = SD(self)->C;
    const snode *nd = SD(self)->nd;
    const sval *v = CSV(vv);
    (void)why, (void)wn;
    cyc cs[MAXPC];
    int n = 0;
    int64_t total = 0;
    bool all = false;
    for (int i = 0; i < v->npc; i++) {
        const piece *p = &v->pc[i];
        int64_t lo, hi;
        if (!bnd_at(C, p->lo, &lo) || !bnd_at(C, p->hi, &hi))
            return sund(C, nd, "the keys merged into %s follow the loop step", name), VC_UNDECIDED;
        if (hi <= lo)
            continue;
        if (p->kind == PC_ALL) {
            all = true;
            continue;
        }
        if (p->kind == PC_OWN)
            return sund(C, nd, "%s holds keys of single shards, not of whole ring blocks", name), VC_UNDECIDED;
        int r = piece_cyc(C, p, lo, hi, &cs[n]);
        if (r == CY_DUP)
            return serr(C, nd, "the query rows of %s meet some keys/values twice", name), VC_NO;
        if (r != CY_OK)
            return sund(C, nd, "the blocks merged into %s are not a run of consecutive blocks", name), VC_UNDECIDED;
        if (n > 0 && cs[n].a != cs[0].a)
            return sund(C, nd, "the blocks merged into %s mix blocks fixed and blocks relative to the rank", name),
                   VC_UNDECIDED;
        total += cs[n].len;
        n++;
    }
    if (all)
        return n > 0 ? (serr(C, nd, "the query rows of %s meet some keys/values twice", name), VC_NO) : VC_YES;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (cyc_overlap(C, &cs[i], &cs[j]))
                return serr(C, nd, "the query rows of %s meet some keys/values twice", name), VC_NO;
    if (total == C->R)
        return VC_YES;
    if (C->L->causal && !C->L->zigzag)
        return sund(C, nd, "%s misses some blocks; with a causal mask and contiguous shards which blocks may "
                           "be skipped depends on the rank",
                    name),
               VC_UNDECIDED;
    int64_t miss = -1; /* the first block rank 0 misses */
    for (int64_t x = 0; x < C->R && miss < 0; x++) {
        bool in = false;
        for (int i = 0; i < n && !in; i++)
            in = vc_mod(x - cs[i].st, C->R) < cs[i].len;
        if (!in)
            miss = x;
    }
    serr(C, nd,
         "%s is incomplete: its query rows never met the keys/values of ring block %" PRId64
         " (on rank 0; %" PRId64 " of %" PRId64 " blocks missing on every rank: a ring step dropped or a "
         "block skipped?)",
         name, miss, C->R - total, C->R);
    return VC_NO;
}

static vc_tri dom_declared(void *self, vc_val *v, const void *rq, char *words, size_t n)
{
    sctx *C = SD(self)->C;
    const sreq *r = rq;
    sval *x = SV(v), decl = sv_zero();
    int same = x->tok == T_BLOCK ? aff_same(C, x->blk, r->decl) : NEVER;
    if (same == ALWAYS)
        x->blk = r->decl; /* equal on every rank and step; the declared form follows s */
    decl.tok = T_BLOCK;
    decl.blk = r->decl;
    if (same == NEVER)
        tok_words(C, &decl, words, n);
    return (vc_tri)same;
}

static void dom_sender(void *self, const void *rq, char *who, size_t nw, char *op, size_t no)
{
    sctx *C = SD(self)->C;
    const sreq *s = &C->st->req[((const sreq *)rq)->match];
    snprintf(who, nw, "ring member r-%" PRId64, s->d);
    vc_op_desc(s->on, s->slo, s->shi, op, no);
}

static vc_tri dom_post(void *self, const cpc_op *op);

static const vc_domain sym_ops = {
    .name = dom_name, .rq = dom_rq, .open = dom_open, .at = dom_at, .at_writer = dom_at_writer, .post = dom_post,
    .deliver = dom_deliver, .snap_off = offsetof(sreq, snap),
    .writer = dom_writer, .val = dom_val, .tmp = dom_tmp, .copy = dom_copy, .fits = dom_fits, .put = dom_put,
    .exchange = dom_exchange, .new_stamp = dom_new_stamp, .shape = dom_shape, .tok_is = dom_tok_is,
    .heads_are = dom_heads_are, .same_tokens = dom_same_tokens, .same_heads = dom_same_heads, .words = dom_words,
    .has_keys = dom_has_keys, .attn_keys = dom_attn_keys, .merge_keys = dom_merge_keys,
    .select_heads = dom_select_heads, .covered = dom_covered, .declared = dom_declared,
    .sender = dom_sender, .p2p_attn = false, .val_size = sizeof(sval)};

/* The domain at the op nd, the message emptied. */
static const vc_domain *at(sctx *C, const snode *nd)
{
    C->d.nd = nd, C->d.slo = C->slo, C->d.shi = C->shi, C->m[0] = 0;
    return &C->dom;
}

#define MSG(C) (C)->m, sizeof (C)->m

/* A step's answer as the proof's result where the domain stands. */
static int sres(sctx *C, vc_tri t)
{
    switch (t) {
    case VC_YES: return 0;
    case VC_OOM: return snomem(C);
    case VC_UNDECIDED: return sund(C, C->d.nd, "%s", C->m[0] ? C->m : "undecided");
    default: return serr_in(C, C->d.nd, C->d.slo, C->d.shi, 0, "%s", C->m[0] ? C->m : "fault (no message)");
    }
}

/* ---- expressions of ops ----------------------------------------------------------------------- */

/* The ring block named by e, as an affine form (mod R). */
static int eval_block(sctx *C, const snode *nd, const cpc_expr *e, aff *out)
{
    lin x;
    if (!lin_eval(C, e, cpc_expr_root(e), &x))
        return sund(C, nd, "block `%s` is not an affine form of r and s", cpc_expr_text(e));
    int64_t R = C->R;
    if (x.mod) {
        if (x.mod != R)
            return sund(C, nd, "block `%s` is taken modulo %" PRId64 ", not modulo R", cpc_expr_text(e), x.mod);
    } else {
        /* must stay in [0, R) without the modulo: check the corners */
        int64_t lo = 0, hi = 0;
        int64_t cs[2] = {x.cr * 0, x.cr * (R - 1)}, cu[2] = {0, x.cu * (C->U - 1)},
                cst[2] = {x.cs * C->slo, x.cs * (C->shi - 1)};
        if (!C->in_loop)
            cst[0] = cst[1] = 0;
        lo = x.c + (cs[0] < cs[1] ? cs[0] : cs[1]) + (cu[0] < cu[1] ? cu[0] : cu[1]) +
             (cst[0] < cst[1] ? cst[0] : cst[1]);
        hi = x.c + (cs[0] > cs[1] ? cs[0] : cs[1]) + (cu[0] > cu[1] ? cu[0] : cu[1]) +
             (cst[0] > cst[1] ? cst[0] : cst[1]);
        if (lo < 0 || hi >= R) {
            int64_t bad = lo < 0 ? lo : hi;
            int64_t r = (lo < 0) == (x.cr > 0) ? 0 : R - 1;
            return serr_at(C, nd, r, "block %" PRId64 " (`%s`) is not a ring block (0..%" PRId64 ")", bad,
                           cpc_expr_text(e), R - 1);
        }
    }
    if (vc_mod(x.cu, R) != 0)
        return sund(C, nd, "block `%s` depends on the ulysses index", cpc_expr_text(e));
    aff a = aff_norm(C, x.cr, x.cs, x.c);
    if (a.a > 1)
        return sund(C, nd, "block `%s` is not r or a constant plus steps", cpc_expr_text(e));
    *out = a;
    return 0;
}

/* The ring offset d of a peer (r + d) mod R. */
static int eval_peer(sctx *C, const snode *nd, int64_t *d)
{
    const cpc_op *op = nd->op;
    if (op->group != CPC_GROUP_RING && !(op->group == CPC_GROUP_WORLD && C->U == 1))
        return sund(C, nd, "point-to-point in the %s group (only the ring group is proved symbolically)",
                    cpc_group_name(op->group));
    lin x;
    const cpc_expr *e = op->peer;
    if (!lin_eval(C, e, cpc_expr_root(e), &x))
        return sund(C, nd, "peer `%s` is not an affine form of r", cpc_expr_text(e));
    int64_t R = C->R;
    if (x.mod && x.mod != R)
        return sund(C, nd, "peer `%s` is taken modulo %" PRId64 ", not modulo R", cpc_expr_text(e), x.mod);
    if (!x.mod && x.cr == 1 && x.cu == 0 && x.cs == 0 && x.c != 0)
        return serr_at(C, nd, x.c > 0 ? R - 1 : 0, "peer %" PRId64 " (`%s`) is outside the %s group (size %" PRId64 ")",
                       x.c > 0 ? R - 1 + x.c : x.c, cpc_expr_text(e), cpc_group_name(op->group), R);
    if (vc_mod(x.cr, R) != vc_mod(1, R) || vc_mod(x.cu, R) != 0 || vc_mod(x.cs, R) != 0 || (!x.mod && (x.cr != 1 || x.cu || x.cs)))
        return sund(C, nd, "peer `%s` is not a rotation of the ring ((r + constant) mod R)", cpc_expr_text(e));
    *d = vc_mod(x.c, R);
    return 0;
}

static int eval_uniform(sctx *C, const snode *nd, const cpc_expr *e, const char *what, int64_t s, int64_t *out)
{
    if (cpc_expr_uses(e, 'r') || cpc_expr_uses(e, 'u') || cpc_expr_uses(e, 'p'))
        return sund(C, nd, "%s `%s` depends on the rank: the ranks do not run the same ops", what, cpc_expr_text(e));
    cpc_coords c = {0, 0, 0, s, C->R, C->U, C->P};
    cpc_status *st = cpc_expr_eval(e, &c, out);
    if (st) {
        sund(C, nd, "cannot evaluate %s `%s`: %s", what, cpc_expr_text(e), st->message);
        cpc_status_free(st);
        return -1;
    }
    return 0;
}

/* ---- requests ------------------------------------------------------------------------------------- */

static void compact(sctx *C)
{
    sst *s = C->st;
    int map[MAXREQ];
    int k = 0;
    for (int i = 0; i < s->nreq; i++) {
        const sreq *q = &s->req[i];
        bool gone = q->done && q->match >= 0 && s->req[q->match].done;
        map[i] = gone ? -1 : k++;
    }
    if (k == s->nreq)
        return;
    for (int i = 0; i < s->nreq; i++) {
        if (map[i] < 0)
            continue;
        sreq q = s->req[i];
        if (q.match >= 0)
            q.match = map[q.match]; /* (never gone: a pair goes together) */
        s->req[map[i]] = q;
    }
    for (int b = 0; b < C->nb; b++)
        if (s->rpend[b] >= 0)
            s->rpend[b] = map[s->rpend[b]];
    s->nreq = k;
}

/* The value rank r receives of what rank r - d sent (v, in r-d's terms). */
static void translate(const sctx *C, sval *v, int64_t d)
{
    if (v->tok == T_BLOCK)
        v->blk.c = vc_mod(v->blk.c - v->blk.a * d, C->R);
    else if (v->tok == T_OWN && d != 0)
        v->tok = T_OTHER;
    /* (no coverage pieces: attention data does not travel point to point here) */
}

static int match_pair(sctx *C, int sid, int rid)
{
    return sres(C, vc_match(at(C, C->st->req[rid].on), sid, rid, MSG(C)));
}

static int post(sctx *C, int id)
{
    sst *s = C->st;
    sreq *q = &s->req[id];
    for (int i = 0; i < s->nreq; i++) {
        sreq *o = &s->req[i];
        if (i == id || o->match >= 0 || o->is_send == q->is_send || o->key != q->key || o->tag != q->tag ||
            o->group != q->group)
            continue;
        return q->is_send ? match_pair(C, id, i) : match_pair(C, i, id);
    }
    return 0;
}

/* A send/recv: its peer offset and declared block, posted, matched against
 * the generic rank's own requests. */
static vc_tri dom_post(void *self, const cpc_op *op)
{
    sctx *C = SD(self)->C;
    const snode *nd = SD(self)->nd;
    sst *s = C->st;
    bool is_send = op->kind == CPC_OP_SEND;
    int64_t d = 0;
    aff decl = {0, 0, 0};
    if (eval_peer(C, nd, &d) || (!is_send && eval_block(C, nd, op->block, &decl)))
        return VC_NO;
    if (s->nreq == MAXREQ)
        return sund(C, nd, "more than %d requests in flight", MAXREQ), VC_UNDECIDED;
    int id = s->nreq++;
    sreq *q = &s->req[id];
    memset(q, 0, sizeof *q);
    q->h = (vc_rq){.peer = -1, .on = nd, .slo = C->slo, .shi = C->shi};
    q->d = d;
    q->key = is_send ? d : vc_mod(-d, C->R);
    q->decl = decl;
    vc_post(&C->dom, op, id); /* (copies: no allocation) */
    return post(C, id) ? VC_NO : VC_YES;
}

/* ---- ops ------------------------------------------------------------------------------------------ */

/* One op.  Every member of a group reaches a collective at the same point
 * (the guards do not depend on the rank), so it runs at once, checked on the
 * generic member; a wait with a request not matched yet is a deadlock, since
 * every rank runs the same ops and so blocks there at once. */
static int exec_op(sctx *C, const snode *nd)
{
    C->stats.op_instances++;
    vc_tri t = vc_step(at(C, nd), nd->op, MSG(C));
    if (t == VC_BLOCKED) {
        const sreq *q = C->d.q;
        char who[48], m[640];
        snprintf(who, sizeof who, "ring member r%s%" PRId64, q->is_send ? "+" : "-", q->d);
        vc_deadlock(&q->h, "every rank blocks here", who,
                    "the peer runs the same ops, so it is blocked here too, or never posts one", m, sizeof m);
        return serr(C, nd, "%s", m);
    }
    if (sres(C, t))
        return -1;
    if (nd->op->kind == CPC_OP_WAIT)
        compact(C);
    return 0;
}

/* ---- loops ------------------------------------------------------------------------------------------- */

/* Runs the body once for the steps [C->slo, C->shi) (one step, or a symbol). */
static int run_body(sctx *C, const snode *loop, const bool *active)
{
    for (int i = 0; i < loop->n_body; i++) {
        if (!active[i])
            continue;
        const snode *nd = &loop->body[i];
        if (nd->op->kind == CPC_OP_LOOP) {
            int64_t cnt;
            if (nd->op->count && cpc_expr_uses(nd->op->count, 's'))
                return sund(C, nd, "a nested loop whose count follows the step");
            if (eval_uniform(C, nd, nd->op->count, "count", 0, &cnt))
                return -1;
            if (cnt < 0 || cnt > CPC_LOOP_MAX)
                return serr(C, nd, "loop count %" PRId64 " (`%s`) is outside 0..%d", cnt, cpc_expr_text(nd->op->count),
                            CPC_LOOP_MAX);
            if (cnt > 0 && nd->n_body > 0)
                return sund(C, nd, "a nested loop runs (only top-level loops are proved symbolically)");
            continue;
        }
        if (exec_op(C, nd))
            return -1;
    }
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int run_loop(sctx *C, const snode *nd)
{
    const cpc_op *op = nd->op;
    int64_t N;
    if (eval_uniform(C, nd, op->count, "count", 0, &N))
        return -1;
    if (N < 0 || N > CPC_LOOP_MAX)
        return serr(C, nd, "loop count %" PRId64 " (`%s`) is outside 0..%d", N, cpc_expr_text(op->count), CPC_LOOP_MAX);
    if (N == 0 || nd->n_body == 0)
        return 0;
    int nb = nd->n_body;
    /* steps of every guard */
    iset *sets = calloc((size_t)nb, sizeof(iset));
    bool *perstep = calloc((size_t)nb, sizeof(bool));
    bool *active = calloc((size_t)nb, sizeof(bool));
    int64_t *cuts = NULL;
    int ncut = 0;
    int rc = -1;
    if (!sets || !perstep || !active) {
        snomem(C);
        goto out;
    }
    C->in_loop = true;
    C->slo = C->shi = 0;
    cuts = malloc(sizeof(int64_t) * (size_t)(2 + nb * 2 * MAX_IVL + (N <= SMALL_LOOP ? N : 0)));
    if (!cuts) {
        snomem(C);
        goto out;
    }
    cuts[ncut++] = 0;
    cuts[ncut++] = N;
    bool every_step = false;
    for (int i = 0; i < nb; i++) {
        const cpc_expr *w = nd->body[i].op->when;
        if (!w) {
            is_all(&sets[i], N);
            continue;
        }
        if (cpc_expr_uses(w, 'r') || cpc_expr_uses(w, 'u') || cpc_expr_uses(w, 'p')) {
            sund(C, &nd->body[i], "`when` `%s` depends on the rank: the ranks do not run the same ops",
                 cpc_expr_text(w));
            goto out;
        }
        if (steps_of(C, w, cpc_expr_root(w), N, &sets[i])) {
            for (int k = 0; k < sets[i].n; k++) {
                cuts[ncut++] = sets[i].v[k].lo;
                cuts[ncut++] = sets[i].v[k].hi;
            }
        } else if (N <= SMALL_LOOP) {
            perstep[i] = true;
            every_step = true;
        } else {
            sund(C, &nd->body[i], "`when` `%s` is not an interval of steps", cpc_expr_text(w));
            goto out;
        }
    }
    if (every_step) /* cut at every step */
        for (int64_t k = 1; k < N; k++)
            cuts[ncut++] = k;
    qsort(cuts, (size_t)ncut, sizeof *cuts, cmp_i64);
    {
        /* the bound (verify.h THE PROVER'S BOUND): each phase runs the body
         * at most FIX_TRIES + 2 times and evaluates every `when` twice */
        int64_t phases = 0, per = 0;
        for (int i = 0; i + 1 < ncut; i++)
            phases += cuts[i + 1] > cuts[i];
        for (int i = 0; i < nb; i++)
            per += (FIX_TRIES + 2) + 2 * (int64_t)cpc_expr_size(nd->body[i].op->when);
        int64_t w = phases > 0 && per > (CPC_VERIFY_WORK_MAX - C->work) / phases ? CPC_VERIFY_WORK_MAX + 1
                                                                                  : C->work + phases * per;
        if (w > CPC_VERIFY_WORK_MAX) {
            sund(C, nd,
                 "the `when`s of its %d body ops cut its %" PRId64 " steps into %" PRId64 " phases: proving it "
                 "would take more than the prover's bound of %" PRId64 " units of work (phases x (body ops x %d + "
                 "2 x `when` nodes))",
                 nb, N, phases, (int64_t)CPC_VERIFY_WORK_MAX, FIX_TRIES + 2);
            goto out;
        }
        C->work = w;
    }
    for (int p = 0; p + 1 < ncut && !C->result; p++) {
        int64_t lo = cuts[p], hi = cuts[p + 1];
        if (hi <= lo)
            continue;
        C->stats.phases++;
        for (int i = 0; i < nb; i++) {
            if (perstep[i]) {
                int64_t w;
                if (eval_uniform(C, &nd->body[i], nd->body[i].op->when, "`when`", lo, &w))
                    goto out;
                active[i] = w != 0;
                continue;
            }
            bool in = false;
            for (int k = 0; k < sets[i].n; k++)
                in |= sets[i].v[k].lo <= lo && lo < sets[i].v[k].hi;
            active[i] = in;
            /* the interval analysis against the evaluator, at both ends */
            if (nd->body[i].op->when) {
                int64_t w0, w1;
                if (eval_uniform(C, &nd->body[i], nd->body[i].op->when, "`when`", lo, &w0) ||
                    eval_uniform(C, &nd->body[i], nd->body[i].op->when, "`when`", hi - 1, &w1))
                    goto out;
                if ((w0 != 0) != in || (w1 != 0) != in) {
                    sund(C, &nd->body[i], "`when` `%s`: the step analysis disagrees with evaluation",
                         cpc_expr_text(nd->body[i].op->when));
                    goto out;
                }
            }
        }
        int64_t k = lo;
        snap prev;
        bool have_prev = false;
        memset(&prev, 0, sizeof prev);
        while (k < hi && !C->result) {
            if (hi - lo > UNROLL_MAX && have_prev && sst_repeat(C, &prev, C->st)) {
                /* steps k..hi-1 all start from this state: one symbolic step */
                C->slo = k;
                C->shi = hi;
                if (run_body(C, nd, active))
                    break;
                if (C->st->nreq)
                    compact(C);
                each_sval(C, advance);
                adv_decl(C);
                if (!sst_repeat(C, &prev, C->st)) {
                    sund(C, nd, "the loop's state does not repeat from step %" PRId64 " on", k);
                    break;
                }
                C->stats.jumps++;
                k = hi;
                break;
            }
            if (hi - lo > UNROLL_MAX && k - lo >= FIX_TRIES) {
                sund(C, nd, "the loop's state does not repeat within %d steps of phase [%" PRId64 ", %" PRId64 ")",
                     FIX_TRIES, lo, hi);
                break;
            }
            if (hi - lo > UNROLL_MAX) {
                if (!snap_take(&prev, C->st, C->nb)) {
                    snomem(C);
                    break;
                }
                have_prev = true;
            }
            C->slo = k;
            C->shi = k + 1;
            if (run_body(C, nd, active))
                break;
            each_sval(C, settle);
            each_sval(C, advance);
            adv_decl(C);
            k++;
        }
        snap_free(&prev);
    }
    if (!C->result) {
        C->slo = N; /* fold at s = N */
        each_sval(C, fold);
        fold_decl(C);
        rc = 0;
    }
out:
    C->in_loop = false;
    C->slo = 0;
    C->shi = 1;
    free(cuts);
    free(sets);
    free(perstep);
    free(active);
    return C->result ? -1 : rc;
}

/* ---- driver ------------------------------------------------------------------------------------------- */

static int finish(sctx *C)
{
    return sres(C, vc_finish(at(C, NULL), MSG(C))); /* (at the request, or the OUTPUT's writer) */
}

cpc_sym_result cpc_verify_symbolic(const cpc_program *prog, cpc_status **diag, cpc_sym_stats *stats)
{
    *diag = NULL;
    sctx C;
    memset(&C, 0, sizeof C);
    C.prog = prog;
    C.L = &prog->layout;
    C.R = prog->layout.R;
    C.U = prog->layout.U;
    C.P = prog->layout.P;
    C.nb = prog->n_buffers;
    C.slo = 0;
    C.shi = 1;
    if (C.P <= 1) {
        /* one rank: enumeration is the proof */
        sund(&C, NULL, "a world of one rank is enumerated");
        goto done;
    }
    heads_classes(&C);
    bool bad = false;
    C.root = vc_nodes(prog->ops, prog->n_ops, MAX_DEPTH, &bad);
    C.n_root = C.root ? prog->n_ops : 0;
    C.st = sst_new(C.nb);
    if (bad || !C.st || (prog->n_ops > 0 && !C.root)) {
        snomem(&C);
        goto done;
    }
    C.d.C = &C;
    C.dom = sym_ops;
    C.dom.self = &C.d, C.dom.prog = prog, C.dom.cross = C.L->cross, C.dom.rep = C.L->rep;
    C.dom.nsend = C.st->nsend, C.dom.rpend = C.st->rpend;
    vc_inputs(at(&C, NULL));
    for (int i = 0; i < C.n_root && !C.result; i++) {
        const snode *nd = &C.root[i];
        if (nd->op->when) {
            int64_t w;
            if (eval_uniform(&C, nd, nd->op->when, "`when`", 0, &w))
                break;
            if (!w)
                continue;
        }
        if (nd->op->kind == CPC_OP_LOOP) {
            if (run_loop(&C, nd))
                break;
        } else if (exec_op(&C, nd)) {
            break;
        }
    }
    if (!C.result)
        finish(&C);
done:
    vc_nodes_free(C.root, C.n_root);
    sst_free(C.st);
    if (stats)
        *stats = C.stats;
    if (C.result == CPC_SYM_NOMEM) {
        cpc_status_free(C.diag);
        return CPC_SYM_NOMEM;
    }
    if (C.diag == &cpc_status_oom)
        return CPC_SYM_NOMEM;
    *diag = C.diag;
    return C.result ? (cpc_sym_result)C.result : CPC_SYM_PROVED;
}
