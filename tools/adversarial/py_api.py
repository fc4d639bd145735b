"""Python cases: junk handed to the seeds' API, GradScaler and the trainer integrations' constructors
(launcher variables, DistributedConfig fields, scaler and clipper arguments, state dicts), and the
README's skipped-step idiom with a disabled scaler and with a fused optimizer."""

from __future__ import annotations

import math
import os
import tempfile
from typing import Any, Callable, Dict, List

from common import DEFAULT_TYPES, Finding, PyCase

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29511"}
INTEGER_JUNK = [
    " 1 ",
    "1_0",
    "\u0663",
    "\uff11",
    "+1",
    "-1",
    "",
    "0x10",
    "1e3",
    "1.0",
    "nan",
    "1\n",
    "one",
    str(10**23 - 1),
    "99999999999999999999999999",
]
ADDRESS_JUNK = ["10.0.0.2\nevil", "", " ", "a b", "10.0.0.2\0", "\t"]
FIELD_JUNK: Dict[str, List[Any]] = {
    "world_size": [1.5, True, "4", None, 0, -1, 2**20 + 1, 2**70, math.nan, [4]],
    "rank": [True, 1.5, "1", None, -1, 4, 2**70],
    "local_rank": [True, 1.5, "1", -1, 4],
    "master_port": [29500.5, "29500", True, 0, 65536, -1, None, math.inf],
    "timeout_s": [math.inf, math.nan, 0, -1, True, "60", 1e10, [60]],
    "master_addr": [None, 5, "", "a\nb"],
    "backend": [None, 5, "", "mpi?"],
}
SCALER_JUNK: Dict[str, List[Any]] = {
    "init_scale": [-1, 0, math.nan, math.inf, -math.inf, "1", None, True, 1e400, 2**1100],
    "growth_factor": [1, 0.5, 0, -2, math.nan, math.inf, "2", None],
    "backoff_factor": [1, 1.5, 0, -0.5, math.nan, "0.5", None],
    "growth_interval": [0, -1, 1.5, "2000", True, None, 2**70],
}


def _env(var: str, text: str) -> Callable[[], Any]:
    def body() -> Any:
        from ampkit.seeds import DistributedConfig

        return DistributedConfig.from_env(dict(TORCHRUN, **{var: text}), backend="gloo")

    return body


def _validate(field: str, value: Any) -> Callable[[], Any]:
    def body() -> Any:
        from ampkit.seeds import DistributedConfig

        fields = {"backend": "gloo", "world_size": 4, "rank": 1, "local_rank": 1}
        fields[field] = value
        return DistributedConfig(**fields).validate()

    return body


def _scaler(maker: str, name: str, value: Any) -> Callable[[], Any]:
    def body() -> Any:
        import ampkit
        from ampkit.seeds import DynamicLossScaler

        if maker == "DynamicLossScaler":  # device "cuda": disabled on a machine without one
            return DynamicLossScaler(**{name: value})
        return ampkit.GradScaler("cpu", enabled=maker.endswith("enabled"), **{name: value})

    return body


