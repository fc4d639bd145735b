"""ampkit in HF Accelerate: one call between ``Accelerator(...)`` and ``prepare(...)``::

    accelerator = Accelerator(mixed_precision="fp16")
    ampkit.accelerate.prepare_scaler(accelerator, nan_policy="skip")
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

The accelerator then scales, unscales, steps and updates with an :class:`ampkit.GradScaler`
exactly where it would with torch's: ``optimizer_step_was_skipped`` is true on the steps the
scaler skipped (and a prepared scheduler holds on them), ``save_state``/``load_state`` keep the
scaler's state in ``scaler.pt`` (plugin states included). ``accelerator.clip_grad_norm_`` sets
ampkit's clipper and returns the unclipped norm. docs/python.md, "Your trainer".
"""

from __future__ import annotations

import math
import types
import warnings
from typing import Any, Dict, Iterable, Optional, Union

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from ._trainers import TrainerClipping, make_scaler, warn_fp16_on_cpu
from .grad_scaler import GradScaler

__all__ = ["prepare_scaler"]

# Where torch's GradScaler is the accelerator's own: one process or DDP. FSDP brings its sharded
# scaler, DeepSpeed and Megatron-LM their own loss scaling, XLA its own GradScaler.
_SUPPORTED = (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)


def prepare_scaler(accelerator: Accelerator, **gradscaler_kwargs: Any) -> Optional[GradScaler]:
    """Installs an :class:`ampkit.GradScaler` as ``accelerator``'s loss scaler; call it after
    creating the accelerator and before ``accelerator.prepare(...)``.

    ``mixed_precision`` must be ``"fp16"``; with another value there is nothing to scale, a
    warning says so and nothing is installed. On the CPU, where Accelerate runs ``"fp16"`` as
    fp32 with no scaler, this turns float16 autocast on with the ampkit scaler, and a warning says
    so. The arguments of a ``GradScalerKwargs`` handler given to the accelerator apply, below
    ``gradscaler_kwargs``.

    Clipping: without ``clipper=`` the scaler's clipper is ``norm`` with no limit, and
    ``accelerator.clip_grad_norm_(parameters, max_norm)`` sets its ``max_norm``, unscales (ampkit
    clips in the same multiply) and returns the unclipped norm; with ``clipper=`` a finite
    ``clip_grad_norm_`` is refused. ``clip_grad_value_`` is refused (``clipper="value"``).

    :param accelerator: an ``accelerate.Accelerator`` whose ``prepare`` has not run yet.
    :param gradscaler_kwargs: :class:`ampkit.GradScaler`'s keyword arguments but ``device``.
    :returns: the installed scaler, or None where nothing was installed.
    :raises TypeError: ``accelerator`` is not an ``Accelerator``; an argument of the wrong type.
    :raises RuntimeError: ``prepare`` already ran.
    :raises NotImplementedError: a distributed type with a loss scaler of its own (FSDP,
        DeepSpeed, Megatron-LM, XLA).
    """
    if not isinstance(accelerator, Accelerator):
        raise TypeError(
            "ampkit.accelerate.prepare_scaler: accelerator must be an accelerate.Accelerator, got "
            f"{type(accelerator).__name__} {accelerator!r:.80}"
        )
    if accelerator._models or accelerator._optimizers:
        raise RuntimeError(
            "prepare_scaler(accelerator) must run before accelerator.prepare(...): the "
            "prepared optimizers already hold the accelerator's scaler"
        )
    if accelerator.mixed_precision != "fp16":
        warnings.warn(
            f"ampkit.accelerate.prepare_scaler: mixed_precision is "
            f"{accelerator.mixed_precision!r}, which uses no loss scaler: ampkit is not installed",
            UserWarning,
            stacklevel=2,
        )
        return None
    if accelerator.distributed_type not in _SUPPORTED:
        raise NotImplementedError(
            f"ampkit.accelerate.prepare_scaler: distributed type "
            f"{accelerator.distributed_type} brings a loss scaler of its own"
        )
    if "device" in gradscaler_kwargs:
        raise TypeError(
            "ampkit.accelerate.prepare_scaler: the scaler's device is the accelerator's "
            f"({accelerator.device.type}); drop device={gradscaler_kwargs['device']!r}"
        )
    device = accelerator.device.type
    handler = accelerator.scaler_handler
    kwargs = dict(handler.to_kwargs() if handler is not None else {}, **gradscaler_kwargs)
    if accelerator.scaler is None:  # Accelerate runs fp16 on the CPU as fp32
        if not kwargs.get("enabled", True):
            warnings.warn(
                "ampkit.accelerate.prepare_scaler: enabled=False on the CPU, where Accelerate runs "
                "mixed_precision='fp16' as fp32: ampkit is not installed",
                UserWarning,
                stacklevel=2,
            )
            return None
        warn_fp16_on_cpu(
            "ampkit.accelerate.prepare_scaler",
            "Accelerate alone would have run mixed_precision='fp16' as fp32, without a scaler",
        )
    scaler, clipping = make_scaler(device, kwargs, "ampkit.accelerate.prepare_scaler")
    accelerator.scaler = scaler
    accelerator.native_amp = True
    if clipping.active:
        _install_clipping(accelerator, clipping)
    _install_skip_reading(accelerator, scaler)
    return scaler


