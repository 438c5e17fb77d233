#!/usr/bin/env bash
# schedule_compare.sh - shows that two versions of the scheduler build the
# same programs, byte for byte: tests/tools/schedule_dump.c (every forward
# and backward program of a matrix of small training plans, of plans/*.yaml
# and of tests/cases/*.yaml: raw structure, text form, two unrolled ranks)
# is compiled against the static library of two builds and the outputs are
# diffed.  About 3 s and 2 x 170 MB in OUT_DIR.
#
# Usage: tests/tools/schedule_compare.sh BASE NEW_BUILD_DIR [OUT_DIR]
#   BASE: a build tree of the old version, or a git revision (e.g. main): it
#   is exported (git archive) and its libcpc.a built in OUT_DIR/base-src
#   (cmake, target cpc_static; a few minutes the first time, reused after).
#   NEW_BUILD_DIR: the build tree of the new version.  Each build tree needs
#   libcpc.a (`cmake --build DIR --target cpc_static`); the headers are taken
#   from the source tree it was configured from.
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
base=$1
if [ ! -d "$base" ]; then # a git revision: export and build it once
    rev=$(git -C "$here" rev-parse --verify "$base^{commit}") || exit 2
    bsrc=$out/base-src-$rev
    if [ ! -f "$bsrc/build/libcpc.a" ]; then
        rm -rf "$bsrc" && mkdir -p "$bsrc"
        git -C "$here" archive "$rev" | tar -x -C "$bsrc"
        cmake -S "$bsrc" -B "$bsrc/build" -DCMAKE_BUILD_TYPE=Release > "$out/base-build.log" 2>&1 &&
            cmake --build "$bsrc/build" -j2 --target cpc_static >> "$out/base-build.log" 2>&1 ||
            { echo "$0: building $base failed (see $out/base-build.log)" >&2; exit 2; }
    fi
    base=$bsrc/build
fi
dump "$base" base
dump "$2" new
if cmp -s "$out/base.txt" "$out/new.txt"; then
    echo "identical: $(wc -c < "$out/new.txt") bytes, $(grep -c '^== ' "$out/new.txt") programs," \
         "sha256 $(sha256sum < "$out/new.txt" | cut -c1-16)"
    exit 0
fi
echo "DIFFERENT:"; diff "$out/base.txt" "$out/new.txt" | head -40
exit 1
