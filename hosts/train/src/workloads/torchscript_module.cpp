// The torchscript workload's model: loading, checks and failures (torchscript_module.h).
#include "workloads/torchscript_module.h"

#include <pthread.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/script.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <optional>
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

namespace {

// torch::jit::load compiles the module's code with a parser and an IR emitter that recurse per
// nesting level (long operator chains, elif chains, nested brackets...): a few tens of thousands of
// levels overflow an 8 MiB stack. It runs on a thread of its own with a 1 GiB stack, reserved and
// touched only as deep as it goes. open_module_archive caps the code at 4 MiB and nested brackets
// and prefix operators at 1000 per statement (at about 800 bytes of stack per byte of code, the
// costliest forms); of the forms it does not count, the costliest measured needs about 170.
constexpr size_t kLoadStack = size_t{1} << 30;

torch::jit::Module load_on_a_deep_stack(std::shared_ptr<caffe2::serialize::ReadAdapterInterface> archive,
                                        const at::Device& device) {
  struct Job {
    std::shared_ptr<caffe2::serialize::ReadAdapterInterface> archive;
    at::Device device;
    std::optional<torch::jit::Module> module;
    std::exception_ptr error;
  } job{std::move(archive), device, std::nullopt, nullptr};
  void* (*run)(void*) = [](void* p) -> void* {
    auto& j = *static_cast<Job*>(p);
    try {
      j.module = torch::jit::load(j.archive, j.device);
    } catch (...) {
      j.error = std::current_exception();
    }
    return nullptr;
  };
  pthread_attr_t attr;
  pthread_t thread;
  if (pthread_attr_init(&attr) != 0) return torch::jit::load(job.archive, job.device);
  const bool started =
      pthread_attr_setstacksize(&attr, kLoadStack) == 0 && pthread_create(&thread, &attr, run, &job) == 0;
  pthread_attr_destroy(&attr);
  if (!started) return torch::jit::load(job.archive, job.device);  // no room for that stack: here
  pthread_join(thread, nullptr);
  if (job.error) std::rethrow_exception(job.error);
  return std::move(*job.module);
}

}  // namespace

torch::jit::Module load_module(const std::string& file, const at::Device& device) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) throw Error(ErrorCategory::data, "--model " + file + " is not a file");
  try {
    // Opened once and its zip directory checked: torch::jit::load allocates what records declare.
    return load_on_a_deep_stack(open_module_archive(file, ErrorCategory::data, "--model"), device);
  } catch (const Error&) {
    throw;  // it could not be opened
  } catch (const std::exception& e) {
    const std::string what = e.what();  // the frontend's reports may start with a blank line
    const size_t start = std::min(what.find_first_not_of("\n "), what.size());
    throw Error(ErrorCategory::data, "--model " + file +
                                         " is not a TorchScript module (save one with "
                                         "torch.jit.script(model).save(FILE)): " +
                                         what.substr(start, what.find('\n', start) - start));
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
