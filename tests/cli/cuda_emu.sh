#!/usr/bin/env bash
# `cprun --backend cuda` end to end on a machine without a GPU: cprun binds to the fake
# CUDA runtime ($CPC_BUILD_DIR/emu-cudart/libcudart.so.13, tests/emu/fake_cudart.c) through
# LD_LIBRARY_PATH (which overrides cprun's RUNPATH), whose kernel launches run the
# artifact's generated kernels on the CPU emulator (tests/emu/emu.h); cpc_emu_prepare
# builds the emulator modules of each .cplan's kernels first.  So the CUDA backend
# (runtime/backend/backend_cuda.c), the staged transport (virtual ranks on one GPU), the placement
# code of runtime/session/run.c and the kernels run here, and every run must PASS cprun's check
# against the float64 reference (SPEC tolerances):
#   every variant on 1, 2 and 4 virtual ranks (none; ring, ulysses, ulysses_anything,
#   ring_anything; unified on 4), bf16 and fp32, --attention nvrtc; a causal ring
#   (head_dim 128), a GQA unified plan, uneven splits (tokens and heads, fp16), key
#   padding, cross-attention; the wmma and row-per-warp kernels (CPC_NVRTC_ATTN) besides
#   the default mma.sync one; two plans with the threads of a block in reverse order;
#   the gathered out and LSE (--lse) equal the CPU backend's; mpirun --transport mpi;
#   training plans (ring 2 and 4 (lagged: add_strided): causal zigzag, GQA, key padding,
#   fp32/bf16/fp16; ulysses 4 with a replicated K/V head (reducing all-to-all); unified 4
#   with a replicated text segment) with
#   the backward on the generated backward kernels, dq/dk/dv checked;
#   2 and 4 emulated GPUs (rank r on GPU r mod 2, and one GPU per rank);
#   --attention auto where cuDNN cannot work (no driver): the generated kernel serves and
#   the report says why cuDNN did not; --attention cudnn is then status 3;
#   the library (issue 22): cpc_rank_* with CPC_BACKEND_CUDA on device tensors, forward
#   and backward (tests/emu/rank_cuda_emu.c), examples/toy_model --backend cuda under
#   mpirun, and Python's cpc.Attention(backend="cuda") on __cuda_array_interface__
#   device arrays (tests/emu/cai_emu.py).
# Without the fake (no GPU, no driver) --backend cuda is status 3, and with
# CPC_EMU_DEVICES=0 the fake itself reports no device (3).
# Skipped (exit 0) only when cprun is built without the CUDA toolkit; when cprun links
# libcudart but the fake or cpc_emu_prepare is missing, that is a failure.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPRUN="$B/cprun"
CPC="$B/cpc"
FAKE="$B/emu-cudart"
PREPARE="$FAKE/cpc_emu_prepare"
[ -x "$CPRUN" ] && [ -x "$CPC" ] || { echo "cuda_emu.sh: $CPRUN or $CPC not built" >&2; exit 1; }
if ! readelf -d "$CPRUN" 2>/dev/null | grep -q 'NEEDED.*libcudart\.so'; then
  echo "cuda_emu.sh: SKIP: $CPRUN is built without the CUDA toolkit"
  exit 0
fi
if [ ! -f "$FAKE/libcudart.so.13" ] || [ ! -x "$PREPARE" ]; then
  echo "FAIL: cuda_emu.sh: $FAKE/libcudart.so.13 or $PREPARE not built (targets cpc_fake_cudart, cpc_emu_prepare)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
source tests/cli/lib/harness.sh
export CPC_CACHE_DIR="$tmp/cache" OPENBLAS_NUM_THREADS=1
unset CPC_EMU_DEVICES CPC_EMU_ORDER
FAKE_ABS=$(cd "$FAKE" && pwd)
MODS="$tmp/modules"
T0=$SECONDS

# The fake must win over cprun's RUNPATH (/usr/local/cuda/lib64).
resolved=$(LD_LIBRARY_PATH="$FAKE_ABS" ldd "$CPRUN" | awk '$1 == "libcudart.so.13" {print $3}')
[ "$resolved" = "$FAKE_ABS/libcudart.so.13" ] ||
  fail "LD_LIBRARY_PATH=$FAKE_ABS: cprun binds libcudart.so.13 to '$resolved', not the fake"

