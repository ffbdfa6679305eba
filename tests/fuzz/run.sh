#!/usr/bin/env bash
# Builds one libFuzzer target with clang (address + undefined sanitizers) into build-fuzz/ and runs
# it for a bounded time:   bash tests/fuzz/run.sh tests/fuzz/fuzz_X.c SECONDS
# or folds what a campaign found into the committed corpus, minimised:
#                          bash tests/fuzz/run.sh --minimise tests/fuzz/fuzz_X.c
# Lines in the target say how to build and run it:
#   fuzz-sources: a.c b.c ...   the engine sources it needs (required; globs allowed)
#   fuzz-libs: -l...            extra link flags (LuaJIT for the targets that embed it)
#   fuzz-dict: NAME.dict        a libFuzzer dictionary in tests/fuzz/
#   fuzz-options: -max_len=N    extra libFuzzer options
# The committed seeds are tests/fuzz/corpus/<target>/; new finds go to build-fuzz/<target>.corpus.
# When the target also has a FUZZ_SEEDS main, that program (built without libFuzzer) writes more
# seeds there first. A slow input is a failure: over FUZZ_CPU_LIMIT seconds of CPU (default 1,
# tests/fuzz/fuzz_cpu.h), or over FUZZ_TIMEOUT seconds of wall time (default 30: hangs).
# Exits non-zero when the fuzzer finds a crash, a leak, undefined behaviour or a hang.
set -euo pipefail
cd "$(dirname "$0")/../.."

minimise=0
if [ "${1:-}" = --minimise ]; then minimise=1; shift; fi
target=${1:?usage: tests/fuzz/run.sh [--minimise] tests/fuzz/fuzz_X.c [SECONDS]}
seconds=${2:-60}
name=$(basename "$target" .c)
out=build-fuzz
cc=${CC:-clang}
mkdir -p "$out"

# the value after "NAME:" on the first such line, without a comment's closing "*/"
field() { sed -n "s/^.*$1:[[:space:]]*//p" "$target" | head -n 1 | sed 's#[[:space:]]*\*/[[:space:]]*$##'; }
sources=$(field fuzz-sources)
libs=$(field fuzz-libs)
dict=$(field fuzz-dict)
options=$(field fuzz-options)
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
# rebuilt only when the target, a source or a header is newer than the program
# shellcheck disable=SC2086  # $sources and $libs are lists
if [ ! -x "$out/$name" ] || [ -n "$(find "$target" tests/fuzz/*.h $sources engine/include engine/core engine/text engine/io -newer "$out/$name" -print -quit)" ]; then
  "$cc" $flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined "$target" $sources $libs -lm -o "$out/$name"
fi

corpus=$out/$name.corpus
seeds=tests/fuzz/corpus/$name
mkdir -p "$corpus" "$seeds"
if grep -q FUZZ_SEEDS "$target"; then
  # shellcheck disable=SC2086
  [ "$out/$name.seeds" -nt "$target" ] || "$cc" $flags -DFUZZ_SEEDS "$target" $sources $libs -lm -o "$out/$name.seeds"
  "$out/$name.seeds" "$corpus"
fi
dict_opt=()
[ -n "$dict" ] && dict_opt=(-dict="tests/fuzz/$dict")
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1

if [ "$minimise" = 1 ]; then
  # the smallest set of inputs that keeps the coverage of the committed seeds and the new finds
  rm -rf "$out/$name.min" && mkdir -p "$out/$name.min"
  # shellcheck disable=SC2086
  "$out/$name" -merge=1 -timeout=10 -rss_limit_mb=2048 $options "${dict_opt[@]}" "$out/$name.min" "$seeds" "$corpus"
  rm -rf "$seeds" && mv "$out/$name.min" "$seeds"
  echo "== $seeds: $(find "$seeds" -type f | wc -l) inputs"
  exit 0
fi

echo "== fuzzing $name for ${seconds}s (seeds $seeds, new inputs $corpus, crashes saved as $out/$name-*)"
# shellcheck disable=SC2086
"$out/$name" -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-30}" -rss_limit_mb=2048 -max_len=8192 \
  $options "${dict_opt[@]}" -print_final_stats=1 -artifact_prefix="$out/$name-" "$corpus" "$seeds"
