#!/usr/bin/env python3
"""ampkit.GradScaler against torch.amp.GradScaler + clip_grad_norm_ in the same Python loop.

    PYTHONPATH=build/python python3 bench/python_overhead.py [--workload mlp-10m]
        [--precision fp32|bf16|fp16] [--optimizer fused|foreach] [--threads 2] [--rounds 7] [--steps 20]

Both ways train the same model (bench/throughput_comparison.py's mlp presets: 4 hidden
layers as wide as the input) with the same batches and AdamW, the loss scaled in every precision
(fp32: no autocast, so the time is the framework's, not the CPU's fp16 emulation: an fp16 CPU step
of mlp-10m takes seconds and buries the difference); torch's way is
the recipe its docs give for clipping (scale, backward, unscale_, clip_grad_norm_, step,
update), ampkit's is scale, backward, step, update with clipper "norm" at the same max_norm. The
rounds alternate A B A B; each round times `--steps` steps after one untimed step. Printed per
way: the median over rounds of the median step time, the post-backward part (from backward's
return to update's), and the ratios ampkit / torch. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

PRESETS = {"mlp-1m": (500, 4, 500), "mlp-10m": (1580, 4, 1580), "mlp-100m": (5000, 4, 5000)}


def model_for(workload: str) -> torch.nn.Module:
    inputs, depth, width = PRESETS[workload]
    sizes = [inputs] + [width] * depth + [10]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    torch.manual_seed(0)
    return torch.nn.Sequential(*layers)


class Way:
    def __init__(self, name: str, args: argparse.Namespace) -> None:
        import ampkit

        self.name = name
        self.model = model_for(args.workload)
        fused = args.optimizer == "fused"
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=fused, foreach=None if fused else True)
        self.max_norm = args.max_norm
        self.dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
        if name == "torch":
            self.scaler = torch.amp.GradScaler("cpu")
        else:
            self.scaler = ampkit.GradScaler("cpu", clipper="norm", precision=args.precision,
                                            opt={"clipper.max_norm": args.max_norm})
        gen = torch.Generator().manual_seed(1)
        inputs = PRESETS[args.workload][0]
        self.batches = [(torch.randn(args.batch_size, inputs, generator=gen),
                         torch.randint(0, 10, (args.batch_size,), generator=gen)) for _ in range(4)]

    def step(self, i: int) -> float:
        """One training step; returns the seconds from backward's return to update's."""
        x, y = self.batches[i % len(self.batches)]
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype is not None):
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.scaler.scale(loss).backward()
        start = time.perf_counter()
        if self.name == "torch":
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
        self.scaler.step(self.opt)
        self.scaler.update()
        return time.perf_counter() - start

    def round(self, steps: int) -> tuple:
        self.step(0)
        totals, posts = [], []
        for i in range(steps):
            t0 = time.perf_counter()
            posts.append(self.step(i + 1))
            totals.append(time.perf_counter() - t0)
        return statistics.median(totals), statistics.median(posts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mlp-10m", choices=sorted(PRESETS))
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="CPU autocast dtype; the loss is scaled in each (default fp32)")
    p.add_argument("--optimizer", default="fused", choices=["fused", "foreach"],
                   help="AdamW(fused=True) (torch's best recipe, default) or AdamW(foreach=True)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds per way (default 7)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per round (default 20)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per step (default 256)")
    p.add_argument("--max-norm", type=float, default=1.0, help="clip_grad_norm_'s max_norm (default 1.0)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ways = [Way("torch", args), Way("ampkit", args)]
    results = {w.name: [] for w in ways}
    for _ in range(args.rounds):
        for w in ways:
            results[w.name].append(w.round(args.steps))
    print(f"{args.workload}, AdamW({args.optimizer}), {args.precision}, loss scaled, batch {args.batch_size}, "
          f"{args.threads} threads, {args.rounds} rounds x {args.steps} steps, median of round medians "
          f"(min-max over rounds)")
    print()
    print("| way | step ms | post-backward ms |")
    print("|---|---|---|")
    med = {}
    for name, rows in results.items():
        steps = [r[0] * 1e3 for r in rows]
        posts = [r[1] * 1e3 for r in rows]
        med[name] = (statistics.median(steps), statistics.median(posts))
        print(f"| {name} | {med[name][0]:.2f} ({min(steps):.2f}-{max(steps):.2f}) | "
              f"{med[name][1]:.3f} ({min(posts):.3f}-{max(posts):.3f}) |")
    print()
    print(f"ampkit / torch: step {med['ampkit'][0] / med['torch'][0]:.3f}, "
          f"post-backward {med['ampkit'][1] / med['torch'][1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
