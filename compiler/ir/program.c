/* program.c - the op program container: names, construction, cloning,
 * capacities, the per-rank walk, byte counts and the stable text form; see
 * program.h for the semantics of every op. */
#include "program.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- name tables ---------------------------------------------------------- */

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The op table (program.h): one entry per kind.  Columns: name, arity,
 * operands in words, group, flags, cost rule, host launches; then operand
 * access (in, out), required input content, output content, matching rule
 * and lifetime. */
#define MAXB CPC_OP_MAX_BUFS
#define R_ CPC_ACCESS_READ
#define W_ CPC_ACCESS_WRITE
#define A_ CPC_ACCESS_ACCUMULATE
#define N_ CPC_ACCESS_NONE
#define CQ CPC_CONTENT_Q
#define CK CPC_CONTENT_K
#define CV CPC_CONTENT_V
#define CO CPC_CONTENT_OUT
#define CL CPC_CONTENT_LSE
#define CD CPC_CONTENT_DOUT
#define CE CPC_CONTENT_DELTA
#define CG CPC_CONTENT_GRAD
static const cpc_op_info op_table[] = {
    [CPC_OP_LOOP] = {"loop", 0, 0, 0, 0, false, "no buffers (a count and a body)", CPC_GROUP_NONE,
                     CPC_OPF_BODY | CPC_OPF_FWD | CPC_OPF_BWD, CPC_COST_LOOP, 0, N_, N_, {0}, {0}, CPC_MATCH_NONE, CPC_LIFE_OP, CPC_TAGR_KEEP},
    /* init_acc: outputs zeroed (ACC, with LSE -inf; or gradients): their content is
     * set by role (OUT/LSE, or GRAD), not carried */
    [CPC_OP_INIT_ACC] = {"init_acc", 0, MAXB, 0, MAXB, false, "an accumulator and its LSE (2 buffers)",
                         CPC_GROUP_NONE, CPC_OPF_FWD | CPC_OPF_BWD, CPC_COST_INIT, 1, N_, W_, {0}, {0}, CPC_MATCH_NONE, CPC_LIFE_OP, CPC_TAGR_BLOCK},
    [CPC_OP_ATTN] = {"attn", 3, 3, 2, 2, false, "3 inputs (q, k, v) and 2 outputs (o, lse)",
                     CPC_GROUP_NONE, CPC_OPF_FWD | CPC_OPF_BWD, CPC_COST_ATTN, 1, R_, W_, {CQ, CK, CV}, {CO, CL}, CPC_MATCH_NONE,
                     CPC_LIFE_OP, CPC_TAGR_FROM_IN0},
    [CPC_OP_MERGE] = {"merge", 2, 2, 2, 2, false,
                      "2 inputs (o, lse of a block) and 2 outputs (acc, lse)", CPC_GROUP_NONE,
                      CPC_OPF_READS_OUT | CPC_OPF_FWD | CPC_OPF_BWD, CPC_COST_MEMORY, 2, R_, A_, {CO, CL}, {CO, CL}, CPC_MATCH_NONE,
                      CPC_LIFE_OP, CPC_TAGR_FROM_IN0},
    [CPC_OP_SEND] = {"send", 1, MAXB, 0, 0, false, "1..8 inputs and no output", CPC_GROUP_NONE,
                     CPC_OPF_GROUP | CPC_OPF_TAG | CPC_OPF_PEER | CPC_OPF_COMM_TIME | CPC_OPF_FWD | CPC_OPF_BWD, CPC_COST_SEND, 1, R_, N_,
                     {0}, {0}, CPC_MATCH_SEND, CPC_LIFE_UNTIL_WAIT, CPC_TAGR_KEEP},
    [CPC_OP_RECV] = {"recv", 0, 0, 1, MAXB, false, "1..8 outputs and no input", CPC_GROUP_NONE,
                     CPC_OPF_GROUP | CPC_OPF_TAG | CPC_OPF_PEER | CPC_OPF_BLOCK | CPC_OPF_COMM_TIME | CPC_OPF_FWD | CPC_OPF_BWD,
                     CPC_COST_NONE, 0, N_, W_, {0}, {0}, CPC_MATCH_RECV, CPC_LIFE_UNTIL_WAIT, CPC_TAGR_BLOCK},
    [CPC_OP_WAIT] = {"wait", 0, 0, 0, 0, false, "no buffers (a tag)", CPC_GROUP_NONE,
                     CPC_OPF_TAG | CPC_OPF_COMM_TIME | CPC_OPF_FWD | CPC_OPF_BWD, CPC_COST_WAIT, 0, N_, N_, {0}, {0}, CPC_MATCH_COMPLETE,
                     CPC_LIFE_OP, CPC_TAGR_KEEP},
    [CPC_OP_SWAP] = {"swap", 2, 2, 0, 0, false, "2 different buffers (in[0], in[1]) and no output",
                     CPC_GROUP_NONE, CPC_OPF_FWD | CPC_OPF_BWD, CPC_COST_NONE, 0, CPC_ACCESS_REBIND, N_, {0}, {0}, CPC_MATCH_NONE,
                     CPC_LIFE_OP, CPC_TAGR_EXCHANGE},
    [CPC_OP_ALL_TO_ALL] = {"all_to_all", 1, MAXB, 1, MAXB, true,
                           "as many outputs as inputs (1..8)", CPC_GROUP_ULYSSES,
                           CPC_OPF_GROUP | CPC_OPF_COLLECTIVE | CPC_OPF_COMM_TIME | CPC_OPF_FWD | CPC_OPF_BWD,
                           CPC_COST_ALL_TO_ALL, 1, R_, W_, {0}, {0}, CPC_MATCH_COLLECTIVE, CPC_LIFE_OP, CPC_TAGR_A2A},
    [CPC_OP_ALL_GATHER] = {"all_gather", 1, MAXB, 1, MAXB, true,
                           "as many outputs as inputs (1..8)", CPC_GROUP_RING,
                           CPC_OPF_GROUP | CPC_OPF_COLLECTIVE | CPC_OPF_COMM_TIME | CPC_OPF_FWD | CPC_OPF_BWD,
                           CPC_COST_ALL_GATHER, 1, R_, W_, {0}, {0}, CPC_MATCH_COLLECTIVE, CPC_LIFE_OP, CPC_TAGR_KEEP},
    [CPC_OP_COPY] = {"copy", 1, MAXB, 1, MAXB, true, "as many outputs as inputs (1..8)",
                     CPC_GROUP_NONE, CPC_OPF_FWD | CPC_OPF_BWD, CPC_COST_MEMORY, 1, R_, W_, {0}, {0}, CPC_MATCH_NONE, CPC_LIFE_OP, CPC_TAGR_PAIRED},
    [CPC_OP_BARRIER] = {"barrier", 0, 0, 0, 0, false, "no buffers", CPC_GROUP_NONE,
                        CPC_OPF_GROUP | CPC_OPF_COLLECTIVE | CPC_OPF_COMM_TIME | CPC_OPF_FWD | CPC_OPF_BWD,
                        CPC_COST_BARRIER, 1, N_, N_, {0}, {0}, CPC_MATCH_COLLECTIVE, CPC_LIFE_OP, CPC_TAGR_KEEP},
    [CPC_OP_DELTA] = {"delta", 2, 2, 1, 1, false, "2 inputs (dout, out) and 1 output (delta)",
                      CPC_GROUP_NONE, CPC_OPF_BWD, CPC_COST_MEMORY, 1, R_, W_, {CD, CO}, {CE}, CPC_MATCH_NONE,
                      CPC_LIFE_OP, CPC_TAGR_FROM_IN0},
    [CPC_OP_ATTN_BWD] = {"attn_bwd", 6, 6, 3, 3, false,
                         "6 inputs (q, k, v, dout, lse, delta) and 3 outputs (dq, dk, dv)",
                         CPC_GROUP_NONE, CPC_OPF_READS_OUT | CPC_OPF_BWD, CPC_COST_ATTN, 1, R_, A_, {CQ, CK, CV, CD, CL, CE},
                         {CG, CG, CG}, CPC_MATCH_NONE, CPC_LIFE_OP, CPC_TAGR_FIRST_FROM_IN0},
    [CPC_OP_REDUCE_SCATTER] = {"reduce_scatter", 1, MAXB, 1, MAXB, true,
                               "as many outputs as inputs (1..8): ALL dk/dv in, BLOCK out",
                               CPC_GROUP_RING, CPC_OPF_GROUP | CPC_OPF_COLLECTIVE | CPC_OPF_COMM_TIME | CPC_OPF_BWD,
                               CPC_COST_REDUCE_SCATTER, 2, R_, W_, {CG, CG, CG, CG, CG, CG, CG, CG},
                               {CG, CG, CG, CG, CG, CG, CG, CG}, CPC_MATCH_COLLECTIVE, CPC_LIFE_OP, CPC_TAGR_RING_INDEX},
    [CPC_OP_ADD] = {"add", 1, 1, 1, 1, false, "1 input and 1 output (out += in, fp32 gradients)",
                    CPC_GROUP_NONE, CPC_OPF_READS_OUT | CPC_OPF_BWD, CPC_COST_MEMORY, 1, R_, A_, {CG}, {CG}, CPC_MATCH_NONE,
                    CPC_LIFE_OP, CPC_TAGR_KEEP},
    [CPC_OP_ALL_REDUCE] = {"all_reduce", 1, MAXB, 1, MAXB, true,
                           "as many outputs as inputs (1..8): KV dk/dv, summed over the world",
                           CPC_GROUP_WORLD, CPC_OPF_GROUP | CPC_OPF_COLLECTIVE | CPC_OPF_COMM_TIME | CPC_OPF_BWD,
                           CPC_COST_ALL_REDUCE, 2, R_, W_, {CG, CG, CG, CG, CG, CG, CG, CG},
                           {CG, CG, CG, CG, CG, CG, CG, CG}, CPC_MATCH_COLLECTIVE, CPC_LIFE_OP, CPC_TAGR_PAIRED},
};
#undef R_
#undef W_
#undef A_
#undef N_
#undef CQ
#undef CK
#undef CV
#undef CO
#undef CL
#undef CD
#undef CE
#undef CG
#undef MAXB
_Static_assert(COUNT_OF(op_table) == CPC_OP__COUNT, "every cpc_op_kind needs a table entry");
_Static_assert(CPC_OP_MAX_BUFS >= 6, "attn_bwd has 6 inputs");

