#!/usr/bin/env bash
# Checkpoints both ways between ampkit-train and plain PyTorch (docs/configuration.md, "PyTorch
# interop"); the PyTorch side is tools/golden/pytorch_interop.py.
#  1. ampkit trains 20 steps and checkpoints; PyTorch loads the checkpoint (torch.load,
#     weights_only=True) into nn modules and AdamW(fused=True) and trains 10 steps; ampkit resumes
#     the same checkpoint for 10 steps: the losses agree within 1e-6.
#  2. PyTorch saves {model, optimizer, scaler} and trains 10 more steps; ampkit-train --init-from
#     that file trains 10 steps: the same losses within 1e-6, and the GradScaler's scale and growth
#     tracker continue (the scale doubles after 3 steps: tracker 7 of interval 10).
#  3. Files that do not fit: one error line each, exit 6; a training script's extras (epoch, step,
#     lr_scheduler) are named in a note and not loaded.
#  4. Hostile files, to --init-from and as a checkpoint's model.pt or optimizer.pt under
#     a consistent manifest: deep nesting, memo PUTs, a version record past 64 bits, a zero-stride view, a
#     compressed storage, a FIFO, /dev/zero, and optimizer.pt files LibTorch's loader would crash on
#     (nested code, a DATA.PKL, a hostile debug pickle, a state key that is not a number): exit 6
#     and one line, each in under 5 s, and none
#     allocates more than the file's bytes back (peak RSS within 150 MB of a run that fails at once;
#     600 MB under AddressSanitizer).
# Usage: test_pytorch_interop.sh BIN_DIR PYTHON SOURCE_DIR
set -euo pipefail
bin=$1 python=$2 src=$3
tool="$src/tools/golden/pytorch_interop.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
train=("$bin/ampkit-train" --workload synthetic --synthetic-inputs 16 --batch-size 32 --synthetic-width 32
       --synthetic-depth 2 --progress never --threads 1)
fail() { echo "FAIL: $*" >&2; exit 1; }

# The losses of a metrics file (from record FIRST on) against a JSON list, within 1e-6.
same_losses() {
  "$python" - "$@" <<'PY'
import json, sys
metrics, expected, first = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
got = [json.loads(l)["loss"] for l in open(metrics)][first:]
assert len(got) == len(expected) == 10, (len(got), len(expected))
worst = max(abs(a - b) for a, b in zip(got, expected))
print(f"  max |ampkit - pytorch| over 10 losses: {worst:.3g}")
sys.exit(0 if worst <= 1e-6 else f"losses differ by {worst}: {got} vs {expected}")
PY
}

echo "1. ampkit checkpoint -> PyTorch"
"${train[@]}" --steps 20 --checkpoint-dir "$tmp/ck" > "$tmp/train.log" 2>&1 || fail "training: $(tail -3 "$tmp/train.log")"
"$python" "$tool" continue "$tmp/ck/step-20" --steps 10 > "$tmp/python.json"
"${train[@]}" --steps 30 --resume "$tmp/ck/step-20" --metrics "$tmp/resumed.jsonl" > "$tmp/resume.log" 2>&1 ||
  fail "resume: $(tail -3 "$tmp/resume.log")"
same_losses "$tmp/resumed.jsonl" "$tmp/python.json" 0 || fail "checkpoint -> PyTorch"

echo "2. PyTorch {model, optimizer, scaler} -> ampkit --init-from"
"$python" "$tool" start "$tmp/start.pt" --steps 10 > "$tmp/python2.json"
"${train[@]}" --steps 10 --init-from "$tmp/start.pt" --scaler dynamic --opt scaler.growth_interval=10 \
  --metrics "$tmp/init.jsonl" > "$tmp/init.log" 2>&1 || fail "init-from: $(tail -3 "$tmp/init.log")"
grep -q "initialised from $tmp/start.pt (model, optimizer, scaler)" "$tmp/init.log" || fail "no init line"
same_losses "$tmp/init.jsonl" "$tmp/python2.json" 0 || fail "PyTorch -> --init-from"
"$python" - "$tmp/init.jsonl" <<'PY' || fail "the GradScaler state did not continue"
import json, sys
scales = [json.loads(l)["scale"] for l in open(sys.argv[1])]
assert scales == [16384.0] * 3 + [32768.0] * 7, scales
PY

