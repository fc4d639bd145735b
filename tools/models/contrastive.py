#!/usr/bin/env python3
"""A CLIP-style image-text model whose fp16 gradients really overflow, for ampkit-train: an image
tower and a text tower map Fashion-MNIST images and the ten class captions ("a photo of a
sneaker") into one space, and the logits are their cosine similarities divided by a learnable
temperature (CLIP's logit scale, clamped at 100). By default the temperature starts at 0.01, the
logit scale of 100 that pretrained CLIP reaches and fine-tuning starts from; at 0.07, CLIP's
pre-training start, only the first few steps overflow at torch's default loss scale.

    python3 tools/models/contrastive.py OUT_DIR [--train 6000] [--test 1000] [--width 64] [--temperature 0.01]
    build/bin/ampkit-train --workload torchscript --model OUT_DIR/model.pt --data OUT_DIR/data.pt \\
        --test-data OUT_DIR/test.pt --loss cross_entropy --precision fp16 --scaler dynamic --steps 300

forward(images [N, 1, 28, 28]) returns the [N, 10] image-to-caption logits; the cross entropy
against the class index is the image-to-text half of CLIP's loss with the captions as the text
batch, and ampkit-train's test_accuracy is zero-shot classification by caption. Under fp16
autocast the towers' matmuls and their gradients are fp16; the logits' gradient is multiplied by
the logit scale on its way back and the normalisations divide it by the features' norms, so at
torch's default loss scale of 65536 the scaled gradients pass fp16's 65504 (at scale 1 the
unscaled parameter gradients reach 5-8 in the first steps). bench/stability_demo.py and
scaler_comparison.py measure how often each loss scaler overflows on it.
Writes model.pt (torch.jit.script), data.pt and test.pt.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.nn.functional as F

from data import CLASSES, fashion_mnist


def caption_bytes(length: int = 24) -> torch.Tensor:
    out = torch.zeros((len(CLASSES), length), dtype=torch.long)
    for i, name in enumerate(CLASSES):
        text = ("a photo of a " + name).encode()
        out[i, :len(text)] = torch.tensor(list(text))
    return out


class ContrastiveImageText(torch.nn.Module):
    def __init__(self, width: int = 64, hidden: int = 256, temperature: float = 0.01) -> None:
        super().__init__()
        self.image = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, hidden), torch.nn.GELU(),
                                         torch.nn.Linear(hidden, width))
        self.embed = torch.nn.Embedding(256, width)
        self.text = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width))
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / temperature)))
        self.register_buffer("captions", caption_bytes())

    def caption_features(self) -> torch.Tensor:
        mask = (self.captions != 0).unsqueeze(-1)
        pooled = (self.embed(self.captions) * mask).sum(1) / mask.sum(1)
        return self.text(pooled)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        image = F.normalize(self.image(images), dim=-1)
        text = F.normalize(self.caption_features(), dim=-1)
        return self.logit_scale.exp().clamp(max=100.0) * image @ text.t()


def export(path: str, seed: int = 0, width: int = 64, temperature: float = 0.01) -> torch.nn.Module:
    """Writes torch.jit.script(model) with weights drawn from `seed`; returns the model."""
    torch.manual_seed(seed)
    model = ContrastiveImageText(width, temperature=temperature)
    torch.jit.script(model).save(path)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--train", type=int, default=6000, help="training images (default 6000)")
    p.add_argument("--test", type=int, default=1000, help="test images (default 1000)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.01,
                   help="initial temperature (default 0.01: pretrained CLIP's; 0.07 is CLIP's pre-training start)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights (default 0)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for split, count, name in (("train", args.train, "data.pt"), ("test", args.test, "test.pt")):
        images, labels = fashion_mnist(split, count)
        torch.save({"inputs": images, "targets": labels}, os.path.join(args.out, name))
    model = export(os.path.join(args.out, "model.pt"), args.seed, args.width, args.temperature)
    print(f"{args.out}: model.pt ({sum(p.numel() for p in model.parameters())} parameters), data.pt, test.pt")


if __name__ == "__main__":
    main()
