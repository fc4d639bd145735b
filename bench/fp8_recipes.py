#!/usr/bin/env python3
"""fp8 recipes replayed on recorded amax traces: what `delayed` and `predictive` would saturate and flush.

    PYTHONPATH=build/python python3 bench/fp8_recipes.py --traces DIR [--steps 300] [--runs transformer-lm,char-gpt]

Two real runs are recorded (each once: a trace already in DIR is reused), in bf16 autocast on the
CPU, trained in fp8 with the `current` recipe (each cast scaled by its own tensor, so the run is
fp8 and biased by neither compared recipe):
  transformer-lm: tools/models/transformer_lm.py's TransformerLM (context 64, width 96, 2 blocks),
      every nn.Linear converted by ampkit.fp8, batch 32 of its windows of the fortunes corpus,
      AdamW(lr 1e-3, weight decay 0.01). Its attention's out_proj is not converted:
      nn.MultiheadAttention reads its weight directly.
  char-gpt: ampkit-train itself (--train-bin), `--workload char-gpt --precision bf16 --fp8 current`
      at its defaults (2 blocks, width 128, 4 heads, context 64, batch 64, AdamW(lr 1e-3, weight
      decay 0.01), gradients clipped to norm 5), its casts summarised by --fp8-trace.
  char-gpt-replica (cross-check only, not run unless named): a Python replica of char-gpt
      (hosts/train/src/workloads/char_gpt.cpp: the same layers, widths, corpus, split and windows,
      not the same initial values), recorded as transformer-lm is.
At every step, per fp8 tensor (each layer's input, weight, grad_output as cast, before the scale
and clamp): its amax, its element count, its 64 largest magnitudes exactly, and a histogram of
log2|x| in 1/32-binade bins over [2**-80, 2**24) (zeros apart; smaller values in the first bin).
ampkit-train's --fp8-trace writes the same summary as JSON lines, converted here.

Replay: the amaxes go through the real recipe plugins (torch.classes.ampkit.Fp8Recipe update()), so
each step's scale is the one the recipe would have cast with (from amaxes up to the step before;
initial scale 1). A value saturates when the clamp before the cast changes it: |x| * scale above
464 (E4M3) or 61440 (E5M2), past which an unclamped cast would not round to fp8_max (448, 57344);
between the two the clamp loses nothing (so a scale from the tensor's own amax, rounded to float32,
is never counted as saturating by an ulp). A value flushes when 0 < |x| * scale <= half the
smallest subnormal (2**-10 E4M3, 2**-17 E5M2: it rounds to 0). Saturated counts are exact while
fewer than 64 values of a tensor saturate (from the 64 largest), else read from the histogram;
flushed counts are read from the histogram, the bin holding the threshold counted in proportion to
the part of its log2 width below it (the error bound is printed: the values in such bins). Step 0
(scale 1 for every recipe) is left out. The Python runs trained with the CPU's torch._scaled_mm
replaced by dequantize-then-float32-matmul (emulated_scaled_mm below): ATen's is far too slow on a
CPU (ampkit-train takes ATen's emulated path, equal to it bit for bit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LO, HI, PER_BINADE, TOP = -80, 24, 32, 64
NBINS = (HI - LO) * PER_BINADE
ROLE_NAMES = ("input", "weight", "grad_output")
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
# Past these the clamp changes the cast: below them an unclamped cast rounds to fp8_max anyway.
SAT_LIMIT = {"e4m3": 464.0, "e5m2": 61440.0}
HALF_SUBNORMAL = {"e4m3": 2.0**-10, "e5m2": 2.0**-17}
RECIPES: List[Tuple[str, str, Dict[str, str]]] = [
    ("current (reference)", "current", {}),
    ("delayed, window 1024 (TE default)", "delayed", {}),
    ("delayed, window 16", "delayed", {"amax_history_len": "16"}),
    ("delayed, most_recent", "delayed", {"amax_compute_algo": "most_recent"}),
    ("predictive (defaults)", "predictive", {}),
    ("predictive, window 16", "predictive", {"amax_history_len": "16"}),
]


class Recorder:
    """Per step, per (layer, role): the statistics of the tensor the layer casts to fp8."""

    def __init__(self, model: torch.nn.Module) -> None:
        import ampkit.fp8

        self.keys: List[Tuple[str, int]] = []
        self.index: Dict[Tuple[str, int], int] = {}
        self.steps: List[Dict[int, tuple]] = []
        for name, mod in model.named_modules():
            if isinstance(mod, ampkit.fp8.Linear):
                mod.register_forward_pre_hook(self._forward(name))
                mod.register_full_backward_hook(self._backward(name))

    def start_step(self) -> None:
        self.steps.append({})

    def _slot(self, name: str, role: int) -> int:
        key = (name, role)
        if key not in self.index:
            self.index[key] = len(self.keys)
            self.keys.append(key)
        return self.index[key]

    def _note(self, name: str, role: int, t: torch.Tensor) -> None:
        a = t.detach().float().abs().flatten()
        nz = a[a > 0]
        bins = ((torch.log2(nz.double()) - LO) * PER_BINADE).floor().clamp(0, NBINS - 1).long()
        hist = torch.bincount(bins, minlength=NBINS).to(torch.int32)
        top = torch.topk(a, min(TOP, a.numel())).values
        top = F.pad(top, (0, TOP - top.numel()))
        self.steps[-1][self._slot(name, role)] = (float(a.max()), a.numel(), hist, top)

    def _forward(self, name: str) -> Callable:
        def hook(mod: torch.nn.Module, args: tuple) -> None:
            if not (torch.is_grad_enabled() and mod.training):
                return
            x = args[0]
            if torch.is_autocast_enabled(x.device.type):  # as the layer casts it first
                x = x.to(torch.get_autocast_dtype(x.device.type))
            self._note(name, 0, x)
            self._note(name, 1, mod.weight)

        return hook

    def _backward(self, name: str) -> Callable:
        def hook(mod: torch.nn.Module, grad_input: tuple, grad_output: tuple) -> None:
            self._note(name, 2, grad_output[0])

        return hook

    def save(self, path: str, losses: List[float]) -> None:
        steps = [{j: (a, c, h.numpy(), t.numpy()) for j, (a, c, h, t) in step.items()} for step in self.steps]
        save_trace(path, steps, self.keys, losses)


def save_trace(path: str, steps: List[Dict[int, tuple]], keys: List[Tuple[str, int]], losses: List[float]) -> None:
    """The trace file: per step, per tensor (name, role) its (amax, count, histogram, top)."""
    s, n = len(steps), len(keys)
    amax = np.zeros((s, n), np.float32)
    numel = np.zeros((s, n), np.int64)
    hist = np.zeros((s, n, NBINS), np.int32)
    top = np.zeros((s, n, TOP), np.float32)
    for i, step in enumerate(steps):
        for j, (a, c, h, t) in step.items():
            amax[i, j], numel[i, j], hist[i, j], top[i, j] = a, c, h, t
    np.savez_compressed(
        path,
        amax=amax,
        numel=numel,
        hist=hist,
        top=top,
        names=np.array([f"{k[0]}.{ROLE_NAMES[k[1]]}" for k in keys]),
        roles=np.array([k[1] for k in keys], np.int64),
        loss=np.array(losses, np.float32),
    )


# ampkit-train's char-gpt at its defaults, in bf16 and fp8 with `current`.
CHAR_GPT_ARGS = ["--workload", "char-gpt", "--precision", "bf16", "--fp8", "current", "--progress", "never"]


def record_char_gpt(binary: str, steps: int, path: str) -> None:
    """Runs ampkit-train with --fp8-trace and converts its JSON lines (one per step, layer and role)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace, metrics = os.path.join(tmp, "trace.jsonl"), os.path.join(tmp, "metrics.jsonl")
        cmd = [binary, *CHAR_GPT_ARGS, "--steps", str(steps), "--fp8-trace", trace, "--metrics", metrics]
        print(" ".join(cmd), file=sys.stderr)
        t0 = time.time()
        subprocess.run(cmd, check=True, stdout=sys.stderr)  # its summary: not part of the table
        print(f"char-gpt: {steps} steps in {time.time() - t0:.0f} s", file=sys.stderr)
        keys: List[Tuple[str, int]] = []
        index: Dict[Tuple[str, int], int] = {}
        steps_out: List[Dict[int, tuple]] = [{} for _ in range(steps)]
        with open(trace) as f:
            for line in f:
                r = json.loads(line)
                key = (f"layer{r['layer']}", ROLE_NAMES.index(r["role"]))
                if key not in index:
                    index[key] = len(keys)
                    keys.append(key)
                h = np.zeros(NBINS, np.int64)
                h[r["hist_first"] : r["hist_first"] + len(r["hist"])] = r["hist"]
                amax = np.nan if r["amax"] is None else r["amax"]
                steps_out[r["step"]][index[key]] = (amax, r["count"], h, np.array(r["top"], np.float32))
        with open(metrics) as f:
            losses = [json.loads(line)["loss"] for line in f]
    save_trace(path, steps_out, keys, losses)


