#!/usr/bin/env bash
# One command for a machine with a GPU (issue 20): runs ampkit's CUDA checks from an existing build
# and writes a Markdown report (format: docs/benchmarks.md, "What has run on a GPU").
#
#   tools/gpu-check.sh [--build DIR] [--report FILE] [--steps N]
#
# Without a GPU it prints "no GPU: nothing to check" and exits 0 (CI runs it that way). The build
# may come from another machine (Release, Boost and yaml-cpp linked statically, carried over):
# LibTorch's libraries are taken from the python torch found here. Exit status: 0 when every check
# that ran passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build report=gpu-report.md steps=100
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "${gpus:-0}" = 0 ]; then
  echo "no GPU: nothing to check"
  exit 0
fi
[ -x "$build/bin/ampkit-train" ] || { echo "gpu-check.sh: no build in $build (run tools/test.sh or carry one)" >&2; exit 2; }
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

{
  echo "# ampkit on a GPU: $(date -u +%Y-%m-%d)"
  echo
  echo "Device: $("$python" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")')"
  echo "($gpus visible); torch $("$python" -c 'import torch; print(torch.__version__)'); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo
  echo "## NCCL"
  echo
  echo '| check | result |'
  echo '|---|---|'
} > "$report"

# test_nccl: one rank (two when there are two GPUs), as ctest runs it.
if (cd "$build" && ctest -R '^test_nccl$' --output-on-failure) > "$out/nccl.log" 2>&1; then
  if grep -q "Skipped" "$out/nccl.log"; then
    echo "| test_nccl | skipped: $(grep -m1 -i 'skip' "$out/nccl.log" | cut -c1-120) |" >> "$report"
    failed=1
  else
    echo "| test_nccl | passed |" >> "$report"
  fi
else
  echo "| test_nccl | FAILED: $(grep -m1 -E 'error|FAILED' "$out/nccl.log" | cut -c1-150) |" >> "$report"
  failed=1
fi

{
  echo
  echo "## Training on CUDA ($steps steps, samples/s of the whole run)"
  echo
  echo '| workload | precision | status | samples/s | speed-up vs fp32 | skipped steps | final loss |'
  echo '|---|---|---|---|---|---|---|'
} >> "$report"
for workload in synthetic fashion-mnist char-gpt; do
  fp32_sps=""
  for precision in fp32 bf16 fp16; do
    scaler=none
    [ "$precision" = fp16 ] && scaler=dynamic
    summary="$out/$workload-$precision.json"
    "$build/bin/ampkit-train" --device cuda --workload "$workload" --precision "$precision" --scaler "$scaler" \
      --steps "$steps" --eval-batches 2 --progress never --summary "$summary" > "$out/run.log" 2>&1
    code=$?
    if [ $code -ne 0 ] || [ ! -f "$summary" ]; then
      echo "| $workload | $precision | FAILED (exit $code): $(grep -m1 'ampkit-train: error' "$out/run.log" | cut -c1-120) | | | | |" >> "$report"
      failed=1
      continue
    fi
    "$python" - "$summary" "$workload" "$precision" "${fp32_sps:-}" >> "$report" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
base = float(sys.argv[4]) if sys.argv[4] else None
sps = s["samples_per_second"]
speed = f"{sps / base:.2f}x" if base else "-"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['status']} | {sps:.0f} | {speed} | {s['skipped_steps']} | {s['final_loss']} |")
PY
    [ "$precision" = fp32 ] && fp32_sps=$("$python" -c "import json; print(json.load(open('$summary'))['samples_per_second'])")
  done
done

{
  echo
  echo "## Not yet scripted"
  echo
  echo "Scaler parity against torch.amp.GradScaler(\"cuda\"), clipper parity on CUDA tensors, counted host"
  echo "reads on CUDA, throughput against PyTorch's CUDA recipe, post-backward bandwidth against the"
  echo "device's copy bandwidth: issue 20, item 4."
} >> "$report"
cat "$report"
exit $failed
