#!/usr/bin/env python3
"""Grouped bar chart of the throughput comparison: reads the CSV that
bench/throughput_comparison.py --csv writes and draws samples/s per workload/precision, one
bar per way (ampkit, libtorch, pytorch), with the min-max range of the repetitions as error bars.
Each workload gets its own panel (their throughputs differ by orders of magnitude).

    bench/plot_throughput.py THROUGHPUT.csv [-o throughput.png] [--title TEXT]
"""
import argparse
import csv
import math
import os
import sys

PROG = "plot_throughput"
COLORS = {"ampkit": "tab:blue", "libtorch": "tab:orange", "pytorch": "tab:green"}
NEEDED = ("workload", "precision", "way", "samples_per_second")


def fail(message, code=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


def number(text):
    try:
        v = float(text)
        return v if math.isfinite(v) else None
    except (TypeError, ValueError):
        return None


def read_rows(path):
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [k for k in NEEDED if k not in (reader.fieldnames or [])]
            if missing:
                fail(f"{path} lacks the column(s) {', '.join(missing)}; "
                     f"is it a bench/throughput_comparison.py --csv file?")
            rows = list(reader)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if not rows:
        fail(f"{path} holds no rows")
    return rows


def first_seen(values):
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = lambda message: fail(f"{message} (see --help)")  # one line, no usage block
    ap.add_argument("csv", help="CSV written by throughput_comparison.py --csv")
    ap.add_argument("-o", "--output", default="", help="PNG to write (default: CSV with .png)")
    ap.add_argument("--title", default="", help="figure title")
    ap.add_argument("--dpi", type=int, default=120, help="resolution of the PNG")
    args = ap.parse_args()
    output = args.output or os.path.splitext(args.csv)[0] + ".png"
    rows = read_rows(args.csv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed; run tools/setup.sh (or pip install matplotlib)", 1)

    workloads = first_seen(r["workload"] for r in rows)
    ways = first_seen(r["way"] for r in rows)
    fig, axes = plt.subplots(1, len(workloads), figsize=(max(4.5, 3.2 * len(workloads)), 4.8), squeeze=False,
                             constrained_layout=True)
    width = 0.8 / len(ways)
    for ax, workload in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == workload]
        precisions = first_seen(r["precision"] for r in mine)
        params = number(mine[0].get("parameters"))
        for i, way in enumerate(ways):
            xs, ys, lo, hi = [], [], [], []
            for j, precision in enumerate(precisions):
                r = next((r for r in mine if r["precision"] == precision and r["way"] == way), None)
                v = number(r["samples_per_second"]) if r else None
                if v is None:
                    continue
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(v)
                vmin, vmax = number(r.get("samples_per_second_min")), number(r.get("samples_per_second_max"))
                lo.append(v - vmin if vmin is not None else 0.0)
                hi.append(vmax - v if vmax is not None else 0.0)
            ax.bar(xs, ys, width, yerr=[lo, hi] if any(lo) or any(hi) else None, capsize=3,
                   color=COLORS.get(way), label=way)
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.0f}" if y >= 100 else f"{y:.3g}", (x, y), ha="center", va="bottom",
                            fontsize=7, rotation=90, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(precisions)))
        ax.set_xticklabels(precisions)
        ax.set_title(workload + (f"\n{params:,.0f} parameters" if params else ""), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.18)
    axes[0][0].set_ylabel("samples/s (higher is better)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(ways))
    # Settings shared by every row go into the title.
    shared = {k: {r.get(k) for r in rows} for k in ("batch_size", "steps", "warmup", "threads")}
    def setting(key, value):
        return "threads: library default" if key == "threads" and str(value) == "0" else f"{key.replace('_', ' ')} {value}"

    subtitle = ", ".join(setting(k, v.pop()) for k, v in shared.items() if len(v) == 1 and None not in v)
    fig.suptitle(args.title or f"Training throughput{' (' + subtitle + ')' if subtitle else ''}")
    try:
        fig.savefig(output, dpi=args.dpi)
    except OSError as e:
        fail(f"cannot write {output}: {e.strerror}")
    print(f"wrote {output} ({len(workloads)} workloads, {len(ways)} ways)")


if __name__ == "__main__":
    main()
