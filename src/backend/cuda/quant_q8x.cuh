// backend/cuda/quant_q8x.cuh — the decode GEMVs' dot over int8 activations (as llama.cpp's mmvq and
// this project's CPU backend run quantized weights): each block of the GEMV quantizes x once into
// shared memory (32-element blocks, d = max |x| / 127, codes rounded to nearest even: the CPU's
// rule, backend/cpu/q8_block_codes.h), with the input norm's weight applied first; then each lane
// turns a 32-element unit of its staged weight row into eight words of four integer codes and
// multiplies them with x's codes by dp4a, four products an instruction. Per weight that is about
// one instruction instead of the fp32 path's five to nine (decode to fp32, unpack bf16 x, fma), which
// made the quantized GEMVs issue-bound below bf16's speed (docs/quantization.md). The result of a
// unit: dx * sum_h scale_h * (sum q x - offset * sum x) (+ min_h * dx * sum x_h), in fp32.
//
// A Q8 decoder (struct ...x below) is its quant_decode.cuh block decoder (kBytes, kUnitsPerBlock,
// data_offset: the staging is the same) plus
//   codes(blocks, lu, row, k, u, q, scale, min)
// q[j] the codes of elements 4j .. 4j + 3 as bytes (unsigned unless kSigned), scale[h] / min[h]
// those of the unit's half h (kHalves 1: one for the 32), kCodeOffset the integer each code is less
// (Q4_0's 8). Every integer-code type has one; FP8 has its own dot (quant_f8x.cuh). The same unit
// quantizer feeds the int8 tensor-core GEMM (quant_gemm_q8.cu).
#pragma once

#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_staging.cuh"

#include <cstdint>

namespace splitflow::cuda::quant_q8x {

using namespace quant_decode;

// n words from a 2-byte aligned address, by aligned 4-byte loads and funnel shifts (the word after
// the last may be read: shared memory has padding behind the stages).
template <int N>
__device__ __forceinline__ void words_a2(const uint8_t* p, uint32_t (&out)[N]) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(at & ~uintptr_t{3});
  const uint32_t shift = static_cast<uint32_t>(at & 2) * 8;
  uint32_t w[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) w[i] = base[i];
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], shift);
}

// Bits 0..3 of v to bit 4 of bytes 0..3.
__device__ __forceinline__ uint32_t spread4_to_bit4(uint32_t v) { return ((v & 0xf) * 0x00204081u & 0x01010101u) << 4; }

constexpr uint32_t kNibbles = 0x0f0f0f0fu;

struct Q4_0x : Q4_0 {
  static constexpr int kHalves = 1, kCodeOffset = 8;
  static constexpr bool kSigned = false, kMin = false;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&)[2]) {
    const uint8_t* b = blocks + lu * kBytes;
    uint32_t w[5];
    words_a2(b, w);  // d, then the 16 code bytes from byte 2
    scale[0] = f16(w[0] & 0xffff);
    uint32_t qs[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) qs[i] = __funnelshift_r(w[i], w[i + 1], 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = qs[i] & kNibbles;
      q[4 + i] = (qs[i] >> 4) & kNibbles;
    }
  }
};

struct Q4_1x : Q4_1 {
  static constexpr int kHalves = 1, kCodeOffset = 0;
  static constexpr bool kSigned = false, kMin = true;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&min)[2]) {
    const uint8_t* b = blocks + lu * kBytes;  // 20-byte blocks: 4-byte aligned
    const uint32_t dm = ld32(b);
    scale[0] = f16(dm & 0xffff);
    min[0] = f16(dm >> 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t qs = ld32(b + 4 + 4 * i);
      q[i] = qs & kNibbles;
      q[4 + i] = (qs >> 4) & kNibbles;
    }
  }
};

