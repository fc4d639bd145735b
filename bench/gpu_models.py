#!/usr/bin/env python3
"""ampkit.GradScaler against torch.amp.GradScaler + unscale_ + clip_grad_norm_ on GPT-2 and ViT-B/16.

    PYTHONPATH=build/python python3 bench/gpu_models.py [--device cuda|cpu] [--models gpt2,vit]
        [--precisions fp16,bf16] [--rounds 5] [--steps 10] [--warmup 3] [--compare-steps 20] [--tiny]
        [--sync auto|step|deferred] [--graph] [--json FILE]

Two models that nobody on this project wrote, randomly initialised (nothing is downloaded): Hugging
Face transformers' GPT2LMHeadModel from GPT2Config (124M: 12 layers, 768 wide, vocab 50257; batch
8 x 512 tokens, labels = input_ids) and timm's vit_base_patch16_224 (86.6M; batch 64 of 3x224x224,
cross-entropy on random labels), dropout off in both. --tiny uses configs that run on a CPU in
seconds (GPT-2: 2 layers, 64 wide, vocab 256, 2 x 32 tokens; ViT: 32x32 images, patch 8, depth 1,
width 32, batch 2).

Two recipes, each on its own copy of the same initial weights, with the same batches and
AdamW(lr=1e-4, fused=True), forward under autocast(device, dtype):
  torch:  scaler.scale(loss).backward(); scaler.unscale_(opt); clip_grad_norm_(params, 1.0);
          scaler.step(opt); scaler.update()              with torch.amp.GradScaler(device)
  ampkit: scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
          with ampkit.GradScaler(device, clipper="norm", opt={"clipper.max_norm": 1.0})
Both scale the loss in bf16 too (bf16 needs no loss scaling; the rows measure the same code path
in both precisions). A third recipe is the floor of both: loss.backward(); opt.step() with the
same fused AdamW and no scaler or clipping; its post-backward time is the optimizer's own, which
neither recipe can go below, and the table gives each scaler's cost above it (post-backward minus
the floor) and their ratio. --graph (CUDA) adds a fourth, ampkit's step captured whole in a CUDA
graph (docs/python.md): AdamW(fused=True, capturable=True), sync="deferred", static input buffers
the batch is copied into; 3 warm-up steps on a side stream, then forward, backward, step() and
update() captured once with torch.cuda.graph and replayed; its post-backward time cannot be taken
inside a graph (a capture that fails is reported in the table, with its error). Rounds alternate
torch, ampkit, the floor (and the graph), torch, ...; each round runs --warmup untimed steps, then
--steps timed ones. Step time: the round's wall time over its steps (the device is synchronised
at the round's ends only); median over rounds. Post-backward: from the end of backward to the end
of update() (of step() for the floor), CUDA events on a GPU (perf_counter on the CPU); median
over every timed step.

The skip-decision check runs both recipes in lockstep for --compare-steps steps from fresh copies
of the same weights, with one gradient element set to inf after backward at --overflow-step: a
step is skipped for torch when update() lowered the scale, for ampkit when step() returned False.
Exit status: 0, or 1 when a skip decision or a scale differs (or the planted overflow was not
skipped), so the table is also a check; 2 for bad arguments; 3 when a SIGTERM (a time limit's)
stopped it: the tables then hold the rows that were done. --json FILE is rewritten after every
row, with "complete": false until the last.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import platform
import signal
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights only: never reach a model hub

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SIZES = {
    "full": {
        "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024,
                 "batch": 8, "seq": 512},
        "vit": {"name": "vit_base_patch16_224", "overrides": {}, "batch": 64, "img": 224, "classes": 1000},
    },
    "tiny": {
        "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256, "n_positions": 32,
                 "batch": 2, "seq": 32},
        "vit": {"name": "vit_tiny_patch16_224", "batch": 2, "img": 32, "classes": 10,
                "overrides": {"img_size": 32, "patch_size": 8, "depth": 1, "embed_dim": 32, "num_heads": 2}},
    },
}
MODEL_LABELS = {"gpt2": "GPT-2", "vit": "ViT"}


def build_gpt2(size: dict, device: str, gen: torch.Generator, batches: int):
    """GPT2LMHeadModel from GPT2Config, dropout off; batches of token ids that are their own labels."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=size["n_layer"], n_embd=size["n_embd"], n_head=size["n_head"],
                        vocab_size=size["vocab_size"], n_positions=size["n_positions"], resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=size["vocab_size"] - 1,
                        eos_token_id=size["vocab_size"] - 1)
    model = GPT2LMHeadModel(config).to(device)
    model.loss_type = "ForCausalLM"  # the loss it picks anyway, named so that it does not warn
    data = [torch.randint(0, size["vocab_size"], (size["batch"], size["seq"]), generator=gen).to(device)
            for _ in range(batches)]
    return model, data, lambda m, ids: m(input_ids=ids, labels=ids).loss


