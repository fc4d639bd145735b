// The rules kernel's half of the self-check (kernel_self_check.h): a fixed table of steps (clean,
// growing, capped, overflows spending the hysteresis, NaN, non-finite losses, aborts, both clip
// norms, a constant scale, a stopped run, no loss, a reduction, awkward factors, a growth delay) run
// by the kernel and by the host, compared bit for bit.
#include <ATen/Functions.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/step_rules_abi.h"
#include "kernel_self_check.h"
#include "step_rules_kernel.h"

namespace ampkit {

namespace {

// One case's float64 numbers: the inputs (sum of squares, max-abs, zeros, loss, group elements),
// the state, then the record; its float32 ones: the scale, grad_scale and found_inf.
constexpr int kInputs = 0, kState = 5, kRecord = kState + AMPKIT_RULE_STATE;
constexpr int kDoubles = kRecord + AMPKIT_RECORD_GROUP_ELEMENTS + 1, kFloats = 3;

struct RulesCase {
  ampkit_step_rules rules;
  double inputs[5];  // sum of squares, max-abs, zeros, loss, group elements
  bool loss = true, group = false;
  double state[AMPKIT_RULE_STATE] = {0, 2, 0, 0};
  float scale = 1024.0f;
};

ampkit_step_rules dynamic_norm_skip() {
  ampkit_step_rules r{};
  r.dynamic = 1;
  r.scaler.growth_factor = 2.0;
  r.scaler.backoff_factor = 0.5;
  r.scaler.growth_interval = 3;
  r.scaler.hysteresis = 2;
  r.scaler.min_scale = 1.0f;
  r.scaler.max_scale = 16777216.0f;
  r.clip_norm = 1;
  r.max_norm = 1.0;
  return r;
}

std::vector<RulesCase> rules_cases() {
  const ampkit_step_rules base = dynamic_norm_skip();
  const double inf = INFINITY, nan = NAN;
  std::vector<RulesCase> cases(17, RulesCase{base, {4e6, 900.0, 3.0, 0.75, 0.0}});
  cases[1].state[AMPKIT_RULE_GROWTH] = 2;  // grows
  cases[2].state[AMPKIT_RULE_GROWTH] = 2;  // grows into max_scale
  cases[2].scale = 16777216.0f;
  cases[3].inputs[0] = inf;                                              // an overflow spends hysteresis
  cases[4].inputs[0] = inf, cases[4].state[AMPKIT_RULE_HYSTERESIS] = 1;  // ...and backs off
  cases[4].rules.scaler.backoff_factor = 1.0 / 3.0;                      // by an inexact factor
  cases[5].inputs[0] = nan, cases[5].inputs[1] = nan;                    // NaN
  cases[6].inputs[3] = inf, cases[6].rules.policy.backoff = 1;           // the policy's backoff
  cases[7].inputs[3] = nan, cases[7].rules.policy.abort_on_nonfinite_loss = 1;
  cases[8].inputs[0] = inf, cases[8].scale = 1.0f, cases[8].rules.scaler.abort_at_min_scale = 1;
  cases[8].state[AMPKIT_RULE_HYSTERESIS] = 1;
  cases[9].inputs[0] = inf, cases[9].rules.policy.max_consecutive = 3,
  cases[9].state[AMPKIT_RULE_CONSECUTIVE] = 2;
  cases[10].rules.inf_norm = 1, cases[10].inputs[1] = 5000.0;  // the inf-norm clip
  cases[11].rules.dynamic = 0, cases[11].rules.clip_norm = 0;  // constant, no clip
  cases[12].state[AMPKIT_RULE_STOPPED] = 1;                    // after an abort
  cases[13].loss = false, cases[13].group = true, cases[13].inputs[4] = 123457.0;
  cases[14].inputs[0] = 1e-300, cases[14].scale = 3.0f, cases[14].rules.max_norm = 1e-160;
  cases[15].rules.scaler.growth_factor = 1.1, cases[15].state[AMPKIT_RULE_GROWTH] = 2;  // awkward products
  cases[15].scale = 3.0f;
  cases[16].inputs[0] = inf, cases[16].rules.scaler.growth_delay = 1;  // the count restarts at -1
  return cases;
}

// The cases' numbers before a run: the same on both sides (outputs a run leaves alone compare equal).
void lay_out(const std::vector<RulesCase>& cases, double* d, float* f, unsigned char* b) {
  for (size_t i = 0; i < cases.size(); ++i) {
    double* row = d + i * kDoubles;
    for (int k = 0; k < kDoubles; ++k) row[k] = -7.0;
    std::memcpy(row + kInputs, cases[i].inputs, sizeof cases[i].inputs);
    std::memcpy(row + kState, cases[i].state, sizeof cases[i].state);
    f[i * kFloats] = cases[i].scale;
    f[i * kFloats + 1] = f[i * kFloats + 2] = -7.0f;
    b[i] = 0xAB;
  }
}

// Every case on `device` (the kernel on a GPU, the scalar function it runs on the CPU), with the
// numbers at d, f and b there.
void run_cases(const std::vector<RulesCase>& cases, double* d, float* f, unsigned char* b,
               const at::Device& device) {
  for (size_t i = 0; i < cases.size(); ++i) {
    double* row = d + i * kDoubles;
    ampkit_step_pointers p{};
    p.sum_squares = row + kInputs;
    p.max_abs = row + kInputs + 1;
    p.zeros = row + kInputs + 2;
    p.loss = cases[i].loss ? row + kInputs + 3 : nullptr;
    p.group_elements = cases[i].group ? row + kInputs + 4 : nullptr;
    p.state = row + kState;
    p.record = row + kRecord;
    p.scale = f + i * kFloats;
    p.grad_scale = f + i * kFloats + 1;
    p.found_inf = f + i * kFloats + 2;
    p.stepped = b + i;
    if (device.is_cuda())
      launch_step_rules(cases[i].rules, p, device);
    else
      ampkit_step_rules_run(&cases[i].rules, &p);
  }
}

std::string field_name(int k) {
  const char* state[] = {"growth tracker", "hysteresis tracker", "consecutive skips", "stopped"};
  const char* record[] = {"stepped", "backoff",    "abort",         "clip coefficient",
                          "scale",   "next scale", "loss",          "sum of squares",
                          "max-abs", "zeros",      "group elements"};
  return k < kRecord ? std::string("state's ") + state[k - kState]
                     : std::string("record's ") + record[k - kRecord];
}

std::string disagreement(size_t c, const std::string& field, double kernel, double host) {
  char text[320];
  std::snprintf(text, sizeof text,
                "the rules kernel disagrees with its host form (ampkit_step_rules_run) in its first-use "
                "self-check: case %zu's %s is %.17g from the kernel, %.17g on the host",
                c, field.c_str(), kernel, host);
  return text;
}

// The first number that differs in its bits, named.
std::string compare_cases(size_t cases, const double* dk, const float* fk, const unsigned char* bk,
                          const double* dh, const float* fh, const unsigned char* bh) {
  const char* floats[] = {"scale", "grad_scale", "found_inf"};
  for (size_t c = 0; c < cases; ++c) {
    for (int k = kState; k < kDoubles; ++k)
      if (std::memcmp(dk + c * kDoubles + k, dh + c * kDoubles + k, sizeof(double)) != 0)
        return disagreement(c, field_name(k), dk[c * kDoubles + k], dh[c * kDoubles + k]);
    for (int k = 0; k < kFloats; ++k)
      if (std::memcmp(fk + c * kFloats + k, fh + c * kFloats + k, sizeof(float)) != 0)
        return disagreement(c, floats[k], fk[c * kFloats + k], fh[c * kFloats + k]);
    if (bk[c] != bh[c]) return disagreement(c, "stepped flag", bk[c], bh[c]);
  }
  return "";
}

}  // namespace

std::string check_rules_kernel(const at::Device& device, bool wrong) {
  const std::vector<RulesCase> cases = rules_cases();
  const auto n = static_cast<int64_t>(cases.size());
  at::Tensor d = at::empty({n, kDoubles}, at::kDouble), f = at::empty({n, kFloats}, at::kFloat),
             b = at::empty({n}, at::kByte);
  lay_out(cases, d.data_ptr<double>(), f.data_ptr<float>(), b.data_ptr<uint8_t>());
  at::Tensor dk = device.is_cuda() ? d.to(device) : d.clone(),
             fk = device.is_cuda() ? f.to(device) : f.clone(),
             bk = device.is_cuda() ? b.to(device) : b.clone();
  run_cases(cases, dk.data_ptr<double>(), fk.data_ptr<float>(), bk.data_ptr<uint8_t>(), device);
  run_cases(cases, d.data_ptr<double>(), f.data_ptr<float>(), b.data_ptr<uint8_t>(), at::Device(at::kCPU));
  // Read once, on first use: not a step's read (host_reads() counts those).
  dk = dk.cpu(), fk = fk.cpu(), bk = bk.cpu();
  if (wrong) {
    uint64_t bits;
    std::memcpy(&bits, dk.data_ptr<double>() + kRecord + AMPKIT_RECORD_COEFFICIENT, sizeof bits);
    bits ^= 1u;
    std::memcpy(dk.data_ptr<double>() + kRecord + AMPKIT_RECORD_COEFFICIENT, &bits, sizeof bits);
  }
  return compare_cases(cases.size(), dk.data_ptr<double>(), fk.data_ptr<float>(), bk.data_ptr<uint8_t>(),
                       d.data_ptr<double>(), f.data_ptr<float>(), b.data_ptr<uint8_t>());
}

}  // namespace ampkit
