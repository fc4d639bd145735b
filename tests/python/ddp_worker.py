"""One rank of tests/python/test_ddp.py, run by torchrun (not collected by pytest).

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 ddp_worker.py OUT_DIR \
        [--nan-policy skip|abort] [--plant input|loss] [--steps 30] [--nan-step 10] [--nan-rank 1]
        [--average-loss]

Trains a small MLP with torch DDP over gloo on the CPU, CPU autocast fp16 and
ampkit.GradScaler("cpu", clipper="norm", opt={"clipper.max_norm": 1.0}). At --nan-step, rank
--nan-rank sets x[0, 0] = nan in its forward input, so its loss and its local gradients are not
finite; DDP averages the gradients, so every rank's averaged gradients are not finite either.
With --plant loss it adds a detached nan to its loss instead: that rank's loss is not finite
while every gradient (its own and the average) stays finite. --average-loss creates the scaler with
average_loss=True: the loss the NaN policy reads is the mean over the ranks.
Writes OUT_DIR/rank-R.json: rank, stepped flags, scale sequence (get_scale() after each update),
the step records' actions and reasons, the losses, a sha256 of the parameters' bytes, the host reads
of each step() + update() and how the last step ran (host_sync).
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)

import ampkit  # noqa: E402  (PYTHONPATH names the build tree's python folder)


def parameter_sha256(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--nan-policy", default="skip")
    ap.add_argument("--plant", choices=("input", "loss"), default="input")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--nan-step", type=int, default=10)
    ap.add_argument("--nan-rank", type=int, default=1)
    ap.add_argument("--average-loss", action="store_true")
    ap.add_argument("--optimizer", choices=("sgd", "adamw_fused"), default="sgd")
    ap.add_argument("--sync", choices=("auto", "step", "deferred"), default="auto")
    ap.add_argument("--unwrapped", action="store_true", help="no DDP: each rank trains its own replica")
    ap.add_argument("--no-backward-step", type=int, default=-1,
                    help="at this step rank --nan-rank runs no backward (no gradients), rank 0 plants an inf")
    args = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(1234 + rank)  # a different model on each rank: DDP must broadcast rank 0's
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    ddp = model if args.unwrapped else torch.nn.parallel.DistributedDataParallel(model)
    if args.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, fused=True)
    scaler = ampkit.GradScaler(
        "cpu", clipper="norm", nan_policy=args.nan_policy, opt={"clipper.max_norm": 1.0}, model=model,
        average_loss=args.average_loss, sync=args.sync,
    )

    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of data
    stepped, scales, actions, reasons, losses, read_losses, reads = [], [], [], [], [], [], []
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randint(0, 4, (8,), generator=gen)
        plant = step == args.nan_step and rank == args.nan_rank
        if plant and args.plant == "input":
            x[0, 0] = math.nan
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
        if plant and args.plant == "loss":
            loss = loss + torch.tensor(math.nan)  # a constant: d(loss)/d(parameters) is unchanged
        if step == args.no_backward_step and rank == args.nan_rank:
            scaler.scale(loss)  # the loss, no backward: this rank has no gradients this step
        else:
            scaler.scale(loss).backward()
        if step == args.no_backward_step and rank == 0:
            model[0].weight.grad[0, 0] = math.inf
        before = torch.ops.ampkit.host_reads()
        took = scaler.step(opt)
        scaler.update()  # nan_policy=abort raises ampkit.TrainingAborted here: the rank exits 1
        reads.append(torch.ops.ampkit.host_reads() - before)
        record = scaler.last_step  # the step's record (a deferred step's is waited for here)
        stepped.append(bool(took))
        scales.append(scaler.get_scale())
        actions.append(str(record["action"]))
        reasons.append(str(record["reason"]))
        read_losses.append(record["loss"] if math.isfinite(record["loss"]) else str(record["loss"]))
        losses.append(float(loss.item()) if math.isfinite(loss.item()) else str(loss.item()))

    result = {
        "rank": rank,
        "world_size": world,
        "stepped": stepped,
        "scales": scales,
        "actions": actions,
        "reasons": reasons,
        "losses": losses,
        "read_losses": read_losses,  # the loss the NaN policy read (0 where it read none)
        "param_sha256": parameter_sha256(model),
        "reads": reads,  # host reads in step() and update()
        "host_sync": record["host_sync"],  # how the last step ran
    }
    path = os.path.join(args.out_dir, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
