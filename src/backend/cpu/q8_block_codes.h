// backend/cpu/q8_block_codes.h — the integer kernels' view of GGUF's 32-element block types
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), shared by the decode GEMV (q8_activations.cpp) and the prefill
// GEMM (q8_gemm.cpp): where each block keeps its scale, minimum, fifth bits and codes, and the codes
// as unsigned bytes for VNNI's unsigned x signed dot product (Q8_0's biased by 128). A weight is
// d * (code + kCorrection) (+ m for the types with a minimum).
// Must never: be included without SPLITFLOW_CPU_AVX512_VNNI (simd.h), or allocate.
#pragma once

#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/simd.h"
#include "core/dtype.h"

#include <cstdint>
#include <cstring>

#ifdef SPLITFLOW_CPU_AVX512_VNNI
namespace splitflow::cpu::q8_blocks {

using quant_blocks::u16_at;
using quant_blocks::u32_at;

// One 32-element block of x as Q8 activations (q8_activations.h's rule: d = max |x| / 127, codes
// rounded to nearest even, as nearbyint in quantize_q8_blocks): its codes in element order and
// its scale d.
struct Q8Block {
  __m256i codes;
  float d;
};
inline Q8Block quantize_block32(const float* x) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
  const float d = amax / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
  const __m512 inv = _mm512_set1_ps(inverse);
  // cvtps rounds to nearest even (the MXCSR default).
  const __m128i q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)));
  const __m128i q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)));
  return {_mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1), d};
}

// The sums of each 4 consecutive codes (8 int32 lanes), by VNNI against ones.
inline __m256i quad_sums(__m256i codes) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), codes);
}

// Block layouts (ggml-common.h): scale d (f16) first; Q4_1/Q5_1 then the minimum m (f16); Q5 a
// 32-bit mask of fifth bits; then the codes. kCorrection: the code's zero point, times -1.
template <DType T>
struct Layout;
template <> struct Layout<DType::Q4_0> { static constexpr int kBytes = 18, kHigh = -1, kCodes = 2, kCorrection = -8; static constexpr bool kMin = false; };
template <> struct Layout<DType::Q4_1> { static constexpr int kBytes = 20, kHigh = -1, kCodes = 4, kCorrection = 0; static constexpr bool kMin = true; };
template <> struct Layout<DType::Q5_0> { static constexpr int kBytes = 22, kHigh = 2, kCodes = 6, kCorrection = -16; static constexpr bool kMin = false; };
template <> struct Layout<DType::Q5_1> { static constexpr int kBytes = 24, kHigh = 4, kCodes = 8, kCorrection = 0; static constexpr bool kMin = true; };
template <> struct Layout<DType::Q8_0> { static constexpr int kBytes = 34, kHigh = -1, kCodes = 2, kCorrection = -128; static constexpr bool kMin = false; };

// One block's codes as 32 unsigned bytes in element order.
template <DType T>
inline __m256i block_codes(const uint8_t* blk) {
  using L = Layout<T>;
  if constexpr (T == DType::Q8_0) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + L::kCodes)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L::kCodes));
    __m256i codes = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(qs), _mm_srli_epi16(qs, 4), 1),
                                     _mm256_set1_epi8(0x0F));
    if constexpr (L::kHigh >= 0)
      codes = _mm256_or_si256(codes, _mm256_maskz_mov_epi8(u32_at(blk + L::kHigh), _mm256_set1_epi8(0x10)));
    return codes;
  }
}

// ---- K-quants Q2_K, Q3_K, Q5_K (256-element super-blocks; ggml-common.h) -------------------------
// Q4_K and Q6_K have their own decoders in each kernel file. Here a super-block gives, per
// sub-block s of kSub elements, scale[s] and (kOffset) offset[s], and its codes 64 elements at a
// time (group t < 4: elements 64t .. 64t + 63, as two halves of 32 unsigned bytes), so that
// w = scale[s] * (code + kCorrection) + offset[s].
template <DType T>
struct KQuant;
template <> struct KQuant<DType::Q2_K> { static constexpr int kBytes = 84, kSub = 16, kCorrection = 0; static constexpr bool kOffset = true; };
template <> struct KQuant<DType::Q3_K> { static constexpr int kBytes = 110, kSub = 16, kCorrection = -4; static constexpr bool kOffset = false; };
template <> struct KQuant<DType::Q5_K> { static constexpr int kBytes = 176, kSub = 32, kCorrection = 0; static constexpr bool kOffset = true; };

constexpr bool is_k_quant(DType type) {
  return type == DType::Q2_K || type == DType::Q3_K || type == DType::Q4_K || type == DType::Q5_K ||
         type == DType::Q6_K;
}

