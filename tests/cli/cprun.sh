#!/usr/bin/env bash
# `cprun` end to end (SPEC section 5): plans run straight from YAML and from
# the .cplan artifacts cpc writes, the check PASSes, the JSON report has
# exactly the SPEC keys, --output/--output-shards/--trace files are
# readable, --input tensors are used (and broken ones rejected), and the
# exit statuses are 0 ok / 1 check failed / 2 usage or input / 3 runtime.
# Backends: --backend auto runs on the CPU (and says so) without a GPU, where
# --backend cuda is status 3 naming the CUDA error (with a GPU it runs and
# passes); contradicting options (--attention cudnn with --backend cpu, ...)
# are status 2; an artifact without PTX cannot run on cuda (2).
# Finally the FLUX.1-dev 1008x1008 plan (4481 tokens, 4 ranks) runs and
# passes.  Runs from the repository root; binaries in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPRUN="$B/cprun"
CPC="$B/cpc"
[ -x "$CPRUN" ] || { echo "cprun.sh: $CPRUN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# run NAME WANT ARGS... : runs cprun, checks the exit status; output in $tmp/NAME.{out,err}
run() {
  local name=$1 want=$2; shift 2
  "$CPRUN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local got=$?
  if [ "$got" -ne "$want" ]; then
    fail "$name: cprun $* exited $got, expected $want"
    sed 's/^/    /' "$tmp/$name.err" >&2
  fi
}
has() { grep -q -- "$2" "$tmp/$1" || fail "$1 lacks '$2'"; }

cat >"$tmp/small.yaml" <<'EOF'
version: 1
name: small
model: {heads: 8, head_dim: 32, dtype: bf16}
input: {tokens: 256}
cluster: {world_size: 4, device: cpu}
parallel: {variant: unified}
EOF
cat >"$tmp/uneven.yaml" <<'EOF'
version: 1
name: uneven
model: {heads: 6, kv_heads: 3, head_dim: 16, dtype: fp32}
input:
  segments:
    - {name: text, tokens: 21}
    - {name: image, tokens: 110}
cluster: {world_size: 4, device: cpu}
parallel: {variant: ulysses_anything}
EOF

# ---- YAML plans run directly; text and JSON reports --------------------------------
run small 0 "$tmp/small.yaml" --iters 2 --warmup 1
has small.out "PASS"
has small.out "unified"
run small-json 0 "$tmp/small.yaml" --iters 1 --warmup 0 --format json
python3 - "$tmp/small-json.out" <<'EOF' || fail "small-json: JSON report is not as SPEC section 5 says"
import json, sys
r = json.load(open(sys.argv[1]))
keys = ["ok", "variant", "ring_degree", "ulysses_degree", "ranks", "backend", "transport",
        "attention", "ms_per_iter", "tflops", "bytes_sent_per_rank",
        "peak_memory_bytes_per_rank", "check"]
assert sorted(r) == sorted(keys), sorted(r)
assert r["ok"] is True and r["variant"] == "unified"
assert r["ring_degree"] == 2 and r["ulysses_degree"] == 2 and r["ranks"] == 4
assert r["backend"] == "cpu" and r["transport"] == "local"
assert r["ms_per_iter"] > 0 and r["tflops"] > 0
assert r["bytes_sent_per_rank"] > 0 and r["peak_memory_bytes_per_rank"] > 0
assert sorted(r["check"]) == ["max_abs_err", "pass", "rel_err"]
assert r["check"]["pass"] is True and 0 < r["check"]["rel_err"] < 1e-2
EOF
run nocheck 0 "$tmp/uneven.yaml" --no-check --iters 1 --warmup 0 --format json
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["check"] is None and r["ok"]' \
  "$tmp/nocheck.out" || fail "nocheck: check must be null"
run uneven 0 "$tmp/uneven.yaml" --iters 1 --warmup 0 --set parallel.variant=ring_anything
has uneven.out "PASS"
has uneven.out "ring_anything"

# ---- outputs: gathered, shards, trace ------------------------------------------------------
run outputs 0 "$tmp/uneven.yaml" --iters 1 --warmup 0 --seed 9 --lse \
  --output "$tmp/out.safetensors" --output-shards "$tmp/shards" --trace "$tmp/trace.json"
python3 - "$tmp" <<'EOF' || fail "outputs: files not as expected"
import json, struct, sys, os
d = sys.argv[1]
def header(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), len(b) - 8 - n
h, data = header(os.path.join(d, "out.safetensors"))
assert h["out"]["dtype"] == "F32" and h["out"]["shape"] == [1, 131, 6, 16], h
assert h["lse"]["dtype"] == "F32" and h["lse"]["shape"] == [1, 6, 131], h
assert data == 131 * 6 * 16 * 4 + 6 * 131 * 4
tokens = 0
for r in range(4):
    hs, _ = header(os.path.join(d, "shards", "rank%d.safetensors" % r))
    tokens += hs["out"]["shape"][1]
    assert hs["__metadata__"]["rank"] == str(r)
assert tokens == 131, tokens
t = json.load(open(os.path.join(d, "trace.json")))
ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert {e["tid"] for e in ev} == {0, 1, 2, 3}
assert {e["cat"] for e in ev} == {"compute", "comm"}
assert all(e["dur"] >= 0 for e in ev)
EOF

# ---- --input: tensors from a file -----------------------------------------------------------
python3 - "$tmp" <<'EOF'
import json, struct, random, sys, os, math
d = sys.argv[1]
random.seed(5)
def write(path, tensors):
    hdr, blobs, off = {}, [], 0
    for name, dt, shape, vals in tensors:
        fmt = {"F32": "f", "U8": "B"}[dt]
        b = struct.pack("<%d%s" % (len(vals), fmt), *vals)
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    j = json.dumps(hdr).encode(); j += b" " * (-len(j) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + b"".join(blobs))
n_q, n_kv = 131 * 6 * 16, 131 * 3 * 16
q = [random.gauss(0, 1) for _ in range(n_q)]
k = [random.gauss(0, 1) for _ in range(n_kv)]
v = [random.gauss(0, 1) for _ in range(n_kv)]
write(os.path.join(d, "qkv.safetensors"), [("q", "F32", [1, 131, 6, 16], q),
      ("k", "F32", [1, 131, 3, 16], k), ("v", "F32", [1, 131, 3, 16], v)])
write(os.path.join(d, "badshape.safetensors"), [("q", "F32", [1, 130, 6, 16], q[:130 * 96]),
      ("k", "F32", [1, 131, 3, 16], k), ("v", "F32", [1, 131, 3, 16], v)])
vn = list(v); vn[5] = float("nan")
write(os.path.join(d, "nan.safetensors"), [("q", "F32", [1, 131, 6, 16], q),
      ("k", "F32", [1, 131, 3, 16], k), ("v", "F32", [1, 131, 3, 16], vn)])
b = open(os.path.join(d, "qkv.safetensors"), "rb").read()
open(os.path.join(d, "trunc.safetensors"), "wb").write(b[:len(b) // 2])
EOF
run input 0 "$tmp/uneven.yaml" --input "$tmp/qkv.safetensors" --iters 1 --warmup 0
has input.out "PASS"
has input.out "qkv.safetensors"
run input-shape 2 "$tmp/uneven.yaml" --input "$tmp/badshape.safetensors" --iters 1 --warmup 0
has input-shape.err "tensor 'q' has shape \[1, 130, 6, 16\], the plan needs \[1, 131, 6, 16\]"
run input-trunc 2 "$tmp/uneven.yaml" --input "$tmp/trunc.safetensors" --iters 1 --warmup 0
has input-trunc.err "trunc.safetensors"
run input-missing 2 "$tmp/uneven.yaml" --input "$tmp/nope.safetensors"
# A NaN in v: NaN in the output (and the reference): the check fails: exit 1.
run check-fail 1 "$tmp/uneven.yaml" --input "$tmp/nan.safetensors" --iters 1 --warmup 0
has check-fail.out "FAIL"
has check-fail.err "check failed"

# ---- exit statuses --------------------------------------------------------------------------
run bad-option 2 "$tmp/small.yaml" --frobnicate
run bad-value 2 "$tmp/small.yaml" --iters 0
run bad-format 2 "$tmp/small.yaml" --format xml
run no-plan 2
run missing-plan 2 "$tmp/does-not-exist.yaml"
run rejected 2 plans/flux1-dev-1008.yaml --set parallel.variant=ulysses
has rejected.err "CP011"
run training 0 "$tmp/small.yaml" --set input.mode=training --iters 1 --warmup 0
has training.out "^bwd check:   PASS"
run training-script 2 "$tmp/small.yaml" --set input.mode=training --set "schedule.script=$PWD/lua/examples/no_overlap.lua"
has training-script.err "CP018"

# ---- backends (SPEC section 5): auto picks cuda only with a GPU and driver --------------------
run auto 0 "$tmp/small.yaml" --backend auto --iters 1 --warmup 0 --format json --verbose
auto_backend=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["backend"])' "$tmp/auto.out" 2>/dev/null)
if [ "$auto_backend" = "cpu" ]; then
  # No usable GPU here: auto says so and runs on the CPU; cuda is a runtime failure (3) naming
  # the CUDA error, and so are the options that need it.
  has auto.err "running on the CPU backend"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["attention"] == "cpu" and r["transport"] == "local" and r["check"]["pass"]' \
    "$tmp/auto.out" || fail "auto: report not as expected"
  run cuda 3 "$tmp/small.yaml" --backend cuda
  has cuda.err "--backend cuda"
  has cuda.err "CUDA"
  run cudnn 3 "$tmp/small.yaml" --attention cudnn
  has cudnn.err "CUDA"
  run nccl 3 "$tmp/small.yaml" --transport nccl
elif [ "$auto_backend" = "cuda" ]; then
  # A GPU is present: auto used it, and --backend cuda runs and passes.
  run cuda 0 "$tmp/small.yaml" --backend cuda --iters 1 --warmup 0 --format json
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["backend"] == "cuda" and r["check"]["pass"] and r["transport"] == "local+staged"' \
    "$tmp/cuda.out" || fail "cuda: report not as expected"
  run nccl 3 "$tmp/small.yaml" --transport nccl
  has nccl.err "not available in this build"
else
  fail "auto: no backend in the report"
fi
# Options that contradict each other are usage errors (2), GPU or not.
run cudnn-cpu 2 "$tmp/small.yaml" --attention cudnn --backend cpu
has cudnn-cpu.err "--attention cudnn needs the CUDA backend, but --backend cpu was given"
run nvrtc-cpu 2 "$tmp/small.yaml" --attention nvrtc --backend cpu
run cpu-attn-cuda 2 "$tmp/small.yaml" --attention cpu --backend cuda
has cpu-attn-cuda.err "--attention cpu goes with --backend cpu"
run nccl-cpu 2 "$tmp/small.yaml" --transport nccl --backend cpu
has nccl-cpu.err "needs the CUDA backend"
run bad-backend 2 "$tmp/small.yaml" --backend tpu
run attn-cpu 0 "$tmp/small.yaml" --attention cpu --iters 1 --warmup 0 --format json
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["backend"] == "cpu" and r["attention"] == "cpu"' \
  "$tmp/attn-cpu.out" || fail "attn-cpu: --attention cpu must run on the CPU backend"
run calibrate-cuda 2 --calibrate --backend cuda
run calibrate 2 --calibrate "$tmp/small.yaml"
has calibrate.err "takes no plan"
run help 0 --help
has help.out "--output-shards"
run version 0 --version

# ---- --dry-run: buffers and peak memory, nothing runs ------------------------------------------
run dry 0 "$tmp/small.yaml" --dry-run
has dry.out "rank 3"
has dry.out "peak memory"
has dry.out "k_nxt"
run dry-json 0 "$tmp/small.yaml" --dry-run --format json
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["peak_memory_bytes_per_rank"] > 0 and r["ranks"] == 4' \
  "$tmp/dry-json.out" || fail "dry-json: bad JSON"

# ---- artifacts: cpc compiles, cprun runs the .cplan -----------------------------------------
if [ -x "$CPC" ] && "$CPC" "$tmp/small.yaml" -o "$tmp/small.cplan" >"$tmp/cpc.out" 2>"$tmp/cpc.err" \
   && [ -s "$tmp/small.cplan" ]; then
  run artifact 0 "$tmp/small.cplan" --iters 1 --warmup 0 --format json
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["ok"] and r["variant"] == "unified" and r["check"]["pass"]' \
    "$tmp/artifact.out" || fail "artifact: report not ok"
  run artifact-dry 0 "$tmp/small.cplan" --dry-run
  sed 's/world_size: 4/world_size: 8/' "$tmp/small.cplan" >"$tmp/tampered.cplan"
  run artifact-tampered 2 "$tmp/tampered.cplan"
  has artifact-tampered.err "hash"
  run artifact-set 2 "$tmp/small.cplan" --set model.heads=4
  # An artifact without PTX cannot run on the CUDA backend: an input error (2), GPU or not;
  # auto then runs it on the CPU.
  if "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/nokernels.cplan" >/dev/null 2>&1; then
    run artifact-nokernels 2 "$tmp/nokernels.cplan" --backend cuda
    has artifact-nokernels.err "compiled with --no-kernels or without CUDA"
    run artifact-nokernels-auto 0 "$tmp/nokernels.cplan" --iters 1 --warmup 0 --format json
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["backend"] == "cpu" and r["ok"]' \
      "$tmp/artifact-nokernels-auto.out" || fail "artifact-nokernels-auto: not run on the CPU"
  else
    fail "cpc --no-kernels failed"
  fi
else
  echo "cprun.sh: cpc cannot write artifacts here; artifact checks skipped" >&2
fi

# ---- the main job: FLUX.1-dev at 1008x1008 on 4 local ranks ------------------------------------
run flux 0 plans/flux1-dev-1008.yaml --warmup 0 --iters 1 --format json
python3 - "$tmp/flux.out" <<'EOF' || fail "flux: report not ok"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] and r["check"]["pass"], r
assert r["variant"] == "ulysses_anything" and r["ranks"] == 4, r
print("cprun.sh: flux1-dev-1008: %.1f ms per iteration, rel_err %.2e" % (r["ms_per_iter"], r["check"]["rel_err"]))
EOF

# ---- a long run says so before it starts and reports every iteration -----------------------------
# (a profile that makes the tiny plan's predicted time minutes long; the run itself is instant)
mkdir -p "$tmp/long"
printf 'device_profile: 1\nname: slow-cpu\nattn_tflops: 1e-9\nattn_tflops_fp32: 1e-9\nmem_gbps: 10\nintra_gbps: 5\n' >"$tmp/long/slow.yaml"
printf 'version: 1\nname: tiny\nmodel: {heads: 2, head_dim: 8, dtype: fp32}\ninput: {tokens: 64}\ncluster: {world_size: 2, device: cpu, profile: slow.yaml}\nparallel: {variant: ulysses}\n' >"$tmp/long/tiny.yaml"
run long 0 "$tmp/long/tiny.yaml" --warmup 1 --iters 2
grep -q "cprun: note: this run is predicted to take about [0-9]* s on the cpu backend" "$tmp/long.err" || fail "long: no notice before the run"
[ "$(grep -c '^cprun: iteration [1-3] of 3' "$tmp/long.err")" -eq 3 ] || fail "long: not one progress line per iteration"
run long-json 0 "$tmp/long/tiny.yaml" --format json
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/long-json.out" || fail "long-json: stdout is not one JSON object"
sed 's/, profile: slow.yaml//' "$tmp/long/tiny.yaml" >"$tmp/long/short.yaml"
run short 0 "$tmp/long/short.yaml"
grep -q "predicted to take" "$tmp/short.err" 2>/dev/null && fail "short: a notice for a short run"

if [ "$fails" -ne 0 ]; then
  echo "cprun.sh: $fails failure(s)" >&2
  exit 1
fi
echo "cprun.sh: all checks passed"
