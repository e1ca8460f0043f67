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

}  // namespace splitflow::cpu::q8_blocks
#endif