def build_vit(size: dict, device: str, gen: torch.Generator, batches: int):
    """timm's ViT without pretrained weights or dropout; random images, cross-entropy on random labels."""
    import timm

    model = timm.create_model(size["name"], pretrained=False, num_classes=size["classes"], drop_rate=0.0,
                              proj_drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0,
                              **size["overrides"]).to(device)
    shape = (size["batch"], 3, size["img"], size["img"])
    data = [(torch.randn(shape, generator=gen).to(device),
             torch.randint(0, size["classes"], (size["batch"],), generator=gen).to(device)) for _ in range(batches)]
    return model, data, lambda m, xy: torch.nn.functional.cross_entropy(m(xy[0]), xy[1])


BUILDERS = {"gpt2": build_gpt2, "vit": build_vit}
LIBRARIES = {"gpt2": "transformers", "vit": "timm"}


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: str, marks: int) -> None:
        self.cuda = device == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(marks)] if self.cuda else []
        self.times = [0.0] * marks

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.times[i] = time.perf_counter()

    def ms(self, a: int, b: int) -> float:
        if self.cuda:
            return self.events[a].elapsed_time(self.events[b])
        return (self.times[b] - self.times[a]) * 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def copy_batch(dst, src) -> None:
    """A batch (a tensor, or a tuple of them) into the static buffers of a CUDA graph."""
    for d, s in zip(dst, src) if isinstance(dst, tuple) else [(dst, src)]:
        d.copy_(s)


class Recipe:
    """One way to train: a model copy, its fused AdamW and its GradScaler (none for "adamw", the
    floor; for "ampkit-graph", the whole step captured in a CUDA graph)."""

    def __init__(self, name: str, model: torch.nn.Module, loss_fn, args: argparse.Namespace, precision: str) -> None:
        self.name, self.model, self.loss_fn = name, model, loss_fn
        self.device, self.dtype, self.max_norm = args.device, DTYPES[precision], args.max_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        graphed = name == "ampkit-graph"
        self.opt = torch.optim.AdamW(self.params, lr=1e-4, fused=True, **({"capturable": True} if graphed else {}))
        self.graph = None  # the captured step (ampkit-graph), made by the first round
        self.static = None  # its input buffers
        self.failed = ""  # why the capture failed
        self.scaler = None
        if name == "torch":
            self.scaler = torch.amp.GradScaler(args.device)
        elif name != "adamw":
            import ampkit

            self.scaler = ampkit.GradScaler(args.device, clipper="norm", precision=precision,
                                            sync="deferred" if graphed else args.sync,
                                            opt={"clipper.max_norm": args.max_norm})

    def capture(self, batch) -> None:
        """torch's whole-network capture recipe: warm-up on a side stream, then one captured step."""
        self.static = tuple(t.clone() for t in batch) if isinstance(batch, tuple) else batch.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.backward(self.static)
                self.finish()
        torch.cuda.current_stream().wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with uninterrupted(), torch.cuda.graph(graph):  # a capture left open would hang the device
            self.backward(self.static)
            self.finish()
        self.graph = graph

    def train_step(self, batch, clock: "Clock" = None, i: int = 0) -> None:
        """One step; marks the end of backward and of update() on ``clock`` (not in a graph)."""
        if self.graph is not None:
            copy_batch(self.static, batch)
            self.graph.replay()
            return
        self.backward(batch)
        if clock:
            clock.mark(2 * i)
        self.finish()
        if clock:
            clock.mark(2 * i + 1)

    def backward(self, batch, plant_inf: bool = False) -> None:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device, dtype=self.dtype):
            loss = self.loss_fn(self.model, batch)
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        if plant_inf:  # one overflowing gradient element, as a real fp16 overflow leaves it
            next(p for p in self.params if p.grad is not None).grad.view(-1)[0] = float("inf")

    def finish(self):
        """Everything after backward; returns what scaler.step returned: ampkit's says whether it
        stepped, torch's does not (None either way), so compare_decisions reads torch's scale."""
        if self.scaler is None:
            return self.opt.step()
        if self.name == "torch":
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        stepped = self.scaler.step(self.opt)
        self.scaler.update()
        return stepped

    def round(self, data: list, warmup: int, steps: int, start: int) -> tuple:
        """Runs warmup + steps steps; returns (wall ms per timed step, [post-backward ms per step],
        none in a graph)."""
        if self.name == "ampkit-graph" and self.graph is None:
            self.capture(data[start % len(data)])
        for i in range(warmup):
            self.train_step(data[(start + i) % len(data)])
        clock = Clock(self.device, 2 * steps)
        clock.sync()
        t0 = time.perf_counter()
        for i in range(steps):
            stop_if_asked()
            self.train_step(data[(start + warmup + i) % len(data)], clock, i)
        clock.sync()
        wall = (time.perf_counter() - t0) * 1e3 / steps
        return wall, [] if self.graph is not None else [clock.ms(2 * i, 2 * i + 1) for i in range(steps)]


