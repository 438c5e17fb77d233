/*
 * lua_script.h - embedded Lua 5.4 schedule scripts (SPEC section 6).
 *
 * Pipeline position (ARCHITECTURE.md): between `select` (a script's
 * `choose(candidates)` may pick the candidate) and `verify` (a script's
 * `schedule(plan)` may edit the op program, which is then verified exactly as
 * a compiler-built one: CP051).
 *
 * A script is Lua text that defines optional global functions:
 *
 *   function schedule(plan)   -- plan.config  : the resolved plan, read-only
 *                             -- plan.ops     : the op program (plain tables)
 *                             -- plan.buffers : its buffers (plain tables)
 *                             -- plan.overlap, plan.rotate : program flags
 *     ...                     -- edit plan.ops in place, or return a new array
 *   end
 *   function choose(candidates, config) -- the valid candidates; return one
 *     return candidates[1]
 *   end
 *
 * THE LUA VIEW OF THE PROGRAM (what schedule() sees and what is read back)
 *
 *   plan.config   nested read-only proxy of the resolved plan: name, file,
 *                 version, model{heads, kv_heads, head_dim, dtype, layers,
 *                 scale}, input{batch, tokens (S), segments[i]{name, tokens, split},
 *                 mask, kv{tokens} or nil, mode}, cluster{world_size,
 *                 gpus_per_node, nodes, device, profile, memory_gb,
 *                 reserved_gb}, parallel{variant, ring_degree,
 *                 ulysses_degree, fallback} (the selected candidate's values),
 *                 schedule{overlap, rotate, script}.  Any write, including
 *                 rawset, raises "plan.config is read-only: model.heads";
 *                 pairs/ipairs/# work.
 *   plan.buffers  array of {name, role, tokens, heads, io} (strings as in
 *                 program.h's name tables: "k", "block", "part", "input").
 *                 A script may append buffers; names must stay unique and
 *                 shorter than CPC_BUF_NAME_MAX.
 *   plan.ops      array of op tables:
 *                   kind   string, cpc_op_kind_name ("attn", "loop", ...)
 *                   group  "ring" | "ulysses" | "world" (communication ops;
 *                          required for send, recv, all_to_all, all_gather,
 *                          barrier), nil otherwise
 *                   in, out arrays of buffer names (<= CPC_OP_MAX_BUFS each)
 *                   peer, block, when, count  expression strings (expr.h
 *                          grammar, variables r u p s R U P); an integer is
 *                          accepted and converted to its text
 *                   dir    "seq_to_heads" | "heads_to_seq" (all_to_all)
 *                   tag    integer >= 0 (send, recv, wait)
 *                   body   array of op tables (loop only; count required)
 *                   step   always nil: ops in a loop body run at every step,
 *                          the step is the variable `s` of their expressions
 *                   line   the script line that built the op (cpc.op and
 *                          cpc.insert_barrier set it), else nil; an integer
 *                          > 0, used for the op's span and diagnostics
 *                 Fields whose name starts with '_' are the script's own
 *                 scratch space and are ignored.  Any other field is an
 *                 error.
 *                 The op tables cpc hands over are proxies (an empty table
 *                 whose protected metatable, "op", holds the fields): every
 *                 assignment to one of their fields records the script line
 *                 that made it (lua_getinfo on the nearest frame of the
 *                 script), which becomes the op's span when it is read back
 *                 changed.  pairs(op) iterates the fields; next(op) and
 *                 rawget(op, k) see an empty table (a rawset field is kept).
 *                 Tables the script builds itself are read as they are.
 *
 * Reading back validates every field: unknown kind or field, wrong type,
 * a buffer name not in plan.buffers, more than CPC_OP_MAX_BUFS buffers,
 * expression syntax, missing required fields (group of a communication op,
 * peer of send/recv, tag of send/recv/wait, dir of all_to_all, count and body
 * of a loop; body or count on another kind), loops nested deeper than 8,
 * more than CPC_LUA_MAX_OPS ops or CPC_LUA_MAX_BUFFERS buffers.  Then every
 * `when`, `peer`, `block` and loop `count` is evaluated on every rank (all
 * ranks up to 256, else the corners and middles of the mesh) and every step
 * (all up to 256, else the first, middle and last ones) where the op runs,
 * up to 2e6 evaluations: a peer outside its group (0..W-1), a block outside
 * 0..R-1, a count outside 0..CPC_LOOP_MAX or an evaluation error (division
 * by zero) is an error naming the rank, its coordinates and the step.
 * Each error is CP050 with the span `script.lua:line` (the line of the op's
 * last field assignment, else its `line`, else the line where `schedule` is
 * defined) and a message naming the op's path, 1-based as in Lua
 * ("ops[3].body[2].peer: ...").  Up to 20 errors are reported.  A valid
 * result is then given to cpc_verify() (verify.h), whose paths are 1-based
 * too; its CP051 diagnostics pass through with notes added: one at each op
 * the script changed or added (up to 3, "ops[2].body[1] send was changed or
 * added by schedule() here", at that op's line) and one at the line of the
 * script's schedule().  A CP051 about an op the compiler built has no span
 * here; compile.c places it at the plan key that chose the schedule.
 * Ops the script left unchanged keep their original span; changed or new ops
 * get the script's span.  Op spans borrow the `path` pointer given to
 * cpc_lua_open (program.h: span.file is borrowed): keep that string alive as
 * long as the program (argv, or the plan's strings, do).
 *
 * THE PRELUDE (lua/prelude.lua, embedded) defines the global table `cpc`:
 *   cpc.mesh                    {R, U, P} of the program in schedule(); nil in choose()
 *   cpc.find(ops, kind [, step [, rank]])  matches as {op, list, index, loop}
 *   cpc.walk(ops, fn)           fn(op, list, index, loop) in program order
 *   cpc.swap(ops, i, j)         only when no dependency (else an error)
 *   cpc.move(ops, from, to)     by legal adjacent swaps
 *   cpc.insert_barrier(ops, i [, group])
 *   cpc.op(t)                   records the calling line as t.line
 *   cpc.copy(op), cpc.remove(ops, pred), cpc.buffer(buffers, name),
 *   cpc.access(op [, list]), cpc.depends(a, b [, list]), cpc.eval(expr, coords)
 * See lua/prelude.lua for each one's contract; lua/examples/ for scripts.
 *
 * SANDBOX.  Each script runs in its own lua_State:
 *   - libraries: base, table, string, math, utf8 only.  No io, os, package /
 *     require, debug, coroutine.  Removed from base: dofile, loadfile.  `load`
 *     only accepts text chunks (mode forced to "t"); string.dump is removed.
 *     `print` writes to the `print` stream of the limits (discarded when
 *     NULL), at most 64 KiB per script.  collectgarbage is kept (harmless).
 *   - a memory cap enforced by a custom lua_Alloc (default 64 MiB);
 *   - an instruction budget and a wall-clock deadline checked by a count hook
 *     every CPC_LUA_HOOK_EVERY VM instructions (defaults 200 million and
 *     1.0 s, per call); the deadline is also checked by the allocator (every
 *     allocation of 64 KiB or more, every 256th otherwise: C functions that
 *     build big strings between two hook calls) and around and inside load()
 *     (the parser runs no VM instruction; past the deadline the allocator
 *     refuses it everything), so a call ends within about one C function's
 *     work of its deadline;
 *   - C library functions that could loop for long without running a VM
 *     instruction are guarded: string.rep (empty results), pattern functions
 *     (string.find/match/gmatch/gsub refuse a subject/pattern pair whose
 *     worst-case backtracking cost exceeds a bound), table.insert/remove/move
 *     (reimplemented in Lua so the hook sees them), rawset on read-only tables,
 *     setmetatable with a __gc field (finalizers run with hooks disabled, so
 *     they are refused);
 *   - after a breach (memory, instructions, time) the script's own pcall /
 *     xpcall cannot catch the error: it is re-raised, and the script object is
 *     poisoned (later calls return CP050 at once).
 *   - every call into Lua runs under lua_pcall with a traceback handler; each
 *     traceback frame becomes a note (with its script line when it has one).  Nothing a script does can abort cpc or leak:
 *     all Lua work, including reading results back, is protected, and C
 *     memory is owned outside the protected region.
 * A breach is CP050 naming `script.lua:line` (the last script line the hook
 * saw for memory breaches).
 *
 * ERRORS (all class CPC_E_PLAN, rule 50 = CP050, span = the script file and
 * line, the Lua traceback as a note), except: CPC_E_IO when the file cannot be
 * read (cpc_lua_open_file), CPC_E_NOMEM when the host is out of memory, and
 * whatever cpc_verify returns (CP051).
 *
 * THREAD-SAFETY: a cpc_lua_script must be used by one thread at a time;
 * different scripts are independent.
 */
