#!/usr/bin/env bash
# The installed package as a third party uses it: install the build into a fresh prefix, build
# the SDK examples (installed under share/ampkit/examples) against that prefix alone, then load
# the example plugin by name in the installed ampkit-train and ampkit-plugins, and train with
# the embedding example (core/examples, installed beside them). Usage: test_install.sh BUILD_DIR WORK_DIR GENERATOR [COMPILER_LAUNCHER]
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
         lib/ampkit/plugins/libampkit-clipper-norm.so share/ampkit/examples/ema_clipper/CMakeLists.txt \
         include/ampkit/testing.h include/ampkit/nan_policy_plugin.h share/doc/ampkit/plugin-authoring.md; do
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

# Runs a command with the development files of the given packages made invisible: in a private
# mount namespace, an empty folder or /dev/null is mounted over each path (links are left: their
# targets are run-time libraries, and the headers are hidden anyway). Where namespaces are
# not permitted it runs the command as it is and says so (the link-line checks below still hold).
mkdir -p "$work/empty"
hidden() {  # "PATH GLOBS" COMMAND
  local globs=$1 hide=""; shift
  for p in $globs; do
    [ -e "$p" ] && [ ! -L "$p" ] || continue  # a bind mount over a link would hide its target (libssl.so.3)
    if [ -d "$p" ]; then hide="$hide mount --bind $work/empty $p &&"; else hide="$hide mount --bind /dev/null $p &&"; fi
  done
  if unshare -m true 2>/dev/null; then
    unshare -m bash -c "$hide $*"
  else
    echo "test_install: note: no private mount namespace here; nothing is hidden for: $*"
    bash -c "$*"
  fi
}
libampkit_only="/usr/lib/*/cmake/boost_program_options-* /usr/lib/*/cmake/yaml-cpp /usr/share/cmake/yaml-cpp \
  /usr/include/yaml-cpp /usr/include/boost/program_options /usr/include/boost/program_options.hpp \
  /usr/lib/*/libyaml-cpp* /usr/lib/*/libboost_program_options*"
# A plugin author's project: find_package(ampkit COMPONENTS sdk) must not need these either.
sdk_only="$libampkit_only /usr/lib/*/cmake/nlohmann_json /usr/share/cmake/nlohmann_json* /usr/include/nlohmann \
  /usr/include/openssl /usr/lib/*/libcrypto.so /usr/lib/*/libcrypto.a /usr/lib/*/libssl.so /usr/lib/*/libssl.a"

step "building the example plugins out of tree (COMPONENTS sdk; nlohmann-json, OpenSSL, yaml-cpp, Boost.PO hidden)"
ema=$work/ema_clipper
streak=$work/streak_policy
pow2=$work/pow2_recipe
hidden "$sdk_only" "$(declare -f configure fail); generator='$generator'; prefix='$prefix'; launcher='$launcher'; \
  configure '$examples/ema_clipper' '$ema' && configure '$examples/streak_policy' '$streak' && \
  configure '$examples/pow2_recipe' '$pow2'" ||
  fail "building the example plugins against COMPONENTS sdk with the packages hidden"
[ -f "$ema/libampkit-clipper-ema_norm.so" ] || fail "ampkit_add_plugin did not make libampkit-clipper-ema_norm.so"
"$ema/test_ema_clipper" || fail "the ema_clipper example's unit test (ampkit/testing.h)"
"$streak/test_streak_policy" || fail "the streak_policy example's unit test (ampkit/testing.h)"
"$pow2/test_pow2_recipe" || fail "the pow2_recipe example's unit test (ampkit/testing.h)"
# A NaN policy's interface passes no tensors: its plugin records no dependency on torch.
for so in "$streak/libampkit-nan_policy-bad_streak.so" "$pow2/libampkit-fp8_recipe-pow2_delayed.so"; do
  if readelf -d "$so" | grep -E "NEEDED.*(torch|c10)"; then fail "$so depends on LibTorch (above)"; fi
