#!/usr/bin/env bash
# tests/gpu/pack.sh [PACK_DIR] - builds gpu_check HERE (no GPU needed) and gathers what the
# GPU machine needs to run it into PACK_DIR (default build-gpu/pack, an ignored path):
#   gpu_check            the device check (tests/gpu/gpu_check.c)
#   lib/                 its shared libraries that the GPU machine lacks (ldd: libyaml,
#                        libcrypto, OpenBLAS + libgfortran/libquadmath, ...)
#   cuda-fallback/       libcudart, used only when the GPU machine's Python packages have none
#   cache/kernels/*.ptx  the kernels of every gpu_check problem, compiled here with NVRTC
#                        for $CPC_GPU_ARCH (default sm_90, the H200), so nothing is compiled there
# Not carried: the C runtime (libc, libm, libstdc++, libgcc_s: the GPU machine has newer ones)
# and CUDA's own libraries (libnvrtc, libcudnn*, libcublas*, libnccl: hundreds of MiB; the GPU
# machine has them under its Python site-packages, nvidia/*/lib, which tests/gpu/run.sh finds).
# The folder must stay under 64 MiB (the device tool's limit for what travels); this script
# fails when it does not.
# Then, on the GPU machine:  bash tests/gpu/run.sh            (carry: build-gpu/pack)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-gpu/pack}
build=${CPC_GPU_BUILD_DIR:-$root/build-gpu}
arch=${CPC_GPU_ARCH:-sm_90}
limit=$((60 * 1024 * 1024))

mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release > "$build/pack-cmake.log" 2>&1 ||
  { cat "$build/pack-cmake.log"; exit 1; }
grep -q "CUDA toolkit found" "$build/pack-cmake.log" ||
  { echo "pack.sh: no CUDA toolkit under /usr/local/cuda: gpu_check cannot be built" >&2; exit 1; }
cmake --build "$build" --target gpu_check -j2

rm -rf "$out"
mkdir -p "$out/lib" "$out/cuda-fallback" "$out/cache"
cp "$build/gpu_check" "$out/"
strip --strip-debug "$out/gpu_check" 2>/dev/null || true
ldd "$build/gpu_check" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
  case "$name" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*) ;;
    libcudart.so.*) cp -L "$path" "$out/cuda-fallback/$name" ;;
    libnvrtc*|libcudnn*|libcublas*|libnccl*|libcuda.so.*) ;;
    *) cp -L "$path" "$out/lib/$name" ;;
  esac
done
CPC_CACHE_DIR="$out/cache" "$out/gpu_check" --precompile --arch "$arch"
size=$(du -sb "$out" | cut -f1)
echo "pack.sh: $out: $(ls "$out/lib" | tr '\n' ' ')"
echo "pack.sh: $((size / 1024 / 1024)) MiB ($size bytes), limit $((limit / 1024 / 1024)) MiB"
if [ "$size" -gt "$limit" ]; then
  echo "pack.sh: the folder is over the limit" >&2
  exit 1
fi
