"""Data the example models train on, from what the machine has: Debian's dataset-fashion-mnist
(IDX files) and the fortunes corpus (text files). Used by tools/models/*.py."""

from __future__ import annotations

import gzip
import os
from typing import Tuple

import torch

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
FORTUNES = "/usr/share/games/fortunes"
# Fashion-MNIST's ten classes, as the captions name them.
CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot"]


def _idx(path: str) -> torch.Tensor:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def fashion_mnist(split: str = "train", limit: int | None = None, folder: str = FASHION_MNIST) -> Tuple[torch.Tensor, torch.Tensor]:
    """Images as float32 [N, 1, 28, 28] in [0, 1] and labels as int64 [N]."""
    prefix = "train" if split == "train" else "t10k"
    images = _idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"))
    labels = _idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return images.float().div(255.0).unsqueeze(1), labels.long()


def fortunes_bytes(folder: str = FORTUNES) -> torch.Tensor:
    """The corpus as int64 byte values, files in name order (*.dat and *.u8 skipped, as char-gpt)."""
    text = bytearray()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith((".dat", ".u8")) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            text += f.read()
    return torch.tensor(list(text), dtype=torch.long)
