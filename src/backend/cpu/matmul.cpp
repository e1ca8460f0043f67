#include "backend/cpu/matmul.h"
#include "backend/cpu/q8_gemm.h"

#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_team.h"
#include "core/error.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <vector>

namespace splitflow::cpu {
namespace {

// Rows of w per chunk of the decode GEMV's work (a multiple of the 8-row tiles).

// ---- GEMV: y[i, j] (+)= dot(x[i], w[j]) for a tile of MX rows of x and NW rows of w -------------
// Each w element is converted once and used MX times; MX * NW accumulators stay in registers.
#ifdef SPLITFLOW_CPU_AVX512
// 16 lanes, 32 elements of each row per step (one 64-byte line of F16/BF16, two of F32). Each step
// prefetches the same lines of the next tile's rows into L2: a decode matrix's rows are often one
// 4 KiB page each (k = 2048, f16), and the hardware prefetchers stop at page boundaries, so every
// row would otherwise start with a stall while NW of them are read side by side.
template <typename W, int MX, int NW>
void dot_tile(const float* x, int64_t k, const W* w, float* y, int64_t ldy, bool accumulate) {
  // A small tile keeps two accumulators per pair (the step's low and high 16 elements): two FMA
  // chains, so one row (NW = 1) is not bound by the FMA latency; larger tiles have chains enough.
  constexpr bool kTwoChains = MX * NW < 4;
  __m512 acc[MX][NW], acc_hi[MX][kTwoChains ? NW : 1];
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  if constexpr (kTwoChains)
    for (int i = 0; i < MX; ++i)
      for (int j = 0; j < NW; ++j) acc_hi[i][j] = _mm512_setzero_ps();
  const char* next = reinterpret_cast<const char*>(w + NW * k);
  constexpr int kStepBytes = 32 * sizeof(W);
  int64_t p = 0;
  for (; p + 32 <= k; p += 32) {
    __m512 lo[NW], hi[NW];
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
#pragma GCC unroll 2
      for (int line = 0; line < kStepBytes; line += 64)
        _mm_prefetch(next + static_cast<int64_t>((j * k + p) * sizeof(W)) + line, _MM_HINT_T1);
      lo[j] = load16(w + j * k + p);
      hi[j] = load16(w + j * k + p + 16);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MX; ++i) {
      const __m512 x_lo = _mm512_loadu_ps(x + i * k + p), x_hi = _mm512_loadu_ps(x + i * k + p + 16);
#pragma GCC unroll 8
      for (int j = 0; j < NW; ++j) {
        if constexpr (kTwoChains) {
          acc[i][j] = _mm512_fmadd_ps(x_lo, lo[j], acc[i][j]);
          acc_hi[i][j] = _mm512_fmadd_ps(x_hi, hi[j], acc_hi[i][j]);
        } else {
          acc[i][j] = _mm512_fmadd_ps(x_hi, hi[j], _mm512_fmadd_ps(x_lo, lo[j], acc[i][j]));
        }
      }
    }
  }
  if constexpr (kTwoChains)
    for (int i = 0; i < MX; ++i)
      for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_add_ps(acc[i][j], acc_hi[i][j]);
  for (; p + 16 <= k; p += 16)
    for (int i = 0; i < MX; ++i)
      for (int j = 0; j < NW; ++j)
        acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * k + p), load16(w + j * k + p), acc[i][j]);
  float sums[MX][NW];
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
  for (; p < k; ++p)
    for (int j = 0; j < NW; ++j) {
      const float wj = to_f32(w[j * k + p]);
      for (int i = 0; i < MX; ++i) sums[i][j] += x[i * k + p] * wj;
    }
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = accumulate ? y[i * ldy + j] + sums[i][j] : sums[i][j];
}
#else
// BF16 weights are widened 16 at a time by interleaving with zeros (unpacklo/hi_epi16), which
// yields elements {0-3, 8-11} and {4-7, 12-15} of each 16-chunk: x is permuted to match once per
// call (permute_for_bf16), saving the uops that limit how far ahead the core streams weights.
template <typename W, int MX, int NW>
void dot_tile(const float* x, int64_t k, const W* w, float* y, int64_t ldy, bool accumulate) {
  int64_t p = 0;
  float tail[MX][NW] = {};
#ifdef SPLITFLOW_CPU_AVX2
  __m256 acc[MX][NW];
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_setzero_ps();
  if constexpr (std::is_same_v<W, BF16Bits>) {
    const __m256i zero = _mm256_setzero_si256();
    for (; p + 16 <= k; p += 16) {
      __m256 lo[NW], hi[NW];
      for (int j = 0; j < NW; ++j) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * k + p));
        lo[j] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
        hi[j] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
      }
      for (int i = 0; i < MX; ++i) {
        const __m256 x_lo = _mm256_loadu_ps(x + i * k + p), x_hi = _mm256_loadu_ps(x + i * k + p + 8);
        for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_fmadd_ps(x_hi, hi[j], _mm256_fmadd_ps(x_lo, lo[j], acc[i][j]));
      }
    }
  } else {
    for (; p + 8 <= k; p += 8) {
      __m256 wv[NW];
      for (int j = 0; j < NW; ++j) wv[j] = load8(w + j * k + p);
      for (int i = 0; i < MX; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + i * k + p);
        for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) tail[i][j] = hsum(acc[i][j]);
#endif
  for (; p < k; ++p)
    for (int j = 0; j < NW; ++j) {
      const float wj = to_f32(w[j * k + p]);
      for (int i = 0; i < MX; ++i) tail[i][j] += x[i * k + p] * wj;
    }
  for (int i = 0; i < MX; ++i)
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = accumulate ? y[i * ldy + j] + tail[i][j] : tail[i][j];
}

