#!/usr/bin/env python3
"""Training throughput side by side: for each workload x precision, in the same run and
interleaved, three ways train the same model on the same data with the same math (autocast,
fp16 loss scaling from 65536, clip_grad_norm_ at 1.0, AdamW):

  ampkit    build/bin/ampkit-train --clipper norm --opt clipper.max_norm=1.0
            --scaler dynamic (fp16) | none (fp32, bf16) --metrics FILE; samples/s from the metrics'
            "time" field (end of each step) between the last warm-up step and the last step
  libtorch  build/bin/ampkit-bench-handwritten: the same workloads in a hand-written LibTorch loop
  pytorch   bench/torch_reference.py: the PyTorch 2.11 AMP recipe in python, with its fastest
            optimizer, AdamW(fused=True) (--pytorch-adamw default: torch's default AdamW)

With --device cuda both ampkit and pytorch train on the first GPU (autocast and GradScaler on CUDA,
each step's time ends at a synchronisation); the hand-written loop is CPU-only and is left out.
tools/gpu-check.sh runs this on a GPU machine for its throughput rows.

With --ranks N (N > 1) the comparison is data-parallel on Gloo, N processes on this machine, the
global batch of --batch-size samples split between them: ampkit-train --comm gloo against PyTorch
DistributedDataParallel (gloo), both started by torchrun (torchrun --no-python ampkit-train ...,
torchrun torch_reference.py ...); the hand-written loop has no data-parallel variant and is left
out. torchrun sets OMP_NUM_THREADS=1 for each rank, so give --threads 1 for both ways alike.

Each way runs --repeats times (the order of the ways rotates between repetitions) and the median
is reported. Workload presets: mlp-1m, mlp-10m, mlp-100m (synthetic MLPs, 4 hidden layers as wide as
the input: 1,007,010 / 10,007,730 / 100,070,010 parameters), cnn (fashion-mnist, 421,642) and gpt
(char-gpt's defaults: 2 layers, width 128, 4 heads, context 64; 470,784). The table gives
ampkit/libtorch as the per-step time ratio (target <= 1.02: the framework costs at most 2%) and
ampkit/pytorch as the throughput ratio (target >= 1).

    bench/throughput_comparison.py [--build build] [--workloads mlp-1m,mlp-10m,cnn,gpt]
        [--precisions fp32,bf16,fp16] [--steps 20] [--warmup 3] [--batch-size 64] [--threads 0]
        [--repeats 1] [--ranks 1] [--device cpu] [--pytorch-adamw fused] [--csv throughput.csv] [--data DIR]

Exit status: 0; 1 when a run failed; 2 for bad arguments; 3 when a SIGTERM (a time limit's) stopped
it: the run under way is stopped and the table (and --csv) holds the workload x precision rows
whose runs had all ended.
"""
import argparse
import csv
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

PROG = "throughput_comparison"
HERE = os.path.dirname(os.path.abspath(__file__))
WAYS = ["ampkit", "libtorch", "pytorch"]


def mlp(width, depth, inputs, classes=10):
    return {"workload": "synthetic",
            "args": ["--synthetic-width", str(width), "--synthetic-depth", str(depth),
                     "--synthetic-inputs", str(inputs), "--synthetic-classes", str(classes)],
            "parameters": inputs * width + width + (depth - 1) * (width * width + width) + width * classes + classes}


def gpt(layers=2, width=128, heads=4, context=64):
    per_block = 2 * 2 * width + (width * 3 * width + 3 * width) + (width * width + width) \
        + (width * 4 * width + 4 * width) + (4 * width * width + width)
    return {"workload": "char-gpt",
            "args": ["--gpt-layers", str(layers), "--gpt-width", str(width), "--gpt-heads", str(heads),
                     "--gpt-context", str(context)],
            "parameters": 256 * width + context * width + layers * per_block + 2 * width + width * 256 + 256}


