#include "formats/gguf_writer.h"

#include "core/error.h"
#include "formats/gguf_types.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

namespace splitflow {
namespace {

using nlohmann::json;

enum GgufValueType : uint32_t {
  kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9, kU64 = 10, kI64 = 11,
};

class Out {
 public:
  explicit Out(const std::string& path) : path_(path), file_(path, std::ios::binary | std::ios::trunc) {
    SF_CHECK(file_.good(), "'{}': cannot open it for writing", path);
  }
  template <typename T>
  void put(T value) { write(&value, sizeof value); }
  void put_string(const std::string& text) {
    put<uint64_t>(text.size());
    write(text.data(), text.size());
  }
  void write(const void* data, size_t bytes) {
    file_.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    SF_CHECK(file_.good(), "'{}': write failed (disk full?)", path_);
    offset_ += bytes;
  }
  void pad_to(uint64_t alignment) {
    static const char zeros[64] = {};
    while (offset_ % alignment != 0) write(zeros, std::min<uint64_t>(alignment - offset_ % alignment, sizeof zeros));
  }
  uint64_t offset() const { return offset_; }
  void close() {
    file_.close();
    SF_CHECK(!file_.fail(), "'{}': closing failed", path_);
  }

 private:
  std::string path_;
  std::ofstream file_;
  uint64_t offset_ = 0;
};

uint32_t value_type(const json& value, const std::string& key) {
  switch (value.type()) {
    case json::value_t::string: return kString;
    case json::value_t::boolean: return kBool;
    case json::value_t::number_float: return kF32;
    case json::value_t::number_unsigned:
      return value.get<uint64_t>() <= std::numeric_limits<uint32_t>::max() ? kU32 : kU64;
    case json::value_t::number_integer: {
      const auto v = value.get<int64_t>();
      return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max() ? kI32 : kI64;
    }
    case json::value_t::array: return kArray;
    default: fail("GGUF key '{}': a {} value has no GGUF type", key, value.type_name());
  }
}

// An array's element type: the widest its elements need (all strings, all numbers, ...).
uint32_t element_type(const json& array, const std::string& key) {
  if (array.empty()) return kI32;
  uint32_t type = value_type(array.front(), key);
  for (const json& element : array) {
    const uint32_t t = value_type(element, key);
    if (t == type) continue;
    const bool numbers = (t == kU32 || t == kI32 || t == kU64 || t == kI64) &&
                         (type == kU32 || type == kI32 || type == kU64 || type == kI64);
    SF_CHECK(numbers, "GGUF key '{}': an array mixes value types", key);
    type = (t == kI64 || type == kI64 || t == kU64 || type == kU64) ? kI64 : kI32;
  }
  return type;
}

void write_value(Out& out, const json& value, uint32_t type, const std::string& key) {
  switch (type) {
    case kString: out.put_string(value.get<std::string>()); return;
    case kBool: out.put<uint8_t>(value.get<bool>() ? 1 : 0); return;
    case kF32: out.put<float>(value.get<float>()); return;
    case kU32: out.put<uint32_t>(value.get<uint32_t>()); return;
    case kU64: out.put<uint64_t>(value.get<uint64_t>()); return;
    case kI32: out.put<int32_t>(static_cast<int32_t>(value.get<int64_t>())); return;
    case kI64: out.put<int64_t>(value.get<int64_t>()); return;
    case kArray: {
      const uint32_t elements = element_type(value, key);
      out.put<uint32_t>(elements);
      out.put<uint64_t>(value.size());
      for (const json& element : value) write_value(out, element, elements, key);
      return;
    }
    default: fail("GGUF key '{}': unsupported value type {}", key, type);
  }
}

}  // namespace

void write_gguf(const std::string& path, const json& metadata, const std::vector<TensorInfo>& tensors,
                uint32_t alignment) {
  SF_CHECK(metadata.is_object(), "'{}': GGUF metadata must be a JSON object", path);
  SF_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "'{}': alignment {} is not a power of two", path,
           alignment);
  json keys = metadata;
  keys.erase("general.alignment");
  if (alignment != 32) keys["general.alignment"] = alignment;

  const std::string tmp = path + ".tmp";
  try {
    Out out(tmp);
    out.write("GGUF", 4);
    out.put<uint32_t>(3);
    out.put<uint64_t>(tensors.size());
    out.put<uint64_t>(keys.size());
    for (const auto& [key, value] : keys.items()) {
      out.put_string(key);
      const uint32_t type = value_type(value, key);
      out.put<uint32_t>(type);
      write_value(out, value, type, key);
    }
    uint64_t data_offset = 0;
    std::vector<uint64_t> offsets;
    for (const TensorInfo& info : tensors) {
      const Tensor& t = info.tensor;
      SF_CHECK(!t.empty() && !t.generated, "'{}': tensor '{}' has no data", path, info.name);
      SF_CHECK(t.shape.size() <= 4, "'{}': tensor '{}' has {} dimensions (GGUF allows 4)", path, info.name,
               t.shape.size());
      out.put_string(info.name);
      out.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
      for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) out.put<uint64_t>(static_cast<uint64_t>(*it));
      out.put<uint32_t>(gguf_type_of(t.dtype));
      out.put<uint64_t>(data_offset);
      offsets.push_back(data_offset);
      data_offset = (data_offset + t.nbytes() + alignment - 1) / alignment * alignment;
    }
    out.pad_to(alignment);
    const uint64_t data_start = out.offset();
    for (size_t i = 0; i < tensors.size(); ++i) {
      out.pad_to(alignment);
      SF_CHECK(out.offset() - data_start == offsets[i], "'{}': tensor '{}' offset bookkeeping failed", path,
               tensors[i].name);
      out.write(tensors[i].tensor.data, tensors[i].tensor.nbytes());
    }
    out.close();
    std::filesystem::rename(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace splitflow
