#!/bin/sh
# bench/isa_rate.sh: the AVX-512 BF16 dot product's multiply-accumulate rate against the f32
# FMA's on one core of this CPU (bench/isa_rate.c). Not a test.
set -eu
cd "$(dirname "$0")/.."
out=${TMPDIR:-/tmp}/remax_isa_rate
cc -O2 -o "$out" bench/isa_rate.c
grep -m1 "model name" /proc/cpuinfo 2>/dev/null || true
taskset -c 0 "$out" 2>/dev/null || "$out"
