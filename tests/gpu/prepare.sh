#!/bin/sh
# tests/gpu/prepare.sh: run on a Debian 12 machine with network access, before a GPU session.
# Downloads (apt-get download: no install) the Debian packages that tests/gpu/run.sh needs on a
# GPU machine that has CUDA but no network and none of remax's build dependencies: LuaJIT (the
# build links the remax host program), OpenBLAS (the CPU reference), pkgconf (CMake finds LuaJIT
# with it) and OpenBLAS's Fortran runtime. They land in .debs/ (git-ignored), which run.sh
# unpacks with dpkg -x into a private prefix. About 20 MB.
set -eu
cd "$(dirname "$0")/../.."
packages="luajit libluajit-5.1-2 libluajit-5.1-common libluajit-5.1-dev
  libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0
  pkgconf pkgconf-bin libpkgconf3"
mkdir -p .debs
cd .debs
if ! apt-get download $packages; then
  echo "prepare.sh: apt-get download failed; run 'apt-get update' first (as root), then again" >&2
  exit 1
fi
echo "prepare.sh: $(ls *.deb | wc -l) packages, $(du -sh . | cut -f1) in .debs/"
