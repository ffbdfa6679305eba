#!/bin/sh
# bench/train_step.sh: training-step throughput and peak memory, remax beside PyTorch (2.x from PyPI,
# and Debian's 1.13 where installed), same threads, same batch, measured in one session. Not a test.
#   bench/train_step.sh [shape] [batch] [seq] [steps]      e.g. bench/train_step.sh qwen0.5b 4 256 2
# Environment:
#   REMAX_RUNS="f32 bf16"       remax's configurations: dtype (f32, or bf16 mixed precision), with
#                               :onednn or :sgemm to force the bf16 GEMM kernel (bf16:onednn)
#   TORCH_RUNS="2:fp32 2:bf16 2:fp32+compile 2:bf16+compile 1.13:fp32 1.13:bf16"
#                               the PyTorch configurations, VERSION:PRECISION[+compile]: VERSION 2 is
#                               torch 2.15 in .cache/bench-venv (bench/peers.sh makes it), 1.13 is
#                               Debian's python3-torch (/usr/bin/python3; skipped, saying so, where
#                               it is not installed); PRECISION fp32, or bf16 for
#                               torch.autocast(cpu, bfloat16); +compile: the loss under torch.compile
#                               (its compilation is the warm-up step's, outside the timing). Each
#                               remax row gets its ratio against the fastest of each torch version and
#                               against that version's fastest of its precision
#   THREADS=2                   threads for every side (default: the machine's cores)
#   BEFORE=DIR                  also time the remax of another checkout (built there), e.g. the
#                               commit before a change, in the same session
#   CHECKPOINT=0                skip the gradient-checkpointing run
#   PROFILE=1                   remax's run with --profile: its per-phase table on stderr
# Both sides run at their best: OPENBLAS_L2_SIZE unset, the same OPENBLAS_CORETYPE for both (the
# kernels remax picks, see bench/blas_core.sh: OpenBLAS 0.3.21 does not know every AVX-512 CPU
# and would fall back to SSE3 ones), and PyTorch with OMP_WAIT_POLICY=PASSIVE (its threads
# otherwise spin against OpenBLAS's and halve its speed), SDPA attention (grouped-query where it
# has it) and fused AdamW where the version has them (bench/torch_peer.py).
set -eu
cd "$(dirname "$0")/.."
shape=${1:-small}; batch=${2:-8}; seq=${3:-256}; steps=${4:-3}
. bench/blas_core.sh   # builds first, outside the timing
args="--shape $shape --batch $batch --seq $seq --steps $steps"
threads=${THREADS:-$(nproc)}
run_remax() { env -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" "$@"; }
out=$(mktemp); line=$(mktemp); err=$(mktemp)
trap 'rm -f "$out" "$line" "$err"' EXIT
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
bench/peers.sh >/dev/null   # the torch 2 environment, made outside the timing too
for run in ${TORCH_RUNS:-2:fp32 2:bf16 2:fp32+compile 2:bf16+compile 1.13:fp32 1.13:bf16}; do
  version=${run%%:*}; prec=${run#*:}; compile=
  case $prec in *+compile) prec=${prec%+compile}; compile=--compile ;; esac
  ac=none; [ "$prec" = bf16 ] && ac=bf16
  py=$(bench/peers.sh torch "$version") || { [ $? = 3 ] && continue
    echo "TORCH_RUNS: $run: want VERSION:PRECISION[+compile], VERSION 2 or 1.13" >&2; exit 2; }
  if env -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE "$py" bench/torch_peer.py train $args --threads "$threads" \
    --autocast "$ac" $compile >"$line" 2>"$err"; then
    sed "s/^{/{\"label\":\"torch $version $prec${compile:+, compiled}\",\"prec\":\"$prec\",\"version\":\"$version\",/" "$line" >> "$out"
  else
    echo "torch $run failed:" >&2; tail -5 "$err" >&2
  fi
done
cat "$out"
OUT="$out" luajit -e '
local cjson = require("cjson")
local rows, versions = {}, {}
local best, by_prec = {}, {}   -- version -> fastest peer; version .. prec -> fastest peer
local same = { f32 = "fp32", fp32 = "fp32", bf16 = "bf16" }
for line in io.lines(os.getenv("OUT")) do
  local r = cjson.decode(line)
  rows[#rows + 1] = r
  if r.peer then
    local v = r.version
    if not best[v] then versions[#versions + 1] = v end
    if not best[v] or r.tokens_per_s > best[v].tokens_per_s then best[v] = r end
    local k = v .. " " .. r.prec
    if not by_prec[k] or r.tokens_per_s > by_prec[k].tokens_per_s then by_prec[k] = r end
  end
end
for _, r in ipairs(rows) do
  local vs = {}
  if r.engine then
    for _, v in ipairs(versions) do
      local b = best[v]
      vs[#vs + 1] = ("%.2fx the fastest torch %s (%s), memory %.2fx"):format(r.tokens_per_s / b.tokens_per_s, v, b.label,
        r.peak_rss_mib / b.peak_rss_mib)
      local p = r.prec and by_prec[v .. " " .. same[r.prec]]
      if p and p ~= b then
        vs[#vs + 1] = ("%.2fx %s, memory %.2fx"):format(r.tokens_per_s / p.tokens_per_s, p.label, r.peak_rss_mib / p.peak_rss_mib)
      end
    end
  end
  print(("%-10s B=%d T=%d  %-26s %8.1f tok/s  %6.0f MiB%s"):format(r.shape, r.batch, r.seq, r.label, r.tokens_per_s,
    r.peak_rss_mib, #vs > 0 and ("  " .. table.concat(vs, "; ")) or ""))
end
for _, r in ipairs(rows) do if r.bf16_gemm then print("remax bf16 GEMMs: " .. r.bf16_gemm) end end'
