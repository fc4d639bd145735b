"""ampkit.fp8.Linear and ampkit.fp8.convert: nn.Linear swapped for a layer that multiplies in fp8,
its scales chosen by a recipe named as a plugin (docs/fp8.md)."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ._fp8_block import ROLES, Block, Recipe, make_recipe
from ._fp8_cast import Fp8Matmul, Plan, current_scale
from ._library import plugin_folders
from ._tracing import not_traced

ModuleFilter = Callable[[nn.Module, str], bool]


class Linear(nn.Linear):
    """nn.Linear whose matmuls run in fp8 (input and weight E4M3, grad_output E5M2 or E4M3 as the
    recipe says) with torch._scaled_mm. Made by ``ampkit.fp8.convert`` or ``Linear.from_float``;
    the layers converted together share one block of scaling state."""

    _fp8_block: Block
    _fp8_index: int
    _fp8_plan: Plan
    # Rows of the shared block (_fp8_block.py); the last two only for recipes with history.
    fp8_amax: torch.Tensor
    fp8_scale: torch.Tensor
    fp8_amax_history: torch.Tensor

    @classmethod
    def from_float(cls, mod: nn.Linear, recipe: Any = "delayed", opt: Optional[Mapping[str, Any]] = None) -> "Linear":
        """One layer converted on its own (a block of its own): ``mod``'s weight and bias are
        taken over as they are, so an optimizer made before still holds them."""
        layer = _swap(mod)
        _bind(make_recipe(recipe, opt), [layer])
        return layer

    # Under torch.compile the layer runs eagerly, a graph break on each side: its forward and
    # backward read and write the shared block and queue the end-of-backward update, which a
    # traced graph would run once at tracing, not every step.
    @not_traced
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._fp8_block.before_forward(self._fp8_index)
        device_type = input.device.type
        if torch.is_autocast_enabled(device_type):
            # As F.linear under autocast: the output (and the gemms' out dtype) in autocast's dtype.
            input = input.to(torch.get_autocast_dtype(device_type))
        plan = self._fp8_plan
        # A pass no backward can follow (no_grad, inference_mode, nothing requiring grad) records
        # nothing for a recipe with history: evaluation does not move the scales.
        record = plan.current or (torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad))
        out = Fp8Matmul.apply(input, self.weight, self, record)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def fp8_state(self) -> Dict[str, Dict[str, Any]]:
        """Per role (input, weight, grad_output): ``scale`` and ``amax_history``. With a recipe that
        keeps history, the scale is the one the next forward (or backward) casts with, the update
        due from the last backward applied first. Under current scaling, which derives each scale
        from the tensor being cast, they are the last cast's scale and amax."""
        block = self._fp8_block
        block.flush()
        block.check(self._fp8_index)
        plan = self._fp8_plan
        out: Dict[str, Dict[str, Any]] = {}
        for role, name in enumerate(ROLES):
            if plan.current:
                amax = self.fp8_amax[role]
                scale = float(current_scale(amax, plan.dtypes[role], plan.eps))
                out[name] = {"scale": scale, "amax_history": [float(amax)]}
            else:
                out[name] = {
                    "scale": float(self.fp8_scale[role]),
                    "amax_history": [float(v) for v in self.fp8_amax_history[role].tolist()],
                }
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8_recipe={self._fp8_block.recipe.name}"


def _swap(mod: nn.Linear) -> Linear:
    with torch.device("meta"):
        layer = Linear(mod.in_features, mod.out_features, bias=False)
    layer.weight = mod.weight
    layer.bias = mod.bias
    layer.train(mod.training)
    return layer


def _flush_before_save(module: nn.Module, prefix: str, keep_vars: bool) -> None:
    assert isinstance(module, Linear)
    block = module._fp8_block
    block.flush()
    block.check_all()


def _discard_before_load(module: nn.Module, *args: Any) -> None:
    assert isinstance(module, Linear)
    block = module._fp8_block
    block.check_all()
    block.discard()