def fortunes_text() -> torch.Tensor:
    """char_gpt.cpp's read_corpus: every file but *.dat and *.u8, sorted by name, concatenated."""
    d = "/usr/share/games/fortunes"
    files = sorted(
        f
        for f in os.listdir(d)
        if os.path.isfile(os.path.join(d, f))
        and not os.path.islink(os.path.join(d, f))
        and not f.endswith((".dat", ".u8"))
    )
    data = b"".join(open(os.path.join(d, f), "rb").read() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class CharGptBlock(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.fc, self.out = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            p.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for p in self.qkv(self.ln1(x)).split(c, 2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class CharGpt(torch.nn.Module):
    def __init__(self, layers: int = 2, width: int = 128, heads: int = 4, context: int = 64) -> None:
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(256, width), torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList([CharGptBlock(width, heads) for _ in range(layers)])
        self.ln, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, 256)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.size(1)))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def char_gpt_replica_run(steps: int):
    corpus = fortunes_text()
    train = corpus[: corpus.numel() * 9 // 10]
    torch.manual_seed(0)
    model = CharGpt()

    def batch(i: int):
        g = torch.Generator().manual_seed(0 * 7919 + i)  # seed 0, epoch 0, batch i
        offsets = torch.randint(train.numel() - 64 - 1, (64,), generator=g)
        w = train[offsets[:, None] + torch.arange(65)]
        return w[:, :-1], w[:, 1:]

    return model, batch, 5.0, None


def transformer_lm_run(steps: int):
    sys.path.insert(0, os.path.join(ROOT, "tools", "models"))
    from data import fortunes_bytes
    from transformer_lm import TransformerLM, windows

    corpus = fortunes_bytes()
    w = windows(corpus[: corpus.numel() * 9 // 10], steps * 32, 64, 1)
    torch.manual_seed(0)
    model = TransformerLM(64, 96, layers=2)

    def batch(i: int):
        return w["inputs"][i * 32 : (i + 1) * 32], w["targets"][i * 32 : (i + 1) * 32]

    return model, batch, None, lambda mod, fqn: not fqn.endswith("out_proj")


PYTHON_RUNS = {"transformer-lm": transformer_lm_run, "char-gpt-replica": char_gpt_replica_run}


def emulated_scaled_mm(a, inv_a, b, inv_b, out_dtype, fast_accum):  # type: ignore[no-untyped-def]
    """torch._scaled_mm as dequantize-then-float32-matmul: bit for bit ATen's emulated CPU path,
    within 2.1e-7 of the largest value of the default oneDNN one (docs/fp8.md), and hundreds of
    times faster on the CPU than either."""
    return ((a.float() * inv_a) @ (b.float() * inv_b)).to(out_dtype)


def record(run: str, steps: int, path: str) -> None:
    import ampkit._fp8_cast
    import ampkit.fp8

    ampkit._fp8_cast.scaled_mm = emulated_scaled_mm  # type: ignore[assignment]
    model, batch, clip, keep = PYTHON_RUNS[run](steps)
    ampkit.fp8.convert(model, recipe="current", module_filter_fn=keep)
    rec = Recorder(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses, t0 = [], time.time()
    for i in range(steps):
        x, y = batch(i)
        rec.start_step()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(float(loss))
        if i % 50 == 0 or i == steps - 1:
            print(f"{run}: step {i} loss {losses[-1]:.3f} ({time.time() - t0:.0f} s)", file=sys.stderr)
    rec.save(path, losses)


def replay_scales(
    amax: np.ndarray, roles: np.ndarray, plugin: str, opt: Dict[str, str]
) -> Tuple[np.ndarray, List[str]]:
    """The scale each step casts with, [steps, tensors], and each tensor's format."""
    import ampkit  # noqa: F401  (loads torch.classes.ampkit)

    r = torch.classes.ampkit.Fp8Recipe(plugin, opt)
    formats = [r.fp8_format(int(k)) for k in roles]
    fmax = np.array([FP8_MAX[f] for f in formats], np.float32)
    if r.current_scaling():
        return (fmax[None, :] / np.maximum(amax, 1e-12)).astype(np.float32), formats
    n = amax.shape[1]
    hist, scale = torch.zeros(n, r.history_length()), torch.ones(n)
    out = np.zeros_like(amax)
    rt = torch.from_numpy(roles)
    for t in range(amax.shape[0]):
        out[t] = scale.numpy()
        r.update(rt, torch.from_numpy(amax[t]).contiguous(), hist, scale)
    return out, formats


def count_below(cum: np.ndarray, hist: np.ndarray, thr: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Values with |x| <= thr from the histograms (the threshold's bin pro rata in log2), and the
    count in the bins holding a threshold (the bound on the error)."""
    pos = (np.log2(np.maximum(thr, 1e-300)) - LO) * PER_BINADE
    b = np.clip(np.floor(pos).astype(np.int64), 0, NBINS - 1)
    frac = np.clip(pos - np.floor(pos), 0, 1)
    below_bin = np.where(b > 0, np.take_along_axis(cum, np.maximum(b - 1, 0)[..., None], -1)[..., 0], 0)
    in_bin = np.take_along_axis(hist, b[..., None], -1)[..., 0]
    inside = (pos >= 0) & (pos < NBINS)
    est = np.where(pos < 0, 0, np.where(pos >= NBINS, cum[..., -1], below_bin + frac * in_bin))
    return est, np.where(inside, in_bin, 0)


def replay(trace: Dict[str, np.ndarray], plugin: str, opt: Dict[str, str]) -> Dict[str, float]:
    amax, numel, hist, top, roles = (trace[k] for k in ("amax", "numel", "hist", "top", "roles"))
    scale, formats = replay_scales(amax, roles, plugin, opt)
    fmax = np.array([SAT_LIMIT[f] for f in formats])[None, :]
    half = np.array([HALF_SUBNORMAL[f] for f in formats])[None, :]
    sl = slice(1, None)
    s = scale[sl].astype(np.float64)
    h = hist[sl].astype(np.int64)
    cum = np.cumsum(h, -1)
    sat_t = fmax / s
    exact = (top[sl] > sat_t[..., None]).sum(-1)
    above, sat_err = count_below(cum, h, sat_t)
    from_hist = cum[..., -1] - above
    many = exact >= TOP
    sat = np.where(many, from_hist, exact)
    flushed, flush_err = count_below(cum, h, half / s)
    total = numel[sl].sum()
    sat_any = amax[sl] > sat_t
    return {
        "sat": sat.sum() / total,
        "sat_err": np.where(many, sat_err, 0).sum() / total,
        "flush": flushed.sum() / total,
        "flush_err": flush_err.sum() / total,
        "flush_grad": flushed[:, roles == 2].sum() / numel[sl][:, roles == 2].sum(),
        "steps_sat": int(sat_any.any(1).sum()),
        "tensor_steps_sat": int(sat_any.sum()),
        "worst": float((sat / numel[sl]).max()),
        "headroom": float(
            np.mean(np.log2(np.array([FP8_MAX[f] for f in formats])[None, :] / np.maximum(amax[sl], 1e-30) / s))
        ),
        "steps": amax.shape[0] - 1,
        "tensors": amax.shape[1],
    }


def pct(v: float) -> str:
    return "0" if v == 0 else f"{100 * v:.2g}%" if v >= 1e-4 else f"{100 * v:.1e}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", required=True, help="folder of the recorded traces (written when missing)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--runs", default="transformer-lm,char-gpt", help="of transformer-lm, char-gpt, char-gpt-replica")
    p.add_argument("--train-bin", default=os.path.join(ROOT, "build", "bin", "ampkit-train"))
    args = p.parse_args()
    os.makedirs(args.traces, exist_ok=True)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    runs = args.runs.split(",")
    for run in runs:
        path = os.path.join(args.traces, f"{run}-{args.steps}.npz")
        if os.path.exists(path):
            continue
        if run == "char-gpt":
            record_char_gpt(args.train_bin, args.steps, path)
        else:
            record(run, args.steps, path)
    print(f"# fp8 recipes on recorded amax traces ({args.steps} steps; steps 1..{args.steps - 1} counted)\n")
    print(
        "| run | recipe | saturated | flushed (all) | flushed (grad_output) | steps with saturation | "
        "tensor-steps with saturation | worst tensor-step saturated | headroom (binades) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    bound = 0.0
    for run in runs:
        trace = dict(np.load(os.path.join(args.traces, f"{run}-{args.steps}.npz")))
        for label, plugin, opt in RECIPES:
            r = replay(trace, plugin, opt)
            bound = max(bound, r["sat_err"], r["flush_err"])
            print(
                f"| {run} ({r['tensors']} tensors) | {label} | {pct(r['sat'])} | {pct(r['flush'])} | "
                f"{pct(r['flush_grad'])} | {r['steps_sat']} | {r['tensor_steps_sat']} | {pct(r['worst'])} | "
                f"{r['headroom'] + 0.0:.2f} |"
            )
        loss = trace["loss"]
        print(f"| {run} | (loss: step 0 {loss[0]:.3f}, last {loss[-1]:.3f}) | | | | | | | |")
    print(
        f"\nFractions of all values cast (input, weight, grad_output of every fp8 layer, every step). "
        f"Histogram error bound: at most {pct(bound)} of values lie in a bin that holds a threshold. "
        "Headroom: the mean over tensor-steps of log2(fp8_max / (amax * scale)), the binades the scale "
        "leaves unused above the tensor's amax (negative: it saturated)."
    )


if __name__ == "__main__":
    main()
