#!/usr/bin/env python3
"""What `import ampkit` costs against `import torch`, which it cannot avoid (docs/benchmarks.md).

Each measurement is a fresh interpreter that times one import statement with perf_counter (the
interpreter's own start is left out) and reports which heavy modules the import brought in. The
statements run interleaved (torch, ampkit, torch, ampkit, ...), so the machine's drift falls on
both alike; the table gives the median, minimum and maximum of --runs runs of each, and the ratio
of the medians. `import torch._dynamo` is measured too, as what an eager torch.compiler.disable
at import time would add. --also DIR adds a row for the ampkit package found in DIR (another
build's python/ folder, e.g. one from before a change), run interleaved with the others.

    PYTHONPATH=build/python bench/import_time.py [--runs 5] [--also DIR] [--json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

STATEMENTS = {
    "import torch": "import torch",
    "import ampkit": "import ampkit",
    "import torch; import torch._dynamo": "import torch, torch._dynamo",
}
WATCHED = ("torch._dynamo", "lightning", "accelerate", "transformers")

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
exec(sys.argv[1])
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "loaded": [m for m in sys.argv[2:] if m in sys.modules]}))
"""


def measure(statement, python, pythonpath=None):
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    done = subprocess.run([python, "-c", CHILD, statement, *WATCHED], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        sys.exit(f"import_time: `{statement}` failed: {lines[-1] if lines else done.returncode}")
    return json.loads(done.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="interpreters per statement (default 5)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--also", metavar="DIR", help="also time `import ampkit` with PYTHONPATH=DIR")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args()
    if args.runs < 1:
        sys.exit("import_time: --runs must be at least 1")
    cases = {name: (statement, None) for name, statement in STATEMENTS.items()}
    if args.also:
        cases[f"import ampkit ({args.also})"] = ("import ampkit", os.path.abspath(args.also))
    times = {name: [] for name in cases}
    loaded = {}
    for _ in range(args.runs):
        for name, (statement, pythonpath) in cases.items():
            got = measure(statement, args.python, pythonpath)
            times[name].append(got["seconds"])
            loaded[name] = got["loaded"]
    base = statistics.median(times["import torch"])
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        rows.append(
            {
                "statement": name,
                "median_s": median,
                "min_s": min(values),
                "max_s": max(values),
                "ratio_to_torch": median / base,
                "also_loaded": loaded[name],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{args.runs} fresh interpreters per statement, interleaved; seconds of the import alone")
    print(f"{'statement':<44} {'median':>8} {'min':>8} {'max':>8} {'x torch':>8}  also loaded")
    for r in rows:
        print(
            f"{r['statement']:<44} {r['median_s']:8.3f} {r['min_s']:8.3f} {r['max_s']:8.3f} "
            f"{r['ratio_to_torch']:8.2f}  {', '.join(r['also_loaded']) or '-'}"
        )


if __name__ == "__main__":
    main()
