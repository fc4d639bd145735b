"""Sharded gradients: ampkit.GradScaler on an FSDP2 (``fully_shard``) model under torchrun (gloo, CPU,
2 ranks) against torch.amp.GradScaler + unscale_ + clip_grad_norm_ on an identical sharded model.

tests/python/fsdp_worker.py trains both side by side for 50 steps; at the steps in PLANTED rank 1
alone writes an inf (or a NaN) into its local shard of one gradient. Each rank measures its own
shards only, so rank 0 learns of it only through the reduction across the ranks: both ranks must
skip those steps and back off, as torch's scaler does (its found_inf is reduced over the DTensors'
mesh), and the scales, skips, clip coefficients and parameters must equal torch's.
"""

import json
import os
import subprocess
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD = os.environ.get("AMPKIT_BUILD_DIR", os.path.join(_HERE, "..", "..", "build"))
_PYTHON_DIR = os.path.abspath(os.path.join(_BUILD, "python"))
_WORKER = os.path.join(_HERE, "fsdp_worker.py")
STEPS = 50
PLANTED = [7, 20, 21, 35]  # fsdp_worker.PLANTED


def run_ranks(out_dir, *worker_args, steps=STEPS):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PYTHON_DIR, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", _WORKER,
           str(out_dir), "--steps", str(steps), *worker_args]
    proc = subprocess.run(cmd, env=env, cwd=_HERE, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    results = {}
    for rank in (0, 1):
        with open(os.path.join(out_dir, f"rank-{rank}.json")) as f:
            results[rank] = json.load(f)
    return results


def skipped(steps):
    return [i for i, s in enumerate(steps) if not s["stepped"]]


# adamw_fused: the deferred step from the second step on (sync="auto"): the statistics are reduced
# on the device, no host read, and the decisions are still torch's and the same on every rank.
@pytest.mark.parametrize("optimizer,plant", [("sgd", "inf"), ("adamw_fused", "nan")])
def test_a_bad_shard_on_one_rank_skips_every_rank_as_torch(tmp_path, optimizer, plant):
    results = run_ranks(tmp_path, "--optimizer", optimizer, "--plant", plant)
    assert results[0]["planted"] == PLANTED
    for rank, r in results.items():
        t, a = r["torch"], r["ampkit"]
        assert len(t) == len(a) == STEPS
        # Every planted step is skipped on both ranks, rank 0 included, whose own shards were finite;
        # fp16 overflows of the forward at a grown scale may add others, the same for torch and ampkit.
        assert set(PLANTED) <= set(skipped(a)), (rank, skipped(a))
        assert skipped(a) == skipped(t), (rank, skipped(a), skipped(t))
        for step in PLANTED:
            assert a[step]["action"] == "skip"
            before = a[step - 1]["scale"]
            assert a[step]["scale"] == before / 2, (rank, step, before, a[step]["scale"])  # backed off
        assert [s["scale"] for s in a] == [s["scale"] for s in t]  # bit for bit: the same powers of 2
        taken = [i for i in range(STEPS) if t[i]["stepped"]]
        clipped = [i for i in taken if t[i]["clip_coef"] < 1.0]
        assert len(clipped) >= 20, clipped  # the coefficients compared below do clip
        for i in taken:
            assert a[i]["clip_coef"] == pytest.approx(t[i]["clip_coef"], abs=1e-6, rel=1e-6), i
            assert a[i]["grad_norm"] == pytest.approx(t[i]["grad_norm"], rel=1e-6), i
        assert max(r["param_difference"]) <= 1e-6
        assert r["warnings"] == []
        # Host reads in ampkit's step() + update(): the synchronous step's one, or none when deferred.
        assert r["reads"] == ([1] + [0] * (STEPS - 1) if optimizer == "adamw_fused" else [1] * STEPS)
        assert r["host_sync"] == ("deferred" if optimizer == "adamw_fused" else "step")
    # The ranks decided alike: the same skips, scales and coefficients (reduced numbers, to the bit).
    a0, a1 = results[0]["ampkit"], results[1]["ampkit"]
    assert [(s["stepped"], s["scale"], s["clip_coef"]) for s in a0] == [(s["stepped"], s["scale"], s["clip_coef"])
                                                                          for s in a1]


def test_misuse_of_sharded_gradients_is_refused(tmp_path):
    results = run_ranks(tmp_path, steps=1)  # the worker's misuse checks run after its steps
    for r in results.values():
        assert r["errors"]["mixed"] == (
            "ampkit.GradScaler: an optimizer's parameters are partly DTensors (FSDP2's shards) and partly plain "
            "tensors; give the sharded and the plain ones to separate optimizers")
    for r in results.values():  # no rank has a gradient: torch's and ampkit's step() raise alike
        assert r["errors"]["no_gradients_ampkit"] == r["errors"]["no_gradients_torch"] == (
            "No inf checks were recorded for this optimizer.")
    assert results[0]["errors"]["other_group"] == (
        "ampkit.GradScaler: process_group holds ranks [0], but the gradients are sharded over ranks [0, 1] "
        "(their device mesh)")


def test_the_seeds_gradient_clipper_clips_sharded_gradients_by_the_global_norm(tmp_path):
    # ampkit.seeds.GradientClipper on an FSDP2 model against clip_grad_norm_ on the same DTensors:
    # the global norm on every rank, the same clipped shards; at step 2 an inf in rank 1's shard alone
    # is found on both ranks.
    results = run_ranks(tmp_path, "--seeds-clipper", steps=6)
    for rank, r in results.items():
        steps = r["seeds_clipper"]
        assert len(steps) == 6
        for i, s in enumerate(steps):
            if i == 2:
                assert s["found_inf"] and s["torch_norm"] in ("inf", "nan"), (rank, s)
                continue
            assert not s["found_inf"], (rank, i, s)
            assert s["norm"] == pytest.approx(s["torch_norm"], rel=1e-6), (rank, i, s)
            assert s["grad_difference"] <= 1e-7, (rank, i, s)
        assert sum(s["clip_coef"] < 1.0 for s in steps) >= 4  # it does clip
    assert [s["norm"] for s in results[0]["seeds_clipper"]] == [s["norm"] for s in results[1]["seeds_clipper"]]