const cpc_op_info *cpc_op_info_of(cpc_op_kind k)
{
    return (int)k >= 0 && k < CPC_OP__COUNT ? &op_table[k] : NULL;
}

static const char *const group_names[] = {
    [CPC_GROUP_NONE] = "none", [CPC_GROUP_RING] = "ring",
    [CPC_GROUP_ULYSSES] = "ulysses", [CPC_GROUP_WORLD] = "world",
};
_Static_assert(COUNT_OF(group_names) == CPC_GROUP__COUNT, "every cpc_group needs a name");

static const char *const role_names[] = {
    [CPC_ROLE_Q] = "q", [CPC_ROLE_K] = "k", [CPC_ROLE_V] = "v",
    [CPC_ROLE_O] = "o", [CPC_ROLE_ACC] = "acc", [CPC_ROLE_LSE] = "lse",
    [CPC_ROLE_DO] = "do", [CPC_ROLE_DQ] = "dq", [CPC_ROLE_DK] = "dk", [CPC_ROLE_DV] = "dv",
};
_Static_assert(COUNT_OF(role_names) == CPC_ROLE__COUNT, "every cpc_buf_role needs a name");

static const char *const tokens_names[] = {
    [CPC_TOK_SHARD] = "shard", [CPC_TOK_BLOCK] = "block",
    [CPC_TOK_ALL] = "all", [CPC_TOK_KV] = "kv",
};
_Static_assert(COUNT_OF(tokens_names) == CPC_TOK__COUNT, "every cpc_buf_tokens needs a name");

