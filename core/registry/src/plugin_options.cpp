// Option merging and validation: every value is checked against the plugin's declared spec.
#include "ampkit/plugin_options.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "ampkit/error.h"
#include "ampkit/utf8.h"

extern char** environ;

namespace ampkit {

namespace {

std::vector<std::string> split_choices(const char* choices) {
  std::vector<std::string> out;
  std::string s = choices ? choices : "";
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find('|', start), s.size());
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Parses and range-checks one value; returns the canonical text or throws with the reason.
std::string validate(const ampkit_plugin_descriptor& d, const ampkit_option_spec& spec,
                     const std::string& text, const std::string& source) {
  auto bad = [&](const std::string& why) -> Error {
    return Error(ErrorCategory::usage, "option '" + std::string(spec.name) + "' of " + d.kind + " '" +
                                           d.name + "' " + why + ", got '" + text + "' (from " + source +
                                           ")");
  };
  if (const auto at = invalid_utf8_at(text))  // values end up in JSON (summary, checkpoints)
    throw bad("must be UTF-8 text (byte " + std::to_string(*at) + " is not)");
  switch (spec.type) {
    case AMPKIT_OPTION_BOOL:
      if (const std::optional<bool> b = parse_bool_text(text)) return *b ? "true" : "false";
      throw bad("must be true or false");
    case AMPKIT_OPTION_STRING:
      return text;
    case AMPKIT_OPTION_CHOICE: {
      const auto choices = split_choices(spec.choices);
      for (const auto& c : choices)
        if (c == text) return text;
      throw bad("must be one of " + std::string(spec.choices));
    }
    case AMPKIT_OPTION_INT:
    case AMPKIT_OPTION_FLOAT: {
      const bool integer = spec.type == AMPKIT_OPTION_INT;
      char* end = nullptr;
      errno = 0;
      double v = 0;
      // Decimal numbers only: strtod would also take hex ("0x10" as 16), and a string that holds
      // a NUL would be read up to it ("5\0" as 5), where a user meant something else.
      if (!text.empty() && (std::isspace(static_cast<unsigned char>(text.front())) || text.front() == '+'))
        throw bad(integer ? "must be an integer" : "must be a finite number");
      if (text.find_first_of(std::string("xX\0", 3)) != std::string::npos)
        throw bad(integer ? "must be a decimal integer" : "must be a finite decimal number");
      long long as_integer = 0;
      if (integer) {
        as_integer = std::strtoll(text.c_str(), &end, 10);
        v = static_cast<double>(as_integer);
      } else {
        v = std::strtod(text.c_str(), &end);
      }
      if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
        throw bad(integer ? "must be an integer" : "must be a finite number");
      if (!declared_range(spec).contains(v)) throw bad("must be " + describe_option_type(spec));
      return integer ? std::to_string(as_integer) : format_number(v);
    }
    default:
      throw Error(ErrorCategory::plugin, std::string(d.kind) + " '" + d.name + "' declares option '" +
                                             spec.name + "' of unknown type " + std::to_string(spec.type));
  }
}

// The pairs of a per-precision default, "fp16=1;bf16=5;fp32=10", each value validated and in
// canonical form. A malformed list is the plugin's fault, so it is a plugin error.
std::vector<std::pair<std::string, std::string>> precision_defaults(const ampkit_plugin_descriptor& d,
                                                                    const ampkit_option_spec& spec) {
  const std::string who = std::string(d.kind) + " '" + d.name + "'";
  const std::string text = spec.default_value ? spec.default_value : "";
  auto malformed = [&](const std::string& why) {
    return Error(ErrorCategory::plugin, who + " declares option '" + spec.name +
                                            "' with a per-precision default '" + text + "' that " + why +
                                            " (expected PRECISION=VALUE;... with PRECISION " +
                                            precision_names("|") + ")");
  };
  std::vector<std::pair<std::string, std::string>> out;
  if (text.empty()) throw malformed("is empty");
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(';', start), text.size());
    const std::string pair = text.substr(start, end - start);
    start = end + 1;
    const size_t eq = pair.find('=');
    if (eq == std::string::npos) throw malformed("has '" + pair + "' without '='");
    const std::string precision = pair.substr(0, eq);
    if (!parse_precision(precision)) throw malformed("names an unknown precision '" + precision + "'");
    for (const auto& [p, v] : out)
      if (p == precision) throw malformed("names " + precision + " twice");
    out.emplace_back(precision, validate(d, spec, pair.substr(eq + 1), "default for " + precision));
  }
  return out;
}

}  // namespace

