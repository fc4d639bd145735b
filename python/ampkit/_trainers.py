"""What the trainer integrations share (ampkit.lightning, ampkit.accelerate, ampkit.transformers):
one clipper, never two, and one line where a trainer would have run fp16 otherwise.

A trainer that clips (Lightning's ``gradient_clip_val``, ``accelerator.clip_grad_norm_``, the HF
Trainer's ``max_grad_norm``) configures ampkit's clipper, which clips inside the scaler's
``unscale_``/``step``, on the unscaled gradients, in the same multiply as the unscale; the
trainer's own clipping call then clips nothing and reports the unclipped norm, as
``torch.nn.utils.clip_grad_norm_`` returns it. That works when the integration chose the clipper
(``norm``, with no limit until the trainer gives one). A user who names a clipper has chosen
ampkit's clipping, and a trainer that clips as well is refused: two thresholds, one of which would
silently win.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any, Dict, Mapping, Tuple

import torch

from ._arguments import check_arguments
from ._deferred import _caller_level
from .grad_scaler import GradScaler

__all__ = [
    "NO_LIMIT",
    "TrainerClipping",
    "make_scaler",
    "names_a_clipper",
    "say_state_missing",
    "set_clipper_option",
    "warn_fp16_on_cpu",
]

# The norm clipper's threshold while the trainer has given none: it never clips (the coefficient
# max_norm / (norm + 1e-6) is at least 1 for every finite norm). The option takes finite numbers.
NO_LIMIT = sys.float_info.max


def names_a_clipper(kwargs: Mapping[str, Any]) -> bool:
    opt = kwargs.get("opt") or {}
    return "clipper" in kwargs or any(str(k).startswith("clipper.") for k in opt)


def make_scaler(device: str, kwargs: Mapping[str, Any], who: str) -> Tuple[GradScaler, "TrainerClipping"]:
    """An :class:`ampkit.GradScaler` on ``device`` from a trainer integration's keyword arguments,
    and the :class:`TrainerClipping` that decides what the trainer's clipping does with it.

    Without ``clipper=`` (and no ``clipper.*`` option) the scaler gets the ``norm`` clipper with no
    limit, for the trainer's threshold to configure. ``who``: the integration, named in the errors
    of arguments of the wrong type."""
    check_arguments(dict(kwargs, device=device), who)
    kwargs = dict(kwargs)
    follows = not names_a_clipper(kwargs)
    if follows:
        kwargs["clipper"] = "norm"
        kwargs["opt"] = dict(kwargs.get("opt") or {}, **{"clipper.max_norm": NO_LIMIT})
    scaler = GradScaler(device, **kwargs)
    return scaler, TrainerClipping(scaler, follows)


def warn_fp16_on_cpu(integration: str, trainer_does: str) -> None:
    """The one line said where the trainer alone would not have run fp16 on the CPU."""
    warnings.warn(
        f"{integration}: float16 autocast and ampkit's loss scaling run on the CPU, where "
        f"{trainer_does} (CPU float16 is slow: meant for tests)",
        UserWarning,
        stacklevel=3,
    )


def say_state_missing(who: str, missing: str, scaler: torch.amp.GradScaler, strict: bool) -> None:
    """A resumed checkpoint that should hold the scaler's state does not (``missing`` says what is
    missing where): one warning naming it, or with ``strict`` (the integration's
    ``strict_loading=True``) a RuntimeError. The stock trainers restart the scale in silence."""
    if not scaler.is_enabled():  # a disabled scaler has no state to lose
        return
    message = (
        f"{who}: {missing}: the loss scale restarts from {scaler.get_scale():g} and the plugins' states start afresh"
    )
    if strict:
        raise RuntimeError(message + " (strict_loading=True)")
    warnings.warn(message, UserWarning, stacklevel=_caller_level())


class TrainerClipping:
    """The trainer's clipping threshold, handed to ampkit's clipper (or refused).

    :param scaler: the integration's scaler.
    :param follows_trainer: True when the integration chose the clipper (``norm``, no limit) for
        the trainer's threshold to set; False when the user named one.
    """

    def __init__(self, scaler: GradScaler, follows_trainer: bool) -> None:
        self.scaler = scaler
        self.follows_trainer = follows_trainer
        self._options: Dict[str, Any] = {"max_norm": NO_LIMIT, "norm_type": "2"}

    @property
    def active(self) -> bool:
        """False for a disabled scaler (``enabled=False``, or "cuda" without a GPU): it clips
        nothing, so the trainer's clipping stays torch's."""
        return self.scaler.is_enabled()

    @property
    def max_norm(self) -> float:
        """The threshold in force (:data:`NO_LIMIT` while the trainer has given none)."""
        return float(self._options["max_norm"])

    def configure(self, max_norm: float, norm_type: float, caller: str) -> None:
        """Makes ampkit's clipper clip at the trainer's ``max_norm`` (``inf``, 0 or less: no
        limit) from the next unscale on.

        :raises ValueError: the user named a clipper and the trainer clips too; or a norm other
            than 2 or inf (the ``norm`` clipper's two).
        """
        limited = math.isfinite(max_norm) and max_norm > 0
        if not self.follows_trainer:
            if limited:
                raise ValueError(
                    f"{caller} asks for clipping at {max_norm:g}, but ampkit's clipper "
                    f"'{self.clipper_name()}' already clips inside the scaler's "
                    "step: two clippers, one threshold silently winning. Either drop the trainer's "
                    "clipping, or leave clipper= out of the ampkit arguments so that the trainer's "
                    "threshold configures ampkit's 'norm' clipper"
                )
            return
        if norm_type not in (2, 2.0, math.inf):
            raise ValueError(
                f"{caller}: norm_type={norm_type!r}; ampkit's 'norm' clipper takes the 2-norm or the "
                "inf-norm (largest absolute gradient)"
            )
        wanted = {
            "max_norm": float(max_norm) if limited else NO_LIMIT,
            "norm_type": "inf" if norm_type == math.inf else "2",
        }
        for name, value in wanted.items():
            if self._options[name] != value:
                set_clipper_option(self.scaler, name, value)
                self._options[name] = value

    def unclipped_norm(self, device: torch.device) -> torch.Tensor:
        """The last unscale's total norm of the unscaled, unclipped gradients, as
        ``torch.nn.utils.clip_grad_norm_`` returns it (float32, inf or nan on an overflow)."""
        record = self.scaler.last_step
        key = "grad_max_abs" if self._options["norm_type"] == "inf" else "grad_norm"
        return torch.tensor(record.get(key, 0.0), dtype=torch.float32, device=device)

    def clipper_name(self) -> str:
        """The name of the scaler's clipper plugin."""
        plugins = self.scaler.state_dict().get("ampkit", {})
        return str(plugins.get("clipper", {}).get("plugin", "none"))


def set_clipper_option(scaler: GradScaler, name: str, value: Any) -> None:
    """Sets one option of the scaler's clipper plugin while training (the engine reconfigures
    the plugin with its other options kept)."""
    scaler.set_plugin_option(f"clipper.{name}", value)
