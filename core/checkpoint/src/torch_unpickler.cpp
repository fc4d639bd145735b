// A restricted pickle machine for torch.save archives (torch/_weights_only_unpickler.py is the
// reference: the same allowed globals, the same refusal of everything else).
#include "torch_unpickler.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "ampkit/error.h"
#include "pickle_bounds.h"
#include "pickle_stream.h"
#include "torch_archive.h"

namespace ampkit::checkpoint_files {

namespace {

// A GLOBAL on the stack: a string no pickled str starts with.
const std::string kGlobal("\0global:", 8);

at::ScalarType storage_dtype(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat}, {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},   {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},   {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort}, {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},   {"torch.BoolStorage", at::kBool}};
  const auto it = types.find(name);
  return it == types.end() ? at::ScalarType::Undefined : it->second;
}

class Machine : PickleStream<c10::IValue> {
 public:
  Machine(Archive& reader, const char* data, size_t size, std::string where)
      : PickleStream(data, size, std::move(where), "weights-only torch.save file"), reader_(reader) {}

  c10::IValue run() {
    while (true) {
      const uint8_t op = byte();
      if (op == '.') {
        if (stack_.size() != 1) bad("the pickle ends with " + std::to_string(stack_.size()) + " values");
        return stack_.back();
      }
      step(op);
    }
  }

 private:
  c10::impl::GenericDict& top_dict() {
    if (stack_.empty() || !stack_.back().isGenericDict()) bad("SETITEM on a non-dict");
    dict_ = stack_.back().toGenericDict();
    return dict_;
  }
  void set(const c10::IValue& key, const c10::IValue& value) {
    if (!key.isString() && !key.isInt() && !key.isDouble() && !key.isBool())
      bad("a dict key of type " + key.tagKind());
    c10::impl::GenericDict& dict = top_dict();
    bounds_.contain(stack_.back(), value);
    dict.insert_or_assign(key, value);
  }
  void append(const c10::IValue& value) {
    if (stack_.empty() || !stack_.back().isList()) bad("APPEND on a non-list");
    bounds_.contain(stack_.back(), value);
    stack_.back().toList().push_back(value);
  }
  c10::IValue tuple(std::vector<c10::IValue> items) {
    bounds_.count();
    uint32_t depth = 1;
    for (const auto& item : items) depth = std::max(depth, bounds_.seal(item) + 1);
    c10::IValue t = c10::ivalue::Tuple::create(std::move(items));
    bounds_.add(t, depth);
    return t;
  }
  void memo_put(size_t index) {
    if (stack_.empty()) bad("PUT on an empty stack");
    // Slots are kept by index, so memory follows the PUTs the file holds, not the indices it names.
    memo_[index] = stack_.back();
  }
  void memo_get(size_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) bad("GET of an unknown memo entry");
    stack_.push_back(it->second);
  }
  static bool is_global(const c10::IValue& v) {
    return v.isString() && v.toStringRef().rfind(kGlobal, 0) == 0;
  }
  std::string global_name(const c10::IValue& v) const {
    if (!is_global(v)) bad("a call of something that is not a global");
    return v.toStringRef().substr(kGlobal.size());
  }

  // Only what weights_only allows for tensors and state dicts; anything else is refused at once.
  void push_global(const std::string& name) {
    if (name != "collections.OrderedDict" && name != "torch._utils._rebuild_tensor_v2" &&
        name != "torch._utils._rebuild_parameter" && name != "torch._utils._rebuild_parameter_with_state" &&
        storage_dtype(name) == at::ScalarType::Undefined)
      bad("global " + name);
    stack_.emplace_back(kGlobal + name);
  }
  bool value(uint8_t op);
  bool container(uint8_t op);
  void step(uint8_t op);
  c10::IValue reduce(const std::string& callable, const std::vector<c10::IValue>& args);
  c10::IValue storage(const c10::IValue& pid);

  Archive& reader_;
  std::unordered_map<size_t, c10::IValue> memo_;
  PickleBounds bounds_{[this](const std::string& what) { bad(what); }};
  std::map<std::string, at::Tensor> storages_;
  c10::impl::GenericDict dict_{c10::AnyType::get(), c10::AnyType::get()};
};

