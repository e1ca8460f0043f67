// Inferflow, FP8 and int8-group codecs against numpy/torch implementations of their definitions (fixtures by
// python/gen_quant_fixtures.py): identical packed bytes, identical decoded float32 values, and so
// the round-trip error the fp64 definition has.
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

const DType kInferflowTypes[] = {DType::Q2_B32, DType::Q3_B32, DType::Q4_B32, DType::Q5_B32, DType::Q6_B32,
                                 DType::Q8_B32, DType::Q2_B64, DType::Q3_B64, DType::Q4_B64, DType::Q5_B64,
                                 DType::Q6_B64, DType::Q8_B64, DType::Q3H_B64};

std::string upper(std::string_view name) {
  std::string out(name);
  for (char& c : out) c = static_cast<char>(std::toupper(c));
  return out;
}

// Quantizes the fixture's rows to `type` and checks bytes, decoded bits and RMS error against it.
void check_against_fixture(const SfqFixture& fixture, DType type) {
  const std::string name = upper(dtype_name(type));
  const auto input = fixture.get<float>("input");
  const auto shape = fixture.get<uint32_t>("shape");
  const int64_t rows = shape[0], cols = shape[1];
  const auto packed_expected = fixture.get<uint8_t>(name + ".packed");
  const auto decoded_expected = fixture.get<float>(name + ".decoded");
  const double rms_expected = fixture.get<double>(name + ".rms").at(0);
  const size_t row_bytes = dtype_row_bytes(type, cols);
  ASSERT_EQ(packed_expected.size(), rows * row_bytes) << name;
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<uint8_t> packed(row_bytes);
    quant::quantize_row(type, input.data() + r * cols, packed.data(), cols);
    for (size_t i = 0; i < row_bytes; ++i)
      ASSERT_EQ(packed[i], packed_expected[r * row_bytes + i]) << name << " row " << r << " byte " << i;
    std::vector<float> decoded(static_cast<size_t>(cols));
    quant::dequantize_row(type, packed.data(), decoded.data(), cols);
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(float_bits(decoded[c]), float_bits(decoded_expected[r * cols + c]))
          << name << " row " << r << " element " << c << ": " << decoded[c] << " vs " << decoded_expected[r * cols + c];
      const double err = static_cast<double>(decoded[c]) - input[r * cols + c];
      sum += err * err;
    }
  }
  EXPECT_NEAR(std::sqrt(sum / static_cast<double>(rows * cols)), rms_expected, 1e-12 * (1 + rms_expected)) << name;
}

}  // namespace

// Rows: Gaussian of varied scales, an all-zero block, a constant block, +-1 ties, heavy tails,
// values around 1e-6 (subnormal fp16 scales), a block around +-3000, a block whose range is below
// fp16's resolution at 8 bits (scale 0).
TEST(InferflowBlocks, MatchTheNumpyDefinition) {
  const SfqFixture fixture("inferflow.sfq");
  for (const DType type : kInferflowTypes) check_against_fixture(fixture, type);
}

// Reference 002's table 2: twelve weights in [-1, 1.5] and their 4-bit, 3-bit and 3.5-bit codes
// (the block padded with -1, which changes neither min nor max).
TEST(InferflowBlocks, ReproduceThePaperTable) {
  const SfqFixture fixture("inferflow.sfq");
  const auto w = fixture.get<float>("paper.w");
  struct Case {
    DType type;
    const char* codes;
  };
  for (const Case c : {Case{DType::Q4_B32, "paper.q4"}, Case{DType::Q3_B32, "paper.q3"}, Case{DType::Q3H_B64, "paper.q35"}}) {
    const int64_t k = dtype_block_elems(c.type);
    std::vector<float> x(static_cast<size_t>(k), -1.0f);
    std::copy(w.begin(), w.end(), x.begin());
    std::vector<uint8_t> packed(dtype_row_bytes(c.type, k));
    quant::quantize_row(c.type, x.data(), packed.data(), k);
    std::vector<float> back(static_cast<size_t>(k));
    quant::dequantize_row(c.type, packed.data(), back.data(), k);
    const float m = f16_to_f32(static_cast<uint16_t>(packed[0] | (packed[1] << 8)));
    const float s = f16_to_f32(static_cast<uint16_t>(packed[2] | (packed[3] << 8)));
    const auto codes = fixture.get<uint32_t>(c.codes);
    for (size_t i = 0; i < codes.size(); ++i)
      EXPECT_EQ(std::lround((back[i] - m) / s), static_cast<long>(codes[i])) << dtype_name(c.type) << " weight " << w[i];
  }
}

