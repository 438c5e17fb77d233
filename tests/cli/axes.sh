#!/usr/bin/env bash
# The outer axes run (SPEC section 1, "All four axes"; issue 15): plans with
# parallel.cfg_degree C x tp_degree T > 1 (world C*T*R*U, rank
# ((c*R + r)*U + u)*T + t) run on CPU ranks, as threads (local transport) and
# under `mpirun -np P` (one process per rank), checked against the float64
# reference of the whole problem:
#  1. C x T x R x U = 2x2x2x1 (ring), 2x1x2x2 (unified), 1x2x1x4 and 2x2x1x2
#     (ulysses), 1x8x1x1 and 8x1x1x1 (none), GQA with kv_heads < T (K/V heads
#     replicated), fp32 and bf16, causal, key padding (the mask sliced by
#     batch): the JSON report passes and names cfg_degree, tp_degree and P
#     ranks; --output under mpirun is byte for byte the local one, and both
#     are byte for byte the output of the same R x U plan on the whole batch
#     and every head (C = T = 1): each (batch, head) is computed by the same
#     kernels on the same tokens, so any difference is a slicing bug;
#  2. --input: q, k, v and the mask read from one global safetensors file,
#     each rank its batch/head box: the same bytes as the C = T = 1 run on
#     that file, locally and under mpirun; the gathered out and LSE against a
#     float64 numpy reference (where numpy is installed); a value that
#     overflows fp16 in one rank's box: that rank names it and the job ends;
#  3. `cpc PLAN` writes a .cplan for C*T > 1 (its mesh records C and T);
#     cprun runs it (proved again on load) with the YAML run's output;
#     `cpc --dump-schedule --rank` takes a world rank;
#  4. training (local): forward and backward of a C*T plan pass their check
#     (dK/dV of K/V heads replicated over tensor-parallel ranks are summed);
#  5. --output-shards records each shard's batch and head slice, --trace has
#     one track per world rank, and mpirun with the wrong -np names C*T*R*U.
# Small shapes (256 tokens, head_dim 32): CI runs on 2 cores.
# Runs from the repository root; binaries in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPC="$B/cpc"
CPRUN="$B/cprun"
[ -x "$CPRUN" ] && [ -x "$CPC" ] || { echo "axes.sh: $CPRUN or $CPC not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
. tests/cli/lib/harness.sh  # fail, has, t, mpi_setup
mpi_setup
t_start=$(date +%s%N)

# plan NAME VARIANT C T R U H HKV DTYPE MASK BATCH [MODE]: the plan with the
# axes (NAME.yaml) and its C = T = 1 counterpart (NAME-rxu.yaml)
plan() {
  local n=$1 v=$2 C=$3 T=$4 R=$5 U=$6 H=$7 K=$8 dt=$9 mask=${10} b=${11} mode=${12:-inference}
  cat >"$tmp/$n.yaml" <<EOF
version: 1
name: $n
model: {heads: $H, kv_heads: $K, head_dim: 32, dtype: $dt}
input: {batch: $b, tokens: 256, mask: $mask, mode: $mode}
cluster: {world_size: $((C * T * R * U)), device: cpu}
parallel: {variant: $v, ring_degree: $R, ulysses_degree: $U, cfg_degree: $C, tp_degree: $T}
EOF
  cat >"$tmp/$n-rxu.yaml" <<EOF
version: 1
name: $n
model: {heads: $H, kv_heads: $K, head_dim: 32, dtype: $dt}
input: {batch: $b, tokens: 256, mask: $mask, mode: $mode}
cluster: {world_size: $((R * U)), device: cpu}
parallel: {variant: $v, ring_degree: $R, ulysses_degree: $U}
EOF
}

# jcheck FILE C T P: the JSON report passes with these axes and ranks;
# prints "rel_err max_abs_err ms_per_iter"
jcheck() {
  python3 - "$@" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
C, T, P = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
assert r["ok"] and r["check"]["pass"], r
assert r["cfg_degree"] == C and r["tp_degree"] == T and r["ranks"] == P, r
print("%.3e %.3e %.2f" % (r["check"]["rel_err"], r["check"]["max_abs_err"], r["ms_per_iter"]))
PY
}

printf '%-22s %-6s %-10s %-10s %-8s\n' case transport rel_err max_abs ms
# ---- 1: numerics, local and mpirun, against the R x U run ------------------------------
# case NAME VARIANT C T R U H HKV DTYPE MASK BATCH
case_() {
  local n=$1 C=$3 T=$4 R=$5 U=$6
  local P=$((C * T * R * U))
  plan "$@"
  "$CPRUN" "$tmp/$n.yaml" --iters 1 --warmup 0 --lse --output "$tmp/$n.local.st" --format json \
    >"$tmp/$n.json" 2>"$tmp/$n.err" || { fail "$n: local: exit $?: $(cat "$tmp/$n.err")"; return; }
  local m
  m=$(jcheck "$tmp/$n.json" "$C" "$T" "$P") || { fail "$n: local report: $(cat "$tmp/$n.json")"; return; }
  printf '%-22s %-6s %s\n' "$n" local "$m"
  "$CPRUN" "$tmp/$n-rxu.yaml" --iters 1 --warmup 0 --lse --output "$tmp/$n.rxu.st" \
    >"$tmp/$n.rxu.out" 2>"$tmp/$n.rxu.err" || { fail "$n: the R x U plan: $(cat "$tmp/$n.rxu.err")"; return; }
  cmp -s "$tmp/$n.local.st" "$tmp/$n.rxu.st" || fail "$n: output differs from the R x U plan's on the whole problem"
  if [ $have_mpi = 1 ]; then
    timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np "$P" "$CPRUN" "$tmp/$n.yaml" --iters 1 \
      --warmup 0 --lse --output "$tmp/$n.mpi.st" --format json >"$tmp/$n.mjson" 2>"$tmp/$n.merr" ||
      { fail "$n: mpirun -np $P: exit $?: $(tail -5 "$tmp/$n.merr")"; return; }
    m=$(jcheck "$tmp/$n.mjson" "$C" "$T" "$P") || { fail "$n: mpi report: $(cat "$tmp/$n.mjson")"; return; }
    printf '%-22s %-6s %s\n' "$n" mpi "$m"
    grep -q '"transport":"mpi"' "$tmp/$n.mjson" || fail "$n: the mpirun report's transport is not mpi"
    cmp -s "$tmp/$n.local.st" "$tmp/$n.mpi.st" || fail "$n: --output under mpirun differs from the local one"
  fi
}

# a cprun built without MPI says so: the mpirun half is skipped then
plan probe ring 2 2 2 1 8 8 fp32 none 2
if [ $have_mpi = 1 ] && "$CPRUN" "$tmp/probe.yaml" --transport mpi --iters 1 2>&1 | grep -q "no MPI support"; then
  have_mpi=0
fi
case_ c2t2r2-fp32          ring     2 2 2 1 8 8 fp32 none        2
case_ c2t2r2-bf16-causal   ring     2 2 2 1 8 8 bf16 causal      2
case_ c2t1r2u2-fp32        unified  2 1 2 2 8 4 fp32 none        2
case_ c2t1r2u2-bf16-causal unified  2 1 2 2 8 4 bf16 causal      2
case_ c1t2u4-bf16          ulysses  1 2 1 4 8 8 bf16 none        1
case_ c1t2u4-fp32-causal   ulysses  1 2 1 4 8 8 fp32 causal      1
case_ c2t2u2-fp32-padding  ulysses  2 2 1 2 8 4 fp32 key_padding 2
case_ c1t8-fp32-causal     none     1 8 1 1 8 8 fp32 causal      1
case_ c8t1-bf16            none     8 1 1 1 4 2 bf16 none        8
# GQA with kv_heads < tp_degree: each K/V head replicated to T/Hkv ranks
case_ gqa-t4-hkv2-fp32     ring     1 4 2 1 8 2 fp32 causal      1
case_ gqa-t8-hkv1-bf16     none     1 8 1 1 8 1 bf16 none        1

# ---- 2: --input, every rank its box of the global file --------------------------------
plan inp ulysses 2 2 1 2 8 4 fp32 key_padding 2
python3 - "$tmp" <<'PY'
import json, struct, random, sys, os
d = sys.argv[1]
random.seed(15)
def write(path, tensors):
    hdr, blobs, off = {}, [], 0
    for name, dt, shape, vals in tensors:
        b = struct.pack("<%d%s" % (len(vals), {"F32": "f", "U8": "B"}[dt]), *vals)
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    j = json.dumps(hdr).encode(); j += b" " * (-len(j) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + b"".join(blobs))
B, S, H, K, D = 2, 256, 8, 4, 32
g = lambda n: [random.gauss(0, 1) for _ in range(n)]
mask = [0 if random.random() < 0.2 else 1 for _ in range(B * S)]
write(os.path.join(d, "qkv.st"), [("q", "F32", [B, S, H, D], g(B * S * H * D)),
      ("k", "F32", [B, S, K, D], g(B * S * K * D)), ("v", "F32", [B, S, K, D], g(B * S * K * D)),
      ("mask", "U8", [B, S], mask)])
PY
"$CPRUN" "$tmp/inp.yaml" --input "$tmp/qkv.st" --iters 1 --warmup 0 --lse --output "$tmp/inp.local.st" --format json \
  >"$tmp/inp.json" 2>"$tmp/inp.err" || fail "input: local: $(cat "$tmp/inp.err")"
# out and LSE of the gathered global tensors against float64 (numpy, where installed)
py=""
for c in python3 /usr/bin/python3; do "$c" -c "import numpy" 2>/dev/null && { py=$c; break; }; done
if [ -z "$py" ]; then
  echo "axes.sh: no numpy: the out/LSE comparison with float64 is skipped (cprun's check still runs)"
else
  "$py" - "$tmp" <<'PY' || fail "input: out/LSE against float64"
import json, struct, sys, os
import numpy as np
d = sys.argv[1]
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); r = {}
    for k, v in h.items():
        if k != "__metadata__":
            s, e = v["data_offsets"]
            r[k] = np.frombuffer(b[8 + n + s:8 + n + e], {"F32": np.float32, "U8": np.uint8}[v["dtype"]]).reshape(v["shape"])
    return r