# plan NAME VARIANT WORLD DTYPE HEADS KV_HEADS HEAD_DIM MASK INPUT...: $tmp/NAME.yaml
plan() {
  local name=$1 variant=$2 ws=$3 dtype=$4 h=$5 hkv=$6 d=$7 mask=$8; shift 8
  {
    echo "version: 1"
    echo "name: $name"
    echo "model: {heads: $h, kv_heads: $hkv, head_dim: $d, dtype: $dtype}"
    echo "input:"
    echo "  mask: $mask"
    for l in "$@"; do echo "  $l"; done
    echo "cluster: {world_size: $ws, device: cpu}"
    echo "parallel: {variant: $variant}"
  } >"$tmp/$name.yaml"
  PLANS+=("$name")
}
PLANS=()
# fp32 runs the row-per-warp kernel, whose shuffles make the emulator switch fibers
# 10 times per key: fewer tokens than the bf16/fp16 tensor-core kernels get.
for dt in bf16 fp32; do
  [ "$dt" = fp32 ] && tok=64 || tok=256
  plan "none1-$dt" none 1 "$dt" 4 4 64 none "tokens: $tok"
  for v in ring ulysses ulysses_anything ring_anything; do
    plan "$v-2-$dt" "$v" 2 "$dt" 4 4 64 none "tokens: $tok"
  done
  for v in ring ulysses unified ulysses_anything ring_anything; do
    plan "$v-4-$dt" "$v" 4 "$dt" 4 4 64 none "tokens: $tok"
  done
done
plan causal-ring-4 ring 4 bf16 4 4 128 causal "tokens: 256"
plan gqa-unified-4 unified 4 bf16 8 2 64 none "tokens: 256"
# uneven: 131 tokens over 4 ranks; 6 heads over ulysses_degree 4
plan uneven-ra-4 ring_anything 4 bf16 4 4 64 none "segments: [{name: text, tokens: 21}, {name: image, tokens: 110}]"
plan uneven-ua-4 ulysses_anything 4 fp16 6 6 64 none "segments: [{name: text, tokens: 21}, {name: image, tokens: 110}]"
plan keypad-unified-4 unified 4 bf16 4 4 64 key_padding "tokens: 192"
plan small-ring-4-bf16 ring 4 bf16 4 4 64 none "tokens: 64"
plan cross-unified-4 unified 4 bf16 4 4 64 none "tokens: 256" "kv: {tokens: 96}"
# replicated text (split: replicate, issue 24): whole on every rank, its queries on every rank
# (kv-layout q/k/v/out on the device, the head exchange of the replicated rows)
plan replicate-unified-4 unified 4 bf16 4 4 64 none "segments: [{name: text, tokens: 13, split: replicate}, {name: image, tokens: 48}]"
# training (mode: training): forward, then the backward on the generated backward kernels
# (kernels/attention_bwd.cu); dq/dk/dv checked against the float64 reference backward
# (specs shared with the plans above where possible: each new one costs NVRTC and module builds)
TRAIN=(train-ring-4-fp32-causal train-ring-2-bf16-causal train-ring-2-bf16-gqa4 train-ring-4-fp16-keypad
       train-ulysses-4-bf16-mqa train-replicate-unified-4-bf16)
plan train-ring-4-fp32-causal ring 4 fp32 4 4 64 causal "batch: 2" "tokens: 64" "mode: training"
plan train-ring-2-bf16-causal ring 2 bf16 4 4 128 causal "tokens: 64" "mode: training"
plan train-ring-2-bf16-gqa4 ring 2 bf16 8 2 64 none "tokens: 64" "mode: training"
plan train-ring-4-fp16-keypad ring 4 fp16 4 4 64 key_padding "tokens: 64" "mode: training"
# ulysses 4 over one K/V head: every member holds it, its dK/dV parts are summed (add_strided)
plan train-ulysses-4-bf16-mqa ulysses 4 bf16 4 1 64 none "tokens: 64" "mode: training"
# replicated text (issue 24): the text's gradients whole on every rank (world all_reduce of
# kv-layout gradients, their head parts spread to every head, the own block's add)
plan train-replicate-unified-4-bf16 unified 4 bf16 4 4 64 none "segments: [{name: text, tokens: 13, split: replicate}, {name: image, tokens: 48}]" "mode: training"

