"""Seed 003's usage example (its "RTS AMP Gradient Clipping" report), run as written with only its
import lines changed from the seed's modules (amp_config, amp_trainer) to ampkit."""

import math

import torch

# The example, verbatim below the import lines; `model` and `batch` are the reader's.
SEED_003_EXAMPLE = """
from ampkit import create_default_amp_config
from ampkit import create_amp_trainer

# Configure with gradient clipping
config = create_default_amp_config(
    gradient_clip_max_norm=1.0,
    gradient_clip_strategy='norm',  # 'norm', 'value', or 'adaptive'
    enable_gradient_monitoring=True
)

trainer = create_amp_trainer(model, amp_config=config)

# Training step applies clipping automatically
loss = trainer.training_step(batch)

# Get clipping statistics
stats = trainer.last_clipping_stats
summary = trainer.get_gradient_summary()
"""

STEPS = 120


def data():
    """4-class data a small MLP learns: the class is the argmax of the first four inputs."""
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(8):
        x = torch.randn(64, 16, generator=g)
        out.append((x, x[:, :4].argmax(dim=1)))
    return out


def test_seed_003_example_runs_as_written_and_trains():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    batches = data()
    scope = {"model": model, "batch": batches[0]}
    exec(compile(SEED_003_EXAMPLE, "seed_003_example", "exec"), scope)
    trainer = scope["trainer"]
    losses = [scope["loss"]] + [trainer.training_step(batches[i % len(batches)]) for i in range(1, STEPS)]

    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-10:]) < 0.65 * sum(losses[:10]), (losses[:10], losses[-10:])  # AdamW(lr=1e-3)
    # The example's config: fp16 (the default precision), the norm clipper at max_norm 1.0.
    assert trainer.scaler._plugin("scaler")[0] == "dynamic" and trainer.scaler._plugin("clipper")[0] == "norm"
    stats, summary = scope["stats"], scope["summary"]  # after the first step
    assert stats["threshold"] == 1.0
    assert stats["grad_norm"] > 0 and math.isfinite(stats["grad_norm"])
    assert stats["grad_norm_clipped"] <= 1.0 + 1e-6
    assert stats["clipped"] == (stats["grad_norm"] > 1.0)
    assert summary["steps_taken"] + summary["steps_skipped"] == 1 and summary["found_inf"] is False
    # enable_gradient_monitoring: every parameter's gradient norm by name, and they make up the total.
    names = [n for n, _ in model.named_parameters()]
    assert list(summary["layer_norms"]) == names
    total = math.sqrt(sum(v * v for v in summary["layer_norms"].values()))
    assert total == pytest_approx(summary["grad_norm"])
    last = trainer.get_gradient_summary()
    assert last["steps_taken"] + last["steps_skipped"] == STEPS and last["steps_taken"] >= STEPS - 5
    assert {t["name"] for t in last["top_layers"]} <= set(names)


def test_monitoring_off_leaves_layer_norms_out_and_seed_spellings_agree_with_ours():
    import pytest

    import ampkit

    cfg = ampkit.create_default_amp_config(gradient_clip_max_norm=0.5, gradient_clip_strategy="value")
    assert cfg.scaler_kwargs()["clipper"] == "value"
    assert cfg.scaler_kwargs()["opt"]["clipper.clip_value"] == 0.5
    assert ampkit.AMPConfig(clip_strategy=ampkit.ClippingStrategy.ADAPTIVE).scaler_kwargs()["clipper"] == "adaptive"
    with pytest.raises(ValueError, match="max_grad_norm=1.0 and gradient_clip_max_norm=2.0 disagree"):
        ampkit.AMPConfig(max_grad_norm=1.0, gradient_clip_max_norm=2.0).scaler_kwargs()
    with pytest.raises(ValueError, match="clip_strategy='norm' and gradient_clip_strategy='value' disagree"):
        ampkit.AMPConfig(clip_strategy="norm", gradient_clip_strategy="value").scaler_kwargs()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    trainer = ampkit.create_amp_trainer(model, amp_config=ampkit.create_default_amp_config("bf16"))
    trainer.training_step(data()[0])
    assert "layer_norms" not in trainer.get_gradient_summary()
    assert ampkit.get_recommended_threshold("bf16") == ampkit.RECOMMENDED_CLIPPING_THRESHOLDS["bf16"]
    with pytest.raises(ValueError, match="precision 'fp8'"):
        ampkit.get_recommended_threshold("fp8")
    clipper = ampkit.create_gradient_clipper(ampkit.ClippingStrategy.NORM, threshold=0.1, precision="fp32")
    model.weight.grad = torch.full_like(model.weight, 1.0)
    model.bias.grad = None
    out = clipper.clip(model)
    assert out["grad_norm"] == pytest.approx(8.0) and out["grad_norm_clipped"] == pytest.approx(0.1, rel=1e-5)
    assert model.weight.grad.norm().item() == pytest.approx(0.1, rel=1e-5)


def pytest_approx(v):
    import pytest

    return pytest.approx(v, rel=1e-5)
