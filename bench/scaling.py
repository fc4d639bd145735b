#!/usr/bin/env python3
"""Weak and strong scaling and all-reduce bandwidth, as medians that a rerun can check (a
benchmark, not a test): runs `ampkit-bench-dist` --repeats times (default 5), records the
machine's load around each run, prints Markdown tables of medians with their min-max spread and
writes every run's rows to a CSV that bench/plot_scaling.py turns into a PNG.

    bench/scaling.py [--build build] [--repeats 5] [--csv scaling.csv] [-- ampkit-bench-dist options]
    bench/scaling.py --csv scaling.csv -- --ranks 1,2,4,8 --comm nccl --device cuda   # GPUs

Speed-up is samples/s of the job against the first rank count's; weak scaling keeps the batch per
rank (ideal: the rank ratio), strong scaling the global batch (ideal: the same).
"""
import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def parse(stdout, run, load_before, load_after):
    rows = []
    for line in stdout.splitlines():
        w = line.split()
        common = {"run": run, "load1_before": load_before, "load1_after": load_after}
        if len(w) == 7 and w[0] in ("weak", "strong") and w[5].endswith("x"):
            rows.append({**common, "kind": "scaling", "mode": w[0], "ranks": int(w[1]), "batch_per_rank": int(w[2]),
                         "global_batch": int(w[3]), "samples_per_second": float(w[4]), "speedup": float(w[5][:-1]),
                         "rss_mib": float(w[6])})
        elif len(w) == 6 and w[0].isdigit() and w[5].endswith("x"):
            rows.append({**common, "kind": "allreduce", "bytes": int(w[0]), "plugin_us": float(w[1]),
                         "plugin_busbw_gbps": float(w[2]), "raw_us": float(w[3]), "raw_busbw_gbps": float(w[4]),
                         "plugin_over_raw": float(w[5][:-1])})
    return rows


def spread(values, digits=2):
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build folder holding bin/ampkit-bench-dist")
    ap.add_argument("--repeats", type=int, default=5, help="runs of ampkit-bench-dist (default 5)")
    ap.add_argument("--csv", default="", help="write every run's rows here")
    ap.add_argument("bench_args", nargs="*", help="passed to ampkit-bench-dist (after --)")
    args = ap.parse_args()
    binary = os.path.join(args.build, "bin", "ampkit-bench-dist")
    if not os.access(binary, os.X_OK):
        sys.exit(f"scaling.py: {binary} not found: build first (cmake --build build)")
    if args.repeats < 1:
        sys.exit("scaling.py: --repeats must be at least 1")
    rows = []
    for run in range(args.repeats):
        before = os.getloadavg()[0]
        done = subprocess.run([binary, *args.bench_args], capture_output=True, text=True)
        after = os.getloadavg()[0]
        if done.returncode != 0:
            sys.exit(f"scaling.py: ampkit-bench-dist exited {done.returncode}: {done.stderr.strip()}")
        got = parse(done.stdout, run, before, after)
        if not got:
            sys.exit("scaling.py: no table rows in ampkit-bench-dist's output")
        rows += got
        print(f"  run {run}: load {before:.2f} -> {after:.2f}", file=sys.stderr)
    loads = [r["load1_before"] for r in rows if r["kind"] == "scaling"]
    print(f"\n{cpu_model()}, {os.cpu_count()} CPUs; ampkit-bench-dist {' '.join(args.bench_args)}; "
          f"median (min-max) of {args.repeats} runs; 1-minute load before the runs {min(loads):.2f}-{max(loads):.2f}\n")
    print("| mode | ranks | global batch | samples/s | speed-up |")
    print("|---|---|---|---|---|")
    keys = sorted({(r["mode"], r["ranks"], r["global_batch"]) for r in rows if r["kind"] == "scaling"},
                  key=lambda k: (k[0] != "weak", k[1]))
    for mode, ranks, batch in keys:
        rs = [r for r in rows if r["kind"] == "scaling" and r["mode"] == mode and r["ranks"] == ranks]
        print(f"| {mode} | {ranks} | {batch} | {spread([r['samples_per_second'] for r in rs], 0)} | "
              f"{spread([r['speedup'] for r in rs])}x |")
    print("\n| bytes | plugin bus GB/s | raw c10d bus GB/s | plugin / raw time |")
    print("|---|---|---|---|")
    for size in sorted({r["bytes"] for r in rows if r["kind"] == "allreduce"}):
        rs = [r for r in rows if r["kind"] == "allreduce" and r["bytes"] == size]
        print(f"| {size} | {spread([r['plugin_busbw_gbps'] for r in rs], 3)} | {spread([r['raw_busbw_gbps'] for r in rs], 3)}"
              f" | {spread([r['plugin_over_raw'] for r in rs])}x |")
    if args.csv:
        fields = []
        for r in rows:
            fields += [k for k in r if k not in fields]
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
