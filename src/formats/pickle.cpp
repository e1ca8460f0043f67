// The restricted unpickler. It is a stack machine like CPython's Lib/pickle.py `_Unpickler`, with
// one difference that makes it safe: there is no import and no call. GLOBAL / STACK_GLOBAL resolve a
// name against a fixed table (anything else is refused there, naming it); REDUCE, NEWOBJ, INST and
// OBJ "call" only those table entries, and each entry builds a value from checked arguments.
// Opcodes torch.save never emits (text-protocol ints and strings, sets, extension codes, out-of-band
// buffers, PERSID) are refused by name.
#include "formats/pickle.h"

#include "core/error.h"
#include "formats/byte_reader.h"

#include <bit>
#include <cstring>
#include <string_view>
#include <unordered_map>

namespace splitflow {
namespace {

using Kind = PickleObject::Kind;
using Global = PickleObject::Global;

// Bounds on what one pickle may build, far above any checkpoint (a 300-tensor state dict is ~10k
// objects) yet small enough that a crafted file cannot exhaust memory.
constexpr size_t kMaxObjects = size_t(1) << 20;
constexpr size_t kMaxStackDepth = size_t(1) << 20;
constexpr size_t kMaxContainerItems = size_t(1) << 26;
constexpr size_t kMaxTensorDims = 64;

struct KnownGlobal {
  std::string_view module, name;
  Global global;
  DType dtype = DType::F32;  // StorageType only
};
// Everything a checkpoint may name. torch.save writes storages by their legacy typed class names.
constexpr KnownGlobal kKnownGlobals[] = {
    {"collections", "OrderedDict", Global::OrderedDict},
    {"torch._utils", "_rebuild_tensor_v2", Global::RebuildTensorV2},
    {"torch._utils", "_rebuild_tensor", Global::RebuildTensor},
    {"torch._utils", "_rebuild_parameter", Global::RebuildParameter},
    {"torch._utils", "_rebuild_parameter_with_state", Global::RebuildParameterWithState},
    {"torch", "FloatStorage", Global::StorageType, DType::F32},
    {"torch", "HalfStorage", Global::StorageType, DType::F16},
    {"torch", "BFloat16Storage", Global::StorageType, DType::BF16},
    {"torch", "DoubleStorage", Global::StorageType, DType::F64},
    {"torch", "Float8_e4m3fnStorage", Global::StorageType, DType::F8E4M3},
    {"torch", "LongStorage", Global::StorageType, DType::I64},
    {"torch", "IntStorage", Global::StorageType, DType::I32},
    {"torch", "ShortStorage", Global::StorageType, DType::I16},
    {"torch", "CharStorage", Global::StorageType, DType::I8},
    {"torch", "ByteStorage", Global::StorageType, DType::U8},
    {"torch", "BoolStorage", Global::StorageType, DType::Bool},
};

std::string_view global_name(Global global) {
  switch (global) {
    case Global::OrderedDict: return "collections.OrderedDict";
    case Global::RebuildTensorV2: return "torch._utils._rebuild_tensor_v2";
    case Global::RebuildTensor: return "torch._utils._rebuild_tensor";
    case Global::RebuildParameter: return "torch._utils._rebuild_parameter";
    case Global::RebuildParameterWithState: return "torch._utils._rebuild_parameter_with_state";
    case Global::StorageType: return "a torch storage type";
  }
  return "?";
}

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::BigInt: return "int wider than 64 bits";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Global: return "global";
    case Kind::Storage: return "storage";
    case Kind::Tensor: return "tensor";
  }
  return "?";
}

// Names from the file go into messages; control and non-ASCII bytes are escaped so a message stays
// printable (and valid UTF-8) whatever the file holds.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text.substr(0, 200)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) out += c;
    else out += fmt::format("\\x{:02x}", byte);
  }
  if (text.size() > 200) out += "...";
  return out;
}

// Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF): strings become tensor names
// and JSON metadata, which must be valid.
bool is_strict_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) { ++i; continue; }
    size_t length;
    uint32_t code, minimum;
    if ((lead & 0xE0) == 0xC0) length = 2, code = lead & 0x1F, minimum = 0x80;
    else if ((lead & 0xF0) == 0xE0) length = 3, code = lead & 0x0F, minimum = 0x800;
    else if ((lead & 0xF8) == 0xF0) length = 4, code = lead & 0x07, minimum = 0x10000;
    else return false;
    if (text.size() - i < length) return false;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = code << 6 | (next & 0x3F);
    }
    if (code < minimum || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += length;
  }
  return true;
}

class Unpickler {
 public:
  Unpickler(const uint8_t* bytes, size_t size, const std::string& where) : bytes_(bytes), size_(size), where_(where) {}

  Pickle run() {
    for (;;) {
      op_offset_ = position_;
      const uint8_t op = read_byte("an opcode");
      if (op == '.') break;  // STOP
      step(op);
    }
    check(marks_.empty(), "STOP with an unclosed MARK");
    check(stack_.size() == 1, "STOP with {} values on the stack (expected exactly 1)", stack_.size());
    Pickle pickle;
    pickle.root = stack_.back();
    pickle.objects = std::move(objects_);
    pickle.bytes_read = position_;
    return pickle;
  }

 private:
  // ---- errors and raw reads -------------------------------------------------------------------

  template <typename... Args>
  [[noreturn]] void refuse(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: at byte {}: {}", where_, op_offset_, fmt::format(format, std::forward<Args>(args)...));
  }
  // A function, not a macro: its arguments are evaluated even when `condition` holds, so they must
  // be safe to compute either way.
  template <typename... Args>
  void check(bool condition, fmt::format_string<Args...> format, Args&&... args) const {
    if (!condition) refuse(format, std::forward<Args>(args)...);
  }

  const uint8_t* take(uint64_t count, std::string_view what) {
    if (count > size_ - position_)
      fail("{}: truncated or corrupt: {} needs {} bytes at byte {}, but only {} remain", where_, what, count, position_,
           size_ - position_);
    const uint8_t* start = bytes_ + position_;
    position_ += count;
    return start;
  }
  uint8_t read_byte(std::string_view what) { return *take(1, what); }
  template <typename T>
  T read_le(std::string_view what) {
    T value;
    std::memcpy(&value, take(sizeof(T), what), sizeof(T));
    return value;
  }
  // A protocol-0 text line (GLOBAL and INST operands), without its '\n'.
  std::string_view read_line(std::string_view what) {
    const auto* start = bytes_ + position_;
    const auto* newline = static_cast<const uint8_t*>(std::memchr(start, '\n', size_ - position_));
    if (newline == nullptr) fail("{}: truncated or corrupt: {} at byte {} has no terminating newline", where_, what, position_);
    position_ += static_cast<size_t>(newline - start) + 1;
    return {reinterpret_cast<const char*>(start), static_cast<size_t>(newline - start)};
  }

  // ---- objects and the stack ------------------------------------------------------------------

