// The option checks the dynamic and predictive scalers share (backoff factor, on_min_scale, the
// order of init/min/max scale), each refusal worded like the host's own.
#pragma once

#include <ampkit/options.h>

#include <stdexcept>
#include <string>

namespace ampkit::scaler {

class ScalerOptionChecks {
 public:
  explicit ScalerOptionChecks(const std::string& scaler) : who_("scaler '" + scaler + "'") {}

  // "option 'growth_interval' of scaler 'dynamic' must be >= 1, got 0".
  std::invalid_argument bad_option(const std::string& option, const std::string& value,
                                   const std::string& accepted) const {
    return option_error(who_, option, value, accepted);
  }

  void check_backoff_factor(double backoff_factor) const {
    if (!(backoff_factor > 0.0 && backoff_factor < 1.0))
      throw bad_option("backoff_factor", format_number(backoff_factor),
                       "in (0, 1) (it must shrink the scale)");
  }

  // Whether the run stops at the minimum scale ("error") or stays there ("clamp").
  bool error_at_min_scale(const OptionValues& options) const {
    const std::string& on_min_scale = options.get_string("on_min_scale");
    if (on_min_scale != "error" && on_min_scale != "clamp")
      throw bad_option("on_min_scale", on_min_scale, "error or clamp");
    return on_min_scale == "error";
  }

  // min_scale <= init_scale <= max_scale, compared as `Scale` (the type the scaler keeps its
  // scale in), the options' own values in the message.
  template <class Scale>
  void check_scale_order(double init, double min, double max) const {
    if (static_cast<Scale>(min) > static_cast<Scale>(max))
      throw bad_option("min_scale", format_number(min), "<= max_scale (" + format_number(max) + ")");
    if (static_cast<Scale>(init) < static_cast<Scale>(min))
      throw bad_option("min_scale", format_number(min), "<= init_scale (" + format_number(init) + ")");
    if (static_cast<Scale>(init) > static_cast<Scale>(max))
      throw bad_option("max_scale", format_number(max), ">= init_scale (" + format_number(init) + ")");
  }

 private:
  std::string who_;
};

}  // namespace ampkit::scaler
