#!/usr/bin/env bash
# Mistakes a new user makes, answered with one clear message and the SPEC's
# exit status:
#   cpc --check on an artifact (a file starting with "artifact_version:",
#     whatever its name): exactly one diagnostic "X is a cpc artifact, not a
#     plan: run it with cprun", exit 2 (not a list of CP101/CP104 errors).
#   cpc --arch that this NVRTC cannot target (sm_10, sm_80a): a usage error
#     (2) naming the supported archs (with NVRTC; skipped without it).
#   cprun --format json: a usage error (even before --format), a missing
#     file, a rejected plan, a training plan that cannot train (CP018: a
#     Lua schedule script), an unwritable output, a runtime failure (--backend cuda without a GPU): stdout is still one
#     JSON object with the SPEC section 5 keys (null where unknown), "ok":
#     false and "error": {"code", "message"}; the exit status is unchanged.
#   Grammar: "1 candidate", "1 rank"; --rank N past the end names the
#     ranks there are ("the plan has ranks 0..3").
# Runs from the repository root; binaries in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPC="$B/cpc"
CPRUN="$B/cprun"
[ -x "$CPC" ] && [ -x "$CPRUN" ] || { echo "user_errors.sh: $CPC or $CPRUN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CPC_CACHE_DIR="$tmp/cache"
fails=0
. tests/cli/lib/harness.sh  # fail, has, t

cat >"$tmp/small.yaml" <<'EOF'
version: 1
name: small
model: {heads: 8, head_dim: 32, dtype: fp32}
input: {tokens: 128}
cluster: {world_size: 4, device: cpu}
parallel: {variant: unified}
EOF
cat >"$tmp/one.yaml" <<'EOF'
version: 1
name: one
model: {heads: 4, head_dim: 16, dtype: fp32}
input: {tokens: 64}
cluster: {world_size: 1, device: cpu}
EOF

# ---- an artifact given to cpc ----------------------------------------------------------------
t compile 0 "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/small.cplan"
t check-artifact 2 "$CPC" --check "$tmp/small.cplan"
has check-artifact.err "small.cplan is a cpc artifact, not a plan: run it with cprun"
[ "$(wc -l <"$tmp/check-artifact.err")" -eq 1 ] || fail "check-artifact: one diagnostic expected, got $(wc -l <"$tmp/check-artifact.err")"
grep -q "CP10" "$tmp/check-artifact.err" && fail "check-artifact: plan-file errors reported"
cp "$tmp/small.cplan" "$tmp/renamed.yaml"
t check-artifact-yaml 2 "$CPC" --check "$tmp/renamed.yaml"
has check-artifact-yaml.err "renamed.yaml is a cpc artifact, not a plan: run it with cprun"
t compile-artifact 2 "$CPC" --no-kernels "$tmp/small.cplan" -o "$tmp/again.cplan"
[ ! -e "$tmp/again.cplan" ] || fail "compile-artifact: wrote an artifact"
t check-artifact-json 2 "$CPC" --check --format json "$tmp/small.cplan"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); d=r["diagnostics"]; assert not r["ok"] and len(d)==1 and "run it with cprun" in d[0]["message"], r' \
  "$tmp/check-artifact-json.out" || fail "check-artifact-json: one diagnostic expected"
t worst 2 "$CPC" --check "$tmp/small.yaml" "$tmp/small.cplan"

# ---- cprun --lse without --output: nothing would be written -----------------------------
t lse-no-output 2 "$CPRUN" "$tmp/small.yaml" --lse
has lse-no-output.err "give --output"

# ---- --arch that NVRTC cannot target -----------------------------------------------------------
t arch-probe 0 "$CPC" "$tmp/small.yaml" -o "$tmp/probe.cplan"
if grep -q "built without the CUDA toolkit" "$tmp/arch-probe.err"; then
  echo "user_errors.sh: cpc has no NVRTC here; the --arch checks skipped"
else
  t arch-10 2 "$CPC" --arch sm_10 "$tmp/small.yaml" -o "$tmp/a.cplan"
  has arch-10.err "error: --arch sm_10: not supported by this NVRTC (supported: sm_"
  grep -q "NVRTC_ERROR" "$tmp/arch-10.err" && fail "arch-10: the raw NVRTC error is shown"
  [ ! -e "$tmp/a.cplan" ] || fail "arch-10: wrote an artifact"
  t arch-80a 2 "$CPC" --arch sm_80a "$tmp/small.yaml" -o "$tmp/a.cplan"
  has arch-80a.err "--arch sm_80a: not supported by this NVRTC"
fi
t arch-malformed 2 "$CPC" --arch sm_9a0 "$tmp/small.yaml" -o "$tmp/a.cplan"

