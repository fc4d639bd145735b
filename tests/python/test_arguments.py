"""Python arguments checked like command-line values (issue 44): one TypeError or ValueError naming
the argument, never a TorchScript signature dump or a bare AttributeError, and the number grammar
of ampkit-train's --opt (decimal only: no hex, no trailing NUL)."""

import pytest

import ampkit


@pytest.mark.parametrize("kwargs, name", [
    ({"precision": 5}, "precision"),
    ({"opt": "clipper.max_norm=1"}, "opt"),
    ({"opt": ["clipper.max_norm", 1]}, "opt"),
    ({"model": 5}, "model"),
    ({"scaler": 5}, "scaler"),
    ({"sync": None}, "sync"),
])
def test_a_value_of_the_wrong_type_is_one_type_error_naming_the_argument(kwargs, name):
    with pytest.raises(TypeError) as caught:
        ampkit.GradScaler("cpu", **kwargs)
    message = str(caught.value)
    assert message.startswith(f"ampkit.GradScaler: {name} must be ")
    assert "\n" not in message


@pytest.mark.parametrize("text", ["0x10", "5\0", "0X1p4"])
def test_option_numbers_are_decimal_as_on_the_command_line(text):
    with pytest.raises(ValueError, match="option 'max_norm' of clipper 'norm' must be a finite decimal number"):
        ampkit.GradScaler("cpu", clipper="norm", opt={"clipper.max_norm": text})
    assert ampkit.GradScaler("cpu", clipper="norm", opt={"clipper.max_norm": "1.5e1"}).plugin_options(
        "clipper")[0][1] == "15"


def test_an_empty_plugin_name_is_refused_not_taken_as_the_default():
    with pytest.raises(ValueError, match="scaler='' names no plugin"):
        ampkit.GradScaler("cpu", scaler="")


def test_a_bad_sync_mode_is_named():
    with pytest.raises(ValueError, match="sync must be one of auto, step, deferred, got 'later'"):
        ampkit.GradScaler("cpu", sync="later")
