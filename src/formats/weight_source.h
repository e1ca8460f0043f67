// formats/weight_source.h — what every checkpoint reader produces: named tensor views into the
// file(s) plus the file's metadata. Readers validate every offset and length against the file
// size; a damaged file yields splitflow::Error naming the file and the problem, never a crash.
//
// Contract:
//  - Shapes are outermost-first (torch order). GGUF's innermost-first `ne` is reversed on load.
//  - Tensor data stays in the mapped file (no copy); views keep the mapping alive.
//  - metadata(): GGUF key/values as JSON (arrays included), the safetensors `__metadata__` map,
//    or the llama2.c header fields. Model config resolution (model/) reads it.
#pragma once

#include "core/tensor.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace splitflow {

struct TensorInfo {
  std::string name;
  Tensor tensor;      // a view into the mapped file
  std::string file;   // the file it came from (for error messages)
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // "safetensors", "gguf", "llama2c" or "pytorch" (formats/pickle.h).
  virtual std::string format() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  virtual const nlohmann::json& metadata() const = 0;
  // Null when absent.
  const TensorInfo* find(const std::string& name) const;
};

// Opens one .safetensors file.
std::unique_ptr<WeightSource> open_safetensors(const std::string& path);
// Opens every shard listed in `model.safetensors.index.json` (a path to the index file).
std::unique_ptr<WeightSource> open_safetensors_index(const std::string& index_path);
// Opens a GGUF file (v2 or v3). F32/F16/BF16, the integer types and the quantized types splitflow
// runs (Q4_0 .. Q6_K, core/dtype.h) stay views of the mapped file, blocks as ggml wrote them; any
// other ggml type is an error naming the tensor and the type.
std::unique_ptr<WeightSource> open_gguf(const std::string& path);
// Opens a llama2.c checkpoint (legacy v0 header of 7 int32). Tensors are named as in Meta's
// Llama checkpoints (`tok_embeddings.weight`, `layers.{i}.attention.wq.weight`, ...; see the
// llama2c spec template); metadata holds dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size, seq_len, shared_classifier.
std::unique_ptr<WeightSource> open_llama2c(const std::string& path);

// Picks the reader from the path: a directory (model.safetensors, its sharded index,
// pytorch_model.bin or its sharded index, in that order), *.safetensors, *.gguf (or GGUF magic),
// *.pt / *.pth / *.bin.index.json or a zip / legacy-pickle magic (PyTorch), otherwise a llama2.c .bin.
std::unique_ptr<WeightSource> open_weights(const std::string& path);

}  // namespace splitflow
