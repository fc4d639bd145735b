// The plugin search path, selection by name or path, loading (never unloading); probing a
// plugin in a child process is plugin_probe.cpp.
#include "ampkit/registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "ampkit/plugin_call.h"
#include "ampkit/plugin_options.h"
#include "registry_internal.h"

namespace fs = std::filesystem;

namespace ampkit {

namespace {

std::vector<const ampkit_plugin_descriptor*>& static_plugins() {
  static auto* list = new std::vector<const ampkit_plugin_descriptor*>();  // never destroyed
  return *list;
}

// Libraries are never unloaded while the process lives: no unload-order crashes, no dangling
// vtables of strategies still alive during static destruction. The list is leaked on purpose.
std::vector<boost::dll::shared_library>& loaded_libraries() {
  static auto* libs = new std::vector<boost::dll::shared_library>();
  return *libs;
}

// The files (device, inode) this process has loaded: their static initializers ran here already,
// so probing them again would tell nothing (a Python interpreter makes many GradScalers).
std::set<std::pair<dev_t, ino_t>>& loaded_files() {
  static auto* files = new std::set<std::pair<dev_t, ino_t>>();
  return *files;
}

std::pair<dev_t, ino_t> file_identity(const PluginInfo& info) {
  struct stat st {};
  const int r = info.pinned_fd >= 0 ? ::fstat(info.pinned_fd, &st) : ::stat(info.path.c_str(), &st);
  return r == 0 ? std::make_pair(st.st_dev, st.st_ino) : std::make_pair(dev_t{0}, ino_t{0});
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 3 && s.compare(s.size() - 3, 3, ".so") == 0);
}

bool is_candidate(const fs::path& p) {
  const std::string name = p.filename().string();
  return (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0) ||
         name.find(".so.") != std::string::npos;
}

// Everything the host must know about a descriptor before calling into it.
void validate_descriptor(const PluginInfo& info, const ampkit_plugin_descriptor* d) {
  const std::string file = info.is_static ? "static plugin " + info.kind + " '" + info.name + "'"
                                          : "plugin file " + info.path.string();
  if (d == nullptr) throw Error(ErrorCategory::plugin, file + ": its entry returned no descriptor");
  if (d->abi_version != static_cast<uint32_t>(AMPKIT_ABI_VERSION))
    throw Error(ErrorCategory::plugin, file + ": descriptor has ABI " + std::to_string(d->abi_version) +
                                           ", host has ABI " + std::to_string(AMPKIT_ABI_VERSION));
  if (d->struct_size < sizeof(ampkit_plugin_descriptor))
    throw Error(ErrorCategory::plugin, file + ": descriptor is smaller than ABI " +
                                           std::to_string(AMPKIT_ABI_VERSION) + " requires");
  if (!d->kind || !d->name || info.kind != d->kind || info.name != d->name)
    throw Error(ErrorCategory::plugin, file + ": descriptor (" + std::string(d->kind ? d->kind : "?") + " '" +
                                           (d->name ? d->name : "?") + "') disagrees with its metadata (" +
                                           info.kind + " '" + info.name + "')");
  if (d->create == nullptr) throw Error(ErrorCategory::plugin, file + ": descriptor has no factory");
  if (d->option_count > 0 && d->options == nullptr)
    throw Error(ErrorCategory::plugin, file + ": descriptor declares options but gives none");
  for (uint32_t i = 0; i < d->option_count; ++i)
    if (d->options[i].name == nullptr || d->options[i].help == nullptr || d->options[i].name[0] == '\0' ||
        d->options[i].help[0] == '\0')
      throw Error(ErrorCategory::plugin,
                  file + ": option " + std::to_string(i) + " has no name or an empty help text");
}

PluginInfo static_info(const ampkit_plugin_descriptor* d) {
  PluginInfo info;
  info.is_static = true;
  info.path = "<static>";
  info.abi_version = static_cast<int>(d->abi_version);
  info.kind = d->kind;
  info.name = d->name;
  info.version = d->version;
  info.summary = d->summary;
  info.torch_version = d->torch_version;
  info.compiler = d->compiler;
  info.cxx11_abi = d->cxx11_abi;
  info.entry = "ampkit_v" + std::to_string(info.abi_version) + "_" + info.kind + "_" + info.name;
  return info;
}

std::string describe(const PluginInfo& p) {
  return p.is_static ? "(linked into this program)" : p.path.string();
}

void copy_into_error_buffer(char* out, size_t size, const std::string& text) {
  std::snprintf(out, size, "%s", text.c_str());
}

}  // namespace

