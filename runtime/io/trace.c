/* trace.c - see trace.h */
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fileio.h"

static cJSON *meta(const char *what, int tid, const char *name)
{
    cJSON *e = cJSON_CreateObject();
    if (!e)
        return NULL;
    cJSON_AddStringToObject(e, "name", what);
    cJSON_AddStringToObject(e, "ph", "M");
    cJSON_AddNumberToObject(e, "pid", 0);
    cJSON_AddNumberToObject(e, "tid", tid);
    cJSON *a = cJSON_AddObjectToObject(e, "args");
    if (a)
        cJSON_AddStringToObject(a, "name", name);
    return e;
}

cpc_status *cpc_trace_write(const char *path, const char *name, const cpc_trace_rank *ranks,
                            int n_ranks)
{
    double base = 0;
    bool any = false;
    for (int i = 0; i < n_ranks; i++)
        for (int j = 0; j < ranks[i].n_events; j++)
            if (!any || ranks[i].events[j].t0_us < base) {
                base = ranks[i].events[j].t0_us;
                any = true;
            }
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "traceEvents") : NULL;
    if (!arr) {
        cJSON_Delete(root);
        return cpc_error(CPC_E_NOMEM, "trace: out of memory");
    }
    cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
    cJSON_AddItemToArray(arr, meta("process_name", 0, name ? name : "cprun"));
    for (int i = 0; i < n_ranks; i++) {
        char tn[32];
        snprintf(tn, sizeof tn, "rank %d", ranks[i].rank);
        cJSON_AddItemToArray(arr, meta("thread_name", ranks[i].rank, tn));
        for (int j = 0; j < ranks[i].n_events; j++) {
            const cpc_exec_event *ev = &ranks[i].events[j];
            cJSON *e = cJSON_CreateObject();
            if (!e)
                break;
            cJSON_AddStringToObject(e, "name", ev->name);
            cJSON_AddStringToObject(e, "cat", ev->cat == CPC_EV_COMM ? "comm" : "compute");
            cJSON_AddStringToObject(e, "ph", "X");
            cJSON_AddNumberToObject(e, "ts", ev->t0_us - base);
            cJSON_AddNumberToObject(e, "dur", ev->t1_us - ev->t0_us);
            cJSON_AddNumberToObject(e, "pid", 0);
            cJSON_AddNumberToObject(e, "tid", ranks[i].rank);
            cJSON *a = cJSON_AddObjectToObject(e, "args");
            if (a) {
                if (ranks[i].iter)
                    cJSON_AddNumberToObject(a, "iteration", ranks[i].iter[j]);
                if (ev->step >= 0)
                    cJSON_AddNumberToObject(a, "step", ev->step);
                if (ev->bytes)
                    cJSON_AddNumberToObject(a, "bytes", (double)ev->bytes);
            }
            cJSON_AddItemToArray(arr, e);
        }
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s)
        return cpc_error(CPC_E_NOMEM, "trace: out of memory");
    /* fileio.h: temporary file + fsync + rename, never half a trace */
    cpc_outfile o;
    cpc_status *st = cpc_outfile_open(&o, path, "cannot write the trace");
    if (st) {
        free(s);
        return st;
    }
    size_t n = strlen(s);
    errno = 0;
    bool ok = fwrite(s, 1, n, o.f) == n && fputc('\n', o.f) != EOF;
    int e = errno;
    free(s);
    if (!ok) {
        cpc_outfile_discard(&o);
        return cpc_error(CPC_E_IO, "%s: cannot write the trace: %s", path, strerror(e ? e : EIO));
    }
    return cpc_outfile_commit(&o);
}
