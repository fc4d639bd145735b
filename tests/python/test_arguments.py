"""Python arguments checked like command-line values: one TypeError or ValueError naming
the argument, never a TorchScript signature dump or a bare AttributeError, and the number grammar
of ampkit-train's --opt (decimal only: no hex, no trailing NUL)."""

import pathlib

import pytest
import torch

import ampkit


@pytest.mark.parametrize("kwargs, name", [
    ({"precision": 5}, "precision"),
    ({"opt": "clipper.max_norm=1"}, "opt"),
    ({"opt": ["clipper.max_norm", 1]}, "opt"),
    ({"model": 5}, "model"),
    ({"scaler": 5}, "scaler"),
    ({"sync": None}, "sync"),
    ({"process_group": "0"}, "process_group"),
    ({"average_loss": 1}, "average_loss"),
])
def test_a_value_of_the_wrong_type_is_one_type_error_naming_the_argument(kwargs, name):
    with pytest.raises(TypeError) as caught:
        ampkit.GradScaler("cpu", **kwargs)
    message = str(caught.value)
    assert message.startswith(f"ampkit.GradScaler: {name} must be ")
    assert "\n" not in message


def test_the_process_group_and_average_loss_messages_name_what_they_take():
    with pytest.raises(TypeError, match=r"^ampkit.GradScaler: process_group must be ProcessGroup or None, got int 5$"):
        ampkit.GradScaler("cpu", process_group=5)
    with pytest.raises(TypeError, match=r"^ampkit.GradScaler: average_loss must be bool, got str 'yes'$"):
        ampkit.GradScaler("cpu", average_loss="yes")


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


def test_option_errors_name_the_grad_scaler_not_a_command_line():
    with pytest.raises(ValueError) as caught:
        ampkit.GradScaler("cpu", opt={"scaler.growth_intervall": 3})
    assert "(from ampkit.GradScaler)" in str(caught.value) and "command line" not in str(caught.value)
    scaler = ampkit.GradScaler("cpu")
    with pytest.raises(ValueError) as caught:
        scaler.load_state_dict(dict(scaler.state_dict(), growth_factor=0.5))
    assert "(from ampkit.GradScaler)" in str(caught.value) and "command line" not in str(caught.value)
    assert ("growth_factor", "2", "default") in scaler.plugin_options("scaler")  # the bad load changed nothing


@pytest.mark.parametrize("saved", ["str", {"scaler": "x"}, {"scaler": {"plugin": "dynamic", "state": 5}}])
def test_a_malformed_ampkit_entry_is_one_value_error_and_loads_nothing(saved):
    scaler = ampkit.GradScaler("cpu", init_scale=8.0)
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=r"state_dict\['ampkit'\]"):
        scaler.load_state_dict(dict(before, scale=1024.0, ampkit=saved))
    assert scaler.state_dict() == before


def test_a_state_dict_window_beyond_the_options_is_refused_and_loads_nothing():
    # A NaN policy's spike windows hold at most spike_window values (a 1,000,000-entry
    # window was once loaded as is); the whole load_state_dict is refused and nothing changes.
    scaler = ampkit.GradScaler("cpu", nan_policy="skip", opt={"nan_policy.spike_window": 16})
    before = scaler.state_dict()
    saved = before["ampkit"]
    bad = dict(saved, nan_policy=dict(saved["nan_policy"], state=dict(saved["nan_policy"]["state"],
                                                                        loss_window=[1.0] * 1_000_000)))
    said = r"'skip'.* failed in load\(\): checkpoint loss_window holds 1000000 values, more than this run's"
    with pytest.raises(ampkit.PluginError, match=said + r" nan_policy.spike_window=16$"):
        scaler.load_state_dict(dict(before, scale=1024.0, ampkit=bad))
    assert scaler.state_dict() == before


@pytest.mark.parametrize("change, bad", [
    ({"growth_factor": 4.0}, {"ampkit": "str"}),
    ({"backoff_factor": 0.25}, {"scale": float("nan")}),
    ({"growth_interval": 77}, {"scale": "abc"}),
])
def test_a_refused_load_leaves_the_options_it_had_already_set(change, bad):
    # torch's keys are applied before the plugins' states: a load refused after them must still
    # load nothing (on 602f2ee a growth_factor of 4.0 stayed after a refused load).
    scaler = ampkit.GradScaler("cpu", init_scale=8.0)
    before = scaler.state_dict()
    with pytest.raises((ValueError, TypeError, ampkit.PluginError)):  # a str scale: TypeError, up front
        scaler.load_state_dict(dict(before, **change, **bad))
    assert scaler.state_dict() == before
    defaults = {"growth_factor": "2", "backoff_factor": "0.5", "growth_interval": "2000"}
    assert {r[0]: r[1] for r in scaler.plugin_options("scaler") if r[0] in change} == {
        name: defaults[name] for name in change}


