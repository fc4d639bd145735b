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

    tools/bench/cpu_matmul_layouts.py [--batch 64] [--width 2048] [--repeats 3] [--threads 0]
"""
import argparse
import statistics
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="rows of x and g (the batch)")
    ap.add_argument("--width", type=int, default=2048, help="the layer's input and output width n")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per matmul; the median is printed")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 keeps torch's default")
    args = ap.parse_args()
    if args.batch < 1 or args.width < 1 or args.repeats < 1 or args.threads < 0:
        print("cpu_matmul_layouts.py: error: --batch, --width and --repeats must be >= 1, --threads >= 0",
              file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    caps = torch._C._cpu._get_cpu_capability()
    flags = [f for f in ("avx2", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_bf16", "avx512_fp16", "amx_bf16",
                         "amx_fp16", "avx_ne_convert") if caps.get(f)]
    print(f"CPU: {caps.get('cpu_name', '?')}, flags: {' '.join(flags) or 'none'}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); batch {args.batch}, width {args.width}, median of {args.repeats}")
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
