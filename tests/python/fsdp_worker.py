"""One rank of tests/python/test_fsdp.py, run by torchrun (not collected by pytest).

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 fsdp_worker.py OUT_DIR \
        [--steps 50] [--optimizer sgd|adamw|adamw_fused] [--plant inf|nan]

Two copies of one MLP, each sharded with FSDP2 (``fully_shard`` per Linear and at the root) over
gloo on the CPU, train side by side in CPU autocast fp16 on this rank's own data: torch's loop
(torch.amp.GradScaler + unscale_ + clip_grad_norm_ on the DTensor gradients) and ampkit's
(ampkit.GradScaler(clipper="norm")). At the steps in PLANTED, after backward, rank 1 alone writes an
inf (or a NaN) into its local shard of one gradient in both models: rank 0's own shards stay finite,
so only a reduction across the ranks lets rank 0 see it. Each step starts ampkit's model and
optimizer state from torch's (an fp16 forward turns a 1e-7 difference into a rounding flip), each
scaler keeps its own state. Writes OUT_DIR/rank-R.json: per step torch's and ampkit's stepped flag,
scale after update and clip coefficient, the largest parameter difference after the step, the host
reads in ampkit's step() and update() and how its last step ran (host_sync), ampkit's warnings, and
the messages of the misuse checks.
"""

import argparse
import datetime
import json
import math
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

torch.set_num_threads(1)

import ampkit  # noqa: E402  (PYTHONPATH names the build tree's python folder)

PLANTED = (7, 20, 21, 35)
MAX_NORM = 0.05
GROWTH_INTERVAL = 5  # short, so the scale grows between the planted steps


def make_model():
    torch.manual_seed(0)  # the same full model on every rank: fully_shard keeps each rank's shard of it
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def shard(model):
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, fused=kind == "adamw_fused")


def forward_backward(model, scaler, x, y, step, rank, plant):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if step in PLANTED and rank == 1:
        model[2].weight.grad.to_local()[0, step % 32] = math.inf if plant == "inf" else math.nan


def copy_state(a_model, t_model, a_opt, t_opt):
    """ampkit's parameters and optimizer state := torch's (local shards, DTensors)."""
    with torch.no_grad():
        for a, t in zip(a_model.parameters(), t_model.parameters()):
            a.to_local().copy_(t.to_local())
            a_opt.state[a] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in t_opt.state[t].items()}


def max_difference(a_model, t_model):
    return max(float((a.detach().to_local() - t.detach().to_local()).abs().max()) if a.to_local().numel() else 0.0
               for a, t in zip(a_model.parameters(), t_model.parameters()))


