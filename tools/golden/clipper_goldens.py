#!/usr/bin/env python3
"""Golden values for the clipper plugins (tests/plugins/clipper), written to tests/data/clipper_goldens.json.

Each clipper is checked against the reference it claims to match, run here on CPU with pip torch:

  norm      torch.nn.utils.clip_grad_norm_ (norm 2 and inf, clipping and not)
  value     torch.nn.utils.clip_grad_value_
  agc       timm.utils.agc.adaptive_clip_grad (transcribed below: timm is not a dependency)
  adaptive  method=percentile: AutoClip's handler (transcribed below), method=zscore: ZClip's
            ZClip class (transcribed below), over one recorded sequence of gradient norms

The input tensors are generated here from a fixed seed and stored in the JSON with the results,
so the C++ test needs no generator of its own. Run from the repository root:

    python3 tools/golden/clipper_goldens.py            # rewrites tests/data/clipper_goldens.json
    python3 tools/golden/clipper_goldens.py --check    # exits 1 if the file would change
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

OUTPUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "clipper_goldens.json")


# --------------------------------------------------------------------------------------------
# timm/utils/agc.py, verbatim (https://github.com/huggingface/pytorch-image-models,
# Apache-2.0, "Hacked together by / Copyright 2021 Ross Wightman"). An impl of AGC as per
# Brock et al. 2021, https://arxiv.org/abs/2102.06171.
# --------------------------------------------------------------------------------------------
def unitwise_norm(x, norm_type=2.0):
    if x.ndim <= 1:
        return x.norm(norm_type)
    else:
        # works for nn.ConvNd and nn,Linear where output dim is first in the kernel/weight tensor
        # might need special cases for other weights (possibly MHA) where this may not be true
        return x.norm(norm_type, dim=tuple(range(1, x.ndim)), keepdim=True)


def adaptive_clip_grad(parameters, clip_factor=0.01, eps=1e-3, norm_type=2.0):
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    for p in parameters:
        if p.grad is None:
            continue
        p_data = p.detach()
        g_data = p.grad.detach()
        max_norm = unitwise_norm(p_data, norm_type=norm_type).clamp_(min=eps).mul_(clip_factor)
        grad_norm = unitwise_norm(g_data, norm_type=norm_type)
        clipped_grad = g_data * (max_norm / grad_norm.clamp(min=1e-6))
        new_grads = torch.where(grad_norm < max_norm, g_data, clipped_grad)
        p.grad.detach().copy_(new_grads)


# --------------------------------------------------------------------------------------------
# AutoClip, autoclip.py of https://github.com/pseeth/autoclip (MIT, Copyright (c) 2020 pseeth),
# Seetharaman et al. 2020, https://arxiv.org/abs/2007.14469. _get_grad_norm verbatim; the body
# of the ignite handler autoclip_gradient verbatim inside a plain function. The bounded history
# (`history`) is ampkit's addition: the reference keeps every norm.
# --------------------------------------------------------------------------------------------
def _get_grad_norm(model):
    total_norm = 0
    for p in model.parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            total_norm += param_norm.item() ** 2
    total_norm = total_norm ** (1. / 2)
    return total_norm


def make_autoclip_handler(model, clip_percentile, history=None):
    # Keep track of the history of gradients and select a cutoff
    # to clip values to based on percentile.
    grad_history = []

    def autoclip_gradient():
        obs_grad_norm = _get_grad_norm(model)
        grad_history.append(obs_grad_norm)
        if history is not None:
            del grad_history[:-history]  # ampkit: the last `history` norms only
        clip_value = np.percentile(grad_history, clip_percentile)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_value)
        return clip_value

    return autoclip_gradient


# --------------------------------------------------------------------------------------------
# ZClip, zclip/zclip.py of https://github.com/bluorion-com/ZClip (MIT), Kumar et al. 2025,
# https://arxiv.org/abs/2504.02507. The methods below are verbatim except that the FSDP and
# Lightning branches (no effect on one process) and the unused "percentile" mode and "mean"
# option are left out; mode="zscore", clip_option="adaptive_scaling".
# --------------------------------------------------------------------------------------------
class ZClip:
    def __init__(self, alpha=0.97, z_thresh=2.5, max_grad_norm=1.0, eps=1e-6,
                 warmup_steps=25, mode="zscore", clip_option="adaptive_scaling",
                 clip_factor=1.0, skip_update_on_spike=False):
        self.alpha = alpha
        self.z_thresh = z_thresh
        self.max_grad_norm = max_grad_norm
        self.eps = eps
        self.warmup_steps = warmup_steps
        self.mode = mode.lower()
        self.clip_factor = clip_factor
        self.skip_update_on_spike = skip_update_on_spike
        assert self.mode == "zscore" and clip_option == "adaptive_scaling"
        self.clip_option = clip_option.lower()

        self.buffer = []
        self.initialized = False
        self.mean = None
        self.var = None

    def _initialize_ema(self):
        self.mean = sum(self.buffer) / len(self.buffer)
        self.var = sum((x - self.mean) ** 2 for x in self.buffer) / len(self.buffer)
        self.initialized = True
        self.buffer = []

    def _update_ema(self, grad_norm):
        # Update EMA for mean and variance using the new effective gradient norm.
        self.mean = self.alpha * self.mean + (1 - self.alpha) * grad_norm
        self.var = self.alpha * self.var + (1 - self.alpha) * (grad_norm - self.mean) ** 2

    def _compute_positive_zscore(self, grad_norm):
        std = self.var ** 0.5
        z = (grad_norm - self.mean) / (std + self.eps)
        return z, std

    def _compute_grad_norm(self, model):
        first_param = next(model.parameters())
        device = first_param.device
        dtype = first_param.dtype
        grad_norms = [
            p.grad.to(dtype).square().sum() for p in model.parameters() if p.grad is not None
        ]
        if not grad_norms:
            return 0.0
        grad_norms_tensor = torch.stack(grad_norms).to(device)
        total_norm = grad_norms_tensor.sum().sqrt()
        return total_norm.item()

    def _compute_clip_val(self, grad_norm):
        # Compute the z-score for the current gradient norm.
        z, std = self._compute_positive_zscore(grad_norm)
        if z > self.z_thresh:
            if self.clip_option == "adaptive_scaling":
                eta = z / self.z_thresh  # This rescaling ratio imposes a greater penalty on large outliers.
                threshold = self.mean + (self.z_thresh * std) / eta
                return threshold * self.clip_factor
        return None  # No clipping needed.

    def apply_in_place_clipping(self, pl_module, global_norm: float, max_global_norm: float):
        # Calculate the clipping coefficient.
        clip_coef = (max_global_norm / (global_norm + 1e-6)) if global_norm > max_global_norm else 1.0

        # If clipping is needed, scale each gradient in-place.
        if clip_coef < 1.0:
            for param in pl_module.parameters():
                if param.grad is not None:
                    param.grad.data.mul_(clip_coef)

    def _apply_clipping(self, model, clip_val, total_norm):
        # Use the computed clip_val if available; otherwise, use the total norm.
        adaptive_clip = clip_val if clip_val is not None else total_norm
        if self.max_grad_norm is not None:
            effective_clip = min(adaptive_clip, self.max_grad_norm)
        else:
            effective_clip = adaptive_clip
        self.apply_in_place_clipping(model, total_norm, effective_clip)
        return effective_clip

    def step(self, model):
        total_norm = self._compute_grad_norm(model)

        # During warmup, collect gradient norms without applying clipping.
        if not self.initialized:
            self.buffer.append(total_norm)
            if len(self.buffer) >= self.warmup_steps:
                self._initialize_ema()
            if self.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)
            return total_norm

        # Compute the clip value based on the selected mode and clip_option.
        clip_val = self._compute_clip_val(total_norm)
        self._apply_clipping(model, clip_val, total_norm)
        if clip_val is not None and self.skip_update_on_spike:
            return total_norm

        # Update EMA with the effective norm (either the computed clip or the original norm).
        self._update_ema(clip_val if clip_val is not None else total_norm)
        return total_norm


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------
# Linear and conv weights (unit-wise norms over dims 1..), biases, a zero-initialised bias (AGC's
# eps floor), a 1-element gain and a 3-d tensor: ~1,000 elements keep the JSON small.
SHAPES = [[32, 17], [32], [8, 3, 3, 3], [8], [3, 5, 7], [1], [10, 6]]
ZERO_PARAMS = {3}  # index of a zero-initialised parameter


def make_tensors():
    g = torch.Generator().manual_seed(20240531)
    params, grads = [], []
    for i, shape in enumerate(SHAPES):
        p = torch.randn(shape, generator=g) * 0.1
        if i in ZERO_PARAMS:
            p.zero_()
        # Heavy-tailed gradients over a few orders of magnitude, as real ones look: some units are
        # far above AGC's threshold, some below.
        grad = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 1.5) * 1e-3
        params.append(p.float())
        grads.append(grad.float())
    return params, grads


def make_norm_sequence(steps=300):
    """Unscaled total norms of a plausible run: decaying level, noise, and a few spikes (some in
    the warm-up, a double spike, a large one) so every branch of both algorithms runs."""
    rng = np.random.RandomState(7)
    t = np.arange(steps)
    base = 0.5 + 2.0 * np.exp(-t / 60.0)
    norms = base * np.exp(rng.normal(0.0, 0.15, size=steps))
    for step, factor in [(10, 6.0), (40, 8.0), (41, 5.0), (120, 30.0), (200, 3.0), (250, 12.0), (251, 1.6)]:
        norms[step] *= factor
    return [float(x) for x in norms]


def as_params(values, dtype):
    out = []
    for v in values:
        p = torch.zeros_like(v, dtype=dtype).requires_grad_(True)
        p.grad = v.to(dtype).clone()
        out.append(p)
    return out


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


# --------------------------------------------------------------------------------------------
# Goldens
# --------------------------------------------------------------------------------------------
def norm_goldens(grads):
    out = []
    total2 = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    total_inf = max(float(g.double().abs().max()) for g in grads)
    for norm_type, total in (("2", total2), ("inf", total_inf)):
        for max_norm in (0.25 * total, 1e9):  # clipping, and a threshold never reached
            # float64 copies: PyTorch's own fp32 norm is off by ~1e-6 relative (see
            # docs/architecture.md), too much to check a 1e-6 parity against.
            params = as_params(grads, torch.float64)
            returned = torch.nn.utils.clip_grad_norm_(params, max_norm, float(norm_type))
            out.append({
                "norm_type": norm_type,
                "max_norm": max_norm,
                "total_norm": float(returned),
                "grads": [flat(p.grad) for p in params],
            })
    return out


def value_goldens(grads):
    out = []
    largest = max(float(g.abs().max()) for g in grads)
    for clip_value in (3e-3, 2.0 * largest):  # clips some elements; clips none
        # fp32, as users run it: the C++ result must be bit-identical.
        params = as_params(grads, torch.float32)
        torch.nn.utils.clip_grad_value_(params, clip_value)
        before = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        after = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params))
        clamped = sum(int((g.abs() > clip_value).sum()) for g in grads)
        out.append({"clip_value": clip_value, "clamped_elements": clamped, "norm_ratio": after / before,
                    "grads": [flat(p.grad) for p in params]})
    return out


def agc_goldens(params32, grads):
    out = []
    for clip_factor, eps in ((0.01, 1e-3), (0.1, 1e-2)):
        params = []
        for p, g in zip(params32, grads):
            q = p.double().clone().requires_grad_(True)
            q.grad = g.double().clone()
            params.append(q)
        adaptive_clip_grad(params, clip_factor=clip_factor, eps=eps)
        before = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        after = math.sqrt(sum(float(q.grad.pow(2).sum()) for q in params))
        units = 0
        for q, g in zip(params, grads):
            n_before = unitwise_norm(g.double())
            n_after = unitwise_norm(q.grad)
            units += int((n_after < n_before * (1 - 1e-12)).sum())
        out.append({"clip_factor": clip_factor, "eps": eps, "clipped_units": units, "norm_ratio": after / before,
                    "grads": [flat(q.grad) for q in params]})
    return out


class OneTensorModel(torch.nn.Module):
    """A model whose only gradient is [norm]: its total norm is the recorded one."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def set_norm(self, norm):
        self.w.grad = torch.tensor([norm], dtype=torch.float64)

    def coefficient(self, norm):
        return float(self.w.grad[0]) / norm


