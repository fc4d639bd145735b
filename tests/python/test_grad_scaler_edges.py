"""ampkit.GradScaler where a torch.amp.GradScaler loop does something less common, found by a review
against torch 2.11 (session 10): an unscale_() now and then, a second optimizer that joins later,
reads between step() and update(), update(new_scale), a caught abort, records that arrive late (as
a GPU's do), fused SGD's first momentum step, parameters replaced in place, optimizers that go
away, _found_inf_per_device, fp16 parameters under a fused optimizer, a retried step, NumPy and
tensor arguments. Each against torch's GradScaler or ampkit's synchronous step, with numbers."""

import gc
import math
import warnings
import weakref
from typing import Any, Callable, List, Tuple

import numpy as np
import pytest
import torch

import ampkit

warnings.simplefilter("ignore", UserWarning)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 4)


def _loop(make: Callable[[], Any], steps: int, body: Callable[[int, Any, Any, torch.nn.Module], Any],
          fused: bool = True) -> Tuple[List[Any], List[float]]:
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), lr=0.1, fused=fused)
    scaler, rows = make(), []
    for i in range(steps):
        opt.zero_grad()
        rows.append(body(i, scaler, opt, m))
    return rows, [float(v) for v in torch.cat([p.detach().flatten() for p in m.parameters()])]