template <bool kWithMin>
struct Q5x : Q5<kWithMin> {
  static constexpr int kBytes = Q5<kWithMin>::kBytes;
  static constexpr int kHalves = 1, kCodeOffset = kWithMin ? 0 : 16;
  static constexpr bool kSigned = false, kMin = kWithMin;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&min)[2]) {
    const uint8_t* b = blocks + lu * kBytes;
    uint32_t w[5];  // qh, then the 16 code bytes
    if constexpr (kWithMin) {
      const uint32_t dm = ld32(b);  // 24-byte blocks: 4-byte aligned
      scale[0] = f16(dm & 0xffff);
      min[0] = f16(dm >> 16);
#pragma unroll
      for (int i = 0; i < 5; ++i) w[i] = ld32(b + 4 + 4 * i);
    } else {
      scale[0] = ldf16(b);
      words_a2(b + 2, w);
    }
    const uint32_t qh = w[0];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = (w[1 + i] & kNibbles) | spread4_to_bit4(qh >> (4 * i));
      q[4 + i] = ((w[1 + i] >> 4) & kNibbles) | spread4_to_bit4(qh >> (16 + 4 * i));
    }
  }
};

struct Q8_0x : Q8_0 {
  static constexpr int kHalves = 1, kCodeOffset = 0;
  static constexpr bool kSigned = true, kMin = false;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&)[2]) {
    const uint8_t* b = blocks + lu * kBytes;
    scale[0] = ldf16(b);
    words_a2(b + 2, q);
  }
};

// Q2_K: unit s = u % 8 is the 2-bit field 2 (s % 4) of qs[32 (s / 4) ..]; halves have their own
// 4-bit scale and min.
struct Q2_Kx : Q2_K {
  static constexpr int kHalves = 2, kCodeOffset = 0;
  static constexpr bool kSigned = false, kMin = true;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&min)[2]) {
    const uint8_t* b = blocks + (lu / 8) * kBytes;
    const int s = static_cast<int>(lu % 8), shift = 2 * (s % 4);
    const uint32_t dd = ld32(b + 80), sc = ld16(b + 2 * s);
    const float d = f16(dd & 0xffff), dmin = f16(dd >> 16);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t byte = (sc >> (8 * h)) & 0xff;
      scale[h] = d * static_cast<float>(byte & 0xf);
      min[h] = -dmin * static_cast<float>(byte >> 4);
    }
    const uint8_t* qs = b + 16 + 32 * (s / 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = (ld32(qs + 4 * j) >> shift) & 0x03030303u;
  }
};

// Q3_K: Q2_K's 2-bit fields plus hmask bit s (clear: the code is 4 less), 6-bit signed scales.
struct Q3_Kx : Q3_K {
  static constexpr int kHalves = 2, kCodeOffset = 4;
  static constexpr bool kSigned = false, kMin = false;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&)[2]) {
    const uint8_t* b = blocks + (lu / 8) * kBytes;
    const int s = static_cast<int>(lu % 8), shift = 2 * (s % 4);
    const float d = ldf16(b + 108);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int is = 2 * s + h;
      const uint32_t low = (ld8(b + 96 + is % 8) >> (4 * (is / 8))) & 0xf;
      const uint32_t high = (ld8(b + 96 + 8 + is % 4) >> (2 * (is / 4))) & 3;
      scale[h] = d * static_cast<float>(static_cast<int>(low | (high << 4)) - 32);
    }
    uint32_t qs[8], hm[8];
    words_a2(b + 32 + 32 * (s / 4), qs);
    words_a2(b, hm);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = ((qs[j] >> shift) & 0x03030303u) | (((hm[j] >> s) & 0x01010101u) << 2);
  }
};

