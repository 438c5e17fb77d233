#!/usr/bin/env bash
# The torch-2 tier's virtual environment: PyTorch 2 from PyPI, diffusers, mpi4py,
# numpy, pytest; built once and reused (a cache outside the work tree).
#
#   scripts/torch_venv.sh            prints the venv's path on stdout (last line) and
#                                    exits 0 when it is ready (built now or reused);
#                                    exits 77 with a loud "SKIP" on stderr when it is
#                                    not there and PyPI cannot be reached; 1 on failure.
#   CPC_TORCH_VENV (default ${XDG_CACHE_HOME:-$HOME/.cache}/cpc/torch-venv)
#   CPC_TORCH_VERSION (default 2.15.*), CPC_DIFFUSERS_VERSION (default 0.42.1)
#
# Why this recipe (docs/../shared platform notes, measured on these Debian 12 machines):
# the default torch wheel pulls gigabytes of CUDA packages; `pip install --no-deps torch`
# (the CUDA 13 build, ~540 MB) plus its small pure-Python dependencies and four nvidia
# wheels (also --no-deps) imports and runs on the CPU, its other CUDA libraries found under
# /usr/local/cuda.  Debian's own python3-torch (1.13) cannot import diffusers.
# mpi4py is built from source against the system's Open MPI (the MPI libcpc uses).
# The venv is plain (no --system-site-packages), so Debian's torch 1.13 is not visible.
# Install: about 2.3 GB, a few minutes; a reuse: about a second (import check).
set -euo pipefail
venv=${CPC_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/cpc/torch-venv}
torch_v=${CPC_TORCH_VERSION:-2.15.*}
diffusers_v=${CPC_DIFFUSERS_VERSION:-0.42.1}
# What the venv holds; a venv built from another recipe is rebuilt.
recipe="torch==$torch_v diffusers==$diffusers_v mpi4py(src) numpy pytest v1"

ready() {
  [ -x "$venv/bin/python" ] && [ -f "$venv/.cpc-recipe" ] &&
    [ "$(cat "$venv/.cpc-recipe")" = "$recipe" ] &&
    "$venv/bin/python" -c 'import torch, diffusers, mpi4py, numpy, pytest' 2>/dev/null
}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9                                   # two builders at once wait for each other
if ready; then echo "$venv"; exit 0; fi

if ! curl -sfI --max-time 20 https://pypi.org/simple/pip/ >/dev/null 2>&1 &&
   ! /usr/bin/python3 -c 'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=20)' >/dev/null 2>&1; then
  {
    echo "################################################################"
    echo "SKIP: the torch-2 tier needs PyPI (torch, diffusers, mpi4py) and"
    echo "      PyPI cannot be reached from this machine; no cached venv at"
    echo "      $venv"
    echo "################################################################"
  } >&2
  exit 77
fi

t0=$(date +%s)
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check --no-input)
"${pip[@]}" --upgrade pip >&2
"${pip[@]}" --no-deps "torch==$torch_v" >&2
"${pip[@]}" filelock typing-extensions sympy mpmath networkx jinja2 MarkupSafe fsspec numpy >&2
"${pip[@]}" --no-deps nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13 nvidia-nccl-cu13 >&2
"${pip[@]}" "diffusers==$diffusers_v" pytest >&2
MPICC=/usr/bin/mpicc "${pip[@]}" --no-binary=mpi4py mpi4py >&2
echo "$recipe" > "$venv/.cpc-recipe"
if ! ready; then
  echo "torch_venv.sh: the venv at $venv was built but does not import torch/diffusers/mpi4py" >&2
  "$venv/bin/python" -c 'import torch, diffusers, mpi4py' >&2 || true
  exit 1
fi
echo "torch_venv.sh: built $venv in $(( $(date +%s) - t0 )) s" >&2
echo "$venv"
