#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU window. One run of under 10 minutes on a lent GPU machine (CUDA 13,
# CMake, a C compiler, PyTorch and transformers; no network, no LuaJIT, OpenBLAS, PCRE2 or
# lua-cjson) that gives the most information a short window can: a preflight of the machine and a
# one-kernel smoke test; remax's GPU targets built; every case of every tests/gpu/test_*.c in its
# own process, each printing its error and worst element, every tests/gpu/test_*.sh or .lua (the
# model step, the loop), and the Lua specs' device tests (busted --filter=cuda on the specs that
# mention it); compute-sanitizer memcheck, racecheck and synccheck on small cases;
# every bench/gpu_*.sh benchmark (generation, the training step, a whole ReMax step; their shared
# preamble bench/gpu_common.sh aside); all behind one deadline: what would run past it is skipped and
# named. The CPU suite is not run here (CI runs it). docs/gpu.md ("Running on a GPU") is the procedure.
#
#   here, once, on Debian 12 with network:  sh tests/gpu/prepare.sh          (fills .debs/)
#   on the GPU machine:                     bash tests/gpu/run.sh            (carry .debs/)
#   here, without a GPU:                    bash tests/gpu/run.sh --dry-run  (the same logic)
#
# Files, at most 8 under $OUT (default gpu-out/): run.log (everything printed), summary.json
# (every step and case with its status, seconds and detail; the benchmarks' JSON lines; rewritten
# after each step, so a killed run still leaves one), bench.jsonl, logs.tar.gz (every log).
# A benchmark bench/gpu_NAME.sh gets a share of the time left in proportion to the seconds its
# "# window-seconds: N" line asks for, and the deadline of its share as RX_GPU_DEADLINE.
#
# Environment (defaults in brackets):
#   DEADLINE [540]       seconds from the start after which nothing new starts
#   CUDA_ARCH [90]       CMAKE_CUDA_ARCHITECTURES and the smoke test's -arch (H100/H200)
#   JOBS [all cores]     build parallelism
#   CASE_TIMEOUT [120]   seconds for one C test case; SCRIPT_TIMEOUT [300] for a test_*.sh or .lua
#   MEMCHECK_BUDGET [75], RACECHECK_BUDGET [45], SYNCCHECK_BUDGET [30]   seconds per sanitizer tool
#   MEMCHECK_CASES ["*"], RACECHECK_CASES, SYNCCHECK_CASES ["*attention* *logprob* *rmsnorm* *adamw*"]
#                        which cases ("test:case" globs, in order) each sanitizer tool runs
#   SKIP [""]            phases to leave out: any of smoke build tests sanitize bench
#   CUDA_MODE            RX_CUDA for CMake (ON; without a GPU, emulate: the CUDA sources run on
#                        the CPU through engine/cuda/emu)
#   BUILD [build-gpu], WORK [/tmp/remax-gpu-window], RX_PREFIX [/tmp/remax-prefix]
#   RX_USE_DEBS=1        unpack .debs/ even where the system has the packages
#   COMMIT               the commit under test, for the log and summary (where there is no .git)
#   PYTHON [python3]     the Python that has PyTorch and transformers (benchmarks)
#   BUSTED_FILTER [cuda] the Lua specs' tests to run: those whose names match (busted --filter)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
root=$PWD

dry=${DRY_RUN:-0}
for a in "$@"; do
  case $a in
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$a' (known: --dry-run, --help)" >&2; exit 2 ;;
  esac
done

