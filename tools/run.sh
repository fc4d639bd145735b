#!/usr/bin/env bash
# The README's run command: set up if needed, build, and train the default workload
# (Fashion-MNIST CNN, bf16 autocast, 1 epoch). Extra arguments go to ampkit-train and win over
# these defaults (e.g. tools/run.sh --epochs 3, tools/run.sh --workload char-gpt --steps 500).
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths under the checkout hash as relative, so clones in other folders (CI's) share the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
tools/setup.sh
BUILD_DIR=${AMPKIT_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "${AMPKIT_JOBS:-$(nproc)}" --target ampkit-train ampkit-plugins
defaults=()
case " $* " in *" --workload"*) ;; *) defaults+=(--workload fashion-mnist) ;; esac
case " $* " in *" --precision"*) ;; *) defaults+=(--precision bf16) ;; esac
case " $* " in *" --steps"* | *" --epochs"*) ;; *) defaults+=(--epochs 1) ;; esac
case " $* " in *" --metrics"*) ;; *) defaults+=(--metrics runs/metrics.jsonl) ;; esac
case " $* " in *" --summary"*) ;; *) defaults+=(--summary runs/summary.json) ;; esac
mkdir -p runs
exec "$BUILD_DIR/bin/ampkit-train" "${defaults[@]}" "$@"
