#!/usr/bin/env python3
"""Lists C++ and Python functions by length and fails when one is longer than the limit.

A function's length is its lines from the first line of its signature to its closing brace;
lambdas and local classes count towards the function they are written in. Comments, string and
character literals and preprocessor lines are blanked first, so braces inside them do not count.
A Python function (python/ampkit) is measured from its `def` line to its last line, as Python's
own parser reports them; functions and classes nested in it count towards it.

    tools/function_lengths.py                     # core/ hosts/ plugins/ sdk/ python/, limit 80, top 15
    tools/function_lengths.py --top 40 core/engine
    tools/function_lengths.py --self-test         # the scanner on fixtures with known lengths

    tools/function_lengths.py --file-limit 400    # also fail on a file longer than 400 lines

Exit 0 when every function is within the limit, 1 when one is not (each is named as
"file:line: name is N lines, over the limit of 80") or a file is over --file-limit, 2 on a
usage error. Tests and benchmark programs are not scanned: they
live in tests/ and bench/, outside the default folders.
"""
import argparse
import ast
import bisect
import os
import re
import subprocess
import sys
import tempfile

SOURCE_SUFFIXES = (".cpp", ".cc", ".h", ".hpp", ".py")
DEFAULT_ROOTS = ("core", "hosts", "plugins", "sdk", "python")
CONTAINER = re.compile(r"(^|\W)(namespace|class|struct|union|enum)(\W|$)|^\s*extern\s*$")
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|try)\b")
ACCESS = re.compile(r"^\s*(public|private|protected)\s*:(?!:)")


