#!/usr/bin/env bash
# The NCCL transport (runtime/transport/transport_nccl.c) on a machine without a GPU:
# programs bind to the fake CUDA runtime and the fake NCCL ($CPC_BUILD_DIR/emu-cudart:
# libcudart.so.13 from tests/emu/fake_cudart.c, libnccl.so.2 from tests/emu/fake_nccl.c,
# NCCL over Unix-domain sockets) through LD_LIBRARY_PATH, one process per rank under
# mpirun, one emulated GPU per rank (CPC_EMU_DEVICES = ranks; GPU = local rank).
#   - test_transport_nccl's conformance suite (host buffers, device buffers, device
#     buffers with a compute stream: events) on the meshes P x 1, 1 x P, 2 x P/2 for
#     P = 2 and 4, and 1 x 1 as one process;
#   - two ranks on one GPU: every rank fails naming "Duplicate GPU" (NCCL's rule);
#   - cprun --backend cuda --transport nccl on plans/flux1-dev-1024.yaml shrunk to the
#     emulator's size (same segments: T5 text first, then the image; 8 heads, head_dim
#     64, 64 + 64 tokens) as ulysses 1x4, ring 4x1, unified 2x2 and ring 2x1, plus an
#     uneven ulysses_anything plan (131 tokens, 6 heads over 4), a key-padding unified
#     plan and a replicated text segment, none on 1 rank without mpirun (as on the GPU
#     machine), and training (ring 2, ring 4, unified 4: forward and backward; dq/dk/dv
#     checked): every run PASSes cprun's check against the
#     float64 reference, and rank 0's --output equals the MPI transport's byte for byte;
#   - the library: cpc_nccl_unique_id + cpc_rank_new_nccl_id, and cpc_rank_new_nccl over
#     the caller's communicator (tests/emu/rank_nccl_emu.c) on 2 and 4 processes, each
#     rank's output (and for training plans its dq/dk/dv) against the float64 reference;
#   - Python: cpc.Attention(a, comm=..., backend="cuda") on device arrays, comm an mpi4py
#     communicator and a torch.distributed gloo group (tests/emu/nccl_py_emu.py): the
#     NCCL rank bootstrapped from the group, the gathered output against float64; a rank
#     without a GPU makes every rank raise; a wrong world size names the launch;
# Skipped (exit 0) when cprun is built without CUDA, NCCL or MPI; a missing fake is a
# failure.  About 45-100 s on this 2-core machine (slow; ASan-full-only in scripts/test.sh).
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPRUN="$B/cprun"
CPC="$B/cpc"
FAKE="$B/emu-cudart"
PREPARE="$FAKE/cpc_emu_prepare"
[ -x "$CPRUN" ] && [ -x "$CPC" ] || { echo "nccl_emu.sh: $CPRUN or $CPC not built" >&2; exit 1; }
if ! readelf -d "$CPRUN" 2>/dev/null | grep -q 'NEEDED.*libnccl\.so' ||
   ! readelf -d "$CPRUN" 2>/dev/null | grep -q 'NEEDED.*libmpi'; then
  echo "nccl_emu.sh: SKIP: $CPRUN is built without NCCL or MPI"
  exit 0
fi
if ! command -v mpirun >/dev/null; then
  echo "nccl_emu.sh: SKIP: no mpirun"
  exit 0
