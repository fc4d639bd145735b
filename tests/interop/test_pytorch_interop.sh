#!/usr/bin/env bash
# Checkpoints both ways between ampkit-train and plain PyTorch (docs/configuration.md, "PyTorch
# interop"); the PyTorch side is tools/golden/pytorch_interop.py.
#  1. ampkit trains 20 steps and checkpoints; PyTorch loads the checkpoint (torch.load,
#     weights_only=True) into nn modules and AdamW(fused=True) and trains 10 steps; ampkit resumes
#     the same checkpoint for 10 steps: the losses agree within 1e-6.
#  2. PyTorch saves {model, optimizer, scaler} and trains 10 more steps; ampkit-train --init-from
#     that file trains 10 steps: the same losses within 1e-6, and the GradScaler's scale and growth
#     tracker continue (the scale doubles after 3 steps: tracker 7 of interval 10).
#  3. Files that do not fit: one error line each, exit 6.
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
torch.save({"model": m.state_dict(), "epoch": 3}, f"{d}/other.pt")
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
expect_error "$tmp/other.pt" "unexpected entry 'epoch' (expected model, optimizer, scaler)"
expect_error "$tmp/code.pt" "not a weights-only torch.save file (global __builtin__.print)"
expect_error "$tmp/text.pt" "not a file torch.save wrote"
head -c 2000 "$tmp/start.pt" > "$tmp/truncated.pt"
expect_error "$tmp/truncated.pt" "not a file torch.save wrote"
expect_error "$tmp/missing.pt" "not a readable file"
echo "PASS"
