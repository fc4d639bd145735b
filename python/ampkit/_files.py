"""Reading a user's file the way ampkit-train does: a regular file only, bounded in size, never a
read that blocks (a FIFO with no writer, a terminal) or that never ends (``/dev/zero``), the file
named in every error; and its JSON (or YAML) with duplicate keys and nesting too deep refused."""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Dict, List, Tuple, Union

__all__ = ["MAX_CONFIG_BYTES", "check_regular_file", "load_json", "load_torch_state", "load_yaml", "read_text"]

#: The largest configuration file read, in bytes: a DeepSpeed or distributed config is a few KiB.
MAX_CONFIG_BYTES = 16 * 1024 * 1024

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_irregular(what: str, name: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((f"{kind}, " for test, kind in _KINDS if test(mode)), "")
        raise ValueError(f"{what} {name}: {kind}not a regular file")


def check_regular_file(path: Union[str, os.PathLike], what: str) -> str:
    """``path`` as text, after checking that it names a regular file (following links), without
    opening it: a FIFO, a device, a folder are refused at once. Raises FileNotFoundError (naming
    the file) for a missing one, ValueError otherwise."""
    name = os.fsdecode(os.fspath(path))
    try:
        mode = os.stat(name).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {name}: no such file") from None
    except OSError as e:
        raise ValueError(f"{what} {name}: cannot be read: {e.strerror}") from None
    _refuse_irregular(what, name, mode)
    return name


def load_torch_state(path: Union[str, os.PathLike], what: str, map_location: Any = None) -> Any:
    """``torch.load(path, weights_only=True)`` of a regular file; a file torch cannot read that way
    (not a checkpoint, cut short, holding code) is one ValueError naming the file, not torch's
    paragraphs."""
    import torch

    name = check_regular_file(path, what)
    try:
        return torch.load(name, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 (pickle, zip and torch's own errors alike)
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        raise ValueError(
            f"{what} {name}: torch.load(weights_only=True) cannot read it ({type(e).__name__}: {first[:160]})"
        ) from None


def read_text(path: Union[str, os.PathLike], what: str, limit: int = MAX_CONFIG_BYTES) -> Tuple[str, str]:
    """(the file's name, its text): a regular file of at most ``limit`` bytes of UTF-8. Opened
    without blocking and checked on the open descriptor before any read, so a FIFO or device is
    refused at once and a file swapped after a check is not read."""
    name = os.fsdecode(os.fspath(path))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(name, flags)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {name}: no such file") from None
    except OSError as e:
        raise ValueError(f"{what} {name}: cannot be read: {e.strerror}") from None
    try:  # checked on the descriptor; a file object (which owns it from then on) only for a regular file
        info = os.fstat(fd)
        _refuse_irregular(what, name, info.st_mode)
        if info.st_size > limit:
            raise ValueError(
                f"{what} {name}: {info.st_size} bytes, more than the {limit} a configuration file may hold"
            )
        f = os.fdopen(fd, "rb")
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise ValueError(f"{what} {name}: cannot be read: {e.strerror}") from None
        raise
    with f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise ValueError(f"{what} {name}: cannot be read: {e.strerror}") from None
    if len(data) > limit:  # grew since the fstat
        raise ValueError(f"{what} {name}: more than the {limit} bytes a configuration file may hold")
    try:
        return name, data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {name}: not UTF-8 text (byte {e.start}: {data[e.start]:#04x})") from None


def _unique_keys(what: str, name: str) -> Any:
    def pairs_to_dict(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"{what} {name}: the key {key!r} appears twice in one object")
            out[key] = value
        return out

    return pairs_to_dict


def load_json(path: Union[str, os.PathLike], what: str) -> Tuple[str, Any]:
    """(the file's name, its JSON value), :func:`read_text`'s checks first; a key twice in one
    object, a syntax error or nesting too deep is one ValueError naming the file."""
    name, text = read_text(path, what)
    try:
        return name, json.loads(text, object_pairs_hook=_unique_keys(what, name))
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {name}: not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{what} {name}: nested too deeply to be a configuration") from None


def load_yaml(path: Union[str, os.PathLike], what: str) -> Tuple[str, Any]:
    """(the file's name, its YAML value) with PyYAML's safe loader, as :func:`load_json` checks it."""
    name, text = read_text(path, what)
    try:
        import yaml
    except ImportError:
        raise ImportError(f"reading {what} {name} needs PyYAML (pip install pyyaml); or write it as JSON") from None

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged by the base class
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise ValueError(f"{what} {name}: the key {key!r} appears twice in one mapping")
                seen.add(key)
            return super().construct_mapping(node, deep)

    try:
        return name, yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        raise ValueError(f"{what} {name}: not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ValueError(f"{what} {name}: nested too deeply to be a configuration") from None
