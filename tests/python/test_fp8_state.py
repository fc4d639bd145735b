"""ampkit.fp8's state for recipes with history (docs/fp8.md, "How the state is kept"): one block of
stacked rows per converted model, one recipe call per step for all layers, fp8_state(), the
state_dict and an exact resume, and ATen operator counts flat in the number of layers.

Each runs with the `delayed` and `predictive` plugins and with a stand-in object that has the
binding's methods and a rule of its own (not `delayed`'s, which lives only in its plugin), whose
calls the tests can count and whose numbers they can predict."""

import copy
import io
import pickle
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampkit


class StandIn:
    """update(): each row's history shifts by one and takes the step's amax in front; scale =
    100 / (1 + mean(history)). Counts its calls and the amaxes that were not finite."""

    def __init__(self, window=4):
        self.window = window
        self.calls = []

    def current_scaling(self):
        return False

    def history_length(self):
        return self.window

    def fp8_format(self, role):
        return "e5m2" if role == 2 else "e4m3"

    def update(self, roles, amax, history, scale):
        self.calls.append((roles.tolist(), tuple(amax.shape), tuple(history.shape), tuple(scale.shape)))
        finite = torch.isfinite(amax)
        history.copy_(torch.cat([torch.where(finite, amax, 0.0).unsqueeze(1), history[:, :-1]], dim=1))
        scale.copy_(100.0 / (1.0 + history.mean(dim=1)))
        return int((~finite).sum())


KINDS = ["stand_in", "delayed", "predictive"]


def convert(model, kind, window=4):
    """``model`` converted with the stand-in or with a recipe plugin by name, ``window`` amaxes kept."""
    if kind == "stand_in":
        return ampkit.fp8.convert(model, recipe=StandIn(window=window))
    return ampkit.fp8.convert(model, recipe=kind, opt={"amax_history_len": window})


def mlp(layers=3, width=8, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(layers)])


def data(step, width=8):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, width, generator=g) * 3.0, torch.randn(16, width, generator=g)


