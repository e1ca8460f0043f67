#include "backend/cpu/q8_activations.h"

#include "backend/cpu/q8_block_codes.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_team.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

using namespace q8_blocks;

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
  std::vector<float> sx16;  // d * sum(q) per 16 elements: the K-quants' offsets apply per super-block
  void quantize(const float* x, int64_t m, int64_t k, int correction) {
    q.resize(static_cast<size_t>(m * k));
    corr.resize(static_cast<size_t>(m * k / 4));
    dx.resize(corr.size());
    sx.resize(corr.size());
    sx16.resize(static_cast<size_t>(m * k / 16));
    const __m256i factor = _mm256_set1_epi32(correction);
    for (int64_t e = 0; e < m * k; e += 32) {
      const Q8Block block = quantize_block32(x + e);
      const __m256i codes = block.codes;
      const float scale = block.d;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q.data() + e), codes);
      const __m256i lane_sums = quad_sums(codes);
      const __m256 d = _mm256_set1_ps(scale);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(corr.data() + e / 4), _mm256_mullo_epi32(lane_sums, factor));
      _mm256_storeu_ps(dx.data() + e / 4, d);
      _mm256_storeu_ps(sx.data() + e / 4, _mm256_mul_ps(d, _mm256_cvtepi32_ps(lane_sums)));
      alignas(32) int32_t sums[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(sums), lane_sums);
      sx16[e / 16] = scale * static_cast<float>(sums[0] + sums[1] + sums[2] + sums[3]);
      sx16[e / 16 + 1] = scale * static_cast<float>(sums[4] + sums[5] + sums[6] + sums[7]);
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

// ---- K-quants: 256-element blocks of 16 (Q6_K) or 8 (Q4_K) sub-blocks with their own scales ----
// Each hands out 64 codes at a time (one VNNI instruction per x row) with, per int32 lane, the
// weight scale d * sc of its sub-block, and returns the super-block's weight offsets -dmin * m per
// 16 elements (zero without them), applied once per super-block against x's per-16 sums.
struct KGroup {
  __m512i codes;
  __m512 scale;
};

// Lane u of the result is lane u / 2 + 8 of a k4_scale_table (the offset of 16-element unit u).
inline __m512 offsets_per16(__m512 table) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), table);
}

// Q6_K (ggml-common.h: ql[128], qh[64], int8 scales[16], d): element e of a 128-element half h is
// 4 low bits from ql (e mod 64, low nibble for e < 64) and 2 high bits from qh[e mod 32]
// (bits 2 * (e / 32)); its sub-block e / 16 has scale scales[8h + e / 16]; codes are q + 32.
template <typename F>
inline __m512 q6k_groups(const uint8_t* blk, F&& f) {
  const __m512 sub_scales = _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)))),
      _mm512_set1_ps(_cvtsh_ss(u16_at(blk + 208))));
  const __m512i low4 = _mm512_set1_epi8(0x0F), high2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
    // qh for elements 0-31 and 32-63 of the half (bits 0-1 and 2-3), then 64-127 (bits 4-7).
    const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    const __m512i lo_codes = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_slli_epi16(hi, 4), high2));
    const __m512i hi_codes = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), _mm512_and_si512(hi, high2));
    const __m512i first = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i sub0 = _mm512_add_epi32(first, _mm512_set1_epi32(8 * h)), sub1 = _mm512_add_epi32(sub0, _mm512_set1_epi32(4));
    f(128 * h, KGroup{lo_codes, _mm512_permutexvar_ps(sub0, sub_scales)});
    f(128 * h + 64, KGroup{hi_codes, _mm512_permutexvar_ps(sub1, sub_scales)});
  }
  return _mm512_setzero_ps();
}

// Q4_K (d, dmin, 12 bytes of 6-bit scales and mins, qs[128]): elements 64g .. 64g + 31 are the low
// nibbles of qs[32g ..], 64g + 32 .. 64g + 63 the high ones; sub-block s has d * sc_s and -dmin * m_s.
template <typename F>
inline __m512 q4k_groups(const uint8_t* blk, F&& f) {
  const __m512 both = k4_scale_table(blk);  // d * sc[0..8), -dmin * m[0..8)
  const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * g));
    const __m512i codes =
        _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), low4);
    const __m512i sub = _mm512_setr_epi32(2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g + 1, 2 * g + 1,
                                          2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1);
    f(64 * g, KGroup{codes, _mm512_permutexvar_ps(sub, both)});
  }
  return offsets_per16(both);
}

// Q2_K, Q3_K, Q5_K (q8_block_codes.h's KQuant): each lane's sub-block scale and offset picked
// from the super-block's vectors.
template <DType T, typename F>
inline __m512 kquant_groups(const uint8_t* blk, F&& f) {
  constexpr int kSub = KQuant<T>::kSub;
  const KScales scales = k_scales<T>(blk);
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    __m256i low, high;
    k_codes<T>(blk, t, low, high);
    // Lane L (elements 4L .. 4L + 3 of the group) is in sub-block (64t + 4L) / kSub.
    const __m512i sub = kSub == 16 ? _mm512_add_epi32(_mm512_set1_epi32(4 * t),
                                                      _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3))
                                   : _mm512_add_epi32(_mm512_set1_epi32(2 * t),
                                                      _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    f(64 * t, KGroup{_mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1), _mm512_permutexvar_ps(sub, scales.scale)});
  }
  // kSub 16: one offset per 16 elements already; kSub 32: lanes 8 .. 15 of the scale table.
  return kSub == 16 ? scales.offset : offsets_per16(scales.offset);
}

