/* memlimit.c - see memlimit.h */
#include "memlimit.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* "Key:   123 kB" of a /proc file, in bytes; -1 when absent. */
static int64_t proc_kb(const char *file, const char *key)
{
    FILE *f = fopen(file, "r");
    if (!f)
        return -1;
    char line[256];
    size_t kl = strlen(key);
    int64_t v = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

/* A number from a one-line file ("max" or missing: -1). */
static int64_t file_num(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[64] = "";
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || strncmp(buf, "max", 3) == 0)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || end == buf || v < 0)
        return -1;
    return v;
}

/* The cgroup's room (limit - usage), -1 when unlimited or unknown.  v2:
 * /proc/self/cgroup "0::/path" -> /sys/fs/cgroup/path/memory.{max,current};
 * v1: memory.limit_in_bytes / memory.usage_in_bytes of the memory
 * controller's mount (limits above 2^60 mean none). */
static int64_t cgroup_room(void)
{
    char rel[1024] = "";
    /* (line buffer no longer than rel, so nothing is truncated) */
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f) {
        char line[1000];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "0::", 3) == 0) {
                snprintf(rel, sizeof rel, "%.999s", line + 3);
                rel[strcspn(rel, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    char p1[1200], p2[1200];
    /* v2: walk up from our cgroup; the tightest limit counts */
    int64_t best = -1;
    if (rel[0]) {
        char cur[1024];
        snprintf(cur, sizeof cur, "%s", rel);
        for (;;) {
            snprintf(p1, sizeof p1, "/sys/fs/cgroup%s/memory.max", cur);
            snprintf(p2, sizeof p2, "/sys/fs/cgroup%s/memory.current", cur);
            int64_t lim = file_num(p1), use = file_num(p2);
            if (lim >= 0 && use >= 0) {
                int64_t room = lim > use ? lim - use : 0;
                if (best < 0 || room < best)
                    best = room;
            }
            char *slash = strrchr(cur, '/');
            if (!slash || slash == cur)
                break;
            *slash = 0;
        }
        if (best >= 0)
            return best;
    }
    int64_t lim = file_num("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    int64_t use = file_num("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (lim >= 0 && lim < ((int64_t)1 << 60) && use >= 0)
        return lim > use ? lim - use : 0;
    return -1;
}

void cpc_mem_room_read(cpc_mem_room *r)
{
    memset(r, 0, sizeof *r);
    r->vm_free = r->vm_limit = r->phys_free = r->data_free = r->data_limit = -1;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        r->vm_limit = (int64_t)rl.rlim_cur;
        int64_t vm = proc_kb("/proc/self/status", "VmSize");
        r->vm_free = vm >= 0 && r->vm_limit > vm ? r->vm_limit - vm : vm >= 0 ? 0 : r->vm_limit;
    }
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        r->data_limit = (int64_t)rl.rlim_cur;
        int64_t vd = proc_kb("/proc/self/status", "VmData");
        r->data_free = vd >= 0 && r->data_limit > vd ? r->data_limit - vd : vd >= 0 ? 0 : r->data_limit;
    }
    int64_t cg = cgroup_room();
    if (cg >= 0) {
        r->phys_free = cg;
        r->phys_what = "the cgroup's memory limit";
    }
    int64_t av = proc_kb("/proc/meminfo", "MemAvailable");
    if (av >= 0 && (r->phys_free < 0 || av < r->phys_free)) {
        r->phys_free = av;
        r->phys_what = "the machine's available memory (MemAvailable)";
    }
    const char *env = getenv("CPC_MEM_LIMIT_BYTES");
    if (env && *env) {
        char *end;
        long long v = strtoll(env, &end, 10);
        if (*end == 0 && v >= 0 && (r->phys_free < 0 || v < r->phys_free)) {
            r->phys_free = v;
            r->phys_what = "CPC_MEM_LIMIT_BYTES";
        }
    }
}

static double mib(int64_t b) { return (double)b / 1048576.0; }

cpc_status *cpc_mem_check(const char *what, int64_t need_vm, int64_t need_rss)
{
    cpc_mem_room r;
    cpc_mem_room_read(&r);
    cpc_status *st = NULL;
    if (r.vm_free >= 0 && need_vm > r.vm_free)
        st = cpc_error(CPC_E_NOMEM,
                       "%s: not enough address space: the run needs about %.0f MiB more, but the limit "
                       "(RLIMIT_AS, ulimit -v: %.0f MiB) leaves %.0f MiB; refusing to start",
                       what, mib(need_vm), mib(r.vm_limit), mib(r.vm_free));
    else if (r.data_free >= 0 && need_vm > r.data_free)
        st = cpc_error(CPC_E_NOMEM,
                       "%s: not enough data space: the run needs about %.0f MiB more, but the limit "
                       "(RLIMIT_DATA, ulimit -d: %.0f MiB) leaves %.0f MiB; refusing to start",
                       what, mib(need_vm), mib(r.data_limit), mib(r.data_free));
    else if (r.phys_free >= 0 && need_rss > r.phys_free)
        st = cpc_error(CPC_E_NOMEM,
                       "%s: not enough memory: the run needs about %.0f MiB, but %s leaves %.0f MiB; "
                       "refusing to start",
                       what, mib(need_rss), r.phys_what, mib(r.phys_free));
    if (st)
        cpc_status_set_hint(st, "use fewer ranks per process (mpirun, one rank each), a larger "
                                "world_size, fewer tokens, --check-rows, or raise the limit");
    return st;
}

cpc_status *cpc_mem_probe(int64_t bytes)
{
    if (bytes <= 0)
        return NULL;
    /* writable and private, as OpenBLAS maps its buffer: counted against
     * RLIMIT_DATA as well as RLIMIT_AS (nothing is touched or committed) */
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return cpc_error(CPC_E_NOMEM,
                         "not enough address space for the rank's BLAS work buffer and stack (%.0f MiB): %s "
                         "(ulimit -v / ulimit -d)",
                         mib(bytes), strerror(errno));
    munmap(p, (size_t)bytes);
    return NULL;
}
