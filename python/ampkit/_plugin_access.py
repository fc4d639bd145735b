"""The plugins behind ampkit.GradScaler: their options and their state, and torch's state_dict over
them, read from and written to the C++ side (ScalerCore), which holds them."""

from __future__ import annotations

import inspect
import numbers
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from . import _library
from ._deferred import DeferredMode
from ._errors import PluginError
from ._facts import STEP_KINDS
from ._scaler_core import ScalerCore

__all__ = ["PluginSettings", "check_state_dict", "option_text", "plugin_config", "scaler_options"]

# torch's constructor arguments that are the scaler plugin's options of the same name.
_TORCH_OPTIONS = ("growth_factor", "backoff_factor", "growth_interval")

# torch.amp.GradScaler's constructor defaults, read from its signature: an argument left at its
# default leaves the plugin's own default (or AMPKIT_SCALER_<OPTION>) in force.
_TORCH_DEFAULTS = {name: p.default for name, p in inspect.signature(torch.amp.GradScaler.__init__).parameters.items()}


def _plain(value: Any) -> Any:
    """A one-element real tensor as its number (torch takes one where it takes a number)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    return value


def option_text(value: Any, name: str = "") -> str:
    """The --opt text of a Python value (bool before int: True is an int), a NumPy number or a
    one-element tensor (as torch takes them); ``name`` says whose."""
    value = _plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))  # numpy's float64 is a float whose repr is "np.float64(...)"
    if isinstance(value, str):
        return value
    whose = f"option {name}: " if name else "option "
    raise ValueError(f"{whose}value {value!r} ({type(value).__name__}) must be a bool, int, float or str")


def _check_saved_plugins(saved: Any) -> None:
    """A state_dict's "ampkit" entry, checked whole before anything is loaded from it."""
    if not isinstance(saved, Mapping):
        raise ValueError(
            f"state_dict['ampkit'] must be a dict of plugin states (kind -> {{'plugin': name, "
            f"'state': dict}}), got {type(saved).__name__}"
        )
    for kind, entry in saved.items():
        if (
            not isinstance(entry, Mapping)
            or not isinstance(entry.get("plugin"), str)
            or not isinstance(entry.get("state"), Mapping)
        ):
            raise ValueError(
                f"state_dict['ampkit'][{kind!r}] must be {{'plugin': name, 'state': dict}}, got {entry!r:.80}"
            )


def scaler_options(torch_args: Mapping[str, Any]) -> Dict[str, str]:
    """The scaler plugin's options that torch's arguments set: those given other than their default."""
    return {"scaler." + k: option_text(v, k) for k, v in torch_args.items() if v != _TORCH_DEFAULTS[k]}


def check_state_dict(state_dict: Any) -> Dict[str, Any]:
    """torch's state_dict (or ours) with its numbers as Python numbers, checked whole before
    anything is loaded from it."""
    if not isinstance(state_dict, Mapping):  # torch's raises TypeError too (a str is not indexable by key)
        raise TypeError(f"load_state_dict: state_dict must be a dict, got {type(state_dict).__name__}")
    if len(state_dict) == 0:
        raise RuntimeError(
            "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
        )
    numeric = ("scale", "_growth_tracker", *_TORCH_OPTIONS)
    plain = {k: _plain(v) if k in numeric else v for k, v in state_dict.items()}  # torch's: numbers
    for name in numeric:
        value = plain.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"state_dict[{name!r}] must be a number, got {type(value).__name__} {value!r}")
    _check_saved_plugins(plain.get("ampkit", {}))
    return plain


