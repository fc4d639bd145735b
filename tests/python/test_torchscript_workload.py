"""ampkit-train --workload torchscript: a user's scripted model on torch.save'd tensors.

Parity with a plain eager PyTorch loop (tools/golden/torchscript_parity.py), checkpoints that load
back into the scripted module in Python, data-parallel ranks, exact resume after SIGTERM, and one
line with the documented exit code for every bad input."""

import json
import math
import os
import signal
import subprocess
import sys
import time
import zipfile

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.path.abspath(os.environ.get("AMPKIT_BUILD_DIR", os.path.join(ROOT, "build")))
TRAIN = os.path.join(BUILD, "bin", "ampkit-train")
LAUNCH = os.path.join(BUILD, "bin", "ampkit-launch")
ENV = dict(os.environ, AMPKIT_PLUGIN_PATH="", OMP_NUM_THREADS="1")

sys.path.insert(0, os.path.join(ROOT, "tools", "golden"))
import torchscript_parity  # noqa: E402


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "golden", "torchscript_parity.py"), str(out)],
                   check=True, env=ENV, capture_output=True)
    with open(out / "golden.json") as f:
        return out, json.load(f)


def train(folder, *args, check=True):
    """ampkit-train on folder's model.pt and data.pt (unless args name --data or --model)."""
    args = [str(a) for a in args]
    defaults = [] if "--data" in args else ["--data", str(folder / "data.pt")]
    defaults += [] if "--model" in args else ["--model", str(folder / "model.pt")]
    cmd = [TRAIN, "--workload", "torchscript", *defaults, "--threads", "1", "--progress", "never", *args]
    run = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    if check:
        assert run.returncode == 0, run.stderr
    return run


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_losses_equal_an_eager_pytorch_loop_and_the_checkpoint_evaluates_the_same_in_python(golden, tmp_path):
    folder, gold = golden
    train(folder, "--test-data", folder / "test.pt", "--data-order", "file", "--batch-size", 16, "--steps", 20,
          "--lr", "0.001", "--optimizer", "adamw", "--precision", "fp32", "--metrics", tmp_path / "m.jsonl",
          "--summary", tmp_path / "s.json", "--checkpoint-dir", tmp_path / "ckpt")
    losses = [r["loss"] for r in metrics(tmp_path / "m.jsonl")]
    assert len(losses) == 20
    for step, (ours, theirs) in enumerate(zip(losses, gold["losses"])):
        assert abs(ours - theirs) <= 1e-5 * abs(theirs), (step, ours, theirs)
    summary = json.load(open(tmp_path / "s.json"))
    assert summary["workload"] == "torchscript" and summary["steps_taken"] == 20

    # Back to Python: the checkpoint's model.pt into the scripted module, strictly.
    state = torch.load(tmp_path / "ckpt" / "step-20" / "model.pt", weights_only=True)
    module = torch.jit.load(str(folder / "model.pt"))
    module.load_state_dict(state, strict=True)
    module.eval()
    test = torch.load(folder / "test.pt", weights_only=True)
    with torch.no_grad():
        out = module(test["inputs"]).float()
        loss = torch.nn.functional.cross_entropy(out, test["targets"], reduction="sum").item() / len(test["targets"])
        accuracy = (out.argmax(-1) == test["targets"]).float().mean().item()
    assert abs(loss - summary["test_loss"]) <= 1e-6, (loss, summary["test_loss"])
    assert accuracy == pytest.approx(summary["test_accuracy"], abs=1e-6)  # a float32 mean in Python
    # and the eager model trained in Python evaluates within the loop's own agreement
    assert summary["test_loss"] == pytest.approx(gold["test_loss"], rel=1e-4)


