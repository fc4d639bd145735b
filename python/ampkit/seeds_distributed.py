"""The seeds' DistributedConfig and DistributedAMPTrainer (re-exported by :mod:`ampkit.seeds`):
torchrun's layout and rendezvous, and :class:`~ampkit.seeds.AMPTrainer` over torch DDP."""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Union

import torch

from ._arguments import check_number, check_types, parse_int
from ._files import load_json, load_torch_state, load_yaml
from .seeds_nan import _did_you_mean
from .seeds_trainer import AMPConfig, AMPTrainer, create_default_amp_config

__all__ = ["DistributedAMPTrainer", "DistributedConfig"]

_ENV_NAMES = (
    ("rank", "RANK"),
    ("world_size", "WORLD_SIZE"),
    ("local_rank", "LOCAL_RANK"),
    ("master_addr", "MASTER_ADDR"),
    ("master_port", "MASTER_PORT"),
)

_TEXT = ("backend", "master_addr")
# ampkit-train's bound on the world size (its --world-size option's range).
_MAX_WORLD_SIZE = 1 << 20
# The longest timeout taken, some 31 years: well inside what a datetime.timedelta and c10d's
# milliseconds hold (a larger one failed later, with an OverflowError).
_MAX_TIMEOUT_S = 10**9


def _default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


@dataclass
class DistributedConfig:
    """Where this process sits in a data-parallel job and how it joins the process group
    (``init_method`` None: ``tcp://master_addr:master_port``)."""

    backend: str = field(default_factory=_default_backend)
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    init_method: Optional[str] = None
    timeout_s: Optional[float] = None

    def to_env_dict(self) -> Dict[str, str]:
        """torchrun's variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT."""
        return {env: str(getattr(self, name)) for name, env in _ENV_NAMES}

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, **fields: Any) -> "DistributedConfig":
        """From torchrun's variables in ``env`` (None: ``os.environ``); ``fields`` set the others.
        The integers are read as ampkit-train reads them (ASCII decimal digits only: no spaces,
        ``_`` or other scripts' digits), and the result is :meth:`validate`'d."""
        env = os.environ if env is None else env
        values: Dict[str, Any] = {}
        for name, var in ((n, v) for n, v in _ENV_NAMES if v in env):
            text = env[var]
            values[name] = text if name == "master_addr" else parse_int("DistributedConfig.from_env", var, text)
        return cls(**{**values, **fields}).validate()

    @classmethod
    def from_file(cls, path: Union[str, os.PathLike]) -> "DistributedConfig":
        """From a YAML (needs PyYAML) or JSON file of these fields, at the top or under ``distributed:``."""
        what = "distributed config"
        name = os.fsdecode(os.fspath(path))
        _, data = load_yaml(path, what) if name.endswith((".yaml", ".yml")) else load_json(path, what)
        data = {} if data is None else data
        data = data.get("distributed", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            raise ValueError(f"{what} {name}: expected a mapping of DistributedConfig fields")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in (k for k in data if k not in names):
            raise ValueError(f"{what} {name}: unknown field '{key}'" + _did_you_mean(str(key), names))
        try:
            return cls(**data).validate()
        except (TypeError, ValueError) as e:
            raise type(e)(f"{what} {name}: {e}") from None

    def validate(self) -> "DistributedConfig":
        """Raises :class:`TypeError` or :class:`ValueError` naming the first bad field; returns self.

        Integers are ints (not bools, not floats), in ampkit-train's ranges: ``world_size`` in
        [1, 2**20], ``rank`` and ``local_rank`` in [0, world_size), ``master_port`` in [1, 65535];
        ``master_addr`` a host name or address without spaces or control characters; ``timeout_s``
        None or a positive finite number of seconds a ``datetime.timedelta`` holds."""
        who = "DistributedConfig"
        check_types(who, {"backend": self.backend, "master_addr": self.master_addr}, {n: (str,) for n in _TEXT})
        check_types(who, {"init_method": self.init_method}, {"init_method": (str, type(None))})
        known = [b for b in torch.distributed.Backend.backend_list if b != "undefined"]
        if not all(p.split(":")[-1] in known for p in self.backend.split(",")):
            raise ValueError(f"{who}: backend='{self.backend}' is not one of {', '.join(known)}")
        check_number(who, "world_size", self.world_size, 1, _MAX_WORLD_SIZE, integer=True)
        for name in ("rank", "local_rank"):
            value = getattr(self, name)
            check_number(who, name, value, 0, _MAX_WORLD_SIZE, integer=True)
            if value >= self.world_size:
                raise ValueError(f"{who}: {name}={value} must be in [0, world_size={self.world_size})")
        for name in ("master_addr", "init_method"):
            text = getattr(self, name)
            if text is not None and (not text or any(c.isspace() or not c.isprintable() for c in text)):
                raise ValueError(f"{who}: {name}={text!r:.80} must be non-empty, without spaces or control characters")
        check_number(who, "master_port", self.master_port, 1, 65535, integer=True)
        if self.timeout_s is not None:
            check_number(who, "timeout_s", self.timeout_s, 0, _MAX_TIMEOUT_S, low_open=True)
        return self

    def resolved_init_method(self) -> str:
        return self.init_method or f"tcp://{self.master_addr}:{self.master_port}"


class DistributedAMPTrainer(AMPTrainer):
    """:class:`AMPTrainer` over torch DDP: joins the process group of ``dist_config`` (None: from
    torchrun's environment) unless one is initialized, puts the model on ``cuda:local_rank`` (nccl
    with CUDA) or the CPU (unless ``amp_config.device`` says otherwise) and wraps it in DDP."""

    def __init__(
        self,
        model: torch.nn.Module,
        amp_config: Optional[AMPConfig] = None,
        dist_config: Optional[DistributedConfig] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        loss_fn: Optional[Callable] = None,
    ) -> None:
        dc = (dist_config if dist_config is not None else DistributedConfig.from_env()).validate()
        self.dist_config = dc
        if not torch.distributed.is_initialized():
            extra: Dict[str, Any] = (
                {} if dc.timeout_s is None else {"timeout": datetime.timedelta(seconds=dc.timeout_s)}
            )
            torch.distributed.init_process_group(
                dc.backend, init_method=dc.resolved_init_method(), world_size=dc.world_size, rank=dc.rank, **extra
            )
        config = amp_config if amp_config is not None else create_default_amp_config()
        if config.device is not None:
            device = torch.device(config.device)
        elif "nccl" in dc.backend and torch.cuda.is_available():
            device = torch.device("cuda", dc.local_rank)
        else:
            device = torch.device("cpu")
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        ids = [device.index] if device.type == "cuda" and device.index is not None else None
        ddp = torch.nn.parallel.DistributedDataParallel(model.to(device), device_ids=ids)
        super().__init__(ddp, dataclasses.replace(config, device=None), optimizer, loss_fn)

    def save_checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Rank 0 writes model (unwrapped), optimizer and scaler; every rank waits for it."""
        if torch.distributed.get_rank() == 0:
            torch.save(self.state_dict(), path)
        torch.distributed.barrier()

    def load_checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Every rank loads :meth:`save_checkpoint`'s file onto its own device."""
        self.load_state_dict(load_torch_state(path, "checkpoint", map_location=self.device))
