// formats/weight_set.h — the WeightSource every reader fills (internal to formats/): tensors in the
// order the reader adds them, a duplicate-name check, the metadata object, and the helper that turns
// a byte range of a mapped file into a tensor.
#pragma once

#include "core/mapped_file.h"
#include "formats/weight_source.h"

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

namespace splitflow {

class WeightSet final : public WeightSource {
 public:
  explicit WeightSet(std::string format) : format_(std::move(format)) {}

  std::string format() const override { return format_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const nlohmann::json& metadata() const override { return metadata_; }
  nlohmann::json& metadata() { return metadata_; }

  // A second tensor of the same name is an error naming both files.
  void add(std::string name, Tensor tensor, std::string file);

 private:
  std::string format_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_by_name_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

// A sharded checkpoint's index (model.safetensors.index.json, pytorch_model.bin.index.json): its
// weight_map names each tensor's shard file, next to the index; every shard is opened once with
// `open_shard`, its tensors and metadata merged (the index's metadata first) into a WeightSet of
// `format`. Errors name the index (`what` says what it is: "the safetensors index"): invalid JSON,
// no weight_map object, an entry that is not a file name, a shard that fails to open, a tensor
// the map places in a shard that lacks it; a tensor in two shards is WeightSet::add's error.
std::unique_ptr<WeightSource> open_sharded_index(
    const std::string& index_path, const std::string& format, std::string_view what,
    const std::function<std::unique_ptr<WeightSource>(const std::string& shard_path)>& open_shard);

// Upper bounds on the model-level sizes a file's metadata or header gives (layers, context, vocabulary,
// heads, widths). The layer plan, the KV cache and per-head tables are sized from them before any
// tensor is looked up, so a reader checks them first. Each is far above every published model
// (Llama 4 Scout: 10M context; Gemma 3: 262k vocabulary; Llama 3.1 405B: 126 layers, 53k FFN width).
inline constexpr uint64_t kMaxLayers = uint64_t(1) << 16;
inline constexpr uint64_t kMaxContextTokens = uint64_t(1) << 24;
inline constexpr uint64_t kMaxVocabSize = uint64_t(1) << 24;
inline constexpr uint64_t kMaxHeads = uint64_t(1) << 16;
inline constexpr uint64_t kMaxWidth = uint64_t(1) << 20;

// One tensor's bytes, [begin, end) relative to the start of its file's data section.
struct DataRange {
  std::string tensor;
  uint64_t begin;
  uint64_t end;
};
// Fails, naming `path` and both tensors, when two ranges share a byte: a tensor aliasing another's
// data is a damaged or crafted file, never a converter's output. Empty ranges overlap nothing.
void check_disjoint(std::vector<DataRange> ranges, const std::string& path);

// A tensor over `numel * dtype_size` bytes at `bytes` inside `file`: a view that keeps the mapping
// alive when the address suits the dtype's alignment, otherwise an owned copy (a safetensors header
// of odd length, or a GGUF alignment of 1, would misalign every element access).
Tensor tensor_from_file(DType dtype, Shape shape, const uint8_t* bytes, const std::shared_ptr<const MappedFile>& file);

}  // namespace splitflow