#ifndef CPC_LUA_SCRIPT_H
#define CPC_LUA_SCRIPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "plan.h"
#include "program.h"
#include "status.h"
#include "validate.h"

/* The rule number of script failures (SPEC section 2: CP050). */
#define CPC_RULE_LUA 50
/* Largest program a script may return: ops (loop bodies included) and
 * buffers.  The compiler's programs have about 20 ops. */
#define CPC_LUA_MAX_OPS 4096
#define CPC_LUA_MAX_BUFFERS 256
/* VM instructions between two checks of the budget and the deadline. */
#define CPC_LUA_HOOK_EVERY 1000

typedef struct cpc_lua_limits {
    size_t memory_bytes;     /* memory cap of the Lua state, bytes (0: default 64 MiB) */
    int64_t instructions;    /* VM instructions per call (0: default 200e6) */
    double seconds;          /* wall-clock per call (0: default 1.0 s) */
    FILE *print;             /* where print() writes; NULL: discarded */
} cpc_lua_limits;

/* Defaults of cpc_lua_limits (used for zero fields). */
#define CPC_LUA_DEFAULT_MEMORY ((size_t)64 << 20)
#define CPC_LUA_DEFAULT_INSTRUCTIONS ((int64_t)200000000)
#define CPC_LUA_DEFAULT_SECONDS 1.0

