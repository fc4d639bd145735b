"""The whole step in a CUDA graph (the deferred step captured): forward, backward, ampkit.GradScaler.step() and update()
captured with torch.cuda.graph and replayed, against the same loop uncaptured.

On a GPU: torch's test_graph_grad_scaling (test/test_cuda.py), which captures forward and backward
only and runs step()/update() outside the graph, extended to step() and update() inside it, with
fused SGD and AdamW(capturable=True): the same scales, skips and parameters, replay for replay, and
the same scales as torch.amp.GradScaler captured the same way (with a fused optimizer torch's step
reads nothing on the host either; its weights to 1e-6); and a second capture after one uncaptured
step. On the CPU, torch's and ampkit's uncaptured loops over these inputs give the same scales and
bit-equal weights (test_the_graph_tests_inputs_give_torchs_scales_and_weights_uncaptured_on_the_cpu).

Without a GPU the same steps run on CPU tensors with the capture's flag raised ("captured" steps
run at once there): every record goes through the device ring and reaches the host forms only when
the host state is read, as after replays; and the calls a capture cannot hold are refused, each
with one RuntimeError.
"""

import copy
import pickle
from typing import Any, Dict, List, Tuple

import pytest
import torch

import ampkit
import ampkit._deferred as deferred_module
from test_deferred_step import run_until_abort

OVERFLOWS = {7, 8, 40, 41, 42, 120, 200, 201, 260}
NAN_LOSS = {90, 150}


