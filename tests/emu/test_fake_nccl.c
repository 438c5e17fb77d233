/*
 * test_fake_nccl.c - the fake NCCL's own semantics (tests/emu/fake_nccl.c), with
 * ranks as threads of this process (each on its own emulated device: the fake
 * takes a communicator's device from cudaGetDevice, per thread), linked against
 * the fake NCCL and the fake CUDA runtime.  What the NCCL transport relies on:
 * grouped send/recv rings whose messages exceed a socket's buffer (they need
 * progress on every socket at once), k-th send meets k-th receive, self
 * send/recv, AllReduce (rank-order sum, identical bits everywhere), AllGather
 * in place, ncclCommSplit; and the refusals: a receive of another size than
 * its send, host memory, two ranks of one communicator on one device.
 */
#include <criterion/criterion.h>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 3
#define BIG (1u << 20)   /* 1 MiB: more than a Unix socket's buffer */

typedef struct job {
    ncclUniqueId id;
    int rank, device;
    int (*body)(struct job *, ncclComm_t);
    char err[256];
    ncclResult_t init;
    char init_msg[256];
} job;

static void *run(void *arg)
{
    job *j = arg;
    cudaSetDevice(j->device);
    ncclComm_t c = NULL;
    j->init = ncclCommInitRank(&c, N, j->id, j->rank);
    if (j->init != ncclSuccess) {
        snprintf(j->init_msg, sizeof j->init_msg, "%s", ncclGetLastError(NULL));
        return NULL;
    }
    if (j->body && j->body(j, c) != 0 && !j->err[0])
        snprintf(j->err, sizeof j->err, "rank %d failed", j->rank);
    ncclCommDestroy(c);
    return NULL;
}

static void world(int (*body)(job *, ncclComm_t), job js[N], bool same_device)
{
    ncclUniqueId id;
    cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
    pthread_t th[N];
    for (int r = 0; r < N; r++) {
        memset(&js[r], 0, sizeof js[r]);
        js[r] = (job){.id = id, .rank = r, .device = same_device ? 0 : r, .body = body};
        pthread_create(&th[r], NULL, run, &js[r]);
    }
    for (int r = 0; r < N; r++)
        pthread_join(th[r], NULL);
}

static void *dev(size_t n, int fill)
{
    void *p = NULL;
    cr_assert_eq(cudaMalloc(&p, n), cudaSuccess);
    cudaMemset(p, fill, n);
    return p;
}

#define FAILJ(...) (snprintf(j->err, sizeof j->err, __VA_ARGS__), 1)

/* A ring both ways in one group, 1 MiB each, plus a self send: all complete. */
static int ring_body(job *j, ncclComm_t c)
{
    int next = (j->rank + 1) % N, prev = (j->rank + N - 1) % N;
    unsigned char *s = dev(BIG, j->rank + 1), *r1 = dev(BIG, 0), *r2 = dev(BIG, 0);
    unsigned char *self_s = dev(64, 0x5a), *self_r = dev(64, 0);
    ncclGroupStart();
    ncclSend(s, BIG, ncclUint8, next, c, NULL);
    ncclSend(s, BIG, ncclUint8, prev, c, NULL);
    ncclRecv(r1, BIG, ncclUint8, prev, c, NULL);
    ncclRecv(r2, BIG, ncclUint8, next, c, NULL);
    ncclSend(self_s, 64, ncclUint8, j->rank, c, NULL);
    ncclRecv(self_r, 64, ncclUint8, j->rank, c, NULL);
    ncclResult_t res = ncclGroupEnd();
    if (res != ncclSuccess)
        return FAILJ("rank %d: ncclGroupEnd: %s", j->rank, ncclGetLastError(NULL));
    unsigned char *h = malloc(BIG);
    cudaMemcpy(h, r1, BIG, cudaMemcpyDeviceToHost);
    int bad = h[0] != prev + 1 || h[BIG - 1] != prev + 1;
    cudaMemcpy(h, r2, BIG, cudaMemcpyDeviceToHost);
    bad |= h[0] != next + 1 || h[BIG - 1] != next + 1;
    cudaMemcpy(h, self_r, 64, cudaMemcpyDeviceToHost);
    bad |= h[0] != 0x5a || h[63] != 0x5a;
    free(h);
    cudaFree(s), cudaFree(r1), cudaFree(r2), cudaFree(self_s), cudaFree(self_r);
    return bad ? FAILJ("rank %d: wrong bytes received", j->rank) : 0;
}

Test(fake_nccl, grouped_ring_and_self)
{
    job js[N];
    world(ring_body, js, false);
    for (int r = 0; r < N; r++) {
        cr_expect_eq(js[r].init, ncclSuccess, "init %d: %s", r, js[r].init_msg);
        cr_expect(!js[r].err[0], "%s", js[r].err);
    }
}

