"""The step that never waits for the GPU, on CPU tensors: ampkit.GradScaler(sync="deferred")
with a fused AdamW makes no host read per step, and its scales, skips, parameters, plugin states and
records equal the synchronous step's, bit for bit, over 300 steps with planted overflows, a
non-finite loss and the backoff policy's extra backoff; the scale sequence is torch.amp.GradScaler's."""

import warnings
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch

import ampkit

OVERFLOWS = {7, 8, 40, 41, 42, 120, 200, 201, 260}
NAN_LOSS = {90, 150}


def _run(sync: str, steps: int = 300, recipe: str = "automatic", policy: str = "skip", torch_way: bool = False,
         scaler_name: str = "dynamic") -> Dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    if torch_way:
        scaler: Any = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=10)
    else:
        dynamic = {"init_scale": 2.0**12, "growth_interval": 10} if scaler_name == "dynamic" else {}
        scaler = ampkit.GradScaler("cpu", sync=sync, stats_recipe=recipe, scaler=scaler_name, clipper="norm",
                                   opt={"clipper.max_norm": 0.5}, nan_policy=policy, **dynamic)
    gen = torch.Generator().manual_seed(1)
    out: Dict[str, List[Any]] = {"scales": [], "stepped": [], "reads": [], "states": []}
    for i in range(steps):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if i in NAN_LOSS:
            loss = loss * float("nan")
        before = torch.ops.ampkit.host_reads()
        scaler.scale(loss).backward()
        if i in OVERFLOWS:
            model[0].weight.grad[0, 0] = float("inf")
        if torch_way:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        stepped = scaler.step(opt)
        scaler.update()
        out["reads"].append(torch.ops.ampkit.host_reads() - before)
        if not torch_way:
            out["stepped"].append(stepped)
    # Read after the loop: reading inside it would wait for every step (what the reads count excludes).
    out["stepped"] = [bool(s) for s in out["stepped"]]
    out["params"] = [p.detach().clone() for p in model.parameters()]
    out["scale"] = scaler.get_scale()
    out["state"] = scaler.state_dict()
    last = scaler.last_step if not torch_way else {}
    out["host_sync"] = (last.get("host_sync"), last.get("host_sync_reason"))
    out["record"] = {k: v for k, v in last.items()
                     if k not in ("top_layers", "layer_norms", "host_sync", "host_sync_reason")}
    return out


@pytest.mark.parametrize("recipe", ["fused_scan", "chunk_kernel"])
@pytest.mark.parametrize("policy", ["skip", "backoff"])
def test_deferred_steps_equal_synchronous_ones_bit_for_bit(recipe, policy):
    sync = _run("step", recipe=recipe, policy=policy)
    deferred = _run("deferred", recipe=recipe, policy=policy)
    assert sync["reads"] == [1] * 300
    assert deferred["reads"] == [0] * 300  # no host read in any step, healthy or not
    assert deferred["stepped"] == sync["stepped"]
    assert sum(not s for s in sync["stepped"]) == len(OVERFLOWS) + len(NAN_LOSS)
    assert all(torch.equal(a, b) for a, b in zip(deferred["params"], sync["params"]))
    assert deferred["scale"] == sync["scale"]
    assert deferred["state"] == sync["state"]
    assert deferred["record"] == sync["record"]
    assert deferred["record"]["stats_recipe"] == recipe


def test_the_scale_sequence_is_torchs():
    mine = _run("deferred", steps=120)
    torch_way = _run("", steps=120, torch_way=True)
    assert mine["scale"] == torch_way["scale"]
    assert mine["state"]["_growth_tracker"] == torch_way["state"]["_growth_tracker"]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(mine["params"], torch_way["params"]))


def test_auto_goes_deferred_after_one_synchronous_iteration():
    auto = _run("auto", steps=20)
    assert auto["reads"] == [1] + [0] * 19
    assert auto["host_sync"] == ("deferred", "sync='auto': every strategy has a device form and the optimizer is fused")
    one = _run("auto", steps=1)
    assert one["host_sync"] == ("step", "sync='auto': the first iteration is synchronous, to see how many optimizers it steps")
    assert _run("step", steps=2)["host_sync"] == ("step", "sync='step'")


def test_a_strategy_without_a_device_form_keeps_the_step_synchronous_and_says_so():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _run("deferred", steps=12, scaler_name="predictive")
    said = [str(w.message) for w in caught if "synchronous" in str(w.message)]
    assert said == ["ampkit.GradScaler: the step stays synchronous: scaler 'predictive' has no device form"]
    assert run["reads"] == [1] * 12
    assert run["host_sync"] == ("step", "sync='deferred': scaler 'predictive' has no device form")


def run_until_abort(sync: str, captured: Optional[Callable[[int, bool], None]] = None):
    """10 steps with a NaN loss at step 4 under nan_policy='abort': (the step whose update() raised,
    or 10 for the read after the loop, the message, the parameters), or None. ``captured(i, on)``
    marks step i as captured in a CUDA graph and back (test_cuda_graph's CPU stand-in)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    scaler = ampkit.GradScaler("cpu", nan_policy="abort", sync=sync)
    for i in range(10):
        opt.zero_grad()
        if captured:
            captured(i, True)
        loss = model(torch.ones(3, 4)).sum() * (float("nan") if i == 4 else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        try:
            scaler.update()
        except ampkit.TrainingAborted as e:
            return i, str(e), [p.detach().clone() for p in model.parameters()]
        finally:
            if captured:
                captured(i, False)
    try:
        scaler.get_scale()  # a record still on its way is delivered here at the latest
    except ampkit.TrainingAborted as e:
        return 10, str(e), [p.detach().clone() for p in model.parameters()]
    return None


def test_an_abort_reaches_python_and_no_step_after_it_is_applied():
    run = run_until_abort
    sync, deferred = run("step"), run("deferred")
    assert sync[0] == 4 and "non-finite loss" in sync[1]
    assert sync[1].startswith("nan_policy 'abort' aborted training at step 4: "), sync[1]
    assert deferred is not None and deferred[0] in (4, 5) and deferred[1] == sync[1]
    assert all(torch.equal(a, b) for a, b in zip(deferred[2], sync[2]))  # nothing applied after it


def test_state_dict_every_step_sees_every_step_in_order():
    def states(sync):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        scaler = ampkit.GradScaler("cpu", init_scale=4.0, growth_interval=2, sync=sync)
        seen = []
        for i in range(12):
            opt.zero_grad()
            scaler.scale(model(torch.ones(3, 4)).sum()).backward()
            if i in (3, 7):
                model.weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            seen.append((scaler.state_dict()["scale"], scaler.last_step["step"], scaler.last_step["stepped"]))
        return seen

    assert states("deferred") == states("step")
