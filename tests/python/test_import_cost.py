"""What `import ampkit` brings in, each case in a fresh interpreter (docs/python.md, "Install").

`import ampkit` costs little more than `import torch`: it must not import torch._dynamo (as much
again as torch: GradScaler's methods are kept out of torch.compile's tracing without it, see
python/ampkit/_tracing.py) nor any trainer's framework. The trainer integrations are still reachable
as attributes after a plain `import ampkit`, loading their framework only then, and a missing
framework is an ImportError that names it.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HEAVY = ["torch._dynamo", "lightning", "accelerate", "transformers"]


def run(code):
    import ampkit  # from the build tree (conftest.py): the child imports the same package

    package_root = os.path.dirname(os.path.dirname(ampkit.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_import_ampkit_loads_neither_dynamo_nor_a_trainer_framework():
    loaded = run(f"import json, sys, ampkit\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert loaded == []


def test_a_not_traced_call_without_dynamo_does_not_import_it():
    # (torch's own optimizers import torch._dynamo when built: torch.optim's _disable_dynamo.)
    got = run(
        "import json, sys, torch\n"
        "from ampkit._tracing import not_traced\n"
        "@not_traced\n"
        "def host_read(x):\n"
        "    return x.sum().item()\n"
        "print(json.dumps([host_read(torch.ones(3)), 'torch._dynamo' in sys.modules]))"
    )
    assert got == [3.0, False]


def test_under_torch_compile_a_not_traced_call_is_one_graph_break_and_runs_eagerly():
    got = run(
        "import json, torch, torch._dynamo\n"
        "from ampkit._tracing import not_traced\n"
        "calls = []\n"
        "@not_traced\n"
        "def host_read(x):\n"
        "    calls.append(torch.compiler.is_compiling())\n"
        "    return x.sum().item()\n"
        "def f(x):\n"
        "    y = x * 2\n"
        "    return y + host_read(y)\n"
        "e = torch._dynamo.explain(f)(torch.ones(3))\n"
        "out = torch.compile(f, backend='eager')(torch.ones(3))\n"
        "print(json.dumps([e.graph_break_count, [str(b.reason) for b in e.break_reasons], calls, out.tolist()]))"
    )
    breaks, reasons, calls, out = got
    assert breaks == 1 and "compiler.disable" in reasons[0], reasons  # Dynamo skipped it, as marked
    assert calls == [False, False]  # explain's run and the compiled run each called it eagerly
    assert out == [8.0, 8.0, 8.0]


def test_the_methods_carry_dynamos_disable_mark():
    import ampkit

    for name in ("unscale_", "step", "update"):
        method = getattr(ampkit.GradScaler, name)
        assert method._torchdynamo_disable is True, name  # Dynamo breaks the graph at the call
        assert method.__name__ == name and method.__doc__


@pytest.mark.parametrize(
    "module, name",
    [("lightning", "AmpkitPrecision"), ("accelerate", "prepare_scaler"), ("transformers", "AmpkitTrainer")],
)
def test_an_integration_is_an_attribute_of_ampkit_and_imports_its_framework_then(module, name):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    got = run(
        "import json, sys, ampkit\n"
        f"before = {module!r} in sys.modules\n"
        f"thing = getattr(ampkit.{module}, {name!r})\n"
        f"print(json.dumps([before, {module!r} in sys.modules, ampkit.{module}.__name__, callable(thing)]))"
    )
    assert got == [False, True, f"ampkit.{module}", True]


@pytest.mark.parametrize("module", ["lightning", "accelerate", "transformers"])
def test_a_missing_framework_is_an_import_error_naming_it(module):
    # sys.modules[name] = None makes `import name` fail as if the package were not installed.
    got = run(
        "import json, sys\n"
        f"sys.modules[{module!r}] = None\n"
        "import ampkit\n"
        "try:\n"
        f"    ampkit.{module}\n"
        "    print(json.dumps(None))\n"
        "except ImportError as e:\n"
        "    print(json.dumps([type(e).__name__, str(e), hasattr(ampkit, 'GradScaler')]))"
    )
    assert got is not None and got[0] in ("ImportError", "ModuleNotFoundError"), got
    assert module in got[1] and got[2] is True, got


def test_an_unknown_attribute_is_still_an_attribute_error():
    import ampkit

    with pytest.raises(AttributeError, match="no attribute 'lightnin'"):
        ampkit.lightnin  # noqa: B018
    assert {"lightning", "accelerate", "transformers"} <= set(dir(ampkit))
