#!/usr/bin/env bash
# tools/gpu-check.sh without a GPU: every CUDA check skips cleanly, and the whole script
# runs end to end on the CPU (--dry-run-on-cpu), so a GPU machine's rare time is not lost to a
# broken script.   test_gpu_check.sh BUILD_DIR   (run from the source root; its time: docs/development.md)
set -uo pipefail
build=$1
fail() { echo "FAIL: $*"; exit 1; }

# 1. No GPU: one line and exit 0, from the script, each benchmark and the device test.
out=$(CUDA_VISIBLE_DEVICES= bash tools/gpu-check.sh --build "$build") || fail "gpu-check.sh exited $? without a GPU"
[ "$out" = "no GPU: nothing to check" ] || fail "gpu-check.sh printed '$out'"
bash tools/gpu-check.sh --bogus 2>/dev/null
[ $? = 2 ] || fail "a bad argument did not exit 2"
out=$(CUDA_VISIBLE_DEVICES= "$build/bin/ampkit-bench-post-backward-device") || fail "the device benchmark exited $?"
[ "$(echo "$out" | wc -l)" = 1 ] && [[ $out == "no GPU: nothing to measure"* ]] || fail "the device benchmark printed '$out'"
out=$(CUDA_VISIBLE_DEVICES= python3 bench/throughput_comparison.py --build "$build" --device cuda) ||
  fail "the CUDA throughput comparison exited $?"
[ "$out" = "no GPU: nothing to measure (torch sees no CUDA device)" ] || fail "the CUDA throughput comparison printed '$out'"
out=$(CUDA_VISIBLE_DEVICES= python3 bench/gpu_models.py --device cuda) || fail "the real-model benchmark exited $?"
[ "$out" = "no GPU: nothing to measure (torch sees no CUDA device)" ] || fail "the real-model benchmark printed '$out'"
out=$(CUDA_VISIBLE_DEVICES= python3 bench/gpu_fp8.py --device cuda) || fail "the fp8 benchmark exited $?"
[ "$out" = "no GPU: nothing to measure (torch sees no CUDA device)" ] || fail "the fp8 benchmark printed '$out'"
CUDA_VISIBLE_DEVICES= AMPKIT_TEST_DEVICE=cuda AMPKIT_PLUGIN_PATH= "$build/tests/test_on_device" > /dev/null
[ $? = 77 ] || fail "test_on_device on cuda without a GPU did not exit 77 (skipped)"

# A program that takes TERM as "stop after this step" and never ends (a hung ampkit-train, under a
# shell that dies at once), run by gpu-check with --deadline 45: checked in part 3. It sleeps, so it
# runs beside the dry run (its own build folder, report and processes, each sleeper's pid noted).
fake=$(mktemp -d)
trap 'wait; rm -rf "$fake"' EXIT
mkdir -p "$fake/bin" && cp "$build/CMakeCache.txt" "$fake/" && sed -i '/^CMAKE_HOME_DIRECTORY/d' "$fake/CMakeCache.txt"
cat > "$fake/bin/ampkit-train" << SH
#!/usr/bin/env bash
bash -c 'trap "" TERM; echo \$\$ >> "$fake/sleepers"; exec sleep 300' &
wait
SH
chmod +x "$fake/bin/ampkit-train"
(
  t0=$SECONDS
  bash tools/gpu-check.sh --build "$fake" --dry-run-on-cpu --report "$fake/report.md" --sections host-sync,training \
    --deadline 45 > /dev/null 2>&1
  took=$((SECONDS - t0)) left=0
  for pid in $(cat "$fake/sleepers" 2> /dev/null); do  # alive: a zombie's command line is empty
    [ "$(tr '\0' ' ' 2> /dev/null < "/proc/$pid/cmdline")" = "sleep 300 " ] && left=$((left + 1)) && kill -KILL "$pid"
  done
  echo "$took $left" > "$fake/outcome"
) &
deadline_run=$!

# 2. The dry run: every section, every check passed, exit 0. Its sections are named with --sections,
# post-backward first (part 3 checks the order on this run rather than on one more).
report="$build/gpu-check-dry-run.md"
rm -f "$report"
bash tools/gpu-check.sh --build "$build" --dry-run-on-cpu --report "$report" \
  --sections post-backward,nccl,training,host-sync,parity,first-use,throughput,models,scaling,fp8 > "$build/gpu-check-dry-run.log" 2>&1 \
  || { cat "$build/gpu-check-dry-run.log"; fail "the dry run exited $?"; }
