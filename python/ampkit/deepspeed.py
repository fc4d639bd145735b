"""A DeepSpeed config's fp16 / bf16 / gradient_clipping sections as ampkit.GradScaler arguments.

The mapping keeps DeepSpeed's meaning, defaults included: ``{"fp16": {"enabled": true}}`` alone is
DeepSpeed's ``DynamicLossScaler`` with its own defaults (initial scale 2**32, window 1000,
hysteresis 1), while a section naming any dynamic-scaling key gets the config defaults of
deepspeed/runtime/constants.py (2**16, 1000, hysteresis 2, min 1) for the keys it leaves out. Every
key that matters to scaling, clipping or precision and has no counterpart here is named in one
warning; keys about batching, ZeRO, optimizers, logging... are not ours and pass silently.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Mapping, Union

__all__ = ["load_deepspeed_config", "scaler_kwargs_from_deepspeed"]

# deepspeed/runtime/constants.py: what a fp16 section that names any of these keys defaults to...
_CONFIG_DEFAULTS = {"initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
# ...and deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler's own defaults when it names none.
_SCALER_DEFAULTS = {"initial_scale_power": 32, "loss_scale_window": 1000, "hysteresis": 1, "min_loss_scale": 1}
_DYNAMIC_KEYS = (*_CONFIG_DEFAULTS, "consecutive_hysteresis")
# DeepSpeed key -> the dynamic scaler's option.
_DYNAMIC_OPTIONS = {"loss_scale_window": "growth_interval", "hysteresis": "hysteresis", "min_loss_scale": "min_scale"}
_MAPPED_FP16 = {"enabled", "loss_scale", "raise_error_at_min_scale", *_DYNAMIC_KEYS}
_MAPPED_TOP = {"fp16", "bf16", "bfloat16", "gradient_clipping"}
# Top-level sections about something other than precision, loss scaling and clipping.
_UNRELATED = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "zero_optimization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "steps_per_print",
    "wall_clock_breakdown", "memory_breakdown", "dump_state", "flops_profiler", "tensorboard", "wandb",
    "csv_monitor", "comet", "comms_logger", "activation_checkpointing", "aio", "checkpoint", "data_efficiency",
    "curriculum_learning", "autotuning", "elasticity", "pipeline", "sparse_attention", "compression_training",
    "nebula", "weight_quantization", "hybrid_engine", "timers", "sequence_parallel_size", "disable_allgather",
    "sparse_gradients", "seed", "eigenvalue", "progressive_layer_drop", "quantize_training",
})


def load_deepspeed_config(config: Union[str, os.PathLike, Mapping[str, Any]]) -> Dict[str, Any]:
    """A DeepSpeed config as a dict: ``config`` itself, or the JSON file it names."""
    if isinstance(config, Mapping):
        return dict(config)
    with open(os.fspath(config)) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{os.fspath(config)}: a DeepSpeed config is a JSON object")
    return data


def _check_no_auto(section: Mapping[str, Any], prefix: str) -> None:
    for key, value in section.items():
        if value == "auto":
            raise ValueError(f"DeepSpeed config key {prefix}{key} is \"auto\": resolve it first (as the HF Trainer "
                             "does), e.g. fp16.enabled=true")


def _enabled(section: Mapping[str, Any], name: str) -> bool:
    value = section.get("enabled", False)
    if not isinstance(value, bool):
        raise ValueError(f"DeepSpeed config key {name}.enabled must be true or false, got {value!r}")
    return value


def _fp16(fp16: Mapping[str, Any], opt: Dict[str, Any], unmapped: List[str]) -> str:
    """The scaler of an enabled fp16 section; fills ``opt`` and ``unmapped``."""
    loss_scale = fp16.get("loss_scale", 0)
    if loss_scale > 0:
        opt["scaler.scale"] = float(loss_scale)
        dynamic_only = (*_DYNAMIC_KEYS, "raise_error_at_min_scale")
        unmapped += [f"fp16.{k} (unused with a static loss_scale)" for k in dynamic_only if k in fp16]
        return "static"
    given = any(k in fp16 for k in _DYNAMIC_KEYS)
    values = dict(_CONFIG_DEFAULTS if given else _SCALER_DEFAULTS)
    values.update({k: fp16[k] for k in _CONFIG_DEFAULTS if k in fp16})
    opt["scaler.init_scale"] = 2.0 ** values["initial_scale_power"]
    for key, option in _DYNAMIC_OPTIONS.items():
        opt["scaler." + option] = values[key]
    if fp16.get("consecutive_hysteresis", False):
        unmapped.append("fp16.consecutive_hysteresis (ampkit's dynamic scaler refills its hysteresis only after "
                        "loss_scale_window clean steps, DeepSpeed's false)")
    if "raise_error_at_min_scale" in fp16:
        opt["scaler.on_min_scale"] = "error" if fp16["raise_error_at_min_scale"] else "clamp"
    return "dynamic"


def scaler_kwargs_from_deepspeed(
    config: Union[str, os.PathLike, Mapping[str, Any]], **overrides: Any
) -> Dict[str, Any]:
    """:class:`ampkit.GradScaler` keyword arguments from a DeepSpeed config (a dict or a JSON file).

    fp16.enabled: precision fp16 with the ``dynamic`` scaler (``loss_scale`` 0) from
    initial_scale_power, loss_scale_window, hysteresis and min_loss_scale, or the ``static`` one
    (``loss_scale`` > 0); bf16.enabled: precision bf16, scaler ``none``; neither: fp32, ``none``.
    gradient_clipping > 0: the ``norm`` clipper with that max_norm. ``overrides`` are GradScaler
    arguments that win; their ``opt`` entries are added to the mapped ones.

    Raises:
        ValueError: fp16 and bf16 both enabled, or a value left "auto".
    """
    ds = load_deepspeed_config(config)
    fp16 = ds.get("fp16") or {}
    bf16 = ds.get("bf16", ds.get("bfloat16")) or {}
    bf16_name = "bf16" if "bf16" in ds else "bfloat16"
    _check_no_auto(ds, "")
    _check_no_auto(fp16, "fp16.")
    _check_no_auto(bf16, bf16_name + ".")
    fp16_on, bf16_on = _enabled(fp16, "fp16"), _enabled(bf16, bf16_name)
    if fp16_on and bf16_on:
        raise ValueError("the DeepSpeed config enables both fp16 and bf16: enable one")
    opt: Dict[str, Any] = {}
    unmapped: List[str] = []
    kwargs: Dict[str, Any] = {"precision": "fp32", "scaler": "none", "clipper": "none"}
    if fp16_on:
        kwargs.update(precision="fp16", scaler=_fp16(fp16, opt, unmapped))
        unmapped += [f"fp16.{k}" for k in fp16 if k not in _MAPPED_FP16]
    elif bf16_on:
        kwargs.update(precision="bf16")
        unmapped += [f"{bf16_name}.{k}" for k in bf16 if k != "enabled"]
    clipping = ds.get("gradient_clipping", 0) or 0
    if clipping > 0:
        kwargs["clipper"] = "norm"
        opt["clipper.max_norm"] = float(clipping)
    unmapped += [k for k in ds if k not in _MAPPED_TOP and k not in _UNRELATED]
    if unmapped:
        warnings.warn("DeepSpeed config keys with no ampkit.GradScaler counterpart, ignored: " + ", ".join(unmapped),
                      stacklevel=2)
    opt.update(overrides.pop("opt", None) or {})
    return {**kwargs, "opt": opt, **overrides}
