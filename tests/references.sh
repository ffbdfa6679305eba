#!/bin/sh
# tests/references.sh: the Python environment of the tests' references, in .cache/ (git-ignored),
# kept between runs. `./remax test` and .ci/run call it; `./remax run` needs none of it.
#
#   .cache/venv/           python3 -m venv with tests/requirements.txt (tokenizers, transformers,
#                          peft, tensorboard, gguf, ...), torch, and llama-cpp-python
#   .cache/llama.cpp/      llama.cpp's source as llama-cpp-python's sdist carries it: models/ holds
#                          the vocab-only GGUFs with their .inp/.out vectors, models/templates/ real
#                          chat templates; bench/llamacpp_install.sh builds llama-batched-bench from it
#   .cache/references.ok   written last: the hash of what was installed (nothing runs again until
#                          tests/requirements.txt or this file changes)
#
# torch: PyPI's Linux wheel is built for CUDA and pulls ~3 GB of nvidia-* packages. Only the
# wheel is installed (--no-deps, 540 MB), then, for each shared library its CUDA part links and
# this machine lacks (`ldd`), the one nvidia package that ships it, where the wheel's RPATH looks:
# on a machine with the CUDA 13 toolkit that is three packages (cufile, cuSPARSELt, NVSHMEM), on
# one without it all of them. torch then runs on the CPU as usual.
#
# llama-cpp-python: built from its sdist once (CPU only, no examples; about 6 minutes on 2 cores).
#
# Exit status 0 when everything is installed; otherwise 1, saying what is missing: the specs that
# need a missing reference report themselves as skipped with the install line (tests/lua/support.lua,
# support.reference), or fail when REMAX_REFERENCES_REQUIRED=1 (as in CI).
set -eu
cd "$(dirname "$0")/.."
cache=.cache
venv=$cache/venv
py=$venv/bin/python
llama_version=0.3.36
torch_version=2.15.0

stamp=$(cat tests/requirements.txt tests/references.sh | sha256sum | cut -c1-16)
if [ -f "$cache/references.ok" ] && [ "$(cat "$cache/references.ok")" = "$stamp" ] && [ -x "$py" ]; then
  exit 0
fi
rm -f "$cache/references.ok"
mkdir -p "$cache"
say() { echo "references: $*" >&2; }
t0=$(date +%s)

if ! [ -x "$py" ]; then
  say "creating $venv (python3 -m venv)"
  python3 -m venv "$venv" || { say "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
fi
pip() { "$venv/bin/pip" --disable-pip-version-check -q "$@"; }

# torch first, so that peft's and transformers' "torch" is already satisfied when they install.
if ! "$py" -c "import torch" >/dev/null 2>&1; then
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
    err=$("$py" -c "import torch; torch.ones(1)" 2>&1 | tail -1) && break
    symbol=$(echo "$err" | sed -n 's/.*undefined symbol: \([A-Za-z_0-9]*\).*/\1/p; s/.*\(lib[A-Za-z_0-9.+-]*\.so[.0-9]*\): cannot open.*/\1/p')
    want=$(package_for "$symbol")
    tries=$((tries + 1))
    if [ -z "$symbol" ] || [ -z "$want" ] || [ $tries -gt 12 ]; then say "torch does not import: $err"; exit 1; fi
  done
fi

say "tests/requirements.txt"
pip install -r tests/requirements.txt

# llama-cpp-python's sdist, once: its llama.cpp source for the vocab files and templates, then
# the package built from it.
sdist=$cache/sdist/llama_cpp_python-$llama_version.tar.gz
if ! [ -f "$sdist" ]; then
  say "llama-cpp-python $llama_version sdist"
  pip download --no-deps --no-binary :all: "llama-cpp-python==$llama_version" -d "$cache/sdist"
fi
if ! [ -f "$cache/llama.cpp/models/ggml-vocab-qwen2.gguf" ]; then
  rm -rf "$cache/llama.cpp" "$cache/llama.cpp.tmp"
  mkdir -p "$cache/llama.cpp.tmp"
  tar xzf "$sdist" -C "$cache/llama.cpp.tmp"
  mv "$cache/llama.cpp.tmp/llama_cpp_python-$llama_version/vendor/llama.cpp" "$cache/llama.cpp"
  rm -rf "$cache/llama.cpp.tmp"
fi
if ! "$py" -c "import llama_cpp" >/dev/null 2>&1; then
  say "building llama-cpp-python $llama_version from its sdist (CPU; several minutes on 2 cores)"
  b0=$(date +%s)
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DGGML_BLAS=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) pip install --no-deps "$sdist" 2>&1 | tail -20 >&2 || true
  pip install "diskcache>=5.6.1" >/dev/null 2>&1 || true
  "$py" -c "import llama_cpp" || { say "llama-cpp-python did not build"; exit 1; }
  say "llama-cpp-python built in $(( $(date +%s) - b0 )) s"
fi

echo "$stamp" >"$cache/references.ok"
say "ready in $(( $(date +%s) - t0 )) s ($venv)"
