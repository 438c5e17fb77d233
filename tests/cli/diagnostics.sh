#!/usr/bin/env bash
# CLI behaviour of `cpc` end to end (SPEC section 3): diagnostics on stderr
# byte for byte against tests/golden/*.stderr, exit statuses 0/1/2 (worst
# over files), --format json (one object per file and line, SPEC keys),
# --explain's candidates, --help and --version.
# Runs from the repository root; the binary is $CPC_BUILD_DIR/cpc.
# UPDATE_GOLDEN=1 rewrites the golden files from the current output (review
# the diff before committing it).
set -u
cd "$(dirname "$0")/../.."
CPC="${CPC_BUILD_DIR:-build}/cpc"
GOLDEN=tests/golden
[ -x "$CPC" ] || { echo "diagnostics.sh: $CPC not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# expect_status NAME WANT ARGS... : runs cpc, checks the exit status, keeps
# stdout/stderr in $tmp/NAME.{out,err}
expect_status() {
  local name=$1 want=$2; shift 2
  "$CPC" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local got=$?
  [ "$got" -eq "$want" ] || fail "$name: cpc $* exited $got, expected $want"
}

# golden NAME WANT ARGS... : as expect_status, and stderr must equal the golden file
golden() {
  local name=$1
  expect_status "$@"
  if [ "${UPDATE_GOLDEN:-0}" = 1 ]; then
    cp "$tmp/$name.err" "$GOLDEN/$name.stderr"
  elif ! diff -u "$GOLDEN/$name.stderr" "$tmp/$name.err" >"$tmp/$name.diff"; then
    fail "$name: stderr differs from $GOLDEN/$name.stderr:"; cat "$tmp/$name.diff" >&2
  fi
}

# ---- rejections and warnings, byte for byte ----------------------------------
golden spec-example       1 --check --set parallel.variant=ulysses plans/flux1-dev-1008.yaml
golden cp011-seed-1008    1 --check tests/cases/seed-flux-1008-ulysses.yaml
golden cp010-unified-1008 1 --check tests/cases/seed-flux-1008-unified.yaml
golden cp003-below-world  1 --check tests/cases/degrees-below-world.yaml
golden cp013-unified-2    1 --check tests/cases/unified-world2.yaml
golden cp012-gqa          1 --check tests/cases/gqa28-7-ulysses2.yaml
golden cp018-lifted       0 --check tests/cases/ring-anything-training.yaml
golden cp019-causal       1 --check tests/cases/ring-anything-causal.yaml
golden cp001-no-parallel  1 --check tests/cases/no-parallelism.yaml
golden cp022-causal-segs  1 --check --set input.mask=causal plans/flux1-dev-1024.yaml
golden fallback-warning   0 --check tests/cases/fallback-ulysses-1008.yaml
golden auto-all-fail      1 --check --set input.mask=causal --set parallel.variant=auto plans/flux1-dev-1008.yaml

# the summary goes to stdout, not stderr
grep -q '^tests/cases/fallback-ulysses-1008.yaml: ok: ulysses_anything 1x4' "$tmp/fallback-warning.out" \
  || fail "fallback-warning: summary missing on stdout"
grep -q 'rejected' "$tmp/cp011-seed-1008.out" || fail "cp011-seed-1008: summary missing on stdout"

# ---- exit statuses ----------------------------------------------------------------
expect_status plans-ok        0 --check plans/*.yaml
expect_status plan-rejected   1 --check tests/cases/seed-flux-1008-ulysses.yaml
expect_status loader-reject   1 --check tests/cases/bad-heads-string.yaml
expect_status missing-file    2 --check tests/cases/no-such-plan.yaml
expect_status bad-option      2 --check --no-such-option plans/flux1-dev-1024.yaml
expect_status bad-format      2 --check --format xml plans/flux1-dev-1024.yaml
expect_status bad-set         2 --check --set cluster.world_size plans/flux1-dev-1024.yaml
# an index out of range is a usage error too, naming the valid range
expect_status set-index       2 --check --set 'input.segments[2].tokens=5' plans/flux1-dev-1024.yaml
grep -q "has 2 elements, so \[2\] is out of range (valid: 0..1)" "$tmp/set-index.err" \
  || fail "set-index: $(cat "$tmp/set-index.err")"
expect_status no-file         2 --check
expect_status worst-1         1 --check plans/flux1-dev-1024.yaml tests/cases/seed-flux-1008-ring.yaml
expect_status worst-2         2 --check tests/cases/seed-flux-1008-ring.yaml tests/cases/no-such-plan.yaml plans/flux1-dev-1024.yaml
grep -q 'flux1-dev-1024.yaml: ok' "$tmp/worst-2.out" || fail "worst-2: the files after a failing one still run"
expect_status help            0 --help
grep -q -- '--check' "$tmp/help.out" || fail "help: no usage text on stdout"
expect_status version         0 --version
grep -Eq '^cpc [0-9]+\.[0-9]+\.[0-9]+' "$tmp/version.out" || fail "version: '$(cat "$tmp/version.out")'"
[ -s "$tmp/bad-option.err" ] && [ ! -s "$tmp/bad-option.out" ] || fail "bad-option: message belongs on stderr"

# ---- JSON ----------------------------------------------------------------------------
expect_status json-check 1 --check --format json plans/flux1-dev-1024.yaml tests/cases/seed-flux-1008-ulysses.yaml \
  tests/cases/fallback-ulysses-1008.yaml
[ ! -s "$tmp/json-check.err" ] || fail "json-check: nothing on stderr with --format json"
expect_status json-explain 0 --explain --format json tests/cases/auto-1008.yaml
expect_status json-missing 2 --check --format json tests/cases/no-such-plan.yaml
python3 - "$tmp" <<'PY' || fail "JSON output does not match SPEC section 3"
import json, sys
tmp = sys.argv[1]
def lines(name):
    with open(f"{tmp}/{name}.out") as f:
        return [json.loads(l) for l in f.read().splitlines()]
top = {"file", "ok", "diagnostics", "selected", "predicted"}
diag = {"severity", "code", "message", "file", "line", "column", "hint"}
objs = lines("json-check")
assert len(objs) == 3, objs
for o in objs:
    assert top <= set(o), o.keys()
    for d in o["diagnostics"]:
        assert set(d) == diag, d.keys()
        assert d["severity"] in ("error", "warning", "note")
a, b, c = objs
assert a["ok"] is True and a["selected"] == {"variant": "ulysses", "ring_degree": 1, "ulysses_degree": 4, "cfg_degree": 1, "tp_degree": 1}, a
assert a["diagnostics"] == []
pk = {"ms_per_layer", "ms_per_forward", "memory_bytes_per_rank", "bytes_sent_per_rank"}
assert set(a["predicted"]) == pk and all(a["predicted"][k] > 0 for k in pk), a["predicted"]
assert abs(a["predicted"]["ms_per_forward"] - 57 * a["predicted"]["ms_per_layer"]) < 1e-6 * a["predicted"]["ms_per_forward"]
assert b["predicted"] is None
assert b["ok"] is False and b["selected"] is None
e = b["diagnostics"][0]
assert e["severity"] == "error" and e["code"] == "CP011" and e["line"] == 13 and e["column"] == 7, e
assert e["hint"] == "variant ulysses_anything or ring_anything runs this plan", e
assert b["diagnostics"][1]["severity"] == "note" and b["diagnostics"][1]["code"] is None
assert b["diagnostics"][1]["hint"] is None
assert c["ok"] is True and c["selected"]["variant"] == "ulysses_anything"
assert c["diagnostics"][0]["severity"] == "warning" and c["diagnostics"][0]["code"] == "CP011"
(x,) = lines("json-explain")
assert top | {"candidates"} <= set(x)
# SPEC section 3: every candidate names all four degrees (1 where the plan has no axes)
cand = {"variant", "ring_degree", "ulysses_degree", "cfg_degree", "tp_degree", "ok", "codes", "predicted"}
got = [(k["variant"], k["ring_degree"], k["ulysses_degree"], k["ok"], k["codes"]) for k in x["candidates"]]
for k in x["candidates"]:
    assert set(k) == cand, k.keys()
    assert k["cfg_degree"] == 1 and k["tp_degree"] == 1, k
    assert (k["predicted"] is not None) == k["ok"], k
assert got == [("ulysses", 1, 4, False, ["CP011"]), ("unified", 2, 2, False, ["CP010"]),
               ("ring", 4, 1, False, ["CP010"]), ("ulysses_anything", 1, 4, True, []),
               ("ring_anything", 4, 1, True, [])], got
assert x["selected"]["variant"] == "ulysses_anything"
(m,) = lines("json-missing")
assert m["ok"] is False and m["diagnostics"][0]["code"] is None and m["diagnostics"][0]["line"] is None
PY

# ---- --explain (text) -------------------------------------------------------------------
expect_status explain 0 --explain tests/cases/auto-1008.yaml
grep -Eq '^\* ulysses_anything +1x4 +ok' "$tmp/explain.out" || fail "explain: selected row missing"
grep -Eq '^  ulysses +1x4 +CP011' "$tmp/explain.out" || fail "explain: rejected row missing"
# each code of the verdict column is explained once, below the table
grep -q "^  CP011: ulysses: segment 'image' has 3969 tokens" "$tmp/explain.out" || fail "explain: CP011 not explained"
[ "$(grep -c '^  CP0[0-9]*: ' "$tmp/explain.out")" -eq "$(grep -o 'CP0[0-9]*' "$tmp/explain.out" | sort -u | wc -l)" ] ||
  fail "explain: one line per rule code expected"
[ "$(grep -c '^[ *] [a-z_]* ' "$tmp/explain.out")" -eq 6 ] || fail "explain: header + 5 candidates expected"

# ---- the outer axes: cfg_degree x tp_degree (SPEC section 1, "All four axes") -----------
# 8 ranks, batch 2, both auto: every valid (C, T, R, U) with C*T*R*U = 8 is listed.
expect_status explain4 0 --explain plans/flux1-dev-1024.yaml --set cluster.world_size=8 \
  --set parallel.variant=auto --set input.batch=2 --set parallel.cfg_degree=auto --set parallel.tp_degree=auto
for row in '2x2 +ring +2x1 +ok' '2x1 +unified +2x2 +ok' '1x2 +ulysses +1x4 +ok' '2x2 +ulysses +1x2 +ok'; do
  grep -Eq "^[ *] $row" "$tmp/explain4.out" || fail "explain4: no row '$row'"
done
grep -q 'C x T' "$tmp/explain4.out" || fail "explain4: no C x T column"
# a plain plan keeps its columns
grep -q 'C x T' "$tmp/explain.out" && fail "explain: C x T column on a plan without the axes"
# CP005 / CP006 / CP003 with hints that run the plan when applied
expect_status cp005 1 --check plans/flux1-dev-1024.yaml --set cluster.world_size=8 --set parallel.cfg_degree=2
grep -q 'error\[CP005\].*hint: parallel.cfg_degree: 1 runs this plan' "$tmp/cp005.err" || fail "cp005: $(cat "$tmp/cp005.err")"
expect_status cp006 1 --check plans/flux1-dev-1024.yaml --set cluster.world_size=8 --set parallel.tp_degree=16
grep -q 'error\[CP006\].*hint: parallel.tp_degree: 4 runs this plan' "$tmp/cp006.err" || fail "cp006: $(cat "$tmp/cp006.err")"
grep -q 'error\[CP003\].*C\*T\*R\*U' "$tmp/cp006.err" || fail "cp003: $(cat "$tmp/cp006.err")"
expect_status cp006fix 0 --check plans/flux1-dev-1024.yaml --set cluster.world_size=8 --set parallel.tp_degree=4
expect_status split2221 0 --check --format json plans/flux1-dev-1024.yaml --set cluster.world_size=8 \
  --set input.batch=2 --set parallel.cfg_degree=2 --set parallel.tp_degree=2 --set parallel.variant=ring
python3 - "$tmp/split2221.out" <<'PY' || fail "split2221: JSON selected"
import json, sys
a = json.loads(open(sys.argv[1]).read().splitlines()[0])
assert a["selected"] == {"variant": "ring", "ring_degree": 2, "ulysses_degree": 1, "cfg_degree": 2, "tp_degree": 2}, a
PY

# ---- hints work when applied with --set ------------------------------------------------
# Plans with explicit degrees and diffusers flags (the QA reproducers): every
# alternative of every hint, applied key by key with --set, must be accepted
# (and select the "(variant RxU)" it names).
mkdir -p "$tmp/hints"
cat >"$tmp/hints/ulysses6.yaml" <<'YAML'
version: 1
model: {heads: 4, head_dim: 16, dtype: fp32}
input: {tokens: 48}
cluster: {world_size: 6, device: cpu}
parallel: {variant: ulysses, ulysses_degree: 6}
YAML
cat >"$tmp/hints/unified-r1.yaml" <<'YAML'
version: 1
model: {heads: 4, head_dim: 16, dtype: fp32}
input: {tokens: 64}
cluster: {world_size: 7, device: cpu}
parallel: {variant: unified, ring_degree: 1}
YAML
cat >"$tmp/hints/ua-flag-u4.yaml" <<'YAML'
version: 1
model: {heads: 4, head_dim: 16, dtype: fp32}
input:
  segments: [{name: text, tokens: 2}, {name: img, tokens: 64}]
cluster: {world_size: 4, device: cpu}
parallel: {ulysses_degree: 4, ulysses_anything: true}
YAML
cat >"$tmp/hints/unified-r1-gpn4.yaml" <<'YAML'
version: 1
model: {heads: 2, head_dim: 8, dtype: bf16, kv_heads: 1}
input: {batch: 2, tokens: 8, mask: causal}
cluster: {world_size: 7, device: cpu, gpus_per_node: 4}
parallel: {variant: unified, ring_degree: 1}
YAML
cat >"$tmp/hints/ua-variant-and-flag.yaml" <<'YAML'
version: 1
model: {heads: 2, head_dim: 16, dtype: fp16, kv_heads: 1}
input: {tokens: 17, kv: {tokens: 12}}
cluster: {world_size: 3, device: cpu}
parallel: {variant: ulysses_anything, ulysses_anything: true}
YAML
cat >"$tmp/hints/ring-causal-segs.yaml" <<'YAML'
version: 1
model: {heads: 8, head_dim: 16, dtype: fp32}
input:
  segments: [{name: a, tokens: 24}, {name: b, tokens: 40}]
  mask: causal
cluster: {world_size: 4, device: cpu}
parallel: {variant: ring, ring_degree: 4, ulysses_degree: 1}
YAML
python3 - "$CPC" "$tmp/hints" <<'PY' || fail "a hint does not run its plan when applied with --set"
import json, re, subprocess, sys, glob
cpc, d = sys.argv[1], sys.argv[2]
def check(path, sets):
    cmd = [cpc, "--check", "--format", "json", path]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if not p.stdout:  # a usage error: the hint is not KEY: VALUE
        return {"ok": False, "selected": None, "diagnostics": [{"code": p.stderr.strip()}]}
    return json.loads(p.stdout.splitlines()[0])
bad, applied = [], 0
for f in sorted(glob.glob(d + "/*.yaml")):
    j = check(f, [])
    assert not j["ok"], f + " should be rejected"
    hints = [x["hint"] for x in j["diagnostics"] if x["severity"] == "error"]
    assert hints and all(hints), (f, hints)
    for hint in hints:
        for alt in hint.split("; or "):
            m = re.fullmatch(r"variant (.*) runs this plan", alt)
            if m:
                tries = [(["parallel.variant=" + n.split()[0]], None) for n in re.split(r", | or ", m.group(1))]
            else:
                m = re.fullmatch(r"(.*) runs this plan(?: \((\w+) (\d+)x(\d+)\))?", alt)
                if not m:
                    bad.append((f, hint, alt, "not KEY: VALUE runs this plan"))
                    continue
                sets = [kv.replace(": ", "=", 1) for kv in m.group(1).split(", ")]
                tries = [(sets, m.group(2) and [m.group(2), int(m.group(3)), int(m.group(4))])]
            for sets, want in tries:
                applied += 1
                r = check(f, sets)
                sel = r["selected"] and [r["selected"][k] for k in ("variant", "ring_degree", "ulysses_degree")]
                if not r["ok"] or (want and sel != want):
                    bad.append((f, hint, sets, [x["code"] for x in r["diagnostics"]], sel))
for b in bad:
    print("hint fails:", *b, file=sys.stderr)
assert applied >= 6 and not bad
PY

# ---- CP051 always has a position; CP050 and CP051 count ops from 1 -------------------
cat >"$tmp/ring4.yaml" <<'YAML'
version: 1
model: {heads: 4, head_dim: 8, dtype: fp32}
input: {tokens: 16}
cluster: {world_size: 4, device: cpu}
parallel: {variant: ring}
YAML
cat >"$tmp/nosend.lua" <<'LUA'
function schedule(plan)
  cpc.walk(plan.ops, function(op)
    if op.kind == "send" then op.when = "r != 0" end
  end)
end
LUA
cat >"$tmp/divzero.lua" <<'LUA'
function schedule(plan)
  cpc.walk(plan.ops, function(op)
    if op.kind == "send" then op.peer = "(r+1)/0" end
  end)
end
LUA
expect_status lua-cp051 1 --check --lua "$tmp/nosend.lua" "$tmp/ring4.yaml"
expect_status lua-cp050 1 --check --lua "$tmp/divzero.lua" "$tmp/ring4.yaml"
# Issue 13: no "too large to verify": 2^20 ranks are proved (symbolically), and a
# script cannot get an edited program past the verifier by making it look large.
expect_status proved-1m 0 --check "$tmp/ring4.yaml" --set cluster.world_size=1048576 --set input.tokens=16777216
cat >"$tmp/deadloop.lua" <<'LUA'
function schedule(plan)
  table.insert(plan.ops, 1, {kind = "loop", count = "1048576", when = "0",
                             body = {{kind = "loop", count = "1048576", body = {{kind = "barrier", group = "world"}}}}})
  cpc.walk(plan.ops, function(op) if op.kind == "loop" and op.count == "R" then op.count = "R-1" end end)
end
LUA
cat >"$tmp/irregular.lua" <<'LUA'
function schedule(plan)
  cpc.walk(plan.ops, function(op)
    if op.kind == "send" then op.when = "s<R-1 && p != 7" end
  end)
end
LUA
expect_status lua-deadloop 1 --check --lua "$tmp/deadloop.lua" "$tmp/ring4.yaml" --set cluster.world_size=16384 --set input.tokens=65536
expect_status lua-irregular 1 --check --lua "$tmp/irregular.lua" "$tmp/ring4.yaml" --set cluster.world_size=16384 --set input.tokens=65536
for n in lua-cp051 lua-cp050 proved-1m lua-deadloop lua-irregular; do
  ! grep -q '^cpc: ' "$tmp/$n.err" || fail "$n: a diagnostic without file:line:col: $(grep '^cpc: ' "$tmp/$n.err")"
done
grep -q "^$tmp/ring4.yaml:5:21: error\[CP051\]: .*ops\[2\]\.body\[5\] wait" "$tmp/lua-cp051.err" \
  || fail "lua-cp051: error not at the plan's variant key, or 0-based: $(cat "$tmp/lua-cp051.err")"
grep -q "^$tmp/nosend.lua:3:[0-9]*: note: ops\[2\]\.body\[1\] send was changed" "$tmp/lua-cp051.err" \
  || fail "lua-cp051: no note at the script line that changed the send: $(cat "$tmp/lua-cp051.err")"
grep -q "^$tmp/divzero.lua:3:[0-9]*: error\[CP050\]: .*ops\[2\]\.body\[1\]: peer" "$tmp/lua-cp050.err" \
  || fail "lua-cp050: not at the edit's line, or another op path: $(cat "$tmp/lua-cp050.err")"
! grep -q "CP051" "$tmp/proved-1m.err" || fail "proved-1m: CP051 at 2^20 ranks: $(cat "$tmp/proved-1m.err")"
grep -q "error\[CP051\]: .*ops\[4\] copy: acc is incomplete" "$tmp/lua-deadloop.err" \
  || fail "lua-deadloop: the dropped ring step behind a dead loop is not reported: $(cat "$tmp/lua-deadloop.err")"
grep -q "^$tmp/irregular.lua:3:[0-9]*: error\[CP051\]: .*cannot be proven: it is irregular at ops\[2\]\.body\[1\] send" "$tmp/lua-irregular.err" \
  || fail "lua-irregular: no CP051 at the script line that made the program irregular: $(cat "$tmp/lua-irregular.err")"
! grep -q "warning\[CP051\]" "$tmp/lua-deadloop.err" "$tmp/lua-irregular.err" || fail "a CP051 warning"

# fa3 is Hopper-only: elsewhere a warning at the key (priced as fa2), exit 0;
# on Hopper nothing
expect_status fa3-ada 0 --check --set runtime.attention_kernel=fa3 --set cluster.device=l40s plans/flux1-dev-1024.yaml
grep -q "warning: attention_kernel fa3 .*Hopper (sm_90) only; device l40s is sm_89" "$tmp/fa3-ada.err" \
  || fail "fa3-ada: no Hopper-only warning: $(cat "$tmp/fa3-ada.err")"
expect_status fa3-h100 0 --check --set runtime.attention_kernel=fa3 --set cluster.device=h100-sxm plans/flux1-dev-1024.yaml
! grep -q "fa3" "$tmp/fa3-h100.err" || fail "fa3-h100: a warning on Hopper: $(cat "$tmp/fa3-h100.err")"

if [ "$fails" -ne 0 ]; then
  echo "diagnostics.sh: $fails failure(s)" >&2
  exit 1
fi
echo "diagnostics.sh: all passed"
