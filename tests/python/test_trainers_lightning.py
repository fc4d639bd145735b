"""ampkit.lightning in a real lightning.Trainer and a real Fabric loop on the CPU, against torch's
GradScaler in Lightning's own MixedPrecision plugin: an inf planted in the loss is skipped, the LR
schedule matches, the Trainer's gradient_clip_val clips once (ampkit's clipper) with the unclipped
norm reported, and a resume from the trainer's own checkpoint continues the scale and the plugins'
states exactly."""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, Dict, List, Optional

import ampkit
import lightning as L
import pytest
import torch
from ampkit.lightning import AmpkitPrecision
from lightning.pytorch.plugins.precision import MixedPrecision

PLANT = 3
CLIP = 0.5
STEPS = 8
SCALER = {"init_scale": 256.0, "growth_interval": 3}
NAN_OPT = {"nan_policy.spike_zscore": 50.0, "nan_policy.spike_window": 4, "nan_policy.spike_min_samples": 100}

logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def batch(step: int) -> tuple:
    """The batch of a step, whatever the loader gave (a resumed epoch starts the loader anew)."""
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.rows: List[Dict[str, Any]] = []

    def training_step(self, _: Any, __: int) -> torch.Tensor:
        x, y = batch(self.global_step)
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y) * 10
        return loss * math.inf if self.global_step == PLANT else loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        scaler = self.trainer.precision_plugin.scaler
        if isinstance(scaler, ampkit.GradScaler):  # ampkit: unscaled and clipped; its record keeps the norm
            self.rows.append({"norm": scaler.last_step["grad_norm"]})
        else:  # torch: unscaled, not clipped yet
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            self.rows.append({"norm": float(torch.nn.utils.get_total_norm(grads))})

    def on_train_batch_end(self, *_: Any) -> None:
        scaler = self.trainer.precision_plugin.scaler
        self.rows[-1].update(scale=scaler.get_scale(), lr=self.trainer.optimizers[0].param_groups[0]["lr"])

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        self.steps_taken = 0
        opt.register_step_post_hook(lambda *_: setattr(self, "steps_taken", self.steps_taken + 1))
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(64, 1)), batch_size=1)


def _trainer(plugin: Any, max_steps: int, clip: Optional[float] = CLIP, algorithm: str = "norm") -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, plugins=[plugin], gradient_clip_val=clip,
                     gradient_clip_algorithm=algorithm,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)


def _ampkit(**kwargs: Any) -> AmpkitPrecision:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AmpkitPrecision("cpu", **SCALER, **kwargs)


def _fit(plugin: Any, max_steps: int = STEPS, ckpt: Optional[str] = None, **kw: Any) -> tuple:
    model = Tiny()
    trainer = _trainer(plugin, max_steps, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, ckpt_path=ckpt)
    return trainer, model


def _same_norm(ours: float, torchs: float) -> bool:
    """The unclipped norm torch reports: equal within float32 rounding, or both non-finite."""
    if math.isfinite(torchs):
        return ours == pytest.approx(torchs, rel=1e-6)
    return not math.isfinite(ours)


def test_trainer_skips_the_overflow_and_clips_once_as_torch() -> None:
    _, theirs = _fit(MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", **SCALER)))
    trainer, ours = _fit(_ampkit())
    assert ours.steps_taken == theirs.steps_taken == STEPS - 1  # the planted step alone was skipped
    assert [r["scale"] for r in ours.rows] == [r["scale"] for r in theirs.rows]
    assert ours.rows[PLANT]["scale"] == ours.rows[PLANT - 1]["scale"] / 2
    assert [r["lr"] for r in ours.rows] == [r["lr"] for r in theirs.rows]  # Lightning's schedule, as torch's
    # the unclipped norm torch's hook sees
    assert all(_same_norm(a["norm"], b["norm"]) for a, b in zip(ours.rows, theirs.rows, strict=True))
    assert max(r["norm"] for r in ours.rows if math.isfinite(r["norm"])) > CLIP
    scaler = trainer.precision_plugin.scaler
    assert scaler.last_step["clip_threshold"] == CLIP and scaler.last_step["grad_norm_clipped"] <= CLIP + 1e-6
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_trainer_checkpoint_resumes_scale_and_plugin_states_exactly(tmp_path: Any) -> None:
    whole, model = _fit(_ampkit(nan_policy="skip", opt=NAN_OPT))
    first, _ = _fit(_ampkit(nan_policy="skip", opt=NAN_OPT), max_steps=5)
    path = str(tmp_path / "five.ckpt")
    first.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["AmpkitPrecision"]
    assert saved == first.precision_plugin.scaler.state_dict()
    assert saved["ampkit"]["nan_policy"]["state"]["grad_norm_window"]
    resumed, model2 = _fit(_ampkit(nan_policy="skip", opt=NAN_OPT), ckpt=path)
    assert resumed.precision_plugin.scaler.state_dict() == whole.precision_plugin.scaler.state_dict()
    assert model2.rows == model.rows[5:]
    for p, q in zip(model2.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_trainer_clipping_with_a_named_clipper_is_refused() -> None:
    with pytest.raises(ValueError, match="two clippers"):
        _fit(_ampkit(clipper="norm", opt={"clipper.max_norm": 1.0}))
    with pytest.raises(ValueError, match="clipper='value'"):
        _fit(_ampkit(), max_steps=2, algorithm="value")


def test_fp16_on_the_cpu_is_said() -> None:
    with pytest.warns(UserWarning, match="would have switched to 'bf16-mixed'"):
        AmpkitPrecision("cpu")
