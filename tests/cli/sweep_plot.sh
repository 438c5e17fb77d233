#!/usr/bin/env bash
# `cpc --sweep KEY=V1,V2,... [--plot FILE.svg]` end to end.
#   Exit status: 0 when at least one value is valid, 1 when every value is
#   rejected (an unknown KEY: CP101 on every point), else the worst class
#   >= 2 over the points (2: a usage or I/O error such as a missing
#   cluster.profile).  A KEY inside a sequence (input.segments[1]...) sweeps
#   like any other, and --help documents the syntax; an index past the end
#   (or input.segments[0] on a plan with the tokens shorthand) is one usage
#   error (2) and no table; a second --sweep is a usage error.  Rejected
#   points show '-' as selected; an invalid value (CP103) is a row with its
#   rule in every variant's cell.
#   --plot: the file name never reaches gnuplot's script (the SVG comes back
#   on gnuplot's stdout), the plan path and key are quoted for gnuplot
#   ('' for '), so the injection `x.svg'; system('touch PWNED'); '` creates
#   no file; a target that cannot be created fails before the sweep (2);
#   gnuplot's exit status is reported as such (3, with its messages), a
#   missing gnuplot is a warning (0, no file), and a plot with rejected
#   points has no "Skipping data file" warnings.  Fake gnuplots on PATH test
#   the failure paths without depending on the real one.
# Runs from the repository root; the binary is $CPC_BUILD_DIR/cpc.
set -u
cd "$(dirname "$0")/../.."
CPC="${CPC_BUILD_DIR:-build}/cpc"
[ -x "$CPC" ] || { echo "sweep_plot.sh: $CPC not built" >&2; exit 1; }
CPC=$(cd "$(dirname "$CPC")" && pwd)/cpc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" /tmp/PWNED_cpc_sweep_plot_test' EXIT
fails=0
. tests/cli/lib/harness.sh  # fail, has, t
PLAN=$(pwd)/plans/flux1-dev-1024.yaml   # text 512 + image 4096 tokens, 24 heads, ulysses x4
cp "$PLAN" "$tmp/plan.yaml"

# ---- exit statuses -----------------------------------------------------------------------
t valid       0 "$CPC" --sweep cluster.world_size=2,4,8 "$PLAN"
t mixed       0 "$CPC" --sweep cluster.world_size=3,4 "$PLAN"
# each rule code in the table's cells is explained once below it, with its point
grep -q "^  CP010 (cluster.world_size=3): ring: " "$tmp/mixed.out" || fail "mixed: CP010 not explained"
[ "$(grep -c '^  CP010 ' "$tmp/mixed.out")" -eq 1 ] || fail "mixed: CP010 explained more than once"
t all-reject  1 "$CPC" --sweep cluster.world_size=3,5 "$PLAN"
# a point rejected before any variant (auto with pinned degrees: stage-1 CP105 in every
# cell) has its message below the table too (it printed nothing, new-user trial)
t pinned-auto 1 "$CPC" --sweep cluster.world_size=2,6 --set parallel.variant=auto \
  plans/cogvideox-5b-replicate-6gpu.yaml
grep -q "^  CP105 (cluster.world_size=2): auto: " "$tmp/pinned-auto.out" || fail "pinned-auto: CP105 not explained"
t no-key      1 "$CPC" --sweep cluster.no_such_key=1,2 "$PLAN"
has no-key.err "CP101"
t no-key-json 1 "$CPC" --sweep cluster.no_such_key=1,2 --format json "$PLAN"
t io-point    2 "$CPC" --sweep cluster.profile=no-such-profile.yaml,also-missing.yaml "$PLAN"
t io-mixed    2 "$CPC" --sweep cluster.world_size=4,-1 --set cluster.profile=no-such.yaml "$PLAN"
t bad-sweep   2 "$CPC" --sweep cluster.world_size= "$PLAN"
python3 - "$tmp/no-key-json.out" <<'EOF' || fail "no-key-json: one JSON object per point expected"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2 and all(not r["ok"] and r["diagnostics"][0]["code"] == "CP101" for r in rows), rows
EOF

# ---- a key inside a sequence ----------------------------------------------------------------
t seq 0 "$CPC" --sweep 'input.segments[1].image.height=512,1008,1024' "$PLAN"
for v in 512 1008 1024; do
  grep -Eq "^$v +[0-9]" "$tmp/seq.out" || fail "seq: no row for height $v"