std::string option_environment_name(const std::string& kind, const std::string& option) {
  return "AMPKIT_" + upper(kind) + "_" + upper(option);
}

std::string describe_option_type(const ampkit_option_spec& spec) {
  std::string base;
  switch (spec.type) {
    case AMPKIT_OPTION_BOOL:
      return "bool";
    case AMPKIT_OPTION_STRING:
      return "string";
    case AMPKIT_OPTION_CHOICE:
      return std::string("choice ") + (spec.choices ? spec.choices : "");
    case AMPKIT_OPTION_INT:
      base = "int";
      break;
    case AMPKIT_OPTION_FLOAT:
      base = "float";
      break;
    default:
      return "unknown";
  }
  const bool has_min = spec.flags & AMPKIT_OPTION_HAS_MIN, has_max = spec.flags & AMPKIT_OPTION_HAS_MAX;
  const bool min_x = spec.flags & AMPKIT_OPTION_MIN_EXCLUSIVE,
             max_x = spec.flags & AMPKIT_OPTION_MAX_EXCLUSIVE;
  if (has_min && has_max)
    return base + " in " + (min_x ? "(" : "[") + format_number(spec.min_value) + ", " +
           format_number(spec.max_value) + (max_x ? ")" : "]");
  if (has_min) return base + (min_x ? " > " : " >= ") + format_number(spec.min_value);
  if (has_max) return base + (max_x ? " < " : " <= ") + format_number(spec.max_value);
  return base;
}

namespace {

// "unknown option 'x' for scaler 'static' (from SOURCE); did you mean ...; options: ..."
Error unknown_option(const ampkit_plugin_descriptor& d, const std::vector<std::string>& names,
                     const std::string& option, const std::string& source) {
  const std::string hint = did_you_mean(option, names);
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  return Error(ErrorCategory::usage, "unknown option '" + option + "' for " + d.kind + " '" + d.name +
                                         "' (from " + source + ")" + (hint.empty() ? "" : "; " + hint) +
                                         (known.empty() ? "; it has no options" : "; options: " + known));
}

// The plugin's AMPKIT_<KIND>_<OPTION> variables; one for an option it does not have is an error.
std::map<std::string, std::string> environment_options(const ampkit_plugin_descriptor& d,
                                                       const std::vector<std::string>& names) {
  std::map<std::string, std::string> environment;
  const std::string prefix = "AMPKIT_" + upper(d.kind) + "_";
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind(prefix, 0) != 0) continue;
    const auto eq = entry.find('=');
    const std::string var = entry.substr(0, eq);
    bool matched = false;
    for (const auto& n : names)
      if (option_environment_name(d.kind, n) == var) {
        environment[n] = entry.substr(eq + 1);
        matched = true;
      }
    if (!matched) {
      std::string lower = var.substr(prefix.size());
      for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      throw unknown_option(d, names, lower, "environment " + var);
    }
  }
  return environment;
}

// The default of one option for this run: the plain one, or the one for the run's precision.
// Fills the setting's default_value and precision_defaults; returns false when there is none.
bool option_default(const ampkit_plugin_descriptor& d, const ampkit_option_spec& spec,
                    const OptionInputs& inputs, OptionSetting& s, std::string& text, std::string& source) {
  source = "default";
  if (!(spec.flags & AMPKIT_OPTION_PER_PRECISION)) {
    if (spec.default_value != nullptr) text = spec.default_value;
    return spec.default_value != nullptr;
  }
  s.precision_defaults = precision_defaults(d, spec);  // validates every pair, whatever the run
  s.default_value.clear();
  bool found = false;
  for (const auto& [p, v] : s.precision_defaults) {
    s.default_value += (s.default_value.empty() ? "" : ";") + p + "=" + v;
    if (inputs.precision && p == to_string(*inputs.precision)) {
      text = v;
      source = "default for " + p;
      found = true;
    }
  }
  return found;
}

