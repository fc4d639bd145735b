#!/usr/bin/env python3
"""Fuzz-style command-line test: randomly mutated command lines and environments for
`ampkit-train --print-config` (never trains), `ampkit-plugins show|list` and `ampkit-launch ... --
/bin/true`, seeded so that every run is the same. Each outcome is classified by exit code, signal
and stderr lines. It fails on:

  * a signal (a crash or an abort) or a hang (10 s);
  * an uncaught exception ("internal error", or exit 1 from ampkit-train or ampkit-plugins, whose
    exit 1 is reserved for bugs);
  * a usage error (exit 2) whose stderr has more than 3 lines;
  * an exit code the program does not document.

    tools/cli_fuzz.py [--build build] [--runs 300] [--seed 1] [--show 5]

Prints the outcome table and, for each failure, the exact command to reproduce it (shell-quoted,
with its environment). Exit status: 0 when nothing failed, 1 otherwise, 2 on a bad argument.
"""
import argparse
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile

DOCUMENTED = {  # core/common/include/ampkit/exit_codes.h and each program's --help
    "ampkit-train": {0, 2, 3, 4, 5, 6, 7, 9, 130},
    "ampkit-plugins": {0, 2, 3, 8},
    "ampkit-launch": {0, 2, 7},
}
TRAIN_OPTIONS = ["--workload", "--precision", "--steps", "--epochs", "--batch-size", "--lr", "--seed", "--scaler",
                 "--clipper", "--nan-policy", "--comm", "--opt", "--config", "--accumulate", "--device", "--metrics",
                 "--summary", "--checkpoint-dir", "--resume", "--inject", "--eval-batches", "--threads",
                 "--plugin-dir", "--dist-timeout", "--init-from", "--tensorboard", "--layer-norms", "--progress",
                 "--allow-untrusted-plugins", "--world-size", "--rank", "--weights-only", "--lr-schedule",
                 "--warmup-steps", "--synthetic-width", "--gpt-layers", "--nosuch-option", "-x", "--"]
PLUGIN_NAMES = ["none", "static", "dynamic", "predictive", "norm", "value", "adaptive", "agc", "skip", "backoff",
                "rollback", "abort", "local", "gloo", "nccl", "nosuch"]
KINDS = ["scaler", "clipper", "nan_policy", "comm", "nosuch"]
OPT_NAMES = ["max_norm", "norm_type", "init_scale", "growth_interval", "clip_value", "method", "percentile",
             "max_consecutive", "on_spike", "spike_zscore", "nosuch"]
LAUNCH_OPTIONS = ["--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--grace-seconds",
                  "--help", "--nosuch"]
ENV_NAMES = ["AMPKIT_CLIPPER_MAX_NORM", "AMPKIT_SCALER_INIT_SCALE", "AMPKIT_PLUGIN_PATH", "RANK", "WORLD_SIZE",
             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "MASTER_PORT",
             "OMPI_COMM_WORLD_SIZE", "AMPKIT_ALLOW_UNTRUSTED_PLUGINS"]


def value(rng, paths):
    """A plausible, extreme or malformed option value."""
    choice = rng.randrange(14)
    if choice == 0:
        return str(rng.randint(-5, 100))
    if choice == 1:
        return rng.choice(["9223372036854775807", "18446744073709551616", "-9223372036854775809", "1e400",
                           "-1", "0", "nan", "inf", "-inf", "0x10", "1_000", " 3", "3 ", "+4"])
    if choice == 2:
        return rng.choice(["fp16", "bf16", "fp32", "fp8", "synthetic", "fashion-mnist", "char-gpt", "cuda", "cpu",
                           "auto", "never", "always", "true", "false", "yes"])
    if choice == 3:
        return rng.choice(PLUGIN_NAMES)
    if choice == 4:
        return f"{rng.choice(KINDS)}.{rng.choice(OPT_NAMES)}={rng.choice(['1', '-1', 'x', '', 'inf', '2.5'])}"
    if choice == 5:
        return rng.choice(["nan@step=3", "inf@step=0,layer=x", "spike@step=2,factor=-1", "nan@", "@step=1"])
    if choice == 6:
        return rng.choice(paths)
    if choice == 7:
        return "x" * rng.choice([1, 255, 256, 4097])
    if choice == 8:
        return "\udcff\udcfe" + "bad-utf8"  # bytes 0xff 0xfe, passed through os.fsencode
    if choice == 9:
        return ""
    if choice == 10:
        return str(rng.uniform(-1e6, 1e6))
    if choice == 11:
        return "=".join(["a", "b", "c"])
    if choice == 12:
        return rng.choice(["-", "--", "---", "-1e-3"])
    return str(rng.randint(0, 2 ** 63))


def train_command(rng, paths):
    words = ["--print-config"]
    for _ in range(rng.randint(0, 6)):
        option = rng.choice(TRAIN_OPTIONS)
        r = rng.random()
        if r < 0.15:
            words.append(option)
        elif r < 0.3:
            words.append(f"{option}={value(rng, paths)}")
        elif r < 0.4:
            words.append(value(rng, paths))  # a stray positional word
        else:
            words += [option, value(rng, paths)]
    rng.shuffle(words)
    return words


