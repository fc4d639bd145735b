#!/usr/bin/env python3
"""Fails when a file of the repository points at a tracker number (the word issue or issues followed
by a number, with or without "#") instead of saying the reason: nobody outside the tracker can look
such a number up, so a comment, a test or a doc says why in its own words. Upstream references with
a project's name (pytorch#152279) are not tracker numbers of ours and pass.

Checks every file git knows (tracked, or untracked and not ignored) under ROOT, text files only.

    tools/check_tracker_refs.py --root ROOT
    tools/check_tracker_refs.py --self-test
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

# "issue" or "issues", blanks, an optional "#", a number; case-insensitive, any word boundary before.
REFERENCE = re.compile(r"\bissues?[ \t]+#?[0-9]+", re.IGNORECASE)


def files_of(root):
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    return sorted({p for p in out.decode("utf-8", "surrogateescape").split("\0") if p})


def references(root, paths):
    found = []
    for rel in paths:
        path = os.path.join(root, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            continue  # binary
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            match = REFERENCE.search(line)
            if match:
                found.append(f"{rel}:{number}: {match.group(0)!r} in: {line.strip()[:120]}")
    return found


def self_test():
    word = "iss" + "ue"  # spelled apart so this file passes its own check
    bad = [
        f"// fixed in {word} 42\n",
        f"# see {word} #9's target\n",
        f"Closes {word}s 41 and 42.\n",
        f"text ({word.upper()} 7)\n",
    ]
    good = ["see pytorch#152279\n", "an issue with 3 ranks\n", "tissue 4\n", "issue-free\n"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "init", "-q", tmp], check=True)
        for i, text in enumerate(bad + good):
            with open(os.path.join(tmp, f"f{i}.txt"), "w") as f:
                f.write(text)
        with open(os.path.join(tmp, "blob.bin"), "wb") as f:
            f.write(b"\0" + f"{word} 5".encode())
        found = references(tmp, files_of(tmp))
    flagged = sorted(int(line.split(":")[0][1:-4]) for line in found)
    if flagged != list(range(len(bad))):
        print(f"FAIL: expected files {list(range(len(bad)))} flagged, got {flagged}: {found}")
        return 1
    print(f"ok: {len(bad)} references found, {len(good)} other texts and a binary file passed")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    paths = files_of(args.root)
    found = references(args.root, paths)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} tracker references: say the reason instead (what the number stood for)")
        return 1
    print(f"no tracker reference in {len(paths)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
