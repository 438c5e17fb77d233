/*
 * event.h - one executed op of a rank's run, as the executor records it
 * (runtime/executor.h, cpc_exec_config.record_events) and the trace writer
 * reads it (runtime/io/trace.h).  Plain data in the ir layer, so that io
 * needs nothing of the runtime (docs/ARCHITECTURE.md "Layers").
 *
 * Times are CLOCK_MONOTONIC microseconds of the recording process; bytes are
 * the payload this rank sent in the op.  No functions; thread-safety: data.
 */
#ifndef CPC_EVENT_H
#define CPC_EVENT_H

#include <stdint.h>

typedef enum cpc_exec_event_cat { CPC_EV_COMPUTE = 0, CPC_EV_COMM } cpc_exec_event_cat;

/* One executed op (leaf ops only; loops are expanded). */
typedef struct cpc_exec_event {
    char name[48];             /* "attn q,k,v" ... */
    cpc_exec_event_cat cat;
    int step;                  /* s of the innermost loop, -1 outside loops */
    double t0_us, t1_us;       /* CLOCK_MONOTONIC, microseconds */
    int64_t bytes;             /* bytes this rank sent in the op */
} cpc_exec_event;

#endif
