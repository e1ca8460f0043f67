// quant/gguf_blocks.cpp — GGUF / llama.cpp blocks Q4_0 .. Q6_K: scalar reference codecs.
//
// Dequantization does each element's float32 arithmetic in the order gguf.quants.dequantize (numpy)
// does, so results are bit-identical to it (quant/ compiles with -ffp-contract=off: no fused
// multiply-adds). Quantization is quant/block_quantizers.h's (shared with the device): llama.cpp's
// reference quantizers (quantize_row_*_ref in ggml-quants.c, no importance matrix) with the same
// float32 operation order: every type is byte-identical to them (tests/quant, against llama.cpp
// b11434), and Q4_0 .. Q8_0 also to gguf.quants.quantize, which ports the same reference.
#include "core/error.h"
#include "quant/block_quantizers.h"
#include "quant/codecs.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace splitflow::quant::detail {

namespace {

using blocks::k4_scale_min;
using blocks::kSuperBlock;
using blocks::q3k_scale;

// ---- Q4_0 Q4_1 Q5_0 Q5_1 Q8_0: blocks of 32 --------------------------------------------------
//  Q4_0: d f16, qs[16]            (low nibbles elements 0..15, high nibbles 16..31)
//  Q4_1: d f16, m f16, qs[16]
//  Q5_0: d f16, qh u32, qs[16]    (qh bit j: the fifth bit of element j)
//  Q5_1: d f16, m f16, qh u32, qs[16]
//  Q8_0: d f16, qs[32] int8

int nibble(const uint8_t* qs, int j) { return j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4); }
uint32_t load_u32(const uint8_t* bytes) {
  uint32_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

void dequantize_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(nibble(b + 2, j) - 8);
}
void dequantize_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(nibble(b + 4, j)) + m;
}
void dequantize_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  for (int j = 0; j < 32; ++j) {
    const int q = nibble(b + 6, j) | static_cast<int>(((qh >> j) & 1u) << 4);
    y[j] = d * static_cast<float>(q - 16);
  }
}
void dequantize_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  for (int j = 0; j < 32; ++j) {
    const int q = nibble(b + 8, j) | static_cast<int>(((qh >> j) & 1u) << 4);
    y[j] = d * static_cast<float>(q) + m;
  }
}
void dequantize_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}


// ---- K-quants: super-blocks of 256 --------------------------------------------------------------
//  Q2_K (84):  scales[16] (low nibble scale, high nibble min), qs[64], d f16, dmin f16
//  Q3_K (110): hmask[32], qs[64], scales[12] (16 x 6 bits, offset 32), d f16
//  Q4_K (144): d f16, dmin f16, scales[12] (8 scales + 8 mins, 6 bits), qs[128]
//  Q5_K (176): d f16, dmin f16, scales[12], qh[32], qs[128]
//  Q6_K (210): ql[128], qh[64], scales[16] int8, d f16
// Element e of a 2-bit plane (Q2_K, Q3_K low bits): e = 128 h + 32 s + l -> bits 2s of qs[32 h + l].

int two_bits(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }


void dequantize_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = load_f16(b + 80), dmin = load_f16(b + 82);
  for (int e = 0; e < kSuperBlock; ++e) {
    const uint8_t sc = scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0xf), ml = dmin * static_cast<float>(sc >> 4);
    y[e] = dl * static_cast<float>(two_bits(qs, e)) - ml;
  }
}
void dequantize_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = load_f16(b + 108);
  for (int e = 0; e < kSuperBlock; ++e) {
    const float dl = d * static_cast<float>(q3k_scale(scales, e / 16));
    // hmask bit (e / 32) of byte e % 32; a clear bit subtracts 4.
    const int high = (hmask[e % 32] >> (e / 32)) & 1;
    y[e] = dl * static_cast<float>(two_bits(qs, e) - (high ? 0 : 4));
  }
}
// Element e = 64 c + 32 h + l of Q4_K / Q5_K: nibble h of qs[32 c + l], sub-block e / 32.
void dequantize_q45_k(const uint8_t* b, float* y, bool five_bits) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = five_bits ? b + 48 : b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k4_scale_min(scales, j, sc, m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
      if (five_bits) q |= ((qh[l] >> j) & 1) << 4;
      y[32 * j + l] = dl * static_cast<float>(q) - ml;
    }
  }
}
// Element e = 128 h + r of Q6_K: low 4 bits are nibble (r / 64) of ql[64 h + r % 64], high 2 bits
// are bits 2 (r / 32) of qh[32 h + r % 32]; sub-block e / 16.
void dequantize_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int e = 0; e < kSuperBlock; ++e) {
    const int h = e / 128, r = e % 128;
    const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xf;
    const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>((low | (high << 4)) - 32);
  }
}


