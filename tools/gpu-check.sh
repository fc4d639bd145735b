#!/usr/bin/env bash
# One command for a machine with a GPU: runs ampkit's CUDA checks from an existing build
# and writes a Markdown report (format: docs/benchmarks.md, "What has run on a GPU").
#
#   tools/gpu-check.sh [--build DIR] [--report FILE] [--steps N] [--data DIR] [--sections LIST]
#                      [--budget SECONDS] [--deadline SECONDS] [--dry-run-on-cpu]
#
# --sections LIST: which sections run, comma-separated, in the order given (default: all, in the order
# nccl,training,host-sync,parity,first-use,post-backward,throughput,models,scaling,fp8). --budget SECONDS: a section
# that would start after SECONDS of the script's time says "not run" under its heading instead.
# --deadline SECONDS: every program is stopped by then (its time limit is cut to what is left; a
# section with under 20 s left is not run), so that the report is written before a caller's own
# limit. Neither by default. Each section appends to the report as it ends, and the report's last
# line says the script ended: a report without it was cut short. tools/gpu-pack.sh prepares a build
# and the datasets for a lent machine and prints the call.
#
# --data DIR: a folder holding fashion-mnist/ (the IDX .gz files) and fortunes/ (text), for a machine
# without tools/setup.sh's datasets (copy them into the checkout and carry them); by default the
# workloads read /usr/share/datasets/fashion-mnist and /usr/share/games/fortunes.
#
# --dry-run-on-cpu runs every check but NCCL on the CPU, with short runs on one thread each, to test
# this script on a machine without a GPU (ctest's test_gpu_check); its figures mean nothing.
#
# Without a GPU it prints "no GPU: nothing to check" and exits 0 (CI runs it that way). The build
# may come from another machine (Release, Boost and yaml-cpp linked statically, carried over):
# LibTorch's libraries are taken from the python torch found here. Exit status: 0 when every check
# that ran passed, 1 otherwise.
set -uo pipefail
started=$SECONDS
cd "$(dirname "$0")/.." || exit 2
build=build report=gpu-report.md steps=100 device=cuda data="" budget="" deadline=""
all_sections="nccl training host-sync parity first-use post-backward throughput models scaling fp8"
sections=$all_sections
while [ $# -gt 0 ]; do
  case "$1" in
    --build|--report|--steps|--data|--sections|--budget|--deadline)
      [ $# -ge 2 ] || { echo "gpu-check.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;&
    --steps)
      [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check.sh: --steps takes a whole number above 0, not '$2'" >&2; exit 2; } ;;&
    --build) build=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --sections) sections=${2//,/ }; shift 2 ;;
    --budget|--deadline)
      [[ $2 =~ ^[0-9]+$ ]] || { echo "gpu-check.sh: $1 takes whole seconds, not '$2'" >&2; exit 2; } ;;&
    --budget) budget=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --dry-run-on-cpu) device=cpu; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
seen=" "
for name in $sections; do
  case " $all_sections " in
    *" $name "*) ;;
    *) echo "gpu-check.sh: --sections: unknown section '$name' (one of: ${all_sections// /, })" >&2; exit 2 ;;
  esac
  [[ $seen == *" $name "* ]] && { echo "gpu-check.sh: --sections names '$name' twice" >&2; exit 2; }
  seen="$seen$name "
