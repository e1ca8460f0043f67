// GGUF reader (v2/v3). Layout: "GGUF", u32 version, u64 tensor count, u64 key/value count, the
// key/values, the tensor infos (name, u32 n_dims, u64 ne[n_dims] innermost first, u32 ggml type,
// u64 offset), padding to `general.alignment`, then the data section the offsets point into.
#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/byte_reader.h"
#include "formats/gguf_types.h"
#include "formats/weight_set.h"

#include <array>
#include <limits>
#include <optional>

namespace splitflow {
namespace {

using nlohmann::json;

enum GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
constexpr int kMaxArrayNesting = 8;  // bounds recursion on corrupt files
constexpr uint32_t kMaxDims = 4;     // GGML_MAX_DIMS

// Smallest encoding of one value of `type`, so an element count can be checked against the bytes
// left before anything is allocated. Zero for an unknown type.
uint64_t min_value_bytes(uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: case kString: return 8;
    case kArray: return 12;  // element type + count
    default: return 0;
  }
}

json read_value(ByteReader& in, uint32_t type, const std::string& key, int depth) {
  switch (type) {
    case kU8: return in.read<uint8_t>(key);
    case kI8: return in.read<int8_t>(key);
    case kU16: return in.read<uint16_t>(key);
    case kI16: return in.read<int16_t>(key);
    case kU32: return in.read<uint32_t>(key);
    case kI32: return in.read<int32_t>(key);
    case kF32: return in.read<float>(key);
    case kBool: return in.read<uint8_t>(key) != 0;
    case kString: return std::string(in.string(key));
    case kU64: return in.read<uint64_t>(key);
    case kI64: return in.read<int64_t>(key);
    case kF64: return in.read<double>(key);
    case kArray: {
      SF_CHECK(depth < kMaxArrayNesting, "'{}': key '{}' nests arrays deeper than {}", in.path(), key, kMaxArrayNesting);
      const auto element_type = in.read<uint32_t>(key + " array type");
      const uint64_t element_bytes = min_value_bytes(element_type);
      SF_CHECK(element_bytes > 0, "'{}': key '{}' has an array of unknown value type {}", in.path(), key, element_type);
      const auto count = in.read<uint64_t>(key + " array count");
      SF_CHECK(count <= in.remaining() / element_bytes,
               "'{}': key '{}' claims {} array elements but only {} bytes remain at offset {}", in.path(), key, count,
               in.remaining(), in.offset());
      json array = json::array();
      array.get_ref<json::array_t&>().reserve(count);
      for (uint64_t i = 0; i < count; ++i) array.push_back(read_value(in, element_type, key, depth + 1));
      return array;
    }
    default: fail("'{}': key '{}' has unknown value type {}", in.path(), key, type);
  }
}

// ggml_type ids (ggml.h); empty entries are ids llama.cpp has retired.
constexpr std::array<std::string_view, 40> kGgmlTypeNames = {
    "F32",     "F16",     "Q4_0",     "Q4_1",     "",         "",         "Q5_0",     "Q5_1",    "Q8_0",   "Q8_1",
    "Q2_K",    "Q3_K",    "Q4_K",     "Q5_K",     "Q6_K",     "Q8_K",     "IQ2_XXS",  "IQ2_XS",  "IQ3_XXS", "IQ1_S",
    "IQ4_NL",  "IQ3_S",   "IQ2_S",    "IQ4_XS",   "I8",       "I16",      "I32",      "I64",     "F64",    "IQ1_M",
    "BF16",    "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",   "TQ2_0",    "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};

// A metadata value as text for a message. GGUF strings are raw bytes, which json::dump refuses
// (type_error 316) unless told to replace invalid UTF-8.
std::string value_text(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

uint64_t read_alignment(const json& metadata, const std::string& path) {
  const auto it = metadata.find("general.alignment");
  if (it == metadata.end()) return 32;
  SF_CHECK(it->is_number_unsigned(), "'{}': general.alignment is not an unsigned integer: {}", path, value_text(*it));
  const auto alignment = it->get<uint64_t>();
  SF_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0 && alignment <= (1u << 20),
           "'{}': general.alignment {} is not a power of two up to 1 MiB", path, alignment);
  return alignment;
}

// Model-level sizes the spec reads from `{architecture}.<key>`, with their bounds (weight_set.h). A
// key may hold one integer or one per layer (OpenELM's head counts).
struct ModelCountLimit {
  std::string_view key;
  uint64_t max;
};
constexpr ModelCountLimit kModelCountLimits[] = {
    {"block_count", kMaxLayers},         {"context_length", kMaxContextTokens},
    {"vocab_size", kMaxVocabSize},       {"embedding_length", kMaxWidth},
    {"feed_forward_length", kMaxWidth},  {"expert_feed_forward_length", kMaxWidth},
    {"expert_count", kMaxHeads},         {"expert_used_count", kMaxHeads},
    {"attention.head_count", kMaxHeads}, {"attention.head_count_kv", kMaxHeads},
    {"attention.key_length", kMaxWidth}, {"attention.value_length", kMaxWidth},
    {"rope.dimension_count", kMaxWidth}};

void check_model_counts(const json& metadata, uint64_t tensor_count, const std::string& path) {
  const auto architecture = metadata.find("general.architecture");
  if (architecture == metadata.end() || !architecture->is_string()) return;  // config resolution reports it
  for (const ModelCountLimit& limit : kModelCountLimits) {
    const std::string key = fmt::format("{}.{}", architecture->get_ref<const std::string&>(), limit.key);
    const auto found = metadata.find(key);
    if (found == metadata.end()) continue;
    const json per_layer = found->is_array() ? *found : json::array({*found});
    for (const json& value : per_layer) {
      SF_CHECK(value.is_number_integer() && value >= 0, "'{}': {} is {}, expected a non-negative integer", path, key,
               value_text(value));
      SF_CHECK(value.get<uint64_t>() <= limit.max, "'{}': {} is {}, more than the {} any model needs", path, key,
               value.get<uint64_t>(), limit.max);
    }
  }
  // Every block holds at least one tensor; a vocabulary-only file (no tensors) has no blocks to check.
  const auto block_count = metadata.find(fmt::format("{}.block_count", architecture->get_ref<const std::string&>()));
  if (tensor_count > 0 && block_count != metadata.end() && block_count->is_number_integer())
    SF_CHECK(block_count->get<uint64_t>() <= tensor_count, "'{}': {} is {}, but the file holds only {} tensors", path,
             block_count.key(), block_count->get<uint64_t>(), tensor_count);
}

struct PendingTensor {
  std::string name;
  Shape shape;  // torch order
  DType dtype;
  uint64_t offset;  // into the data section
  uint64_t nbytes;
};

}  // namespace

std::unique_ptr<WeightSource> open_gguf(const std::string& path) {
  const auto file = MappedFile::open(path);
  ByteReader in(*file);
  const uint8_t* magic = in.bytes(4, "GGUF magic");
  SF_CHECK(std::string_view(reinterpret_cast<const char*>(magic), 4) == "GGUF", "'{}': not a GGUF file (bad magic)", path);
  const auto version = in.read<uint32_t>("GGUF version");
  SF_CHECK(version == 2 || version == 3, "'{}': GGUF version {} is not supported (need 2 or 3)", path, version);
  const auto tensor_count = in.read<uint64_t>("tensor count");
  const auto kv_count = in.read<uint64_t>("key/value count");
  // A key/value takes at least 13 bytes (key length, type, one byte); a tensor info at least 24.
  SF_CHECK(kv_count <= in.remaining() / 13, "'{}': claims {} key/values, more than the file can hold", path, kv_count);
  SF_CHECK(tensor_count <= in.remaining() / 24, "'{}': claims {} tensors, more than the file can hold", path,
           tensor_count);

  auto source = std::make_unique<WeightSet>("gguf");
  json& metadata = source->metadata();
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key(in.string(fmt::format("key #{}", i)));
    const auto type = in.read<uint32_t>(key + " value type");
    json value = read_value(in, type, key, 0);
    SF_CHECK(!metadata.contains(key), "'{}': key '{}' appears twice", path, key);
    metadata[key] = std::move(value);
  }
  const uint64_t alignment = read_alignment(metadata, path);

