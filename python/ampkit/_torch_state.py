"""torch.amp.GradScaler's private attributes and argument checks on ampkit.GradScaler, which its
own methods and trainers use: they mean what they mean in torch, backed by the scaler plugin's
state."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Union

import torch

__all__ = ["GrowthTracker", "ScaleTensor", "TorchOption", "check_new_scale", "pickled_state", "scale_outputs"]


class ScaleTensor:
    """torch's ``_scale``: the scale as a float32 tensor on the device of the first scale() (None
    before), its copies on other devices, and in their place the deferred step's own device scale
    where there is one (updated there: no copy, no read)."""

    def __init__(self) -> None:
        self.tensor: Optional[torch.Tensor] = None
        self.per_device: Dict[torch.device, torch.Tensor] = {}

    def place(self, device: torch.device, value: float) -> None:
        self.tensor = torch.full((), value, dtype=torch.float32, device=device)
        self.per_device = {}

    def on(self, device: torch.device, deferred: Optional[torch.Tensor]) -> torch.Tensor:
        """The scale on ``device`` (``deferred``: the deferred step's device scale, or None)."""
        assert self.tensor is not None
        if deferred is not None and deferred.device == device:
            return deferred
        cached = self.per_device.get(device)
        if cached is None:
            cached = self.tensor.to(device=device, non_blocking=True)
            self.per_device[device] = cached
        return cached

    def refresh(self, value: Callable[[], float], deferred: Optional[torch.Tensor]) -> None:
        """After the scale changed: ``deferred`` where it is on the scale's device, else ``value()``."""
        assert self.tensor is not None
        if deferred is not None and deferred.device == self.tensor.device:
            self.tensor = deferred
        else:
            self.tensor.fill_(value())
        self.per_device = {}


def scale_outputs(outputs: Any, scaled: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """torch's scale() over a tensor or the tensors of a nested list/tuple (other iterables lazily)."""
    if isinstance(outputs, torch.Tensor):
        return scaled(outputs)
    if isinstance(outputs, Iterable):
        iterable = map(lambda value: scale_outputs(value, scaled), outputs)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(iterable)
        return iterable
    raise ValueError("outputs must be a Tensor or an iterable of Tensors")


class TorchOption:
    """A torch.amp.GradScaler attribute that torch's own ``get_<name>``/``set_<name>`` read and assign
    (``_growth_factor``, ``_backoff_factor``, ``_growth_interval``): on ampkit.GradScaler, the scaler
    plugin's option of that name (``kind``: float or int), in its ``_plugins``; a disabled scaler keeps
    what it is given, as torch's. A factor must be a number; an interval an int, and where the clean
    steps counted already reach it, the next clean step grows (torch's kernels compare with == and
    never grow again)."""

    def __init__(self, name: str, kind: type) -> None:
        self.name, self.kind = name, kind

    def __get__(self, scaler: Any, owner: Any = None) -> Any:
        if scaler is None:
            return self
        return scaler._plugins.scaler_option(self.name, self.kind)

    def __set__(self, scaler: Any, value: Any) -> None:
        plugins = scaler._plugins
        if self.kind is int:
            plugins.set_growth_interval(value)
        else:
            plugins.set_scaler_option(self.name, plugins.checked(value, "new_factor", integral=False))


class GrowthTracker:
    """torch's ``_growth_tracker``: the scaler plugin's ``growth_tracker`` as an int32 tensor on the
    scale's device (None before the first scale(), as torch's); assigning it sets the plugin's."""

    def __get__(self, scaler: Any, owner: Any = None) -> Any:
        if scaler is None:
            return self
        if scaler._scale is None:
            return None
        return torch.full((), scaler._plugins.growth_tracker(), dtype=torch.int32, device=scaler._scale.device)

    def __set__(self, scaler: Any, value: Any) -> None:
        if value is not None and scaler.is_enabled():
            state = scaler._plugins.state("scaler")
            if "growth_tracker" in state:
                state["growth_tracker"] = int(value.item() if isinstance(value, torch.Tensor) else value)
                scaler._plugins.load_state("scaler", state)


def check_new_scale(new_scale: Union[float, torch.Tensor], device: str) -> float:
    """update(new_scale)'s value: torch's checks of its type, then a finite number > 0 (torch would
    take any, and a scaler plugin refuses the rest)."""
    if isinstance(new_scale, float):
        value = new_scale
    else:
        reason = (
            "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
            "torch.FloatTensor with requires_grad=False."
        )
        assert isinstance(new_scale, torch.Tensor), reason
        assert new_scale.device.type == device, reason
        assert new_scale.numel() == 1, reason
        assert new_scale.requires_grad is False, reason
        value = float(new_scale.item())
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"ampkit.GradScaler: new_scale must be a finite number > 0, got {value!r}")
    return value


def pickled_state(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pickled GradScaler's state in this version's layout. One pickled by an ampkit whose
    GradScaler was assembled from mixins holds its whole ``__dict__``: its sync mode and CUDA mark on
    its deferred step, torch's initial scale and growth tracker as one pair."""
    if "_sync" in state:
        return state
    deferred = state["_deferred"]
    init_scale, init_growth_tracker = state["_initial"]
    return {
        **{name: state[name] for name in ("_device", "_enabled", "_config", "_torch_args", "_group")},
        "_sync": deferred.sync,
        "_cuda": deferred.cuda,
        "_passthrough_steps": state.get("_passthrough_steps", 0),
        "_init_scale": init_scale,
        "_init_growth_tracker": init_growth_tracker,
        "_saved_state_dict": state.get("_saved_state_dict"),
    }
