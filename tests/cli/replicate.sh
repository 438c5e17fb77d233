#!/usr/bin/env bash
# Replicated segments (`split: replicate`, SPEC section 1; issue 24): a
# segment held whole by every rank, never divided, its queries computed on
# every rank, every query meeting every key once.  cprun runs every variant
# with a replicated text segment against the float64 reference of the whole
# problem, on fresh random inputs (a new seed per case), at even and odd
# lengths:
#  1. ring, ring_anything, ulysses, ulysses_anything, unified (the issue's
#     CogVideoX shape: 226 text tokens on ring 2 x ulysses 3), all-gather
#     rotation, overlap off, GQA bf16, batch 2, key padding, a replicated
#     segment after the sharded one, cfg and tp axes; as threads (local) and,
#     where mpirun works, one process per rank (its --output byte for byte
#     the local one's);
#  2. the gathered output equals (to rounding) the output of the same
#     problem with the text sharded (the same attention, another layout);
#  3. a .cplan written by cpc runs (proved again on load) with the YAML
#     run's output; --output-shards holds each rank's own tokens (its shard
#     plus the whole text);
#  3b. --input with --lse: out and the LSE of every row (replicated ones too)
#     against a float64 reference computed by the script;
#  4. training checks (replicate_training.sh runs it); refusals: every segment replicated (CP027), a bad
#     `split:` value (CP103 at file:line:col), all exit 1.
# Small shapes; CI runs on 2 cores.  Runs from the repository root; binaries
# in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPC="$B/cpc"
CPRUN="$B/cprun"
[ -x "$CPRUN" ] || { echo "replicate.sh: $CPRUN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
. tests/cli/lib/harness.sh  # fail, has, t, mpi_setup
mpi_setup
t_start=$(date +%s%N)

# plan NAME VARIANT WORLD TEXT IMAGE [PARALLEL_EXTRA] [H] [DTYPE] [MODEL_EXTRA] [BATCH] [INPUT_EXTRA] [SPLIT]
plan() {
  cat >"$tmp/$1.yaml" <<EOF
version: 1
name: $1
model: {heads: ${7:-6}, head_dim: 16, dtype: ${8:-fp32}${9:-}}
input:
  batch: ${10:-1}
  segments:
    - {name: text, tokens: $4, split: ${12:-replicate}}
    - {name: image, tokens: $5}${11:-}
cluster: {world_size: $3, device: cpu}
parallel: {variant: $2${6:-}}
EOF
}

# jcheck FILE P: the JSON report passes on P ranks; prints "rel_err max_abs_err"
jcheck() {
  python3 - "$@" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] and r["check"]["pass"], r
assert r["ranks"] == int(sys.argv[2]), r
print("%.3e %.3e" % (r["check"]["rel_err"], r["check"]["max_abs_err"]))
PY
}

seed=$(( $(date +%s) % 100000 ))
echo "replicate.sh: seed base $seed"
printf '%-16s %-6s %-10s %-10s\n' case where rel_err max_abs
# case NAME P MPI(0|1): runs $tmp/NAME.yaml locally (and under mpirun when MPI is 1)
case_() {
  local n=$1 P=$2 mpi=$3 m
  seed=$((seed + 1))
  "$CPRUN" "$tmp/$n.yaml" --iters 1 --warmup 0 --seed $seed --output "$tmp/$n.local.st" --format json \
    >"$tmp/$n.json" 2>"$tmp/$n.err" || { fail "$n: local: exit $?: $(cat "$tmp/$n.err")"; return; }
  m=$(jcheck "$tmp/$n.json" "$P") || { fail "$n: local report: $(cat "$tmp/$n.json")"; return; }
  printf '%-16s %-6s %s\n' "$n" local "$m"
  if [ "$mpi" = 1 ] && [ $have_mpi = 1 ]; then
    timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np "$P" "$CPRUN" "$tmp/$n.yaml" --iters 1 \
      --warmup 0 --seed $seed --output "$tmp/$n.mpi.st" --format json >"$tmp/$n.mjson" 2>"$tmp/$n.merr" ||
      { fail "$n: mpirun -np $P: exit $?: $(tail -5 "$tmp/$n.merr")"; return; }
    m=$(jcheck "$tmp/$n.mjson" "$P") || { fail "$n: mpi report: $(cat "$tmp/$n.mjson")"; return; }
    printf '%-16s %-6s %s\n' "$n" mpi "$m"
    cmp -s "$tmp/$n.local.st" "$tmp/$n.mpi.st" || fail "$n: --output under mpirun differs from the local one"
  fi
}

# a cprun built without MPI says so: the mpirun half is skipped then
plan probe ring 2 8 24
if [ $have_mpi = 1 ] && "$CPRUN" "$tmp/probe.yaml" --transport mpi --iters 1 2>&1 | grep -q "no MPI support"; then
  have_mpi=0
fi

