#!/bin/bash
# 2-rank synchronous data parallel against 1 generator + 1 trainer (one_step_off), the default recipe
cd "$(dirname "$0")/.."
B=$(pwd)/build
export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
COMMON="--max_steps 12 --eval_size 200 --eval_on_start false --eval_steps 0 --save_steps 0 --log_completions 0 --output_dir ${OUT:-/tmp/remax-async-bench} --hot_reload false"
for which in dp oso; do
  echo "== $which $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  t0=$(date +%s.%N)
  if [ $which = dp ]; then
    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS -x OMPI_MCA_btl_vader_single_copy_mechanism $B/remax run recipes/gsm8k.lua $COMMON --per_device_train_batch_size 16 --run_name dp --overwrite_output_dir 2>&1 | grep -E "step 12/|held-out|eval at" | tail -3
  else
    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS -x OMPI_MCA_btl_vader_single_copy_mechanism $B/remax run recipes/gsm8k.lua $COMMON --rollout_ranks 1 --async_mode one_step_off --run_name oso --overwrite_output_dir 2>&1 | grep -E "step 12/|held-out|eval at" | tail -3
  fi
  t1=$(date +%s.%N)
  echo "wall $(echo "$t1 - $t0" | bc) s, load after $(cut -d' ' -f1-3 /proc/loadavg)"
done
