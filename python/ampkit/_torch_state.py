"""torch.amp.GradScaler's private state on ampkit.GradScaler: what trainers and fused
optimizers read (``_scale``, ``_growth_tracker``, ``_get_scale_async``, ...) means what it means in
torch, backed by the scaler plugin's state."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

import torch

from ._errors import PluginError, cpp

__all__ = ["TorchPrivateState"]


class TorchPrivateState:
    """A mixin of :class:`ampkit.GradScaler`: torch's private scale state over the plugin's."""

    _scale: Optional[torch.Tensor]
    _scale_per_device: Any
    _core: Any
    _deferred: Any
    _enabled: bool
    _initial: Any

    if TYPE_CHECKING:  # the other mixins' and GradScaler's, which this one reads

        def _get_growth_tracker(self) -> int: ...
        def _plugin_state(self, kind: str) -> Dict[str, Any]: ...
        def _load_plugin_state(self, kind: str, state: Mapping[str, Any]) -> None: ...
        def get_growth_factor(self) -> float: ...
        def set_growth_factor(self, new_factor: float) -> None: ...
        def get_backoff_factor(self) -> float: ...
        def set_backoff_factor(self, new_factor: float) -> None: ...
        def get_growth_interval(self) -> int: ...
        def set_growth_interval(self, new_interval: int) -> None: ...

    def _check_scale_growth_tracker(self, funcname: str) -> Any:
        fix = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  {fix}")
        # torch returns its tracker tensor too; ours is the plugin's state, read only where asked
        # for (_growth_tracker), never per step: a deferred step must not wait for the device.
        return (self._scale, None)

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        """torch's lazy start of ``_scale`` on ``dev`` (the first scale(), or a trainer that
        places it, as Accelerate's FSDP2 load_state does), from the scaler plugin's scale."""
        self._scale = torch.full((), self._core_scale(), dtype=torch.float32, device=dev)
        self._scale_per_device = {}

    def _get_scale_async(self) -> Optional[torch.Tensor]:
        """The scale as a tensor on the device, without waiting for it (torch's; fused optimizers
        of Apex and Transformer Engine read it)."""
        return self._scale

    @property
    def _growth_tracker(self) -> Optional[torch.Tensor]:
        """torch's growth tracker: the scaler plugin's ``growth_tracker`` as an int32 tensor on
        the scale's device (None before the first scale(), as torch's)."""
        if self._scale is None:
            return None
        return torch.full((), self._get_growth_tracker(), dtype=torch.int32, device=self._scale.device)

    @_growth_tracker.setter
    def _growth_tracker(self, value: Any) -> None:
        if value is not None and self._enabled:
            state = self._plugin_state("scaler")
            if "growth_tracker" in state:
                state["growth_tracker"] = int(value.item() if isinstance(value, torch.Tensor) else value)
                self._load_plugin_state("scaler", state)

    # torch's attributes, which its own methods assign: here views of the scaler plugin's state
    # and options, so an assignment sets what torch's would.
    @property
    def _init_scale(self) -> float:
        """torch's: the scale at construction or from the last load_state_dict (not the live one)."""
        return self._initial[0]

    @_init_scale.setter
    def _init_scale(self, value: float) -> None:
        self._initial = (float(value), self._initial[1])

    @property
    def _init_growth_tracker(self) -> int:
        return self._initial[1]

    @_init_growth_tracker.setter
    def _init_growth_tracker(self, value: int) -> None:
        self._initial = (self._initial[0], int(value))

    @property
    def _growth_factor(self) -> float:
        return self.get_growth_factor()

    @_growth_factor.setter
    def _growth_factor(self, value: float) -> None:
        self.set_growth_factor(value)

    @property
    def _backoff_factor(self) -> float:
        return self.get_backoff_factor()

    @_backoff_factor.setter
    def _backoff_factor(self, value: float) -> None:
        self.set_backoff_factor(value)

    @property
    def _growth_interval(self) -> int:
        return self.get_growth_interval()

    @_growth_interval.setter
    def _growth_interval(self, value: int) -> None:
        self.set_growth_interval(value)

    def _set_scale_to(self, value: float) -> None:
        """update(new_scale)'s scale, the scaler's counters kept (torch's rule); a value the scaler
        plugin refuses is one ValueError naming new_scale, in either sync mode."""
        if not math.isfinite(value) or value <= 0.0:
            raise ValueError(f"ampkit.GradScaler: new_scale must be a finite number > 0, got {value!r}")
        # A deferred iteration is taken over by the host forms and finished with this scale, its
        # decision kept and the scaler's update not made (the C++ side's set_scale).
        self._deferred.in_iteration, self._deferred.steps_in_iteration = False, 0
        try:
            self._deferred.settling(self._core.set_scale, value, refusals=True)
        except (PluginError, ValueError) as e:
            raise ValueError(f"ampkit.GradScaler: new_scale {value!r} refused: {e}") from None

    def _core_scale(self) -> float:
        return float(cpp(self._core.scale)())

    def _scale_on(self, device: torch.device) -> torch.Tensor:
        assert self._scale is not None
        deferred = self._deferred.scale
        if deferred is not None and deferred.device == device:
            return deferred  # the device's own scale, updated there: no copy, no read
        cached = self._scale_per_device.get(device)
        if cached is None:
            cached = self._scale.to(device=device, non_blocking=True)
            self._scale_per_device[device] = cached
        return cached

    def _refresh_scale(self) -> None:
        if self._scale is None:
            return
        deferred = self._deferred.scale
        if deferred is not None and deferred.device == self._scale.device:
            self._scale = deferred  # the device's own scale, updated there: no copy, no read
        else:
            self._scale.fill_(self._core_scale())
        self._scale_per_device = {}