done
[ "$(awk 'NR>2 {print $2}' "$tmp/seq.out" | sort -u | wc -l)" -eq 3 ] \
  || fail "seq: the height did not change the prediction"
# an index past the end is a usage error about the KEY (2), said once, no table
t seq-past-end 2 "$CPC" --sweep 'input.segments[5].tokens=8,16' "$PLAN"
has seq-past-end.err "'input.segments' has 2 elements, so \[5\] is out of range (valid: 0..1)"
[ "$(grep -c 'out of range' "$tmp/seq-past-end.err")" -eq 1 ] || fail "seq-past-end: the KEY's error more than once"
[ ! -s "$tmp/seq-past-end.out" ] || fail "seq-past-end: a table for a KEY that does not exist"
# input.segments[0] on a plan written with the tokens shorthand: a clear error
printf 'version: 1\nmodel: {heads: 4, head_dim: 8, dtype: fp32}\ninput: {tokens: 16}\ncluster: {world_size: 4, device: cpu}\n' \
  >"$tmp/tokens.yaml"
t seq-shorthand 2 "$CPC" --sweep 'input.segments[0].tokens=8,16' "$tmp/tokens.yaml"
has seq-shorthand.err "set input.tokens instead"
t seq-tokens 0 "$CPC" --sweep 'input.tokens=8,16' "$tmp/tokens.yaml"
# rejected points: '-' in the selected column ("none" is a variant), and a
# value that is itself invalid (CP103) is a row with its rule
t rejected 0 "$CPC" --sweep cluster.world_size=0,3,4 "$PLAN"
grep -Eq '^0 +CP103 +CP103 +CP103 +CP103 +CP103 +-$' "$tmp/rejected.out" || fail "rejected: no CP103 row for 0"
grep -Eq '^3 .* -$' "$tmp/rejected.out" || fail "rejected: the rejected point 3 is not shown as '-'"
grep -Eq '^4 .* ulysses 1x4$' "$tmp/rejected.out" || fail "rejected: point 4 not selected"
! grep -Eq ' none$' "$tmp/rejected.out" || fail "rejected: 'none' in the selected column"
[ "$(grep -c '^[0-9]' "$tmp/rejected.out")" -eq 3 ] || fail "rejected: one row per value expected"
# one --sweep per run
t two-sweeps 2 "$CPC" --sweep cluster.world_size=2,4 --sweep input.batch=1,2 "$PLAN"
has two-sweeps.err "only one --sweep per run"
t help 0 "$CPC" --help
has help.out "input.segments\[1\].image.height"

# ---- fake gnuplots: failure paths, and what the script holds -----------------------------------
mkdir -p "$tmp/bin-fail" "$tmp/bin-kill" "$tmp/bin-ok" "$tmp/bin-none"
cat >"$tmp/bin-fail/gnuplot" <<'EOF'
#!/bin/sh
cat >/dev/null
echo "line 3: boom from the fake gnuplot" >&2
exit 7
EOF
cat >"$tmp/bin-kill/gnuplot" <<'EOF'
#!/bin/sh
cat >/dev/null
kill -9 $$
EOF
cat >"$tmp/bin-ok/gnuplot" <<EOF
#!/bin/sh
cat >"$tmp/script.gp"
echo "Skipping data file with no valid points" >&2
echo '<svg>fake</svg>'
EOF
chmod +x "$tmp"/bin-*/gnuplot
SH=$(command -v sh)
ln -s "$SH" "$tmp/bin-none/sh"

