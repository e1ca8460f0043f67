// core/dtype.h — element types and scalar conversions (fp16/bf16/fp8 e4m3 <-> fp32).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace splitflow {

// F8E4M3: fp8 e4m3 (OCP "fn": sign, 4-bit exponent of bias 7, 3-bit mantissa, subnormals, no
// infinities, 0x7f/0xff NaN, largest finite 448), stored as one byte.
//
// Quantized matrix types (the encodings and their codecs belong to quant/; core only knows how
// many bytes a row takes, so a Tensor knows its size). A row of K elements is stored as
// K / block_elems blocks of block_bytes each, rows back to back:
//  - GGUF / llama.cpp: Q4_0 .. Q6_K, byte-identical to ggml's blocks (32 or 256 elements).
//  - Inferflow min/max blocks: Qk_B32 / Qk_B64 (k bits per weight; fp16 min and scale, then the
//    codes as a little-endian bit stream) and Q3H_B64 (3.5 bits: two weights per 7-bit code).
//  - FP8 E4M3 weight-only: F8_CHANNEL (one f32 scale per row), F8_G128 (one per 128 elements).
//    A row is its f32 scales, padded to 16 bytes, then K e4m3 bytes (K a multiple of 16 / 128).
//  - int8 groups I8_G32 / I8_G64 / I8_G128 (llama2.c's version-2 "Q8_0" export): int8 codes, one
//    f32 scale per 32 / 64 / 128 elements, w = q * scale. A row is its f32 scales, padded to 16
//    bytes, then K int8 bytes (the FP8 row layout with int8 codes).
// Mixed: a matrix whose runs of rows have different types (Tensor::row_runs), e.g. a fused QKV of
// a Q4_K_M GGUF whose v rows are Q6_K.
enum class DType : uint8_t {
  F32, F16, BF16, F8E4M3, F64, I8, I16, I32, I64, U8, Bool,
  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
  Q2_B32, Q3_B32, Q4_B32, Q5_B32, Q6_B32, Q8_B32,
  Q2_B64, Q3_B64, Q4_B64, Q5_B64, Q6_B64, Q8_B64, Q3H_B64,
  F8_CHANNEL, F8_G128,
  I8_G32, I8_G64, I8_G128,
  Mixed,
};

// Bytes per element of a plain type; throws for the quantized types and Mixed (their size is
// per row: dtype_row_bytes).
size_t dtype_size(DType dtype);
// True for the quantized matrix types (Q4_0 .. I8_G128).
bool is_quantized(DType dtype);
// Elements per block: 1 for plain types; a quantized row length must be a multiple of it.
int64_t dtype_block_elems(DType dtype);
// Bytes of one row of `row_len` elements; throws, naming the type, when row_len is not a
// multiple of the block (or for Mixed, which has no single row size).
size_t dtype_row_bytes(DType dtype, int64_t row_len);
std::string_view dtype_name(DType dtype);  // "f32", "f16", "bf16", "f8_e4m3", ...
// "f32, bf16": the names of a range of dtypes, for messages.
template <typename DTypes>
std::string dtype_names(const DTypes& dtypes) {
  std::string names;
  for (const DType dtype : dtypes) names += (names.empty() ? "" : ", ") + std::string(dtype_name(dtype));
  return names;
}

// Parses the names dtype_name() prints (quantized types included: "q4_k", "q3h_b64",
// "f8_channel", "i8_g32") plus the safetensors spellings ("F32", "BF16", ...), case-insensitively.
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
