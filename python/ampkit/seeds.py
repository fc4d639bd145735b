"""The seed documents' API as a thin layer over :class:`ampkit.GradScaler`.

AMPConfig, AMPTrainer (in seeds_trainer.py), GradientClipper (seeds_clipping.py), DynamicLossScaler,
NaNDetector, NaNRecoveryManager (seeds_nan.py), DistributedConfig and DistributedAMPTrainer
(seeds_distributed.py) only name plugins and options and read the step record: every scaling,
clipping and NaN decision is a plugin's.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .grad_scaler import GradScaler
from .seeds_clipping import (
    ClippingStrategy,
    GradientClipper,
    _norm_thresholds,
    create_gradient_clipper,
    get_recommended_threshold,
)
from .seeds_distributed import DistributedAMPTrainer, DistributedConfig
from .seeds_nan import NaNDetector, NaNRecoveryManager, NaNReport
from .seeds_trainer import AMPConfig, AMPTrainer, create_amp_trainer, create_default_amp_config

__all__ = [
    "AMPConfig",
    "AMPTrainer",
    "ClippingStrategy",
    "DistributedAMPTrainer",
    "DistributedConfig",
    "DynamicLossScaler",
    "GradientClipper",
    "NaNDetector",
    "NaNRecoveryManager",
    "NaNReport",
    "RECOMMENDED_CLIPPING_THRESHOLDS",  # noqa: F822  (module __getattr__: read from the plugin when asked for)
    "create_amp_trainer",
    "create_default_amp_config",
    "create_gradient_clipper",
    "get_recommended_threshold",
]


def __getattr__(name: str) -> Any:
    # RECOMMENDED_CLIPPING_THRESHOLDS: the norm clipper's per-precision threshold default, read from
    # the plugin (declared once, in plugins/clipper/norm) when first asked for.
    if name == "RECOMMENDED_CLIPPING_THRESHOLDS":
        return _norm_thresholds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DynamicLossScaler(GradScaler):
    """:class:`ampkit.GradScaler` with the ``dynamic`` scaler; ``hysteresis``, ``min_scale`` and
    ``max_scale`` None keep the plugin's defaults (1, 1, float32's largest). ``kwargs`` are
    GradScaler's (``clipper``, ``nan_policy``, ``opt``, ...)."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        hysteresis: Optional[int] = None,
        min_scale: Optional[float] = None,
        max_scale: Optional[float] = None,
        *,
        device: str = "cuda",
        **kwargs: Any,
    ) -> None:
        opt = dict(kwargs.pop("opt", None) or {})
        for name, value in (("hysteresis", hysteresis), ("min_scale", min_scale), ("max_scale", max_scale)):
            if value is not None:
                opt["scaler." + name] = value
        super().__init__(
            device, init_scale, growth_factor, backoff_factor, growth_interval, scaler="dynamic", opt=opt, **kwargs
        )

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the loss scale (:meth:`scale`)."""
        return self.scale(loss)

    @property
    def loss_scale(self) -> float:
        return self.get_scale()
