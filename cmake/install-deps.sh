#!/usr/bin/env bash
# Installs libzero's build and test dependencies from Debian 12 packages.
# Idempotent: packages already present are left alone, so it is cheap to run again.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git
      libyaml-cpp-dev libcli11-dev catch2 libopenmpi-dev openmpi-bin
      liburing-dev libopenblas-dev python3 python3-matplotlib
      nlohmann-json3-dev libfmt-dev libxxhash-dev clang-format-14)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all dependencies present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