// Q4_K / Q5_K: unit s is the low (s even) or high nibbles of qs[32 (s / 2) ..] (Q5_K: bit s of
// qh[l] fifth); w = d sc q - dmin m.
template <bool kFive>
struct QK45x : QK45<kFive> {
  static constexpr int kBytes = QK45<kFive>::kBytes;
  static constexpr int kHalves = 1, kCodeOffset = 0;
  static constexpr bool kSigned = false, kMin = true;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&min)[2]) {
    const uint8_t* b = blocks + (lu / 8) * kBytes;  // 16-byte aligned super-blocks
    const int s = static_cast<int>(lu % 8), nibble = 4 * (s % 2);
    const uint4 head = ld128(b);
    const uint32_t scales[3] = {head.y, head.z, head.w};
    uint32_t sc, mn;
    scale_min_k4(scales, s, sc, mn);
    scale[0] = f16(head.x & 0xffff) * static_cast<float>(sc);
    min[0] = -f16(head.x >> 16) * static_cast<float>(mn);
    const uint8_t* qs = b + (kFive ? 48 : 16) + 32 * (s / 2);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 c = ld128(qs + 16 * half);
      const uint32_t cw[4] = {c.x, c.y, c.z, c.w};
      uint32_t hw[4] = {0, 0, 0, 0};
      if constexpr (kFive) {
        const uint4 h = ld128(b + 16 + 16 * half);
        hw[0] = h.x, hw[1] = h.y, hw[2] = h.z, hw[3] = h.w;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        q[4 * half + j] = (cw[j] >> nibble) & kNibbles;
        if constexpr (kFive) q[4 * half + j] |= ((hw[j] >> s) & 0x01010101u) << 4;
      }
    }
  }
};

// Q6_K: unit s = 4 n + qd: nibble qd / 2 of ql[64 n + 32 (qd % 2) ..], bits 2 qd of qh[32 n ..],
// int8 scales per half; w = d sc (q - 32).
struct Q6_Kx : Q6_K {
  static constexpr int kHalves = 2, kCodeOffset = 32;
  static constexpr bool kSigned = false, kMin = false;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&)[2]) {
    const uint8_t* b = blocks + (lu / 8) * kBytes;
    const int s = static_cast<int>(lu % 8), n = s / 4, qd = s % 4;
    const float d = ldf16(b + 208);
    const uint32_t sc = ld16(b + 192 + 2 * s);
    scale[0] = d * static_cast<float>(static_cast<int8_t>(sc & 0xff));
    scale[1] = d * static_cast<float>(static_cast<int8_t>(sc >> 8));
    uint32_t ql[8], qh[8];
    words_a2(b + 64 * n + 32 * (qd % 2), ql);
    words_a2(b + 128 + 32 * n, qh);
    const int nibble = 4 * (qd / 2);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = ((ql[j] >> nibble) & kNibbles) | (((qh[j] >> (2 * qd)) & 0x03030303u) << 4);
  }
};

// Inferflow min/max blocks: w = min + q scale; a unit's codes are kBits 32-bit words after the
// 4-byte header (4-byte aligned): 8-bit codes as they are, 4-bit ones alternate low and high
// nibbles, other widths are a little-endian bit stream (code i at bits [i kBits, (i + 1) kBits)).
template <int kBits, int kBlockElems>
struct QBx : QB<kBits, kBlockElems> {
  static constexpr int kBytes = QB<kBits, kBlockElems>::kBytes, kUnitsPerBlock = kBlockElems / 32;
  static constexpr int kHalves = 1, kCodeOffset = 0;
  static constexpr bool kSigned = false, kMin = true;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&min)[2]) {
    const uint8_t* b = blocks + (lu / kUnitsPerBlock) * kBytes;
    const uint32_t header = ld32(b);
    min[0] = f16(header & 0xffff);
    scale[0] = f16(header >> 16);
    const uint8_t* c = b + 4 + (lu % kUnitsPerBlock) * 4 * kBits;
    if constexpr (kBits == 8) {
#pragma unroll
      for (int j = 0; j < 8; ++j) q[j] = ld32(c + 4 * j);
    } else if constexpr (kBits == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t word = ld32(c + 4 * i), lo = word & kNibbles, hi = (word >> 4) & kNibbles;
        q[2 * i] = __byte_perm(lo, hi, 0x5140);
        q[2 * i + 1] = __byte_perm(lo, hi, 0x7362);
      }
    } else {
      uint32_t words[kBits + 1];
#pragma unroll
      for (int i = 0; i < kBits; ++i) words[i] = ld32(c + 4 * i);
      words[kBits] = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t packed = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int bit = (4 * j + e) * kBits, word = bit / 32, off = bit % 32;
          uint32_t v = words[word] >> off;
          if (off + kBits > 32) v |= words[word + 1] << (32 - off);
          packed |= (v & ((1u << kBits) - 1)) << (8 * e);
        }
        q[j] = packed;
      }
    }
  }
};