for section in "## NCCL" "## Training on cpu" "## Deferred and synchronous steps" "## Parity and host reads on cpu tensors" "## Throughput:" \
               "## Post-backward pipeline" "## Real models:" "## First use of the kernels on cpu" "## fp8 training on cpu"; do
  grep -q "^$section" "$report" || fail "the report has no '$section' section"
done
! grep -q "FAILED" "$report" || fail "the dry run's report has a failure: $(grep -m1 FAILED "$report")"
n=$(grep -c "| passed |" "$report")
[ "$n" = 7 ] || fail "$n of the 7 parity, host-read, step-values, kernel and kernel-verdict checks passed"
# The first-use section's GPU checks, listed as planned: a new thread, a side stream, a capture
# replayed, the sync debug mode (after the warm-up; from before the first use), memcheck and racecheck.
n=$(grep -c "^| .* | planned, not run: needs a GPU (tools/gpu_first_use.py [a-z-]*) |$" "$report")
[ "$n" = 7 ] || fail "$n of the 7 first-use GPU checks were listed as planned"
n=$(grep -c "^| synthetic | \(fp32\|bf16\|fp16\) | completed |" "$report")
[ "$n" = 3 ] || fail "$n of the 3 training runs completed"
grep -q "^| mlp-1m | fp16 |" "$report" || fail "no throughput row"
grep -q "^| deferred = step | identical metrics and summary | [0-9]*, 0 |" "$report" ||
  fail "the deferred step's row: $(grep -m1 '^| deferred = step' "$report")"
grep -q "^copy: flat tensor copy_" "$report" || fail "no copy bandwidth row"
n=$(grep -c "^| \(GPT-2\|ViT\) | \(fp16\|bf16\) | fused_scan | [0-9]* | [0-9]* | .* | ok |$" "$report")
if grep -q '^AMPKIT_INSTRUMENT:BOOL=ON' "$build/CMakeCache.txt"; then
  # The instrumented suite: python cannot load that build's extension; the Release suite checks it.
  [ "$n" = 0 ] && grep -q "^not run: .*instrumented build" "$report" || fail "the instrumented build's real-model section did not say it was not run"
  grep -q "^| whole step in a CUDA graph .* | not run: instrumented build |" "$report" ||
    fail "the instrumented build's CUDA graph row did not say it was not run"
  models="the Python sections saying they were not run (instrumented build)"
else
  models="4 real-model checks, the CUDA graph tests' CPU stand-ins"
  [ "$n" = 4 ] || fail "$n of the 4 real-model skip-decision checks agreed with torch"
  grep -q "^| whole step in a CUDA graph (tests/python/test_cuda_graph.py) | passed: [0-9]* passed, 4 skipped[^|]* |" "$report" ||
    fail "the CUDA graph row: $(grep -m1 '^| whole step in a CUDA graph' "$report")"
fi
# The fp8 section: the bf16 row and both fp8 recipes' rows, each with its fp8 layers (8 in the tiny GPT-2:
# 4 per block, lm_head left in bf16), tokens/s and a finite loss.
n=$(grep -c "^| \(bf16 autocast | bf16 | 0\|ampkit.fp8 \(current\|delayed\) | fp8 torch._scaled_mm | 8\) | [0-9]* | [0-9.]* | ok |$" "$report")
grep -q '^AMPKIT_INSTRUMENT:BOOL=ON' "$build/CMakeCache.txt" && n=3  # that build's Python sections run nothing
[ "$n" = 3 ] || fail "$n of the 3 fp8 section rows (bf16, current, delayed): $(grep -A8 '^## fp8' "$report" | tail -4)"
# 3. --sections runs the sections named, in that order; --budget and --deadline report those they
# did not start; the report's last line says the script ended.
grep -q "^gpu-check.sh ended at [0-9]* s: every check that ran passed; 0 of the sections (and benchmark runs) asked for not run.$" "$build/gpu-check-dry-run.md" ||
  fail "the dry run's report has no closing line: $(tail -1 "$build/gpu-check-dry-run.md")"
