// Finds plugin files, reads what they are from ELF without running them, checks and loads them.
#pragma once

#include <ampkit/descriptor.h>
#include <ampkit/error.h>
#include <ampkit/kinds.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ampkit {

// What a plugin file says about itself, read from its ELF sections "ampkit" (the entry alias)
// and "ampkitmd" (a text record); no plugin code runs to get it.
struct PluginInfo {
  std::filesystem::path path;
  std::string entry;  // alias symbol ampkit_v<ABI>_<kind>_<name> (AMPKIT_PLUGIN_ENTRY_NAME)
  int abi_version = 0;
  std::string kind, name, version, summary, torch_version, compiler;
  int cxx11_abi = -1;
  bool is_static = false;  // linked into the executable, not loaded from a file
  std::string layout;      // the "ampkitly" layout record (ampkit/layout.h); empty for static plugins
  // Where the host loads it from once it has opened the file for loading: /proc/self/fd/N, the
  // very file that was judged (empty: `path`), and that open descriptor N (-1: none).
  std::filesystem::path load_from;
  int pinned_fd = -1;
};

// Reads a file's plugin metadata; throws Error(plugin) naming the file and what is wrong.
PluginInfo inspect_plugin_file(const std::filesystem::path& file);
// Throws Error(plugin) when the plugin was built for another ABI, torch or C++ ABI than this host.
void check_compatible(const PluginInfo& info);
// Throws Error(plugin) when the file or its folder is writable by group/others or owned by a
// user other than us or root (as ld.so and sudo refuse), unless `allow_untrusted`: then it prints
// a warning and returns it ("loading untrusted plugin F: why (allowed by ...)"). Returns "" for a
// trusted file.
// `override_name` is how the caller spells allow_untrusted (RegistryOptions::allow_untrusted_name).
std::string check_trusted(const std::filesystem::path& file, bool allow_untrusted,
                          const std::string& override_name = "allow_untrusted");
// The same for a file already open for loading: judges `opened` (/proc/self/fd/N: the open file
// itself and its real folder), names `file` in messages.
std::string check_trusted(const std::filesystem::path& file, const std::filesystem::path& opened,
                          bool allow_untrusted, const std::string& override_name = "allow_untrusted");
// Why the file would not be trusted, or "" (what check_trusted judges, without acting on it).
std::string untrusted_reason(const std::filesystem::path& file);

// A plugin whose library is loaded; the library stays loaded for the life of the process.
class LoadedPlugin {
 public:
  LoadedPlugin(PluginInfo info, const ampkit_plugin_descriptor* descriptor)
      : info_(std::move(info)), descriptor_(descriptor) {}
  const PluginInfo& info() const { return info_; }
  const ampkit_plugin_descriptor& descriptor() const { return *descriptor_; }
  // Creates the strategy; throws Error(plugin) with the factory's message on failure.
  std::unique_ptr<Strategy> create(const OptionValues& values) const;

 private:
  PluginInfo info_;
  const ampkit_plugin_descriptor* descriptor_;
};

struct RegistryOptions {
  std::vector<std::filesystem::path> plugin_dirs;  // searched first
  bool use_environment = true;                     // AMPKIT_PLUGIN_PATH
  bool use_default_dirs = true;                    // <program>/../lib/ampkit/plugins, install prefix
  bool allow_untrusted = false;                    // load plugins that fail the trust check, with a warning
  // How the host spells these two settings in messages (ampkit-train: its own option names); the
  // library's words otherwise.
  std::string plugin_dirs_name = "plugin folder";
  std::string allow_untrusted_name = "allow_untrusted";
  bool probe = true;                    // load each plugin in a child process first, so a crash is reported
  double probe_timeout_seconds = 30.0;  // a probe child that has not finished by then is killed (0: never)
  // A program the probe child runs (fork, then exec) to load the plugins, instead of loading them
  // in the forked copy of the host: a threaded host (Python, with torch's thread pools) may run
  // only async-signal-safe code between fork and exec. "" : the forked copy loads them.
  std::string probe_program;
};

struct ScanResult {
  std::vector<PluginInfo> plugins;
  std::vector<std::pair<std::filesystem::path, std::string>> problems;  // files that are no plugin
};

class Registry {
 public:
  explicit Registry(RegistryOptions options = {});
  const std::vector<std::filesystem::path>& search_path() const { return search_path_; }
  const RegistryOptions& options() const { return options_; }
  // The warnings loading has printed so far (untrusted plugins loaded with allow_untrusted), for
  // a run's summary.
  const std::vector<std::string>& warnings() const { return warnings_; }

  // Every *.so in the search path, read from ELF; statically linked plugins come first.
  ScanResult scan() const;
  // The plugin of `kind` called `name_or_path`; a value with '/' or ending in ".so" is a file.
  // Unknown name: Error listing the available ones. Same kind+name in two files: Error listing
  // both. A statically linked plugin wins over files of its kind and name.
  PluginInfo find(const std::string& kind, const std::string& name_or_path) const;
  // Checks trust and compatibility, probes in a child (if enabled), loads, checks the descriptor.
  const LoadedPlugin& load(const PluginInfo& info);
  // The same for several plugins, probed together in one child (one fork instead of one per
  // plugin); the result is in the order of `infos`. Loading stops at the first error.
  std::vector<const LoadedPlugin*> load_all(const std::vector<PluginInfo>& infos);

 private:
  RegistryOptions options_;
  std::vector<std::filesystem::path> search_path_;
  // Opens the file once; from then on it is judged, probed and loaded through that descriptor.
  // A file refused is closed again.
  PluginInfo pin(const PluginInfo& info);
  // Loads the pinned, probed files of load_all; closes those that were not loaded on failure.
  std::vector<const LoadedPlugin*> load_pinned(const std::vector<PluginInfo>& infos,
                                               const std::vector<PluginInfo>& pinned);
  void release_unloaded(const std::vector<PluginInfo>& pinned);
  std::map<std::string, std::unique_ptr<LoadedPlugin>> loaded_;  // by path or static key
  std::vector<int>
      pinned_fds_;  // of loaded plugins, kept open: the libraries stay loaded for the process's life
  std::vector<std::string> warnings_;
};

// Result of loading a plugin in a child process (ampkit-plugins check, and Registry::load).
struct ProbeResult {
  bool ok = false;
  bool crashed = false;
  std::string message;  // error or crash description
};
// Runs load + entry + descriptor checks, and with `create` also the factory with default
// options, start() and save(), in a forked child; a crash or hang there is reported, not shared.
ProbeResult probe_plugin(const PluginInfo& info, bool create, double timeout_seconds = 30.0);
// The same for several plugins in one child, in order; the message names the first that failed.
// `program`: the probe child execs it (RegistryOptions::probe_program) as
// `program FD CREATE PATH LOAD_FROM...`, and it calls run_probe.
ProbeResult probe_plugins(const std::vector<const PluginInfo*>& infos, bool create,
                          double timeout_seconds = 30.0, const std::string& program = "");
// The probe child's work: loads (and with `create` creates) each plugin in turn, reporting to
// the parent on `out_fd`, then ends the process. For a probe program (probe_plugins' `program`).
[[noreturn]] void run_probe(const std::vector<const PluginInfo*>& infos, bool create, int out_fd);

// Statically linked plugins (the static build of ampkit-train) register here at start-up.
void register_static_plugin(const ampkit_plugin_descriptor* descriptor);

}  // namespace ampkit