i, o = load(os.path.join(d, "qkv.st")), load(os.path.join(d, "inp.local.st"))
q, k, v, m = (i[x].astype(np.float64) for x in ("q", "k", "v", "mask"))
k, v = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(32)
s = np.where(m[:, None, None, :] > 0, s, -np.inf)
mx = s.max(-1, keepdims=True)
lse = (np.log(np.exp(s - mx).sum(-1)) + mx[..., 0])
ref = np.einsum("bhqk,bkhd->bqhd", np.exp(s - lse[..., None]), v)
eo = np.abs(o["out"] - ref).max() / np.abs(ref).max()
el = np.abs(o["lse"] - lse).max() / np.abs(lse).max()
print("input-c2t2u2 vs float64: out max rel err %.3e, LSE max rel err %.3e" % (eo, el))
assert eo < 1e-5 and el < 1e-6, (eo, el)
PY
fi
m=$(jcheck "$tmp/inp.json" 2 2 8) && printf '%-22s %-6s %s\n' input-c2t2u2 local "$m" || fail "input: local report"
"$CPRUN" "$tmp/inp-rxu.yaml" --input "$tmp/qkv.st" --iters 1 --warmup 0 --lse --output "$tmp/inp.rxu.st" \
  >/dev/null 2>"$tmp/inp.rxu.err" || fail "input: R x U: $(cat "$tmp/inp.rxu.err")"
