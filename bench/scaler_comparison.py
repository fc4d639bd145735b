#!/usr/bin/env python3
"""Loss scalers at their defaults on long fp16 runs (a benchmark, not a test): `dynamic` against
`predictive` (and any other scaler named), each with every option at its default, on runs long
enough for dynamic's growth_interval (2000) to act many times: 20,000 steps by default, 10 growth
intervals. Two workloads:

  contrastive  tools/models/contrastive.py (CLIP-style, temperature 0.01), whose fp16 gradients
               overflow for real at torch's default scale, by ampkit-train --workload torchscript
  synthetic    ampkit-train's MLP (width 256, depth 4)

Prints a Markdown table per workload: non-finite (skipped) steps, where they fell, the mean log2
of the scale used, the fraction of gradient elements that were exactly zero (underflow), final
and test loss; writes a CSV of the per-run rows.

    bench/scaler_comparison.py [--build build] [--seeds 3] [--steps 20000] [--csv out.csv]
    bench/scaler_comparison.py --scalers "predictive:margin=64" --workloads contrastive
"""
import argparse
import csv
import math
import os
import statistics
import sys
import tempfile

from fp16_overflow import export_workload, run, torchscript_args

SYNTHETIC = ["--workload", "synthetic", "--synthetic-width", "256", "--synthetic-depth", "4", "--batch-size", "64",
             "--lr", "1e-3"]


def workload_args(name, folder, seed, steps):
    if name == "contrastive":
        return torchscript_args(folder, seed, steps, 64, 3e-3)
    return [*SYNTHETIC, "--steps", str(steps), "--seed", str(seed)]


def fmt(values, digits=4):
    ok = [v for v in values if math.isfinite(v)]
    return f"{statistics.median(ok):.{digits}f}" if ok else "-"


def where(steps, total):
    """The non-finite steps by tenth of the run, e.g. 5,0,1,0,... (the first tenth holds the settling)."""
    tenths = [0] * 10
    for s in steps:
        tenths[min(9, s * 10 // total)] += 1
    return " ".join(str(t) for t in tenths)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build folder holding bin/ampkit-train")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per scaler and workload (default 3)")
    ap.add_argument("--steps", type=int, default=20000, help="optimizer steps per run (default 20000)")
    ap.add_argument("--scalers", default="dynamic,predictive",
                    help="space-separated scalers, each at its defaults or NAME:OPTION=VALUE,... (default: dynamic predictive)")
    ap.add_argument("--workloads", default="contrastive,synthetic", help="comma-separated: contrastive, synthetic")
    ap.add_argument("--work", default="", help="folder for the exported models and run files (default: temporary)")
    ap.add_argument("--csv", default="", help="also write the per-run rows here")
    args = ap.parse_args()
    binary = os.path.join(args.build, "bin", "ampkit-train")
    if not os.access(binary, os.X_OK):
        sys.exit(f"scaler_comparison.py: {binary} not found: build first (tools/test.sh or cmake --build build)")
    workloads = args.workloads.split(",")
    scalers = args.scalers.replace(",", " ").split() if ":" not in args.scalers else args.scalers.split()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.work or tmp
        if "contrastive" in workloads:
            export_workload(folder, args.seeds, 0.01, 6000, 1000)
        for seed in range(args.seeds):
            for workload in workloads:
                for scaler in scalers:
                    name, _, options = scaler.partition(":")
                    opts = [w for o in options.split(",") if o for w in ("--opt", f"scaler.{o}")]
                    tag = f"{workload}-{scaler.replace(':', '-').replace(',', '-').replace('=', '')}-{seed}"
                    r = run(binary, [*workload_args(workload, folder, seed, args.steps), "--precision", "fp16",
                                     "--scaler", name, *opts, "--nan-policy", "skip"], folder, tag)
                    r.update(workload=workload, scaler=scaler, seed=seed)
                    rows.append(r)
                    print(f"  seed {seed} {workload} {scaler:10s} exit {r['code']} non-finite {r['nonfinite']} "
                          f"log2 scale {r['mean_log2_scale']:.2f} test loss {r['test_loss']:.4f} {r['error'][:80]}",
                          file=sys.stderr)
    print(f"\nfp16, every scaler option at its default, {args.steps} steps, {args.seeds} seeds, nan_policy skip; "
          "medians over seeds except the sums")
    for workload in workloads:
        print(f"\n{workload}:\n")
        print("| scaler | non-finite steps (sum) | per run | by tenth of the run (sum) | mean log2 scale | zero gradient "
              "elements | final loss | test loss | failed runs |")
        print("|---|---|---|---|---|---|---|---|---|")
        for scaler in scalers:
            rs = [r for r in rows if r["workload"] == workload and r["scaler"] == scaler]
            steps = [s for r in rs for s in r["nonfinite_steps"]]
            print(f"| {scaler} | {sum(r['nonfinite'] for r in rs)} | {' '.join(str(r['nonfinite']) for r in rs)} | "
                  f"{where(steps, args.steps)} | {fmt([r['mean_log2_scale'] for r in rs], 2)} | "
                  f"{fmt([r['zero_fraction'] for r in rs])} | {fmt([r['final_loss'] for r in rs])} | "
                  f"{fmt([r['test_loss'] for r in rs])} | {sum(r['code'] != 0 for r in rs)}/{len(rs)} |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "nonfinite_steps"], extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
