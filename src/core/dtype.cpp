#include "core/dtype.h"

#include "core/error.h"

#include <cctype>
#include <limits>
#include <string>

namespace splitflow {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16: return 2;
    case DType::F8E4M3:
    case DType::I8:
    case DType::U8:
    case DType::Bool: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F8E4M3: return "f8_e4m3";
    case DType::F64: return "f64";
    case DType::I8: return "i8";
    case DType::I16: return "i16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::Bool: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "f32" || lower == "float32" || lower == "float") return DType::F32;
  if (lower == "f16" || lower == "float16" || lower == "half") return DType::F16;
  if (lower == "bf16" || lower == "bfloat16") return DType::BF16;
  if (lower == "f8_e4m3" || lower == "float8_e4m3fn") return DType::F8E4M3;
  if (lower == "f64" || lower == "float64") return DType::F64;
  if (lower == "i8" || lower == "int8") return DType::I8;
  if (lower == "i16" || lower == "int16") return DType::I16;
  if (lower == "i32" || lower == "int32") return DType::I32;
  if (lower == "i64" || lower == "int64") return DType::I64;
  if (lower == "u8" || lower == "uint8") return DType::U8;
  if (lower == "bool") return DType::Bool;
  fail("unknown dtype '{}' (known: f32, f16, bf16, f8_e4m3, f64, i8, i16, i32, i64, u8, bool)", name);
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t word;
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
  std::memcpy(&value, &word, sizeof value);
  return value;
}

uint16_t f32_to_f16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  const uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  const uint32_t abs = word & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;          // overflow (rounds past 65504) -> inf
  if (abs < 0x33000001u) return sign;                      // below half the smallest subnormal
  int exponent = static_cast<int>(abs >> 23) - 127;
  uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  int shift = exponent < -14 ? (-14 - exponent) + 13 : 13;  // subnormals shift further
  uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (result & 1u))) ++result;
  if (exponent < -14) return static_cast<uint16_t>(sign | result);
  // normal: result holds the implicit bit at 0x400; a mantissa carry bumps the exponent.
  return static_cast<uint16_t>(sign | ((static_cast<uint32_t>(exponent + 15) << 10) + (result - 0x400u)));
}

float e4m3_to_f32(uint8_t bits) {
  const uint32_t exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0x1p-9f;  // subnormal: mantissa * 2^-6 / 8
  } else {
    const uint32_t word = ((exponent + 120) << 23) | (mantissa << 20);  // rebias 7 -> 127
    std::memcpy(&magnitude, &word, sizeof magnitude);
  }
  return (bits & 0x80u) ? -magnitude : magnitude;
}

uint8_t f32_to_e4m3(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  const uint8_t sign = static_cast<uint8_t>((word >> 24) & 0x80u);
  const uint32_t abs = word & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;           // NaN
  if (abs >= 0x43e00000u) return sign | 0x7e;   // >= 448 (what would round past it has no code): saturate
  if (abs <= 0x3a800000u) return sign;          // <= 2^-10, half the smallest subnormal: ties to zero
  const int exponent = static_cast<int>(abs >> 23) - 127;
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const int shift = exponent < -6 ? 20 + (-6 - exponent) : 20;  // subnormals shift further
  uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (result & 1u))) ++result;
  // A subnormal that rounds up to 8 is the smallest normal's code.
  if (exponent < -6) return static_cast<uint8_t>(sign | result);
  // normal: result holds the implicit bit at 0x8; a mantissa carry bumps the exponent.
  return static_cast<uint8_t>(sign | ((static_cast<uint32_t>(exponent + 7) << 3) + (result - 0x8u)));
}

void convert_to_f32(DType src_dtype, const void* src, float* dst, size_t count) {
  switch (src_dtype) {
    case DType::F32: std::memcpy(dst, src, count * sizeof(float)); return;
    case DType::F16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(in[i]);
      return;
    }
    case DType::BF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(in[i]);
      return;
    }
    case DType::F8E4M3: {
      const auto* in = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = e4m3_to_f32(in[i]);
      return;
    }
    case DType::F64: {
      const auto* in = static_cast<const double*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(in[i]);
      return;
    }
    default: fail("cannot convert {} tensor data to f32", dtype_name(src_dtype));
  }
}

void convert_from_f32(const float* src, DType dst_dtype, void* dst, size_t count) {
  switch (dst_dtype) {
    case DType::F32: std::memcpy(dst, src, count * sizeof(float)); return;
    case DType::F16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F8E4M3: {
      auto* out = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = f32_to_e4m3(src[i]);
      return;
    }
    default: fail("cannot convert f32 data to {}", dtype_name(dst_dtype));
  }
}

}  // namespace splitflow