def _run(sync: str, flag=None, capture_from: int = 2, steps: int = 300, read_every: int = 0) -> Dict[str, Any]:
    """300 fp16-like steps with planted overflows, NaN losses and clipping, the backoff policy; with
    ``flag``, every step from ``capture_from`` on runs as captured."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = ampkit.GradScaler(
        "cpu",
        sync=sync,
        init_scale=2.0**12,
        growth_interval=10,
        clipper="norm",
        opt={"clipper.max_norm": 0.5},
        nan_policy="backoff",
    )
    gen = torch.Generator().manual_seed(1)
    out: Dict[str, List[Any]] = {"stepped": [], "reads": [], "read_reads": []}
    for i in range(steps):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        before = torch.ops.ampkit.host_reads()
        if flag is not None:
            flag["on"] = i >= capture_from
        loss = torch.nn.functional.mse_loss(model(x), y)
        if i in NAN_LOSS:
            loss = loss * float("nan")
        scaler.scale(loss).backward()
        if i in OVERFLOWS:
            model[0].weight.grad[0, 0] = float("inf")
        out["stepped"].append(scaler.step(opt))
        scaler.update()
        if flag is not None:
            flag["on"] = False
        out["reads"].append(torch.ops.ampkit.host_reads() - before)
        if read_every and i % read_every == read_every - 1:
            before = torch.ops.ampkit.host_reads()
            scaler.get_scale()
            out["read_reads"].append(torch.ops.ampkit.host_reads() - before)
    out["stepped"] = [bool(s) for s in out["stepped"]]
    out["params"] = [p.detach().clone() for p in model.parameters()]
    out["scale"] = scaler.get_scale()
    out["state"] = scaler.state_dict()
    out["record"] = {k: v for k, v in scaler.last_step.items() if k not in ("top_layers", "layer_norms")}
    return out


def test_captured_steps_equal_the_synchronous_steps_and_wait_for_a_read(capture_flag):
    sync = _run("step")
    graph = _run("deferred", flag=capture_flag, read_every=50)
    assert graph["reads"] == [0] * 300  # no host read in any step, captured or not
    assert graph["read_reads"] == [2] * 6  # a read of the host state: the ring's count, then its rows
    assert graph["stepped"] == sync["stepped"]
    assert sum(not s for s in sync["stepped"]) == len(OVERFLOWS) + len(NAN_LOSS)
    assert all(torch.equal(a, b) for a, b in zip(graph["params"], sync["params"]))
    assert graph["scale"] == sync["scale"]
    assert graph["state"] == sync["state"]
    sync["record"]["host_sync"], sync["record"]["host_sync_reason"] = graph["record"]["host_sync"], ""
    graph["record"]["host_sync_reason"] = ""
    assert graph["record"] == sync["record"]
    assert graph["record"]["step"] == 299 and graph["record"]["host_sync"] == "deferred"  # counted from 0


def test_an_abort_in_a_graph_raises_at_the_next_read_and_nothing_after_it_is_applied(capture_flag):
    def captured(i: int, on: bool) -> None:
        capture_flag["on"] = on and i >= 1

    eager, graph = run_until_abort("deferred"), run_until_abort("deferred", captured)
    assert eager is not None and graph is not None
    assert graph[0] == 10 and "non-finite loss" in graph[1] and graph[1] == eager[1]  # at the read
    assert all(torch.equal(a, b) for a, b in zip(graph[2], eager[2]))  # the device stopped stepping


def _warm(sync: str = "deferred", fused: bool = True):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    scaler = ampkit.GradScaler("cpu", sync=sync)
    return model, opt, scaler


def _backward(model, scaler):
    scaler.scale(model(torch.ones(3, 4)).sum()).backward()


@pytest.mark.parametrize(
    "case, message",
    [
        ("sync_step", "sync='step'"),
        ("not_fused", "AdamW takes no grad_scale and found_inf"),
        ("no_warm_up", "has not run for this optimizer yet"),
        ("auto_first_iteration", "has not run for this optimizer yet"),
        ("unscale", "unscale_()"),
        ("new_scale", "update(new_scale)"),
        ("read_state", "cannot be read"),
        ("scaler_option", "changing an option"),
        ("plugin_option", "changing an option"),
        ("stepped", "stepped()"),
    ],
)
def test_what_a_capture_cannot_hold_is_refused_with_one_runtime_error(capture_flag, case, message):
    model, opt, scaler = _warm(
        sync={"sync_step": "step", "auto_first_iteration": "auto"}.get(case, "deferred"), fused=case != "not_fused"
    )
    if case not in ("no_warm_up", "auto_first_iteration"):  # one iteration outside the capture
        _backward(model, scaler)
        scaler.step(opt)
        scaler.update()
    _backward(model, scaler)
    capture_flag["on"] = True
    with pytest.raises(RuntimeError, match="CUDA graph capture") as caught:
        if case == "unscale":
            scaler.unscale_(opt)
        elif case == "new_scale":
            scaler.step(opt)
            scaler.update(2.0)
        elif case == "read_state":
            scaler.state_dict()
        elif case == "scaler_option":  # these read the device before the plugin is made again
            scaler.set_growth_factor(3.0)
        elif case == "plugin_option":
            scaler.set_plugin_option("scaler.growth_interval", 7)
        elif case == "stepped":
            scaler.step(opt)
            scaler.update()
            scaler.stepped(opt)
        else:
            scaler.step(opt)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_cuda_scaler_still_sees_a_capture(monkeypatch, how):
    # Until 2026-11-28 pickling rebuilt the deferred mode without cuda=True: a copied CUDA scaler
    # never saw a capture, so what a capture cannot hold ran in it (a raw CUDA error) instead of
    # the one RuntimeError. A CPU scaler stands in, marked as a CUDA one.
    flag = {"on": False}
    monkeypatch.setattr(deferred_module, "capturing", lambda cuda: cuda and flag["on"])
    model, opt, scaler = _warm()
    scaler._deferred.cuda = True
    copied = copy.deepcopy(scaler) if how == "deepcopy" else pickle.loads(pickle.dumps(scaler))
    _backward(model, copied)
    copied.step(opt)
    copied.update()
    flag["on"] = True
    with pytest.raises(RuntimeError, match="CUDA graph capture"):
        copied.state_dict()


# --- on a GPU -----------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# torch's test_graph_grad_scaling's inputs and more, repeated: a gradient of input x scale overflows
# fp16 above 65504 (8 of these steps, with growth every 3 clean steps from scale 4).
INPUTS = [5.0, 20000.0, 5.0, 40000.0, 5.0, 5.0, 5.0, 5.0, 3.0, 70000.0, 5.0, 5.0] * 3


def _graph_setup(optimizer: str, torch_scaler: bool = False):
    """torch's test_graph_grad_scaling's model, warmed up with three uncaptured steps; ampkit's
    GradScaler, or torch's (which a fused optimizer lets run in a graph too) as the reference."""
    weight = torch.ones((100,), device="cuda", requires_grad=True)
    if optimizer == "sgd":
        opt: Any = torch.optim.SGD([weight], lr=0.1, fused=True)
    else:
        opt = torch.optim.AdamW([weight], lr=0.1, fused=True, capturable=True)
    if torch_scaler:
        scaler: Any = torch.amp.GradScaler("cuda", init_scale=4.0, growth_interval=3)
    else:
        scaler = ampkit.GradScaler("cuda", init_scale=4.0, growth_interval=3, sync="deferred")
    static_input = torch.ones_like(weight)

    def one_step():
        loss = (weight.half() * static_input).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as torch's capture recipe does it
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            one_step()
    torch.cuda.current_stream().wait_stream(s)
    return weight, opt, scaler, static_input, one_step


def _capture(opt, one_step) -> Any:
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        one_step()
    return graph


