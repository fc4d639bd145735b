// torch.classes.ampkit.Fp8Recipe (fp8_recipe_core.h): checks the caller's tensors, then one
// guarded update of all of them.
#include "fp8_recipe_core.h"

#include <ATen/ATen.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "ampkit/checkpoint.h"
#include "ampkit/error.h"
#include "ampkit/plugin_options.h"
#include "plugin_listing.h"

namespace ampkit::python {

namespace {

// Where the option values come from, in sources and messages.
constexpr const char* kOptionSource = "ampkit.fp8 recipe options";

// A CPU tensor of `dtype`, contiguous, of `dims` dimensions: the recipe reads and writes it as an
// array. Anything else is the caller's mistake, named with the argument.
void check_array(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dims) {
  if (!t.defined() || t.device().type() != at::kCPU || t.scalar_type() != dtype || t.dim() != dims ||
      !t.is_contiguous())
    throw Error(
        ErrorCategory::usage,
        std::string("Fp8Recipe.update: ") + name + " must be a contiguous " +
            std::string(c10::toString(dtype)) + " CPU tensor of " + std::to_string(dims) + " dimension" +
            (dims == 1 ? "" : "s") + ", got " +
            (t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + t.device().str() + " " +
                               c10::str(t.sizes()) + (t.is_contiguous() ? "" : " not contiguous")
                         : std::string("an undefined tensor")));
}

// The built-in plugins' folder, searched after `dirs` as ampkit._library.builtin_plugin_dir()
// finds it: the installed package's plugins/ beside _C.so, or the build tree's lib/ampkit/plugins.
std::vector<std::string> with_builtin_dir(std::vector<std::string> dirs) {
  Dl_info here{};
  if (::dladdr(reinterpret_cast<void*>(&check_array), &here) == 0 || here.dli_fname == nullptr)
    throw Error(ErrorCategory::internal, "cannot tell where ampkit's _C.so is, to find its built-in plugins");
  const std::filesystem::path package = std::filesystem::path(here.dli_fname).parent_path();
  const std::filesystem::path installed = package / "plugins";
  dirs.push_back((std::filesystem::is_directory(installed)
                      ? installed
                      : (package / ".." / ".." / "lib" / "ampkit" / "plugins").lexically_normal())
                     .string());
  return dirs;
}

}  // namespace

Fp8RecipeCore::Fp8RecipeCore(const std::string& plugin, const c10::Dict<std::string, std::string>& options,
                             const std::vector<std::string>& plugin_dirs, bool allow_untrusted,
                             int64_t plugin_timeout) {
  locked([&] {
    if (plugin.empty()) throw Error(ErrorCategory::usage, "an fp8 recipe needs a plugin name or a path");
    if (plugin_timeout != -1 && (plugin_timeout < 1 || plugin_timeout > 86400))
      throw Error(ErrorCategory::usage,
                  "plugin_timeout must be a number of seconds from 1 to 86400, or None for no limit; got " +
                      std::to_string(plugin_timeout));
    const unsigned timeout = plugin_timeout == -1 ? 0U : static_cast<unsigned>(plugin_timeout);
    StrategyChoice choice{plugin, {}};
    for (const auto& entry : options) choice.options.command_line[entry.key()] = entry.value();
    choice.options.command_line_name = kOptionSource;
    registry_ =
        std::make_unique<Registry>(registry_options(with_builtin_dir(plugin_dirs), allow_untrusted, timeout));
    // The step kinds come along at their defaults (one probe for all); only the recipe is used.
    set_ = StrategySet::load(*registry_, {{"fp8_recipe", choice}});
    set_->create(timeout);
    recipe_ = set_->fp8_recipe();
  });
}

int64_t Fp8RecipeCore::history_length() const {
  return locked([&] { return recipe_->history_length(); });
}

bool Fp8RecipeCore::current_scaling() const {
  return locked([&] { return recipe_->current_scaling(); });
}

double Fp8RecipeCore::current_eps() const {
  return locked([&] { return recipe_->current_eps(); });
}

std::string Fp8RecipeCore::fp8_format(int64_t role) const {
  return locked([&] {
    if (role < 0 || role >= kFp8RoleCount)
      throw Error(ErrorCategory::usage,
                  "fp8 role " + std::to_string(role) + " is not 0 (input), 1 (weight) or 2 (grad_output)");
    return std::string(recipe_->format(role));
  });
}

int64_t Fp8RecipeCore::update(const at::Tensor& roles, const at::Tensor& amax, const at::Tensor& history,
                              const at::Tensor& scale) const {
  return locked([&] {
    check_array(roles, "roles", at::kLong, 1);
    check_array(amax, "amax", at::kFloat, 1);
    check_array(history, "history", at::kFloat, 2);
    check_array(scale, "scale", at::kFloat, 1);
    const int64_t n = roles.size(0), w = recipe_->history_length();
    if (amax.size(0) != n || scale.size(0) != n || history.size(0) != n || history.size(1) != w)
      throw Error(ErrorCategory::usage, "Fp8Recipe.update: for " + std::to_string(n) +
                                            " roles, amax and scale must have " + std::to_string(n) +
                                            " elements and history the shape [" + std::to_string(n) + ", " +
                                            std::to_string(w) + "] (the recipe's history length); got " +
                                            c10::str(amax.sizes(), " ", scale.sizes(), " ", history.sizes()));
    const int64_t* r = roles.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      if (r[i] < 0 || r[i] >= kFp8RoleCount)
        throw Error(ErrorCategory::usage, "Fp8Recipe.update: roles[" + std::to_string(i) + "] is " +
                                              std::to_string(r[i]) +
                                              ", not 0 (input), 1 (weight) or 2 (grad_output)");
    return recipe_->update(n, r, amax.data_ptr<float>(), history.data_ptr<float>(), scale.data_ptr<float>());
  });
}

std::string Fp8RecipeCore::save() const {
  return locked([&] { return state_to_json(recipe_->save()).dump(); });
}

void Fp8RecipeCore::load(const std::string& json_text) const {
  locked([&] {
    const nlohmann::json parsed = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object())
      throw Error(ErrorCategory::usage,
                  "Fp8Recipe.load: the saved state is not a JSON object (save()'s text)");
    State state;
    try {
      state = state_from_json(parsed);
    } catch (const std::exception& e) {
      throw Error(ErrorCategory::usage, std::string("Fp8Recipe.load: ") + e.what());
    }
    recipe_->load(state);
  });
}