namespace detail {

// Loads the library (kept for the life of the process) and checks its descriptor.
const ampkit_plugin_descriptor* load_descriptor(const PluginInfo& info, bool report_faults) {
  // Its static initializers and its entry run here, in this process: one that crashes or exits
  // only here (not in the probe's child) is reported naming the plugin (plugin_call.h).
  const int plugin =
      report_faults
          ? plugin_id(info.kind + " '" + info.name + "' " + info.version + " (" + info.path.string() + ")")
          : -1;
  PluginCall call(plugin, "its static initializers (while being loaded)");
  boost::dll::shared_library lib;
  try {
    lib.load(info.load_from.empty() ? info.path : info.load_from,
             boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::plugin,
                "plugin file " + info.path.string() + " cannot be loaded: " + e.what());
  }
  if (report_faults) guard_loaded_plugin(lib.native());
  if (!lib.has(info.entry))
    throw Error(ErrorCategory::plugin,
                "plugin file " + info.path.string() + " does not export " + info.entry);
  auto& entry = lib.get_alias<const ampkit_plugin_descriptor*()>(info.entry);
  const ampkit_plugin_descriptor* d = entry();
  validate_descriptor(info, d);
  loaded_libraries().push_back(std::move(lib));
  loaded_files().insert(file_identity(info));
  return d;
}

}  // namespace detail

void register_static_plugin(const ampkit_plugin_descriptor* descriptor) {
  static_plugins().push_back(descriptor);
}

std::unique_ptr<Strategy> LoadedPlugin::create(const OptionValues& values) const {
  char error[1024] = {};
  void* object = nullptr;
  // The factory must not throw (AMPKIT_PLUGIN's never does), but one written by hand might: it is
  // still the plugin's failure, not the host's.
  try {
    object = descriptor_->create(&values, error, sizeof error);
  } catch (const std::exception& e) {
    copy_into_error_buffer(error, sizeof error, std::string("its factory threw: ") + e.what());
  } catch (...) {
    copy_into_error_buffer(error, sizeof error, "its factory threw a non-standard exception");
  }
  if (object == nullptr)
    throw Error(ErrorCategory::plugin,
                info_.kind + " '" + info_.name + "' (" + describe(info_) +
                    ") could not be created: " + (error[0] ? error : "no reason given"));
  return std::unique_ptr<Strategy>(static_cast<Strategy*>(object));
}

namespace {
// A folder the user named, or one usage error saying why not (a name too long, a symlink loop).
void require_folder(const fs::path& d, const std::string& who) {
  std::error_code ec;
  const bool folder = fs::is_directory(d, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw Error(ErrorCategory::usage, who + " " + d.string() + " cannot be used: " + ec.message());
  if (!folder) throw Error(ErrorCategory::usage, who + " " + d.string() + " is not a folder");
}
}  // namespace

Registry::Registry(RegistryOptions options) : options_(std::move(options)) {
  std::vector<fs::path> dirs;
  for (const auto& d : options_.plugin_dirs) {
    require_folder(d, options_.plugin_dirs_name);
    dirs.push_back(d);
  }
  if (options_.use_environment) {
    if (const char* env = std::getenv("AMPKIT_PLUGIN_PATH")) {
      std::string list = env;
      size_t start = 0;
      while (start <= list.size()) {
        const size_t end = std::min(list.find(':', start), list.size());
        const std::string item = list.substr(start, end - start);
        if (!item.empty()) {
          require_folder(item, "AMPKIT_PLUGIN_PATH's folder");
          dirs.emplace_back(item);
        }
        start = end + 1;
      }
    }
  }
  if (options_.use_default_dirs) {
    // Next to the program: build/bin/ and build/tests/ find build/lib/ampkit/plugins, an installed
    // program <prefix>/lib/ampkit/plugins. No build-tree folder is compiled in: an installed
    // program would otherwise see every built-in plugin twice while the build tree exists.
    std::error_code ec;
    const fs::path exe = boost::dll::program_location(ec);
    if (!ec) dirs.push_back(exe.parent_path().parent_path() / "lib" / "ampkit" / "plugins");
#ifdef AMPKIT_INSTALL_PLUGIN_DIR
    dirs.emplace_back(AMPKIT_INSTALL_PLUGIN_DIR);
#endif
  }
  std::set<fs::path> seen;
  for (const auto& d : dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    const fs::path canonical = fs::weakly_canonical(d, ec);
    if (seen.insert(canonical).second) search_path_.push_back(canonical);
  }
}

ScanResult Registry::scan() const {
  ScanResult result;
  for (const auto* d : static_plugins()) result.plugins.push_back(static_info(d));
  for (const auto& dir : search_path_) {
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (is_candidate(entry.path())) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      try {
        result.plugins.push_back(inspect_plugin_file(f));
      } catch (const Error& e) {
        result.problems.emplace_back(f, e.what());
      }
    }
  }
  return result;
}

