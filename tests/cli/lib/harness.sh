# tests/cli/lib/harness.sh - helpers shared by the CLI test scripts (sourced
# from the repository root after the script has set $tmp and fails=0; this
# folder is not globbed as a test).
#   fail MSG...            count a failure and print it
#   has FILE PATTERN       $tmp/FILE must contain PATTERN (grep), else fail and show it
#   t NAME WANT CMD ARGS...  run CMD, output in $tmp/NAME.{out,err}; exit status must be WANT
#   mpi_setup              have_mpi=1 when mpirun exists, and then puts a wrapper first on
#                          PATH that runs it without ASan leak detection: under ASan
#                          (scripts/test.sh runs with detect_leaks=1) Open MPI's own
#                          allocations at exit read as leaks, so the mpirun half of a
#                          script runs as the MPI ctests do; the local half keeps it
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
has() { grep -q -- "$2" "$tmp/$1" || { fail "$1 lacks '$2'"; sed 's/^/    /' "$tmp/$1" >&2; }; }
t() {
  local name=$1 want=$2; shift 2
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local got=$?
  if [ "$got" -ne "$want" ]; then
    fail "$name: $* exited $got, expected $want"
    sed 's/^/    /' "$tmp/$name.err" >&2
  fi
}
mpi_setup() {
  have_mpi=0
  command -v mpirun >/dev/null 2>&1 || return 0
  have_mpi=1
  local real_mpirun
  real_mpirun=$(command -v mpirun)
  mkdir -p "$tmp/bin"
  printf '#!/bin/sh\nASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" exec "%s" -x ASAN_OPTIONS "$@"\n' \
    "$real_mpirun" >"$tmp/bin/mpirun"
  chmod +x "$tmp/bin/mpirun"
  PATH="$tmp/bin:$PATH"
}