// Values: protocol framing, marks, str, int, float, bool, None. False: not one of these.
bool Machine::value(uint8_t op) {
  switch (op) {
    case 0x80:
      byte();
      return true;  // PROTO
    case 0x95:
      little(8);
      return true;  // FRAME
    case '}':
      bounds_.count();
      stack_.emplace_back(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
      return true;
    case ']':
      bounds_.count();
      stack_.emplace_back(c10::impl::GenericList(c10::AnyType::get()));
      return true;
    case ')':
      stack_.push_back(tuple({}));
      return true;
    case '(':
      marks_.push_back(stack_.size());
      return true;  // MARK
    case 'X':
      stack_.emplace_back(text(little(4)));
      return true;
    case 0x8c:
      stack_.emplace_back(text(little(1)));
      return true;
    case 0x8d:
      stack_.emplace_back(text(little(8)));
      return true;
    case 'J':
      stack_.emplace_back(static_cast<int64_t>(static_cast<int32_t>(little(4))));
      return true;
    case 'K':
      stack_.emplace_back(static_cast<int64_t>(little(1)));
      return true;
    case 'M':
      stack_.emplace_back(static_cast<int64_t>(little(2)));
      return true;
    case 0x8a: {  // LONG1: little-endian two's complement
      const size_t n = byte();
      if (n > 8) bad("an integer wider than 64 bits");
      uint64_t v = little(n);
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
      stack_.emplace_back(static_cast<int64_t>(v));
      return true;
    }
    case 'G': {  // BINFLOAT, big-endian
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | byte();
      double d;
      std::memcpy(&d, &bits, sizeof d);
      stack_.emplace_back(d);
      return true;
    }
    case 0x88:
      stack_.emplace_back(true);
      return true;
    case 0x89:
      stack_.emplace_back(false);
      return true;
    case 'N':
      stack_.emplace_back();
      return true;
    default:
      return false;
  }
}

// Tuples, dicts, lists and the memo. False: not one of these.
bool Machine::container(uint8_t op) {
  switch (op) {
    case 't':
      stack_.push_back(tuple(pop_to_mark()));
      return true;
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      std::vector<c10::IValue> items(op - 0x84);
      for (size_t i = items.size(); i-- > 0;) items[i] = pop();
      stack_.push_back(tuple(std::move(items)));
      return true;
    }
    case 's': {
      c10::IValue value = pop(), key = pop();
      set(key, value);
      return true;
    }
    case 'u': {
      const std::vector<c10::IValue> items = pop_to_mark();
      if (items.size() % 2 != 0) bad("SETITEMS with an odd number of values");
      for (size_t i = 0; i < items.size(); i += 2) set(items[i], items[i + 1]);
      return true;
    }
    case 'a':
      append(pop());
      return true;
    case 'e':
      for (const auto& v : pop_to_mark()) append(v);
      return true;
    case 'q':
      memo_put(little(1));
      return true;
    case 'r':
      memo_put(little(4));
      return true;
    case 0x94:
      memo_put(memo_.size());
      return true;  // MEMOIZE
    case 'h':
      memo_get(little(1));
      return true;
    case 'j':
      memo_get(little(4));
      return true;
    default:
      return false;
  }
}

// Globals, calls and storages (the allowed ones), after value() and container().
void Machine::step(uint8_t op) {
  if (value(op) || container(op)) return;
  switch (op) {
    case 'c': {
      const std::string module = line();
      push_global(module + "." + line());
      return;
    }
    case 0x93: {  // STACK_GLOBAL
      const c10::IValue name = pop(), module = pop();
      if (!name.isString() || !module.isString()) bad("STACK_GLOBAL of non-strings");
      push_global(module.toStringRef() + "." + name.toStringRef());
      return;
    }
    case 'R': {
      const c10::IValue args = pop();
      const std::string callable = global_name(pop());
      if (!args.isTuple()) bad("REDUCE without an argument tuple");
      stack_.push_back(reduce(callable, args.toTupleRef().elements().vec()));
      return;
    }
    case 'b':
      pop();
      return;  // BUILD: an OrderedDict's _metadata and the like, not needed
    case 'Q':
      stack_.push_back(storage(pop()));
      return;
    default: {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", op);
      bad(std::string("pickle opcode ") + hex);
    }
  }
}

