#!/usr/bin/env python3
"""Golden loss-scale sequences of DeepSpeed's own DynamicLossScaler, 0.17.0 and 0.17.1, written to
tests/data/deepspeed_scaler_goldens.json.

ampkit's DeepSpeed mapping (core/config/src/deepspeed_config.cpp) claims DeepSpeed's rules: with
deepspeed_version 0.17.0 the `dynamic` scaler as it is, with 0.17.1 (the default) the same scaler
with growth_delay=1, because DeepSpeed 0.17.1 (PR #6976) counts `iterations since the last
overflow - 1`, so its scale grows one clean step later at the start and after every overflow.
This script runs DeepSpeed's real DynamicLossScaler.update_scale of both releases over fixed
overflow patterns and records the scale after every step (and the step at which DeepSpeed raises
at the minimum scale), so the tests compare ampkit step for step with ==.

DeepSpeed is no dependency of ampkit, and is not installed for this: the script reads
deepspeed/runtime/fp16/loss_scaler.py out of the two releases' source archives from PyPI (their
sha256 are pinned below, so a changed file is refused) and loads that module with importlib.
The module imports `deepspeed.comm` (for get_rank, which only decides whether to log),
`deepspeed.utils.logger` (logging) and, in 0.17.1, `deepspeed.runtime.config_utils.
DeepSpeedConfigObject` (a base class whose only use is printing the config); those three are
stubbed, as update_scale's rule uses none of them. torch is the real one. Run from the
repository root:

    pip download deepspeed==0.17.0 --no-deps --no-binary :all: -c tools/constraints.txt -d /tmp/ds
    pip download deepspeed==0.17.1 --no-deps --no-binary :all: -c tools/constraints.txt -d /tmp/ds
    python3 tools/golden/deepspeed_scaler_goldens.py --sdist-dir /tmp/ds            # rewrites the file
    python3 tools/golden/deepspeed_scaler_goldens.py --sdist-dir /tmp/ds --check    # exits 1 if it would change

A DeepSpeed git clone with its release tags works too: `--git DIR` reads the file at v0.17.0 and
v0.17.1 (the same bytes as the archives; the sha256 check applies).
"""

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import types

OUTPUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "deepspeed_scaler_goldens.json")
MEMBER = "deepspeed/runtime/fp16/loss_scaler.py"
# sha256 of MEMBER in each release (identical in the PyPI sdist and at the git tag).
PINNED = {
    "0.17.0": "dd28cf3ca49e4489ac299f9f2105aaa23dd697b84adcdcf626718b1a741a4512",
    "0.17.1": "ec4df2ccc2441736ca70847669e531f7ef46ac1ebfdac1afe70397f0d67a7b36",
}


def read_source(version, sdist_dir, git_dir):
    if git_dir:
        data = subprocess.run(
            ["git", "-C", git_dir, "show", f"v{version}:{MEMBER}"], check=True, capture_output=True
        ).stdout
    else:
        with tarfile.open(os.path.join(sdist_dir, f"deepspeed-{version}.tar.gz")) as tar:
            data = tar.extractfile(f"deepspeed-{version}/{MEMBER}").read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != PINNED[version]:
        sys.exit(f"{MEMBER} of DeepSpeed {version} has sha256 {digest}, expected {PINNED[version]}")
    return data


