"""bench/gpu_models.py stopped by a time limit's SIGTERM (tools/gpu-check.sh bounds it): the
rows done so far are still printed, and the JSON file holds them after every row. A GPU machine is
lent for minutes, so a cut-short benchmark must keep what it measured."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.join(_HERE, "..", "..")
_BUILD = os.path.abspath(os.environ.get("AMPKIT_BUILD_DIR", os.path.join(_ROOT, "build")))
_BENCH = os.path.join(_ROOT, "bench", "gpu_models.py")


def _rows(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):  # not written yet, or being written
        return {"rows": []}


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "timm")),
    reason="needs transformers and timm (tools/setup.sh installs them)",
)
def test_a_sigterm_prints_the_rows_done_and_exits_3(tmp_path):
    out = tmp_path / "rows.json"
    # Four rows of a few seconds each: the signal comes as soon as the first is in the JSON file.
    args = [
        "--tiny",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--rounds",
        "10",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--compare-steps",
        "6",
        "--overflow-step",
        "3",
        "--json",
        str(out),
    ]
    env = dict(os.environ, PYTHONPATH=os.path.join(_BUILD, "python"), AMPKIT_PLUGIN_PATH="")
    proc = subprocess.Popen(
        [sys.executable, _BENCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 240
    while len(_rows(str(out))["rows"]) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    done = _rows(str(out))
    assert done["complete"] is False
    n = len(done["rows"])
    assert 1 <= n < 4
    assert f"stopped by SIGTERM after {n} of 4 rows" in stderr
    timing = [line for line in stdout.splitlines() if line.startswith(("| GPT-2 |", "| ViT |"))]
    assert len(timing) == 2 * n  # each row done: one timing line, one skip-decision line
    assert all(line.endswith("| ok |") for line in timing[n:])


@pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm (tools/setup.sh installs it)")
def test_a_sigterm_while_the_tables_print_is_ignored():
    # Every row is done: the tables are what the run is for, and a late SIGTERM must not cut them.
    script = f"""
import importlib.util, os, signal, sys
spec = importlib.util.spec_from_file_location("gpu_models", {_BENCH!r})
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
real = bench.versions
def versions_then_term():
    os.kill(os.getpid(), signal.SIGTERM)  # first called by print_tables (no --json)
    return real()
bench.versions = versions_then_term
sys.exit(bench.main(["--tiny", "--device", "cpu", "--threads", "1", "--models", "vit", "--precisions", "bf16",
                     "--rounds", "1", "--steps", "1", "--warmup", "0", "--compare-steps", "4", "--overflow-step", "2"]))
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(_BUILD, "python"), AMPKIT_PLUGIN_PATH="")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ViT |")]
    assert len(lines) == 2 and lines[1].endswith("| ok |"), done.stdout