def test_two_gloo_ranks_of_32_follow_one_rank_of_64(golden, tmp_path):
    folder, _ = golden
    common = ["--data-order", "file", "--steps", 4, "--lr", "0.001", "--precision", "fp32"]
    train(folder, "--batch-size", 64, "--metrics", tmp_path / "one.jsonl", *common)
    cmd = [LAUNCH, "--nproc-per-node", "2", "--master-port", "0", "--", TRAIN, "--workload", "torchscript",
           "--model", folder / "model.pt", "--data", folder / "data.pt", "--comm", "gloo", "--threads", "1",
           "--progress", "never", "--batch-size", 32, "--metrics", tmp_path / "two.jsonl", *common]
    run = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    one, two = metrics(tmp_path / "one.jsonl"), metrics(tmp_path / "two.jsonl")
    assert len(one) == len(two) == 4
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]), (a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * abs(a["grad_norm"])


def test_sigterm_and_resume_auto_end_with_the_uninterrupted_parameters(golden, tmp_path):
    folder, _ = golden
    common = ["--steps", 400, "--batch-size", 4, "--lr", "0.001"]
    full = train(folder, *common, "--summary", tmp_path / "full.json")
    assert full.returncode == 0
    ckpt, m = tmp_path / "ckpt", tmp_path / "m.jsonl"
    cmd = [TRAIN, "--workload", "torchscript", "--model", folder / "model.pt", "--data", folder / "data.pt",
           "--threads", "1", "--progress", "never", *common, "--checkpoint-dir", ckpt, "--metrics", m,
           "--summary", tmp_path / "interrupted.json"]
    proc = subprocess.Popen([str(c) for c in cmd], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(m) and sum(1 for _ in open(m)) >= 30:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    interrupted = json.load(open(tmp_path / "interrupted.json"))
    assert 30 <= interrupted["steps"] < 400
    train(folder, *common, "--checkpoint-dir", ckpt, "--resume", "auto", "--summary", tmp_path / "resumed.json")
    resumed = json.load(open(tmp_path / "resumed.json"))
    assert resumed["param_sha256"] == json.load(open(tmp_path / "full.json"))["param_sha256"]


def test_a_traced_module_trains_with_a_warning(golden, tmp_path):
    folder, _ = golden
    model = torchscript_parity.ConvAttentionNet()
    traced = torch.jit.trace(model, torch.zeros(2, 12, 8))
    traced.save(str(tmp_path / "model.pt"))
    os.link(folder / "data.pt", tmp_path / "data.pt")
    run = train(tmp_path, "--steps", 2, "--batch-size", 8)
    assert "looks traced (torch.jit.trace): it keeps the train/eval mode" in run.stderr


def one_line_error(run, code, *parts):
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == code, run.stderr
    assert len(lines) == 1, run.stderr
    for p in parts:
        assert p in lines[0], lines[0]
    return lines[0]


def test_a_module_whose_deflated_records_declare_more_than_its_file_trains(golden, tmp_path):
    """torch.jit.save deflates its code and debug records: a small model's may declare more bytes than
    the whole file. Only the records LibTorch's reader reads on opening are bounded by the file."""
    folder, _ = golden
    torch.manual_seed(0)
    torch.jit.script(torchscript_parity.ConvAttentionNet(width=8)).save(str(tmp_path / "small.pt"))
    size = os.path.getsize(tmp_path / "small.pt")
    with zipfile.ZipFile(tmp_path / "small.pt") as z:
        largest = max(z.infolist(), key=lambda i: i.file_size)
    assert largest.file_size > size and largest.compress_type == zipfile.ZIP_DEFLATED, (largest, size)
    train(folder, "--steps", 2, "--batch-size", 8, "--model", tmp_path / "small.pt",
          "--summary", tmp_path / "s.json")
    with open(tmp_path / "s.json") as f:
        assert json.load(f)["steps"] == 2


def with_statement(source, target, statement):
    """The module at `source` with `statement` added to its forward, saved at `target`."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        done = False
        for info in src.infolist():
            data = src.read(info)
            if not done and info.filename.endswith(".py") and b"def forward(" in data:
                head, tail = data.split(b"def forward(", 1)
                data = head + b"def forward(" + tail.replace(b"\n    return ", b"\n    _x = " + statement +
                                                             b"\n    return ", 1)
                done = True
            dst.writestr(info, data)
    assert done


@pytest.mark.parametrize("kind, expression", [
    ("parentheses", b"(" * 20000 + b"1" + b")" * 20000),
    ("lists", b"[" * 5000 + b"1" + b"]" * 5000),
    ("unary minus", b"- " * 20000 + b"1"),
    ("not", b"not " * 20000 + b"True"),
    ("power", b"**".join([b"2"] * 20000)),
])
def test_code_nested_past_the_parsers_stack_is_one_line_and_exit_4(golden, tmp_path, kind, expression):
    """torch::jit::load compiles a module's code with a parser that recurses per nesting level:
    torch.jit.load segfaults on each of these (5,000 lists, 20,000 of the others)."""
    folder, _ = golden
    with_statement(folder / "model.pt", tmp_path / "deep.pt", expression)
    run = train(folder, "--steps", 1, "--model", tmp_path / "deep.pt", check=False)
    one_line_error(run, 4, "is not a TorchScript module", "nests deeper than 1000 (brackets and prefix operators)")


def test_code_the_nesting_check_does_not_count_loads_on_its_deep_stack_and_trains(golden, tmp_path):
    """20,000 terms of one sum: the parser loops, but the tree it builds is as deep, and compiling it
    overflows an 8 MiB stack (torch.jit.load segfaults); ampkit-train loads on a 1 GiB one."""
    folder, _ = golden
    with_statement(folder / "model.pt", tmp_path / "long.pt", b" + ".join([b"1"] * 20000))
    train(folder, "--steps", 2, "--batch-size", 8, "--model", tmp_path / "long.pt", "--summary", tmp_path / "s.json")
    with open(tmp_path / "s.json") as f:
        assert json.load(f)["steps"] == 2


def test_more_than_4_mib_of_code_is_one_line_and_exit_4(golden, tmp_path):
    folder, _ = golden
    padding = b"".join(b"    # " + os.urandom(24).hex().encode() + b"\n" for _ in range(80000))  # 4.6 MB
    with_statement(folder / "model.pt", tmp_path / "big.pt", b"1\n" + padding + b"    _y = 1")
    one_line_error(train(folder, "--steps", 1, "--model", tmp_path / "big.pt", check=False), 4,
                   "is not a TorchScript module", "its code records hold more than 4194304 bytes")


def test_code_nested_a_thousand_deep_trains(golden, tmp_path):
    folder, _ = golden
    with_statement(folder / "model.pt", tmp_path / "nested.pt", b"(" * 500 + b"not " * 499 + b"True" + b")" * 500)
    train(folder, "--steps", 1, "--batch-size", 8, "--model", tmp_path / "nested.pt", "--summary", tmp_path / "s.json")
    with open(tmp_path / "s.json") as f:
        assert json.load(f)["steps"] == 1


def test_each_bad_input_is_one_line_with_its_exit_code(golden, tmp_path):
    folder, _ = golden
    # Not TorchScript: exit 4 (data).
    (tmp_path / "text.pt").write_text("hello")
    run = subprocess.run([TRAIN, "--workload", "torchscript", "--model", str(tmp_path / "text.pt"), "--data",
                          str(folder / "data.pt"), "--steps", "1"], capture_output=True, text=True, env=ENV)
    one_line_error(run, 4, "is not a TorchScript module")
    # The golden module with its version record deflated from 64 MiB into a few kilobytes:
    # torch::jit::load would allocate and inflate it before any check; refused from the directory.
    with zipfile.ZipFile(folder / "model.pt") as src, zipfile.ZipFile(tmp_path / "bomb.pt", "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/version"):
                bomb = data + b" " * (64 << 20)
                dst.writestr(info.filename, bomb, compress_type=zipfile.ZIP_DEFLATED)
            else:
                dst.writestr(info, data)
    run = subprocess.run([TRAIN, "--workload", "torchscript", "--model", str(tmp_path / "bomb.pt"), "--data",
                          str(folder / "data.pt"), "--steps", "1"], capture_output=True, text=True, env=ENV)
    one_line_error(run, 4, "is not a TorchScript module",
                   f"version declares {len(bomb)} bytes, more than the file holds")
    # A 16 MiB record deflated beside the module's own: all records together over 64 times the file
    # (torch::jit::load allocates each record it reads at its declared size).
    with zipfile.ZipFile(folder / "model.pt") as src, zipfile.ZipFile(tmp_path / "bomb2.pt", "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr("model/extra/zeros", bytes(16 << 20), compress_type=zipfile.ZIP_DEFLATED)
    run = subprocess.run([TRAIN, "--workload", "torchscript", "--model", str(tmp_path / "bomb2.pt"), "--data",
                          str(folder / "data.pt"), "--steps", "1"], capture_output=True, text=True, env=ENV)
    size = os.path.getsize(tmp_path / "bomb2.pt")
    one_line_error(run, 4, "is not a TorchScript module",
                   f"its records declare more than 64 times the file's {size} bytes")
    # forward(inputs) with --loss returned: exit 2 (usage), with the fix.
    one_line_error(train(folder, "--steps", 1, "--loss", "returned", check=False), 2,
                   "--loss returned calls forward(inputs, targets)", "takes 1 argument")
    # inputs and targets of different lengths: exit 4.
    torch.save({"inputs": torch.zeros(10, 12, 8), "targets": torch.zeros(9, dtype=torch.long)}, tmp_path / "bad.pt")
    run = train(folder, "--steps", 1, "--data", tmp_path / "bad.pt", check=False)
    one_line_error(run, 4, "holds 10 samples and \"targets\" 9")
    # a dtype the loss cannot take: mse on class indices, exit 4.
    one_line_error(train(folder, "--steps", 1, "--loss", "mse", check=False), 4,
                   "--loss mse takes floating-point targets, got Long")
    # fewer samples than one batch per rank: exit 2.
    one_line_error(train(folder, "--steps", 1, "--batch-size", 100000, check=False), 2,
                   "fewer than one batch of --batch-size 100000")
    # a shape the model cannot take: the model's own message, one line, exit 4.
    torch.save({"inputs": torch.zeros(16, 12, 5), "targets": torch.zeros(16, dtype=torch.long)}, tmp_path / "shape.pt")
    line = one_line_error(train(folder, "--steps", 1, "--batch-size", 8, "--data", tmp_path / "shape.pt", check=False),
                          4, "the model failed on batch 0")
    assert "channels" in line or "shape" in line, line
    # a dict without "inputs": exit 4, naming what to save.
    torch.save({"x": torch.zeros(3)}, tmp_path / "nokey.pt")
    one_line_error(train(folder, "--steps", 1, "--data", tmp_path / "nokey.pt", check=False), 4,
                   "has no tensor \"inputs\"")
    # a layer fault on a model without hook points: exit 2, saying what works instead
    one_line_error(train(folder, "--steps", 1, "--inject", "nan@step=0,layer=head", check=False), 2,
                   "the model reports no layers", "inject into the loss instead")
    # no --model: exit 2
    run = subprocess.run([TRAIN, "--workload", "torchscript", "--data", str(folder / "data.pt")],
                         capture_output=True, text=True, env=ENV)
    one_line_error(run, 2, "needs --model FILE")


def test_a_folder_of_shards_is_read_in_name_order(golden, tmp_path):
    folder, _ = golden
    data = torch.load(folder / "data.pt", weights_only=True)
    shards = tmp_path / "shards"
    shards.mkdir()
    for i, start in enumerate(range(0, 320, 100)):
        torch.save({"inputs": data["inputs"][start:start + 100], "targets": data["targets"][start:start + 100]},
                   shards / f"part-{i:02d}.pt")
    common = ["--data-order", "file", "--batch-size", 16, "--steps", 5, "--precision", "fp32"]
    train(folder, *common, "--metrics", tmp_path / "file.jsonl")
    train(folder, *common, "--data", shards, "--metrics", tmp_path / "shards.jsonl")
    assert [r["loss"] for r in metrics(tmp_path / "file.jsonl")] == [r["loss"] for r in metrics(tmp_path / "shards.jsonl")]


def test_a_non_finite_gradient_names_the_first_parameter(golden, tmp_path):
    folder, _ = golden
    data = torch.load(folder / "data.pt", weights_only=True)
    data["inputs"][3, 0, 0] = math.inf
    torch.save(data, tmp_path / "inf.pt")
    run = train(folder, "--steps", 1, "--batch-size", 16, "--data-order", "file", "--data", tmp_path / "inf.pt",
                "--summary", tmp_path / "s.json")
    assert "at parameter '" in run.stderr and "(its gradient)" in run.stderr, run.stderr
    report = json.load(open(tmp_path / "s.json"))["nan_reports"][0]
    assert report["located"] is True and report["phase"] == "parameter"
    detail = json.load(open(report["report"]))
    assert detail["parameter"] in {n for n, _ in torchscript_parity.ConvAttentionNet().named_parameters()}
    assert "cannot be observed from C++" in detail["finding"]
    assert detail["observation"]["gradient"]["nonfinite"] > 0
    assert detail["forward"] == [] and detail["backward"] == []  # no module outputs seen, every key there


@pytest.mark.parametrize("script, loss, extra", [
    ("vlm.py", "returned", ["--train", "64", "--test", "16"]),
    ("unet_ddpm.py", "returned", ["--train", "64", "--test", "16"]),
    ("transformer_lm.py", "cross_entropy", ["--train-windows", "64", "--test-windows", "16"]),
])
def test_the_example_models_export_and_train(tmp_path, script, loss, extra):
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "models", script), str(tmp_path), *extra],
                   check=True, capture_output=True, env=ENV)
    train(tmp_path, "--test-data", tmp_path / "test.pt", "--loss", loss, "--steps", 4, "--batch-size", 8,
          "--precision", "bf16", "--metrics", tmp_path / "m.jsonl", "--summary", tmp_path / "s.json")
    records = metrics(tmp_path / "m.jsonl")
    assert len(records) == 4 and all(math.isfinite(r["loss"]) and r["stepped"] for r in records)
    assert math.isfinite(json.load(open(tmp_path / "s.json"))["test_loss"])


# A model whose forward or backward fails, and bad data or test data, found up front or at
# the failing step, one line each (docs/your-own-model.md, "Errors"). The models wrap
# tools/models/transformer_lm.py --context 16 --width 16 --layers 1 (256 classes, [N, 16] tokens).
sys.path.insert(0, os.path.join(ROOT, "tools", "models"))
from transformer_lm import TransformerLM  # noqa: E402


def small_lm():
    torch.manual_seed(0)
    return TransformerLM(16, 16, layers=1)


class IntegerLoss(torch.nn.Module):  # --loss returned: a count of wrong tokens, a Long tensor
    def __init__(self) -> None:
        super().__init__()
        self.lm = small_lm()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (self.lm(x).argmax(-1) != y).sum()


class Detached(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm = small_lm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(x).detach()


class NoParameters(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(x, 256).float()


class InplaceFromThirdCall(torch.nn.Module):
    """Modifies a tensor autograd saved, from its third training forward on: backward fails there."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = small_lm()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        s = torch.sigmoid(self.lm(x))
        if bool(self.calls > 2):
            s.mul_(2.0)
        return s


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "models", "transformer_lm.py"), str(out),
                    "--context", "16", "--width", "16", "--layers", "1", "--train-windows", "64",
                    "--test-windows", "16"], check=True, capture_output=True, env=ENV)
    return out


