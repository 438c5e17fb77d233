#!/usr/bin/env bash
# The torch-2 tier: cpc.diffusers.parallelize on real diffusers models (tiny random FLUX
# and Wan transformers) under mpirun (2 and 4 processes) and torchrun, against the
# single-process model.  Uses the cached venv of scripts/torch_venv.sh (built on first
# use: a few minutes, ~2.3 GB; later runs reuse it); a loud SKIP (exit 0) only when that
# venv is absent and PyPI cannot be reached.
#   BUILD_DIR (default build)   a build with libcpc.so (cpc_shared); built here if needed
#   CPC_TORCH_VENV              where the venv lives (scripts/torch_venv.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
rc=0
venv=$(./scripts/torch_venv.sh | tail -1) || rc=$?
if [ $rc = 77 ]; then
  echo "torch-2 tier: SKIPPED (PyPI unreachable, no cached venv; see above)"
  exit 0
elif [ $rc != 0 ]; then
  echo "torch-2 tier: FAILED to build the venv"; exit 1
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" --target cpc_shared >/dev/null
lib=$(ls "$PWD/$BUILD_DIR"/libcpc.so.*.* | head -1)
echo "torch-2 tier: $("$venv/bin/python" -c 'import torch, diffusers, mpi4py; print("torch", torch.__version__, "diffusers", diffusers.__version__, "mpi4py", mpi4py.__version__)')"
# The package from the source tree (no install into the cached venv), this build's libcpc.
env PYTHONPATH="$PWD/python/src" CPC_LIBRARY="$lib" CPC_BUILD_DIR="$PWD/$BUILD_DIR" \
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  python/tests/test_diffusers_parallel.py python/tests/test_diffusers.py "$@"
