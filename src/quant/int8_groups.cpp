// quant/int8_groups.cpp — int8 rows with one f32 scale per group: I8_G32, I8_G64, I8_G128
// (llama2.c's version-2 "Q8_0" export, whose groups are kept as they are by formats/llama2c.cpp).
//
// A row is its f32 scales (one per group), zero-padded to a multiple of 16 bytes, then its k int8
// codes (core/dtype.h). Encoding per group, as llama2.c's export.py quantize_q80: scale = absmax /
// 127 (float32), q = round(w / scale) (float32 quotient, ties to even as torch.round; |q| <= 127);
// a group of zeros stores scale 0 and zero codes. Decoding: w' = float(q) * scale (one rounding).
#include "core/error.h"
#include "quant/block_quantizers.h"
#include "quant/codecs.h"

#include <algorithm>
#include <cmath>

namespace splitflow::quant::detail {

namespace {

struct Int8Geometry {
  int64_t group_elems;
  int64_t groups;
  int64_t scale_bytes;  // padded
};

Int8Geometry geometry_of(DType type, int64_t k) {
  SF_CHECK(type == DType::I8_G32 || type == DType::I8_G64 || type == DType::I8_G128, "dtype {} is not an int8 group type",
           dtype_name(type));
  const int64_t group = dtype_block_elems(type);
  const int64_t groups = k / group;
  return {group, groups, blocks::group_scale_bytes(groups)};
}

}  // namespace

void dequantize_int8_row(DType type, const uint8_t* row, float* out, int64_t k) {
  const Int8Geometry g = geometry_of(type, k);
  const auto* codes = reinterpret_cast<const int8_t*>(row + g.scale_bytes);
  for (int64_t group = 0; group < g.groups; ++group) {
    const float scale = load_f32(row + 4 * group);
    for (int64_t i = group * g.group_elems; i < (group + 1) * g.group_elems; ++i)
      out[i] = static_cast<float>(codes[i]) * scale;
  }
}

void quantize_int8_row(DType type, const float* in, uint8_t* row, int64_t k) {
  const Int8Geometry g = geometry_of(type, k);
  std::fill(row, row + g.scale_bytes, uint8_t{0});
  for (int64_t group = 0; group < g.groups; ++group)
    blocks::quantize_int8_group(in + group * g.group_elems, g.group_elems, row + 4 * group,
                                row + g.scale_bytes + group * g.group_elems);
}

std::optional<BadScale> find_bad_int8_scale(DType type, const uint8_t* row, int64_t k) {
  const Int8Geometry g = geometry_of(type, k);
  for (int64_t group = 0; group < g.groups; ++group)
    if (const float scale = load_f32(row + 4 * group); !std::isfinite(scale)) return BadScale{group, "scale", scale};
  return std::nullopt;
}

}  // namespace splitflow::quant::detail
