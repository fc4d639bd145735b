#!/usr/bin/env python3
"""Loss-scaler comparison (a benchmark, not a test): none / static / dynamic / predictive on fp16
workloads over several seeds; prints a table of skipped steps, non-finite events, underflow
(fraction of gradient elements exactly zero) and final loss, and writes a CSV.

    tools/bench/scaler_comparison.py [--build build] [--seeds 3] [--steps 300] [--csv out.csv]
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKLOADS = {
    # An aggressive learning rate makes fp16 overflow for real.
    "char-gpt": ["--workload", "char-gpt", "--gpt-width", "64", "--gpt-layers", "2", "--gpt-heads", "4",
                 "--gpt-context", "32", "--batch-size", "16", "--lr", "3e-3"],
    "synthetic": ["--workload", "synthetic", "--synthetic-width", "256", "--synthetic-depth", "4",
                  "--batch-size", "64", "--lr", "3e-3"],
}
SCALERS = {
    "none": [],
    "static": ["--opt", "scaler.scale=65536"],
    "dynamic": ["--opt", "scaler.growth_interval=100"],
    "predictive": [],
}


def run(binary, workload, scaler, seed, steps, tmp):
    summary = os.path.join(tmp, f"{workload}-{scaler}-{seed}.json")
    metrics = os.path.join(tmp, f"{workload}-{scaler}-{seed}.jsonl")
    cmd = [binary, *WORKLOADS[workload], "--precision", "fp16", "--steps", str(steps), "--seed", str(seed),
           "--scaler", scaler, *SCALERS[scaler], "--opt", "nan_policy.max_consecutive=0", "--progress", "never",
           "--eval-batches", "4", "--summary", summary, "--metrics", metrics]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"crashed": True, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    s = json.load(open(summary))
    zeros = [json.loads(line)["zero_fraction"] for line in open(metrics)]
    zeros = [z for z in zeros if isinstance(z, float)]
    loss = s["final_loss"]
    return {"crashed": False, "skipped": s["skipped_steps"], "nan_events": s["nan_events"],
            "underflow": statistics.mean(zeros) if zeros else float("nan"),
            "final_loss": loss if isinstance(loss, float) else float("nan"),
            "seconds": s["wall_seconds"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build folder holding bin/ampkit-train")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per configuration")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    ap.add_argument("--workloads", default="synthetic,char-gpt", help="comma-separated")
    ap.add_argument("--csv", default="", help="also write the per-run rows here")
    args = ap.parse_args()
    binary = os.path.join(args.build, "bin", "ampkit-train")
    if not os.access(binary, os.X_OK):
        sys.exit(f"scaler_comparison: {binary} not found; build first (tools/test.sh or tools/run.sh)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads.split(","):
            for scaler in SCALERS:
                for seed in range(args.seeds):
                    r = run(binary, workload, scaler, seed, args.steps, tmp)
                    rows.append({"workload": workload, "scaler": scaler, "seed": seed, **r})
                    print(f"  {workload:9s} {scaler:10s} seed {seed}: {r}", file=sys.stderr, flush=True)
    print(f"\nfp16, {args.steps} steps, seeds 0..{args.seeds - 1}; mean over seeds (crashed runs excluded)\n")
    print(f"| workload | scaler | crashed | skipped steps | non-finite events | underflow (zero grads) | final loss |")
    print(f"|---|---|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        for scaler in SCALERS:
            rs = [r for r in rows if r["workload"] == workload and r["scaler"] == scaler]
            ok = [r for r in rs if not r["crashed"]]
            mean = lambda k: statistics.mean(r[k] for r in ok) if ok else float("nan")
            print(f"| {workload} | {scaler} | {len(rs) - len(ok)}/{len(rs)} | {mean('skipped'):.1f} | "
                  f"{mean('nan_events'):.1f} | {100 * mean('underflow'):.2f}% | {mean('final_loss'):.4f} |")
    if args.csv:
        keys = ["workload", "scaler", "seed", "crashed", "skipped", "nan_events", "underflow", "final_loss", "seconds", "error"]
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