def _two_optimizers(make: Callable[[], Any], body: Callable[..., None]) -> Tuple[List[float], List[float]]:
    """Six iterations of two Linear layers, each with its own fused AdamW: the scales after each
    update() and the final parameters; ``body(i, scaler, a, b, opt_a, opt_b)`` runs backward and
    the steps."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    oa = torch.optim.AdamW(a.parameters(), lr=0.1, fused=True)
    ob = torch.optim.AdamW(b.parameters(), lr=0.1, fused=True)
    s, scales = make(), []
    for i in range(6):
        oa.zero_grad()
        ob.zero_grad()
        body(i, s, a, b, oa, ob)
        s.update()
        scales.append(s.get_scale())
    return scales, [float(v) for m in (a, b) for p in m.parameters() for v in p.detach().flatten()]


def _torch() -> Any:
    return torch.amp.GradScaler("cpu", growth_interval=3)


def _ampkit(sync: str) -> Callable[[], Any]:
    return lambda: ampkit.GradScaler("cpu", growth_interval=3, sync=sync)


@pytest.mark.parametrize("sync", ["auto", "deferred"])
def test_an_unscale_now_and_then_leaves_the_deferred_step_working(sync: str) -> None:
    def body(i: int, s: Any, opt: Any, m: torch.nn.Module) -> Any:
        s.scale(m(torch.ones(2, 4)).pow(2).sum() * (math.inf if i == 4 else 1.0)).backward()
        if i % 3 == 1:  # e.g. to log the unscaled gradient norm every few steps
            s.unscale_(opt)
        s.step(opt)
        s.update()
        return s.get_scale(), getattr(s, "last_step", {}).get("host_sync")

    want, want_params = _loop(_torch, 8, body)
    got, params = _loop(_ampkit(sync), 8, body)
    assert [r[0] for r in got] == [r[0] for r in want]
    assert params == want_params
    assert [r[1] for r in got][5:] == ["deferred", "deferred", "step"]  # deferred again after an unscale_


@pytest.mark.parametrize("sync", ["auto", "deferred"])
def test_a_second_optimizer_may_join_a_deferred_run(sync: str) -> None:
    def body(i: int, s: Any, a: torch.nn.Module, b: torch.nn.Module, oa: Any, ob: Any) -> None:
        loss = a(torch.ones(2, 4)).sum() + (b(torch.ones(2, 4)).sum() if i >= 2 else 0)
        s.scale(loss * (math.inf if i == 4 else 1.0)).backward()
        s.step(oa)
        if i >= 2:  # joins at the third iteration, when the first runs deferred
            s.step(ob)

    want = _two_optimizers(_torch, body)
    assert _two_optimizers(_ampkit(sync), body) == want
    assert want[0] == [65536.0, 65536.0, 131072.0, 131072.0, 65536.0, 65536.0]


def test_a_skip_shows_in_get_scale_read_between_step_and_update() -> None:
    # The common idiom: scale = scaler.get_scale(); scaler.update(); skipped = scale > scaler.get_scale().
    def body(i: int, s: Any, opt: Any, m: torch.nn.Module) -> Any:
        s.scale(m(torch.ones(2, 4)).pow(2).sum() * (math.inf if i in (2, 5) else 1.0)).backward()
        s.step(opt)
        before, tracker = s.get_scale(), int(s._growth_tracker)
        s.update()
        return before > s.get_scale(), before, tracker

    want, want_params = _loop(_torch, 8, body)
    for sync in ("auto", "deferred"):
        got, params = _loop(_ampkit(sync), 8, body)
        assert got == want, sync
        assert params == want_params
    assert [r[0] for r in want] == [False, False, True, False, False, True, False, False]


def test_update_with_a_new_scale_keeps_the_growth_tracker_as_torch() -> None:
    def body(i: int, s: Any, opt: Any, m: torch.nn.Module) -> Any:
        s.scale(m(torch.ones(2, 4)).pow(2).sum()).backward()
        s.step(opt)
        s.update(1024.0 if i == 2 else None)
        return s.get_scale(), int(s._growth_tracker)

    want, _ = _loop(_torch, 6, body)
    assert want == [(65536.0, 1), (65536.0, 2), (1024.0, 2), (2048.0, 0), (2048.0, 1), (2048.0, 2)]
    for sync in ("step", "auto", "deferred"):
        assert _loop(_ampkit(sync), 6, body)[0] == want, sync


def test_an_update_with_a_new_scale_after_update_counts_no_step() -> None:
    s = ampkit.GradScaler("cpu", sync="step")
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    s.scale(m(torch.ones(2, 4)).sum()).backward()
    s.step(opt)
    s.update()
    s.update(512.0)  # torch: sets the scale, nothing else
    assert s.get_scale() == 512.0
    assert s.last_step["skipped_steps"] == 0


def _abort_run(sync: str, late: bool) -> List[Tuple[int, bool, str]]:
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
    s = ampkit.GradScaler("cpu", nan_policy="abort", sync=sync)
    if late:
        s._core.set_late_arrivals(True)  # records arrive as late as a GPU's may
    rows = []
    for i in range(8):
        opt.zero_grad()
        s.scale(m(torch.ones(3, 4)).sum() * (math.nan if i == 2 else 1.0)).backward()
        stepped = bool(s.step(opt))
        try:
            s.update()
            raised = ""
        except ampkit.TrainingAborted:
            raised = "abort"
        rows.append((i, stepped, raised))
    return rows


def test_an_abort_is_raised_when_its_record_arrives_late_and_training_can_go_on() -> None:
    want = _abort_run("step", late=False)
    assert want[2] == (2, False, "abort") and all(r[1] for r in want if r[0] != 2)
    assert _abort_run("deferred", late=False) == want  # records in time (CPU): the same steps
    late = _abort_run("deferred", late=True)
    raised = [r[0] for r in late if r[2]]
    assert raised in ([2], [3], [4]), late  # raised, at most two updates late; not lost
    assert all(r[1] for r in late if r[0] > raised[0] + 1)  # then training goes on


def _fused_sgd_with_momentum(sync: str, steps: int, bad: Callable[[int], bool], load_fresh_at: int = -1) -> List[float]:
    """A fused SGD with momentum trained ``steps`` times, the loss made inf where ``bad(i)``, a
    fresh optimizer's state (no momentum buffers) loaded before step ``load_fresh_at``: the weights."""
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=True)
    fresh = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=True).state_dict()
    s = ampkit.GradScaler("cpu", sync=sync)
    for i in range(steps):
        if i == load_fresh_at:
            opt.load_state_dict(fresh)
        opt.zero_grad()
        s.scale(m(torch.ones(2, 4)).sum() * (math.inf if bad(i) else 1.0)).backward()
        s.step(opt)
        s.update()
    return [float(v) for p in m.parameters() for v in p.detach().flatten()]


def test_a_fused_sgds_first_momentum_step_skipped_leaves_no_garbage() -> None:
    want = _fused_sgd_with_momentum("step", 6, lambda i: i < 2)
    assert max(abs(v) for v in want) < 10
    assert _fused_sgd_with_momentum("auto", 6, lambda i: i < 2) == want
    assert _fused_sgd_with_momentum("deferred", 6, lambda i: i < 2) == want