def _seed_calls() -> List[tuple]:
    """(name, body, names): a seeds' or integration call with one bad argument."""
    import ampkit.accelerate
    import torch
    from ampkit.lightning import AmpkitFabricPrecision, AmpkitPrecision
    from ampkit.seeds import AMPTrainer, GradientClipper, NaNRecoveryManager, create_default_amp_config

    linear = torch.nn.Linear(2, 2)
    clip = GradientClipper("norm", 1.0)
    calls: List[tuple] = []
    for device in ("gpu", "cuda:x", "", 5, None, "tpu"):
        calls.append((f"AmpkitPrecision({device!r})", lambda d=device: AmpkitPrecision(d), ["device"]))
        calls.append((f"AmpkitFabricPrecision({device!r})", lambda d=device: AmpkitFabricPrecision(d), ["device"]))
        calls.append((f"GradScaler({device!r})", lambda d=device: ampkit.GradScaler(d), ["device"]))
    for opt in ("clipper.max_norm=1", ["x"], 5, {"nosuch.key": 1}, {"clipper.max_norm": "x"}):
        calls.append(
            (f"AmpkitPrecision(opt={opt!r})", lambda o=opt: AmpkitPrecision("cpu", opt=o), [("opt", "nosuch")])
        )
        calls.append((f"GradScaler(opt={opt!r})", lambda o=opt: ampkit.GradScaler("cpu", opt=o), [("opt", "nosuch")]))
    junks: List[Any] = [None, 5, "accelerator", linear]
    for junk in junks:
        calls.append(
            (f"prepare_scaler({junk!r})"[:60], lambda j=junk: ampkit.accelerate.prepare_scaler(j), ["accelerator"])
        )
    junks = [5, None, "model", [linear]]
    for junk in junks:
        calls.append((f"AMPTrainer({junk!r})"[:60], lambda j=junk: AMPTrainer(j), ["model"]))
    calls.append(("AMPTrainer(loss_fn='mse')", lambda: AMPTrainer(linear, loss_fn="mse"), ["loss_fn"]))
    calls.append(("AMPTrainer(amp_config=5)", lambda: AMPTrainer(linear, 5), ["amp_config"]))
    junks = [None, [3], "x", 5, [None], {"w": 1}]
    for junk in junks:
        calls.append((f"GradientClipper.clip({junk!r})", lambda j=junk: clip.clip(j), ["parameters"]))
    for strategy, threshold in (("nosuch", 1.0), ("norm", -1.0), ("norm", math.nan), ("norm", "1"), (5, 1.0)):
        calls.append(
            (
                f"GradientClipper({strategy!r}, {threshold!r})",
                lambda s=strategy, t=threshold: GradientClipper(s, t).clip(linear),
                [(str(strategy), "max_norm", "threshold")],
            )
        )
    strategies: List[Any] = ["rollback", "nosuch", "", None]
    for strategy in strategies:
        calls.append(
            (
                f"NaNRecoveryManager({strategy!r})",
                lambda s=strategy: NaNRecoveryManager(s),
                [("strategy", str(strategy))],
            )
        )
    for precision in ("fp8", "float16", "", None):
        calls.append(
            (
                f"create_default_amp_config({precision!r})",
                lambda p=precision: AMPTrainer(linear, create_default_amp_config(p)),
                ["precision"],
            )
        )
    states: List[Any] = ["notadict", 5, None, [], {}, {"scale": 1024.0}]
    for state in states:
        calls.append(
            (
                f"GradScaler.load_state_dict({state!r})",  # KeyError, RuntimeError: as torch's
                lambda s=state: ampkit.GradScaler("cpu").load_state_dict(s),
                [("state_dict", "state dict", "scale", "growth")],
                DEFAULT_TYPES + ("KeyError", "RuntimeError"),
            )
        )
        calls.append(
            (
                f"AMPTrainer.load_state_dict({state!r})",
                lambda s=state: AMPTrainer(linear, create_default_amp_config("bf16")).load_state_dict(s),
                [("state", "model")],
            )
        )
    for key, value in (
        ("scale", -1.0),
        ("scale", math.nan),
        ("scale", "x"),
        ("scale", math.inf),
        ("scale", 0.0),
        ("_growth_tracker", "x"),
        ("_growth_tracker", -1),
        ("growth_factor", 0.5),
        ("growth_interval", 0),
        ("backoff_factor", 2.0),
    ):
        calls.append(
            (
                f"GradScaler.load_state_dict(a state with {key}={value!r})",
                lambda k=key, v=value: _load_corrupt(k, v),
                [key.lstrip("_")],
            )
        )
    return calls


