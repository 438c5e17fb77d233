/*
 * cpc/tool.h - the tooling layer: the policy of the `cpc` and `cprun`
 * programs (exit statuses, atomic output files, checks that name their
 * `--option`s, cprun's failure JSON), kept out of the core library API.
 *
 * NOT part of libcpc.so: these functions are not exported (they carry no
 * CPC_API) and this header is not installed.  They live in the static
 * library cpc_tool (CMake target cpc_tool, tool/tool.c over the layers),
 * which only tools/ (and the tests) link, together with the static libcpc
 * (cpc_static).  tests/cli/library.sh checks that none of them is exported.
 *
 * Thread-safety: as libcpc (no shared state; an atomic file is used by one
 * thread at a time).
 */
#ifndef CPC_PUBLIC_TOOL_H
#define CPC_PUBLIC_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cpc/session.h"
#include "cpc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- exit statuses --------------------------------------------------------------- */

/* Exit status a tool gives for this status (worst over the chain; SPEC
 * section 3): 0 for NULL or warnings only, 1 plan/check (CPC_E_PLAN,
 * CPC_E_CHECK), 2 usage/io/input, 3 runtime/internal/memory/unsupported. */
int cpc_status_exit_code(const cpc_status *st);

/* A new error status of class `code` with `message` (copied): for a tool's
 * own errors alongside libcpc's.  Caller frees with cpc_status_free.  Never
 * NULL (out of memory: the static out-of-memory status). */
cpc_status *cpc_status_new(cpc_code code, const char *message);

/* ---- atomic files ---------------------------------------------------------------- */

/* Opaque: a file being written atomically. */
typedef struct cpc_atomic_file cpc_atomic_file;

/* Opens `path` for an atomic write: a temporary file beside it (renamed over
 * it by commit; removed if the process dies of SIGINT, SIGTERM or SIGHUP);
 * a character device or FIFO is written through; a directory is refused.
 * `verb` (a string literal, "cannot create") starts the error message after
 * "PATH: ".  Errors: CPC_E_IO, CPC_E_NOMEM, CPC_E_USAGE (a NULL). */
cpc_status *cpc_atomic_file_open(const char *path, const char *verb, cpc_atomic_file **out);

/* Writes `bytes` bytes of `data` at the end of the file.  Errors: CPC_E_IO
 * ("PATH: write failed: REASON"; the file stays open: discard it). */
cpc_status *cpc_atomic_file_write(cpc_atomic_file *f, const void *data, size_t bytes);

/* Flushes, fsyncs and puts the file in place; frees f in any case.  On
 * error the target is left as it was.  Errors: CPC_E_IO. */
cpc_status *cpc_atomic_file_commit(cpc_atomic_file *f);

/* Drops the temporary file, leaving the target as it was; frees f.  NULL
 * is ignored. */
void cpc_atomic_file_discard(cpc_atomic_file *f);

/* Writes `bytes` bytes of `data` to `path` atomically (open + write +
 * commit above).  Errors: CPC_E_IO, CPC_E_USAGE (a NULL). */
cpc_status *cpc_write_file_atomic(const char *path, const void *data, size_t bytes);

/* ---- checks that name cprun's options --------------------------------------------- */

/* Checks, before anything runs, that the files the run will write can be
 * written (output_path, trace_path, output_shards_dir: named as cprun's
 * --output, --trace, --output-shards) and that none of them is an input
 * (`plan_path` may be NULL).  Creates and changes nothing.  `o` is read by
 * the size rule (compiler.h THE SIZE MEMBER).  Errors: CPC_E_IO naming the
 * option and the path, CPC_E_USAGE (o NULL, bad size or enum). */
cpc_status *cpc_job_check_outputs(const cpc_job_options *o, const char *plan_path);

/* Checks that `path` can be written as the file of option `what`
 * ("--profile-out", ...): an existing file writable and not a directory, a
 * new one in a writable directory.  Errors: CPC_E_IO. */
cpc_status *cpc_check_writable_file(const char *what, const char *path);

/* The JSON object cprun prints when there is no report (a rejected plan, a
 * usage or input error, a runtime failure): the report's keys with what is
 * known (variant NULL, degrees and ranks <= 0: null), "ok": false and
 * "error": {"code", "class", "message", "exit_status"} from the first error
 * of `err` (NULL: class "usage" with `message`).  Malloc'd (caller frees);
 * NULL on OOM. */
char *cpc_report_failure_json(const char *variant, int ring_degree, int ulysses_degree, int ranks,
                              const cpc_status *err, const char *message, int exit_status);

#ifdef __cplusplus
}
#endif
#endif
