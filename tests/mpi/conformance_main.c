/*
 * conformance_main.c - runs the transport conformance suite
 * (tests/transport_conformance.h) on the MPI transport, one process per rank:
 *
 *   mpirun -np N mpi_conformance [--mesh RxU]... [--small-limits] [--large BYTES]
 *   mpirun -np N mpi_conformance --fault abort|exit|kill [--fault-rank K]
 *
 * Without --mesh it runs every mesh of interest for N: (N,1), (1,N) and, for
 * even N > 2, (2,N/2) and (N/2,2); then the first mesh again with the
 * large-count limits lowered (cpc_transport_mpi_set_limits) so the derived
 * datatype and pairwise paths run too; --small-limits runs only that way.
 * Also checks: cpc_mpi_launched, cpc_mpi_local_rank, and that a mesh that
 * does not match the world size is a CPC_E_USAGE error on every rank (not a
 * hang).  World rank 0 prints one line per check; every rank prints its
 * failures on stderr.  Exit status 0 when every check passed on this rank.
 *
 * --fault MODE makes world rank K (default N-1) fail while the others block
 * in a receive from it: `abort` calls the transport's abort (the message is
 * printed, MPI_Abort ends every rank), `exit` leaves with exit(3) without
 * MPI_Finalize, `kill` raises SIGKILL.  In every mode the job must end within
 * seconds with a non-zero status (tests/mpi/run_fault.sh checks it).
 *
 * The suite skips CPC_CONF_ABORT here: MPI's abort ends the processes
 * instead of returning errors; the fault modes above test it.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport_mpi.h"
#include "transport_conformance.h"

typedef struct mesh {
    int R, U;
} mesh;

static int usage(void)
{
    fprintf(stderr, "usage: mpi_conformance [--mesh RxU]... [--small-limits] [--large BYTES]\n"
                    "       mpi_conformance --fault abort|exit|kill [--fault-rank K]\n");
    return 2;
}

/* True when every rank runs on the same host (then CLOCK_MONOTONIC is one
 * clock and the barrier ordering check is sound). */
static bool same_host(int size)
{
    char name[MPI_MAX_PROCESSOR_NAME + 1];
    memset(name, 0, sizeof name);
    int len = 0;
    MPI_Get_processor_name(name, &len);
    char *all = calloc((size_t)size, sizeof name);
    if (!all)
        return false;
    MPI_Allgather(name, (int)sizeof name, MPI_CHAR, all, (int)sizeof name, MPI_CHAR,
                  MPI_COMM_WORLD);
    bool same = true;
    for (int i = 1; i < size; i++)
        if (strcmp(all, all + (size_t)i * sizeof name) != 0)
            same = false;
    free(all);
    return same;
}

static int report(int rank, cpc_status *st)
{
    if (!st)
        return 0;
    char prog[32];
    snprintf(prog, sizeof prog, "mpi_conformance[%d]", rank);
    cpc_status_print(st, stderr, prog);
    cpc_status_free(st);
    return 1;
}

static int run_mesh(int rank, mesh m, bool same_clock, size_t large, bool small)
{
    if (small)
        cpc_transport_mpi_set_limits(1 << 16, 40000 + 7);
    else
        cpc_transport_mpi_set_limits(0, 0);
    cpc_transport *t = NULL;
    cpc_status *st = cpc_transport_mpi_create(m.R, m.U, &t);
    if (st)
        return report(rank, st);
    int r = rank / m.U, u = rank % m.U;
    char name[64];
    snprintf(name, sizeof name, "mpi%s", small ? "(small limits)" : "");
    cpc_conformance_opts o = {
        .name = name,
        .skip = CPC_CONF_ABORT,
        .skip_reason = "MPI's abort ends every process (tests/mpi/run_fault.sh)",
        .large_bytes = large,
        .same_clock = same_clock,
        .log = stdout,
    };
    st = cpc_transport_conformance(t, m.R, m.U, r, u, &o);
    fflush(stdout);
    int rc = report(rank, st);
    cpc_transport_destroy(t);
    cpc_transport_mpi_set_limits(0, 0);
    return rc;
}