def time_recipes(base: torch.nn.Module, loss_fn, data: list, args: argparse.Namespace, precision: str) -> dict:
    """Interleaved rounds of the recipes; medians of step time and post-backward time per recipe
    (None where there is none); a graph whose capture failed gives its error instead."""
    names = ("torch", "ampkit", "adamw") + (("ampkit-graph",) if args.graph else ())
    recipes = [Recipe(name, copy.deepcopy(base), loss_fn, args, precision) for name in names]
    walls = {r.name: [] for r in recipes}
    posts = {r.name: [] for r in recipes}
    for k in range(args.rounds):
        for r in recipes:
            if r.failed:
                continue
            try:
                wall, post = r.round(data, args.warmup, args.steps, k * (args.warmup + args.steps))
            except Exception as e:  # noqa: BLE001  a capture that fails is a result of the benchmark
                if r.name != "ampkit-graph":
                    raise
                stop_if_asked()  # a SIGTERM that the capture's own error replaced
                r.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
                torch.cuda.synchronize()
                continue
            walls[r.name].append(wall)
            posts[r.name].extend(post)
    medians = {name: (statistics.median(walls[name]) if walls[name] else None,
                      statistics.median(posts[name]) if posts[name] else None) for name in walls}
    medians["graph_failed"] = next((r.failed for r in recipes if r.failed), "")
    return medians


def compare_decisions(base: torch.nn.Module, loss_fn, data: list, args: argparse.Namespace, precision: str) -> dict:
    """Both recipes in lockstep from the same weights, one planted overflow: skips and scales."""
    torch_way, ampkit_way = (Recipe(n, copy.deepcopy(base), loss_fn, args, precision) for n in ("torch", "ampkit"))
    skipped = {"torch": [], "ampkit": []}
    scales_differ = []
    for i in range(args.compare_steps):
        batch, plant = data[i % len(data)], i == args.overflow_step
        before = torch_way.scaler.get_scale()
        torch_way.backward(batch, plant)
        torch_way.finish()
        if torch_way.scaler.get_scale() < before:
            skipped["torch"].append(i)
        ampkit_way.backward(batch, plant)
        if not bool(ampkit_way.finish()):
            skipped["ampkit"].append(i)
        if torch_way.scaler.get_scale() != ampkit_way.scaler.get_scale():
            scales_differ.append(i)
    differ = sorted(set(skipped["torch"]) ^ set(skipped["ampkit"]))
    planted = args.overflow_step < args.compare_steps
    missed = planted and not (args.overflow_step in skipped["torch"] and args.overflow_step in skipped["ampkit"])
    return {"steps": args.compare_steps, "overflow_step": args.overflow_step if planted else None,
            "skipped_torch": skipped["torch"], "skipped_ampkit": skipped["ampkit"], "decisions_differ": differ,
            "scales_differ": scales_differ, "final_scale": ampkit_way.scaler.get_scale(),
            "stats_recipe": ampkit_way.scaler.last_step.get("stats_recipe", "?"),
            "ok": not differ and not scales_differ and not missed}


