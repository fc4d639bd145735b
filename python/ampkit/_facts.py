"""What the C++ side declares once and the Python layer reads at import, never spells again: the
plugin kinds a GradScaler selects, the precisions, the error categories (by name), the autocast
dtype of a precision, the plugins' per-precision option defaults, a clipper's threshold option and
the plugins the seeds' NaN strategies name (python/src/facts.cpp)."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _library  # noqa: F401  (loads the C++ side first)

__all__ = [
    "ERROR_CATEGORIES",
    "PRECISIONS",
    "SEEDS_NAN_STRATEGIES",
    "STEP_KINDS",
    "autocast_dtype",
    "option_defaults",
    "passthrough_record",
    "threshold_option",
]

#: The kinds of :class:`ampkit.GradScaler`'s plugins, in ampkit's order (``comm`` is torch DDP's).
STEP_KINDS: Tuple[str, ...] = tuple(torch.ops.ampkit.step_kinds())
#: Every precision, in the order messages list them.
PRECISIONS: Tuple[str, ...] = tuple(torch.ops.ampkit.precisions())
#: ampkit::ErrorCategory's names and values, and "aborted": what a failed C++ call reports.
ERROR_CATEGORIES: Dict[str, int] = {str(name): int(value) for name, value in torch.ops.ampkit.error_categories()}
#: The seeds' NaN strategies: strategy -> (its nan_policy plugin, the options it sets).
SEEDS_NAN_STRATEGIES: Dict[str, Tuple[str, Dict[str, Any]]] = {
    str(strategy): (str(policy), dict(options)) for strategy, policy, options in torch.ops.ampkit.seeds_nan_strategies()
}


def autocast_dtype(precision: str) -> Optional[torch.dtype]:
    """The dtype autocast runs ``precision`` in (None for fp32); ValueError for an unknown one."""
    probe = torch.ops.ampkit.autocast_dtype(precision)
    return None if probe is None else probe.dtype


def option_defaults(dirs: List[str], allow_untrusted: bool, kind: str, name: str, option: str) -> List[Tuple[str, str]]:
    """A plugin option's declared default for each precision, ``(precision, value text)`` pairs."""
    return [(str(p), str(v)) for p, v in torch.ops.ampkit.option_defaults(dirs, allow_untrusted, kind, name, option)]


def threshold_option(dirs: List[str], allow_untrusted: bool, clipper: str) -> str:
    """The option a clipper's one threshold sets: its one option with a per-precision default."""
    return str(torch.ops.ampkit.threshold_option(dirs, allow_untrusted, clipper))


def passthrough_record(steps: int) -> Dict[str, Any]:
    """A disabled GradScaler's ``last_step`` after ``steps`` steps: the engine's record keys, at
    scale 1, with the figures nothing measured NaN (python/src/passthrough_record.cpp)."""
    record = dict(torch.ops.ampkit.passthrough_record(steps))
    record["host_sync"] = "step"
    record["host_sync_reason"] = (
        "the scaler is disabled (enabled=False, or 'cuda' without a GPU): step() is optimizer.step()"
    )
    return record


def fp8_facts(record: Dict[str, Any], model: Any) -> Dict[str, Any]:
    """``record`` with ``fp8_nonfinite_amaxes``: the last backward's non-finite amaxes in the fp8
    layers of ``model`` (the scaler's), where ampkit.fp8 is in use and a model was given; a skip
    they caused says so in its reason."""
    block = sys.modules.get("ampkit._fp8_block")
    if block is None or model is None or "action" not in record:
        return record
    bad = int(block.nonfinite_amaxes(model))
    record["fp8_nonfinite_amaxes"] = bad
    if bad and record["action"] != "proceed":
        record["reason"] = f"{record['reason']} ({bad} non-finite fp8 amaxes)".lstrip()
    return record