class PluginSettings:
    """The options and states of one GradScaler's plugins, held by its C++ side (``core``; None for a
    disabled scaler, whose torch options are kept in ``torch_args`` as torch's are). Every change
    goes through ``deferred.settling``: a deferred step made from the old state is dropped."""

    def __init__(self, core: Optional[ScalerCore], deferred: DeferredMode, torch_args: Dict[str, Any]) -> None:
        self.core = core
        self.deferred = deferred
        self.torch_args = torch_args

    def _live(self) -> ScalerCore:
        assert self.core is not None, "a disabled GradScaler has no plugins"
        return self.core

    def state_dict(self, scale: float) -> Dict[str, Any]:
        """torch.amp.GradScaler's state_dict at ``scale``, plus ``"ampkit"``: every plugin's name and state."""
        return {
            "scale": scale,
            "growth_factor": self.scaler_option("growth_factor", float),
            "backoff_factor": self.scaler_option("backoff_factor", float),
            "growth_interval": self.scaler_option("growth_interval", int),
            "_growth_tracker": self.growth_tracker(),
            "ampkit": {kind: {"plugin": self.plugin(kind)[0], "state": self.state(kind)} for kind in STEP_KINDS},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> Tuple[float, int]:
        """Loads torch's state_dict (or ours, checked by :func:`check_state_dict`); returns its
        (scale, growth tracker). A refused load loads nothing: the options it had set and the states
        it had loaded go back."""
        before = self._snapshot()
        try:
            return self._load(state_dict)
        except BaseException:
            self._restore(before)
            raise

    def _snapshot(self) -> Dict[str, Any]:
        core = self._live()
        options = {n: core.option("scaler", n) for n in _TORCH_OPTIONS if self.has_scaler_option(n)}
        return {"options": options, "states": {kind: self.state(kind) for kind in STEP_KINDS}}

    def _restore(self, snapshot: Mapping[str, Any]) -> None:
        core = self._live()
        scaler = self.state("scaler")
        if scaler.get("growth_tracker", 0) != 0:  # so that the old growth_interval admits it again
            self.load_state("scaler", dict(scaler, growth_tracker=0))
        for name, text in snapshot["options"].items():
            if core.option("scaler", name) != text:
                self.deferred.settling(core.set_option, "scaler", name, text, refusals=True)
        for kind, state in snapshot["states"].items():
            self.load_state(kind, state)

    def _load(self, state_dict: Mapping[str, Any]) -> Tuple[float, int]:
        current = self.state("scaler")
        if current.get("growth_tracker", 0) != 0:  # so that any new growth_interval admits it
            self.load_state("scaler", dict(current, growth_tracker=0))
        for name in _TORCH_OPTIONS:
            if self.has_scaler_option(name) and state_dict[name] != self.scaler_option(name, type(state_dict[name])):
                self.set_scaler_option(name, state_dict[name])
        saved = state_dict.get("ampkit", {})
        for kind in STEP_KINDS:
            entry = saved.get(kind)
            if entry is not None and entry.get("plugin") == self.plugin(kind)[0]:
                self.load_state(kind, entry["state"])
        state = self.state("scaler")
        if "scale" in state:
            state["scale"] = float(state_dict["scale"])
        if "growth_tracker" in state:
            state["growth_tracker"] = int(state_dict["_growth_tracker"])
        self.load_state("scaler", state)
        return float(state_dict["scale"]), int(state_dict["_growth_tracker"])

    def checked(self, value: Any, name: str, integral: bool) -> Any:
        """A setter's value: a number (an int for an interval), as torch's update() needs it; a
        disabled scaler keeps what it is given, as torch's."""
        value = _plain(value)
        wanted = numbers.Integral if integral else numbers.Real
        if self.core is not None and (isinstance(value, bool) or not isinstance(value, wanted)):
            raise TypeError(
                f"{name} must be {'an int' if integral else 'a number'}, got {type(value).__name__} {value!r}"
            )
        return value

    def set_growth_interval(self, new_interval: Any) -> None:
        """torch's set_growth_interval, but a count of clean steps that already reaches the new interval
        grows at the next clean step (torch's kernels compare with == and never grow again)."""
        value = self.checked(new_interval, "new_interval", integral=True)
        if self.core is not None:  # before the growth tracker is read
            self.deferred.refuse_in_capture("changing an option (set it before capturing)")
        if not self.has_scaler_option("growth_interval") or not 0 < value <= self.growth_tracker():
            self.set_scaler_option("growth_interval", value)
            return
        state = self.state("scaler")
        self.load_state("scaler", dict(state, growth_tracker=value - 1))  # admitted by both intervals
        try:
            self.set_scaler_option("growth_interval", value)
        except BaseException:
            self.load_state("scaler", state)
            raise

    def growth_tracker(self) -> int:
        if self.core is None:
            return 0
        return int(self.state("scaler").get("growth_tracker", 0))

    def set_option(self, key: str, value: Any) -> Tuple[str, str]:
        """Sets the option ``key`` ("KIND.OPTION") while training; returns ("KIND.OPTION", its text)."""
        kind, dot, name = str(key).partition(".")
        if not dot or not kind or not name:
            raise ValueError(f"option '{key}' is not of the form KIND.OPTION (e.g. clipper.max_norm)")
        if self.core is None:
            return "", ""
        self.deferred.refuse_in_capture("changing an option (set it before capturing)")
        text = option_text(value, str(key))
        self.deferred.settling(self.core.set_option, kind, name, text, refusals=True)
        return f"{kind}.{name}", text

    def settings(self, kind: str) -> List[tuple]:
        """The effective options of the ``kind`` plugin: (name, value, source) rows."""
        if not isinstance(kind, str):
            raise TypeError(f"plugin_options: kind must be a str ({', '.join(STEP_KINDS)}), got {type(kind).__name__}")
        if self.core is None:
            return []
        return [tuple(r) for r in self.core.settings(kind)]

    def scale(self) -> float:
        """The scaler plugin's scale."""
        return self._live().scale()

    def plugin(self, kind: str) -> List[str]:
        return self._live().plugin(kind)

    def state(self, kind: str) -> Dict[str, Any]:
        self.deferred.drain()
        return self._live().state(kind)

    def load_state(self, kind: str, state: Mapping[str, Any]) -> None:
        for key, value in state.items():  # torch would answer one with a TorchScript signature dump
            if isinstance(value, int) and not -(2**63) <= value < 2**63:
                raise ValueError(f"{kind} state {key!r} holds {value}, beyond a 64-bit integer")
        # A list crosses as a float64 tensor: an empty Python list has no element type.
        values = {k: torch.tensor(v, dtype=torch.float64) if isinstance(v, list) else v for k, v in state.items()}
        self.deferred.settling(self._live().load_state, kind, values, refusals=True)  # made again from this one

    def has_scaler_option(self, name: str) -> bool:
        return self.core is not None and any(r[0] == name for r in self.settings("scaler"))

    def scaler_option(self, name: str, kind: type) -> Any:
        if not self.has_scaler_option(name):
            return self.torch_args[name]
        text = self._live().option("scaler", name)
        return kind(float(text)) if kind is int else kind(text)

    def set_scaler_option(self, name: str, value: Any) -> None:
        if self.core is None:
            self.torch_args[name] = value
            return
        if not self.has_scaler_option(name):
            raise ValueError(f"scaler '{self.plugin('scaler')[0]}' has no option '{name}'")
        self.deferred.refuse_in_capture("changing an option (set it before capturing)")
        self.deferred.settling(self.core.set_option, "scaler", name, option_text(value, name), refusals=True)

    def set_scale(self, value: float) -> None:
        """update(new_scale)'s scale, the scaler's counters kept (torch's rule); a value the scaler
        plugin refuses is one ValueError naming new_scale, in either sync mode. A deferred iteration
        is taken over by the host forms and finished with this scale, its decision kept and the
        scaler's update not made (the C++ side's set_scale)."""
        try:
            self.deferred.settling(self._live().set_scale, value, refusals=True)
        except (PluginError, ValueError) as e:
            raise ValueError(f"ampkit.GradScaler: new_scale {value!r} refused: {e}") from None


def plugin_config(arguments: Mapping[str, Any], torch_args: Mapping[str, Any]) -> Dict[str, Any]:
    """What a GradScaler's C++ side is made from: its constructor's ``arguments`` (its ``locals()``)."""
    opt = arguments["opt"] or {}
    return {
        # Each kind's plugin is the keyword argument of the kind's name (scaler=, clipper=, ...).
        "plugins": {kind: str(arguments[kind]) for kind in STEP_KINDS},
        # opt= wins over torch's arguments.
        "opt": {**scaler_options(torch_args), **{str(k): option_text(v, f"opt[{k!r}]") for k, v in opt.items()}},
        "precision": "fp16" if arguments["precision"] is None else arguments["precision"],  # "" is refused
        "plugin_dirs": _library.plugin_folders(arguments["plugin_dirs"]),
        "allow_untrusted": bool(arguments["allow_untrusted_plugins"]),
        "stats_recipe": str(arguments["stats_recipe"]),
        "plugin_timeout": -1 if arguments["plugin_timeout"] is None else arguments["plugin_timeout"],
    }
