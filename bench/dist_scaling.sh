#!/bin/sh
# bench/dist_scaling.sh: the same ReMax training, one process against `mpirun -np RANKS`, on the
# CPU: the "small" random model of bench/common.lua, byte-level prompts, the same global batch
# (RANKS x PROMPTS prompts per step). Prints each run's tokens/s (sampled + greedy tokens generated
# per second of whole step, steps 2.. so start-up is left out) and the ratio.
#   bench/dist_scaling.sh [RANKS] [PROMPTS_PER_RANK] [STEPS]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
ranks=${1:-2}
per=${2:-4}
steps=${3:-4}
cores=$(nproc)
threads=$(( cores / ranks > 0 ? cores / ranks : 1 ))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$root/remax" version >/dev/null   # build first
remax=${REMAX_BUILD:-$root/build}/remax

i=0
while [ $i -lt 64 ]; do echo "{\"prompt\": \"Write about the number $i, please.\"}"; i=$((i + 1)); done >"$work/p.jsonl"
cat >"$work/r.lua" <<EOF
return {
  model_config = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 256, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, intermediate_size = 688, max_position_embeddings = 512,
    rope_theta = 10000, rms_norm_eps = 1e-6, tie_word_embeddings = false },
  data = "$work/p.jsonl", chat_template = "plain", hot_reload = false, rewards = {
    { name = "length", fn = function(c) local s = {} for i, t in ipairs(c) do s[i] = #t / 100 end return s end } },
  num_generations = 2, max_completion_length = 48, learning_rate = 1e-4, max_steps = $steps, eval_size = 0,
  save_steps = 0, log_completions = 0, seed = 1, output_dir = "$work/runs",
}
EOF

# tokens/s over steps 2..: sum of generated tokens / sum of step times, from metrics.jsonl
rate() {
  luajit -e "
    local cjson = require('cjson')
    local tok, time = 0, 0
    for line in io.lines('$1') do
      local m = cjson.decode(line)
      if m.step >= 2 and m.time_step then
        tok = tok + m.tokens_per_s * m.time_generate
        time = time + m.time_step
      end
    end
    print(('%.1f'):format(tok / time))"
}

OMP_NUM_THREADS=$cores "$remax" run "$work/r.lua" --per_device_train_batch_size $((per * ranks)) \
  --run_name one >/dev/null 2>&1
one=$(rate "$work/runs/one/metrics.jsonl")
OMP_NUM_THREADS=$threads mpirun --allow-run-as-root --oversubscribe -np "$ranks" -x OMP_NUM_THREADS \
  "$remax" run "$work/r.lua" --per_device_train_batch_size "$per" --run_name many >/dev/null 2>&1
many=$(rate "$work/runs/many/metrics.jsonl")
echo "global batch $((per * ranks)) prompts x 3 rows, $cores cores"
echo "1 process x $cores threads:     $one tokens/s"
echo "$ranks ranks x $threads thread(s): $many tokens/s"
luajit -e "print(('ratio: %.2fx'):format($many / $one))"
