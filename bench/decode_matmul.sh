#!/bin/sh
# bench/decode_matmul.sh: one decode step's matmuls at the Qwen2.5-0.5B shape: remax's f32 decode
# kernel, remax with the weights stored in bf16, and OpenBLAS sgemm (kernels chosen by
# bench/blas_core.sh, as bench/generate.sh), in one run, 2 threads. Not a test.
#   bench/decode_matmul.sh [rows ...]        default: 1 8 16 32
set -eu
cd "$(dirname "$0")/.."
. bench/blas_core.sh   # builds first
build=${REMAX_BUILD:-build}
blas=$(sed -n 's/^OPENBLAS_LIB:FILEPATH=//p' "$build/CMakeCache.txt")
inc=$(sed -n 's/^CBLAS_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")
cc -O2 -o "$build/decode_matmul" bench/decode_matmul.c -I"$inc" -Iengine/cpu -Iengine/core -L"$build" -lremax -Wl,-rpath,"$(pwd)/$build" \
  "$blas" -Wl,-rpath,"$(dirname "$blas")"
for rows in ${*:-1 8 16 32}; do
  OMP_NUM_THREADS=${THREADS:-2} "$build/decode_matmul" "$rows"
done
