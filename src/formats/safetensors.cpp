// safetensors reader (single file and sharded index) and writer.
// Layout: u64 LE header length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {str: str}}, then the data section; offsets are relative to the data section.
#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/byte_reader.h"
#include "formats/safetensors_writer.h"
#include "formats/weight_set.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace splitflow {
namespace {

using nlohmann::json;

struct SafetensorsDType {
  std::string_view name;
  DType dtype;
};
constexpr SafetensorsDType kSafetensorsDTypes[] = {
    {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F64", DType::F64}, {"I8", DType::I8},
    {"I16", DType::I16}, {"I32", DType::I32}, {"I64", DType::I64},   {"U8", DType::U8},   {"BOOL", DType::Bool},
    {"F8_E4M3", DType::F8E4M3}};  // FP8 checkpoints (weights only; quant::pack_fp8_checkpoint_weight)

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& entry : kSafetensorsDTypes)
    if (entry.dtype == dtype) return entry.name;
  fail("dtype {} has no safetensors name", dtype_name(dtype));
}

// A non-negative JSON integer; `what` names the field for the message.
uint64_t json_count(const json& value, const std::string& what) {
  SF_CHECK(value.is_number_integer(), "{} is not an integer: {}", what, value.dump());
  SF_CHECK(value.is_number_unsigned(), "{} is negative: {}", what, value.dump());
  return value.get<uint64_t>();
}

// One header entry as a tensor view; `range` receives its [begin, end) in the data section.
Tensor read_entry(const std::shared_ptr<const MappedFile>& file, const std::string& name, const json& entry,
                  const uint8_t* data, uint64_t data_bytes, DataRange& range) {
  const std::string where = fmt::format("'{}': tensor '{}'", file->path(), name);
  SF_CHECK(entry.is_object(), "{}: header entry is not an object", where);

  const auto dtype_field = entry.find("dtype");
  SF_CHECK(dtype_field != entry.end() && dtype_field->is_string(), "{}: missing or non-string 'dtype'", where);
  const auto dtype_text = dtype_field->get<std::string>();
  const SafetensorsDType* dtype = nullptr;
  for (const auto& known : kSafetensorsDTypes)
    if (known.name == dtype_text) dtype = &known;
  SF_CHECK(dtype != nullptr, "{}: dtype '{}' is not supported (supported: F32, F16, BF16, F64, I8, I16, I32, I64, U8, BOOL, F8_E4M3)",
           where, dtype_text);

  const auto shape_field = entry.find("shape");
  SF_CHECK(shape_field != entry.end() && shape_field->is_array(), "{}: missing or non-array 'shape'", where);
  Shape shape;
  for (const json& extent : *shape_field) {
    const uint64_t value = json_count(extent, where + ": a shape dimension");
    SF_CHECK(value <= uint64_t(std::numeric_limits<int64_t>::max()), "{}: shape dimension {} is too large", where, value);
    shape.push_back(static_cast<int64_t>(value));
  }
  const uint64_t numel = checked_numel(shape, where + ": element count");
  const uint64_t nbytes = checked_mul(numel, dtype_size(dtype->dtype), where + ": byte size");

  const auto offsets = entry.find("data_offsets");
  SF_CHECK(offsets != entry.end() && offsets->is_array() && offsets->size() == 2,
           "{}: 'data_offsets' must be an array [begin, end]", where);
  const uint64_t begin = json_count((*offsets)[0], where + ": data_offsets begin");
  const uint64_t end = json_count((*offsets)[1], where + ": data_offsets end");
  SF_CHECK(begin <= end && end <= data_bytes, "{}: data_offsets [{}, {}] lie outside the {}-byte data section", where,
           begin, end, data_bytes);
  SF_CHECK(end - begin == nbytes, "{}: data_offsets span {} bytes but shape {} of {} needs {}", where, end - begin,
           shape_str(shape), dtype_text, nbytes);
  range = {name, begin, end};
  return tensor_from_file(dtype->dtype, std::move(shape), data + begin, file);
}

json parse_json(const char* begin, const char* end, const std::string& path, std::string_view what) {
  try {
    return json::parse(begin, end);
  } catch (const json::exception& error) {
    fail("'{}': {} is not valid JSON: {}", path, what, error.what());
  }
}

}  // namespace

std::unique_ptr<WeightSource> open_safetensors(const std::string& path) {
  const auto file = MappedFile::open(path);
  const uint64_t file_bytes = file->size();
  SF_CHECK(file_bytes >= 8, "'{}': {} bytes is too small for a safetensors file (the header length alone takes 8)", path,
           file_bytes);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, file->data(), 8);
  SF_CHECK(header_bytes <= file_bytes - 8, "'{}': header length {} exceeds the {} bytes that follow it", path,
           header_bytes, file_bytes - 8);
  const auto* header_text = reinterpret_cast<const char*>(file->data() + 8);
  const json header = parse_json(header_text, header_text + header_bytes, path, "the safetensors header");
  SF_CHECK(header.is_object(), "'{}': the safetensors header is not a JSON object", path);

  const uint8_t* data = file->data() + 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;
  auto source = std::make_unique<WeightSet>("safetensors");
  std::vector<DataRange> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      SF_CHECK(entry.is_object(), "'{}': '__metadata__' is not a JSON object", path);
      source->metadata() = entry;
      continue;
    }
    DataRange range;
    source->add(name, read_entry(file, name, entry, data, data_bytes, range), path);
    ranges.push_back(std::move(range));
  }
  check_disjoint(std::move(ranges), path);
  return source;
}

std::unique_ptr<WeightSource> open_safetensors_index(const std::string& index_path) {
  return open_sharded_index(index_path, "safetensors", "the safetensors index", open_safetensors);
}

void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorInfo& info : tensors) {
    SF_CHECK(info.name != "__metadata__", "writing '{}': '__metadata__' cannot name a tensor", path);
    SF_CHECK(!header.contains(info.name), "writing '{}': tensor '{}' is given twice", path, info.name);
    SF_CHECK(info.tensor.data != nullptr || info.tensor.numel() == 0, "writing '{}': tensor '{}' has no data", path,
             info.name);
    const uint64_t nbytes = info.tensor.nbytes();
    header[info.name] = {{"dtype", safetensors_dtype_name(info.tensor.dtype)},
                         {"shape", info.tensor.shape},
                         {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& error) {
    fail("writing '{}': a tensor name or metadata string is not valid UTF-8: {}", path, error.what());
  }
  header_text.resize((header_text.size() + 7) / 8 * 8, ' ');

  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    SF_CHECK(out.good(), "cannot create '{}': {}", temporary, std::strerror(errno));
    const uint64_t header_bytes = header_text.size();
    out.write(reinterpret_cast<const char*>(&header_bytes), sizeof header_bytes);
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (const TensorInfo& info : tensors)
      out.write(static_cast<const char*>(info.tensor.data), static_cast<std::streamsize>(info.tensor.nbytes()));
    out.flush();
    SF_CHECK(out.good(), "cannot write '{}': {}", temporary, std::strerror(errno));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  SF_CHECK(!error, "cannot rename '{}' to '{}': {}", temporary, path, error.message());
}

}  // namespace splitflow