done
[ -n "${sections// /}" ] || { echo "gpu-check.sh: --sections names no section" >&2; exit 2; }
python=${PYTHON:-python3}
# Only a GPU run counts the GPUs: importing torch takes seconds (tens under load), which a dry run's
# --deadline would spend before its first section.
gpus=""
if [ "$device" = cuda ]; then
  gpus=$(timeout -k 5 120 "$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
fi
if [ "${gpus:-0}" = 0 ] && [ "$device" = cuda ]; then
  echo "no GPU: nothing to check"
  exit 0
fi
if [ -n "$data" ] && [ ! -d "$data/fashion-mnist" -o ! -d "$data/fortunes" ]; then
  echo "gpu-check.sh: --data $data holds no fashion-mnist/ and fortunes/ folders" >&2
  exit 2
fi
[ -x "$build/bin/ampkit-train" ] || { echo "gpu-check.sh: no build in $build (run tools/test.sh or carry one)" >&2; exit 2; }
# torch's folder, found without importing torch.
torch_lib=$(timeout -k 5 60 "$python" -c 'import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec("torch").origin), "lib"))')
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A build carried from another machine has that machine's absolute paths compiled into its tests
# (plugin folder, golden files) and its CTest files: make them resolve to this checkout.
recorded=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
if [ -n "$recorded" ] && [ ! -e "$recorded" ]; then
  if mkdir -p "$(dirname "$recorded")" 2>/dev/null && ln -s "$PWD" "$recorded" 2>/dev/null; then
    echo "gpu-check.sh: the build was made in $recorded: linked it to $PWD"
  else
    echo "gpu-check.sh: warning: the build was made in $recorded, which cannot be linked here; tests may not find their files" >&2
  fi
fi
mkdir -p "$(dirname "$report")" && touch "$report" 2>/dev/null ||
  { echo "gpu-check.sh: cannot write the report $report" >&2; exit 2; }
failed=0
# An instrumented build (AMPKIT_INSTRUMENT) has a _C.so that loads only into a python started with
# the sanitizer runtime first: its Python sections say so and run nothing (the Release suite runs them).
instrumented_build=$(sed -n 's/^AMPKIT_INSTRUMENT:BOOL=//p' "$build/CMakeCache.txt" 2>/dev/null)
section() { echo "gpu-check.sh: $1 done at $((SECONDS - started)) s"; }
# limit S: S seconds, or what is left before --deadline when that is less (at least 1).
limit() {
  local own=$1 left
  if [ -n "$deadline" ]; then
    left=$((deadline - (SECONDS - started)))
    [ "$left" -lt "$own" ] && own=$left
    [ "$own" -lt 1 ] && own=1
  fi
  echo "$own"
}
# bounded S PROGRAM ARGS...: PROGRAM with the time limit `limit S`, killed 15 s after its TERM (ampkit-train
# takes a first TERM as "stop after this step"), and with it whatever it started: timeout returns when
# its own child ends, and a grandchild that took the TERM as "stop after this step" would live on. Past
# the --deadline nothing starts. 124 or 137 when it was stopped (or not started).
bounded() {
  local own=$1 pid rc
  shift
  if [ -n "$deadline" ] && [ $((deadline - (SECONDS - started))) -lt 2 ]; then
    echo "gpu-check.sh: ${1##*/} not started: the --deadline of $deadline s has passed" >&2
    return 124
  fi
  timeout -k 15 "$(limit "$own")" "$@" &  # in the background to learn timeout's pid, its process group's
  pid=$!
  wait "$pid"
  rc=$?
  if [ "$rc" = 124 ] && kill -0 -- "-$pid" 2> /dev/null; then
    for _ in $(seq 15); do
      kill -0 -- "-$pid" 2> /dev/null || break
      sleep 1
    done
    kill -KILL -- "-$pid" 2> /dev/null
  fi
  return "$rc"
}
# stopped CODE: " (stopped at its time limit)" when CODE says bounded stopped the program.
stopped() {
  if [ "$1" = 124 ] || [ "$1" = 137 ]; then echo " (stopped at its time limit)"; fi
}
# too_late [S]: why a section (or a second benchmark run) that needs S seconds (default 20) should not
# start now; nothing when it may.
too_late() {
  local now=$((SECONDS - started)) need=${1:-20}
  if [ -n "$budget" ] && [ "$now" -ge "$budget" ]; then
    echo "the --budget of $budget s was spent ($now s)"
  elif [ -n "$deadline" ] && [ $((deadline - now)) -lt "$need" ]; then
    echo "under $need s were left before the --deadline of $deadline s ($now s)"
  fi
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

quick=""  # the dry run's shorter benchmark settings
workloads="synthetic fashion-mnist char-gpt"
if [ "$device" = cpu ]; then
  steps=5 workloads=synthetic
  quick="--workloads mlp-1m --precisions fp32,fp16 --steps 3 --warmup 1 --repeats 1 --batch-size 64"
  bench_quick="--reps 1 --warmup 0"
  # One thread per program: on a loaded machine LibTorch's waiting threads spin on the cores the
  # others need, which made a dry run several times slower (its figures mean nothing anyway).
  export OMP_NUM_THREADS=1
fi
{
  if [ "$device" = cpu ]; then
    echo "# ampkit's GPU checks, dry run on the CPU: $(date -u +%Y-%m-%d) (figures mean nothing)"
    echo
    echo "Device: the CPU ($(env -u OMP_NUM_THREADS nproc) cores, one thread per program)"
    # Importing torch takes seconds (as for the GPU count above): its package's version instead.
    visible="GPUs not counted" version=$(timeout -k 5 60 "$python" -c 'import importlib.metadata as m; print(m.version("torch"))')
  else
    echo "# ampkit on a GPU: $(date -u +%Y-%m-%d)"
    echo
    echo "Device: $(timeout -k 5 60 "$python" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")')"
    visible="$gpus GPUs visible" version=$(timeout -k 5 60 "$python" -c 'import torch; print(torch.__version__)')
  fi
  # A packed build (tools/gpu-pack.sh) names the commit it was packed at (the device's copy of the
  # checkout has no .git); the scripts are the checkout's.
  commit="commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  [ -s "$build/ampkit-commit.txt" ] && commit="build packed at commit $(head -c 40 "$build/ampkit-commit.txt"); scripts at $commit"
  echo "($visible); torch $version; $commit."
  [ "$sections" = "$all_sections" ] || echo "Sections, in this order: ${sections// /, }."
} > "$report"

# test_nccl: one rank (two when there are two GPUs), run directly (a carried build needs no CTest files).
run_nccl() {
  local code
  {
    echo
    echo "## NCCL"
    echo
    echo '| check | result |'
    echo '|---|---|'
  } >> "$report"
  if [ "$device" = cpu ]; then
    echo "| test_nccl | not run (dry run on the CPU) |" >> "$report"
  else
    bounded 180 bash tests/dist/test_nccl.sh "$build/bin" "$out/nccl-test" > "$out/nccl.log" 2>&1
    code=$?
    if [ $code = 0 ]; then
      echo "| test_nccl | passed: $(grep -m1 -E 'max rel loss diff|passed on' "$out/nccl.log" | cut -c1-120) |" >> "$report"
    elif [ $code = 77 ]; then
      echo "| test_nccl | skipped: $(tail -1 "$out/nccl.log" | cut -c1-120) |" >> "$report"
      failed=1
    else
      echo "| test_nccl | FAILED (exit $code$(stopped $code)): $(grep -m1 -E 'error|FAIL' "$out/nccl.log" | cut -c1-150) |" >> "$report"
      failed=1
    fi
    cp "$out/nccl.log" "${report%.md}-nccl.log" 2>/dev/null
  fi
}

run_training() {
  local workload precision scaler summary code fp32_sps data_args
  {
    echo
    echo "## Training on $device ($steps steps, samples/s of the whole run)"
    echo
    echo '| workload | precision | status | samples/s | speed-up vs fp32 | skipped steps | final loss |'
    echo '|---|---|---|---|---|---|---|'
  } >> "$report"
  for workload in $workloads; do
    fp32_sps=""
    for precision in fp32 bf16 fp16; do
      scaler=none
      [ "$precision" = fp16 ] && scaler=dynamic
      summary="$out/$workload-$precision.json"
      data_args=()
      [ -n "$data" ] && [ "$workload" = fashion-mnist ] && data_args=(--data-dir "$data/fashion-mnist")
      [ -n "$data" ] && [ "$workload" = char-gpt ] && data_args=(--text-dir "$data/fortunes")
      bounded 300 "$build/bin/ampkit-train" --device "$device" --workload "$workload" --precision "$precision" --scaler "$scaler" "${data_args[@]}" \
        --steps "$steps" --eval-batches 2 --progress never --summary "$summary" > "$out/run.log" 2>&1
      code=$?
      if [ $code -ne 0 ] || [ ! -f "$summary" ]; then
        echo "| $workload | $precision | FAILED (exit $code$(stopped $code)): $(grep -m1 'ampkit-train: error' "$out/run.log" | cut -c1-120) | | | | |" >> "$report"
        failed=1
        continue
      fi
      "$python" - "$summary" "$workload" "$precision" "${fp32_sps:-}" >> "$report" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
base = float(sys.argv[4]) if sys.argv[4] else None
sps = s["samples_per_second"]
speed = f"{sps / base:.2f}x" if base else "-"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['status']} | {sps:.0f} | {speed} | {s['skipped_steps']} | {s['final_loss']} |")
PY
      [ "$precision" = fp32 ] && fp32_sps=$("$python" -c "import json; print(json.load(open('$summary'))['samples_per_second'])")
    done
  done
}