# ---- compile (cpc, NVRTC PTX into the artifact) and build the emulator modules ----------
for p in "${PLANS[@]}"; do
  t "cpc-$p" 0 "$CPC" "$tmp/$p.yaml" -o "$tmp/$p.cplan"
done
# ptxas' report per function is recorded in the artifact and summarised by cpc
has cpc-ring-2-bf16.out "kernels for sm_90: 3 modules,"
# (spills are test_codegen's business: it allows only the known ones)
has cpc-ring-2-bf16.out "; attention: cpc_flash_attn_mma, [0-9]* registers"
grep -q '{function: cpc_flash_attn_mma, registers: [0-9]*, stack_bytes: [0-9]*, spill_store_bytes: [0-9]*, spill_load_bytes: [0-9]*}' \
  "$tmp/ring-2-bf16.cplan" || fail "ring-2-bf16.cplan: no ptxas report of cpc_flash_attn_mma"
arts=()
for p in "${PLANS[@]}"; do [ -f "$tmp/$p.cplan" ] && arts+=("$tmp/$p.cplan"); done
t prepare 0 "$PREPARE" "${arts[@]}" "$MODS"
T1=$SECONDS

# emu NAME WANT ARGS...: cprun on the fake runtime, JSON report in $tmp/NAME.out
emu() {
  local name=$1 want=$2 t0; shift 2
  t0=$(date +%s%N)
  t "$name" "$want" env LD_LIBRARY_PATH="$FAKE_ABS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    CPC_EMU_MODULES="$MODS" "$CPRUN" "$@"
  echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms $name" >>"$tmp/times"
}
# Each run: "NAME ATTENTION-PREFIX" for the report check below.
EXPECT=()
for p in "${PLANS[@]}"; do
  emu "run-$p" 0 "$tmp/$p.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --format json
  EXPECT+=("run-$p nvrtc $(grep -o 'world_size: [0-9]*' "$tmp/$p.yaml" | cut -d' ' -f2)")
done
# The training runs' backward: dq, dk, dv within the SPEC's gradient tolerance.
python3 - "$tmp" "${TRAIN[@]}" <<'EOF' || fail "training on the cuda backend: backward not checked or failed"
import json, sys
tmp, bad = sys.argv[1], 0
for name in sys.argv[2:]:
    try:
        b = json.load(open(f"{tmp}/run-{name}.out"))["backward"]
        c = b["check"]
        assert c["pass"] is True, c
        print(f"cuda_emu.sh: {name}: backward {b['ms_per_iter']:.1f} ms, check {c}")
    except Exception as e:
        print(f"FAIL: {name}: {e!r}", file=sys.stderr); bad += 1
sys.exit(1 if bad else 0)
EOF
# Two warm-up + iterations: buffers reused across iterations on the device.
emu iters-ring-4 0 "$tmp/ring-4-bf16.cplan" --backend cuda --attention nvrtc --iters 2 --warmup 1 --format json
EXPECT+=("iters-ring-4 nvrtc 4")
# The other generated attention kernels (CPC_NVRTC_ATTN; mma is the default for bf16/fp16).
CPC_NVRTC_ATTN=wmma emu wmma-ring-4 0 "$tmp/ring-4-bf16.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --format json
CPC_NVRTC_ATTN=wmma emu wmma-causal-4 0 "$tmp/causal-ring-4.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --format json
CPC_NVRTC_ATTN=rowwarp emu rowwarp-ring-4 0 "$tmp/small-ring-4-bf16.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --format json
EXPECT+=("wmma-ring-4 nvrtc 4" "wmma-causal-4 nvrtc 4" "rowwarp-ring-4 nvrtc 4")
# Threads of a block in the opposite order between barriers (a race changes results).
CPC_EMU_ORDER=reverse emu reverse-causal-4 0 "$tmp/causal-ring-4.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --format json
CPC_EMU_ORDER=reverse emu reverse-gqa-4 0 "$tmp/gqa-unified-4.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --format json
EXPECT+=("reverse-causal-4 nvrtc 4" "reverse-gqa-4 nvrtc 4")
# The gathered output and the LSE (--lse: not part of the check) equal the CPU backend's.
emu lse-cuda 0 "$tmp/ring-4-fp32.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --lse --output "$tmp/cuda.safetensors"
t lse-cpu 0 "$CPRUN" "$tmp/ring-4-fp32.cplan" --backend cpu --iters 1 --warmup 0 --lse --output "$tmp/cpu.safetensors"
python3 - "$tmp/cuda.safetensors" "$tmp/cpu.safetensors" <<'EOF2' || fail "lse: the CUDA backend's out/lse differ from the CPU backend's"
import array, json, math, struct, sys
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    hdr, data = json.loads(b[8:8 + n]), b[8 + n:]
    out = {}
    for k, v in hdr.items():
        if k != "__metadata__":
            assert v["dtype"] == "F32", v
            a = array.array("f"); a.frombytes(data[v["data_offsets"][0]:v["data_offsets"][1]])
            out[k] = (v["shape"], a)
    return out
