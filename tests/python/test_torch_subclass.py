"""ampkit.GradScaler is a torch.amp.GradScaler (a subclass, so trainers take it): the private attributes and calls that
trainers and fused optimizers use (Lightning's type checks, Accelerate's FSDP2 load_state, the fused
optimizers of Apex and Transformer Engine) give what torch's give, side by side on the same steps."""

import pytest
import torch
from torch.amp.grad_scaler import OptState

import ampkit


def _pair():
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 3) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    scalers = [torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2),
               ampkit.GradScaler("cpu", init_scale=8.0, growth_interval=2, sync="step")]
    return models, opts, scalers


def _backward(model, scaler, inf=False):
    loss = model(torch.ones(2, 4)).sum()
    scaler.scale(loss).backward()
    if inf:
        model.weight.grad[0, 0] = float("inf")


def test_it_is_a_torch_grad_scaler_with_torchs_private_state():
    models, opts, scalers = _pair()
    torch_scaler, mine = scalers
    assert isinstance(mine, torch.amp.GradScaler)
    assert mine._scale is None and mine._growth_tracker is None  # lazily made, as torch's
    for step in range(5):
        for m, o, s in zip(models, opts, scalers):
            o.zero_grad()
            _backward(m, s, inf=step == 2)
            s.unscale_(o)
            assert s._per_optimizer_states[id(o)]["stage"] is OptState.UNSCALED
            s.step(o)
            s.update()
        for name in ("_init_growth_tracker", "_growth_factor", "_backoff_factor", "_growth_interval"):
            assert getattr(mine, name) == getattr(torch_scaler, name), name
        assert mine._scale.dtype == torch_scaler._scale.dtype == torch.float32
        assert mine._scale.device == torch_scaler._scale.device
        assert mine._scale.item() == torch_scaler._scale.item()
        assert mine._get_scale_async() is mine._scale
        assert mine._growth_tracker.dtype == torch.int32
        assert mine._growth_tracker.item() == torch_scaler._growth_tracker.item()


def test_check_inf_per_device_reports_as_torchs():
    models, opts, scalers = _pair()
    for inf in (False, True):
        found = []
        for m, o, s in zip(models, opts, scalers):
            o.zero_grad()
            _backward(m, s, inf=inf)
            per_device = s._check_inf_per_device(o)
            assert per_device is s._found_inf_per_device(o)
            found.append({str(d): t.item() for d, t in per_device.items()})
            s._per_optimizer_states.clear()
        assert found[0] == found[1] == {"cpu": 1.0 if inf else 0.0}


def test_lazy_init_after_load_state_dict_places_the_loaded_scale():
    # Accelerate's FSDP2 load_state: load_state_dict, then _lazy_init_scale_growth_tracker(device).
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    mine = ampkit.GradScaler("cpu", init_scale=8.0)
    for s in (torch_scaler, mine):
        s.load_state_dict({"scale": 512.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                           "_growth_tracker": 3})
        s._lazy_init_scale_growth_tracker(torch.device("cpu"))
    assert mine._scale.item() == torch_scaler._scale.item() == 512.0
    assert mine._growth_tracker.item() == torch_scaler._growth_tracker.item() == 3


def test_a_fused_optimizer_gets_grad_scale_and_found_inf_tensors_as_from_torch():
    seen = {}

    class Fused(torch.optim.SGD):
        _step_supports_amp_scaling = True

        def step(self, closure=None):
            seen["grad_scale"], seen["found_inf"] = self.grad_scale, self.found_inf

    model = torch.nn.Linear(4, 3)
    opt = Fused(model.parameters(), lr=0.1)
    scaler = ampkit.GradScaler("cpu", init_scale=1.0, sync="step")  # a factor of 1: torch passes them too
    scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert isinstance(seen["grad_scale"], torch.Tensor) and seen["grad_scale"].item() == 1.0
    assert isinstance(seen["found_inf"], torch.Tensor) and seen["found_inf"].item() == 0.0
    with pytest.raises(AssertionError, match="_scale is None"):
        ampkit.GradScaler("cpu").step(opt)
