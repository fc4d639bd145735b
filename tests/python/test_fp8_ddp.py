"""ampkit.fp8 under torch DDP (gloo, CPU, 2 ranks by torchrun): each backward's amaxes of all fp8
layers are reduced with MAX across the ranks in one collective, so every rank holds the same scales
(docs/fp8.md, "Data-parallel"). Each case runs tests/python/fp8_ddp_worker.py and reads the JSON
each rank writes. Under FSDP2 (fully_shard per layer and at the root) the same holds."""

import json
import os
import subprocess
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD = os.environ.get("AMPKIT_BUILD_DIR", os.path.join(_HERE, "..", "..", "build"))
_PYTHON_DIR = os.path.abspath(os.path.join(_BUILD, "python"))
_WORKER = os.path.join(_HERE, "fp8_ddp_worker.py")


def run_ranks(out_dir, *worker_args):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PYTHON_DIR, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", _WORKER,
           str(out_dir), *worker_args]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=_HERE, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    results = []
    for rank in (0, 1):
        with open(os.path.join(out_dir, f"rank-{rank}.json")) as f:
            results.append(json.load(f))
    return results


WRAPPERS = {"ddp": (), "fsdp2": ("--fsdp",)}


@pytest.mark.parametrize("wrapper,layers", [("ddp", 2), ("ddp", 6), ("fsdp2", 2)])
def test_every_rank_holds_the_same_fp8_state_after_one_collective_per_step(tmp_path, wrapper, layers):
    r0, r1 = run_ranks(tmp_path, "--layers", str(layers), "--steps", "4", *WRAPPERS[wrapper])
    assert r0["calls"] == r1["calls"] == [1, 1, 1, 1]  # whatever the layer count
    assert r0["states"] == r1["states"]
    # The amaxes were different (rank 1's inputs are 4 times larger): the first layer's input
    # window holds rank 1's, the larger.
    first = r0["states"][-1][0]["input"]
    assert first["scale"] == pytest.approx(448.0 / max(first["amax_history"]))
    assert first["amax_history"][0] > 8.0


def test_without_the_reduction_the_ranks_drift_apart(tmp_path):
    r0, r1 = run_ranks(tmp_path, "--layers", "2", "--steps", "3", "--no-reduce")
    assert r0["calls"] == r1["calls"] == [0, 0, 0]
    assert r0["states"][-1][0]["input"] != r1["states"][-1][0]["input"]


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_an_inf_on_one_rank_is_a_skipped_step_on_both(tmp_path, wrapper):
    r0, r1 = run_ranks(tmp_path, "--layers", "2", "--steps", "4", "--inf-step", "2", *WRAPPERS[wrapper])
    assert r0["stepped"] == r1["stepped"] == [True, True, False, True]
    assert r0["fp8_bad"] == r1["fp8_bad"] == [0, 0, 1, 0]  # rank 1's inf, reduced to both
    assert r0["states"] == r1["states"]
    assert r0["states"][2] == r0["states"][1]  # the bad step moved no window
