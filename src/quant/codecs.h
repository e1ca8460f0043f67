// quant/codecs.h — the per-family row codecs behind quant.h's dispatch (internal to quant/).
//
// Owns: one entry point per family to decode, encode and scan one row, so quant.cpp only
// dispatches and iterates. Must never: be included outside src/quant (callers use quant.h).
//
// Every function takes a row of k elements (k a multiple of the type's block, checked by the
// caller) and its dtype_row_bytes(type, k) bytes.
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace splitflow::quant::detail {

// A scale field that is not finite: which block of the row and which field ("d", "dmin", ...).
struct BadScale {
  int64_t block = 0;
  std::string_view field;
  float value = 0.0f;
};

// gguf_blocks.cpp: Q4_0 .. Q6_K.
void dequantize_gguf_row(DType type, const uint8_t* row, float* out, int64_t k);
void quantize_gguf_row(DType type, const float* in, uint8_t* row, int64_t k);
std::optional<BadScale> find_bad_gguf_scale(DType type, const uint8_t* row, int64_t k);

// inferflow_blocks.cpp: Q2_B32 .. Q8_B64, Q3H_B64.
void dequantize_inferflow_row(DType type, const uint8_t* row, float* out, int64_t k);
void quantize_inferflow_row(DType type, const float* in, uint8_t* row, int64_t k);
std::optional<BadScale> find_bad_inferflow_scale(DType type, const uint8_t* row, int64_t k);

// fp8.cpp: F8_CHANNEL, F8_G128 (a block is a scale group).
void dequantize_fp8_row(DType type, const uint8_t* row, float* out, int64_t k);
void quantize_fp8_row(DType type, const float* in, uint8_t* row, int64_t k);
std::optional<BadScale> find_bad_fp8_scale(DType type, const uint8_t* row, int64_t k);

// int8_groups.cpp: I8_G32, I8_G64, I8_G128 (a block is a scale group).
void dequantize_int8_row(DType type, const uint8_t* row, float* out, int64_t k);
void quantize_int8_row(DType type, const float* in, uint8_t* row, int64_t k);
std::optional<BadScale> find_bad_int8_scale(DType type, const uint8_t* row, int64_t k);

// Little-endian fp16 / f32 fields at `bytes` (blocks are byte-packed, so no alignment).
inline float load_f16(const uint8_t* bytes) {
  return f16_to_f32(static_cast<uint16_t>(bytes[0] | (bytes[1] << 8)));
}
inline void store_f16(uint8_t* bytes, uint16_t bits) {
  bytes[0] = static_cast<uint8_t>(bits & 0xff);
  bytes[1] = static_cast<uint8_t>(bits >> 8);
}
inline float load_f32(const uint8_t* bytes) {
  float value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

}  // namespace splitflow::quant::detail
