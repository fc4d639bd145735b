"""python/ampkit keeps no table of what C++ declares (C++ is the one source of every fact; docs/python.md).

A table is a literal list, tuple, set or dict in the package's source whose string elements (or
keys, or values) hold two or more names of one vocabulary C++ declares: the plugin kinds, the
precisions, the error categories, the NaN report's keys, the plugins of one kind, the options of
one plugin. The vocabularies are read from _C and from the plugins themselves, never from a list
written here, so a new kind, plugin or option is covered without editing this test.

What is not a table: one name used once (``self._plugin_state("scaler")``); names written as
Python identifiers, which are the API (``GradScaler(scaler=..., clipper=...)``'s keyword arguments,
``dict(scaler=..., clipper=...)``, an enum's members); and torch's own names, which the plugins'
options share on purpose (torch.amp.GradScaler's arguments and state_dict keys, clip_grad_norm_'s
arguments: the ``dynamic`` scaler is torch's, the ``norm`` clipper is clip_grad_norm_), read from
torch itself.
"""

import ast
import inspect
import math
import os
from typing import Dict, Iterable, List, Set

import pytest
import torch

import ampkit
from ampkit import _facts

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "ampkit")


def _report_keys() -> Set[str]:
    """Every key, at any depth, of a report GradScaler.locate returns for a skipped step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    scaler = ampkit.GradScaler("cpu", model=model)
    x = torch.randn(2, 4)
    x[0, 0] = math.nan
    scaler.scale(model(x).sum()).backward()
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1)) is False
    keys: Set[str] = set()

    def walk(value):
        if isinstance(value, dict):
            keys.update(value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(scaler.locate(lambda: model(x).sum()))
    return keys


def _torch_names() -> Set[str]:
    """torch.amp.GradScaler's arguments and state_dict keys, and clip_grad_norm_'s arguments."""
    names = set(inspect.signature(torch.amp.GradScaler.__init__).parameters)
    names |= set(torch.amp.GradScaler("cpu").state_dict())
    return names | set(inspect.signature(torch.nn.utils.clip_grad_norm_).parameters)


def read_vocabularies() -> Dict[str, Set[str]]:
    """Each vocabulary's names, as _C and the plugins declare them."""
    found = ampkit.plugins()
    torch_names = _torch_names()
    out = {
        "kinds": set(_facts.STEP_KINDS) | {p.kind for p in found},
        "precisions": set(_facts.PRECISIONS),
        "error categories": set(_facts.ERROR_CATEGORIES),
        "NaN report keys": _report_keys(),
    }
    for p in found:
        out.setdefault(f"{p.kind} plugins", set()).add(p.name)
        out[f"{p.kind} {p.name}'s options"] = {o.name for o in p.options} - torch_names
    return out


@pytest.fixture(scope="module")
def vocabularies() -> Dict[str, Set[str]]:
    return read_vocabularies()


def _strings(nodes: Iterable[ast.AST]) -> List[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def tables(source: str, vocabularies: Dict[str, Set[str]], name: str = "<source>") -> List[str]:
    """Each literal collection of ``source`` holding two or more names of one vocabulary."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            groups = [_strings(k for k in node.keys if k is not None), _strings(node.values)]
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            groups = [_strings(node.elts)]
        else:
            continue
        for words in groups:
            for what, names in vocabularies.items():
                hits = sorted(set(words) & names)
                if len(hits) >= 2:
                    out.append(f"{name}:{node.lineno}: {what} {hits}")
    return out


def test_the_package_spells_no_table_of_cs_facts(vocabularies):
    found = []
    for file in sorted(os.listdir(PACKAGE)):
        if file.endswith(".py"):
            with open(os.path.join(PACKAGE, file)) as f:
                found += tables(f.read(), vocabularies, file)
    assert not found, "tables of C++'s facts in python/ampkit (read them from ampkit._facts):\n" + "\n".join(found)


# The tables this check replaced (as they were in python/ampkit), and others of each vocabulary:
# each must be found, or the check above could pass by seeing nothing.
@pytest.mark.parametrize("source", [
    'c = {"plugins": {"scaler": str(scaler), "clipper": str(clipper), "nan_policy": str(nan_policy)}}',
    '_THRESHOLD_OPTIONS = {"norm": "max_norm", "value": "clip_value", "adaptive": "max_norm", "agc": "clip_factor"}',
    '_NAN_STRATEGIES = {"skip": ("skip", {}), "reduce_scale": ("backoff", {}), "abort": ("abort", {})}',
    'return {"precision": precision, "scaler": plugins["scaler"], "clipper": plugins["clipper"]}',
    'given = {"max_consecutive": max_consecutive, "spike_zscore": spike_zscore}',
    'if precision in ("fp16", "bf16"): pass',
    'CATEGORIES = {"usage": 1, "plugin": 2}',
    'keys = ["located", "module_type", "micro_batch_loss"]',
])
def test_a_table_that_reappears_is_found(vocabularies, source):
    assert tables(source, vocabularies)


def test_the_api_s_own_names_are_not_tables(vocabularies):
    source = (
        'kwargs = dict(scaler=scaler, clipper=clipper, nan_policy=policy)\n'
        'state = self._plugin_state("scaler")\n'
        'defaults = option_defaults(dirs, False, "clipper", "norm", option)\n'
    )
    assert tables(source, vocabularies) == []
