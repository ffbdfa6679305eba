#!/usr/bin/env bash
# tests/gpu/run.sh: on a machine with an NVIDIA GPU and CUDA 12/13 but no network and none of
# remax's Debian build dependencies: build remax with CUDA, run every GPU test and the GPU
# micro-benchmarks (remax beside PyTorch, when python3 has torch, on the same GPU), and print
# "N passed, M failed" and the benchmark lines. Meant to finish in well under 8 minutes.
#
#   here, once, on Debian with network:   sh tests/gpu/prepare.sh        (fills .debs/)
#   on the GPU machine:                    bash tests/gpu/run.sh          (logs under $OUT, or gpu-out/)
#
# Environment: OUT (log folder), CUDA_ARCH (default 90: H100/H200), JOBS (default: all cores),
# RX_PREFIX (where the .debs are unpacked, default /tmp/remax-prefix).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
exec > >(tee "$out/gpu_run.log") 2>&1
start=$(date +%s)
arch=${CUDA_ARCH:-90}
jobs=${JOBS:-$(nproc)}
prefix=${RX_PREFIX:-/tmp/remax-prefix}
A=x86_64-linux-gnu

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"
command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
nvcc --version 2>&1 | tail -2
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

echo "== dependencies"
cmake_deps=()
if pkg-config --exists luajit 2>/dev/null && [ -e /usr/lib/$A/openblas-openmp/libopenblas.so ]; then
  echo "using the system's LuaJIT and OpenBLAS"
else
  ls .debs/*.deb >/dev/null 2>&1 || { echo "no .debs/: run tests/gpu/prepare.sh on a Debian machine first"; exit 2; }
  mkdir -p "$prefix"
  for f in .debs/*.deb; do dpkg -x "$f" "$prefix" || { echo "dpkg -x $f failed"; exit 2; }; done
  echo "unpacked $(ls .debs/*.deb | wc -l) packages into $prefix"
  # Only our .pc files (their paths are rebased onto the prefix); system libraries win at run time.
  export PKG_CONFIG_LIBDIR="$prefix/usr/lib/$A/pkgconfig:$prefix/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$prefix"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$prefix/usr/lib/$A:$prefix/usr/lib/$A/openblas-openmp"
  export PATH="$PATH:$prefix/usr/bin"
  cmake_deps=(-DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf"
              -DOPENBLAS_LIB="$prefix/usr/lib/$A/openblas-openmp/libopenblas.so"
              -DCBLAS_INCLUDE_DIR="$prefix/usr/include/$A/openblas-openmp")
fi

echo "== build (CUDA architectures $arch)"
bdir=$root/build-gpu
if ! cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DRX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
     "${cmake_deps[@]}" >"$out/configure.log" 2>&1; then
  cat "$out/configure.log"; echo "0 passed, 1 failed (configure)"; exit 1
fi
grep -E "remax: (CUDA|no CUDA)" "$out/configure.log"
if ! cmake --build "$bdir" -j "$jobs" >"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40; echo "0 passed, 1 failed (build)"; exit 1
fi
echo "built in $(( $(date +%s) - start )) s"

echo "== GPU tests (REMAX_CUDA_SYNC=1: a kernel fault is reported by the op that made it)"
passed=0; failed=0
for t in "$bdir"/gpu_test_*; do
  name=$(basename "$t")
  if REMAX_CUDA_SYNC=1 timeout 180 "$t" >"$out/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "ok   $name"
  else
    rc=$?; failed=$((failed + 1)); echo "FAIL $name (exit $rc)"
  fi
  grep -E "^(ok  |FAIL) |check failed|skipped|cases," "$out/$name.log" | head -60
done

echo "== CPU C tests (the reference side, on this machine)"
if timeout 150 ctest --test-dir "$bdir" -LE gpu -E test_tokenizer --output-on-failure >"$out/ctest_cpu.log" 2>&1; then
  passed=$((passed + 1)); echo "ok   cpu ctest"
else
  failed=$((failed + 1)); echo "FAIL cpu ctest"; tail -30 "$out/ctest_cpu.log"
fi

if command -v compute-sanitizer >/dev/null 2>&1; then
  echo "== compute-sanitizer memcheck on gpu_test_tensor"
  if timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$bdir/gpu_test_tensor" >"$out/memcheck.log" 2>&1; then
    passed=$((passed + 1)); echo "ok   memcheck"
  else
    rc=$?
    if [ $rc = 124 ]; then echo "memcheck: timed out (not counted)"
    else failed=$((failed + 1)); echo "FAIL memcheck (exit $rc)"; tail -20 "$out/memcheck.log"; fi
  fi
fi

echo "== benchmarks"
timeout 120 "$bdir/gpu_bench_ops" 2>&1 | tee "$out/bench_remax.txt"
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  timeout 120 python3 tests/gpu/bench_torch.py 2>&1 | tee "$out/bench_torch.txt"
else
  echo "bench: no python3 with CUDA PyTorch here; peer not measured"
fi

echo "== done in $(( $(date +%s) - start )) s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
