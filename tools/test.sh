#!/usr/bin/env bash
# The README's test command: set up if needed, build into build/, run the test suite.
# Extra arguments go to ctest (e.g. tools/test.sh -L unit, tools/test.sh -R registry).
#
#   tools/test.sh --instrumented [ctest arguments]
# builds into build-instrumented/ with AddressSanitizer + UndefinedBehaviorSanitizer + gcc coverage
# (CMake option AMPKIT_INSTRUMENT), runs the suite there with tools/sanitizers/env.sh's runtime
# options, fails on any sanitizer report (also from child processes), then prints the line and
# branch coverage of core/, plugins/, hosts/ and sdk/ and fails below AMPKIT_MIN_LINE_COVERAGE
# (default 90) percent of lines. HTML report: build-instrumented/coverage/index.html.
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths under the checkout hash as relative, so clones in other folders (CI's) share the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
instrumented=0
if [ "${1:-}" = --instrumented ]; then
  instrumented=1
  shift
fi
tools/setup.sh
JOBS=${AMPKIT_JOBS:-$(nproc)}
if [ $instrumented = 0 ]; then
  BUILD_DIR=${AMPKIT_BUILD_DIR:-build}
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAMPKIT_BUILD_TESTS=ON >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS"
  cd "$BUILD_DIR"
  ctest --output-on-failure -j "$JOBS" "$@"
  exit 0
fi

# The instrumented suite. The install test is left out: it builds the SDK examples against the
# installed archive with the user's flags, which would need the sanitizer runtimes linked in by hand.
# So is the Python package's (label python): an instrumented _C.so cannot load into a python3 that
# was not started with the sanitizer runtime first.
BUILD_DIR=${AMPKIT_INSTRUMENTED_BUILD_DIR:-build-instrumented}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAMPKIT_BUILD_TESTS=ON \
  -DAMPKIT_INSTRUMENT=ON >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
find "$BUILD_DIR" -name '*.gcda' -delete
export AMPKIT_SANITIZER_LOGS="$PWD/$BUILD_DIR/sanitizer-logs"
rm -rf "$AMPKIT_SANITIZER_LOGS" && mkdir -p "$AMPKIT_SANITIZER_LOGS"
# shellcheck source=sanitizers/env.sh
source tools/sanitizers/env.sh
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" -LE "install|python" "$@") || status=$?
reports=$(find "$AMPKIT_SANITIZER_LOGS" -type f | sort)
if [ -n "$reports" ]; then
  echo "sanitizers: $(echo "$reports" | wc -l) report(s):"
  for r in $reports; do
    echo "== $r"
    head -40 "$r"
  done
  status=1
else
  echo "sanitizers: 0 findings (ASan + UBSan, every process of the suite)"
fi
tools/coverage.sh "$BUILD_DIR" || status=1
exit $status
