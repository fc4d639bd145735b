#!/usr/bin/env bash
# The nccl comm plugin on a GPU: 1 rank, and 1 vs 2 ranks where there are two GPUs; with two, the
# 2-rank run takes the deferred step (--host-sync auto on a GPU) and is run again with
# --host-sync step: the same losses and parameters. Without a GPU it exits 77, which ctest
# reports as skipped (SKIP_RETURN_CODE), not as passed.
# Usage: test_nccl.sh BIN_DIR WORK_DIR
set -euo pipefail
bin=$1 work=$2
fail() { echo "test_nccl: FAIL: $*" >&2; exit 1; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 1 ]; then
  echo "test_nccl: no GPU visible: skipped"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
json() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(($2))" "$1"; }
args=(--workload synthetic --device cuda --precision bf16 --steps 30 --progress never --seed 1)
"$bin/ampkit-train" "${args[@]}" --comm nccl --batch-size 64 --metrics "$work/one.jsonl" \
  --summary "$work/one.json" >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
[ "$(json "$work/one.json" "d['plugins']['comm']['name'], d['status']")" = "('nccl', 'completed')" ] ||
  fail "summary $(cat "$work/one.json")"
if [ "$gpus" -ge 2 ]; then
  "$bin/ampkit-launch" --nproc-per-node 2 --master-port 29731 -- "$bin/ampkit-train" "${args[@]}" \
    --comm nccl --batch-size 32 --metrics "$work/two.jsonl" --summary "$work/two.json" >"$work/two.log" 2>&1 ||
    { cat "$work/two.log"; fail "2 ranks"; }
  [ "$(json "$work/two.json" "d['ranks_identical']")" = True ] || fail "ranks differ"
  [ "$(json "$work/two.json" "d['step']['host_sync']")" = deferred ] ||
    fail "2 ranks: not the deferred step: $(json "$work/two.json" "d['step']")"
  "$bin/ampkit-launch" --nproc-per-node 2 --master-port 29733 -- "$bin/ampkit-train" "${args[@]}" \
    --comm nccl --batch-size 32 --host-sync step --metrics "$work/two-step.jsonl" \
    --summary "$work/two-step.json" >"$work/two-step.log" 2>&1 || { cat "$work/two-step.log"; fail "2 ranks, step"; }
  [ "$(json "$work/two.json" "d['param_sha256']")" = "$(json "$work/two-step.json" "d['param_sha256']")" ] ||
    fail "2 ranks: deferred and synchronous parameters differ"
  cmp -s <(python3 -c "import json,sys; [print(json.loads(l)['loss']) for l in open(sys.argv[1])]" "$work/two.jsonl") \
    <(python3 -c "import json,sys; [print(json.loads(l)['loss']) for l in open(sys.argv[1])]" "$work/two-step.jsonl") ||
    fail "2 ranks: deferred and synchronous losses differ"
  python3 - "$work/one.jsonl" "$work/two.jsonl" <<'PY' || fail "1 vs 2 ranks"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"test_nccl: bf16, 1 vs 2 ranks: max rel loss diff {worst:.2e}")
sys.exit(0 if len(a) == len(b) == 30 and worst < 2e-3 else 1)
PY
fi
echo "test_nccl: passed on $gpus GPU(s)"
