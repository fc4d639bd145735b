"""The files a user hands the Python package are read as ampkit-train reads them: a regular file
only (a FIFO, /dev/zero or a folder refused at once, before any read that could block or never
end), at most 16 MiB of UTF-8, JSON or YAML with no key twice in one object and no nesting deeper
than Python's stack; each refusal one line naming the file."""

import contextlib
import json
import os
import re
import signal
import time

import ampkit
import pytest
from ampkit.seeds import DistributedConfig

FP16 = {"fp16": {"enabled": True, "initial_scale_power": 10}}


@contextlib.contextmanager
def _within(seconds: float):
    """Fails the test (instead of hanging it) where the body blocks longer than ``seconds`` x 5,
    and asserts it took less than ``seconds``."""

    def late(*_):
        raise TimeoutError(f"blocked for more than {seconds * 5:g} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds * 5)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < seconds


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def _deepspeed(path):
    return ampkit.GradScaler.from_deepspeed_config(path, "cpu")


@pytest.mark.parametrize("read", [_deepspeed, DistributedConfig.from_file], ids=["deepspeed", "distributed"])
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_fifo_is_refused_within_a_second_naming_the_file(tmp_path, read, suffix):
    fifo = tmp_path / f"config{suffix}"
    os.mkfifo(fifo)  # no writer: a blocking open or read would wait forever
    with _within(1.0), pytest.raises(ValueError) as caught:
        read(fifo)
    assert _one_line(caught).endswith(f"{fifo}: a FIFO, not a regular file")


@pytest.mark.parametrize("read", [_deepspeed, DistributedConfig.from_file], ids=["deepspeed", "distributed"])
def test_a_device_and_a_folder_are_refused_at_once(tmp_path, read):
    with _within(1.0), pytest.raises(ValueError) as caught:
        read("/dev/zero")  # would read without end
    assert _one_line(caught).endswith("/dev/zero: a character device, not a regular file")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path}: a folder, not a regular file") + "$"):
        read(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'gone.json'}: no such file") + "$"):
        read(tmp_path / "gone.json")


def test_a_file_past_16_mib_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(16 * 1024 * 1024 + 1)  # sparse: nothing is written, nothing should be read
    with _within(1.0), pytest.raises(ValueError) as caught:
        _deepspeed(big)
    assert _one_line(caught) == (
        f"DeepSpeed config {big}: 16777217 bytes, more than the 16777216 a configuration file may hold"
    )


def test_non_utf8_text_is_one_error_naming_the_file(tmp_path):
    for name, read in (("ds.json", _deepspeed), ("d.json", DistributedConfig.from_file)):
        path = tmp_path / name
        path.write_bytes(b'{"fp16": {"enabled": true}, "x": "\xff"}')
        with pytest.raises(ValueError) as caught:
            read(path)
        assert _one_line(caught).endswith(f"{path}: not UTF-8 text (byte 34: 0xff)")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_nesting_5000_deep_is_one_clear_error_not_a_recursion_error(tmp_path, suffix):
    path = tmp_path / f"deep{suffix}"
    path.write_text("[" * 5000 + "]" * 5000)
    for read in (_deepspeed, DistributedConfig.from_file):
        if read is _deepspeed and suffix == ".yaml":
            continue  # DeepSpeed configs are JSON
        with pytest.raises(ValueError) as caught:
            read(path)
        assert _one_line(caught).endswith(f"{path}: nested too deeply to be a configuration")
    deep: dict = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(ValueError, match=r"^DeepSpeed config \(dict\) is nested too deeply to be a configuration$"):
        ampkit.GradScaler.from_deepspeed_config(dict(FP16, zero_optimization=deep), "cpu")


def test_a_key_twice_in_one_object_is_refused_naming_the_key(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"fp16": {"enabled": true, "initial_scale_power": 10, "initial_scale_power": 20}}')
    with pytest.raises(ValueError) as caught:
        _deepspeed(ds)
    assert _one_line(caught) == f"DeepSpeed config {ds}: the key 'initial_scale_power' appears twice in one object"
    dj = tmp_path / "d.json"
    dj.write_text('{"backend": "gloo", "world_size": 2, "world_size": 4}')
    with pytest.raises(ValueError) as caught:
        DistributedConfig.from_file(dj)
    assert _one_line(caught) == f"distributed config {dj}: the key 'world_size' appears twice in one object"
    dy = tmp_path / "d.yaml"
    dy.write_text("distributed:\n  backend: gloo\n  rank: 0\n  rank: 1\n")
    with pytest.raises(ValueError) as caught:
        DistributedConfig.from_file(dy)
    assert _one_line(caught) == f"distributed config {dy}: the key 'rank' appears twice in one mapping"


def test_a_good_file_still_reads_and_its_field_errors_name_it(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(FP16))
    assert _deepspeed(ds).get_scale() == 1024.0
    dy = tmp_path / "d.yaml"
    dy.write_text("distributed:\n  backend: gloo\n  world_size: 2\n  rank: 1\n")
    assert DistributedConfig.from_file(dy) == DistributedConfig(backend="gloo", world_size=2, rank=1)
    dy.write_text("distributed:\n  backend: gloo\n  world_size: 1.5\n")
    with pytest.raises(TypeError) as caught:
        DistributedConfig.from_file(dy)
    assert _one_line(caught) == f"distributed config {dy}: DistributedConfig: world_size must be an int, got float 1.5"


def test_a_yaml_merge_key_is_not_a_repeated_key(tmp_path):
    """`<<: *anchor` is YAML's merge, not a key given twice: it reads as PyYAML's safe loader reads it."""
    dy = tmp_path / "d.yaml"
    dy.write_text("base: &base\n  backend: gloo\n  world_size: 2\ndistributed:\n  <<: *base\n  rank: 1\n")
    assert DistributedConfig.from_file(dy) == DistributedConfig(backend="gloo", world_size=2, rank=1)
