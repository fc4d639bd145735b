"""Data-parallel: ampkit.GradScaler under torchrun with torch DDP (gloo, CPU), a NaN on one rank.

Each case runs tests/python/ddp_worker.py on 2 ranks with
``python3 -m torch.distributed.run --standalone --nproc-per-node 2`` and reads the JSON each rank
writes: its stepped flags, its scale after each update, its step records and a sha256 of its
parameters' bytes. DDP averages the gradients, so a NaN in one rank's forward makes every rank's
gradients non-finite: every rank must skip that step and only that one, keep the same scale and
end with bit-identical parameters. The loss is rank-local, so the NaN policy must not read it
under DDP (a rank that decided on its own loss would skip or abort alone), unless it is averaged
over the ranks (average_loss=True): then a NaN in one rank's loss is every rank's.
"""

import json
import os
import subprocess
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD = os.environ.get("AMPKIT_BUILD_DIR", os.path.join(_HERE, "..", "..", "build"))
_PYTHON_DIR = os.path.abspath(os.path.join(_BUILD, "python"))
_WORKER = os.path.join(_HERE, "ddp_worker.py")
STEPS, NAN_STEP, NAN_RANK = 30, 10, 1


def run_ranks(out_dir, *worker_args):
    """torchrun, 2 ranks; returns (completed process, {rank: result dict}) ."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PYTHON_DIR, env.get("PYTHONPATH", "")) if p)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        _WORKER, str(out_dir), "--steps", str(STEPS), "--nan-step", str(NAN_STEP), "--nan-rank", str(NAN_RANK),
        *worker_args,
    ]
    proc = subprocess.run(cmd, env=env, cwd=_HERE, capture_output=True, text=True, timeout=240)
    results = {}
    for rank in (0, 1):
        path = os.path.join(out_dir, f"rank-{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                results[rank] = json.load(f)
    return proc, results


def skipped(result):
    return [i for i, took in enumerate(result["stepped"]) if not took]


def assert_ranks_agree(proc, results):
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert sorted(results) == [0, 1], f"ranks that wrote a result: {sorted(results)}\n{proc.stderr[-6000:]}"
    r0, r1 = results[0], results[1]
    assert r0["world_size"] == r1["world_size"] == 2
    assert len(r0["stepped"]) == len(r1["stepped"]) == STEPS
    assert r0["stepped"] == r1["stepped"], (skipped(r0), skipped(r1), r0["reasons"], r1["reasons"])
    assert r0["scales"] == r1["scales"]
    assert r0["actions"] == r1["actions"]
    assert r0["param_sha256"] == r1["param_sha256"]
    return r0, r1


@pytest.mark.parametrize("nan_policy", ["skip", "abort"])
def test_nan_in_one_ranks_forward_skips_that_step_on_every_rank(tmp_path, nan_policy):
    # abort: rank 1's loss is NaN, but under DDP the policy sees the averaged gradients only, and
    # its default tolerate_overflow=true skips non-finite gradients: no rank aborts.
    proc, results = run_ranks(tmp_path, "--nan-policy", nan_policy, "--plant", "input")
    r0, r1 = assert_ranks_agree(proc, results)
    assert skipped(r0) == skipped(r1) == [NAN_STEP]
    assert r0["actions"][NAN_STEP] == r1["actions"][NAN_STEP] == "skip"
    assert r1["losses"][NAN_STEP] == "nan" and isinstance(r0["losses"][NAN_STEP], float)
    for r in (r0, r1):
        assert r["reasons"][NAN_STEP].startswith("non-finite gradients"), r["reasons"][NAN_STEP]
    assert r0["read_losses"] == r1["read_losses"] == [0.0] * STEPS  # without average_loss: no loss read
    # The dynamic scaler's default: 2**16 until the skip halves it; growth_interval 2000 is far.
    assert r0["scales"] == [65536.0] * NAN_STEP + [32768.0] * (STEPS - NAN_STEP)


def test_nan_in_one_ranks_loss_alone_steps_on_every_rank(tmp_path):
    # A NaN added to rank 1's loss as a constant: its loss is NaN but every gradient is finite.
    # Deciding on the rank-local loss would skip on rank 1 alone and the replicas would diverge.
    proc, results = run_ranks(tmp_path, "--nan-policy", "skip", "--plant", "loss")
    r0, r1 = assert_ranks_agree(proc, results)
    assert r1["losses"][NAN_STEP] == "nan"
    assert skipped(r0) == skipped(r1) == []
    assert r0["scales"] == [65536.0] * STEPS


def test_average_loss_makes_a_nan_in_one_ranks_loss_skip_on_every_rank(tmp_path):
    # average_loss=True: the loss the policy reads is the mean over the ranks, carried in the
    # statistics' one collective, so rank 1's NaN loss (finite gradients) is every rank's: both skip
    # step 10 and back off, and no other step.
    proc, results = run_ranks(tmp_path, "--nan-policy", "skip", "--plant", "loss", "--average-loss")
    r0, r1 = assert_ranks_agree(proc, results)
    assert skipped(r0) == skipped(r1) == [NAN_STEP]
    for r in (r0, r1):
        assert r["read_losses"][NAN_STEP] == "nan"
        assert r["reasons"][NAN_STEP].startswith("non-finite loss"), r["reasons"][NAN_STEP]
    assert r0["scales"] == [65536.0] * NAN_STEP + [32768.0] * (STEPS - NAN_STEP)
    # Elsewhere each rank read the mean of both ranks' losses: the same number on both.
    for step in range(STEPS):
        if step != NAN_STEP:
            mean = (r0["losses"][step] + r1["losses"][step]) / 2
            assert r0["read_losses"][step] == r1["read_losses"][step] == pytest.approx(mean, rel=1e-6), step



def test_the_deferred_step_reduces_the_loss_as_the_synchronous_step(tmp_path):
    # A fused AdamW under DDP with average_loss=True: the deferred step reduces the statistics and
    # the loss on the device (no host read in any step) and decides as the synchronous step, which
    # reads once per step: the same skip on both ranks, scales, records and parameters, bit for bit.
    runs = {}
    for sync in ("step", "deferred"):
        out = tmp_path / sync
        out.mkdir()
        proc, results = run_ranks(out, "--nan-policy", "skip", "--plant", "loss", "--average-loss",
                                  "--optimizer", "adamw_fused", "--sync", sync)
        runs[sync] = assert_ranks_agree(proc, results)
    for r_step, r_deferred in zip(runs["step"], runs["deferred"]):
        assert r_step["reads"] == [1] * STEPS and r_deferred["reads"] == [0] * STEPS
        assert (r_step["host_sync"], r_deferred["host_sync"]) == ("step", "deferred")
        assert skipped(r_deferred) == skipped(r_step) == [NAN_STEP]
        assert r_deferred["reasons"][NAN_STEP].startswith("non-finite loss"), r_deferred["reasons"][NAN_STEP]
        for key in ("stepped", "scales", "actions", "reasons", "read_losses", "param_sha256"):
            assert r_deferred[key] == r_step[key], key


def test_a_rank_without_gradients_joins_the_reduction_and_takes_the_groups_decision(tmp_path):
    # Statistics reduced across ranks (average_loss=True), no DDP: at step 10 rank 1 runs no backward
    # and has no gradients, while rank 0 plants an inf. Rank 1 must still join the collective rank 0
    # waits in (or rank 0 would hang until gloo's timeout and rank 1 would raise torch's "No inf
    # checks were recorded"), and both must skip that step and back off alike.
    proc, results = run_ranks(tmp_path, "--unwrapped", "--average-loss", "--no-backward-step", str(NAN_STEP),
                              "--nan-step", "-1")
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{proc.stderr[-6000:]}"
    r0, r1 = results[0], results[1]
    assert skipped(r0) == skipped(r1) == [NAN_STEP]
    assert r0["scales"] == r1["scales"] == [65536.0] * NAN_STEP + [32768.0] * (STEPS - NAN_STEP)
    assert r1["reasons"][NAN_STEP].startswith("non-finite gradients"), r1["reasons"][NAN_STEP]
