// quant/fp8_checkpoint.cpp — FP8 weights as published checkpoints store them (llm-compressor /
// compressed-tensors, HF "fp8"): an F8E4M3 `weight` [n, k] with a separate `weight_scale`, packed
// into this module's F8_CHANNEL / F8_G128 rows. The e4m3 bytes are copied, never re-rounded, so
// dequantizing the packed tensor gives exactly e4m3 * scale, as the checkpoint's own runtime does.
#include "core/error.h"
#include "quant/quant.h"

#include <cmath>
#include <cstring>

namespace splitflow::quant {

namespace {

constexpr int64_t kGroup = 128;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Tensor pack_fp8_checkpoint_weight(const Tensor& weight, const Tensor& weight_scale, const std::string& name) {
  SF_CHECK(weight.dtype == DType::F8E4M3 && weight.shape.size() == 2 && weight.data,
           "FP8 weight '{}': expected an f8_e4m3 matrix, got {} {}", name, dtype_name(weight.dtype),
           shape_str(weight.shape));
  SF_CHECK(weight_scale.dtype == DType::F32 || weight_scale.dtype == DType::BF16 || weight_scale.dtype == DType::F16,
           "FP8 weight '{}': its weight_scale is {}, expected f32, bf16 or f16", name, dtype_name(weight_scale.dtype));
  const int64_t n = weight.shape[0], k = weight.shape[1];
  const Shape& s = weight_scale.shape;
  const int64_t count = weight_scale.numel();
  // Which scale applies to (row, group of 128 columns), by the scale's shape.
  enum class Layout { PerTensor, PerChannel, PerGroup, PerBlock } layout;
  if (count == 1)
    layout = Layout::PerTensor;  // [] or [1] (one scale of any shape means the same)
  else if ((s.size() == 2 && s[0] == n && s[1] == 1) || (s.size() == 1 && s[0] == n))
    layout = Layout::PerChannel;
  else if (s.size() == 2 && s[0] == n && k % kGroup == 0 && s[1] == k / kGroup)
    layout = Layout::PerGroup;
  else if (s.size() == 2 && s[0] == ceil_div(n, kGroup) && s[1] == ceil_div(k, kGroup))
    layout = Layout::PerBlock;  // weight_block_size [128, 128]
  else
    fail("FP8 weight '{}' {}: its weight_scale {} is none of per tensor [1], per channel [{}, 1], per group of "
         "128 [{}, {}] or per 128x128 block [{}, {}]",
         name, shape_str(weight.shape), shape_str(s), n, n, k / kGroup, ceil_div(n, kGroup), ceil_div(k, kGroup));
  const bool channel = layout == Layout::PerTensor || layout == Layout::PerChannel;
  const DType type = channel ? DType::F8_CHANNEL : DType::F8_G128;
  SF_CHECK(k % dtype_block_elems(type) == 0,
           "FP8 weight '{}' {}: rows of {} elements cannot be packed as {} (a multiple of {} is needed)", name,
           shape_str(weight.shape), k, dtype_name(type), dtype_block_elems(type));

  const Tensor scales = to_dtype(weight_scale, DType::F32);
  const float* scale = scales.as<float>();
  for (int64_t i = 0; i < count; ++i)
    SF_CHECK(std::isfinite(scale[i]), "FP8 weight '{}': weight_scale element {} is {} (scales must be finite)", name, i,
             scale[i]);
  const auto scale_of = [&](int64_t row, int64_t group) {
    switch (layout) {
      case Layout::PerTensor: return scale[0];
      case Layout::PerChannel: return scale[row];
      case Layout::PerGroup: return scale[row * (k / kGroup) + group];
      case Layout::PerBlock: return scale[(row / kGroup) * ceil_div(k, kGroup) + group];
    }
    return 0.0f;
  };

  Tensor packed = Tensor::zeros(type, {n, k});
  const size_t row_bytes = dtype_row_bytes(type, k);
  const int64_t groups = channel ? 1 : k / kGroup;
  const size_t codes_at = row_bytes - static_cast<size_t>(k);
  const auto* codes = static_cast<const uint8_t*>(weight.data);
  for (int64_t row = 0; row < n; ++row) {
    uint8_t* out = packed.as<uint8_t>() + row * row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      const float value = scale_of(row, g);
      std::memcpy(out + 4 * g, &value, sizeof value);
    }
    std::memcpy(out + codes_at, codes + row * k, static_cast<size_t>(k));
  }
  return packed;
}

}  // namespace splitflow::quant