def save_model(module, path):
    torch.jit.script(module).save(str(path))
    return path


@pytest.mark.parametrize("module, loss, says", [
    (IntegerLoss, "returned", "returned a Long tensor on batch 0, and Long tensors carry no gradient"),
    (Detached, "cross_entropy", "returned a Float tensor on batch 0 that no parameter reaches (a .detach()"),
    (NoParameters, "cross_entropy", "has no parameter that requires grad: there is nothing to train"),
])
def test_a_forward_without_gradient_is_one_line_and_exit_4(lm, tmp_path, module, loss, says):
    model = save_model(module(), tmp_path / "model.pt")
    run = train(lm, "--model", model, "--loss", loss, "--steps", 2, "--batch-size", 8, check=False)
    one_line_error(run, 4, says, "--model" if module is NoParameters else "the model's loss does not require grad: ")


def test_a_backward_failure_at_a_later_step_is_one_line_and_exit_4(lm, tmp_path):
    model = save_model(InplaceFromThirdCall(), tmp_path / "model.pt")
    run = train(lm, "--model", model, "--steps", 4, "--batch-size", 8, "--data-order", "file", "--metrics",
                tmp_path / "m.jsonl", check=False)
    one_line_error(run, 4, "the model failed in backward on batch 2: ", "modified by an inplace operation")
    assert len(metrics(tmp_path / "m.jsonl")) == 2  # steps 0 and 1 trained


