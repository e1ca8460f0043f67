// GGUF block codecs against the `gguf` Python package (fixtures by python/gen_quant_fixtures.py)
// and against llama.cpp's own error bounds for its reference quantizers.
#include "core/dtype.h"
#include "quant/quant.h"
#include "quant/sfq_fixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace splitflow;
using splitflow::test::float_bits;
using splitflow::test::SfqFixture;

namespace {

const DType kGgufTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                            DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

std::vector<uint8_t> quantize_to_bytes(DType type, const std::vector<float>& values) {
  std::vector<uint8_t> packed(dtype_row_bytes(type, static_cast<int64_t>(values.size())));
  quant::quantize_row(type, values.data(), packed.data(), static_cast<int64_t>(values.size()));
  return packed;
}

std::vector<float> dequantize_bytes(DType type, const std::vector<uint8_t>& packed, int64_t k) {
  std::vector<float> out(static_cast<size_t>(k));
  quant::dequantize_row(type, packed.data(), out.data(), k);
  return out;
}

}  // namespace

// Random blocks (random codes and sub-scales, fp16 scales of either sign from 1e-4 to 1), edge
// scales (+-65504, +-smallest subnormal, a subnormal, +-0, 1, -3.5) and all-zero blocks decode to
// exactly the float32 bits gguf.quants.dequantize produces.
TEST(GgufBlocks, DequantizeIsBitIdenticalToGgufPackage) {
  for (const DType type : kGgufTypes) {
    const std::string name(dtype_name(type));
    const SfqFixture fixture("gguf_dequant_" + name + ".sfq");
    const auto blocks = fixture.get<uint8_t>("blocks");
    const auto expected = fixture.get<float>("expected");
    const int64_t k = static_cast<int64_t>(expected.size());
    ASSERT_EQ(blocks.size(), dtype_row_bytes(type, k)) << name;
    const std::vector<float> got = dequantize_bytes(type, blocks, k);
    int mismatches = 0;
    for (int64_t i = 0; i < k && mismatches < 5; ++i)
      if (float_bits(got[i]) != float_bits(expected[i])) {
        ++mismatches;
        ADD_FAILURE() << name << " block " << i / dtype_block_elems(type) << " element " << i % dtype_block_elems(type)
                      << ": got " << got[i] << ", gguf " << expected[i];
      }
  }
}

// For the types the gguf package quantizes (its ports of quantize_row_*_ref), our bytes are its bytes:
// weight-like rows plus an all-zero block, a constant block, a block of +-1 ties, heavy tails
// (Student t, 2 dof) and values around 1e-6.
TEST(GgufBlocks, QuantizeIsByteIdenticalToGgufPackage) {
  const SfqFixture fixture("gguf_quantize.sfq");
  const auto input = fixture.get<float>("input");
  const auto shape = fixture.get<uint32_t>("shape");
  const int64_t rows = shape[0], cols = shape[1];
  for (const DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0}) {
    const std::string name(dtype_name(type));
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(c));
    const auto expected = fixture.get<uint8_t>(upper);
    const size_t row_bytes = dtype_row_bytes(type, cols);
    ASSERT_EQ(expected.size(), rows * row_bytes) << name;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<uint8_t> packed(row_bytes);
      quant::quantize_row(type, input.data() + r * cols, packed.data(), cols);
      for (size_t i = 0; i < row_bytes; ++i)
        ASSERT_EQ(packed[i], expected[r * row_bytes + i])
            << name << " row " << r << " byte " << i << " (block " << i / (row_bytes / (cols / dtype_block_elems(type)))
            << ")";
    }
  }
}

// Every type, K-quants included, is byte-identical to llama.cpp's own quantize_row_<type>_ref
// (b11434, called through ctypes by the fixture generator) on the same weight-like and edge rows.
TEST(GgufBlocks, QuantizeIsByteIdenticalToLlamaCppReference) {
  const SfqFixture fixture("ggml_reference_quantize.sfq");
  const auto input = fixture.get<float>("input");
  const auto shape = fixture.get<uint32_t>("shape");
  const int64_t rows = shape[0], cols = shape[1];
  for (const DType type : kGgufTypes) {
    std::string name(dtype_name(type));
    for (char& c : name) c = static_cast<char>(std::toupper(c));
    const auto expected = fixture.get<uint8_t>(name);
    const size_t row_bytes = dtype_row_bytes(type, cols);
    const size_t block_bytes = row_bytes / static_cast<size_t>(cols / dtype_block_elems(type));
    ASSERT_EQ(expected.size(), rows * row_bytes) << name;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<uint8_t> packed(row_bytes);
      quant::quantize_row(type, input.data() + r * cols, packed.data(), cols);
      for (size_t i = 0; i < row_bytes; ++i)
        ASSERT_EQ(packed[i], expected[r * row_bytes + i])
            << name << " row " << r << " block " << i / block_bytes << " byte " << i % block_bytes;
    }
  }
}

