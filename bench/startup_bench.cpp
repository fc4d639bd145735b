// Start-up cost of the plugin system inside a training process: with LibTorch resident
// (as in ampkit-train), the time the real Registry takes to discover every plugin file (scan:
// ELF reads) and to load all of them (trust and compatibility checks, the child probe, dlopen,
// descriptor checks), with the child probe on (ampkit-train's default) and off
// (RegistryOptions::probe = false, an embedder's choice).
// Each figure is the median of --runs fresh registries; a plugin file stays mapped after its
// first dlopen, so the first run, which pays the disk and relocation costs, is shown apart.
//
//   ampkit-bench-startup [--runs 10] [--plugin-dir DIR]
#include <ATen/ops/zeros.h>
#include <ampkit/error.h>
#include <ampkit/registry.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ampkit/exit_codes.h"

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Timing {
  double scan_ms = 0;
  double load_ms = 0;
  size_t plugins = 0;
};

Timing one_run(const ampkit::RegistryOptions& options) {
  Timing t;
  auto t0 = std::chrono::steady_clock::now();
  ampkit::Registry registry(options);
  const ampkit::ScanResult scan = registry.scan();
  t.scan_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  registry.load_all(scan.plugins);  // as ampkit-train loads its four: one probe child for all
  t.load_ms = ms_since(t0);
  t.plugins = scan.plugins.size();
  return t;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(
      stderr, "ampkit-bench-startup: error: %s (usage: ampkit-bench-startup [--runs N] [--plugin-dir DIR])\n",
      message.c_str());
  std::exit(ampkit::exit_status(ampkit::ExitCode::usage));
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 10;
  ampkit::RegistryOptions options;
  options.use_environment = false;  // the built-in plugins only, as installed beside the program
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--runs" || arg == "--plugin-dir") && i + 1 >= argc) usage_error(arg + " needs a value");
    if (arg == "--runs") {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1 || v > 1000) usage_error("--runs must be an integer in [1, 1000]");
      runs = static_cast<int>(v);
    } else if (arg == "--plugin-dir") {
      options.plugin_dirs.emplace_back(argv[++i]);
      options.use_default_dirs = false;
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  try {
    // LibTorch loaded and initialised before the clock starts, as in ampkit-train.
    const auto t0 = std::chrono::steady_clock::now();
    (void)at::zeros({1});
    const double torch_ms = ms_since(t0);
    std::printf("plugin start-up inside a process with LibTorch resident (first tensor: %.1f ms)\n",
                torch_ms);
    std::printf("median of %d runs, each a fresh Registry; first run of each mode shown apart\n\n", runs);
    std::printf("%-28s %8s %12s %12s %12s %12s\n", "mode", "plugins", "scan ms", "load all ms", "total ms",
                "first run ms");
    for (const bool probe : {true, false}) {
      options.probe = probe;
      const Timing first = one_run(options);
      std::vector<double> scan, load, total;
      size_t plugins = first.plugins;
      for (int r = 0; r < runs; ++r) {
        const Timing t = one_run(options);
        scan.push_back(t.scan_ms);
        load.push_back(t.load_ms);
        total.push_back(t.scan_ms + t.load_ms);
        plugins = t.plugins;
      }
      std::printf("%-28s %8zu %12.2f %12.2f %12.2f %12.2f\n",
                  probe ? "probe on (default)" : "probe off (embedder option)", plugins, median(scan),
                  median(load), median(total), first.scan_ms + first.load_ms);
    }
    std::printf("\ntarget: loading all built-in plugins < 50 ms\n");
  } catch (const ampkit::Error& e) {
    std::fprintf(stderr, "ampkit-bench-startup: error: %s\n", e.what());
    return ampkit::exit_status(ampkit::exit_code_of(e.category()));
  }
  return 0;
}
