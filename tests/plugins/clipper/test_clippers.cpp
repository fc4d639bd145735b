// Clipper tests: norm, value, agc and adaptive against golden values of the references they match
// (tools/golden/clipper_goldens.py -> tests/data/clipper_goldens.json), and through the Trainer
// with a loss scale of 65536, where clipping must act on the unscaled gradients.
#define BOOST_TEST_MODULE clippers
#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"
#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "recording_sgd.h"
#include "tensor_compare.h"
#include "test_paths.h"

using namespace ampkit;
using nlohmann::json;

namespace {

const json& goldens() {
  static const json data = [] {
    const std::string path = std::string(ampkit::test::source_dir()) + "/tests/data/clipper_goldens.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path + " (run tools/golden/clipper_goldens.py)");
    return json::parse(in);
  }();
  return data;
}

// Tensors of the golden shapes from flat lists; fp32 inputs round-trip exactly through doubles.
std::vector<at::Tensor> tensors(const json& lists, at::ScalarType dtype = at::kFloat) {
  std::vector<at::Tensor> out;
  const json& shapes = goldens()["shapes"];
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::vector<double> values = lists[i].get<std::vector<double>>();
    const std::vector<int64_t> shape = shapes[i].get<std::vector<int64_t>>();
    out.push_back(at::tensor(values, at::kDouble).reshape(shape).to(dtype));
  }
  return out;
}

std::vector<at::Tensor> golden_grads() {
  return tensors(goldens()["grads"]);
}
std::vector<at::Tensor> golden_params() {
  return tensors(goldens()["params"]);
}
std::vector<double> norm_sequence() {
  return goldens()["norm_sequence"].get<std::vector<double>>();
}

std::vector<at::Tensor> detach_all(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.detach());
  return out;
}

using ampkit::test::clone_all;
using ampkit::test::max_rel_error;

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!at::equal(a[i], b[i])) return false;
  return true;
}

double rel(double ours, double ref) {
  return ref == 0 ? std::abs(ours) : std::abs(ours - ref) / std::abs(ref);
}