  uint32_t make(PickleObject object) {
    check(objects_.size() < kMaxObjects, "more than {} objects in one pickle", kMaxObjects);
    objects_.push_back(std::move(object));
    return static_cast<uint32_t>(objects_.size() - 1);
  }
  uint32_t make(Kind kind) {
    PickleObject object;
    object.kind = kind;
    return make(std::move(object));
  }
  void push(uint32_t index) {
    check(stack_.size() < kMaxStackDepth, "the stack grows past {} values", kMaxStackDepth);
    stack_.push_back(index);
  }
  uint32_t pop(std::string_view opcode) {
    check(stack_.size() > stack_floor(), "{} on an empty stack (or past its MARK)", opcode);
    const uint32_t top = stack_.back();
    stack_.pop_back();
    return top;
  }
  uint32_t top(std::string_view opcode) const {
    check(stack_.size() > stack_floor(), "{} on an empty stack (or past its MARK)", opcode);
    return stack_.back();
  }
  // Values above the innermost MARK belong to it; the opcodes that do not take a MARK must not
  // reach below it.
  size_t stack_floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<uint32_t> pop_to_mark(std::string_view opcode) {
    check(!marks_.empty(), "{} without a MARK", opcode);
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  PickleObject& object(uint32_t index) { return objects_[index]; }
  const PickleObject& object(uint32_t index) const { return objects_[index]; }

  void add_items(size_t count) {
    total_items_ += count;
    check(total_items_ <= kMaxContainerItems, "containers hold more than {} items in all", kMaxContainerItems);
  }

  uint32_t make_int(int64_t value) {
    PickleObject object;
    object.kind = Kind::Int;
    object.integer = value;
    return make(std::move(object));
  }
  uint32_t make_text(Kind kind, const uint8_t* data, uint64_t length) {
    PickleObject object;
    object.kind = kind;
    object.text.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(length));
    if (kind == Kind::String) check(is_strict_utf8(object.text), "a str that is not valid UTF-8");
    return make(std::move(object));
  }
  uint32_t make_tuple(std::vector<uint32_t> items) {
    add_items(items.size());
    PickleObject object;
    object.kind = Kind::Tuple;
    object.items = std::move(items);
    return make(std::move(object));
  }

  void append(uint32_t list, const std::vector<uint32_t>& values, std::string_view opcode) {
    check(object(list).kind == Kind::List, "{} to a {}, not a list", opcode, kind_name(object(list).kind));
    add_items(values.size());
    auto& items = object(list).items;
    items.insert(items.end(), values.begin(), values.end());
  }
  // Dict keys are str or int (all torch.save writes); a repeated key replaces its value, as in Python.
  void set_items(uint32_t dict, const std::vector<uint32_t>& pairs, std::string_view opcode) {
    check(object(dict).kind == Kind::Dict, "{} on a {}, not a dict", opcode, kind_name(object(dict).kind));
    check(pairs.size() % 2 == 0, "{} with an odd number of values ({})", opcode, pairs.size());
    auto& slots = dict_slots_[dict];
    for (size_t i = 0; i < pairs.size(); i += 2) {
      const PickleObject& key = object(pairs[i]);
      std::string slot_key(1, key.kind == Kind::String ? 's' : 'i');  // str "1" and int 1 are different keys
      if (key.kind == Kind::String) slot_key.append(key.text);
      else if (key.kind == Kind::Int) slot_key.append(std::to_string(key.integer));
      else refuse("{}: a dict key is a {} (only str and int keys are accepted)", opcode, kind_name(key.kind));
      auto& items = object(dict).items;
      const auto [slot, inserted] = slots.emplace(std::move(slot_key), items.size());
      if (inserted) {
        add_items(2);
        items.push_back(pairs[i]);
        items.push_back(pairs[i + 1]);
      } else {
        items[slot->second + 1] = pairs[i + 1];
      }
    }
  }

  // ---- globals and calls ----------------------------------------------------------------------

  uint32_t find_global(std::string_view module, std::string_view name) {
    for (const KnownGlobal& known : kKnownGlobals) {
      if (known.module == module && known.name == name) {
        PickleObject object;
        object.kind = Kind::Global;
        object.global = known.global;
        object.dtype = known.dtype;
        return make(std::move(object));
      }
    }
    refuse("refused global '{}.{}': a checkpoint may name only collections.OrderedDict, torch._utils' tensor and "
           "parameter rebuild functions and torch's storage types (this is not a plain state dict of tensors)",
           printable(module), printable(name));
  }

