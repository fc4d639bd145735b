#!/usr/bin/env python3
"""NaN-recovery stability demo (a benchmark, not a test): the same fp16 workload over several
seeds, each seed with the same faults planted (a NaN in one layer's output, a x1000 spike in
another's, at seed-dependent steps, through ampkit-train --inject), trained three ways:

  static/abort      static loss scale 65536, no recovery (abort at the first bad step)
  dynamic/skip      dynamic loss scaler, skip bad steps (spike detection on)
  dynamic/rollback  dynamic loss scaler, roll back to an in-memory snapshot (spike detection on)

A run failed when it crashed (exit code != 0) or diverged (test loss not finite or more than
twice the fault-free fp32 run's test loss for the same seed). Prints a table and the
reduction in failures of each recovery configuration against static/abort.

    tools/bench/stability_demo.py [--build build] [--seeds 8] [--steps 200] [--csv out.csv]
"""
import argparse
import csv
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile

WORKLOAD = ["--workload", "synthetic", "--synthetic-width", "64", "--synthetic-depth", "3",
            "--batch-size", "64", "--lr", "3e-3", "--threads", "1", "--progress", "never", "--eval-batches", "2"]
LAYERS = ["layers.0", "layers.1", "layers.2", "layers.3"]
SPIKES = ["--opt", "nan_policy.spike_zscore=6"]
CONFIGS = {
    "static/abort": ["--scaler", "static", "--opt", "scaler.scale=65536", "--nan-policy", "abort",
                     "--opt", "nan_policy.tolerate_overflow=false"],
    "dynamic/skip": ["--scaler", "dynamic", "--nan-policy", "skip", *SPIKES],
    "dynamic/rollback": ["--scaler", "dynamic", "--nan-policy", "rollback", "--opt", "nan_policy.snapshot_every=20",
                         "--opt", "nan_policy.skip_batches=2", *SPIKES],
}


def faults(seed, steps):
    rng = random.Random(seed)
    nan_step, spike_step = rng.sample(range(steps // 4, steps - 10), 2)
    return ["--inject", f"nan@step={nan_step},layer={rng.choice(LAYERS)}",
            "--inject", f"spike@step={spike_step},layer={rng.choice(LAYERS)}"]


def train(binary, args, tmp, name):
    summary = os.path.join(tmp, name + ".json")
    done = subprocess.run([binary, *args, "--summary", summary, "--nan-report-dir", tmp],
                          capture_output=True, text=True)
    out = {"code": done.returncode}
    if os.path.exists(summary):
        with open(summary) as f:
            out.update(json.load(f))
    if done.returncode != 0:
        out["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
    return out


def test_loss(s):
    v = s.get("test_loss")
    return v if isinstance(v, (int, float)) else math.nan


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    binary = os.path.join(a.build, "bin", "ampkit-train")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seeds):
            common = [*WORKLOAD, "--steps", str(a.steps), "--seed", str(seed)]
            clean = train(binary, [*common, "--precision", "fp32"], tmp, f"clean-{seed}")
            reference = test_loss(clean)
            for name, extra in CONFIGS.items():
                s = train(binary, [*common, "--precision", "fp16", *extra, *faults(seed, a.steps)], tmp,
                          f"{name.replace('/', '-')}-{seed}")
                loss = test_loss(s)
                crashed = s["code"] != 0
                diverged = not crashed and (not math.isfinite(loss) or loss > 2 * reference)
                rows.append({"config": name, "seed": seed, "crashed": crashed, "diverged": diverged,
                             "nan_events": s.get("nan_events", 0), "skipped": s.get("skipped_steps", 0),
                             "rollbacks": s.get("rollbacks", 0), "test_loss": loss, "reference_loss": reference,
                             "error": s.get("error", "")})
                print(f"  seed {seed} {name:17s} exit {s['code']} test loss {loss:.4g} (fp32 clean {reference:.4g})",
                      file=sys.stderr)

    print(f"\nfp16 synthetic MLP, {a.steps} steps, {a.seeds} seeds; faults per seed: 1 NaN + 1 x1000 spike")
    print(f"{'config':18s} {'crashed':>8s} {'diverged':>9s} {'failed':>7s} {'NaN events':>11s} {'skipped':>8s}"
          f" {'rollbacks':>10s} {'test loss (ok runs)':>20s}")
    failed = {}
    for name in CONFIGS:
        rs = [r for r in rows if r["config"] == name]
        ok = [r["test_loss"] for r in rs if not r["crashed"] and not r["diverged"]]
        failed[name] = sum(r["crashed"] or r["diverged"] for r in rs)
        loss = f"{statistics.mean(ok):.4f}" if ok else "-"
        print(f"{name:18s} {sum(r['crashed'] for r in rs):8d} {sum(r['diverged'] for r in rs):9d}"
              f" {failed[name]:7d} {sum(r['nan_events'] for r in rs):11d} {sum(r['skipped'] for r in rs):8d}"
              f" {sum(r['rollbacks'] for r in rs):10d} {loss:>20s}")
    base = failed["static/abort"]
    for name in list(CONFIGS)[1:]:
        if base:
            print(f"failures {name} vs static/abort: {base} -> {failed[name]} "
                  f"({100.0 * (base - failed[name]) / base:.0f}% fewer)")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
