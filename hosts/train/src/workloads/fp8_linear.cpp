// ampkit-train's fp8 linear: ampkit.fp8.Linear's casts and gemms in C++, its scales kept in one block.
#include "workloads/fp8_linear.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/_scaled_mm.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ampkit/error.h"

namespace ampkit::train {

namespace {

const char* const kRoleNames[] = {"input", "weight", "grad_output"};
// The trace's summary, as bench/fp8_recipes.py records it: log2|x| in 1/32-binade bins over
// [2^-80, 2^24) (smaller values in the first, larger in the last, zeros apart), 64 largest values.
constexpr int64_t kTraceLow = -80, kTraceHigh = 24, kTracePerBinade = 32, kTraceTop = 64;
constexpr int64_t kTraceBins = (kTraceHigh - kTraceLow) * kTracePerBinade;

// torch 2.11's casts do not saturate (an E4M3 value past 464 is NaN): clamp first, as the Python layer.
at::Tensor cast_saturated(const at::Tensor& t, const at::Tensor& scale, double max, at::ScalarType dtype) {
  return (t.to(at::kFloat) * scale).clamp(-max, max).to(dtype);
}

// (a * inv_a) @ (b * inv_b): A row-major and B column-major, the layouts cuBLASLt requires.
at::Tensor scaled_mm(at::Tensor a, const at::Tensor& inv_a, at::Tensor b, const at::Tensor& inv_b,
                     at::ScalarType out, bool fast_accum) {
  if (a.stride(-1) != 1) a = a.contiguous();
  if (b.stride(0) != 1) b = b.t().contiguous().t();
  if (!a.is_cpu()) return at::_scaled_mm(a, b, inv_a, inv_b, std::nullopt, std::nullopt, out, fast_accum);
  // On the CPU, ATen's emulated path: oneDNN's fp8 gemm runs about 500 times slower on CPUs
  // without fp8 units, and the emulated one equals dequantize + float32 matmul bit for bit
  // (docs/fp8.md). The switch is process-wide; the host's forward and backward run on this thread.
  at::Context& context = at::globalContext();
  const bool onednn = context.userEnabledMkldnn();
  context.setUserEnabledMkldnn(false);
  at::Tensor result;
  try {
    result = at::_scaled_mm(a, b, inv_a, inv_b, std::nullopt, std::nullopt, out, fast_accum);
  } catch (...) {
    context.setUserEnabledMkldnn(onednn);
    throw;
  }
  context.setUserEnabledMkldnn(onednn);
  return result;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x @ weight^T in fp8; saved for backward are the forward's fp8 copies and inverse scales, the bits
// torchao would recast from the high-precision tensors.
struct Fp8Matmul : torch::autograd::Function<Fp8Matmul> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            Fp8Linears* layers, int64_t layer, bool record) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    const Fp8Linears::Cast cx = layers->cast_for(layer, 0, x2, record);
    const Fp8Linears::Cast cw = layers->cast_for(layer, 1, weight, record);
    const at::Tensor inv_x = cx.scale.reciprocal(), inv_w = cw.scale.reciprocal();
    const at::Tensor out = scaled_mm(cx.fp8, inv_x, cw.fp8.t(), inv_w, x.scalar_type(), true);
    ctx->save_for_backward({cx.fp8, cw.fp8, inv_x, inv_w, cx.amax, cw.amax});
    ctx->saved_data["layers"] = reinterpret_cast<int64_t>(layers);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["record"] = record;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = out.size(-1);
    return out.reshape(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    auto* layers = reinterpret_cast<Fp8Linears*>(ctx->saved_data["layers"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const bool record = ctx->saved_data["record"].toBool();
    const at::Tensor& g = grads[0];
    const at::Tensor g2 = g.reshape({-1, g.size(-1)});
    const Fp8Linears::Cast cg = layers->cast_for(layer, 2, g2, record);
    if (record) layers->make_due();
    const at::Tensor inv_g = cg.scale.reciprocal();
    at::Tensor grad_x, grad_w;
    if (ctx->needs_input_grad(0))
      grad_x = scaled_mm(cg.fp8, inv_g, saved[1], saved[3], g.scalar_type(), false)
                   .reshape(ctx->saved_data["x_sizes"].toIntVector());
    if (ctx->needs_input_grad(1)) {
      // A non-finite amax (an inf the casts clamped to the format's maximum) makes this weight
      // gradient NaN, as the high-precision matmul's would be and as ampkit.fp8's is: the NaN
      // policy sees a bad step even where no bias gradient carries the inf. 0 * amax is 0 or NaN,
      // and costs no host read.
      const at::Tensor bad =
          (saved[4].to(at::kFloat) + saved[5].to(at::kFloat) + cg.amax.to(at::kFloat)) * 0.0;
      grad_w = scaled_mm(cg.fp8.t(), inv_g + bad, saved[0], saved[2], g.scalar_type(), false);
    }
    return {grad_x, grad_w, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::ScalarType dtype_of(const char* format) {
  return std::strcmp(format, "e5m2") == 0 ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
}

}  // namespace

Fp8Linears::Fp8Linears(Fp8Recipe& recipe, std::string recipe_name, int64_t layers, const at::Device& device)
    : recipe_(recipe),
      recipe_name_(std::move(recipe_name)),
      layers_(layers),
      window_(recipe.history_length()),
      current_(recipe.current_scaling()),
      eps_(recipe.current_eps()) {
  for (int64_t r = 0; r < kFp8RoleCount; ++r) {
    const char* format = recipe_.format(r);
    dtypes_[r] = dtype_of(format);
    max_[r] = fp8_format_max(format);
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::ones({kFp8RoleCount * layers_}, f32);
  amax_ = at::zeros({kFp8RoleCount * layers_}, f32);
  saturated_ = at::zeros({kFp8RoleCount}, f32.dtype(at::kDouble));
  scale_host_.assign(kFp8RoleCount * layers_, 1.0f);
  history_.assign(kFp8RoleCount * layers_ * window_, 0.0f);
  for (int64_t i = 0; i < layers_; ++i)
    for (int64_t r = 0; r < kFp8RoleCount; ++r) roles_.push_back(r);
}

// Under current scaling fp8_max / max(amax, eps) in float64, rounded to float32: torchao's
// amax_to_scale, whose `float / tensor` torch computes as reciprocal() * float.
at::Tensor Fp8Linears::scale_of(int64_t layer, int64_t role, const at::Tensor& amax) const {
  if (current_) return (at::clamp_min(amax.to(at::kDouble), eps_).reciprocal() * max_[role]).to(at::kFloat);
  return scale_.select(0, kFp8RoleCount * layer + role);
}

Fp8Linears::Cast Fp8Linears::cast_for(int64_t layer, int64_t role, const at::Tensor& t, bool record) {
  const at::Tensor amax = t.abs().max();
  const at::Tensor scale = scale_of(layer, role, amax);
  if (record) {
    at::Tensor slot = amax_.narrow(0, kFp8RoleCount * layer + role, 1);
    at::maximum_out(slot, slot, amax.to(at::kFloat));
    // Elements the clamp will change, counted on the device: no host read per layer.
    saturated_.narrow(0, role, 1).add_((t.to(at::kFloat).abs() * scale).gt(max_[role]).sum());
    counted_[role] += static_cast<double>(t.numel());
    if (trace_.is_open()) note_trace(kFp8RoleCount * layer + role, t);
  }
  return {cast_saturated(t, scale, max_[role], dtypes_[role]), scale, amax};
}

at::Tensor Fp8Linears::linear(int64_t layer, const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& bias) {
  at::Tensor input = x;
  const at::DeviceType type = x.device().type();
  // As at::linear under autocast: the input, and so the output, in autocast's dtype.
  if (at::autocast::is_autocast_enabled(type)) input = input.to(at::autocast::get_autocast_dtype(type));
  const bool record = at::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad());
  at::Tensor out = Fp8Matmul::apply(input, weight, this, layer, record);
  if (bias.defined()) out = out + bias.to(out.scalar_type());
  return out;
}

int64_t Fp8Linears::begin_step(CommBackend& comm) {
  if (!due_) return 0;
  due_ = false;
  at::NoGradGuard no_grad;
  at::Tensor amax = comm.world_size() > 1 ? std::get<0>(comm.all_gather(amax_).max(0)) : amax_;
  const at::Tensor host = amax.to(at::kCPU).contiguous();
  const int64_t bad = recipe_.update(static_cast<int64_t>(roles_.size()), roles_.data(),
                                     host.data_ptr<float>(), history_.data(), scale_host_.data());
  if (!current_)
    scale_.copy_(at::from_blob(scale_host_.data(), {static_cast<int64_t>(scale_host_.size())}, at::kFloat));
  amax_.zero_();
  saturated_.zero_();
  counted_ = {};
  if (trace_.is_open()) {
    trace_hist_.zero_();
    trace_top_.zero_();
    std::fill(trace_count_.begin(), trace_count_.end(), 0);
  }
  return bad;
}

nlohmann::json Fp8Linears::step_metrics() const {
  const at::Tensor amax = amax_.to(at::kCPU).contiguous();
  const at::Tensor saturated = saturated_.to(at::kCPU).contiguous();
  const float* a = amax.data_ptr<float>();
  nlohmann::json out = nlohmann::json::object();
  for (int64_t r = 0; r < kFp8RoleCount; ++r) {
    float amax_max = 0, scale_min = INFINITY;
    for (int64_t i = 0; i < layers_; ++i) {
      const float v = a[kFp8RoleCount * i + r];
      amax_max = std::isnan(v) || std::isnan(amax_max) ? NAN : std::max(amax_max, v);
      const float s = current_ ? static_cast<float>(max_[r] / std::max(static_cast<double>(v), eps_))
                               : scale_host_[kFp8RoleCount * i + r];
      scale_min = std::min(scale_min, s);
    }
    const double n = counted_[r];
    out[kRoleNames[r]] = {{"scale_min", scale_min},
                          {"amax_max", amax_max},
                          {"saturated", n > 0 ? saturated.data_ptr<double>()[r] / n : 0.0}};
  }
  return out;
}

std::vector<std::pair<std::string, double>> Fp8Linears::scalars(const nlohmann::json& metrics) {
  std::vector<std::pair<std::string, double>> out;
  for (const char* role : kRoleNames)
    for (const char* key : {"scale_min", "amax_max", "saturated"})
      if (metrics.contains(role) && metrics[role][key].is_number())
        out.emplace_back(std::string("fp8/") + role + "/" + key, metrics[role][key].get<double>());
  return out;
}

void Fp8Linears::open_trace(const std::string& path) {
  trace_.open(path, std::ios::out | std::ios::trunc);
  if (!trace_) throw Error(ErrorCategory::usage, "cannot write the fp8 trace file " + path);
  trace_path_ = path;
  const int64_t slots = kFp8RoleCount * layers_;
  trace_hist_ = at::zeros({slots, kTraceBins}, amax_.options().dtype(at::kLong));
  trace_top_ = at::zeros({slots, kTraceTop}, amax_.options());
  trace_count_.assign(slots, 0);
}

// The tensor as cast, before its scale and clamp: what any candidate scale would saturate or flush.
void Fp8Linears::note_trace(int64_t slot, const at::Tensor& t) {
  at::NoGradGuard no_grad;
  const at::Tensor a = t.detach().to(at::kFloat).abs().flatten();
  const at::Tensor bin =
      ((a.to(at::kDouble).log2() - kTraceLow) * kTracePerBinade).floor().clamp(0, kTraceBins - 1);
  // Zeros (and NaNs) counted in a bin past the last, then dropped: no host read for a mask.
  const at::Tensor counts = at::bincount(at::where(a > 0, bin, kTraceBins).to(at::kLong), {}, kTraceBins + 1);
  trace_hist_[slot].add_(counts.narrow(0, 0, kTraceBins));
  const at::Tensor top = at::cat({trace_top_[slot], std::get<0>(a.topk(std::min(kTraceTop, a.numel())))});
  trace_top_[slot].copy_(std::get<0>(top.topk(kTraceTop)));
  trace_count_[slot] += a.numel();
}

void Fp8Linears::write_trace(int64_t step) {
  if (!trace_.is_open()) return;
  const at::Tensor amax = amax_.to(at::kCPU).contiguous(), hist = trace_hist_.to(at::kCPU).contiguous();
  const at::Tensor top = trace_top_.to(at::kCPU).contiguous();
  for (int64_t slot = 0; slot < kFp8RoleCount * layers_; ++slot) {
    if (trace_count_[slot] == 0) continue;
    const int64_t* h = hist.data_ptr<int64_t>() + slot * kTraceBins;
    int64_t first = 0, last = kTraceBins;
    while (first < last && h[first] == 0) ++first;
    while (last > first && h[last - 1] == 0) --last;
    const float* t = top.data_ptr<float>() + slot * kTraceTop;
    trace_ << nlohmann::json{{"step", step},
                             {"layer", slot / kFp8RoleCount},
                             {"role", kRoleNames[slot % kFp8RoleCount]},
                             {"amax", amax.data_ptr<float>()[slot]},
                             {"count", trace_count_[slot]},
                             {"top", std::vector<float>(t, t + kTraceTop)},
                             {"hist_first", first},
                             {"hist", std::vector<int64_t>(h + first, h + last)}}
                  .dump()
           << '\n';
  }
  trace_.flush();
  if (!trace_)
    throw Error(ErrorCategory::output, "cannot write the fp8 trace file " + trace_path_ + " (disk full?)");
}

nlohmann::json Fp8Linears::state() const {
  const at::Tensor amax = amax_.to(at::kCPU).contiguous();
  const float* a = amax.data_ptr<float>();
  return {{"recipe", recipe_name_},
          {"layers", layers_},
          {"scale", scale_host_},
          {"history", history_},
          {"amax", std::vector<float>(a, a + amax.numel())},
          {"due", due_}};
}

void Fp8Linears::load_state(const nlohmann::json& state) {
  const auto scale = state.at("scale").get<std::vector<float>>();
  const auto history = state.at("history").get<std::vector<float>>();
  auto amax = state.at("amax").get<std::vector<float>>();
  if (state.at("layers").get<int64_t>() != layers_ || scale.size() != scale_host_.size() ||
      history.size() != history_.size() || amax.size() != scale_host_.size())
    throw Error(ErrorCategory::checkpoint,
                "the fp8 state holds " + std::to_string(state.at("layers").get<int64_t>()) + " layers and " +
                    std::to_string(history.size()) + " history values, this model has " +
                    std::to_string(layers_) + " fp8 layers and recipe '" + recipe_name_ + "' keeps " +
                    std::to_string(history_.size()));
  scale_host_ = scale;
  history_ = history;
  due_ = state.at("due").get<bool>();
  at::NoGradGuard no_grad;
  scale_.copy_(at::from_blob(scale_host_.data(), {static_cast<int64_t>(scale_host_.size())}, at::kFloat));
  amax_.copy_(at::from_blob(amax.data(), {static_cast<int64_t>(amax.size())}, at::kFloat));
}

}  // namespace ampkit::train
