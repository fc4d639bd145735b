#!/usr/bin/env python3
"""Golden values of torchao's tensorwise fp8 training, written to tests/data/fp8_current_goldens.json.

Pinned: torch==2.11.0 and torchao==0.18.0 (tools/constraints.txt; tools/setup.sh installs both).
Both versions are checked below: another version's values are not these goldens.

ampkit's `current` fp8 recipe claims the numbers of torchao's `Float8Linear` with
`Float8LinearConfig()` defaults (the `tensorwise` recipe: dynamic per-tensor scales, E4M3 for
input and weight, E5M2 for grad_output). torchao runs it on the CPU with `emulate=True`, where
every fp8 matmul is `torch.mm(a_fp8.float() / a_scale, b_fp8.float() / b_scale)` in float32.
This script runs that real module over fixed seeded inputs whose magnitudes span 1e0 to 1e2 and
records the inputs, the output and every gradient, so a test compares ampkit's fp8 layer with
them without torchao installed (within 1e-5 of the largest value; docs/fp8.md says why not ==).

It also recomputes every case with the rule docs/fp8.md writes down (`reference_forward` and `reference_backward` below)
and refuses to write the file unless that rule reproduces torchao bit for bit: the documented
rule and the golden source cannot drift apart. Run from the repository root:

    python3 tools/golden/fp8_torchao_goldens.py            # rewrites tests/data/fp8_current_goldens.json
    python3 tools/golden/fp8_torchao_goldens.py --check    # exits 1 if the file would change
"""

import argparse
import json
import os
import sys

import torch

TORCH_VERSION = "2.11.0"
TORCHAO_VERSION = "0.18.0"
OUTPUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "fp8_current_goldens.json")

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
EPS = 1e-12  # torchao.float8.float8_utils.EPS: the amax floor, applied in float64


