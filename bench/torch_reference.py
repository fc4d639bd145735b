#!/usr/bin/env python3
"""The PyTorch 2.11 reference for the throughput comparison: ampkit-train's three
workloads with identical architectures, shapes and data, trained by the loop the PyTorch AMP
recipe prescribes, and nothing else:

    autocast(cpu, bf16|fp16) forward -> GradScaler("cpu").scale(loss).backward()
    -> scaler.unscale_(opt) -> clip_grad_norm_(params, 1.0) -> scaler.step(opt) -> scaler.update()
    -> opt.zero_grad(set_to_none=True)

AdamW(lr, weight_decay=0.01, fused=True) — PyTorch's fastest AdamW and the recipe to beat
(`--adamw default` gives torch's default implementation, foreach); the GradScaler is enabled only for fp16 (init_scale 65536,
GradScaler's defaults otherwise); fp32 runs without autocast. Data are made exactly as
ampkit-train makes them (same generator seeds for the synthetic batches, the Fashion-MNIST
shuffles and the char-gpt windows). Prints one JSON line timing the steps after the warm-up:

Started by torchrun (WORLD_SIZE > 1 in the environment) it trains data-parallel the PyTorch way:
init_process_group("gloo"), DistributedDataParallel (bucket 25 MB, as ampkit's default), and each
rank takes its contiguous slice of the global batch of --batch-size samples (rank r: rows
[r*B/W, (r+1)*B/W)). Only rank 0 prints; samples/s counts the global batch:

    torchrun --nproc-per-node 2 bench/torch_reference.py --threads 1 ...

With --device cuda the model, the autocast region and the GradScaler are CUDA's; batches are made
on the host as on the CPU and copied like ampkit-train copies them (pinned, non-blocking), and each
timed step ends with torch.cuda.synchronize() so that its time is the device's.

    bench/torch_reference.py [--workload synthetic|fashion-mnist|char-gpt] [--precision fp32|bf16|fp16]
                                   [--device cpu|cuda] [--adamw fused|default]
                                   [--steps 20] [--warmup 3] [--batch-size 64] [--threads 0] ...
"""
import argparse
import gzip
import json
import math
import os
import resource
import statistics
import sys
import time

WAY = "pytorch"
PROG = "torch_reference"
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
DEVICE = None  # torch.device of --device (main() sets it); None: the CPU


def to_device(*tensors):
    """Batches reach a GPU as ampkit-train's do: pinned host memory, a non-blocking copy."""
    if DEVICE is not None and DEVICE.type != "cpu":
        tensors = tuple(t.pin_memory().to(DEVICE, non_blocking=True) for t in tensors)
    return tensors if len(tensors) > 1 else tensors[0]


def shard(*tensors):
    """This rank's contiguous slice of the global batch (everything on one process)."""
    if WORLD == 1:
        return tensors if len(tensors) > 1 else tensors[0]
    n = tensors[0].shape[0]
    lo, hi = RANK * n // WORLD, (RANK + 1) * n // WORLD
    out = tuple(t[lo:hi] for t in tensors)
    return out if len(out) > 1 else out[0]


