"""The process group an optimizer's gradient statistics are reduced over, for
:class:`ampkit.GradScaler`.

With FSDP2 (``fully_shard``) each rank holds a shard of every gradient, as a DTensor: the C++ side
measures the local shards and reduces the figures over the device mesh's group in one collective
before its one read (python/src/group_reduction.h), so every rank decides on the global numbers, as
torch's GradScaler and ``clip_grad_norm_`` do on DTensors. Plain gradients (DDP, or one process) are
whole on every rank and are not reduced, unless the loss is averaged across ranks
(``average_loss=True``) or a process group is named: then their figures ride in the same collective.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

__all__ = ["StatisticsGroup"]


def _dtensor_types() -> Tuple[Any, Any, Any]:
    """(DTensor, Shard, Replicate), or Nones where torch.distributed is not built."""
    if not torch.distributed.is_available():
        return None, None, None
    from torch.distributed.tensor import DTensor, Replicate, Shard

    return DTensor, Shard, Replicate


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class StatisticsGroup:
    """One GradScaler's choice: ``process_group`` (None: automatic) and ``average_loss``."""

    def __init__(self, process_group: Any, average_loss: bool) -> None:
        self.process_group = process_group
        self.average_loss = average_loss

    def __getstate__(self) -> dict:
        # A ProcessGroup does not pickle: its c10d name does, and is resolved again on use.
        group = self.process_group
        return {
            "process_group": group if group is None or isinstance(group, str) else group.group_name,
            "average_loss": self.average_loss,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def _named_group(self) -> Any:
        if isinstance(self.process_group, str):
            from torch.distributed.distributed_c10d import _resolve_process_group

            self.process_group = _resolve_process_group(self.process_group)  # type: ignore[arg-type]
        return self.process_group

    def passes_loss(self, world_size: int) -> bool:
        """Whether the NaN policy reads the loss: one rank, or the loss averaged over the ranks. Under
        DDP every rank sees the same averaged gradients but its own loss: a decision that read the
        loss could differ between ranks, so the policy sees the gradients only."""
        return world_size == 1 or self.average_loss

    def plan(self, params: Sequence[torch.Tensor]) -> Tuple[str, bool, bool]:
        """For an optimizer's ``params``: (the c10d name of the group its statistics are reduced over,
        "" for none; whether its gradients are sharded over that group; whether they are DTensors,
        whose local shards :meth:`local_gradients` gives each step)."""
        dtensor, shard, replicate = _dtensor_types()
        distributed = [p for p in params if dtensor is not None and isinstance(p, dtensor)]
        if not distributed:
            named = self._named_group()
            if named is None and not (self.average_loss and _distributed() and torch.distributed.get_world_size() > 1):
                return "", False, False
            group: Any = named if named is not None else torch.distributed.group.WORLD
            return group.group_name, False, False
        if len(distributed) != len(params):
            raise ValueError(
                "ampkit.GradScaler: an optimizer's parameters are partly DTensors (FSDP2's shards) and partly "
                "plain tensors; give the sharded and the plain ones to separate optimizers"
            )
        mesh = distributed[0].device_mesh
        if any(p.device_mesh != mesh for p in distributed):
            raise ValueError("ampkit.GradScaler: an optimizer's DTensor parameters lie on different device meshes")
        if mesh.ndim != 1:
            raise ValueError(
                f"ampkit.GradScaler: DTensor parameters on a {mesh.ndim}-D device mesh (HSDP) are not supported; "
                "fully_shard over a 1-D mesh"
            )
        sharded = [any(isinstance(pl, shard) for pl in p.placements) for p in distributed]
        if (
            any(sharded)
            and not all(sharded)
            or not all(isinstance(pl, (shard, replicate)) for p in distributed for pl in p.placements)
        ):
            raise ValueError(
                "ampkit.GradScaler: an optimizer's DTensor parameters must be all sharded (Shard) or all "
                f"replicated (Replicate); got placements {sorted({str(p.placements) for p in distributed})}"
            )
        group = self._named_group()
        if group is None:
            group = mesh.get_group()
        else:
            ranks, mesh_ranks = torch.distributed.get_process_group_ranks(group), mesh.mesh.flatten().tolist()
            if sorted(ranks) != sorted(mesh_ranks):
                raise ValueError(
                    f"ampkit.GradScaler: process_group holds ranks {sorted(ranks)}, but the gradients are sharded "
                    f"over ranks {sorted(mesh_ranks)} (their device mesh)"
                )
        return group.group_name, all(sharded), True

    @staticmethod
    def local_gradients(params: Sequence[torch.Tensor]) -> List[Optional[torch.Tensor]]:
        """Each DTensor gradient's local shard (None where a parameter has no gradient)."""
        return [None if p.grad is None else p.grad.to_local() for p in params]  # type: ignore[attr-defined]