  // The value a whitelisted callable "returns" for `args`; nothing is executed.
  uint32_t call(uint32_t callable, const std::vector<uint32_t>& args, std::string_view opcode) {
    const PickleObject& function = object(callable);
    check(function.kind == Kind::Global, "{} calls a {}, not a known global", opcode, kind_name(function.kind));
    switch (function.global) {
      case Global::OrderedDict:
        check(args.empty(), "{}: collections.OrderedDict takes no arguments here, got {}", opcode, args.size());
        return make(Kind::Dict);
      case Global::RebuildTensorV2:
        check(args.size() == 6 || args.size() == 7, "{}: torch._utils._rebuild_tensor_v2 takes 6 or 7 arguments, got {}",
              opcode, args.size());
        check(object(args[4]).kind == Kind::Bool, "_rebuild_tensor_v2: requires_grad is a {}, not a bool",
              kind_name(object(args[4]).kind));
        check(object(args[5]).kind == Kind::Dict, "_rebuild_tensor_v2: backward_hooks is a {}, not a dict",
              kind_name(object(args[5]).kind));
        if (args.size() == 7) {
          check(object(args[6]).kind == Kind::Dict || object(args[6]).kind == Kind::None,
                "_rebuild_tensor_v2: metadata is a {}, not a dict", kind_name(object(args[6]).kind));
        }
        return rebuild_tensor(args, "_rebuild_tensor_v2");
      case Global::RebuildTensor:
        check(args.size() == 4, "{}: torch._utils._rebuild_tensor takes 4 arguments, got {}", opcode, args.size());
        return rebuild_tensor(args, "_rebuild_tensor");
      case Global::RebuildParameter:
      case Global::RebuildParameterWithState: {
        const bool with_state = function.global == Global::RebuildParameterWithState;
        check(args.size() == (with_state ? 4u : 3u), "{}: {} takes {} arguments, got {}", opcode,
              global_name(function.global), with_state ? 4 : 3, args.size());
        check(object(args[0]).kind == Kind::Tensor, "{}: data is a {}, not a tensor", global_name(function.global),
              kind_name(object(args[0]).kind));
        check(object(args[1]).kind == Kind::Bool, "{}: requires_grad is a {}, not a bool", global_name(function.global),
              kind_name(object(args[1]).kind));
        check(object(args[2]).kind == Kind::Dict, "{}: backward_hooks is a {}, not a dict", global_name(function.global),
              kind_name(object(args[2]).kind));
        if (with_state) {
          const Kind state = object(args[3]).kind;
          check(state == Kind::Dict || state == Kind::None || state == Kind::Tuple, "{}: state is a {}",
                global_name(function.global), kind_name(state));
        }
        return args[0];
      }
      case Global::StorageType:
        refuse("{} calls a torch storage type, which a checkpoint may only name inside a persistent id", opcode);
    }
    refuse("{} calls an unknown global", opcode);
  }

  int64_t int_argument(uint32_t index, std::string_view what) const {
    const PickleObject& value = object(index);
    check(value.kind == Kind::Int, "{} is a {}, not an int", what, kind_name(value.kind));
    check(value.integer >= 0, "{} is negative ({})", what, value.integer);
    return value.integer;
  }
  std::vector<int64_t> int_tuple_argument(uint32_t index, std::string_view what) const {
    const PickleObject& value = object(index);
    check(value.kind == Kind::Tuple, "{} is a {}, not a tuple", what, kind_name(value.kind));
    check(value.items.size() <= kMaxTensorDims, "{} has {} dimensions (at most {})", what, value.items.size(),
          kMaxTensorDims);
    std::vector<int64_t> ints;
    for (const uint32_t item : value.items) ints.push_back(int_argument(item, what));
    return ints;
  }

