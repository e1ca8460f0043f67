#include "backend/cpu/q8_activations.h"

#include "backend/cpu/simd.h"
#include "core/error.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

// GCC 12's AVX-512 headers pass undefined vectors as the unused merge source of masked builtins,
// which -Wuninitialized reports in every caller (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace splitflow::cpu {

void quantize_q8_blocks(const float* x, int64_t k, int8_t* q, float* d) {
  for (int64_t b = 0; b < k / 32; ++b) {
    float amax = 0.0f;
    for (int p = 0; p < 32; ++p) amax = std::max(amax, std::fabs(x[b * 32 + p]));
    const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    d[b] = scale;
    for (int p = 0; p < 32; ++p) q[b * 32 + p] = static_cast<int8_t>(std::nearbyint(x[b * 32 + p] * inverse));
  }
}

#ifdef SPLITFLOW_CPU_AVX512_VNNI
namespace {

uint16_t u16_at(const uint8_t* p) {
  uint16_t value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
uint32_t u32_at(const uint8_t* p) {
  uint32_t value;
  std::memcpy(&value, p, sizeof value);
  return value;
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

// The codes of blocks b0 and b1 (adjacent in a row) as 64 unsigned bytes in element order.
template <DType T>
inline __m512i pair_codes(const uint8_t* b0) {
  using L = Layout<T>;
  const uint8_t* b1 = b0 + L::kBytes;
  if constexpr (T == DType::Q8_0) {
    const __m512i codes = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + L::kCodes))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + L::kCodes)), 1);
    return _mm512_xor_si512(codes, _mm512_set1_epi8(static_cast<char>(0x80)));  // q + 128
  } else {
    // [qs0 | qs1] -> [qs0 & 15, qs1 & 15, qs0 >> 4, qs1 >> 4] by 128-bit lanes, then into element
    // order: block 0's low nibbles (elements 0-15), its high nibbles (16-31), then block 1's.
    const __m256i both = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + L::kCodes))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + L::kCodes)), 1);
    const __m512i nibbles = _mm512_and_si512(
        _mm512_inserti64x4(_mm512_castsi256_si512(both), _mm256_srli_epi16(both, 4), 1), _mm512_set1_epi8(0x0F));
    __m512i codes = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), nibbles);
    if constexpr (L::kHigh >= 0) {
      const __mmask64 high = static_cast<__mmask64>(u32_at(b0 + L::kHigh)) |
                             static_cast<__mmask64>(u32_at(b1 + L::kHigh)) << 32;
      codes = _mm512_or_si512(codes, _mm512_maskz_mov_epi8(high, _mm512_set1_epi8(0x10)));
    }
    return codes;
  }
}

// One block's codes as 32 unsigned bytes (the odd block at the end of a row).
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

// The f16 at offset `at` of blocks b0 and b0 + 1 as floats: lanes 0-7 and 8-15 (the int32 lanes
// of each block's dot product).
template <DType T>
inline __m512 pair_halves(const uint8_t* b0, int at) {
  const __m256i h = _mm256_mask_set1_epi16(_mm256_set1_epi16(static_cast<short>(u16_at(b0 + at))), 0xFF00,
                                           static_cast<short>(u16_at(b0 + Layout<T>::kBytes + at)));
  return _mm512_cvtph_ps(h);
}

