#!/usr/bin/env python3
"""Golden loss-scale sequences of torch.amp.GradScaler, written to tests/data/gradscaler_sequences.json.

The `dynamic` scaler claims GradScaler's exact semantics (the scale is a float32; it is multiplied
by backoff_factor on an overflow, and by growth_factor after growth_interval clean steps in a row
unless the grown float32 value is not finite). This script runs the real GradScaler from pip
torch on CPU over scripted overflow patterns and records, for every step, the inputs and what
GradScaler did, so tests/plugins/scaler/test_scalers.cpp can compare step by step with ==.

An overflow is injected by writing inf into the gradient after backward, which is what an fp16
overflow looks like to GradScaler.unscale_ (called by step); the update then runs
torch._amp_update_scale_'s CPU kernel. Run from the repository root:

    python3 tools/golden/gradscaler_sequences.py            # rewrites tests/data/gradscaler_sequences.json
    python3 tools/golden/gradscaler_sequences.py --check    # exits 1 if the file would change

On a GPU, `--device cuda --output FILE` records torch.amp.GradScaler("cuda") instead (its
update is the CUDA kernel of _amp_update_scale_); tools/gpu-check.sh writes that file and runs
tests/engine/test_on_device.cpp against it on CUDA tensors (AMPKIT_GRADSCALER_GOLDENS=FILE).
"""
import argparse
import json
import os
import sys

import torch

OUTPUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "gradscaler_sequences.json")

# GradScaler's own defaults, recorded so the test can check that `dynamic`'s defaults are the same.
GRADSCALER_DEFAULTS = {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


def run_gradscaler(options, steps, overflow_steps, device="cpu"):
    """Runs GradScaler for `steps` optimizer steps; the steps in `overflow_steps` overflow."""
    param = torch.nn.Parameter(torch.ones(4, device=device))
    # lr 0: the parameter never changes, only the scaler's state is of interest.
    optimizer = torch.optim.SGD([param], lr=0.0)
    scaler = torch.amp.GradScaler(device, **options)
    found, used, after, tracker = [], [], [], []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        # A zero loss keeps the scaled gradients finite at any scale, up to float32's largest.
        scaler.scale((param * 0.0).sum()).backward()
        overflow = step in overflow_steps
        if overflow:
            param.grad[1] = float("inf")
        used.append(scaler.get_scale())
        scaler.step(optimizer)
        scaler.update()
        state = scaler.state_dict()
        found.append(1 if overflow else 0)
        after.append(state["scale"])
        tracker.append(int(state["_growth_tracker"]))
    return found, used, after, tracker


# name, what it exercises, GradScaler arguments (the rest default), steps, overflowing steps,
# extra ampkit options the test must add (GradScaler has no floor; ampkit's default min_scale is 1).
PATTERNS = [
    ("overflow_at_growth_boundary",
     "overflows on exactly the steps that would have grown the scale, and right after a growth",
     {"init_scale": 1024.0, "growth_interval": 4}, 24, {3, 11, 12, 19}, {}),
    ("consecutive_overflows",
     "ten overflows in a row halve the scale ten times; then it grows back every 5 clean steps",
     {"growth_interval": 5}, 40, set(range(2, 12)), {}),
    ("frequent_growth",
     "growth_interval 3 from scale 1: the scale grows about 60 times, with a few overflows",
     {"init_scale": 1.0, "growth_interval": 3}, 200, {50, 51, 120}, {}),
    ("growth_to_inf_refused_factor_2",
     "starting at 2**127, doubling would give inf: GradScaler keeps the scale and resets the tracker",
     {"init_scale": 2.0**127, "growth_interval": 2}, 14, {5}, {}),
    ("growth_to_inf_refused_factor_4",
     "growth by 4 from 2**125 reaches 2**127 once, then 2**129 is refused every time",
     {"init_scale": 2.0**125, "growth_factor": 4.0, "growth_interval": 1}, 8, {4}, {}),
    ("growth_near_float_max_rounding",
     "growth by 1.1 from 3e38: a product just above float32's largest value rounds to it or to inf",
     {"init_scale": 3.0e38, "growth_factor": 1.1, "growth_interval": 1}, 6, set(), {}),
    ("default_options_4100_steps",
     "GradScaler's defaults (65536, 2, 0.5, 2000) over 4100 steps: growth at 2007 and 4011",
     {}, 4100, {7, 2010, 2011}, {}),
    ("factors_3_and_0_25",
     "growth 3.0 and backoff 0.25 from 1000: powers of 3 leave float32's 24-bit mantissa",
     {"init_scale": 1000.0, "growth_factor": 3.0, "backoff_factor": 0.25, "growth_interval": 2},
     60, {9, 10, 31, 44}, {}),
    ("factors_1_7_and_0_3",
     "growth 1.7 and backoff 0.3 (neither exact in binary): every update rounds to float32",
     {"init_scale": 12345.0, "growth_factor": 1.7, "backoff_factor": 0.3, "growth_interval": 3},
     80, {4, 5, 6, 40, 41, 77}, {}),
    ("backoff_below_one",
     "twelve overflows from scale 4 reach 2**-10: GradScaler has no floor (ampkit needs min_scale)",
     {"init_scale": 4.0, "growth_interval": 10}, 30, set(range(0, 12)), {"min_scale": 2.0**-20}),
]


def build(device="cpu"):
    patterns = []
    for name, description, options, steps, overflow_steps, ampkit_options in PATTERNS:
        found, used, after, tracker = run_gradscaler(options, steps, overflow_steps, device)
        patterns.append({
            "name": name,
            "description": description,
            "options": options,
            "ampkit_options": ampkit_options,
            "steps": steps,
            "found_inf": found,
            "scale": used,
            "scale_next": after,
            "growth_tracker": tracker,
        })
    return {
        "generator": "tools/golden/gradscaler_sequences.py",
        "reference": f"torch.amp.GradScaler('{device}') from pip torch " + torch.__version__.split("+")[0],
        "gradscaler_defaults": GRADSCALER_DEFAULTS,
        "patterns": patterns,
    }


def dump(data):
    # One pattern field per line keeps the file diffable; floats are written with repr, which
    # round-trips float32 values (held in doubles) exactly.
    lines = ["{"]
    head = [k for k in data if k != "patterns"]
    for k in head:
        lines.append("  %s: %s," % (json.dumps(k), json.dumps(data[k])))
    lines.append('  "patterns": [')
    for i, p in enumerate(data["patterns"]):
        fields = ["    %s: %s" % (json.dumps(k), json.dumps(v, separators=(",", ":"))) for k, v in p.items()]
        lines.append("   {\n" + ",\n".join(fields) + "\n   }" + ("," if i + 1 < len(data["patterns"]) else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file would change")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="GradScaler's device (default cpu)")
    parser.add_argument("--output", default=OUTPUT, help="file to write (default tests/data/gradscaler_sequences.json)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gradscaler_sequences.py: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    text = dump(build(args.device))
    if args.check:
        with open(args.output) as f:
            if f.read() != text:
                print(f"{args.output} is out of date", file=sys.stderr)
                return 1
        return 0
    with open(args.output, "w") as f:
        f.write(text)
    print("wrote", os.path.normpath(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