def fail(message, code=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # one clear line instead of a traceback
    fail(f"{e.name or e} is not installed; run tools/setup.sh", 1)


# ---------------------------------------------------------------------------------------------
# synthetic: hosts/train/src/workloads/synthetic.cpp

class Mlp(nn.Module):
    def __init__(self, inputs, width, depth, classes):
        super().__init__()
        sizes = [inputs] + [width] * depth + [classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x):
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < n:
                x = F.gelu(x)
        return x


class Synthetic:
    batches_per_epoch = 1000  # nominal, as in ampkit-train

    def __init__(self, a):
        self.a = a
        self.model = Mlp(a.synthetic_inputs, a.synthetic_width, a.synthetic_depth, a.synthetic_classes)
        gen = torch.Generator().manual_seed(a.seed ^ 0x7E4C4E5)
        self.teacher = torch.randn(a.synthetic_inputs, a.synthetic_classes, generator=gen)
        self.epoch = 0

    def start_epoch(self, epoch):
        self.epoch = epoch

    def loss(self, index):
        seed = (self.a.seed * 7919 + self.epoch * 1000003 + index) % 2**64
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(self.a.batch_size, self.a.synthetic_inputs, generator=gen)
        with torch.autocast("cpu", enabled=False):  # labels are data: fp32 whatever the precision
            y = (x @ self.teacher).argmax(1)
        x, y = to_device(*shard(x, y))
        return F.cross_entropy(self.model(x).float(), y)


# ---------------------------------------------------------------------------------------------
# fashion-mnist: hosts/train/src/fashion_mnist.cpp

def read_idx(path, magic):
    if not os.path.exists(path):
        fail(f"Fashion-MNIST file {path} is missing; install the Debian package dataset-fashion-mnist "
             f"(tools/setup.sh does) or give --data-dir", 4)
    try:
        with gzip.open(path, "rb") as f:
            b = f.read()
    except OSError as e:
        fail(f"{path} is not a valid gzip file ({e})", 4)
    if len(b) < 8 or int.from_bytes(b[0:4], "big") != magic:
        fail(f"{path} is not an IDX {'image' if magic == 2051 else 'label'} file", 4)
    n = int.from_bytes(b[4:8], "big")
    if magic == 2051:
        rows, cols = int.from_bytes(b[8:12], "big"), int.from_bytes(b[12:16], "big")
        if rows != 28 or cols != 28 or len(b) != 16 + n * rows * cols:
            fail(f"{path} has an unexpected size (expected 28x28 images)", 4)
        return np.frombuffer(b, dtype=np.uint8, offset=16).reshape(n, 1, rows, cols)
    if len(b) != 8 + n:
        fail(f"{path} is truncated", 4)
    return np.frombuffer(b, dtype=np.uint8, offset=8)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = F.relu(self.fc1(h.flatten(1)))
        return self.fc2(h)


class FashionMnist:
    def __init__(self, a):
        self.a = a
        images = read_idx(os.path.join(a.data_dir, "train-images-idx3-ubyte.gz"), 2051)
        labels = read_idx(os.path.join(a.data_dir, "train-labels-idx1-ubyte.gz"), 2049)
        if len(images) != len(labels):
            fail(f"Fashion-MNIST image and label counts differ in {a.data_dir}", 4)
        if a.batch_size > len(images):
            fail(f"--batch-size {a.batch_size} exceeds the {len(images)} training images")
        # Normalised with the training set's mean and standard deviation, as ampkit-train does.
        self.x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
        self.y = torch.from_numpy(labels.astype(np.int64))
        self.model = Cnn()
        self.batches_per_epoch = len(images) // a.batch_size
        self.order = torch.arange(len(images))

    def start_epoch(self, epoch):
        gen = torch.Generator().manual_seed((self.a.seed * 1000003 + epoch) % 2**64)
        self.order = torch.randperm(len(self.x), generator=gen)

    def loss(self, index):
        idx = shard(self.order[index * self.a.batch_size:(index + 1) * self.a.batch_size])
        x, y = to_device(self.x.index_select(0, idx), self.y.index_select(0, idx))
        return F.cross_entropy(self.model(x).float(), y)


# ---------------------------------------------------------------------------------------------
# char-gpt: hosts/train/src/char_gpt.cpp

VOCAB = 256  # bytes


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, 2)
        heads = lambda t: t.reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        h = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class Gpt(nn.Module):
    def __init__(self, layers, width, heads, context):
        super().__init__()
        # Registration order as in char_gpt.cpp (blocks last): same initial values from the seed.
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(context, width)
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def read_corpus(folder):
    if not os.path.isdir(folder):
        fail(f"text folder {folder} is missing; install the Debian package fortunes (tools/setup.sh does) "
             f"or give --text-dir", 4)
    files = sorted(os.path.join(folder, n) for n in os.listdir(folder)
                   if os.path.splitext(n)[1] not in (".dat", ".u8"))
    files = [f for f in files if os.path.isfile(f) and not os.path.islink(f)]
    text = b"".join(open(f, "rb").read() for f in files)
    if len(text) < 10000:
        fail(f"text folder {folder} holds only {len(text)} bytes of text; char-gpt needs at least 10000", 4)
    return torch.from_numpy(np.frombuffer(text, dtype=np.uint8).astype(np.int64))


