// ampkit-plugins: lists, shows and checks the plugins ampkit would find (ompi_info for ampkit).
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ampkit/exit_codes.h"
#include "ampkit/kind_flags.h"
#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"

namespace po = boost::program_options;
using nlohmann::ordered_json;

namespace ampkit {
namespace {

const std::string kUsage =
    "usage: ampkit-plugins list [--json]\n"
    "       ampkit-plugins show NAME [--kind KIND] [--json]\n"
    "       ampkit-plugins check [--json]\n"
    "list reads plugin files without running them; show loads one plugin; check loads every\n"
    "plugin in a child process and reports crashes.\n" +
    exit_codes_help(
        {ExitCode::ok, ExitCode::internal, ExitCode::usage, ExitCode::plugin, ExitCode::check_failed}) +
    "\n";
// What a usage error prints after its one error line: two lines in all (the fuzz-style CLI test,
// tools/cli_fuzz.py, holds usage errors to at most three).
const std::string kShortUsage =
    "usage: ampkit-plugins list|check [--json] | show NAME [--kind KIND] [--json] (--help for more)";

ordered_json info_json(const PluginInfo& p) {
  ordered_json j;
  j["kind"] = p.kind;
  j["name"] = p.name;
  j["version"] = p.version;
  j["summary"] = p.summary;
  j["path"] = p.is_static ? "" : p.path.string();
  j["static"] = p.is_static;
  j["abi"] = p.abi_version;
  j["torch"] = p.torch_version;
  j["compiler"] = p.compiler;
  try {
    check_compatible(p);
    j["compatible"] = true;
  } catch (const Error& e) {
    j["compatible"] = false;
    j["problem"] = e.what();
  }
  return j;
}

// Other files offering the same kind and name (selecting the name is then an error).
std::vector<std::string> clashes(const PluginInfo& p, const ScanResult& scan) {
  std::vector<std::string> out;
  if (p.is_static) return out;
  for (const auto& s : scan.plugins)
    if (!s.is_static && s.kind == p.kind && s.name == p.name && s.path != p.path)
      out.push_back(s.path.string());
  return out;
}

// A file offering the kind and name of a plugin linked into this program is never selected by name.
bool shadowed(const PluginInfo& p, const ScanResult& scan) {
  if (p.is_static) return false;
  for (const auto& s : scan.plugins)
    if (s.is_static && s.kind == p.kind && s.name == p.name) return true;
  return false;
}

int list(const Registry& registry, bool json) {
  const ScanResult scan = registry.scan();
  if (json) {
    ordered_json out;
    out["search_path"] = ordered_json::array();
    for (const auto& d : registry.search_path()) out["search_path"].push_back(d.string());
    out["plugins"] = ordered_json::array();
    for (const auto& p : scan.plugins) {
      out["plugins"].push_back(info_json(p));
      out["plugins"].back()["shadowed"] = shadowed(p, scan);
      out["plugins"].back()["clash"] = clashes(p, scan);
      const std::string why = p.is_static ? "" : untrusted_reason(p.path);
      out["plugins"].back()["trusted"] = why.empty();
      if (!why.empty()) out["plugins"].back()["untrusted"] = why;
    }
    out["problems"] = ordered_json::array();
    for (const auto& [file, why] : scan.problems)
      out["problems"].push_back({{"path", file.string()}, {"error", why}});
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  size_t wk = 4, wn = 4, wv = 7;
  for (const auto& p : scan.plugins) {
    wk = std::max(wk, p.kind.size());
    wn = std::max(wn, p.name.size());
    wv = std::max(wv, p.version.size());
  }
  std::printf("%-*s  %-*s  %-*s  %s\n", int(wk), "kind", int(wn), "name", int(wv), "version", "summary");
  for (const KindInfo& kind : kKinds)
    for (const auto& p : scan.plugins) {
      if (p.kind != kind.name) continue;
      std::string note = shadowed(p, scan) ? "  [shadowed by static]" : "";
      if (!p.is_static && !untrusted_reason(p.path).empty()) note += "  [untrusted]";
      if (!clashes(p, scan).empty()) note += "  [clash]";
      try {
        check_compatible(p);
      } catch (const Error& e) {
        note += "  [incompatible]";
      }
      std::printf("%-*s  %-*s  %-*s  %s%s%s\n", int(wk), p.kind.c_str(), int(wn), p.name.c_str(), int(wv),
                  p.version.c_str(), p.summary.c_str(), p.is_static ? "  [static]" : "", note.c_str());
    }
  std::printf("\nsearch path:");
  for (const auto& d : registry.search_path()) std::printf(" %s", d.c_str());
  std::printf("\n");
  for (const auto& [file, why] : scan.problems)
    std::fprintf(stderr, "ampkit-plugins: warning: %s\n", why.c_str());
  return 0;
}

int show(Registry& registry, const std::string& name, const std::string& kind, bool json) {
  std::vector<PluginInfo> matches;
  if (!kind.empty()) {
    matches.push_back(registry.find(kind, name));
  } else if (name.find('/') != std::string::npos ||
             (name.size() > 3 && name.substr(name.size() - 3) == ".so")) {
    matches.push_back(inspect_plugin_file(name));
  } else {
    for (const KindInfo& k : kKinds)
      for (const auto& p : registry.scan().plugins)
        if (p.kind == k.name && p.name == name) {
          matches.push_back(registry.find(k.name, name));
          break;
        }
  }
  if (matches.empty()) {
    std::vector<std::string> names;
    for (const auto& p : registry.scan().plugins) names.push_back(p.name);
    const std::string hint = did_you_mean(name, names);
    throw Error(ErrorCategory::plugin, "no plugin named '" + name + "'" + (hint.empty() ? "" : "; " + hint) +
                                           " (see ampkit-plugins list)");
  }
  if (matches.size() > 1) {
    std::string kinds;
    for (const auto& m : matches) kinds += (kinds.empty() ? "" : ", ") + m.kind;
    throw Error(ErrorCategory::usage,
                "'" + name + "' names plugins of several kinds (" + kinds + "); add --kind KIND");
  }
  const LoadedPlugin& p = registry.load(matches.front());
  OptionInputs defaults;
  defaults.read_environment = false;
  const ResolvedOptions options = resolve_options(p.descriptor(), defaults);
  if (json) {
    ordered_json out = info_json(p.info());
    out["options"] = ordered_json::array();
    for (uint32_t i = 0; i < p.descriptor().option_count; ++i) {
      const auto& spec = p.descriptor().options[i];
      const OptionSetting& setting = options.settings[i];
      ordered_json option = {
          {"name", spec.name},
          {"type", describe_option_type(spec)},
          {"default", spec.default_value ? ordered_json(spec.default_value) : ordered_json(nullptr)},
          {"environment", option_environment_name(p.info().kind, spec.name)},
          {"help", spec.help}};
      if (!setting.precision_defaults.empty()) {
        // One default per precision: "default" is null and this maps precision -> value.
        option["default"] = nullptr;
        option["default_per_precision"] = ordered_json::object();
        for (const auto& [precision, value] : setting.precision_defaults)
          option["default_per_precision"][precision] = value;
      }
      out["options"].push_back(option);
    }
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  const PluginInfo& i = p.info();
  const KindInfo* kind_info = find_kind(i.kind);
  // An fp8 recipe serves ampkit-train's fp8 layers and Python's alike: both are named.
  const bool fp8 = kind_info != nullptr && optional_kind(*kind_info);
  const std::string select =
      "--" + (kind_info != nullptr ? kind_flag(*kind_info) : i.kind) + " " + i.name +
      (fp8 ? " (ampkit-train), ampkit.fp8.convert(model, recipe=\"" + i.name + "\") in Python" : "");
  const std::string given =
      "--opt " + i.kind + ".NAME=VALUE" + (fp8 ? std::string(" (opt={\"NAME\": VALUE} in Python)") : "");
  std::printf("%s '%s' %s\n  %s\n  file:     %s\n  built:    ampkit ABI %d, torch %s, %s\n  select:   %s\n",
              i.kind.c_str(), i.name.c_str(), i.version.c_str(), i.summary.c_str(),
              i.is_static ? "(linked into this program)" : i.path.c_str(), i.abi_version,
              i.torch_version.c_str(), i.compiler.c_str(), select.c_str());
  std::printf("  options:  %s or environment %s\n%s", given.c_str(),
              option_environment_name(i.kind, "NAME").c_str(),
              format_option_table(options.settings, false).c_str());
  return 0;
}

int check(const Registry& registry, bool json) {
  const ScanResult scan = registry.scan();
  ordered_json results = ordered_json::array();
  int failures = 0;
  auto report = [&](const std::string& path, const std::string& what, bool ok, bool crashed,
                    const std::string& message) {
    failures += ok ? 0 : 1;
    results.push_back(
        {{"path", path}, {"plugin", what}, {"ok", ok}, {"crashed", crashed}, {"message", message}});
    if (!json)
      std::printf("%-6s %-26s %s%s%s\n",
                  ok        ? "ok"
                  : crashed ? "CRASH"
                            : "FAIL",
                  what.c_str(), path.c_str(), message.empty() ? "" : "\n       ", message.c_str());
  };
  for (const auto& p : scan.plugins) {
    const std::string what = p.kind + " '" + p.name + "'";
    if (p.is_static) {
      report("(static)", what, true, false, "");
      continue;
    }
    try {
      check_trusted(p.path, registry.options().allow_untrusted, registry.options().allow_untrusted_name);
      check_compatible(p);
    } catch (const Error& e) {
      report(p.path.string(), what, false, false, e.what());
      continue;
    }
    // ampkit-train refuses a name two files offer: check must not call them ok.
    if (const auto others = clashes(p, scan); !others.empty()) {
      report(p.path.string(), what, false, false,
             "another file offers " + what + " too (" + others.front() +
                 "); selecting it by name fails: remove one or select it by path");
      continue;
    }
    // Users select by name, and the file name is what they see: it must say what the file holds.
    const std::string expected = "libampkit-" + p.kind + "-" + p.name + ".so";
    if (p.path.filename() != expected) {
      report(p.path.string(), what, false, false,
             "the file name disagrees with its metadata (" + what + "): expected " + expected);
      continue;
    }
    const ProbeResult r = probe_plugin(p, /*create=*/true);
    report(p.path.string(), what, r.ok, r.crashed, r.message);
  }
  for (const auto& [file, why] : scan.problems) report(file.string(), "(not a plugin)", false, false, why);
  if (json)
    std::printf("%s\n", ordered_json{{"results", results}, {"failures", failures}}
                            .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                            .c_str());
  else
    std::printf("\n%zu checked, %d failed\n", results.size(), failures);
  return failures ? ampkit::exit_status(ExitCode::check_failed) : 0;
}

int run(int argc, char** argv) {
  po::options_description o("options");
  o.add_options()("help,h", "Show usage.")("json", po::bool_switch(), "Machine-readable output.")(
      "kind", po::value<std::string>()->default_value(""), "show: the plugin kind when a name is ambiguous.")(
      "plugin-dir", po::value<std::vector<std::string>>()->composing(),
      "Folder searched first (repeatable).")("allow-untrusted-plugins", po::bool_switch(),
                                             "Accept plugin files writable by others (loudly).")(
      "command", po::value<std::string>(), "list | show | check")("name", po::value<std::string>(),
                                                                  "plugin name or path for show");
  po::positional_options_description pos;
  pos.add("command", 1).add("name", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(o).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(ErrorCategory::usage, std::string(e.what()) + "\n" + kShortUsage);
  }
  if (vm.count("help")) {
    std::printf("%s\n%s", kUsage.c_str(),
                [&] {
                  std::ostringstream s;
                  s << o;
                  return s.str();
                }()
                    .c_str());
    return 0;
  }
  if (!vm.count("command")) throw Error(ErrorCategory::usage, "no command given\n" + kShortUsage);
  const std::string command = vm["command"].as<std::string>();
  RegistryOptions ro;
  if (vm.count("plugin-dir"))
    for (const auto& d : vm["plugin-dir"].as<std::vector<std::string>>()) ro.plugin_dirs.emplace_back(d);
  ro.allow_untrusted = vm["allow-untrusted-plugins"].as<bool>();
  ro.plugin_dirs_name = "--plugin-dir";
  ro.allow_untrusted_name = "--allow-untrusted-plugins";
  Registry registry(ro);
  const bool json = vm["json"].as<bool>();
  const std::string kind = vm["kind"].as<std::string>();
  if (command != "show" && vm.count("name"))
    throw Error(ErrorCategory::usage, command + " takes no argument\n" + kShortUsage);
  if (command == "list") return list(registry, json);
  if (command == "check") return check(registry, json);
  if (command == "show") {
    if (!vm.count("name")) throw Error(ErrorCategory::usage, "show needs a plugin NAME\n" + kShortUsage);
    return show(registry, vm["name"].as<std::string>(), kind, json);
  }
  const std::string hint = did_you_mean(command, {"list", "show", "check"});
  throw Error(ErrorCategory::usage,
              "unknown command '" + command + "'" + (hint.empty() ? "" : "; " + hint) + "\n" + kShortUsage);
}

}  // namespace
}  // namespace ampkit

int main(int argc, char** argv) {
  try {
    return ampkit::run(argc, argv);
  } catch (const ampkit::Error& e) {
    std::fprintf(stderr, "ampkit-plugins: error: %s\n", e.what());
    return ampkit::exit_status(ampkit::exit_code_of(e.category()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampkit-plugins: internal error: %s\n", e.what());
    return 1;
  }
}
