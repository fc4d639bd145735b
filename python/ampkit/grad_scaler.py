"""ampkit.GradScaler: torch.amp.GradScaler's interface over ampkit's plugins.

The call order, the misuse errors, the in-place ``unscale_`` and the per-optimizer skips are
torch/amp/grad_scaler.py's (torch 2.11); what happens after backward is the C++ AmpStep
(core/engine/include/ampkit/amp_step.h). One object: the class owns torch's call-order state
machine and calls, never inherits, its helpers: the C++ side (``_scaler_core``, where the plugins'
and the step's state live), the plugins' options and states (``_plugin_access``), the optimizers'
gradient tables (``_optimizer_tables``), the deferred step (``_deferred``).
"""

from __future__ import annotations

import inspect
import os
import warnings
import weakref
from collections import defaultdict
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch.amp.grad_scaler import OptState

from ._arguments import check_arguments
from ._deferred import DeferredMode
from ._facts import fp8_facts, passthrough_record
from ._iteration import IterationLosses, found_inf_per_device, fresh_optimizer_state
from ._optimizer_tables import OptimizerTables, step_taking_scaler
from ._plugin_access import PluginSettings, check_state_dict, plugin_config
from ._scaler_core import ScalerCore, make_scaler_core, world_size
from ._statistics_group import StatisticsGroup
from ._torch_state import GrowthTracker, ScaleTensor, TorchOption, check_new_scale, pickled_state, scale_outputs
from ._tracing import not_traced
from .deepspeed import scaler_kwargs_from_deepspeed
from .locator import nan_report

__all__ = ["GradScaler", "OptState"]

# What a pickled GradScaler keeps: its arguments; its plugins' states ride as a state_dict.
_PICKLED = (
    "_device _enabled _sync _config _torch_args _group _passthrough_steps _init_scale _init_growth_tracker".split()
)


