// PyTorch's state_dict layouts (torch/optim/optimizer.py state_dict(), torch/amp/grad_scaler.py
// state_dict()), built as IValues and pickled by LibTorch.
#include "ampkit/pytorch_state.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/scalar_tensor.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>

#include "ampkit/error.h"
#include "torch_unpickler.h"

namespace ampkit {

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCategory::checkpoint, message);
}

c10::impl::GenericDict string_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream o;
  o << shape;
  return o.str();
}

// A plain python list (an IntList would be pickled as torch.jit's build_intlist).
c10::IValue int_list(int64_t first, int64_t count) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (int64_t i = 0; i < count; ++i) list.push_back(c10::IValue(first + i));
  return list;
}

// dict[key] of a string-keyed dict, or nullopt.
std::optional<c10::IValue> entry(const c10::IValue& dict, const std::string& key) {
  if (!dict.isGenericDict()) return std::nullopt;
  for (const auto& e : dict.toGenericDict())
    if (e.key().isString() && e.key().toStringRef() == key) return e.value();
  return std::nullopt;
}

double number(const c10::IValue& v, const std::string& what, const std::string& where) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  fail(where + ": " + what + " is not a number (" + v.tagKind() + ")");
}

c10::IValue required(const c10::IValue& dict, const std::string& key, const std::string& where) {
  auto v = entry(dict, key);
  if (!v) fail(where + ": no '" + key + "' entry");
  return *v;
}

std::string short_number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", v);
  return text;
}

void same(double saved, double ours, const std::string& what, const std::string& where) {
  if (saved != ours)
    fail(where + ": the optimizer state was saved with " + what + " " + short_number(saved) +
         ", this run uses " + short_number(ours));
}

at::Tensor state_tensor(const c10::IValue& state, const std::string& key, const at::Tensor& param,
                        const std::string& where) {
  const c10::IValue v = required(state, key, where);
  if (!v.isTensor()) fail(where + ": '" + key + "' is not a tensor");
  const at::Tensor t = v.toTensor();
  if (t.sizes() != param.sizes())
    fail(where + ": '" + key + "' has shape " + shape_text(t.sizes()) + ", the parameter " +
         shape_text(param.sizes()));
  return t.to(param.options()).clone();
}

// The hyperparameters that shape the state must be this run's (the learning rate is the schedule's).
void check_hyperparameters(const c10::IValue& g, const torch::optim::OptimizerOptions& options, bool adamw,
                           const std::string& gw) {
  if (adamw) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(options);
    const c10::IValue betas = required(g, "betas", gw);
    if (!betas.isTuple() || betas.toTupleRef().elements().size() != 2) fail(gw + ": 'betas' is not a pair");
    same(number(betas.toTupleRef().elements()[0], "betas[0]", gw), std::get<0>(o.betas()), "beta1", gw);
    same(number(betas.toTupleRef().elements()[1], "betas[1]", gw), std::get<1>(o.betas()), "beta2", gw);
    same(number(required(g, "eps", gw), "eps", gw), o.eps(), "eps", gw);
    same(number(required(g, "weight_decay", gw), "weight_decay", gw), o.weight_decay(),
         "weight_decay (--weight-decay)", gw);
    if (const auto a = entry(g, "amsgrad"))
      same(number(*a, "amsgrad", gw), o.amsgrad() ? 1 : 0, "amsgrad", gw);
    if (const auto d = entry(g, "decoupled_weight_decay"); d && number(*d, "decoupled_weight_decay", gw) == 0)
      fail(gw + ": the state is Adam's (decoupled_weight_decay False), this run uses AdamW");
  } else {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
    same(number(required(g, "momentum", gw), "momentum", gw), o.momentum(), "momentum", gw);
    same(number(required(g, "weight_decay", gw), "weight_decay", gw), o.weight_decay(),
         "weight_decay (--weight-decay)", gw);
  }
}

}  // namespace