  // (storage, storage_offset, size, stride, ...): a strided view that must lie inside the storage.
  uint32_t rebuild_tensor(const std::vector<uint32_t>& args, std::string_view function) {
    const PickleObject& storage = object(args[0]);
    check(storage.kind == Kind::Storage, "{}: the storage argument is a {}, not a storage from a persistent id",
          function, kind_name(storage.kind));
    PickleObject tensor;
    tensor.kind = Kind::Tensor;
    tensor.dtype = storage.dtype;
    tensor.storage = args[0];
    tensor.storage_offset = static_cast<uint64_t>(int_argument(args[1], fmt::format("{}: storage_offset", function)));
    tensor.shape = int_tuple_argument(args[2], fmt::format("{}: size", function));
    tensor.strides = int_tuple_argument(args[3], fmt::format("{}: stride", function));
    check(tensor.shape.size() == tensor.strides.size(), "{}: size has {} dimensions but stride has {}", function,
          tensor.shape.size(), tensor.strides.size());
    const std::string what = fmt::format("{}: at byte {}: {}{}", where_, op_offset_, function, shape_str(tensor.shape));
    const uint64_t numel = checked_numel(tensor.shape, what);
    if (numel > 0) {
      // The last element it reaches: offset + sum (size_i - 1) * stride_i.
      uint64_t last = tensor.storage_offset;
      for (size_t d = 0; d < tensor.shape.size(); ++d)
        last = checked_add(last, checked_mul(uint64_t(tensor.shape[d] - 1), uint64_t(tensor.strides[d]), what), what);
      check(last < storage.numel, "{}: a tensor of size {}, stride {} at storage_offset {} reaches element {} of a "
            "{}-element storage '{}'", function, shape_str(tensor.shape), shape_str(tensor.strides),
            tensor.storage_offset, last, storage.numel, printable(storage.text));
      // Zero or overlapping strides (an expanded tensor) would materialize more elements than the
      // file holds; bounding by the storage bounds every copy by the file size.
      check(numel <= storage.numel, "{}: a tensor of size {}, stride {} has {} elements, more than its {}-element storage",
            function, shape_str(tensor.shape), shape_str(tensor.strides), numel, storage.numel);
    }
    return make(std::move(tensor));
  }

  // ('storage', torch.<T>Storage, key: str, location: str, numel: int) — the legacy format adds a
  // sixth item, view metadata, which torch.save has written as None since storage views went away.
  uint32_t persistent_load(uint32_t pid_index) {
    const PickleObject& pid = object(pid_index);
    check(pid.kind == Kind::Tuple, "BINPERSID: the persistent id is a {}, not torch's ('storage', ...) tuple",
          kind_name(pid.kind));
    check(pid.items.size() == 5 || pid.items.size() == 6,
          "BINPERSID: the persistent id has {} items; torch's storage id has 5 (6 in the legacy format)",
          pid.items.size());
    const auto item = [&](size_t i) -> const PickleObject& { return object(pid.items[i]); };
    check(item(0).kind == Kind::String && item(0).text == "storage",
          "BINPERSID: the persistent id does not start with 'storage'");
    check(item(1).kind == Kind::Global && item(1).global == Global::StorageType,
          "BINPERSID: the persistent id's type is a {}, not a torch storage type",
          item(1).kind == Kind::Global ? global_name(item(1).global) : kind_name(item(1).kind));
    check(item(2).kind == Kind::String, "BINPERSID: the storage key is a {}, not a str", kind_name(item(2).kind));
    check(item(3).kind == Kind::String, "BINPERSID: the storage location is a {}, not a str", kind_name(item(3).kind));
    const int64_t numel = int_argument(pid.items[4], "BINPERSID: the storage element count");
    check(pid.items.size() == 5 || item(5).kind == Kind::None,
          "BINPERSID: the storage is a view of another storage (legacy view metadata), which is not supported");
    PickleObject storage;
    storage.kind = Kind::Storage;
    storage.dtype = item(1).dtype;
    storage.text = item(2).text;
    storage.location = item(3).text;
    storage.numel = static_cast<uint64_t>(numel);
    return make(std::move(storage));
  }

