"""A DeepSpeed config's fp16 / bf16 / gradient_clipping sections as ampkit.GradScaler arguments.

The mapping is the C++ one ampkit-train's ``--config`` uses (core/config/include/ampkit/
deepspeed_config.h), so both read a DeepSpeed config the same way: DeepSpeed's meaning and
defaults, one warning naming the keys that matter to precision, scaling or clipping and have no
counterpart; keys about ZeRO, optimizers, logging... are not ours and pass silently, and so do
the batch sizes, which a Python loop owns.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, Mapping, Optional, Union

import torch

from ._deferred import _caller_level
from ._errors import cpp
from ._files import load_json

__all__ = ["load_deepspeed_config", "scaler_kwargs_from_deepspeed"]


def load_deepspeed_config(config: Union[str, os.PathLike, Mapping[str, Any]]) -> Dict[str, Any]:
    """A DeepSpeed config as a dict: ``config`` itself, or the JSON file it names."""
    if isinstance(config, Mapping):
        return dict(config)
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"a DeepSpeed config is a dict or a JSON file's path, got {type(config).__name__}")
    name, data = load_json(config, "DeepSpeed config")
    if not isinstance(data, dict):
        raise ValueError(f"DeepSpeed config {name}: a DeepSpeed config is a JSON object, got {type(data).__name__}")
    return data


def scaler_kwargs_from_deepspeed(
    config: Union[str, os.PathLike, Mapping[str, Any]], deepspeed_version: Optional[str] = None, **overrides: Any
) -> Dict[str, Any]:
    """:class:`ampkit.GradScaler` keyword arguments from a DeepSpeed config (a dict or a JSON file).

    fp16.enabled: precision fp16 with the ``dynamic`` scaler (``loss_scale`` 0) from
    initial_scale_power, loss_scale_window, hysteresis and min_loss_scale, or the ``static`` one
    (``loss_scale`` > 0); bf16.enabled: precision bf16, scaler ``none``; neither: fp32, ``none``.
    gradient_clipping > 0: the ``norm`` clipper with that max_norm. ``overrides`` are GradScaler
    arguments that win; their ``opt`` entries are added to the mapped ones. Option values are
    ``--opt`` texts. ``deepspeed_version`` ("0.17.0", "0.17.1" or "latest") picks whose rules
    apply; left out, the config's key ``ampkit_deepspeed_version`` does, else the latest (0.17.1:
    the scale grows one clean step later at the start and after each overflow, growth_delay 1).

    Raises:
        ValueError: an unknown ``deepspeed_version``, or one the config's key contradicts; a key
            0.17.1 refuses (under its rules); fp16 and bf16 both enabled, a value left "auto"
            (batch sizes may be: they are the loop's), a value of the wrong type or out of range; a
            file that is not a regular file (a FIFO, a device: refused before any read), larger than
            16 MiB, not UTF-8, not JSON, nested too deeply, or with a key twice in one object (each naming the file).
        TypeError: ``config`` is neither a dict nor a path.
    """
    data = load_deepspeed_config(config)
    where = "(dict)" if isinstance(config, Mapping) else os.fspath(config)
    try:
        text = json.dumps(data, allow_nan=False)
    except ValueError:  # JSON has no NaN or infinity, and DeepSpeed's fields take none
        raise ValueError(f"DeepSpeed config {where} holds a NaN or infinite number") from None
    except RecursionError:  # a dict nested deeper than Python's stack
        raise ValueError(f"DeepSpeed config {where} is nested too deeply to be a configuration") from None
    except TypeError as e:  # a value JSON has no form for (a tensor, a set)
        raise ValueError(f"DeepSpeed config {where}: {e}") from None
    if deepspeed_version is not None and not isinstance(deepspeed_version, str):
        raise TypeError(f"deepspeed_version is a text such as '0.17.1', got {type(deepspeed_version).__name__}")
    mapping = cpp(torch.ops.ampkit.deepspeed_mapping)
    precision, plugins, opt, _, _, unmapped = mapping(text, where, deepspeed_version or "")
    if unmapped:
        warnings.warn(
            "DeepSpeed config keys with no ampkit counterpart, ignored: " + ", ".join(unmapped),
            stacklevel=_caller_level(),  # from_deepspeed_config's caller too
        )
    opt = dict(opt)
    opt.update(overrides.pop("opt", None) or {})
    return {"precision": precision, **dict(plugins), "opt": opt, **overrides}  # plugins: each kind the mapping names
