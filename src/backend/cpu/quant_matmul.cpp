#include "backend/cpu/quant_matmul.h"

#include "backend/cpu/q8_activations.h"
#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_team.h"

#include <algorithm>
#include <vector>

namespace splitflow::cpu {
namespace {

using quant_blocks::Codec;

// y[i * ldy + j] = x[i] . w[j] for MX rows of x and NW rows of w: each weight block is decoded
// once and used MX times. Codecs with one scale and offset per block (kVector) never form the
// weights: x . (s q + o) = s (x . q) + o sum(x), with sum(x) per block from x_sums [MX][blocks].
template <DType T, int MX, int NW>
void qdot_tile(const float* x, int64_t k, const float* x_sums, const uint8_t* w, size_t row_bytes, float* y,
               int64_t ldy, bool accumulate) {
  using C = Codec<T>;
  const int64_t blocks = k / C::kElems;
#ifdef SPLITFLOW_CPU_AVX2
  __m256 acc[MX][NW];
  float offsets[MX][NW] = {};
#pragma GCC unroll 4
  for (int i = 0; i < MX; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * C::kElems;
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) {
      const uint8_t* row = w + j * row_bytes;
      if constexpr (C::kVector) {
        __m256 part[MX];
#pragma GCC unroll 4
        for (int i = 0; i < MX; ++i) part[i] = _mm256_setzero_ps();
        C::emit_codes(row, k, b, [&](int off, __m256 codes) {
#pragma GCC unroll 4
          for (int i = 0; i < MX; ++i) part[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + i * k + off), codes, part[i]);
        });
        float scale, offset;
        C::scales(row, k, b, scale, offset);
        const __m256 s = _mm256_set1_ps(scale);
#pragma GCC unroll 4
        for (int i = 0; i < MX; ++i) {
          acc[i][j] = _mm256_fmadd_ps(part[i], s, acc[i][j]);
          offsets[i][j] += offset * x_sums[i * blocks + b];
        }
      } else {
        quant_blocks::emit<T>(row, k, b, [&](int off, __m256 wv) {
#pragma GCC unroll 4
          for (int i = 0; i < MX; ++i) acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + i * k + off), wv, acc[i][j]);
        });
      }
    }
  }
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) {
      const float sum = hsum(acc[i][j]) + offsets[i][j];
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + sum : sum;
    }
#else
  float acc[MX][NW] = {};
  float buf[C::kElems];
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * C::kElems;
    for (int j = 0; j < NW; ++j) {
      C::decode(w + j * row_bytes, k, b, buf);
      for (int i = 0; i < MX; ++i) {
        float sum = 0.0f;
        for (int64_t p = 0; p < C::kElems; ++p) sum += xb[i * k + p] * buf[p];
        acc[i][j] += sum;
      }
    }
  }
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = accumulate ? y[i * ldy + j] + acc[i][j] : acc[i][j];
#endif
}

template <DType T, int MX, int NW>
void qdot_rows(const float* x, int64_t k, const float* x_sums, const uint8_t* w, size_t row_bytes, float* y,
               int64_t ldy, int64_t j_begin, int64_t j_end, bool accumulate) {
  int64_t j = j_begin;
  for (; j + NW <= j_end; j += NW)
    qdot_tile<T, MX, NW>(x, k, x_sums, w + j * row_bytes, row_bytes, y + j, ldy, accumulate);
  for (; j < j_end; ++j) qdot_tile<T, MX, 1>(x, k, x_sums, w + j * row_bytes, row_bytes, y + j, ldy, accumulate);
}

template <DType T>
void gemv(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, int64_t ldy, bool accumulate,
          int num_threads) {
  const size_t row_bytes = dtype_row_bytes(T, k);
  // Per-block sums of each x row, for the codecs' offsets.
  constexpr int64_t kElems = Codec<T>::kElems;
  const int64_t blocks = k / kElems;
  thread_local std::vector<float> x_sums;
  x_sums.assign(static_cast<size_t>(m * blocks), 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < blocks; ++b) {
      float sum = 0.0f;
      for (int64_t p = 0; p < kElems; ++p) sum += x[i * k + b * kElems + p];
      x_sums[static_cast<size_t>(i * blocks + b)] = sum;
    }
  const float* sums = x_sums.data();
  // Runs of contiguous rows of w, about four per thread (matmul.cpp's gemv says why).
  parallel_ranges(num_threads, n, m * n * k >= 8 * kMinParallelWork, [&](int64_t j_begin, int64_t j_end) {
    for (int64_t i = 0; i < m;) {
      const int64_t rows = std::min<int64_t>(4, m - i);
      const float* xi = x + i * k;
      const float* si = sums + i * blocks;
      float* yi = y + i * ldy;
      switch (rows) {
        case 1: qdot_rows<T, 1, 4>(xi, k, si, w, row_bytes, yi, ldy, j_begin, j_end, accumulate); break;
        case 2: qdot_rows<T, 2, 2>(xi, k, si, w, row_bytes, yi, ldy, j_begin, j_end, accumulate); break;
        case 3: qdot_rows<T, 3, 2>(xi, k, si, w, row_bytes, yi, ldy, j_begin, j_end, accumulate); break;
        default: qdot_rows<T, 4, 2>(xi, k, si, w, row_bytes, yi, ldy, j_begin, j_end, accumulate); break;
      }
      i += rows;
    }
  });
}

void check_blocks(DType type, int64_t k) {
  SF_CHECK(k % dtype_block_elems(type) == 0, "cpu matmul: a {} matrix with rows of {} elements (not whole {}-element blocks)",
           dtype_name(type), k, dtype_block_elems(type));
}

}  // namespace

void quant_gemv(const float* x, int64_t m, int64_t k, const void* w, DType type, int64_t n, float* y, int64_t ldy,
                bool accumulate, bool q8_activations, int num_threads) {
  check_blocks(type, k);
  if (q8_activations && q8_gemv_supported(type)) return q8_gemv(x, m, k, w, type, n, y, ldy, accumulate, num_threads);
  quant_blocks::visit(type, [&]<DType T>() {
    gemv<T>(x, m, k, static_cast<const uint8_t*>(w), n, y, ldy, accumulate, num_threads);
  });
}

void quant_decode_rows(DType type, const void* w, int64_t k, int64_t row_begin, int64_t rows, int64_t p0, int64_t count,
                       float* out) {
  check_blocks(type, k);
  const size_t row_bytes = dtype_row_bytes(type, k);
  const auto* bytes = static_cast<const uint8_t*>(w);
  quant_blocks::visit(type, [&]<DType T>() {
    for (int64_t r = 0; r < rows; ++r)
      quant_blocks::decode_range<T>(bytes + (row_begin + r) * row_bytes, k, p0, count, out + r * count);
  });
}

}  // namespace splitflow::cpu
