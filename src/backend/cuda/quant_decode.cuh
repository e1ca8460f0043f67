// backend/cuda/quant_decode.cuh — block decoders for the quantized weight types (core/dtype.h's
// layouts, byte-identical to ggml's blocks for the GGUF ones). Each decoder turns one 32-element
// unit of a row (elements [32u, 32u + 32)) into fp32 in registers:
//   Dec::unit(blocks, lu, row, k, u, w)
// with `blocks` the first block of a run of whole blocks holding the unit as its lu-th (global or
// shared memory: the GEMVs stage chunks of rows in shared memory), `row` the row's first byte in
// global memory and u the unit's index in the row (F8 / I8 read their scales there). Each has
// kBytes and kUnitsPerBlock (a block's bytes and 32-element units) and data_offset(k), where the
// row's blocks start; decode_unit() is the plain "unit u of this global row".
// A unit is a whole block (Q4_0 .. Q8_0, Qk_B32), half a 64-element block (Qk_B64, Q3H_B64), an
// eighth of a 256-element super-block (K-quants: its one or two sub-block scales), or 32 fp8 bytes
// under their group's scale, or 32 int8 bytes under theirs. Loads: 16-bit words where blocks are
// only 2-byte aligned (18-, 22-, 34-, 110- and 210-byte blocks), 32-bit words for 4-byte ones,
// 16-byte words for the Q4_K / Q5_K nibbles and the fp8 / int8 bytes (quant_alignment() says what a
// run's base must be aligned to; staging keeps every byte's address modulo 16).
// The arithmetic follows the CPU references (quant/): scale * q (- min) in fp32.
#pragma once

#include "core/dtype.h"

#include <cuda_fp16.h>

#include <cstdint>

namespace splitflow::cuda::quant_decode {

__device__ __forceinline__ uint32_t ld8(const uint8_t* p) { return *p; }
__device__ __forceinline__ uint32_t ld16(const uint8_t* p) { return *reinterpret_cast<const unsigned short*>(p); }
// Four bytes from a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld32_a2(const uint8_t* p) { return ld16(p) | (ld16(p + 2) << 16); }
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) { return *reinterpret_cast<const unsigned int*>(p); }
__device__ __forceinline__ uint4 ld128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ float f16(uint32_t bits) { return __half2float(__ushort_as_half(static_cast<unsigned short>(bits))); }
__device__ __forceinline__ float ldf16(const uint8_t* p) { return f16(ld16(p)); }

// Byte i (0..3) of a word.
__device__ __forceinline__ uint32_t byte_of(uint32_t word, int i) { return (word >> (8 * i)) & 0xffu; }

// Integer codes to float without I2F, a quarter-rate instruction on sm_90 that bounded the decode
// GEMVs: v in [0, 2^23) ORed into the mantissa of 2^23 is the float 2^23 + v exactly, so one
// logic op and one FADD (both full rate) give float(v) - offset, exact for a small integer offset
// (as the int conversion was). The offset folds a code's bias (Q4_0's 8, Q6_K's 32) into the FADD.
__device__ __forceinline__ float code_minus(uint32_t v, float offset) {
  return __uint_as_float(0x4B000000u | v) - (8388608.0f + offset);
}
__device__ __forceinline__ float code_to_float(uint32_t v) { return code_minus(v, 0.0f); }
// Signed byte i of a word as a float: the byte with its sign bit flipped is v + 128.
__device__ __forceinline__ float signed_byte_to_float(uint32_t word, int i) {
  return __uint_as_float(__byte_perm(word ^ 0x80808080u, 0x4B000000u, 0x7650 | i)) - 8388736.0f;
}

// Block types: the block decoders' data start at the row's first byte (F8 and I8 override it: their scales come first).
struct BlocksFromRowStart {
  __device__ static int64_t data_offset(int64_t) { return 0; }
};

// ---- GGUF legacy blocks (32 elements) ------------------------------------------------------------
// Q4_0 {f16 d; u8 qs[16]}: w[j] = (lo(qs[j]) - 8) d, w[j + 16] = (hi(qs[j]) - 8) d.
struct Q4_0 : BlocksFromRowStart {
  static constexpr int kBytes = 18, kUnitsPerBlock = 1;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + u * kBytes;
    const float d = ldf16(b);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t q = ld16(b + 2 + 2 * i);
      w[2 * i] = code_minus(q & 0xf, 8.0f) * d;
      w[2 * i + 16] = code_minus((q >> 4) & 0xf, 8.0f) * d;
      w[2 * i + 1] = code_minus((q >> 8) & 0xf, 8.0f) * d;
      w[2 * i + 17] = code_minus((q >> 12) & 0xf, 8.0f) * d;
    }
  }
};