class GradScaler(torch.amp.GradScaler):
    """A :class:`torch.amp.GradScaler` whose strategies are ampkit plugins.

    A subclass, so every type check and private call that trainers and fused optimizers make works and means
    what it means in torch (docs/python.md, "GradScaler", lists them). torch's ``__init__`` is not run: the
    scale and its counters are the scaler plugin's state, which ``_init_scale``, ``_growth_factor``, ... read.

    Args:
        device: the device of the parameters ("cuda" or "cpu"), as torch's.
        init_scale, growth_factor, backoff_factor, growth_interval: torch's arguments; each one given with a value
            other than torch's default sets the scaler plugin's option of the same name (``scaler.init_scale``,
            ...).
        enabled: False makes every method a pass-through, as torch's.
        scaler: the loss scaler plugin, by name or path (``dynamic`` is torch's, exactly).
        clipper: the gradient clipper plugin; it clips inside :meth:`unscale_`/:meth:`step`, always on unscaled
            gradients (``none``: no clipping).
        nan_policy: what a step with a non-finite gradient or loss (or a spike) does (``skip``: torch's, but a
            non-finite loss skips too; ``backoff``, ``abort``; ``rollback`` is refused here).
        precision: "fp16", "bf16" or "fp32"; picks per-precision option defaults. None: fp16.
        opt: plugin options as ``{"KIND.OPTION": value}``, the names and checks of ampkit-train's ``--opt`` (values
            also come from ``AMPKIT_<KIND>_<OPTION>``).
        plugin_dirs: folders searched for plugins before ``AMPKIT_PLUGIN_PATH``.
        allow_untrusted_plugins: load plugin files that are writable by others (loud warning).
        model: names the gradients in :attr:`last_step` ("top_layers") by module path.
        stats_recipe: how the gradient statistics are computed (``automatic``: chosen per optimizer on its first
            step, docs/architecture.md); :attr:`last_step` says which ran.
        sync: ``"auto"`` (default): with one fused optimizer whose strategies all have a device form, from the
            second iteration on the step makes no host read and :meth:`step` returns a bool tensor; ``"deferred"``:
            from the first step; ``"step"``: one host read per step, as torch's (docs/python.md, "A step that never
            waits for the GPU").
        process_group: the ``torch.distributed`` group the gradient statistics are reduced over, so every rank
            decides on the same numbers. None (default): FSDP2's DTensor gradients over their device mesh's group,
            plain gradients not (docs/python.md, "Sharded models").
        average_loss: True: the NaN policy reads the loss averaged over the ranks. False (default): with more than
            one rank it reads the gradients only.
        plugin_timeout: seconds a plugin may take to load, construct, and in any later call; past it, one line
            naming the plugin and the call, and Python exits with code 3. None: no limit.

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
        process_group: Optional["torch.distributed.ProcessGroup"] = None,
        average_loss: bool = False,
        plugin_timeout: Optional[int] = 30,
    ) -> None:
        arguments = locals()
        check_arguments(arguments)
        self._device = str(device)
        self._enabled = bool(enabled)
        if self._device == "cuda" and self._enabled and not torch.cuda.is_available():
            # torch's warning, issued as torch issues it (no stacklevel).
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.")  # noqa: B028
            self._enabled = False
        names = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")
        self._torch_args: Dict[str, Any] = {name: arguments[name] for name in names}
        self._config = plugin_config(arguments, self._torch_args)
        self._sync = str(sync)
        self._model = model
        self._group = StatisticsGroup(process_group, average_loss)
        self._passthrough_steps = 0  # a disabled scaler's steps (its last_step's step)
        self._init_scale, self._init_growth_tracker = float(init_scale), 0  # torch's
        self._begin(check_plugins=True)  # a disabled scaler's too: its arguments are refused on any machine
        if self._enabled:
            self._init_scale = self._plugins.scale()

    def _begin(self, check_plugins: bool = False) -> None:
        """The state of a scaler that has not stepped, over a new C++ side."""
        self._names = {id(p): n for n, p in self._model.named_parameters()} if self._model is not None else {}
        self._scales = ScaleTensor()  # torch's _scale
        self._per_optimizer_states: Dict[int, Dict[str, Any]] = defaultdict(fresh_optimizer_state)
        self._last_taken: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # bool or device tensor
        self._losses = IterationLosses()  # this iteration's losses given to scale()
        self._deferred = DeferredMode(self._sync, cuda=self._device.startswith("cuda"))
        self._core: Optional[ScalerCore] = None
        self._tables: Optional[OptimizerTables] = None
        self._core_world, self._pass_loss = 1, True
        self._plugins = PluginSettings(None, self._deferred, self._torch_args)  # a disabled scaler's
        if self._enabled or check_plugins:
            self._start_core()

    def _start_core(self) -> None:
        """A C++ side for the process group in force, and the helpers over it."""
        core, self._core_world = make_scaler_core(self._config, self._device.startswith("cuda"))
        self._pass_loss = self._group.passes_loss(self._core_world)
        if self._enabled:
            self._core = core
            self._plugins = PluginSettings(core, self._deferred, self._torch_args)
            self._tables = OptimizerTables(core, self._group, self._names, self._device)
            self._deferred.reset(core)

    def _slot(self, optimizer: torch.optim.Optimizer) -> Tuple[OptimizerTables, int]:
        """``optimizer``'s table. Before the first: a process group started after the scaler was made
        (Lightning starts it after making its precision plugin) is the one the step serves: the C++ side
        is made again for it, with the scaler's state (under DDP the NaN policy reads no rank's own loss)."""
        tables = self._tables
        assert tables is not None, "a disabled GradScaler binds no optimizer"
        if tables.next_slot == 0 and optimizer not in tables.bound and world_size() != self._core_world:
            saved = self.state_dict()
            self._start_core()
            self.load_state_dict(saved)
        assert self._tables is not None
        return self._tables, self._tables.slot(optimizer)

    @classmethod
    def from_deepspeed_config(
        cls,
        config: Union[str, os.PathLike, Mapping[str, Any]],
        device: str = "cuda",
        deepspeed_version: Optional[str] = None,
        **kwargs: Any,
    ) -> "GradScaler":
        """A GradScaler from a DeepSpeed config's ``fp16``/``bf16``/``gradient_clipping`` keys (a JSON path or dict),
        by ``deepspeed_version`` ("0.17.0", "0.17.1", "latest"; default: the config's ``ampkit_deepspeed_version``,
        else the latest); unmapped keys are named in one warning. ``kwargs`` win over the mapped values."""
        return cls(device=device, **scaler_kwargs_from_deepspeed(config, deepspeed_version, **kwargs))

    def scale(self, outputs: Any) -> Any:
        """Multiplies a tensor, or the tensors of a nested list/tuple, by the loss scale."""
        if not self._enabled:
            return outputs
        self._losses.take(outputs)
        return scale_outputs(outputs, self._scaled)

    def _scaled(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(tensor.device)
        return tensor * self._scales.on(tensor.device, self._deferred.scale)

    @not_traced
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
        self._deferred.refuse_in_capture("unscale_() (it reads the step's decision on the host: clip with clipper=)")
        self._unscale(optimizer, state, fold=False)
        state["stage"] = OptState.UNSCALED
        self._deferred.ran_synchronously(
            "unscale_() was called before step() (clip with clipper= to stay on the device)"
        )

    def _unscale(self, optimizer: torch.optim.Optimizer, state: Dict[str, Any], fold: bool) -> None:
        """The engine's synchronous step for ``optimizer``, its decision kept in ``state``."""
        tables, slot = self._slot(optimizer)
        recorded, step, factor = tables.unscale(optimizer, slot, fold, self._iteration_loss(), self._deferred)
        state.update(step=step if recorded else None, factor=factor, folded=fold, unscaled=True)

    @not_traced
    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Steps ``optimizer`` unless this iteration's gradients were not finite (or the NaN
        policy said skip). Returns True when it stepped, False when it skipped (disabled: True, or
        as torch's the value ``optimizer.step`` returned where it returned one, a closure's loss)."""
        if not self._enabled:
            retval = optimizer.step(*args, **kwargs)
            self._passthrough_steps += 1
            return True if retval is None else retval
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        if fused and "grad_scaler" in inspect.signature(optimizer.step).parameters:
            retval = step_taking_scaler(optimizer, self, args, kwargs)
            state["stage"] = OptState.STEPPED
            return retval
        if state["stage"] is OptState.READY:
            tables, slot = self._slot(optimizer)
            if not self._deferred.try_unscale(
                optimizer, slot, self._per_optimizer_states, tables, self._iteration_loss
            ):
                self._unscale(optimizer, state, fold=fused)
            state["stage"] = OptState.UNSCALED  # a step() retried after optimizer.step raised does not unscale again
        assert self._tables is not None
        stepped = self._tables.step(optimizer, state, self._deferred, args, kwargs)  # deferred: a device tensor
        state["stage"] = OptState.STEPPED
        self._last_taken[optimizer] = stepped
        return stepped

    @not_traced
    def update(self, new_scale: Union[float, torch.Tensor, None] = None) -> None:
        """The scaler plugin's update with this iteration's statistics (or ``new_scale``)."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("update")
        graph = self._deferred.capturing()
        if new_scale is not None:
            self._deferred.refuse_in_capture("update(new_scale) (set the scale before capturing)")
        try:
            if new_scale is not None:
                self._plugins.set_scale(check_new_scale(new_scale, self._device))
            else:
                self._deferred.finish_iteration(self._per_optimizer_states, graph)
        finally:
            self._per_optimizer_states = defaultdict(fresh_optimizer_state)
            self._losses.clear()
            self._refresh_scale()

    def get_scale(self) -> float:
        """The current scale (the initial one before the first update), 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        self._deferred.drain()
        return self._plugins.scale()

    def state_dict(self) -> Dict[str, Any]:
        """torch.amp.GradScaler's state_dict, plus ``"ampkit"``: every plugin's name and state.
        Loads with ``torch.load(weights_only=True)``."""
        if not self._enabled:
            return {}
        self._deferred.drain()
        return self._plugins.state_dict(self.get_scale())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads torch.amp.GradScaler's state_dict (ampkit-train's scaler_state_dict.pt too) or
        one of ours, whose plugin states are restored where the plugins are the same."""
        if not isinstance(state_dict, Mapping):  # torch's raises TypeError too (a str is not indexable by key)
            raise TypeError(f"load_state_dict: state_dict must be a dict, got {type(state_dict).__name__}")
        if not self._enabled:
            return
        try:
            self._init_scale, self._init_growth_tracker = self._plugins.load_state_dict(check_state_dict(state_dict))
        finally:
            self._refresh_scale()

    # torch's private state, which trainers and fused optimizers read. Read and assigned by torch's own
    # get_/set_ methods (inherited, not overridden): the scaler plugin's options of those names.
    _growth_factor = TorchOption("growth_factor", float)
    _backoff_factor = TorchOption("backoff_factor", float)
    _growth_interval = TorchOption("growth_interval", int)
    _growth_tracker = GrowthTracker()

    def _get_growth_tracker(self) -> int:
        return self._plugins.growth_tracker()

    def _plugin(self, kind: str) -> List[str]:
        return self._plugins.plugin(kind)  # name, version and file of the ``kind`` plugin

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
        self._scales.place(dev, self._plugins.scale())

    @property
    def _scale(self) -> Optional[torch.Tensor]:
        """torch's: the scale, float32 on the device of the first scale() (None before)."""
        return self._scales.tensor

    @_scale.setter
    def _scale(self, value: Optional[torch.Tensor]) -> None:
        self._scales.tensor, self._scales.per_device = value, {}

    def _get_scale_async(self) -> Optional[torch.Tensor]:
        """torch's scale without waiting for it (fused optimizers of Apex and Transformer Engine read it)."""
        return self._scale

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> Dict[Any, Any]:
        """torch's: after unscale_() (or step()), {device: 1.0 where the step is skipped, else 0.0}."""
        return found_inf_per_device(self._per_optimizer_states[id(optimizer)], optimizer, self._tables)

    def _refresh_scale(self) -> None:
        if self._scale is not None:
            self._scales.refresh(self._plugins.scale, self._deferred.scale)

    def _iteration_loss(self) -> Optional[torch.Tensor]:
        return self._losses.mean() if self._pass_loss else None  # None under DDP: each rank's own loss

    def stepped(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` stepped in the last iteration (True before the first)."""
        self._deferred.refuse_in_capture("stepped() (it reads the device)")
        return bool(self._last_taken.get(optimizer, True))  # deferred: a device tensor, read here

    def set_plugin_option(self, key: str, value: Any) -> None:
        """Sets one plugin option while training (``key`` as in ``opt=``: ``"clipper.max_norm"``): the plugin is
        made again with its other options and state kept, still guarded; ValueError for a bad kind, option, value."""
        key, text = self._plugins.set_option(key, value)
        if key:
            self._config["opt"][key] = text  # a C++ side made again (unpickling) has it too

    def plugin_options(self, kind: str) -> List[tuple]:
        """The effective options of the ``kind`` plugin: (name, value, source) rows."""
        return self._plugins.settings(kind)

    @property
    def last_step(self) -> Dict[str, Any]:
        """The last unscale's record (ampkit-train's metrics record but the host's fields, plus layer_norms,
        stats_recipe, host_sync, host_sync_reason); after a deferred step, this step's; disabled: NaN at scale 1."""
        if not self._enabled:
            return fp8_facts(passthrough_record(self._passthrough_steps), self._model)
        return fp8_facts(self._deferred.record(self._per_optimizer_states), self._model)

    def locate(self, closure: Callable[[], torch.Tensor]) -> Dict[str, Any]:
        """After a skipped step: re-runs ``closure`` (its forward under its autocast, returning the loss) with every
        submodule observed, backward at the step's scale; ampkit-train's NaN report (docs/python.md)."""
        if self._model is None:
            raise ValueError("locate() needs the model: create the GradScaler with model=...")
        return nan_report(self._model, closure, self.last_step, self._config["precision"])

    def __getstate__(self) -> Dict[str, Any]:
        if self._enabled:
            self._deferred.drain()
            assert len(self._per_optimizer_states) == 0, (
                "A GradScaler instance may only be pickled at the beginning of an iteration, "
                "or at the end after scaler.update()."
            )
        state = {name: self.__dict__[name] for name in _PICKLED}
        state["_cuda"] = self._deferred.cuda  # a CUDA scaler: a graph capture may hold its steps
        state["_saved_state_dict"] = self.state_dict() if self._enabled else None
        return state  # the model is not the scaler's to pickle

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        state = pickled_state(state)  # one pickled by an ampkit whose GradScaler had mixins, too
        self.__dict__.update({name: state[name] for name in _PICKLED})
        self._model = None
        self._begin()  # a disabled scaler's C++ side is not made again
        self._deferred.cuda = state["_cuda"]
        if state["_saved_state_dict"]:
            self.load_state_dict(state["_saved_state_dict"])
