"""An ampkit-train checkpoint's scaler state loads into ampkit.GradScaler and continues the same
scale sequence.

ampkit-train (synthetic MLP, fp16, scaler dynamic with growth_interval 5) runs 20 steps with a
NaN planted in the loss at step 7 and another at step 14, checkpointing every 10 steps and
writing one metrics record per step. The step-10 checkpoint's scaler_state_dict.pt (torch's
format) is loaded with torch.load(weights_only=True) into ampkit.GradScaler and into
torch.amp.GradScaler; both must hold the scale and growth tracker the metrics imply after step 9,
then, driven with a tiny model through the run's found_inf pattern of steps 10..19 (an inf planted
in a gradient where the run overflowed), give the run's scale_next at every step.
"""

import json
import math
import os
import subprocess

import pytest
import torch

import ampkit

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD = os.path.abspath(os.environ.get("AMPKIT_BUILD_DIR", os.path.join(_HERE, "..", "..", "build")))
_TRAIN = os.path.join(_BUILD, "bin", "ampkit-train")
STEPS, EVERY, GROWTH_INTERVAL, NAN_STEPS = 20, 10, 5, (7, 14)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The ampkit-train run: (checkpoint folder, metrics records by step)."""
    root = tmp_path_factory.mktemp("ampkit_train")
    ckpt, metrics = root / "ckpt", root / "m.jsonl"
    cmd = [
        _TRAIN, "--workload", "synthetic", "--synthetic-inputs", "16", "--synthetic-width", "32",
        "--synthetic-depth", "2", "--batch-size", "32", "--progress", "never", "--threads", "1",
        "--precision", "fp16", "--scaler", "dynamic", "--opt", f"scaler.growth_interval={GROWTH_INTERVAL}",
        *[a for s in NAN_STEPS for a in ("--inject", f"nan@step={s}")],
        "--steps", str(STEPS), "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY),
        "--metrics", str(metrics),
    ]
    env = dict(os.environ, AMPKIT_PLUGIN_PATH="")
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip()]
    assert [r["step"] for r in records] == list(range(STEPS))
    return ckpt, records


def scaler_file(ckpt, step):
    path = ckpt / f"step-{step}" / "scaler_state_dict.pt"
    assert path.is_file(), sorted(p.name for p in ckpt.iterdir())
    return path


def implied_growth_tracker(records, step):
    """Healthy steps at an unchanged scale just before ``step``: the dynamic scaler's tracker."""
    tracker = 0
    for r in reversed(records[:step]):
        if r["found_inf"] or r["scale_next"] != r["scale"]:
            break
        tracker += 1
    return tracker


def test_the_run_has_the_expected_shape(run):
    ckpt, records = run
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["step-10", "step-20"]
    assert [r["step"] for r in records if r["found_inf"]] == list(NAN_STEPS)
    assert [r["step"] for r in records if not r["stepped"]] == list(NAN_STEPS)
    # The checkpoint's scale is step 9's scale_next (65536 after the step-7 backoff), with two
    # healthy steps (8, 9) counted towards the next growth.
    assert records[EVERY - 1]["scale_next"] == 65536.0
    assert implied_growth_tracker(records, EVERY) == 2
    # After the checkpoint: growth at step 12, backoff at 14, growth at 19.
    assert [r["scale_next"] for r in records[EVERY:]] == [
        65536.0, 65536.0, 131072.0, 131072.0, 65536.0, 65536.0, 65536.0, 65536.0, 65536.0, 131072.0]


def drive(scaler, records):
    """Steps EVERY..STEPS-1 with a tiny model, an inf planted where the run found one; returns
    (scale before each step, scale after each update, stepped flags)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before, after, stepped = [], [], []
    for r in records[EVERY:]:
        opt.zero_grad(set_to_none=True)
        loss = model(torch.ones(3, 4)).square().mean()
        scaler.scale(loss).backward()
        if r["found_inf"]:
            model.weight.grad[0, 0] = math.inf
        before.append(scaler.get_scale())
        took = scaler.step(opt)
        stepped.append(took)  # ampkit: True/False; torch: what optimizer.step returned (None)
        scaler.update()
        after.append(scaler.get_scale())
    return before, after, stepped


def test_ampkit_grad_scaler_continues_the_runs_scale_sequence(run):
    ckpt, records = run
    state = torch.load(scaler_file(ckpt, EVERY), weights_only=True)
    assert state["growth_interval"] == GROWTH_INTERVAL
    scaler = ampkit.GradScaler("cpu", growth_interval=GROWTH_INTERVAL)
    scaler.load_state_dict(state)
    assert scaler.get_scale() == records[EVERY]["scale"] == records[EVERY - 1]["scale_next"] == 65536.0
    assert scaler.state_dict()["_growth_tracker"] == implied_growth_tracker(records, EVERY) == 2
    assert scaler.get_growth_interval() == GROWTH_INTERVAL
    before, after, stepped = drive(scaler, records)
    assert before == [r["scale"] for r in records[EVERY:]]
    assert after == [r["scale_next"] for r in records[EVERY:]]
    assert stepped == [r["stepped"] for r in records[EVERY:]]
    # ... and ends where the run ended: its step-20 checkpoint.
    final = torch.load(scaler_file(ckpt, STEPS), weights_only=True)
    assert scaler.get_scale() == final["scale"]
    assert scaler.state_dict()["_growth_tracker"] == final["_growth_tracker"]


def test_torch_grad_scaler_loads_the_same_file_and_agrees(run):
    ckpt, records = run
    state = torch.load(scaler_file(ckpt, EVERY), weights_only=True)
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(state)
    ours = ampkit.GradScaler("cpu", growth_interval=GROWTH_INTERVAL)
    ours.load_state_dict(state)
    assert theirs.get_scale() == ours.get_scale() == 65536.0
    assert theirs._get_growth_tracker() == ours.state_dict()["_growth_tracker"] == 2
    assert theirs.get_growth_interval() == GROWTH_INTERVAL
    _, after, _ = drive(theirs, records)
    assert after == [r["scale_next"] for r in records[EVERY:]]
