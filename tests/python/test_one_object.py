"""ampkit.GradScaler is one object: a torch.amp.GradScaler subclass that owns torch's call-order
state and calls its helpers, never inherits them (docs/python.md, "GradScaler"), over one typed
face of its C++ side."""

import base64
import inspect
import os
import pickle
import re

import torch

import ampkit
from ampkit import _deferred, _scaler_core

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "ampkit")


def test_its_mro_holds_no_ampkit_class_but_itself():
    mro = ampkit.GradScaler.__mro__
    ours = [c for c in mro if c.__module__.split(".")[0] == "ampkit"]
    assert ours == [ampkit.GradScaler]
    assert mro[1] is torch.amp.GradScaler
    assert len(mro) == len(torch.amp.GradScaler.__mro__) + 1


def test_only_the_typed_wrapper_touches_the_cpp_class():
    # Every call into torch.classes.ampkit.ScalerCore goes through ampkit._scaler_core.ScalerCore,
    # whose methods mypy checks; the custom class itself is typed Any by torch.
    touching = []
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
                if re.search(r"classes\.ampkit\.ScalerCore", f.read()):
                    touching.append(name)
    assert touching == ["_scaler_core.py"]
    scaler = ampkit.GradScaler("cpu")
    assert isinstance(scaler._core, _scaler_core.ScalerCore)
    signature = inspect.signature(_scaler_core.ScalerCore.unscale)
    assert list(signature.parameters) == ["self", "slot", "fold", "loss"]


def test_the_iteration_is_counted_once_in_torchs_per_optimizer_records():
    # The deferred step keeps no count of its own: how many optimizers an iteration unscaled is read
    # from the per-optimizer records, which update() starts afresh.
    mode = _deferred.DeferredMode("auto")
    assert not hasattr(mode, "steps_in_iteration") and not hasattr(mode, "in_iteration")
    model = torch.nn.Linear(4, 2)
    opts = [torch.optim.SGD([model.weight], lr=0.1), torch.optim.SGD([model.bias], lr=0.1)]
    scaler = ampkit.GradScaler("cpu", sync="step")
    for _ in range(2):
        scaler.scale(model(torch.ones(3, 4)).sum()).backward()
        for i, opt in enumerate(opts):
            assert scaler.step(opt) is True
            unscaled = [s["unscaled"] for s in scaler._per_optimizer_states.values()]
            assert unscaled == [True] * (i + 1)
        scaler.update()
        assert len(scaler._per_optimizer_states) == 0
    assert scaler.get_scale() == 65536.0


