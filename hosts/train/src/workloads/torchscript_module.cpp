// The torchscript workload's model: loading, checks and failures (torchscript_module.h).
#include "workloads/torchscript_module.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/script.h>

#include <filesystem>
#include <regex>
#include <sstream>

#include "ampkit/pytorch_state.h"

namespace fs = std::filesystem;

namespace ampkit::train {

std::string model_message(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = torch_error != nullptr ? torch_error->what_without_backtrace() : e.what();
  // The model's own exception is the last line of TorchScript's report, module-qualified where the
  // model raised it itself ("builtins.ValueError: ..."): that qualifier is dropped.
  const std::regex exception_line("^(?:[A-Za-z_][A-Za-z0-9_]*\\.)*([A-Za-z0-9_]*Error: .*)$");
  std::string last;
  std::istringstream lines(text);
  std::smatch m;
  for (std::string line; std::getline(lines, line);)
    if (std::regex_match(line, m, exception_line)) last = m[1].str();
  if (!last.empty()) return last;
  const std::string first = text.substr(0, text.find('\n'));
  return first.empty() ? "(no message)" : first;
}

torch::jit::Module load_module(const std::string& file, const at::Device& device) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) throw Error(ErrorCategory::data, "--model " + file + " is not a file");
  try {
    // Opened once and its zip directory checked: torch::jit::load allocates what records declare.
    return torch::jit::load(open_module_archive(file, ErrorCategory::data, "--model"), device);
  } catch (const Error&) {
    throw;  // it could not be opened
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw Error(ErrorCategory::data, "--model " + file +
                                         " is not a TorchScript module (save one with "
                                         "torch.jit.script(model).save(FILE)): " +
                                         what.substr(0, what.find('\n')));
  }
}

std::pair<size_t, size_t> forward_arity(const torch::jit::Module& module) {
  const auto method = module.find_method("forward");
  if (!method) throw Error(ErrorCategory::data, "the TorchScript module has no forward method");
  const auto& args = method->function().getSchema().arguments();
  size_t required = 0;
  for (size_t i = 1; i < args.size(); ++i)
    if (!args[i].default_value()) ++required;
  return {required, args.size() - 1};
}

bool looks_traced(const torch::jit::Module& module) {
  for (const auto& m : module.named_modules()) {
    const auto method = m.value.find_method("forward");
    if (!method) continue;
    for (const auto& a : method->function().getSchema().arguments())
      if (std::regex_match(a.name(), std::regex("argument_[0-9]+"))) return true;
  }
  return false;
}

void check_real(const at::Tensor& output, const std::string& where) {
  if (!at::isComplexType(output.scalar_type())) return;
  throw Error(ErrorCategory::data,
              "the model's forward returned a " + std::string(c10::toString(output.scalar_type())) +
                  " tensor on " + where +
                  ": the losses take real numbers (return .real, .abs() or a real tensor)");
}

void check_gradient(const at::Tensor& output, const std::string& where) {
  if (!at::GradMode::is_enabled() || output.requires_grad()) return;
  const std::string dtype = c10::toString(output.scalar_type());
  throw Error(ErrorCategory::data,
              "the model's loss does not require grad: its forward returned a " + dtype + " tensor on " +
                  where +
                  (at::isFloatingType(output.scalar_type())
                       ? " that no parameter reaches (a .detach(), torch.no_grad(), or an output computed "
                         "without the parameters)"
                       : ", and " + dtype + " tensors carry no gradient (return floating-point outputs)"));
}

void BackwardWatch::watch(const at::Tensor& loss) {
  loss.register_hook([inside = inside_](const at::Tensor&) {
    inside->store(true);
    torch::autograd::Engine::get_default_engine().queue_callback([inside] { inside->store(false); });
  });
}

}  // namespace ampkit::train
