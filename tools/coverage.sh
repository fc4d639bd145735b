#!/usr/bin/env bash
# Line and branch coverage of an instrumented build's last test run (tools/test.sh --instrumented
# calls it): core/, plugins/, hosts/ and sdk/ (headers included), tests and benchmarks left out.
# Prints the summary, writes BUILD_DIR/coverage/index.html (an artefact, not committed) and exits
# 1 when line coverage is below AMPKIT_MIN_LINE_COVERAGE percent (default 90).
#
#   tools/coverage.sh [BUILD_DIR]     (default: the last instrumented run's, in the folder where
#                                     tools/test.sh --instrumented builds, AMPKIT_INSTRUMENTED_ROOT,
#                                     default /var/tmp/ampkit-instrumented)
set -euo pipefail
cd "$(dirname "$0")/.."
root=${AMPKIT_INSTRUMENTED_ROOT:-/var/tmp/ampkit-instrumented}
if [ $# = 0 ] && [ -d "$root/build-instrumented" ]; then cd "$root"; fi
build=${1:-build-instrumented}
min=${AMPKIT_MIN_LINE_COVERAGE:-90}
command -v gcovr > /dev/null || { echo "coverage.sh: gcovr is missing (tools/setup.sh installs it)" >&2; exit 2; }
[ -n "$(find "$build" -name '*.gcda' -print -quit 2>/dev/null)" ] ||
  { echo "coverage.sh: no coverage data in $build (run tools/test.sh --instrumented)" >&2; exit 2; }
mkdir -p "$build/coverage"
# Branches the compiler adds for exception unwinding are not decisions of ours: left out.
gcovr --root . --object-directory "$build" -j "$(nproc)" \
  --filter 'core/' --filter 'plugins/' --filter 'hosts/' --filter 'sdk/' \
  --exclude '.*/tests/.*' --exclude 'tools/.*' --exclude 'sdk/examples/.*' \
  --exclude-throw-branches --exclude-unreachable-branches \
  --html-details "$build/coverage/index.html" --print-summary --fail-under-line "$min" \
  > "$build/coverage/summary.txt" 2>&1 || code=$?
grep -E "^(lines|functions|branches):" "$build/coverage/summary.txt" | sed 's/^/coverage: /'
if [ "${code:-0}" != 0 ]; then
  tail -3 "$build/coverage/summary.txt" >&2
  echo "coverage: FAILED: line coverage is below $min% (report: $build/coverage/index.html)" >&2
  exit 1
fi
echo "coverage: line coverage at least $min% (report: $build/coverage/index.html)"
