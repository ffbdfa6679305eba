#!/bin/sh
# bench/train_step_gemm.sh: one training step's GEMMs, OpenBLAS sgemm (f32) beside oneDNN's bf16
# matmul (engine/cpu/dnnl.c), at the small and Qwen2.5-0.5B shapes of bench/train_step.sh, in one
# run, 2 threads (kernels chosen by bench/blas_core.sh). Not a test.
#   bench/train_step_gemm.sh [small|qwen0.5b ...]      REPS=1 for one step of each (default 3)
set -eu
cd "$(dirname "$0")/.."
. bench/blas_core.sh   # builds first
bench_c train_step_gemm -fopenmp
for shape in ${*:-small qwen0.5b}; do
  OMP_NUM_THREADS=${THREADS:-2} "$build/train_step_gemm" "$shape"
done
