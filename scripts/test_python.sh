#!/usr/bin/env bash
# The Python package's suite, as CI runs it: a fresh virtual environment that sees
# Debian's numpy, mpi4py, torch and pytest (--system-site-packages), `pip install
# ./python`, then pytest (python/tests: planning, from_diffusers on the models'
# config.json, Attention on numpy/torch, mpirun runs of examples/flux_mini.py).
#   BUILD_DIR (default build)   a build with libcpc.so (cpc_shared) and the cpc program:
#                               the wheel bundles that libcpc (no second build)
#   CPC_PYTHON_FROM_SOURCE=1    let pip build libcpc itself (what the README's
#                               `pip install ./python` does; ~1-2 min more)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
venv="$BUILD_DIR/python-venv"
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
args=()
if [ "${CPC_PYTHON_FROM_SOURCE:-0}" != 1 ]; then
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target cpc_shared --target cpc >/dev/null
  lib=$(ls "$BUILD_DIR"/libcpc.so.*.* | head -1)
  args=(--config-settings=cmake.define.CPC_PREBUILT_LIB="$PWD/$lib")
fi
"$venv/bin/pip" install -q --disable-pip-version-check "${args[@]}" ./python
# From outside the source tree, so that `import cpc` is the installed package.
cd "$BUILD_DIR"
env -u CPC_LIBRARY -u PYTHONPATH CPC_BUILD_DIR="$PWD" OPENBLAS_NUM_THREADS=1 \
  python-venv/bin/python -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests"
