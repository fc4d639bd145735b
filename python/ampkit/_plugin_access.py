"""The plugins behind ampkit.GradScaler: their options, their state, and torch's state_dict and pickling
over them."""

from __future__ import annotations

import numbers
import weakref
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Dict, List, Mapping

import torch

from ._deferred import DeferredMode
from ._errors import cpp
from ._facts import STEP_KINDS
from ._optimizer_tables import _refresh_per_optimizer_state

__all__ = ["PluginAccess", "option_text"]

# torch's constructor arguments that are the scaler plugin's options of the same name.
_TORCH_OPTIONS = ("growth_factor", "backoff_factor", "growth_interval")


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


class PluginAccess:
    """A mixin of :class:`ampkit.GradScaler`: plugin options and states, the state_dict, pickling."""

    _core: Any
    _deferred: Any
    _enabled: bool
    _torch_args: Dict[str, Any]
    _config: Dict[str, Any]
    _per_optimizer_states: Dict[int, Dict[str, Any]]

    if TYPE_CHECKING:  # GradScaler's and the other mixins', which this one calls

        def get_scale(self) -> float: ...
        def _refresh_scale(self) -> None: ...
        def _make_core(self) -> Any: ...

    def state_dict(self) -> Dict[str, Any]:
        """torch.amp.GradScaler's state_dict, plus ``"ampkit"``: every plugin's name and state.
        Loads with ``torch.load(weights_only=True)``."""
        if not self._enabled:
            return {}
        self._deferred.drain()
        return {
            "scale": self.get_scale(),
            "growth_factor": self.get_growth_factor(),
            "backoff_factor": self.get_backoff_factor(),
            "growth_interval": self.get_growth_interval(),
            "_growth_tracker": self._get_growth_tracker(),
            "ampkit": {
                kind: {"plugin": self._plugin(kind)[0], "state": self._plugin_state(kind)} for kind in STEP_KINDS
            },
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads torch.amp.GradScaler's state_dict (ampkit-train's scaler_state_dict.pt too) or
        one of ours, whose plugin states are restored where the plugins are the same."""
        if not isinstance(state_dict, Mapping):  # torch's raises TypeError too (a str is not indexable by key)
            raise TypeError(f"load_state_dict: state_dict must be a dict, got {type(state_dict).__name__}")
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
            )
        numeric = ("scale", "_growth_tracker", *_TORCH_OPTIONS)
        state_dict = {k: _plain(v) if k in numeric else v for k, v in state_dict.items()}  # torch's: numbers
        for name in numeric:
            value = state_dict.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"state_dict[{name!r}] must be a number, got {type(value).__name__} {value!r}")
        _check_saved_plugins(state_dict.get("ampkit", {}))
        # A refused load loads nothing: the options it had set and the states it had loaded go back.
        before = self._snapshot()
        try:
            self._load_state_dict(state_dict)
        except BaseException:
            self._restore(before)
            raise

    def _snapshot(self) -> Dict[str, Any]:
        options = {n: cpp(self._core.option)("scaler", n) for n in _TORCH_OPTIONS if self._has_scaler_option(n)}
        return {"options": options, "states": {kind: self._plugin_state(kind) for kind in STEP_KINDS}}

    def _restore(self, snapshot: Mapping[str, Any]) -> None:
        scaler = self._plugin_state("scaler")
        if scaler.get("growth_tracker", 0) != 0:  # so that the old growth_interval admits it again
            self._load_plugin_state("scaler", dict(scaler, growth_tracker=0))
        for name, text in snapshot["options"].items():
            if cpp(self._core.option)("scaler", name) != text:
                self._deferred.settling(self._core.set_option, "scaler", name, text, refusals=True)
        for kind, state in snapshot["states"].items():
            self._load_plugin_state(kind, state)
        self._refresh_scale()

    def _load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        current = self._plugin_state("scaler")
        if current.get("growth_tracker", 0) != 0:  # so that any new growth_interval admits it
            self._load_plugin_state("scaler", dict(current, growth_tracker=0))
        for name in _TORCH_OPTIONS:
            if self._has_scaler_option(name) and state_dict[name] != self._scaler_option(name, type(state_dict[name])):
                self._set_scaler_option(name, state_dict[name])
        saved = state_dict.get("ampkit", {})
        for kind in STEP_KINDS:
            entry = saved.get(kind)
            if entry is not None and entry.get("plugin") == self._plugin(kind)[0]:
                self._load_plugin_state(kind, entry["state"])
        state = self._plugin_state("scaler")
        if "scale" in state:
            state["scale"] = float(state_dict["scale"])
        if "growth_tracker" in state:
            state["growth_tracker"] = int(state_dict["_growth_tracker"])
        self._load_plugin_state("scaler", state)
        self._initial = (float(state_dict["scale"]), int(state_dict["_growth_tracker"]))
        self._refresh_scale()

    def get_growth_factor(self) -> float:
        return self._scaler_option("growth_factor", float)

    def _checked(self, value: Any, name: str, integral: bool) -> Any:
        """A setter's value: a number (an int for an interval), as torch's update() needs it; a
        disabled scaler keeps what it is given, as torch's."""
        value = _plain(value)
        wanted = numbers.Integral if integral else numbers.Real
        if self._enabled and (isinstance(value, bool) or not isinstance(value, wanted)):
            raise TypeError(
                f"{name} must be {'an int' if integral else 'a number'}, got {type(value).__name__} {value!r}"
            )
        return value

    def set_growth_factor(self, new_factor: float) -> None:
        self._set_scaler_option("growth_factor", self._checked(new_factor, "new_factor", integral=False))

    def get_backoff_factor(self) -> float:
        return self._scaler_option("backoff_factor", float)

    def set_backoff_factor(self, new_factor: float) -> None:
        self._set_scaler_option("backoff_factor", self._checked(new_factor, "new_factor", integral=False))

    def get_growth_interval(self) -> int:
        return self._scaler_option("growth_interval", int)

    def set_growth_interval(self, new_interval: int) -> None:
        """As torch's, except when the clean steps counted already reach ``new_interval``: torch
        keeps the count and then never grows again (its kernels compare with ==); here the next
        clean step grows."""
        value = self._checked(new_interval, "new_interval", integral=True)
        if self._enabled:  # before the growth tracker is read
            self._deferred.refuse_in_capture("changing an option (set it before capturing)")
        if not self._has_scaler_option("growth_interval") or not 0 < value <= self._get_growth_tracker():
            self._set_scaler_option("growth_interval", value)
            return
        state = self._plugin_state("scaler")
        self._load_plugin_state("scaler", dict(state, growth_tracker=value - 1))  # admitted by both intervals
        try:
            self._set_scaler_option("growth_interval", value)
        except BaseException:
            self._load_plugin_state("scaler", state)
            raise

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return int(self._plugin_state("scaler").get("growth_tracker", 0))

    def set_plugin_option(self, key: str, value: Any) -> None:
        """Sets one plugin option while training, ``key`` as in ``opt=`` (``"clipper.max_norm"``):
        the plugin is made again with it, its other options and its state kept (as a resumed run
        would make it), and stays guarded. Raises ValueError for an unknown kind, option or value."""
        kind, dot, name = str(key).partition(".")
        if not dot or not kind or not name:
            raise ValueError(f"option '{key}' is not of the form KIND.OPTION (e.g. clipper.max_norm)")
        if not self._enabled:
            return
        self._deferred.refuse_in_capture("changing an option (set it before capturing)")
        text = option_text(value, str(key))
        self._deferred.settling(self._core.set_option, kind, name, text, refusals=True)
        self._config["opt"][f"{kind}.{name}"] = text  # a C++ side made again (unpickling) has it too

    def plugin_options(self, kind: str) -> List[tuple]:
        """The effective options of the ``kind`` plugin: (name, value, source) rows."""
        if not isinstance(kind, str):
            raise TypeError(f"plugin_options: kind must be a str ({', '.join(STEP_KINDS)}), got {type(kind).__name__}")
        if not self._enabled:
            return []
        return [tuple(r) for r in cpp(self._core.settings)(kind)]

    def _plugin(self, kind: str) -> List[str]:
        return list(cpp(self._core.plugin)(kind))

    def _plugin_state(self, kind: str) -> Dict[str, Any]:
        self._deferred.drain()
        return dict(cpp(self._core.state)(kind))

    def _load_plugin_state(self, kind: str, state: Mapping[str, Any]) -> None:
        for key, value in state.items():  # torch would answer one with a TorchScript signature dump
            if isinstance(value, int) and not -(2**63) <= value < 2**63:
                raise ValueError(f"{kind} state {key!r} holds {value}, beyond a 64-bit integer")
        # A list crosses as a float64 tensor: an empty Python list has no element type.
        values = {k: torch.tensor(v, dtype=torch.float64) if isinstance(v, list) else v for k, v in state.items()}
        self._deferred.settling(self._core.load_state, kind, values, refusals=True)  # made again from this one

    def _has_scaler_option(self, name: str) -> bool:
        return self._enabled and any(r[0] == name for r in self.plugin_options("scaler"))

    def _scaler_option(self, name: str, kind: type) -> Any:
        if not self._has_scaler_option(name):
            return self._torch_args[name]
        text = cpp(self._core.option)("scaler", name)
        return kind(float(text)) if kind is int else kind(text)

    def _set_scaler_option(self, name: str, value: Any) -> None:
        if not self._enabled:
            self._torch_args[name] = value
            return
        if not self._has_scaler_option(name):
            raise ValueError(f"scaler '{self._plugin('scaler')[0]}' has no option '{name}'")
        self._deferred.refuse_in_capture("changing an option (set it before capturing)")
        self._deferred.settling(self._core.set_option, "scaler", name, option_text(value, name), refusals=True)

    def __getstate__(self) -> Dict[str, Any]:
        if self._enabled:
            self._deferred.drain()
        state = self.__dict__.copy()
        if self._enabled:
            assert len(self._per_optimizer_states) == 0, (
                "A GradScaler instance may only be pickled at the beginning of an iteration, "
                "or at the end after scaler.update()."
            )
            state["_saved_state_dict"] = self.state_dict()
        state["_core"] = None
        state["_model"], state["_names"] = None, {}  # the model is not the scaler's to pickle
        state["_scale"] = None
        state["_scale_per_device"] = {}
        state["_per_optimizer_states"] = {}
        state["_loss_sum"], state["_loss_count"] = None, 0
        state["_bound"], state["_fused_args"] = None, {}  # a WeakKeyDictionary does not pickle
        state["_last_taken"] = None
        state["_deferred"] = DeferredMode(self._deferred.sync, cuda=self._deferred.cuda)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        saved = state.pop("_saved_state_dict", None)
        self.__dict__.update(state)
        self.__dict__.setdefault("_next_slot", 0)  # a scaler pickled by an ampkit before these
        self.__dict__.setdefault("_passthrough_steps", 0)
        self._deferred = DeferredMode(self._deferred.sync, cuda=self._deferred.cuda)
        self._bound: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = weakref.WeakKeyDictionary()
        self._last_taken: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        if self._enabled:
            self._core = self._make_core()
            self._deferred.reset(self._core)
            if saved:
                self.load_state_dict(saved)
