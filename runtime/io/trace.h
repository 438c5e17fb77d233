/*
 * trace.h - Chrome trace-event JSON of a cprun run (SPEC section 5 --trace):
 * open it in chrome://tracing or ui.perfetto.dev.
 *
 * Format (the Trace Event Format, "JSON Object Format"): {"traceEvents":
 * [...], "displayTimeUnit": "ms"}; one process (pid 0) named after the plan,
 * one thread (tid = rank) per rank named "rank N"; every executed op is a
 * complete event (ph "X") with ts/dur in microseconds relative to the
 * earliest event, cat "compute" or "comm", and args {iteration, step, bytes}.
 *
 * Thread-safety: pure function of its inputs.
 */
#ifndef CPC_TRACE_H
#define CPC_TRACE_H

#include "event.h"
#include "status.h"

/* The events of one rank (several iterations may be concatenated; `iter`
 * gives each event's iteration, or is NULL). */
typedef struct cpc_trace_rank {
    int rank;
    const cpc_exec_event *events;
    const int *iter;
    int n_events;
} cpc_trace_rank;

/* Writes the trace file.  Errors: CPC_E_IO naming the path, CPC_E_NOMEM. */
cpc_status *cpc_trace_write(const char *path, const char *name, const cpc_trace_rank *ranks,
                            int n_ranks);

#endif
