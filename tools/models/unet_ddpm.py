#!/usr/bin/env python3
"""A tiny DDPM U-Net on Fashion-MNIST that learns to predict the noise, for ampkit-train.

    python3 tools/models/unet_ddpm.py OUT_DIR [--train 6000] [--channels 16]
    build/bin/ampkit-train --workload torchscript --model OUT_DIR/model.pt --data OUT_DIR/data.pt \\
        --test-data OUT_DIR/test.pt --loss returned --precision bf16 --steps 300

forward(images [N, 1, 28, 28] in [-1, 1], labels [N]) draws a timestep t and Gaussian noise per
image (from the global generator, which ampkit-train seeds and checkpoints), noises the images with
the DDPM schedule (200 linear betas) and returns the mean squared error of the predicted noise
(--loss returned; the labels are not used). Writes model.pt (torch.jit.script), data.pt, test.pt.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.nn.functional as F

from data import fashion_mnist


class ResBlock(torch.nn.Module):
    def __init__(self, inputs: int, outputs: int, time_width: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.GroupNorm(4, inputs)
        self.conv1 = torch.nn.Conv2d(inputs, outputs, 3, padding=1)
        self.time = torch.nn.Linear(time_width, outputs)
        self.norm2 = torch.nn.GroupNorm(4, outputs)
        self.conv2 = torch.nn.Conv2d(outputs, outputs, 3, padding=1)
        self.skip = torch.nn.Conv2d(inputs, outputs, 1) if inputs != outputs else torch.nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.time(t)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class UNet(torch.nn.Module):
    def __init__(self, channels: int = 16, steps: int = 200) -> None:
        super().__init__()
        c, tw = channels, 4 * channels
        self.steps = steps
        betas = torch.linspace(1e-4, 0.02, steps)
        self.register_buffer("alpha_bar", torch.cumprod(1.0 - betas, dim=0))
        self.time_mlp = torch.nn.Sequential(torch.nn.Linear(c, tw), torch.nn.SiLU(), torch.nn.Linear(tw, tw))
        self.stem = torch.nn.Conv2d(1, c, 3, padding=1)
        self.down1 = ResBlock(c, c, tw)                              # 28
        self.pool1 = torch.nn.Conv2d(c, c, 3, stride=2, padding=1)   # 14
        self.down2 = ResBlock(c, 2 * c, tw)
        self.pool2 = torch.nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1)  # 7
        self.middle = ResBlock(2 * c, 2 * c, tw)
        self.up2 = torch.nn.ConvTranspose2d(2 * c, 2 * c, 2, stride=2)     # 14
        self.dec2 = ResBlock(4 * c, c, tw)
        self.up1 = torch.nn.ConvTranspose2d(c, c, 2, stride=2)             # 28
        self.dec1 = ResBlock(2 * c, c, tw)
        self.out = torch.nn.Conv2d(c, 1, 3, padding=1)
        self.time_width = c

    def embed_time(self, t: torch.Tensor) -> torch.Tensor:
        half = self.time_width // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device).float() / half)
        angles = t.float()[:, None] * freqs[None]
        return self.time_mlp(torch.cat([angles.sin(), angles.cos()], dim=1))

    def predict_noise(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        te = self.embed_time(t)
        h1 = self.down1(self.stem(x), te)
        h2 = self.down2(self.pool1(h1), te)
        m = self.middle(self.pool2(h2), te)
        d2 = self.dec2(torch.cat([self.up2(m), h2], dim=1), te)
        d1 = self.dec1(torch.cat([self.up1(d2), h1], dim=1), te)
        return self.out(d1)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        t = torch.randint(0, self.steps, (images.size(0),), device=images.device)
        noise = torch.randn_like(images)
        a = self.alpha_bar[t][:, None, None, None]
        noisy = a.sqrt() * images + (1.0 - a).sqrt() * noise
        return F.mse_loss(self.predict_noise(noisy, t).float(), noise)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--train", type=int, default=6000, help="training images (default 6000)")
    p.add_argument("--test", type=int, default=500, help="test images (default 500)")
    p.add_argument("--channels", type=int, default=16)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for split, count, name in (("train", args.train, "data.pt"), ("test", args.test, "test.pt")):
        images, labels = fashion_mnist(split, count)
        torch.save({"inputs": images * 2.0 - 1.0, "targets": labels}, os.path.join(args.out, name))
    torch.manual_seed(0)
    model = UNet(args.channels)
    torch.jit.script(model).save(os.path.join(args.out, "model.pt"))
    print(f"{args.out}: model.pt ({sum(p.numel() for p in model.parameters())} parameters), data.pt, test.pt")


if __name__ == "__main__":
    main()
