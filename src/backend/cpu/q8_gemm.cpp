#include "backend/cpu/q8_gemm.h"

#include "backend/cpu/q8_activations.h"
#include "backend/cpu/q8_block_codes.h"
#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/thread_team.h"
#include "core/error.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace splitflow::cpu {

bool q8_gemm_supported(DType type) { return q8_gemv_supported(type); }

#ifdef SPLITFLOW_CPU_AVX512_VNNI
namespace {

using namespace q8_blocks;

constexpr int64_t kTileRows = 16;  // rows of x per accumulator (its int32 lanes)
constexpr int kMaxTiles = 2;       // tiles per kernel call: 2 x 16 rows
constexpr int kColumns = 6;        // rows of w per kernel call (12 int32 sums, 12 float sums)

// acc + the dot products of a's unsigned and b's signed bytes, four per int32 lane (VPDPBUSD). The
// intrinsic under GCC 12 copies every accumulator at each call (two register moves per
// instruction, the loop ran at half speed); the asm keeps the accumulator in place and lets b be
// a memory operand.
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
  return acc;
}

// x' for one weight type, in tiles of 16 rows (rows past m are zero):
//   codes [tile][quad][16][4]: the codes of elements 4q .. 4q + 3 of each of the tile's rows;
//   per [tile][group][16]: corr = the weights' correction x the sum of the row's codes in the group
//   (the int32 sum starts there), dx = the row's scale in that 32-element block, and sx = dx x the
//   sum of its codes (for the weights' minima).
struct XTiles {
  int64_t tiles = 0, quads = 0, groups = 0;
  std::vector<int8_t> codes;
  std::vector<int32_t> corr;
  std::vector<float> dx, sx;

  void quantize(const float* x, int64_t m, int64_t k, int group, int correction, int num_threads) {
    tiles = (m + kTileRows - 1) / kTileRows;
    quads = k / 4;
    groups = k / group;
    codes.resize(static_cast<size_t>(tiles * quads * 64));
    const size_t per_group = static_cast<size_t>(tiles * groups * kTileRows);
    corr.resize(per_group);
    dx.resize(per_group);
    sx.resize(per_group);
    for (int64_t r = m; r < tiles * kTileRows; ++r) clear_row(r);
    parallel_ranges(num_threads, m, m * k >= kMinParallelWork, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) quantize_row(x + r * k, r, k, group, correction);
    });
  }

 private:
  int64_t code_at(int64_t r) const { return r / kTileRows * quads * 64 + r % kTileRows * 4; }
  int64_t group_at(int64_t r) const { return r / kTileRows * groups * kTileRows + r % kTileRows; }

  void clear_row(int64_t r) {
    for (int64_t q = 0; q < quads; ++q) std::memset(codes.data() + code_at(r) + q * 64, 0, 4);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t at = group_at(r) + g * kTileRows;
      corr[at] = 0;
      dx[at] = sx[at] = 0.0f;
    }
  }

  // As q8_activations.cpp's QuantizedRows: d = max |x| / 127, codes rounded to nearest even.
  void quantize_row(const float* xr, int64_t r, int64_t k, int group, int correction) {
    int8_t* row_codes = codes.data() + code_at(r);
    const int64_t row_groups = group_at(r);
    for (int64_t e = 0; e < k; e += 32) {
      const Q8Block block = quantize_block32(xr + e);
      const float scale = block.d;
      alignas(32) int8_t q[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(q), block.codes);
      for (int u = 0; u < 8; ++u) std::memcpy(row_codes + (e / 4 + u) * 64, q + 4 * u, 4);
      // Sums of 4 codes per lane, then of each group's 8 or 4 lanes.
      alignas(32) int32_t quads_sum[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(quads_sum), quad_sums(block.codes));
      for (int h = 0; h < 32 / group; ++h) {
        int sum = 0;
        for (int p = 0; p < group / 4; ++p) sum += quads_sum[h * group / 4 + p];
        const int64_t at = row_groups + (e / group + h) * kTileRows;
        corr[at] = correction * sum;
        dx[at] = scale;
        sx[at] = scale * static_cast<float>(sum);
      }
    }
  }
};

