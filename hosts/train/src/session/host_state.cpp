// The host state's JSON form: the keys of a checkpoint manifest's "host" object.
#include "session/host_state.h"

#include <vector>

namespace ampkit::train {

void to_json(nlohmann::json& j, const HostState& s) {
  j = {{"nan_events", s.nan_events},
       {"clipped_steps", s.clipped_steps},
       {"data_skip", s.data_skip},
       {"steps_discarded", s.steps_discarded},
       {"rollbacks", s.rollbacks},
       {"locator_runs", s.locator_runs},
       {"recent_losses", std::vector<double>(s.recent_losses.begin(), s.recent_losses.end())}};
  if (!s.fp8.is_null()) j["fp8"] = s.fp8;
}

void from_json(const nlohmann::json& j, HostState& s) {
  s.nan_events = j.value("nan_events", int64_t{0});
  s.clipped_steps = j.value("clipped_steps", int64_t{0});
  s.data_skip = j.value("data_skip", int64_t{0});
  s.steps_discarded = j.value("steps_discarded", int64_t{0});
  s.rollbacks = j.value("rollbacks", int64_t{0});
  s.locator_runs = j.value("locator_runs", int64_t{0});
  const std::vector<double> losses = j.value("recent_losses", std::vector<double>{});
  s.recent_losses.assign(losses.begin(), losses.end());
  s.fp8 = j.value("fp8", nlohmann::json());
}

}  // namespace ampkit::train
