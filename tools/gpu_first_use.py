#!/usr/bin/env python3
"""The GPU checks of what no CPU can show (tools/gpu-check.sh's first-use section), one per call:

  gpu_first_use.py fresh-thread   the first ampkit call of the process made from a new thread (the
                                  kernels' module is loaded there, into the device's primary context):
                                  its steps equal the same steps made on the main thread
  gpu_first_use.py side-stream    deferred steps on a non-default stream equal those on the default one
  gpu_first_use.py graph          the whole step captured on a side stream, replayed N times: the records
                                  (count, scales, skips, state) equal N eager steps'
  gpu_first_use.py sync-debug     with torch.cuda.set_sync_debug_mode("error") after the warm-up (the
                                  self-check reads once, at first use), 30 deferred steps read nothing
  gpu_first_use.py sync-debug-first
                                  with set_sync_debug_mode("error") from before the first ampkit call,
                                  the self-check's own copies pass (the mode is suspended for it and
                                  restored): 30 deferred steps, none falling back
  gpu_first_use.py sanitized      a short deferred run with a capture, for compute-sanitizer
  gpu_first_use.py --list         the checks, one per line: NAME<TAB>what it shows (no torch import)

Prints one line (what was compared, with numbers) and exits 0 when it holds, 1 when not, 77 where
torch sees no GPU. Steps use ampkit.GradScaler(sync="deferred") with a fused AdamW, fp16 autocast,
a planted overflow every 7th step and clipping, so that skips, backoffs and clips all happen.
"""

import sys
import threading

CHECKS = {
    "fresh-thread": "first ampkit call from a new thread = the same steps on the main thread",
    "side-stream": "deferred steps on a non-default stream = on the default stream",
    "graph": "capture on a side stream, N replays: records (count, scales, skips, state) = N eager steps",
    "sync-debug": 'set_sync_debug_mode("error"): 30 deferred steps after the warm-up make no synchronisation',
    "sync-debug-first": 'set_sync_debug_mode("error") before first use: the kernels pass their check, mode restored',
    "sanitized": "a short deferred run with a capture (run under compute-sanitizer)",
}
STEPS = 30


def _setup(seed: int = 0):
    import ampkit
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
    scaler = ampkit.GradScaler(
        "cuda",
        sync="deferred",
        init_scale=2.0**14,
        growth_interval=5,
        clipper="norm",
        opt={"clipper.max_norm": 0.5},
        nan_policy="backoff",
    )
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 8, device="cuda")
    return model, opt, scaler, x, y


def _step(model, opt, scaler, x, y, overflow) -> None:
    import torch

    opt.zero_grad(set_to_none=False)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss * overflow).backward()  # overflow: 1, or inf on a planted overflow
    scaler.step(opt)
    scaler.update()


def _overflow(i: int, x):
    import torch

    return torch.full((), float("inf") if i % 7 == 3 else 1.0, device=x.device)


def _run(steps: int = STEPS, stream=None):
    """The steps (on `stream` where given); the parameters, the state and the last record."""
    import torch

    model, opt, scaler, x, y = _setup()
    ctx = torch.cuda.stream(stream) if stream is not None else _nothing()
    with ctx:
        for i in range(steps):
            _step(model, opt, scaler, x, y, _overflow(i, x))
    torch.cuda.synchronize()
    return _outcome(model, scaler)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _outcome(model, scaler):
    record = {k: v for k, v in scaler.last_step.items() if k not in ("host_sync_reason", "layer_norms", "top_layers")}
    return {"params": [p.detach().cpu() for p in model.parameters()], "state": scaler.state_dict(), "record": record}


def _same(a, b) -> str:
    import torch

    if not all(torch.equal(p, q) for p, q in zip(a["params"], b["params"])):
        return "the parameters differ"
    if a["state"] != b["state"]:
        return f"the states differ: {a['state']} against {b['state']}"
    if a["record"] != b["record"]:
        return f"the last records differ: {a['record']} against {b['record']}"
    return ""


def fresh_thread() -> str:
    import torch

    torch.zeros(1, device="cuda")  # the main thread has CUDA; ampkit has not run anywhere yet
    got = {}
    worker = threading.Thread(target=lambda: got.update(_run()))
    worker.start()
    worker.join()
    if not got:
        return "FAILED: the thread's steps raised (above)"
    differs = _same(got, _run())
    host_sync = got["record"]["host_sync"]
    return (
        differs or f"{STEPS} steps from a new thread = the main thread's ({host_sync}, scale {got['state']['scale']})"
    )


def side_stream() -> str:
    import torch

    got = _run(stream=torch.cuda.Stream())
    return _same(got, _run()) or f"{STEPS} deferred steps on a side stream = the default stream's, bit for bit"


def graph(replays: int = STEPS) -> str:
    import torch

    model, opt, scaler, x, y = _setup()
    overflow = torch.ones((), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):  # the warm-up: the deferred step made, uncaptured
            overflow.copy_(_overflow(i, x))
            _step(model, opt, scaler, x, y, overflow)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        _step(model, opt, scaler, x, y, overflow)
    for i in range(3, 3 + replays):
        overflow.copy_(_overflow(i, x))
        g.replay()
    torch.cuda.synchronize()
    got = _outcome(model, scaler)
    want = _run(3 + replays)
    steps = got["record"]["step"]
    return _same(got, want) or f"{replays} replays: {steps + 1} records, equal to {3 + replays} eager steps'"


def sync_debug() -> str:
    import torch

    model, opt, scaler, x, y = _setup()
    overflows = [_overflow(i, x) for i in range(STEPS + 2)]
    for i in range(2):  # the warm-up: the deferred step made, the kernels loaded and checked
        _step(model, opt, scaler, x, y, overflows[i])
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(2, STEPS + 2):
            _step(model, opt, scaler, x, y, overflows[i])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return f"{STEPS} deferred steps under set_sync_debug_mode('error'): no synchronisation"


def sync_debug_first() -> str:
    import warnings

    import torch

    model, opt, scaler, x, y = _setup()
    overflows = [_overflow(i, x) for i in range(STEPS)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # before ampkit's first use: its self-check runs under it
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(STEPS):
                _step(model, opt, scaler, x, y, overflows[i])
        mode = torch.cuda.get_sync_debug_mode()
    except RuntimeError as e:
        return f"FAILED: a step under set_sync_debug_mode('error') from the first one synchronised: {e}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
    said = [str(w.message) for w in caught if "stays synchronous" in str(w.message)]
    if said:
        return f"FAILED: {said[0]}"
    if mode != 2:
        return f"FAILED: the sync debug mode is {mode} after the first use, not 2 (error)"
    host_sync = scaler.last_step["host_sync"]
    if host_sync != "deferred":
        return f"FAILED: the last step's host_sync is {host_sync!r}, not 'deferred'"
    return f"{STEPS} deferred steps under set_sync_debug_mode('error') from the first: the kernels kept, mode restored"


def sanitized() -> str:
    return graph(replays=5)


def main(argv) -> int:
    if argv == ["--list"]:
        for name, what in CHECKS.items():
            print(f"{name}\t{what}")
        return 0
    if len(argv) != 1 or argv[0] not in CHECKS:
        sys.exit(__doc__)
    import torch

    if not torch.cuda.is_available():
        print("skipped: torch sees no GPU")
        return 77
    said = globals()[argv[0].replace("-", "_")]()
    print(said)
    return 1 if said.startswith("FAILED") or " differ" in said else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
