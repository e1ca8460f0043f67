// core/dtype.h — element types and scalar conversions (fp16/bf16/fp8 e4m3 <-> fp32).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace splitflow {

// F8E4M3: fp8 e4m3 (OCP "fn": sign, 4-bit exponent of bias 7, 3-bit mantissa, subnormals, no
// infinities, 0x7f/0xff NaN, largest finite 448), stored as one byte.
enum class DType : uint8_t { F32, F16, BF16, F8E4M3, F64, I8, I16, I32, I64, U8, Bool };

// Bytes per element.
size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "f32", "f16", "bf16", "f8_e4m3", ...
// "f32, bf16": the names of a range of dtypes, for messages.
template <typename DTypes>
std::string dtype_names(const DTypes& dtypes) {
  std::string names;
  for (const DType dtype : dtypes) names += (names.empty() ? "" : ", ") + std::string(dtype_name(dtype));
  return names;
}

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

// fp8 e4m3. Encoding rounds to nearest even and saturates to +-448 (infinities too), as CUDA's
// __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3) does; NaN becomes 0x7f.
float e4m3_to_f32(uint8_t bits);
uint8_t f32_to_e4m3(float value);

// Converts `count` elements of `src` (of type `src_dtype`, a float type) to fp32.
void convert_to_f32(DType src_dtype, const void* src, float* dst, size_t count);
// Converts fp32 to `dst_dtype` (F32, F16, BF16 or F8E4M3).
void convert_from_f32(const float* src, DType dst_dtype, void* dst, size_t count);

}  // namespace splitflow
