#include "formats/weight_source.h"

#include "core/error.h"
#include "formats/pickle.h"
#include "formats/weight_set.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

namespace splitflow {

const TensorInfo* WeightSource::find(const std::string& name) const {
  for (const TensorInfo& info : tensors())
    if (info.name == name) return &info;
  return nullptr;
}

void WeightSet::add(std::string name, Tensor tensor, std::string file) {
  const auto [it, inserted] = index_by_name_.emplace(name, tensors_.size());
  SF_CHECK(inserted, "tensor '{}' appears twice: in '{}' and in '{}'", name, tensors_[it->second].file, file);
  tensors_.push_back(TensorInfo{std::move(name), std::move(tensor), std::move(file)});
}

std::unique_ptr<WeightSource> open_sharded_index(
    const std::string& index_path, const std::string& format, std::string_view what,
    const std::function<std::unique_ptr<WeightSource>(const std::string& shard_path)>& open_shard) {
  namespace fs = std::filesystem;
  const std::string text = read_text_file(index_path);
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    fail("'{}': {} is not valid JSON: {}", index_path, what, error.what());
  }
  SF_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
           "'{}': {} has no 'weight_map' object", index_path, what);
  const nlohmann::json& weight_map = index["weight_map"];

  std::map<std::string, std::unique_ptr<WeightSource>> shards;  // shard file name -> reader, each opened once
  for (const auto& [name, shard] : weight_map.items()) {
    SF_CHECK(shard.is_string(), "'{}': weight_map entry for tensor '{}' is not a file name", index_path, name);
    shards.try_emplace(shard.get<std::string>());
  }
  auto source = std::make_unique<WeightSet>(format);
  if (index.contains("metadata") && index["metadata"].is_object()) source->metadata() = index["metadata"];
  const fs::path directory = fs::path(index_path).parent_path();
  for (auto& [shard_name, shard] : shards) {
    try {
      shard = open_shard((directory / shard_name).string());
    } catch (const Error& error) {
      fail("'{}': shard '{}': {}", index_path, shard_name, error.what());
    }
    for (const auto& [key, value] : shard->metadata().items()) source->metadata()[key] = value;
    for (const TensorInfo& info : shard->tensors()) source->add(info.name, info.tensor, info.file);
  }
  for (const auto& [name, shard] : weight_map.items()) {
    SF_CHECK(shards.at(shard.get<std::string>())->find(name) != nullptr,
             "'{}': tensor '{}' is listed in shard '{}', which has no such tensor", index_path, name,
             shard.get<std::string>());
  }
  return source;
}

void check_disjoint(std::vector<DataRange> ranges, const std::string& path) {
  std::erase_if(ranges, [](const DataRange& range) { return range.begin == range.end; });
  std::sort(ranges.begin(), ranges.end(), [](const DataRange& a, const DataRange& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const DataRange &previous = ranges[i - 1], &next = ranges[i];
    SF_CHECK(previous.end <= next.begin, "'{}': tensors '{}' (data bytes [{}, {})) and '{}' ([{}, {})) overlap", path,
             previous.tensor, previous.begin, previous.end, next.tensor, next.begin, next.end);
  }
}

Tensor tensor_from_file(DType dtype, Shape shape, const uint8_t* bytes, const std::shared_ptr<const MappedFile>& file) {
  // Quantized blocks are read bytewise (ggml's blocks are 2-byte aligned at most).
  const size_t alignment = is_quantized(dtype) ? 1 : dtype_size(dtype);
  if (reinterpret_cast<uintptr_t>(bytes) % alignment == 0)
    return Tensor::view(dtype, std::move(shape), bytes, file);
  Tensor copy = Tensor::zeros(dtype, std::move(shape));
  std::memcpy(copy.data, bytes, copy.nbytes());
  return copy;
}

std::unique_ptr<WeightSource> open_weights(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    // HF's own order of preference: safetensors, then the PyTorch pickle checkpoint.
    const fs::path directory(path);
    if (fs::exists(directory / "model.safetensors")) return open_safetensors(directory / "model.safetensors");
    if (fs::exists(directory / "model.safetensors.index.json"))
      return open_safetensors_index(directory / "model.safetensors.index.json");
    if (fs::exists(directory / "pytorch_model.bin")) return open_pytorch(directory / "pytorch_model.bin");
    if (fs::exists(directory / "pytorch_model.bin.index.json"))
      return open_pytorch_index(directory / "pytorch_model.bin.index.json");
    fail("'{}': directory has none of model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
         "pytorch_model.bin.index.json",
         path);
  }
  if (path.ends_with(".bin.index.json")) return open_pytorch_index(path);
  if (path.ends_with(".index.json")) return open_safetensors_index(path);
  if (path.ends_with(".safetensors")) return open_safetensors(path);
  if (path.ends_with(".gguf")) return open_gguf(path);
  if (path.ends_with(".pt") || path.ends_with(".pth")) return open_pytorch(path);
  const auto file = MappedFile::open(path);
  if (file->size() >= 4 && std::memcmp(file->data(), "GGUF", 4) == 0) return open_gguf(path);
  if (looks_like_pytorch(*file)) return open_pytorch(path);
  return open_llama2c(path);
}

}  // namespace splitflow