  std::vector<PendingTensor> pending;
  pending.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    std::string name(in.string(fmt::format("tensor #{} name", i)));
    const auto n_dims = in.read<uint32_t>(name + " n_dims");
    SF_CHECK(n_dims <= kMaxDims, "'{}': tensor '{}' has {} dimensions (at most {})", path, name, n_dims, kMaxDims);
    Shape shape(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto extent = in.read<uint64_t>(name + " ne");
      SF_CHECK(extent <= uint64_t(std::numeric_limits<int64_t>::max()), "'{}': tensor '{}' has dimension {} of {}",
               path, name, d, extent);
      shape[n_dims - 1 - d] = static_cast<int64_t>(extent);  // ne is innermost first
    }
    const uint64_t numel = checked_numel(shape, fmt::format("'{}': tensor '{}' element count", path, name));
    const auto ggml_type = in.read<uint32_t>(name + " type");
    const auto offset = in.read<uint64_t>(name + " offset");
    const std::optional<DType> dtype = dtype_from_gguf_type(ggml_type);
    if (!dtype) {
      if (ggml_type < kGgmlTypeNames.size() && !kGgmlTypeNames[ggml_type].empty())
        fail("'{}': tensor '{}' has ggml type {}, which splitflow does not run (it runs F32, F16, BF16, I8-I64, F64, "
             "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and its own types from id {})",
             path, name, kGgmlTypeNames[ggml_type], kSplitflowTypeBase);
      fail("'{}': tensor '{}' has unknown ggml type {}", path, name, ggml_type);
    }
    uint64_t nbytes = 0;
    if (is_quantized(*dtype)) {
      const int64_t row_len = shape.empty() ? 1 : shape.back();
      SF_CHECK(row_len % dtype_block_elems(*dtype) == 0,
               "'{}': tensor '{}' of type {} has rows of {} elements, not a whole number of {}-element blocks", path,
               name, dtype_name(*dtype), row_len, dtype_block_elems(*dtype));
      nbytes = checked_mul(numel / static_cast<uint64_t>(row_len == 0 ? 1 : row_len), dtype_row_bytes(*dtype, row_len),
                           fmt::format("'{}': tensor '{}' byte size", path, name));
    } else {
      nbytes = checked_mul(numel, dtype_size(*dtype), fmt::format("'{}': tensor '{}' byte size", path, name));
    }
    SF_CHECK(offset % alignment == 0, "'{}': tensor '{}' offset {} is not a multiple of the alignment {}", path, name,
             offset, alignment);
    pending.push_back({std::move(name), std::move(shape), *dtype, offset, nbytes});
  }

  // The data section starts at the next multiple of the alignment. A file without tensors (a
  // vocab-only GGUF) may end before that padding.
  const uint64_t data_start = (in.offset() + alignment - 1) / alignment * alignment;
  std::vector<DataRange> ranges;
  ranges.reserve(pending.size());
  for (const PendingTensor& tensor : pending) {
    const uint64_t begin = data_start + tensor.offset;  // offset <= file size is checked first, so no overflow
    SF_CHECK(tensor.offset <= file->size() && begin <= file->size() && tensor.nbytes <= file->size() - begin,
             "'{}': tensor '{}' data (offset {}, {} bytes, from data section at {}) lies beyond the end of the {}-byte file",
             path, tensor.name, tensor.offset, tensor.nbytes, data_start, file->size());
    ranges.push_back({tensor.name, tensor.offset, tensor.offset + tensor.nbytes});
  }
  check_disjoint(std::move(ranges), path);
  check_model_counts(metadata, pending.size(), path);
  for (PendingTensor& tensor : pending) {
    const uint8_t* bytes = file->data() + data_start + tensor.offset;
    source->add(tensor.name, tensor_from_file(tensor.dtype, std::move(tensor.shape), bytes, file), path);
  }
  return source;
}

}  // namespace splitflow
