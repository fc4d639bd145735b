#!/usr/bin/env python3
"""GPT-2 in bf16 against ampkit.fp8 (recipes current and delayed): tokens/s and the loss after N steps.

    PYTHONPATH=build/python python3 bench/gpu_fp8.py [--device cuda|cpu] [--tiny] [--steps 20] [--warmup 3]
        [--recipes bf16,current,delayed]

Hugging Face transformers' GPT2LMHeadModel from GPT2Config, randomly initialised, built as
bench/gpu_models.py builds it (124M, batch 8 x 512 tokens; --tiny: 2 layers, 64 wide, vocab 256,
2 x 32 tokens), one copy of the same initial weights per row, the same batches, AdamW(lr=1e-4,
fused on CUDA), forward under autocast(device, bfloat16). The fp8 rows first swap GPT-2's
transformers Conv1D layers for the nn.Linear they compute (weight transposed), then
ampkit.fp8.convert(model, recipe=...) every nn.Linear but lm_head (on CUDA torch._scaled_mm needs
K and N multiples of 16, and the vocabulary, 50257, is not), so their matmuls are torch._scaled_mm:
cuBLASLt on a GPU, ATen's CPU kernel otherwise. Each row runs --warmup untimed steps, then --steps
timed ones; tokens/s is the timed steps' tokens over their wall time (the device synchronised at
both ends). The loss is that of the last step.

On CUDA fp8 matmuls need compute capability 8.9 or newer (Ada, Hopper): on an older GPU the fp8
rows say so and run nothing. Exit status: 0, or 1 when a row's loss is not finite; 2 for bad
arguments. Without a CUDA device, --device cuda prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_models import SIZES, build_gpt2, device_name, versions  # noqa: E402


def conv1d_to_linear(model: torch.nn.Module) -> int:
    """Swaps each transformers Conv1D (x @ W + b, W [in, out]) for the nn.Linear computing the same."""
    from transformers.pytorch_utils import Conv1D

    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                lin = torch.nn.Linear(child.weight.shape[0], child.nf, device=child.weight.device)
                with torch.no_grad():
                    lin.weight.copy_(child.weight.t())
                    lin.bias.copy_(child.bias)
                setattr(parent, name, lin)
                swapped += 1
    return swapped


def fp8_unsupported(device: str) -> str:
    """Why this device cannot run fp8 matmuls; empty when it can."""
    if device != "cuda":
        return ""
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < (8, 9):
        return f"torch._scaled_mm on CUDA needs compute capability 8.9 or newer; this GPU has {major}.{minor}"
    return ""


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(base: torch.nn.Module, data: list, loss_fn, recipe: str, args: argparse.Namespace) -> dict:
    import ampkit.fp8

    model = copy.deepcopy(base)
    layers = 0
    if recipe != "bf16":
        conv1d_to_linear(model)
        ampkit.fp8.convert(model, recipe=recipe, module_filter_fn=lambda m, fqn: fqn != "lm_head")
        layers = sum(isinstance(m, ampkit.fp8.Linear) for m in model.modules())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
    loss = torch.zeros(())
    t0 = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync(args.device)
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16):
            loss = loss_fn(model, data[i % len(data)])
        loss.backward()
        opt.step()
    sync(args.device)
    seconds = time.perf_counter() - t0
    tokens = args.steps * data[0].numel()
    return {"tokens_per_s": tokens / seconds, "loss": float(loss.detach()), "layers": layers}


def main(argv: list) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="the tiny GPT-2 of bench/gpu_models.py, for a CPU")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--recipes", default="bf16,current,delayed")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    recipes = args.recipes.split(",")
    if args.steps < 1 or args.warmup < 0 or any(r not in ("bf16", "current", "delayed", "predictive") for r in recipes):
        p.error("--steps must be >= 1, --warmup >= 0, --recipes among bf16, current, delayed, predictive")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no GPU: nothing to measure (torch sees no CUDA device)")
        return 0
    torch.manual_seed(args.seed)
    size = SIZES["tiny" if args.tiny else "full"]["gpt2"]
    gen = torch.Generator().manual_seed(args.seed + 1)
    base, data, loss_fn = build_gpt2(size, args.device, gen, max(1, min(8, args.warmup + args.steps)))
    why = fp8_unsupported(args.device)
    print(f"Device: {device_name(args.device)}; {versions()}")
    print(
        f"GPT-2 ({'tiny' if args.tiny else '124M'}: {sum(q.numel() for q in base.parameters()) / 1e6:.2f}M "
        f"parameters, batch {size['batch']} x {size['seq']} tokens), {args.warmup} warm-up + {args.steps} timed steps\n"
    )
    print("| GPT-2 | matmuls | fp8 layers | tokens/s | loss after the last step | check |")
    print("|---|---|---|---|---|---|")
    failed = False
    for recipe in recipes:
        label = "bf16 autocast" if recipe == "bf16" else f"ampkit.fp8 {recipe}"
        if recipe != "bf16" and why:
            print(f"| {label} | fp8 | - | - | - | skipped: {why} |")
            continue
        r = run(base, data, loss_fn, recipe, args)
        ok = math.isfinite(r["loss"])
        failed |= not ok
        print(
            f"| {label} | {'bf16' if recipe == 'bf16' else 'fp8 torch._scaled_mm'} | {r['layers']} | "
            f"{r['tokens_per_s']:.0f} | {r['loss']:.4f} | {'ok' if ok else 'FAILED: loss not finite'} |",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
