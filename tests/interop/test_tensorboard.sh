#!/usr/bin/env bash
# --tensorboard: TensorBoard's own reader (the tensorboard package, tools/setup.sh installs it)
# reads every scalar of a 50-step fp16 run with skipped steps, and each value equals the JSONL's
# (as float32, TensorBoard's simple_value), the layer norms equal the CSV's, the test metrics the
# summary's; every record's masked CRC-32C is checked independently of TensorBoard. Then a run
# resumed from a checkpoint into the same folder shows one point per step, the resumed run's.
# Usage: test_tensorboard.sh BIN_DIR PYTHON
set -euo pipefail
bin=$1 python=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
train=("$bin/ampkit-train" --workload synthetic --synthetic-inputs 16 --batch-size 32 --synthetic-width 32
       --synthetic-depth 2 --progress never --threads 1 --precision fp16 --scaler dynamic
       --opt scaler.init_scale=16777216 --clipper norm --opt clipper.max_norm=0.5 --eval-batches 2)
"${train[@]}" --steps 50 \
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

# Resumed after a crash: 15 steps with a checkpoint at step 10 (and at the end), then step-10 resumed
# to 20 into the same folder, as after a crash at step 15. The resumed file's SessionLog START at
# step 10 makes TensorBoard drop the first run's steps 10-14 and its evaluation at 15; it was
# written as the ignored log_message, and steps 10-14 showed twice.
"${train[@]}" --steps 15 --checkpoint-dir "$tmp/ck" --checkpoint-every 10 --tensorboard "$tmp/rtb" \
  --metrics "$tmp/r.jsonl" > "$tmp/log" 2>&1 || { tail -5 "$tmp/log"; exit 1; }
cp "$tmp/r.jsonl" "$tmp/r15.jsonl"
# TensorBoard reads a folder's files in name order, and a name starts with its creation second.
sleep 1
"${train[@]}" --steps 20 --resume "$tmp/ck/step-10" --tensorboard "$tmp/rtb" --metrics "$tmp/r.jsonl" \
  --summary "$tmp/rs.json" > "$tmp/log" 2>&1 || { tail -5 "$tmp/log"; exit 1; }
"$python" - "$tmp" <<'PY'
import glob, json, math, struct, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto import event_pb2

d = sys.argv[1]
files = sorted(glob.glob(f"{d}/rtb/events.out.tfevents.*"))
assert len(files) == 2, files
# The resumed run's file: file_version, then Event.session_log = START at the resumed step.
events = list(LegacyEventFileLoader(files[1]).Load())
assert events[0].file_version == "brain.Event:2", events[0]
start = events[1]
assert start.HasField("session_log") and not start.HasField("log_message"), start
assert start.session_log.status == event_pb2.SessionLog.START and start.step == 10, start

ea = EventAccumulator(f"{d}/rtb", size_guidance={"scalars": 0})
ea.Reload()
jsonl = [json.loads(l) for l in open(f"{d}/r.jsonl")]  # steps 0-9 of the first run, 10-19 resumed
first = {r["step"]: r for r in (json.loads(l) for l in open(f"{d}/r15.jsonl"))}
assert [r["step"] for r in jsonl] == list(range(20)), [r["step"] for r in jsonl]
assert sorted(first) == list(range(15)), sorted(first)
# The runs are told apart by their throughput: a value check that cannot tell them apart proves nothing.
assert any(first[s]["samples_per_second"] != jsonl[s]["samples_per_second"] for s in range(10, 15))
f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]
def number(v):
    return float(v) if not isinstance(v, str) else float(v.replace("inf", "Infinity")) if v != "nan" else math.nan
fields = ["loss", "lr", "scale", "grad_norm", "grad_norm_clipped", "clip_threshold", "clip_coef", "grad_max_abs",
          "zero_fraction", "samples_per_second", "skipped_steps", "steps_discarded", "rollbacks"]
for f in fields:
    points = ea.Scalars(f"train/{f}")
    assert [e.step for e in points] == list(range(20)), (f, [e.step for e in points])  # one point per step
    for e, r in zip(points, jsonl):
        v = number(r[f])
        same = (math.isnan(v) and math.isnan(e.value)) or e.value == f32(v)
        assert same, f"train/{f} at step {e.step}: tensorboard {e.value}, the resumed run's {f32(v)}"
summary = json.load(open(f"{d}/rs.json"))
for key in ["test_loss", "test_accuracy"]:
    got = [(e.step, e.value) for e in ea.Scalars(f"eval/{key}")]
    assert got == [(20, f32(summary[key]))], (key, got)  # the first run's evaluation at 15 is gone
print(f"PASS: resumed at step 10: {len(fields)} train scalars with one point for each of steps 0-19, "
      "the resumed run's values; one evaluation, at 20")
PY