std::string Fp8RecipeCore::plugin() const {
  return locked([&] { return set_->selected("fp8_recipe").description; });
}

}  // namespace ampkit::python

// Registered here, beside the class, as a fragment of library.cpp's TORCH_LIBRARY(ampkit).
TORCH_LIBRARY_FRAGMENT(ampkit, m) {
  using ampkit::python::Fp8RecipeCore;
  m.class_<Fp8RecipeCore>("Fp8Recipe")
      .def(torch::init<std::string, c10::Dict<std::string, std::string>, std::vector<std::string>, bool,
                       int64_t>(),
           "",
           {torch::arg("plugin"), torch::arg("options"),
            torch::arg("plugin_dirs") = c10::IValue(std::vector<std::string>{}),
            torch::arg("allow_untrusted") = false, torch::arg("plugin_timeout") = 30})
      .def("history_length", &Fp8RecipeCore::history_length)
      .def("current_scaling", &Fp8RecipeCore::current_scaling)
      .def("current_eps", &Fp8RecipeCore::current_eps)
      .def("fp8_format", &Fp8RecipeCore::fp8_format)
      .def("update", &Fp8RecipeCore::update)
      .def("save", &Fp8RecipeCore::save)
      .def("load", &Fp8RecipeCore::load)
      .def("plugin", &Fp8RecipeCore::plugin);
}