def test_a_parameter_replaced_in_place_is_bound_again() -> None:
    out = []
    for make in (lambda: torch.amp.GradScaler("cpu"), lambda: ampkit.GradScaler("cpu")):
        s, p = make(), torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([p], lr=0.1)
        s.scale(p.sum()).backward()
        s.step(opt)
        s.update()
        q = torch.nn.Parameter(torch.ones(3))
        opt.param_groups[0]["params"][0] = q
        opt.zero_grad()
        s.scale(q.sum()).backward()
        s.step(opt)
        s.update()
        out.append(q.detach().tolist())
    assert out[1] == out[0] == [pytest.approx(0.9)] * 3


def test_an_optimizer_that_goes_away_releases_its_parameters() -> None:
    s = ampkit.GradScaler("cpu")
    for _ in range(3):
        m = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        s.scale(m(torch.ones(2, 4)).sum()).backward()
        s.step(opt)
        s.update()
        alive = weakref.ref(m.weight)
        del m, opt
        gc.collect()
        assert alive() is None


def test_found_inf_per_device_is_torchs() -> None:
    class OldContractSGD(torch.optim.SGD):  # the optimizer gets the scaler and unscales itself
        _step_supports_amp_scaling = True

        def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
            if grad_scaler is not None:
                grad_scaler.unscale_(self)
                if sum(v.item() for v in grad_scaler._found_inf_per_device(self).values()):
                    return None
            return super().step(closure)

    out = []
    for make in (lambda: torch.amp.GradScaler("cpu"), lambda: ampkit.GradScaler("cpu")):
        p = torch.nn.Parameter(torch.ones(3))
        opt, s, rows = OldContractSGD([p], lr=0.1), make(), []
        for i in range(3):
            opt.zero_grad()
            s.scale((p * 2).sum()).backward()
            if i == 1:
                p.grad[0] = math.inf
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                s.step(opt)
            s.update()
            rows.append((s.get_scale(), p.detach().tolist()))
        out.append(rows)
    assert out[1] == out[0]
    assert out[0][1][1] == out[0][0][1]  # the inf step skipped


def test_fp16_parameters_under_a_fused_optimizer_train_as_torchs() -> None:
    out = []
    for make in (lambda: torch.amp.GradScaler("cpu", init_scale=1024.0),
                 lambda: ampkit.GradScaler("cpu", init_scale=1024.0)):
        m = _model().half()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
        s = make()
        for _ in range(3):
            opt.zero_grad()
            s.scale(m(torch.ones(2, 4, dtype=torch.half)).float().sum()).backward()
            s.step(opt)
            s.update()
        out.append([float(v) for v in m.weight.detach().flatten()])
    assert out[1] == out[0]


def test_a_step_retried_after_the_optimizer_raised_does_not_unscale_again() -> None:
    out = []
    for make, fused in ((lambda: torch.amp.GradScaler("cpu"), False), (lambda: ampkit.GradScaler("cpu", sync="step"), False),
                        (lambda: ampkit.GradScaler("cpu", sync="deferred"), True)):
        p = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([p], lr=0.1, fused=fused)
        s, real_step = make(), opt.step
        s.scale((p * 2).sum()).backward()
        opt.step = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="boom"):
            s.step(opt)
        opt.step = real_step  # type: ignore[method-assign]
        s.step(opt)
        s.update()
        out.append((p.detach().tolist(), s.get_scale()))
    assert out[0] == ([pytest.approx(0.8)] * 3, 65536.0)
    assert out[1] == out[0] and out[2] == out[0]


def test_numpy_and_tensor_numbers_are_taken_as_torch_takes_them() -> None:
    s = ampkit.GradScaler("cpu", init_scale=np.float32(512.0), growth_interval=np.int64(100))
    assert (s.get_scale(), s.get_growth_interval()) == (512.0, 100)
    s = ampkit.GradScaler("cpu", init_scale=torch.tensor(256.0))
    assert s.get_scale() == 256.0
    s.load_state_dict({"scale": torch.tensor(64.0), "_growth_tracker": torch.tensor(3), "growth_factor": 2.0,
                       "backoff_factor": 0.5, "growth_interval": np.int64(5)})
    assert (s.get_scale(), s.state_dict()["_growth_tracker"], s.get_growth_interval()) == (64.0, 3, 5)


def _deferred_run(scaler: Any, opt: Any, m: torch.nn.Module, steps: range, nan_at: int = -1,
                  read: bool = True) -> List[str]:
    out = []
    for i in steps:
        opt.zero_grad()
        scaler.scale(m(torch.ones(3, 4)).sum() * (math.nan if i == nan_at else 1.0)).backward()
        scaler.step(opt)
        try:
            scaler.update()
            out.append(scaler.last_step["host_sync"] if read else "ok")  # a read waits for every record
        except ampkit.TrainingAborted:
            out.append("abort")
    return out