def _graph_loop(optimizer: str, captured: bool) -> Dict[str, Any]:
    weight, opt, scaler, static_input, one_step = _graph_setup(optimizer)
    graph = _capture(opt, one_step) if captured else None
    out: Dict[str, Any] = {"scales": [], "weights": []}
    for value in INPUTS:
        static_input.fill_(value)
        if captured:
            graph.replay()
        else:
            opt.zero_grad(set_to_none=True)
            one_step()
        out["scales"].append(scaler._scale.item())  # the device's scale, as torch's test reads it
        out["weights"].append(weight.detach().clone())
    out["scale"] = scaler.get_scale()  # the host state: every replay's record delivered
    out["state"] = scaler.state_dict()
    out["record"] = scaler.last_step
    if captured:  # the old graph steps the old state after a state change: refused at the next read
        scaler.load_state_dict(out["state"])
        graph.replay()
        torch.cuda.synchronize()
        with pytest.raises(RuntimeError, match="capture the graph again"):
            scaler.get_scale()
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_graph_tests_inputs_give_torchs_scales_and_weights_uncaptured_on_the_cpu(optimizer):
    # The GPU tests below expect torch's scales; here the same inputs, uncaptured on CPU tensors
    # with fused optimizers, against torch.amp.GradScaler("cpu"): scales equal, weights bit-equal.
    def loop(torch_scaler: bool) -> Tuple[List[float], torch.Tensor]:
        weight = torch.ones((100,), requires_grad=True)
        if optimizer == "sgd":
            opt: Any = torch.optim.SGD([weight], lr=0.1, fused=True)
        else:
            opt = torch.optim.AdamW([weight], lr=0.1, fused=True)
        if torch_scaler:
            scaler: Any = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=3)
        else:
            scaler = ampkit.GradScaler("cpu", init_scale=4.0, growth_interval=3, sync="deferred")
        x = torch.ones_like(weight)
        scales = []
        for i, value in enumerate([1.0] * 3 + INPUTS):  # three clean warm-up steps first
            x.fill_(value)
            opt.zero_grad(set_to_none=True)
            scaler.scale((weight.half() * x).sum()).backward()
            scaler.step(opt)
            scaler.update()
            if i >= 3:
                scales.append(scaler.get_scale())
        return scales, weight.detach()

    ours, our_weight = loop(torch_scaler=False)
    theirs, their_weight = loop(torch_scaler=True)
    assert ours == theirs
    assert ours[:4] == [8.0, 4.0, 4.0, 2.0]
    assert sum(b < a for a, b in zip([8.0] + ours, ours)) == 8  # 8 overflows, each a backoff
    assert torch.equal(our_weight, their_weight)


@needs_cuda
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_second_capture_after_one_uncaptured_step_continues_the_loop(optimizer):
    # The uncaptured step between the captures keeps the first graph's gradients
    # (set_to_none=False): the same chunk plan, so no new table upload. Until 2026-11-28 only an
    # upload readied the pinned buffer a capture copies its table from, and the second capture
    # failed with "the gradients ... differ".
    weight, opt, scaler, static_input, one_step = _graph_setup(optimizer)
    half = len(INPUTS) // 2
    scales = []
    first = _capture(opt, one_step)
    for value in INPUTS[:half]:
        static_input.fill_(value)
        first.replay()
        scales.append(scaler._scale.item())
    static_input.fill_(INPUTS[half])
    opt.zero_grad(set_to_none=False)
    one_step()
    scales.append(scaler._scale.item())
    second = _capture(opt, one_step)
    for value in INPUTS[half + 1 :]:
        static_input.fill_(value)
        second.replay()
        scales.append(scaler._scale.item())
    eager = _graph_loop(optimizer, captured=False)
    assert scales == eager["scales"]
    assert torch.equal(weight.detach(), eager["weights"][-1])
    assert scaler.get_scale() == eager["scale"]
    assert scaler.last_step["skipped_steps"] == 8


def _torch_graph_scales(optimizer: str) -> Tuple[List[float], torch.Tensor]:
    """torch.amp.GradScaler captured the same way (its fused-optimizer path reads nothing on the
    host, as in torch's test_graph_scaling_fused_optimizers): its scale after every replay and the
    final weights, the reference the ampkit loops are held to."""
    weight, opt, scaler, static_input, one_step = _graph_setup(optimizer, torch_scaler=True)
    graph = _capture(opt, one_step)
    scales = []
    for value in INPUTS:
        static_input.fill_(value)
        graph.replay()
        scales.append(scaler._scale.item())
    return scales, weight.detach().clone()


@needs_cuda
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_graph_grad_scaling_with_step_and_update_in_the_graph(optimizer):
    eager = _graph_loop(optimizer, captured=False)
    graph = _graph_loop(optimizer, captured=True)
    torch_scales, torch_weight = _torch_graph_scales(optimizer)
    assert graph["scales"] == eager["scales"] == torch_scales
    # torch's test expects 4, 2, 2, 1 from scale 4; three clean warm-up steps grew it to 8 here.
    assert graph["scales"][:4] == [8.0, 4.0, 4.0, 2.0]
    # The same fused kernel takes the same grad_scale and found_inf: torch's weights, to rounding.
    torch.testing.assert_close(graph["weights"][-1], torch_weight, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(graph["weights"], eager["weights"]))
    assert graph["scale"] == eager["scale"]
    assert graph["state"] == eager["state"]
    assert graph["record"]["step"] == eager["record"]["step"] == 3 + len(INPUTS) - 1  # counted from 0
    assert graph["record"]["skipped_steps"] == eager["record"]["skipped_steps"] == 8
    assert graph["record"]["host_sync"] == "deferred"
