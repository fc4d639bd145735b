"""Methods that torch.compile must not trace, marked without importing torch._dynamo.

``torch.compiler.disable`` imports torch._dynamo, which costs about as much again as ``import
torch``; as a decorator it would make every ``import ampkit`` pay that. :func:`not_traced` gives
Dynamo the same mark instead (``_torchdynamo_disable``, the attribute Dynamo's inliner reads, so it
breaks the graph at the call as it does for ``torch.compiler.disable``), and wraps the method with
the real ``torch.compiler.disable`` the first time it is called in a process that has imported
Dynamo: only there can a compiled frame call it, and only there must Dynamo's frame hook be off
while it runs. Without Dynamo the method is called directly.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def not_traced(fn: F) -> F:
    """``torch.compiler.disable(fn)``, applied when first needed (module docstring)."""
    disabled: Optional[Callable[..., Any]] = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if disabled is None:
            import torch

            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    # What torch._dynamo.disable sets on its wrapper, read by Dynamo with getattr_static.
    call._torchdynamo_disable = True  # type: ignore[attr-defined]
    call._torchdynamo_disable_msg = None  # type: ignore[attr-defined]
    call._torchdynamo_orig_callable = fn  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]
