"""ampkit-train cases: a plugin's wrong answer under --host-sync step and deferred, every broken plugin
of the build, the files files.py writes given to --config (YAML and DeepSpeed JSON), bad flags and
bad AMPKIT_* / launcher environment variables, TorchScript workloads that cannot train. No torch here:
the TorchScript files are made by one python3 process in make_torchscript()."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from common import BUILD, TRAIN, WRONG_ACTION, WRONG_SCALE, CmdCase, Finding
from files import DEEPSPEED_BAD, FP16, Reader, files_for

RUN = [
    "--workload",
    "synthetic",
    "--threads",
    "1",
    "--progress",
    "never",
    "--synthetic-width",
    "16",
    "--synthetic-depth",
    "1",
    "--batch-size",
    "8",
]


def _summary_check(folder: str, stderr: str) -> Optional[Finding]:
    """After exit 0: a completed run that took steps and ends with a NaN loss, or that took none
    without a line per skipped step, did so in silence."""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None  # no summary asked for, or none written (--print-config)
    loss = summary.get("final_loss")
    try:
        finite = math.isfinite(float(loss))
    except (TypeError, ValueError):
        finite = False
    taken, steps = summary.get("steps_taken", 0), summary.get("steps", 0)
    if summary.get("status") == "completed" and not finite and taken > 0:
        return Finding("silent", f"status completed with final_loss {loss} after {taken} steps taken")
    said = stderr.count("ampkit-train: step ")  # a line per skip, for the first --nan-locate ones
    if steps >= 4 and taken < steps and said == 0:
        return Finding("silent", f"{steps - taken} of {steps} steps not taken, and no line says so")
    return None


def _train(
    klass: str,
    name: str,
    args: Sequence[str],
    codes: Sequence[int],
    names: Sequence[object] = (),
    env: Optional[Dict[str, str]] = None,
    timeout: float = 30.0,
    steps: int = 8,
) -> CmdCase:
    argv = [TRAIN, *RUN, "--steps", str(steps), "--summary", "summary.json", *args]
    return CmdCase(klass, name, argv, codes, names, env or {}, timeout, _summary_check)


def plugin_answers() -> List[CmdCase]:
    klass, out = "plugin answers (ampkit-train)", []
    for sync in ("step", "deferred"):
        for from_step in (0, 2, 5):
            for answer, rule in (
                ("0", "constant"),
                ("nan", "constant"),
                ("inf", "constant"),
                ("-8", "constant"),
                ("1e30", "dynamic"),
                ("0", "dynamic"),
                ("nan", "dynamic"),
            ):
                args = [
                    "--host-sync",
                    sync,
                    "--scaler",
                    WRONG_SCALE,
                    "--opt",
                    f"scaler.answer={answer}",
                    "--opt",
                    f"scaler.from_step={from_step}",
                    "--opt",
                    f"scaler.rule={rule}",
                ]
                out.append(
                    _train(
                        klass,
                        f"scale={answer} rule={rule} from={from_step} sync={sync}",
                        args,
                        [3],
                        ["wrong_scale", "scale()"],
                    )
                )
            out.append(
                _train(
                    klass,
                    f"scale=512 from={from_step} sync={sync}",
                    [
                        "--host-sync",
                        sync,
                        "--scaler",
                        WRONG_SCALE,
                        "--opt",
                        "scaler.answer=512",
                        "--opt",
                        f"scaler.from_step={from_step}",
                    ],
                    [0] if sync == "step" or from_step == 0 else [3],
                    ["wrong_scale", "disagree"],
                )
            )
            for action in (3, 4, 6, 77, 1000, 0, 1):
                args = [
                    "--host-sync",
                    sync,
                    "--nan-policy",
                    WRONG_ACTION,
                    "--opt",
                    f"nan_policy.action={action}",
                    "--opt",
                    f"nan_policy.from_step={from_step}",
                ]
                codes, names = [3], ["wrong_action", ("rollback" if action == 3 else f"action {action}")]
                if action == 4:
                    codes, names = [5], ["training aborted by nan_policy 'wrong_action'"]
                elif action in (0, 1):  # proceed, skip: answers a host can carry out (skip: apart from its rule)
                    codes, names = ([0] if action == 0 or sync == "step" else [0, 3]), ["wrong_action"]
                out.append(_train(klass, f"action={action} from={from_step} sync={sync}", args, codes, names))
    return out


# What a broken plugin needs to meet its fault in a run (tests/host/test_cli.cpp): a checkpoint to
# save, a resume to load, a run that lasts past its thread's 0.3 s; and the exit codes expected.
FAULT_RUNS = {
    "save_segv": (["--checkpoint-dir", "ckpt"], [3]),
    "thread_segv": (["--steps", "1000000"], [3]),
    "thread_exit": (["--steps", "1000000"], [3]),
    "stripped": ([], [0]),  # a good plugin, stripped as packagers do
    "duplicate": ([], [0]),  # one of two files offering 'duplicate', named by its path
}


def broken_plugins(paths: Sequence[str]) -> List[CmdCase]:
    klass, out = "broken plugins (ampkit-train)", []
    for path in paths:
        base = os.path.basename(path)
        plugin = base[len("libampkit-") : -len(".so")].split("-", 1)[1]
        flag = "--nan-policy" if "-nan_policy-" in base else "--clipper" if plugin == "wrong_kind" else "--scaler"
        extra, codes = FAULT_RUNS.get(plugin, ([], [3]))
        steps = int(extra[1]) if extra[:1] == ["--steps"] else 8
        extra = extra[2:] if extra[:1] == ["--steps"] else extra
        label = os.path.relpath(path, os.path.join(BUILD, "tests"))
        case = _train(
            klass, label, [flag, path, "--plugin-timeout", "3", *extra], codes, [base], timeout=40, steps=steps
        )
        if plugin == "load_segv":  # a first run saves its state; the resume loads it
            first = shlex.join(case.argv + ["--checkpoint-dir", "ckpt"])
            case.argv = ["sh", "-c", f"{first} >/dev/null 2>&1 && {first} --resume auto"]
        out.append(case)
    duplicate = sorted({os.path.dirname(p) for p in paths if "duplicate" in os.path.basename(p)})
    dirs = [arg for d in duplicate for arg in ("--plugin-dir", d)]
    out.append(
        _train(klass, "'duplicate' offered by two folders", [*dirs, "--scaler", "duplicate"], [3], ["duplicate"])
    )
    return out


YAML_BASE = {"workload": "synthetic", "steps": 2, "batch-size": 8, "synthetic-width": 16, "synthetic-depth": 1}
YAML_BAD = (
    [(("steps",), v) for v in ("x", 1.5, -1, 0, 10**400, None, True, "2 ")]
    + [(("lr",), v) for v in (float("nan"), -1, 0, "fast", float("inf"))]
    + [
        (("precision",), "fp7"),
        (("scaler",), "/dev/null"),
        (("nosuch",), 1),
        (("opt", "nan_policy", "nosuch"), 1),
        (("opt", "nan_policy", "max_consecutive"), -1),
        (("opt", "nosuch"), {"a": 1}),
        (("batch-size",), 2**40),
    ]
)


def config_files(folder: str) -> List[CmdCase]:
    out = []
    for label, reader, args in (
        (
            "ampkit-train --config YAML",
            Reader(
                "yaml",
                ".yaml",
                dict(YAML_BASE, opt={"nan_policy": {"max_consecutive": 3}}),
                ("opt", {"nan_policy": {"max_consecutive": 3}}),
                YAML_BAD,
            ),
            [],
        ),
        (
            "ampkit-train --config DeepSpeed JSON",
            Reader("ds", ".json", FP16, ("fp16", FP16["fp16"]), DEEPSPEED_BAD),
            ["--steps", "2", "--workload", "synthetic", "--synthetic-width", "16", "--synthetic-depth", "1"],
        ),
    ):
        sub = os.path.join(folder, reader.label)
        os.mkdir(sub)
        for f in files_for(sub, reader):
            codes = {"ok": [0], "either": [0, 2], "error": [2]}[f.expect]
            codes = codes + [3] if f.kind.startswith("scaler=") else codes  # a plugin not found: exit 3
            # An empty file is the defaults (Fashion-MNIST, one epoch): the run is cut short here.
            more = ["--steps", "2", "--workload", "synthetic"] if f.expect == "either" and not args else []
            timeout = 5.0 if f.timeout <= 1.0 else 30.0  # a FIFO: the program's start-up is in the time
            out.append(
                CmdCase(
                    f"files: {label}",
                    f.kind,
                    [TRAIN, "--threads", "1", "--progress", "never", "--config", f.path, *args, *more],
                    codes,
                    f.names,
                    {},
                    timeout,
                    _summary_check,
                )
            )
    return out


FLAG_JUNK = {
    "--steps": ["-1", "0", "x", "1e3", "99999999999999999999", "", "1.5", " 2"],
    "--lr": ["nan", "inf", "-1", "0", "x", "1e400"],
    "--batch-size": ["0", "-8", "2097152", "eight"],
    "--threads": ["-1", "1025", "x"],
    "--precision": ["fp7", "FP16", ""],
    "--host-sync": ["sometimes", "", "STEP"],
    "--scaler": ["nosuch", "", "/dev/null", "/nonexistent/x.so", "../../etc/passwd"],
    "--opt": [
        "scaler",
        "scaler.=1",
        "=1",
        "nosuch.x=1",
        "nan_policy.max_consecutive=-1",
        "nan_policy.nosuch=1",
        "nan_policy.max_consecutive=1e99",
        "nan_policy.max_consecutive=",
    ],
    "--plugin-timeout": ["0", "86401", "x"],
    "--seed": ["-1", "x", "18446744073709551616"],
    "--workload": ["nosuch", ""],
    "--inject": ["nan@", "@step=1", "nan@step=-1", "spike@step=2,factor=-1", "bogus@step=1"],
    "--rank": ["5", "-1"],
    "--world-size": ["0", "x"],
    "--master-port": ["0", "70000"],
}
ENV_JUNK = {
    "AMPKIT_NAN_POLICY_MAX_CONSECUTIVE": ["-1", "x", "", "1e99", " 3", "nan"],
    "AMPKIT_NAN_POLICY_NOSUCH": ["1"],
    "AMPKIT_SCALER_INIT_SCALE": ["x"],  # the scaler 'none' has no such option: refused either way
    "AMPKIT_PLUGIN_PATH": ["/dev/zero", "\x01"],
    "AMPKIT_GPU_SELF_CHECK": ["maybe"],
    "RANK": ["1_0", " 1 ", "\u0663", "x"],
    "WORLD_SIZE": ["0", "99999999999999999999999", "x"],
    "LOCAL_RANK": ["-1", "x"],
    "MASTER_PORT": ["70000", "x"],
    "MASTER_ADDR": ["a\nb"],  # with WORLD_SIZE=2 below: an address ampkit-train would use
    "SLURM_PROCID": ["x"],
    "OMPI_COMM_WORLD_SIZE": ["x"],
}
# Values a user may give: documented as accepted (the expected exit code is then 0).
FLAG_FINE = {
    ("--steps", " 2"),
    ("--precision", "FP16"),
    ("--host-sync", "STEP"),
    ("--inject", "spike@step=2,factor=-1"),
}
ENV_FINE = {("AMPKIT_GPU_SELF_CHECK", "maybe")}


def flags_and_environment() -> List[CmdCase]:
    out = []
    for flag, values in FLAG_JUNK.items():
        for value in values:
            codes = [0, 2] if (flag, value) in FLAG_FINE else [2, 3] if flag == "--scaler" else [2]
            out.append(
                _train(
                    "ampkit-train flags",
                    f"{flag} {value!r}",
                    [flag, value],
                    codes,
                    [(flag, flag.lstrip("-"), flag.lstrip("-").replace("-", "_"), value or flag)],
                    steps=2,
                )
            )
    for var, values in ENV_JUNK.items():
        for value in values:
            codes = [0] if (var, value) in ENV_FINE else [2]
            env = {var: value, "WORLD_SIZE": "2", "RANK": "0"} if var == "MASTER_ADDR" else {var: value}
            extra = ["--dist-timeout", "3"] if var == "MASTER_ADDR" else []
            out.append(_train("ampkit-train environment", f"{var}={value!r}", extra, codes, [var], env, steps=2))
    return out


TORCHSCRIPT = r"""
import os, sys, torch
folder = sys.argv[1]
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(4, 3)
    def forward(self, x): return self.l(x)