fi
for f in "$FAKE/libcudart.so.13" "$FAKE/libnccl.so.2" "$PREPARE" "$B/test_transport_nccl" \
         "$FAKE/rank_nccl_emu"; do
  [ -e "$f" ] || { echo "FAIL: nccl_emu.sh: $f not built" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
source tests/cli/lib/harness.sh
mpi_setup
FAKE_ABS=$(cd "$FAKE" && pwd)
export CPC_CACHE_DIR="$tmp/cache" OPENBLAS_NUM_THREADS=1 CPC_FAKE_NCCL_TIMEOUT=60
export LD_LIBRARY_PATH="$FAKE_ABS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CPC_EMU_MODULES="$tmp/modules"
unset CPC_EMU_ORDER
T0=$SECONDS

resolved=$(ldd "$CPRUN" | awk '$1 == "libnccl.so.2" {print $3}')
[ "$resolved" = "$FAKE_ABS/libnccl.so.2" ] ||
  fail "LD_LIBRARY_PATH=$FAKE_ABS: cprun binds libnccl.so.2 to '$resolved', not the fake"

# mpi NAME WANT NP CMD...: CMD under mpirun -np NP with one emulated GPU per rank
mpi() {
  local name=$1 want=$2 np=$3; shift 3
  CPC_EMU_DEVICES=${DEVICES:-$np} t "$name" "$want" timeout -k 5 240 mpirun --allow-run-as-root \
    --oversubscribe -np "$np" -x LD_LIBRARY_PATH -x CPC_EMU_DEVICES -x CPC_EMU_MODULES \
    -x CPC_CACHE_DIR -x OPENBLAS_NUM_THREADS -x CPC_FAKE_NCCL_TIMEOUT "$@"
}

# ---- the conformance suite ------------------------------------------------------------
# (one process: MPI as a singleton, whose allocations at exit are not leaks of ours)
CPC_EMU_DEVICES=1 ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" t conf-1 0 "$B/test_transport_nccl" --jobs=1 --filter 'transport_nccl/conformance'
for np in 2 4; do
  mpi "conf-$np" 0 "$np" "$B/test_transport_nccl" --jobs=1 --filter 'transport_nccl/conformance'
done
# meshes per P: 1x1 (P=1); 2x1, 1x2 (P=2); 4x1, 1x4, 2x2 (P=4); 9 cases and 3 modes each
for f in conf-1 conf-2 conf-4; do
  has "$f.err" "Passing: 1 | Failing: 0"
done
# (rank 0 of each job logs the cases: 8 ok + abort skipped per (mode, mesh))
n_ok=$(cat "$tmp"/conf-*.err | grep -c ': [a-z_]* *ok (')
n_modes=$(cat "$tmp"/conf-*.err | grep -o 'conformance nccl([a-z ,]*) [0-9]*x[0-9]*' | sort -u | wc -l)
[ "$n_modes" -eq 18 ] || fail "conformance: $n_modes (mode, mesh) pairs ran on some rank, expected 18 (6 meshes x 3 modes)"
[ "$n_ok" -ge 144 ] || fail "conformance: only $n_ok cases ok"
if grep -q 'FAILED' "$tmp"/conf-*.err; then fail "conformance: cases failed"; grep FAILED "$tmp"/conf-*.err >&2; fi

# ---- two ranks on one GPU ------------------------------------------------------------------
DEVICES=1 mpi dup-gpu 1 2 "$B/test_transport_nccl" --jobs=1 --filter 'transport_nccl/conformance'
has dup-gpu.err "Duplicate GPU detected: rank 0 and rank 1 both on CUDA device 0"

# ---- cprun on a plan from plans/ --------------------------------------------------------------
shrink() {   # shrink VARIANT WORLD NAME: plans/flux1-dev-1024.yaml at the emulator's size
  sed -e 's/heads: 24/heads: 8/' -e 's/head_dim: 128/head_dim: 64/' -e 's/tokens: 512/tokens: 64/' \
    -e 's/height: 1024, width: 1024/height: 128, width: 128/' -e 's/device: h100-sxm/device: cpu/' \
    -e "s/world_size: 4/world_size: $2/" -e "s/variant: ulysses/variant: $1/" \
    -e "s/name: flux1-dev-1024/name: $3/" plans/flux1-dev-1024.yaml >"$tmp/$3.yaml"
  grep -q "variant: $1" "$tmp/$3.yaml" && grep -q "tokens: 64" "$tmp/$3.yaml" ||
    fail "plans/flux1-dev-1024.yaml changed: the shrinking above no longer applies"
}
shrink ulysses 4 flux-ulysses-4
shrink ring 4 flux-ring-4
shrink unified 4 flux-unified-4
shrink ring 2 flux-ring-2
shrink none 1 flux-none-1
# training (the backward ring sends its dK/dV accumulator one step before the peer receives
# it: the transport holds such lone sends, transport_nccl.h POINT-TO-POINT)
for v in "ring 2" "ring 4" "unified 4"; do
  set -- $v
  shrink "$1" "$2" "train-$1-$2"
  sed -i 's/mode: inference/mode: training/' "$tmp/train-$1-$2.yaml"
done
gen() {   # gen NAME VARIANT DTYPE HEADS MASK INPUT...
  local name=$1 v=$2 dt=$3 h=$4 mask=$5; shift 5
  { echo "version: 1"; echo "name: $name"
    echo "model: {heads: $h, kv_heads: $h, head_dim: 64, dtype: $dt}"
    echo "input:"; echo "  mask: $mask"; for l in "$@"; do echo "  $l"; done
    echo "cluster: {world_size: 4, device: cpu}"; echo "parallel: {variant: $v}"; } >"$tmp/$name.yaml"
}
gen uneven-ua-4 ulysses_anything fp16 6 none "segments: [{name: text, tokens: 21}, {name: image, tokens: 110}]"
gen keypad-unified-4 unified bf16 4 key_padding "tokens: 128"
gen replicate-unified-4 unified bf16 4 none "segments: [{name: text, tokens: 13, split: replicate}, {name: image, tokens: 48}]"
RUNS=(flux-ulysses-4 flux-ring-4 flux-unified-4 flux-ring-2 uneven-ua-4 keypad-unified-4 replicate-unified-4
      flux-none-1 train-ring-2 train-ring-4 train-unified-4)
arts=()
for p in "${RUNS[@]}"; do
  t "cpc-$p" 0 "$CPC" "$tmp/$p.yaml" -o "$tmp/$p.cplan" && arts+=("$tmp/$p.cplan")
done
t prepare 0 "$PREPARE" "${arts[@]}" "$CPC_EMU_MODULES"
T1=$SECONDS
for p in "${RUNS[@]}"; do
  np=$(grep -o 'world_size: [0-9]*' "$tmp/$p.yaml" | cut -d' ' -f2)
  mpi "run-$p" 0 "$np" "$CPRUN" "$tmp/$p.cplan" --backend cuda --transport nccl --attention nvrtc \
    --iters 1 --warmup 0 --output "$tmp/$p-nccl.safetensors"
  has "run-$p.out" "transport nccl"
  has "run-$p.out" "check: *PASS"
  case $p in train-*) has "run-$p.out" "bwd check: *PASS";; esac
  grep -o 'rel_err [0-9.e+-]*\|rel_err dq .* dv [0-9.e+-]*' "$tmp/run-$p.out" | sed "s/^/nccl_emu.sh: $p: /"
