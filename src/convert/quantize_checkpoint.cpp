#include "convert/quantize_checkpoint.h"

#include "core/error.h"
#include "formats/gguf_writer.h"
#include "formats/weight_source.h"
#include "quant/quant.h"

#include <optional>

namespace splitflow {
namespace {

// llama.cpp's llama_ftype for a file whose weights are all `type` (the _S variants for the K types).
std::optional<uint32_t> llama_file_type(DType type) {
  switch (type) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q8_0: return 7;
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::Q2_K: return 10;
    case DType::Q3_K: return 11;
    case DType::Q4_K: return 14;
    case DType::Q5_K: return 16;
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    default: return std::nullopt;
  }
}

std::optional<DType> fallback_for(DType type) {
  switch (type) {
    case DType::Q4_K: return DType::Q5_0;
    case DType::Q5_K: return DType::Q5_1;
    case DType::Q6_K: return DType::Q8_0;
    case DType::Q2_K:
    case DType::Q3_K: return DType::Q4_0;
    case DType::Q4_B64: return DType::Q4_B32;
    default: return std::nullopt;
  }
}

bool fits(DType type, int64_t row_len) { return row_len % dtype_block_elems(type) == 0; }

}  // namespace

std::optional<DType> quantized_type_for(DType target, int64_t row_len) {
  if (fits(target, row_len)) return target;
  for (std::optional<DType> next = fallback_for(target); next; next = fallback_for(*next))
    if (fits(*next, row_len)) return next;
  return std::nullopt;
}

QuantizeReport quantize_checkpoint(const std::string& input, DType target, const std::string& output,
                                   const std::function<void(const std::string&, DType)>& progress) {
  SF_CHECK(is_quantized(target) || target == DType::F32 || target == DType::F16 || target == DType::BF16,
           "quantize: --type {} is neither a quantized type nor f32/f16/bf16", dtype_name(target));
  const auto source = open_weights(input);
  SF_CHECK(source->format() == "gguf",
           "quantize: '{}' is a {} checkpoint; quantize reads GGUF files (a safetensors or llama2.c model is "
           "quantized while loading instead: --quantization on generate/serve/bench)", input, source->format());

  QuantizeReport report;
  std::vector<TensorInfo> tensors;
  for (const TensorInfo& info : source->tensors()) {
    const Tensor& tensor = info.tensor;
    report.input_bytes += tensor.nbytes();
    const bool weight = tensor.shape.size() == 2 && info.name.size() > 7 &&
                        info.name.compare(info.name.size() - 7, 7, ".weight") == 0 &&
                        (is_quantized(tensor.dtype) || tensor.dtype == DType::F32 || tensor.dtype == DType::F16 ||
                         tensor.dtype == DType::BF16);
    const std::optional<DType> type = weight ? quantized_type_for(target, tensor.dim(1)) : std::nullopt;
    if (!type || *type == tensor.dtype) {
      tensors.push_back(info);
      ++report.kept;
    } else {
      const Tensor f32 = quant::dequantize(tensor);
      Tensor out = is_quantized(*type) ? quant::quantize(f32, *type) : to_dtype(f32, *type);
      tensors.push_back({info.name, std::move(out), info.file});
      ++(*type == target ? report.quantized : report.fallback);
    }
    if (progress) progress(info.name, tensors.back().tensor.dtype);
    report.output_bytes += tensors.back().tensor.nbytes();
  }

  nlohmann::json metadata = source->metadata();
  if (const auto file_type = llama_file_type(target)) {
    metadata["general.file_type"] = *file_type;
  } else {
    metadata.erase("general.file_type");
  }
  metadata["general.quantization_version"] = 2u;
  uint32_t alignment = 32;
  if (const auto it = metadata.find("general.alignment"); it != metadata.end()) alignment = it->get<uint32_t>();
  write_gguf(output, metadata, tensors, alignment);
  return report;
}

}  // namespace splitflow
