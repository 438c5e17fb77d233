#!/usr/bin/env bash
# schedule_compare.sh - shows that two versions of the scheduler build the
# same programs, byte for byte: tests/tools/schedule_dump.c (every forward
# and backward program of a matrix of small training plans, of plans/*.yaml
# and of tests/cases/*.yaml: raw structure, text form, two unrolled ranks)
# is compiled against the static library of two builds and the outputs are
# diffed.  About 3 s and 2 x 170 MB in OUT_DIR.
#
# Usage: tests/tools/schedule_compare.sh BASE_BUILD_DIR NEW_BUILD_DIR [OUT_DIR]
#   BASE_BUILD_DIR / NEW_BUILD_DIR: build trees of the two versions (each with
#   libcpc.a built: `cmake --build DIR --target cpc_static`); the headers are
#   taken from the source tree each build was configured from.
#   OUT_DIR (default /tmp/schedule_compare): where the dumps go.
# Exit 0 when the dumps are identical (prints their size and sha256), 1 with
# the head of the diff otherwise, 2 on a usage or build error.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 BASE_BUILD_DIR NEW_BUILD_DIR [OUT_DIR]" >&2; exit 2; }
out=${3:-/tmp/schedule_compare}
mkdir -p "$out"
dump() { # build_dir name
    local b; b=$(cd "$1" && pwd)
    local src; src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$b/CMakeCache.txt")
    local lib=$b/libcpc.a
    [ -f "$lib" ] || { echo "$0: $lib missing (cmake --build $1 --target cpc_static)" >&2; exit 2; }
    cc -std=c11 -O1 -o "$out/dump_$2" "$here/tests/tools/schedule_dump.c" \
        -I"$src/compiler" -I"$src/compiler/ir" -I"$src/include" -I"$b/generated/shared-include" \
        "$lib" $(pkg-config --libs yaml-0.1 libcrypto) -lm -ldl -lpthread
    (cd "$src" && "$out/dump_$2" plans/*.yaml tests/cases/*.yaml) > "$out/$2.txt"
}
dump "$1" base
dump "$2" new
if cmp -s "$out/base.txt" "$out/new.txt"; then
    echo "identical: $(wc -c < "$out/new.txt") bytes, $(grep -c '^== ' "$out/new.txt") programs," \
         "sha256 $(sha256sum < "$out/new.txt" | cut -c1-16)"
    exit 0
fi
echo "DIFFERENT:"; diff "$out/base.txt" "$out/new.txt" | head -40
exit 1