static int run_fault(int rank, int size, const char *mode, int k)
{
    cpc_transport *t = NULL;
    cpc_status *st = cpc_transport_mpi_create(size, 1, &t);
    if (st)
        return report(rank, st);
    st = cpc_transport_barrier(t, CPC_GROUP_WORLD);
    if (st)
        return report(rank, st);
    if (rank == k) {
        usleep(200 * 1000);   /* the others are blocked by now */
        if (!strcmp(mode, "abort"))
            cpc_transport_abort(t, "injected fault (mpi_conformance --fault abort)");
        else if (!strcmp(mode, "exit")) {
            fprintf(stderr, "mpi_conformance[%d]: injected fault: exit(3) without MPI_Finalize\n",
                    rank);
            exit(3);
        } else {
            fprintf(stderr, "mpi_conformance[%d]: injected fault: SIGKILL\n", rank);
            fflush(stderr);
            raise(SIGKILL);
        }
        return 1;   /* not reached */
    }
    /* Block on a message rank k never sends. */
    char buf[8];
    cpc_request *rq = NULL;
    st = cpc_transport_irecv(t, CPC_GROUP_WORLD, k, buf, sizeof buf, 1, &rq);
    if (!st)
        st = cpc_transport_wait(t, rq);
    if (!st)
        fprintf(stderr, "mpi_conformance[%d]: a receive that nobody sent completed\n", rank);
    report(rank, st);
    return 1;
}

int main(int argc, char **argv)
{
    mesh meshes[16];
    int nmesh = 0;
    bool small_only = false;
    size_t large = 0;
    const char *fault = NULL;
    int fault_rank = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mesh") && i + 1 < argc && nmesh < 16) {
            if (sscanf(argv[++i], "%dx%d", &meshes[nmesh].R, &meshes[nmesh].U) != 2)
                return usage();
            nmesh++;
        } else if (!strcmp(argv[i], "--small-limits")) {
            small_only = true;
        } else if (!strcmp(argv[i], "--large") && i + 1 < argc) {
            large = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--fault") && i + 1 < argc) {
            fault = argv[++i];
            if (strcmp(fault, "abort") && strcmp(fault, "exit") && strcmp(fault, "kill"))
                return usage();
        } else if (!strcmp(argv[i], "--fault-rank") && i + 1 < argc) {
            fault_rank = atoi(argv[++i]);
        } else {
            return usage();
        }
    }

    bool launched = cpc_mpi_launched();
    int rank = -1, size = 0;
    cpc_status *st = cpc_mpi_init(&rank, &size);
    if (st) {
        report(-1, st);
        return 3;
    }
    int fails = 0;

    if (fault) {
        if (fault_rank < 0 || fault_rank >= size)
            fault_rank = size - 1;
        int rc = run_fault(rank, size, fault, fault_rank);
        cpc_mpi_finalize();
        return rc;
    }

    if (!launched) {
        fprintf(stderr, "mpi_conformance[%d]: cpc_mpi_launched() is false under mpirun\n", rank);
        fails++;
    }
    int lr = cpc_mpi_local_rank();
    const char *env_lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (lr < 0 || lr >= size || (env_lr && lr != atoi(env_lr))) {
        fprintf(stderr, "mpi_conformance[%d]: cpc_mpi_local_rank() = %d\n", rank, lr);
        fails++;
    }

    /* A mesh that does not match the world: a usage error on every rank. */
    {
        cpc_transport *t = NULL;
        st = cpc_transport_mpi_create(size + 1, 1, &t);
        if (!st || st->code != CPC_E_USAGE || t) {
            fprintf(stderr, "mpi_conformance[%d]: mesh %dx1 on %d processes: expected a usage "
                            "error\n", rank, size + 1, size);
            fails++;
        } else if (rank == 0) {
            printf("mesh mismatch diagnostic: ");
            cpc_status_print(st, stdout, "cprun");
        }
        cpc_status_free(st);
        st = cpc_transport_mpi_create(0, size, &t);
        if (!st || st->code != CPC_E_USAGE) {
            fprintf(stderr, "mpi_conformance[%d]: ring_degree 0 accepted\n", rank);
            fails++;
        }
        cpc_status_free(st);
    }

    if (nmesh == 0) {
        meshes[nmesh++] = (mesh){size, 1};
        if (size > 1)
            meshes[nmesh++] = (mesh){1, size};
        if (size > 2 && size % 2 == 0) {
            meshes[nmesh++] = (mesh){2, size / 2};
            if (size / 2 != 2)
                meshes[nmesh++] = (mesh){size / 2, 2};
        }
    }
    bool clock = same_host(size);
    for (int i = 0; i < nmesh; i++) {
        if (meshes[i].R * meshes[i].U != size) {
            if (rank == 0)
                fprintf(stderr, "mpi_conformance: mesh %dx%d does not match %d processes\n",
                        meshes[i].R, meshes[i].U, size);
            fails++;
            continue;
        }
        if (!small_only)
            fails += run_mesh(rank, meshes[i], clock, large, false);
        if (small_only || i == 0)
            fails += run_mesh(rank, meshes[i], clock, large, true);
    }
    /* Every rank's verdict, so rank 0 can say it. */
    int total = 0;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("mpi_conformance: %d processes: %s\n", size,
               total ? "FAILED" : "all checks passed");
    cpc_mpi_finalize();
    return fails ? 1 : 0;
}