def test_a_refused_load_keeps_the_growth_tracker():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampkit.GradScaler("cpu", growth_interval=100)
    for _ in range(5):
        optimizer.zero_grad()
        scaler.scale(model(torch.ones(2, 4)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    before = scaler.state_dict()
    assert before["_growth_tracker"] == 5
    with pytest.raises(TypeError):  # refused before anything is set
        scaler.load_state_dict(dict(before, growth_interval=1000, scale="abc"))
    assert scaler.state_dict() == before
    assert scaler.get_growth_interval() == 100


@pytest.mark.parametrize("kwargs, says", [
    ({"allow_untrusted_plugins": "False"}, "allow_untrusted_plugins must be bool, got str 'False'"),
    ({"plugin_dirs": "/usr/lib"}, "plugin_dirs must be a list of folders (str or PathLike), got str '/usr/lib'"),
    ({"plugin_dirs": pathlib.Path("/usr/lib")},
     "plugin_dirs must be a list of folders (str or PathLike), got PosixPath"),
    ({"plugin_dirs": 5}, "plugin_dirs must be a list of folders (str or PathLike), got int 5"),
    ({"plugin_dirs": [5]}, "plugin_dirs must hold str or PathLike, got int 5"),
])
def test_plugin_dirs_and_allow_untrusted_plugins_are_type_checked(kwargs, says):
    # On 602f2ee allow_untrusted_plugins="False" loaded untrusted plugins (any truthy value did), a
    # str plugin_dirs was read letter by letter ("plugin_dirs: u is not a folder") and a Path or an
    # int gave a bare "object is not iterable".
    with pytest.raises(TypeError) as caught:
        ampkit.GradScaler("cpu", **kwargs)
    assert str(caught.value).startswith(f"ampkit.GradScaler: {says}")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("kwargs, name", [
    ({"scaler": "\udcff"}, "scaler"),
    ({"precision": "\udcff"}, "precision"),
    ({"stats_recipe": "\udcff"}, "stats_recipe"),
    ({"opt": {"\udcff": 1}}, "opt key"),
    ({"opt": {"clipper.max_norm": "\udcff"}}, "opt['clipper.max_norm']"),
    ({"plugin_dirs": ["\udcff"]}, "plugin_dirs entry"),
    ({"scaler": "dynamic\0"}, "scaler"),
    ({"clipper": pathlib.Path("norm\0")}, "clipper"),
])
def test_text_the_cpp_side_cannot_take_is_one_value_error_naming_the_argument(kwargs, name):
    # A lone surrogate gave a multi-line TorchScript signature dump ("\udcff"); a NUL cut
    # the message short ("unknown scaler 'dynamic").
    with pytest.raises(ValueError) as caught:
        ampkit.GradScaler("cpu", **kwargs)
    message = str(caught.value)
    assert message.startswith(f"ampkit.GradScaler: {name}") and "\n" not in message, message


def test_an_empty_precision_is_refused_not_taken_as_fp16():
    with pytest.raises(ValueError, match="precision '' is not one of"):
        ampkit.GradScaler("cpu", precision="")


def test_a_numpy_float64_is_a_float():
    np = pytest.importorskip("numpy")
    scaler = ampkit.GradScaler("cpu", init_scale=np.float64(1024.0), opt={"scaler.growth_factor": np.float64(4.0)})
    assert scaler.get_scale() == 1024.0 and scaler.get_growth_factor() == 4.0


def test_a_state_integer_beyond_64_bits_is_one_value_error():
    scaler = ampkit.GradScaler("cpu")
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=r"^scaler state 'growth_tracker' holds 10{30}, beyond a 64-bit integer$"):
        scaler.load_state_dict(dict(before, _growth_tracker=10**30))
    assert scaler.state_dict() == before


@pytest.mark.parametrize("sync", ["step", "deferred"])
@pytest.mark.parametrize("value, says", [
    (0.5, "new_scale 0.5 refused: scaler 'dynamic'"),  # below the scaler's min_scale
    (1e39, "new_scale 1e+39 refused: scaler 'dynamic'"),  # beyond float32
    (float("nan"), "new_scale must be a finite number > 0, got nan"),
    (torch.tensor(float("inf")), "new_scale must be a finite number > 0, got inf"),
])
def test_a_new_scale_the_scaler_refuses_is_one_value_error_naming_new_scale_in_both_modes(sync, value, says):
    # Before: PluginError "failed in load()" (and a ValueError for nan in one mode only).
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = ampkit.GradScaler("cpu", sync=sync)
    scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    scaler.step(opt)
    with pytest.raises(ValueError) as caught:
        scaler.update(value)
    assert type(caught.value) is ValueError and f"ampkit.GradScaler: {says}" in str(caught.value)
    assert scaler.get_scale() == 65536.0  # nothing set


@pytest.mark.parametrize("call, error, says", [
    (lambda s: s.load_state_dict(dict(s.state_dict(), growth_factor=None)), TypeError,
     "state_dict['growth_factor'] must be a number, got NoneType None"),
    (lambda s: s.load_state_dict(dict(s.state_dict(), scale=torch.ones(2))), TypeError,
     "state_dict['scale'] must be a number, got Tensor"),
    (lambda s: s.plugin_options(5), TypeError, "plugin_options: kind must be a str (scaler, clipper, nan_policy)"),
    (lambda s: s.set_plugin_option("clipper.max_norm", [1.0]), ValueError,
     "option clipper.max_norm: value [1.0] (list) must be a bool, int, float or str"),
    (lambda s: ampkit.GradScaler("cpu", opt={"clipper.max_norm": {"a": 1}}), ValueError,
     "option opt['clipper.max_norm']: value {'a': 1} (dict) must be"),
    (lambda s: ampkit.plugins(plugin_dirs="/usr/lib"), TypeError, "ampkit.plugins: plugin_dirs must be a list of folders (str or PathLike), got str"),
])
def test_more_bad_arguments_are_one_exception_naming_them(call, error, says):
    scaler = ampkit.GradScaler("cpu")
    growth = scaler.get_growth_factor()
    with pytest.raises(error) as caught:
        call(scaler)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert scaler.get_growth_factor() == growth  # a refused load loads nothing
