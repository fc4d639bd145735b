"""A resume that cannot restore the scaler's state says so, in the real trainers on the CPU: a
Lightning checkpoint without the AmpkitPrecision entry, a fabric.load of a checkpoint without the
AmpkitFabricPrecision entry, an HF resume_from_checkpoint whose scaler.pt is missing or a folder
give one warning naming what is missing (the stock trainers restart the scale in silence), and
strict_loading=True raises; a scaler.pt torch cannot read is one line naming it."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from typing import Any

import pytest
import test_trainers_fabric as fab
import test_trainers_lightning as lit
import test_trainers_transformers as hf
import torch
from accelerate.state import AcceleratorState, GradientState
from ampkit.lightning import AmpkitPrecision, fabric_plugins
from ampkit.transformers import AmpkitTrainer
from lightning.fabric.plugins import TorchCheckpointIO
from transformers import TrainingArguments

RESTARTS = "the loss scale restarts from 256 and the plugins' states start afresh"


def _lightning_checkpoint(tmp_path: Any) -> tuple:
    """A 3-step Lightning run's checkpoint, and the same without the AmpkitPrecision entry."""
    first = lit._trainer(lit._ampkit(), 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first.fit(lit.Tiny())
    whole = str(tmp_path / "three.ckpt")
    first.save_checkpoint(whole)
    checkpoint = torch.load(whole, weights_only=True)
    assert checkpoint["AmpkitPrecision"]["scale"] == 512.0  # grown once from 256 in 3 clean steps
    del checkpoint["AmpkitPrecision"]
    stripped = str(tmp_path / "stripped.ckpt")
    torch.save(checkpoint, stripped)
    return whole, stripped


def _resume_lightning(plugin: AmpkitPrecision, ckpt: str) -> AmpkitPrecision:
    trainer = lit._trainer(plugin, 3)  # restored, with no step to take
    trainer.fit(lit.Tiny(), ckpt_path=ckpt)
    return plugin


def test_a_lightning_checkpoint_without_the_scaler_state_is_named(tmp_path: Any) -> None:
    whole, stripped = _lightning_checkpoint(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = _resume_lightning(lit._ampkit(), whole)
    assert not [w for w in caught if "restarts" in str(w.message)]
    assert kept.scaler.get_scale() == 512.0
    message = f"ampkit.lightning.AmpkitPrecision: the checkpoint holds no 'AmpkitPrecision' entry: {RESTARTS}"
    with pytest.warns(UserWarning, match=re.escape(message)):
        lost = _resume_lightning(lit._ampkit(), stripped)
    assert lost.scaler.get_scale() == 256.0
    with pytest.raises(RuntimeError, match=re.escape(message + " (strict_loading=True)")):
        _resume_lightning(lit._ampkit(strict_loading=True), stripped)


def test_fabric_load_without_the_scaler_state_is_named(tmp_path: Any) -> None:
    first = fab._ampkit_fabric()
    state = fab._setup(first)
    fab._train(first, state, range(3))
    path = tmp_path / "three.ckpt"
    first.save(path, state)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint.pop("AmpkitFabricPrecision")["scale"] == 512.0
    stripped = tmp_path / "stripped.ckpt"
    TorchCheckpointIO().save_checkpoint(checkpoint, stripped)

    second = fab._ampkit_fabric()
    message = f"fabric.load: {stripped} holds no 'AmpkitFabricPrecision' entry: {RESTARTS}"
    with pytest.warns(UserWarning, match=re.escape(message)):
        second.load(stripped, fab._setup(second))
    assert second.strategy.precision.scaler.get_scale() == 256.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strict = fab._fabric(fabric_plugins("cpu", strict_loading=True, **fab.AMPKIT))
    with pytest.raises(RuntimeError, match=re.escape(message + " (strict_loading=True)")):
        strict.load(stripped, fab._setup(strict))


def _hf_trainer(out: Any, strict: bool = False, stop_at: Any = None) -> AmpkitTrainer:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    args = TrainingArguments(output_dir=str(out), max_steps=8, per_device_train_batch_size=4, learning_rate=0.1,
                             max_grad_norm=hf.CLIP, fp16=True, use_cpu=True, save_strategy="steps", save_steps=5,
                             report_to="none", seed=0, dataloader_num_workers=0, disable_tqdm=True,
                             optim="adamw_torch_fused")
    recorder = hf.Recorder(stop_at)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = AmpkitTrainer(model=hf.Tiny(), args=args, train_dataset=hf.Data(), callbacks=[recorder],
                                scaler_kwargs=dict(hf.SCALER), strict_loading=strict)
    recorder.trainer = trainer
    return trainer


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory: Any) -> str:
    out = tmp_path_factory.mktemp("hf")
    trainer = _hf_trainer(out, stop_at=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return os.path.join(str(out), "checkpoint-5")


def _variant(hf_checkpoint: str, tmp_path: Any, scaler_pt: str) -> tuple:
    """A copy of the checkpoint whose scaler.pt is "missing", "a folder" or "garbage"."""
    copy = str(tmp_path / "checkpoint-5")
    shutil.copytree(hf_checkpoint, copy)
    path = os.path.join(copy, "scaler.pt")
    saved = torch.load(path, weights_only=True)  # grown after 3 clean steps, halved by the inf, 1 clean step
    assert (saved["scale"], saved["_growth_tracker"]) == (256.0, 1)
    os.remove(path)
    if scaler_pt == "a folder":
        os.mkdir(path)
    elif scaler_pt == "garbage":
        with open(path, "wb") as f:
            f.write(b"not a checkpoint\n" * 4)
    return copy, path


@pytest.mark.parametrize("scaler_pt", ["missing", "a folder"])
def test_an_hf_resume_without_a_scaler_file_is_named(hf_checkpoint: str, tmp_path: Any, scaler_pt: str) -> None:
    copy, _ = _variant(hf_checkpoint, tmp_path, scaler_pt)
    message = (f"ampkit.transformers.AmpkitTrainer: resume_from_checkpoint {copy}: its scaler.pt is {scaler_pt}: "
               f"{RESTARTS}")
    trainer = _hf_trainer(tmp_path / "out")
    with pytest.warns(UserWarning, match=re.escape(message)):
        trainer.train(resume_from_checkpoint=copy)
    strict = _hf_trainer(tmp_path / "strict", strict=True)
    with pytest.raises(RuntimeError, match=re.escape(message + " (strict_loading=True)")):
        strict.train(resume_from_checkpoint=copy)


def test_an_hf_scaler_file_torch_cannot_read_is_one_line_naming_it(hf_checkpoint: str, tmp_path: Any) -> None:
    copy, path = _variant(hf_checkpoint, tmp_path, "garbage")
    with pytest.raises(ValueError) as caught:
        _hf_trainer(tmp_path / "out").train(resume_from_checkpoint=copy)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400
    assert message.startswith(f"scaler state {path}: torch.load(weights_only=True) cannot read it (")