// Bit `bit` of each byte, moved to bit `to` (< 8; 16-bit shifts keep it in its byte).
inline __m256i byte_bit(__m256i bytes, int bit, int to) {
  const __m256i one = _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(bit)), _mm256_set1_epi8(1));
  return _mm256_sll_epi16(one, _mm_cvtsi32_si128(to));
}
// Bits shift, shift + 1 of each byte (Q2_K / Q3_K's 2-bit planes).
inline __m256i byte_pair(__m256i bytes, int shift) {
  return _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));
}
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Q2_K (scales[16]: low nibble scale, high nibble min; qs[64]; d; dmin) and Q3_K (hmask[32]; qs[64];
// scales[12]: 16 x 6 bits biased by 32; d): element 128h + 32j + l is bits 2j of qs[32h + l] (and
// Q3_K's third bit is bit 4h + j of hmask[l], clear meaning -4); sub-block e / 16. Q5_K (d; dmin;
// scales[12] as Q4_K's; qh[32]; qs[128]): element 64t + l is the low nibble of qs[32t + l] with
// bit 2t of qh[l] as its fifth bit, 64t + 32 + l the high nibble with bit 2t + 1; sub-block e / 32.
template <DType T>
inline void k_codes(const uint8_t* blk, int t, __m256i& low, __m256i& high) {
  if constexpr (T == DType::Q5_K) {
    const __m256i q = load256(blk + 48 + 32 * t), qh = load256(blk + 16), low4 = _mm256_set1_epi8(0x0F);
    low = _mm256_or_si256(_mm256_and_si256(q, low4), byte_bit(qh, 2 * t, 4));
    high = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4), byte_bit(qh, 2 * t + 1, 4));
  } else {
    const int h = t / 2, j = 2 * (t % 2);
    const __m256i q = load256(blk + (T == DType::Q2_K ? 16 : 32) + 32 * h);
    low = byte_pair(q, 2 * j);
    high = byte_pair(q, 2 * j + 2);
    if constexpr (T == DType::Q3_K) {
      const __m256i hmask = load256(blk);
      low = _mm256_or_si256(low, byte_bit(hmask, 4 * h + j, 2));
      high = _mm256_or_si256(high, byte_bit(hmask, 4 * h + j + 1, 2));
    }
  }
}

// Q4_K / Q5_K's 8 scales and 8 mins (12 bytes at blk + 4, 6 bits each; ggml's kmask unpacking in
// 32-bit words) as one vector: lane s is d * sc_s, lane 8 + s is -dmin * m_s.
inline __m512 k4_scale_table(const uint8_t* blk) {
  uint32_t u[4];
  std::memcpy(u, blk + 4, 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);  // m4 .. m7
  const uint32_t mins_low = u[1] & kLow6;                       // m0 .. m3
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);         // sc4 .. sc7
  u[2] = mins_low;
  u[0] &= kLow6;                                                // sc0 .. sc3
  const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u))));
  const float d = _cvtsh_ss(u16_at(blk)), dmin = -_cvtsh_ss(u16_at(blk + 2));
  return _mm512_mul_ps(values, _mm512_setr_ps(d, d, d, d, d, d, d, d, dmin, dmin, dmin, dmin, dmin, dmin, dmin, dmin));
}

// The sub-blocks' scales and offsets: kSub 16 (Q2_K, Q3_K): lane s of each; kSub 32 (Q5_K): both
// in k4_scale_table's vector (scale s in lane s, offset s in lane 8 + s).
struct KScales {
  __m512 scale, offset;
};
template <DType T>
inline KScales k_scales(const uint8_t* blk) {
  if constexpr (T == DType::Q2_K) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    const float d = _cvtsh_ss(u16_at(blk + 80)), dmin = _cvtsh_ss(u16_at(blk + 82));
    const __m512 scale = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0xF)));
    const __m512 min = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
    return {_mm512_mul_ps(scale, _mm512_set1_ps(d)), _mm512_mul_ps(min, _mm512_set1_ps(-dmin))};
  } else if constexpr (T == DType::Q3_K) {
    int8_t biased[16];
    quant_blocks::Codec<DType::Q3_K>::unpack_scales(blk, biased);
    const __m512i values = _mm512_sub_epi32(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(biased))), _mm512_set1_epi32(32));
    return {_mm512_mul_ps(_mm512_cvtepi32_ps(values), _mm512_set1_ps(_cvtsh_ss(u16_at(blk + 108)))),
            _mm512_setzero_ps()};
  } else {
    const __m512 table = k4_scale_table(blk);
    return {table, table};
  }
}

}  // namespace splitflow::cpu::q8_blocks
#endif
