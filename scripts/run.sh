#!/usr/bin/env bash
# The main job, from a fresh Debian machine (run as root; installs what is
# missing): build cpc, compile the FLUX.1-dev 1008x1008 plan (4481 tokens,
# 24 heads, head_dim 128, ulysses_anything on 4 ranks) and run it on 4 local
# CPU ranks with the float64 check, printing the report.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=build ./scripts/build.sh
plan=${1:-plans/flux1-dev-1008.yaml}
out="build/$(basename "${plan%.yaml}").cplan"
build/cpc --explain "$plan"
build/cpc "$plan" -o "$out"
build/cprun "$out" --check
