"""Exceptions of the ampkit package, and the translation of C++ failures into them."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import torch

__all__ = ["AmpkitError", "PluginError", "TrainingAborted"]


class AmpkitError(RuntimeError):
    """A failure inside ampkit's C++ side that is neither a bad value nor a plugin fault."""


class PluginError(AmpkitError):
    """A plugin could not be found, trusted, loaded or created, or it failed in a call."""


class TrainingAborted(AmpkitError):
    """The NaN policy (``abort``, or a streak limit) or the loss scaler stopped the run."""


# ampkit::ErrorCategory's values (core/common/include/ampkit/error.h) and python/src/errors.h's
# kAborted: the category of the last failure, which the C++ side keeps for us.
_USAGE, _PLUGIN, _ABORTED = 1, 2, 100

F = TypeVar("F", bound=Callable[..., Any])


def translate(exc: BaseException) -> BaseException:
    """The ampkit exception for ``exc``, raised by torch for a failed C++ call."""
    kind, message = torch.ops.ampkit.last_error()
    if kind < 0 or message not in str(exc):  # not ours: torch refused the call's arguments
        return exc
    if kind == _USAGE:
        return ValueError(message)
    if kind == _PLUGIN:
        return PluginError(message)
    if kind == _ABORTED:
        return TrainingAborted(message)
    return AmpkitError(message)


def cpp(fn: F) -> F:
    """Calls ``fn``; a failure of the C++ side becomes one ampkit exception with its message."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, ValueError) as e:  # torch's translation of c10::Error / ValueError
            if isinstance(e, AmpkitError):
                raise
            translated = translate(e)
            if translated is e:
                raise
            raise translated from None

    return wrapper  # type: ignore[return-value]
