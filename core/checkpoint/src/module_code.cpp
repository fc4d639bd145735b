// What the TorchScript frontend may see of a checkpoint's optimizer.pt: the few line forms
// torch::serialize::OutputArchive writes, checked by hand before LibTorch compiles them.
#include "module_code.h"

#include <stdexcept>
#include <string>

namespace ampkit::checkpoint_files {

namespace {

constexpr int kMaxTypeDepth = 3;  // Tuple[float, float] is 2

// A cursor over one line; each take() consumes what it matches, or fails and consumes nothing.
class Line {
 public:
  explicit Line(std::string_view text) : rest_(text) {}
  bool done() const { return rest_.empty(); }
  bool take(std::string_view word) {
    if (rest_.substr(0, word.size()) != word) return false;
    rest_.remove_prefix(word.size());
    return true;
  }
  // [A-Za-z_][A-Za-z0-9_]*
  bool identifier() {
    size_t n = 0;
    while (n < rest_.size() && (is_letter(rest_[n]) || (n > 0 && is_digit(rest_[n])))) ++n;
    rest_.remove_prefix(n);
    return n > 0;
  }
  // "..." of name characters, without escapes.
  bool quoted() {
    size_t n = 1;
    if (rest_.empty() || rest_[0] != '"') return false;
    while (n < rest_.size() && is_name(rest_[n])) ++n;
    if (n == rest_.size() || rest_[n] != '"') return false;
    rest_.remove_prefix(n + 1);
    return true;
  }
  // ["a", "b", ] as Python prints a list of names (the ", " after each).
  bool names() {
    if (!take("[")) return false;
    while (quoted())
      if (!take(", ")) return false;
    return take("]");
  }
  bool type(int depth = 1) {
    if (depth > kMaxTypeDepth) return false;
    for (std::string_view plain : {"Tensor", "str", "int", "float", "bool"})
      if (take(plain) && !continues_identifier()) return true;
    if (take("__torch__")) {  // __torch__.a.b.Module
      while (take("."))
        if (!identifier()) return false;
      return true;
    }
    for (std::string_view generic : {"Tuple[", "List[", "Optional["}) {
      if (!take(generic)) continue;
      do {
        if (!type(depth + 1)) return false;
      } while (take(", "));
      return take("]");
    }
    return false;
  }

 private:
  static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_name(char c) { return is_letter(c) || is_digit(c) || c == '/' || c == '.' || c == '-'; }
  bool continues_identifier() const { return !rest_.empty() && (is_letter(rest_[0]) || is_digit(rest_[0])); }

  std::string_view rest_;
};

bool class_line(std::string_view text) {
  Line line(text);
  return line.take("class Module(Module):") && line.done();
}

bool member_line(std::string_view text) {
  Line line(text);
  if (!line.take("  ")) return false;
  if (line.take("__parameters__ = ") || line.take("__buffers__ = ")) return line.names() && line.done();
  if (line.take("__annotations__ = []")) return line.done();
  if (line.take("__annotations__[")) return line.quoted() && line.take("] = ") && line.type() && line.done();
  return line.identifier() && line.take(" : ") && line.type() && line.done();
}

}  // namespace

void check_module_code(std::string_view code) {
  bool in_class = false;
  size_t number = 0;
  while (!code.empty()) {
    const size_t end = code.find('\n');
    const std::string_view text = code.substr(0, end);
    code.remove_prefix(end == std::string_view::npos ? code.size() : end + 1);
    ++number;
    if (text.empty()) continue;
    if (class_line(text)) {
      in_class = true;
    } else if (!in_class || !member_line(text)) {
      throw std::runtime_error("line " + std::to_string(number) +
                               " is not one torch::serialize::OutputArchive writes");
    }
  }
}

}  // namespace ampkit::checkpoint_files
