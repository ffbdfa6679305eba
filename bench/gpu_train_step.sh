#!/usr/bin/env bash
# bench/gpu_train_step.sh: the training step on a GPU at the Qwen2.5-1.5B and 0.5B shapes, 16 x 1024
# tokens per step, bf16: remax (bench/train_step.lua --device cuda --dtype bf16) beside Hugging
# Face transformers' Qwen2 (bench/gpu_peer.py train: f32 master weights under bf16 autocast, SDPA,
# fused AdamW), random weights, same GPU, same run. Prints each side's JSON line, then a table of
# tokens/s, MFU (over the H200's 989 TFLOP/s dense bf16), peak device memory and remax's ratio
# (rows starting "| "). Part of the GPU window (tests/gpu/run.sh). Not a test.
#   bash bench/gpu_train_step.sh                      SHAPES="qwen1.5b" STEPS=10 bash bench/gpu_train_step.sh
# Environment: SHAPES [qwen1.5b qwen0.5b], BATCH [16], SEQ [1024], STEPS [5], WARMUP [2],
#   PYTHON [python3], REMAX_BIN [./remax], RX_GPU_DEADLINE (epoch seconds: what would end later is
#   skipped and named), DRY_RUN=1 (no GPU: the same script on the CPU at a tiny shape, with
#   bench/torch_peer.py's decoder as the peer: checks the script, measures nothing).
# Where the build cannot put a model on the device, remax's side prints one line saying so.
# window-seconds: 70
. "$(dirname "$0")/gpu_common.sh"
if [ "${DRY_RUN:-0}" = 1 ]; then
  shapes=${SHAPES:-tiny}; batch=${BATCH:-2}; seq=${SEQ:-64}; steps=${STEPS:-2}; peer_dev=(--device cpu --impl plain)
else
  shapes=${SHAPES:-qwen1.5b qwen0.5b}; batch=${BATCH:-16}; seq=${SEQ:-1024}; steps=${STEPS:-5}; peer_dev=()
fi
warmup=${WARMUP:-2}

remax_side bench/train_step.lua

for shape in $shapes; do
  left=$((deadline - EPOCHSECONDS))
  if (( left < 45 )); then
    say "{\"side\":\"transformers\",\"bench\":\"train_step\",\"shape\":\"$shape\",\"skipped\":\"deadline\",\"why\":\"$left s left\"}"
    continue
  fi
  echo "-- $shape: transformers, $batch x $seq tokens per step"
  timeout -k 5 $((left - 5)) "$python" bench/gpu_peer.py train --shape "$shape" --batch "$batch" --seq "$seq" \
    --steps "$steps" --warmup "$warmup" "${peer_dev[@]}" | tee -a "$lines"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "transformers side of $shape failed (exit $rc)"
  if [ "$remax_why" != ok ]; then
    say "{\"side\":\"remax\",\"bench\":\"train_step\",\"shape\":\"$shape\",\"unavailable\":\"$(jesc "${remax_why#not available: }")\"}"
    continue
  fi
  left=$((deadline - EPOCHSECONDS))
  if (( left < 30 )); then
    say "{\"side\":\"remax\",\"bench\":\"train_step\",\"shape\":\"$shape\",\"skipped\":\"deadline\",\"why\":\"$left s left\"}"
    continue
  fi
  echo "-- $shape: remax"
  timeout -k 5 $((left - 5)) "$remax" run bench/train_step.lua --shape "$shape" --batch "$batch" --seq "$seq" \
    --steps "$steps" --warmup "$warmup" --device cuda --dtype bf16 | tee -a "$lines"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "remax side of $shape failed (exit $rc)"
done
"$python" bench/gpu_peer.py report <"$lines"
