#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine (run as root; installs what
# is missing): release build + every ctest, the Python suite, the suite again
# under ASan+UBSan (sampled in the default tier), an -O3 build of the GPU pack's
# programs, and a bounded libFuzzer run over the plan loader and validator.
#   CPC_TEST_TIER=default|full      default: the ASan pass runs every test except the
#                                   heavy end-to-end ones (ASAN_HEAVY below), plus two
#                                   of those chosen by the commit (a rotating sample,
#                                   so successive commits cover them all), and not the
#                                   CUDA emulator's two end-to-end suites
#                                   (ASAN_FULL_ONLY); full: every test under ASan too
#                                   (about 45 more minutes)
#   CPC_FUZZ_SECONDS (default 60)   fuzzing time; 0 skips fuzzing
#   CPC_SKIP_ASAN=1                 skip the sanitizer pass
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
phase() { echo "== $* (at $((SECONDS - t0)) s) =="; }
./scripts/setup.sh
jobs=$(nproc)
status=0
tier=${CPC_TEST_TIER:-default}
case "$tier" in default|full) ;; *) echo "CPC_TEST_TIER must be default or full, not '$tier'" >&2; exit 2;; esac
# The end-to-end tests that take minutes under ASan (each runs cprun dozens of times;
# the release pass runs them all): the default tier's ASan pass runs two of them.
ASAN_HEAVY=(cli_axes cli_cprun cli_training cli_training_growth cli_robustness
            mpi_cprun mpi_train)
# The CUDA emulator's end-to-end suites (and the fake NCCL's, over it) compile every kernel module again with ASan
# (10 and 17 minutes under ASan here): the full tier's (the release pass runs them).
ASAN_FULL_ONLY=(cli_cuda_emu test_backend_cuda_emu cli_nccl_emu)

phase "build (release)"
BUILD_DIR=build ./scripts/build.sh
phase "ctest (release)"
(cd build && ctest --output-on-failure -j"$jobs") || status=1

phase "python package (fresh venv, pip install ./python, pytest)"
BUILD_DIR=build ./scripts/test_python.sh || status=1

phase "torch-2 tier (real diffusers models through cpc.diffusers.parallelize)"
BUILD_DIR=build ./scripts/test_torch.sh || status=1

if [ "${CPC_SKIP_ASAN:-0}" != 1 ]; then
  phase "build (ASan+UBSan)"
  BUILD_DIR=build-asan BUILD_TYPE=Debug ./scripts/build.sh -DCPC_SANITIZE=ON
  asan_args=()
  if [ "$tier" = default ]; then
    # Rotate the sample by the commit: two heavy tests per run, all of them
    # within ceil(${#ASAN_HEAVY[@]}/2) successive commits.
    seed=$(( 0x$( (git rev-parse --short=6 HEAD 2>/dev/null || echo 0) | tr -cd '0-9a-f' | head -c6) + 0 ))
    n=${#ASAN_HEAVY[@]}
    pick1=${ASAN_HEAVY[$(( seed % n ))]}
    pick2=${ASAN_HEAVY[$(( (seed + 1) % n ))]}
    skip=("${ASAN_FULL_ONLY[@]}")
    for t in "${ASAN_HEAVY[@]}"; do
      [ "$t" = "$pick1" ] || [ "$t" = "$pick2" ] || skip+=("$t")
    done
    asan_args=(-E "^($(IFS='|'; echo "${skip[*]}"))\$")
    echo "ASan sample: every test but the heavy ones, plus $pick1 and $pick2; not ${ASAN_FULL_ONLY[*]} (CPC_TEST_TIER=full runs all)"
  fi
  phase "ctest (ASan+UBSan, tier $tier)"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j"$jobs" "${asan_args[@]}") || status=1
fi

# The GPU pack (tests/gpu/pack.sh) is an optimised Release build: -O3 brings
# warnings (-Werror) that the other builds do not see.  Build its programs.
phase "build (Release, -O3: the GPU pack's programs)"
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
  phase "fuzz (${secs}s per target)"
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

phase "done"
if [ $status -eq 0 ]; then echo "cpc test suite: all passed"; else echo "cpc test suite: FAILED"; fi
exit $status
