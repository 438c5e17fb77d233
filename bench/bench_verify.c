/*
 * bench_verify.c - proof time of the schedule verifier (compiler/verify.h)
 * per variant and world size.
 *
 * For each variant (ring, unified, ring_anything, ulysses_anything, ulysses;
 * rotate p2p and allgather; overlap on) and world size P in 4, 64, 1024,
 * 16384, 65536 it builds the compiler's program (cpc_schedule_build) and
 * proves it with cpc_verify (the default method: symbolic, else
 * enumeration), printing the method used and the best wall time of `iters`
 * runs (argv[1], default 5), then the ratio time(65536) / time(64) per row.
 * Goals (issue 13): every entry proved, < 100 ms, ratio <= 2.
 *
 * Shapes: ring and ring_anything R = P (ring_anything with uneven tokens
 * 3P + 7); unified R = U = sqrt(P) (R = 2U when P is not a square);
 * ulysses_anything U = P with uneven heads (P + 3 heads, at most 65536, the
 * plan limit; 3P + 7 tokens);
 * ulysses U = P with P heads; the (gqa) rows: ulysses_anything with 1.5 P
 * heads (at most 65536) in GQA groups of 2 (the one-head members straddle
 * groups), ulysses with P heads in groups of 4 (K/V heads replicated over
 * the members of a group).  head_dim 8, fp32, no mask.
 *
 * With --backward: the same plans in mode: training, and their backward
 * programs (cpc_schedule_build_backward) proved by cpc_verify_backward_ex
 * (S = the symmetric domain, E = enumeration of every rank).
 *
 * With --replicate: a 226-token text segment held whole by every rank
 * (`split: replicate`, as CogVideoX's text with xDiT) before the sharded
 * tokens (forward and, with --backward, backward programs).
 *
 * With --sizes A,B,...: those world sizes instead (at most 8; e.g. --sizes 1048576 for the
 * forward's 2^20-rank check: ulysses rows cannot be built there, heads <= 65536).
 *
 * Usage: bench_verify [iters] [--backward] [--replicate] [--sizes A,B,...]   exit status 1 when a program is
 * not proved.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan_load.h"
#include "program.h"
#include "schedule.h"
#include "schedule_bwd.h"
#include "verify.h"
#include "verify_bwd.h"

static int backward; /* --backward */
static int replicate; /* --replicate */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static cpc_program *build(cpc_variant v, int P, const char *rotate, int gqa)
{
    int R = P, U = 1, H = 4, Hkv = 0;
    long long S = 2LL * P;
    switch (v) {
    case CPC_VARIANT_UNIFIED: {
        U = (int)sqrt((double)P);
        while (P % U)
            U--;
        R = P / U;
        if (R < U) {
            int t = R;
            R = U;
            U = t;
        }
        H = U;
        S = 2LL * P;
        break;
    }
    case CPC_VARIANT_RING_ANYTHING: S = 3LL * P + 7; break;
    case CPC_VARIANT_ULYSSES_ANYTHING: R = 1; U = P; H = P + 3 > 65536 ? 65536 : P + 3; S = 3LL * P + 7; break;
    case CPC_VARIANT_ULYSSES: R = 1; U = P; H = P; break;
    default: break;
    }
    if (gqa && v == CPC_VARIANT_ULYSSES_ANYTHING) { /* 1.5 P heads in groups of 2 */
        H = P + P / 2 > 65536 ? 65536 : P + P / 2;
        Hkv = H / 2;
    } else if (gqa) { /* K/V heads replicated: groups of 4 */
        Hkv = H / 4 > 0 ? H / 4 : 1;
    }
    char yaml[640], tok[160], kv[32] = "";
    if (Hkv > 0)
        snprintf(kv, sizeof kv, ", kv_heads: %d", Hkv);
    if (replicate)
        snprintf(tok, sizeof tok, "segments: [{name: text, tokens: 226, split: replicate}, {name: video, tokens: %lld}]",
                 S);
    else
        snprintf(tok, sizeof tok, "tokens: %lld", S);
    snprintf(yaml, sizeof yaml,
             "version: 1\nmodel: {heads: %d%s, head_dim: 8, dtype: fp32}\ninput: {%s%s}\n"
             "cluster: {world_size: %d}\nschedule: {rotate: %s, overlap: true}\n",
             H, kv, tok, backward ? ", mode: training" : "", P, rotate);
    cpc_plan *plan = NULL;
    cpc_status *st = cpc_plan_load_string(yaml, strlen(yaml), "bench.yaml", NULL, 0, &plan);
    if (cpc_status_has_error(st) || !plan) {
        cpc_status_print(st, stderr, "bench_verify");
        cpc_status_free(st);
        return NULL;
    }
    cpc_status_free(st);
    cpc_program *prog = NULL;
    st = backward ? cpc_schedule_build_backward(plan, v, R, U, &prog) : cpc_schedule_build(plan, v, R, U, &prog);
    cpc_plan_free(plan);
    if (st) {
        cpc_status_print(st, stderr, "bench_verify");
        cpc_status_free(st);
        return NULL;
    }
    return prog;
}

