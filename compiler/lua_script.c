/* lua_script.c - embedded Lua 5.4 schedule scripts; see lua_script.h.
 *
 * Layout of this file:
 *   1. the script object, the capped allocator, the count hook
 *   2. the sandbox: libraries, guarded functions, internal Lua helpers
 *   3. protected calls and the conversion of Lua errors into CP050
 *   4. plan.config: the read-only proxy of the resolved plan
 *   5. program -> Lua tables
 *   6. Lua tables -> program, with validation of every field
 *   7. range checks of peer / block / count on the mesh
 *   8. the public entry points (open, schedule, choose, close)
 *
 * Invariant: every call into Lua that can raise an error (allocation
 * included) runs inside lua_pcall.  C memory built while Lua runs is owned by
 * a context struct outside the protected region, so a Lua error (longjmp)
 * never leaks it.
 */
#include "lua_script.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "verify.h"
#include "fileio.h"
#include "cpc_lua_prelude.h" /* generated from lua/prelude.lua (CMakeLists.txt) */

#define MAX_SCRIPT_BYTES ((size_t)16 << 20)
#define MAX_PRINT_BYTES ((size_t)64 << 10)
#define MEM_SLACK ((size_t)1 << 20)   /* headroom for error handling after a breach */
#define MAX_ERRORS 20                 /* validation errors reported per call */
#define MAX_TRACE_NOTES 12
#define PATTERN_COST_LIMIT 5e8        /* worst-case matcher steps allowed */
#define RANGE_ALL_RANKS 256           /* check every rank up to this world size */
#define RANGE_ALL_STEPS 256           /* check every step up to this loop count */
#define RANGE_MAX_EVALS 2000000       /* expression evaluations for range checks */
#define MAX_LOOP_DEPTH 8

/* =========================================================================
 * 1. The script object, the allocator, the hook
 * ========================================================================= */

typedef enum breach_kind { BREACH_NONE = 0, BREACH_MEMORY, BREACH_INSTRUCTIONS, BREACH_TIME } breach_kind;

struct cpc_lua_script {
    lua_State *L;
    char *path;             /* copy of the path given (diagnostics) */
    const char *span_file;  /* the caller's path pointer (op spans borrow it) */
    char *chunkname;        /* "@" path */
    char short_src[LUA_IDSIZE]; /* how Lua names the script in messages */
    cpc_lua_limits lim;
    /* accounting */
    size_t used;
    breach_kind breach;
    bool host_oom;
    int64_t instr;
    double deadline;
    int last_line;          /* last line of the script the hook saw */
    bool poisoned;          /* a breach happened: the state is not trusted */
    size_t printed;
    const char *what;       /* "schedule()", "choose()", "the main chunk" */
    int load_status;        /* status of loading the main chunk (syntax errors) */
    unsigned alloc_ticks;   /* allocations since the last clock check */
    bool in_load;           /* inside load(): the parser runs no VM instruction */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void count_hook(lua_State *L, lua_Debug *ar);

static cpc_lua_script *script_of(lua_State *L)
{
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* Records the script line running when an allocation is refused (memory
 * errors carry no position).  lua_getstack/lua_getinfo("Sl") only read the
 * call chain and the functions' line tables: they do not allocate and are
 * safe here (as when Lua itself builds a runtime error message). */
static void note_refusal_line(cpc_lua_script *s)
{
    if (!s->L || !s->chunkname)
        return;
    lua_Debug ar;
    for (int level = 0; level < 64 && lua_getstack(s->L, level, &ar); level++) {
        if (lua_getinfo(s->L, "Sl", &ar) && ar.currentline > 0 && ar.source &&
            strcmp(ar.source, s->chunkname) == 0) {
            s->last_line = ar.currentline;
            return;
        }
    }
}

/* lua_Alloc with a byte cap.  A refusal is not yet a breach: Lua then runs
 * an emergency collection and tries again; only a memory error that reaches
 * a pcall (ours or the script's) is one (see note_memory_error).  After a
 * breach a small headroom is allowed so that error handling (traceback,
 * reading results) can still allocate; the hook and the pcall wrappers make
 * sure the script itself cannot continue. */
static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    cpc_lua_script *s = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        s->used -= old;
        return NULL;
    }
    if (nsize > old) {
        size_t limit = s->lim.memory_bytes + (s->breach != BREACH_NONE ? MEM_SLACK : 0);
        size_t grow = nsize - old;
        /* The deadline, also where no VM instruction runs for long: C
         * functions that build big strings (s:upper() of 60 MB a few hundred
         * times between two hook calls) and load() parsing a huge chunk (150
         * loads of 18 MB took 52-110 s against a 1 s limit).  Checked on every
         * allocation of 64 KiB or more and every 256th one. */
        if (s->deadline > 0 && s->breach == BREACH_NONE && (grow >= ((size_t)64 << 10) || ++s->alloc_ticks >= 256)) {
            s->alloc_ticks = 0;
            if (now_s() > s->deadline) {
                s->breach = BREACH_TIME;
                note_refusal_line(s);
                /* the next VM instruction raises (lua_sethook may be called
                 * at any time, even from a signal handler) */
                if (s->L)
                    lua_sethook(s->L, count_hook, LUA_MASKCOUNT, 1);
            }
        }
        if (s->breach == BREACH_TIME && s->in_load)
            return NULL; /* stop the parser now; sb_load raises the breach */
        if (s->used + grow > limit || s->used + grow < s->used) {
            note_refusal_line(s);
            return NULL;
        }
    }
    void *p = realloc(ptr, nsize);
    if (!p) {
        s->host_oom = true;
        return NULL;
    }
    s->used = s->used - old + nsize;
    return p;
}

/* A memory error (LUA_ERRMEM) reached a pcall: unless the host itself ran
 * out of memory, the script hit its cap. */
static void note_memory_error(cpc_lua_script *s)
{
    if (!s->host_oom && s->breach == BREACH_NONE)
        s->breach = BREACH_MEMORY;
}

static void raise_breach(lua_State *L, cpc_lua_script *s, const char *src, int line)
{
    const char *what;
    char buf[96];
    switch (s->breach) {
    case BREACH_TIME:
        snprintf(buf, sizeof buf, "time limit of %.2f s exceeded", s->lim.seconds);
        what = buf;
        break;
    case BREACH_MEMORY:
        snprintf(buf, sizeof buf, "memory cap of %zu bytes exceeded", s->lim.memory_bytes);
        what = buf;
        break;
    default:
        snprintf(buf, sizeof buf, "instruction budget of %" PRId64 " exceeded", s->lim.instructions);
        what = buf;
        break;
    }
    if (src && line > 0)
        lua_pushfstring(L, "%s:%d: %s", src, line, what);
    else
        lua_pushstring(L, what);
    lua_error(L);
}

/* Count hook: every CPC_LUA_HOOK_EVERY instructions.  Records the script line
 * (for memory breaches, which carry no position) and enforces the budget and
 * the deadline; after any breach it raises again at once, so nothing the
 * script does can keep running. */
static void count_hook(lua_State *L, lua_Debug *ar)
{
    cpc_lua_script *s = script_of(L);
    s->instr += CPC_LUA_HOOK_EVERY;
    const char *src = NULL;
    int line = 0;
    if (lua_getinfo(L, "Sl", ar)) {
        src = ar->short_src;
        line = ar->currentline;
        if (line > 0 && ar->source && strcmp(ar->source, s->chunkname) == 0)
            s->last_line = line;
    }
    if (s->breach == BREACH_NONE) {
        if (s->instr > s->lim.instructions)
            s->breach = BREACH_INSTRUCTIONS;
        else if (now_s() > s->deadline)
            s->breach = BREACH_TIME;
    }
    if (s->breach != BREACH_NONE)
        raise_breach(L, s, src, line);
}

/* =========================================================================
 * 2. The sandbox
 * ========================================================================= */

/* Re-raises the error on top of the stack when a breach happened: a script's
 * own pcall must not swallow a breach. */
static void rethrow_if_breached(lua_State *L)
{
    cpc_lua_script *s = script_of(L);
    if (s->breach != BREACH_NONE)
        lua_error(L);
}

static int sb_pcall(lua_State *L)
{
    luaL_checkany(L, 1);
    int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    if (st == LUA_ERRMEM)
        note_memory_error(script_of(L));
    if (st != LUA_OK)
        rethrow_if_breached(L);
    lua_pushboolean(L, st == LUA_OK);
    lua_insert(L, 1);
    return lua_gettop(L);
}

static int sb_xpcall(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 1);  /* f */
    lua_copy(L, 2, 1);    /* msgh at 1 */
    lua_replace(L, 2);    /* f at 2 */
    int st = lua_pcall(L, n - 2, LUA_MULTRET, 1);
    if (st == LUA_ERRMEM)
        note_memory_error(script_of(L));
    if (st != LUA_OK)
        rethrow_if_breached(L);
    lua_pushboolean(L, st == LUA_OK);
    lua_replace(L, 1);
    return lua_gettop(L);
}

/* load(chunk [, chunkname [, mode [, env]]]): text chunks only. */
static int sb_load(lua_State *L)
{
    int n = lua_gettop(L);
    if (n >= 3 && !lua_isnil(L, 3)) {
        const char *mode = luaL_checkstring(L, 3);
        if (!strchr(mode, 't')) {
            luaL_pushfail(L);
            lua_pushfstring(L, "attempt to load a binary chunk (mode is '%s'; cpc scripts load text only)",
                            mode);
            return 2;
        }
    }
    if (n < 3)
        lua_settop(L, 3);
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    /* the parser runs no VM instruction, so the count hook cannot see it: the
     * deadline is checked before, by the allocator while it parses (which
     * then refuses everything), and after */
    cpc_lua_script *s = script_of(L);
    if (s->breach == BREACH_NONE && s->deadline > 0 && now_s() > s->deadline)
        s->breach = BREACH_TIME;
    if (s->breach != BREACH_NONE)
        raise_breach(L, s, s->short_src, s->last_line);
    s->in_load = true;
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    s->in_load = false;
    if (s->breach == BREACH_NONE && s->deadline > 0 && now_s() > s->deadline)
        s->breach = BREACH_TIME;
    if (s->breach != BREACH_NONE)
        raise_breach(L, s, s->short_src, s->last_line);
    return lua_gettop(L);
}

static int sb_print(lua_State *L)
{
    cpc_lua_script *s = script_of(L);
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1)
            luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_addchar(&b, '\n');
    luaL_pushresult(&b);
    size_t len;
    const char *text = lua_tolstring(L, -1, &len);
    if (s->lim.print && s->printed < MAX_PRINT_BYTES) {
        size_t room = MAX_PRINT_BYTES - s->printed;
        fwrite(text, 1, len < room ? len : room, s->lim.print);
        if (len >= room)
            fputs("\n[print output truncated]\n", s->lim.print);
    }
    s->printed += len;
    return 0;
}

/* setmetatable refusing __gc: finalizers run with hooks disabled, so a
 * finalizer could loop forever out of the budget's reach. */
static int sb_setmetatable(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "setmetatable: __gc metamethods are not allowed in cpc scripts");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

#define RO_MARK "__cpc_readonly"

static void push_key_path(lua_State *L, const char *base, int key);