echo "3. files that do not fit"
"$python" - "$tmp" "$src/tools/golden" <<'PY'
import sys, torch
sys.path.insert(0, sys.argv[2])
from pytorch_interop import Mlp
d = sys.argv[1]
torch.save(Mlp(16, 48, 2, 10).state_dict(), f"{d}/wide.pt")
sd = Mlp(16, 32, 2, 10).state_dict(); del sd["layers.1.bias"]; sd["extra"] = torch.zeros(1)
torch.save(sd, f"{d}/keys.pt")
m = Mlp(16, 32, 2, 10)
torch.save({"model": m.state_dict(), "optimizer": torch.optim.AdamW(m.parameters(), weight_decay=0.1).state_dict()},
           f"{d}/decay.pt")
torch.save({"model": m.state_dict(), "epoch": 3, "step": 120, "lr_scheduler": {"last_epoch": 3}},
           f"{d}/other.pt")
torch.save({"model": m.state_dict(), "fn": print}, f"{d}/code.pt")
open(f"{d}/text.pt", "w").write("not a checkpoint\n")
PY
expect_error() {  # FILE MESSAGE-PART
  set +e
  out=$("${train[@]}" --steps 1 --init-from "$1" 2>&1)
  code=$?
  set -e
  [[ $code == 6 ]] || fail "$1: exit $code, expected 6: $out"
  [[ $(printf '%s\n' "$out" | grep -c .) == 1 ]] || fail "$1: more than one line: $out"
  [[ $out == *"$2"* ]] || fail "$1: expected '$2' in: $out"
  echo "  $out"
}
expect_error "$tmp/wide.pt" "'layers.0.weight' has shape [48, 16] in the file, [32, 16] in the model"
expect_error "$tmp/keys.pt" "missing keys: layers.1.bias; unexpected keys: extra"
expect_error "$tmp/decay.pt" "weight_decay (--weight-decay) 0.1, this run uses 0.01"
out=$("${train[@]}" --steps 1 --init-from "$tmp/other.pt" 2>&1) || fail "extras refused: $out"
[[ $out == *"note: --init-from $tmp/other.pt: not loaded: epoch, step, lr_scheduler (ampkit-train loads model, optimizer and scaler)"* ]] ||
  fail "no note naming the extras: $out"
echo "  extras named: $(grep 'not loaded' <<< "$out")"
expect_error "$tmp/code.pt" "not a weights-only torch.save file (global __builtin__.print)"
expect_error "$tmp/text.pt" "not a file torch.save wrote"
head -c 2000 "$tmp/start.pt" > "$tmp/truncated.pt"
expect_error "$tmp/truncated.pt" "not a file torch.save wrote"
expect_error "$tmp/missing.pt" "not a readable file"

echo "4. hostile files"
"${train[@]}" --steps 2 --checkpoint-dir "$tmp/hck" > "$tmp/hck.log" 2>&1 || fail "training: $(tail -3 "$tmp/hck.log")"
"$python" - "$tmp" "${train[@]}" <<'PY' || fail "hostile files"
import hashlib, json, os, re, resource, shutil, subprocess, sys, time, zipfile
d, train = sys.argv[1], sys.argv[2:]

def archive(path, pickle, version=b"3\n", records=(), version_method=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle)
        z.writestr("archive/version", version, compress_type=version_method)
        for name, data, method in records:
            z.writestr("archive/" + name, data, compress_type=method)

deep = 10**6
files = {
    "deep_tuple": (b"\x80\x02)" + b"\x85" * deep + b".", "nested deeper than 1000"),
    "deep_list": (b"\x80\x02" + b"]" * deep + b"a" * (deep - 1) + b".", "more than 262144 lists, dicts and tuples"),
    "deep_list_shallow": (b"\x80\x02" + b"]" * 2000 + b"a" * 1999 + b".", "nested deeper than 1000"),
    # A list inside itself (pickle's memo makes cycles): refused, never walked forever.
    "cycle": (b"\x80\x02]q\x00h\x00a.", "a container inside itself"),
    "deep_dict": (b"\x80\x02}" + b"K\x00}" * (deep - 1) + b"s" * (deep - 1) + b".",
                  "more than 262144 lists, dicts and tuples"),
    "deep_dict_shallow": (b"\x80\x02}" + b"K\x00}" * 2000 + b"s" * 2000 + b".", "nested deeper than 1000"),
    # 400k memo PUTs, each 1025 slots past the last: memory must follow the PUTs, not the indices
    "memo": (b"\x80\x02N" + b"".join(b"r" + (i * 1025 + 1024).to_bytes(4, "little") for i in range(400000)) + b".",
             "holds a None, not a dict"),
}
for name, (pickle, _) in files.items():
    archive(f"{d}/{name}.pt", pickle)
