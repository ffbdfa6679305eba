#!/usr/bin/env bash
# Builds one libFuzzer target with clang (address + undefined sanitizers) into build-fuzz/ and runs
# it for a bounded time:   bash tests/fuzz/run.sh tests/fuzz/fuzz_X.c SECONDS
# The target names the engine sources it needs on a line "fuzz-sources: a.c b.c ...". When it also
# has a FUZZ_SEEDS main, that program (built without libFuzzer) writes the seed corpus first.
# Exits non-zero when the fuzzer finds a crash, a leak, undefined behaviour or a hang.
set -euo pipefail
cd "$(dirname "$0")/../.."

target=${1:?usage: tests/fuzz/run.sh tests/fuzz/fuzz_X.c SECONDS}
seconds=${2:-60}
name=$(basename "$target" .c)
out=build-fuzz
cc=${CC:-clang}
mkdir -p "$out"

sources=$(sed -n 's/^.*fuzz-sources:[[:space:]]*//p' "$target" | head -n 1)
if [ -z "$sources" ]; then
  echo "$target: no 'fuzz-sources:' line naming the engine sources it needs" >&2
  exit 2
fi

printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' >"$out/probe.c"
if ! "$cc" -fsanitize=fuzzer "$out/probe.c" -o "$out/probe" 2>"$out/probe.log"; then
  cat "$out/probe.log" >&2
  echo "fuzz: '$cc -fsanitize=fuzzer' does not link; install clang's runtime: apt-get install -y libclang-rt-14-dev" >&2
  exit 2
fi

flags="-g -O1 -fno-omit-frame-pointer -Iengine/include -Iengine -Iengine/core"
# shellcheck disable=SC2086  # $sources is a list of files
"$cc" $flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined "$target" $sources -lm -o "$out/$name"

corpus=$out/$name.corpus
mkdir -p "$corpus"
if grep -q FUZZ_SEEDS "$target"; then
  # shellcheck disable=SC2086
  "$cc" $flags -DFUZZ_SEEDS "$target" $sources -lm -o "$out/$name.seeds"
  "$out/$name.seeds" "$corpus"
fi

echo "== fuzzing $name for ${seconds}s (corpus $corpus, crashes saved as $out/$name-*)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$out/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
  -print_final_stats=1 -artifact_prefix="$out/$name-" "$corpus"
