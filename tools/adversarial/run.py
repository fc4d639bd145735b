#!/usr/bin/env python3
"""Adversarial rerun: many cases a new user might try, each classified clean, crash, hang, silent (a
bad value accepted, NaN parameters reported as completed), lost (a resume that drops the scaler's
state in silence), unclear (an error that is not one line naming its argument, key, file or plugin),
wrong_exit (an exit code ampkit-train does not document for it) or refused (a valid input refused).

    nice -n 10 python3 tools/adversarial/run.py [--only TEXT] [--markdown FILE] [--show N]

Uses the built tree (build/, or $AMPKIT_BUILD_DIR): build/python, build/bin/ampkit-train and the
broken plugins under build/tests/broken-plugins. Cases run one at a time: ampkit-train's in a
process each; Python's in worker.py processes, many to one process, a case that may end the
interpreter in one of its own. Prints a table per class and, for each case that is not clean, its
outcome and the exact command that reproduces it. Exit status 0 when every case is clean, else 1."""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import train_cases  # noqa: E402
from common import BUILD, OUTCOMES, ROOT, CmdCase, Result, error_lines, holds, run_command  # noqa: E402
from py_plugins import broken_plugins  # noqa: E402
from worker import MARK  # noqa: E402

PY_MODULES = ["py_plugins", "py_files", "py_api", "py_resume"]


def _env() -> Dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=os.path.join(BUILD, "python"),
        AMPKIT_PLUGIN_PATH="",
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )


def _reproduce(module: str, name: str) -> str:
    return (
        f"(cd {shlex.quote(ROOT)} && PYTHONPATH={shlex.quote(os.path.join(BUILD, 'python'))} "
        f"python3 tools/adversarial/worker.py {module} {shlex.quote(name)})"
    )


def _listing(module: str) -> List[dict]:
    run = subprocess.run(
        [sys.executable, os.path.join(HERE, "worker.py"), module, "--list"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    rows = [json.loads(line[len(MARK) :]) for line in run.stdout.splitlines() if line.startswith(MARK)]
    if run.returncode != 0 or not rows:
        raise SystemExit(f"worker.py {module} --list failed (exit {run.returncode}):\n{run.stderr[-2000:]}")
    return rows


def _died(meta: dict, rc: Optional[int], stderr: str) -> tuple:
    """The outcome of a case whose worker ended (rc None: killed after the case's time) before its own."""
    if rc is None:
        return "hang", f"no answer within {meta['timeout']:g} s (the alarm did not stop it)"
    lines = error_lines(stderr)
    if rc == 3 and len(lines) == 1 and lines[0].startswith("ampkit: error: ") and holds(lines[0], meta["names"]):
        return "clean", f"exit 3: {lines[0][:200]}"  # docs/python.md: the interpreter cannot go on
    if rc == 3:
        return "unclear", f"exit 3: {' | '.join(lines)[:300]}"
    return "crash", f"the interpreter ended, exit {rc}: {stderr.strip()[-300:]}"


def _run_batch(module: str, metas: List[dict], results: List[Result]) -> List[dict]:
    """Runs ``metas`` in one worker; returns those it did not reach (after a case that ended it)."""
    names = [m["id"] for m in metas]
    by_name = {m["id"]: m for m in metas}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "worker.py"), module, *names],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        current: Optional[dict] = None
        done = set()
        deadline = time.monotonic() + 300  # the worker's imports
        killed = False
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                proc.kill()
                killed = True
                break
            line = proc.stdout.readline()
            if not line:
                break
            if not line.startswith(MARK):
                continue
            row = json.loads(line[len(MARK) :])
            if "start" in row:
                current = by_name[row["start"]]
                deadline = time.monotonic() + current["timeout"] + 15
                continue
            meta = by_name[row["id"]]
            results.append(
                Result(meta["klass"], meta["name"], row["outcome"], row["note"], _reproduce(module, row["id"]))
            )
            done.add(row["id"])
            current = None
        rc = proc.wait()
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if current is not None:
        outcome, note = _died(current, None if killed else rc, stderr)
        results.append(Result(current["klass"], current["name"], outcome, note, _reproduce(module, current["id"])))
        done.add(current["id"])
    elif len(done) < len(metas):
        raise SystemExit(f"worker.py {module} ended (exit {rc}) before its first case:\n{stderr[-2000:]}")
    return [m for m in metas if m["id"] not in done]


def run_python(module: str, only: str, results: List[Result]) -> None:
    metas = [m for m in _listing(module) if only in m["klass"] + " " + m["name"]]
    shared = [m for m in metas if not m["isolated"]]
    while shared:
        shared = _run_batch(module, shared, results)
    for meta in (m for m in metas if m["isolated"]):
        _run_batch(module, [meta], results)


def command_cases(folder: str) -> List[CmdCase]:
    cases = train_cases.plugin_answers() + train_cases.broken_plugins(broken_plugins())
    for make in (train_cases.config_files, train_cases.torchscript):
        sub = os.path.join(folder, make.__name__)
        os.mkdir(sub)
        cases += make(sub)
    return cases + train_cases.flags_and_environment()


def run_commands(only: str, results: List[Result], folder: str) -> None:
    for i, case in enumerate(c for c in command_cases(folder) if only in c.klass + " " + c.name):
        cwd = os.path.join(folder, f"case{i}")
        os.mkdir(cwd)
        result = run_command(case, cwd)
        again = shlex.quote(case.klass + " " + case.name)
        result.reproduction = f"python3 tools/adversarial/run.py --only {again}   # runs {result.reproduction}"
        results.append(result)


def tables(results: List[Result], commit: str) -> str:
    counts: Dict[str, Counter] = defaultdict(Counter)
    for r in results:
        counts[r.klass][r.outcome] += 1
    header = "| class | cases | " + " | ".join(OUTCOMES) + " |"
    lines = [f"Commit {commit}; {len(results)} cases.", "", header, "|" + "---|" * (len(OUTCOMES) + 2)]
    total: Counter = Counter()
    for klass in sorted(counts):
        total.update(counts[klass])
        cells = " | ".join(str(counts[klass][o]) for o in OUTCOMES)
        lines.append(f"| {klass} | {sum(counts[klass].values())} | {cells} |")
    lines.append(f"| **all** | {len(results)} | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="only the cases whose class or name holds this text")
    parser.add_argument(
        "--part",
        choices=["all", "python", "commands"],
        default="all",
        help="python: only the Python cases; commands: only ampkit-train's and other commands'",
    )
    parser.add_argument("--markdown", help="also write the tables and the findings to this file")
    parser.add_argument("--show", type=int, default=1000, help="findings to print (default all)")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    results: List[Result] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ampkit-adversarial-") as folder:
        for module in PY_MODULES if args.part != "commands" else []:
            run_python(module, args.only, results)
        if args.part != "python":
            run_commands(args.only, results, folder)
    text = tables(results, commit) + f"\n\nRan in {time.monotonic() - start:.0f} s.\n"
    findings = [r for r in results if r.outcome != "clean"]
    for r in findings[: args.show]:
        text += f"\n- {r.outcome}: {r.klass} / {r.name}: {r.note}\n  {r.reproduction}"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