typedef struct cpc_lua_script cpc_lua_script;  /* opaque */

/* Creates the sandboxed state, loads the embedded prelude (lua/prelude.lua,
 * global table `cpc`) and runs the script's main chunk once (which defines
 * its functions).  `path` names the script in diagnostics ("tweak.lua");
 * `text` (`len` bytes; need not be NUL-terminated) is its source.  `limits`
 * may be NULL (defaults).  On success *out is owned by the caller
 * (cpc_lua_close).  Errors: CP050 (syntax error, binary chunk, runtime error
 * or breach in the main chunk), CPC_E_NOMEM. */
cpc_status *cpc_lua_open(const char *path, const char *text, size_t len,
                         const cpc_lua_limits *limits, cpc_lua_script **out);

/* Reads the file at `path` and calls cpc_lua_open.  Errors: CPC_E_IO when it
 * cannot be read (or is larger than 16 MiB), then as cpc_lua_open. */
cpc_status *cpc_lua_open_file(const char *path, const cpc_lua_limits *limits,
                              cpc_lua_script **out);

/* Frees the state and the script.  NULL is ignored. */
void cpc_lua_close(cpc_lua_script *s);

/* Whether the script defines a global `schedule` / `choose` (a global that
 * is not a function makes the matching call fail with CP050). */
bool cpc_lua_has_schedule(cpc_lua_script *s);
bool cpc_lua_has_choose(cpc_lua_script *s);

/* Runs `schedule(plan)` on `prog`, built for `plan`'s selected candidate
 * (prog->layout says which).  If the script defines no `schedule`, returns
 * NULL and leaves `prog` alone.  Otherwise the result (plan.ops edited in
 * place, or the array schedule() returns) is read back, validated, and
 * verified with cpc_verify; only when everything passes are prog->buffers,
 * prog->ops, prog->overlap and prog->rotate replaced (prog->layout is never
 * changed).  On any error `prog` is untouched.  Returns NULL or a chain of
 * warnings on success; CP050 or the verifier's CP051 chain on failure. */
cpc_status *cpc_lua_schedule(cpc_lua_script *s, const cpc_plan *plan, cpc_program *prog);

/* Runs `choose(candidates, config)` where `candidates` holds, as tables, the
 * entries of cands[0..n) with ok == true, in that order:
 *   {variant, ring_degree, ulysses_degree, predicted_ms (per layer),
 *    predicted_ms_per_forward, memory_bytes (per rank, peak),
 *    bytes_sent (per rank per layer), index (1-based position in this list)}
 * and `config` is plan.config as in schedule().  The function must return
 * one of these tables (matched by variant, ring_degree and ulysses_degree);
 * *chosen receives its index in cands (0-based, in the full array).  If the
 * script defines no `choose`, returns NULL and leaves *chosen unchanged.
 * When no candidate is valid, returns NULL without calling choose() and
 * leaves *chosen unchanged (validation reports why).
 * Errors: CP050 (the function failed or breached a limit, returned a
 * number, nil, or a table that is not a valid candidate). */
cpc_status *cpc_lua_choose(cpc_lua_script *s, const cpc_plan *plan,
                           const cpc_candidate *cands, int n, int *chosen);

/* The embedded prelude's source text (NUL-terminated), for --help and tests. */
const char *cpc_lua_prelude_source(void);

#endif
