#!/bin/sh
# tests/gpu/prepare.sh: run here, on Debian 12 with network, before a GPU window. Downloads
# (apt-get download: nothing is installed) the Debian packages that tests/gpu/run.sh needs on a GPU
# machine that has CUDA, CMake and a C compiler but no network and none of remax's build
# dependencies, into .debs/ (git-ignored; about 16 MB), which run.sh unpacks with dpkg -x into a
# private prefix (never into /):
#   LuaJIT and its headers    the remax host program (benchmarks, the model-step and loop checks)
#   OpenBLAS (OpenMP)          the CPU reference of every GPU test; its Fortran runtime
#   PCRE2 (headers, 8-bit)     the tokenizer's pre-tokenizer regex
#   lua-cjson                  the Lua library reads config.json with it
#   busted and its Lua modules the Lua specs' device tests (run with LuaJIT; cliargs' optional
#                              YAML and INI loaders are left out)
#   pkgconf                    CMake finds LuaJIT and PCRE2 through it
# libgomp1 and libc stay the GPU machine's own: its compiler links OpenMP against them.
#   sh tests/gpu/prepare.sh            (apt-get update first if apt-get download finds nothing)
set -eu
cd "$(dirname "$0")/../.."
packages="luajit libluajit-5.1-2 libluajit-5.1-common libluajit-5.1-dev
  libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  lua-cjson
  lua-busted lua-cliargs lua-dkjson lua-filesystem lua-luassert lua-mediator lua-penlight lua-say
  lua-system lua-term
  pkgconf pkgconf-bin libpkgconf3"
if [ "$(dpkg --print-architecture 2>/dev/null)" != amd64 ]; then
  echo "prepare.sh: the GPU machine is x86-64; run this on an amd64 Debian 12 machine" >&2
  exit 1
fi
rm -rf .debs.tmp
mkdir -p .debs.tmp
# shellcheck disable=SC2086  # the package list splits on purpose
if ! (cd .debs.tmp && apt-get download $packages); then
  rm -rf .debs.tmp
  echo "prepare.sh: apt-get download failed; run 'apt-get update' first (as root), then again" >&2
  exit 1
fi
rm -rf .debs
mv .debs.tmp .debs
echo "prepare.sh: $(ls .debs/*.deb | wc -l) packages, $(du -sh .debs | cut -f1) in .debs/"
