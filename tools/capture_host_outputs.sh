#!/usr/bin/env bash
# Runs a fixed set of ampkit-train configurations with the binaries in BIN_DIR and prints, for
# each, the exit code, the output (progress lines and timings removed), the summary without its
# timing fields, param_sha256 included, and every NaN report file byte for byte. Restructuring
# the host must not change a byte of it:
#   tools/capture_host_outputs.sh old/build/bin > before.txt
#   tools/capture_host_outputs.sh build/bin > after.txt && diff before.txt after.txt
# Takes about two minutes on two cores (Fashion-MNIST and char-gpt runs are a few dozen steps).
set -uo pipefail
bin=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/ampkit-capture-XXXXXX)
trap 'rm -rf "$work"' EXIT
syn="--workload synthetic --synthetic-inputs 16 --synthetic-width 32 --synthetic-depth 2 --batch-size 32 --progress never --threads 1"

normalize() {  # summary JSON without wall-clock fields, keys sorted
  python3 - "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no summary:", type(e).__name__); sys.exit()
for k in ("wall_seconds", "samples_per_second", "rank_samples_per_second"):
    d.pop(k, None)
print(json.dumps(d, sort_keys=True, indent=1))
PY
}

case_run() {  # NAME ARGS...
  local name=$1; shift
  echo "=== $name"
  (cd "$work" && env -u AMPKIT_PLUGIN_PATH "$bin/ampkit-train" "$@" --summary "$work/$name.json" \
      > "$work/$name.out" 2>&1)
  echo "exit $?"
  grep -v -e 'wall_seconds' -e 'samples_per_second' -e '^ampkit-train: note: this CPU' \
      -e 'samples/s' "$work/$name.out" | sed -e "s|$work|<WORK>|g" -e "s|$bin|<BIN>|g"
  normalize "$work/$name.json" | sed -e "s|$work|<WORK>|g" -e "s|$bin|<BIN>|g"
  for report in "$work"/nan-report-*.json; do  # the locator's reports, byte for byte
    [ -e "$report" ] || continue
    echo "--- $(basename "$report")"
    cat "$report" && echo
    rm -f "$report"
  done
}

case_run fp32 $syn --steps 30
case_run bf16-norm $syn --steps 30 --precision bf16 --clipper norm --opt clipper.max_norm=0.5
case_run fp16-dynamic-nan $syn --steps 30 --precision fp16 --scaler dynamic --inject nan@step=5 --inject inf@step=9,target=grad,layer=layers.1
case_run fp16-spike-backoff $syn --steps 40 --precision fp16 --scaler dynamic --nan-policy backoff \
    --opt nan_policy.spike_zscore=4 --opt nan_policy.spike_min_samples=5 --inject spike@step=25
case_run fp32-rollback $syn --steps 30 --nan-policy rollback --opt nan_policy.snapshot_every=5 \
    --opt nan_policy.skip_batches=2 --inject nan@step=12 --metrics "$work/rollback.jsonl"
case_run fp32-abort $syn --steps 30 --nan-policy abort --inject nan@step=4
case_run fp16-scaler-abort $syn --steps 30 --precision fp16 --scaler dynamic --opt scaler.init_scale=2 \
    --inject inf@step=3 --inject inf@step=4
case_run adaptive-agc $syn --steps 30 --clipper adaptive --lr-schedule cosine --warmup-steps 5 --accumulate 2
case_run ckpt-first $syn --steps 20 --checkpoint-dir "$work/ck" --checkpoint-every 7 --precision bf16
case_run ckpt-resume $syn --steps 40 --checkpoint-dir "$work/ck" --resume auto --precision bf16
case_run ckpt-straight $syn --steps 40 --precision bf16
case_run fmnist-adamw --workload fashion-mnist --steps 30 --batch-size 64 --eval-batches 4 --progress never --threads 2
case_run fmnist-sgd --workload fashion-mnist --steps 30 --optimizer sgd --precision bf16 --eval-batches 4 --progress never --threads 2
case_run char-gpt --workload char-gpt --steps 20 --gpt-layers 1 --gpt-width 32 --gpt-heads 2 --gpt-context 16 --eval-batches 2 --progress never --threads 2

echo "=== gloo-2-ranks"
port=$((29700 + RANDOM % 200))
for r in 0 1; do
  (cd "$work" && env -u AMPKIT_PLUGIN_PATH "$bin/ampkit-train" $syn --steps 20 --comm gloo --world-size 2 \
      --rank $r --master-port $port --summary "$work/gloo$r.json" > "$work/gloo$r.out" 2>&1; echo $? > "$work/gloo$r.rc") &
done
wait
for r in 0 1; do echo "rank $r exit $(cat "$work/gloo$r.rc")"; normalize "$work/gloo$r.json"; done
