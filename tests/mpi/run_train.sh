#!/usr/bin/env bash
# Training under mpirun (SPEC section 10, issue 16): cprun on a mode: training plan,
# one process per rank (the MPI transport), runs the forward and the backward,
# gathers dq, dk, dv to rank 0 (blobs on the world group) and checks them against
# the float64 reference:
#  1. none (-np 1), ring at -np 2, 4, ulysses and unified at 4, ulysses_anything at 3
#     (fp32, bf16, fp16; causal zigzag, GQA with shared K/V heads, MQA, key padding, an
#     uneven split): exit 0, the JSON report's "backward" check passes, transport mpi;
#  2. rank 0's --output (out, dq, dk, dv in the plan dtype, global BSHD) is byte for
#     byte the local transport's (every rank a thread of one process), and holds
#     dq [B,S,H,D], dk and dv [B,S,Hkv,D] in the plan dtype;
#     (also with --lse: out, lse, dq, dk, dv);
#     and with the outer axes (cfg_degree 2 x tp_degree 2 x ring 2 at -np 8);
#  3. `dout` from --input (each rank reads its shard) under mpirun: checked, and
#     identical to the local transport's run on the same file; a different dout gives
#     different gradients (the file's dout is the one used).
# Each mpirun has 60 s (a hang is a failure, not a stuck test).
#   usage: run_train.sh CPRUN [MPIRUN]
set -u
cprun=${1:?usage: run_train.sh CPRUN [MPIRUN]}
mpirun=${2:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

failed() {
    echo "run_train: FAILED: $*"
    sed 's/^/  | /' "$tmp/err" | head -15
    status=1
}

# plan NAME VARIANT WORLD DTYPE MASK H HKV TOKENS
plan() {
    cat >"$tmp/$1.yaml" <<EOF
version: 1
name: $1
model: {heads: $6, kv_heads: $7, head_dim: 32, dtype: $4}
input: {batch: 2, tokens: $8, mask: $5, mode: training}
cluster: {world_size: $3, device: cpu}
parallel: {variant: $2}
EOF
}

# header FILE: "name:dtype:shape;..." of a safetensors file, in order
header() {
    python3 - "$1" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h.pop("__metadata__", None)
ts = sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0])
print(";".join("%s:%s:%s" % (k, v["dtype"], ",".join(map(str, v["shape"]))) for k, v in ts))
PY
}

# bwd_pass FILE: the JSON report's backward check passed (prints the errors)
bwd_pass() {
    python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["backward"]["check"]
assert r["ok"] is True and c["pass"] is True, r
print("dq %.2e dk %.2e dv %.2e" % tuple(c[k]["rel_err"] for k in ("dq", "dk", "dv")))
PY
}

# train NAME VARIANT N DTYPE MASK H HKV TOKENS [cprun args...]
train() {
    local name=$1 v=$2 n=$3 dt=$4 mask=$5 h=$6 hkv=$7 tok=$8
    shift 8
    plan "$name" "$v" "$n" "$dt" "$mask" "$h" "$hkv" "$tok"
    rm -f "$tmp/mpi.st" "$tmp/local.st"
    timeout -k 5 60 "$mpirun" --allow-run-as-root --oversubscribe -np "$n" "$cprun" "$tmp/$name.yaml" \
        --transport mpi --check --format json --warmup 0 --iters 1 --output "$tmp/mpi.st" "$@" \
        >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 0 ] || { failed "$name: mpirun -np $n: exit $rc"; return; }
    local errs
    errs=$(bwd_pass "$tmp/out" 2>"$tmp/err") || { failed "$name: backward check under MPI"; return; }
    grep -q '"transport": *"mpi"' "$tmp/out" || { failed "$name: the report's transport is not mpi"; return; }
    "$cprun" "$tmp/$name.yaml" --transport local --check --format json --warmup 0 --iters 1 \
        --output "$tmp/local.st" "$@" >"$tmp/lout" 2>"$tmp/err" ||
        { failed "$name: the local-transport run failed"; return; }
    bwd_pass "$tmp/lout" >/dev/null 2>"$tmp/err" || { failed "$name: backward check, local"; return; }
    cmp -s "$tmp/mpi.st" "$tmp/local.st" ||
        { failed "$name: rank 0's --output differs from the local transport's"; return; }
    local st=${dt^^}
    [ "$st" = FP32 ] && st=F32
    [ "$st" = FP16 ] && st=F16
    local want="out:$st:2,$tok,$h,32;dq:$st:2,$tok,$h,32;dk:$st:2,$tok,$hkv,32;dv:$st:2,$tok,$hkv,32"
    local got
    got=$(header "$tmp/mpi.st")
    [ "$got" = "$want" ] || { failed "$name: --output tensors '$got', expected '$want'"; return; }
    printf 'run_train: %-28s -np %d ok, byte-identical to local; rel err %s\n' "$name" "$n" "$errs"
}

