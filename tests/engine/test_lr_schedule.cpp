// The learning-rate schedule counts steps taken: skipped steps advance neither warm-up nor the
// cosine, and a run with skips still ends at the cosine's floor.
#define BOOST_TEST_MODULE lr_schedule
#include <ATen/ATen.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "trainer_fixture.h"

using namespace ampkit;
using ampkit::test::batch_x;
using ampkit::test::TinyTrainer;
using Plugins = ampkit::test::BuiltinPlugins;

BOOST_AUTO_TEST_CASE(skipped_steps_do_not_advance_the_lr_schedule) {
  Plugins plugins;
  LrSchedule schedule;
  schedule.base_lr = 1.0;
  schedule.warmup_steps = 4;  // lr = (taken + 1) / 4
  TinyTrainer run(plugins, {}, schedule);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> lrs;
  for (double factor : {1.0, nan, nan, 1.0, nan, 1.0}) {
    const StepOutcome o = run.trainer.step([&](int) { return run.model.loss(batch_x(2)) * factor; });
    lrs.push_back(o.lr);
  }
  const std::vector<double> expected = {0.25, 0.5, 0.5, 0.5, 0.75, 0.75};
  BOOST_TEST(lrs == expected, boost::test_tools::per_element());
  BOOST_TEST(run.trainer.steps_taken() == 3);
  BOOST_TEST(run.trainer.steps_skipped() == 3);
}

// The cosine's horizon is in steps taken: 10 attempts with 3 skipped take 7 steps, and the 7th
// ends at the floor (a horizon of 10 attempts would end the run at lr 0.345).
BOOST_AUTO_TEST_CASE(cosine_reaches_its_floor_at_the_end_of_a_run_with_skips) {
  Plugins plugins;
  LrSchedule schedule;
  schedule.kind = LrSchedule::Kind::cosine;
  schedule.base_lr = 1.0;
  schedule.min_lr = 0.0;
  schedule.total_steps = 10;
  TinyTrainer run(plugins, {}, schedule);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> lrs;
  for (double factor : {1.0, nan, 1.0, 1.0, nan, 1.0, 1.0, nan, 1.0, 1.0}) {
    const StepOutcome o = run.trainer.step([&](int) { return run.model.loss(batch_x(2)) * factor; });
    lrs.push_back(o.lr);
  }
  BOOST_TEST(run.trainer.steps_taken() == 7);
  // lr(k, lost) = 0.5 (1 + cos(pi k / (10 - lost))): k taken before the step, lost before it.
  auto cosine = [](double k, double horizon) { return 0.5 * (1.0 + std::cos(M_PI * k / horizon)); };
  const std::vector<double> expected = {1.0,          cosine(1, 10), cosine(1, 9), cosine(2, 9),
                                        cosine(3, 9), cosine(3, 8),  cosine(4, 8), cosine(5, 8),
                                        cosine(5, 7), cosine(6, 7)};
  BOOST_TEST(lrs == expected, boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());
  BOOST_TEST(run.optimizer.param_groups()[0].options().get_lr() == 0.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(schedule.at(7, 3) == 0.0);
  BOOST_TEST(schedule.at(7) == cosine(7, 10),
             boost::test_tools::tolerance(1e-12));  // none lost: plain cosine
}
