# tests/cli/lib/harness.sh - helpers shared by the CLI test scripts (sourced
# from the repository root after the script has set $tmp and fails=0; this
# folder is not globbed as a test).
#   fail MSG...            count a failure and print it
#   has FILE PATTERN       $tmp/FILE must contain PATTERN (grep), else fail and show it
#   t NAME WANT CMD ARGS...  run CMD, output in $tmp/NAME.{out,err}; exit status must be WANT
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
