#!/bin/sh
# bench/llamacpp_decode.sh: remax's greedy batched decoding beside llama.cpp's, same random
# weights (remax's model and the GGUF remax exports of it), same threads, one run. Not a test.
# The peer is llama.cpp's own llama-batched-bench, built natively by bench/llamacpp_install.sh
# from the llama.cpp source llama-cpp-python's sdist carries (.cache/llama.cpp; cached in
# .cache/llamacpp-build). Arguments go to bench/llamacpp_decode.lua:
#   bench/llamacpp_decode.sh                                   # qwen0.5b, rows 1,8,16,32, f32 and bf16
#   THREADS=2 bench/llamacpp_decode.sh --shape small --rows 1,8 --dtypes f32
#   bench/llamacpp_decode.sh --peer none                       # remax alone: bf16 weights against f32
# Both sides use the same OPENBLAS_CORETYPE (bench/blas_core.sh; llama.cpp does not use OpenBLAS,
# it picks its own kernels for the CPU) and THREADS threads (default 2).
set -eu
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
case " $* " in
  *" --peer none "*) ;;
  *) REMAX_LLAMACPP_BATCHED=$(bench/llamacpp_install.sh); export REMAX_LLAMACPP_BATCHED ;;
esac
. bench/blas_core.sh   # builds first, outside the timing
exec env -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" ./remax run bench/llamacpp_decode.lua --threads "$threads" "$@"
