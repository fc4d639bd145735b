"""What a healthy ampkit.GradScaler step costs the host, counted (host work per step must not grow with the parameters): the number of top-level
ATen operators and of tensor allocations in ``scaler.step(opt); scaler.update()`` is the same for
10 and for 1,000 parameters, with the GPU's statistics recipe (chunk_kernel, whose chunks the host
computes on these CPU tensors) and a fused optimizer, as on a GPU. docs/architecture.md gives the
numbers."""

from typing import Dict, List

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import ampkit


def _top_level_aten(events: List) -> List[str]:
    """The ATen operators no other ATen operator called (a user annotation in between, such as the
    optimizer's step, does not count as a caller)."""
    names = []
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            names.append(e.name)
    return names


def _step_cost(n: int, recipe: str, clipper: str, torch_recipe: bool = False, sync: str = "step") -> Dict[str, object]:
    """The operators and allocations of the fourth step's post-backward part; `torch_recipe`: torch's
    GradScaler + unscale_ + clip_grad_norm_ instead, counted the same way."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(16)) for _ in range(n)]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    if torch_recipe:
        scaler = torch.amp.GradScaler("cpu")
    else:
        scaler = ampkit.GradScaler("cpu", clipper=clipper, stats_recipe=recipe, sync=sync,
                                   opt={"clipper.max_norm": 1.0} if clipper == "norm" else {})
    x = torch.randn(16)
    for step in range(4):  # the first steps bind the optimizer's table and make the buffers
        opt.zero_grad()
        loss = torch.stack([(p * x).sum() for p in params]).sum() * 1e-3
        scaler.scale(loss).backward()
        if step < 3:
            scaler.step(opt)
            scaler.update()
            continue
        reads = torch.ops.ampkit.host_reads()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            if torch_recipe:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            stepped = scaler.step(opt)
            scaler.update()
    if not torch_recipe:
        assert bool(stepped) is True
        assert scaler.last_step["stats_recipe"] == recipe
    reads = torch.ops.ampkit.host_reads() - reads
    events = list(prof.events())
    return {
        "reads": reads,
        "ops": sorted(_top_level_aten(events)),
        "allocations": sum(1 for e in events if e.name == "[memory]" and e.cpu_memory_usage > 0),
    }


# Top-level ATen operators of one healthy step(); update() with the GPU's recipe on CPU tensors:
# synchronous, the loss (one per iteration: no division), its slot and the sum of squares in the statistics' buffer (narrow,
# view, select, sum, copy_), the grad_scale fill, the scale's refresh and the fused AdamW's own
# five; deferred, no host read, and the strategies' device rules in one call whatever the clipper (on a GPU one
# kernel: core/engine/src/cuda/step_rules_abi.h; as ATen operators on 0-dim tensors they were 131 and 125).
EXPECTED = {("step", "norm"): (16, 1), ("step", "none"): (16, 1), ("deferred", "norm"): (31, 0),
            ("deferred", "none"): (31, 0)}


@pytest.mark.parametrize("sync", ["step", "deferred"])
@pytest.mark.parametrize("clipper", ["norm", "none"])
def test_a_healthy_step_costs_the_same_for_10_and_1000_parameters(clipper, sync):
    small = _step_cost(10, "chunk_kernel", clipper, sync=sync)
    large = _step_cost(1000, "chunk_kernel", clipper, sync=sync)
    torch_small = _step_cost(10, "", clipper, torch_recipe=True)
    torch_large = _step_cost(1000, "", clipper, torch_recipe=True)
    print(f"clipper {clipper}, sync {sync}: {len(small['ops'])} top-level operators, {small['allocations']} "
          f"allocations, {small['reads']} host reads; torch's recipe: {len(torch_small['ops'])} and "
          f"{len(torch_large['ops'])} operators")
    assert large["ops"] == small["ops"]
    assert large["allocations"] == small["allocations"]
    ops, reads = EXPECTED[(sync, clipper)]
    assert len(small["ops"]) == ops, small["ops"]
    assert small["reads"] == large["reads"] == reads
    assert small["allocations"] <= 1
    assert len(torch_large["ops"]) > len(large["ops"])


def test_the_recipe_is_chosen_once_and_reported():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampkit.GradScaler("cpu", model=model)
    scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.last_step["stats_recipe"] == "fused_scan"  # automatic, for fp32 CPU parameters
    with pytest.raises(ValueError, match="statistics recipe 'kernel' is not one of automatic, fused_scan"):
        ampkit.GradScaler("cpu", stats_recipe="kernel")
