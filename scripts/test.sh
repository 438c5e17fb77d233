#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine (run as root; installs what
# is missing): release build + ctest, the suite again under ASan+UBSan, and a
# bounded libFuzzer run over the plan loader and validator.
#   CPC_FUZZ_SECONDS (default 60)   fuzzing time; 0 skips fuzzing
#   CPC_SKIP_ASAN=1                 skip the sanitizer pass
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc)
status=0

echo "== build (release) =="
BUILD_DIR=build ./scripts/build.sh
echo "== ctest (release) =="
(cd build && ctest --output-on-failure -j"$jobs") || status=1

echo "== python package (fresh venv, pip install ./python, pytest) =="
BUILD_DIR=build ./scripts/test_python.sh || status=1

if [ "${CPC_SKIP_ASAN:-0}" != 1 ]; then
  echo "== build (ASan+UBSan) =="
  BUILD_DIR=build-asan BUILD_TYPE=Debug ./scripts/build.sh -DCPC_SANITIZE=ON
  echo "== ctest (ASan+UBSan) =="
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j"$jobs") || status=1
fi

# The GPU pack (tests/gpu/pack.sh) is an optimised Release build: -O3 brings
# warnings (-Werror) that the other builds do not see.  Build its programs.
echo "== build (Release, -O3: the GPU pack's programs) =="
o3_targets="--target cpc --target cprun"
if cmake -S . -B build-o3 -DCMAKE_BUILD_TYPE=Release >/dev/null; then
  cmake --build build-o3 --target help 2>/dev/null | grep -q gpu_check && o3_targets+=" --target gpu_check"
  # shellcheck disable=SC2086
  if cmake --build build-o3 -j"$jobs" $o3_targets >build-o3/build.log 2>&1; then
    echo "release -O3 build: ok"
  else
    echo "release -O3 build: FAILED"; grep -E 'error|warning' build-o3/build.log | head -20; status=1
  fi
else
  echo "release -O3 build: cmake FAILED"; status=1
fi

secs=${CPC_FUZZ_SECONDS:-60}
if [ "$secs" != 0 ] && ls tests/fuzz/fuzz_*.c >/dev/null 2>&1; then
  echo "== fuzz (${secs}s per target) =="
  cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
    -DCPC_FUZZ=ON -DCPC_WERROR=OFF >/dev/null
  targets=$(ls tests/fuzz/fuzz_*.c | xargs -n1 basename | sed 's/\.c$//')
  # shellcheck disable=SC2086
  cmake --build build-fuzz -j"$jobs" $(printf -- '--target %s ' $targets)
  for f in build-fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f")
    corpus=$(mktemp -d)
    cp -r tests/fuzz/corpus/. "$corpus/" 2>/dev/null || true
    if "$f" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
         -print_final_stats=1 "$corpus" > "build-fuzz/$name.log" 2>&1; then
      echo "fuzz $name: ok ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "build-fuzz/$name.log" | grep -o '[0-9]*$') runs)"
    else
      echo "fuzz $name: FAILED"; tail -40 "build-fuzz/$name.log"; status=1
    fi
    rm -rf "$corpus"
  done
fi

if [ $status -eq 0 ]; then echo "cpc test suite: all passed"; else echo "cpc test suite: FAILED"; fi
exit $status