PluginInfo Registry::find(const std::string& kind, const std::string& name_or_path) const {
  if (find_kind(kind) == nullptr)
    throw Error(ErrorCategory::usage, "unknown plugin kind '" + kind + "' (kinds: " + kind_names() + ")");
  if (name_or_path.empty()) throw Error(ErrorCategory::usage, "empty " + kind + " name");
  if (looks_like_path(name_or_path)) {
    PluginInfo info = inspect_plugin_file(name_or_path);
    if (info.kind != kind)
      throw Error(ErrorCategory::plugin, "plugin file " + name_or_path + " is a " + info.kind + " plugin ('" +
                                             info.name + "'), not a " + kind + " plugin");
    return info;
  }
  const ScanResult found = scan();
  std::vector<PluginInfo> matches;
  std::vector<std::string> names;
  for (const auto& p : found.plugins) {
    if (p.kind != kind) continue;
    if (p.name == name_or_path) matches.push_back(p);
    if (std::find(names.begin(), names.end(), p.name) == names.end()) names.push_back(p.name);
  }
  // A plugin linked into the program wins over files of the same kind and name (statics come
  // first in the scan): the program was built with it on purpose, and the static build runs
  // beside the built-in files. A file is still selected by its path.
  if (!matches.empty() && matches.front().is_static) return matches.front();
  if (matches.size() == 1) return matches.front();
  if (matches.size() > 1) {
    std::string where;
    for (const auto& m : matches) where += (where.empty() ? "" : " and ") + describe(m);
    throw Error(ErrorCategory::plugin, "two plugins offer " + kind + " '" + name_or_path + "': " + where +
                                           "; remove one or select it by path");
  }
  // Say why a file that looks like the wanted plugin was not taken, or that the name exists
  // under another kind: both are more useful than "unknown".
  std::string why;
  for (const auto& [file, problem] : found.problems)
    if (file.filename() == "libampkit-" + kind + "-" + name_or_path + ".so") why = "; " + problem;
  for (const auto& p : found.plugins)
    if (why.empty() && p.kind != kind && p.name == name_or_path)
      why = "; '" + name_or_path + "' is a " + p.kind + " plugin, not a " + kind + " plugin";
  std::sort(names.begin(), names.end());
  std::string available;
  for (const auto& n : names) available += (available.empty() ? "" : ", ") + n;
  std::string hint = did_you_mean(name_or_path, names);
  throw Error(ErrorCategory::plugin, "unknown " + kind + " '" + name_or_path + "'" + why +
                                         (hint.empty() ? "" : "; " + hint) +
                                         " (available: " + (available.empty() ? "none found" : available) +
                                         "; see ampkit-plugins list)");
}

namespace {

std::string load_key(const PluginInfo& info) {
  return info.is_static ? "static:" + info.kind + ":" + info.name : fs::weakly_canonical(info.path).string();
}

}  // namespace

