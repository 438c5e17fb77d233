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
golden cp018-training     1 --check tests/cases/ring-anything-training.yaml
golden cp019-causal       1 --check tests/cases/ring-anything-causal.yaml
golden cp001-no-parallel  1 --check tests/cases/no-parallelism.yaml
golden cp022-causal-segs  1 --check --set input.mask=causal plans/flux1-dev-1024.yaml
golden fallback-warning   0 --check tests/cases/fallback-ulysses-1008.yaml
golden auto-all-fail      1 --check --set input.mode=training --set parallel.variant=auto plans/flux1-dev-1008.yaml

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
assert a["ok"] is True and a["selected"] == {"variant": "ulysses", "ring_degree": 1, "ulysses_degree": 4}, a
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
cand = {"variant", "ring_degree", "ulysses_degree", "ok", "codes", "predicted"}
got = [(k["variant"], k["ring_degree"], k["ulysses_degree"], k["ok"], k["codes"]) for k in x["candidates"]]
for k in x["candidates"]:
    assert set(k) == cand, k.keys()
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
[ "$(grep -c '^[ *] [a-z_]* ' "$tmp/explain.out")" -eq 6 ] || fail "explain: header + 5 candidates expected"

if [ "$fails" -ne 0 ]; then
  echo "diagnostics.sh: $fails failure(s)" >&2
  exit 1
fi
echo "diagnostics.sh: all passed"
