#!/usr/bin/env bash
# bench/predict.sh - does the cost model predict what cprun measures?
#
# 1. `cprun --calibrate` measures this machine and writes a device profile;
# 2. for the FLUX.1-dev 1008 plan scaled to run in a fraction of a second per
#    iteration (image 512x512 -> 1024 tokens + 512 text tokens = 1536 tokens;
#    24 heads x 128, bf16, as the model), on 4 local CPU ranks, for ring and
#    ulysses (and any other variant in $VARIANTS), with
#    `cluster.device: cpu` and `cluster.profile:` the calibrated file:
#      predicted = `cpc --check --format json` -> predicted.ms_per_layer
#      measured  = `cprun --format json --no-check` -> ms_per_iter (median
#                  over --iters of the slowest rank)
#    and the ratio measured / predicted (goal: within 1.5x, stretch 1.2x).
# With ROUNDS=N the whole thing (calibration included) is repeated N times:
# other processes on the machine change both the calibration and the runs.
#
# Usage: bench/predict.sh [--strict]   (--strict: exit 1 when a ratio is
#        outside 1.5x).  Environment: CPC_BUILD_DIR (default build),
#        PLAN (default plans/flux1-dev-1008.yaml), VARIANTS (default
#        "ring ulysses"), ITERS (default 5), ROUNDS (default 1), EXTRA_SETS
#        (more --set KEY=VALUE words), CALIBRATE_ARGS (e.g. --quick).
# Needs python3 (JSON).  Takes ~10-20 s per round on a 2-core machine.
set -u
cd "$(dirname "$0")/.."
B="${CPC_BUILD_DIR:-build}"
PLAN="${PLAN:-plans/flux1-dev-1008.yaml}"
VARIANTS="${VARIANTS:-ring ulysses}"
ITERS="${ITERS:-5}"
ROUNDS="${ROUNDS:-1}"
strict=0
[ "${1:-}" = "--strict" ] && strict=1
for exe in cpc cprun; do
  [ -x "$B/$exe" ] || { echo "predict.sh: $B/$exe not built (cmake --build $B)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
profile="$tmp/profile.yaml"
export OPENBLAS_NUM_THREADS=1

sets=(--set 'input.segments[1].image.height=512' --set 'input.segments[1].image.width=512'
      --set cluster.device=cpu --set cluster.world_size=4 --set "cluster.profile=$profile")
# shellcheck disable=SC2206
extra=(${EXTRA_SETS:-})
for e in "${extra[@]}"; do sets+=(--set "$e"); done

worst=0
printf '%-6s %-10s %12s %12s %8s  %s\n' round variant predicted_ms measured_ms ratio verdict
for round in $(seq 1 "$ROUNDS"); do
  # shellcheck disable=SC2086
  if ! "$B/cprun" --calibrate ${CALIBRATE_ARGS:-} --profile-out "$profile" 2>"$tmp/calibrate.log"; then
    cat "$tmp/calibrate.log" >&2
    exit 2
  fi
  sed 's/^/# /' "$tmp/calibrate.log" | grep -v 'profile written' >&2
  for v in $VARIANTS; do
    if ! "$B/cpc" --check --format json "$PLAN" "${sets[@]}" --set "parallel.variant=$v" \
         >"$tmp/pred.json" 2>"$tmp/pred.err"; then
      echo "predict.sh: cpc rejected $PLAN with variant $v:" >&2
      cat "$tmp/pred.err" >&2
      exit 2
    fi
    if ! "$B/cprun" "$PLAN" "${sets[@]}" --set "parallel.variant=$v" --no-check --warmup 1 \
         --iters "$ITERS" --format json >"$tmp/run.json" 2>"$tmp/run.err"; then
      echo "predict.sh: cprun failed for variant $v:" >&2
      cat "$tmp/run.err" >&2
      exit 2
    fi
    line=$(python3 - "$tmp/pred.json" "$tmp/run.json" "$round" "$v" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["predicted"]["ms_per_layer"]
m = json.load(open(sys.argv[2]))["ms_per_iter"]
r = m / p
off = max(r, 1 / r)
verdict = "within 1.2x" if off <= 1.2 else "within 1.5x" if off <= 1.5 else "OUTSIDE 1.5x"
print("%-6s %-10s %12.1f %12.1f %8.3f  %s|%.6f" % (sys.argv[3], sys.argv[4], p, m, r, verdict, off))
EOF
)
    echo "${line%|*}"
    off=${line##*|}
    worst=$(python3 -c "print(max($worst, $off))")
  done
done
echo "worst factor (max of ratio, 1/ratio): $worst (goal <= 1.5, stretch <= 1.2)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
if [ "$strict" -eq 1 ] && python3 -c "import sys; sys.exit(0 if $worst <= 1.5 else 1)"; then
  exit 0
elif [ "$strict" -eq 1 ]; then
  exit 1
fi
exit 0