struct GgufCodec {
  int block_elems;
  int block_bytes;
  void (*dequantize)(const uint8_t*, float*);
};

GgufCodec codec_of(DType type) {
  switch (type) {
    case DType::Q4_0: return {32, 18, dequantize_q4_0};
    case DType::Q4_1: return {32, 20, dequantize_q4_1};
    case DType::Q5_0: return {32, 22, dequantize_q5_0};
    case DType::Q5_1: return {32, 24, dequantize_q5_1};
    case DType::Q8_0: return {32, 34, dequantize_q8_0};
    case DType::Q2_K: return {256, 84, dequantize_q2_k};
    case DType::Q3_K: return {256, 110, dequantize_q3_k};
    case DType::Q4_K:
      return {256, 144, [](const uint8_t* b, float* y) { dequantize_q45_k(b, y, false); }};
    case DType::Q5_K:
      return {256, 176, [](const uint8_t* b, float* y) { dequantize_q45_k(b, y, true); }};
    case DType::Q6_K: return {256, 210, dequantize_q6_k};
    default: fail("dtype {} is not a GGUF block type", dtype_name(type));
  }
}

// Byte offsets of each block's fp16 scale fields.
struct ScaleFieldAt {
  std::string_view name;
  int offset;
};
int scale_fields_of(DType type, ScaleFieldAt fields[2]) {
  switch (type) {
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0: fields[0] = {"d", 0}; return 1;
    case DType::Q4_1:
    case DType::Q5_1: fields[0] = {"d", 0}, fields[1] = {"m", 2}; return 2;
    case DType::Q4_K:
    case DType::Q5_K: fields[0] = {"d", 0}, fields[1] = {"dmin", 2}; return 2;
    case DType::Q2_K: fields[0] = {"d", 80}, fields[1] = {"dmin", 82}; return 2;
    case DType::Q3_K: fields[0] = {"d", 108}; return 1;
    case DType::Q6_K: fields[0] = {"d", 208}; return 1;
    default: fail("dtype {} is not a GGUF block type", dtype_name(type));
  }
}

}  // namespace

void dequantize_gguf_row(DType type, const uint8_t* row, float* out, int64_t k) {
  const GgufCodec codec = codec_of(type);
  for (int64_t block = 0; block < k / codec.block_elems; ++block)
    codec.dequantize(row + block * codec.block_bytes, out + block * codec.block_elems);
}

void quantize_gguf_row(DType type, const float* in, uint8_t* row, int64_t k) {
  const GgufCodec codec = codec_of(type);
  for (int64_t block = 0; block < k / codec.block_elems; ++block)
    blocks::quantize_gguf_block(type, in + block * codec.block_elems, row + block * codec.block_bytes);
}

std::optional<BadScale> find_bad_gguf_scale(DType type, const uint8_t* row, int64_t k) {
  const GgufCodec codec = codec_of(type);
  ScaleFieldAt fields[2];
  const int count = scale_fields_of(type, fields);
  for (int64_t block = 0; block < k / codec.block_elems; ++block)
    for (int f = 0; f < count; ++f) {
      const float value = load_f16(row + block * codec.block_bytes + fields[f].offset);
      if (!std::isfinite(value)) return BadScale{block, fields[f].name, value};
    }
  return std::nullopt;
}

}  // namespace splitflow::quant::detail
