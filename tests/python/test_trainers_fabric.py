"""ampkit.lightning.fabric_plugins in a real lightning.Fabric loop on the CPU, against torch's
GradScaler in Fabric's own MixedPrecision plugin + fabric.clip_gradients: an inf planted in the loss
is skipped and the schedule holds, ampkit's clipper clips once with the unclipped norm in its
record, and fabric.save/fabric.load carry the scaler's and the plugins' states without the user
adding them."""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List

import ampkit
import lightning as L
import pytest
import torch
from ampkit.lightning import AmpkitFabricPrecision, fabric_plugins
from lightning.fabric.plugins.precision import MixedPrecision

PLANT = 3
CLIP = 0.5
SCALER = {"init_scale": 256.0, "growth_interval": 3}
AMPKIT = dict(SCALER, clipper="norm", nan_policy="skip",
              opt={"clipper.max_norm": CLIP, "nan_policy.spike_zscore": 50.0, "nan_policy.spike_window": 4,
                   "nan_policy.spike_min_samples": 100})


def _fabric(plugins: Any) -> L.Fabric:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return L.Fabric(accelerator="cpu", devices=1, plugins=plugins)


def _ampkit_fabric() -> L.Fabric:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _fabric(fabric_plugins("cpu", **AMPKIT))


def _setup(fabric: L.Fabric) -> Dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
    model, opt = fabric.setup(model, opt)
    return {"model": model, "optimizer": opt, "scheduler": sched}


def _train(fabric: L.Fabric, state: Dict[str, Any], steps: range) -> List[Dict[str, Any]]:
    model, opt, sched = state["model"], state["optimizer"], state["scheduler"]
    scaler = fabric.strategy.precision.scaler
    rows = []
    for i in steps:
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x).float(), y) * 10
        fabric.backward(loss * math.inf if i == PLANT else loss)
        if not isinstance(scaler, ampkit.GradScaler):  # torch: unscale, clip, and the norm clip returns
            norm = float(fabric.clip_gradients(model, opt, max_norm=CLIP, error_if_nonfinite=False))
            before = scaler.get_scale()
            opt.step()
            stepped = scaler.get_scale() >= before  # torch says only through the scale
        else:
            stepped = opt.step()  # ampkit.GradScaler.step's answer, through Fabric
            norm = scaler.last_step["grad_norm"]
        if stepped:
            sched.step()
        opt.zero_grad()
        rows.append({"stepped": stepped, "norm": norm, "scale": scaler.get_scale(), "lr": sched.get_last_lr()[0]})
    return rows


def _same_norm(ours: float, torchs: float) -> bool:
    """The unclipped norm torch reports: equal within float32 rounding, or both non-finite."""
    if math.isfinite(torchs):
        return ours == pytest.approx(torchs, rel=1e-6)
    return not math.isfinite(ours)


def test_fabric_loop_skips_the_overflow_and_clips_once_as_torch() -> None:
    torch_fabric = _fabric([MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", **SCALER))])
    theirs = _setup(torch_fabric)
    torch_rows = _train(torch_fabric, theirs, range(8))
    fabric = _ampkit_fabric()
    ours = _setup(fabric)
    rows = _train(fabric, ours, range(8))
    assert [r["stepped"] for r in rows] == [i != PLANT for i in range(8)] == [r["stepped"] for r in torch_rows]
    assert [r["scale"] for r in rows] == [r["scale"] for r in torch_rows]
    assert [r["lr"] for r in rows] == [r["lr"] for r in torch_rows]
    assert rows[PLANT]["lr"] == rows[PLANT - 1]["lr"]  # the schedule holds on the skipped step
    assert all(_same_norm(a["norm"], b["norm"]) for a, b in zip(rows, torch_rows, strict=True))
    assert max(r["norm"] for r in rows if r["stepped"]) > CLIP
    for p, q in zip(ours["model"].parameters(), theirs["model"].parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_fabric_save_and_load_carry_the_scaler_state(tmp_path: Any) -> None:
    fabric = _ampkit_fabric()
    whole = _setup(fabric)
    rows = _train(fabric, whole, range(8))
    first = _ampkit_fabric()
    state = _setup(first)
    _train(first, state, range(5))
    path = tmp_path / "five.ckpt"
    first.save(path, state)  # the user's state: no scaler in it
    saved = torch.load(path, weights_only=True)["AmpkitFabricPrecision"]
    assert saved == first.strategy.precision.scaler.state_dict()
    assert saved["ampkit"]["nan_policy"]["state"]["grad_norm_window"]

    second = _ampkit_fabric()
    state2 = _setup(second)
    assert second.load(path, state2) == {}
    assert _train(second, state2, range(5, 8)) == rows[5:]
    assert second.strategy.precision.scaler.state_dict() == fabric.strategy.precision.scaler.state_dict()
    for p, q in zip(state2["model"].parameters(), whole["model"].parameters(), strict=True):
        assert torch.equal(p, q)


def test_fabric_clip_gradients_is_refused() -> None:
    fabric = _ampkit_fabric()
    state = _setup(fabric)
    fabric.backward(state["model"](torch.ones(2, 8)).float().sum())
    with pytest.raises(RuntimeError, match="clip with ampkit's clipper instead"):
        fabric.clip_gradients(state["model"], state["optimizer"], max_norm=1.0)


def test_fabric_fp16_on_the_cpu_is_said() -> None:
    with pytest.warns(UserWarning, match="would have switched to 'bf16-mixed'"):
        AmpkitFabricPrecision("cpu")
