// Checking an archive LibTorch's own reader will load (a checkpoint's optimizer.pt, read by
// torch::serialize::InputArchive): its pickles are scanned, not built, against the bounds of
// pickle_bounds.h, its code held to what OutputArchive writes (module_code.h), and its records
// against the archive's size, before LibTorch sees them.
#include "pickle_scan.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ampkit/error.h"
#include "module_code.h"
#include "pickle_bounds.h"
#include "pickle_stream.h"
#include "torch_archive.h"

namespace ampkit::checkpoint_files {

namespace {

[[noreturn]] void bad_archive(const std::string& where, const std::string& what) {
  throw Error(ErrorCategory::checkpoint, where + ": not a file LibTorch wrote (" + what + ")");
}

// A value on the scanner's stack: how deep it nests and, for a container or an object, its entry
// in `shapes` (-1: a leaf).
struct Item {
  uint32_t depth = 0;
  int64_t shape = -1;
};

class Scanner : PickleStream<Item> {
 public:
  Scanner(const char* data, size_t size, std::string where)
      : PickleStream(data, size, std::move(where), "file LibTorch wrote") {}

  void run() {
    for (;;) {
      const uint8_t op = byte();
      if (op == '.') return;
      step(op);
    }
  }

 private:
  Item& top() {
    if (stack_.empty()) bad("stack underflow");
    return stack_.back();
  }
  // A new container (or object) made of `items`, each now inside it.
  Item make(const std::vector<Item>& items) {
    if (++containers_ > kMaxContainers)
      bad("more than " + std::to_string(kMaxContainers) + " lists, dicts, tuples and objects");
    uint32_t depth = 1;
    for (const Item& i : items) depth = std::max(depth, seal(i) + 1);
    if (depth > kMaxDepth) bad("nested deeper than " + std::to_string(kMaxDepth));
    shapes_.push_back({depth, false});
    return {depth, static_cast<int64_t>(shapes_.size()) - 1};
  }
  uint32_t seal(const Item& i) {
    if (i.shape >= 0) shapes_[static_cast<size_t>(i.shape)].sealed = true;
    return i.shape >= 0 ? shapes_[static_cast<size_t>(i.shape)].depth : i.depth;
  }
  // `child` goes into the container on top of the stack, below `below` more items.
  void contain(Item& parent, const Item& child) {
    if (parent.shape < 0) bad("an item added to something that is not a container");
    if (child.shape == parent.shape) bad("a container inside itself");
    Shape& s = shapes_[static_cast<size_t>(parent.shape)];
    if (s.sealed) bad("a container changed after it was placed in another");
    s.depth = std::max(s.depth, seal(child) + 1);
    if (s.depth > kMaxDepth) bad("nested deeper than " + std::to_string(kMaxDepth));
    parent.depth = s.depth;
  }
  void put(uint64_t index) {
    if (stack_.empty()) bad("PUT on an empty stack");
    // Pickles number memo slots 0, 1, 2, ...: LibTorch's reader sizes its memo by the index.
    if (index > puts_ + 1024) bad("memo index " + std::to_string(index));
    ++puts_;
    memo_[index] = stack_.back();
  }
  void get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) bad("GET of an unknown memo entry");
    stack_.push_back(it->second);
  }
  bool leaf(uint8_t op);
  bool memo_or_stack(uint8_t op);
  void step(uint8_t op);
  void global(const std::string& module, const std::string& name);

  struct Shape {
    uint32_t depth;
    bool sealed;
  };
  std::unordered_map<uint64_t, Item> memo_;
  std::vector<Shape> shapes_;
  size_t containers_ = 0;
  uint64_t puts_ = 0;
};

