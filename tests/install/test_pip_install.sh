#!/usr/bin/env bash
# `pip install .` as a user runs it (README, docs/python.md), in a clean virtual environment, then
# `import ampkit` and one GradScaler step on the CPU with the installed package alone,
# whose plugin loads run the package's own probe program (checked by moving it away first). Nothing is downloaded: the environment sees the system's torch (the 2.11.0 wheel that
# LibTorch is built from, far too big to fetch per run) and scikit-build-core, both installed by
# tools/setup.sh, and pip runs with --no-index --no-build-isolation. The build goes to
# pyproject.toml's build-pip/, beside build/, so that ccache serves it from the suite's own build.
# Usage: test_pip_install.sh SOURCE_DIR WORK_DIR PYTHON
set -euo pipefail
src=$1 work=$2 python=$3
fail() { echo "test_pip_install: FAIL: $*" >&2; exit 1; }
step() { echo "test_pip_install: [${SECONDS} s] $*"; }
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$src}"

rm -rf "$work"
mkdir -p "$work"
step "$python -m venv --system-site-packages $work/venv"
"$python" -m venv --system-site-packages "$work/venv"
venv_python=$work/venv/bin/python
step "pip install --no-build-isolation --no-index $src"
"$venv_python" -m pip install --no-build-isolation --no-index --disable-pip-version-check "$src" \
  >"$work/pip.log" 2>&1 || { tail -60 "$work/pip.log"; fail "pip install"; }
cd "$work"
step "the installed plugin probe: without the venv's ampkit/_probe, loading a plugin file is refused naming it"
probe=$(env -u PYTHONPATH "$venv_python" -c 'import os, ampkit; print(os.path.join(os.path.dirname(ampkit.__file__), "_probe"))')
[[ -x $probe ]] || fail "$probe is not an executable file"
[[ $(realpath "$probe") == "$(realpath "$work/venv")"/* ]] || fail "$probe is not in the virtual environment"
mv "$probe" "$probe.moved"
env -u PYTHONPATH AMPKIT_PLUGIN_PATH= "$venv_python" - "$probe" <<'PY' || { mv "$probe.moved" "$probe"; fail "the probe check"; }
import sys

import ampkit  # loads no plugin

try:
    ampkit.GradScaler("cpu")
except ampkit.PluginError as e:
    assert f"cannot run the plugin probe program {sys.argv[1]}" in str(e), str(e)
else:
    raise AssertionError("a plugin was loaded without the probe")
PY
mv "$probe.moved" "$probe"
step "import ampkit and one step, from $work (not the checkout, not build/python)"
env -u PYTHONPATH AMPKIT_PLUGIN_PATH= "$venv_python" - "$work/venv" <<'PY' || fail "the installed package"
import os
import sys

import torch

import ampkit

venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(ampkit.__file__)
assert where.startswith(venv + os.sep), f"ampkit imported from {where}, not from the virtual environment {venv}"
assert torch.__version__.split("+")[0] == "2.11.0", torch.__version__
plugins = {(p.kind, p.name): os.path.realpath(p.path) for p in ampkit.plugins()}
assert ("scaler", "dynamic") in plugins, sorted(plugins)
assert all(path.startswith(venv + os.sep) for path in plugins.values()), plugins

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = ampkit.GradScaler("cpu", init_scale=1024.0, clipper="norm", opt={"clipper.max_norm": 1.0})
loss = model(torch.randn(8, 4)).square().mean()
scaler.scale(loss).backward()
stepped = scaler.step(optimizer)
scaler.update()
record = scaler.last_step
assert stepped is True and record["stepped"], record
assert record["scale"] == 1024.0 and record["grad_norm"] > 0, record
print(f"ampkit {ampkit.__version__} from {where}: {len(plugins)} plugins, one step: "
      f"grad_norm {record['grad_norm']:.4f}, clipped {record['clipped']}, scale {scaler.get_scale()}")
PY
step "passed"
