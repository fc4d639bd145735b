"""ampkit in the HF ``transformers.Trainer``: a mixin, and the Trainer with it::

    trainer = ampkit.transformers.AmpkitTrainer(model=model, args=TrainingArguments(..., fp16=True),
                                                train_dataset=data, scaler_kwargs={"nan_policy": "skip"})

The Trainer's accelerator gets an :class:`ampkit.GradScaler` (:func:`ampkit.accelerate.
prepare_scaler`) as soon as it is created, before ``prepare``: the Trainer scales, skips (its
scheduler holds on ``optimizer_step_was_skipped``), logs ``grad_norm`` and saves ``scaler.pt``
(loaded back with ``torch.load(weights_only=True)`` on ``resume_from_checkpoint``) as it does
with torch's scaler. ``max_grad_norm`` sets ampkit's ``norm`` clipper. docs/python.md, "Your
trainer".
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from transformers import Trainer

from ._arguments import check_types
from ._files import load_torch_state
from ._trainers import names_a_clipper, say_state_missing
from .accelerate import prepare_scaler
from .grad_scaler import GradScaler

_SCALER_FILE = "scaler.pt"  # the Trainer's SCALER_NAME

__all__ = ["AmpkitTrainer", "AmpkitTrainerMixin"]


class AmpkitTrainerMixin:
    """Put it before ``Trainer`` (or any subclass of it: ``Seq2SeqTrainer``, TRL's trainers) in
    the bases: ``class MyTrainer(AmpkitTrainerMixin, Seq2SeqTrainer)``.

    :param scaler_kwargs: :class:`ampkit.GradScaler`'s keyword arguments but ``device``. Without
        ``clipper`` the Trainer's ``max_grad_norm`` is ampkit's ``norm`` clipper's ``max_norm``
        and the logged ``grad_norm`` is the unclipped one; with ``clipper``, ``max_grad_norm``
        must be 0 (the logged ``grad_norm`` is then still the unclipped norm).
    :param strict_loading: a ``resume_from_checkpoint`` folder without a ``scaler.pt`` file raises
        RuntimeError; False (default): one warning names it and the scale restarts (the stock
        Trainer restarts it in silence).
    :raises ValueError: ``clipper`` given with ``max_grad_norm > 0``; a ``scaler.pt`` that is not a
        regular file or that ``torch.load(weights_only=True)`` cannot read (one line naming it).
    """

    def __init__(
        self,
        *args: Any,
        scaler_kwargs: Optional[Mapping[str, Any]] = None,
        strict_loading: bool = False,
        **kwargs: Any,
    ) -> None:
        check_types(
            "ampkit.transformers.AmpkitTrainer",
            {"scaler_kwargs": scaler_kwargs, "strict_loading": strict_loading},
            {"scaler_kwargs": (Mapping, type(None)), "strict_loading": (bool,)},
        )
        self._ampkit_scaler_kwargs = dict(scaler_kwargs or {})
        self._ampkit_strict_loading = strict_loading
        super().__init__(*args, **kwargs)

    def create_accelerator_and_postprocess(self) -> None:
        """The Trainer's accelerator, then ampkit's scaler in it (before ``prepare``)."""
        super().create_accelerator_and_postprocess()  # type: ignore[misc]
        max_grad_norm = float(self.args.max_grad_norm or 0.0)  # type: ignore[attr-defined]
        fp16 = self.accelerator.mixed_precision == "fp16"  # type: ignore[attr-defined]
        if fp16 and names_a_clipper(self._ampkit_scaler_kwargs) and max_grad_norm > 0:  # else: nothing installed
            raise ValueError(
                f"TrainingArguments(max_grad_norm={max_grad_norm:g}) with ampkit's clipper named in "
                "scaler_kwargs: two clippers. Set max_grad_norm=0 (the Trainer still logs the "
                "unclipped grad_norm), or leave clipper out so that max_grad_norm sets ampkit's "
                "'norm' clipper"
            )
        prepare_scaler(self.accelerator, **self._ampkit_scaler_kwargs)  # type: ignore[attr-defined]

    def _load_scaler(self, checkpoint: Optional[str]) -> None:
        """The Trainer's resume of ``scaler.pt``, saying what it cannot load: a missing file, or a
        folder in its place, is one warning naming it (RuntimeError with ``strict_loading``); a
        file torch cannot read is one ValueError naming it."""
        scaler = getattr(getattr(self, "accelerator", None), "scaler", None)
        if checkpoint is None or not isinstance(scaler, GradScaler):
            return super()._load_scaler(checkpoint)  # type: ignore[misc]
        path = os.path.join(checkpoint, _SCALER_FILE)
        if not os.path.exists(path) or os.path.isdir(path):
            found = "a folder" if os.path.isdir(path) else "missing"
            missing = f"resume_from_checkpoint {checkpoint}: its {_SCALER_FILE} is {found}"
            return say_state_missing("ampkit.transformers.AmpkitTrainer", missing, scaler, self._ampkit_strict_loading)
        scaler.load_state_dict(load_torch_state(path, "scaler state"))


class AmpkitTrainer(AmpkitTrainerMixin, Trainer):
    """``transformers.Trainer`` with ampkit's loss scaling, clipping and NaN policy
    (:class:`AmpkitTrainerMixin`): ``AmpkitTrainer(..., scaler_kwargs={...})``."""
