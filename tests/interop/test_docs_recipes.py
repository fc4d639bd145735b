#!/usr/bin/env python3
"""Every shell recipe in README.md and docs/ that reads a metrics file (a line of a fenced block that
starts with `jq` or `python3 tools/plot_run.py` and names a .jsonl file) runs on the metrics of a
short fp16 run with real overflows and a NaN: it must exit 0 with nothing on stderr, and the
loss-scaling recipes must print what they promise, counted against the file.

    test_docs_recipes.py BIN_DIR SOURCE_DIR
"""
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile

RECIPE = re.compile(r"^(jq |python3 tools/plot_run\.py )")


def recipes(source):
    found = []
    files = [os.path.join(source, "README.md")] + sorted(
        os.path.join(source, "docs", n) for n in os.listdir(os.path.join(source, "docs")) if n.endswith(".md"))
    for path in files:
        fenced = False
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if line.startswith("```"):
                    fenced = not fenced
                    continue
                line = line.strip()
                if fenced and RECIPE.match(line) and ".jsonl" in line:
                    found.append((f"{os.path.relpath(path, source)}:{number}", line))
    return found


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def main():
    bin_dir, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    found = recipes(source)
    # 3 jq recipes in loss-scaling.md, plot_run.py in README.md and benchmarks.md.
    if len(found) < 5:
        fail(f"expected at least 5 recipes on metrics files, found {len(found)}: {found}")
    with tempfile.TemporaryDirectory() as tmp:
        # fp16 with a scale far too high: the first steps overflow (their gradients are inf, then
        # NaN), the scale backs off and regrows every 10 steps; a NaN loss is planted at step 30.
        train = [os.path.join(bin_dir, "ampkit-train"), "--workload", "synthetic", "--precision", "fp16",
                 "--steps", "60", "--scaler", "dynamic", "--opt", "scaler.init_scale=1e9",
                 "--opt", "scaler.growth_interval=10", "--inject", "nan@step=30", "--progress", "never",
                 "--metrics", "run.jsonl"]
        done = subprocess.run(train, cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0:
            fail(f"training run: exit {done.returncode}: {done.stderr}")
        with open(os.path.join(tmp, "run.jsonl")) as f:
            records = [json.loads(line) for line in f]
        overflowed = [r for r in records if r["found_inf"]]
        strings = [r for r in overflowed if isinstance(r["grad_max_abs"], str)]
        if len(overflowed) < 10 or not strings:
            fail(f"the run must overflow with non-finite gradients: {len(overflowed)} overflowed steps, "
                 f"{len(strings)} with a non-finite grad_max_abs")
        hidden = [r["step"] for r in records if r["grad_norm"] == "nan" and r["grad_max_abs"] != "nan"]
        if hidden:
            fail(f"steps {hidden}: NaN gradients (grad_norm nan) but a grad_max_abs that is not nan")
        for where, line in found:
            words = shlex.split(line, comments=True)
            words = [os.path.join(source, w) if w.startswith("tools/") else w for w in words]
            words = ["run.jsonl" if w.endswith(".jsonl") else w for w in words]
            words = [os.path.join(tmp, "plot.png") if w.endswith(".png") else w for w in words]
            ran = subprocess.run(words, cwd=tmp, capture_output=True, text=True)
            if ran.returncode != 0 or ran.stderr.strip():
                fail(f"{where}: `{line}` exit {ran.returncode}: {ran.stderr.strip()[:400]}")
            rows = [r.split("\t") for r in ran.stdout.splitlines()]
            if "select(.found_inf)" in line and len(rows) != len(overflowed):
                fail(f"{where}: {len(rows)} rows for {len(overflowed)} overflowed steps")
            if "select(.scale != .scale_next)" in line:
                changes = [r for r in records if r["scale"] != r["scale_next"]]
                if len(rows) != len(changes) or len(changes) < len(overflowed):
                    fail(f"{where}: {len(rows)} rows for {len(changes)} changes of scale")
            if "65504" in line and "range(1; length)" in line:  # the step before each overflow
                want = [(r["step"], p["grad_max_abs"] * p["scale"] / 65504) for p, r in zip(records, records[1:])
                        if r["found_inf"] and not isinstance(p["grad_max_abs"], str)]
                if len(rows) != len(want) or not want:
                    fail(f"{where}: {len(rows)} rows for {len(want)} overflows after a clean step")
                for (step, ratio), row in zip(want, rows):
                    if int(row[0]) != step or not math.isclose(float(row[2]), ratio, rel_tol=1e-5, abs_tol=1e-12):
                        fail(f"{where}: printed {row}, expected step {step} and ratio {ratio}")
            elif "65504" in line:
                if len(rows) != len(records):
                    fail(f"{where}: {len(rows)} rows for {len(records)} steps")
                for r, row in zip(records, rows):
                    want = r["grad_max_abs"]
                    got = row[2]
                    ok = got == want if isinstance(want, str) else math.isclose(
                        float(got), want * r["scale"] / 65504, rel_tol=1e-5, abs_tol=1e-12)
                    if not ok:
                        fail(f"{where}: step {r['step']}: printed {got}, grad_max_abs {want}, scale {r['scale']}")
            if "plot_run.py" in line and os.path.getsize(os.path.join(tmp, "plot.png")) < 10000:
                fail(f"{where}: the plot is {os.path.getsize(os.path.join(tmp, 'plot.png'))} bytes")
            print(f"ok {where}: {line[:90]} ({len(rows)} rows)")
    print(f"{len(found)} recipes ran on {len(records)} steps with {len(overflowed)} overflows")


if __name__ == "__main__":
    main()