/* AllReduce (sum), AllGather in place, then a split by parity. */
static int coll_body(job *j, ncclComm_t c)
{
    int32_t *x = dev(4 * sizeof *x, 0), hx[4];
    for (int i = 0; i < 4; i++)
        hx[i] = (j->rank + 1) * (i + 1);
    cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
    if (ncclAllReduce(x, x, 4, ncclInt32, ncclSum, c, NULL) != ncclSuccess)
        return FAILJ("rank %d: ncclAllReduce", j->rank);
    cudaMemcpy(hx, x, sizeof hx, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 4; i++)
        if (hx[i] != 6 * (i + 1))
            return FAILJ("rank %d: allreduce[%d] = %d, expected %d", j->rank, i, hx[i], 6 * (i + 1));
    float *g = dev(N * 2 * sizeof *g, 0), hg[N * 2];
    float mine[2] = {(float)j->rank, (float)j->rank + 0.5f};
    cudaMemcpy(g + 2 * j->rank, mine, sizeof mine, cudaMemcpyHostToDevice);
    if (ncclAllGather(g + 2 * j->rank, g, 2, ncclFloat32, c, NULL) != ncclSuccess)
        return FAILJ("rank %d: ncclAllGather", j->rank);
    cudaMemcpy(hg, g, sizeof hg, cudaMemcpyDeviceToHost);
    for (int r = 0; r < N; r++)
        if (hg[2 * r] != (float)r || hg[2 * r + 1] != (float)r + 0.5f)
            return FAILJ("rank %d: allgather part %d wrong", j->rank, r);
    ncclComm_t sub = NULL;
    if (ncclCommSplit(c, j->rank % 2, -j->rank, &sub, NULL) != ncclSuccess)
        return FAILJ("rank %d: ncclCommSplit: %s", j->rank, ncclGetLastError(NULL));
    int sr = -1, ss = -1;
    ncclCommUserRank(sub, &sr);
    ncclCommCount(sub, &ss);
    /* evens {0, 2} keyed -rank: rank 2 first; odds {1} */
    int want_s = j->rank % 2 ? 1 : 2, want_r = j->rank == 0 ? 1 : 0;
    if (ss != want_s || sr != want_r)
        return FAILJ("rank %d: split gave rank %d of %d, expected %d of %d", j->rank, sr, ss, want_r,
                     want_s);
    int32_t one = 1, *d1 = dev(sizeof one, 0);
    cudaMemcpy(d1, &one, sizeof one, cudaMemcpyHostToDevice);
    ncclAllReduce(d1, d1, 1, ncclInt32, ncclSum, sub, NULL);
    cudaMemcpy(&one, d1, sizeof one, cudaMemcpyDeviceToHost);
    ncclCommDestroy(sub);
    cudaFree(x), cudaFree(g), cudaFree(d1);
    return one == want_s ? 0 : FAILJ("rank %d: allreduce on the split gave %d", j->rank, one);
}

Test(fake_nccl, collectives_and_split)
{
    job js[N];
    world(coll_body, js, false);
    for (int r = 0; r < N; r++) {
        cr_expect_eq(js[r].init, ncclSuccess, "init %d: %s", r, js[r].init_msg);
        cr_expect(!js[r].err[0], "%s", js[r].err);
    }
}

/* Rank 0 sends 64 bytes to rank 1, which posts a receive of 32: refused with
 * both sizes named (NVIDIA's NCCL would hang or corrupt); host memory is
 * refused at the call. */
static int refuse_body(job *j, ncclComm_t c)
{
    unsigned char host[64] = {0};
    if (ncclSend(host, 64, ncclUint8, (j->rank + 1) % N, c, NULL) != ncclInvalidArgument ||
        !strstr(ncclGetLastError(NULL), "is not device memory"))
        return FAILJ("rank %d: host memory accepted (%s)", j->rank, ncclGetLastError(NULL));
    void *b = dev(64, 0);
    ncclResult_t res = ncclSuccess;
    if (j->rank == 0)
        res = ncclSend(b, 64, ncclUint8, 1, c, NULL);
    else if (j->rank == 1)
        res = ncclRecv(b, 32, ncclUint8, 0, c, NULL);
    cudaFree(b);
    if (j->rank == 1) {
        if (res != ncclInvalidUsage ||
            !strstr(ncclGetLastError(NULL), "receive of 32 bytes from rank 0 met a send of 64"))
            return FAILJ("rank 1: a mismatched receive gave %d (%s)", (int)res,
                         ncclGetLastError(NULL));
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(c, &async);
        if (async != ncclInvalidUsage)
            return FAILJ("rank 1: async error %d after the mismatch", (int)async);
    } else if (res != ncclSuccess && !(j->rank == 0 && strstr(ncclGetLastError(NULL), "sending to rank 1"))) {
        /* rank 0's send completes, or fails because rank 1 refused the message and closed its end
         * first (a race: either is right; a hang or a silent success on rank 1 is not) */
        return FAILJ("rank %d: %s", j->rank, ncclGetLastError(NULL));
    }
    return 0;
}

Test(fake_nccl, refusals)
{
    job js[N];
    world(refuse_body, js, false);
    for (int r = 0; r < N; r++) {
        cr_expect_eq(js[r].init, ncclSuccess, "init %d: %s", r, js[r].init_msg);
        cr_expect(!js[r].err[0], "%s", js[r].err);
    }
}

Test(fake_nccl, duplicate_gpu)
{
    job js[N];
    world(NULL, js, true);
    for (int r = 0; r < N; r++) {
        cr_expect_eq(js[r].init, ncclInvalidUsage, "rank %d: %d", r, (int)js[r].init);
        cr_expect(strstr(js[r].init_msg, "Duplicate GPU detected") != NULL, "%s", js[r].init_msg);
    }
}

Test(fake_nccl, bad_ids_and_arguments)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclComm_t c = (ncclComm_t)0x1;
    cr_expect_eq(ncclCommInitRank(&c, 2, id, 0), ncclInvalidArgument);
    cr_expect_null(c);
    cr_expect(strstr(ncclGetLastError(NULL), "not a unique id") != NULL, "%s", ncclGetLastError(NULL));
    cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
    cr_expect_eq(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument);
    cr_expect_eq(ncclGroupEnd(), ncclInvalidUsage);
    /* one rank alone */
    cr_assert_eq(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
    int n = 0;
    ncclCommCount(c, &n);
    cr_expect_eq(n, 1);
    cr_expect_eq(ncclSend(NULL, 0, ncclUint8, 1, c, NULL), ncclInvalidArgument, "peer 1 of 1");
    cr_expect_eq(ncclCommDestroy(c), ncclSuccess);
}