// One row of w for the kernel: codes [k] as unsigned bytes and, per group, scale and offset, so
// that w[e] = scale[g] * (codes[e] + correction) + offset[g] for g = e / group.
using DecodeRow = void (*)(const uint8_t* row, int64_t k, uint8_t* codes, float* scale, float* offset);

template <DType T>
void decode_blocks(const uint8_t* row, int64_t k, uint8_t* codes, float* scale, float* offset) {
  using L = Layout<T>;
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* blk = row + b * L::kBytes;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 32 * b), block_codes<T>(blk));
    scale[b] = _cvtsh_ss(u16_at(blk));
    if constexpr (L::kMin) offset[b] = _cvtsh_ss(u16_at(blk + 2));
  }
}

// Q4_K (d, dmin, 12 bytes of 6-bit scales and mins, qs[128]): elements 64g .. 64g + 31 are the low
// nibbles of qs[32g ..], 64g + 32 .. 64g + 63 the high ones; sub-block s has d * sc_s, -dmin * m_s.
void decode_q4k(const uint8_t* row, int64_t k, uint8_t* codes, float* scale, float* offset) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < k / 256; ++b) {
    const uint8_t* blk = row + b * 144;
    alignas(64) float table[16];  // d * sc[0..8), -dmin * m[0..8)
    _mm512_store_ps(table, k4_scale_table(blk));
    std::memcpy(scale + 8 * b, table, 8 * sizeof(float));
    std::memcpy(offset + 8 * b, table + 8, 8 * sizeof(float));
    for (int g = 0; g < 4; ++g) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * g));
      uint8_t* out = codes + 256 * b + 64 * g;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_and_si256(q, low4));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
    }
  }
}

// Q6_K (ql[128], qh[64], int8 scales[16], d): in each 128-element half, element l (< 32) takes ql[l]'s
// low nibble and qh[l]'s bits 0-1, l + 32 ql[l + 32]'s low nibble and bits 2-3, l + 64 ql[l]'s high
// nibble and bits 4-5, l + 96 ql[l + 32]'s high nibble and bits 6-7; codes are q + 32; element e's
// sub-block e / 16 has scale d * scales[e / 16].
void decode_q6k(const uint8_t* row, int64_t k, uint8_t* codes, float* scale, float*) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < k / 256; ++b) {
    const uint8_t* blk = row + b * 210;
    const float d = _cvtsh_ss(u16_at(blk + 208));
    for (int s = 0; s < 16; ++s) scale[16 * b + s] = d * static_cast<float>(static_cast<int8_t>(blk[192 + s]));
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const auto put = [&](int at, __m256i nibble, __m256i high) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 256 * b + 128 * h + at),
                            _mm256_or_si256(_mm256_and_si256(nibble, low4), _mm256_and_si256(high, bits45)));
      };
      put(0, l0, _mm256_slli_epi16(hb, 4));
      put(32, l1, _mm256_slli_epi16(hb, 2));
      put(64, _mm256_srli_epi16(l0, 4), hb);
      put(96, _mm256_srli_epi16(l1, 4), _mm256_srli_epi16(hb, 2));
    }
  }
}

// Q2_K, Q3_K, Q5_K (q8_block_codes.h's KQuant): codes and each sub-block's scale and offset.
template <DType T>
void decode_kquant(const uint8_t* row, int64_t k, uint8_t* codes, float* scale, float* offset) {
  using K = KQuant<T>;
  constexpr int kSubs = 256 / K::kSub;
  for (int64_t b = 0; b < k / 256; ++b) {
    const uint8_t* blk = row + b * K::kBytes;
    const KScales scales = k_scales<T>(blk);
    alignas(64) float lanes[2][16];
    _mm512_store_ps(lanes[0], scales.scale);
    _mm512_store_ps(lanes[1], scales.offset);
    // kSub 32: the offsets are lanes 8 .. 15 of the same table.
    std::memcpy(scale + kSubs * b, lanes[0], kSubs * sizeof(float));
    std::memcpy(offset + kSubs * b, lanes[1] + (kSubs == 8 ? 8 : 0), kSubs * sizeof(float));
    for (int t = 0; t < 4; ++t) {
      __m256i low, high;
      k_codes<T>(blk, t, low, high);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 256 * b + 64 * t), low);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 256 * b + 64 * t + 32), high);
    }
  }
}

