// quant/fp8.cpp — FP8 E4M3 weight-only rows: F8_CHANNEL (one scale per row) and F8_G128 (one per
// 128 elements).
//
// A row is its f32 scales (one per group), zero-padded to a multiple of 16 bytes, then its k e4m3
// bytes (core/dtype.h). Encoding per group: scale = absmax / 448 (float32), e = f32_to_e4m3(w / scale)
// (float32 quotient, round to nearest even, saturating); a group of zeros stores scale 0 and zero
// codes (0 rebuilds exactly, as any all-zero block does here). Decoding: w' = e4m3_to_f32(e) * scale.
#include "core/error.h"
#include "quant/block_quantizers.h"
#include "quant/codecs.h"

#include <algorithm>
#include <cmath>

namespace splitflow::quant::detail {

namespace {

struct Fp8Geometry {
  int64_t group_elems;
  int64_t groups;
  int64_t scale_bytes;  // padded
};

Fp8Geometry geometry_of(DType type, int64_t k) {
  SF_CHECK(type == DType::F8_CHANNEL || type == DType::F8_G128, "dtype {} is not an FP8 row type", dtype_name(type));
  const int64_t group = type == DType::F8_CHANNEL ? k : 128;
  const int64_t groups = k == 0 ? 0 : k / group;
  return {group, groups, blocks::group_scale_bytes(groups)};
}

}  // namespace

void dequantize_fp8_row(DType type, const uint8_t* row, float* out, int64_t k) {
  const Fp8Geometry g = geometry_of(type, k);
  const uint8_t* codes = row + g.scale_bytes;
  for (int64_t group = 0; group < g.groups; ++group) {
    const float scale = load_f32(row + 4 * group);
    for (int64_t i = group * g.group_elems; i < (group + 1) * g.group_elems; ++i) out[i] = e4m3_to_f32(codes[i]) * scale;
  }
}

void quantize_fp8_row(DType type, const float* in, uint8_t* row, int64_t k) {
  const Fp8Geometry g = geometry_of(type, k);
  std::fill(row, row + g.scale_bytes, uint8_t{0});
  for (int64_t group = 0; group < g.groups; ++group)
    blocks::quantize_fp8_group(in + group * g.group_elems, g.group_elems, row + 4 * group,
                               row + g.scale_bytes + group * g.group_elems);
}

std::optional<BadScale> find_bad_fp8_scale(DType type, const uint8_t* row, int64_t k) {
  const Fp8Geometry g = geometry_of(type, k);
  for (int64_t group = 0; group < g.groups; ++group)
    if (const float scale = load_f32(row + 4 * group); !std::isfinite(scale)) return BadScale{group, "scale", scale};
  return std::nullopt;
}

}  // namespace splitflow::quant::detail
