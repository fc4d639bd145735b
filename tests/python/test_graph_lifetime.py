"""What a deferred step captured in a CUDA graph reads and writes stays allocated as long as the graph
can replay it: the gradient table it measured (the gradients, the chunk table, the packed buffer)
is held with the step, so a rebind (the optimizer's parameters changed) or an unbind (the optimizer
is gone) after the capture leaves no replay writing into freed memory.

On CPU tensors the capture's flag is raised as in test_cuda_graph.py ("captured" steps run at once);
that the table is held shows in the parameters it names, which stay alive."""

import gc
import weakref
from typing import Any, Dict, List, Tuple

import ampkit
import torch


def _step(opt: torch.optim.Optimizer, scaler: Any) -> None:
    opt.zero_grad(set_to_none=False)
    loss = sum((p * p).sum() for group in opt.param_groups for p in group["params"])
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def _captured(flag: Dict[str, bool], params: List[torch.nn.Parameter]) -> Tuple[Any, Any]:
    """An optimizer over ``params`` and its scaler after two uncaptured steps and one captured."""
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    scaler = ampkit.GradScaler("cpu", sync="deferred", stats_recipe="chunk_kernel", init_scale=2.0**10)
    for i in range(3):
        flag["on"] = i == 2
        _step(opt, scaler)
        flag["on"] = False
    return opt, scaler


def test_a_rebind_after_a_capture_keeps_the_captured_table(capture_flag):
    kept = torch.nn.Parameter(torch.randn(4, 3))
    dropped = torch.nn.Parameter(torch.randn(70000))  # two chunks
    opt, scaler = _captured(capture_flag, [kept, dropped])
    gradient = dropped.grad.data_ptr()
    dropped_ref = weakref.ref(dropped)
    # The same sizes (a captured step's records keep their shape), another parameter: a new table.
    replacement = torch.nn.Parameter(torch.randn(70000))
    opt.param_groups[0]["params"] = [kept, replacement]
    opt.state.pop(dropped)
    del dropped
    _step(opt, scaler)  # binds the new list; its record follows the captured ones through the ring
    gc.collect()
    held = dropped_ref()
    assert held is not None  # the captured step's table holds it, and its gradient where it was
    assert held.grad is not None and held.grad.data_ptr() == gradient
    assert scaler.get_scale() == 2.0**10  # 4 clean steps, every record delivered in order
    assert scaler.last_step["step"] == 3


def test_an_unbind_after_a_capture_keeps_the_captured_table(capture_flag):
    params = [torch.nn.Parameter(torch.randn(3, 5)), torch.nn.Parameter(torch.randn(8))]
    opt, scaler = _captured(capture_flag, params)
    refs = [weakref.ref(p) for p in params]
    gradients = [p.grad.data_ptr() for p in params]
    opt_ref = weakref.ref(opt)
    del opt, params
    gc.collect()
    assert opt_ref() is None  # the optimizer is gone: its table unbound
    held = [r() for r in refs]
    assert all(p is not None for p in held)
    assert [p.grad.data_ptr() for p in held] == gradients
    assert scaler.get_scale() == 2.0**10