// out[j * ldo + t * 16 + l] (+)= the part in groups [g_begin, g_end) of x'[row l of tile tile0 + t] .
// w[column j], for NR columns and MT tiles (+= unless g_begin is 0): per quad, the four codes of
// each column broadcast against the tiles' int32 lanes (one VNNI instruction per column and tile);
// per group, each sum scaled by the column's scale and the row's.
template <int NR, int MT, int G, bool kOffset>
void kernel(const XTiles& xt, int64_t tile0, int64_t g_begin, int64_t g_end, const uint8_t* const* codes,
            const float* const* scale, const float* const* offset, float* out, int64_t ldo) {
  constexpr int kQuads = G / 4;
  __m512 acc[NR][MT];
  for (int j = 0; j < NR; ++j)
    for (int t = 0; t < MT; ++t)
      acc[j][t] = g_begin == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out + j * ldo + t * kTileRows);
  const int8_t* xc[MT];
  int64_t groups_at[MT];
  for (int t = 0; t < MT; ++t) {
    xc[t] = xt.codes.data() + (tile0 + t) * xt.quads * 64;
    groups_at[t] = (tile0 + t) * xt.groups * kTileRows;
  }
  for (int64_t g = g_begin; g < g_end; ++g) {
    __m512i sum[NR][MT];
    for (int t = 0; t < MT; ++t) {
      const __m512i start = _mm512_loadu_si512(xt.corr.data() + groups_at[t] + g * kTileRows);
      for (int j = 0; j < NR; ++j) sum[j][t] = start;
    }
#pragma GCC unroll 8
    for (int u = 0; u < kQuads; ++u) {
      const int64_t q = g * kQuads + u;
      __m512i xv[MT];
      for (int t = 0; t < MT; ++t) xv[t] = _mm512_loadu_si512(xc[t] + q * 64);
      for (int j = 0; j < NR; ++j) {
        const __m512i wq = _mm512_set1_epi32(static_cast<int>(u32_at(codes[j] + 4 * q)));
        for (int t = 0; t < MT; ++t) sum[j][t] = dpbusd(sum[j][t], wq, xv[t]);
      }
    }
    for (int t = 0; t < MT; ++t) {
      const __m512 d = _mm512_loadu_ps(xt.dx.data() + groups_at[t] + g * kTileRows);
      [[maybe_unused]] __m512 s;
      if constexpr (kOffset) s = _mm512_loadu_ps(xt.sx.data() + groups_at[t] + g * kTileRows);
      for (int j = 0; j < NR; ++j) {
        acc[j][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[j][t]), _mm512_mul_ps(_mm512_set1_ps(scale[j][g]), d), acc[j][t]);
        if constexpr (kOffset) acc[j][t] = _mm512_fmadd_ps(_mm512_set1_ps(offset[j][g]), s, acc[j][t]);
      }
    }
  }
  for (int j = 0; j < NR; ++j)
    for (int t = 0; t < MT; ++t) _mm512_storeu_ps(out + j * ldo + t * kTileRows, acc[j][t]);
}