out=${OUT:-$root/gpu-out}
work=${WORK:-/tmp/remax-gpu-window}
logs=$work/logs
bdir=${BUILD:-$root/build-gpu}
case $bdir in /*) ;; *) bdir=$root/$bdir ;; esac
prefix=${RX_PREFIX:-/tmp/remax-prefix}
arch=${CUDA_ARCH:-90}
jobs=${JOBS:-$(nproc)}
case_timeout=${CASE_TIMEOUT:-120}
skip_phases=" ${SKIP:-} "
python=${PYTHON:-python3}
A=x86_64-linux-gnu

case $work in /|/tmp|"$root"|"$HOME") echo "run.sh: WORK=$work would be emptied; name a folder of its own" >&2; exit 2 ;; esac
rm -rf "$work"
mkdir -p "$logs/cases" "$logs/sanitize" "$logs/bench" "$out" || exit 2
rm -f "$out/run.log" "$out/summary.json" "$out/bench.jsonl" "$out/logs.tar.gz"
exec > >(tee "$out/run.log") 2>&1
tee_pid=$!

t_start=$EPOCHSECONDS
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
deadline=$((t_start + ${DEADLINE:-540}))
# The device tool copies the working tree without .git: the caller names the commit (COMMIT=...).
if [ -n "${COMMIT:-}" ]; then commit=$COMMIT
elif commit=$(git rev-parse --short HEAD 2>/dev/null); then git diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted"
else commit="unknown (no .git here: set COMMIT)"; fi

left() { echo $((deadline - EPOCHSECONDS)); }
err_pat='(^|[^[:alpha:]])(error|Error|ERROR)( [0-9]+)?:|undefined reference|fatal|CMake Error'   # a compiler's or linker's error line
phase() { printf '\n== %s (%d s in, %d s left)\n' "$1" $((EPOCHSECONDS - t_start)) "$(left)"; }
have() { command -v "$1" >/dev/null 2>&1; }
skipped_phase() { [[ $skip_phases == *" $1 "* ]]; }
tenths_since() { # MICROSECONDS -> seconds since then, one decimal
  local d=$(( ${EPOCHREALTIME/./} - $1 ))
  printf '%d.%d' $((d / 1000000)) $((d / 100000 % 10))
}

# ---- results: one TSV line per step or case, turned into summary.json after each ------------
results=$work/results.tsv
bench_jsonl=$work/bench.jsonl
: >"$results"
: >"$bench_jsonl"
npass=0 nfail=0 nskip=0

json_esc() {
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/ }; s=${s//$'\n'/ }; s=${s//$'\r'/}
  printf '%s' "$s"
}

write_summary() {
  local f=$work/summary.json first=1 kind name status secs detail line
  {
    printf '{"script":"tests/gpu/run.sh","commit":"%s","dry_run":%s,"started":"%s","seconds":%d,' \
      "$(json_esc "$commit")" "$([ "$dry" = 1 ] && echo true || echo false)" "$started" $((EPOCHSECONDS - t_start))
    printf '"deadline_s":%d,"passed":%d,"failed":%d,"skipped":%d,"results":[' \
      $((deadline - t_start)) "$npass" "$nfail" "$nskip"
    while IFS=$'\t' read -r kind name status secs detail; do
      [ "$first" = 1 ] || printf ','
      first=0
      printf '{"kind":"%s","name":"%s","status":"%s","seconds":%s,"detail":"%s"}' "$(json_esc "$kind")" \
        "$(json_esc "$name")" "$status" "${secs:-0}" "$(json_esc "$detail")"
    done <"$results"
    printf '],"bench":['
    first=1
    while IFS= read -r line; do
      [ "$first" = 1 ] || printf ','
      first=0
      printf '%s' "$line"
    done <"$bench_jsonl"
    printf ']}\n'
  } >"$f" && cp "$f" "$out/summary.json"
}

record() { # KIND NAME STATUS(pass|fail|skipped|info) SECONDS DETAIL
  local detail
  detail=$(printf '%s' "${5:-}" | tr -d '\000-\010\013-\037' | tr '\t\n' '  ' | cut -c1-600)
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-0}" "$detail" >>"$results"
  case $3 in pass) npass=$((npass + 1)) ;; fail) nfail=$((nfail + 1)) ;; skipped) nskip=$((nskip + 1)) ;; esac
  write_summary
}

skip() { # KIND NAME WHY
  printf 'SKIP %s: %s\n' "$2" "$3"
  record "$1" "$2" skipped 0 "$3"
}

# run_capped LOG CAP CMD...: CMD with a timeout of CAP seconds or the time left before the
# deadline, whichever is less; its output to LOG (and to the screen too when show=1). Sets rc
# (124 or 137: timed out) and secs.
run_capped() {
  local log=$1 cap=$2 l t0
  shift 2
  l=$(( $(left) - 2 ))
  (( cap > l )) && cap=$l
  if (( cap < 1 )); then rc=124; secs=0.0; echo "(no time left before the deadline)" >"$log"; return; fi
  t0=${EPOCHREALTIME/./}
  if [ "${show:-0}" = 1 ]; then
    timeout -k 5 "$cap" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  else
    timeout -k 5 "$cap" "$@" >"$log" 2>&1
    rc=$?
  fi
  secs=$(tenths_since "$t0")
}

finish() {
  phase "summary"
  awk -F'\t' '$3 == "fail" { printf "  FAIL %-9s %s: %s\n", $1, $2, substr($5, 1, 160) }' "$results"
  awk -F'\t' '$3 == "skipped" { printf "  SKIP %-9s %s: %s\n", $1, $2, substr($5, 1, 160) }' "$results"
  if [ -s "$work/bench_table.txt" ]; then echo "benchmarks:"; cat "$work/bench_table.txt"; fi
  write_summary
  cp "$bench_jsonl" "$out/bench.jsonl"
  cp "$results" "$logs/results.tsv"
  tar -czf "$out/logs.tar.gz" -C "$work" logs 2>/dev/null || echo "logs.tar.gz: tar failed"
  echo "files in $out:" "$out"/*
  echo "done in $((EPOCHSECONDS - t_start)) s$([ "$dry" = 1 ] && echo " (dry run: no GPU; device steps skip)")"
  echo "$npass passed, $nfail failed, $nskip skipped"
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null
  [ "$nfail" = 0 ]
  exit
}

echo "remax GPU window: commit $commit, $(date -u), deadline $((deadline - t_start)) s$([ "$dry" = 1 ] && echo ", dry run")"

# ---- preflight: what this machine is, before anything is built -------------------------------
phase "preflight"
info() { printf '  %-16s %s\n' "$1:" "$2"; record preflight "$1" info 0 "$2"; }
have nvcc || export PATH="$PATH:/usr/local/cuda/bin"
info kernel "$(uname -srm)"
info os "$( (. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}") || echo unknown)"
info host "$(nproc) cores, $(awk '/^MemTotal:/ {printf "%.0f GiB memory", $2 / 1048576}' /proc/meminfo), $(df -h "$root" | awk 'NR == 2 {print $4 " free on disk"}')"
gpu_present=0
if have nvidia-smi && gpus=$(timeout 30 nvidia-smi -L 2>&1) && [ -n "$gpus" ]; then
  gpu_present=1
  info gpu "$gpus"
  q=name,driver_version,memory.total,memory.used,compute_cap,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,mig.mode.current
  state=$(timeout 30 nvidia-smi --query-gpu="$q" --format=csv 2>&1) ||   # an older driver lacks a field
    state=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1)
  info gpu_state "$(tr '\n' ';' <<<"$state")"
  info driver "$(timeout 30 nvidia-smi 2>/dev/null | grep -o 'Driver Version: [0-9.]*.*CUDA Version: [0-9.]*' | tr -s ' ')"
elif [ -e /dev/nvidia0 ]; then
  gpu_present=1
  info gpu "/dev/nvidia0 exists, but nvidia-smi does not answer: ${gpus:-not on the PATH}"
else
  info gpu "none: $(have nvidia-smi && echo "nvidia-smi -L: ${gpus:-nothing}" || echo "no nvidia-smi on the PATH, no /dev/nvidia0")"
fi
[ -e /proc/driver/nvidia/version ] && info kernel_module "$(head -1 /proc/driver/nvidia/version | tr -s ' ')"
cuda_home=
if have nvcc; then
  cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  info nvcc "$(command -v nvcc): $(nvcc --version | grep -o 'release [0-9.]*, V[0-9.]*')"
else
  info nvcc "not found (PATH and /usr/local/cuda/bin)"
fi
info cmake "$(cmake --version 2>/dev/null | head -1 || echo 'not found')"
info ninja "$(ninja --version 2>/dev/null || echo 'not found: the build uses make')"
info cc "$(cc --version 2>/dev/null | head -1 || echo 'not found')"
if printf 'int main(void){return 0;}\n' | cc -fopenmp -x c - -o "$work/omp_probe" >/dev/null 2>&1; then
  info openmp "cc -fopenmp links"
else
  info openmp "cc -fopenmp does not link: the build needs libgomp (gcc's OpenMP runtime)"
fi
libs=
[ -n "$cuda_home" ] && libs=$(ls "$cuda_home"/lib64/libcublas.so* "$cuda_home"/targets/*/lib/libcublas.so* 2>/dev/null | head -2 | tr '\n' ' ')
info cublas "${libs:-not in the toolkit folder}$(ldconfig -p 2>/dev/null | grep -m1 -o 'libcublas.so[^ ]* .*' | sed 's/^/; ldconfig: /')"
nccl=$(timeout 30 find ${cuda_home:+"$cuda_home"} /usr/lib/$A /usr/local /opt -maxdepth 9 \( -name 'libnccl.so*' -o -name nccl.h \) 2>/dev/null | head -4 | tr '\n' ' ')
info nccl "${nccl:-not found (the MPI backend builds without NCCL)}"
sanitizer=$(command -v compute-sanitizer 2>/dev/null ||
  ls ${cuda_home:+"$cuda_home"/bin/compute-sanitizer "$cuda_home"/compute-sanitizer/compute-sanitizer} /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$sanitizer" ]; then
  info sanitizer "$sanitizer: $("$sanitizer" --version 2>/dev/null | grep -o 'Version [0-9.]*' | head -1)"
else
  info sanitizer "not found"
fi
pyinfo=$(timeout 120 "$python" -c '
import torch
s = "torch %s (CUDA %s, device: %s)" % (torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
try:
    import transformers
    s += ", transformers " + transformers.__version__
except Exception as e:
    s += ", no transformers (%s)" % e
print(s)' 2>&1 | tail -1)
info python "$python: $pyinfo"

# sanitizer_errors LOG: the errors compute-sanitizer counted ("ERROR SUMMARY: N errors", or
# racecheck's "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"); empty when the log
# has no summary (the tool or the program stopped first).
sanitizer_errors() {
  sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p; s/.*RACECHECK SUMMARY: .*(\([0-9]*\) error.*/\1/p' "$1" | tail -1
}

# ---- smoke: one kernel, before remax is built; then whether compute-sanitizer works here -----
sanitizer_ok=0   # 1 when at least one tool works; tool_why[TOOL] says why a tool does not
sanitizer_why="compute-sanitizer not found"
declare -A tool_why=()
sanitizer_opts=(--error-exitcode 9 --print-limit 12)   # the probe uses them too: an option it refuses shows there
if skipped_phase smoke; then
  skip smoke smoke "SKIP=smoke"
else
  phase "smoke test (tests/gpu/smoke.cu)"
  if ! have nvcc; then
    skip smoke smoke "no nvcc"
  else
    run_capped "$logs/smoke_build.log" 180 nvcc -arch="sm_$arch" -o "$work/smoke" tests/gpu/smoke.cu
    if [ "$rc" != 0 ]; then
      cat "$logs/smoke_build.log"
      echo "FAIL smoke: nvcc -arch=sm_$arch failed (exit $rc)"
      record smoke smoke-build fail "$secs" "nvcc -arch=sm_$arch: $(grep -m1 -E "$err_pat" "$logs/smoke_build.log")"
    elif [ "$gpu_present" = 0 ]; then
      echo "smoke: compiled for sm_$arch; not run (no GPU here)"
      record smoke smoke-build pass "$secs" "compiled for sm_$arch"
      skip smoke smoke "no GPU here"
      sanitizer_why="no GPU here"
    else
      record smoke smoke-build pass "$secs" "compiled for sm_$arch"
      run_capped "$logs/smoke.log" 60 "$work/smoke"
      cat "$logs/smoke.log"
      if [ "$rc" = 0 ]; then record smoke smoke pass "$secs" "$(tr '\n' ' ' <"$logs/smoke.log")"
      else record smoke smoke fail "$secs" "exit $rc: $(tr '\n' ' ' <"$logs/smoke.log")"; fi
      if [ -n "$sanitizer" ] && [ "$rc" = 0 ]; then
        # each tool on the smoke test: the ones that run it cleanly are used on the remax cases
        for tool in memcheck racecheck synccheck; do
          run_capped "$logs/sanitizer_probe.$tool.log" 60 "$sanitizer" --tool "$tool" "${sanitizer_opts[@]}" "$work/smoke"
          if [ "$rc" = 0 ] && [ "$(sanitizer_errors "$logs/sanitizer_probe.$tool.log")" = 0 ]; then
            sanitizer_ok=1
            info "sanitizer_$tool" "works: ran the smoke test with 0 errors in $secs s"
          else
            tool_why[$tool]="compute-sanitizer --tool $tool does not work here (exit $rc): $(grep -m1 -i -E 'error|not supported|fail' "$logs/sanitizer_probe.$tool.log")"
            sanitizer_why=${tool_why[$tool]}
            info "sanitizer_$tool" "no: ${tool_why[$tool]}"
          fi
        done
      elif [ -n "$sanitizer" ]; then
        sanitizer_why="the smoke test failed, so compute-sanitizer was not tried"
      fi
    fi
  fi
fi

# ---- dependencies: the .debs of tests/gpu/prepare.sh in a private prefix ---------------------
phase "dependencies"
cmake_deps=()
rx_ld=
rx_cpath=
rx_lpath=
pkgconf_ld=
if [ "${RX_USE_DEBS:-0}" != 1 ] && pkg-config --exists luajit libpcre2-8 2>/dev/null &&
   [ -e /usr/lib/$A/openblas-openmp/libopenblas.so ] && [ -e /usr/lib/$A/lua/5.1/cjson.so ]; then
  echo "using the system's LuaJIT, OpenBLAS, PCRE2 and lua-cjson"
elif ! ls .debs/*.deb >/dev/null 2>&1; then
  echo "no .debs/ here: run 'sh tests/gpu/prepare.sh' on Debian 12 and carry .debs (docs/gpu.md, Running on a GPU)"
  record deps debs fail 0 "no .debs/ (tests/gpu/prepare.sh)"
else
  rm -rf "$prefix" && mkdir -p "$prefix"
  n=0
  for f in .debs/*.deb; do
    dpkg -x "$f" "$prefix" || { echo "dpkg -x $f failed"; record deps "$f" fail 0 "dpkg -x failed"; }
    n=$((n + 1))
  done
  # Everything links against the prefix; at run time the system's own copy of a library wins
  # (same soname), and $prefix/runtime holds only what the system lacks, besides OpenBLAS.
  mkdir -p "$prefix/runtime"
  kept=
  system_libs=$(ldconfig -p 2>/dev/null)
  for so in "$prefix/usr/lib/$A"/*.so.[0-9]*; do
    [ -e "$so" ] || continue
    base=$(basename "$so")
    if ! grep -q "^[[:space:]]*${base%%.so.*}\.so\.[0-9]* " <<<"$system_libs"; then
      ln -sf "$so" "$prefix/runtime/$base"
      kept="$kept $base"
    fi
  done
  echo "unpacked $n packages into $prefix; at run time from there: OpenBLAS (OpenMP)${kept:+,$kept}"
  export PKG_CONFIG_LIBDIR="$prefix/usr/lib/$A/pkgconfig:$prefix/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$prefix"
  rx_ld="$prefix/runtime:$prefix/usr/lib/$A/openblas-openmp"
  rx_cpath="$prefix/usr/lib/$A/lua/5.1/?.so;;"
  rx_lpath="$prefix/usr/share/lua/5.1/?.lua;$prefix/usr/share/lua/5.1/?/init.lua;;"
  cmake_deps=(-DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf"
              -DOPENBLAS_LIB="$prefix/usr/lib/$A/openblas-openmp/libopenblas.so"
              -DCBLAS_INCLUDE_DIR="$prefix/usr/include/$A/openblas-openmp")
  pkgconf_ld="$prefix/usr/lib/$A"
  record deps debs pass 0 "$n packages unpacked into $prefix"
fi
# Every remax process (tests, the host program) runs with these; Python does not.
rx_env=(env)
[ -n "$rx_ld" ] && rx_env+=("LD_LIBRARY_PATH=$rx_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
[ -n "$rx_cpath" ] && rx_env+=("LUA_CPATH=$rx_cpath")
[ -n "$rx_lpath" ] && rx_env+=("LUA_PATH=$rx_lpath")
luajit_bin=$(command -v luajit || echo "$prefix/usr/bin/luajit")
busted_bin=$(command -v busted || echo "$prefix/usr/bin/busted")
echo "Lua specs' device tests: $( [ -x "$luajit_bin" ] && [ -f "$busted_bin" ] && echo "busted $busted_bin under $luajit_bin" || echo "no busted or LuaJIT here")"

# ---- build: remax, its host program and the gpu_* targets only; warnings never fatal ---------
built=0
broken=()        # gpu_* programs that did not compile
gpu_targets=()   # the gpu_* targets of this build
if skipped_phase build; then
  skip build build "SKIP=build"
  [ -x "$bdir/remax" ] && built=1
else
  phase "build"
  mode=ON
  if [ "$gpu_present" = 0 ]; then
    if grep -q -i emulate CMakeLists.txt; then mode=emulate; elif ! have nvcc; then mode=OFF; fi
  fi
  mode=${CUDA_MODE:-$mode}
  gen=()
  if have ninja; then
    gen=(-G Ninja)
    [ -f "$bdir/CMakeCache.txt" ] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$bdir/CMakeCache.txt" && rm -rf "$bdir"
  fi
  # A compiler launcher that drops -Werror flags: on the GPU machine a warning must not stop the build.
  cat >"$work/nowerror" <<'EOF'
#!/bin/sh
for a do
  shift
  case $a in
    -Werror|-Werror=*|--Werror|--Werror=*) continue ;;
    -Xcompiler=*-Werror*) a=$(printf '%s' "$a" | sed 's/,*-Werror[^,]*//g'); [ "$a" = -Xcompiler= ] && continue ;;
  esac
  set -- "$@" "$a"
done
exec "$@"
EOF
  chmod +x "$work/nowerror"
  echo "cmake ${gen[*]} -DRX_CUDA=$mode -DCMAKE_CUDA_ARCHITECTURES=$arch (warnings not fatal), $jobs jobs, into $bdir"
  run_capped "$logs/configure.log" 300 env ${pkgconf_ld:+LD_LIBRARY_PATH="$pkgconf_ld"} \
    cmake -S . -B "$bdir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRX_CUDA="$mode" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DCMAKE_C_COMPILER_LAUNCHER="$work/nowerror" -DCMAKE_CUDA_COMPILER_LAUNCHER="$work/nowerror" \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$work/nowerror" "${cmake_deps[@]}"
  grep -E "^-- remax:|CMake Error|CMake Warning" "$logs/configure.log"
  if [ "$rc" != 0 ]; then
    tail -30 "$logs/configure.log"
    record build configure fail "$secs" "cmake exit $rc: $(grep -m1 -A2 'CMake Error' "$logs/configure.log")"
  else
    record build configure pass "$secs" "RX_CUDA=$mode; $(grep -o 'remax: [^(]*' "$logs/configure.log" | head -1)"
    # the gpu_* targets CMakeLists.txt defines (tests/gpu/test_*.c, the GPU micro-benchmarks)
    if [ -f "$bdir/build.ninja" ]; then
      mapfile -t gpu_targets < <(ninja -C "$bdir" -t targets all 2>/dev/null | sed -n 's/^\(gpu_[A-Za-z0-9_]*\): .*/\1/p' | sort -u)
    else
      mapfile -t gpu_targets < <(cmake --build "$bdir" --target help 2>/dev/null | sed -n 's/^\.\.\. \(gpu_[A-Za-z0-9_]*\).*/\1/p' | sort -u)
    fi
    echo "targets: remax remax_host ${gpu_targets[*]}"
    keep_going=(-- -k 0)   # every compile error in one window, not the first
    [ -f "$bdir/build.ninja" ] || keep_going=(-- -k)
    # the library and host program first (nothing runs without them), then the gpu_* programs,
    # so that one test that does not compile leaves the others to run
    run_capped "$logs/build.log" $(( $(left) - 30 )) cmake --build "$bdir" -j "$jobs" --target remax remax_host "${keep_going[@]}"
    if [ "$rc" = 0 ] && [ "${#gpu_targets[@]}" -gt 0 ]; then
      lib_secs=$secs
      run_capped "$logs/build_gpu.log" $(( $(left) - 30 )) cmake --build "$bdir" -j "$jobs" --target "${gpu_targets[@]}" "${keep_going[@]}"
      secs=$(awk -v a="$lib_secs" -v b="$secs" 'BEGIN { printf "%.1f", a + b }')
      cat "$logs/build_gpu.log" >>"$logs/build.log"
      if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ]; then   # which of them failed
        for t in "${gpu_targets[@]}"; do
          if ! cmake --build "$bdir" --target "$t" >"$logs/build_$t.log" 2>&1; then
            broken+=("$t")
            grep -E "$err_pat" "$logs/build_$t.log" | head -20
            echo "FAIL build $t"
            record build "$t" fail 0 "$(grep -m3 -E "$err_pat" "$logs/build_$t.log")"
          fi
        done
        rc=0
      fi
    fi
    warnings=$(grep -c -i 'warning' "$logs/build.log")
    if [ "$rc" = 0 ]; then
      built=1
      echo "built in $secs s, $warnings warning lines${broken[*]:+; not built: ${broken[*]}}"
      grep -i 'warning' "$logs/build.log" | sort -u | head -10
      record build build pass "$secs" "$warnings warning lines${broken[*]:+; not built: ${broken[*]}}"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      skip build build "the build did not finish before the deadline ($secs s; DEADLINE is $((deadline - t_start)) s)"
    else
      grep -E "$err_pat" "$logs/build.log" | head -60
      echo "FAIL build (exit $rc)"
      record build build fail "$secs" "exit $rc: $(grep -m3 -E "$err_pat" "$logs/build.log")"
    fi
  fi
fi

# A remax host program that finds the unpacked libraries, for the tests and benchmarks, and a
# command prefix that does the same for any program (the benchmarks' own binaries).
mkdir -p "$work/bin"
printf '#!/usr/bin/env bash\nexec %s "%s/remax" "$@"\n' "$(printf '%q ' "${rx_env[@]}")" "$bdir" >"$work/bin/remax"
printf '#!/usr/bin/env bash\nexec %s "$@"\n' "$(printf '%q ' "${rx_env[@]}")" >"$work/bin/rx-env"
chmod +x "$work/bin/remax" "$work/bin/rx-env"

# ---- the GPU tests: every case in its own process --------------------------------------------
# show_case LOG: the lines of a case's log worth reading in the window's log.
show_case() {
  grep -E '^  compare |check failed|skipped|^FAIL |error|Error|fault|RX_GPU_CASE|timed out|^Failure|^Error|success' "$1" | head -24 | cut -c1-240 | sed 's/^/    /'
}
# worst_of LOG: the comparison with the largest normalised error.
worst_of() {
  awk 'match($0, /nrmse [^,]*/) { v = substr($0, RSTART + 6, RLENGTH - 6); x = (v ~ /inf|nan/) ? 1e308 : v + 0
       if (!seen || x > best) { best = x; line = $0; seen = 1 } }
       END { if (seen) { sub(/^ +compare /, "", line); print "worst: " line } }' "$1"
}
# The test cases: "TEST CASE" lines (CASE "-" for a test run whole).
cases=()
declare -A case_status=()   # test:case -> pass/fail/skipped, for the sanitizer phase
list_cases() {
  local src t c listed programs=()
  # the test programs this build defines (tests/gpu/test_*.c; test_*.cu too under the emulator)
  for t in "${gpu_targets[@]}"; do [[ $t == gpu_test_* ]] && programs+=("$t"); done
  if [ "${#programs[@]}" = 0 ]; then   # SKIP=build: the programs already in the build folder
    for src in "$bdir"/gpu_test_*; do [ -x "$src" ] && programs+=("$(basename "$src")"); done
  fi
  for t in "${programs[@]}"; do
    if [[ " ${broken[*]} " == *" $t "* ]]; then skip case "$t" "did not compile (see build)"; continue; fi
    if [ ! -x "$bdir/$t" ]; then skip case "$t" "not built"; continue; fi
    listed=$("${rx_env[@]}" RX_GPU_LIST=1 timeout 60 "$bdir/$t" 2>/dev/null | sed -n 's/^case //p' | awk '!seen[$0]++')
    if [ -z "$listed" ]; then cases+=("$t -"); continue; fi   # a program without gpu.h's RUN: run whole
    while IFS= read -r c; do cases+=("$t $c"); done <<<"$listed"
  done
  for src in tests/gpu/test_*.sh tests/gpu/test_*.lua; do
    [ -f "$src" ] && cases+=("$(basename "$src") -")
  done
  # the device tests of the Lua specs: those named with BUSTED_FILTER, in the specs that mention it
  local filter=${BUSTED_FILTER:-cuda}
  for src in $(grep -l -i -e "$filter" tests/lua/*_spec.lua 2>/dev/null); do
    if [ -x "$luajit_bin" ] && [ -f "$busted_bin" ]; then cases+=("$(basename "$src") -")
    else skip case "$(basename "$src")" "no busted here (tests/gpu/prepare.sh brings it)"; fi
  done
}
case_argv() { # TEST CASE: sets case_cmd (the command that runs it), case_env and id
  case $1 in
    *_spec.lua) case_cmd=("$luajit_bin" "$busted_bin" --ignore-lua --output=plainTerminal
                          --filter="${BUSTED_FILTER:-cuda}" "tests/lua/$1") ;;
    *.sh) case_cmd=(bash "tests/gpu/$1") ;;
    *.lua) case_cmd=("$work/bin/remax" run "tests/gpu/$1") ;;
    *) case_cmd=("$bdir/$1") ;;
  esac
  if [ "$2" = - ]; then id=$1; case_env=(); else id=$1:$2; case_env=("RX_GPU_CASE=$2"); fi
  [[ $1 == *_spec.lua ]] && case_env+=("REMAX_LIB=$bdir/libremax.so")
}

if skipped_phase tests; then
  skip tests tests "SKIP=tests"
elif [ "$built" = 0 ]; then
  skip tests tests "remax was not built"
else
  phase "GPU tests, one process per case (REMAX_CUDA_SYNC=1: a fault is reported by the op that made it)"
  list_cases
  echo "${#cases[@]} cases: $(printf '%s\n' "${cases[@]}" | awk '{print $1}' | uniq -c | awk '{printf "%s %s; ", $2, $1}')"
  for tc in "${cases[@]}"; do
    read -r test c <<<"$tc"
    case_argv "$test" "$c"
    if (( $(left) < 10 )); then skip case "$id" "deadline"; continue; fi
    log=$logs/cases/${id//[:\/]/.}.log
    cap=$case_timeout
    [[ $test == gpu_* ]] || cap=${SCRIPT_TIMEOUT:-300}
    run_capped "$log" "$cap" "${rx_env[@]}" REMAX_CUDA_SYNC=1 RX_GPU_REPORT=1 REMAX_BIN="$work/bin/remax" \
      "${case_env[@]}" "${case_cmd[@]}"
    worst=$(worst_of "$log")
    case $rc in
      0) st=pass ;;
      77) st=skipped ;;
      124|137) st=fail; worst="timed out after $secs s; $worst" ;;
      *) st=fail; (( rc > 128 )) && worst="killed by SIG$(kill -l $((rc - 128)) 2>/dev/null); $worst" ;;
    esac
    if [[ $test == *_spec.lua ]]; then   # busted: what ran, by its own count
      counts=$(grep -o -E '[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' "$log" | tail -1)
      worst=${counts:-"no busted summary"}
      if [ "$st" = pass ] && [[ $counts == "0 success"* ]]; then st=skipped worst="no test named '${BUSTED_FILTER:-cuda}' ran: $counts"; fi
    fi
    case_status[$id]=$st
    printf '%-4s %s (%s s) %s\n' "$(echo "$st" | tr '[:lower:]' '[:upper:]' | cut -c1-4)" "$id" "$secs" "$worst"
    show_case "$log"
    [ "$st" = fail ] && ! grep -q -E 'check failed|error' "$log" && tail -8 "$log" | sed 's/^/    | /'
    detail="$worst"
    [ "$st" != pass ] && detail="exit $rc; $(grep -m2 -E 'check failed|skipped|error' "$log" | tr '\n' ' ') $worst"
    record case "$id" "$st" "$secs" "$detail"
  done
fi

# ---- compute-sanitizer on small cases ---------------------------------------------------------
sanitize() { # TOOL BUDGET PATTERNS
  local tool=$1 budget=$2 patterns=$3 until tc test c pat errs log st
  until=$((EPOCHSECONDS + budget))
  (( until > deadline )) && until=$deadline
  local picked=()
  local pats
  read -r -a pats <<<"$patterns"   # words, not file names: "*attention*" must not glob
  for pat in "${pats[@]}"; do
    for tc in "${cases[@]}"; do
      read -r test c <<<"$tc"
      [[ $test == gpu_* ]] || continue
      case_argv "$test" "$c"
      # shellcheck disable=SC2053  # the pattern is a glob on purpose
      [[ $id == $pat ]] || continue
      [[ " ${picked[*]} " == *" $id "* ]] || picked+=("$id")
    done
  done
  if [ -n "${tool_why[$tool]:-}" ]; then
    echo "$tool: not run: ${tool_why[$tool]}"
    skip sanitize "$tool" "${tool_why[$tool]}"
    return
  fi
  echo "$tool: ${#picked[@]} cases, at most $budget s"
  for id in "${picked[@]}"; do
    test=${id%%:*} c=${id#*:}
    case_argv "$test" "$c"
    if (( until - EPOCHSECONDS < 15 )); then skip sanitize "$tool $id" "the $tool budget ($budget s) is spent"; continue; fi
    log=$logs/sanitize/$tool.${id//[:\/]/.}.log
    run_capped "$log" $((until - EPOCHSECONDS)) "${rx_env[@]}" REMAX_CUDA_ALLOC=plain "${case_env[@]}" \
      "$sanitizer" --tool "$tool" "${sanitizer_opts[@]}" "${case_cmd[@]}"
    errs=$(sanitizer_errors "$log")
    # a finding of the tool fails; a case that fails without the tool too is not counted twice
    if [ "${errs:-0}" != 0 ]; then st=fail why="$errs $tool errors, exit $rc"
    elif [ "$rc" = 0 ] && [ -n "$errs" ]; then st=pass why="0 errors"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then st=skipped why="timed out after $secs s (the tool's budget or the deadline)"
    elif [ "$rc" = 77 ]; then st=skipped why="the case skips (exit 77)"
    elif [ "${case_status[$id]:-}" = fail ]; then st=skipped why="exit $rc, no $tool errors; the case fails without $tool too"
    else st=fail why="exit $rc under $tool$( [ -z "$errs" ] && echo ", no summary from the tool"), though the case passes without it"; fi
    printf '%-4s %s %s (%s s): %s\n' "$(echo "$st" | tr '[:lower:]' '[:upper:]' | cut -c1-4)" "$tool" "$id" "$secs" "$why"
    [ "$st" = fail ] && grep -E '^========= ' "$log" | grep -v -E 'SUMMARY|^========= *$' | head -16 | cut -c1-220 | sed 's/^/    /'
    record sanitize "$tool $id" "$st" "$secs" "$why$( [ "$st" = fail ] && echo ": $(grep -m3 -E '^========= +(Invalid|Race|Barrier|Program hit|Error|Warning|at )' "$log" | tr '\n' ' ')")"
  done
}

if skipped_phase sanitize; then
  skip sanitize sanitize "SKIP=sanitize"
elif [ "$built" = 0 ] || [ "${#cases[@]}" = 0 ]; then
  skip sanitize sanitize "no GPU test cases ran"
elif [ "$sanitizer_ok" = 0 ]; then
  echo "compute-sanitizer: not run: $sanitizer_why"
  skip sanitize sanitize "$sanitizer_why"
else
  phase "compute-sanitizer (REMAX_CUDA_ALLOC=plain: every tensor its own cudaMalloc)"
  small="*attention* *logprob* *rmsnorm* *adamw*"
  sanitize memcheck "${MEMCHECK_BUDGET:-75}" "${MEMCHECK_CASES:-*}"
  sanitize racecheck "${RACECHECK_BUDGET:-45}" "${RACECHECK_CASES:-$small}"
  sanitize synccheck "${SYNCCHECK_BUDGET:-30}" "${SYNCCHECK_CASES:-$small}"
fi

# ---- benchmarks: bench/gpu_*.sh, each with a fair share of the time left ---------------------
if skipped_phase bench; then
  skip bench bench "SKIP=bench"
else
  phase "benchmarks (bench/gpu_*.sh)"
  benches=()
  for b in bench/gpu_*.sh; do   # bench/gpu_common.sh is their shared preamble, not a benchmark
    [ -e "$b" ] && [ "$b" != bench/gpu_common.sh ] && benches+=("$b")
  done
  # Each gets the time left in proportion to what its "# window-seconds: N" line says it needs
  # (120 without one); what one leaves unused goes to those after it.
  need=()
  for b in "${benches[@]}"; do
    n=$(sed -n 's/^# window-seconds: *\([0-9]*\).*/\1/p' "$b" | head -1)
    need+=("${n:-120}")
  done
  for i in "${!benches[@]}"; do
    b=${benches[$i]}
    rest=0
    for n in "${need[@]:$i}"; do rest=$((rest + n)); done
    share=$(( ($(left) - 5) * ${need[$i]} / rest ))
    if (( share < 30 )); then skip bench "$b" "deadline ($share s would be its share)"; continue; fi
    echo "-- $b ($share s)"
    log=$logs/bench/$(basename "$b" .sh).log
    show=1 run_capped "$log" "$share" env RX_GPU_DEADLINE=$((EPOCHSECONDS + share - 5)) REMAX_BIN="$work/bin/remax" \
      RX_ENV="$work/bin/rx-env" REMAX_BUILD_DIR="$bdir" PYTHON="$python" DRY_RUN="$dry" bash "$b"
    grep -E '^\{.*\}$' "$log" >>"$bench_jsonl"
    grep -E '^\| ' "$log" >>"$work/bench_table.txt"
    if [ "$rc" = 0 ]; then record bench "$b" pass "$secs" "$(grep -c -E '^\{' "$log") result lines"
    else record bench "$b" fail "$secs" "exit $rc$( { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && echo ' (ran past its share)'): $(grep -v '^{' "$log" | tail -2 | tr '\n' ' ')"; fi
  done
fi

finish
