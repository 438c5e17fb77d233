/* fileio.c - see fileio.h */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- temporary files removed on SIGINT / SIGTERM / SIGHUP ------------------------- */

enum { N_SLOTS = 32, SLOT_PATH = 4096 };
/* state: 0 free, 1 being filled or emptied, 2 holds a path */
static atomic_int slot_state[N_SLOTS];
static char slot_path[N_SLOTS][SLOT_PATH];
static atomic_int handlers_installed;
static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void cleanup_handler(int sig)
{
    int saved = errno;
    for (int i = 0; i < N_SLOTS; i++)
        if (atomic_load(&slot_state[i]) == 2)
            unlink(slot_path[i]);
    errno = saved;
    /* die of the signal, as without the handler */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_handlers(void)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&handlers_installed, &expected, 1))
        return;
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++) {
        struct sigaction old;
        if (sigaction(cleanup_signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue; /* the program handles (or ignores) it itself */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = cleanup_handler;
        sigemptyset(&sa.sa_mask);
        sigaction(cleanup_signals[i], &sa, NULL);
    }
}

static int register_tmp(const char *path)
{
    if (strlen(path) >= SLOT_PATH)
        return -1;
    install_handlers();
    for (int i = 0; i < N_SLOTS; i++) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&slot_state[i], &expected, 1)) {
            memcpy(slot_path[i], path, strlen(path) + 1);
            atomic_store(&slot_state[i], 2);
            return i;
        }
    }
    return -1;
}

static void unregister_tmp(int slot)
{
    if (slot >= 0 && slot < N_SLOTS)
        atomic_store(&slot_state[slot], 0);
}

/* ---- writing ------------------------------------------------------------------- */

enum { FIFO_WAIT_MS = 2000, STALE_MIN_AGE_S = 1 };

static cpc_status *werr(const char *path, const char *verb, int e)
{
    return cpc_error(CPC_E_IO, "%s: %s: %s", path, verb, strerror(e ? e : EIO));
}

/* The directory part of path ("." when there is none), malloc'ed. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* The file a symbolic link points to (followed to the end; a dangling
 * link: the path it names, relative to the link's directory). */
static char *link_target(const char *path)
{
    char *r = realpath(path, NULL);
    if (r)
        return r;
    char buf[PATH_MAX];
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    if (n <= 0)
        return NULL;
    buf[n] = 0;
    if (buf[0] == '/')
        return strdup(buf);
    char *d = dir_of(path);
    char *out = NULL;
    if (d && asprintf(&out, "%s/%s", d, buf) < 0)
        out = NULL;
    free(d);
    return out;
}

/* Removes TARGET.tmpXXXXXX files that a killed writer (SIGKILL, a crash, a
 * power cut) left next to target: a temporary file is stale when no process
 * holds its flock (a live writer holds it from creation to rename) and it is
 * older than STALE_MIN_AGE_S seconds (the lock is taken just after
 * mkostemp).  Best effort: errors are ignored. */
static void remove_stale_tmp(const char *target)
{
    char *d = dir_of(target);
    if (!d)
        return;
    const char *slash = strrchr(target, '/');
    const char *base = slash ? slash + 1 : target;
    size_t bl = strlen(base);
    DIR *dir = opendir(d);
    if (!dir) {
        free(d);
        return;
    }
    time_t now = time(NULL);
    struct dirent *de;
    while ((de = readdir(dir))) {
        const char *n = de->d_name;
        if (strlen(n) != bl + 10 || strncmp(n, base, bl) != 0 || strncmp(n + bl, ".tmp", 4) != 0)
            continue;
        int dfd = dirfd(dir);
        int fd = openat(dfd, n, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
            continue;
        struct stat sb;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && now - sb.st_mtime >= STALE_MIN_AGE_S &&
            flock(fd, LOCK_EX | LOCK_NB) == 0)
            (void)unlinkat(dfd, n, 0);
        close(fd);
    }
    closedir(dir);
    free(d);
}

