"""ampkit.GradScaler's own behaviour: errors, state, the step record, LRScheduler, plugins()."""

import io
import math
import pickle

import pytest
import torch

import ampkit


def tiny():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def one_step(model, opt, scaler, poison=False, bad_loss=False):
    opt.zero_grad(set_to_none=True)
    loss = model(torch.ones(3, 4)).square().mean() * (math.nan if bad_loss else 1.0)
    scaler.scale(loss).backward()
    if poison:
        model.weight.grad[0, 0] = math.nan
    taken = scaler.step(opt)
    scaler.update()
    return taken


def test_unknown_plugin_raises_plugin_error_naming_it():
    with pytest.raises(ampkit.PluginError, match="dynamik"):
        ampkit.GradScaler("cpu", scaler="dynamik")


def test_unknown_option_raises_value_error_with_did_you_mean():
    with pytest.raises(ValueError, match=r"max_nrom.*did you mean 'max_norm'"):
        ampkit.GradScaler("cpu", clipper="norm", opt={"clipper.max_nrom": 1.0})


def test_out_of_range_value_raises_value_error_naming_it():
    with pytest.raises(ValueError, match=r"growth_factor.*0\.5"):
        ampkit.GradScaler("cpu", growth_factor=0.5)


def test_unknown_kind_and_comm_are_refused():
    with pytest.raises(ValueError, match="unknown plugin kind 'clip'"):
        ampkit.GradScaler("cpu", opt={"clip.max_norm": 1.0})
    with pytest.raises(ValueError, match="torch DDP"):
        ampkit.GradScaler("cpu", opt={"comm.timeout": 1})
    with pytest.raises(ValueError, match=r"an fp8 recipe is chosen by ampkit\.fp8\.convert"):
        ampkit.GradScaler("cpu", opt={"fp8_recipe.margin": 1})


def test_a_missing_plugin_folder_is_named_by_the_argument():
    with pytest.raises(ValueError, match="plugin_dirs: /nonexistent is not a folder"):
        ampkit.GradScaler("cpu", plugin_dirs=["/nonexistent"])
    with pytest.raises(ValueError, match="plugin_dirs: /nonexistent is not a folder"):
        ampkit.plugins(["/nonexistent"])


def test_rollback_policy_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="snapshot"):
        ampkit.GradScaler("cpu", nan_policy="rollback")


def test_step_returns_whether_it_stepped_and_the_record_says_why():
    model, opt = tiny()
    scaler = ampkit.GradScaler("cpu", init_scale=1024.0, clipper="norm", opt={"clipper.max_norm": 1e-3})
    before = model.weight.detach().clone()
    assert one_step(model, opt, scaler, poison=True) is False
    assert torch.equal(model.weight, before)
    assert scaler.last_step["action"] == "skip" and scaler.last_step["found_inf"] is True
    assert scaler.get_scale() == 512.0
    assert one_step(model, opt, scaler) is True
    rec = scaler.last_step
    assert rec["action"] == "proceed" and rec["clipped"] is True
    assert rec["grad_norm_clipped"] == pytest.approx(1e-3, rel=1e-3)
    assert rec["clip_coef"] == pytest.approx(1e-3 / (rec["grad_norm"] + 1e-6), rel=1e-9)  # clip_grad_norm_'s
    assert sorted(t["name"] for t in rec["top_layers"]) == ["param_groups[0][0]", "param_groups[0][1]"]


def test_model_names_the_layers_in_the_record():
    model, opt = tiny()
    scaler = ampkit.GradScaler("cpu", model=model)
    one_step(model, opt, scaler)
    assert sorted(t["name"] for t in scaler.last_step["top_layers"]) == ["bias", "weight"]


def test_abort_policy_raises_training_aborted():
    model, opt = tiny()
    scaler = ampkit.GradScaler("cpu", nan_policy="abort")
    # An overflowing gradient is routine with a dynamic scaler (tolerate_overflow): a skip.
    assert one_step(model, opt, scaler, poison=True) is False
    with pytest.raises(ampkit.TrainingAborted, match="loss"):
        one_step(model, opt, scaler, bad_loss=True)


