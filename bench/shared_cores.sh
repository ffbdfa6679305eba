#!/bin/sh
# bench/shared_cores.sh: remax's throughput when the cores are shared, under OpenMP wait
# policies, measured in one session. Not a test. For each of greedy decoding (bench/generate.lua)
# and a training step (bench/train_step.lua) on the small shape:
#   quiet             the machine as it is
#   busy              one competing busy process (sh -c 'while :; do :; done') beside it
#   2 ranks           mpirun -np 2 (no binding) running it in each rank at once (tokens/s summed)
# each under three settings:
#   today             libgomp's default spin (GOMP_SPINCOUNT=300000, ~3 ms) and every core per rank:
#                     what remax did before its own defaults (REMAX_THREADS_NOTE=off turns them off)
#   remax             the program's defaults (engine/host/main.c): GOMP_SPINCOUNT=10000 and threads_adapt (the engine drops to
#                     the cores other processes leave), each
#                     local rank its share of the cores
#   noadapt           the program's defaults with threads_adapt off (REMAX_THREADS_ADAPT=0)
#   spin10k           GOMP_SPINCOUNT=10000 (the default spin, set by hand)
#   passive           OMP_WAIT_POLICY=passive (no spin)
# and prints tokens/s with the ratio to the same setting's quiet run and to today's quiet run.
#   bench/shared_cores.sh       ROWS=8 NEW=256 BATCH=4 SEQ=128 STEPS=6 REPS=3 SETTINGS="today remax" bench/shared_cores.sh
# Each number is the median of REPS runs.
# The numbers in docs/benchmarks.md come from a machine other jobs also used: noisy.
set -eu
cd "$(dirname "$0")/.."
rows=${ROWS:-8}; new=${NEW:-256}; batch=${BATCH:-4}; seq=${SEQ:-128}; steps=${STEPS:-6}; reps=${REPS:-3}
./remax version >/dev/null   # build once, outside the timing
decode="bench/generate.lua --shape small --rows $rows --prompt 32 --new $new"
train="bench/train_step.lua --shape small --batch $batch --seq $seq --steps $steps"
setting_env() {
  case $1 in
    today) echo "REMAX_THREADS_NOTE=off REMAX_THREADS_ADAPT=0 GOMP_SPINCOUNT=300000" ;;
    noadapt) echo "REMAX_THREADS_ADAPT=0" ;;
    remax) echo "" ;;
    spin10k) echo "GOMP_SPINCOUNT=10000" ;;
    passive) echo "OMP_WAIT_POLICY=passive" ;;
  esac
}
tps() { sed -n 's/.*"tokens_per_s":\([0-9.e+-]*\).*/\1/p' | awk '{ s += $1 } END { printf "%.1f", s }'; }
one1() { # one1 SETTING BENCH: tokens/s of one run
  env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT $(setting_env "$1") ./build/remax run $2 | tps
}
one() { # one SETTING BENCH: the median tokens/s of REPS runs
  i=0; while [ $i -lt "$reps" ]; do one1 "$1" "$2"; echo; i=$((i + 1)); done | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
ranks() { # ranks SETTING BENCH: tokens/s summed over 2 ranks
  env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT $(setting_env "$1") \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 ./build/remax run $2 2>/dev/null | tps
}
busy() { # busy SETTING BENCH: one run beside a busy process
  sh -c 'while :; do :; done' &
  hog=$!
  r=$(one "$1" "$2")
  kill "$hog"
  wait "$hog" 2>/dev/null || true
  echo "$r"
}
printf "%-7s %-8s %12s %12s %12s   %s\n" bench setting quiet busy "2 ranks" "busy/quiet  quiet/today's quiet"
for b in decode train; do
  eval "args=\$$b"
  base=""
  for s in ${SETTINGS:-today remax spin10k passive}; do
    q=$(one "$s" "$args"); u=$(busy "$s" "$args"); m=$(ranks "$s" "$args")
    [ -z "$base" ] && base=$q
    printf "%-7s %-8s %12s %12s %12s   %.2f        %.2f\n" "$b" "$s" "$q" "$u" "$m" \
      "$(echo "$u / $q" | bc -l)" "$(echo "$q / $base" | bc -l)"
  done
done