static const char *const heads_names[] = {
    [CPC_HEADS_ALL] = "all", [CPC_HEADS_PART] = "part",
};
_Static_assert(COUNT_OF(heads_names) == CPC_HEADS__COUNT, "every cpc_buf_heads needs a name");

static const char *const io_names[] = {
    [CPC_IO_NONE] = "none", [CPC_IO_INPUT] = "input", [CPC_IO_OUTPUT] = "output",
};
_Static_assert(COUNT_OF(io_names) == CPC_IO__COUNT, "every cpc_buf_io needs a name");

static const char *const dir_names[] = {
    [CPC_A2A_SEQ_TO_HEADS] = "seq_to_heads", [CPC_A2A_HEADS_TO_SEQ] = "heads_to_seq",
};
_Static_assert(COUNT_OF(dir_names) == CPC_A2A__COUNT, "every cpc_a2a_dir needs a name");

static const char *const content_names[] = {
    [CPC_CONTENT_NONE] = "nothing", [CPC_CONTENT_Q] = "q", [CPC_CONTENT_K] = "k", [CPC_CONTENT_V] = "v",
    [CPC_CONTENT_OUT] = "attention output", [CPC_CONTENT_LSE] = "LSE", [CPC_CONTENT_DOUT] = "dout",
    [CPC_CONTENT_DELTA] = "delta (the delta op's output)", [CPC_CONTENT_GRAD] = "a gradient",
};
_Static_assert(COUNT_OF(content_names) == CPC_CONTENT__COUNT, "every cpc_content needs a name");

static const cpc_content role_content[] = {
    [CPC_ROLE_Q] = CPC_CONTENT_Q, [CPC_ROLE_K] = CPC_CONTENT_K, [CPC_ROLE_V] = CPC_CONTENT_V,
    [CPC_ROLE_O] = CPC_CONTENT_OUT, [CPC_ROLE_ACC] = CPC_CONTENT_OUT, [CPC_ROLE_LSE] = CPC_CONTENT_LSE,
    [CPC_ROLE_DO] = CPC_CONTENT_DOUT, [CPC_ROLE_DQ] = CPC_CONTENT_GRAD, [CPC_ROLE_DK] = CPC_CONTENT_GRAD,
    [CPC_ROLE_DV] = CPC_CONTENT_GRAD,
};
_Static_assert(COUNT_OF(role_content) == CPC_ROLE__COUNT, "every cpc_buf_role needs a content");

static const char *name_of(const char *const *tab, int n, int v)
{
    return (v >= 0 && v < n) ? tab[v] : "?";
}

static int parse_name(const char *const *tab, int n, const char *s)
{
    if (!s)
        return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(tab[i], s) == 0)
            return i;
    return -1;
}

const char *cpc_op_kind_name(cpc_op_kind k)
{
    const cpc_op_info *i = cpc_op_info_of(k);
    return i ? i->name : "?";
}
const char *cpc_group_name(cpc_group g) { return name_of(group_names, CPC_GROUP__COUNT, g); }
const char *cpc_buf_role_name(cpc_buf_role r) { return name_of(role_names, CPC_ROLE__COUNT, r); }
const char *cpc_buf_tokens_name(cpc_buf_tokens t) { return name_of(tokens_names, CPC_TOK__COUNT, t); }
const char *cpc_buf_heads_name(cpc_buf_heads h) { return name_of(heads_names, CPC_HEADS__COUNT, h); }
const char *cpc_buf_io_name(cpc_buf_io io) { return name_of(io_names, CPC_IO__COUNT, io); }
const char *cpc_a2a_dir_name(cpc_a2a_dir d) { return name_of(dir_names, CPC_A2A__COUNT, d); }
const char *cpc_content_name(cpc_content c) { return name_of(content_names, CPC_CONTENT__COUNT, c); }
cpc_content cpc_content_of_role(cpc_buf_role r)
{
    return (int)r >= 0 && r < CPC_ROLE__COUNT ? role_content[r] : CPC_CONTENT_NONE;
}
static int layout_class(cpc_content c)
{
    return c == CPC_CONTENT_LSE || c == CPC_CONTENT_DELTA ? 1 : c == CPC_CONTENT_GRAD ? 2 : 0;
}
bool cpc_role_can_hold(cpc_buf_role r, cpc_content c)
{
    return c == CPC_CONTENT_NONE || layout_class(c) == layout_class(cpc_content_of_role(r));
}
int cpc_op_kind_parse(const char *s)
{
    for (int k = 0; s && k < CPC_OP__COUNT; k++)
        if (strcmp(s, op_table[k].name) == 0)
            return k;
    return -1;
}
int cpc_group_parse(const char *s) { return parse_name(group_names, CPC_GROUP__COUNT, s); }
int cpc_buf_role_parse(const char *s) { return parse_name(role_names, CPC_ROLE__COUNT, s); }
int cpc_buf_tokens_parse(const char *s) { return parse_name(tokens_names, CPC_TOK__COUNT, s); }
int cpc_buf_heads_parse(const char *s) { return parse_name(heads_names, CPC_HEADS__COUNT, s); }
int cpc_buf_io_parse(const char *s) { return parse_name(io_names, CPC_IO__COUNT, s); }
int cpc_a2a_dir_parse(const char *s) { return parse_name(dir_names, CPC_A2A__COUNT, s); }

/* ---- construction ----------------------------------------------------------- */

cpc_program *cpc_program_new(const cpc_layout *L, bool overlap, cpc_rotate rotate)
{
    cpc_program *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    if (L)
        p->layout = *L;
    p->overlap = overlap;
    p->rotate = rotate;
    return p;
}

static bool valid_buf_name(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n >= CPC_BUF_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '_')
            return false;
    return true;
}

