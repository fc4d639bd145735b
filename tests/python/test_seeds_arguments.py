"""The seeds' API and the trainer integrations check their arguments as ampkit-train checks its
flags: launcher variables parsed strictly (ASCII decimal digits, nothing else), integers that are
ints (not bools or floats) in ampkit-train's ranges, and every wrong value one line naming the
argument; a disabled scaler refuses the arguments an enabled one refuses, on any machine."""

import math
import warnings

import ampkit
import ampkit.accelerate
import pytest
import torch
from accelerate import Accelerator
from ampkit.lightning import AmpkitFabricPrecision, AmpkitPrecision
from ampkit.seeds import AMPTrainer, DistributedConfig, DynamicLossScaler, GradientClipper

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29511"}


def _one_line(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("var, text", [
    ("RANK", " 1 "), ("RANK", "1_0"), ("RANK", "\u0663"), ("LOCAL_RANK", "+1"), ("MASTER_PORT", "29500.0"),
    ("WORLD_SIZE", "0x10"), ("WORLD_SIZE", ""),
])
def test_launcher_integers_are_ascii_decimal_digits_only(var, text):
    with pytest.raises(ValueError) as caught:
        DistributedConfig.from_env(dict(TORCHRUN, **{var: text}), backend="gloo")
    assert _one_line(caught) == f"DistributedConfig.from_env: {var}={text!r} is not a decimal integer"


def test_launcher_values_out_of_range_or_with_control_characters_are_refused():
    assert DistributedConfig.from_env(TORCHRUN, backend="gloo").world_size == 4
    with pytest.raises(ValueError) as caught:
        DistributedConfig.from_env(dict(TORCHRUN, WORLD_SIZE=str(10**23 - 1)), backend="gloo")
    assert _one_line(caught) == f"DistributedConfig: world_size={10**23 - 1} must be in [1, 1048576]"
    with pytest.raises(ValueError) as caught:
        DistributedConfig.from_env(dict(TORCHRUN, MASTER_ADDR="10.0.0.2\nevil"), backend="gloo")
    assert _one_line(caught) == (
        "DistributedConfig: master_addr='10.0.0.2\\nevil' must be non-empty, without spaces or control characters"
    )
    with pytest.raises(ValueError, match=r"^DistributedConfig: master_port=70000 must be in \[1, 65535\]$"):
        DistributedConfig.from_env(dict(TORCHRUN, MASTER_PORT="70000"), backend="gloo")


@pytest.mark.parametrize("fields, error, message", [
    ({"world_size": 1.5}, TypeError, "world_size must be an int, got float 1.5"),
    ({"rank": True}, TypeError, "rank must be an int, got bool True"),
    ({"master_port": 29500.5}, TypeError, "master_port must be an int, got float 29500.5"),
    ({"master_port": "29500"}, TypeError, "master_port must be an int, got str '29500'"),
    ({"timeout_s": math.inf}, ValueError, "timeout_s=inf must be in (0, 1000000000]"),
    ({"timeout_s": 0}, ValueError, "timeout_s=0 must be in (0, 1000000000]"),
    ({"timeout_s": True}, TypeError, "timeout_s must be a number, got bool True"),
    ({"backend": None}, TypeError, "backend must be str, got NoneType None"),
    ({"world_size": 2**20 + 1}, ValueError, "world_size=1048577 must be in [1, 1048576]"),
])
def test_validate_names_the_field_and_what_it_takes(fields, error, message):
    with pytest.raises(error) as caught:
        DistributedConfig(**dict({"backend": "gloo"}, **fields)).validate()
    assert _one_line(caught) == f"DistributedConfig: {message}"
    assert DistributedConfig(backend="gloo", timeout_s=60).validate().timeout_s == 60


def test_a_disabled_scaler_refuses_what_an_enabled_one_refuses_on_any_machine():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available. Disabling." where it is not
        with pytest.raises(ValueError, match="init_scale") as on_cuda:
            DynamicLossScaler(init_scale=-1)  # device "cuda": disabled without a GPU
    with pytest.raises(ValueError, match="init_scale") as off:
        ampkit.GradScaler("cpu", init_scale=-1, enabled=False)
    with pytest.raises(ValueError, match="init_scale") as enabled:
        ampkit.GradScaler("cpu", init_scale=-1)
    assert str(on_cuda.value) == str(off.value) == str(enabled.value)


def test_integrations_name_a_wrong_argument():
    with pytest.raises(ValueError) as caught:
        AmpkitPrecision("gpu")
    assert _one_line(caught) == (
        "ampkit.lightning.AmpkitPrecision: device 'gpu' is not a torch device (\"cuda\", \"cpu\", \"cuda:1\", ...)"
    )
    with pytest.raises(ValueError, match="^ampkit.lightning.AmpkitFabricPrecision: device 'gpu' is not"):
        AmpkitFabricPrecision("gpu")
    with pytest.raises(TypeError) as caught:
        AmpkitPrecision("cpu", opt="clipper.max_norm=1")
    assert _one_line(caught) == (
        "ampkit.lightning.AmpkitPrecision: opt must be Mapping or None, got str 'clipper.max_norm=1'"
    )
    with pytest.raises(TypeError, match="^ampkit.GradScaler: device must be str or device, got int 5$"):
        ampkit.GradScaler(5)
    with pytest.raises(ValueError, match="^ampkit.GradScaler: device 'gpu' is not a torch device"):
        ampkit.GradScaler("gpu")
    with pytest.raises(TypeError) as caught:
        ampkit.accelerate.prepare_scaler(None)
    assert _one_line(caught) == (
        "ampkit.accelerate.prepare_scaler: accelerator must be an accelerate.Accelerator, got NoneType None"
    )
    with pytest.raises(TypeError, match="^ampkit.accelerate.prepare_scaler: opt must be Mapping or None, got str"):
        ampkit.accelerate.prepare_scaler(Accelerator(mixed_precision="fp16", cpu=True), opt="x")


def test_the_seeds_classes_name_a_wrong_argument():
    with pytest.raises(TypeError) as caught:
        AMPTrainer(5)
    assert _one_line(caught) == "AMPTrainer: model must be Module, got int 5"
    with pytest.raises(TypeError, match="^AMPTrainer: loss_fn must be callable or None, got str 'mse'$"):
        AMPTrainer(torch.nn.Linear(2, 2), loss_fn="mse")
    clipper = GradientClipper("norm", 1.0)
    with pytest.raises(TypeError) as caught:
        clipper.clip(None)
    assert _one_line(caught) == (
        "GradientClipper.clip: parameters must be a Module, a tensor or tensors, got NoneType None"
    )
    with pytest.raises(TypeError, match="^GradientClipper.clip: parameters must be .* got an iterable holding int 3$"):
        clipper.clip([3])


def test_load_state_dict_of_a_non_dict_is_a_type_error_as_torchs():
    with pytest.raises(TypeError):
        torch.amp.GradScaler("cpu").load_state_dict("notadict")
    with pytest.raises(TypeError) as caught:
        ampkit.GradScaler("cpu").load_state_dict("notadict")
    assert _one_line(caught) == "load_state_dict: state_dict must be a dict, got str"
    trainer = AMPTrainer(torch.nn.Linear(2, 2), ampkit.seeds.create_default_amp_config("bf16"))
    with pytest.raises(TypeError, match="^AMPTrainer.load_state_dict: expected a dict, got str$"):
        trainer.load_state_dict("notadict")
