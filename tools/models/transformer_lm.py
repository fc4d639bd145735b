#!/usr/bin/env python3
"""A small byte-level transformer language model on the fortunes corpus, for ampkit-train.

    python3 tools/models/transformer_lm.py OUT_DIR [--context 64] [--width 96] [--layers 2]
    build/bin/ampkit-train --workload torchscript --model OUT_DIR/model.pt --data OUT_DIR/data.pt \\
        --test-data OUT_DIR/test.pt --loss cross_entropy --precision bf16 --steps 300

forward(tokens [N, T]) returns logits [N, T, 256]; --loss cross_entropy takes the class dimension
last, against the next bytes [N, T]. Writes model.pt (torch.jit.script), data.pt and test.pt.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

from data import fortunes_bytes


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        a, _ = self.attention(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.norm2(x))


class TransformerLM(torch.nn.Module):
    def __init__(self, context: int = 64, width: int = 96, heads: int = 4, layers: int = 2, vocab: int = 256) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(1, context, width))
        self.blocks = torch.nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)
        torch.nn.init.normal_(self.position, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.size(1)
        mask = torch.triu(torch.full((t, t), float("-inf"), device=tokens.device), diagonal=1)
        x = self.embed(tokens) + self.position[:, :t]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def windows(corpus: torch.Tensor, count: int, context: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, corpus.numel() - context - 1, (count,), generator=g)
    idx = starts[:, None] + torch.arange(context + 1)
    w = corpus[idx]
    return {"inputs": w[:, :-1].contiguous(), "targets": w[:, 1:].contiguous()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--train-windows", type=int, default=20000)
    p.add_argument("--test-windows", type=int, default=512)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    corpus = fortunes_bytes()
    split = corpus.numel() * 9 // 10
    torch.manual_seed(0)
    model = TransformerLM(args.context, args.width, layers=args.layers)
    torch.jit.script(model).save(os.path.join(args.out, "model.pt"))
    torch.save(windows(corpus[:split], args.train_windows, args.context, 1), os.path.join(args.out, "data.pt"))
    torch.save(windows(corpus[split:], args.test_windows, args.context, 2), os.path.join(args.out, "test.pt"))
    print(f"{args.out}: model.pt ({sum(p.numel() for p in model.parameters())} parameters), data.pt, test.pt")


if __name__ == "__main__":
    main()