int cpc_program_add_buffer(cpc_program *prog, const char *name, cpc_buf_role role,
                           cpc_buf_tokens tokens, cpc_buf_heads heads, cpc_buf_io io)
{
    if (!prog || !valid_buf_name(name) || cpc_program_find_buffer(prog, name) >= 0)
        return -1;
    if ((int)role < 0 || role >= CPC_ROLE__COUNT || (int)tokens < 0 || tokens >= CPC_TOK__COUNT ||
        (int)heads < 0 || heads >= CPC_HEADS__COUNT || (int)io < 0 || io >= CPC_IO__COUNT)
        return -1;
    cpc_buffer *nb = realloc(prog->buffers, (size_t)(prog->n_buffers + 1) * sizeof *nb);
    if (!nb)
        return -1;
    prog->buffers = nb;
    cpc_buffer *b = &nb[prog->n_buffers];
    memset(b, 0, sizeof *b);
    strcpy(b->name, name);
    b->role = role;
    b->tokens = tokens;
    b->heads = heads;
    b->io = io;
    return prog->n_buffers++;
}

int cpc_program_find_buffer(const cpc_program *prog, const char *name)
{
    if (!prog || !name)
        return -1;
    for (int i = 0; i < prog->n_buffers; i++)
        if (strcmp(prog->buffers[i].name, name) == 0)
            return i;
    return -1;
}

cpc_op *cpc_ops_append(cpc_op **ops, int *n, cpc_op_kind kind)
{
    cpc_op *no = realloc(*ops, (size_t)(*n + 1) * sizeof *no);
    if (!no)
        return NULL;
    *ops = no;
    cpc_op *op = &no[*n];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    (*n)++;
    return op;
}

static void op_release(cpc_op *op)
{
    cpc_expr_free(op->peer);
    cpc_expr_free(op->block);
    cpc_expr_free(op->when);
    cpc_expr_free(op->count);
    cpc_ops_free(op->body, op->n_body);
    op->peer = op->block = op->when = op->count = NULL;
    op->body = NULL;
    op->n_body = 0;
}

void cpc_ops_free(cpc_op *ops, int n)
{
    if (!ops)
        return;
    for (int i = 0; i < n; i++)
        op_release(&ops[i]);
    free(ops);
}

static bool clone_expr(cpc_expr **dst, const cpc_expr *src)
{
    *dst = NULL;
    if (!src)
        return true;
    *dst = cpc_expr_clone(src);
    return *dst != NULL;
}

cpc_status *cpc_ops_clone(const cpc_op *ops, int n, cpc_op **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    if (n <= 0 || !ops)
        return NULL;
    cpc_op *c = calloc((size_t)n, sizeof *c);
    if (!c)
        return &cpc_status_oom;
    for (int i = 0; i < n; i++) {
        c[i] = ops[i];
        c[i].peer = c[i].block = c[i].when = c[i].count = NULL;
        c[i].body = NULL;
        c[i].n_body = 0;
        bool ok = clone_expr(&c[i].peer, ops[i].peer) && clone_expr(&c[i].block, ops[i].block) &&
                  clone_expr(&c[i].when, ops[i].when) && clone_expr(&c[i].count, ops[i].count);
        if (ok && ops[i].n_body > 0) {
            cpc_status *st = cpc_ops_clone(ops[i].body, ops[i].n_body, &c[i].body, &c[i].n_body);
            if (st) {
                cpc_status_free(st);
                ok = false;
            }
        }
        if (!ok) {
            cpc_ops_free(c, i + 1);
            return &cpc_status_oom;
        }
    }
    *out = c;
    *n_out = n;
    return NULL;
}

void cpc_program_free(cpc_program *prog)
{
    if (!prog)
        return;
    free(prog->buffers);
    cpc_ops_free(prog->ops, prog->n_ops);
    free(prog);
}

cpc_status *cpc_program_clone(const cpc_program *prog, cpc_program **out)
{
    *out = NULL;
    if (!prog)
        return cpc_error(CPC_E_INTERNAL, "program clone: NULL program");
    cpc_program *c = calloc(1, sizeof *c);
    if (!c)
        return &cpc_status_oom;
    c->layout = prog->layout;
    c->overlap = prog->overlap;
    c->rotate = prog->rotate;
    if (prog->n_buffers > 0) {
        c->buffers = malloc((size_t)prog->n_buffers * sizeof *c->buffers);
        if (!c->buffers) {
            free(c);
            return &cpc_status_oom;
        }
        memcpy(c->buffers, prog->buffers, (size_t)prog->n_buffers * sizeof *c->buffers);
        c->n_buffers = prog->n_buffers;
    }
    cpc_status *st = cpc_ops_clone(prog->ops, prog->n_ops, &c->ops, &c->n_ops);
    if (st) {
        cpc_program_free(c);
        return st;
    }
    *out = c;
    return NULL;
}

/* ---- sizes ------------------------------------------------------------------ */

cpc_coords cpc_program_coords(const cpc_program *prog, int p)
{
    const cpc_layout *L = &prog->layout;
    int U = L->U > 0 ? L->U : 1;
    cpc_coords c = {.r = p / U, .u = p % U, .p = p, .s = 0, .R = L->R, .U = L->U, .P = L->P};
    return c;
}

static bool is_kv_role(cpc_buf_role r)
{
    return r == CPC_ROLE_K || r == CPC_ROLE_V || r == CPC_ROLE_DK || r == CPC_ROLE_DV;
}

/* Heads of a buffer with `role`/`heads` on ulysses member u. */
static void heads_of(const cpc_layout *L, cpc_buf_role role, cpc_buf_heads heads, int u, int *off,
                     int *n)
{
    if (heads == CPC_HEADS_ALL) {
        *off = 0;
        *n = is_kv_role(role) ? L->Hkv : L->H;
    } else if (is_kv_role(role)) {
        cpc_layout_kv_heads(L, u, off, n);
    } else {
        cpc_layout_q_heads(L, u, off, n);
    }
}

void cpc_buffer_heads(const cpc_program *prog, int b, int u, int *off, int *n)
{
    *off = 0;
    *n = 0;
    if (!prog || b < 0 || b >= prog->n_buffers)
        return;
    heads_of(&prog->layout, prog->buffers[b].role, prog->buffers[b].heads, u, off, n);
}

int cpc_buffer_elem_size(const cpc_program *prog, int b)
{
    if (!prog || b < 0 || b >= prog->n_buffers)
        return 0;
    cpc_buf_role r = prog->buffers[b].role;
    if (r == CPC_ROLE_ACC || r == CPC_ROLE_LSE || r == CPC_ROLE_DQ || r == CPC_ROLE_DK ||
        r == CPC_ROLE_DV)
        return 4;
    return cpc_dtype_size(prog->layout.dtype);
}

