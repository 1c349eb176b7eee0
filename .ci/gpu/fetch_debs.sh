#!/usr/bin/env bash
# fetch_debs.sh: downloads (does not install) the Debian 12 packages that gpu_verify.sh unpacks
# into a private prefix on a GPU machine that lacks them. Run on any Debian 12 (bookworm) amd64
# machine with network access; the .debs land in DIR (default: .gpuverify/debs in the current
# directory, the project root).
#   bash .ci/gpu/fetch_debs.sh [DIR]
# About 21 MB. On the GPU machine gpu_verify.sh reads them from ZERO_DEBS_DIR.
set -euo pipefail
dir=${1:-.gpuverify/debs}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# build/test deps of libzero (cmake/install-deps.sh) that an image with only CUDA + PyTorch lacks,
# with the run-time closure of Debian's OpenMPI 4.1 (libc6/libstdc++6/zlib1g/libudev1/libuuid1
# are assumed present on any glibc-based image).
pkgs=(
  libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev catch2
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libpmix2 libmunge2
  libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  libpsm-infinipath1 libpsm2-2 libnuma1 libatomic1
  liburing-dev liburing2
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5 libquadmath0
  pkgconf pkgconf-bin libpkgconf3
  nlohmann-json3-dev libfmt-dev libfmt9 libxxhash-dev libxxhash0
)
. /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] || echo "fetch_debs: warning: this is ${PRETTY_NAME:-unknown}, not Debian 12; the list is for bookworm" >&2
apt-get update -qq || true
cd "$dir"
apt-get download "${pkgs[@]}"
ls -1 "$dir"/*.deb | wc -l
du -sh "$dir"