PATH="$tmp/bin-fail:$PATH" t gp-fail 3 "$CPC" --sweep cluster.world_size=2,4 "$PLAN" --plot "$tmp/f.svg"
has gp-fail.err "gnuplot failed (exit status 7)"
has gp-fail.err "boom from the fake gnuplot"
[ ! -e "$tmp/f.svg" ] || fail "gp-fail: an empty plot file was left"
PATH="$tmp/bin-kill:$PATH" t gp-kill 3 "$CPC" --sweep cluster.world_size=2,4 "$PLAN" --plot "$tmp/k.svg"
has gp-kill.err "killed by signal 9"
PATH="$tmp/bin-none" t gp-none 0 "$CPC" --sweep cluster.world_size=2,4 "$PLAN" --plot "$tmp/n.svg"
has gp-none.err "gnuplot is not installed"
[ ! -e "$tmp/n.svg" ] || fail "gp-none: a plot file was created"
# the quoted plan path and key, the SVG copied from gnuplot's stdout, its
# warnings not shown on success
sed "s/^name: .*/name: \"it's plan\"/" "$PLAN" >"$tmp/it's.yaml"
PATH="$tmp/bin-ok:$PATH" t gp-ok 0 "$CPC" --sweep cluster.world_size=3,4 "$tmp/it's.yaml" --plot "$tmp/o.svg"
[ "$(cat "$tmp/o.svg" 2>/dev/null)" = "<svg>fake</svg>" ] || fail "gp-ok: the SVG was not copied from gnuplot's output"
grep -q "Skipping" "$tmp/gp-ok.err" && fail "gp-ok: gnuplot's warnings shown on success"
grep -qF "title 'it''s plan' . ': predicted per layer vs ' . 'cluster.world_size'" "$tmp/script.gp" \
  || { fail "gp-ok: plan name not quoted for gnuplot"; grep multiplot "$tmp/script.gp" >&2; }
grep -qF "$tmp" "$tmp/script.gp" && grep -F "$tmp" "$tmp/script.gp" | grep -v "index" | grep -q . \
  && fail "gp-ok: a path in the plot's title or labels (the title is the plan's name)"
# the selected candidate is ringed, series are shifted apart (ring and ring_anything
# coincide), rule codes have their own panel below the data
grep -q "title 'selected'" "$tmp/script.gp" || fail "gp-ok: no 'selected' series"
grep -q "using (\$1-0.08):3" "$tmp/script.gp" && grep -q "using (\$1+0.08):3" "$tmp/script.gp" \
  || fail "gp-ok: coinciding series are not shifted apart"
grep -q "set ylabel 'rejected'" "$tmp/script.gp" || fail "gp-ok: no panel for the rule codes"
# with model.parameters the plot and the table compare whole steps
PATH="$tmp/bin-ok:$PATH" t gp-step 0 "$CPC" --sweep cluster.world_size=2,4 "$PLAN" --set model.parameters=11901408320 --plot "$tmp/s.svg"
grep -q "predicted per step" "$tmp/script.gp" || fail "gp-step: the plot is not per step"
has gp-step.out "ms per step / memory per rank"
grep -q "o.svg" "$tmp/script.gp" && fail "gp-ok: the output file name is in gnuplot's script"
grep -q "set output" "$tmp/script.gp" && fail "gp-ok: the script sets an output"

# ---- four axes: a plan whose points split over cfg_degree / tp_degree -------------------------
# the table's selected column names C x T; every valid (C, T, R, U) is listed per point,
# fastest first, the selected one marked; the plot has one series per (C, T) family,
# shifted apart, the selected ringed, the rule panel one row per family
AXES=$(pwd)/plans/flux1-dev-8gpu-axes.yaml
PATH="$tmp/bin-ok:$PATH" t axes 0 "$CPC" --sweep cluster.world_size=2,4,8 "$AXES" --set cluster.device=l20 --plot "$tmp/a.svg"
grep -Eq '^8 .* C x T [0-9]+x[0-9]+$' "$tmp/axes.out" || fail "axes: no C x T in the selected column"
has axes.out "cluster.world_size=8: 26 valid splits"
python3 - "$tmp/axes.out" <<'EOF' || fail "axes: the per-point listing is not every valid split, fastest first, one selected"
import re, sys
blocks = open(sys.argv[1]).read().split("\ncluster.world_size=")[1:]
assert len(blocks) == 3, len(blocks)
for b in blocks:
    rows = [l for l in b.splitlines()[2:] if l.strip()]
    n = int(re.search(r": (\d+) valid split", b).group(1))
    assert len(rows) == n, (n, rows)
    times = [float(l[2:].split()[3]) for l in rows]
    assert times == sorted(times), times
    assert sum(l.startswith("*") for l in rows) == 1, rows
EOF
for fam in 'C 1 x T 1' 'C 1 x T 8' 'C 2 x T 4'; do
  grep -qF "title '$fam'" "$tmp/script.gp" || fail "axes: no series '$fam' in the plot"