int64_t cpc_buffer_rows(const cpc_program *prog, int b, const cpc_coords *c, int tag)
{
    if (!prog || b < 0 || b >= prog->n_buffers)
        return 0;
    const cpc_layout *L = &prog->layout;
    switch (prog->buffers[b].tokens) {
    case CPC_TOK_SHARD:
        return cpc_layout_shard_tokens(L, (int)c->p);
    case CPC_TOK_BLOCK:
        return tag >= 0 ? cpc_layout_block_tokens(L, tag) : cpc_layout_max_block_tokens(L);
    case CPC_TOK_ALL:
        return cpc_layout_block_offset(L, L->R);
    case CPC_TOK_KV:
        return cpc_layout_kv_rows(L);
    default:
        return 0;
    }
}

/* Elements of buffer b holding `rows` rows on member u. */
static int64_t elems_for(const cpc_program *prog, int b, int u, int64_t rows)
{
    int off, n;
    cpc_buffer_heads(prog, b, u, &off, &n);
    /* B <= 2^31, rows <= 2^37, heads <= 2^16, D <= 256: fits in int64. */
    return (int64_t)prog->layout.B * rows * n * prog->layout.D;
}

int64_t cpc_buffer_capacity_elems(const cpc_program *prog, int b, const cpc_coords *c)
{
    if (!prog || !c || b < 0 || b >= prog->n_buffers)
        return 0;
    int64_t rows = cpc_buffer_rows(prog, b, c, CPC_TAG_NONE);
    if (prog->buffers[b].role == CPC_ROLE_LSE) {
        int off, n;
        cpc_buffer_heads(prog, b, (int)c->u, &off, &n);
        return (int64_t)prog->layout.B * n * rows;
    }
    return elems_for(prog, b, (int)c->u, rows);
}

int64_t cpc_buffer_capacity_bytes(const cpc_program *prog, int b, const cpc_coords *c)
{
    return cpc_buffer_capacity_elems(prog, b, c) * cpc_buffer_elem_size(prog, b);
}

int64_t cpc_program_peak_bytes(const cpc_program *prog, int rank)
{
    if (!prog || rank < 0 || rank >= prog->layout.P)
        return -1;
    cpc_coords c = cpc_program_coords(prog, rank);
    int64_t t = 0;
    for (int b = 0; b < prog->n_buffers; b++)
        t += cpc_buffer_capacity_bytes(prog, b, &c);
    return t;
}

/* ---- the per-rank walk ------------------------------------------------------ */


#define WALK_MAX_DEPTH 8

typedef struct cpc_walk {
    const cpc_program *prog;
    cpc_walk_fn fn;
    cpc_walk_loop_fn loop;
    void *ctx;
    int *tags;
    int path[WALK_MAX_DEPTH + 1]; /* the index of the op being walked at each depth */
    int depth;                    /* its depth */
} walker;

/* The op's index path in the program ("ops[3].body[1]", 1-based as Lua
 * scripts and CP050/CP051 count) from the walk's stack of indices. */
static void walk_path(const walker *w, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int d = 0; d <= w->depth && d <= WALK_MAX_DEPTH && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, d ? ".body[%d]" : "ops[%d]", w->path[d] + 1);
}

static cpc_status *op_error(const walker *w, const cpc_op *op, const cpc_coords *c, const char *fmt,
                            const char *detail)
{
    char path[160];
    walk_path(w, path, sizeof path);
    cpc_status *st = cpc_diag(CPC_E_INPUT, 0, CPC_SEV_ERROR, op->span, fmt, detail);
    cpc_status_prefix(st, "rank %lld: %s %s", (long long)c->p, path, cpc_op_kind_name(op->kind));
    return st;
}

static cpc_status *eval_in(const walker *w, const cpc_op *op, const cpc_expr *e, const cpc_coords *c,
                           int64_t *v)
{
    cpc_status *st = cpc_expr_eval(e, c, v);
    if (st) {
        char path[160];
        walk_path(w, path, sizeof path);
        cpc_status_prefix(st, "rank %lld: %s %s", (long long)c->p, path, cpc_op_kind_name(op->kind));
    }
    return st;
}

static int64_t group_size(const cpc_layout *L, cpc_group g)
{
    switch (g) {
    case CPC_GROUP_RING: return L->R;
    case CPC_GROUP_ULYSSES: return L->U;
    case CPC_GROUP_WORLD: return L->P;
    default: return 0;
    }
}

static cpc_status *check_operands(const walker *w, const cpc_program *prog, const cpc_op *op,
                                  const cpc_coords *c)
{
    if (op->n_in < 0 || op->n_in > CPC_OP_MAX_BUFS || op->n_out < 0 || op->n_out > CPC_OP_MAX_BUFS)
        return op_error(w, op, c, "%s", "operand count out of range");
    for (int i = 0; i < op->n_in; i++)
        if (op->in[i] < 0 || op->in[i] >= prog->n_buffers)
            return op_error(w, op, c, "%s", "input buffer index out of range");
    for (int i = 0; i < op->n_out; i++)
        if (op->out[i] < 0 || op->out[i] >= prog->n_buffers)
            return op_error(w, op, c, "%s", "output buffer index out of range");
    return NULL;
}

int cpc_op_out_tag(const cpc_program *prog, const cpc_op *op, int i, const cpc_coords *c, int64_t block, int in_tag0,
                   int in_tag_i, int old)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    switch (info ? info->tags : CPC_TAGR_KEEP) {
    case CPC_TAGR_FROM_IN0: return in_tag0;
    case CPC_TAGR_FIRST_FROM_IN0: return i == 0 ? in_tag0 : old;
    case CPC_TAGR_PAIRED: return in_tag_i;
    case CPC_TAGR_BLOCK: {
        if (op->kind == CPC_OP_RECV)
            return (int)block;
        /* init_acc: gradient accumulators made for ring block `block` (backward) */
        cpc_buf_role ro = prog->buffers[op->out[i]].role;
        bool grad = ro == CPC_ROLE_DQ || ro == CPC_ROLE_DK || ro == CPC_ROLE_DV;
        return op->block && grad ? (int)block : old;
    }
    case CPC_TAGR_RING_INDEX: return (int)c->r;
    case CPC_TAGR_A2A: return (int)(op->dir == CPC_A2A_SEQ_TO_HEADS ? c->r : c->p);
    default: return old;
    }
}