std::string text(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

// What the engine's statistics pass reports for gradients that are already unscaled.
StepStats unscaled_stats(const std::vector<at::Tensor>& grads, int64_t step = 0) {
  const GradStats g = compute_grad_stats(grads);
  StepStats s;
  s.step = step;
  s.grad_norm_scaled = s.grad_norm = std::sqrt(g.sum_squares);
  s.grad_max_abs_scaled = s.grad_max_abs = g.max_abs;
  s.grad_elements = g.elements;
  for (double t : g.tensor_sum_squares) s.tensor_norms.push_back(std::sqrt(t));
  return s;
}

StepStats norm_only(double norm, int64_t step) {
  StepStats s;
  s.step = step;
  s.grad_norm = s.grad_norm_scaled = norm;
  return s;
}

struct Plugins : ampkit::test::BuiltinPlugins {
  // A strategy set whose clipper is `name` (the others default); the libraries stay loaded for
  // the process (never unloaded).
  std::unique_ptr<StrategySet> clipper(const std::string& name,
                                       std::map<std::string, std::string> options = {}) {
    return strategies({{"clipper", choice(name, std::move(options))}});
  }
};

GradClipper* as_clipper(const std::unique_ptr<StrategySet>& s) {
  return &s->clipper();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Parity on identical gradients
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(norm_equals_clip_grad_norm_for_l2_and_inf) {
  Plugins plugins;
  const std::vector<at::Tensor> grads = golden_grads();
  const StepStats stats = unscaled_stats(grads);
  BOOST_TEST(goldens()["norm"].size() == 4u);
  for (const json& c : goldens()["norm"]) {
    const std::string norm_type = c["norm_type"];
    const double max_norm = c["max_norm"];
    BOOST_TEST_CONTEXT("norm_type " << norm_type << " max_norm " << max_norm) {
      auto clipper = plugins.clipper("norm", {{"max_norm", text(max_norm)}, {"norm_type", norm_type}});
      BOOST_TEST(!as_clipper(clipper)->clips_elementwise());  // stays in the single multiply
      const ClipResult r = as_clipper(clipper)->clip(stats);
      std::vector<at::Tensor> ours = clone_all(grads);
      scale_grads_(ours, r.coefficient);
      const double total = norm_type == "inf" ? stats.grad_max_abs : stats.grad_norm;
      const double norm_error = rel(total, c["total_norm"].get<double>());
      const double grad_error = max_rel_error(ours, tensors(c["grads"], at::kDouble));
      BOOST_TEST_MESSAGE("norm " << norm_type << " max_norm " << max_norm << ": norm rel err " << norm_error
                                 << ", gradients rel err " << grad_error);
      BOOST_TEST(norm_error <= 1e-6);
      BOOST_TEST(grad_error <= 1e-6);
      BOOST_TEST((r.coefficient < 1.0) == (max_norm < total));
      BOOST_TEST(r.threshold == max_norm);
    }
  }
}

BOOST_AUTO_TEST_CASE(value_equals_clip_grad_value_bit_for_bit) {
  Plugins plugins;
  const std::vector<at::Tensor> grads = golden_grads();
  const std::vector<at::Tensor> params = golden_params();
  const StepStats stats = unscaled_stats(grads);
  BOOST_TEST(goldens()["value"].size() == 2u);
  for (const json& c : goldens()["value"]) {
    const double clip_value = c["clip_value"];
    const int64_t clamped = c["clamped_elements"];
    BOOST_TEST_CONTEXT("clip_value " << clip_value << " (" << clamped << " elements clamped)") {
      auto clipper = plugins.clipper("value", {{"clip_value", text(clip_value)}});
      GradClipper* value = as_clipper(clipper);
      BOOST_TEST(value->clips_elementwise());
      const ClipResult r = value->clip(stats);
      BOOST_TEST(r.coefficient == 1.0);  // no global coefficient: the clamp is the whole rule
      BOOST_TEST(r.threshold == clip_value);
      std::vector<at::Tensor> ours = clone_all(grads);
      const double ratio = value->clip_unscaled_gradients(detach_all(params), ours);
      BOOST_TEST(all_equal(ours, tensors(c["grads"])));
      if (clamped > 0) {
        BOOST_TEST(ratio < 1.0);
        BOOST_TEST(rel(ratio, c["norm_ratio"].get<double>()) <= 1e-5);
      } else {
        BOOST_TEST(ratio == 1.0);
        BOOST_TEST(all_equal(ours, grads));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(agc_equals_timm_adaptive_clip_grad) {
  Plugins plugins;
  const std::vector<at::Tensor> grads = golden_grads();
  const std::vector<at::Tensor> params = golden_params();
  BOOST_TEST(goldens()["agc"].size() == 2u);
  for (const json& c : goldens()["agc"]) {
    const double clip_factor = c["clip_factor"], eps = c["eps"];
    BOOST_TEST_CONTEXT("clip_factor " << clip_factor << " eps " << eps) {
      auto clipper = plugins.clipper("agc", {{"clip_factor", text(clip_factor)}, {"eps", text(eps)}});
      GradClipper* agc = as_clipper(clipper);
      BOOST_TEST(agc->clips_elementwise());
      BOOST_TEST(agc->clip(unscaled_stats(grads)).coefficient == 1.0);
      std::vector<at::Tensor> ours = clone_all(grads);
      const double ratio = agc->clip_unscaled_gradients(detach_all(params), ours);
      const double error = max_rel_error(ours, tensors(c["grads"], at::kDouble));
      BOOST_TEST_MESSAGE("agc clip_factor " << clip_factor << ": gradients rel err " << error
                                            << ", norm ratio " << ratio << " (golden " << c["norm_ratio"]
                                            << ")");
      BOOST_TEST(error <= 1e-6);
      BOOST_TEST(c["clipped_units"].get<int>() > 0);
      BOOST_TEST(ratio < 1.0);
      BOOST_TEST(rel(ratio, c["norm_ratio"].get<double>()) <= 1e-5);
      BOOST_TEST(all_equal(detach_all(params), golden_params()));  // weights are only read
    }
  }
}

BOOST_AUTO_TEST_CASE(agc_skip_last_leaves_the_trailing_parameters_alone) {
  Plugins plugins;
  const std::vector<at::Tensor> grads = golden_grads();
  auto clipper =
      plugins.clipper("agc", {{"clip_factor", "0.01"}, {"skip_last", "2"}});  // timm's 0.01, eps 1e-3
  std::vector<at::Tensor> ours = clone_all(grads);
  as_clipper(clipper)->clip_unscaled_gradients(detach_all(golden_params()), ours);
  const std::vector<at::Tensor> expected = tensors(goldens()["agc"][0]["grads"], at::kDouble);
  const size_t n = grads.size();
  BOOST_TEST(max_rel_error({ours.begin(), ours.end() - 2}, {expected.begin(), expected.end() - 2}) <= 1e-6);
  BOOST_TEST(at::equal(ours[n - 1], grads[n - 1]));
  BOOST_TEST(at::equal(ours[n - 2], grads[n - 2]));
  // The last weight is clipped by the unskipped run, so skipping it made a difference.
  BOOST_TEST(!at::allclose(expected[n - 1], grads[n - 1].to(at::kDouble)));
}

BOOST_AUTO_TEST_CASE(percentile_equals_autoclip_over_the_recorded_norms) {
  Plugins plugins;
  const std::vector<double> norms = norm_sequence();
  BOOST_TEST(norms.size() == 300u);
  BOOST_TEST(goldens()["percentile"].size() == 3u);
  for (const json& c : goldens()["percentile"]) {
    const double p = c["percentile"];
    const int64_t history = c["history"];
    BOOST_TEST_CONTEXT("percentile " << p << " history " << history) {
      auto clipper = plugins.clipper(
          "adaptive",
          {{"method", "percentile"}, {"percentile", text(p)}, {"history", std::to_string(history)}});
      const auto coefs = c["coefficients"].get<std::vector<double>>();
      const auto thresholds = c["thresholds"].get<std::vector<double>>();
      double worst_coef = 0, worst_threshold = 0;
      int clipped = 0, golden_clipped = 0;
      for (size_t t = 0; t < norms.size(); ++t) {
        const ClipResult r = as_clipper(clipper)->clip(norm_only(norms[t], static_cast<int64_t>(t)));
        worst_coef = std::max(worst_coef, rel(r.coefficient, coefs[t]));
        worst_threshold = std::max(worst_threshold, rel(r.threshold, thresholds[t]));
        clipped += r.coefficient < 1.0;
        golden_clipped += coefs[t] < 1.0;
      }
      BOOST_TEST_MESSAGE(
          "percentile " << p << " history " << history << ": " << clipped << "/300 steps clipped, "
                        << "coefficient rel err " << worst_coef << ", threshold rel err " << worst_threshold);
      BOOST_TEST(worst_coef <= 1e-9);
      BOOST_TEST(worst_threshold <= 1e-9);
      BOOST_TEST(clipped == golden_clipped);
      BOOST_TEST(clipped > 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(zscore_equals_zclip_over_the_recorded_norms) {
  Plugins plugins;
  const std::vector<double> norms = norm_sequence();
  BOOST_TEST(goldens()["zscore"].size() == 3u);
  for (const json& c : goldens()["zscore"]) {
    std::map<std::string, std::string> options = {
        {"method", "zscore"},
        {"alpha", text(c["alpha"])},
        {"z_thresh", text(c["z_thresh"])},
        {"warmup_steps", std::to_string(c["warmup_steps"].get<int>())},
        {"clip_factor", text(c["clip_factor"])}};
    if (!c["max_norm"].is_null()) options["max_norm"] = text(c["max_norm"]);
    BOOST_TEST_CONTEXT("alpha " << c["alpha"] << " z_thresh " << c["z_thresh"] << " max_norm "
                                << c["max_norm"]) {
      auto clipper = plugins.clipper("adaptive", options);
      const auto coefs = c["coefficients"].get<std::vector<double>>();
      double worst = 0;
      int clipped = 0, golden_clipped = 0, exact_ones = 0;
      for (size_t t = 0; t < norms.size(); ++t) {
        const ClipResult r = as_clipper(clipper)->clip(norm_only(norms[t], static_cast<int64_t>(t)));
        worst = std::max(worst, rel(r.coefficient, coefs[t]));
        clipped += r.coefficient < 1.0;
        golden_clipped += coefs[t] < 1.0;
        exact_ones += (coefs[t] == 1.0) == (r.coefficient == 1.0);
      }
      BOOST_TEST_MESSAGE("zscore alpha " << c["alpha"] << " max_norm " << c["max_norm"] << ": " << clipped
                                         << "/300 steps clipped, coefficient rel err " << worst);
      BOOST_TEST(worst <= 1e-9);
      BOOST_TEST(clipped == golden_clipped);
      BOOST_TEST(exact_ones == static_cast<int>(norms.size()));  // unclipped steps are exactly 1
      BOOST_TEST(clipped > 0);
      const State s = clipper->clipper().save();
      BOOST_TEST(rel(s.get<double>("mean"), c["mean"].get<double>()) <= 1e-9);
      BOOST_TEST(rel(s.get<double>("var"), c["var"].get<double>()) <= 1e-9);
    }
  }
  // ZClip's defaults clip exactly the spikes after warm-up (the one at step 10 is in it).
  const auto defaults = goldens()["zscore"][0]["coefficients"].get<std::vector<double>>();
  std::vector<int> spikes;
  for (size_t t = 0; t < defaults.size(); ++t)
    if (defaults[t] < 1.0) spikes.push_back(static_cast<int>(t));
  BOOST_TEST(spikes == std::vector<int>({40, 41, 120, 200, 250}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(percentile_history_bound_and_max_norm_by_hand) {
  Plugins plugins;
  // p = 50 over [1], [1, 2], [2, 3] (history 2) is 1, 1.5, 2.5; max_norm 2 caps the last.
  auto clipper = plugins.clipper(
      "adaptive", {{"method", "percentile"}, {"percentile", "50"}, {"history", "2"}, {"max_norm", "2"}});
  const double norms[] = {1.0, 2.0, 3.0};
  const double thresholds[] = {1.0, 1.5, 2.0};
  for (int t = 0; t < 3; ++t) {
    const ClipResult r = as_clipper(clipper)->clip(norm_only(norms[t], t));
    BOOST_TEST(r.threshold == thresholds[t]);
    BOOST_TEST(r.coefficient == thresholds[t] / (norms[t] + 1e-6));  // clip_grad_norm_'s 1e-6
  }
  BOOST_TEST(clipper->clipper().save().get<std::vector<double>>("history") == std::vector<double>({2.0, 3.0}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(adaptive_resumes_exactly_from_its_saved_state) {
  Plugins plugins;
  const std::vector<double> norms = norm_sequence();
  for (const std::string method : {"percentile", "zscore"}) {
    BOOST_TEST_CONTEXT("method " << method) {
      auto whole = plugins.clipper("adaptive", {{"method", method}, {"history", "100"}});
      auto first = plugins.clipper("adaptive", {{"method", method}, {"history", "100"}});
      auto second = plugins.clipper("adaptive", {{"method", method}, {"history", "100"}});
      std::vector<double> a, b;
      for (size_t t = 0; t < norms.size(); ++t) {
        a.push_back(as_clipper(whole)->clip(norm_only(norms[t], t)).coefficient);
        // Stop in the middle and continue in a fresh object from the saved state.
        GradClipper* active = as_clipper(t < 150 ? first : second);
        if (t == 150) second->clipper().load(first->clipper().save());
        b.push_back(active->clip(norm_only(norms[t], t)).coefficient);
      }
      BOOST_TEST(a == b, boost::test_tools::per_element());
      auto warm = plugins.clipper("adaptive", {{"method", method}});
      auto resumed = plugins.clipper("adaptive", {{"method", method}});
      for (size_t t = 0; t < 20; ++t) as_clipper(warm)->clip(norm_only(norms[t], t));
      resumed->clipper().load(warm->clipper().save());
      BOOST_TEST((resumed->clipper().save() == warm->clipper().save()));
    }
  }
  auto zscore = plugins.clipper("adaptive", {{"method", "zscore"}});
  auto percentile = plugins.clipper("adaptive", {{"method", "percentile"}});
  // Through the strategy set every call is a plugin call: the plugin's exception arrives as a
  // plugin error naming the clipper and the call.
  BOOST_CHECK_EXCEPTION(percentile->clipper().load(zscore->clipper().save()), ampkit::Error,
                        [](const ampkit::Error& e) {
                          const std::string what = e.what();
                          return e.category() == ampkit::ErrorCategory::plugin &&
                                 what.find("clipper 'adaptive'") != std::string::npos &&
                                 what.find("failed in load()") != std::string::npos &&
                                 what.find("method=zscore") != std::string::npos &&
                                 what.find("method=percentile") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(bad_option_values_are_refused_with_the_option_named) {
  Plugins plugins;
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> bad = {
      {"value", {{"clip_value", "0"}}},     {"agc", {{"clip_factor", "-0.01"}}},
      {"adaptive", {{"method", "median"}}}, {"adaptive", {{"percentile", "101"}}},
      {"adaptive", {{"alpha", "1"}}},       {"adaptive", {{"warmup_steps", "0"}}},
  };
  for (const auto& [name, options] : bad) {
    const std::string option = options.begin()->first;
    BOOST_TEST_CONTEXT(name << " " << option << "=" << options.begin()->second) {
      BOOST_CHECK_EXCEPTION(plugins.clipper(name, options), Error, [&](const Error& e) {
        return e.category() == ErrorCategory::usage &&
               std::string(e.what()).find(option) != std::string::npos;
      });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Through the Trainer, with a loss scale of 65536
// ---------------------------------------------------------------------------------------------

namespace {

constexpr double kScale = 65536.0;

using ampkit::test::RecordingSGD;

// The golden parameters, and a loss sum_i <p_i, G_i> whose gradient is exactly G_i: backward of
// loss * 65536 gives 65536 * G_i exactly (a power of two), as a real scaled fp16 backward would.
struct GoldenRun {
  Plugins plugins;
  std::unique_ptr<StrategySet> others =
      plugins.strategies({{"scaler", Plugins::choice("static", {{"scale", text(kScale)}})}});
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> initial;
  std::vector<std::string> names;
  RecordingSGD optimizer;
  std::unique_ptr<Trainer> trainer;

  explicit GoldenRun(GradClipper* clipper)
      : params(make_params()),
        initial(clone_all(params)),
        names(make_names()),
        optimizer(params, torch::optim::SGDOptions(1.0)) {
    LrSchedule schedule;
    schedule.base_lr = 1.0;
    trainer = std::make_unique<Trainer>(
        Precision::fp32, 1, params, names, optimizer,
        TrainerStrategies{&others->scaler(), clipper, &others->nan_policy(), &others->comm()}, schedule);
  }

  StepOutcome step(const std::vector<at::Tensor>& grads) {
    return trainer->step([&](int) {
      at::Tensor loss = at::zeros({}, at::kFloat);
      for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * grads[i]).sum();
      return loss;
    });
  }

  static std::vector<at::Tensor> make_params() {
    std::vector<at::Tensor> p;
    for (auto& t : golden_params()) p.push_back(t.clone().requires_grad_(true));
    return p;
  }
  static std::vector<std::string> make_names() {
    std::vector<std::string> n;
    for (size_t i = 0; i < goldens()["shapes"].size(); ++i) n.push_back("p" + std::to_string(i));
    return n;
  }
};

// The parameters after one SGD step (lr 1) equal initial - expected up to 1e-6 of the update and
// the fp32 rounding of the subtraction.
bool parameters_follow(const std::vector<at::Tensor>& after, const std::vector<at::Tensor>& initial,
                       const std::vector<at::Tensor>& expected_grads) {
  for (size_t i = 0; i < after.size(); ++i) {
    const at::Tensor ref = initial[i].to(at::kDouble) - expected_grads[i].to(at::kDouble);
    const at::Tensor err = (after[i].to(at::kDouble) - ref).abs();
    const at::Tensor allowed = expected_grads[i].to(at::kDouble).abs().max() * 1e-6 +
                               ref.abs() * std::numeric_limits<float>::epsilon();
    if (!at::all(err <= allowed).item<bool>()) return false;
  }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(trainer_step_with_scale_65536_equals_the_golden_unscaled_then_clipped_gradients) {
  Plugins plugins;
  const json& g = goldens();
  struct Case {
    std::string name;
    std::map<std::string, std::string> options;
    const json* golden;
    bool exact;
  };
  const std::vector<Case> cases = {
      {"norm", {{"max_norm", text(g["norm"][0]["max_norm"])}, {"norm_type", "2"}}, &g["norm"][0], false},
      {"norm", {{"max_norm", text(g["norm"][2]["max_norm"])}, {"norm_type", "inf"}}, &g["norm"][2], false},
      {"value", {{"clip_value", text(g["value"][0]["clip_value"])}}, &g["value"][0], true},
      {"agc", {{"clip_factor", text(g["agc"][0]["clip_factor"])}}, &g["agc"][0], false},
  };
  const std::vector<at::Tensor> grads = golden_grads();
  const double golden_norm = g["norm"][0]["total_norm"];
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.name << " " << (c.options.empty() ? "" : c.options.begin()->second)) {
      auto clipper = plugins.clipper(c.name, c.options);
      GoldenRun run(as_clipper(clipper));
      const StepOutcome out = run.step(grads);
      const std::vector<at::Tensor> expected =
          tensors((*c.golden)["grads"], c.exact ? at::kFloat : at::kDouble);
      BOOST_TEST(out.stepped);
      BOOST_TEST(out.stats.scale == kScale);
      BOOST_TEST(rel(out.stats.grad_norm_scaled, kScale * golden_norm) <= 1e-6);
      BOOST_TEST(rel(out.stats.grad_norm, golden_norm) <= 1e-6);
      BOOST_TEST(run.optimizer.seen.size() == grads.size());
      if (c.exact)
        BOOST_TEST(all_equal(run.optimizer.seen, expected));
      else
        BOOST_TEST(max_rel_error(run.optimizer.seen, expected) <= 1e-6);
      BOOST_TEST(parameters_follow(run.params, run.initial, expected));
      // The metrics: clip_coef < 1, and grad_norm_clipped is the norm the optimizer got.
      const double norm_ratio = c.golden->contains("norm_ratio")
                                    ? (*c.golden)["norm_ratio"].get<double>()
                                    : (*c.golden)["max_norm"].get<double>() / (golden_norm + 1e-6);
      BOOST_TEST(out.clip_coefficient < 1.0);
      if (c.options.count("norm_type") && c.options.at("norm_type") == "inf")
        continue;  // coef from the inf-norm
      BOOST_TEST(rel(out.clip_coefficient, norm_ratio) <= 1e-5);
      BOOST_TEST(rel(out.grad_norm_clipped, golden_norm * norm_ratio) <= 1e-5);
    }
  }
}

BOOST_AUTO_TEST_CASE(trainer_with_adaptive_clippers_follows_the_golden_coefficients) {
  Plugins plugins;
  const std::vector<double> norms = norm_sequence();
  const std::vector<at::Tensor> base = golden_grads();
  const double base_norm = goldens()["norm"][0]["total_norm"];
  struct Case {
    std::string method;
    const json* golden;
  };
  // The defaults of both methods (percentile 10 / history 1000; ZClip's alpha, z_thresh, warm-up).
  for (const Case& c :
       {Case{"percentile", &goldens()["percentile"][0]}, Case{"zscore", &goldens()["zscore"][0]}}) {
    BOOST_TEST_CONTEXT("method " << c.method) {
      auto clipper = plugins.clipper("adaptive", {{"method", c.method}});
      GoldenRun run(as_clipper(clipper));
      const auto coefs = (*c.golden)["coefficients"].get<std::vector<double>>();
      double worst_coef = 0, worst_grad = 0;
      int clipped = 0;
      // 60 steps: zscore's warm-up (with a spike at step 10) and the spikes at 40 and 41.
      for (size_t t = 0; t < 60; ++t) {
        // The golden gradients rescaled to this step's recorded norm (in fp32: norm within 1e-7).
        std::vector<at::Tensor> grads;
        for (const auto& b : base)
          grads.push_back((b.to(at::kDouble) * (norms[t] / base_norm)).to(at::kFloat));
        const StepOutcome out = run.step(grads);
        BOOST_TEST_REQUIRE(out.stepped);
        worst_coef = std::max(worst_coef, rel(out.clip_coefficient, coefs[t]));
        clipped += out.clip_coefficient < 1.0;
        std::vector<at::Tensor> expected;
        for (const auto& x : grads) expected.push_back(x.to(at::kDouble) * coefs[t]);
        worst_grad = std::max(worst_grad, max_rel_error(run.optimizer.seen, expected));
      }
      BOOST_TEST_MESSAGE("trainer, adaptive " << c.method << ": " << clipped
                                              << "/60 steps clipped, coefficient rel err " << worst_coef
                                              << ", gradients rel err " << worst_grad);
      BOOST_TEST(worst_coef <= 1e-5);
      BOOST_TEST(worst_grad <= 1e-5);
      int golden_clipped = 0;
      for (size_t t = 0; t < 60; ++t) golden_clipped += coefs[t] < 1.0;
      BOOST_TEST(clipped == golden_clipped);
      BOOST_TEST(clipped > 0);
    }
  }
}

namespace {

// A third-party clipper that tries every way the public API offers to see gradients: the
// statistics, the tensors handed to clip_unscaled_gradients, their parameters' .grad(), and
// parameter handles kept until the next step's clip(), when the real gradients ARE scaled.
class SnoopingClipper final : public GradClipper {
 public:
  std::vector<StepStats> stats;
  std::vector<std::vector<at::Tensor>> handed;
  int parameter_grads_defined = 0;
  int kept_grads_defined = 0;
  std::vector<at::Tensor> kept;
  // Test-only access to the real parameters, to show the scaled gradients exist at that moment.
  std::vector<at::Tensor> real;
  std::vector<at::Tensor> real_grads_during_clip;

  ClipResult clip(const StepStats& s) override {
    stats.push_back(s);
    for (const auto& p : kept) kept_grads_defined += p.grad().defined();
    real_grads_during_clip.clear();
    for (const auto& p : real) real_grads_during_clip.push_back(p.grad().clone());
    return {0.5, 0.0};
  }
  bool clips_elementwise() const override { return true; }
  double clip_unscaled_gradients(const std::vector<at::Tensor>& parameters,
                                 const std::vector<at::Tensor>& grads) override {
    handed.push_back(clone_all(grads));
    for (const auto& p : parameters) parameter_grads_defined += p.grad().defined();
    kept = parameters;
    return 1.0;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_clipper_cannot_reach_scaled_gradients_through_the_public_api) {
  SnoopingClipper snoop;
  GoldenRun run(&snoop);
  snoop.real = run.params;
  const std::vector<at::Tensor> grads = golden_grads();
  std::vector<at::Tensor> scaled, halved;
  for (const auto& x : grads) {
    scaled.push_back(x * static_cast<float>(kScale));
    halved.push_back(x * 0.5f);
  }
  const GradStats g = compute_grad_stats(grads);
  for (int step = 0; step < 2; ++step) {
    const StepOutcome out = run.step(grads);
    BOOST_TEST(out.stepped);
    // The scaled gradients exist while clip() runs (this is what a mistaken clipper would clip)...
    BOOST_TEST(all_equal(snoop.real_grads_during_clip, scaled));
  }
  // ...but the statistics a clipper gets are unscaled,
  BOOST_TEST(snoop.stats.size() == 2u);
  for (const StepStats& s : snoop.stats) {
    BOOST_TEST(s.scale == kScale);
    BOOST_TEST(rel(s.grad_norm, std::sqrt(g.sum_squares)) <= 1e-12);
    BOOST_TEST(s.grad_max_abs == g.max_abs);
    BOOST_TEST(s.grad_norm_scaled == s.grad_norm * kScale);  // exposed for logging, never applied
    for (size_t i = 0; i < s.tensor_norms.size(); ++i)
      BOOST_TEST(rel(s.tensor_norms[i], std::sqrt(g.tensor_sum_squares[i])) <= 1e-12);
  }
  // the tensors it is handed are unscaled (and already multiplied by its own coefficient 0.5),
  BOOST_TEST(snoop.handed.size() == 2u);
  for (const auto& h : snoop.handed) BOOST_TEST(all_equal(h, halved));
  // and neither the parameters it is handed nor the ones it kept until the next step's clip()
  // lead to any gradient.
  BOOST_TEST(snoop.parameter_grads_defined == 0);
  BOOST_TEST(snoop.kept.size() == grads.size());
  BOOST_TEST(snoop.kept_grads_defined == 0);
  BOOST_TEST(all_equal(run.optimizer.seen, halved));
}
