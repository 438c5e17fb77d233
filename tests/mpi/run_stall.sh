#!/usr/bin/env bash
# Issue 14: the MPI stall limit.  One rank of a cprun job under mpirun is
# stopped with SIGSTOP in the middle of its iterations; the other ranks'
# waits poll with a deadline (--timeout 2), so the job must end within
# seconds (not hang) with exit status 3 and a message that names the waiting
# rank and the op it waits in.  Both directions (rank 1 stopped: rank 0
# waits; rank 0 stopped: rank 1 waits), and the default limit is reported.
# Each mpirun has 60 s (a hang is a failure, not a stuck test).
#   usage: run_stall.sh CPRUN [MPIRUN]
set -u
cprun=${1:?usage: run_stall.sh CPRUN [MPIRUN]}
mpirun=${2:-mpirun}
here=$(cd "$(dirname "$0")" && pwd)
plan=$here/cprun-small.yaml
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# the wrapper: rank $STOP_RANK stops itself (SIGSTOP) 1.5 s after it started
cat >"$tmp/stop.sh" <<EOS
#!/bin/sh
if [ "\${OMPI_COMM_WORLD_RANK:-\${PMIX_RANK:-}}" = "\$STOP_RANK" ]; then
  ( sleep 1.5; kill -STOP \$\$ ) &
fi
exec "$cprun" "\$@"
EOS
chmod +x "$tmp/stop.sh"

for stop in 1 0; do
  waiter=$((1 - stop))
  t0=$(date +%s%N)
  STOP_RANK=$stop timeout -k 5 60 "$mpirun" --allow-run-as-root --oversubscribe -x STOP_RANK -np 2 \
    "$tmp/stop.sh" "$plan" --set cluster.world_size=2 --no-check --warmup 0 --iters 1000000 \
    --timeout 2 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "run_stall: rank $stop stopped: exit $rc after $ms ms"
  if [ $rc -ne 3 ]; then
    echo "run_stall: FAILED: rank $stop stopped: exit $rc, expected 3"; status=1
  fi
  if [ $ms -gt 30000 ]; then
    echo "run_stall: FAILED: rank $stop stopped: the job took $ms ms to end"; status=1
  fi
  if ! grep -q "rank $waiter: stalled: waited 2 s in .*\(recv from\|send to\|barrier\|all_to_all_v\|all_gather_v\)" "$tmp/err"; then
    echo "run_stall: FAILED: rank $stop stopped: no message naming rank $waiter and its op"; status=1
    sed 's/^/  | /' "$tmp/err" | head -12
  fi
done

# without --timeout the limit is the default (README: max(300 s, 20 x predicted))
timeout -k 5 60 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$cprun" "$plan" \
  --set cluster.world_size=2 --iters 1 --warmup 0 --verbose >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] || ! grep -q "MPI stall limit 300 s per wait (default)" "$tmp/err"; then
  echo "run_stall: FAILED: default stall limit not reported (exit $rc)"; status=1
  sed 's/^/  | /' "$tmp/err" | head -12
fi
[ $status -eq 0 ] && echo "run_stall: all checks passed"
exit $status
