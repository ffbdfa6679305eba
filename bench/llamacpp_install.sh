#!/bin/sh
# bench/llamacpp_install.sh: llama.cpp's own batched decoder, llama-batched-bench, as remax's
# decoding peer (bench/llamacpp_decode.sh), built from the llama.cpp source that llama-cpp-python's
# sdist carries: .cache/llama.cpp, unpacked by tests/references.sh (the same source the tests'
# llama.cpp reference, llama-cpp-python, is built from). Prints the program's path.
#
#   bench/llamacpp_install.sh       # REMAX_LLAMACPP_BUILD=DIR builds elsewhere
#
# Built natively: cmake, Release, GGML_NATIVE (-march=native: the CPU's own vector extensions),
# llama.cpp's default CPU settings otherwise (no BLAS, no GPU backend), static libraries, only
# the llama-batched-bench target (it pulls libllama, ggml and llama.cpp's common library), into
# .cache/llamacpp-build (git-ignored), kept: rebuilt only when the program is missing or the
# source changed (a hash of its files' names and sizes: the sdist's copy has no .git). `cmake --build`
# took 577 s (7 min of CPU time) on 2 cores that other builds shared (load 3-5); about 4 minutes
# on 2 idle ones (estimated from the CPU time). 11 MB program, 68 MB build tree.
set -eu
cd "$(dirname "$0")/.."
src=.cache/llama.cpp
dir=${REMAX_LLAMACPP_BUILD:-.cache/llamacpp-build}
out=$dir/bin/llama-batched-bench

if ! [ -f "$src/CMakeLists.txt" ]; then
  echo "llamacpp_install: no llama.cpp source in $src: tests/references.sh unpacks it from llama-cpp-python's sdist" >&2
  exit 1
fi
# the source's identity: the sdist's llama.cpp carries no .git, so its files' listing and sizes
version=$( (cd "$src" && find src ggml/src common tools/batched-bench include ggml/include -type f -printf '%P %s\n' 2>/dev/null | sort) | sha256sum | cut -c1-16)
if [ -x "$out" ] && [ "$(cat "$dir/source.version" 2>/dev/null)" = "$version" ]; then
  echo "$out"
  exit 0
fi

rm -rf "$dir"
mkdir -p "$dir"
echo "llamacpp_install: building llama-batched-bench from $src into $dir (several minutes)" >&2
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF >"$dir/cmake.log" 2>&1 ||
  { tail -20 "$dir/cmake.log" >&2; exit 1; }
t0=$(date +%s)
cmake --build "$dir/build" --target llama-batched-bench -j "$(nproc)" >"$dir/build.log" 2>&1 ||
  { tail -20 "$dir/build.log" >&2; exit 1; }
mkdir -p "$dir/bin"
cp "$dir/build/bin/llama-batched-bench" "$out"
echo "$version" >"$dir/source.version"
echo "llamacpp_install: built $out in $(( $(date +%s) - t0 )) s (cmake --build, $(nproc) jobs)" >&2
echo "$out"