def plugins_command(rng, paths):
    sub = rng.choice(["show", "show", "show", "list", "nosuch", ""])
    words = [sub] if sub else []
    if sub == "show":
        for _ in range(rng.randint(0, 2)):
            words.append(rng.choice(PLUGIN_NAMES + KINDS + [value(rng, paths)]))
    if rng.random() < 0.4:
        words.append("--json")
    if rng.random() < 0.3:
        words += ["--plugin-dir", rng.choice(paths)]
    if rng.random() < 0.15:
        words.append(rng.choice(["--bogus", "--help", "-h", value(rng, paths)]))
    return words


def launch_command(rng, paths):
    words = []
    for _ in range(rng.randint(0, 4)):
        option = rng.choice(LAUNCH_OPTIONS)
        if option in ("--help", "--nosuch"):
            words.append(option)
        else:
            n = rng.choice([str(rng.randint(-1, 3)), value(rng, paths)])
            words += [option, n] if rng.random() < 0.8 else [f"{option}={n}"]
    if rng.random() < 0.9:
        words += ["--", rng.choice(["/bin/true", "/bin/true", "/nonexistent/prog", "/bin/false"])]
    return words


def environment(rng, paths):
    env = {}
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        env[rng.choice(ENV_NAMES)] = value(rng, paths)
    return env


def classify(program, code, stderr_lines, stderr_text, argv_text):
    """The failure an outcome shows, or None. ampkit-launch passes its first failed rank's exit code
    on, so /bin/false's 1 is its own."""
    if code is None:
        return "hang"
    if code < 0:
        return f"signal {-code}"
    if re.search(r"^[\w-]+: internal error", stderr_text, re.M) or (code == 1 and program != "ampkit-launch"):
        return "uncaught exception"
    if code not in DOCUMENTED[program] and not (program == "ampkit-launch" and code == 1 and "/bin/false" in argv_text):
        return f"undocumented exit {code}"
    if code == 2 and stderr_lines > 3:
        return f"usage error on {stderr_lines} stderr lines"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.error = lambda m: (print(f"cli_fuzz.py: {m}", file=sys.stderr), sys.exit(2))
    ap.add_argument("--build", default="build", help="build folder with bin/ (default build)")
    ap.add_argument("--runs", type=int, default=300, help="invocations (default 300)")
    ap.add_argument("--seed", type=int, default=1, help="random seed; the same seed runs the same commands")
    ap.add_argument("--show", type=int, default=5, help="failures to print with their command (default 5)")
    a = ap.parse_args()
    bins = {p: os.path.abspath(os.path.join(a.build, "bin", p)) for p in DOCUMENTED}
    for p, b in bins.items():
        if not os.access(b, os.X_OK):
            ap.error(f"{b} not found (build first)")
    rng = random.Random(a.seed)
    failures, table = [], {}
    with tempfile.TemporaryDirectory(prefix="ampkit-cli-fuzz-") as tmp:
        fifo = os.path.join(tmp, "fifo.yaml")
        os.mkfifo(fifo)
        bad_yaml = os.path.join(tmp, "bad.yaml")
        with open(bad_yaml, "w") as f:
            f.write("steps: [1, 2\nopt: {scaler: 3}\n? [complex]: key\n")
        paths = [tmp, fifo, bad_yaml, "/dev/null", "/dev/full", "/nonexistent/file", "/proc/version",
                 os.path.join(tmp, "new"), "/"]
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("AMPKIT_", "SLURM_", "OMPI_"))
                    and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                  "MASTER_PORT", "GROUP_RANK")}
        for i in range(a.runs):
            program = rng.choice(["ampkit-train", "ampkit-train", "ampkit-plugins", "ampkit-launch"])
            words = {"ampkit-train": train_command, "ampkit-plugins": plugins_command,
                     "ampkit-launch": launch_command}[program](rng, paths)
            env = environment(rng, paths)
            argv = [bins[program]] + [os.fsencode(w) for w in words]
            full_env = dict(base_env)
            full_env.update(env)
            try:
                p = subprocess.run(argv, env={k: os.fsencode(v) for k, v in full_env.items()}, cwd=tmp,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   timeout=10)
                code, err = p.returncode, p.stderr.decode("utf-8", "replace")
            except subprocess.TimeoutExpired as e:
                code, err = None, (e.stderr or b"").decode("utf-8", "replace")
            lines = len(err.splitlines())
            problem = classify(program, code, lines, err, " ".join(words))
            key = (program, "hang" if code is None else (f"signal {-code}" if code < 0 else f"exit {code}"))
            table[key] = table.get(key, 0) + 1
            if problem:
                shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                failures.append((problem, f"{shown} {shlex.join([argv[0]] + words)}".strip(),
                                 err.strip().splitlines()[:4]))
    print(f"cli_fuzz: {a.runs} invocations, seed {a.seed}")
    print("| program | outcome | count |\n|---|---|---|")
    for (program, outcome), n in sorted(table.items()):
        print(f"| {program} | {outcome} | {n} |")
    if failures:
        print(f"cli_fuzz: {len(failures)} failure(s):")
        for problem, cmd, err in failures[:a.show]:
            print(f"  {problem}: {cmd}")
            for line in err:
                print(f"      {line[:200]}")
        return 1
    print("cli_fuzz: 0 crashes, 0 hangs, 0 uncaught exceptions, 0 multi-line usage errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
