#!/usr/bin/env bash
# The README's test command: set up if needed, build into build/, run the test suite.
# Extra arguments go to ctest (e.g. tools/test.sh -L unit, tools/test.sh -R registry).
#
#   tools/test.sh --instrumented [ctest arguments]
# copies the checkout to /var/tmp/ampkit-instrumented (below: why), builds into its
# build-instrumented/ with AddressSanitizer + UndefinedBehaviorSanitizer + gcc coverage
# (CMake option AMPKIT_INSTRUMENT), runs the suite there with tools/sanitizers/env.sh's runtime
# options, fails on any sanitizer report (also from child processes), then prints the line and
# branch coverage of core/, plugins/, hosts/ and sdk/ and fails below AMPKIT_MIN_LINE_COVERAGE
# (default 90) percent of lines. HTML report: /var/tmp/ampkit-instrumented/build-instrumented/coverage/index.html.
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
#
# ccache serves a --coverage compile only to the folder that made it (the .gcno names its folder:
# ccache hashes the absolute path), so a clone in a new folder, as CI's is, would compile the whole
# instrumented tree again: over an hour on 2 cores. Every checkout therefore builds and tests its
# instrumented tree in one place, a copy of its files under AMPKIT_INSTRUMENTED_ROOT (default
# /var/tmp/ampkit-instrumented): a session's run fills the cache CI's run reads, and CI's run the
# next one's. One instrumented run at a time per machine (a lock).
root=${AMPKIT_INSTRUMENTED_ROOT:-/var/tmp/ampkit-instrumented}
if [ "$PWD" != "$root" ]; then
  # The folder is emptied below: only one this script made (its marker file) or a new, empty one.
  if [ -n "$(ls -A "$root" 2> /dev/null)" ] && [ ! -f "$root/build-instrumented/.ampkit-instrumented-root" ]; then
    echo "test.sh: AMPKIT_INSTRUMENTED_ROOT=$root is a folder with files that tools/test.sh did not put there; name a new or empty folder" >&2
    exit 2
  fi
  mkdir -p "$root/build-instrumented"
  touch "$root/build-instrumented/.ampkit-instrumented-root"
  exec 9> "$root.lock"
  flock 9
  # tar keeps each file's time from the checkout, which can be older than an object built from the
  # previous copy (a file edited, then copied only after that build): ninja would keep the stale
  # object. Files whose content differs from the previous copy (its git index) are touched below.
  previous=$(git -C "$root" ls-files -s 2> /dev/null || true)
  find "$root" -mindepth 1 -maxdepth 1 ! -name build-instrumented -exec rm -rf {} +
  git ls-files -z --cached --others --exclude-standard |
    tar --null --ignore-failed-read -T - -cf - 2> /dev/null | tar -xf - -C "$root"
  # The source checks list the files with git (check_format): the copy is a repository of its own.
  git -C "$root" init -q && git -C "$root" add -A
  comm -13 <(echo "$previous" | sort) <(git -C "$root" ls-files -s | sort) | cut -f2- |
    (cd "$root" && xargs -r -d '\n' touch --)
  echo "instrumented: this checkout's files copied to $root, where the instrumented tree is built and tested"
  cd "$root"
  export CCACHE_BASEDIR="$root"
fi
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
