#!/usr/bin/env bash
# Runs the transport conformance suite on the MPI transport under mpirun with
# N = 2, 3, 4, 8 processes (oversubscribing this machine's cores), then N = 3
# with the large-count limits lowered.
#   usage: run_conformance.sh MPI_CONFORMANCE_BINARY [MPIRUN]
set -u
bin=${1:?usage: run_conformance.sh MPI_CONFORMANCE_BINARY [MPIRUN]}
mpirun=${2:-mpirun}
# Open MPI refuses to start as root without these (platform-notes.md).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
status=0
run() {
    local n=$1; shift
    local t0=$(date +%s%N)
    timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np "$n" "$bin" "$@"
    local rc=$?
    local t1=$(date +%s%N)
    printf 'run_conformance: -np %d %s: exit %d in %d ms\n' "$n" "$*" "$rc" \
        $(( (t1 - t0) / 1000000 ))
    if [ "$rc" -ne 0 ]; then status=1; fi
}
for n in 2 3 4 8; do
    run "$n"
done
run 3 --small-limits --mesh 3x1
exit $status