g, c = load(sys.argv[1]), load(sys.argv[2])
bad = 0
for key, tol in (("out", 1e-5), ("lse", 1e-5)):
    (gs, ga), (cs, ca) = g[key], c[key]
    if gs != cs or len(ga) != len(ca):
        print(f"{key}: shape {gs} vs {cs}", file=sys.stderr); bad += 1; continue
    err = max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(ga, ca))
    if not math.isfinite(err) or err > tol:
        print(f"{key}: max error {err:.3g} > {tol}", file=sys.stderr); bad += 1
sys.exit(1 if bad else 0)
EOF2
# Placement: 2 emulated GPUs for 4 ranks (virtual ranks), 4 GPUs (one per rank).
CPC_EMU_DEVICES=2 emu gpus2 0 "$tmp/unified-4-bf16.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --format json --verbose
has gpus2.err "2 visible GPUs"
has gpus2.err "rank r on GPU r mod visible GPUs: virtual ranks"
EXPECT+=("gpus2 nvrtc 4")
CPC_EMU_DEVICES=4 emu gpus4 0 "$tmp/ring-4-fp32.cplan" --backend cuda --attention nvrtc --iters 1 --warmup 0 --format json --verbose
has gpus4.err "(rank r on GPU r)"
EXPECT+=("gpus4 nvrtc 4")
# One process per rank (mpirun, --transport mpi staged through host memory; GPU = local
# rank mod visible GPUs).  --transport auto would pick NCCL, which needs a real driver.
if command -v mpirun >/dev/null && readelf -d "$CPRUN" | grep -q 'NEEDED.*libmpi'; then
  t0=$(date +%s%N)
  # Open MPI's libraries keep allocations until exit: no leak check under ASan here (as
  # the other MPI tests).
  t mpi 0 env ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 4 -x ASAN_OPTIONS \
    -x LD_LIBRARY_PATH="$FAKE_ABS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" -x CPC_EMU_MODULES="$MODS" \
    -x CPC_EMU_DEVICES=2 -x OPENBLAS_NUM_THREADS=1 -x CPC_CACHE_DIR \
    "$CPRUN" "$tmp/unified-4-bf16.cplan" --backend cuda --transport mpi --attention nvrtc \
    --iters 1 --warmup 0 --format json
  echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms mpi" >>"$tmp/times"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["backend"] == "cuda" and r["transport"] == "mpi+staged" and r["ranks"] == 4 and r["check"]["pass"], r' \
    "$tmp/mpi.out" || fail "mpi: report not as expected"
