#!/usr/bin/env bash
# cprun itself under mpirun, one process per rank (the MPI transport):
#  1. every variant valid at N = 2, 3, 4, 8 (ring, ulysses, unified, ulysses_anything,
#     ring_anything; unified both 2x4 and 4x2 at 8), fp32 and bf16, on the small plan
#     tests/mpi/cprun-small.yaml (8 heads, head_dim 32, 384 tokens; 385 for the
#     anything variants, so their splits are uneven), plus causal, GQA and batch 2 at
#     a few N: exit 0, the JSON report says "pass": true, transport mpi, N ranks and
#     the variant asked for;
#  2. rank 0's --output is byte for byte the output of the same plan run with the
#     local transport (every rank a thread of one process): same kernels on the same
#     shards, so any difference is a transport bug;
#  3. a plan the compiler rejects at N (ulysses at 3: CP012), and -np that does not
#     match the plan's world size: every rank exits 2 with the diagnostic;
#  4. a truncated --input: every rank ends within seconds with status 2 and a
#     message naming the rank.
# Each mpirun has 60 s (a hang is a failure, not a stuck test).
#   usage: run_cprun.sh CPRUN [MPIRUN]
set -u
cprun=${1:?usage: run_cprun.sh CPRUN [MPIRUN]}
mpirun=${2:-mpirun}
here=$(cd "$(dirname "$0")" && pwd)
plan=$here/cprun-small.yaml
# Open MPI refuses to start as root without these (platform-notes.md).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
runs=0
t_start=$(date +%s%N)

ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# mpi N ARGS...: cprun under mpirun with N processes; stdout in $tmp/out,
# stderr in $tmp/err; sets rc and ms.
mpi() {
    local n=$1; shift
    local t0=$(date +%s%N)
    timeout -k 5 60 "$mpirun" --allow-run-as-root --oversubscribe -np "$n" \
        "$cprun" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    ms=$(ms_since "$t0")
    runs=$((runs + 1))
}

failed() {
    echo "run_cprun: FAILED: $*"
    sed 's/^/  | /' "$tmp/err" | head -15
    sed 's/^/  > /' "$tmp/out" | head -5
    status=1
}

# ---- 1 and 2: every valid variant at every N, checked, compared with local ----
# "N VARIANT [R U]": R U given for unified when not the default factorisation.
cases=(
    "2 ring" "2 ulysses" "2 ulysses_anything" "2 ring_anything"
    "3 ring" "3 ulysses_anything" "3 ring_anything"
    "4 ring" "4 ulysses" "4 unified" "4 ulysses_anything" "4 ring_anything"
    "8 ring" "8 ulysses" "8 unified" "8 unified 4 2" "8 ulysses_anything" "8 ring_anything"
)
# Extra shapes, fp32 only: "N VARIANT -- KEY=VALUE...".
extras=(
    "4 ring -- input.mask=causal"
    "2 ulysses -- input.mask=causal"
    "4 ulysses -- model.kv_heads=2"
    "8 unified -- model.kv_heads=4"
    "3 ring_anything -- input.batch=2"
)

run_case() {   # LABEL N VARIANT DTYPE SETS...
    local label=$1 n=$2 v=$3 dt=$4; shift 4
    local sets=(--set "cluster.world_size=$n" --set "parallel.variant=$v"
                --set "model.dtype=$dt" "$@")
    case $v in *_anything) sets+=(--set input.tokens=385) ;; esac
    local what="-np $n $v $dt${label:+ ($label)}"
    rm -f "$tmp/mpi.safetensors" "$tmp/local.safetensors"
    mpi "$n" "$plan" "${sets[@]}" --check --format json --warmup 0 --iters 1 \
        --output "$tmp/mpi.safetensors"
    if [ "$rc" -ne 0 ]; then failed "$what: exit $rc"; return; fi
    local j
    j=$(tr -d ' \n' <"$tmp/out")
    local k
    for k in '"pass":true' '"transport":"mpi"' "\"ranks\":$n" "\"variant\":\"$v\""; do
        case $j in
            *"$k"*) ;;
            *) failed "$what: the JSON report lacks $k"; return ;;
        esac
    done
    # The same plan on local rank threads; the outputs must be identical.
    if ! "$cprun" "$plan" "${sets[@]}" --transport local --no-check --format json \
            --warmup 0 --iters 1 --output "$tmp/local.safetensors" >/dev/null 2>"$tmp/err"; then
        failed "$what: the local-transport run failed"
        return
    fi
    if ! cmp -s "$tmp/mpi.safetensors" "$tmp/local.safetensors"; then
        failed "$what: rank 0's --output differs from the local transport's" \
               "($(cmp "$tmp/mpi.safetensors" "$tmp/local.safetensors" 2>&1 | head -1))"
        return
    fi
    printf 'run_cprun: %-42s ok (%d ms)\n' "$what" "$ms"
}

