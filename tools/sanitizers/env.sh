# Runtime options of the instrumented test run (tools/test.sh --instrumented), sourced by it.
# Every finding goes to a log file under $AMPKIT_SANITIZER_LOGS as well as failing its process, so
# a finding in a child process whose exit status a test tolerates (a probe child, a rank that is
# killed on purpose) still fails the run: tools/test.sh counts the files afterwards.
#
# ASan:
#   detect_leaks=0            LibTorch is not instrumented and keeps process-lifetime allocations
#                             (operator registries, thread pools, the CPU allocator's caches), and
#                             plugin libraries stay loaded until exit by design (docs/architecture.md,
#                             "The registry"); LeakSanitizer reports all of them at exit. So no
#                             leak check runs in CI; the memory benchmark (bench/memory_flat.py,
#                             RSS flat over 10,000 steps, docs/benchmarks.md) is the only leak evidence.
#   handle_segv=0 handle_sigbus=0 handle_sigfpe=0 handle_abort=0 allow_user_segv_handler=1
#                             the tests crash plugins on purpose and check that the host names the
#                             signal and the plugin (its fatal-signal handler); ASan's own handlers
#                             would turn each deliberate crash into a report. A real invalid access
#                             is still caught where it happens: that is ASan's instrumentation, not
#                             its signal handler.
# UBSan: -fno-sanitize-recover=all makes every finding fatal at compile time; these options give
#   it a stack and the suppressions file (one reason per line there).
: "${AMPKIT_SANITIZER_LOGS:?set AMPKIT_SANITIZER_LOGS to the folder for sanitizer reports}"
_sanitizer_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS="detect_leaks=0:handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_abort=0:allow_user_segv_handler=1:log_path=$AMPKIT_SANITIZER_LOGS/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$_sanitizer_dir/suppressions.txt:log_path=$AMPKIT_SANITIZER_LOGS/ubsan"
unset _sanitizer_dir
