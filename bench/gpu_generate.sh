#!/usr/bin/env bash
# bench/gpu_generate.sh: greedy decoding on a GPU at the Qwen2.5-0.5B and 1.5B shapes, 1, 64 and 256
# rows, prompt 256, 512 new tokens, bf16, random weights: remax (bench/generate.lua --device cuda
# --dtype bf16) beside Hugging Face transformers' generate with a static cache (bench/gpu_peer.py
# generate), same GPU, same run. Prints each side's JSON line, then a table of tokens/s, the share
# of the HBM bandwidth bound at 1 row (every bf16 weight and the cache read once per token, over
# 4.8 TB/s) and remax's ratio (rows starting "| "). Part of the GPU window (tests/gpu/run.sh).
# Not a test.
#   bash bench/gpu_generate.sh                        ROWS=1,64 SHAPES=qwen1.5b bash bench/gpu_generate.sh
# Environment: SHAPES [qwen0.5b qwen1.5b], ROWS [1,64,256], PROMPT [256], NEW [512],
#   HF_COMPILE=1 (let transformers torch.compile its static-cache forward: a compile per row
#   count, minutes in all; off by default so that a 10-minute window holds every row count),
#   PYTHON [python3], REMAX_BIN [./remax], RX_GPU_DEADLINE (epoch seconds: what would end later is
#   skipped and named), DRY_RUN=1 (no GPU: a tiny shape on the CPU, bench/torch_peer.py's decoder
#   as the peer: checks the script, measures nothing).
# remax's side runs bench/generate.lua --device cuda; where the build cannot use the device it prints one line saying why.
# window-seconds: 160
. "$(dirname "$0")/gpu_common.sh"
if [ "${DRY_RUN:-0}" = 1 ]; then
  shapes=${SHAPES:-tiny}; rows=${ROWS:-1,4}; prompt=${PROMPT:-16}; new=${NEW:-8}; peer_dev=(--device cpu --impl plain)
else
  shapes=${SHAPES:-qwen0.5b qwen1.5b}; rows=${ROWS:-1,64,256}; prompt=${PROMPT:-256}; new=${NEW:-512}; peer_dev=()
fi
compile=()
[ "${HF_COMPILE:-0}" = 1 ] && compile=(--compile)

remax_side bench/generate.lua

nshapes=$(echo "$shapes" | wc -w)
i=0
for shape in $shapes; do
  # each shape gets an equal share of the time left; the peer skips the row counts that would pass it
  left=$((deadline - EPOCHSECONDS))
  share=$(( left / (nshapes - i) ))
  i=$((i + 1))
  if (( share < 40 )); then
    say "{\"side\":\"transformers\",\"bench\":\"generate\",\"shape\":\"$shape\",\"skipped\":\"deadline\",\"why\":\"$left s left\"}"
    continue
  fi
  remax_part=0
  [ "$remax_why" = ok ] && remax_part=$((share / 2))
  echo "-- $shape: transformers generate, static cache, rows $rows, prompt $prompt, $new new tokens"
  timeout -k 5 $((share - remax_part - 3)) "$python" bench/gpu_peer.py generate --shape "$shape" --rows "$rows" \
    --prompt "$prompt" --new "$new" --deadline $((EPOCHSECONDS + share - remax_part - 8)) "${compile[@]}" "${peer_dev[@]}" |
    tee -a "$lines"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "transformers side of $shape failed (exit $rc)"
  for r in ${rows//,/ }; do
    if [ "$remax_why" != ok ]; then
      say "{\"side\":\"remax\",\"bench\":\"generate\",\"shape\":\"$shape\",\"rows\":$r,\"unavailable\":\"$(jesc "${remax_why#not available: }")\"}"
      continue
    fi
    left=$((deadline - EPOCHSECONDS))
    if (( left < 20 )); then
      say "{\"side\":\"remax\",\"bench\":\"generate\",\"shape\":\"$shape\",\"rows\":$r,\"skipped\":\"deadline\",\"why\":\"$left s left\"}"
      continue
    fi
    timeout -k 5 $((left - 5)) "$remax" run bench/generate.lua --shape "$shape" --rows "$r" --prompt "$prompt" \
      --new "$new" --device cuda --dtype bf16 | tee -a "$lines"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || echo "remax side of $shape, $r rows failed (exit $rc)"
  done
done
"$python" bench/gpu_peer.py report <"$lines"
