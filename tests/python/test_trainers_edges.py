"""The trainer integrations where a review against the stock trainers found them apart (session 10):
Accelerate's skip flag with a fused optimizer (whose step the deferred step always calls), a
disabled scaler on the CPU, an optimizer over some of the model's parameters under the HF
Trainer, bf16 with a named clipper; Lightning's configure_gradient_clipping override and a stock
MixedPrecision checkpoint; and a scaler made before the process group (Lightning's order)."""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, List, Tuple

import lightning as L
import pytest
import torch
import transformers
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from lightning.pytorch.plugins.precision import MixedPrecision
from transformers import TrainingArguments

import ampkit
import ampkit.accelerate
from ampkit.lightning import AmpkitPrecision
from ampkit.transformers import AmpkitTrainer

warnings.simplefilter("ignore")
logging.getLogger("lightning").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()


def _accelerator(kind: str, **kwargs: Any) -> Accelerator:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = Accelerator(mixed_precision="fp16", cpu=True)
    if kind == "torch":
        acc.native_amp, acc.scaler = True, torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=3)
    else:
        ampkit.accelerate.prepare_scaler(acc, init_scale=256.0, growth_interval=3, **kwargs)
    return acc


def test_accelerate_sees_a_skip_of_a_fused_optimizer_and_its_scheduler_holds() -> None:
    acc = _accelerator("ampkit")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    model, opt, sched = acc.prepare(model, opt, torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))
    rows: List[Tuple[bool, float]] = []
    for i in range(6):
        g = torch.Generator().manual_seed(i)
        loss = torch.nn.functional.mse_loss(model(torch.randn(4, 8, generator=g)).float(), torch.randn(4, 1, generator=g))
        acc.backward(loss * math.inf if i == 3 else loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        rows.append((acc.optimizer_step_was_skipped, sched.get_last_lr()[0]))
    assert acc.scaler.last_step["host_sync"] == "deferred"  # the step that always calls optimizer.step
    assert [r[0] for r in rows] == [False, False, False, True, False, False]
    assert [r[1] for r in rows] == [0.005, 0.0025, 0.00125, 0.00125, 0.000625, 0.0003125]


def test_a_disabled_scaler_on_the_cpu_installs_nothing() -> None:
    acc = _accelerator("ampkit", enabled=False)
    assert acc.scaler is None and not acc.native_amp  # fp32, as Accelerate alone runs fp16 on a CPU


def test_prepare_scaler_says_the_device_is_the_accelerators() -> None:
    with pytest.raises(TypeError, match=r"the scaler's device is the accelerator's \(cpu\); drop device='cuda'"):
        _accelerator("ampkit", device="cuda")


def _hf_model() -> torch.nn.Module:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Any:
            return {"loss": ((self.head(self.body(x)).float() - labels) ** 2).mean()}

    return M()


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_the_hf_trainer_trains_an_optimizer_over_some_parameters(tmp_path: Any, max_grad_norm: float) -> None:
    # transformers hands accelerator.clip_grad_norm_ all of model.parameters() (max_grad_norm=0: inf)
    torch.manual_seed(1)
    data = [{"x": torch.randn(8), "labels": torch.randn(1)} for _ in range(32)]
    args = TrainingArguments(str(tmp_path), max_steps=3, per_device_train_batch_size=4, fp16=True, use_cpu=True,
                             max_grad_norm=max_grad_norm, report_to="none", save_strategy="no", disable_tqdm=True)
    m = _hf_model()
    body, head = m.body.weight.detach().clone(), m.head.weight.detach().clone()
    t = AmpkitTrainer(model=m, args=args, train_dataset=data,
                      optimizers=(torch.optim.SGD(m.head.parameters(), lr=0.1), None), scaler_kwargs={})
    t.train()
    assert t.state.global_step == 3
    assert torch.equal(m.body.weight, body)  # no optimizer steps it
    assert (m.head.weight - head).abs().max() > 1e-3 and torch.isfinite(m.head.weight).all()


def test_the_hf_trainer_in_bf16_with_a_named_clipper_installs_nothing(tmp_path: Any) -> None:
    args = TrainingArguments(str(tmp_path), max_steps=1, bf16=True, use_cpu=True, report_to="none",
                             save_strategy="no", disable_tqdm=True)
    t = AmpkitTrainer(model=_hf_model(), args=args, train_dataset=[{"x": torch.randn(8), "labels": torch.randn(1)}],
                      scaler_kwargs={"clipper": "norm", "opt": {"clipper.max_norm": 0.5}})
    assert t.accelerator.scaler is None


class _Module(L.LightningModule):
    def __init__(self, clip_after: int = -1, plant: Tuple[int, ...] = ()) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net, self.clip_after, self.plant = torch.nn.Linear(8, 1), clip_after, plant

    def training_step(self, batch: Any, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        loss = ((self.net(torch.randn(4, 8, generator=g)).float() - 5) ** 2).mean()
        return loss * math.inf if self.global_step in self.plant else loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.zeros(64, 1), batch_size=1)


class _ClipsLater(_Module):
    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        if self.global_step >= 3:  # Lightning's documented pattern: clip only after a warm-up
            self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                                gradient_clip_algorithm=gradient_clip_algorithm)


def _fit(module: L.LightningModule, plugin: Any, steps: int, clip: Any = None, ckpt: Any = None) -> L.Trainer:
    t = L.Trainer(accelerator="cpu", max_steps=steps, gradient_clip_val=clip, plugins=[plugin], logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    t.fit(module, ckpt_path=ckpt)
    return t


def test_lightning_follows_the_modules_own_configure_gradient_clipping() -> None:
    weights = []
    for plugin in (MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu")), AmpkitPrecision("cpu")):
        m = _ClipsLater()
        _fit(m, plugin, 6, clip=0.5)
        weights.append([float(v) for v in m.net.weight.detach().flatten()])
    assert weights[1] == pytest.approx(weights[0], rel=1e-5)


def test_lightning_resumes_the_scale_of_a_stock_mixed_precision_checkpoint(tmp_path: Any) -> None:
    t = _fit(_Module(plant=(1, 2)), MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=256.0)), 4)
    t.save_checkpoint(tmp_path / "stock.ckpt")
    assert t.precision_plugin.scaler.get_scale() == 64.0  # two overflows
    resumed = _fit(_Module(), AmpkitPrecision("cpu", init_scale=256.0), 5, ckpt=tmp_path / "stock.ckpt")
    assert resumed.precision_plugin.scaler.get_scale() == 64.0


def test_a_scaler_made_before_the_process_group_serves_the_group(monkeypatch: Any) -> None:
    # Lightning makes its precision plugin (and so the scaler) before its strategy starts the group.
    scaler = ampkit.GradScaler("cpu", init_scale=512.0)
    assert scaler._pass_loss  # one process: the policy reads the loss too
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    m = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler.scale(m(torch.ones(2, 4)).sum() + math.nan).backward()  # this rank's loss alone is NaN
    assert scaler.step(opt)  # the gradients every rank shares are finite: a step on every rank
    scaler.update()
    assert not scaler._pass_loss and scaler.get_scale() == 512.0
