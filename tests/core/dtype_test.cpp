#include "core/dtype.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace splitflow;

// Every f16 bit pattern decodes to the value IEEE 754 binary16 defines (fp64 formula as reference)
// and re-encodes to itself.
TEST(DType, F16RoundTripsEveryBitPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint32_t exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
    const double sign = (bits & 0x8000) ? -1.0 : 1.0;
    const float value = f16_to_f32(static_cast<uint16_t>(bits));
    if (exponent == 0x1f) {
      EXPECT_TRUE(mantissa ? std::isnan(value) : std::isinf(value)) << bits;
      continue;
    }
    const double expected = exponent == 0 ? sign * std::ldexp(mantissa, -24)
                                          : sign * std::ldexp(1.0 + mantissa / 1024.0, static_cast<int>(exponent) - 15);
    ASSERT_EQ(static_cast<double>(value), expected) << bits;
    ASSERT_EQ(f32_to_f16(value), bits) << bits;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(70000.0f), 0x7c00);                 // overflow -> inf
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);                 // largest finite
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);    // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);    // underflows to zero
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, ParseNamesAndRejectUnknown) {
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(parse_dtype("F32"), DType::F32);
  EXPECT_EQ(parse_dtype("float16"), DType::F16);
  try {
    parse_dtype("F8_E5M2X");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("F8_E5M2X"), std::string::npos);
  }
}

namespace {

// fp8 e4m3 from its definition, in fp64 (independent of core/dtype's bit manipulation): sign,
// 4-bit exponent of bias 7, 3-bit mantissa, subnormals at exponent 0, 0x7f / 0xff NaN, no
// infinities.
double e4m3_definition(int code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa / 8.0, -6);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
}

// The code of the finite e4m3 value nearest |x| by brute force over the definition, ties to the
// even code (the one whose mantissa ends in 0), with x's sign bit; NaN gives 0x7f. Nothing lies
// past 448 (0x7f is NaN), so larger values come out saturated.
uint8_t e4m3_nearest(float x) {
  static const std::vector<double> finite = [] {
    std::vector<double> values(0x7f);
    for (int code = 0; code < 0x7f; ++code) values[code] = e4m3_definition(code);
    return values;
  }();
  if (std::isnan(x)) return 0x7f;
  const double magnitude = std::abs(static_cast<double>(x));
  int best = 0;
  for (int code = 1; code < 0x7f; ++code) {
    const double distance = std::abs(finite[code] - magnitude), best_distance = std::abs(finite[best] - magnitude);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) best = code;
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
}

}  // namespace

TEST(DType, E4M3DecodesEveryCodeAsDefined) {
  for (int code = 0; code < 256; ++code) {
    const double expected = e4m3_definition(code);
    const float value = e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(value)) << code;
    } else {
      ASSERT_EQ(static_cast<double>(value), expected) << code;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(DType, E4M3EncodesToTheNearestValueTiesToEven) {
  std::vector<float> sweep;
  // Every code's value, the midpoints to its neighbour (ties), and floats just either side of them.
  for (int code = 0; code < 0x7e; ++code) {
    const float low = static_cast<float>(e4m3_definition(code)), high = static_cast<float>(e4m3_definition(code + 1));
    const float middle = static_cast<float>((e4m3_definition(code) + e4m3_definition(code + 1)) / 2);
    for (float x : {low, middle, std::nextafter(middle, 0.0f), std::nextafter(middle, 1000.0f), low + (high - low) / 3})
      sweep.push_back(x);
  }
  // Saturation, underflow and the non-finite.
  for (float x : {448.0f, 450.0f, 464.0f, 464.5f, 1000.0f, 1e30f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), std::ldexp(1.0f, -10), std::ldexp(1.0f, -11),
                  std::nextafter(std::ldexp(1.0f, -10), 1.0f), std::numeric_limits<float>::denorm_min(), 0.0f,
                  std::numeric_limits<float>::quiet_NaN()})
    sweep.push_back(x);
  // A dense sweep of f32 bit patterns over the whole range.
  for (uint64_t bits = 0; bits < 0x80000000u; bits += 2053) {
    float x;
    const uint32_t word = static_cast<uint32_t>(bits);
    std::memcpy(&x, &word, sizeof x);
    sweep.push_back(x);
  }
  for (const float x : sweep)
    for (const float signed_x : {x, -x}) {
      ASSERT_EQ(f32_to_e4m3(signed_x), e4m3_nearest(signed_x)) << signed_x;
    }
  // Spot checks of the rules themselves.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);   // 1 + 1/16, halfway between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);   // halfway between 1.125 and 1.25: even is 1.25
  EXPECT_EQ(f32_to_e4m3(-1000.0f), 0xfe);  // -448
  EXPECT_EQ(f32_to_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal steps: ties to even (2)
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
}

TEST(DType, E4M3ConvertsArraysAndParsesItsName) {
  const std::vector<float> values = {0.3f, -2.5f, 500.0f};
  std::vector<uint8_t> bytes(values.size());
  convert_from_f32(values.data(), DType::F8E4M3, bytes.data(), values.size());
  std::vector<float> back(values.size());
  convert_to_f32(DType::F8E4M3, bytes.data(), back.data(), values.size());
  EXPECT_EQ(back, (std::vector<float>{0.3125f, -2.5f, 448.0f}));
  EXPECT_EQ(dtype_size(DType::F8E4M3), 1u);
  EXPECT_EQ(parse_dtype(dtype_name(DType::F8E4M3)), DType::F8E4M3);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::F8E4M3);
}