def test_a_refused_change_leaves_the_deferred_step_working() -> None:
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
    s = ampkit.GradScaler("cpu", sync="deferred")
    assert _deferred_run(s, opt, m, range(2)) == ["deferred", "deferred"]
    with pytest.raises(ValueError, match="growth_factor"):
        s.set_plugin_option("scaler.growth_factor", -2.0)
    opt.zero_grad()
    s.scale(m(torch.ones(3, 4)).sum()).backward()
    s.step(opt)
    with pytest.raises(ValueError, match="new_scale 0.5 refused"):
        s.update(0.5)  # below min_scale: the iteration ends, the scale stays
    assert s.get_scale() == 65536.0 and s.last_step["step"] == 2
    assert _deferred_run(s, opt, m, range(3, 6)) == ["deferred"] * 3
    assert s.last_step["step"] == 5


def test_an_abort_delivered_when_an_optimizer_goes_away_is_raised_by_the_next_update() -> None:
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
    s = ampkit.GradScaler("cpu", nan_policy="abort", sync="deferred")
    s._core.set_late_arrivals(True)  # the abort's record is still on its way when the optimizer goes
    assert _deferred_run(s, opt, m, range(3), nan_at=2, read=False) == ["ok"] * 3
    del opt
    gc.collect()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
    assert _deferred_run(s, opt, m, range(3, 6)) == ["abort", "deferred", "deferred"]


def test_the_setters_take_numbers_only() -> None:
    s = ampkit.GradScaler("cpu")
    for call, bad in ((s.set_growth_interval, 2.7), (s.set_growth_interval, "4"), (s.set_growth_factor, "4"),
                      (s.set_backoff_factor, None)):
        with pytest.raises(TypeError, match="must be"):
            call(bad)
    s.set_growth_interval(np.int64(7))
    s.set_growth_factor(torch.tensor(3.0))
    assert (s.get_growth_interval(), s.get_growth_factor(), s.get_backoff_factor()) == (7, 3.0, 0.5)


def test_a_growth_interval_set_below_the_clean_steps_counted_grows_at_the_next_clean_step() -> None:
    # torch keeps the count (6) and, comparing it with == 3, never grows again; ampkit had refused
    # with an error about a "checkpoint". Here the 7th clean step grows, in both step modes.
    def run(sync: str) -> List[Tuple[float, int]]:
        m = _model()
        opt = torch.optim.AdamW(m.parameters(), lr=0.1, fused=True)
        s, out = ampkit.GradScaler("cpu", init_scale=8.0, growth_interval=10, sync=sync), []
        for i in range(10):
            opt.zero_grad()
            s.scale(m(torch.ones(2, 4)).sum()).backward()
            s.step(opt)
            if i == 6:  # between step() and update(): the update uses the new interval, as torch's
                s.set_growth_interval(3)
            s.update()
            out.append((s.get_scale(), s._get_growth_tracker()))
        return out

    want = [(8.0, k) for k in range(1, 7)] + [(16.0, 0), (16.0, 1), (16.0, 2), (32.0, 0)]
    assert run("step") == want
    assert run("auto") == want
    s = ampkit.GradScaler("cpu")
    with pytest.raises(ValueError, match="growth_interval.*>= 1"):
        s.set_growth_interval(0)


def test_a_fused_sgd_whose_loaded_state_has_no_momentum_is_asked_again() -> None:
    # The deferred step learns once that a fused SGD's momentum buffers exist; a state loaded
    # without them (a fresh optimizer's) must make a skipped first step synchronous again.
    want = _fused_sgd_with_momentum("step", 8, lambda i: i == 3, load_fresh_at=3)
    assert max(abs(v) for v in want) < 10
    assert _fused_sgd_with_momentum("auto", 8, lambda i: i == 3, load_fresh_at=3) == want