def test_a_loss_failure_in_evaluation_is_one_line_and_exit_4(lm, tmp_path):
    test = torch.load(lm / "test.pt", weights_only=True)
    torch.save({"inputs": test["inputs"], "targets": test["targets"][:, :8].contiguous()}, tmp_path / "test.pt")
    run = train(lm, "--test-data", tmp_path / "test.pt", "--steps", 1, "--batch-size", 8, check=False)
    one_line_error(run, 4, "the model failed on --test-data batch 0: ", "batch_size")


@pytest.mark.parametrize("option", ["--data", "--test-data"])
def test_class_targets_out_of_range_are_refused_before_the_first_step(lm, tmp_path, option):
    source = "data.pt" if option == "--data" else "test.pt"
    data = torch.load(lm / source, weights_only=True)
    data["targets"][13, 3] = 999  # batch 1 of --data in file order; evaluated only after training
    torch.save(data, tmp_path / "bad.pt")
    run = train(lm, option, tmp_path / "bad.pt", "--steps", 4, "--batch-size", 8, "--data-order", "file",
                "--metrics", tmp_path / "m.jsonl", check=False)
    one_line_error(run, 4, f"{option}: sample 13 has target 999, not one of the model's 256 classes (0 to 255")
    assert not os.path.exists(tmp_path / "m.jsonl") or metrics(tmp_path / "m.jsonl") == []
    # cross entropy's ignore_index (-100) is a valid target; any other negative one is not
    data["targets"][13, 3] = -100
    torch.save(data, tmp_path / "ignored.pt")
    train(lm, option, tmp_path / "ignored.pt", "--steps", 2, "--batch-size", 8)
    data["targets"][13, 3] = -1
    torch.save(data, tmp_path / "negative.pt")
    one_line_error(train(lm, option, tmp_path / "negative.pt", "--steps", 2, "--batch-size", 8, check=False), 4,
                   f"{option}: sample 13 has target -1")