// llama.cpp's tests/test-quantize-fns.cpp checks its quantizers on x_i = 0.1 + 2 cos(i + offset),
// 4096 values, with error sqrt(sum (x - x')^2) / n below 0.002 (0.004 for 3-bit, 0.0075 for 2-bit).
// Our re-implementations of its reference quantizers must meet the same bounds.
TEST(GgufBlocks, RoundTripMeetsLlamaCppTestBounds) {
  constexpr int64_t n = 4096;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = 0.1f + 2.0f * std::cos(static_cast<float>(i) + 0.0f);
  for (const DType type : kGgufTypes) {
    const std::vector<float> back = dequantize_bytes(type, quantize_to_bytes(type, x), n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (static_cast<double>(x[i]) - back[i]) * (static_cast<double>(x[i]) - back[i]);
    const double error = std::sqrt(sum) / n;
    const double bound = type == DType::Q2_K ? 0.0075 : type == DType::Q3_K ? 0.0040 : 0.002;
    EXPECT_LT(error, bound) << dtype_name(type);
  }
}

// On Gaussian weights the relative RMS error (vs the fp64 input) of each type is below a bound
// set from its bits (about 2^-bits of the block range, generous by ~1.5x) and ordered by bits:
// the K-quant search must not do worse than the plain fixed-grid rounding would.
TEST(GgufBlocks, GaussianRoundTripErrorIsBoundedAndOrderedByBits) {
  constexpr int64_t n = 256 * 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  double sum_x2 = 0;
  for (float v : x) sum_x2 += static_cast<double>(v) * v;
  const auto relative_rms = [&](DType type) {
    const std::vector<float> back = dequantize_bytes(type, quantize_to_bytes(type, x), n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (static_cast<double>(x[i]) - back[i]) * (static_cast<double>(x[i]) - back[i]);
    return std::sqrt(sum / sum_x2);
  };
  struct Bound {
    DType type;
    double max_relative_rms;
  };
  const Bound bounds[] = {{DType::Q2_K, 0.45}, {DType::Q3_K, 0.25}, {DType::Q4_0, 0.15}, {DType::Q4_1, 0.13},
                          {DType::Q4_K, 0.12}, {DType::Q5_0, 0.07}, {DType::Q5_1, 0.065}, {DType::Q5_K, 0.06},
                          {DType::Q6_K, 0.03}, {DType::Q8_0, 0.008}};
  for (const Bound& bound : bounds) EXPECT_LT(relative_rms(bound.type), bound.max_relative_rms) << dtype_name(bound.type);
  EXPECT_LT(relative_rms(DType::Q3_K), relative_rms(DType::Q2_K));
  EXPECT_LT(relative_rms(DType::Q4_K), relative_rms(DType::Q3_K));
  EXPECT_LT(relative_rms(DType::Q5_K), relative_rms(DType::Q4_K));
  EXPECT_LT(relative_rms(DType::Q6_K), relative_rms(DType::Q5_K));
}

// quantize(dequantize(q)) == q where llama.cpp's reference algorithm guarantees it: Q4_0, Q5_0
// and Q8_0 put the block's largest-magnitude value on the extreme code, so re-quantizing the decoded
// block recovers the same fp16 scale exactly (max / -8, max / -16, amax / 127 are exact for a
// value that is the scale times that integer) and every code (x / d is within 2^-20 of it). The
// min/max and K types re-derive scales through rounding or a search, so they are not stable.
TEST(GgufBlocks, SymmetricTypesAreStableUnderRequantization) {
  constexpr int64_t n = 32 * 256;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-2.0f, 1.0f);
  std::vector<float> x(n);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float scale = std::pow(10.0f, log_scale(rng));
    for (int j = 0; j < 32; ++j) x[b * 32 + j] = normal(rng) * scale;
  }
  for (const DType type : {DType::Q4_0, DType::Q5_0, DType::Q8_0}) {
    const auto packed = quantize_to_bytes(type, x);
    const auto again = quantize_to_bytes(type, dequantize_bytes(type, packed, n));
    EXPECT_EQ(packed, again) << dtype_name(type);
  }
}

TEST(GgufBlocks, AllZeroInputGivesZeroScalesAndZeroOutput) {
  const std::vector<float> zeros(512, 0.0f);
  for (const DType type : kGgufTypes) {
    const auto back = dequantize_bytes(type, quantize_to_bytes(type, zeros), 512);
    for (float v : back) ASSERT_EQ(v, 0.0f) << dtype_name(type);
  }
}
