"""The seeds' DistributedConfig and DistributedAMPTrainer (re-exported by :mod:`ampkit.seeds`):
torchrun's layout and rendezvous, and :class:`~ampkit.seeds.AMPTrainer` over torch DDP."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Union

import torch

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
        """From torchrun's variables in ``env`` (None: ``os.environ``); ``fields`` set the others."""
        env = os.environ if env is None else env
        values: Dict[str, Any] = {}
        for name, var in ((n, v) for n, v in _ENV_NAMES if v in env):
            try:
                values[name] = env[var] if name == "master_addr" else int(env[var])
            except ValueError:
                raise ValueError(f"{var}={env[var]!r} is not an integer") from None
        return cls(**{**values, **fields})

    @classmethod
    def from_file(cls, path: Union[str, os.PathLike]) -> "DistributedConfig":
        """From a YAML (needs PyYAML) or JSON file of these fields, at the top or under ``distributed:``."""
        path = os.fspath(path)
        with open(path) as f:
            text = f.read()
        if path.endswith((".yaml", ".yml")):
            try:
                import yaml
            except ImportError:
                raise ImportError(f"reading {path} needs PyYAML (pip install pyyaml); or write it as JSON") from None
            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        data = data.get("distributed", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of DistributedConfig fields")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in (k for k in data if k not in names):
            raise ValueError(f"{path}: unknown field '{key}'" + _did_you_mean(key, names))
        return cls(**data).validate()

    def validate(self) -> "DistributedConfig":
        """Raises :class:`ValueError` naming the first bad field; returns self."""
        known = [b for b in torch.distributed.Backend.backend_list if b != "undefined"]
        checks = [
            (
                all(p.split(":")[-1] in known for p in self.backend.split(",")),
                f"backend='{self.backend}' is not one of {', '.join(known)}",
            ),
            (self.world_size >= 1, f"world_size={self.world_size} must be at least 1"),
            (0 <= self.rank < self.world_size, f"rank={self.rank} must be in [0, world_size={self.world_size})"),
            (
                0 <= self.local_rank < self.world_size,
                f"local_rank={self.local_rank} must be in [0, world_size={self.world_size})",
            ),
            (bool(self.master_addr), "master_addr is empty"),
            (0 < self.master_port < 65536, f"master_port={self.master_port} must be in [1, 65535]"),
            (self.timeout_s is None or self.timeout_s > 0, f"timeout_s={self.timeout_s} must be positive"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"DistributedConfig.{message}")
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
        self.load_state_dict(torch.load(path, map_location=self.device, weights_only=True))
