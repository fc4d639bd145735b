#!/usr/bin/env bash
# The static build: ampkit-train and ampkit-plugins with the built-in plugins linked in. Copied
# to a folder with no plugin files near it, they must list every built-in plugin as static and
# train with each, selected by its usual name, while plugin files still load beside them.
# Usage: test_static_plugins.sh TRAIN PLUGINS BUILD_PLUGIN_DIR BROKEN_PLUGIN_DIR WORK_DIR
set -euo pipefail
train=$1 plugins=$2 plugin_dir=$3 broken=$4 work=$5
fail() { echo "test_static_plugins: FAIL: $*" >&2; exit 1; }
json() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(($2))" "$1"; }

rm -rf "$work"
mkdir -p "$work/bin"
cp "$train" "$work/bin/ampkit-train"
cp "$plugins" "$work/bin/ampkit-plugins"
# One binary, nothing to find: no --plugin-dir, no AMPKIT_PLUGIN_PATH, no lib/ampkit/plugins.
export AMPKIT_PLUGIN_PATH=

"$work/bin/ampkit-plugins" list --json >"$work/list.json"
# Every built-in plugin file of the build tree is linked in, and nothing else is found.
builtin=$(cd "$plugin_dir" && ls libampkit-*.so | sed -E 's/^libampkit-(scaler|clipper|nan_policy|comm|fp8_recipe)-(.*)\.so$/\1 \2/' | sort)
static=$(json "$work/list.json" "'\n'.join(sorted(p['kind'] + ' ' + p['name'] for p in d['plugins'] if p['static']))")
[ "$builtin" = "$static" ] || fail "linked in: [$static], built-in files: [$builtin]"
[ "$(json "$work/list.json" "len(d['plugins']) == len([p for p in d['plugins'] if p['static']])")" = True ] ||
  fail "files found by a program with nothing near it: $(cat "$work/list.json")"
"$work/bin/ampkit-plugins" list >"$work/list.txt"
[ "$(grep -c '\[static\]$' "$work/list.txt")" -eq "$(echo "$builtin" | wc -l)" ] ||
  fail "the table does not mark every plugin [static]: $(cat "$work/list.txt")"
"$work/bin/ampkit-plugins" show norm | grep -qF "file:     (linked into this program)" || fail "show norm"

# Train with every built-in plugin, by name: run i takes the i-th plugin of each kind (cycled).
kinds=(scaler clipper nan_policy comm)  # the kinds ampkit-train selects: not fp8_recipe, an optional kind
declare -A names
for k in "${kinds[@]}"; do names[$k]=$(echo "$builtin" | awk -v k="$k" '$1 == k {print $2}' | xargs); done
runs=0
for k in "${kinds[@]}"; do
  n=$(echo "${names[$k]}" | wc -w)
  [ "$n" -gt "$runs" ] && runs=$n
done
for ((i = 0; i < runs; i++)); do
  args=() expected=()
  for k in "${kinds[@]}"; do
    read -r -a list <<<"${names[$k]}"
    name=${list[$((i % ${#list[@]}))]}
    if [ "$k" = comm ] && [ "$name" = nccl ] && ! nvidia-smi -L >/dev/null 2>&1; then
      # The documented exception: nccl needs a GPU. Without one it must refuse with the
      # documented line and exit code 2 (usage); this run then trains with gloo instead.
      rc=0
      "$work/bin/ampkit-train" --workload synthetic --steps 1 --batch-size 8 --progress never --comm nccl \
        >"$work/nccl.log" 2>&1 || rc=$?
      [ "$rc" -eq 2 ] && grep -qF "comm 'nccl' needs CUDA" "$work/nccl.log" ||
        fail "nccl without a GPU: exit $rc, $(cat "$work/nccl.log")"
      name=gloo
    fi
    args+=("--${k/_/-}" "$name")
    expected+=("'$name'")
  done
  echo "test_static_plugins: ampkit-train ${args[*]}"
  "$work/bin/ampkit-train" --workload synthetic --precision fp32 --steps 3 --synthetic-inputs 16 \
    --synthetic-width 32 --synthetic-depth 2 --batch-size 32 --progress never "${args[@]}" \
    --summary "$work/run$i.json" >"$work/run$i.log" 2>&1 || { cat "$work/run$i.log"; fail "exit $?"; }
  got=$(json "$work/run$i.json" "[d['plugins'][k]['name'] for k in ('scaler', 'clipper', 'nan_policy', 'comm')], d['status']")
  want="([$(IFS=,; echo "${expected[*]}" | sed "s/,/, /g")], 'completed')"
  [ "$got" = "$want" ] || fail "summary $got, expected $want"
done

# Plugin files still load beside the linked-in ones (by --plugin-dir, by path).
"$work/bin/ampkit-train" --workload synthetic --steps 2 --batch-size 32 --progress never \
  --plugin-dir "$broken/stripped" --scaler stripped --summary "$work/dynamic.json" >"$work/dynamic.log" 2>&1 ||
  { cat "$work/dynamic.log"; fail "a plugin file beside the static ones"; }
[ "$(json "$work/dynamic.json" "d['plugins']['scaler']['name']")" = stripped ] || fail "dynamic scaler"

# In the build tree the same names exist as files too: the linked-in plugin wins, the file is
# marked, and selecting the file by path still works.
"$plugins" list --plugin-dir "$plugin_dir" | grep -E "^clipper +norm .*\[shadowed by static\]$" >/dev/null ||
  fail "a shadowed file is not marked"
"$train" --workload synthetic --steps 2 --batch-size 32 --progress never --plugin-dir "$plugin_dir" \
  --clipper "$plugin_dir/libampkit-clipper-norm.so" --summary "$work/path.json" >"$work/path.log" 2>&1 ||
  { cat "$work/path.log"; fail "selecting a shadowed file by path"; }
echo "test_static_plugins: ok ($runs runs)"
