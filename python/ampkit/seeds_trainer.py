"""The seeds' AMPConfig and AMPTrainer (re-exported by :mod:`ampkit.seeds`): a config that only
names plugins and options, and one optimizer step per training_step over :class:`ampkit.GradScaler`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from ._arguments import check_types
from ._facts import PRECISIONS, autocast_dtype
from ._plugin_access import option_text as _option_text
from .grad_scaler import GradScaler
from .seeds_clipping import _clipping_stats, _strategy_name, _threshold_option
from .seeds_nan import NaNRecoveryManager

__all__ = ["AMPConfig", "AMPTrainer", "create_amp_trainer", "create_default_amp_config"]


def _one_of(a_name: str, a: Optional[str], b_name: str, b: Optional[str]) -> Optional[str]:
    if a is not None and b is not None and a != b:
        raise ValueError(f"{a_name}={a!r} and {b_name}={b!r} disagree: give one of them")
    return a if a is not None else b


def _same(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return _option_text(a) == _option_text(b)


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
        strategy = _one_of(
            "clip_strategy",
            _strategy_name(self.clip_strategy),
            "gradient_clip_strategy",
            _strategy_name(self.gradient_clip_strategy),
        )
        clipper = _one_of("clipper", _strategy_name(self.clipper), "clip_strategy", strategy)
        if (
            self.max_grad_norm is not None
            and self.gradient_clip_max_norm is not None
            and not _same(self.max_grad_norm, self.gradient_clip_max_norm)
        ):
            raise ValueError(
                f"max_grad_norm={self.max_grad_norm!r} and gradient_clip_max_norm="
                f"{self.gradient_clip_max_norm!r} disagree: give one of them"
            )
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
        return dict(
            scaler=scaler,
            clipper=clipper,
            nan_policy=policy or "skip",
            precision=self.precision,
            enabled=self.enabled,
            opt=opt,
        )


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

    def __init__(
        self,
        model: torch.nn.Module,
        amp_config: Optional[AMPConfig] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        loss_fn: Optional[Callable] = None,
    ) -> None:
        check_types(
            "AMPTrainer",
            {"model": model, "amp_config": amp_config, "optimizer": optimizer},
            {
                "model": (torch.nn.Module,),
                "amp_config": (AMPConfig, type(None)),
                "optimizer": (torch.optim.Optimizer, type(None)),
            },
        )
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(
                f"AMPTrainer: loss_fn must be callable or None, got {type(loss_fn).__name__} {loss_fn!r:.80}"
            )
        self.config = amp_config if amp_config is not None else create_default_amp_config()
        if self.config.device is not None:
            model = model.to(self.config.device)
        self.model = model
        first = next(model.parameters(), None)
        self.device = first.device if first is not None else torch.device(self.config.device or "cpu")
        self.optimizer = optimizer if optimizer is not None else torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.loss_fn = loss_fn if loss_fn is not None else torch.nn.functional.cross_entropy
        self.scaler = GradScaler(self.device.type, model=_unwrap(model), **self.config.scaler_kwargs())
        if self.config.precision not in PRECISIONS:
            raise ValueError(f"precision '{self.config.precision}' is not one of {', '.join(PRECISIONS)}")
        self._dtype = autocast_dtype(self.config.precision) if self.config.enabled else None
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
        summary.update(
            top_layers=list(r.get("top_layers", [])),
            found_inf=bool(r.get("found_inf", False)),
            scale=self.scaler.get_scale(),
            steps_taken=self.steps_taken,
            steps_skipped=self.steps_skipped,
        )
        if self.config.enable_gradient_monitoring:
            summary["layer_norms"] = dict(r.get("layer_norms", {}))
        return summary

    def state_dict(self) -> Dict[str, Any]:
        """Model, optimizer and scaler states and the step counts (``torch.load(weights_only=True)``)."""
        return {
            "model": _unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "steps_taken": self.steps_taken,
            "steps_skipped": self.steps_skipped,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads :meth:`state_dict`'s dictionary (TypeError for anything else, as torch's)."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"AMPTrainer.load_state_dict: expected a dict, got {type(state_dict).__name__}")
        # All checked before any is loaded: a dict without "scaler" must not leave the model loaded alone.
        missing = [key for key in ("model", "optimizer", "scaler") if key not in state_dict]
        if missing:
            raise ValueError(
                f"AMPTrainer.load_state_dict: the state holds no {', '.join(repr(k) for k in missing)} entry "
                f"(AMPTrainer.state_dict() gives model, optimizer and scaler); nothing was loaded"
            )
        _unwrap(self.model).load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.scaler.load_state_dict(state_dict["scaler"])
        self.steps_taken = int(state_dict.get("steps_taken", 0))
        self.steps_skipped = int(state_dict.get("steps_skipped", 0))


def create_amp_trainer(
    model: torch.nn.Module,
    amp_config: Optional[AMPConfig] = None,
    optimizer: Optional[torch.optim.Optimizer] = None,
    loss_fn: Optional[Callable] = None,
) -> AMPTrainer:
    """``AMPTrainer(model, amp_config, optimizer, loss_fn)``."""
    return AMPTrainer(model, amp_config, optimizer, loss_fn)
