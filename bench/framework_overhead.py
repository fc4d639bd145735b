#!/usr/bin/env python3
"""The framework's per-step cost, with this VM's noise cancelled (docs/benchmarks.md).

For each workload x precision, one process of build/bin/ampkit-bench-overhead trains two copies of
the same model on the same batches, alternating step by step (ABBA): one through ampkit (plugins
loaded by name, ampkit::Trainer, the per-step metrics record ampkit-train writes; --clipper norm
--opt clipper.max_norm=1.0, --scaler dynamic for fp16 and none otherwise, as in
throughput_comparison.py) and one through the hand-written LibTorch step of handwritten_step.h
with the same optimizer. Load from elsewhere and a process's page placement then hit both alike,
and the median of the per-pair ratios ampkit/loop measures what the framework adds around the
same kernels. The 95% interval is a bootstrap over the pairs.

    bench/framework_overhead.py [--build build] [--workloads mlp-1m,mlp-10m,cnn,gpt]
        [--precisions fp32,bf16,fp16] [--pairs 0 (per workload)] [--threads 0]
        [--loop-optimizer fused|adamw] [--csv overhead.csv]
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from throughput_comparison import DEFAULT_WORKLOADS, PRESETS, cpu_description, presets_and_precisions  # noqa: E402

PROG = "framework_overhead"

# Pairs per run when --pairs is 0: one to three minutes per workload x precision on the 2-core AVX2
# development machine (bf16/fp16 steps are 8-18x longer there than fp32 ones; a pair is two steps).
DEFAULT_PAIRS = {("mlp-1m", "fp32"): 5000, ("mlp-10m", "fp32"): 500, ("cnn", "fp32"): 1000, ("gpt", "fp32"): 300,
                 ("mlp-1m", "low"): 500, ("mlp-10m", "low"): 60, ("cnn", "low"): 150, ("gpt", "low"): 30,
                 ("mlp-100m", "fp32"): 100, ("mlp-100m", "low"): 2}


def fail(message, code=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build folder holding bin/ampkit-bench-overhead")
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                    help=f"comma-separated presets of throughput_comparison.py: {', '.join(PRESETS)}")
    ap.add_argument("--precisions", default="fp32,bf16,fp16", help="comma-separated: fp32, bf16, fp16")
    ap.add_argument("--pairs", type=int, default=0,
                    help="timed step pairs per run; 0 picks one to three minutes' worth per workload and precision")
    ap.add_argument("--warmup", type=int, default=3, help="untimed pairs first")
    ap.add_argument("--batch-size", type=int, default=64, help="samples per step (sequences for gpt)")
    ap.add_argument("--threads", type=int, default=0, help="LibTorch CPU threads; 0 keeps the library's choice")
    ap.add_argument("--loop-optimizer", choices=["fused", "adamw"], default="fused",
                    help="the hand-written step's optimizer: ampkit's FusedAdamW (the same as ampkit's side, so "
                         "the ratio is the framework alone) or torch::optim::AdamW (what a LibTorch user writes)")
    ap.add_argument("--seed", type=int, default=0, help="initialisation and data")
    ap.add_argument("--csv", help="also write one row per workload and precision here")
    args = ap.parse_args()
    bench = os.path.join(args.build, "bin", "ampkit-bench-overhead")
    if not os.access(bench, os.X_OK):
        fail(f"{bench} not found: build the project first (cmake --build {args.build})")
    try:
        workloads, precisions = presets_and_precisions(args.workloads, args.precisions)
    except ValueError as e:
        fail(str(e))
    if args.pairs < 0 or args.warmup < 0 or args.batch_size < 1 or args.threads < 0:
        fail("--pairs, --warmup and --threads must be >= 0, --batch-size >= 1")

    load_before = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for w in workloads:
        for p in precisions:
            preset = PRESETS[w]
            pairs = args.pairs or DEFAULT_PAIRS[(w, "fp32" if p == "fp32" else "low")]
            cmd = [bench, "--workload", preset["workload"], *preset["args"], "--precision", p,
                   "--batch-size", str(args.batch_size), "--seed", str(args.seed),
                   "--clipper", "norm", "--opt", "clipper.max_norm=1.0",
                   "--scaler", "dynamic" if p == "fp16" else "none",
                   "--pairs", str(pairs), "--warmup", str(args.warmup), "--loop-optimizer", args.loop_optimizer]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                err = out.stderr.strip().splitlines()
                fail(f"{w} {p}: ampkit-bench-overhead exited {out.returncode}: {err[-1] if err else ''}", 1)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["preset"] = w
            rows.append(r)
            print(f"{w} {p}: {json.dumps(r)}", file=sys.stderr, flush=True)

    print(f"\n{started}, {cpu_description()}, {rows[0]['threads']} thread(s), "
          f"loop optimizer {rows[0]['loop_optimizer']}; 1-minute load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after\n")
    print("| workload | precision | pairs | ampkit median ms | loop median ms | ampkit/loop (median of pairs) "
          "| 95% interval | max param difference |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        low, high = r["ratio_interval_95"]
        print(f"| {r['preset']} | {r['precision']} | {r['pairs']} | {r['ampkit_median_step_ms']:.2f} | "
              f"{r['loop_median_step_ms']:.2f} | {r['median_ratio']:.4f} | {low:.4f}-{high:.4f} | "
              f"{r['max_parameter_difference']:.1e} |")
    within = sum(1 for r in rows if r["median_ratio"] <= 1.02)
    print(f"\nampkit/loop <= 1.02: {within}/{len(rows)} rows; upper end of the interval <= 1.02: "
          f"{sum(1 for r in rows if r['ratio_interval_95'][1] <= 1.02)}/{len(rows)}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["workload", "precision", "pairs", "threads", "loop_optimizer", "ampkit_median_step_ms",
                          "loop_median_step_ms", "median_ratio", "interval_low", "interval_high",
                          "max_parameter_difference"])
            for r in rows:
                out.writerow([r["preset"], r["precision"], r["pairs"], r["threads"], r["loop_optimizer"],
                              r["ampkit_median_step_ms"], r["loop_median_step_ms"], r["median_ratio"],
                              *r["ratio_interval_95"], r["max_parameter_difference"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
