/* plan_sub.c - the (c, t) sub-plan of the outer axes: see plan.h */
#include "plan.h"

bool cpc_plan_sub(const cpc_plan *p, int C, int T, cpc_plan *q)
{
    int P = p->cluster.world_size;
    int H = p->model.heads, Hkv = p->model.kv_heads;
    if (C < 1 || T < 1 || P % C || (P / C) % T || p->input.batch % C)
        return false;
    if (H % T || Hkv < 1 || (Hkv % T && T % Hkv))
        return false;
    int g = p->cluster.gpus_per_node;
    if (g < 1)
        g = P < 8 ? P : 8;
    if (g < 1)
        g = 1;
    *q = *p;
    q->cluster.world_size = P / C / T;
    q->input.batch = p->input.batch / C;
    q->model.heads = H / T;
    q->model.kv_heads = Hkv % T == 0 ? Hkv / T : 1;
    q->cluster.gpus_per_node = g / T >= 1 ? g / T : 1;
    q->parallel.cfg_degree = C;
    q->parallel.tp_degree = T;
    return true;
}

int cpc_plan_cfg_degree(const cpc_plan *p)
{
    return p->parallel.cfg_degree >= 1 ? p->parallel.cfg_degree : 1;
}

int cpc_plan_tp_degree(const cpc_plan *p)
{
    return p->parallel.tp_degree >= 1 ? p->parallel.tp_degree : 1;
}
