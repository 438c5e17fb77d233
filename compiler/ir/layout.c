/* layout.c - token and head placement of a candidate; see layout.h.
 *
 * Every size here is computed in closed form from tensor_split offsets, so
 * the cost of a query does not grow with world_size (except the few that are
 * documented as a loop over the ulysses group). */
#include "layout.h"

#include <string.h>

int64_t cpc_split_len(int64_t n, int64_t w, int64_t i)
{
    if (w < 1 || i < 0 || i >= w || n <= 0)
        return 0;
    return n / w + (i < n % w ? 1 : 0);
}

int64_t cpc_split_off(int64_t n, int64_t w, int64_t i)
{
    if (w < 1 || n <= 0 || i <= 0)
        return 0;
    if (i >= w)
        return n;
    int64_t q = n / w, rem = n % w;
    return i * q + (i < rem ? i : rem);
}

cpc_status *cpc_layout_init(cpc_layout *L, const cpc_plan *plan, cpc_variant variant,
                            int R, int U)
{
    memset(L, 0, sizeof *L);
    if (!plan)
        return cpc_error(CPC_E_INTERNAL, "layout: no plan");
    if (variant < 0 || variant >= CPC_VARIANT__COUNT || variant == CPC_VARIANT_AUTO)
        return cpc_error(CPC_E_INTERNAL, "layout: variant must be resolved (got %d)", (int)variant);
    if (R < 1 || U < 1)
        return cpc_error(CPC_E_INTERNAL, "layout: degrees must be >= 1 (ring_degree %d, ulysses_degree %d)",
                         R, U);
    int64_t P = (int64_t)R * U;
    if (P > (1 << 20))
        return cpc_error(CPC_E_INTERNAL, "layout: world size %d x %d = %lld exceeds 2^20", R, U,
                         (long long)P);
    if (plan->input.n_segments < 1 || plan->input.n_segments > CPC_MAX_SEGMENTS || !plan->input.segments)
        return cpc_error(CPC_E_INTERNAL, "layout: %d segments (1..%d supported)", plan->input.n_segments,
                         CPC_MAX_SEGMENTS);
    int H = plan->model.heads, Hkv = plan->model.kv_heads, D = plan->model.head_dim;
    if (H < 1 || Hkv < 1 || D < 1 || H % Hkv != 0)
        return cpc_error(CPC_E_INTERNAL, "layout: heads %d, kv_heads %d, head_dim %d are not a valid shape",
                         H, Hkv, D);
    if (plan->input.batch < 1)
        return cpc_error(CPC_E_INTERNAL, "layout: batch %d < 1", plan->input.batch);

    L->variant = variant;
    L->R = R;
    L->U = U;
    L->P = (int)P;
    L->B = plan->input.batch;
    L->H = H;
    L->Hkv = Hkv;
    L->D = D;
    L->group = H / Hkv;
    L->dtype = plan->model.dtype;
    L->causal = plan->input.mask == CPC_MASK_CAUSAL;
    L->cross = plan->input.has_kv;
    int64_t S = 0;
    for (int i = 0; i < plan->input.n_segments; i++) {
        int64_t t = plan->input.segments[i].tokens;
        if (t < 1 || t > INT32_MAX)
            return cpc_error(CPC_E_INTERNAL, "layout: segment %d has %lld tokens", i, (long long)t);
        /* replicated segments are held whole by every rank; the rest are split */
        if (plan->input.segments[i].replicate) {
            L->rep_start[L->n_rep] = S;
            L->rep_len[L->n_rep] = t;
            L->n_rep++;
            L->Srep += t;
        } else {
            L->seg_start[L->n_seg] = S;
            L->seg_len[L->n_seg] = t;
            L->n_seg++;
        }
        S += t; /* <= 64 * (2^31-1): no overflow */
    }
    L->S = S;
    L->rep = L->n_rep > 0;
    if (L->n_seg < 1)
        return cpc_error(CPC_E_INTERNAL, "layout: every segment is replicated (CP027)");
    if (L->rep && L->cross)
        return cpc_error(CPC_E_INTERNAL, "layout: replicated segments with cross-attention (CP027)");
    if (L->cross) {
        if (plan->input.kv_tokens < 1)
            return cpc_error(CPC_E_INTERNAL, "layout: cross-attention with %lld K/V tokens",
                             (long long)plan->input.kv_tokens);
        L->Skv = plan->input.kv_tokens;
    } else {
        L->Skv = S;
    }
    /* Zigzag only where it is defined (CP022/CP023 reject the rest). */
    L->zigzag = L->causal && !L->cross && !L->rep &&
                (variant == CPC_VARIANT_RING || variant == CPC_VARIANT_UNIFIED) &&
                L->n_seg == 1 && S % (2 * P) == 0;
    return NULL;
}