int main(int argc, char **argv)
{
    int iters = 5;
    int sizes[8] = {4, 64, 1024, 16384, 65536};
    int NS = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backward") == 0) {
            backward = 1;
        } else if (strcmp(argv[i], "--replicate") == 0) {
            replicate = 1;
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            NS = 0;
            for (char *p = argv[++i]; *p && NS < 8;) {
                int v = (int)strtol(p, &p, 10);
                if (v > 0)
                    sizes[NS++] = v;
                if (*p)
                    p++;
            }
            if (NS == 0) {
                fprintf(stderr, "bench_verify: --sizes needs world sizes\n");
                return 2;
            }
        } else {
            iters = atoi(argv[i]);
        }
    }
    if (iters < 1)
        iters = 1;
    struct {
        cpc_variant v;
        const char *rotate;
        int gqa;
    } rows[] = {
        {CPC_VARIANT_RING, "p2p", 0},          {CPC_VARIANT_RING, "allgather", 0},
        {CPC_VARIANT_UNIFIED, "p2p", 0},       {CPC_VARIANT_UNIFIED, "allgather", 0},
        {CPC_VARIANT_RING_ANYTHING, "p2p", 0}, {CPC_VARIANT_RING_ANYTHING, "allgather", 0},
        {CPC_VARIANT_ULYSSES_ANYTHING, "p2p", 0}, {CPC_VARIANT_ULYSSES, "p2p", 0},
        {CPC_VARIANT_ULYSSES_ANYTHING, "p2p", 1}, {CPC_VARIANT_ULYSSES, "p2p", 1},
    };
    int bad = 0;
    printf("%s%s proof time (ms, best of %d; S = symbolic, E = enumeration)\n", backward ? "backward" : "forward",
           replicate ? " (replicated text)" : "", iters);
    printf("%-26s", "variant");
    for (int i = 0; i < NS; i++)
        printf(" %12d", sizes[i]);
    printf(" %10s\n", "65536/64");
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        char name[64];
        snprintf(name, sizeof name, "%s (%s)", cpc_variant_name(rows[r].v), rows[r].gqa ? "gqa" : rows[r].rotate);
        printf("%-26s", name);
        double t[8];
        for (int i = 0; i < NS; i++) {
            t[i] = -1;
            cpc_program *p = build(rows[r].v, sizes[i], rows[r].rotate, rows[r].gqa);
            if (!p) {
                printf(" %12s", "build?");
                bad++;
                continue;
            }
            double best = 1e9;
            cpc_verify_stats stats;
            cpc_verify_bwd_stats bstats;
            cpc_status *st = NULL;
            for (int k = 0; k < iters; k++) {
                double t0 = now();
                if (backward) {
                    st = cpc_verify_backward_ex(p, NULL, &bstats);
                    stats.mode = bstats.mode;
                } else
                    st = cpc_verify_ex(p, NULL, &stats);
                double dt = now() - t0;
                if (dt < best)
                    best = dt;
                if (st)
                    break;
            }
            if (st) {
                printf(" %12s", "FAILED");
                fprintf(stderr, "%s P=%d: %s\n", name, sizes[i], st->message);
                cpc_status_free(st);
                bad++;
            } else {
                t[i] = best * 1e3;
                printf(" %10.3f %c", t[i], stats.mode == CPC_VERIFY_SYMBOLIC ? 'S' : 'E');
                /* goals: forward < 100 ms (issue 13); backward < 1 s (issue 21) */
                if (stats.mode != CPC_VERIFY_SYMBOLIC || t[i] >= (backward ? 1000.0 : 100.0))
                    bad++;
            }
            cpc_program_free(p);
            fflush(stdout);
        }
        if (NS == 5 && t[1] > 0 && t[4] > 0)
            printf(" %10.2f\n", t[4] / t[1]);
        else
            printf(" %10s\n", "-");
    }
    if (bad)
        fprintf(stderr, "bench_verify: %d entries not proved symbolically in < %s\n", bad,
                backward ? "1 s" : "100 ms");
    return bad ? 1 : 0;
}
