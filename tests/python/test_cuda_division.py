"""The mean of an iteration's losses, as ampkit.GradScaler hands it to the NaN policy and the record,
is the correctly rounded quotient on every device. ATen's CUDA kernel divides a tensor by a plain
number as a * (1 / b) (the CPU kernel divides): a mode that rounds CPU divisions by plain numbers as
CUDA does shows the old form, ``loss_sum / count``, giving another float32 than sum / 3."""

from typing import Any, Dict

import ampkit
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

LOSSES = [0.8359106183052063, 2.618584394454956, 2.4094364643096924]  # float32 values


class CudaDivision(TorchDispatchMode):
    """Divisions of a float tensor by a plain number rounded as CUDA's kernel does: times the
    reciprocal, computed in the tensor's opmath type (float32 for float32)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        plain = func in (torch.ops.aten.div.Tensor, torch.ops.aten.div.Scalar) and not kwargs
        if plain and isinstance(args[1], (int, float)) and args[0].dtype in (torch.float32, torch.float64):
            inverse = torch.ones((), dtype=args[0].dtype) / torch.tensor(float(args[1]), dtype=args[0].dtype)
            return torch.ops.aten.mul.Tensor(args[0], inverse)
        return func(*args, **kwargs)


def _iteration(sync: str) -> Dict[str, Any]:
    weight = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.AdamW([weight], lr=1e-3, fused=True)
    scaler = ampkit.GradScaler("cpu", sync=sync, init_scale=2.0**4)
    for value in LOSSES:  # three micro-batches of one iteration
        scaler.scale((weight * value).sum()).backward()
    with CudaDivision():
        scaler.step(opt)
        scaler.update()
    return scaler.last_step


@pytest.mark.parametrize("sync", ["step", "deferred"])
def test_the_iteration_loss_is_the_correctly_rounded_mean_under_cudas_division(sync):
    total = torch.tensor(LOSSES[0]) + torch.tensor(LOSSES[1]) + torch.tensor(LOSSES[2])  # float32, in order
    mean = (total / torch.tensor(3.0)).item()
    with CudaDivision():
        reciprocal = (total / 3).item()
    assert reciprocal != mean  # the mode rounds as CUDA does, and these losses tell the two apart
    assert _iteration(sync)["loss"] == mean