int cpc_layout_max_shard_runs(const cpc_layout *L)
{
    return L->zigzag ? 2 * L->n_seg : L->n_seg;
}

int cpc_layout_max_block_runs(const cpc_layout *L)
{
    return L->U * cpc_layout_max_shard_runs(L);
}

/* Appends [start, start+len) to out[*n], merging with the previous run when
 * adjacent; counts past `max` without writing. */
static void push_run(cpc_run *out, int max, int *n, cpc_run *last, int64_t start, int64_t len)
{
    if (len <= 0)
        return;
    if (*n > 0 && last->start + last->len == start) {
        last->len += len;
        if (*n <= max)
            out[*n - 1] = *last;
        return;
    }
    last->start = start;
    last->len = len;
    if (*n < max)
        out[*n] = *last;
    (*n)++;
}

/* Shard runs of rank p appended (with merging) to out. */
static void shard_runs_into(const cpc_layout *L, int p, cpc_run *out, int max, int *n, cpc_run *last)
{
    if (L->zigzag) {
        int64_t c = L->S / (2 * (int64_t)L->P);
        push_run(out, max, n, last, (int64_t)p * c, c);
        push_run(out, max, n, last, (int64_t)(2 * L->P - 1 - p) * c, c);
        return;
    }
    for (int j = 0; j < L->n_seg; j++)
        push_run(out, max, n, last, L->seg_start[j] + cpc_split_off(L->seg_len[j], L->P, p),
                 cpc_split_len(L->seg_len[j], L->P, p));
}

int cpc_layout_shard_runs(const cpc_layout *L, int p, cpc_run *out, int max)
{
    int n = 0;
    cpc_run last = {0, 0};
    if (p < 0 || p >= L->P)
        return 0;
    shard_runs_into(L, p, out, max, &n, &last);
    return n;
}

int64_t cpc_layout_shard_tokens(const cpc_layout *L, int p)
{
    if (p < 0 || p >= L->P)
        return 0;
    if (L->zigzag)
        return 2 * (L->S / (2 * (int64_t)L->P));
    int64_t t = 0;
    for (int j = 0; j < L->n_seg; j++)
        t += cpc_split_len(L->seg_len[j], L->P, p);
    return t;
}

int64_t cpc_layout_max_shard_tokens(const cpc_layout *L)
{
    /* tensor_split lengths never increase with the chunk index. */
    return cpc_layout_shard_tokens(L, 0);
}

int cpc_layout_block_runs(const cpc_layout *L, int i, cpc_run *out, int max)
{
    int n = 0;
    cpc_run last = {0, 0};
    if (i < 0 || i >= L->R)
        return 0;
    if (!L->zigzag && L->n_seg == 1) {
        /* one segment: the U shards are adjacent, one run (O(1), not O(U):
         * the cost model asks for it per attention op at 65536 ranks) */
        int64_t a = cpc_split_off(L->seg_len[0], L->P, (int64_t)i * L->U);
        int64_t b = cpc_split_off(L->seg_len[0], L->P, (int64_t)(i + 1) * L->U);
        push_run(out, max, &n, &last, L->seg_start[0] + a, b - a);
        return n;
    }
    for (int u = 0; u < L->U; u++)
        shard_runs_into(L, i * L->U + u, out, max, &n, &last);
    return n;
}

int64_t cpc_layout_block_tokens(const cpc_layout *L, int i)
{
    if (i < 0 || i >= L->R)
        return 0;
    if (L->zigzag)
        return (int64_t)L->U * 2 * (L->S / (2 * (int64_t)L->P));
    int64_t t = 0;
    for (int j = 0; j < L->n_seg; j++)
        t += cpc_split_off(L->seg_len[j], L->P, (int64_t)(i + 1) * L->U) -
             cpc_split_off(L->seg_len[j], L->P, (int64_t)i * L->U);
    return t;
}

