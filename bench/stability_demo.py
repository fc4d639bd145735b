#!/usr/bin/env python3
"""fp16 stability study (a benchmark, not a test): how many steps overflow for real, and how many
runs fail, per loss-scaling configuration, with the recovery policy held fixed.

The workload is tools/models/contrastive.py (a CLIP-style image-text model whose logits are cosine
similarities over a learnable temperature starting at 0.01, pretrained CLIP's logit scale of 100),
trained by `ampkit-train --workload torchscript` in fp16; nothing is planted. Each seed has its own
initial weights and data order. Six scaling configurations, each under two NaN policies:

  skip   skip a step whose loss or gradients are not finite (the run aborts after 50 in a row)
  abort  stop the run at the first non-finite step (tolerate_overflow=false: what a loop with a
         fixed scale and no skipping does)

so that the effect of scaling (rows) and of recovery (columns) show apart. A run failed when it
exited non-zero or its test loss is not finite. Occurrences are non-finite steps, read from the
metrics file of every run (an aborted run's included). The hand-tuned static scale is found the
way a user would: the largest power of two <= 65536 under which seed 0 trains `--tune-steps`
steps without one overflow (with abort), unless --static-tuned gives it.

    bench/stability_demo.py [--build build] [--seeds 10] [--steps 1000] [--csv out.csv]
"""
import argparse
import csv
import math
import os
import statistics
import sys
import tempfile

from fp16_overflow import export_workload, train

POLICIES = {
    "skip": ["--nan-policy", "skip"],
    "abort": ["--nan-policy", "abort", "--opt", "nan_policy.tolerate_overflow=false"],
}


CONFIG_KEYS = ["none", "static", "tuned", "dynamic", "predictive", "hysteresis"]  # configs()'s order


def configs(tuned: float) -> dict:
    return {
        "none": ["--scaler", "none"],
        "static 65536": ["--scaler", "static", "--opt", "scaler.scale=65536"],
        f"static {tuned:g} (tuned)": ["--scaler", "static", "--opt", f"scaler.scale={tuned:g}"],
        "dynamic": ["--scaler", "dynamic"],
        "predictive": ["--scaler", "predictive"],
        "dynamic, hysteresis 2": ["--scaler", "dynamic", "--opt", "scaler.hysteresis=2"],
    }


def tune_static(binary, folder, args) -> float:
    scale = 65536.0
    while scale >= 1:
        r = train(binary, folder, 0, args.tune_steps, args.batch_size, args.lr,
                  ["--precision", "fp16", "--scaler", "static", "--opt", f"scaler.scale={scale:g}", *POLICIES["abort"]],
                  "tune")
        print(f"  tuning: static {scale:g} on seed 0, {args.tune_steps} steps: exit {r['code']}, "
              f"{r['nonfinite']} non-finite", file=sys.stderr)
        if r["code"] == 0 and r["nonfinite"] == 0:
            return scale
        scale /= 2
    return 1.0


def mean(values) -> str:
    ok = [v for v in values if math.isfinite(v)]
    return f"{statistics.mean(ok):.4f}" if ok else "-"


def table(rows, names, args, tuned):
    print(f"\nfp16 CLIP-style contrastive model (tools/models/contrastive.py, temperature 0.01), {args.steps} steps, "
          f"batch {args.batch_size}, lr {args.lr:g}, {args.seeds} seeds; hand-tuned static scale {tuned:g}")
    print("| scaling | policy | non-finite steps (all runs) | runs with any | failed runs | test loss | test accuracy |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        for policy in POLICIES:
            rs = [r for r in rows if r["config"] == name and r["policy"] == policy]
            failed = [r for r in rs if r["failed"]]
            ok = [r for r in rs if not r["failed"]]
            print(f"| {name} | {policy} | {sum(r['nonfinite'] for r in rs)} | {sum(r['nonfinite'] > 0 for r in rs)}/{len(rs)}"
                  f" | {len(failed)}/{len(rs)} | {mean([r['test_loss'] for r in ok])} | {mean([r['test_accuracy'] for r in ok])} |")
    print("(test loss and accuracy: mean over the runs that did not fail)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build folder holding bin/ampkit-train")
    ap.add_argument("--seeds", type=int, default=10, help="seeds per configuration (default 10)")
    ap.add_argument("--steps", type=int, default=1000, help="optimizer steps per run (default 1000)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--tune-steps", type=int, default=200, help="steps of the run that tunes the static scale")
    ap.add_argument("--static-tuned", type=float, default=0, help="hand-tuned static scale; 0 tunes it (default)")
    ap.add_argument("--configs", default="", help="only these scaling configurations, comma-separated "
                    "(none, static, tuned, dynamic, predictive, hysteresis); default: all six")
    ap.add_argument("--work", default="", help="folder for the exported models and run files (default: temporary)")
    ap.add_argument("--csv", default="", help="also write the per-run rows here")
    args = ap.parse_args()
    wanted = args.configs.split(",") if args.configs else CONFIG_KEYS
    unknown = [w for w in wanted if w not in CONFIG_KEYS]
    if unknown:
        sys.exit(f"stability_demo.py: unknown --configs {','.join(unknown)} (choose from {', '.join(CONFIG_KEYS)})")
    binary = os.path.join(args.build, "bin", "ampkit-train")
    if not os.access(binary, os.X_OK):
        sys.exit(f"stability_demo.py: {binary} not found: build first (tools/test.sh or cmake --build build)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.work or tmp
        export_workload(folder, args.seeds, 0.01, 6000, 1000)
        tuned = args.static_tuned or tune_static(binary, folder, args)
        cfgs = configs(tuned)
        if args.configs:
            cfgs = {name: v for key, (name, v) in zip(CONFIG_KEYS, cfgs.items()) if key in wanted}
        rows = []
        for seed in range(args.seeds):
            for name, scaling in cfgs.items():
                for policy, recovery in POLICIES.items():
                    tag = f"{name}-{policy}".replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
                    r = train(binary, folder, seed, args.steps, args.batch_size, args.lr,
                              ["--precision", "fp16", *scaling, *recovery], tag)
                    r.update(config=name, policy=policy, seed=seed)
                    r["failed"] = r["code"] != 0 or not math.isfinite(r["test_loss"])
                    rows.append(r)
                    print(f"  seed {seed} {name:24s} {policy:5s} exit {r['code']} non-finite {r['nonfinite']:3d} "
                          f"test loss {r['test_loss']:.4f} acc {r['test_accuracy']:.3f} {r['error'][:80]}", file=sys.stderr)
    table(rows, list(cfgs), args, tuned)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
