#!/usr/bin/env python3
"""Fails when a C++ source of the repository is not formatted as .clang-format says:
every tracked .cpp/.h/.hpp/.cu under bench/, core/, hosts/, plugins/, python/, sdk/, tests/ and tools/. The file
and function length gates (tools/function_lengths.py) therefore always measure formatted code.

    tools/check_format.py [--root DIR] [--clang-format clang-format]
    tools/check_format.py --self-test     # a misformatted file fails, its formatted copy passes

Exit 0 when every file is formatted; 1 naming each file that is not (fix: clang-format -i FILE);
2 when clang-format or git is missing (tools/setup.sh installs clang-format).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

FOLDERS = ("bench", "core", "hosts", "plugins", "python", "sdk", "tests", "tools")
SUFFIXES = (".cpp", ".h", ".hpp", ".cu")


def unformatted(root, files, clang_format):
    bad = []
    for i in range(0, len(files), 50):
        batch = files[i:i + 50]
        done = subprocess.run([clang_format, "--dry-run", "--Werror", "--style=file", *batch], cwd=root,
                              capture_output=True, text=True)
        if done.returncode == 0:
            continue
        for f in batch:  # the batch failed: find which of its files
            one = subprocess.run([clang_format, "--dry-run", "--Werror", "--style=file", f], cwd=root,
                                 capture_output=True, text=True)
            if one.returncode != 0:
                bad.append(f)
    return bad


def tracked(root):
    out = subprocess.run(["git", "ls-files", "--", *FOLDERS], cwd=root, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if f.endswith(SUFFIXES) and "/corpus/" not in f]


def self_test(clang_format, root):
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(root, ".clang-format"), tmp)
        with open(os.path.join(tmp, "bad.cpp"), "w") as f:
            f.write("int  main( ){return 0 ;}\n")
        formatted = subprocess.run([clang_format, "--style=file", "bad.cpp"], cwd=tmp, capture_output=True,
                                   text=True, check=True).stdout
        with open(os.path.join(tmp, "good.cpp"), "w") as f:
            f.write(formatted)
        bad = unformatted(tmp, ["bad.cpp", "good.cpp"], clang_format)
    if bad != ["bad.cpp"]:
        print(f"check_format self-test: expected ['bad.cpp'] to fail, got {bad}")
        return 1
    print("check_format self-test: a misformatted file fails, a formatted one passes")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--clang-format", default="clang-format")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    clang_format = shutil.which(args.clang_format)
    if not clang_format:
        print(f"check_format: {args.clang_format} not found (tools/setup.sh installs clang-format)")
        return 2
    root = os.path.abspath(args.root)
    if args.self_test:
        return self_test(clang_format, root)
    try:
        files = tracked(root)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"check_format: cannot list the files with git in {root}: {e}")
        return 2
    bad = unformatted(root, files, clang_format)
    for f in bad:
        print(f"{f}: not formatted as .clang-format says (fix: clang-format -i {f})")
    print(f"check_format: {len(files) - len(bad)} of {len(files)} files formatted")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
