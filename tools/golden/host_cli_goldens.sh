#!/usr/bin/env bash
# Writes ampkit-train's --help / --print-config / error outputs for every case in
# tests/data/host/cases.txt into tests/data/host/NAME.txt (exit code on the first line), from the
# binaries in BIN_DIR. test_cli compares the current build against these files, so a change to
# the option table that alters what users see shows up as a diff. Usage: host_cli_goldens.sh BIN_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)
data=$(cd "$(dirname "$0")/../../tests/data/host" && pwd)
plugin_dir=$(cd "$bin/../lib/ampkit/plugins" && pwd)
while IFS='|' read -r name env args; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  args=${args//@DATA@/$data}
  set +e
  out=$(cd "$data" && env -u AMPKIT_PLUGIN_PATH $env "$bin/ampkit-train" $args 2>&1)
  code=$?
  set -e
  { echo "exit $code"
    printf '%s\n' "$out" | sed -e "s|$plugin_dir|<PLUGIN_DIR>|g" -e "s|$data|<DATA>|g" \
      -e '/^ampkit-train: note: this CPU/d'
  } > "$data/$name.txt"
done < "$data/cases.txt"
