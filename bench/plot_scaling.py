#!/usr/bin/env python3
"""Plots the CSV of bench/scaling.py: weak and strong scaling (speed-up against rank count,
with the ideal line) and all-reduce bus bandwidth against message size (the gloo plugin and raw
c10d), each point the median of the runs with min-max error bars.

    bench/plot_scaling.py scaling.csv -o docs/img/scaling.png
"""
import argparse
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def points(rows, key, value):
    xs = sorted({float(r[key]) for r in rows})
    med, low, high = [], [], []
    for x in xs:
        vs = [float(r[value]) for r in rows if float(r[key]) == x]
        m = statistics.median(vs)
        med.append(m)
        low.append(m - min(vs))
        high.append(max(vs) - m)
    return xs, med, [low, high]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("-o", "--output", default="scaling.png")
    ap.add_argument("--dpi", type=int, default=90)
    args = ap.parse_args()
    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    scaling = [r for r in rows if r["kind"] == "scaling"]
    allreduce = [r for r in rows if r["kind"] == "allreduce"]
    if not scaling or not allreduce:
        sys.exit(f"plot_scaling.py: {args.csv} has no scaling or all-reduce rows (write it with bench/scaling.py)")
    runs = len({r["run"] for r in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, marker in (("weak", "o"), ("strong", "s")):
        xs, med, err = points([r for r in scaling if r["mode"] == mode], "ranks", "speedup")
        left.errorbar(xs, med, yerr=err, marker=marker, capsize=4, label=f"{mode} scaling")
    xs = sorted({float(r["ranks"]) for r in scaling})
    left.plot(xs, [x / xs[0] for x in xs], "k--", linewidth=0.8, label="ideal")
    left.set_xlabel("ranks")
    left.set_ylabel("samples/s against the first rank count")
    left.set_xticks(xs)
    left.set_title(f"ampkit-train synthetic MLP, median of {runs} runs")
    left.legend()
    for column, label in (("plugin_busbw_gbps", "gloo plugin"), ("raw_busbw_gbps", "raw c10d Gloo")):
        xs, med, err = points(allreduce, "bytes", column)
        right.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label)
    right.set_xscale("log", base=2)
    right.set_xlabel("message size (bytes)")
    right.set_ylabel("all-reduce bus bandwidth (GB/s)")
    right.set_title("all-reduce (sum, fp32)")
    right.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=args.dpi)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
