// backend/cpu/simd.h — the CPU kernels' vector building blocks: 8-lane fp32 loads from F32, F16
// (F16C) and BF16 memory, and reductions. AVX2 + FMA when the compiler targets them (-march), a
// scalar fallback otherwise; kernels are written once over these helpers. Where the target also
// has AVX-512 (F, BW, VL) the weight-streaming and GEMM kernels use 16-lane versions (load16),
// and with AVX-512 VNNI the integer dot products of quant_matmul.cpp.
#pragma once

#include "core/dtype.h"

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SPLITFLOW_CPU_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define SPLITFLOW_CPU_AVX512 1
#endif
#if defined(SPLITFLOW_CPU_AVX512) && defined(__AVX512VNNI__)
#define SPLITFLOW_CPU_AVX512_VNNI 1
#endif
#endif

#if defined(SPLITFLOW_CPU_AVX512) && defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers pass undefined vectors as the unused merge source of masked builtins,
// which -Wuninitialized reports in every caller (GCC PR 105593): off for every kernel file that
// includes this header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace splitflow::cpu {

// Below this many multiply-adds (or element updates) a kernel runs on one thread: waking the
// team costs microseconds, more than small models' whole kernels (stories260K: 64-wide layers).
constexpr int64_t kMinParallelWork = 1 << 15;

// Storage types of matrix elements; weight kernels are templated on them.
struct F16Bits { uint16_t bits; };
struct BF16Bits { uint16_t bits; };

inline float to_f32(float value) { return value; }
inline float to_f32(F16Bits value) { return f16_to_f32(value.bits); }
inline float to_f32(BF16Bits value) { return bf16_to_f32(value.bits); }

#ifdef SPLITFLOW_CPU_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const F16Bits* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const BF16Bits* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

#ifdef SPLITFLOW_CPU_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const F16Bits* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const BF16Bits* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#endif

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  lo = _mm_add_ps(lo, _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// e^x per lane (Cephes expf polynomial on x - n ln2, scaled by 2^n): about 1 ulp on
// [-87, 88]; inputs below underflow to 0, above saturate at e^88.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

inline float hmax(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
#endif

// sum_i a[i] * b[i] in fp32.
template <typename W>
inline float dot(const float* a, const W* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#ifdef SPLITFLOW_CPU_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc0);
  sum = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += a[i] * to_f32(b[i]);
  return sum;
}

// y[i] += alpha * x[i].
inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef SPLITFLOW_CPU_AVX2
  const __m256 a = _mm256_set1_ps(alpha);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// acc[d] += sum_j weights[j] * rows[j * stride + d], for d < n: a softmax-weighted sum of value
// rows. Keys are the inner loop so acc stays in registers; enough independent chains (columns x
// even / odd keys) to hide the FMA latency: eight on AVX-512 (64 columns at a time), two on AVX2.
// Rows of f16 or bf16 (W) are widened as they are loaded.
template <typename W>
inline void add_weighted_rows(const float* weights, int64_t count, const W* rows, int64_t stride, float* acc,
                              int64_t n) {
  int64_t d = 0;
#ifdef SPLITFLOW_CPU_AVX512
  for (; d + 64 <= n; d += 64) {
    __m512 e0 = _mm512_loadu_ps(acc + d), e1 = _mm512_loadu_ps(acc + d + 16), e2 = _mm512_loadu_ps(acc + d + 32),
           e3 = _mm512_loadu_ps(acc + d + 48);
    __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
    int64_t j = 0;
    for (; j + 2 <= count; j += 2) {
      const W* even_row = rows + j * stride + d;
      const W* odd_row = even_row + stride;
      const __m512 we = _mm512_set1_ps(weights[j]), wo = _mm512_set1_ps(weights[j + 1]);
      e0 = _mm512_fmadd_ps(we, load16(even_row), e0);
      e1 = _mm512_fmadd_ps(we, load16(even_row + 16), e1);
      e2 = _mm512_fmadd_ps(we, load16(even_row + 32), e2);
      e3 = _mm512_fmadd_ps(we, load16(even_row + 48), e3);
      o0 = _mm512_fmadd_ps(wo, load16(odd_row), o0);
      o1 = _mm512_fmadd_ps(wo, load16(odd_row + 16), o1);
      o2 = _mm512_fmadd_ps(wo, load16(odd_row + 32), o2);
      o3 = _mm512_fmadd_ps(wo, load16(odd_row + 48), o3);
    }
    if (j < count) {
      const W* row = rows + j * stride + d;
      const __m512 w = _mm512_set1_ps(weights[j]);
      e0 = _mm512_fmadd_ps(w, load16(row), e0);
      e1 = _mm512_fmadd_ps(w, load16(row + 16), e1);
      e2 = _mm512_fmadd_ps(w, load16(row + 32), e2);
      e3 = _mm512_fmadd_ps(w, load16(row + 48), e3);
    }
    _mm512_storeu_ps(acc + d, _mm512_add_ps(e0, o0));
    _mm512_storeu_ps(acc + d + 16, _mm512_add_ps(e1, o1));
    _mm512_storeu_ps(acc + d + 32, _mm512_add_ps(e2, o2));
    _mm512_storeu_ps(acc + d + 48, _mm512_add_ps(e3, o3));
  }
#endif
#ifdef SPLITFLOW_CPU_AVX2
  for (; d + 8 <= n; d += 8) {
    __m256 even = _mm256_loadu_ps(acc + d), odd = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= count; j += 2) {
      even = _mm256_fmadd_ps(_mm256_set1_ps(weights[j]), load8(rows + j * stride + d), even);
      odd = _mm256_fmadd_ps(_mm256_set1_ps(weights[j + 1]), load8(rows + (j + 1) * stride + d), odd);
    }
    if (j < count) even = _mm256_fmadd_ps(_mm256_set1_ps(weights[j]), load8(rows + j * stride + d), even);
    _mm256_storeu_ps(acc + d, _mm256_add_ps(even, odd));
  }
#endif
  for (; d < n; ++d) {
    float sum = acc[d];
    for (int64_t j = 0; j < count; ++j) sum += weights[j] * to_f32(rows[j * stride + d]);
    acc[d] = sum;
  }
}

// y[i] *= alpha.
inline void scale(float alpha, float* y, int64_t n) {
  int64_t i = 0;
#ifdef SPLITFLOW_CPU_AVX2
  const __m256 a = _mm256_set1_ps(alpha);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(a, _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] *= alpha;
}

// dst[i] = float(src[i]).
template <typename W>
inline void to_f32_row(const W* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef SPLITFLOW_CPU_AVX512
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
#endif
#ifdef SPLITFLOW_CPU_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src + i));
#endif
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

}  // namespace splitflow::cpu