// x [m, k] with each whole 16-chunk reordered {0-3, 8-11, 4-7, 12-15}, the order dot_tile widens
// BF16 weights in; the tail past the last whole chunk stays in place.
const float* permute_for_bf16(const float* x, int64_t m, int64_t k) {
  thread_local std::vector<float> permuted;
  permuted.resize(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) {
    const float* src = x + i * k;
    float* dst = permuted.data() + i * k;
    int64_t c = 0;
    for (; c + 16 <= k; c += 16) {
      std::copy_n(src + c, 4, dst + c);
      std::copy_n(src + c + 8, 4, dst + c + 4);
      std::copy_n(src + c + 4, 4, dst + c + 8);
      std::copy_n(src + c + 12, 4, dst + c + 12);
    }
    std::copy(src + c, src + k, dst + c);
  }
  return permuted.data();
}
#endif

// Rows [j_begin, j_end) of w against MX rows of x.
template <typename W, int MX, int NW>
void dot_rows(const float* x, int64_t k, const W* w, float* y, int64_t ldy, int64_t j_begin, int64_t j_end,
              bool accumulate) {
  int64_t j = j_begin;
  for (; j + NW <= j_end; j += NW) dot_tile<W, MX, NW>(x, k, w + j * k, y + j, ldy, accumulate);
  for (; j < j_end; ++j) dot_tile<W, MX, 1>(x, k, w + j * k, y + j, ldy, accumulate);
}

