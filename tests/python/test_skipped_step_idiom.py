"""The README's skipped-step idiom, ``if not scaler.step(opt): print(scaler.last_step["reason"])``,
runs as written: with a disabled scaler (enabled=False, or "cuda" without a GPU) step() says it
stepped and last_step has the enabled scaler's keys; with a fused optimizer (the deferred step)
last_step read right after step() describes that step, and prints its real reason."""

import math
import warnings
from typing import List

import ampkit
import pytest
import torch

PLANT = 3  # the iteration whose loss is multiplied by inf


def _run(scaler: ampkit.GradScaler, fused: bool, steps: int = 6) -> List[dict]:
    """The idiom, in a loop; returns what it printed and read, step by step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=fused)
    x = torch.randn(4, 8)
    rows = []
    for i in range(steps):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        scaler.scale(loss * math.inf if i == PLANT and scaler.is_enabled() else loss).backward()
        printed = None
        if not scaler.step(opt):
            printed = "skipped: " + scaler.last_step["reason"]
        record = scaler.last_step
        rows.append({"printed": printed, "step": record["step"], "stepped": record["stepped"],
                     "host_sync": record["host_sync"], "scale": scaler.get_scale()})
        scaler.update()
    rows.append({"parameters": [p.detach().clone() for p in model.parameters()]})
    return rows


def _keys() -> set:
    scaler = ampkit.GradScaler("cpu")
    model = torch.nn.Linear(2, 1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    return set(scaler.last_step)


def test_a_disabled_scaler_keeps_the_idioms_shape() -> None:
    scaler = ampkit.GradScaler("cpu", enabled=False)
    assert scaler.last_step["stepped"] is False  # no step yet
    rows = _run(scaler, fused=False)
    assert [r["printed"] for r in rows[:-1]] == [None] * 6
    assert [(r["step"], r["stepped"]) for r in rows[:-1]] == [(i, True) for i in range(6)]
    record = scaler.last_step
    assert set(record) == _keys()
    assert record["reason"] == "" and record["scale"] == record["scale_next"] == 1.0
    assert math.isnan(record["grad_norm"]) and record["found_inf"] is False  # nothing was measured
    assert record["host_sync_reason"].startswith("the scaler is disabled")


def test_a_disabled_scaler_passes_on_a_closures_value_as_torchs() -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.LBFGS(model.parameters())

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(torch.ones(1, 2)).pow(2).sum()
        loss.backward()
        return loss

    ours = ampkit.GradScaler("cpu", enabled=False).step(opt, closure)
    assert isinstance(ours, torch.Tensor) and ours.item() > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GradScaler('cuda') with a GPU is enabled")
def test_a_cuda_scaler_without_a_gpu_keeps_the_idioms_shape() -> None:
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = ampkit.GradScaler("cuda")
    rows = _run(scaler, fused=False, steps=2)
    assert [(r["printed"], r["stepped"]) for r in rows[:-1]] == [(None, True), (None, True)]


def test_with_a_fused_optimizer_last_step_describes_this_step() -> None:
    synchronous = _run(ampkit.GradScaler("cpu", init_scale=256.0, sync="step"), fused=True)
    deferred = _run(ampkit.GradScaler("cpu", init_scale=256.0), fused=True)  # deferred from the 2nd step
    assert [r["host_sync"] for r in deferred[:-1]] == ["step"] + ["deferred"] * 5
    printed = [r["printed"] for r in deferred[:-1]]
    assert printed == [r["printed"] for r in synchronous[:-1]]
    assert printed[PLANT].startswith("skipped: ") and len(printed[PLANT]) > len("skipped: ")
    assert printed[:PLANT] + printed[PLANT + 1:] == [None] * 5
    assert [r["step"] for r in deferred[:-1]] == list(range(6))  # read right after step(): this step
    assert [r["stepped"] for r in deferred[:-1]] == [i != PLANT for i in range(6)]
    # reading it changes nothing the step does: scales and parameters are the synchronous run's
    assert [r["scale"] for r in deferred[:-1]] == [r["scale"] for r in synchronous[:-1]]
    for p, q in zip(deferred[-1]["parameters"], synchronous[-1]["parameters"], strict=True):
        assert torch.equal(p, q)


def test_between_step_and_update_the_state_is_still_the_one_before_the_update() -> None:
    scaler = ampkit.GradScaler("cpu", init_scale=256.0, sync="deferred")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the step stays deferred
        scaler.scale(model(torch.ones(2, 4)).sum() * math.inf).backward()
        assert not scaler.step(opt)
    assert scaler.last_step["found_inf"] is True and scaler.last_step["step"] == 0
    assert scaler.get_scale() == 256.0  # torch's: the update has not run
    scaler.update()
    assert scaler.get_scale() == 128.0
