/*
 * tool.c - the tooling layer (include/cpc/tool.h): statuses for a tool's own
 * errors, atomic output files, cprun's output checks.  Built as the static
 * library cpc_tool, linked by tools/ only (never part of libcpc.so); the
 * exit statuses (cpc_status_exit_code, compiler/ir/status.c), the writable
 * file check (runtime/session/run.c) and the failure JSON
 * (runtime/io/report.c) stay in their layers, unexported.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cpc/tool.h"

#include "api_session.h"
#include "fileio.h"
#include "status.h"

/* ---- statuses and atomic files ------------------------------------------------ */

cpc_status *cpc_status_new(cpc_code code, const char *message)
{
    return cpc_error(code, "%s", message ? message : "");
}

struct cpc_atomic_file {
    cpc_outfile of;
};

cpc_status *cpc_atomic_file_open(const char *path, const char *verb, cpc_atomic_file **out)
{
    if (!out)
        return cpc_error(CPC_E_USAGE, "cpc_atomic_file_open: out must not be NULL");
    *out = NULL;
    if (!path)
        return cpc_error(CPC_E_USAGE, "cpc_atomic_file_open: path must not be NULL");
    cpc_atomic_file *f = calloc(1, sizeof *f);
    if (!f)
        return cpc_error(CPC_E_NOMEM, "out of memory");
    cpc_status *st = cpc_outfile_open(&f->of, path, verb ? verb : "cannot create");
    if (st) {
        free(f);
        return st;
    }
    *out = f;
    return NULL;
}

cpc_status *cpc_atomic_file_write(cpc_atomic_file *f, const void *data, size_t bytes)
{
    if (!f)
        return cpc_error(CPC_E_USAGE, "cpc_atomic_file_write: no file");
    if (bytes && !data)
        return cpc_error(CPC_E_USAGE, "cpc_atomic_file_write: data is NULL (%zu bytes)", bytes);
    if (bytes && fwrite(data, 1, bytes, f->of.f) != bytes)
        return cpc_error(CPC_E_IO, "%s: write failed: %s", f->of.path, strerror(errno));
    return NULL;
}

cpc_status *cpc_atomic_file_commit(cpc_atomic_file *f)
{
    if (!f)
        return cpc_error(CPC_E_USAGE, "cpc_atomic_file_commit: no file");
    cpc_status *st = cpc_outfile_commit(&f->of);
    free(f);
    return st;
}

void cpc_atomic_file_discard(cpc_atomic_file *f)
{
    if (!f)
        return;
    cpc_outfile_discard(&f->of);
    free(f);
}

cpc_status *cpc_write_file_atomic(const char *path, const void *data, size_t bytes)
{
    if (!path || (!data && bytes))
        return cpc_error(CPC_E_USAGE, "cpc_write_file_atomic: path and data must not be NULL");
    return cpc_write_file(path, "cannot write", data, bytes);
}

cpc_status *cpc_job_check_outputs(const cpc_job_options *o, const char *plan_path)
{
    if (!o)
        return cpc_error(CPC_E_USAGE, "cpc_job_check_outputs: options must not be NULL");
    cpc_run_options r;
    cpc_status *st = cpc_api_job_run_options(o, &r, "cpc_job_check_outputs");
    return st ? st : cpc_run_check_outputs(&r, plan_path);
}