void cpc_op_apply_tags(const cpc_program *prog, const cpc_op *op, const cpc_coords *c, int64_t block, int *t)
{
    const cpc_op_info *info = cpc_op_info_of(op->kind);
    if (!info || info->tags == CPC_TAGR_KEEP)
        return;
    if (info->tags == CPC_TAGR_EXCHANGE) {
        if (op->n_in >= 2) {
            int a = t[op->in[0]];
            t[op->in[0]] = t[op->in[1]];
            t[op->in[1]] = a;
        }
        return;
    }
    int in0 = op->n_in > 0 ? t[op->in[0]] : CPC_TAG_NONE;
    int nt[CPC_OP_MAX_BUFS];
    for (int i = 0; i < op->n_out && i < CPC_OP_MAX_BUFS; i++)
        nt[i] = cpc_op_out_tag(prog, op, i, c, block, in0, i < op->n_in ? t[op->in[i]] : CPC_TAG_NONE, t[op->out[i]]);
    for (int i = 0; i < op->n_out && i < CPC_OP_MAX_BUFS; i++)
        t[op->out[i]] = nt[i];
}

/* The op table's tag rule, applied to the walk's tags. */
static void apply_tags(const walker *w, const cpc_exec_op *x)
{
    cpc_op_apply_tags(w->prog, x->op, &x->c, x->block, w->tags);
}

static cpc_status *walk_ops(walker *w, const cpc_op *ops, int n, cpc_coords c, int depth)
{
    const cpc_layout *L = &w->prog->layout;
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        if (depth <= WALK_MAX_DEPTH) {
            w->path[depth] = i;
            w->depth = depth;
        }
        if ((int)op->kind < 0 || op->kind >= CPC_OP__COUNT)
            return op_error(w, op, &c, "%s", "unknown op kind");
        if (op->when) {
            int64_t v;
            cpc_status *st = eval_in(w, op, op->when, &c, &v);
            if (st)
                return st;
            if (!v)
                continue;
        }
        if (op->kind == CPC_OP_LOOP) {
            if (depth >= WALK_MAX_DEPTH)
                return op_error(w, op, &c, "%s", "loops nested too deeply");
            if (!op->count)
                return op_error(w, op, &c, "%s", "loop without a count");
            int64_t cnt;
            cpc_status *st = eval_in(w, op, op->count, &c, &cnt);
            if (st)
                return st;
            if (cnt < 0 || cnt > CPC_LOOP_MAX) {
                char buf[64];
                snprintf(buf, sizeof buf, "%lld", (long long)cnt);
                return op_error(w, op, &c, "loop count %s outside 0..2^20", buf);
            }
            if (op->n_body > 0 && !op->body)
                return op_error(w, op, &c, "%s", "loop without a body");
            bool ran = false;
            if (w->loop && (st = w->loop(w->ctx, w, op, cnt, c, depth, &ran)))
                return st;
            for (int64_t s = 0; s < cnt && !ran; s++) {
                cpc_coords ci = c;
                ci.s = s;
                st = walk_ops(w, op->body, op->n_body, ci, depth + 1);
                if (st)
                    return st;
            }
            continue;
        }
        cpc_status *st = check_operands(w, w->prog, op, &c);
        if (st)
            return st;
        cpc_exec_op x = {.op = op, .c = c, .depth = depth, .peer = -1, .block = -1, .tags = w->tags};
        if (op->kind == CPC_OP_SEND || op->kind == CPC_OP_RECV) {
            if (!op->peer)
                return op_error(w, op, &c, "%s", "send/recv without a peer");
            st = eval_in(w, op, op->peer, &c, &x.peer);
            if (st)
                return st;
            int64_t W = group_size(L, op->group);
            if (W <= 0)
                return op_error(w, op, &c, "%s", "send/recv needs group ring, ulysses or world");
            if (x.peer < 0 || x.peer >= W) {
                char buf[96];
                snprintf(buf, sizeof buf, "peer %lld outside its group 0..%lld", (long long)x.peer,
                         (long long)W - 1);
                return op_error(w, op, &c, "%s", buf);
            }
        }
        if (op->block) {
            st = eval_in(w, op, op->block, &c, &x.block);
            if (st)
                return st;
            if (x.block < 0 || x.block >= L->R) {
                char buf[96];
                snprintf(buf, sizeof buf, "block %lld outside 0..%d", (long long)x.block, L->R - 1);
                return op_error(w, op, &c, "%s", buf);
            }
        }
        if (op->kind == CPC_OP_RECV && !op->block)
            return op_error(w, op, &c, "%s", "recv without a block");
        if (w->fn) {
            st = w->fn(w->ctx, &x);
            if (st)
                return st;
        }
        apply_tags(w, &x);
    }
    return NULL;
}

cpc_status *cpc_walk_body(cpc_walk *w, const cpc_op *loop, cpc_coords c, int depth)
{
    return walk_ops(w, loop->body, loop->n_body, c, depth + 1);
}

cpc_status *cpc_program_walk(const cpc_program *prog, int rank, cpc_walk_fn fn, void *ctx)
{
    return cpc_program_walk_loops(prog, rank, fn, NULL, ctx);
}