def train(model, opt, steps, first=0):
    for step in range(first, first + steps):
        x, y = data(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def fp8_layers(model):
    return [m for m in model.modules() if isinstance(m, ampkit.fp8.Linear)]


def test_all_layers_are_updated_by_one_recipe_call_per_step():
    recipe = StandIn(window=4)
    model = ampkit.fp8.convert(mlp(layers=5), recipe=recipe)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train(model, opt, 4)
    assert len(recipe.calls) == 3  # due after each backward, applied by the next step's first forward
    assert ampkit.fp8.update(model) == 0 and len(recipe.calls) == 4
    assert ampkit.fp8.update(model) == 0 and len(recipe.calls) == 4  # nothing due: no call
    roles, amax_shape, history_shape, scale_shape = recipe.calls[0]
    assert roles == [0, 1, 2] * 5 and amax_shape == (15,) and history_shape == (15, 4) and scale_shape == (15,)


def test_fp8_state_shows_the_scale_the_next_forward_casts_with():
    from ampkit._fp8_cast import cast

    model = ampkit.fp8.convert(mlp(layers=1), recipe=StandIn(window=3))
    layer = fp8_layers(model)[0]
    assert layer.fp8_state()["input"] == {"scale": 1.0, "amax_history": [0.0, 0.0, 0.0]}  # a new layer
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train(model, opt, 2)
    x, _ = data(1)
    state = layer.fp8_state()
    # The last step's input amax in front, the one before it behind.
    assert state["input"]["amax_history"][:2] == [x.abs().max().item(), data(0)[0].abs().max().item()]
    assert state["input"]["scale"] == pytest.approx(100.0 / (1.0 + sum(state["input"]["amax_history"]) / 3), rel=1e-6)
    assert state["grad_output"]["amax_history"][0] > 0.0 and state["weight"]["amax_history"][1] > 0.0
    s_x, s_w = torch.tensor(state["input"]["scale"]), torch.tensor(state["weight"]["scale"])
    x8, w8 = cast(x, s_x, torch.float8_e4m3fn), cast(layer.weight.detach(), s_w, torch.float8_e4m3fn)
    want = (x8.float() / s_x) @ (w8.float() / s_w).t() + layer.bias.detach()
    with torch.no_grad():  # records nothing: fp8_state() stays as it was
        assert (layer(x) - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    assert layer.fp8_state() == state


@pytest.mark.parametrize("kind", KINDS)
def test_the_state_is_in_state_dict_and_a_loaded_model_continues_bit_for_bit(kind):
    def fresh():
        model = convert(mlp(layers=3), kind)
        return model, torch.optim.SGD(model.parameters(), lr=0.05)

    straight, straight_opt = fresh()
    train(straight, straight_opt, 6)

    first, first_opt = fresh()
    train(first, first_opt, 3)
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)
    states = [layer.fp8_state() for layer in fp8_layers(first)]
    assert {"0.0.fp8_scale", "0.0.fp8_amax_history"} <= set(first.state_dict())
    assert "0.0.fp8_amax" not in first.state_dict()  # this step's amaxes: applied before saving

    resumed, resumed_opt = fresh()
    saved.seek(0)
    resumed.load_state_dict(torch.load(saved))
    assert [layer.fp8_state() for layer in fp8_layers(resumed)] == states
    assert states[0]["input"]["scale"] != 1.0
    train(resumed, resumed_opt, 3, first=3)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert [lay.fp8_state() for lay in fp8_layers(resumed)] == [lay.fp8_state() for lay in fp8_layers(straight)]


@pytest.mark.parametrize("kind", KINDS)
def test_buffers_replaced_by_a_copy_or_an_assigning_load_are_gathered_again(kind):
    model = convert(mlp(layers=2), kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train(model, opt, 2)
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.05)
    pickled = pickle.loads(pickle.dumps(model))  # torch.save(model): a recipe plugin is made again
    pickled_opt = torch.optim.SGD(pickled.parameters(), lr=0.05)
    assigned = convert(mlp(layers=2, seed=9), kind)
    assigned.load_state_dict(copy.deepcopy(model.state_dict()), assign=True)
    assigned_opt = torch.optim.SGD(assigned.parameters(), lr=0.05)
    for m, o in ((model, opt), (twin, twin_opt), (pickled, pickled_opt), (assigned, assigned_opt)):
        train(m, o, 2, first=2)
        ampkit.fp8.update(m)
    want = [lay.fp8_state() for lay in fp8_layers(model)]
    assert [lay.fp8_state() for lay in fp8_layers(twin)] == want
    assert [lay.fp8_state() for lay in fp8_layers(pickled)] == want
    assert [lay.fp8_state() for lay in fp8_layers(assigned)] == want
    for layer in fp8_layers(assigned):  # the layer's buffers are rows of the block again
        block = layer._fp8_block
        assert layer.fp8_scale.data_ptr() == block.scale[3 * layer._fp8_index :].data_ptr()


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_finite_amax_is_counted_and_moves_no_window(kind):
    model = convert(mlp(layers=2), kind)
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), 2)
    ampkit.fp8.update(model)
    before = [layer.fp8_state() for layer in fp8_layers(model)]
    x, y = data(5)
    x[0, 0] = float("inf")
    torch.nn.functional.mse_loss(model(x), y).backward()
    assert ampkit._fp8_block.nonfinite_amaxes(model) == 1  # visible before the update is applied
    first, second = fp8_layers(model)
    # The inf was clamped to 448 in the cast, yet the first layer's weight gradient is NaN (as the
    # high-precision matmul's would be), the second's finite.
    assert torch.isnan(first.weight.grad).all() and torch.isfinite(second.weight.grad).all()
    assert ampkit.fp8.update(model) == 1  # the first layer's input amax
    assert ampkit._fp8_block.nonfinite_amaxes(model) == 1
    # A bad step updates no row: every window and scale as before it.
    assert [layer.fp8_state() for layer in fp8_layers(model)] == before


