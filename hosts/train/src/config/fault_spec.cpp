// ampkit-train's --inject grammar: a fault spec parsed into the engine's Fault, and checked
// against the model (docs/troubleshooting-nan.md, "Fault injection").
#include "config/fault_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <vector>

#include "ampkit/error.h"

namespace ampkit::train {

namespace {

[[noreturn]] void bad(const std::string& spec, const std::string& why) {
  throw Error(ErrorCategory::usage,
              "--inject '" + spec + "': " + why + " (expected " + kFaultSpecGrammar + ")");
}

int64_t parse_int(const std::string& spec, const std::string& key, const std::string& text) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < 0)
    bad(spec, key + " must be a non-negative integer, got '" + text + "'");
  return v;
}

}  // namespace

Fault parse_fault(const std::string& spec) {
  Fault f;
  f.spec = spec;
  const size_t at = spec.find('@');
  if (at == std::string::npos) bad(spec, "no '@' after the fault kind");
  const std::string kind = spec.substr(0, at);
  if (kind == "nan")
    f.kind = Fault::Kind::nan;
  else if (kind == "inf")
    f.kind = Fault::Kind::inf;
  else if (kind == "spike")
    f.kind = Fault::Kind::spike;
  else
    bad(
        spec, "unknown fault kind '" + kind + "'" + [&] {
          const std::string m = did_you_mean(kind, {"nan", "inf", "spike"});
          return m.empty() ? std::string() : "; " + m;
        }());
  std::map<std::string, std::string> fields;
  size_t pos = at + 1;
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) bad(spec, "'" + item + "' is not KEY=VALUE");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    static const std::vector<std::string> keys = {"step", "layer", "rank", "target", "factor"};
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      const std::string m = did_you_mean(key, keys);
      bad(spec, "unknown key '" + key + "'" + (m.empty() ? "" : "; " + m));
    }
    if (value.empty()) bad(spec, key + " has no value");
    if (!fields.emplace(key, value).second) bad(spec, key + " is given twice");
    pos = comma + 1;
  }
  if (!fields.count("step")) bad(spec, "step=N is required");
  f.step = parse_int(spec, "step", fields["step"]);
  if (fields.count("layer")) f.layer = fields["layer"];
  if (fields.count("rank")) f.rank = static_cast<int>(parse_int(spec, "rank", fields["rank"]));
  if (fields.count("target")) {
    const std::string& t = fields["target"];
    if (t == "output")
      f.target = Fault::Target::output;
    else if (t == "grad")
      f.target = Fault::Target::grad;
    else
      bad(spec, "target must be output or grad, got '" + t + "'");
    if (f.target == Fault::Target::grad && f.layer.empty())
      bad(spec, "target=grad needs layer=NAME (a fault without a layer goes into the loss)");
  }
  if (fields.count("factor")) {
    if (f.kind != Fault::Kind::spike) bad(spec, "factor applies to spike faults only");
    const std::string& text = fields["factor"];
    char* end = nullptr;
    f.factor = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || !std::isfinite(f.factor) || f.factor <= 1.0)
      bad(spec, "factor must be a number > 1, got '" + text + "'");
  }
  return f;
}

void validate_faults(const std::vector<Fault>& faults, const std::vector<std::string>& hook_points,
                     int world_size) {
  for (const auto& f : faults) {
    if (!f.layer.empty() && hook_points.empty())
      throw Error(ErrorCategory::usage,
                  "--inject '" + f.spec +
                      "': the model reports no layers (a TorchScript module cannot be observed "
                      "from C++); inject into the loss instead (no layer=)");
    if (!f.layer.empty() && std::find(hook_points.begin(), hook_points.end(), f.layer) == hook_points.end()) {
      std::string list;
      for (const auto& h : hook_points) list += (list.empty() ? "" : ", ") + h;
      const std::string m = did_you_mean(f.layer, hook_points);
      throw Error(ErrorCategory::usage, "--inject '" + f.spec + "': the model has no layer '" + f.layer +
                                            "'" + (m.empty() ? "" : "; " + m) + " (layers: " + list + ")");
    }
    if (f.rank >= world_size)
      throw Error(ErrorCategory::usage, "--inject '" + f.spec + "': rank " + std::to_string(f.rank) +
                                            " does not exist in a run of " + std::to_string(world_size) +
                                            " rank(s)");
  }
}

}  // namespace ampkit::train
