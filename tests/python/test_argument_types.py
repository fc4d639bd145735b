"""Arguments of the wrong type are refused up front, naming the argument, where they used to pass in
silence or fail later with another error: torch's numeric GradScaler arguments given as strings or as
ints no float holds, GradientClipper's strategy and threshold, and an AMPTrainer state without one of
its entries (which used to load the model and then raise KeyError, half loaded)."""

import warnings

import ampkit
import pytest
import torch
from ampkit.seeds import AMPTrainer, ClippingStrategy, DynamicLossScaler, GradientClipper, create_default_amp_config


def _one_line(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert "\n" not in message
    return message


def _makers():
    def dynamic(**kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # device "cuda": disabled without a GPU, checked all the same
            return DynamicLossScaler(**kwargs)

    return [
        lambda **kw: ampkit.GradScaler("cpu", **kw),
        lambda **kw: ampkit.GradScaler("cpu", enabled=False, **kw),
        dynamic,
    ]


@pytest.mark.parametrize("make", _makers(), ids=["enabled", "disabled", "dynamic"])
@pytest.mark.parametrize(
    "name, value, message",
    [
        ("init_scale", "1", "init_scale must be a number, got str '1'"),
        ("growth_factor", "2", "growth_factor must be a number, got str '2'"),
        ("backoff_factor", "0.5", "backoff_factor must be a number, got str '0.5'"),
        ("growth_interval", "2000", "growth_interval must be an int, got str '2000'"),
        ("growth_interval", 100.0, "growth_interval must be an int, got float 100.0"),
        ("init_scale", True, "init_scale must be a number, got bool True"),
    ],
)
def test_torch_numeric_arguments_must_be_numbers(make, name, value, message):
    with pytest.raises(TypeError) as caught:
        make(**{name: value})
    assert _one_line(caught) == f"ampkit.GradScaler: {message}"


@pytest.mark.parametrize("make", _makers(), ids=["enabled", "disabled", "dynamic"])
def test_an_int_no_float_holds_is_a_value_error_not_an_overflow(make):
    with pytest.raises(ValueError) as caught:
        make(init_scale=2**1100)
    assert _one_line(caught).startswith("ampkit.GradScaler: init_scale=")
    assert _one_line(caught).endswith(" is beyond the range of a float")
    # An int a float holds is a number like any other.
    assert ampkit.GradScaler("cpu", init_scale=1024, growth_interval=3).get_scale() == 1024.0


def test_gradient_clipper_names_a_wrong_strategy_or_threshold_type():
    with pytest.raises(TypeError) as caught:
        GradientClipper(5, 1.0)
    assert _one_line(caught) == "GradientClipper: strategy must be str, got int 5"
    with pytest.raises(TypeError) as caught:
        GradientClipper("norm", "1")
    assert _one_line(caught) == "GradientClipper: threshold must be a number or None, got str '1'"
    with pytest.raises(TypeError, match="^GradientClipper: precision must be str, got NoneType None$"):
        GradientClipper("norm", 1.0, precision=None)
    model = torch.nn.Linear(2, 1)
    model(torch.full((1, 2), 10.0)).sum().backward()  # a gradient of norm 10 * sqrt(5)
    stats = GradientClipper(ClippingStrategy.NORM, 1).clip(model)  # an enum and an int still do
    assert stats["clipped"] and abs(torch.cat([p.grad.flatten() for p in model.parameters()]).norm() - 1.0) < 1e-5


@pytest.mark.parametrize("dropped", ["model", "optimizer", "scaler"])
def test_amptrainer_state_without_an_entry_loads_nothing(dropped):
    torch.manual_seed(0)
    trainer = AMPTrainer(torch.nn.Linear(2, 2), create_default_amp_config("bf16"))
    state = trainer.state_dict()
    state["model"] = {k: torch.zeros_like(v) for k, v in state["model"].items()}
    del state[dropped]
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(ValueError) as caught:
        trainer.load_state_dict(state)
    assert _one_line(caught).startswith(f"AMPTrainer.load_state_dict: the state holds no '{dropped}' entry")
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