def _install_skip_reading(accelerator: Accelerator, scaler: GradScaler) -> None:
    """Makes each optimizer this accelerator prepares answer ``step_was_skipped`` (and so
    ``optimizer_step_was_skipped`` and a prepared scheduler) from the scaler's decision. Accelerate
    infers a skip from ``optimizer.step`` not being called, which a fused optimizer's step on the
    device always is (torch's scaler too): the decision is read when asked, one host read."""
    prepare_optimizer = accelerator.prepare_optimizer

    def prepare(optimizer: torch.optim.Optimizer, device_placement: Optional[bool] = None) -> Any:
        prepared = prepare_optimizer(optimizer, device_placement=device_placement)
        prepared.__class__ = _reading_skips(type(prepared))
        prepared._ampkit_scaler = scaler
        return prepared

    accelerator.prepare_optimizer = prepare


_READING: Dict[type, type] = {}


def _reading_skips(cls: type) -> type:
    """``cls`` (an ``AcceleratedOptimizer``) whose ``step_was_skipped`` asks the ampkit scaler."""
    if cls not in _READING:

        def step_was_skipped(self: Any) -> bool:
            return not self._ampkit_scaler.stepped(self.optimizer)

        _READING[cls] = type(cls.__name__, (cls,), {"step_was_skipped": property(step_was_skipped)})
    return _READING[cls]


def _install_clipping(accelerator: Accelerator, clipping: TrainerClipping) -> None:
    """Replaces this accelerator's ``clip_grad_norm_`` and ``clip_grad_value_`` (the instance's,
    not the class's) by ones that hand the threshold to ampkit's clipper."""
    state = {"checked": False}

    def clip_grad_norm_(
        self: Accelerator,
        parameters: Union[torch.Tensor, Iterable[torch.Tensor]],
        max_norm: float,
        norm_type: Union[float, int, str] = 2,
    ) -> torch.Tensor:
        """Accelerate's ``clip_grad_norm_`` with ampkit's clipper: sets its threshold to
        ``max_norm``, unscales (and so clips) and returns the unclipped total norm."""
        norm = math.inf if str(norm_type) == "inf" else float(norm_type)
        clipping.configure(float(max_norm), norm, f"accelerator.clip_grad_norm_(max_norm={max_norm})")
        optimizers = self._optimizers
        if len(optimizers) != 1:
            raise ValueError(
                f"accelerator.clip_grad_norm_ with ampkit and {len(optimizers)} prepared "
                "optimizers: ampkit's clipper clips each optimizer's gradients by their "
                "own norm; prepare one optimizer, or name the clipper (clipper='norm')"
            )
        if not state["checked"]:
            _check_same_parameters(parameters, optimizers[0])
            state["checked"] = True
        self.unscale_gradients()
        return clipping.unclipped_norm(self.device)

    def clip_grad_value_(self: Accelerator, parameters: Any, clip_value: float) -> None:
        raise ValueError(
            "accelerator.clip_grad_value_ with ampkit: ampkit clips inside the scaler's "
            "step; use prepare_scaler(accelerator, clipper='value', "
            "opt={'clipper.clip_value': v}) and drop the clip_grad_value_ call"
        )

    accelerator.clip_grad_norm_ = types.MethodType(clip_grad_norm_, accelerator)
    accelerator.clip_grad_value_ = types.MethodType(clip_grad_value_, accelerator)


def _check_same_parameters(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], optimizer: Any) -> None:
    """ampkit's norm is over the optimizer's gradients: the clipped parameters must hold all of those
    (checked once, on the first call). More is fine, as the HF Trainer's model.parameters() where
    the optimizer steps some of them: gradients no optimizer steps change nothing, and are left out
    of the norm."""
    given = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    with_grads = {id(p) for p in given if p.grad is not None}
    owned = {id(p) for group in optimizer.param_groups for p in group["params"] if p.grad is not None}
    if not owned <= with_grads:
        raise ValueError(
            "accelerator.clip_grad_norm_ with ampkit: the parameters given leave out some of the "
            "optimizer's (ampkit's clipper clips the optimizer's gradients by their total "
            "norm); pass model.parameters() of the prepared model"
        )
