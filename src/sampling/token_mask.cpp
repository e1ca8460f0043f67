#include "sampling/token_mask.h"

#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace splitflow {

void mask_logits_row(float* logits, const uint32_t* allowed, int64_t count) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  int64_t t = 0;
#if defined(__AVX512F__)
  const __m512 minus_inf = _mm512_set1_ps(kMinusInf);
  for (; t + 32 <= count; t += 32) {
    const uint32_t word = allowed[t / 32];
    if (word == 0xffffffffu) continue;
    _mm512_mask_storeu_ps(logits + t, static_cast<__mmask16>(~word & 0xffffu), minus_inf);
    _mm512_mask_storeu_ps(logits + t + 16, static_cast<__mmask16>(~word >> 16), minus_inf);
  }
#endif
  for (; t < count; ++t)
    if (!((allowed[t / 32] >> (t % 32)) & 1u)) logits[t] = kMinusInf;
}

}  // namespace splitflow
