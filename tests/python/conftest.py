"""pytest set-up for the Python package's tests: import ampkit from the build tree."""

import os
import sys

import pytest
import torch

_BUILD = os.environ.get("AMPKIT_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
sys.path.insert(0, os.path.abspath(os.path.join(_BUILD, "python")))
torch.set_num_threads(1)


@pytest.fixture
def capture_flag(monkeypatch):
    """A switch that makes ampkit.GradScaler see a CUDA graph capture under way (CPU tensors): the
    capture tests' stand-in for torch.cuda.graph."""
    import ampkit._deferred as deferred_module

    flag = {"on": False}
    monkeypatch.setattr(deferred_module, "capturing", lambda cuda: flag["on"])
    return flag
