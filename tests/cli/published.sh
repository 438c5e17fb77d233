#!/usr/bin/env bash
# The whole-step cost model against the public calibration set (issue 20):
# bench/published.sh over bench/published/ (32 plans of other projects'
# published timings), and its summary held to floors so the model cannot
# regress: every plan accepted, the geometric mean of predicted/published
# within 0.9-1.1, at least FLOOR_WITHIN25 percent of the rows within 25%, at
# most MAX_BAD_ORDERS of the table pairs published > 5% apart predicted in the
# other order, every multi-configuration group's `auto` pick the published
# fastest (or within 5%), and leave-one-table-out at least FLOOR_LOTO percent
# within 35%.  The floors are the model's state when the test was written
# (issue 20's done targets, 90% within 25% and 80% leave-one-out, are not all
# met: compiler/cost.h CALIBRATION and the issue's closing note say which rows miss and
# why); raise them as the model improves.
# The same over the out-of-sample set (bench/published.sh --set holdout: 35 plans
# of other models, GPUs and tables written before cpc's predictions for them
# were looked at, bench/published-holdout/README.md), held to its own floors
# (HOLD_*: its state after issue 20 round 4, 35 rows: 94% within 25%, 100% leave-one-out,
# every order, auto 2 of 3 groups: CogVideoX1.5 on 2 L40s picks ring 2, predicted within the
# 2% tie of CFG 2, which is 9% faster published; 28 rows were 86% / 89% when added), so a
# change that
# fits the calibration set and breaks what it does not see fails here too.
# The holdout runs with the runtime its sources state (--runtime: e.g. its
# Wan2.2 rows ran FlashAttention-3 on Hopper, which a plan without `runtime:`
# does not say).  No figure of the model is set from the holdout.  Takes ~5 s.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
FLOOR_WITHIN25=91
FLOOR_LOTO=91
MAX_BAD_ORDERS=1
HOLD_WITHIN25=94
HOLD_LOTO=97
HOLD_MAX_BAD_ORDERS=0
HOLD_MIN_AUTO=1
HOLD_MAX_BAD_AUTO=1
# check SET W25 LOTO BAD MIN_AUTO MAX_BAD_AUTO [--runtime]: the summary of bench/published.sh --set SET
# held to floors
check() {
out=$(CPC_BUILD_DIR="$B" bash bench/published.sh --set "$1" $7) || { echo "FAIL: bench/published.sh --set $1 failed"; echo "$out"; exit 1; }
line=$(printf '%s\n' "$out" | grep '^summary:')
[ -n "$line" ] || { echo "FAIL: no summary line"; printf '%s\n' "$out"; exit 1; }
echo "$line"
python3 - "$line" "$2" "$3" "$4" "$5" "$6" <<'PY' || { printf '%s\n' "$out"; exit 1; }
import re, sys
line, w25, loto, bad, min_auto, bad_auto = (sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]),
                                            int(sys.argv[5]), int(sys.argv[6]))
m = re.search(r"accepted (\d+)/(\d+), geomean ([0-9.]+), within25 (\d+)%, orders (\d+)/(\d+), "
              r"auto (\d+)/(\d+), loto35 (\d+)%", line)
assert m, line
acc, n, gm, w, ok_o, n_o, ok_a, n_a, lo = m.groups()
fails = []
if acc != n: fails.append("only %s of %s plans accepted" % (acc, n))
if not 0.9 <= float(gm) <= 1.1: fails.append("geometric mean %s outside 0.9-1.1" % gm)
if float(w) < w25: fails.append("within 25%%: %s%% < %g%%" % (w, w25))
if int(n_o) - int(ok_o) > bad: fails.append("orders: %s of %s pairs wrong" % (int(n_o) - int(ok_o), n_o))
if int(n_a) < min_auto or int(n_a) - int(ok_a) > bad_auto: fails.append("auto: %s of %s groups" % (ok_a, n_a))
if float(lo) < loto: fails.append("leave-one-table-out within 35%%: %s%% < %g%%" % (lo, loto))
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
PY
}
check calibration "$FLOOR_WITHIN25" "$FLOOR_LOTO" "$MAX_BAD_ORDERS" 2 0 ""
check holdout "$HOLD_WITHIN25" "$HOLD_LOTO" "$HOLD_MAX_BAD_ORDERS" "$HOLD_MIN_AUTO" "$HOLD_MAX_BAD_AUTO" --runtime
echo "published.sh: ok"
