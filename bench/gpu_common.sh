# bench/gpu_common.sh: the preamble the GPU window's benchmarks (bench/gpu_*.sh) share, sourced
# by each (not a benchmark itself: tests/gpu/run.sh leaves it out):
#   . "$(dirname "$0")/gpu_common.sh"
#   remax_side bench/generate.lua
# It moves to the repository root and sets: python (PYTHON [python3]), remax (REMAX_BIN
# [./remax]), deadline (RX_GPU_DEADLINE, epoch seconds [a day from now]), lines (a temporary file
# of the result lines, removed on exit); say LINE (print it and keep it in lines), jesc S (S as
# the inside of a JSON string), and remax_side SCRIPT, which sets remax_why to "ok" when this
# build puts a model on the device (bench/gpu_probe.lua) and SCRIPT takes --device, else to
# "not available: why" (printed once).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
python=${PYTHON:-python3}
remax=${REMAX_BIN:-./remax}
deadline=${RX_GPU_DEADLINE:-$((EPOCHSECONDS + 86400))}
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
say() { echo "$1" | tee -a "$lines"; }
jesc() { local s=${1//\\/\\\\}; printf '%s' "${s//\"/\\\"}"; }   # a JSON string's inside

remax_side() { # SCRIPT
  remax_why=$("$remax" run bench/gpu_probe.lua 2>&1 | tail -1)
  if [ "$remax_why" = ok ] && ! grep -q -E '\bdevice *=' "$1"; then
    remax_why="not available: $1 takes no --device yet"
  fi
  [ "$remax_why" = ok ] || echo "remax side: not available in this build (${remax_why#not available: })"
}
