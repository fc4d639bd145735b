#!/usr/bin/env python3
"""Fails when core/'s layers break (docs/architecture.md, "Layout").

core/ is one library per part; a part may use only the parts below it:

    common  <-  registry  <-  engine          checkpoint, metrics, config: common only

Three views of that rule are checked, so a break shows whichever way it was made:
  * links: each part's libraries and what they link (LINK_LIBRARIES, written by core/CMakeLists.txt
    into the build folder as ampkit_layers.txt), followed transitively;
  * includes: every #include of an ampkit/ header in core/<part>/, resolved to the part that holds it;
  * the build: the include folders ninja compiles each part's objects with (build.ninja).

The SDK sits below all of core/: every C++ file under sdk/ (headers and examples) includes only
the SDK's own ampkit/ headers, nothing that core/ or hosts/ holds, so a plugin author needs no more.
python/ sits beside the hosts, on core/: its C++ includes nothing that hosts/ holds.
ampkit-train's folders (hosts/train/src) are layered by their includes as well:
config <- workloads <- session (the workload registry gives config/ its list, config/workload_options.h).

    tools/check_layers.py --root DIR --build BUILD_DIR
    tools/check_layers.py --self-test     # an engine linking metrics, metrics including the
                                          # engine, a widened include path and a part missing
                                          # from build.ninja all fail

Exit 0 when the layers hold; 1 naming each break.
"""
import argparse
import os
import re
import sys
import tempfile

