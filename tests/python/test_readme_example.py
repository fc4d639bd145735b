"""The README's "Python in 30 seconds" runs as printed, on the CPU, in a fresh interpreter."""

import os
import re
import subprocess
import sys

import ampkit

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_the_readme_python_example_runs_and_steps():
    blocks = re.findall(r"```python\n(.*?)```", open(README).read(), re.S)
    example = blocks[0]
    assert "ampkit.GradScaler(" in example and "scaler.step(optimizer)" in example
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ampkit.__file__)))
    done = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.splitlines()[-1].split()
    # 10 healthy steps at torch's default scale (growth every 2000): the scale stays 65536, the
    # norm clipper saw a finite unscaled norm.
    assert last[:2] == ["scale", "65536.0"] and last[2:4] == ["grad", "norm"], done.stdout
    assert 0.0 < float(last[4]) < 100.0
