#!/bin/sh
# bench/train_step.sh: training-step throughput and peak memory, remax beside PyTorch, same
# threads, same batch, measured in one session. Not a test.
#   bench/train_step.sh [shape] [batch] [seq] [steps]      e.g. bench/train_step.sh qwen0.5b 4 256 2
# Both sides run at their best: OPENBLAS_L2_SIZE unset, the same OPENBLAS_CORETYPE for both (the
# kernels remax picks, see bench/blas_core.sh: OpenBLAS 0.3.21 does not know every AVX-512 CPU
# and would fall back to SSE3 ones), and PyTorch with OMP_WAIT_POLICY=PASSIVE (its threads
# otherwise spin against OpenBLAS's and halve its speed).
set -eu
cd "$(dirname "$0")/.."
shape=${1:-small}; batch=${2:-8}; seq=${3:-256}; steps=${4:-3}
. bench/blas_core.sh   # builds first, outside the timing
run_remax() { env -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 ./remax run bench/train_step.lua \
  --shape "$shape" --batch "$batch" --seq "$seq" --steps "$steps" "$@"; }
r=$(run_remax)
c=$(run_remax --checkpoint)
p=$(env -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_peer.py train \
  --shape "$shape" --batch "$batch" --seq "$seq" --steps "$steps" --threads 2)
echo "$r"; echo "$c"; echo "$p"
R="$r" C="$c" P="$p" luajit -e '
local cjson = require("cjson")
local r, c, p = cjson.decode(os.getenv("R")), cjson.decode(os.getenv("C")), cjson.decode(os.getenv("P"))
print(("%-10s B=%d T=%d  remax %.1f tok/s (%.0f MiB peak; checkpointing %.1f tok/s, %.0f MiB)  %s %.1f tok/s (%.0f MiB)  ratio %.2fx, memory %.2fx"):format(
  r.shape, r.batch, r.seq, r.tokens_per_s, r.peak_rss_mib, c.tokens_per_s, c.peak_rss_mib, p.peer, p.tokens_per_s,
  p.peak_rss_mib, r.tokens_per_s / p.tokens_per_s, r.peak_rss_mib / p.peak_rss_mib))'
