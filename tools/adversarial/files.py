"""The files a new user might hand a reader: FIFOs, devices, folders, huge, empty, non-UTF-8, deeply
nested, a key given twice, values of the wrong type or out of range. Each is written (or named) for
one reader's valid base content; no torch here (run.py's parent uses it for ampkit-train)."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

PATH = "<the file's path>"  # in a case's names: stands for the path it is written to


@dataclass
class Reader:
    """A reader's valid content, its format and the values that must be refused under some keys."""

    label: str
    suffix: str  # ".json" or ".yaml"
    base: Dict[str, Any]
    nested: Tuple[str, Dict[str, Any]]  # an object inside it, where a duplicate key is planted
    bad_values: Sequence[Tuple[Tuple[str, ...], Any]] = field(default_factory=list)


@dataclass
class File:
    kind: str
    path: str
    expect: str  # "error", "ok" or "either"
    names: List[object]
    timeout: float = 20.0


def _dump(data: Any, suffix: str) -> str:
    # JSON is YAML too (flow style); NaN and Infinity then read as strings in YAML: still refused.
    return json.dumps(data)


def _set(data: Dict[str, Any], keys: Tuple[str, ...], value: Any) -> Dict[str, Any]:
    out = json.loads(json.dumps(data))
    target = out
    for k in keys[:-1]:
        target = target.setdefault(k, {})
    target[keys[-1]] = value
    return out


def _duplicate(data: Dict[str, Any], nested: str) -> Tuple[str, str]:
    """(text, key): ``data`` with its first key given twice, or the first key of data[nested]."""
    if nested:
        inner = data[nested]
        first = next(iter(inner))
        items = [(first, inner[first])] + list(inner.items())
        body = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in items)
        rest = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if k != nested)
        return "{" + json.dumps(nested) + ": {" + body + "}" + (", " + rest if rest else "") + "}", first
    first = next(iter(data))
    items = [(first, data[first])] + list(data.items())
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in items) + "}", first


def _write(folder: str, name: str, content: Any) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def _special(folder: str, suffix: str) -> List[File]:
    """Paths that are not regular files, or that no reader may read to the end."""
    fifo = os.path.join(folder, "fifo" + suffix)
    os.mkfifo(fifo)
    link = os.path.join(folder, "link-to-fifo" + suffix)
    os.symlink(fifo, link)
    sock = os.path.join(folder, "socket" + suffix)
    socket.socket(socket.AF_UNIX).bind(sock)
    folder_path = os.path.join(folder, "folder" + suffix)
    os.mkdir(folder_path)
    huge = os.path.join(folder, "huge" + suffix)
    with open(huge, "wb") as f:
        f.truncate(16 * 1024 * 1024 + 1)  # sparse: a reader that reads it all reads 16 MiB of NULs
    files = [
        File("fifo", fifo, "error", [fifo], 1.0),
        File("symlink to a fifo", link, "error", [link], 1.0),
        File("unix socket", sock, "error", [sock], 1.0),
        File("folder", folder_path, "error", [folder_path]),
        File("missing", os.path.join(folder, "gone" + suffix), "error", ["gone" + suffix]),
        File("16 MiB + 1 sparse", huge, "error", [huge], 5.0),
    ]
    for dev in ("/dev/zero", "/dev/null", "/dev/urandom", "/dev/full", "/dev/stdin", "/proc/self/mem"):
        files.append(File(dev, dev, "error", [dev], 1.0))
    return files


def _deep(folder: str, suffix: str) -> List[File]:
    out = []
    for depth in (5000, 200000):
        path = _write(folder, f"deep-list-{depth}{suffix}", "[" * depth + "]" * depth)
        out.append(File(f"list nested {depth} deep", path, "error", [path]))
    path = _write(folder, f"deep-object{suffix}", '{"a": ' * 5000 + "1" + "}" * 5000)
    out.append(File("object nested 5000 deep", path, "error", [path]))
    if suffix == ".yaml":  # "billion laughs": aliases that expand to 10**9 items
        lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
        lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
        path = _write(folder, "laughs.yaml", "\n".join(lines) + "\n")
        out.append(File("YAML alias bomb", path, "error", [path]))
    return out


def _texts(folder: str, reader: Reader) -> List[File]:
    base = _dump(reader.base, reader.suffix)
    s = reader.suffix
    raw: List[Tuple[str, Any, str, List[Any]]] = [
        ("empty", "", "either", []),
        ("only whitespace", " \n\t\n", "either", []),
        ("non-UTF-8", b"\xff\xfe\x80" + base.encode(), "error", []),
        ("UTF-16 with BOM", base.encode("utf-16"), "either" if s == ".yaml" else "error", []),  # YAML 1.2 reads it
        ("NUL bytes", base.encode() + b"\0\0", "error", []),
        ("Latin-1 key", ('{"fp16\xe9": 1}').encode("latin-1"), "error", []),
        ("top-level list", "[1, 2]", "error", []),
        ("top-level string", '"fp16"', "error", []),
        ("top-level number", "3", "error", []),
        ("top-level null", "null", "either", []),
        ("truncated", base[: len(base) // 2], "error", []),
        ("trailing garbage", base + " }}} x", "error", []),
        ("two documents", base + "\n---\n" + base if s == ".yaml" else base + base, "error", []),
    ]
    text, key = _duplicate(reader.base, "")
    raw.append(("duplicate top-level key", text, "error", [key]))
    text, key = _duplicate(reader.base, reader.nested[0])
    raw.append(("duplicate nested key", text, "error", [key]))
    for keys, value in reader.bad_values:
        raw.append(
            (
                f"{'.'.join(keys)}={json.dumps(value)[:20]}",
                _dump(_set(reader.base, keys, value), s),
                "error",
                [(keys[-1], PATH, str(value) if isinstance(value, str) and len(value) > 2 else PATH)],
            )
        )  # the key or the file
    out = [File("valid", _write(folder, "valid" + s, base), "ok", [])]
    for i, (kind, content, expect, names) in enumerate(raw):
        path = _write(folder, f"case{i}{s}", content)
        named = [tuple(path if n is PATH else n for n in name) if isinstance(name, tuple) else name for name in names]
        out.append(File(kind, path, expect, named or [path]))
    return out


def files_for(folder: str, reader: Reader) -> List[File]:
    """Every file case for ``reader``, written under ``folder`` (which must exist and be empty)."""
    return _special(folder, reader.suffix) + _deep(folder, reader.suffix) + _texts(folder, reader)


FP16 = {"fp16": {"enabled": True, "initial_scale_power": 10, "loss_scale_window": 100, "hysteresis": 2}}
DEEPSPEED_BAD = [
    (("fp16", "initial_scale_power"), "16"),
    (("fp16", "initial_scale_power"), 1.5),
    (("fp16", "initial_scale_power"), True),
    (("fp16", "initial_scale_power"), None),
    (("fp16", "initial_scale_power"), 10**400),
    (("fp16", "initial_scale_power"), 200),
    (("fp16", "loss_scale"), -1),
    (("fp16", "loss_scale"), 1e39),
    (("fp16", "loss_scale"), float("nan")),
    (("fp16", "loss_scale"), float("inf")),
    (("fp16", "min_loss_scale"), 0),
    (("fp16", "hysteresis"), 0),
    (("fp16", "loss_scale_window"), -5),
    (("fp16", "enabled"), "yes"),
    (("gradient_clipping",), "1.0"),
    (("gradient_clipping",), float("nan")),
    (("fp16",), [1]),
    (("bf16",), {"enabled": True}),
]