# Synthetic MLPs: 4 hidden layers as wide as the input, sized for ~1M, ~10M and ~100M parameters.
PRESETS = {
    "mlp-1m": mlp(500, 4, 500),
    "mlp-10m": mlp(1580, 4, 1580),
    "mlp-100m": mlp(5000, 4, 5000),
    "cnn": {"workload": "fashion-mnist", "args": [],
            "parameters": (1 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (3136 * 128 + 128) + (128 * 10 + 10)},
    "gpt": gpt(),  # char-gpt's defaults
}


DEFAULT_WORKLOADS = "mlp-1m,mlp-10m,cnn,gpt"


def presets_and_precisions(workloads, precisions):
    """The comma-separated --workloads and --precisions as lists; ValueError naming the first unknown one."""
    ws = [w for w in workloads.split(",") if w]
    ps = [p for p in precisions.split(",") if p]
    for w in ws:
        if w not in PRESETS:
            raise ValueError(f"unknown workload preset '{w}' (presets: {', '.join(PRESETS)})")
    for p in ps:
        if p not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"unknown precision '{p}' (fp32, bf16, fp16)")
    return ws, ps


def fail(message, code=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


def last_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1] if lines else "no output"


# What ampkit-train sets with mallopt at start (hosts/train/src/main.cpp, keep_freed_memory_for_reuse):
# freed blocks stay in the heap for reuse instead of being unmapped and faulted in again.
AMPKIT_MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


class Stopped(Exception):
    """A SIGTERM, raised where it lands in the measuring loop."""


def on_sigterm(signum, frame):
    raise Stopped()


def stop_child(p):
    """A SIGTERM stopped this script: the child too (torchrun passes it on to its ranks), then SIGKILL."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def launch(cmd, tmp, timeout, env=None):
    """Runs cmd (with env added to this process's environment); returns (exit code, stdout, stderr, peak RSS of the child in MB, wall seconds)."""
    out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             env=None if not env else {**os.environ, **env})
        deadline = None if timeout <= 0 else t0 + timeout
        try:
            return wait_for(p, t0, deadline, timeout, out_path, err_path)
        except Stopped:
            stop_child(p)
            raise


def wait_for(p, t0, deadline, timeout, out_path, err_path):
    """launch()'s wait: the child's result, or its kill at the deadline."""
    while True:  # wait4 gives this child's own peak RSS (RUSAGE_CHILDREN would be the max of all)
        pid, status, usage = os.wait4(p.pid, 0 if deadline is None else os.WNOHANG)
        if pid == p.pid:
            break
        if time.perf_counter() > deadline:
            p.kill()
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = -9
            return None, open(out_path).read(), f"timed out after {timeout:.0f} s", usage.ru_maxrss / 1024.0, \
                time.perf_counter() - t0
        time.sleep(0.05)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, open(out_path).read(), open(err_path).read(), usage.ru_maxrss / 1024.0, time.perf_counter() - t0


