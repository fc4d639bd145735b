"""ampkit.NanLocator: the first module whose output or gradient went non-finite, for Python models.

Zero cost on healthy steps: nothing is hooked until :meth:`NanLocator.locate` re-runs a bad step.
Then a forward hook on every submodule hands its output to the engine's locator
(core/engine/include/ampkit/nan_locator.h, the one ampkit-train uses), which summarizes it and
hooks its gradient; the C++ side lays the report out as ampkit-train's nan-report JSON.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ._errors import cpp

__all__ = ["NanLocator", "nan_report"]


def _first_tensor(value: Any) -> Optional[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, torch.Tensor):
                return v
    return None


class NanLocator:
    """Re-runs a step's forward and scaled backward with every submodule observed.

    Args:
        model: the module whose submodules are observed, named by ``named_modules()`` paths.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def locate(self, closure: Callable[[], torch.Tensor], scale: float = 1.0) -> Dict[str, Any]:
        """Runs ``closure`` (the step's forward, under the step's autocast, returning its loss) and
        the backward of ``loss * scale``; returns the report: ``located``, ``module``,
        ``module_type``, ``phase`` (forward | loss | backward), ``finding`` (one line),
        ``micro_batch_loss``, ``observation`` and every module's ``forward`` and ``backward``
        summary (dtype, shape, min, max, absmax over finite elements, nonfinite count). The first
        non-finite output wins, then a non-finite loss, then the first non-finite gradient in
        backward order. The model's gradients are cleared afterwards. Dropout draws anew in the
        re-run unless the closure restores the RNG state the step had."""
        session, loss = self._run(closure, scale)
        return dict(cpp(session.finish)(loss, self._module_types()))

    def _module_types(self) -> Dict[str, str]:
        return {name: type(module).__name__ for name, module in self.model.named_modules() if name}

    def _run(self, closure: Callable[[], torch.Tensor], scale: float) -> Tuple[Any, float]:
        """The re-run: (its LocatorSession, ready to finish; the loss)."""
        session = cpp(torch.classes.ampkit.LocatorSession)()
        handles = []
        for name, module in self.model.named_modules():
            if name:
                handles.append(module.register_forward_hook(self._hook(session, name)))
        try:
            loss = closure()
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError("the closure must return the step's scalar loss")
            loss = loss.float().reshape(())
            if loss.requires_grad:
                (loss * scale).backward()
        finally:
            for h in handles:
                h.remove()
        for p in self.model.parameters():
            p.grad = None
        return session, float(loss.detach())

    @staticmethod
    def _hook(session: Any, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            out = _first_tensor(output)
            if out is None or not out.is_floating_point():
                return
            inp = _first_tensor(inputs)
            session.observe(name, inp if inp is not None and inp.is_floating_point() else None, out)

        return hook


def nan_report(
    model: torch.nn.Module, closure: Callable[[], torch.Tensor], record: Dict[str, Any], precision: str
) -> Dict[str, Any]:
    """GradScaler.locate's report: the step's ``record`` (its last_step) and :meth:`NanLocator.locate`'s
    findings, in the form of ampkit-train's nan-report JSON."""
    scale = float(record.get("scale", 1.0))
    locator = NanLocator(model)
    session, loss = locator._run(closure, scale)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    return dict(
        cpp(session.report)(
            loss,
            locator._module_types(),
            int(record.get("step", 0)),
            rank,
            str(record.get("reason", "")),
            str(record.get("action", "")),
            scale,
            precision,
        )
    )
