// Comm plugins describe themselves through the ABI 5 optional-function lookup (find_function), and
// explain a failed collective with a typed reason: the host decides from these, never from plugin
// names or message text (values between our parts are typed).
#include <ampkit/comm_backend.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "builtin_plugins.h"
#include "test_paths.h"

using namespace ampkit;
using namespace ampkit::test;

namespace {

// A comm plugin written against ABI 5 that offers no optional function.
class BareComm final : public CommBackend {
 public:
  void init(const DistributedConfig&) override {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_mean(std::vector<at::Tensor>&) override {}
  void broadcast(std::vector<at::Tensor>&, int) override {}
  at::Tensor all_gather(const at::Tensor& t) override { return t.unsqueeze(0).clone(); }
  void barrier() override {}
};

}  // namespace

BOOST_AUTO_TEST_SUITE(comm_plugin_facts)

BOOST_AUTO_TEST_CASE(built_in_comms_declare_their_facts_through_the_guarded_lookup) {
  BuiltinPlugins plugins;
  struct Expected {
    const char* name;
    bool multi_process, needs_cuda, state_empty;
  };
  std::vector<Expected> comms = {{"local", false, false, true}, {"gloo", true, false, true}};
  // nccl is built where the CUDA toolkit is; creating it needs no GPU (init() does).
  if (std::filesystem::exists(std::filesystem::path(ampkit::test::plugin_dir()) / "libampkit-comm-nccl.so"))
    comms.push_back({"nccl", true, true, true});
  for (const Expected& e : comms) {
    BOOST_TEST_CONTEXT("comm " << e.name) {
      auto set = plugins.strategies({{"comm", BuiltinPlugins::choice(e.name)}});
      const CommFacts f = comm_facts(set->comm());  // through the plugin-call guard
      BOOST_TEST(f.multi_process == e.multi_process);
      BOOST_TEST(f.needs_cuda == e.needs_cuda);
      BOOST_TEST(f.state_empty == e.state_empty);
      BOOST_TEST(set->comm().find_function("ampkit_no_such_function") == nullptr);
      BOOST_TEST(set->comm().save().empty());  // what kCommStateEmpty promises
    }
  }
}

BOOST_AUTO_TEST_CASE(a_comm_without_facts_refuses_nothing_and_assumes_no_empty_state) {
  BareComm bare;
  const CommFacts f = comm_facts(bare);
  BOOST_TEST(f.multi_process);
  BOOST_TEST(!f.needs_cuda);
  BOOST_TEST(!f.state_empty);
}

BOOST_AUTO_TEST_CASE(a_failure_the_backend_cannot_explain_is_typed_unknown_with_its_first_line) {
  BareComm bare;
  const CommFailure plain = bare.explain_failure("Connection closed by peer");
  BOOST_TEST(static_cast<int>(plain.reason) == static_cast<int>(CommFailure::Reason::unknown));
  BOOST_TEST(plain.message == "Connection closed by peer");
  BOOST_TEST(plain.lost_ranks.empty());
  // gloo before a rendezvous (one process): nothing to ask, the cause's first line only.
  BuiltinPlugins plugins;
  auto set = plugins.strategies({{"comm", BuiltinPlugins::choice("gloo")}});
  const CommFailure gloo = set->comm().explain_failure("Timed out\nException raised from ...");
  BOOST_TEST(static_cast<int>(gloo.reason) == static_cast<int>(CommFailure::Reason::unknown));
  BOOST_TEST(gloo.message == "Timed out");
}

BOOST_AUTO_TEST_SUITE_END()
