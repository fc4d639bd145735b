"""The first-use check of ampkit's kernels (core/engine/include/ampkit/kernel_check.h) seen from
ampkit.GradScaler, on CPU tensors, where the kernels' CPU stand-ins pass through the same decision:
with a planted failure (the module does not load, or the statistics or the rules kernel's first
result is wrong; AMPKIT_TEST_KERNEL_FAULT, whose verdict a process keeps) sync="deferred" and sync="auto" stay
synchronous with one warning naming the kernel and the values, and their numbers are sync="step"'s,
bit for bit; AMPKIT_GPU_SELF_CHECK=0 turns the comparison off. Each fault runs in a process of its own."""

import json
import os
import subprocess
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD = os.environ.get("AMPKIT_BUILD_DIR", os.path.join(_HERE, "..", "..", "build"))

_CHILD = r"""
import json, sys, warnings
import torch
torch.set_num_threads(1)
from test_deferred_step import _run
want = _run("step", steps=40)
out = {}
for sync in sys.argv[1:]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run(sync, steps=40)
    out[sync] = {
        "said": [str(w.message) for w in caught if "ampkit" in str(w.message)],
        "reads": got["reads"],
        "host_sync": got["host_sync"],
        "same": got["stepped"] == want["stepped"] and got["scale"] == want["scale"]
        and got["state"] == want["state"] and all(torch.equal(a, b) for a, b in zip(got["params"], want["params"])),
        "skipped": sum(not s for s in want["stepped"]),
    }
print(json.dumps(out))
"""


def _child(syncs, **env: str) -> dict:
    environ = dict(
        os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(os.path.join(_BUILD, "python")), _HERE]), **env
    )
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *syncs], env=environ, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "fault, names",
    [
        (
            "stats",
            "the statistics kernel disagrees with its host form (chunk_stats_on_host) in its first-use self-check: "
            "float chunk 0 of 65536 elements has sum of squares",
        ),
        (
            "rules",
            "the rules kernel disagrees with its host form (ampkit_step_rules_run) in its first-use self-check: "
            "case 0's record's clip coefficient is 0.5",
        ),
        ("load", "their module did not load (a planted failure)"),
    ],
)
def test_a_failed_first_use_check_keeps_the_step_synchronous_with_one_warning(fault, names):
    runs = _child(["deferred", "auto"], AMPKIT_TEST_KERNEL_FAULT=fault)
    for sync, run in runs.items():
        assert run["same"], f"sync={sync!r}: the numbers differ from sync='step''s"
        assert run["skipped"] == 2  # the planted overflows of the first 40 steps (7 and 8) were skipped
        assert run["reads"] == [1] * 40  # every step synchronous: one host read each
        assert len(run["said"]) == 1, run["said"]
        prefix = "ampkit.GradScaler: the step stays synchronous: the CPU stand-ins of ampkit's kernels: "
        assert run["said"][0].startswith(prefix + names), run["said"][0]
        assert run["host_sync"][0] == "step"


def test_the_check_switched_off_lets_a_wrong_kernel_result_through():
    run = _child(["deferred"], AMPKIT_TEST_KERNEL_FAULT="stats", AMPKIT_GPU_SELF_CHECK="0")["deferred"]
    assert run["said"] == []
    assert run["reads"] == [0] * 40  # deferred: the comparison that would refuse it did not run
    assert run["same"]  # the planted error lives in the check only, never in a step


@pytest.mark.parametrize(
    "env, says",
    [
        ({"AMPKIT_TEST_KERNEL_FAULT": "stat"}, "AMPKIT_TEST_KERNEL_FAULT must be load, stats or rules, not 'stat'"),
        ({"AMPKIT_GPU_SELF_CHECK": "nope"}, "AMPKIT_GPU_SELF_CHECK must be true or false"),
    ],
)
def test_a_misspelt_switch_is_one_usage_error(env, says):
    """A misspelt fault would let a test pass without its failure, and a misspelt AMPKIT_GPU_SELF_CHECK
    would leave the check on in silence: both are ampkit-train's usage error (exit 2), in one line."""
    args = [os.path.join(_BUILD, "bin", "ampkit-train"), "--workload", "synthetic", "--precision", "fp16"]
    args += ["--steps", "3", "--progress", "never", "--host-sync", "deferred"]
    proc = subprocess.run(args, env=dict(os.environ, **env), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and says in errors[0], proc.stderr