done
# No empty run-path entry (it would search the current folder).
for so in "$ema/libampkit-clipper-ema_norm.so" "$streak/libampkit-nan_policy-bad_streak.so"; do
  if readelf -d "$so" | grep -E "R(UN)?PATH" | grep -E "\[:|::|:\]"; then fail "$so has an empty run-path entry (above)"; fi
done

step "a plugin whose AMPKIT_PLUGIN disagrees with ampkit_add_plugin(NAME) does not build"
mismatch=$work/name_mismatch
mkdir -p "$mismatch/src"
cat >"$mismatch/src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(name_mismatch VERSION 1.0.0 LANGUAGES CXX)
find_package(ampkit REQUIRED COMPONENTS sdk)
ampkit_add_plugin(mismatch KIND scaler NAME declared SOURCES mismatch.cpp)
CMAKE
cat >"$mismatch/src/mismatch.cpp" <<'CPP'
#include <ampkit/scaler_plugin.h>
struct One final : ampkit::LossScaler {
  explicit One(const ampkit::OptionValues&) {}
  double scale() const override { return 1.0; }
  void update(const ampkit::StepStats&) override {}
};
AMPKIT_PLUGIN(scaler, other, One, "Named 'other' in the source, 'declared' in CMake")
CPP
if (configure "$mismatch/src" "$mismatch/build") >/dev/null 2>&1; then
  fail "a plugin named 'other' in AMPKIT_PLUGIN but 'declared' in ampkit_add_plugin built"
fi
grep -q "disagrees with ampkit_add_plugin(NAME ...) in CMake" "$mismatch/build.build.log" ||
  fail "the name mismatch failed without the expected message: $(tail -20 "$mismatch/build.build.log")"

step "ampkit-plugins list with AMPKIT_PLUGIN_PATH=$ema"
AMPKIT_PLUGIN_PATH=$ema "$prefix/bin/ampkit-plugins" list --json >"$work/list.json"
[ "$(json "$work/list.json" "[p['version'] for p in d['plugins'] if p['kind'] == 'clipper' and p['name'] == 'ema_norm']")" = "['1.0.0']" ] ||
  fail "ema_norm not listed once: $(cat "$work/list.json")"
[ "$(json "$work/list.json" "d['search_path'][1:]")" = "['$prefix/lib/ampkit/plugins']" ] ||
  fail "installed ampkit-plugins searches $(json "$work/list.json" "d['search_path']")"
[ "$(json "$work/list.json" "len(d['problems'])")" = 0 ] || fail "problems listed: $(cat "$work/list.json")"
AMPKIT_PLUGIN_PATH=$ema "$prefix/bin/ampkit-plugins" list | grep -E "^clipper +ema_norm +1.0.0 " ||
  fail "ema_norm missing from the table"

step "ampkit-plugins show pow2_delayed: the out-of-tree fp8 recipe found and loaded by name"
out=$(AMPKIT_PLUGIN_PATH=$pow2 "$prefix/bin/ampkit-plugins" show pow2_delayed 2>&1) || fail "show exited with $?: $out"
grep -qE "window +int in \[1, 4096\] +16" <<<"$out" || fail "pow2_delayed's options not shown: $out"

step "ampkit-train --clipper ema_norm"
AMPKIT_PLUGIN_PATH=$ema "$prefix/bin/ampkit-train" --workload synthetic --steps 5 --clipper ema_norm \
  --opt clipper.warmup_steps=2 --synthetic-inputs 16 --synthetic-width 32 --synthetic-depth 2 \
  --batch-size 32 --progress never --summary "$work/train.json" --metrics "$work/train.jsonl" ||
  fail "ampkit-train exited with $?"
[ "$(json "$work/train.json" "d['plugins']['clipper']['name'], d['plugins']['clipper']['version'], d['steps'], d['status']")" = \
  "('ema_norm', '1.0.0', 5, 'completed')" ] || fail "summary: $(cat "$work/train.json")"
[ "$(wc -l <"$work/train.jsonl")" -eq 5 ] || fail "expected 5 metrics records"

