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
import weakref
from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch.amp.grad_scaler import OptState

from . import _library
from ._arguments import check_arguments
from ._deferred import DeferredMode
from ._errors import cpp
from ._facts import STEP_KINDS, passthrough_record
from ._optimizer_tables import OptimizerTables, _refresh_per_optimizer_state
from ._plugin_access import PluginAccess, option_text
from ._statistics_group import StatisticsGroup
from ._torch_state import TorchPrivateState
from ._tracing import not_traced
from .deepspeed import scaler_kwargs_from_deepspeed
from .locator import nan_report

__all__ = ["GradScaler", "OptState"]

# torch.amp.GradScaler's constructor defaults, read from its signature: an argument left at its
# default leaves the plugin's own default (or AMPKIT_SCALER_<OPTION>) in force.
_TORCH_DEFAULTS = {name: p.default for name, p in inspect.signature(torch.amp.GradScaler.__init__).parameters.items()}


def _scaler_options(torch_args: Mapping[str, Any]) -> Dict[str, str]:
    """The scaler plugin's options that torch's arguments set: those given other than their default."""
    return {"scaler." + k: option_text(v, k) for k, v in torch_args.items() if v != _TORCH_DEFAULTS[k]}


class GradScaler(TorchPrivateState, PluginAccess, OptimizerTables, torch.amp.GradScaler):
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
        nan_policy: what a step with a non-finite gradient or loss (or a spike) does (``skip``: torch's,
            but a non-finite loss skips too; ``backoff``, ``abort``; ``rollback`` is refused here).
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
        sync: ``"auto"`` (default): with one fused optimizer (``fused=True``) whose scaler, clipper
            and NaN policy all have a device form, from the second iteration on the step makes no
            host read: statistics, decisions and the scale's update stay on the device, :meth:`step`
            returns a bool tensor; the host state read between step() and update() is the one before
            the update, as torch's. ``"deferred"``: the same from the first step (where it cannot
            run, one warning says why); ``"step"``: one host read per step, as torch's.
        process_group: the ``torch.distributed`` group the gradient statistics are reduced over, before
            the one host read, so every rank decides on the same numbers. None (default): FSDP2's
            DTensor gradients (``fully_shard``) are reduced over their device mesh's group (squares,
            zeros and elements summed, max-abs the largest; one all_gather per optimizer and step),
            plain gradients (DDP, one process) are not reduced unless ``average_loss``, then over the
            default group. A group given must hold the mesh's ranks; plain gradients are then
            reduced over it too (the largest of each figure: equal on every rank under DDP).
        average_loss: True: the loss given to :meth:`scale` is averaged over the ranks in the same
            collective, and the NaN policy reads it (a NaN in one rank's loss alone makes every rank
            skip). False (default): with more than one rank the policy reads the gradients only.
        plugin_timeout: seconds a plugin may take to load (in a child process), to construct, and in
            any later call (ampkit-train's ``--plugin-timeout``, same default); past it, one line
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
        torch_args = {
            "init_scale": init_scale,
            "growth_factor": growth_factor,
            "backoff_factor": backoff_factor,
            "growth_interval": growth_interval,
        }
        self._config: Dict[str, Any] = {
            # Each kind's plugin is the keyword argument of the kind's name (scaler=, clipper=, ...).
            "plugins": {kind: str(arguments[kind]) for kind in STEP_KINDS},
            # opt= wins over torch's arguments.
            "opt": {
                **_scaler_options(torch_args),
                **{str(k): option_text(v, f"opt[{k!r}]") for k, v in (opt or {}).items()},
            },
            "precision": "fp16" if precision is None else precision,  # "" is refused, not fp16
            "plugin_dirs": _library.plugin_folders(plugin_dirs),
            "allow_untrusted": bool(allow_untrusted_plugins),
            "stats_recipe": str(stats_recipe),
            "plugin_timeout": -1 if plugin_timeout is None else plugin_timeout,
        }
        self._torch_args = torch_args
        self._model = model
        self._names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        self._core: Any = None
        self._scale: Optional[torch.Tensor] = None  # torch's: None until the first scale()
        self._scale_per_device: Dict[torch.device, torch.Tensor] = {}
        self._per_optimizer_states: Dict[int, Dict[str, Any]] = defaultdict(_refresh_per_optimizer_state)
        self._last_taken: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # bool or device tensor
        self._loss_sum: Optional[torch.Tensor] = None  # this iteration's losses given to scale()
        self._loss_count = 0
        self._pass_loss = True
        # optimizer (a weak key) -> (slot, its parameters' ids when bound, DTensor parameters): its
        # parameters are handed to the C++ side once, and again only when they change.
        self._bound: "weakref.WeakKeyDictionary[torch.optim.Optimizer, Any]" = weakref.WeakKeyDictionary()
        self._next_slot = 0
        self._fused_args: Dict[torch.device, Any] = {}  # grad_scale, found_inf for fused optimizers
        self._fallback_said = False
        self._deferred = DeferredMode(str(sync), cuda=self._device.startswith("cuda"))
        self._group = StatisticsGroup(process_group, average_loss)
        self._initial = (float(init_scale), 0)  # torch's _init_scale, _init_growth_tracker
        self._passthrough_steps = 0  # a disabled scaler's steps (its last_step's step)
        core = self._make_core()  # a disabled scaler's too: its arguments are refused on any machine
        if self._enabled:
            self._core = core
            self._deferred.reset(core)
            self._initial = (self._core_scale(), 0)

    def _make_core(self) -> Any:
        c = self._config
        dirs = c["plugin_dirs"] + [_library.builtin_plugin_dir()]
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank = torch.distributed.get_rank() if distributed else 0
        world = torch.distributed.get_world_size() if distributed else 1
        # Under DDP every rank sees the same averaged gradients but its own loss: a decision that
        # read the loss could differ between ranks, so the policy sees the gradients only, unless
        # the loss is averaged over the ranks (average_loss).
        self._pass_loss = self._group.passes_loss(world)
        self._core_world, self._core_generation = world, getattr(self, "_core_generation", 0) + 1
        self._bound = weakref.WeakKeyDictionary()
        make = cpp(
            lambda: torch.classes.ampkit.ScalerCore(
                c["plugins"],
                c["opt"],
                c["precision"],
                dirs,
                c["allow_untrusted"],
                self._device.startswith("cuda"),
                rank,
                world,
                c["stats_recipe"],
                c["plugin_timeout"],
            )
        )
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

    def scale(self, outputs: Any) -> Any:
        """Multiplies a tensor, or the tensors of a nested list/tuple, by the loss scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            if outputs.numel() == 1 and outputs.requires_grad:  # a loss (not a logged value): the NaN policy reads it
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
            graph = self._deferred.check_capture(optimizer, slot)
            if self._deferred.applies(optimizer, slot):  # no host read: docs/python.md
                self._give_local_gradients(optimizer, slot)
                state["deferred"] = self._deferred.unscale(slot, self._iteration_loss(), graph)
                state["step"] = True if state["deferred"] is not None else None
            else:
                self._unscale(optimizer, state, fold=bool(getattr(optimizer, "_step_supports_amp_scaling", False)))
            state["stage"] = OptState.UNSCALED  # a step() retried after optimizer.step raised does not unscale again
        if state["deferred"] is not None:
            stepped_on_device = self._deferred.step(optimizer, state["deferred"], args, kwargs)
            state["stage"] = OptState.STEPPED
            self._last_taken[optimizer] = stepped_on_device
            return stepped_on_device
        fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        if state["step"] is None and not fused:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        stepped = state["step"] is None or bool(state["step"])  # torch steps a fused one with no gradients
        if stepped and fused and state["folded"]:
            self._step_folded(optimizer, state["factor"], args, kwargs)
        elif stepped:
            optimizer.step(*args, **kwargs)
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
                self._set_scale_to(value)
            elif not self._deferred.finish_iteration(graph):
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

    def is_enabled(self) -> bool:
        return self._enabled

    # --- what ampkit adds -----------------------------------------------------------------------

    @property
    def last_step(self) -> Dict[str, Any]:
        """The last unscale's record, the keys of ampkit-train's metrics record (docs/configuration.md)
        but the host's (epoch, lr, samples_per_second, time): step, loss, scale, scale_next,
        grad_norm (unscaled), grad_norm_clipped, grad_max_abs, zero_fraction, clip_coef,
        clip_threshold, clipped, found_inf, action, reason ("" where the policy gave none), stepped,
        skipped_steps, top_layers ([{name, grad_norm}], largest first); plus layer_norms
        ({name: grad_norm} for every parameter; names need ``model=``), stats_recipe (the
        statistics recipe that ran), host_sync (``"step"`` or ``"deferred"``: how it ran) and
        host_sync_reason (why); after a deferred step, this step's. Disabled: NaN figures at scale 1."""
        if not self._enabled:
            return passthrough_record(self._passthrough_steps)
        if self._deferred.in_iteration:
            self._deferred.settling(self._core.settle_iteration)
        self._deferred.drain()
        record = dict(cpp(self._core.record)())
        record["host_sync"], record["host_sync_reason"] = self._deferred.last, self._deferred.last_reason
        return record

    def locate(self, closure: Callable[[], torch.Tensor]) -> Dict[str, Any]:
        """After a skipped step: re-runs it (``closure``: its forward under its autocast, returning
        the loss) with every submodule of ``model`` observed, backward at the step's scale; returns
        ampkit-train's NaN report (step, rank, detection, action, loss_scale, precision, located,
        module, module_type, phase, finding, observation, forward, backward; ampkit.NanLocator)."""
        if self._model is None:
            raise ValueError("locate() needs the model: create the GradScaler with model=...")
        return nan_report(self._model, closure, self.last_step, self._config["precision"])
