# bench/blas_core.sh, sourced by the benchmark scripts: builds remax (outside any timing) and
# exports OPENBLAS_CORETYPE for both sides of a benchmark: the kernel set remax runs with when
# left to choose (OpenBLAS's own choice, or where OpenBLAS did not recognise the CPU and fell
# back to its SSE3 kernels, the set the CPU supports; engine/cpu/blas.c), or
# $OPENBLAS_CORETYPE_BENCH. The peer then runs OpenBLAS's best kernels too.
# bench_c NAME [CC FLAGS...] then compiles bench/NAME.c against the build's libremax and OpenBLAS
# into $build/NAME (build: REMAX_BUILD [build]), for the benchmarks of single kernels.
core=$(env -u OPENBLAS_CORETYPE ./remax version | sed -n 's/.*OpenBLAS kernels: \([A-Za-z0-9]*\).*/\1/p')
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE_BENCH:-$core}"

build=${REMAX_BUILD:-build}
bench_c() { # NAME [CC FLAGS...]
  bench_c_name=$1
  shift
  bench_c_blas=$(sed -n 's/^OPENBLAS_LIB:FILEPATH=//p' "$build/CMakeCache.txt")
  bench_c_inc=$(sed -n 's/^CBLAS_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")
  cc -O2 "$@" -o "$build/$bench_c_name" "bench/$bench_c_name.c" -I"$bench_c_inc" -Iengine/cpu -Iengine/core -L"$build" -lremax \
    -Wl,-rpath,"$(pwd)/$build" "$bench_c_blas" -Wl,-rpath,"$(dirname "$bench_c_blas")"
}
