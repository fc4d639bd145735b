#!/usr/bin/env python3
"""Start-up costs of the plugin system, each the median wall time of several runs:

  ampkit-plugins --help          the floor: process start, dynamic linking and the static
                                 initialisers of the linked libraries, no plugin work (the
                                 program does not link LibTorch: its registry calls nothing in it)
  ampkit-plugins list            target < 100 ms (reads the plugin files' ELF sections only)
  ampkit-plugins list --json     target < 100 ms
  ampkit-plugins check --json    every plugin probed in a child process (fork, load, create)
  check minus list --json        the probing part alone (per plugin: total / count)
  in-process load                every built-in plugin file dlopen'ed in one process that has
                                 LibTorch loaded already (as ampkit-train has), its entry point
                                 called and the descriptor's ABI read; target < 50 ms for all

`check --json` reports no timings of its own, so "in-process load" is measured by a python child
(ctypes) that mirrors the registry's load without its checks (trust, compatibility, the child
probe that RegistryOptions::probe adds before every load, Boost.DLL's bookkeeping, create()).

    bench/startup_time.py [--build build] [--runs 10] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROG = "startup_time"

# Runs in a fresh python: imports torch (loads LibTorch, untimed), then loads every plugin file
# given on the command line the way the registry does and prints the seconds for each.
IN_PROCESS = r"""
import ctypes, json, os, sys, time
import torch  # LibTorch resident first, as in ampkit-train; not timed
out = []
for path, symbol, abi in json.loads(sys.argv[1]):
    t0 = time.perf_counter()
    lib = ctypes.CDLL(path, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    # BOOST_DLL_ALIAS exports a variable holding the entry function's address.
    entry = ctypes.CFUNCTYPE(ctypes.c_void_p)(ctypes.c_void_p.in_dll(lib, symbol).value)
    descriptor = entry()
    got = ctypes.c_uint32.from_address(descriptor).value
    out.append([os.path.basename(path), time.perf_counter() - t0, got == abi])
print(json.dumps(out))
"""


def fail(message, code=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


def timed(cmd, ok_codes=(0,)):
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    if done.returncode not in ok_codes:
        lines = [l for l in done.stderr.splitlines() if l.strip()]
        fail(f"{' '.join(cmd)} exited with {done.returncode}: {lines[-1] if lines else 'no message'}", 1)
    return seconds, done.stdout


def median_ms(cmd, runs, ok_codes=(0,)):
    timed(cmd, ok_codes)  # one untimed run: page cache
    times = [timed(cmd, ok_codes)[0] for _ in range(runs)]
    return 1000.0 * statistics.median(times), 1000.0 * min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = lambda message: fail(f"{message} (see --help)")  # one line, no usage block
    ap.add_argument("--build", default="build", help="build folder holding bin/ampkit-plugins")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per measurement (median reported)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object instead of a table")
    args = ap.parse_args()
    if args.runs < 1:
        fail("--runs must be >= 1")
    tool = os.path.join(args.build, "bin", "ampkit-plugins")
    if not os.access(tool, os.X_OK):
        fail(f"{tool} not found; build first (tools/test.sh or tools/run.sh) or give --build")

    _, listing = timed([tool, "list", "--json"])
    try:
        plugins = json.loads(listing)["plugins"]
    except (ValueError, KeyError):
        fail(f"{tool} list --json printed no plugin list")
    files = [p for p in plugins if not p.get("static") and p.get("path") and p.get("compatible", True)]
    if not files:
        fail(f"{tool} list found no plugin files (search path: {json.loads(listing).get('search_path')})")

    rows = []  # (what, median ms, min ms, target ms or None)
    rows.append(("ampkit-plugins --help (floor: process start-up)", *median_ms([tool, "--help"], args.runs), None))
    rows.append(("ampkit-plugins list", *median_ms([tool, "list"], args.runs), 100.0))
    rows.append(("ampkit-plugins list --json", *median_ms([tool, "list", "--json"], args.runs), 100.0))
    check = median_ms([tool, "check", "--json"], args.runs, ok_codes=(0, 8))
    rows.append((f"ampkit-plugins check --json ({len(plugins)} plugins, child probes)", *check, None))
    probe_ms = check[0] - rows[2][1]
    rows.append(("  check minus list --json: probing all plugins", probe_ms, None, None))
    rows.append(("  per plugin", probe_ms / max(1, len(plugins)), None, None))

    spec = json.dumps([[p["path"], f"ampkit_v{p['abi']}_{p['kind']}_{p['name']}", p["abi"]] for p in files])
    loads = []
    for _ in range(args.runs):
        done = subprocess.run([sys.executable, "-c", IN_PROCESS, spec], capture_output=True, text=True)
        if done.returncode != 0:
            lines = [l for l in done.stderr.splitlines() if l.strip()]
            fail(f"the in-process load probe failed: {lines[-1] if lines else 'exit ' + str(done.returncode)}", 1)
        loads.append(json.loads(done.stdout.strip().splitlines()[-1]))
    totals = [1000.0 * sum(s for _, s, _ in run) for run in loads]
    bad_abi = sorted({name for run in loads for name, _, ok in run if not ok})
    rows.append((f"in-process load of all {len(files)} plugin files (dlopen + entry)", statistics.median(totals),
                 min(totals), 50.0))
    per_file = {name: 1000.0 * statistics.median(run[i][1] for run in loads) for i, (name, _, _) in enumerate(loads[0])}
    slowest = max(per_file, key=per_file.get)

    if args.json:
        print(json.dumps({"runs": args.runs, "rows": [{"what": w.strip(), "median_ms": m, "min_ms": lo, "target_ms": t}
                                                      for w, m, lo, t in rows],
                          "in_process_per_file_ms": per_file}, indent=2))
    else:
        print(f"median of {args.runs} runs each; 1-minute load average {os.getloadavg()[0]:.2f}\n")
        print(f"{'measurement':<66} {'median ms':>10} {'min ms':>8}  target")
        for what, med, lo, target in rows:
            verdict = "" if target is None else f"< {target:.0f} ms: {'met' if med < target else 'NOT met'}"
            print(f"{what:<66} {med:>10.1f} {'' if lo is None else format(lo, '.1f'):>8}  {verdict}")
        print(f"\nslowest plugin file in-process: {slowest} {per_file[slowest]:.2f} ms (median)")
    if bad_abi:
        print(f"{PROG}: warning: descriptor ABI differs from the ELF record in {', '.join(bad_abi)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
