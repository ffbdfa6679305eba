#!/usr/bin/env bash
# bench/gpu_ops.sh: remax's CUDA GEMM and attention kernels at the 1.5B training shape (hidden 1536,
# ffn 8960, 12/2 heads of 128, 16 x 1024 tokens, bf16), forward and backward, beside PyTorch's
# F.linear and scaled_dot_product_attention on the same GPU in the same run (tests/gpu/bench_ops.c,
# tests/gpu/bench_torch.py). Prints a JSON line per op and side, and a table (rows starting "| ").
# Part of the GPU window (tests/gpu/run.sh). Not a test.
#   bash bench/gpu_ops.sh
# Environment: REMAX_BUILD_DIR [build-gpu] (where gpu_bench_ops was built), RX_ENV (a command
# prefix that finds remax's libraries: tests/gpu/run.sh passes one), PYTHON [python3], DRY_RUN=1.
# window-seconds: 30
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
python=${PYTHON:-python3}
bdir=${REMAX_BUILD_DIR:-build-gpu}
read -r -a rx_env <<<"${RX_ENV:-env}"
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT

# "bench SIDE LABEL... MS ms TFLOPS TFLOP/s" -> a JSON line and a table row
to_rows() {
  awk '$1 == "bench" && $(NF) == "TFLOP/s" {
         label = $3; for (i = 4; i <= NF - 4; i++) label = label " " $i
         printf "{\"side\":\"%s\",\"bench\":\"ops\",\"op\":\"%s\",\"ms\":%s,\"tflops\":%s}\n", $2, label, $(NF - 3), $(NF - 1)
         printf "| %-6s %-46s %9s ms %7s TFLOP/s\n", $2, label, $(NF - 3), $(NF - 1); next }
       $1 == "bench" { sub(/^bench /, "| "); print }'
}

if [ ! -x "$bdir/gpu_bench_ops" ]; then
  echo "| remax  ops: not available ($bdir/gpu_bench_ops is not built)"
else
  "${rx_env[@]}" "$bdir/gpu_bench_ops" >"$lines" 2>&1
  rc=$?
  if [ "$rc" = 77 ]; then echo "| remax  ops: not available ($(tail -1 "$lines"))"
  elif [ "$rc" != 0 ]; then cat "$lines"; echo "remax ops failed (exit $rc)"
  else to_rows <"$lines"; fi
fi
if [ "${DRY_RUN:-0}" = 1 ] || ! "$python" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "| torch  ops: not available (no CUDA device for $python's PyTorch here)"
else
  "$python" tests/gpu/bench_torch.py >"$lines" 2>&1
  rc=$?
  to_rows <"$lines"
  [ "$rc" = 0 ] || { tail -5 "$lines"; echo "torch ops failed (exit $rc)"; }
fi
