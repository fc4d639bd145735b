#!/usr/bin/env bash
# The README's run command: set up if needed, build, and train the default workload
# (Fashion-MNIST CNN, bf16 autocast, 1 epoch); extra arguments go to ampkit-train.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
BUILD_DIR=${AMPKIT_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "${AMPKIT_JOBS:-$(nproc)}" --target ampkit-train ampkit-plugins
mkdir -p runs
exec "$BUILD_DIR/bin/ampkit-train" --workload fashion-mnist --precision bf16 --epochs 1 \
  --metrics runs/metrics.jsonl --summary runs/summary.json "$@"