def run_row(model_key: str, precision: str, args: argparse.Namespace) -> dict:
    """One (model, precision): build once, then the lockstep check and the timed rounds on copies."""
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    size = SIZES["tiny" if args.tiny else "full"][model_key]
    base, data, loss_fn = BUILDERS[model_key](size, args.device, gen, args.batches)
    row = {"model": model_key, "precision": precision, "params": sum(p.numel() for p in base.parameters())}
    if args.compare_steps > 0:
        row["compare"] = compare_decisions(base, loss_fn, data, args, precision)
    if args.rounds > 0:
        medians = time_recipes(base, loss_fn, data, args, precision)
        row.update({"torch_step_ms": medians["torch"][0], "ampkit_step_ms": medians["ampkit"][0],
                    "torch_post_backward_ms": medians["torch"][1], "ampkit_post_backward_ms": medians["ampkit"][1],
                    "adamw_post_backward_ms": medians["adamw"][1]})
        if args.graph:
            row["ampkit_graph_step_ms"] = medians["ampkit-graph"][0]
            row["graph_failed"] = medians["graph_failed"]
    del base, data
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return row


def versions() -> str:
    def version_of(module: str) -> str:
        try:
            return __import__(module).__version__
        except ImportError:
            return "absent"

    return ", ".join(f"{m} {version_of(m)}" for m in ("torch", "transformers", "timm"))


def device_name(device: str) -> str:
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        return f"{p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB"
    return f"the CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def steps_text(steps: list) -> str:
    return ", ".join(str(i) for i in steps) or "none"


def describe(model_key: str, args: argparse.Namespace) -> str:
    z = SIZES["tiny" if args.tiny else "full"][model_key]
    if model_key == "gpt2":
        return (f"GPT-2 = GPT2LMHeadModel, {z['n_layer']} layers, {z['n_embd']} wide, vocab {z['vocab_size']}, "
                f"batch {z['batch']} x {z['seq']} tokens")
    changed = "".join(f", {k}={v}" for k, v in z["overrides"].items())
    return f"ViT = timm {z['name']}{changed}, batch {z['batch']} x 3x{z['img']}x{z['img']}"


def floor_cells(r: dict) -> str:
    """The floor's post-backward time, each recipe's time above it, and their ratio ("-" for a time
    below the floor, as noise can make it on a CPU, and for a ratio over such a time or over 0)."""
    floor = r["adamw_post_backward_ms"]
    above_torch, above_ampkit = r["torch_post_backward_ms"] - floor, r["ampkit_post_backward_ms"] - floor
    ratio = f"{above_ampkit / above_torch:.3f}" if above_torch > 0 and above_ampkit >= 0 else "-"

    def ms(v: float) -> str:
        return f"{v:.3f}" if v >= 0 else "-"

    return f"{floor:.3f} | {ms(above_torch)} -> {ms(above_ampkit)} | {ratio}"