def cpu_description():
    """'<model name>, <the flags that decide bf16/fp16 matmul speed>' from /proc/cpuinfo (Linux)."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return "CPU unknown"
    field = lambda key: next((line.split(":", 1)[1].strip() for line in info.splitlines()
                              if line.startswith(key)), "")
    present = set(field("flags").split())
    wanted = ["avx2", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16",
              "avx_ne_convert"]
    return f"CPU {field('model name') or 'unknown'} ({' '.join(f for f in wanted if f in present) or 'no AVX2'})"


def run_way(way, args, preset, precision, tmp):
    """One run of one way; returns a dict with samples_per_second, step_ms, parameters, peak_rss_mb or error."""
    p = PRESETS[preset]
    common = ["--workload", p["workload"], *p["args"], "--precision", precision, "--batch-size", str(args.batch_size),
              "--seed", str(args.seed), "--device", args.device]
    if args.threads > 0:
        common += ["--threads", str(args.threads)]
    if args.data and p["workload"] == "fashion-mnist":
        common += ["--data-dir", os.path.join(args.data, "fashion-mnist")]
    if args.data and p["workload"] == "char-gpt":
        common += ["--text-dir", os.path.join(args.data, "fortunes")]
    metrics = os.path.join(tmp, "metrics.jsonl")
    launcher = []
    if args.ranks > 1:
        launcher = [args.torchrun, "--standalone", "--nproc-per-node", str(args.ranks)]
        if way == "ampkit":
            launcher.append("--no-python")
            # ampkit-train's --batch-size is per rank (DDP's convention); the script's is global.
            i = common.index("--batch-size")
            common[i + 1] = str(args.batch_size // args.ranks)
            common += ["--comm", "gloo"]
    if way == "ampkit":
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [*launcher, args.ampkit_train, *common, "--steps", str(args.warmup + args.steps), "--progress", "never",
               "--clipper", "norm", "--opt", "clipper.max_norm=1.0",
               "--scaler", "dynamic" if precision == "fp16" else "none", "--metrics", metrics, "--eval-batches", "1",
               *shlex.split(args.ampkit_extra)]
    elif way == "libtorch":
        cmd = [args.handwritten, *common, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    else:
        cmd = [*(launcher or [sys.executable]), os.path.join(HERE, "torch_reference.py"), *common, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--adamw", args.pytorch_adamw]
    env = None
    if way == "libtorch" and args.libtorch_malloc == "ampkit":
        env = {"GLIBC_TUNABLES": AMPKIT_MALLOC_TUNABLES}
    code, out, err, rss, wall = launch(cmd, tmp, args.timeout, env)
    if code != 0:
        return {"error": f"exit {code}: {last_line(err)}" if code is not None else err}
    if way == "ampkit":
        try:
            records = [json.loads(line) for line in open(metrics) if line.strip()]
        except (OSError, ValueError) as e:
            return {"error": f"cannot read the metrics file: {e}"}
        if len(records) != args.warmup + args.steps:
            return {"error": f"the metrics file has {len(records)} records, expected {args.warmup + args.steps}"}
        t0 = records[args.warmup - 1]["time"] if args.warmup > 0 else 0.0
        seconds = records[-1]["time"] - t0
        times = [0.0] + [r["time"] for r in records]
        durations = [1000.0 * (times[i + 1] - times[i]) for i in range(args.warmup, len(records))]
        result = {"samples_per_second": args.batch_size * args.steps / seconds,
                  "step_ms": 1000.0 * seconds / args.steps, "median_step_ms": statistics.median(durations),
                  "parameters": None,
                  "skipped_steps": records[-1]["skipped_steps"] - (records[args.warmup - 1]["skipped_steps"]
                                                                    if args.warmup > 0 else 0)}
    else:
        try:
            j = json.loads(last_line(out))
            result = {k: j[k] for k in ("samples_per_second", "step_ms", "median_step_ms")}
            result["parameters"] = j.get("parameters")
            result["skipped_steps"] = j.get("skipped_steps")
        except (ValueError, KeyError, TypeError):
            return {"error": f"no JSON result line in its output: {last_line(out)[:200]}"}
    result["total_step_ms"] = result["step_ms"]
    if args.statistic == "median-step":
        result["step_ms"] = result["median_step_ms"]
        result["samples_per_second"] = args.batch_size * 1000.0 / result["median_step_ms"]
    # Under torchrun, wait4 sees the launcher's own peak, not the ranks': not reported.
    result["peak_rss_mb"] = rss if args.ranks == 1 else None
    result["wall_seconds"] = wall
    return result


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = lambda message: fail(f"{message} (see --help)")  # one line, no usage block
    ap.add_argument("--build", default="build", help="build folder holding bin/ampkit-train and bin/ampkit-bench-handwritten")
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                    help=f"comma-separated presets: {', '.join(PRESETS)} (mlp-100m is not in the default list: on "
                         f"the 2-core AVX2 development machine one step takes ~3 s in fp32 and ~50 s in bf16)")
    ap.add_argument("--precisions", default="fp32,bf16,fp16", help="comma-separated: fp32, bf16, fp16")
    ap.add_argument("--ways", default=",".join(WAYS), help="comma-separated subset of: " + ", ".join(WAYS))
    ap.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    ap.add_argument("--batch-size", type=int, default=64, help="samples per step (sequences for gpt)")
    ap.add_argument("--data", default="", help="a folder holding fashion-mnist/ and fortunes/ for cnn and gpt "
                    "(default: each workload's own, /usr/share/datasets/fashion-mnist and /usr/share/games/fortunes)")
    ap.add_argument("--threads", type=int, default=0, help="LibTorch/torch CPU threads for every way; 0 keeps the library's choice")
    ap.add_argument("--repeats", type=int, default=1, help="runs per way; the median is reported")
    ap.add_argument("--libtorch-malloc", choices=("ampkit", "default"), default="ampkit",
                    help="glibc malloc settings of the hand-written loop: 'ampkit' gives it the mmap and trim "
                         "thresholds that ampkit-train sets for itself (through GLIBC_TUNABLES), so that the ratio "
                         "measures the framework and not the allocator; 'default' leaves glibc's (what a plain "
                         "LibTorch program gets). The pytorch way always runs with glibc's defaults.")
    ap.add_argument("--statistic", choices=("median-step", "total"), default="median-step",
                    help="a run's step time: the median of its timed steps' durations (a burst of load from "
                         "elsewhere lengthens a few steps, not the median), or the timed steps' total / steps")
    ap.add_argument("--seed", type=int, default=0, help="initialisation and data")
    ap.add_argument("--ranks", type=int, default=1,
                    help="processes; > 1 compares ampkit (gloo plugin) with PyTorch DDP (gloo), started by torchrun")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where ampkit and pytorch train; cuda leaves the CPU-only hand-written loop out")
    ap.add_argument("--pytorch-adamw", choices=("fused", "default"), default="fused",
                    help="the pytorch way's optimizer: AdamW(fused=True), its fastest, or torch's default AdamW")
    ap.add_argument("--timeout", type=float, default=0, help="seconds before one run is killed; 0: none")
    ap.add_argument("--ampkit-extra", default="", metavar="OPTIONS",
                    help="more ampkit-train options for the ampkit way, e.g. '--layer-norms-top-k 0'")
    ap.add_argument("--csv", default="", help="also write one row per workload/precision/way here")
    args = ap.parse_args()

    try:
        workloads, precisions = presets_and_precisions(args.workloads, args.precisions)
    except ValueError as e:
        fail(str(e))
    ways = [w for w in args.ways.split(",") if w]
    for w in ways:
        if w not in WAYS:
            fail(f"unknown way '{w}' ({', '.join(WAYS)})")
    if not workloads or not precisions or not ways:
        fail("--workloads, --precisions and --ways each need at least one entry")
    if args.ranks < 1 or args.batch_size % args.ranks:
        fail(f"--ranks must be >= 1 and divide --batch-size {args.batch_size}")
    args.torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if args.device == "cuda":
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True)
        if probe.stdout.strip() != "True":
            print("no GPU: nothing to measure (torch sees no CUDA device)")
            return 0
        if args.ranks > 1:
            fail("--device cuda compares one process (multi-GPU data parallelism is not measured here)")
        if "libtorch" in ways:
            ways.remove("libtorch")  # the hand-written loop runs on the CPU only
    if args.ranks > 1:
        if "libtorch" in ways:
            ways.remove("libtorch")  # no data-parallel hand-written loop
        if not os.access(args.torchrun, os.X_OK):
            fail(f"{args.torchrun} not found; --ranks needs torch's torchrun (tools/setup.sh installs torch)")
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1 or args.repeats < 1 or args.threads < 0:
        fail("--steps, --batch-size and --repeats must be >= 1, --warmup and --threads >= 0")

    args.ampkit_train = os.path.join(args.build, "bin", "ampkit-train")
    args.handwritten = os.path.join(args.build, "bin", "ampkit-bench-handwritten")
    if "ampkit" in ways and not os.access(args.ampkit_train, os.X_OK):
        fail(f"{args.ampkit_train} not found; build first (tools/test.sh or tools/run.sh) or give --build")
    if "libtorch" in ways and not os.access(args.handwritten, os.X_OK):
        print(f"{PROG}: {args.handwritten} not found (not built yet?): skipping the libtorch way", file=sys.stderr)
        ways.remove("libtorch")
    if not ways:
        fail("no way left to run")

    load_before = os.getloadavg()[0]
    if args.threads == 0 and load_before >= 1.0:
        print(f"{PROG}: note: 1-minute load average {load_before:.2f} on {os.cpu_count()} cores; with LibTorch's "
              f"default thread count the ways contend with that load (consider --threads 1)", file=sys.stderr)
    results = {}  # (preset, precision, way) -> list of run results
    stopped = False
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        measure(args, workloads, precisions, ways, results)
    except Stopped:
        stopped = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the table is printed whatever comes now
    # The rows whose runs all ended (all of them unless a SIGTERM stopped the loop).
    done = [(preset, precision) for preset in workloads for precision in precisions
            if all(len(results.get((preset, precision, w), [])) == args.repeats for w in ways)]

    rows = []
    for preset, precision in done:
        for way in ways:
            rs = results[(preset, precision, way)]
            ok = [r for r in rs if "error" not in r]
            reported = {r["parameters"] for r in ok if r.get("parameters") is not None}
            if reported and reported != {PRESETS[preset]["parameters"]}:
                print(f"{PROG}: warning: {way} reports {sorted(reported)} parameters for {preset}, "
                      f"expected {PRESETS[preset]['parameters']}", file=sys.stderr)
            rows.append({
                "workload": preset, "precision": precision, "way": way,
                "parameters": PRESETS[preset]["parameters"], "batch_size": args.batch_size,
                "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
                "runs": len(rs), "failed": len(rs) - len(ok),
                "samples_per_second": median_or_none([r["samples_per_second"] for r in ok]),
                "samples_per_second_min": min((r["samples_per_second"] for r in ok), default=None),
                "samples_per_second_max": max((r["samples_per_second"] for r in ok), default=None),
                "step_ms": median_or_none([r["step_ms"] for r in ok]),
                "total_step_ms": median_or_none([r["total_step_ms"] for r in ok]),
                "statistic": args.statistic,
                "peak_rss_mb": max((r["peak_rss_mb"] for r in ok if r["peak_rss_mb"] is not None), default=None),
                "skipped_steps": median_or_none([r.get("skipped_steps") for r in ok]),
                "error": "; ".join(sorted({r["error"] for r in rs if "error" in r})),
            })

    get = lambda preset, precision, way, key: next(
        (r[key] for r in rows if (r["workload"], r["precision"], r["way"]) == (preset, precision, way)), None)
    threads = args.threads if args.threads > 0 else "library default"
    print(f"\n{cpu_description()}, {os.cpu_count()} logical CPUs; "
          f"{args.steps} timed steps after {args.warmup} warm-up, global batch {args.batch_size} on {args.ranks} "
          f"rank(s), threads {threads}, device {args.device}, pytorch AdamW {args.pytorch_adamw}, "
          f"libtorch malloc: {args.libtorch_malloc}, "
          f"step time: {'median step' if args.statistic == 'median-step' else 'total / steps'} of each run, "
          f"median of {args.repeats} run(s); 1-minute load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; samples/s (higher is better)\n")
    head = ["workload", "precision", "params"] + [f"{w} samples/s" for w in ways] + [f"{w} peak RSS MB" for w in ways]
    if "ampkit" in ways and "libtorch" in ways:
        head.append("ampkit/libtorch step time (<= 1.02)")
    if "ampkit" in ways and "pytorch" in ways:
        head.append("ampkit/pytorch throughput (>= 1)")
        if args.repeats > 1:
            head.append("ampkit/pytorch per repetition, min-max")

    def per_repetition(preset, precision):
        """ampkit/pytorch throughput of each repetition (the two ran next to each other), failed ones left out."""
        a, p = results[(preset, precision, "ampkit")], results[(preset, precision, "pytorch")]
        return [x["samples_per_second"] / y["samples_per_second"] for x, y in zip(a, p)
                if "error" not in x and "error" not in y]

    inside_spread = 0  # rows below PyTorch by the medians where some repetition had ampkit ahead
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    met = {"libtorch": [0, 0], "pytorch": [0, 0]}
    for preset, precision in done:
        cells = [preset, precision, f"{PRESETS[preset]['parameters']:,}"]
        cells += [fmt(get(preset, precision, w, "samples_per_second"), ".1f") for w in ways]
        cells += [fmt(get(preset, precision, w, "peak_rss_mb"), ".0f") for w in ways]
        a_ms, a_sps = get(preset, precision, "ampkit", "step_ms"), get(preset, precision, "ampkit", "samples_per_second")
        if "ampkit" in ways and "libtorch" in ways:
            l_ms = get(preset, precision, "libtorch", "step_ms")
            ratio = a_ms / l_ms if a_ms and l_ms else None
            if ratio is not None:
                met["libtorch"][0] += ratio <= 1.02
                met["libtorch"][1] += 1
            cells.append(fmt(ratio, ".3f"))
        if "ampkit" in ways and "pytorch" in ways:
            p_sps = get(preset, precision, "pytorch", "samples_per_second")
            ratio = a_sps / p_sps if a_sps and p_sps else None
            if ratio is not None:
                met["pytorch"][0] += ratio >= 1.0
                met["pytorch"][1] += 1
            cells.append(fmt(ratio, ".3f"))
            if args.repeats > 1:
                reps = per_repetition(preset, precision)
                cells.append(f"{min(reps):.3f}-{max(reps):.3f}" if reps else "-")
                if ratio is not None and ratio < 1.0 and reps and max(reps) >= 1.0:
                    inside_spread += 1
        print("| " + " | ".join(cells) + " |")
    print()
    if met["libtorch"][1]:
        print(f"ampkit within 2% of the hand-written LibTorch loop: {met['libtorch'][0]}/{met['libtorch'][1]} rows")
    if met["pytorch"][1]:
        print(f"ampkit at least as fast as PyTorch: {met['pytorch'][0]}/{met['pytorch'][1]} rows" +
              (f"; of the {met['pytorch'][1] - met['pytorch'][0]} others, {inside_spread} with a repetition in which "
               f"ampkit was ahead" if args.repeats > 1 and met["pytorch"][0] < met["pytorch"][1] else ""))
    failed = [r for r in rows if r["error"]]
    for r in failed:
        print(f"{PROG}: {r['workload']} {r['precision']} {r['way']}: {r['failed']}/{r['runs']} runs failed: {r['error']}",
              file=sys.stderr)

    if args.csv:
        keys = ["workload", "precision", "way", "parameters", "batch_size", "steps", "warmup", "threads", "runs",
                "failed", "samples_per_second", "samples_per_second_min", "samples_per_second_max", "step_ms",
                "total_step_ms", "statistic", "peak_rss_mb", "skipped_steps", "error"]
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
        print(f"wrote {args.csv}", file=sys.stderr)
    if stopped:
        print(f"{PROG}: stopped by SIGTERM after {len(done)} of {len(workloads) * len(precisions)} rows: "
              f"the table holds those", file=sys.stderr)
        return 3
    return 1 if failed else 0


def measure(args, workloads, precisions, ways, results):
    """Every run, the ways' order rotating between repetitions; each run's line as it ends."""
    with tempfile.TemporaryDirectory(prefix="ampkit-throughput-") as tmp:
        for preset in workloads:
            for precision in precisions:
                for rep in range(args.repeats):
                    order = ways[rep % len(ways):] + ways[:rep % len(ways)]
                    for way in order:
                        r = run_way(way, args, preset, precision, tmp)
                        results.setdefault((preset, precision, way), []).append(r)
                        what = r["error"] if "error" in r else \
                            f"{r['samples_per_second']:.1f} samples/s, {r['step_ms']:.2f} ms/step, " \
                            f"peak RSS {fmt(r['peak_rss_mb'], '.0f')} MB"
                        print(f"  {preset:8s} {precision} {way:8s} #{rep + 1}: {what}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