cpc_status *cpc_program_walk_loops(const cpc_program *prog, int rank, cpc_walk_fn fn, cpc_walk_loop_fn loop,
                                   void *ctx)
{
    if (!prog)
        return cpc_error(CPC_E_INTERNAL, "program walk: NULL program");
    if (rank < 0 || rank >= prog->layout.P)
        return cpc_error(CPC_E_INPUT, "rank %d outside 0..%d", rank, prog->layout.P - 1);
    walker w = {.prog = prog, .fn = fn, .loop = loop, .ctx = ctx};
    w.tags = malloc((size_t)(prog->n_buffers > 0 ? prog->n_buffers : 1) * sizeof *w.tags);
    if (!w.tags)
        return &cpc_status_oom;
    cpc_coords c = cpc_program_coords(prog, rank);
    for (int b = 0; b < prog->n_buffers; b++) {
        const cpc_buffer *bf = &prog->buffers[b];
        w.tags[b] = bf->tokens == CPC_TOK_SHARD   ? (int)c.p
                    : bf->tokens == CPC_TOK_BLOCK ? (int)c.r
                                                  : CPC_TAG_NONE;
    }
    cpc_status *st = walk_ops(&w, prog->ops, prog->n_ops, c, 0);
    free(w.tags);
    return st;
}

/* ---- bytes sent ------------------------------------------------------------- */

typedef struct bytes_ctx {
    const cpc_program *prog;
    int64_t sent, recvd;
} bytes_ctx;

/* Bytes of buffer b with content rows `rows` and heads of member u. */
static int64_t msg_bytes(const cpc_program *prog, int b, int u, int64_t rows)
{
    return elems_for(prog, b, u, rows) * cpc_buffer_elem_size(prog, b);
}

static cpc_status *count_bytes(void *vctx, const cpc_exec_op *x)
{
    bytes_ctx *bc = vctx;
    const cpc_program *prog = bc->prog;
    const cpc_layout *L = &prog->layout;
    const cpc_op *op = x->op;
    const cpc_coords *c = &x->c;
    int u = (int)c->u, r = (int)c->r;
    switch (op->kind) {
    case CPC_OP_SEND:
        for (int i = 0; i < op->n_in; i++) {
            int b = op->in[i];
            bc->sent += msg_bytes(prog, b, u, cpc_buffer_rows(prog, b, c, x->tags[b]));
        }
        break;
    case CPC_OP_RECV:
        for (int i = 0; i < op->n_out; i++) {
            int b = op->out[i];
            bc->recvd += msg_bytes(prog, b, u, cpc_buffer_rows(prog, b, c, (int)x->block));
        }
        break;
    case CPC_OP_ALL_TO_ALL:
        /* every pair (same_in_out), as the executor runs them */
        for (int k = 0; k < op->n_in; k++) {
            int b = op->in[k];
            const cpc_buffer *bf = &prog->buffers[b];
            int64_t e = cpc_buffer_elem_size(prog, b);
            for (int j = 0; j < L->U; j++) {
                if (j == u)
                    continue;
                cpc_coords cj = *c;
                cj.u = j;
                cj.p = (int64_t)r * L->U + j;
                int off, hj, hu;
                heads_of(L, bf->role, CPC_HEADS_PART, j, &off, &hj);
                heads_of(L, bf->role, CPC_HEADS_PART, u, &off, &hu);
                int64_t per_tok = (int64_t)L->B * (bf->role == CPC_ROLE_LSE ? 1 : L->D) * e;
                if (op->dir == CPC_A2A_SEQ_TO_HEADS) {
                    int64_t mine = cpc_buffer_rows(prog, b, c, x->tags[b]);
                    int64_t theirs = bf->tokens == CPC_TOK_SHARD ? cpc_layout_shard_tokens(L, (int)cj.p) : mine;
                    bc->sent += mine * hj * per_tok;
                    bc->recvd += theirs * hu * per_tok;
                } else if (bf->tokens == CPC_TOK_KV) {
                    /* replicated rows: every member's heads to every member */
                    bc->sent += cpc_layout_kv_rows(L) * hu * per_tok;
                    bc->recvd += cpc_layout_kv_rows(L) * hj * per_tok;
                } else {
                    bc->sent += cpc_layout_shard_tokens(L, (int)cj.p) * hu * per_tok;
                    bc->recvd += cpc_layout_shard_tokens(L, (int)c->p) * hj * per_tok;
                }
            }
        }
        break;
    case CPC_OP_ALL_GATHER:
        for (int k = 0; k < op->n_in; k++) {
            int b = op->in[k];
            bc->sent += (int64_t)(L->R - 1) * msg_bytes(prog, b, u, cpc_buffer_rows(prog, b, c, x->tags[b]));
            for (int j = 0; j < L->R; j++)
                if (j != r)
                    bc->recvd += msg_bytes(prog, b, u, cpc_layout_block_tokens(L, j));
        }
        break;
    case CPC_OP_REDUCE_SCATTER:
        /* block j's slice to member j; block r's slice from every other member */
        for (int i = 0; i < op->n_in; i++)
            for (int j = 0; j < L->R; j++)
                if (j != r) {
                    bc->sent += msg_bytes(prog, op->in[i], u, cpc_layout_block_tokens(L, j));
                    bc->recvd += msg_bytes(prog, op->in[i], u, cpc_layout_block_tokens(L, r));
                }
        break;
    case CPC_OP_ALL_REDUCE: {
        int64_t P = L->P, p = c->p, S = L->Skv;
        for (int i = 0; i < op->n_in; i++)
            for (int64_t j = 0; j < P; j++)
                if (j != p) {
                    int64_t mine = msg_bytes(prog, op->in[i], u, cpc_split_len(S, P, p));
                    bc->sent += msg_bytes(prog, op->in[i], u, cpc_split_len(S, P, j)) + mine;
                    bc->recvd += mine + msg_bytes(prog, op->in[i], u, cpc_split_len(S, P, j));
                }
        break;
    }
    default:
        break;
    }
    return NULL;
}

cpc_status *cpc_program_bytes_sent(const cpc_program *prog, int rank, int64_t *sent, int64_t *recvd)
{
    bytes_ctx bc = {.prog = prog};
    cpc_status *st = cpc_program_walk(prog, rank, count_bytes, &bc);
    if (st)
        return st;
    if (sent)
        *sent = bc.sent;
    if (recvd)
        *recvd = bc.recvd;
    return NULL;
}

/* ---- text form -------------------------------------------------------------- */

