#!/usr/bin/env bash
# ctest gpu_check_probe: without a GPU, gpu_check must say "no CUDA device" and exit 3;
# with one, --probe exits 0.  Either way the harness's own logic is then self-tested on the
# CPU backend (one problem, a few meshes) so that it cannot rot unseen.
set -u
bin="$1"
out=$("$bin" --probe 2>&1); rc=$?
if [ $rc -eq 0 ]; then
  echo "GPU present: $out"
elif [ $rc -eq 3 ] && grep -q "no CUDA device" <<<"$out"; then
  echo "no GPU, as expected: $out"
else
  echo "FAIL: gpu_check --probe exited $rc: $out"; exit 1
fi
OPENBLAS_NUM_THREADS=1 "$bin" --cpu-backend --quick --budget 60 > /tmp/gpu_check_selftest.$$ 2>&1; rc=$?
tail -n 12 /tmp/gpu_check_selftest.$$; rm -f /tmp/gpu_check_selftest.$$
if [ $rc -ne 0 ]; then echo "FAIL: gpu_check --cpu-backend --quick exited $rc"; exit 1; fi
echo "gpu_check probe and CPU self-test passed"
