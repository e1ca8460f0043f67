// core/fp16.h — IEEE half precision to and from float32 by integer operations, host and device
// (C++17): round to nearest even, overflow to infinity, NaN kept NaN, subnormals exact. The one
// definition behind core/dtype.h's f32_to_f16 / f16_to_f32 and the device side of
// quant/block_quantizers.h, so a quantizer's fp16 fields round alike wherever it runs.
#pragma once

#include "core/counter_hash.h"  // SF_HOST_DEVICE

#include <cstdint>
#include <cstring>

namespace splitflow::fp16 {

SF_HOST_DEVICE uint16_t from_f32(float value) {
  uint32_t word;
  memcpy(&word, &value, sizeof word);
  const uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  const uint32_t abs = word & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: infinity
  if (abs < 0x33000001u) return sign;              // below half the smallest subnormal
  const int exponent = static_cast<int>(abs >> 23) - 127;
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const int shift = exponent < -14 ? (-14 - exponent) + 13 : 13;  // subnormals shift further
  uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (result & 1u))) ++result;
  if (exponent < -14) return static_cast<uint16_t>(sign | result);
  // normal: result holds the implicit bit at 0x400; a mantissa carry bumps the exponent.
  return static_cast<uint16_t>(sign | ((static_cast<uint32_t>(exponent + 15) << 10) + (result - 0x400u)));
}

SF_HOST_DEVICE float to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu, word;
  if (exponent == 0x1f) {
    word = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    word = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  memcpy(&value, &word, sizeof value);
  return value;
}

}  // namespace splitflow::fp16
