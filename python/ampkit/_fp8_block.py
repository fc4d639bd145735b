"""The scaling state of a converted model: the recipe chosen by name, and one block of stacked
tensors that every fp8 layer's buffers are rows of, so that all layers' scales are updated by one
call per step (docs/fp8.md, "How the state is kept")."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ._errors import PluginError, cpp
from ._fp8_cast import EPS

ROLES = ("input", "weight", "grad_output")
_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


class Recipe:
    """A recipe object (the plugin's binding, or one with its methods) and what the layers read
    from it once, at conversion."""

    def __init__(self, handle: Any, name: str, made_by: Optional[Tuple[Any, ...]] = None) -> None:
        self.handle = handle
        self.name = name
        self.made_by = made_by  # make_recipe's arguments, for a recipe plugin made by name
        self.current = bool(handle.current_scaling())
        self.eps = float(handle.current_eps()) if self.current else EPS
        self.history_length = 0 if self.current else int(handle.history_length())
        formats = [str(handle.fp8_format(role)) for role in range(3)]
        for role, fmt in zip(ROLES, formats):
            if fmt not in _DTYPES:
                raise PluginError(f"fp8 recipe {name!r}: format of {role} is {fmt!r}, not e4m3 or e5m2")
        self.dtypes: Tuple[torch.dtype, torch.dtype, torch.dtype] = (
            _DTYPES[formats[0]],
            _DTYPES[formats[1]],
            _DTYPES[formats[2]],
        )

    def __deepcopy__(self, memo: Dict[int, Any]) -> "Recipe":
        # A copied model shares the recipe: its state is the layers' buffers, and its calls are
        # serialised by the binding.
        return self

    def __reduce__(self) -> Any:
        # A pickled model (torch.save(model)) makes its recipe plugin again by name.
        if self.made_by is None:
            return (Recipe, (self.handle, self.name))
        return (make_recipe, self.made_by)


def make_recipe(
    recipe: Any,
    opt: Optional[Mapping[str, Any]],
    plugin_dirs: Sequence[str] = (),
    allow_untrusted: bool = False,
    plugin_timeout: int = 30,
) -> Recipe:
    """The recipe plugin named ``recipe`` with options ``opt`` (found, trusted and guarded as
    ampkit.GradScaler's plugins are), or ``recipe`` itself when it is an object with the binding's
    methods (a recipe made beforehand, or a stand-in in tests)."""
    if not isinstance(recipe, str):
        if opt:
            raise ValueError("fp8 recipe: options go to a recipe given by name, not to a recipe object")
        return Recipe(recipe, type(recipe).__name__)
    from ._plugin_access import option_text

    options: Dict[str, str] = {str(k): option_text(v, str(k)) for k, v in (opt or {}).items()}
    make = torch.classes.ampkit.Fp8Recipe
    made_by = (recipe, options, list(plugin_dirs), allow_untrusted, plugin_timeout)
    return Recipe(cpp(lambda: make(*made_by))(), recipe, made_by)


class Block:
    """One converted model's fp8 state, stacked: amax [3L] (this step's, not saved), and for
    recipes with history scale [3L] and history [3L, W]. Layer i's buffers fp8_amax, fp8_scale
    and fp8_amax_history are rows 3i..3i+2 of them. Where .to(), load_state_dict(assign=True) or
    a copy replaced a layer's buffers, they are gathered again before the next use."""

    def __init__(self, recipe: Recipe, layers: List[Any], reduce_amax: bool = True, group: Any = None) -> None:
        self.recipe = recipe
        self.layers = layers
        self.reduce_amax = reduce_amax
        self.group = group  # None: the default process group
        self.pending = False
        self.last_bad = 0  # non-finite amaxes of the last update
        self._queued = False
        n = 3 * len(layers)
        device = layers[0].weight.device if layers else torch.device("cpu")
        self.roles = torch.arange(3, dtype=torch.int64).repeat(len(layers))
        self.amax = torch.zeros(n, dtype=torch.float32, device=device)
        self.scale = torch.ones(n, dtype=torch.float32, device=device)
        self.history = torch.zeros(n, recipe.history_length, dtype=torch.float32, device=device)
        self._host: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self._ptrs: List[Tuple[int, ...]] = []
        self._attach()

    def _attach(self) -> None:
        keep = not self.recipe.current
        self._ptrs = []
        for i, layer in enumerate(self.layers):
            rows = slice(3 * i, 3 * i + 3)
            layer.register_buffer("fp8_amax", self.amax[rows], persistent=False)
            if keep:
                layer.register_buffer("fp8_scale", self.scale[rows], persistent=True)
                layer.register_buffer("fp8_amax_history", self.history[rows], persistent=True)
            self._ptrs.append(self._layer_ptrs(layer))
        self._host = None

    def _layer_ptrs(self, layer: Any) -> Tuple[int, ...]:
        if self.recipe.current:
            return (layer.fp8_amax.data_ptr(),)
        return (layer.fp8_amax.data_ptr(), layer.fp8_scale.data_ptr(), layer.fp8_amax_history.data_ptr())

    def _regather(self) -> None:
        """Stack the layers' buffers again (on the first layer's device) and make them rows."""
        device = self.layers[0].fp8_amax.device
        with torch.no_grad():
            self.amax = torch.cat([lay.fp8_amax.to(device, torch.float32) for lay in self.layers])
            if not self.recipe.current:
                self.scale = torch.cat([lay.fp8_scale.to(device, torch.float32) for lay in self.layers])
                self.history = torch.cat([lay.fp8_amax_history.to(device, torch.float32) for lay in self.layers])
        self._attach()

    def check(self, index: int) -> None:
        """Before layer ``index`` uses its rows: gathered again if its buffers are no longer them."""
        if self._layer_ptrs(self.layers[index]) != self._ptrs[index]:
            self._regather()

    def check_all(self) -> None:
        for i in range(len(self.layers)):
            self.check(i)

    def make_due(self) -> None:
        """Called by a layer's backward: the update becomes due when the whole backward pass has
        finished, so that a forward run inside it (activation checkpointing recomputes) does not
        apply it halfway, between the layers' grad_output casts."""
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def before_forward(self, index: int) -> None:
        """Layer ``index`` is about to cast: its rows current, and a due update applied (by the
        first fp8 layer of a step)."""
        self.check(index)
        if self._queued and torch._C._current_graph_task_id() == -1:
            # A backward that raised never ran its callback; no collective here, as the other
            # ranks may not have raised.
            self._backward_done(reduce=False)
        if self.pending:
            self.flush()

    def _backward_done(self, reduce: bool = True) -> None:
        self._queued = False
        self.pending = True
        if reduce:
            self._reduce_across_ranks()

    def _reduce_across_ranks(self) -> None:
        """This backward's amaxes of all layers, MAX over the ranks in one collective, so that every
        rank updates to the same scales. Here, at the end of every rank's backward, and never in
        flush(): a state_dict() on one rank only would wait for the others forever."""
        dist = torch.distributed
        if not (self.reduce_amax and dist.is_available() and dist.is_initialized()):
            return
        if dist.get_world_size(self.group) < 2:
            return
        self.check_all()
        with torch.no_grad():
            dist.all_reduce(self.amax, op=dist.ReduceOp.MAX, group=self.group)

    def flush(self) -> int:
        """The due update of all layers' scales and histories, one recipe call: returns the number
        of non-finite amaxes it saw (0 when none was due)."""
        if not self.pending:
            return 0
        self.pending = False
        self.check_all()
        with torch.no_grad():
            bad = self._update()
            self.amax.zero_()
        self.last_bad = bad
        return bad

    def nonfinite(self) -> int:
        """The last backward's non-finite amaxes: counted now if its update is still due (under
        current scaling, the last casts')."""
        if not (self.pending or self.recipe.current):
            return self.last_bad
        self.check_all()
        return bad_amaxes(self.amax)

    def _update(self) -> int:
        # The recipe runs on the host: on a GPU the amaxes of all layers come over in one copy;
        # history and scale are kept there between steps and their device rows overwritten after.
        amax = self.amax.cpu()
        bad = bad_amaxes(amax)
        if bad:
            # A step with a non-finite amax is a bad step (its fp8 weight gradients are made
            # non-finite, so that a GradScaler skips it): it moves no layer's window or scale.
            return bad
        if self.amax.device.type == "cpu":
            return int(cpp(self.recipe.handle.update)(self.roles, self.amax, self.history, self.scale))
        if self._host is None:
            self._host = (self.history.cpu(), self.scale.cpu())
        history, scale = self._host
        bad = int(cpp(self.recipe.handle.update)(self.roles, amax, history, scale))
        self.history.copy_(history, non_blocking=True)
        self.scale.copy_(scale, non_blocking=True)
        return bad

    def discard(self) -> None:
        """A state is being loaded: this step's amaxes are not applied to it."""
        self.pending = False
        self._host = None
        with torch.no_grad():
            self.amax.zero_()


def bad_amaxes(amax: torch.Tensor) -> int:
    """How many of ``amax`` are not finite, or negative (no maximum of absolute values is)."""
    return int((~torch.isfinite(amax) | (amax < 0)).sum())


def nonfinite_amaxes(module: torch.nn.Module) -> int:
    """The non-finite amaxes of the last backward of the fp8 layers of ``module`` (GradScaler's
    model), for GradScaler.last_step."""
    found = {id(b): b for b in (getattr(m, "_fp8_block", None) for m in module.modules()) if isinstance(b, Block)}
    return sum(block.nonfinite() for block in found.values())
