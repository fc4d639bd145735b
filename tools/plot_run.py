#!/usr/bin/env python3
"""Plots one ampkit-train run from its metrics file (--metrics FILE.jsonl): one PNG with four
panels over the steps: the loss; the loss scale (log); the unscaled gradient norm before and
after clipping (log); the cumulative skipped steps, with a marker at every skip, skip_backoff,
rollback and abort action.

    tools/plot_run.py METRICS.jsonl [-o run.png] [--title TEXT] [--log-loss]
"""
import argparse
import json
import math
import os
import sys

PROG = "plot_run"


def fail(message, code=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


def number(v):
    """A metrics value as a float: the strings "nan", "inf", "-inf" and missing values included."""
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def positive_or_nan(values):
    return [v if math.isfinite(v) and v > 0 else math.nan for v in values]


def read_metrics(path):
    try:
        f = open(path)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    records = []
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                fail(f"{path}:{n}: not a JSON line ({e.msg}); is this an ampkit-train --metrics file?")
            if not isinstance(r, dict) or "step" not in r:
                fail(f"{path}:{n}: a record without 'step'; is this an ampkit-train --metrics file?")
            records.append(r)
    if not records:
        fail(f"{path} holds no records")
    return records


# Markers on the skipped-steps panel, by action.
ACTIONS = {
    "skip": ("x", "tab:red", "skip"),
    "skip_backoff": ("x", "tab:orange", "skip + backoff"),
    "rollback": ("v", "tab:purple", "rollback"),
    "abort": ("X", "black", "abort"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = lambda message: fail(f"{message} (see --help)")  # one line, no usage block
    ap.add_argument("metrics", help="ampkit-train --metrics file (JSON lines)")
    ap.add_argument("-o", "--output", default="", help="PNG to write (default: METRICS with .png)")
    ap.add_argument("--title", default="", help="figure title (default: the metrics file's name)")
    ap.add_argument("--log-loss", action="store_true", help="log scale for the loss panel (spikes stay readable)")
    ap.add_argument("--dpi", type=int, default=120, help="resolution of the PNG")
    args = ap.parse_args()
    output = args.output or os.path.splitext(args.metrics)[0] + ".png"

    records = read_metrics(args.metrics)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed; run tools/setup.sh (or pip install matplotlib)", 1)

    steps = [int(r["step"]) for r in records]
    loss = [number(r.get("loss")) for r in records]
    scale = positive_or_nan([number(r.get("scale")) for r in records])
    norm = positive_or_nan([number(r.get("grad_norm")) for r in records])
    clipped = positive_or_nan([number(r.get("grad_norm_clipped")) for r in records])
    skipped = [number(r.get("skipped_steps")) for r in records]
    actions = [r.get("action", "proceed") for r in records]

    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(10, 11), constrained_layout=True)
    fig.suptitle(args.title or os.path.basename(args.metrics))

    ax = axes[0]
    ax.plot(steps, loss, lw=1, color="tab:blue", label="loss")
    bad = [s for s, v in zip(steps, loss) if not math.isfinite(v)]
    if bad:
        ax.plot(bad, [1.0] * len(bad), "|", color="tab:red", ms=12, transform=ax.get_xaxis_transform(),
                label=f"non-finite loss ({len(bad)})")
    if args.log_loss and any(math.isfinite(v) and v > 0 for v in loss):
        ax.set_yscale("log")
    ax.set_ylabel("loss")
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)

    ax = axes[1]
    ax.plot(steps, scale, lw=1, color="tab:green", drawstyle="steps-post")
    if any(math.isfinite(v) for v in scale):
        ax.set_yscale("log", base=2)
    ax.set_ylabel("loss scale")
    ax.grid(alpha=0.3, which="both")

    ax = axes[2]
    ax.plot(steps, norm, lw=1, color="tab:gray", label="grad norm (unscaled)")
    ax.plot(steps, clipped, lw=1, color="tab:orange", label="after clipping")
    if any(math.isfinite(v) for v in norm + clipped):
        ax.set_yscale("log")
    ax.set_ylabel("gradient L2 norm")
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3, which="both")

    ax = axes[3]
    ax.plot(steps, skipped, lw=1, color="tab:red", drawstyle="steps-post", label="skipped steps (cumulative)")
    for action, (marker, color, label) in ACTIONS.items():
        at = [(s, k) for s, k, a in zip(steps, skipped, actions) if a == action]
        if at:
            ax.plot([s for s, _ in at], [k for _, k in at], marker, color=color, ms=7, ls="none",
                    label=f"{label} ({len(at)})")
    ax.set_ylabel("skipped steps")
    ax.set_xlabel("step")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)

    try:
        fig.savefig(output, dpi=args.dpi)
    except OSError as e:
        fail(f"cannot write {output}: {e.strerror}")
    print(f"wrote {output} ({len(records)} steps)")


if __name__ == "__main__":
    main()