def percentile_goldens(norms):
    out = []
    for percentile, history in ((10.0, 1000), (10.0, 50), (90.0, 1000)):
        model = OneTensorModel()
        handler = make_autoclip_handler(model, percentile, history)
        coefficients, thresholds = [], []
        for n in norms:
            model.set_norm(n)
            thresholds.append(float(handler()))
            coefficients.append(model.coefficient(n))
        out.append({"percentile": percentile, "history": history, "coefficients": coefficients,
                    "thresholds": thresholds})
    return out


def zscore_goldens(norms):
    out = []
    configs = [
        dict(alpha=0.97, z_thresh=2.5, warmup_steps=25, clip_factor=1.0, max_grad_norm=None),  # ZClip's defaults
        dict(alpha=0.97, z_thresh=2.5, warmup_steps=25, clip_factor=1.0, max_grad_norm=1.2),   # with a bound that bites
        dict(alpha=0.9, z_thresh=2.0, warmup_steps=10, clip_factor=0.5, max_grad_norm=None),  # "aggressive" settings
    ]
    for config in configs:
        model = OneTensorModel()
        zclip = ZClip(**config)
        coefficients = []
        for n in norms:
            model.set_norm(n)
            zclip.step(model)
            coefficients.append(model.coefficient(n))
        entry = dict(config)
        entry["max_norm"] = entry.pop("max_grad_norm")
        entry.update({"coefficients": coefficients, "mean": zclip.mean, "var": zclip.var})
        out.append(entry)
    return out


def build():
    torch.set_num_threads(1)  # reductions in one fixed order
    params, grads = make_tensors()
    norms = make_norm_sequence()
    return {
        "generator": "tools/golden/clipper_goldens.py",
        "torch": torch.__version__,
        "numpy": np.__version__,
        "shapes": SHAPES,
        "params": [flat(p) for p in params],
        "grads": [flat(g) for g in grads],
        "norm": norm_goldens(grads),
        "value": value_goldens(grads),
        "agc": agc_goldens(params, grads),
        "norm_sequence": norms,
        "percentile": percentile_goldens(norms),
        "zscore": zscore_goldens(norms),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    parser.add_argument("--output", default=OUTPUT)
    args = parser.parse_args()
    text = json.dumps(build(), separators=(",", ":")) + "\n"
    if args.check:
        with open(args.output) as f:
            same = f.read() == text
        print("up to date" if same else "differs: run tools/golden/clipper_goldens.py")
        return 0 if same else 1
    with open(args.output, "w") as f:
        f.write(text)
    print(f"wrote {os.path.normpath(args.output)} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