# The rule: the parts each part may use (besides itself, the SDK and third-party libraries).
ALLOWED = {
    "common": set(),
    "registry": {"common"},
    "engine": {"common", "registry"},
    "checkpoint": {"common"},
    "metrics": {"common"},
    "config": {"common"},
}
CXX = (".h", ".hpp", ".cpp", ".cc", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](ampkit/[^">]+)[">]')
# ampkit-train's folders and the folders each may include (besides itself and ampkit/ headers).
HOST_FOLDERS = {"config": set(), "workloads": {"config"}, "session": {"config", "workloads"}}
HOST_INCLUDE = re.compile(r'^\s*#\s*include\s*"((\w+)/[^"]+)"')


def read_layers(path):
    """ampkit_layers.txt: '<target> <part> <linked item>...' per line -> {target: (part, [items])}."""
    targets = {}
    with open(path) as f:
        for line in f:
            words = line.split()
            if len(words) >= 2:
                targets[words[0]] = (words[1], words[2:])
    return targets


def link_breaks(targets):
    breaks = []
    for target, (part, _) in sorted(targets.items()):
        seen, todo = set(), [target]
        while todo:
            for item in targets.get(todo.pop(), ("", []))[1]:
                if item in targets and item not in seen:
                    seen.add(item)
                    todo.append(item)
        for other in sorted(seen):
            other_part = targets[other][0]
            if other_part != part and other_part not in ALLOWED[part]:
                breaks.append(f"{target} ({part}) links {other} ({other_part}); {part} may use only "
                              f"{', '.join(sorted(ALLOWED[part])) or 'no other part'}")
    return breaks


def header_owners(root):
    owners = {}
    for part in ALLOWED:
        folder = os.path.join(root, "core", part, "include", "ampkit")
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            owners["ampkit/" + name] = part
    return owners


def include_breaks(root):
    owners, breaks = header_owners(root), []
    for part in sorted(ALLOWED):
        for folder, _, files in sorted(os.walk(os.path.join(root, "core", part))):
            for name in sorted(files):
                path = os.path.join(folder, name)
                with open(path, errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        owner = owners.get(m.group(1)) if m else None
                        if owner and owner != part and owner not in ALLOWED[part]:
                            breaks.append(f"{os.path.relpath(path, root)}:{number} includes {m.group(1)} "
                                          f"({owner}); {part} may use only "
                                          f"{', '.join(sorted(ALLOWED[part])) or 'no other part'}")
    return breaks


def ampkit_headers(folder):
    """{'ampkit/NAME': path} for every header under each FOLDER/**/include/ampkit/."""
    found = {}
    for where, _, files in os.walk(folder):
        head, tail = os.path.split(where)
        if tail == "ampkit" and os.path.basename(head) == "include":
            found.update({"ampkit/" + name: os.path.join(where, name) for name in files})
    return found


def upward_breaks(root, part, above, rule):
    """C++ files under PART including an ampkit/ header that one of the ABOVE folders holds."""
    own = ampkit_headers(os.path.join(root, part))
    above = {k: v for a in above for k, v in ampkit_headers(os.path.join(root, a)).items() if k not in own}
    breaks = []
    for folder, _, files in sorted(os.walk(os.path.join(root, part))):
        for name in sorted(n for n in files if n.endswith(CXX)):
            path = os.path.join(folder, name)
            with open(path, errors="replace") as f:
                for number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if m and m.group(1) in above:
                        owner = os.path.relpath(above[m.group(1)], root)
                        breaks.append(f"{os.path.relpath(path, root)}:{number} includes {m.group(1)} ({owner}); {rule}")
    return breaks


def sdk_and_python_breaks(root):
    return (upward_breaks(root, "sdk", ["core", "hosts"], "the SDK may include only its own headers")
            + upward_breaks(root, "python", ["hosts"], "python/ may include core and the SDK, not the hosts"))


def host_folder_breaks(root):
    """hosts/train/src: each folder includes only the folders below it (HOST_FOLDERS)."""
    breaks = []
    for part, below in sorted(HOST_FOLDERS.items()):
        for folder, _, files in sorted(os.walk(os.path.join(root, "hosts", "train", "src", part))):
            for name in sorted(n for n in files if n.endswith(CXX)):
                path = os.path.join(folder, name)
                with open(path, errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = HOST_INCLUDE.match(line)
                        if m and m.group(2) in HOST_FOLDERS and m.group(2) != part and m.group(2) not in below:
                            breaks.append(f"{os.path.relpath(path, root)}:{number} includes {m.group(1)}; "
                                          f"{part}/ may include only {', '.join(sorted(below)) or 'itself'}")
    return breaks


def build_breaks(ninja, targets):
    """The include folders of each part's objects in build.ninja: no other part's, above it."""
    part_of = {target: part for target, (part, _) in targets.items()}
    breaks, target, compiled = [], None, set()
    with open(ninja) as f:
        for line in f:
            if line.startswith("build "):
                m = re.search(r"CMakeFiles/([\w-]+)\.dir/", line.split(":")[0])
                target = m.group(1) if m and m.group(1) in part_of else None
            elif target and line.strip().startswith("INCLUDES ="):
                compiled.add(target)
                part = part_of[target]
                for folder in re.findall(r"core/(\w+)/include", line):
                    if folder != part and folder in ALLOWED and folder not in ALLOWED[part]:
                        breaks.append(f"build.ninja: {target} ({part}) compiles with core/{folder}/include")
    # A check that read nothing proves nothing: every part's objects must be there.
    breaks += [f"build.ninja: no objects of {t} found" for t in sorted(set(part_of) - compiled)]
    return sorted(set(breaks))


def check(root, build):
    targets = read_layers(os.path.join(build, "ampkit_layers.txt"))
    missing = sorted(set(ALLOWED) - {part for part, _ in targets.values()})
    breaks = [f"no library for part {p} in ampkit_layers.txt" for p in missing]
    breaks += link_breaks(targets) + include_breaks(root) + sdk_and_python_breaks(root)
    breaks += host_folder_breaks(root)
    ninja = os.path.join(build, "build.ninja")
    if os.path.exists(ninja):
        breaks += build_breaks(ninja, targets)
    return breaks


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        for part in ALLOWED:
            write(f"{tmp}/core/{part}/include/ampkit/{part}.h", "#pragma once\n")
        write(f"{tmp}/core/engine/include/ampkit/trainer.h", '#include <ampkit/common.h>\n')
        write(f"{tmp}/sdk/include/ampkit/plugin.h", "#pragma once\n")
        write(f"{tmp}/hosts/common/include/ampkit/exit_codes.h", "#pragma once\n")
        write(f"{tmp}/sdk/examples/mine/mine.cpp", '#include <ampkit/plugin.h>\n#include <vector>\n')
        write(f"{tmp}/python/src/library.cpp", '#include <ampkit/trainer.h>\n')
        write(f"{tmp}/hosts/train/src/workloads/registry.h", '#include "config/option_table.h"\n')
        write(f"{tmp}/build/ampkit_layers.txt",
              "ampkit_common common\nampkit_registry registry ampkit_common\n"
              "ampkit_engine engine ampkit_common\nampkit_checkpoint checkpoint ampkit_common\n"
              "ampkit_metrics metrics ampkit_common\nampkit_config config ampkit_common\n")
        write(f"{tmp}/build/build.ninja", "".join(
            f"build core/CMakeFiles/ampkit_{p}.dir/{p}.cpp.o: CXX {p}.cpp\n"
            f"  INCLUDES = -I{tmp}/core/{p}/include -I{tmp}/core/common/include\n" for p in ALLOWED))
        if check(tmp, f"{tmp}/build"):
            print("self-test: the layered fixture was refused:", check(tmp, f"{tmp}/build"))
            return 1
        write(f"{tmp}/core/metrics/src/metrics.cpp", '#include "ampkit/metrics.h"\n#include "ampkit/trainer.h"\n')
        write(f"{tmp}/sdk/examples/mine/mine.cpp", '#include <ampkit/plugin.h>\n#include <ampkit/trainer.h>\n'
              '#include "ampkit/exit_codes.h"\n')
        write(f"{tmp}/python/src/library.cpp", '#include <ampkit/trainer.h>\n#include "ampkit/exit_codes.h"\n')
        write(f"{tmp}/hosts/train/src/config/option_table.cpp", '#include "config/option_table.h"\n'
              '#include "workloads/registry.h"\n')
        with open(f"{tmp}/build/ampkit_layers.txt", "a") as f:
            f.write("ampkit_engine_extra engine ampkit_engine ampkit_metrics\n")
        with open(f"{tmp}/build/build.ninja", "a") as f:
            f.write("build core/CMakeFiles/ampkit_metrics.dir/t.cpp.o: CXX t.cpp\n"
                    f"  INCLUDES = -I{tmp}/core/engine/include\n")
        found = check(tmp, f"{tmp}/build")
        expected = ["ampkit_engine_extra (engine) links ampkit_metrics (metrics)",
                    "core/metrics/src/metrics.cpp:2 includes ampkit/trainer.h (engine)",
                    "build.ninja: ampkit_metrics (metrics) compiles with core/engine/include",
                    "build.ninja: no objects of ampkit_engine_extra found",  # a check that read nothing
                    "sdk/examples/mine/mine.cpp:2 includes ampkit/trainer.h (core/engine/include/ampkit/trainer.h)",
                    "sdk/examples/mine/mine.cpp:3 includes ampkit/exit_codes.h (hosts/common/include/",
                    "python/src/library.cpp:2 includes ampkit/exit_codes.h (hosts/common/include/",
                    "hosts/train/src/config/option_table.cpp:2 includes workloads/registry.h; config/"]
        for e in expected:
            if not any(b.startswith(e) for b in found):
                print(f"self-test: not reported: {e}\n  found: {found}")
                return 1
    print("self-test: ok (a layered fixture passes; an upward link, include and include path fail, "
          "and so do a part whose objects the build does not show, an SDK file including core or hosts "
          "and python/ including the hosts, and ampkit-train's config/ including its workloads/)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--build", help="the build folder (holds ampkit_layers.txt and build.ninja)")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args()
    if args.self_test:
        return self_test()
    if not args.build:
        p.error("--build is required")
    breaks = check(args.root, args.build)
    for b in breaks:
        print("layering:", b)
    if breaks:
        print(f"{len(breaks)} layering break(s); the layers are in docs/architecture.md, \"Layout\"")
        return 1
    print(f"layers hold: {', '.join(f'{p} <- {sorted(ALLOWED[p])}' for p in ALLOWED)}; "
          "sdk/ <- sdk/ only; python/ <- not hosts/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
