#!/usr/bin/env bash
# `cprun --tune PLAN` end to end (issue 15, choice by measurement): every
# valid candidate is run and its median ms per layer written into the
# profile (`measured:`); a plan whose cluster.profile names the file selects
# `auto` by the measured times (even against the model's order), `cpc
# --explain` shows predicted and measured side by side (text column
# `measured`, JSON `measured_ms_per_layer`), measurements of another problem
# do not apply, re-tuning merges; misuse is exit 2.  ~1 s.  Runs from the
# repository root; binaries in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPRUN="$B/cprun"
CPC="$B/cpc"
[ -x "$CPRUN" ] && [ -x "$CPC" ] || { echo "tune.sh: $CPRUN or $CPC not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

cat >"$tmp/plan.yaml" <<'PLAN'
version: 1
model: {heads: 4, head_dim: 32, dtype: bf16}
input: {tokens: 512, mask: causal}
cluster: {world_size: 4, device: cpu}
parallel: {variant: auto}
PLAN
sed 's/device: cpu}/device: cpu, profile: prof.yaml}/' "$tmp/plan.yaml" >"$tmp/tuned.yaml"

# ---- tune: every valid candidate measured ---------------------------------------------
"$CPRUN" --tune "$tmp/plan.yaml" --iters 2 --profile-out "$tmp/prof.yaml" >"$tmp/tune.out" 2>"$tmp/tune.err" \
  || { fail "cprun --tune failed"; cat "$tmp/tune.err" >&2; }
[ -s "$tmp/tune.out" ] && fail "--tune --profile-out: stdout should be empty"
grep -q "ms per layer measured" "$tmp/tune.err" || fail "--tune logs no candidate"
"$CPC" --explain --format json "$tmp/plan.yaml" >"$tmp/model.json" 2>/dev/null \
  || fail "cpc --explain of the plan failed"
"$CPC" --explain --format json "$tmp/tuned.yaml" >"$tmp/tuned.json" 2>"$tmp/tuned.err" \
  || { fail "cpc --explain with the tuned profile failed"; cat "$tmp/tuned.err" >&2; }
python3 - "$tmp/prof.yaml" "$tmp/model.json" "$tmp/tuned.json" <<'PY' || fail "the tuned profile or its selection is wrong"
import json, re, sys
prof = open(sys.argv[1]).read()
entries = re.findall(r'variant: (\w+), ring_degree: (\d+), ulysses_degree: (\d+), backend: cpu, ms_per_layer: ([0-9.e+-]+)', prof)
got = {(v, int(r), int(u)): float(ms) for v, r, u, ms in entries}
model = json.load(open(sys.argv[2]))
valid = {(c["variant"], c["ring_degree"], c["ulysses_degree"]) for c in model["candidates"] if c["ok"]}
assert valid and set(got) == valid, (sorted(got), sorted(valid))
assert all(ms > 0 for ms in got.values()), got
assert "device_profile: 1" in prof and "attn_tflops:" in prof
tuned = json.load(open(sys.argv[3]))
for c in tuned["candidates"]:
    k = (c["variant"], c["ring_degree"], c["ulysses_degree"])
    if c["ok"]:
        assert abs(c["measured_ms_per_layer"] - got[k]) <= 1e-5 * got[k], (c, got[k])
        assert c["predicted"]["ms_per_layer"] > 0
    else:
        assert "measured_ms_per_layer" not in c
# auto follows the measurement: the fastest measured (within the 2% tie rule)
best = min(got.values())
s = tuned["selected"]
assert got[(s["variant"], s["ring_degree"], s["ulysses_degree"])] <= 1.02 * best, (s, got)
PY

# ---- a profile whose measurements invert the model's order ---------------------------
key=$(sed -n 's/.*key: "\([^"]*\)".*/\1/p' "$tmp/prof.yaml" | head -1)
[ -n "$key" ] || fail "no key in the tuned profile"
sel_model=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["selected"]; print(s["variant"])' "$tmp/model.json")
[ "$sel_model" = ulysses ] || fail "the model should pick ulysses for this plan (got $sel_model)"
grep -v -e '^measured:' -e '^  - {' -e '^# measured' "$tmp/prof.yaml" >"$tmp/base.yaml"
{ cat "$tmp/base.yaml"
  echo "measured:"
  echo "  - {key: \"$key\", variant: ulysses, ring_degree: 1, ulysses_degree: 4, backend: cpu, ms_per_layer: 50}"
  echo "  - {key: \"$key\", variant: unified, ring_degree: 2, ulysses_degree: 2, backend: cpu, ms_per_layer: 40}"
  echo "  - {key: \"$key\", variant: ring, ring_degree: 4, ulysses_degree: 1, backend: cpu, ms_per_layer: 10}"
  echo "  - {key: \"$key\", variant: ulysses_anything, ring_degree: 1, ulysses_degree: 4, backend: cpu, ms_per_layer: 45}"
  echo "  - {key: \"B=9 other shape\", variant: ulysses, ring_degree: 1, ulysses_degree: 4, backend: cpu, ms_per_layer: 1}"
} >"$tmp/prof.yaml"
"$CPC" --explain "$tmp/tuned.yaml" >"$tmp/inv.txt" 2>&1 || fail "cpc --explain (inverted) failed"
grep -q "selected ring 4x1" "$tmp/inv.txt" || { fail "auto does not follow the measured times"; cat "$tmp/inv.txt" >&2; }
grep -q "ms/layer *measured" "$tmp/inv.txt" || fail "--explain lacks the measured column"
grep -Eq "^\* ring +4x1 +ok +[0-9.]+ +10\.000" "$tmp/inv.txt" || fail "--explain: ring's measured 10 ms not shown"
"$CPC" --check "$tmp/tuned.yaml" >"$tmp/inv.chk" 2>&1 || fail "cpc --check (inverted) failed"
grep -q "ok: ring 4x1" "$tmp/inv.chk" || fail "cpc --check does not select by measurement"

# ---- measurements of another problem do not apply ------------------------------------
sed 's/tokens: 512/tokens: 768/' "$tmp/tuned.yaml" >"$tmp/other.yaml"
"$CPC" --explain --format json "$tmp/other.yaml" >"$tmp/other.json" 2>/dev/null || fail "cpc --explain (other shape) failed"
python3 - "$tmp/other.json" <<'PY' || fail "a measurement of another shape applied"
import json, sys
d = json.load(open(sys.argv[1]))
assert all("measured_ms_per_layer" not in c for c in d["candidates"]), d["candidates"]
assert d["selected"]["variant"] == "ulysses", d["selected"]
PY
"$CPC" --explain "$tmp/other.yaml" 2>/dev/null | grep -q " measured " && fail "--explain shows a measured column without measurements"

# ---- default destination: the plan's cluster.profile, merged --------------------------
"$CPRUN" --tune "$tmp/other.yaml" --iters 1 >"$tmp/t2.out" 2>"$tmp/t2.err" \
  || { fail "cprun --tune (profile in place) failed"; cat "$tmp/t2.err" >&2; }
grep -q "written to .*prof.yaml" "$tmp/t2.err" || fail "--tune did not update the plan's profile"
grep -q 'S=\[768\]' "$tmp/prof.yaml" || fail "the new shape's measurements are missing"
grep -q "ms_per_layer: 10}" "$tmp/prof.yaml" || fail "re-tuning dropped the other shape's measurements"
grep -q "B=9 other shape" "$tmp/prof.yaml" || fail "re-tuning dropped an unrelated measurement"
"$CPC" --explain --format json "$tmp/other.yaml" 2>/dev/null | grep -q measured_ms_per_layer \
  || fail "the re-tuned shape is not measured in --explain"

# ---- a malformed measurement is a plan error naming the file ----------------------------
{ cat "$tmp/base.yaml"; echo "measured:"; echo "  - {key: \"$key\", variant: ring, ms_per_layer: -1}"; } >"$tmp/prof.yaml"
"$CPC" --check "$tmp/tuned.yaml" >/dev/null 2>"$tmp/bad.err" && fail "cpc accepted a malformed measurement"
grep -q "prof.yaml" "$tmp/bad.err" || fail "the malformed measurement's diagnostic does not name the file"

# ---- the outer axes: every (C, T, R, U) candidate is measured and its measurement used ----
cat >"$tmp/axes.yaml" <<'PLAN'
version: 1
model: {heads: 8, head_dim: 16, dtype: fp32}
input: {batch: 2, tokens: 128}
cluster: {world_size: 4, device: cpu}
parallel: {variant: auto, cfg_degree: auto, tp_degree: auto}
PLAN
sed 's/device: cpu}/device: cpu, profile: axes_prof.yaml}/' "$tmp/axes.yaml" >"$tmp/axes_tuned.yaml"
"$CPRUN" --tune "$tmp/axes.yaml" --iters 1 --profile-out "$tmp/axes_prof.yaml" >/dev/null 2>"$tmp/axes.err" \
  || { fail "cprun --tune on a four-axis plan failed"; cat "$tmp/axes.err" >&2; }
"$CPC" --explain --format json "$tmp/axes_tuned.yaml" >"$tmp/axes.json" 2>/dev/null \
  || fail "cpc --explain with the four-axis profile failed"
python3 - "$tmp/axes.json" "$tmp/axes_prof.yaml" <<'PY' || fail "four-axis candidates are not all measured"
import json, sys
d = json.load(open(sys.argv[1]))
ok = [c for c in d["candidates"] if c["ok"]]
# (C, T) pairs that share R x U (ulysses 1x2 under cfg 2 and under tp 2) are different problems
pairs = {(c.get("cfg_degree", 1), c.get("tp_degree", 1)) for c in ok}
assert len(pairs) >= 4, pairs
missing = [c for c in ok if "measured_ms_per_layer" not in c]
assert not missing, missing
n = sum(1 for l in open(sys.argv[2]) if l.strip().startswith("- {key:"))
assert n == len(ok), (n, len(ok))
PY

# ---- a plan naming its profile before the profile exists (new-user trial) ------------
# `cluster.profile: new.yaml` written first, then tuned: the preset prices it,
# the tune creates the file; tuning into another file leaves it missing: exit 3
# naming the file, nothing written
mkdir "$tmp/first"
sed 's/device: cpu}/device: cpu, profile: new.yaml}/' "$tmp/plan.yaml" >"$tmp/first/plan.yaml"
"$CPRUN" --tune "$tmp/first/plan.yaml" --iters 1 --profile-out "$tmp/first/other.yaml" >/dev/null 2>"$tmp/first.err"
rc=$?
[ "$rc" -ne 0 ] && grep -q "cluster.profile .*new.yaml: cannot open.*drop --profile-out" "$tmp/first.err" \
  && [ ! -e "$tmp/first/other.yaml" ] || fail "tune into another file with the plan's profile missing: rc $rc: $(cat "$tmp/first.err")"
"$CPRUN" --tune "$tmp/first/plan.yaml" --iters 1 >/dev/null 2>"$tmp/first.err" \
  || fail "tune of a plan whose profile does not exist yet failed: $(cat "$tmp/first.err")"
grep -q "ms_per_layer" "$tmp/first/new.yaml" 2>/dev/null || fail "the plan's profile was not created"
"$CPC" --check "$tmp/first/plan.yaml" >/dev/null 2>&1 || fail "cpc --check with the created profile failed"
rm "$tmp/first/new.yaml"
"$CPC" --check "$tmp/first/plan.yaml" >/dev/null 2>&1 && fail "cpc --check with a missing profile should fail"

# ---- misuse --------------------------------------------------------------------------------
"$CPRUN" --tune >/dev/null 2>&1; [ $? -eq 2 ] || fail "--tune without a plan should exit 2"
"$CPRUN" --tune --calibrate "$tmp/plan.yaml" >/dev/null 2>&1; [ $? -eq 2 ] || fail "--tune --calibrate should exit 2"
"$CPRUN" --tune --output "$tmp/o.safetensors" "$tmp/plan.yaml" >/dev/null 2>&1; [ $? -eq 2 ] || fail "--tune --output should exit 2"
touch "$tmp/x.cplan"
"$CPRUN" --tune "$tmp/x.cplan" >/dev/null 2>&1; [ $? -eq 2 ] || fail "--tune on an artifact should exit 2"

[ "$fails" -eq 0 ] && echo "tune.sh: ok"
exit $((fails > 0))
