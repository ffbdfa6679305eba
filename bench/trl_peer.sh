#!/bin/sh
# bench/trl_peer.sh: remax beside TRL, the framework of the seed PR (issue 47): the same model
# (models/tiny-gsm8k), prompts (recipes/gsm8k.lua's, exported by bench/trl_prompts.lua), reward
# (rewards/gsm8k.lua and its port bench/gsm8k_reward.py) and settings, each run for the same
# training time (evaluation excluded) on the same cores, one after the other. Not a test.
#   bench/trl_peer.sh [minutes]                      default 10
# Environment:
#   RUNS="remax:remax remax:grpo trl:grpo trl:remax trl:dapo"   which runs, SIDE:ALGO:
#       remax:remax  ./remax run recipes/gsm8k.lua as it is (ReMax: 4 samples + 1 greedy row per prompt)
#       remax:grpo   the same with --algo grpo --generate_greedy false (4 samples, std-normalised)
#       trl:grpo     TRL's GRPOTrainer with remax's loss (loss_type grpo: mean over tokens, then rows)
#       trl:dapo     TRL's GRPOTrainer with TRL's default loss_type dapo
#       trl:remax    the seed's ReMaxTrainer on GRPOTrainer (bench/trl_peer.py)
#     the calculator demonstration (models/tiny-gsm8k-tools, recipes/gsm8k_tools.lua's prompts and settings):
#       remax:tools-remax  ./remax run recipes/gsm8k_tools.lua as it is (ReMax with multi-turn episodes)
#       remax:tools-grpo   the same with --algo grpo --generate_greedy false
#       trl:tools-grpo     TRL's GRPOTrainer with tools=[calculator] (bench/trl_tools.py)
#   REWARDS=1        also check rewards/gsm8k.lua and its port against math-verify on GSM8K's test
#                    set (needs openai/grade-school-math's data in GSM8K_DIR [.cache/grade-school-math]:
#                    git clone https://github.com/openai/grade-school-math, then copy its
#                    grade_school_math/data/*.jsonl there; it is not committed)
#   OUT=runs/trl_peer
# Prints each run's progress, then bench/trl_report.lua's tables and ratios; writes OUT/accuracy.svg.
# The load average is sampled every 10 s into OUT/load.log: on a shared machine read it beside the times.
set -eu
cd "$(dirname "$0")/.."
minutes=${1:-10}
out=${OUT:-runs/trl_peer}
runs=${RUNS:-remax:remax remax:grpo trl:grpo trl:remax trl:dapo}
. bench/blas_core.sh   # builds remax first
py=$(bench/peers.sh)
mkdir -p "$out"
./remax run bench/trl_prompts.lua --out "$out/prompts"
case " $runs " in *tools-*) ./remax run bench/trl_prompts.lua --recipe recipes/gsm8k_tools.lua --out "$out/tools-prompts" --train 2048 ;; esac
(while :; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 10; done) >>"$out/load.log" &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT INT TERM
seconds=$(awk "BEGIN { print $minutes * 60 }")
for run in $runs; do
  side=${run%%:*}; algo=${run#*:}
  echo "== $run: $minutes training minutes ($(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))"
  begin=$(date +%s)
  case $side:$algo in
    remax:remax|remax:grpo)
      rm -rf "$out/remax-$algo"
      extra=; [ "$algo" = grpo ] && extra="--algo grpo --generate_greedy false"
      /usr/bin/time -f %M -o "$out/remax-$algo.rss_kib" ./remax run recipes/gsm8k.lua $extra --max_time "$seconds" \
        --max_steps 100000 --save_steps 0 --log_completions 0 --output_dir "$out" --run_name "remax-$algo" ;;
    remax:tools-remax|remax:tools-grpo)
      rm -rf "$out/remax-$algo"
      extra=; [ "$algo" = tools-grpo ] && extra="--algo grpo --generate_greedy false"
      /usr/bin/time -f %M -o "$out/remax-$algo.rss_kib" ./remax run recipes/gsm8k_tools.lua $extra --max_time "$seconds" \
        --max_steps 100000 --save_steps 0 --log_completions 0 --eval_steps 5 --output_dir "$out" --run_name "remax-$algo" ;;
    trl:tools-grpo)
      OMP_WAIT_POLICY=PASSIVE "$py" bench/trl_tools.py --prompts "$out/tools-prompts" --minutes "$minutes" \
        --out "$out/trl-$algo.json" 2>"$out/trl-$algo.stderr" ;;
    trl:grpo|trl:dapo|trl:remax)
      a=$algo; loss=grpo; [ "$algo" = dapo ] && { a=grpo; loss=dapo; }
      OMP_WAIT_POLICY=PASSIVE "$py" bench/trl_peer.py train --algo "$a" --loss-type "$loss" --prompts "$out/prompts" \
        --minutes "$minutes" --out "$out/trl-$algo.json" 2>"$out/trl-$algo.stderr" ;;
    *) echo "RUNS: $run: want one of remax:remax remax:grpo trl:grpo trl:dapo trl:remax remax:tools-remax remax:tools-grpo trl:tools-grpo" >&2; exit 2 ;;
  esac
  echo "$run $begin $(date +%s)" >>"$out/spans.txt"
done
if [ "${REWARDS:-1}" != 0 ]; then
  gsm8k=${GSM8K_DIR:-.cache/grade-school-math}
  if [ -f "$gsm8k/test.jsonl" ]; then
    "$py" bench/trl_peer.py rewards --gsm8k "$gsm8k" --out "$out" >"$out/rewards.txt"
  else
    echo "skipped: the reward check against math-verify: no $gsm8k/test.jsonl (see REWARDS above)" >&2
  fi
fi
./remax run bench/trl_report.lua --dir "$out"
