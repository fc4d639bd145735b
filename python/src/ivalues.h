// Values between ampkit and Python's dicts: plugin states, the step record and JSON documents as IValues.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <ampkit/state.h>
#include <ampkit/step_record.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ampkit::python {

// A str -> Any dict, as Python sees a dict of mixed values.
c10::Dict<std::string, c10::IValue> any_dict();

// A JSON document as Python sees it once decoded (objects as dicts, arrays as lists, null as None):
// for documents C++ lays out once for a file and for Python alike (the NaN report).
c10::IValue json_ivalue(const nlohmann::json& j);

// A plugin state's value, and back (a list may also arrive as a float64 tensor).
c10::IValue to_ivalue(const StateValue& v);
StateValue from_ivalue(const std::string& key, const c10::IValue& v);

// A StepRecord field (StepRecord::visit) as an IValue.
c10::IValue record_value(int64_t v);
c10::IValue record_value(double v);
c10::IValue record_value(bool v);
c10::IValue record_value(const std::string& v);
c10::IValue record_value(const std::vector<double>& v);
c10::IValue record_value(const nlohmann::json& v);
c10::IValue record_value(const std::vector<LayerNorm>& layers);

}  // namespace ampkit::python
