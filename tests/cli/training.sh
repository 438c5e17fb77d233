#!/usr/bin/env bash
# Training (SPEC section 10, issue 16 phase 2): cprun on a training plan runs
# the forward, then the backward, and checks dq, dk, dv of every rank's shard
# against the float64 reference: none (R = 1) and ring R = 2, 4 (P2P
# rotation, dK/dV accumulators travelling home), causal zigzag and not, GQA,
# key padding, fp32/bf16/fp16; the JSON report has "backward"; 3000 tokens
# causal over 4 ranks trains, 2999 is CP023 (EasyContext #47); variants
# without a backward program (ulysses, unified) are CP060 naming those that
# train.  Runs from the repository root; binaries in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPRUN="$B/cprun"
[ -x "$CPRUN" ] || { echo "training.sh: $CPRUN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# plan NAME VARIANT WORLD DTYPE MASK H HKV TOKENS
plan() {
  cat >"$tmp/$1.yaml" <<EOF2
version: 1
name: $1
model: {heads: $6, kv_heads: $7, head_dim: 32, dtype: $4}
input: {batch: 2, tokens: $8, mask: $5, mode: training}
cluster: {world_size: $3, device: cpu}
parallel: {variant: $2}
EOF2
}

# train NAME ARGS...: must exit 0 with the backward check PASSing
train() {
  local name=$1; shift
  plan "$name" "$@"
  "$CPRUN" "$tmp/$name.yaml" --iters 2 --warmup 1 >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  [ $rc -eq 0 ] || { fail "$name: exit $rc: $(cat "$tmp/$name.err")"; return; }
  grep -q "^bwd check:   PASS" "$tmp/$name.out" || fail "$name: no backward PASS: $(cat "$tmp/$name.out")"
  grep "^bwd check" "$tmp/$name.out" | sed "s/^/$name: /"
}

train none-fp32-causal  none 1 fp32 causal      4 4 256
train ring2-fp32        ring 2 fp32 none        4 2 256
train ring2-bf16-causal ring 2 bf16 causal      4 1 256
train ring4-fp32-causal ring 4 fp32 causal      4 2 256
train ring4-bf16-gqa    ring 4 bf16 none        6 2 256
train ring4-fp16-causal ring 4 fp16 causal      4 4 256
train ring4-padding     ring 4 fp32 key_padding 4 2 256
# EasyContext #47: zigzag backward at 3000 tokens over 4 ranks (2999: CP023)
train zigzag-3000       ring 4 fp32 causal      2 1 3000

# JSON report: "backward" with ms_per_iter, tflops, bytes_sent_per_rank, check
plan js ring 4 bf16 causal 4 2 256
"$CPRUN" "$tmp/js.yaml" --iters 1 --warmup 0 --format json >"$tmp/js.json" 2>"$tmp/js.err" || fail "json: $(cat "$tmp/js.err")"
python3 - "$tmp/js.json" <<'PY' || fail "json report"
import json, sys
r = json.load(open(sys.argv[1]))
b = r["backward"]
for k in ("ms_per_iter", "tflops", "bytes_sent_per_rank", "check"):
    assert k in b, k
assert b["check"]["pass"] is True, b
# K/V 3 hops (bf16) + dK/dV 4 hops (fp32): B 2 x 64 tokens x Hkv 2 x D 32 per block
blk = 2 * 64 * 2 * 32
assert b["bytes_sent_per_rank"] == 3 * 2 * blk * 2 + 4 * 2 * blk * 4, b["bytes_sent_per_rank"]
PY

plan uneven ring 4 fp32 causal 2 1 2999
"$CPRUN" "$tmp/uneven.yaml" >"$tmp/uneven.out" 2>"$tmp/uneven.err"
[ $? -eq 2 ] && grep -q CP023 "$tmp/uneven.err" || fail "2999 over 4 causal: expected CP023: $(cat "$tmp/uneven.err")"

for v in ulysses unified; do
  plan "refuse-$v" $v 4 fp32 none 4 4 256
  "$CPRUN" "$tmp/refuse-$v.yaml" >"$tmp/r.out" 2>"$tmp/r.err"
  rc=$?
  [ $rc -eq 2 ] && grep -q CP060 "$tmp/r.err" && grep -q "variants none and ring" "$tmp/r.err" ||
    fail "$v training: expected CP060 naming what trains, exit $rc: $(cat "$tmp/r.err")"
done

[ $fails -eq 0 ] && echo "training.sh: all passed" || { echo "training.sh: $fails failure(s)" >&2; exit 1; }
