/*
 * bench_transport.c - the cost of cpc's MPI transport (runtime/transport/transport_mpi.h)
 * over raw MPI, measured in the same run on the same buffers.
 *
 *   mpirun -np P mpi_bench_transport [--min-bytes N] [--max-bytes N] [--reps N]
 *                                    [--target-ms N]
 *
 * Two patterns, as the executor uses them:
 *   ring step  - every rank sends `size` bytes to ring member r+1 and receives
 *                `size` bytes from r-1 (one ring step of ring attention's K/V
 *                rotation).  cpc: vt->irecv + vt->isend on the ring group, then
 *                vt->wait on both.  Raw: MPI_Sendrecv, and MPI_Irecv + MPI_Isend +
 *                MPI_Waitall, on a duplicate of MPI_COMM_WORLD.
 *   all-to-all - every rank's `size`-byte send buffer holds P equal parts of
 *                size/P bytes, part j for rank j (Ulysses' head/sequence
 *                exchange).  cpc: vt->all_to_all_v on the world group.  Raw:
 *                MPI_Alltoall and MPI_Alltoallv (the call cpc makes inside).
 * The mesh is P x 1 (the ring group is the world), so both patterns run over
 * all P ranks.
 *
 * Method: for each size, each implementation runs `iters` back-to-back
 * operations between two barriers; time per operation = the slowest rank's
 * (MPI_Allreduce MAX) elapsed / iters.  The implementations are interleaved
 * in `reps` rounds (A B C A B C ...) and each one's median round is reported,
 * so slow drifts of a shared machine hit them alike.  `iters` is chosen per
 * size from a trial so a round lasts about --target-ms (the same on every
 * rank).  After timing, the received bytes of each implementation are
 * checked (a fill pattern of sender, receiver and offset), so no number
 * comes from a transfer that did not happen.
 *
 * Figures, as nccl-tests (doc/PERFORMANCE.md there) defines them:
 *   algbw = size / time (GB/s, 1e9 bytes/s), size = bytes per rank: the
 *           message for the ring step, the whole send buffer for all-to-all;
 *   busbw = algbw for the ring step (one link used per rank),
 *           algbw * (P-1)/P for all-to-all (the own part does not travel);
 *   cpc/raw = cpc's time / the raw call's time (1.00 = no overhead; > 1 slower).
 * Output: one row per (pattern, size, implementation), then the ratios.
 * Exit status: 0, or 1 when a check failed or a call returned an error.
 */
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "transport_mpi.h"

enum { MAX_IMPL = 3 };

typedef struct bench {
    int rank, P;
    cpc_transport *t;
    MPI_Comm comm;             /* raw MPI's own communicator */
    unsigned char *send, *recv;
    size_t cap;
    bool failed;
} bench;

typedef enum pattern { RING, A2A } pattern;
typedef enum impl { CPC, RAW_1, RAW_2 } impl;

static const char *impl_name(pattern p, impl i)
{
    if (i == CPC)
        return p == RING ? "cpc isend/irecv/wait" : "cpc all_to_all_v";
    if (p == RING)
        return i == RAW_1 ? "MPI_Sendrecv" : "MPI_Isend/Irecv";
    return i == RAW_1 ? "MPI_Alltoall" : "MPI_Alltoallv";
}

static uint8_t pattern_byte(int src, int dst, size_t off)
{
    uint32_t x = (uint32_t)src * 2654435761u ^ (uint32_t)dst * 40503u ^ (uint32_t)off;
    x ^= x >> 13;
    return (uint8_t)(x * 0x9E3779B1u >> 24);
}

static void fail(bench *b, const char *what, cpc_status *st)
{
    if (st) {
        fprintf(stderr, "bench_transport: rank %d: %s: %s\n", b->rank, what, st->message);
        cpc_status_free(st);
    } else {
        fprintf(stderr, "bench_transport: rank %d: %s\n", b->rank, what);
    }
    b->failed = true;
}

