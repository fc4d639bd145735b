"""torch.compile with ampkit.GradScaler (backend aot_eager: no C++ compiler needed).

(a) A compiled model in an eager training loop gives the uncompiled loop's losses, scale
    sequence, stepped flags and parameters.
(b) A whole compiled training step (forward, scale(loss).backward(), step, update) runs with
    graph breaks: the scaler's calls into its C++ core (torch.classes.ampkit.ScalerCore, a
    TorchScript custom class) are not traced, so Dynamo breaks the graph there and runs them
    eagerly; torch's own Optimizer.zero_grad, Tensor.backward and Optimizer.step break it too.
    The results are eager's: the same losses, scales and flags; parameters equal to rounding,
    because Dynamo's traced optimizer step rounds differently from the eager one (torch's own
    GradScaler gives bit for bit the same compiled parameters as ampkit's).
"""

import math

import pytest
import torch
import torch._dynamo

import ampkit

STEPS, NAN_AT = 20, 7


def make_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def batches():
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(STEPS):
        x = torch.randn(8, 16, generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        if i == NAN_AT:
            x[0, 0] = math.nan
        out.append((x, y))
    return out


def make_scaler(kind="ampkit"):
    # growth_interval 4: the scale grows a few times in 20 steps (and then overflows fp16 once).
    if kind == "torch":
        return torch.amp.GradScaler("cpu", growth_interval=4)
    return ampkit.GradScaler("cpu", growth_interval=4)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_same_run(eager, other, atol=0.0):
    losses_e, scales_e, flags_e, params_e = eager
    losses_o, scales_o, flags_o, params_o = other
    assert flags_o == flags_e
    assert scales_o == scales_e
    assert len(losses_o) == len(losses_e) == STEPS
    for i, (a, b) in enumerate(zip(losses_e, losses_o)):
        if math.isnan(a):
            assert math.isnan(b), i
        else:
            assert b == pytest.approx(a, abs=1e-5), i
    for a, b in zip(params_e, params_o):
        if atol == 0.0:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(b, a, rtol=0, atol=atol)


def assert_eventful(run):
    losses, scales, flags, _ = run
    assert math.isnan(losses[NAN_AT]) and not flags[NAN_AT]
    assert max(scales) > 65536.0  # grew at least once
    assert sum(flags) >= STEPS - 3


def train_with_compiled_model(compile_model):
    model, opt = make_model()
    forward = torch.compile(model, backend="aot_eager") if compile_model else model
    scaler = make_scaler()
    losses, scales, flags = [], [], []
    for x, y in batches():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(forward(x), y)
        scaler.scale(loss).backward()
        flags.append(scaler.step(opt))
        scaler.update()
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    return losses, scales, flags, [p.detach().clone() for p in model.parameters()]


def test_compiled_model_trains_as_the_uncompiled_one():
    eager = train_with_compiled_model(False)
    compiled = train_with_compiled_model(True)
    assert_eventful(eager)
    assert_same_run(eager, compiled)  # gradients of the aot_eager graph are eager's, bit for bit


def make_step(model, opt, scaler):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        took = scaler.step(opt)
        scaler.update()
        return loss.detach(), took

    return step


def train_with_step_function(compile_step, kind="ampkit"):
    model, opt = make_model()
    scaler = make_scaler(kind)
    step = make_step(model, opt, scaler)
    if compile_step:
        step = torch.compile(step, backend="aot_eager")
    losses, scales, flags = [], [], []
    for x, y in batches():
        loss, took = step(x, y)
        flags.append(took if kind == "ampkit" else None)
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    return losses, scales, flags, [p.detach().clone() for p in model.parameters()]


def test_compiled_training_step_runs_with_graph_breaks_and_matches_eager():
    eager = train_with_step_function(False)
    compiled = train_with_step_function(True)
    assert_eventful(eager)
    # Dynamo's traced SGD step rounds differently from the eager one (2**-25 here): not ampkit's.
    assert_same_run(eager, compiled, atol=1e-6)
    torch._dynamo.reset()
    # torch.amp.GradScaler in the same compiled step: the same parameters as ampkit's, bit for bit.
    with_torch = train_with_step_function(True, kind="torch")
    assert with_torch[1] == compiled[1]
    for a, b in zip(compiled[3], with_torch[3]):
        assert torch.equal(a, b)


def test_explain_counts_the_graph_breaks_at_the_scalers_core():
    model, opt = make_model()
    scaler = make_scaler()
    x, y = batches()[0]
    explanation = torch._dynamo.explain(make_step(model, opt, scaler))(x, y)
    reasons = [b.reason for b in explanation.break_reasons]
    # torch 2.11: 5 graphs, 4 breaks; the listed reasons are the ScalerCore call in scale()
    # (get_scale on the custom class) and the unscale call that Dynamo cannot resume from.
    assert explanation.graph_break_count >= 1
    assert explanation.graph_count == explanation.graph_break_count + 1
    assert any("ScalerCore" in r for r in reasons), reasons
    # explain ran one real step: the scaler's state moved as an eager step's would.
    assert scaler.last_step["stepped"] is True
    assert scaler.get_scale() == 65536.0


def test_fullgraph_refuses_the_scalers_core_with_dynamos_unsupported():
    # fullgraph=True turns the first graph break into an error: the ScalerCore call in scale().
    model, _ = make_model()
    scaler = make_scaler()
    scale = torch.compile(lambda loss: scaler.scale(loss), backend="aot_eager", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="ScalerCore"):
        scale(model(torch.ones(3, 16)).sum())
