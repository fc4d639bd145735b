#!/usr/bin/env python3
"""Does ampkit-train's memory stay flat over a long run? Runs a small synthetic MLP for many steps
(fp16, dynamic scaler, norm clipper and a metrics file by default: every per-step path of a real
run) while sampling the process's resident set (VmRSS in /proc/PID/status) every 0.2 s. Prints
the RSS at 10%, 50%, 90% and 100% of the steps, the growth from the 10% mark to the end and the
slope of a straight line fitted over that stretch; the target is no growth beyond noise.

    bench/memory_flat.py [--build build] [--steps 10000] [--interval 0.2] [--csv rss.csv]
                               [-- EXTRA ampkit-train OPTIONS]
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time

PROG = "memory_flat"
MARKS = (0.10, 0.50, 0.90, 1.00)


def fail(message, code=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


def rss_mb(pid):
    """(VmRSS, RssAnon) of pid in MB, or None once the process is gone. RssAnon is the heap and
    other anonymous memory, where a leak shows; VmRSS adds file-backed pages (LibTorch's code pages
    are faulted in as kernels are first used)."""
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "RssAnon:")):
                    values[line.split(":")[0]] = int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    if "VmRSS" not in values:
        return None  # a zombie has no VmRSS line
    return values["VmRSS"], values.get("RssAnon", float("nan"))


class LineCounter:
    """Counts the records of a growing metrics file without rereading it."""

    def __init__(self, path):
        self.path, self.offset, self.lines = path, 0, 0

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return self.lines
        self.offset += len(chunk)
        self.lines += chunk.count(b"\n")
        return self.lines


def fit_slope(xs, ys):
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = lambda message: fail(f"{message} (see --help)")  # one line, no usage block
    ap.add_argument("--build", default="build", help="build folder holding bin/ampkit-train")
    ap.add_argument("--steps", type=int, default=10000, help="optimizer steps of the run")
    ap.add_argument("--precision", default="fp16", choices=["fp32", "bf16", "fp16"], help="autocast precision")
    ap.add_argument("--width", type=int, default=64, help="--synthetic-width of the MLP")
    ap.add_argument("--depth", type=int, default=3, help="--synthetic-depth of the MLP")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per step")
    ap.add_argument("--threads", type=int, default=1, help="LibTorch threads of the run")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between RSS samples")
    ap.add_argument("--no-metrics", action="store_true", help="run without --metrics (steps are then estimated from time)")
    ap.add_argument("--tolerance-mb", type=float, default=2.0,
                    help="growth from the 10%% mark to the end still called flat (allocator noise)")
    ap.add_argument("--csv", default="", help="write the samples (time_s, step, rss_mb, rss_anon_mb) here")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more ampkit-train options (e.g. -- --nan-policy rollback)")
    args = ap.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    if args.steps < 10 or args.interval <= 0 or args.batch_size < 1 or args.width < 1 or args.depth < 0:
        fail("--steps must be >= 10, --interval > 0, --batch-size and --width >= 1, --depth >= 0")
    binary = os.path.join(args.build, "bin", "ampkit-train")
    if not os.access(binary, os.X_OK):
        fail(f"{binary} not found; build first (tools/test.sh or tools/run.sh) or give --build")

    with tempfile.TemporaryDirectory(prefix="ampkit-memory-") as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = [binary, "--workload", "synthetic", "--synthetic-width", str(args.width), "--synthetic-depth",
               str(args.depth), "--batch-size", str(args.batch_size), "--precision", args.precision,
               "--steps", str(args.steps), "--threads", str(args.threads), "--progress", "never",
               "--clipper", "norm", "--scaler", "dynamic" if args.precision == "fp16" else "none",
               "--eval-batches", "1", *([] if args.no_metrics else ["--metrics", metrics]), *extra]
        err_path = os.path.join(tmp, "stderr")
        counter = LineCounter(metrics)
        samples = []  # (seconds since start, steps done or None, rss MB)
        with open(err_path, "w") as err:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
            try:
                while p.poll() is None:
                    rss = rss_mb(p.pid)
                    if rss is not None and rss[0] > 0:  # 0: sampled before exec
                        done = None if args.no_metrics else counter.poll()
                        samples.append((time.perf_counter() - t0, done, *rss))
                    time.sleep(args.interval)
            except KeyboardInterrupt:
                p.terminate()
                p.wait()
                sys.exit(130)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            lines = [l for l in open(err_path).read().splitlines() if l.strip()]
            fail(f"ampkit-train exited with {p.returncode}: {lines[-1] if lines else 'no message'}", 1)
    if len(samples) < 5:
        fail(f"the run took {wall:.1f} s: only {len(samples)} RSS samples; raise --steps or lower --interval", 1)

    # Steps done at each sample: from the metrics file, else assumed proportional to time.
    if args.no_metrics:
        span = samples[-1][0] - samples[0][0] or 1.0
        samples = [(t, round(args.steps * (t - samples[0][0]) / span), r, a) for t, _, r, a in samples]
    # Training is over once the last record is written; evaluation and the summary follow, and
    # they fault in code pages of their own: the 100% mark is the last sample taken while training.
    training = [s for s in samples if s[1] < args.steps] or samples
    after = samples[len(training):]

    def at(fraction):
        want = fraction * args.steps
        for s in training:
            if s[1] >= want:
                return s
        return training[-1]

    print(f"ampkit-train synthetic MLP width {args.width} depth {args.depth}, batch {args.batch_size}, "
          f"{args.precision}, {args.steps} steps, threads {args.threads}{' ' + ' '.join(extra) if extra else ''}: "
          f"{wall:.1f} s, {len(samples)} samples every {args.interval} s\n")
    print(f"{'mark':>6} {'step':>8} {'time s':>8} {'RSS MB':>9} {'anon MB':>9}")
    rows = {m: at(m) for m in MARKS}
    for m in MARKS:
        t, step, rss, anon = rows[m]
        print(f"{int(m * 100):>5}% {step:>8} {t:>8.1f} {rss:>9.1f} {anon:>9.1f}")
    base = rows[MARKS[0]]
    tail = [s for s in training if s[0] >= base[0]]
    growth, anon_growth = rows[1.0][2] - base[2], rows[1.0][3] - base[3]
    slope = fit_slope([s[1] for s in tail], [s[2] for s in tail]) * 1000.0
    print(f"\nfrom the 10% mark to the end of training: RSS {growth:+.1f} MB ({100.0 * growth / base[2]:+.2f}%), "
          f"anonymous {anon_growth:+.1f} MB; fitted RSS slope {slope:+.3f} MB per 1000 steps; "
          f"RSS range {min(s[2] for s in tail):.1f}-{max(s[2] for s in tail):.1f} MB")
    peak = max(s[2] for s in samples)
    if after:
        print(f"after training (evaluation, summary): RSS up to {max(s[2] for s in after):.1f} MB, "
              f"anonymous up to {max(s[3] for s in after):.1f} MB; peak of the run {peak:.1f} MB")
    flat = abs(growth) <= args.tolerance_mb
    print(f"flat (|RSS growth| <= {args.tolerance_mb} MB): {'yes' if flat else 'NO'}")

    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["time_s", "step", "rss_mb", "rss_anon_mb"])
            w.writerows((f"{t:.3f}", step, f"{r:.2f}", f"{a:.2f}") for t, step, r, a in samples)
        print(f"wrote {args.csv}", file=sys.stderr)
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