# A GradScaler pickled by the ampkit whose GradScaler was assembled from mixins (its whole __dict__):
# GradScaler("cpu", init_scale=128.0, growth_interval=3, clipper="norm", opt={"clipper.max_norm": 0.5})
# after two clean steps of an SGD over a Linear(3, 2).
_MIXIN_LAYOUT_PICKLE = (
    "gASVsQUAAAAAAACMEmFtcGtpdC5ncmFkX3NjYWxlcpSMCkdyYWRTY2FsZXKUk5QpgZR9lCiMB19kZXZpY2WUjANjcHWUjAhfZW5h"
    "YmxlZJSIjAdfY29uZmlnlH2UKIwHcGx1Z2luc5R9lCiMBnNjYWxlcpSMB2R5bmFtaWOUjAdjbGlwcGVylIwEbm9ybZSMCm5hbl9w"
    "b2xpY3mUjARza2lwlHWMA29wdJR9lCiMEXNjYWxlci5pbml0X3NjYWxllIwFMTI4LjCUjBZzY2FsZXIuZ3Jvd3RoX2ludGVydmFs"
    "lIwBM5SMEGNsaXBwZXIubWF4X25vcm2UjAMwLjWUdYwJcHJlY2lzaW9ulIwEZnAxNpSMC3BsdWdpbl9kaXJzlF2UjA9hbGxvd191"
    "bnRydXN0ZWSUiYwMc3RhdHNfcmVjaXBllIwJYXV0b21hdGljlIwOcGx1Z2luX3RpbWVvdXSUSx51jAtfdG9yY2hfYXJnc5R9lCiM"
    "CmluaXRfc2NhbGWUR0BgAAAAAAAAjA1ncm93dGhfZmFjdG9ylEdAAAAAAAAAAIwOYmFja29mZl9mYWN0b3KURz/gAAAAAAAAjA9n"
    "cm93dGhfaW50ZXJ2YWyUSwN1jAZfbW9kZWyUTowGX25hbWVzlH2UjAVfY29yZZROjAZfc2NhbGWUTowRX3NjYWxlX3Blcl9kZXZp"
    "Y2WUfZSMFV9wZXJfb3B0aW1pemVyX3N0YXRlc5R9lIwLX2xhc3RfdGFrZW6UTowJX2xvc3Nfc3VtlE6MC19sb3NzX2NvdW50lEsA"
    "jApfcGFzc19sb3NzlIiMBl9ib3VuZJROjApfbmV4dF9zbG90lEsBjAtfZnVzZWRfYXJnc5R9lIwOX2ZhbGxiYWNrX3NhaWSUiYwJ"
    "X2RlZmVycmVklIwQYW1wa2l0Ll9kZWZlcnJlZJSMDERlZmVycmVkTW9kZZSTlCmBlH2UKIwEc3luY5SMBGF1dG+UjARjdWRhlImM"
    "BGNvcmWUTowQc2luZ2xlX29wdGltaXplcpROjARzbG90lE6MBXNjYWxllE6MB3JlZnVzZWSUfZSMBHNhaWSUj5SMDGluX2l0ZXJh"
    "dGlvbpSJjBJzdGVwc19pbl9pdGVyYXRpb26USwCMDm1vbWVudHVtX3JlYWR5lI+UjA9tb21lbnR1bV9ob29rZWSUj5SMA3doeZSM"
    "R3RoZSBmaXJzdCBpdGVyYXRpb24gaXMgc3luY2hyb25vdXMsIHRvIHNlZSBob3cgbWFueSBvcHRpbWl6ZXJzIGl0IHN0ZXBzlIwE"
    "bGFzdJSMBHN0ZXCUjAtsYXN0X3JlYXNvbpSMC25vIHN0ZXAgeWV0lHVijAZfZ3JvdXCUjBhhbXBraXQuX3N0YXRpc3RpY3NfZ3Jv"
    "dXCUjA9TdGF0aXN0aWNzR3JvdXCUk5QpgZR9lCiMDXByb2Nlc3NfZ3JvdXCUTowMYXZlcmFnZV9sb3NzlIl1YowIX2luaXRpYWyU"
    "R0BgAAAAAAAASwCGlIwSX3Bhc3N0aHJvdWdoX3N0ZXBzlEsAjAtfY29yZV93b3JsZJRLAYwQX2NvcmVfZ2VuZXJhdGlvbpRLAYwR"
    "X3NhdmVkX3N0YXRlX2RpY3SUfZQoaEZHQGAAAAAAAABoJUdAAAAAAAAAAGgmRz/gAAAAAAAAaCdLA4wPX2dyb3d0aF90cmFja2Vy"
    "lEsCjAZhbXBraXSUfZQoaAx9lCiMBnBsdWdpbpSMB2R5bmFtaWOUjAVzdGF0ZZR9lCiMDmdyb3d0aF90cmFja2VylEsCjBJoeXN0"
    "ZXJlc2lzX3RyYWNrZXKUSwGMBXNjYWxllEdAYAAAAAAAAHV1aA59lChoaowEbm9ybZRobH2UdWgQfZQoaGqMBHNraXCUaGx9lCiM"
    "EGdyYWRfbm9ybV93aW5kb3eUXZSMC2xvc3Nfd2luZG93lF2UdXV1dXViLg=="
)


def test_a_scaler_pickled_by_the_mixin_layout_loads_and_trains_on():
    scaler = pickle.loads(base64.b64decode(_MIXIN_LAYOUT_PICKLE))
    assert scaler.get_scale() == 128.0 and scaler.get_growth_interval() == 3
    assert scaler.state_dict()["_growth_tracker"] == 2
    assert ("max_norm", "0.5") == scaler.plugin_options("clipper")[0][:2]
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(2, 3)).sum()).backward()
    assert scaler.step(opt) is True
    scaler.update()
    assert scaler.get_scale() == 256.0  # the third clean step of interval 3 grows
