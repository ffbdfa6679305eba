#!/bin/sh
# bench/decode_bf16.sh: one decode step's matmuls at the Qwen2.5-0.5B shape with the weights in
# bf16 beside the same weights in f32, both remax's paths, in one run (OpenBLAS kernels chosen by
# bench/blas_core.sh for the f32 side's sgemm), 2 threads. Not a test.
#   bench/decode_bf16.sh [rows ...]        default: 1 8 16 32
set -eu
cd "$(dirname "$0")/.."
. bench/blas_core.sh   # builds first
build=${REMAX_BUILD:-build}
inc=$(sed -n 's/^CBLAS_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")
cc -O2 -o "$build/decode_bf16" bench/decode_bf16.c -I"$inc" -Iengine/cpu -Iengine/core -L"$build" -lremax -Wl,-rpath,"$(pwd)/$build"
for rows in ${*:-1 8 16 32}; do
  OMP_NUM_THREADS=${THREADS:-2} "$build/decode_bf16" "$rows"
done