archive(f"{d}/version.pt", b"\x80\x02}.", version=b"99999999999999999999999\n")
files["version"] = (None, "not a file torch.save wrote")
# A zero-stride [2^29] float view of a one-element storage: 2 GiB if materialized.
tensor = (b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n(X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
          b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQK\x00J\x00\x00\x00 \x85K\x00\x85\x89)tRs.")
archive(f"{d}/zero_stride.pt", tensor.replace(b"(X\x07", b"((X\x07"), records=[("data/0", b"\0" * 4, zipfile.ZIP_STORED)])
files["zero_stride"] = (None, "an expanded view")
# A 256 MiB storage deflated into a file of about 260 KB.
big = (b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
       b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ\x00\x00\x00\x04tQK\x00J\x00\x00\x00\x04\x85K\x01\x85\x89)tRs.")
archive(f"{d}/compressed.pt", big, records=[("data/0", b"\0" * (1 << 28), zipfile.ZIP_DEFLATED)])
files["compressed"] = (None, "more than the file holds")
# The same bomb in the version record, which LibTorch's reader inflates in its constructor.
archive(f"{d}/version_bomb.pt", b"\x80\x02}.", version=b"3\n" + b" " * (1 << 28), version_method=zipfile.ZIP_DEFLATED)
files["version_bomb"] = (None, "record archive/version declares 268435458 bytes, more than the file holds")
os.mkfifo(f"{d}/fifo.pt")
files["fifo"] = (None, "fifo.pt is not a regular file")
os.symlink("/dev/zero", f"{d}/zero.pt")
files["zero"] = (None, "zero.pt is not a regular file")

# optimizer.pt files that LibTorch's own reader (torch::jit::load, whose TorchScript frontend
# compiles the archive's code records) would crash on or misread, made from a real one.
def optimizer_variant(name, change):
    source = zipfile.ZipFile(f"{d}/hck/step-2/optimizer.pt")
    with zipfile.ZipFile(f"{d}/{name}.pt", "w") as z:
        for info in source.infolist():
            z.writestr(*change(info.filename, source.read(info.filename)))
code = "archive/code/__torch__.py"
shallow_list = b"\x80\x02" + b"]" * 2000 + b"a" * 1999 + b"."
# 100,000 nested List[...] (or unary minus) in a code record: the frontend's parser recurses per
# level and overflows the stack (torch.jit.load segfaults on both).
optimizer_variant("nested_type", lambda n, b: (n, b.replace(b": str", b": " + b"List[" * 100000 + b"str" + b"]" * 100000)
                                             if n == code else b))
optimizer_variant("unary", lambda n, b: (n, b.replace(b"__buffers__ = []", b"__buffers__ = " + b"-" * 200000 + b"1")
                                       if n == code else b))
# LibTorch's zip library finds records ignoring case: DATA.PKL is read as data.pkl.
optimizer_variant("upper_case_pkl", lambda n, b: ("archive/DATA.PKL", shallow_list) if n == "archive/data.pkl" else (n, b))
optimizer_variant("debug_pkl", lambda n, b: (n, shallow_list if n == code + ".debug_pkl" else b))
# A state key that is not a number (LibTorch's loader calls std::stoull on it), the same length
# in the code and the pickle so that both stay well formed.
key = re.search(rb'__annotations__\["(\d+)"\]', zipfile.ZipFile(f"{d}/hck/step-2/optimizer.pt").read(
    "archive/code/__torch__/___torch_mangle_0.py")).group(1)
optimizer_variant("state_key", lambda n, b: (n, b.replace(key, b"k" * len(key))))
# A global LibTorch's unpickler would act on: restore_type_tag parses its type string with the
# TorchScript frontend (200,000 nested List[ crash it, two containers deep in the pickle).
optimizer_variant("type_tag", lambda n, b: (n, b"\x80\x02ctorch.jit._pickle\nrestore_type_tag\n]X\x03\x00\x00\x00int\x86R."
                                          if n == "archive/data.pkl" else b))
# A class name of 1000 dotted parts (the frontend resolves each part, recursively).
optimizer_variant("dotted_type", lambda n, b: (n, b.replace(b": str", b": __torch__." + b"a." * 1000 + b"Module")
                                             if n == code else b))
# A record name past the 511 bytes LibTorch lists them by: listed cut short, it would escape a
# check that picks records by their ending.
optimizer_variant("long_name", lambda n, b: ("archive/code/" + "a" * 600 + ".py" if n == code else n, b))
optimizer_files = {"type_tag": "not a file LibTorch wrote (global torch.jit._pickle.restore_type_tag)",
                   "dotted_type": "(code/__torch__.py: line 4 is not one torch::serialize::OutputArchive writes)",
                   "long_name": "is longer than 511 bytes or holds a NUL",
                   "nested_type": "(code/__torch__.py: line 4 is not one torch::serialize::OutputArchive writes)",
                   "unary": "(code/__torch__.py: line 3 is not one torch::serialize::OutputArchive writes)",
                   "upper_case_pkl": "optimizer.pt (DATA.PKL): not a file LibTorch wrote (nested deeper than 1000)",
                   "debug_pkl": "(code/__torch__.py.debug_pkl): not a file LibTorch wrote (nested deeper than 1000)",
                   "state_key": "optimizer.pt is not an optimizer state LibTorch can read: stoull"}

def peak_rss_mb(cmd):
    """Runs cmd; returns (exit code, output, seconds, its peak RSS in MB)."""
    r, w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1); os.dup2(w, 2); os.close(r)
        os.execv(cmd[0], cmd)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(), time.monotonic() - start, usage.ru_maxrss / 1024

