-- prelude.lua - helpers for cpc schedule scripts (SPEC section 6).
--
-- Embedded in cpc (CMakeLists.txt turns this file into a C header) and run
-- in every script's sandbox before the script itself.  It defines one global
-- table, `cpc`.  An op is a plain table (see compiler/lua_script.h):
--   {kind = "send", group = "ring", in = {"k_cur", "v_cur"}, peer = "(r+1)%R",
--    tag = 0, when = "s<R-1"}
-- Loops are {kind = "loop", count = "R", body = {...}}; inside a body the
-- ring step is the variable `s` of the expressions.
--
-- Functions that take a position work on one array (plan.ops or a loop's
-- body); cpc.find and cpc.walk give you the array and the index.

local priv = ...          -- private helpers from C: where() -> line, source
local where = priv.where

cpc = {}

-- The mesh of the program being scheduled: {R =, U =, P =} (set by cpc
-- before schedule() runs; nil in choose()).
cpc.mesh = nil

-- Raises `msg` at the innermost line of the script (not of this prelude).
local function fail(msg)
  local line, src = where()
  if line > 0 then error(("%s:%d: %s"):format(src, line, msg), 0) end
  error(msg, 0)
end

local function check_list(ops, fname)
  if type(ops) ~= "table" then
    fail(("cpc.%s: expected an array of ops, got %s"):format(fname, type(ops)))
  end
end

local function check_index(ops, i, fname, allow_end)
  local n = #ops + (allow_end and 1 or 0)
  if math.type(i) ~= "integer" or i < 1 or i > n then
    fail(("cpc.%s: index %s outside 1..%d"):format(fname, tostring(i), n))
  end
end