template <int G, bool kOffset>
void run_kernel(int columns, int tiles, const XTiles& xt, int64_t tile0, int64_t g_begin, int64_t g_end,
                const uint8_t* const* codes, const float* const* scale, const float* const* offset, float* out,
                int64_t ldo) {
  static_assert(kColumns == 6 && kMaxTiles == 2, "the switch below lists every shape");
#define SPLITFLOW_Q8_GEMM_CASE(NR, MT) \
  case NR * 10 + MT: return kernel<NR, MT, G, kOffset>(xt, tile0, g_begin, g_end, codes, scale, offset, out, ldo);
  switch (columns * 10 + tiles) {
    SPLITFLOW_Q8_GEMM_CASE(1, 1)
    SPLITFLOW_Q8_GEMM_CASE(2, 1)
    SPLITFLOW_Q8_GEMM_CASE(3, 1)
    SPLITFLOW_Q8_GEMM_CASE(4, 1)
    SPLITFLOW_Q8_GEMM_CASE(5, 1)
    SPLITFLOW_Q8_GEMM_CASE(6, 1)
    SPLITFLOW_Q8_GEMM_CASE(1, 2)
    SPLITFLOW_Q8_GEMM_CASE(2, 2)
    SPLITFLOW_Q8_GEMM_CASE(3, 2)
    SPLITFLOW_Q8_GEMM_CASE(4, 2)
    SPLITFLOW_Q8_GEMM_CASE(5, 2)
    SPLITFLOW_Q8_GEMM_CASE(6, 2)
    default: SF_CHECK(false, "cpu q8 gemm: no kernel for {} columns x {} tiles", columns, tiles);
  }
#undef SPLITFLOW_Q8_GEMM_CASE
}

struct TypeKernel {
  DecodeRow decode;
  size_t block_bytes;
  int64_t block_elems;
  int group, correction;
  bool offset;
};

template <DType T>
TypeKernel kquant_kernel() {
  using K = KQuant<T>;
  return {decode_kquant<T>, K::kBytes, 256, K::kSub, K::kCorrection, K::kOffset};
}

TypeKernel type_kernel(DType type) {
  switch (type) {
    case DType::Q4_0: return {decode_blocks<DType::Q4_0>, 18, 32, 32, -8, false};
    case DType::Q4_1: return {decode_blocks<DType::Q4_1>, 20, 32, 32, 0, true};
    case DType::Q5_0: return {decode_blocks<DType::Q5_0>, 22, 32, 32, -16, false};
    case DType::Q5_1: return {decode_blocks<DType::Q5_1>, 24, 32, 32, 0, true};
    case DType::Q8_0: return {decode_blocks<DType::Q8_0>, 34, 32, 32, -128, false};
    case DType::Q2_K: return kquant_kernel<DType::Q2_K>();
    case DType::Q3_K: return kquant_kernel<DType::Q3_K>();
    case DType::Q4_K: return {decode_q4k, 144, 256, 32, 0, true};
    case DType::Q5_K: return kquant_kernel<DType::Q5_K>();
    case DType::Q6_K: return {decode_q6k, 210, 256, 16, -32, false};
    default: SF_CHECK(false, "cpu q8 gemm: {} has no Q8-activation kernel", dtype_name(type));
  }
  return {};
}

}  // namespace