train none-fp32-causal   none 1 fp32 causal      4 4 128
train ring2-fp32         ring 2 fp32 none        4 2 128
train ring2-bf16-mqa     ring 2 bf16 causal      4 1 128
train ring4-bf16-gqa     ring 4 bf16 causal      4 2 256
train ring4-fp16         ring 4 fp16 none        4 4 128
train ring4-padding      ring 4 fp32 key_padding 4 2 128
train ulysses4-bf16      ulysses 4 bf16 causal   8 2 128
train unified4-fp32      unified 4 fp32 none     4 2 128
train ulysses_any3-fp32  ulysses_anything 3 fp32 none 4 1 129

# the outer axes: cfg_degree 2 x tp_degree 2 x ring 2 (8 processes; Hkv 1 < T 2: each
# tp rank's dK/dV part of the replicated K/V head is summed on rank 0)
cat >"$tmp/axes.yaml" <<EOF
version: 1
name: axes
model: {heads: 4, kv_heads: 1, head_dim: 32, dtype: fp32}
input: {batch: 2, tokens: 128, mask: causal, mode: training}
cluster: {world_size: 8, device: cpu}
parallel: {variant: ring, ring_degree: 2, cfg_degree: 2, tp_degree: 2}
EOF
timeout -k 5 60 "$mpirun" --allow-run-as-root --oversubscribe -np 8 "$cprun" "$tmp/axes.yaml" --transport mpi \
    --format json --warmup 0 --iters 1 --output "$tmp/axes-mpi.st" >"$tmp/out" 2>"$tmp/err" &&
    errs=$(bwd_pass "$tmp/out" 2>>"$tmp/err") &&
    "$cprun" "$tmp/axes.yaml" --transport local --warmup 0 --iters 1 --output "$tmp/axes-local.st" \
        >/dev/null 2>"$tmp/err" &&
    cmp -s "$tmp/axes-mpi.st" "$tmp/axes-local.st" &&
    printf 'run_train: %-28s -np 8 ok, byte-identical to local; rel err %s\n' "cfg2-tp2-ring2" "$errs" ||
    failed "cfg 2 x tp 2 x ring 2: failed, or MPI and local outputs differ"

# --lse too: out, lse, dq, dk, dv in one file, identical across transports
plan lse ring 2 bf16 causal 4 2 128
timeout -k 5 60 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$cprun" "$tmp/lse.yaml" --transport mpi \
    --warmup 0 --iters 1 --lse --output "$tmp/lse-mpi.st" >/dev/null 2>"$tmp/err" &&
    "$cprun" "$tmp/lse.yaml" --transport local --warmup 0 --iters 1 --lse --output "$tmp/lse-local.st" \
        >/dev/null 2>"$tmp/err" || failed "--lse: a run failed"
h=$(header "$tmp/lse-mpi.st" 2>/dev/null)
[ "$h" = "out:BF16:2,128,4,32;lse:F32:2,4,128;dq:BF16:2,128,4,32;dk:BF16:2,128,2,32;dv:BF16:2,128,2,32" ] ||
    failed "--lse: tensors '$h'"
cmp -s "$tmp/lse-mpi.st" "$tmp/lse-local.st" || failed "--lse: MPI and local outputs differ"

# ---- 3: dout from --input under mpirun -------------------------------------------
plan din ring 4 fp32 causal 4 2 128
python3 - "$tmp/in.st" "$tmp/in2.st" <<'PY'
import json, random, struct, sys
def write(path, seed):
    rnd = random.Random(seed)
    shapes = {"q": [2, 128, 4, 32], "k": [2, 128, 2, 32], "v": [2, 128, 2, 32], "dout": [2, 128, 4, 32]}
    hdr, data, off = {}, b"", 0
    for name, shp in shapes.items():
        n = shp[0] * shp[1] * shp[2] * shp[3]
        # q, k, v the same in both files; dout differs
        r = random.Random(7 + len(name)) if name != "dout" else rnd
        buf = struct.pack("<%df" % n, *(r.gauss(0, 1) for _ in range(n)))
        hdr[name] = {"dtype": "F32", "shape": shp, "data_offsets": [off, off + len(buf)]}
        data += buf
        off += len(buf)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
write(sys.argv[1], 1)
write(sys.argv[2], 2)
PY
train din-file ring 4 fp32 causal 4 2 128 --input "$tmp/in.st"
cp "$tmp/mpi.st" "$tmp/din1.st" 2>/dev/null
timeout -k 5 60 "$mpirun" --allow-run-as-root --oversubscribe -np 4 "$cprun" "$tmp/din.yaml" --transport mpi \
    --format json --warmup 0 --iters 1 --input "$tmp/in2.st" --output "$tmp/din2.st" >"$tmp/out" 2>"$tmp/err" &&
    bwd_pass "$tmp/out" >/dev/null || failed "din-file: the second dout"
python3 - "$tmp/din1.st" "$tmp/din2.st" <<'PY' || { echo "run_train: FAILED: a different dout gave the same gradients (or out differs)"; status=1; }
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a["out"] == b["out"]            # same q, k, v
for k in ("dq", "dk", "dv"):
    assert a[k] != b[k], k             # dout came from the file
PY

[ $status -eq 0 ] && echo "run_train: all passed"
exit $status