step "ampkit-train --clipper ema_norm --host-sync deferred: synchronous, said once"
out=$(AMPKIT_PLUGIN_PATH=$ema "$prefix/bin/ampkit-train" --workload synthetic --steps 3 --clipper ema_norm \
  --host-sync deferred --synthetic-inputs 16 --synthetic-width 32 --synthetic-depth 2 --batch-size 32 \
  --progress never --summary "$work/sync.json" 2>&1) || fail "ampkit-train exited with $?: $out"
[ "$(printf '%s\n' "$out" | grep -c "warning: the step stays synchronous: clipper 'ema_norm' has no device form")" = 1 ] ||
  fail "no single line naming ema_norm: $out"
[ "$(json "$work/sync.json" "d['step']['host_sync'], d['step']['host_reads']")" = "('step', 3)" ] ||
  fail "summary step: $(cat "$work/sync.json")"

step "ampkit.GradScaler(clipper='ema_norm') from Python, by name"
AMPKIT_PLUGIN_PATH=$ema PYTHONPATH=$build/python python3 - <<'PY' || fail "the ema_norm plugin from Python"
import torch, ampkit
assert ("clipper", "ema_norm", "1.0.0") in {(p.kind, p.name, p.version) for p in ampkit.plugins()}
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the same gradient every step
scaler = ampkit.GradScaler("cpu", clipper="ema_norm", opt={"clipper.warmup_steps": 2})
for step, spike in enumerate([1, 1, 1, 100]):
    opt.zero_grad()
    scaler.scale(model(torch.ones(3, 4)).sum() * spike).backward()
    assert scaler.step(opt)
    scaler.update()
    rec = scaler.last_step
    if step < 2:  # warm-up: measured, not clipped
        assert rec["clip_threshold"] == 0 and not rec["clipped"], rec
        norm = rec["grad_norm"]
# the spike is clipped to factor (2) x the average of the three healthy norms
assert rec["clipped"] and abs(rec["clip_threshold"] - 2 * norm) < 1e-9 * norm, rec
assert abs(rec["grad_norm_clipped"] - 2 * norm) < 1e-5 * norm, rec
print("ema_norm from Python: threshold", rec["clip_threshold"], "clipped norm", rec["grad_norm_clipped"])
PY

step "ampkit-train --nan-policy bad_streak (the torch-free example plugin)"
rc=0
AMPKIT_PLUGIN_PATH=$streak "$prefix/bin/ampkit-train" --workload synthetic --steps 6 --nan-policy bad_streak \
  --opt nan_policy.max_streak=2 --inject nan@step=2 --inject nan@step=3 --synthetic-inputs 16 --synthetic-width 32 \
  --synthetic-depth 2 --batch-size 32 --progress never --summary "$work/streak.json" >"$work/streak.log" 2>&1 ||
  rc=$?
[ "$rc" = 5 ] || fail "bad_streak: expected exit 5 (aborted) after two bad steps, got $rc: $(cat "$work/streak.log")"
[ "$(json "$work/streak.json" "d['status'], d['plugins']['nan_policy']['name']")" = "('aborted', 'bad_streak')" ] ||
  fail "bad_streak summary: $(cat "$work/streak.json")"

step "building the embedding example out of tree, with yaml-cpp and Boost.Program_options hidden"
# ampkit::ampkit is libampkit alone: ampkit-train's configuration (and its Boost.Program_options
# and yaml-cpp) stays in hosts/train. In a private mount namespace, empty folders and /dev/null are
# mounted over those packages' CMake files, headers and libraries, so the consumer cannot find
# them; where namespaces are not permitted, only the link-line check below runs (it says so).
embed=$work/embed_trainer
hidden "$libampkit_only" "$(declare -f configure fail); generator='$generator'; prefix='$prefix'; launcher='$launcher'; \
  configure '$examples/embed_trainer' '$embed'" ||
  fail "building embed_trainer with yaml-cpp and Boost.Program_options hidden"
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
