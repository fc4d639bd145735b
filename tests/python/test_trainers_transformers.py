"""ampkit.transformers.AmpkitTrainer, a real HF transformers.Trainer on the CPU, against the same
Trainer with torch's GradScaler installed by hand: an inf planted in the loss is skipped and the
scheduler holds, max_grad_norm clips once (ampkit's clipper) and the logged grad_norm is the
unclipped one, and resume_from_checkpoint continues the scale and the plugins' states exactly,
with scaler.pt loaded under torch.load(weights_only=True)."""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Any, Dict, List, Optional

import pytest
import torch
import transformers
from accelerate.state import AcceleratorState, GradientState
from ampkit.transformers import AmpkitTrainer
from transformers import Trainer, TrainerCallback, TrainingArguments

PLANT = 3  # global step whose loss is multiplied by inf
CLIP = 0.5
SCALER = {"init_scale": 256.0, "growth_interval": 3}
NAN_OPT = {"nan_policy.spike_zscore": 50.0, "nan_policy.spike_window": 4, "nan_policy.spike_min_samples": 100}

transformers.logging.set_verbosity_error()
logging.getLogger("accelerate").setLevel(logging.ERROR)


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.plant = False

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Dict[str, torch.Tensor]:
        out = self.net(x)
        loss = torch.nn.functional.mse_loss(out.float(), labels) * 10
        return {"loss": loss * math.inf if self.plant else loss, "logits": out}


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, generator=g), "labels": torch.randn(1, generator=g)}


class Recorder(TrainerCallback):
    """Plants the overflow and records what the Trainer did at each step."""

    def __init__(self, stop_at: Optional[int] = None) -> None:
        self.trainer: Any = None
        self.rows: List[Dict[str, Any]] = []
        self.stop_at = stop_at

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        model.plant = state.global_step == PLANT

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        acc = self.trainer.accelerator
        self.rows.append({"skipped": acc.optimizer_step_was_skipped, "scale": acc.scaler.get_scale()})
        if state.global_step == self.stop_at:
            control.should_training_stop = True


class TorchScalerTrainer(Trainer):
    """The issue's by-hand recipe: torch's GradScaler where Accelerate has none on the CPU."""

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        self.accelerator.native_amp = True
        self.accelerator.scaler = torch.amp.GradScaler("cpu", **SCALER)


def _train(tmp: Any, ampkit_kwargs: Optional[Dict[str, Any]], stop_at: Optional[int] = None,
           resume: Optional[str] = None, max_grad_norm: float = CLIP, optim: str = "adamw_torch_fused") -> tuple:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    args = TrainingArguments(output_dir=str(tmp), max_steps=8, per_device_train_batch_size=4, learning_rate=0.1,
                             max_grad_norm=max_grad_norm, fp16=True, use_cpu=True, logging_steps=1,
                             save_strategy="steps", save_steps=5, report_to="none", seed=0,
                             dataloader_num_workers=0, disable_tqdm=True, optim=optim)
    recorder = Recorder(stop_at)
    common = dict(model=Tiny(), args=args, train_dataset=Data(), callbacks=[recorder])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = (TorchScalerTrainer(**common) if ampkit_kwargs is None
                   else AmpkitTrainer(**common, scaler_kwargs=dict(SCALER, **ampkit_kwargs)))
        recorder.trainer = trainer
        trainer.train(resume_from_checkpoint=resume)
    logs = [h for h in trainer.state.log_history if "grad_norm" in h]
    return trainer, recorder.rows, logs


def _same_norm(ours: float, torchs: float) -> bool:
    """The unclipped norm torch reports: equal within float32 rounding, or both non-finite."""
    if math.isfinite(torchs):
        return ours == pytest.approx(torchs, rel=1e-6)
    return not math.isfinite(ours)


