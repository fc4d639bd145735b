"""Python cases: a plugin's wrong answer (tests/plugins/broken/wrong_scale.cpp, wrong_action.cpp) on
ampkit.GradScaler's synchronous and deferred step, and every broken plugin of the build loaded by
GradScaler (each in a process of its own: a crash there may end the interpreter with exit 3)."""

from __future__ import annotations

import glob
import math
import os
from typing import Any, List, Tuple

from common import BROKEN, WRONG_ACTION, WRONG_SCALE, Finding, PyCase

STEPS = 6
SYNCS = ("step", "deferred")
SCALES = ("0", "nan", "inf", "-8", "1e30", "512")
ACTIONS = (0, 1, 2, 3, 4, 5, 6, 7, 9, 77, 255, 1000)
FROM_STEPS = (0, 1, 2, 4)


def _train(**kwargs: Any) -> None:
    """STEPS iterations of a tiny model; raises what GradScaler raises, or a Finding where the model
    or the scale is left unusable (NaN parameters, a scale not finite and > 0) in silence."""
    import ampkit
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    scaler = ampkit.GradScaler("cpu", plugin_timeout=5, **kwargs)
    try:
        for _ in range(STEPS):
            opt.zero_grad()
            scaler.scale(model(torch.ones(3, 4)).sum()).backward()
            scaler.step(opt)
            scaler.update()
        scale = scaler.get_scale()
    except BaseException:
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            raise Finding("silent", "an error, but the parameters were trained to NaN/inf first") from None
        raise
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise Finding("silent", "no error; the parameters are NaN/inf")
    if scaler.is_enabled() and not (math.isfinite(scale) and scale > 0):
        raise Finding("silent", f"no error; the scale is {scale}")


def _scale_case(sync: str, answer: str, from_step: int, rule: str) -> PyCase:
    opt = {"scaler.answer": answer, "scaler.from_step": from_step, "scaler.rule": rule}
    expect, names = "error", ["wrong_scale", "scale()"]
    if answer == "1e30" and rule == "constant":
        # Finite and > 0, no bounds declared: a scale a host may use (the deferred step's float32
        # rule may part from it, which is the plugin's fault, named).
        expect, names = "either", ["wrong_scale"]
    if answer == "512":  # usable; the deferred step finds it apart from the rule once it changes
        expect, names = ("ok", []) if sync == "step" or from_step == 0 else ("error", ["wrong_scale", "disagree"])
    return PyCase(
        "plugin answers (Python)",
        f"scale={answer} rule={rule} from={from_step} sync={sync}",
        lambda: _train(scaler=WRONG_SCALE, sync=sync, opt=opt),
        expect,
        names,
        types=("PluginError",) if expect == "error" else (),
    )


def _action_case(sync: str, action: int, from_step: int) -> PyCase:
    opt = {"nan_policy.action": action, "nan_policy.from_step": from_step}
    types: Tuple[str, ...] = ("PluginError",)
    expect, names = "error", ["wrong_action", f"action {action}"]
    if action == 0:
        expect, names, types = "ok", [], ()
    elif action in (1, 2, 5):  # skip, skip_backoff, clip: answers a host can carry out
        expect, names, types = "either", ["wrong_action"], ("PluginError",)
    elif action == 3:
        names = ["wrong_action", "rollback"]
    elif action == 4:
        names, types = ["wrong_action", "the test policy's answer"], ("TrainingAborted",)
    return PyCase(
        "plugin answers (Python)",
        f"action={action} from={from_step} sync={sync}",
        lambda: _train(nan_policy=WRONG_ACTION, sync=sync, opt=opt),
        expect,
        names,
        types,
    )


def broken_plugins() -> List[str]:
    """Every broken plugin of the build but the wrong-answer ones (their own cases above)."""
    found = glob.glob(os.path.join(BROKEN, "**", "libampkit-*.so"), recursive=True)
    return sorted(p for p in found if os.sep + "answers" + os.sep not in p)


def _fault_run(kind: str, path: str) -> None:
    """Trains, saves and loads the scaler's state, and trains on for a second: a broken plugin's
    fault in its constructor, update(), save(), load() or a thread of its own (after 0.3 s) is met."""
    import time

    import ampkit
    import torch

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampkit.GradScaler("cpu", plugin_timeout=3, **{kind: path})
    scaler.load_state_dict(scaler.state_dict())
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        opt.zero_grad()
        scaler.scale(model(torch.ones(3, 4)).sum()).backward()
        scaler.step(opt)
        scaler.update()


def _fault_case(path: str) -> PyCase:
    base = os.path.basename(path)
    plugin = base[len("libampkit-") : -len(".so")].split("-", 1)[1]
    kind = "nan_policy" if "-nan_policy-" in base else "clipper" if plugin == "wrong_kind" else "scaler"
    expect = "ok" if plugin in ("stripped", "duplicate") else "error"  # good plugins, found by their path
    label = os.path.relpath(path, BROKEN)
    return PyCase(
        "broken plugins (Python)", label, lambda: _fault_run(kind, path), expect, [base], timeout=30, isolated=True
    )


def cases() -> List[PyCase]:
    out: List[PyCase] = []
    for sync in SYNCS:
        for from_step in FROM_STEPS:
            for answer in SCALES:
                out.append(_scale_case(sync, answer, from_step, "constant"))
            for answer in ("0", "nan", "1e30"):
                out.append(_scale_case(sync, answer, from_step, "dynamic"))
        for from_step in (0, 2, 4):
            out.extend(_action_case(sync, action, from_step) for action in ACTIONS)
    out.extend(_fault_case(p) for p in broken_plugins())
    return out