def test_state_dict_round_trips_through_torch_save_weights_only():
    model, opt = tiny()
    scaler = ampkit.GradScaler("cpu", init_scale=256.0, growth_interval=3)
    for i in range(5):
        one_step(model, opt, scaler, poison=(i == 1))
    sd = scaler.state_dict()
    # 256, backed off to 128 at step 1, grown back after 3 clean steps (2, 3, 4): tracker 0.
    assert (sd["scale"], sd["_growth_tracker"]) == (256.0, 0)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    other = ampkit.GradScaler("cpu", growth_interval=3)
    other.load_state_dict(loaded)
    assert other.state_dict() == sd
    # Both continue the same scale sequence.
    m2, o2 = tiny()
    for _ in range(6):
        one_step(model, opt, scaler)
        one_step(m2, o2, other)
        assert other.get_scale() == scaler.get_scale()


def test_loads_torch_gradscaler_state_dict():
    ts = torch.amp.GradScaler("cpu", init_scale=4096.0, growth_interval=7)
    model, opt = tiny()
    for i in range(4):
        opt.zero_grad()
        ts.scale(model(torch.ones(3, 4)).sum()).backward()
        ts.step(opt)
        ts.update()
    scaler = ampkit.GradScaler("cpu", growth_interval=7)
    scaler.load_state_dict(ts.state_dict())
    assert scaler.get_scale() == ts.get_scale()
    assert scaler.state_dict()["_growth_tracker"] == ts.state_dict()["_growth_tracker"] == 4


def test_pickle_round_trip_and_mid_iteration_refusal():
    model, opt = tiny()
    scaler = ampkit.GradScaler("cpu", init_scale=128.0, clipper="norm")
    one_step(model, opt, scaler)
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.get_scale() == scaler.get_scale() == 128.0
    assert copy.plugin_options("clipper") == scaler.plugin_options("clipper")
    opt.zero_grad()
    scaler.scale(model(torch.ones(3, 4)).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(AssertionError, match="only be pickled"):
        pickle.dumps(scaler)


def test_setters_change_the_plugin_and_keep_its_state():
    model, opt = tiny()
    scaler = ampkit.GradScaler("cpu", init_scale=8.0, growth_interval=10)
    one_step(model, opt, scaler)
    one_step(model, opt, scaler)
    scaler.set_growth_interval(3)
    assert scaler.get_growth_interval() == 3
    one_step(model, opt, scaler)
    assert scaler.get_scale() == 16.0  # the two earlier clean steps still count
    scaler.set_growth_factor(4.0)
    scaler.set_backoff_factor(0.25)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor()) == (4.0, 0.25)
    one_step(model, opt, scaler, poison=True)
    assert scaler.get_scale() == 4.0


def test_lr_scheduler_steps_only_on_taken_steps():
    model, opt = tiny()
    scaler = ampkit.GradScaler("cpu")
    sched = ampkit.LRScheduler(torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5), scaler)
    one_step(model, opt, scaler)
    assert sched.step() is True
    one_step(model, opt, scaler, poison=True)
    assert sched.step() is False
    assert sched.get_last_lr() == [0.05]


def test_plugins_lists_every_kind_with_options_and_help():
    found = {(p.kind, p.name) for p in ampkit.plugins()}
    assert {("scaler", "dynamic"), ("clipper", "norm"), ("nan_policy", "skip"), ("comm", "local")} <= found
    norm = next(p for p in ampkit.plugins() if p.name == "norm")
    opts = {o.name: o for o in norm.options}
    assert opts["max_norm"].default == "fp16=1;bf16=5;fp32=10" and opts["max_norm"].help


def test_per_precision_default_follows_precision():
    bf16 = ampkit.GradScaler("cpu", clipper="norm", precision="bf16")
    fp16 = ampkit.GradScaler("cpu", clipper="norm")
    assert ("max_norm", "5", "default for bf16") in bf16.plugin_options("clipper")
    assert ("max_norm", "1", "default for fp16") in fp16.plugin_options("clipper")


def test_disabled_scaler_passes_through():
    model, opt = tiny()
    scaler = ampkit.GradScaler("cpu", enabled=False)
    loss = model(torch.ones(3, 4)).sum()
    assert scaler.scale(loss) is loss
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}
