#!/usr/bin/env bash
# What a new user's first run meets on a busy machine: tools/test.sh on RUNS fresh clones of COMMIT,
# one after another, while an uncached Release build of another clone (-j1, ccache off, started
# again whenever it ends) loads the machine. One line per run: exit code, seconds, load average,
# ctest's tally. Stops at the first run that fails; exit 0 when every run passed.
#   tools/test_under_load.sh [--runs N] [--work DIR] [COMMIT]     (defaults: 3, a new /tmp folder, HEAD)
# Each run takes 14-27 min on 2 cores beside the build (docs/reliability.md, "A fresh clone under
# load"); the clones share the compiler cache, the loading build does not use it.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
runs=3 work="" commit=HEAD
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=${2:-}; shift 2 ;;
    --work) work=${2:-}; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "test_under_load.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) commit=$1; shift ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "test_under_load.sh: --runs takes a positive whole number, not '$runs'" >&2; exit 2; }
sha=$(git -C "$repo" rev-parse --verify --quiet "$commit^{commit}") ||
  { echo "test_under_load.sh: '$commit' is not a commit of $repo" >&2; exit 2; }
commit=$sha
work=${work:-$(mktemp -d /tmp/ampkit-under-load-XXXXXX)}
mkdir -p "$work" || exit 2
say() { echo "$(date -u +%T) $*" | tee -a "$work/summary.txt"; }

clone() {  # clone DIR: a fresh clone of the commit
  rm -rf "$1" && git clone -q "$repo" "$1" && git -C "$1" checkout -q "$commit"
}

clone "$work/load" || exit 2
# The load and each run are process groups of their own (setsid), so that an exit or an interrupt
# stops them whole, compilers and ctest's children included, and nothing else on the machine.
groups=()
stop() {
  local g
  for g in "${groups[@]}"; do kill -TERM -- "-$g" 2> /dev/null; done
}
trap stop EXIT
trap 'exit 130' INT TERM
# shellcheck disable=SC2016  # the inner script's own arguments
setsid bash -c '
  cd "$1" || exit 1
  export CCACHE_DISABLE=1
  cmake -S . -B build-load -G Ninja -DCMAKE_BUILD_TYPE=Release -DAMPKIT_BUILD_TESTS=ON > "$2" 2>&1
  while true; do
    ninja -C build-load clean > /dev/null 2>&1
    ninja -C build-load -j1 >> "$2" 2>&1
  done' _ "$work/load" "$work/load.log" &
groups+=($!)
say "commit $commit, $runs run(s), load: an uncached Release build at -j1 (log $work/load.log)"

for i in $(seq 1 "$runs"); do
  clone "$work/run$i" || exit 2
  start=$SECONDS
  # shellcheck disable=SC2016
  setsid bash -c 'cd "$1" && exec tools/test.sh' _ "$work/run$i" > "$work/run$i.log" 2>&1 &
  groups+=($!)
  wait $!
  rc=$?
  say "run $i: exit $rc after $((SECONDS - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg)," \
    "$(grep -E 'tests passed|tests failed' "$work/run$i.log" | tail -1) (log $work/run$i.log)"
  [ $rc -eq 0 ] || exit 1
  rm -rf "$work/run$i/build" "$work/run$i/build-pip"
done