order=$(grep '^## ' "$build/gpu-check-dry-run.md" | head -2 | cut -c1-16 | tr '\n' '/')
[ "$order" = "## Post-backward/## NCCL/" ] || fail "--sections post-backward,nccl,... ran the sections '$order'"
for bad in "--sections parity,bogus:unknown section 'bogus'" "--sections nccl,nccl:names 'nccl' twice" \
           "--budget soon:--budget takes whole seconds" "--deadline -1:--deadline takes whole seconds" \
           "--sections:--sections needs a value" "--steps 0:--steps takes a whole number above 0"; do
  # shellcheck disable=SC2086  # each case is a list of arguments
  out=$(bash tools/gpu-check.sh --build "$build" --dry-run-on-cpu ${bad%%:*} 2>&1 > /dev/null)
  [ $? = 2 ] && [[ $out == *"${bad#*:}"* ]] || fail "gpu-check.sh ${bad%%:*} said '$out'"
done
report="$build/gpu-check-sections.md"
bash tools/gpu-check.sh --build "$build" --dry-run-on-cpu --report "$report" --sections models,training --budget 0 > /dev/null 2>&1 ||
  fail "the dry run with a spent budget exited $?"
n=$(grep -c "^not run: the --budget of 0 s was spent" "$report")
[ "$n" = 2 ] && ! grep -q "^| synthetic" "$report" || fail "with --budget 0, $n of 2 sections said they were not run"
grep -q "2 of the sections (and benchmark runs) asked for not run.$" "$report" || fail "with --budget 0: $(tail -1 "$report")"
# Without --sections: every section, in the documented order.
bash tools/gpu-check.sh --build "$build" --dry-run-on-cpu --report "$report" --deadline 19 > /dev/null 2>&1 ||
  fail "the dry run with a near deadline exited $?"
n=$(grep -c "^not run: under 20 s were left before the --deadline of 19 s" "$report")
order=$(grep '^## ' "$report" | tr '\n' ' ')
[ "$n" = 10 ] && ! grep -q "^copy: flat" "$report" || fail "with --deadline 19, $n of the 10 sections said they were not run"
[ "$order" = "## nccl ## training ## host-sync ## parity ## first-use ## post-backward ## throughput ## models ## scaling ## fp8 " ] ||
  fail "without --sections, the sections in the order '$order'"
# The program that ignores TERM (started before part 2): killed 15 s after the deadline, with what it
# started, and nothing else starts after the deadline. What is expected follows from what the report
# says started: host-sync starts when its 20 s are left after gpu-check's start-up (which imports no
# torch), and a machine loaded enough to take 25 s for that sees both sections not run. Its time:
# the deadline, the 15 s before the KILL and 30 s for the rest on a loaded machine; a program that
# outlived the deadline would hold gpu-check for its 300 s.
wait "$deadline_run"
read -r took left < "$fake/outcome"
report="$fake/report.md"
[ "$took" -le $((45 + 15 + 30)) ] || fail "with --deadline 45 and a program that ignores TERM, gpu-check took $took s"
[ "$left" = 0 ] || fail "a program that ignored TERM outlived gpu-check's deadline ($left left)"
grep -q "^## training" "$report" && ! grep -q "^## Training on" "$report" ||
  fail "the training section that could not start is not in the report as not run"
if grep -q "^## Deferred and synchronous steps" "$report"; then
  grep -q "^| deferred = step | FAILED" "$report" && [ -s "$fake/sleepers" ] ||
    fail "the host-sync section cut at the deadline is not in the report as failed, or its program never ran"
  deadline="a program ignoring TERM killed at the --deadline"
else
  grep -q "^not run: under 20 s were left before the --deadline of 45 s" "$report" && [ ! -e "$fake/sleepers" ] ||
    fail "host-sync neither started nor said why not: $(grep -m1 -A2 '^## host-sync' "$report" | tail -1)"
  deadline="--deadline 45 near before the first section, at $(grep -m1 -o '([0-9]* s)' "$report" | tr -d '()'): the kill not exercised"
fi

