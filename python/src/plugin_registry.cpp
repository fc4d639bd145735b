// How the Python package finds and loads plugins: its registry options (the crash probe execs
// ampkit/_probe) and ampkit.plugins' listing and option look-ups.
#include "plugin_registry.h"

#include <dlfcn.h>

#include <filesystem>

#include "ampkit/plugin_options.h"
#include "errors.h"

namespace ampkit::python {

namespace {

// ampkit/_probe beside this library (_C.so): the program the crash probe execs.
std::string probe_program() {
  Dl_info here{};
  if (::dladdr(reinterpret_cast<void*>(&probe_program), &here) == 0 || here.dli_fname == nullptr)
    throw Error(ErrorCategory::internal, "cannot tell where ampkit's _C.so is, to find its plugin probe");
  return (std::filesystem::path(here.dli_fname).parent_path() / "_probe").string();
}

}  // namespace

RegistryOptions registry_options(const std::vector<std::string>& dirs, bool allow_untrusted,
                                 int64_t timeout) {
  RegistryOptions o;
  for (const auto& d : dirs) o.plugin_dirs.emplace_back(d);
  o.allow_untrusted = allow_untrusted;
  o.plugin_dirs_name = "plugin_dirs folder";
  o.allow_untrusted_name = "allow_untrusted_plugins=True";
  o.use_default_dirs = false;  // the Python package names its own plugin folder in `dirs`
  // Each plugin file is loaded in a child first, as ampkit-train's are: a static initializer that
  // crashes, exits or throws (anything) fails there, and this interpreter never loads it. The
  // child execs ampkit/_probe: a fork of a threaded process (torch's thread pools) may run only
  // async-signal-safe code until exec, which dlopen and static initializers are not.
  o.probe_program = probe_program();
  o.probe_timeout_seconds = static_cast<double>(timeout);  // 0: no limit
  return o;
}

std::vector<std::vector<std::string>> list_plugins(std::vector<std::string> plugin_dirs,
                                                   bool allow_untrusted) {
  return guarded([&] {
    Registry registry(registry_options(plugin_dirs, allow_untrusted));
    std::vector<std::vector<std::string>> rows;
    for (const PluginInfo& p : registry.scan().plugins)
      rows.push_back({p.kind, p.name, p.version, p.summary, p.is_static ? std::string() : p.path.string()});
    return rows;
  });
}

std::vector<std::vector<std::string>> plugin_options(std::vector<std::string> plugin_dirs,
                                                     bool allow_untrusted, std::string kind,
                                                     std::string name) {
  return guarded([&] {
    Registry registry(registry_options(plugin_dirs, allow_untrusted));
    const LoadedPlugin& p = registry.load(registry.find(kind, name));
    const ampkit_plugin_descriptor& d = p.descriptor();
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < d.option_count; ++i) {
      const ampkit_option_spec& s = d.options[i];
      rows.push_back(
          {s.name, describe_option_type(s), s.default_value ? s.default_value : "", s.help ? s.help : ""});
    }
    return rows;
  });
}

}  // namespace ampkit::python
