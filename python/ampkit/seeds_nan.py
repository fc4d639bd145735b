"""The seed documents' NaN API over ampkit.GradScaler: NaNDetector finds non-finite losses and
gradients, NaNRecoveryManager names the nan_policy plugin of each of the seeds' strategies."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Union

import torch

from ._facts import SEEDS_NAN_STRATEGIES
from .grad_scaler import GradScaler

__all__ = ["NaNDetector", "NaNRecoveryManager", "NaNReport"]

_ROLLBACK = (
    "nan strategy 'rollback' restores a snapshot of the model and optimizer, which ampkit.GradScaler "
    "does not hold: use ampkit-train --nan-policy rollback, or "
)


def _did_you_mean(name: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


@dataclass(frozen=True)
class NaNReport:
    """A :class:`NaNDetector` check: ``ok`` when all was finite, else ``name`` is "loss" or the
    first parameter (in order) whose gradient has ``nan_count`` NaNs and ``inf_count`` infinities."""

    ok: bool
    name: Optional[str] = None
    nan_count: int = 0
    inf_count: int = 0

    @property
    def message(self) -> str:
        return "all finite" if self.ok else f"{self.name}: {self.nan_count} NaN and {self.inf_count} inf values"


class NaNDetector:
    """Finds non-finite losses and gradients (detection only: what to do is the NaN policy's)."""

    def __init__(self) -> None:
        self.detections = 0
        self.last_report: Optional[NaNReport] = None

    def _report(self, ok: bool, name: Optional[str] = None, t: Optional[torch.Tensor] = None) -> NaNReport:
        counts = (0, 0) if t is None else (int(t.isnan().sum()), int(t.isinf().sum()))
        self.detections += 0 if ok else 1
        self.last_report = NaNReport(ok, name, *counts)
        return self.last_report

    def check_loss(self, loss: Union[torch.Tensor, float]) -> NaNReport:
        t = torch.as_tensor(loss).detach()
        ok = bool(torch.isfinite(t).all())
        return self._report(ok, None if ok else "loss", t)

    def check_gradients(self, model: Union[torch.nn.Module, Iterable[torch.Tensor]]) -> NaNReport:
        """Checks every gradient with one host read; the report names the first bad parameter."""
        named = (
            model.named_parameters()
            if isinstance(model, torch.nn.Module)
            else ((f"parameters[{i}]", p) for i, p in enumerate(model))
        )
        grads = [(n, p.grad._values() if p.grad.is_sparse else p.grad) for n, p in named if p.grad is not None]
        bad: Any = torch.stack([(~torch.isfinite(g)).any().cpu() for _, g in grads]).nonzero() if grads else []
        if len(bad) == 0:
            return self._report(True)
        name, g = grads[int(bad[0])]
        return self._report(False, name, g.detach())


class NaNRecoveryManager:
    """The seeds' NaN strategies as nan_policy plugins: skip → ``skip``, reduce_scale → ``backoff``,
    clip → ``skip`` with ``on_spike=clip`` (a finite loss or gradient-norm spike is applied clipped;
    detection needs ``spike_zscore``, 6 when not given), abort → ``abort``. ``rollback`` raises
    :class:`ValueError`: it needs ampkit-train's snapshots. The other arguments are the policy's
    options of the same names (None: the plugin's default)."""

    def __init__(
        self,
        strategy: str = "skip",
        *,
        max_consecutive: Optional[int] = None,
        spike_zscore: Optional[float] = None,
        spike_window: Optional[int] = None,
        spike_min_samples: Optional[int] = None,
    ) -> None:
        if strategy == "rollback":
            quoted = [f"'{s}'" for s in SEEDS_NAN_STRATEGIES]
            raise ValueError(_ROLLBACK + ", ".join(quoted[:-1]) + " or " + quoted[-1])
        if strategy not in SEEDS_NAN_STRATEGIES:
            raise ValueError(
                f"unknown nan strategy '{strategy}' ({', '.join(SEEDS_NAN_STRATEGIES)})"
                + _did_you_mean(strategy, SEEDS_NAN_STRATEGIES)
            )
        self.strategy = strategy
        self.policy, options = SEEDS_NAN_STRATEGIES[strategy]  # options: the strategy's, e.g. clip's on_spike
        given = dict(
            max_consecutive=max_consecutive,
            spike_zscore=spike_zscore,
            spike_window=spike_window,
            spike_min_samples=spike_min_samples,
        )
        self.options: Dict[str, Any] = {**options, **{k: v for k, v in given.items() if v is not None}}

    def scaler_kwargs(self) -> Dict[str, Any]:
        """``{"nan_policy": ..., "opt": {"nan_policy.OPTION": value}}`` for :class:`ampkit.GradScaler`."""
        return {"nan_policy": self.policy, "opt": {"nan_policy." + k: v for k, v in self.options.items()}}

    def make_scaler(self, device: str = "cuda", **kwargs: Any) -> GradScaler:
        """An :class:`ampkit.GradScaler` with this strategy; ``kwargs``' ``opt`` entries win."""
        opt = {**self.scaler_kwargs()["opt"], **(kwargs.pop("opt", None) or {})}
        return GradScaler(device, nan_policy=self.policy, opt=opt, **kwargs)
