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
// float32 (the product rounded, then the sum), as every backend kernel must reproduce.
#include "core/error.h"
#include "quant/codecs.h"

#include <algorithm>
#include <cmath>

namespace splitflow::quant::detail {

namespace {

struct InferflowGeometry {
  int block_elems;
  int code_bits;    // bits per code
  int codes;        // codes per block
  int levels;       // largest level L
  bool paired;      // Q3H: one code holds two weights
  int block_bytes() const { return 4 + codes * code_bits / 8; }
};

InferflowGeometry geometry_of(DType type) {
  switch (type) {
    case DType::Q2_B32: return {32, 2, 32, 3, false};
    case DType::Q3_B32: return {32, 3, 32, 7, false};
    case DType::Q4_B32: return {32, 4, 32, 15, false};
    case DType::Q5_B32: return {32, 5, 32, 31, false};
    case DType::Q6_B32: return {32, 6, 32, 63, false};
    case DType::Q8_B32: return {32, 8, 32, 255, false};
    case DType::Q2_B64: return {64, 2, 64, 3, false};
    case DType::Q3_B64: return {64, 3, 64, 7, false};
    case DType::Q4_B64: return {64, 4, 64, 15, false};
    case DType::Q5_B64: return {64, 5, 64, 31, false};
    case DType::Q6_B64: return {64, 6, 64, 63, false};
    case DType::Q8_B64: return {64, 8, 64, 255, false};
    case DType::Q3H_B64: return {64, 7, 32, 10, true};
    default: fail("dtype {} is not an Inferflow block type", dtype_name(type));
  }
}

uint32_t read_code(const uint8_t* stream, int index, int bits) {
  uint32_t code = 0;
  for (int t = 0; t < bits; ++t) {
    const int bit = index * bits + t;
    code |= static_cast<uint32_t>((stream[bit / 8] >> (bit % 8)) & 1) << t;
  }
  return code;
}

void write_code(uint8_t* stream, int index, int bits, uint32_t code) {
  for (int t = 0; t < bits; ++t) {
    const int bit = index * bits + t;
    stream[bit / 8] |= static_cast<uint8_t>(((code >> t) & 1u) << (bit % 8));
  }
}

// The fp16 nearest to a double (ties to even), rounded once: scaling by a power of two is exact,
// so nearbyint rounds the fp16 mantissa directly. Overflow gives infinity.
uint16_t f64_to_f16(double value) {
  if (value == 0 || !std::isfinite(value)) return f32_to_f16(static_cast<float>(value));
  const int exponent = std::max(std::ilogb(value), -14);  // below 2^-14 the subnormals share one
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(value, 10 - exponent)), exponent - 10);
  return f32_to_f16(static_cast<float>(rounded));  // exact: `rounded` is an fp16 value (or >= 65536)
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

void quantize_block(DType type, const InferflowGeometry& g, const float* x, uint8_t* block) {
  float min = x[0], max = x[0];
  for (int i = 1; i < g.block_elems; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
  }
  const uint16_t m_bits = f32_to_f16(min);
  const uint16_t s_bits = f64_to_f16((static_cast<double>(max) - static_cast<double>(min)) / g.levels);
  const float m = f16_to_f32(m_bits), s = f16_to_f32(s_bits);
  SF_CHECK(std::isfinite(m) && std::isfinite(s),
           "quantize {}: a block with values in [{}, {}] does not fit its fp16 min and scale (|values| <= 65504)",
           dtype_name(type), min, max);
  std::fill(block, block + g.block_bytes(), uint8_t{0});
  store_f16(block, m_bits);
  store_f16(block + 2, s_bits);
  if (s == 0) return;
  const auto level = [&](float w) {
    const double t = std::floor((static_cast<double>(w) - static_cast<double>(m)) / static_cast<double>(s) + 0.5);
    return static_cast<uint32_t>(std::clamp(t, 0.0, static_cast<double>(g.levels)));
  };
  uint8_t* stream = block + 4;
  for (int i = 0; i < g.codes; ++i) {
    const uint32_t code = g.paired ? level(x[2 * i]) * 11 + level(x[2 * i + 1]) : level(x[i]);
    write_code(stream, i, g.code_bits, code);
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
  for (int64_t block = 0; block < k / g.block_elems; ++block)
    quantize_block(type, g, in + block * g.block_elems, row + block * g.block_bytes());
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