/* One operation of pattern p with implementation i on `size` bytes. */
static bool one_op(bench *b, pattern p, impl i, size_t size)
{
    int P = b->P, r = b->rank;
    int right = (r + 1) % P, left = (r - 1 + P) % P;
    if (p == RING) {
        if (i == CPC) {
            cpc_request *rq = NULL, *sq = NULL;
            cpc_status *st = cpc_transport_irecv(b->t, CPC_GROUP_RING, left, b->recv, size, 1, &rq);
            if (!st)
                st = cpc_transport_isend(b->t, CPC_GROUP_RING, right, b->send, size, 1, &sq);
            if (!st)
                st = cpc_transport_wait(b->t, rq);
            if (!st)
                st = cpc_transport_wait(b->t, sq);
            if (st) {
                /* A request may be left in flight: end the job rather than
                 * leave a peer waiting. */
                fail(b, "ring step (cpc)", st);
                cpc_mpi_abort(1, "a transport call failed");
            }
            return true;
        }
        int n = (int)size;
        if (i == RAW_1)
            return MPI_Sendrecv(b->send, n, MPI_BYTE, right, 1, b->recv, n, MPI_BYTE, left, 1,
                                b->comm, MPI_STATUS_IGNORE) == MPI_SUCCESS;
        MPI_Request rq[2];
        if (MPI_Irecv(b->recv, n, MPI_BYTE, left, 1, b->comm, &rq[0]) != MPI_SUCCESS ||
            MPI_Isend(b->send, n, MPI_BYTE, right, 1, b->comm, &rq[1]) != MPI_SUCCESS)
            return false;
        return MPI_Waitall(2, rq, MPI_STATUSES_IGNORE) == MPI_SUCCESS;
    }
    size_t part = size / (size_t)P;
    if (i == RAW_1)
        return MPI_Alltoall(b->send, (int)part, MPI_BYTE, b->recv, (int)part, MPI_BYTE,
                            b->comm) == MPI_SUCCESS;
    size_t counts[64], displs[64];
    int ic[64], id[64];
    for (int j = 0; j < P; j++) {
        counts[j] = part;
        displs[j] = (size_t)j * part;
        ic[j] = (int)part;
        id[j] = j * (int)part;
    }
    if (i == RAW_2)
        return MPI_Alltoallv(b->send, ic, id, MPI_BYTE, b->recv, ic, id, MPI_BYTE, b->comm) ==
               MPI_SUCCESS;
    cpc_status *st = cpc_transport_all_to_all_v(b->t, CPC_GROUP_WORLD, b->send, counts, displs,
                                            b->recv, counts, displs);
    if (st) {
        fail(b, "all-to-all (cpc)", st);
        cpc_mpi_abort(1, "a transport call failed");
    }
    return true;
}

/* Seconds per operation, the slowest rank's. */
static double timed(bench *b, pattern p, impl i, size_t size, int iters)
{
    MPI_Barrier(b->comm);
    double t0 = MPI_Wtime();
    bool ok = true;
    for (int k = 0; k < iters && ok; k++)
        ok = one_op(b, p, i, size);
    double dt = (MPI_Wtime() - t0) / iters, worst = 0;
    if (!ok && !b->failed)
        fail(b, impl_name(p, i), NULL);
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, b->comm);
    return worst;
}

static void fill_send(bench *b, pattern p, size_t size)
{
    int P = b->P, r = b->rank;
    if (p == RING) {
        for (size_t o = 0; o < size; o++)
            b->send[o] = pattern_byte(r, (r + 1) % P, o);
    } else {
        size_t part = size / (size_t)P;
        for (int j = 0; j < P; j++)
            for (size_t o = 0; o < part; o++)
                b->send[(size_t)j * part + o] = pattern_byte(r, j, o);
    }
}

/* Runs one operation on a cleared receive buffer and checks every byte. */
static void check(bench *b, pattern p, impl i, size_t size)
{
    int P = b->P, r = b->rank;
    memset(b->recv, 0, size);
    if (!one_op(b, p, i, size)) {
        if (!b->failed)
            fail(b, impl_name(p, i), NULL);
        return;
    }
    size_t bad = SIZE_MAX;
    if (p == RING) {
        int left = (r - 1 + P) % P;
        for (size_t o = 0; o < size && bad == SIZE_MAX; o++)
            if (b->recv[o] != pattern_byte(left, r, o))
                bad = o;
    } else {
        size_t part = size / (size_t)P;
        for (int j = 0; j < P && bad == SIZE_MAX; j++)
            for (size_t o = 0; o < part; o++)
                if (b->recv[(size_t)j * part + o] != pattern_byte(j, r, o)) {
                    bad = (size_t)j * part + o;
                    break;
                }
    }
    if (bad != SIZE_MAX) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s, %zu bytes: received byte %zu is wrong", impl_name(p, i),
                 size, bad);
        fail(b, msg, NULL);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fmt_size(size_t n, char *buf, size_t cap)
{
    if (n >= (1u << 20))
        snprintf(buf, cap, "%zu MiB", n >> 20);
    else
        snprintf(buf, cap, "%zu KiB", n >> 10);
}

static bool parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return false;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    if (*end || v == 0 || v > (unsigned long long)INT_MAX)
        return false;
    *out = (size_t)v;
    return true;
}

