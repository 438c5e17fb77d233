#!/usr/bin/env bash
# Training plans through the compiler and the artifact (SPEC sections 3, 4, 10;
# issue 16): `cpc` writes a training plan's backward program into the .cplan
# (backward_schedule, artifact_version 2), `cprun` trains from it (proving it
# again, not rebuilding it) with the same gradients as from the YAML; every trainable
# candidate's backward is priced; a Lua schedule script is CP018;
# `cpc --check --format json` gives predicted.ms_backward_per_layer, `--explain`
# the backward columns; the predicted backward bytes are what cprun sends; a
# tampered backward program (reading the next step's K/V) is refused with CP051
# before anything runs; a training artifact without backward_schedule and a
# version 1 artifact are refused with a clear message.
# Runs from the repository root; binaries in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPC="$B/cpc"
CPRUN="$B/cprun"
[ -x "$CPC" ] && [ -x "$CPRUN" ] || { echo "training_artifact.sh: cpc/cprun not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

cat >"$tmp/t.yaml" <<'EOF'
version: 1
name: t
model: {heads: 4, kv_heads: 2, head_dim: 32, dtype: bf16}
input: {batch: 2, tokens: 256, mask: causal, mode: training}
cluster: {world_size: 4, device: cpu}
parallel: {variant: ring}
EOF

# 1. the artifact holds the backward program and its predictions
"$CPC" "$tmp/t.yaml" -o "$tmp/t.cplan" --no-kernels >"$tmp/c.out" 2>"$tmp/c.err" || fail "cpc: $(cat "$tmp/c.err")"
head -1 "$tmp/t.cplan" | grep -qx 'artifact_version: 2' || fail "artifact version: $(head -1 "$tmp/t.cplan")"
grep -q '^backward_schedule:$' "$tmp/t.cplan" || fail "no backward_schedule in the artifact"
grep -q 'kind: attn_bwd' "$tmp/t.cplan" || fail "no attn_bwd op in the artifact"
grep -q '^  ms_backward_per_layer: ' "$tmp/t.cplan" || fail "no backward prediction in the artifact"
grep -q 'backward (training): ' "$tmp/c.out" || fail "cpc's summary has no backward line: $(cat "$tmp/c.out")"

# 2. cprun trains from it, and from the YAML, with identical outputs
"$CPRUN" "$tmp/t.cplan" --iters 1 --warmup 0 --format json --output "$tmp/a.st" >"$tmp/a.json" 2>"$tmp/a.err" ||
    fail "cprun artifact: $(cat "$tmp/a.err")"
"$CPRUN" "$tmp/t.yaml" --iters 1 --warmup 0 --format json --output "$tmp/y.st" >"$tmp/y.json" 2>"$tmp/y.err" ||
    fail "cprun yaml: $(cat "$tmp/y.err")"
cmp -s "$tmp/a.st" "$tmp/y.st" || fail "the artifact's training output differs from the YAML's"

# --dry-run lists the backward program's buffers too (allocates nothing)
"$CPRUN" "$tmp/t.cplan" --dry-run >"$tmp/dry.out" 2>&1 || fail "--dry-run: $(cat "$tmp/dry.out")"
grep -q '^backward peak memory per rank: [0-9]* bytes' "$tmp/dry.out" && grep -q ' dk_cur  *dk ' "$tmp/dry.out" ||
    fail "--dry-run shows no backward program: $(tail -3 "$tmp/dry.out")"

# 3. predictions: JSON (SPEC section 3), --explain columns, bytes as measured
"$CPC" --check --format json "$tmp/t.yaml" >"$tmp/check.json" 2>"$tmp/check.err" || fail "cpc --check: $(cat "$tmp/check.err")"
python3 - "$tmp/check.json" "$tmp/a.json" <<'PY' || fail "predicted backward"
import json, sys
c = json.load(open(sys.argv[1]))
r = json.load(open(sys.argv[2]))
p = c["predicted"]
assert p["ms_backward_per_layer"] > p["ms_per_layer"] > 0, p
assert r["backward"]["check"]["pass"] is True, r["backward"]
# the cost model prices the program cprun runs: the same bytes
assert p["backward_bytes_sent_per_rank"] == r["backward"]["bytes_sent_per_rank"], (p, r["backward"])
PY
"$CPC" --explain "$tmp/t.yaml" >"$tmp/explain.out" 2>&1 || fail "cpc --explain: $(cat "$tmp/explain.out")"
grep -q 'bwd ms/layer' "$tmp/explain.out" || fail "--explain has no backward column: $(cat "$tmp/explain.out")"
grep -E '^\* ring +4x1 +ok .* [0-9]+\.[0-9]{3} +[0-9.]+ [KM]iB$' "$tmp/explain.out" >/dev/null ||
    fail "--explain: the selected ring row has no backward prediction: $(cat "$tmp/explain.out")"
# an inference plan has no backward column or field
"$CPC" --check --format json "$tmp/t.yaml" --set input.mode=inference | grep -q ms_backward_per_layer &&
    fail "an inference plan has ms_backward_per_layer"
"$CPC" --explain "$tmp/t.yaml" --set input.mode=inference | grep -q 'bwd ms/layer' &&
    fail "an inference plan has backward columns"

# variant auto: every candidate that trains has its backward priced (--explain), the
# selected one's in the JSON; a Lua schedule script has no backward program: CP018, for
# the plan's schedule.script (every candidate) and for --lua
"$CPC" --check --format json "$tmp/t.yaml" --set parallel.variant=auto >"$tmp/auto.json" 2>"$tmp/auto.err" ||
    fail "auto training: $(cat "$tmp/auto.err")"
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["predicted"]; assert p["ms_backward_per_layer"] > 0, p' \
    "$tmp/auto.json" || fail "auto: no backward prediction: $(cat "$tmp/auto.json")"
"$CPC" --explain "$tmp/t.yaml" --set parallel.variant=auto | grep -E '^[ *] ulysses +1x4 +ok .* [0-9]+\.[0-9]{3} +[0-9.]+ [KM]iB$' \
    >/dev/null || fail "--explain: ulysses has no backward prediction"
printf 'function schedule(plan)\n  return plan.ops\nend\n' >"$tmp/s.lua"
sed 's/^parallel: .*/parallel: {variant: ring}\nschedule: {script: s.lua}/' "$tmp/t.yaml" >"$tmp/scripted.yaml"
"$CPC" --check "$tmp/scripted.yaml" >/dev/null 2>"$tmp/scr.err"
rc=$?
[ $rc -eq 1 ] && grep -q 'error\[CP018\].*Lua schedule script' "$tmp/scr.err" ||
    fail "training with schedule.script: exit $rc, expected 1 with CP018: $(cat "$tmp/scr.err")"
"$CPC" --check "$tmp/t.yaml" --lua "$tmp/s.lua" >/dev/null 2>"$tmp/lua.err"
rc=$?
[ $rc -eq 1 ] && grep -q 'error\[CP018\].*Lua schedule script' "$tmp/lua.err" ||
    fail "training with --lua: exit $rc, expected 1 with CP018: $(cat "$tmp/lua.err")"

# rewrite FILE FROM TO OUT: edit the artifact and fix its content hash
rewrite() {
    python3 - "$@" <<'PY'
import hashlib, re, sys
src, frm, to, out = sys.argv[1:5]
t = open(src).read()
assert frm in t, frm
t = t.replace(frm, to, 1)
t = re.sub(r"(?m)^content_hash: sha256:[0-9a-f]{64}$", "content_hash: sha256:" + "0" * 64, t)
h = hashlib.sha256(t.encode()).hexdigest()
t = t.replace("content_hash: sha256:" + "0" * 64, "content_hash: sha256:" + h, 1)
open(out, "w").write(t)
PY
}

# 4. a tampered backward program: CP051 before anything runs (exit 2)
rewrite "$tmp/t.cplan" "in: [q, k_cur, v_cur, dout, lse, delta]" "in: [q, k_nxt, v_nxt, dout, lse, delta]" "$tmp/bad.cplan"
"$CPRUN" "$tmp/bad.cplan" --iters 1 --warmup 0 >"$tmp/bad.out" 2>"$tmp/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q 'CP051' "$tmp/bad.err" || fail "tampered backward: exit $rc, expected 2 with CP051: $(cat "$tmp/bad.err")"

# 4b. the tamper classes of issue 21, edited in backward_schedule only (the forward program
# has lines alike), refused with CP051 before anything runs even with --no-check: dK and dV
# sent in two groups with one tag (the transports match by group: they would arrive
# swapped), attn_bwd accumulating into dk_out/dv_out while their send is in flight, the
# saved LSE and delta swapped (both role lse), a wait on the K/V send before the recv is
# posted (every rank would block)
rewrite_bwd() {
    python3 - "$@" <<'PY'
import hashlib, re, sys
src, out = sys.argv[1], sys.argv[2]
t = open(src).read()
a = t.index("\nbackward_schedule:\n")
head, bwd = t[:a], t[a:]
for frm, to in zip(sys.argv[3::2], sys.argv[4::2]):
    frm, to = frm.replace("\\n", "\n"), to.replace("\\n", "\n")
    assert frm in bwd, frm
    bwd = bwd.replace(frm, to, 1)
t = head + bwd
t = re.sub(r"(?m)^content_hash: sha256:[0-9a-f]{64}$", "content_hash: sha256:" + "0" * 64, t)
h = hashlib.sha256(t.encode()).hexdigest()
t = t.replace("content_hash: sha256:" + "0" * 64, "content_hash: sha256:" + h, 1)
open(out, "w").write(t)
PY
}
SEND_DKV='    - {kind: send, group: ring, peer: (r+1)%R, in: [dk_out, dv_out], tag: 1}\n'
RECV_DKV='    - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur, dv_cur], block: (r-s)%R, tag: 1, when: s>0}\n'
RECV_END='  - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur, dv_cur], block: r, tag: 1}\n'
ATTN_BWD='    - {kind: attn_bwd, in: [q, k_cur, v_cur, dout, lse, delta], out: [dq, dk_blk, dv_blk]}\n'
SEND_KV='    - {kind: send, group: ring, peer: (r+1)%R, in: [k_cur, v_cur], tag: 0, when: s<R-1}\n'
WAIT_KV='    - {kind: wait, tag: 0, when: s<R-1}\n'
rewrite_bwd "$tmp/t.cplan" "$tmp/groups.cplan" \
    "$SEND_DKV" '    - {kind: send, group: world, peer: (r+1)%R, in: [dk_out], tag: 1}\n    - {kind: send, group: ring, peer: (r+1)%R, in: [dv_out], tag: 1}\n' \
    "$RECV_DKV" '    - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur], block: (r-s)%R, tag: 1, when: s>0}\n    - {kind: recv, group: world, peer: (r-1)%R, out: [dv_cur], block: (r-s)%R, tag: 1, when: s>0}\n' \
    "$RECV_END" '  - {kind: recv, group: ring, peer: (r-1)%R, out: [dk_cur], block: r, tag: 1}\n  - {kind: recv, group: world, peer: (r-1)%R, out: [dv_cur], block: r, tag: 1}\n'
rewrite_bwd "$tmp/t.cplan" "$tmp/inflight.cplan" "$ATTN_BWD" "" \
    "$SEND_DKV" "$SEND_DKV"'    - {kind: attn_bwd, in: [q, k_cur, v_cur, dout, lse, delta], out: [dq, dk_out, dv_out]}\n'
rewrite_bwd "$tmp/t.cplan" "$tmp/lse.cplan" "in: [q, k_cur, v_cur, dout, lse, delta]" "in: [q, k_cur, v_cur, dout, delta, lse]"
rewrite_bwd "$tmp/t.cplan" "$tmp/deadlock.cplan" "$WAIT_KV" "" "$SEND_KV" "$SEND_KV$WAIT_KV"
for c in groups inflight lse deadlock; do
    "$CPRUN" "$tmp/$c.cplan" --iters 1 --warmup 0 --no-check --output "$tmp/$c.st" >"$tmp/$c.out" 2>"$tmp/$c.err"
    rc=$?
    [ $rc -eq 2 ] && grep -q 'CP051' "$tmp/$c.err" && [ ! -e "$tmp/$c.st" ] ||
        fail "tampered backward ($c): exit $rc, expected 2 with CP051 and no output: $(cat "$tmp/$c.err")"
done

# 4c. barrier, a forward op, in the backward program: proven and run, the same gradients
rewrite_bwd "$tmp/t.cplan" "$tmp/barrier.cplan" "$ATTN_BWD" "$ATTN_BWD"'    - {kind: barrier, group: ring}\n' \
    '  - {kind: delta, in: [dout, out], out: [delta]}\n' '  - {kind: delta, in: [dout, out], out: [delta]}\n  - {kind: barrier, group: world}\n'
"$CPRUN" "$tmp/barrier.cplan" --iters 1 --warmup 0 --format json --output "$tmp/barrier.st" >"$tmp/barrier.json" \
    2>"$tmp/barrier.err" || fail "backward with barriers: $(cat "$tmp/barrier.err")"
cmp -s "$tmp/a.st" "$tmp/barrier.st" || fail "backward with barriers: other gradients than without"

# 4d. attn and merge, forward ops, in the backward program: a backward that recomputes the
# LSE with a whole ring pass instead of reading the saved one is proven and runs, with the
# same gradients (the recomputation is the forward's, bit for bit), causal (t) and without
# a mask (n)
sed 's/mask: causal/mask: none/' "$tmp/t.yaml" >"$tmp/n.yaml"
"$CPC" "$tmp/n.yaml" -o "$tmp/n.cplan" --no-kernels >/dev/null 2>"$tmp/n.err" || fail "cpc (no mask): $(cat "$tmp/n.err")"
DV_OUT='  - {name: dv_out, role: dv, tokens: block, heads: all, io: none}\n'
DELTA='  - {kind: delta, in: [dout, out], out: [delta]}\n'
for m in t n; do
rewrite_bwd "$tmp/$m.cplan" "$tmp/recompute_$m.cplan" \
    "$DV_OUT" "$DV_OUT"'  - {name: o_blk, role: acc, tokens: shard, heads: all, io: none}\n  - {name: lse_blk, role: lse, tokens: shard, heads: all, io: none}\n  - {name: racc, role: acc, tokens: shard, heads: all, io: none}\n  - {name: rlse, role: lse, tokens: shard, heads: all, io: none}\n' \
    "$DELTA" '  - {kind: init_acc, out: [racc, rlse]}\n  - kind: loop\n    count: R\n    body:\n    - {kind: send, group: ring, peer: (r+1)%R, in: [k_cur, v_cur], tag: 2}\n    - {kind: recv, group: ring, peer: (r-1)%R, out: [k_nxt, v_nxt], block: (r-s-1)%R, tag: 2}\n    - {kind: attn, in: [q, k_cur, v_cur], out: [o_blk, lse_blk]}\n    - {kind: merge, in: [o_blk, lse_blk], out: [racc, rlse]}\n    - {kind: wait, tag: 2}\n    - {kind: swap, in: [k_cur, k_nxt]}\n    - {kind: swap, in: [v_cur, v_nxt]}\n'"$DELTA" \
    "in: [q, k_cur, v_cur, dout, lse, delta]" "in: [q, k_cur, v_cur, dout, rlse, delta]"
done
for c in n recompute_n recompute_t; do
    "$CPRUN" "$tmp/$c.cplan" --iters 1 --warmup 0 --format json --output "$tmp/$c.st" >"$tmp/$c.json" 2>"$tmp/$c.err" ||
        fail "cprun $c: $(cat "$tmp/$c.err")"
    python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["backward"]["check"]["pass"] is True' \
        "$tmp/$c.json" || fail "$c: the gradient check failed: $(cat "$tmp/$c.json")"
done
cmp -s "$tmp/n.st" "$tmp/recompute_n.st" || fail "backward recomputing the LSE: other gradients than from the saved LSE"
cmp -s "$tmp/a.st" "$tmp/recompute_t.st" || fail "causal backward recomputing the LSE: other gradients than from the saved LSE"

# 5. a training artifact without backward_schedule; a version 1 artifact
python3 - "$tmp/t.cplan" "$tmp/nobwd.cplan" <<'PY'
import sys
t = open(sys.argv[1]).read()
a, b = t.index("\nbackward_schedule:\n"), t.index("\nkernels:")
open(sys.argv[2], "w").write(t[:a] + t[b:])
PY
rewrite "$tmp/nobwd.cplan" "artifact_version: 2" "artifact_version: 2" "$tmp/nobwd.cplan"
"$CPRUN" "$tmp/nobwd.cplan" --iters 1 --warmup 0 >/dev/null 2>"$tmp/nb.err"
rc=$?
[ $rc -eq 2 ] && grep -q 'without a backward program' "$tmp/nb.err" ||
    fail "training artifact without backward: exit $rc: $(cat "$tmp/nb.err")"
rewrite "$tmp/t.cplan" "artifact_version: 2" "artifact_version: 1" "$tmp/v1.cplan"
"$CPRUN" "$tmp/v1.cplan" >/dev/null 2>"$tmp/v1.err"
rc=$?
[ $rc -eq 2 ] && grep -q 'artifact version 1 is not supported.*recompile' "$tmp/v1.err" ||
    fail "version 1 artifact: exit $rc: $(cat "$tmp/v1.err")"

[ $fails -eq 0 ] && echo "training_artifact.sh: all passed" || { echo "training_artifact.sh: $fails failure(s)" >&2; exit 1; }