def test_trainer_skips_the_overflow_and_logs_the_unclipped_norm(tmp_path: Any) -> None:
    theirs, torch_rows, torch_logs = _train(tmp_path / "torch", None, optim="adamw_torch")
    ours, rows, logs = _train(tmp_path / "ampkit", {}, optim="adamw_torch")
    assert [r["skipped"] for r in rows] == [i == PLANT for i in range(8)] == [r["skipped"] for r in torch_rows]
    assert [r["scale"] for r in rows] == [r["scale"] for r in torch_rows]
    assert [h["learning_rate"] for h in logs] == [h["learning_rate"] for h in torch_logs]
    assert logs[PLANT + 1]["learning_rate"] == logs[PLANT]["learning_rate"]  # the scheduler held
    assert all(_same_norm(a["grad_norm"], b["grad_norm"]) for a, b in zip(logs, torch_logs, strict=True))
    assert max(h["grad_norm"] for h in logs if math.isfinite(h["grad_norm"])) > CLIP
    assert ours.accelerator.scaler.last_step["clip_threshold"] == CLIP
    for p, q in zip(ours.model.parameters(), theirs.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_with_the_default_fused_adamw_the_skip_is_seen_where_torchs_is_not(tmp_path: Any) -> None:
    """torch's GradScaler hands a fused optimizer found_inf and calls its step(), which then does
    nothing: Accelerate takes the call for a step, so optimizer_step_was_skipped stays False and
    the Trainer's scheduler advances on the skipped step. ampkit never calls step() on a skipped
    step: the flag is right and the schedule holds."""
    _, torch_rows, torch_logs = _train(tmp_path / "torch", None)
    ours, rows, logs = _train(tmp_path / "ampkit", {})
    assert ours.optimizer.optimizer.defaults["fused"]
    assert [r["skipped"] for r in rows] == [i == PLANT for i in range(8)]
    assert not any(r["skipped"] for r in torch_rows)
    assert [r["scale"] for r in rows] == [r["scale"] for r in torch_rows]  # both saw the overflow
    assert logs[PLANT + 1]["learning_rate"] == logs[PLANT]["learning_rate"]
    assert torch_logs[PLANT + 1]["learning_rate"] < torch_logs[PLANT]["learning_rate"]


def test_resume_from_checkpoint_continues_exactly(tmp_path: Any) -> None:
    kwargs = {"nan_policy": "skip", "opt": NAN_OPT}
    whole, rows, logs = _train(tmp_path / "whole", kwargs)
    _train(tmp_path / "part", kwargs, stop_at=5)
    checkpoint = os.path.join(str(tmp_path / "part"), "checkpoint-5")
    saved = torch.load(os.path.join(checkpoint, "scaler.pt"), weights_only=True)
    assert saved["ampkit"]["nan_policy"]["state"]["grad_norm_window"]
    resumed, rows2, logs2 = _train(tmp_path / "part", kwargs, resume=checkpoint)
    assert rows2 == rows[5:]
    # log_history comes back from the checkpoint's trainer_state.json: the 8 steps of one run
    assert [repr(h["grad_norm"]) for h in logs2] == [repr(h["grad_norm"]) for h in logs]  # nan == nan
    assert [h["learning_rate"] for h in logs2] == [h["learning_rate"] for h in logs]
    assert resumed.accelerator.scaler.state_dict() == whole.accelerator.scaler.state_dict()
    for p, q in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_named_clipper_with_max_grad_norm_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="two clippers"):
        _train(tmp_path, {"clipper": "norm"})
    trainer, _, logs = _train(tmp_path, {"clipper": "norm", "opt": {"clipper.max_norm": CLIP}}, max_grad_norm=0.0)
    assert trainer.accelerator.scaler.last_step["clip_threshold"] == CLIP
    assert max(h["grad_norm"] for h in logs if math.isfinite(h["grad_norm"])) > CLIP  # unclipped, still


def test_fp16_on_the_cpu_is_said(tmp_path: Any) -> None:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    args = TrainingArguments(output_dir=str(tmp_path), fp16=True, use_cpu=True, report_to="none")
    with pytest.warns(UserWarning, match="as fp32, without a scaler"):
        AmpkitTrainer(model=Tiny(), args=args, train_dataset=Data())
