#!/usr/bin/env bash
# Writing results (SPEC sections 3 and 5: exit status 2 for I/O errors): a
# write that fails is never reported as success, and nothing half-written
# is left behind.
#   cpc -o: a path in a missing directory, a directory, a full file system
#     (simulated with `ulimit -f`: writes past the limit fail with EFBIG);
#     the artifact writer writes through a FIFO or a symbolic link and never
#     replaces them; -o naming the plan file (or a link to it), or the
#     --lua script, is refused (exit 2) and the plan is left as it was.
#   cpc / cprun standard output that cannot be written (exit 2, a message).
#   cprun --output, --trace, --output-shards, --profile-out: locations that
#     cannot be written fail BEFORE anything runs (stdout empty, exit 2); a
#     write that fails during the run is exit 2 and removes the partial file;
#     --output naming the plan or the --input file, or the --trace file, is
#     refused.
#   With a real /dev/full (a character device), the same through it, and the
#   device node must still be a device afterwards.
# Runs from the repository root; binaries in $CPC_BUILD_DIR.
set -u
cd "$(dirname "$0")/../.."
B="${CPC_BUILD_DIR:-build}"
CPC="$B/cpc"
CPRUN="$B/cprun"
[ -x "$CPC" ] && [ -x "$CPRUN" ] || { echo "write_errors.sh: $CPC or $CPRUN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CPC_CACHE_DIR="$tmp/cache"
fails=0
. tests/cli/lib/harness.sh  # fail, has, t

# full NAME WANT KIB CMD ARGS... : as t, with regular files limited to KIB KiB
# (a write past it fails with EFBIG: a full disk without a full disk); stderr
# goes through a pipe, which the limit does not touch.  CMD's stdout is
# $tmp/NAME.out (also limited).
full() {
  local name=$1 want=$2 kib=$3; shift 3
  ( trap '' XFSZ; ulimit -f "$kib"; "$@" >"$tmp/$name.out" ) 2>&1 | cat >"$tmp/$name.err"
  local got=${PIPESTATUS[0]}
  if [ "$got" -ne "$want" ]; then
    fail "$name: $* (ulimit -f $kib) exited $got, expected $want"
    sed 's/^/    /' "$tmp/$name.err" >&2
  fi
}

cat >"$tmp/small.yaml" <<'EOF'
version: 1
name: small
model: {heads: 8, head_dim: 32, dtype: fp32}
input: {tokens: 128}
cluster: {world_size: 4, device: cpu}
parallel: {variant: unified}
EOF
cp "$tmp/small.yaml" "$tmp/orig.yaml"
RUN=(--iters 1 --warmup 0)

# ---- cpc -o ------------------------------------------------------------------------------
t cpc-nodir 2 "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/nodir/x.cplan"
has cpc-nodir.err "nodir/x.cplan: cannot write the artifact: No such file or directory"
[ ! -e "$tmp/nodir" ] || fail "cpc-nodir: created the directory"

mkdir "$tmp/outdir"
t cpc-dir 2 "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/outdir"
has cpc-dir.err "is a directory"
[ -d "$tmp/outdir" ] && [ -z "$(ls -A "$tmp/outdir")" ] || fail "cpc-dir: the directory was changed"
ls "$tmp" | grep -q 'tmp[A-Za-z0-9]\{6\}$' && fail "cpc-dir: a temporary file was left: $(ls "$tmp")"

full cpc-full 2 1 "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/big.cplan"
has cpc-full.err "big.cplan: cannot write the artifact: File too large"
ls "$tmp" | grep -q '^big\.cplan' && fail "cpc-full: left $(ls "$tmp" | grep '^big\.cplan')"

# a FIFO is written through (the node stays a FIFO), as a device would be
mkfifo "$tmp/fifo"
timeout 30 cat "$tmp/fifo" >"$tmp/fifo.data" &
reader=$!
t cpc-fifo 0 "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/fifo"
[ -p "$tmp/fifo" ] || { fail "cpc-fifo: the FIFO was replaced"; kill "$reader" 2>/dev/null; }
wait "$reader"
head -c 17 "$tmp/fifo.data" | grep -q '^artifact_version:' || fail "cpc-fifo: the artifact did not go through the FIFO"

# a symbolic link is written through and stays a link
ln -s real.cplan "$tmp/link.cplan"
t cpc-link 0 "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/link.cplan"
[ -L "$tmp/link.cplan" ] || fail "cpc-link: the link was replaced"
head -c 17 "$tmp/real.cplan" 2>/dev/null | grep -q '^artifact_version:' || fail "cpc-link: nothing written through the link"
t cprun-link 0 "$CPRUN" "$tmp/link.cplan" "${RUN[@]}"

# the output is an input
t cpc-self 2 "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/small.yaml"
has cpc-self.err "refusing to overwrite the plan file"
cmp -s "$tmp/small.yaml" "$tmp/orig.yaml" || fail "cpc-self: the plan file was changed"
ln "$tmp/small.yaml" "$tmp/hard.yaml"
t cpc-hardlink 2 "$CPC" --no-kernels "$tmp/small.yaml" -o "$tmp/hard.yaml"
has cpc-hardlink.err "refusing to overwrite the plan file"
ln -s small.yaml "$tmp/soft.yaml"
t cpc-symlink 2 "$CPC" --no-kernels "$tmp/soft.yaml" -o "$tmp/small.yaml"
cmp -s "$tmp/small.yaml" "$tmp/orig.yaml" || fail "cpc-hardlink/symlink: the plan file was changed"
echo 'function schedule(plan) end' >"$tmp/s.lua"
t cpc-lua 2 "$CPC" --no-kernels --lua "$tmp/s.lua" "$tmp/small.yaml" -o "$tmp/s.lua"
has cpc-lua.err "refusing to overwrite the Lua script"
grep -q 'function schedule' "$tmp/s.lua" || fail "cpc-lua: the script was changed"

# standard output
full cpc-stdout-json 2 0 "$CPC" --check --format json "$tmp/small.yaml"
has cpc-stdout-json.err "cannot write to standard output: File too large"
full cpc-stdout-text 2 0 "$CPC" --check "$tmp/small.yaml"
has cpc-stdout-text.err "cannot write to standard output"
full cpc-stdout-rejected 2 0 "$CPC" --check --set input.tokens=127 "$tmp/small.yaml"
t cpc-ok 0 "$CPC" --check --format json "$tmp/small.yaml"

# ---- cprun: locations checked before the run ----------------------------------------------
early() { # NAME MESSAGE ARGS... : exit 2, the message, no report on stdout
  local name=$1 msg=$2; shift 2
  t "$name" 2 "$CPRUN" "$tmp/small.yaml" "${RUN[@]}" "$@"
  has "$name.err" "$msg"
  [ ! -s "$tmp/$name.out" ] || fail "$name: it ran (a report on stdout) before failing"
}
early out-nodir "--output $tmp/nodir/o.safetensors: directory '$tmp/nodir' does not exist" \
  --output "$tmp/nodir/o.safetensors"
early out-dir "is a directory" --output "$tmp/outdir"
early trace-nodir "--trace $tmp/nodir/t.json: directory" --trace "$tmp/nodir/t.json"
early shards-parent "is not a directory" --output-shards "$tmp/small.yaml/shards"
early shards-nodir "does not exist" --output-shards "$tmp/nodir/a/b"
early shards-file "not a directory" --output-shards "$tmp/small.yaml"
early out-plan "refusing to overwrite the plan file" --output "$tmp/small.yaml"
cmp -s "$tmp/small.yaml" "$tmp/orig.yaml" || fail "out-plan: the plan file was changed"
t make-input 0 "$CPRUN" "$tmp/small.yaml" "${RUN[@]}" --output "$tmp/in.safetensors"
early out-input "refusing to overwrite the --input file" --input "$tmp/in.safetensors" \
  --output "$tmp/in.safetensors"
early out-trace "--output and --trace name the same file" --output "$tmp/same" --trace "$tmp/same"
[ ! -e "$tmp/nodir" ] || fail "cprun: created $tmp/nodir"
t cal-nodir 2 "$CPRUN" --calibrate --quick --profile-out "$tmp/nodir/p.yaml"
has cal-nodir.err "--profile-out $tmp/nodir/p.yaml: directory"
grep -q "done in" "$tmp/cal-nodir.err" && fail "cal-nodir: it measured before failing"

# ---- cprun: writes that fail during the run ------------------------------------------------
full run-output 2 1 "$CPRUN" "$tmp/small.yaml" "${RUN[@]}" --output "$tmp/o.safetensors"
has run-output.err "o.safetensors: write failed: File too large"
[ ! -e "$tmp/o.safetensors" ] || fail "run-output: a truncated output was left"
full run-trace 2 1 "$CPRUN" "$tmp/small.yaml" --iters 4 --warmup 0 --trace "$tmp/t.json"
has run-trace.err "t.json: cannot write the trace: File too large"
[ ! -e "$tmp/t.json" ] || fail "run-trace: a truncated trace was left"
full run-shards 2 1 "$CPRUN" "$tmp/small.yaml" "${RUN[@]}" --output-shards "$tmp/shards"
has run-shards.err "safetensors: write failed: File too large"
full run-stdout-json 2 0 "$CPRUN" "$tmp/small.yaml" "${RUN[@]}" --format json
has run-stdout-json.err "cannot write to standard output: File too large"
full run-stdout-text 2 0 "$CPRUN" "$tmp/small.yaml" "${RUN[@]}"
has run-stdout-text.err "cannot write to standard output"
full cal-full 2 0 "$CPRUN" --calibrate --quick --profile-out "$tmp/p.yaml"
[ ! -e "$tmp/p.yaml" ] || fail "cal-full: a truncated profile was left"
# and all of it works when there is room
t run-ok 0 "$CPRUN" "$tmp/small.yaml" --iters 2 --warmup 0 --output "$tmp/o.safetensors" \
  --trace "$tmp/t.json" --output-shards "$tmp/shards"
[ -s "$tmp/o.safetensors" ] && [ -s "$tmp/t.json" ] && [ -s "$tmp/shards/rank3.safetensors" ] \
  || fail "run-ok: outputs missing"

# ---- a real /dev/full, where there is one ------------------------------------------------
if [ -c /dev/full ]; then
  t devfull-cpc 2 "$CPC" --no-kernels "$tmp/small.yaml" -o /dev/full
  has devfull-cpc.err "/dev/full: cannot write the artifact: No space left on device"
  [ -c /dev/full ] || { echo "write_errors.sh: /dev/full was REPLACED" >&2; exit 1; }
  t devfull-out 2 "$CPRUN" "$tmp/small.yaml" "${RUN[@]}" --output /dev/full
  t devfull-trace 2 "$CPRUN" "$tmp/small.yaml" "${RUN[@]}" --trace /dev/full
  t devfull-prof 2 "$CPRUN" --calibrate --quick --profile-out /dev/full
  "$CPC" --check --format json "$tmp/small.yaml" >/dev/full 2>"$tmp/devfull-stdout.err"
  [ $? -eq 2 ] || fail "devfull-stdout: cpc --check --format json > /dev/full is not 2"
  "$CPRUN" "$tmp/small.yaml" "${RUN[@]}" --format json >/dev/full 2>"$tmp/devfull-run.err"
  [ $? -eq 2 ] || fail "devfull-run: cprun --format json > /dev/full is not 2"
  [ -c /dev/full ] || { echo "write_errors.sh: /dev/full was REPLACED" >&2; exit 1; }
else
  echo "write_errors.sh: /dev/full is not a character device here; its checks skipped (ulimit -f covers them)"
fi

if [ "$fails" -ne 0 ]; then
  echo "write_errors.sh: $fails failure(s)" >&2
  exit 1
fi
echo "write_errors.sh: all checks passed"