# The deferred step against the synchronous one (ampkit-train --host-sync): the same
# planted faults, metrics and summary compared, host reads and throughput of each.
run_host-sync() {
  local sync_steps mode
  sync_steps=200
  [ "$device" = cpu ] && sync_steps=30
  {
    echo
    echo "## Deferred and synchronous steps on $device (ampkit-train --host-sync, synthetic fp16, $sync_steps steps, faults at 5, 12, 20)"
    echo
    echo '| check | result | host reads: step, deferred | samples/s: step, deferred |'
    echo '|---|---|---|---|'
  } >> "$report"
  for mode in step deferred; do
    bounded 300 "$build/bin/ampkit-train" --device "$device" --workload synthetic --precision fp16 --steps "$sync_steps" --progress never \
      --nan-policy backoff --clipper norm --opt clipper.max_norm=0.5 --inject inf@step=5 --inject nan@step=12 --inject spike@step=20 \
      --host-sync "$mode" --metrics "$out/sync-$mode.jsonl" --summary "$out/sync-$mode.json" --nan-report-dir "$out/reports-$mode" \
      > "$out/sync-$mode.log" 2>&1 || echo "exit $?" >> "$out/sync-$mode.log"
  done
  "$python" - "$out" >> "$report" 2>&1 <<'PY' || failed=1
import json, os, sys
out = sys.argv[1]
def rows(mode):
    result = []
    for line in open(os.path.join(out, f"sync-{mode}.jsonl")):
        r = json.loads(line)
        for k in ("time", "samples_per_second"):
            r.pop(k, None)
        if "located" in r:
            r["located"]["report"] = os.path.basename(r["located"]["report"])
        result.append(r)
    return result
def summary(mode):
    s = json.load(open(os.path.join(out, f"sync-{mode}.json")))
    return s, {k: v for k, v in s.items() if k not in ("wall_seconds", "samples_per_second", "step", "nan_reports")}
try:
    (a, sa), (b, sb) = summary("step"), summary("deferred")
    same = rows("step") == rows("deferred") and sa == sb and b["step"]["host_sync"] == "deferred"
    result = "identical metrics and summary" if same else "FAILED: the two runs differ"
    print(f"| deferred = step | {result} | {a['step']['host_reads']}, {b['step']['host_reads']} | "
          f"{a['samples_per_second']:.0f}, {b['samples_per_second']:.0f} |")
    sys.exit(0 if same else 1)
except Exception as e:  # a run that failed left no file
    tail = open(os.path.join(out, "sync-deferred.log")).read().strip().splitlines()[-1:] or [""]
    print(f"| deferred = step | FAILED: {type(e).__name__}: {e}; {tail[0][:150]} | | |")
    sys.exit(1)
PY
}

