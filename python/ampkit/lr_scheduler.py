"""ampkit.LRScheduler: a torch LR scheduler that steps only when its optimizer stepped."""

from __future__ import annotations

from typing import Any

from .grad_scaler import GradScaler

__all__ = ["LRScheduler"]


class LRScheduler:
    """Wraps a ``torch.optim.lr_scheduler`` scheduler so that :meth:`step` advances it only
    after an iteration in which ``scaler.step(optimizer)`` stepped its optimizer; a skipped step
    (an overflow, or the NaN policy's decision) leaves the schedule where it is (PyTorch's loop
    advances it anyway: pytorch#44511). Everything else is the wrapped scheduler's.

    Example::

        scheduler = ampkit.LRScheduler(torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100), scaler)
        ...
        scaler.step(opt); scaler.update(); scheduler.step()
    """

    def __init__(self, scheduler: Any, scaler: GradScaler) -> None:
        self.scheduler = scheduler
        self.scaler = scaler

    def step(self, *args: Any, **kwargs: Any) -> bool:
        """Steps the wrapped scheduler if its optimizer stepped; returns whether it did."""
        if not self.scaler.stepped(self.scheduler.optimizer):
            return False
        self.scheduler.step(*args, **kwargs)
        return True

    def __getattr__(self, name: str) -> Any:
        if name in ("scheduler", "scaler"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)
