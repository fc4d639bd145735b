#!/usr/bin/env python3
"""Fails when the modules of a Python package import each other in a cycle: every
import counts, at module level or inside a function, so a cycle cannot hide behind a lazy import.

    tools/check_python_imports.py [PACKAGE_DIR]   # default: python/ampkit
    tools/check_python_imports.py --self-test     # a fixture package with a cycle fails, without passes

A package's own __init__ is not counted as imported by its submodules (Python imports it first
whatever they import). Exit 0 without a cycle; 1 naming each cycle (a -> b -> a); 2 on a usage error.
"""
import argparse
import ast
import os
import sys
import tempfile


def module_names(package_dir):
    """{module name: path} of the package's modules: 'pkg' for __init__.py, 'pkg.mod' for mod.py."""
    package = os.path.basename(os.path.normpath(package_dir))
    out = {}
    for f in sorted(os.listdir(package_dir)):
        if f.endswith(".py"):
            out[package if f == "__init__.py" else package + "." + f[:-3]] = os.path.join(package_dir, f)
    return package, out


def imports_of(path, module, package, modules):
    """The package's modules that `module` (at `path`) imports anywhere in its text."""
    found = set()
    base = package  # the package that relative imports start from (every module is one level down)
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                continue  # outside the package
            target = (base + ("." + node.module if node.module else "")) if node.level == 1 else node.module
            if target not in modules and not (target or "").startswith(package):
                continue
            for a in node.names:  # `from . import x` and `from .pkg import submodule`
                if target + "." + a.name in modules:
                    found.add(target + "." + a.name)
                elif target in modules:
                    found.add(target)
    found.discard(module)
    found.discard(package)
    return found


def cycles(graph):
    """Each strongly connected group of more than one module, as a cycle through it."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for group in groups:  # one path that closes, for the message
        path, members = [group[0]], set(group)
        while True:
            nxt = sorted(w for w in graph[path[-1]] if w in members)
            step = next((w for w in nxt if w not in path), None)
            if step is None:
                path.append(next(w for w in nxt if w in path))
                break
            path.append(step)
        out.append(path[path.index(path[-1]):])
    return out


def check(package_dir):
    package, modules = module_names(package_dir)
    graph = {m: imports_of(p, m, package, modules) for m, p in modules.items()}
    found = cycles(graph)
    for c in found:
        print("import cycle: " + " -> ".join(c))
    edges = sum(len(v) for v in graph.values())
    print("%d modules of %s, %d imports between them, %d cycles" % (len(modules), package, edges, len(found)))
    return 1 if found else 0


def self_test():
    files = {"__init__.py": "from . import a\n", "a.py": "from .b import B\n", "c.py": "import pkg.a\n",
             "b.py": "B = 1\n\ndef late():\n    from . import c\n    return c\n"}
    with tempfile.TemporaryDirectory() as d:
        pkg = os.path.join(d, "pkg")
        os.mkdir(pkg)
        for name, text in files.items():
            with open(os.path.join(pkg, name), "w") as f:
                f.write(text)
        with_cycle = check(pkg)
        with open(os.path.join(pkg, "b.py"), "w") as f:
            f.write("B = 1\n")
        without = check(pkg)
    if with_cycle != 1 or without != 0:
        print("check_python_imports self-test FAILED: exit %d with a lazy cycle a -> b -> c -> a, %d without"
              % (with_cycle, without))
        return 1
    print("check_python_imports self-test passed: a cycle through a function-level import fails, none passes")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", nargs="?", default="python/ampkit", help="the package folder (python/ampkit)")
    ap.add_argument("--self-test", action="store_true", help="check the checker on a fixture package")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not os.path.isfile(os.path.join(args.package, "__init__.py")):
        print("%s is not a package folder" % args.package)
        return 2
    return check(args.package)


if __name__ == "__main__":
    sys.exit(main())
