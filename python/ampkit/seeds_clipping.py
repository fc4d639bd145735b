"""The seeds' gradient clipping API (re-exported by :mod:`ampkit.seeds`): GradientClipper clips
with a clipper plugin outside any loss scaling; the per-precision thresholds are the plugins'
declared defaults, read from them."""

from __future__ import annotations

import enum
import functools
import numbers
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch

from . import _library
from ._arguments import check_types
from ._errors import PluginError, cpp
from ._facts import option_defaults, threshold_option
from .grad_scaler import GradScaler
from .plugins import plugins

__all__ = ["ClippingStrategy", "GradientClipper", "create_gradient_clipper", "get_recommended_threshold"]


@functools.lru_cache(maxsize=None)
def _per_precision_default(kind: str, name: str, option: str) -> Tuple[Tuple[str, float], ...]:
    """A plugin option's declared default for each precision, as the registry resolves it."""
    for info in plugins():
        if info.kind == kind and info.name == name:
            if all(o.name != option for o in info.options):
                raise ValueError(f"{kind} '{name}' has no option '{option}'")
            pairs = cpp(option_defaults)(list(info._dirs), info._allow_untrusted, kind, info.path or name, option)
            return tuple((p, float(v)) for p, v in pairs)
    raise PluginError(f"no {kind} plugin named '{name}'")


class ClippingStrategy(str, enum.Enum):
    """The seeds' clipping strategies: each is the clipper plugin of that name."""

    NORM = "norm"
    VALUE = "value"
    ADAPTIVE = "adaptive"


def _strategy_name(strategy: Any) -> Any:
    return strategy.value if isinstance(strategy, ClippingStrategy) else strategy


@functools.lru_cache(maxsize=None)
def _threshold_option(clipper: str) -> str:
    """The option a clipper's one threshold sets: the one its plugin declares a per-precision default
    for (norm's max_norm, adaptive's upper bound max_norm, ...); ValueError for a clipper without one."""
    dirs = _library.plugin_folders(None) + [_library.builtin_plugin_dir()]
    return cpp(threshold_option)(dirs, False, clipper)


def _norm_thresholds() -> Dict[str, float]:
    """The norm clipper's per-precision default threshold (RECOMMENDED_CLIPPING_THRESHOLDS)."""
    norm = ClippingStrategy.NORM.value
    return dict(_per_precision_default("clipper", norm, _threshold_option(norm)))


def _clipping_stats(record: Mapping[str, Any]) -> Dict[str, Any]:
    keys = ("grad_norm", "grad_norm_clipped", "clip_coef", "clipped", "grad_max_abs", "found_inf", "action")
    return {**{k: record[k] for k in keys}, "threshold": record["clip_threshold"]} if record else {}


_NOT_PARAMETERS = "GradientClipper.clip: parameters must be a Module, a tensor or tensors, got {} {!r:.80}"


