// NaN detection and recovery through ampkit-train: --inject, the locator's reports for each
// workload, rollback (bit-exact snapshot, skipped batches, escalation) and exact counters.
#define BOOST_TEST_MODULE nan_recovery
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "train_process.h"

using namespace ampkit::test;

#define AMPKIT_CHECK_CONTAINS(text, part)                                \
  BOOST_CHECK_MESSAGE(std::string(text).find(part) != std::string::npos, \
                      "expected \"" << (part) << "\" in: \"" << (text) << "\"")

namespace {

const std::string mlp = tiny;  // layers.0, layers.1, layers.2
const std::string cnn =
    train + " --workload fashion-mnist --batch-size 16 --eval-batches 1 --progress never --threads 1";
const std::string gpt = train +
                        " --workload char-gpt --gpt-layers 1 --gpt-width 32 --gpt-heads 2 --gpt-context 16 "
                        "--batch-size 8 --eval-batches 1 --progress never --threads 1";
// Spikes are detected by the z-score on the loss and gradient norm (off by default).
const std::string spike_detection = " --opt nan_policy.spike_zscore=6 --opt nan_policy.spike_min_samples=5";

std::vector<nlohmann::json> read_jsonl(const fs::path& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

struct Located {
  nlohmann::json summary, report;
  Result result;
};

// Trains `steps` steps with one fault planted at `step` and returns the locator's report.
Located inject(const std::string& command, const std::string& fault, int64_t step, int64_t steps,
               const std::string& extra = "") {
  TempDir tmp;
  Located out;
  out.result = run(command + " --steps " + std::to_string(steps) + " --inject " + fault + " --summary " +
                   (tmp.path / "s.json").string() + extra);
  BOOST_TEST_REQUIRE(out.result.code == 0, fault << ": " << out.result.output);
  out.summary = read_json(tmp.path / "s.json");
  const fs::path report = tmp.path / ("nan-report-step-" + std::to_string(step) + "-rank-0.json");
  BOOST_TEST_REQUIRE(fs::exists(report), fault << ": no report; " << out.result.output);
  out.report = read_json(report);
  return out;
}

void check_located(const std::string& command, const std::string& kind, const std::string& layer,
                   const std::string& target = "output") {
  const bool spike = kind == "spike";
  const int64_t step = spike ? 8 : 3;
  const std::string fault = kind + "@step=" + std::to_string(step) + ",layer=" + layer + ",target=" + target;
  const Located r = inject(command, fault, step, step + 2, spike ? spike_detection : "");
  BOOST_TEST(r.report["located"].get<bool>(), fault);
  BOOST_TEST(r.report["module"].get<std::string>() == layer, fault << ": " << r.report["finding"]);
  BOOST_TEST(r.report["phase"].get<std::string>() == (target == "grad" ? "backward" : "forward"), fault);
  BOOST_TEST(r.report["step"].get<int64_t>() == step);
  // The bad step was skipped and the run went on to the requested count.
  BOOST_TEST(r.summary["steps"].get<int64_t>() == step + 2);
  BOOST_TEST(r.summary["skipped_steps"].get<int64_t>() == 1, fault);
  BOOST_TEST(r.summary["steps_taken"].get<int64_t>() == step + 1);
  BOOST_TEST(r.summary["nan_reports"].size() == 1u);
  const nlohmann::json located_by =
      r.summary.contains("located_by") ? r.summary["located_by"] : nlohmann::json();
  BOOST_TEST(located_by.dump() == "0", fault);  // the only rank located it
}

}  // namespace

BOOST_AUTO_TEST_CASE(locator_names_the_injected_layer_of_the_mlp) {
  check_located(mlp, "nan", "layers.1");
  check_located(mlp, "inf", "layers.0");
  check_located(mlp, "spike", "layers.1");
  check_located(mlp, "nan", "layers.1", "grad");
  check_located(mlp, "spike", "layers.0", "grad");
}

BOOST_AUTO_TEST_CASE(locator_names_the_injected_layer_of_the_cnn) {
  check_located(cnn, "nan", "conv2");
  check_located(cnn, "inf", "fc1");
  check_located(cnn, "spike", "conv1");
}

BOOST_AUTO_TEST_CASE(locator_names_the_injected_layer_of_the_gpt) {
  check_located(gpt, "nan", "blocks.0.qkv");
  check_located(gpt, "inf", "blocks.0.fc");
  // The final LayerNorm undoes a spike in the residual stream, so the GPT's spike goes where
  // nothing normalises it: the gradient of a block's MLP.
  check_located(gpt, "spike", "blocks.0.fc", "grad");
}

// A spike planted in the loss itself (no layer): every module output is normal and every gradient
// is only scaled by the loss, so the report blames the loss, not the layer nearest to it.
BOOST_AUTO_TEST_CASE(a_loss_spike_is_blamed_on_the_loss) {
  const Located r = inject(mlp, "spike@step=8", 8, 10, spike_detection);
  BOOST_TEST(r.report["located"].get<bool>());
  BOOST_TEST(r.report["phase"].get<std::string>() == "loss", r.report["finding"]);
  BOOST_TEST(r.report["module"].get<std::string>() == "");
  BOOST_TEST(r.report["finding"].get<std::string>().find("the loss is ") == 0u);
  const double ratio =
      r.report["micro_batch_loss"].get<double>() / r.report["reference_absmax"].get<double>();
  BOOST_TEST(ratio > 10.0);
  BOOST_TEST(r.result.output.find("locator: in the loss: the loss is ") != std::string::npos,
             r.result.output);
  BOOST_TEST(r.summary["skipped_steps"].get<int64_t>() == 1);
}

// on_spike=clip: the spike's step is applied, its gradient norm clipped to the detector's ceiling
// (mean + spike_zscore sd of the healthy steps' norms), recorded as its own action; the run ends
// where a run without the spike ends, within that run's step-to-step noise.
BOOST_AUTO_TEST_CASE(a_clipped_spike_is_applied_at_the_window_threshold) {
  TempDir tmp;
  const std::string common = tiny + " --steps 80" + spike_detection + " --metrics ";
  const Result clipped = run(common + (tmp.path / "clip.jsonl").string() +
                             " --opt nan_policy.on_spike=clip --inject spike@step=40");
  BOOST_TEST_REQUIRE(clipped.code == 0, clipped.output);
  const Result clean = run(common + (tmp.path / "clean.jsonl").string());
  BOOST_TEST_REQUIRE(clean.code == 0, clean.output);
  const auto c = read_jsonl(tmp.path / "clip.jsonl");
  const auto n = read_jsonl(tmp.path / "clean.jsonl");
  BOOST_TEST_REQUIRE(c.size() == 80u);
  const nlohmann::json& spike = c[40];
  BOOST_TEST(spike["action"].get<std::string>() == "clip");
  BOOST_TEST(spike["stepped"].get<bool>());
  BOOST_TEST(spike["skipped_steps"].get<int64_t>() == 0);
  BOOST_TEST(spike["reason"].get<std::string>().find("applied with the gradient norm clipped to") !=
             std::string::npos);
  // The threshold, recomputed from the metrics: every earlier step was healthy and in the window.
  double mean = 0, var = 0;
  for (int i = 0; i < 40; ++i) mean += c[i]["grad_norm"].get<double>() / 40.0;
  for (int i = 0; i < 40; ++i) var += std::pow(c[i]["grad_norm"].get<double>() - mean, 2) / 39.0;
  const double threshold = mean + 6.0 * std::sqrt(var);
  BOOST_TEST(spike["clip_threshold"].get<double>() == threshold, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(spike["grad_norm_clipped"].get<double>() == threshold, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(spike["grad_norm"].get<double>() > 100.0 * threshold);  // it really was a spike
  for (int i = 41; i < 80; ++i) BOOST_TEST(c[i]["action"].get<std::string>() == "proceed", i);
  // The end of the run: within the clean run's noise (sd of its last 10 losses).
  double clean_mean = 0, clean_var = 0, clip_mean = 0;
  for (int i = 70; i < 80; ++i) clean_mean += n[i]["loss"].get<double>() / 10.0;
  for (int i = 70; i < 80; ++i) clean_var += std::pow(n[i]["loss"].get<double>() - clean_mean, 2) / 9.0;
  for (int i = 70; i < 80; ++i) clip_mean += c[i]["loss"].get<double>() / 10.0;
  BOOST_TEST(std::abs(clip_mean - clean_mean) < std::sqrt(clean_var), clip_mean << " vs " << clean_mean);
}

// In fp16 a spike's activations stay finite but the scaled gradients behind them overflow: the
// first non-finite value is a gradient, and the report traces it back to the spiked layer.
BOOST_AUTO_TEST_CASE(fp16_gradient_overflow_is_traced_to_the_spiked_layer) {
  const Located r = inject(mlp + " --precision fp16 --scaler static --opt scaler.scale=32768",
                           "spike@step=3,layer=layers.1,factor=3000", 3, 4);
  BOOST_TEST(r.report["module"].get<std::string>() == "layers.1", r.report["finding"]);
  BOOST_TEST(r.report["phase"].get<std::string>() == "forward");
  AMPKIT_CHECK_CONTAINS(r.report["finding"].get<std::string>(), "then the gradient of");
  AMPKIT_CHECK_CONTAINS(r.report["detection"].get<std::string>(), "non-finite gradients");
}

BOOST_AUTO_TEST_CASE(report_describes_the_module_input_and_output) {
  const Located r = inject(mlp, "inf@step=2,layer=layers.1", 2, 3);
  const auto& o = r.report["observation"];
  BOOST_TEST(r.report["module_type"].get<std::string>() == "Linear");
  BOOST_TEST(o["output"]["nonfinite"].get<int64_t>() == 1);  // one planted element
  BOOST_TEST(o["output"]["dtype"].get<std::string>() == "Float");
  BOOST_TEST((o["output"]["shape"] == nlohmann::json{32, 32}));
  BOOST_TEST(o["input"]["nonfinite"].get<int64_t>() == 0);
  BOOST_TEST(o["input"]["absmax"].get<double>() > 0);
  // Every module before it was observed and finite.
  BOOST_TEST(r.report["forward"][0]["module"].get<std::string>() == "layers.0");
  BOOST_TEST(r.report["forward"][0]["output"]["nonfinite"].get<int64_t>() == 0);
}

BOOST_AUTO_TEST_CASE(fault_in_the_loss_is_reported_as_the_loss) {
  const Located r = inject(mlp, "nan@step=1", 1, 2);
  BOOST_TEST(r.report["phase"].get<std::string>() == "loss");
  BOOST_TEST(r.report["module"].get<std::string>() == "");
}

BOOST_AUTO_TEST_CASE(fault_on_another_rank_is_not_planted) {
  TempDir tmp;
  const Result r =
      run(mlp + " --steps 4 --inject nan@step=1,rank=0 --summary " + (tmp.path / "a.json").string());
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  BOOST_TEST(read_json(tmp.path / "a.json")["skipped_steps"].get<int64_t>() == 1);
  // rank=1 does not exist in a one-process run: refused up front.
  const Result bad = run(mlp + " --steps 4 --inject nan@step=1,rank=1");
  BOOST_TEST(bad.code == 2);
  AMPKIT_CHECK_CONTAINS(bad.output, "rank 1 does not exist in a run of 1 rank(s)");
}

BOOST_AUTO_TEST_CASE(locator_is_off_with_nan_locate_0_and_capped_otherwise) {
  TempDir tmp;
  const std::string faults = " --inject nan@step=1 --inject nan@step=2 --inject nan@step=3";
  Result r = run(mlp + " --steps 5 --nan-locate 2 --nan-report-dir " + (tmp.path / "r").string() + faults);
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  BOOST_TEST(fs::exists(tmp.path / "r" / "nan-report-step-1-rank-0.json"));
  BOOST_TEST(fs::exists(tmp.path / "r" / "nan-report-step-2-rank-0.json"));
  BOOST_TEST(!fs::exists(tmp.path / "r" / "nan-report-step-3-rank-0.json"));
  r = run(mlp + " --steps 5 --nan-locate 0 --nan-report-dir " + (tmp.path / "off").string() + faults);
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  BOOST_TEST(!fs::exists(tmp.path / "off"));
}

BOOST_AUTO_TEST_CASE(bad_inject_specs_give_one_line_and_exit_2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"nan", "no '@' after the fault kind"},
      {"nane@step=1", "unknown fault kind 'nane'; did you mean 'nan'?"},
      {"nan@layer=layers.0", "step=N is required"},
      {"nan@step=-1", "step must be a non-negative integer, got '-1'"},
      {"nan@step=x1", "step must be a non-negative integer, got 'x1'"},
      {"nan@step=1,stp=2", "unknown key 'stp'; did you mean 'step'?"},
      {"nan@step=1,step=2", "step is given twice"},
      {"nan@step=1,layer", "'layer' is not KEY=VALUE"},
      {"nan@step=1,factor=10", "factor applies to spike faults only"},
      {"spike@step=1,factor=0.5", "factor must be a number > 1, got '0.5'"},
      {"nan@step=1,target=weights", "target must be output or grad, got 'weights'"},
      {"nan@step=1,target=grad", "target=grad needs layer=NAME"},
      {"nan@step=1,layer=layers.9", "the model has no layer 'layers.9'; did you mean 'layers.0'?"},
      {"nan@step=1,layer=layers", "the model has no layer 'layers'"},
  };
  for (const auto& [spec, message] : cases) {
    const Result r = run(mlp + " --steps 3 --inject '" + spec + "'");
    BOOST_TEST(r.code == 2, spec << ": " << r.output);
    AMPKIT_CHECK_CONTAINS(r.output, message);
    BOOST_TEST(std::count(r.output.begin(), r.output.end(), '\n') == 1, spec << ": " << r.output);
  }
}

// The rollback must restore the parameters of the snapshot bit for bit: a run rolled back to
// the snapshot taken after 20 optimizer steps ends with the parameters of a 20-step run.
BOOST_AUTO_TEST_CASE(rollback_restores_the_snapshot_bit_for_bit) {
  TempDir tmp;
  const auto summary = [&](const std::string& name) { return read_json(tmp.path / name); };
  Result r = run(mlp + " --steps 20 --summary " + (tmp.path / "a.json").string());
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  const std::string sha20 = summary("a.json")["param_sha256"];
  r = run(mlp + " --steps 25 --nan-policy rollback --opt nan_policy.snapshot_every=10 --inject nan@step=24" +
          " --summary " + (tmp.path / "b.json").string());
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  const auto b = summary("b.json");
  BOOST_TEST(b["param_sha256"].get<std::string>() == sha20);
  BOOST_TEST(b["rollbacks"].get<int64_t>() == 1);
  BOOST_TEST(b["steps"].get<int64_t>() == 25);
  BOOST_TEST(b["steps_taken"].get<int64_t>() == 20);
  BOOST_TEST(b["skipped_steps"].get<int64_t>() == 1);    // step 24
  BOOST_TEST(b["steps_discarded"].get<int64_t>() == 4);  // steps 20..23, applied then undone
  AMPKIT_CHECK_CONTAINS(r.output, "rolled back to the in-memory snapshot before step 20");
}

BOOST_AUTO_TEST_CASE(rollback_to_the_newest_checkpoint) {
  TempDir tmp;
  Result r = run(mlp + " --steps 20 --summary " + (tmp.path / "a.json").string());
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  r = run(mlp + " --steps 25 --nan-policy rollback --opt nan_policy.snapshot=checkpoint --checkpoint-dir " +
          (tmp.path / "ck").string() + " --checkpoint-every 10 --inject nan@step=24 --summary " +
          (tmp.path / "b.json").string());
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  const auto b = read_json(tmp.path / "b.json");
  BOOST_TEST(b["param_sha256"] == read_json(tmp.path / "a.json")["param_sha256"]);
  BOOST_TEST(b["steps_discarded"].get<int64_t>() == 4);
  AMPKIT_CHECK_CONTAINS(r.output, "rolled back to the " + (tmp.path / "ck" / "step-20").string());
  // Without a checkpoint folder there is nothing to roll back to: refused before training.
  r = run(mlp + " --steps 5 --nan-policy rollback --opt nan_policy.snapshot=checkpoint");
  BOOST_TEST(r.code == 2);
  AMPKIT_CHECK_CONTAINS(r.output, "give --checkpoint-dir");
}

// After a rollback at step N with skip_batches K, step N+1 trains on data position N+1+K, and
// the learning rate restarts from the snapshot's position in the schedule.
BOOST_AUTO_TEST_CASE(rollback_skips_exactly_the_documented_batches) {
  TempDir tmp;
  const fs::path metrics = tmp.path / "m.jsonl";
  const Result r = run(mlp + " --steps 30 --lr 0.01 --warmup-steps 100 --nan-policy rollback" +
                       " --opt nan_policy.snapshot_every=10 --opt nan_policy.skip_batches=3" +
                       " --inject nan@step=24 --metrics " + metrics.string());
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  const auto records = read_jsonl(metrics);
  BOOST_TEST_REQUIRE(records.size() == 30u);
  for (const auto& rec : records) {
    const int64_t step = rec["step"];
    BOOST_TEST(rec["data_step"].get<int64_t>() == (step <= 24 ? step : step + 3), "step " << step);
  }
  BOOST_TEST(records[24]["action"].get<std::string>() == "rollback");
  BOOST_TEST(records[24]["rollbacks"].get<int64_t>() == 1);
  // Warm-up lr(k) = 0.01 (k + 1) / 100 for k taken steps: step 23 ran with k = 23, step 25 with
  // k = 20 again (the snapshot's).
  BOOST_TEST(records[23]["lr"].get<double>() == 0.01 * 24 / 100, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(records[25]["lr"].get<double>() == 0.01 * 21 / 100, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(rollback_escalates_from_skip_to_rollback_to_abort_with_a_checkpoint) {
  TempDir tmp;
  const Result r =
      run(mlp + " --steps 30 --nan-policy rollback --opt nan_policy.rollback_after=2" +
          " --opt nan_policy.max_rollbacks=1 --opt nan_policy.snapshot_every=5" +
          " --inject nan@step=10 --inject nan@step=11 --inject nan@step=20 --inject nan@step=21" +
          " --checkpoint-dir " + (tmp.path / "ck").string() + " --summary " + (tmp.path / "s.json").string() +
          " --metrics " + (tmp.path / "m.jsonl").string());
  BOOST_TEST(r.code == 5, r.output);
  const auto s = read_json(tmp.path / "s.json");
  BOOST_TEST(s["status"].get<std::string>() == "aborted");
  BOOST_TEST(s["aborted"].get<bool>());
  BOOST_TEST(s["rollbacks"].get<int64_t>() == 1);
  BOOST_TEST(s["steps"].get<int64_t>() == 22);         // stopped at step 21
  BOOST_TEST(s["skipped_steps"].get<int64_t>() == 4);  // 10, 11 (rollback), 20, 21 (abort)
  AMPKIT_CHECK_CONTAINS(s["abort_reason"].get<std::string>(), "already rolled back 1 times");
  const auto records = read_jsonl(tmp.path / "m.jsonl");
  BOOST_TEST(records[10]["action"].get<std::string>() == "skip");
  BOOST_TEST(records[11]["action"].get<std::string>() == "rollback");
  BOOST_TEST(records[20]["action"].get<std::string>() == "skip");
  BOOST_TEST(records[21]["action"].get<std::string>() == "abort");
  // The abort left a checkpoint of the last good parameters to resume from.
  BOOST_TEST(fs::exists(tmp.path / "ck" / "step-22" / "manifest.json"));
  BOOST_TEST(read_json(tmp.path / "ck" / "step-22" / "manifest.json")["param_sha256"] == s["param_sha256"]);
}

// A run that rolled back and skipped batches resumes from a later checkpoint exactly: the data
// position, the discarded/rollback counters and the LR schedule position all come back.
BOOST_AUTO_TEST_CASE(resume_after_a_rollback_is_exact) {
  TempDir tmp;
  const std::string policy =
      " --nan-policy rollback --opt nan_policy.snapshot_every=5"
      " --opt nan_policy.skip_batches=3 --inject nan@step=12 --warmup-steps 50";
  Result r = run(mlp + " --steps 30" + policy + " --summary " + (tmp.path / "a.json").string());
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  const std::string ck = " --checkpoint-dir " + (tmp.path / "ck").string();
  r = run(mlp + " --steps 20" + policy + ck);
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  r = run(mlp + " --steps 30" + policy + ck + " --resume auto --summary " + (tmp.path / "b.json").string());
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  const auto a = read_json(tmp.path / "a.json"), b = read_json(tmp.path / "b.json");
  BOOST_TEST(b["param_sha256"] == a["param_sha256"]);
  for (const char* key : {"steps", "steps_taken", "skipped_steps", "steps_discarded", "rollbacks"})
    BOOST_TEST(b[key] == a[key], key);
}