// Q3H_B64: a unit (half block) is 16 7-bit codes c = q1 * 11 + q2 from byte 4 + 14 half (2-byte
// aligned); elements 2c' and 2c' + 1 of code c' are q1 and q2 (levels 0..10); w = min + q scale.
struct Q3Hx : Q3H_B64 {
  static constexpr int kHalves = 1, kCodeOffset = 0;
  static constexpr bool kSigned = false, kMin = true;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t*, int64_t, int64_t, uint32_t (&q)[8],
                               float (&scale)[2], float (&min)[2]) {
    const uint8_t* b = blocks + (lu / 2) * kBytes;
    const uint32_t header = ld32(b);
    min[0] = f16(header & 0xffff);
    scale[0] = f16(header >> 16);
    const uint8_t* codes_at = b + 4 + 14 * (lu % 2);
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 3; ++i) words[i] = ld32_a2(codes_at + 4 * i);
    words[3] = ld16(codes_at + 12);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t packed = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int bit = 7 * (2 * j + h), word = bit / 32, off = bit % 32;
        uint32_t code = words[word] >> off;
        if (off + 7 > 32) code |= words[word + 1] << (32 - off);
        code &= 0x7f;
        const uint32_t first = (code * 373) >> 12;  // code / 11 for every 7-bit code
        packed |= (first | ((code - 11 * first) << 8)) << (16 * h);
      }
      q[j] = packed;
    }
  }
};

// llama2.c's int8 groups: the codes as they are, the group's f32 scale from the row's header.
template <int kGroup>
struct I8x : I8<kGroup> {
  static constexpr int kHalves = 1, kCodeOffset = 0;
  static constexpr bool kSigned = true, kMin = false;
  __device__ static void codes(const uint8_t* blocks, int64_t lu, const uint8_t* row, int64_t, int64_t u,
                               uint32_t (&q)[8], float (&scale)[2], float (&)[2]) {
    scale[0] = __ldg(reinterpret_cast<const float*>(row) + u * 32 / kGroup);
    const uint8_t* bytes = blocks + 32 * lu;
    const uint4 a = ld128(bytes), c = ld128(bytes + 16);
    q[0] = a.x, q[1] = a.y, q[2] = a.z, q[3] = a.w, q[4] = c.x, q[5] = c.y, q[6] = c.z, q[7] = c.w;
  }
};

// f(Q8 decoder{}) for the dtypes with one; false for the rest.
template <typename F>
__host__ __device__ __forceinline__ bool with_q8_decoder(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Q4_0: f(Q4_0x{}); return true;
    case DType::Q4_1: f(Q4_1x{}); return true;
    case DType::Q5_0: f(Q5x<false>{}); return true;
    case DType::Q5_1: f(Q5x<true>{}); return true;
    case DType::Q8_0: f(Q8_0x{}); return true;
    case DType::Q2_K: f(Q2_Kx{}); return true;
    case DType::Q3_K: f(Q3_Kx{}); return true;
    case DType::Q4_K: f(QK45x<false>{}); return true;
    case DType::Q5_K: f(QK45x<true>{}); return true;
    case DType::Q6_K: f(Q6_Kx{}); return true;
    case DType::Q2_B32: f(QBx<2, 32>{}); return true;
    case DType::Q3_B32: f(QBx<3, 32>{}); return true;
    case DType::Q4_B32: f(QBx<4, 32>{}); return true;
    case DType::Q5_B32: f(QBx<5, 32>{}); return true;
    case DType::Q6_B32: f(QBx<6, 32>{}); return true;
    case DType::Q8_B32: f(QBx<8, 32>{}); return true;
    case DType::Q2_B64: f(QBx<2, 64>{}); return true;
    case DType::Q3_B64: f(QBx<3, 64>{}); return true;
    case DType::Q4_B64: f(QBx<4, 64>{}); return true;
    case DType::Q5_B64: f(QBx<5, 64>{}); return true;
    case DType::Q6_B64: f(QBx<6, 64>{}); return true;
    case DType::Q8_B64: f(QBx<8, 64>{}); return true;
    case DType::Q3H_B64: f(Q3Hx{}); return true;
    case DType::I8_G32: f(I8x<32>{}); return true;
    case DType::I8_G64: f(I8x<64>{}); return true;
    case DType::I8_G128: f(I8x<128>{}); return true;
    default: return false;
  }
}

