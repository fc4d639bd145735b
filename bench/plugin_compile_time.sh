#!/usr/bin/env bash
# What one plugin costs its author to build: compiles the minimal plugin of each kind in
# bench/minimal_plugins/ (each with its kind's header) three times and prints the best user
# CPU time, the preprocessed lines, and the libraries the plugin needs once linked as
# ampkit_add_plugin links it. With OLD_INCLUDE
# (an older SDK's include folder, e.g. from `git worktree add /tmp/old <commit>`), the same
# plugins are compiled against it with <ampkit/plugin.h> in the same run, for the comparison.
#   bench/plugin_compile_time.sh [OLD_INCLUDE]
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:-}
torch=$(python3 -c "import os, torch; print(os.path.dirname(torch.__file__))")
work=$(mktemp -d /tmp/ampkit-compile-XXXXXX)
trap 'rm -rf "$work"' EXIT
flags=(-std=c++17 -O2 -fPIC -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=1 -DAMPKIT_PLUGIN_VERSION='"1.0"'
       -DBOOST_DLL_USE_STD_FS -isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include")

best_user_seconds() {  # INCLUDE SOURCE
  local best=""
  for _ in 1 2 3; do
    local t
    t=$( { /usr/bin/time -f "%U" g++ "${flags[@]}" -I"$1" -c "$2" -o "$work/p.o"; } 2>&1 | tail -1)
    best=$(python3 -c "print(min(float(x) for x in '$best $t'.split()))")
  done
  echo "$best"
}

printf "%-12s  %-26s  %10s  %12s  %s\n" kind header "user s" "pp lines" "NEEDED"
for kind in scaler nan_policy clipper comm; do
  src=bench/minimal_plugins/$kind.cpp
  lines=$(g++ "${flags[@]}" -Isdk/include -E "$src" | wc -l)
  g++ "${flags[@]}" -Isdk/include -c "$src" -o "$work/$kind.o"
  # As ampkit_add_plugin links: LibTorch's CPU libraries only for kinds whose interface passes
  # tensors (clipper, comm), with --as-needed.
  torch_libs=()
  case $kind in clipper|comm) torch_libs=("$torch/lib/libtorch_cpu.so" "$torch/lib/libc10.so") ;; esac
  g++ -shared -Wl,--as-needed -Wl,--no-undefined -o "$work/$kind.so" "$work/$kind.o" "${torch_libs[@]}"
  needed=$(readelf -d "$work/$kind.so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  printf "%-12s  %-26s  %10s  %12s  %s\n" "$kind" "ampkit/${kind}_plugin.h" "$(best_user_seconds sdk/include "$src")" "$lines" "$needed"
  if [ -n "$old" ]; then
    sed "s|#include <ampkit/${kind}_plugin.h>|#include <ampkit/plugin.h>|" "$src" >"$work/old_$kind.cpp"
    lines=$(g++ "${flags[@]}" -I"$old" -E "$work/old_$kind.cpp" | wc -l)
    g++ "${flags[@]}" -I"$old" -c "$work/old_$kind.cpp" -o "$work/old_$kind.o"
    # As ampkit_add_plugin linked every plugin before ABI 3: with LibTorch's CPU libraries.
    g++ -shared -Wl,--no-undefined -o "$work/old_$kind.so" "$work/old_$kind.o" \
        "$torch/lib/libtorch_cpu.so" "$torch/lib/libc10.so"
    needed=$(readelf -d "$work/old_$kind.so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    printf "%-12s  %-26s  %10s  %12s  %s\n" "$kind" "old: ampkit/plugin.h" "$(best_user_seconds "$old" "$work/old_$kind.cpp")" "$lines" "$needed"
  fi
done
