#!/usr/bin/env bash
# The installed package as a third party uses it: install the build into a fresh prefix, build
# the SDK examples (installed under share/ampkit/examples) against that prefix alone, then load
# the example plugin by name in the installed ampkit-train and ampkit-plugins, and train with
# the embedding example. Usage: test_install.sh BUILD_DIR WORK_DIR GENERATOR [COMPILER_LAUNCHER]
set -euo pipefail
build=$1 work=$2 generator=$3 launcher=${4:-}
prefix=$work/prefix
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }
step() { echo "test_install: [${SECONDS} s] $*"; }
json() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(($2))" "$1"; }

rm -rf "$work"
mkdir -p "$work"
step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in bin/ampkit-train bin/ampkit-plugins lib/libampkit.a include/ampkit/plugin.h include/ampkit/trainer.h \
         lib/cmake/ampkit/ampkitConfig.cmake lib/cmake/ampkit/LibTorchWheel.cmake \
         lib/ampkit/plugins/libampkit-clipper-norm.so share/ampkit/examples/ema_clipper/CMakeLists.txt; do
  [ -e "$prefix/$f" ] || fail "$f was not installed"
done
# The package must not lead back to ampkit's source or build tree (a python in a .venv inside the
# checkout is where torch comes from, not part of ampkit, so it may be named).
src=$(cd "$(dirname "$0")/../.." && pwd)
if grep -rnF -e "$src/" "$prefix/lib/cmake" "$prefix/share" | grep -vF "$src/.venv/"; then
  fail "installed CMake files name the source or build tree (above)"
fi

# Third-party builds: CMAKE_PREFIX_PATH is the only hint; no registry, no system package dirs.
configure() {  # SOURCE BINARY
  cmake -S "$1" -B "$2" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher} \
    >"$2.configure.log" 2>&1 || { cat "$2.configure.log"; fail "configuring $1"; }
  grep -qxF "ampkit_DIR:PATH=$prefix/lib/cmake/ampkit" "$2/CMakeCache.txt" ||
    fail "$1 found ampkit elsewhere: $(grep ampkit_DIR "$2/CMakeCache.txt")"
  cmake --build "$2" -j "${AMPKIT_JOBS:-1}" >"$2.build.log" 2>&1 || { cat "$2.build.log"; fail "building $1"; }
}
examples=$prefix/share/ampkit/examples
ema=$work/ema_clipper
step "building the example plugin out of tree"
configure "$examples/ema_clipper" "$ema"
[ -f "$ema/libampkit-clipper-ema_norm.so" ] || fail "ampkit_add_plugin did not make libampkit-clipper-ema_norm.so"
"$ema/test_ema_clipper" || fail "the example's host-free unit test"

step "ampkit-plugins list with AMPKIT_PLUGIN_PATH=$ema"
AMPKIT_PLUGIN_PATH=$ema "$prefix/bin/ampkit-plugins" list --json >"$work/list.json"
[ "$(json "$work/list.json" "[p['version'] for p in d['plugins'] if p['kind'] == 'clipper' and p['name'] == 'ema_norm']")" = "['1.0.0']" ] ||
  fail "ema_norm not listed once: $(cat "$work/list.json")"
[ "$(json "$work/list.json" "d['search_path'][1:]")" = "['$prefix/lib/ampkit/plugins']" ] ||
  fail "installed ampkit-plugins searches $(json "$work/list.json" "d['search_path']")"
[ "$(json "$work/list.json" "len(d['problems'])")" = 0 ] || fail "problems listed: $(cat "$work/list.json")"
AMPKIT_PLUGIN_PATH=$ema "$prefix/bin/ampkit-plugins" list | grep -E "^clipper +ema_norm +1.0.0 " ||
  fail "ema_norm missing from the table"

step "ampkit-train --clipper ema_norm"
AMPKIT_PLUGIN_PATH=$ema "$prefix/bin/ampkit-train" --workload synthetic --steps 5 --clipper ema_norm \
  --opt clipper.warmup_steps=2 --synthetic-inputs 16 --synthetic-width 32 --synthetic-depth 2 \
  --batch-size 32 --progress never --summary "$work/train.json" --metrics "$work/train.jsonl" ||
  fail "ampkit-train exited with $?"