// ('storage', torch.<Type>Storage, key, location, numel): record data/<key> as a flat CPU tensor.
c10::IValue Machine::storage(const c10::IValue& pid) {
  if (!pid.isTuple() || pid.toTupleRef().elements().size() < 5) bad("a persistent id that is not a storage");
  const std::vector<c10::IValue> e = pid.toTupleRef().elements().vec();
  if (!e[0].isString() || e[0].toStringRef() != "storage" || !e[2].isString() || !e[4].isInt())
    bad("a persistent id that is not a storage");
  const at::ScalarType dtype = storage_dtype(global_name(e[1]));
  if (dtype == at::ScalarType::Undefined) bad("storage type " + global_name(e[1]));
  const std::string key = e[2].toStringRef();
  if (const auto it = storages_.find(key); it != storages_.end()) return it->second;
  const int64_t numel = e[4].toInt();
  const std::string record = "data/" + key;
  if (numel < 0 || !reader_.has(record)) bad("storage " + key + " is missing");
  // Sized from the record's declared size before anything is read or allocated: a forged element
  // count must not allocate, and the archive's budget bounds the record itself.
  const size_t declared = reader_.declared_size(record);
  if (declared % c10::elementSize(dtype) != 0 ||
      static_cast<uint64_t>(numel) != declared / c10::elementSize(dtype))
    bad("storage " + key + " has " + std::to_string(declared) + " bytes for " + std::to_string(numel) +
        " elements");
  auto [data, size] = reader_.read(record);
  if (size != declared) bad("storage " + key + " is shorter than its record says");
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
  if (size > 0) std::memcpy(t.data_ptr(), data.get(), size);
  storages_[key] = t;
  return t;
}

c10::IValue Machine::reduce(const std::string& callable, const std::vector<c10::IValue>& args) {
  if (callable == "collections.OrderedDict" && args.empty()) {
    bounds_.count();
    return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  }
  if ((callable == "torch._utils._rebuild_parameter" ||
       callable == "torch._utils._rebuild_parameter_with_state") &&
      !args.empty() && args[0].isTensor())
    return args[0];
  if (callable != "torch._utils._rebuild_tensor_v2") bad("global " + callable);
  // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  if (args.size() < 4 || !args[0].isTensor() || !args[1].isInt() || !args[2].isTuple() || !args[3].isTuple())
    bad("_rebuild_tensor_v2 with unexpected arguments");
  std::vector<int64_t> sizes, strides;
  for (const auto& v : args[2].toTupleRef().elements()) sizes.push_back(v.isInt() ? v.toInt() : -1);
  for (const auto& v : args[3].toTupleRef().elements()) strides.push_back(v.isInt() ? v.toInt() : -1);
  const at::Tensor& storage = args[0].toTensor();
  const int64_t offset = args[1].toInt();
  if (sizes.size() != strides.size() || offset < 0) bad("a tensor with inconsistent sizes and strides");
  int64_t last = offset, elements = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0 || strides[i] < 0) bad("a tensor with a negative size or stride");
    elements *= sizes[i];
    if (sizes[i] > 0) last += (sizes[i] - 1) * strides[i];
  }
  if (elements > 0 && last >= storage.numel()) bad("a tensor that reaches past its storage");
  // Overlapping views (a zero stride: an expanded tensor) would be materialized by the clone
  // below into more memory than the file backs; state dicts hold no such tensors.
  if (elements > storage.numel())
    bad("a tensor of " + std::to_string(elements) + " elements over a storage of " +
        std::to_string(storage.numel()) + " (an expanded view)");
  if (elements == 0) return at::empty(sizes, storage.options());
  return storage.as_strided(sizes, strides, offset).clone();
}

}  // namespace

c10::IValue unpickle(Archive& archive, const std::string& where) {
  if (archive.has("byteorder")) {
    auto [order, n] = archive.read("byteorder");
    if (std::string(static_cast<const char*>(order.get()), n) != "little")
      throw Error(ErrorCategory::checkpoint, where + ": written on a big-endian machine");
  }
  if (!archive.has("data.pkl"))
    throw Error(ErrorCategory::checkpoint, where + ": no data.pkl in the archive");
  auto [data, size] = archive.read("data.pkl");
  return Machine(archive, static_cast<const char*>(data.get()), size, where).run();
}

}  // namespace ampkit::checkpoint_files
