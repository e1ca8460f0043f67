#include "engine/model_loader.h"

#include "core/error.h"
#include "formats/weight_source.h"
#include "model/config.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>

namespace splitflow {

DType dominant_matrix_dtype(const WeightSource& source) {
  std::map<DType, int64_t> elements;
  for (const TensorInfo& info : source.tensors()) {
    const DType dtype = info.tensor.dtype;
    if (info.tensor.shape.size() == 2 && (dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16)) {
      elements[dtype] += info.tensor.numel();
    }
  }
  DType best = DType::F32;
  int64_t best_count = -1;
  for (const auto& [dtype, count] : elements) {
    if (count > best_count) best = dtype, best_count = count;
  }
  return best;
}

namespace {

std::string quantization_note(const ModelLoadOptions& options) {
  return options.quantization ? fmt::format(", projections quantized to {}", dtype_name(*options.quantization)) : "";
}

}  // namespace

LoadedModel load_model(const ModelLoadOptions& options) {
  LoadedModel model;
  if (options.dummy_weights) {
    SF_CHECK(!options.config_path.empty() || !options.spec_path.empty(),
             "--dummy-weights needs --config (a HF config.json or a spec file) or --spec");
    const std::string& shape_path = options.config_path.empty() ? options.spec_path : options.config_path;
    model.spec = resolve_config_spec(shape_path, options.config_path.empty() ? "" : options.spec_path);
    const DType dtype = options.weight_dtype.value_or(DType::BF16);
    model.weights = make_dummy_weights(model.spec, dtype, options.seed, options.quantization, options.quantizer);
    if (!options.tokenizer_path.empty() || !options.model_path.empty()) {
      model.tokenizer = load_tokenizer_for_model(options.model_path, options.tokenizer_path);
    }
    model.description = fmt::format("{} (dummy weights, {}{}, seed {})", shape_path, dtype_name(dtype),
                                    quantization_note(options), options.seed);
    return model;
  }

  SF_CHECK(!options.model_path.empty(), "no model given: pass --model PATH (a HF directory, .gguf or llama2.c .bin)");
  SF_CHECK(std::filesystem::exists(options.model_path), "model path '{}' does not exist", options.model_path);
  std::unique_ptr<WeightSource> source = open_weights(options.model_path);
  model.spec = resolve_source_spec(*source, options.model_path, options.spec_path);
  const DType dtype = options.weight_dtype.value_or(dominant_matrix_dtype(*source));
  model.weights = bind_weights(model.spec, *source, dtype, options.quantization, options.quantizer);
  // A HF directory without tokenizer.json (a test fixture, a bare checkpoint) still runs on token ids.
  const std::filesystem::path path(options.model_path);
  if (options.tokenizer_path.empty() && std::filesystem::is_directory(path) &&
      !std::filesystem::exists(path / "tokenizer.json")) {
    spdlog::warn("'{}' has no tokenizer.json: prompts must be token ids (--prompt-ids, or ids in requests); pass "
                 "--tokenizer PATH for text", options.model_path);
  } else {
    model.tokenizer = load_tokenizer_for_model(options.model_path, options.tokenizer_path);
  }
  model.description = fmt::format("{} ({}, {}{})", options.model_path, source->format(), dtype_name(dtype),
                                  quantization_note(options));
  return model;
}

}  // namespace splitflow
