#!/usr/bin/env bash
# Installs every package cpc needs on a Debian machine (run as root; does
# nothing when everything is already there).  Used by run.sh, test.sh and CI.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libyaml-dev liblua5.4-dev libcriterion-dev
      libopenblas-dev libcjson-dev openmpi-bin libopenmpi-dev clang libclang-rt-14-dev
      gnuplot-nox libssl-dev librandom123-dev python3
      python3-venv python3-pip python3-numpy python3-mpi4py python3-pytest python3-yaml
      python3-torch)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