int64_t cpc_layout_max_block_tokens(const cpc_layout *L)
{
    return cpc_layout_block_tokens(L, 0);
}

int64_t cpc_layout_block_offset(const cpc_layout *L, int i)
{
    if (i <= 0)
        return 0;
    if (i > L->R)
        i = L->R;
    if (L->zigzag)
        return (int64_t)i * L->U * 2 * (L->S / (2 * (int64_t)L->P));
    int64_t t = 0;
    for (int j = 0; j < L->n_seg; j++)
        t += cpc_split_off(L->seg_len[j], L->P, (int64_t)i * L->U);
    return t;
}

void cpc_layout_q_heads(const cpc_layout *L, int u, int *off, int *n)
{
    *off = (int)cpc_split_off(L->H, L->U, u);
    *n = (int)cpc_split_len(L->H, L->U, u);
}

void cpc_layout_kv_heads(const cpc_layout *L, int u, int *off, int *n)
{
    int qo, qn;
    cpc_layout_q_heads(L, u, &qo, &qn);
    *off = qo / L->group;
    *n = qn > 0 ? (qo + qn - 1) / L->group + 1 - *off : 0;
}

int cpc_layout_max_q_heads(const cpc_layout *L)
{
    return (int)cpc_split_len(L->H, L->U, 0);
}

int cpc_layout_max_kv_heads(const cpc_layout *L)
{
    /* Loops over the ulysses group: with uneven heads the widest K/V range
     * is not always member 0's (H=12, Hkv=4 over U=5: query heads 3,3,2,2,2
     * at 0,3,6,8,10 use K/V heads 1,1,1,2,1: member 3 straddles two). */
    int best = 0;
    for (int u = 0; u < L->U; u++) {
        int off, n;
        cpc_layout_kv_heads(L, u, &off, &n);
        if (n > best)
            best = n;
    }
    return best;
}

int64_t cpc_layout_kv_rows(const cpc_layout *L)
{
    return L->cross ? L->Skv : L->Srep;
}

int cpc_layout_kv_runs(const cpc_layout *L, cpc_run *out, int max)
{
    if (L->cross) {
        if (max >= 1)
            out[0] = (cpc_run){0, L->Skv};
        return 1;
    }
    int n = 0;
    cpc_run last = {0, 0};
    for (int j = 0; j < L->n_rep; j++)
        push_run(out, max, &n, &last, L->rep_start[j], L->rep_len[j]);
    return n;
}

int cpc_layout_max_rank_runs(const cpc_layout *L)
{
    return cpc_layout_max_shard_runs(L) + L->n_rep;
}

int cpc_layout_rank_runs(const cpc_layout *L, int p, cpc_run *out, int max)
{
    if (p < 0 || p >= L->P)
        return 0;
    if (!L->rep)
        return cpc_layout_shard_runs(L, p, out, max);
    /* rep and sharded segments interleave in segment order: walk both */
    int n = 0, i = 0, j = 0;
    cpc_run last = {0, 0};
    while (i < L->n_rep || j < L->n_seg) {
        if (j >= L->n_seg || (i < L->n_rep && L->rep_start[i] < L->seg_start[j])) {
            push_run(out, max, &n, &last, L->rep_start[i], L->rep_len[i]);
            i++;
        } else {
            push_run(out, max, &n, &last, L->seg_start[j] + cpc_split_off(L->seg_len[j], L->P, p),
                     cpc_split_len(L->seg_len[j], L->P, p));
            j++;
        }
    }
    return n;
}

int64_t cpc_layout_rank_tokens(const cpc_layout *L, int p)
{
    if (p < 0 || p >= L->P)
        return 0;
    return cpc_layout_shard_tokens(L, p) + (L->rep ? L->Srep : 0);
}

int64_t cpc_layout_rank_offset(const cpc_layout *L, int p, int64_t pos)
{
    cpc_run runs[2 * CPC_MAX_SEGMENTS];
    int n = cpc_layout_rank_runs(L, p, runs, 2 * CPC_MAX_SEGMENTS);
    int64_t off = 0;
    for (int i = 0; i < n && i < 2 * CPC_MAX_SEGMENTS; i++) {
        if (pos >= runs[i].start && pos < runs[i].start + runs[i].len)
            return off + (pos - runs[i].start);
        off += runs[i].len;
    }
    return -1;
}