def make_bad_entry(kind, path):
    if kind == "dangling symlink":
        os.symlink(path.parent / "missing.pt", path)
        return f"is a dangling symlink (to {path.parent / 'missing.pt'}, which does not exist)"
    if kind == "FIFO":
        os.mkfifo(path)
        return "is a FIFO"
    os.symlink("/dev/zero", path)
    return "is a symlink to /dev/zero, a character device"


@pytest.mark.parametrize("kind", ["dangling symlink", "FIFO", "symlink to /dev/zero"])
def test_a_shard_that_is_not_a_regular_file_is_one_error_naming_it(lm, tmp_path, kind):
    data = torch.load(lm / "data.pt", weights_only=True)
    shards = tmp_path / "shards"
    shards.mkdir()
    torch.save({"inputs": data["inputs"][:32], "targets": data["targets"][:32]}, shards / "a.pt")
    says = make_bad_entry(kind, shards / "b.pt")
    run = train(lm, "--data", shards, "--steps", 2, "--batch-size", 8, check=False)
    one_line_error(run, 4, f"--data shard {shards / 'b.pt'} {says}", "must be a regular file (or a symlink to one)")
    # the same for --test-data, and a symlink to a regular file is a shard like any other
    run = train(lm, "--test-data", shards, "--steps", 2, "--batch-size", 8, check=False)
    one_line_error(run, 4, f"--test-data shard {shards / 'b.pt'} {says}")
    os.remove(shards / "b.pt")
    torch.save({"inputs": data["inputs"][32:], "targets": data["targets"][32:]}, tmp_path / "b.pt")
    os.symlink(tmp_path / "b.pt", shards / "b.pt")
    train(lm, "--data", shards, "--steps", 1, "--batch-size", 64)  # needs both shards' 32 samples


