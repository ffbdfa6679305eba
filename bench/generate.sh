#!/bin/sh
# bench/generate.sh: generated tokens/s of greedy KV-cache decoding, remax beside PyTorch (2.x from
# PyPI, and Debian's 1.13 where installed), same threads, same shapes and sizes, measured in one
# session. Not a test.
#   bench/generate.sh [shape ...]        default: small qwen0.5b
#   ROWS="1 8 32" PROMPT=64 NEW=128 bench/generate.sh small
# Environment:
#   PEERS="2:hand 2:hf 1.13:hand"   the PyTorch peers, VERSION:IMPL[:CACHE] (bench/torch_peer.py
#                               generate): VERSION 2 is torch 2.15 in .cache/bench-venv (bench/peers.sh
#                               makes it), 1.13 Debian's python3-torch (/usr/bin/python3; skipped,
#                               saying so, where it is not installed); IMPL hand (the plain decoder:
#                               a preallocated KV cache, grouped attention without repeated keys) or
#                               hf (transformers' Qwen2ForCausalLM.generate, SDPA, its DynamicCache);
#                               CACHE static or cat to choose the other cache
#   DTYPE=f32                   the weights' dtype on both sides (bf16: remax's bf16 weights against
#                               torch's model in bfloat16)
#   THREADS=2                   threads for every side (default: the machine's cores)
# Both sides run at their best: OPENBLAS_L2_SIZE unset, the same OPENBLAS_CORETYPE for both (the
# kernels remax picks, see bench/blas_core.sh: OpenBLAS 0.3.21 does not know every AVX-512 CPU
# and would fall back to SSE3 ones), and PyTorch with OMP_WAIT_POLICY=PASSIVE (its threads
# otherwise spin against OpenBLAS's) under torch.inference_mode. Each side times one run after one
# warm-up run, prefill included, and counts rows * NEW tokens (no stop token: every row decodes all).
set -eu
cd "$(dirname "$0")/.."
shapes=${*:-small qwen0.5b}
rows_list=${ROWS:-1 8 32}; prompt=${PROMPT:-64}; new=${NEW:-128}; threads=${THREADS:-$(nproc)}
dtype=${DTYPE:-f32}
. bench/blas_core.sh   # builds first, outside the timing
bench/peers.sh >/dev/null   # the torch 2 environment, made outside the timing
line=$(mktemp); err=$(mktemp)
trap 'rm -f "$line" "$err"' EXIT
for shape in $shapes; do
  for rows in $rows_list; do
    r=$(env -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" ./remax run bench/generate.lua \
      --shape "$shape" --rows "$rows" --prompt "$prompt" --new "$new" --dtype "$dtype")
    echo "$r"
    for peer in ${PEERS:-2:hand 2:hf 1.13:hand}; do
      version=${peer%%:*}; impl=${peer#*:}; cache=
      case $impl in *:*) cache="--cache ${impl#*:}"; impl=${impl%%:*} ;; esac
      py=$(bench/peers.sh torch "$version") || { [ $? = 3 ] && continue
        echo "PEERS: $peer: want VERSION:IMPL[:CACHE], VERSION 2 or 1.13" >&2; exit 2; }
      if ! env -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE "$py" bench/torch_peer.py generate --impl "$impl" $cache \
        --shape "$shape" --rows "$rows" --prompt "$prompt" --new "$new" --threads "$threads" --dtype "$dtype" \
        >"$line" 2>"$err"; then
        echo "torch $peer failed:" >&2; tail -5 "$err" >&2
        continue
      fi
      p=$(cat "$line")
      echo "$p"
      R="$r" P="$p" luajit -e '
local cjson = require("cjson")
local r, p = cjson.decode(os.getenv("R")), cjson.decode(os.getenv("P"))
print(("%-10s rows=%-3d prompt=%d new=%d %s  remax %.1f tok/s (%.0f MiB peak)  %s %.1f tok/s (%.0f MiB)  ratio %.2fx"):format(
  r.shape, r.rows, r.prompt, r.new, r.dtype, r.tokens_per_s, r.peak_rss_mib, p.peer, p.tokens_per_s, p.peak_rss_mib,
  r.tokens_per_s / p.tokens_per_s))'
    done
  done
done
