"""A plugin's wrong answer never trains the model: a scale of 0, NaN or -8, an action out of range or a
rollback without a rollback plan is that plugin's fault in both hosts (ampkit.PluginError; ampkit-train
exit 3), one line naming the plugin, the call and the value, on the synchronous and the deferred step;
a policy's own abort is ampkit.TrainingAborted / exit 5 on both. The plugins are
tests/plugins/broken/wrong_scale.cpp and wrong_action.cpp: each declares a device rule, so the
deferred step runs with them and its host forms meet the wrong answer on delivery."""

import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

import ampkit

BUILD = os.path.abspath(
    os.environ.get("AMPKIT_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
)
ANSWERS = os.path.join(BUILD, "tests", "broken-plugins", "answers")
SCALER = os.path.join(ANSWERS, "libampkit-scaler-wrong_scale.so")
POLICY = os.path.join(ANSWERS, "libampkit-nan_policy-wrong_action.so")
STEPS = 6


def _train(sync: str, **kwargs: Any) -> Tuple[int, Optional[Exception], List[torch.Tensor], int]:
    """Up to STEPS iterations: (the iterations whose update() returned, the error that stopped them,
    the parameters, the optimizer steps taken)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    scaler = ampkit.GradScaler("cpu", sync=sync, **kwargs)
    done, error = 0, None
    try:
        for _ in range(STEPS):
            opt.zero_grad()
            scaler.scale(model(torch.ones(3, 4)).sum()).backward()
            scaler.step(opt)
            scaler.update()
            done += 1
        scaler.get_scale()  # a record still on its way is delivered here at the latest
    except ampkit.AmpkitError as e:
        error = e
    taken = int(opt.state[model.weight]["step"]) if opt.state.get(model.weight) else 0
    return done, error, [p.detach().clone() for p in model.parameters()], taken


def _good_parameters(steps: int) -> List[torch.Tensor]:
    """The parameters after `steps` healthy steps at the wrong scaler's right answer (1024)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    scaler = ampkit.GradScaler("cpu", scaler="static", opt={"scaler.scale": 1024}, sync="step")
    for _ in range(steps):
        opt.zero_grad()
        scaler.scale(model(torch.ones(3, 4)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    return [p.detach().clone() for p in model.parameters()]


SCALES = [("0", "0"), ("nan", "nan"), ("-8", "-8")]


@pytest.mark.parametrize("sync", ["step", "deferred"])
@pytest.mark.parametrize("answer,shown", SCALES, ids=[a for a, _ in SCALES])
def test_a_wrong_scale_is_the_plugins_fault_and_never_trained_with(sync, answer, shown):
    # From its third scale() on (after two updates) the scaler answers the wrong value.
    done, error, params, taken = _train(sync, scaler=SCALER, opt={"scaler.answer": answer, "scaler.from_step": 2})
    assert isinstance(error, ampkit.PluginError), error
    text = str(error)
    assert len(text.splitlines()) == 1, text
    assert text.startswith("scaler 'wrong_scale' ") and SCALER in text, text
    assert f"answered {shown} from scale(): a loss scale must be finite and > 0" in text, text
    # The update() that made it the scale raised; the two steps before it were taken at 1024.
    assert done == 1 and taken == 2
    assert all(torch.equal(a, b) for a, b in zip(params, _good_parameters(2)))


@pytest.mark.parametrize("sync", ["step", "deferred"])
def test_a_scale_outside_the_bounds_a_scaler_declares_is_refused(sync):
    done, error, _, taken = _train(
        sync, scaler=SCALER, opt={"scaler.answer": "1e30", "scaler.from_step": 2, "scaler.rule": "dynamic"}
    )
    assert isinstance(error, ampkit.PluginError), error
    assert "answered 1e+30 from scale(): outside the bounds [1, 65536] its device rule declares" in str(error)
    assert done == 1 and taken == 2


PARTED = [  # (arguments, the plugin named, the deferred step whose record shows the difference)
    ({"scaler": SCALER, "opt": {"scaler.answer": "512", "scaler.from_step": 2}}, "scaler 'wrong_scale'", 1),
    (
        {"nan_policy": POLICY, "opt": {"nan_policy.action": "1", "nan_policy.from_step": 2}},
        "nan_policy 'wrong_action'",
        2,
    ),
]


@pytest.mark.parametrize("sync", ["step", "deferred"])
@pytest.mark.parametrize("kwargs,plugin,step", PARTED, ids=["scaler", "policy"])
def test_a_host_form_that_parts_from_its_device_rule_is_that_plugins_fault(sync, kwargs, plugin, step):
    # A scale of 512 (its rule keeps 1024; the next scale after two updates) and a skip are answers a
    # step can use: the synchronous step takes them; the deferred one finds them apart from the rule
    # the plugin declared, and names the plugin, never "internal".
    done, error, params, _ = _train(sync, **kwargs)
    assert all(torch.isfinite(p).all() for p in params)
    if sync == "step":
        assert error is None and done == STEPS
        return
    assert isinstance(error, ampkit.PluginError), error
    text = str(error)
    assert text.startswith(plugin + " ") and len(text.splitlines()) == 1, text
    assert f": its host form and the device rule it declares disagree at deferred step {step}: " in text, text


ACTIONS = [
    ("77", "answered action 77 from decide(): not one of proceed, skip, skip_backoff, rollback, abort, clip"),
    ("3", "answered rollback from decide(): it declares no rollback plan (rollback_plan())"),
]


@pytest.mark.parametrize("sync", ["step", "deferred"])
@pytest.mark.parametrize("action,message", ACTIONS, ids=["out_of_range", "rollback"])
def test_an_action_the_host_cannot_carry_out_is_the_policys_fault(sync, action, message):
    done, error, params, taken = _train(
        sync, nan_policy=POLICY, opt={"nan_policy.action": action, "nan_policy.from_step": 2}
    )
    assert isinstance(error, ampkit.PluginError), error
    text = str(error)
    assert len(text.splitlines()) == 1 and text.startswith("nan_policy 'wrong_action' "), text
    assert message in text, text
    assert all(torch.isfinite(p).all() for p in params)
    # Never taken as a skip: the synchronous step stops before step 2 is applied; the deferred one
    # has applied it on the device by its rule (the host forms meet the answer on delivery).
    assert (done, taken) == ((2, 2) if sync == "step" else (2, 3))


@pytest.mark.parametrize("sync", ["step", "deferred"])
def test_a_policys_own_abort_is_training_aborted_on_both_paths(sync):
    done, error, _, _ = _train(sync, nan_policy=POLICY, opt={"nan_policy.action": "4", "nan_policy.from_step": 2})
    assert isinstance(error, ampkit.TrainingAborted), error
    # Named as ampkit-train's exit line names it: the plugin, then the step it stopped at.
    assert str(error) == "nan_policy 'wrong_action' aborted training at step 2: the test policy's answer", error
    assert done == 2


def _ampkit_train(sync: str, folder: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(  # in `folder`: an abort writes its NaN report there
        [
            "timeout",
            "120",
            os.path.join(BUILD, "bin", "ampkit-train"),
            "--workload",
            "synthetic",
            "--threads",
            "1",
            "--progress",
            "never",
            "--steps",
            "8",
            "--host-sync",
            sync,
            *args,
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, AMPKIT_PLUGIN_PATH=""),
        cwd=folder,
    )


TRAIN_CASES: Dict[str, Tuple[List[str], int, str]] = {
    "scale_0": (["--scaler", SCALER, "--opt", "scaler.answer=0"], 3, "answered 0 from scale()"),
    "scale_nan": (["--scaler", SCALER, "--opt", "scaler.answer=nan"], 3, "answered nan from scale()"),
    "scale_-8": (["--scaler", SCALER, "--opt", "scaler.answer=-8"], 3, "answered -8 from scale()"),
    "action_77": (["--nan-policy", POLICY], 3, "answered action 77 from decide()"),
    "rollback": (["--nan-policy", POLICY, "--opt", "nan_policy.action=3"], 3, "answered rollback from decide()"),
    "parted_scale": (["--scaler", SCALER, "--opt", "scaler.answer=512"], 3, "disagree at deferred step 1"),
    "parted_policy": (["--nan-policy", POLICY, "--opt", "nan_policy.action=1"], 3, "disagree at deferred step 2"),
    "abort": (
        ["--nan-policy", POLICY, "--opt", "nan_policy.action=4"],
        5,
        "training aborted by nan_policy 'wrong_action' at step 2: the test policy's answer",
    ),
}


@pytest.mark.parametrize("sync", ["step", "deferred"])
@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_ampkit_train_exits_naming_the_plugin(sync, case, tmp_path):
    args, code, message = TRAIN_CASES[case]
    if case.startswith("parted_") and sync == "step":
        code, message = 0, ""  # a usable answer: only the deferred step has a rule to compare it with
    run = _ampkit_train(sync, str(tmp_path), *args)
    assert run.returncode == code, run.stderr
    assert "the step stays synchronous" not in run.stderr  # deferred ran where asked for
    # A warning about a constant scale at fp32 may come first, an abort's NaN-report line too.
    lines = [line for line in run.stderr.strip().splitlines() if not line.startswith("ampkit-train: warning: ")]
    if code == 0:  # each skip has its NaN-report line
        assert not any(line.startswith("ampkit-train: error") for line in lines), lines
        return
    if code == 5:
        assert len(lines) == 2 and lines[0].startswith("ampkit-train: step 2: the test policy's answer"), lines
        assert lines[1] == f"ampkit-train: {message}", lines
        return
    assert len(lines) == 1, run.stderr
    plugin = "scaler 'wrong_scale'" if args[0] == "--scaler" else "nan_policy 'wrong_action'"
    assert lines[0].startswith(f"ampkit-train: error: {plugin} "), lines[0]
    assert message in lines[0], lines[0]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
