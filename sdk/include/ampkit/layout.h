// The layout fingerprint: size and field offsets of every type that crosses the plugin boundary,
// as text ("StepStats 168 0,8,16,...\n"), computed at compile time. AMPKIT_PLUGIN stores the
// plugin's copy in its ELF section "ampkitly"; the host computes its own from its headers and
// refuses a plugin whose copy differs, naming the type, before any plugin code runs. It catches a
// header edited without an ABI bump. It cannot see a changed virtual function: that needs the
// bump (docs/plugin-authoring.md, "What changes the ABI").
#pragma once

#include <ampkit/options.h>
#include <ampkit/state.h>
#include <ampkit/step.h>
#include <stddef.h>

#include <cstdint>
#include <initializer_list>
#include <variant>

#define AMPKIT_PLUGIN_LAYOUT_SECTION "ampkitly"

namespace ampkit::detail {

struct LayoutText {
  static constexpr size_t kCapacity = 1024;
  char text[kCapacity] = {};
  size_t size = 0;

  constexpr void put(char c) {
    if (size + 1 >= kCapacity) throw "ampkit::detail::LayoutText: capacity exceeded";
    text[size++] = c;
  }
  constexpr void add(const char* s) {
    while (*s != '\0') put(*s++);
  }
  constexpr void add(uint64_t v) {
    char digits[20] = {};
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (n > 0) put(digits[--n]);
  }
  // One line: "Name size offset,offset,...".
  constexpr void type(const char* name, size_t bytes, std::initializer_list<size_t> offsets) {
    add(name);
    put(' ');
    add(static_cast<uint64_t>(bytes));
    put(' ');
    bool first = true;
    for (size_t o : offsets) {
      if (!first) put(',');
      first = false;
      add(static_cast<uint64_t>(o));
    }
    put('\n');
  }
};

// What each kind adds to the common types; specialised next to each interface.
template <class Interface>
struct KindLayout {
  static constexpr void add(LayoutText&) {}
};

constexpr void common_layout(LayoutText& t) {
  t.type(
      "StepStats", sizeof(StepStats),
      {offsetof(StepStats, step), offsetof(StepStats, loss), offsetof(StepStats, loss_finite),
       offsetof(StepStats, scale), offsetof(StepStats, grad_norm_scaled), offsetof(StepStats, grad_norm),
       offsetof(StepStats, grad_max_abs), offsetof(StepStats, grad_max_abs_scaled),
       offsetof(StepStats, zero_fraction), offsetof(StepStats, grad_elements), offsetof(StepStats, found_inf),
       offsetof(StepStats, tensor_norms), offsetof(StepStats, consecutive_skips)});
  t.type("RunInfo", sizeof(RunInfo),
         {offsetof(RunInfo, precision), offsetof(RunInfo, cuda), offsetof(RunInfo, rank),
          offsetof(RunInfo, world_size), offsetof(RunInfo, accumulation_steps),
          offsetof(RunInfo, parameter_names)});
  t.type("NanDecision", sizeof(NanDecision),
         {offsetof(NanDecision, action), offsetof(NanDecision, reason), offsetof(NanDecision, skip_batches),
          offsetof(NanDecision, clip_norm)});
  // State's variant: its size, then the size of each alternative (their number is the count).
  t.type(
      "StateValue", sizeof(StateValue),
      {sizeof(std::variant_alternative_t<0, StateValue>), sizeof(std::variant_alternative_t<1, StateValue>),
       sizeof(std::variant_alternative_t<2, StateValue>), sizeof(std::variant_alternative_t<3, StateValue>),
       sizeof(std::variant_alternative_t<4, StateValue>), std::variant_size_v<StateValue>});
  t.type("State", sizeof(State), {});
  t.type("OptionValues", sizeof(OptionValues), {});
}

// The layout record of a plugin whose interface is `Interface`.
template <class Interface>
constexpr LayoutText plugin_layout() {
  LayoutText t{};
  common_layout(t);
  KindLayout<Interface>::add(t);
  return t;
}

}  // namespace ampkit::detail