class CharGpt:
    def __init__(self, a):
        self.a = a
        if a.gpt_width % a.gpt_heads:
            fail(f"--gpt-width {a.gpt_width} is not a multiple of --gpt-heads {a.gpt_heads}")
        corpus = read_corpus(a.text_dir)
        self.train = corpus[:len(corpus) * 9 // 10]  # the last 10% is held out
        self.model = Gpt(a.gpt_layers, a.gpt_width, a.gpt_heads, a.gpt_context)
        self.batches_per_epoch = max(1, len(self.train) // (a.batch_size * a.gpt_context))
        self.epoch = 0
        self.span = torch.arange(a.gpt_context + 1).unsqueeze(0)

    def start_epoch(self, epoch):
        self.epoch = epoch

    def loss(self, index):
        a = self.a
        gen = torch.Generator().manual_seed((a.seed * 7919 + self.epoch * 1000003 + index) % 2**64)
        offsets = shard(torch.randint(len(self.train) - a.gpt_context - 1, (a.batch_size,), generator=gen))
        w = self.train[offsets.unsqueeze(1) + self.span]
        x, y = to_device(w[:, :a.gpt_context], w[:, 1:])
        return F.cross_entropy(self.model(x).float().view(-1, VOCAB), y.reshape(-1))


WORKLOADS = {"synthetic": Synthetic, "fashion-mnist": FashionMnist, "char-gpt": CharGpt}


# ---------------------------------------------------------------------------------------------

def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def non_negative(text):
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = lambda message: fail(f"{message} (see --help)")  # one line, no usage block
    ap.add_argument("--workload", default="fashion-mnist", choices=sorted(WORKLOADS), help="as ampkit-train's")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="autocast precision")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the model trains")
    ap.add_argument("--adamw", default="fused", choices=["fused", "default"],
                    help="AdamW(fused=True), PyTorch's fastest (the default), or torch's default implementation")
    ap.add_argument("--steps", type=positive, default=20, help="timed optimizer steps (after the warm-up)")
    ap.add_argument("--warmup", type=non_negative, default=3, help="untimed steps before the timed ones")
    ap.add_argument("--batch-size", type=positive, default=64, help="samples per step")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    ap.add_argument("--seed", type=non_negative, default=0, help="initialisation and data")
    ap.add_argument("--threads", type=non_negative, default=0, help="torch CPU threads; 0 keeps torch's choice")
    ap.add_argument("--synthetic-width", type=positive, default=256)
    ap.add_argument("--synthetic-depth", type=non_negative, default=4)
    ap.add_argument("--synthetic-inputs", type=positive, default=128)
    ap.add_argument("--synthetic-classes", type=positive, default=10)
    ap.add_argument("--gpt-layers", type=non_negative, default=2)
    ap.add_argument("--gpt-width", type=positive, default=128)
    ap.add_argument("--gpt-heads", type=positive, default=4)
    ap.add_argument("--gpt-context", type=positive, default=64)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST IDX .gz files")
    ap.add_argument("--text-dir", default="/usr/share/games/fortunes", help="char-gpt text folder")
    return ap.parse_args(argv)


def main(argv=None):
    global DEVICE
    a = parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but torch sees no CUDA device")
    if a.device == "cuda" and WORLD > 1:
        fail("--device cuda trains in one process (the data-parallel comparison is Gloo's, on the CPU)")
    DEVICE = torch.device(a.device)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if WORLD > 1:
        if a.batch_size % WORLD:
            fail(f"--batch-size {a.batch_size} is not a multiple of the world size {WORLD}")
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo")
    w = WORKLOADS[a.workload](a)
    model = w.model.to(DEVICE)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in params)
    if WORLD > 1:  # broadcasts rank 0's parameters; all-reduces gradients in buckets during backward
        model = DistributedDataParallel(model, bucket_cap_mb=25)
        w.model = model
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.01, fused=a.adamw == "fused" or None)
    fp16 = a.precision == "fp16"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    # A disabled GradScaler passes scale/unscale_/step/update through: one loop for all precisions.
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=65536.0, enabled=fp16)
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)

    skipped = 0
    epoch = -1
    start = time.perf_counter()
    step_ms = []  # each timed step's duration: their median ignores bursts of load
    for step in range(a.warmup + a.steps):
        step_start = time.perf_counter()
        if step == a.warmup:
            start = step_start
        if step // w.batches_per_epoch != epoch:
            epoch = step // w.batches_per_epoch
            w.start_epoch(epoch)
        with torch.autocast(device_type=DEVICE.type, dtype=dtype, enabled=dtype is not None):
            loss = w.loss(step % w.batches_per_epoch)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        before = scaler.get_scale() if fp16 else 0.0
        scaler.step(opt)
        scaler.update()
        if fp16 and scaler.get_scale() < before:  # update() backed off: the step was skipped
            skipped += 1
        opt.zero_grad(set_to_none=True)
        if step == 0:
            first_loss = loss.item()
        sync()
        if step >= a.warmup:
            step_ms.append(1000.0 * (time.perf_counter() - step_start))
    seconds = time.perf_counter() - start
    last_loss = loss.item()
    if WORLD > 1:
        dist.destroy_process_group()
        if RANK != 0:
            return 0
    if not math.isfinite(last_loss):
        print(f"{PROG}: warning: the last loss is not finite", file=sys.stderr)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux
    print(json.dumps({"way": WAY, "workload": a.workload, "precision": a.precision, "steps": a.steps,
                      "world_size": WORLD, "device": a.device, "adamw": a.adamw, "seconds": round(seconds, 6), "samples_per_second": round(a.batch_size * a.steps / seconds, 3),
                      "step_ms": round(1000.0 * seconds / a.steps, 4),
                      "median_step_ms": round(statistics.median(step_ms), 4), "parameters": count,
                      "peak_rss_mb": round(peak_mb, 1), "skipped_steps": skipped,
                      # Losses let a reader check that ways train the same workload (step 0 matches
                      # ampkit-train's first metrics record when the initialisations agree).
                      "first_loss": first_loss, "last_loss": last_loss}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # one line, not a traceback
        fail(f"{type(e).__name__}: {e}", 1)
