"""The seed documents' API as a thin layer over :class:`ampkit.GradScaler`.

AMPConfig, AMPTrainer, GradientClipper, DynamicLossScaler, NaNDetector, NaNRecoveryManager (these two
in seeds_nan.py), DistributedConfig and DistributedAMPTrainer (in seeds_distributed.py) only name plugins
and options and read the step record: every scaling, clipping and NaN decision is a plugin's.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

import torch

from ._errors import PluginError, cpp
from ._plugin_access import option_text as _option_text
from .grad_scaler import GradScaler
from .plugins import plugins
from .seeds_nan import NaNDetector, NaNRecoveryManager, NaNReport

__all__ = [
    "AMPConfig", "AMPTrainer", "ClippingStrategy", "DistributedAMPTrainer", "DistributedConfig",
    "DynamicLossScaler", "GradientClipper", "NaNDetector", "NaNRecoveryManager", "NaNReport",
    "RECOMMENDED_CLIPPING_THRESHOLDS", "create_amp_trainer", "create_default_amp_config",
    "create_gradient_clipper", "get_recommended_threshold",
]

_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}
# The option a clipper's one "threshold" sets (adaptive: the upper bound of its learned threshold).
_THRESHOLD_OPTIONS = {"norm": "max_norm", "value": "clip_value", "adaptive": "max_norm", "agc": "clip_factor"}


@functools.lru_cache(maxsize=None)
def _per_precision_default(kind: str, name: str, option: str) -> Tuple[Tuple[str, float], ...]:
    """A plugin option's declared default ("fp16=1;bf16=5;fp32=10") as (precision, value) pairs."""
    for info in plugins():
        if info.kind == kind and info.name == name:
            for o in info.options:
                if o.name != option:
                    continue
                if not o.default:
                    return ()
                if "=" not in o.default:
                    return tuple((p, float(o.default)) for p in _AUTOCAST_DTYPES)
                return tuple((p, float(v)) for p, v in (item.split("=", 1) for item in o.default.split(";")))
            raise ValueError(f"{kind} '{name}' has no option '{option}'")
    raise PluginError(f"no {kind} plugin named '{name}'")


