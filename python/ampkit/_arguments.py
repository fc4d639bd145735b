"""ampkit.GradScaler's argument types, checked before the C++ side sees them."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import torch

from ._facts import STEP_KINDS

__all__ = ["check_arguments", "check_plugin_dirs"]


def _process_group_types() -> tuple:
    if torch.distributed.is_available():
        return (torch.distributed.ProcessGroup, type(None))
    return (type(None),)


def _check_text(name: str, value: Any, nul: bool = True, who: str = "ampkit.GradScaler") -> None:
    """Text the C++ side takes: UTF-8 (no lone surrogate such as "\\udcff", which torch would
    answer with a TorchScript signature dump) without NUL (which would cut it short there)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{who}: {name} {value!r} is not valid text (a lone surrogate)") from None
    if nul and "\0" in value:
        raise ValueError(f"{who}: {name} {value!r} holds a NUL character")


def check_plugin_dirs(dirs: Any, who: str = "ampkit.GradScaler") -> None:
    """plugin_dirs (of ``who``): a list of folders, not one folder (a str would be taken letter by
    letter)."""
    if dirs is None:
        return
    if isinstance(dirs, (str, bytes, os.PathLike)) or not isinstance(dirs, Iterable):
        raise TypeError(
            f"{who}: plugin_dirs must be a list of folders (str or PathLike), got {type(dirs).__name__} {dirs!r}"
        )
    for d in dirs:
        if not isinstance(d, (str, os.PathLike)):
            raise TypeError(f"{who}: plugin_dirs must hold str or PathLike, got {type(d).__name__} {d!r}")
        _check_text("plugin_dirs entry", d, who=who)


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
        "allow_untrusted_plugins": (bool,),  # not any truthy value: "False" must not allow them
        "plugin_timeout": (int, type(None)),
    }
    given = {name: value for name, value in arguments.items() if name in expected}
    for name, value in given.items():
        if not isinstance(value, expected[name]) or (name == "plugin_timeout" and isinstance(value, bool)):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in expected[name])
            raise TypeError(f"ampkit.GradScaler: {name} must be {names}, got {type(value).__name__} {value!r}")
    check_plugin_dirs(arguments.get("plugin_dirs"))
    for name, value in given.items():
        _check_text(name, value)
    for key, value in (given.get("opt") or {}).items():
        _check_text(f"opt key {key!r}", key)
        _check_text(f"opt[{key!r}]", value, nul=False)  # the option's own check names a NUL in a value
    timeout = given.get("plugin_timeout")
    if timeout is not None and not 1 <= timeout <= 86400:  # None is the way to say "no limit"
        raise ValueError(
            f"ampkit.GradScaler: plugin_timeout must be a number of seconds from 1 to 86400, "
            f"or None for no limit; got {timeout}"
        )