_, _, _, base = peak_rss_mb(train + ["--steps", "1", "--init-from", f"{d}/missing.pt"])
# AddressSanitizer's redzones and quarantine inflate every allocation in the instrumented suite.
slack = 600 if "ASAN_OPTIONS" in os.environ else 150
failures = []
def check(label, cmd, expected):
    code, out, secs, rss = peak_rss_mb(cmd)
    lines = out.strip().splitlines()
    ok = code == 6 and len(lines) == 1 and expected in out and secs < 5 and rss - base < slack
    print(f"  {label:32s} exit {code}  {secs:4.2f} s  +{rss - base:5.0f} MB  {lines[-1] if lines else ''}")
    if not ok:
        failures.append(label)

for name, (_, expected) in files.items():
    check(f"--init-from {name}", train + ["--steps", "1", "--init-from", f"{d}/{name}.pt"], expected)

# The same pickles as a checkpoint's model.pt, under a manifest that vouches for them.
# The same pickles as a checkpoint's model.pt or optimizer.pt (LibTorch's own reader reads that
# one: it is scanned against the same bounds first), under a manifest that vouches for them.
checkpoint_errors = {("model.pt", "memo"): "does not hold a dict of tensors",
                     ("optimizer.pt", "memo"): "memo index",
                     ("optimizer.pt", "deep_list"): "more than 262144 lists, dicts, tuples and objects",
                     ("optimizer.pt", "compressed"): "its records declare more bytes than the file holds"}
for target, names in (("model.pt", ("deep_tuple", "deep_dict", "deep_dict_shallow", "memo", "zero_stride",
                                    "compressed", "version_bomb")),
                      ("optimizer.pt", ("deep_tuple", "deep_list", "deep_dict_shallow", "cycle", "memo",
                                        "compressed", "version_bomb", *optimizer_files))):
    for name in names:
        ck = f"{d}/hck_{target}_{name}"
        shutil.copytree(f"{d}/hck", ck)
        step = f"{ck}/step-2"
        shutil.copy(f"{d}/{name}.pt", f"{step}/{target}")
        m = json.load(open(f"{step}/manifest.json"))
        data = open(f"{step}/{target}", "rb").read()
        m["files"][target] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        text = json.dumps(m, indent=1) + "\n"
        open(f"{step}/manifest.json", "w").write(text)
        open(f"{step}/manifest.sha256", "w").write(hashlib.sha256(text.encode()).hexdigest() + "  manifest.json\n")
        check(f"--resume {target} {name}", train + ["--steps", "3", "--resume", step],
              checkpoint_errors.get((target, name)) or optimizer_files.get(name) or files[name][1])
sys.exit(f"failed: {failures}" if failures else 0)
PY
echo "PASS"