/* rawset refusing the read-only proxies (plan.config). */
static int sb_rawset(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    if (lua_getmetatable(L, 1)) {
        lua_pushliteral(L, RO_MARK);
        if (lua_rawget(L, -2) == LUA_TSTRING) {
            const char *base = lua_tostring(L, -1);
            push_key_path(L, base, 2);
            return luaL_error(L, "plan.config is read-only: %s", lua_tostring(L, -1));
        }
        lua_pop(L, 2);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* string.rep: an empty result with a huge count loops in C without running a
 * VM instruction; answer it here. */
static int sb_rep(lua_State *L)
{
    size_t l, lsep;
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &lsep);
    if (n <= 0 || (l == 0 && (lsep == 0 || n == 1))) {
        lua_pushliteral(L, "");
        return 1;
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* Worst-case cost of Lua's backtracking matcher for a subject of n bytes:
 * (n+1)^(k+1) * (m+1) * 2^q, where k counts the variable-length items
 * (x*, x+, x-, %b), q the optional items (x?) and m the pattern length
 * (plain search: (n+1) * (m+1)).  The matcher runs in C without VM
 * instructions, so the count hook cannot stop it: a pattern whose bound
 * exceeds PATTERN_COST_LIMIT is refused instead. */
static double pattern_cost(const char *p, size_t m, size_t n, bool plain)
{
    double N = (double)n + 1.0;
    if (plain)
        return N * ((double)m + 1.0);
    int k = 0, q = 0;
    size_t i = 0;
    bool anchored = m > 0 && p[0] == '^';
    if (anchored)
        i = 1;
    while (i < m) {
        char c = p[i];
        size_t item_end;
        if (c == '(' || c == ')') {
            i++;
            continue;
        }
        if (c == '%') {
            if (i + 1 < m && p[i + 1] == 'b') {
                k++;
                i += 4;
                continue;
            }
            if (i + 1 < m && p[i + 1] == 'f') {
                i += 2;
                if (i < m && p[i] == '[') {
                    i++;
                    if (i < m && p[i] == '^')
                        i++;
                    if (i < m)
                        i++; /* a ']' first is literal */
                    while (i < m && p[i] != ']') {
                        if (p[i] == '%')
                            i++;
                        i++;
                    }
                    i++;
                }
                continue;
            }
            item_end = i + 2;
        } else if (c == '[') {
            size_t j = i + 1;
            if (j < m && p[j] == '^')
                j++;
            if (j < m)
                j++;
            while (j < m && p[j] != ']') {
                if (p[j] == '%')
                    j++;
                j++;
            }
            item_end = j + 1;
        } else {
            item_end = i + 1;
        }
        if (item_end < m) {
            char r = p[item_end];
            if (r == '*' || r == '+' || r == '-') {
                k++;
                item_end++;
            } else if (r == '?') {
                q++;
                item_end++;
            }
        }
        i = item_end;
    }
    double cost = (double)m + 1.0;
    for (int j = 0; j < k + (anchored ? 0 : 1); j++)
        cost *= N;
    for (int j = 0; j < q && j < 64; j++)
        cost *= 2.0;
    return cost;
}

static bool has_specials(const char *p, size_t m)
{
    for (size_t i = 0; i < m; i++)
        if (strchr("^$*+?.([%-", p[i]))
            return true;
    return false;
}

/* Shared guard of string.find/match/gmatch/gsub: upvalue 1 is the original
 * function, upvalue 2 its name, upvalue 3 whether a 4th argument `plain`
 * applies (find). */
static int sb_pattern(lua_State *L)
{
    size_t n, m;
    luaL_checklstring(L, 1, &n);
    const char *p = luaL_checklstring(L, 2, &m);
    bool plain = !has_specials(p, m) || (lua_toboolean(L, lua_upvalueindex(3)) && lua_toboolean(L, 4));
    double cost = pattern_cost(p, m, n, plain);
    if (cost > PATTERN_COST_LIMIT) {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "string.%s: pattern too costly for the cpc sandbox (subject of %zu bytes, pattern of "
                 "%zu bytes: up to %.3g matcher steps, limit %.3g); split the subject or simplify the "
                 "pattern",
                 lua_tostring(L, lua_upvalueindex(2)), n, m, cost, PATTERN_COST_LIMIT);
        return luaL_error(L, "%s", msg);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* Replaces t[name] (t at index idx) with a C closure over the original. */
static void wrap_field(lua_State *L, int idx, const char *name, lua_CFunction fn)
{
    idx = lua_absindex(L, idx);
    lua_getfield(L, idx, name);
    lua_pushcclosure(L, fn, 1);
    lua_setfield(L, idx, name);
}

static void wrap_pattern(lua_State *L, int idx, const char *name, bool has_plain)
{
    idx = lua_absindex(L, idx);
    lua_getfield(L, idx, name);
    lua_pushstring(L, name);
    lua_pushboolean(L, has_plain);
    lua_pushcclosure(L, sb_pattern, 3);
    lua_setfield(L, idx, name);
}

/* table.insert / remove / move in Lua, so that the count hook sees their
 * loops (the C versions loop without VM instructions, and with a __len
 * metamethod their bounds are arbitrary).  Same semantics as Lua 5.4's. */
static const char sandbox_lua[] =
    "local table, math, error, type, select, rawequal = table, math, error, type, select, rawequal\n"
    "local function int(v, i, fname)\n"
    "  local n = math.tointeger(v)\n"
    "  if n == nil then\n"
    "    if type(v) == 'number' then error(('bad argument #%d to \\'%s\\' (number has no integer representation)'):format(i, fname), 3) end\n"
    "    error(('bad argument #%d to \\'%s\\' (number expected, got %s)'):format(i, fname, type(v)), 3)\n"
    "  end\n"
    "  return n\n"
    "end\n"
    "local function tab(t, fname)\n"
    "  if type(t) ~= 'table' then error(('bad argument #1 to \\'%s\\' (table expected, got %s)'):format(fname, type(t)), 3) end\n"
    "end\n"
    "table.insert = function(t, ...)\n"
    "  tab(t, 'insert')\n"
    "  local e = #t + 1\n"
    "  local n = select('#', ...)\n"
    "  if n == 1 then t[e] = ...; return end\n"
    "  if n ~= 2 then error(\"wrong number of arguments to 'insert'\", 2) end\n"
    "  local pos, v = ...\n"
    "  pos = int(pos, 2, 'insert')\n"
    "  if pos < 1 or pos > e then error(\"bad argument #2 to 'insert' (position out of bounds)\", 2) end\n"
    "  for i = e, pos + 1, -1 do t[i] = t[i - 1] end\n"
    "  t[pos] = v\n"
    "end\n"
    "table.remove = function(t, pos)\n"
    "  tab(t, 'remove')\n"
    "  local size = #t\n"
    "  if pos == nil then pos = size else pos = int(pos, 2, 'remove') end\n"
    "  if pos ~= size and (pos < 1 or pos > size + 1) then\n"
    "    error(\"bad argument #2 to 'remove' (position out of bounds)\", 2)\n"
    "  end\n"
    "  local v = t[pos]\n"
    "  while pos < size do t[pos] = t[pos + 1]; pos = pos + 1 end\n"
    "  t[pos] = nil\n"
    "  return v\n"
    "end\n"
    "table.move = function(a1, f, e, t, a2)\n"
    "  tab(a1, 'move')\n"
    "  f, e, t = int(f, 2, 'move'), int(e, 3, 'move'), int(t, 4, 'move')\n"
    "  if a2 == nil then a2 = a1 elseif type(a2) ~= 'table' then\n"
    "    error(\"bad argument #5 to 'move' (table expected, got \" .. type(a2) .. ')', 2) end\n"
    "  if e >= f then\n"
    "    if not (f > 0 or e < math.maxinteger + f) then error(\"bad argument #3 to 'move' (too many elements to move)\", 2) end\n"
    "    if t > math.maxinteger - (e - f) then error(\"bad argument #4 to 'move' (destination wrap around)\", 2) end\n"
    "    if t > e or t <= f or not rawequal(a1, a2) then\n"
    "      for i = 0, e - f do a2[t + i] = a1[f + i] end\n"
    "    else\n"
    "      for i = e - f, 0, -1 do a2[t + i] = a1[f + i] end\n"
    "    end\n"
    "  end\n"
    "  return a2\n"
    "end\n";

/* Opens the allowed libraries and installs the guards (protected). */
static int setup_sandbox(lua_State *L)
{
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
    luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
    lua_settop(L, 0);

    lua_pushglobaltable(L);
    int g = lua_gettop(L);
    lua_pushnil(L);
    lua_setfield(L, g, "dofile");
    lua_pushnil(L);
    lua_setfield(L, g, "loadfile");
    wrap_field(L, g, "load", sb_load);
    wrap_field(L, g, "setmetatable", sb_setmetatable);
    wrap_field(L, g, "rawset", sb_rawset);
    lua_pushcfunction(L, sb_pcall);
    lua_setfield(L, g, "pcall");
    lua_pushcfunction(L, sb_xpcall);
    lua_setfield(L, g, "xpcall");
    lua_pushcfunction(L, sb_print);
    lua_setfield(L, g, "print");

    lua_getfield(L, g, "string");
    int st = lua_gettop(L);
    lua_pushnil(L);
    lua_setfield(L, st, "dump");
    wrap_field(L, st, "rep", sb_rep);
    wrap_pattern(L, st, "find", true);
    wrap_pattern(L, st, "match", false);
    wrap_pattern(L, st, "gmatch", false);
    wrap_pattern(L, st, "gsub", false);
    lua_settop(L, g);

    if (luaL_loadbufferx(L, sandbox_lua, sizeof sandbox_lua - 1, "=sandbox", "t") != LUA_OK)
        return lua_error(L);
    lua_call(L, 0, 0);
    lua_settop(L, 0);
    return 0;
}

/* The prelude's private helper: where() -> the current line of the innermost
 * active function of the script and the script's name as Lua prints it
 * (0, name if none), for cpc.op and the prelude's error messages. */
static int prelude_where(lua_State *L)
{
    cpc_lua_script *s = script_of(L);
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (lua_getinfo(L, "Sl", &ar) && ar.source && strcmp(ar.source, s->chunkname) == 0 &&
            ar.currentline > 0) {
            lua_pushinteger(L, ar.currentline);
            lua_pushstring(L, s->short_src);
            return 2;
        }
    }
    lua_pushinteger(L, 0);
    lua_pushstring(L, s->short_src);
    return 2;
}

/* Loads and runs the prelude with its private helpers (protected). */
static int run_prelude(lua_State *L)
{
    if (luaL_loadbufferx(L, (const char *)cpc_lua_prelude_text, sizeof cpc_lua_prelude_text - 1,
                         "=prelude.lua", "t") != LUA_OK)
        return lua_error(L);
    lua_newtable(L);
    lua_pushcfunction(L, prelude_where);
    lua_setfield(L, -2, "where");
    lua_call(L, 1, 0);
    return 0;
}

const char *cpc_lua_prelude_source(void)
{
    return (const char *)cpc_lua_prelude_text;
}

/* =========================================================================
 * 3. Protected calls and Lua errors -> CP050
 * ========================================================================= */

/* Message handler: the message plus a traceback. */
static int msg_handler(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* If `text` starts with "<short_src>:<digits>:", returns the line and sets
 * *rest past ": "; else 0. */
static int parse_pos(const cpc_lua_script *s, const char *text, const char **rest)
{
    size_t l = strlen(s->short_src);
    if (strncmp(text, s->short_src, l) != 0 || text[l] != ':')
        return 0;
    const char *p = text + l + 1;
    char *end;
    long line = strtol(p, &end, 10);
    if (end == p || *end != ':' || line <= 0 || line > INT32_MAX)
        return 0;
    end++;
    if (*end == ' ')
        end++;
    if (rest)
        *rest = end;
    return (int)line;
}

/* Builds a CP050 status from a Lua error text "msg\nstack traceback:\n..."
 * `fallback_line` is used when neither the message nor the traceback gives
 * a line of the script. */
static cpc_status *lua_failure(cpc_lua_script *s, int lstatus, const char *text, int fallback_line)
{
    if (lstatus == LUA_ERRMEM && s->breach == BREACH_NONE)
        return cpc_error(CPC_E_NOMEM, "out of host memory while running Lua script %s", s->path);
    if (!text)
        text = "(no error message)";
    const char *tb = strstr(text, "\nstack traceback:");
    size_t msg_len = tb ? (size_t)(tb - text) : strlen(text);
    char *msg = strndup(text, msg_len);
    if (!msg)
        return &cpc_status_oom;
    const char *body = msg;
    int line = parse_pos(s, msg, &body);
    char capmsg[96];
    if (s->breach == BREACH_MEMORY && !strstr(body, "memory cap")) {
        snprintf(capmsg, sizeof capmsg, "memory cap of %zu bytes exceeded", s->lim.memory_bytes);
        body = capmsg;
    }
    /* the first traceback frame in the script */
    int tb_line = 0;
    if (tb) {
        const char *p = tb;
        while ((p = strchr(p, '\n'))) {
            p++;
            while (*p == '\t' || *p == ' ')
                p++;
            int l = parse_pos(s, p, NULL);
            if (l > 0) {
                tb_line = l;
                break;
            }
        }
    }
    if (line == 0 && s->breach == BREACH_MEMORY && s->last_line > 0)
        line = s->last_line;
    if (line == 0)
        line = tb_line;
    if (line == 0)
        line = fallback_line;
    /* an error raised in another chunk (prelude, load) keeps its position in
     * the message */
    const char *kind = "failed";
    if (s->breach != BREACH_NONE)
        kind = "was stopped";
    else if (lstatus == LUA_ERRSYNTAX)
        kind = "has a syntax error";
    cpc_status *st = cpc_diag(CPC_E_PLAN, CPC_RULE_LUA, CPC_SEV_ERROR, (cpc_span){s->path, line, 0},
                              "Lua script %s in %s: %s", kind, s->what, body);
    free(msg);
    if (s->breach == BREACH_MEMORY)
        cpc_status_set_hint(st, "a script may hold at most %zu bytes; look for tables or strings that "
                            "grow without end", s->lim.memory_bytes);
    else if (s->breach != BREACH_NONE)
        cpc_status_set_hint(st, "a script gets %" PRId64 " VM instructions and %.2f s per call; look "
                            "for an endless loop", s->lim.instructions, s->lim.seconds);
    /* traceback frames as notes (a syntax error has no useful frames) */
    if (tb && lstatus != LUA_ERRSYNTAX) {
        int notes = 0;
        const char *p = tb;
        while ((p = strchr(p, '\n')) && notes < MAX_TRACE_NOTES) {
            p++;
            while (*p == '\t' || *p == ' ')
                p++;
            const char *eol = strchr(p, '\n');
            size_t len = eol ? (size_t)(eol - p) : strlen(p);
            const char *rest = NULL;
            int l = parse_pos(s, p, &rest);
            if (l > 0 && rest && (size_t)(rest - p) <= len) {
                cpc_status_add_note(st, (cpc_span){s->path, l, 0}, "traceback: %.*s",
                                    (int)(len - (size_t)(rest - p)), rest);
                notes++;
            } else if (len > 0 && strncmp(p, "[C]", 3) != 0 && strncmp(p, "(...tail", 8) != 0 &&
                       strncmp(p, "stack traceback:", 16) != 0) {
                cpc_status_add_note(st, CPC_NO_SPAN, "traceback: %.*s", (int)len, p);
                notes++;
            }
        }
    }
    return st;
}

typedef struct pcall_ctx {
    lua_CFunction fn;
    void *ud;
} pcall_ctx;

/* Runs fn(ud) under lua_pcall with the traceback handler and a fresh budget.
 * On error returns a CP050 status (or NOMEM); breaches poison the script. */
static cpc_status *protected_run(cpc_lua_script *s, lua_CFunction fn, void *ud, int fallback_line)
{
    lua_State *L = s->L;
    s->instr = 0;
    s->deadline = now_s() + s->lim.seconds;
    s->host_oom = false;
    s->in_load = false;
    s->alloc_ticks = 0;
    lua_settop(L, 0);
    lua_pushcfunction(L, msg_handler);
    lua_pushcfunction(L, fn);
    lua_pushlightuserdata(L, ud);
    int st = lua_pcall(L, 1, 0, 1);
    if (st == LUA_ERRRUN && s->load_status != LUA_OK)
        st = s->load_status;
    cpc_status *res = NULL;
    if (st != LUA_OK) {
        const char *text = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (st == LUA_ERRMEM)
            note_memory_error(s);
        res = lua_failure(s, st, text, fallback_line);
    }
    if (s->breach != BREACH_NONE)
        s->poisoned = true;
    lua_settop(L, 0);
    /* expire the budget: no Lua code runs between calls */
    s->deadline = 0;
    return res;
}

static cpc_status *poisoned_status(const cpc_lua_script *s)
{
    return cpc_diag(CPC_E_PLAN, CPC_RULE_LUA, CPC_SEV_ERROR, (cpc_span){s->path, 0, 0},
                    "Lua script %s cannot be used again after exceeding its limits", s->path);
}

/* =========================================================================
 * 4. plan.config: read-only proxies
 * ========================================================================= */

/* Pushes "base.key" / "base[3]" for the key at `key`. */
static void push_key_path(lua_State *L, const char *base, int key)
{
    key = lua_absindex(L, key);
    if (lua_type(L, key) == LUA_TSTRING)
        lua_pushfstring(L, "%s%s%s", base, base[0] ? "." : "", lua_tostring(L, key));
    else if (lua_isinteger(L, key))
        lua_pushfstring(L, "%s[%I]", base, (LUAI_UACINT)lua_tointeger(L, key));
    else {
        luaL_tolstring(L, key, NULL);
        lua_pushfstring(L, "%s[%s]", base, lua_tostring(L, -1));
        lua_remove(L, -2);
    }
}

static int ro_newindex(lua_State *L)
{
    push_key_path(L, lua_tostring(L, lua_upvalueindex(1)), 2);
    return luaL_error(L, "plan.config is read-only: %s", lua_tostring(L, -1));
}

static int ro_len(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)lua_rawlen(L, lua_upvalueindex(1)));
    return 1;
}

/* The iterator of pairs() over a proxy: the backing table is its upvalue,
 * never handed to the script (pairs used to return it as the loop's state,
 * so `local _, raw = pairs(plan.config.cluster)` could change it). */
static int proxy_next(lua_State *L)
{
    lua_settop(L, 2);
    lua_pushvalue(L, 2);
    if (lua_next(L, lua_upvalueindex(1)))
        return 2;
    lua_pushnil(L);
    return 1;
}

/* Pushes the pairs() triple (iterator, proxy at `proxy`, nil) for the
 * backing table at the top of the stack (popped). */
static int push_proxy_pairs(lua_State *L, int proxy)
{
    lua_pushcclosure(L, proxy_next, 1);
    lua_pushvalue(L, proxy);
    lua_pushnil(L);
    return 3;
}

static int ro_pairs(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    return push_proxy_pairs(L, 1);
}

/* Replaces the table at the top of the stack (a plain data table whose nested
 * tables are already proxies) with a read-only proxy of it.  `path` is its
 * dotted name below plan.config ("" for the root). */
static void make_readonly(lua_State *L, const char *path)
{
    int data = lua_gettop(L);
    lua_newtable(L);           /* proxy */
    lua_createtable(L, 0, 7);  /* metatable */
    lua_pushvalue(L, data);
    lua_setfield(L, -2, "__index");
    lua_pushstring(L, path);
    lua_pushcclosure(L, ro_newindex, 1);
    lua_setfield(L, -2, "__newindex");
    lua_pushvalue(L, data);
    lua_pushcclosure(L, ro_len, 1);
    lua_setfield(L, -2, "__len");
    lua_pushvalue(L, data);
    lua_pushcclosure(L, ro_pairs, 1);
    lua_setfield(L, -2, "__pairs");
    lua_pushliteral(L, "read-only");
    lua_setfield(L, -2, "__metatable");
    lua_pushstring(L, path);
    lua_setfield(L, -2, RO_MARK);
    lua_setmetatable(L, -2);
    lua_replace(L, data);
}

static void set_int(lua_State *L, const char *k, int64_t v)
{
    lua_pushinteger(L, (lua_Integer)v);
    lua_setfield(L, -2, k);
}

static void set_num(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
    if (!v)
        return;
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

static void set_bool(lua_State *L, const char *k, bool v)
{
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

/* Pushes the read-only plan.config.  With `L_sel` (a program's layout) the
 * parallel section holds the selected candidate; without, the plan as
 * written (0 degrees = nil). */
static void push_config(lua_State *L, const cpc_plan *plan, const cpc_layout *sel)
{
    luaL_checkstack(L, 16, NULL);
    lua_newtable(L);
    set_str(L, "name", plan->name);
    set_str(L, "file", plan->file);
    set_int(L, "version", plan->version);

    lua_newtable(L);
    set_int(L, "heads", plan->model.heads);
    set_int(L, "kv_heads", plan->model.kv_heads);
    set_int(L, "head_dim", plan->model.head_dim);
    set_str(L, "dtype", cpc_dtype_name(plan->model.dtype));
    set_int(L, "layers", plan->model.layers);
    set_num(L, "scale", plan->model.scale);
    make_readonly(L, "model");
    lua_setfield(L, -2, "model");

    lua_newtable(L);
    set_int(L, "batch", plan->input.batch);
    set_int(L, "tokens", plan->input.total_tokens);
    lua_createtable(L, plan->input.n_segments, 0);
    for (int i = 0; i < plan->input.n_segments; i++) {
        lua_newtable(L);
        set_str(L, "name", plan->input.segments[i].name);
        set_int(L, "tokens", plan->input.segments[i].tokens);
        set_str(L, "split", plan->input.segments[i].replicate ? "replicate" : "shard");
        char path[48];
        snprintf(path, sizeof path, "input.segments[%d]", i + 1);
        make_readonly(L, path);
        lua_rawseti(L, -2, i + 1);
    }
    make_readonly(L, "input.segments");
    lua_setfield(L, -2, "segments");
    set_str(L, "mask", cpc_mask_name(plan->input.mask));
    if (plan->input.has_kv) {
        lua_newtable(L);
        set_int(L, "tokens", plan->input.kv_tokens);
        make_readonly(L, "input.kv");
        lua_setfield(L, -2, "kv");
    }
    set_str(L, "mode", cpc_mode_name(plan->input.mode));
    make_readonly(L, "input");
    lua_setfield(L, -2, "input");

    lua_newtable(L);
    int P = plan->cluster.world_size, gpn = plan->cluster.gpus_per_node;
    set_int(L, "world_size", P);
    set_int(L, "gpus_per_node", gpn);
    set_int(L, "nodes", gpn > 0 ? (P + gpn - 1) / gpn : 1);
    set_str(L, "device", plan->cluster.device);
    set_str(L, "profile", plan->cluster.profile);
    if (plan->cluster.memory_gb > 0)
        set_num(L, "memory_gb", plan->cluster.memory_gb);
    set_num(L, "reserved_gb", plan->cluster.reserved_gb);
    make_readonly(L, "cluster");
    lua_setfield(L, -2, "cluster");

    lua_newtable(L);
    if (sel) {
        set_str(L, "variant", cpc_variant_name(sel->variant));
        set_int(L, "ring_degree", sel->R);
        set_int(L, "ulysses_degree", sel->U);
    } else {
        set_str(L, "variant", cpc_variant_name(plan->parallel.variant));
        if (plan->parallel.ring_degree > 0)
            set_int(L, "ring_degree", plan->parallel.ring_degree);
        if (plan->parallel.ulysses_degree > 0)
            set_int(L, "ulysses_degree", plan->parallel.ulysses_degree);
    }
    set_str(L, "fallback", cpc_fallback_name(plan->parallel.fallback));
    make_readonly(L, "parallel");
    lua_setfield(L, -2, "parallel");

    lua_newtable(L);
    set_bool(L, "overlap", plan->schedule.overlap);
    set_str(L, "rotate", cpc_rotate_name(plan->schedule.rotate));
    set_str(L, "script", plan->schedule.script);
    make_readonly(L, "schedule");
    lua_setfield(L, -2, "schedule");

    make_readonly(L, "");
}

/* =========================================================================
 * 5. Program -> Lua tables
 * ========================================================================= */

static bool kind_has_tag(cpc_op_kind k)
{
    const cpc_op_info *i = cpc_op_info_of(k);
    return i && (i->flags & CPC_OPF_TAG);
}

static void push_bufs(lua_State *L, const cpc_program *prog, const int *idx, int n)
{
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        if (idx[i] >= 0 && idx[i] < prog->n_buffers)
            lua_pushstring(L, prog->buffers[idx[i]].name);
        else
            lua_pushinteger(L, idx[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

static void set_expr(lua_State *L, const char *k, const cpc_expr *e)
{
    if (e)
        set_str(L, k, cpc_expr_text(e));
}

/* Op tables are proxies: an empty table whose metatable holds the op's
 * fields (__index = the backing table), so that every assignment, also to
 * a field the op already has, passes through op_newindex, which records the
 * script line that made it (debug info of the nearest frame of the script:
 * the line of the assignment, or of the script's call into the prelude).
 * That line becomes the op's span when the op is read back changed.
 * pairs(op) iterates the fields (__pairs); `next(op)` and rawget see an
 * empty table.  The metatable is protected (getmetatable(op) == "op"). */
static int op_newindex(lua_State *L)
{
    lua_settop(L, 3);
    if (!lua_getmetatable(L, 1))
        return luaL_error(L, "op table without its metatable");
    int mt = lua_gettop(L);
    lua_pushliteral(L, "__index");
    lua_rawget(L, mt);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_rawset(L, -3); /* backing[k] = v */
    if (lua_type(L, 2) == LUA_TSTRING && lua_tostring(L, 2)[0] != '_') {
        cpc_lua_script *s = script_of(L);
        lua_Debug ar;
        for (int level = 1; lua_getstack(L, level, &ar); level++) {
            if (lua_getinfo(L, "Sl", &ar) && ar.source && s->chunkname && strcmp(ar.source, s->chunkname) == 0 &&
                ar.currentline > 0) {
                lua_pushinteger(L, ar.currentline);
                lua_setfield(L, mt, "__edit_line");
                break;
            }
        }
    }
    return 0;
}

static int op_pairs(lua_State *L)
{
    lua_settop(L, 1);
    if (!lua_getmetatable(L, 1))
        return luaL_error(L, "op table without its metatable");
    lua_pushliteral(L, "__index");
    lua_rawget(L, -2);
    return push_proxy_pairs(L, 1);
}

/* Wraps the op table at the top of the stack into its proxy (replacing it). */
static void wrap_op(lua_State *L)
{
    int backing = lua_gettop(L);
    lua_createtable(L, 0, 0);
    lua_createtable(L, 0, 5);
    lua_pushvalue(L, backing);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, op_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, op_pairs);
    lua_setfield(L, -2, "__pairs");
    lua_pushliteral(L, "op");
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
    lua_replace(L, backing);
}

/* If the value at `idx` is an op proxy, replaces it with its backing table
 * (fields a script rawset into the proxy itself are moved there) and
 * returns the line of its last edit (0: none); else returns 0. */
static int unwrap_op(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) != LUA_TTABLE || !lua_getmetatable(L, idx))
        return 0;
    int mt = lua_gettop(L);
    lua_pushliteral(L, "__newindex");
    bool proxy = lua_rawget(L, mt) == LUA_TFUNCTION && lua_tocfunction(L, -1) == op_newindex;
    lua_pop(L, 1);
    if (!proxy) {
        lua_pop(L, 1);
        return 0;
    }
    lua_pushliteral(L, "__edit_line");
    lua_rawget(L, mt);
    int line = lua_isinteger(L, -1) && lua_tointeger(L, -1) > 0 && lua_tointeger(L, -1) < INT32_MAX
                   ? (int)lua_tointeger(L, -1)
                   : 0;
    lua_pop(L, 1);
    lua_pushliteral(L, "__index");
    lua_rawget(L, mt);
    int backing = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, backing);
    }
    lua_replace(L, idx);
    lua_pop(L, 1); /* mt */
    return line;
}

/* Pushes ops[0..n) as an array; records table -> op in the registry map at
 * `map` (absolute index) for span preservation. */
static void push_ops(lua_State *L, cpc_lua_script *s, const cpc_program *prog, const cpc_op *ops, int n,
                     int map)
{
    luaL_checkstack(L, 8, "program nested too deeply");
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        lua_createtable(L, 0, 8);
        set_str(L, "kind", cpc_op_kind_name(op->kind));
        if (op->group != CPC_GROUP_NONE)
            set_str(L, "group", cpc_group_name(op->group));
        push_bufs(L, prog, op->in, op->n_in);
        lua_setfield(L, -2, "in");
        push_bufs(L, prog, op->out, op->n_out);
        lua_setfield(L, -2, "out");
        set_expr(L, "peer", op->peer);
        set_expr(L, "block", op->block);
        set_expr(L, "when", op->when);
        set_expr(L, "count", op->count);
        if (op->kind == CPC_OP_ALL_TO_ALL || op->dir != CPC_A2A_SEQ_TO_HEADS)
            set_str(L, "dir", cpc_a2a_dir_name(op->dir));
        if (kind_has_tag(op->kind) || op->tag != 0)
            set_int(L, "tag", op->tag);
        if (op->kind == CPC_OP_LOOP || op->n_body > 0) {
            push_ops(L, s, prog, op->body, op->n_body, map);
            lua_setfield(L, -2, "body");
        }
        if (op->span.line > 0 && op->span.file && strcmp(op->span.file, s->path) == 0)
            set_int(L, "line", op->span.line);
        wrap_op(L);
        lua_pushvalue(L, -1);
        lua_pushlightuserdata(L, (void *)op);
        lua_rawset(L, map);
        lua_rawseti(L, -2, i + 1);
    }
}

static void push_buffers(lua_State *L, const cpc_program *prog)
{
    lua_createtable(L, prog->n_buffers, 0);
    for (int b = 0; b < prog->n_buffers; b++) {
        const cpc_buffer *bf = &prog->buffers[b];
        lua_createtable(L, 0, 5);
        set_str(L, "name", bf->name);
        set_str(L, "role", cpc_buf_role_name(bf->role));
        set_str(L, "tokens", cpc_buf_tokens_name(bf->tokens));
        set_str(L, "heads", cpc_buf_heads_name(bf->heads));
        set_str(L, "io", cpc_buf_io_name(bf->io));
        lua_rawseti(L, -2, b + 1);
    }
}

/* =========================================================================
 * 6. Lua tables -> program
 * ========================================================================= */

/* snprintf for diagnostic paths ("ops[3].body[2]"); truncation is fine. */
static void fmt_path(char *dst, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fmt_path(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}

typedef struct readback {
    cpc_lua_script *s;
    const cpc_plan *plan;
    const cpc_program *prog;   /* the original, read only */
    int sched_line;            /* where schedule() is defined */
    /* results, owned here until handed over */
    cpc_buffer *bufs;
    int n_bufs;
    cpc_op *ops;
    int n_ops;
    bool overlap;
    cpc_rotate rotate;
    cpc_status *errs;
    int n_errs;
    int total_ops;             /* ops read so far, bodies included */
} readback;

static void rb_error(readback *rb, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rb_error(readback *rb, int line, const char *fmt, ...)
{
    rb->n_errs++;
    if (rb->n_errs > MAX_ERRORS)
        return;
    va_list ap;
    va_start(ap, fmt);
    cpc_status *st = cpc_diagv(CPC_E_PLAN, CPC_RULE_LUA, CPC_SEV_ERROR,
                               (cpc_span){rb->s->path, line > 0 ? line : rb->sched_line, 0}, fmt, ap);
    va_end(ap);
    cpc_status_prefix(st, "Lua script returned an invalid program");
    cpc_status_append(&rb->errs, st);
}

static const char *ltype(lua_State *L, int idx)
{
    if (lua_isinteger(L, idx))
        return "integer";
    return luaL_typename(L, idx);
}

/* Checks that the table at idx is a proper array 1..n (no holes, no other
 * keys).  Returns n, or -1 after reporting. */
static lua_Integer check_array(lua_State *L, readback *rb, int idx, const char *path, int line)
{
    luaL_checkstack(L, 4, NULL);
    idx = lua_absindex(L, idx);
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    lua_Integer count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > n) {
            if (lua_isinteger(L, -1))
                rb_error(rb, line, "%s: not an array (index %lld outside 1..%lld: a hole or a gap)", path,
                         (long long)lua_tointeger(L, -1), (long long)n);
            else
                rb_error(rb, line, "%s: not an array (has a key of type %s)", path, ltype(L, -1));
            lua_pop(L, 1);
            return -1;
        }
        count++;
    }
    if (count != n) {
        rb_error(rb, line, "%s: not an array (holes among its %lld entries)", path, (long long)n);
        return -1;
    }
    return n;
}

/* Reads an expression field (string or integer); *out NULL when absent.
 * Returns false after reporting an error. */
static bool read_expr(lua_State *L, readback *rb, int op_idx, const char *field, const char *path, int line,
                      cpc_expr **out)
{
    *out = NULL;
    lua_pushstring(L, field);
    int t = lua_rawget(L, op_idx);
    bool ok = true;
    if (t == LUA_TNIL) {
        /* absent */
    } else if (t == LUA_TSTRING || t == LUA_TNUMBER) {
        char buf[32];
        const char *text;
        if (t == LUA_TNUMBER) {
            lua_Integer iv;
            if (lua_isinteger(L, -1))
                iv = lua_tointeger(L, -1);
            else {
                double d = lua_tonumber(L, -1);
                if (!(d == floor(d) && fabs(d) < 9.0e15)) {
                    rb_error(rb, line, "%s.%s: expected an expression string or an integer, got %g", path,
                             field, d);
                    lua_pop(L, 1);
                    return false;
                }
                iv = (lua_Integer)d;
            }
            snprintf(buf, sizeof buf, "%lld", (long long)iv);
            text = buf;
        } else {
            text = lua_tostring(L, -1);
        }
        cpc_status *st = cpc_expr_parse(text, CPC_NO_SPAN, out);
        if (st) {
            rb_error(rb, line, "%s.%s: %s", path, field, st->message);
            cpc_status_free(st);
            *out = NULL;
            ok = false;
        }
    } else {
        rb_error(rb, line, "%s.%s: expected an expression string or an integer, got %s", path, field,
                 ltype(L, -1));
        ok = false;
    }
    lua_pop(L, 1);
    return ok;
}

static bool read_name(lua_State *L, readback *rb, int idx, const char *field, const char *path, int line,
                      int (*parse)(const char *), const char *what, int *out, bool *present)
{
    lua_pushstring(L, field);
    int t = lua_rawget(L, idx);
    *present = t != LUA_TNIL;
    bool ok = true;
    if (t == LUA_TNIL) {
    } else if (t != LUA_TSTRING) {
        rb_error(rb, line, "%s.%s: expected a string (%s), got %s", path, field, what, ltype(L, -1));
        ok = false;
    } else {
        int v = parse(lua_tostring(L, -1));
        if (v < 0) {
            rb_error(rb, line, "%s.%s: unknown %s '%s'", path, field, what, lua_tostring(L, -1));
            ok = false;
        } else {
            *out = v;
        }
    }
    lua_pop(L, 1);
    return ok;
}

static int find_buf(const readback *rb, const char *name)
{
    for (int i = 0; i < rb->n_bufs; i++)
        if (strcmp(rb->bufs[i].name, name) == 0)
            return i;
    return -1;
}

/* Reads in/out: an array of buffer names. */
static void read_bufs(lua_State *L, readback *rb, int op_idx, const char *field, const char *path, int line,
                      int *idx, int *n)
{
    *n = 0;
    lua_pushstring(L, field);
    int t = lua_rawget(L, op_idx);
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    char fpath[256];
    fmt_path(fpath, sizeof fpath, "%s.%s", path, field);
    if (t != LUA_TTABLE) {
        rb_error(rb, line, "%s: expected an array of buffer names, got %s", fpath, ltype(L, -1));
        lua_pop(L, 1);
        return;
    }
    int arr = lua_gettop(L);
    lua_Integer len = check_array(L, rb, arr, fpath, line);
    if (len > CPC_OP_MAX_BUFS) {
        rb_error(rb, line, "%s: %lld buffers, at most %d", fpath, (long long)len, CPC_OP_MAX_BUFS);
        len = -1;
    }
    for (lua_Integer i = 1; i <= len; i++) {
        lua_rawgeti(L, arr, i);
        if (lua_type(L, -1) != LUA_TSTRING) {
            rb_error(rb, line, "%s[%lld]: expected a buffer name, got %s", fpath, (long long)i,
                     ltype(L, -1));
        } else {
            int b = find_buf(rb, lua_tostring(L, -1));
            if (b < 0)
                rb_error(rb, line, "%s[%lld]: no buffer named '%s' in plan.buffers", fpath, (long long)i,
                         lua_tostring(L, -1));
            else
                idx[(*n)++] = b;
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

static const char *const op_fields[] = {"kind", "group", "in",  "out", "peer", "block", "when",
                                        "count", "dir",  "tag", "body", "step", "line", NULL};

static bool is_comm(cpc_op_kind k)
{
    const cpc_op_info *i = cpc_op_info_of(k);
    return i && (i->flags & CPC_OPF_GROUP);
}

static void read_ops(lua_State *L, readback *rb, int arr, const char *path, cpc_op **ops, int *n, int depth);

/* Reads the op table at the top of the stack into *op (already zeroed and
 * reachable from rb, so that a Lua error cannot leak it). */
static void read_op(lua_State *L, readback *rb, const char *path, cpc_op *op, int depth)
{
    luaL_checkstack(L, 12, "program nested too deeply");
    int edit_line = unwrap_op(L, -1);
    int t = lua_gettop(L);
    /* line first, for every later message: the last edit of the op, else
     * its `line` (cpc.op), else schedule()'s */
    int line = 0;
    lua_pushliteral(L, "line");
    if (lua_rawget(L, t) != LUA_TNIL) {
        if (lua_isinteger(L, -1) && lua_tointeger(L, -1) > 0 && lua_tointeger(L, -1) < INT32_MAX)
            line = (int)lua_tointeger(L, -1);
        else
            rb_error(rb, edit_line, "%s.line: expected a positive integer, got %s", path, ltype(L, -1));
    }
    lua_pop(L, 1);
    if (edit_line > 0)
        line = edit_line;
    op->span = (cpc_span){rb->s->span_file, line > 0 ? line : rb->sched_line, 0};

    /* unknown fields */
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            rb_error(rb, line, "%s: unexpected key of type %s (op fields are names)", path, ltype(L, -1));
            continue;
        }
        const char *k = lua_tostring(L, -1);
        if (k[0] == '_')
            continue;
        bool known = false;
        for (int i = 0; op_fields[i]; i++)
            known |= strcmp(op_fields[i], k) == 0;
        if (!known)
            rb_error(rb, line, "%s: unknown field '%s'", path, k);
    }

    /* kind */
    lua_pushliteral(L, "kind");
    int tk = lua_rawget(L, t);
    bool kind_ok = false;
    if (tk == LUA_TNIL)
        rb_error(rb, line, "%s: missing field 'kind'", path);
    else if (tk != LUA_TSTRING)
        rb_error(rb, line, "%s.kind: expected a string, got %s", path, ltype(L, -1));
    else {
        int k = cpc_op_kind_parse(lua_tostring(L, -1));
        if (k < 0)
            rb_error(rb, line, "%s.kind: unknown op kind '%s'", path, lua_tostring(L, -1));
        else {
            op->kind = (cpc_op_kind)k;
            kind_ok = true;
        }
    }
    lua_pop(L, 1);

    /* group */
    int g = CPC_GROUP_NONE;
    bool present;
    read_name(L, rb, t, "group", path, line, cpc_group_parse, "group", &g, &present);
    op->group = (cpc_group)g;
    if (kind_ok && is_comm(op->kind) && op->group == CPC_GROUP_NONE)
        rb_error(rb, line, "%s: a %s op needs a group (ring, ulysses or world)", path,
                 cpc_op_kind_name(op->kind));

    /* step: informational, always nil; a value is a mistake */
    lua_pushliteral(L, "step");
    if (lua_rawget(L, t) != LUA_TNIL)
        rb_error(rb, line,
                 "%s.step: ops have no fixed step; inside a loop body use the variable 's' in "
                 "'when', 'peer' or 'block'",
                 path);
    lua_pop(L, 1);

    read_bufs(L, rb, t, "in", path, line, op->in, &op->n_in);
    read_bufs(L, rb, t, "out", path, line, op->out, &op->n_out);
    read_expr(L, rb, t, "peer", path, line, &op->peer);
    read_expr(L, rb, t, "block", path, line, &op->block);
    read_expr(L, rb, t, "when", path, line, &op->when);
    read_expr(L, rb, t, "count", path, line, &op->count);

    int dir = CPC_A2A_SEQ_TO_HEADS;
    read_name(L, rb, t, "dir", path, line, cpc_a2a_dir_parse, "direction", &dir, &present);
    op->dir = (cpc_a2a_dir)dir;
    if (kind_ok && op->kind == CPC_OP_ALL_TO_ALL && !present)
        rb_error(rb, line, "%s: an all_to_all op needs 'dir' (seq_to_heads or heads_to_seq)", path);

    lua_pushliteral(L, "tag");
    int tt = lua_rawget(L, t);
    if (tt == LUA_TNIL) {
        if (kind_ok && kind_has_tag(op->kind))
            rb_error(rb, line, "%s: a %s op needs a 'tag' (integer >= 0)", path, cpc_op_kind_name(op->kind));
    } else if (!lua_isinteger(L, -1)) {
        rb_error(rb, line, "%s.tag: expected an integer >= 0, got %s", path, ltype(L, -1));
    } else if (lua_tointeger(L, -1) < 0 || lua_tointeger(L, -1) > INT32_MAX) {
        rb_error(rb, line, "%s.tag: %lld is out of range (0..%d)", path, (long long)lua_tointeger(L, -1),
                 INT32_MAX);
    } else {
        op->tag = (int)lua_tointeger(L, -1);
    }
    lua_pop(L, 1);

    if (kind_ok && (cpc_op_info_of(op->kind)->flags & CPC_OPF_PEER) && !op->peer)
        rb_error(rb, line, "%s: a %s op needs a 'peer' expression", path, cpc_op_kind_name(op->kind));

    lua_pushliteral(L, "body");
    int tb = lua_rawget(L, t);
    if (kind_ok && op->kind == CPC_OP_LOOP) {
        if (!op->count)
            rb_error(rb, line, "%s: a loop needs a 'count' expression", path);
        if (tb != LUA_TTABLE) {
            rb_error(rb, line, "%s.body: a loop needs a body (an array of ops), got %s", path, ltype(L, -1));
        } else if (depth + 1 >= MAX_LOOP_DEPTH) {
            rb_error(rb, line, "%s: loops nested deeper than %d", path, MAX_LOOP_DEPTH);
        } else {
            char bpath[256];
            fmt_path(bpath, sizeof bpath, "%s.body", path);
            read_ops(L, rb, lua_gettop(L), bpath, &op->body, &op->n_body, depth + 1);
        }
    } else if (tb != LUA_TNIL && kind_ok) {
        rb_error(rb, line, "%s.body: only loop ops have a body (kind is %s)", path, cpc_op_kind_name(op->kind));
    } else if (kind_ok && op->count) {
        rb_error(rb, line, "%s.count: only loop ops have a count (kind is %s)", path,
                 cpc_op_kind_name(op->kind));
    }
    lua_pop(L, 1);
}

static void read_ops(lua_State *L, readback *rb, int arr, const char *path, cpc_op **ops, int *n, int depth)
{
    luaL_checkstack(L, 8, "program nested too deeply");
    arr = lua_absindex(L, arr);
    lua_Integer len = check_array(L, rb, arr, path, 0);
    if (len < 0)
        return;
    if (len > CPC_LUA_MAX_OPS - rb->total_ops) {
        rb_error(rb, 0, "%s: too many ops (a program may have at most %d, loop bodies included)", path,
                 CPC_LUA_MAX_OPS);
        return;
    }
    rb->total_ops += (int)len;
    for (lua_Integer i = 1; i <= len; i++) {
        char opath[256];
        fmt_path(opath, sizeof opath, "%s[%lld]", path, (long long)i);
        lua_rawgeti(L, arr, i);
        if (lua_type(L, -1) != LUA_TTABLE) {
            rb_error(rb, 0, "%s: expected an op table, got %s", opath, ltype(L, -1));
            lua_pop(L, 1);
            continue;
        }
        cpc_op *op = cpc_ops_append(ops, n, CPC_OP_BARRIER);
        if (!op)
            luaL_error(L, "out of host memory");
        read_op(L, rb, opath, op, depth);
        lua_pop(L, 1);
    }
}

static void read_buffers(lua_State *L, readback *rb, int arr)
{
    if (lua_type(L, arr) != LUA_TTABLE) {
        rb_error(rb, 0, "plan.buffers: expected an array of buffer tables, got %s", ltype(L, arr));
        return;
    }
    lua_Integer len = check_array(L, rb, arr, "plan.buffers", 0);
    if (len < 0)
        return;
    if (len > CPC_LUA_MAX_BUFFERS) {
        rb_error(rb, 0, "plan.buffers: %lld buffers, at most %d", (long long)len, CPC_LUA_MAX_BUFFERS);
        return;
    }
    rb->bufs = calloc((size_t)(len > 0 ? len : 1), sizeof *rb->bufs);
    if (!rb->bufs)
        luaL_error(L, "out of host memory");
    static const char *const fields[] = {"name", "role", "tokens", "heads", "io", NULL};
    for (lua_Integer i = 1; i <= len; i++) {
        char path[64];
        snprintf(path, sizeof path, "plan.buffers[%lld]", (long long)i);
        lua_rawgeti(L, arr, i);
        int t = lua_gettop(L);
        if (lua_type(L, t) != LUA_TTABLE) {
            rb_error(rb, 0, "%s: expected a buffer table, got %s", path, ltype(L, t));
            lua_pop(L, 1);
            continue;
        }
        lua_pushnil(L);
        while (lua_next(L, t)) {
            lua_pop(L, 1);
            bool known = false;
            if (lua_type(L, -1) == LUA_TSTRING) {
                const char *k = lua_tostring(L, -1);
                known = k[0] == '_';
                for (int f = 0; fields[f]; f++)
                    known |= strcmp(fields[f], k) == 0;
                if (!known)
                    rb_error(rb, 0, "%s: unknown field '%s'", path, k);
            } else {
                rb_error(rb, 0, "%s: unexpected key of type %s", path, ltype(L, -1));
            }
        }
        cpc_buffer b;
        memset(&b, 0, sizeof b);
        bool ok = true;
        lua_pushliteral(L, "name");
        int tn = lua_rawget(L, t);
        if (tn != LUA_TSTRING) {
            rb_error(rb, 0, "%s.name: expected a string, got %s", path, ltype(L, -1));
            ok = false;
        } else {
            size_t l;
            const char *nm = lua_tolstring(L, -1, &l);
            bool valid = l > 0 && l < CPC_BUF_NAME_MAX;
            for (size_t c = 0; valid && c < l; c++)
                valid = (nm[c] >= 'a' && nm[c] <= 'z') || (nm[c] >= 'A' && nm[c] <= 'Z') ||
                        (nm[c] >= '0' && nm[c] <= '9') || nm[c] == '_';
            if (!valid) {
                rb_error(rb, 0, "%s.name: '%s' is not a buffer name (1..%d characters of A-Z a-z 0-9 _)", path,
                         nm, CPC_BUF_NAME_MAX - 1);
                ok = false;
            } else if (find_buf(rb, nm) >= 0) {
                rb_error(rb, 0, "%s.name: a buffer named '%s' already exists", path, nm);
                ok = false;
            } else {
                memcpy(b.name, nm, l + 1);
            }
        }
        lua_pop(L, 1);
        int role = 0, tok = 0, heads = 0, io = 0;
        bool present;
        ok &= read_name(L, rb, t, "role", path, 0, cpc_buf_role_parse, "buffer role", &role, &present);
        if (!present) {
            rb_error(rb, 0, "%s: missing field 'role'", path);
            ok = false;
        }
        ok &= read_name(L, rb, t, "tokens", path, 0, cpc_buf_tokens_parse, "token layout", &tok, &present);
        if (!present) {
            rb_error(rb, 0, "%s: missing field 'tokens'", path);
            ok = false;
        }
        ok &= read_name(L, rb, t, "heads", path, 0, cpc_buf_heads_parse, "head layout", &heads, &present);
        if (!present) {
            rb_error(rb, 0, "%s: missing field 'heads'", path);
            ok = false;
        }
        ok &= read_name(L, rb, t, "io", path, 0, cpc_buf_io_parse, "buffer io", &io, &present);
        lua_pop(L, 1);
        if (!ok)
            continue;
        /* an unchanged original buffer is copied whole (any field the
         * program may grow is kept) */
        int orig = cpc_program_find_buffer(rb->prog, b.name);
        if (orig >= 0 && rb->prog->buffers[orig].role == (cpc_buf_role)role &&
            rb->prog->buffers[orig].tokens == (cpc_buf_tokens)tok &&
            rb->prog->buffers[orig].heads == (cpc_buf_heads)heads && rb->prog->buffers[orig].io == (cpc_buf_io)io) {
            b = rb->prog->buffers[orig];
        } else {
            b.role = (cpc_buf_role)role;
            b.tokens = (cpc_buf_tokens)tok;
            b.heads = (cpc_buf_heads)heads;
            b.io = (cpc_buf_io)io;
        }
        rb->bufs[rb->n_bufs++] = b;
    }
}

/* Op equality (own fields, not the body) for span preservation. */
static bool expr_eq(const cpc_expr *a, const cpc_expr *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(cpc_expr_text(a), cpc_expr_text(b)) == 0;
}

static bool bufs_eq(const readback *rb, const int *a, int na, const int *b, int nb)
{
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++) {
        if (b[i] < 0 || b[i] >= rb->prog->n_buffers)
            return false;
        if (strcmp(rb->bufs[a[i]].name, rb->prog->buffers[b[i]].name) != 0)
            return false;
    }
    return true;
}

static bool op_same(const readback *rb, const cpc_op *n, const cpc_op *o)
{
    return n->kind == o->kind && n->group == o->group && n->dir == o->dir && n->tag == o->tag &&
           expr_eq(n->peer, o->peer) && expr_eq(n->block, o->block) && expr_eq(n->when, o->when) &&
           expr_eq(n->count, o->count) && bufs_eq(rb, n->in, n->n_in, o->in, o->n_in) &&
           bufs_eq(rb, n->out, n->n_out, o->out, o->n_out);
}

/* Second pass: ops that are original tables with unchanged fields get their
 * original span back.  `arr` is the Lua array the ops were read from. */
static void restore_spans(lua_State *L, readback *rb, int arr, cpc_op *ops, int n, int map)
{
    luaL_checkstack(L, 8, "program nested too deeply");
    arr = lua_absindex(L, arr);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, arr, i + 1);
        int t = lua_gettop(L);
        lua_pushvalue(L, t);
        int mapped = lua_rawget(L, map); /* keyed by the proxy */
        unwrap_op(L, t);
        if (mapped == LUA_TLIGHTUSERDATA) {
            const cpc_op *o = lua_touserdata(L, -1);
            lua_pushliteral(L, "line");
            bool has_line = lua_rawget(L, t) != LUA_TNIL;
            lua_pop(L, 1);
            if (op_same(rb, &ops[i], o) && (!has_line || o->span.line == ops[i].span.line))
                ops[i].span = o->span;
        }
        lua_pop(L, 1);
        if (ops[i].kind == CPC_OP_LOOP && ops[i].n_body > 0) {
            lua_pushliteral(L, "body");
            lua_rawget(L, t);
            restore_spans(L, rb, lua_gettop(L), ops[i].body, ops[i].n_body, map);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
}

/* =========================================================================
 * 7. Range checks on the mesh (peer in its group, block in 0..R-1, counts)
 * ========================================================================= */

typedef struct range_ctx {
    const readback *rb;
    const cpc_layout *L;
    cpc_status *errs;
    int n_errs;
    int sched_line;
    int64_t evals;             /* evaluations so far (RANGE_MAX_EVALS) */
} range_ctx;

static void range_error(range_ctx *rc, const cpc_op *op, const char *opath, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void range_error(range_ctx *rc, const cpc_op *op, const char *opath, const char *fmt, ...)
{
    rc->n_errs++;
    if (rc->n_errs > MAX_ERRORS)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cpc_span sp = op->span;
    if (!sp.file)
        sp = (cpc_span){rc->rb->s->path, rc->sched_line, 0};
    cpc_status *st = cpc_diag(CPC_E_PLAN, CPC_RULE_LUA, CPC_SEV_ERROR, sp,
                              "Lua script returned an invalid program: %s: %s", opath, msg);
    cpc_status_append(&rc->errs, st);
}

static int64_t group_members(const cpc_layout *L, cpc_group g)
{
    switch (g) {
    case CPC_GROUP_RING: return L->R;
    case CPC_GROUP_ULYSSES: return L->U;
    case CPC_GROUP_WORLD: return L->P;
    default: return 0;
    }
}

/* Evaluates; on failure reports once per op and returns false. */
static bool range_eval(range_ctx *rc, const cpc_op *op, const char *opath, const char *field,
                       const cpc_expr *e, const cpc_coords *c, int64_t *v)
{
    rc->evals++;
    cpc_status *st = cpc_expr_eval(e, c, v);
    if (!st)
        return true;
    range_error(rc, op, opath, "%s '%s' cannot be evaluated on rank %lld (r=%lld u=%lld s=%lld): %s", field,
                cpc_expr_text(e), (long long)c->p, (long long)c->r, (long long)c->u, (long long)c->s,
                st->message);
    cpc_status_free(st);
    return false;
}

/* Steps to check for a loop of `count` iterations. */
static int sample_steps(int64_t count, int64_t *out)
{
    if (count <= RANGE_ALL_STEPS) {
        for (int64_t i = 0; i < count; i++)
            out[i] = i;
        return (int)count;
    }
    int n = 0;
    int64_t cand[] = {0, 1, 2, count / 2, count - 3, count - 2, count - 1};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        bool dup = false;
        for (int j = 0; j < n; j++)
            dup |= out[j] == cand[i];
        if (!dup && cand[i] >= 0 && cand[i] < count)
            out[n++] = cand[i];
    }
    return n;
}

/* Returns false when the op failed a check (so a loop body is not entered). */
static bool range_op(range_ctx *rc, const cpc_op *op, const char *opath, const cpc_coords *c, int depth)
{
    int64_t v;
    if (rc->evals > RANGE_MAX_EVALS)
        return false; /* enough: the verifier evaluates everything it runs */
    if (op->when) {
        if (!range_eval(rc, op, opath, "when", op->when, c, &v))
            return false;
        if (!v)
            return true;
    }
    if (op->peer) {
        if (!range_eval(rc, op, opath, "peer", op->peer, c, &v))
            return false;
        int64_t W = group_members(rc->L, op->group);
        if (W > 0 && (v < 0 || v >= W)) {
            range_error(rc, op, opath,
                        "peer '%s' is %lld on rank %lld (r=%lld u=%lld s=%lld), outside the %s group's "
                        "members 0..%lld",
                        cpc_expr_text(op->peer), (long long)v, (long long)c->p, (long long)c->r,
                        (long long)c->u, (long long)c->s, cpc_group_name(op->group), (long long)W - 1);
            return false;
        }
    }
    if (op->block) {
        if (!range_eval(rc, op, opath, "block", op->block, c, &v))
            return false;
        if (v < 0 || v >= rc->L->R) {
            range_error(rc, op, opath, "block '%s' is %lld on rank %lld (r=%lld u=%lld s=%lld), outside 0..%d",
                        cpc_expr_text(op->block), (long long)v, (long long)c->p, (long long)c->r,
                        (long long)c->u, (long long)c->s, rc->L->R - 1);
            return false;
        }
    }
    if (op->kind == CPC_OP_LOOP && op->count) {
        if (!range_eval(rc, op, opath, "count", op->count, c, &v))
            return false;
        if (v < 0 || v > CPC_LOOP_MAX) {
            range_error(rc, op, opath, "count '%s' is %lld on rank %lld, outside 0..%d", cpc_expr_text(op->count),
                        (long long)v, (long long)c->p, CPC_LOOP_MAX);
            return false;
        }
        int64_t steps[RANGE_ALL_STEPS > 8 ? RANGE_ALL_STEPS : 8];
        int ns = sample_steps(v, steps);
        for (int k = 0; k < ns; k++) {
            cpc_coords ci = *c;
            ci.s = steps[k];
            for (int j = 0; j < op->n_body; j++) {
                char bpath[256];
                fmt_path(bpath, sizeof bpath, "%s.body[%d]", opath, j + 1);
                if (!range_op(rc, &op->body[j], bpath, &ci, depth + 1))
                    return false;
            }
        }
    }
    return true;
}

static cpc_status *range_check(const readback *rb, const cpc_op *ops, int n)
{
    const cpc_layout *L = &rb->prog->layout;
    range_ctx rc = {.rb = rb, .L = L, .sched_line = rb->sched_line};
    int R = L->R > 0 ? L->R : 1, U = L->U > 0 ? L->U : 1;
    int64_t P = (int64_t)R * U;
    /* ranks to check: all, or the corners and middles of the mesh */
    int64_t ranks[64];
    int nr = 0;
    bool all = P <= RANGE_ALL_RANKS;
    int rs[] = {0, 1, 2, R / 2, R - 3, R - 2, R - 1};
    int us[] = {0, 1, U / 2, U - 2, U - 1};
    if (!all) {
        for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
            for (size_t j = 0; j < sizeof us / sizeof us[0]; j++) {
                if (rs[i] < 0 || rs[i] >= R || us[j] < 0 || us[j] >= U)
                    continue;
                int64_t p = (int64_t)rs[i] * U + us[j];
                bool dup = false;
                for (int k = 0; k < nr; k++)
                    dup |= ranks[k] == p;
                if (!dup && nr < 64)
                    ranks[nr++] = p;
            }
    }
    int64_t count = all ? P : nr;
    for (int64_t k = 0; k < count && rc.n_errs == 0; k++) {
        int64_t p = all ? k : ranks[k];
        cpc_coords c = {.r = p / U, .u = p % U, .p = p, .s = 0, .R = L->R, .U = L->U, .P = L->P};
        for (int i = 0; i < n; i++) {
            char opath[32];
            fmt_path(opath, sizeof opath, "ops[%d]", i + 1);
            range_op(&rc, &ops[i], opath, &c, 0);
        }
    }
    return rc.errs;
}

/* =========================================================================
 * 8. Entry points
 * ========================================================================= */

static void fill_limits(cpc_lua_limits *dst, const cpc_lua_limits *src)
{
    memset(dst, 0, sizeof *dst);
    if (src)
        *dst = *src;
    if (dst->memory_bytes == 0)
        dst->memory_bytes = CPC_LUA_DEFAULT_MEMORY;
    if (dst->instructions <= 0)
        dst->instructions = CPC_LUA_DEFAULT_INSTRUCTIONS;
    if (!(dst->seconds > 0))
        dst->seconds = CPC_LUA_DEFAULT_SECONDS;
}

typedef struct open_ctx {
    cpc_lua_script *s;
    const char *text;
    size_t len;
} open_ctx;

static int open_protected(lua_State *L)
{
    open_ctx *oc = lua_touserdata(L, 1);
    cpc_lua_script *s = oc->s;
    lua_pushcfunction(L, setup_sandbox);
    lua_call(L, 0, 0);
    lua_pushcfunction(L, run_prelude);
    lua_call(L, 0, 0);
    s->what = "the main chunk";
    int st = luaL_loadbufferx(L, oc->text, oc->len, s->chunkname, "t");
    if (st != LUA_OK) {
        s->load_status = st;
        return lua_error(L);
    }
    lua_Debug ar;
    lua_pushvalue(L, -1);
    if (lua_getinfo(L, ">S", &ar))
        snprintf(s->short_src, sizeof s->short_src, "%s", ar.short_src);
    lua_call(L, 0, 0);
    return 0;
}

cpc_status *cpc_lua_open(const char *path, const char *text, size_t len, const cpc_lua_limits *limits,
                         cpc_lua_script **out)
{
    *out = NULL;
    if (!path)
        path = "script.lua";
    if (!text)
        return cpc_error(CPC_E_INTERNAL, "cpc_lua_open: NULL text");
    cpc_lua_script *s = calloc(1, sizeof *s);
    if (!s)
        return &cpc_status_oom;
    fill_limits(&s->lim, limits);
    s->path = strdup(path);
    s->span_file = path;
    if (!s->path || asprintf(&s->chunkname, "@%s", path) < 0) {
        s->chunkname = NULL;
        cpc_lua_close(s);
        return &cpc_status_oom;
    }
    snprintf(s->short_src, sizeof s->short_src, "%s", path);
    s->what = "setup";
    s->L = lua_newstate(capped_alloc, s);
    if (!s->L) {
        cpc_lua_close(s);
        return &cpc_status_oom;
    }
    lua_setwarnf(s->L, NULL, NULL);
    lua_sethook(s->L, count_hook, LUA_MASKCOUNT, CPC_LUA_HOOK_EVERY);
    open_ctx oc = {.s = s, .text = text, .len = len};
    cpc_status *st = protected_run(s, open_protected, &oc, 0);
    if (st) {
        cpc_lua_close(s);
        return st;
    }
    *out = s;
    return NULL;
}

cpc_status *cpc_lua_open_file(const char *path, const cpc_lua_limits *limits, cpc_lua_script **out)
{
    *out = NULL;
    /* fileio.h: a regular file only (a FIFO would block open() forever) */
    cpc_status *ost = NULL;
    FILE *f = cpc_fopen_read(path, "Lua script", false, &ost);
    if (!f)
        return ost; /* "Lua script PATH: cannot open: ..." */
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            if (cap >= MAX_SCRIPT_BYTES) {
                free(buf);
                fclose(f);
                return cpc_error(CPC_E_IO, "Lua script %s is larger than %zu bytes", path, MAX_SCRIPT_BYTES);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    bool err = ferror(f);
    int e = errno;
    fclose(f);
    if (!buf)
        return &cpc_status_oom;
    if (err) {
        free(buf);
        cpc_status *st = cpc_errno_status(CPC_E_IO, e, path);
        cpc_status_prefix(st, "cannot read Lua script");
        return st;
    }
    cpc_status *st = cpc_lua_open(path, buf, n, limits, out);
    free(buf);
    return st;
}

void cpc_lua_close(cpc_lua_script *s)
{
    if (!s)
        return;
    if (s->L) {
        s->deadline = 0; /* any Lua code still run by closing errors at once */
        s->breach = s->breach != BREACH_NONE ? s->breach : BREACH_TIME;
        lua_close(s->L);
    }
    free(s->path);
    free(s->chunkname);
    free(s);
}

typedef struct has_ctx {
    const char *name;
    bool yes;
} has_ctx;

static int has_protected(lua_State *L)
{
    has_ctx *hc = lua_touserdata(L, 1);
    lua_pushglobaltable(L);
    lua_pushstring(L, hc->name);
    hc->yes = lua_rawget(L, -2) != LUA_TNIL;
    return 0;
}

static bool has_fn(cpc_lua_script *s, const char *name)
{
    if (!s || s->poisoned)
        return false;
    has_ctx hc = {name, false};
    cpc_status *st = protected_run(s, has_protected, &hc, 0);
    if (st) {
        cpc_status_free(st);
        return false;
    }
    return hc.yes;
}

bool cpc_lua_has_schedule(cpc_lua_script *s) { return has_fn(s, "schedule"); }
bool cpc_lua_has_choose(cpc_lua_script *s) { return has_fn(s, "choose"); }

/* ---- schedule ------------------------------------------------------------- */

typedef struct sched_ctx {
    readback rb;
    bool defined;
} sched_ctx;

static int sched_protected(lua_State *L)
{
    sched_ctx *sc = lua_touserdata(L, 1);
    readback *rb = &sc->rb;
    lua_settop(L, 0);
    int ty = lua_getglobal(L, "schedule");
    if (ty == LUA_TNIL) {
        sc->defined = false;
        return 0;
    }
    if (ty != LUA_TFUNCTION)
        return luaL_error(L, "the global 'schedule' is a %s, not a function", lua_typename(L, ty));
    sc->defined = true;
    lua_Debug ar;
    lua_pushvalue(L, 1);
    if (lua_getinfo(L, ">S", &ar) && ar.source && strcmp(ar.source, rb->s->chunkname) == 0)
        rb->sched_line = ar.linedefined;

    /* cpc.mesh for the prelude (cpc.find, cpc.eval) */
    if (lua_getglobal(L, "cpc") == LUA_TTABLE) {
        lua_createtable(L, 0, 3);
        set_int(L, "R", rb->prog->layout.R);
        set_int(L, "U", rb->prog->layout.U);
        set_int(L, "P", rb->prog->layout.P);
        lua_setfield(L, -2, "mesh");
    }
    lua_settop(L, 1);

    lua_newtable(L); /* 2: map op table -> original op */
    int map = 2;
    lua_newtable(L); /* 3: plan */
    int plan_t = 3;
    push_config(L, rb->plan, &rb->prog->layout);
    lua_setfield(L, plan_t, "config");
    push_buffers(L, rb->prog);
    lua_setfield(L, plan_t, "buffers");
    push_ops(L, rb->s, rb->prog, rb->prog->ops, rb->prog->n_ops, map);
    lua_setfield(L, plan_t, "ops");
    set_bool(L, "overlap", rb->prog->overlap);
    set_str(L, "rotate", cpc_rotate_name(rb->prog->rotate));

    /* call schedule(plan) */
    lua_pushvalue(L, 1);
    lua_pushvalue(L, plan_t);
    lua_call(L, 1, 1); /* 4: result */
    int res = 4;

    /* program flags */
    lua_pushliteral(L, "overlap");
    int t = lua_rawget(L, plan_t);
    if (t == LUA_TBOOLEAN)
        rb->overlap = lua_toboolean(L, -1);
    else
        rb_error(rb, 0, "plan.overlap: expected a boolean, got %s", ltype(L, -1));
    lua_pop(L, 1);
    lua_pushliteral(L, "rotate");
    t = lua_rawget(L, plan_t);
    int rot = -1;
    if (t == LUA_TSTRING)
        rot = cpc_rotate_parse(lua_tostring(L, -1));
    if (rot < 0)
        rb_error(rb, 0, "plan.rotate: expected \"p2p\" or \"allgather\", got %s%s%s", ltype(L, -1),
                 t == LUA_TSTRING ? " " : "", t == LUA_TSTRING ? lua_tostring(L, -1) : "");
    else
        rb->rotate = (cpc_rotate)rot;
    lua_pop(L, 1);

    /* buffers, then ops (which name buffers) */
    lua_pushliteral(L, "buffers");
    lua_rawget(L, plan_t);
    read_buffers(L, rb, lua_gettop(L));
    lua_pop(L, 1);

    int arr;
    const char *path = "ops";
    /* `return plan` means what returning nothing means: plan.ops as edited
     * (new-user trial: it read the plan table as an ops array) */
    if (lua_type(L, res) == LUA_TTABLE && !lua_rawequal(L, res, plan_t)) {
        arr = res;
    } else if (lua_isnil(L, res) || lua_rawequal(L, res, plan_t)) {
        lua_pushliteral(L, "ops");
        lua_rawget(L, plan_t);
        arr = lua_gettop(L);
        if (lua_type(L, arr) != LUA_TTABLE) {
            rb_error(rb, 0, "plan.ops: expected an array of ops, got %s", ltype(L, arr));
            return 0;
        }
    } else {
        rb_error(rb, 0, "schedule() must return nothing or the plan (plan.ops edited in place) or an array of ops, got %s",
                 ltype(L, res));
        return 0;
    }
    read_ops(L, rb, arr, path, &rb->ops, &rb->n_ops, 0);
    if (!rb->errs)
        restore_spans(L, rb, arr, rb->ops, rb->n_ops, map);
    return 0;
}

static void free_readback(readback *rb)
{
    free(rb->bufs);
    rb->bufs = NULL;
    cpc_ops_free(rb->ops, rb->n_ops);
    rb->ops = NULL;
    rb->n_ops = 0;
    cpc_status_free(rb->errs);
    rb->errs = NULL;
}

/* Adds a note at each op of the script's result that the script changed or
 * created (its span is in the script: the line of its last edit, its
 * `line`, or schedule()'s), up to 3; counts the others in *more.  Paths are
 * 1-based, as the verifier and Lua name them. */
static void note_changed_ops(const cpc_lua_script *s, cpc_status *e, const cpc_op *ops, int n, const char *prefix,
                             int *shown, int *more)
{
    for (int i = 0; i < n; i++) {
        const cpc_op *op = &ops[i];
        char path[256];
        snprintf(path, sizeof path, strchr(prefix, '[') ? "%s.body[%d]" : "%s[%d]", prefix, i + 1);
        bool changed = op->span.file && op->span.line > 0 && strcmp(op->span.file, s->path) == 0;
        bool is_error_op = e->span.file && strcmp(e->span.file, s->path) == 0 && e->span.line == op->span.line;
        if (changed && !is_error_op) {
            if (*shown < 3) {
                cpc_status_add_note(e, op->span, "%s %s was changed or added by schedule() here", path,
                                    cpc_op_kind_name(op->kind));
                ++*shown;
            } else {
                ++*more;
            }
        }
        if (op->n_body > 0)
            note_changed_ops(s, e, op->body, op->n_body, path, shown, more);
    }
}

cpc_status *cpc_lua_schedule(cpc_lua_script *s, const cpc_plan *plan, cpc_program *prog)
{
    if (!s || !plan || !prog)
        return cpc_error(CPC_E_INTERNAL, "cpc_lua_schedule: NULL argument");
    if (s->poisoned)
        return poisoned_status(s);
    sched_ctx sc;
    memset(&sc, 0, sizeof sc);
    sc.rb.s = s;
    sc.rb.plan = plan;
    sc.rb.prog = prog;
    sc.rb.overlap = prog->overlap;
    sc.rb.rotate = prog->rotate;
    s->what = "schedule()";
    cpc_status *st = protected_run(s, sched_protected, &sc, 0);
    if (st) {
        free_readback(&sc.rb);
        return st;
    }
    if (!sc.defined) {
        free_readback(&sc.rb);
        return NULL;
    }
    readback *rb = &sc.rb;
    if (rb->errs) {
        cpc_status *e = rb->errs;
        if (rb->n_errs > MAX_ERRORS)
            cpc_status_add_note(e, CPC_NO_SPAN, "%d more errors not shown", rb->n_errs - MAX_ERRORS);
        rb->errs = NULL;
        free_readback(rb);
        return e;
    }
    cpc_status *rerr = range_check(rb, rb->ops, rb->n_ops);
    if (rerr) {
        free_readback(rb);
        return rerr;
    }
    /* verify a candidate program that shares nothing with `prog` but its
     * layout (copied) */
    cpc_program cand = *prog;
    cand.buffers = rb->bufs;
    cand.n_buffers = rb->n_bufs;
    cand.ops = rb->ops;
    cand.n_ops = rb->n_ops;
    cand.overlap = rb->overlap;
    cand.rotate = rb->rotate;
    cpc_status *vst = cpc_verify(&cand);
    if (cpc_status_has_error(vst)) {
        for (cpc_status *e = vst; e; e = e->next)
            if (e->severity == CPC_SEV_ERROR) {
                /* where the script changed ops (the failing op itself, when
                 * the script changed it, is the error's own position) */
                int shown = 0, more = 0;
                note_changed_ops(s, e, rb->ops, rb->n_ops, "ops", &shown, &more);
                if (more)
                    cpc_status_add_note(e, (cpc_span){s->path, rb->sched_line, 0},
                                        "and %d more ops changed by schedule()", more);
                cpc_status_add_note(e, (cpc_span){s->path, rb->sched_line, 0},
                                    "the program was edited by the Lua script's schedule()");
                break;
            }
        free_readback(rb);
        return vst;
    }
    /* success: hand over */
    free(prog->buffers);
    cpc_ops_free(prog->ops, prog->n_ops);
    prog->buffers = rb->bufs;
    prog->n_buffers = rb->n_bufs;
    prog->ops = rb->ops;
    prog->n_ops = rb->n_ops;
    prog->overlap = rb->overlap;
    prog->rotate = rb->rotate;
    rb->bufs = NULL;
    rb->ops = NULL;
    rb->n_ops = 0;
    free_readback(rb);
    return vst;
}

/* ---- choose ----------------------------------------------------------------- */

typedef struct choose_ctx {
    cpc_lua_script *s;
    const cpc_plan *plan;
    const cpc_candidate *cands;
    int n;
    int chosen;
    bool defined;
    int fn_line;
    char err[512];
} choose_ctx;

static int choose_protected(lua_State *L)
{
    choose_ctx *cc = lua_touserdata(L, 1);
    lua_settop(L, 0);
    int ty = lua_getglobal(L, "choose");
    if (ty == LUA_TNIL) {
        cc->defined = false;
        return 0;
    }
    if (ty != LUA_TFUNCTION)
        return luaL_error(L, "the global 'choose' is a %s, not a function", lua_typename(L, ty));
    cc->defined = true;
    lua_Debug ar;
    lua_pushvalue(L, 1);
    if (lua_getinfo(L, ">S", &ar) && ar.source && strcmp(ar.source, cc->s->chunkname) == 0)
        cc->fn_line = ar.linedefined;
    if (lua_getglobal(L, "cpc") == LUA_TTABLE) { /* no mesh yet: nothing is selected */
        lua_pushnil(L);
        lua_setfield(L, -2, "mesh");
    }
    lua_settop(L, 1);
    lua_newtable(L); /* 2: candidates */
    int k = 0;
    for (int i = 0; i < cc->n; i++) {
        const cpc_candidate *c = &cc->cands[i];
        if (!c->ok)
            continue;
        lua_createtable(L, 0, 8);
        set_str(L, "variant", cpc_variant_name(c->variant));
        set_int(L, "ring_degree", c->ring_degree);
        set_int(L, "ulysses_degree", c->ulysses_degree);
        if (c->priced) {
            set_num(L, "predicted_ms", c->predicted_ms_per_layer);
            set_num(L, "predicted_ms_per_forward", c->predicted_ms_per_forward);
            set_int(L, "memory_bytes", c->memory_bytes_per_rank);
            set_int(L, "bytes_sent", c->bytes_sent_per_rank);
        }
        set_int(L, "index", ++k);
        lua_rawseti(L, 2, k);
    }
    push_config(L, cc->plan, NULL); /* 3 */
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_call(L, 2, 1);
    int res = lua_gettop(L);
    if (lua_type(L, res) != LUA_TTABLE) {
        snprintf(cc->err, sizeof cc->err, "choose() must return one of its candidates (a table), got %s",
                 ltype(L, res));
        return 0;
    }
    const char *variant = NULL;
    lua_Integer R = -1, U = -1;
    lua_pushliteral(L, "variant");
    if (lua_rawget(L, res) == LUA_TSTRING)
        variant = lua_tostring(L, -1);
    lua_pushliteral(L, "ring_degree");
    if (lua_rawget(L, res) == LUA_TNUMBER && lua_isinteger(L, -1))
        R = lua_tointeger(L, -1);
    lua_pushliteral(L, "ulysses_degree");
    if (lua_rawget(L, res) == LUA_TNUMBER && lua_isinteger(L, -1))
        U = lua_tointeger(L, -1);
    if (!variant || R < 1 || U < 1) {
        snprintf(cc->err, sizeof cc->err,
                 "choose() must return one of its candidates: the table it returned has no valid "
                 "variant, ring_degree and ulysses_degree");
        return 0;
    }
    for (int i = 0; i < cc->n; i++) {
        const cpc_candidate *c = &cc->cands[i];
        if (c->ok && strcmp(cpc_variant_name(c->variant), variant) == 0 && c->ring_degree == R &&
            c->ulysses_degree == U) {
            cc->chosen = i;
            return 0;
        }
    }
    snprintf(cc->err, sizeof cc->err,
             "choose() returned %.40s %lldx%lld, which is not one of the valid candidates", variant,
             (long long)R, (long long)U);
    return 0;
}

cpc_status *cpc_lua_choose(cpc_lua_script *s, const cpc_plan *plan, const cpc_candidate *cands, int n,
                           int *chosen)
{
    if (!s || !plan || (!cands && n > 0) || !chosen)
        return cpc_error(CPC_E_INTERNAL, "cpc_lua_choose: NULL argument");
    if (s->poisoned)
        return poisoned_status(s);
    int valid = 0;
    for (int i = 0; i < n; i++)
        valid += cands[i].ok;
    if (valid == 0)
        return NULL;
    choose_ctx cc = {.s = s, .plan = plan, .cands = cands, .n = n, .chosen = -1};
    s->what = "choose()";
    cpc_status *st = protected_run(s, choose_protected, &cc, 0);
    if (st)
        return st;
    if (!cc.defined)
        return NULL;
    if (cc.err[0] || cc.chosen < 0)
        return cpc_diag(CPC_E_PLAN, CPC_RULE_LUA, CPC_SEV_ERROR, (cpc_span){s->path, cc.fn_line, 0}, "%s",
                        cc.err[0] ? cc.err : "choose() chose nothing");
    *chosen = cc.chosen;
    return NULL;
}
