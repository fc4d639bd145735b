"""ampkit.GradScaler.from_deepspeed_config against DeepSpeed's own DynamicLossScaler, step for step.

tests/data/deepspeed_scaler_goldens.json holds the scale after every step of DeepSpeed 0.17.0's
and 0.17.1's update_scale over fixed overflow patterns (tools/golden/deepspeed_scaler_goldens.py
ran the releases' own loss_scaler.py). Here each golden scaler is written as a DeepSpeed config,
mapped by each version's rules, and the resulting `dynamic` scaler is stepped over the same
pattern (an overflow is a NaN written into a gradient after backward): every scale must be equal,
and the run must stop (TrainingAborted) at the step where DeepSpeed raises at the minimum scale.
"""

import json
import math
import os
import warnings

import ampkit
import pytest
import torch

GOLDENS = os.path.join(os.path.dirname(__file__), "..", "data", "deepspeed_scaler_goldens.json")
with open(GOLDENS) as _f:
    CASES = json.load(_f)["cases"]


def deepspeed_config(scaler, version):
    """The DeepSpeed config whose fp16 section builds DynamicLossScaler(**scaler)."""
    fp16 = {
        "enabled": True,
        "initial_scale_power": int(math.log2(scaler["init_scale"])),
        "loss_scale_window": scaler["scale_window"],
        "hysteresis": scaler["delayed_shift"],
        "min_loss_scale": scaler["min_scale"],
        "consecutive_hysteresis": scaler["consecutive_hysteresis"],
    }
    if version == "0.17.0":  # 0.17.1's config refuses the key: its scaler raises at the minimum
        fp16["raise_error_at_min_scale"] = scaler["raise_error_at_min_scale"]
    return {"fp16": fp16}


def scales_of(scaler, overflows):
    """ampkit's scale after each step, and the step that aborted (None: none did)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scales = []
    for step, mark in enumerate(overflows):
        opt.zero_grad(set_to_none=True)
        scaler.scale(model(torch.ones(1, 2)).sum()).backward()
        if mark == "x":
            model.weight.grad[0, 0] = math.nan
        try:
            scaler.step(opt)
            scaler.update()
        except ampkit.TrainingAborted as e:  # the scaler's text names it: once, not twice
            text = str(e)
            assert text.startswith(f"training aborted at step {step}: ") and text.count("scaler 'dynamic'") == 1, e
            return scales, step
        scales.append(scaler.get_scale())
    return scales, None


@pytest.mark.parametrize("version", ["0.17.0", "0.17.1"])
def test_the_mapped_scaler_follows_deepspeeds_own_update_step_for_step(version):
    assert len(CASES) == 88
    aborted = 0
    for case in CASES:
        config = deepspeed_config(case["scaler"], version)
        # 0.17.1's config cannot ask for a clamp at the minimum: ampkit's option says it instead.
        clamp = {} if case["scaler"]["raise_error_at_min_scale"] else {"scaler.on_min_scale": "clamp"}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every key maps
            scaler = ampkit.GradScaler.from_deepspeed_config(
                config, "cpu", deepspeed_version=version, nan_policy="skip", opt=clamp
            )
        want = case[version]
        got_scales, got_abort = scales_of(scaler, case["overflows"])
        assert (got_scales, got_abort) == (want["scales"], want["raises_at"]), case["name"]
        aborted += got_abort is not None
    assert aborted >= 4  # the goldens reach DeepSpeed's raise at the minimum scale, in both versions


def test_the_versions_differ_where_deepspeed_0_17_1_waits_one_clean_step_more():
    clean = next(c for c in CASES if c["name"] == "window3_hysteresis1/clean")
    assert clean["0.17.0"]["scales"][:4] == [1024.0, 1024.0, 2048.0, 2048.0]
    assert clean["0.17.1"]["scales"][:4] == [1024.0, 1024.0, 1024.0, 2048.0]
    latest = ampkit.GradScaler.from_deepspeed_config(deepspeed_config(clean["scaler"], "0.17.1"), "cpu")
    assert scales_of(latest, clean["overflows"])[0] == clean["0.17.1"]["scales"]


def test_a_version_ampkit_does_not_map_is_one_value_error():
    with pytest.raises(
        ValueError, match=r"^DeepSpeed version '0\.16' is not one ampkit maps: give 0\.17\.0, 0\.17\.1 or latest$"
    ):
        ampkit.GradScaler.from_deepspeed_config({"fp16": {"enabled": True}}, "cpu", deepspeed_version="0.16")
    with pytest.raises(ValueError, match="names ampkit_deepspeed_version 0.17.0, but DeepSpeed 0.17.1's rules"):
        ampkit.GradScaler.from_deepspeed_config(
            {"ampkit_deepspeed_version": "0.17.0", "fp16": {"enabled": True}}, "cpu", deepspeed_version="latest"
        )