// The check and the load must see the same file: a symlink or file swapped after the check (a
// race a local attacker can win in a writable folder) would otherwise load a file never judged.
PluginInfo Registry::pin(const PluginInfo& info) {
  const int fd = ::open(info.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(ErrorCategory::plugin,
                "plugin file " + info.path.string() + " cannot be opened: " + std::strerror(errno));
  // A file refused below is closed again; one fit to load stays open (pinned_fds_) until loaded.
  struct CloseUnlessKept {
    int fd;
    ~CloseUnlessKept() {
      if (fd >= 0) ::close(fd);
    }
  } guard{fd};
  const fs::path opened = "/proc/self/fd/" + std::to_string(fd);
  if (std::string warning =
          check_trusted(info.path, opened, options_.allow_untrusted, options_.allow_untrusted_name);
      !warning.empty())
    warnings_.push_back(std::move(warning));
  PluginInfo now = inspect_plugin_file(opened);
  if (now.entry != info.entry || now.kind != info.kind || now.name != info.name)
    throw Error(ErrorCategory::plugin, "plugin file " + info.path.string() +
                                           " changed between inspection and loading (it now holds " +
                                           now.kind + " '" + now.name + "'); refusing it");
  now.path = info.path;
  now.load_from = opened;
  now.pinned_fd = fd;
  check_compatible(now);
  pinned_fds_.push_back(fd);
  guard.fd = -1;
  return now;
}

// Closes the files pinned for plugins that did not get loaded (a failed probe or load).
void Registry::release_unloaded(const std::vector<PluginInfo>& pinned) {
  for (const auto& info : pinned) {
    if (loaded_.count(load_key(info))) continue;
    const int fd = info.pinned_fd;
    const auto it = std::find(pinned_fds_.begin(), pinned_fds_.end(), fd);
    if (it == pinned_fds_.end()) continue;
    pinned_fds_.erase(it);
    ::close(fd);
  }
}

const LoadedPlugin& Registry::load(const PluginInfo& info) {
  return *load_all({info}).front();
}

std::vector<const LoadedPlugin*> Registry::load_all(const std::vector<PluginInfo>& infos) {
  // Trust and compatibility first, for every file; then one child probes them all (one fork,
  // whatever their number: a fork of a process with LibTorch mapped costs about 10 ms here).
  std::vector<const PluginInfo*> to_probe;
  std::vector<PluginInfo> pinned;
  pinned.reserve(infos.size());
  try {
    for (const auto& info : infos) {
      if (info.is_static || loaded_.count(load_key(info))) continue;
      if (std::none_of(pinned.begin(), pinned.end(),
                       [&](const PluginInfo& p) { return p.path == info.path; }))
        pinned.push_back(pin(info));
    }
    for (const auto& info : pinned)
      if (!loaded_files().count(file_identity(info))) to_probe.push_back(&info);
    if (options_.probe && !to_probe.empty()) {
      const ProbeResult probe =
          probe_plugins(to_probe, /*create=*/false, options_.probe_timeout_seconds, options_.probe_program);
      if (!probe.ok) throw Error(ErrorCategory::plugin, probe.message);
    }
    return load_pinned(infos, pinned);
  } catch (...) {
    release_unloaded(pinned);
    throw;
  }
}

std::vector<const LoadedPlugin*> Registry::load_pinned(const std::vector<PluginInfo>& infos,
                                                       const std::vector<PluginInfo>& pinned) {
  std::vector<const LoadedPlugin*> out;
  out.reserve(infos.size());
  for (const auto& info : infos) {
    const std::string key = load_key(info);
    auto it = loaded_.find(key);
    if (it == loaded_.end()) {
      const ampkit_plugin_descriptor* descriptor = nullptr;
      if (info.is_static) {
        for (const auto* d : static_plugins())
          if (info.kind == d->kind && info.name == d->name) descriptor = d;
        validate_descriptor(info, descriptor);
        it = loaded_.emplace(key, std::make_unique<LoadedPlugin>(info, descriptor)).first;
      } else {
        const auto p = std::find_if(pinned.begin(), pinned.end(),
                                    [&](const PluginInfo& x) { return x.path == info.path; });
        descriptor = detail::load_descriptor(*p);
        it = loaded_.emplace(key, std::make_unique<LoadedPlugin>(*p, descriptor)).first;
      }
    }
    out.push_back(it->second.get());
  }
  return out;
}

}  // namespace ampkit
