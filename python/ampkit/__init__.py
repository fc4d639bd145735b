"""ampkit for Python: torch.amp.GradScaler's interface with ampkit's loss scalers, gradient
clippers and NaN policies chosen by name (docs/python.md)."""

from __future__ import annotations

import importlib
from typing import Any, List

from . import _library  # noqa: F401  (loads the C++ side first)
from . import seeds as seeds
from ._errors import AmpkitError, PluginError, TrainingAborted
from .grad_scaler import GradScaler, OptState
from .locator import NanLocator
from .lr_scheduler import LRScheduler
from .plugins import OptionInfo, PluginInfo, plugins
from .seeds import (
    AMPConfig,
    AMPTrainer,
    ClippingStrategy,
    DistributedAMPTrainer,
    DistributedConfig,
    DynamicLossScaler,
    GradientClipper,
    NaNDetector,
    NaNRecoveryManager,
    create_amp_trainer,
    create_default_amp_config,
    create_gradient_clipper,
    get_recommended_threshold,
)

__version__ = "0.1.0"

# The trainer integrations, imported when first named (ampkit.lightning.AmpkitPrecision(...)
# after a plain `import ampkit`): their frameworks stay optional and unimported until then.
_INTEGRATIONS = ("accelerate", "lightning", "transformers")


def __getattr__(name: str) -> Any:
    # RECOMMENDED_CLIPPING_THRESHOLDS is read from the norm clipper plugin when first asked for
    # (seeds.__getattr__): importing ampkit loads no plugin.
    if name == "RECOMMENDED_CLIPPING_THRESHOLDS":
        return seeds.RECOMMENDED_CLIPPING_THRESHOLDS
    if name in _INTEGRATIONS or name == "fp8":
        # Without the framework this raises ImportError naming it (e.g. No module named 'lightning').
        # ampkit.fp8 (docs/fp8.md) is imported on first use too, keeping `import ampkit` as light.
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_INTEGRATIONS) | {"fp8"})


__all__ = [
    "AMPConfig",
    "AMPTrainer",
    "AmpkitError",
    "ClippingStrategy",
    "DistributedAMPTrainer",
    "DistributedConfig",
    "DynamicLossScaler",
    "GradientClipper",
    "NaNDetector",
    "NaNRecoveryManager",
    "NanLocator",
    "RECOMMENDED_CLIPPING_THRESHOLDS",  # noqa: F822  (module __getattr__: read from the plugin when asked for)
    "create_amp_trainer",
    "create_default_amp_config",
    "create_gradient_clipper",
    "get_recommended_threshold",
    "GradScaler",
    "LRScheduler",
    "OptState",
    "OptionInfo",
    "PluginError",
    "PluginInfo",
    "TrainingAborted",
    "plugins",
]
