"""ampkit.GradScaler: torch.amp.GradScaler's interface over ampkit's plugins.

The call order, the misuse errors, the in-place ``unscale_`` and the per-optimizer skips are
torch/amp/grad_scaler.py's (torch 2.11). What happens after backward is the C++ AmpStep
(core/engine/include/ampkit/amp_step.h): one statistics pass, the NaN policy's decision, the
named clipper on unscaled gradients, unscale and clip in one multiply (or folded into a fused
optimizer's ``grad_scale``), and the scaler plugin's update once per iteration.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch
from torch.amp.grad_scaler import OptState

from . import _library
from ._errors import cpp
from ._deferred import DeferredMode
from .deepspeed import scaler_kwargs_from_deepspeed
from .locator import NanLocator

__all__ = ["GradScaler", "OptState"]

# torch.amp.GradScaler's constructor defaults: an argument left at its default leaves the
# plugin's own default (or AMPKIT_SCALER_<OPTION>) in force.
_TORCH_DEFAULTS = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


def _refresh_per_optimizer_state() -> Dict[str, Any]:
    # torch's keys (stage: torch's OptState; found_inf_per_device: _check_inf_per_device's), then ours.
    return {"stage": OptState.READY, "found_inf_per_device": {}, "step": None, "factor": 1.0, "folded": False}


def _option_text(value: Any) -> str:
    """The --opt text of a Python value (bool before int: True is an int)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (int, str)):
        return str(value)
    raise ValueError(f"option value {value!r} must be a bool, int, float or str")


