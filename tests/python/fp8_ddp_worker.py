"""One rank of tests/python/test_fp8_ddp.py, run by torchrun (not collected by pytest).

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 fp8_ddp_worker.py OUT_DIR \
        [--layers 3] [--steps 5] [--inf-step 3] [--no-reduce] [--fsdp]

Trains an MLP of --layers ampkit.fp8.Linear layers (recipe `delayed`) under torch DDP (FSDP2's
fully_shard per layer and at the root with --fsdp) over gloo on the CPU with CPU autocast bf16 and
ampkit.GradScaler, each rank on its own data. At --inf-step rank 1 puts an inf in its input (-1:
never). Counts the calls of torch.distributed.all_reduce on the fp8
block's amaxes in each step. Writes OUT_DIR/rank-R.json: every layer's fp8_state() after each step,
those counts, the stepped flags and the fp8 field of the step records.
"""

import argparse
import datetime
import json
import math
import os
import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)

import ampkit  # noqa: E402  (PYTHONPATH names the build tree's python folder)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--inf-step", type=int, default=-1)
    ap.add_argument("--no-reduce", action="store_true")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2: fully_shard per fp8 layer and at the root")
    args = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(16, 16), torch.nn.Tanh()]
    model = ampkit.fp8.convert(torch.nn.Sequential(*layers), recipe="delayed", reduce_amax=not args.no_reduce)
    fp8 = [m for m in model.modules() if isinstance(m, ampkit.fp8.Linear)]
    block = fp8[0]._fp8_block
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in fp8:
            fully_shard(layer)
        ddp = fully_shard(model)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    scaler = ampkit.GradScaler("cpu", model=model)

    calls = []
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *a, **kw):
        if tensor.data_ptr() == block.amax.data_ptr():
            calls[-1] += 1
        return real_all_reduce(tensor, *a, **kw)

    dist.all_reduce = counting_all_reduce
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data, its own amaxes
    states, stepped, fp8_bad = [], [], []
    for step in range(args.steps):
        calls.append(0)
        x = torch.randn(8, 16, generator=gen) * (1.0 + 3.0 * rank)
        if step == args.inf_step and rank == 1:
            x[0, 0] = math.inf
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ddp(x).float().square().mean()
        scaler.scale(loss).backward()
        stepped.append(bool(scaler.step(opt)))
        scaler.update()
        fp8_bad.append(scaler.last_step["fp8_nonfinite_amaxes"])
        states.append([layer.fp8_state() for layer in fp8])  # applies the due update: no collective

    result = {"rank": rank, "states": states, "calls": calls, "stepped": stepped, "fp8_bad": fp8_bad}
    path = os.path.join(args.out_dir, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
