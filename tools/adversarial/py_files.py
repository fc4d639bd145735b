"""Python cases: the files a user hands GradScaler.from_deepspeed_config and DistributedConfig.from_file
(files.py writes them); every refusal within the case's time (1 s for a FIFO or a device), one line
naming the file or the key."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any, Callable, List

from common import PyCase
from files import DEEPSPEED_BAD, FP16, Reader, files_for

DISTRIBUTED = {"backend": "gloo", "world_size": 2, "rank": 1, "master_port": 29511}
DISTRIBUTED_BAD = [
    (("world_size",), "2"),
    (("world_size",), 1.5),
    (("world_size",), True),
    (("world_size",), None),
    (("world_size",), 0),
    (("world_size",), 10**400),
    (("rank",), 2),
    (("rank",), -1),
    (("rank",), "1"),
    (("master_port",), 70000),
    (("master_port",), "29500"),
    (("master_port",), 29500.5),
    (("timeout_s",), float("inf")),
    (("timeout_s",), float("nan")),
    (("timeout_s",), -1),
    (("master_addr",), "a b"),
    (("master_addr",), ""),
    (("backend",), 5),
    (("nosuch",), 1),
]


def _deepspeed(path: str) -> Any:
    import ampkit

    return ampkit.GradScaler.from_deepspeed_config(path, "cpu")


def _distributed(path: str) -> Any:
    from ampkit.seeds import DistributedConfig

    return DistributedConfig.from_file(path)


READERS: List[tuple] = [
    (Reader("GradScaler.from_deepspeed_config", ".json", FP16, ("fp16", FP16["fp16"]), DEEPSPEED_BAD), _deepspeed)
] + [
    (
        Reader(
            f"DistributedConfig.from_file {suffix}",
            suffix,
            {"distributed": DISTRIBUTED},
            ("distributed", DISTRIBUTED),
            [(("distributed",) + k, v) for k, v in DISTRIBUTED_BAD],
        ),
        _distributed,
    )
    for suffix in (".json", ".yaml")
]


def _call(read: Callable[[str], Any], path: str) -> Callable[[], Any]:
    return lambda: read(path)


def cases() -> List[PyCase]:
    root = tempfile.mkdtemp(prefix="ampkit-adversarial-files-")
    atexit.register(shutil.rmtree, root, True)
    out: List[PyCase] = []
    for i, (reader, read) in enumerate(READERS):
        folder = os.path.join(root, str(i))
        os.mkdir(folder)
        for f in files_for(folder, reader):
            out.append(
                PyCase(f"files: {reader.label}", f.kind, _call(read, f.path), f.expect, f.names, timeout=f.timeout)
            )
    return out
