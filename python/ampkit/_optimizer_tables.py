"""An optimizer's parameters as the engine's gradient table, and its step's arguments, for
ampkit.GradScaler: bound once per optimizer, so a step's host work does not grow with the number of
parameters."""

from __future__ import annotations

import operator
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

from ._deferred import DeferredMode, fused_step
from ._scaler_core import ScalerCore
from ._statistics_group import StatisticsGroup

__all__ = ["OptimizerTables", "step_taking_scaler"]


class OptimizerTables:
    """The C++ side's (``core``'s) tables of one GradScaler's optimizers, one slot each. Made again
    with a new C++ side: the slots are that side's."""

    def __init__(self, core: ScalerCore, group: StatisticsGroup, names: Dict[int, str], device: str) -> None:
        self.core = core
        self.group = group
        self.names = names
        self.device = device
        # optimizer (a weak key) -> (slot, its parameters when bound, DTensor parameters): its
        # parameters are handed to the C++ side once, and again only when they change.
        self.bound: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = weakref.WeakKeyDictionary()
        self.next_slot = 0
        self.fused_args: Dict[torch.device, Tuple[torch.Tensor, torch.Tensor]] = {}  # grad_scale, found_inf
        self.fallback_said = False

    def grads_device(self, optimizer: torch.optim.Optimizer) -> torch.device:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    return p.grad.device
        return torch.device(self.device)

    def _fused_step_args(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """grad_scale and found_inf for a fused optimizer on ``device``: made once, filled per step
        (found_inf stays 0: a bad step never reaches the optimizer)."""
        args = self.fused_args.get(device)
        if args is None:
            args = (
                torch.ones((), dtype=torch.float32, device=device),
                torch.zeros((), dtype=torch.float32, device=device),
            )
            self.fused_args[device] = args
        return args

    def step_folded(self, optimizer: torch.optim.Optimizer, factor: float, args: Any, kwargs: Any) -> None:
        """A fused optimizer's step with the unscale and clip folded in: grad_scale is 1 / ``factor``
        (torch always hands it grad_scale)."""
        grad_scale, found_inf = self._fused_step_args(self.grads_device(optimizer))
        grad_scale.fill_(1.0 / factor)
        fused_step(optimizer, grad_scale, found_inf, args, kwargs)

    def slot(self, optimizer: torch.optim.Optimizer) -> int:
        """The C++ side's table of ``optimizer``'s parameters, bound on its first step and again
        when its parameters change (a group added, a parameter added, removed or replaced: one
        identity pass, C-level, about 35 µs per 1,000 parameters). DTensor parameters (FSDP2) are bound as their local
        shards. The binding lives as long as the optimizer: a garbage-collected optimizer's table
        is released, and a new one never takes it over (an id() can be reused, a weak key cannot)."""
        groups = optimizer.param_groups
        bound = self.bound.get(optimizer)
        if bound is not None and _same_parameters(groups, bound[1]):
            return int(bound[0])
        if bound is None:
            slot, self.next_slot = self.next_slot, self.next_slot + 1
            weakref.finalize(optimizer, _unbind, weakref.ref(self), slot)
        else:
            slot = bound[0]
        params = [p for group in groups for p in group["params"]]
        names = [
            self.names.get(id(p), f"param_groups[{g}][{i}]")
            for g, group in enumerate(groups)
            for i, p in enumerate(group["params"])
        ]
        group_name, sharded, dtensors = self.group.plan(params)
        with torch.no_grad():  # DTensors: the C++ side sees their local shards
            bound_params = [p.to_local() for p in params] if dtensors else params
        _, fallback = self.core.bind(slot, bound_params, names)
        if fallback and not self.fallback_said:  # once: the GPU path without ampkit's kernel
            warnings.warn(fallback, stacklevel=4)
            self.fallback_said = True
        if group_name:
            self.core.reduce_across(slot, group_name, sharded)
        self.bound[optimizer] = (slot, [list(group["params"]) for group in groups], params if dtensors else None)
        return slot

    def give_local_gradients(self, optimizer: torch.optim.Optimizer, slot: int) -> None:
        """DTensor parameters: this step's local gradient shards to the C++ side, which measures them
        (new tensors each step, a list per step). Plain parameters: their .grad is read there."""
        dtensors: Optional[List[torch.Tensor]] = self.bound[optimizer][2]
        if dtensors is not None:
            self.core.set_gradients(slot, self.group.local_gradients(dtensors))

    def unscale(
        self,
        optimizer: torch.optim.Optimizer,
        slot: int,
        fold: bool,
        loss: Optional[torch.Tensor],
        deferred: DeferredMode,
    ) -> Tuple[bool, bool, float]:
        """The engine's synchronous step for ``optimizer``'s gradients (bound as ``slot``; ``loss``:
        the iteration's mean loss where the NaN policy reads it): (recorded, step, factor)."""
        self.give_local_gradients(optimizer, slot)
        with torch.no_grad():  # a deferred step of this iteration or before is settled first (C++)
            return deferred.settling(self.core.unscale, slot, fold, loss)

    def step(
        self, optimizer: torch.optim.Optimizer, state: Dict[str, Any], deferred: DeferredMode, args: Any, kwargs: Any
    ) -> Any:
        """``optimizer.step`` as its record ``state`` decided (torch's per-optimizer step): deferred,
        with the device's grad_scale and found_inf; fused, with the unscale and clip folded in; or
        plain. Returns whether it stepped (a device tensor when deferred)."""
        if state["deferred"] is not None:
            return deferred.step(optimizer, state["deferred"], args, kwargs)
        fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        if state["step"] is None and not fused:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        stepped = state["step"] is None or bool(state["step"])  # torch steps a fused one with no gradients
        if stepped and fused and state["folded"]:
            self.step_folded(optimizer, state["factor"], args, kwargs)
        elif stepped:
            optimizer.step(*args, **kwargs)
        return stepped


def step_taking_scaler(optimizer: torch.optim.Optimizer, scaler: Any, args: Any, kwargs: Any) -> Any:
    """torch's older contract, an optimizer whose step takes ``grad_scaler`` and unscales itself."""
    warnings.warn(
        "GradScaler is going to stop passing itself as a keyword argument to the passed "
        "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
        "`found_inf: Tensor` to the passed optimizer and let the optimizer use them directly.",
        FutureWarning,
        stacklevel=3,
    )
    return optimizer.step(*args, **dict(kwargs, grad_scaler=scaler))


def _same_parameters(groups: Any, bound: Any) -> bool:
    """Whether ``groups`` (param_groups) hold the very parameters ``bound`` (lists of them) held."""
    return len(groups) == len(bound) and all(
        len(g["params"]) == len(b) and all(map(operator.is_, g["params"], b)) for g, b in zip(groups, bound)
    )


def _unbind(tables: weakref.ref[OptimizerTables], slot: int) -> None:
    """An optimizer is gone: its table's tensors are released, where the tables it was bound in (and
    so their C++ side) are still in use (a weak reference: a finalizer keeps what it holds)."""
    owner = tables()
    if owner is not None:
        try:
            owner.core.unbind(slot)  # raises nothing but at interpreter shutdown
        except Exception:  # noqa: BLE001 (nothing left to release then)
            pass
