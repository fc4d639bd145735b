// What a hostile pickle meets before it can cost more than its bytes: nesting depth, container
// count, and containers that change after being placed inside another (cycles).
#pragma once

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>

namespace ampkit::checkpoint_files {

// Deeper nesting than any state dict has (they nest about 5 deep): a hostile file could otherwise
// nest a million tuples, whose recursive destruction overflows the stack.
constexpr uint32_t kMaxDepth = 1000;
// More lists, dicts and tuples than state dicts hold (one dict per parameter in an optimizer's
// state): each costs a few hundred bytes in memory for one byte of pickle.
constexpr size_t kMaxContainers = size_t{1} << 18;

// Containers: how deep each nests, and whether it sits inside another yet. Pickles fill a
// container before its parent takes it, so one that is inside another may not change: then a
// depth, once sealed, is final, and no cycle and no unbounded nesting can be built. Each entry
// holds its container, so no address is reused while the pickle is read.
class PickleBounds {
 public:
  // `refuse` throws: it names what the pickle did.
  explicit PickleBounds(std::function<void(const std::string&)> refuse) : refuse_(std::move(refuse)) {}

  // Every new container is counted, before it can multiply the file's bytes in memory.
  void count() {
    if (++containers_ > kMaxContainers)
      refuse_("more than " + std::to_string(kMaxContainers) + " lists, dicts and tuples");
  }
  // A new immutable container (a tuple) of `depth`, its items already sealed.
  void add(const c10::IValue& v, uint32_t depth) {
    if (depth > kMaxDepth) refuse_("nested deeper than " + std::to_string(kMaxDepth));
    shapes_[v.internalToPointer()] = {v, depth, false};
  }
  // Seals `v` (placed inside another container); returns its depth (0: not a container).
  uint32_t seal(const c10::IValue& v) {
    if (!is_container(v)) return 0;
    Shape& s = shape(v);
    s.sealed = true;
    return s.depth;
  }
  // `child` goes into the list or dict `parent`.
  void contain(const c10::IValue& parent, const c10::IValue& child) {
    Shape& p = shape(parent);
    if (p.sealed) refuse_("a container changed after it was placed in another");
    if (is_container(child) && child.internalToPointer() == parent.internalToPointer())
      refuse_("a container inside itself");
    p.depth = std::max(p.depth, seal(child) + 1);
    if (p.depth > kMaxDepth) refuse_("nested deeper than " + std::to_string(kMaxDepth));
  }

 private:
  struct Shape {
    c10::IValue container;
    uint32_t depth = 1;
    bool sealed = false;
  };
  static bool is_container(const c10::IValue& v) { return v.isTuple() || v.isList() || v.isGenericDict(); }
  Shape& shape(const c10::IValue& v) {
    auto [it, added] = shapes_.try_emplace(v.internalToPointer());
    if (added) it->second.container = v;
    return it->second;
  }

  std::function<void(const std::string&)> refuse_;
  std::unordered_map<const void*, Shape> shapes_;
  size_t containers_ = 0;
};

}  // namespace ampkit::checkpoint_files