-- cpc.op(t): returns t after recording the script line that built it (the
-- op's `line`, used by diagnostics).  cpc.op{kind = "barrier", group = "world"}
function cpc.op(t)
  if type(t) ~= "table" then
    fail("cpc.op: expected a table, got " .. type(t))
  end
  t.line = (where())
  return t
end

-- cpc.copy(op): a deep copy of an op (body included), without its line.
function cpc.copy(op)
  local c = {}
  for k, v in pairs(op) do
    if type(v) == "table" then
      if k == "body" then
        local b = {}
        for i, o in ipairs(v) do b[i] = cpc.copy(o) end
        c[k] = b
      else
        local a = {}
        for i, x in ipairs(v) do a[i] = x end
        c[k] = a
      end
    elseif k ~= "line" then
      c[k] = v
    end
  end
  return c
end

-- cpc.walk(ops, fn): calls fn(op, list, index, loop) for every op in program
-- order, descending into loop bodies after the loop op itself (`loop` is the
-- enclosing loop op, nil at top level).  Stops early when fn returns false.
-- Returns false if stopped early, true otherwise.
function cpc.walk(ops, fn, _loop)
  check_list(ops, "walk")
  for i = 1, #ops do
    local op = ops[i]
    if fn(op, ops, i, _loop) == false then return false end
    if op.kind == "loop" and type(op.body) == "table" then
      if cpc.walk(op.body, fn, op) == false then return false end
    end
  end
  return true
end

-- cpc.eval(expr, coords): evaluates an expression of the op program's
-- grammar (compiler/ir/expr.h) in Lua, for coordinates {r, u, s} on the mesh
-- cpc.mesh (or coords.R / coords.U).  Supports + - * / % (non-negative
-- modulo, Euclidean division), comparisons, && || !, min, max, parentheses.
-- Returns an integer.
local function tokenize(src)
  local toks, i, n = {}, 1, #src
  while i <= n do
    local c = src:sub(i, i)
    if c:match("%s") then
      i = i + 1
    elseif c:match("%d") then
      local j = i
      while j <= n and src:sub(j, j):match("%d") do j = j + 1 end
      toks[#toks + 1] = {t = "num", v = math.tointeger(tonumber(src:sub(i, j - 1)))}
      i = j
    elseif c:match("%a") then
      local j = i
      while j <= n and src:sub(j, j):match("[%w_]") do j = j + 1 end
      toks[#toks + 1] = {t = "id", v = src:sub(i, j - 1)}
      i = j
    else
      local two = src:sub(i, i + 1)
      if two == "<=" or two == ">=" or two == "==" or two == "!=" or two == "&&" or two == "||" then
        toks[#toks + 1] = {t = two}
        i = i + 2
      else
        toks[#toks + 1] = {t = c}
        i = i + 1
      end
    end
  end
  return toks
end

local function divmod(a, b)
  if b == 0 then error("division by zero", 0) end
  local m = a % b            -- Lua: sign of b
  if m < 0 then m = m - b end -- b < 0: make it non-negative
  return (a - m) // b, m
end

function cpc.eval(expr, coords)
  if math.type(expr) == "integer" then return expr end
  if type(expr) ~= "string" then fail("cpc.eval: expected an expression string, got " .. type(expr)) end
  coords = coords or {}
  local mesh = cpc.mesh or {}
  local R = coords.R or mesh.R
  local U = coords.U or mesh.U
  local r, u, s = coords.r or 0, coords.u or 0, coords.s or 0
  local vars = {r = r, u = u, s = s, R = R, U = U,
                p = coords.p or (U and r * U + u), P = coords.P or (R and U and R * U)}
  local toks, pos = tokenize(expr), 1
  local function peek() return toks[pos] and toks[pos].t end
  local function take(t)
    if peek() ~= t then error(("'%s': expected '%s'"):format(expr, t), 0) end
    pos = pos + 1
  end
  local parse_or
  local function atom()
    local tk = toks[pos]
    if not tk then error(("'%s': unexpected end"):format(expr), 0) end
    pos = pos + 1
    if tk.t == "num" then return tk.v end
    if tk.t == "(" then local v = parse_or(); take(")"); return v end
    if tk.t == "id" and (tk.v == "min" or tk.v == "max") then
      take("("); local a = parse_or(); take(","); local b = parse_or(); take(")")
      if tk.v == "min" then return math.min(a, b) else return math.max(a, b) end
    end
    if tk.t == "id" and vars[tk.v] ~= nil then return vars[tk.v] end
    error(("'%s': unknown or unset '%s'"):format(expr, tostring(tk.v or tk.t)), 0)
  end
  local function unary()
    if peek() == "-" then pos = pos + 1; return -unary() end
    if peek() == "!" then pos = pos + 1; return unary() == 0 and 1 or 0 end
    return atom()
  end
  local function mul()
    local v = unary()
    while peek() == "*" or peek() == "/" or peek() == "%" do
      local op = peek(); pos = pos + 1
      local w = unary()
      if op == "*" then v = v * w
      else
        local q, m = divmod(v, w)
        if op == "/" then v = q else v = m end
      end
    end
    return v
  end
  local function add()
    local v = mul()
    while peek() == "+" or peek() == "-" do
      local op = peek(); pos = pos + 1
      local w = mul()
      if op == "+" then v = v + w else v = v - w end
    end
    return v
  end
  local cmps = {["<"] = function(a, b) return a < b end, ["<="] = function(a, b) return a <= b end,
                [">"] = function(a, b) return a > b end, [">="] = function(a, b) return a >= b end,
                ["=="] = function(a, b) return a == b end, ["!="] = function(a, b) return a ~= b end}
  local function cmp()
    local v = add()
    local f = cmps[peek() or ""]
    if f then pos = pos + 1; return f(v, add()) and 1 or 0 end
    return v
  end
  local function parse_and()
    local v = cmp()
    while peek() == "&&" do
      pos = pos + 1
      local w = cmp()
      v = (v ~= 0 and w ~= 0) and 1 or 0
    end
    return v
  end
  parse_or = function()
    local v = parse_and()
    while peek() == "||" do
      pos = pos + 1
      local w = parse_and()
      v = (v ~= 0 or w ~= 0) and 1 or 0
    end
    return v
  end
  local ok, v = pcall(function()
    local x = parse_or()
    if pos <= #toks then error(("'%s': unexpected '%s'"):format(expr, toks[pos].t), 0) end
    return x
  end)
  if not ok then fail("cpc.eval: " .. tostring(v)) end
  return v
end

-- cpc.find(ops, kind [, step [, rank]]): the ops of `kind` (any kind when
-- nil) in program order, each as {op =, list =, index =, loop =}.
-- Without `step`: every match, loop bodies included.  With `step` (a ring
-- step, 0-based): only ops inside a loop body that rank `rank` (default 0)
-- runs at that step: the loop's count exceeds `step` and the op's `when`
-- holds with s = step (evaluated with cpc.eval on cpc.mesh).
function cpc.find(ops, kind, step, rank)
  check_list(ops, "find")
  local coords
  if step ~= nil then
    if math.type(step) ~= "integer" or step < 0 then
      fail("cpc.find: step must be an integer >= 0, got " .. tostring(step))
    end
    local m = cpc.mesh or {}
    rank = rank or 0
    local U = m.U or 1
    coords = {r = rank // U, u = rank % U, s = step}
  end
  local found = {}
  local function visit(list, loop)
    for i = 1, #list do
      local op = list[i]
      local take = kind == nil or op.kind == kind
      if take and step ~= nil then
        take = loop ~= nil and (op.when == nil or cpc.eval(op.when, coords) ~= 0)
      end
      if take then found[#found + 1] = {op = op, list = list, index = i, loop = loop} end
      if op.kind == "loop" and type(op.body) == "table" then
        local enter = true
        if step ~= nil then
          local c = {r = coords.r, u = coords.u, s = 0}
          enter = (op.when == nil or cpc.eval(op.when, c) ~= 0) and step < cpc.eval(op.count, c)
        end
        if enter then visit(op.body, op) end
      end
    end
  end
  visit(ops, nil)
  return found
end

-- Buffers an op reads and writes, as sets {name = true}.  Conservative:
-- merge reads its accumulator too, swap reads and writes both names, a send
-- reads its buffers until its wait, a recv writes its buffers until its
-- wait; a loop accesses what its body does.  `list` (optional) lets a wait
-- find the send/recv ops of its tag in the same array.
local function add_all(set, arr)
  if type(arr) == "table" then
    for _, b in ipairs(arr) do set[b] = true end
  end
end

function cpc.access(op, list)
  local reads, writes = {}, {}
  local k = op.kind
  if k == "loop" then
    for _, o in ipairs(op.body or {}) do
      local r, w = cpc.access(o, op.body)
      for b in pairs(r) do reads[b] = true end
      for b in pairs(w) do writes[b] = true end
    end
  elseif k == "swap" then
    add_all(reads, op["in"]); add_all(writes, op["in"])
  elseif k == "merge" then
    add_all(reads, op["in"]); add_all(reads, op.out); add_all(writes, op.out)
  elseif k == "wait" then
    for _, o in ipairs(list or {}) do
      if (o.kind == "send" or o.kind == "recv") and o.tag == op.tag then
        add_all(reads, o["in"]); add_all(writes, o.out)
      end
    end
  else
    add_all(reads, op["in"]); add_all(writes, op.out)
  end
  return reads, writes
end

local function intersects(a, b)
  for x in pairs(a) do if b[x] then return x end end
  return nil
end

local collective = {all_to_all = true, all_gather = true, barrier = true}

-- cpc.depends(a, b [, list]): nil when ops a and b may run in either order;
-- else a string saying why not (a data dependency: read-after-write,
-- write-after-read, write-after-write on a buffer; a wait and a send/recv of
-- its tag; two collectives of one group).
function cpc.depends(a, b, list)
  local ra, wa = cpc.access(a, list)
  local rb, wb = cpc.access(b, list)
  local x = intersects(wa, rb) or intersects(ra, wb) or intersects(wa, wb)
  if x then return ("both use buffer '%s' and one writes it"):format(x) end
  local function wait_pair(w, o)
    return w.kind == "wait" and (o.kind == "send" or o.kind == "recv") and o.tag == w.tag
  end
  if wait_pair(a, b) or wait_pair(b, a) then
    return ("the wait completes the %s of tag %s"):format(a.kind == "wait" and b.kind or a.kind, tostring(a.tag or b.tag))
  end
  if collective[a.kind] and collective[b.kind] and a.group == b.group then
    return ("two collectives of group %s keep their order"):format(tostring(a.group))
  end
  return nil
end

-- cpc.swap(ops, i, j): exchanges ops[i] and ops[j] when that is legal: no
-- dependency (cpc.depends) between the two, nor between either and an op in
-- between.  Raises an error naming the conflict otherwise.
function cpc.swap(ops, i, j)
  check_list(ops, "swap")
  check_index(ops, i, "swap")
  check_index(ops, j, "swap")
  if i == j then return end
  if i > j then i, j = j, i end
  local a, b = ops[i], ops[j]
  local why = cpc.depends(a, b, ops)
  if why then
    fail(("cpc.swap: cannot swap ops %d (%s) and %d (%s): %s"):format(i, a.kind, j, b.kind, why))
  end
  for k = i + 1, j - 1 do
    local m = ops[k]
    why = cpc.depends(a, m, ops) or cpc.depends(m, b, ops)
    if why then
      fail(("cpc.swap: cannot swap ops %d (%s) and %d (%s) across op %d (%s): %s"):format(
        i, a.kind, j, b.kind, k, m.kind, why))
    end
  end
  ops[i], ops[j] = b, a
end

-- cpc.move(ops, from, to): moves ops[from] to position `to` by legal
-- adjacent swaps (cpc.swap's rules).
function cpc.move(ops, from, to)
  check_list(ops, "move")
  check_index(ops, from, "move")
  check_index(ops, to, "move")
  local step = from < to and 1 or -1
  for k = from, to - step, step do
    local a, b = ops[k], ops[k + step]
    local why = cpc.depends(a, b, ops)
    if why then
      fail(("cpc.move: cannot move op %d (%s) past op %d (%s): %s"):format(from, a.kind, k + step, b.kind, why))
    end
    ops[k], ops[k + step] = b, a
  end
end

-- cpc.insert_barrier(ops, i [, group]): inserts a barrier of `group`
-- (default "world") at position i (1..#ops+1) and returns it.
function cpc.insert_barrier(ops, i, group)
  check_list(ops, "insert_barrier")
  check_index(ops, i, "insert_barrier", true)
  group = group or "world"
  if group ~= "ring" and group ~= "ulysses" and group ~= "world" then
    fail("cpc.insert_barrier: group must be ring, ulysses or world, got " .. tostring(group))
  end
  local b = {kind = "barrier", group = group, ["in"] = {}, out = {}, line = (where())}
  table.insert(ops, i, b)
  return b
end

-- cpc.remove(ops, pred): removes every op of the array (not of loop bodies)
-- for which pred(op) is true; returns how many.
function cpc.remove(ops, pred)
  check_list(ops, "remove")
  local n, j = 0, 1
  local len = #ops
  for i = 1, len do
    local op = ops[i]
    if pred(op) then n = n + 1 else ops[j] = op; j = j + 1 end
  end
  for i = j, len do ops[i] = nil end
  return n
end

-- cpc.buffer(buffers, name): the buffer table called `name`, or nil.
function cpc.buffer(buffers, name)
  for _, b in ipairs(buffers) do
    if b.name == name then return b end
  end
  return nil
end