def test_complex_gradients_are_one_clear_error() -> None:
    p = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))
    opt = torch.optim.SGD([p], lr=0.1)
    s = ampkit.GradScaler("cpu")
    s.scale((p.abs() ** 2).sum()).backward()
    with pytest.raises(ValueError, match=r"^a ComplexFloat gradient: ampkit.GradScaler unscales real") as e:
        s.step(opt)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_unscale_rounds_as_torch_for_a_scale_that_is_no_power_of_two(dtype: torch.dtype) -> None:
    # torch multiplies by a float32 inv_scale in the gradients' opmath type; ampkit's double factor
    # had left 1 ulp in about 12% of bf16 elements (scale 1000) and every fp64 one.
    def grads(make: Callable[[], Any]) -> torch.Tensor:
        torch.manual_seed(0)
        m = torch.nn.Linear(64, 64).to(dtype)
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        s = make()
        s.scale(m(torch.randn(8, 64, dtype=dtype)).float().pow(2).sum()).backward()
        s.unscale_(opt)
        return torch.cat([p.grad.flatten() for p in m.parameters()])

    want = grads(lambda: torch.amp.GradScaler("cpu", init_scale=1000.0))
    got = grads(lambda: ampkit.GradScaler("cpu", init_scale=1000.0, sync="step"))
    assert want.dtype == got.dtype == dtype
    assert torch.equal(got, want)


def test_a_scaled_value_that_needs_no_gradient_is_not_the_loss() -> None:
    # A NaN logged through scale() (a detached copy) made every step count as a non-finite loss.
    def run(make: Callable[[], Any]) -> Tuple[List[float], List[float]]:
        m = _model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        s, scales = make(), []
        for _ in range(4):
            opt.zero_grad()
            loss = m(torch.ones(2, 4)).pow(2).sum()
            s.scale(loss).backward()
            s.scale(torch.tensor(math.nan))  # e.g. a metric scaled to compare with the scaled loss
            s.step(opt)
            s.update()
            scales.append(s.get_scale())
        return scales, [float(v) for p in m.parameters() for v in p.detach().flatten()]

    want = run(lambda: torch.amp.GradScaler("cpu", growth_interval=2))
    assert run(lambda: ampkit.GradScaler("cpu", growth_interval=2, sync="step")) == want
    assert want[0] == [65536.0, 131072.0, 131072.0, 262144.0]


@pytest.mark.parametrize("sync", ["auto", "deferred", "step"])
def test_a_fused_optimizer_without_gradients_steps_over_none_as_torchs(sync: str) -> None:
    # torch hands a fused optimizer found_inf 0 when it has no gradient, and its step updates
    # nothing; ampkit raised "No inf checks were recorded" in step() (sync) or recorded a clean step
    # that grew the scale (deferred). Here: a second head used every other iteration.
    def body(i: int, s: Any, a: torch.nn.Module, b: torch.nn.Module, oa: Any, ob: Any) -> None:
        x = a(torch.ones(2, 4))
        s.scale((b(x) if i % 2 else x).pow(2).sum()).backward()
        s.step(oa)
        s.step(ob)

    want = _two_optimizers(_torch, body)
    assert _two_optimizers(_ampkit(sync), body) == want
    assert want[0] == [65536.0, 65536.0, 131072.0, 131072.0, 131072.0, 262144.0]
    # Alone, it records nothing: update() raises as torch's.
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1, fused=True)
    s = ampkit.GradScaler("cpu", sync=sync)
    s.scale(m(torch.ones(3, 4)).sum())
    assert s.step(opt) is True
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update"):
        s.update()


@pytest.mark.parametrize("sync", ["auto", "deferred"])
def test_a_fused_sgd_without_gradients_is_not_taken_as_having_its_momentum(sync: str) -> None:
    # A head unused in the first iterations: its SGD had been marked "momentum made" then (no
    # gradient, no buffer missing), so its first real step, skipped on the device, left torch's
    # empty_like buffers to the later steps (found by a review of session 11's change).
    def run(sync: str) -> List[float]:
        torch.manual_seed(0)
        a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        oa = torch.optim.AdamW(a.parameters(), lr=0.01, fused=True)
        ob = torch.optim.SGD(b.parameters(), lr=0.01, momentum=0.9, fused=True)
        s = ampkit.GradScaler("cpu", sync=sync)
        for i in range(6):
            oa.zero_grad()
            ob.zero_grad()
            x = a(torch.ones(2, 4))
            s.scale((b(x) if i >= 2 else x).pow(2).sum() * (math.inf if i == 2 else 1.0)).backward()
            s.step(ob)
            s.step(oa)
            s.update()
        return [float(v) for m in (a, b) for p in m.parameters() for v in p.detach().flatten()]

    want = run("step")
    assert max(abs(v) for v in want) < 10
    assert run(sync) == want
