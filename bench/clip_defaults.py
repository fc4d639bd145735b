#!/usr/bin/env python3
"""The measurements behind the clippers' per-precision defaults (docs/gradient-clipping.md,
"Defaults per precision"): for every built-in workload and precision, a run without clipping
(fp16 with the dynamic scaler) gives the distribution of the unscaled gradient norm and of the
largest gradient element on healthy steps, and a run with each clipper at its per-precision
default gives how often it clips and how much (the median clip_coef: the clipped norm over the
raw norm). Prints a Markdown table.

  python3 bench/clip_defaults.py [--bin build/bin] [--steps 300]
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import tempfile

WORKLOADS = {
    "synthetic": [],
    "fashion-mnist": ["--batch-size", "64"],
    "char-gpt": ["--batch-size", "32"],
}


def run(binary, workload, precision, steps, extra):
    with tempfile.TemporaryDirectory() as d:
        metrics = pathlib.Path(d) / "m.jsonl"
        scaler = ["--scaler", "dynamic"] if precision == "fp16" else []
        subprocess.run([str(binary), "--workload", workload, "--precision", precision, "--steps", str(steps),
                        "--progress", "never", "--eval-batches", "1", "--metrics", str(metrics), *scaler,
                        *WORKLOADS[workload], *extra], check=True, capture_output=True)
        return [json.loads(line) for line in metrics.read_text().splitlines()]


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    binary = pathlib.Path(a.bin) / "ampkit-train"
    print("| workload | precision | grad_norm p50 / p99 / max | grad_max_abs p50 / p99 / max "
          "| value: clipped steps (median clip_coef) | agc: same | adaptive: same |")
    print("|---|---|---|---|---|---|---|")
    for workload in WORKLOADS:
        for precision in ["fp32", "bf16", "fp16"]:
            records = [r for r in run(binary, workload, precision, a.steps, []) if r["stepped"]]
            norms = [r["grad_norm"] for r in records]
            maxabs = [r["grad_max_abs"] for r in records]
            cells = []
            for clipper in ("value", "agc", "adaptive"):
                clipped = [r for r in run(binary, workload, precision, a.steps, ["--clipper", clipper])
                           if r["stepped"]]
                rate = statistics.mean(1.0 if r["clipped"] else 0.0 for r in clipped)
                coef = statistics.median(r["clip_coef"] for r in clipped)
                cells.append(f"{rate:.0%} ({coef:.3g})")
            fmt = lambda xs: " / ".join(f"{v:.3g}" for v in (quantile(xs, 0.5), quantile(xs, 0.99), max(xs)))
            print(f"| {workload} | {precision} | {fmt(norms)} | {fmt(maxabs)} | " + " | ".join(cells) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
