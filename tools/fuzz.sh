#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz, one per parser of untrusted input: builds them with clang,
# ASan and UBSan into build-fuzz/ (only they and the libraries they test), replays each target's
# seed corpus tests/fuzz/corpus/<target>/, then fuzzes each for a bounded time.
#
#   tools/fuzz.sh [--seconds N] [--replay-only] [TARGET...]
#
# TARGET: plugin_file plugin_options train_config launcher_env checkpoint_manifest inject
# metrics_resume torch_file optimizer_file model_file (default: all). --seconds: fuzzing time per target (default 30).
# A crash, a sanitizer finding, an exception other than ampkit::Error, a timeout (10 s per input)
# or an out-of-memory (2 GB in all, or 512 MB in one allocation: a parser that allocates what the
# input's bytes do not back) fails the run; the input is kept as build-fuzz/crashes/<target>-*.
# Add it to tests/fuzz/corpus/<target>/ once fixed, so every later run replays it.
# New inputs found while fuzzing go to build-fuzz/corpus/<target>/, not into the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
# The fuzz build has -g, and with -g ccache puts the working directory into its hash: a clone in a
# new folder (CI's) would compile every target again. Without it the debug info keeps the paths
# of the folder that compiled first (file names and lines stay right).
export CCACHE_NOHASHDIR=true
seconds=30 replay_only=0 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --replay-only) replay_only=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(plugin_file plugin_options train_config launcher_env checkpoint_manifest inject metrics_resume torch_file optimizer_file model_file)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (${all[*]})" >&2; exit 2; }
done
[[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --seconds takes a whole number, not '$seconds'" >&2; exit 2; }

tools/setup.sh > /dev/null
BUILD_DIR=${AMPKIT_FUZZ_BUILD_DIR:-build-fuzz}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DAMPKIT_FUZZ=ON -DAMPKIT_BUILD_TESTS=OFF -DAMPKIT_WITH_CUDA=OFF > /dev/null
cmake --build "$BUILD_DIR" -j "${AMPKIT_JOBS:-$(nproc)}" --target $(printf 'fuzz_%s ' "${targets[@]}")

export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1"  # torch's process-lifetime allocations
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p "$BUILD_DIR/crashes"
failed=()
for t in "${targets[@]}"; do
  bin="$BUILD_DIR/fuzz/fuzz_$t"
  seeds="tests/fuzz/corpus/$t"
  n=$(find "$seeds" -type f | wc -l)
  # Replay: every seed once (a fixed crash stays fixed).
  if ! timeout 600 "$bin" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 $(find "$seeds" -type f | sort) > "$BUILD_DIR/fuzz-$t-replay.log" 2>&1; then
    echo "fuzz $t: FAILED replaying its $n seed(s):"
    grep -m5 -E "ERROR|error|Exception|==" "$BUILD_DIR/fuzz-$t-replay.log" | sed 's/^/  /'
    failed+=("$t")
    continue
  fi
  if [ "$replay_only" = 1 ] || [ "$seconds" = 0 ]; then
    echo "fuzz $t: $n seed(s) replayed, no crash"
    continue
  fi
  mkdir -p "$BUILD_DIR/corpus/$t"
  # The outer timeout bounds libFuzzer's own out-of-memory report, which can take minutes.
  if timeout $((seconds + 180)) "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$BUILD_DIR/crashes/$t-" "$BUILD_DIR/corpus/$t" "$seeds" > "$BUILD_DIR/fuzz-$t.log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$BUILD_DIR/fuzz-$t.log")
    echo "fuzz $t: $n seed(s) replayed; ${runs:-?} inputs in ${seconds} s, no crash"
  else
    echo "fuzz $t: FAILED after fuzzing (input kept in $BUILD_DIR/crashes/):"
    grep -m8 -E "ERROR|Exception|SUMMARY|Test unit written" "$BUILD_DIR/fuzz-$t.log" | sed 's/^/  /'
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]} (logs: $BUILD_DIR/fuzz-*.log)"
  exit 1
fi
echo "fuzz: ${#targets[@]} target(s), no crash"
