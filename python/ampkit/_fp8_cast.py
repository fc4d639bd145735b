"""The fp8 matmul of ampkit.fp8.Linear: casts that saturate, torch._scaled_mm, and the backward's
two gemms, as torchao's tensorwise Float8Linear computes them (docs/fp8.md, "current")."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

# torchao's floor under an amax (float8_utils.EPS): an all-zero tensor still gets a finite scale.
EPS = 1e-12


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def amax_of(t: torch.Tensor) -> torch.Tensor:
    """max(abs(t)) in t's own dtype, a 0-dim tensor on t's device (no host read)."""
    return torch.max(torch.abs(t))


def current_scale(amax: torch.Tensor, dtype: torch.dtype, eps: float = EPS) -> torch.Tensor:
    """torchao's amax_to_scale: fp8_max / max(amax, eps) in float64, rounded to float32. The
    float64 step is what makes it equal a float32 true division (docs/fp8.md)."""
    return (fp8_max(dtype) / torch.clamp(amax.to(torch.float64), min=eps)).to(torch.float32)


def cast(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t * scale in float32, clamped to +-fp8_max, then cast: torch 2.11's casts do not saturate
    (an E4M3 value past 464 would be NaN, an E5M2 one past 61439 inf)."""
    m = fp8_max(dtype)
    return (t.to(torch.float32) * scale).clamp(-m, m).to(dtype)


def scaled_mm(
    a: torch.Tensor,
    inv_a: torch.Tensor,
    b: torch.Tensor,
    inv_b: torch.Tensor,
    out_dtype: torch.dtype,
    fast_accum: bool,
) -> torch.Tensor:
    """(a * inv_a) @ (b * inv_b) with fp8 operands: A made row-major and B column-major, the
    layouts cuBLASLt requires (the CPU takes any), as torchao's preprocess_addmm does."""
    if a.stride(-1) != 1:
        a = a.contiguous()
    if b.stride(0) != 1:
        b = b.t().contiguous().t()
    if not a.is_cpu:
        return torch._scaled_mm(a, b, scale_a=inv_a, scale_b=inv_b, out_dtype=out_dtype, use_fast_accum=fast_accum)
    # On the CPU, ATen's emulated path, as ampkit-train takes it: oneDNN's fp8 gemm is about 500 times
    # slower on CPUs without fp8 units, and the emulated one equals dequantize + float32 matmul bit
    # for bit. The switch is process-wide for the call's length, as torch.backends.mkldnn.flags is.
    onednn = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        return torch._scaled_mm(a, b, scale_a=inv_a, scale_b=inv_b, out_dtype=out_dtype, use_fast_accum=fast_accum)
    finally:
        torch._C._set_mkldnn_enabled(onednn)


class Plan:
    """What one layer's matmul needs besides its tensors: the fp8 dtype of each role, whether
    scales come from the tensor being cast (current) or from the stored ones, and the shared
    block whose update a backward makes due."""

    __slots__ = ("dtypes", "current", "eps", "block")

    def __init__(self, dtypes: Tuple[torch.dtype, torch.dtype, torch.dtype], current: bool, eps: float) -> None:
        self.dtypes = dtypes
        self.current = current
        self.eps = eps
        self.block: Any = None


def _scale_for(plan: Plan, role: int, amax: torch.Tensor, scales: Optional[torch.Tensor]) -> torch.Tensor:
    if plan.current or scales is None:
        return current_scale(amax, plan.dtypes[role], plan.eps)
    return scales[role]


def _record(plan: Plan, amax_row: Optional[torch.Tensor], role: int, amax: torch.Tensor) -> None:
    """This step's amax of a role into the layer's row of the shared block: the maximum over the
    calls of a step (a layer called twice), the last call's under current scaling (no update
    consumes it; fp8_state() shows it). amax_row None: a pass that records nothing."""
    if amax_row is None:
        return
    slot = amax_row[role]
    if plan.current:
        slot.copy_(amax)
    else:
        torch.maximum(slot, amax.to(torch.float32), out=slot)


class Fp8Matmul(torch.autograd.Function):
    """x @ weight.t() in fp8. Saved for backward: the fp8 casts of x and weight and their inverse
    scales (the bits torchao recasts from the high-precision tensors are the same ones)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, layer: Any, record: bool) -> torch.Tensor:
        plan: Plan = layer._fp8_plan
        scales = None if plan.current else layer.fp8_scale
        amax_row = layer.fp8_amax if record else None
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        ax, aw = amax_of(x2), amax_of(weight)
        s_x, s_w = _scale_for(plan, 0, ax, scales), _scale_for(plan, 1, aw, scales)
        _record(plan, amax_row, 0, ax)
        _record(plan, amax_row, 1, aw)
        x8, w8 = cast(x2, s_x, plan.dtypes[0]), cast(weight, s_w, plan.dtypes[1])
        inv_x, inv_w = s_x.reciprocal(), s_w.reciprocal()
        out = scaled_mm(x8, inv_x, w8.t(), inv_w, x.dtype, True)
        ctx.save_for_backward(x8, w8, inv_x, inv_w, ax, aw)
        # The layer's rows of the shared block are read again when the backward runs: the stored
        # grad_output scale in force then, and the rows where they are then (a later forward of the
        # same step may have gathered the block anew).
        ctx.layer = layer
        ctx.record = record
        ctx.x_shape = shape
        return out.reshape(*shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        x8, w8, inv_x, inv_w, ax, aw = ctx.saved_tensors
        layer = ctx.layer
        plan: Plan = layer._fp8_plan
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        ag = amax_of(g2)
        s_g = _scale_for(plan, 2, ag, None if plan.current else layer.fp8_scale)
        if ctx.record:
            _record(plan, layer.fp8_amax, 2, ag)
            if plan.block is not None:
                plan.block.make_due()
        g8 = cast(g2, s_g, plan.dtypes[2])
        inv_g = s_g.reciprocal()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = scaled_mm(g8, inv_g, w8, inv_w, grad_out.dtype, False).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            # A non-finite amax (an inf the casts clamped to fp8_max) makes this weight gradient
            # NaN, as the high-precision matmul's would be: a GradScaler skips the step (every
            # rank's, as DDP averages it). 0 * amax is 0, or NaN, and costs no host read.
            bad = (ax.float() + aw.float() + ag.float()) * 0.0
            grad_w = scaled_mm(g8.t(), inv_g + bad, x8, inv_x, grad_out.dtype, False)
        return grad_x, grad_w, None, None