// Q4_1 {f16 d, m; u8 qs[16]}: w = q d + m.
struct Q4_1 : BlocksFromRowStart {
  static constexpr int kBytes = 20, kUnitsPerBlock = 1;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + u * kBytes;
    const float d = ldf16(b), m = ldf16(b + 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t q = ld16(b + 4 + 2 * i);
      w[2 * i] = fmaf(code_to_float(q & 0xf), d, m);
      w[2 * i + 16] = fmaf(code_to_float((q >> 4) & 0xf), d, m);
      w[2 * i + 1] = fmaf(code_to_float((q >> 8) & 0xf), d, m);
      w[2 * i + 17] = fmaf(code_to_float((q >> 12) & 0xf), d, m);
    }
  }
};

// Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}: fifth bits of w[j] in qh bit j, of w[j + 16] in bit j + 16.
// Q5_1 {f16 d, m; u8 qh[4]; u8 qs[16]}: no offset, + m.
template <bool kMin>
struct Q5 : BlocksFromRowStart {
  static constexpr int kBytes = kMin ? 24 : 22, kUnitsPerBlock = 1;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + u * kBytes;
    const float d = ldf16(b), m = kMin ? ldf16(b + 2) : -16.0f * d;
    const uint8_t* at = b + (kMin ? 4 : 2);
    const uint32_t qh = ld32_a2(at);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t q = ld16(at + 4 + 2 * i);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * i + h;
        const uint32_t byte = (q >> (8 * h)) & 0xff;
        const uint32_t lo = (byte & 0xf) | (((qh >> j) & 1) << 4), hi = (byte >> 4) | (((qh >> (j + 16)) & 1) << 4);
        w[j] = fmaf(code_to_float(lo), d, m);
        w[j + 16] = fmaf(code_to_float(hi), d, m);
      }
    }
  }
};

// Q8_0 {f16 d; i8 qs[32]}.
struct Q8_0 : BlocksFromRowStart {
  static constexpr int kBytes = 34, kUnitsPerBlock = 1;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + u * kBytes;
    const float d = ldf16(b);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t q = ld16(b + 2 + 2 * i);
      w[2 * i] = signed_byte_to_float(q, 0) * d;
      w[2 * i + 1] = signed_byte_to_float(q, 1) * d;
    }
  }
};

// ---- K-quants (256-element super-blocks; unit s = u % 8 is elements [32 s, 32 s + 32)) ----------
// Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}: element e: 2-bit q at qs[32 (e / 128) + e % 32]
// >> 2 ((e % 128) / 32), scale byte scales[e / 16] (low nibble: scale, high: min).
struct Q2_K : BlocksFromRowStart {
  static constexpr int kBytes = 84, kUnitsPerBlock = 8;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + (u / 8) * kBytes;
    const int s = static_cast<int>(u % 8), shift = 2 * (s % 4);
    const uint32_t dd = ld32(b + 80), sc = ld16(b + 2 * s);
    const float d = f16(dd & 0xffff), dmin = f16(dd >> 16);
    const uint8_t* qs = b + 16 + 32 * (s / 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t scale = (sc >> (8 * half)) & 0xff;
      const float dl = d * static_cast<float>(scale & 0xf), ml = dmin * static_cast<float>(scale >> 4);
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        const uint32_t q = ld32(qs + 16 * half + 4 * word);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          w[16 * half + 4 * word + i] = dl * code_to_float((byte_of(q, i) >> shift) & 3) - ml;
      }
    }
  }
};

// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: element e: 2-bit low part as Q2_K, high bit
// hmask[e % 32] bit e / 32 (clear: subtract 4), 6-bit scale (is = e / 16) with low nibble
// scales[is % 8] >> 4 (is / 8) and high bits scales[8 + is % 4] >> 2 (is / 4), less 32.
struct Q3_K : BlocksFromRowStart {
  static constexpr int kBytes = 110, kUnitsPerBlock = 8;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + (u / 8) * kBytes;
    const int s = static_cast<int>(u % 8), shift = 2 * (s % 4);
    const float d = ldf16(b + 108);
    const uint8_t* qs = b + 32 + 32 * (s / 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int is = 2 * s + half;
      const uint32_t low = (ld8(b + 96 + is % 8) >> (4 * (is / 8))) & 0xf;
      const uint32_t high = (ld8(b + 96 + 8 + is % 4) >> (2 * (is / 4))) & 3;
      const float dl = d * static_cast<float>(static_cast<int>(low | (high << 4)) - 32);
#pragma unroll
      for (int word = 0; word < 8; ++word) {
        const int l = 16 * half + 2 * word;
        const uint32_t q = ld16(qs + l), hm = ld16(b + l);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          // q - 4 when the high bit is clear: (q + 4 h) - 4.
          const uint32_t v = ((byte_of(q, i) >> shift) & 3) | (((byte_of(hm, i) >> s) & 1) << 2);
          w[l + i] = dl * code_minus(v, 4.0f);
        }
      }
    }
  }
};

// The 6-bit scale and min of sub-block j of Q4_K / Q5_K (ggml's get_scale_min_k4) from the
// 12 scale bytes as three words.
__device__ __forceinline__ void scale_min_k4(const uint32_t (&s)[3], int j, uint32_t& sc, uint32_t& m) {
  const auto byte = [&](int i) { return byte_of(s[i / 4], i % 4); };
  if (j < 4) {
    sc = byte(j) & 63;
    m = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0xf) | ((byte(j - 4) >> 6) << 4);
    m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}

// Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}: sub-block s (32 elements) is the low (s even) or
// high nibbles of qs[32 (s / 2) .. + 32]; w = d sc q - dmin m.
// Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: fifth bit of element 32 s + l in
// qh[l] bit s.
template <bool kFive>
struct QK45 : BlocksFromRowStart {
  static constexpr int kBytes = kFive ? 176 : 144, kUnitsPerBlock = 8;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + (u / 8) * kBytes;
    const int s = static_cast<int>(u % 8);
    const uint32_t dd = ld32(b);
    const uint32_t scales[3] = {ld32(b + 4), ld32(b + 8), ld32(b + 12)};
    uint32_t sc, mn;
    scale_min_k4(scales, s, sc, mn);
    const float d = f16(dd & 0xffff) * static_cast<float>(sc), m = f16(dd >> 16) * static_cast<float>(mn);
    const uint8_t* qs = b + (kFive ? 48 : 16) + 32 * (s / 2);
    const int nibble = 4 * (s % 2);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 q = ld128(qs + 16 * half);
      uint4 h = {0, 0, 0, 0};
      if constexpr (kFive) h = ld128(b + 16 + 16 * half);
      const uint32_t qw[4] = {q.x, q.y, q.z, q.w}, hw[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
      for (int word = 0; word < 4; ++word)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t v = (byte_of(qw[word], i) >> nibble) & 0xf;
          if constexpr (kFive) v |= ((byte_of(hw[word], i) >> s) & 1) << 4;
          w[16 * half + 4 * word + i] = d * code_to_float(v) - m;
        }
    }
  }
};

// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: element e = 128 n + 32 qd + l: low nibble
// (qd < 2) or high nibble of ql[64 n + 32 (qd % 2) + l], high bits qh[32 n + l] >> 2 qd, scale
// scales[e / 16]; w = d sc (q - 32).
struct Q6_K : BlocksFromRowStart {
  static constexpr int kBytes = 210, kUnitsPerBlock = 8;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + (u / 8) * kBytes;
    const int s = static_cast<int>(u % 8), n = s / 4, qd = s % 4;
    const float d = ldf16(b + 208);
    const uint32_t sc = ld16(b + 192 + 2 * s);
    const float d0 = d * static_cast<float>(static_cast<int8_t>(sc & 0xff));
    const float d1 = d * static_cast<float>(static_cast<int8_t>(sc >> 8));
    const uint8_t* ql = b + 64 * n + 32 * (qd % 2);
    const uint8_t* qh = b + 128 + 32 * n;
    const int nibble = 4 * (qd / 2);
#pragma unroll
    for (int word = 0; word < 16; ++word) {
      const uint32_t lo = ld16(ql + 2 * word), hi = ld16(qh + 2 * word);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int l = 2 * word + i;
        const uint32_t q = ((byte_of(lo, i) >> nibble) & 0xf) | (((byte_of(hi, i) >> (2 * qd)) & 3) << 4);
        w[l] = (l < 16 ? d0 : d1) * code_minus(q, 32.0f);
      }
    }
  }
};

