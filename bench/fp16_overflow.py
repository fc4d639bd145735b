"""Shared by stability_demo.py and scaler_comparison.py: the fp16 workload that overflows for real
(tools/models/contrastive.py, a CLIP-style model at temperature 0.01) exported once per seed, and
one ampkit-train run of it read back from its summary and metrics files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "models"))

import torch  # noqa: E402

import contrastive  # noqa: E402
from data import fashion_mnist  # noqa: E402


def export_workload(folder: str, seeds: int, temperature: float, train: int, test: int) -> None:
    """data.pt and test.pt once, model-SEED.pt per seed (its own initial weights)."""
    os.makedirs(folder, exist_ok=True)
    for split, count, name in (("train", train, "data.pt"), ("test", test, "test.pt")):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            images, labels = fashion_mnist(split, count)
            torch.save({"inputs": images, "targets": labels}, path)
    for seed in range(seeds):
        contrastive.export(os.path.join(folder, f"model-{seed}.pt"), seed, temperature=temperature)


def number(value) -> float:
    return value if isinstance(value, (int, float)) else math.nan


def torchscript_args(folder: str, seed: int, steps: int, batch: int, lr: float) -> list:
    return ["--workload", "torchscript", "--model", os.path.join(folder, f"model-{seed}.pt"),
            "--data", os.path.join(folder, "data.pt"), "--test-data", os.path.join(folder, "test.pt"),
            "--loss", "cross_entropy", "--steps", str(steps), "--batch-size", str(batch), "--lr", str(lr),
            "--seed", str(seed)]


def train(binary: str, folder: str, seed: int, steps: int, batch: int, lr: float, extra: list, tag: str) -> dict:
    """One run of the contrastive model of `seed` (see run())."""
    return run(binary, [*torchscript_args(folder, seed, steps, batch, lr), *extra], folder, f"{tag}-{seed}")


def run(binary: str, args: list, folder: str, tag: str) -> dict:
    """One ampkit-train run; returns its exit code, the summary's counts and quality, and the
    non-finite steps counted from the metrics file (every step whose loss or gradients were not
    finite), the scales it used and the mean fraction of gradient elements that were zero."""
    summary = os.path.join(folder, f"{tag}.json")
    metrics = os.path.join(folder, f"{tag}.jsonl")
    for path in (summary, metrics):
        if os.path.exists(path):
            os.remove(path)
    cmd = [binary, *args, "--threads", "1", "--progress", "never", "--summary", summary, "--metrics", metrics]
    done = subprocess.run(cmd, capture_output=True, text=True)
    out = {"code": done.returncode, "error": ""}
    if done.returncode != 0:
        out["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
    s = {}
    if os.path.exists(summary):
        with open(summary) as f:
            s = json.load(f)
    records = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            records = [json.loads(line) for line in f if line.strip()]
    out["steps_run"] = len(records)
    out["nonfinite"] = sum(1 for r in records if r.get("found_inf") or not math.isfinite(number(r.get("loss"))))
    out["nonfinite_steps"] = [r["step"] for r in records if r.get("found_inf") or not math.isfinite(number(r.get("loss")))]
    out["skipped"] = s.get("skipped_steps", 0)
    out["test_loss"] = number(s.get("test_loss"))
    out["test_accuracy"] = number(s.get("test_accuracy"))
    out["final_loss"] = number(s.get("final_loss"))
    scales = [number(r.get("scale")) for r in records]
    out["final_scale"] = scales[-1] if scales else math.nan
    finite = [sc for sc in scales if math.isfinite(sc) and sc > 0]
    out["mean_log2_scale"] = sum(math.log2(sc) for sc in finite) / len(finite) if finite else math.nan
    zeros = [number(r.get("zero_fraction")) for r in records]
    zeros = [z for z in zeros if math.isfinite(z)]
    out["zero_fraction"] = sum(zeros) / len(zeros) if zeros else math.nan
    out["seconds"] = number(s.get("wall_seconds"))
    return out