# 4. tools/gpu-pack.sh: the folder a lent machine is given holds what gpu-check runs and fits the
# device tool's 64 MiB; two sections run from the packed build (here the build it was packed from
# is still in place: the layout without it was rehearsed by hand, docs/benchmarks.md).
rel=$(realpath --relative-to=. "$build")
if [[ $rel == ../* ]] || [[ $rel == /* ]]; then
  pack="not checked (the build is outside the checkout, where the device tool carries nothing from)"
elif grep -q '^AMPKIT_INSTRUMENT:BOOL=ON' "$build/CMakeCache.txt"; then
  out=$(bash tools/gpu-pack.sh --build "$rel" --dest "build-gpu-pack-test" 2>&1)
  [ $? = 2 ] && [[ $out == *"instrumented build"* ]] || fail "gpu-pack.sh took an instrumented build: $out"
  pack="refuses the instrumented build"
elif [ ! -f "$build/core/grad_stats_kernel.fatbin" ]; then
  out=$(bash tools/gpu-pack.sh --build "$rel" --dest "build-gpu-pack-test" 2>&1)
  [ $? = 2 ] && [[ $out == *"holds no CUDA kernels"* ]] || fail "gpu-pack.sh took a build without the CUDA kernels: $out"
  pack="refuses a build without the CUDA kernels (no nvcc here)"
else
  dest="build-gpu-pack-test"  # ignored (/build-*/), outside the build
  rm -rf "$dest" "$rel/gpu-pack"  # the latter: this test's folder until 2026-11-29
  bash tools/gpu-pack.sh --build "$rel" --dest "$dest" --limit-mib 1 > /dev/null 2>&1
  [ $? = 1 ] || fail "gpu-pack.sh did not exit 1 over a 1 MiB limit"
  for bad in "tests/gpu/not-ignored-$$:is not ignored by git" "$rel/gpu-pack:is inside the build folder" \
             "../elsewhere:inside the checkout"; do
    out=$(bash tools/gpu-pack.sh --build "$rel" --dest "${bad%%:*}" 2>&1)
    [ $? = 2 ] && [[ $out == *"${bad#*:}"* ]] && [ ! -e "${bad%%:*}" ] || fail "gpu-pack.sh --dest ${bad%%:*} said '$out'"
  done
  rm -rf "$dest" && mkdir -p "$dest" && touch "$dest/not-ours"
  out=$(bash tools/gpu-pack.sh --build "$rel" --dest "$dest" 2>&1)
  [ $? = 2 ] && [ -f "$dest/not-ours" ] || fail "gpu-pack.sh emptied a folder it had not filled: $out"
  rm -rf "$dest"
  bash tools/gpu-pack.sh --build "$rel" --dest "$dest" > /dev/null 2>&1 || fail "gpu-pack.sh exited $?"
  out=$(bash tools/gpu-pack.sh --build "$rel" --dest "$dest" 2>&1) || fail "gpu-pack.sh did not fill its own folder again: $out"
  [[ $out == *"ln -s $dest/build $rel && "*"--report \$OUT/gpu-report.md --sections parity,first-use,models,"*"--deadline 530"* ]] ||
    fail "gpu-pack.sh printed no call: $out"
  for f in bin/ampkit-train bin/ampkit-launch bin/ampkit-bench-post-backward-device bin/ampkit-bench-dist \
           tests/test_on_device tests/test_kernel_check lib/ampkit/plugins/libampkit-scaler-dynamic.so python/ampkit/_C.so \
           python/ampkit/grad_scaler.py CMakeCache.txt ampkit-commit.txt; do
    [ -s "$dest/build/$f" ] || fail "the pack has no build/$f"
  done
  [ -n "$(ls "$dest/data/fashion-mnist")" ] && [ -n "$(ls "$dest/data/fortunes")" ] || fail "the pack has no datasets"
  [ -z "$(find "$dest" -type l)" ] || fail "the pack holds links, which travel as links: $(find "$dest" -type l | head -1)"
  bytes=$(du -sb "$dest" | cut -f1)
  [ "$bytes" -lt $((60 * 1048576)) ] || fail "the pack is $bytes bytes"
  report="$build/gpu-check-pack.md"
  bash tools/gpu-check.sh --build "$dest/build" --data "$dest/data" --dry-run-on-cpu --report "$report" \
    --sections host-sync,post-backward > /dev/null 2>&1 || fail "the dry run from the packed build exited $?"
  grep -q "^| deferred = step | identical metrics and summary | [0-9]*, 0 |" "$report" ||
    fail "the packed build's deferred step: $(grep -m1 '^| deferred = step' "$report")"
  grep -q "; build packed at commit $(cat "$dest/build/ampkit-commit.txt"); scripts at commit [0-9a-f]*\.$" "$report" ||
    fail "the report names no packed commit: $(grep -m1 commit "$report")"
  rm -rf "$dest"
  pack="packs $((bytes / 1048576)) MiB that run"
fi
echo "gpu-check.sh: skips cleanly without a GPU; the dry run passed its 7 checks (7 first-use GPU checks planned), 3 runs, 2 throughput rows, $models, 3 fp8 rows;" \
  "--sections, --budget and --deadline hold ($deadline); gpu-pack.sh $pack"
