#!/bin/sh
# tests/torch_install.sh VENV: torch 2.15.0 for CPU work into the venv VENV (made if missing), the
# light way. PyPI's Linux wheel is built for CUDA and its dependencies pull ~3 GB of nvidia-*
# packages. Only the wheel is installed (--no-deps, 540 MB) with its pure-Python dependencies,
# then, for each shared library its CUDA part links that this machine lacks (ldd) or has too old
# (the import's "undefined symbol"), the one nvidia package that ships it, into the folder the
# wheel's RPATH searches. With the CUDA 13 toolkit installed that is four packages (cuFile,
# cuSPARSELt, NVSHMEM, NCCL: ~0.6 GB); without it, all of them. Used by tests/references.sh (the
# tests' references) and bench/peers.sh (the benchmark peers).
set -eu
venv=$1
py=$venv/bin/python
torch_version=2.15.0
say() { echo "torch_install: $*" >&2; }
[ -x "$py" ] || python3 -m venv "$venv"
pip() { "$venv/bin/pip" --disable-pip-version-check -q "$@"; }
if "$py" -c "import torch; torch.ones(1)" >/dev/null 2>&1; then exit 0; fi
say "torch $torch_version (the wheel without its CUDA packages)"
pip install --no-deps "torch==$torch_version"
pip install filelock "typing-extensions>=4.13.0" "setuptools>=77.0.3" "sympy>=1.13.3" "networkx>=2.5.1" \
  jinja2 "fsspec>=0.8.5"
lib=$("$py" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))")/lib
# A library (libX.so.N) or symbol (ncclCommResume) -> the package, at torch 2.15.0's pins, that
# ships it. libcuda.so.1 is the GPU driver: torch loads it only when there is a GPU.
package_for() {
  case $1 in
    libcuda.so.*) ;;
    libcufile*|cuFile*) echo nvidia-cufile==1.17.1.22 ;;
    libcusparseLt*|cusparseLt*) echo nvidia-cusparselt-cu13==0.8.1 ;;
    libnvshmem*|nvshmem*) echo nvidia-nvshmem-cu13==3.7.2 ;;
    libcudnn*|cudnn*) echo nvidia-cudnn-cu13==9.26.0.51 ;;
    libnccl*|nccl*) echo nvidia-nccl-cu13==2.30.7 ;;
    libcublas*|cublas*) echo nvidia-cublas==13.4.1.3 ;;
    libcufft*|cufft*) echo nvidia-cufft==12.2.0.57 ;;
    libcusolver*|cusolver*) echo nvidia-cusolver==12.2.0.11 ;;
    libcusparse*|cusparse*) echo nvidia-cusparse==12.7.10.12 ;;
    libnvJitLink*|nvJitLink*) echo nvidia-nvjitlink==13.5.37 ;;
    libnvrtc*|nvrtc*) echo nvidia-cuda-nvrtc==13.2.86 ;;
    libcupti*|cupti*) echo nvidia-cuda-cupti==13.2.86 ;;
    libcurand*|curand*) echo nvidia-curand ;;
    libcudart*|cuda*) echo nvidia-cuda-runtime==13.2.86 ;;
    *) say "torch needs $1, which no known package provides" ;;
  esac
}
# First what ldd finds missing, then (a system library older than torch's) what the import
# names as an undefined symbol, one package at a time.
want=$(for m in $(ldd "$lib"/*.so 2>/dev/null | awk '/not found/ {print $1}' | sort -u); do package_for "$m"; done | sort -u)
tries=0
while :; do
  if [ -n "$(echo $want)" ]; then
    say "torch's CUDA libraries this machine lacks or has too old: $(echo $want)"
    pip install --no-deps $want
  fi
  err=$("$py" -c "import torch; torch.ones(1)" 2>&1) && break
  err=$(echo "$err" | tail -1)
  symbol=$(echo "$err" | sed -n 's/.*undefined symbol: \([A-Za-z_0-9]*\).*/\1/p; s/.*\(lib[A-Za-z_0-9.+-]*\.so[.0-9]*\): cannot open.*/\1/p')
  want=$(package_for "$symbol")
  tries=$((tries + 1))
  if [ -z "$symbol" ] || [ -z "$want" ] || [ $tries -gt 12 ]; then say "torch does not import: $err"; exit 1; fi
done