def test_an_empty_test_set_is_refused_up_front_like_an_empty_training_set(lm, tmp_path):
    test = torch.load(lm / "test.pt", weights_only=True)
    torch.save({"inputs": test["inputs"][:0], "targets": test["targets"][:0]}, tmp_path / "empty.pt")
    run = train(lm, "--data", tmp_path / "empty.pt", "--steps", 2, "--batch-size", 8, check=False)
    one_line_error(run, 2, "--data holds 0 samples")
    run = train(lm, "--test-data", tmp_path / "empty.pt", "--steps", 2, "--batch-size", 8, "--metrics",
                tmp_path / "m.jsonl", check=False)
    one_line_error(run, 2, "--test-data holds 0 samples: there is nothing to evaluate")
    assert not os.path.exists(tmp_path / "m.jsonl") or metrics(tmp_path / "m.jsonl") == []
    # nor is a test set whose every target is cross entropy's ignored -100 (its loss would be 0/0)
    torch.save({"inputs": test["inputs"], "targets": torch.full_like(test["targets"], -100)}, tmp_path / "none.pt")
    one_line_error(train(lm, "--test-data", tmp_path / "none.pt", "--steps", 2, "--batch-size", 8, check=False), 2,
                   "--test-data holds no target to evaluate: every one is -100")


