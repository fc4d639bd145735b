#!/usr/bin/env python3
"""A tiny vision-language model: a ViT-style patch encoder and a causal text decoder that learns to
caption each Fashion-MNIST image ("a photo of a sneaker"), for ampkit-train.

    python3 tools/models/vlm.py OUT_DIR [--train 6000] [--width 64]
    build/bin/ampkit-train --workload torchscript --model OUT_DIR/model.pt --data OUT_DIR/data.pt \\
        --test-data OUT_DIR/test.pt --loss returned --precision bf16 --steps 300

forward(images [N, 1, 28, 28], captions [N, L]) returns the teacher-forced cross entropy of the
caption's bytes (--loss returned); caption(images) decodes greedily (an exported method, for Python).
Captions are bytes framed by BOS (1) and EOS (0), padded with EOS, which the loss ignores after
the first. Writes model.pt (torch.jit.script), data.pt and test.pt.
"""

from __future__ import annotations

import argparse
import os
from typing import List

import torch
import torch.nn.functional as F

from data import CLASSES, fashion_mnist

BOS, EOS = 1, 0


def captions_for(labels: torch.Tensor, length: int) -> torch.Tensor:
    out = torch.full((len(labels), length), EOS, dtype=torch.long)
    for i, label in enumerate(labels.tolist()):
        text = ("a photo of a " + CLASSES[label]).encode()
        out[i, 0] = BOS
        out[i, 1:1 + len(text)] = torch.tensor(list(text))
    return out


class VisionLanguageModel(torch.nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, caption_length: int = 24, vocab: int = 256) -> None:
        super().__init__()
        self.patches = torch.nn.Conv2d(1, width, kernel_size=7, stride=7)  # 16 patches of 7x7
        self.image_position = torch.nn.Parameter(torch.zeros(1, 16, width))
        self.encoder = torch.nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.embed = torch.nn.Embedding(vocab, width)
        self.text_position = torch.nn.Parameter(torch.zeros(1, caption_length, width))
        self.decoder = torch.nn.TransformerDecoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)
        torch.nn.init.normal_(self.image_position, std=0.02)
        torch.nn.init.normal_(self.text_position, std=0.02)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        p = self.patches(images).flatten(2).transpose(1, 2)
        return self.encoder(p + self.image_position)

    def logits(self, memory: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.size(1)
        mask = torch.triu(torch.full((t, t), float("-inf"), device=tokens.device), diagonal=1)
        h = self.decoder(self.embed(tokens) + self.text_position[:, :t], memory, tgt_mask=mask)
        return self.head(self.norm(h))

    def forward(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
        inputs, targets = captions[:, :-1], captions[:, 1:].clone()
        # Predict every byte and the first EOS; ignore the padding after it.
        after_end = torch.cumsum((targets == 0).long(), dim=1) > 1
        targets = targets.masked_fill(after_end, -100)  # cross_entropy's ignore_index
        logits = self.logits(self.encode(images), inputs)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)

    @torch.jit.export
    def caption(self, images: torch.Tensor, length: int = 24) -> List[List[int]]:
        memory = self.encode(images)
        tokens = torch.ones((images.size(0), 1), dtype=torch.long, device=images.device)  # BOS
        for _ in range(length - 1):
            next_token = self.logits(memory, tokens)[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
        return tokens[:, 1:].tolist()


def decode(tokens: List[int]) -> str:
    out = bytearray()
    for t in tokens:
        if t == EOS:  # 0
            break
        out.append(t)
    return out.decode(errors="replace")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--train", type=int, default=6000, help="training images (default 6000)")
    p.add_argument("--test", type=int, default=500, help="test images (default 500)")
    p.add_argument("--width", type=int, default=64)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    length = 24
    for split, count, name in (("train", args.train, "data.pt"), ("test", args.test, "test.pt")):
        images, labels = fashion_mnist(split, count)
        torch.save({"inputs": images, "targets": captions_for(labels, length)}, os.path.join(args.out, name))
    torch.manual_seed(0)
    model = VisionLanguageModel(args.width, caption_length=length)
    torch.jit.script(model).save(os.path.join(args.out, "model.pt"))
    print(f"{args.out}: model.pt ({sum(p.numel() for p in model.parameters())} parameters), data.pt, test.pt")


if __name__ == "__main__":
    main()
