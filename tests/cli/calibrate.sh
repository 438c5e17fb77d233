#!/usr/bin/env bash
# `cprun --calibrate` end to end (SPEC section 5): the profile YAML goes to
# stdout (or --profile-out FILE), the measurements to stderr; cpc prices a
# plan whose cluster.profile names the file (relative to the plan) with its
# figures; misuse is exit 2.  Quick mode (~1 s).  Runs from the repository
# root; binaries in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPRUN="$B/cprun"
CPC="$B/cpc"
[ -x "$CPRUN" ] || { echo "calibrate.sh: $CPRUN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
run() {
  local name=$1 want=$2; shift 2
  "$CPRUN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local got=$?
  if [ "$got" -ne "$want" ]; then
    fail "$name: cprun $* exited $got, expected $want"
    sed 's/^/    /' "$tmp/$name.err" >&2
  fi
}
has() { grep -q -- "$2" "$tmp/$1" || fail "$1 lacks '$2'"; }

# ---- the profile on stdout, the measurements on stderr ---------------------------------
run stdout 0 --calibrate --quick
for key in "device_profile: 1" "name: cpu-calibrated" attn_tflops: attn_tflops_fp32: mem_gbps: \
           intra_gbps: intra_p2p_gbps: inter_gbps: intra_latency_us: inter_latency_us: \
           memory_gb: ranks_per_core: op_overhead_us: cores: attn_io_gbps:; do
  has stdout.out "^$key"
done
has stdout.err "ranks at once"
has stdout.err "all-to-all"
has stdout.err "point to point"

# ---- --profile-out, then a plan that names it ------------------------------------------
mkdir -p "$tmp/plans"
run file 0 --calibrate --quick --profile-out "$tmp/plans/machine.yaml"
[ -s "$tmp/plans/machine.yaml" ] || fail "--profile-out wrote nothing"
[ -s "$tmp/file.out" ] && fail "--profile-out: stdout should be empty"
cat >"$tmp/plans/calibrated.yaml" <<'PLAN'
version: 1
model: {heads: 8, head_dim: 128, dtype: bf16}
input: {tokens: 2048}
cluster: {world_size: 4, device: cpu, profile: machine.yaml}
parallel: {variant: ulysses}
PLAN
sed '/profile:/s/, profile: machine.yaml//' "$tmp/plans/calibrated.yaml" >"$tmp/plans/preset.yaml"
if [ -x "$CPC" ]; then
  "$CPC" --check --format json "$tmp/plans/calibrated.yaml" >"$tmp/cal.json" 2>"$tmp/cal.err" \
    || { fail "cpc --check with the calibrated profile failed"; cat "$tmp/cal.err" >&2; }
  "$CPC" --check --format json "$tmp/plans/preset.yaml" >"$tmp/pre.json" 2>"$tmp/pre.err" \
    || fail "cpc --check with the cpu preset failed"
  python3 - "$tmp/cal.json" "$tmp/pre.json" "$tmp/plans/machine.yaml" <<'PY' || fail "the calibrated profile is not what prices the plan"
import json, sys
cal = json.load(open(sys.argv[1]))
pre = json.load(open(sys.argv[2]))
prof = dict(l.split(": ", 1) for l in open(sys.argv[3]) if ": " in l and not l.startswith("#"))
assert cal["ok"] and pre["ok"], (cal, pre)
pc, pp = cal["predicted"]["ms_per_layer"], pre["predicted"]["ms_per_layer"]
assert pc > 0 and abs(pc - pp) > 1e-9 * pp, (pc, pp)
# ulysses 1x4: every rank computes 2048^2 x 2 heads x 128 x 4 FLOPs; the time
# must be at least those FLOPs at the profile's rate, shared as it says
flops = 4.0 * 2048 * 2048 * 2 * 128
share = max(1.0, 4 / float(prof["cores"]))
floor_ms = flops / (float(prof["attn_tflops"]) * 1e12) * share * 1e3
assert pc >= floor_ms * (1 - 1e-9), (pc, floor_ms)
PY
  # a broken profile is a plan error naming the file
  printf 'device_profile: 1\nattn_tflops: fast\n' >"$tmp/plans/machine.yaml"
  "$CPC" --check "$tmp/plans/calibrated.yaml" >/dev/null 2>"$tmp/bad.err"
  [ $? -eq 1 ] || fail "cpc accepted a broken profile"
  grep -q "machine.yaml" "$tmp/bad.err" || fail "the broken profile's diagnostic does not name it"
fi

# ---- misuse ------------------------------------------------------------------------------
run plan-given 2 --calibrate --quick "$tmp/plans/preset.yaml"
has plan-given.err "takes no plan"
run quick-alone 2 "$tmp/plans/preset.yaml" --quick
run ranks-bad 2 --calibrate --calibrate-ranks 1
run nccl 2 --calibrate --transport nccl
run out-dir 2 --calibrate --quick --profile-out "$tmp/no/such/dir/p.yaml"
run help 0 --help
has help.out "--profile-out"
has help.out "--calibrate-ranks"

if [ "$fails" -ne 0 ]; then
  echo "calibrate.sh: $fails failure(s)" >&2
  exit 1
fi
echo "calibrate.sh: all checks passed"
