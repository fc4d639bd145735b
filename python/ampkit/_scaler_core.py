"""The typed face of the C++ side of ampkit.GradScaler (torch.classes.ampkit.ScalerCore,
python/src/scaler_core.h): every call the package makes into it, with its argument and result
types, and a C++ failure turned into one ampkit exception (ValueError, PluginError,
TrainingAborted). The custom class itself is typed ``Any`` by torch; only this file touches it."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from . import _library
from ._errors import cpp

__all__ = ["DeviceDecision", "ScalerCore", "make_scaler_core", "world_size"]

# The deferred step's decision for a fused optimizer: (grad_scale, found_inf, stepped), on the device.
DeviceDecision = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class ScalerCore:
    """One GradScaler's strategies and its engine (the AmpStep the Trainer runs). The methods and
    their order are the C++ class's; the comments in scaler_core.h say what each one does."""

    def __init__(
        self,
        plugins: Mapping[str, str],
        options: Mapping[str, str],
        precision: str,
        plugin_dirs: Sequence[str],
        allow_untrusted: bool,
        cuda: bool,
        rank: int,
        world_size: int,
        stats_recipe: str,
        plugin_timeout: int,
    ) -> None:
        args = (dict(plugins), dict(options), precision, list(plugin_dirs), allow_untrusted, cuda)
        make = cpp(lambda: torch.classes.ampkit.ScalerCore(*args, rank, world_size, stats_recipe, plugin_timeout))
        self._cpp: Any = make()

    def scale(self) -> float:
        return float(cpp(self._cpp.scale)())

    def bind(self, slot: int, parameters: List[torch.Tensor], names: List[str]) -> Tuple[str, str]:
        """Returns (the statistics recipe chosen, why the GPU path went without ampkit's kernel or "")."""
        recipe, fallback = cpp(self._cpp.bind)(slot, parameters, names)
        return str(recipe), str(fallback)

    def reduce_across(self, slot: int, group_name: str, sharded: bool) -> None:
        cpp(self._cpp.reduce_across)(slot, group_name, sharded)

    def set_gradients(self, slot: int, gradients: List[Optional[torch.Tensor]]) -> None:
        cpp(self._cpp.set_gradients)(slot, gradients)

    def unscale(self, slot: int, fold: bool, loss: Optional[torch.Tensor]) -> Tuple[bool, bool, float]:
        """(recorded, step, factor)."""
        recorded, step, factor = cpp(self._cpp.unscale)(slot, fold, loss)
        return bool(recorded), bool(step), float(factor)

    def update(self) -> float:
        return float(cpp(self._cpp.update)())

    def set_scale(self, scale: float) -> None:
        cpp(self._cpp.set_scale)(scale)

    def prepare_deferred(self, slot: int) -> str:
        """ "" when the deferred step is ready for table ``slot``, else why the step stays synchronous."""
        return str(cpp(self._cpp.prepare_deferred)(slot))

    def unscale_deferred(self, slot: int, loss: Optional[torch.Tensor], capturing: bool) -> Optional[DeviceDecision]:
        decided = cpp(self._cpp.unscale_deferred)(slot, loss, capturing)
        return None if decided is None else (decided[0], decided[1], decided[2])

    def device_scale(self) -> Optional[torch.Tensor]:
        """The scale the deferred step's next backward multiplies by (None before prepare_deferred)."""
        return cpp(self._cpp.device_scale)()

    def deliver(self, wait: bool) -> int:
        return int(cpp(self._cpp.deliver)(wait))

    def end_deferred_iteration(self) -> int:
        return int(cpp(self._cpp.end_deferred_iteration)())

    def settle_iteration(self) -> None:
        cpp(self._cpp.settle_iteration)()

    def set_late_arrivals(self, on: bool) -> None:
        cpp(self._cpp.set_late_arrivals)(on)

    def unbind(self, slot: int) -> None:
        cpp(self._cpp.unbind)(slot)

    def option(self, kind: str, name: str) -> str:
        return str(cpp(self._cpp.option)(kind, name))

    def set_option(self, kind: str, name: str, value: str) -> None:
        cpp(self._cpp.set_option)(kind, name, value)

    def settings(self, kind: str) -> List[Tuple[str, str, str]]:
        """Every option of ``kind``'s plugin: (name, value, source) rows."""
        return [(str(r[0]), str(r[1]), str(r[2])) for r in cpp(self._cpp.settings)(kind)]

    def plugin(self, kind: str) -> List[str]:
        """name, version and file of ``kind``'s plugin."""
        return [str(s) for s in cpp(self._cpp.plugin)(kind)]

    def state(self, kind: str) -> Dict[str, Any]:
        return dict(cpp(self._cpp.state)(kind))

    def load_state(self, kind: str, state: Mapping[str, Any]) -> None:
        cpp(self._cpp.load_state)(kind, dict(state))

    def record(self) -> Dict[str, Any]:
        return dict(cpp(self._cpp.record)())


def world_size() -> int:
    """The default process group's size (1 without one)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_world_size() if distributed else 1


def make_scaler_core(config: Mapping[str, Any], cuda: bool) -> Tuple[ScalerCore, int]:
    """A C++ side from ``config`` (plugin_config's) for this process's rank, and the world size it
    was made for."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    world = world_size()
    dirs = [*config["plugin_dirs"], _library.builtin_plugin_dir()]
    c = config
    core = ScalerCore(
        c["plugins"], c["opt"], c["precision"], dirs, c["allow_untrusted"], cuda, rank, world,
        c["stats_recipe"], c["plugin_timeout"],
    )  # fmt: skip
    return core, world