run_parity() {
  local goldens check name graph_test ran code
  {
    echo
    echo "## Parity and host reads on $device tensors (tests/engine/test_on_device.cpp)"
    echo
    echo '| check | result |'
    echo '|---|---|'
  } >> "$report"
  # GradScaler("cuda")'s own sequences, then the checks of test_on_device on the GPU.
  goldens="$out/gradscaler_cuda.json"
  if ! bounded 120 "$python" tools/golden/gradscaler_sequences.py --device "$device" --output "$goldens" > "$out/golden.log" 2>&1; then
    echo "| GradScaler(\"$device\") reference sequences | FAILED: $(tail -1 "$out/golden.log" | cut -c1-150) |" >> "$report"
    failed=1
    goldens=""
  fi
  for check in gradscaler_sequences_through_the_trainer:"loss scale = torch.amp.GradScaler(\"$device\"), 10 patterns, 4562 steps" \
               clippers_on_the_device_equal_their_references:"norm (L2, inf), value, agc = their references, 1e-6" \
               one_counted_host_read_per_healthy_step:"1 host read per healthy step, 16 scaler x NaN-policy pairs" \
               step_values_ride_the_buckets_bit_for_bit:"data-parallel step values through the buckets' encoding, bit for bit" \
               the_statistics_kernel_agrees_with_the_foreach_recipe:"statistics kernel (chunk_kernel) = foreach recipe, fp32/fp16/bf16, inf, NaN" \
               the_rules_kernel_decides_as_the_host_function_bit_for_bit:"rules kernel (deferred step) = the host function, bit for bit"; do
    name=${check%%:*}
    if [ "$name" = gradscaler_sequences_through_the_trainer ] && [ -z "$goldens" ]; then continue; fi
    if AMPKIT_TEST_DEVICE=$device AMPKIT_GRADSCALER_GOLDENS="$goldens" AMPKIT_PLUGIN_PATH= \
        bounded 120 "$build/tests/test_on_device" --run_test="$name" > "$out/$name.log" 2>&1; then
      echo "| ${check#*:} | passed |" >> "$report"
    else
      code=$?
      echo "| ${check#*:} | FAILED (exit $code$(stopped $code)): $(grep -m1 'error' "$out/$name.log" | cut -c1-150) |" >> "$report"
      failed=1
    fi
  done
  # The whole step in a CUDA graph: torch's test_graph_grad_scaling with step() and update()
  # inside the graph, against the uncaptured loop (on the CPU, the capture's CPU stand-ins only).
  graph_test=tests/python/test_cuda_graph.py
  if [ "$instrumented_build" = ON ]; then
    echo "| whole step in a CUDA graph ($graph_test) | not run: instrumented build |" >> "$report"
  elif AMPKIT_BUILD_DIR="$build" AMPKIT_PLUGIN_PATH= bounded 180 "$python" -m pytest -q -p no:cacheprovider "$graph_test" \
      > "$out/graph.log" 2>&1; then
    ran=$(tail -1 "$out/graph.log" | sed 's/=//g; s/^ *//; s/ in [0-9.]*s.*//')
    if [ "$device" = cuda ] && grep -q skipped "$out/graph.log"; then
      echo "| whole step in a CUDA graph ($graph_test) | FAILED: skipped on the GPU ($ran) |" >> "$report"
      failed=1
    else
      echo "| whole step in a CUDA graph ($graph_test) | passed: $ran |" >> "$report"
    fi
  else
    code=$?
    echo "| whole step in a CUDA graph ($graph_test) | FAILED$(stopped $code): $(grep -m1 -E '^(FAILED|ERROR)|Error' "$out/graph.log" | cut -c1-150) |" >> "$report"
    cp "$out/graph.log" "${report%.md}-graph.log" 2>/dev/null
    failed=1
  fi
}