def test_delayed_casts_the_first_step_with_1_then_with_fp8_max_over_the_windows_amax():
    from ampkit._fp8_cast import cast

    model = convert(mlp(layers=1), "delayed", window=2)
    layer = fp8_layers(model)[0]
    x, y = data(0)
    out = model(x)
    w = layer.weight.detach()
    one = torch.tensor(1.0)
    first = (cast(x, one, torch.float8_e4m3fn).float() @ cast(w, one, torch.float8_e4m3fn).float().t()) + layer.bias
    assert torch.equal(model[0][0](x).detach(), first.detach())  # a forward without backward: scale 1.0
    torch.nn.functional.mse_loss(out, y).backward()
    amaxes = [x.abs().max().item()]
    state = layer.fp8_state()
    f32 = torch.float32
    assert state["input"]["scale"] == (torch.tensor(448.0, dtype=f32) / torch.tensor(amaxes[0], dtype=f32)).item()
    assert state["input"]["amax_history"][0] == amaxes[0]
    g = state["grad_output"]
    assert g["scale"] == (torch.tensor(57344.0, dtype=f32) / torch.tensor(g["amax_history"][0], dtype=f32)).item()
    for step in (1, 2):  # the window of 2 drops the oldest amax
        x, y = data(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        amaxes.append(x.abs().max().item())
    window = max(amaxes[-2:])
    assert layer.fp8_state()["input"]["scale"] == (torch.tensor(448.0) / torch.tensor(window)).item()


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def step_counts(layers, kind):
    linears = nn.Sequential(*[nn.Linear(8, 8) for _ in range(layers)])
    model = ampkit.fp8.convert(linears, recipe="current") if kind == "current" else convert(linears, kind)
    x = torch.randn(4, 8)
    for _ in range(2):  # warm: the second step is a steady one
        model(x).sum().backward()
        ampkit.fp8.update(model)
    with OpCounter() as step:
        model(x).sum().backward()
    with OpCounter() as update:
        ampkit.fp8.update(model)
    return sum(step.ops.values()), sum(update.ops.values())


@pytest.mark.parametrize("kind", ["current"] + KINDS)
def test_operator_counts_per_step_are_flat_in_the_layer_count(kind):
    (s2, u2), (s3, u3), (s64, u64) = (step_counts(n, kind) for n in (2, 3, 64))
    per_layer = s3 - s2
    assert per_layer > 0 and s64 - s2 == 62 * per_layer, (s2, s3, s64)
    assert u2 == u3 == u64  # the update: the same operators for 2 layers as for 64
    if kind == "current":
        assert u64 == 0
    else:
        assert u64 > 0


class Checkpointed(nn.Module):
    """Two fp8 layers, the first recomputed in the backward when ``recompute`` (activation checkpointing)."""

    def __init__(self, recompute):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.recompute = nn.Linear(8, 8), nn.Linear(8, 8), recompute

    def forward(self, x):
        def first(t):
            return torch.tanh(self.a(t))

        h = torch.utils.checkpoint.checkpoint(first, x, use_reentrant=False) if self.recompute else first(x)
        return self.b(h)


@pytest.mark.parametrize("kind", KINDS)
def test_activation_checkpointing_changes_nothing(kind):
    # The recomputing forward runs inside the backward: the update is not applied there, halfway.
    runs = []
    for recompute in (False, True):
        model = convert(Checkpointed(recompute), kind)
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
        runs.append(([p.detach().clone() for p in model.parameters()], [lay.fp8_state() for lay in fp8_layers(model)]))
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0]))
    assert runs[0][1] == runs[1][1] and runs[0][1][0]["grad_output"]["amax_history"][2] > 0.0
