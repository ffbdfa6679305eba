#!/bin/sh
# bench/decode_matmul.sh: one decode step's matmuls at the Qwen2.5-0.5B shape: remax's f32 decode
# kernel, remax with the weights stored in bf16, and OpenBLAS sgemm (kernels chosen by
# bench/blas_core.sh, as bench/generate.sh), in one run, 2 threads. Not a test.
#   bench/decode_matmul.sh [rows ...]        default: 1 8 16 32
set -eu
cd "$(dirname "$0")/.."
. bench/blas_core.sh   # builds first
bench_c decode_matmul
for rows in ${*:-1 8 16 32}; do
  OMP_NUM_THREADS=${THREADS:-2} "$build/decode_matmul" "$rows"
done
