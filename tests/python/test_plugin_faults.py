"""Plugin trouble from Python: one exception or one line, never a silent death."""

import os
import subprocess
import sys

import pytest
import torch

import ampkit

BUILD = os.path.abspath(os.environ.get("AMPKIT_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build")))
BROKEN = os.path.join(BUILD, "tests", "broken-plugins")

SCRIPT = """
import sys, torch
sys.path.insert(0, {python!r})
import ampkit
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = ampkit.GradScaler("cpu", scaler="update_segv", plugin_dirs=[{faults!r}])
{reconfigure}
for step in range(2):  # the plugin crashes in its second update()
    opt.zero_grad()
    scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    scaler.step(opt)
    print("stepped", flush=True)
    scaler.update()
print("not reached")
"""


@pytest.mark.parametrize("reconfigure", ["", "scaler.set_growth_interval(7)"], ids=["as_made", "options_replaced"])
def test_a_plugin_crash_ends_python_with_one_line_naming_it(reconfigure):
    # Replacing an option makes the plugin again (StrategySet::reconfigure): still guarded.
    script = SCRIPT.format(python=os.path.join(BUILD, "python"), faults=os.path.join(BROKEN, "faults"),
                           reconfigure=reconfigure)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, AMPKIT_PLUGIN_PATH=""))
    assert run.returncode == 3
    assert run.stdout == "stepped\nstepped\n"
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("ampkit: error: scaler 'update_segv'")
    assert "crashed (SIGSEGV" in lines[0] and "in update()" in lines[0]


def test_a_crash_outside_plugins_still_reaches_pythons_faulthandler():
    script = ("import sys, faulthandler, ctypes; sys.path.insert(0, %r); import ampkit; faulthandler.enable(); "
              "ctypes.string_at(0)" % os.path.join(BUILD, "python"))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == -11
    assert "Fatal Python error: Segmentation fault" in run.stderr
    assert "ampkit: error" not in run.stderr


def test_a_throwing_factory_is_a_plugin_error_with_its_message():
    with pytest.raises(ampkit.PluginError, match="throwing_factory"):
        ampkit.GradScaler("cpu", scaler="throwing_factory", plugin_dirs=[os.path.join(BROKEN, "throwing_factory")])


def test_an_untrusted_plugin_folder_is_refused_unless_allowed(tmp_path):
    src = os.path.join(BUILD, "lib", "ampkit", "plugins", "libampkit-clipper-norm.so")
    folder = tmp_path / "shared"
    folder.mkdir()
    target = folder / "libampkit-clipper-mynorm.so"
    target.write_bytes(open(src, "rb").read())
    os.chmod(folder, 0o777)
    with pytest.raises(ampkit.PluginError, match="writable"):
        ampkit.GradScaler("cpu", clipper=str(target))
    scaler = ampkit.GradScaler("cpu", clipper=str(target), allow_untrusted_plugins=True)
    assert scaler.plugin_options("clipper")[0][0] == "max_norm"