cpc_status *cpc_outfile_open(cpc_outfile *o, const char *path, const char *verb)
{
    memset(o, 0, sizeof *o);
    o->slot = -1;
    if (!path || !*path)
        return cpc_error(CPC_E_USAGE, "%s: empty path", verb);
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    bool exists = lstat(path, &sb) == 0;
    if (!exists && errno != ENOENT)
        return werr(path, verb, errno);
    char *target = NULL;
    if (exists && S_ISLNK(sb.st_mode)) {
        target = link_target(path);
        if (!target)
            return werr(path, verb, errno);
        exists = stat(target, &sb) == 0;
    } else {
        target = strdup(path);
        if (!target)
            return &cpc_status_oom;
    }
    if (exists && S_ISDIR(sb.st_mode)) {
        free(target);
        return cpc_error(CPC_E_IO, "%s: %s: is a directory", path, verb);
    }
    if (exists && (S_ISCHR(sb.st_mode) || S_ISFIFO(sb.st_mode))) {
        /* a device or FIFO: written through.  A FIFO is opened without
         * blocking: with no reader open() fails (ENXIO) at once, retried for
         * FIFO_WAIT_MS, then refused (never a writer blocked forever). */
        int fd = -1;
        for (int waited = 0;; waited += 20) {
            fd = open(target, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
            if (fd >= 0 || errno != ENXIO || !S_ISFIFO(sb.st_mode) || waited >= FIFO_WAIT_MS)
                break;
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (fd < 0) {
            int e = errno;
            free(target);
            if (e == ENXIO && S_ISFIFO(sb.st_mode))
                return cpc_error(CPC_E_IO,
                                 "%s: %s: a FIFO (named pipe) with no reader (waited %d s); start "
                                 "the reader first",
                                 path, verb, FIFO_WAIT_MS / 1000);
            return werr(path, verb, e);
        }
        int fl = fcntl(fd, F_GETFL);
        FILE *f = NULL;
        if (fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0)
            f = fdopen(fd, "wb");
        if (!f) {
            int e = errno;
            close(fd);
            free(target);
            return werr(path, verb, e);
        }
        /* a reader that goes away makes write() fail with EPIPE (an error
         * here, exit 2) instead of killing the process with SIGPIPE: the
         * signal is blocked in this thread until commit/discard */
        sigset_t pipe_set;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        o->pipe_blocked = pthread_sigmask(SIG_BLOCK, &pipe_set, &o->sig_saved) == 0;
        o->f = f;
        o->target = target;
        o->path = strdup(path);
        o->verb = verb;
        if (!o->path) {
            fclose(f);
            free(target);
            if (o->pipe_blocked)
                pthread_sigmask(SIG_SETMASK, &o->sig_saved, NULL);
            memset(o, 0, sizeof *o);
            o->slot = -1;
            return &cpc_status_oom;
        }
        return NULL;
    }
    if (exists && !S_ISREG(sb.st_mode)) {
        free(target);
        return cpc_error(CPC_E_IO, "%s: %s: not a regular file, a device or a FIFO; refusing to replace it",
                         path, verb);
    }
    mode_t mask = umask(0);
    umask(mask);
    o->mode = exists ? (int)(sb.st_mode & 07777) : (int)(0666 & ~mask);
    size_t tl = strlen(target);
    char *tmp = malloc(tl + 16);
    o->path = strdup(path);
    if (!tmp || !o->path) {
        free(tmp);
        free(target);
        free(o->path);
        memset(o, 0, sizeof *o);
        o->slot = -1;
        return &cpc_status_oom;
    }
    snprintf(tmp, tl + 16, "%s.tmpXXXXXX", target);
    remove_stale_tmp(target);
    /* The temporary file is created and registered for the cleanup handler
     * with the cleanup signals blocked: a signal that arrives in between is
     * delivered after registration, so it never leaves the file behind. */
    install_handlers();
    sigset_t block, saved;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++)
        sigaddset(&block, cleanup_signals[i]);
    pthread_sigmask(SIG_BLOCK, &block, &saved);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd >= 0) {
        o->slot = register_tmp(tmp);
        /* held until the rename: tells a live temporary file from a stale
         * one (remove_stale_tmp) */
        (void)flock(fd, LOCK_EX | LOCK_NB);
    }
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        free(target);
        free(o->path);
        memset(o, 0, sizeof *o);
        o->slot = -1;
        return werr(path, verb, e);
    }
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        unregister_tmp(o->slot);
        free(tmp);
        free(target);
        free(o->path);
        memset(o, 0, sizeof *o);
        o->slot = -1;
        return werr(path, verb, e);
    }
    o->tmp = tmp;
    o->target = target;
    o->verb = verb;
    return NULL;
}

static void release(cpc_outfile *o)
{
    if (o->pipe_blocked) {
        /* drop a SIGPIPE raised by our writes (the write already failed with
         * EPIPE), then unblock it */
        sigset_t pipe_set, pend;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        if (sigpending(&pend) == 0 && sigismember(&pend, SIGPIPE)) {
            struct timespec zero = {0, 0};
            (void)sigtimedwait(&pipe_set, NULL, &zero);
        }
        pthread_sigmask(SIG_SETMASK, &o->sig_saved, NULL);
    }
    unregister_tmp(o->slot);
    free(o->path);
    free(o->target);
    free(o->tmp);
    memset(o, 0, sizeof *o);
    o->slot = -1;
}

