#!/usr/bin/env bash
# The README's test command: set up if needed, build into build/, run the test suite.
# Extra arguments go to ctest (e.g. tools/test.sh -L fast, tools/test.sh -R registry).
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths under the checkout hash as relative, so clones in other folders (CI's) share the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
tools/setup.sh
BUILD_DIR=${AMPKIT_BUILD_DIR:-build}
JOBS=${AMPKIT_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAMPKIT_BUILD_TESTS=ON >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS" "$@"