done
# world 1 without mpirun (what tests/gpu/run.sh does on its one GPU): the MPI bootstrap as a
# singleton; the library's NCCL rank with MPI untouched
# (Open MPI's own allocations at exit are not leaks of ours: as under mpirun, mpi_setup)
CPC_EMU_DEVICES=1 ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" t single-nccl 0 "$CPRUN" "$tmp/flux-none-1.cplan" --backend cuda --transport nccl \
  --attention nvrtc --iters 1 --warmup 0
has single-nccl.out "transport nccl"
has single-nccl.out "check: *PASS"
CPC_EMU_DEVICES=1 t single-lib 0 "$FAKE/rank_nccl_emu" "$tmp/flux-none-1.cplan"
has single-lib.out "rank_nccl_emu: ok"
# --transport auto under mpirun with the cuda backend is NCCL (SPEC section 5)
mpi auto-nccl 0 4 "$CPRUN" "$tmp/flux-unified-4.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0
has auto-nccl.out "transport nccl"
# the same result as the MPI transport, byte for byte
for p in flux-unified-4 uneven-ua-4 train-ring-4; do
  mpi "mpi-$p" 0 4 "$CPRUN" "$tmp/$p.cplan" --backend cuda --transport mpi --attention nvrtc \
    --iters 1 --warmup 0 --output "$tmp/$p-mpi.safetensors"
  cmp -s "$tmp/$p-mpi.safetensors" "$tmp/$p-nccl.safetensors" ||
    fail "$p: --output over nccl differs from --output over mpi"
done

# ---- the library: a rank from a unique id the caller distributes --------------------------
for p in flux-ring-2 flux-unified-4 uneven-ua-4 train-ring-2 train-unified-4; do
  np=$(grep -o 'world_size: [0-9]*' "$tmp/$p.yaml" | cut -d' ' -f2)
  mpi "lib-$p" 0 "$np" "$FAKE/rank_nccl_emu" "$tmp/$p.cplan"
  case $p in train-*) has "lib-$p.out" "backward (both bootstraps)";; esac
  has "lib-$p.out" "rank_nccl_emu: ok"
  grep 'rel_err' "$tmp/lib-$p.out"
done

# ---- Python: cpc.Attention(comm=..., backend="cuda") over NCCL from an mpi4py / gloo group ----
LIBCPC=$(ls "$(cd "$B" && pwd)"/libcpc.so.*.* 2>/dev/null | head -1)
if [ -n "$LIBCPC" ] && /usr/bin/python3 -c 'import numpy, mpi4py' 2>/dev/null; then
  export CPC_LIBRARY="$LIBCPC" PYTHONPATH="$PWD/python/src"
  # a sanitizer build's libcpc in a Python that is not: its runtime preloaded, Python's own
  # allocations at exit not counted
  if ldd "$LIBCPC" | grep -q libasan; then
    export LD_PRELOAD="$(gcc -print-file-name=libasan.so)"
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
  fi
  for p in flux-ring-2 flux-unified-4; do
    np=$(grep -o 'world_size: [0-9]*' "$tmp/$p.yaml" | cut -d' ' -f2)
    mpi "py-$p" 0 "$np" -x CPC_LIBRARY -x PYTHONPATH ${LD_PRELOAD:+-x LD_PRELOAD} /usr/bin/python3 tests/emu/nccl_py_emu.py \
      "$tmp/$p.cplan" "$tmp/store-$p"
    has "py-$p.out" "nccl_py_emu: ok"
    grep 'rel_err' "$tmp/py-$p.out"
  done
else
  echo "nccl_emu.sh: SKIP the Python half: no libcpc.so or /usr/bin/python3 lacks numpy/mpi4py"
fi

echo "nccl_emu.sh: compile+prepare $((T1 - T0)) s, total $((SECONDS - T0)) s"
if [ "$fails" -ne 0 ]; then
  echo "nccl_emu.sh: $fails failure(s)" >&2
  exit 1
fi
echo "nccl_emu.sh: all passed"
