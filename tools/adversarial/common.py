"""What the adversarial harness's cases are and how an outcome is classified: shared by run.py (the
parent, which never imports torch) and worker.py (which runs the in-process Python cases)."""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("AMPKIT_BUILD_DIR", os.path.join(ROOT, "build")))
TRAIN = os.path.join(BUILD, "bin", "ampkit-train")
BROKEN = os.path.join(BUILD, "tests", "broken-plugins")
WRONG_SCALE = os.path.join(BROKEN, "answers", "libampkit-scaler-wrong_scale.so")
WRONG_ACTION = os.path.join(BROKEN, "answers", "libampkit-nan_policy-wrong_action.so")

# The outcome columns, in the order the tables show them. "refused" is a valid input refused (a
# control case that should have run): not a failure class of its own, but never clean either.
OUTCOMES = ["clean", "crash", "hang", "silent", "lost", "unclear", "wrong_exit", "refused"]

# Exit codes ampkit-train documents (core/common/include/ampkit/exit_codes.h, docs/configuration.md).
TRAIN_EXITS = {0, 2, 3, 4, 5, 6, 7, 9, 130}
# The exceptions a bad argument or file may raise in Python (docs/python.md).
DEFAULT_TYPES = ("ValueError", "TypeError", "FileNotFoundError", "AmpkitError", "PluginError", "TrainingAborted")


class Finding(Exception):
    """Raised by a case's body to classify its outcome itself (e.g. "silent": NaN parameters)."""

    def __init__(self, outcome: str, note: str) -> None:
        super().__init__(note)
        self.outcome = outcome
        self.note = note


@dataclass
class PyCase:
    """A Python case: ``body()`` runs it; ``expect`` is "error" (the input is bad: an exception of
    ``types`` with a one-line message holding every string of ``names``), "ok" (it must run), or
    "either" (a valid answer, or a refusal as for "error"). ``isolated`` runs it in a process of its
    own (it may end the interpreter: exit 3 with one line holding ``names`` is then clean)."""

    klass: str
    name: str
    body: Callable[[], object]
    expect: str = "error"
    names: Sequence[object] = ()  # a tuple among them: any one of its strings
    types: Sequence[str] = ()
    timeout: float = 20.0
    isolated: bool = False


@dataclass
class CmdCase:
    """A command (ampkit-train, or python3 -c for a case that needs a process of its own): clean
    when it exits with one of ``codes`` and, if not 0, one error line holding every ``names``."""

    klass: str
    name: str
    argv: List[str]
    codes: Sequence[int]
    names: Sequence[object] = ()
    env: Dict[str, str] = field(default_factory=dict)
    timeout: float = 20.0
    check: Optional[Callable[[str, str], Optional[Finding]]] = None  # (its folder, stderr) after exit 0

    def reproduction(self, folder: str) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"(cd {shlex.quote(folder)} && {env + ' ' if env else ''}{shlex.join(self.argv)})"


@dataclass
class Result:
    klass: str
    name: str
    outcome: str
    note: str = ""
    reproduction: str = ""


def holds(text: str, names: Sequence[object]) -> bool:
    """Whether ``text`` holds every one of ``names``; a tuple among them: any one of its strings."""
    return all(any(n in text for n in (name if isinstance(name, tuple) else (name,))) for name in names)


def error_lines(stderr: str) -> List[str]:
    """stderr's lines less warnings and per-step reports: what a user reads as the error."""
    lines = [line.strip() for line in stderr.splitlines()]
    return [
        line
        for line in lines
        if line
        and ": warning: " not in line
        and "Warning: " not in line
        and not line.startswith(("ampkit-train: step ", "warnings.warn", "[W"))
    ]


def classify_exit(case: CmdCase, rc: Optional[int], stderr: str, folder: str) -> Finding:
    """The outcome of a command that ran to its end (rc None: killed past its timeout)."""
    if rc is None:
        return Finding("hang", f"no answer within {case.timeout:g} s")
    if rc < 0 or "terminate called" in stderr or "Traceback (most recent call last)" in stderr:
        return Finding("crash", f"exit {rc}: {stderr.strip()[-300:]}")
    lines = error_lines(stderr)
    if rc == 0:
        if 0 not in case.codes:
            return Finding("silent", "exit 0 for a bad input")
        found = case.check(folder, stderr) if case.check else None
        return found or Finding("clean", "exit 0")
    if rc not in case.codes:
        if 0 in case.codes and len(case.codes) == 1:
            return Finding("refused", f"exit {rc}: {' | '.join(lines)[:300]}")
        return Finding("wrong_exit", f"exit {rc}, expected {sorted(case.codes)}: {' | '.join(lines)[:300]}")
    if len(lines) != 1 or not holds(lines[0], case.names):
        return Finding("unclear", f"exit {rc}, {len(lines)} error lines: {' | '.join(lines)[:300]}")
    return Finding("clean", f"exit {rc}: {lines[0][:200]}")


def _start(case: CmdCase, folder: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    """Runs the case; a program a build beside us is relinking cannot be started for a moment."""
    for _ in range(30):
        try:
            return subprocess.run(
                case.argv, cwd=folder, env=env, capture_output=True, timeout=case.timeout, stdin=subprocess.DEVNULL
            )
        except (PermissionError, OSError) as e:
            if e.errno not in (errno.EACCES, errno.ETXTBSY, errno.ENOENT):
                raise
            time.sleep(2)
    raise RuntimeError(f"{case.argv[0]} could not be started for a minute")


def run_command(case: CmdCase, folder: str) -> Result:
    env = dict(os.environ, AMPKIT_PLUGIN_PATH="", PYTHONPATH=os.path.join(BUILD, "python"), OMP_NUM_THREADS="1")
    env.update(case.env)
    start = time.monotonic()
    try:
        run = _start(case, folder, env)
        stderr = run.stderr.decode("utf-8", "replace")
        found = classify_exit(case, run.returncode, stderr, folder)
    except subprocess.TimeoutExpired:
        found = classify_exit(case, None, "", folder)
    note = f"{found.note} [{time.monotonic() - start:.1f} s]"
    return Result(case.klass, case.name, found.outcome, note, case.reproduction(folder))