# ---- 1: every variant, even and odd lengths ---------------------------------------------
plan ring2 ring 2 8 24;                              case_ ring2 2 1
plan ring3odd ring 3 7 24;                           case_ ring3odd 3 0
plan ringany3 ring_anything 3 7 25;                  case_ ringany3 3 1
plan uly2odd ulysses 2 7 24;                         case_ uly2odd 2 1
plan uly3 ulysses 3 9 24;                            case_ uly3 3 0
plan ulyany3 ulysses_anything 3 5 25 "" 7;           case_ ulyany3 3 0
plan cogvideox unified 6 226 24 ", ring_degree: 2, ulysses_degree: 3"; case_ cogvideox 6 1
plan unified4odd unified 4 9 32 ", ring_degree: 2, ulysses_degree: 2"; case_ unified4odd 4 0
plan allgather ring 3 7 24;  echo "schedule: {rotate: allgather}" >>"$tmp/allgather.yaml"; case_ allgather 3 0
plan nooverlap ring 2 7 24;  echo "schedule: {overlap: false}" >>"$tmp/nooverlap.yaml"; case_ nooverlap 2 0
plan gqa ulysses 2 7 24 "" 4 bf16 ", kv_heads: 2" 2; case_ gqa 2 0
plan keypad ulysses_anything 3 7 25 "" 6 fp32 "" 1 "
  mask: key_padding";                                case_ keypad 3 0
plan tail ring_anything 2 5 25 "" 6 fp32 "" 1 "
    - {name: tail, tokens: 3, split: replicate}";    case_ tail 2 0
plan cfg ring 4 7 24 ", cfg_degree: 2" 6 fp32 "" 2; case_ cfg 4 0
plan tp ulysses 4 7 24 ", tp_degree: 2" 8;           case_ tp 4 0

# ---- 2: the same problem, text sharded: the same output to rounding ---------------------
plan sharded ring 2 8 24 "" 6 fp32 "" 1 "" shard
"$CPRUN" "$tmp/sharded.yaml" --iters 1 --warmup 0 --seed 7 --output "$tmp/sharded.st" >/dev/null 2>&1 ||
  fail "sharded: cprun failed"
"$CPRUN" "$tmp/ring2.yaml" --iters 1 --warmup 0 --seed 7 --output "$tmp/ring2.seed7.st" >/dev/null 2>&1 ||
  fail "ring2 seed 7: cprun failed"
python3 - "$tmp/sharded.st" "$tmp/ring2.seed7.st" <<'PY' || fail "replicated and sharded text give different outputs"
import json, struct, sys, array
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + n])["out"]
    s, e = t["data_offsets"]
    assert t["dtype"] == "F32", t
    a = array.array("f")
    a.frombytes(b[8 + n + s:8 + n + e])
    return t["shape"], a
(sa, a), (sc, c) = load(sys.argv[1]), load(sys.argv[2])
assert sa == sc == [1, 32, 6, 16], (sa, sc)
assert max(abs(x) for x in a) > 0.05, "a zero output"
d = max(abs(x - y) for x, y in zip(a, c))
print("replicated vs sharded text: max |diff| %.2e" % d)
assert d < 1e-5, d
PY

# ---- 3: the artifact runs; --output-shards holds each rank's own tokens ------------------
"$CPC" "$tmp/cogvideox.yaml" -o "$tmp/cogvideox.cplan" --no-kernels >/dev/null 2>"$tmp/cplan.err" ||
  fail "cpc -o: $(cat "$tmp/cplan.err")"
"$CPRUN" "$tmp/cogvideox.cplan" --iters 1 --warmup 0 --seed 11 --output "$tmp/cv.a.st" \
  --output-shards "$tmp/shards" >"$tmp/cv.a.out" 2>&1 || fail "cprun cogvideox.cplan: $(cat "$tmp/cv.a.out")"
grep -q PASS "$tmp/cv.a.out" || fail "cprun cogvideox.cplan: no PASS"
"$CPRUN" "$tmp/cogvideox.yaml" --iters 1 --warmup 0 --seed 11 --output "$tmp/cv.y.st" >/dev/null 2>&1
cmp -s "$tmp/cv.a.st" "$tmp/cv.y.st" || fail "the .cplan run's output differs from the YAML run's"
python3 - "$tmp/shards" "$tmp/cv.y.st" <<'PY' || fail "--output-shards: a rank's tokens are not its shard plus the whole text"
import json, struct, sys, array
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + n])["out"]
    s, e = t["data_offsets"]
    a = array.array("f")
    a.frombytes(b[8 + n + s:8 + n + e])
    return t["shape"], a
(fs, full) = load(sys.argv[2])
row = fs[2] * fs[3]
for p in range(6):
    sh, o = load("%s/rank%d.safetensors" % (sys.argv[1], p))
    # rank p holds text [0, 226) whole, then image chunk p of 24 over 6 ranks (4 tokens)
    assert sh[1] == 226 + 4, (p, sh)
    rows = list(range(226)) + list(range(226 + 4 * p, 226 + 4 * p + 4))
    # the image rows are this rank's own (bitwise); the text rows were computed
    # on every rank (the gathered copy is one rank's): equal to rounding, as
    # each ring rank merges the key blocks in its own order
    worst = 0.0
    for i, g in enumerate(rows):
        a, b = o[i * row:(i + 1) * row], full[g * row:(g + 1) * row]
        if g >= 226:
            assert a == b, (p, i, g)
        else:
            worst = max(worst, max(abs(x - y) for x, y in zip(a, b)))
    assert worst < 1e-5, (p, worst)