done
grep -q "title 'selected'" "$tmp/script.gp" || fail "axes: no 'selected' series"
grep -q "using (\$1-0.16):3" "$tmp/script.gp" && grep -q "using (\$1+0.16):3" "$tmp/script.gp" \
  || fail "axes: the families are not shifted apart"
grep -qF "'flux1-dev-8gpu-axes' . ': predicted per step vs '" "$tmp/script.gp" || fail "axes: title is not the plan's name"

# ---- the target checked before the sweep ----------------------------------------------------
t plot-nodir 2 "$CPC" --sweep cluster.world_size=2,4 "$PLAN" --plot "$tmp/nodir/x.svg"
has plot-nodir.err "cannot create: No such file or directory"
[ ! -s "$tmp/plot-nodir.out" ] || fail "plot-nodir: the sweep ran before the check"
t plot-dir 2 "$CPC" --sweep cluster.world_size=2,4 "$PLAN" --plot "$tmp"
has plot-dir.err "is a directory"
t plot-plan 2 "$CPC" --sweep cluster.world_size=2,4 "$tmp/plan.yaml" --plot "$tmp/plan.yaml"
has plot-plan.err "refusing to overwrite the plan file"
cmp -s "$tmp/plan.yaml" "$PLAN" || fail "plot-plan: the plan was changed"
t plot-newline 2 "$CPC" --sweep cluster.world_size=2,4 "$PLAN" --plot "$tmp/a
b.svg"
t sweep-newline 2 "$CPC" --sweep "cluster.world_size=2,4
" "$PLAN"

# ---- the real gnuplot, where it is installed ------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
  mkdir "$tmp/inj"
  rm -f /tmp/PWNED_cpc_sweep_plot_test
  inj="x.svg'; system('touch PWNED'); system('touch /tmp/PWNED_cpc_sweep_plot_test'); '"
  (cd "$tmp/inj" && "$CPC" --sweep cluster.world_size=2,4 "$PLAN" --plot "$inj" >"$tmp/inj.out" 2>"$tmp/inj.err")
  rc=$?
  # the name has a '/': no such directory, exit 2 before gnuplot
  [ "$rc" -eq 2 ] || fail "inj: exited $rc, expected 2 (no such directory)"
  inj2="x.svg'; system('touch PWNED'); '"
  (cd "$tmp/inj" && "$CPC" --sweep cluster.world_size=3,4,8 "$PLAN" --plot "$inj2" >"$tmp/inj2.out" 2>"$tmp/inj2.err")
  rc=$?
  [ "$rc" -eq 0 ] || { fail "inj2: exited $rc"; cat "$tmp/inj2.err" >&2; }
  [ ! -e "$tmp/inj/PWNED" ] && [ ! -e /tmp/PWNED_cpc_sweep_plot_test ] || fail "inj: the injected command ran"
  head -c 5 "$tmp/inj/$inj2" 2>/dev/null | grep -q '<?xml' || fail "inj2: no SVG under the literal name"
  grep -v "^cpc: wrote" "$tmp/inj2.err" | grep -q . && { fail "inj2: messages on stderr"; cat "$tmp/inj2.err" >&2; }
  # a plan path with a quote, every point of some variants rejected: no warnings
  t real-quote 0 "$CPC" --sweep cluster.world_size=3,5,4 "$tmp/it's.yaml" --plot "$tmp/q.svg"
  grep -q "it's plan: predicted per layer vs cluster.world_size" "$tmp/q.svg" || fail "real-quote: title missing"
  grep -v "^cpc: wrote" "$tmp/real-quote.err" | grep -q . && { fail "real-quote: messages on stderr"; cat "$tmp/real-quote.err" >&2; }
  t real-all-reject 1 "$CPC" --sweep cluster.world_size=3,5 "$PLAN" --plot "$tmp/r.svg"
  head -c 5 "$tmp/r.svg" | grep -q '<?xml' || fail "real-all-reject: no SVG"
  grep -v "^cpc: wrote" "$tmp/real-all-reject.err" | grep -q . && { fail "real-all-reject: messages on stderr"; cat "$tmp/real-all-reject.err" >&2; }
else
  echo "sweep_plot.sh: gnuplot not installed; the real-gnuplot checks skipped (the fake ones ran)"
fi

if [ "$fails" -ne 0 ]; then
  echo "sweep_plot.sh: $fails failure(s)" >&2
  exit 1
fi
echo "sweep_plot.sh: all checks passed"
