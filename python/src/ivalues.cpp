// Values between ampkit and Python's dicts (ivalues.h).
#include "ivalues.h"

#include <ATen/core/List.h>

#include <type_traits>
#include <variant>

#include "ampkit/error.h"

namespace ampkit::python {

c10::Dict<std::string, c10::IValue> any_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

c10::IValue json_ivalue(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object: {
      c10::Dict<std::string, c10::IValue> d = any_dict();
      for (const auto& [key, value] : j.items()) d.insert(key, json_ivalue(value));
      return d;
    }
    case nlohmann::json::value_t::array: {
      c10::List<c10::IValue> list(c10::AnyType::get());
      for (const nlohmann::json& value : j) list.push_back(json_ivalue(value));
      return list;
    }
    case nlohmann::json::value_t::string:
      return j.get<std::string>();
    case nlohmann::json::value_t::boolean:
      return j.get<bool>();
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return j.get<int64_t>();
    case nlohmann::json::value_t::number_float:
      return j.get<double>();
    default:  // null, and the binary and discarded values no JSON text holds
      return c10::IValue();
  }
}

c10::IValue to_ivalue(const StateValue& v) {
  return std::visit(
      [](const auto& x) -> c10::IValue {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::vector<double>>)
          return c10::IValue(c10::List<double>(x));
        else
          return c10::IValue(x);
      },
      v);
}

StateValue from_ivalue(const std::string& key, const c10::IValue& v) {
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isString()) return v.toStringRef();
  if (v.isDoubleList()) return v.toDoubleVector();
  if (v.isTensor()) {
    const at::Tensor t = v.toTensor().to(at::kDouble).contiguous().reshape({-1});
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  if (v.isList()) {
    std::vector<double> out;
    for (const c10::IValue& e : v.toListRef()) {
      if (!e.isDouble() && !e.isInt())
        throw Error(ErrorCategory::usage, "state key '" + key + "': a list must hold numbers");
      out.push_back(e.isDouble() ? e.toDouble() : static_cast<double>(e.toInt()));
    }
    return out;
  }
  throw Error(ErrorCategory::usage, "state key '" + key + "' holds a " + v.tagKind() +
                                        "; a plugin state holds bool, int, float, str or a list of floats");
}

c10::IValue record_value(int64_t v) {
  return v;
}
c10::IValue record_value(double v) {
  return v;
}
c10::IValue record_value(bool v) {
  return v;
}
c10::IValue record_value(const std::string& v) {
  return v;
}
c10::IValue record_value(const std::vector<double>& v) {
  return c10::List<double>(v);
}
c10::IValue record_value(const nlohmann::json& v) {
  return json_ivalue(v);  // a dict, as the metrics file's reader sees it; never JSON text to parse again
}
c10::IValue record_value(const std::vector<LayerNorm>& layers) {
  c10::List<c10::IValue> out(c10::AnyType::get());
  for (const LayerNorm& l : layers) {
    c10::Dict<std::string, c10::IValue> layer = any_dict();
    layer.insert("name", l.name);
    layer.insert("grad_norm", l.grad_norm);
    out.push_back(c10::IValue(layer));
  }
  return out;
}

}  // namespace ampkit::python
