#!/bin/sh
# bench/generate.sh: generated tokens/s of greedy KV-cache decoding, remax beside PyTorch, same
# threads, same shapes and sizes, measured in one session. Not a test.
#   bench/generate.sh [shape ...]        default: small qwen0.5b
#   ROWS="1 8 32" PROMPT=64 NEW=128 bench/generate.sh small
# Both sides run at their best: OPENBLAS_L2_SIZE unset, the same OPENBLAS_CORETYPE for both (the
# kernels remax picks, see bench/blas_core.sh: OpenBLAS 0.3.21 does not know every AVX-512 CPU
# and would fall back to SSE3 ones), and PyTorch with OMP_WAIT_POLICY=PASSIVE (its threads
# otherwise spin against OpenBLAS's). The peer (bench/torch_peer.py generate) keeps a preallocated KV cache and attends
# grouped without repeating keys; each side times one run after one warm-up run, prefill
# included, and counts rows * NEW tokens.
set -eu
cd "$(dirname "$0")/.."
shapes=${*:-small qwen0.5b}
rows_list=${ROWS:-1 8 32}; prompt=${PROMPT:-64}; new=${NEW:-128}; threads=${THREADS:-2}
. bench/blas_core.sh   # builds first, outside the timing
for shape in $shapes; do
  for rows in $rows_list; do
    r=$(env -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" ./remax run bench/generate.lua \
      --shape "$shape" --rows "$rows" --prompt "$prompt" --new "$new")
    p=$(env -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_peer.py generate \
      --shape "$shape" --rows "$rows" --prompt "$prompt" --new "$new" --threads "$threads")
    echo "$r"; echo "$p"
    R="$r" P="$p" luajit -e '
local cjson = require("cjson")
local r, p = cjson.decode(os.getenv("R")), cjson.decode(os.getenv("P"))
print(("%-10s rows=%-3d prompt=%d new=%d  remax %.1f tok/s (%.0f MiB peak)  %s %.1f tok/s (%.0f MiB)  ratio %.2fx"):format(
  r.shape, r.rows, r.prompt, r.new, r.tokens_per_s, r.peak_rss_mib, p.peer, p.tokens_per_s, p.peak_rss_mib,
  r.tokens_per_s / p.tokens_per_s))'
  done
done