class GradScaler(torch.amp.GradScaler):
    """A :class:`torch.amp.GradScaler` whose strategies are ampkit plugins.

    A subclass, so every type check and private call trainers and fused optimizers make works and
    means what it means in torch: ``_scale`` (the scale, float32 on the device, made by the first
    :meth:`scale`), ``_growth_tracker``, ``_per_optimizer_states`` (torch's ``OptState`` stages),
    ``_lazy_init_scale_growth_tracker``, ``_get_scale_async``, ``_check_inf_per_device``, and the
    ``_step_supports_amp_scaling`` protocol. torch's ``__init__`` is not run: the scale and its
    counters are the scaler plugin's state, and ``_init_scale``, ``_growth_factor``,
    ``_backoff_factor``, ``_growth_interval`` and ``_init_growth_tracker`` read it.

    Args:
        device: the device of the parameters ("cuda" or "cpu"), as torch's.
        init_scale, growth_factor, backoff_factor, growth_interval: torch's arguments; each one
            given with a value other than torch's default sets the scaler plugin's option of the
            same name (``scaler.init_scale``, ...).
        enabled: False makes every method a pass-through, as torch's.
        scaler: the loss scaler plugin, by name or path (``dynamic`` is torch's, exactly).
        clipper: the gradient clipper plugin; it clips inside :meth:`unscale_`/:meth:`step`,
            always on unscaled gradients (``none``: no clipping).
        nan_policy: what a step with a non-finite or spiking gradient does (``skip``, as torch;
            ``backoff``, ``abort``; ``rollback`` needs a model snapshot and is refused here).
        precision: "fp16", "bf16" or "fp32"; picks per-precision option defaults. None: fp16.
        opt: plugin options as ``{"KIND.OPTION": value}``, the names and checks of
            ampkit-train's ``--opt`` (values also come from ``AMPKIT_<KIND>_<OPTION>``).
        plugin_dirs: folders searched for plugins before ``AMPKIT_PLUGIN_PATH``.
        allow_untrusted_plugins: load plugin files that are writable by others (loud warning).
        model: names the gradients in :attr:`last_step` ("top_layers") by module path.
        stats_recipe: how the gradient statistics are computed (``automatic``: ``fused_scan`` for
            fp32 CPU parameters, ``chunk_kernel`` on a GPU where this build holds ampkit's kernel,
            ``foreach_ops`` otherwise; docs/architecture.md). Chosen once per optimizer, on its
            first step; :attr:`last_step` says which ran.
        sync: ``"auto"`` (default): with a fused optimizer (``fused=True``) whose scaler, clipper
            and NaN policy all have a device form, from the second iteration on (when the first had
            one optimizer) the step makes no host read: statistics, decisions and the scale's update
            stay on the device, :meth:`step` returns a bool tensor, and the plugins' host state
            (:attr:`last_step`, :meth:`state_dict`) follows at most one step later.
            ``"deferred"``: the same from the first step; ``"step"``: one host read per step, as
            torch's. Where the deferred step cannot run, one warning says why.

    Raises:
        ValueError: an unknown plugin kind or option, or a bad option value (the message names
            it, with "did you mean").
        ampkit.PluginError: a plugin that cannot be found, trusted, loaded or created.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        scaler: str = "dynamic",
        clipper: str = "none",
        nan_policy: str = "skip",
        precision: Optional[str] = None,
        opt: Optional[Mapping[str, Any]] = None,
        plugin_dirs: Optional[Sequence[Union[str, os.PathLike]]] = None,
        allow_untrusted_plugins: bool = False,
        model: Optional[torch.nn.Module] = None,
        stats_recipe: str = "automatic",
        sync: str = "auto",
    ) -> None:
        self._device = str(device)
        self._enabled = bool(enabled)
        if self._device == "cuda" and self._enabled and not torch.cuda.is_available():
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.")
            self._enabled = False
        torch_args = {
            "init_scale": init_scale,
            "growth_factor": growth_factor,
            "backoff_factor": backoff_factor,
            "growth_interval": growth_interval,
        }
        self._config: Dict[str, Any] = {
            "plugins": {"scaler": str(scaler), "clipper": str(clipper), "nan_policy": str(nan_policy)},
            "opt": {str(k): _option_text(v) for k, v in (opt or {}).items()},
            "precision": precision or "fp16",
            "plugin_dirs": _library.plugin_folders(plugin_dirs),
            "allow_untrusted": bool(allow_untrusted_plugins),
            "stats_recipe": str(stats_recipe),
        }
        for name, value in torch_args.items():
            if value != _TORCH_DEFAULTS[name]:
                self._config["opt"].setdefault("scaler." + name, _option_text(value))
        self._torch_args = torch_args
        self._model = model
        self._names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        self._core: Any = None
        self._scale: Optional[torch.Tensor] = None  # torch's: None until the first scale()
        self._scale_per_device: Dict[torch.device, torch.Tensor] = {}
        self._per_optimizer_states: Dict[int, Dict[str, Any]] = defaultdict(_refresh_per_optimizer_state)
        self._last_taken: Dict[int, Any] = {}  # bool, or a bool tensor on the device (deferred)
        self._loss_sum: Optional[torch.Tensor] = None  # this iteration's losses given to scale()
        self._loss_count = 0
        self._pass_loss = True
        # id(optimizer) -> (slot, the param lists it was bound with): its parameters are handed to
        # the C++ side once, and again only when its param_groups change.
        self._bound: Dict[int, Any] = {}
        self._fused_args: Dict[torch.device, Any] = {}  # grad_scale, found_inf for fused optimizers
        self._fallback_said = False
        self._deferred = DeferredMode(str(sync))
        self._initial = (float(init_scale), 0)  # torch's _init_scale, _init_growth_tracker
        if self._enabled:
            self._core = self._make_core()
            self._deferred.reset(self._core)
            self._initial = (self._core_scale(), 0)

    def _make_core(self) -> Any:
        c = self._config
        dirs = c["plugin_dirs"] + [_library.builtin_plugin_dir()]
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank = torch.distributed.get_rank() if distributed else 0
        world = torch.distributed.get_world_size() if distributed else 1
        # Under DDP every rank sees the same averaged gradients but its own loss: a decision that
        # read the loss could differ between ranks, so the policy sees the gradients only.
        self._pass_loss = world == 1
        self._bound = {}
        make = cpp(lambda: torch.classes.ampkit.ScalerCore(
            c["plugins"], c["opt"], c["precision"], dirs, c["allow_untrusted"], self._device.startswith("cuda"),
            rank, world, c["stats_recipe"]))
        return make()

    @classmethod
    def from_deepspeed_config(
        cls, config: Union[str, os.PathLike, Mapping[str, Any]], device: str = "cuda", **kwargs: Any
    ) -> "GradScaler":
        """A GradScaler from a DeepSpeed config's ``fp16``/``bf16``/``gradient_clipping`` keys
        (a path to its JSON, or the dict); unmapped keys are named in one warning
        (ampkit/deepspeed.py). ``kwargs`` win over the mapped values."""
        return cls(device=device, **scaler_kwargs_from_deepspeed(config, **kwargs))

    # --- torch.amp.GradScaler's methods -------------------------------------------------------

    def scale(self, outputs: Any) -> Any:  # type: ignore[override]
        """Multiplies a tensor, or the tensors of a nested list/tuple, by the loss scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            if outputs.numel() == 1:  # a loss: the NaN policy and spike detection read it
                loss = outputs.detach().float().reshape(())
                self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
                self._loss_count += 1
            return outputs * self._scale_on(outputs.device)

        def apply_scale(val: Any) -> Any:
            if isinstance(val, torch.Tensor):
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker(val.device)
                return val * self._scale_on(val.device)
            if isinstance(val, Iterable):
                iterable = map(apply_scale, val)
                if isinstance(val, (list, tuple)):
                    return type(val)(iterable)
                return iterable
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscales (and clips, with the named clipper) ``optimizer``'s gradients in place.

        Also decides, with the NaN policy, whether :meth:`step` will step this optimizer.
        """
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        elif state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        self._unscale(optimizer, state, fold=False)
        state["stage"] = OptState.UNSCALED

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Steps ``optimizer`` unless this iteration's gradients were not finite (or the NaN
        policy said skip). Returns True when it stepped, False when it skipped; a disabled scaler
        returns what ``optimizer.step`` returns."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False) and (
            "grad_scaler" in inspect.signature(optimizer.step).parameters
        ):
            # torch's older contract: the optimizer gets the scaler and unscales itself.
            warnings.warn(
                "GradScaler is going to stop passing itself as a keyword argument to the passed "
                "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                "`found_inf: Tensor` to the passed optimizer and let the optimizer use them directly.",
                FutureWarning,
                stacklevel=2,
            )
            retval = optimizer.step(*args, **dict(kwargs, grad_scaler=self))
            state["stage"] = OptState.STEPPED
            return retval
        if state["stage"] is OptState.READY:
            slot = self._slot(optimizer)
            if self._deferred.applies(optimizer, slot):  # no host read: docs/python.md
                stepped_on_device = self._deferred.step(optimizer, slot, self._iteration_loss(), args, kwargs)
                state["stage"], state["step"] = OptState.STEPPED, True
                self._last_taken[id(optimizer)] = stepped_on_device
                return stepped_on_device
            self._unscale(optimizer, state, fold=bool(getattr(optimizer, "_step_supports_amp_scaling", False)))
        if state["step"] is None:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        stepped = bool(state["step"])
        fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and state["folded"]
        if stepped:
            if fused:  # unscale and clip folded into the fused optimizer's step (torch always hands it grad_scale)
                grad_scale, found_inf = self._fused_step_args(self._grads_device(optimizer))
                grad_scale.fill_(1.0 / state["factor"])
                optimizer.grad_scale, optimizer.found_inf = grad_scale, found_inf
                try:
                    optimizer.step(*args, **kwargs)
                finally:
                    del optimizer.grad_scale
                    del optimizer.found_inf
            else:
                optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        self._last_taken[id(optimizer)] = stepped
        return stepped

    def update(self, new_scale: Union[float, torch.Tensor, None] = None) -> None:
        """The scaler plugin's update with this iteration's statistics (or ``new_scale``)."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("update")
        try:
            if new_scale is not None:
                if isinstance(new_scale, float):
                    value = new_scale
                else:
                    reason = (
                        "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                        "torch.FloatTensor with requires_grad=False."
                    )
                    assert isinstance(new_scale, torch.Tensor), reason
                    assert new_scale.device.type == self._device, reason
                    assert new_scale.numel() == 1, reason
                    assert new_scale.requires_grad is False, reason
                    value = float(new_scale.item())
                if self._deferred.finish_iteration():  # counted on delivery: set the scale only
                    self._deferred.drain()
                    self._load_plugin_state("scaler", dict(self._plugin_state("scaler"), scale=value))
                else:
                    cpp(self._core.set_scale)(value)
                self._deferred.forget()
            elif not self._deferred.finish_iteration():
                recorded = [s for s in self._per_optimizer_states.values() if s["step"] is not None]
                if len(recorded) == 0:
                    raise AssertionError("No inf checks were recorded prior to update.")
                cpp(self._core.update)()
                self._deferred.learn(len(recorded))
        finally:
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
            self._loss_sum, self._loss_count = None, 0
            self._refresh_scale()

    def get_scale(self) -> float:
        """The current scale (the initial one before the first update), 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        self._deferred.drain()
        return self._core_scale()

    def get_growth_factor(self) -> float:
        return self._scaler_option("growth_factor", float)

    def set_growth_factor(self, new_factor: float) -> None:
        self._set_scaler_option("growth_factor", float(new_factor))

    def get_backoff_factor(self) -> float:
        return self._scaler_option("backoff_factor", float)

    def set_backoff_factor(self, new_factor: float) -> None:
        self._set_scaler_option("backoff_factor", float(new_factor))

    def get_growth_interval(self) -> int:
        return self._scaler_option("growth_interval", int)

    def set_growth_interval(self, new_interval: int) -> None:
        self._set_scaler_option("growth_interval", int(new_interval))

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return int(self._plugin_state("scaler").get("growth_tracker", 0))

    def is_enabled(self) -> bool:
        return self._enabled

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
                kind: {"plugin": self._plugin(kind)[0], "state": self._plugin_state(kind)}
                for kind in ("scaler", "clipper", "nan_policy")
            },
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads torch.amp.GradScaler's state_dict (ampkit-train's scaler_state_dict.pt too) or
        one of ours, whose plugin states are restored where the plugins are the same."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
            )
        current = self._plugin_state("scaler")
        if current.get("growth_tracker", 0) != 0:  # so that any new growth_interval admits it
            self._load_plugin_state("scaler", dict(current, growth_tracker=0))
        for name in ("growth_factor", "backoff_factor", "growth_interval"):
            if self._has_scaler_option(name) and state_dict[name] != self._scaler_option(name, type(state_dict[name])):
                self._set_scaler_option(name, state_dict[name])
        saved = state_dict.get("ampkit", {})
        for kind in ("scaler", "clipper", "nan_policy"):
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
        state["_bound"], state["_fused_args"] = {}, {}
        state["_deferred"] = DeferredMode(self._deferred.sync)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        saved = state.pop("_saved_state_dict", None)
        self.__dict__.update(state)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        if self._enabled:
            self._core = self._make_core()
            self._deferred.reset(self._core)
            if saved:
                self.load_state_dict(saved)

    # --- what ampkit adds -----------------------------------------------------------------------

    @property
    def last_step(self) -> Dict[str, Any]:
        """The last unscale's record, the keys of ampkit-train's metrics record (docs/configuration.md)
        but the host's (epoch, lr, samples_per_second, time): step, loss, scale, scale_next,
        grad_norm (unscaled), grad_norm_clipped, grad_max_abs, zero_fraction, clip_coef,
        clip_threshold, clipped, found_inf, action, reason ("" where the policy gave none), stepped,
        skipped_steps, top_layers ([{name, grad_norm}], largest first); plus layer_norms
        ({name: grad_norm} for every parameter; names need ``model=``) and stats_recipe (the
        statistics recipe that ran)."""
        if not self._enabled:
            return {}
        self._deferred.drain()
        return dict(cpp(self._core.record)())

    def locate(self, closure: Callable[[], torch.Tensor]) -> Dict[str, Any]:
        """After a skipped step: re-runs it (``closure`` is its forward under its autocast, returning
        the loss) with every submodule of ``model`` observed, backward at the step's scale, and
        returns ampkit-train's NaN report: ``step``, ``rank``, ``detection``, ``action``,
        ``loss_scale``, ``precision``, ``located``, ``module``, ``module_type``, ``phase``,
        ``finding``, ``observation``, ``forward``, ``backward`` (:class:`ampkit.NanLocator`)."""
        if self._model is None:
            raise ValueError("locate() needs the model: create the GradScaler with model=...")
        record = self.last_step
        scale = record.get("scale", 1.0)
        located = NanLocator(self._model).locate(closure, scale=scale)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        report = {
            "step": record.get("step", 0),
            "rank": torch.distributed.get_rank() if distributed else 0,
            "detection": record.get("reason", ""),
            "action": record.get("action", ""),
            "loss_scale": scale,
            "precision": self._config["precision"],
        }
        report.update(located)
        return report

    def stepped(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` stepped in the last iteration (True before the first)."""
        return bool(self._last_taken.get(id(optimizer), True))  # deferred: a device tensor, read here

    def set_plugin_option(self, key: str, value: Any) -> None:
        """Sets one plugin option while training, ``key`` as in ``opt=`` (``"clipper.max_norm"``):
        the plugin is made again with it, its other options and its state kept (as a resumed run
        would make it), and stays guarded. Raises ValueError for an unknown kind, option or value."""
        kind, dot, name = str(key).partition(".")
        if not dot or not kind or not name:
            raise ValueError(f"option '{key}' is not of the form KIND.OPTION (e.g. clipper.max_norm)")
        if not self._enabled:
            return
        cpp(self._core.set_option)(kind, name, _option_text(value))
        self._deferred.forget()

    def plugin_options(self, kind: str) -> List[tuple]:
        """The effective options of the ``kind`` plugin: (name, value, source) rows."""
        if not self._enabled:
            return []
        return [tuple(r) for r in cpp(self._core.settings)(kind)]

    # --- internals ------------------------------------------------------------------------------

    def _check_scale_growth_tracker(self, funcname: str) -> Any:
        fix = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  {fix}")
        # torch returns its tracker tensor too; ours is the plugin's state, read only where asked
        # for (_growth_tracker), never per step: a deferred step must not wait for the device.
        return (self._scale, None)

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        """torch's lazy start of ``_scale`` on ``dev`` (the first scale(), or a trainer that
        places it, as Accelerate's FSDP2 load_state does), from the scaler plugin's scale."""
        self._scale = torch.full((), self._core_scale(), dtype=torch.float32, device=dev)
        self._scale_per_device = {}

    def _get_scale_async(self) -> Optional[torch.Tensor]:
        """The scale as a tensor on the device, without waiting for it (torch's; fused optimizers
        of Apex and Transformer Engine read it)."""
        return self._scale

    @property
    def _growth_tracker(self) -> Optional[torch.Tensor]:  # type: ignore[override]
        """torch's growth tracker: the scaler plugin's ``growth_tracker`` as an int32 tensor on
        the scale's device (None before the first scale(), as torch's)."""
        if self._scale is None:
            return None
        return torch.full((), self._get_growth_tracker(), dtype=torch.int32, device=self._scale.device)

    @_growth_tracker.setter
    def _growth_tracker(self, value: Any) -> None:
        if value is not None and self._enabled:
            state = self._plugin_state("scaler")
            if "growth_tracker" in state:
                state["growth_tracker"] = int(value.item() if isinstance(value, torch.Tensor) else value)
                self._load_plugin_state("scaler", state)

    @property
    def _init_scale(self) -> float:  # type: ignore[override]
        """torch's: the scale at construction or from the last load_state_dict (not the live one)."""
        return self._initial[0]

    @property
    def _init_growth_tracker(self) -> int:  # type: ignore[override]
        return self._initial[1]

    @property
    def _growth_factor(self) -> float:  # type: ignore[override]
        return self.get_growth_factor()

    @property
    def _backoff_factor(self) -> float:  # type: ignore[override]
        return self.get_backoff_factor()

    @property
    def _growth_interval(self) -> int:  # type: ignore[override]
        return self.get_growth_interval()

    def _core_scale(self) -> float:
        return float(cpp(self._core.scale)())

    def _scale_on(self, device: torch.device) -> torch.Tensor:
        assert self._scale is not None
        deferred = self._deferred.scale
        if deferred is not None and deferred.device == device:
            return deferred  # the device's own scale, updated there: no copy, no read
        cached = self._scale_per_device.get(device)
        if cached is None:
            cached = self._scale.to(device=device, non_blocking=True)
            self._scale_per_device[device] = cached
        return cached

    def _refresh_scale(self) -> None:
        if self._scale is None:
            return
        deferred = self._deferred.scale
        if deferred is not None and deferred.device == self._scale.device:
            self._scale = deferred  # the device's own scale, updated there: no copy, no read
        else:
            self._scale.fill_(self._core_scale())
        self._scale_per_device = {}

    def _grads_device(self, optimizer: torch.optim.Optimizer) -> torch.device:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    return p.grad.device
        return torch.device(self._device)

    def _fused_step_args(self, device: torch.device) -> Any:
        """grad_scale and found_inf for a fused optimizer on ``device``: made once, filled per step
        (found_inf stays 0: a bad step never reaches the optimizer)."""
        args = self._fused_args.get(device)
        if args is None:
            args = (torch.ones((), dtype=torch.float32, device=device), torch.zeros((), dtype=torch.float32, device=device))
            self._fused_args[device] = args
        return args

    def _slot(self, optimizer: torch.optim.Optimizer) -> int:
        """The C++ side's table of ``optimizer``'s parameters, bound on its first step and again
        when its param_groups change (a group added, a params list replaced or resized)."""
        groups = optimizer.param_groups
        key = tuple((id(group["params"]), len(group["params"])) for group in groups)
        bound = self._bound.get(id(optimizer))
        if bound is not None and bound[1] == key:
            return bound[0]
        slot = bound[0] if bound is not None else len(self._bound)
        params = [p for group in groups for p in group["params"]]
        names = [self._names.get(id(p), f"param_groups[{g}][{i}]")
                 for g, group in enumerate(groups) for i, p in enumerate(group["params"])]
        _, fallback = cpp(self._core.bind)(slot, params, names)
        if fallback and not self._fallback_said:  # once: the GPU path without ampkit's kernel
            warnings.warn(fallback, stacklevel=3)
            self._fallback_said = True
        self._bound[id(optimizer)] = (slot, key)
        return slot

    def _iteration_loss(self) -> Optional[torch.Tensor]:
        """The mean of this iteration's losses given to scale() (None under DDP: each rank's own)."""
        return self._loss_sum / self._loss_count if self._loss_count and self._pass_loss else None

    def _unscale(self, optimizer: torch.optim.Optimizer, state: Dict[str, Any], fold: bool) -> None:
        slot = self._slot(optimizer)
        with torch.no_grad():
            recorded, step, factor = cpp(self._core.unscale)(slot, fold, self._iteration_loss())
        state["step"] = bool(step) if recorded else None
        state["factor"] = float(factor)
        state["folded"] = fold

    def _plugin(self, kind: str) -> List[str]:
        return list(cpp(self._core.plugin)(kind))

    def _plugin_state(self, kind: str) -> Dict[str, Any]:
        self._deferred.drain()
        return dict(cpp(self._core.state)(kind))

    def _load_plugin_state(self, kind: str, state: Mapping[str, Any]) -> None:
        # A list crosses as a float64 tensor: an empty Python list has no element type.
        values = {k: torch.tensor(v, dtype=torch.float64) if isinstance(v, list) else v for k, v in state.items()}
        cpp(self._core.load_state)(kind, values)
        self._deferred.forget()  # the device state is made again from this one

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
        cpp(self._core.set_option)("scaler", name, _option_text(value))
        self._deferred.forget()