// ---- Inferflow min/max blocks ------------------------------------------------------------------
// Qk_B32 / Qk_B64 {f16 min; f16 scale; codes}: code i of the block is bits [i kBits, (i + 1) kBits)
// of the little-endian bit stream after the 4-byte header; w = min + q scale. A unit's 32 codes
// take kBits 32-bit words (4-byte aligned: blocks are 4 + 4 kBits or 4 + 8 kBits bytes).
template <int kBits, int kBlockElems>
struct QB : BlocksFromRowStart {
  static constexpr int kBytes = 4 + kBlockElems * kBits / 8, kUnitsPerBlock = kBlockElems / 32;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    constexpr int kUnits = kUnitsPerBlock;
    const uint8_t* b = row + (u / kUnits) * kBytes;
    const uint32_t header = ld32(b);
    const float mn = f16(header & 0xffff), scale = f16(header >> 16);
    const uint8_t* codes = b + 4 + (u % kUnits) * 4 * kBits;
    uint32_t words[kBits + 1];
#pragma unroll
    for (int i = 0; i < kBits; ++i) words[i] = ld32(codes + 4 * i);
    words[kBits] = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int bit = i * kBits, word = bit / 32, off = bit % 32;
      uint32_t q = words[word] >> off;
      if (off + kBits > 32) q |= words[word + 1] << (32 - off);
      q &= (1u << kBits) - 1;
      w[i] = __fadd_rn(__fmul_rn(code_to_float(q), scale), mn);
    }
  }
};

// Q3H_B64 {f16 min; f16 scale; 32 codes of 7 bits}: code c = q[2c] * 11 + q[2c + 1] (levels 0..10).
// A unit (half block) is 16 codes, 112 bits from byte 4 + 14 half (2-byte aligned).
struct Q3H_B64 : BlocksFromRowStart {
  static constexpr int kBytes = 32, kUnitsPerBlock = 2;
  __device__ static void unit(const uint8_t* row, int64_t u, const uint8_t*, int64_t, int64_t, float (&w)[32]) {
    const uint8_t* b = row + (u / 2) * kBytes;
    const uint32_t header = ld32(b);
    const float mn = f16(header & 0xffff), scale = f16(header >> 16);
    const uint8_t* codes = b + 4 + 14 * (u % 2);
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 3; ++i) words[i] = ld32_a2(codes + 4 * i);
    words[3] = ld16(codes + 12);
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const int bit = 7 * c, word = bit / 32, off = bit % 32;
      uint32_t code = words[word] >> off;
      if (off + 7 > 32) code |= words[word + 1] << (32 - off);
      code &= 0x7f;
      const uint32_t first = (code * 373) >> 12;  // code / 11 for every 7-bit code
      w[2 * c] = __fadd_rn(__fmul_rn(code_to_float(first), scale), mn);
      w[2 * c + 1] = __fadd_rn(__fmul_rn(code_to_float(code - 11 * first), scale), mn);
    }
  }
};

// ---- FP8 E4M3 weight-only ----------------------------------------------------------------------
// A row is its f32 scales (one, or one per 128 elements), padded to 16 bytes, then k e4m3 bytes.
// Decoding by bits: an e4m3 byte's exponent and mantissa, shifted left 7, are an fp16 whose
// exponent bias is 15 instead of 7 (subnormals included), the sign goes to bit 15; the bias
// difference, 2^8, is folded into the scale, so each weight costs the conversion to fp32 and one
// multiply.
__device__ __forceinline__ float2 e4m3x2_to_half2_floats(uint32_t pair) {  // bytes at bits 0..7, 16..23
  const uint32_t bits = ((pair & 0x007f007fu) << 7) | ((pair & 0x00800080u) << 8);
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

template <bool kGrouped>
struct F8 {
  static constexpr int kBytes = 32, kUnitsPerBlock = 1;
  static constexpr bool kPerGroup = kGrouped;
  __device__ static int64_t data_offset(int64_t k) { return kGrouped ? (4 * (k / 128) + 15) / 16 * 16 : 16; }
  __device__ static void unit(const uint8_t* blocks, int64_t lu, const uint8_t* row, int64_t, int64_t u,
                              float (&w)[32]) {
    const float scale = __ldg(reinterpret_cast<const float*>(row) + (kGrouped ? u / 4 : 0)) * 256.0f;
    const uint8_t* bytes = blocks + 32 * lu;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 q = ld128(bytes + 16 * half);
      const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        const float2 a = e4m3x2_to_half2_floats(__byte_perm(qw[word], 0, 0x4140));
        const float2 c = e4m3x2_to_half2_floats(__byte_perm(qw[word], 0, 0x4342));
        float* out = w + 16 * half + 4 * word;
        out[0] = a.x * scale;
        out[1] = a.y * scale;
        out[2] = c.x * scale;
        out[3] = c.y * scale;
      }
    }
  }
};