cmp -s "$tmp/inp.local.st" "$tmp/inp.rxu.st" || fail "input: output differs from the R x U plan's"
if [ $have_mpi = 1 ]; then
  timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 8 "$CPRUN" "$tmp/inp.yaml" --input "$tmp/qkv.st" \
    --iters 1 --warmup 0 --lse --output "$tmp/inp.mpi.st" >/dev/null 2>"$tmp/inp.merr" ||
    fail "input: mpirun: $(tail -3 "$tmp/inp.merr")"
  cmp -s "$tmp/inp.local.st" "$tmp/inp.mpi.st" || fail "input: mpirun output differs from the local one"
fi

# one rank's box holds a value that overflows fp16: that rank (world rank 7 = c 1, t 1,
# u 1) names it and the whole job ends, locally and under mpirun (no group left waiting)
python3 - "$tmp" <<'PY'
import json, struct, sys, os
d = sys.argv[1]
b = bytearray(open(os.path.join(d, "qkv.st"), "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
off = 8 + n + h["k"]["data_offsets"][0] + 4 * (((1 * 256 + 200) * 4 + 3) * 32 + 5)
b[off:off + 4] = struct.pack("<f", 1e6)
open(os.path.join(d, "inf.st"), "wb").write(bytes(b))
PY
sed 's/dtype: fp32/dtype: fp16/' "$tmp/inp.yaml" >"$tmp/inp16.yaml"
timeout 60 "$CPRUN" "$tmp/inp16.yaml" --input "$tmp/inf.st" --iters 1 >/dev/null 2>"$tmp/inf.err"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 7: .*element \[1, 200, 3, 5\] = 1e+06 rounds to Inf" "$tmp/inf.err" ||
  fail "overflow in one rank's box: exit $rc: $(cat "$tmp/inf.err")"
if [ $have_mpi = 1 ]; then
  timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 8 "$CPRUN" "$tmp/inp16.yaml" --input "$tmp/inf.st" \
    --iters 1 >/dev/null 2>"$tmp/inf.merr"
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "element \[1, 200, 3, 5\]" "$tmp/inf.merr" ||
    fail "overflow under mpirun: exit $rc: $(tail -3 "$tmp/inf.merr")"
fi

# ---- 3: the .cplan of a C*T plan -------------------------------------------------------
"$CPC" "$tmp/c2t1r2u2-fp32.yaml" -o "$tmp/axes.cplan" --no-kernels >"$tmp/cpc.out" 2>&1 ||
  fail "cpc writes no .cplan for cfg_degree 2: $(cat "$tmp/cpc.out")"
grep -q "^  cfg_degree: 2$" "$tmp/axes.cplan" && grep -q "^  world_size: 8$" "$tmp/axes.cplan" &&
  grep -q "rank_rule: p = ((c \* ring_degree + r) \* ulysses_degree + u) \* tp_degree + t" "$tmp/axes.cplan" ||
  fail ".cplan mesh: $(grep -A8 '^mesh' "$tmp/axes.cplan")"
# --dump-schedule --rank takes a world rank: 7 = rank 3 of group (c 1, t 0)
"$CPC" "$tmp/c2t1r2u2-fp32.yaml" --dump-schedule --rank 7 >"$tmp/dump.out" 2>&1 &&
  grep -q "^# world rank 7: rank 3 of group (c 1, t 0)" "$tmp/dump.out" && grep -q "rank=3 r=1 u=1" "$tmp/dump.out" ||
  fail "--dump-schedule --rank 7: $(head -3 "$tmp/dump.out")"
"$CPRUN" "$tmp/axes.cplan" --iters 1 --warmup 0 --lse --output "$tmp/cplan.st" >"$tmp/cplan.out" 2>&1 ||
  fail "cprun the .cplan: $(cat "$tmp/cplan.out")"
grep -q "^check:       PASS" "$tmp/cplan.out" || fail ".cplan run: no PASS"
cmp -s "$tmp/cplan.st" "$tmp/c2t1r2u2-fp32.local.st" || fail ".cplan output differs from the YAML run's"
if [ $have_mpi = 1 ]; then
  timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 8 "$CPRUN" "$tmp/axes.cplan" --iters 1 \
    --warmup 0 --lse --output "$tmp/cplan.mpi.st" >/dev/null 2>"$tmp/cplan.merr" ||
    fail ".cplan under mpirun: $(tail -3 "$tmp/cplan.merr")"
  cmp -s "$tmp/cplan.st" "$tmp/cplan.mpi.st" || fail ".cplan: mpirun output differs"
  # the wrong -np: every rank exits 2 naming the job's world
  timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 4 "$CPRUN" "$tmp/axes.cplan" --iters 1 \
    >"$tmp/np.out" 2>"$tmp/np.err"
  rc=$?
  [ $rc -eq 2 ] || fail "-np 4 for 8 ranks: exit $rc, 2 expected"
  grep -q "needs world_size 8 (cfg_degree 2 x tp_degree 1 x ring_degree 2 x ulysses_degree 2) but the job has 4" "$tmp/np.err" ||
    fail "-np 4: the message does not name C*T*R*U: $(head -3 "$tmp/np.err")"
  grep -q "ring_degree 8" "$tmp/np.err" && fail "-np 4: the message names the job's world as a ring of 8"
fi

# ---- 4: training (local) ---------------------------------------------------------------
for spec in "tr-c2t2r2-fp32 ring 2 2 2 1 4 4 fp32 causal 2" "tr-gqa-t4-bf16 ring 1 4 2 1 8 2 bf16 none 1" \
            "tr-c2t2-none-fp32 none 2 2 1 1 4 1 fp32 key_padding 2"; do
  set -- $spec
  plan "$@" training
  "$CPRUN" "$tmp/$1.yaml" --iters 1 --warmup 0 >"$tmp/$1.out" 2>"$tmp/$1.err" ||
    { fail "$1: exit $?: $(cat "$tmp/$1.err")"; continue; }
  grep -q "^check:       PASS" "$tmp/$1.out" && grep -q "^bwd check:   PASS" "$tmp/$1.out" ||
    fail "$1: $(grep check "$tmp/$1.out")"
  grep "^bwd check" "$tmp/$1.out" | sed "s/^/$1: /"
done

# ---- 5: shards, trace ------------------------------------------------------------------
"$CPRUN" "$tmp/c2t2u2-fp32-padding.yaml" --iters 2 --warmup 0 --output-shards "$tmp/shards" \
  --trace "$tmp/trace.json" >/dev/null 2>"$tmp/sh.err" || fail "shards: $(cat "$tmp/sh.err")"
python3 - "$tmp" <<'PY' || fail "shards / trace"
import json, struct, sys, os
d = sys.argv[1]
seen = set()
for p in range(8):
    b = open(os.path.join(d, "shards", "rank%d.safetensors" % p), "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    m = h["__metadata__"]
    t, u, c = p % 2, p // 2 % 2, p // 4          # p = ((c*R + r)*U + u)*T + t, R = 1
    assert m["rank"] == str(p) and m["world_size"] == "8", m
    assert m["batch"] == "%d:1" % c and m["heads"] == "%d:4" % (4 * t), (p, m)
    assert h["out"]["shape"] == [1, 128, 4, 32], h["out"]
    seen.add((c, t, m["tokens"]))
assert len(seen) == 8, seen
ev = [e for e in json.load(open(os.path.join(d, "trace.json")))["traceEvents"] if e["ph"] == "X"]
assert {e["tid"] for e in ev} == set(range(8)), {e["tid"] for e in ev}
PY

echo "axes.sh: $(( ($(date +%s%N) - t_start) / 1000000 )) ms, mpi $([ $have_mpi = 1 ] && echo yes || echo skipped)"
[ $fails -eq 0 ] || { echo "axes.sh: $fails failure(s)" >&2; exit 1; }
echo "axes.sh: all passed"