def _bind(recipe: Recipe, layers: List[Linear], reduce_amax: bool = True, group: Any = None) -> None:
    block = Block(recipe, list(layers), reduce_amax, group)
    plan = Plan(recipe.dtypes, recipe.current, recipe.eps)
    plan.block = None if recipe.current else block  # current scaling has no update to make due
    for i, layer in enumerate(layers):
        layer._fp8_block = block
        layer._fp8_index = i
        layer._fp8_plan = plan
        # What state_dict() saves is the state after the due update, what the next step would use;
        # a loaded state replaces it whole, this step's amaxes included.
        layer.register_state_dict_pre_hook(_flush_before_save)
        layer.register_load_state_dict_pre_hook(_discard_before_load)


def convert(
    module: nn.Module,
    recipe: Any = "delayed",
    opt: Optional[Mapping[str, Any]] = None,
    module_filter_fn: Optional[ModuleFilter] = None,
    *,
    plugin_dirs: Optional[Sequence[Union[str, "os.PathLike[str]"]]] = None,
    allow_untrusted_plugins: bool = False,
    plugin_timeout: Optional[int] = 30,
    reduce_amax: bool = True,
    process_group: Any = None,
) -> nn.Module:
    """Swap every ``nn.Linear`` of ``module`` (its subclasses included; those that
    ``module_filter_fn(module, fqn)`` accepts, where given) for ``ampkit.fp8.Linear``, in place, as
    torchao's ``convert_to_float8_training``; returns ``module`` (the new layer where ``module``
    is itself an nn.Linear). ``recipe`` names the fp8 recipe plugin (``current``, ``delayed``,
    ``predictive`` or a third party's) and ``opt`` its options; ``plugin_dirs``,
    ``allow_untrusted_plugins`` and ``plugin_timeout`` (None: no limit) as ampkit.GradScaler's.
    The swapped layers share one block of scaling state, updated once per step; where
    torch.distributed is initialized with more than one rank, each backward's amaxes are reduced
    with MAX over ``process_group`` (None: the default group) in one collective, unless
    ``reduce_amax`` is False."""
    timeout = -1 if plugin_timeout is None else int(plugin_timeout)
    rec = make_recipe(recipe, opt, plugin_folders(plugin_dirs), allow_untrusted_plugins, timeout)
    layers: List[Linear] = []

    def wanted(mod: nn.Module, fqn: str) -> bool:
        return (
            isinstance(mod, nn.Linear)
            and not isinstance(mod, Linear)
            and (module_filter_fn is None or bool(module_filter_fn(mod, fqn)))
        )

    if wanted(module, ""):
        if len(list(module.children())) > 0:
            raise ValueError(f"fp8 convert: a root nn.Linear with children is not converted: {module}")
        layer = _swap(module)  # type: ignore[arg-type]
        _bind(rec, [layer], reduce_amax, process_group)
        return layer

    def visit(mod: nn.Module, fqn: str) -> None:
        for name, child in list(mod.named_children()):
            child_fqn = f"{fqn}.{name}" if fqn else name
            visit(child, child_fqn)  # children first, as torchao's post-order traversal
            if wanted(child, child_fqn):
                layer = _swap(child)  # type: ignore[arg-type]
                setattr(mod, name, layer)
                layers.append(layer)

    visit(module, "")
    if layers:
        _bind(rec, layers, reduce_amax, process_group)
    return module


def update(module: nn.Module) -> int:
    """Apply now the scale update due from the last backward, in every block of fp8 layers in
    ``module`` (the next forward would, first); returns the number of non-finite amaxes seen."""
    blocks: Dict[int, Block] = {}
    for mod in module.modules():
        if isinstance(mod, Linear):
            blocks.setdefault(id(mod._fp8_block), mod._fp8_block)
    return sum(block.flush() for block in blocks.values())