# What only a GPU shows about ampkit's kernels at first use: their verdict on the device (the module
# loaded into the primary context from a new thread, the self-check passed; test_kernel_check, which
# also plants the fallbacks), then tools/gpu_first_use.py's checks (a new thread, a side stream, a
# capture on a side stream replayed, no synchronisation under set_sync_debug_mode("error")) and one
# short run under compute-sanitizer's memcheck and racecheck where it is installed; each time-boxed
# (90 s, 180 s under the sanitizer), and none started past --budget or within 30 s of --deadline.
# The dry run on the CPU runs test_kernel_check and lists the GPU checks as planned.
run_first-use() {
  local checks name what code tool sanitizer
  {
    echo
    echo "## First use of the kernels on $device (test_kernel_check, tools/gpu_first_use.py)"
    echo
    echo '| check | result |'
    echo '|---|---|'
  } >> "$report"
  if AMPKIT_PLUGIN_PATH= bounded 120 "$build/tests/test_kernel_check" > "$out/kernel-check.log" 2>&1; then
    echo "| kernels' verdict: images, self-check, planted fallbacks (test_kernel_check) | passed |" >> "$report"
  else
    code=$?
    echo "| kernels' verdict (test_kernel_check) | FAILED (exit $code$(stopped $code)): $(grep -m1 'error' "$out/kernel-check.log" | cut -c1-150) |" >> "$report"
    failed=1
  fi
  checks=$("$python" tools/gpu_first_use.py --list) || { echo "| tools/gpu_first_use.py --list | FAILED |" >> "$report"; failed=1; return; }
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  for name in $(cut -f1 <<< "$checks"); do
    what=$(grep "^$name"$'\t' <<< "$checks" | cut -f2)
    for tool in $([ "$name" = sanitized ] && echo memcheck racecheck || echo -); do
      [ "$tool" = - ] || what="compute-sanitizer --tool $tool: a short deferred run with a capture, no finding"
      if [ "$device" = cpu ]; then
        echo "| $what | planned, not run: needs a GPU (tools/gpu_first_use.py $name) |" >> "$report"
        continue
      elif [ "$tool" != - ] && [ -z "$sanitizer" ]; then
        echo "| $what | not run: no compute-sanitizer on this machine |" >> "$report"
        continue
      elif [ -n "$(too_late 30)" ]; then
        echo "| $what | not run: $(too_late 30) |" >> "$report"
        not_run=$((not_run + 1))
        continue
      fi
      local run=("$python" tools/gpu_first_use.py "$name")
      [ "$tool" = - ] || run=("$sanitizer" --tool "$tool" --error-exitcode 9 --target-processes all "${run[@]}")
      PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" AMPKIT_PLUGIN_PATH= bounded "$([ "$tool" = - ] && echo 90 || echo 180)" \
        "${run[@]}" > "$out/first-use.log" 2>&1
      code=$?
      if [ $code = 0 ]; then
        echo "| $what | passed: $(grep -v '^=' "$out/first-use.log" | tail -1 | cut -c1-150) |" >> "$report"
      else
        echo "| $what | FAILED (exit $code$(stopped $code)): $(grep -m1 -E 'FAILED|Error|differ|=========' "$out/first-use.log" | cut -c1-150) |" >> "$report"
        cp "$out/first-use.log" "${report%.md}-first-use-$name-$tool.log" 2>/dev/null
        failed=1
      fi
    done
  done
}