def blank_non_code(text):
    """Replaces comments, literals and preprocessor lines with spaces, keeping every newline."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and not (text[i] == "\n" and text[i - 1] != "\\"):
                out.append("\n" if text[i] == "\n" else " ")
                i += 1
            continue
        if c == "\n":
            at_line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.extend("\n" if ch == "\n" else " " for ch in text[i:end])
            i = end
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            end = text.find(")" + delim + '"', open_paren)
            end = n if end < 0 else end + len(delim) + 2
            out.extend("\n" if ch == "\n" else " " for ch in text[i:end])
            i = end
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")  # a digit separator, as in 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j, n - 1) - i + 1))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_name(header):
    """The name before the parameter list of a signature, e.g. 'Trainer::step'."""
    header = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", header, flags=re.S)
    op = re.search(r"([~\w:]*operator\s*(?:\(\)|[^\s(]+))\s*\(", header)
    if op:  # operator<, operator() and the like: their '<' or '(' is part of the name
        return re.sub(r"operator\s+(?=\W)", "operator", re.sub(r"\s+", " ", op.group(1)))
    depth = 0
    for k, ch in enumerate(header):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth <= 0:
            m = re.search(r"([~\w:]+(?:operator\s*\S+?)?|\][^\[]*)\s*$", header[:k])
            return m.group(1) if m and not m.group(1).startswith("]") else "(lambda)"
    return header.strip().split("\n")[0][:40]


def member_init(header):
    """True when the '{' after header brace-initialises a member or base in a constructor's
    initializer list (`A(int x) : a_{x}, b_{x} {`), so it is not the body."""
    stripped = ACCESS.sub("", header)
    if CONTROL.match(stripped) or "(" not in stripped:
        return False
    depth, close = 0, -1
    for k, ch in enumerate(stripped):  # the parameter list's closing parenthesis
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                close = k
                break
    if close < 0:
        return False
    rest = stripped[close + 1:]
    return bool(re.search(r"(?<!:):(?!:)", rest)) and bool(re.search(r"[\w>]\s*$", rest))


def scan(text):
    """Yields (first_line, last_line, name) of each outermost function in C++ source text."""
    code = blank_non_code(text)
    stack = []  # "container", "function" or "block", one per open brace
    starts = []  # for function entries: (first_line, name)
    header_from = 0  # index just after the last ';', '{' or '}'
    line_at = [0]  # line_at[k]: index where line k+1 starts
    for k, ch in enumerate(code):
        if ch == "\n":
            line_at.append(k + 1)
    def line_of(index):
        return bisect.bisect_right(line_at, index)

    for k, ch in enumerate(code):
        if ch == "{":
            header = code[header_from:k]
            if (stack and stack[-1] == "init") or ("function" not in stack and member_init(header)):
                stack.append("init")  # part of a constructor's signature: the header goes on
                continue
            inside_function = "function" in stack
            kind = "block"
            if not inside_function:
                stripped = ACCESS.sub("", header)
                if CONTAINER.search(stripped) and "(" not in stripped:
                    kind = "container"
                elif ")" in stripped and not CONTROL.match(stripped) and "=" not in stripped.split("(")[0]:
                    kind = "function"
                if kind == "function":
                    offset = len(header) - len(header.lstrip())
                    access = ACCESS.match(header)
                    if access:
                        rest = header[access.end():]
                        offset = access.end() + len(rest) - len(rest.lstrip())
                    starts.append((line_of(header_from + offset), function_name(stripped)))
            stack.append(kind)
            header_from = k + 1
        elif ch == "}":
            if stack and stack[-1] == "init":
                stack.pop()
                continue
            if stack:
                kind = stack.pop()
                if kind == "function":
                    first, name = starts.pop()
                    yield first, line_of(k), name
            header_from = k + 1
        elif ch == ";":
            header_from = k + 1


def scan_python(text):
    """Yields (first_line, last_line, name) of each outermost function in Python source text:
    module-level functions and the methods of module-level classes (nested ones count in them)."""
    def outermost(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield node.lineno, node.end_lineno, prefix + node.name
            elif isinstance(node, ast.ClassDef):
                yield from outermost(node.body, prefix + node.name + ".")
            elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` and the like
                yield from outermost(node.body + node.orelse, prefix)

    yield from outermost(ast.parse(text).body, "")


def source_files(roots, excludes):
    for root in roots:
        if os.path.isfile(root):
            yield root
            continue
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                path = os.path.join(folder, f)
                if f.endswith(SOURCE_SUFFIXES) and not any(path.startswith(e) for e in excludes):
                    yield path


def measure(paths):
    found = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
            for first, last, name in (scan_python(text) if path.endswith(".py") else scan(text)):
                found.append((last - first + 1, path, first, name))
    found.sort(key=lambda x: (-x[0], x[1], x[2]))
    return found


def self_test():
    """The scanner on fixtures whose lengths are known; fails loudly if it miscounts."""
    def body(lines):
        return "".join("  x += %d;  // a } in a comment\n" % i for i in range(lines))

    fixture = (
        "#include <string>\n"
        "namespace a {\n"
        "struct S {\n"
        "  int f() const { return 1; }\n"
        " public:\n"
        "  void g(int x) {\n" + body(78) + "  }\n"
        "  bool operator<(const S&) const { return false; }\n"
        "};\n"
        "struct C {\n"
        "  C(int x)\n"
        "      : a_{x},\n"
        "        b_{x} {\n" + body(4) + "  }\n"
        "  int a_, b_;\n"
        "};\n"
        "int long_one(int x) {\n"
        "  const char* s = \"{{{ not a brace\";\n"
        "  auto l = [&](int y) {\n" + body(75) + "  };\n"
        "  return x + l(1) + s[0] + '{';\n"
        "}\n"
        "}  // namespace a\n")
    py_fixture = (
        '"""A module."""\n'
        "def top(x):\n"
        "    def inner():  # counts in top\n"
        "        return x\n"
        "    return inner()\n"
        "class K:\n"
        '    """A class."""\n'
        "    def method(self):\n" + "".join("        x = %d  # def not_a_function():\n" % i for i in range(79)) +
        "        return x\n"
        "    def short(self): return 1\n")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fixture.cpp")
        with open(path, "w") as f:
            f.write(fixture)
        got = {name: length for length, _, _, name in measure([path])}
        over = subprocess.run([sys.executable, __file__, "--limit", "80", path], capture_output=True, text=True)
        lines = fixture.count("\n")
        file_ok = subprocess.run([sys.executable, __file__, "--limit", "100", "--file-limit", str(lines), path],
                                 capture_output=True, text=True)
        file_over = subprocess.run(
            [sys.executable, __file__, "--limit", "100", "--file-limit", str(lines - 1), path],
            capture_output=True, text=True)
        py_path = os.path.join(d, "fixture.py")
        with open(py_path, "w") as f:
            f.write(py_fixture)
        py_got = {name: length for length, _, _, name in measure([py_path])}
    want = {"f": 1, "g": 80, "operator<": 1, "C": 8, "long_one": 81}
    py_want = {"top": 4, "K.method": 81, "K.short": 1}
    if py_got != py_want:
        print("function_lengths self-test FAILED on Python: got %s, want %s" % (py_got, py_want))
        return 1
    if got != want:
        print("function_lengths self-test FAILED: got %s, want %s" % (got, want))
        return 1
    if over.returncode != 1 or "long_one is 81 lines" not in over.stdout or "g is" in over.stdout:
        print("function_lengths self-test FAILED: the limit check gave exit %d:\n%s" % (over.returncode, over.stdout))
        return 1
    if file_ok.returncode != 0 or file_over.returncode != 1 or "over the file limit" not in file_over.stdout:
        print("function_lengths self-test FAILED: the file limit check gave exit %d at %d lines, %d at %d" %
              (file_ok.returncode, lines, file_over.returncode, lines - 1))
        return 1
    print("function_lengths self-test passed: %s, %s; a file of %d lines against limits %d and %d" %
          (want, py_want, lines, lines, lines - 1))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="files or folders (default: %s)" % " ".join(DEFAULT_ROOTS))
    ap.add_argument("--limit", type=int, default=80, help="longest allowed function, in lines (80)")
    ap.add_argument("--file-limit", type=int, default=0,
                    help="longest allowed file, in lines (0: files are not checked)")
    ap.add_argument("--top", type=int, default=15, help="how many of the longest to list (15)")
    ap.add_argument("--exclude", action="append", default=[], help="path prefix not to scan (repeatable)")
    ap.add_argument("--root", default=".", help="folder the default paths are relative to (.)")
    ap.add_argument("--self-test", action="store_true", help="check the scanner on known fixtures")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    os.chdir(args.root)
    roots = args.paths or [r for r in DEFAULT_ROOTS if os.path.isdir(r)]
    paths = list(source_files(roots, args.exclude))
    found = measure(paths)
    print("longest functions (lines, file:line, name):")
    for length, path, first, name in found[:args.top]:
        print("  %4d  %s:%d  %s" % (length, path, first, name))
    too_long = [x for x in found if x[0] > args.limit]
    for length, path, first, name in too_long:
        print("%s:%d: %s is %d lines, over the limit of %d" % (path, first, name, length, args.limit))
    print("%d functions scanned, %d over %d lines" % (len(found), len(too_long), args.limit))
    long_files = []
    if args.file_limit > 0:
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = sum(1 for _ in f)
            if lines > args.file_limit:
                long_files.append(path)
                print("%s: %d lines, over the file limit of %d" % (path, lines, args.file_limit))
        print("%d files scanned, %d over %d lines" % (len(paths), len(long_files), args.file_limit))
    return 1 if too_long or long_files else 0


if __name__ == "__main__":
    sys.exit(main())
