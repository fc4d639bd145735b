"""The seeds' API (ampkit.seeds) and the DeepSpeed mapping (ampkit.deepspeed): numbers against
torch itself, and each piece producing a working ampkit.GradScaler."""

import copy
import json
import math
import warnings

import pytest
import torch

import ampkit
from ampkit.deepspeed import scaler_kwargs_from_deepspeed
from ampkit.seeds import (
    RECOMMENDED_CLIPPING_THRESHOLDS,
    AMPConfig,
    AMPTrainer,
    DistributedAMPTrainer,
    DistributedConfig,
    DynamicLossScaler,
    GradientClipper,
    NaNDetector,
    NaNRecoveryManager,
    create_amp_trainer,
    create_default_amp_config,
)

STEPS = 100


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def batches(n=4):
    """Separable 3-class data: the class is the argmax of the first three inputs."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x = torch.randn(64, 8, generator=g)
        out.append((x, x[:, :3].argmax(dim=1)))
    return out


def poisoned_step(model, opt, scaler, factor=1.0, poison=False):
    opt.zero_grad(set_to_none=True)
    loss = model(torch.ones(3, 4)).square().mean() * factor
    scaler.scale(loss).backward()
    if poison:
        model.weight.grad[0, 0] = math.inf
    taken = scaler.step(opt)
    scaler.update()
    return taken


def linear():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


# --- AMPTrainer -------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_amp_trainer_loss_falls_and_records_fill(precision):
    model = mlp()
    trainer = create_amp_trainer(model, create_default_amp_config(precision))
    data = batches()
    losses = [trainer.training_step(data[i % len(data)]) for i in range(STEPS)]
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-10:]) < 0.8 * sum(losses[:10])  # default AdamW(lr=1e-3)
    stats = trainer.last_clipping_stats
    assert stats["threshold"] == RECOMMENDED_CLIPPING_THRESHOLDS[precision]
    assert stats["grad_norm"] > 0 and math.isfinite(stats["grad_norm"])
    assert stats["grad_norm_clipped"] == pytest.approx(min(stats["grad_norm"], stats["threshold"]), rel=1e-5)
    assert stats["clipped"] == (stats["clip_coef"] < 1.0)
    summary = trainer.get_gradient_summary()
    assert summary["steps_taken"] + summary["steps_skipped"] == STEPS
    assert summary["steps_taken"] >= STEPS - 5
    assert summary["grad_norm"] == stats["grad_norm"] and summary["found_inf"] is False
    names = {n for n, _ in model.named_parameters()}
    assert summary["top_layers"] and {t["name"] for t in summary["top_layers"]} <= names
    assert trainer.scaler._plugin("scaler")[0] == ("none" if precision == "bf16" else "dynamic")
    assert summary["scale"] >= 1.0 and math.log2(summary["scale"]).is_integer()


def test_amp_trainer_state_dict_round_trips_weights_only(tmp_path):
    data = batches()
    a = AMPTrainer(mlp(), create_default_amp_config("fp16", growth_interval=3))
    for i in range(10):
        a.training_step(data[i % 4])
    torch.save(a.state_dict(), tmp_path / "ckpt.pt")
    b = AMPTrainer(mlp(), create_default_amp_config("fp16", growth_interval=3))
    b.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    assert b.scaler.get_scale() == a.scaler.get_scale() and b.steps_taken == a.steps_taken
    assert [a.training_step(data[i % 4]) for i in range(3)] == [b.training_step(data[i % 4]) for i in range(3)]


def test_amp_config_maps_friendly_fields_and_refuses_contradictions():
    kwargs = AMPConfig(precision="fp16", init_scale=1024, growth_interval=50, max_grad_norm=0.5,
                       clip_strategy="value", nan_strategy="reduce_scale").scaler_kwargs()
    assert kwargs == {"scaler": "dynamic", "clipper": "value", "nan_policy": "backoff", "precision": "fp16",
                      "enabled": True,
                      "opt": {"clipper.clip_value": 0.5, "scaler.init_scale": 1024, "scaler.growth_interval": 50}}
    ampkit.GradScaler("cpu", **kwargs)  # the plugins take these options
    with pytest.raises(ValueError, match=r"clipper\.max_norm.*max_grad_norm=1"):
        AMPConfig(max_grad_norm=1.0, opt={"clipper.max_norm": 2.0}).scaler_kwargs()
    with pytest.raises(ValueError, match="clipper='norm' and clip_strategy='value'"):
        AMPConfig(clipper="norm", clip_strategy="value").scaler_kwargs()
    with pytest.raises(ValueError, match="ampkit-train"):
        AMPConfig(nan_strategy="rollback").scaler_kwargs()
    same = AMPConfig(max_grad_norm=1.0, opt={"clipper.max_norm": "1"}).scaler_kwargs()  # equal values agree
    assert same["opt"] == {"clipper.max_norm": "1"}


# --- GradientClipper --------------------------------------------------------------------------


def two_models_with_grads(scale):
    a = mlp()
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(a(x), y).backward()
    b = copy.deepcopy(a)
    for p, q in zip(a.parameters(), b.parameters()):
        p.grad.mul_(scale)
        q.grad = p.grad.clone()
    return a, b


@pytest.mark.parametrize("norm_type", ["2", "inf"])
def test_gradient_clipper_norm_equals_clip_grad_norm(norm_type):
    ours, theirs = two_models_with_grads(scale=30.0)
    stats = GradientClipper("norm", threshold=0.25, norm_type=norm_type).clip(ours)
    total = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.25, norm_type=float(norm_type))
    measured = stats["grad_norm"] if norm_type == "2" else stats["grad_max_abs"]  # the record's L2 and inf norms
    assert measured == pytest.approx(float(total), rel=1e-6)
    assert stats["clipped"] is True and stats["threshold"] == 0.25
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-9)


def test_gradient_clipper_value_equals_clip_grad_value_and_leaves_small_norms():
    ours, theirs = two_models_with_grads(scale=30.0)
    GradientClipper("value", threshold=0.01).clip(list(ours.parameters()))
    torch.nn.utils.clip_grad_value_(theirs.parameters(), 0.01)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(p.grad, q.grad)
    small, before = two_models_with_grads(scale=1e-3)
    stats = GradientClipper("norm", precision="fp32").clip(small)
    assert stats["clipped"] is False and stats["clip_coef"] == 1.0 and stats["threshold"] == 10.0
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(small.parameters(), before.parameters()))


def test_gradient_clipper_reports_non_finite_gradients_without_aborting():
    model, _ = two_models_with_grads(scale=1.0)
    clipper = GradientClipper("norm")
    for _ in range(60):  # past the skip policy's default max_consecutive (50)
        model[0].weight.grad[0, 0] = math.nan
        stats = clipper.clip(model)
    assert stats["found_inf"] is True and stats["clipped"] is False


def test_recommended_thresholds_come_from_the_norm_plugin():
    assert RECOMMENDED_CLIPPING_THRESHOLDS == {"fp16": 1.0, "bf16": 5.0, "fp32": 10.0}
    assert GradientClipper("norm").get_recommended_threshold("bf16") == 5.0
    assert GradientClipper("value", precision="fp32").get_recommended_threshold() == 10.0
    with pytest.raises(ValueError, match="no single threshold"):
        GradientClipper("none", threshold=1.0)


# --- DynamicLossScaler, NaNDetector, NaNRecoveryManager ---------------------------------------


def test_dynamic_loss_scaler_hysteresis_and_loss_scale():
    model, opt = linear()
    scaler = DynamicLossScaler(init_scale=1024.0, hysteresis=2, device="cpu")
    assert scaler.loss_scale == 1024.0
    assert scaler.scale_loss(torch.tensor(2.0)).item() == 2048.0
    assert poisoned_step(model, opt, scaler, poison=True) is False and scaler.loss_scale == 1024.0
    assert poisoned_step(model, opt, scaler, poison=True) is False and scaler.loss_scale == 512.0


def test_nan_detector_names_the_first_bad_parameter():
    detector = NaNDetector()
    assert detector.check_loss(torch.tensor(1.5)).ok
    report = detector.check_loss(float("nan"))
    assert not report.ok and report.name == "loss" and report.nan_count == 1
    model, _ = two_models_with_grads(scale=1.0)
    assert detector.check_gradients(model).ok
    model[2].weight.grad[1, 2] = math.inf
    model[2].bias.grad[0] = math.nan
    report = detector.check_gradients(model)
    assert (report.ok, report.name, report.nan_count, report.inf_count) == (False, "2.weight", 0, 1)
    assert detector.detections == 2


@pytest.mark.parametrize(("strategy", "policy", "scale_after"),
                         [("skip", "skip", 512.0), ("reduce_scale", "backoff", 256.0), ("abort", "abort", 512.0)])
def test_nan_recovery_strategies_make_working_scalers(strategy, policy, scale_after):
    model, opt = linear()
    scaler = NaNRecoveryManager(strategy).make_scaler("cpu", init_scale=1024.0)
    assert scaler._plugin("nan_policy")[0] == policy
    assert poisoned_step(model, opt, scaler) is True
    assert poisoned_step(model, opt, scaler, poison=True) is False  # abort tolerates overflows
    assert scaler.get_scale() == scale_after


def test_nan_recovery_abort_stops_on_a_non_finite_loss():
    model, opt = linear()
    scaler = NaNRecoveryManager("abort").make_scaler("cpu", init_scale=1024.0)
    with pytest.raises(ampkit.TrainingAborted):
        poisoned_step(model, opt, scaler, factor=math.nan)


def test_nan_recovery_clip_applies_a_gradient_spike_clipped():
    model, opt = linear()
    manager = NaNRecoveryManager("clip", spike_min_samples=5)
    assert manager.scaler_kwargs() == {"nan_policy": "skip", "opt": {
        "nan_policy.on_spike": "clip", "nan_policy.spike_zscore": 6.0, "nan_policy.spike_min_samples": 5}}
    scaler = manager.make_scaler("cpu", init_scale=1024.0)
    for i in range(8):
        poisoned_step(model, opt, scaler, factor=1.0 + 0.01 * i)
    assert poisoned_step(model, opt, scaler, factor=1000.0) is True
    rec = scaler.last_step
    assert rec["action"] == "clip" and rec["clipped"] is True
    assert rec["grad_norm_clipped"] < rec["grad_norm"] / 100


def test_nan_recovery_refuses_rollback_and_unknown_strategies():
    with pytest.raises(ValueError, match="snapshot"):
        NaNRecoveryManager("rollback")
    with pytest.raises(ValueError, match="did you mean 'skip'"):
        NaNRecoveryManager("skp")


# --- DistributedConfig, DistributedAMPTrainer -------------------------------------------------


def test_distributed_config_round_trips_through_the_environment():
    cfg = DistributedConfig(backend="gloo", world_size=8, rank=5, local_rank=1, master_addr="10.0.0.2",
                            master_port=29511)
    env = cfg.to_env_dict()
    assert env == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.2",
                   "MASTER_PORT": "29511"}
    assert DistributedConfig.from_env(env, backend="gloo") == cfg
    assert cfg.validate() is cfg
    with pytest.raises(ValueError, match=r"rank=8 must be in \[0, world_size=8\)"):
        DistributedConfig(backend="gloo", world_size=8, rank=8).validate()
    with pytest.raises(ValueError, match="master_port=0"):
        DistributedConfig(backend="gloo", master_port=0).validate()
    with pytest.raises(ValueError, match="backend='glo'"):
        DistributedConfig(backend="glo").validate()
    with pytest.raises(ValueError, match="RANK='x'"):
        DistributedConfig.from_env({"RANK": "x"})


def test_distributed_config_from_yaml_and_json(tmp_path):
    (tmp_path / "d.yaml").write_text("distributed:\n  backend: gloo\n  world_size: 2\n  rank: 1\n")
    assert DistributedConfig.from_file(tmp_path / "d.yaml") == DistributedConfig(backend="gloo", world_size=2, rank=1)
    (tmp_path / "d.json").write_text(json.dumps({"backend": "gloo", "wrld_size": 2}))
    with pytest.raises(ValueError, match="did you mean 'world_size'"):
        DistributedConfig.from_file(tmp_path / "d.json")


def test_distributed_trainer_trains_and_checkpoints_in_one_process(tmp_path):
    cfg = DistributedConfig(backend="gloo", init_method=f"file://{tmp_path / 'rendezvous'}")
    try:
        trainer = DistributedAMPTrainer(mlp(), create_default_amp_config("bf16"), cfg)
        assert torch.distributed.get_world_size() == 1
        data = batches()
        losses = [trainer.training_step(data[i % 4]) for i in range(20)]
        assert losses[-1] < losses[0]
        assert {t["name"] for t in trainer.get_gradient_summary()["top_layers"]} <= {"0.weight", "0.bias",
                                                                                     "2.weight", "2.bias"}
        trainer.save_checkpoint(tmp_path / "ckpt.pt")
        saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        assert set(saved["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.training_step(data[0])
        trainer.load_checkpoint(tmp_path / "ckpt.pt")
        assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# --- DeepSpeed --------------------------------------------------------------------------------

DS_CONFIG = {
    "train_batch_size": 32,
    "zero_optimization": {"stage": 2},
    "gradient_clipping": 1.5,
    "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
             "hysteresis": 2, "min_loss_scale": 2, "auto_cast": False},
}


def test_deepspeed_fp16_maps_onto_the_dynamic_scaler_with_one_warning(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DS_CONFIG))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kwargs = scaler_kwargs_from_deepspeed(path)
    assert len(caught) == 1 and "fp16.auto_cast" in str(caught[0].message)
    assert "train_batch_size" not in str(caught[0].message) and "zero_optimization" not in str(caught[0].message)
    assert kwargs == {"precision": "fp16", "scaler": "dynamic", "clipper": "norm", "opt": {
        "scaler.init_scale": "4096", "scaler.growth_interval": "500", "scaler.hysteresis": "2", "scaler.min_scale": "2",
        "scaler.growth_delay": "1", "clipper.max_norm": "1.5"}}
    scaler = ampkit.GradScaler("cpu", **kwargs)
    assert scaler.get_scale() == 4096.0 and scaler.get_growth_interval() == 500
    assert dict((r[0], r[1]) for r in scaler.plugin_options("scaler"))["hysteresis"] == "2"


def test_deepspeed_defaults_static_bf16_and_conflicts():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alone = scaler_kwargs_from_deepspeed({"fp16": {"enabled": True}}, "0.17.0")
        latest = scaler_kwargs_from_deepspeed({"fp16": {"enabled": True}})
        bf16 = scaler_kwargs_from_deepspeed({"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 4})
        static = scaler_kwargs_from_deepspeed({"fp16": {"enabled": True, "loss_scale": 128}})
    # DeepSpeed 0.17.0's DynamicLossScaler defaults when the section names no dynamic key; 0.17.1's
    # config defaults always, and its growth one clean step later.
    assert alone["opt"] == {"scaler.init_scale": "4294967296", "scaler.growth_interval": "1000",
                            "scaler.hysteresis": "1", "scaler.min_scale": "1", "scaler.growth_delay": "0"}
    assert latest["opt"] == {"scaler.init_scale": "65536", "scaler.growth_interval": "1000",
                             "scaler.hysteresis": "2", "scaler.min_scale": "1", "scaler.growth_delay": "1"}
    assert bf16 == {"precision": "bf16", "scaler": "none", "clipper": "none", "opt": {}}
    assert static["scaler"] == "static" and static["opt"] == {"scaler.scale": "128"}
    assert ampkit.GradScaler("cpu", **static).get_scale() == 128.0
    with pytest.warns(UserWarning, match=r"fp16\.consecutive_hysteresis.*amp") as caught:
        scaler_kwargs_from_deepspeed({"fp16": {"enabled": True, "consecutive_hysteresis": True}, "amp": {}})
    assert len(caught) == 1
    with pytest.raises(ValueError, match="enables both fp16 and bf16"):
        scaler_kwargs_from_deepspeed({"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    with pytest.raises(ValueError, match="fp16.enabled is \"auto\""):
        scaler_kwargs_from_deepspeed({"fp16": {"enabled": "auto"}})


def test_deepspeed_inputs_python_holds_are_one_exception_each(tmp_path):
    # Found by a review against DeepSpeed's config classes: a list crashed inside open(), a bad
    # file raised JSONDecodeError without its name, a NaN reached the C++ parser as "not valid
    # JSON", and an HF-style config's "auto" batch sizes were refused though the loop owns them.
    with pytest.raises(TypeError, match="a DeepSpeed config is a dict or a JSON file's path, got list"):
        scaler_kwargs_from_deepspeed([1, 2])
    bad = tmp_path / "bad.json"
    bad.write_text('{"fp16": {"enabled": true,}}')
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON: "):
        scaler_kwargs_from_deepspeed(bad)
    with pytest.raises(ValueError, match="holds a NaN or infinite number"):
        scaler_kwargs_from_deepspeed({"fp16": {"enabled": True, "loss_scale": math.nan}})
    with pytest.raises(ValueError, match=r"fp16\.initial_scale_power must be a whole number in \[-126, 127\], got 3\.5"):
        scaler_kwargs_from_deepspeed({"fp16": {"enabled": True, "initial_scale_power": 3.5}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf = scaler_kwargs_from_deepspeed({"fp16": {"enabled": True, "initial_scale_power": 10},
                                           "train_batch_size": "auto", "gradient_accumulation_steps": "auto"})
    assert hf["opt"]["scaler.init_scale"] == "1024"
    with pytest.warns(UserWarning, match="fp16.auto_cast") as caught:
        scaler_kwargs_from_deepspeed({"fp16": {"enabled": True, "auto_cast": True}})
    assert caught[0].filename == __file__  # the warning points at the caller's line


@pytest.mark.skipif(not hasattr(ampkit.GradScaler, "from_deepspeed_config"), reason="classmethod not added yet")
def test_grad_scaler_from_deepspeed_config():
    with pytest.warns(UserWarning, match="fp16.auto_cast"):
        scaler = ampkit.GradScaler.from_deepspeed_config(DS_CONFIG, "cpu", opt={"scaler.growth_interval": 7})
    assert scaler.get_scale() == 4096.0 and scaler.get_growth_interval() == 7


def test_importing_ampkit_loads_no_plugin_until_the_thresholds_are_read():
    # RECOMMENDED_CLIPPING_THRESHOLDS is read from the norm clipper plugin, which loading runs in a
    # probe child first: on first use, not at `import ampkit` (a module __getattr__ in the package).
    import subprocess
    import sys

    script = (
        "import ampkit\n"
        "mapped = lambda: sorted({l.strip().split('/')[-1] for l in open('/proc/self/maps') if '/libampkit-' in l})\n"
        "print(mapped())\n"
        "print(ampkit.RECOMMENDED_CLIPPING_THRESHOLDS['fp16'])\n"
        "print(mapped())\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(__import__("os").environ, PYTHONPATH=":".join(sys.path)))
    assert run.returncode == 0, run.stderr
    before, threshold, after = run.stdout.splitlines()
    assert before == "[]"
    assert threshold == "1.0"
    assert "libampkit-clipper-norm.so" in after, after
