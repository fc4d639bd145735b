#!/usr/bin/env python3
"""Runs in-process Python cases of the adversarial harness: `worker.py MODULE [ID ...]` runs the
cases of tools/adversarial/MODULE.py with those ids ("CLASS / NAME"; all without ids) one after
another in this process, each under its own alarm, and prints one marked JSON line as each
starts and one with its outcome. `worker.py MODULE --list` lists them. run.py starts it; run alone it reproduces a case
(PYTHONPATH=build/python)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import warnings
from collections import Counter
from typing import Any, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import DEFAULT_TYPES, Finding, PyCase, holds  # noqa: E402

MARK = "@@adversarial "


class Late(BaseException):
    """The case's alarm: a BaseException, so that no `except Exception` in the case swallows it."""


def _alarm(*_: Any) -> None:
    raise Late()


def _bases(exc: BaseException) -> set:
    return {t.__name__ for t in type(exc).__mro__}


def classify(case: PyCase, exc: Optional[BaseException]) -> Finding:
    """The outcome of a case whose body returned (exc None) or raised ``exc``."""
    if isinstance(exc, Finding):
        return exc
    if isinstance(exc, Late):
        return Finding("hang", f"no answer within {case.timeout:g} s")
    if exc is None:
        if case.expect == "error":
            return Finding("silent", "returned: the bad input was accepted")
        return Finding("clean", "returned")
    kind = type(exc).__name__
    text = str(exc)
    allowed = tuple(case.types) or DEFAULT_TYPES
    shown = f"{kind}: {text[:400]}"
    if kind not in allowed:
        family = {"ValueError", "TypeError", "AmpkitError", "OSError"}
        if _bases(exc) & family:
            return Finding("unclear", f"{shown} (expected {'/'.join(allowed)})")
        return Finding("crash", shown)
    if case.expect == "ok":
        return Finding("refused", shown)
    if "\n" in text.strip() or not holds(text, case.names):
        return Finding("unclear", f"{shown} (should hold {list(case.names)})")
    return Finding("clean", shown)


def run_case(case: PyCase) -> Finding:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, case.timeout)
    exc: Optional[BaseException] = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            case.body()
    except (Exception, Late) as e:  # noqa: BLE001 - every exception is an outcome to classify
        exc = e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    try:
        return classify(case, exc)
    except Exception as e:  # noqa: BLE001 - str() of a broken exception is itself a finding
        return Finding("crash", f"str() of {type(exc).__name__} raised {type(e).__name__}")


def case_id(case: PyCase) -> str:
    """How worker.py's command line names a case: unique within its module."""
    return f"{case.klass} / {case.name}"


def cases_of(module: Any) -> List[PyCase]:
    """The module's cases, a name given twice in one class made unique by its count ("... (2)")."""
    seen: Counter = Counter()
    out = []
    for case in module.cases():
        seen[case_id(case)] += 1
        if seen[case_id(case)] > 1:
            case.name = f"{case.name} ({seen[case_id(case)]})"
        out.append(case)
    return out


def main() -> int:
    module = importlib.import_module(sys.argv[1])
    if sys.argv[2:] == ["--list"]:
        for case in cases_of(module):
            fields = {
                "id": case_id(case),
                "name": case.name,
                "klass": case.klass,
                "isolated": case.isolated,
                "timeout": case.timeout,
                "names": list(case.names),
            }
            print(MARK + json.dumps(fields), flush=True)
        return 0
    import ampkit  # noqa: F401  (imported before any case: an import is no case's time)

    wanted = set(sys.argv[2:])
    for case in cases_of(module):
        if wanted and case_id(case) not in wanted:
            continue
        print(MARK + json.dumps({"start": case_id(case)}), flush=True)
        found = run_case(case)
        print(MARK + json.dumps({"id": case_id(case), "outcome": found.outcome, "note": found.note}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
