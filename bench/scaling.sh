#!/usr/bin/env bash
# bench/scaling.sh - CPU runtime scaling and memory, printed as ratios measured
# in the same run (these machines are noisy; this is a benchmark, not a test).
#
#  1. speed-up of 4 local ranks over 1 rank on the FLUX.1-dev 1008x1008 plan
#     (ulysses_anything and ring_anything vs variant none, same inputs);
#     goal >= 1.5x on 2 cores (stretch 1.8x);
#  2. ring P2P peak memory per rank as reported by cprun for P = 2, 4, 8:
#     O(S/P) means peak x P stays about constant.
# Usage: bench/scaling.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
plan=plans/flux1-dev-1008.yaml
iters=${ITERS:-3}
run() { "$B/cprun" "$plan" --no-check --iters "$iters" --warmup 1 --format json "$@"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

echo "== 1. speed-up of 4 local ranks over 1 ($plan, $(nproc) cores, median of $iters) =="
t1=$(run --set cluster.world_size=1 --set parallel.variant=none | field ms_per_iter)
printf "%-28s %10.1f ms\n" "1 rank (none)" "$t1"
for v in ulysses_anything ring_anything; do
  t4=$(run --set cluster.world_size=4 --set parallel.variant=$v | field ms_per_iter)
  printf "%-28s %10.1f ms   speed-up %.2fx (goal 1.5x, stretch 1.8x)\n" "4 ranks ($v)" "$t4" \
    "$(python3 -c "print($t1/$t4)")"
done

echo "== 2. ring P2P peak memory per rank (O(S/P)) =="
base=""
for p in 2 4 8; do
  m=$(run --iters 1 --set cluster.world_size=$p --set parallel.variant=ring_anything \
        --set schedule.rotate=p2p | field peak_memory_bytes_per_rank)
  ag=$(run --iters 1 --set cluster.world_size=$p --set parallel.variant=ring_anything \
        --set schedule.rotate=allgather | field peak_memory_bytes_per_rank)
  [ -n "$base" ] || base=$((m * p))
  printf "P=%-2d p2p %8.2f MiB  peak x P / (peak x P at P=2) = %.2f   allgather %8.2f MiB (%.2fx p2p)\n" \
    "$p" "$(python3 -c "print($m/1048576)")" "$(python3 -c "print($m*$p/$base)")" \
    "$(python3 -c "print($ag/1048576)")" "$(python3 -c "print($ag/$m)")"
done
