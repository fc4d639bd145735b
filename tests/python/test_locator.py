"""The NaN locator for Python modules: names the first module whose output or gradient went
non-finite, in ampkit-train's report form, and hooks nothing on healthy steps."""

import json
import math
import os
import subprocess

import torch

import ampkit


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


def loss_of(model, x):
    def closure():
        with torch.autocast("cpu", dtype=torch.float16):
            return torch.nn.functional.cross_entropy(model(x), torch.zeros(len(x), dtype=torch.long))

    return closure


def test_first_non_finite_output_is_named_with_its_summary():
    model = Net()
    with torch.no_grad():
        model.blocks[2].weight.mul_(1e5)  # the block's last Linear overflows fp16 on large inputs
    x = torch.full((4, 8), 30.0)
    report = ampkit.NanLocator(model).locate(loss_of(model, x))
    assert report["located"] is True
    assert (report["module"], report["module_type"], report["phase"]) == ("blocks.2", "Linear", "forward")
    assert report["finding"] == "first non-finite output"
    out = report["observation"]["output"]
    assert out["dtype"] == "Half" and out["shape"] == [4, 16] and out["nonfinite"] > 0
    # Every module before it was observed finite, in execution order.
    assert [o["module"] for o in report["forward"][:3]] == ["embed", "blocks.0", "blocks.1"]
    assert all(o["output"]["nonfinite"] == 0 for o in report["forward"][:3])
    assert all(p.grad is None for p in model.parameters())


def test_overflowing_gradient_is_found_in_backward_order_at_the_scale():
    model = Net()
    x = torch.randn(4, 8)
    # Finite forward; at a scale of 1e38 the gradients overflow fp32 nearest the loss first.
    report = ampkit.NanLocator(model).locate(loss_of(model, x), scale=1e38)
    assert report["located"] is True and report["phase"] == "backward"
    assert report["module"] == "head"
    assert report["observation"]["gradient"]["nonfinite"] > 0


def test_a_healthy_re_run_locates_nothing_and_no_hook_stays():
    model = Net()
    x = torch.randn(4, 8)
    report = ampkit.NanLocator(model).locate(loss_of(model, x))
    assert report["located"] is False and report["module"] == ""
    # embed, blocks.0-2, the Sequential "blocks" itself (its hook fires after its last layer), head
    assert [o["module"] for o in report["forward"]] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks", "head"]
    assert all(not m._forward_hooks for m in model.modules())


def test_grad_scaler_locate_reports_the_skipped_step():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = ampkit.GradScaler("cpu", model=model, init_scale=1024.0)
    x = torch.randn(4, 8)
    x[1, 3] = math.nan  # a bad input: the embedding's output is the first non-finite value
    closure = loss_of(model, x)
    scaler.scale(closure()).backward()
    assert scaler.step(opt) is False
    report = scaler.locate(closure)
    scaler.update()
    assert report["step"] == 0 and report["action"] == "skip" and report["loss_scale"] == 1024.0
    assert (report["module"], report["phase"], report["located"]) == ("embed", "forward", True)
    assert report["observation"]["input"]["nonfinite"] == 1


def _key_tree(report):
    """The report's keys, and those of its observation and of each kind of observed entry."""
    entries = report.get("forward", []) + report.get("backward", [])
    return {
        "report": sorted(report),
        "observation": sorted(report["observation"]),
        "observation.output": sorted(report["observation"]["output"]),
        "entries": sorted({key for entry in entries for key in entry}),
    }


def test_the_report_has_ampkit_train_s_keys_for_the_same_fault(tmp_path):
    """One layout (core/engine's nan_report.h) for both: a non-finite forward output found by
    ampkit-train's locator and by GradScaler.locate gives the same keys at every level."""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    build = os.path.abspath(os.environ.get("AMPKIT_BUILD_DIR", os.path.join(root, "build")))
    args = ["--workload", "synthetic", "--synthetic-inputs", "8", "--synthetic-width", "16", "--batch-size", "8",
            "--steps", "3", "--progress", "never", "--threads", "1", "--inject", "nan@step=1,layer=layers.0",
            "--nan-report-dir", str(tmp_path)]
    run = subprocess.run([os.path.join(build, "bin", "ampkit-train"), *args], capture_output=True, text=True,
                         env=dict(os.environ, AMPKIT_PLUGIN_PATH=""))
    assert run.returncode == 0, run.stderr
    with open(tmp_path / "nan-report-step-1-rank-0.json") as f:
        host = json.load(f)
    assert (host["phase"], host["located"]) == ("forward", True)

    model = Net()
    scaler = ampkit.GradScaler("cpu", model=model)
    x = torch.randn(4, 8)
    x[1, 3] = math.nan  # the embedding's output is the first non-finite value
    closure = loss_of(model, x)
    scaler.scale(closure()).backward()
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.01)) is False
    python = scaler.locate(closure)
    assert (python["phase"], python["located"]) == ("forward", True)
    assert _key_tree(python) == _key_tree(host)