// torch::pickle_save without its type tags: LibTorch's pickler marks typed lists and dicts with
// torch.jit._pickle globals by default, which python's torch.load(weights_only=True) refuses.
// The archive is the one torch.save writes (data.pkl, data/<i> per tensor).
std::vector<char> pickle_bytes(const c10::IValue& value) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t n) { pickled.insert(pickled.end(), bytes, bytes + n); }, nullptr, nullptr,
      nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      const char* bytes = static_cast<const char*>(data);
      archive.insert(archive.end(), bytes, bytes + n);
      return n;
    });
    size_t i = 0;
    for (const auto& t : pickler.tensorData()) {
      const torch::jit::WriteableTensorData w = torch::jit::getWriteableTensorData(t);
      writer.writeRecord("data/" + std::to_string(i++), w.data(), w.sizeInBytes());
    }
    writer.writeRecord("data.pkl", pickled.data(), pickled.size());
    writer.writeEndOfFile();
  }
  return archive;
}

c10::IValue tensor_dict(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::impl::GenericDict dict = string_dict();
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().to(at::kCPU).contiguous());
  return dict;
}

c10::IValue optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  const bool sgd = dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr;
  if (!adamw && !sgd) fail("a PyTorch optimizer state_dict is written for AdamW and SGD only");
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (auto& group : optimizer.param_groups()) {
    c10::impl::GenericDict g = string_dict();
    if (adamw) {
      const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
      g.insert("lr", o.lr());
      g.insert("betas", c10::ivalue::Tuple::create({std::get<0>(o.betas()), std::get<1>(o.betas())}));
      g.insert("eps", o.eps());
      g.insert("weight_decay", o.weight_decay());
      g.insert("amsgrad", o.amsgrad());
      g.insert("maximize", false);
      g.insert("foreach", c10::IValue());
      g.insert("capturable", false);
      g.insert("differentiable", false);
      g.insert("fused", true);
      g.insert("decoupled_weight_decay", true);
    } else {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      g.insert("lr", o.lr());
      g.insert("momentum", o.momentum());
      g.insert("dampening", o.dampening());
      g.insert("weight_decay", o.weight_decay());
      g.insert("nesterov", o.nesterov());
      g.insert("maximize", false);
      g.insert("foreach", c10::IValue());
      g.insert("differentiable", false);
      g.insert("fused", c10::IValue());
    }
    const int64_t first = index;
    for (auto& p : group.params()) {
      const auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) {
        c10::impl::GenericDict s = string_dict();
        if (adamw) {
          const auto& a = static_cast<const torch::optim::AdamWParamState&>(*it->second);
          s.insert("step", at::scalar_tensor(static_cast<double>(a.step()), at::kFloat));
          s.insert("exp_avg", a.exp_avg().detach().to(at::kCPU).contiguous());
          s.insert("exp_avg_sq", a.exp_avg_sq().detach().to(at::kCPU).contiguous());
          if (a.max_exp_avg_sq().defined())
            s.insert("max_exp_avg_sq", a.max_exp_avg_sq().detach().to(at::kCPU).contiguous());
        } else {
          const auto& m = static_cast<const torch::optim::SGDParamState&>(*it->second);
          s.insert("momentum_buffer",
                   m.momentum_buffer().defined()
                       ? c10::IValue(m.momentum_buffer().detach().to(at::kCPU).contiguous())
                       : c10::IValue());
        }
        state.insert(index, s);
      }
      ++index;
    }
    g.insert("params", int_list(first, index - first));
    groups.push_back(g);
  }
  c10::impl::GenericDict out = string_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void load_optimizer_state_dict(const c10::IValue& sd, torch::optim::Optimizer& optimizer,
                               const std::string& where) {
  auto* adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer);
  auto* sgd = dynamic_cast<torch::optim::SGD*>(&optimizer);
  if (!adamw && !sgd) fail(where + ": only AdamW and SGD state can be loaded from a PyTorch state_dict");
  const c10::IValue groups_value = required(sd, "param_groups", where);
  const c10::IValue state_value = required(sd, "state", where);
  if (!groups_value.isList() || !state_value.isGenericDict())
    fail(where + ": 'param_groups' must be a list and 'state' a dict, as optimizer.state_dict() writes them");
  const auto groups = groups_value.toList();
  if (groups.size() != optimizer.param_groups().size())
    fail(where + ": the optimizer state has " + std::to_string(groups.size()) +
         " parameter group(s), this run " + std::to_string(optimizer.param_groups().size()));
  // Saved index -> this run's parameter, group by group (python's load_state_dict does the same).
  std::map<int64_t, at::Tensor> by_index;
  std::map<int64_t, size_t> group_of;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const c10::IValue g = groups.get(gi);
    auto& group = optimizer.param_groups()[gi];
    const c10::IValue params = required(g, "params", where);
    if (!params.isList() || params.toList().size() != group.params().size())
      fail(where + ": parameter group " + std::to_string(gi) + " has " +
           std::to_string(params.isList() ? params.toList().size() : 0) + " parameters, this run's model " +
           std::to_string(group.params().size()) + " (another architecture?)");
    for (size_t k = 0; k < group.params().size(); ++k) {
      const c10::IValue id = params.toList().get(k);
      if (!id.isInt())
        fail(where + ": parameter group " + std::to_string(gi) + " lists a non-integer parameter id");
      by_index[id.toInt()] = group.params()[k];
      group_of[id.toInt()] = gi;
    }
    check_hyperparameters(g, group.options(), adamw != nullptr,
                          where + " (parameter group " + std::to_string(gi) + ")");
  }
  at::NoGradGuard no_grad;
  std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> loaded;
  for (const auto& e : state_value.toGenericDict()) {
    if (!e.key().isInt()) fail(where + ": 'state' keys must be parameter indices");
    const int64_t id = e.key().toInt();
    const auto p = by_index.find(id);
    if (p == by_index.end())
      fail(where + ": 'state' holds parameter " + std::to_string(id) + ", which no group lists");
    const std::string pw = where + " (state of parameter " + std::to_string(id) + ")";
    const c10::IValue& s = e.value();
    if (adamw) {
      auto a = std::make_unique<torch::optim::AdamWParamState>();
      const double step = number(required(s, "step", pw), "step", pw);
      if (!(step >= 0) || step != static_cast<double>(static_cast<int64_t>(step)))
        fail(pw + ": 'step' must be a non-negative whole number, got " + std::to_string(step));
      a->step(static_cast<int64_t>(step));
      a->exp_avg(state_tensor(s, "exp_avg", p->second, pw));
      a->exp_avg_sq(state_tensor(s, "exp_avg_sq", p->second, pw));
      const auto& o =
          static_cast<const torch::optim::AdamWOptions&>(optimizer.param_groups()[group_of[id]].options());
      if (o.amsgrad()) a->max_exp_avg_sq(state_tensor(s, "max_exp_avg_sq", p->second, pw));
      loaded.emplace_back(p->second.unsafeGetTensorImpl(), std::move(a));
    } else {
      auto m = std::make_unique<torch::optim::SGDParamState>();
      const auto buffer = entry(s, "momentum_buffer");
      if (buffer && !buffer->isNone()) m->momentum_buffer(state_tensor(s, "momentum_buffer", p->second, pw));
      loaded.emplace_back(p->second.unsafeGetTensorImpl(), std::move(m));
    }
  }
  // Everything checked: only now replace the optimizer's state.
  optimizer.state().clear();
  for (auto& [key, value] : loaded) optimizer.state()[key] = std::move(value);
}

