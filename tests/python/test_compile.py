"""torch.compile with ampkit.GradScaler (backend aot_eager: no C++ compiler needed).

(a) A compiled model in an eager training loop gives the uncompiled loop's losses, scale
    sequence, stepped flags and parameters.
(b) A whole compiled training step (forward, scale(loss).backward(), step, update) runs with
    graph breaks: the scaler's calls into its C++ core (torch.classes.ampkit.ScalerCore, a
    TorchScript custom class) are not traced, and step(), update() and unscale_() are
    torch.compiler.disable'd, so Dynamo breaks the graph at those calls and runs them eagerly;
    torch's own Optimizer.zero_grad and Tensor.backward break it too. The results are eager's,
    parameters included, bit for bit (torch's GradScaler, traced, differs from eager by rounding).
(c) With the deferred step (sync="deferred"), no graph break inside step() or update(): they are
    torch.compiler.disable'd, so the compiled loop breaks only at the two calls, never at a host read.
"""

import logging
import math
import os
import re

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
    # step() and update() are torch.compiler.disable'd: the optimizer steps eagerly inside step(),
    # so the compiled loop's parameters are eager's, bit for bit.
    assert_same_run(eager, compiled)
    torch._dynamo.reset()
    # torch.amp.GradScaler in the same compiled step: Dynamo traces torch's step and its SGD step,
    # which rounds differently from the eager one (2**-25 here); the same scales.
    with_torch = train_with_step_function(True, kind="torch")
    assert with_torch[1] == compiled[1]
    for a, b in zip(compiled[3], with_torch[3]):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


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


class GraphBreaks(logging.Handler):
    """Dynamo's graph-break log (TORCH_LOGS=graph_breaks) as (file, line, reason), every frame's,
    resumed ones included (torch._dynamo.explain counts only the first frame's)."""

    def __init__(self):
        super().__init__()
        self.breaks = []

    def emit(self, record):
        text = record.getMessage()
        where = re.search(r"in user code at (\S+):(\d+)", text)
        if where is None:
            return
        lines = [line.strip() for line in text.splitlines()[1:]]
        reason = next((line for line in lines if line and not line.startswith("Graph Break Reason:")), "")
        self.breaks.append((where.group(1), int(where.group(2)), reason))

    def __enter__(self):
        torch._logging.set_logs(graph_breaks=True)
        logging.getLogger("torch._dynamo").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("torch._dynamo").removeHandler(self)
        torch._logging.set_logs()


HOST_READ = re.compile(r"item\(|tolist|data.dependent|__bool__|Data-dependent|dynamic control flow", re.I)


def train_deferred(compile_step):
    model, _ = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = ampkit.GradScaler("cpu", growth_interval=4, sync="deferred")
    eager_step = make_step(model, opt, scaler)
    compiled_step = torch.compile(eager_step, backend="aot_eager") if compile_step else eager_step
    flags, scales = [], []
    for i, (x, y) in enumerate(batches()):
        # Two eager steps first: the deferred step and its device scale exist from the first step().
        _, took = (compiled_step if i >= 2 else eager_step)(x, y)
        flags.append(bool(took))
        scales.append(scaler.get_scale())
    assert scaler.last_step["host_sync"] == "deferred", scaler.last_step
    return flags, scales, [p.detach().clone() for p in model.parameters()]


def test_the_deferred_step_has_no_graph_break_inside_step_or_update():
    # step(), update() and unscale_() are torch.compiler.disable'd: Dynamo never traces into them,
    # so nothing inside them (a host read least of all) breaks a graph; the only breaks are the two
    # calls themselves, and the compiled loop takes eager's decisions.
    eager = train_deferred(False)
    torch._dynamo.reset()
    with GraphBreaks() as log:
        compiled = train_deferred(True)
    package = os.path.dirname(ampkit.__file__)
    inside = [b for b in log.breaks if b[0].startswith(package)]
    assert inside == [], inside
    at_calls = [b for b in log.breaks if b[0] == __file__ and "compiler.disable" in b[2]]
    assert len({b[1] for b in at_calls}) == 2, log.breaks  # the step() and update() lines
    assert not [b for b in log.breaks if HOST_READ.search(b[2])], log.breaks
    assert compiled[0] == eager[0] and compiled[1] == eager[1]
    assert not compiled[0][NAN_AT] and sum(compiled[0]) >= STEPS - 3
    for a, b in zip(eager[2], compiled[2]):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)  # Dynamo's traced ops round on their own


def test_the_graph_break_log_sees_a_host_read():
    # The harness above is not blind: a host read in compiled code is a logged break it classifies.
    def reads(x):
        y = x * 2
        if y.sum().item() > 0:
            return y + 1
        return y - 1

    with GraphBreaks() as log:
        torch.compile(reads, backend="aot_eager")(torch.ones(3))
    assert [b for b in log.breaks if b[0] == __file__ and HOST_READ.search(b[2])], log.breaks
