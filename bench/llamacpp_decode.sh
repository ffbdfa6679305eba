#!/bin/sh
# bench/llamacpp_decode.sh: remax's greedy batched decoding beside llama.cpp's, same random
# weights (remax's model and the GGUF remax exports of it), same threads, one run. Not a test.
# The peer is llama.cpp's own llama-batched-bench, built natively from the source node-llama-cpp
# ships (bench/llamacpp_install.sh --batched, cached; --peer prebuilt for the same tool on the
# package's prebuilt libraries, --peer node for node-llama-cpp's prebuilt
# per-sequence evaluation). Arguments go to bench/llamacpp_decode.lua:
#   bench/llamacpp_decode.sh                                   # qwen0.5b, rows 1,8,16,32, f32 and bf16
#   THREADS=2 bench/llamacpp_decode.sh --shape small --rows 1,8 --dtypes f32
# Both sides use the same OPENBLAS_CORETYPE (bench/blas_core.sh; llama.cpp does not use OpenBLAS,
# it picks its own kernels for the CPU) and THREADS threads (default 2).
set -eu
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
case " $* " in
  *" --peer node "* | *" --peer none "*) bench/llamacpp_install.sh ;;
  *" --peer prebuilt "*) bench/llamacpp_install.sh --batched-prebuilt >/dev/null ;;
  *) bench/llamacpp_install.sh --batched >/dev/null ;;
esac
. bench/blas_core.sh   # builds first, outside the timing
exec env -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" ./remax run bench/llamacpp_decode.lua --threads "$threads" "$@"
