/*
 * api_session.h - what the tooling layer (tool/tool.c, include/cpc/tool.h)
 * needs of api_session.c: the public job options as the session's.
 * Internal: hidden in libcpc.so (no CPC_API), linked statically by cpc_tool.
 */
#ifndef CPC_API_SESSION_H
#define CPC_API_SESSION_H

#include "cpc/session.h"

#include "run.h"
#include "status.h"

/* The session's options *r for the caller's public ones (NULL: defaults;
 * read by the size rule, api_options.h).  `fn` names the caller in errors.
 * Errors: CPC_E_USAGE (a bad size, an unknown enum value). */
cpc_status *cpc_api_job_run_options(const cpc_job_options *caller, cpc_run_options *r, const char *fn);

#endif
