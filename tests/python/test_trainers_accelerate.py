"""ampkit.accelerate.prepare_scaler in a real HF Accelerate loop on the CPU, against torch's
GradScaler installed in the same Accelerator: an inf planted in the loss is skipped
(optimizer_step_was_skipped) and the prepared scheduler holds on it; accelerator.clip_grad_norm_
sets ampkit's clipper and returns the unclipped norm torch returns; save_state/load_state continue
the scale and the plugins' states exactly."""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Optional

import ampkit
import ampkit.accelerate
import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

PLANT = 3  # the step whose loss is multiplied by inf
MAX_NORM = 0.5
SCALER = {"init_scale": 256.0, "growth_interval": 3}
# spike detection on with a window but never judging: its window is plugin state that must resume
NAN_OPT = {"nan_policy.spike_zscore": 50.0, "nan_policy.spike_window": 4, "nan_policy.spike_min_samples": 100}


def _accelerator(kind: str, **ampkit_kwargs: Any) -> Accelerator:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = Accelerator(mixed_precision="fp16", cpu=True)
    if kind == "torch":  # the by-hand recipe: torch's scaler where Accelerate has none on the CPU
        acc.native_amp = True
        acc.scaler = torch.amp.GradScaler("cpu", **SCALER)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ampkit.accelerate.prepare_scaler(acc, **SCALER, **ampkit_kwargs)
    return acc


def _objects() -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)


def _train(acc: Accelerator, objs: tuple, steps: range, clip: Optional[float] = MAX_NORM) -> List[Dict[str, Any]]:
    model, opt, sched = objs
    rows = []
    for i in steps:
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x).float(), y) * 10
        if i == PLANT:
            loss = loss * math.inf
        acc.backward(loss)
        norm = acc.clip_grad_norm_(model.parameters(), clip) if clip is not None else None
        opt.step()
        sched.step()
        opt.zero_grad()
        rows.append({"skipped": acc.optimizer_step_was_skipped, "norm": None if norm is None else float(norm),
                     "scale": acc.scaler.get_scale(), "lr": sched.get_last_lr()[0]})
    return rows


def _run(kind: str, steps: range = range(8), **ampkit_kwargs: Any) -> tuple:
    acc = _accelerator(kind, **ampkit_kwargs)
    objs = acc.prepare(*_objects())
    return acc, objs, _train(acc, objs, steps)


def _same_norm(ours: float, torchs: float) -> bool:
    """The unclipped norm torch reports: equal within float32 rounding, or both non-finite."""
    if math.isfinite(torchs):
        return ours == pytest.approx(torchs, rel=1e-6)
    return not math.isfinite(ours)


def test_planted_overflow_is_skipped_and_clipping_matches_torch() -> None:
    _, (tmodel, _, _), torch_rows = _run("torch")
    acc, (amodel, _, _), rows = _run("ampkit")
    assert [r["skipped"] for r in rows] == [i == PLANT for i in range(8)]
    assert [r["skipped"] for r in rows] == [r["skipped"] for r in torch_rows]
    assert [r["scale"] for r in rows] == [r["scale"] for r in torch_rows]
    # the schedule holds on the skipped step: 0.1 * 0.9**(steps taken)
    assert [r["lr"] for r in rows] == [r["lr"] for r in torch_rows]
    assert rows[PLANT]["lr"] == rows[PLANT - 1]["lr"]
    # the unclipped norm, as torch's clip_grad_norm_ returns it
    assert all(_same_norm(a["norm"], b["norm"]) for a, b in zip(rows, torch_rows, strict=True))
    assert max(r["norm"] for r in rows if not r["skipped"]) > MAX_NORM  # so clipping happened
    assert acc.scaler.last_step["clip_threshold"] == MAX_NORM
    for p, q in zip(amodel.parameters(), tmodel.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_save_state_and_load_state_continue_exactly(tmp_path: Any) -> None:
    acc, (model, _, _), rows = _run("ampkit", nan_policy="skip", opt=NAN_OPT)
    assert acc.scaler.state_dict()["ampkit"]["nan_policy"]["state"]["grad_norm_window"]  # state worth keeping

    acc1 = _accelerator("ampkit", nan_policy="skip", opt=NAN_OPT)
    objs1 = acc1.prepare(*_objects())
    _train(acc1, objs1, range(5))
    acc1.save_state(str(tmp_path))
    saved = torch.load(tmp_path / "scaler.pt", weights_only=True)
    assert saved == acc1.scaler.state_dict() and "ampkit" in saved

    acc2 = _accelerator("ampkit", nan_policy="skip", opt=NAN_OPT)
    objs2 = acc2.prepare(*_objects())
    acc2.load_state(str(tmp_path))
    resumed = _train(acc2, objs2, range(5, 8))
    assert resumed == rows[5:]
    assert acc2.scaler.state_dict() == acc.scaler.state_dict()
    for p, q in zip(objs2[0].parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_named_clipper_refuses_the_trainers_clipping() -> None:
    acc = _accelerator("ampkit", clipper="norm", opt={"clipper.max_norm": 1.0})
    model, _, _ = acc.prepare(*_objects())
    acc.backward(model(torch.ones(2, 8)).float().sum())
    with pytest.raises(ValueError, match="two clippers"):
        acc.clip_grad_norm_(model.parameters(), MAX_NORM)
    with pytest.raises(ValueError, match="clipper='value'"):
        acc.clip_grad_value_(model.parameters(), 0.1)
    norm = acc.clip_grad_norm_(model.parameters(), math.inf)  # no limit: only asks for the norm
    assert float(norm) == pytest.approx(acc.scaler.last_step["grad_norm"], rel=1e-6)
    assert acc.scaler.last_step["clip_threshold"] == 1.0


def test_what_prepare_scaler_says_and_refuses() -> None:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = Accelerator(mixed_precision="fp16", cpu=True)
    with pytest.warns(UserWarning, match="Accelerate alone would have run"):
        scaler = ampkit.accelerate.prepare_scaler(acc)
    assert acc.scaler is scaler and acc.native_amp
    acc.prepare(*_objects())
    with pytest.raises(RuntimeError, match=r"before accelerator\.prepare"):
        ampkit.accelerate.prepare_scaler(acc)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    plain = Accelerator(mixed_precision="no", cpu=True)
    with pytest.warns(UserWarning, match="uses no loss scaler"):
        assert ampkit.accelerate.prepare_scaler(plain) is None
    assert plain.scaler is None