static int name_width(const cpc_program *prog)
{
    int w = 1;
    for (int b = 0; b < prog->n_buffers; b++) {
        int l = (int)strlen(prog->buffers[b].name);
        if (l > w)
            w = l;
    }
    return w;
}

static void print_header(FILE *out, const cpc_program *prog, const cpc_coords *c)
{
    const cpc_layout *L = &prog->layout;
    fprintf(out, "program variant=%s ring_degree=%d ulysses_degree=%d world_size=%d overlap=%s rotate=%s",
            cpc_variant_name(L->variant), L->R, L->U, L->P, prog->overlap ? "true" : "false",
            cpc_rotate_name(prog->rotate));
    if (c)
        fprintf(out, " rank=%lld r=%lld u=%lld", (long long)c->p, (long long)c->r, (long long)c->u);
    fputc('\n', out);
    int w = name_width(prog);
    for (int b = 0; b < prog->n_buffers; b++) {
        const cpc_buffer *bf = &prog->buffers[b];
        fprintf(out, "buffer %-*s role=%-3s tokens=%-5s heads=%-4s io=", w, bf->name,
                cpc_buf_role_name(bf->role), cpc_buf_tokens_name(bf->tokens),
                cpc_buf_heads_name(bf->heads));
        if (c)
            fprintf(out, "%-6s bytes=%lld\n", cpc_buf_io_name(bf->io),
                    (long long)cpc_buffer_capacity_bytes(prog, b, c));
        else
            fprintf(out, "%s\n", cpc_buf_io_name(bf->io));
    }
}

static void print_bufs(FILE *out, const cpc_program *prog, const char *key, const int *idx, int n)
{
    if (n <= 0)
        return;
    fprintf(out, " %s=", key);
    for (int i = 0; i < n; i++) {
        const char *nm = (idx[i] >= 0 && idx[i] < prog->n_buffers) ? prog->buffers[idx[i]].name : "?";
        fprintf(out, "%s%s", i ? "," : "", nm);
    }
}

static bool has_tag(cpc_op_kind k)
{
    const cpc_op_info *i = cpc_op_info_of(k);
    return i && (i->flags & CPC_OPF_TAG);
}

static void print_op_spmd(FILE *out, const cpc_program *prog, const cpc_op *op, int depth)
{
    fprintf(out, "%*s%s", 2 * depth, "", cpc_op_kind_name(op->kind));
    if (op->group != CPC_GROUP_NONE)
        fprintf(out, " group=%s", cpc_group_name(op->group));
    if (op->kind == CPC_OP_ALL_TO_ALL)
        fprintf(out, " dir=%s%s", cpc_a2a_dir_name(op->dir), op->reduce ? " reduce=sum" : "");
    if (op->peer)
        fprintf(out, " peer=%s", cpc_expr_text(op->peer));
    print_bufs(out, prog, "in", op->in, op->n_in);
    print_bufs(out, prog, "out", op->out, op->n_out);
    if (op->block)
        fprintf(out, " block=%s", cpc_expr_text(op->block));
    if (op->count)
        fprintf(out, " count=%s", cpc_expr_text(op->count));
    if (has_tag(op->kind))
        fprintf(out, " tag=%d", op->tag);
    if (op->when)
        fprintf(out, " when=%s", cpc_expr_text(op->when));
    fputc('\n', out);
    if (op->kind == CPC_OP_LOOP) {
        for (int i = 0; i < op->n_body; i++)
            print_op_spmd(out, prog, &op->body[i], depth + 1);
        fprintf(out, "%*send\n", 2 * depth, "");
    }
}

typedef struct print_ctx {
    FILE *out;
    const cpc_program *prog;
} print_ctx;

static cpc_status *print_exec(void *vctx, const cpc_exec_op *x)
{
    print_ctx *pc = vctx;
    FILE *out = pc->out;
    const cpc_program *prog = pc->prog;
    const cpc_op *op = x->op;
    fprintf(out, "%s", cpc_op_kind_name(op->kind));
    if (op->group != CPC_GROUP_NONE)
        fprintf(out, " group=%s", cpc_group_name(op->group));
    if (op->kind == CPC_OP_ALL_TO_ALL)
        fprintf(out, " dir=%s%s", cpc_a2a_dir_name(op->dir), op->reduce ? " reduce=sum" : "");
    if (op->peer)
        fprintf(out, " peer=%lld", (long long)x->peer);
    print_bufs(out, prog, "in", op->in, op->n_in);
    print_bufs(out, prog, "out", op->out, op->n_out);
    if (op->block)
        fprintf(out, " block=%lld", (long long)x->block);
    if (op->kind == CPC_OP_ATTN && !op->block && op->n_in >= 2 &&
        prog->buffers[op->in[1]].tokens == CPC_TOK_BLOCK && x->tags[op->in[1]] >= 0)
        fprintf(out, " kv_block=%d", x->tags[op->in[1]]);
    if (has_tag(op->kind))
        fprintf(out, " tag=%d", op->tag);
    if (x->depth > 0)
        fprintf(out, " step=%lld", (long long)x->c.s);
    fputc('\n', out);
    return NULL;
}

cpc_status *cpc_program_print(FILE *out, const cpc_program *prog, int rank)
{
    if (!prog || !out)
        return cpc_error(CPC_E_INTERNAL, "program print: NULL argument");
    if (rank < 0) {
        print_header(out, prog, NULL);
        for (int i = 0; i < prog->n_ops; i++)
            print_op_spmd(out, prog, &prog->ops[i], 0);
        return NULL;
    }
    if (rank >= prog->layout.P)
        return cpc_error(CPC_E_USAGE, "--rank %d: the program has ranks 0..%d", rank, prog->layout.P - 1);
    /* Walk first without printing, so that an evaluation error prints nothing. */
    cpc_status *st = cpc_program_walk(prog, rank, NULL, NULL);
    if (st)
        return st;
    cpc_coords c = cpc_program_coords(prog, rank);
    print_header(out, prog, &c);
    print_ctx pc = {out, prog};
    return cpc_program_walk(prog, rank, print_exec, &pc);
}
