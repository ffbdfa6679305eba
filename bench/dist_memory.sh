#!/bin/sh
# bench/dist_memory.sh: per-rank peak memory and step time of zero_stage 0, 1 and 2 at 2 and 4
# ranks (mpirun, one OpenMP thread per rank), on a random model of a bench/common.lua shape.
# Prints a Markdown table (docs/distributed.md keeps the measured one).
#   bench/dist_memory.sh [SHAPE] [LAYERS] [VOCAB]     (LAYERS / VOCAB 0: the shape's own)
# The whole qwen0.5b shape needs about 8 GB per rank at stage 0 (16 bytes per parameter):
# 32 GB for 4 ranks. On a smaller machine, fewer layers and a smaller vocabulary keep the width.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
shape=${1:-qwen0.5b}
layers=${2:-0}
vocab=${3:-0}
"$root/remax" version >/dev/null   # build first
remax=${REMAX_BUILD:-$root/build}/remax
echo "| ranks | zero_stage | parameters | peak RSS per rank (MiB) | weights | gradients | AdamW moments | activations | step (s) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for ranks in 2 4; do
  for stage in 0 1 2; do
    line=$(OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --allow-run-as-root --oversubscribe \
      -np $ranks -x OMP_NUM_THREADS "$remax" run "$root/bench/dist_memory.lua" --shape "$shape" --stage $stage \
      --layers "$layers" --vocab "$vocab" 2>&1 | grep '^{')
    echo "$line" | luajit -e "
      local r = require('cjson').decode(io.read('*a'))
      local peak, first = 0, r.per_rank[1]
      for _, p in ipairs(r.per_rank) do peak = math.max(peak, p.peak_rss_mib) end
      print(('| %d | %d | %.1f M | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f |'):format(r.ranks, r.stage, r.parameters / 1e6,
        peak, first.params_mib, first.grads_mib, first.optimizer_mib, first.activations_mib, r.step_s))"
  done
done