def scale_of(t: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """torchao's amax_to_scale: fp8_max / max(amax, 1e-12) in float64, rounded to float32."""
    amax = t.abs().max().to(torch.float64)
    return (torch.finfo(fp8_dtype).max / torch.clamp(amax, min=EPS)).to(torch.float32)


def cast(t: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """Scale in float32, clamp to +-fp8_max (torch 2.11's casts do not saturate), cast."""
    fp8_max = torch.finfo(fp8_dtype).max
    return (t.to(torch.float32) * scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)


def reference_forward(x, weight, bias):
    """The tensorwise forward as docs/fp8.md states it: y = dq(x) @ dq(W)^T + b."""
    x2 = x.reshape(-1, x.shape[-1])
    s_x, s_w = scale_of(x2, E4M3), scale_of(weight, E4M3)
    # Each fp8 operand is dequantized by a true division by its float32 scale, then float32 mm.
    x_d = cast(x2, s_x, E4M3).float() / s_x
    w_t_d = cast(weight.t(), s_w, E4M3).float() / s_w
    out = torch.mm(x_d, w_t_d).reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias


def reference_backward(x, weight, bias, grad_out):
    """The tensorwise backward: grad_x = dq(g) @ dq(W), grad_W = dq(g)^T @ dq(x), grad_b = sum(g)."""
    x2, go2 = x.reshape(-1, x.shape[-1]), grad_out.reshape(-1, grad_out.shape[-1])
    s_x, s_w, s_go = scale_of(x2, E4M3), scale_of(weight, E4M3), scale_of(go2, E5M2)
    x_d = cast(x2, s_x, E4M3).float() / s_x
    w_t_d = cast(weight.t(), s_w, E4M3).float() / s_w
    go_d = cast(go2, s_go, E5M2).float() / s_go
    grad_x = torch.mm(go_d, w_t_d.t()).reshape(x.shape)
    grad_w = torch.mm(go_d.t(), x_d)
    grad_b = None if bias is None else go2.sum(0)
    scales = {"input": s_x.item(), "weight": s_w.item(), "grad_output": s_go.item()}
    return grad_x, grad_w, grad_b, scales


def log_uniform(gen, shape, lo_exp, hi_exp):
    """Values whose magnitudes are spread evenly in log10 over [10**lo_exp, 10**hi_exp], random signs."""
    mag = torch.pow(10.0, lo_exp + (hi_exp - lo_exp) * torch.rand(shape, generator=gen))
    sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)
    return (mag * sign).to(torch.float32)


# name, layer sizes (in, hidden..., out), bias, input shape (batch dims + in), how x and grad_out are drawn
CASES = [
    ("magnitude_1e0", [16, 12], True, [8, 16], ("normal", 1.0), ("normal", 1.0)),
    ("magnitude_1e1", [16, 12], True, [8, 16], ("normal", 10.0), ("normal", 1.0)),
    ("magnitude_1e2", [16, 12], True, [8, 16], ("normal", 100.0), ("normal", 100.0)),
    ("span_1e0_1e2_3d_nobias", [16, 12], False, [2, 4, 16], ("span", 0.0, 2.0), ("span", 0.0, 2.0)),
    ("mlp_span_1e0_1e2", [16, 24, 8], True, [6, 16], ("span", 0.0, 2.0), ("span", 0.0, 2.0)),
]


def draw(gen, shape, how):
    if how[0] == "normal":
        return torch.randn(shape, generator=gen) * how[1]
    return log_uniform(gen, shape, how[1], how[2])


def build_model(sizes, bias, gen):
    """Linear layers with ReLU between them, initialised from `gen` (nn.Linear's own bounds)."""
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = torch.nn.Linear(fan_in, fan_out, bias=bias)
        bound = 1.0 / fan_in**0.5
        with torch.no_grad():
            lin.weight.copy_((torch.rand(fan_out, fan_in, generator=gen) * 2 - 1) * bound)
            if bias:
                lin.bias.copy_((torch.rand(fan_out, generator=gen) * 2 - 1) * bound)
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def run_torchao(model, x, grad_out):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    fp8 = convert_to_float8_training(model, config=Float8LinearConfig(emulate=True))
    x = x.clone().requires_grad_()
    out = fp8(x)
    out.backward(grad_out)
    linears = [m for m in fp8 if hasattr(m, "weight")]
    return out.detach(), x.grad, linears


def run_reference(model, x, grad_out):
    """Forward and backward through the reference functions, layer by layer (ReLU by hand)."""
    linears = [m for m in model if hasattr(m, "weight")]
    acts, pre = [x], []
    for i, lin in enumerate(linears):
        out = reference_forward(acts[-1], lin.weight.detach(), _detached(lin.bias))
        pre.append(out)
        acts.append(out if i == len(linears) - 1 else torch.relu(out))
    grads, g = [], grad_out
    for i in reversed(range(len(linears))):
        lin = linears[i]
        if i < len(linears) - 1:
            g = torch.where(pre[i] > 0, g, torch.zeros_like(g))  # ReLU's backward, as autograd does it
        gx, gw, gb, scales = reference_backward(acts[i], lin.weight.detach(), _detached(lin.bias), g)
        grads.insert(0, (gw, gb, scales))
        g = gx
    return acts[-1], g, grads


def _detached(t):
    return None if t is None else t.detach()


def values(t):
    return {"shape": list(t.shape), "values": [float(v) for v in t.reshape(-1).tolist()]}


def build():
    cases = []
    for name, sizes, bias, in_shape, x_how, go_how in CASES:
        gen = torch.Generator().manual_seed(len(cases) + 1)
        model = build_model(sizes, bias, gen)
        x = draw(gen, in_shape, x_how).to(torch.float32)
        grad_out = draw(gen, in_shape[:-1] + [sizes[-1]], go_how).to(torch.float32)
        params = [
            {"weight": values(m.weight.detach()), "bias": None if m.bias is None else values(m.bias.detach())}
            for m in model
            if hasattr(m, "weight")
        ]
        ref_out, ref_gx, ref_grads = run_reference(model, x, grad_out)
        out, gx, linears = run_torchao(model, x, grad_out)
        check_equal(name, "output", out, ref_out)
        check_equal(name, "grad_input", gx, ref_gx)
        layers = []
        for i, (lin, (gw, gb, scales)) in enumerate(zip(linears, ref_grads)):
            check_equal(name, f"layer {i} grad_weight", lin.weight.grad, gw)
            if gb is not None:
                check_equal(name, f"layer {i} grad_bias", lin.bias.grad, gb)
            layers.append(
                {
                    **params[i],
                    "grad_weight": values(lin.weight.grad),
                    "grad_bias": None if lin.bias is None else values(lin.bias.grad),
                    "scales": scales,
                }
            )
        cases.append(
            {
                "name": name,
                "sizes": sizes,
                "relu_between": True,
                "input": values(x),
                "grad_output": values(grad_out),
                "output": values(out),
                "grad_input": values(gx),
                "layers": layers,
            }
        )
    return {
        "source": f"torchao {TORCHAO_VERSION} torchao.float8.convert_to_float8_training("
        "config=Float8LinearConfig(emulate=True)) on the CPU, torch " + TORCH_VERSION,
        "recipe": "tensorwise: scale = float32(fp8_max / max(float64(amax), 1e-12)); input and weight "
        "float8_e4m3fn (max 448), grad_output float8_e5m2 (max 57344); cast = clamp(x * scale) "
        "then .to(fp8); matmuls on fp8 / scale in float32",
        "tolerance": "compare within 1e-5 of the largest absolute value of each tensor",
        "cases": cases,
    }


def check_equal(case, what, got, want):
    if not torch.equal(got, want):
        diff = (got - want).abs().max().item()
        sys.exit(
            f"{case}: the documented rule differs from torchao for {what} (max |diff| {diff}); "
            "fix docs/fp8.md and the reference functions before writing goldens"
        )


def check_versions():
    import torchao

    have = (torch.__version__.split("+")[0], torchao.__version__.split("+")[0])
    if have != (TORCH_VERSION, TORCHAO_VERSION):
        sys.exit(
            f"these goldens are pinned to torch {TORCH_VERSION} and torchao {TORCHAO_VERSION}, "
            f"found torch {have[0]} and torchao {have[1]} (tools/setup.sh installs the pinned ones)"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    args = parser.parse_args()
    check_versions()
    text = json.dumps(build(), separators=(",", ":")) + "\n"
    if args.check:
        with open(OUTPUT) as f:
            if f.read() != text:
                print(f"{OUTPUT} is stale: run python3 tools/golden/fp8_torchao_goldens.py")
                return 1
        print(f"{OUTPUT} is up to date")
        return 0
    with open(OUTPUT, "w") as f:
        f.write(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
