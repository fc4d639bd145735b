"""torch.classes.ampkit.Fp8Recipe, the fp8_recipe plugins loaded by name for the Python fp8 layers:
'current' reproduces torchao's tensorwise scales of tests/data/fp8_current_goldens.json bit for bit,
'delayed' and 'predictive' update the caller's tensors in place, arguments that are not contiguous
CPU tensors of the right dtype and shape are refused naming the argument, save()/load() round-trip
as JSON, and a recipe that writes a scale that is not finite and > 0 is that plugin's fault."""

import json
import math
import os
from typing import Any, List

import pytest
import torch

import ampkit  # noqa: F401  (loads torch.classes.ampkit)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BUILD = os.path.abspath(os.environ.get("AMPKIT_BUILD_DIR", os.path.join(ROOT, "build")))
GOLDENS = os.path.join(ROOT, "tests", "data", "fp8_current_goldens.json")
WRONG = os.path.join(BUILD, "tests", "broken-plugins", "fp8_answers", "libampkit-fp8_recipe-wrong_fp8_scale.so")


def recipe(name: str, **options: str) -> Any:
    return torch.classes.ampkit.Fp8Recipe(name, dict(options))


def amax_of(values: List[Any]) -> float:
    return float(torch.tensor(values, dtype=torch.float32).abs().max())


def test_current_gives_torchaos_tensorwise_scales_bit_for_bit() -> None:
    r = recipe("current")
    assert (r.current_scaling(), r.current_eps(), r.history_length()) == (True, 1e-12, 0)
    assert [r.fp8_format(role) for role in range(3)] == ["e4m3", "e4m3", "e5m2"]
    with open(GOLDENS) as f:
        cases = json.load(f)["cases"]
    amaxes, roles, want = [], [], []
    for case in cases:
        layers = case["layers"]
        # The amaxes the goldens' tensors give: the first layer's input, every weight, the last
        # layer's grad_output (the others' inputs and grad_outputs are not in the file).
        known = [(0, 0, case["input"]["values"]), (len(layers) - 1, 2, case["grad_output"]["values"])]
        known += [(i, 1, layer["weight"]["values"]) for i, layer in enumerate(layers)]
        for layer, role, values in known:
            amaxes.append(amax_of(values))
            roles.append(role)
            want.append(layers[layer]["scales"][["input", "weight", "grad_output"][role]])
    scale = torch.ones(len(roles))
    history = torch.zeros(len(roles), 0)
    assert r.update(torch.tensor(roles), torch.tensor(amaxes), history, scale) == 0
    assert scale.tolist() == want  # float32 values, compared exactly
    assert len(want) == 16


def test_delayed_updates_the_callers_tensors_in_place() -> None:
    r = recipe("delayed", amax_history_len="4")
    roles = torch.tensor([0, 2])
    history = torch.zeros(2, 4)
    scale = torch.ones(2)
    seen = []
    for a in [100.0, 1.0, 1.0, 1.0, 1.0]:
        assert r.update(roles, torch.tensor([a, 7.0]), history, scale) == 0
        seen.append(scale[0].item())
    # The window of 4 holds 100 for four steps, then forgets it; 57344 / 7 for grad_output.
    assert seen == [torch.tensor(448.0 / 100.0).item()] * 4 + [448.0]
    assert scale[1].item() == 8192.0
    assert history.tolist() == [[1.0, 1.0, 1.0, 1.0], [7.0, 7.0, 7.0, 7.0]]
    bad = torch.tensor([math.inf, math.nan])
    assert r.update(roles, bad, history, scale) == 2
    assert history.tolist() == [[1.0, 1.0, 1.0, 1.0], [7.0, 7.0, 7.0, 7.0]]
    assert scale.tolist() == [448.0, 8192.0]


def test_predictive_forecasts_a_growing_amax() -> None:
    r = recipe("predictive", amax_history_len="8")
    history, scale, seen = torch.zeros(1, 8), torch.ones(1), []
    for a in [1.0, 2.0, 4.0, 8.0]:
        r.update(torch.tensor([0]), torch.tensor([a]), history, scale)
        seen.append(scale.item())
    assert seen == [448.0, 112.0, 56.0, 28.0]  # 448 / (2 * amax) once the doubling is seen


@pytest.mark.parametrize(
    "argument, tensors, words",
    [
        ("amax", dict(amax=torch.ones(2, dtype=torch.float64)), "amax must be a contiguous Float CPU tensor"),
        ("roles", dict(roles=torch.tensor([0, 1], dtype=torch.int32)), "roles must be a contiguous Long CPU"),
        ("history", dict(history=torch.zeros(4, 2).t()), "history must be a contiguous Float"),
        ("shape", dict(history=torch.zeros(2, 3)), "history the shape [2, 4] (the recipe's history length)"),
        ("role", dict(roles=torch.tensor([0, 3])), "roles[1] is 3, not 0 (input), 1 (weight) or 2"),
    ],
)
def test_arguments_are_checked_before_the_recipe_runs(argument: str, tensors: Any, words: str) -> None:
    r = recipe("delayed", amax_history_len="4")
    args = dict(roles=torch.tensor([0, 1]), amax=torch.ones(2), history=torch.zeros(2, 4), scale=torch.ones(2))
    args.update(tensors)
    with pytest.raises(ValueError, match=None) as e:
        r.update(args["roles"], args["amax"], args["history"], args["scale"])
    assert words in str(e.value), argument
    assert args["scale"].tolist() == [1.0, 1.0]


def test_options_are_checked_and_save_load_round_trips() -> None:
    with pytest.raises(ValueError, match="amax_history_len"):
        recipe("predictive", amax_history_len="1")
    with pytest.raises(RuntimeError, match="did you mean 'delayed'"):
        recipe("delayd")
    r = recipe("delayed", amax_history_len="16")
    saved = r.save()
    assert json.loads(saved) == {"history_length": {"type": "i64", "value": 16}}
    same = recipe("predictive", amax_history_len="16")
    same.load(saved)
    assert same.save() == saved
    with pytest.raises(RuntimeError, match="histories hold 16 amaxes per tensor but this recipe keeps 1024"):
        recipe("delayed").load(saved)
    with pytest.raises(ValueError, match="not a JSON object"):
        r.load("[1, 2")


@pytest.mark.parametrize("answer, shown", [("zero", "0"), ("nan", "nan"), ("negative", "-8"), ("inf", "inf")])
def test_a_scale_that_is_not_finite_and_positive_is_the_plugins_fault(answer: str, shown: str) -> None:
    if not os.path.exists(WRONG):
        pytest.skip(f"{WRONG} is not built")
    r = torch.classes.ampkit.Fp8Recipe(WRONG, {"answer": answer})
    with pytest.raises(RuntimeError) as e:
        r.update(torch.tensor([0, 0]), torch.ones(2), torch.zeros(2, 0), torch.ones(2))
    assert (
        f"fp8_recipe 'wrong_fp8_scale' 0.1.0 ({WRONG}) answered scale {shown} for tensor 1 from update(): "
        "a scale is finite and > 0" in str(e.value)
    )
    kind, _ = torch.ops.ampkit.last_error()
    assert kind == 2  # ErrorCategory::plugin