# The post-backward pipeline against the device's copy bandwidth.
run_post-backward() {
  local code
  {
    echo
    echo "## Post-backward pipeline against the copy bandwidth (ampkit-bench-post-backward-device)"
    echo
    echo '```'
  } >> "$report"
  # shellcheck disable=SC2086
  bounded 300 "$build/bin/ampkit-bench-post-backward-device" --device "$device" ${bench_quick:-} >> "$report" 2>&1
  code=$?
  echo '```' >> "$report"
  if [ $code != 0 ]; then
    echo "FAILED (exit $code$(stopped $code))" >> "$report"
    failed=1
  fi
}

# Throughput against PyTorch's best recipe on the same GPU (AdamW(fused=True), autocast, GradScaler).
run_throughput() {
  local code lim
  {
    echo
    echo "## Throughput: ampkit-train against PyTorch's recipe on $device (bench/throughput_comparison.py)"
    echo
  } >> "$report"
  lim=$(limit 480)
  # shellcheck disable=SC2086  # $quick is a list of options
  if bounded 480 "$python" bench/throughput_comparison.py --build "$build" --device "$device" --ways ampkit,pytorch \
      --workloads mlp-10m,cnn,gpt --precisions fp32,bf16,fp16 --steps 50 --warmup 5 --repeats 3 --batch-size 256 \
      --csv "${report%.md}-throughput.csv" \
      ${data:+--data "$data"} $quick > "$out/throughput.md" 2> "$out/throughput.log"; then
    sed -n '/^| workload/,$p' "$out/throughput.md" >> "$report"
  else
    code=$?
    # The table of the rows that ran, then each failed row's reason (one line each).
    sed -n '/^| workload/,$p' "$out/throughput.md" >> "$report"
    echo >> "$report"
    grep 'runs failed' "$out/throughput.log" | sed 's/^/FAILED: /' | cut -c1-250 >> "$report"
    if [ $code = 124 ] || [ $code = 137 ]; then
      # On the SIGTERM it printed the table of the rows whose runs had all ended (above); each
      # run's own line shows what else ran.
      { echo '```'; grep '^  ' "$out/throughput.log"; echo '```'; } >> "$report"
      echo "FAILED: stopped at its time limit of $lim s" >> "$report"
    else
      grep -q 'runs failed' "$out/throughput.log" || echo "FAILED: $(tail -1 "$out/throughput.log" | cut -c1-200)" >> "$report"
    fi
    failed=1
  fi
}