c10::IValue grad_scaler_state_dict(const GradScalerState& s) {
  c10::impl::GenericDict d = string_dict();
  d.insert("scale", s.scale);
  d.insert("growth_factor", s.growth_factor);
  d.insert("backoff_factor", s.backoff_factor);
  d.insert("growth_interval", s.growth_interval);
  d.insert("_growth_tracker", s.growth_tracker);
  return d;
}

GradScalerState grad_scaler_state_from(const c10::IValue& sd, const std::string& where) {
  if (!sd.isGenericDict()) fail(where + ": the scaler entry is not a dict (GradScaler.state_dict())");
  GradScalerState s;
  s.scale = number(required(sd, "scale", where), "scale", where);
  s.growth_factor = number(required(sd, "growth_factor", where), "growth_factor", where);
  s.backoff_factor = number(required(sd, "backoff_factor", where), "backoff_factor", where);
  s.growth_interval =
      static_cast<int64_t>(number(required(sd, "growth_interval", where), "growth_interval", where));
  s.growth_tracker =
      static_cast<int64_t>(number(required(sd, "_growth_tracker", where), "_growth_tracker", where));
  if (!(s.scale > 0) || !std::isfinite(s.scale)) fail(where + ": scaler scale must be finite and > 0");
  return s;
}

