#!/usr/bin/env bash
# tests/gpu/pack.sh [PACK_DIR] - builds gpu_check, cprun and cpc HERE (no GPU needed) and gathers
# what the GPU machine needs to run them into PACK_DIR (default build-gpu/pack, an ignored path):
#   gpu_check            the device check (tests/gpu/gpu_check.c)
#   cprun                the runtime (tools/cprun.c), run by run.sh with --backend cuda
#   rank_cuda_emu, lib-train-ring2.cplan
#                        the public rank API on the CUDA backend (tests/emu/rank_cuda_emu.c:
#                        caller-owned device tensors and stream, forward and backward), with
#                        a small training plan compiled here for $CPC_GPU_ARCH
#   flux1-dev-1008-ulysses_anything.cplan, flux1-dev-1008-ring_anything.cplan
#                        plans/flux1-dev-1008.yaml (4 ranks) compiled by cpc with the kernels'
#                        PTX for $CPC_GPU_ARCH, and the plan YAML itself (cprun compiles it there)
#   flux1-dev-1024-ulysses.cplan, flux1-dev-1024-none.cplan
#                        plans/flux1-dev-1024.yaml as ulysses on 4 ranks and as none on 1 rank
#                        (run.sh's virtual-rank overhead row)
#   rank_nccl_emu, test_transport_nccl, libcpc.so.0.2, nccl-world1.cplan
#                        NCCL on the one GPU (issue 24; world size 1: NCCL refuses two ranks
#                        on one GPU): the library's NCCL ranks without MPI
#                        (tests/emu/rank_nccl_emu.c: cpc_nccl_unique_id, cpc_rank_new_nccl_id,
#                        cpc_rank_new_nccl), the transport's conformance suite 1x1
#                        (tests/test_transport_nccl.c: self send/recv, all-gather, barrier),
#                        cprun --transport nccl, and libcpc for the Python package under
#                        torchrun (tests/gpu/nccl_torchrun.py: torch CUDA tensors, the
#                        NCCL rank bootstrapped from torch.distributed's group)
#   lib.tgz              lib/ gzipped (run.sh unpacks it; the pack stays under the limit):
#                        the shared libraries of gpu_check and cprun that the GPU machine lacks
#                        (ldd: libyaml, libcrypto, OpenBLAS + libgfortran/libquadmath, Lua,
#                        cJSON, Open MPI's libmpi and its dependencies, ...)
#   cuda-fallback/       libcudart, used only when the GPU machine's Python packages have none
#   cache/kernels/*.ptx  the kernels of every gpu_check problem and of the FLUX plan, compiled here
#                        with NVRTC for $CPC_GPU_ARCH (default sm_90, the H200), so nothing is
#                        compiled there
# Not carried: the C runtime (libc, libm, libstdc++, libgcc_s: the GPU machine has newer ones)
# and CUDA's own libraries (libnvrtc, libcudnn*, libcublas*, libnccl: hundreds of MiB; the GPU
# machine has them under its Python site-packages, nvidia/*/lib, which tests/gpu/run.sh finds).
# The folder must stay under 60 MiB (the device tool carries 64 MiB at most); this script
# fails when it does not.
# Then, on the GPU machine:  bash tests/gpu/run.sh            (carry: build-gpu/pack)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-gpu/pack}
build=${CPC_GPU_BUILD_DIR:-$root/build-gpu}
arch=${CPC_GPU_ARCH:-sm_90}
limit=$((60 * 1024 * 1024))
plan=$root/plans/flux1-dev-1008.yaml

mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release > "$build/pack-cmake.log" 2>&1 ||
  { cat "$build/pack-cmake.log"; exit 1; }
grep -q "CUDA toolkit found" "$build/pack-cmake.log" ||
  { echo "pack.sh: no CUDA toolkit under /usr/local/cuda: gpu_check cannot be built" >&2; exit 1; }
cmake --build "$build" --target gpu_check cprun cpc rank_cuda_emu rank_nccl_emu test_transport_nccl \
  cpc_shared -j2

rm -rf "$out"
mkdir -p "$out/lib" "$out/cuda-fallback" "$out/cache"
libcpc=$(ls "$build"/libcpc.so.*.* | head -1)
for bin in gpu_check cprun emu-cudart/rank_cuda_emu emu-cudart/rank_nccl_emu test_transport_nccl; do
  cp "$build/$bin" "$out/"
  strip --strip-debug "$out/$(basename "$bin")" 2>/dev/null || true