class GradientClipper:
    """Clips gradients in place with a clipper plugin, outside any loss scaling.

    Args:
        strategy: the clipper plugin (norm, value, adaptive, agc).
        threshold: the clipper's one option with a per-precision default, as the plugin declares it
            (norm's max_norm, value's clip_value, adaptive's upper bound max_norm, agc's
            clip_factor); None: the plugin's default for ``precision``.
        precision: picks the per-precision defaults.
        options: further clipper options by name (``norm_type="inf"``, ``method="percentile"``).

    Non-finite gradients are left as they are and reported (``found_inf``), not clipped.
    """

    def __init__(
        self, strategy: str = "norm", threshold: Optional[float] = None, precision: str = "fp16", **options: Any
    ) -> None:
        strategy = _strategy_name(strategy)
        # Checked here: the plugin look-up below would answer a wrong type with a TorchScript
        # signature dump, and a threshold given as a string would pass as an option's text.
        check_types(
            "GradientClipper", {"strategy": strategy, "precision": precision}, {"strategy": (str,), "precision": (str,)}
        )
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, numbers.Real)):
            raise TypeError(
                f"GradientClipper: threshold must be a number or None, got {type(threshold).__name__} {threshold!r:.80}"
            )
        self.strategy = strategy
        self.precision = precision
        opt: Dict[str, Any] = {"clipper." + k: v for k, v in options.items()}
        if threshold is not None:
            opt["clipper." + _threshold_option(strategy)] = threshold
        opt["nan_policy.max_consecutive"] = 0  # reporting non-finite gradients never aborts
        self._kwargs: Dict[str, Any] = dict(
            scaler="none", clipper=strategy, nan_policy="skip", precision=precision, opt=opt
        )
        self.reset()

    def reset(self) -> None:
        """Starts the clipper afresh (an adaptive clipper forgets its norm history)."""
        # Scale 1 (scaler "none"): the step's unscale is the identity and only the clipper acts.
        self._scaler = GradScaler("cpu", **self._kwargs)
        self._bound: Optional[tuple] = None  # the parameters the scaler's table holds, by id
        self._dtensors: Optional[List[torch.Tensor]] = None  # those parameters where they are DTensors

    def clip(self, parameters: Union[torch.nn.Module, torch.Tensor, Iterable[torch.Tensor]]) -> Dict[str, Any]:
        """Clips the gradients of ``parameters`` (a module, a tensor or tensors) in place; returns
        grad_norm (L2, before), grad_norm_clipped, clip_coef, clipped, threshold, grad_max_abs (the inf
        norm, before), found_inf."""
        if isinstance(parameters, torch.nn.Module):
            named: List[Tuple[str, torch.Tensor]] = list(parameters.named_parameters())
        else:
            if not isinstance(parameters, (torch.Tensor, Iterable)) or isinstance(parameters, (str, bytes, Mapping)):
                raise TypeError(_NOT_PARAMETERS.format(type(parameters).__name__, parameters))
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            for p in params:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(_NOT_PARAMETERS.format(f"an iterable holding {type(p).__name__}", p))
            named = [(f"parameters[{i}]", p) for i, p in enumerate(params)]
        named = [(n, p) for n, p in named if p.grad is not None]
        if not named:
            return {"grad_norm": 0.0, "grad_norm_clipped": 0.0, "clip_coef": 1.0, "clipped": False}
        if any(p.grad is not None and p.grad.is_sparse for _, p in named):
            raise ValueError("GradientClipper does not clip sparse gradients; use ampkit.GradScaler(clipper=...)")
        core, group = self._scaler._core, self._scaler._group
        assert core is not None  # an enabled scaler's
        params = [p for _, p in named]
        key = tuple(id(p) for p in params)
        if key != self._bound:  # the engine's gradient table, made again only for other parameters
            # FSDP2's DTensors: their local shards, the norm reduced over the mesh's group, as GradScaler
            # does (and as clip_grad_norm_ on DTensors computes it).
            group_name, sharded, dtensors = group.plan(params)
            with torch.no_grad():
                bound = [p.to_local() for p in params] if dtensors else params  # type: ignore[union-attr]
            cpp(core.bind)(0, bound, [n for n, _ in named])
            if group_name:
                cpp(core.reduce_across)(0, group_name, sharded)
            self._bound, self._dtensors = key, (params if dtensors else None)
        if self._dtensors is not None:
            cpp(core.set_gradients)(0, group.local_gradients(self._dtensors))
        with torch.no_grad():
            cpp(core.unscale)(0, False, None)  # no fold, no loss
            cpp(core.update)()
        return _clipping_stats(self._scaler.last_step)

    def get_recommended_threshold(self, precision: Optional[str] = None) -> Optional[float]:
        """The plugin's default threshold for ``precision`` (None: this clipper's)."""
        defaults = dict(_per_precision_default("clipper", self.strategy, _threshold_option(self.strategy)))
        return defaults.get(precision or self.precision)


def create_gradient_clipper(
    strategy: str = "norm", threshold: Optional[float] = None, precision: str = "fp16", **options: Any
) -> GradientClipper:
    """``GradientClipper(strategy, threshold, precision, **options)``."""
    return GradientClipper(strategy, threshold, precision, **options)


def get_recommended_threshold(precision: str) -> float:
    """The norm clipper's default max_norm for ``precision`` (RECOMMENDED_CLIPPING_THRESHOLDS)."""
    defaults = _norm_thresholds()
    if precision not in defaults:
        raise ValueError(f"precision '{precision}' is not one of {', '.join(defaults)}")
    return defaults[precision]