def train(args, rank, result):
    t_model, a_model = shard(make_model()), shard(make_model())
    t_opt = make_optimizer(args.optimizer, t_model.parameters())
    a_opt = make_optimizer(args.optimizer, a_model.parameters())
    t_scaler = torch.amp.GradScaler("cpu", growth_interval=GROWTH_INTERVAL)
    a_scaler = ampkit.GradScaler("cpu", growth_interval=GROWTH_INTERVAL, clipper="norm",
                                 opt={"clipper.max_norm": MAX_NORM})
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for step in range(args.steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        copy_state(a_model, t_model, a_opt, t_opt)

        t_opt.zero_grad(set_to_none=True)
        forward_backward(t_model, t_scaler, x, y, step, rank, args.plant)
        t_scaler.unscale_(t_opt)
        norm = torch.nn.utils.clip_grad_norm_(t_model.parameters(), MAX_NORM).full_tensor()
        coef = float(torch.clamp(MAX_NORM / (norm + 1e-6), max=1.0))  # clip_grad_norm_'s own expression
        found_inf = sum(v.item() for v in t_scaler._found_inf_per_device(t_opt).values())
        t_scaler.step(t_opt)
        t_scaler.update()

        a_opt.zero_grad(set_to_none=True)
        forward_backward(a_model, a_scaler, x, y, step, rank, args.plant)
        reads = torch.ops.ampkit.host_reads()
        took = a_scaler.step(a_opt)
        a_scaler.update()
        result["reads"].append(torch.ops.ampkit.host_reads() - reads)
        record = a_scaler.last_step  # (waits for a deferred step's record: after the count)

        result["torch"].append({"stepped": found_inf == 0, "scale": t_scaler.get_scale(), "clip_coef": coef,
                                "grad_norm": float(norm)})
        result["ampkit"].append({"stepped": bool(took), "scale": a_scaler.get_scale(), "clip_coef": record["clip_coef"],
                                 "grad_norm": record["grad_norm"], "action": record["action"]})
        result["param_difference"].append(max_difference(a_model, t_model))
        result["host_sync"] = record["host_sync"]  # the last step's
    return a_model, a_opt


def seeds_clipper(args, rank, result):
    """The seeds' GradientClipper on sharded gradients against clip_grad_norm_ on the same DTensors:
    the norm is the global one on every rank, the shards are clipped by one coefficient, and an inf
    in rank 1's shard alone is found on both ranks and leaves every gradient unclipped."""
    t_model, a_model = shard(make_model()), shard(make_model())
    clipper = ampkit.seeds.GradientClipper("norm", threshold=MAX_NORM, precision="fp32")
    gen = torch.Generator().manual_seed(200 + rank)
    for step in range(args.steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        for model in (t_model, a_model):
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if step == 2 and rank == 1:
                model[2].weight.grad.to_local()[0, 0] = math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(t_model.parameters(), MAX_NORM).full_tensor())
        stats = clipper.clip(a_model)
        difference = 0.0
        if math.isfinite(norm):
            difference = max(float((a.grad.to_local() - t.grad.to_local()).abs().max()) if a.grad.to_local().numel()
                             else 0.0 for a, t in zip(a_model.parameters(), t_model.parameters()))
        result["seeds_clipper"].append({"torch_norm": norm if math.isfinite(norm) else str(norm),
                                        "norm": stats["grad_norm"] if math.isfinite(stats["grad_norm"])
                                        else str(stats["grad_norm"]),
                                        "found_inf": bool(stats.get("found_inf")), "clip_coef": stats["clip_coef"],
                                        "grad_difference": difference})
        with torch.no_grad():  # the next step starts from the same parameters in both models
            for a, t in zip(a_model.parameters(), t_model.parameters()):
                a.to_local().copy_(t.to_local())


def misuse(a_model, rank, result):
    """The errors a process group other than the mesh's and a half-sharded optimizer get. No
    forward: the gradients are set by hand, so no FSDP collective runs and rank 0 may check alone."""
    only_rank0 = dist.new_group([0])  # every rank makes it; rank 1 is not in it
    plain = torch.nn.Parameter(torch.ones(3))
    checks = {"mixed": (lambda: ampkit.GradScaler("cpu"), [plain])}
    if rank == 0:
        checks["other_group"] = (lambda: ampkit.GradScaler("cpu", process_group=only_rank0), [])
    for name, (make, extra) in checks.items():
        scaler = make()
        params = list(a_model.parameters()) + extra
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.SGD(params, lr=0.1)
        scaler.scale(torch.ones(()))
        try:
            scaler.step(opt)
            result["errors"][name] = "no error"
        except ValueError as e:
            result["errors"][name] = str(e)
        opt.zero_grad(set_to_none=True)


def no_gradients(a_model, result):
    """Gradient sync left off (every sharded .grad None on every rank): torch's step() raises "No
    inf checks were recorded", on each rank; ampkit's had stepped nothing and counted a clean step."""
    for name, make in (("torch", lambda: torch.amp.GradScaler("cpu")), ("ampkit", lambda: ampkit.GradScaler("cpu"))):
        opt = torch.optim.SGD(a_model.parameters(), lr=0.1)
        opt.zero_grad(set_to_none=True)
        scaler = make()
        scaler.scale(torch.ones((), requires_grad=True))
        try:
            scaler.step(opt)
            result["errors"]["no_gradients_" + name] = "no error"
        except AssertionError as e:
            result["errors"]["no_gradients_" + name] = str(e)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--optimizer", choices=("sgd", "adamw", "adamw_fused"), default="sgd")
    ap.add_argument("--plant", choices=("inf", "nan"), default="inf")
    ap.add_argument("--seeds-clipper", action="store_true", help="only the seeds' GradientClipper check")
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    result = {"rank": rank, "world_size": dist.get_world_size(), "planted": list(PLANTED), "torch": [],
              "ampkit": [], "param_difference": [], "errors": {}, "reads": [], "seeds_clipper": []}
    if args.seeds_clipper:
        seeds_clipper(args, rank, result)
        return finish(args, rank, result)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a_model, _ = train(args, rank, result)
    result["warnings"] = sorted({str(w.message) for w in caught if "ampkit" in str(w.message)})
    misuse(a_model, rank, result)
    no_gradients(a_model, result)
    return finish(args, rank, result)


def finish(args, rank, result) -> int:
    path = os.path.join(args.out_dir, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
