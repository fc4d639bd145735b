"""An optimizer's parameters as the engine's gradient table, and its step's arguments, for
ampkit.GradScaler: bound once per optimizer, so a step's host work does not grow with the number of
parameters."""

from __future__ import annotations

import operator
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

import torch
from torch.amp.grad_scaler import OptState

from ._deferred import fused_step
from ._errors import cpp

__all__ = ["OptimizerTables"]


def _refresh_per_optimizer_state() -> Dict[str, Any]:
    # torch's keys (stage: torch's OptState; found_inf_per_device: _check_inf_per_device's), then ours.
    # deferred: the device's (grad_scale, found_inf, stepped) of a deferred step.
    return {
        "stage": OptState.READY,
        "found_inf_per_device": {},
        "step": None,
        "factor": 1.0,
        "folded": False,
        "deferred": None,
    }


class OptimizerTables:
    """A mixin of :class:`ampkit.GradScaler`: the C++ side's tables of its optimizers."""

    _core: Any
    _device: str
    _names: Dict[int, str]
    _bound: "weakref.WeakKeyDictionary[torch.optim.Optimizer, Any]"
    _next_slot: int
    _fused_args: Dict[torch.device, Any]
    _fallback_said: bool
    _loss_sum: Optional[torch.Tensor]
    _loss_count: int
    _pass_loss: bool
    _group: Any  # StatisticsGroup
    _deferred: Any  # DeferredMode
    _per_optimizer_states: Dict[int, Dict[str, Any]]
    _core_world: int  # the world size the C++ side was made for
    _core_generation: int  # how many C++ sides this scaler has made (the bindings name theirs)
    _last_taken: "weakref.WeakKeyDictionary[Any, Any]"

    if TYPE_CHECKING:  # GradScaler's and the other mixins', which this one calls

        def _make_core(self) -> Any: ...
        def state_dict(self) -> Dict[str, Any]: ...
        def load_state_dict(self, state_dict: Mapping[str, Any]) -> None: ...

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

    def _step_folded(self, optimizer: torch.optim.Optimizer, factor: float, args: Any, kwargs: Any) -> None:
        """A fused optimizer's step with the unscale and clip folded in: grad_scale is 1 / ``factor``
        (torch always hands it grad_scale)."""
        grad_scale, found_inf = self._fused_step_args(self._grads_device(optimizer))
        grad_scale.fill_(1.0 / factor)
        fused_step(optimizer, grad_scale, found_inf, args, kwargs)

    def stepped(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` stepped in the last iteration (True before the first)."""
        self._deferred.refuse_in_capture("stepped() (it reads the device)")
        return bool(self._last_taken.get(optimizer, True))  # deferred: a device tensor, read here

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> Dict[Any, Any]:
        """torch's: after unscale_() (or step()), {device: 1.0 where the step is skipped, else 0.0},
        float32. Made when asked, so a step that nobody asks does not make it."""
        state = self._per_optimizer_states[id(optimizer)]
        found = state["found_inf_per_device"]  # what torch's _check_inf_per_device filled, if it ran
        if found or state["step"] is None:
            return found
        if state["deferred"] is not None:
            found[state["deferred"][1].device] = state["deferred"][1]
        else:
            device = self._grads_device(optimizer)
            found[device] = torch.full((), 0.0 if state["step"] else 1.0, dtype=torch.float32, device=device)
        return found

    def _slot(self, optimizer: torch.optim.Optimizer) -> int:
        """The C++ side's table of ``optimizer``'s parameters, bound on its first step and again
        when its parameters change (a group added, a parameter added, removed or replaced: one
        identity pass, C-level, about 35 µs per 1,000 parameters). DTensor parameters (FSDP2) are bound as their local
        shards. The binding lives as long as the optimizer: a garbage-collected optimizer's table
        is released, and a new one never takes it over (an id() can be reused, a weak key cannot)."""
        groups = optimizer.param_groups
        bound = self._bound.get(optimizer)
        if bound is not None and _same_parameters(groups, bound[1]):
            return bound[0]
        if bound is None:
            if self._next_slot == 0:
                self._follow_world()
            slot, self._next_slot = self._next_slot, self._next_slot + 1
            weakref.finalize(optimizer, _unbind, weakref.ref(self), self._core_generation, slot)
        else:
            slot = bound[0]
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
        self._bound[optimizer] = (slot, [list(group["params"]) for group in groups], params if dtensors else None)
        return slot

    def _follow_world(self) -> None:
        """Before the first step: a process group started after the scaler was made (Lightning
        makes its precision plugin before its strategy starts the group) is the one the step serves:
        the C++ side is made again for it, with the scaler's state, so that under DDP the NaN policy
        reads the gradients every rank shares, not its own loss."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        world = torch.distributed.get_world_size() if distributed else 1
        if world == self._core_world:
            return
        saved = self.state_dict()
        self._core = self._make_core()
        self._deferred.reset(self._core)
        self.load_state_dict(saved)

    def _iteration_loss(self) -> Optional[torch.Tensor]:
        """The mean of this iteration's losses given to scale() (None under DDP: each rank's own)."""
        if self._loss_sum is None or not self._pass_loss:
            return None
        if self._loss_count == 1:
            return self._loss_sum  # read, never written, by the C++ side
        # Divided by a tensor on the losses' device: CUDA multiplies by the reciprocal of a plain
        # number, which is not the correctly rounded mean the CPU gives.
        count = torch.full((), float(self._loss_count), dtype=self._loss_sum.dtype, device=self._loss_sum.device)
        return self._loss_sum / count

    def _give_local_gradients(self, optimizer: torch.optim.Optimizer, slot: int) -> None:
        """DTensor parameters: this step's local gradient shards to the C++ side, which measures them
        (new tensors each step, a list per step). Plain parameters: their .grad is read there."""
        dtensors = self._bound[optimizer][2]
        if dtensors is not None:
            cpp(self._core.set_gradients)(slot, self._group.local_gradients(dtensors))

    def _unscale(self, optimizer: torch.optim.Optimizer, state: Dict[str, Any], fold: bool) -> None:
        slot = self._slot(optimizer)
        self._give_local_gradients(optimizer, slot)
        with torch.no_grad():  # a deferred step of this iteration or before is settled first (C++)
            recorded, step, factor = self._deferred.settling(self._core.unscale, slot, fold, self._iteration_loss())
        self._deferred.steps_in_iteration += 1
        state["step"] = bool(step) if recorded else None
        state["factor"] = float(factor)
        state["folded"] = fold


def _same_parameters(groups: Any, bound: Any) -> bool:
    """Whether ``groups`` (param_groups) hold the very parameters ``bound`` (lists of them) held."""
    return len(groups) == len(bound) and all(
        len(g["params"]) == len(b) and all(map(operator.is_, g["params"], b)) for g, b in zip(groups, bound)
    )


def _unbind(scaler: "weakref.ref[Any]", generation: int, slot: int) -> None:
    """An optimizer is gone: its table's tensors are released, where its scaler's C++ side still is
    the one it was bound on (a generation, not the side itself: a finalizer keeps what it holds)."""
    owner = scaler()
    if owner is not None and owner._core is not None and owner._core_generation == generation:
        try:
            owner._core.unbind(slot)  # raises nothing but at interpreter shutdown
        except Exception:  # noqa: BLE001 (nothing left to release then)
            pass