def _load_corrupt(key: str, value: Any) -> None:
    """Loads a real scaler state with one entry replaced; the scale must not become unusable."""
    import ampkit

    state = ampkit.GradScaler("cpu").state_dict()
    state[key] = value
    scaler = ampkit.GradScaler("cpu")
    scaler.load_state_dict(state)
    scale = scaler.get_scale()
    if not (math.isfinite(scale) and scale > 0):
        raise Finding("silent", f"loaded; the scale is now {scale}")


def _garbage_scaler_pt(content: bytes) -> Callable[[], Any]:
    def body() -> Any:
        import ampkit

        folder = tempfile.mkdtemp(prefix="ampkit-adversarial-pt-")
        path = os.path.join(folder, "scaler.pt")
        with open(path, "wb") as f:
            f.write(content)
        return ampkit.GradScaler("cpu").load_state_dict(path)  # a path is not a state dict either

    return body


def _idiom(enabled: bool, fused: bool, bad_step: bool) -> Callable[[], Any]:
    """The README's `if not scaler.step(opt): print(scaler.last_step["reason"])`: a taken step is
    truthy; a skipped one names its reason, read right after step()."""

    def body() -> Any:
        import ampkit
        import torch

        model = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
        scaler = ampkit.GradScaler("cpu", enabled=enabled)
        for step in range(3):
            opt.zero_grad()
            x = torch.full((3, 4), math.inf) if bad_step and step == 1 else torch.ones(3, 4)
            scaler.scale(model(x).sum()).backward()
            taken = scaler.step(opt)
            if not taken:
                reason = scaler.last_step["reason"]
                if not (bad_step and enabled and step == 1) or not reason:
                    raise Finding("silent", f"step {step}: not taken, reason {reason!r}")
            elif bad_step and enabled and step == 1:
                raise Finding("silent", "an inf step reported as taken")
            scaler.update()

    return body


def cases() -> List[PyCase]:
    out: List[PyCase] = []
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        for text in INTEGER_JUNK:
            out.append(
                PyCase(
                    "seeds: launcher variables", f"{var}={text!r}", _env(var, text), names=[(var, var.lower() + "=")]
                )
            )
    for text in ADDRESS_JUNK:
        out.append(
            PyCase(
                "seeds: launcher variables",
                f"MASTER_ADDR={text!r}",
                _env("MASTER_ADDR", text),
                names=[("MASTER_ADDR", "master_addr")],
            )
        )
    out.append(PyCase("seeds: launcher variables", "valid torchrun", _env("RANK", "1"), "ok"))
    for field, values in FIELD_JUNK.items():
        for value in values:
            out.append(
                PyCase(
                    "seeds: DistributedConfig.validate", f"{field}={value!r}", _validate(field, value), names=[field]
                )
            )
    for maker in ("DynamicLossScaler", "GradScaler enabled", "GradScaler disabled"):
        for name, values in SCALER_JUNK.items():
            for value in values:
                out.append(
                    PyCase(
                        "seeds: scaler arguments",
                        f"{maker}({name}={value!r})"[:70],
                        _scaler(maker, name, value),
                        names=[name],
                    )
                )
    for label, body, names, *types in _seed_calls():
        out.append(PyCase("seeds: other arguments", label, body, names=names, types=types[0] if types else ()))
    for label, content in (("text", b"not a checkpoint\n" * 4), ("empty", b""), ("zip header", b"PK\x03\x04" * 8)):
        out.append(
            PyCase(
                "seeds: other arguments",
                f"load_state_dict(path to a {label} scaler.pt)",
                _garbage_scaler_pt(content),
                names=["state_dict"],
            )
        )
    for enabled in (True, False):
        for fused in (True, False):
            for bad in (False, True):
                out.append(
                    PyCase(
                        "README skipped-step idiom",
                        f"enabled={enabled} fused={fused} inf step={bad}",
                        _idiom(enabled, fused, bad),
                        "ok",
                    )
                )
    return out