def load_scaler_module(version, source):
    """DeepSpeed's loss_scaler module of `version`, with only its logging imports stubbed."""
    stubs = {
        "deepspeed": types.ModuleType("deepspeed"),
        "deepspeed.comm": types.ModuleType("deepspeed.comm"),
        "deepspeed.utils": types.ModuleType("deepspeed.utils"),
        "deepspeed.runtime": types.ModuleType("deepspeed.runtime"),
        "deepspeed.runtime.config_utils": types.ModuleType("deepspeed.runtime.config_utils"),
    }
    stubs["deepspeed.comm"].get_rank = lambda: 0
    stubs["deepspeed"].comm = stubs["deepspeed.comm"]
    stubs["deepspeed.utils"].logger = logging.getLogger("deepspeed-stub")
    stubs["deepspeed.runtime.config_utils"].DeepSpeedConfigObject = type("DeepSpeedConfigObject", (), {})
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"loss_scaler_{version.replace('.', '_')}.py")
            with open(path, "wb") as f:
                f.write(source)
            spec = importlib.util.spec_from_file_location(f"deepspeed_loss_scaler_{version.replace('.', '_')}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module


# DynamicLossScaler's constructor arguments (as DeepSpeed's config maps them: init_scale =
# 2**initial_scale_power, scale_window = loss_scale_window, delayed_shift = hysteresis); the tests
# map the matching DeepSpeed config keys and must arrive at the same scaler.
CONFIGS = {
    "window3_hysteresis1": dict(init_scale=2**10, scale_window=3, min_scale=1, delayed_shift=1),
    "window3_hysteresis2": dict(init_scale=2**10, scale_window=3, min_scale=1, delayed_shift=2),
    "window1_hysteresis1": dict(init_scale=2**6, scale_window=1, min_scale=1, delayed_shift=1),
    "window2_hysteresis3": dict(init_scale=2**8, scale_window=2, min_scale=1, delayed_shift=3),
    "window3_min_scale_clamp": dict(init_scale=2**4, scale_window=3, min_scale=4, delayed_shift=1),
    "window3_hysteresis2_min_scale_clamp": dict(init_scale=2**3, scale_window=3, min_scale=2, delayed_shift=2),
    "window4_min_scale_raises": dict(init_scale=2**3, scale_window=4, min_scale=1, delayed_shift=1),
    "window3_hysteresis2_min_scale_raises": dict(init_scale=2**2, scale_window=3, min_scale=1, delayed_shift=2),
}
for _name, _config in CONFIGS.items():
    _config["consecutive_hysteresis"] = False  # ampkit refills hysteresis only at a growth
    _config["raise_error_at_min_scale"] = "raises" in _name


def patterns():
    """Overflow patterns ('x' overflows, '.' is clean): hand-written edges, then seeded random ones."""
    fixed = {
        "clean": "." * 14,
        "first_step_overflows": "x" + "." * 10,
        "overflow_after_window": "...x......x.......",
        "pairs": "..xx....xx.....xx......",
        "bursts": "xxxx........xxx.........",
        "alternating": "x.x.x.x.x.x.",
        "late": "." * 9 + "x" + "." * 9 + "x.",
    }
    rng = random.Random(20261205)
    for i in range(4):
        fixed[f"random{i}"] = "".join("x" if rng.random() < 0.25 else "." for _ in range(48))
    return fixed


def run(module, config, pattern):
    """Scale after each step; stops at the step where DeepSpeed raises (its index, else None)."""
    args = dict(config)
    scaler = module.DynamicLossScaler(**args)
    scales = []
    for step, mark in enumerate(pattern):
        try:
            scaler.update_scale(mark == "x")
        except Exception as e:  # DeepSpeed raises a bare Exception at the minimum scale
            if "minimum" not in str(e):
                raise
            return scales, step
        scales.append(float(scaler.cur_scale))
    return scales, None


def build(sdist_dir, git_dir):
    modules = {v: load_scaler_module(v, read_source(v, sdist_dir, git_dir)) for v in sorted(PINNED)}
    cases = []
    for config_name, config in CONFIGS.items():
        for pattern_name, pattern in patterns().items():
            case = {"name": f"{config_name}/{pattern_name}", "scaler": config, "overflows": pattern}
            for version, module in modules.items():
                scales, raised_at = run(module, config, pattern)
                case[version] = {"scales": scales, "raises_at": raised_at}
            cases.append(case)
    return {
        "about": "DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py) of "
        "releases 0.17.0 and 0.17.1, run over fixed overflow patterns ('x' overflows): the scale after "
        "each step, and the step at which DeepSpeed raises at the minimum scale (null: never). "
        "Written by tools/golden/deepspeed_scaler_goldens.py; do not edit.",
        "sources": {v: {"file": MEMBER, "sha256": PINNED[v]} for v in sorted(PINNED)},
        "cases": cases,
    }


def render(goldens):
    """The JSON text: one line per case, so a diff shows which sequence changed."""
    head = {k: v for k, v in goldens.items() if k != "cases"}
    lines = [json.dumps(case) for case in goldens["cases"]]
    return json.dumps(head, indent=1)[:-2] + ',\n "cases": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--sdist-dir", help="folder holding deepspeed-0.17.0.tar.gz and deepspeed-0.17.1.tar.gz")
    source.add_argument("--git", help="a DeepSpeed git clone with tags v0.17.0 and v0.17.1")
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file would change")
    args = parser.parse_args()
    text = render(build(args.sdist_dir, args.git))
    if args.check:
        with open(args.output) as f:
            same = f.read() == text
        print(("unchanged: " if same else "would change: ") + args.output)
        return 0 if same else 1
    with open(args.output, "w") as f:
        f.write(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