// ---- x as int8 codes in shared memory ------------------------------------------------------------
// Per row of x (rounded up to 16 bytes): k code bytes, then per 32-element unit an int2 {d as bits, sum of codes 0..15 in the
// low 16 bits and of 16..31 in the high 16 (signed)}.
__host__ __device__ constexpr int64_t x_row_bytes(int64_t k) { return (k + k / 32 * 8 + 15) / 16 * 16; }

__device__ __forceinline__ int dot4(uint32_t w, uint32_t x, int acc, bool signed_w) {
  int out;
  if (signed_w) {
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(out) : "r"(w), "r"(x), "r"(acc));
  } else {
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(out) : "r"(w), "r"(x), "r"(acc));
  }
  return out;
}

// Four fp32 values to four int8 codes (round to nearest even) in one word.
__device__ __forceinline__ uint32_t pack_codes(float a, float b, float c, float d) {
  const uint32_t lo = __byte_perm(__float2int_rn(a), __float2int_rn(b), 0x0040);
  const uint32_t hi = __byte_perm(__float2int_rn(c), __float2int_rn(d), 0x0040);
  return __byte_perm(lo, hi, 0x5410);
}

// One 32-element unit of x (max |v| = amax) as codes (out[0..1]: 32 bytes; swapped: elements
// 16..31 first) and its info (d as bits; the code sums of elements 0..15 and 16..31 as two int16).
__device__ __forceinline__ void quantize_unit(const float (&v)[32], float amax, uint4* out, int2& info,
                                              bool swapped = false) {
  const float d = amax / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
  uint32_t q[8];
#pragma unroll
  for (int j = 0; j < 8; ++j)
    q[j] = pack_codes(v[4 * j] * inverse, v[4 * j + 1] * inverse, v[4 * j + 2] * inverse, v[4 * j + 3] * inverse);
  int sums[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) sums[j / 4] = dot4(0x01010101u, q[j], sums[j / 4], true);
  out[swapped ? 1 : 0] = make_uint4(q[0], q[1], q[2], q[3]);
  out[swapped ? 0 : 1] = make_uint4(q[4], q[5], q[6], q[7]);
  info = make_int2(__float_as_int(d), static_cast<int>((sums[0] & 0xffff) | (static_cast<uint32_t>(sums[1]) << 16)));
}

}  // namespace splitflow::cuda::quant_q8x

namespace splitflow::cuda::quant_gemv_detail {

// The dot of a warp's tasks (R weight rows each) with M rows of x quantized to int8 (see the top
// of this file); FloatDot's interface (quant_gemv.cuh). stream()'s prologue, run by every thread
// while the first weight chunks are in flight, quantizes x into shared memory and syncs the block.
// Shared memory: M rows of x (x_row_bytes), the M inverse rms, the warps' stages, 16 bytes of
// padding (words_a2 may read one word past a stage).
template <typename Dec, int M_, int R_>
struct Q8Dot {
  static constexpr int M = M_, R = R_;
  static constexpr int kWarps = quant_gemv_detail::kWarps<Dec, R>;
  static constexpr int kMinBlocks = quant_gemv_detail::kMinBlocks<R, M>;
  static constexpr int kInvRmsBytes = (4 * M + 15) / 16 * 16;  // the M inverse rms after x
  __host__ __device__ static constexpr int64_t x_bytes(int64_t k) { return M * quant_q8x::x_row_bytes(k); }
  __host__ __device__ static constexpr int64_t shared_bytes(int64_t k) {
    return x_bytes(k) + kInvRmsBytes + kWarps * static_cast<int64_t>(sizeof(StageBuffers<Dec, R>)) + 16;
  }

