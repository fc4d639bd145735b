// What the TorchScript frontend may see: of a checkpoint's optimizer.pt, the few line forms
// torch::serialize::OutputArchive writes; of any module, code no deeper than its parser's stack.
#include "module_code.h"

#include <algorithm>
#include <cctype>
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
  // 1 to 9 digits.
  bool number() {
    size_t n = 0;
    while (n < rest_.size() && n < 10 && is_digit(rest_[n])) ++n;
    if (n == 0 || n > 9) return false;
    rest_.remove_prefix(n);
    return true;
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
    if (take("__torch__")) {  // __torch__.Module or __torch__.___torch_mangle_<n>.Module
      if (take(".___torch_mangle_") && !number()) return false;
      return take(".Module") && !continues_identifier();
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

bool ends_with_ignoring_case(const std::string& name, std::string_view suffix) {
  if (name.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), name.end() - static_cast<std::ptrdiff_t>(suffix.size()),
                    [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
}

// Python's tokens, as far as nesting goes: strings and comments skipped, words read whole.
class NestingScan {
 public:
  explicit NestingScan(std::string_view code) : code_(code) {}

  void run() {
    while (pos_ < code_.size()) {
      const char c = code_[pos_];
      if (c == '\n') {
        ++pos_;
        ++line_;
        if (brackets_ == 0) end_statement();
      } else if (c == '#') {
        while (pos_ < code_.size() && code_[pos_] != '\n') ++pos_;
      } else if (c == '"' || c == '\'') {
        string();
      } else if (c == '\\') {
        pos_ += 2;  // a line continuation (or a stray escape): the statement goes on
      } else if (is_word(c)) {
        word();
      } else {
        symbol(c);
      }
    }
  }

 private:
  static bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

  void end_statement() {
    prefixes_ = 0;
    operand_ = false;
  }

  void deeper(int& counter) {
    ++counter;
    if (brackets_ + prefixes_ > kMaxCodeDepth)
      fail("nests deeper than " + std::to_string(kMaxCodeDepth) + " (brackets and prefix operators)");
  }
  void string() {
    const char quote = code_[pos_];
    const bool triple = code_.substr(pos_, 3) == std::string(3, quote);
    pos_ += triple ? 3 : 1;
    while (pos_ < code_.size()) {
      const char c = code_[pos_];
      if (c == '\\') {
        pos_ += 2;
        continue;
      }
      if (c == '\n') ++line_;
      if (c == quote && (!triple || code_.substr(pos_, 3) == std::string(3, quote))) {
        pos_ += triple ? 3 : 1;
        break;
      }
      ++pos_;
    }
    operand_ = true;
  }
  void word() {
    const size_t start = pos_;
    const bool number = std::isdigit(static_cast<unsigned char>(code_[pos_]));
    while (pos_ < code_.size() && (is_word(code_[pos_]) || (number && code_[pos_] == '.'))) {
      const char c = code_[pos_++];
      if (number && (c == 'e' || c == 'E') && pos_ < code_.size() &&
          (code_[pos_] == '-' || code_[pos_] == '+'))
        ++pos_;  // 1e-05
    }
    const std::string_view w = code_.substr(start, pos_ - start);
    if (w == "not" || w == "lambda") {
      deeper(prefixes_);
      operand_ = false;
    } else {
      static constexpr std::string_view kKeywords[] = {"and", "or",     "if",     "else",  "elif",  "in",
                                                       "is",  "return", "assert", "raise", "yield", "await"};
      operand_ = std::find(std::begin(kKeywords), std::end(kKeywords), w) == std::end(kKeywords);
    }
  }
  void symbol(char c) {
    ++pos_;
    if (c == '(' || c == '[' || c == '{') {
      deeper(brackets_);
      operand_ = false;
    } else if (c == ')' || c == ']' || c == '}') {
      brackets_ = std::max(0, brackets_ - 1);
      operand_ = true;
    } else if (c == '*' && pos_ < code_.size() && code_[pos_] == '*') {
      ++pos_;
      deeper(prefixes_);  // right-associative: each ** is one level more
      operand_ = false;
    } else if ((c == '-' || c == '+' || c == '~') && !operand_) {
      deeper(prefixes_);
    } else if (c != ' ' && c != '\t' && c != '\r') {
      operand_ = false;
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("line " + std::to_string(line_) + " " + what);
  }

  std::string_view code_;
  size_t pos_ = 0, line_ = 1;
  int brackets_ = 0, prefixes_ = 0;
  bool operand_ = false;
};

}  // namespace

bool is_pickle_record(const std::string& name) {
  return ends_with_ignoring_case(name, "pkl");
}
bool is_code_record(const std::string& name) {
  return ends_with_ignoring_case(name, ".py");
}

void check_code_nesting(std::string_view code) {
  NestingScan(code).run();
}

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
