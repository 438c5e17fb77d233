#!/usr/bin/env bash
# libcpc as a user gets it (SPEC section 8): `cmake --install` into a fresh
# prefix; the shared library's soname and its exported symbols (exactly the
# functions declared in include/cpc/*.h, all cpc_-prefixed); the example built
# out of tree with find_package(cpc) and with pkg-config (shared and static);
# the toy model under mpirun -np 1, 2, 4 matching one rank; the layering rules
# of the tree (no "../" includes; the public headers include only <cpc/...>
# and the C library; tools/*.c only <cpc/...>, libc/POSIX and cJSON).  Runs from the repository root; build in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
. tests/cli/lib/harness.sh
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
# A sanitizer build's libcpc needs its users built with the same runtime.
san=""
grep -q '^CPC_SANITIZE:BOOL=ON' "$B/CMakeCache.txt" 2>/dev/null && san="-fsanitize=address,undefined"
# Open MPI's own allocations are not leaks of ours (as for the other MPI tests).
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"

# ---- the tree's layering rules --------------------------------------------------
bad=$(git ls-files '*.c' '*.h' | xargs grep -n '#include "\.\./' 2>/dev/null)
[ -z "$bad" ] || fail "relative includes reach into other layers: $bad"
bad=$(grep -h '#include' include/cpc/*.h | grep -v -E '#include <(stdbool|stddef|stdint|stdio)\.h>|#include "cpc/[a-z_]+\.h"')
[ -z "$bad" ] || fail "public headers include more than <cpc/...> and libc: $bad"
# the tools are users of the public API: <cpc/...>, the C library / POSIX and cJSON only
libc='assert|ctype|errno|fcntl|float|getopt|inttypes|limits|math|signal|spawn|stdarg|stdbool|stddef|stdint|stdio|stdlib|string|strings|time|unistd|sys/(stat|types|wait|time|resource)'
bad=$(grep -Hn '^[[:space:]]*#[[:space:]]*include' tools/*.c | grep -v -E "#[[:space:]]*include <(($libc)\.h|cpc/[a-z_]+\.h|cjson/cJSON\.h)>")
[ -z "$bad" ] || fail "tools include more than <cpc/...>, libc/POSIX and <cjson/cJSON.h>: $bad"

# ---- install ---------------------------------------------------------------------
prefix="$tmp/prefix"
t install 0 cmake --install "$B" --prefix "$prefix"
for f in include/cpc/cpc.h include/cpc/rank.h lib/libcpc.a lib/cmake/cpc/cpcConfig.cmake \
         lib/pkgconfig/cpc.pc bin/cpc bin/cprun; do
  [ -e "$prefix/$f" ] || fail "install: $f missing"
done
so=$(ls "$prefix"/lib/libcpc.so.*.*.* 2>/dev/null | head -1)
[ -n "$so" ] || fail "install: no versioned libcpc.so"
if [ -n "$so" ]; then
  soname=$(objdump -p "$so" | awk '/SONAME/ {print $2}')
  [ "$soname" = "libcpc.so.0.2" ] || fail "soname is '$soname', expected libcpc.so.0.2"
  # exported symbols: exactly the declared functions
  nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sed 's/@.*//' | sort >"$tmp/exported"
  # every public function is declared CPC_API (include/cpc/export.h; the layers are
  # compiled with -fvisibility=hidden, so that is what exports it)
  grep -h -o -E '^CPC_API [a-z].*[ *](cpc_[a-z0-9_]+)\(' include/cpc/*.h | grep -o -E 'cpc_[a-z0-9_]+\($' |
    tr -d '(' | sort -u >"$tmp/declared"
  bare=$(grep -Hn -E '^[a-z].*[ *](cpc_[a-z0-9_]+)\(' include/cpc/*.h | grep -v ':typedef ' |
         grep -v '^include/cpc/tool.h:')
  [ -z "$bare" ] || fail "public functions declared without CPC_API: $bare"
  n_exp=$(wc -l <"$tmp/exported")
  grep -v '^cpc_' "$tmp/exported" >"$tmp/foreign" && fail "non-cpc_ symbols exported: $(head -5 "$tmp/foreign" | tr '\n' ' ')"
  diff "$tmp/declared" "$tmp/exported" >"$tmp/symdiff" || fail "exported != declared: $(cat "$tmp/symdiff" | tr '\n' ' ')"
  # the tooling layer (cpc/tool.h: exit statuses, atomic files, --option checks) is
  # the programs' policy: none of it is exported, and its header is not installed
  grep -h -o -E '^[a-z].*[ *](cpc_[a-z0-9_]+)\(' include/cpc/tool.h | grep -o -E 'cpc_[a-z0-9_]+\($' |
    tr -d '(' | sort -u >"$tmp/tool"
  [ "$(wc -l <"$tmp/tool")" -ge 10 ] || fail "cpc/tool.h declares $(wc -l <"$tmp/tool") functions, expected the 10 of the tooling layer"
  leaked=$(comm -12 "$tmp/tool" "$tmp/exported" | tr '\n' ' ')
  [ -z "$leaked" ] || fail "libcpc.so exports tool-layer functions (cpc/tool.h): $leaked"
  [ -e "$prefix/include/cpc/tool.h" ] && fail "install: cpc/tool.h (the tooling layer) is installed"
  grep -q '#include.*cpc/tool.h' include/cpc/*.h && fail "a public header includes the tooling layer (cpc/tool.h)"
  echo "library.sh: $n_exp symbols exported, all declared in include/cpc; none of tool.h's $(wc -l <"$tmp/tool")"
fi

# ---- out of tree: find_package(cpc) and pkg-config ----------------------------------
t cmake_configure 0 cmake -S examples -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san"
t cmake_build 0 cmake --build "$tmp/ex"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
t pkgconfig 0 pkg-config --modversion cpc
ver=$(awk '/^#define CPC_VERSION_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' include/cpc/version.h)
has pkgconfig.out "^$ver\$"
t pc_shared 0 mpicc $san -o "$tmp/toy_pc" examples/toy_model.c $(pkg-config --cflags --libs cpc) -lm \
  -Wl,-rpath,"$prefix/lib"
t pc_static 0 mpicc $san -o "$tmp/toy_static" examples/toy_model.c $(pkg-config --cflags cpc) \
  "$prefix/lib/libcpc.a" $(pkg-config --static --libs-only-other --libs-only-l cpc | sed 's/-lcpc//') -lm
export OPENBLAS_NUM_THREADS=1
for n in 1 2 4; do
  t "toy_np$n" 0 timeout 120 $MPIRUN -np $n "$tmp/ex/toy_model"
  has "toy_np$n.out" "PASS"
done
t toy_pc_unified 0 timeout 120 $MPIRUN -np 4 "$tmp/toy_pc" --variant unified
has toy_pc_unified.out "PASS"
t toy_static_ua 0 timeout 120 $MPIRUN -np 3 "$tmp/toy_static" --variant ulysses_anything
has toy_static_ua.out "PASS"
# a wrong variant for the world is a plan error reported as a value (exit 3 via MPI_Abort)
t toy_bad 3 timeout 120 $MPIRUN -np 3 "$tmp/toy_pc" --variant ulysses
has toy_bad.err "CP0"

if [ "$fails" -ne 0 ]; then
  echo "library.sh: $fails failure(s)" >&2
  exit 1
fi
echo "library.sh: all checks passed"