class NoParams(torch.nn.Module):
    def forward(self, x): return x * 2
class Raises(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(4, 3)
    def forward(self, x):
        if x.shape[0] > 0: raise RuntimeError("the model refuses")
        return self.l(x)
for name, m in (("net", Net()), ("noparams", NoParams()), ("raises", Raises())):
    torch.jit.script(m).save(f"{folder}/{name}.pt")
torch.save({"inputs": torch.ones(16, 4), "targets": torch.zeros(16, dtype=torch.long)}, f"{folder}/data.pt")
torch.save({"inputs": torch.ones(16, 5), "targets": torch.zeros(16, dtype=torch.long)}, f"{folder}/wide.pt")
torch.save({"inputs": torch.full((16, 4), float("nan")), "targets": torch.zeros(16, dtype=torch.long)},
           f"{folder}/nan.pt")
torch.save([1, 2, 3], f"{folder}/list.pt")
torch.save({"inputs": torch.ones(16, 4), "targets": torch.zeros(15, dtype=torch.long)}, f"{folder}/short.pt")
torch.save({"inputs": torch.ones(16, 4), "targets": torch.full((16,), 999)}, f"{folder}/classes.pt")
torch.save({"inputs": torch.ones(0, 4), "targets": torch.zeros(0, dtype=torch.long)}, f"{folder}/empty.pt")
open(f"{folder}/garbage.pt", "wb").write(b"not a model\n" * 8)
os.makedirs(f"{folder}/noshard"); os.makedirs(f"{folder}/fifoshard"); os.mkfifo(f"{folder}/fifoshard/a.pt")
os.makedirs(f"{folder}/dangling"); os.symlink(f"{folder}/gone.pt", f"{folder}/dangling/a.pt")
"""


def torchscript(folder: str) -> List[CmdCase]:
    maker = os.path.join(folder, "make.py")  # a file: torch.jit.script reads the classes' source
    with open(maker, "w") as f:
        f.write(TORCHSCRIPT)
    subprocess.run([sys.executable, maker, folder], check=True, capture_output=True)
    ts = [TRAIN, *"--workload torchscript --threads 1 --progress never --steps 4 --batch-size 8".split()]
    ts += ["--summary", "summary.json"]
    p = {
        name: os.path.join(folder, name + ".pt")
        for name in ("net", "noparams", "raises", "data", "wide", "nan", "list", "garbage", "short", "classes", "empty")
    }
    rows = [
        ("valid", p["net"], p["data"], [0]),
        ("model missing", folder + "/gone.pt", p["data"], [2, 4]),
        ("model garbage", p["garbage"], p["data"], [4]),
        ("model a data file", p["data"], p["data"], [4]),
        ("model a folder", folder, p["data"], [2, 4]),
        ("model /dev/zero", "/dev/zero", p["data"], [2, 4]),
        ("no parameters", p["noparams"], p["data"], [4]),
        ("forward raises", p["raises"], p["data"], [4]),
        ("data garbage", p["net"], p["garbage"], [4]),
        ("data a list", p["net"], p["list"], [4]),
        ("data too wide", p["net"], p["wide"], [4]),
        ("data missing", p["net"], folder + "/gone.pt", [2, 4]),
        ("data a model", p["net"], p["net"], [4]),
        ("data NaN inputs", p["net"], p["nan"], [0, 4, 5]),
        ("data lengths differ", p["net"], p["short"], [4]),
        ("targets outside the classes", p["net"], p["classes"], [4]),
        ("data empty", p["net"], p["empty"], [2]),
        ("data folder without shards", p["net"], folder + "/noshard", [4]),
        ("data folder with a FIFO shard", p["net"], folder + "/fifoshard", [4]),
        ("data folder with a dangling symlink", p["net"], folder + "/dangling", [4]),
    ]
    return [
        CmdCase(
            "TorchScript workload",
            name,
            ts + ["--model", model, "--data", data],
            codes,
            [(os.path.basename(model), os.path.basename(data), "model", "data")],
            {},
            60.0,
            _summary_check,
        )
        for name, model, data, codes in rows
    ]