// Only what OutputArchive's pickles name: the module classes of its code records, tensors, and
// the debug pickles' int lists. Anything else (torch.jit._pickle.restore_type_tag, say, whose type
// string LibTorch parses with the TorchScript frontend) is refused.
void Scanner::global(const std::string& module, const std::string& name) {
  static constexpr std::string_view kMangled = "__torch__.___torch_mangle_";
  const bool module_class =
      name == "Module" &&
      (module == "__torch__" || (module.size() > kMangled.size() && module.size() <= kMangled.size() + 9 &&
                                 module.compare(0, kMangled.size(), kMangled) == 0 &&
                                 std::all_of(module.begin() + kMangled.size(), module.end(),
                                             [](char c) { return c >= '0' && c <= '9'; })));
  const bool storage = module == "torch" && name.size() > 7 && name.size() <= 20 &&
                       name.compare(name.size() - 7, 7, "Storage") == 0 &&
                       std::all_of(name.begin(), name.end(),
                                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
  if (module_class || storage || (module == "torch._utils" && name == "_rebuild_tensor_v2") ||
      (module == "collections" && name == "OrderedDict") ||
      (module == "torch.jit._pickle" && name == "build_intlist"))
    return;
  bad("global " + module.substr(0, 64) + "." + name.substr(0, 64));
}

// Framing, marks, numbers, strings and globals. False: none of these.
bool Scanner::leaf(uint8_t op) {
  switch (op) {
    case 0x80:
      byte();
      return true;  // PROTO
    case 0x95:
      little(8);
      return true;  // FRAME
    case '(':
      marks_.push_back(stack_.size());
      return true;  // MARK
    case 'N':
    case 0x88:
    case 0x89:
      stack_.push_back({});
      return true;
    case 'K':
      little(1);
      stack_.push_back({});
      return true;
    case 'M':
      little(2);
      stack_.push_back({});
      return true;
    case 'J':
      little(4);
      stack_.push_back({});
      return true;
    case 'G':
      little(8);
      stack_.push_back({});
      return true;
    case 0x8a:
      skip(byte());
      stack_.push_back({});
      return true;  // LONG1
    case 'X':
      skip(little(4));
      stack_.push_back({});
      return true;  // BINUNICODE
    case 0x8c:
      skip(little(1));
      stack_.push_back({});
      return true;  // SHORT_BINUNICODE
    case 0x8d:
      skip(little(8));
      stack_.push_back({});
      return true;  // BINUNICODE8
    case 'B':
      skip(little(4));
      stack_.push_back({});
      return true;  // BINBYTES
    case 'C':
      skip(little(1));
      stack_.push_back({});
      return true;  // SHORT_BINBYTES
    case 'c': {
      const std::string module = line();  // first: the order of a call's arguments is unspecified
      global(module, line());
    }
      stack_.push_back({});
      return true;  // GLOBAL (LibTorch's pickler writes no STACK_GLOBAL)
    default:
      return false;
  }
}

// The memo and the stack. False: neither.
bool Scanner::memo_or_stack(uint8_t op) {
  switch (op) {
    case 'q':
      put(little(1));
      return true;
    case 'r':
      put(little(4));
      return true;
    case 0x94:
      put(puts_);
      return true;  // MEMOIZE
    case 'h':
      get(little(1));
      return true;
    case 'j':
      get(little(4));
      return true;
    case '0':
      pop();
      return true;  // POP
    case '2':
      stack_.push_back(top());
      return true;  // DUP
    default:
      return false;
  }
}

// Containers and objects, after leaf() and memo_or_stack(); anything else is refused.
void Scanner::step(uint8_t op) {
  if (leaf(op) || memo_or_stack(op)) return;
  switch (op) {
    case '}':
    case ']':
    case ')':
      stack_.push_back(make({}));
      return;  // EMPTY_DICT/LIST/TUPLE
    case 't':
      stack_.push_back(make(pop_to_mark()));
      return;  // TUPLE
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      std::vector<Item> items(op - 0x84);
      for (size_t i = items.size(); i-- > 0;) items[i] = pop();
      stack_.push_back(make(items));
      return;
    }
    case 'a': {
      const Item v = pop();
      contain(top(), v);
      return;
    }            // APPEND
    case 'e': {  // APPENDS
      const std::vector<Item> items = pop_to_mark();
      for (const Item& v : items) contain(top(), v);
      return;
    }
    case 's': {
      const Item v = pop(), k = pop();
      contain(top(), k);
      contain(top(), v);
      return;
    }
    case 'u': {  // SETITEMS
      const std::vector<Item> items = pop_to_mark();
      for (const Item& v : items) contain(top(), v);
      return;
    }
    case 'b': {
      const Item state = pop();
      contain(top(), state);
      return;
    }  // BUILD
    case 'R':
    case 0x81: {
      const Item args = pop();
      pop();
      stack_.push_back(make({args}));
      return;
    }
    case 'Q': {
      const Item pid = pop();
      stack_.push_back(make({pid}));
      return;
    }  // BINPERSID
    default: {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", op);
      bad(std::string("pickle opcode ") + hex + " not expected in a checkpoint");
    }
  }
}

}  // namespace

void check_torch_archive(const void* data, size_t size, const std::string& where) {
  try {
    // LibTorch's reader reads every record afterwards: together they may declare at most the file.
    Archive archive(source_in_memory(data, size), where, 1);
    for (const std::string& name : archive.records()) {
      // miniz finds records ignoring case: data.PKL is read as data.pkl.
      const bool pickle = is_pickle_record(name);
      const bool code = is_code_record(name);
      if (!pickle && !code) continue;
      auto [bytes, n] = archive.read(name);
      const char* text = static_cast<const char*>(bytes.get());
      if (pickle) Scanner(text, n, where + " (" + name + ")").run();
      try {
        if (code) check_module_code({text, n});
      } catch (const std::runtime_error& e) {
        bad_archive(where, name + ": " + e.what());
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    bad_archive(where, e.what());
  }
}

}  // namespace ampkit::checkpoint_files
