// The Python package's registry (its crash probe execs ampkit/_probe), ampkit.plugins() and the
// per-precision defaults and clipper thresholds the seeds' API reads (python/ampkit/seeds*.py).
#include "plugin_listing.h"

#include <dlfcn.h>

#include <filesystem>

#include "ampkit/error.h"
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

std::vector<std::tuple<std::string, std::string>> option_defaults(std::vector<std::string> plugin_dirs,
                                                                  bool allow_untrusted, std::string kind,
                                                                  std::string name, std::string option) {
  return guarded([&] {
    Registry registry(registry_options(plugin_dirs, allow_untrusted));
    const LoadedPlugin& p = registry.load(registry.find(kind, name));
    OptionInputs inputs;
    inputs.read_environment = false;  // the declared defaults, whatever the environment says
    std::vector<std::tuple<std::string, std::string>> out;
    for (const OptionSetting& s : resolve_options(p.descriptor(), inputs).settings) {
      if (s.name != option) continue;
      for (const auto& [precision, value] : s.precision_defaults) out.emplace_back(precision, value);
      if (s.precision_defaults.empty() && !s.default_value.empty())
        for (const Precision precision : kPrecisions) out.emplace_back(to_string(precision), s.default_value);
      return out;
    }
    throw Error(ErrorCategory::usage, kind + " '" + name + "' has no option '" + option + "'");
  });
}

std::string threshold_option(std::vector<std::string> plugin_dirs, bool allow_untrusted, std::string name) {
  return guarded([&] {
    Registry registry(registry_options(plugin_dirs, allow_untrusted));
    const LoadedPlugin& p = registry.load(registry.find("clipper", name));
    const ampkit_plugin_descriptor& d = p.descriptor();
    std::vector<std::string> per_precision;
    for (size_t i = 0; i < d.option_count; ++i)
      if (d.options[i].flags & AMPKIT_OPTION_PER_PRECISION) per_precision.emplace_back(d.options[i].name);
    if (per_precision.size() == 1) return per_precision.front();
    std::string names;
    for (const std::string& n : per_precision) names += (names.empty() ? "" : ", ") + n;
    throw Error(ErrorCategory::usage,
                "clipper '" + name + "' has no single threshold (" +
                    (names.empty() ? std::string("no option with a per-precision default")
                                   : "options with per-precision defaults: " + names) +
                    "); set its options by name with opt=");
  });
}

}  // namespace ampkit::python
