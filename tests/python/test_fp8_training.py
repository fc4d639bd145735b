"""ampkit.fp8 in training: a non-finite amax is a bad step for ampkit.GradScaler, and a converted
model under torch.compile gives eager's outputs and gradients (docs/fp8.md, "With GradScaler",
"Under torch.compile"). The amax reduction across ranks is tests/python/test_fp8_ddp.py."""

import pytest
import torch
from torch import nn

import ampkit


def mlp(seed=0, width=8):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 4))


def data(step, width=8):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, width, generator=g) * 3.0, torch.randn(16, 4, generator=g)


def fp8_layers(model):
    return [m for m in model.modules() if isinstance(m, ampkit.fp8.Linear)]


@pytest.mark.parametrize("recipe", ["current", "delayed", "predictive"])
def test_an_inf_input_is_a_skipped_step_that_moves_no_fp8_window(recipe):
    options = {} if recipe == "current" else {"amax_history_len": 4}
    model = ampkit.fp8.convert(mlp(), recipe=recipe, opt=options)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampkit.GradScaler("cpu", model=model)
    seen = []
    for step in range(4):
        x, y = data(step)
        if step == 2:
            x[0, 0] = float("inf")  # clamped to 448 by the cast: the loss stays finite
            ampkit.fp8.update(model)
            state = [layer.fp8_state() for layer in fp8_layers(model)]
            params = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        # Under current scaling the inf's own scale is 448 / inf = 0, and inf * 0 a NaN (torchao's too).
        assert bool(torch.isfinite(loss)) is not (recipe == "current" and step == 2)
        scaler.scale(loss).backward()
        seen.append((scaler.step(opt), scaler.get_scale()))
        scaler.update()
        record = scaler.last_step
        if step == 2:
            assert record["action"] == "skip" and record["stepped"] is False
            # The first layer's input; under current also the NaN's: 2 inputs, 3 grad_outputs.
            bad = 6 if recipe == "current" else 1
            assert record["fp8_nonfinite_amaxes"] == bad
            assert record["reason"].endswith(f"({bad} non-finite fp8 amaxes)"), record["reason"]
            if recipe != "current":  # (there every gradient is NaN)
                assert record["top_layers"][0]["name"] == "0.weight"
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
            ampkit.fp8.update(model)
            if recipe != "current":  # (current keeps no window: its state is the last cast's)
                assert [layer.fp8_state() for layer in fp8_layers(model)] == state
        else:
            assert record["action"] == "proceed" and record["fp8_nonfinite_amaxes"] == 0
    assert [took for took, _ in seen] == [True, True, False, True]
    # The dynamic scaler backs off on the skipped step, as torch.amp's does on an inf input.
    assert [s for _, s in seen] == [65536.0, 65536.0, 65536.0, 32768.0]  # get_scale() before update()
    assert all(torch.isfinite(p).all() for p in model.parameters())


class CountingStandIn:
    """delayed-like rule of its own; counts update calls."""

    def __init__(self):
        self.calls = 0

    def current_scaling(self):
        return False

    def history_length(self):
        return 4

    def fp8_format(self, role):
        return "e5m2" if role == 2 else "e4m3"

    def update(self, roles, amax, history, scale):
        self.calls += 1
        history.copy_(torch.cat([amax.unsqueeze(1), history[:, :-1]], dim=1))
        scale.copy_(torch.where(roles == 2, 57344.0, 448.0) / history.amax(dim=1).clamp(min=1e-12))
        return 0


def run_steps(model, opt, steps):
    out = []
    for step in range(steps):
        x, y = data(step)
        opt.zero_grad()
        pred = model(x)
        nn.functional.mse_loss(pred, y).backward()
        out.append((pred.detach().clone(), [p.grad.clone() for p in model.parameters()]))
        opt.step()
    return out


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_model_matches_eager_with_one_update_per_step(backend):
    eager_recipe, compiled_recipe = CountingStandIn(), CountingStandIn()
    eager = ampkit.fp8.convert(mlp(), recipe=eager_recipe)
    base = ampkit.fp8.convert(mlp(), recipe=compiled_recipe)
    compiled = torch.compile(base, backend=backend)
    torch._dynamo.reset()
    steps = 4
    a = run_steps(eager, torch.optim.SGD(eager.parameters(), lr=0.1), steps)
    b = run_steps(compiled, torch.optim.SGD(base.parameters(), lr=0.1), steps)
    # The fp8 layers run eagerly in both (a graph break around each); between them aot_eager runs
    # ATen's own kernels (bit for bit), inductor its generated ones, which may fuse tanh and its
    # backward and round differently in the last float32 bits (here they measured equal).
    exact = backend == "aot_eager"
    for (pa, ga), (pb, gb) in zip(a, b):
        for x, y in zip([pa, *ga], [pb, *gb]):
            if exact:
                assert torch.equal(x, y)
            else:
                torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)
    assert eager_recipe.calls == compiled_recipe.calls == steps - 1  # one per step, the last still due
    ours, theirs = (
        sum(([s["scale"] for s in layer.fp8_state().values()] for layer in fp8_layers(m)), []) for m in (eager, base)
    )
    assert ours == theirs if exact else ours == pytest.approx(theirs, rel=1e-5)
