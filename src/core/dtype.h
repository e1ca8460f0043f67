// core/dtype.h — element types and scalar conversions (fp16/bf16 <-> fp32).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace splitflow {

enum class DType : uint8_t { F32, F16, BF16, F64, I8, I16, I32, I64, U8, Bool };

// Bytes per element.
size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "f32", "f16", "bf16", ...
// Parses the names dtype_name() prints plus the safetensors spellings ("F32", "BF16", ...).
// Throws splitflow::Error naming the unknown string.
DType parse_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// Round to nearest even, NaN stays NaN.
inline uint16_t f32_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x40);
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);  // round to nearest even, overflow to inf

// Converts `count` elements of `src` (of type `src_dtype`, a float type) to fp32.
void convert_to_f32(DType src_dtype, const void* src, float* dst, size_t count);
// Converts fp32 to `dst_dtype` (F32, F16 or BF16).
void convert_from_f32(const float* src, DType dst_dtype, void* dst, size_t count);

}  // namespace splitflow
