// ampkit/_probe: the registry's probe child for the Python package. A Python process has threads
// (torch's pools), so its fork may run only async-signal-safe code before exec, and loading a
// plugin is not: the forked child execs this program, which loads the plugins as ampkit-train's
// forked child does (run_probe) and reports to the parent on the inherited pipe.
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "ampkit/registry.h"

// _probe FD CREATE (PATH LOAD_FROM)...: PATH names the plugin in messages, LOAD_FROM is the
// file the parent opened and judged (/proc/self/fd/N, inherited).
int main(int argc, char** argv) {
  if (argc < 5 || (argc - 3) % 2 != 0) return 2;
  const int out_fd = std::atoi(argv[1]);
  std::vector<ampkit::PluginInfo> infos;
  try {
    for (int i = 3; i + 1 < argc; i += 2) {
      ampkit::PluginInfo info = ampkit::inspect_plugin_file(argv[i + 1]);
      info.path = argv[i];
      info.load_from = argv[i + 1];
      infos.push_back(std::move(info));
    }
  } catch (const std::exception& e) {
    const std::string message = std::string("!") + e.what();
    (void)!::write(out_fd, message.data(), message.size());
    return 3;
  }
  std::vector<const ampkit::PluginInfo*> pointers;
  for (const auto& info : infos) pointers.push_back(&info);
  ampkit::run_probe(pointers, std::string(argv[2]) == "1", out_fd);
}