fi
# --attention auto: cuDNN cannot run without a driver; the generated kernel serves.
emu auto-bf16 0 "$tmp/ring-2-bf16.cplan" --backend cuda --attention auto --iters 1 --warmup 0 --format json
EXPECT+=("auto-bf16 nvrtc-fallback 2")
emu auto-text 0 "$tmp/ulysses-2-bf16.cplan" --backend cuda --iters 1 --warmup 0
has auto-text.out "PASS"
has auto-text.out "cudnn could not serve"
# --attention cudnn insists on cuDNN: a runtime failure (3) naming cuDNN.
emu cudnn 3 "$tmp/ring-2-bf16.cplan" --backend cuda --attention cudnn --iters 1 --warmup 0
has cudnn.err "attention cudnn"
# No device: the fake with CPC_EMU_DEVICES=0, and no fake at all (no driver here).
CPC_EMU_DEVICES=0 emu nodev 3 "$tmp/ring-2-fp32.cplan" --backend cuda --iters 1 --warmup 0
has nodev.err "no CUDA-capable device"
if [ ! -e /usr/lib/x86_64-linux-gnu/libcuda.so.1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  t nofake 3 "$CPRUN" "$tmp/ring-2-fp32.cplan" --backend cuda --iters 1 --warmup 0
  has nofake.err "CUDA"
fi

# ---- the library on the CUDA backend (issue 22): cpc_rank_* on the caller's device
# tensors and stream, forward and backward; examples/toy_model --backend cuda under
# mpirun; Python's cpc.Attention(backend="cuda") on __cuda_array_interface__ arrays.
RANKEMU="$FAKE/rank_cuda_emu"
if [ -x "$RANKEMU" ]; then
  for p in train-ring-4-fp32-causal train-ring-2-bf16-gqa4 train-ulysses-4-bf16-mqa unified-4-bf16; do
    t "rank-$p" 0 env LD_LIBRARY_PATH="$FAKE_ABS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      CPC_EMU_MODULES="$MODS" "$RANKEMU" "$tmp/$p.cplan"
    has "rank-$p.out" "CUDA ranks"
  done
  has rank-train-ring-4-fp32-causal.out "backward dq"
else
  fail "$RANKEMU not built (target rank_cuda_emu)"
fi
if command -v mpirun >/dev/null && [ -x "$B/toy_model" ]; then
  t toy-cuda 0 env ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    timeout -k 5 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x ASAN_OPTIONS \
    -x LD_LIBRARY_PATH="$FAKE_ABS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" -x CPC_EMU_MODULES="$MODS" \
    -x OPENBLAS_NUM_THREADS=1 -x CPC_CACHE_DIR "$B/toy_model" --backend cuda
  has toy-cuda.out "cuda backend"
  has toy-cuda.out "PASS"
fi
LIBCPC=$(ls "$(cd "$B" && pwd)"/libcpc.so.*.* 2>/dev/null | head -1)
if [ -n "$LIBCPC" ] && /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  t cai 0 env LD_LIBRARY_PATH="$FAKE_ABS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" CPC_EMU_MODULES="$MODS" \
    CPC_LIBRARY="$LIBCPC" PYTHONPATH="$PWD/python/src" /usr/bin/python3 tests/emu/cai_emu.py
  has cai.out "device arrays"
fi
grep -h "rank_cuda_emu: \|ranks vs 1 rank\|cai_emu: " "$tmp"/rank-*.out "$tmp"/toy-cuda.out "$tmp"/cai.out \
  2>/dev/null | sed "s|$tmp/||; s/^/cuda_emu.sh: library: /"
T2=$SECONDS

python3 - "$tmp" "${EXPECT[@]}" <<'EOF' || fail "cuda reports not as expected (see above)"
import json, sys
tmp, bad = sys.argv[1], 0
for spec in sys.argv[2:]:
    name, attn, ranks = spec.split()
    try:
        r = json.load(open(f"{tmp}/{name}.out"))
    except Exception as e:
        print(f"FAIL: {name}: no JSON report ({e})", file=sys.stderr); bad += 1; continue
    why = []
    if not r.get("ok"): why.append("ok is false")
    if r.get("backend") != "cuda": why.append(f"backend {r.get('backend')}")
    if r.get("transport") != "local+device": why.append(f"transport {r.get('transport')}")
    if r.get("ranks") != int(ranks): why.append(f"ranks {r.get('ranks')}, want {ranks}")
    c = r.get("check") or {}
    if c.get("pass") is not True: why.append(f"check {c}")
    a = r.get("attention", "")
    if attn == "nvrtc" and a != "nvrtc": why.append(f"attention '{a}'")
    if attn == "nvrtc-fallback" and not a.startswith("nvrtc (cudnn could not serve"):
        why.append(f"attention '{a}'")
    if why:
        print(f"FAIL: {name}: " + "; ".join(why), file=sys.stderr); bad += 1
sys.exit(1 if bad else 0)
EOF

echo "cuda_emu.sh: compile+prepare $((T1 - T0)) s, runs $((T2 - T1)) s, ${#PLANS[@]} plans; slowest runs:"
sort -rn "$tmp/times" | head -5 | sed 's/^/  /'
if [ "$fails" -ne 0 ]; then
  echo "cuda_emu.sh: $fails failure(s)" >&2
  exit 1
fi
echo "cuda_emu.sh: all checks passed"
