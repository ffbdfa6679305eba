#!/bin/sh
# bench/llamacpp_install.sh: llama.cpp as remax's peer, through the npm package node-llama-cpp
# pinned to 3.21.1 with its prebuilt linux-x64 CPU binaries (no compiler, no CUDA/Vulkan builds),
# into .cache/llamacpp (git-ignored). About 85 MB and 10 s. tests/lua/gguf_spec.lua and
# bench/llamacpp_decode.lua use it when it is there; .ci/run calls this script.
#   bench/llamacpp_install.sh            # REMAX_LLAMACPP_HOME=DIR installs elsewhere
#   bench/llamacpp_install.sh --batched  # also builds llama.cpp's own llama-batched-bench
#   bench/llamacpp_install.sh --batched-prebuilt   # the same tool on the package's prebuilt libraries
#
# --batched: the package ships the llama.cpp source it was built from (llama/gitRelease.bundle, a
# git bundle); its batched decoder (llama-batched-bench, every sequence in one batch) is the
# strongest decode peer, where node-llama-cpp's evaluation runs the sequences one by one. Built
# natively (GGML_NATIVE, llama.cpp's default CPU settings, no BLAS, no GPU) with cmake into
# $dir/batched (cached: rebuilt only when missing). About 10 minutes on 2 cores; prints the path.
# --batched-prebuilt: only the tool's two source files from the bundle, compiled (seconds) and
# linked against the libraries node-llama-cpp ships prebuilt (libllama, libllama-common, and ggml
# with its CPU variants, the best one for the CPU picked when it loads: on x86-64 with AVX-512 BF16
# and no AMX, "zen4", which has AVX512_BF16) into $dir/prebuilt; for a machine too busy for the
# native build. Its logs are silent unless verbose: bench/llamacpp_decode.lua runs it with -v.
set -eu
cd "$(dirname "$0")/.."
dir=${REMAX_LLAMACPP_HOME:-.cache/llamacpp}
version=3.21.1
batched=0
[ "${1:-}" = "--batched" ] && batched=1
[ "${1:-}" = "--batched-prebuilt" ] && batched=2

install_package() {
  if [ -f "$dir/node_modules/node-llama-cpp/package.json" ] &&
     grep -q "\"version\": \"$version\"" "$dir/node_modules/node-llama-cpp/package.json"; then
    return 0
  fi
  mkdir -p "$dir"
  # --omit=optional skips the CUDA and Vulkan variants (hundreds of MB); the CPU one is named
  # explicitly. The package's postinstall (which may try to build llama.cpp) is not needed: the
  # prebuilt binary is used as is.
  NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund --ignore-scripts --omit=optional \
    --prefix "$dir" "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >/dev/null
  echo "node-llama-cpp $version installed in $dir" >&2
}

# llama-batched-bench from the bundled source, for this CPU.
build_batched() {
  out="$dir/batched/bin/llama-batched-bench"
  if [ -x "$out" ]; then echo "$out"; return 0; fi
  bundle="$dir/node_modules/node-llama-cpp/llama/gitRelease.bundle"
  [ -f "$bundle" ] || { echo "llamacpp_install: no llama.cpp source bundle at $bundle" >&2; exit 1; }
  rm -rf "$dir/batched"
  git clone -q "$bundle" "$dir/batched/src" 2>/dev/null
  cmake -S "$dir/batched/src" -B "$dir/batched/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DBUILD_SHARED_LIBS=OFF >"$dir/batched/cmake.log" 2>&1 ||
    { tail -20 "$dir/batched/cmake.log" >&2; exit 1; }
  cmake --build "$dir/batched/build" --target llama-batched-bench -j "$(nproc)" >"$dir/batched/build.log" 2>&1 ||
    { tail -20 "$dir/batched/build.log" >&2; exit 1; }
  mkdir -p "$dir/batched/bin"
  cp "$dir/batched/build/bin/llama-batched-bench" "$out"
  echo "llama-batched-bench built in $out" >&2
  echo "$out"
}

# llama-batched-bench from the bundled source on the prebuilt libraries.
build_batched_prebuilt() {
  out="$dir/prebuilt/llama-batched-bench"
  if [ -x "$out" ]; then echo "$out"; return 0; fi
  bundle="$dir/node_modules/node-llama-cpp/llama/gitRelease.bundle"
  libs="$(cd "$dir" && pwd)/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
  [ -f "$bundle" ] || { echo "llamacpp_install: no llama.cpp source bundle at $bundle" >&2; exit 1; }
  [ -f "$libs/libllama-common.so" ] || { echo "llamacpp_install: no prebuilt libraries in $libs" >&2; exit 1; }
  src="$dir/prebuilt/src"
  rm -rf "$dir/prebuilt"
  git clone -q "$bundle" "$src" 2>/dev/null
  # ggml looks for its CPU variants beside the program
  for f in "$libs"/*.so; do ln -s "$f" "$dir/prebuilt/"; done
  llama=$(cd "$libs" && ls libllama.v*.so) ggml=$(cd "$libs" && ls libggml.v*.so)
  c++ -O2 -std=c++17 -I"$src/include" -I"$src/common" -I"$src/ggml/include" -I"$src/vendor" \
    -I"$src/tools/batched-bench" "$src/tools/batched-bench/batched-bench.cpp" "$src/tools/batched-bench/main.cpp" \
    -o "$out" -L"$libs" -l:libllama-common.so -l:"$llama" -l:"$ggml" -l:libggml-base.so -Wl,-rpath,"$libs"
  rm -rf "$src"
  echo "llama-batched-bench (prebuilt libraries) built in $out" >&2
  echo "$out"
}

install_package
if [ "$batched" = 1 ]; then build_batched; fi
if [ "$batched" = 2 ]; then build_batched_prebuilt; fi
