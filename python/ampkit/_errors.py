"""Exceptions of the ampkit package, and the translation of C++ failures into them."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import torch

from ._facts import ERROR_CATEGORIES

__all__ = ["AmpkitError", "PluginError", "TrainingAborted"]


class AmpkitError(RuntimeError):
    """A failure inside ampkit's C++ side that is neither a bad value nor a plugin fault."""


class PluginError(AmpkitError):
    """A plugin could not be found, trusted, loaded or created, or it failed in a call."""


class TrainingAborted(AmpkitError):
    """The NaN policy (``abort``, or a streak limit) or the loss scaler stopped the run."""


# The exception of each category that has one of its own (the others raise AmpkitError), by the
# category's name in ampkit::ErrorCategory (core/common/include/ampkit/error.h) or python/src/errors.h's
# "aborted"; the C++ side keeps the category of the last failure for us.
_EXCEPTIONS = {
    ERROR_CATEGORIES["usage"]: ValueError,
    ERROR_CATEGORIES["plugin"]: PluginError,
    ERROR_CATEGORIES["aborted"]: TrainingAborted,
}

F = TypeVar("F", bound=Callable[..., Any])


def translate(exc: BaseException) -> BaseException:
    """The ampkit exception for ``exc``, raised by torch for a failed C++ call."""
    kind, message = torch.ops.ampkit.last_error()
    if kind < 0 or message not in str(exc):  # not ours: torch refused the call's arguments
        return exc
    return _EXCEPTIONS.get(kind, AmpkitError)(message)


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
