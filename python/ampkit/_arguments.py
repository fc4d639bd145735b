"""ampkit.GradScaler's argument types, checked before the C++ side sees them."""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from ._facts import STEP_KINDS

__all__ = ["check_arguments"]


def _process_group_types() -> tuple:
    if torch.distributed.is_available():
        return (torch.distributed.ProcessGroup, type(None))
    return (type(None),)


def check_arguments(arguments: Mapping[str, Any]) -> None:
    """One TypeError naming the argument for a value of the wrong type, before the C++ side sees
    it (which would answer with a TorchScript signature dump or an AttributeError). ``arguments``:
    the constructor's (its ``locals()``); those without a type rule here are left to it."""
    expected = {
        "device": (str, torch.device),
        "precision": (str, type(None)),
        "opt": (Mapping, type(None)),
        "model": (torch.nn.Module, type(None)),
        **dict.fromkeys(STEP_KINDS, (str, os.PathLike)),  # each kind's plugin: a name or a file
        "stats_recipe": (str,),
        "sync": (str,),
        "process_group": _process_group_types(),
        "average_loss": (bool,),
        "plugin_timeout": (int, type(None)),
    }
    given = {name: value for name, value in arguments.items() if name in expected}
    for name, value in given.items():
        if not isinstance(value, expected[name]) or (name == "plugin_timeout" and isinstance(value, bool)):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in expected[name])
            raise TypeError(f"ampkit.GradScaler: {name} must be {names}, got {type(value).__name__} {value!r}")
    timeout = given.get("plugin_timeout")
    if timeout is not None and not 1 <= timeout <= 86400:  # None is the way to say "no limit"
        raise ValueError(
            f"ampkit.GradScaler: plugin_timeout must be a number of seconds from 1 to 86400, "
            f"or None for no limit; got {timeout}"
        )
