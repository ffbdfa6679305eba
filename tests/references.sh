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
# torch: tests/torch_install.sh (the wheel without its CUDA packages, and only the CUDA libraries
# this machine lacks, so that it imports; used on the CPU).
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
tests/torch_install.sh "$venv"

say "tests/requirements.txt"
grep -vE '^(peft|accelerate)==' tests/requirements.txt >"$cache/requirements.deps.txt"
pip install -r "$cache/requirements.deps.txt"
pip install --no-deps $(grep -oE '^(peft|accelerate)==[^ ]*' tests/requirements.txt)

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
