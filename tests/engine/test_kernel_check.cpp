// Whether ampkit's kernels may run on a device (kernel_check.h), without a GPU: which fatbin image
// a device of each compute capability loads (the images read from a fatbin's header), the
// first-use self-check over the kernels' CPU stand-ins, and the fallback when the module fails to
// load or a kernel's first result is wrong: the Trainer's step stays synchronous, says why once,
// and its numbers are the synchronous step's; on a GPU the statistics recipe falls back to foreach.
#define BOOST_TEST_MODULE kernel_check
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/fused_adamw.h"
#include "ampkit/grad_stats_chunks.h"
#include "ampkit/kernel_check.h"
#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "fused_run.h"
#include "trainer_fixture.h"

using namespace ampkit;
using Plugins = ampkit::test::BuiltinPlugins;

namespace {

// What the build embeds (core/CMakeLists.txt): machine code for these, PTX for compute_75 and 120.
const std::vector<KernelImage> kBuilt = {{75, false},  {80, false},  {86, false}, {89, false}, {90, false},
                                         {100, false}, {120, false}, {75, true},  {120, true}};

std::string loads(const std::vector<KernelImage>& images, int major, int minor) {
  const auto image = loadable_image(images, major, minor);
  return image ? describe_images({*image}) : "none";
}

// A fatbin as nvcc 13 lays it out: a 16-byte header, then entries of a header (64 bytes for sm_75
// to sm_90 machine code, 88 for PTX, 112 for sm_100 and later) and a payload.
std::vector<unsigned char> fatbin_of(const std::vector<KernelImage>& images) {
  std::vector<unsigned char> body;
  for (const KernelImage& image : images) {
    unsigned char entry[112] = {};
    const uint16_t kind = image.ptx ? 1 : 2;
    const uint32_t header = image.ptx ? 88 : image.arch >= 100 ? 112 : 64;
    const uint32_t arch = static_cast<uint32_t>(image.arch);
    const uint64_t payload = 32;
    std::memcpy(entry, &kind, 2);
    std::memcpy(entry + 4, &header, 4);
    std::memcpy(entry + 8, &payload, 8);
    std::memcpy(entry + 28, &arch, 4);
    body.insert(body.end(), entry, entry + header);
    body.insert(body.end(), payload, 0xEE);
  }
  std::vector<unsigned char> out(16);
  const uint32_t magic = 0xBA55ED50u;
  const uint16_t version = 1, header = 16;
  const uint64_t size = body.size();
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &version, 2);
  std::memcpy(out.data() + 6, &header, 2);
  std::memcpy(out.data() + 8, &size, 8);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

using test::FusedRun;

// 30 fp16 steps with overflows and clipping.
std::vector<StepOutcome> train(FusedRun& run) {
  std::vector<StepOutcome> out;
  for (int64_t step = 0; step < 30; ++step)
    out.push_back(run.trainer.step([&run, step](int) {
      const at::Tensor loss = run.model.loss(test::batch_x(step));
      return step % 7 == 3 ? loss * std::numeric_limits<float>::infinity() : loss;
    }));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_compute_capability_loads_the_image_the_driver_would) {
  BOOST_TEST(loads(kBuilt, 7, 5) == "sm_75");
  BOOST_TEST(loads(kBuilt, 8, 0) == "sm_80");
  BOOST_TEST(loads(kBuilt, 8, 7) == "sm_86");  // a later minor version runs the machine code
  BOOST_TEST(loads(kBuilt, 9, 0) == "sm_90");
  BOOST_TEST(loads(kBuilt, 10, 3) == "sm_100");
  BOOST_TEST(loads(kBuilt, 12, 1) == "sm_120");
  BOOST_TEST(loads(kBuilt, 11, 0) == "PTX compute_75");  // no sm_11x: compute_75's PTX, compiled
  BOOST_TEST(loads(kBuilt, 13, 0) == "PTX compute_120");
  BOOST_TEST(loads(kBuilt, 7, 0) == "none");  // older than every image
  // Without compute_75 PTX (the build before the fallback image) an 11.0 device loads nothing.
  BOOST_TEST(loads({kBuilt.begin(), kBuilt.end() - 2}, 11, 0) == "none");
  BOOST_TEST(describe_images(kBuilt) ==
             "sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_120, PTX compute_75, compute_120");
}

BOOST_AUTO_TEST_CASE(a_fatbins_images_are_read_from_its_headers_and_a_cut_one_is_refused) {
  const std::vector<unsigned char> bytes = fatbin_of(kBuilt);
  BOOST_TEST(fatbin_size(bytes.data(), bytes.size()) == bytes.size());
  BOOST_TEST((fatbin_images(bytes.data(), bytes.size()) == kBuilt));
  BOOST_TEST(fatbin_images(bytes.data(), bytes.size() - 1).empty());  // the header promises more
  std::vector<unsigned char> broken = bytes;
  broken[16 + 4] = 8;  // an entry header shorter than 64 bytes
  BOOST_TEST(fatbin_images(broken.data(), broken.size()).empty());
  broken = bytes;
  broken[0] ^= 1;  // not a fatbin's magic
  BOOST_TEST(fatbin_size(broken.data(), broken.size()) == 0u);
}

BOOST_AUTO_TEST_CASE(the_cpu_stand_ins_pass_the_self_check_and_a_planted_fault_is_named) {
  set_kernel_fault(KernelFault::none);
  const KernelCheckCost before = kernel_check_cost();
  BOOST_TEST(kernel_refusal(at::Device(at::kCPU)) == "");
  BOOST_TEST(kernel_refusal(at::Device(at::kCPU)) == "");  // made once, then kept
  const KernelCheckCost after = kernel_check_cost();
  BOOST_TEST(after.checks == before.checks + 1);
  set_kernel_fault(KernelFault::none);  // forgets the verdict: the same check again, ATen warmed up
  BOOST_TEST(kernel_refusal(at::Device(at::kCPU)) == "");
  std::printf("the self-check on the CPU stand-ins took %.2f ms, %.2f ms the second time\n",
              1e3 * (after.seconds - before.seconds), 1e3 * (kernel_check_cost().seconds - after.seconds));
  set_kernel_fault(KernelFault::stats);
  const std::string stats = kernel_refusal(at::Device(at::kCPU));
  BOOST_TEST(stats.find("the statistics kernel disagrees with its host form") != std::string::npos, stats);
  BOOST_TEST(stats.find("float chunk 0 of 65536 elements has sum of squares") != std::string::npos, stats);
  set_kernel_fault(KernelFault::rules);
  const std::string rules = kernel_refusal(at::Device(at::kCPU));
  BOOST_TEST(rules.find("the rules kernel disagrees") != std::string::npos, rules);
  BOOST_TEST(rules.find("case 0's record's clip coefficient is 0.5") != std::string::npos, rules);
  set_kernel_fault(KernelFault::load);
  BOOST_TEST(kernel_refusal(at::Device(at::kCPU)).find("did not load") != std::string::npos);
  set_kernel_fault(KernelFault::none);
}

// The ranks' verdicts agreed: the first refusing rank's reason, named, becomes every rank's, a rank
// whose own check passed included; where none refused, nothing changes (and nothing is checked again).
BOOST_AUTO_TEST_CASE(one_refusing_rank_is_every_ranks_verdict) {
  const at::Device cpu(at::kCPU);
  set_kernel_fault(KernelFault::none);
  BOOST_TEST(kernel_refusal(cpu) == "");
  const int checks = kernel_check_cost().checks;
  BOOST_TEST(agree_kernel_refusal(cpu, {"", "", ""}) == "");
  BOOST_TEST(kernel_refusal(cpu) == "");
  const std::string why =
      agree_kernel_refusal(cpu, {"", "the statistics kernel disagrees", "", "its module did not load"});
  BOOST_TEST(why == "rank 1: the statistics kernel disagrees");
  BOOST_TEST(kernel_refusal(cpu) == why);  // kept in place of this rank's passed check
  BOOST_TEST(kernel_check_cost().checks == checks);
  set_kernel_fault(KernelFault::none);
}

// The deferred step refused with the reason, once, and the synchronous step it leaves is the
// synchronous step: every outcome and the parameters, bit for bit.
BOOST_AUTO_TEST_CASE(a_refused_kernel_keeps_the_trainers_step_synchronous_with_its_numbers) {
  Plugins plugins;
  const std::map<std::string, StrategyChoice> choices = {
      {"scaler", Plugins::choice("dynamic", {{"init_scale", "1024"}, {"growth_interval", "4"}})},
      {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})},
      {"nan_policy", Plugins::choice("skip", {})}};
  for (const KernelFault fault : {KernelFault::load, KernelFault::stats, KernelFault::rules}) {
    BOOST_TEST_CONTEXT("fault " << static_cast<int>(fault)) {
      set_kernel_fault(fault);
      test::TinyModel start;
      FusedRun sync(plugins, choices, start), fallen(plugins, choices, start);
      std::string kind;
      const std::string why = fallen.trainer.enable_deferred_step(kind, false);
      BOOST_TEST(why == kernel_refusal(at::Device(at::kCPU)));
      BOOST_TEST(!why.empty());
      BOOST_TEST(kind.empty());
      BOOST_TEST(fallen.trainer.deferred_step() == nullptr);
      const int checks = kernel_check_cost().checks;
      BOOST_TEST(fallen.trainer.enable_deferred_step(kind, false) == why);  // asked again: the same reason
      BOOST_TEST(kernel_check_cost().checks == checks);                     // not checked again
      const std::vector<StepOutcome> want = train(sync), got = train(fallen);
      for (size_t i = 0; i < want.size(); ++i) {
        BOOST_TEST(got[i].stepped == want[i].stepped);
        BOOST_TEST(got[i].scale_next == want[i].scale_next);
        BOOST_TEST(std::memcmp(&got[i].clip_coefficient, &want[i].clip_coefficient, sizeof(double)) == 0);
      }
      BOOST_TEST(at::equal(sync.model.layer->weight, fallen.model.layer->weight));
      BOOST_TEST(at::equal(sync.model.layer->bias, fallen.model.layer->bias));
    }
  }
  set_kernel_fault(KernelFault::none);
  test::TinyModel start;
  FusedRun deferred(plugins, choices, start);
  std::string kind;
  BOOST_TEST(deferred.trainer.enable_deferred_step(kind, false) == "");  // no fault: deferred
}

