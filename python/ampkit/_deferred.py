"""The step that never waits for the GPU, for :class:`ampkit.GradScaler`.

With a fused optimizer (torch's ``_step_supports_amp_scaling``: fused Adam, AdamW, SGD) and
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

import os
import sys
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Protocol, TypeVar

import torch

from ._errors import TrainingAborted
from ._iteration import deferred_open, unscaled_optimizers

if TYPE_CHECKING:
    from ._scaler_core import DeviceDecision, ScalerCore

__all__ = ["SYNC_MODES", "DeferredMode", "capturing"]

SYNC_MODES = ("auto", "step", "deferred")

T = TypeVar("T")


class GradientTables(Protocol):
    """What the deferred step needs of OptimizerTables (which calls into this module)."""

    def give_local_gradients(self, optimizer: torch.optim.Optimizer, slot: int) -> None: ...


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
        self.core: "Optional[ScalerCore]" = None
        self.single_optimizer: Optional[bool] = None  # learnt from the first synchronous iteration
        self.slot: Optional[int] = None  # the optimizer's table the deferred step serves
        self.scale: Optional[torch.Tensor] = None  # the device scale the next backward uses
        self.refused: Dict[int, str] = {}  # slot -> why it stays synchronous
        self.said: set = set()  # the reasons warned about (each once)
        self.momentum_ready: set = set()  # slots of a fused SGD whose momentum buffers exist
        self.momentum_hooked: set = set()  # ...whose load_state_dict makes it ask again
        self.why = "the first iteration is synchronous, to see how many optimizers it steps" if sync == "auto" else ""
        self.last = "step"  # how the last step ran (last_step's host_sync), and why (host_sync_reason)
        self.last_reason = "no step yet"

    def reset(self, core: "ScalerCore") -> None:
        """A new C++ side (a new scaler, or after unpickling)."""
        self.core, self.slot, self.scale, self.refused = core, None, None, {}

    def forget(self) -> None:
        """After the strategies' state changed from outside the step, or a synchronous step ran (the
        C++ side dropped its deferred step): the next step makes it again from that state, and asks
        again whether the strategies have device forms."""
        self.slot, self.scale, self.refused = None, None, {}

    def _warn(self, why: str) -> None:
        if why not in self.said:
            self.said.add(why)
            warnings.warn(f"ampkit.GradScaler: the step stays synchronous: {why}", stacklevel=_caller_level())

    def ran_synchronously(self, why: str) -> None:
        """A step that went the synchronous way outside :meth:`applies` (``unscale_()`` first):
        ``last_step`` says so; with ``sync='deferred'`` one warning says why."""
        self.last, self.last_reason = "step", f"sync={self.sync!r}: {why}"
        if self.sync == "deferred":
            self._warn(why)

    def _forget_momentum_on_load(self, optimizer: torch.optim.Optimizer, slot: int) -> None:
        """A state loaded into an SGD may hold no momentum buffers: its next step is asked again."""
        if not isinstance(optimizer, torch.optim.SGD) or slot in self.momentum_hooked:
            return
        mine = weakref.ref(self)

        def loaded(_: torch.optim.Optimizer) -> None:
            deferred = mine()
            if deferred is not None:
                deferred.momentum_ready.discard(slot)

        optimizer.register_load_state_dict_post_hook(loaded)
        self.momentum_hooked.add(slot)

    def applies(self, optimizer: torch.optim.Optimizer, slot: int, unscaled: int) -> bool:
        """Whether this step of ``optimizer`` (bound as ``slot``) runs deferred, ``unscaled`` other
        optimizers having been unscaled since the last update(); says why in ``last`` and
        ``last_reason``."""
        deferred = self._decide(optimizer, slot, unscaled)
        self.last = "deferred" if deferred else "step"
        self.last_reason = f"sync={self.sync!r}" + (f": {self.why}" if self.why else "")
        return deferred

    def _decide(self, optimizer: torch.optim.Optimizer, slot: int, unscaled: int) -> bool:
        if self.sync == "step":
            self.why = ""
            return False
        if unscaled > 0 or self.single_optimizer is False:
            # A second optimizer: the deferred step serves one per iteration. One that already ran
            # deferred in this iteration is taken over by the host forms (the C++ side's settle()),
            # and this one's synchronous step joins the iteration; later iterations stay synchronous.
            if self.single_optimizer is not False:
                self.single_optimizer = False
                self._warn_if_asked("several optimizers per iteration (the deferred step serves one)")
            self.why = "several optimizers per iteration (the deferred step serves one)"
            return False
        if not getattr(optimizer, "_step_supports_amp_scaling", False):
            self.why = f"{type(optimizer).__name__} takes no grad_scale and found_inf (a fused optimizer does)"
            self._warn_if_asked(self.why)
            return False
        if self.sync == "auto" and self.single_optimizer is not True:
            return False
        if slot not in self.momentum_ready:
            made = _momentum_made(optimizer)
            if made is False:
                self.why = (
                    "a fused SGD's momentum buffers are made by its first step, which a step skipped on the "
                    "device would leave unset (torch's fused SGD): the steps stay synchronous until then"
                )
                return False
            if made:  # None: no gradient to tell by this time, nor a step that could make one
                self.momentum_ready.add(slot)
                self._forget_momentum_on_load(optimizer, slot)
        if slot in self.refused:
            self.why = self.refused[slot]
            return False
        if self.slot != slot:
            why = self.settling(self._core().prepare_deferred, slot)
            if why:
                self.refused[slot] = why
                self.why = why
                self._warn(why)
                return False
            self.slot, self.scale = slot, self._core().device_scale()
        self.why = "every strategy has a device form and the optimizer is fused"
        return True

    def _warn_if_asked(self, why: str) -> None:
        if self.sync == "deferred":
            self._warn(why)

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

    def try_unscale(
        self,
        optimizer: torch.optim.Optimizer,
        slot: int,
        states: Mapping[int, Dict[str, Any]],
        tables: GradientTables,
        loss: Callable[[], Optional[torch.Tensor]],
    ) -> bool:
        """step()'s unscale of ``optimizer`` (bound as ``slot``), deferred where it applies: the
        device's decision goes to its record in ``states`` (this iteration's, torch's
        ``_per_optimizer_states``). False where the step stays synchronous."""
        graph = self.check_capture(optimizer, slot)
        if not self.applies(optimizer, slot, unscaled_optimizers(states)):
            return False
        tables.give_local_gradients(optimizer, slot)
        state = states[id(optimizer)]
        state["deferred"] = self.unscale(slot, loss(), graph)
        state.update(step=True if state["deferred"] is not None else None, unscaled=True)
        return True

    def unscale(self, slot: int, loss: Optional[torch.Tensor], graph: bool = False) -> "Optional[DeviceDecision]":
        """The deferred step's decision on the device: (grad_scale, found_inf, stepped) for the fused
        optimizer, ``stepped`` a bool tensor (reading it waits for the device). ``graph``: the step
        is being captured in a CUDA graph. None when the optimizer has no gradient: nothing is
        recorded (torch's fused step with no gradient; an update() with nothing else raises)."""
        with torch.no_grad():
            return self._core().unscale_deferred(slot, loss, graph)

    @staticmethod
    def step(optimizer: torch.optim.Optimizer, decided: Any, args: Any, kwargs: Any) -> torch.Tensor:
        """``optimizer.step`` with the device's grad_scale and found_inf (again, for a step() retried
        after the optimizer raised); returns whether it stepped, as :meth:`unscale`'s tensor."""
        grad_scale, found_inf, stepped = decided
        fused_step(optimizer, grad_scale, found_inf, args, kwargs)
        return stepped

    def finish_iteration(self, states: Mapping[int, Dict[str, Any]], graph: bool = False) -> None:
        """update() of the iteration whose optimizers' records are ``states`` (torch's
        ``_per_optimizer_states``). Deferred (a step recorded on the device: update() delivers it,
        whatever the optimizer did): the records that have arrived are delivered (an abort among
        them raises TrainingAborted); in a capture, none (nothing has run). Synchronous: the scaler's
        update with the iteration's statistics, after which auto learns how many optimizers it steps."""
        if deferred_open(states):
            if not graph:
                self._delivering(self._core().end_deferred_iteration)
            return
        recorded = [s for s in states.values() if s["step"] is not None]
        if len(recorded) == 0:
            raise AssertionError("No inf checks were recorded prior to update.")
        self._core().update()
        self.learn(len(recorded))

    def record(self, states: Mapping[int, Dict[str, Any]]) -> Dict[str, Any]:
        """The C++ side's last step record, with how the step ran (host_sync, host_sync_reason). A
        deferred iteration still open (in ``states``) is taken over by the host forms first, so the
        record describes this step while the state stays the one before the update."""
        core = self._core()
        if deferred_open(states):
            self.settling(core.settle_iteration)
        self.drain()
        record = core.record()
        record["host_sync"], record["host_sync_reason"] = self.last, self.last_reason
        return record

    def settling(self, call: Callable[..., T], *args: Any, refusals: bool = False) -> T:
        """A C++ call that settles the deferred step first (its records delivered, the step dropped)
        and may fail after that: whatever it raises, this side forgets the step too (and with
        ``refusals``, after a state change, why a strategy refused one)."""
        try:
            return call(*args)
        finally:
            if refusals or self.slot is not None:
                self.forget()

    def _delivering(self, call: Callable[..., T], *args: Any) -> T:
        """A C++ call that delivers records: an abort among them drops the C++ side's deferred
        step (the next step makes it again from the host forms), and so this side's."""
        try:
            return call(*args)
        except TrainingAborted:
            self.forget()
            raise

    def _core(self) -> "ScalerCore":
        assert self.core is not None, "a disabled GradScaler has no C++ side"
        return self.core

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
                self._delivering(self.core.deliver, True)
            except ValueError as e:  # a CUDA graph's misuse: its ring overrun, or a replay after a state change
                raise RuntimeError(f"ampkit.GradScaler: {e}") from None


def fused_step(
    optimizer: torch.optim.Optimizer, grad_scale: torch.Tensor, found_inf: torch.Tensor, args: Any, kwargs: Any
) -> None:
    """``optimizer.step`` of a fused optimizer with the grad_scale and found_inf it reads, as torch's
    GradScaler hands them (attributes, removed after the step)."""
    optimizer.grad_scale, optimizer.found_inf = grad_scale, found_inf  # type: ignore[attr-defined]
    try:
        optimizer.step(*args, **kwargs)
    finally:
        del optimizer.grad_scale  # type: ignore[attr-defined]
        del optimizer.found_inf  # type: ignore[attr-defined]


def _momentum_made(optimizer: torch.optim.Optimizer) -> Optional[bool]:
    """Whether the momentum buffers of ``optimizer``'s parameters that have a gradient exist (True
    where it is no SGD with momentum); None when no such parameter has a gradient."""
    if not isinstance(optimizer, torch.optim.SGD):
        return True
    seen = False
    for group in optimizer.param_groups:
        if group.get("momentum", 0) == 0:
            continue
        for p in group["params"]:
            if p.grad is not None:
                if optimizer.state.get(p, {}).get("momentum_buffer") is None:
                    return False
                seen = True
    return True if seen else None


_INSIDE = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in (__file__, torch.__file__))


def _caller_level() -> int:
    """warnings.warn's stacklevel, seen from its caller, of the first frame outside ampkit and torch
    (torch.compiler.disable's wrappers stand between a GradScaler method and its caller)."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level
