"""One training iteration of ampkit.GradScaler as torch's GradScaler keeps it: a record per
optimizer (torch's ``_per_optimizer_states``), and the losses given to ``scale()``. What the
iteration has done (how many optimizers were unscaled, whether a deferred step is open) is read from
these records, never counted beside them."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch
from torch.amp.grad_scaler import OptState

__all__ = ["IterationLosses", "deferred_open", "found_inf_per_device", "fresh_optimizer_state", "unscaled_optimizers"]


def fresh_optimizer_state() -> Dict[str, Any]:
    """An optimizer's record at the start of an iteration: torch's keys (stage: torch's OptState;
    found_inf_per_device: _check_inf_per_device's), then ours: step (the decision, None when nothing
    was recorded), factor and folded (what a fused step still multiplies by), deferred (the device's
    (grad_scale, found_inf, stepped) of a deferred step), unscaled (the engine measured it)."""
    return {
        "stage": OptState.READY,
        "found_inf_per_device": {},
        "step": None,
        "factor": 1.0,
        "folded": False,
        "deferred": None,
        "unscaled": False,
    }


def unscaled_optimizers(states: Mapping[int, Mapping[str, Any]]) -> int:
    """How many optimizers the engine unscaled (or stepped deferred) since the last update()."""
    return sum(1 for s in states.values() if s.get("unscaled"))


def deferred_open(states: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether a deferred step was recorded on the device since the last update() (which delivers
    it, whatever the optimizer did)."""
    return any(s.get("deferred") is not None for s in states.values())


class IterationLosses:
    """The losses given to scale() since the last update(), for the NaN policy."""

    def __init__(self) -> None:
        self.total: Optional[torch.Tensor] = None
        self.count = 0

    def take(self, outputs: Any) -> None:
        """What scale() is given, where it is a loss: a one-element tensor that requires grad (one
        that does not, a logged value, is scaled and not read)."""
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1 and outputs.requires_grad:
            loss = outputs.detach().float().reshape(())
            self.total = loss if self.total is None else self.total + loss
            self.count += 1

    def clear(self) -> None:
        self.total, self.count = None, 0

    def mean(self) -> Optional[torch.Tensor]:
        """Their mean (None before the first)."""
        if self.total is None:
            return None
        if self.count == 1:
            return self.total  # read, never written, by the C++ side
        # Divided by a tensor on the losses' device: CUDA multiplies by the reciprocal of a plain
        # number, which is not the correctly rounded mean the CPU gives.
        count = torch.full((), float(self.count), dtype=self.total.dtype, device=self.total.device)
        return self.total / count


def found_inf_per_device(state: Dict[str, Any], optimizer: torch.optim.Optimizer, tables: Any) -> Dict[Any, Any]:
    """torch's ``_found_inf_per_device`` of ``optimizer``'s record ``state``: after unscale_() (or
    step()), {device: 1.0 where the step is skipped, else 0.0}, float32. Made when asked, so a step
    that nobody asks does not make it (``tables``: the OptimizerTables that know its gradients)."""
    found = state["found_inf_per_device"]  # what torch's _check_inf_per_device filled, if it ran
    if found or state["step"] is None:
        return found
    if state["deferred"] is not None:
        found[state["deferred"][1].device] = state["deferred"][1]
    else:
        device = tables.grads_device(optimizer)
        found[device] = torch.full((), 0.0 if state["step"] else 1.0, dtype=torch.float32, device=device)
    return found
