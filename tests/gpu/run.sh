#!/usr/bin/env bash
# tests/gpu/run.sh [PACK_DIR] [gpu_check options...] - the device check, on the GPU machine.
# PACK_DIR (default build-gpu/pack) comes from tests/gpu/pack.sh, built on the dev machine and
# carried over.  CUDA's libraries (cudart, NVRTC, cuDNN, cuBLAS) are taken from the Python
# environment's site-packages (nvidia/*/lib); the pack's lib/ goes first, its cudart last.
# Prints the environment, then gpu_check's log with its summary table last.  Exit status:
# gpu_check's (0 all passed, 1 a check failed or a goal was missed, 3 no device or an error),
# 2 when the pack is missing or a library cannot be found, 124 past the 5-minute limit.
# With $OUT set (the device tool), the log is also written to $OUT/gpu_check.log.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
pack=$root/build-gpu/pack
if [ $# -gt 0 ] && [ -d "$1" ]; then pack=$(cd "$1" && pwd); shift; fi
if [ ! -x "$pack/gpu_check" ]; then
  echo "run.sh: $pack/gpu_check is missing: run tests/gpu/pack.sh on the build machine and carry build-gpu/pack" >&2
  exit 2
fi

# Site-packages of every Python we can find (the GPU image's python3 holds PyTorch).
sites=""
for py in python3 /opt/*/.venv/bin/python3 /usr/bin/python3; do
  command -v "$py" > /dev/null 2>&1 || continue
  sites="$sites $("$py" -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true)"
done
libdirs=""
for s in $sites; do
  [ -d "$s/nvidia" ] || continue
  for d in $(find "$s/nvidia" -maxdepth 4 -type f -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u); do
    case ":$libdirs:" in *":$d:"*) ;; *) libdirs="$libdirs:$d" ;; esac
  done
done
# The driver's libcuda (cuDNN loads it at run time) and a system CUDA as a last resort.
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64; do
  [ -d "$d" ] && libdirs="$libdirs:$d"
done
export LD_LIBRARY_PATH="$pack/lib${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$pack/cuda-fallback"
export CPC_CACHE_DIR="$pack/cache"
export OPENBLAS_NUM_THREADS=1

echo "== environment =="
uname -srm
if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1; else echo "nvidia-smi: not available"; fi
echo "python site-packages: $sites"
echo "libraries used:"
ldd "$pack/gpu_check" | grep -E "cuda|cudnn|nvrtc|yaml|crypto|openblas|not found" | sed 's/^/  /'
if ldd "$pack/gpu_check" | grep -q "not found"; then
  echo "run.sh: a shared library was not found (above); the pack or the Python packages lack it" >&2
  exit 2
fi
# cuDNN loads its sub-libraries at run time: show which libcudnn_graph it would get.
for d in ${LD_LIBRARY_PATH//:/ }; do
  ls "$d"/libcudnn_graph.so* 2> /dev/null | head -1 | sed 's/^/  cuDNN graph library: /'
done | head -1

echo "== gpu_check =="
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  timeout 300 "$pack/gpu_check" "$@" 2>&1 | tee "$OUT/gpu_check.log"
  rc=${PIPESTATUS[0]}
else
  timeout 300 "$pack/gpu_check" "$@" 2>&1
  rc=$?
fi
echo "run.sh: gpu_check exited $rc"
exit $rc
