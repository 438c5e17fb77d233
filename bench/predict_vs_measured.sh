#!/usr/bin/env bash
# bench/predict_vs_measured.sh - the cost model's prediction against cprun's
# measurement on this machine, for plans across every axis.
#
# 1. `cprun --calibrate` measures this machine once per round and writes a
#    device profile (attention rate, its IO and softmax terms, memory-bound
#    ops, transport, core sharing, GEMM rate);
# 2. for every plan of the list below (FLUX.1-dev shapes scaled so that an
#    iteration takes well under a second on 2 cores, plus two small plans
#    whose fixed costs and head_dim matter), with `cluster.device: cpu` and
#    `cluster.profile:` the calibrated file:
#      predicted = `cpc --check --format json`  -> predicted.ms_per_layer
#      measured  = `cprun --check --format json` -> ms_per_iter (median over
#                  ITERS iterations of the slowest rank; the float64 check
#                  runs after the timed iterations and must pass)
#    and prints measured / predicted.  Plans that split over cfg_degree or
#    tp_degree run as C*T groups of R x U ranks (cprun, README "The cfg and
#    tensor-parallel axes").
# The machine is shared: the load average is printed before and after each
# round (ROUNDS=2 repeats everything, calibration included).
#
# Usage: bench/predict_vs_measured.sh
# Environment: CPC_BUILD_DIR (default build), ITERS (default 3; the small
# plans, a few ms each, run ITERS_SMALL, default 31: their median must not be
# one scheduler time slice of another process), ROUNDS (default 1), CALIBRATE_ARGS (e.g. --quick), ONLY (a regular expression:
# run only the plans whose label matches).
# Needs python3 (JSON).  About 1-2 minutes per round on a loaded 2-core
# machine.  Exit status: 0 (every plan ran and passed its check), 1 (a check
# failed or a tool failed), 2 (usage).
set -u
cd "$(dirname "$0")/.."
B="${CPC_BUILD_DIR:-build}"
ITERS="${ITERS:-3}"
ITERS_SMALL="${ITERS_SMALL:-31}"
ROUNDS="${ROUNDS:-1}"
ONLY="${ONLY:-.}"
for exe in cpc cprun; do
  [ -x "$B/$exe" ] || { echo "predict_vs_measured.sh: $B/$exe not built (cmake --build $B --target cpc cprun)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
profile="$tmp/profile.yaml"
export OPENBLAS_NUM_THREADS=1

FLUX=plans/flux1-dev-1008.yaml   # text 512 first, then the image; 24 heads x 128, bf16
# image 384x384 -> 24 x 24 = 576 tokens, S = 1088 (divisible by 8);
# image 368x368 -> 23 x 23 = 529 tokens, S = 1041 (odd: only the anything variants)
IMG384="--set input.segments[1].image.height=384 --set input.segments[1].image.width=384"
IMG368="--set input.segments[1].image.height=368 --set input.segments[1].image.width=368"
# small: text 64 + image 192x192 (144 tokens) = 208 tokens, 8 heads
SMALL="--set input.segments[0].tokens=64 --set input.segments[1].image.height=192 --set input.segments[1].image.width=192 --set model.heads=8"

# label | plan | --set words (world size, variant, axes, shape)
PLANS=(
  "none-1|$FLUX|$IMG384 --set cluster.world_size=1 --set parallel.variant=none"
  "ring-4|$FLUX|$IMG384 --set cluster.world_size=4 --set parallel.variant=ring"
  "ulysses-4|$FLUX|$IMG384 --set cluster.world_size=4 --set parallel.variant=ulysses"
  "unified-2x2|$FLUX|$IMG384 --set cluster.world_size=4 --set parallel.variant=unified --set parallel.ring_degree=2"
  "ulysses_anything-4|$FLUX|$IMG368 --set cluster.world_size=4 --set parallel.variant=ulysses_anything"
  "ring_anything-4|$FLUX|$IMG368 --set cluster.world_size=4 --set parallel.variant=ring_anything"
  "ring-4-allgather|$FLUX|$IMG384 --set cluster.world_size=4 --set parallel.variant=ring --set schedule.rotate=allgather --set schedule.overlap=false"
  "small-ring-4-d64|$FLUX|$SMALL --set model.head_dim=64 --set cluster.world_size=4 --set parallel.variant=ring"
  "small-ulysses-4-d16|$FLUX|$SMALL --set model.head_dim=16 --set cluster.world_size=4 --set parallel.variant=ulysses"
  "cfg2-ulysses-2|$FLUX|$IMG384 --set input.batch=2 --set cluster.world_size=4 --set parallel.cfg_degree=2 --set parallel.variant=ulysses"
  "tp2-ring-2|$FLUX|$IMG384 --set cluster.world_size=4 --set parallel.tp_degree=2 --set parallel.variant=ring"
  "cfg2-tp2-none|$FLUX|$IMG384 --set input.batch=2 --set cluster.world_size=4 --set parallel.cfg_degree=2 --set parallel.tp_degree=2 --set parallel.variant=none"
)

status=0
ratios="$tmp/ratios"
: >"$ratios"
for round in $(seq 1 "$ROUNDS"); do
  echo "# round $round: load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
  # shellcheck disable=SC2086
  if ! "$B/cprun" --calibrate ${CALIBRATE_ARGS:-} --profile-out "$profile" 2>"$tmp/calibrate.log"; then
    cat "$tmp/calibrate.log" >&2
    exit 1
  fi
  grep -v 'profile written' "$tmp/calibrate.log" | sed 's/^cprun --calibrate: /# calibrate: /'
  printf '%-5s %-20s %-7s %-18s %12s %12s %8s\n' round plan "C x T" "variant R x U" predicted_ms measured_ms ratio
  for entry in "${PLANS[@]}"; do
    label=${entry%%|*}
    rest=${entry#*|}
    plan=${rest%%|*}
    # shellcheck disable=SC2206
    sets=(${rest#*|} --set cluster.device=cpu --set "cluster.profile=$profile")
    [[ "$label" =~ $ONLY ]] || continue
    if ! "$B/cpc" --check --format json "$plan" "${sets[@]}" >"$tmp/pred.json" 2>"$tmp/pred.err"; then
      echo "predict_vs_measured.sh: cpc rejected $label:" >&2
      cat "$tmp/pred.err" >&2
      status=1
      continue
    fi
    rc=0
    iters=$ITERS
    [[ "$label" == small-* ]] && iters=$ITERS_SMALL
    "$B/cprun" "$plan" "${sets[@]}" --check --warmup 1 --iters "$iters" --format json \
      >"$tmp/run.json" 2>"$tmp/run.err" || rc=$?
    line=$(python3 - "$tmp/pred.json" "$tmp/run.json" "$tmp/run.err" "$round" "$label" "$rc" "$ratios" <<'EOF'
import json, sys
pred_f, run_f, err_f, rnd, label, rc, ratios = sys.argv[1:]
p = json.load(open(pred_f))
sel = p["selected"]
ct = "%dx%d" % (sel.get("cfg_degree", 1), sel.get("tp_degree", 1))
var = "%s %dx%d" % (sel["variant"], sel["ring_degree"], sel["ulysses_degree"])
pm = p["predicted"]["ms_per_layer"]
run = None
try:
    run = json.loads(open(run_f).read().splitlines()[0])
except Exception:
    pass
head = "%-5s %-20s %-7s %-18s %12.2f" % (rnd, label, ct, var, pm)
err = open(err_f).read().strip().splitlines()
msg = next((l for l in err if "error" in l), err[0] if err else "")
if run is None or run.get("ms_per_iter") is None:
    print("%s %12s %8s  FAILED (exit %s): %s|fail" % (head, "-", "-", rc, msg[:110]))
    sys.exit(0)
m = run["ms_per_iter"]
chk = run.get("check") or {}
ok = int(rc) == 0 and chk.get("pass", False)
r = m / pm
open(ratios, "a").write("%.6f\n" % r)
print("%s %12.2f %8.3f%s|%s" % (head, m, r, "" if ok else "  CHECK FAILED (exit %s)" % rc,
                                  "ok" if ok else "fail"))
EOF
)
    echo "${line%|*}"
    [ "${line##*|}" = fail ] && status=1
  done
  echo "# round $round: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
done
python3 - "$ratios" <<'EOF'
import math, sys
r = [float(x) for x in open(sys.argv[1]) if x.strip()]
if r:
    g = math.exp(sum(math.log(x) for x in r) / len(r))
    worst = max(max(x, 1 / x) for x in r)
    print("# %d runs: measured/predicted geometric mean %.3f, range %.3f..%.3f, worst factor %.2f"
          % (len(r), g, min(r), max(r), worst))
EOF
exit "$status"
