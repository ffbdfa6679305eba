#!/bin/sh
# bench/train_step.sh: training-step throughput and peak memory, remax beside PyTorch, same
# threads, same batch, measured in one session. Not a test.
#   bench/train_step.sh [shape] [batch] [seq] [steps]      e.g. bench/train_step.sh qwen0.5b 4 256 2
# Environment:
#   REMAX_RUNS="f32 bf16"       remax's configurations: dtype (f32, or bf16 mixed precision), with
#                               :onednn or :sgemm to force the bf16 GEMM kernel (bf16:onednn)
#   TORCH_RUNS="fp32:2 bf16:2"  the PyTorch configurations, precision:threads (fp32, or bf16 for
#                               torch.autocast(cpu, bfloat16)); each remax row gets its ratio
#                               against the fastest PyTorch and against PyTorch of its precision
#   BEFORE=DIR                  also time the remax of another checkout (built there), e.g. the
#                               commit before a change, in the same session
#   CHECKPOINT=0                skip the gradient-checkpointing run
#   PROFILE=1                   remax's run with --profile: its per-phase table on stderr
# Both sides run at their best: OPENBLAS_L2_SIZE unset, the same OPENBLAS_CORETYPE for both (the
# kernels remax picks, see bench/blas_core.sh: OpenBLAS 0.3.21 does not know every AVX-512 CPU
# and would fall back to SSE3 ones), and PyTorch with OMP_WAIT_POLICY=PASSIVE (its threads
# otherwise spin against OpenBLAS's and halve its speed).
set -eu
cd "$(dirname "$0")/.."
shape=${1:-small}; batch=${2:-8}; seq=${3:-256}; steps=${4:-3}
. bench/blas_core.sh   # builds first, outside the timing
args="--shape $shape --batch $batch --seq $seq --steps $steps"
run_remax() { env -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 "$@"; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if [ -n "${BEFORE:-}" ]; then
  (cd "$BEFORE" && run_remax ./remax run bench/train_step.lua $args) | sed 's/^{/{"label":"remax before",/' >> "$out"
fi
prof=; [ "${PROFILE:-0}" != 0 ] && prof=--profile
for run in ${REMAX_RUNS:-f32 bf16}; do
  dt=${run%%:*}; kernel=; [ "$run" != "$dt" ] && kernel=${run#*:}
  REMAX_BF16_GEMM=$kernel run_remax ./remax run bench/train_step.lua $args --dtype "$dt" $prof |
    sed "s/^{/{\"label\":\"remax $run\",\"prec\":\"$dt\",/" >> "$out"
done
if [ "${CHECKPOINT:-1}" != 0 ]; then
  run_remax ./remax run bench/train_step.lua $args --checkpoint | sed 's/^{/{"label":"remax, checkpointing","prec":"f32",/' >> "$out"
fi
for run in ${TORCH_RUNS:-fp32:2 bf16:2}; do
  prec=${run%%:*}; threads=${run##*:}
  ac=none; [ "$prec" = bf16 ] && ac=bf16
  env -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_peer.py train $args --threads "$threads" \
    --autocast "$ac" | sed "s/^{/{\"label\":\"pytorch $prec, $threads threads\",\"prec\":\"$prec\",/" >> "$out"
done
cat "$out"
OUT="$out" luajit -e '
local cjson = require("cjson")
local rows, best, by_prec = {}, nil, {}
local same = { f32 = "fp32", fp32 = "fp32", bf16 = "bf16" }
for line in io.lines(os.getenv("OUT")) do
  local r = cjson.decode(line)
  rows[#rows + 1] = r
  if r.peer and (not best or r.tokens_per_s > best.tokens_per_s) then best = r end
  if r.peer and r.prec then
    local p = by_prec[r.prec]
    if not p or r.tokens_per_s > p.tokens_per_s then by_prec[r.prec] = r end
  end
end
for _, r in ipairs(rows) do
  local vs = ""
  if best and r.engine then
    vs = ("  %.2fx the fastest PyTorch (%s), memory %.2fx"):format(r.tokens_per_s / best.tokens_per_s, best.label,
      r.peak_rss_mib / best.peak_rss_mib)
    local p = r.prec and by_prec[same[r.prec]]
    if p and p ~= best then
      vs = vs .. ("; %.2fx %s, memory %.2fx"):format(r.tokens_per_s / p.tokens_per_s, p.label, r.peak_rss_mib / p.peak_rss_mib)
    end
  end
  print(("%-10s B=%d T=%d  %-26s %8.1f tok/s  %6.0f MiB%s"):format(r.shape, r.batch, r.seq, r.label, r.tokens_per_s,
    r.peak_rss_mib, vs))
end
for _, r in ipairs(rows) do if r.bf16_gemm then print("remax bf16 GEMMs: " .. r.bf16_gemm) end end'