class RaisesAtThirdCall(torch.nn.Module):
    """Raises its own exception from its third training forward on, and in evaluation."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = small_lm()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            raise ValueError("no evaluation in this model")
        self.calls += 1
        if bool(self.calls > 2):
            raise RuntimeError("the model gave up at call " + str(int(self.calls)))
        return self.lm(x)


def test_an_exception_the_model_raises_is_named_with_its_own_message(lm, tmp_path):
    # TorchScript reports a raise in the model as "builtins.RuntimeError: ..." after its traceback;
    # on 602f2ee the line said only "The following operation failed in the TorchScript interpreter."
    model = save_model(RaisesAtThirdCall(), tmp_path / "model.pt")
    run = train(lm, "--model", model, "--steps", 4, "--batch-size", 8, "--data-order", "file", check=False)
    one_line_error(run, 4, "the model failed on batch 2: RuntimeError: the model gave up at call 3")
    run = train(lm, "--model", model, "--steps", 2, "--batch-size", 8, "--test-data", lm / "test.pt",
                check=False)
    one_line_error(run, 4, "the model failed on --test-data batch 0: ValueError: no evaluation in this model")


class Column(torch.nn.Module):  # [N, 4] -> [N, 1]: one column against [N] targets
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def test_mse_on_shapes_that_only_broadcast_is_one_line_and_exit_4(tmp_path):
    # On 602f2ee an [N, 1] output against [N] targets trained on the [N, N] broadcast (exit 0, a
    # C++ warning per step) and test_loss was N times too large.
    save_model(Column(), tmp_path / "model.pt")
    torch.save({"inputs": torch.randn(32, 4), "targets": torch.randn(32)}, tmp_path / "data.pt")
    run = train(tmp_path, "--loss", "mse", "--steps", 2, "--batch-size", 8, check=False)
    one_line_error(run, 4, "--loss mse: the model's output is [8, 1] and the targets are [8]")


def test_a_test_loss_that_is_not_finite_is_one_warning_line(tmp_path):
    # On 602f2ee a NaN target in --test-data ended exit 0 with test_loss null in the summary and no word.
    save_model(Column(), tmp_path / "model.pt")
    torch.save({"inputs": torch.randn(32, 4), "targets": torch.randn(32, 1)}, tmp_path / "data.pt")
    targets = torch.randn(16, 1)
    targets[3, 0] = float("nan")
    torch.save({"inputs": torch.randn(16, 4), "targets": targets}, tmp_path / "test.pt")
    run = train(tmp_path, "--loss", "mse", "--steps", 2, "--batch-size", 8, "--test-data", tmp_path / "test.pt",
                "--summary", tmp_path / "summary.json")
    said = [line for line in run.stderr.splitlines() if "test_loss" in line]
    assert said == ["ampkit-train: warning: test_loss is NaN: the evaluation's loss is not finite (non-finite "
                    "inputs or targets in the test data, or a model whose output is not finite)"]
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["test_loss"] is None and any(w.startswith("test_loss is NaN") for w in summary["warnings"])


class ComplexLogits(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm = small_lm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(x).to(torch.complex64)


class SparseEmbedding(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 16, sparse=True)
        self.head = torch.nn.Linear(16, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


@pytest.mark.parametrize("module, says", [
    # On 602f2ee: a LibTorch warning, then training on the real part, exit 0.
    (ComplexLogits, "the model's forward returned a ComplexFloat tensor on batch 0: the losses take real numbers"),
    # On 602f2ee: exit 1, "LibTorch error: unsupported memory format option Contiguous".
    (SparseEmbedding, "parameter 'embed.weight' has a sparse gradient (an nn.Embedding or EmbeddingBag with "
                      "sparse=True)"),
])
def test_an_output_or_gradient_the_step_cannot_take_is_one_line_and_exit_4(lm, tmp_path, module, says):
    model = save_model(module(), tmp_path / "model.pt")
    run = train(lm, "--model", model, "--steps", 2, "--batch-size", 8, check=False)
    one_line_error(run, 4, says)


def test_probability_targets_of_a_sequence_take_the_class_dimension_last(lm, tmp_path):
    # One-hot probabilities [N, T, 256] must give the losses of the class indices [N, T] they
    # encode; on 602f2ee torch's cross_entropy took T as the class dimension (a loss of 0.18 for 5.7).
    common = ["--steps", 3, "--batch-size", 8, "--data-order", "file", "--precision", "fp32"]
    for name in ("data", "test"):
        d = torch.load(lm / f"{name}.pt", weights_only=True)
        torch.save({"inputs": d["inputs"], "targets": torch.nn.functional.one_hot(d["targets"], 256).float()},
                   tmp_path / f"{name}.pt")
    train(lm, *common, "--test-data", lm / "test.pt", "--metrics", tmp_path / "i.jsonl", "--summary",
          tmp_path / "i.json")
    train(lm, *common, "--data", tmp_path / "data.pt", "--test-data", tmp_path / "test.pt", "--metrics",
          tmp_path / "p.jsonl", "--summary", tmp_path / "p.json")
    indices = [r["loss"] for r in metrics(tmp_path / "i.jsonl")]
    probabilities = [r["loss"] for r in metrics(tmp_path / "p.jsonl")]
    assert probabilities == pytest.approx(indices, rel=1e-5)
    test_loss = json.load(open(tmp_path / "i.json"))["test_loss"]
    assert json.load(open(tmp_path / "p.json"))["test_loss"] == pytest.approx(test_loss, rel=1e-5)


@pytest.mark.parametrize("positions, says", [
    (16, "every one is -100, which cross entropy ignores"),
    (0, "its targets [64, 0] hold no position"),
])
def test_training_data_without_a_target_is_refused_up_front_like_test_data(lm, tmp_path, positions, says):
    # On 602f2ee every step's loss was 0/0: all skipped, exit 0, status completed.
    data = torch.load(lm / "data.pt", weights_only=True)
    ignored = torch.full_like(data["targets"], -100)
    torch.save({"inputs": data["inputs"][:, :positions], "targets": ignored[:, :positions]}, tmp_path / "none.pt")
    run = train(lm, "--data", tmp_path / "none.pt", "--steps", 2, "--batch-size", 8, "--metrics",
                tmp_path / "m.jsonl", check=False)
    one_line_error(run, 2, f"--data holds no target to train on: {says}")
    assert not os.path.exists(tmp_path / "m.jsonl") or metrics(tmp_path / "m.jsonl") == []


def test_eval_batches_that_hold_no_target_are_refused_up_front(lm, tmp_path):
    # On 602f2ee --eval-batches 1 over a first batch of -100 targets gave test_loss NaN (null), exit 0.
    test = torch.load(lm / "test.pt", weights_only=True)
    test["targets"][:8] = -100
    torch.save(test, tmp_path / "test.pt")
    run = train(lm, "--test-data", tmp_path / "test.pt", "--eval-batches", 1, "--steps", 2, "--batch-size", 8,
                "--metrics", tmp_path / "m.jsonl", check=False)
    one_line_error(run, 2, "--test-data holds no target to evaluate in the 1 batch(es) of --eval-batches")
    assert not os.path.exists(tmp_path / "m.jsonl") or metrics(tmp_path / "m.jsonl") == []
    train(lm, "--test-data", tmp_path / "test.pt", "--eval-batches", 2, "--steps", 2, "--batch-size", 8)
