#!/usr/bin/env bash
# Installs every dependency of ampkit from the machine's registries; safe to run again.
set -euo pipefail

# Every pip install below goes through tools/constraints.txt, which pins torch (LibTorch is taken
# from its wheel) and torchvision (timm pulls it; its newest release would replace torch).
CONSTRAINTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/constraints.txt"
TORCH_VERSION=$(sed -n 's/^torch==//p' "$CONSTRAINTS")
DEBIAN_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  clang libclang-rt-dev gcovr  # the instrumented suite's coverage report and the libFuzzer targets (tools/fuzz.sh)
  clang-format  # tools/check_format.py (ctest check_format): every C++ source formatted as .clang-format says
  libboost-dev libboost-program-options-dev libboost-test-dev libboost-filesystem-dev
  libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libfmt-dev zlib1g-dev libssl-dev
  dataset-fashion-mnist fortunes
  libgloo-dev  # gloo headers that the torch wheel leaves out; c10d/ProcessGroupGloo.hpp includes them
  iproute2  # ip netns: tests/dist/test_two_nodes.sh runs two nodes in two network namespaces
  jq  # the docs' recipes on metrics files, run by tests/interop/test_docs_recipes.sh
)

say() { echo "[setup] $*"; }

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "Debian packages present"
fi

PYTHON=${PYTHON:-python3}
pip_install() { "$PYTHON" -m pip install --quiet -c "$CONSTRAINTS" "$@"; }
have=$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
if [ "$have" != "$TORCH_VERSION" ]; then
  say "installing torch==$TORCH_VERSION from PyPI (python: $(command -v "$PYTHON"))"
  pip_install "torch==$TORCH_VERSION" numpy
else
  say "torch $have present"
fi
"$PYTHON" -c 'import matplotlib' 2>/dev/null || { say "installing matplotlib from PyPI (tools/plot_run.py, bench/plot_throughput.py)"; pip_install matplotlib; }
TENSORBOARD_VERSION=2.21.0  # test dependency: its own reader checks --tensorboard's event files
have_tb=$("$PYTHON" -c 'import tensorboard; print(tensorboard.__version__)' 2>/dev/null || true)
if [ "$have_tb" != "$TENSORBOARD_VERSION" ]; then
  say "installing tensorboard==$TENSORBOARD_VERSION from PyPI (tests/interop/test_tensorboard.sh reads ampkit's event files with it)"
  pip_install "tensorboard==$TENSORBOARD_VERSION"
fi
"$PYTHON" -c 'import pytest' 2>/dev/null || { say "installing pytest from PyPI (tests/python: the ampkit Python package's tests)"; pip_install pytest; }
# The Python package's source gates (ctest check_python_format, check_python_lint, check_python_types;
# pyproject.toml's [tool.ruff] and [tool.mypy]) and its pip install test (test_pip_install builds the
# package with scikit-build-core, without downloading anything).
RUFF_VERSION=0.17.6 MYPY_VERSION=2.4.1 SKBUILD_VERSION=1.1.2
have_gates=$("$PYTHON" -c 'from importlib.metadata import version as v; print(v("ruff"), v("mypy"), v("scikit-build-core"))' 2>/dev/null || true)
if [ "$have_gates" != "$RUFF_VERSION $MYPY_VERSION $SKBUILD_VERSION" ]; then
  say "installing ruff==$RUFF_VERSION, mypy==$MYPY_VERSION and scikit-build-core==$SKBUILD_VERSION from PyPI (the Python package's gates and pip install test)"
  pip_install "ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION" "scikit-build-core==$SKBUILD_VERSION"
fi
# Benchmark dependencies, only for bench/gpu_models.py and its test (test_gpu_models_tiny):
# real models that nobody on this project wrote, randomly initialised.
TRANSFORMERS_VERSION=5.24.0 TIMM_VERSION=1.0.31
have_models=$("$PYTHON" -c 'from importlib.metadata import version as v; print(v("transformers"), v("timm"))' 2>/dev/null || true)
if [ "$have_models" != "$TRANSFORMERS_VERSION $TIMM_VERSION" ]; then
  say "installing transformers==$TRANSFORMERS_VERSION and timm==$TIMM_VERSION from PyPI (bench/gpu_models.py)"
  pip_install "transformers==$TRANSFORMERS_VERSION" "timm==$TIMM_VERSION"
fi
# Trainer-integration test dependencies, only for tests/python/test_trainers_*.py (ampkit.lightning,
# ampkit.accelerate, ampkit.transformers): the real trainers, run on the CPU.
LIGHTNING_VERSION=2.6.6 ACCELERATE_VERSION=1.15.0
have_trainers=$("$PYTHON" -c 'from importlib.metadata import version as v; print(v("lightning"), v("accelerate"))' 2>/dev/null || true)
if [ "$have_trainers" != "$LIGHTNING_VERSION $ACCELERATE_VERSION" ]; then
  say "installing lightning==$LIGHTNING_VERSION and accelerate==$ACCELERATE_VERSION from PyPI (tests/python/test_trainers_*.py)"
  pip_install "lightning==$LIGHTNING_VERSION" "accelerate==$ACCELERATE_VERSION"
fi
# fp8 golden source, only for tools/golden/fp8_torchao_goldens.py (and the fp8 parity test that
# will compare with its output): torchao's tensorwise Float8Linear, run on the CPU with emulate=True.
# It declares no dependencies, so it cannot move torch; its C++ extensions want torch >= 2.11.0.
TORCHAO_VERSION=$(sed -n 's/^torchao==//p' "$CONSTRAINTS")
have_ao=$("$PYTHON" -c 'from importlib.metadata import version as v; print(v("torchao"))' 2>/dev/null || true)
if [ "$have_ao" != "$TORCHAO_VERSION" ]; then
  say "installing torchao==$TORCHAO_VERSION from PyPI (tools/golden/fp8_torchao_goldens.py: fp8 golden values)"
  pip_install "torchao==$TORCHAO_VERSION"
fi
have=$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
[ "$have" = "$TORCH_VERSION" ] || { say "error: torch is $have after the installs, not $TORCH_VERSION: check $CONSTRAINTS"; exit 1; }
say "done"