cpc_status *cpc_outfile_prepare(cpc_outfile *o)
{
    if (!o->f)
        return cpc_error(CPC_E_INTERNAL, "cpc_outfile_prepare: no open file");
    int e = 0;
    errno = 0;
    if (fflush(o->f) != 0 || ferror(o->f))
        e = errno ? errno : EIO;
    if (!e && o->tmp && fsync(fileno(o->f)) != 0 && errno != EINVAL && errno != EROFS)
        e = errno;
    return e ? werr(o->path, o->verb, e) : NULL;
}

void cpc_outfile_discard(cpc_outfile *o)
{
    if (!o || (!o->f && !o->path))
        return;
    if (o->f)
        fclose(o->f);
    if (o->tmp)
        unlink(o->tmp);
    release(o);
}

cpc_status *cpc_outfile_commit(cpc_outfile *o)
{
    if (!o->f) {
        release(o);
        return cpc_error(CPC_E_INTERNAL, "cpc_outfile_commit: no open file");
    }
    int e = 0;
    errno = 0;
    if (fflush(o->f) != 0 || ferror(o->f))
        e = errno ? errno : EIO;
    /* a device or FIFO cannot be synced (EINVAL/EROFS are no failure) */
    if (!e && o->tmp && fsync(fileno(o->f)) != 0 && errno != EINVAL && errno != EROFS)
        e = errno;
    /* renamed before the close: the temporary file's lock (remove_stale_tmp)
     * is held until it has its final name */
    bool renamed = false;
    if (!e && o->tmp) {
        if (fchmod(fileno(o->f), (mode_t)o->mode) != 0 || rename(o->tmp, o->target) != 0)
            e = errno;
        else
            renamed = true;
    }
    if (fclose(o->f) != 0 && !e)
        e = errno ? errno : EIO;
    o->f = NULL;
    if (renamed) {
        {
            /* the rename itself is durable once the directory is synced */
            char *d = dir_of(o->target);
            int dfd = d ? open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
            if (dfd >= 0) {
                (void)fsync(dfd);
                close(dfd);
            }
            free(d);
            free(o->tmp);
            o->tmp = NULL;
        }
    }
    cpc_status *st = e ? werr(o->path, o->verb, e) : NULL;
    if (o->tmp)
        unlink(o->tmp);
    release(o);
    return st;
}

cpc_status *cpc_write_file(const char *path, const char *verb, const void *data, size_t n)
{
    cpc_outfile o;
    cpc_status *st = cpc_outfile_open(&o, path, verb);
    if (st)
        return st;
    if (n && fwrite(data, 1, n, o.f) != n) {
        int e = errno;
        cpc_outfile_discard(&o);
        return werr(path, verb, e);
    }
    return cpc_outfile_commit(&o);
}

/* ---- reading ------------------------------------------------------------------- */

int cpc_open_read(const char *path, const char *what, bool allow_pipe, cpc_status **err)
{
    *err = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        *err = cpc_error(CPC_E_IO, "%s %s: cannot open: %s", what, path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        *err = cpc_errno_status(CPC_E_IO, errno, path);
        close(fd);
        return -1;
    }
    const char *kind = S_ISDIR(sb.st_mode)    ? "a directory"
                       : S_ISFIFO(sb.st_mode) ? "a FIFO (named pipe)"
                       : S_ISCHR(sb.st_mode)  ? "a character device"
                       : S_ISBLK(sb.st_mode)  ? "a block device"
                       : S_ISSOCK(sb.st_mode) ? "a socket"
                                              : NULL;
    bool ok = S_ISREG(sb.st_mode) || (allow_pipe && S_ISFIFO(sb.st_mode));
    if (!ok) {
        *err = cpc_error(CPC_E_IO, "%s %s: is %s, not a regular file", what, path,
                         kind ? kind : "not a regular file");
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        *err = cpc_errno_status(CPC_E_IO, errno, path);
        close(fd);
        return -1;
    }
    return fd;
}

FILE *cpc_fopen_read(const char *path, const char *what, bool allow_pipe, cpc_status **err)
{
    int fd = cpc_open_read(path, what, allow_pipe, err);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        *err = cpc_errno_status(CPC_E_IO, errno, path);
        close(fd);
    }
    return f;
}
