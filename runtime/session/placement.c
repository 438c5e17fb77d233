/* placement.c - see placement.h */
#include "placement.h"

#include <string.h>

cpc_status *cpc_placement_init(cpc_placement *pl, const cpc_plan *plan, const cpc_layout *L)
{
    memset(pl, 0, sizeof *pl);
    pl->C = cpc_plan_cfg_degree(plan);
    pl->T = cpc_plan_tp_degree(plan);
    pl->R = L->R;
    pl->U = L->U;
    pl->RU = L->P;
    pl->P = pl->C * pl->T * L->P;
    pl->B = plan->input.batch;
    pl->H = plan->model.heads;
    pl->Hkv = plan->model.kv_heads;
    int hkv_group = pl->Hkv % pl->T == 0 ? pl->Hkv / pl->T : 1;
    if ((int64_t)L->B * pl->C != pl->B || (int64_t)L->H * pl->T != pl->H || L->Hkv != hkv_group ||
        pl->P != plan->cluster.world_size || L->R * L->U != L->P)
        return cpc_error(CPC_E_INTERNAL,
                         "placement: the program's layout (batch %d, heads %d/%d, %d ranks) is not one (c, t) group "
                         "of the plan (batch %d, heads %d/%d, world_size %d, cfg_degree %d, tp_degree %d)",
                         (int)L->B, (int)L->H, (int)L->Hkv, L->P, pl->B, pl->H, pl->Hkv,
                         plan->cluster.world_size, pl->C, pl->T);
    return NULL;
}

cpc_rank_place cpc_placement_rank(const cpc_placement *pl, int p)
{
    cpc_rank_place rp;
    rp.p = p;
    rp.t = p % pl->T;
    rp.u = p / pl->T % pl->U;
    rp.r = p / pl->T / pl->U % pl->R;
    rp.c = p / pl->T / pl->U / pl->R;
    rp.q = rp.r * pl->U + rp.u;
    rp.group = rp.c * pl->T + rp.t;
    rp.b0 = rp.c * (pl->B / pl->C);
    rp.h0 = rp.t * (pl->H / pl->T);
    /* the K/V head of query head h is h / (H/Hkv) (GQA); with Hkv % T == 0
     * this is t * Hkv/T, with Hkv < T the one head rank t's queries use */
    rp.hkv0 = rp.h0 / (pl->H / pl->Hkv);
    return rp;
}

int cpc_placement_world_rank(const cpc_placement *pl, int c, int t, int q)
{
    int r = q / pl->U, u = q % pl->U;
    return ((c * pl->R + r) * pl->U + u) * pl->T + t;
}

cpc_layout cpc_placement_global_layout(const cpc_placement *pl, const cpc_layout *L)
{
    cpc_layout G = *L;
    G.B = pl->B;
    G.H = pl->H;
    G.Hkv = pl->Hkv;
    G.group = pl->H / pl->Hkv;
    G.P = pl->P;
    return G;
}

void cpc_scatter_box(void *global, const void *shard, int64_t nb, int64_t S, int64_t global_row,
                     int64_t b0, int64_t col0, int64_t shard_row, const cpc_run *runs, int n_runs)
{
    int64_t T = 0;
    for (int i = 0; i < n_runs; i++)
        T += runs[i].len;
    for (int64_t b = 0; b < nb; b++) {
        int64_t t = 0;
        for (int i = 0; i < n_runs; i++) {
            if (col0 == 0 && shard_row == global_row) /* whole rows: one copy per run */
                memcpy((char *)global + ((b0 + b) * S + runs[i].start) * global_row,
                       (const char *)shard + (b * T + t) * shard_row, (size_t)(runs[i].len * shard_row));
            else
                for (int64_t k = 0; k < runs[i].len; k++)
                    memcpy((char *)global + ((b0 + b) * S + runs[i].start + k) * global_row + col0,
                           (const char *)shard + (b * T + t + k) * shard_row, (size_t)shard_row);
            t += runs[i].len;
        }
    }
}