// On a GPU device whose module does not load (without a GPU: no CUDA driver at all), automatic falls back to
// the foreach recipe with the reason, and chunk_kernel asked for by name says why it cannot run.
BOOST_AUTO_TEST_CASE(a_gpu_without_a_loadable_module_falls_back_to_the_foreach_recipe) {
  if (!chunk_kernel_built()) return;  // nothing of ours runs on a GPU there
  set_kernel_fault(torch::cuda::is_available() ? KernelFault::load : KernelFault::none);
  const at::Device gpu(at::kCUDA, 0);
  ResolvedStatsRecipe r{DeviceStatsRecipe::chunk_kernel, ""};
  fall_back_where_kernel_refused(DeviceStatsRecipe::automatic, gpu, r);
  BOOST_TEST((r.recipe == DeviceStatsRecipe::foreach_ops));
  BOOST_TEST(
      r.fallback.rfind(
          "gradient statistics: foreach_ops instead of chunk_kernel: ampkit's kernels on cuda:0: ", 0) == 0,
      r.fallback);
  ResolvedStatsRecipe named{DeviceStatsRecipe::chunk_kernel, ""};
  BOOST_CHECK_EXCEPTION(
      fall_back_where_kernel_refused(DeviceStatsRecipe::chunk_kernel, gpu, named), Error, [](const Error& e) {
        return e.category() == ErrorCategory::usage &&
               std::string(e.what()).find("the chunk_kernel statistics recipe cannot run") !=
                   std::string::npos;
      });
  ResolvedStatsRecipe cpu{DeviceStatsRecipe::fused_scan, ""};
  fall_back_where_kernel_refused(DeviceStatsRecipe::automatic, gpu, cpu);  // not the kernel: untouched
  BOOST_TEST((cpu.recipe == DeviceStatsRecipe::fused_scan));
}

// On a GPU (tools/gpu-check.sh runs this program there): a thread whose first CUDA call is ampkit's
// loads the module into the device's primary context (a thread without a current context would
// get CUDA_ERROR_INVALID_CONTEXT), and the kernels pass the self-check against the host forms.
BOOST_AUTO_TEST_CASE(on_a_gpu_a_new_threads_first_call_loads_and_checks_the_kernels) {
  if (!chunk_kernel_built() || !torch::cuda::is_available()) {
    BOOST_TEST_MESSAGE("no GPU, or a build without the kernels: nothing to load");
    return;
  }
  set_kernel_fault(KernelFault::none);
  std::string why = "not run";
  std::thread first([&why] { why = kernel_refusal(at::Device(at::kCUDA, 0)); });
  first.join();
  BOOST_TEST(why == "");
  const KernelCheckCost cost = kernel_check_cost();
  std::printf("the self-check on cuda:0 (with the module's load): %.1f ms\n", 1e3 * cost.seconds);
}
