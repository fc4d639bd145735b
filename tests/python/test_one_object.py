"""ampkit.GradScaler is one object: a torch.amp.GradScaler subclass that owns torch's call-order
state and calls its helpers, never inherits them (docs/python.md, "GradScaler"), over one typed
face of its C++ side."""

import inspect
import os
import re

import torch

import ampkit
from ampkit import _deferred, _scaler_core

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "ampkit")


def test_its_mro_holds_no_ampkit_class_but_itself():
    mro = ampkit.GradScaler.__mro__
    ours = [c for c in mro if c.__module__.split(".")[0] == "ampkit"]
    assert ours == [ampkit.GradScaler]
    assert mro[1] is torch.amp.GradScaler
    assert len(mro) == len(torch.amp.GradScaler.__mro__) + 1


def test_only_the_typed_wrapper_touches_the_cpp_class():
    # Every call into torch.classes.ampkit.ScalerCore goes through ampkit._scaler_core.ScalerCore,
    # whose methods mypy checks; the custom class itself is typed Any by torch.
    touching = []
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
                if re.search(r"classes\.ampkit\.ScalerCore", f.read()):
                    touching.append(name)
    assert touching == ["_scaler_core.py"]
    scaler = ampkit.GradScaler("cpu")
    assert isinstance(scaler._core, _scaler_core.ScalerCore)
    signature = inspect.signature(_scaler_core.ScalerCore.unscale)
    assert list(signature.parameters) == ["self", "slot", "fold", "loss"]


def test_the_iteration_is_counted_once_in_torchs_per_optimizer_records():
    # The deferred step keeps no count of its own: how many optimizers an iteration unscaled is read
    # from the per-optimizer records, which update() starts afresh.
    mode = _deferred.DeferredMode("auto")
    assert not hasattr(mode, "steps_in_iteration") and not hasattr(mode, "in_iteration")
    model = torch.nn.Linear(4, 2)
    opts = [torch.optim.SGD([model.weight], lr=0.1), torch.optim.SGD([model.bias], lr=0.1)]
    scaler = ampkit.GradScaler("cpu", sync="step")
    for _ in range(2):
        scaler.scale(model(torch.ones(3, 4)).sum()).backward()
        for i, opt in enumerate(opts):
            assert scaler.step(opt) is True
            unscaled = [s["unscaled"] for s in scaler._per_optimizer_states.values()]
            assert unscaled == [True] * (i + 1)
        scaler.update()
        assert len(scaler._per_optimizer_states) == 0
    assert scaler.get_scale() == 65536.0
