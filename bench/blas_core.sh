# bench/blas_core.sh, sourced by the benchmark scripts: builds remax (outside any timing) and
# exports OPENBLAS_CORETYPE for both sides of a benchmark: the kernel set remax runs with when
# left to choose (OpenBLAS's own choice, or where OpenBLAS did not recognise the CPU and fell
# back to its SSE3 kernels, the set the CPU supports; engine/cpu/blas.c), or
# $OPENBLAS_CORETYPE_BENCH. The peer then runs OpenBLAS's best kernels too.
core=$(env -u OPENBLAS_CORETYPE ./remax version | sed -n 's/.*OpenBLAS kernels: \([A-Za-z0-9]*\).*/\1/p')
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE_BENCH:-$core}"
