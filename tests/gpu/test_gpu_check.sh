#!/usr/bin/env bash
# tools/gpu-check.sh without a GPU (issue 20): every CUDA check skips cleanly, and the whole script
# runs end to end on the CPU (--dry-run-on-cpu), so a GPU machine's rare time is not lost to a
# broken script.   test_gpu_check.sh BUILD_DIR   (run from the source root)
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
out=$(CUDA_VISIBLE_DEVICES= python3 tools/bench/throughput_comparison.py --build "$build" --device cuda) ||
  fail "the CUDA throughput comparison exited $?"
[ "$out" = "no GPU: nothing to measure (torch sees no CUDA device)" ] || fail "the CUDA throughput comparison printed '$out'"
out=$(CUDA_VISIBLE_DEVICES= python3 tools/bench/gpu_models.py --device cuda) || fail "the real-model benchmark exited $?"
[ "$out" = "no GPU: nothing to measure (torch sees no CUDA device)" ] || fail "the real-model benchmark printed '$out'"
CUDA_VISIBLE_DEVICES= AMPKIT_TEST_DEVICE=cuda AMPKIT_PLUGIN_PATH= "$build/tests/test_on_device" > /dev/null
[ $? = 77 ] || fail "test_on_device on cuda without a GPU did not exit 77 (skipped)"

# 2. The dry run: every section, every check passed, exit 0.
report="$build/gpu-check-dry-run.md"
rm -f "$report"
bash tools/gpu-check.sh --build "$build" --dry-run-on-cpu --report "$report" > "$build/gpu-check-dry-run.log" 2>&1 \
  || { cat "$build/gpu-check-dry-run.log"; fail "the dry run exited $?"; }
for section in "## NCCL" "## Training on cpu" "## Deferred and synchronous steps" "## Parity and host reads on cpu tensors" "## Throughput:" \
               "## Post-backward pipeline" "## Real models:"; do
  grep -q "^$section" "$report" || fail "the report has no '$section' section"
done
! grep -q "FAILED" "$report" || fail "the dry run's report has a failure: $(grep -m1 FAILED "$report")"
n=$(grep -c "| passed |" "$report")
[ "$n" = 6 ] || fail "$n of the 6 parity, host-read, step-values and kernel checks passed"
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
echo "gpu-check.sh: skips cleanly without a GPU; the dry run passed its 6 checks, 3 runs, 2 throughput rows, $models"
