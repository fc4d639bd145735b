"""Python cases: resumes in the real trainers (Lightning, Fabric, the HF Trainer; on the CPU) from a
checkpoint that lacks the scaler's state. Lost in silence (no warning, the scale restarted) is "lost";
strict loading must raise. The checkpoints are made with tests/python's own helpers."""

from __future__ import annotations

import functools
import os
import pathlib
import sys
import tempfile
import warnings
from typing import Any, Callable, List, Optional

from common import ROOT, Finding, PyCase

sys.path.insert(0, os.path.join(ROOT, "tests", "python"))


def _tmp() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="ampkit-adversarial-resume-"))


def _warned(body: Callable[[], Any], scale_of: Optional[Callable[[Any], float]], kept: float) -> None:
    """Runs ``body``; its scale must be ``kept``, or a warning must say the scale restarts (where
    ``scale_of`` is None, the state is known lost: the warning must come)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = body()
    said = [str(w.message) for w in caught if "restarts" in str(w.message)]
    if scale_of is None:
        if not said:
            raise Finding("lost", "the scaler state was not loaded, and no warning says so")
        return
    scale = scale_of(result)
    if scale != kept and not said:
        raise Finding("lost", f"the scale is {scale}, not {kept}, and no warning says so")
    if scale == kept and said:
        raise Finding("refused", f"the scale was kept but a warning says it restarts: {said[0]}")


@functools.lru_cache(maxsize=None)
def _lightning() -> tuple:
    import test_trainer_resume_state as t

    return t._lightning_checkpoint(_tmp())


def _lightning_case(which: int, strict: bool) -> Callable[[], Any]:
    def body() -> Any:
        import test_trainer_resume_state as t
        import test_trainers_lightning as lit

        path = _lightning()[which]
        if strict:
            return t._resume_lightning(lit._ampkit(strict_loading=True), path)
        _warned(lambda: t._resume_lightning(lit._ampkit(), path), lambda p: p.scaler.get_scale(), 512.0)

    return body


def _fabric_case(strip: bool, strict: bool) -> Callable[[], Any]:
    def body() -> Any:
        import test_trainers_fabric as fab
        import torch
        from ampkit.lightning import fabric_plugins
        from lightning.fabric.plugins import TorchCheckpointIO

        first = fab._ampkit_fabric()
        state = fab._setup(first)
        fab._train(first, state, range(3))
        path = _tmp() / "three.ckpt"
        first.save(path, state)
        if strip:
            checkpoint = torch.load(path, weights_only=True)
            checkpoint.pop("AmpkitFabricPrecision")
            TorchCheckpointIO().save_checkpoint(checkpoint, path)
        if strict:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                second = fab._fabric(fabric_plugins("cpu", strict_loading=True, **fab.AMPKIT))
            return second.load(path, fab._setup(second))
        second = fab._ampkit_fabric()
        _warned(
            lambda: second.load(path, fab._setup(second)), lambda _: second.strategy.precision.scaler.get_scale(), 512.0
        )

    return body


@functools.lru_cache(maxsize=None)
def _hf_checkpoint() -> str:
    import test_trainer_resume_state as t

    out = _tmp()
    trainer = t._hf_trainer(out, stop_at=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return os.path.join(str(out), "checkpoint-5")


def _hf_case(scaler_pt: str, strict: bool) -> Callable[[], Any]:
    def body() -> Any:
        import test_trainer_resume_state as t

        tmp = _tmp()
        copy, _ = t._variant(_hf_checkpoint(), tmp, scaler_pt)
        trainer = t._hf_trainer(tmp / "out", strict=strict)
        if strict or scaler_pt == "garbage":
            return trainer.train(resume_from_checkpoint=copy)
        _warned(lambda: trainer.train(resume_from_checkpoint=copy), None, 256.0)

    return body


def cases() -> List[PyCase]:
    klass = "resume without the scaler state"
    out = [
        PyCase(klass, "Lightning: whole checkpoint", _lightning_case(0, False), "ok", timeout=120),
        PyCase(klass, "Lightning: no AmpkitPrecision entry", _lightning_case(1, False), "ok", timeout=60),
        PyCase(
            klass,
            "Lightning: no entry, strict_loading",
            _lightning_case(1, True),
            "error",
            ["AmpkitPrecision"],
            ("RuntimeError",),
            timeout=60,
        ),
    ]
    for strip, strict in ((False, False), (True, False), (True, True)):
        label = "Fabric: " + ("no AmpkitFabricPrecision entry" if strip else "whole checkpoint")
        out.append(
            PyCase(
                klass,
                label + (", strict_loading" if strict else ""),
                _fabric_case(strip, strict),
                "error" if strict else "ok",
                ["AmpkitFabricPrecision"],
                ("RuntimeError",),
                timeout=60,
            )
        )
    for scaler_pt in ("missing", "a folder"):
        out.append(PyCase(klass, f"HF: scaler.pt {scaler_pt}", _hf_case(scaler_pt, False), "ok", timeout=120))
        out.append(
            PyCase(
                klass,
                f"HF: scaler.pt {scaler_pt}, strict_loading",
                _hf_case(scaler_pt, True),
                "error",
                ["scaler.pt"],
                ("RuntimeError",),
                timeout=120,
            )
        )
    out.append(PyCase(klass, "HF: scaler.pt garbage", _hf_case("garbage", False), "error", ["scaler.pt"], timeout=120))
    return out
