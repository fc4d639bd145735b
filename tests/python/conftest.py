"""pytest set-up for the Python package's tests: import ampkit from the build tree."""

import os
import sys

import torch

_BUILD = os.environ.get("AMPKIT_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
sys.path.insert(0, os.path.abspath(os.path.join(_BUILD, "python")))
torch.set_num_threads(1)
