// An fp8 recipe whose update() writes a scale no cast can use (option `answer`: 0, NaN, -8 or inf)
// for the second tensor of each call, and leaves the first alone. The host must refuse it as this
// plugin's fault, naming it, the call and the value (guarded_strategies.cpp), never hand it to a cast.
#include <ampkit/fp8_recipe_plugin.h>

#include <cstdint>
#include <limits>
#include <string>

namespace {

class WrongFp8Scale final : public ampkit::Fp8Recipe {
 public:
  explicit WrongFp8Scale(const ampkit::OptionValues& options) {
    const std::string& a = options.get_string("answer");
    answer_ = a == "zero"       ? 0.0f
              : a == "nan"      ? std::numeric_limits<float>::quiet_NaN()
              : a == "negative" ? -8.0f
                                : std::numeric_limits<float>::infinity();
  }
  int64_t history_length() const override { return 0; }
  const char* format(int64_t) const override { return "e4m3"; }
  int64_t update(int64_t n, const int64_t*, const float*, float*, float* scale) override {
    if (n > 1) scale[1] = answer_;
    return 0;
  }

 private:
  float answer_;
};

}  // namespace

AMPKIT_PLUGIN(fp8_recipe, wrong_fp8_scale, WrongFp8Scale, "Writes a scale of 0, NaN, -8 or inf",
              ampkit::OptionSpec::Choice("answer", "nan", "zero|nan|negative|inf",
                                         "The scale update() writes for the second tensor."))
