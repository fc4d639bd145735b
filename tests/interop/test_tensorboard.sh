#!/usr/bin/env bash
# --tensorboard: TensorBoard's own reader (the tensorboard package, tools/setup.sh installs it)
# reads every scalar of a 50-step fp16 run with skipped steps, and each value equals the JSONL's
# (as float32, TensorBoard's simple_value), the layer norms equal the CSV's, the test metrics the
# summary's; every record's masked CRC-32C is checked independently of TensorBoard.
# Usage: test_tensorboard.sh BIN_DIR PYTHON
set -euo pipefail
bin=$1 python=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/ampkit-train" --workload synthetic --synthetic-inputs 16 --batch-size 32 --synthetic-width 32 \
  --synthetic-depth 2 --progress never --threads 1 --steps 50 --precision fp16 --scaler dynamic \
  --opt scaler.init_scale=16777216 --clipper norm --opt clipper.max_norm=0.5 --eval-batches 2 \
  --tensorboard "$tmp/tb" --metrics "$tmp/m.jsonl" --layer-norms "$tmp/norms.csv" --summary "$tmp/s.json" \
  > "$tmp/log" 2>&1 || { tail -5 "$tmp/log"; exit 1; }
"$python" - "$tmp" <<'PY'
import csv, glob, json, math, struct, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

d = sys.argv[1]
files = glob.glob(f"{d}/tb/events.out.tfevents.*")
assert len(files) == 1, files

# TFRecord framing, checked by hand: length, masked CRC-32C of it, data, masked CRC-32C of it.
table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
def masked(data):
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
raw, pos, records = open(files[0], "rb").read(), 0, 0
while pos < len(raw):
    header = raw[pos:pos + 8]
    (n,) = struct.unpack("<Q", header)
    assert struct.unpack("<I", raw[pos + 8:pos + 12])[0] == masked(header), f"length CRC of record {records}"
    data = raw[pos + 12:pos + 12 + n]
    assert struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])[0] == masked(data), f"data CRC of record {records}"
    pos += 16 + n
    records += 1
assert records == 1 + 50 + 1, records  # file_version, 50 steps, the test metrics

ea = EventAccumulator(f"{d}/tb", size_guidance={"scalars": 0})
ea.Reload()
tags = set(ea.Tags()["scalars"])
jsonl = [json.loads(l) for l in open(f"{d}/m.jsonl")]
assert len(jsonl) == 50
f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]
def number(v):
    return float(v) if not isinstance(v, str) else float(v.replace("inf", "Infinity")) if v != "nan" else math.nan
def check(tag, expected):  # expected: step -> value
    got = {e.step: e.value for e in ea.Scalars(tag)}
    assert sorted(got) == sorted(expected), (tag, sorted(got)[:5])
    for step, v in expected.items():
        same = (math.isnan(v) and math.isnan(got[step])) or got[step] == f32(v)
        assert same, f"{tag} at step {step}: tensorboard {got[step]}, expected {f32(v)}"
fields = ["loss", "lr", "scale", "grad_norm", "grad_norm_clipped", "clip_threshold", "clip_coef", "grad_max_abs",
          "zero_fraction", "samples_per_second", "skipped_steps", "steps_discarded", "rollbacks"]
for f in fields:
    check(f"train/{f}", {r["step"]: number(r[f]) for r in jsonl})
check("train/found_inf", {r["step"]: float(r["found_inf"]) for r in jsonl})
check("train/skipped", {r["step"]: float(not r["stepped"]) for r in jsonl})
check("train/clipped", {r["step"]: float(r["clipped"]) for r in jsonl})
skips = sum(not r["stepped"] for r in jsonl)
assert 0 < skips < 50, skips  # the run has skip events to show
norms = {}
for row in csv.DictReader(open(f"{d}/norms.csv")):
    norms.setdefault(row["name"], {})[int(row["step"])] = float(row["grad_norm"])
assert len(norms) == 6
for name, values in norms.items():
    check(f"layer_norms/{name}", values)
summary = json.load(open(f"{d}/s.json"))
for key in ["test_loss", "test_accuracy"]:
    check(f"eval/{key}", {50: summary[key]})
assert len(tags) == len(fields) + 3 + len(norms) + 2, sorted(tags)
print(f"PASS: {records} records, {len(tags)} tags, {skips} skipped steps; every value equals the JSONL/CSV/summary")
PY