print("--output-shards: every rank holds the whole text and its image shard (text across ranks within %.1e)" % worst)
PY

# ---- 3b: --input and --lse: out and the LSE of every row (replicated rows included)
# against a float64 reference computed here (pure Python: no numpy needed) -------------------
python3 - "$tmp/in.st" <<'PY'
import json, random, struct, sys, array
random.seed()
B, S, H, D = 1, 31, 6, 16
hdr, data, off = {}, b"", 0
for n in ("q", "k", "v"):
    a = array.array("f", (random.gauss(0, 1) for _ in range(B * S * H * D)))
    b = a.tobytes()
    hdr[n] = {"dtype": "F32", "shape": [B, S, H, D], "data_offsets": [off, off + len(b)]}
    data += b
    off += len(b)
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
lsecheck() {
  python3 - "$tmp/in.st" "$1" <<'PY'
import json, math, struct, sys, array
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, t in h.items():
        if k == "__metadata__":
            continue
        s, e = t["data_offsets"]
        a = array.array("f")
        a.frombytes(b[8 + n + s:8 + n + e])
        out[k] = (t["shape"], a)
    return out
i, o = load(sys.argv[1]), load(sys.argv[2])
(B, S, H, D), q = i["q"]
k, v = i["k"][1], i["v"][1]
out, lse = o["out"][1], o["lse"][1]
assert o["lse"][0] == [B, H, S], o["lse"][0]
sc = 1 / math.sqrt(D)
worst_o = worst_l = 0.0
for h in range(H):
    for s in range(S):
        x = [sum(q[(s * H + h) * D + d] * k[(t * H + h) * D + d] for d in range(D)) * sc for t in range(S)]
        m = max(x)
        w = [math.exp(y - m) for y in x]
        z = sum(w)
        worst_l = max(worst_l, abs(lse[h * S + s] - (m + math.log(z))))
        for d in range(D):
            ref = sum(w[t] * v[(t * H + h) * D + d] for t in range(S)) / z
            worst_o = max(worst_o, abs(out[(s * H + h) * D + d] - ref))
print("out max|err| %.2e, lse max|err| %.2e" % (worst_o, worst_l))
assert worst_o < 1e-5 and worst_l < 1e-5, (worst_o, worst_l)
PY
}
plan lse-ring ring 2 7 24;              plan lse-uly ulysses_anything 3 6 25
plan lse-uni unified 4 7 24 ", ring_degree: 2, ulysses_degree: 2"
for n in lse-ring lse-uly lse-uni; do
  "$CPRUN" "$tmp/$n.yaml" --input "$tmp/in.st" --lse --output "$tmp/$n.st" --iters 1 --warmup 0 \
    >"$tmp/$n.out" 2>&1 || { fail "$n: cprun --input --lse: $(cat "$tmp/$n.out")"; continue; }
  lsecheck "$tmp/$n.st" >"$tmp/$n.chk" 2>&1 || fail "$n: $(cat "$tmp/$n.chk")"
  printf '%-16s %s\n' "$n" "$(cat "$tmp/$n.chk")"
done

# ---- 4: refusals --------------------------------------------------------------------------
plan train ring 2 8 24 "" 6 fp32 "" 1 "
  mode: training"
"$CPC" --check "$tmp/train.yaml" >"$tmp/train.out" 2>&1 ||
  fail "training with a replicated segment (tests/cli/replicate_training.sh runs it): $(cat "$tmp/train.out")"
plan allrep ring 2 8 24
sed -i 's/tokens: 24}/tokens: 24, split: replicate}/' "$tmp/allrep.yaml"
"$CPC" --check "$tmp/allrep.yaml" >"$tmp/allrep.out" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "allrep.yaml:7:7: error\[CP027\]" "$tmp/allrep.out" ||
  fail "every segment replicated: exit $rc, $(cat "$tmp/allrep.out")"
plan badsplit ring 2 8 24 "" 6 fp32 "" 1 "" whole
"$CPC" --check "$tmp/badsplit.yaml" >"$tmp/bad.out" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "badsplit.yaml:7:38: error\[CP103\]" "$tmp/bad.out" && grep -q "shard, replicate" "$tmp/bad.out" ||
  fail "split: whole: exit $rc, $(cat "$tmp/bad.out")"

# plans/ shipped with replicated text check
for f in plans/*replicate*.yaml; do
  [ -e "$f" ] || continue
  "$CPC" --check "$f" >"$tmp/plan.out" 2>&1 || fail "$f: $(cat "$tmp/plan.out")"
done

t_end=$(date +%s%N)
echo "replicate.sh: $(( (t_end - t_start) / 1000000 )) ms, $fails failure(s)"
[ $fails -eq 0 ]