void q8_gemm(const float* x, int64_t m, int64_t k, const void* w, DType type, int64_t n, float* y, int64_t ldy,
             bool accumulate, int num_threads, const std::function<const uint8_t*(int64_t row)>& stored_row) {
  const TypeKernel kind = type_kernel(type);
  SF_CHECK(k % kind.block_elems == 0, "cpu q8 gemm: rows of {} elements (not whole {}-element blocks)", k,
           kind.block_elems);
  if (m <= 0 || n <= 0) return;
  const size_t row_bytes = static_cast<size_t>(k / kind.block_elems) * kind.block_bytes;
  const auto* bytes = static_cast<const uint8_t*>(w);
  thread_local XTiles xt;  // on the calling thread; the team only reads it
  xt.quantize(x, m, k, kind.group, kind.correction, num_threads);
  const XTiles& tiles = xt;
  const int64_t groups = k / kind.group;

  // Work items: 18 columns x up to 16 tiles (256 rows). Within one, the columns are decoded once,
  // and each 2-tile row block runs in depth slices of kSliceElems, so that the slice of x' the
  // kernels read for every 6 columns (2 tiles x 512 elements = 16 KiB) stays in L1.
  constexpr int64_t kChunkColumns = 3 * kColumns, kBlockTiles = 16, kSliceElems = 512;
  const int64_t column_chunks = (n + kChunkColumns - 1) / kChunkColumns;
  const int64_t tile_blocks = (tiles.tiles + kBlockTiles - 1) / kBlockTiles;
  const int64_t slice_groups = kSliceElems / kind.group;
  parallel_chunks(m * n * k >= 8 * kMinParallelWork ? num_threads : 1, column_chunks * tile_blocks, [&](int64_t item) {
    thread_local std::vector<uint8_t> codes_buf;
    thread_local std::vector<float> scale_buf, offset_buf;
    codes_buf.resize(static_cast<size_t>(kChunkColumns * k));
    scale_buf.resize(static_cast<size_t>(kChunkColumns * groups));
    offset_buf.resize(scale_buf.size());
    // The item's results, column-major (the kernel's order), written to y row by row at the end:
    // one cache line of y per row instead of one store per element across rows ldy apart.
    thread_local std::vector<float> results(kChunkColumns * kBlockTiles * kTileRows);
    constexpr int64_t kResultStride = kBlockTiles * kTileRows;
    const int64_t j_begin = item / tile_blocks * kChunkColumns, j_end = std::min(n, j_begin + kChunkColumns);
    const int64_t t_begin = item % tile_blocks * kBlockTiles, t_end = std::min(tiles.tiles, t_begin + kBlockTiles);
    for (int64_t c = 0; c < j_end - j_begin; ++c)
      kind.decode(stored_row ? stored_row(j_begin + c) : bytes + (j_begin + c) * row_bytes, k,
                  codes_buf.data() + c * k, scale_buf.data() + c * groups, offset_buf.data() + c * groups);
    for (int64_t t = t_begin; t < t_end; t += kMaxTiles) {
      const int count = static_cast<int>(std::min<int64_t>(kMaxTiles, t_end - t));
      for (int64_t g = 0; g < groups; g += slice_groups) {
        const int64_t g_end = std::min(groups, g + slice_groups);
        for (int64_t c = 0; c < j_end - j_begin; c += kColumns) {
          const int columns = static_cast<int>(std::min<int64_t>(kColumns, j_end - j_begin - c));
          const uint8_t* codes[kColumns];
          const float *scale[kColumns], *offset[kColumns];
          for (int i = 0; i < columns; ++i) {
            codes[i] = codes_buf.data() + (c + i) * k;
            scale[i] = scale_buf.data() + (c + i) * groups;
            offset[i] = offset_buf.data() + (c + i) * groups;
          }
          float* out = results.data() + c * kResultStride + (t - t_begin) * kTileRows;
          if (kind.group == 16 && kind.offset)
            run_kernel<16, true>(columns, count, tiles, t, g, g_end, codes, scale, offset, out, kResultStride);
          else if (kind.group == 16)
            run_kernel<16, false>(columns, count, tiles, t, g, g_end, codes, scale, offset, out, kResultStride);
          else if (kind.offset)
            run_kernel<32, true>(columns, count, tiles, t, g, g_end, codes, scale, offset, out, kResultStride);
          else
            run_kernel<32, false>(columns, count, tiles, t, g, g_end, codes, scale, offset, out, kResultStride);
        }
      }
    }
    const int64_t row_begin = t_begin * kTileRows, row_end = std::min(m, t_end * kTileRows);
    for (int64_t r = row_begin; r < row_end; ++r) {
      float* dst = y + r * ldy;
      const float* src = results.data() + (r - row_begin);
      for (int64_t j = j_begin; j < j_end; ++j) {
        const float value = src[(j - j_begin) * kResultStride];
        dst[j] = accumulate ? dst[j] + value : value;
      }
    }
  });
}

#else

void q8_gemm(const float*, int64_t, int64_t, const void*, DType type, int64_t, float*, int64_t, bool, int,
             const std::function<const uint8_t*(int64_t)>&) {
  SF_CHECK(false, "cpu q8 gemm: {} needs AVX-512 VNNI, which this build does not target", dtype_name(type));
}

#endif

}  // namespace splitflow::cpu