[ "$(json "$work/train.json" "d['plugins']['clipper']['name'], d['plugins']['clipper']['version'], d['steps'], d['status']")" = \
  "('ema_norm', '1.0.0', 5, 'completed')" ] || fail "summary: $(cat "$work/train.json")"
[ "$(wc -l <"$work/train.jsonl")" -eq 5 ] || fail "expected 5 metrics records"

step "building the embedding example out of tree, with yaml-cpp and Boost.Program_options hidden"
# ampkit::ampkit is libampkit alone: ampkit-train's configuration (and its Boost.Program_options
# and yaml-cpp) stays in hosts/train. In a private mount namespace, empty folders and /dev/null are
# mounted over those packages' CMake files, headers and libraries, so the consumer cannot find
# them; where namespaces are not permitted, only the link-line check below runs (it says so).
embed=$work/embed_trainer
hide=""
for p in /usr/lib/*/cmake/boost_program_options-* /usr/lib/*/cmake/yaml-cpp /usr/share/cmake/yaml-cpp \
         /usr/include/yaml-cpp /usr/include/boost/program_options /usr/include/boost/program_options.hpp \
         /usr/lib/*/libyaml-cpp* /usr/lib/*/libboost_program_options*; do
  [ -e "$p" ] || continue
  if [ -d "$p" ]; then hide="$hide mount --bind $work/empty $p &&"; else hide="$hide mount --bind /dev/null $p &&"; fi
done
mkdir -p "$work/empty"
consumer="cmake -S $examples/embed_trainer -B $embed -G '$generator' -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH=$prefix -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher} >$embed.configure.log 2>&1 &&
  cmake --build $embed -j ${AMPKIT_JOBS:-1} >$embed.build.log 2>&1"
if unshare -m true 2>/dev/null; then
  unshare -m bash -c "$hide [ ! -e /usr/include/yaml-cpp/yaml.h ] && $consumer" ||
    { cat "$embed.configure.log" "$embed.build.log" 2>/dev/null; fail "building embed_trainer with yaml-cpp and Boost.Program_options hidden"; }
else
  echo "test_install: note: no private mount namespace here; yaml-cpp and Boost.Program_options stay visible, only the link line is checked"
  bash -c "$consumer" || { cat "$embed.configure.log" "$embed.build.log"; fail "building embed_trainer"; }
fi
if grep -E "libyaml-cpp|libboost_program_options" "$embed/build.ninja" "$embed"/CMakeFiles/*/link.txt 2>/dev/null; then
  fail "embed_trainer links yaml-cpp or Boost.Program_options (above)"
fi
AMPKIT_PLUGIN_PATH=$ema "$embed/embed_trainer" --precision fp16 --scaler dynamic --clipper ema_norm \
  --nan-policy backoff --steps 40 --opt clipper.factor=3 --metrics "$work/embed.jsonl" >"$work/embed.json" ||
  fail "embed_trainer exited with $?: $(cat "$work/embed.json")"
cat "$work/embed.json"
[ "$(json "$work/embed.json" "[d['plugins'][k]['name'] for k in ('scaler', 'clipper', 'nan_policy', 'comm')], d['plugins']['clipper']['options']['factor'], d['steps']")" = \
  "(['dynamic', 'ema_norm', 'backoff', 'local'], '3', 40)" ] || fail "embed summary"
[ "$(json "$work/embed.json" "d['final_loss'] < d['first_loss'] / 2")" = True ] || fail "embed_trainer did not learn"
python3 - "$work/embed.jsonl" <<'PY' || fail "embed metrics do not name the strategies"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
assert len(records) == 40, len(records)
assert all(r["plugins"] == {"scaler": "dynamic", "clipper": "ema_norm", "nan_policy": "backoff", "comm": "local"}
           for r in records)
assert records[0]["scale"] == 65536.0, records[0]["scale"]  # the dynamic scaler's default initial scale
PY
step "ok"
