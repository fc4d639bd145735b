// The builders of option_table.cpp, for options declared beside the code that reads them (the
// workloads' own options: hosts/train/src/workloads/).
#pragma once

#include <any>
#include <functional>
#include <optional>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

#include "config/option_table.h"

namespace ampkit::options {

using Store = std::function<void(TrainConfig&, const HostOptionValue&)>;

// The table's integer ranges keep every value inside the field's type (int fields get a max).
inline void assign(int64_t& to, const HostOptionValue& v) {
  to = v.integer;
}
inline void assign(int& to, const HostOptionValue& v) {
  to = static_cast<int>(v.integer);
}
inline void assign(uint64_t& to, const HostOptionValue& v) {
  to = v.unsigned_integer;
}
inline void assign(double& to, const HostOptionValue& v) {
  to = v.number;
}
inline void assign(bool& to, const HostOptionValue& v) {
  to = v.boolean;
}
inline void assign(std::string& to, const HostOptionValue& v) {
  to = v.text;
}
inline void assign(std::vector<std::string>& to, const HostOptionValue& v) {
  to = v.list;
}

template <class T>
Store field(T TrainConfig::*member) {
  return [member](TrainConfig& cfg, const HostOptionValue& v) { assign(cfg.*member, v); };
}
template <class T>
Store dist_field(T DistributedConfig::*member) {
  return [member](TrainConfig& cfg, const HostOptionValue& v) { assign(cfg.dist.*member, v); };
}
template <class T>
Store data_parallel_field(T DataParallelOptions::*member) {
  return [member](TrainConfig& cfg, const HostOptionValue& v) { assign(cfg.data_parallel.*member, v); };
}

// A workload's own options fill a struct of its own (declared beside its code, with defaults only
// for a TrainConfig that was never parsed), held in TrainConfig::workload_values by its type.
template <class Options, class T>
Store workload_field(T Options::*member) {
  return [member](TrainConfig& cfg, const HostOptionValue& v) {
    std::any& held = cfg.workload_values[std::type_index(typeid(Options))];
    if (!held.has_value()) held = Options{};
    assign(std::any_cast<Options&>(held).*member, v);
  };
}
// The workload's options as the table filled them; the struct's own defaults when it never ran.
template <class Options>
Options workload_values(const TrainConfig& cfg) {
  const auto it = cfg.workload_values.find(std::type_index(typeid(Options)));
  return it == cfg.workload_values.end() ? Options{} : std::any_cast<const Options&>(it->second);
}

inline HostOption row(const char* name, OptionType type, std::optional<std::string> def, std::string help,
                      Store store) {
  HostOption o;
  o.name = name;
  o.type = type;
  o.default_value = std::move(def);
  o.help = std::move(help);
  o.store = std::move(store);
  return o;
}
inline HostOption text(const char* name, const char* def, std::string help, Store store) {
  return row(name, OptionType::text, def ? std::optional<std::string>(def) : std::nullopt, std::move(help),
             std::move(store));
}
inline HostOption integer(const char* name, const char* def, std::string help, Store store) {
  return row(name, OptionType::integer, def ? std::optional<std::string>(def) : std::nullopt, std::move(help),
             std::move(store));
}
inline HostOption number(const char* name, const char* def, std::string help, Store store) {
  return row(name, OptionType::number, std::string(def), std::move(help), std::move(store));
}
inline HostOption boolean(const char* name, const char* def, std::string help, Store store) {
  return row(name, OptionType::boolean, std::string(def), std::move(help), std::move(store));
}
inline HostOption flag(const char* name, std::string help, Store store) {
  return row(name, OptionType::flag, std::string("false"), std::move(help), std::move(store));
}
inline HostOption list(const char* name, std::string help, Store store) {
  return row(name, OptionType::list, std::nullopt, std::move(help), std::move(store));
}

}  // namespace ampkit::options