template <typename W>
void gemv(const float* x, int64_t m, int64_t k, const W* w, int64_t n, float* y, int64_t ldy, bool accumulate,
          int num_threads) {
#if defined(SPLITFLOW_CPU_AVX2) && !defined(SPLITFLOW_CPU_AVX512)
  if constexpr (std::is_same_v<W, BF16Bits>) x = permute_for_bf16(x, m, k);
#endif
  // Runs of contiguous rows of w, about four per thread, taken by the team's threads one at a time
  // (a descheduled thread delays its run only; long runs are long sequential streams for the
  // prefetchers: 32-row chunks taken in turn ran Q4_0 decode at 0.6x); each run is one pass over
  // its rows per group of up to 4 x rows.
  parallel_ranges(num_threads, n, m * n * k >= 8 * kMinParallelWork, [&](int64_t j_begin, int64_t j_end) {
    for (int64_t i = 0; i < m;) {
      const int64_t rows = std::min<int64_t>(4, m - i);
      const float* xi = x + i * k;
      float* yi = y + i * ldy;
      switch (rows) {
        // One x row reads one row of w at a time: a single stream for the prefetchers (8 rows
        // side by side streamed 39 GB/s of TinyLlama's F16 on 2 threads, one row 56).
        case 1: dot_rows<W, 1, 1>(xi, k, w, yi, ldy, j_begin, j_end, accumulate); break;
        case 2: dot_rows<W, 2, 4>(xi, k, w, yi, ldy, j_begin, j_end, accumulate); break;
        case 3: dot_rows<W, 3, 4>(xi, k, w, yi, ldy, j_begin, j_end, accumulate); break;
        default: dot_rows<W, 4, 3>(xi, k, w, yi, ldy, j_begin, j_end, accumulate); break;
      }
      i += rows;
    }
  });
}

// ---- GEMM: packed panels of w (fp32, k-major), a register-blocked micro-kernel ----------------
// AVX-512: 8 x rows by 32 columns (16 zmm accumulators: 8 broadcasts and 2 panel loads per 16
// FMAs); AVX2: 6 x 16 (12 ymm accumulators).
#ifdef SPLITFLOW_CPU_AVX512
constexpr int kMR = 8;     // x rows per micro-tile
constexpr int kNR = 32;    // w rows (output columns) per micro-tile: two 16-lane vectors
#else
constexpr int kMR = 6;
constexpr int kNR = 16;    // two 8-lane vectors
#endif
constexpr int64_t kKC = 512;   // k depth per packed panel (panel of kNR columns: 32-64 KiB, L2): rows are read 1-2 KiB at a time
constexpr int64_t kNC = 128;   // output columns per work item (packed block: 256 KiB, L2)

