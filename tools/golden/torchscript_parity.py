#!/usr/bin/env python3
"""Golden losses for ampkit-train --workload torchscript: a model that is none of the built-ins
(convolution, layer norm, multi-head attention; no dropout), its data, and the per-step losses of a
plain eager PyTorch loop over the same batches in file order (AdamW, fp32, no clipping).

    python3 tools/golden/torchscript_parity.py OUT_DIR [--steps 20] [--batch-size 16]

Writes OUT_DIR/model.pt (torch.jit.script), OUT_DIR/data.pt and OUT_DIR/test.pt
(torch.save({"inputs": X, "targets": Y})) and OUT_DIR/golden.json: {"losses": [...], "test_loss":
..., "test_accuracy": ...} (the evaluation of the trained eager model, as ampkit-train defines it:
cross entropy summed over the test set / its size, argmax accuracy). The test
(tests/python/test_torchscript_workload.py) trains the same files with ampkit-train and compares.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F


class ConvAttentionNet(torch.nn.Module):
    """Sequences of 8-channel vectors: a 1-d convolution, layer norm, self-attention, a head."""

    def __init__(self, channels: int = 8, width: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, width, kernel_size=3, padding=1)
        self.norm = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, num_heads=4, batch_first=True)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [N, T, C]
        h = self.conv(x.transpose(1, 2)).transpose(1, 2)
        h = self.norm(F.gelu(h))
        a, _ = self.attention(h, h, h, need_weights=False)
        return self.head((h + a).mean(dim=1))


def make_data(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, 8, generator=g)
    y = (x[:, :, :5].sum(dim=1)).argmax(dim=1)
    return {"inputs": x, "targets": y}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    model = ConvAttentionNet()
    torch.jit.script(model).save(os.path.join(args.out, "model.pt"))
    train, test = make_data(args.steps * args.batch_size, 1), make_data(100, 2)
    torch.save(train, os.path.join(args.out, "data.pt"))
    torch.save(test, os.path.join(args.out, "test.pt"))

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    losses = []
    for step in range(args.steps):
        sl = slice(step * args.batch_size, (step + 1) * args.batch_size)
        opt.zero_grad()
        loss = F.cross_entropy(model(train["inputs"][sl]).float(), train["targets"][sl])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        out = model(test["inputs"]).float()
        test_loss = F.cross_entropy(out, test["targets"], reduction="sum").item() / len(test["targets"])
        accuracy = (out.argmax(-1) == test["targets"]).float().mean().item()
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump({"losses": losses, "test_loss": test_loss, "test_accuracy": accuracy}, f)


if __name__ == "__main__":
    main()
