#!/usr/bin/env python3
"""The example models of tools/models/ trained by ampkit-train (--workload torchscript) and by a
Python eager loop with AdamW(fused=True), side by side.

    python3 bench/own_model_comparison.py [--build build] [--models vlm,unet] [--steps 300]
        [--batch-size 16] [--threads 2] [--precisions bf16,fp16] [--out DIR]

For each model and precision, in this order: ampkit-train on the scripted model (fp16 with the
dynamic scaler, bf16 without one; AdamW, lr 1e-3, weight decay 0.01, --data-order file) and then
the same model class, from the same initial weights, in a plain eager loop over the same batches
(torch.autocast, torch.amp.GradScaler for fp16, AdamW(fused=True) with the same settings). Prints
a markdown table: samples/s (wall time of the training steps; ampkit-train's summary figure), the
mean loss of the first and of the last 10 steps, and skipped steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "models"))

import unet_ddpm  # noqa: E402
import vlm  # noqa: E402

MODELS = {
    "vlm": (vlm, lambda: vlm.VisionLanguageModel(64, caption_length=24)),
    "unet": (unet_ddpm, lambda: unet_ddpm.UNet(16)),
}


def export(name: str, folder: str) -> None:
    module, _ = MODELS[name]
    subprocess.run([sys.executable, module.__file__, folder, "--train", "6000", "--test", "500"], check=True,
                   capture_output=True)


def run_ampkit(build: str, folder: str, precision: str, args) -> dict:
    metrics, summary = os.path.join(folder, f"m-{precision}.jsonl"), os.path.join(folder, f"s-{precision}.json")
    cmd = [os.path.join(build, "bin", "ampkit-train"), "--workload", "torchscript", "--model",
           os.path.join(folder, "model.pt"), "--data", os.path.join(folder, "data.pt"), "--loss", "returned",
           "--data-order", "file", "--precision", precision, "--scaler", "dynamic" if precision == "fp16" else "none",
           "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--threads", str(args.threads),
           "--lr", "0.001", "--progress", "never", "--metrics", metrics, "--summary", summary]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, AMPKIT_PLUGIN_PATH=""))
    losses = [json.loads(line)["loss"] for line in open(metrics)]
    s = json.load(open(summary))
    return {"samples_per_second": s["samples_per_second"], "losses": losses, "skipped": s["skipped_steps"]}


def run_eager(name: str, folder: str, precision: str, args) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = MODELS[name][1]()  # the exported module's initial weights (same seed, same class)
    data = torch.load(os.path.join(folder, "data.pt"), weights_only=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    torch.manual_seed(0)
    losses, skipped, b = [], 0, args.batch_size
    start = time.perf_counter()
    for step in range(args.steps):
        i = step % (len(data["inputs"]) // b)
        x, y = data["inputs"][i * b:(i + 1) * b], data["targets"][i * b:(i + 1) * b]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped += int(scaler.is_enabled() and scaler.get_scale() < scale)
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    return {"samples_per_second": args.steps * b / seconds, "losses": losses, "skipped": skipped}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--models", default="vlm,unet")
    p.add_argument("--precisions", default="bf16,fp16")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="folder for the exported models (default: a temporary one)")
    args = p.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="ampkit-own-models-")
    print(f"{args.steps} steps, batch {args.batch_size}, {args.threads} threads, CPU, torch {torch.__version__}")
    print()
    print("| model | precision | way | samples/s | loss, first 10 steps | loss, last 10 steps | skipped |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        export(name, folder)
        for precision in args.precisions.split(","):
            for way, result in (("ampkit-train", run_ampkit(args.build, folder, precision, args)),
                                ("PyTorch eager, AdamW(fused=True)", run_eager(name, folder, precision, args))):
                first, last = result["losses"][:10], result["losses"][-10:]
                print(f"| {name} | {precision} | {way} | {result['samples_per_second']:.1f} | "
                      f"{sum(first) / len(first):.4f} | {sum(last) / len(last):.4f} | {result['skipped']} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
