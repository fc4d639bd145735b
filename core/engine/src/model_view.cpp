// The model view of a torch::nn::Module.
#include "ampkit/model_view.h"

#include <torch/nn/module.h>

namespace ampkit {

NamedTensors NnModuleView::named_parameters() const {
  NamedTensors out;
  for (const auto& item : module_.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

NamedTensors NnModuleView::named_buffers() const {
  NamedTensors out;
  for (const auto& item : module_.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

void NnModuleView::train(bool on) {
  module_.train(on);
}

std::vector<std::string> NnModuleView::hook_points() const {
  std::vector<std::string> out;
  for (const auto& item : module_.named_modules("", /*include_self=*/false))
    if (item.value()->children().empty()) out.push_back(item.key());
  return out;
}

std::string NnModuleView::module_type(const std::string& path) const {
  for (const auto& item : module_.named_modules("", false)) {
    if (item.key() != path) continue;
    std::string name = item.value()->name();
    if (name.rfind("torch::nn::", 0) == 0) name = name.substr(11);
    if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
    return name;
  }
  return "";
}

}  // namespace ampkit
