/*
 * fileio.h - the one way cpc and cprun write a user-visible file, and open
 * one for reading without blocking.
 *
 * Writing (cpc_outfile): every file a user asked for (the artifact, --output,
 * --output-shards, --trace, --profile-out, --emit-kernels, --plot) is written
 * to a temporary file `PATH.tmpXXXXXX` in the same directory, flushed,
 * fsync'ed and renamed over PATH only when everything was written; the
 * directory is fsync'ed after the rename.  A write that fails (a full disk,
 * EFBIG) removes the temporary file and leaves whatever PATH held before
 * untouched.  While a temporary file exists it is registered, and SIGINT,
 * SIGTERM and SIGHUP (when their disposition is the default) remove every
 * registered temporary file before the process dies of the signal: an
 * interrupted run leaves no partial file and the previous PATH as it was.
 *
 * What PATH is now decides how it is written: nothing, or a regular file:
 * temporary file + rename (the mode of an existing file is kept, a new file
 * gets 0666 & ~umask); a symbolic link: the same in the directory of the
 * file it points to, so the link stays a link; a character device or FIFO
 * (/dev/null, /dev/full, /dev/stdout on a pipe): written through, nothing
 * renamed; a directory or anything else: refused.  A FIFO is opened without
 * blocking: when no reader has it open within 2 s, cpc_outfile_open fails
 * ("a FIFO (named pipe) with no reader") instead of blocking forever; while
 * a FIFO or device is open, SIGPIPE is blocked in the opening thread, so a
 * reader that goes away is a write error (EPIPE), not the death of the
 * process (write from the thread that opened it).
 *
 * Stale temporary files: a writer holds an flock on its temporary file from
 * creation to rename; cpc_outfile_open removes PATH.tmpXXXXXX files next to
 * the target that nobody holds and that are at least 1 s old (left by a
 * writer killed with SIGKILL, which no handler can catch).
 *
 * Reading (cpc_open_read): opens with O_NONBLOCK, so that a FIFO without a
 * writer does not block open() forever, then checks what it opened: a
 * regular file is returned in blocking mode; a FIFO or pipe only when
 * `allow_pipe` (then reads see end of file when no writer is there, never a
 * hang); a directory, a device or a socket is refused.
 *
 * Errors are CPC_E_IO with "PATH: VERB: strerror" (VERB as given, e.g.
 * "cannot write the artifact").  Thread-safety: distinct cpc_outfile objects
 * may be used from several threads at once.
 */
#ifndef CPC_FILEIO_H
#define CPC_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>

#include "status.h"

typedef struct cpc_outfile {
    FILE *f;          /* write here (fwrite, fprintf, ...) */
    char *path;       /* as given (owned) */
    char *target;     /* the file replaced (a link's target; owned) */
    char *tmp;        /* temporary file, NULL when written through (owned) */
    const char *verb; /* for messages */
    int slot;         /* signal-cleanup registration, -1 none */
    int mode;         /* permissions given to the file */
    bool pipe_blocked; /* SIGPIPE blocked in this thread until commit/discard */
    sigset_t sig_saved; /* the thread's signal mask before that */
} cpc_outfile;

/* Opens `path` for writing as above.  `verb` (a string literal) starts the
 * error message after "PATH: ".  On error *o is cleared (nothing to
 * discard). */
cpc_status *cpc_outfile_open(cpc_outfile *o, const char *path, const char *verb);

/* Flushes, fsyncs and closes the stream, then renames the temporary file
 * over the target.  On error the temporary file is removed and the target
 * left as it was.  Always releases *o. */
cpc_status *cpc_outfile_commit(cpc_outfile *o);

/* Flushes and fsyncs what was written (the temporary file stays open and
 * unrenamed): after it, a commit can only fail in the rename.  For sets of
 * files made all or nothing (prepare every file, then commit every file).
 * Errors as commit's; the caller then discards. */
cpc_status *cpc_outfile_prepare(cpc_outfile *o);
/* Closes and removes the temporary file without touching the target.
 * Safe on a cleared or already released *o. */
void cpc_outfile_discard(cpc_outfile *o);

/* open + one write + commit. */
cpc_status *cpc_write_file(const char *path, const char *verb, const void *data, size_t n);

/* Opens `path` read-only without blocking in open() (see above).  `what`
 * names the file in messages ("--input", "cluster.profile", ...).  Returns
 * the descriptor (O_CLOEXEC, blocking mode) or -1 with *err set. */
int cpc_open_read(const char *path, const char *what, bool allow_pipe, cpc_status **err);

/* The same as a stdio stream ("rb"). */
FILE *cpc_fopen_read(const char *path, const char *what, bool allow_pipe, cpc_status **err);

#endif
