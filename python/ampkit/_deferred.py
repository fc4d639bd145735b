"""The step that never waits for the GPU (issue 42), for :class:`ampkit.GradScaler`.

With a fused optimizer (torch's ``_step_supports_amp_scaling``: fused Adam, AdamW, SGD, Adagrad) and
strategies that all have a device form, ``step()`` hands the optimizer ``grad_scale`` and
``found_inf`` as device tensors that the engine computed on the device
(core/engine/include/ampkit/deferred_step.h): no host read. Each step's figures reach the plugins'
host state (``last_step``, ``state_dict()``) when they have arrived, at the latest one step later;
anything that reads that state first waits for them.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

import torch

from ._errors import cpp

__all__ = ["SYNC_MODES", "DeferredMode"]

SYNC_MODES = ("auto", "step", "deferred")


class DeferredMode:
    """The deferred step of one GradScaler: when it applies, and its calls into the C++ side."""

    def __init__(self, sync: str) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, got {sync!r}")
        self.sync = sync
        self.core: Any = None
        self.single_optimizer: Optional[bool] = None  # learnt from the first synchronous iteration
        self.slot: Optional[int] = None  # the optimizer's table the deferred step serves
        self.scale: Optional[torch.Tensor] = None  # the device scale the next backward uses
        self.refused: Dict[int, str] = {}  # slot -> why it stays synchronous (said once)
        self.in_iteration = False
        self.why = "the first iteration is synchronous, to see how many optimizers it steps" if sync == "auto" else ""
        self.last = "step"  # how the last step ran (last_step's host_sync), and why (host_sync_reason)
        self.last_reason = "no step yet"

    def reset(self, core: Any) -> None:
        """A new C++ side (a new scaler, or after unpickling)."""
        self.core, self.slot, self.scale, self.refused, self.in_iteration = core, None, None, {}, False

    def forget(self) -> None:
        """After the strategies' state changed from outside the step (the C++ side dropped its
        deferred step): the next step makes it again from that state."""
        self.slot, self.scale = None, None

    def applies(self, optimizer: torch.optim.Optimizer, slot: int) -> bool:
        """Whether this step of ``optimizer`` (bound as ``slot``) runs deferred; says why in
        ``last`` and ``last_reason``."""
        deferred = self._decide(optimizer, slot)
        self.last = "deferred" if deferred else "step"
        self.last_reason = f"sync={self.sync!r}" + (f": {self.why}" if self.why else "")
        return deferred

    def _decide(self, optimizer: torch.optim.Optimizer, slot: int) -> bool:
        if self.sync == "step":
            self.why = ""
            return False
        if not getattr(optimizer, "_step_supports_amp_scaling", False):
            self.why = f"{type(optimizer).__name__} takes no grad_scale and found_inf (a fused optimizer does)"
            return False
        if self.in_iteration and self.slot != slot:
            raise RuntimeError(
                "ampkit.GradScaler: a second optimizer in a deferred iteration; the deferred step serves one "
                "optimizer per iteration (create the scaler with sync='step' for several)"
            )
        if self.sync == "auto" and self.single_optimizer is not True:
            return False
        if slot in self.refused:
            self.why = self.refused[slot]
            return False
        if self.slot != slot:
            why = cpp(self.core.prepare_deferred)(slot)
            if why:
                self.refused[slot] = why
                self.why = why
                warnings.warn(f"ampkit.GradScaler: the step stays synchronous: {why}", stacklevel=4)
                return False
            self.slot, self.scale = slot, cpp(self.core.device_scale)()
        self.why = "every strategy has a device form and the optimizer is fused"
        return True

    def step(
        self, optimizer: torch.optim.Optimizer, slot: int, loss: Optional[torch.Tensor], args: Any, kwargs: Any
    ) -> torch.Tensor:
        """The deferred step: the device's grad_scale and found_inf to the fused optimizer; returns
        whether it stepped, as a bool tensor on the device (reading it waits for the device)."""
        with torch.no_grad():
            grad_scale, found_inf, stepped = cpp(self.core.unscale_deferred)(slot, loss)
        optimizer.grad_scale, optimizer.found_inf = grad_scale, found_inf  # type: ignore[attr-defined]
        try:
            optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
            del optimizer.found_inf  # type: ignore[attr-defined]
        self.in_iteration = True
        return stepped

    def finish_iteration(self) -> bool:
        """update() of a deferred iteration: the records that have arrived are delivered (an abort
        among them raises TrainingAborted). False when the iteration was not deferred."""
        if not self.in_iteration:
            return False
        self.in_iteration = False
        cpp(self.core.deliver)(False)
        return True

    def learn(self, optimizers: int) -> None:
        """After a synchronous iteration: auto goes deferred from the next one with one optimizer."""
        if self.single_optimizer is None:
            self.single_optimizer = optimizers == 1
            if self.sync == "auto" and optimizers != 1:
                self.why = f"{optimizers} optimizers per iteration (the deferred step serves one)"

    def drain(self) -> None:
        """Every record delivered: the plugins' host state is the device's."""
        if self.core is not None and self.slot is not None:
            cpp(self.core.deliver)(True)