for c in "${cases[@]}"; do
    set -- $c
    n=$1 v=$2
    deg=()
    label=
    if [ $# -ge 4 ]; then
        deg=(--set "parallel.ring_degree=$3" --set "parallel.ulysses_degree=$4")
        label="$3x$4"
    fi
    for dt in fp32 bf16; do
        run_case "$label" "$n" "$v" "$dt" "${deg[@]}"
    done
done
for c in "${extras[@]}"; do
    set -- $c
    n=$1 v=$2
    shift 3
    sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    run_case "$*" "$n" "$v" fp32 "${sets[@]}"
done

# ---- 3: rejected plans under mpirun -------------------------------------------------
mpi 3 "$plan" --set cluster.world_size=3 --set parallel.variant=ulysses --format json
if [ "$rc" -ne 2 ]; then
    failed "-np 3 ulysses (CP012): exit $rc, expected 2"
elif ! grep -q 'CP012' "$tmp/err"; then
    failed "-np 3 ulysses: no CP012 diagnostic"
else
    printf 'run_cprun: %-42s ok: exit 2, CP012 (%d ms)\n' "-np 3 ulysses (rejected)" "$ms"
fi
mpi 3 "$plan" --set cluster.world_size=4 --format json
if [ "$rc" -ne 2 ]; then
    failed "-np 3 with a 4-rank plan: exit $rc, expected 2"
elif ! grep -q 'world_size 4' "$tmp/err"; then
    failed "-np 3 with a 4-rank plan: the message does not name the world size"
else
    printf 'run_cprun: %-42s ok: exit 2 (%d ms)\n' "-np 3, plan for 4 ranks" "$ms"
fi

# ---- 4: a truncated --input ------------------------------------------------------------
# A safetensors header for q, k, v [1, 384, 8, 32] F32 (3 x 393216 bytes), followed by
# only 1000 data bytes.
hdr='{"q":{"dtype":"F32","shape":[1,384,8,32],"data_offsets":[0,393216]},'
hdr+='"k":{"dtype":"F32","shape":[1,384,8,32],"data_offsets":[393216,786432]},'
hdr+='"v":{"dtype":"F32","shape":[1,384,8,32],"data_offsets":[786432,1179648]}}'
while [ $(( ${#hdr} % 8 )) -ne 0 ]; do hdr+=' '; done
len=${#hdr}
{
    for i in 0 1 2 3 4 5 6 7; do
        printf "\\x$(printf '%02x' $(( (len >> (8 * i)) & 255 )))"
    done
    printf '%s' "$hdr"
    head -c 1000 /dev/zero
} >"$tmp/truncated.safetensors"
mpi 4 "$plan" --set cluster.world_size=4 --input "$tmp/truncated.safetensors" --format json
if [ "$rc" -eq 124 ] || [ "$ms" -ge 20000 ]; then
    failed "truncated --input: still running after $ms ms (exit $rc)"
elif [ "$rc" -ne 2 ]; then
    failed "truncated --input: exit $rc, expected 2"
elif ! grep -Eq '^cprun.*rank [0-9]+' "$tmp/err"; then
    failed "truncated --input: no message of cprun naming the rank"
elif ! grep -q 'truncated.safetensors' "$tmp/err"; then
    failed "truncated --input: the message does not name the file"
elif ! python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); assert o["ok"] is False and o["error"]["exit_status"] == 2 and "truncated.safetensors" in o["error"]["message"]' "$tmp/out" 2>/dev/null; then
    failed "truncated --input with --format json: stdout is not one JSON failure object: $(head -c 300 "$tmp/out")"
else
    printf 'run_cprun: %-42s ok: exit 2 in %d ms\n' "-np 4 truncated --input" "$ms"
fi

# ---- --tune under mpirun: every candidate is one MPI job of the same processes -----------
# (MPI is initialised once and kept alive between candidates: a job's end used
# to finalise it, and the second candidate failed "MPI is already finalized")
cat >"$tmp/tune.yaml" <<'PLAN'
version: 1
model: {heads: 4, head_dim: 16, dtype: fp32}
input: {batch: 2, tokens: 128}
cluster: {world_size: 4, device: cpu}
parallel: {variant: auto, cfg_degree: auto, tp_degree: auto}
PLAN
mpi 4 "$tmp/tune.yaml" --tune --iters 1 --profile-out "$tmp/tuned.yaml"
n_meas=$(grep -c 'key:' "$tmp/tuned.yaml" 2>/dev/null)
if [ $rc -ne 0 ] || [ "${n_meas:-0}" -lt 10 ]; then
    failed "--tune under mpirun -np 4: exit $rc, ${n_meas:-0} measurements (want every valid candidate, >= 10)"
fi

printf 'run_cprun: %d mpirun runs in %d ms: %s\n' "$runs" "$(ms_since "$t_start")" \
    "$([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