// One option's setting by precedence: command line, environment, config file, default.
OptionSetting resolve_one(const ampkit_plugin_descriptor& d, const ampkit_option_spec& spec,
                          const OptionInputs& inputs, const std::map<std::string, std::string>& environment) {
  OptionSetting s;
  s.name = spec.name;
  s.type = describe_option_type(spec);
  s.help = spec.help;
  s.default_value = spec.default_value ? spec.default_value : "";
  std::string default_text, default_source;
  const bool has_default = option_default(d, spec, inputs, s, default_text, default_source);
  std::string text;
  if (auto it = inputs.command_line.find(s.name); it != inputs.command_line.end()) {
    text = it->second;
    s.origin = OptionOrigin::command_line;
    s.source = inputs.command_line_name;
  } else if (auto it2 = environment.find(s.name); it2 != environment.end()) {
    text = it2->second;
    s.origin = OptionOrigin::environment;
    s.source = "environment " + option_environment_name(d.kind, s.name);
  } else if (auto it3 = inputs.config_file.find(s.name); it3 != inputs.config_file.end()) {
    text = it3->second;
    s.origin = OptionOrigin::config_file;
    s.source = "config file " + inputs.config_file_name;
  } else if (has_default) {
    text = default_text;
    s.origin = OptionOrigin::default_value;
    s.source = default_source;
  } else {
    s.source = "unset";
  }
  if (s.origin != OptionOrigin::unset) {
    s.value = validate(d, spec, text, s.source);
    s.set = true;
  }
  return s;
}

}  // namespace

ResolvedOptions resolve_options(const ampkit_plugin_descriptor& d, const OptionInputs& inputs) {
  std::vector<std::string> names;
  for (uint32_t i = 0; i < d.option_count; ++i) names.emplace_back(d.options[i].name);
  std::map<std::string, std::string> environment;
  if (inputs.read_environment) environment = environment_options(d, names);
  for (const auto& [k, v] : inputs.command_line)
    if (std::find(names.begin(), names.end(), k) == names.end())
      throw unknown_option(d, names, k, inputs.command_line_name);
  for (const auto& [k, v] : inputs.config_file)
    if (std::find(names.begin(), names.end(), k) == names.end())
      throw unknown_option(d, names, k, "config file " + inputs.config_file_name);
  ResolvedOptions out;
  for (uint32_t i = 0; i < d.option_count; ++i) {
    OptionSetting s = resolve_one(d, d.options[i], inputs, environment);
    if (s.set) out.values.set(s.name, s.value);
    out.settings.push_back(std::move(s));
  }
  return out;
}

}  // namespace ampkit

namespace ampkit {

std::string format_option_table(const std::vector<OptionSetting>& settings, bool with_source) {
  if (settings.empty()) return "    (no options)\n";
  auto shown = [&](const OptionSetting& s) -> std::string {
    if (with_source) return s.set ? s.value : "(unset)";
    return s.default_value.empty() ? "(unset)" : s.default_value;
  };
  // Each column at least as wide as its heading, so the help column lines up under "help".
  size_t w_name = 4, w_type = 4, w_value = with_source ? 5 : 7, w_source = 6;
  for (const auto& s : settings) {
    w_name = std::max(w_name, s.name.size());
    w_type = std::max(w_type, s.type.size());
    w_value = std::max(w_value, shown(s).size());
    w_source = std::max(w_source, s.source.size());
  }
  std::ostringstream out;
  auto pad = [](const std::string& s, size_t w) {
    return s + std::string(w > s.size() ? w - s.size() : 0, ' ');
  };
  out << "    " << pad("name", w_name) << "  " << pad("type", w_type) << "  "
      << pad(with_source ? "value" : "default", w_value) << "  "
      << (with_source ? pad("source", w_source) + "  " : "") << "help\n";
  for (const auto& s : settings) {
    const std::string value = shown(s);
    out << "    " << pad(s.name, w_name) << "  " << pad(s.type, w_type) << "  " << pad(value, w_value) << "  "
        << (with_source ? pad(s.source, w_source) + "  " : "") << s.help << "\n";
  }
  return out.str();
}

}  // namespace ampkit
