"""ampkit.GradScaler(scaler="dynamic", clipper="norm") against torch.amp.GradScaler + unscale_ +
clip_grad_norm_ in the same fp16 loop (CPU autocast) with planted overflows: the scale sequence
and the stepped/skipped flags are equal, the parameters within 1e-6, with SGD, AdamW and
AdamW(fused=True)."""

import copy
import math

import pytest
import torch

import ampkit

STEPS = 300
OVERFLOW_STEPS = {7, 8, 40, 41, 42, 120, 200, 201, 260}  # a gradient set to inf after backward
MAX_NORM = 0.05
GROWTH_INTERVAL = 25  # short, so the scale grows several times between overflows


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(STEPS)]


def optimizer_for(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    return torch.optim.AdamW(params, lr=1e-3, fused=True)


def forward_backward(model, scaler, x, y, step):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if step in OVERFLOW_STEPS:
        model[2].weight.grad[0, step % 32] = math.inf


KINDS = ["sgd", "adamw", "adamw_fused"]


@pytest.mark.parametrize("kind", KINDS)
def test_parity_with_torch_amp(kind):
    """Both loops run side by side, 300 steps. Each step starts ampkit's model and optimizer from
    torch's (an fp16 forward turns a 1e-7 difference into an fp16 rounding flip, so free-running
    runs drift apart however exact the step is); each scaler keeps its own state throughout."""
    data = batches()
    t_model = make_model()
    a_model = copy.deepcopy(t_model)
    t_opt = optimizer_for(kind, t_model.parameters())
    a_opt = optimizer_for(kind, a_model.parameters())
    t_scaler = torch.amp.GradScaler("cpu", growth_interval=GROWTH_INTERVAL)
    a_scaler = ampkit.GradScaler("cpu", growth_interval=GROWTH_INTERVAL, clipper="norm", opt={"clipper.max_norm": MAX_NORM})
    t_scales, t_stepped, a_scales, a_stepped = [], [], [], []
    worst = 0.0
    clipped = 0
    for step, (x, y) in enumerate(data):
        with torch.no_grad():
            for a, t in zip(a_model.parameters(), t_model.parameters()):
                a.copy_(t)
        a_opt.load_state_dict(copy.deepcopy(t_opt.state_dict()))

        t_opt.zero_grad(set_to_none=True)
        forward_backward(t_model, t_scaler, x, y, step)
        t_scaler.unscale_(t_opt)
        norm = torch.nn.utils.clip_grad_norm_(t_model.parameters(), MAX_NORM)
        found_inf = sum(v.item() for v in t_scaler._found_inf_per_device(t_opt).values())
        t_scaler.step(t_opt)
        t_scaler.update()
        t_scales.append(t_scaler.get_scale())
        t_stepped.append(found_inf == 0)
        clipped += int(bool(found_inf == 0 and norm > MAX_NORM))

        a_opt.zero_grad(set_to_none=True)
        forward_backward(a_model, a_scaler, x, y, step)
        a_stepped.append(a_scaler.step(a_opt))
        a_scaler.update()
        a_scales.append(a_scaler.get_scale())

        for a, t in zip(a_model.parameters(), t_model.parameters()):
            worst = max(worst, (a - t).abs().max().item())
    assert a_stepped == t_stepped
    assert [i for i, s in enumerate(t_stepped) if not s] == sorted(OVERFLOW_STEPS)
    assert a_scales == t_scales
    assert len(set(t_scales)) > 3  # the scale grew and backed off several times
    assert clipped > 100  # the clipper was active on most taken steps
    assert worst <= 1e-6, f"largest parameter difference after a step: {worst}"
