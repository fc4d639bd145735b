"""A read of ampkit.GradScaler's host state after CUDA graph captures waits for the device once: every
step captured before a state change (load_state_dict, update(new_scale), an option set) is kept, so
that a replay of its graph is caught, and its record count is read at each read of the host state,
all after one wait for the whole device (a graph replays on any stream). A wait per kept step stalled
every stream of the device again for each of them.

On CPU tensors the capture's flag is raised as in test_cuda_graph.py, and the engine counts the waits
it would make on a GPU (torch.ops.ampkit.device_waits)."""

from typing import Any, Dict

import ampkit
import torch
from test_graph_lifetime import _step


def _captures(flag: Dict[str, bool], opt: torch.optim.Optimizer, scaler: Any) -> None:
    """Two uncaptured steps, then a captured one (its graph "replayed" once: the CPU runs it at once)."""
    for i in range(3):
        flag["on"] = i == 2
        _step(opt, scaler)
        flag["on"] = False


def test_a_host_state_read_waits_for_the_device_once_however_many_captures_are_kept(capture_flag):
    param = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.AdamW([param], lr=1e-3, fused=True)
    scaler = ampkit.GradScaler("cpu", sync="deferred", stats_recipe="chunk_kernel", init_scale=2.0**10)
    waits, reads = [], []
    for _ in range(4):
        _captures(capture_flag, opt, scaler)
        for read in (scaler.get_scale, lambda: scaler.last_step, scaler.state_dict):
            before_waits, before_reads = torch.ops.ampkit.device_waits(), torch.ops.ampkit.host_reads()
            read()
            waits.append(torch.ops.ampkit.device_waits() - before_waits)
            reads.append(torch.ops.ampkit.host_reads() - before_reads)
        scaler.load_state_dict(scaler.state_dict())  # the state replaced: this capture's step is kept aside
    # get_scale() and last_step deliver once, state_dict() six times (its scale, each kind's state): one
    # wait each, with 0, 1, 2 or 3 steps kept aside. It was one more wait for each kept step.
    assert waits == [1, 1, 6] * 4, waits
    # The reads: each kept step's count, the current step's count, and its new rows on the first read.
    assert reads == [n for kept in range(4) for n in (kept + 2, kept + 1, 6 * (kept + 1))], reads