template <DType T> struct KLayout {
  static constexpr int kBytes = KQuant<T>::kBytes, kCorrection = KQuant<T>::kCorrection;
  static constexpr bool kOffset = KQuant<T>::kOffset;
};
template <> struct KLayout<DType::Q6_K> { static constexpr int kBytes = 210, kCorrection = -32; static constexpr bool kOffset = false; };
template <> struct KLayout<DType::Q4_K> { static constexpr int kBytes = 144, kCorrection = 0; static constexpr bool kOffset = true; };

template <DType T, int MX, int NW>
void k_tile(const QuantizedRows& xq, int64_t x_row0, int64_t k, const uint8_t* w, size_t row_bytes, float* y,
            int64_t ldy, bool accumulate) {
  using L = KLayout<T>;
  const int64_t blocks = k / 256, lanes_per_row = k / 4;
  __m512 acc[MX][NW];
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  const uint8_t* next = w + NW * row_bytes;
  for (int64_t b = 0; b < blocks; ++b) {
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) {
      const uint8_t* blk = w + j * row_bytes + b * L::kBytes;
      for (int line = 0; line < L::kBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + j * row_bytes + b * L::kBytes + line), _MM_HINT_T1);
      const auto group = [&](int at, const KGroup& g) {
        const int64_t e = b * 256 + at;
#pragma GCC unroll 4
        for (int i = 0; i < MX; ++i) {
          const int64_t row = (x_row0 + i) * k + e, lane = (x_row0 + i) * lanes_per_row + e / 4;
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_loadu_si512(xq.corr.data() + lane), g.codes,
                                                  _mm512_loadu_si512(xq.q.data() + row));
          acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(g.scale, _mm512_loadu_ps(xq.dx.data() + lane)),
                                      acc[i][j]);
        }
      };
      __m512 offsets;
      if constexpr (T == DType::Q6_K) offsets = q6k_groups(blk, group);
      else if constexpr (T == DType::Q4_K) offsets = q4k_groups(blk, group);
      else offsets = kquant_groups<T>(blk, group);
      if constexpr (L::kOffset)
        for (int i = 0; i < MX; ++i)
          acc[i][j] = _mm512_fmadd_ps(offsets, _mm512_loadu_ps(xq.sx16.data() + ((x_row0 + i) * k + b * 256) / 16),
                                      acc[i][j]);
    }
  }
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) {
      const float sum = _mm512_reduce_add_ps(acc[i][j]);
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + sum : sum;
    }
}

template <DType T, int MX, int NW>
void q8_rows(const QuantizedRows& xq, int64_t x_row0, int64_t k, const uint8_t* w, size_t row_bytes, float* y,
             int64_t ldy, int64_t j_begin, int64_t j_end, bool accumulate) {
  const auto tile = [&]<int W>(int64_t j) {
    if constexpr (is_k_quant(T))
      k_tile<T, MX, W>(xq, x_row0, k, w + j * row_bytes, row_bytes, y + j, ldy, accumulate);
    else
      q8_tile<T, MX, W>(xq, x_row0, k, w + j * row_bytes, row_bytes, y + j, ldy, accumulate);
  };
  int64_t j = j_begin;
  for (; j + NW <= j_end; j += NW) tile.template operator()<NW>(j);
  for (; j < j_end; ++j) tile.template operator()<1>(j);
}

template <DType T>
void gemv(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, int64_t ldy, bool accumulate,
          int num_threads) {
  constexpr bool kQuantK = is_k_quant(T);
  size_t row_bytes;
  int correction;
  if constexpr (kQuantK) {
    row_bytes = static_cast<size_t>(k / 256 * KLayout<T>::kBytes);
    correction = KLayout<T>::kCorrection;
  } else {
    row_bytes = static_cast<size_t>(k / 32 * Layout<T>::kBytes);
    correction = Layout<T>::kCorrection;
  }
  // On the calling thread, before the team starts: x is at most a few rows of k.
  thread_local QuantizedRows xq;
  xq.quantize(x, m, k, correction);
  const QuantizedRows& rows_q = xq;
  // Runs of contiguous rows of w, about four per thread (matmul.cpp's gemv says why).
  parallel_ranges(num_threads, n, m * n * k >= 8 * kMinParallelWork, [&](int64_t j_begin, int64_t j_end) {
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
  });
}

}  // namespace

bool q8_gemv_supported(DType type) {
  return type == DType::Q4_0 || type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 ||
         type == DType::Q8_0 || q8_blocks::is_k_quant(type);
}

void q8_gemv(const float* x, int64_t m, int64_t k, const void* w, DType type, int64_t n, float* y, int64_t ldy,
             bool accumulate, int num_threads) {
  const int64_t block = q8_blocks::is_k_quant(type) ? 256 : 32;
  SF_CHECK(k % block == 0, "cpu q8 gemv: rows of {} elements (not whole {}-element blocks)", k, block);
  const auto* bytes = static_cast<const uint8_t*>(w);
  switch (type) {
    case DType::Q4_0: return gemv<DType::Q4_0>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q4_1: return gemv<DType::Q4_1>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q5_0: return gemv<DType::Q5_0>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q5_1: return gemv<DType::Q5_1>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q8_0: return gemv<DType::Q8_0>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q2_K: return gemv<DType::Q2_K>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q3_K: return gemv<DType::Q3_K>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q4_K: return gemv<DType::Q4_K>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q5_K: return gemv<DType::Q5_K>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
    case DType::Q6_K: return gemv<DType::Q6_K>(x, m, k, bytes, n, y, ldy, accumulate, num_threads);
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