def print_tables(rows: list, args: argparse.Namespace) -> None:
    print(f"# ampkit.GradScaler against torch.amp.GradScaler on real models ({'tiny' if args.tiny else 'full'} "
          f"configs)")
    print()
    print(f"Device: {device_name(args.device)}; {torch.get_num_threads()} torch threads; {versions()}.")
    print(f"Models: {'; '.join(describe(m, args) for m in args.models)}. AdamW(lr=1e-4, fused=True), clip at "
          f"{args.max_norm}, the loss scaled in fp16 and bf16 alike; ampkit.GradScaler(sync={args.sync!r}).")
    timed = [r for r in rows if "torch_step_ms" in r]
    if timed:
        print()
        print(f"{args.rounds} interleaved rounds x {args.steps} timed steps after {args.warmup} untimed; step: "
              f"median over rounds of wall time per step; post-backward: median over steps, end of backward to "
              f"end of update ({'CUDA events' if args.device == 'cuda' else 'perf_counter'}).")
        if args.graph:
            print("In a CUDA graph capture transformers builds GPT-2's causal mask as a tensor (its is_tracing() "
                  "sees the capture), where the uncaptured recipes pass is_causal: the GPT-2 graph column runs "
                  "another attention kernel, so compare its ampkit-graph time with care; ViT is unaffected.")
        print()
        print("Floor: the same fused AdamW's step() alone after an unscaled backward (no scaler, no clipping; "
              "in fp16 its weights may stop being finite, which does not change its time); above the floor: "
              "each recipe's post-backward time minus the floor's.")
        print()
        graph_head = " ampkit in a CUDA graph, step ms | ratio |" if args.graph else ""
        print("| model | precision | params | torch step ms | ampkit step ms | ratio | torch post-backward ms | "
              "ampkit post-backward ms | ratio | floor: AdamW alone, ms | above the floor, torch -> ampkit ms | "
              f"ratio |{graph_head}")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.graph else ""))
        for r in timed:
            graph_cells = ""
            if args.graph and r["ampkit_graph_step_ms"] is not None:
                later = f" (a later round failed: {r['graph_failed']})" if r["graph_failed"] else ""
                graph_cells = (f" {r['ampkit_graph_step_ms']:.2f}{later} | "
                               f"{r['ampkit_graph_step_ms'] / r['torch_step_ms']:.3f} |")
            elif args.graph:
                graph_cells = f" capture failed: {r['graph_failed']} | - |"
            print(f"| {MODEL_LABELS[r['model']]} | {r['precision']} | {r['params'] / 1e6:.2f}M | "
                  f"{r['torch_step_ms']:.2f} | {r['ampkit_step_ms']:.2f} | "
                  f"{r['ampkit_step_ms'] / r['torch_step_ms']:.3f} | {r['torch_post_backward_ms']:.3f} | "
                  f"{r['ampkit_post_backward_ms']:.3f} | "
                  f"{r['ampkit_post_backward_ms'] / r['torch_post_backward_ms']:.3f} | {floor_cells(r)} |{graph_cells}")
    checked = [r for r in rows if "compare" in r]
    if checked:
        print()
        print("Skip decisions, both recipes in lockstep from the same weights, one gradient element set to inf "
              "after backward at the planted step: skipped = torch's update() lowered the scale, ampkit's step() "
              "returned False.")
        print()
        print("| model | precision | ampkit's statistics recipe | lockstep steps | inf planted at | skipped, torch | "
              "skipped, ampkit | decisions that differ | scales equal | check |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in checked:
            c = r["compare"]
            print(f"| {MODEL_LABELS[r['model']]} | {r['precision']} | {c['stats_recipe']} | {c['steps']} | "
                  f"{'-' if c['overflow_step'] is None else c['overflow_step']} | {steps_text(c['skipped_torch'])} | "
                  f"{steps_text(c['skipped_ampkit'])} | {len(c['decisions_differ'])} | "
                  f"{'yes' if not c['scales_differ'] else 'no, from step ' + str(c['scales_differ'][0])} | "
                  f"{'ok' if c['ok'] else 'FAILED'} |")


def parse_args(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to train: cuda when torch sees a GPU, else cpu")
    p.add_argument("--models", default="gpt2,vit", help="comma-separated: gpt2 (GPT2LMHeadModel), vit (timm ViT)")
    p.add_argument("--precisions", default="fp16,bf16", help="comma-separated autocast dtypes: fp16, bf16")
    p.add_argument("--tiny", action="store_true", help="tiny configs that run on a CPU in seconds")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per recipe, interleaved (0: no timing)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of every round")
    p.add_argument("--compare-steps", type=int, default=20,
                   help="lockstep steps of the skip-decision check (0: no check)")
    p.add_argument("--overflow-step", type=int, default=5,
                   help="lockstep step whose gradient gets an inf (none planted when >= --compare-steps)")
    p.add_argument("--batches", type=int, default=4, help="distinct batches, reused in turn")
    p.add_argument("--max-norm", type=float, default=1.0, help="clipping threshold of both recipes")
    p.add_argument("--sync", choices=["auto", "step", "deferred"], default="auto",
                   help="ampkit.GradScaler's sync: auto (deferred with a fused optimizer from the second "
                        "iteration: no host read per step), step (one read per step, as torch's), deferred")
    p.add_argument("--graph", action="store_true",
                   help="also time ampkit's whole step captured in a CUDA graph (CUDA only; sync='deferred')")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads on the CPU (0: torch's default, which honours OMP_NUM_THREADS)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the rows as JSON to FILE")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.precisions = [x for x in args.precisions.split(",") if x]
    for m in args.models:
        if m not in BUILDERS:
            p.error(f"--models: unknown model '{m}' (choose from {', '.join(BUILDERS)})")
    for x in args.precisions:
        if x not in DTYPES:
            p.error(f"--precisions: unknown precision '{x}' (choose from {', '.join(DTYPES)})")
    for name in ("rounds", "warmup", "compare_steps", "overflow_step", "threads"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.steps < 1 or args.batches < 1:
        p.error("--steps and --batches must be >= 1")
    if args.graph and args.device != "cuda":
        p.error("--graph needs --device cuda (a CUDA graph)")
    return args


class Stopped(BaseException):
    """A SIGTERM: the rows done so far are printed, the row under way is dropped. Not an Exception,
    so that the graph recipe's handler of failed captures does not take it for one."""


class StopState:
    """A SIGTERM is raised as Stopped where it lands, except inside uninterrupted() (a capture, the
    JSON file's write), where it is raised on leaving; `pending` also catches a Stopped that a
    capture's own error or a finalizer swallowed."""

    pending = False
    held = 0


def on_sigterm(signum, frame) -> None:
    StopState.pending = True
    if StopState.held == 0:
        raise Stopped()


def stop_if_asked() -> None:
    if StopState.pending:
        raise Stopped()


@contextlib.contextmanager
def uninterrupted():
    StopState.held += 1
    try:
        yield
    finally:
        StopState.held -= 1
    if StopState.held == 0:
        stop_if_asked()


def write_json(args: argparse.Namespace, rows: list, complete: bool) -> None:
    """The rows so far, written whole (a new file renamed over the old)."""
    if args.json:
        with uninterrupted():
            with open(args.json + ".part", "w") as f:
                json.dump({"device": device_name(args.device), "versions": versions(), "tiny": args.tiny,
                           "complete": complete, "rows": rows}, f, indent=1)
            os.replace(args.json + ".part", args.json)


def main(argv: list) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no GPU: nothing to measure (torch sees no CUDA device)")
        return 0
    missing = sorted({LIBRARIES[m] for m in args.models if importlib.util.find_spec(LIBRARIES[m]) is None})
    if missing:
        print(f"gpu_models.py: error: {' and '.join(missing)} not installed (tools/setup.sh installs the pinned "
              f"versions), or leave its model out of --models", file=sys.stderr)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, on_sigterm)
    wanted = [(m, x) for m in args.models for x in args.precisions]
    rows: list = []
    stopped = False
    try:
        for m, x in wanted:
            stop_if_asked()
            row = run_row(m, x, args)
            with uninterrupted():
                rows.append(row)
                write_json(args, rows, complete=len(rows) == len(wanted))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except Stopped:
        stopped = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the tables are printed whatever comes now
    StopState.pending = False  # handled: the stop is `stopped` from here on
    if stopped:
        write_json(args, rows, complete=False)
    print_tables(rows, args)
    if stopped:
        print(f"\nstopped by SIGTERM after {len(rows)} of {len(wanted)} rows: the tables hold those",
              file=sys.stderr)
    failed = [r for r in rows if "compare" in r and not r["compare"]["ok"]]
    if failed:
        print(f"\nFAILED: skip decisions or scales differ from torch's in {len(failed)} of {len(rows)} rows",
              file=sys.stderr)
    return 1 if failed else 3 if stopped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
