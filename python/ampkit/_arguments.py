"""ampkit.GradScaler's argument types, checked before the C++ side sees them."""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, cast

import torch

from ._facts import STEP_KINDS

__all__ = [
    "check_arguments",
    "check_device",
    "check_number",
    "check_plugin_dirs",
    "check_types",
    "parse_int",
]


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


def check_arguments(arguments: Mapping[str, Any], who: str = "ampkit.GradScaler") -> None:
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
    check_types(who, given, expected, integers=("plugin_timeout",))
    _check_scaler_numbers(arguments, who)
    check_plugin_dirs(arguments.get("plugin_dirs"), who)
    if "device" in given:
        check_device(given["device"], who)
    for name, value in given.items():
        _check_text(name, value, who=who)
    for key, value in (given.get("opt") or {}).items():
        _check_text(f"opt key {key!r}", key, who=who)
        _check_text(f"opt[{key!r}]", value, nul=False, who=who)  # the option's own check names a NUL in a value
    timeout = given.get("plugin_timeout")
    if timeout is not None and not 1 <= timeout <= 86400:  # None is the way to say "no limit"
        raise ValueError(
            f"{who}: plugin_timeout must be a number of seconds from 1 to 86400, or None for no limit; got {timeout}"
        )


def _check_scaler_numbers(arguments: Mapping[str, Any], who: str) -> None:
    """torch's numeric arguments (init_scale, growth_factor, backoff_factor, growth_interval): a number
    (numpy's too) or a one-element tensor, not a bool or a string (which float() would take in
    silence), and one a float can hold (a huge int would raise OverflowError later). Their ranges are
    the scaler plugin's options' to check."""
    for name in ("init_scale", "growth_factor", "backoff_factor", "growth_interval"):
        if name not in arguments:
            continue
        value, integer = arguments[name], name == "growth_interval"
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            continue  # torch takes a one-element tensor as its number
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if integer else numbers.Real):
            wanted = "an int" if integer else "a number"
            raise TypeError(f"{who}: {name} must be {wanted}, got {type(value).__name__} {value!r:.80}")
        if not integer and isinstance(value, numbers.Integral) and abs(int(value)) > sys.float_info.max:
            raise ValueError(f"{who}: {name}={value!r:.80} is beyond the range of a float")


def _type_names(types: Tuple[type, ...]) -> str:
    return " or ".join("None" if t is type(None) else t.__name__ for t in types)


def check_types(
    who: str, given: Mapping[str, Any], expected: Mapping[str, Tuple[type, ...]], integers: Sequence[str] = ()
) -> None:
    """One TypeError naming the first argument of ``given`` whose value is not of its ``expected``
    types; those named in ``integers`` take no bool (True is an int to Python, not a count)."""
    for name, value in given.items():
        if name not in expected:
            continue
        if not isinstance(value, expected[name]) or (name in integers and isinstance(value, bool)):
            raise TypeError(
                f"{who}: {name} must be {_type_names(expected[name])}, got {type(value).__name__} {value!r:.80}"
            )


def check_number(
    who: str,
    name: str,
    value: Any,
    low: float,
    high: float,
    integer: bool = False,
    low_open: bool = False,
) -> None:
    """``value`` a real number (an int where ``integer``; never a bool), finite, in [low, high]
    (``low_open``: (low, high]); TypeError or ValueError naming ``name`` otherwise."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        wanted = "an int" if integer else "a number"
        raise TypeError(f"{who}: {name} must be {wanted}, got {type(value).__name__} {value!r:.80}")
    number = cast(float, value)  # an int or a float: compared as it is (a huge int must not overflow)
    below = number <= low if low_open else number < low
    finite = isinstance(value, numbers.Integral) or math.isfinite(number)  # isfinite(10**400) overflows
    if not finite or below or number > high:
        left = "(" if low_open else "["
        raise ValueError(f"{who}: {name}={value!r:.80} must be in {left}{_number(low)}, {_number(high)}]")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


_DECIMAL = re.compile(r"-?[0-9]{1,64}")  # ASCII digits only: no " 1 ", "1_0", "+1" or "٣"


def parse_int(who: str, name: str, text: str) -> int:
    """A launcher's integer variable, as ampkit-train reads it: ASCII decimal digits, nothing else
    (its range is the caller's to check)."""
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        raise ValueError(f"{who}: {name}={text!r:.80} is not a decimal integer")
    return int(text)


def check_device(device: Any, who: str) -> Optional[torch.device]:
    """``device`` (a str or torch.device) as torch parses it; ValueError naming it where torch
    knows no such device type ("gpu")."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"{who}: device must be str or torch.device, got {type(device).__name__} {device!r:.80}")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f'{who}: device {device!r:.80} is not a torch device ("cuda", "cpu", "cuda:1", ...)') from None
