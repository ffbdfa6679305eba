#!/bin/sh
# bench/llamacpp_install.sh: llama.cpp as remax's peer, through the npm package node-llama-cpp
# pinned to 3.21.1 with its prebuilt linux-x64 CPU binaries (no compiler, no CUDA/Vulkan builds),
# into .cache/llamacpp (git-ignored). About 85 MB and 10 s. tests/lua/gguf_spec.lua and
# bench/llamacpp_decode.lua use it when it is there; .ci/run calls this script.
#   bench/llamacpp_install.sh            # REMAX_LLAMACPP_HOME=DIR installs elsewhere
set -eu
cd "$(dirname "$0")/.."
dir=${REMAX_LLAMACPP_HOME:-.cache/llamacpp}
version=3.21.1
if [ -f "$dir/node_modules/node-llama-cpp/package.json" ] &&
   grep -q "\"version\": \"$version\"" "$dir/node_modules/node-llama-cpp/package.json"; then
  exit 0
fi
mkdir -p "$dir"
# --omit=optional skips the CUDA and Vulkan variants (hundreds of MB); the CPU one is named
# explicitly. The package's postinstall (which may try to build llama.cpp) is not needed: the
# prebuilt binary is used as is.
NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund --ignore-scripts --omit=optional \
  --prefix "$dir" "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >/dev/null
echo "node-llama-cpp $version installed in $dir"
