#!/bin/sh
# tests/fingerprint.sh OUT: tiny fixed-seed training runs of recipes/gsm8k.lua (ReMax, GRPO with
# num_iterations 2, LoRA with beta, the k1 KL, SFT, mpirun -np 2, mpirun -np 2 under ZeRO-2, and
# --device cuda through the CUDA emulator when build-emu/ holds its build: cmake -S . -B build-emu
# -DRX_CUDA=emulate) and their fingerprints in OUT: every metric
# that does not measure time or memory, the trainer state without its clock, and the SHA-256 of every
# checkpoint file. Two versions of the code trained the same way exactly when their OUT files are
# identical (docs/architecture.md keeps the comparison of the restructure):
#   tests/fingerprint.sh /tmp/before.txt; ...change...; tests/fingerprint.sh /tmp/after.txt
#   cmp /tmp/before.txt /tmp/after.txt
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: tests/fingerprint.sh OUT}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=${FINGERPRINT_THREADS:-1}   # FINGERPRINT_THREADS=2: the same runs on 2 threads
common="--max_steps 3 --per_device_train_batch_size 4 --num_generations 2 --max_completion_length 40
  --eval_size 8 --eval_steps 2 --per_device_eval_batch_size 8 --save_steps 2 --log_completions 1
  --hot_reload false --seed 7 --output_dir $tmp"
run() { # run NAME "SETTINGS" COMMAND...: the command with the common settings, then these
  name=$1 settings=$2; shift 2
  # FINGERPRINT_CASES="remax cuda_emulated": only these cases (default: all)
  case " ${FINGERPRINT_CASES:-$name} " in *" $name "*) ;; *) return 0 ;; esac
  "$@" $common --run_name "$name" $settings >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; exit 1; }
}
cd "$root"
./remax version >/dev/null   # build once, outside mpirun
run remax "" ./remax run recipes/gsm8k.lua
run grpo_mu2 "--algo grpo --num_iterations 2" ./remax run recipes/gsm8k.lua
run lora_beta "--use_lora true --beta 0.05 --learning_rate 1e-3" ./remax run recipes/gsm8k.lua
run k1_beta "--beta 0.05 --kl_estimator k1" ./remax run recipes/gsm8k.lua
run sft "--algo sft" ./remax run recipes/gsm8k.lua
if command -v mpirun >/dev/null 2>&1; then
  run mpi2 "--per_device_train_batch_size 2" mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS ./remax run recipes/gsm8k.lua
  run mpi2_zero2 "--per_device_train_batch_size 2 --zero_stage 2" mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS ./remax run recipes/gsm8k.lua
fi
if [ -x build-emu/remax ]; then   # the emulator build's own program (its libremax runs device "cuda")
  run cuda_emulated "--device cuda --eval_size 0 --max_completion_length 16" env REMAX_BUILD_DIR="$root/build-emu" build-emu/remax run recipes/gsm8k.lua
fi
luajit - "$tmp" >"$out" <<'LUA'
local cjson = require("cjson")
local dir = arg[1]
local function clocked(k) return k:match("^time") or k == "tokens_per_s" or k:match("memory") or k == "train_seconds" end
local function canon(v)   -- one line per value, keys sorted, numbers with 17 digits
  if type(v) == "table" then
    local keys = {}
    for k in pairs(v) do if not clocked(tostring(k)) then keys[#keys + 1] = k end end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    local parts = {}
    for _, k in ipairs(keys) do parts[#parts + 1] = tostring(k) .. "=" .. canon(v[k]) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  if type(v) == "number" then return ("%.17g"):format(v) end
  return tostring(v)
end
for _, name in ipairs({ "remax", "grpo_mu2", "lora_beta", "k1_beta", "sft", "mpi2", "mpi2_zero2", "cuda_emulated" }) do
  local run = dir .. "/" .. name
  local f = io.open(run .. "/metrics.jsonl")
  if f then
    for line in f:lines() do print(name .. " metrics " .. canon(cjson.decode(line))) end
    f:close()
    local p = io.popen("cd '" .. run .. "/checkpoints' && find . -type f | sort")
    for file in p:lines() do
      if file:match("%.json$") then   -- JSON: its values, whatever the key order
        local s = io.open(run .. "/checkpoints/" .. file):read("*a")
        print(name .. " " .. file .. " " .. canon(cjson.decode(s)))
      else
        local h = io.popen("sha256sum '" .. run .. "/checkpoints/" .. file .. "'"):read("*l")
        print(name .. " " .. file .. " " .. h:match("^%x+"))
      end
    end
    p:close()
  end
end
LUA
wc -l <"$out" | xargs echo "fingerprints:" >&2
