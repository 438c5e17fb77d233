/*
 * memlimit.h - how much memory this process may still take, and the
 * refusal of a run that would not fit (issue 14: under `ulimit -v` an
 * OpenBLAS work-buffer allocation that fails is retried forever, so a run
 * that cannot fit must be refused before it starts, with exit status 3).
 *
 * Four limits are read: RLIMIT_AS (virtual address space, `ulimit -v`)
 * minus the process's current VmSize; RLIMIT_DATA (`ulimit -d`, which
 * covers private writable mappings such as OpenBLAS's buffers) minus
 * VmData, compared with the same virtual need; the cgroup v2 (or v1) memory limit
 * minus its current usage; and MemAvailable of /proc/meminfo.  Virtual
 * address space is compared with the virtual need (buffers plus, per rank
 * thread, CPC_RANK_VM_BYTES of stack, malloc arena and BLAS work buffer),
 * physical limits with the resident need (buffers plus CPC_RANK_RSS_BYTES
 * per rank).
 *
 * CPC_MEM_LIMIT_BYTES (environment, bytes) adds a limit of its own, as if
 * the machine had only that much (tests, and a user sharing a node).
 *
 * Thread-safety: reentrant (reads /proc and getrlimit only).
 */
#ifndef CPC_MEMLIMIT_H
#define CPC_MEMLIMIT_H

#include <stdint.h>

#include "status.h"

/* Per rank thread, beyond its buffers: 8 MiB stack, a 64 MiB glibc malloc
 * arena (reserved address space) and OpenBLAS's 128 MiB work buffer. */
#define CPC_RANK_VM_BYTES ((int64_t)200 << 20)
#define CPC_RANK_RSS_BYTES ((int64_t)16 << 20)

typedef struct cpc_mem_room {
    int64_t vm_free;        /* RLIMIT_AS - VmSize; -1: no limit */
    int64_t vm_limit;       /* RLIMIT_AS; -1: none */
    int64_t phys_free;      /* least of cgroup room, MemAvailable, CPC_MEM_LIMIT_BYTES; -1: unknown */
    const char *phys_what;  /* which of them: "the cgroup memory limit", ... */
    int64_t data_free;      /* RLIMIT_DATA - VmData; -1: no limit */
    int64_t data_limit;     /* RLIMIT_DATA; -1: none */
} cpc_mem_room;

/* Reads the limits now. */
void cpc_mem_room_read(cpc_mem_room *r);

/* Refuses (CPC_E_NOMEM, exit status 3) a run that needs `need_vm` bytes of
 * address space and `need_rss` resident bytes more than this process has
 * now; the message names both figures and the limit that refuses, prefixed
 * with `what` ("cprun: 2 ranks of small").  NULL when it fits. */
cpc_status *cpc_mem_check(const char *what, int64_t need_vm, int64_t need_rss);

/* Probes that `bytes` of address space can be mapped now (PROT_NONE,
 * nothing committed) and unmaps it: a rank calls it before its first BLAS
 * call, whose work buffer would otherwise be retried forever.  Errors:
 * CPC_E_NOMEM naming the size. */
cpc_status *cpc_mem_probe(int64_t bytes);


#endif
