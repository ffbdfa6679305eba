#!/usr/bin/env bash
# bench/gpu_remax_step.sh: one whole ReMax step of the trainer on a GPU at the Qwen2.5-1.5B shape
# (hidden 1536, 28 layers, 12/2 heads, ffn 8960, vocab 151936, random weights, bf16): 64 prompts
# of 256 tokens x (4 samples + the greedy baseline), 512 new tokens, beta 0.04 (the reference
# model's log-probabilities), micro-batches of 8 prompts; timed by phase: generation, scoring
# (a Lua reward and the advantages), reference log-probabilities, update (bench/remax_step.lua).
# Prints remax's JSON line and a one-line summary (starting "| "). No peer: transformers has no
# ReMax step (bench/gpu_generate.sh and bench/gpu_train_step.sh hold the comparisons). Part of the
# GPU window (tests/gpu/run.sh). Not a test; the one step timed includes the first use of each
# shape (allocation, CUDA graph capture), as the first step of a run does.
#   bash bench/gpu_remax_step.sh             bash bench/gpu_remax_step.sh --tiny
# Environment: SHAPE [qwen1.5b], PROMPTS [64], SAMPLES [4], PROMPT [256], NEW [512], MICRO [8],
#   BETA [0.04], STEPS [1], WARMUP [0], DTYPE [bf16], DEVICE [cuda], REMAX_BIN [./remax],
#   RX_GPU_DEADLINE (epoch seconds: a run that would end later is skipped and named).
#   --tiny, TINY=1 or DRY_RUN=1: the tiny shape, 4 prompts x (2 samples + greedy), prompt 16, 8
#   new tokens, f32: the same path through the CUDA emulator's build (REMAX_BIN=build-emu/remax)
#   or, with DEVICE=cpu, the CPU; checks the script, measures nothing (tests/lua/bench_spec.lua).
# window-seconds: 150
. "$(dirname "$0")/gpu_common.sh"
tiny=${TINY:-0}
for a in "$@"; do
  case $a in
    --tiny) tiny=1 ;;
    *) echo "gpu_remax_step.sh: unknown argument '$a' (known: --tiny)" >&2; exit 2 ;;
  esac
done
[ "${DRY_RUN:-0}" = 1 ] && tiny=1
if [ "$tiny" = 1 ]; then
  shape=${SHAPE:-tiny}; prompts=${PROMPTS:-4}; samples=${SAMPLES:-2}; prompt=${PROMPT:-16}; new=${NEW:-8}
  micro=${MICRO:-2}; dtype=${DTYPE:-f32}
else
  shape=${SHAPE:-qwen1.5b}; prompts=${PROMPTS:-64}; samples=${SAMPLES:-4}; prompt=${PROMPT:-256}; new=${NEW:-512}
  micro=${MICRO:-8}; dtype=${DTYPE:-bf16}
fi
beta=${BETA:-0.04}; steps=${STEPS:-1}; warmup=${WARMUP:-0}; device=${DEVICE:-cuda}
head="\"side\":\"remax\",\"bench\":\"remax_step\",\"shape\":\"$shape\",\"device\":\"$device\""

if [ "$device" = cpu ]; then remax_why=ok; else remax_side bench/remax_step.lua; fi
if [ "$remax_why" != ok ]; then
  say "{$head,\"unavailable\":\"$(jesc "${remax_why#not available: }")\"}"
  exit 0
fi
left=$((deadline - EPOCHSECONDS))
if (( left < 30 )); then
  say "{$head,\"skipped\":\"deadline\",\"why\":\"$left s left\"}"
  exit 0
fi
echo "-- $shape: one ReMax step, $prompts prompts x ($samples samples + greedy), prompt $prompt, $new new tokens, $dtype on $device"
timeout -k 5 $((left - 5)) "$remax" run bench/remax_step.lua --shape "$shape" --prompts "$prompts" --samples "$samples" \
  --prompt "$prompt" --new "$new" --micro "$micro" --beta "$beta" --steps "$steps" --warmup "$warmup" \
  --device "$device" --dtype "$dtype" | tee -a "$lines"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
  echo "remax_step on $shape failed (exit $rc)"
  exit 1
fi
# the summary: the JSON line's phases, in seconds per step
line=$(grep -E '^\{.*"bench":"remax_step"' "$lines" | tail -1)
val() { sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p" <<<"$line"; }
printf '| remax_step %s %s on %s, %s rows x %s new tokens: step %.2f s = generation %.2f s (%.0f tokens/s) + scoring %.2f s + reference log-probabilities %.2f s + update %.2f s\n' \
  "$shape" "$dtype" "$device" "$(val rows)" "$new" "$(val step_s)" "$(val generate_s)" "$(val generate_tokens_per_s)" \
  "$(val score_s)" "$(val ref_logprobs_s)" "$(val update_s)"