# ---- cprun --format json on every failure -----------------------------------------------------
# jf NAME WANT CODE ARGS... : exit WANT, stdout one JSON object, error.code CODE
# (a prefix: "CP0" matches any CP0xx)
jf() {
  local name=$1 want=$2 code=$3; shift 3
  t "$name" "$want" "$CPRUN" "$@"
  python3 - "$tmp/$name.out" "$code" "$want" <<'EOF' || { fail "$name: stdout is not the failure object"; cat "$tmp/$name.out" >&2; }
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
spec = {"ok", "variant", "ring_degree", "ulysses_degree", "ranks", "backend", "transport",
        "attention", "ms_per_iter", "tflops", "bytes_sent_per_rank",
        "peak_memory_bytes_per_rank", "check"}
assert spec <= set(r) and set(r) - spec == {"error"}, sorted(r)
assert r["ok"] is False and r["check"] is None and r["ms_per_iter"] is None, r
e = r["error"]
assert e["code"].startswith(sys.argv[2]), e
assert e["message"] and e["exit_status"] == int(sys.argv[3]), e
EOF
}
jf json-usage-first 2 usage --bogus-option "$tmp/small.yaml" --format json
jf json-usage-eq    2 usage "$tmp/small.yaml" --iters 0 --format=json
jf json-no-plan     2 usage --format json
jf json-missing     2 io "$tmp/no-such.yaml" --format json
jf json-rejected    2 CP0 "$tmp/small.yaml" --set input.tokens=126 --format json
has json-rejected.err "CP010"
jf json-training    2 CP018 "$tmp/small.yaml" --set input.mode=training --set "schedule.script=$PWD/lua/examples/no_overlap.lua" --format json
jf json-output      2 io "$tmp/small.yaml" --output "$tmp/nodir/o.safetensors" --format json
sed 's/world_size: 4/world_size: 8/' "$tmp/small.cplan" >"$tmp/tampered.cplan"
jf json-tampered    2 input "$tmp/tampered.cplan" --format json
has json-tampered.out "hash"
"$CPRUN" "$tmp/small.yaml" --backend cuda --iters 1 --warmup 0 --format json >"$tmp/cuda.out" 2>"$tmp/cuda.err"
rc=$?
if [ "$rc" -eq 3 ]; then
  jf json-cuda 3 unsupported "$tmp/small.yaml" --backend cuda --iters 1 --warmup 0 --format json
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["variant"] == "unified" and r["ranks"] == 4, r' \
    "$tmp/json-cuda.out" || fail "json-cuda: what is known of the plan is not in the object"
elif [ "$rc" -ne 0 ]; then
  fail "cuda: --backend cuda exited $rc"
fi
t json-ok 0 "$CPRUN" "$tmp/small.yaml" --iters 1 --warmup 0 --format json
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["ok"] and "error" not in r, r' "$tmp/json-ok.out" \
  || fail "json-ok: a report with an error key"

# ---- messages --------------------------------------------------------------------------------------
t explain-one 0 "$CPC" --explain "$tmp/one.yaml"
has explain-one.out "one.yaml: 1 candidate,"
t check-one 0 "$CPC" --check "$tmp/one.yaml"
has check-one.out "ms per forward (1 layer),"

# input.steps and runtime keys (read by the whole-step model only) without
# model.parameters: one warning naming them, at the first (the plan is still valid: exit 0)
sed 's/dtype: fp32}/dtype: fp32, mlp_ratio: 3}/; s/tokens: 64}/tokens: 64, steps: 20}/' \
  "$tmp/one.yaml" >"$tmp/inert.yaml"
printf 'runtime: {framework: compiled}\n' >>"$tmp/inert.yaml"
t inert 0 "$CPC" --check "$tmp/inert.yaml"
has inert.err "inert.yaml:4:[0-9]*: warning: input.steps, runtime.framework have no effect without model.parameters"
grep -q "mlp_ratio" "$tmp/inert.err" && fail "inert: model structure keys named (they describe the model)"
has inert.out "1 warning"
t inert-params 0 "$CPC" --check "$tmp/inert.yaml" --set model.parameters=1000000
grep -q "no effect" "$tmp/inert-params.err" && fail "inert-key warning with model.parameters"
t explain-five 0 "$CPC" --explain --set parallel.variant=ulysses "$tmp/small.yaml"
has explain-five.out "small.yaml: 5 candidates,"
t rank-past 2 "$CPC" --check --dump-schedule --rank 4 "$tmp/small.yaml"
has rank-past.err "error: --rank 4: the plan has ranks 0..3"
t rank-one 2 "$CPC" --check --dump-schedule --rank 1 "$tmp/one.yaml"
has rank-one.err "error: --rank 1: the plan has only rank 0"
t dry-one 0 "$CPRUN" "$tmp/one.yaml" --dry-run
has dry-one.out "mesh 1 x 1 (ring x ulysses), 1 rank$"
t run-one 0 "$CPRUN" "$tmp/one.yaml" --iters 1 --warmup 0
has run-one.out "mesh 1 x 1 (ring x ulysses), 1 rank$"

# a directory given as cluster.profile is an I/O error naming the path
mkdir "$tmp/profdir"
sed 's/device: cpu}/device: cpu, profile: profdir}/' "$tmp/small.yaml" >"$tmp/prof.yaml"
t profile-dir 2 "$CPC" --check "$tmp/prof.yaml"
has profile-dir.err "profdir"
grep -q "1 ranks" "$tmp/dry-one.out" "$tmp/run-one.out" && fail "'1 ranks' printed"

# model.attention: linear is priced (cpc --check) but never run as softmax:
# cpc -o and cprun refuse it (exit 2) and no artifact is written
sed 's/dtype: fp32}/dtype: fp32, attention: linear}/' "$tmp/small.yaml" >"$tmp/linear.yaml"
t linear-check 0 "$CPC" --check "$tmp/linear.yaml"
# ... and --check says so already, at the key (a warning: exit 0)
has linear-check.err "linear.yaml:3:[0-9]*: warning: model.attention: linear is priced only"
t linear-compile 2 "$CPC" "$tmp/linear.yaml" -o "$tmp/linear.cplan"
has linear-compile.err "runs softmax attention only"
[ -e "$tmp/linear.cplan" ] && fail "an artifact was written for a linear-attention plan"
t linear-run 2 "$CPRUN" "$tmp/linear.yaml" --iters 1 --warmup 0
has linear-run.err "model.attention is linear"

if [ "$fails" -ne 0 ]; then
  echo "user_errors.sh: $fails failure(s)" >&2
  exit 1
fi
echo "user_errors.sh: all checks passed"
