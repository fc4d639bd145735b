"""The step that never waits for the GPU (issue 42), for :class:`ampkit.GradScaler`.

With a fused optimizer (torch's ``_step_supports_amp_scaling``: fused Adam, AdamW, SGD, Adagrad) and
strategies that all have a device form, ``step()`` hands the optimizer ``grad_scale`` and
``found_inf`` as device tensors that the engine computed on the device
(core/engine/include/ampkit/deferred_step.h): no host read. Each step's figures reach the plugins'
host state (``last_step``, ``state_dict()``) when they have arrived, at the latest one step later;
anything that reads that state first waits for them.

Inside ``torch.cuda.graph`` the step is captured like any other device work: its record goes to a
ring on the device at every replay, read when the host state is read (docs/python.md, "The whole
step in a CUDA graph").
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

import torch

from ._errors import cpp

__all__ = ["SYNC_MODES", "DeferredMode", "capturing"]

SYNC_MODES = ("auto", "step", "deferred")


def capturing(cuda: bool) -> bool:
    """Whether the current CUDA stream is capturing a graph (never for a CPU scaler)."""
    return cuda and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _not_in_capture(what: str) -> RuntimeError:
    return RuntimeError(
        f"ampkit.GradScaler: {what} inside a CUDA graph capture; a graph captures scale(), backward, "
        "step() and update() of the deferred step (docs/python.md, 'The whole step in a CUDA graph')"
    )


class DeferredMode:
    """The deferred step of one GradScaler: when it applies, and its calls into the C++ side."""

    def __init__(self, sync: str, cuda: bool = False) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, got {sync!r}")
        self.sync = sync
        self.cuda = cuda  # a CUDA scaler, whose steps a graph may capture
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

    def check_capture(self, optimizer: torch.optim.Optimizer, slot: int) -> bool:
        """Whether the step is being captured in a CUDA graph. There it must be the deferred step,
        already made by a warm-up iteration (making it reads the host state onto the device, which a
        capture cannot)."""
        if not self.capturing():
            return False
        if self.sync == "step":
            raise _not_in_capture("a step with sync='step' (one host read per step) cannot run")
        if not getattr(optimizer, "_step_supports_amp_scaling", False):
            raise _not_in_capture(
                f"{type(optimizer).__name__} takes no grad_scale and found_inf, so the step cannot stay on the "
                "device; a fused optimizer (fused=True, capturable=True) does"
            )
        if slot in self.refused:
            raise _not_in_capture(f"the step stays synchronous ({self.refused[slot]}) and cannot run")
        if self.slot != slot:
            raise _not_in_capture(
                "the deferred step has not run for this optimizer yet (warm it up first: one iteration with "
                "sync='deferred', two with sync='auto', and again after load_state_dict() or update(new_scale))"
            )
        return True

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        slot: int,
        loss: Optional[torch.Tensor],
        args: Any,
        kwargs: Any,
        graph: bool = False,
    ) -> torch.Tensor:
        """The deferred step: the device's grad_scale and found_inf to the fused optimizer; returns
        whether it stepped, as a bool tensor on the device (reading it waits for the device).
        ``graph``: the step is being captured in a CUDA graph."""
        with torch.no_grad():
            grad_scale, found_inf, stepped = cpp(self.core.unscale_deferred)(slot, loss, graph)
        optimizer.grad_scale, optimizer.found_inf = grad_scale, found_inf  # type: ignore[attr-defined]
        try:
            optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
            del optimizer.found_inf  # type: ignore[attr-defined]
        self.in_iteration = True
        return stepped

    def finish_iteration(self, graph: bool = False) -> bool:
        """update() of a deferred iteration: the records that have arrived are delivered (an abort
        among them raises TrainingAborted); in a capture, none (nothing has run). False when the
        iteration was not deferred."""
        if not self.in_iteration:
            return False
        self.in_iteration = False
        if not graph:
            cpp(self.core.deliver)(False)
        return True

    def learn(self, optimizers: int) -> None:
        """After a synchronous iteration: auto goes deferred from the next one with one optimizer."""
        if self.single_optimizer is None:
            self.single_optimizer = optimizers == 1
            if self.sync == "auto" and optimizers != 1:
                self.why = f"{optimizers} optimizers per iteration (the deferred step serves one)"

    def capturing(self) -> bool:
        """Whether this call runs inside a CUDA graph capture."""
        return capturing(self.cuda)

    def refuse_in_capture(self, what: str) -> None:
        """Raises where ``what`` is called inside a CUDA graph capture."""
        if self.capturing():
            raise _not_in_capture(f"{what} cannot run")

    def drain(self) -> None:
        """Every record delivered: the plugins' host state is the device's (after a capture, also
        from the replays since the last read)."""
        if self.capturing():
            raise _not_in_capture("the host state (get_scale(), last_step, state_dict(), ...) cannot be read")
        if self.core is not None:
            try:
                cpp(self.core.deliver)(True)
            except ValueError as e:  # a CUDA graph's misuse: its ring overrun, or a replay after a state change
                raise RuntimeError(f"ampkit.GradScaler: {e}") from None