int main(int argc, char **argv)
{
    size_t min_b = 64u << 10, max_b = 64u << 20;
    int reps = 7;
    double target_ms = 60;
    for (int a = 1; a < argc; a++) {
        bool ok = a + 1 < argc;
        if (ok && strcmp(argv[a], "--min-bytes") == 0)
            ok = parse_size(argv[++a], &min_b);
        else if (ok && strcmp(argv[a], "--max-bytes") == 0)
            ok = parse_size(argv[++a], &max_b);
        else if (ok && strcmp(argv[a], "--reps") == 0)
            ok = (reps = atoi(argv[++a])) >= 1 && reps <= 101;
        else if (ok && strcmp(argv[a], "--target-ms") == 0)
            ok = (target_ms = atof(argv[++a])) > 0;
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "usage: mpirun -np P mpi_bench_transport [--min-bytes N[K|M]] "
                            "[--max-bytes N[K|M]] [--reps N] [--target-ms MS]\n");
            return 2;
        }
    }
    bench b;
    memset(&b, 0, sizeof b);
    cpc_status *st = cpc_mpi_init(&b.rank, &b.P);
    if (st) {
        fprintf(stderr, "bench_transport: %s\n", st->message);
        return 1;
    }
    if (b.P < 2 || b.P > 64) {
        if (b.rank == 0)
            fprintf(stderr, "bench_transport: run with 2..64 processes (mpirun -np 4 ...)\n");
        cpc_mpi_finalize();
        return 2;
    }
    if ((st = cpc_transport_mpi_create(b.P, 1, &b.t))) {
        fprintf(stderr, "bench_transport: rank %d: %s\n", b.rank, st->message);
        cpc_mpi_abort(1, "transport creation failed");
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &b.comm);
    b.cap = max_b;
    b.send = malloc(b.cap);
    b.recv = malloc(b.cap);
    if (!b.send || !b.recv)
        cpc_mpi_abort(1, "out of memory for the buffers");
    memset(b.recv, 0, b.cap);

    if (b.rank == 0) {
        char host[MPI_MAX_PROCESSOR_NAME];
        int hl = 0;
        MPI_Get_processor_name(host, &hl);
        printf("# bench_transport: %d ranks on %s, median of %d interleaved rounds of ~%.0f ms "
               "per implementation\n",
               b.P, host, reps, target_ms);
        printf("# algbw = size/time; busbw = algbw (ring step), algbw*(P-1)/P (all-to-all); "
               "GB/s = 1e9 B/s\n");
        printf("%-10s %9s  %-22s %6s %11s %9s %9s\n", "pattern", "size", "implementation",
               "iters", "time (us)", "algbw", "busbw");
    }
    double ratio[2][2][32];
    int nsizes = 0;
    for (size_t size = min_b; size <= max_b && nsizes < 32; size *= 4, nsizes++) {
        for (int pi = 0; pi < 2; pi++) {
            pattern p = (pattern)pi;
            size_t sz = p == A2A ? size / (size_t)b.P * (size_t)b.P : size;
            fill_send(&b, p, sz);
            /* Warm up every implementation, then a trial of each; iters
             * from the median trial (one noisy trial does not decide). */
            double tr[MAX_IMPL];
            for (int i = 0; i < MAX_IMPL; i++)
                timed(&b, p, (impl)i, sz, 2);
            for (int i = 0; i < MAX_IMPL; i++)
                tr[i] = timed(&b, p, (impl)i, sz, 4);
            qsort(tr, MAX_IMPL, sizeof tr[0], cmp_double);
            double trial = tr[MAX_IMPL / 2];
            int iters = (int)(target_ms * 1e-3 / (trial > 1e-9 ? trial : 1e-9));
            iters = iters < 3 ? 3 : iters > 2000 ? 2000 : iters;
            double t[MAX_IMPL][101];
            for (int k = 0; k < reps; k++)
                for (int i = 0; i < MAX_IMPL; i++)
                    t[i][k] = timed(&b, p, (impl)i, sz, iters);
            for (int i = 0; i < MAX_IMPL; i++)
                check(&b, p, (impl)i, sz);
            double med[MAX_IMPL];
            for (int i = 0; i < MAX_IMPL; i++) {
                qsort(t[i], (size_t)reps, sizeof t[i][0], cmp_double);
                med[i] = t[i][reps / 2];
            }
            ratio[pi][0][nsizes] = med[CPC] / med[RAW_1];
            ratio[pi][1][nsizes] = med[CPC] / med[RAW_2];
            if (b.rank == 0) {
                char sb[32];
                fmt_size(sz, sb, sizeof sb);
                for (int i = 0; i < MAX_IMPL; i++) {
                    double alg = (double)sz / med[i] / 1e9;
                    double bus = p == RING ? alg : alg * (b.P - 1) / b.P;
                    printf("%-10s %9s  %-22s %6d %11.1f %9.3f %9.3f\n",
                           p == RING ? "ring step" : "all-to-all", sb, impl_name(p, (impl)i),
                           iters, med[i] * 1e6, alg, bus);
                }
            }
        }
    }
    if (b.rank == 0) {
        printf("\n# cpc/raw time ratio (1.00 = same speed; > 1 = cpc slower)\n");
        printf("%9s  %14s %14s  %14s %14s\n", "size", "ring/Sendrecv", "ring/Isend", "a2a/Alltoall",
               "a2a/Alltoallv");
        size_t size = min_b;
        for (int s = 0; s < nsizes; s++, size *= 4) {
            char sb[32];
            fmt_size(size, sb, sizeof sb);
            printf("%9s  %14.3f %14.3f  %14.3f %14.3f\n", sb, ratio[0][0][s], ratio[0][1][s],
                   ratio[1][0][s], ratio[1][1][s]);
        }
    }
    int bad = b.failed, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, b.comm);
    if (b.rank == 0 && any)
        printf("bench_transport: FAILED (a check or a call failed; see stderr)\n");
    cpc_transport_destroy(b.t);
    MPI_Comm_free(&b.comm);
    free(b.send);
    free(b.recv);
    cpc_mpi_finalize();
    return any ? 1 : 0;
}