#ifdef SPLITFLOW_CPU_AVX2
// In place: rows[i] becomes column i of the 8x8 matrix whose rows were rows[0..8).
inline void transpose8(__m256 rows[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(rows[0], rows[1]), t1 = _mm256_unpackhi_ps(rows[0], rows[1]);
  const __m256 t2 = _mm256_unpacklo_ps(rows[2], rows[3]), t3 = _mm256_unpackhi_ps(rows[2], rows[3]);
  const __m256 t4 = _mm256_unpacklo_ps(rows[4], rows[5]), t5 = _mm256_unpackhi_ps(rows[4], rows[5]);
  const __m256 t6 = _mm256_unpacklo_ps(rows[6], rows[7]), t7 = _mm256_unpackhi_ps(rows[6], rows[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  rows[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  rows[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  rows[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  rows[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  rows[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  rows[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  rows[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  rows[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#endif

// packed[p * kNR + c] = w[j0 + c][p0 + p] for p < kc, c < kNR (zero past n): 8x8 blocks
// converted and transposed in registers.
template <typename W>
void pack_panel(const W* w, int64_t k, int64_t n, int64_t j0, int64_t p0, int64_t kc, float* packed) {
  int64_t p = 0;
#ifdef SPLITFLOW_CPU_AVX2
  // Eight rows at a time along the whole depth: rows a page apart (k = 2048 in f16, 1024 in f32)
  // share one L1 set, and 32 of them read side by side overflow its ways (each line refetched for
  // every 8 columns it holds; 0.66 of the FMA peak at 64 rows against 0.78 at k = 5632).
  const int64_t whole = kc / 8 * 8;
  for (int c0 = 0; c0 < kNR; c0 += 8)
    for (p = 0; p < whole; p += 8) {
      __m256 block[8];
      for (int r = 0; r < 8; ++r) {
        if (j0 + c0 + r >= n) {
          block[r] = _mm256_setzero_ps();
          continue;
        }
        const W* row = w + (j0 + c0 + r) * k + p0 + p;
        // Each row's stretch is short (kc values) for the hardware prefetchers: ask for this
        // row's next lines and, a group ahead, the same line of the row 8 below (the next group's,
        // or the next panel's).
        if (p % 32 == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(row + 64), _MM_HINT_T0);
          if (j0 + c0 + r + 8 < n) _mm_prefetch(reinterpret_cast<const char*>(row + 8 * k), _MM_HINT_T1);
        }
        block[r] = load8(row);
      }
      transpose8(block);
      for (int i = 0; i < 8; ++i) _mm256_store_ps(packed + (p + i) * kNR + c0, block[i]);
    }
#endif
  for (; p < kc; ++p)
    for (int c = 0; c < kNR; ++c) packed[p * kNR + c] = j0 + c < n ? to_f32(w[(j0 + c) * k + p0 + p]) : 0.0f;
}

// out[i][c] = sum_p a[i][p] * packed[p * kNR + c] for kMR rows a[i] and kNR columns. Named
// accumulators, not an array: GCC otherwise spills the array to the stack every iteration.
void micro_kernel(const float* const a[kMR], const float* packed, int64_t kc, float out[kMR][kNR]) {
#if defined(SPLITFLOW_CPU_AVX512)
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5], *a6 = a[6], *a7 = a[7];
  for (int64_t p = 0; p < kc; ++p, packed += kNR) {
    const __m512 b0 = _mm512_load_ps(packed), b1 = _mm512_load_ps(packed + 16);
    __m512 x = _mm512_set1_ps(a0[p]);
    c00 = _mm512_fmadd_ps(x, b0, c00);
    c01 = _mm512_fmadd_ps(x, b1, c01);
    x = _mm512_set1_ps(a1[p]);
    c10 = _mm512_fmadd_ps(x, b0, c10);
    c11 = _mm512_fmadd_ps(x, b1, c11);
    x = _mm512_set1_ps(a2[p]);
    c20 = _mm512_fmadd_ps(x, b0, c20);
    c21 = _mm512_fmadd_ps(x, b1, c21);
    x = _mm512_set1_ps(a3[p]);
    c30 = _mm512_fmadd_ps(x, b0, c30);
    c31 = _mm512_fmadd_ps(x, b1, c31);
    x = _mm512_set1_ps(a4[p]);
    c40 = _mm512_fmadd_ps(x, b0, c40);
    c41 = _mm512_fmadd_ps(x, b1, c41);
    x = _mm512_set1_ps(a5[p]);
    c50 = _mm512_fmadd_ps(x, b0, c50);
    c51 = _mm512_fmadd_ps(x, b1, c51);
    x = _mm512_set1_ps(a6[p]);
    c60 = _mm512_fmadd_ps(x, b0, c60);
    c61 = _mm512_fmadd_ps(x, b1, c61);
    x = _mm512_set1_ps(a7[p]);
    c70 = _mm512_fmadd_ps(x, b0, c70);
    c71 = _mm512_fmadd_ps(x, b1, c71);
  }
  const __m512 result[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                                 {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
  for (int i = 0; i < kMR; ++i) {
    _mm512_storeu_ps(out[i], result[i][0]);
    _mm512_storeu_ps(out[i] + 16, result[i][1]);
  }
#elif defined(SPLITFLOW_CPU_AVX2)
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
  for (int64_t p = 0; p < kc; ++p, packed += kNR) {
    const __m256 b0 = _mm256_load_ps(packed), b1 = _mm256_load_ps(packed + 8);
    __m256 x = _mm256_broadcast_ss(a0 + p);
    c00 = _mm256_fmadd_ps(x, b0, c00);
    c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a1 + p);
    c10 = _mm256_fmadd_ps(x, b0, c10);
    c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a2 + p);
    c20 = _mm256_fmadd_ps(x, b0, c20);
    c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a3 + p);
    c30 = _mm256_fmadd_ps(x, b0, c30);
    c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a4 + p);
    c40 = _mm256_fmadd_ps(x, b0, c40);
    c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a5 + p);
    c50 = _mm256_fmadd_ps(x, b0, c50);
    c51 = _mm256_fmadd_ps(x, b1, c51);
  }
  const __m256 result[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int i = 0; i < kMR; ++i) {
    _mm256_storeu_ps(out[i], result[i][0]);
    _mm256_storeu_ps(out[i] + 8, result[i][1]);
  }
#else
  for (int i = 0; i < kMR; ++i)
    for (int c = 0; c < kNR; ++c) out[i][c] = 0.0f;
  for (int64_t p = 0; p < kc; ++p)
    for (int i = 0; i < kMR; ++i)
      for (int c = 0; c < kNR; ++c) out[i][c] += a[i][p] * packed[p * kNR + c];
#endif
}

// y[i, c] (+)= (x rows [0, rows)) . packed panel, for c < cols. Missing rows of a short tile
// repeat row 0; their results are dropped.
void micro_tile(int64_t rows, const float* x, int64_t ldx, const float* packed, int64_t kc, float* y, int64_t ldy,
                int64_t cols, bool accumulate) {
  const float* a[kMR];
  for (int i = 0; i < kMR; ++i) a[i] = x + (i < rows ? i : 0) * ldx;
  alignas(64) float out[kMR][kNR];
  micro_kernel(a, packed, kc, out);
  for (int64_t i = 0; i < rows; ++i) {
    float* y_row = y + i * ldy;
    if (cols == kNR && accumulate) {
      for (int64_t c = 0; c < kNR; ++c) y_row[c] += out[i][c];
    } else if (cols == kNR) {
      for (int64_t c = 0; c < kNR; ++c) y_row[c] = out[i][c];
    } else {
      for (int64_t c = 0; c < cols; ++c) y_row[c] = accumulate ? y_row[c] + out[i][c] : out[i][c];
    }
  }
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};

// `pack(j0, p0, kc, packed)` packs one panel of w (pack_panel's contract); y has row stride ldy.
template <typename Pack>
void gemm(const float* x, int64_t m, int64_t k, const Pack& pack, int64_t n, float* y, int64_t ldy, bool accumulate,
          int num_threads) {
  const int64_t blocks = (n + kNC - 1) / kNC;
  // Few column blocks (narrow layers of small models) leave threads idle: split the rows too, at
  // the price of packing a block once per row chunk.
  const int64_t wanted_items = 4 * int64_t{num_threads};
  const int64_t row_chunks = blocks >= wanted_items ? 1 : std::min((wanted_items + blocks - 1) / blocks, (m + kMR - 1) / kMR);
  const int64_t chunk_rows = ((m + row_chunks - 1) / row_chunks + kMR - 1) / kMR * kMR;
  const int64_t items = blocks * ((m + chunk_rows - 1) / chunk_rows);
  parallel_chunks(m * n * k >= 8 * kMinParallelWork ? num_threads : 1, items, [&](int64_t item) {
    // Per-thread packing buffer, one block of kNC columns x kKC depth, allocated once per thread.
    thread_local std::unique_ptr<float, AlignedFree> packed(
        static_cast<float*>(std::aligned_alloc(64, kKC * kNC * sizeof(float))));
    const int64_t block = item % blocks, i_begin = item / blocks * chunk_rows, i_end = std::min(m, i_begin + chunk_rows);
    const int64_t j_begin = block * kNC, j_end = std::min(n, j_begin + kNC);
    const int64_t panels = (j_end - j_begin + kNR - 1) / kNR;
    for (int64_t p0 = 0; p0 < k; p0 += kKC) {
      const int64_t kc = std::min(kKC, k - p0);
      for (int64_t panel = 0; panel < panels; ++panel)
        pack(j_begin + panel * kNR, p0, kc, packed.get() + panel * kKC * kNR);
      for (int64_t i = i_begin; i < i_end; i += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, i_end - i);
        for (int64_t panel = 0; panel < panels; ++panel) {
          const int64_t j = j_begin + panel * kNR;
          micro_tile(rows, x + i * k + p0, k, packed.get() + panel * kKC * kNR, kc, y + i * ldy + j, ldy,
                     std::min<int64_t>(kNR, j_end - j), accumulate || p0 > 0);
        }
      }
    }
  });
}

// A panel of a quantized w: its kNR rows' slices decoded to f32 (quant_matmul.h), then packed
// like an f32 matrix of row stride kc.
struct QuantPack {
  DType type;
  const void* w;
  int64_t k, n;
  void operator()(int64_t j0, int64_t p0, int64_t kc, float* packed) const {
    alignas(64) float rows[kNR * kKC];
    const int64_t count = std::min<int64_t>(kNR, n - j0);
    quant_decode_rows(type, w, k, j0, count, p0, kc, rows);
    pack_panel(rows, kc, count, 0, 0, kc, packed);
  }
};

template <typename W>
void gemm_plain(const float* x, int64_t m, int64_t k, const W* w, int64_t n, float* y, int64_t ldy, bool accumulate,
                int num_threads) {
  const auto pack = [&](int64_t j0, int64_t p0, int64_t kc, float* packed) { pack_panel(w, k, n, j0, p0, kc, packed); };
  gemm(x, m, k, pack, n, y, ldy, accumulate, num_threads);
}

void add_bias(const float* bias, int64_t m, int64_t n, float* y) {
  if (bias == nullptr) return;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}

void run_gemv(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, float* y, int64_t ldy,
              MatmulMode mode, int num_threads) {
  const bool acc = mode.accumulate;
  switch (w_dtype) {
    case DType::F32: gemv(x, m, k, static_cast<const float*>(w), n, y, ldy, acc, num_threads); return;
    case DType::F16: gemv(x, m, k, static_cast<const F16Bits*>(w), n, y, ldy, acc, num_threads); return;
    case DType::BF16: gemv(x, m, k, static_cast<const BF16Bits*>(w), n, y, ldy, acc, num_threads); return;
    default:
      SF_CHECK(is_quantized(w_dtype), "cpu matmul: weight dtype {} is not supported (f32, f16, bf16 or quantized)",
               dtype_name(w_dtype));
      quant_gemv(x, m, k, w, w_dtype, n, y, ldy, acc, mode.q8_activations, num_threads);
  }
}

void run_gemm(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, float* y, int64_t ldy,
              bool accumulate, int num_threads) {
  if (k == 0) {  // no depth panel would write y
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + n, 0.0f);
    return;
  }
  switch (w_dtype) {
    case DType::F32: gemm_plain(x, m, k, static_cast<const float*>(w), n, y, ldy, accumulate, num_threads); return;
    case DType::F16: gemm_plain(x, m, k, static_cast<const F16Bits*>(w), n, y, ldy, accumulate, num_threads); return;
    case DType::BF16: gemm_plain(x, m, k, static_cast<const BF16Bits*>(w), n, y, ldy, accumulate, num_threads); return;
    default:
      SF_CHECK(is_quantized(w_dtype), "cpu matmul: weight dtype {} is not supported (f32, f16, bf16 or quantized)",
               dtype_name(w_dtype));
      gemm(x, m, k, QuantPack{w_dtype, w, k, n}, n, y, ldy, accumulate, num_threads);
  }
}

}  // namespace

void matmul_gemv(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, const float* bias,
                 float* y, int num_threads) {
  run_gemv(x, m, k, w, w_dtype, n, y, n, MatmulMode{}, num_threads);
  add_bias(bias, m, n, y);
}

void matmul_gemm(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, const float* bias,
                 float* y, int num_threads) {
  run_gemm(x, m, k, w, w_dtype, n, y, n, false, num_threads);
  add_bias(bias, m, n, y);
}

void matmul_strided(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n, float* y,
                    int64_t ldy, MatmulMode mode, int num_threads) {
  if (m < kGemmMinRows)
    run_gemv(x, m, k, w, w_dtype, n, y, ldy, mode, num_threads);
  else if (mode.q8_activations && q8_gemm_supported(w_dtype))
    q8_gemm(x, m, k, w, w_dtype, n, y, ldy, mode.accumulate, num_threads);
  else
    run_gemm(x, m, k, w, w_dtype, n, y, ldy, mode.accumulate, num_threads);
}

}  // namespace splitflow::cpu
