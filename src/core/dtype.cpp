#include "core/dtype.h"

#include "core/error.h"
#include "core/fp16.h"

#include <cctype>
#include <limits>
#include <string>

namespace splitflow {

namespace {

struct BlockGeometry {
  int64_t elems;
  size_t bytes;  // 0 for the row-scaled FP8 and int8 types (row_bytes computes them)
};

// ggml's block structs (ggml-common.h) and the Inferflow layouts described in dtype.h.
BlockGeometry block_geometry(DType dtype) {
  switch (dtype) {
    case DType::Q4_0: return {32, 18};
    case DType::Q4_1: return {32, 20};
    case DType::Q5_0: return {32, 22};
    case DType::Q5_1: return {32, 24};
    case DType::Q8_0: return {32, 34};
    case DType::Q2_K: return {256, 84};
    case DType::Q3_K: return {256, 110};
    case DType::Q4_K: return {256, 144};
    case DType::Q5_K: return {256, 176};
    case DType::Q6_K: return {256, 210};
    case DType::Q2_B32: return {32, 4 + 4 * 2};
    case DType::Q3_B32: return {32, 4 + 4 * 3};
    case DType::Q4_B32: return {32, 4 + 4 * 4};
    case DType::Q5_B32: return {32, 4 + 4 * 5};
    case DType::Q6_B32: return {32, 4 + 4 * 6};
    case DType::Q8_B32: return {32, 4 + 4 * 8};
    case DType::Q2_B64: return {64, 4 + 8 * 2};
    case DType::Q3_B64: return {64, 4 + 8 * 3};
    case DType::Q4_B64: return {64, 4 + 8 * 4};
    case DType::Q5_B64: return {64, 4 + 8 * 5};
    case DType::Q6_B64: return {64, 4 + 8 * 6};
    case DType::Q8_B64: return {64, 4 + 8 * 8};
    case DType::Q3H_B64: return {64, 4 + 28};  // 32 codes of 7 bits
    case DType::F8_CHANNEL: return {16, 0};
    case DType::F8_G128: return {128, 0};
    case DType::I8_G32: return {32, 0};
    case DType::I8_G64: return {64, 0};
    case DType::I8_G128: return {128, 0};
    default: return {1, dtype_size(dtype)};
  }
}

}  // namespace

bool is_quantized(DType dtype) { return dtype >= DType::Q4_0 && dtype <= DType::I8_G128; }

int64_t dtype_block_elems(DType dtype) {
  SF_CHECK(dtype != DType::Mixed, "dtype mixed has no block size (its row runs have one each)");
  return block_geometry(dtype).elems;
}

size_t dtype_row_bytes(DType dtype, int64_t row_len) {
  SF_CHECK(dtype != DType::Mixed, "dtype mixed has no single row size (its row runs have one each)");
  SF_CHECK(row_len >= 0, "negative row length {}", row_len);
  const BlockGeometry block = block_geometry(dtype);
  SF_CHECK(row_len % block.elems == 0, "a row of {} elements is not a whole number of {} blocks ({} elements each)",
           row_len, dtype_name(dtype), block.elems);
  const auto blocks = static_cast<size_t>(row_len / block.elems);
  if (block.bytes == 0) {  // f32 scales (one per row or per block) padded to 16 bytes, then 1-byte codes
    const size_t groups = dtype == DType::F8_CHANNEL ? (row_len > 0 ? 1 : 0) : blocks;
    return (groups * sizeof(float) + 15) / 16 * 16 + static_cast<size_t>(row_len);
  }
  return blocks * block.bytes;
}

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
    default:
      fail("dtype {} has no per-element size (a quantized or mixed matrix: its rows have a size, dtype_row_bytes)",
           dtype_name(dtype));
  }
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
    case DType::Q4_0: return "q4_0";
    case DType::Q4_1: return "q4_1";
    case DType::Q5_0: return "q5_0";
    case DType::Q5_1: return "q5_1";
    case DType::Q8_0: return "q8_0";
    case DType::Q2_K: return "q2_k";
    case DType::Q3_K: return "q3_k";
    case DType::Q4_K: return "q4_k";
    case DType::Q5_K: return "q5_k";
    case DType::Q6_K: return "q6_k";
    case DType::Q2_B32: return "q2_b32";
    case DType::Q3_B32: return "q3_b32";
    case DType::Q4_B32: return "q4_b32";
    case DType::Q5_B32: return "q5_b32";
    case DType::Q6_B32: return "q6_b32";
    case DType::Q8_B32: return "q8_b32";
    case DType::Q2_B64: return "q2_b64";
    case DType::Q3_B64: return "q3_b64";
    case DType::Q4_B64: return "q4_b64";
    case DType::Q5_B64: return "q5_b64";
    case DType::Q6_B64: return "q6_b64";
    case DType::Q8_B64: return "q8_b64";
    case DType::Q3H_B64: return "q3h_b64";
    case DType::F8_CHANNEL: return "f8_channel";
    case DType::F8_G128: return "f8_g128";
    case DType::I8_G32: return "i8_g32";
    case DType::I8_G64: return "i8_g64";
    case DType::I8_G128: return "i8_g128";
    case DType::Mixed: return "mixed";
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
  for (auto d = static_cast<uint8_t>(DType::Q4_0); d <= static_cast<uint8_t>(DType::I8_G128); ++d)
    if (lower == dtype_name(static_cast<DType>(d))) return static_cast<DType>(d);
  fail("unknown dtype '{}' (known: f32, f16, bf16, f8_e4m3, f64, i8, i16, i32, i64, u8, bool, and the quantized "
       "types q4_0, q4_1, q5_0, q5_1, q8_0, q2_k .. q6_k, q2_b32 .. q8_b64, q3h_b64, f8_channel, f8_g128, i8_g32, i8_g64, i8_g128)", name);
}

float f16_to_f32(uint16_t bits) { return fp16::to_f32(bits); }

uint16_t f32_to_f16(float value) { return fp16::from_f32(value); }

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