// Reference 002's claim behind Q3H, at the weight level: on Gaussian weights Q3H_B64 (4 bits per
// weight stored) has clearly less error than Q3_B32 (also 4), and more than Q4_B32 (5); each type's
// relative RMS error is near the uniform-rounding estimate range / (L sqrt(12)) (bounds ~1.3x).
TEST(InferflowBlocks, Q3hSitsBetweenThreeAndFourBits) {
  constexpr int64_t n = 256 * 64;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  double sum_x2 = 0;
  for (float v : x) sum_x2 += static_cast<double>(v) * v;
  const auto relative_rms = [&](DType type) {
    std::vector<uint8_t> packed(dtype_row_bytes(type, n));
    std::vector<float> back(n);
    quant::quantize_row(type, x.data(), packed.data(), n);
    quant::dequantize_row(type, packed.data(), back.data(), n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (static_cast<double>(x[i]) - back[i]) * (static_cast<double>(x[i]) - back[i]);
    return std::sqrt(sum / sum_x2);
  };
  const double q3 = relative_rms(DType::Q3_B32), q3h = relative_rms(DType::Q3H_B64), q4 = relative_rms(DType::Q4_B32);
  EXPECT_DOUBLE_EQ(quant::info(DType::Q3H_B64).bits_per_weight, quant::info(DType::Q3_B32).bits_per_weight);
  EXPECT_LT(q3h, 0.85 * q3);
  EXPECT_LT(q4, q3h);
  struct Bound {
    DType type;
    double max_relative_rms;
  };
  for (const Bound b : {Bound{DType::Q2_B32, 0.5}, Bound{DType::Q3_B32, 0.22}, Bound{DType::Q4_B32, 0.1},
                        Bound{DType::Q5_B32, 0.05}, Bound{DType::Q6_B32, 0.025}, Bound{DType::Q8_B32, 0.006},
                        Bound{DType::Q2_B64, 0.58}, Bound{DType::Q3_B64, 0.25}, Bound{DType::Q4_B64, 0.12},
                        Bound{DType::Q5_B64, 0.056}, Bound{DType::Q6_B64, 0.028}, Bound{DType::Q8_B64, 0.007},
                        Bound{DType::Q3H_B64, 0.175}, Bound{DType::F8_CHANNEL, 0.035}, Bound{DType::F8_G128, 0.035}})
    EXPECT_LT(relative_rms(b.type), b.max_relative_rms) << dtype_name(b.type);
}

// Rows as for Inferflow plus an all-zero row (scale 0) and an outlier of 900 in a row.
TEST(Fp8, MatchesTorchE4m3AndTheDefinition) {
  const SfqFixture fixture("fp8.sfq");
  check_against_fixture(fixture, DType::F8_CHANNEL);
  check_against_fixture(fixture, DType::F8_G128);
}

// Re-quantizing a decoded FP8 row keeps every e4m3 code: the largest value is 448 * scale, so the
// new scale is the old one within an ulp, and w / scale moves by ~2^-22 relative, far below e4m3's
// rounding step (2^-4 relative).
TEST(Fp8, CodesAreStableUnderRequantization) {
  constexpr int64_t k = 512;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> x(k);
  for (float& v : x) v = normal(rng);
  for (const DType type : {DType::F8_CHANNEL, DType::F8_G128}) {
    const size_t row_bytes = dtype_row_bytes(type, k);
    const size_t codes_at = row_bytes - k;
    std::vector<uint8_t> packed(row_bytes), again(row_bytes);
    std::vector<float> back(k);
    quant::quantize_row(type, x.data(), packed.data(), k);
    quant::dequantize_row(type, packed.data(), back.data(), k);
    quant::quantize_row(type, back.data(), again.data(), k);
    EXPECT_TRUE(std::equal(packed.begin() + codes_at, packed.end(), again.begin() + codes_at)) << dtype_name(type);
  }
}

// Rows as for FP8, plus exact ties (scale 1: 2.5 -> 2, -3.5 -> -4, 126.5 -> 126) and a group around
// +-3000: the codes llama2.c's export.py (torch) gives, checked in fp64 by the fixture script.
TEST(Int8Groups, MatchLlama2cExportAndTheDefinition) {
  const SfqFixture fixture("int8.sfq");
  for (const DType type : {DType::I8_G32, DType::I8_G64, DType::I8_G128}) check_against_fixture(fixture, type);
}

// As FP8: re-quantizing a decoded row gives the same codes (the new scale is within an ulp of the old
// one, so w / scale moves by ~2^-22 relative, far from a rounding boundary at |q| <= 127), and the
// error is within half a step per group.
TEST(Int8Groups, CodesAreStableUnderRequantization) {
  constexpr int64_t k = 512;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> x(k);
  for (float& v : x) v = normal(rng);
  for (const DType type : {DType::I8_G32, DType::I8_G64, DType::I8_G128}) {
    const size_t row_bytes = dtype_row_bytes(type, k);
    const size_t codes_at = row_bytes - k;
    std::vector<uint8_t> packed(row_bytes), again(row_bytes);
    std::vector<float> back(k);
    quant::quantize_row(type, x.data(), packed.data(), k);
    quant::dequantize_row(type, packed.data(), back.data(), k);
    quant::quantize_row(type, back.data(), again.data(), k);
    EXPECT_TRUE(std::equal(packed.begin() + codes_at, packed.end(), again.begin() + codes_at)) << dtype_name(type);
    const int64_t group = dtype_block_elems(type);
    for (int64_t i = 0; i < k; ++i) {
      float scale;
      std::memcpy(&scale, packed.data() + 4 * (i / group), 4);
      EXPECT_LE(std::fabs(back[i] - x[i]), scale * 0.5f * (1 + 1e-5f)) << dtype_name(type) << " " << i;
    }
  }
}