namespace {

std::vector<std::pair<std::string, at::Tensor>> tensors_of(const c10::IValue& dict,
                                                           const std::string& where) {
  if (!dict.isGenericDict()) fail(where + " is not a state_dict ({name: tensor})");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& e : dict.toGenericDict()) {
    if (!e.key().isString() || !e.value().isTensor())
      fail(where + " is not a state_dict: entry '" + (e.key().isString() ? e.key().toStringRef() : "?") +
           "' is not a tensor");
    out.emplace_back(e.key().toStringRef(), e.value().toTensor());
  }
  return out;
}

}  // namespace

PyTorchStart read_pytorch_file(const std::filesystem::path& file, const std::string& where) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) fail(where + ": not a readable file");
  const c10::IValue top = checkpoint_files::load_torch_file(file, where);
  if (!top.isGenericDict()) fail(where + ": holds a " + top.tagKind() + ", not a dict");
  PyTorchStart out;
  const auto model = entry(top, "model") ? entry(top, "model") : entry(top, "model_state_dict");
  if (!model) {
    out.model = tensors_of(top, where);
    return out;
  }
  out.model = tensors_of(*model, where + " ['model']");
  const auto optimizer =
      entry(top, "optimizer") ? entry(top, "optimizer") : entry(top, "optimizer_state_dict");
  if (optimizer) out.optimizer = *optimizer;
  if (const auto scaler = entry(top, "scaler"); scaler && !scaler->isNone())
    out.scaler = grad_scaler_state_from(*scaler, where + " ['scaler']");
  // Training scripts save more beside the states (epoch, step, args, lr_scheduler...): those are
  // named, not refused; what is loaded stays strict (keys and shapes).
  for (const auto& e : top.toGenericDict()) {
    if (!e.key().isString()) fail(where + ": an entry whose key is a " + e.key().tagKind() + ", not a name");
    const std::string& key = e.key().toStringRef();
    if (key != "model" && key != "model_state_dict" && key != "optimizer" && key != "optimizer_state_dict" &&
        key != "scaler")
      out.ignored.push_back(key);
  }
  return out;
}

void load_state_dict_into(const std::vector<std::pair<std::string, at::Tensor>>& source,
                          const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                          const std::string& where) {
  std::map<std::string, at::Tensor> given(source.begin(), source.end());
  std::string missing, unexpected;
  for (const auto& [name, t] : tensors)
    if (!given.count(name)) missing += (missing.empty() ? "" : ", ") + name;
  std::map<std::string, bool> ours;
  for (const auto& [name, t] : tensors) ours[name] = true;
  for (const auto& [name, t] : source)
    if (!ours.count(name)) unexpected += (unexpected.empty() ? "" : ", ") + name;
  if (!missing.empty() || !unexpected.empty())
    fail(where +
         ": the state_dict does not fit the model: " + (missing.empty() ? "" : "missing keys: " + missing) +
         (missing.empty() || unexpected.empty() ? "" : "; ") +
         (unexpected.empty() ? "" : "unexpected keys: " + unexpected));
  for (const auto& [name, t] : tensors)
    if (given[name].sizes() != t.sizes())
      fail(where + ": '" + name + "' has shape " + shape_text(given[name].sizes()) + " in the file, " +
           shape_text(t.sizes()) + " in the model");
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : tensors) const_cast<at::Tensor&>(t).copy_(given[name].to(t.options()));
}

c10::IValue read_torch_file(const std::filesystem::path& file, const std::string& where) {
  return checkpoint_files::load_torch_file(file, where);
}

}  // namespace ampkit