// ---- int8 groups (llama2.c's Q8_0): a row is one f32 scale per kGroup elements (padded to 16
// bytes), then k int8 bytes; w = q * scale (one rounding, as quant/int8_groups.cpp).
template <int kGroup>
struct I8 {
  static constexpr int kBytes = 32, kUnitsPerBlock = 1;
  __device__ static int64_t data_offset(int64_t k) { return (4 * (k / kGroup) + 15) / 16 * 16; }
  __device__ static void unit(const uint8_t* blocks, int64_t lu, const uint8_t* row, int64_t, int64_t u,
                              float (&w)[32]) {
    const float scale = __ldg(reinterpret_cast<const float*>(row) + u * 32 / kGroup);
    const uint8_t* bytes = blocks + 32 * lu;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 q = ld128(bytes + 16 * half);
      const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int word = 0; word < 4; ++word)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          w[16 * half + 4 * word + i] = signed_byte_to_float(qw[word], i) * scale;
    }
  }
};

// Unit u of a row in global memory (dequantize.cu; the GEMVs stage chunks of rows in shared memory).
template <typename Dec>
__device__ __forceinline__ void decode_unit(const uint8_t* row, int64_t k, int64_t u, float (&w)[32]) {
  Dec::unit(row + Dec::data_offset(k), u, row, k, u, w);
}

// f(Decoder{}) for a quantized dtype; returns false for any other dtype. Host code uses it to pick
// a kernel instantiation, device code to pick the decoder of a row's run.
#pragma nv_exec_check_disable
template <typename F>
__host__ __device__ __forceinline__ bool with_decoder(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Q4_0: f(Q4_0{}); return true;
    case DType::Q4_1: f(Q4_1{}); return true;
    case DType::Q5_0: f(Q5<false>{}); return true;
    case DType::Q5_1: f(Q5<true>{}); return true;
    case DType::Q8_0: f(Q8_0{}); return true;
    case DType::Q2_K: f(Q2_K{}); return true;
    case DType::Q3_K: f(Q3_K{}); return true;
    case DType::Q4_K: f(QK45<false>{}); return true;
    case DType::Q5_K: f(QK45<true>{}); return true;
    case DType::Q6_K: f(Q6_K{}); return true;
    case DType::Q2_B32: f(QB<2, 32>{}); return true;
    case DType::Q3_B32: f(QB<3, 32>{}); return true;
    case DType::Q4_B32: f(QB<4, 32>{}); return true;
    case DType::Q5_B32: f(QB<5, 32>{}); return true;
    case DType::Q6_B32: f(QB<6, 32>{}); return true;
    case DType::Q8_B32: f(QB<8, 32>{}); return true;
    case DType::Q2_B64: f(QB<2, 64>{}); return true;
    case DType::Q3_B64: f(QB<3, 64>{}); return true;
    case DType::Q4_B64: f(QB<4, 64>{}); return true;
    case DType::Q5_B64: f(QB<5, 64>{}); return true;
    case DType::Q6_B64: f(QB<6, 64>{}); return true;
    case DType::Q8_B64: f(QB<8, 64>{}); return true;
    case DType::Q3H_B64: f(Q3H_B64{}); return true;
    case DType::F8_CHANNEL: f(F8<false>{}); return true;
    case DType::F8_G128: f(F8<true>{}); return true;
    case DType::I8_G32: f(I8<32>{}); return true;
    case DType::I8_G64: f(I8<64>{}); return true;
    case DType::I8_G128: f(I8<128>{}); return true;
    default: return false;
  }
}

}  // namespace splitflow::cuda::quant_decode
