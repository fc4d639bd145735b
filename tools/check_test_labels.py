#!/usr/bin/env python3
"""Every ctest test of a build folder has exactly one primary label.

  tools/check_test_labels.py BUILD_DIR

Primary labels: unit, e2e, slow, dist, install, fuzz. Secondary ones (gpu: needs a GPU; python:
the Python package, left out of the instrumented suite) may be added; any other label is an error.
Reads `ctest --show-only=json-v1`; prints one line per offending test and exits 1, or says how many
tests it checked and exits 0.
"""
import json
import subprocess
import sys

PRIMARY = {"unit", "e2e", "slow", "dist", "install", "fuzz"}
SECONDARY = {"gpu", "python"}


def labels_of(test):
    for prop in test.get("properties", []):
        if prop.get("name") == "LABELS":
            return list(prop.get("value", []))
    return []


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_test_labels.py BUILD_DIR")
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=sys.argv[1], check=True, capture_output=True,
                         text=True).stdout
    tests = json.loads(out)["tests"]
    bad = []
    for t in tests:
        labels = labels_of(t)
        primary = [l for l in labels if l in PRIMARY]
        unknown = [l for l in labels if l not in PRIMARY | SECONDARY]
        if len(primary) != 1 or unknown:
            bad.append(f"{t['name']}: labels {labels or 'none'}; needs exactly one of {sorted(PRIMARY)}"
                       + (f" (unknown: {unknown})" if unknown else ""))
    for line in bad:
        print(line)
    if bad:
        sys.exit(1)
    print(f"{len(tests)} tests, each with one primary label")


if __name__ == "__main__":
    main()
