// quant/inferflow_blocks.cpp — Inferflow min/max blocks (reference 002 §3): Qk_B32 / Qk_B64 for
// k = 2, 3, 4, 5, 6, 8 and the 3.5-bit Q3H_B64.
//
// A block is [min fp16][scale fp16][codes], the codes a little-endian bit stream (code i occupies
// stream bits [i b, i b + b), stream bit t is bit t % 8 of byte t / 8):
//  - Qk: one k-bit code per weight, levels 0 .. L = 2^k - 1.
//  - Q3H: levels 0 .. L = 10; weights 2i and 2i+1 share the 7-bit code q[2i] * 11 + q[2i+1].
// Encoding (the paper's equation 1, with the stored values):
//   m = fp16(min w), s = fp16((max w - min w) / L)   (each rounded once to the nearest fp16,
//                                                       the difference and quotient in fp64)
//   q = clamp(floor((w - m) / s + 1/2), 0, L)         (fp64; ties round up)
// so the codes minimise the error of what the decoder rebuilds. A block whose s is 0 (max == min,
// or a range too small for fp16) stores scale 0 and all-zero codes. Decoding: w' = m + q * s in
// float32 (the product rounded, then the sum), as every backend kernel must reproduce. The encoder
// is quant/block_quantizers.h's (shared with the device).
#include "core/error.h"
#include "quant/block_quantizers.h"
#include "quant/codecs.h"

#include <algorithm>
#include <cmath>

namespace splitflow::quant::detail {

namespace {

using blocks::InferflowGeometry;

InferflowGeometry geometry_of(DType type) {
  const InferflowGeometry g = blocks::inferflow_geometry(type);
  SF_CHECK(g.block_elems != 0, "dtype {} is not an Inferflow block type", dtype_name(type));
  return g;
}

uint32_t read_code(const uint8_t* stream, int index, int bits) {
  uint32_t code = 0;
  for (int t = 0; t < bits; ++t) {
    const int bit = index * bits + t;
    code |= static_cast<uint32_t>((stream[bit / 8] >> (bit % 8)) & 1) << t;
  }
  return code;
}

void dequantize_block(const InferflowGeometry& g, const uint8_t* block, float* out) {
  const float m = load_f16(block), s = load_f16(block + 2);
  const uint8_t* stream = block + 4;
  for (int i = 0; i < g.codes; ++i) {
    const uint32_t code = read_code(stream, i, g.code_bits);
    if (g.paired) {
      out[2 * i] = m + static_cast<float>(code / 11) * s;
      out[2 * i + 1] = m + static_cast<float>(code % 11) * s;
    } else {
      out[i] = m + static_cast<float>(code) * s;
    }
  }
}

}  // namespace

void dequantize_inferflow_row(DType type, const uint8_t* row, float* out, int64_t k) {
  const InferflowGeometry g = geometry_of(type);
  for (int64_t block = 0; block < k / g.block_elems; ++block)
    dequantize_block(g, row + block * g.block_bytes(), out + block * g.block_elems);
}

void quantize_inferflow_row(DType type, const float* in, uint8_t* row, int64_t k) {
  const InferflowGeometry g = geometry_of(type);
  for (int64_t block = 0; block < k / g.block_elems; ++block) {
    const float* x = in + block * g.block_elems;
    if (!blocks::quantize_inferflow_block(g, x, row + block * g.block_bytes())) {
      const auto [min, max] = std::minmax_element(x, x + g.block_elems);
      fail("quantize {}: a block with values in [{}, {}] does not fit its fp16 min and scale (|values| <= 65504)",
           dtype_name(type), *min, *max);
    }
  }
}

std::optional<BadScale> find_bad_inferflow_scale(DType type, const uint8_t* row, int64_t k) {
  const InferflowGeometry g = geometry_of(type);
  for (int64_t block = 0; block < k / g.block_elems; ++block) {
    const uint8_t* b = row + block * g.block_bytes();
    if (const float m = load_f16(b); !std::isfinite(m)) return BadScale{block, "min", m};
    if (const float s = load_f16(b + 2); !std::isfinite(s)) return BadScale{block, "scale", s};
  }
  return std::nullopt;
}

}  // namespace splitflow::quant::detail