// x quantized for one weight type, per x row: codes q [k], and per int32 lane of the dot products
// (4 consecutive elements): corr = kCorrection * (sum of the lane's 4 codes), dx = the block's
// scale, sx = dx * (sum of the lane's 4 codes) (for the minimum of Q4_1/Q5_1).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<int32_t> corr;
  std::vector<float> dx, sx;
  void quantize(const float* x, int64_t m, int64_t k, int correction) {
    q.resize(static_cast<size_t>(m * k));
    corr.resize(static_cast<size_t>(m * k / 4));
    dx.resize(corr.size());
    sx.resize(corr.size());
    const __m256i ones = _mm256_set1_epi8(1), factor = _mm256_set1_epi32(correction);
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t e = 0; e < m * k; e += 32) {
      const __m512 v0 = _mm512_loadu_ps(x + e), v1 = _mm512_loadu_ps(x + e + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
      const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
      const __m512 inv = _mm512_set1_ps(inverse);
      // cvtps rounds to nearest even (MXCSR default), as nearbyint does in quantize_q8_blocks.
      const __m128i q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)));
      const __m128i q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)));
      const __m256i codes = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q.data() + e), codes);
      const __m256i lane_sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, codes);
      const __m256 d = _mm256_set1_ps(scale);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(corr.data() + e / 4), _mm256_mullo_epi32(lane_sums, factor));
      _mm256_storeu_ps(dx.data() + e / 4, d);
      _mm256_storeu_ps(sx.data() + e / 4, _mm256_mul_ps(d, _mm256_cvtepi32_ps(lane_sums)));
    }
  }
};

// y[i * ldy + j] (+)= x'[i] . w[j] for MX rows of x and NW rows of w. Each step takes two blocks of
// every row (64 codes, one VNNI instruction per x row) and prefetches the same bytes of the next
// tile's rows (as the float GEMV does).
template <DType T, int MX, int NW>
void q8_tile(const QuantizedRows& xq, int64_t x_row0, int64_t k, const uint8_t* w, size_t row_bytes, float* y,
             int64_t ldy, bool accumulate) {
  using L = Layout<T>;
  const int64_t blocks = k / 32, lanes_per_row = k / 4;
  __m512 acc[MX][NW];
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  const int8_t* q[MX];
  const int32_t* corr[MX];
  const float *dx[MX], *sx[MX];
  for (int i = 0; i < MX; ++i) {
    q[i] = xq.q.data() + (x_row0 + i) * k;
    corr[i] = xq.corr.data() + (x_row0 + i) * lanes_per_row;
    dx[i] = xq.dx.data() + (x_row0 + i) * lanes_per_row;
    sx[i] = xq.sx.data() + (x_row0 + i) * lanes_per_row;
  }
  const uint8_t* next = w + NW * row_bytes;
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    __m512i xv[MX], cv[MX];
    for (int i = 0; i < MX; ++i) {
      xv[i] = _mm512_loadu_si512(q[i] + b * 32);
      cv[i] = _mm512_loadu_si512(corr[i] + b * 8);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) {
      const uint8_t* b0 = w + j * row_bytes + b * L::kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(next + j * row_bytes + b * L::kBytes), _MM_HINT_T1);
      if constexpr (2 * L::kBytes > 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + j * row_bytes + b * L::kBytes + 64), _MM_HINT_T1);
      const __m512i codes = pair_codes<T>(b0);
      const __m512 dw = pair_halves<T>(b0, 0);
      [[maybe_unused]] __m512 mw;
      if constexpr (L::kMin) mw = pair_halves<T>(b0, 2);
#pragma GCC unroll 4
      for (int i = 0; i < MX; ++i) {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv[i], codes, xv[i]));
        acc[i][j] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, _mm512_loadu_ps(dx[i] + b * 8)), acc[i][j]);
        if constexpr (L::kMin) acc[i][j] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(sx[i] + b * 8), acc[i][j]);
      }
    }
  }
  float sums[MX][NW];
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
  if (b < blocks) {  // an odd last block
    for (int j = 0; j < NW; ++j) {
      const uint8_t* blk = w + j * row_bytes + b * L::kBytes;
      const __m256i codes = block_codes<T>(blk);
      const __m256 dw = _mm256_set1_ps(_cvtsh_ss(u16_at(blk)));
      for (int i = 0; i < MX; ++i) {
        const __m256i x8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[i] + b * 32));
        const __m256i c8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr[i] + b * 8));
        __m256 part = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(c8, codes, x8)),
                                    _mm256_mul_ps(dw, _mm256_loadu_ps(dx[i] + b * 8)));
        if constexpr (L::kMin)
          part = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(u16_at(blk + 2))), _mm256_loadu_ps(sx[i] + b * 8), part);
        sums[i][j] += hsum(part);
      }
    }
  }
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = accumulate ? y[i * ldy + j] + sums[i][j] : sums[i][j];
}

