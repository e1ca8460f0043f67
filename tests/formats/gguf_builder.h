// tests/formats/gguf_builder.h — writes GGUF files byte by byte from the GGUF spec (independent of
// the reader), so tests can build valid files and damage any field.
#pragma once

#include "format_test_util.h"

#include <cstdint>
#include <string>
#include <vector>

namespace splitflow::test {

enum GgufType : uint32_t {
  kGgufU8 = 0, kGgufI8 = 1, kGgufU16 = 2, kGgufI16 = 3, kGgufU32 = 4, kGgufI32 = 5, kGgufF32 = 6,
  kGgufBool = 7, kGgufString = 8, kGgufArray = 9, kGgufU64 = 10, kGgufI64 = 11, kGgufF64 = 12,
};
enum GgmlType : uint32_t { kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4K = 12, kGgmlI32 = 26, kGgmlBF16 = 30 };

struct GgufBuilder {
  uint32_t version = 3;
  uint64_t alignment = 32;  // padding before the data section; set general.alignment to match
  uint64_t kv_count = 0, tensor_count = 0;
  ByteWriter kv, infos;
  std::string data;

  // Starts a key/value; the caller appends the value to `kv`.
  ByteWriter& key(std::string_view name, uint32_t type) {
    ++kv_count;
    return kv.str(name).put<uint32_t>(type);
  }
  void info(std::string_view name, const std::vector<uint64_t>& ne, uint32_t ggml_type, uint64_t offset) {
    ++tensor_count;
    infos.str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t extent : ne) infos.put<uint64_t>(extent);
    infos.put<uint32_t>(ggml_type).put<uint64_t>(offset);
  }
  // Tensor info plus its bytes, placed at the next aligned offset of the data section.
  void tensor(std::string_view name, const std::vector<uint64_t>& ne, uint32_t ggml_type, std::string_view bytes) {
    data.resize((data.size() + alignment - 1) / alignment * alignment, '\0');
    info(name, ne, ggml_type, data.size());
    data.append(bytes);
  }
  std::string bytes() const {
    ByteWriter out;
    out.raw("GGUF").put<uint32_t>(version).put<uint64_t>(tensor_count).put<uint64_t>(kv_count);
    out.raw(kv.bytes).raw(infos.bytes).pad_to(alignment).raw(data);
    return out.bytes;
  }
};

}  // namespace splitflow::test
