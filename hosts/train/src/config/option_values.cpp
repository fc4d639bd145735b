// Checking an option's text against its declaration, and what the launchers' environment says.
#include <ampkit/kinds.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "ampkit/error.h"
#include "config/option_table.h"

namespace ampkit {

namespace {

// 1048576 stays 1048576 (not 1.04858e+06); fractions keep their shortest form (0.05).
std::string number_text(double v) {
  std::ostringstream s;
  if (std::abs(v) < 1e15 && v == std::floor(v))
    s << static_cast<long long>(v);
  else
    s << v;
  return s.str();
}

[[noreturn]] void refuse(const HostOption& o, const std::string& what, const std::string& got,
                         const std::string& source) {
  throw Error(ErrorCategory::usage, "--" + o.name + " must be " + what + ", got " + got +
                                        (source == "command line" ? "" : " from " + source));
}

void check_range(const HostOption& o, double v, const std::string& text, const std::string& source) {
  if (o.bounds.contains(v)) return;
  const std::string range = range_text(o);
  refuse(o, range[0] == '[' || range[0] == '(' ? "in " + range : range, text, source);
}

std::string choices_text(const std::vector<std::string>& choices) {
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i)
    out += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return out;
}

}  // namespace

std::string range_text(const HostOption& o) {
  const NumberRange& b = o.bounds;
  if (b.min && b.max)
    return std::string(b.min_exclusive ? "(" : "[") + number_text(*b.min) + ", " + number_text(*b.max) +
           (b.max_exclusive ? ")" : "]");
  if (b.min) return (b.min_exclusive ? "> " : ">= ") + number_text(*b.min);
  if (b.max) return (b.max_exclusive ? "< " : "<= ") + number_text(*b.max);
  return "";
}

HostOptionValue parse_option_value(const HostOption& o, const std::string& text, const std::string& source) {
  HostOptionValue v;
  v.text = text;
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  switch (o.type) {
    case OptionType::integer:
      v.integer = std::strtoll(begin, &end, 10);
      if (text.empty() || *end != '\0' || errno == ERANGE) refuse(o, "an integer", "'" + text + "'", source);
      check_range(o, static_cast<double>(v.integer), text, source);
      break;
    case OptionType::unsigned_integer:
      v.unsigned_integer = std::strtoull(begin, &end, 10);
      if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE)
        refuse(o, "a non-negative integer", "'" + text + "'", source);
      break;
    case OptionType::number:
      v.number = std::strtod(begin, &end);
      if (text.empty() || *end != '\0' || !std::isfinite(v.number))
        refuse(o, "a finite number", "'" + text + "'", source);
      check_range(o, v.number, text, source);
      break;
    case OptionType::boolean:
    case OptionType::flag:
      if (const std::optional<bool> b = parse_bool_text(text))
        v.boolean = *b;
      else
        refuse(o, "true or false", "'" + text + "'", source);
      break;
    case OptionType::text:
      if (!o.choices.empty() && std::find(o.choices.begin(), o.choices.end(), text) == o.choices.end())
        refuse(o, choices_text(o.choices), "'" + text + "'", source);
      break;
    case OptionType::list:
      break;
  }
  return v;
}

std::string canonical_text(const HostOption& o, const HostOptionValue& v) {
  std::ostringstream s;
  switch (o.type) {
    case OptionType::integer:
      return std::to_string(v.integer);
    case OptionType::unsigned_integer:
      return std::to_string(v.unsigned_integer);
    case OptionType::number:
      s << v.number;  // as the stream prints a double: 0.001, 25, 1e-05
      return s.str();
    case OptionType::boolean:
    case OptionType::flag:
      return v.boolean ? "true" : "false";
    case OptionType::list:
      for (const auto& item : v.list) s << (s.tellp() > 0 ? " " : "") << item;
      return s.str();
    case OptionType::text:
      break;
  }
  return v.text;
}

std::string first_slurm_host(const std::string& list) {
  std::string host;
  size_t i = 0;
  while (i < list.size() && list[i] != ',' && list[i] != '[') host += list[i++];
  if (i < list.size() && list[i] == '[') {
    ++i;
    while (i < list.size() && list[i] != '-' && list[i] != ',' && list[i] != ']') host += list[i++];
  }
  return host;
}

std::optional<std::pair<std::string, std::string>> launcher_value(const HostOption& option,
                                                                  const EnvironmentLookup& getenv) {
  for (const std::string& name : option.environment) {
    const char* raw = getenv(name.c_str());
    if (raw == nullptr || *raw == '\0') continue;
    std::string value = raw;
    if (name == "SLURM_NTASKS_PER_NODE") value = value.substr(0, value.find('('));  // "2(x3)": 2 on 3 nodes
    if (name == "SLURM_JOB_NODELIST" || name == "SLURM_NODELIST") value = first_slurm_host(value);
    return std::make_pair(value, "environment (" + name + ")");
  }
  return std::nullopt;
}

void store_device_ids(TrainConfig& cfg, const HostOptionValue& v) {
  static const HostOption device_id = [] {
    HostOption o;
    o.name = "device-ids";
    o.type = OptionType::integer;
    return o.range(0, 1 << 20);
  }();
  const std::string& ids = v.text;
  cfg.dist.device_ids.clear();
  for (size_t at = 0; at < ids.size();) {
    const size_t comma = std::min(ids.find(',', at), ids.size());
    const HostOptionValue id = parse_option_value(device_id, ids.substr(at, comma - at), "command line");
    cfg.dist.device_ids.push_back(static_cast<int>(id.integer));
    at = comma + 1;
  }
}

// --opt KIND.OPTION=VALUE, kept per kind as text for the registry to check against the plugin.
void store_plugin_option(TrainConfig& cfg, const std::string& item) {
  const auto dot = item.find('.'), eq = item.find('=');
  if (dot == std::string::npos || eq == std::string::npos || dot == 0 || eq < dot + 2)
    throw Error(ErrorCategory::usage,
                "--opt must be KIND.OPTION=VALUE (e.g. scaler.scale=512), got '" + item + "'");
  const std::string kind = item.substr(0, dot);
  const KindInfo* known = find_kind(kind);
  if (known == nullptr) {
    std::vector<std::string> names;
    for (const KindInfo& k : kKinds) names.push_back(k.name);
    const std::string hint = did_you_mean(kind, names);
    throw Error(ErrorCategory::usage, "--opt " + item + ": unknown plugin kind '" + kind + "'" +
                                          (hint.empty() ? "" : "; " + hint) + " (kinds: " + kind_names() +
                                          ")");
  }
  cfg.plugin_options_cli[kind][item.substr(dot + 1, eq - dot - 1)] = item.substr(eq + 1);
}

}  // namespace ampkit