done
cp "$libcpc" "$out/libcpc.so.0.2"   # CPC_LIBRARY for the Python package (run.sh)
strip --strip-debug "$out/libcpc.so.0.2" 2>/dev/null || true
{ for bin in gpu_check cprun emu-cudart/rank_cuda_emu emu-cudart/rank_nccl_emu test_transport_nccl; do
    ldd "$build/$bin"; done; ldd "$libcpc"; } | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  sort -u | while read -r name path; do
  case "$name" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*) ;;
    libcudart.so.*) cp -L "$path" "$out/cuda-fallback/$name" ;;
    libnvrtc*|libcudnn*|libcublas*|libnccl*|libcuda.so.*) ;;
    *) cp -L "$path" "$out/lib/$name" ;;
  esac
done
CPC_CACHE_DIR="$out/cache" "$out/gpu_check" --precompile --arch "$arch"

# The FLUX.1-dev 1008x1008 plan on 4 ranks, both anything variants, with PTX (cpc puts the
# kernels in the cache too, so cprun finds them there when it runs the YAML).
cp "$plan" "$out/"
for v in ulysses_anything ring_anything; do
  a="$out/flux1-dev-1008-$v.cplan"
  CPC_CACHE_DIR="$out/cache" "$build/cpc" "$plan" --arch "$arch" --set parallel.variant=$v -o "$a"
  grep -q "^  ptx: |" "$a" || { echo "pack.sh: $a has no PTX" >&2; exit 1; }
  # The carried cprun loads and verifies it (no device needed for --dry-run).
  LD_LIBRARY_PATH="$out/lib" "$out/cprun" "$a" --dry-run > /dev/null ||
    { echo "pack.sh: cprun cannot load $a" >&2; exit 1; }
done

# FLUX.1-dev 1024x1024 (4608 tokens, 24 heads): ulysses on 4 virtual ranks and the same
# attention on 1 rank (variant none), for the virtual-rank overhead goal (<= 10%).
plan1024=$root/plans/flux1-dev-1024.yaml
for cfg in "ulysses|--set parallel.variant=ulysses" "none|--set cluster.world_size=1 --set parallel.variant=none"; do
  v=${cfg%%|*}
  read -r -a sets <<< "${cfg#*|}"
  a="$out/flux1-dev-1024-$v.cplan"
  CPC_CACHE_DIR="$out/cache" "$build/cpc" "$plan1024" --arch "$arch" "${sets[@]}" -o "$a"
  LD_LIBRARY_PATH="$out/lib" "$out/cprun" "$a" --dry-run > /dev/null ||
    { echo "pack.sh: cprun cannot load $a" >&2; exit 1; }
done

# The library on the CUDA backend: a ring 2 fp32 causal GQA training plan (run.sh runs
# rank_cuda_emu on it: 2 thread ranks on GPU 0).
cat > "$out/lib-train-ring2.yaml" <<'YAML'
version: 1
name: lib-train-ring2
model: {heads: 4, kv_heads: 2, head_dim: 64, dtype: fp32}
input: {tokens: 256, mask: causal, mode: training}
cluster: {world_size: 2, device: cpu}
parallel: {variant: ring}
YAML
CPC_CACHE_DIR="$out/cache" "$build/cpc" "$out/lib-train-ring2.yaml" --arch "$arch" -o "$out/lib-train-ring2.cplan"

# NCCL on the one GPU (run.sh): a world-size-1 training plan (NCCL refuses two ranks on one
# GPU; forward and backward through the NCCL rank).
cat > "$out/nccl-world1.yaml" <<'YAML'
version: 1
name: nccl-world1
model: {heads: 8, kv_heads: 2, head_dim: 128, dtype: bf16}
input: {tokens: 1024, mode: training}
cluster: {world_size: 1, device: cpu}
parallel: {variant: none}
YAML
CPC_CACHE_DIR="$out/cache" "$build/cpc" "$out/nccl-world1.yaml" --arch "$arch" -o "$out/nccl-world1.cplan"

# lib/ travels as lib.tgz (OpenBLAS alone is 35 MiB, 8 gzipped): run.sh unpacks it.
tar -czf "$out/lib.tgz" -C "$out" lib
libs=$(ls "$out/lib" | tr '\n' ' ')
rm -rf "$out/lib"

size=$(du -sb "$out" | cut -f1)
echo "pack.sh: $out: $(ls "$out" | tr '\n' ' ')"
echo "pack.sh: lib.tgz: $libs"
du -sh "$out"/* | sort -h | tail -n 6 | sed 's/^/pack.sh:   /'
echo "pack.sh: $((size / 1024 / 1024)) MiB ($size bytes), limit $((limit / 1024 / 1024)) MiB"
if [ "$size" -gt "$limit" ]; then
  echo "pack.sh: the folder is over the limit" >&2
  exit 1
fi