# Two real models (transformers' GPT-2 124M, timm's ViT-B/16; random weights) under ampkit.GradScaler
# and torch's GradScaler + unscale_ + clip_grad_norm_, fp16 and bf16, plus the skip decisions of both
# in lockstep around a planted overflow (bench/gpu_models.py; about 1-2 minutes on an H200).
run_models() {
  local models_args syncs sync extra code why
  models_args=()
  [ "$device" = cpu ] && models_args=(--tiny --threads 1 --rounds 1 --steps 2 --warmup 1 --compare-steps 6 --overflow-step 3)
  # On a GPU twice: the default (sync auto: the deferred step, no host read), with the whole step in a
  # CUDA graph beside it (--graph), and the synchronous step.
  syncs=(auto)
  [ "$device" = cuda ] && syncs=(auto step)
  [ "$instrumented_build" = ON ] && syncs=()
  if [ ${#syncs[@]} = 0 ]; then
    {
      echo
      echo "## Real models: ampkit.GradScaler against torch.amp.GradScaler on $device (bench/gpu_models.py)"
      echo
      echo "not run: $build is an instrumented build (AMPKIT_INSTRUMENT=ON), whose Python extension needs the sanitizer runtime preloaded"
    } >> "$report"
  fi
  for sync in "${syncs[@]}"; do
    why=$(too_late)
    if [ -n "$why" ]; then
      printf '\n## Real models, --sync %s\n\nnot run: %s\n' "$sync" "$why" >> "$report"
      not_run=$((not_run + 1))
      continue
    fi
    extra=()
    [ "$sync" = step ] && extra=(--rounds 3 --compare-steps 0)
    [ "$sync" = auto ] && [ "$device" = cuda ] && extra=(--graph)
    {
      echo
      echo "## Real models: ampkit.GradScaler against torch.amp.GradScaler on $device (bench/gpu_models.py --sync $sync ${extra[*]} ${models_args[*]})"
      echo
    } >> "$report"
    PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" AMPKIT_PLUGIN_PATH= bounded 300 "$python" bench/gpu_models.py \
      --device "$device" --sync "$sync" --json "${report%.md}-models-$sync.json" "${extra[@]}" "${models_args[@]}" \
      > "$out/models.md" 2> "$out/models.log"
    code=$?
    sed -n '/^Device:/,$p' "$out/models.md" >> "$report"
    if [ $code = 0 ] && grep -q 'capture failed\|a later round failed' "$out/models.md"; then
      echo >> "$report"
      echo "FAILED: the whole step in a CUDA graph did not run in every round (the graph column above)" >> "$report"
      failed=1
    fi
    if [ $code != 0 ]; then
      echo >> "$report"
      if [ $code = 124 ] || [ $code = 137 ]; then
        echo "FAILED: stopped at its time limit (300 s, or the --deadline)" >> "$report"
      else
        echo "FAILED (exit $code): $(grep -m1 -E 'FAILED|Error' "$out/models.log" || tail -1 "$out/models.log")" | cut -c1-250 >> "$report"
      fi
      failed=1
    fi
  done
}

# GPT-2 in bf16 against ampkit.fp8's current and delayed recipes (bench/gpu_fp8.py): tokens/s and the loss;
# on a GPU below compute capability 8.9 its fp8 rows say they were skipped and why.
run_fp8() {
  local args=() code
  [ "$device" = cpu ] && args=(--tiny --steps 1 --warmup 0)
  printf '\n## fp8 training on %s: GPT-2, bf16 against ampkit.fp8 (bench/gpu_fp8.py %s)\n\n' "$device" "${args[*]}" >> "$report"
  if [ "$instrumented_build" = ON ]; then
    echo "not run: $build is an instrumented build (AMPKIT_INSTRUMENT=ON), whose Python extension needs the sanitizer runtime preloaded" >> "$report"
    return
  fi
  PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" AMPKIT_PLUGIN_PATH= bounded 300 "$python" bench/gpu_fp8.py \
    --device "$device" "${args[@]}" > "$out/fp8.md" 2> "$out/fp8.log"
  code=$?
  sed -n '/^Device:/,$p' "$out/fp8.md" >> "$report"
  if [ $code != 0 ]; then
    echo "FAILED (exit $code)$(stopped $code): $(grep -m1 -E 'FAILED|Error' "$out/fp8.log" || tail -1 "$out/fp8.log")" | cut -c1-250 >> "$report"
    failed=1
  fi
}

# Weak and strong scaling over the GPUs (NCCL), all-reduce bandwidth (Gloo): medians of 5 runs, CSV and
# PNG beside the report (bench/scaling.py, plot_scaling.py).
run_scaling() {
  local scaling_csv scaling_args ranks r
  scaling_csv="${report%.md}-scaling.csv"
  if [ "$device" = cpu ]; then
    scaling_args=(--repeats 1 --csv "$scaling_csv" -- --ranks 1,2 --steps 5 --iterations 2)
  elif [ "$gpus" -lt 2 ]; then
    scaling_args=()  # one GPU: nothing to scale over
  else
    ranks=1
    for ((r = 2; r <= gpus; r *= 2)); do ranks="$ranks,$r"; done
    scaling_args=(--repeats 5 --csv "$scaling_csv" -- --ranks "$ranks" --comm nccl --device cuda --steps 200
      --batch-size 1024)
  fi
  {
    echo
    echo "## Scaling on $device (bench/scaling.py ${scaling_args[*]})"
    echo
  } >> "$report"
  if [ ${#scaling_args[@]} = 0 ]; then
    echo "Not run: one GPU visible, nothing to scale over." >> "$report"
  elif bounded 480 "$python" bench/scaling.py --build "$build" "${scaling_args[@]}" > "$out/scaling.md" 2> "$out/scaling.log" &&
      bounded 60 "$python" bench/plot_scaling.py "$scaling_csv" -o "${scaling_csv%.csv}.png" >> "$out/scaling.log" 2>&1; then
    cat "$out/scaling.md" >> "$report"
    echo "(every run: $scaling_csv; plot: ${scaling_csv%.csv}.png)" >> "$report"
  else
    echo "FAILED: $(tail -1 "$out/scaling.log" | cut -c1-200)" >> "$report"
    failed=1
  fi
}

# The sections, in the order asked for; past --budget or near --deadline, those left say so instead
# (throughput needs about 260 s on an H200: 249 s on 2026-11-26).
not_run=0
for part in $sections; do
  need=20
  [ "$part" = throughput ] && [ "$device" = cuda ] && need=260
  why=$(too_late "$need")
  if [ -n "$why" ]; then
    printf '\n## %s\n\nnot run: %s\n' "$part" "$why" >> "$report"
    echo "gpu-check.sh: $part not run: $why"
    not_run=$((not_run + 1))
    continue
  fi
  "run_$part"
  section "$part"
done
# The last line: a report without it was cut short.
printf '\ngpu-check.sh ended at %s s: %s; %s of the sections (and benchmark runs) asked for not run.\n' "$((SECONDS - started))" \
  "$([ $failed = 0 ] && echo 'every check that ran passed' || echo 'FAILED')" "$not_run" >> "$report"

cat "$report"
exit $failed