  // ---- the opcodes ----------------------------------------------------------------------------

  void step(uint8_t op) {
    switch (op) {
      case 0x80: {  // PROTO
        const uint8_t protocol = read_byte("the PROTO version");
        check(protocol <= 5, "pickle protocol {} is newer than 5", protocol);
        return;
      }
      case 0x95: {  // FRAME: a length prefix for buffering; the opcodes inside are read as usual
        const auto frame_bytes = read_le<uint64_t>("the FRAME length");
        check(frame_bytes <= size_ - position_, "FRAME of {} bytes runs past the {} bytes that remain", frame_bytes,
              size_ - position_);
        return;
      }
      case '(':  // MARK
        check(marks_.size() < kMaxStackDepth, "more than {} nested MARKs", kMaxStackDepth);
        marks_.push_back(stack_.size());
        return;
      case '0': pop("POP"); return;
      case '1': pop_to_mark("POP_MARK"); return;
      case '2': push(top("DUP")); return;
      case 'N': push(make(Kind::None)); return;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        PickleObject object;
        object.kind = Kind::Bool;
        object.boolean = op == 0x88;
        push(make(std::move(object)));
        return;
      }
      case 'J': push(make_int(read_le<int32_t>("BININT"))); return;
      case 'K': push(make_int(read_byte("BININT1"))); return;
      case 'M': push(make_int(read_le<uint16_t>("BININT2"))); return;
      case 0x8a: {  // LONG1: n bytes of little-endian two's complement
        const uint8_t length = read_byte("the LONG1 length");
        push(make_long(take(length, "LONG1"), length));
        return;
      }
      case 0x8b: {  // LONG4
        const auto length = read_le<int32_t>("the LONG4 length");
        check(length >= 0, "LONG4 with negative length {}", length);
        push(make_long(take(uint64_t(length), "LONG4"), uint64_t(length)));
        return;
      }
      case 'G': {  // BINFLOAT: big-endian IEEE double
        uint64_t bits;
        std::memcpy(&bits, take(8, "BINFLOAT"), 8);
        PickleObject object;
        object.kind = Kind::Float;
        object.real = std::bit_cast<double>(__builtin_bswap64(bits));
        push(make(std::move(object)));
        return;
      }
      case 0x8c: {  // SHORT_BINUNICODE
        const uint8_t length = read_byte("the SHORT_BINUNICODE length");
        push(make_text(Kind::String, take(length, "SHORT_BINUNICODE"), length));
        return;
      }
      case 'X': {  // BINUNICODE
        const auto length = read_le<uint32_t>("the BINUNICODE length");
        push(make_text(Kind::String, take(length, "BINUNICODE"), length));
        return;
      }
      case 0x8d: {  // BINUNICODE8
        const auto length = read_le<uint64_t>("the BINUNICODE8 length");
        push(make_text(Kind::String, take(length, "BINUNICODE8"), length));
        return;
      }
      case 'C': {  // SHORT_BINBYTES
        const uint8_t length = read_byte("the SHORT_BINBYTES length");
        push(make_text(Kind::Bytes, take(length, "SHORT_BINBYTES"), length));
        return;
      }
      case 'B': {  // BINBYTES
        const auto length = read_le<uint32_t>("the BINBYTES length");
        push(make_text(Kind::Bytes, take(length, "BINBYTES"), length));
        return;
      }
      case 0x8e: {  // BINBYTES8
        const auto length = read_le<uint64_t>("the BINBYTES8 length");
        push(make_text(Kind::Bytes, take(length, "BINBYTES8"), length));
        return;
      }
      case ']': push(make(Kind::List)); return;
      case '}': push(make(Kind::Dict)); return;
      case ')': push(make_tuple({})); return;
      case 0x85: push(make_tuple({pop("TUPLE1")})); return;
      case 0x86: {  // TUPLE2
        const uint32_t second = pop("TUPLE2"), first = pop("TUPLE2");
        push(make_tuple({first, second}));
        return;
      }
      case 0x87: {  // TUPLE3
        const uint32_t third = pop("TUPLE3"), second = pop("TUPLE3"), first = pop("TUPLE3");
        push(make_tuple({first, second, third}));
        return;
      }
      case 't': push(make_tuple(pop_to_mark("TUPLE"))); return;
      case 'l': {  // LIST
        std::vector<uint32_t> items = pop_to_mark("LIST");
        const uint32_t list = make(Kind::List);
        append(list, items, "LIST");
        push(list);
        return;
      }
      case 'd': {  // DICT
        std::vector<uint32_t> pairs = pop_to_mark("DICT");
        const uint32_t dict = make(Kind::Dict);
        set_items(dict, pairs, "DICT");
        push(dict);
        return;
      }
      case 'a': {  // APPEND
        const uint32_t value = pop("APPEND");
        append(top("APPEND"), {value}, "APPEND");
        return;
      }
      case 'e': {  // APPENDS
        const std::vector<uint32_t> values = pop_to_mark("APPENDS");
        append(top("APPENDS"), values, "APPENDS");
        return;
      }
      case 's': {  // SETITEM
        const uint32_t value = pop("SETITEM"), key = pop("SETITEM");
        set_items(top("SETITEM"), {key, value}, "SETITEM");
        return;
      }
      case 'u': {  // SETITEMS
        const std::vector<uint32_t> pairs = pop_to_mark("SETITEMS");
        set_items(top("SETITEMS"), pairs, "SETITEMS");
        return;
      }
      case 'h': memo_get(read_byte("the BINGET index")); return;
      case 'j': memo_get(read_le<uint32_t>("the LONG_BINGET index")); return;
      case 'q': memo_put(read_byte("the BINPUT index")); return;
      case 'r': memo_put(read_le<uint32_t>("the LONG_BINPUT index")); return;
      case 0x94: memo_put(static_cast<uint32_t>(memo_.size())); return;  // MEMOIZE
      case 'c': {  // GLOBAL "module\nname\n"
        const std::string module(read_line("the GLOBAL module"));
        const std::string_view name = read_line("the GLOBAL name");
        push(find_global(module, name));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        const uint32_t name = pop("STACK_GLOBAL"), module = pop("STACK_GLOBAL");
        check(object(module).kind == Kind::String && object(name).kind == Kind::String,
              "STACK_GLOBAL with a {} module and a {} name (both must be str)", kind_name(object(module).kind),
              kind_name(object(name).kind));
        push(find_global(object(module).text, object(name).text));
        return;
      }
      case 'i': {  // INST "module\nname\n", arguments above the MARK
        const std::string module(read_line("the INST module"));
        const std::string name(read_line("the INST name"));
        const uint32_t callable = find_global(module, name);
        const std::vector<uint32_t> args = pop_to_mark("INST");
        push(call(callable, args, "INST"));
        return;
      }
      case 'o': {  // OBJ: callable and arguments above the MARK
        std::vector<uint32_t> items = pop_to_mark("OBJ");
        check(!items.empty(), "OBJ with nothing above its MARK");
        const uint32_t callable = items.front();
        items.erase(items.begin());
        push(call(callable, items, "OBJ"));
        return;
      }
      case 'R': {  // REDUCE
        const uint32_t args = pop("REDUCE"), callable = pop("REDUCE");
        check(object(args).kind == Kind::Tuple, "REDUCE with {} arguments, not a tuple", kind_name(object(args).kind));
        const std::vector<uint32_t> items = object(args).items;  // a copy: call() may grow objects_
        push(call(callable, items, "REDUCE"));
        return;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args); only OrderedDict is a class here
        const uint32_t args = pop("NEWOBJ"), cls = pop("NEWOBJ");
        check(object(args).kind == Kind::Tuple, "NEWOBJ with {} arguments, not a tuple", kind_name(object(args).kind));
        check(object(cls).kind == Kind::Global && object(cls).global == Global::OrderedDict,
              "NEWOBJ on {}, which is not a class a checkpoint may instantiate",
              object(cls).kind == Kind::Global ? global_name(object(cls).global) : kind_name(object(cls).kind));
        const std::vector<uint32_t> items = object(args).items;
        push(call(cls, items, "NEWOBJ"));
        return;
      }
      case 'b': {  // BUILD: only an OrderedDict's attribute dict (a state dict's `_metadata`), which is dropped
        const uint32_t state = pop("BUILD");
        const PickleObject& target = object(top("BUILD"));
        check(target.kind == Kind::Dict, "BUILD on a {}: only a dict's attributes may be set", kind_name(target.kind));
        check(object(state).kind == Kind::Dict || object(state).kind == Kind::None,
              "BUILD with a {} state (only a dict of attributes is accepted)", kind_name(object(state).kind));
        return;
      }
      case 'Q': push(persistent_load(pop("BINPERSID"))); return;
      case 'P': refuse("opcode PERSID (a text persistent id): torch.save writes only BINPERSID");
      case 0x92: refuse("opcode NEWOBJ_EX: torch.save never writes it (keyword-argument construction)");
      case 0x82:
      case 0x83:
      case 0x84: refuse("opcode EXT{} (the copyreg extension registry names a global by number)", op == 0x82 ? 1 : op == 0x83 ? 2 : 4);
      case 0x8f:
      case 0x90:
      case 0x91: refuse("opcode 0x{:02x} (set / frozenset): not a container a checkpoint holds", op);
      case 0x96:
      case 0x97:
      case 0x98: refuse("opcode 0x{:02x} (out-of-band buffer): not used by torch.save", op);
      case 'I': case 'L': case 'F': case 'S': case 'V': case 'T': case 'U': case 'g': case 'p':
        refuse("protocol-0/1 text opcode '{}': torch.save writes protocol 2 or newer", static_cast<char>(op));
      default:
        refuse("unknown or unsupported pickle opcode 0x{:02x}", op);
    }
  }

  uint32_t make_long(const uint8_t* data, uint64_t length) {
    PickleObject object;
    if (length <= 8) {
      uint64_t value = 0;
      for (uint64_t i = 0; i < length; ++i) value |= uint64_t(data[i]) << (8 * i);
      if (length > 0 && length < 8 && (data[length - 1] & 0x80)) value |= ~uint64_t(0) << (8 * length);  // sign-extend
      object.kind = Kind::Int;
      object.integer = static_cast<int64_t>(value);
    } else {
      object.kind = Kind::BigInt;
      object.text.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(length));
    }
    return make(std::move(object));
  }

  void memo_get(uint32_t index) {
    const auto it = memo_.find(index);
    check(it != memo_.end(), "memo index {} was never stored (BINPUT) before it is read", index);
    push(it->second);
  }
  void memo_put(uint32_t index) {
    const uint32_t value = top("BINPUT / MEMOIZE");
    check(memo_.size() < kMaxObjects || memo_.contains(index), "more than {} memo entries", kMaxObjects);
    memo_[index] = value;
  }

  const uint8_t* bytes_;
  size_t size_;
  const std::string& where_;
  size_t position_ = 0;
  size_t op_offset_ = 0;
  size_t total_items_ = 0;
  std::vector<PickleObject> objects_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;  // stack depth at each open MARK
  std::unordered_map<uint32_t, uint32_t> memo_;
  std::unordered_map<uint32_t, std::unordered_map<std::string, size_t>> dict_slots_;  // dict -> key -> item index
};

}  // namespace

Pickle unpickle_restricted(const uint8_t* bytes, size_t size, const std::string& where) {
  return Unpickler(bytes, size, where).run();
}

}  // namespace splitflow
