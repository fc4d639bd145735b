"""An optimizer's parameters as the engine's gradient table, and its step's arguments, for
ampkit.GradScaler: bound once per optimizer, so a step's host work does not grow with the number of
parameters (issue 41)."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

import torch
from torch.amp.grad_scaler import OptState

from ._errors import cpp

__all__ = ["OptimizerTables"]


def _refresh_per_optimizer_state() -> Dict[str, Any]:
    # torch's keys (stage: torch's OptState; found_inf_per_device: _check_inf_per_device's), then ours.
    return {"stage": OptState.READY, "found_inf_per_device": {}, "step": None, "factor": 1.0, "folded": False}


class OptimizerTables:
    """A mixin of :class:`ampkit.GradScaler`: the C++ side's tables of its optimizers."""

    _core: Any
    _device: str
    _names: Dict[int, str]
    _bound: Dict[int, Any]
    _fused_args: Dict[torch.device, Any]
    _fallback_said: bool
    _loss_sum: Optional[torch.Tensor]
    _loss_count: int
    _pass_loss: bool
    _group: Any  # StatisticsGroup

    def _grads_device(self, optimizer: torch.optim.Optimizer) -> torch.device:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    return p.grad.device
        return torch.device(self._device)

    def _fused_step_args(self, device: torch.device) -> Any:
        """grad_scale and found_inf for a fused optimizer on ``device``: made once, filled per step
        (found_inf stays 0: a bad step never reaches the optimizer)."""
        args = self._fused_args.get(device)
        if args is None:
            args = (
                torch.ones((), dtype=torch.float32, device=device),
                torch.zeros((), dtype=torch.float32, device=device),
            )
            self._fused_args[device] = args
        return args

    def _slot(self, optimizer: torch.optim.Optimizer) -> int:
        """The C++ side's table of ``optimizer``'s parameters, bound on its first step and again
        when its param_groups change (a group added, a params list replaced or resized). DTensor
        parameters (FSDP2) are bound as their local shards."""
        groups = optimizer.param_groups
        key = tuple((id(group["params"]), len(group["params"])) for group in groups)
        bound = self._bound.get(id(optimizer))
        if bound is not None and bound[1] == key:
            return bound[0]
        slot = bound[0] if bound is not None else len(self._bound)
        params = [p for group in groups for p in group["params"]]
        names = [
            self._names.get(id(p), f"param_groups[{g}][{i}]")
            for g, group in enumerate(groups)
            for i, p in enumerate(group["params"])
        ]
        group_name, sharded, dtensors = self._group.plan(params)
        with torch.no_grad():  # DTensors: the C++ side sees their local shards
            bound_params = [p.to_local() for p in params] if dtensors else params
        _, fallback = cpp(self._core.bind)(slot, bound_params, names)
        if fallback and not self._fallback_said:  # once: the GPU path without ampkit's kernel
            warnings.warn(fallback, stacklevel=3)
            self._fallback_said = True
        if group_name:
            cpp(self._core.reduce_across)(slot, group_name, sharded)
        self._bound[id(optimizer)] = (slot, key, params if dtensors else None)
        return slot

    def _iteration_loss(self) -> Optional[torch.Tensor]:
        """The mean of this iteration's losses given to scale() (None under DDP: each rank's own)."""
        if self._loss_sum is None or not self._pass_loss:
            return None
        return self._loss_sum / self._loss_count

    def _give_local_gradients(self, optimizer: torch.optim.Optimizer, slot: int) -> None:
        """DTensor parameters: this step's local gradient shards to the C++ side, which measures them
        (new tensors each step, a list per step). Plain parameters: their .grad is read there."""
        dtensors = self._bound[id(optimizer)][2]
        if dtensors is not None:
            cpp(self._core.set_gradients)(slot, self._group.local_gradients(dtensors))

    def _unscale(self, optimizer: torch.optim.Optimizer, state: Dict[str, Any], fold: bool) -> None:
        slot = self._slot(optimizer)
        self._give_local_gradients(optimizer, slot)
        with torch.no_grad():
            recorded, step, factor = cpp(self._core.unscale)(slot, fold, self._iteration_loss())
        state["step"] = bool(step) if recorded else None
        state["factor"] = float(factor)
        state["folded"] = fold
