#!/usr/bin/env python3
"""The PyTorch side of ampkit's checkpoint interop (docs/configuration.md, "PyTorch interop").

Plain PyTorch only: the synthetic workload's MLP and data as bench/torch_reference.py
rebuilds them from hosts/train/src/workloads/synthetic.cpp (same generators, same seeds), trained
with torch.optim.AdamW(fused=True) in fp32.

  continue CKPT --steps N      load an ampkit checkpoint folder with torch.load(weights_only=True)
                               into nn modules and AdamW, train N more steps from its data
                               position; print the losses as a JSON list
  start FILE --steps N [...]   train a fresh model a few steps, save {model, optimizer, scaler}
                               to FILE as the GradScaler docs do, then train N more steps from
                               batch 0; print those N losses (what --init-from FILE must give)

The synthetic options (--inputs, --width, --depth, --classes, --batch-size, --seed, --lr,
--weight-decay) must match ampkit-train's; `continue` reads them from the checkpoint's manifest.
"""
import argparse
import json
import pathlib
import sys
import types

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import torch_reference as reference  # noqa: E402  the workloads rebuilt in PyTorch (Mlp, Synthetic)

Mlp = reference.Mlp


def synthetic(a):
    """The synthetic workload of bench/torch_reference.py, for these options."""
    return reference.Synthetic(types.SimpleNamespace(
        synthetic_inputs=a.inputs, synthetic_width=a.width, synthetic_depth=a.depth, synthetic_classes=a.classes,
        batch_size=a.batch_size, seed=a.seed))


def train(work, opt, first_step, steps):
    """ampkit's loop for --accumulate 1 in fp32: batch = data step, 1000 batches an epoch."""
    losses = []
    for step in range(first_step, first_step + steps):
        work.start_epoch(step // 1000)
        loss = work.loss(step % 1000)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def from_manifest(a, folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    config = {s["name"]: s["value"] for s in manifest["config"]}
    for key, name, kind in [("inputs", "synthetic-inputs", int), ("width", "synthetic-width", int),
                            ("depth", "synthetic-depth", int), ("classes", "synthetic-classes", int),
                            ("batch_size", "batch-size", int), ("seed", "seed", int), ("lr", "lr", float),
                            ("weight_decay", "weight-decay", float)]:
        setattr(a, key, kind(config[name]))
    if config.get("workload") != "synthetic" or int(config.get("accumulate", "1")) != 1:
        sys.exit("pytorch_interop.py: the checkpoint must be of --workload synthetic with --accumulate 1")
    return manifest["step"]["data_position"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["continue", "start"])
    p.add_argument("path", type=pathlib.Path)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--inputs", type=int, default=16)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warm-steps", type=int, default=5, help="start: steps trained before saving")
    a = p.parse_args()
    torch.set_num_threads(1)

    if a.mode == "continue":
        first = from_manifest(a, a.path)
        work = synthetic(a)
        work.model.load_state_dict(torch.load(a.path / "model.pt", weights_only=True))
        opt = torch.optim.AdamW(work.model.parameters(), lr=a.lr, weight_decay=a.weight_decay, fused=True)
        opt.load_state_dict(torch.load(a.path / "optimizer_state_dict.pt", weights_only=True))
        print(json.dumps(train(work, opt, first, a.steps)))
        return

    torch.manual_seed(a.seed + 12345)  # another initialisation than ampkit's
    work = synthetic(a)
    opt = torch.optim.AdamW(work.model.parameters(), lr=a.lr, weight_decay=a.weight_decay, fused=True)
    train(work, opt, 500, a.warm_steps)  # other batches, so the moments are not zero
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**14, growth_interval=10)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    scaler._growth_tracker.fill_(7)
    torch.save({"model": work.model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict()},
               a.path)
    print(json.dumps(train(work, opt, 0, a.steps)))

if __name__ == "__main__":
    main()