template <DType T, int MX, int NW>
void q8_rows(const QuantizedRows& xq, int64_t x_row0, int64_t k, const uint8_t* w, size_t row_bytes, float* y,
             int64_t ldy, int64_t j_begin, int64_t j_end, bool accumulate) {
  int64_t j = j_begin;
  for (; j + NW <= j_end; j += NW) q8_tile<T, MX, NW>(xq, x_row0, k, w + j * row_bytes, row_bytes, y + j, ldy, accumulate);
  for (; j < j_end; ++j) q8_tile<T, MX, 1>(xq, x_row0, k, w + j * row_bytes, row_bytes, y + j, ldy, accumulate);
}

template <DType T>
void gemv(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, int64_t ldy, bool accumulate,
          int num_threads) {
  const size_t row_bytes = static_cast<size_t>(k / 32 * Layout<T>::kBytes);
  // On the calling thread, before the team starts: x is at most a few rows of k.
  thread_local QuantizedRows xq;
  xq.quantize(x, m, k, Layout<T>::kCorrection);
  const QuantizedRows& rows_q = xq;
#pragma omp parallel num_threads(num_threads) if (m * n * k >= 8 * kMinParallelWork)
  {
    const int threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t per_thread = (n + threads - 1) / threads;
    const int64_t aligned = (per_thread + 7) / 8 * 8;
    const int64_t j_begin = std::min<int64_t>(n, aligned * thread);
    const int64_t j_end = std::min<int64_t>(n, j_begin + aligned);
    for (int64_t i = 0; i < m;) {
      const int64_t rows = std::min<int64_t>(4, m - i);
      float* yi = y + i * ldy;
      switch (rows) {
        case 1: q8_rows<T, 1, 4>(rows_q, i, k, w, row_bytes, yi, ldy, j_begin, j_end, accumulate); break;
        case 2: q8_rows<T, 2, 2>(rows_q, i, k, w, row_bytes, yi, ldy, j_begin, j_end, accumulate); break;
        case 3: q8_rows<T, 3, 2>(rows_q, i, k, w, row_bytes, yi, ldy, j_begin, j_end, accumulate); break;
        default: q8_rows<T, 4, 2>(rows_q, i, k, w, row_bytes, yi, ldy, j_begin, j_end, accumulate); break;
      }
      i += rows;
    }
  }
}

}  // namespace

bool q8_gemv_supported(DType type) {
  return type == DType::Q4_0 || type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 ||
         type == DType::Q8_0;
}

void q8_gemv(const float* x, int64_t m, int64_t k, const void* w, DType type, int64_t n, float* y, int64_t ldy,
             bool accumulate, int num_threads) {
  SF_CHECK(k % 32 == 0, "cpu q8 gemv: rows of {} elements (not whole 32-element blocks)", k);
  const auto* bytes = static_cast<const uint8_t*>(w);
  switch (type) {
    case DType::Q4_0: return gemv<DType::Q4_0>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q4_1: return gemv<DType::Q4_1>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q5_0: return gemv<DType::Q5_0>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q5_1: return gemv<DType::Q5_1>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q8_0: return gemv<DType::Q8_0>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    default: SF_CHECK(false, "cpu q8 gemv: {} has no Q8-activation kernel", dtype_name(type));
  }
}

#else

bool q8_gemv_supported(DType) { return false; }

void q8_gemv(const float*, int64_t, int64_t, const void*, DType type, int64_t, float*, int64_t, bool, int) {
  SF_CHECK(false, "cpu q8 gemv: {} needs AVX-512 VNNI, which this build does not target", dtype_name(type));
}

#endif

}  // namespace splitflow::cpu
