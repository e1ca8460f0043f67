#include "core/dtype.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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
