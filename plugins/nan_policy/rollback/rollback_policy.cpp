// NaN policy "rollback": on bad steps, restore the last good snapshot and skip batches (what
// PaLM did for loss spikes); short streaks are skipped first, and too many rollbacks abort.
#include <ampkit/nan_detector.h>
#include <ampkit/nan_policy_plugin.h>

#include <string>

namespace {

class RollbackNanPolicy final : public ampkit::DetectingNanPolicy {
 public:
  explicit RollbackNanPolicy(const ampkit::OptionValues& options)
      : DetectingNanPolicy(options, 0),
        rollback_after_(options.get_int("rollback_after")),
        skip_batches_(options.get_int("skip_batches")),
        max_rollbacks_(options.get_int("max_rollbacks")),
        snapshot_every_(options.get_int("snapshot_every")),
        from_checkpoint_(options.get_string("snapshot") == "checkpoint"),
        on_spike_(options.get_string("on_spike")) {}

  ampkit::RollbackPlan rollback_plan() const override {
    return {from_checkpoint_ ? 0 : snapshot_every_, from_checkpoint_};
  }

  ampkit::NanDecision decide(const ampkit::StepStats& stats) override {
    const ampkit::Detection d = detect(stats);
    if (!d) {
      streak_ = 0;
      return {};
    }
    // An overflow of scaled gradients (finite loss, scale > 1) is the scaler's business: it
    // backs off and the next step is fine. Rolling back would throw good progress away.
    if (d.kind == ampkit::Detection::Kind::nonfinite_gradients && stats.scale > 1.0)
      return {ampkit::NanAction::skip, d.what + " (an overflow of the scaled gradients: skipped)"};
    // A finite spike handled without a rollback: it does not count towards rollback_after.
    ampkit::NanDecision spike{ampkit::NanAction::skip, d.what + " (nan_policy.on_spike=skip)"};
    if (on_spike_ == "clip" && clip_spike(d, spike)) return spike;
    if (on_spike_ == "skip" && !d.non_finite()) return spike;
    ++streak_;
    if (streak_ < rollback_after_)
      return {ampkit::NanAction::skip, d.what + "; bad step " + std::to_string(streak_) + " of " +
                                           std::to_string(rollback_after_) + " before a rollback"};
    if (max_rollbacks_ > 0 && rollbacks_ >= max_rollbacks_)
      return {ampkit::NanAction::abort,
              d.what + "; already rolled back " + std::to_string(rollbacks_) +
                  " times (nan_policy.max_rollbacks=" + std::to_string(max_rollbacks_) + ")"};
    ++rollbacks_;
    streak_ = 0;
    ampkit::NanDecision out{ampkit::NanAction::rollback,
                            d.what + "; rollback " + std::to_string(rollbacks_) + " to the last " +
                                (from_checkpoint_ ? "checkpoint" : "snapshot") + ", skipping " +
                                std::to_string(skip_batches_) + " batches"};
    out.skip_batches = skip_batches_;
    return out;
  }

  ampkit::State save() const override {
    ampkit::State s = DetectingNanPolicy::save();
    s.set("rollbacks", rollbacks_);
    s.set("streak", streak_);
    return s;
  }
  void load(const ampkit::State& s) override {
    DetectingNanPolicy::load(s);
    rollbacks_ = s.get<int64_t>("rollbacks");
    streak_ = s.get<int64_t>("streak");
  }

 private:
  int64_t rollback_after_, skip_batches_, max_rollbacks_, snapshot_every_;
  bool from_checkpoint_;
  std::string on_spike_;
  int64_t rollbacks_ = 0;
  int64_t streak_ = 0;
};

}  // namespace

AMPKIT_PLUGIN(nan_policy, rollback, RollbackNanPolicy,
              "Restore the last good snapshot and skip batches on bad steps; abort after too many rollbacks",
              ampkit::OptionSpec::Int("rollback_after", "1",
                                      "Bad steps in a row that trigger a rollback; shorter streaks are "
                                      "only skipped.")
                  .min(1),
              ampkit::OptionSpec::Int("skip_batches", "0",
                                      "Global batches the data stream skips after the bad one on a "
                                      "rollback (PaLM skipped 200-500 around a spike).")
                  .min(0),
              ampkit::OptionSpec::Int("max_rollbacks", "5",
                                      "Abort the run with a report at the bad step after this many "
                                      "rollbacks; 0 never aborts.")
                  .min(0),
              ampkit::OptionSpec::Int("snapshot_every", "100",
                                      "snapshot=memory: optimizer steps taken between in-memory "
                                      "snapshots (parameters, buffers, optimizer state).")
                  .min(1),
              ampkit::OptionSpec::Choice("snapshot", "memory", "memory|checkpoint",
                                         "Where a rollback restores from: the in-memory snapshot, or the "
                                         "newest checkpoint in --checkpoint-dir."),
              ampkit::OptionSpec::Choice("on_spike", "rollback", "rollback|skip|clip",
                                         "What to do with a finite loss or gradient-norm spike "
                                         "(spike_zscore > 0): treat it as a bad step (rollback), skip "
                                         "it, or clip: apply it with the gradient norm clipped to the "
                                         "window's mean + spike_zscore standard deviations."),
              AMPKIT_NAN_DETECTOR_OPTIONS)
