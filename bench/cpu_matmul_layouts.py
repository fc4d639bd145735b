#!/usr/bin/env python3
"""The three matmuls of a Linear layer's training step on this CPU, per dtype (docs/benchmarks.md).

For a layer y = x @ W.T with x: batch x n and W: n x n (out x in, row-major, as nn.Linear and
autocast's cached cast hold it), a training step computes

  forward      x @ W.T     (W read transposed)
  input grad   g @ W       (W read as stored)
  weight grad  g.T @ x

and prints the milliseconds of each in fp32, bf16 and fp16 (median of --repeats after one warm-up),
and each one's ratio to fp32. On CPUs where LibTorch cannot hand bf16/fp16 matmuls to oneDNN (no
AVX-512 or AVX-NE-CONVERT for bf16, no AVX512-FP16 or AVX-NE-CONVERT for fp16) the input gradient
is the slow one; ampkit-train prints a note on such CPUs.

With --processes N it instead times only the slow one, the input gradient g @ W in --dtype, --repeats
times in each of N fresh python processes, one after another, and prints each process's calls: that
kernel's speed depends on where a process's pages land and varies between processes far more than
within one, which is why one run per way cannot compare ways on such rows.

    bench/cpu_matmul_layouts.py [--batch 64] [--width 2048] [--repeats 3] [--threads 0]
        [--processes 0 [--dtype bf16]]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def time_input_grad(args):
    """In a child process: --repeats timed calls of g @ W (no warm-up: every call is timed), as JSON."""
    w = (torch.randn(args.width, args.width) / args.width ** 0.5).to(DTYPES[args.dtype])
    g = torch.randn(args.batch, args.width).to(DTYPES[args.dtype])
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        g @ w
        times.append(1000.0 * (time.perf_counter() - t))
    print(json.dumps(times))
    return 0


def across_processes(args):
    cmd = [sys.executable, __file__, "--one-process", "--batch", str(args.batch), "--width", str(args.width),
           "--repeats", str(args.repeats), "--threads", str(args.threads), "--dtype", args.dtype]
    print(f"\ninput grad g @ W in {args.dtype}, {args.repeats} call(s) in each of {args.processes} fresh "
          f"processes\n")
    print("| process | ms per call | max/min within the process |")
    print("|---|---|---|")
    medians = []
    for i in range(args.processes):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"cpu_matmul_layouts.py: error: process {i + 1} exited {out.returncode}: "
                  f"{out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ''}", file=sys.stderr)
            return 1
        times = json.loads(out.stdout.strip().splitlines()[-1])
        medians.append(statistics.median(times))
        print(f"| {i + 1} | {', '.join(f'{t:.0f}' for t in times)} | {max(times) / min(times):.3f} |")
    print(f"\nbetween processes (median call of each): {min(medians):.0f} to {max(medians):.0f} ms, "
          f"max/min {max(medians) / min(medians):.3f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="rows of x and g (the batch)")
    ap.add_argument("--width", type=int, default=2048, help="the layer's input and output width n")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per matmul; the median is printed")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 keeps torch's default")
    ap.add_argument("--processes", type=int, default=0,
                    help="time only the input gradient g @ W, in this many fresh processes (0: the per-dtype table)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="the dtype of --processes")
    ap.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)  # a child of --processes
    args = ap.parse_args()
    if args.batch < 1 or args.width < 1 or args.repeats < 1 or args.threads < 0 or args.processes < 0:
        print("cpu_matmul_layouts.py: error: --batch, --width and --repeats must be >= 1, --threads and "
              "--processes >= 0", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.one_process:
        return time_input_grad(args)
    caps = torch._C._cpu._get_cpu_capability()
    flags = [f for f in ("avx2", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_bf16", "avx512_fp16", "amx_bf16",
                         "amx_fp16", "avx_ne_convert") if caps.get(f)]
    print(f"CPU: {caps.get('cpu_name', '?')}, flags: {' '.join(flags) or 'none'}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); batch {args.batch}, width {args.width}, median of {args.repeats}")
    if args.processes:
        return across_processes(args)
    x32 = torch.randn(args.batch, args.width)
    w32 = torch.randn(args.width, args.width) / args.width ** 0.5
    g32 = torch.randn(args.batch, args.width)
    ops = (("forward x @ W.T", lambda x, w, g: x @ w.t()),
           ("input grad g @ W", lambda x, w, g: g @ w),
           ("weight grad g.T @ x", lambda x, w, g: g.t() @ x))
    ms = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, w, g = x32.to(dtype), w32.to(dtype), g32.to(dtype)
        for name, f in ops:
            f(x, w, g)
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                f(x, w, g)
                times.append(1000.0 * (time.perf_counter() - t))
            ms[name, dtype] = statistics.median(times)
    print()
    print("| matmul | fp32 ms | bf16 ms | fp16 ms | bf16/fp32 | fp16/fp32 |")
    print("|---|---|---|---|---|---|")
    for name, _ in ops:
        f32, b16, f16 = (ms[name, d] for d in (torch.float32, torch.bfloat16, torch.float16))
        print(f"| {name} | {f32:.2f} | {b16:.2f} | {f16:.2f} | {b16 / f32:.1f} | {f16 / f32:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