def __getattr__(name: str) -> Any:
    # RECOMMENDED_CLIPPING_THRESHOLDS: the norm clipper's per-precision max_norm default, read from
    # the plugin (declared once, in plugins/clipper/norm) when first asked for.
    if name == "RECOMMENDED_CLIPPING_THRESHOLDS":
        return dict(_per_precision_default("clipper", "norm", "max_norm"))
    if name in ("DistributedConfig", "DistributedAMPTrainer"):
        from . import seeds_distributed

        return getattr(seeds_distributed, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ClippingStrategy(str, enum.Enum):
    """The seeds' clipping strategies: each is the clipper plugin of that name."""

    NORM = "norm"
    VALUE = "value"
    ADAPTIVE = "adaptive"


def _strategy_name(strategy: Any) -> Any:
    return strategy.value if isinstance(strategy, ClippingStrategy) else strategy


def _threshold_option(clipper: str) -> str:
    if clipper not in _THRESHOLD_OPTIONS:
        raise ValueError(f"clipper '{clipper}' has no single threshold; set its options by name with opt=")
    return _THRESHOLD_OPTIONS[clipper]


def _one_of(a_name: str, a: Optional[str], b_name: str, b: Optional[str]) -> Optional[str]:
    if a is not None and b is not None and a != b:
        raise ValueError(f"{a_name}={a!r} and {b_name}={b!r} disagree: give one of them")
    return a if a is not None else b


def _same(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return _option_text(a) == _option_text(b)


def _clipping_stats(record: Mapping[str, Any]) -> Dict[str, Any]:
    keys = ("grad_norm", "grad_norm_clipped", "clip_coef", "clipped", "grad_max_abs", "found_inf", "action")
    return {**{k: record[k] for k in keys}, "threshold": record["clip_threshold"]} if record else {}


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


@dataclass
class AMPConfig:
    """What an :class:`AMPTrainer` trains with: :class:`ampkit.GradScaler`'s plugins and options,
    plus the seeds' friendly fields, which only set plugin options.

    ``scaler`` None: ``dynamic`` for fp16, ``none`` otherwise. ``clip_strategy`` is the clipper's
    name (norm, value, adaptive); ``max_grad_norm`` its threshold (None: the plugin's default for
    ``precision``). ``nan_strategy`` is a :class:`NaNRecoveryManager` strategy. A field and an ``opt``
    entry that set one option to different values raise :class:`ValueError`. ``device`` None: the model's.
    """

    precision: str = "fp16"
    scaler: Optional[str] = None
    clipper: Optional[str] = None
    nan_policy: Optional[str] = None
    opt: Dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    device: Optional[str] = None
    init_scale: Optional[float] = None
    growth_interval: Optional[int] = None
    max_grad_norm: Optional[float] = None
    clip_strategy: Optional[str] = None
    nan_strategy: Optional[str] = None
    # Seed 003's spellings: gradient_clip_max_norm is max_grad_norm, gradient_clip_strategy is
    # clip_strategy; enable_gradient_monitoring puts every gradient's norm, by name, into
    # AMPTrainer.get_gradient_summary()["layer_norms"].
    gradient_clip_max_norm: Optional[float] = None
    gradient_clip_strategy: Optional[str] = None
    enable_gradient_monitoring: bool = False

    def scaler_kwargs(self) -> Dict[str, Any]:
        """The :class:`ampkit.GradScaler` keyword arguments of this config."""
        strategy = _one_of("clip_strategy", _strategy_name(self.clip_strategy), "gradient_clip_strategy",
                           _strategy_name(self.gradient_clip_strategy))
        clipper = _one_of("clipper", _strategy_name(self.clipper), "clip_strategy", strategy)
        if self.max_grad_norm is not None and self.gradient_clip_max_norm is not None and \
                not _same(self.max_grad_norm, self.gradient_clip_max_norm):
            raise ValueError(f"max_grad_norm={self.max_grad_norm!r} and gradient_clip_max_norm="
                             f"{self.gradient_clip_max_norm!r} disagree: give one of them")
        max_grad_norm = self.max_grad_norm if self.max_grad_norm is not None else self.gradient_clip_max_norm
        clipper = clipper or ("none" if max_grad_norm is None else "norm")
        derived: Dict[str, Tuple[Any, str]] = {}  # option -> (value, the field that set it)
        if max_grad_norm is not None:
            derived["clipper." + _threshold_option(clipper)] = (max_grad_norm, "max_grad_norm")
        for name in ("init_scale", "growth_interval"):
            if getattr(self, name) is not None:
                derived["scaler." + name] = (getattr(self, name), name)
        policy = self.nan_policy
        if self.nan_strategy is not None:
            nan = NaNRecoveryManager(self.nan_strategy, spike_zscore=self.opt.get("nan_policy.spike_zscore"))
            policy = _one_of("nan_policy", self.nan_policy, "nan_strategy's policy", nan.policy)
            derived.update({k: (v, "nan_strategy") for k, v in nan.scaler_kwargs()["opt"].items()})
        opt = {k: v for k, (v, _) in derived.items()}
        for key, value in self.opt.items():
            if key in derived and not _same(derived[key][0], value):
                raise ValueError(f"opt[{key!r}]={value!r} contradicts {derived[key][1]}={derived[key][0]!r}")
            opt[key] = value
        scaler = self.scaler or ("dynamic" if self.precision == "fp16" else "none")
        return {"scaler": scaler, "clipper": clipper, "nan_policy": policy or "skip", "precision": self.precision,
                "enabled": self.enabled, "opt": opt}


def create_default_amp_config(precision: str = "fp16", **overrides: Any) -> AMPConfig:
    """An :class:`AMPConfig` for ``precision`` with norm clipping at the plugin's per-precision
    default and the ``skip`` NaN strategy; ``overrides`` are AMPConfig fields."""
    defaults: Dict[str, Any] = {}
    if not {"clipper", "clip_strategy", "gradient_clip_strategy"} & overrides.keys():
        defaults["clip_strategy"] = "norm"
    if "nan_policy" not in overrides:
        defaults["nan_strategy"] = "skip"
    return AMPConfig(precision=precision, **{**defaults, **overrides})


class AMPTrainer:
    """One optimizer step per :meth:`training_step`: autocast forward, ``scaler.scale(loss).backward()``,
    ``scaler.step``, ``scaler.update``, with the :class:`ampkit.GradScaler` of ``amp_config``.

    Args:
        model: the model; moved to ``amp_config.device`` when that is set.
        amp_config: None: :func:`create_default_amp_config`'s fp16 config.
        optimizer: None: ``AdamW(model.parameters(), lr=1e-3)``.
        loss_fn: ``loss_fn(outputs, targets)``; None: cross-entropy.
    """

    def __init__(self, model: torch.nn.Module, amp_config: Optional[AMPConfig] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, loss_fn: Optional[Callable] = None) -> None:
        self.config = amp_config if amp_config is not None else create_default_amp_config()
        if self.config.device is not None:
            model = model.to(self.config.device)
        self.model = model
        first = next(model.parameters(), None)
        self.device = first.device if first is not None else torch.device(self.config.device or "cpu")
        self.optimizer = optimizer if optimizer is not None else torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.loss_fn = loss_fn if loss_fn is not None else torch.nn.functional.cross_entropy
        self.scaler = GradScaler(self.device.type, model=_unwrap(model), **self.config.scaler_kwargs())
        if self.config.precision not in _AUTOCAST_DTYPES:
            raise ValueError(f"precision '{self.config.precision}' is not one of fp32, bf16, fp16")
        self._dtype = _AUTOCAST_DTYPES[self.config.precision] if self.config.enabled else None
        self.steps_taken = 0
        self.steps_skipped = 0

    def training_step(self, batch: Tuple[Any, Any]) -> float:
        """Trains on one ``(inputs, targets)`` batch; returns the (unscaled) loss."""
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError("a batch is an (inputs, targets) pair")
        inputs, targets = (b.to(self.device, non_blocking=True) if isinstance(b, torch.Tensor) else b for b in batch)
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self._dtype, enabled=self._dtype is not None):
            loss = self.loss_fn(self.model(inputs), targets)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scaler.stepped(self.optimizer):
            self.steps_taken += 1
        else:
            self.steps_skipped += 1
        return float(loss.detach())

    def _record(self) -> Dict[str, Any]:
        return self.scaler.last_step if self.steps_taken + self.steps_skipped else {}

    @property
    def last_clipping_stats(self) -> Dict[str, Any]:
        """The last step's grad_norm, grad_norm_clipped, clip_coef, clipped, threshold, grad_max_abs,
        found_inf and action ({} before the first step)."""
        return _clipping_stats(self._record())

    def get_gradient_summary(self) -> Dict[str, Any]:
        """The last step's gradients (total norm, largest element, top layers, found_inf, the NaN
        policy's action and reason), the current scale and the steps taken/skipped so far; with
        ``enable_gradient_monitoring``, ``layer_norms``: every parameter's gradient norm (unscaled,
        before clipping) by name."""
        r = self._record()
        summary = {k: r.get(k) for k in ("grad_norm", "grad_max_abs", "zero_fraction", "action", "reason")}
        summary.update(top_layers=list(r.get("top_layers", [])), found_inf=bool(r.get("found_inf", False)),
                       scale=self.scaler.get_scale(), steps_taken=self.steps_taken, steps_skipped=self.steps_skipped)
        if self.config.enable_gradient_monitoring:
            summary["layer_norms"] = dict(r.get("layer_norms", {}))
        return summary

    def state_dict(self) -> Dict[str, Any]:
        """Model, optimizer and scaler states and the step counts (``torch.load(weights_only=True)``)."""
        return {"model": _unwrap(self.model).state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(), "steps_taken": self.steps_taken,
                "steps_skipped": self.steps_skipped}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        _unwrap(self.model).load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.scaler.load_state_dict(state_dict["scaler"])
        self.steps_taken = int(state_dict.get("steps_taken", 0))
        self.steps_skipped = int(state_dict.get("steps_skipped", 0))


def create_amp_trainer(model: torch.nn.Module, amp_config: Optional[AMPConfig] = None,
                       optimizer: Optional[torch.optim.Optimizer] = None,
                       loss_fn: Optional[Callable] = None) -> AMPTrainer:
    """``AMPTrainer(model, amp_config, optimizer, loss_fn)``."""
    return AMPTrainer(model, amp_config, optimizer, loss_fn)


class GradientClipper:
    """Clips gradients in place with a clipper plugin, outside any loss scaling.

    Args:
        strategy: the clipper plugin (norm, value, adaptive, agc).
        threshold: its threshold option (norm's max_norm, value's clip_value, adaptive's upper
            bound max_norm, agc's clip_factor); None: the plugin's default for ``precision``.
        precision: picks the per-precision defaults.
        options: further clipper options by name (``norm_type="inf"``, ``method="percentile"``).

    Non-finite gradients are left as they are and reported (``found_inf``), not clipped.
    """

    def __init__(self, strategy: str = "norm", threshold: Optional[float] = None, precision: str = "fp16",
                 **options: Any) -> None:
        strategy = _strategy_name(strategy)
        self.strategy = strategy
        self.precision = precision
        opt: Dict[str, Any] = {"clipper." + k: v for k, v in options.items()}
        if threshold is not None:
            opt["clipper." + _threshold_option(strategy)] = threshold
        opt["nan_policy.max_consecutive"] = 0  # reporting non-finite gradients never aborts
        self._kwargs = dict(scaler="none", clipper=strategy, nan_policy="skip", precision=precision, opt=opt)
        self.reset()

    def reset(self) -> None:
        """Starts the clipper afresh (an adaptive clipper forgets its norm history)."""
        # Scale 1 (scaler "none"): the step's unscale is the identity and only the clipper acts.
        self._scaler = GradScaler("cpu", **self._kwargs)
        self._bound: Optional[tuple] = None  # the parameters the scaler's table holds, by id

    def clip(self, parameters: Union[torch.nn.Module, torch.Tensor, Iterable[torch.Tensor]]) -> Dict[str, Any]:
        """Clips the gradients of ``parameters`` (a module, a tensor or tensors) in place; returns
        grad_norm (L2, before), grad_norm_clipped, clip_coef, clipped, threshold, grad_max_abs (the inf
        norm, before), found_inf."""
        if isinstance(parameters, torch.nn.Module):
            named = list(parameters.named_parameters())
        else:
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            named = [(f"parameters[{i}]", p) for i, p in enumerate(params)]
        named = [(n, p) for n, p in named if p.grad is not None]
        if not named:
            return {"grad_norm": 0.0, "grad_norm_clipped": 0.0, "clip_coef": 1.0, "clipped": False}
        if any(p.grad.is_sparse for _, p in named):
            raise ValueError("GradientClipper does not clip sparse gradients; use ampkit.GradScaler(clipper=...)")
        core = self._scaler._core
        key = tuple(id(p) for _, p in named)
        if key != self._bound:  # the engine's gradient table, made again only for other parameters
            cpp(core.bind)(0, [p for _, p in named], [n for n, _ in named])
            self._bound = key
        with torch.no_grad():
            cpp(core.unscale)(0, False, None)  # no fold, no loss
            cpp(core.update)()
        return _clipping_stats(self._scaler.last_step)

    def get_recommended_threshold(self, precision: Optional[str] = None) -> Optional[float]:
        """The plugin's default threshold for ``precision`` (None: this clipper's)."""
        defaults = dict(_per_precision_default("clipper", self.strategy, _threshold_option(self.strategy)))
        return defaults.get(precision or self.precision)


def create_gradient_clipper(strategy: str = "norm", threshold: Optional[float] = None, precision: str = "fp16",
                            **options: Any) -> GradientClipper:
    """``GradientClipper(strategy, threshold, precision, **options)``."""
    return GradientClipper(strategy, threshold, precision, **options)


def get_recommended_threshold(precision: str) -> float:
    """The norm clipper's default max_norm for ``precision`` (RECOMMENDED_CLIPPING_THRESHOLDS)."""
    defaults = dict(_per_precision_default("clipper", "norm", "max_norm"))
    if precision not in defaults:
        raise ValueError(f"precision '{precision}' is not one of {', '.join(defaults)}")
    return defaults[precision]


class DynamicLossScaler(GradScaler):
    """:class:`ampkit.GradScaler` with the ``dynamic`` scaler; ``hysteresis``, ``min_scale`` and
    ``max_scale`` None keep the plugin's defaults (1, 1, float32's largest). ``kwargs`` are
    GradScaler's (``clipper``, ``nan_policy``, ``opt``, ...)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, hysteresis: Optional[int] = None, min_scale: Optional[float] = None,
                 max_scale: Optional[float] = None, *, device: str = "cuda", **kwargs: Any) -> None:
        opt = dict(kwargs.pop("opt", None) or {})
        for name, value in (("hysteresis", hysteresis), ("min_scale", min_scale), ("max_scale", max_scale)):
            if value is not None:
                opt["scaler." + name] = value
        super().__init__(device, init_scale, growth_factor, backoff_factor, growth_interval, scaler="dynamic",
                         opt=opt, **kwargs)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the loss scale (:meth:`scale`)."""
        return self.scale(loss)

    @property
    def loss_scale(self) -> float:
        return self.get_scale()
