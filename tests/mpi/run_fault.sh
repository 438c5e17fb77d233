#!/usr/bin/env bash
# A failing rank must end every rank of an MPI job within seconds, with a
# non-zero exit status, never a hang: world rank 2 of 4 fails (transport
# abort, exit without MPI_Finalize, SIGKILL) while the others block in a
# receive from it.  Each run has 30 s; a timeout is a failure.
#   usage: run_fault.sh MPI_CONFORMANCE_BINARY [MPIRUN]
set -u
bin=${1:?usage: run_fault.sh MPI_CONFORMANCE_BINARY [MPIRUN]}
mpirun=${2:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT
for mode in abort exit kill; do
    t0=$(date +%s%N)
    timeout -k 5 30 "$mpirun" --allow-run-as-root --oversubscribe -np 4 "$bin" \
        --fault "$mode" --fault-rank 2 >/dev/null 2>"$err"
    rc=$?
    t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 ))
    verdict=ok
    # (mpirun itself exits 137 when a rank was killed by SIGKILL, so the
    # timeout is recognised by its exit status 124 or by the elapsed time.)
    if [ "$rc" -eq 124 ] || [ "$ms" -ge 30000 ]; then
        verdict="FAILED: still running after 30 s"
    elif [ "$rc" -eq 0 ]; then
        verdict="FAILED: exit status 0"
    elif [ "$mode" = abort ] && ! grep -q "rank 2: aborting: injected fault" "$err"; then
        verdict="FAILED: the abort message was not printed"
    fi
    printf 'run_fault: --fault %s: exit %d in %d ms: %s\n' "$mode" "$rc" "$ms" "$verdict"
    if [ "$verdict" != ok ]; then
        status=1
        sed 's/^/  | /' "$err" | head -20
    fi
done
exit $status