  XOperand x;
  bool want_rms;
  uint8_t* shared;
  float* inv_rms_at;
  StageBuffers<Dec, R>* stages;

  __device__ Q8Dot(uint8_t* shared_memory, const XOperand& x_operand, bool rms)
      : x(x_operand), want_rms(rms), shared(shared_memory),
        inv_rms_at(reinterpret_cast<float*>(shared_memory + x_bytes(x_operand.k))),
        stages(reinterpret_cast<StageBuffers<Dec, R>*>(shared_memory + x_bytes(x_operand.k) + kInvRmsBytes)) {}

  // Units 4..7 of every 8 store their two 16-byte halves swapped: lanes read consecutive units, and
  // a quarter-warp's 16-byte loads at a 32-byte stride would otherwise meet two to a bank.
  __device__ static bool swapped_unit(int64_t u) { return (u >> 2) & 1; }

  // Every thread: x's rows as codes, d and half sums per unit; inv_rms_at[r] (1 without the norm).
  __device__ void quantize_x() {
    const int64_t k = x.k;
    convert_x_rows<M>(x, want_rms, inv_rms_at, [&](int r, int64_t u, const float(&v)[32], float amax) {
      uint8_t* codes = shared + r * quant_q8x::x_row_bytes(k);
      quant_q8x::quantize_unit(v, amax, reinterpret_cast<uint4*>(codes + 32 * u), reinterpret_cast<int2*>(codes + k)[u],
                               swapped_unit(u));
    });
  }

  template <typename RowsOf, typename End>
  __device__ void stream(const QuantRun& w, int64_t tasks, RowsOf&& rows_of, End&& end) {
    using namespace quant_q8x;
    const int64_t k = x.k;
    const uint8_t* x_shared = shared;
    float acc[R][M] = {};
    const auto unit = [&](int lu, int64_t u, auto& staged, auto& row_at) {
      uint32_t q[R][8];
      float scale[R][2], min[R][2];
#pragma unroll
      for (int i = 0; i < R; ++i) Dec::codes(staged[i], lu, row_at[i], k, u, q[i], scale[i], min[i]);
#pragma unroll
      for (int r = 0; r < M; ++r) {
        const uint8_t* codes = x_shared + r * x_row_bytes(k);
        const bool swapped = swapped_unit(u);
        const uint4 a = reinterpret_cast<const uint4*>(codes + 32 * u)[swapped ? 1 : 0];
        const uint4 b = reinterpret_cast<const uint4*>(codes + 32 * u)[swapped ? 0 : 1];
        const int2 info = reinterpret_cast<const int2*>(codes + k)[u];
        const uint32_t xq[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const int sums[2] = {static_cast<int16_t>(info.y & 0xffff), info.y >> 16};
        const float dx = __int_as_float(info.x);
#pragma unroll
        for (int i = 0; i < R; ++i) {
          float t = 0.0f;
#pragma unroll
          for (int h = 0; h < Dec::kHalves; ++h) {
            constexpr int kWords = 8 / Dec::kHalves;
            int dot = 0;
#pragma unroll
            for (int j = 0; j < kWords; ++j) dot = dot4(q[i][kWords * h + j], xq[kWords * h + j], dot, Dec::kSigned);
            const int sum = Dec::kHalves == 1 ? sums[0] + sums[1] : sums[h];
            t = fmaf(scale[i][h], static_cast<float>(dot - Dec::kCodeOffset * sum), t);
            if constexpr (Dec::kMin) t = fmaf(min[i][h], static_cast<float>(sum), t);
          }
          acc[i][r] = fmaf(dx, t, acc[i][r]);
        }
      }
    };
    stream_tasks<Dec, R>(w, k, stages[threadIdx.x / 32], tasks, rows_of, [&] { quantize_x(); }, unit,
                         [&](int64_t task) { end_task(acc, inv_rms_at, task, end); });
  }
};

}  // namespace splitflow::cuda::quant_gemv_detail
