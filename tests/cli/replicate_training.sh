#!/usr/bin/env bash
# Training with replicated segments (`split: replicate`, SPEC sections 1, 10;
# issue 24): cprun runs the forward and the backward program of plans with a
# replicated text segment and checks the gathered dq, dk, dv (every row: the
# sharded ones and the replicated ones, which every rank returns whole) and
# the output against the float64 reference of the whole problem, on fresh
# random inputs (a new seed per case), for every variant (ring,
# ring_anything, ulysses, ulysses_anything, unified), p2p and all-gather
# rotation, overlap on and off, even and odd lengths, GQA bf16, batch 2, key
# padding, a replicated segment after the sharded one, cfg and tp axes (a K/V
# head shared by tp ranks), one process per rank under mpirun; and cpc --check
# proves the backward program (CP051 otherwise).  Small shapes; seconds.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPC="$B/cpc"
CPRUN="$B/cprun"
[ -x "$CPRUN" ] || { echo "replicate_training.sh: $CPRUN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
t_start=$(date +%s%N)

# plan NAME VARIANT WORLD TEXT IMAGE [PARALLEL_EXTRA] [H] [DTYPE] [MODEL_EXTRA] [BATCH] [INPUT_EXTRA] [ORDER]
plan() {
  local segs="    - {name: text, tokens: $4, split: replicate}
    - {name: image, tokens: $5}"
  [ "${12:-}" = after ] && segs="    - {name: image, tokens: $5}
    - {name: text, tokens: $4, split: replicate}"
  cat >"$tmp/$1.yaml" <<EOF2
version: 1
name: $1
model: {heads: ${7:-4}, head_dim: 16, dtype: ${8:-fp32}${9:-}}
input:
  batch: ${10:-1}
  mode: training${11:-}
  segments:
$segs
cluster: {world_size: $3, device: cpu}
parallel: {variant: $2${6:-}}
EOF2
}

seed=$(( $(date +%s) % 100000 ))
echo "replicate_training.sh: seed base $seed"
case_() {
  local n=$1
  seed=$((seed + 1))
  "$CPC" --check "$tmp/$n.yaml" >"$tmp/$n.chk" 2>&1 || { fail "$n: cpc --check: $(cat "$tmp/$n.chk")"; return; }
  "$CPRUN" "$tmp/$n.yaml" --iters 1 --warmup 0 --seed "$seed" >"$tmp/$n.out" 2>&1 ||
    { fail "$n: cprun: $(tail -5 "$tmp/$n.out")"; return; }
  grep -q "^check: *PASS" "$tmp/$n.out" && grep -q "^bwd check: *PASS" "$tmp/$n.out" ||
    { fail "$n: $(grep -E 'check' "$tmp/$n.out")"; return; }
  printf '%-14s %s\n' "$n" "$(grep '^bwd check' "$tmp/$n.out" | sed 's/bwd check: *//')"
}

plan ring2 ring 2 8 24;                                   case_ ring2
plan ring3odd ring 3 7 27;                                case_ ring3odd
plan ringany ring_anything 3 5 26;                        case_ ringany
plan uly2odd ulysses 2 7 24;                              case_ uly2odd
plan ulyany ulysses_anything 3 6 20 "" 6;                 case_ ulyany
plan uni ring_anything 2 9 21;                            case_ uni
plan unified unified 4 7 24 ", ring_degree: 2, ulysses_degree: 2"; case_ unified
plan gather ring 3 7 24 "" 4 fp32 "" 1 "" ;               sed -i 's/^parallel: {variant: ring/schedule: {rotate: allgather}\nparallel: {variant: ring/' "$tmp/gather.yaml"; case_ gather
plan nooverlap ring 2 7 24;                               sed -i 's/^parallel: {variant: ring/schedule: {overlap: false}\nparallel: {variant: ring/' "$tmp/nooverlap.yaml"; case_ nooverlap
plan gqa ring 2 8 24 "" 4 bf16 ", kv_heads: 2" 2;         case_ gqa
plan keypad ulysses 2 7 24 "" 4 fp32 "" 1 "
  mask: key_padding";                                     case_ keypad
plan after unified 4 6 28 ", ring_degree: 2, ulysses_degree: 2" 4 fp32 "" 1 "" after; case_ after
plan tp ulysses 4 7 24 ", tp_degree: 2" 8 fp32 ", kv_heads: 1";   case_ tp   # K/V head over 2 tp ranks
plan cfg ring 4 7 24 ", cfg_degree: 2" 4 fp32 "" 2;              case_ cfg

# one process per rank (mpirun), where cprun has MPI: the same gradients check
if command -v mpirun >/dev/null 2>&1 &&
  ! "$CPRUN" "$tmp/ring2.yaml" --transport mpi --iters 1 2>&1 | grep -q "no MPI support"; then
  for n in unified tp; do
    ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe \
      -x ASAN_OPTIONS -np 4 "$CPRUN" "$tmp/$n.yaml" --iters 1 --warmup 0 --seed "$seed" >"$tmp/$n.mout" 2>&1 ||
      { fail "$n: mpirun: $(tail -5 "$tmp/$n.mout")"; continue; }
    grep -q "^bwd check: *PASS" "$tmp/$n.mout" || { fail "$n: mpirun: $(grep check "$tmp/$n.mout")"; continue; }
    printf '%-14s %s\n' "$n-mpi" "$(grep '^bwd check' "$tmp/$n.mout" | sed 's/bwd check: *//')"
  done
fi

echo "replicate_training.sh: $(( ($(date +%s%N) - t_start) / 1000000 )) ms"
[ $fails -eq 0 ] || { echo "replicate_training.sh: $fails failure(s)" >&2; exit 1; }
echo "replicate_training.sh: ok"
